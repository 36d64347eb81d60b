//! Signal frames: how a stack that runs a signal handler continues into the code the
//! signal interrupted.
//!
//! To run a handler, the kernel pushes a `struct rt_sigframe` on the thread's stack: the
//! address of the signal trampoline the handler returns to (libc's `__restore_rt`, given
//! with `SA_RESTORER`), then a `ucontext` whose `uc_mcontext` holds every register of the
//! interrupted code. The trampoline is `mov $15,%rax; syscall` (rt_sigreturn), and when
//! the handler has returned to it the stack pointer is the `ucontext`'s address. Neither
//! a frame-pointer chain nor framehop gets through it: glibc's CFI for it reads the saved
//! registers with DWARF expressions that dereference memory, which framehop does not
//! evaluate, and the chain goes on from the interrupted code's RBP, skipping the
//! interrupted function and its callers without frames. The trampoline is recognised by
//! its instructions, and the interrupted code's RIP, RSP and RBP are read from the
//! `ucontext`. The interrupted RIP is where execution resumes, not a return address: it
//! is looked up as it is.

/// x86-64 Linux's signal trampoline, glibc's and musl's `__restore_rt`: `mov $15,%rax`
/// (rt_sigreturn's number) then `syscall`.
pub(super) const SIGRETURN_CODE: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// Where a sampled instruction pointer can be in the trampoline, from its start, with
/// the stack pointer still at the `ucontext`: its first instruction, its `syscall`, and
/// just after it (a sample taken in the kernel during rt_sigreturn).
pub(super) const SIGRETURN_IPS: [u64; 3] = [0, 7, 9];

/// Offsets of the interrupted code's registers from the `ucontext`'s address (where the
/// stack pointer is in the trampoline): `uc_flags`, `uc_link` and the 24-byte `stack_t`
/// come first (40 bytes), then `struct sigcontext`'s r8-r15, rdi, rsi, rbp, rbx, rdx,
/// rax, rcx, rsp, rip, 8 bytes each (Linux's arch/x86/include/uapi/asm/sigcontext.h).
/// glibc's CFI for `__restore_rt` says the same (`DW_OP_breg7 (rsp): 120` for RBP, 160
/// for RSP, 168 for RIP), and so does `offsetof(ucontext_t, uc_mcontext.gregs[REG_*])`
/// on this machine.
const UC_RBP: u64 = 120;
const UC_RSP: u64 = 160;
const UC_RIP: u64 = 168;

/// The registers of the code a signal interrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interrupted {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// The interrupted code's registers, from the `ucontext` at `uc`; `None` when the stack
/// cannot be read there.
pub(super) fn interrupted(
    uc: u64,
    read_stack: &mut dyn FnMut(u64) -> Result<u64, ()>,
) -> Option<Interrupted> {
    let mut at = |offset: u64| read_stack(uc.checked_add(offset)?).ok();
    Some(Interrupted {
        ip: at(UC_RIP)?,
        sp: at(UC_RSP)?,
        bp: at(UC_RBP)?,
    })
}

/// Whether `code`, the bytes at a frame's address, is the signal trampoline.
pub(super) fn is_sigreturn(code: &[u8]) -> bool {
    code.starts_with(&SIGRETURN_CODE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ucontext_gives_the_interrupted_registers() {
        let uc = 0x7000u64;
        let mut stack = [0u8; 176];
        let mut put = |offset: usize, value: u64| {
            stack[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
        };
        put(120, 0x7f00);
        put(160, 0x7e00);
        put(168, 0x40_1234);
        let mut read = |a: u64| {
            let o = usize::try_from(a - uc).map_err(|_| ())?;
            let b = stack.get(o..o + 8).ok_or(())?;
            Ok(u64::from_le_bytes(b.try_into().map_err(|_| ())?))
        };
        let got = interrupted(uc, &mut read);
        assert_eq!(
            got,
            Some(Interrupted {
                ip: 0x40_1234,
                sp: 0x7e00,
                bp: 0x7f00
            })
        );
        assert_eq!(interrupted(uc + 16, &mut read), None, "beyond the stack");
        assert!(is_sigreturn(&[
            0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05, 0x0f, 0x1f
        ]));
        assert!(!is_sigreturn(&[
            0x48, 0xc7, 0xc0, 0x0e, 0, 0, 0, 0x0f, 0x05
        ]));
        assert!(!is_sigreturn(&SIGRETURN_CODE[..8]));
    }
}
