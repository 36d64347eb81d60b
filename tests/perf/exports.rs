//! End-to-end: `sampler report` and `sampler convert` on real recordings. The terminal
//! tree shows the bench targets' known call trees; every export format agrees with the
//! profile on the total and on each function's self samples; and real consumers read the
//! files: `go tool pprof`, speedscope's published JSON schema, an XML parser.
//!
//! Consumers that are not installed (`scripts/install-consumers` installs them) are
//! skipped visibly; with `SAMPLER_REQUIRE_CONSUMERS=1` (as in CI) they fail.

#[path = "../common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::*;
use prost::Message;
use sampler::calltree::CallTree;
use sampler::emit::{load, pprof::PprofProfile};

fn run(args: &[&str]) -> Output {
    Command::new(sampler_bin())
        .args(args)
        .output()
        .expect("sampler runs")
}

/// One recording of uselibs (several libraries, inlined calls, the vdso) shared by the
/// tests of this file (each needs perf).
fn uselibs_profile() -> &'static Path {
    &uselibs_recording().0
}

/// The recording of uselibs and the CPU time the command really got (ms).
fn uselibs_recording() -> &'static (PathBuf, f64) {
    static RECORDING: OnceLock<(PathBuf, f64)> = OnceLock::new();
    RECORDING.get_or_init(|| {
        let (o, path) = record(&["-F", "1000"], &[&target("uselibs")]);
        assert!(o.status.success(), "recording uselibs: {}", stderr(&o));
        ffp_check(&path);
        (path, command_cpu_ms(&o))
    })
}

/// speedscope's published schema: where scripts/install-consumers puts it, or
/// `SAMPLER_SPEEDSCOPE_SCHEMA`.
fn speedscope_schema() -> Option<String> {
    std::env::var("SAMPLER_SPEEDSCOPE_SCHEMA")
        .ok()
        .or_else(|| {
            Some(
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/target/speedscope/file-format-schema.json"
                )
                .into(),
            )
        })
        .filter(|p: &String| Path::new(p).exists())
}

/// Whether the schema and python3's jsonschema are there.
fn speedscope_validator_present() -> bool {
    let jsonschema = Command::new("python3")
        .args(["-c", "import jsonschema"])
        .output()
        .is_ok_and(|o| o.status.success());
    speedscope_schema().is_some() && jsonschema
}

fn convert(profile: &Path, format: &str, out: &Path) {
    let o = run(&[
        "convert",
        &profile.display().to_string(),
        "--format",
        format,
        "-o",
        &out.display().to_string(),
    ]);
    succeeded(&format!("convert --format {format}"), &o);
}

type SelfCounts = HashMap<String, u64>;

fn folded_self(text: &str) -> SelfCounts {
    let mut out = SelfCounts::new();
    for line in text.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("stack and count");
        let leaf = stack.rsplit(';').next().unwrap();
        *out.entry(leaf.to_string()).or_default() += count.parse::<u64>().unwrap();
    }
    out
}

fn speedscope_self(v: &serde_json::Value, interval_ms: f64) -> SelfCounts {
    let frames = v["shared"]["frames"].as_array().unwrap();
    let mut out = SelfCounts::new();
    for p in v["profiles"].as_array().unwrap() {
        assert_eq!(p["type"], "sampled");
        let samples = p["samples"].as_array().unwrap();
        let weights = p["weights"].as_array().unwrap();
        assert_eq!(samples.len(), weights.len());
        for (s, w) in samples.iter().zip(weights) {
            let leaf = s.as_array().unwrap().last().unwrap().as_u64().unwrap() as usize;
            let name = frames[leaf]["name"].as_str().unwrap().to_string();
            *out.entry(name).or_default() += (w.as_f64().unwrap() / interval_ms).round() as u64;
        }
    }
    out
}

fn pprof_decode(path: &Path) -> PprofProfile {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut bytes)
        .expect("pprof file is gzipped");
    PprofProfile::decode(&bytes[..]).expect("pprof file decodes as profile.proto")
}

fn pprof_self(p: &PprofProfile) -> SelfCounts {
    let s = |i: i64| p.string_table[i as usize].clone();
    let mut out = SelfCounts::new();
    for sample in &p.sample {
        let loc = &p.location[sample.location_id[0] as usize - 1];
        assert_eq!(loc.id, sample.location_id[0]);
        // The innermost line of the leaf location is the running function.
        let f = &p.function[loc.line[0].function_id as usize - 1];
        *out.entry(s(f.name)).or_default() += sample.value[0] as u64;
    }
    out
}

/// Self counts from the flame graph's boxes: each box's tooltip gives its samples, and
/// its self samples are those not covered by the boxes stacked on it (by geometry).
fn svg_self(text: &str) -> (u64, SelfCounts) {
    let doc = roxmltree::Document::parse(text).expect("the SVG is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let total: u64 = root
        .attribute("data-total-samples")
        .unwrap()
        .parse()
        .unwrap();
    struct B {
        name: String,
        samples: u64,
        x: f64,
        w: f64,
        y: f64,
    }
    let mut boxes = Vec::new();
    for g in root
        .children()
        .filter(|n| n.has_tag_name("g") && n.attribute("class") == Some("f"))
    {
        let title = g.children().find(|n| n.has_tag_name("title")).unwrap();
        let title = title.text().unwrap();
        let (head, counts) = title.split_once('\n').unwrap();
        let name = head
            .split(" in ")
            .next()
            .unwrap()
            .trim_end_matches(" (inlined)");
        let samples: u64 = counts.split(' ').next().unwrap().parse().unwrap();
        let rect = g.children().find(|n| n.has_tag_name("rect")).unwrap();
        let num = |a: &str| rect.attribute(a).unwrap().parse::<f64>().unwrap();
        boxes.push(B {
            name: name.to_string(),
            samples,
            x: num("x"),
            w: num("width"),
            y: num("y"),
        });
    }
    let all = boxes.iter().find(|b| b.name == "all").expect("an all box");
    let scale = all.w / total as f64;
    let to_samples = |px: f64| ((px - all.x) / scale).round() as i64;
    let mut out = SelfCounts::new();
    for b in &boxes {
        assert_eq!(
            to_samples(b.x + b.w) - to_samples(b.x),
            b.samples as i64,
            "width of {}",
            b.name
        );
        if b.name == "all" {
            continue;
        }
        let (start, end) = (to_samples(b.x), to_samples(b.x + b.w));
        let above: u64 = boxes
            .iter()
            .filter(|c| (c.y - (b.y - 16.0)).abs() < 0.01)
            .filter(|c| to_samples(c.x) >= start && to_samples(c.x + c.w) <= end)
            .map(|c| c.samples)
            .sum();
        let own = b.samples - above;
        if own > 0 {
            *out.entry(b.name.clone()).or_default() += own;
        }
    }
    (total, out)
}

/// The roots of `sampler report --invert` (functions with their self samples). A line
/// is four columns (running, %, self, %), two spaces, then guides and a name; roots
/// have no guides.
fn report_self(text: &str) -> SelfCounts {
    let mut out = SelfCounts::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 5 || cols[0].parse::<u64>().is_err() || !cols[1].ends_with('%') {
            continue;
        }
        let mut rest = line;
        for _ in 0..4 {
            rest = rest.trim_start();
            rest = &rest[rest.find(' ').unwrap_or(rest.len())..];
        }
        let rest = rest.strip_prefix("  ").expect("two spaces before the tree");
        if rest.starts_with([' ', '├', '└', '│']) {
            continue;
        }
        let name = rest
            .split("  ")
            .next()
            .unwrap()
            .trim_end_matches(" (inlined)");
        *out.entry(name.to_string()).or_default() += cols[2].parse::<u64>().unwrap();
    }
    out
}

fn every_format_agrees_on_totals_and_self_samples() {
    let profile_path = uselibs_profile();
    let profile = load::read_profile(profile_path).expect("sampler reads its own profile");
    let tree = CallTree::all_threads(&profile);
    let total = tree.total();
    let expected = tree.self_by_function();
    // uselibs runs 2 s: the samples cover the CPU it got, however busy the machine.
    assert_covers_cpu("uselibs", total as usize, uselibs_recording().1, 0.9);
    // uselibs spends about a fifth of its time in each of its phases' functions.
    for hot in [
        "sum_to",
        "clock_gettime",
        "std::_Hash_bytes(void const*, unsigned long, unsigned long)",
    ] {
        assert!(
            expected.get(hot).copied().unwrap_or(0) * 20 > total,
            "{hot} has {:?} of {total} self samples",
            expected.get(hot)
        );
    }
    let sum = |m: &SelfCounts| m.values().sum::<u64>();
    assert_eq!(sum(&expected), total);

    let dir = tempdir();
    convert(profile_path, "folded", &dir.join("p.folded"));
    let folded = folded_self(&std::fs::read_to_string(dir.join("p.folded")).unwrap());
    assert_eq!(folded, expected, "folded stacks");

    convert(profile_path, "speedscope", &dir.join("p.speedscope.json"));
    let v = load(&dir.join("p.speedscope.json"));
    assert_eq!(
        speedscope_self(&v, profile.meta.interval_ms),
        expected,
        "speedscope"
    );

    convert(profile_path, "pprof", &dir.join("p.pb.gz"));
    let pp = pprof_decode(&dir.join("p.pb.gz"));
    assert_eq!(pprof_self(&pp), expected, "pprof");
    let cpu: i64 = pp.sample.iter().map(|s| s.value[1]).sum();
    let interval_ns = (profile.meta.interval_ms * 1e6).round() as i64;
    assert_eq!(cpu, total as i64 * interval_ns, "pprof CPU time");
    assert!(
        pp.location.iter().any(|l| l.line.len() > 1),
        "inlined calls are lines of one location"
    );

    convert(profile_path, "svg", &dir.join("p.svg"));
    let (svg_total, svg) = svg_self(&std::fs::read_to_string(dir.join("p.svg")).unwrap());
    assert_eq!(svg_total, total);
    assert_eq!(svg, expected, "flame graph");

    let o = run(&[
        "report",
        &profile_path.display().to_string(),
        "--invert",
        "--min-percent",
        "0",
        "--width",
        "0",
    ]);
    assert_eq!(
        report_self(&succeeded("report --invert", &o)),
        expected,
        "report --invert"
    );

    // Firefox again: the profile read back and written again is the same JSON.
    convert(profile_path, "firefox", &dir.join("again.json"));
    assert_eq!(load(&dir.join("again.json")), load(profile_path));
}

fn report_shows_the_known_call_tree_and_transforms() {
    let (o, path) = record(&["-F", "1000"], &[&target("split7030"), "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let file = path.display().to_string();
    let report = |extra: &[&str]| {
        let mut args = vec!["report", file.as_str(), "--width", "0"];
        args.extend_from_slice(extra);
        succeeded("report", &run(&args))
    };
    // Each line: running, %, self, %, guides, name.
    let row = |text: &str, name: &str| -> (u64, f64, u64) {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().skip(4).any(|w| w == name))
            .unwrap_or_else(|| panic!("no line for {name} in\n{text}"));
        let c: Vec<&str> = line.split_whitespace().collect();
        (
            c[0].parse().unwrap(),
            c[1].trim_end_matches('%').parse().unwrap(),
            c[2].parse().unwrap(),
        )
    };
    let full = report(&[]);
    // main may have a sibling (a start-up sample), so either connector.
    assert!(full.contains("─ main  split7030\n"), "{full}");
    assert!(full.contains("─ outer\n"), "{full}");
    let (_, share_a, _) = row(&full, "hot_a");
    let (_, share_b, _) = row(&full, "hot_b");
    assert!((60.0..=80.0).contains(&share_a), "hot_a {share_a}%\n{full}");
    assert!((20.0..=40.0).contains(&share_b), "hot_b {share_b}%\n{full}");
    // The helper both call is inlined, and shown so.
    assert!(full.contains("sum_to (inlined)"), "{full}");

    // Focus on outer, merge the inlined helper: outer is the root, hot_a and hot_b run
    // in themselves, and hot_a keeps its share.
    let focused = report(&["--focus-function", "outer", "--merge", "sum_to"]);
    let tree_lines: Vec<&str> = focused
        .lines()
        .skip_while(|l| !l.contains("call tree"))
        .skip(1)
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<u64>().is_ok())
        })
        .collect();
    assert!(tree_lines[0].ends_with("  outer  split7030"), "{focused}");
    assert!(tree_lines[1].ends_with("├─ hot_a"), "{focused}");
    assert!(
        !tree_lines.iter().any(|l| l.contains("sum_to")),
        "{focused}"
    );
    let (a_running, a_share, a_self) = row(&focused, "hot_a");
    assert!(
        a_self * 100 >= a_running * 98,
        "hot_a's helper was merged into it: {focused}"
    );
    assert!((60.0..=80.0).contains(&a_share), "{focused}");

    // Order matters: merging outer first leaves no outer to focus on.
    let o = run(&[
        "report",
        &file,
        "--merge",
        "outer",
        "--focus-function",
        "outer",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no function named outer"), "{err}");

    // Per-line counts, with the source line read from the file.
    let lines = report(&["--lines", "sum_to"]);
    assert!(lines.contains("work.h"), "{lines}");
    assert!(lines.contains("for (long i = 0; i < n; i++)"), "{lines}");

    // Mistakes: one line, non-zero exit.
    for (args, says) in [
        (
            vec!["report", file.as_str(), "--thread", "nosuch"],
            "no thread or process named nosuch",
        ),
        (
            vec!["report", file.as_str(), "--focus", "main>nosuch"],
            "no call node main > nosuch",
        ),
        (
            vec!["report", "/nonexistent.json"],
            "cannot read /nonexistent.json",
        ),
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
    }
}

fn report_per_thread_and_thread_selection() {
    let (o, path) = record(&["-F", "1000"], &[&target("threads"), "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let file = path.display().to_string();
    let per_thread = succeeded(
        "report --per-thread",
        &run(&["report", &file, "--per-thread", "--width", "0"]),
    );
    for (thread, func) in NAMED_THREADS {
        assert!(
            per_thread.contains(&format!("thread {thread} (tid")),
            "{per_thread}"
        );
        assert!(per_thread.contains(func), "{per_thread}");
    }
    let red = succeeded(
        "report --thread worker-red",
        &run(&["report", &file, "--thread", "worker-red", "--width", "0"]),
    );
    assert!(red.contains("red_work"), "{red}");
    assert!(
        !red.contains("green_work") && !red.contains("blue_work"),
        "{red}"
    );
}

fn record_writes_other_formats_directly() {
    let dir = tempdir();
    let out = dir.join("split.folded");
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&out)
        .args(["--", &target("split7030"), "1"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("flamegraph.pl"), "{}", stderr(&o));
    let folded = std::fs::read_to_string(&out).unwrap();
    let under = |f: &str| -> u64 {
        folded
            .lines()
            .filter(|l| l.contains(&format!(";main;outer;{f}")))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    let (a, b) = (under("hot_a"), under("hot_b"));
    let share = 100.0 * a as f64 / (a + b).max(1) as f64;
    assert!(
        (60.0..=80.0).contains(&share),
        "hot_a {share:.1}%: {folded}"
    );

    let svg = dir.join("threads.svg");
    let o = Command::new(sampler_bin())
        .args(["record", "--format", "svg", "--thread-roots", "-o"])
        .arg(&svg)
        .args(["--", &target("threads"), "1"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    roxmltree::Document::parse(&text).expect("well-formed SVG");
    for (thread, _) in NAMED_THREADS {
        assert!(
            text.contains(&format!("<title>{thread} (")),
            "no box for {thread}"
        );
    }
}

fn go_tool_pprof_reads_the_pprof_file() {
    let profile_path = uselibs_profile();
    let out = tempdir().join("p.pb.gz");
    convert(profile_path, "pprof", &out);
    let text = go_pprof_top(&out, "samples");
    assert!(text.contains("Type: samples"), "{text}");
    let profile = load::read_profile(profile_path).unwrap();
    let total = CallTree::all_threads(&profile).total();
    assert!(
        text.contains(&format!("of {total} total")),
        "total {total} not in\n{text}"
    );
    for f in ["lib_hot", "main", "in_own_lib(double)"] {
        assert!(
            text.lines().any(|l| l.ends_with(&format!(" {f}"))),
            "{f} missing:\n{text}"
        );
    }
    // Inlined functions keep their own rows.
    assert!(text.contains("(inline)"), "{text}");
}

fn speedscope_file_validates_against_its_schema() {
    let profile_path = uselibs_profile();
    let schema = speedscope_schema().expect("the schema (a need of this test)");
    let out = tempdir().join("p.speedscope.json");
    convert(profile_path, "speedscope", &out);
    let check = "import json, sys, jsonschema\n\
                 schema = json.load(open(sys.argv[1]))\n\
                 doc = json.load(open(sys.argv[2]))\n\
                 jsonschema.validate(doc, schema)\n\
                 bad = dict(doc, profiles=[dict(doc['profiles'][0], type='nonsense')])\n\
                 try:\n    jsonschema.validate(bad, schema)\n    sys.exit('a broken file validated')\n\
                 except jsonschema.ValidationError:\n    print('valid')\n";
    let o = Command::new("python3")
        .args(["-c", check, &schema])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("valid"),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn main() {
    run_tests(tests![
        every_format_agrees_on_totals_and_self_samples: Need::Perf;
        report_shows_the_known_call_tree_and_transforms: Need::Perf;
        report_per_thread_and_thread_selection: Need::Perf;
        record_writes_other_formats_directly: Need::Perf;
        go_tool_pprof_reads_the_pprof_file: Need::Perf,
            Need::Consumer("go (scripts/install-consumers installs it)", go_present);
        speedscope_file_validates_against_its_schema: Need::Perf,
            Need::Consumer(
                "speedscope's file-format-schema.json and python3's jsonschema (scripts/install-consumers installs them)",
                speedscope_validator_present
            );
    ]);
}
