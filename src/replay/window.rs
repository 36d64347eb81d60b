//! The windows of a continuous recording: what was replayed since the last cut, taken
//! out of the builder as a raw profile of its own while replay goes on. The processes,
//! their maps and names, and the unwinder's state carry over from one window to the
//! next; the frame and stack tables start anew, and the threads that ended are
//! forgotten, so that memory over hours is that of one window and of what is alive.

use super::threads::EXITED_GRACE_NS;
use super::{Built, ProfileBuilder, KERNEL_SPACE_START};
use crate::events::RecordingInfo;
use crate::profile::{LibIndex, RawProfile};

impl ProfileBuilder {
    /// The raw profile of the events fed since the last cut (or the start), its times
    /// relative to `info.start_ns` (the window's start), with only the libraries its
    /// frames are in. Off-CPU time is not cut into windows (a continuous recording has
    /// none).
    pub fn cut(&mut self, info: &RecordingInfo) -> Built {
        let kernel_frames = self.has_kernel_frames();
        self.relocate_kernel_frames(info.kernel_text.unwrap_or(KERNEL_SPACE_START));
        let stacks = std::mem::take(&mut self.stacks);
        let (processes, threads) = self.threads.take_tables(info);
        // A thread that ended a while ago has nothing more to come.
        self.threads
            .forget_ended(info.end_ns.saturating_sub(EXITED_GRACE_NS));
        let mut address_frames = stacks.frames.items;
        let mut new_lib: Vec<Option<LibIndex>> = vec![None; self.libs.items.len()];
        let mut libs = Vec::new();
        let mut lib_binaries = Vec::new();
        for frame in &mut address_frames {
            let Some(old) = frame.lib else {
                continue;
            };
            let new = match new_lib[old.index()] {
                Some(new) => new,
                None => {
                    libs.push(self.libs.items[old.index()].clone());
                    lib_binaries.push(self.lib_binaries[old.index()].clone());
                    let new = LibIndex::new(libs.len() - 1);
                    new_lib[old.index()] = Some(new);
                    new
                }
            };
            frame.lib = Some(new);
        }
        // What unwinding read of each file's CFI and this window did not use goes with
        // it: what the next one needs anew is read again, and a machine's libraries do
        // not pile up.
        self.age_cfi_pieces();
        let no_unwind_info_in = self.take_no_unwind_info_in();
        let mut meta = self.meta(info);
        meta.off_cpu = false;
        self.restored_callers = 0;
        Built {
            profile: RawProfile {
                meta,
                libs,
                address_frames,
                stacks: stacks.stacks.items,
                processes,
                threads,
            },
            lib_binaries,
            truncated: std::mem::take(&mut self.truncated),
            jit_dumps: self.jit_dumps.clone(),
            jit_users: self.jit_users.clone(),
            no_unwind_info_in,
            kernel_frames,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventKind, Scope};
    use crate::replay::tests::{at, exec, fork, sample};
    use crate::unwind::UnwindMode;

    const SECOND: u64 = 1_000_000_000;

    fn window(start_ns: u64, end_ns: u64) -> RecordingInfo {
        RecordingInfo {
            start_ns,
            end_ns,
            scope: Scope::System,
            ..RecordingInfo::example()
        }
    }

    /// (pid, process name, thread samples' times in ms) of each thread of a window.
    fn rows(built: &Built) -> Vec<(i32, String, Vec<f64>)> {
        let p = &built.profile;
        p.threads
            .iter()
            .map(|t| {
                let process = &p.processes[t.process.index()];
                let times = t.samples.iter().map(|s| s.time_ms).collect();
                (process.pid, process.name.clone(), times)
            })
            .collect()
    }

    #[test]
    fn a_window_has_what_came_since_the_last_cut_and_the_processes_carry_over() {
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        b.add_events(&[
            fork(SECOND, 10, 10),
            exec(SECOND, 10, "first"),
            sample(SECOND + 1_000_000, 10, 10),
            fork(SECOND, 20, 20),
            exec(SECOND, 20, "brief"),
            sample(SECOND + 2_000_000, 20, 20),
            at(SECOND + 3_000_000, EventKind::Exit { pid: 20, tid: 20 }),
        ]);
        let first = b.cut(&window(0, 2 * SECOND));
        assert_eq!(
            rows(&first),
            [
                (10, "first".to_string(), vec![1001.0]),
                (20, "brief".to_string(), vec![1002.0])
            ]
        );
        assert_eq!(first.profile.meta.duration_ms, 2000.0);
        // The process named in the first window keeps its name in the second, whose
        // times start at its own start; the process that exited is gone from it.
        b.add_events(&[sample(2 * SECOND + 5_000_000, 10, 10)]);
        let second = b.cut(&window(2 * SECOND, 4 * SECOND));
        assert_eq!(rows(&second), [(10, "first".to_string(), vec![5.0])]);
        // Its tables hold its own stacks only: one frame, one stack.
        assert_eq!(
            (
                second.profile.address_frames.len(),
                second.profile.stacks.len()
            ),
            (1, 1)
        );
        // The exited process is forgotten once its grace is over; the live one stays.
        let pids: Vec<i32> = b.threads.processes.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [10]);
        // A window without samples is empty, not an error.
        let third = b.cut(&window(4 * SECOND, 6 * SECOND));
        assert!(third.profile.threads.is_empty() && third.profile.stacks.is_empty());
    }
}
