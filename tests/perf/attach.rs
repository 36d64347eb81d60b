//! End-to-end: `sampler record -p` attaching to running bench targets, for real, and the
//! recorder's ways of holding up (ring buffers it may not have). Each test is skipped
//! (visibly) where perf recording is not permitted.

#[path = "../common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Runs `sampler record -o OUT <args>`; its output and the profile's path.
fn attach(args: &[&str]) -> (std::process::Output, std::path::PathBuf) {
    record_without_command(args)
}

fn ok(test: &str, o: &std::process::Output) {
    assert!(o.status.success(), "{test}: sampler failed: {}", stderr(o));
}

fn attach_records_a_running_program_and_leaves_it_running() {
    let test = "attach_records_a_running_program_and_leaves_it_running";
    let target = Running::start("split7030", &["4"]);
    let started = Instant::now();
    let cpu_before = process_cpu_ms(&target.pid());
    let (o, path) = attach(&["-p", &target.pid(), "-d", "1.5"]);
    let cpu_ms = process_cpu_ms(&target.pid()) - cpu_before;
    ok(test, &o);
    let took = started.elapsed();
    assert!(took < Duration::from_millis(3000), "-d 1.5 took {took:?}");
    assert!(
        stderr(&o).contains("the processes go on running"),
        "{}",
        stderr(&o)
    );
    // The target runs on: not stopped, and it finishes its 4 s normally.
    assert!(
        matches!(target.state(), 'R' | 'S'),
        "state {}",
        target.state()
    );
    let p = load_checked(&path);
    let threads = thread_paths(&p);
    assert_eq!(threads.len(), 1);
    assert_eq!(threads[0].pid, target.pid());
    assert_eq!(threads[0].name, "split7030");
    let paths = &threads[0].paths;
    let (a, _) = count_run(paths, &["main", "outer", "hot_a"]);
    let (b, _) = count_run(paths, &["main", "outer", "hot_b"]);
    let share = 100.0 * a as f64 / (a + b).max(1) as f64;
    eprintln!(
        "{test}: {} samples in 1.5 s, hot_a {a}, hot_b {b} ({share:.1}% a); {}",
        paths.len(),
        stderr(&o)
            .lines()
            .find(|l| l.contains("stopped for"))
            .unwrap_or("")
    );
    // The CPU time it got around the recording holds the 1.5 s recorded and a little
    // more (attaching and detaching).
    assert_covers_cpu(test, paths.len(), cpu_ms, 0.75);
    assert!((60.0..80.0).contains(&share), "hot_a share {share:.1}%");
    assert_eq!(target.wait(), Some(0));
}

fn the_kernel_walker_has_the_tables_of_a_running_program_from_its_start() {
    // The files the process mapped before sampler came are read from /proc while it is
    // stopped, and their tables compiled as it goes on: every sample is walked in the
    // kernel but those of the first milliseconds, while the tables are compiled, which
    // are unwound from their stack copies (and complete all the same).
    let test = "the_kernel_walker_has_the_tables_of_a_running_program_from_its_start";
    let target = Running::start("nofp", &["4"]);
    let (o, path) = attach(&["-p", &target.pid(), "-d", "1", "--unwind", "kernel"]);
    ok(test, &o);
    let threads = thread_paths(&load_checked(&path));
    let paths: Vec<&Vec<String>> = threads.iter().flat_map(|t| &t.paths).collect();
    let walked = kernel_walked_to_outermost(&stderr(&o));
    let full = paths
        .iter()
        .filter(|p| {
            p.first().is_some_and(|f| f == "_start")
                && (has_run(p, &["main", "outer", "middle", "hot_a"])
                    || has_run(p, &["main", "outer", "middle", "hot_b"]))
        })
        .count();
    eprintln!(
        "{test}: {} samples, {walked} walked in the kernel, {full} from _start to hot_a or hot_b",
        paths.len()
    );
    assert!(paths.len() > 300, "{} samples", paths.len());
    assert!(walked * 100 >= paths.len() * 95, "{}", stderr(&o));
    let handed_back = stderr(&o)
        .lines()
        .find(|l| l.contains("the kernel walked"))
        .map(str::to_string)
        .unwrap_or_default();
    for why in ["without a table", "without tables", "no row"] {
        assert!(!handed_back.contains(why), "{handed_back}");
    }
    assert!(full * 100 >= paths.len() * 99);
    assert_eq!(target.wait(), Some(0));
}

fn threads_started_after_attaching_appear_with_their_names() {
    let test = "threads_started_after_attaching_appear_with_their_names";
    // main sleeps 0.6 s before it starts the three named threads.
    let target = Running::start("threads", &["1", "0.6"]);
    let (o, path) = attach(&["-p", &target.pid(), "-d", "1.6"]);
    ok(test, &o);
    let p = load_checked(&path);
    let threads = thread_paths(&p);
    for (name, work) in NAMED_THREADS {
        let t = thread_named(&threads, name);
        let (n, share) = count_run(&t.paths, &[work]);
        eprintln!("{test}: {name}: {n} samples in {work} ({share:.0}%)");
        assert!(
            n > 50 && share > 90.0,
            "{name}: {n} samples, {share:.0}% in {work}"
        );
        assert_eq!(t.pid, target.pid());
    }
}

fn two_processes_at_once_are_two_processes() {
    let test = "two_processes_at_once_are_two_processes";
    let first = Running::start("split7030", &["3"]);
    let second = Running::start("threads", &["3"]);
    let list = format!("{},{}", first.pid(), second.pid());
    let (o, path) = attach(&["-p", &list, "-d", "1"]);
    ok(test, &o);
    let p = load_checked(&path);
    let processes = p["meta"]["extra"].clone();
    let threads = thread_paths(&p);
    let samples_of = |pid: &str| -> usize {
        threads
            .iter()
            .filter(|t| t.pid == pid)
            .map(|t| t.paths.len())
            .sum()
    };
    let (a, b) = (samples_of(&first.pid()), samples_of(&second.pid()));
    eprintln!("{test}: {a} samples in split7030, {b} in threads");
    assert!(
        a > 50 && b > 50,
        "both processes sampled: {a}, {b} ({processes})"
    );
    let (n, _) = count_run(
        &threads
            .iter()
            .filter(|t| t.pid == first.pid())
            .flat_map(|t| t.paths.clone())
            .collect::<Vec<_>>(),
        &["main", "outer", "hot_a"],
    );
    assert!(n > 0, "split7030's call tree");
}

fn process_that_exits_during_recording_ends_it() {
    let test = "process_that_exits_during_recording_ends_it";
    let target = Running::start("split7030", &["1"]);
    let started = Instant::now();
    let cpu_before = process_cpu_ms(&target.pid());
    let (o, path) = attach(&["-p", &target.pid(), "-d", "30"]);
    let (_, cpu_after) = children_cpu_ms(|| target.wait());
    ok(test, &o);
    let took = started.elapsed();
    eprintln!("{test}: sampler returned {took:?} after attaching to a 1 s program");
    assert!(took < Duration::from_secs(5), "sampler waited {took:?}");
    assert!(
        stderr(&o).contains("every attached process exited"),
        "{}",
        stderr(&o)
    );
    let samples = sample_count(&load_checked(&path));
    assert_covers_cpu(test, samples, cpu_after - cpu_before, 0.75);
}

fn mistakes_get_one_line_and_a_non_zero_exit() {
    let one_line = |args: &[&str], want: &str| {
        let (o, _) = attach(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    // Past the kernel's pid_max (at most 2^22), so no process has it.
    one_line(&["-p", "4194305"], "no process with pid 4194305");
    one_line(&["-p", "1", "--", "true"], "not both");
    one_line(
        &["-d", "1", "--", "true"],
        "-d/--duration is for attached processes",
    );
    one_line(&[], "nothing to record");
    if std::fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd") {
        one_line(&["-p", "2"], "is a kernel thread");
    }
}

fn attaching_without_permission_says_what_to_do() {
    let test = "attaching_without_permission_says_what_to_do";
    // A root-owned target that nobody may not profile.
    let target = Running::start("split7030", &["3"]);
    let Some((o, _)) = record_as_nobody(test, &["-p", &target.pid(), "-d", "1"]) else {
        return;
    };
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no permission")
            && err.contains("perf_event_paranoid")
            && err.contains("sudo"),
        "{err}"
    );
    assert!(
        matches!(target.state(), 'R' | 'S'),
        "the target was not stopped"
    );
}

fn attached_process_is_continued_when_sampler_fails_half_way() {
    let test = "attached_process_is_continued_when_sampler_fails_half_way";
    for fault in ["error", "panic"] {
        let target = Running::start("split7030", &["3"]);
        let out = tempdir().join("fault.json");
        let o = Command::new(sampler_bin())
            .env("SAMPLER_TEST_FAULT", fault)
            .args(["record", "-o"])
            .arg(&out)
            .args(["-p", &target.pid(), "-d", "1"])
            .output()
            .unwrap();
        assert!(!o.status.success(), "{fault}: sampler must fail");
        assert!(
            stderr(&o).contains("SAMPLER_TEST_FAULT"),
            "{fault}: {}",
            stderr(&o)
        );
        // The target was stopped when sampler failed; it must be running again.
        std::thread::sleep(Duration::from_millis(100));
        let state = target.state();
        eprintln!("{test}: after a {fault}, the target is in state {state}");
        assert!(
            matches!(state, 'R' | 'S'),
            "{fault}: target left in state {state}"
        );
        assert_eq!(
            target.wait(),
            Some(0),
            "{fault}: the target finishes normally"
        );
    }
}

/// How many threads of process `pid` are stopped (state T).
fn stopped_threads(pid: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
        })
        .count()
}

/// Waits up to 5 s for every thread of `pid` to run again; how many are still stopped.
fn stopped_after_5_s(pid: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    while stopped_threads(pid) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    stopped_threads(pid)
}

fn attached_processes_are_continued_when_sampler_is_killed() {
    let test = "attached_processes_are_continued_when_sampler_is_killed";
    // Killed right after stopping the target, as the OOM killer would kill it.
    let target = Running::start("split7030", &["3"]);
    let o = Command::new(sampler_bin())
        .env("SAMPLER_TEST_FAULT", "kill")
        .args(["record", "-o"])
        .arg(tempdir().join("killed.json"))
        .args(["-p", &target.pid(), "-d", "1"])
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(9), "{}", stderr(&o));
    assert_eq!(
        stopped_after_5_s(&target.pid()),
        0,
        "split7030 left stopped"
    );
    assert_eq!(target.wait(), Some(0), "the target finishes normally");
    // SIGKILL while attaching to 1,000 threads: at the stop, and 10 and 30 ms into it.
    const THREADS: usize = 1000;
    for delay_ms in [0, 10, 30] {
        let target = Running::start("sleepers", &[&THREADS.to_string(), "30"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_dir(format!("/proc/{}/task", target.pid()))
            .unwrap()
            .count()
            <= THREADS
        {
            assert!(
                Instant::now() < deadline,
                "sleepers never started its threads"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut sampler = Command::new(sampler_bin())
            .args(["record", "-o"])
            .arg(tempdir().join("killed.json"))
            .args(["-p", &target.pid(), "-d", "5"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while target.state() != 'T' && Instant::now() < deadline {}
        let seen = target.state() == 'T';
        std::thread::sleep(Duration::from_millis(delay_ms));
        sampler.kill().unwrap();
        sampler.wait().unwrap();
        let left = stopped_after_5_s(&target.pid());
        eprintln!(
            "{test}: killed {delay_ms} ms after the stop (seen: {seen}): {left} of {} threads \
             stopped",
            THREADS + 1
        );
        assert!(seen, "sampler never stopped the target");
        assert_eq!(left, 0, "killed {delay_ms} ms into attaching");
    }
}

fn ctrl_c_stops_the_recording_not_the_processes() {
    let test = "ctrl_c_stops_the_recording_not_the_processes";
    let target = Running::start("split7030", &["4"]);
    let cpu_before = process_cpu_ms(&target.pid());
    let (o, out) = attach_then_signal(
        &target.pid(),
        nix::sys::signal::Signal::SIGINT,
        Duration::from_millis(1000),
    );
    let cpu_ms = process_cpu_ms(&target.pid()) - cpu_before;
    ok(test, &o);
    assert!(
        stderr(&o).contains("recording interrupted"),
        "{}",
        stderr(&o)
    );
    let n = sample_count(&load_checked(&out));
    assert_covers_cpu(test, n, cpu_ms, 0.75);
    assert!(
        matches!(target.state(), 'R' | 'S'),
        "state {}",
        target.state()
    );
    assert_eq!(target.wait(), Some(0), "the target was not interrupted");
}

fn ring_buffers_shrink_when_the_kernel_refuses_their_size() {
    let test = "ring_buffers_shrink_when_the_kernel_refuses_their_size";
    // An unprivileged user may lock kernel.perf_event_mlock_kb per CPU plus `ulimit -l`:
    // far less than 1 GiB.
    let args = ["-m", "262144", "--", &target("split7030"), "0.5"];
    let Some((o, out)) = record_as_nobody(test, &args) else {
        return;
    };
    let err = stderr(&o);
    assert!(!err.contains("perf_event_paranoid"), "{err}");
    ok(test, &o);
    let line = err
        .lines()
        .find(|l| l.contains("ring buffers shrunk from 262144 to"));
    eprintln!("{test}: {}", line.unwrap_or("no shrink message"));
    assert!(line.is_some(), "{err}");
    assert!(sample_count(&load_checked(&out)) > 100);
}

fn child_processes_started_after_attaching_are_their_own_processes() {
    let test = "child_processes_started_after_attaching_are_their_own_processes";
    // The shell forks split7030 only after sampler has attached to it.
    let script = format!("sleep 0.5; {} 1; true", target("split7030"));
    let shell = Command::new("sh").args(["-c", &script]).spawn().unwrap();
    let shell = Running(shell);
    let shell_pid = shell.pid();
    let (o, path) = attach(&["-p", &shell_pid, "-d", "10"]);
    // The shell, sleep and split7030, reaped by the shell: nearly all split7030's.
    let (_, cpu_ms) = children_cpu_ms(|| shell.wait());
    ok(test, &o);
    assert!(
        stderr(&o).contains("every attached process exited"),
        "{}",
        stderr(&o)
    );
    let p = load_checked(&path);
    let threads = thread_paths(&p);
    let child = threads
        .iter()
        .find(|t| t.name == "split7030")
        .expect("the forked program is in the profile");
    assert_ne!(child.pid, shell_pid, "it is a process of its own");
    let (n, share) = count_run(&child.paths, &["main", "outer", "hot_a"]);
    eprintln!("{test}: {n} samples ({share:.0}%) in the child's main > outer > hot_a");
    assert_covers_cpu(test, child.paths.len(), cpu_ms, 0.75);
    assert!(share >= 60.0, "{share:.0}% in hot_a");
}

fn main() {
    run_tests(tests![
        attach_records_a_running_program_and_leaves_it_running: Need::Perf;
        the_kernel_walker_has_the_tables_of_a_running_program_from_its_start: Need::Perf;
        threads_started_after_attaching_appear_with_their_names: Need::Perf;
        two_processes_at_once_are_two_processes: Need::Perf;
        process_that_exits_during_recording_ends_it: Need::Perf;
        mistakes_get_one_line_and_a_non_zero_exit;
        attaching_without_permission_says_what_to_do: Need::Nobody;
        attached_process_is_continued_when_sampler_fails_half_way: Need::Perf;
        attached_processes_are_continued_when_sampler_is_killed: Need::Perf;
        ctrl_c_stops_the_recording_not_the_processes: Need::Perf;
        ring_buffers_shrink_when_the_kernel_refuses_their_size: Need::Nobody, Need::UserPerf;
        child_processes_started_after_attaching_are_their_own_processes: Need::Perf;
    ]);
}
