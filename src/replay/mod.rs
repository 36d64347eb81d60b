//! Replay: from recorded events to a [`RawProfile`], incrementally. Events are fed in time order
//! (while the command still runs), each process's library map and each thread's name are
//! kept current, every sample is unwound and its stack interned at once, and the sample's
//! raw material (registers, stack copy) is dropped. Memory then grows with the number of
//! unique stacks, not with the number of samples.
//!
//! This module dispatches each event to its handler (`on_mmap`, `on_fork`, `on_sample`, …)
//! and finishes the profile; the state is split by concern: `threads` (processes and
//! threads, forks, exits, names, reused pids), `stacks` (interning unwound frames and
//! stacks), [`offcpu`] (off-CPU intervals) and `modules` (what each mapping is).

use std::collections::HashMap;

pub mod capture;
mod modules;
pub mod offcpu;
mod stacks;
mod threads;
mod window;

use capture::CaptureWriter;
use modules::Module;
use offcpu::{OffCpu, OffCpuInterval, Placed};
use stacks::{Stacks, KERNEL_SPACE_START};
use threads::Threads;

use crate::events::ProcessMemory;
use crate::events::{Event, EventKind, Recording, RecordingInfo, Sample, Scope};
use crate::files::locate::FileFinder;
use crate::profile::*;
use crate::unwind::{TruncatedBy, Truncation, UnwindMode, Unwinder};

pub use crate::files::binary::LibFile;

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
    /// Whether any sample had kernel frames (the kernel's symbols are then needed).
    pub kernel_frames: bool,
}

/// Builds a raw profile from events fed in time order.
pub struct ProfileBuilder {
    files: FileFinder,
    /// Every process's maps, each mapping resolved to its [`Module`] once, and the
    /// unwinding of their samples.
    unwinder: Unwinder<Module>,
    libs: Interner<Lib, LibIndex>,
    lib_binaries: Vec<LibFile>,
    /// Every process and thread, with their rows.
    threads: Threads,
    /// The frame and stack tables.
    stacks: Stacks,
    truncated: TruncatedBy,
    jit_dumps: HashMap<String, std::path::PathBuf>,
    jit_users: HashMap<String, u32>,
    /// Each process's JIT dump as read so far while recording: its path and how many bytes
    /// of it were read.
    jit_tails: HashMap<i32, (std::path::PathBuf, u64)>,
    /// Stacks cut by code without unwind rules, by the library of their outermost frame.
    no_unwind_info_in: HashMap<Option<LibIndex>, u64>,
    restored_callers: u64,
    capture: Option<CaptureWriter>,
    /// Off-CPU time, when it is recorded.
    off_cpu: Option<OffCpu>,
}

/// Builds the raw profile of a whole recording at once (see [`ProfileBuilder`]).
pub fn build(recording: &Recording) -> Built {
    let mut b = ProfileBuilder::new(UnwindMode::Fp);
    b.add_events(&recording.events);
    b.finish(&recording.info)
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
            unwinder,
            libs: Interner::default(),
            lib_binaries: Vec::new(),
            threads: Threads::default(),
            stacks: Stacks::default(),
            truncated: TruncatedBy::default(),
            jit_dumps: HashMap::new(),
            jit_users: HashMap::new(),
            jit_tails: HashMap::new(),
            no_unwind_info_in: HashMap::new(),
            restored_callers: 0,
            capture: None,
            off_cpu: None,
        }
    }

    /// Also builds off-CPU time from the context switches in the events (a recording
    /// with `--off-cpu`, taking the stack of every `switch_period`th switch out).
    pub fn record_off_cpu(&mut self, switch_period: u64) {
        self.off_cpu = Some(OffCpu::new(switch_period));
    }

    /// Also writes an unwinder fixture of the first samples to `path` (see
    /// `replay::capture`) when the profile is finished.
    pub fn capture_samples(&mut self, path: std::path::PathBuf) {
        self.capture = Some(CaptureWriter::new(path));
    }

    /// Replays `events`, which come after every event fed before, in time order.
    pub fn add_events(&mut self, events: &[Event]) {
        self.read_jit_dumps();
        if let (Some(off), Some(first)) = (&mut self.off_cpu, events.first()) {
            off.started(first.time_ns);
        }
        for event in events {
            let t = event.time_ns;
            let Some(kind) = self.threads.attribute(&event.kind) else {
                continue;
            };
            match &*kind {
                EventKind::Mmap(m) if m.executable => self.on_mmap(m),
                EventKind::Mmap(_) => {}
                EventKind::Comm {
                    pid,
                    tid,
                    name,
                    exec,
                } => self.on_comm(t, *pid, *tid, name, *exec),
                EventKind::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                } => self.on_fork(t, *pid, *ppid, *tid, *ptid),
                EventKind::Exit { pid, tid } => self.on_exit(t, *pid, *tid),
                EventKind::Sample(s) => self.on_sample(t, s),
                EventKind::SwitchSample(s) => self.on_switch_sample(t, s),
                EventKind::ExitStack(s) => {
                    self.threads.heard_from(s.pid, t);
                    self.unwinder.exiting(s);
                }
                EventKind::SwitchOut {
                    pid,
                    tid,
                    preempted,
                } => self.on_switch_out(t, *pid, *tid, *preempted),
                EventKind::SwitchIn { pid, tid } => self.on_switch_in(t, *pid, *tid),
                EventKind::Lost {
                    count,
                    pid,
                    tid: Some(tid),
                } => self.on_lost(t, *count, *pid, *tid),
                EventKind::Lost { tid: None, .. } | EventKind::Throttle => {}
            }
        }
        if let Some(last) = events.last() {
            self.forget_exited(last.time_ns);
        }
        let done = match &mut self.off_cpu {
            Some(off) => off.take_done(),
            None => Vec::new(),
        };
        for interval in done {
            self.add_off_cpu(interval);
        }
    }

    /// Thread `tid` of process `pid` is called `name`; by an `exec`, the process runs a
    /// new program, with a new address space.
    fn on_comm(&mut self, t: u64, pid: i32, tid: i32, name: &str, exec: bool) {
        if exec {
            self.threads.exec(pid);
            self.unwinder.exec(pid);
            self.stacks.maps_changed(pid);
        }
        let new = !self.threads.knows(tid);
        self.threads.named(t, pid, tid, name);
        if let Some(off) = &mut self.off_cpu {
            off.described(tid, t, new && !exec);
        }
    }

    /// A new task: a process (which inherits its parent's maps) or a thread.
    fn on_fork(&mut self, t: u64, pid: i32, ppid: i32, tid: i32, ptid: i32) {
        if self.threads.fork(t, pid, ppid, tid, ptid) {
            self.unwinder.fork(ppid, pid);
        }
        self.stacks.forget_thread(tid);
        if let Some(tracker) = self.tracker() {
            tracker.born(tid);
        }
    }

    fn on_exit(&mut self, t: u64, pid: i32, tid: i32) {
        self.threads.exit(t, pid, tid);
        self.stacks.forget_thread(tid);
        if let Some(tracker) = self.tracker() {
            tracker.exit(tid, t);
        }
    }

    fn on_sample(&mut self, t: u64, s: &Sample) {
        self.threads.heard_from(s.pid, t);
        if let Some(tracker) = self.tracker() {
            tracker.ran(s.tid, t);
        }
        if let Some(capture) = &mut self.capture {
            capture.sample(s);
        }
        let stack = self.stack_of(s);
        let th = self.threads.thread(s.pid, s.tid, t, None);
        if let Some(stack) = stack {
            self.threads.threads[th].samples.push((t, stack, s.period));
        }
    }

    /// The stack a thread left the CPU at.
    fn on_switch_sample(&mut self, t: u64, s: &Sample) {
        self.threads.heard_from(s.pid, t);
        self.threads.thread(s.pid, s.tid, t, None);
        if self.off_cpu.is_some() {
            if let Some(stack) = self.stack_of(s) {
                if let Some(tracker) = self.tracker() {
                    tracker.switch_out_stack(s.tid, t, stack);
                }
            }
        }
    }

    fn on_switch_out(&mut self, t: u64, pid: i32, tid: i32, preempted: bool) {
        self.threads.thread(pid, tid, t, None);
        if let Some(tracker) = self.tracker() {
            tracker.switch_out(tid, t, preempted);
        }
    }

    fn on_switch_in(&mut self, t: u64, pid: i32, tid: i32) {
        self.threads.thread(pid, tid, t, None);
        if let Some(tracker) = self.tracker() {
            tracker.switch_in(tid, t);
        }
    }

    fn on_lost(&mut self, t: u64, count: u64, pid: Option<i32>, tid: i32) {
        self.threads.lost(t, count, pid, tid);
    }

    fn tracker(&mut self) -> Option<&mut offcpu::OffCpuTracker<RawStackIndex>> {
        self.off_cpu.as_mut()?.tracker()
    }

    /// One interval off the CPU becomes a row of its thread (see [`OffCpu::place`]).
    fn add_off_cpu(&mut self, interval: OffCpuInterval<RawStackIndex>) {
        let Some(off) = &mut self.off_cpu else {
            return;
        };
        let Placed::Row {
            tid,
            start_ns,
            stack,
            kind,
            ns,
        } = off.place(interval)
        else {
            return;
        };
        let stack = stack.unwrap_or_else(|| self.stacks.unknown_off_cpu());
        if ns == 0 {
            return;
        }
        if let Some(rows) = self.threads.off_cpu_rows(tid) {
            rows.push((start_ns, stack, kind, ns));
        }
    }

    /// Drops the unwinding state of the processes that exited, and of which nothing has
    /// come since, a while before `now` (see [`Threads::take_gone`]).
    fn forget_exited(&mut self, now: u64) {
        for (pid, tids) in self.threads.take_gone(now) {
            for &tid in &tids {
                self.stacks.forget_thread(tid);
            }
            self.unwinder.forget(pid, &tids);
        }
    }

    /// Whether any sample had kernel frames (so the kernel's symbols are needed).
    pub fn has_kernel_frames(&self) -> bool {
        self.stacks.has_kernel_frames()
    }

    /// The raw profile; times become milliseconds since `info.start_ns`. Kernel frames
    /// are kept as absolute addresses until now; they become relative to the kernel's
    /// text start (`info.kernel_text`), or to the start of the kernel's half of the
    /// address space when it is unknown.
    pub fn finish(mut self, info: &RecordingInfo) -> Built {
        self.finish_off_cpu(info.end_ns, info.scope);
        let kernel_frames = self.has_kernel_frames();
        self.relocate_kernel_frames(info.kernel_text.unwrap_or(KERNEL_SPACE_START));
        // Unwinding is over: what it read of each file's CFI goes (the files stay, for
        // naming).
        self.forget_cfi_pieces();
        if let Some(capture) = self.capture.take() {
            if let Err(e) = capture.write() {
                say!("sampler: could not write the sample capture: {e}");
            }
        }
        let no_unwind_info_in = self.take_no_unwind_info_in();
        let meta = self.meta(info);
        let (processes, threads) = self.threads.into_tables(info);
        let profile = RawProfile {
            meta,
            libs: self.libs.items,
            address_frames: self.stacks.frames.items,
            stacks: self.stacks.stacks.items,
            processes,
            threads,
        };
        Built {
            profile,
            lib_binaries: self.lib_binaries,
            truncated: self.truncated,
            jit_dumps: self.jit_dumps,
            jit_users: self.jit_users,
            no_unwind_info_in,
            kernel_frames,
        }
    }

    /// Drops what unwinding read of each file's CFI (read again where needed).
    fn forget_cfi_pieces(&self) {
        for binary in self.lib_binaries.iter().flatten() {
            if let Some(lazy) = &binary.unwind.lazy {
                lazy.forget_pieces();
            }
        }
    }

    /// Drops what unwinding read of each file's CFI and did not use since the last call.
    fn age_cfi_pieces(&self) {
        for binary in self.lib_binaries.iter().flatten() {
            if let Some(lazy) = &binary.unwind.lazy {
                lazy.age_pieces();
            }
        }
    }

    /// What the profile says of itself; its times relative to `info.start_ns`.
    fn meta(&self, info: &RecordingInfo) -> Meta {
        Meta {
            start_unix_ms: info.start_unix_ms,
            // What a sample stands for in time: its period for a time event, else the
            // frequency's interval (1 ms for a fixed period of a counting event, which
            // stands for no time at all).
            interval_ms: match (info.event.is_time(), info.period, info.frequency_hz) {
                (true, Some(ns), _) => ns as f64 / 1e6,
                (_, _, 0) => 1.0,
                (_, _, hz) => 1000.0 / hz as f64,
            },
            duration_ms: info.end_ns.saturating_sub(info.start_ns) as f64 / 1e6,
            event: info.event.name().to_string(),
            time_event: info.event.is_time(),
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
        }
    }

    /// The libraries of the outermost frames of stacks cut by code without unwind rules,
    /// with their counts, most first; counting starts anew.
    fn take_no_unwind_info_in(&mut self) -> Vec<(String, u64)> {
        let mut named: Vec<(String, u64)> = std::mem::take(&mut self.no_unwind_info_in)
            .into_iter()
            .map(|(lib, n)| {
                let name = lib.map_or("unknown code".to_string(), |l| {
                    self.libs.items[l.index()].name.clone()
                });
                (name, n)
            })
            .collect();
        named.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        named
    }

    /// Ends the off-CPU intervals still open at `end_ns` (the end of the recording) and
    /// shares out the time of intervals without a stack (see [`offcpu::share_out`]).
    fn finish_off_cpu(&mut self, end_ns: u64, scope: Scope) {
        let Some(off) = &mut self.off_cpu else {
            return;
        };
        let start_ns = off.start_ns();
        for interval in off.finish(end_ns, scope) {
            self.add_off_cpu(interval);
        }
        let unstacked = match &mut self.off_cpu {
            Some(off) => off.take_unstacked(),
            None => Vec::new(),
        };
        for (tid, amounts) in unstacked {
            let Some(rows) = self.threads.off_cpu_rows(tid) else {
                continue;
            };
            for (kind, extra) in OffCpuKind::ALL.into_iter().zip(amounts) {
                offcpu::share_out(rows, kind, extra, start_ns, || {
                    self.stacks.unknown_off_cpu()
                });
            }
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
                    .and_then(|a| modules::resolve(&self.unwinder, s.pid, a))
                    .and_then(|(lib, _)| lib);
                *self.no_unwind_info_in.entry(lib).or_default() += 1;
            }
        }
        self.restored_callers += u64::from(stack.restored_leaf_caller);
        let unwinder = &self.unwinder;
        self.stacks.intern(s.pid, s.tid, &stack, |address| {
            modules::resolve(unwinder, s.pid, address)
        })
    }

    /// Puts the kernel frames at or above `base` in the kernel's library, relative to it.
    fn relocate_kernel_frames(&mut self, base: u64) {
        if !self.stacks.has_kernel_frames() {
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
        self.stacks.relocate_kernel_frames(base, lib);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Hand-built events, for the tests of each part of the replay.

    use super::*;

    /// An event of this kind at `time_ns`.
    pub(crate) fn at(time_ns: u64, kind: EventKind) -> Event {
        Event { time_ns, kind }
    }

    /// The fork of task `tid` of process `pid` (a new process when they are equal).
    pub(crate) fn fork(time_ns: u64, pid: i32, tid: i32) -> Event {
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

    /// Process `pid` executing `name`.
    pub(crate) fn exec(time_ns: u64, pid: i32, name: &str) -> Event {
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

    /// A sample of one user frame.
    pub(crate) fn sample(time_ns: u64, pid: i32, tid: i32) -> Event {
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
}
