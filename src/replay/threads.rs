//! The processes and threads of a replay: created on first sight, named by their forks
//! and execs, ended by their exits, and made new when the kernel reuses a pid or tid.
//! Each thread collects its rows (on-CPU samples, off-CPU intervals) here until the
//! profile is finished. Kept apart from unwinding and interning, which only need to know
//! which thread a row belongs to.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::events::{EventKind, RecordingInfo, Sample, Scope};
use crate::profile::{
    OffCpuKind, Process, ProcessIndex, RawStackIndex, SampleRow, SampleWeight, Thread,
};

/// The pid of `kthreadd`, which starts every kernel thread.
const KTHREADD: i32 = 2;

/// The idle task of each CPU (pid 0), whose samples a whole-machine recording has.
const IDLE_PID: i32 = 0;

/// The tid the kernel writes for a thread past its exit: after its exit record, it is
/// unhashed and still runs a little (releasing its memory, its last switch away).
const GONE_TID: i32 = -1;

/// How long after a process's last event (its main thread's exit, or a sample of a
/// thread that outlived it) its unwinding state is kept: 500 ms. The threads of a
/// process that exits are killed together, and their last samples come within
/// milliseconds; a process whose other threads go on running (its main thread called
/// `pthread_exit`) keeps its state for as long as they are sampled.
pub(super) const EXITED_GRACE_NS: u64 = 500_000_000;

/// An interval off the CPU as a row of its thread: start, the stack it was left at, why,
/// and how long (ns).
pub(super) type OffCpuRow = (u64, RawStackIndex, OffCpuKind, u64);

/// Per-thread state while building; times in CLOCK_MONOTONIC ns.
pub(super) struct ThreadState {
    pub(super) tid: i32,
    pub(super) process: ProcessIndex,
    pub(super) name: String,
    start_ns: u64,
    pub(super) end_ns: Option<u64>,
    /// Time, stack and period of each sample.
    pub(super) samples: Vec<(u64, RawStackIndex, u64)>,
    /// Intervals off the CPU.
    pub(super) off_cpu: Vec<OffCpuRow>,
    lost_samples: u64,
}

pub(super) struct ProcessState {
    pub(super) pid: i32,
    pub(super) name: String,
    start_ns: u64,
    pub(super) end_ns: Option<u64>,
    /// A kernel thread (started by `kthreadd`, or the idle task): shown as `[kernel] NAME`.
    kernel: bool,
}

/// Every process and thread seen so far.
#[derive(Default)]
pub(super) struct Threads {
    pub(super) processes: Vec<ProcessState>,
    process_by_pid: HashMap<i32, ProcessIndex>,
    pub(super) threads: Vec<ThreadState>,
    thread_by_tid: HashMap<i32, usize>,
    /// Processes whose main thread has exited, with the time of their last event: what
    /// the unwinder holds of each (its mappings, the CFI and rules it looked up) is
    /// dropped once none has come for [`EXITED_GRACE_NS`]. A build runs hundreds of
    /// processes, and holding every one until the end was most of what recording one
    /// kept.
    exited: HashMap<i32, u64>,
    /// Per process, the thread whose exit came last (its pid and tid), and under
    /// [`GONE_TID`] the last of all: whose records with tid [`GONE_TID`] are (see
    /// [`Threads::attribute`]).
    last_exit: HashMap<i32, (i32, i32)>,
}

impl Threads {
    /// The event as it is replayed, or `None` when it is skipped. A thread past its exit:
    /// its samples are the thread's of that process that exited last (of any process,
    /// when its pid is gone too); its last switch away (in do_task_dead) opens no
    /// off-CPU time.
    pub(super) fn attribute<'e>(&self, kind: &'e EventKind) -> Option<Cow<'e, EventKind>> {
        match kind {
            EventKind::Sample(s) if s.tid == GONE_TID => match self.last_exit.get(&s.pid) {
                Some(&(pid, tid)) => Some(Cow::Owned(EventKind::Sample(Sample {
                    pid,
                    tid,
                    ..s.clone()
                }))),
                None => Some(Cow::Borrowed(kind)),
            },
            EventKind::SwitchSample(s) if s.tid == GONE_TID => None,
            EventKind::SwitchOut { tid, .. } | EventKind::SwitchIn { tid, .. }
                if *tid == GONE_TID =>
            {
                None
            }
            kind => Some(Cow::Borrowed(kind)),
        }
    }

    /// Whether `tid` is a thread seen before.
    pub(super) fn knows(&self, tid: i32) -> bool {
        self.thread_by_tid.contains_key(&tid)
    }

    /// Process `pid` executed a new program: no longer a kernel thread, nor exited.
    pub(super) fn exec(&mut self, pid: i32) {
        if let Some(&p) = self.process_by_pid.get(&pid) {
            self.processes[p.index()].kernel = false;
        }
        self.exited.remove(&pid);
    }

    /// Thread `tid` of process `pid` is called `name` from `time_ns` (and its process
    /// too, when it is the main thread).
    pub(super) fn named(&mut self, time_ns: u64, pid: i32, tid: i32, name: &str) {
        let th = self.thread(pid, tid, time_ns, None);
        self.threads[th].name = name.to_string();
        if pid == tid {
            let p = self.threads[th].process;
            self.processes[p.index()].name = name.to_string();
        }
    }

    /// The kernel forked task `tid` of process `pid` from task `ptid` of process `ppid`.
    /// Whether the task is a new process.
    pub(super) fn fork(&mut self, time_ns: u64, pid: i32, ppid: i32, tid: i32, ptid: i32) -> bool {
        let new_process = pid == tid && pid != ppid;
        if new_process {
            // Perhaps under the pid of one that exited.
            self.exited.remove(&pid);
        }
        self.reused(pid, tid);
        let parent_name = self
            .thread_by_tid
            .get(&ptid)
            .map(|&th| self.threads[th].name.clone());
        let th = self.thread(pid, tid, time_ns, parent_name.as_deref());
        if pid == tid && (ppid == KTHREADD || pid == KTHREADD) {
            let p = self.threads[th].process;
            self.processes[p.index()].kernel = true;
        }
        new_process
    }

    /// Thread `tid` of process `pid` exited at `time_ns`.
    pub(super) fn exit(&mut self, time_ns: u64, pid: i32, tid: i32) {
        self.last_exit.insert(pid, (pid, tid));
        self.last_exit.insert(GONE_TID, (pid, tid));
        if let Some(&th) = self.thread_by_tid.get(&tid) {
            self.threads[th].end_ns = Some(time_ns);
        }
        if pid == tid {
            if let Some(&p) = self.process_by_pid.get(&pid) {
                self.processes[p.index()].end_ns = Some(time_ns);
            }
            self.exited.insert(pid, time_ns);
        }
    }

    /// Something of process `pid` came at `time_ns`: if it exited, its state is kept
    /// longer.
    pub(super) fn heard_from(&mut self, pid: i32, time_ns: u64) {
        if let Some(last) = self.exited.get_mut(&pid) {
            *last = time_ns;
        }
    }

    /// `count` samples of thread `tid` (of process `pid`, when known) were lost.
    pub(super) fn lost(&mut self, time_ns: u64, count: u64, pid: Option<i32>, tid: i32) {
        let th = match (self.thread_by_tid.get(&tid), pid) {
            (Some(&th), _) => Some(th),
            // A thread of which nothing else has come yet.
            (None, Some(pid)) => Some(self.thread(pid, tid, time_ns, None)),
            (None, None) => None,
        };
        if let Some(th) = th {
            self.threads[th].lost_samples += count;
        }
    }

    /// A new task `tid` of process `pid`, which the kernel forked: a pid or tid that was
    /// seen exiting before is another process's or thread's now (the kernel reuses them),
    /// which gets a track of its own rather than the old one's.
    fn reused(&mut self, pid: i32, tid: i32) {
        if let Some(&p) = self.process_by_pid.get(&pid) {
            if pid == tid && self.processes[p.index()].end_ns.is_some() {
                self.process_by_pid.remove(&pid);
            }
        }
        if let Some(&th) = self.thread_by_tid.get(&tid) {
            if self.threads[th].end_ns.is_some() {
                self.thread_by_tid.remove(&tid);
            }
        }
    }

    /// The thread `tid` of process `pid`, created (with its process) on first sight.
    pub(super) fn thread(&mut self, pid: i32, tid: i32, time_ns: u64, name: Option<&str>) -> usize {
        if let Some(&th) = self.thread_by_tid.get(&tid) {
            if self.process_by_pid.get(&pid) == Some(&self.threads[th].process) {
                return th;
            }
        }
        let process = match self.process_by_pid.get(&pid) {
            Some(&p) => p,
            None => {
                let p = ProcessIndex::new(self.processes.len());
                let process_name = name.map_or_else(|| format!("pid {pid}"), str::to_string);
                self.processes.push(ProcessState {
                    pid,
                    name: match pid {
                        IDLE_PID => "swapper".to_string(),
                        _ => process_name,
                    },
                    start_ns: time_ns,
                    end_ns: None,
                    kernel: pid == IDLE_PID,
                });
                self.process_by_pid.insert(pid, p);
                p
            }
        };
        let name = name.map_or_else(
            || self.processes[process.index()].name.clone(),
            str::to_string,
        );
        self.threads.push(ThreadState {
            tid,
            process,
            name,
            start_ns: time_ns,
            end_ns: None,
            samples: Vec::new(),
            lost_samples: 0,
            off_cpu: Vec::new(),
        });
        self.thread_by_tid.insert(tid, self.threads.len() - 1);
        self.threads.len() - 1
    }

    /// The off-CPU rows of the thread now called `tid`, if it is known.
    pub(super) fn off_cpu_rows(&mut self, tid: i32) -> Option<&mut Vec<OffCpuRow>> {
        let &th = self.thread_by_tid.get(&tid)?;
        Some(&mut self.threads[th].off_cpu)
    }

    /// Takes the processes that exited, and of which nothing has come since,
    /// [`EXITED_GRACE_NS`] before `now`: each one's pid and the tids of its threads, whose
    /// unwinding state can go.
    pub(super) fn take_gone(&mut self, now: u64) -> Vec<(i32, Vec<i32>)> {
        let gone: Vec<i32> = self
            .exited
            .iter()
            .filter(|&(_, &last)| last.saturating_add(EXITED_GRACE_NS) < now)
            .map(|(&pid, _)| pid)
            .collect();
        gone.into_iter()
            .map(|pid| {
                self.exited.remove(&pid);
                let tids: Vec<i32> = match self.process_by_pid.get(&pid) {
                    Some(&p) => self
                        .threads
                        .iter()
                        .filter(|t| t.process == p)
                        .map(|t| t.tid)
                        .collect(),
                    None => Vec::new(),
                };
                (pid, tids)
            })
            .collect()
    }

    /// The profile's processes and threads, times in ms since `info.start_ns`. Only
    /// threads with rows (or lost samples) are kept, and their processes: a whole machine
    /// has hundreds of threads that did not run while it was recorded, and a program that
    /// starts threads of 0.2 ms (`churn`) has thousands that no sample met (15,800 of
    /// 18,700 in 2 s), which made a profile the Firefox Profiler ran out of memory on.
    /// A recorded process keeps its main thread's track even without a row.
    pub(super) fn into_tables(
        mut self,
        info: &RecordingInfo,
    ) -> (Vec<Process>, Vec<Thread<RawStackIndex>>) {
        self.take_tables(info)
    }

    /// The tables of [`Threads::into_tables`], taking the threads' rows: the threads stay,
    /// with none, for what comes next (the next window of a continuous recording).
    pub(super) fn take_tables(
        &mut self,
        info: &RecordingInfo,
    ) -> (Vec<Process>, Vec<Thread<RawStackIndex>>) {
        let ms = |ns: u64| ns.saturating_sub(info.start_ns) as f64 / 1e6;
        let processes_seen = &self.processes;
        let shown = |t: &ThreadState| {
            let ran = !t.samples.is_empty() || !t.off_cpu.is_empty() || t.lost_samples > 0;
            let main = processes_seen[t.process.index()].pid == t.tid;
            ran || (main && info.scope != Scope::System)
        };
        let mut new_index: Vec<Option<ProcessIndex>> = vec![None; self.processes.len()];
        let mut processes = Vec::new();
        for t in self.threads.iter().filter(|t| shown(t)) {
            let slot = &mut new_index[t.process.index()];
            if slot.is_none() {
                let p = &self.processes[t.process.index()];
                *slot = Some(ProcessIndex::new(processes.len()));
                processes.push(Process {
                    pid: p.pid,
                    name: shown_name(p.kernel, &p.name),
                    start_ms: ms(p.start_ns),
                    end_ms: p.end_ns.map(ms),
                });
            }
        }
        let mut threads = Vec::new();
        for t in self.threads.iter_mut() {
            let Some(process) = new_index[t.process.index()].filter(|_| shown(t)) else {
                continue;
            };
            let kernel = self.processes[t.process.index()].kernel;
            let rows = rows_in_time_order(
                std::mem::take(&mut t.samples),
                std::mem::take(&mut t.off_cpu),
                info.period.is_none(),
            );
            threads.push(Thread {
                tid: t.tid,
                process,
                is_main: processes[process.index()].pid == t.tid,
                name: shown_name(kernel, &t.name),
                start_ms: ms(t.start_ns),
                end_ms: t.end_ns.map(ms),
                lost_samples: std::mem::take(&mut t.lost_samples),
                samples: rows
                    .map(|(time, stack, weight)| SampleRow {
                        time_ms: ms(time),
                        stack,
                        weight,
                    })
                    .collect(),
            });
        }
        (processes, threads)
    }

    /// Forgets the threads that ended before `before_ns` (and the processes left without
    /// one): a whole machine recorded for hours sees millions of short-lived tasks, of
    /// which only those alive matter to what comes next. Called between windows, when no
    /// thread holds rows.
    pub(super) fn forget_ended(&mut self, before_ns: u64) {
        let ended = |end: Option<u64>| end.is_some_and(|t| t < before_ns);
        let old_threads = std::mem::take(&mut self.threads);
        let mut live_process = vec![false; self.processes.len()];
        for t in &old_threads {
            if !ended(t.end_ns) {
                live_process[t.process.index()] = true;
            }
        }
        let mut new_index: Vec<Option<ProcessIndex>> = vec![None; self.processes.len()];
        let old_processes = std::mem::take(&mut self.processes);
        for (i, p) in old_processes.into_iter().enumerate() {
            if live_process[i] || !ended(p.end_ns) {
                new_index[i] = Some(ProcessIndex::new(self.processes.len()));
                self.processes.push(p);
            }
        }
        for mut t in old_threads {
            if let (false, Some(p)) = (ended(t.end_ns), new_index[t.process.index()]) {
                t.process = p;
                self.threads.push(t);
            }
        }
        self.process_by_pid = self
            .processes
            .iter()
            .enumerate()
            .map(|(i, p)| (p.pid, ProcessIndex::new(i)))
            .collect();
        self.thread_by_tid = self
            .threads
            .iter()
            .enumerate()
            .map(|(i, t)| (t.tid, i))
            .collect();
        // The last exits of processes forgotten: a machine's pids come and go by the
        // million over days.
        let known = &self.process_by_pid;
        self.last_exit
            .retain(|pid, _| *pid == GONE_TID || known.contains_key(pid));
    }
}

/// The name a process or thread is shown by: `[kernel] NAME` for the kernel's.
fn shown_name(kernel: bool, name: &str) -> String {
    match kernel {
        true => format!("[kernel] {name}"),
        false => name.to_string(),
    }
}

/// A thread's samples and off-CPU intervals as rows in time order (an interval at its
/// start; an on-CPU sample before an interval of the same time); a sample weighs its
/// period when `by_period` (the period varied), else it is one sample.
fn rows_in_time_order(
    samples: Vec<(u64, RawStackIndex, u64)>,
    off_cpu: Vec<OffCpuRow>,
    by_period: bool,
) -> impl Iterator<Item = (u64, RawStackIndex, SampleWeight)> {
    let mut off: Vec<(u64, RawStackIndex, SampleWeight)> = off_cpu
        .into_iter()
        .map(|(t, stack, kind, ns)| (t, stack, SampleWeight::OffCpu { kind, ns }))
        .collect();
    off.sort_by_key(|r| r.0);
    let mut on = samples
        .into_iter()
        .map(move |(t, stack, period)| {
            let weight = if by_period { period } else { 1 };
            (t, stack, SampleWeight::OnCpu(weight))
        })
        .peekable();
    let mut off = off.into_iter().peekable();
    std::iter::from_fn(move || match (on.peek(), off.peek()) {
        (Some(a), Some(b)) if a.0 <= b.0 => on.next(),
        (Some(_), Some(_)) => off.next(),
        (Some(_), None) => on.next(),
        (None, _) => off.next(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::tests::{at, exec, fork, sample};
    use crate::replay::ProfileBuilder;
    use crate::unwind::UnwindMode;

    /// Each thread's (pid, process name, thread name, samples).
    fn threads(b: &ProfileBuilder) -> Vec<(i32, String, String, usize)> {
        b.threads
            .threads
            .iter()
            .map(|t| {
                let p = &b.threads.processes[t.process.index()];
                (p.pid, p.name.clone(), t.name.clone(), t.samples.len())
            })
            .collect()
    }

    #[test]
    fn a_reused_pid_or_tid_is_a_new_process_or_thread() {
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        b.add_events(&[
            fork(1, 10, 10),
            exec(2, 10, "first"),
            fork(3, 10, 11),
            sample(4, 10, 10),
            sample(5, 10, 11),
            at(6, EventKind::Exit { pid: 10, tid: 11 }),
            at(7, EventKind::Exit { pid: 10, tid: 10 }),
            // Pid 10 again, another program; its second thread takes tid 11 again.
            fork(8, 10, 10),
            exec(9, 10, "second"),
            fork(10, 10, 11),
            sample(11, 10, 10),
            sample(12, 10, 11),
            sample(13, 10, 11),
        ]);
        let first = |thread: &str, n| (10, "first".to_string(), thread.to_string(), n);
        let second = |thread: &str, n| (10, "second".to_string(), thread.to_string(), n);
        assert_eq!(
            threads(&b),
            vec![
                first("first", 1),
                first("first", 1),
                second("second", 1),
                second("second", 2)
            ]
        );
        let processes = &b.threads.processes;
        assert_eq!(processes.len(), 2);
        assert!(processes[0].end_ns == Some(7) && processes[1].end_ns.is_none());
    }

    #[test]
    fn a_task_described_twice_stays_one_thread() {
        // `-a` describes a process that the kernel's fork record names too.
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        b.add_events(&[fork(1, 10, 10), fork(2, 10, 10), sample(3, 10, 10)]);
        assert_eq!(threads(&b).len(), 1);
    }

    #[test]
    fn a_sample_past_a_threads_exit_is_the_last_exited_threads() {
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        b.add_events(&[
            fork(1, 10, 10),
            exec(2, 10, "main"),
            fork(3, 10, 11),
            fork(4, 20, 20),
            at(5, EventKind::Exit { pid: 10, tid: 11 }),
            at(6, EventKind::Exit { pid: 20, tid: 20 }),
            // Pid 10 is still there: its thread 11 exited last.
            sample(7, 10, GONE_TID),
            // Its pid is gone too: the last thread to exit at all was 20's.
            sample(8, GONE_TID, GONE_TID),
        ]);
        let samples: Vec<(i32, usize)> = b
            .threads
            .threads
            .iter()
            .map(|t| (t.tid, t.samples.len()))
            .collect();
        assert_eq!(samples, [(10, 0), (11, 1), (20, 1)]);
    }

    #[test]
    fn the_last_exits_of_forgotten_processes_are_forgotten_too() {
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        let mut events = Vec::new();
        for pid in 100..200 {
            let t = pid as u64 * 10;
            events.push(fork(t, pid, pid));
            events.push(at(t + 1, EventKind::Exit { pid, tid: pid }));
        }
        events.push(fork(5000, 300, 300));
        b.add_events(&events);
        assert_eq!(b.threads.last_exit.len(), 101);
        b.threads.forget_ended(4000);
        // Process 300 lives; the last exit of all (199's) is kept under GONE_TID.
        assert_eq!(b.threads.process_by_pid.len(), 1);
        assert_eq!(
            b.threads.last_exit.keys().copied().collect::<Vec<i32>>(),
            [GONE_TID]
        );
    }

    #[test]
    fn kernel_threads_and_lost_samples_are_noted() {
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        let kthread = EventKind::Fork {
            pid: 50,
            ppid: KTHREADD,
            tid: 50,
            ptid: KTHREADD,
        };
        let lost = |pid, tid| EventKind::Lost {
            count: 3,
            pid,
            tid: Some(tid),
        };
        b.add_events(&[
            at(1, kthread),
            at(2, lost(Some(60), 61)),
            at(3, lost(None, 61)),
            // Nothing is known of 70: its losses are nobody's.
            at(4, lost(None, 70)),
        ]);
        let t = &b.threads;
        assert!(t.processes[0].kernel && !t.processes[1].kernel);
        let lost: Vec<(i32, u64)> = t.threads.iter().map(|t| (t.tid, t.lost_samples)).collect();
        assert_eq!(lost, [(50, 0), (61, 6)]);
    }
}
