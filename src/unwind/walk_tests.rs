//! Walks over hand-built stack memory, through the unwinder's public face: a
//! frame-pointer chain that loops ends the walk, marked, in every mode; a signal
//! handler's stack goes on through the kernel's signal frame to the interrupted code.

use std::sync::Arc;

use super::*;
use crate::events::{Sample, UserRegs};
use crate::files::image::At;
use crate::files::lazycfi::UnwindSections;
use crate::unwind::maps::Region;

/// The program's code, where every frame but the trampoline lies: without CFI, so each
/// step is framehop's frame-pointer rule.
fn program() -> Region<&'static str> {
    Region {
        start: 0x1000,
        len: 0x3000,
        file_offset: 0,
        data: "prog",
    }
}

/// Where the stack copy starts: the sampled stack pointer.
const SP: u64 = 0x7000;

/// A stack copy at [`SP`] of `len` bytes, with the `(address, value)` words it holds
/// set.
fn stack(len: usize, words: &[(u64, u64)]) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for &(address, value) in words {
        let at = (address - SP) as usize;
        if let Some(word) = out.get_mut(at..at + 8) {
            word.copy_from_slice(&value.to_le_bytes());
        }
    }
    out
}

fn sample(chain: &[u64], bp: u64, stack_copy: Vec<u8>, cut: bool) -> Sample {
    Sample {
        pid: 1,
        tid: 1,
        user_callchain: chain.to_vec(),
        callchain_truncated: cut,
        user_regs: Some(UserRegs {
            ip: chain[0],
            sp: SP,
            bp,
        }),
        stack_copy,
        ..Sample::default()
    }
}

fn raw(stack: &[CodeAddress]) -> Vec<u64> {
    stack.iter().map(|a| a.raw()).collect()
}

#[test]
fn a_frame_pointer_loop_ends_the_walk_marked_in_every_mode() {
    // The leaf's RBP frame at 0x7010 holds itself as the caller's RBP and 0x2005 as the
    // return address: the kernel read 0x2005 until its frame limit.
    let copy = stack(0x100, &[(0x7010, 0x7010), (0x7018, 0x2005)]);
    let mut chain = vec![0x1010];
    chain.extend([0x2005; 200]);
    let s = sample(&chain, 0x7010, copy, true);
    for mode in [UnwindMode::Fp, UnwindMode::Hybrid, UnwindMode::Dwarf] {
        let mut u: Unwinder<&str> = Unwinder::new(mode);
        u.map(1, program(), None);
        let st = u.unwind(&s);
        assert_eq!(raw(&st.user), [0x1010, 0x2005], "{mode:?}");
        assert_eq!(st.truncated, Some(Truncation::StackNotUp), "{mode:?}");
    }
}

#[test]
fn a_chain_that_loops_beyond_the_cfi_walk_is_not_spliced_on() {
    // 0x7010 -> 0x7030 -> 0x7010: the second frame points back at the first. CFI's
    // walk stops at the step down; hybrid splices nothing of the kernel's looping chain.
    let copy = stack(
        0x100,
        &[
            (0x7010, 0x7030),
            (0x7018, 0x2005),
            (0x7030, 0x7010),
            (0x7038, 0x3005),
        ],
    );
    let mut chain = vec![0x1010];
    for _ in 0..100 {
        chain.extend([0x2005, 0x3005]);
    }
    let s = sample(&chain, 0x7010, copy, true);
    for mode in [UnwindMode::Fp, UnwindMode::Hybrid] {
        let mut u: Unwinder<&str> = Unwinder::new(mode);
        u.map(1, program(), None);
        let st = u.unwind(&s);
        assert_eq!(raw(&st.user), [0x1010, 0x2005, 0x3005], "{mode:?}");
        assert_eq!(st.truncated, Some(Truncation::StackNotUp), "{mode:?}");
    }
}

/// Where the trampoline lies: in "libc", whose file holds `mov $15,%rax; syscall` there.
const TRAMPOLINE: u64 = 0x5000_0050;

fn libc() -> (Region<&'static str>, Vec<u8>) {
    let mut file = vec![0u8; 0x1000];
    file[0x50..0x59].copy_from_slice(&[0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05]);
    let region = Region {
        start: 0x5000_0000,
        len: 0x1000,
        file_offset: 0,
        data: "libc",
    };
    (region, file)
}

fn with_libc(mode: UnwindMode) -> Unwinder<&'static str> {
    let mut u: Unwinder<&str> = Unwinder::new(mode);
    u.map(1, program(), None);
    let (region, file) = libc();
    let sections = UnwindSections::default();
    let code = CodeModule {
        name: "libc",
        bias: region.start,
        sections: &sections,
        text: Some(FileCode {
            bytes: None,
            entry_returns: &[],
            entry_stub: None,
            file: Some(At::of_bytes(Arc::from(file))),
            trampolines: Arc::default(),
        }),
    };
    u.map(1, region, Some(code));
    u
}

/// A handler (sampled at 0x1010, its RBP frame at 0x7010) that the signal trampoline
/// called: its return address is the trampoline, and the `ucontext` just above holds
/// the interrupted code's registers: RIP `rip` (0x2222 but where said), RSP 0x7300, RBP
/// 0x7400. That code's frame returns to 0x3005, whose frame to 0x3505, whose RBP is 0.
fn signal_stack(len: usize) -> Vec<u8> {
    signal_stack_at(len, 0x2222)
}

fn signal_stack_at(len: usize, rip: u64) -> Vec<u8> {
    let uc = 0x7020;
    stack(
        len,
        &[
            (0x7010, 0x7400),
            (0x7018, TRAMPOLINE),
            (uc + 120, 0x7400),
            (uc + 160, 0x7300),
            (uc + 168, rip),
            (0x7400, 0x7500),
            (0x7408, 0x3005),
            (0x7500, 0),
            (0x7508, 0x3505),
        ],
    )
}

/// The kernel's chain of that stack: RBP's frames, the interrupted code's own RIP not
/// among them.
const SIGNAL_CHAIN: [u64; 4] = [0x1010, TRAMPOLINE, 0x3005, 0x3505];

#[test]
fn a_signal_frame_leads_to_the_interrupted_code_in_every_mode() {
    let s = sample(&SIGNAL_CHAIN, 0x7010, signal_stack(0x600), false);
    for mode in [UnwindMode::Fp, UnwindMode::Hybrid, UnwindMode::Dwarf] {
        let st = with_libc(mode).unwind(&s);
        assert_eq!(
            raw(&st.user),
            [0x1010, TRAMPOLINE, 0x2222, 0x3005, 0x3505],
            "{mode:?}"
        );
        // The trampoline and the interrupted instruction are where execution resumes,
        // looked up as they are; only the calls' return addresses are looked up at -1.
        let lookups: Vec<u64> = st.user.iter().map(|a| a.lookup_address()).collect();
        assert_eq!(
            lookups,
            [0x1010, TRAMPOLINE, 0x2222, 0x3004, 0x3504],
            "{mode:?}"
        );
    }
}

#[test]
fn frame_pointers_without_the_interrupted_stack_take_the_chain_only_from_a_frame() {
    // The copy reaches the ucontext (0x7020 + 176) but not the interrupted code's stack.
    // That code (no CFI: framehop's frame-pointer rule) reads its return address at
    // RBP + 8, as the kernel did: the chain's entries beyond the trampoline are its
    // callers.
    let s = sample(&SIGNAL_CHAIN, 0x7010, signal_stack(0xd0), false);
    let st = with_libc(UnwindMode::Fp).unwind(&s);
    assert_eq!(raw(&st.user), [0x1010, TRAMPOLINE, 0x2222, 0x3005, 0x3505]);
    assert_eq!(st.truncated, None);
    // Interrupted in JIT code whose CFI puts its return address at RSP + 16: the chain
    // skips its caller, and the stack ends there, marked.
    let jit = 0x7f00_0000_1000u64;
    let s = sample(&SIGNAL_CHAIN, 0x7010, signal_stack_at(0xd0, jit + 6), false);
    let mut u = with_libc(UnwindMode::Fp);
    let (frame, hdr) = super::tests::PY_TRAMPOLINE_CFI.split_at(48);
    assert!(u.add_jit_cfi(1, jit..jit + 11, frame, hdr));
    let st = u.unwind(&s);
    assert_eq!(raw(&st.user), [0x1010, TRAMPOLINE, jit + 6]);
    assert_eq!(st.truncated, Some(Truncation::StackCopy));
    // Not even the ucontext: the trampoline ends the stack.
    let s = sample(&SIGNAL_CHAIN, 0x7010, signal_stack(0x40), false);
    let st = with_libc(UnwindMode::Fp).unwind(&s);
    assert_eq!(raw(&st.user), [0x1010, TRAMPOLINE]);
    assert_eq!(st.truncated, Some(Truncation::StackCopy));
}
