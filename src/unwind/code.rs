//! Unwind rules for code that has no call frame information, derived from its instructions.
//!
//! JIT compilers and hand-written stubs emit code with neither CFI nor a frame pointer.
//! CPython's perf trampolines (`-X perf`) are each a copy of `sub $8,%rsp; call *%rcx;
//! add $8,%rsp; ret`, and the libpython around them keeps no frame pointers, so neither
//! CFI nor the frame-pointer chain gets past them. The instructions from a frame's address
//! to the function's `ret` say where its return address is: each `pop`, `push`,
//! `add`/`sub $n,%rsp` or `lea n(%rsp),%rsp` moves the stack pointer by a known amount, a
//! call returns with it unchanged, and `leave` (or `mov %rbp,%rsp; pop %rbp`) is the
//! frame-pointer epilogue. The walk follows one path: a conditional branch, an indirect
//! jump, or any other write to RSP ends it without a rule, and the caller falls back to
//! the frame-pointer rule.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};

/// How to find a frame's caller, from its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeRule {
    /// The return address lies at `sp + ra_offset`, and the caller's stack pointer is just
    /// above it. RBP is the caller's, or was saved at `sp + saved_bp`.
    StackPointer {
        ra_offset: u64,
        saved_bp: Option<u64>,
    },
    /// An RBP frame: the caller's RBP at `bp`, the return address at `bp + 8`.
    FramePointer,
}

/// Instructions followed from a frame's address to its `ret`. The trampolines and stub
/// epilogues this is for take two to ten; a longer straight path is rare enough that
/// giving up (and taking the frame-pointer rule) costs nothing.
const MAX_INSTRUCTIONS: usize = 48;

/// The rule for the frame whose code at `address` is `code` (the bytes from `address`
/// on). `None` when the path to `ret` cannot be followed with certainty.
pub fn derive_rule(code: &[u8], address: u64) -> Option<CodeRule> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    // The stack pointer at this point of the path minus the frame's stack pointer.
    let mut offset: i64 = 0;
    let mut saved_bp: Option<i64> = None;
    // `mov %rbp,%rsp` was executed: RSP is RBP from here on (only a `pop %rbp; ret` may
    // follow).
    let mut sp_is_bp = false;
    let mut insn = Instruction::default();
    for _ in 0..MAX_INSTRUCTIONS {
        if !decoder.can_decode() {
            return None;
        }
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            return None;
        }
        if sp_is_bp {
            return match insn.mnemonic() {
                Mnemonic::Pop if insn.op0_register() == Register::RBP => {
                    frame_pointer_return(&mut decoder)
                }
                _ => None,
            };
        }
        match insn.mnemonic() {
            Mnemonic::Ret => return stack_pointer_rule(offset, saved_bp),
            Mnemonic::Leave => return frame_pointer_return(&mut decoder),
            Mnemonic::Pushfq => offset -= 8,
            Mnemonic::Popfq => offset += 8,
            Mnemonic::Push => offset -= 8,
            Mnemonic::Pop => {
                match (insn.op0_kind(), insn.op0_register()) {
                    (OpKind::Register, Register::RSP) => return None,
                    (OpKind::Register, Register::RBP) => saved_bp = Some(offset),
                    _ => {}
                }
                offset += 8;
            }
            Mnemonic::Add | Mnemonic::Sub if writes_rsp(&insn) => {
                let n = immediate(&insn)?;
                offset += if insn.mnemonic() == Mnemonic::Add {
                    n
                } else {
                    -n
                };
            }
            Mnemonic::Lea if writes_rsp(&insn) => {
                if insn.memory_base() != Register::RSP || insn.memory_index() != Register::None {
                    return None;
                }
                offset += insn.memory_displacement64() as i64;
            }
            Mnemonic::Mov
                if writes_rsp(&insn)
                    && insn.op1_kind() == OpKind::Register
                    && insn.op1_register() == Register::RBP =>
            {
                sp_is_bp = true;
            }
            Mnemonic::Call => {}
            _ if writes_rsp(&insn) => return None,
            _ if writes_rbp(&insn) => saved_bp = None,
            _ => match insn.flow_control() {
                FlowControl::Next | FlowControl::Call | FlowControl::IndirectCall => {}
                FlowControl::UnconditionalBranch if insn.op0_kind() == OpKind::NearBranch64 => {
                    let target = insn.near_branch_target();
                    let at = usize::try_from(target.checked_sub(address)?).ok()?;
                    if at >= code.len() {
                        return None;
                    }
                    decoder.set_position(at).ok()?;
                    decoder.set_ip(target);
                }
                _ => return None,
            },
        }
    }
    None
}

/// After `leave` (or `mov %rbp,%rsp; pop %rbp`): a `ret` next makes it the frame-pointer
/// epilogue.
fn frame_pointer_return(decoder: &mut Decoder) -> Option<CodeRule> {
    if !decoder.can_decode() {
        return None;
    }
    (decoder.decode().mnemonic() == Mnemonic::Ret).then_some(CodeRule::FramePointer)
}

fn stack_pointer_rule(offset: i64, saved_bp: Option<i64>) -> Option<CodeRule> {
    if offset < 0 || offset % 8 != 0 {
        return None;
    }
    Some(CodeRule::StackPointer {
        ra_offset: offset as u64,
        saved_bp: match saved_bp {
            Some(at) => Some(u64::try_from(at).ok()?),
            None => None,
        },
    })
}

fn writes_rsp(insn: &Instruction) -> bool {
    writes_one_of(insn, [Register::RSP, Register::ESP, Register::SP])
}

fn writes_rbp(insn: &Instruction) -> bool {
    writes_one_of(insn, [Register::RBP, Register::EBP, Register::BP])
}

/// Whether the instruction's destination is one of `registers` (a register's 64-, 32- and
/// 16-bit names).
fn writes_one_of(insn: &Instruction, registers: [Register; 3]) -> bool {
    insn.op_count() > 0
        && insn.op0_kind() == OpKind::Register
        && registers.contains(&insn.op0_register())
}

/// The immediate operand of `add`/`sub $n,%rsp`.
fn immediate(insn: &Instruction) -> Option<i64> {
    match insn.op1_kind() {
        OpKind::Immediate8to64 | OpKind::Immediate32to64 | OpKind::Immediate8 => {
            Some(insn.immediate(1) as i64)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPython 3.12's perf trampoline: `sub $8,%rsp; call *%rcx; add $8,%rsp; ret`.
    const TRAMPOLINE: [u8; 11] = [
        0x48, 0x83, 0xec, 0x08, 0xff, 0xd1, 0x48, 0x83, 0xc4, 0x08, 0xc3,
    ];

    #[test]
    fn python_trampoline_at_each_instruction() {
        let at = |offset: usize| derive_rule(&TRAMPOLINE[offset..], 0x1000 + offset as u64);
        let sp = |ra_offset| {
            Some(CodeRule::StackPointer {
                ra_offset,
                saved_bp: None,
            })
        };
        // At the entry the return address is on top; the call returns balanced.
        assert_eq!(at(0), sp(0));
        // At the call and after it (its return address): 8 bytes of padding on top.
        assert_eq!(at(4), sp(8));
        assert_eq!(at(6), sp(8));
        assert_eq!(at(10), sp(0));
    }

    #[test]
    fn pops_and_frame_pointer_epilogues() {
        // add $0x18,%rsp; pop %rbx; pop %rbp; pop %r12; ret
        let code = [0x48, 0x83, 0xc4, 0x18, 0x5b, 0x5d, 0x41, 0x5c, 0xc3];
        assert_eq!(
            derive_rule(&code, 0),
            Some(CodeRule::StackPointer {
                ra_offset: 0x30,
                saved_bp: Some(0x20)
            })
        );
        // mov %rax,%rbx; leave; ret
        assert_eq!(
            derive_rule(&[0x48, 0x89, 0xc3, 0xc9, 0xc3], 0),
            Some(CodeRule::FramePointer)
        );
        // mov %rbp,%rsp; pop %rbp; ret
        assert_eq!(
            derive_rule(&[0x48, 0x89, 0xec, 0x5d, 0xc3], 0),
            Some(CodeRule::FramePointer)
        );
        // jmp +2 over two bytes of junk, then ret.
        assert_eq!(
            derive_rule(&[0xeb, 0x02, 0xff, 0xff, 0xc3], 0x400),
            Some(CodeRule::StackPointer {
                ra_offset: 0,
                saved_bp: None
            })
        );
    }

    #[test]
    fn uncertain_paths_give_no_rule() {
        // A conditional branch: je +0; ret.
        assert_eq!(derive_rule(&[0x74, 0x00, 0xc3], 0), None);
        // RSP set from another register: mov %rax,%rsp; ret.
        assert_eq!(derive_rule(&[0x48, 0x89, 0xc4, 0xc3], 0), None);
        // An indirect jump, and code that ends before any ret.
        assert_eq!(derive_rule(&[0xff, 0xe0], 0), None);
        assert_eq!(derive_rule(&[0x90, 0x90], 0), None);
        // More pushed than popped before ret: not a frame this can describe.
        assert_eq!(derive_rule(&[0x50, 0xc3], 0), None);
    }
}
