//! End-to-end: continuous recording (`record -p PID --every SECONDS`). Windows are
//! written as they close, each a whole profile of its own stretch of time; a stop signal
//! ends the last one early; windows wait in the spool while the back end is down and are
//! sent in order once it answers, by the same run or the next; a full spool drops the
//! oldest and says how many. The target is split7030 (main > outer > hot_a 70%, hot_b
//! 30%), attached to while it runs.

#[path = "../common/mod.rs"]
mod common;

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use prost::Message;
use sampler::emit::pprof::PprofProfile;

/// Starts `sampler record -p PID --every ... <args>`, its stderr piped.
fn start(pid: &str, args: &[&str]) -> Child {
    Command::new(sampler_bin())
        .args(["record", "-p", pid])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sampler starts")
}

/// Waits up to `seconds` for sampler to end (killing it then, and failing); its output.
fn finish(mut child: Child, seconds: u64) -> Output {
    let ended = wait_with_timeout(&mut child, Duration::from_secs(seconds));
    if ended.is_none() {
        let _ = child.kill();
    }
    let o = child.wait_with_output().unwrap();
    assert!(
        ended.is_some(),
        "sampler did not end within {seconds} s: {}",
        stderr(&o)
    );
    o
}

/// The files of `dir`, by name.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// The `window N: ...` lines of sampler's stderr, and for each the new addresses named.
fn window_lines(o: &Output) -> Vec<(String, usize)> {
    stderr(o)
        .lines()
        .filter(|l| l.starts_with("sampler: window "))
        .map(|l| {
            let named = l
                .split("; ")
                .find_map(|part| part.split_once(" new addresses named"))
                .and_then(|(n, _)| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("no count of new addresses in {l:?}"));
            (l.to_string(), named)
        })
        .collect()
}

/// The distinct (library name, address) pairs of the frames of profile `p`: the
/// addresses it names.
fn distinct_addresses(p: &serde_json::Value) -> std::collections::HashSet<(String, i64)> {
    let frames = &p["shared"]["frameTable"];
    let (addresses, libs) = (
        frames["address"].as_array().unwrap(),
        frames["lib"].as_array().unwrap(),
    );
    let lib_name = |l: &serde_json::Value| match l.as_u64() {
        Some(l) => p["libs"][l as usize]["name"].as_str().unwrap().to_string(),
        None => String::new(),
    };
    addresses
        .iter()
        .zip(libs)
        .filter_map(|(a, l)| Some((lib_name(l), a.as_i64().filter(|&a| a >= 0)?)))
        .collect()
}

fn windows_are_written_as_they_close_each_a_profile_of_its_own_time() {
    let test = "windows_are_written_as_they_close_each_a_profile_of_its_own_time";
    let target = Running::start("split7030", &["10"]);
    let dir = tempdir();
    let out = format!("{}/", dir.display());
    let cpu_before = process_cpu_ms(&target.pid());
    let started = Instant::now();
    let mut child = start(
        &target.pid(),
        &["--every", "1", "-d", "3.5", "-F", "1000", "-o", &out],
    );
    // The first window's file is there while the recording goes on.
    while files_in(&dir).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "no window written within 3 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let first_at = started.elapsed();
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first window was written only once sampler had ended"
    );
    let o = finish(child, 60);
    let cpu_ms = process_cpu_ms(&target.pid()) - cpu_before;
    assert!(o.status.success(), "{test}: {}", stderr(&o));
    let files = files_in(&dir);
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names.len(),
        4,
        "3 windows of 1 s and the last 0.5 s: {names:?}"
    );
    for (i, name) in names.iter().enumerate() {
        assert!(
            name.starts_with(&format!("window-{:06}-", i + 1)) && name.ends_with("Z.json.gz"),
            "{name}"
        );
    }
    let mut total = 0;
    let mut starts = Vec::new();
    let (mut a, mut b) = (0, 0);
    // Each window's distinct (library, address) pairs: what it names without memory.
    let mut held = Vec::new();
    for file in &files {
        ffp_check(file);
        let p = load_checked(file);
        starts.push(p["meta"]["startTime"].as_f64().unwrap());
        held.push(distinct_addresses(&p));
        let threads = thread_paths(&p);
        assert_eq!(threads.len(), 1, "{}", file.display());
        assert_eq!(threads[0].name, "split7030");
        let paths = &threads[0].paths;
        let (wa, _) = count_run(paths, &["main", "outer", "hot_a"]);
        let (wb, _) = count_run(paths, &["main", "outer", "hot_b"]);
        assert!(
            wa > 0 && wb > 0,
            "{}: hot_a {wa}, hot_b {wb}",
            file.display()
        );
        // Every sample of a window lies within it.
        let times = sample_times_ms(&p);
        let limit = if file == files.last().unwrap() {
            600.0
        } else {
            1000.0
        };
        assert!(
            times.iter().all(|&t| (0.0..=limit).contains(&t)),
            "{}: times outside 0..{limit} ms: {:?}",
            file.display(),
            times
                .iter()
                .filter(|&&t| !(0.0..=limit).contains(&t))
                .collect::<Vec<_>>()
        );
        total += paths.len();
        a += wa;
        b += wb;
    }
    // Windows follow each other without gap or overlap.
    for pair in starts.windows(2) {
        assert!(
            (pair[1] - pair[0] - 1000.0).abs() < 1.0,
            "window starts {starts:?}"
        );
    }
    let share = 100.0 * a as f64 / (a + b) as f64;
    assert!((60.0..80.0).contains(&share), "hot_a share {share:.1}%");
    // Together they hold the CPU time the target got (attaching and the last window's
    // end are within the 25% allowed).
    assert_covers_cpu(test, total, cpu_ms, 0.75);
    // Later windows name what the first named from memory.
    let lines = window_lines(&o);
    assert_eq!(lines.len(), 4, "{}", stderr(&o));
    eprintln!(
        "{test}: first window written {:.2} s after the start; new addresses per window {:?}, addresses each holds {:?}",
        first_at.as_secs_f64(),
        lines.iter().map(|l| l.1).collect::<Vec<_>>(),
        held.iter().map(|h| h.len()).collect::<Vec<_>>()
    );
    assert!(lines[0].1 > 0);
    // Without the memory, each later window would name again every address it holds.
    // With it, it names only addresses not seen before: an instruction of the loop first
    // sampled now, and on a busy machine the kernel's functions of the preemptions that
    // land in a window (measured under two spinning threads: [8, 5, 0, 9] and
    // [13, 6, 2, 3]; idle: [14, 0, 0, 0]); the loop's frames (main, outer, hot_a, hot_b
    // and the entry point's) are in every window and named once.
    let mut seen = held[0].clone();
    let (mut new, mut again) = (0, 0);
    for (k, addresses) in held.iter().enumerate().skip(1) {
        let fresh = addresses.difference(&seen).count();
        assert!(
            lines[k].1 <= fresh,
            "window {}: named {} addresses, {fresh} of the {} it holds are new: {lines:?}",
            k + 1,
            lines[k].1,
            addresses.len()
        );
        (new, again) = (new + fresh, again + addresses.len());
        seen.extend(addresses.iter().cloned());
    }
    assert!(
        new < again,
        "the loop's addresses recur: {new} new of {again}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The times of every sample of a profile's threads (ms since its start).
fn sample_times_ms(p: &serde_json::Value) -> Vec<f64> {
    let mut times = Vec::new();
    for t in p["threads"].as_array().unwrap() {
        let samples = &t["samples"];
        let column = samples["time"].as_array().cloned().unwrap_or_else(|| {
            // timeDeltas: each time the sum of the deltas so far.
            let mut at = 0.0;
            samples["timeDeltas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    at += d.as_f64().unwrap();
                    serde_json::json!(at)
                })
                .collect()
        });
        times.extend(column.iter().map(|v| v.as_f64().unwrap()));
    }
    times
}

fn a_stop_signal_ends_the_last_window_early_and_it_is_written() {
    let test = "a_stop_signal_ends_the_last_window_early_and_it_is_written";
    let target = Running::start("split7030", &["10"]);
    let dir = tempdir();
    let out = format!("{}/", dir.display());
    let child = start(&target.pid(), &["--every", "30", "-F", "1000", "-o", &out]);
    std::thread::sleep(Duration::from_millis(1500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let stopped = Instant::now();
    let o = finish(child, 30);
    assert!(o.status.success(), "{test}: {}", stderr(&o));
    let files = files_in(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let p = load_checked(&files[0]);
    ffp_check(&files[0]);
    let paths = &thread_paths(&p)[0].paths;
    let (a, _) = count_run(paths, &["main", "outer", "hot_a"]);
    let times = sample_times_ms(&p);
    let last = times.iter().cloned().fold(0.0, f64::max);
    eprintln!(
        "{test}: ended {:.2} s after SIGTERM; one window of {} samples, the last at {last:.0} ms",
        stopped.elapsed().as_secs_f64(),
        paths.len()
    );
    assert!(a > 0);
    assert!((800.0..3000.0).contains(&last), "last sample at {last} ms");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A server taking pprof pushes on `listener` until `stop`: each body's profile, in the
/// order received.
fn pprof_server(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<PprofProfile>> {
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let mut got = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).unwrap();
                    let request = answer_request(stream, "200 OK");
                    let mut raw = Vec::new();
                    flate2::read::GzDecoder::new(&request.body[..])
                        .read_to_end(&mut raw)
                        .expect("gzipped");
                    got.push(PprofProfile::decode(&raw[..]).expect("a pprof profile"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        got
    })
}

/// The (windows, sent, waiting, dropped) of sampler's last line.
fn tally(o: &Output) -> (u64, u64, u64, u64) {
    let err = stderr(o);
    let line = err
        .lines()
        .find(|l| l.contains(" windows: ") && l.contains(" written, "))
        .unwrap_or_else(|| panic!("no last line: {err}"));
    let number = |after: &str| -> u64 {
        let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
        let i = words.iter().position(|w| *w == after).unwrap();
        words[i - 1].parse().unwrap()
    };
    let windows = line["sampler: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    (
        windows,
        number("sent"),
        number("waiting"),
        number("dropped"),
    )
}

fn windows_wait_in_the_spool_while_the_back_end_is_down_and_are_sent_in_order() {
    let test = "windows_wait_in_the_spool_while_the_back_end_is_down_and_are_sent_in_order";
    let target = Running::start("split7030", &["12"]);
    let spool = tempdir();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/ingest?name=split7030&format=pprof");
    let child = start(
        &target.pid(),
        &[
            "--every",
            "1",
            "-d",
            "5.5",
            "-F",
            "200",
            "--push",
            &url,
            "--spool",
            spool.to_str().unwrap(),
        ],
    );
    // The back end is down for the first windows, then comes up.
    std::thread::sleep(Duration::from_millis(2700));
    let waiting_then = files_in(&spool).len();
    let stop = Arc::new(AtomicBool::new(false));
    let server = pprof_server(
        TcpListener::bind(("127.0.0.1", port)).unwrap(),
        stop.clone(),
    );
    let o = finish(child, 60);
    stop.store(true, Ordering::SeqCst);
    let got = server.join().unwrap();
    assert!(o.status.success(), "{test}: {}", stderr(&o));
    let (windows, sent, waiting, dropped) = tally(&o);
    eprintln!(
        "{test}: {waiting_then} windows waited while the back end was down; {windows} windows, {sent} sent, {waiting} waiting, {dropped} dropped; the server got {}",
        got.len()
    );
    assert!(waiting_then >= 1, "nothing waited in the spool");
    assert!(stderr(&o).contains("waiting in"), "{}", stderr(&o));
    assert_eq!((windows, sent, waiting, dropped), (6, 6, 0, 0));
    assert_eq!(got.len(), 6);
    // In order, each with its own stretch of time, and split7030's functions.
    let starts: Vec<i64> = got.iter().map(|p| p.time_nanos).collect();
    assert!(starts.windows(2).all(|w| w[1] > w[0]), "{starts:?}");
    for p in &got {
        let names: Vec<&str> = p
            .function
            .iter()
            .map(|f| p.string_table[f.name as usize].as_str())
            .collect();
        assert!(names.contains(&"hot_a"), "{names:?}");
    }
    assert!(files_in(&spool).is_empty(), "{:?}", files_in(&spool));
    std::fs::remove_dir_all(&spool).unwrap();
}

fn a_full_spool_drops_the_oldest_and_the_next_run_sends_the_rest_first() {
    let test = "a_full_spool_drops_the_oldest_and_the_next_run_sends_the_rest_first";
    let target = Running::start("split7030", &["12"]);
    let spool = tempdir();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/ingest");
    let spool_arg = spool.to_str().unwrap();
    // The back end stays down; windows of about 1 KB each, a spool of 2 KB.
    let down = start(
        &target.pid(),
        &[
            "--every",
            "1",
            "-d",
            "4.5",
            "-F",
            "1000",
            "--push",
            &url,
            "--spool",
            spool_arg,
            "--spool-max",
            "2K",
        ],
    );
    let o = finish(down, 60);
    let (windows, sent, waiting, dropped) = tally(&o);
    eprintln!("{test}: {windows} windows, {sent} sent, {waiting} waiting, {dropped} dropped");
    assert_eq!(
        o.status.code(),
        Some(1),
        "windows were lost: {}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("the spool is full: dropped"),
        "{}",
        stderr(&o)
    );
    assert_eq!((windows, sent), (5, 0));
    assert!(dropped >= 1 && waiting >= 1 && dropped + waiting == windows);
    let kept: Vec<String> = files_in(&spool)
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    // The newest are kept.
    assert_eq!(kept.len() as u64, waiting);
    assert_eq!(
        kept.last().unwrap(),
        &format!("{:012}-pprof.gz", windows - 1)
    );
    // The next run, with the back end up, sends them first, then its own.
    let stop = Arc::new(AtomicBool::new(false));
    let server = pprof_server(
        TcpListener::bind(("127.0.0.1", port)).unwrap(),
        stop.clone(),
    );
    let up = start(
        &target.pid(),
        &[
            "--every", "1", "-d", "1.5", "-F", "1000", "--push", &url, "--spool", spool_arg,
        ],
    );
    let o2 = finish(up, 60);
    stop.store(true, Ordering::SeqCst);
    let got = server.join().unwrap();
    assert!(o2.status.success(), "{}", stderr(&o2));
    assert!(
        stderr(&o2).contains(&format!(
            "sending the {waiting} windows an earlier run left"
        )),
        "{}",
        stderr(&o2)
    );
    assert_eq!(got.len() as u64, waiting + 2);
    let starts: Vec<i64> = got.iter().map(|p| p.time_nanos).collect();
    assert!(starts.windows(2).all(|w| w[1] > w[0]), "{starts:?}");
    assert!(files_in(&spool).is_empty());
    std::fs::remove_dir_all(&spool).unwrap();
}

fn main() {
    run_tests(tests![
        windows_are_written_as_they_close_each_a_profile_of_its_own_time: Need::Perf;
        a_stop_signal_ends_the_last_window_early_and_it_is_written: Need::Perf;
        windows_wait_in_the_spool_while_the_back_end_is_down_and_are_sent_in_order: Need::Perf;
        a_full_spool_drops_the_oldest_and_the_next_run_sends_the_rest_first: Need::Perf;
    ]);
}
