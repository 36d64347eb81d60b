//! The processes whose samples the kernel walker's program drops: with per-CPU events
//! for a command or attached processes, every process on a CPU is sampled, and the
//! samples of the others (someone else's, sampler's own) would each bring a stack copy
//! to the ring only to be dropped by the reader. The reader names each to the program
//! (its `strangers` map) at its first sample.

use libbpf_rs::{MapCore, MapFlags};

use super::KernelWalker;
use crate::events::{Event, EventKind};
use crate::record::follow::Followed;

/// The most processes whose samples the program drops (the program's `STRANGERS`):
/// sampler's own and what else runs on a busy machine, a few hundred.
const MAX_STRANGERS: usize = 4096;

impl KernelWalker {
    /// What the program learns from an event of per-CPU events for `followed` processes
    /// (`kept`: whether it is theirs): the processes whose samples it may drop, and the
    /// pids no longer so.
    pub(in crate::record) fn learn_strangers(
        &mut self,
        followed: &Followed,
        event: &Event,
        kept: bool,
    ) {
        match (&event.kind, kept) {
            (EventKind::Sample(s), false) if !followed.may_follow(s.pid) => self.stranger(s.pid),
            (EventKind::Exit { pid, tid }, _) if pid == tid => self.not_stranger(*pid),
            (EventKind::Fork { pid, .. } | EventKind::Comm { pid, .. }, true) => {
                self.not_stranger(*pid)
            }
            _ => {}
        }
    }

    /// Has the program drop the samples of process `pid` from now on: a process that
    /// per-CPU events of a command or attached processes sample, and that the recording
    /// does not follow (see the program's `strangers`), so that its stack copies are no
    /// longer written. Beyond [`MAX_STRANGERS`] such processes, the samples of the others
    /// are still written, and dropped by the reader.
    ///
    /// A pid is taken out when its process exits or becomes followed
    /// ([`KernelWalker::not_stranger`]); until the reader reaches that record, a new
    /// followed process given a stranger's pid at once would have its samples dropped,
    /// which takes the machine's pids wrapping round within milliseconds.
    fn stranger(&mut self, pid: i32) {
        if self.strangers.len() >= MAX_STRANGERS || !self.strangers.insert(pid) {
            return;
        }
        let key = (pid as u32).to_ne_bytes();
        let named = self
            .map("strangers")
            .is_some_and(|map| map.update(&key, &[1], MapFlags::ANY).is_ok());
        if !named {
            self.strangers.remove(&pid);
        }
    }

    /// Process `pid` is no stranger (any more): it exited, so that its pid may be
    /// another's next, or it is followed now.
    fn not_stranger(&mut self, pid: i32) {
        if self.strangers.remove(&pid) {
            if let Some(map) = self.map("strangers") {
                let _ = map.delete(&(pid as u32).to_ne_bytes());
            }
        }
    }
}
