//! End-to-end: the recording holds up against what users and machines do to it — signals
//! other than Ctrl-C, a stderr that cannot be written, a frame-pointer chain that never
//! ends, a frame limit below the stack — and an empty or incomplete profile always says
//! why. Each test is skipped (visibly) where perf recording is not permitted.

#[path = "../common/mod.rs"]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn stop_signals_write_the_profile_and_reach_the_command() {
    let test = "stop_signals_write_the_profile_and_reach_the_command";
    let signals = [
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGALRM,
        Signal::SIGTERM,
    ];
    let dir = tempdir();
    let running: Vec<_> = signals
        .iter()
        .map(|&sig| {
            let out = dir.join(format!("{sig:?}.json"));
            let child = Command::new(sampler_bin())
                .args(["record", "-o"])
                .arg(&out)
                .args(["--", &target("split7030"), "30"])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (sig, out, child)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    for (sig, _, child) in &running {
        kill(Pid::from_raw(child.id() as i32), *sig).unwrap();
    }
    for (sig, out, mut child) in running {
        let status = wait_with_timeout(&mut child, Duration::from_secs(20));
        let o = child.wait_with_output().unwrap();
        let status = status.unwrap_or_else(|| panic!("{sig:?}: sampler did not stop"));
        // The command got the signal and died of it; sampler says so in its exit code.
        assert_eq!(
            status.code(),
            Some(128 + sig as i32),
            "{sig:?}: {status:?} {}",
            stderr(&o)
        );
        assert!(
            stderr(&o).contains(&format!("killed by signal {}", sig as i32)),
            "{sig:?}: {}",
            stderr(&o)
        );
        let n = all_paths(&out).len();
        eprintln!("{test}: {sig:?}: {n} samples");
        assert!(n > 20, "{sig:?}: {n} samples");
        ffp_check(&out);
    }
}

fn stop_signals_leave_attached_processes_running() {
    for sig in [Signal::SIGHUP, Signal::SIGUSR1, Signal::SIGALRM] {
        let target = Running::start("split7030", &["30"]);
        // Until the first sample has been written (the machine may be busy).
        let (o, out) = attach_then_signal(&target.pid(), sig, Duration::from_millis(1500));
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("recording interrupted"),
            "{sig:?}: {}",
            stderr(&o)
        );
        let n = all_paths(&out).len();
        assert!(n > 20, "{sig:?}: {n} samples: {}", stderr(&o));
        assert!(
            matches!(target.state(), 'R' | 'S'),
            "{sig:?}: the target is in state {}",
            target.state()
        );
    }
}

/// `sampler record -o OUT -- CMD` with stderr on a full device: every status and summary
/// line fails to be written.
fn record_into_full_stderr(out: &std::path::Path, cmd: &[&str]) -> std::process::ExitStatus {
    Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(out)
        .arg("--")
        .args(cmd)
        .stderr(
            std::fs::File::options()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .status()
        .unwrap()
}

fn a_stderr_that_cannot_be_written_changes_nothing() {
    let dir = tempdir();
    let full = dir.join("full.json");
    let (o, cpu_ms) =
        children_cpu_ms(|| record_into_full_stderr(&full, &[&target("split7030"), "0.5"]));
    assert_eq!(o.code(), Some(0), "2>/dev/full");
    // sampler's children (the command) and sampler itself: at least the command's CPU.
    assert_covers_cpu("2>/dev/full", all_paths(&full).len(), cpu_ms, 0.5);
    ffp_check(&full);
    // The exit code is still the command's.
    let o = record_into_full_stderr(&dir.join("code.json"), &["sh", "-c", "exit 3"]);
    assert_eq!(
        o.code(),
        Some(3),
        "2>/dev/full keeps the command's exit code"
    );
    // A pipe whose reader leaves after the first line: the rest meets EPIPE.
    let piped = dir.join("piped.json");
    let script = format!(
        "{} record -o {} -- {} 0.5 2>&1 | head -1; exit ${{PIPESTATUS[0]}}",
        sampler_bin(),
        piped.display(),
        target("split7030")
    );
    let o = Command::new("bash").args(["-c", &script]).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "2>&1 | head -1: {}", stderr(&o));
    let first = String::from_utf8_lossy(&o.stdout);
    assert!(first.starts_with("sampler: sampling"), "{first}");
    assert!(all_paths(&piped).len() > 100);
    ffp_check(&piped);
}

fn a_looping_frame_pointer_chain_loses_no_sample() {
    let test = "a_looping_frame_pointer_chain_loses_no_sample";
    for mode in ["hybrid", "fp", "dwarf"] {
        let (o, path) = record(&["--unwind", mode], &[&target("fploop"), "1"]);
        assert!(o.status.success(), "{mode}: {}", stderr(&o));
        let paths = all_paths(&path);
        let p = load(&path);
        let lost = p["meta"]["extra"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["entries"].as_array().unwrap())
            .find(|e| e["label"] == "Lost samples")
            .map_or(0, |e| e["value"].as_u64().unwrap());
        let in_loop = paths
            .iter()
            .filter(|p| p.iter().any(|f| f == "spin_in_loop"))
            .count();
        eprintln!(
            "{test}: {mode}: {} samples, {lost} lost, {in_loop} in spin_in_loop",
            paths.len()
        );
        // 1 s of one busy thread at 1000 Hz: every sample of the CPU time it got, kept
        // or counted lost.
        assert_covers_cpu(
            &format!("{test} {mode}"),
            paths.len() + lost as usize,
            command_cpu_ms(&o),
            0.8,
        );
        assert!(in_loop * 10 >= paths.len() * 9, "{mode}");
        // The walk stopped at the frame limit, never at the root: every stack of the
        // loop says it is cut.
        for p in paths
            .iter()
            .filter(|p| p.iter().any(|f| f == "spin_in_loop"))
        {
            assert_eq!(p[0], "[truncated]", "{mode}: {:?}", &p[..3.min(p.len())]);
        }
        assert!(stderr(&o).contains("start with [truncated]"), "{mode}");
        ffp_check(&path);
    }
}

fn stacks_cut_at_the_frame_limit_are_marked() {
    for mode in ["hybrid", "fp"] {
        let (o, path) = record(
            &["--unwind", mode, "--max-stack", "100"],
            &[&target("deep"), "0.5"],
        );
        assert!(o.status.success(), "{mode}: {}", stderr(&o));
        let paths = all_paths(&path);
        let deep: Vec<_> = paths
            .iter()
            .filter(|p| p.iter().any(|f| f == "bottom"))
            .collect();
        assert!(deep.len() > 100, "{mode}: {} samples in bottom", deep.len());
        for p in &deep {
            assert_eq!(p[0], "[truncated]", "{mode}: {} frames", p.len());
            assert!(
                !p.iter().any(|f| f == "main"),
                "{mode}: main is below the cut"
            );
        }
    }
}

fn a_set_user_id_program_says_why_it_has_no_samples() {
    // Per task (as nobody): a program that gains privileges at exec (set-user-ID root)
    // is not followed by the kernel any more.
    let dir = tempdir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let program = dir.join("setuid-split7030");
    std::fs::copy(target("split7030"), &program).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let recorded = record_as_nobody(
        "a_set_user_id_program_says_why_it_has_no_samples",
        &["--", program.to_str().unwrap(), "0.3"],
    );
    std::fs::remove_file(&program).unwrap();
    let Some((o, path)) = recorded else {
        return;
    };
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(all_paths(&path).len(), 0, "the kernel sampled it after all");
    assert!(
        stderr(&o).contains("set-user-ID or set-group-ID program"),
        "{}",
        stderr(&o)
    );
}

fn per_cpu_events_sample_a_set_user_id_program() {
    // As root, the events are per CPU: not the program's, so not ended at its exec.
    let program = tempdir().join("setuid-split7030");
    std::fs::copy(target("split7030"), &program).unwrap();
    std::os::unix::fs::chown(&program, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let (o, path) = record(&[], &[program.to_str().unwrap(), "0.3"]);
    std::fs::remove_file(&program).unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let n = all_paths(&path).len();
    assert_covers_cpu(
        "per_cpu_events_sample_a_set_user_id_program",
        n,
        command_cpu_ms(&o),
        0.8,
    );
    assert!(!stderr(&o).contains("set-user-ID"), "{}", stderr(&o));
}

fn a_process_left_stopped_says_why_it_has_no_samples() {
    let target = Running::start("split7030", &["30"]);
    let pid = Pid::from_raw(target.0.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    // The stop takes effect when the kernel next runs it, later on a busy machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while target.state() != 'T' {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGSTOP did not stop it"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = tempdir().join("stopped.json");
    let o = Command::new(sampler_bin())
        .args(["record", "-d", "0.5", "-o"])
        .arg(&out)
        .args(["-p", &target.pid()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        target.state(),
        'T',
        "sampler continued a process it did not stop"
    );
    assert_eq!(all_paths(&out).len(), 0);
    assert!(
        stderr(&o).contains(&format!("pid {pid} was already stopped")),
        "{}",
        stderr(&o)
    );
    kill(pid, Signal::SIGCONT).unwrap();
}

fn a_daemon_that_outlives_the_command_is_named() {
    let script = format!("{} 5 >/dev/null & echo $!", target("split7030"));
    let (o, path) = record(&[], &["sh", "-c", &script]);
    assert!(o.status.success(), "{}", stderr(&o));
    let daemon: i32 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    let err = stderr(&o);
    let _ = kill(Pid::from_raw(daemon), Signal::SIGKILL);
    assert!(
        err.contains("still running when it exited") && err.contains(&format!("{daemon} (")),
        "{err}"
    );
    ffp_check(&path);
}

fn an_empty_profile_says_why() {
    // At 1 Hz a sample needs a second of CPU time: sleep uses a millisecond.
    let (o, path) = record(&["-F", "1"], &["sleep", "0.2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(all_paths(&path).len(), 0);
    assert!(
        stderr(&o).contains("no samples: what was recorded used less than one sampling period of CPU time (1000.0 ms at 1 Hz)"),
        "{}",
        stderr(&o)
    );
    ffp_check(&path);
}

/// `perf record -o DATA ARGS` in the background, once its file exists (its events are
/// open by then).
fn perf_recording(data: &std::path::Path, args: &[&str]) -> std::process::Child {
    let child = Command::new("perf")
        .arg("record")
        .arg("-o")
        .arg(data)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("perf runs (a need of this test)");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !data.exists() {
        assert!(std::time::Instant::now() < deadline, "perf never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    child
}

/// perf's file `data` reads back, and its samples name split7030's hot_a.
fn assert_perf_file_reads_back(data: &std::path::Path) {
    let report = Command::new("perf")
        .args(["report", "--stdio", "-i"])
        .arg(data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        report.status.success() && text.contains("hot_a"),
        "perf report of {}: {}{text}",
        data.display(),
        stderr(&report)
    );
}

fn other_perf_sessions_and_sampler_leave_each_other_whole() {
    let test = "other_perf_sessions_and_sampler_leave_each_other_whole";
    let dir = tempdir();
    // perf beside sampler: sampler's events must not change the records perf gets (with
    // build IDs asked for, the kernel flagged perf's maps as carrying one: perf aborted).
    let sampled = dir.join("sampler.json");
    let mut sampler = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&sampled)
        .args(["--", &target("split7030"), "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let data = dir.join("perf.data");
    let perf = Command::new("perf")
        .arg("record")
        .arg("-o")
        .arg(&data)
        .args(["--", &target("split7030"), "1"])
        .output();
    let beside = sampler.try_wait().unwrap().is_none();
    // Stopped before anything is asserted, so that a failure leaves nothing running.
    kill(Pid::from_raw(sampler.id() as i32), Signal::SIGINT).unwrap();
    let status = wait_with_timeout(&mut sampler, Duration::from_secs(30));
    let o = sampler.wait_with_output().unwrap();
    assert!(beside, "sampler ended before perf: {}", stderr(&o));
    let perf = perf.unwrap();
    assert!(perf.status.success(), "perf record: {}", stderr(&perf));
    assert_perf_file_reads_back(&data);
    // The command died of the Ctrl-C sampler passed on.
    assert_eq!(status.and_then(|s| s.code()), Some(130), "{}", stderr(&o));
    let (n, share) = count_run(&all_paths(&sampled), &["main", "outer", "hot_a"]);
    eprintln!("{test}: beside perf, sampler has {n} samples, {share:.0}% in hot_a");
    assert!(share > 40.0, "{share:.0}% in main > outer > hot_a");
    // sampler beside a session that asks for build IDs: sampler's records (per task, as
    // nobody) come flagged with one, and must still be read as the device and inode.
    let data = dir.join("buildid.data");
    let mut perf = perf_recording(&data, &["-a", "--buildid-mmap", "--", "sleep", "3"]);
    let recorded = record_as_nobody(test, &["--", &target("split7030"), "0.5"]);
    let perf_status = wait_with_timeout(&mut perf, Duration::from_secs(30));
    let perf_out = perf.wait_with_output().unwrap();
    let Some((o, path)) = recorded else { return };
    assert!(o.status.success(), "{}", stderr(&o));
    let (n, share) = count_run(&all_paths(&path), &["main", "outer", "hot_a"]);
    eprintln!("{test}: beside perf --buildid-mmap, {n} samples, {share:.0}% in hot_a");
    assert!(share > 40.0, "{share:.0}% in main > outer > hot_a");
    assert!(
        perf_status.is_some_and(|s| s.success()),
        "perf record -a: {}",
        stderr(&perf_out)
    );
}

fn main() {
    run_tests(tests![
        stop_signals_write_the_profile_and_reach_the_command: Need::Perf;
        stop_signals_leave_attached_processes_running: Need::Perf;
        a_stderr_that_cannot_be_written_changes_nothing: Need::Perf;
        a_looping_frame_pointer_chain_loses_no_sample: Need::Perf;
        stacks_cut_at_the_frame_limit_are_marked: Need::Perf;
        a_set_user_id_program_says_why_it_has_no_samples: Need::Nobody, Need::UserPerf;
        per_cpu_events_sample_a_set_user_id_program: Need::Perf, Need::Root;
        a_process_left_stopped_says_why_it_has_no_samples: Need::Perf;
        a_daemon_that_outlives_the_command_is_named: Need::Perf;
        an_empty_profile_says_why: Need::Perf;
        other_perf_sessions_and_sampler_leave_each_other_whole: Need::Perf, Need::Nobody,
            Need::UserPerf, Need::Program("perf", &["--version"]);
    ]);
}
