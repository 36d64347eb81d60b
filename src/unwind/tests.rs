//! The unwinder's tests through its public face: the frame-pointer repair, the process
//! registry (forks, execs) and JIT code's CFI.

use super::*;
use crate::events::{Sample, UserRegs};
use crate::unwind::maps::Region;

/// Code is 0x1000..0x4000; the sampled function's frame is as given.
struct Fake(Option<LeafFrame>);

fn frameless(return_address: u64) -> Fake {
    Fake(Some(LeafFrame::Frameless { return_address }))
}

impl CodeLookup for Fake {
    fn leaf_frame(&mut self, _: UserRegs, _: &[u8]) -> Option<LeafFrame> {
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
    let st = unwind_frame_pointers(&s, &mut frameless(0x2005));
    assert_eq!(st.user[0], CodeAddress::InstructionPointer(0x1010));
    assert_eq!(st.user[1], CodeAddress::ReturnAddress(0x2005));
    assert_eq!(raw(&st.user), vec![0x1010, 0x2005, 0x3005]);
    assert!(st.restored_leaf_caller);
}

#[test]
fn recursion_at_function_entry_keeps_every_level() {
    // f called itself from the call site returning to 0x1020; sampled at f's entry.
    let s = sample(&[0x1000, 0x1020, 0x3005], &[], 0x1020);
    let st = unwind_frame_pointers(&s, &mut frameless(0x1020));
    assert_eq!(raw(&st.user), vec![0x1000, 0x1020, 0x1020, 0x3005]);
}

#[test]
fn framed_leaf_or_implausible_return_address_is_left_alone() {
    let s = sample(&[0x1010, 0x2005, 0x3005], &[], 0x2777);
    let st = unwind_frame_pointers(&s, &mut Fake(Some(LeafFrame::Framed)));
    assert_eq!(raw(&st.user), vec![0x1010, 0x2005, 0x3005]);
    assert!(!st.restored_leaf_caller);
    // A stack word that is not a code address is not taken for a return address.
    let s = sample(&[0x1010, 0x3005], &[], 0x7fff_0000);
    let st = unwind_frame_pointers(&s, &mut frameless(0x7fff_0000));
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

#[test]
fn fork_copies_the_maps_and_exec_clears_them() {
    let region = |start: u64, data: &'static str| Region {
        start,
        len: 0x1000,
        file_offset: 0,
        data,
    };
    let mut u: Unwinder<&str> = Unwinder::new(UnwindMode::Fp);
    u.map(1, region(0x1000, "a"), None);
    u.fork(1, 2);
    assert_eq!(u.lookup(2, 0x1800).unwrap().data, "a");
    u.map(2, region(0x1000, "b"), None);
    assert_eq!(
        u.lookup(1, 0x1800).unwrap().data,
        "a",
        "the parent keeps its own"
    );
    u.exec(2);
    assert!(u.lookup(2, 0x1800).is_none());
    assert!(u.lookup(1, 0x1800).is_some());
    // A sample of a process with no maps still has its sampled instruction.
    let st = u.unwind(&sample(&[0x5010, 0x6005], &[], 0));
    assert_eq!(raw(&st.user), vec![0x5010, 0x6005]);
}
/// CPython 3.13's CFI for one perf trampoline (11 bytes: `sub $8,%rsp; call *%rcx;
/// add $8,%rsp; ret`), as its JIT dump gives it: `.eh_frame` (48 bytes), then
/// `.eh_frame_hdr` (20).
pub(super) const PY_TRAMPOLINE_CFI: [u8; 68] = [
    0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x7a, 0x52, 0x00, 0x01, 0x78, 0x10, 0x01,
    0x1b, 0x0c, 0x07, 0x08, 0x90, 0x01, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x00,
    0xd0, 0xff, 0xff, 0xff, 0x0b, 0x00, 0x00, 0x00, 0x00, 0x44, 0x0e, 0x10, 0x46, 0x0e, 0x08, 0x00,
    0x01, 0x1b, 0x03, 0x3b, 0xcc, 0xff, 0xff, 0xff, 0x01, 0x00, 0x00, 0x00, 0xc0, 0xff, 0xff, 0xff,
    0xe8, 0xff, 0xff, 0xff,
];

#[test]
fn jit_code_unwinds_with_the_cfi_of_its_dump() {
    let code = 0x7f00_0000_1000u64;
    let caller = 0x5555_0000_2000u64;
    // Sampled after the trampoline's `sub $8,%rsp`: its return address is at sp + 8.
    let mut stack_copy = 0xdead_u64.to_le_bytes().to_vec();
    stack_copy.extend_from_slice(&caller.to_le_bytes());
    stack_copy.extend_from_slice(&[0; 16]);
    let s = Sample {
        pid: 1,
        tid: 1,
        user_callchain: vec![code + 6],
        user_regs: Some(UserRegs {
            ip: code + 6,
            sp: 0x7ff0_0000,
            bp: 0,
        }),
        stack_copy,
        ..Sample::default()
    };
    let caller_code = Region {
        start: 0x5555_0000_0000,
        len: 0x10000,
        file_offset: 0,
        data: "caller",
    };
    let mut u: Unwinder<&str> = Unwinder::new(UnwindMode::Dwarf);
    u.map(1, caller_code.clone(), None);
    let without = u.unwind(&s);
    assert_eq!(
        raw(&without.user),
        vec![code + 6],
        "no rule for unknown code"
    );
    let (frame, hdr) = PY_TRAMPOLINE_CFI.split_at(48);
    assert!(u.add_jit_cfi(1, code..code + 11, frame, hdr));
    let with = u.unwind(&s);
    assert_eq!(raw(&with.user)[..2], [code + 6, caller]);
    // A header in another encoding is not guessed at.
    let mut other = hdr.to_vec();
    other[3] = 0x1b;
    assert!(!u.add_jit_cfi(1, code..code + 11, frame, &other));
}
