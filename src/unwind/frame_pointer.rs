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

use super::address::{callchain, kernel_frames, leaf_first, CodeAddress, UnwoundStack};
use super::cfi::{splice, stack_reader, Ended, Walk};
use super::chain;
use super::signal::{self, Interrupted};
use super::truncation::{truncation, Truncation};

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
    /// Whether a return address is the signal trampoline's (see the `signal` module).
    fn is_sigreturn(&mut self, _address: u64) -> bool {
        false
    }
    /// Whether the code a signal interrupted has an RBP frame there: its rule reads its
    /// return address at RBP + 8.
    fn returns_through_rbp(&mut self, _at: Interrupted) -> bool {
        false
    }
    /// The frames of the code a signal interrupted, leaf first, as far as CFI leads
    /// through the stack copy `stack` (its address and bytes), and how that walk ended.
    fn interrupted_frames(&mut self, at: Interrupted, _stack: (u64, &[u8])) -> Walk {
        Walk {
            frames: vec![CodeAddress::InstructionPointer(at.ip)],
            ended: Ended::NoRule,
        }
    }
}

/// Builds the stack of `sample` from its frame-pointer callchain, restoring the caller
/// that the chain skips when the sampled function has no RBP frame.
pub fn unwind_frame_pointers(sample: &Sample, code: &mut dyn CodeLookup) -> UnwoundStack {
    let mut user_raw = callchain(&sample.user_callchain);
    let checked = sample.user_regs.map(|regs| {
        chain::check(&user_raw, regs, &sample.stack_copy, &mut |a| {
            code.is_sigreturn(a)
        })
    });
    if let Some(c) = checked {
        user_raw.truncate(c.keep);
    }
    let mut truncated = match checked {
        Some(c) if c.not_up => Some(Truncation::StackNotUp),
        _ => sample.callchain_truncated.then_some(Truncation::FrameLimit),
    };
    let mut restored = false;
    // A chain that loops at RBP's own frame says RBP holds no frame, and the repair
    // trusts RBP to hold the caller's.
    let rbp_loops = checked.is_some_and(|c| c.not_up && c.keep <= 2);
    if let (Some(regs), Some(&leaf)) = (sample.user_regs, user_raw.first()) {
        if regs.ip == leaf && !rbp_loops {
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
    let mut user = leaf_first(&user_raw);
    if let Some(regs) = sample.user_regs {
        let stack = (regs.sp, &sample.stack_copy[..]);
        let signal = match checked.and_then(|c| c.signal) {
            Some((at, uc)) => Some((at + usize::from(restored), uc)),
            // A handler sampled before it set up its frame: the caller restored is the
            // trampoline, whose slot is the first on the stack that holds it.
            None if restored && code.is_sigreturn(user_raw[1]) => {
                slot_of(user_raw[1], stack).map(|slot| (1, slot + 8))
            }
            None => None,
        };
        if let Some((at, uc)) = signal {
            truncated = through_signal_frame(&mut user, &user_raw[at..], uc, stack, sample, code);
        }
    }
    UnwoundStack {
        kernel: kernel_frames(sample),
        user,
        truncated,
        restored_leaf_caller: restored,
    }
}

/// The address of the first 8-byte slot of the stack copy (taken at `regs.sp`) that
/// holds `value`.
fn slot_of(value: u64, stack: (u64, &[u8])) -> Option<u64> {
    let at = stack
        .1
        .chunks_exact(8)
        .position(|w| w == value.to_le_bytes())?;
    stack.0.checked_add(at as u64 * 8)
}

/// Replaces the chain's frames from the signal trampoline on (`beyond`, the trampoline
/// first) with the trampoline, the code the signal interrupted (from the `ucontext` at
/// `uc`) and its callers: by CFI through the stack copy, then the chain where the two
/// agree, as the hybrid mode does. Where they never agree, or the copy does not reach the
/// `ucontext`, the stack ends in the frames CFI found, marked. Why the stack is
/// truncated, if it is.
fn through_signal_frame(
    user: &mut Vec<CodeAddress>,
    beyond: &[u64],
    uc: u64,
    stack: (u64, &[u8]),
    sample: &Sample,
    code: &mut dyn CodeLookup,
) -> Option<Truncation> {
    let &trampoline = beyond.first()?;
    user.truncate(user.len() - beyond.len());
    user.push(CodeAddress::InstructionPointer(trampoline));
    let Some(at) = signal::interrupted(uc, &mut stack_reader(stack.0, stack.1)) else {
        return Some(Truncation::StackCopy);
    };
    let walk = code.interrupted_frames(at, stack);
    let ended = walk.ended;
    let rest = match ended {
        Ended::Root | Ended::StackNotUp => None,
        // The copy ends before the interrupted function's frame. Where its rule reads
        // its return address at RBP + 8, the kernel's chain went on from that same RBP:
        // its entries after the trampoline are the function's callers.
        Ended::StackCopy if walk.frames.len() == 1 && code.returns_through_rbp(at) => {
            beyond.get(1..).map(<[u64]>::to_vec)
        }
        _ => splice(&walk.frames, beyond),
    };
    user.extend(walk.frames);
    match rest {
        Some(rest) => {
            user.extend(rest.into_iter().map(CodeAddress::ReturnAddress));
            sample.callchain_truncated.then_some(Truncation::FrameLimit)
        }
        None => truncation(ended),
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
