//! The kernel's frame-pointer chain checked against the stack copy, as far as the copy
//! reaches: each of the kernel's steps read RBP's frame (the caller's RBP at `[rbp]`, the
//! return address at `[rbp + 8]`) without asking whether it lies above the last one, so a
//! chain that loops (RBP pointing at its own frame, as JIT code may leave it) repeats one
//! address up to `--max-stack`. A step whose frame is not above the last one ends the
//! chain there. The check also finds the signal trampoline in the chain, and the
//! `ucontext` above it, where the chain stops being the interrupted code's (see
//! [`super::signal`]).

use crate::events::UserRegs;

use super::cfi::stack_reader;

/// What the copy says of a frame-pointer chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ChainCheck {
    /// How many of the chain's entries stand: all of them, unless a step did not move
    /// the stack pointer up, whose entry and all beyond it go.
    pub keep: usize,
    pub not_up: bool,
    /// The first entry that is a return to the signal trampoline, and the address of
    /// the `ucontext` just above its slot.
    pub signal: Option<(usize, u64)>,
}

/// Checks `chain` (the sampled instruction, then the return addresses the kernel read)
/// against the copy of the stack taken with it at `regs.sp`. Entries whose frames lie
/// beyond the copy are taken as they are.
pub(super) fn check(
    chain: &[u64],
    regs: UserRegs,
    copy: &[u8],
    is_sigreturn: &mut dyn FnMut(u64) -> bool,
) -> ChainCheck {
    let mut read = stack_reader(regs.sp, copy);
    let mut out = ChainCheck {
        keep: chain.len(),
        not_up: false,
        signal: None,
    };
    let (mut sp, mut bp) = (regs.sp, regs.bp);
    for (i, &entry) in chain.iter().enumerate().skip(1) {
        let (Ok(next_bp), Some(Ok(ra))) = (read(bp), bp.checked_add(8).map(&mut read)) else {
            break;
        };
        if ra != entry {
            break;
        }
        // The caller's stack pointer is just above the frame's two words.
        let caller_sp = bp.saturating_add(16);
        if caller_sp <= sp {
            out.keep = i;
            out.not_up = true;
            break;
        }
        if is_sigreturn(ra) {
            out.signal = Some((i, caller_sp));
            break;
        }
        (sp, bp) = (caller_sp, next_bp);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack copy at 0x7000 of `words` 8-byte words, with `(index, value)` set.
    fn copy(words: usize, set: &[(usize, u64)]) -> Vec<u8> {
        let mut out = vec![0u8; words * 8];
        for &(i, v) in set {
            out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    fn regs(bp: u64) -> UserRegs {
        UserRegs {
            ip: 0x1010,
            sp: 0x7000,
            bp,
        }
    }

    #[test]
    fn a_frame_that_points_at_itself_ends_the_chain() {
        // The leaf's frame at 0x7010 holds a saved RBP of 0x7010 itself and the return
        // address 0x2005: the kernel read 0x2005 again and again.
        let stack = copy(8, &[(2, 0x7010), (3, 0x2005)]);
        let chain = [0x1010, 0x2005, 0x2005, 0x2005, 0x2005];
        let got = check(&chain, regs(0x7010), &stack, &mut |_| false);
        assert_eq!((got.keep, got.not_up), (2, true));
        // Two frames that point at each other: 0x7010 -> 0x7020 -> 0x7010.
        let stack = copy(8, &[(2, 0x7020), (3, 0x2005), (4, 0x7010), (5, 0x3005)]);
        let chain = [0x1010, 0x2005, 0x3005, 0x2005, 0x3005];
        let got = check(&chain, regs(0x7010), &stack, &mut |_| false);
        assert_eq!((got.keep, got.not_up), (3, true));
    }

    #[test]
    fn a_chain_that_goes_up_or_leaves_the_copy_stands() {
        // 0x7010 -> 0x7020 -> beyond the copy (0x9000): nothing to say of the rest.
        let stack = copy(6, &[(2, 0x7020), (3, 0x2005), (4, 0x9000), (5, 0x3005)]);
        let chain = [0x1010, 0x2005, 0x3005, 0x3005, 0x3005];
        let got = check(&chain, regs(0x7010), &stack, &mut |_| false);
        assert_eq!((got.keep, got.not_up, got.signal), (5, false, None));
        // RBP below the stack pointer is no frame of this stack.
        let got = check(&chain, regs(0x6ff0), &stack, &mut |_| false);
        assert_eq!(
            (got.keep, got.not_up),
            (5, false),
            "0x6ff0 is not in the copy"
        );
        let stack = copy(6, &[(0, 0x6000), (1, 0x2005)]);
        let got = check(&chain, regs(0x7000 - 16), &copy(0, &[]), &mut |_| false);
        assert_eq!(got.keep, 5, "an empty copy checks nothing");
        let got = check(&chain, regs(0x7000), &stack, &mut |_| false);
        assert_eq!((got.keep, got.not_up), (5, false), "0x7010 is above 0x7000");
    }

    #[test]
    fn the_signal_trampoline_is_found_with_its_ucontext() {
        let stack = copy(8, &[(2, 0x7f00), (3, 0x5050)]);
        let chain = [0x1010, 0x5050, 0x3005];
        let got = check(&chain, regs(0x7010), &stack, &mut |a| a == 0x5050);
        assert_eq!(got.signal, Some((1, 0x7020)));
        assert_eq!(got.keep, 3);
    }
}
