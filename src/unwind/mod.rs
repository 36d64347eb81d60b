//! Unwinding: from a sample's raw material (the kernel's frame-pointer callchain, the user
//! registers and a small copy of the user stack) to the list of code addresses on the
//! stack, each marked as the sampled instruction or a return address.
//!
//! The kernel walks RBP chains. That walk misses one caller whenever the sampled user
//! function has no frame of its own yet (or any more): gcc gives `-O2` leaf functions no
//! `push rbp` even with `-fno-omit-frame-pointer`, and every function is frameless at its
//! first instruction. Then RBP still points at the caller's frame and the chain goes
//! straight to the caller's caller (`main > hot` instead of `main > outer > hot`). We
//! look up the leaf's call frame information: when its CFA is RSP-based, the return
//! address sits at `sp + offset - 8` in the stack copy, and we put it back in.

mod dwarf;

pub use dwarf::{ProcessUnwinders, UnwindMode};

use crate::binary::FrameRule;
use crate::events::Sample;

/// A code address found on a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CodeAddress {
    /// The instruction that was executing when the sample was taken.
    InstructionPointer(u64),
    /// A return address: the instruction after a call. It belongs to the call, so it is
    /// looked up at `address - 1`; otherwise a call that ends a function or a line would
    /// be attributed to the next one.
    ReturnAddress(u64),
}

impl CodeAddress {
    /// The address to look up in symbol and line tables.
    pub fn lookup_address(self) -> u64 {
        match self {
            CodeAddress::InstructionPointer(a) => a,
            CodeAddress::ReturnAddress(a) => a.saturating_sub(1),
        }
    }

    pub fn raw(self) -> u64 {
        match self {
            CodeAddress::InstructionPointer(a) | CodeAddress::ReturnAddress(a) => a,
        }
    }
}

/// The unwound stack of one sample, each part leaf first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnwoundStack {
    pub kernel: Vec<CodeAddress>,
    pub user: Vec<CodeAddress>,
    /// The outermost frames are missing (the kernel's frame limit was reached).
    pub truncated: bool,
    /// A caller the frame-pointer chain skipped was restored from the stack copy.
    pub restored_leaf_caller: bool,
}

/// What the unwinder needs to know about the code of the sample's process.
pub trait CodeLookup {
    /// The call frame rule at an absolute address, when its module has CFI for it.
    fn frame_rule(&mut self, address: u64) -> Option<FrameRule>;
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
            if let Some(ra) = frameless_return_address(leaf, &sample.stack_copy, code) {
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
        truncated: sample.callchain_truncated,
        restored_leaf_caller: restored,
    }
}

/// A part of a sample's callchain without the zero entries the kernel leaves where its
/// walk found nothing.
fn callchain(addresses: &[u64]) -> Vec<u64> {
    addresses.iter().copied().filter(|&a| a != 0).collect()
}

/// The kernel part of a sample's callchain, leaf first.
fn kernel_frames(sample: &Sample) -> Vec<CodeAddress> {
    leaf_first(&callchain(&sample.kernel_callchain))
}

/// Marks a leaf-first list of addresses: the first is the sampled instruction, every
/// other one the return address of a call.
fn leaf_first(addresses: &[u64]) -> Vec<CodeAddress> {
    let mut out: Vec<CodeAddress> = addresses
        .iter()
        .map(|&a| CodeAddress::ReturnAddress(a))
        .collect();
    if let Some(first) = out.first_mut() {
        *first = CodeAddress::InstructionPointer(first.raw());
    }
    out
}

/// The return address of a leaf that has no RBP frame, read from the stack copy; only
/// believed when it points into executable memory.
fn frameless_return_address(
    leaf: u64,
    stack_copy: &[u8],
    code: &mut dyn CodeLookup,
) -> Option<u64> {
    let FrameRule::SpOffset(offset) = code.frame_rule(leaf)? else {
        return None;
    };
    let at = usize::try_from(offset.checked_sub(8)?).ok()?;
    let bytes = stack_copy.get(at..at + 8)?;
    let ra = u64::from_le_bytes(bytes.try_into().ok()?);
    code.is_code(ra).then_some(ra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::UserRegs;

    /// Code is 0x1000..0x4000; every address has the given rule.
    struct Fake(Option<FrameRule>);

    impl CodeLookup for Fake {
        fn frame_rule(&mut self, _: u64) -> Option<FrameRule> {
            self.0
        }
        fn is_code(&mut self, a: u64) -> bool {
            (0x1000..0x4000).contains(&a)
        }
    }

    fn sample(user: &[u64], kernel: &[u64], sp_top: u64) -> Sample {
        let mut stack_copy = sp_top.to_le_bytes().to_vec();
        stack_copy.extend_from_slice(&[0xaa; 24]);
        Sample {
            pid: 1,
            tid: 1,
            user_callchain: user.to_vec(),
            kernel_callchain: kernel.to_vec(),
            user_regs: Some(UserRegs {
                ip: user[0],
                sp: 0x7000,
                bp: 0x7100,
            }),
            stack_copy,
            ..Sample::default()
        }
    }

    fn raw(stack: &[CodeAddress]) -> Vec<u64> {
        stack.iter().map(|a| a.raw()).collect()
    }

    #[test]
    fn frameless_leaf_gets_its_caller_back() {
        // hot (0x1010, frameless) called from outer (return 0x2005), which main called
        // (return 0x3005); the RBP walk saw only main's return address.
        let s = sample(&[0x1010, 0x3005], &[], 0x2005);
        let st = unwind_frame_pointers(&s, &mut Fake(Some(FrameRule::SpOffset(8))));
        assert_eq!(st.user[0], CodeAddress::InstructionPointer(0x1010));
        assert_eq!(st.user[1], CodeAddress::ReturnAddress(0x2005));
        assert_eq!(raw(&st.user), vec![0x1010, 0x2005, 0x3005]);
        assert!(st.restored_leaf_caller);
    }

    #[test]
    fn return_address_is_read_at_the_cfa_offset() {
        // After `push rbp` (CFA = RSP + 16) the return address is the second word.
        let mut s = sample(&[0x1010, 0x3005], &[], 0xdead);
        s.stack_copy[8..16].copy_from_slice(&0x2005u64.to_le_bytes());
        let st = unwind_frame_pointers(&s, &mut Fake(Some(FrameRule::SpOffset(16))));
        assert_eq!(raw(&st.user), vec![0x1010, 0x2005, 0x3005]);
    }

    #[test]
    fn recursion_at_function_entry_keeps_every_level() {
        // f called itself from the call site returning to 0x1020; sampled at f's entry.
        let s = sample(&[0x1000, 0x1020, 0x3005], &[], 0x1020);
        let st = unwind_frame_pointers(&s, &mut Fake(Some(FrameRule::SpOffset(8))));
        assert_eq!(raw(&st.user), vec![0x1000, 0x1020, 0x1020, 0x3005]);
    }

    #[test]
    fn framed_leaf_or_implausible_return_address_is_left_alone() {
        let s = sample(&[0x1010, 0x2005, 0x3005], &[], 0x2777);
        let st = unwind_frame_pointers(&s, &mut Fake(Some(FrameRule::BpOffset(16))));
        assert_eq!(raw(&st.user), vec![0x1010, 0x2005, 0x3005]);
        assert!(!st.restored_leaf_caller);
        // A stack word that is not a code address is not taken for a return address.
        let s = sample(&[0x1010, 0x3005], &[], 0x7fff_0000);
        let st = unwind_frame_pointers(&s, &mut Fake(Some(FrameRule::SpOffset(8))));
        assert_eq!(raw(&st.user), vec![0x1010, 0x3005]);
        // Without CFI nothing is guessed.
        let st = unwind_frame_pointers(&s, &mut Fake(None));
        assert_eq!(raw(&st.user), vec![0x1010, 0x3005]);
    }

    #[test]
    fn kernel_frames_are_separate_and_user_leaf_stays_exact() {
        let s = sample(
            &[0x1010, 0x2005],
            &[0xffff_ffff_8100_0010, 0xffff_ffff_8100_2000],
            0,
        );
        let st = unwind_frame_pointers(&s, &mut Fake(None));
        assert_eq!(
            st.kernel[0],
            CodeAddress::InstructionPointer(0xffff_ffff_8100_0010)
        );
        assert_eq!(st.kernel[1].lookup_address(), 0xffff_ffff_8100_1fff);
        assert_eq!(st.user[0], CodeAddress::InstructionPointer(0x1010));
        assert_eq!(st.user[1].lookup_address(), 0x2004);
    }
}
