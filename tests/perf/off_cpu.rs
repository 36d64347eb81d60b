//! End-to-end: off-CPU recording (`--off-cpu`) of the `waiter` bench target, whose
//! thread "waiter" computes 50%, sleeps 30% and waits on a mutex 20% of each 10 ms
//! cycle, while "reader" blocks in read() on a pipe and the main thread in
//! pthread_join throughout. The shares are read from the Firefox Profiler's own call
//! tree (`ffp-check --json`), and from sampler's report and pprof export.

#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::*;
use serde_json::Value;

/// What [`ffp_check_tool`] finds, for the line of a test skipped without it.
const FFP_CHECK: &str = "../shared/tools/ffp-check (the Firefox Profiler's loader)";

/// How far the shares may be from what the target does: 3 percentage points.
const SHARE_TOLERANCE: f64 = 3.0;

/// `waiter 2` recorded with --off-cpu (once for the tests of this file).
struct WaiterRun {
    profile: PathBuf,
    /// The compute, sleep and lock shares waiter measured on this run, in %: on a busy
    /// machine a holder that gives the lock back late shortens the next compute part, so
    /// the profile is compared with these.
    measured: Vec<f64>,
    /// The CPU time the command used, from sampler's summary.
    cpu_ms: f64,
}

fn waiter_run() -> &'static WaiterRun {
    static RUN: OnceLock<WaiterRun> = OnceLock::new();
    RUN.get_or_init(|| {
        let (o, profile) = record(&["--off-cpu"], &[&target("waiter"), "2"]);
        assert!(o.status.success(), "recording waiter: {}", stderr(&o));
        assert!(
            stderr(&o).contains("sampler: off-CPU: "),
            "no off-CPU summary line: {}",
            stderr(&o)
        );
        WaiterRun {
            profile,
            measured: measured_shares(&String::from_utf8_lossy(&o.stdout)),
            cpu_ms: command_cpu_ms(&o),
        }
    })
}

fn waiter_profile() -> &'static PathBuf {
    &waiter_run().profile
}

/// The Firefox Profiler's own reading of a profile: `ffp-check --json --top 400`, which
/// must load it (exit 0), with every function's running and self time per thread.
fn profiler_view(path: &Path) -> Value {
    let tool = ffp_check_tool().expect("the test needs ffp-check");
    // Into a file: node leaves a large output to a pipe cut short when it exits (a
    // whole-machine profile's view, some hundred KB, came back truncated).
    let view = path.with_extension("view.json");
    let file = std::fs::File::create(&view).expect("the view's file is created");
    let out = Command::new(&tool)
        .args(["--json", "--top", "400"])
        .arg(path)
        .stdout(file)
        .output()
        .unwrap_or_else(|e| panic!("{tool} runs: {e}"));
    let printed = std::fs::read(&view).expect("the view is read");
    assert!(
        out.status.success(),
        "the Firefox Profiler's loader rejects {}: {}{}",
        path.display(),
        String::from_utf8_lossy(&printed),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&printed).expect("ffp-check --json prints JSON")
}

/// The Firefox Profiler's loader, `../shared/tools/ffp-check` beside the repository.
fn ffp_check_tool() -> Option<String> {
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/ffp-check");
    tool.exists().then(|| tool.to_string_lossy().into_owned())
}

/// The running time (ms) of function `name` in the profiler's thread `t`.
fn running(t: &Value, name: &str) -> f64 {
    t["topTotal"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .map_or(0.0, |f| f["total"].as_f64().unwrap())
}

/// Whether the profiler's thread `t` is its process's main thread.
fn is_main(t: &Value) -> bool {
    t["pid"].as_str().and_then(|p| p.parse::<i64>().ok()) == t["tid"].as_i64()
}

/// The profiler's threads named `name`.
fn threads_named<'a>(view: &'a Value, name: &str) -> Vec<&'a Value> {
    view["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == name)
        .collect()
}

/// The worker's running time (ms) and the shares (%) of compute_part, sleep_part and
/// lock_part in it; asserts that the kernel functions it waited in are in its tree.
fn worker_shares(worker: &Value) -> (f64, Vec<f64>) {
    let total = running(worker, "waiter");
    let shares = ["compute_part", "sleep_part", "lock_part"]
        .iter()
        .map(|f| 100.0 * running(worker, f) / total)
        .collect();
    for f in ["do_nanosleep", "futex_wait"] {
        assert!(
            running(worker, &format!("[kernel] {f}")) > 0.01 * total,
            "{f} missing from the worker's tree"
        );
    }
    (total, shares)
}

fn the_firefox_profiler_shows_50_30_20_and_the_threads_blocked_throughout() {
    let view = profiler_view(waiter_profile());
    // Off-CPU time has its own category, with blocked and preempted apart.
    let file = load_checked(waiter_profile());
    let off_cpu = file["meta"]["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "Off-CPU")
        .expect("an Off-CPU category");
    assert_eq!(
        off_cpu["subcategories"],
        serde_json::json!(["Blocked", "Preempted"])
    );
    // The worker is the "waiter" thread that is not the main thread.
    let worker = threads_named(&view, "waiter")
        .into_iter()
        .find(|t| !is_main(t))
        .expect("the worker thread");
    assert_eq!(worker["weightType"], "tracing-ms");
    // The reasons show: the kernel functions the thread waited in.
    let (total, shares) = worker_shares(worker);
    eprintln!(
        "waiter: {total:.0} ms; compute {:.1}%, sleep {:.1}%, lock {:.1}%",
        shares[0], shares[1], shares[2]
    );
    // The thread's whole life is there: about 2 s, on and off the CPU.
    assert!((1900.0..2300.0).contains(&total), "waiter ran {total} ms");
    // 50/30/20 as designed, as the program measured them on this run.
    let measured = &waiter_run().measured;
    eprintln!("waiter measured {measured:?}");
    for (share, want) in shares.iter().zip(measured) {
        assert!(
            (share - want).abs() <= SHARE_TOLERANCE,
            "shares {shares:?}, measured {measured:?}"
        );
    }
    // "reader" blocks in read() on a pipe for the whole run, and the main thread in
    // pthread_join: each appears, with its stack, for (nearly) the whole recording.
    let reader = threads_named(&view, "reader")[0];
    let main = threads_named(&view, "waiter")
        .into_iter()
        .find(|t| is_main(t))
        .expect("the main thread");
    for (t, function, wait) in [
        (reader, "reader", "[kernel] anon_pipe_read"),
        (main, "main", "[kernel] futex_wait"),
    ] {
        let whole = running(t, function);
        let waiting = running(t, wait);
        eprintln!(
            "{}: {function} {whole:.0} ms, {wait} {waiting:.0} ms",
            t["name"]
        );
        assert!(whole > 1900.0, "{function}: {whole} ms");
        assert!(waiting > 0.95 * whole, "{wait}: {waiting} of {whole} ms");
    }
}

fn report_shows_on_off_and_wall_time() {
    let path = waiter_profile();
    let report = |time: &str| {
        let o = Command::new(sampler_bin())
            .args(["report", "--thread", "reader", "--time", time])
            .arg(path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let wall = report("wall");
    assert!(wall.contains("showing wall-clock time"), "{wall}");
    assert!(wall.contains("ms off it ("), "{wall}");
    assert!(wall.contains("anon_pipe_read"), "{wall}");
    let off = report("off-cpu");
    assert!(off.contains("showing off-CPU time"), "{off}");
    // On the CPU, the reader did (nearly) nothing: at most a sample or two in its pipe
    // read, against its 2,000 ms off the CPU in it. Per-CPU cpu-clock (as root) can
    // charge the tick pending at a switch to the thread switched in, so the one sample
    // at `finish_task_switch` as the reader wakes is seen now and then.
    let cpu = report("cpu");
    let in_read: u64 = cpu
        .lines()
        .find(|l| l.contains("anon_pipe_read"))
        .map_or(0, |l| l.split_whitespace().next().unwrap().parse().unwrap());
    assert!(in_read <= 2, "{cpu}");
    // The default is wall-clock time.
    let o = Command::new(sampler_bin())
        .args(["report", "--thread", "reader"])
        .arg(path)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("showing wall-clock time"));
    // --lines and the transforms work on off-CPU time.
    let o = Command::new(sampler_bin())
        .args(["report", "--time", "off-cpu", "--lines", "waiter"])
        .arg(path)
        .output()
        .unwrap();
    let lines = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && lines.contains("waiter.c"), "{lines}");
    let o = Command::new(sampler_bin())
        .args([
            "report",
            "--time",
            "off-cpu",
            "--focus-function",
            "lock_part",
        ])
        .arg(path)
        .output()
        .unwrap();
    let focused = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && focused.contains("futex_wait") && !focused.contains("do_nanosleep"),
        "{focused}"
    );
}

fn folded_carries_either_time() {
    let path = waiter_profile();
    let folded = |time: &str| {
        let out = tempdir().join("w.folded");
        let o = Command::new(sampler_bin())
            .args(["convert", "--time", time, "-o"])
            .arg(&out)
            .arg(path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        std::fs::read_to_string(out).unwrap()
    };
    let sum = |text: &str, function: &str| -> u64 {
        text.lines()
            .filter(|l| {
                l.contains(&format!(";{function};")) || l.contains(&format!(";{function} "))
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum()
    };
    // cpu: sample counts; off-cpu: microseconds.
    let cpu = folded("cpu");
    let off = folded("off-cpu");
    // Asleep is not on the CPU: a few samples as it enters and leaves the sleep.
    let on_cpu_asleep = sum(&cpu, "sleep_part");
    assert!(on_cpu_asleep < 20, "{on_cpu_asleep} samples in sleep_part");
    // Computing is nearly all the CPU the program got (its other threads wait).
    let computing = sum(&cpu, "compute_part") as usize;
    assert_covers_cpu("compute_part", computing, waiter_run().cpu_ms, 0.8);
    // Of its 2 s, the share of sleeping that waiter measured (30% by design).
    let asleep_us = sum(&off, "sleep_part") as f64;
    let measured_us = waiter_run().measured[1] / 100.0 * 2e6;
    assert!(
        (asleep_us - measured_us).abs() <= SHARE_TOLERANCE / 100.0 * 2e6,
        "{asleep_us} µs asleep; waiter measured {measured_us} µs"
    );
}

fn go_tool_pprof_reads_off_cpu_time() {
    let out = tempdir().join("w.pb.gz");
    let o = Command::new(sampler_bin())
        .args(["convert", "-o"])
        .arg(&out)
        .arg(waiter_profile())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = go_pprof_top(&out, "off-cpu");
    assert!(text.contains("Type: off-cpu"), "{text}");
    assert!(text.contains("[kernel] schedule"), "{text}");
}

fn attaching_shows_threads_blocked_since_before() {
    let target = Running::start("waiter", &["4"]);
    let out = tempdir().join("attached.json");
    let o = Command::new(sampler_bin())
        .args(["record", "--off-cpu", "-d", "1", "-o"])
        .arg(&out)
        .args(["-p", &target.pid()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let view = profiler_view(&out);
    // The reader was blocked in read() when sampler attached and stays so: it is off
    // the CPU for the whole second, with its stack.
    let reader = threads_named(&view, "reader")[0];
    let whole = running(reader, "reader");
    eprintln!("reader: {whole:.0} ms in reader()");
    assert!((900.0..1200.0).contains(&whole), "{whole} ms");
    assert!(running(reader, "[kernel] anon_pipe_read") > 0.9 * whole);
    assert_eq!(target.wait(), Some(0));
}

/// The shares `waiter` printed as measured on its run: compute, sleep and lock, in %.
fn measured_shares(stdout: &str) -> Vec<f64> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("waiter: compute "))
        .unwrap_or_else(|| panic!("waiter printed no shares: {stdout}"));
    line.split_whitespace()
        .filter_map(|w| w.strip_suffix("%,").or_else(|| w.strip_suffix('%')))
        .map(|n| n.parse().unwrap())
        .collect()
}

fn the_whole_machine_shows_where_threads_wait() {
    let recording =
        std::thread::spawn(|| record_without_command(&["-a", "--off-cpu", "-d", "2.5"]));
    std::thread::sleep(std::time::Duration::from_millis(400));
    let child = Command::new(target("waiter"))
        .arg("1.5")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("waiter runs");
    let pid = child.id().to_string();
    let out = child.wait_with_output().expect("waiter ends");
    assert!(out.status.success());
    // Under the load of a whole-machine recording the holder may give the lock back
    // late, which shortens the next compute part (seen: 45.6/30.7/22.2): the profile is
    // compared with what the program measured on this run.
    let measured = measured_shares(&String::from_utf8_lossy(&out.stdout));
    let (o, path) = recording.join().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("sampler: off-CPU: "), "{err}");
    let view = profiler_view(&path);
    let worker = threads_named(&view, "waiter")
        .into_iter()
        .find(|t| !is_main(t) && t["pid"] == pid.as_str())
        .expect("the worker thread");
    let (total, shares) = worker_shares(worker);
    eprintln!("-a: waiter {total:.0} ms; shares {shares:.1?}, measured by waiter {measured:?}");
    assert!((1450.0..1600.0).contains(&total), "waiter ran {total} ms");
    for (share, want) in shares.iter().zip(&measured) {
        assert!(
            (share - want).abs() <= SHARE_TOLERANCE,
            "shares {shares:?}, measured {measured:?}"
        );
    }
}

fn without_kernel_access_one_line_says_so_and_the_profile_is_written() {
    let test = "without_kernel_access_one_line_says_so_and_the_profile_is_written";
    let Some((o, path)) = record_as_nobody(test, &["--off-cpu", "--", &target("waiter"), "0.3"])
    else {
        return;
    };
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("no off-CPU time"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("perf_event_paranoid"), "{err}");
    assert!(lines[0].contains("sudo"), "{err}");
    let p = load_checked(&path);
    assert!(sample_count(&p) > 0);
}

fn switches_at_50000_a_second_lose_under_1_percent_beside_busy_cpus() {
    let test = "switches_at_50000_a_second_lose_under_1_percent_beside_busy_cpus";
    // Two threads spinning beside it: the recorder competes for the CPUs with them, as
    // on a loaded machine, and drains its buffers later than on an idle one.
    let busy = Running::start("busy", &["2", "30"]);
    let (o, path) = record(&["--off-cpu"], &[&target("pingpong"), "2", "50000"]);
    drop(busy);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let switches = number_before(&err, " handoffs in");
    let lost = number_before(&err, " lost, ");
    eprintln!("{test}: {lost} records lost for {switches} switches");
    assert!(switches > 90_000, "{err}");
    assert!(lost * 100 < switches, "{lost} records lost: {err}");
    load(&path);
    // Buffers far too small for the switches lose records; the hint names the option
    // that takes fewer switch stacks.
    // (Eight pages: the fewest that hold one hybrid sample.)
    let (o, path) = record(&["--off-cpu", "-m", "8"], &[&target("pingpong"), "0.5"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(number_before(&err, " lost, ") > 0, "{err}");
    assert!(err.contains("--off-cpu-every 8"), "{err}");
    load(&path);
}

fn main() {
    run_tests(tests![
        the_firefox_profiler_shows_50_30_20_and_the_threads_blocked_throughout: Need::Perf,
            Need::KernelFrames, Need::Located(FFP_CHECK, ffp_check_tool);
        report_shows_on_off_and_wall_time: Need::Perf, Need::KernelFrames;
        folded_carries_either_time: Need::Perf, Need::KernelFrames;
        go_tool_pprof_reads_off_cpu_time: Need::Perf, Need::KernelFrames,
            Need::Consumer("go (scripts/install-consumers installs it)", go_present);
        attaching_shows_threads_blocked_since_before: Need::Perf, Need::KernelFrames,
            Need::Located(FFP_CHECK, ffp_check_tool);
        the_whole_machine_shows_where_threads_wait: Need::Perf, Need::KernelFrames,
            Need::Root, Need::Located(FFP_CHECK, ffp_check_tool);
        without_kernel_access_one_line_says_so_and_the_profile_is_written: Need::Nobody,
            Need::UserPerf;
        switches_at_50000_a_second_lose_under_1_percent_beside_busy_cpus: Need::Perf,
            Need::Root;
    ]);
}
