//! sampler: a native sampling profiler for Linux.
//!
//! The crate is a one-way pipeline; each module only uses the ones above it:
//!
//! 1. [`record`]: talks to the kernel (`perf_event_open`, ring buffers, the launched
//!    command) and hands over an [`events::Recording`], a time-ordered log of plain
//!    events that no later stage needs perf to read. It is the only module that knows
//!    about perf, and the only one with `unsafe` (allowed only in its `sys` and `launch`
//!    parts, which call the kernel).
//! 2. [`unwind`]: the one entry into unwinding. It keeps every process's code maps and
//!    their CFI, and turns a sample's raw stack material (kernel callchain, user
//!    registers, a small copy of the user stack) into a list of
//!    [`unwind::CodeAddress`]es, as the unwinding mode says.
//! 3. [`replay`]: replays the recording's processes, threads and library maps in time
//!    order, unwinds each sample and interns its stack into the prefix tables of a
//!    [`profile::RawProfile`] (frames, stacks, samples), before any names.
//! 4. [`symbolicate`]: names each unique address once and expands inline frames,
//!    producing the final [`profile::Profile`].
//! 5. [`calltree`] and [`emit`]: the CallNode tree and the output formats.
//!
//! [`events`] is the seam between the recording and everything after it: the plain
//! records, and the [`events::ProcessMemory`] a live recording lends the unwinder.
//! [`profile`] is the data model the later stages share. [`files`] is the perf-free base
//! every stage stands on: what a mapped ELF file is and where it and its debug file are
//! found, JIT dumps, the user's cache, atomic outputs and messages on stderr. [`cli`] is
//! the top: the command line, its options, the summary after a recording, and
//! [`cli::view`], which serves a written profile to the Firefox Profiler in the user's
//! browser.
//!
//! Each stage owns its helpers: [`record::procmem`] reads a stopped process's memory,
//! [`record::interrupt`] lets the signals that end a recording stop the naming after it,
//! [`unwind::maps`] says which file backs which address, [`symbolicate::debuginfod`]
//! fetches the debug files that are not on the machine.

// The base layer, used by every stage.
#[macro_use]
pub mod files;

// The pipeline, in its one direction.
pub mod calltree;
pub mod emit;
pub mod events;
pub mod profile;
pub mod record;
pub mod replay;
pub mod symbolicate;
pub mod unwind;

// The command line over it all.
pub mod cli;
