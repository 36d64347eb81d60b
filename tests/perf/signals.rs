//! End-to-end unwinding through signal frames: bench-targets' sigloop spends half its
//! CPU time in a SIGUSR1 handler that main's raise() runs, and a CPU-time timer's
//! SIGPROF interrupts it anywhere. Every sample in a handler must show the handler on
//! top of `__restore_rt` (named, not `fn_0x…`), and below it the code the signal
//! interrupted down to main and `_start`, or start with `[truncated]`: never a stack
//! that skips main unmarked, as the frame-pointer chain alone does. And the other place
//! where the kernel's chain goes wrong: one that loops ends at the loop, marked. Each test
//! is skipped (visibly) where perf recording is not permitted.

#[path = "../common/mod.rs"]
mod common;

use common::*;

/// The handlers, each with the function it works in.
const HANDLERS: [&str; 2] = ["on_usr1", "on_prof"];

/// The samples' call paths (root first) of sigloop (`binary`) recorded with `args`,
/// after checking that the samples stand for the CPU time it got.
fn sigloop_paths(what: &str, binary: &str, args: &[&str]) -> Vec<Vec<String>> {
    let (o, path) = record(args, &[&target(binary), "1"]);
    assert!(o.status.success(), "{what}: {}", stderr(&o));
    let paths: Vec<Vec<String>> = thread_paths(&load_checked(&path))
        .into_iter()
        .flat_map(|t| t.paths)
        .collect();
    assert_covers_cpu(what, paths.len(), command_cpu_ms(&o), 0.8);
    if let Some(dir) = path.parent() {
        std::fs::remove_dir_all(dir).ok();
    }
    paths
}

/// How a handler's sample came out.
#[derive(Debug, PartialEq, Eq)]
enum Unwound {
    /// From `_start` through main to the signal frame and the handler.
    Complete,
    /// Starts with `[truncated]`, then the interrupted code, `__restore_rt` and the
    /// handler.
    Marked,
}

/// Judges a path through a handler (`None`: not in a handler); panics on a wrong one.
/// Below `__restore_rt` lies the code the signal interrupted: for SIGUSR1 always
/// main > raise (…, glibc's names of its inner functions are its own), for SIGPROF main
/// itself or whatever it called. The trampoline is directly under the handler.
fn judge(what: &str, p: &[String]) -> Option<Unwound> {
    let handler = p.iter().position(|f| HANDLERS.contains(&f.as_str()))?;
    assert!(
        !p.iter().any(|f| f.starts_with("fn_0x")),
        "{what}: an unnamed frame in {p:?}"
    );
    assert!(
        handler >= 1 && p[handler - 1] == "__restore_rt",
        "{what}: the handler is not on __restore_rt: {p:?}"
    );
    if p[0] == "[truncated]" {
        assert!(
            handler >= 3,
            "{what}: nothing of the interrupted code: {p:?}"
        );
        return Some(Unwound::Marked);
    }
    let below = &p[..handler - 1];
    assert_eq!(
        below[0], "_start",
        "{what}: unmarked and not from _start: {p:?}"
    );
    assert!(
        has_run(below, &["__libc_start_call_main", "main"]),
        "{what}: main is missing below the signal frame: {p:?}"
    );
    if p[handler] == "on_usr1" {
        assert!(
            has_run(below, &["main", "raise"]),
            "{what}: SIGUSR1 came from main > raise: {p:?}"
        );
    }
    Some(Unwound::Complete)
}

/// Judges every sample of `paths`: the counts of complete and marked handler samples,
/// and of samples in each handler.
fn judge_all(what: &str, paths: &[Vec<String>]) -> (usize, usize, [usize; 2]) {
    let (mut complete, mut marked, mut by_handler) = (0, 0, [0; 2]);
    for p in paths {
        match judge(what, p) {
            Some(Unwound::Complete) => complete += 1,
            Some(Unwound::Marked) => marked += 1,
            None => continue,
        }
        for (n, h) in by_handler.iter_mut().zip(HANDLERS) {
            *n += usize::from(p.iter().any(|f| f == h));
        }
    }
    eprintln!(
        "{what}: of {} samples, {} in on_usr1 and {} in on_prof: {complete} complete, {marked} marked",
        paths.len(),
        by_handler[0],
        by_handler[1]
    );
    (complete, marked, by_handler)
}

fn handlers_unwind_through_the_signal_frame_to_main() {
    let runs: [(&str, &[&str]); 5] = [
        ("sigloop_nofp", &["--unwind", "hybrid"]),
        // The kernel's walker reads the signal frame's saved registers itself.
        ("sigloop_nofp", &["--unwind", "kernel"]),
        ("sigloop", &["--unwind", "hybrid"]),
        ("sigloop_nofp", &["--unwind", "dwarf"]),
        // Frame pointers, with a stack copy that reaches past the signal frame's saved
        // registers (3 KiB with AVX-512's state) to the interrupted code's frames.
        ("sigloop", &["--unwind", "fp", "--stack-size", "8192"]),
    ];
    for (binary, args) in runs {
        let what = format!("{binary} {}", args.join(" "));
        let paths = sigloop_paths(&what, binary, args);
        let (complete, marked, by_handler) = judge_all(&what, &paths);
        // Half the CPU time is the SIGUSR1 handler's (on_usr1 works as long as main
        // between two raises); SIGPROF's handler runs every 3 ms of CPU for 0.1 ms.
        let usr1 = 100.0 * by_handler[0] as f64 / paths.len() as f64;
        assert!(
            (35.0..65.0).contains(&usr1),
            "{what}: {usr1:.1}% in on_usr1"
        );
        assert!(by_handler[1] > 0, "{what}: no sample in on_prof");
        // All but a handful complete (a sample can land where CFI has no row to go on).
        assert!(
            marked * 100 <= complete,
            "{what}: {marked} marked against {complete} complete"
        );
    }
}

fn frame_pointers_mark_what_the_stack_copy_does_not_reach() {
    // fp's default copy (512 bytes) reaches the signal frame's saved registers but not
    // the interrupted code's stack: a handler's sample is complete only where the
    // interrupted function has an RBP frame (main's own code), else marked at the
    // interrupted frame; never wrong (judge_all checks every one).
    let what = "sigloop --unwind fp";
    let paths = sigloop_paths(what, "sigloop", &["--unwind", "fp"]);
    let (complete, marked, by_handler) = judge_all(what, &paths);
    assert_eq!(complete + marked, by_handler[0] + by_handler[1]);
    let usr1 = 100.0 * by_handler[0] as f64 / paths.len() as f64;
    assert!(
        (35.0..65.0).contains(&usr1),
        "{what}: {usr1:.1}% in on_usr1"
    );
    // raise's signal interrupts libc's __pthread_kill_implementation, which keeps no RBP
    // frame: those samples end there, marked, the interrupted instruction named under
    // the trampoline.
    let raised = paths
        .iter()
        .filter(|p| has_run(p, &["__restore_rt", "on_usr1"]))
        .filter(|p| p.len() > 2 && p[0] == "[truncated]" && p[2] == "__restore_rt")
        .count();
    assert!(
        raised * 100 >= by_handler[0] * 95,
        "{what}: {raised} of {} marked at the interrupted frame",
        by_handler[0]
    );
}

fn a_looping_frame_pointer_chain_ends_at_the_loop() {
    // fploop's RBP points at a frame that holds itself as the saved RBP: the kernel's
    // chain repeats its return address up to --max-stack (4,096 frames). The step that
    // does not move the stack pointer up ends the walk: [truncated] > spin_in_loop and
    // the loop frame's return address (also in spin_in_loop), with the cause said.
    for mode in ["hybrid", "fp"] {
        let what = format!("fploop --unwind {mode}");
        let (o, path) = record(&["--unwind", mode], &[&target("fploop"), "1"]);
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        let paths: Vec<Vec<String>> = thread_paths(&load_checked(&path))
            .into_iter()
            .flat_map(|t| t.paths)
            .collect();
        std::fs::remove_dir_all(path.parent().unwrap()).ok();
        let in_loop: Vec<&Vec<String>> = paths
            .iter()
            .filter(|p| p.iter().any(|f| f == "spin_in_loop"))
            .collect();
        assert!(in_loop.len() * 10 >= paths.len() * 9, "{what}");
        for p in &in_loop {
            let user: Vec<&str> = p
                .iter()
                .map(String::as_str)
                .take_while(|f| !f.starts_with("[kernel]"))
                .collect();
            assert_eq!(
                user,
                ["[truncated]", "spin_in_loop", "spin_in_loop"],
                "{what}: {} frames: {:?}",
                p.len(),
                &p[..4.min(p.len())]
            );
        }
        let line = format!(
            "{} stacks start with [truncated]: a step of their unwinding did not move the stack pointer up",
            in_loop.len()
        );
        assert!(stderr(&o).contains(&line), "{what}: {}", stderr(&o));
        eprintln!(
            "{what}: {} samples in the loop, each 2 frames deep",
            in_loop.len()
        );
    }
}

fn main() {
    run_tests(tests![
        handlers_unwind_through_the_signal_frame_to_main: Need::Perf;
        frame_pointers_mark_what_the_stack_copy_does_not_reach: Need::Perf;
        a_looping_frame_pointer_chain_ends_at_the_loop: Need::Perf;
    ]);
}
