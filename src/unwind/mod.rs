//! Unwinding: from a sample's raw material (the kernel's frame-pointer callchain, the user
//! registers and a small copy of the user stack) to the list of code addresses on the
//! stack, each marked as the sampled instruction or a return address.
//!
//! One concern per file, behind the re-exports below: `mode` (hybrid, fp, dwarf and the
//! stack copy each needs), `address` (code addresses and the unwound stack),
//! `truncation` (why a stack lacks its outermost frames), `frame_pointer` (the kernel's
//! chain with its frameless-leaf repair), `cfi` (framehop's walk), `code` (rules derived
//! from instructions where there is no CFI), `process` (one process's code as the
//! unwinder keeps it), `unwinder` (the registry of processes) and `walk` (a sample's
//! stack through all of these). `maps` is the address space every stage resolves
//! addresses in. `table` compiles a file's CFI into the sorted rows an unwinder in the
//! kernel searches.

mod address;
mod cfi;
mod chain;
mod code;
mod frame_pointer;
pub mod maps;
mod mode;
mod process;
mod signal;
pub mod table;
mod truncation;
mod unwinder;
mod walk;

pub use address::{CodeAddress, UnwoundStack};
pub use frame_pointer::{unwind_frame_pointers, CodeLookup, LeafFrame};
pub use mode::UnwindMode;
pub use process::{CodeModule, FileCode};
pub use table::UnwindTable;
pub use truncation::{TruncatedBy, Truncation};
pub use unwinder::Unwinder;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod walk_tests;
