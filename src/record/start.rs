//! Starting the target of a recording with its events attached: a launched command
//! behind its gate, attached processes stopped while the events open, or the whole
//! machine; each hands the session what it started.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::SigSet;
use nix::sys::wait::waitpid;

use super::cpus::cpu_list_text;
use super::host::monotonic_ns;
use super::kernel_walk::KernelWalker;
use super::launch::{self, Credentials, NotRun};
use super::open::{open_events, EventRequest, OpenEvents, Placement};
use super::session::Running;
use super::{attach, follow, sys};
use crate::events::{Event, Scope};

/// Test hook: `SAMPLER_TEST_FAULT=error|panic|kill` makes attaching fail (or sampler die
/// of SIGKILL) right after the processes were stopped, so tests can check that they are
/// always continued.
const FAULT_ENV: &str = "SAMPLER_TEST_FAULT";

/// A target running with its events attached.
pub(super) struct Started {
    pub(super) events: OpenEvents,
    pub(super) target: Running,
    pub(super) description: Vec<String>,
    pub(super) stopped_for: Option<Duration>,
    pub(super) left_stopped: Vec<i32>,
    pub(super) start_ns: u64,
    /// What attached processes already were, as events.
    pub(super) pending: Vec<Event>,
    /// With per-CPU events for a command or attached processes: whose records to keep.
    pub(super) followed: Option<follow::Followed>,
    /// With `-a`: sampler's own pid, whose samples are left out (see [`own_work`](super::session::own_work)).
    pub(super) own_pid: Option<i32>,
}

/// Launches `command` behind its gate, attaches the events to it (per CPU when
/// `per_cpu`, else to the child and what it starts), and opens the gate.
pub(super) fn start_command(
    command: &[String],
    signals: &SigSet,
    run_as: Option<&Credentials>,
    nice: i32,
    request: &EventRequest,
    per_cpu: bool,
    walker: Option<&mut KernelWalker>,
) -> Result<Started> {
    let mut child = launch::GatedChild::spawn(command, signals, run_as, nice)
        .with_context(|| format!("could not start `{}`", command.join(" ")))?;
    let pid = child.pid;
    let opened = open_followed(request, per_cpu, false, || vec![pid.as_raw()]);
    let enabled = opened.and_then(|events| {
        if per_cpu {
            for fd in &events.fds {
                sys::enable(fd).context("could not start the per-CPU events")?;
            }
        }
        if let Some(walker) = walker {
            walker.attach(&events).map_err(anyhow::Error::msg)?;
            walker.follow(pid.as_raw());
        }
        Ok(events)
    });
    let events = match enabled {
        Ok(e) => e,
        Err(e) => {
            // Closing the gate makes the child exit without running the command.
            drop(child);
            let _ = waitpid(pid, None);
            return Err(e);
        }
    };
    let start_ns = monotonic_ns();
    if let Err(error) = child.release() {
        let _ = waitpid(pid, None);
        return Err(NotRun {
            program: command[0].clone(),
            error,
        }
        .into());
    }
    Ok(Started {
        events,
        target: Running::Launched { pid, interrupts: 0 },
        description: command.to_vec(),
        stopped_for: None,
        left_stopped: Vec::new(),
        start_ns,
        pending: Vec::new(),
        followed: per_cpu.then(|| follow::Followed::from_exec(pid.as_raw())),
        own_pid: None,
    })
}

/// The events of a command or attached processes: per CPU when `per_cpu` (their records
/// are then filtered), else on each of `tasks` and inherited by what they start.
/// `started`: sampling at once, else from the command's exec (per task) or once the
/// events are enabled (per CPU).
fn open_followed(
    request: &EventRequest,
    per_cpu: bool,
    started: bool,
    tasks: impl FnOnce() -> Vec<i32>,
) -> Result<OpenEvents> {
    if per_cpu {
        return open_events(request, Placement::Cpus { started }, Scope::FollowedOnCpus);
    }
    let tasks = tasks();
    let placement = Placement::Tasks {
        tasks: &tasks,
        started,
    };
    open_events(request, placement, Scope::Tasks)
}

/// Stops the processes, attaches the events (per CPU when `per_cpu`, else to every
/// thread), describes what they already are, and continues them (always, also when
/// this fails half way).
pub(super) fn start_attached(
    pids: &[i32],
    duration: Option<Duration>,
    request: &EventRequest,
    per_cpu: bool,
    walker: Option<&mut KernelWalker>,
) -> Result<Started> {
    let left_stopped = pids
        .iter()
        .copied()
        .filter(|&p| matches!(attach::process_state(p), Some('T' | 't')))
        .collect();
    let stopped = attach::Stopped::stop(pids)?;
    match std::env::var(FAULT_ENV).as_deref() {
        Ok("error") => bail!("{FAULT_ENV}=error: failing after stopping the processes"),
        Ok("panic") => panic!("{FAULT_ENV}=panic: panicking after stopping the processes"),
        // As the OOM killer would: no unwinding, no Drop.
        Ok("kill") => nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL)?,
        _ => {}
    }
    let events = open_followed(request, per_cpu, true, || {
        pids.iter().flat_map(|&p| attach::tasks(p)).collect()
    })?;
    // Sampling starts as the processes continue; -d counts from here.
    let sampling_since = Instant::now();
    let start_ns = monotonic_ns();
    let pending: Vec<Event> = pids
        .iter()
        .flat_map(|&pid| attach::describe(pid, start_ns))
        .collect();
    if let Some(walker) = walker {
        // The tables of what the processes have mapped, before they go on.
        walker.attach(&events).map_err(anyhow::Error::msg)?;
        for &pid in pids {
            walker.follow(pid);
        }
        for event in &pending {
            walker.on_event(event);
        }
    }
    let stopped_for = stopped.resume();
    let list: Vec<String> = pids.iter().map(i32::to_string).collect();
    Ok(Started {
        events,
        target: Running::Attached {
            pids: pids.to_vec(),
            until: duration.map(|d| sampling_since + d),
            interrupted: false,
        },
        description: vec!["-p".to_string(), list.join(",")],
        stopped_for: Some(stopped_for),
        left_stopped,
        start_ns,
        pending,
        followed: per_cpu.then(|| follow::Followed::processes(pids)),
        own_pid: None,
    })
}

/// Opens per-CPU events for every task, then describes every process already running
/// (their records from then on come from the events; one that starts in between is
/// described twice, which changes nothing).
pub(super) fn start_system(
    duration: Option<Duration>,
    request: &EventRequest,
    only_cpus: Option<&[i32]>,
    walker: Option<&mut KernelWalker>,
) -> Result<Started> {
    // The descriptions are stamped before the events open: read from /proc while the
    // events already sample, they must come first in time order, or the samples of the
    // milliseconds in between find their processes without mappings (measured: 5 stacks
    // of 40,000 at 4000 Hz, in unknown code).
    let start_ns = monotonic_ns();
    let events = open_events(request, Placement::Cpus { started: true }, Scope::System)?;
    let sampling_since = Instant::now();
    let pending = attach::describe_all(start_ns);
    let own_pid = std::process::id() as i32;
    if let Some(walker) = walker {
        walker.attach(&events).map_err(anyhow::Error::msg)?;
        walker.follow_all_but(own_pid);
        for event in &pending {
            walker.on_event(event);
        }
    }
    let mut description = vec!["-a".to_string()];
    if let Some(cpus) = only_cpus {
        description.extend(["-C".to_string(), cpu_list_text(cpus)]);
    }
    Ok(Started {
        events,
        target: Running::Attached {
            pids: Vec::new(),
            until: duration.map(|d| sampling_since + d),
            interrupted: false,
        },
        description,
        stopped_for: None,
        left_stopped: Vec::new(),
        start_ns,
        pending,
        followed: None,
        own_pid: Some(own_pid),
    })
}
