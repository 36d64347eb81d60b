//! The Firefox Profiler's processed format, version 70 (facts in `docs/firefox-format.md`
//! §4–5), in three parts: [`model`], the format's typed tables with every name and label
//! it gives a meaning to; the writer (profile to model, [`to_processed`]); and the reader
//! (model to profile, [`from_processed`]), which checks every table of a file before it
//! trusts it. The profile file on disk is [`super::load`]'s.

pub mod model;
mod read;
mod write;

#[cfg(test)]
pub(crate) mod fixture;

pub use read::{from_json, from_processed, from_slice};
pub use write::{breakpad_id, to_json, to_processed};
