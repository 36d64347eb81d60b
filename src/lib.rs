//! sampler: a native sampling profiler for Linux.
//!
//! The crate is a one-way pipeline; each module only uses the ones above it:
//!
//! 1. [`record`]: talks to the kernel (`perf_event_open`, ring buffers, the launched
//!    command) and hands over an [`events::Recording`], a time-ordered log of plain
//!    events that no later stage needs perf to read. It is the only module that knows
//!    about perf, and the only one with `unsafe`.
//! 2. [`unwind`]: turns a sample's raw stack material (kernel callchain, user registers,
//!    a small copy of the user stack) into a list of [`unwind::CodeAddress`]es.
//! 3. [`profile`]: replays the recording's process and library maps, deduplicates the
//!    unwound stacks into prefix tables (frames, stacks, samples), before any names.
//! 4. [`symbolicate`]: names each unique address once and expands inline frames,
//!    producing the final [`profile::Profile`].
//! 5. [`calltree`] and [`emit`]: the CallNode tree and the output formats.
//!
//! [`binary`], [`locate`] and [`maps`] are shared, perf-free helpers: what a mapped ELF
//! file is, where a mapped file and its debug file are found, and which file backs which
//! address in a process over time.

#[macro_use]
pub mod diag;

pub mod binary;
pub mod calltree;
pub mod emit;
pub mod events;
pub mod locate;
pub mod maps;
pub mod profile;
pub mod record;
pub mod symbolicate;
pub mod unwind;
