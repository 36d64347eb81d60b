//! The frames and stacks of a replay: each unwound sample's addresses interned as frames
//! (library, address in the file) and stacks (prefix, frame), reusing what a thread's
//! previous stack shares with it. Owns the two tables that become the raw profile's, so
//! that memory grows with the number of unique stacks, not samples.

use std::collections::HashMap;

use crate::profile::{
    AddressFrame, AddressFrameIndex, CodeKind, Interner, LibIndex, RawStack, RawStackIndex,
    UNKNOWN_OFF_CPU_MARKER_ADDRESS,
};
use crate::unwind::{CodeAddress, UnwoundStack};

/// Kernel addresses are the upper half of the x86-64 address space. Kernel frames are
/// made relative to this when the kernel's text start is unknown (kallsyms hidden), which
/// keeps them below 2^53, exact in JSON numbers.
pub(super) const KERNEL_SPACE_START: u64 = 0xffff_8000_0000_0000;

/// A thread's last sampled user stack (see [`Stacks::intern`]).
#[derive(Default)]
struct LastStack {
    pid: i32,
    map_generation: u64,
    /// Whether it began with the truncation marker.
    marked: bool,
    /// Its user frames, outermost first, and the stack each one ends.
    frames: Vec<CodeAddress>,
    stacks: Vec<RawStackIndex>,
    /// The stack its kernel frames went on (its user stack), and they, outermost first,
    /// with the stack each one ends: a thread in a system call or a page fault is often
    /// sampled there again, under the same user stack.
    kernel_base: Option<RawStackIndex>,
    kernel_frames: Vec<CodeAddress>,
    kernel_stacks: Vec<RawStackIndex>,
}

/// How many of `frames` (a last sample's, outermost first, each ending the stack of the
/// same place in `stacks`) the new sample's `callchain` (leaf first) begins with, when
/// `same` says they went on the same stack; `frames` and `stacks` are cut to that.
fn keep_shared(
    same: bool,
    frames: &mut Vec<CodeAddress>,
    stacks: &mut Vec<RawStackIndex>,
    callchain: &[CodeAddress],
) -> usize {
    let shared = match same {
        true => frames
            .iter()
            .zip(callchain.iter().rev())
            .take_while(|(a, b)| a == b)
            .count(),
        false => 0,
    };
    frames.truncate(shared);
    stacks.truncate(shared);
    shared
}

/// The frame and stack tables, and what speeds up interning into them.
#[derive(Default)]
pub(super) struct Stacks {
    pub(super) frames: Interner<AddressFrame, AddressFrameIndex>,
    pub(super) stacks: Interner<RawStack, RawStackIndex>,
    /// Whether a sample had a frame in the kernel's half of the address space.
    kernel_frames: bool,
    /// Each thread's last user stack, so that the next sample of that thread interns
    /// only the frames past what the two share (a 2,000-deep recursion shares nearly all
    /// of them, and interning each frame was most of the cost of recording it).
    last_stacks: HashMap<i32, LastStack>,
    /// Each process's code mappings' version (a number no other change had): what a
    /// shared prefix was interned as holds only while its process's addresses resolve as
    /// they did. Per process: with `-a`, some process maps code every few milliseconds
    /// (a build starting compilers), which must not make every thread intern its whole
    /// stack again.
    map_generations: HashMap<i32, u64>,
    /// The changes of code mappings so far, of all processes.
    map_changes: u64,
}

impl Stacks {
    /// Process `pid`'s code mappings changed: its addresses may resolve differently now.
    pub(super) fn maps_changed(&mut self, pid: i32) {
        self.map_changes += 1;
        self.map_generations.insert(pid, self.map_changes);
    }

    /// The version of process `pid`'s code mappings.
    fn map_generation(&self, pid: i32) -> u64 {
        self.map_generations.get(&pid).copied().unwrap_or(0)
    }

    /// Thread `tid` is gone (or new): its last stack says nothing of its next.
    pub(super) fn forget_thread(&mut self, tid: i32) {
        self.last_stacks.remove(&tid);
    }

    /// Whether any sample had kernel frames.
    pub(super) fn has_kernel_frames(&self) -> bool {
        self.kernel_frames
    }

    /// The interned stack of `stack`, unwound from a sample of thread `tid` of process
    /// `pid`; `resolve` gives the (library, address in the file) of a user address of
    /// that process.
    pub(super) fn intern(
        &mut self,
        pid: i32,
        tid: i32,
        stack: &UnwoundStack,
        resolve: impl Fn(u64) -> Option<(Option<LibIndex>, u64)>,
    ) -> Option<RawStackIndex> {
        let marked = stack.truncated.is_some();
        let mut last = self.last_stacks.remove(&tid).unwrap_or_default();
        let generation = self.map_generation(pid);
        let same = last.pid == pid && last.map_generation == generation && last.marked == marked;
        let shared = keep_shared(same, &mut last.frames, &mut last.stacks, &stack.user);
        let mut prefix = last.stacks.last().copied();
        if marked && shared == 0 {
            let marker = AddressFrame {
                lib: None,
                address: 0,
                kind: CodeKind::Marker,
            };
            let frame = self.frames.intern(marker, AddressFrameIndex::new);
            prefix = Some(self.push(prefix, frame));
        }
        for &addr in stack.user.iter().rev().skip(shared) {
            let lookup = addr.lookup_address();
            let (lib, address) = resolve(lookup).unwrap_or((None, lookup));
            let user = AddressFrame {
                lib,
                address,
                kind: CodeKind::User,
            };
            let frame = self.frames.intern(user, AddressFrameIndex::new);
            let interned = self.push(prefix, frame);
            prefix = Some(interned);
            last.frames.push(addr);
            last.stacks.push(interned);
        }
        last.pid = pid;
        last.map_generation = generation;
        last.marked = marked;
        // Kernel addresses mean the same in every process: what the kernel frames share
        // with the last sample's holds whenever they go on the same stack.
        let same = last.kernel_base == prefix;
        let kernel_shared = keep_shared(
            same,
            &mut last.kernel_frames,
            &mut last.kernel_stacks,
            &stack.kernel,
        );
        last.kernel_base = prefix;
        if let Some(&shared_end) = last.kernel_stacks.last() {
            prefix = Some(shared_end);
        }
        for &addr in stack.kernel.iter().rev().skip(kernel_shared) {
            let frame = self.kernel_frame(addr);
            let interned = self.push(prefix, frame);
            prefix = Some(interned);
            last.kernel_frames.push(addr);
            last.kernel_stacks.push(interned);
        }
        self.last_stacks.insert(tid, last);
        prefix
    }

    fn push(&mut self, prefix: Option<RawStackIndex>, frame: AddressFrameIndex) -> RawStackIndex {
        self.stacks
            .intern(RawStack { prefix, frame }, RawStackIndex::new)
    }

    /// A kernel frame, at its absolute address until [`Stacks::relocate_kernel_frames`]
    /// relocates it.
    fn kernel_frame(&mut self, addr: CodeAddress) -> AddressFrameIndex {
        let address = addr.lookup_address();
        self.kernel_frames |= address >= KERNEL_SPACE_START;
        let frame = AddressFrame {
            lib: None,
            address,
            kind: CodeKind::Kernel,
        };
        self.frames.intern(frame, AddressFrameIndex::new)
    }

    /// The stack of off-CPU time whose stack is unknown: the marker frame alone.
    pub(super) fn unknown_off_cpu(&mut self) -> RawStackIndex {
        let marker = AddressFrame {
            lib: None,
            address: UNKNOWN_OFF_CPU_MARKER_ADDRESS,
            kind: CodeKind::Marker,
        };
        let frame = self.frames.intern(marker, AddressFrameIndex::new);
        self.push(None, frame)
    }

    /// Puts the kernel frames at or above `base` in the kernel's library `lib`, relative
    /// to it. Frames stay distinct: the mapping from absolute to relative addresses is one
    /// to one.
    pub(super) fn relocate_kernel_frames(&mut self, base: u64, lib: LibIndex) {
        for frame in &mut self.frames.items {
            if frame.kind == CodeKind::Kernel && frame.lib.is_none() && frame.address >= base {
                frame.lib = Some(lib);
                frame.address -= base;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, EventKind, Sample};
    use crate::replay::tests::{at, fork};
    use crate::replay::ProfileBuilder;
    use crate::unwind::UnwindMode;

    /// A sample of thread `tid` of process 10 with these callchains, leaf first.
    fn sample(time_ns: u64, tid: i32, user: &[u64], kernel: &[u64]) -> Event {
        at(
            time_ns,
            EventKind::Sample(Sample {
                pid: 10,
                tid,
                user_callchain: user.to_vec(),
                kernel_callchain: kernel.to_vec(),
                ..Sample::default()
            }),
        )
    }

    /// Each sample's stack as (frame kind, address) pairs, outermost first.
    fn stacks_of(b: &ProfileBuilder) -> Vec<Vec<(CodeKind, u64)>> {
        let s = &b.stacks;
        let mut shown = Vec::new();
        for t in &b.threads.threads {
            for &(_, mut stack, _) in &t.samples {
                let mut frames = Vec::new();
                loop {
                    let raw = &s.stacks.items[stack.index()];
                    let frame = &s.frames.items[raw.frame.index()];
                    frames.push((frame.kind, frame.address));
                    match raw.prefix {
                        Some(prefix) => stack = prefix,
                        None => break,
                    }
                }
                frames.reverse();
                shown.push(frames);
            }
        }
        shown
    }

    #[test]
    fn stacks_share_their_prefixes_and_callers_are_looked_up_before_the_return_address() {
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        b.add_events(&[
            fork(1, 10, 10),
            fork(1, 10, 11),
            sample(2, 10, &[0x1000, 0x2001, 0x3001], &[]),
            sample(3, 10, &[0x1100, 0x2001, 0x3001], &[]),
            // Another thread with the same stack interns nothing new.
            sample(4, 11, &[0x1100, 0x2001, 0x3001], &[]),
            sample(5, 11, &[0x1100], &[KERNEL_SPACE_START + 0x50]),
        ]);
        use CodeKind::{Kernel, User};
        let (main, callee) = ((User, 0x3000), (User, 0x2000));
        assert_eq!(
            stacks_of(&b),
            [
                vec![main, callee, (User, 0x1000)],
                vec![main, callee, (User, 0x1100)],
                vec![main, callee, (User, 0x1100)],
                vec![(User, 0x1100), (Kernel, KERNEL_SPACE_START + 0x50)],
            ]
        );
        // main, main>callee, two leaves; the last sample's two.
        assert_eq!(b.stacks.stacks.items.len(), 6);
        assert!(b.stacks.has_kernel_frames());
    }

    /// Kernel frames under the same user stack share their outer part with the thread's
    /// last sample; under another user stack (or none), they are interned on it.
    #[test]
    fn kernel_frames_share_what_the_last_sample_had_under_the_same_user_stack() {
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        let k = |offset: u64| KERNEL_SPACE_START + offset;
        b.add_events(&[
            fork(1, 10, 10),
            // A page fault's kernel stack, leaf first, twice with another leaf.
            sample(2, 10, &[0x1000, 0x2001], &[k(0x10), k(0x20), k(0x30)]),
            sample(3, 10, &[0x1000, 0x2001], &[k(0x11), k(0x20), k(0x30)]),
            // The same kernel frames under another user stack, then with no user stack.
            sample(4, 10, &[0x1100, 0x2001], &[k(0x11), k(0x20), k(0x30)]),
            sample(5, 10, &[], &[k(0x11), k(0x20), k(0x30)]),
            sample(6, 10, &[], &[k(0x12), k(0x20), k(0x30)]),
            // Back to the first: shared with what was interned then.
            sample(7, 10, &[0x1000, 0x2001], &[k(0x10), k(0x20), k(0x30)]),
        ]);
        use CodeKind::{Kernel, User};
        // Callers are looked up before their return addresses.
        let kernel = |leaf: u64| [(Kernel, k(0x2f)), (Kernel, k(0x1f)), (Kernel, k(leaf))];
        let on = |user: &[(CodeKind, u64)], leaf| [user, &kernel(leaf)[..]].concat();
        let (first, second) = (
            [(User, 0x2000), (User, 0x1000)],
            [(User, 0x2000), (User, 0x1100)],
        );
        assert_eq!(
            stacks_of(&b),
            [
                on(&first, 0x10),
                on(&first, 0x11),
                on(&second, 0x11),
                on(&[], 0x11),
                on(&[], 0x12),
                on(&first, 0x10),
            ]
        );
        // Each distinct (prefix, frame) once, as fresh interning makes them: the user
        // stacks (2, then 1 more), the kernel frames under the first (3 and another leaf),
        // the second (3) and none (3 and another leaf).
        assert_eq!(b.stacks.stacks.items.len(), 3 + 4 + 3 + 4);
    }

    #[test]
    fn a_truncated_stack_starts_at_the_marker_and_kernel_frames_are_relocated() {
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        let truncated = Sample {
            pid: 10,
            tid: 10,
            user_callchain: vec![0x1000, 0x2001],
            kernel_callchain: vec![KERNEL_SPACE_START + 0x90],
            callchain_truncated: true,
            ..Sample::default()
        };
        b.add_events(&[fork(1, 10, 10), at(2, EventKind::Sample(truncated))]);
        let base = KERNEL_SPACE_START + 0x10;
        b.stacks.relocate_kernel_frames(base, LibIndex::new(0));
        use CodeKind::{Kernel, Marker, User};
        assert_eq!(
            stacks_of(&b),
            [vec![
                (Marker, 0),
                (User, 0x2000),
                (User, 0x1000),
                (Kernel, 0x80)
            ]]
        );
    }
}
