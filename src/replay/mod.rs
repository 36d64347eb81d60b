//! Replay: from recorded events to a [`RawProfile`], incrementally. Events are fed in time order
//! (while the command still runs), each process's library map and each thread's name are
//! kept current, every sample is unwound and its stack interned at once, and the sample's
//! raw material (registers, stack copy) is dropped. Memory then grows with the number of
//! unique stacks, not with the number of samples.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

mod capture;

use capture::Capture;

use crate::binary::Binary;
use crate::events::{Event, EventKind, Mapping, Recording, RecordingInfo, Sample, Scope};
use crate::locate::{FileFinder, MappedFile};
use crate::maps::Region;
use crate::offcpu::{OffCpuInterval, OffCpuKind, OffCpuTracker};
use crate::profile::*;
use crate::unwind::{
    CodeAddress, CodeModule, FileCode, ProcessMemory, TruncatedBy, Truncation, UnwindMode, Unwinder,
};

/// Kernel addresses are the upper half of the x86-64 address space. Kernel frames are
/// made relative to this when the kernel's text start is unknown (kallsyms hidden), which
/// keeps them below 2^53, exact in JSON numbers.
const KERNEL_SPACE_START: u64 = 0xffff_8000_0000_0000;

/// What one mapping of a process was resolved to, once, when it was mapped.
#[derive(Clone, Copy, Debug)]
struct Module {
    lib: Option<LibIndex>,
    translate: Translate,
}

/// How an address in a mapping becomes an address of its library.
#[derive(Clone, Copy, Debug)]
enum Translate {
    /// JIT code: the absolute address is what the perf map names.
    Absolute,
    /// The file could not be read: addresses stay file offsets.
    FileOffset,
    /// The file's own address of a byte is its file offset plus this, inside the segment
    /// the mapping shows.
    Delta(i64),
}

/// The file behind a library, or why there is none.
pub type LibFile = Result<Arc<Binary>, String>;

/// Per-thread state while building; times in CLOCK_MONOTONIC ns.
struct ThreadState {
    tid: i32,
    process: ProcessIndex,
    name: String,
    start_ns: u64,
    end_ns: Option<u64>,
    /// Time, stack and period of each sample.
    samples: Vec<(u64, RawStackIndex, u64)>,
    /// Intervals off the CPU: start, the stack it was left at, why, and how long (ns).
    off_cpu: Vec<(u64, RawStackIndex, OffCpuKind, u64)>,
    lost_samples: u64,
}

/// Off-CPU time while it is recorded (`--off-cpu`).
struct OffCpu {
    /// Created at the first event: its time is the start of the recording.
    tracker: Option<OffCpuTracker<RawStackIndex>>,
    /// The stack of every `switch_period`th switch out was taken.
    switch_period: u64,
    /// Per thread, the off-CPU time (ns) of intervals without a stack, by kind, when
    /// not every switch's stack is taken: shared out at the end over the thread's
    /// intervals of that kind with a stack, in proportion to their durations.
    unstacked: HashMap<i32, [u64; 2]>,
}

struct ProcessState {
    pid: i32,
    name: String,
    start_ns: u64,
    end_ns: Option<u64>,
    /// A kernel thread (started by `kthreadd`, or the idle task): shown as `[kernel] NAME`.
    kernel: bool,
}

/// The pid of `kthreadd`, which starts every kernel thread.
const KTHREADD: i32 = 2;

/// The idle task of each CPU (pid 0), whose samples a whole-machine recording has.
const IDLE_PID: i32 = 0;

/// The raw profile and, for each of its libraries, the file that was verified to be the
/// one that was mapped (the same inode), for the symbolicator to use.
pub struct Built {
    pub profile: RawProfile,
    pub lib_binaries: Vec<LibFile>,
    /// The truncated stacks by cause.
    pub truncated: TruncatedBy,
    /// The JIT dump each process mapped, by the path of its perf map (see
    /// [`crate::symbolicate::SymbolOptions::jit_dumps`]).
    pub jit_dumps: HashMap<String, std::path::PathBuf>,
    /// The user each process with JIT code ran as, by the path of its perf map (see
    /// [`crate::symbolicate::SymbolOptions::jit_users`]).
    pub jit_users: HashMap<String, u32>,
    /// The library of the outermost frame of stacks cut by code without unwind rules,
    /// with their counts, most first (what the summary names).
    pub no_unwind_info_in: Vec<(String, u64)>,
}

/// Builds a raw profile from events fed in time order.
pub struct ProfileBuilder {
    files: FileFinder,
    /// Whether a sample had a frame in the kernel's half of the address space.
    kernel_frames: bool,
    /// Every process's maps, each mapping resolved to its [`Module`] once, and the
    /// unwinding of their samples.
    unwinder: Unwinder<Module>,
    libs: Interner<Lib, LibIndex>,
    lib_binaries: Vec<LibFile>,
    frames: Interner<AddressFrame, AddressFrameIndex>,
    stacks: Interner<RawStack, RawStackIndex>,
    processes: Vec<ProcessState>,
    process_by_pid: HashMap<i32, ProcessIndex>,
    threads: Vec<ThreadState>,
    thread_by_tid: HashMap<i32, usize>,
    truncated: TruncatedBy,
    jit_dumps: HashMap<String, std::path::PathBuf>,
    jit_users: HashMap<String, u32>,
    /// Each process's JIT dump as read so far while recording: its path and how many bytes
    /// of it were read.
    jit_tails: HashMap<i32, (std::path::PathBuf, u64)>,
    /// Stacks cut by code without unwind rules, by the library of their outermost frame.
    no_unwind_info_in: HashMap<Option<LibIndex>, u64>,
    restored_callers: u64,
    capture: Option<Capture>,
    /// Each thread's last user stack, so that the next sample of that thread interns
    /// only the frames past what the two share (a 2,000-deep recursion shares nearly all
    /// of them, and interning each frame was most of the cost of recording it).
    last_stacks: HashMap<i32, LastStack>,
    /// Counts the changes of every process's code mappings: what a shared prefix was
    /// interned as holds only while the addresses resolve as they did.
    map_generation: u64,
    /// Off-CPU time, when it is recorded.
    off_cpu: Option<OffCpu>,
    /// Processes whose main thread has exited, with the time of their last event: what
    /// the unwinder holds of each (its mappings, the CFI and rules it looked up) is
    /// dropped once none has come for [`EXITED_GRACE_NS`]. A build runs hundreds of
    /// processes, and holding every one until the end was most of what recording one
    /// kept.
    exited: HashMap<i32, u64>,
    /// Per process, the thread whose exit came last (its pid and tid), and under
    /// [`GONE_TID`] the last of all: whose records with tid [`GONE_TID`] are (see
    /// [`ProfileBuilder::add_events`]).
    last_exit: HashMap<i32, (i32, i32)>,
}

/// The tid the kernel writes for a thread past its exit: after its exit record, it is
/// unhashed and still runs a little (releasing its memory, its last switch away).
const GONE_TID: i32 = -1;

/// How long after a process's last event (its main thread's exit, or a sample of a
/// thread that outlived it) its unwinding state is kept: 500 ms. The threads of a
/// process that exits are killed together, and their last samples come within
/// milliseconds; a process whose other threads go on running (its main thread called
/// `pthread_exit`) keeps its state for as long as they are sampled.
const EXITED_GRACE_NS: u64 = 500_000_000;

/// A thread's last sampled user stack (see [`ProfileBuilder::sample`]).
#[derive(Default)]
struct LastStack {
    pid: i32,
    map_generation: u64,
    /// Whether it began with the truncation marker.
    marked: bool,
    /// Its user frames, outermost first, and the stack each one ends.
    frames: Vec<CodeAddress>,
    stacks: Vec<RawStackIndex>,
}

/// Builds the raw profile of a whole recording at once (see [`ProfileBuilder`]).
pub fn build(recording: &Recording, kernel_base: Option<u64>) -> Built {
    let mut b = ProfileBuilder::new(UnwindMode::Fp);
    b.add_events(&recording.events);
    b.finish(&recording.info, kernel_base)
}

impl ProfileBuilder {
    /// `mode` says how user stacks are unwound.
    pub fn new(mode: UnwindMode) -> ProfileBuilder {
        ProfileBuilder::with_unwinder(Unwinder::new(mode))
    }

    /// A builder for a live recording: the unwinder reads the recorded processes' memory
    /// (their JIT code, the bottoms of their stacks).
    pub fn live(mode: UnwindMode, memory: Box<dyn ProcessMemory>) -> ProfileBuilder {
        ProfileBuilder::with_unwinder(Unwinder::with_memory(mode, memory))
    }

    fn with_unwinder(unwinder: Unwinder<Module>) -> ProfileBuilder {
        ProfileBuilder {
            files: FileFinder::default(),
            kernel_frames: false,
            unwinder,
            libs: Interner::default(),
            lib_binaries: Vec::new(),
            frames: Interner::default(),
            stacks: Interner::default(),
            processes: Vec::new(),
            process_by_pid: HashMap::new(),
            threads: Vec::new(),
            thread_by_tid: HashMap::new(),
            truncated: TruncatedBy::default(),
            jit_dumps: HashMap::new(),
            jit_users: HashMap::new(),
            jit_tails: HashMap::new(),
            no_unwind_info_in: HashMap::new(),
            restored_callers: 0,
            last_stacks: HashMap::new(),
            exited: HashMap::new(),
            last_exit: HashMap::new(),
            map_generation: 0,
            capture: None,
            off_cpu: None,
        }
    }

    /// Also builds off-CPU time from the context switches in the events (a recording
    /// with `--off-cpu`, taking the stack of every `switch_period`th switch out).
    pub fn record_off_cpu(&mut self, switch_period: u64) {
        self.off_cpu = Some(OffCpu {
            tracker: None,
            switch_period: switch_period.max(1),
            unstacked: HashMap::new(),
        });
    }

    /// Also writes an unwinder fixture of the first samples to `path` (see
    /// `replay::capture`) when the profile is finished.
    pub fn capture_samples(&mut self, path: std::path::PathBuf) {
        self.capture = Some(Capture::new(path));
    }

    /// Replays `events`, which come after every event fed before, in time order.
    pub fn add_events(&mut self, events: &[Event]) {
        self.read_jit_dumps();
        if let (Some(off), Some(first)) = (&mut self.off_cpu, events.first()) {
            off.tracker
                .get_or_insert_with(|| OffCpuTracker::new(first.time_ns, []));
        }
        for event in events {
            let t = event.time_ns;
            // A thread past its exit: its samples are the thread's of that process that
            // exited last (of any process, when its pid is gone too); its last switch
            // away (in do_task_dead) opens no off-CPU time.
            let named;
            let kind = match &event.kind {
                EventKind::Sample(s) if s.tid == GONE_TID => match self.last_exit.get(&s.pid) {
                    Some(&(pid, tid)) => {
                        named = EventKind::Sample(Sample {
                            pid,
                            tid,
                            ..s.clone()
                        });
                        &named
                    }
                    None => &event.kind,
                },
                EventKind::SwitchSample(s) if s.tid == GONE_TID => continue,
                EventKind::SwitchOut { tid, .. } | EventKind::SwitchIn { tid, .. }
                    if *tid == GONE_TID =>
                {
                    continue
                }
                kind => kind,
            };
            match kind {
                EventKind::Mmap(m) if m.executable => self.map(m),
                EventKind::Mmap(_) => {}
                EventKind::Comm {
                    pid,
                    tid,
                    name,
                    exec,
                } => {
                    if *exec {
                        if let Some(&p) = self.process_by_pid.get(pid) {
                            self.processes[p.index()].kernel = false;
                        }
                        self.exited.remove(pid);
                        self.unwinder.exec(*pid);
                        self.map_generation += 1;
                    }
                    let new = !self.thread_by_tid.contains_key(tid);
                    let th = self.thread(*pid, *tid, t, None);
                    self.threads[th].name = name.clone();
                    // A thread described as it was when `-p` attached, at the start.
                    if let Some(tracker) = self.off_cpu.as_mut().and_then(|o| o.tracker.as_mut()) {
                        if new && !*exec && t <= tracker.start_ns() {
                            tracker.existed_at_start(*tid);
                        }
                    }
                    if pid == tid {
                        let p = self.threads[th].process;
                        self.processes[p.index()].name = name.clone();
                    }
                }
                EventKind::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                } => {
                    if pid == tid && pid != ppid {
                        // A new process (perhaps under the pid of one that exited).
                        self.exited.remove(pid);
                        self.unwinder.fork(*ppid, *pid);
                    }
                    self.reused(*pid, *tid);
                    self.last_stacks.remove(tid);
                    if let Some(tracker) = self.tracker() {
                        tracker.born(*tid);
                    }
                    let parent_name = self
                        .thread_by_tid
                        .get(ptid)
                        .map(|&th| self.threads[th].name.clone());
                    let th = self.thread(*pid, *tid, t, parent_name.as_deref());
                    if pid == tid && (*ppid == KTHREADD || *pid == KTHREADD) {
                        let p = self.threads[th].process;
                        self.processes[p.index()].kernel = true;
                    }
                }
                EventKind::Exit { pid, tid } => {
                    self.last_exit.insert(*pid, (*pid, *tid));
                    self.last_exit.insert(GONE_TID, (*pid, *tid));
                    self.last_stacks.remove(tid);
                    if let Some(tracker) = self.tracker() {
                        tracker.exit(*tid, t);
                    }
                    if let Some(&th) = self.thread_by_tid.get(tid) {
                        self.threads[th].end_ns = Some(t);
                    }
                    if pid == tid {
                        if let Some(&p) = self.process_by_pid.get(pid) {
                            self.processes[p.index()].end_ns = Some(t);
                        }
                        self.exited.insert(*pid, t);
                    }
                }
                EventKind::Sample(s) => {
                    if let Some(last) = self.exited.get_mut(&s.pid) {
                        *last = t;
                    }
                    if let Some(tracker) = self.tracker() {
                        tracker.ran(s.tid, t);
                    }
                    self.sample(t, s)
                }
                EventKind::SwitchSample(s) => {
                    if let Some(last) = self.exited.get_mut(&s.pid) {
                        *last = t;
                    }
                    self.thread(s.pid, s.tid, t, None);
                    if self.off_cpu.is_some() {
                        if let Some(stack) = self.stack_of(s) {
                            if let Some(tracker) = self.tracker() {
                                tracker.switch_out_stack(s.tid, t, stack);
                            }
                        }
                    }
                }
                EventKind::SwitchOut {
                    pid,
                    tid,
                    preempted,
                } => {
                    self.thread(*pid, *tid, t, None);
                    if let Some(tracker) = self.tracker() {
                        tracker.switch_out(*tid, t, *preempted);
                    }
                }
                EventKind::SwitchIn { pid, tid } => {
                    self.thread(*pid, *tid, t, None);
                    if let Some(tracker) = self.tracker() {
                        tracker.switch_in(*tid, t);
                    }
                }
                EventKind::Lost {
                    count,
                    pid,
                    tid: Some(tid),
                } => {
                    let th = match (self.thread_by_tid.get(tid), pid) {
                        (Some(&th), _) => Some(th),
                        // A thread of which nothing else has come yet.
                        (None, Some(pid)) => Some(self.thread(*pid, *tid, t, None)),
                        (None, None) => None,
                    };
                    if let Some(th) = th {
                        self.threads[th].lost_samples += count;
                    }
                }
                EventKind::Lost { tid: None, .. } | EventKind::Throttle => {}
            }
        }
        if let Some(last) = events.last() {
            self.forget_exited(last.time_ns);
        }
        let done = match self.tracker() {
            Some(tracker) => tracker.take_done(),
            None => Vec::new(),
        };
        for interval in done {
            self.add_off_cpu(interval);
        }
    }

    fn tracker(&mut self) -> Option<&mut OffCpuTracker<RawStackIndex>> {
        self.off_cpu.as_mut()?.tracker.as_mut()
    }

    /// One interval off the CPU becomes a row of its thread. Without a stack: when not
    /// every switch's stack is taken, its time is shared out at the end (see
    /// [`OffCpu::unstacked`]); else (a lost sample, a thread blocked since before `-p`
    /// attached) it is shown under the unknown-stack marker.
    fn add_off_cpu(&mut self, interval: OffCpuInterval<RawStackIndex>) {
        let start = self.start_of_tracking();
        let Some(off) = &mut self.off_cpu else {
            return;
        };
        let kind = interval.kind.unwrap_or(OffCpuKind::Blocked);
        let ns = interval.duration_ns();
        let stack = match interval.stack {
            Some(stack) => stack,
            None if off.switch_period > 1 && interval.start_ns > start => {
                off.unstacked.entry(interval.tid).or_default()[kind.index()] += ns;
                return;
            }
            None => self.unknown_off_cpu_stack(),
        };
        if ns == 0 {
            return;
        }
        if let Some(&th) = self.thread_by_tid.get(&interval.tid) {
            self.threads[th]
                .off_cpu
                .push((interval.start_ns, stack, kind, ns));
        }
    }

    fn start_of_tracking(&self) -> u64 {
        self.off_cpu
            .as_ref()
            .and_then(|o| o.tracker.as_ref())
            .map_or(0, |t| t.start_ns())
    }

    /// The stack of off-CPU time whose stack is unknown: the marker frame alone.
    fn unknown_off_cpu_stack(&mut self) -> RawStackIndex {
        let marker = AddressFrame {
            lib: None,
            address: UNKNOWN_OFF_CPU_MARKER_ADDRESS,
            kind: CodeKind::Marker,
        };
        let frame = self.frames.intern(marker, AddressFrameIndex::new);
        self.stacks.intern(
            RawStack {
                prefix: None,
                frame,
            },
            RawStackIndex::new,
        )
    }

    /// Drops the unwinding state of the processes that exited, and of which nothing has
    /// come since, [`EXITED_GRACE_NS`] before `now`.
    fn forget_exited(&mut self, now: u64) {
        let gone: Vec<i32> = self
            .exited
            .iter()
            .filter(|&(_, &last)| last.saturating_add(EXITED_GRACE_NS) < now)
            .map(|(&pid, _)| pid)
            .collect();
        for pid in gone {
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
            for tid in &tids {
                self.last_stacks.remove(tid);
            }
            self.unwinder.forget(pid, &tids);
        }
    }

    /// Reads what the JIT dumps gained since they were last read, and gives the
    /// unwinder the CFI they hold for their code. The JIT writes a record before the code
    /// runs, so the records of code that the events' samples ran in are there.
    fn read_jit_dumps(&mut self) {
        for (&pid, (path, offset)) in &mut self.jit_tails {
            let user = self.jit_users.get(&perf_map_path(pid)).copied();
            let Ok(data) = crate::jitdump::read_from(path, *offset, user) else {
                continue;
            };
            let (found, used) = crate::jitdump::unwind_records(&data, *offset == 0);
            *offset += used as u64;
            for jit in found {
                self.unwinder
                    .add_jit_cfi(pid, jit.code, &jit.eh_frame, &jit.eh_frame_hdr);
            }
        }
    }

    /// Whether any sample had kernel frames (so the kernel's symbols are needed).
    pub fn has_kernel_frames(&self) -> bool {
        self.kernel_frames
    }

    /// The raw profile; times become milliseconds since `info.start_ns`. Kernel frames
    /// are kept as absolute addresses until now; they become relative to `kernel_base`,
    /// the kernel's text start (from kallsyms, read once after recording), or to the
    /// start of the kernel's half of the address space when it is unknown.
    pub fn finish(mut self, info: &RecordingInfo, kernel_base: Option<u64>) -> Built {
        self.finish_off_cpu(info.end_ns, info.scope);
        self.relocate_kernel_frames(kernel_base.unwrap_or(KERNEL_SPACE_START));
        // Unwinding is over: what it read of each file's CFI goes (the files stay, for
        // naming).
        for binary in self.lib_binaries.iter().flatten() {
            if let Some(lazy) = &binary.unwind.lazy {
                lazy.forget_pieces();
            }
        }
        if let Some(capture) = self.capture.take() {
            if let Err(e) = capture.write() {
                say!("sampler: could not write the sample capture: {e}");
            }
        }
        let ms = |ns: u64| ns.saturating_sub(info.start_ns) as f64 / 1e6;
        // A whole machine has hundreds of threads that did not run while it was
        // recorded: only those with samples are kept, and their processes.
        let shown = |t: &ThreadState| {
            info.scope != Scope::System || !t.samples.is_empty() || !t.off_cpu.is_empty()
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
        let threads = self
            .threads
            .into_iter()
            .filter(|t| shown(t))
            .map(|t| {
                let process = new_index[t.process.index()].expect("numbered above");
                let kernel = self.processes[t.process.index()].kernel;
                Thread {
                    tid: t.tid,
                    process,
                    is_main: processes[process.index()].pid == t.tid,
                    name: shown_name(kernel, &t.name),
                    start_ms: ms(t.start_ns),
                    end_ms: t.end_ns.map(ms),
                    lost_samples: t.lost_samples,
                    samples: rows_in_time_order(t.samples, t.off_cpu, info.period.is_none())
                        .map(|(time, stack, weight)| SampleRow {
                            time_ms: ms(time),
                            stack,
                            weight,
                        })
                        .collect(),
                }
            })
            .collect();
        let profile = RawProfile {
            meta: Meta {
                start_unix_ms: info.start_unix_ms,
                // What a sample stands for in time: its period for a time event, else
                // the frequency's interval (1 ms for a fixed period of a counting event,
                // which stands for no time at all).
                interval_ms: match (info.event.is_time(), info.period, info.frequency_hz) {
                    (true, Some(ns), _) => ns as f64 / 1e6,
                    (_, _, 0) => 1.0,
                    (_, _, hz) => 1000.0 / hz as f64,
                },
                duration_ms: ms(info.end_ns),
                event: info.event.name().to_string(),
                frequency_hz: info.frequency_hz,
                period: info.period,
                command: info.command.clone(),
                lost_samples: info.lost_samples,
                throttled: info.throttled,
                kernel_included: info.kernel_included,
                truncated_stacks: self.truncated.total(),
                restored_callers: self.restored_callers,
                logical_cpus: info.logical_cpus,
                off_cpu: self.off_cpu.is_some() && info.off_cpu.recorded(),
            },
            libs: self.libs.items,
            address_frames: self.frames.items,
            stacks: self.stacks.items,
            processes,
            threads,
        };
        let mut no_unwind_info_in: Vec<(String, u64)> = self
            .no_unwind_info_in
            .into_iter()
            .map(|(lib, n)| {
                let name = lib.map_or("unknown code".to_string(), |l| {
                    profile.libs[l.index()].name.clone()
                });
                (name, n)
            })
            .collect();
        no_unwind_info_in.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Built {
            profile,
            lib_binaries: self.lib_binaries,
            truncated: self.truncated,
            jit_dumps: self.jit_dumps,
            jit_users: self.jit_users,
            no_unwind_info_in,
        }
    }

    /// Ends the off-CPU intervals still open at `end_ns` (the end of the recording),
    /// including those of threads asleep since before `-p` attached and never seen since
    /// (not for the whole machine, where they are most threads),
    /// and shares out the time of intervals without a stack (see [`OffCpu::unstacked`]).
    fn finish_off_cpu(&mut self, end_ns: u64, scope: Scope) {
        let start_ns = self.start_of_tracking();
        let Some(tracker) = self.tracker() else {
            return;
        };
        if scope == Scope::System {
            tracker.forget_unseen();
        }
        for interval in tracker.finish(end_ns) {
            self.add_off_cpu(interval);
        }
        let unstacked = self
            .off_cpu
            .as_mut()
            .map(|o| std::mem::take(&mut o.unstacked))
            .unwrap_or_default();
        let mut unstacked: Vec<(i32, [u64; 2])> = unstacked.into_iter().collect();
        unstacked.sort_unstable_by_key(|(tid, _)| *tid);
        for (tid, amounts) in unstacked {
            let Some(&th) = self.thread_by_tid.get(&tid) else {
                continue;
            };
            for (kind, extra) in OffCpuKind::ALL.into_iter().zip(amounts) {
                if extra == 0 {
                    continue;
                }
                let rows = &mut self.threads[th].off_cpu;
                let stacked: u64 = rows.iter().filter(|r| r.2 == kind).map(|r| r.3).sum();
                if stacked == 0 {
                    let stack = self.unknown_off_cpu_stack();
                    self.threads[th]
                        .off_cpu
                        .push((start_ns, stack, kind, extra));
                    continue;
                }
                // Each stacked interval stands for the unstacked time in proportion to
                // its own; the thread's total stays exact.
                let scale = (stacked + extra) as f64 / stacked as f64;
                for row in rows.iter_mut().filter(|r| r.2 == kind) {
                    row.3 = (row.3 as f64 * scale).round() as u64;
                }
            }
        }
    }

    /// The thread `tid` of process `pid`, created (with its process) on first sight.
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

    fn thread(&mut self, pid: i32, tid: i32, time_ns: u64, name: Option<&str>) -> usize {
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

    /// Resolves a new mapping once: its library, and the file that was mapped (found
    /// through [`FileFinder`], which checks the inode: a replaced file's symbols and CFI
    /// would be wrong, so it is not used).
    fn map(&mut self, m: &Mapping) {
        self.map_generation += 1;
        if is_jit_dump(&m.path) || is_anonymous(m) {
            self.note_jit_user(m.pid);
        }
        if is_jit_dump(&m.path) {
            // The JIT marks its dump by mapping it; the dump names the process's JIT code,
            // which is in its anonymous memory (the perf map's library).
            self.jit_dumps
                .insert(perf_map_path(m.pid), m.path.clone().into());
            self.jit_tails.insert(m.pid, (m.path.clone().into(), 0));
            return;
        }
        // The file's code, for CFI: (its name, the process's address of its address 0).
        let mut code: Option<(Arc<Binary>, String, u64)> = None;
        let (module, file_offset) = if is_anonymous(m) {
            // Anonymous executable memory is JIT code, named (if at all) by the
            // process's perf map; its addresses stay absolute.
            let module = self.fileless_module(
                format!("perf-{}.map", m.pid),
                perf_map_path(m.pid),
                LibKind::PerfMap,
                Translate::Absolute,
            );
            (module, m.file_offset)
        } else if m.path.starts_with('[') && m.path != VDSO_NAME {
            let module = self.fileless_module(
                m.path.clone(),
                m.path.clone(),
                LibKind::Pseudo,
                Translate::FileOffset,
            );
            (module, m.file_offset)
        } else {
            let end = m.start + m.len;
            let (found, file_offset) = if m.path == VDSO_NAME {
                // The image read from memory starts at the mapping.
                (self.files.vdso(m.pid, m.start, end), 0)
            } else {
                let mapped = MappedFile {
                    pid: m.pid,
                    path: &m.path,
                    start: m.start,
                    end,
                    file: m.file,
                };
                (self.files.mapped(&mapped), m.file_offset)
            };
            let binary = found.map(|(b, _)| b);
            let translate = binary
                .as_ref()
                .ok()
                .and_then(|b| b.code_svma_delta(file_offset, m.len))
                .map_or(Translate::FileOffset, Translate::Delta);
            let build_id = binary.as_ref().ok().and_then(|b| b.build_id.clone());
            let path = m.path.strip_suffix(" (deleted)").unwrap_or(&m.path);
            let name = Path::new(path)
                .file_name()
                .map_or(path.to_string(), |n| n.to_string_lossy().into_owned());
            let lib = Lib {
                name,
                path: path.to_string(),
                build_id,
                kind: LibKind::File,
                base: 0,
            };
            if let (Ok(binary), Translate::Delta(delta)) = (&binary, translate) {
                // The process's address of the file's address 0.
                let bias = m.start.wrapping_sub(file_offset).wrapping_sub(delta as u64);
                if let Some(capture) = &mut self.capture {
                    capture.module(m.pid, &lib.name, (m.start, end), bias, binary);
                }
                code = Some((binary.clone(), lib.name.clone(), bias));
            }
            let lib = self.intern_lib(lib, binary);
            let module = Module {
                lib: Some(lib),
                translate,
            };
            (module, file_offset)
        };
        let region = Region {
            start: m.start,
            len: m.len,
            file_offset,
            data: module,
        };
        if is_anonymous(m) {
            self.unwinder.map_anonymous(m.pid, region);
            return;
        }
        let code = code.as_ref().map(|(binary, name, bias)| CodeModule {
            name,
            bias: *bias,
            sections: &binary.unwind,
            text: Some(FileCode {
                bytes: binary.code_without_cfi.as_ref(),
                entry_returns: &binary.entry_returns,
                entry_stub: binary.entry_stub.clone(),
            }),
        });
        self.unwinder.map(m.pid, region, code);
    }

    /// The module of memory with no file behind it.
    /// Notes the user process `pid` runs as, the first time it maps JIT code or a dump
    /// (while it runs): whose perf map and dump are its own.
    fn note_jit_user(&mut self, pid: i32) {
        if let std::collections::hash_map::Entry::Vacant(entry) =
            self.jit_users.entry(perf_map_path(pid))
        {
            if let Some(user) = crate::locate::process_user(pid) {
                entry.insert(user);
            }
        }
    }

    fn fileless_module(
        &mut self,
        name: String,
        path: String,
        kind: LibKind,
        translate: Translate,
    ) -> Module {
        let lib = Lib {
            name,
            path,
            build_id: None,
            kind,
            base: 0,
        };
        Module {
            lib: Some(self.intern_lib(lib, Err("no file".into()))),
            translate,
        }
    }

    /// Interns a library; the first time, records the verified file behind it (kept
    /// parallel to the library table for the symbolicator).
    fn intern_lib(&mut self, lib: Lib, binary: LibFile) -> LibIndex {
        let index = self.libs.intern(lib, LibIndex::new);
        if index.index() == self.lib_binaries.len() {
            self.lib_binaries.push(binary);
        }
        index
    }

    fn sample(&mut self, time_ns: u64, s: &Sample) {
        if let Some(capture) = &mut self.capture {
            capture.sample(s);
        }
        let stack = self.stack_of(s);
        let th = self.thread(s.pid, s.tid, time_ns, None);
        if let Some(stack) = stack {
            self.threads[th].samples.push((time_ns, stack, s.period));
        }
    }

    /// The interned stack of a sample, unwound.
    fn stack_of(&mut self, s: &Sample) -> Option<RawStackIndex> {
        let stack = self.unwinder.unwind(s);
        if let Some(cause) = stack.truncated {
            self.truncated.count(cause);
            if cause == Truncation::NoUnwindInfo {
                let outermost = stack.user.last().map(|a| a.lookup_address());
                let lib = outermost
                    .and_then(|a| self.resolve(s.pid, a))
                    .and_then(|(lib, _)| lib);
                *self.no_unwind_info_in.entry(lib).or_default() += 1;
            }
        }
        self.restored_callers += u64::from(stack.restored_leaf_caller);
        let marked = stack.truncated.is_some();
        let mut last = self.last_stacks.remove(&s.tid).unwrap_or_default();
        let shared = if last.pid == s.pid
            && last.map_generation == self.map_generation
            && last.marked == marked
        {
            last.frames
                .iter()
                .zip(stack.user.iter().rev())
                .take_while(|(a, b)| a == b)
                .count()
        } else {
            0
        };
        last.frames.truncate(shared);
        last.stacks.truncate(shared);
        let mut prefix = last.stacks.last().copied();
        if marked && shared == 0 {
            let marker = AddressFrame {
                lib: None,
                address: 0,
                kind: CodeKind::Marker,
            };
            let frame = self.frames.intern(marker, AddressFrameIndex::new);
            prefix = Some(
                self.stacks
                    .intern(RawStack { prefix, frame }, RawStackIndex::new),
            );
        }
        for &addr in stack.user.iter().rev().skip(shared) {
            let frame = self.user_frame(s.pid, addr);
            let interned = self
                .stacks
                .intern(RawStack { prefix, frame }, RawStackIndex::new);
            prefix = Some(interned);
            last.frames.push(addr);
            last.stacks.push(interned);
        }
        last.pid = s.pid;
        last.map_generation = self.map_generation;
        last.marked = marked;
        self.last_stacks.insert(s.tid, last);
        for &addr in stack.kernel.iter().rev() {
            let frame = self.kernel_frame(addr);
            prefix = Some(
                self.stacks
                    .intern(RawStack { prefix, frame }, RawStackIndex::new),
            );
        }
        prefix
    }

    /// The (library, address in the file's own address space) of an absolute address.
    fn resolve(&self, pid: i32, address: u64) -> Option<(Option<LibIndex>, u64)> {
        let region = self.unwinder.lookup(pid, address)?;
        let file_offset = region.file_offset_of(address);
        let address = match region.data.translate {
            Translate::Absolute => address,
            Translate::FileOffset => file_offset,
            Translate::Delta(d) => file_offset.wrapping_add(d as u64),
        };
        Some((region.data.lib, address))
    }

    fn user_frame(&mut self, pid: i32, addr: CodeAddress) -> AddressFrameIndex {
        let lookup = addr.lookup_address();
        let (lib, address) = self.resolve(pid, lookup).unwrap_or((None, lookup));
        self.frames.intern(
            AddressFrame {
                lib,
                address,
                kind: CodeKind::User,
            },
            AddressFrameIndex::new,
        )
    }

    /// A kernel frame, at its absolute address until [`Self::finish`] relocates it.
    fn kernel_frame(&mut self, addr: CodeAddress) -> AddressFrameIndex {
        let address = addr.lookup_address();
        self.kernel_frames |= address >= KERNEL_SPACE_START;
        let frame = AddressFrame {
            lib: None,
            address,
            kind: CodeKind::Kernel,
        };
        self.frames.intern(frame, AddressFrameIndex::new)
    }

    /// Puts the kernel frames at or above `base` in the kernel's library, relative to it.
    /// Frames stay distinct: the mapping from absolute to relative addresses is one to
    /// one.
    fn relocate_kernel_frames(&mut self, base: u64) {
        if !self.kernel_frames {
            return;
        }
        let kernel = Lib {
            name: KERNEL_LIB_NAME.into(),
            path: KERNEL_LIB_NAME.into(),
            build_id: None,
            kind: LibKind::Kernel,
            base,
        };
        let lib = self.intern_lib(kernel, Err("no file".into()));
        for frame in &mut self.frames.items {
            if frame.kind == CodeKind::Kernel && frame.lib.is_none() && frame.address >= base {
                frame.lib = Some(lib);
                frame.address -= base;
            }
        }
    }
}

/// Where a JIT writes the names of process `pid`'s code for profilers.
/// A thread's on-CPU samples and off-CPU intervals as rows in time order (an interval
/// at its start; an on-CPU sample before an interval of the same time).
/// The name a process or thread is shown by: `[kernel] NAME` for the kernel's.
fn shown_name(kernel: bool, name: &str) -> String {
    match kernel {
        true => format!("[kernel] {name}"),
        false => name.to_string(),
    }
}

/// A thread's samples and off-CPU intervals as rows, in time order; a sample weighs its
/// period when `by_period` (the period varied), else it is one sample.
fn rows_in_time_order(
    samples: Vec<(u64, RawStackIndex, u64)>,
    off_cpu: Vec<(u64, RawStackIndex, OffCpuKind, u64)>,
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

fn perf_map_path(pid: i32) -> String {
    format!("/tmp/perf-{pid}.map")
}

/// Whether a mapped file is a JIT dump: `jit-PID.dump`, in any directory.
fn is_jit_dump(path: &str) -> bool {
    let name = Path::new(path).file_name().and_then(|n| n.to_str());
    name.and_then(|n| n.strip_prefix("jit-")?.strip_suffix(".dump"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// Anonymous memory (JIT code, `//anon`, `[anon:…]`, `[heap]`, `[stack]`) has no file.
fn is_anonymous(m: &Mapping) -> bool {
    m.path.is_empty()
        || m.path.starts_with("//anon")
        || m.path.starts_with("[anon")
        || m.path == "[heap]"
        || m.path.starts_with("[stack")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(time_ns: u64, kind: EventKind) -> Event {
        Event { time_ns, kind }
    }

    fn fork(time_ns: u64, pid: i32, tid: i32) -> Event {
        let (ppid, ptid) = if pid == tid { (1, 1) } else { (pid, pid) };
        at(
            time_ns,
            EventKind::Fork {
                pid,
                ppid,
                tid,
                ptid,
            },
        )
    }

    fn exec(time_ns: u64, pid: i32, name: &str) -> Event {
        let name = name.to_string();
        let (tid, exec) = (pid, true);
        at(
            time_ns,
            EventKind::Comm {
                pid,
                tid,
                name,
                exec,
            },
        )
    }

    fn sample(time_ns: u64, pid: i32, tid: i32) -> Event {
        at(
            time_ns,
            EventKind::Sample(Sample {
                pid,
                tid,
                user_callchain: vec![0x1000],
                ..Sample::default()
            }),
        )
    }

    /// Each thread's (pid, process name, thread name, samples).
    fn threads(b: &ProfileBuilder) -> Vec<(i32, String, String, usize)> {
        b.threads
            .iter()
            .map(|t| {
                let p = &b.processes[t.process.index()];
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
        assert_eq!(b.processes.len(), 2);
        assert!(b.processes[0].end_ns == Some(7) && b.processes[1].end_ns.is_none());
    }

    #[test]
    fn a_task_described_twice_stays_one_thread() {
        // `-a` describes a process that the kernel's fork record names too.
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        b.add_events(&[fork(1, 10, 10), fork(2, 10, 10), sample(3, 10, 10)]);
        assert_eq!(threads(&b).len(), 1);
    }
}
