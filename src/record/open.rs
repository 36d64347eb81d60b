//! Opening a recording's events: where they are placed (per task or per CPU), the
//! sampling event asked for or the fallbacks when the machine refuses it, the
//! context-switch events of off-CPU recording, the `exit_group` events, the side-band
//! events outside `-C`, and the errors that say which setting to change.

use std::collections::HashSet;

use anyhow::{bail, Context, Result};
use perf_event_open_sys::bindings as pb;

use super::attr::{base_attr, exit_attr, fixed_period, side_band_attr, switch_attr};
use super::cpus::online_cpus;
use super::host::read_sysctl;
use super::rings::{map_rings, min_ring_pages};
use super::sys;
use crate::events::{OffCpuRecording, Rate, SamplingEvent, Scope};

/// The perf events of one recording (one per CPU and followed task) and their ring
/// buffers, one per CPU where the kernel lets events share one.
pub(super) struct OpenEvents {
    pub(super) event: SamplingEvent,
    /// The fixed period of the samples, or `None` when each carries its own.
    pub(super) period: Option<u64>,
    /// Per task, or per CPU (filtered to the followed processes, or the whole machine).
    pub(super) scope: Scope,
    pub(super) kernel_included: bool,
    pub(super) attr: pb::perf_event_attr,
    pub(super) fds: Vec<std::os::fd::OwnedFd>,
    pub(super) rings: Vec<sys::RingBuffer>,
    /// The events (indexes into `fds`) that own the rings: the ones to poll.
    pub(super) ring_owners: Vec<usize>,
    /// The CPU of each ring (beside `ring_owners`).
    pub(super) ring_cpus: Vec<i32>,
    pub(super) ring_pages: usize,
    /// The ids of the context-switch events (off-CPU recording), whose samples are the
    /// stacks at which threads left the CPU.
    pub(super) switch_ids: HashSet<u64>,
    /// The ids of the `exit_group` events (none where the tracepoint cannot be used).
    pub(super) exit_ids: HashSet<u64>,
    /// How many of `fds` (the first) are sampling events.
    pub(super) sampling_fds: usize,
    pub(super) off_cpu: OffCpuRecording,
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

/// Where the kernel numbers the `exit_group` tracepoint (tracefs, as mounted by systemd or
/// under debugfs).
const EXIT_GROUP_IDS: [&str; 2] = [
    "/sys/kernel/tracing/events/syscalls/sys_enter_exit_group/id",
    "/sys/kernel/debug/tracing/events/syscalls/sys_enter_exit_group/id",
];

/// The `exit_group` tracepoint, as tracefs names it.
const EXIT_GROUP_TRACEPOINT: &str = "syscalls/sys_enter_exit_group";

/// The `exit_group` events beside the sampling event `sampling` (see
/// [`exit_attr`]) and their ids; `None` where tracefs cannot be read, mounted or not
/// (not root), or the kernel refuses them: the teardown samples of exiting processes
/// then keep no user stack, as before.
fn open_exit_events(
    sampling: &pb::perf_event_attr,
    placement: Placement<'_>,
    cpus: &[i32],
) -> Option<(CpuEvents, HashSet<u64>)> {
    let id = EXIT_GROUP_IDS
        .iter()
        .find_map(|path| {
            std::fs::read_to_string(path)
                .ok()?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .or_else(|| super::tracefs::id_in_private_mount(EXIT_GROUP_TRACEPOINT))?;
    let fds = open_placed(&exit_attr(sampling, id), placement, cpus).ok()?;
    let ids = fds
        .iter()
        .map(|(_, fd)| sys::event_id(fd).ok())
        .collect::<Option<HashSet<u64>>>()?;
    Some((fds, ids))
}

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

/// The sampling event's attribute: [`base_attr`], and for per-CPU events of followed
/// processes without the idle task. A timer fires on an idle CPU as often as on a busy
/// one, and the idle task is never a followed process: on a 2-CPU machine running a
/// one-thread command, half the samples written would be the idle CPU's (the kernel
/// honours `exclude_idle` for its two timer events; `-a` keeps them: idle time is part
/// of the machine's profile).
fn sampling_attr(
    request: &EventRequest,
    scope: Scope,
    event: SamplingEvent,
    include_kernel: bool,
) -> pb::perf_event_attr {
    let mut attr = base_attr(
        event,
        request.rate,
        request.max_stack,
        request.stack_bytes,
        include_kernel,
    );
    if scope == Scope::FollowedOnCpus
        && matches!(event, SamplingEvent::CpuClock | SamplingEvent::TaskClock)
    {
        attr.set_exclude_idle(1);
    }
    attr
}

/// Opens the sampling events of `request` at `placement`: the event asked for, or
/// cycles if the PMU has them, else cpu-clock; with kernel frames if allowed, else
/// without.
pub(super) fn open_events(
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
        let attr = sampling_attr(request, scope, event, include_kernel);
        match open_placed(&attr, placement, cpus) {
            Ok(fds) => {
                return open_beside(
                    request,
                    placement,
                    scope,
                    (event, include_kernel),
                    attr,
                    fds,
                )
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

/// The events beside the sampling events `fds` (of `event`, with kernel frames or not,
/// whose attribute is `attr`): the context-switch events of off-CPU recording, the
/// `exit_group` events, the side-band events outside `-C`; and the rings they share.
fn open_beside(
    request: &EventRequest,
    placement: Placement<'_>,
    scope: Scope,
    (event, include_kernel): (SamplingEvent, bool),
    attr: pb::perf_event_attr,
    mut fds: CpuEvents,
) -> Result<OpenEvents> {
    let cpus = &request.cpus;
    let sampling_fds = fds.len();
    let mut switch_ids = HashSet::new();
    let off_cpu = match request.off_cpu {
        None => OffCpuRecording::Off,
        Some(period) => match open_switch_events(&attr, period, include_kernel, placement, cpus) {
            Ok((switch_fds, ids)) => {
                fds.extend(switch_fds);
                switch_ids = ids;
                OffCpuRecording::On {
                    switch_period: period,
                }
            }
            Err(why) => OffCpuRecording::Refused(why),
        },
    };
    let exit_ids = match open_exit_events(&attr, placement, cpus) {
        Some((exit_fds, ids)) => {
            fds.extend(exit_fds);
            ids
        }
        None => HashSet::new(),
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
    let ring_cpus = ring_owners
        .iter()
        .map(|&i| {
            let c = fds[i].0;
            cpus.get(c)
                .copied()
                .unwrap_or_else(|| others[c - cpus.len()])
        })
        .collect();
    Ok(OpenEvents {
        event,
        period: fixed_period(event, request.rate),
        scope,
        kernel_included: include_kernel,
        attr,
        fds: fds.into_iter().map(|(_, fd)| fd).collect(),
        rings,
        ring_owners,
        ring_cpus,
        ring_pages,
        switch_ids,
        exit_ids,
        sampling_fds,
        off_cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_per_cpu_timer_events_of_followed_processes_leave_the_idle_task_out() {
        let request = EventRequest {
            event: None,
            rate: Rate::Frequency(1000),
            max_stack: 127,
            stack_bytes: 8192,
            mmap_pages: 64,
            off_cpu: None,
            cpus: vec![0],
        };
        let idle_out =
            |scope, event| sampling_attr(&request, scope, event, true).exclude_idle() == 1;
        assert!(idle_out(Scope::FollowedOnCpus, SamplingEvent::CpuClock));
        assert!(idle_out(Scope::FollowedOnCpus, SamplingEvent::TaskClock));
        // `-a` shows the idle CPUs; per-task events never see the idle task.
        assert!(!idle_out(Scope::System, SamplingEvent::CpuClock));
        assert!(!idle_out(Scope::Tasks, SamplingEvent::CpuClock));
        // Hardware counters do not count in a halted CPU, and some PMUs refuse the bit.
        assert!(!idle_out(Scope::FollowedOnCpus, SamplingEvent::Cycles));
        assert!(!idle_out(Scope::FollowedOnCpus, SamplingEvent::PageFaults));
    }
}
