//! End-to-end: profiles sent to back ends. `--otlp` pushes a recording of split7030 to a
//! real OpenTelemetry Collector (built by scripts/build-otelcol: the OTLP receiver and
//! the debug exporter) on 127.0.0.1, and the test reads back from what the Collector
//! exported: the function names, the values and the attributes. The `.otlp` file is
//! decoded by a second decoder that is not sampler's (the official `opentelemetry-proto`
//! Python package). `--push` POSTs gzipped pprof to a small server of the test's own,
//! which decodes it with sampler's prost types; a send that fails keeps the file.
//!
//! A missing Collector or Python package is skipped visibly; with
//! `SAMPLER_REQUIRE_CONSUMERS=1` (as in CI) it fails.

#[path = "../common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use prost::Message;
use sampler::emit::pprof::PprofProfile;

/// What one sample of cpu-clock at 1000 Hz stands for, in ns (see
/// [`MS_PER_SAMPLE_AT_1000_HZ`]): every on-CPU value of the OTLP profile.
const NS_PER_SAMPLE_AT_1000_HZ: i64 = 1_005_025;

/// split7030's known functions, root-most last.
const SPLIT_FUNCTIONS: [&str; 4] = ["hot_a", "hot_b", "outer", "main"];

fn collector_bin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/otelcol/otelcol")
}

fn collector_present() -> bool {
    collector_bin().exists()
}

fn python_otlp() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/otlp-venv/bin/python")
}

fn python_otlp_present() -> bool {
    Command::new(python_otlp())
        .args([
            "-c",
            "import opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The number in sampler's summary line `sampler: N samples (...)`.
fn summary_samples(o: &Output) -> i64 {
    let err = stderr(o);
    err.lines()
        .find_map(|l| {
            l.strip_prefix("sampler: ")?
                .split(" samples")
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no sample count in the summary: {err}"))
}

/// A Collector running with its debug exporter's log in a file; killed and waited for
/// when the test ends, however it ends.
struct Collector {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Collector {
    fn start(dir: &Path) -> Collector {
        let port = free_port();
        let config = dir.join("otelcol.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
                 exporters:\n  debug:\n    verbosity: detailed\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [debug]\n"
            ),
        )
        .unwrap();
        let log = dir.join("otelcol.log");
        let child = Command::new(collector_bin())
            .arg("--config")
            .arg(&config)
            .arg("--feature-gates=service.profilesSupport")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the Collector starts");
        let mut collector = Collector { child, log, port };
        collector.wait_for("Everything is ready", Duration::from_secs(60));
        collector
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log has `what`; returns the log.
    fn wait_for(&mut self, what: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let text = self.text();
            if text.contains(what) {
                return text;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the Collector exited ({status}): {text}");
            }
            assert!(
                Instant::now() < deadline,
                "the Collector never logged {what:?}: {text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the debug exporter (verbosity detailed) logged of one export: the dictionary's
/// strings and function names, the resource attributes, every sample's values and
/// attributes.
#[derive(Debug, Default)]
struct Exported {
    strings: Vec<String>,
    functions: Vec<String>,
    resource: HashMap<String, String>,
    values: Vec<i64>,
    sample_attributes: Vec<HashMap<String, String>>,
}

fn parse_debug_export(log: &str) -> Exported {
    let mut e = Exported::default();
    let mut function_names: Vec<usize> = Vec::new();
    let mut section = "";
    for line in log.lines() {
        let trimmed = line.trim();
        if line.starts_with("String table:") {
            section = "strings";
        } else if line.starts_with("ResourceProfiles #") {
            section = "resource";
        } else if line.starts_with("Resource attributes:") {
            section = "resource attributes";
        } else if line.starts_with("ScopeProfiles #") {
            section = "profiles";
        } else if line.starts_with("Function #") {
            section = "function";
        } else if line.starts_with("Attribute table:") || line.starts_with("Link table:") {
            section = "";
        } else if section == "strings" && line.starts_with("    ") {
            e.strings.push(line[4..].to_string());
        } else if section == "strings" && line.is_empty() {
            // The table's first entry: the empty string.
            e.strings.push(String::new());
        } else if section == "function" && trimmed.starts_with("Name: ") {
            function_names.push(trimmed["Name: ".len()..].parse().unwrap());
        } else if section == "resource attributes" {
            if let Some((k, v)) = trimmed.strip_prefix("-> ").and_then(|a| a.split_once(": ")) {
                e.resource.insert(k.to_string(), v.to_string());
            }
        } else if section == "profiles" {
            if let Some(list) = trimmed.strip_prefix("Values: [") {
                e.values.extend(
                    list.trim_end_matches(']')
                        .split_whitespace()
                        .map(|v| v.parse::<i64>().unwrap()),
                );
            } else if trimmed.starts_with("Sample #") {
                e.sample_attributes.push(HashMap::new());
            } else if let Some((k, v)) =
                trimmed.strip_prefix("-> ").and_then(|a| a.split_once(": "))
            {
                e.sample_attributes
                    .last_mut()
                    .expect("attributes follow a sample")
                    .insert(k.to_string(), v.to_string());
            }
        }
    }
    e.functions = function_names
        .into_iter()
        .map(|i| e.strings.get(i).cloned().unwrap_or_default())
        .collect();
    e
}

fn otlp_push_reaches_a_real_collector() {
    let dir = tempdir();
    let mut collector = Collector::start(&dir);
    let profile = dir.join("p.json");
    // --otlp without a URL: the SDKs' variables say where, and which headers.
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&profile)
        .arg("--otlp")
        .arg("--")
        .args([&target("split7030"), "1"])
        .env("OTEL_SERVICE_NAME", "sampler-otlp-test")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{}/", collector.port),
        )
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-sampler-test=1")
        .env_remove("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROFILES_HEADERS")
        .output()
        .expect("sampler runs");
    assert!(o.status.success(), "record --otlp failed: {}", stderr(&o));
    ffp_check(&profile);
    let url = format!("http://127.0.0.1:{}/v1development/profiles", collector.port);
    assert!(
        stderr(&o).contains(&format!("sampler: sent the profile to {url}")),
        "{}",
        stderr(&o)
    );
    let log = collector.wait_for("\"otelcol.signal\": \"profiles\"}", Duration::from_secs(30));
    let e = parse_debug_export(&log);
    eprintln!(
        "the Collector exported {} functions, {} values, resource {:?}, sample attributes {:?}",
        e.functions.len(),
        e.values.len(),
        e.resource,
        e.sample_attributes.first()
    );
    for name in SPLIT_FUNCTIONS {
        assert!(
            e.functions.iter().any(|f| f == name),
            "no {name} in {:?}",
            e.functions
        );
    }
    // Every sample is one observation worth one interval of CPU time.
    let n = summary_samples(&o);
    assert_eq!(e.values.len() as i64, n, "observations vs samples");
    assert!(
        e.values.iter().all(|&v| v == NS_PER_SAMPLE_AT_1000_HZ),
        "{:?}",
        e.values
    );
    assert_eq!(e.values.iter().sum::<i64>(), n * NS_PER_SAMPLE_AT_1000_HZ);
    assert_covers_cpu(
        "split7030 via the Collector",
        n as usize,
        command_cpu_ms(&o),
        0.8,
    );
    assert_eq!(e.resource["service.name"], "Str(sampler-otlp-test)");
    assert_eq!(e.resource["process.executable.name"], "Str(split7030)");
    assert!(e.resource.contains_key("host.name"), "{:?}", e.resource);
    let pid = &e.resource["process.pid"];
    assert!(pid.starts_with("Int(") && pid != "Int(0)", "{pid}");
    for attributes in &e.sample_attributes {
        assert_eq!(attributes["thread.name"], "Str(split7030)");
        // Single-threaded: its thread is the process's main thread.
        assert_eq!(&attributes["thread.id"], pid);
    }
    // The same profile again from its file, by `convert --otlp URL`.
    let o = Command::new(sampler_bin())
        .arg("convert")
        .arg(&profile)
        .args(["--otlp", &url])
        .output()
        .unwrap();
    assert!(o.status.success(), "convert --otlp failed: {}", stderr(&o));
    let deadline = Instant::now() + Duration::from_secs(30);
    while collector.text().matches("ResourceProfiles #0").count() < 2 {
        assert!(Instant::now() < deadline, "convert's export never arrived");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(collector);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn continuous_windows_reach_a_real_collector_one_export_each() {
    let dir = tempdir();
    let mut collector = Collector::start(&dir);
    let target = Running::start("split7030", &["10"]);
    let url = format!("http://127.0.0.1:{}/v1development/profiles", collector.port);
    let cpu_before = process_cpu_ms(&target.pid());
    let o = Command::new(sampler_bin())
        .args(["record", "-p", &target.pid(), "--every", "1", "-d", "3.5"])
        .args(["-F", "1000", "--otlp", &url, "--spool"])
        .arg(dir.join("spool"))
        .output()
        .expect("sampler runs");
    let cpu_ms = process_cpu_ms(&target.pid()) - cpu_before;
    assert!(o.status.success(), "record --every --otlp: {}", stderr(&o));
    assert!(
        stderr(&o).contains("sampler: 4 windows: 0 written, 4 sent, 0 waiting"),
        "{}",
        stderr(&o)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while collector
        .text()
        .matches("\"otelcol.signal\": \"profiles\"}")
        .count()
        < 4
    {
        assert!(
            Instant::now() < deadline,
            "not every window's export arrived"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = collector.wait_for("\"otelcol.signal\": \"profiles\"}", Duration::from_secs(1));
    // One export per window, each with split7030's functions; together they hold the
    // CPU time the target got.
    let exports: Vec<&str> = log.split("\tinfo\tProfiles\t").skip(1).collect();
    assert_eq!(exports.len(), 4, "{log}");
    let mut total = 0;
    for export in &exports {
        let e = parse_debug_export(export);
        for name in SPLIT_FUNCTIONS {
            assert!(
                e.functions.iter().any(|f| f == name),
                "no {name} in {:?}",
                e.functions
            );
        }
        assert_eq!(e.resource["process.executable.name"], "Str(split7030)");
        total += e.values.len();
    }
    eprintln!("the Collector exported 4 windows of {total} samples in all");
    assert_covers_cpu("split7030's windows via the Collector", total, cpu_ms, 0.75);
    drop(collector);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Decodes an `.otlp` file with the official Python types and prints, per sample, its
/// value sum and the function names of its stack (leaf first), then the resource and
/// sample attributes, and the build IDs of the mappings, as JSON.
const PYTHON_DECODE: &str = r#"
import json, sys
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
r = ExportProfilesServiceRequest()
r.ParseFromString(open(sys.argv[1], 'rb').read())
d = r.dictionary
s = d.string_table
def attr(i):
    a = d.attribute_table[i]
    v = a.value
    return s[a.key_strindex], (v.string_value if v.HasField('string_value') else v.int_value)
out = {'samples': [], 'resource': {}, 'sample_types': [], 'build_ids': {}}
for m in d.mapping_table[1:]:
    for i in m.attribute_indices:
        k, v = attr(i)
        out['build_ids'].setdefault(k, {})[s[m.filename_strindex]] = v
for rp in r.resource_profiles:
    for a in rp.resource.attributes:
        out['resource'][a.key] = a.value.string_value if a.value.HasField('string_value') else a.value.int_value
    for sp in rp.scope_profiles:
        for p in sp.profiles:
            out['sample_types'].append([s[p.sample_type.type_strindex], s[p.sample_type.unit_strindex]])
            for x in p.samples:
                assert len(x.values) == len(x.timestamps_unix_nano)
                assert all(p.time_unix_nano <= t <= p.time_unix_nano + p.duration_nano for t in x.timestamps_unix_nano)
                names = [s[d.function_table[l.function_index].name_strindex]
                         for li in d.stack_table[x.stack_index].location_indices
                         for l in d.location_table[li].lines]
                out['samples'].append({'type': s[p.sample_type.type_strindex],
                                       'sum': sum(x.values), 'count': len(x.values), 'names': names,
                                       'attributes': dict(attr(i) for i in x.attribute_indices)})
print(json.dumps(out))
"#;

fn decode_with_python(file: &Path) -> serde_json::Value {
    let o = Command::new(python_otlp())
        .args(["-c", PYTHON_DECODE])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "opentelemetry-proto cannot decode {}: {}",
        file.display(),
        stderr(&o)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn the_otlp_file_decodes_with_the_official_python_types() {
    let dir = tempdir();
    // Written by record (named .otlp) and by convert -f otlp from the Firefox profile.
    let recorded = dir.join("r.otlp");
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&recorded)
        .args(["--", &target("split7030"), "1"])
        .env_remove("OTEL_SERVICE_NAME")
        .output()
        .unwrap();
    assert!(o.status.success(), "record -o r.otlp: {}", stderr(&o));
    let n = summary_samples(&o);
    let (o2, firefox) = record(&[], &[&target("split7030"), "1"]);
    assert!(o2.status.success(), "{}", stderr(&o2));
    let converted = dir.join("c.otlp");
    let c = Command::new(sampler_bin())
        .arg("convert")
        .arg(&firefox)
        .args(["-f", "otlp", "-o"])
        .arg(&converted)
        .env_remove("OTEL_SERVICE_NAME")
        .output()
        .unwrap();
    assert!(c.status.success(), "convert -f otlp: {}", stderr(&c));
    let build_id = {
        use object::Object;
        let data = std::fs::read(target("split7030")).unwrap();
        let file = object::File::parse(&*data).unwrap();
        sampler::symbolicate::debuginfod::hex(file.build_id().unwrap().expect("a build ID"))
    };
    for (file, samples) in [(&recorded, n), (&converted, summary_samples(&o2))] {
        let v = decode_with_python(file);
        assert_eq!(
            v["sample_types"],
            serde_json::json!([["cpu", "nanoseconds"]])
        );
        assert_eq!(
            v["resource"]["service.name"], "split7030",
            "{}",
            v["resource"]
        );
        assert_eq!(v["resource"]["process.executable.name"], "split7030");
        let gnu = &v["build_ids"]["process.executable.build_id.gnu"];
        assert_eq!(gnu[target("split7030")], build_id.as_str(), "{gnu}");
        let rows = v["samples"].as_array().unwrap();
        let count: i64 = rows.iter().map(|r| r["count"].as_i64().unwrap()).sum();
        let sum: i64 = rows.iter().map(|r| r["sum"].as_i64().unwrap()).sum();
        assert_eq!(count, samples, "{}", file.display());
        assert_eq!(sum, samples * NS_PER_SAMPLE_AT_1000_HZ);
        // Stacks are leaf first and carry split7030's call tree: hot_a about 70%.
        let weight = |f: &str| -> i64 {
            rows.iter()
                .filter(|r| {
                    let names: Vec<&str> = r["names"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|n| n.as_str().unwrap())
                        .collect();
                    let at = |n: &str| names.iter().position(|x| *x == n);
                    matches!((at(f), at("outer"), at("main")), (Some(a), Some(b), Some(c)) if a < b && b < c)
                })
                .map(|r| r["count"].as_i64().unwrap())
                .sum()
        };
        let (a, b) = (weight("hot_a"), weight("hot_b"));
        let share = a as f64 / (a + b).max(1) as f64;
        eprintln!(
            "{}: {count} samples, hot_a {a}, hot_b {b} ({:.0}% hot_a)",
            file.display(),
            share * 100.0
        );
        assert!(
            (0.55..=0.85).contains(&share) && a + b >= samples * 8 / 10,
            "hot_a {a}, hot_b {b} of {samples}"
        );
        for row in rows {
            assert_eq!(row["attributes"]["thread.name"], "split7030");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let _ = std::fs::remove_dir_all(firefox.parent().unwrap());
}

fn off_cpu_time_is_a_second_otlp_profile() {
    let (o, firefox) = record(&["--off-cpu"], &[&target("waiter"), "1"]);
    assert!(o.status.success(), "record --off-cpu: {}", stderr(&o));
    let dir = firefox.parent().unwrap();
    let (otlp, pprof) = (dir.join("w.otlp"), dir.join("w.pb.gz"));
    for out in [&otlp, &pprof] {
        let c = Command::new(sampler_bin())
            .arg("convert")
            .arg(&firefox)
            .arg("-o")
            .arg(out)
            .output()
            .unwrap();
        assert!(
            c.status.success(),
            "convert to {}: {}",
            out.display(),
            stderr(&c)
        );
    }
    let v = decode_with_python(&otlp);
    assert_eq!(
        v["sample_types"],
        serde_json::json!([["cpu", "nanoseconds"], ["off_cpu", "nanoseconds"]])
    );
    // The OTLP samples carry the same CPU and off-CPU nanoseconds as the pprof profile
    // (its values: samples, cpu, off-cpu), thread by thread.
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&pprof).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let pprof = PprofProfile::decode(&raw[..]).unwrap();
    let thread_key = pprof
        .string_table
        .iter()
        .position(|s| s == "thread")
        .unwrap() as i64;
    let mut want: HashMap<(String, usize), i64> = HashMap::new();
    for s in &pprof.sample {
        let label = s.label.iter().find(|l| l.key == thread_key).unwrap();
        let thread = pprof.string_table[label.str as usize].clone();
        for value in [1, 2] {
            *want.entry((thread.clone(), value)).or_default() += s.value[value];
        }
    }
    let mut got: HashMap<(String, usize), i64> = HashMap::new();
    for row in v["samples"].as_array().unwrap() {
        let thread = row["attributes"]["thread.name"]
            .as_str()
            .unwrap()
            .to_string();
        let value = if row["type"] == "cpu" { 1 } else { 2 };
        *got.entry((thread, value)).or_default() += row["sum"].as_i64().unwrap();
    }
    want.retain(|_, v| *v != 0);
    assert_eq!(got, want);
    let waiter_off = got[&("waiter".to_string(), 2)];
    // Two threads are named waiter: the main thread, joining all along, and the worker.
    eprintln!(
        "the threads named waiter: {} ms off the CPU in OTLP and pprof alike",
        waiter_off / 1_000_000
    );
    assert!(
        waiter_off >= 300_000_000,
        "waiter waits 50% of 1 s: {waiter_off} ns"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A cgroup hierarchy in which root can make a cgroup (v1's cpu controller, else v2's):
/// where a test puts a recording in a cgroup named as a container runtime names its own.
fn cgroup_hierarchy() -> Option<String> {
    [
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ]
    .into_iter()
    .find(|h| {
        let probe = Path::new(h).join(format!("sampler-probe-{}", std::process::id()));
        let made = std::fs::create_dir(&probe).is_ok() && probe.join("cgroup.procs").exists();
        let _ = std::fs::remove_dir(&probe);
        made
    })
    .map(str::to_string)
}

/// A cgroup made for a test, removed when dropped (once the processes in it are gone).
struct Cgroup(PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn a_recorded_command_in_a_container_has_its_container_id() {
    // 64 hex digits, as Docker, containerd and Podman name a container's cgroup.
    let id: String = (0..4)
        .map(|i| {
            format!(
                "{:016x}",
                (u64::from(std::process::id()) << 20) ^ (i * 0x9e37_79b9_7f4a_7c15)
            )
        })
        .collect();
    let cgroup = Cgroup(
        Path::new(&cgroup_hierarchy().expect("a cgroup hierarchy"))
            .join(format!("docker-{id}.scope")),
    );
    std::fs::create_dir(&cgroup.0).unwrap();
    let out = tempdir().join("c.otlp");
    // The shell moves itself into the cgroup, then becomes sampler (which the command
    // inherits the cgroup from).
    let o = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1/cgroup.procs" && exec "$2" record -o "$3" -- "$4" 0.3"#)
        .args(["sh", &cgroup.0.display().to_string(), sampler_bin()])
        .arg(&out)
        .arg(target("split7030"))
        .output()
        .unwrap();
    assert!(o.status.success(), "record in a cgroup: {}", stderr(&o));
    assert_eq!(container_of(&out), Some(id.clone()), "the recorded command");
    // A process attached to (-p) in the container: named from its own cgroup; the same
    // recording converted from its file later, while it still runs there, names none.
    let mut running = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1/cgroup.procs" && exec "$2" 5"#)
        .args(["sh", &cgroup.0.display().to_string(), &target("split7030")])
        .spawn()
        .unwrap();
    let pid = running.id().to_string();
    wait_for_child(std::process::id(), "split7030", Duration::from_secs(10));
    let attached = out.with_file_name("attached.otlp");
    let firefox = out.with_file_name("attached.json");
    for file in [&attached, &firefox] {
        let o = Command::new(sampler_bin())
            .args(["record", "-p", &pid, "-d", "0.3", "-o"])
            .arg(file)
            .output()
            .unwrap();
        assert!(o.status.success(), "record -p: {}", stderr(&o));
    }
    ffp_check(&firefox);
    let converted = out.with_file_name("converted.otlp");
    let c = Command::new(sampler_bin())
        .arg("convert")
        .arg(&firefox)
        .arg("-o")
        .arg(&converted)
        .output()
        .unwrap();
    assert!(c.status.success(), "{}", stderr(&c));
    let _ = running.kill();
    let _ = running.wait();
    assert_eq!(container_of(&attached), Some(id.clone()), "attached");
    assert_eq!(container_of(&converted), None, "converted");
    eprintln!("container.id {id}: named for the command and the attached process, not by convert");
    let _ = std::fs::remove_dir_all(out.parent().unwrap());
}

/// The `container.id` of the first resource of an `.otlp` file.
fn container_of(file: &Path) -> Option<String> {
    let request = sampler::emit::otlp::proto::ExportProfilesServiceRequest::decode(
        &std::fs::read(file).unwrap()[..],
    )
    .unwrap();
    let resource = request.resource_profiles[0].resource.clone().unwrap();
    match resource
        .attributes
        .into_iter()
        .find(|a| a.key == "container.id")?
        .value?
        .value?
    {
        sampler::emit::otlp::proto::Value::String(id) => Some(id),
        other => panic!("container.id is {other:?}"),
    }
}

/// Serves one request on `listener` (answering `status`) in a thread.
fn serve_one(listener: TcpListener, status: &'static str) -> std::thread::JoinHandle<Request> {
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        answer_request(stream, status)
    })
}

fn push_posts_gzipped_pprof_and_a_failed_send_keeps_the_file() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/ingest?name=split7030&format=pprof",
        listener.local_addr().unwrap().port()
    );
    let server = serve_one(listener, "200 OK");
    let (o, profile) = record(&["--push", &url], &[&target("split7030"), "1"]);
    assert!(o.status.success(), "record --push: {}", stderr(&o));
    let request = server.join().unwrap();
    let head = request.head.to_ascii_lowercase();
    assert!(
        head.starts_with("post /ingest?name=split7030&format=pprof http/1.1"),
        "{head}"
    );
    assert!(
        head.contains("content-type: application/x-protobuf"),
        "{head}"
    );
    assert!(head.contains("content-encoding: gzip"), "{head}");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&request.body[..])
        .read_to_end(&mut raw)
        .expect("the body is gzipped");
    let pprof = PprofProfile::decode(&raw[..]).expect("the body is a pprof profile");
    let names: Vec<&str> = pprof
        .function
        .iter()
        .map(|f| pprof.string_table[f.name as usize].as_str())
        .collect();
    for name in SPLIT_FUNCTIONS {
        assert!(names.contains(&name), "no {name} in {names:?}");
    }
    let samples: i64 = pprof.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(samples, summary_samples(&o));
    eprintln!(
        "the server got {} bytes of gzipped pprof: {samples} samples",
        request.body.len()
    );

    // --otlp with the SDKs' headers variable: the request carries them.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let otlp_url = format!(
        "http://127.0.0.1:{}/v1development/profiles",
        listener.local_addr().unwrap().port()
    );
    let server = serve_one(listener, "200 OK");
    let o = Command::new(sampler_bin())
        .arg("convert")
        .arg(&profile)
        .args(["--otlp", &otlp_url])
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-scope-orgid=team%201,authorization=Bearer t0k",
        )
        .env_remove("OTEL_EXPORTER_OTLP_PROFILES_HEADERS")
        .output()
        .unwrap();
    assert!(o.status.success(), "convert --otlp: {}", stderr(&o));
    let request = server.join().unwrap();
    let head = request.head.to_ascii_lowercase();
    assert!(
        head.starts_with("post /v1development/profiles http/1.1"),
        "{head}"
    );
    for header in [
        "x-scope-orgid: team 1",
        "authorization: bearer t0k",
        "content-encoding: gzip",
    ] {
        assert!(head.contains(header), "no {header:?} in {head}");
    }

    // A back end that is down: the file stays, one line says where, the exit is 1.
    let dead = format!("http://127.0.0.1:{}/v1development/profiles", free_port());
    for (args, kept) in [
        (
            vec![
                "convert".to_string(),
                profile.display().to_string(),
                "--otlp".into(),
                dead.clone(),
            ],
            profile.clone(),
        ),
        (
            vec![
                "convert".to_string(),
                profile.display().to_string(),
                "--push".into(),
                url.clone(),
            ],
            profile.clone(),
        ),
    ] {
        let o = Command::new(sampler_bin()).args(&args).output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        let line = format!("the profile is kept in {}", kept.display());
        assert_eq!(
            err.lines().filter(|l| l.contains(&line)).count(),
            1,
            "{err}"
        );
        assert!(
            err.contains("could not send the profile to http://127.0.0.1:"),
            "{err}"
        );
    }
    let (o, written) = record(&["--otlp", &dead], &[&target("split7030"), "0.2"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("the profile is kept in {}", written.display())),
        "{err}"
    );
    load_checked(&written);
    let _ = std::fs::remove_dir_all(profile.parent().unwrap());
    let _ = std::fs::remove_dir_all(written.parent().unwrap());
}

fn main() {
    run_tests(tests![
        otlp_push_reaches_a_real_collector: Need::Perf,
            Need::Consumer(
                "the OpenTelemetry Collector at target/otelcol (scripts/install-consumers builds it)",
                collector_present
            );
        the_otlp_file_decodes_with_the_official_python_types: Need::Perf,
            Need::Consumer(
                "python's opentelemetry-proto in target/otlp-venv (scripts/install-consumers installs it)",
                python_otlp_present
            );
        off_cpu_time_is_a_second_otlp_profile: Need::Perf, Need::Root,
            Need::Consumer(
                "python's opentelemetry-proto in target/otlp-venv (scripts/install-consumers installs it)",
                python_otlp_present
            );
        push_posts_gzipped_pprof_and_a_failed_send_keeps_the_file: Need::Perf;
        continuous_windows_reach_a_real_collector_one_export_each: Need::Perf,
            Need::Consumer(
                "the OpenTelemetry Collector at target/otelcol (scripts/install-consumers builds it)",
                collector_present
            );
        a_recorded_command_in_a_container_has_its_container_id: Need::Perf, Need::Root,
            Need::Located("a cgroup hierarchy where root can make a cgroup", cgroup_hierarchy);
    ]);
}
