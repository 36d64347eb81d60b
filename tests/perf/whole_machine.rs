//! End-to-end: the whole machine (`-a`), CPU lists (`-C`), the sampling event (`-e`,
//! `-c`), and short threads counted by per-CPU events. Each test records real programs
//! and asserts what they did: which processes ran when, on which CPU, how much CPU time
//! they used (from `getrusage`), how many pages they touched.

#[path = "../common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// The process names of the threads of a profile, with their sample counts.
fn processes(p: &Value) -> Vec<(String, String, usize)> {
    p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["processName"].as_str().unwrap_or("").to_string(),
                t["pid"].as_str().unwrap_or("").to_string(),
                t["samples"]["length"].as_u64().unwrap() as usize,
            )
        })
        .collect()
}

/// The threads of process `name` in a profile's paths.
fn of_process<'a>(threads: &'a [ThreadPaths], p: &Value, name: &str) -> Vec<&'a ThreadPaths> {
    let pids: Vec<String> = processes(p)
        .into_iter()
        .filter(|(n, _, _)| n == name)
        .map(|(_, pid, _)| pid)
        .collect();
    threads.iter().filter(|t| pids.contains(&t.pid)).collect()
}

fn all_cpus_sees_processes_that_start_and_exit_while_it_records() {
    let test = "all_cpus_sees_processes_that_start_and_exit_while_it_records";
    // Runs before the recording and is killed during it.
    let before = Running::start("busy", &["1", "30"]);
    let before_pid = before.pid();
    let recording = std::thread::spawn(|| record_without_command(&["-a", "-d", "3"]));
    // Starts after the recording began and exits before it ends.
    std::thread::sleep(Duration::from_millis(800));
    let ((status, split_pid), split_cpu_ms) = children_cpu_ms(|| {
        let mut child = Command::new(target("split7030"))
            .arg("0.6")
            .spawn()
            .expect("split7030 runs");
        (child.wait().unwrap(), child.id().to_string())
    });
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(300));
    drop(before);
    let (o, path) = recording.join().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("recorded for the -d duration"), "{err}");
    let p = load_checked(&path);
    let list = processes(&p);
    eprintln!(
        "{test}: {} threads: {:?}",
        list.len(),
        list.iter().map(|(n, _, s)| (n, s)).collect::<Vec<_>>()
    );
    // Threads that did not run are left out.
    assert!(list.iter().all(|(_, _, samples)| *samples > 0), "{list:?}");
    let threads = thread_paths(&p);
    // Its own split7030 (other work on the machine may run one too).
    let started: Vec<_> = of_process(&threads, &p, "split7030")
        .into_iter()
        .filter(|t| t.pid == split_pid)
        .collect();
    assert_eq!(started.len(), 1, "split7030 ({split_pid}): {list:?}");
    let (n, share) = count_run(&started[0].paths, &["main", "outer", "hot_a"]);
    eprintln!(
        "{test}: split7030 (started after): {n} samples in main > outer > hot_a ({share:.0}%)"
    );
    assert_covers_cpu(test, started[0].paths.len(), split_cpu_ms, 0.8);
    // 70% of its work; on a loaded machine it may get 150 ms of CPU, 150 samples, whose
    // share strays by 4 points for one standard deviation.
    assert!(
        share >= 55.0,
        "{share:.0}% in hot_a of split7030 (70% of its work)"
    );
    let killed: Vec<_> = threads.iter().filter(|t| t.pid == before_pid).collect();
    assert!(
        !killed.is_empty(),
        "busy ({before_pid}) is missing: {list:?}"
    );
    let (n, _) = count_run(
        &killed
            .iter()
            .flat_map(|t| t.paths.clone())
            .collect::<Vec<_>>(),
        &["busy_work"],
    );
    eprintln!("{test}: busy (running before, killed during): {n} samples in busy_work");
    // Described from /proc before the events opened: none of its samples, the first
    // milliseconds' included, is in code without a name.
    let unnamed: Vec<_> = killed
        .iter()
        .flat_map(|t| &t.paths)
        .filter(|p| p.iter().any(|f| f.starts_with("0x")))
        .collect();
    assert!(
        unnamed.is_empty(),
        "busy's stacks in unknown code: {unnamed:?}"
    );
    // sampler's own work is left out, and the summary says how much.
    assert!(
        list.iter().all(|(name, _, _)| name != "sampler"),
        "{list:?}"
    );
    assert!(
        err.contains("sampler's own ") && err.contains("left out of the profile"),
        "{err}"
    );
    assert!(
        n > 500,
        "{n} samples of busy_work in 1.1 s of one thread spinning"
    );
    assert!(
        list.iter()
            .any(|(name, _, _)| name.starts_with("[kernel] ")),
        "no kernel thread: {list:?}"
    );
}

/// `-a` with the kernel walker: a program without frame pointers that runs before the
/// recording starts (its tables from its mappings in /proc) and one started during it
/// (from its events) are both walked from `_start` to their leaves, in the kernel.
fn the_kernel_walker_walks_every_process_of_the_machine() {
    let test = "the_kernel_walker_walks_every_process_of_the_machine";
    let before = Running::start("nofp", &["4"]);
    let recording =
        std::thread::spawn(|| record_without_command(&["-a", "-d", "2", "--unwind", "kernel"]));
    std::thread::sleep(Duration::from_millis(500));
    let (during, during_cpu_ms) = children_cpu_ms(|| {
        let mut child = Command::new(target("nofp"))
            .arg("1")
            .spawn()
            .expect("nofp runs");
        assert!(child.wait().unwrap().success());
        child
    });
    let (o, path) = recording.join().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("user stacks are walked in the kernel (eBPF)"),
        "{err}"
    );
    let p = load_checked(&path);
    let threads = thread_paths(&p);
    let full = |path: &Vec<String>| {
        path.first().is_some_and(|f| f == "_start")
            && (has_run(path, &["main", "outer", "middle", "hot_a"])
                || has_run(path, &["main", "outer", "middle", "hot_b"]))
    };
    let mut theirs = 0;
    for (which, pid) in [
        ("running at the start", before.pid()),
        ("started during it", during.id().to_string()),
    ] {
        let paths: Vec<&Vec<String>> = threads
            .iter()
            .filter(|t| t.pid == pid)
            .flat_map(|t| &t.paths)
            .collect();
        let complete = paths.iter().filter(|p| full(p)).count();
        eprintln!(
            "{test}: nofp {which}: {complete} of {} samples complete",
            paths.len()
        );
        // The one started during the recording is sampled for all the CPU time it got;
        // the other's time outside the recording's 2 s is not known apart (both share
        // the CPUs with whatever else runs).
        match pid == before.pid() {
            true => assert!(paths.len() >= 100, "{which}: {} samples", paths.len()),
            false => assert_covers_cpu(which, paths.len(), during_cpu_ms, 0.75),
        }
        assert!(
            complete * 100 >= paths.len() * 95,
            "{which}: {complete} of {}",
            paths.len()
        );
        theirs += paths.len();
    }
    // Walked in the kernel: the walks that reached the outermost frame are at least
    // nofp's samples (other processes ran too).
    let outermost: usize = err
        .split("user stacks: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of kernel walks: {err}"));
    assert!(
        outermost * 100 >= theirs * 95,
        "{outermost} walks, nofp's samples {theirs}: {err}"
    );
}

fn cpu_list_records_only_those_cpus() {
    let test = "cpu_list_records_only_those_cpus";
    // split7030 runs on CPU 0, fploop on CPU 1, for the same time. The shell that runs
    // split7030 then writes its /proc/PID/stat, whose children's times are split7030's.
    let stat = tempdir().join("stat");
    let script = format!(
        "taskset -c 1 {} 1 >/dev/null & taskset -c 0 sh -c '{} 1; cat /proc/$$/stat' >{}; wait",
        target("fploop"),
        target("split7030"),
        stat.display()
    );
    let (o, path) = record(&["-C", "0"], &["sh", "-c", &script]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("recorded on CPU 0 only"), "{err}");
    let p = load_checked(&path);
    let threads = thread_paths(&p);
    // fploop's process ran `taskset` on CPU 0 for a moment before it moved to CPU 1:
    // its own code is what must have no sample.
    let in_function = |process: &str, function: &str| -> usize {
        of_process(&threads, &p, process)
            .iter()
            .flat_map(|t| &t.paths)
            .filter(|path| path.iter().any(|f| f == function))
            .count()
    };
    let (on_0, on_1) = (
        in_function("split7030", "outer"),
        in_function("fploop", "spin_in_loop"),
    );
    eprintln!("{test}: split7030 (CPU 0): {on_0} samples, fploop (CPU 1): {on_1}");
    let stat = std::fs::read_to_string(&stat).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // cutime and cstime, fields 16 and 17 of the line, in ticks of 10 ms.
    let ticks: u64 = fields[13].parse::<u64>().unwrap() + fields[14].parse::<u64>().unwrap();
    assert_covers_cpu(test, on_0, ticks as f64 * 10.0, 0.8);
    assert_eq!(on_1, 0, "samples from CPU 1: {:?}", processes(&p));

    // The same with -a: only CPU 0's tasks.
    let fploop = Command::new("taskset")
        .args(["-c", "1", &target("fploop"), "2"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let fploop = Running(fploop);
    let (o, path) = record_without_command(&["-a", "-C", "0", "-d", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = load_checked(&path);
    let pid = fploop.pid();
    let on_1 = thread_paths(&p)
        .iter()
        .filter(|t| t.pid == pid)
        .flat_map(|t| &t.paths)
        .filter(|path| path.iter().any(|f| f == "spin_in_loop"))
        .count();
    eprintln!("{test}: -a -C 0: fploop on CPU 1 has {on_1} samples");
    assert_eq!(on_1, 0);
}

/// The `the command used X ms of CPU (getrusage)` number of the summary.
fn rusage_ms(err: &str) -> f64 {
    let line = err
        .lines()
        .find(|l| l.contains("of CPU (getrusage)"))
        .unwrap_or_else(|| panic!("no getrusage line: {err}"));
    let after = line.split("the command used ").nth(1).unwrap();
    after.split(' ').next().unwrap().parse().unwrap()
}

fn short_threads_are_counted() {
    let test = "short_threads_are_counted";
    // churn's threads each run about 0.2 ms: less than one 1 ms period.
    let (o, path) = record(&[], &[&target("churn"), "2"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("per-task sampling"), "{err}");
    let used = rusage_ms(&err);
    let p = load_checked(&path);
    let samples = sample_count(&p) as f64;
    // Each sample stands for the period (1,005,025 ns at -F 1000: off-step).
    let interval_ms = p["meta"]["interval"].as_f64().unwrap();
    let ratio = samples * interval_ms / used;
    eprintln!("{test}: {samples} samples of {interval_ms} ms for {used} ms of CPU: {ratio:.3}");
    assert!(
        (0.9..=1.1).contains(&ratio),
        "{samples} samples for {used} ms of CPU"
    );
}

fn unprivileged_recording_says_short_threads_may_be_missed() {
    let test = "unprivileged_recording_says_short_threads_may_be_missed";
    let Some((o, path)) = record_as_nobody(test, &["--", &target("churn"), "1"]) else {
        return;
    };
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let line = err.lines().find(|l| l.contains("per-task sampling"));
    eprintln!("{test}: {}", line.unwrap_or("no line"));
    assert!(
        line.is_some_and(|l| l.contains("less than one sampling period (1.0 ms)")),
        "{err}"
    );
    let used = rusage_ms(&err);
    let samples = sample_count(&load_checked(&path)) as f64;
    eprintln!("{test}: per task, {samples} samples for {used} ms of CPU");
}

/// The samples (or event counts, when weighted) in `function` across the profile.
fn weight_in(p: &Value, function: &str) -> f64 {
    let mut total = 0.0;
    for t in p["threads"].as_array().unwrap() {
        let weights = t["samples"]["weight"].as_array();
        let paths = thread_paths_of(p, t);
        for (i, path) in paths.iter().enumerate() {
            if path.iter().any(|f| f == function) {
                total += weights.map_or(1.0, |w| w[i].as_f64().unwrap());
            }
        }
    }
    total
}

/// The frame names of each sample of thread `t` (root first).
fn thread_paths_of(p: &Value, t: &Value) -> Vec<Vec<String>> {
    let tid = t["tid"].as_i64().unwrap();
    thread_paths(p)
        .into_iter()
        .find(|x| x.tid == tid)
        .map(|x| x.paths)
        .unwrap_or_default()
}

fn page_faults_count_the_pages_touched() {
    let test = "page_faults_count_the_pages_touched";
    let pages = 5000.0;
    // Period 1: every fault a sample (frame-pointer stacks keep them small enough for
    // the ring to hold all 5,000).
    let (o, path) = record(
        &[
            "-e",
            "page-faults",
            "-c",
            "1",
            "--unwind",
            "fp",
            "-m",
            "2048",
        ],
        &[&target("pages"), "5000"],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("(page-faults, every 1), 0 lost"), "{err}");
    let p = load_checked(&path);
    let n = weight_in(&p, "touch_pages");
    eprintln!("{test}: -c 1: {n} page faults in touch_pages for {pages} pages");
    assert!((n - pages).abs() <= pages * 0.01, "{n}");
    let meta = &p["meta"]["extra"];
    assert!(meta.to_string().contains("page-faults"), "{meta}");

    // At a frequency, each sample weighs its period: the weights still count faults.
    // The kernel sets the period from the rate it saw over the last tick, so a program
    // that faults for a few milliseconds gets a handful of samples with overshooting
    // weights (5,000 pages: 2 to 15 samples weighing 1.02 to 1.87 times the faults).
    // 100,000 pages (400 MB, about a fifth of a second) give it time to settle: 186 to
    // 263 samples weighing 1.001 to 1.005 times the pages, the program's start included.
    let pages = 100_000.0;
    let (o, path) = record(&["-e", "page-faults"], &[&target("pages"), "100000"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = load_checked(&path);
    let total: f64 = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| match t["samples"]["weight"].as_array() {
            Some(w) => w.iter().map(|w| w.as_f64().unwrap()).sum(),
            None => t["samples"]["length"].as_f64().unwrap(),
        })
        .sum();
    let n = weight_in(&p, "touch_pages");
    let samples = sample_count(&p);
    eprintln!(
        "{test}: -F 1000: {samples} samples weighing {total} page faults, {n} in touch_pages"
    );
    assert!(
        total >= pages * 0.95 && total <= pages * 1.05,
        "{total} faults in all for {pages} pages"
    );
    assert!(n >= pages * 0.9, "{n}");
    assert!(
        samples < 2000,
        "{samples} samples: the period should have grown"
    );
}

fn unknown_and_missing_events_are_refused_in_one_line() {
    let test = "unknown_and_missing_events_are_refused_in_one_line";
    let (o, path) = record(&["-e", "bogus"], &["true"]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("-e bogus: unknown event"), "{err}");
    assert!(!Path::new(&path).exists());
    // Hardware events need a PMU: a clear line where there is none.
    let (o, _) = record(&["-e", "instructions"], &["true"]);
    let err = stderr(&o);
    let pmu = Path::new("/sys/bus/event_source/devices/cpu/events/instructions").exists();
    eprintln!("{test}: -e instructions with a PMU: {pmu}: {}", err.trim());
    if !pmu {
        assert!(!o.status.success());
        assert!(err.contains("no hardware performance counters"), "{err}");
        assert!(err.contains("-e cpu-clock"), "{err}");
    } else {
        assert!(o.status.success(), "{err}");
    }
    let (o, _) = record(&["-e", "page-faults", "--off-cpu"], &["true"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--off-cpu weighs waiting in time"));
}

fn main() {
    run_tests(tests![
        all_cpus_sees_processes_that_start_and_exit_while_it_records: Need::Root, Need::Perf,
            Need::KernelFrames;
        the_kernel_walker_walks_every_process_of_the_machine: Need::Root, Need::Perf;
        cpu_list_records_only_those_cpus: Need::Root, Need::Perf, Need::Cpus(2),
            Need::Program("taskset", &["-c", "0", "true"]);
        short_threads_are_counted: Need::Root, Need::Perf;
        unprivileged_recording_says_short_threads_may_be_missed: Need::Nobody, Need::UserPerf;
        page_faults_count_the_pages_touched: Need::Perf;
        unknown_and_missing_events_are_refused_in_one_line: Need::Perf;
    ]);
}
