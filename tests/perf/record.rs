//! End-to-end: `sampler record` on the bench targets, for real, and the facts their call
//! trees must show. Each test is skipped (visibly) where perf recording is not permitted.

#[path = "../common/mod.rs"]
mod common;

use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn ok(test: &str, o: &std::process::Output) {
    assert!(o.status.success(), "{test}: sampler failed: {}", stderr(o));
}

fn split_70_30_under_main_and_outer() {
    let (o, path) = record(&["-F", "1000"], &[&target("split7030"), "2"]);
    ok("split7030", &o);
    let p = load(&path);
    check_processed_profile(&p);
    let threads = thread_paths(&p);
    assert_eq!(threads.len(), 1);
    let paths = &threads[0].paths;
    // 1000 Hz of CPU time for 2 s is ~2000 samples when the target has a CPU to itself;
    // tests run in parallel on two cores, so only a floor is asserted.
    assert!(
        paths.len() > 500,
        "expected up to ~2000 samples at 1000 Hz for 2 s, got {}",
        paths.len()
    );
    let (a, _) = count_run(paths, &["main", "outer", "hot_a"]);
    let (b, _) = count_run(paths, &["main", "outer", "hot_b"]);
    let share = 100.0 * a as f64 / (a + b) as f64;
    eprintln!(
        "split7030: hot_a {a}, hot_b {b}, hot_a share {share:.1}% of {} samples",
        paths.len()
    );
    assert!(
        (65.0..=75.0).contains(&share),
        "hot_a share {share:.1}% not within 70 ± 5"
    );
    // The frameless leaves must not lose their caller: nearly every sample is under outer.
    let (under_outer, _) = count_run(paths, &["main", "outer"]);
    assert!(
        under_outer * 100 >= paths.len() * 95,
        "only {under_outer} of {} samples under main > outer",
        paths.len()
    );
    let summary = stderr(&o);
    assert!(
        summary.contains("cpu-clock") || summary.contains("cycles"),
        "{summary}"
    );
    for word in [
        "samples",
        "lost",
        "threads",
        "processes",
        path.to_str().unwrap(),
    ] {
        assert!(summary.contains(word), "summary lacks {word:?}: {summary}");
    }
}

fn inlined_helpers_are_frames_with_inline_depth() {
    let (o, path) = record(&[], &[&target("inline3"), "1"]);
    ok("inline3", &o);
    let p = load(&path);
    check_processed_profile(&p);
    let paths = &thread_paths(&p)[0].paths;
    let chain = ["main", "work", "level1", "level2", "level3"];
    let (inlined, _) = count_run(paths, &chain);
    assert!(
        inlined * 10 >= paths.len() * 9,
        "{inlined} of {} samples have {chain:?}",
        paths.len()
    );

    // In the frame table, level1..3 are inline depths 1..3 whose native symbol is `work`.
    let shared = &p["shared"];
    let strings = shared["stringArray"].as_array().unwrap();
    let name = |i: &serde_json::Value| {
        strings[i.as_u64().unwrap() as usize]
            .as_str()
            .unwrap()
            .to_string()
    };
    let ft = &shared["frameTable"];
    let func_names: Vec<String> = shared["funcTable"]["name"]
        .as_array()
        .unwrap()
        .iter()
        .map(name)
        .collect();
    let sym_names: Vec<String> = shared["nativeSymbols"]["name"]
        .as_array()
        .unwrap()
        .iter()
        .map(name)
        .collect();
    for (want, depth) in [("level1", 1), ("level2", 2), ("level3", 3), ("work", 0)] {
        let frames: Vec<usize> = (0..ft["length"].as_u64().unwrap() as usize)
            .filter(|&i| func_names[ft["func"][i].as_u64().unwrap() as usize] == want)
            .collect();
        assert!(!frames.is_empty(), "no frame for {want}");
        for f in frames {
            assert_eq!(
                ft["inlineDepth"][f], depth,
                "{want} frame {f} has the wrong inline depth"
            );
            let sym = ft["nativeSymbol"][f]
                .as_u64()
                .expect("inline frame has a native symbol") as usize;
            assert_eq!(sym_names[sym], "work");
            assert!(ft["line"][f].as_u64().is_some(), "{want} frame has no line");
        }
    }
}

fn every_named_thread_is_present() {
    let (o, path) = record(&[], &[&target("threads"), "2"]);
    ok("threads", &o);
    let p = load(&path);
    check_processed_profile(&p);
    let threads = thread_paths(&p);
    let main = threads
        .iter()
        .find(|t| t.name == "threads")
        .expect("main thread named after the program");
    for (name, func) in NAMED_THREADS {
        let t = thread_named(&threads, name);
        assert_eq!(t.pid, main.pid, "{name} in another process");
        assert_ne!(t.tid.to_string(), t.pid);
        assert!(
            t.paths.len() > 100,
            "{name} has only {} samples",
            t.paths.len()
        );
        let (own, pct) = count_run(&t.paths, &[func]);
        assert!(
            pct >= 90.0,
            "{name}: {own} of {} samples in {func}",
            t.paths.len()
        );
    }
}

fn forked_child_is_its_own_process_and_exit_code_passes_through() {
    let (o, path) = record(&[], &[&target("forker"), "1"]);
    assert_eq!(
        o.status.code(),
        Some(7),
        "forker exits 3 + 4: {}",
        stderr(&o)
    );
    let p = load(&path);
    check_processed_profile(&p);
    let threads = thread_paths(&p);
    let with = |f: &str| {
        threads
            .iter()
            .find(|t| t.paths.iter().filter(|p| p.iter().any(|x| x == f)).count() > 50)
            .unwrap_or_else(|| panic!("no thread with samples in {f}"))
    };
    let (parent, child) = (with("parent_work"), with("child_work"));
    assert_ne!(parent.pid, child.pid, "the child must be its own process");
    assert!(child
        .paths
        .iter()
        .all(|p| !p.iter().any(|f| f == "parent_work")));
    assert!(stderr(&o).contains("2 processes"), "{}", stderr(&o));
}

/// As root the recorder raises its own priority (nice -10) so that busy targets do not
/// starve it; the command must not inherit that: it runs at the nice value sampler was
/// started with, here 3.
fn the_command_runs_at_the_nice_value_sampler_was_started_with() {
    let test = "the_command_runs_at_the_nice_value_sampler_was_started_with";
    let dir = tempdir();
    let seen = dir.join("nice");
    let o = Command::new("nice")
        .args(["-n", "3"])
        .arg(sampler_bin())
        .args(["record", "-o"])
        .arg(dir.join("p.json.gz"))
        .args(["--", "sh", "-c"])
        .arg(format!(
            "cut -d' ' -f19 /proc/self/stat > {}",
            seen.display()
        ))
        .output()
        .unwrap();
    ok(test, &o);
    let nice = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(nice.trim(), "3", "{test}: the command's nice value");
}

fn a_reused_pid_is_a_new_process_with_its_own_track() {
    let test = "a_reused_pid_is_a_new_process_with_its_own_track";
    // In a pid namespace of its own, ns_last_pid picks the next pid: split7030 and then
    // busy both run as pid 100, one after the other.
    let out = tempdir().join("reused.json");
    let script = format!(
        "echo 99 > /proc/sys/kernel/ns_last_pid; {split} 0.3; \
         echo 99 > /proc/sys/kernel/ns_last_pid; {busy} 1 0.3; exit 0",
        split = target("split7030"),
        busy = target("busy"),
    );
    let o = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            sampler_bin(),
            "record",
            "-o",
        ])
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    ok(test, &o);
    let p = load(&out);
    check_processed_profile(&p);
    let threads = thread_paths(&p);
    // The thread (its index) that most samples in `function` are in.
    let with = |function: &str| {
        (0..threads.len())
            .max_by_key(|&i| {
                let paths = &threads[i].paths;
                paths
                    .iter()
                    .filter(|p| p.iter().any(|f| f == function))
                    .count()
            })
            .unwrap()
    };
    let (split, busy) = (with("hot_a"), with("busy_work"));
    let seen = |i: usize| {
        (
            threads[i].pid.clone(),
            p["threads"][i]["processName"].as_str().unwrap().to_string(),
        )
    };
    eprintln!(
        "{test}: hot_a in {:?}, busy_work in {:?}",
        seen(split),
        seen(busy)
    );
    assert_eq!(seen(split), ("100".to_string(), "split7030".to_string()));
    assert_eq!(seen(busy), ("100.2".to_string(), "busy".to_string()));
    for (i, other) in [(split, "busy_work"), (busy, "hot_a")] {
        assert!(
            threads[i]
                .paths
                .iter()
                .all(|p| !p.iter().any(|f| f == other)),
            "{other} in the thread of {:?}",
            seen(i)
        );
    }
}

fn exit_codes_and_signals_pass_through() {
    let (o, path) = record(&[], &["sh", "-c", "exit 42"]);
    assert_eq!(o.status.code(), Some(42));
    // The command line comes back word for word, the one with a space included, from the
    // file and from a copy that `convert` wrote.
    let p = load(&path);
    assert_eq!(p["meta"]["arguments"], "sh -c 'exit 42'");
    let again = path.with_file_name("again.json");
    let c = Command::new(sampler_bin())
        .arg("convert")
        .arg(&path)
        .arg("-o")
        .arg(&again)
        .output()
        .unwrap();
    assert!(c.status.success(), "{}", stderr(&c));
    let words = sampler::emit::load::read_profile(&again)
        .unwrap()
        .meta
        .command;
    assert_eq!(words, ["sh", "-c", "exit 42"]);
    ffp_check(&path);
    let (o, path) = record(&[], &["sh", "-c", "kill -KILL $$"]);
    assert_eq!(o.status.code(), Some(128 + 9), "{}", stderr(&o));
    check_processed_profile(&load(&path));
}

/// Sends `signal` to a running `sampler record` and checks that the command died of it
/// and that the profile of what was recorded was written.
fn signal_to_sampler_is_forwarded(signal: nix::sys::signal::Signal) {
    let out = tempdir().join("signalled.json");
    let started = Instant::now();
    let child = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&out)
        .args(["--", &target("split7030"), "30"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A second of recording, counted from the command's start (a loaded machine can take
    // longer than that to start sampler: a signal before it is ready would be the
    // default action's).
    wait_for_child(child.id(), "split7030", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1000));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "sampler did not stop the command"
    );
    assert_eq!(
        o.status.code(),
        Some(128 + signal as i32),
        "the command dies of the forwarded signal: {}",
        stderr(&o)
    );
    let n = sample_count(&load_checked(&out));
    assert_covers_cpu("signalled", n, command_cpu_ms(&o), 0.8);
}

fn sigterm_to_sampler_is_forwarded_and_profile_written() {
    signal_to_sampler_is_forwarded(nix::sys::signal::Signal::SIGTERM);
}

fn sigint_to_sampler_is_forwarded_and_profile_written() {
    signal_to_sampler_is_forwarded(nix::sys::signal::Signal::SIGINT);
}

fn exec_of_another_program_in_a_child_is_followed() {
    let script = format!("{} 1; exit 5", target("split7030"));
    let (o, path) = record(&[], &["sh", "-c", &script]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    let p = load(&path);
    check_processed_profile(&p);
    let threads = thread_paths(&p);
    let shell = threads
        .iter()
        .find(|t| t.name == "sh")
        .expect("the shell is recorded");
    let bench = threads
        .iter()
        .find(|t| t.name == "split7030")
        .expect("the exec'd program is recorded under its name");
    assert_ne!(shell.pid, bench.pid);
    let (hot, pct) = count_run(&bench.paths, &["main", "outer", "hot_a"]);
    assert!(
        pct >= 60.0,
        "{hot} of {} samples in main > outer > hot_a; the commonest stacks:\n{}",
        bench.paths.len(),
        commonest_paths(&bench.paths, 8)
    );
}

fn lost_samples_are_counted_and_reported() {
    // Eight 4 KiB data pages per CPU, the fewest that hold a hybrid sample (16 KiB of
    // stack copied with each), at 20 kHz cannot keep up with three busy threads. (In
    // kernel mode most samples go through the walker's own ring, without a copy.)
    let (o, path) = record(
        &["--unwind", "hybrid", "-m", "8", "-F", "20000"],
        &[&target("threads"), "1"],
    );
    ok("lost", &o);
    let text = stderr(&o);
    let lost: u64 = text
        .split(" lost,")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no lost count in the summary: {text}"));
    assert!(
        lost > 0,
        "expected lost samples with a one-page buffer: {text}"
    );
    let p = load_checked(&path);
    let entries = p["meta"]["extra"][0]["entries"].as_array().unwrap();
    let in_profile = entries
        .iter()
        .find(|e| e["label"] == "Lost samples")
        .unwrap();
    assert_eq!(in_profile["value"], lost);
    // Per thread: the threads that were running lost them, and the counts add up.
    let extra = p["meta"]["extra"].as_array().unwrap();
    let by_thread = extra
        .iter()
        .find(|e| e["label"] == "Lost samples by thread")
        .unwrap()["entries"]
        .as_array()
        .unwrap();
    let sum: u64 = by_thread.iter().map(|e| e["value"].as_u64().unwrap()).sum();
    // Labels are "name (tid)". A worker's name can itself be among the lost records, so
    // workers are told from the main thread by tid.
    let main_tid = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["isMainThread"] == true)
        .unwrap()["tid"]
        .to_string();
    let workers = by_thread
        .iter()
        .filter(|e| {
            !e["label"]
                .as_str()
                .unwrap()
                .ends_with(&format!("({main_tid})"))
        })
        .count();
    eprintln!("lost: {lost} in all, {sum} attributed to threads, {workers} workers lost some");
    assert_eq!(sum, lost, "every lost sample is attributed to a thread");
    assert!(workers >= 2, "the busy workers lost samples: {by_thread:?}");
    assert!(text.contains("lost samples by thread: "), "{text}");
}

fn output_belongs_to_the_sudo_user() {
    let dir = tempdir();
    // Under sudo the output goes only where the user could have written it.
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let out = dir.join("owned.json.gz");
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&out)
        .args(["--", "true"])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .output()
        .unwrap();
    ok("sudo", &o);
    let meta = std::fs::metadata(&out).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "a .gz name gives a gzip file");
    check_processed_profile(&load(&out));
}

fn frequency_above_the_kernel_limit_is_lowered_with_a_warning() {
    let (o, _) = record(&["-F", "100000000"], &["true"]);
    ok("high -F", &o);
    assert!(
        stderr(&o).contains("perf_event_max_sample_rate"),
        "{}",
        stderr(&o)
    );
}

fn kernel_frames_are_named_and_categorised() {
    let (o, path) = record(
        &[],
        &[
            "dd",
            "if=/dev/zero",
            "of=/dev/null",
            "bs=64k",
            "count=100000",
        ],
    );
    ok("dd", &o);
    assert!(
        !stderr(&o).contains("kernel frames not permitted"),
        "the probe had kernel frames: {}",
        stderr(&o)
    );
    let p = load(&path);
    check_processed_profile(&p);
    let shared = &p["shared"];
    let ft = &shared["frameTable"];
    let libs = p["libs"].as_array().unwrap();
    let kernel_lib = libs
        .iter()
        .position(|l| l["name"] == "[kernel.kallsyms]")
        .expect("kernel lib present") as i64;
    let strings = shared["stringArray"].as_array().unwrap();
    let mut named = 0;
    for i in 0..ft["length"].as_u64().unwrap() as usize {
        if ft["lib"][i] == kernel_lib {
            assert_eq!(
                ft["category"][i], 2,
                "kernel frames are in the Kernel category"
            );
            let func = ft["func"][i].as_u64().unwrap() as usize;
            let name = strings[shared["funcTable"]["name"][func].as_u64().unwrap() as usize]
                .as_str()
                .unwrap();
            assert!(
                name.starts_with("[kernel] "),
                "kernel frames are named `[kernel] name`, not {name}"
            );
            if !name.starts_with("[kernel] 0x") {
                named += 1;
            }
        }
    }
    assert!(named > 3, "only {named} named kernel frames");
}

fn user_mistakes_get_one_line_and_non_zero_exit() {
    let o = Command::new(sampler_bin())
        .args(["record", "--bogus", "x"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).lines().next().unwrap().contains("--bogus"));

    let o = Command::new(sampler_bin())
        .args(["record"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "a command is required");

    let (o, _) = record(&[], &["/nonexistent/program"]);
    assert!(!o.status.success());
    let text = stderr(&o);
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(errors[0].contains("/nonexistent/program"), "{}", errors[0]);
}

fn unprivileged_user_records_without_kernel_frames_or_is_told_why() {
    let test = "unprivileged_user_records_without_kernel_frames_or_is_told_why";
    let Some((o, out)) = record_as_nobody(test, &["--", &target("split7030"), "1"]) else {
        return;
    };
    let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    if paranoid > 2 {
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains("perf_event_paranoid"), "{}", stderr(&o));
        return;
    }
    ok("nobody", &o);
    let p = load(&out);
    check_processed_profile(&p);
    if paranoid == 2 {
        // Only user space of one's own processes may be sampled.
        assert!(
            stderr(&o).contains("kernel frames not permitted"),
            "{}",
            stderr(&o)
        );
        assert!(p["libs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["name"] != "[kernel.kallsyms]"));
    }
    let (hot, _) = count_run(&thread_paths(&p)[0].paths, &["main", "outer", "hot_a"]);
    // The target runs 1 s; other tests may share the CPUs, so only a floor is asserted.
    assert!(hot > 100, "only {hot} samples in hot_a");
}

/// Where tracefs is not mounted, sampler reads the `exit_group` tracepoint's id (which
/// the teardown samples' user stacks need) in a mount namespace of its own: the same id
/// as the mounted tracefs gives, and no mount left on the machine.
fn a_tracepoint_id_is_read_without_mounting_anything_here() {
    let mounts = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(" - tracefs "))
            .count()
    };
    let before = mounts();
    let o = Command::new(sampler_bin())
        .args(["tracepoint-id", "syscalls/sys_enter_exit_group"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let id: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    assert_eq!(mounts(), before, "a tracefs mount was left behind");
    match std::fs::read_to_string("/sys/kernel/tracing/events/syscalls/sys_enter_exit_group/id") {
        Ok(mounted) => assert_eq!(id, mounted.trim().parse::<u64>().unwrap()),
        Err(_) => eprintln!("tracefs is not mounted here: id {id} read in a namespace of its own"),
    }
    // A name that is not a tracepoint's: one line, a failure, nothing read.
    let o = Command::new(sampler_bin())
        .args(["tracepoint-id", "../../../etc/passwd"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
}

fn main() {
    run_tests(tests![
        split_70_30_under_main_and_outer: Need::Perf;
        inlined_helpers_are_frames_with_inline_depth: Need::Perf;
        every_named_thread_is_present: Need::Perf;
        forked_child_is_its_own_process_and_exit_code_passes_through: Need::Perf;
        the_command_runs_at_the_nice_value_sampler_was_started_with: Need::Perf, Need::Root;
        a_reused_pid_is_a_new_process_with_its_own_track: Need::Perf, Need::Root,
            Need::Program("unshare", &["--version"]);
        exit_codes_and_signals_pass_through: Need::Perf;
        sigterm_to_sampler_is_forwarded_and_profile_written: Need::Perf;
        sigint_to_sampler_is_forwarded_and_profile_written: Need::Perf;
        exec_of_another_program_in_a_child_is_followed: Need::Perf;
        lost_samples_are_counted_and_reported: Need::Perf;
        output_belongs_to_the_sudo_user: Need::Perf, Need::Root;
        frequency_above_the_kernel_limit_is_lowered_with_a_warning: Need::Perf;
        kernel_frames_are_named_and_categorised: Need::Perf, Need::KernelFrames;
        user_mistakes_get_one_line_and_non_zero_exit: Need::Perf;
        unprivileged_user_records_without_kernel_frames_or_is_told_why: Need::Nobody;
        a_tracepoint_id_is_read_without_mounting_anything_here: Need::Root;
    ]);
}
