//! The processes whose samples the kernel walker's program drops: with per-CPU events
//! for a command or attached processes, every process on a CPU is sampled, and the
//! samples of the others (someone else's, sampler's own) would each bring a stack copy
//! to the ring only to be dropped by the reader. The reader names each to the program
//! (its `strangers` map) at its first sample.

use std::collections::{HashMap, HashSet};

use libbpf_rs::{MapCore, MapFlags};

use super::KernelWalker;
use crate::events::{Event, EventKind};
use crate::record::follow::Followed;

/// The most processes whose samples the program drops (the program's `STRANGERS`):
/// sampler's own and what else runs on a busy machine, a few hundred.
const MAX_STRANGERS: usize = 4096;

/// What the reader knows of the processes whose samples the program drops.
///
/// Invariant: `named` is what the reader put in the program's map and has not taken out;
/// a pid whose new process, exit or exec has been read since a sample of it is not named
/// from that sample.
#[derive(Debug, Default)]
pub(super) struct Strangers {
    named: HashSet<i32>,
    /// Each pid's last change read (a new process, an exit, an exec), by its time, until
    /// it is handed on: a sample from before it is another process's, or one that may
    /// be followed now.
    changed_at: HashMap<i32, u64>,
    /// The map refused a pid: no more are named (their samples are dropped by the
    /// reader, as without the map).
    refused: bool,
}

/// The process whose pid `event` changes the meaning of: a new process, the exit of a
/// process (its first thread's), an exec.
fn pid_change(event: &Event) -> Option<i32> {
    match &event.kind {
        EventKind::Fork { pid, ppid, .. } if pid != ppid => Some(*pid),
        EventKind::Exit { pid, tid } if pid == tid => Some(*pid),
        EventKind::Comm {
            pid, exec: true, ..
        } => Some(*pid),
        _ => None,
    }
}

impl KernelWalker {
    /// An event as it is read from the rings, before it waits out the reader's reorder
    /// window (some 50 ms): a new process, an exit or an exec takes its pid out of the
    /// map at once, for a pid that comes back is another process, or one that may be
    /// followed; a loss takes them all out (the exits lost with it are not known).
    pub(in crate::record) fn strangers_read(&mut self, event: &Event) {
        if let Some(pid) = pid_change(event) {
            self.changed(pid, event.time_ns);
        }
        if let EventKind::Lost { .. } = &event.kind {
            let named: Vec<i32> = self.strangers.named.iter().copied().collect();
            for pid in named {
                self.not_stranger(pid);
            }
        }
    }

    /// An event handed on, of per-CPU events for `followed` processes (`kept`: whether
    /// it is theirs): the process of a sample that is not theirs is named to the
    /// program, unless its pid changed since.
    pub(in crate::record) fn learn_strangers(
        &mut self,
        followed: &Followed,
        event: &Event,
        kept: bool,
    ) {
        if let EventKind::Sample(s) = &event.kind {
            let changed_since = self
                .strangers
                .changed_at
                .get(&s.pid)
                .is_some_and(|&at| at >= event.time_ns);
            if !kept && !changed_since && !followed.may_follow(s.pid) {
                self.stranger(s.pid);
            }
        }
        // The change handed on: the samples after it are of the pid's new life.
        if let Some(pid) = pid_change(event) {
            if self.strangers.changed_at.get(&pid) == Some(&event.time_ns) {
                self.strangers.changed_at.remove(&pid);
            }
        }
    }

    fn changed(&mut self, pid: i32, time_ns: u64) {
        self.strangers.changed_at.insert(pid, time_ns);
        self.not_stranger(pid);
    }

    /// Has the program drop the samples of process `pid` from now on: a process that
    /// per-CPU events of a command or attached processes sample, and that the recording
    /// does not follow (see the program's `strangers`), so that its stack copies are no
    /// longer written. Beyond [`MAX_STRANGERS`] such processes, or once the map refused
    /// one, the samples of the others are still written, and dropped by the reader.
    ///
    /// A pid is taken out as soon as the reader reads its process's exit, a new process
    /// of that pid, or an exec. What is left: a pid that a new process takes within the
    /// few milliseconds before the reader reads the fork has that process's first
    /// samples dropped, which takes pids wrapping round that fast; and a process whose
    /// first thread exited before the others keeps its pid named until a new process
    /// takes it (no record says when its last thread exits).
    fn stranger(&mut self, pid: i32) {
        if self.strangers.refused
            || self.strangers.named.len() >= MAX_STRANGERS
            || self.strangers.named.contains(&pid)
        {
            return;
        }
        let key = (pid as u32).to_ne_bytes();
        let named = self
            .map("strangers")
            .is_some_and(|map| map.update(&key, &[1], MapFlags::ANY).is_ok());
        if named {
            self.strangers.named.insert(pid);
        } else {
            self.strangers.refused = true;
        }
    }

    /// Process `pid` is no stranger (any more). A pid the map would not let go of stays
    /// named here, and is tried again at its next change.
    fn not_stranger(&mut self, pid: i32) {
        if !self.strangers.named.contains(&pid) {
            return;
        }
        let key = (pid as u32).to_ne_bytes();
        let gone = self.map("strangers").is_some_and(|map| {
            map.delete(&key).is_ok() || map.lookup(&key, MapFlags::ANY).is_ok_and(|v| v.is_none())
        });
        if gone {
            self.strangers.named.remove(&pid);
        }
    }
}
