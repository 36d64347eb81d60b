//! Folded stacks (Brendan Gregg's collapsed format, read by flamegraph.pl, inferno and
//! speedscope): one line per unique stack of function names, root first, separated by
//! `;`, then a space and the sample count. Lines are sorted, as stackcollapse tools
//! sort them.

use std::collections::BTreeMap;

use crate::profile::{Profile, TimeView, WeightUnit};

/// A function name as a folded frame: `;` separates frames and a line ends the stack,
/// so neither may appear inside one.
fn frame_name(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

/// The root frames that name a thread: `process (pid);thread (tid)`.
pub fn thread_root(profile: &Profile, thread: usize) -> String {
    let t = &profile.threads[thread];
    let p = &profile.processes[t.process.index()];
    format!(
        "{} ({});{} ({})",
        frame_name(&p.name),
        p.pid,
        frame_name(&t.name),
        t.tid
    )
}

/// Every thread's samples as folded stacks, weighed as `view` says: sample counts, or
/// microseconds for time (off-CPU or wall-clock); with `thread_roots`, each stack starts
/// with its process and thread.
pub fn to_folded(profile: &Profile, thread_roots: bool, view: TimeView) -> String {
    let mut out = String::new();
    for (stack, weight) in folded_stacks(profile, thread_roots, view) {
        out.push_str(&stack);
        out.push(' ');
        out.push_str(&weight.to_string());
        out.push('\n');
    }
    out
}

/// The lines of [`to_folded`]: each unique stack (frames joined by `;`) and its weight
/// (samples, or microseconds for time), sorted; stacks of no weight left out.
pub fn folded_stacks(
    profile: &Profile,
    thread_roots: bool,
    view: TimeView,
) -> BTreeMap<String, u64> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    let interval_ns = profile.meta.interval_ns();
    for (i, t) in profile.threads.iter().enumerate() {
        let root = thread_roots.then(|| thread_root(profile, i));
        for (stack, weight) in super::stack_weights(t, view, interval_ns) {
            let mut names: Vec<String> = root.iter().cloned().collect();
            names.extend(
                super::func_path(profile, stack)
                    .into_iter()
                    .map(|f| frame_name(profile.func_name(f))),
            );
            *lines.entry(names.join(";")).or_default() += weight;
        }
    }
    for weight in lines.values_mut() {
        if view.unit() == WeightUnit::Nanoseconds {
            *weight = (*weight + 500) / 1000;
        }
    }
    lines.retain(|_, weight| *weight > 0);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_001_as_folded_stacks() {
        let p = Profile::from_named_stacks(&[
            &["A", "B", "C", "D", "E"],
            &["A", "B", "C", "F", "G"],
            &["A", "B", "H", "F"],
            &["A", "B", "H", "F"],
            &["A", "x;y"],
        ]);
        assert_eq!(
            to_folded(&p, false, TimeView::Cpu),
            "A;B;C;D;E 1\nA;B;C;F;G 1\nA;B;H;F 2\nA;x:y 1\n"
        );
        assert!(to_folded(&p, true, TimeView::Cpu)
            .starts_with("synthetic (1);synthetic (1);A;B;C;D;E 1\n"));
    }
}
