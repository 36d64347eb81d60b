//! Recording: everything that knows about perf. It launches the command, opens one
//! sampling event per CPU that follows every thread and child process, drains the ring
//! buffers while the command runs, and hands over a [`crate::events::Recording`]: a
//! time-ordered log of plain events (samples, library maps, thread names, forks, exits,
//! losses) that the rest of the pipeline consumes without knowing where it came from.

mod attach;
mod follow;
pub mod interrupt;
mod kallsyms;
// The two parts that call the kernel directly; each `unsafe` block says why it is sound.
#[allow(unsafe_code)]
mod launch;
mod parse;
pub mod procmem;
mod session;
pub mod stack_limit;
#[allow(unsafe_code)]
mod sys;

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use perf_event_open_sys::bindings as pb;

use crate::events::{Event, OffCpuRecording, Rate, RecordingInfo, SamplingEvent, Scope};
pub use attach::{guardian_main, GUARDIAN_COMMAND};
pub use kallsyms::kernel_text_start;
pub use launch::{Credentials, NotRun};
pub use sys::tune_allocator;

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
    /// `kernel.perf_event_max_stack` when it is lower (see [`stack_limit`]).
    pub max_stack: u16,
    /// Who the launched command runs as (under sudo, the user who ran it); `None`: as
    /// sampler runs.
    pub run_as: Option<Credentials>,
    /// Record off-CPU time (`--off-cpu`): every context switch of the followed threads,
    /// and the stack of every `n`th switch out (`Some(n)`).
    pub off_cpu: Option<u64>,
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

/// x86-64 perf register numbers (asm/perf_regs.h) of the user registers we copy.
const PERF_REG_X86_BP: u64 = 6;
const PERF_REG_X86_SP: u64 = 7;
const PERF_REG_X86_IP: u64 = 8;
const USER_REGS_MASK: u64 =
    (1 << PERF_REG_X86_BP) | (1 << PERF_REG_X86_SP) | (1 << PERF_REG_X86_IP);

fn read_sysctl(name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Where the kernel lists the online CPUs ("0-3,5").
const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// The CPUs of a list in the kernel's form ("0-3,5": as sysfs writes it and `-C` takes
/// it), sorted, each once; the error names the part that is no CPU number or range.
fn cpu_ranges(list: &str) -> std::result::Result<Vec<i32>, String> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let bounds: Vec<&str> = part.trim().splitn(2, '-').collect();
        let number = |t: &str| {
            t.trim()
                .parse::<i32>()
                .map_err(|_| format!("`{part}` is not a CPU number or range (like 0,2-3)"))
        };
        let (a, b) = match bounds[..] {
            [a] => (number(a)?, number(a)?),
            [a, b] => (number(a)?, number(b)?),
            _ => unreachable!("splitn(2) gives one or two parts"),
        };
        if a > b {
            return Err(format!("the range `{part}` is backwards"));
        }
        cpus.extend(a..=b);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The CPUs that are online (`ONLINE_CPUS`); where it cannot be read, as many as the
/// machine has, from 0.
pub fn online_cpus() -> Vec<i32> {
    let text = std::fs::read_to_string(ONLINE_CPUS).unwrap_or_default();
    match cpu_ranges(text.trim()) {
        Ok(cpus) if !cpus.is_empty() => cpus,
        _ => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n as i32).collect()
        }
    }
}

/// CPUs as a list ("0,2,3"), as the summary and the profile's command line show them.
pub fn cpu_list_text(cpus: &[i32]) -> String {
    let list: Vec<String> = cpus.iter().map(i32::to_string).collect();
    list.join(",")
}

/// The CPUs of a `-C` list ("0,2-3"), checked against the online ones; the error says
/// what is wrong with the list.
pub fn parse_cpu_list(list: &str) -> std::result::Result<Vec<i32>, String> {
    let cpus = cpu_ranges(list)?;
    let online = online_cpus();
    match cpus.iter().find(|c| !online.contains(c)) {
        Some(cpu) => Err(format!(
            "CPU {cpu} is not online (online: {})",
            std::fs::read_to_string(ONLINE_CPUS)
                .unwrap_or_default()
                .trim()
        )),
        None => Ok(cpus),
    }
}

/// The kernel's type and config of `event`.
fn event_type_config(event: SamplingEvent) -> (u32, u64) {
    let (hw, sw) = (pb::PERF_TYPE_HARDWARE, pb::PERF_TYPE_SOFTWARE);
    let (type_, config) = match event {
        SamplingEvent::Cycles => (hw, pb::PERF_COUNT_HW_CPU_CYCLES),
        SamplingEvent::Instructions => (hw, pb::PERF_COUNT_HW_INSTRUCTIONS),
        SamplingEvent::CacheMisses => (hw, pb::PERF_COUNT_HW_CACHE_MISSES),
        SamplingEvent::BranchMisses => (hw, pb::PERF_COUNT_HW_BRANCH_MISSES),
        SamplingEvent::CpuClock => (sw, pb::PERF_COUNT_SW_CPU_CLOCK),
        SamplingEvent::TaskClock => (sw, pb::PERF_COUNT_SW_TASK_CLOCK),
        SamplingEvent::PageFaults => (sw, pb::PERF_COUNT_SW_PAGE_FAULTS),
        SamplingEvent::MajorFaults => (sw, pb::PERF_COUNT_SW_PAGE_FAULTS_MAJ),
        SamplingEvent::ContextSwitches => (sw, pb::PERF_COUNT_SW_CONTEXT_SWITCHES),
    };
    (type_, config as u64)
}

/// The fixed period `rate` gives `event`, or `None` when the kernel is to vary it (a
/// frequency for a counting event).
pub fn fixed_period(event: SamplingEvent, rate: Rate) -> Option<u64> {
    match rate {
        Rate::Period(p) => Some(p),
        // A time event counts nanoseconds of CPU time, so a fixed period is the
        // frequency exactly. Frequency mode would start every new event (each thread
        // attached to, each thread born) at a period of 1 and sample in a storm until the
        // kernel has adjusted it: with 300 threads that storm delayed their SIGCONT by a
        // second and overflowed the ring buffers.
        // The period is made a little longer than the frequency's own (see
        // [`OFF_STEP_DIVISOR`]).
        Rate::Frequency(hz) if event.is_time() => {
            let exact = (NANOS_PER_SECOND / hz.max(1)).max(1);
            Some(exact + exact / OFF_STEP_DIVISOR)
        }
        Rate::Frequency(_) => None,
    }
}

/// A time event's period from `-F` is longer than 1/F by 1/199 of it (1,005,025 ns at
/// 1000 Hz), so that it does not keep step with work timed by the clock. Per-CPU
/// timers fire at exact multiples of their period on the same clock as a program's own
/// deadlines: `waiter`, whose 10 ms cycles start 5 ms of computing just after a tick in
/// some runs and just before one in others, had 594 or 745 samples for the same 735 ms
/// of computing (2 runs in 8 missed a fifth). 0.5% longer, the ticks move 5 µs against
/// the work's period at each sample and pass over the whole of a millisecond in 0.2 s.
/// (The advice to sample at 99 or 999 Hz, not 100 or 1000, is this; a prime divisor
/// keeps the period from being round for any usual frequency.)
pub const OFF_STEP_DIVISOR: u64 = 199;

/// The attribute of our sampling event, wherever it is placed (see [`Placement::apply`]).
fn base_attr(
    event: SamplingEvent,
    rate: Rate,
    max_stack: u16,
    stack_bytes: u32,
    include_kernel: bool,
) -> pb::perf_event_attr {
    let period = fixed_period(event, rate);
    let mut sample_type = pb::PERF_SAMPLE_IP
        | pb::PERF_SAMPLE_TID
        | pb::PERF_SAMPLE_TIME
        | pb::PERF_SAMPLE_CPU
        | pb::PERF_SAMPLE_CALLCHAIN
        | pb::PERF_SAMPLE_REGS_USER
        | pb::PERF_SAMPLE_STACK_USER
        // Every sample starts with its event's id: the sampling event and the
        // context-switch event write into one ring (see `OpenEvents::switch_ids`).
        | pb::PERF_SAMPLE_IDENTIFIER;
    if period.is_none() {
        // Only a varying period is worth writing. And with a fixed one in the sample,
        // the kernel writes a sample at every software event whatever the period asked
        // for (perf_swevent_event): `-c 100 -e page-faults` would sample every fault.
        sample_type |= pb::PERF_SAMPLE_PERIOD;
    }
    let (type_, config) = event_type_config(event);
    let mut attr = pb::perf_event_attr {
        size: std::mem::size_of::<pb::perf_event_attr>() as u32,
        type_,
        config,
        sample_type: sample_type as u64,
        sample_regs_user: USER_REGS_MASK,
        sample_stack_user: stack_bytes,
        sample_max_stack: max_stack,
        clockid: libc::CLOCK_MONOTONIC,
        ..Default::default()
    };
    match (period, rate) {
        (Some(p), _) => attr.__bindgen_anon_1.sample_period = p,
        (None, Rate::Frequency(hz)) => {
            attr.__bindgen_anon_1.sample_freq = hz;
            attr.set_freq(1);
        }
        (None, Rate::Period(_)) => unreachable!("a period is fixed"),
    }
    // Whether it starts disabled, at exec, and is inherited: its placement decides.
    attr.set_mmap(1);
    // MMAP2 records carry the mapped file's device and inode, by which replay checks
    // that a file on disk is the one that was mapped (see `crate::files::locate`). Never build
    // IDs in their place (`attr.build_id`): the kernel sets the build-ID flag in a record
    // header that every session's events share, and leaves it set, so the other perf and
    // samply sessions on the machine would read their device and inode as a build ID
    // (perf 6.1 then aborts, samply panics).
    attr.set_mmap2(1);
    attr.set_comm(1);
    attr.set_comm_exec(1);
    attr.set_task(1);
    attr.set_sample_id_all(1);
    attr.set_use_clockid(1);
    attr.set_exclude_hv(1);
    attr.set_exclude_kernel(u64::from(!include_kernel));
    attr
}

/// The perf events of one recording (one per CPU and followed task) and their ring
/// buffers, one per CPU where the kernel lets events share one.
struct OpenEvents {
    event: SamplingEvent,
    /// The fixed period of the samples, or `None` when each carries its own.
    period: Option<u64>,
    /// Per task, or per CPU (filtered to the followed processes, or the whole machine).
    scope: Scope,
    kernel_included: bool,
    attr: pb::perf_event_attr,
    fds: Vec<std::os::fd::OwnedFd>,
    rings: Vec<sys::RingBuffer>,
    /// The events (indexes into `fds`) that own the rings: the ones to poll.
    ring_owners: Vec<usize>,
    ring_pages: usize,
    /// The ids of the context-switch events (off-CPU recording), whose samples are the
    /// stacks at which threads left the CPU.
    switch_ids: HashSet<u64>,
    off_cpu: OffCpuRecording,
}

/// Bytes of user stack copied with each context-switch sample, at most: 2 KiB. A
/// thread that blocks is in a system call, a few library frames below the code that
/// called it (the lock, sleep or read wrapper and its helpers use a few hundred bytes);
/// CFI needs only those before the frame-pointer chain can take over. A full sampling
/// copy (8 KiB in hybrid mode) at every switch would multiply the ring traffic of a
/// program that switches 50,000 times a second by four.
const SWITCH_STACK_BYTES: u32 = 2048;

/// The attribute of the context-switch event beside the sampling event `sampling`: a
/// sample at every `period`th switch out of a followed thread, with the same sample
/// layout (one parser reads both) but a smaller stack copy, and `PERF_RECORD_SWITCH`
/// records for every switch out and in. The side-band records (maps, names, forks) come
/// from the sampling event only.
pub(crate) fn switch_attr(sampling: &pb::perf_event_attr, period: u64) -> pb::perf_event_attr {
    let mut attr = *sampling;
    attr.type_ = pb::PERF_TYPE_SOFTWARE;
    attr.config = pb::PERF_COUNT_SW_CONTEXT_SWITCHES as u64;
    attr.set_freq(0);
    attr.__bindgen_anon_1.sample_period = period.max(1);
    attr.sample_stack_user = attr.sample_stack_user.min(SWITCH_STACK_BYTES);
    // With the period in the sample, the kernel writes a sample at every software event
    // whatever the period asked for (perf_swevent_event): the period would be ignored.
    attr.sample_type &= !(pb::PERF_SAMPLE_PERIOD as u64);
    attr.set_mmap(0);
    attr.set_mmap2(0);
    attr.set_comm(0);
    attr.set_comm_exec(0);
    attr.set_task(0);
    attr.set_context_switch(1);
    attr
}

/// The attribute of an event that never samples but writes the side-band records of
/// `sampling` (maps, names, forks, exits) in its layout: for CPUs outside `-C`.
fn side_band_attr(sampling: &pb::perf_event_attr) -> pb::perf_event_attr {
    let mut attr = *sampling;
    attr.type_ = pb::PERF_TYPE_SOFTWARE;
    attr.config = pb::PERF_COUNT_SW_DUMMY as u64;
    attr.set_freq(0);
    attr.__bindgen_anon_1.sample_period = 0;
    attr
}

/// Opens the context-switch events beside the sampling events on the same tasks and
/// CPUs, and their ids. Kernel frames are needed: the event fires in the scheduler, so a
/// counter that excludes the kernel never fires.
fn open_switch_events(
    sampling: &pb::perf_event_attr,
    period: u64,
    kernel_included: bool,
    placement: Placement<'_>,
    cpus: &[i32],
) -> std::result::Result<(CpuEvents, HashSet<u64>), String> {
    let what_to_do =
        "run sampler with sudo, or lower it with `sudo sysctl kernel.perf_event_paranoid=1`";
    if !kernel_included {
        let paranoid = read_sysctl("perf_event_paranoid").map_or("?".into(), |v| v.to_string());
        return Err(format!(
            "context switches happen in the kernel, which kernel.perf_event_paranoid = {paranoid} \
             does not let sampler see: {what_to_do}"
        ));
    }
    let attr = switch_attr(sampling, period);
    let fds = open_placed(&attr, placement, cpus).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => {
            format!("the kernel refused to sample context switches ({e}): {what_to_do}")
        }
        _ => format!("the kernel refused to sample context switches: {e}"),
    })?;
    let ids = fds
        .iter()
        .map(|(_, fd)| sys::event_id(fd))
        .collect::<std::io::Result<HashSet<u64>>>()
        .map_err(|e| format!("could not read a context-switch event's id: {e}"))?;
    Ok((fds, ids))
}

/// Events with the index of their CPU in the recording's CPU list.
type CpuEvents = Vec<(usize, std::os::fd::OwnedFd)>;

/// Where a recording's events are opened.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Placement<'a> {
    /// One event per task and CPU, inherited by the threads and processes each task
    /// starts. `started`: sampling at once (attached tasks); else from the task's `exec`
    /// (a launched command).
    Tasks { tasks: &'a [i32], started: bool },
    /// One event per CPU, for every task on it. `started`: at once; else once the
    /// session enables them (a launched command, just before it is let go).
    Cpus { started: bool },
}

impl Placement<'_> {
    /// `attr` as this placement opens it.
    fn apply(self, attr: &mut pb::perf_event_attr) {
        match self {
            Placement::Tasks { started, .. } => {
                attr.set_inherit(1);
                attr.set_disabled(u64::from(!started));
                attr.set_enable_on_exec(u64::from(!started));
            }
            Placement::Cpus { started } => {
                // A CPU's event sees every task already; inheriting is for task events.
                attr.set_inherit(0);
                attr.set_enable_on_exec(0);
                attr.set_disabled(u64::from(!started));
            }
        }
    }
}

/// The events of `placement` on `cpus`, with the index of their CPU in `cpus`. For task
/// events, a task that has exited since it was listed is skipped; any other failure
/// fails the whole set.
fn open_placed(
    attr: &pb::perf_event_attr,
    placement: Placement<'_>,
    cpus: &[i32],
) -> std::io::Result<CpuEvents> {
    let mut attr = *attr;
    placement.apply(&mut attr);
    let (tasks, many): (&[i32], bool) = match placement {
        Placement::Tasks { tasks, .. } => (tasks, tasks.len() > 1),
        Placement::Cpus { .. } => (&[-1], false),
    };
    let mut fds = Vec::with_capacity(tasks.len() * cpus.len());
    for &task in tasks {
        for (c, &cpu) in cpus.iter().enumerate() {
            match sys::perf_event_open(&attr, task, cpu) {
                Ok(fd) => fds.push((c, fd)),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) && many => break,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(fds)
}

/// Whether this process may open events that see every task on a CPU (root, or
/// `CAP_PERFMON`, or `kernel.perf_event_paranoid` <= 0): tried with a plain counter.
pub(crate) fn may_watch_cpus(cpu: i32) -> bool {
    let mut attr = pb::perf_event_attr {
        size: std::mem::size_of::<pb::perf_event_attr>() as u32,
        type_: pb::PERF_TYPE_SOFTWARE,
        config: pb::PERF_COUNT_SW_CPU_CLOCK as u64,
        ..Default::default()
    };
    attr.set_disabled(1);
    attr.set_exclude_kernel(1);
    sys::perf_event_open(&attr, -1, cpu).is_ok()
}

/// What a sample takes in a ring besides its copy of the user stack: the record's header
/// and fixed fields (about 80 bytes), the user registers (17 on x86-64, 136 bytes) and a
/// callchain of a hundred frames (800 bytes), rounded up.
const SAMPLE_BYTES_BESIDES_STACK: usize = 1024;

/// The fewest data pages (a power of two) a ring needs to hold one sample with a stack
/// copy of `stack_bytes`: the kernel drops a record larger than the whole ring, so a
/// smaller ring records nothing.
pub fn min_ring_pages(stack_bytes: u32) -> usize {
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as usize);
    (stack_bytes as usize + SAMPLE_BYTES_BESIDES_STACK)
        .div_ceil(page)
        .next_power_of_two()
}

/// The default ring size: the largest power of two of data pages such that the ring and
/// its metadata page fit in `kernel.perf_event_mlock_kb` (per CPU, what an unprivileged
/// user may lock; 516 KiB by default, so 128 pages, as perf uses). Root is not bound by
/// it, and gets rings that grow with the sample: one stack-copy KiB per 128 pages, so a
/// hybrid sample (8 KiB copy) gets 1,024 pages. Measured: 64 busy threads at 1000 Hz in
/// hybrid mode lost 186 samples in 3 s with 128 pages, none with 512. Off-CPU recording
/// writes a stack at every switch, and root's rings are [`OFF_CPU_RING_FACTOR`] times as
/// large then, within [`OFF_CPU_RING_BUDGET`] for all CPUs together.
fn default_ring_pages(stack_bytes: u32, off_cpu: bool) -> usize {
    let kb = read_sysctl("perf_event_mlock_kb").unwrap_or(516) as usize;
    let pages = (kb / 4).saturating_sub(1).max(1);
    let base = 1 << pages.ilog2();
    if !nix::unistd::Uid::effective().is_root() {
        return base;
    }
    let sampling = base * (stack_bytes as usize).div_ceil(1024).next_power_of_two();
    if !off_cpu {
        return sampling;
    }
    let cpus = online_cpus().len().max(1);
    let affordable = OFF_CPU_RING_BUDGET / sys::PAGE_SIZE / cpus;
    // A power of two, as the kernel wants; never below the sampling ring.
    let within = 1 << affordable.max(1).ilog2();
    (sampling * OFF_CPU_RING_FACTOR).min(within).max(sampling)
}

/// How much larger root's rings are with `--off-cpu`: 4 times (4,096 pages, 16 MiB per
/// CPU, in hybrid mode). Each switch out writes a sample with a 2 KiB stack copy, and
/// the recorder must drain them while the CPUs are busy: pingpong at 50,000 switches/s
/// beside two spinning threads on 2 CPUs lost 1,800 to 14,000 records in each of 5 runs
/// with 1,024 pages, none in 5 runs with 4,096.
const OFF_CPU_RING_FACTOR: usize = 4;

/// The most that the larger off-CPU rings take, all CPUs together: 256 MiB, what the
/// sampling rings alone take on 64 CPUs. Past that many CPUs they stay the sampling size.
const OFF_CPU_RING_BUDGET: usize = 256 << 20;

/// Maps one ring per CPU on the first event of that CPU and points the CPU's other events
/// at it. When the kernel refuses a ring size (EPERM: over `perf_event_mlock_kb` and
/// `RLIMIT_MEMLOCK`), halves it and says so, down to `min_pages`, the least that holds a
/// sample.
fn map_rings(
    fds: &[(usize, std::os::fd::OwnedFd)],
    cpus: usize,
    mut pages: usize,
    min_pages: usize,
) -> Result<(Vec<sys::RingBuffer>, Vec<usize>, usize)> {
    let leaders: Vec<usize> = (0..cpus)
        .filter_map(|c| fds.iter().position(|(cpu, _)| *cpu == c))
        .collect();
    let requested = pages;
    let mut rings = loop {
        let mapped: std::io::Result<Vec<_>> = leaders
            .iter()
            .map(|&i| sys::RingBuffer::map(&fds[i].1, pages))
            .collect();
        match mapped {
            Ok(rings) => break rings,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && pages > min_pages => pages /= 2,
            Err(e) => {
                return Err(e).context(format!(
                    "could not map {pages}-page perf ring buffers (try a smaller -m / --mmap-pages)"
                ))
            }
        }
    };
    if pages < requested {
        say!(
            "sampler: ring buffers shrunk from {requested} to {pages} pages per CPU: the kernel \
             refused more (kernel.perf_event_mlock_kb, ulimit -l); expect lost samples at high rates"
        );
    }
    let mut owners = leaders.clone();
    for (i, (cpu, fd)) in fds.iter().enumerate() {
        let Some(&leader) = leaders.iter().find(|&&l| fds[l].0 == *cpu) else {
            continue;
        };
        if i != leader && sys::set_output(fd, &fds[leader].1).is_err() {
            // The kernel would not share the buffer: this event gets its own.
            rings.push(sys::RingBuffer::map(fd, pages).context("could not map a ring buffer")?);
            owners.push(i);
        }
    }
    Ok((rings, owners, pages))
}

/// What the events of a recording are, whatever their placement.
#[derive(Clone, Debug)]
pub(crate) struct EventRequest {
    /// `None`: cycles where the CPU has them, else cpu-clock.
    pub event: Option<SamplingEvent>,
    pub rate: Rate,
    pub max_stack: u16,
    pub stack_bytes: u32,
    pub mmap_pages: usize,
    pub off_cpu: Option<u64>,
    pub cpus: Vec<i32>,
}

/// Opens the sampling events of `request` at `placement`: the event asked for, or
/// cycles if the PMU has them, else cpu-clock; with kernel frames if allowed, else
/// without.
fn open_events(
    request: &EventRequest,
    placement: Placement<'_>,
    scope: Scope,
) -> Result<OpenEvents> {
    let cpus = &request.cpus;
    let candidates: Vec<SamplingEvent> = match request.event {
        Some(event) => vec![event],
        // Off-CPU time is weighed in time, and so must the on-CPU samples beside it be.
        None if request.off_cpu.is_some() => vec![SamplingEvent::CpuClock],
        None => vec![SamplingEvent::Cycles, SamplingEvent::CpuClock],
    };
    let mut last_error = None;
    let attempts = [true, false]
        .into_iter()
        .flat_map(|kernel| candidates.iter().map(move |&event| (kernel, event)));
    for (include_kernel, event) in attempts {
        let attr = base_attr(
            event,
            request.rate,
            request.max_stack,
            request.stack_bytes,
            include_kernel,
        );
        match open_placed(&attr, placement, cpus) {
            Ok(mut fds) => {
                let mut switch_ids = HashSet::new();
                let off_cpu = match request.off_cpu {
                    None => OffCpuRecording::Off,
                    Some(period) => {
                        match open_switch_events(&attr, period, include_kernel, placement, cpus) {
                            Ok((switch_fds, ids)) => {
                                fds.extend(switch_fds);
                                switch_ids = ids;
                                OffCpuRecording::On {
                                    switch_period: period,
                                }
                            }
                            Err(why) => OffCpuRecording::Refused(why),
                        }
                    }
                };
                let others: Vec<i32> = online_cpus()
                    .into_iter()
                    .filter(|c| !cpus.contains(c))
                    .collect();
                if !others.is_empty() {
                    // `-C`: the tasks still fork, exec, map and exit on the other CPUs,
                    // and the kernel writes those records only into events there.
                    let side_band = open_placed(&side_band_attr(&attr), placement, &others)
                        .context("could not follow tasks on the CPUs outside -C")?;
                    fds.extend(side_band.into_iter().map(|(c, fd)| (cpus.len() + c, fd)));
                }
                let (rings, ring_owners, ring_pages) = map_rings(
                    &fds,
                    cpus.len() + others.len(),
                    request.mmap_pages,
                    min_ring_pages(request.stack_bytes),
                )?;
                return Ok(OpenEvents {
                    event,
                    period: fixed_period(event, request.rate),
                    scope,
                    kernel_included: include_kernel,
                    attr,
                    fds: fds.into_iter().map(|(_, fd)| fd).collect(),
                    rings,
                    ring_owners,
                    ring_pages,
                    switch_ids,
                    off_cpu,
                });
            }
            Err(e) => last_error = Some((event, e)),
        }
    }
    let (event, e) = last_error.expect("at least one attempt");
    let errno = e.raw_os_error();
    if errno == Some(libc::EACCES) || errno == Some(libc::EPERM) {
        let paranoid = read_sysctl("perf_event_paranoid").map_or("?".into(), |v| v.to_string());
        // The paranoia level that allows it: 0 for whole CPUs, 1 for one's own tasks.
        let (what, allowed) = match placement {
            Placement::Cpus { .. } => ("watch whole CPUs (-a)", 0),
            Placement::Tasks { .. } => ("use perf_event_open", 1),
        };
        bail!(
            "no permission to {what} (kernel.perf_event_paranoid = {paranoid}): \
             run sampler with sudo, or lower it with `sudo sysctl kernel.perf_event_paranoid={allowed}`"
        );
    }
    if request.event.is_some()
        && event.is_hardware()
        && matches!(errno, Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV))
    {
        bail!(
            "-e {}: this machine has no hardware performance counters for it (perf_event_open: {e}); \
             sample a software event instead, such as -e cpu-clock",
            event.name()
        );
    }
    match request.event {
        Some(event) => Err(e).context(format!("perf_event_open failed for -e {}", event.name())),
        None => {
            Err(e).context("perf_event_open failed for both the cycles and the cpu-clock event")
        }
    }
}

/// Attaching opens one event per thread and CPU: a process with 500 threads on 8 CPUs
/// needs 4,000 descriptors, past the usual soft limit of 1,024. The soft limit is raised
/// to the hard one (what perf does too); if that fails, opening events says so. Each
/// mapped file is kept open until it is named, too (see `crate::files::binary`).
fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// The recorder's nice value when it may raise its priority: ahead of ordinary
/// processes (0) without approaching real-time-like values.
const RECORDER_NICE: i32 = -10;

fn monotonic_ns() -> u64 {
    let ts =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
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

/// Records `opts.target` and hands the events to `sink` in time order, in batches, while
/// it runs. A launched command is recorded until it exits: Ctrl-C, SIGTERM and the other
/// [`STOP_SIGNALS`] are forwarded to it (unless the terminal sent them to it already)
/// and a second one kills it. Attached processes are recorded until `opts.duration`, one
/// of [`STOP_SIGNALS`] (which stop the recording, not the processes), or until they have
/// all exited.
pub fn record(
    opts: &RecordOptions,
    sink: &mut dyn FnMut(&[Event]),
) -> Result<(RecordingInfo, Ended)> {
    let mut session = session::Session::start(opts)?;
    let ended = session.run(sink)?;
    Ok((session.finish(opts, ended, sink), ended))
}

/// The file `execvp` runs for `program`: the path itself, or the first file of that
/// name in `PATH`.
pub fn program_path(program: &str) -> Option<std::path::PathBuf> {
    exec_candidates(program)
        .into_iter()
        .find(|c| c.metadata().is_ok_and(|m| m.is_file()))
}

/// The files `execvp` tries for `program`, in order: the path itself when it has a
/// `/`, else the name in each directory of `PATH`.
pub(crate) fn exec_candidates(program: &str) -> Vec<std::path::PathBuf> {
    if program.contains('/') {
        return vec![program.into()];
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(program)).collect())
        .unwrap_or_default()
}

/// The program's file, when it has the set-user-ID or set-group-ID bit.
fn set_id_program(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let file = program_path(program)?;
    let mode = file.metadata().ok()?.permissions().mode();
    (mode & (libc::S_ISUID | libc::S_ISGID) != 0).then_some(file)
}

/// The processes to attach to: each pid once, in the order given; the pid of a thread
/// that is not its process's main thread becomes its process's (with a line saying so);
/// a pid that is no user process is refused, before anything else happens.
pub fn resolve_pids(pids: &[i32]) -> Result<Vec<i32>> {
    let mut out: Vec<i32> = Vec::with_capacity(pids.len());
    for &pid in pids {
        attach::check_pid(pid)?;
        let process = attach::process_of(pid).unwrap_or(pid);
        if process != pid {
            say!("sampler: {pid} is a thread of process {process}; recording the whole process");
        }
        if !out.contains(&process) {
            out.push(process);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_in_the_kernels_form() {
        assert_eq!(cpu_ranges("0-3,5"), Ok(vec![0, 1, 2, 3, 5]));
        assert_eq!(cpu_ranges("2,0-1,1"), Ok(vec![0, 1, 2]));
        assert_eq!(cpu_ranges("0"), Ok(vec![0]));
        assert!(cpu_ranges("3-1").unwrap_err().contains("backwards"));
        assert!(cpu_ranges("0,x").unwrap_err().contains("`x` is not a CPU"));
        assert!(cpu_ranges("").is_err());
        assert!(!online_cpus().is_empty());
    }
}
