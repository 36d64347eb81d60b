//! Call frame information (`.eh_frame`, `.eh_frame_hdr`, `.debug_frame`), read by
//! framehop and by nothing else: the modules of a process as framehop knows them, the
//! CFI walk over the copy of the user stack that comes with a sample, the rule of the
//! sampled function alone (for the frame-pointer chain's repair), and the hybrid of the
//! CFI walk with the kernel's frame-pointer chain.
//!
//! CFI unwinds correctly through code without frame pointers, but only as far as the
//! stack copy reaches. The kernel's frame-pointer walk reaches the outermost frame of a
//! deep stack, but goes wrong (or stops) in code without frame pointers. Hybrid takes CFI
//! for the inner frames and, where the copy ends, continues with the frame-pointer chain
//! from the first return address the two agree on. Where they never agree, the stack
//! ends in a marker frame rather than in garbage.

use std::cell::RefCell;
use std::ops::Range;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};

use super::address::{callchain, CodeAddress};
use super::chain;
use super::code::CodeRule;
use super::frame_pointer::LeafFrame;
use super::signal::{self, Interrupted};
use crate::events::{Sample, UserRegs};
use crate::files::image::SectionBytes;
use crate::files::lazycfi::UnwindSections;

/// The CFI of one process's code modules, as framehop knows them. Behind a `RefCell`:
/// a function whose CFI is read lazily (see [`crate::files::lazycfi`]) is added while a walk is
/// under way, when the walk first meets it; each use borrows it only for one call.
#[derive(Clone, Default)]
pub struct Modules(RefCell<UnwinderX86_64<SectionBytes>>);

impl Modules {
    fn unwind_frame<F: FnMut(u64) -> Result<u64, ()>>(
        &self,
        address: FrameAddress,
        regs: &mut UnwindRegsX86_64,
        cache: &mut CacheX86_64,
        read_stack: &mut F,
    ) -> Result<Option<u64>, framehop::Error> {
        self.0
            .borrow()
            .unwind_frame(address, regs, cache, read_stack)
    }

    /// Forgets the module registered at `avma_start`.
    pub fn remove(&self, avma_start: u64) {
        self.0.borrow_mut().remove_module(avma_start);
    }
}

/// Registers a code module: `avma` is where it is mapped, and `bias` what is added to the
/// file's addresses to get the process's.
pub fn add_module(
    modules: &Modules,
    name: &str,
    avma: Range<u64>,
    bias: u64,
    sections: &UnwindSections,
) {
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: sections.text.clone(),
        got_svma: sections.got.clone(),
        eh_frame_svma: sections.eh_frame.as_ref().map(|(r, _)| r.clone()),
        eh_frame: sections.eh_frame.as_ref().map(|(_, d)| d.clone()),
        eh_frame_hdr_svma: sections.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
        eh_frame_hdr: sections.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
        debug_frame: sections.debug_frame.clone(),
        ..Default::default()
    };
    let mut modules = modules.0.borrow_mut();
    modules.remove_module(avma.start);
    modules.add_module(Module::new(name.to_string(), avma, bias, info));
}

/// Reads the 8-byte word at `address` from a stack copy that starts at `sp`.
pub(super) fn stack_reader(sp: u64, stack: &[u8]) -> impl FnMut(u64) -> Result<u64, ()> + '_ {
    move |address: u64| {
        let offset = usize::try_from(address.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
        let bytes = stack
            .get(offset..offset.checked_add(8).ok_or(())?)
            .ok_or(())?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
    }
}

/// The sampled function's frame by its CFI alone: its caller's return address, and
/// whether it has an RBP frame of its own. Unwinding it leaves RBP as it was exactly when
/// the function has not pushed and set up its own frame (gcc's `-O2` leaves, every
/// function at its first instructions): then RBP still holds the caller's frame.
pub fn leaf_frame(
    modules: &Modules,
    cache: &mut CacheX86_64,
    regs: UserRegs,
    stack: &[u8],
) -> Option<LeafFrame> {
    let mut unwound = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp);
    let return_address = modules
        .unwind_frame(
            FrameAddress::from_instruction_pointer(regs.ip),
            &mut unwound,
            cache,
            &mut stack_reader(regs.sp, stack),
        )
        .ok()??;
    Some(if unwound.bp() == regs.bp {
        LeafFrame::Frameless { return_address }
    } else {
        LeafFrame::Framed
    })
}

/// Whether the rule of the code at `at.ip` (a sampled or interrupted instruction) reads
/// the return address at RBP + 8, whatever the stack holds there: an RBP frame, whose
/// caller the kernel's frame-pointer chain has. Framehop's frame-pointer rule, where it
/// has no CFI for the code, counts as one.
pub fn returns_through_rbp(modules: &Modules, cache: &mut CacheX86_64, at: Interrupted) -> bool {
    /// Any stack word: only where the rule reads is asked.
    const ANY_WORD: u64 = 1;
    let mut regs = UnwindRegsX86_64::new(at.ip, at.sp, at.bp);
    let step = modules.unwind_frame(
        FrameAddress::from_instruction_pointer(at.ip),
        &mut regs,
        cache,
        &mut |_| Ok(ANY_WORD),
    );
    matches!(step, Ok(Some(_))) && Some(regs.sp()) == at.bp.checked_add(16)
}

/// What the unwinder knows of the code at a frame's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameCode {
    /// Code of a file with CFI, or with nothing better known: framehop's rule (its CFI,
    /// or the frame-pointer rule where it has none).
    Cfi,
    /// A rule derived from the instructions of code without CFI.
    Derived(CodeRule),
    /// A return address of the entry stub: the outermost frame.
    EntryStub,
    /// The signal trampoline: the interrupted code's registers lie above it (see
    /// [`super::signal`]).
    SignalReturn,
    /// An address in no executable mapping of the process: not code, so a return
    /// address here was read from the wrong stack slot.
    NotCode,
}

/// How far one unwinding walk got, and why it stopped.
#[derive(Clone, Debug)]
pub struct Walk {
    /// The frames found, leaf first.
    pub frames: Vec<CodeAddress>,
    pub ended: Ended,
}

/// Unwinds the user stack of `sample` with CFI, and with `hybrid` continues with the
/// frame-pointer chain beyond the stack copy: the user frames, leaf first, and why the
/// walk ended. `None` when the sample has no registers and stack copy.
pub fn unwind(
    modules: &Modules,
    cache: &mut CacheX86_64,
    sample: &Sample,
    hybrid: bool,
    classify: &mut dyn FnMut(CodeAddress) -> FrameCode,
) -> Option<(Vec<CodeAddress>, Ended)> {
    let regs = sample.user_regs?;
    if sample.stack_copy.is_empty() {
        return None;
    }
    let start = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp);
    let Walk { frames: cfi, ended } = walk(
        modules,
        cache,
        CodeAddress::InstructionPointer(regs.ip),
        start,
        (regs.sp, &sample.stack_copy),
        classify,
    );
    let mut fp_chain = callchain(&sample.user_callchain);
    let checked = chain::check(&fp_chain, regs, &sample.stack_copy, &mut |a| {
        classify(CodeAddress::ReturnAddress(a)) == FrameCode::SignalReturn
    });
    fp_chain.truncate(checked.keep);
    Some(match (hybrid, ended) {
        (_, Ended::Root) => (cfi, Ended::Root),
        // The frame-pointer chain goes on where CFI's step did not move up: it loops.
        (_, Ended::StackNotUp) => (cfi, Ended::StackNotUp),
        (true, cut) => match splice(&cfi, &fp_chain) {
            Some(rest) => {
                let mut user = cfi;
                user.extend(rest.into_iter().map(CodeAddress::ReturnAddress));
                // The chain itself may have been cut at the kernel's frame limit, and
                // then the stack is incomplete, even where CFI reached beyond the
                // chain's end (nothing was spliced on).
                let ended = if checked.not_up {
                    Ended::StackNotUp
                } else if sample.callchain_truncated {
                    Ended::FrameLimit
                } else {
                    Ended::ChainEnd
                };
                (user, ended)
            }
            None => (cfi, cut),
        },
        (false, cut) => (cfi, cut),
    })
}

/// How an unwinding walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// At the outermost frame (CFI says there is no caller, or the entry stub).
    Root,
    /// The stack copy ended before the outermost frame.
    StackCopy,
    /// A frame's code had no unwind rule that led anywhere (no CFI, no frame pointer).
    NoRule,
    /// The frame-pointer chain ended without a sign of the outermost frame.
    ChainEnd,
    /// The kernel's frame limit cut the frame-pointer chain.
    FrameLimit,
    /// A step did not move the stack pointer up (see [`walk`]).
    StackNotUp,
}

/// Walks the stack from `frame` with registers `regs`, reading stack memory from
/// `stack` (its address and bytes): framehop's rules where the code has CFI, rules
/// derived from the code where it has none, until the outermost frame or until no rule
/// leads on.
pub fn walk(
    modules: &Modules,
    cache: &mut CacheX86_64,
    mut frame: CodeAddress,
    mut regs: UnwindRegsX86_64,
    stack: (u64, &[u8]),
    classify: &mut dyn FnMut(CodeAddress) -> FrameCode,
) -> Walk {
    let (base, bytes) = stack;
    let stack_end = base.saturating_add(bytes.len() as u64);
    let first = frame;
    let mut unreadable = None;
    let mut read_stack = |address: u64| {
        let word = stack_reader(base, bytes)(address);
        if word.is_err() {
            unreadable = Some(address);
        }
        word
    };
    let mut frames = Vec::new();
    let ended = loop {
        frames.push(frame);
        if frames.len() >= MAX_CFI_FRAMES {
            break Ended::NoRule;
        }
        let at = match frame {
            CodeAddress::InstructionPointer(a) => FrameAddress::from_instruction_pointer(a),
            CodeAddress::ReturnAddress(a) => match FrameAddress::from_return_address(a) {
                Some(at) => at,
                None => break Ended::NoRule,
            },
        };
        let sp = regs.sp();
        let next = match classify(frame) {
            FrameCode::EntryStub => break Ended::Root,
            FrameCode::NotCode if frame != first => {
                frames.pop();
                break Ended::NoRule;
            }
            FrameCode::SignalReturn => {
                // The handler "returned" to the trampoline's first instruction: no call
                // led there, so it is named at its own address.
                if let Some(last) = frames.last_mut() {
                    *last = CodeAddress::InstructionPointer(frame.raw());
                }
                match signal::interrupted(sp, &mut read_stack) {
                    Some(at) => {
                        regs = UnwindRegsX86_64::new(at.ip, at.sp, at.bp);
                        Ok(Some(CodeAddress::InstructionPointer(at.ip)))
                    }
                    None => Err(Stop::Failed),
                }
            }
            FrameCode::Derived(rule) => apply(rule, &mut regs, &mut read_stack)
                .map(|ra| ra.map(CodeAddress::ReturnAddress))
                .map_err(|()| Stop::Failed),
            FrameCode::Cfi | FrameCode::NotCode => {
                let before = regs;
                let step = match modules.unwind_frame(at, &mut regs, cache, &mut read_stack) {
                    // framehop's frame-pointer rule (its fallback where it has no CFI for
                    // the address) also ends at a zero RBP. Only CFI's own end of the
                    // stack is the outermost frame: with an unreadable RBP, that rule
                    // still ends, the frame-pointer rule fails.
                    Ok(None) if before.bp() == 0 => {
                        let mut probe = before;
                        probe.set_bp(UNREADABLE_BP);
                        match modules.unwind_frame(at, &mut probe, cache, &mut |_| Err(())) {
                            Ok(None) => Ok(None),
                            _ => Err(Stop::Failed),
                        }
                    }
                    // framehop refuses a frame-pointer step whose caller's frame would be
                    // at or below this one, and a step that changes nothing.
                    Err(
                        framehop::Error::FramepointerUnwindingMovedBackwards
                        | framehop::Error::DidNotAdvance,
                    ) => Err(Stop::NotUp),
                    other => other.map_err(|_| Stop::Failed),
                };
                step.map(|ra| ra.map(CodeAddress::ReturnAddress))
            }
        };
        match next {
            Ok(None) => break Ended::Root,
            Ok(Some(caller)) if caller.raw() != 0 => {
                // Every caller's frame lies above its callee's: a step that does not
                // move the stack pointer up loops or reads garbage.
                if regs.sp() <= sp {
                    break Ended::StackNotUp;
                }
                frame = caller;
            }
            Err(Stop::NotUp) => break Ended::StackNotUp,
            _ => {
                break match unreadable {
                    Some(a) if a >= stack_end => Ended::StackCopy,
                    _ => Ended::NoRule,
                }
            }
        }
    };
    Walk { frames, ended }
}

/// Why a step of a walk found no caller.
enum Stop {
    /// The caller's frame would not be above the callee's.
    NotUp,
    /// No rule, or the stack could not be read where it said.
    Failed,
}

/// Executes a rule derived from code: the caller's return address, with RSP and RBP set
/// to the caller's.
fn apply(
    rule: CodeRule,
    regs: &mut UnwindRegsX86_64,
    read_stack: &mut dyn FnMut(u64) -> Result<u64, ()>,
) -> Result<Option<u64>, ()> {
    let (sp, bp) = (regs.sp(), regs.bp());
    let (ra_at, bp_at) = match rule {
        CodeRule::StackPointer {
            ra_offset,
            saved_bp,
        } => (
            sp.checked_add(ra_offset).ok_or(())?,
            saved_bp.map(|o| sp.checked_add(o).ok_or(())).transpose()?,
        ),
        CodeRule::FramePointer => (bp.checked_add(8).ok_or(())?, Some(bp)),
    };
    let ra = read_stack(ra_at)?;
    let new_bp = match bp_at {
        Some(at) => read_stack(at)?,
        None => bp,
    };
    regs.set_sp(ra_at.checked_add(8).ok_or(())?);
    regs.set_bp(new_bp);
    Ok(Some(ra))
}

/// An RBP that no stack read can follow (see [`walk`]).
const UNREADABLE_BP: u64 = 8;

/// A stack copy of a few kilobytes holds at most a few hundred frames; this bounds a
/// CFI walk that loops on corrupt data.
const MAX_CFI_FRAMES: usize = 4096;

/// The frame-pointer chain's frames beyond the last frame CFI found: the chain from just
/// after its entry for that frame. `None` when the chain never has its return address
/// (the two disagree, so nothing beyond can be trusted). Only the chain's entries after
/// its first one are return addresses; its first is the sampled instruction.
///
/// In a recursion the same return address is on the stack many times; the chain's entry
/// for CFI's last frame is the one at about the same depth (the chain may lack a few
/// frameless frames near the leaf, or have a few bogus ones), so of several equal entries
/// the one nearest that depth is taken.
pub(super) fn splice(cfi: &[CodeAddress], fp_chain: &[u64]) -> Option<Vec<u64>> {
    let last = match cfi.last()? {
        CodeAddress::ReturnAddress(a) => *a,
        CodeAddress::InstructionPointer(_) => return None,
    };
    let depth = cfi.len() - 1;
    let at = (1..fp_chain.len())
        .filter(|&i| fp_chain[i] == last)
        .min_by_key(|&i| i.abs_diff(depth))?;
    Some(fp_chain[at + 1..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_continues_after_the_agreed_return_address() {
        let cfi = [
            CodeAddress::InstructionPointer(0x10),
            CodeAddress::ReturnAddress(0x20),
            CodeAddress::ReturnAddress(0x30),
        ];
        // The chain skipped 0x20 (a frameless function) but has 0x30 and beyond.
        assert_eq!(
            splice(&cfi, &[0x10, 0x30, 0x40, 0x50]),
            Some(vec![0x40, 0x50])
        );
        assert_eq!(splice(&cfi, &[0x10, 0x99, 0x98]), None, "no agreement");
        assert_eq!(
            splice(&cfi[..1], &[0x10, 0x20]),
            None,
            "no return address yet"
        );
        // A recursion: 0x30 is every level's return address. CFI saw three levels; the
        // chain's third entry for it is where CFI stopped.
        let recursion = [
            CodeAddress::InstructionPointer(0x10),
            CodeAddress::ReturnAddress(0x30),
            CodeAddress::ReturnAddress(0x30),
            CodeAddress::ReturnAddress(0x30),
        ];
        let chain = [0x10, 0x30, 0x30, 0x30, 0x30, 0x30, 0x40];
        assert_eq!(splice(&recursion, &chain), Some(vec![0x30, 0x30, 0x40]));
    }
}
