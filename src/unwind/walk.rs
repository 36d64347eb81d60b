//! The walk over one sample's stack, as the mode says: CFI through the stack copy, the
//! frame-pointer chain beyond it (or alone), and the outermost frames of a deep stack read
//! once per thread from its stack memory.

use std::sync::Arc;

use crate::events::{KernelWalk, Sample};

use super::address::{kernel_frames, CodeAddress, UnwoundStack};
use super::cfi;
use super::frame_pointer::unwind_frame_pointers;
use super::mode::UnwindMode;
use super::process::{classify, in_entry_stub, Process, ProcessCode};
use super::truncation::{truncation, Truncation};
use super::unwinder::Unwinder;

/// Reads of one thread's stack memory for its outermost frames: a thread's chains end at
/// a handful of return addresses (its start, a few callers without frame pointers); one
/// that ends somewhere new at every sample is broken, and is not read for each.
const MAX_BOTTOM_READS: u32 = 32;

/// How much of a thread's stack is searched for the outermost frames of a deep stack:
/// the main thread's start frames lie below its environment and auxiliary vector, and a
/// thread's below its thread control block and static TLS, both a few KiB from the top.
const STACK_BOTTOM_BYTES: u64 = 64 * 1024;

impl<T: Clone> Unwinder<T> {
    /// The stack of `sample`, as the mode says: hybrid takes CFI through the stack copy
    /// and the frame-pointer chain beyond it, and the frame-pointer chain alone where
    /// CFI knew nothing of the sampled code (fewer than two frames: a file that could
    /// not be read); dwarf takes CFI only; fp the chain with its leaf repaired. Code
    /// without CFI is unwound by rules derived from its instructions. A stack whose
    /// frame-pointer chain ended short of the outermost frame gets its outermost frames
    /// from the thread's stack memory.
    pub fn unwind(&mut self, sample: &Sample) -> UnwoundStack {
        if let Some(end) = sample.kernel_walk {
            return walked_in_kernel(sample, end);
        }
        let has_code = |p: &Process<T>| !p.space.regions().is_empty();
        if sample.user_callchain.is_empty()
            && !sample.kernel_callchain.is_empty()
            && self.processes.get(&sample.pid).is_some_and(has_code)
        {
            // A user process's thread (its process has mappings, which a kernel thread
            // has not) whose user stack the kernel did not walk: its memory is gone (it
            // is exiting). Its user stack is the one at its exit_group, when that was
            // sampled; else its kernel frames are all there is.
            let exit = self.exit_stacks.get(&sample.tid);
            if let Some(exit) = exit.or_else(|| self.exit_stacks.get(&sample.pid)) {
                return UnwoundStack {
                    kernel: kernel_frames(sample),
                    user: exit.user.to_vec(),
                    truncated: exit.truncated,
                    restored_leaf_caller: false,
                };
            }
            return UnwoundStack {
                kernel: kernel_frames(sample),
                user: Vec::new(),
                truncated: Some(Truncation::MemoryGone),
                restored_leaf_caller: false,
            };
        }
        let (mut stack, ended, spliced) = self.unwind_user(sample);
        if ended != cfi::Ended::ChainEnd {
            return stack;
        }
        let Some(&last) = stack.user.last() else {
            return stack;
        };
        if self.is_entry_stub(sample.pid, last) {
            return stack;
        }
        let bottom = self.bottom(sample, last);
        match bottom {
            Some(bottom) => stack.user.extend(bottom.iter().copied()),
            // With CFI to judge by, a chain that ends short of a thread's first frame is
            // incomplete: through the stack copy (spliced on), where a larger copy would
            // have let CFI go on, or alone, where CFI found no rule for the sampled code.
            None if self.mode != UnwindMode::Fp => {
                stack.truncated = Some(if spliced {
                    Truncation::StackCopy
                } else {
                    Truncation::NoUnwindInfo
                });
            }
            None => {}
        }
        stack
    }

    /// Whether `frame` of process `pid` is in its program's entry stub (the outermost
    /// frame of the stack).
    fn is_entry_stub(&mut self, pid: i32, frame: CodeAddress) -> bool {
        let Some(process) = self.processes.get_mut(&pid) else {
            return false;
        };
        process
            .code
            .lookup(frame.lookup_address())
            .is_some_and(|region| in_entry_stub(&region.data, frame))
    }

    /// The user stack, how its walk ended, and whether CFI went first (the frame-pointer
    /// chain was spliced on where the stack copy ended).
    fn unwind_user(&mut self, sample: &Sample) -> (UnwoundStack, cfi::Ended, bool) {
        let pid = sample.pid;
        let process = self.processes.entry(pid).or_default();
        if self.mode != UnwindMode::Fp {
            let hybrid = self.mode == UnwindMode::Hybrid;
            let (modules, code, derived) = process.parts();
            let memory = &mut *self.memory;
            let mut classify = |frame| classify(modules, code, derived, memory, pid, frame);
            if let Some((user, ended)) =
                cfi::unwind(modules, &mut self.cache, sample, hybrid, &mut classify)
            {
                if user.len() >= 2 || !hybrid {
                    let stack = UnwoundStack {
                        kernel: kernel_frames(sample),
                        user,
                        truncated: truncation(ended),
                        restored_leaf_caller: false,
                    };
                    return (stack, ended, true);
                }
            }
        }
        let mut code = ProcessCode {
            process,
            cache: &mut self.cache,
            memory: &mut *self.memory,
            pid,
        };
        let stack = unwind_frame_pointers(sample, &mut code);
        let ended = if stack.truncated.is_some() {
            cfi::Ended::FrameLimit
        } else {
            cfi::Ended::ChainEnd
        };
        (stack, ended, false)
    }

    /// The frames beyond `last`, the outermost frame a stack's frame-pointer chain
    /// reached, read once per thread from the top of its stack: the highest slot holding
    /// `last` is where that frame's return address lies, and CFI walks on from there to
    /// the thread's first frame. `None` when the memory cannot be read or the walk does
    /// not end at the outermost frame.
    fn bottom(&mut self, sample: &Sample, last: CodeAddress) -> Option<Arc<[CodeAddress]>> {
        let CodeAddress::ReturnAddress(ra) = last else {
            return None;
        };
        let key = (sample.tid, ra);
        if let Some(known) = self.bottoms.get(&key) {
            return known.clone();
        }
        let reads = self.bottom_reads.entry(sample.tid).or_default();
        if *reads >= MAX_BOTTOM_READS {
            return None;
        }
        *reads += 1;
        let found = self.read_bottom(sample, ra);
        self.bottoms.insert(key, found.clone());
        found
    }

    fn read_bottom(&mut self, sample: &Sample, ra: u64) -> Option<Arc<[CodeAddress]>> {
        let pid = sample.pid;
        let sp = sample.user_regs?.sp;
        let stack = self.memory.mapping_containing(pid, sp)?;
        let from = stack.end.saturating_sub(STACK_BOTTOM_BYTES).max(sp) & !7;
        let mut bytes = vec![0; usize::try_from(stack.end.checked_sub(from)?).ok()?];
        if !self.memory.read(pid, from, &mut bytes) {
            return None;
        }
        let slot = bytes
            .chunks_exact(8)
            .rposition(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()) == ra)?;
        let (modules, code, derived) = self.processes.get_mut(&pid)?.parts();
        let memory = &mut *self.memory;
        let mut classify = |frame| classify(modules, code, derived, memory, pid, frame);
        let regs = framehop::x86_64::UnwindRegsX86_64::new(ra, from + slot as u64 * 8 + 8, 0);
        let walk = cfi::walk(
            modules,
            &mut self.cache,
            CodeAddress::ReturnAddress(ra),
            regs,
            (from, &bytes),
            &mut classify,
        );
        (walk.ended == cfi::Ended::Root).then(|| walk.frames[1..].into())
    }
}

/// The stack of a sample whose user stack sampler's unwinder in the kernel walked: its
/// frames as they are, the first and the interrupted ones instructions, the others
/// return addresses; truncated where the walk did not reach the outermost frame.
fn walked_in_kernel(sample: &Sample, end: KernelWalk) -> UnwoundStack {
    let user = sample
        .user_callchain
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            if i == 0 || a & KernelWalk::INTERRUPTED != 0 {
                CodeAddress::InstructionPointer(a & !KernelWalk::INTERRUPTED)
            } else {
                CodeAddress::ReturnAddress(a)
            }
        })
        .collect();
    UnwoundStack {
        kernel: kernel_frames(sample),
        user,
        truncated: match end {
            KernelWalk::Outermost => None,
            KernelWalk::FrameLimit => Some(Truncation::FrameLimit),
            KernelWalk::NotUp => Some(Truncation::StackNotUp),
        },
        restored_leaf_caller: false,
    }
}
