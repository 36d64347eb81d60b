//! The files sampler reads and writes, for every stage: what a mapped ELF file holds and
//! how much of it may be trusted, where a mapped file and its debug file are found, the
//! JIT dumps programs write, the user's cache directory, the outputs written atomically,
//! and the lines sampler prints to stderr.
//!
//! Nothing here knows perf or any stage of the pipeline: the stages use these modules,
//! never the other way round.

#[macro_use]
pub mod diag;

pub mod binary;
pub mod elf;
pub mod entry;
pub mod image;
pub mod jitdump;
pub mod lazycfi;
pub mod locate;
pub mod output;
pub mod sources;
#[cfg(test)]
pub(crate) mod testdir;
pub mod usercache;

pub use locate::FileId;
