//! One recording session: the machine prepared for it, the target launched or attached,
//! the loop that drains the ring buffers and hands events on until the recording ends,
//! and the facts gathered at its end.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use perf_event_open_sys::bindings as pb;

use super::attr::{exit_attr, switch_attr, NANOS_PER_SECOND};
use super::cpus::online_cpus;
use super::host::{monotonic_ns, raise_open_file_limit, read_sysctl, RECORDER_NICE};
use super::kernel_walk::{kernel_walker, say_kernel_walks, KernelWalker};
use super::launch;
use super::open::{may_watch_cpus, EventRequest, OpenEvents};
use super::options::{CommandExit, DetachReason, Ended, RecordOptions, Target, STOP_SIGNALS};
use super::program::set_id_program;
use super::rings::default_ring_pages;
use super::start::{start_attached, start_command, start_system, Started};
use super::{attach, follow, parse, stack_limit, sys, Sink};
use crate::events::{
    Event, EventKind, OffCpuRecording, Rate, RecordingGaps, RecordingInfo, SamplingEvent, Scope,
};

/// How often the loop wakes up to drain buffers and refresh the status line even when the
/// kernel has not signalled a full watermark (or the unwinder in the kernel a sample it
/// could not walk for want of what sampler has yet to read: see `kernel_walk`'s
/// `WAKE_GAP_NS`). A wake-up costs some 60 µs of CPU on a VM of 2 CPUs: at 10 ms, they
/// took a third of the profiler's CPU on a 3-s command.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How long the start of a recording with the unwinder in the kernel lasts: until then
/// the program may wake sampler every millisecond (then every ten), so that the
/// command's (or attached processes') first mappings reach it at once.
const KERNEL_WALK_START_NS: u64 = 30_000_000;

/// How far behind the drain time events are held back before they are handed on: the
/// per-CPU buffers are each in time order but are read one after the other, and a record
/// stamped just before a drain may still be being written. 50 ms is far more than that
/// takes and keeps the pending events small.
const REORDER_WINDOW_NS: u64 = 50_000_000;

/// Live counters for the status line and the summary.
#[derive(Default)]
struct Progress {
    counts: Counts,
    /// The threads sampled (in a continuous recording, in the current window).
    tids: HashSet<i32>,
    /// Processes started while recording that have not exited (pid == tid forks).
    processes: HashSet<i32>,
}

/// What the recording counts as it goes; a continuous recording's window reports what
/// was counted while it lasted (the difference of two of these).
#[derive(Clone, Copy, Default)]
pub(super) struct Counts {
    /// Samples handed on (of the followed processes).
    samples: u64,
    /// Samples read from the rings (with per-CPU events, of every task on the CPUs).
    ring_samples: u64,
    /// Bytes of all sample records, as the kernel wrote them.
    sample_bytes: u64,
    lost: u64,
    throttled: u64,
    /// Sample records the parser could not read (counted as lost).
    unparsed_samples: u64,
    /// Ring data that could not be parsed, and in how many stretches.
    unreadable_bytes: u64,
    unreadable_stretches: u64,
    /// Samples of sampler's own process, left out of a whole-machine profile.
    own_samples: u64,
    /// Samples lost while a process that is not followed ran (see
    /// [`RecordingInfo::lost_elsewhere`]).
    lost_elsewhere: u64,
}

impl Counts {
    /// What was counted since `before`.
    fn since(&self, before: &Counts) -> Counts {
        Counts {
            samples: self.samples - before.samples,
            ring_samples: self.ring_samples - before.ring_samples,
            sample_bytes: self.sample_bytes - before.sample_bytes,
            lost: self.lost - before.lost,
            throttled: self.throttled - before.throttled,
            unparsed_samples: self.unparsed_samples - before.unparsed_samples,
            unreadable_bytes: self.unreadable_bytes - before.unreadable_bytes,
            unreadable_stretches: self.unreadable_stretches - before.unreadable_stretches,
            own_samples: self.own_samples - before.own_samples,
            lost_elsewhere: self.lost_elsewhere - before.lost_elsewhere,
        }
    }

    /// Samples in unreadable ring data: as many as the bytes would hold at the size the
    /// readable samples had (at least one per corrupt stretch).
    fn unreadable_samples(&self) -> u64 {
        if self.unreadable_bytes == 0 {
            return 0;
        }
        let per_sample = self
            .sample_bytes
            .checked_div(self.ring_samples)
            .unwrap_or(64);
        (self.unreadable_bytes / per_sample.max(8)).max(self.unreadable_stretches)
    }
}

/// A recording under way: the machine prepared, the target running with its events
/// attached, the events read so far.
pub(super) struct Session {
    /// Declared before `deeper`: fields drop in order, and the frame limit can be put
    /// back only once the events are closed.
    events: OpenEvents,
    /// The unwinder in the kernel, when it walks the user stacks. Declared before
    /// `deeper` too: its program holds the kernel's callchain buffers (for its kernel
    /// frames), and while any are held the frame limit cannot be changed.
    walker: Option<KernelWalker>,
    /// The frame limit raised for this session (put back when it is dropped).
    deeper: stack_limit::DeeperStacks,
    signal_fd: SignalFd,
    /// How often, as asked (with the frequency lowered to what the kernel allows).
    rate: Rate,
    /// The CPUs of `-C`, when they are not all the online ones.
    only_cpus: Option<Vec<i32>>,
    max_stack: u16,
    parser: parse::Parser,
    target: Running,
    /// The command line, or `-p PID,...`.
    description: Vec<String>,
    stopped_for: Option<Duration>,
    left_stopped: Vec<i32>,
    start_ns: u64,
    start_unix_ms: f64,
    /// Events read but not yet handed on (see [`REORDER_WINDOW_NS`]).
    pending: Vec<Event>,
    /// With per-CPU events for a command or attached processes: whose records to keep.
    followed: Option<follow::Followed>,
    /// With `-a`: sampler's own pid, whose samples are left out (see [`own_work`]).
    own_pid: Option<i32>,
    progress: Progress,
    /// Where the kernel's text starts, when kernel frames are recorded.
    kernel_text: Option<u64>,
    /// In a continuous recording, the window under way.
    window: Option<Window>,
}

/// A continuous recording's current window (see [`RecordOptions::every`]).
struct Window {
    every_ns: u64,
    /// When it started (the end of the one before, or the recording's start).
    start_ns: u64,
    /// What had been counted when it started.
    counted: Counts,
}

/// The kernel walker where it runs (and what to say of it), the frame limit and the
/// depth the kernel's callchains get. The walker's depth is its own bound: with it the
/// machine-wide frame limit stays as it is, but for a repair of what a killed session
/// left, done first (the loaded program's callchain buffers keep the kernel from any
/// change); without it the limit is raised to `--max-stack`.
fn walker_and_frame_limit(
    opts: &RecordOptions,
) -> Result<(
    Option<KernelWalker>,
    Option<String>,
    stack_limit::DeeperStacks,
    u16,
)> {
    let unchanged = stack_limit::DeeperStacks::unchanged();
    let (walker, note) = kernel_walker(opts)?;
    let deeper = match walker {
        Some(_) => unchanged,
        None => stack_limit::DeeperStacks::raise(u64::from(opts.max_stack)),
    };
    let max_stack = deeper
        .limit
        .min(u64::from(opts.max_stack))
        .min(u64::from(stack_limit::MAX_FITTING_FRAMES)) as u16;
    Ok((walker, note, deeper, max_stack))
}

impl Session {
    /// Prepares the machine (signals, the frame limit, file limits, priority), then
    /// launches the command or stops the processes, attaches the events, and lets the
    /// target run.
    pub(super) fn start(opts: &RecordOptions) -> Result<Session> {
        let (signals, signal_fd) = take_signals()?;
        let frequency_hz = allowed_frequency(opts.rate);
        if let Target::Pids(pids) = &opts.target {
            for &pid in pids {
                attach::check_pid(pid)?;
            }
        }
        // Busy targets with many threads would otherwise get the CPU before the recorder,
        // which then drains the buffers and loads the unwind tables too late: a root
        // recorder goes ahead of them, with every thread it starts (the table loader's
        // too: set before them). Its own work is small. Without the privilege it keeps
        // its nice value. The command runs at the nice value sampler was started with.
        let command_nice = sys::nice();
        let _ = sys::set_nice(RECORDER_NICE);
        let (mut walker, walker_note, deeper, max_stack) = walker_and_frame_limit(opts)?;
        let ring_pages = opts
            .mmap_pages
            .unwrap_or_else(|| default_ring_pages(opts.stack_bytes, opts.off_cpu.is_some()));
        raise_open_file_limit();

        let online = online_cpus();
        // `-C` naming every online CPU limits nothing.
        let only_cpus = opts.cpus.clone().filter(|cpus| *cpus != online);
        let request = EventRequest {
            event: opts.event,
            rate: match opts.rate {
                Rate::Frequency(_) => Rate::Frequency(frequency_hz),
                fixed => fixed,
            },
            max_stack,
            stack_bytes: opts.stack_bytes,
            mmap_pages: ring_pages,
            off_cpu: opts.off_cpu,
            cpus: only_cpus.clone().unwrap_or(online),
        };
        // Per-CPU events, where allowed: they sample on across thread births, which
        // per-task events (each new thread starting a fresh period) do not.
        let per_cpu = may_watch_cpus(request.cpus[0]);
        let started = match &opts.target {
            Target::Command(command) => start_command(
                command,
                &signals,
                opts.run_as.as_ref(),
                command_nice,
                &request,
                per_cpu,
                walker.as_mut(),
            )?,
            Target::Pids(pids) => {
                start_attached(pids, opts.duration, &request, per_cpu, walker.as_mut())?
            }
            Target::System => start_system(
                opts.duration,
                &request,
                only_cpus.as_deref(),
                walker.as_mut(),
            )?,
        };
        let Started {
            events,
            target,
            description,
            stopped_for,
            left_stopped,
            start_ns,
            pending,
            followed,
            own_pid,
        } = started;
        let start_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        announce(opts, &events, request.rate, stopped_for);
        if let Some(note) = walker_note {
            say!("sampler: {note}");
        }
        let kernel_text = match events.kernel_included {
            true => super::kernel_text_start(),
            false => None,
        };
        let parser = parse::Parser::new(
            &events.attr,
            events.period,
            &switch_attr(&events.attr, 1),
            events.switch_ids.clone(),
            (&exit_attr(&events.attr, 0), events.exit_ids.clone()),
            walker.as_ref().map(KernelWalker::walks),
        );
        Ok(Session {
            signal_fd,
            deeper,
            rate: request.rate,
            only_cpus,
            max_stack,
            events,
            parser,
            target,
            description,
            stopped_for,
            left_stopped,
            start_ns,
            start_unix_ms,
            pending,
            followed,
            own_pid,
            progress: Progress::default(),
            kernel_text,
            window: opts.every.map(|every| Window {
                every_ns: every.as_nanos().min(u128::from(u64::MAX)) as u64,
                start_ns,
                counted: Counts::default(),
            }),
            walker,
        })
    }

    /// Drains the ring buffers and hands events on until the recording ends: the command
    /// exited, or (attached) the duration passed, a stop signal came, or every process
    /// exited.
    pub(super) fn run(&mut self, sink: &mut dyn Sink) -> Result<Ended> {
        let status_line = std::io::stderr().is_terminal();
        let mut last_status = Instant::now();
        loop {
            {
                let mut poll_fds: Vec<PollFd> =
                    vec![PollFd::new(self.signal_fd.as_fd(), PollFlags::POLLIN)];
                poll_fds.extend(
                    self.events
                        .ring_owners
                        .iter()
                        .map(|&i| PollFd::new(self.events.fds[i].as_fd(), PollFlags::POLLIN)),
                );
                let timeout = PollTimeout::from(POLL_INTERVAL.as_millis() as u16);
                match nix::poll::poll(&mut poll_fds, timeout) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(e).context("poll"),
                }
            }
            let drained_at = monotonic_ns();
            if let Some(walker) = &mut self.walker {
                if drained_at.saturating_sub(self.start_ns) >= KERNEL_WALK_START_NS {
                    walker.settle();
                }
            }
            self.drain();
            let ready_ns = drained_at.saturating_sub(REORDER_WINDOW_NS);
            self.close_windows(sink, ready_ns);
            self.hand_on(sink, ready_ns);
            while let Ok(Some(info)) = self.signal_fd.read_signal() {
                let signo = info.ssi_signo as i32;
                if signo != libc::SIGCHLD {
                    self.target
                        .on_signal(signo, info.ssi_code == libc::SI_KERNEL);
                }
            }
            if let Some(ended) = self.target.ended()? {
                if status_line {
                    say_partial!("\r\x1b[K");
                }
                return Ok(ended);
            }
            if status_line && last_status.elapsed() >= Duration::from_millis(250) {
                say_partial!(
                    "\rsampler: {} samples, {} threads, {} lost   ",
                    self.progress.counts.samples,
                    self.progress.tids.len(),
                    self.progress.counts.lost
                );
                last_status = Instant::now();
            }
        }
    }

    /// In a continuous recording, closes each window that ended by `ready_ns` (the time up
    /// to which every event has been read): its events are handed on, then the window
    /// itself.
    fn close_windows(&mut self, sink: &mut dyn Sink, ready_ns: u64) {
        while let Some(end_ns) = self
            .window
            .as_ref()
            .map(|w| w.start_ns.saturating_add(w.every_ns))
            .filter(|&end| end <= ready_ns)
        {
            self.hand_on(sink, end_ns);
            sink.window(self.info(end_ns));
            self.progress.tids.clear();
            let counted = self.progress.counts;
            if let Some(w) = &mut self.window {
                w.start_ns = end_ns;
                w.counted = counted;
            }
        }
    }

    /// Hands the pending events stamped at or before `up_to_ns` to `sink`, in time
    /// order, and keeps the rest (each CPU's buffer is in time order, but the buffers
    /// interleave). With per-CPU events for a command or attached processes, only the
    /// followed processes' events are handed on.
    fn hand_on(&mut self, sink: &mut dyn Sink, up_to_ns: u64) {
        self.pending.sort_by_key(|e| e.time_ns);
        let mut ready = self.pending.partition_point(|e| e.time_ns <= up_to_ns);
        // Moves the kept events to the front, in their order: with per-CPU events for a
        // command or attached processes, the followed processes' (a loss stamped with
        // another's counted apart); with -a, all but sampler's own work (counted).
        if self.followed.is_some() || self.own_pid.is_some() {
            let mut kept = 0;
            for i in 0..ready {
                let event = &self.pending[i];
                let keep = match (&mut self.followed, self.own_pid) {
                    (Some(followed), _) => {
                        let keep = followed.keep(event);
                        if let Some(walker) = &mut self.walker {
                            walker.learn_strangers(followed, event, keep);
                        }
                        if let (false, EventKind::Lost { count, .. }) = (keep, &event.kind) {
                            self.progress.counts.lost_elsewhere += count;
                        }
                        keep
                    }
                    (None, Some(own)) => match own_work(&event.kind, own) {
                        Some(is_sample) => {
                            self.progress.counts.own_samples += u64::from(is_sample);
                            false
                        }
                        None => true,
                    },
                    (None, None) => true,
                };
                if keep {
                    self.pending.swap(kept, i);
                    kept += 1;
                }
            }
            self.pending.drain(kept..ready);
            ready = kept;
        }
        count_handed_on(&self.pending[..ready], &mut self.progress);
        sink.events(&self.pending[..ready]);
        self.pending.drain(..ready);
    }

    fn drain(&mut self) {
        let from = self.pending.len();
        drain_all(
            &mut self.events.rings,
            &self.parser,
            &mut self.pending,
            &mut self.progress,
        );
        if let Some(walker) = &mut self.walker {
            // The processes' new mappings first, in time order across the rings, so that
            // their next samples are walked in the kernel.
            let new = &mut self.pending[from..];
            new.sort_by_key(|e| e.time_ns);
            let filtered = self.followed.is_some();
            for event in new.iter() {
                walker.on_event(event);
                if filtered {
                    walker.strangers_read(event);
                }
            }
            walker.collect();
        }
    }

    /// Stops the events, reads what is left, hands everything on, and says what the
    /// recording was (in a continuous recording, its last window). The events are closed
    /// and the frame limit put back by the [`Teardown`] returned.
    pub(super) fn finish(
        mut self,
        opts: &RecordOptions,
        ended: Ended,
        sink: &mut dyn Sink,
    ) -> (RecordingInfo, super::teardown::Teardown) {
        for fd in &self.events.fds {
            let _ = sys::disable(fd);
        }
        self.drain();
        let end_ns = monotonic_ns();
        self.hand_on(sink, u64::MAX);
        if let Some(walker) = &self.walker {
            say_kernel_walks(walker);
        }
        let outliving = match &self.target {
            Running::Launched { pid, .. } => self
                .progress
                .processes
                .iter()
                .copied()
                .filter(|&p| p != pid.as_raw() && !attach::has_exited(p))
                .map(|p| {
                    let name =
                        std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
                    (p, name.trim_end().to_string())
                })
                .collect(),
            Running::Attached { .. } => Vec::new(),
        };
        let mut info = self.info(end_ns);
        info.gaps.stack_limit = self.deeper.outcome;
        info.gaps.left_stopped = std::mem::take(&mut self.left_stopped);
        info.gaps.outliving = outliving;
        // Per-CPU events are not the program's own: the kernel does not end them when it
        // gains privileges.
        info.gaps.set_id_program = match &opts.target {
            Target::Command(command) if self.events.scope == Scope::Tasks => {
                set_id_program(&command[0])
            }
            Target::Command(_) | Target::Pids(_) | Target::System => None,
        };
        info.command_cpu = match (&self.target, ended) {
            (Running::Launched { .. }, Ended::Command(_)) => children_cpu_time(),
            _ => None,
        };
        let teardown = super::teardown::Teardown::start(self.events, self.walker, self.deeper);
        (info, teardown)
    }

    /// What the recording (in a continuous recording, the current window) was from its
    /// start to `end_ns`: its settings, and what was counted meanwhile.
    fn info(&self, end_ns: u64) -> RecordingInfo {
        let (start_ns, counts) = match &self.window {
            Some(w) => (w.start_ns, self.progress.counts.since(&w.counted)),
            None => (self.start_ns, self.progress.counts),
        };
        let unreadable_samples = counts.unreadable_samples();
        RecordingInfo {
            event: self.events.event,
            frequency_hz: match (self.events.period, self.rate) {
                (_, Rate::Frequency(hz)) => hz,
                (Some(p), Rate::Period(_)) if self.events.event.is_time() => {
                    NANOS_PER_SECOND / p.max(1)
                }
                (_, Rate::Period(_)) => 0,
            },
            period: self.events.period,
            scope: self.events.scope,
            cpus: self.only_cpus.clone().unwrap_or_default(),
            start_unix_ms: self.start_unix_ms + start_ns.saturating_sub(self.start_ns) as f64 / 1e6,
            start_ns,
            end_ns,
            lost_samples: counts.lost + counts.unparsed_samples + unreadable_samples,
            throttled: counts.throttled,
            kernel_included: self.events.kernel_included,
            kernel_text: self.kernel_text,
            max_stack: self.max_stack,
            gaps: RecordingGaps {
                unreadable_bytes: counts.unreadable_bytes,
                unreadable_samples,
                ..RecordingGaps::default()
            },
            command: self.description.clone(),
            root_pid: self.target.root_pid(),
            ring_pages: self.events.ring_pages,
            stopped_for: self.stopped_for,
            // The followed processes' share of the bytes (with per-CPU events, the rings
            // also carried every other task's samples).
            sample_bytes: (counts.sample_bytes as u128 * u128::from(counts.samples)
                / u128::from(counts.ring_samples.max(1))) as u64,
            logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            off_cpu: self.events.off_cpu.clone(),
            command_cpu: None,
            own_samples: counts.own_samples,
            lost_elsewhere: counts.lost_elsewhere,
            walked_in_kernel: self.walker.is_some(),
        }
    }
}

/// Blocks the [`STOP_SIGNALS`] and SIGCHLD (with SIGCHLD's default action, so that the
/// launched command can be waited for) and opens the descriptor the session reads them
/// from.
fn take_signals() -> Result<(SigSet, SignalFd)> {
    let mut signals = SigSet::empty();
    for signal in STOP_SIGNALS {
        signals.add(signal);
    }
    signals.add(Signal::SIGCHLD);
    launch::default_sigchld()?;
    launch::block_signals(&signals)?;
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
    Ok((signals, signal_fd))
}

/// The frequency of `rate` (0 for a period), lowered with a warning to
/// `kernel.perf_event_max_sample_rate` when it is above it.
fn allowed_frequency(rate: Rate) -> u64 {
    let max_rate = read_sysctl("perf_event_max_sample_rate").unwrap_or(u64::MAX);
    let mut frequency_hz = match rate {
        Rate::Frequency(hz) => hz,
        Rate::Period(_) => 0,
    };
    if frequency_hz > max_rate {
        say!(
            "sampler: warning: -F {frequency_hz} is above kernel.perf_event_max_sample_rate ({max_rate}); using {max_rate} Hz"
        );
        frequency_hz = max_rate;
    }
    frequency_hz
}

/// Says what is being sampled with which event at which rate, what the machine refused
/// (cycles, kernel frames, off-CPU time), and how long attaching stopped the processes.
fn announce(opts: &RecordOptions, events: &OpenEvents, rate: Rate, stopped_for: Option<Duration>) {
    say!(
        "sampler: sampling {} with {} {}{}{}",
        match &opts.target {
            Target::Command(c) => format!("`{}`", c.join(" ")),
            Target::Pids(pids) => {
                let list: Vec<String> = pids.iter().map(i32::to_string).collect();
                format!("pid {}", list.join(", "))
            }
            Target::System => "the whole machine".to_string(),
        },
        events.event.name(),
        match rate {
            Rate::Period(p) => format!("every {p} events"),
            Rate::Frequency(hz) => format!("at {hz} Hz"),
        },
        match (opts.event, events.event, events.kernel_included) {
            (None, SamplingEvent::CpuClock, true) if opts.off_cpu.is_none() =>
                " (no hardware cycles counter here: using the cpu-clock timer)",
            (None, SamplingEvent::CpuClock, false) if opts.off_cpu.is_none() =>
                " (no hardware cycles counter; kernel frames not permitted)",
            (_, _, false) => " (kernel frames not permitted)",
            _ => "",
        },
        stopped_for.map_or(String::new(), |d| format!(
            "; attached in {:.1} ms",
            d.as_secs_f64() * 1000.0
        )),
    );
    if let OffCpuRecording::Refused(why) = &events.off_cpu {
        say!("sampler: no off-CPU time: {why}; the profile has on-CPU samples only");
    }
}

/// What is being recorded, while it runs.
pub(super) enum Running {
    Launched {
        pid: nix::unistd::Pid,
        interrupts: u32,
    },
    /// Attached processes, or the whole machine (no pids).
    Attached {
        pids: Vec<i32>,
        until: Option<Instant>,
        interrupted: bool,
    },
}

impl Running {
    /// One of [`STOP_SIGNALS`] reached sampler (`from_tty`: sent by the kernel, as a
    /// terminal sends Ctrl-C, Ctrl-\ and a hangup to the whole foreground group, so the
    /// command has it already).
    fn on_signal(&mut self, signo: i32, from_tty: bool) {
        match self {
            Running::Launched { pid, interrupts } => {
                *interrupts += 1;
                let tty_signal = [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP].contains(&signo);
                let forward = if *interrupts > 1 {
                    Some(Signal::SIGKILL)
                } else if !(from_tty && tty_signal) {
                    Signal::try_from(signo).ok()
                } else {
                    None
                };
                if let Some(sig) = forward {
                    let _ = nix::sys::signal::kill(*pid, sig);
                }
            }
            Running::Attached { interrupted, .. } => *interrupted = true,
        }
    }

    /// Whether recording is over, and how.
    fn ended(&mut self) -> Result<Option<Ended>> {
        Ok(match self {
            Running::Launched { pid, .. } => match waitpid(*pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => Some(Ended::Command(CommandExit::Code(code))),
                Ok(WaitStatus::Signaled(_, sig, _)) => {
                    Some(Ended::Command(CommandExit::Signal(sig as i32)))
                }
                Ok(_) => None,
                Err(nix::errno::Errno::ECHILD) => {
                    bail!("lost track of the command (it was reaped by someone else)")
                }
                Err(e) => return Err(e).context("waitpid"),
            },
            Running::Attached {
                pids,
                until,
                interrupted,
            } => {
                if *interrupted {
                    Some(Ended::Detached(DetachReason::Interrupted))
                } else if until.is_some_and(|t| Instant::now() >= t) {
                    Some(Ended::Detached(DetachReason::Duration))
                } else if !pids.is_empty() && pids.iter().all(|&p| attach::has_exited(p)) {
                    Some(Ended::Detached(DetachReason::AllExited))
                } else {
                    None
                }
            }
        })
    }

    fn root_pid(&self) -> i32 {
        match self {
            Running::Launched { pid, .. } => pid.as_raw(),
            Running::Attached { pids, .. } => pids.first().copied().unwrap_or(0),
        }
    }
}

/// The CPU time of sampler's children that were waited for: the launched command (it is
/// sampler's only child) and the children it waited for itself.
fn children_cpu_time() -> Option<Duration> {
    use nix::sys::resource::{getrusage, UsageWho};
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).ok()?;
    let time = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    Some(time(usage.user_time()) + time(usage.system_time()))
}

/// Counts the samples, threads and processes of the events handed on.
/// Whether `kind` is sampler's own work (the samples and switches of process `own`), to
/// be left out of a whole-machine profile: `Some(true)` for an on-CPU sample, which is
/// counted. A profile of the machine is of what else ran; and naming sampler's own code
/// would read its DWARF (tens of MB in a build with line tables), which cost more CPU
/// and memory than the rest of a 5 s recording at 4000 Hz (measured: 0.28 s and 73 MB
/// of CPU and peak memory against 0.17 s and 14 MB with its DWARF stripped). The summary
/// says how many samples were left out.
fn own_work(kind: &EventKind, own: i32) -> Option<bool> {
    match kind {
        EventKind::Sample(s) if s.pid == own => Some(true),
        EventKind::SwitchSample(s) | EventKind::ExitStack(s) if s.pid == own => Some(false),
        EventKind::SwitchOut { pid, .. } | EventKind::SwitchIn { pid, .. } if *pid == own => {
            Some(false)
        }
        _ => None,
    }
}

fn count_handed_on(events: &[Event], progress: &mut Progress) {
    for event in events {
        match &event.kind {
            EventKind::Sample(s) => {
                progress.counts.samples += 1;
                progress.tids.insert(s.tid);
            }
            EventKind::Lost { count, .. } => progress.counts.lost += count,
            EventKind::Fork { pid, tid, .. } if pid == tid => {
                progress.processes.insert(*pid);
            }
            EventKind::Exit { pid, tid } if pid == tid => {
                progress.processes.remove(pid);
            }
            _ => {}
        }
    }
}

fn drain_all(
    rings: &mut [sys::RingBuffer],
    parser: &parse::Parser,
    log: &mut Vec<Event>,
    progress: &mut Progress,
) {
    for ring in rings.iter_mut() {
        let drained = ring.drain(|record| {
            // The 8-byte record header and the body.
            let bytes = 8 + record.body.0.len() + record.body.1.len();
            let is_sample = record.kind == pb::PERF_RECORD_SAMPLE;
            let event = match parser.parse(record) {
                parse::Parsed::Event(event) => event,
                parse::Parsed::WakeUp => return,
                parse::Parsed::Unused => {
                    progress.counts.unparsed_samples += u64::from(is_sample);
                    return;
                }
            };
            match &event.kind {
                EventKind::Sample(_) => {
                    progress.counts.ring_samples += 1;
                    progress.counts.sample_bytes += bytes as u64;
                }
                EventKind::Throttle => progress.counts.throttled += 1,
                _ => {}
            }
            log.push(event);
        });
        if drained.unreadable_bytes > 0 {
            progress.counts.unreadable_bytes += drained.unreadable_bytes as u64;
            progress.counts.unreadable_stretches += 1;
        }
    }
}
