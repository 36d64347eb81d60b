//! Recording: everything that knows about perf. It launches the command, opens one
//! sampling event per CPU that follows every thread and child process, drains the ring
//! buffers while the command runs, and hands over a [`crate::events::Recording`]: a
//! time-ordered log of plain events (samples, library maps, thread names, forks, exits,
//! losses) that the rest of the pipeline consumes without knowing where it came from.
//!
//! One concern per file: `options` (what to record, how it ended), `cpus` (CPU lists),
//! `attr` (the events' attributes), `open` (opening them), `rings` (their ring
//! buffers), `host` (machine settings and the clock), `program` (the command's file and
//! the pids to attach to), `session` (a recording from start to end), `start` (the
//! target started with its events), `kallsyms` (the kernel's text start), and `parse`,
//! `follow`, `attach`, `launch`, `sys` below them.

mod attach;
mod attr;
mod cpus;
mod follow;
mod host;
pub mod interrupt;
mod kallsyms;
mod kernel_walk;
// The two parts that call the kernel directly; each `unsafe` block says why it is sound.
#[allow(unsafe_code)]
mod launch;
mod open;
mod options;
mod parse;
pub mod procmem;
mod program;
mod rings;
mod session;
pub mod stack_limit;
mod start;
#[allow(unsafe_code)]
mod sys;
mod teardown;
mod tracefs;

use anyhow::Result;

use crate::events::{Event, RecordingInfo};
pub use attach::{guardian_main, GUARDIAN_COMMAND};
pub use attr::{fixed_period, OFF_STEP_DIVISOR};
pub use cpus::{cpu_list_text, online_cpus, parse_cpu_list};
pub use kallsyms::{kallsyms_line, kernel_text_start};
pub use launch::{Credentials, NotRun};
pub use options::{
    CommandExit, DetachReason, Ended, KernelUnwind, RecordOptions, Target, STOP_SIGNALS,
};
pub use program::{program_path, resolve_pids};
pub use rings::min_ring_pages;
pub use sys::{release_free_memory, tune_allocator, zeroed_shared};
pub use teardown::Teardown;
pub use tracefs::{tracepoint_id_main, TRACEPOINT_ID_COMMAND};

/// Where a recording's events go as they are read.
pub trait Sink {
    /// Events that come after every event handed on before, in time order.
    fn events(&mut self, events: &[Event]);

    /// A window of a continuous recording ([`RecordOptions::every`]) closed at
    /// `info.end_ns`: every event up to then has been handed on, none after it.
    fn window(&mut self, info: RecordingInfo) {
        let _ = info;
    }
}

/// A closure takes the events of a recording without windows.
impl<F: FnMut(&[Event])> Sink for F {
    fn events(&mut self, events: &[Event]) {
        self(events)
    }
}

/// Records `opts.target` and hands the events to `sink` in time order, in batches, while
/// it runs. A launched command is recorded until it exits: Ctrl-C, SIGTERM and the other
/// [`STOP_SIGNALS`] are forwarded to it (unless the terminal sent them to it already)
/// and a second one kills it. Attached processes are recorded until `opts.duration`, one
/// of [`STOP_SIGNALS`] (which stop the recording, not the processes), or until they have
/// all exited. With [`RecordOptions::every`], `sink` is also told of each window as it
/// closes; the info returned is then the last window's. The [`Teardown`] closes the
/// events and puts the machine back while the caller goes on: keep it until the
/// profile is written.
pub fn record(
    opts: &RecordOptions,
    sink: &mut dyn Sink,
) -> Result<(RecordingInfo, Ended, Teardown)> {
    let mut session = session::Session::start(opts)?;
    let ended = session.run(sink)?;
    let (info, teardown) = session.finish(opts, ended, sink);
    Ok((info, ended, teardown))
}
