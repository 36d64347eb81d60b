//! The recording as plain data: what `record` hands over and every later stage consumes
//! (samples with their callchains, registers and stack copy; library maps; thread names;
//! forks, exits and losses; the facts of the session). Nothing here knows perf, so the
//! unwinder, the profile builder and the tests work the same on events replayed from a
//! fixture as on a live recording.

use crate::files::FileId;
use std::time::Duration;

/// One entry of the log. `time_ns` is CLOCK_MONOTONIC.
#[derive(Clone, Debug)]
pub struct Event {
    pub time_ns: u64,
    pub kind: EventKind,
}

#[derive(Clone, Debug)]
pub enum EventKind {
    Sample(Sample),
    /// A file (or anonymous memory) was mapped executable into a process.
    Mmap(Mapping),
    /// A thread got a name; `exec` is set when it comes from an `exec` of a new program.
    Comm {
        pid: i32,
        tid: i32,
        name: String,
        exec: bool,
    },
    /// A thread or process was created (`pid == tid` for a new process).
    Fork {
        pid: i32,
        ppid: i32,
        tid: i32,
        ptid: i32,
    },
    /// A thread exited.
    Exit {
        pid: i32,
        tid: i32,
    },
    /// Records the kernel had to drop; `pid` and `tid` are the thread that was running
    /// when they were lost (whose samples they were), when the kernel said.
    Lost {
        count: u64,
        pid: Option<i32>,
        tid: Option<i32>,
    },
    /// The kernel throttled sampling because the event fired too often.
    Throttle,
    /// A thread left the CPU (`PERF_RECORD_SWITCH`, off-CPU recording): `preempted` when
    /// it could still run, else it blocked (waited for a lock, I/O, a sleep).
    SwitchOut {
        pid: i32,
        tid: i32,
        preempted: bool,
    },
    /// A thread got the CPU back (`PERF_RECORD_SWITCH`).
    SwitchIn {
        pid: i32,
        tid: i32,
    },
    /// The stack at which a thread left the CPU: a sample of the context-switch event,
    /// taken as it switched out (every `OffCpuRecording::switch_period`th switch).
    SwitchSample(Sample),
    /// The stack at which a thread called `exit_group`: a sample of the tracepoint on
    /// it. The thread's samples after this are of its process's teardown, in the
    /// kernel, where its user stack can no longer be walked (its memory is released):
    /// this is the user stack they have.
    ExitStack(Sample),
}

/// The user registers the unwinder needs, at the moment of the sample (for a sample taken
/// in the kernel: at the entry into the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub pid: i32,
    pub tid: i32,
    pub cpu: u32,
    /// The kernel's frame-pointer walk through kernel code, leaf first (empty when the
    /// sample was taken in user mode or kernel frames were excluded).
    pub kernel_callchain: Vec<u64>,
    /// The kernel's frame-pointer walk through user code, leaf first; the first entry is
    /// the user instruction pointer.
    pub user_callchain: Vec<u64>,
    /// Whether the callchain reached the kernel's frame limit, so the outermost frames are
    /// missing. The callchain cannot tell a stack of exactly the limit from a longer one,
    /// so such a stack counts as truncated too.
    pub callchain_truncated: bool,
    pub user_regs: Option<UserRegs>,
    /// A copy of user stack memory starting at `user_regs.sp`.
    pub stack_copy: Vec<u8>,
    /// The event count this sample stands for (ns for cpu-clock, cycles for cycles).
    pub period: u64,
    /// Set when sampler's unwinder in the kernel walked the user stack at the sample:
    /// `user_callchain` is then that walk (see [`KernelWalk`]), and there is no stack
    /// copy to unwind.
    pub kernel_walk: Option<KernelWalk>,
}

/// How a walk of the user stack in the kernel ended, with its frames in
/// `Sample::user_callchain`: the sampled instruction first, then return addresses, except
/// that a frame with [`KernelWalk::INTERRUPTED`] set is an instruction a signal
/// interrupted (looked up as it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelWalk {
    /// At the thread's outermost frame: the stack is complete.
    Outermost,
    /// At the walker's frame limit: the outermost frames are missing.
    FrameLimit,
    /// A step did not move the stack pointer up (a loop, or wrong unwind information).
    NotUp,
}

/// A file's unwind table as sampler's unwinder in the kernel loads it: `count` rows of
/// [`KernelTable::ROW_BYTES`] bytes each (see `unwind::table::Row::to_bytes`), whose
/// starts are offsets from the file address `base`.
pub struct KernelTable {
    pub base: u64,
    pub count: usize,
    pub rows: Box<dyn TableRows>,
}

impl KernelTable {
    pub const ROW_BYTES: usize = 12;
}

/// Where a [`KernelTable`]'s rows are: in memory, or in a file they are read from in
/// blocks (so that a table of millions of rows never lies whole in sampler's memory).
pub trait TableRows: Send {
    /// Hands the rows to `take` in order, in blocks of whole rows. `Err` is one line:
    /// `take`'s error, or why the rows could not be read or were not sound (then some
    /// blocks may have been taken already, and must be forgotten).
    fn blocks(&mut self, take: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String>;
}

impl TableRows for Vec<u8> {
    fn blocks(&mut self, take: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> {
        take(self)
    }
}

/// Where recording gets the unwind tables of the files it maps, for the unwinder in the
/// kernel: the compiler belongs to `unwind`, which comes after recording, and the cache
/// of compiled tables to the caller. Called from more than one thread.
pub trait KernelTables: Send + Sync + std::fmt::Debug {
    /// The table of `binary`; `Err` is one line naming the file.
    fn table(&self, binary: &crate::files::binary::Binary) -> Result<KernelTable, String>;
}

impl KernelWalk {
    /// The bit of a frame address in a walk that marks an interrupted instruction (user
    /// addresses are below 2^47).
    pub const INTERRUPTED: u64 = 1 << 63;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub pid: i32,
    pub start: u64,
    pub len: u64,
    /// Offset in the file of the byte mapped at `start`.
    pub file_offset: u64,
    /// The file's path, or a pseudo-name like `[vdso]`, `//anon`, `[anon:…]`.
    pub path: String,
    /// Which file was mapped, as the kernel names it (`None` for memory without a file).
    pub file: Option<FileId>,
    pub executable: bool,
}

/// Whether the frame limit sampler asked for could be had (it may take raising the
/// machine-wide `kernel.perf_event_max_stack`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StackLimit {
    /// The setting already allowed the frames asked for; nothing was changed.
    #[default]
    NotNeeded,
    /// Raised (or already raised by another session) for this one.
    Raised,
    /// It could not be raised (not root, or another perf session holds callchain events):
    /// stacks deeper than the setting are cut, and marked so.
    Refused,
}

/// What the sampling event was, as shown to the user and written into the profile; the
/// names are perf's (`-e`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplingEvent {
    /// `PERF_TYPE_HARDWARE` events: need a hardware PMU.
    Cycles,
    Instructions,
    CacheMisses,
    BranchMisses,
    /// `PERF_TYPE_SOFTWARE / PERF_COUNT_SW_CPU_CLOCK`: a timer, works everywhere.
    CpuClock,
    /// The per-task clock: like cpu-clock, counted in the task's own running time.
    TaskClock,
    PageFaults,
    MajorFaults,
    ContextSwitches,
}

impl SamplingEvent {
    pub const ALL: [SamplingEvent; 9] = [
        SamplingEvent::Cycles,
        SamplingEvent::Instructions,
        SamplingEvent::CacheMisses,
        SamplingEvent::BranchMisses,
        SamplingEvent::CpuClock,
        SamplingEvent::TaskClock,
        SamplingEvent::PageFaults,
        SamplingEvent::MajorFaults,
        SamplingEvent::ContextSwitches,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SamplingEvent::Cycles => "cycles",
            SamplingEvent::Instructions => "instructions",
            SamplingEvent::CacheMisses => "cache-misses",
            SamplingEvent::BranchMisses => "branch-misses",
            SamplingEvent::CpuClock => "cpu-clock",
            SamplingEvent::TaskClock => "task-clock",
            SamplingEvent::PageFaults => "page-faults",
            SamplingEvent::MajorFaults => "major-faults",
            SamplingEvent::ContextSwitches => "context-switches",
        }
    }

    /// The event of a perf name (and perf's aliases `cpu-cycles`, `faults`, `cs`).
    pub fn from_name(name: &str) -> Option<SamplingEvent> {
        let name = match name {
            "cpu-cycles" => "cycles",
            "faults" => "page-faults",
            "cs" => "context-switches",
            other => other,
        };
        SamplingEvent::ALL.into_iter().find(|e| e.name() == name)
    }

    /// Whether it counts in a hardware PMU.
    pub fn is_hardware(self) -> bool {
        matches!(
            self,
            SamplingEvent::Cycles
                | SamplingEvent::Instructions
                | SamplingEvent::CacheMisses
                | SamplingEvent::BranchMisses
        )
    }

    /// Whether it counts nanoseconds of CPU time, so that a fixed period is a fixed
    /// time and its samples measure time.
    pub fn is_time(self) -> bool {
        matches!(self, SamplingEvent::CpuClock | SamplingEvent::TaskClock)
    }
}

/// How often the sampling event takes a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rate {
    /// About this many samples per second per running thread: the kernel adjusts the
    /// period as it goes, so every sample carries its own (its weight is its period).
    /// Time events (cpu-clock, task-clock) get the fixed period of this frequency.
    Frequency(u64),
    /// A sample every this many events (`-c`).
    Period(u64),
}

/// What was sampled and how: everything about a recording session but its events.
#[derive(Clone, Debug)]
pub struct RecordingInfo {
    pub event: SamplingEvent,
    /// The sampling frequency actually requested from the kernel, in Hz (for a fixed
    /// period of a time event, the frequency it makes; 0 for a fixed period of another).
    pub frequency_hz: u64,
    /// The fixed period of every sample (events; ns for time events), or `None` when the
    /// kernel varied it (frequency mode of a counting event): then each sample's own
    /// period is its weight.
    pub period: Option<u64>,
    /// What was recorded: a command's or processes' threads, or the whole machine.
    pub scope: Scope,
    /// The CPUs recorded on (`-C`); empty: all.
    pub cpus: Vec<i32>,
    /// Wall-clock time of `start_ns`, in milliseconds since the Unix epoch.
    pub start_unix_ms: f64,
    /// CLOCK_MONOTONIC time (ns) at which recording started; event times use this clock.
    pub start_ns: u64,
    /// CLOCK_MONOTONIC time (ns) at which recording stopped.
    pub end_ns: u64,
    /// Samples the kernel could not write because a ring buffer was full (LOST records),
    /// plus samples it dropped itself (LOST_SAMPLES records).
    pub lost_samples: u64,
    /// Times the kernel throttled the event because it fired too often.
    pub throttled: u64,
    /// Whether kernel frames were recorded (false when the kernel refused).
    pub kernel_included: bool,
    /// Where the kernel's text starts (`_text`), which places kernel frames (KASLR
    /// moves it at each boot): read when kernel frames were recorded and the kernel
    /// shows its addresses.
    pub kernel_text: Option<u64>,
    /// The frame limit the kernel applied to callchains (user + kernel).
    pub max_stack: u16,
    /// What the recording may be missing, and why.
    pub gaps: RecordingGaps,
    /// The command line that was profiled, or `-p PID,...` for attached processes.
    pub command: Vec<String>,
    /// The pid of the launched command, or of the first attached process.
    pub root_pid: i32,
    /// Data pages of each CPU's ring buffer.
    pub ring_pages: usize,
    /// How long attached processes were stopped while sampler attached to them.
    pub stopped_for: Option<Duration>,
    /// Bytes of sample records the kernel wrote (what a sample costs in the ring buffer).
    pub sample_bytes: u64,
    /// CPUs of the recording machine.
    pub logical_cpus: u32,
    /// Whether off-CPU time was recorded (`--off-cpu`), and how.
    pub off_cpu: OffCpuRecording,
    /// The CPU time (user and system) the launched command and the children it waited
    /// for used, from `getrusage`: what its samples should add up to.
    pub command_cpu: Option<Duration>,
    /// On-CPU samples of sampler's own process, left out of a whole-machine profile.
    pub own_samples: u64,
    /// With per-CPU events for a command or attached processes: samples the rings lost
    /// while another process ran. The kernel says only which task ran when it wrote
    /// the loss, not whose samples were lost, so these may be the followed processes'
    /// or anyone's; they are not in `lost_samples`.
    pub lost_elsewhere: u64,
    /// Whether sampler's unwinder in the kernel walked the user stacks (samples it could
    /// not finish were unwound from their stack copies, as in hybrid mode).
    pub walked_in_kernel: bool,
}

/// What a recording followed, and how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Per-task events inherited by every new thread and process of the launched
    /// command or attached processes: a thread that runs less than one sampling period
    /// may never be sampled (each new thread starts a fresh period).
    #[default]
    Tasks,
    /// Per-CPU events whose records are filtered to the followed processes and the ones
    /// they start: sampling runs on across thread births, so short threads are counted.
    FollowedOnCpus,
    /// Per-CPU events, every process and kernel thread of the machine (`-a`).
    System,
}

/// Whether the context switches of the followed threads were recorded, to show where
/// they waited (see [`crate::replay::offcpu`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum OffCpuRecording {
    /// Not asked for: the profile has on-CPU samples only.
    #[default]
    Off,
    /// Every switch out and back in was recorded, and the stack of every
    /// `switch_period`th switch out (1: every one).
    On { switch_period: u64 },
    /// Asked for, but the kernel would not sample context switches; the reason, said
    /// once to the user.
    Refused(String),
}

impl OffCpuRecording {
    pub fn recorded(&self) -> bool {
        matches!(self, OffCpuRecording::On { .. })
    }
}

/// What a recording may be missing, and why: stack frames beyond the frame limit,
/// samples in unreadable ring data, processes that ran no code or outlived the command,
/// a program the kernel would not let sampler follow. The summary says each.
#[derive(Clone, Debug, Default)]
pub struct RecordingGaps {
    /// Whether `kernel.perf_event_max_stack` could be raised to the frames asked for.
    pub stack_limit: StackLimit,
    /// Bytes of ring buffer that could not be parsed (a corrupt record and what followed
    /// it in that read), and the samples they are estimated to have held; the estimate
    /// is included in `lost_samples`.
    pub unreadable_bytes: u64,
    pub unreadable_samples: u64,
    /// Attached processes that were already stopped (SIGSTOP, a debugger) and were left
    /// so: they run no code, so they have no samples.
    pub left_stopped: Vec<i32>,
    /// Processes the launched command started that were still running when it exited:
    /// they were recorded only until then (a daemon).
    pub outliving: Vec<(i32, String)>,
    /// The launched program's file, when it is set-user-ID or set-group-ID: the kernel
    /// ends the sampling of a program that gains privileges at `exec`.
    pub set_id_program: Option<std::path::PathBuf>,
}

impl RecordingInfo {
    /// A recording of `app` (pid 1) with cpu-clock at 1000 Hz, for tests to vary.
    #[doc(hidden)]
    pub fn example() -> RecordingInfo {
        RecordingInfo {
            kernel_text: None,
            event: SamplingEvent::CpuClock,
            frequency_hz: 1000,
            start_unix_ms: 0.0,
            start_ns: 0,
            end_ns: 0,
            lost_samples: 0,
            throttled: 0,
            kernel_included: true,
            max_stack: 127,
            gaps: RecordingGaps::default(),
            command: vec!["app".into()],
            root_pid: 1,
            ring_pages: 128,
            stopped_for: None,
            sample_bytes: 0,
            logical_cpus: 2,
            off_cpu: Default::default(),
            period: Some(1_000_000),
            scope: Scope::FollowedOnCpus,
            cpus: Vec::new(),
            command_cpu: None,
            own_samples: 0,
            lost_elsewhere: 0,
            walked_in_kernel: false,
        }
    }
}

/// A whole recording held in memory: its description and its events in time order.
#[derive(Clone, Debug)]
pub struct Recording {
    pub info: RecordingInfo,
    pub events: Vec<Event>,
}

/// Reads the memory of live processes, for the code of JIT mappings and for the
/// outermost frames of deep stacks. Injected, so that unwinding stays testable and a
/// replay of an old recording reads nothing.
pub trait ProcessMemory {
    /// Fills `buf` from process `pid`'s memory at `address`; false when that cannot be
    /// read (the process is gone, or it may not be read).
    fn read(&mut self, pid: i32, address: u64, buf: &mut [u8]) -> bool;
    /// The mapping of process `pid` that contains `address` (its stack, for example).
    fn mapping_containing(&mut self, pid: i32, address: u64) -> Option<std::ops::Range<u64>>;
}

/// No process memory: for replays of recordings whose processes are gone (their pids
/// may belong to other processes by now).
pub struct NoMemory;

impl ProcessMemory for NoMemory {
    fn read(&mut self, _: i32, _: u64, _: &mut [u8]) -> bool {
        false
    }
    fn mapping_containing(&mut self, _: i32, _: u64) -> Option<std::ops::Range<u64>> {
        None
    }
}
