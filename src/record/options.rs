//! What `sampler record` is asked to do (the target and the options of the recording),
//! how a recording ends, and the signals that end one: the record stage's face to the
//! command line.

use std::time::Duration;

use nix::sys::signal::Signal;

use super::launch::Credentials;
use crate::events::{Rate, SamplingEvent};

/// What to record.
#[derive(Clone, Debug)]
pub enum Target {
    /// Launch this command and follow every thread and process it starts.
    Command(Vec<String>),
    /// Attach to these running processes, their threads, and what they start later.
    Pids(Vec<i32>),
    /// Every process and kernel thread of the machine (`-a`).
    System,
}

/// What `sampler record` was asked to do.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    pub target: Target,
    /// The event to sample (`-e`); `None`: cycles where the CPU has a PMU, else
    /// cpu-clock (cpu-clock always with off-CPU time, which is weighed in time).
    pub event: Option<SamplingEvent>,
    /// How often: `-F` or `-c`.
    pub rate: Rate,
    /// The CPUs to record on (`-C`); `None`: every online CPU.
    pub cpus: Option<Vec<i32>>,
    /// Data pages per CPU ring buffer (a power of two); `None`: what
    /// `kernel.perf_event_mlock_kb` allows without extra privilege.
    pub mmap_pages: Option<usize>,
    /// Stop recording after this long (attached processes and `-a` only).
    pub duration: Option<Duration>,
    /// Bytes of user stack copied with each sample, for unwinding (a multiple of 8).
    pub stack_bytes: u32,
    /// The deepest callchain (frames) to ask the kernel for; raising
    /// `kernel.perf_event_max_stack` when it is lower (see [`stack_limit`](super::stack_limit)).
    pub max_stack: u16,
    /// Who the launched command runs as (under sudo, the user who ran it); `None`: as
    /// sampler runs.
    pub run_as: Option<Credentials>,
    /// Record off-CPU time (`--off-cpu`): every context switch of the followed threads,
    /// and the stack of every `n`th switch out (`Some(n)`).
    pub off_cpu: Option<u64>,
    /// A continuous recording: cut into windows of this length, each handed on as it
    /// closes (see [`super::Sink::window`]).
    pub every: Option<Duration>,
    /// Whether user stacks are walked in the kernel (see [`KernelUnwind`]), and what
    /// compiles the files' tables for it.
    pub kernel_unwind: KernelUnwind,
    pub kernel_tables: std::sync::Arc<dyn crate::events::KernelTables>,
}

/// Whether user stacks are walked in the kernel by sampler's eBPF program at each
/// sample (`--unwind kernel`), for a command, attached processes or the whole machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelUnwind {
    /// Not at all: every sample carries a stack copy, unwound in user space.
    #[default]
    Off,
    /// Where the program loads; else, said on stderr, as without it.
    Prefer,
    /// Or the recording does not start (one line saying why).
    Require,
}

/// Why the launched command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandExit {
    Code(i32),
    Signal(i32),
}

impl CommandExit {
    /// The exit code a shell would report: the code, or 128 + the signal number.
    pub fn shell_code(self) -> i32 {
        match self {
            CommandExit::Code(c) => c,
            CommandExit::Signal(s) => 128 + s,
        }
    }
}

/// How a recording ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The launched command ended.
    Command(CommandExit),
    /// Recording of attached processes stopped; they go on running.
    Detached(DetachReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetachReason {
    /// `-d` elapsed.
    Duration,
    /// Ctrl-C, SIGTERM, or another signal that ends a recording ([`STOP_SIGNALS`]).
    Interrupted,
    /// Every attached process exited.
    AllExited,
}

/// The signals that end a recording the way Ctrl-C does: the profile is written, a
/// launched command gets the signal too (its own default action then usually ends it),
/// attached processes go on running. Any of them would otherwise kill sampler half way
/// and leave no profile; the terminal's hangup (SIGHUP) and Ctrl-\ (SIGQUIT) among them.
pub const STOP_SIGNALS: [Signal; 7] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
];
