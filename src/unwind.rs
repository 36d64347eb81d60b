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

use crate::binary::FrameRule;
use crate::record::Sample;

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

/// Builds the stack of `sample` from its frame-pointer callchain. `frame_rule` gives the
/// call frame rule at an absolute user address of the sample's process, when known.
pub fn unwind_frame_pointers(
    sample: &Sample,
    frame_rule: &mut dyn FnMut(u64) -> Option<FrameRule>,
) -> UnwoundStack {
    let kernel: Vec<CodeAddress> = sample
        .kernel_stack
        .iter()
        .filter(|&&a| a != 0)
        .enumerate()
        .map(|(i, &a)| {
            if i == 0 {
                CodeAddress::InstructionPointer(a)
            } else {
                CodeAddress::ReturnAddress(a)
            }
        })
        .collect();
    let mut user_raw: Vec<u64> = sample
        .user_stack
        .iter()
        .copied()
        .filter(|&a| a != 0)
        .collect();
    let mut restored = false;
    if let (Some(regs), Some(&leaf)) = (sample.user_regs, user_raw.first()) {
        if regs.ip == leaf {
            if let Some(ra) = frameless_return_address(leaf, &sample.stack_copy, frame_rule) {
                if user_raw.get(1) != Some(&ra) {
                    user_raw.insert(1, ra);
                    restored = true;
                }
            }
        }
    }
    // In a sample taken in the kernel, the user "leaf" is where the thread entered the
    // kernel: after a `syscall` instruction, so it is looked up like a return address.
    let leaf_is_exact = kernel.is_empty();
    let user = user_raw
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            if i == 0 && leaf_is_exact {
                CodeAddress::InstructionPointer(a)
            } else {
                CodeAddress::ReturnAddress(a)
            }
        })
        .collect();
    UnwoundStack {
        kernel,
        user,
        truncated: sample.callchain_truncated,
        restored_leaf_caller: restored,
    }
}

/// The return address of a leaf that has no RBP frame, read from the stack copy.
fn frameless_return_address(
    leaf: u64,
    stack_copy: &[u8],
    frame_rule: &mut dyn FnMut(u64) -> Option<FrameRule>,
) -> Option<u64> {
    let FrameRule::SpOffset(offset) = frame_rule(leaf)? else {
        return None;
    };
    let at = usize::try_from(offset.checked_sub(8)?).ok()?;
    let bytes = stack_copy.get(at..at + 8)?;
    let ra = u64::from_le_bytes(bytes.try_into().ok()?);
    (ra != 0).then_some(ra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::UserRegs;

    fn sample(user: &[u64], kernel: &[u64], sp_top: u64) -> Sample {
        let mut stack_copy = sp_top.to_le_bytes().to_vec();
        stack_copy.extend_from_slice(&[0xaa; 24]);
        Sample {
            pid: 1,
            tid: 1,
            user_stack: user.to_vec(),
            kernel_stack: kernel.to_vec(),
            user_regs: Some(UserRegs {
                ip: user[0],
                sp: 0x7000,
                bp: 0x7100,
            }),
            stack_copy,
            ..Sample::default()
        }
    }

    #[test]
    fn frameless_leaf_gets_its_caller_back() {
        // hot (0x1010, frameless) called from outer (return 0x2005), which main called
        // (return 0x3005); the RBP walk saw only main's return address.
        let s = sample(&[0x1010, 0x3005], &[], 0x2005);
        let st = unwind_frame_pointers(&s, &mut |_| Some(FrameRule::SpOffset(8)));
        assert_eq!(
            st.user,
            vec![
                CodeAddress::InstructionPointer(0x1010),
                CodeAddress::ReturnAddress(0x2005),
                CodeAddress::ReturnAddress(0x3005)
            ]
        );
        assert!(st.restored_leaf_caller);
    }

    #[test]
    fn framed_leaf_is_left_alone() {
        let s = sample(&[0x1010, 0x2005, 0x3005], &[], 0x9999);
        let st = unwind_frame_pointers(&s, &mut |_| Some(FrameRule::BpOffset(16)));
        assert_eq!(st.user.len(), 3);
        assert!(!st.restored_leaf_caller);
        // An RSP-based rule that agrees with the chain inserts nothing either.
        let s = sample(&[0x1010, 0x2005, 0x3005], &[], 0x2005);
        let st = unwind_frame_pointers(&s, &mut |_| Some(FrameRule::SpOffset(8)));
        assert_eq!(st.user.len(), 3);
    }

    #[test]
    fn kernel_sample_marks_user_leaf_as_return_address() {
        let s = sample(
            &[0x1010, 0x2005],
            &[0xffff_ffff_8100_0010, 0xffff_ffff_8100_2000],
            0,
        );
        let st = unwind_frame_pointers(&s, &mut |_| None);
        assert_eq!(
            st.kernel[0],
            CodeAddress::InstructionPointer(0xffff_ffff_8100_0010)
        );
        assert_eq!(st.kernel[1].lookup_address(), 0xffff_ffff_8100_1fff);
        assert_eq!(st.user[0], CodeAddress::ReturnAddress(0x1010));
    }
}
