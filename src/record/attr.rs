//! The perf event attributes (`perf_event_attr`) of a recording: the sampling event's,
//! with its sample layout and period; the context-switch event's beside it; and the
//! side-band event's on the CPUs outside `-C`. Building them is apart from opening them,
//! so that the parser reads the same layout the events were opened with.

use perf_event_open_sys::bindings as pb;

use crate::events::{Rate, SamplingEvent};

/// x86-64 perf register numbers (asm/perf_regs.h) of the user registers we copy.
pub(super) const PERF_REG_X86_BP: u64 = 6;
pub(super) const PERF_REG_X86_SP: u64 = 7;
pub(super) const PERF_REG_X86_IP: u64 = 8;
const USER_REGS_MASK: u64 =
    (1 << PERF_REG_X86_BP) | (1 << PERF_REG_X86_SP) | (1 << PERF_REG_X86_IP);

pub(super) const NANOS_PER_SECOND: u64 = 1_000_000_000;

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

/// The attribute of our sampling event, wherever it is placed (see [`Placement::apply`](super::open::Placement::apply)).
pub(super) fn base_attr(
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

/// Bytes of user stack copied with each context-switch sample, at most: 2 KiB. A
/// thread that blocks is in a system call, a few library frames below the code that
/// called it (the lock, sleep or read wrapper and its helpers use a few hundred bytes);
/// CFI needs only those before the frame-pointer chain can take over. A full sampling
/// copy (16 KiB in hybrid mode) at every switch would multiply the ring traffic of a
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

/// Bytes of user stack copied at a process's `exit_group`: 8 KiB. `exit` is called from
/// `main`'s caller or a few frames below it, after its handlers have returned; a copy
/// of that size holds the frames CFI needs until the frame-pointer chain takes over.
const EXIT_STACK_BYTES: u32 = 8192;

/// The attribute of the event beside the sampling event `sampling` that takes a sample
/// at each `exit_group` of a followed thread (the tracepoint `tracepoint`, the id of
/// `syscalls:sys_enter_exit_group`), with the sampling event's layout but its own
/// stack copy ([`EXIT_STACK_BYTES`]) and no kernel frames.
pub(crate) fn exit_attr(sampling: &pb::perf_event_attr, tracepoint: u64) -> pb::perf_event_attr {
    let mut attr = *sampling;
    attr.type_ = pb::PERF_TYPE_TRACEPOINT;
    attr.config = tracepoint;
    attr.set_freq(0);
    attr.__bindgen_anon_1.sample_period = 1;
    attr.sample_stack_user = EXIT_STACK_BYTES;
    // As for the context-switch event: with the period in the sample the kernel would
    // ignore the one asked for.
    attr.sample_type &= !(pb::PERF_SAMPLE_PERIOD as u64);
    attr.set_exclude_callchain_kernel(1);
    attr.set_mmap(0);
    attr.set_mmap2(0);
    attr.set_comm(0);
    attr.set_comm_exec(0);
    attr.set_task(0);
    attr
}

/// The attribute of an event that never samples but writes the side-band records of
/// `sampling` (maps, names, forks, exits) in its layout: for CPUs outside `-C`.
pub(super) fn side_band_attr(sampling: &pb::perf_event_attr) -> pb::perf_event_attr {
    let mut attr = *sampling;
    attr.type_ = pb::PERF_TYPE_SOFTWARE;
    attr.config = pb::PERF_COUNT_SW_DUMMY as u64;
    attr.set_freq(0);
    attr.__bindgen_anon_1.sample_period = 0;
    attr
}
