//! Which records of per-CPU events belong to the recording. Per-CPU events see every
//! task on their CPU; when a command or attached processes are recorded that way (so
//! that sampling runs on across thread births), only their process tree is kept: the
//! processes followed from the start, and every process they start while followed.
//! Events must be fed in time order (a fork before the child's first record: the kernel
//! writes the fork record before the child can run).

use std::collections::HashSet;

use crate::events::{Event, EventKind};

/// The followed processes, updated by the fork, exec and exit records that pass.
#[derive(Debug)]
pub struct Followed {
    pids: HashSet<i32>,
    /// The launched command's pid before its `exec`: it is followed from there (before,
    /// it is still sampler's own code waiting to be let go).
    until_exec: Option<i32>,
}

impl Followed {
    /// The processes `pids`, followed from the start (attached).
    pub fn processes(pids: &[i32]) -> Followed {
        Followed {
            pids: pids.iter().copied().collect(),
            until_exec: None,
        }
    }

    /// The launched command `pid`, followed from its `exec`.
    pub fn from_exec(pid: i32) -> Followed {
        Followed {
            pids: HashSet::new(),
            until_exec: Some(pid),
        }
    }

    /// Whether process `pid` may become followed without a fork: the launched command
    /// before its `exec`.
    pub fn may_follow(&self, pid: i32) -> bool {
        self.until_exec == Some(pid)
    }

    /// Whether `event` belongs to the followed processes (updating them with it). A
    /// loss is theirs when it happened while one of their threads ran (or the kernel did
    /// not say who ran); throttling is kept.
    pub fn keep(&mut self, event: &Event) -> bool {
        match &event.kind {
            EventKind::Comm { pid, exec, .. } => {
                if *exec && self.until_exec == Some(*pid) {
                    self.until_exec = None;
                    self.pids.insert(*pid);
                }
                self.pids.contains(pid)
            }
            EventKind::Fork { pid, ppid, .. } => {
                if pid != ppid {
                    // A new process: followed when its parent is; a pid reused by a
                    // process of someone else's is no longer followed.
                    if self.pids.contains(ppid) {
                        self.pids.insert(*pid);
                    } else {
                        self.pids.remove(pid);
                    }
                }
                self.pids.contains(pid)
            }
            EventKind::Sample(s) | EventKind::SwitchSample(s) | EventKind::ExitStack(s) => {
                self.pids.contains(&s.pid)
            }
            EventKind::Mmap(m) => self.pids.contains(&m.pid),
            EventKind::Exit { pid, .. }
            | EventKind::SwitchOut { pid, .. }
            | EventKind::SwitchIn { pid, .. } => self.pids.contains(pid),
            EventKind::Lost { pid, .. } => pid.is_none_or(|p| self.pids.contains(&p)),
            EventKind::Throttle => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Sample;

    fn at(kind: EventKind) -> Event {
        Event { time_ns: 0, kind }
    }
    fn sample(pid: i32) -> Event {
        at(EventKind::Sample(Sample {
            pid,
            tid: pid,
            ..Sample::default()
        }))
    }
    fn fork(pid: i32, ppid: i32, tid: i32) -> Event {
        at(EventKind::Fork {
            pid,
            ppid,
            tid,
            ptid: ppid,
        })
    }
    fn exec(pid: i32) -> Event {
        at(EventKind::Comm {
            pid,
            tid: pid,
            name: "prog".into(),
            exec: true,
        })
    }

    #[test]
    fn a_launched_command_is_followed_from_its_exec_with_its_children() {
        let mut f = Followed::from_exec(10);
        assert!(!f.keep(&sample(10)), "sampler's own code before the exec");
        assert!(!f.keep(&sample(99)), "someone else");
        assert!(f.keep(&exec(10)));
        assert!(f.keep(&sample(10)));
        assert!(f.keep(&fork(10, 10, 11)), "a new thread");
        assert!(f.keep(&fork(12, 10, 12)), "a child process");
        assert!(f.keep(&sample(12)));
        assert!(f.keep(&fork(13, 12, 13)), "a grandchild");
        assert!(!f.keep(&fork(14, 99, 14)), "someone else's child");
        assert!(!f.keep(&sample(14)));
        assert!(f.keep(&sample(13)));
    }

    #[test]
    fn a_reused_pid_is_not_followed() {
        let mut f = Followed::processes(&[5]);
        assert!(f.keep(&fork(6, 5, 6)));
        assert!(f.keep(&at(EventKind::Exit { pid: 6, tid: 6 })));
        assert!(!f.keep(&fork(6, 1, 6)), "pid 6 again, started by init");
        assert!(!f.keep(&sample(6)));
        assert!(f.keep(&sample(5)));
        assert!(f.keep(&at(EventKind::Lost {
            count: 3,
            pid: None,
            tid: None
        })));
        let lost = |pid| {
            at(EventKind::Lost {
                count: 3,
                pid: Some(pid),
                tid: Some(pid),
            })
        };
        assert!(f.keep(&lost(5)));
        assert!(!f.keep(&lost(99)), "lost while someone else ran");
    }
}
