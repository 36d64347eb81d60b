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
//! [`profile`] is the data model the later stages share. [`binary`], [`locate`] and
//! [`maps`] are shared, perf-free helpers: what a mapped ELF file is, where a mapped file
//! and its debug file are found, and which file backs which address in a process.
//! [`debuginfod`] fetches the debug files that are not on the machine, by build ID.
//! [`interrupt`] lets the signals that end a recording stop the naming after it.
//! [`view`] serves a written profile to the Firefox Profiler in the user's browser.

#[macro_use]
pub mod diag;

pub mod binary;
pub mod calltree;
pub mod cli;
pub mod debuginfod;
pub mod elf;
pub mod emit;
pub mod events;
pub mod interrupt;
pub mod jitdump;
pub mod lazycfi;
pub mod locate;
pub mod maps;
pub mod procmem;
pub mod profile;
pub mod record;
pub mod replay;
pub mod summary;
pub mod symbolicate;
#[cfg(test)]
mod testdir;
pub mod unwind;
pub mod usercache;
pub mod view;
