//! End-to-end: `kernel.perf_event_max_stack`, the one machine-wide setting sampler
//! changes, is back to the value it had before the first session after any sequence of
//! overlapping samplers, concurrent perf sessions, and samplers killed outright.
//!
//! The tests change the setting, so they run one at a time (a lock) and in their own test
//! binary (cargo runs test binaries one after another). Each starts from a value nobody
//! else would choose, so that "put back" cannot be confused with "left at the default".

#[path = "../common/mod.rs"]
mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;

const SETTING: &str = "/proc/sys/kernel/perf_event_max_stack";
/// The value each test starts from.
const BEFORE: u64 = 211;
/// sampler's default frame limit, which it raises the setting to.
const RAISED: u64 = 4096;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn setting() -> u64 {
    std::fs::read_to_string(SETTING)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Sets the setting, waiting while an exiting perf session still blocks it.
fn set(value: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::write(SETTING, value.to_string()).is_err() {
        assert!(Instant::now() < deadline, "cannot set {SETTING} to {value}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `f` from [`BEFORE`], with the lock held, and puts the machine's value back.
fn from_a_known_value(f: impl FnOnce()) {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let machine = setting();
    set(BEFORE);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    set(machine);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// Waits until the setting is `want`, at most `limit`; the value it ends with.
fn settles_at(want: u64, limit: Duration) -> u64 {
    let deadline = Instant::now() + limit;
    while setting() != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    setting()
}

/// `sampler record` of the 2,000-deep recursion for `seconds`, in the background, with
/// the hybrid unwinder (the kernel walker's depth is its own: it never raises the
/// setting, see `the_kernel_walker_changes_nothing`).
fn sampler_deep(seconds: &str) -> (Child, std::path::PathBuf) {
    sampler_deep_with(&["--unwind", "hybrid"], seconds)
}

/// The same with the options `options`.
fn sampler_deep_with(options: &[&str], seconds: &str) -> (Child, std::path::PathBuf) {
    let out = tempdir().join("deep.json");
    let child = Command::new(sampler_bin())
        .arg("record")
        .args(options)
        .arg("-o")
        .arg(&out)
        .args(["--", &target("deep"), seconds])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, out)
}

fn finish(child: Child) -> String {
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    stderr(&o)
}

/// Waits until a background sampler has raised the setting.
fn raised() {
    assert_eq!(settles_at(RAISED, Duration::from_secs(5)), RAISED);
}

/// `perf record -g` of `sleep SECONDS` in the background: its callchain events keep the
/// kernel from changing the setting while it runs. (CI installs perf.)
fn perf_session(seconds: &str) -> Child {
    let child = Command::new("perf")
        .args(["record", "-g", "-o", "/dev/null", "--", "sleep", seconds])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf runs (a need of this test)");
    // Until perf has opened its events, the setting is still free.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::write(SETTING, setting().to_string()).is_ok() {
        assert!(Instant::now() < deadline, "perf never opened its events");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn overlapping_sessions_put_it_back_when_the_last_ends() {
    from_a_known_value(|| {
        // The first to start ends last.
        let (long, _) = sampler_deep("2.5");
        raised();
        let (short, _) = sampler_deep("0.5");
        finish(short);
        assert_eq!(setting(), RAISED, "the longer session still needs it");
        finish(long);
        assert_eq!(setting(), BEFORE);
        // The first to start ends first.
        let (first, _) = sampler_deep("0.8");
        raised();
        let (second, _) = sampler_deep("2");
        finish(first);
        assert_eq!(setting(), RAISED, "the second session still needs it");
        finish(second);
        assert_eq!(setting(), BEFORE);
        assert!(!std::path::Path::new("/run/sampler/perf_event_max_stack").exists());
    });
}

fn a_session_killed_outright_is_repaired() {
    from_a_known_value(|| {
        // SIGKILL: the watchdog puts it back.
        let (mut victim, _) = sampler_deep("5");
        raised();
        victim.kill().unwrap();
        victim.wait().unwrap();
        assert_eq!(settles_at(BEFORE, Duration::from_secs(5)), BEFORE);
        // The session and its watchdog both killed (`pkill -9 sampler`): the next run
        // repairs it.
        let (mut victim, _) = sampler_deep("5");
        raised();
        let watchdog = format!("restore-max-stack {}", victim.id());
        let found = Command::new("pkill")
            .args(["-KILL", "-f", &watchdog])
            .status()
            .unwrap();
        assert!(found.success(), "no watchdog process `{watchdog}`");
        victim.kill().unwrap();
        victim.wait().unwrap();
        let _ = Command::new("pkill").args(["-KILL", "-x", "deep"]).status();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(setting(), RAISED, "nothing was left to put it back");
        let (o, _) = record(&[], &["true"]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(setting(), BEFORE, "the next run repaired it");
    });
}

/// SIGKILL the moment the setting changes, five times: no moment of the raise is left
/// uncovered (the watchdog runs before the setting is written).
fn a_session_killed_as_it_raises_is_repaired() {
    from_a_known_value(|| {
        for round in 0..5 {
            let (mut victim, _) = sampler_deep("5");
            let deadline = Instant::now() + Duration::from_secs(5);
            while setting() == BEFORE {
                assert!(Instant::now() < deadline, "never raised");
                std::hint::spin_loop();
            }
            victim.kill().unwrap();
            victim.wait().unwrap();
            let _ = Command::new("pkill").args(["-KILL", "-x", "deep"]).status();
            assert_eq!(
                settles_at(BEFORE, Duration::from_secs(5)),
                BEFORE,
                "round {round}"
            );
        }
    });
}

fn a_concurrent_perf_session_blocks_raising_and_the_cut_is_marked() {
    from_a_known_value(|| {
        let perf = perf_session("3");
        let (sampler, out) = sampler_deep("0.5");
        let err = finish(sampler);
        assert_eq!(setting(), BEFORE, "it could not be raised");
        assert!(
            err.contains(&format!("stacks deeper than {BEFORE} frames are cut")),
            "{err}"
        );
        let paths: Vec<Vec<String>> = thread_paths(&load_checked(&out))
            .into_iter()
            .flat_map(|t| t.paths)
            .filter(|p| p.iter().any(|f| f == "bottom"))
            .collect();
        assert!(paths.len() > 100, "{} samples in bottom", paths.len());
        for p in &paths {
            assert_eq!(p[0], "[truncated]", "{} frames, unmarked", p.len());
        }
        ffp_check(&out);
        let _ = perf.wait_with_output();
    });
}

fn a_perf_session_that_outlasts_sampler_delays_the_repair() {
    from_a_known_value(|| {
        // Long enough for perf to open its events on a loaded machine (it can take
        // seconds) while sampler still records.
        let (sampler, _) = sampler_deep("3");
        raised();
        let perf = perf_session("6");
        let err = finish(sampler);
        assert!(err.contains("stays 4096 for now"), "{err}");
        assert_eq!(setting(), RAISED, "perf's events block the change");
        let _ = perf.wait_with_output();
        // The watchdog tries once a second.
        assert_eq!(settles_at(BEFORE, Duration::from_secs(5)), BEFORE);
    });
}

fn a_frame_limit_within_the_setting_changes_nothing() {
    from_a_known_value(|| {
        let (child, _) = sampler_deep_with(&["--unwind", "hybrid", "--max-stack", "150"], "1");
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(setting(), BEFORE, "raised although 150 frames fit");
        assert!(!std::path::Path::new("/run/sampler/perf_event_max_stack").exists());
        let _ = finish(child);
        assert_eq!(setting(), BEFORE);
    });
}

/// The kernel walker (the default as root) walks the 2,000-deep recursion whole with
/// the setting as it was: no record, no watchdog, nothing changed.
fn the_kernel_walker_changes_nothing() {
    from_a_known_value(|| {
        let (child, out) = sampler_deep_with(&["--unwind", "kernel"], "1");
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(setting(), BEFORE, "changed while it records");
        assert!(!std::path::Path::new("/run/sampler/perf_event_max_stack").exists());
        let err = finish(child);
        assert_eq!(setting(), BEFORE);
        let paths: Vec<Vec<String>> = thread_paths(&load_checked(&out))
            .into_iter()
            .flat_map(|t| t.paths)
            .filter(|p| p.iter().any(|f| f == "bottom"))
            .collect();
        assert!(
            paths.len() > 100,
            "{} samples in bottom: {err}",
            paths.len()
        );
        // Samples taken before sampler has read the new process's mappings (its first
        // milliseconds) come back as stack copies, with the kernel's callchain cut at
        // the setting: marked.
        let whole = paths
            .iter()
            .filter(|p| p[0] == "_start" && p.len() > 2000)
            .count();
        let marked = paths.iter().filter(|p| p[0] == "[truncated]").count();
        assert_eq!(whole + marked, paths.len(), "unmarked cuts");
        assert!(
            whole * 100 >= paths.len() * 95,
            "{whole} of {} whole",
            paths.len()
        );
        ffp_check(&out);
    });
}

fn main() {
    const PERF_TOOL: Need = Need::Program("perf", &["--version"]);
    run_tests(tests![
        overlapping_sessions_put_it_back_when_the_last_ends: Need::Perf, Need::Root;
        a_session_killed_outright_is_repaired: Need::Perf, Need::Root;
        a_session_killed_as_it_raises_is_repaired: Need::Perf, Need::Root;
        a_concurrent_perf_session_blocks_raising_and_the_cut_is_marked: Need::Perf, Need::Root, PERF_TOOL;
        a_perf_session_that_outlasts_sampler_delays_the_repair: Need::Perf, Need::Root, PERF_TOOL;
        a_frame_limit_within_the_setting_changes_nothing: Need::Perf, Need::Root;
        the_kernel_walker_changes_nothing: Need::Perf, Need::Root;
    ]);
}
