//! Why a stack lacks its outermost frames, and the count of each cause over a recording:
//! the summary and the profile's metadata tell the user which option would help.

use super::cfi;

/// Why a stack lacks its outermost frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Truncation {
    /// The kernel's frame limit cut the frame-pointer chain (`--max-stack`).
    FrameLimit,
    /// The copy of the user stack ended first (`--stack-size` reaches further).
    StackCopy,
    /// Code with no unwind rule that led on: neither CFI, nor a rule from its
    /// instructions, nor a frame-pointer chain (a larger stack copy does not help).
    NoUnwindInfo,
    /// A user thread sampled in the kernel after its memory was released (as it exits):
    /// the kernel could not walk its user stack.
    MemoryGone,
    /// A step of the walk did not move the stack pointer up (toward the stack's start):
    /// a frame-pointer chain that loops, or unwind information that is wrong. The frames
    /// beyond would repeat or be garbage, so the walk ends there.
    StackNotUp,
}

/// How many stacks were truncated, by cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TruncatedBy {
    pub frame_limit: u64,
    pub stack_copy: u64,
    pub no_unwind_info: u64,
    pub memory_gone: u64,
    pub stack_not_up: u64,
}

impl TruncatedBy {
    pub fn total(&self) -> u64 {
        self.frame_limit
            + self.stack_copy
            + self.no_unwind_info
            + self.memory_gone
            + self.stack_not_up
    }

    pub fn count(&mut self, cause: Truncation) {
        match cause {
            Truncation::FrameLimit => self.frame_limit += 1,
            Truncation::StackCopy => self.stack_copy += 1,
            Truncation::NoUnwindInfo => self.no_unwind_info += 1,
            Truncation::MemoryGone => self.memory_gone += 1,
            Truncation::StackNotUp => self.stack_not_up += 1,
        }
    }
}

/// Why a stack lacks its outermost frames, from how its walk ended.
pub(super) fn truncation(ended: cfi::Ended) -> Option<Truncation> {
    match ended {
        cfi::Ended::Root | cfi::Ended::ChainEnd => None,
        cfi::Ended::StackCopy => Some(Truncation::StackCopy),
        cfi::Ended::NoRule => Some(Truncation::NoUnwindInfo),
        cfi::Ended::FrameLimit => Some(Truncation::FrameLimit),
        cfi::Ended::StackNotUp => Some(Truncation::StackNotUp),
    }
}
