//! The frame-pointer unwinder: the kernel's RBP walk, with the caller it skips put back.
//!
//! The kernel walks RBP chains. That walk misses one caller whenever the sampled user
//! function has no frame of its own yet (or any more): gcc gives `-O2` leaf functions no
//! `push rbp` even with `-fno-omit-frame-pointer`, and every function is frameless at its
//! first instruction. Then RBP still points at the caller's frame and the chain goes
//! straight to the caller's caller (`main > hot` instead of `main > outer > hot`). We
//! look up the leaf's call frame information: when its CFA is RSP-based, the return
//! address sits at `sp + offset - 8` in the stack copy, and we put it back in.

use crate::events::{Sample, UserRegs};

use super::address::{callchain, kernel_frames, leaf_first, UnwoundStack};
use super::truncation::Truncation;

/// What CFI says of the sampled function's own frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafFrame {
    /// It has no RBP frame of its own (yet, or any more): RBP still holds its caller's
    /// frame, so the frame-pointer chain skips the caller, whose return address this is.
    Frameless { return_address: u64 },
    /// RBP points at its own frame: the frame-pointer chain is right.
    Framed,
}

/// What the frame-pointer unwinder needs to know about the code of the sample's process.
pub trait CodeLookup {
    /// The sampled function's frame, by its CFI, through the stack copy; `None` when
    /// there is no CFI for it or the copy does not reach its return address.
    fn leaf_frame(&mut self, regs: UserRegs, stack_copy: &[u8]) -> Option<LeafFrame>;
    /// Whether an absolute address lies in executable memory of the process.
    fn is_code(&mut self, address: u64) -> bool;
}

/// Builds the stack of `sample` from its frame-pointer callchain, restoring the caller
/// that the chain skips when the sampled function has no RBP frame.
pub fn unwind_frame_pointers(sample: &Sample, code: &mut dyn CodeLookup) -> UnwoundStack {
    let mut user_raw = callchain(&sample.user_callchain);
    let mut restored = false;
    if let (Some(regs), Some(&leaf)) = (sample.user_regs, user_raw.first()) {
        if regs.ip == leaf {
            if let Some(ra) = frameless_return_address(regs, &sample.stack_copy, code) {
                // The kernel read the next entry at RBP + 8, and RBP still holds the
                // caller's frame: that entry is the caller's caller, so the caller always
                // goes in between (even when both are the same call site, in recursion).
                user_raw.insert(1, ra);
                restored = true;
            }
        }
    }
    // The user leaf is an exact instruction address even in a sample taken in the kernel:
    // after a `syscall` it is the next instruction, still inside the wrapper, and after a
    // fault or an interrupt it is the interrupted instruction itself.
    let user = leaf_first(&user_raw);
    UnwoundStack {
        kernel: kernel_frames(sample),
        user,
        truncated: sample.callchain_truncated.then_some(Truncation::FrameLimit),
        restored_leaf_caller: restored,
    }
}

/// The return address of a leaf that has no RBP frame, from its CFI and the stack copy;
/// only believed when it points into executable memory.
fn frameless_return_address(
    regs: UserRegs,
    stack_copy: &[u8],
    code: &mut dyn CodeLookup,
) -> Option<u64> {
    match code.leaf_frame(regs, stack_copy)? {
        LeafFrame::Frameless { return_address } => {
            code.is_code(return_address).then_some(return_address)
        }
        LeafFrame::Framed => None,
    }
}
