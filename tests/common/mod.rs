//! Helpers shared by the end-to-end tests: building the bench targets, running the
//! `sampler` binary, checking a Firefox processed profile table by table, and reading
//! its samples back as call paths.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

pub fn sampler_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sampler")
}

/// Builds `bench-targets/` once per test binary into the cargo target directory and
/// returns the directory holding the programs.
pub fn bench_targets() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = root.join("target").join("bench-targets");
        let status = Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(root.join("bench-targets"))
            .arg(format!("OUT={}", out.display()))
            .status()
            .expect("make runs");
        assert!(status.success(), "building bench-targets failed");
        out
    })
}

pub fn target(name: &str) -> String {
    bench_targets().join(name).display().to_string()
}

/// Whether this process may record with perf. Without the privilege a test says so on
/// stderr and is skipped; with `SAMPLER_REQUIRE_PERF=1` (set by CI, which runs as root)
/// the missing privilege fails the test instead.
pub fn perf_available(test: &str) -> bool {
    static OK: OnceLock<Result<(), String>> = OnceLock::new();
    let result = OK.get_or_init(|| {
        let dir = tempdir();
        let out = Command::new(sampler_bin())
            .args(["record", "-o"])
            .arg(dir.join("probe.json"))
            .args(["--", "true"])
            .output()
            .expect("sampler runs");
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if out.status.success() {
            Ok(())
        } else if why.contains("perf_event_paranoid") {
            Err(why)
        } else {
            panic!("recording `true` failed for a reason other than permission: {why}");
        }
    });
    match result {
        Ok(()) => true,
        Err(why) => {
            if std::env::var("SAMPLER_REQUIRE_PERF").as_deref() == Ok("1") {
                panic!("{test}: perf recording is required here but failed: {why}");
            }
            eprintln!(
                "SKIPPED {test}: this test records with perf_event_open, which failed: {why}"
            );
            false
        }
    }
}

/// Runs `sampler record -o DIR/profile.json ARGS` as user nobody (through `setpriv`), in
/// a directory nobody may write. `None`, after saying that `test` is skipped, where this
/// process cannot become nobody (not root, or no setpriv).
pub fn record_as_nobody(test: &str, args: &[&str]) -> Option<(Output, PathBuf)> {
    if !nix::unistd::Uid::effective().is_root()
        || Command::new("setpriv").arg("--help").output().is_err()
    {
        eprintln!("SKIPPED {test}: needs root and setpriv to become nobody");
        return None;
    }
    let dir = tempdir();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let out = dir.join("profile.json");
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args([sampler_bin(), "record", "-o"])
        .arg(&out)
        .args(args)
        .output()
        .expect("setpriv runs");
    Some((o, out))
}

/// A fresh directory under the target directory.
pub fn tempdir() -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-tmp")
        .join(format!(
            "{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `sampler record -o OUT <extra> -- <cmd>` and returns its output and the profile.
pub fn record(extra: &[&str], cmd: &[&str]) -> (Output, PathBuf) {
    let out_path = tempdir().join("profile.json");
    let output = Command::new(sampler_bin())
        .arg("record")
        .arg("-o")
        .arg(&out_path)
        .args(extra)
        .arg("--")
        .args(cmd)
        .output()
        .expect("sampler runs");
    (output, out_path)
}

/// Runs `sampler record -o OUT <args>` (attaching, or the whole machine: no command);
/// its output and the profile's path.
pub fn record_without_command(args: &[&str]) -> (Output, PathBuf) {
    let out = tempdir().join("profile.json");
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&out)
        .args(args)
        .output()
        .expect("sampler runs");
    (o, out)
}

/// Reads a JSON file a test wrote; a Firefox profile is first checked by the Firefox
/// Profiler's own loader ([`ffp_check`]).
pub fn load(path: &Path) -> Value {
    let value = sampler::emit::load::read_json(path).expect("profile is readable JSON");
    if !value["meta"]["preprocessedProfileVersion"].is_null() {
        ffp_check(path);
    }
    value
}

/// Loads a profile and checks its structure (see [`check_processed_profile`]).
pub fn load_checked(path: &Path) -> Value {
    let p = load(path);
    check_processed_profile(&p);
    p
}

/// The number of samples in all threads of a profile.
pub fn sample_count(p: &Value) -> usize {
    thread_paths(p).iter().map(|t| t.paths.len()).sum()
}

fn column<'a>(table: &'a Value, name: &str) -> &'a Vec<Value> {
    table[name]
        .as_array()
        .unwrap_or_else(|| panic!("column {name} missing"))
}

fn check_index_column(table: &Value, name: &str, len: usize, nullable: bool, minus_one_ok: bool) {
    for (i, v) in column(table, name).iter().enumerate() {
        if v.is_null() {
            assert!(nullable, "{name}[{i}] is null");
            continue;
        }
        let n = v
            .as_i64()
            .unwrap_or_else(|| panic!("{name}[{i}] = {v} is not an integer"));
        if n == -1 && minus_one_ok {
            continue;
        }
        assert!(
            n >= 0 && (n as usize) < len,
            "{name}[{i}] = {n} out of range 0..{len}"
        );
    }
}

/// Checks the structure of a processed (v70) profile: every table's columns have its
/// length, every index is in range, stack prefixes point backwards, and inline frames
/// form proper chains (depth d+1 directly under depth d at the same address and symbol).
pub fn check_processed_profile(p: &Value) {
    let meta = &p["meta"];
    assert_eq!(meta["preprocessedProfileVersion"], 70);
    assert_eq!(meta["symbolicated"], true);
    for key in [
        "interval",
        "startTime",
        "processType",
        "product",
        "stackwalk",
        "version",
    ] {
        assert!(!meta[key].is_null(), "meta.{key} missing");
    }
    assert!(meta["markerSchema"].is_array());
    let categories = meta["categories"].as_array().expect("categories");
    assert!(
        categories.iter().any(|c| c["color"] == "grey"),
        "no grey category"
    );
    let shared = &p["shared"];
    let strings = shared["stringArray"].as_array().expect("stringArray").len();
    let libs = p["libs"].as_array().expect("libs");
    for lib in libs {
        for key in [
            "arch",
            "name",
            "path",
            "debugName",
            "debugPath",
            "breakpadId",
        ] {
            assert!(lib[key].is_string(), "lib.{key} not a string: {lib}");
        }
        assert_eq!(lib["breakpadId"].as_str().unwrap().len(), 33);
    }
    let tables: &[(&str, &[&str])] = &[
        ("stackTable", &["frame", "prefixOffset"]),
        (
            "frameTable",
            &[
                "address",
                "lib",
                "inlineDepth",
                "category",
                "subcategory",
                "func",
                "nativeSymbol",
                "innerWindowID",
                "line",
                "column",
                "originalLocation",
            ],
        ),
        (
            "funcTable",
            &[
                "name",
                "isJS",
                "relevantForJS",
                "resource",
                "source",
                "lineNumber",
                "columnNumber",
                "originalLocation",
            ],
        ),
        ("resourceTable", &["name", "host", "type"]),
        (
            "nativeSymbols",
            &["libIndex", "address", "name", "functionSize"],
        ),
        (
            "sources",
            &[
                "id",
                "filename",
                "startLine",
                "startColumn",
                "sourceMapURL",
                "content",
            ],
        ),
        ("sourceLocationTable", &["source", "line", "column"]),
    ];
    let mut lens = HashMap::new();
    for (table, columns) in tables {
        let t = &shared[*table];
        let len = t["length"]
            .as_u64()
            .unwrap_or_else(|| panic!("{table}.length missing")) as usize;
        for c in *columns {
            assert_eq!(column(t, c).len(), len, "{table}.{c} has the wrong length");
        }
        lens.insert(*table, len);
    }
    let (stacks, frames, funcs) = (lens["stackTable"], lens["frameTable"], lens["funcTable"]);
    let st = &shared["stackTable"];
    for (i, off) in column(st, "prefixOffset").iter().enumerate() {
        let off = off.as_u64().expect("prefixOffset integer") as usize;
        assert!(
            off <= i,
            "stack {i} has prefixOffset {off} pointing before the table"
        );
    }
    check_index_column(st, "frame", frames, false, false);
    let ft = &shared["frameTable"];
    check_index_column(ft, "func", funcs, false, false);
    for (i, a) in column(ft, "address").iter().enumerate() {
        let a = a
            .as_i64()
            .unwrap_or_else(|| panic!("frame {i} address {a} is not an integer"));
        assert!(
            (-1..(1 << 53)).contains(&a),
            "frame {i} address {a} is not -1 or an exact lib-relative address"
        );
    }
    check_index_column(ft, "lib", libs.len(), false, true);
    check_index_column(ft, "nativeSymbol", lens["nativeSymbols"], true, false);
    check_index_column(ft, "category", categories.len(), true, false);
    let fu = &shared["funcTable"];
    check_index_column(fu, "name", strings, false, false);
    check_index_column(fu, "resource", lens["resourceTable"], false, true);
    check_index_column(fu, "source", lens["sources"], true, false);
    check_index_column(&shared["resourceTable"], "name", strings, false, false);
    check_index_column(&shared["nativeSymbols"], "name", strings, false, false);
    check_index_column(
        &shared["nativeSymbols"],
        "libIndex",
        libs.len(),
        false,
        false,
    );
    check_index_column(&shared["sources"], "filename", strings, false, false);

    // Inline chains: a frame of depth d > 0 sits directly under a frame of depth d - 1
    // with the same address, lib and native symbol.
    let depth = column(ft, "inlineDepth");
    for i in 0..stacks {
        let f = column(st, "frame")[i].as_u64().unwrap() as usize;
        let d = depth[f].as_u64().unwrap();
        if d == 0 {
            continue;
        }
        assert!(
            !column(ft, "nativeSymbol")[f].is_null(),
            "inline frame {f} without native symbol"
        );
        let off = column(st, "prefixOffset")[i].as_u64().unwrap() as usize;
        assert!(off > 0, "inline frame {f} at a root stack");
        let pf = column(st, "frame")[i - off].as_u64().unwrap() as usize;
        assert_eq!(
            depth[pf].as_u64().unwrap(),
            d - 1,
            "inline depth does not step by one"
        );
        for c in ["address", "lib", "nativeSymbol"] {
            assert_eq!(
                column(ft, c)[pf],
                column(ft, c)[f],
                "inline chain differs in {c}"
            );
        }
    }

    for t in p["threads"].as_array().expect("threads") {
        assert!(t["pid"].is_string(), "thread pid must be a string");
        assert!(t["tid"].is_number());
        let s = &t["samples"];
        let n = s["length"].as_u64().unwrap() as usize;
        assert_eq!(column(s, "stack").len(), n);
        assert_eq!(column(s, "time").len(), n);
        check_index_column(s, "stack", stacks, true, false);
        let times: Vec<f64> = column(s, "time")
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "sample times go backwards"
        );
        assert_eq!(t["markers"]["length"], 0);
    }
}

/// A thread of a loaded profile, with its samples as call paths of function names.
pub struct ThreadPaths {
    pub name: String,
    pub pid: String,
    pub tid: i64,
    pub paths: Vec<Vec<String>>,
}

/// One frame of a sample's stack, as the profile describes it.
#[derive(Clone, Debug)]
pub struct FrameInfo {
    pub name: String,
    pub lib: Option<String>,
    pub inline_depth: u64,
    pub line: Option<u64>,
    pub file: Option<String>,
    /// The lib-relative address (`None` for frames without one).
    pub address: Option<u64>,
}

/// For every thread, every sample's stack of frames, root first.
pub fn thread_frames(p: &Value) -> Vec<(ThreadPaths, Vec<Vec<FrameInfo>>)> {
    let shared = &p["shared"];
    let strings: Vec<&str> = shared["stringArray"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let libs: Vec<&str> = p["libs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    let st = &shared["stackTable"];
    let ft = &shared["frameTable"];
    let fu = &shared["funcTable"];
    let index = |v: &Value| v.as_i64().filter(|&i| i >= 0).map(|i| i as usize);
    let frame_info = |frame: usize| {
        let func = column(ft, "func")[frame].as_u64().unwrap() as usize;
        FrameInfo {
            name: strings[column(fu, "name")[func].as_u64().unwrap() as usize].to_string(),
            lib: index(&column(ft, "lib")[frame]).map(|l| libs[l].to_string()),
            inline_depth: column(ft, "inlineDepth")[frame].as_u64().unwrap(),
            line: column(ft, "line")[frame].as_u64(),
            address: column(ft, "address")[frame].as_u64(),
            file: index(&column(fu, "source")[func]).map(|s| {
                let name = column(&shared["sources"], "filename")[s].as_u64().unwrap();
                strings[name as usize].to_string()
            }),
        }
    };
    let path_of = |mut stack: usize| {
        let mut frames = Vec::new();
        loop {
            frames.push(frame_info(
                column(st, "frame")[stack].as_u64().unwrap() as usize
            ));
            let off = column(st, "prefixOffset")[stack].as_u64().unwrap() as usize;
            if off == 0 {
                break;
            }
            stack -= off;
        }
        frames.reverse();
        frames
    };
    p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let stacks: Vec<Vec<FrameInfo>> = column(&t["samples"], "stack")
                .iter()
                .filter_map(|s| s.as_u64())
                .map(|s| path_of(s as usize))
                .collect();
            let thread = ThreadPaths {
                name: t["name"].as_str().unwrap().to_string(),
                pid: t["pid"].as_str().unwrap().to_string(),
                tid: t["tid"].as_i64().unwrap(),
                paths: stacks
                    .iter()
                    .map(|s| s.iter().map(|f| f.name.clone()).collect())
                    .collect(),
            };
            (thread, stacks)
        })
        .collect()
}

/// The threads of bench-targets/threads.c: thread name and the function it spins in.
pub const NAMED_THREADS: [(&str, &str); 3] = [
    ("worker-red", "red_work"),
    ("worker-green", "green_work"),
    ("worker-blue", "blue_work"),
];

/// The thread called `name`; panics when there is none.
pub fn thread_named<'a>(threads: &'a [ThreadPaths], name: &str) -> &'a ThreadPaths {
    threads
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no thread {name} in the profile"))
}

/// For every thread, every sample's path of function names, root first.
/// Every sample's call path (root first) of the profile at `path`, checked by the
/// Firefox Profiler's loader, all threads together.
pub fn all_paths(path: &Path) -> Vec<Vec<String>> {
    thread_paths(&load_checked(path))
        .into_iter()
        .flat_map(|t| t.paths)
        .collect()
}

pub fn thread_paths(p: &Value) -> Vec<ThreadPaths> {
    thread_frames(p).into_iter().map(|(t, _)| t).collect()
}

/// Whether `path` contains `want` as a contiguous run of functions.
pub fn has_run(path: &[String], want: &[&str]) -> bool {
    path.windows(want.len())
        .any(|w| w.iter().zip(want).all(|(a, b)| a == b))
}

/// How many of `paths` contain `run` (see [`has_run`]), and what percentage that is.
pub fn count_run(paths: &[Vec<String>], run: &[&str]) -> (usize, f64) {
    let n = paths.iter().filter(|p| has_run(p, run)).count();
    (n, 100.0 * n as f64 / paths.len().max(1) as f64)
}

/// The `n` most frequent of `paths` with their counts, most frequent first, one per line
/// (callers joined by " > "): what an assertion on a share prints when it fails.
pub fn commonest_paths(paths: &[Vec<String>], n: usize) -> String {
    let mut counts: std::collections::HashMap<&[String], usize> = Default::default();
    for p in paths {
        *counts.entry(p.as_slice()).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    counts
        .iter()
        .take(n)
        .map(|(p, c)| format!("{c:6}  {}", p.join(" > ")))
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Checks a profile with the Firefox Profiler's own loader, `../shared/tools/ffp-check`
/// beside the repository (exit 0: loaded, and every table consistent). Where the tool is
/// not there it says so and skips the check; with `SAMPLER_REQUIRE_PERF=1` (CI) its
/// absence fails the test.
pub fn ffp_check(path: &Path) {
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/ffp-check");
    if !tool.exists() {
        if std::env::var("SAMPLER_REQUIRE_PERF").as_deref() == Ok("1") {
            panic!("{} is required here but missing", tool.display());
        }
        eprintln!(
            "SKIPPED ffp-check of {}: no {}",
            path.display(),
            tool.display()
        );
        return;
    }
    let out = Command::new(&tool)
        .arg(path)
        .output()
        .expect("ffp-check runs");
    assert!(
        out.status.success(),
        "the Firefox Profiler's loader rejects {} (exit {:?}): {}{}",
        path.display(),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits up to `limit` for `child` to exit.
pub fn wait_with_timeout(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}

/// A bench target running in the background, killed when the test ends however it ends.
pub struct Running(pub std::process::Child);

impl Running {
    pub fn start(name: &str, args: &[&str]) -> Running {
        let child = Command::new(target(name))
            .args(args)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{name} starts: {e}"));
        // Let it get past its start-up (the loader, the first mappings).
        std::thread::sleep(std::time::Duration::from_millis(200));
        Running(child)
    }

    pub fn pid(&self) -> String {
        self.0.id().to_string()
    }

    /// The state letter of /proc/PID/stat.
    pub fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).unwrap();
        stat.rsplit_once(") ").unwrap().1.chars().next().unwrap()
    }

    /// Waits for the program to finish; its exit code.
    pub fn wait(mut self) -> Option<i32> {
        let status = self.0.wait().unwrap();
        status.code()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What an end-to-end test needs of the machine. A test whose needs are not met is
/// reported by the test runner as ignored (with a `SKIPPED name: why` line on stderr),
/// never as passed; where CI requires them (`SAMPLER_REQUIRE_PERF=1`, and
/// `SAMPLER_REQUIRE_CONSUMERS=1` for the consumers) it fails instead.
#[derive(Clone, Copy)]
pub enum Need {
    /// perf_event_open works for this user (a probe recording of `true` succeeds).
    Perf,
    /// Running as root.
    Root,
    /// Root, and `setpriv` to run sampler as user nobody.
    Nobody,
    /// The kernel gives kernel frames (the probe recording says nothing against it).
    KernelFrames,
    /// A program on the PATH that the test runs: its name and the arguments that show it
    /// works.
    Program(&'static str, &'static [&'static str]),
    /// A consumer of the exports (`scripts/install-consumers` installs them): what it is,
    /// and whether it is there.
    Consumer(&'static str, fn() -> bool),
    /// A program the test runs from where it is installed, found by the function (its
    /// path): what it is, and how to find it.
    Located(&'static str, fn() -> Option<String>),
    /// At least this many online CPUs.
    Cpus(usize),
    /// A property of this build of the tests and the binary: what it is, and whether it
    /// holds.
    Build(&'static str, fn() -> bool),
    /// An unprivileged user may record its own processes (`kernel.perf_event_paranoid`
    /// at most 2).
    UserPerf,
}

/// The probe recording: `Ok(stderr)` when it succeeded, else why not.
fn probe() -> &'static Result<String, String> {
    static PROBE: OnceLock<Result<String, String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        let out = Command::new(sampler_bin())
            .args(["record", "-o"])
            .arg(tempdir().join("probe.json"))
            .args(["--", "true"])
            .output()
            .expect("sampler runs");
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if out.status.success() {
            Ok(err)
        } else if err.contains("perf_event_paranoid") {
            Err(format!("perf_event_open is not permitted: {err}"))
        } else {
            panic!("recording `true` failed for a reason other than permission: {err}");
        }
    })
}

impl Need {
    /// Why the need is not met here, or `None`.
    fn unmet(self) -> Option<String> {
        let root = nix::unistd::Uid::effective().is_root();
        let runs = |program: &str, args: &[&str]| {
            Command::new(program)
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        match self {
            Need::Perf => probe().as_ref().err().cloned(),
            Need::Root => (!root).then(|| "needs root".to_string()),
            Need::Nobody => (!root || !runs("setpriv", &["--help"]))
                .then(|| "needs root and setpriv to become user nobody".to_string()),
            Need::KernelFrames => match probe() {
                Err(why) => Some(why.clone()),
                Ok(err) if err.contains("kernel frames not permitted") => {
                    Some("the kernel refuses kernel frames".to_string())
                }
                Ok(_) => None,
            },
            Need::Program(program, args) => {
                (!runs(program, args)).then(|| format!("no working `{program}` here"))
            }
            Need::Located(what, find) => find().is_none().then(|| format!("no {what} here")),
            Need::Build(what, holds) => (!holds()).then(|| format!("this build is not {what}")),
            Need::Consumer(what, present) => {
                (!present()).then(|| format!("{what} is not installed"))
            }
            Need::Cpus(n) => {
                let online = sampler::record::online_cpus().len();
                (online < n).then(|| format!("needs {n} CPUs, this machine has {online}"))
            }
            Need::UserPerf => {
                let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
                    .ok()
                    .and_then(|v| v.trim().parse::<i32>().ok());
                paranoid.is_none_or(|p| p > 2).then(|| {
                    format!("unprivileged users may not record (perf_event_paranoid {paranoid:?})")
                })
            }
        }
    }

    /// The variable with which CI turns this need, unmet, into a failure.
    fn required_by(self) -> &'static str {
        match self {
            Need::Consumer(..) => "SAMPLER_REQUIRE_CONSUMERS",
            _ => "SAMPLER_REQUIRE_PERF",
        }
    }
}

/// One end-to-end test: its name, what it needs, its body.
pub struct Test {
    pub name: &'static str,
    pub needs: &'static [Need],
    pub run: fn(),
}

/// The tests of a file: `tests![name, other: Need::Root, Need::Perf, ...]`.
#[macro_export]
macro_rules! tests {
    ($($name:ident $(: $($need:expr),+)?);* $(;)?) => {
        vec![$($crate::common::Test {
            name: stringify!($name),
            needs: &[$($($need),+)?],
            run: $name,
        }),*]
    };
}

/// Runs `tests` under libtest-mimic, with the command line `cargo test` passes (filters,
/// `--list`, `--test-threads`): met needs run the test, unmet ones report it ignored.
pub fn run_tests(tests: Vec<Test>) -> ! {
    let mut args = libtest_mimic::Arguments::from_args();
    // The tests record real programs and assert their sample counts and shares: one at a
    // time (unless `--test-threads` says otherwise), each target has a CPU to itself
    // instead of competing with other tests' targets, samplers and profile checks.
    args.test_threads.get_or_insert(1);
    let trials = tests
        .into_iter()
        .map(|t| {
            let unmet: Vec<(String, &str)> = t
                .needs
                .iter()
                .filter_map(|n| Some((n.unmet()?, n.required_by())))
                .collect();
            let required: Vec<String> = unmet
                .iter()
                .filter(|(_, var)| std::env::var(var).as_deref() == Ok("1"))
                .map(|(why, var)| format!("{why} ({var}=1 requires it)"))
                .collect();
            if !required.is_empty() {
                let why = required.join("; ");
                libtest_mimic::Trial::test(t.name, move || Err(why.into()))
            } else if !unmet.is_empty() {
                let why: Vec<&str> = unmet.iter().map(|(w, _)| w.as_str()).collect();
                eprintln!("SKIPPED {}: {}", t.name, why.join("; "));
                libtest_mimic::Trial::test(t.name, || Ok(())).with_ignored_flag(true)
            } else {
                let run = t.run;
                libtest_mimic::Trial::test(t.name, move || {
                    run();
                    Ok(())
                })
            }
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}

/// Runs `sampler record -o OUT -p PID`, sends it `signal` after `after`, and waits (at
/// most 20 s) for it to finish; its output and the profile's path.
pub fn attach_then_signal(
    pid: &str,
    signal: nix::sys::signal::Signal,
    after: std::time::Duration,
) -> (Output, PathBuf) {
    let out = tempdir().join("attached.json");
    let mut sampler = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&out)
        .args(["-p", pid])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(after);
    let id = nix::unistd::Pid::from_raw(sampler.id() as i32);
    nix::sys::signal::kill(id, signal).unwrap();
    wait_with_timeout(&mut sampler, std::time::Duration::from_secs(20))
        .expect("sampler stops after the signal");
    (sampler.wait_with_output().unwrap(), out)
}

/// Runs `cmd` and panics with its stderr when it fails.
pub fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Splits `binary` into a stripped copy and a debug file with GNU tools; returns the
/// stripped copy and the debug file.
pub fn split_debug(binary: &str, dir: &Path) -> (PathBuf, PathBuf) {
    let stripped = dir.join("stripped");
    let debug = dir.join("stripped.debug");
    std::fs::copy(binary, &stripped).unwrap();
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&stripped)
        .arg(&debug));
    run(Command::new("strip").arg("--strip-all").arg(&stripped));
    (stripped, debug)
}

/// `ROOT/.build-id/xx/rest.debug` for the build ID of `binary`.
pub fn build_id_path(root: &Path, binary: &Path) -> PathBuf {
    let data = std::fs::read(binary).unwrap();
    use object::Object;
    let file = object::File::parse(&*data).unwrap();
    let id = file.build_id().unwrap().expect("the file has a build ID");
    sampler::files::locate::build_id_path(root, id)
}

/// Whether `go` works (for `go tool pprof`).
pub fn go_present() -> bool {
    Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What `go tool pprof -top` prints of a pprof file for one of its sample types
/// (`-sample_index`), asserting that it read the file.
pub fn go_pprof_top(file: &Path, sample_index: &str) -> String {
    let o = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=200"])
        .arg(format!("-sample_index={sample_index}"))
        .arg(file)
        .env("HOME", tempdir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    text
}

/// What one sample at 1000 Hz stands for on a time event: sampler's period is 1/199
/// longer than 1 ms (1,005,025 ns; see the README's *Recording*).
pub const MS_PER_SAMPLE_AT_1000_HZ: f64 = 1.005_025;

/// The CPU time in ms that the recorded command used, from sampler's summary line `the
/// command used N ms of CPU (getrusage)`. On a busy machine a target gets less CPU than
/// its wall time, so sample counts are compared with this, never with the time it ran.
/// How many user stacks the kernel's walker took to the outermost frame, from the
/// summary of a recording with `--unwind kernel` (0 when it says nothing of them).
#[allow(dead_code)]
pub fn kernel_walked_to_outermost(stderr: &str) -> usize {
    stderr
        .lines()
        .find_map(|l| {
            l.split(" user stacks: ")
                .nth(1)?
                .split(" to the outermost frame")
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

pub fn command_cpu_ms(o: &Output) -> f64 {
    let err = stderr(o);
    err.lines()
        .find_map(|l| {
            l.split("the command used ")
                .nth(1)?
                .split(" ms of CPU")
                .next()
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no CPU time in the summary: {err}"))
}

/// The CPU time in ms that process `pid` has used so far (user and system time of
/// `/proc/PID/stat`, in clock ticks of 10 ms).
pub fn process_cpu_ms(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // After the name: state is field 3 of the line, utime 14 and stime 15.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 * 10.0
}

/// The CPU time in ms of the children this process waited for while `f` ran: the
/// programs `f` ran (the tests run one at a time).
pub fn children_cpu_ms<T>(f: impl FnOnce() -> T) -> (T, f64) {
    use nix::sys::resource::{getrusage, UsageWho};
    let ms = || {
        let u = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap();
        let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
        tv(u.user_time()) + tv(u.system_time())
    };
    let before = ms();
    let result = f();
    (result, ms() - before)
}

/// Asserts that `n` samples at 1000 Hz stand for at least `share` of `cpu_ms`, the CPU
/// time the sampled code really got (and, a sample being at most one period, not much
/// more than all of it).
pub fn assert_covers_cpu(what: &str, n: usize, cpu_ms: f64, share: f64) {
    let sampled = n as f64 * MS_PER_SAMPLE_AT_1000_HZ;
    eprintln!("{what}: {n} samples stand for {sampled:.0} ms of {cpu_ms:.0} ms of CPU");
    assert!(
        sampled >= share * cpu_ms && sampled <= 1.15 * cpu_ms + 20.0,
        "{what}: {n} samples stand for {sampled:.0} ms; the target used {cpu_ms:.0} ms of CPU (at least {:.0}% expected)",
        share * 100.0
    );
}

/// Waits (at most `limit`) until process `parent` has a child running the program named
/// `name` (its `comm`): a recorded command is started only once its events are attached,
/// so from then on the recording is under way, however busy the machine is.
pub fn wait_for_child(parent: u32, name: &str, limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    let has_child = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let Some((head, rest)) = stat.rsplit_once(") ") else {
                return false;
            };
            let comm = head.split_once(" (").map_or("", |(_, c)| c);
            let ppid = rest.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok());
            comm == name && ppid == Some(parent)
        })
    };
    while !has_child() {
        assert!(
            std::time::Instant::now() < deadline,
            "no child {name} of {parent} after {limit:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Removes the `/tmp/perf-PID.map` and `/tmp/jit-PID.dump` files that the processes of
/// profile `p` wrote (JIT runtimes asked for them write them and never remove them):
/// tests leave nothing behind.
pub fn remove_perf_maps(p: &Value) {
    for t in p["threads"].as_array().into_iter().flatten() {
        if let Some(pid) = t["pid"].as_str() {
            let pid = pid.split('.').next().unwrap_or(pid);
            let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
            let _ = std::fs::remove_file(format!("/tmp/jit-{pid}.dump"));
        }
    }
}

/// The standard output of a sampler run that must have succeeded (`what` names it in
/// the failure, with its stderr).
pub fn succeeded(what: &str, o: &Output) -> String {
    assert!(o.status.success(), "{what} failed: {}", stderr(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A port on 127.0.0.1 that nobody listens on right now (the kernel's pick, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP request as a test's server saw it.
pub struct Request {
    pub head: String,
    pub body: Vec<u8>,
}

/// Reads one HTTP request (with a Content-Length) from `stream` and answers `status`,
/// closing the connection.
pub fn answer_request(stream: std::net::TcpStream, status: &str) -> Request {
    use std::io::{BufRead, Read, Write};
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        head.push_str(&line);
    }
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .expect("a Content-Length");
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let mut stream = reader.into_inner();
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    Request { head, body }
}

/// The number that `text` has just before `after` ("100002" in "100002 handoffs").
pub fn number_before(text: &str, after: &str) -> u64 {
    let (head, _) = text
        .split_once(after)
        .unwrap_or_else(|| panic!("no `{after}` in: {text}"));
    let digits: String = head
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.chars().rev().collect::<String>().parse().unwrap()
}
