//! End-to-end unwinding in each mode (docs/design.md §5) on the bench targets built without frame
//! pointers, through libc's qsort, down a 2,000-deep recursion, and through frames larger
//! than a stack copy (which only the walk in the kernel goes through). Each test is skipped
//! (visibly) where perf recording is not permitted.

#[path = "../common/mod.rs"]
mod common;

use common::*;

/// The samples' call paths (root first) of `cmd` recorded with `--unwind mode`. With
/// `kernel`, the kernel's walker must have walked at least 90% of them to the outermost
/// frame (the first milliseconds of a process, before its tables are loaded, are
/// unwound from stack copies).
fn paths_with(test: &str, mode: &str, cmd: &[&str]) -> Vec<Vec<String>> {
    let (o, path) = record(&["--unwind", mode], cmd);
    assert!(o.status.success(), "{test} {mode}: {}", stderr(&o));
    let paths = all_paths(&path);
    if mode == "kernel" {
        // The program's wake-ups are records in the rings too: neither samples nor
        // lost ones.
        let lost = number_before(&stderr(&o), " lost, ");
        assert_eq!(lost, 0, "{test}: {}", stderr(&o));
        let walked = kernel_walked_to_outermost(&stderr(&o));
        eprintln!(
            "{test}: kernel: {walked} of {} samples walked in the kernel",
            paths.len()
        );
        assert!(
            walked * 10 >= paths.len() * 9,
            "{test}: the kernel walked {walked} of {}: {}",
            paths.len(),
            stderr(&o)
        );
    }
    // Every sample of the CPU time the command got (a busy machine gives it less than
    // its wall time), whatever the unwinding made of it.
    assert_covers_cpu(
        &format!("{test} {mode}"),
        paths.len(),
        command_cpu_ms(&o),
        0.8,
    );
    paths
}

/// The percentage of `paths` that contain one of `runs`.
fn share_with_any(paths: &[Vec<String>], runs: &[&[&str]]) -> f64 {
    let n = paths
        .iter()
        .filter(|p| runs.iter().any(|r| has_run(p, r)))
        .count();
    100.0 * n as f64 / paths.len().max(1) as f64
}

fn c_without_frame_pointers_has_full_paths_in_hybrid_dwarf_and_kernel() {
    let test = "c_without_frame_pointers_has_full_paths_in_hybrid_dwarf_and_kernel";
    let full: [&[&str]; 2] = [
        &["main", "outer", "middle", "hot_a"],
        &["main", "outer", "middle", "hot_b"],
    ];
    for mode in ["hybrid", "dwarf", "kernel"] {
        let paths = paths_with(test, mode, &[&target("nofp"), "1"]);
        let share = share_with_any(&paths, &full);
        eprintln!(
            "{test}: {mode}: {share:.1}% of {} samples have the full path",
            paths.len()
        );
        assert!(share > 90.0, "{mode}: {share:.1}%");
    }
    // Frame pointers cannot follow this program: the paths are allowed to be wrong, but
    // recording must work.
    let paths = paths_with(test, "fp", &[&target("nofp"), "1"]);
    let share = share_with_any(&paths, &full);
    eprintln!(
        "{test}: fp: {share:.1}% of {} samples have the full path",
        paths.len()
    );
}

fn rust_without_frame_pointers_has_full_paths_in_hybrid_dwarf_and_kernel() {
    let test = "rust_without_frame_pointers_has_full_paths_in_hybrid_dwarf_and_kernel";
    let full: [&[&str]; 2] = [
        &["rust_inline::main", "rust_inline::run", "rust_inline::work"],
        &[
            "rust_inline::main",
            "rust_inline::run",
            "<rust_inline::Squares<u64> as rust_inline::Summer>::total",
        ],
    ];
    for mode in ["hybrid", "dwarf", "kernel"] {
        let paths = paths_with(test, mode, &[&target("rust_nofp"), "1"]);
        let share = share_with_any(&paths, &full);
        eprintln!(
            "{test}: {mode}: {share:.1}% of {} samples have the full path",
            paths.len()
        );
        assert!(share > 90.0, "{mode}: {share:.1}%");
        let rooted = share_with_any(&paths, &[&["main"]]);
        assert!(rooted > 90.0, "{mode}: {rooted:.1}% reach main");
    }
}

fn comparator_called_from_libc_qsort_has_the_path_from_main() {
    let test = "comparator_called_from_libc_qsort_has_the_path_from_main";
    for mode in ["hybrid", "dwarf", "kernel"] {
        let paths = paths_with(test, mode, &[&target("qsorter"), "1"]);
        let in_compare: Vec<&Vec<String>> = paths
            .iter()
            .filter(|p| p.last().is_some_and(|f| f == "compare"))
            .collect();
        // glibc's qsort hands over to qsort_r with a tail call, so the frame is qsort_r.
        let whole = in_compare
            .iter()
            .filter(|p| {
                let sort = p.iter().position(|f| f == "sort_all");
                let q = p.iter().position(|f| f == "qsort" || f == "qsort_r");
                p.first().is_some_and(|f| f == "_start")
                    && has_run(p, &["main", "sort_all"])
                    && matches!((sort, q), (Some(s), Some(q)) if q == s + 1)
            })
            .count();
        let share = 100.0 * whole as f64 / in_compare.len().max(1) as f64;
        eprintln!(
            "{test}: {mode}: {whole} of {} samples in compare have _start > … > main > sort_all > qsort_r > … > compare",
            in_compare.len()
        );
        assert!(in_compare.len() > 50 && share > 90.0, "{mode}: {share:.1}%");
    }
}

fn recursion_2000_deep_keeps_every_level_in_hybrid_and_fp() {
    let test = "recursion_2000_deep_keeps_every_level_in_hybrid_and_fp";
    for mode in ["hybrid", "fp"] {
        let paths = paths_with(test, mode, &[&target("deep"), "1", "2000"]);
        let deep = paths
            .iter()
            .filter(|p| p.iter().filter(|f| *f == "descend").count() >= 2000)
            .count();
        let share = 100.0 * deep as f64 / paths.len().max(1) as f64;
        let depth = paths.iter().map(Vec::len).max().unwrap_or(0);
        eprintln!("{test}: {mode}: {share:.1}% of {} samples have all 2,000 levels (deepest {depth} frames)", paths.len());
        assert!(share > 90.0, "{mode}: {share:.1}%");
    }
    // CFI alone stops where the stack copy ends, and says so.
    let paths = paths_with(test, "dwarf", &[&target("deep"), "1", "2000"]);
    let marked = paths
        .iter()
        .filter(|p| p.first().is_some_and(|f| f == "[truncated]"))
        .count();
    assert!(
        marked * 10 > paths.len() * 9,
        "dwarf: {marked} of {} marked",
        paths.len()
    );
}

fn frames_larger_than_a_stack_copy_are_walked_whole_in_the_kernel() {
    // bigframe's `big` keeps 96 KiB on its stack, more than the largest stack copy: CFI
    // through the copy stops inside its frame (marked), the walk in the kernel goes on.
    let test = "frames_larger_than_a_stack_copy_are_walked_whole_in_the_kernel";
    let full: [&[&str]; 1] = [&["main", "outer", "big", "hot"]];
    let (o, path) = record(
        &["--unwind", "hybrid", "--stack-size", "65528"],
        &[&target("bigframe"), "1"],
    );
    assert!(o.status.success(), "{test}: {}", stderr(&o));
    let copied = all_paths(&path);
    let marked = copied
        .iter()
        .filter(|p| p.first().is_some_and(|f| f == "[truncated]"))
        .count();
    assert!(
        marked * 10 >= copied.len() * 9,
        "hybrid: {marked} of {} marked",
        copied.len()
    );
    let walked = paths_with(test, "kernel", &[&target("bigframe"), "1"]);
    let share = share_with_any(&walked, &full);
    eprintln!(
        "{test}: hybrid with a 65,528-byte copy: {marked} of {} marked; kernel: {share:.1}% of {} from main to hot",
        copied.len(),
        walked.len()
    );
    assert!(share > 95.0, "kernel: {share:.1}%");
}

fn a_process_teardown_has_the_stack_at_its_exit_in_hybrid_and_kernel() {
    // pages 250000 touches 1 GB and exits: the kernel frees it in exit_mmap, after the
    // process's memory is released, where no user stack can be walked. Those samples
    // have the user stack its exit_group was called with.
    let test = "a_process_teardown_has_the_stack_at_its_exit_in_hybrid_and_kernel";
    for mode in ["hybrid", "kernel"] {
        // (Not `paths_with`: in the kernel mode the teardown's samples, a sixth of
        // them, are not walked in the kernel.)
        let (o, path) = record(&["--unwind", mode], &[&target("pages"), "250000"]);
        assert!(o.status.success(), "{test} {mode}: {}", stderr(&o));
        let paths = all_paths(&path);
        let teardown: Vec<&Vec<String>> = paths
            .iter()
            .filter(|p| p.iter().any(|f| f == "[kernel] exit_mmap"))
            .collect();
        let from_exit = teardown
            .iter()
            .filter(|p| {
                p.first().is_some_and(|f| f == "_start")
                    && has_run(p, &["__libc_start_call_main", "exit"])
                    && p.iter().any(|f| f == "_exit")
            })
            .count();
        eprintln!(
            "{test} {mode}: {} teardown samples, {from_exit} from _start through exit",
            teardown.len()
        );
        assert!(
            teardown.len() >= 10,
            "{mode}: {} teardown samples",
            teardown.len()
        );
        assert_eq!(from_exit, teardown.len(), "{mode}: {teardown:?}");
    }
}

/// The kernel walker's tables are compiled once: a second run reads them from the cache
/// (the same call paths), and an entry damaged on the disk is refused with a line naming
/// its file, the recording going on without it.
fn kernel_tables_are_kept_between_runs_and_a_damaged_one_is_refused() {
    use std::os::unix::fs::MetadataExt;
    let test = "kernel_tables_are_kept_between_runs_and_a_damaged_one_is_refused";
    let cache = tempdir().join("xdg");
    std::fs::create_dir_all(&cache).unwrap();
    let nofp = target("nofp");
    let run = |n: usize| {
        let out = tempdir().join(format!("cached{n}.json"));
        let o = std::process::Command::new(sampler_bin())
            .env("XDG_CACHE_HOME", &cache)
            .args(["record", "--unwind", "kernel", "-o"])
            .arg(&out)
            .args(["--", &nofp, "1"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{test} run {n}: {}", stderr(&o));
        ffp_check(&out);
        (stderr(&o), all_paths(&out))
    };
    let full: [&[&str]; 2] = [
        &["main", "outer", "middle", "hot_a"],
        &["main", "outer", "middle", "hot_b"],
    ];
    let meta = std::fs::metadata(&nofp).unwrap();
    let entry = cache
        .join("sampler/unwind")
        .join(format!("{:x}-{:x}", meta.dev(), meta.ino()));
    let (_, first) = run(1);
    let written = std::fs::metadata(&entry).expect("nofp's table was kept");
    let (err, second) = run(2);
    for (n, paths) in [(1, &first), (2, &second)] {
        let share = share_with_any(paths, &full);
        assert!(share >= 90.0, "{test}: run {n}: {share:.1}% full paths");
    }
    assert_eq!(
        std::fs::metadata(&entry).unwrap().ino(),
        written.ino(),
        "the second run read the entry, and wrote none"
    );
    assert!(!err.contains("no kernel unwind table"), "{err}");
    // One byte of a row changed: the checksum no longer holds.
    let mut bytes = std::fs::read(&entry).unwrap();
    let at = bytes.len() - 7;
    bytes[at] ^= 0x40;
    std::fs::write(&entry, &bytes).unwrap();
    let (err, _) = run(3);
    assert!(
        err.contains(&format!(
            "no kernel unwind table for {nofp}: its rows could not be given to the kernel: its cached unwind table is damaged"
        )),
        "{err}"
    );
    // Removed: the next run compiles the table anew, and keeps it.
    assert!(!entry.exists(), "the damaged entry is still there");
    let (err, fourth) = run(4);
    assert!(!err.contains("no kernel unwind table"), "{err}");
    assert!(share_with_any(&fourth, &full) >= 90.0);
    assert!(entry.exists(), "compiled again and kept");
}

/// As root the command is sampled by per-CPU events, which sample every process on the
/// CPU: the kernel's walker drops the samples of the processes sampler does not follow
/// once it has seen them, so that their stack copies are never written. A busy process
/// of someone else's beside the command, which takes as many samples as the command
/// does, leaves the ring's bytes per sample near the command's own (without the drop,
/// each of its samples brings a stack copy of 8 KB or more).
///
/// The bound: the two busy threads take two thirds of the samples, so without the drop
/// the mean would be some 11,000 bytes (16 KiB copies). With it, about 2,000 on an idle
/// machine (the busy process's first 70 or so samples, before the reader has named it,
/// bring their copies) and up to 3,700 on one so busy that the command's own first
/// samples come before its tables are loaded and bring copies too.
fn samples_of_processes_not_followed_are_dropped_in_the_kernel() {
    let test = "samples_of_processes_not_followed_are_dropped_in_the_kernel";
    let mut stranger = std::process::Command::new(target("busy"))
        .args(["2", "4"])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (o, path) = record(&["--unwind", "kernel"], &[&target("nofp"), "1"]);
    stranger.wait().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{test}: {err}");
    ffp_check(&path);
    let per_sample: u64 = err
        .lines()
        .find_map(|l| {
            l.split(" MB of samples (")
                .nth(1)?
                .split(" bytes per sample")
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{test}: no bytes per sample: {err}"));
    eprintln!("{test}: {per_sample} bytes per sample beside a busy process");
    assert!(
        err.contains("1 threads in 1 processes"),
        "{test}: only the command is in the profile: {err}"
    );
    assert!(
        per_sample < 6_000,
        "{test}: {per_sample} bytes per sample: {err}"
    );
}

fn main() {
    run_tests(tests![
        c_without_frame_pointers_has_full_paths_in_hybrid_dwarf_and_kernel: Need::Perf;
        rust_without_frame_pointers_has_full_paths_in_hybrid_dwarf_and_kernel: Need::Perf;
        comparator_called_from_libc_qsort_has_the_path_from_main: Need::Perf;
        recursion_2000_deep_keeps_every_level_in_hybrid_and_fp: Need::Perf;
        frames_larger_than_a_stack_copy_are_walked_whole_in_the_kernel: Need::Perf;
        a_process_teardown_has_the_stack_at_its_exit_in_hybrid_and_kernel: Need::Root;
        kernel_tables_are_kept_between_runs_and_a_damaged_one_is_refused: Need::Root;
        samples_of_processes_not_followed_are_dropped_in_the_kernel: Need::Root;
    ]);
}
