//! What the unwinder keeps of one process's code: its executable mappings with what is
//! known of each (a file's CFI, read whole or function by function; a file's bytes;
//! anonymous JIT memory), the rules derived from code without CFI, and how a frame's
//! address is classified for the CFI walk. Kept per process because mappings change
//! with maps, forks and execs, and every sample through the same code asks again.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};

use crate::events::{ProcessMemory, UserRegs};
use crate::files::binary::PageMemo;
use crate::files::image::At;
use crate::files::lazycfi::{LazyCfi, UnwindSections};
use crate::unwind::maps::{AddressSpace, Region};

use super::address::CodeAddress;
use super::cfi;
use super::code::{self, CodeRule};
use super::frame_pointer::{CodeLookup, LeafFrame};
use super::signal::{self, Interrupted};

/// A file's CFI read one function at a time, where the file lies in the process
/// (`bias`), and its name for framehop.
#[derive(Clone, Debug)]
pub(super) struct LazyCode {
    pub(super) cfi: Arc<LazyCfi>,
    pub(super) bias: u64,
    pub(super) name: Arc<str>,
}

/// What the unwinder knows of the code of one mapping.
#[derive(Clone, Debug)]
pub(super) enum Code {
    /// A file whose CFI framehop has (or gets, function by function, from `lazy`); no
    /// code bytes were given.
    Cfi { lazy: Option<LazyCode> },
    /// A file's code: its bytes (indexed by file offset), whether it has CFI, and the
    /// process addresses of its entry stub's return addresses.
    File {
        /// The whole file, when it has no CFI.
        bytes: Option<Arc<[u8]>>,
        has_cfi: bool,
        entry_returns: Arc<[u64]>,
        entry_stub: Option<Range<u64>>,
        lazy: Option<LazyCode>,
        /// The file, read a few bytes at a time to recognise the signal trampoline.
        file: Option<At>,
        /// The signal trampolines found in the file's pages, for every process.
        trampolines: Arc<PageMemo>,
    },
    /// Anonymous executable memory (JIT code): its bytes are read from the process.
    Anonymous,
    /// A file that could not be read.
    Unknown,
}

/// Bytes of code read for one frame: the trampolines and epilogues that rules are
/// derived from end well within this (see [`code::derive_rule`]'s instruction limit
/// times x86's longest common instruction of about 5 bytes).
const CODE_WINDOW: usize = 256;

/// Pages of a process's JIT code, read once: the code stays known after the process has
/// exited (its last samples are unwound later).
const PAGE: u64 = 4096;

/// What was learnt of a process's code without CFI, kept because every sample through it
/// asks again: the pages of its anonymous executable memory read so far (`None`:
/// unreadable), and the rule derived for each frame address (`None`: no rule).
///
/// Also what CFI read function by function was added to framehop: the frame addresses
/// whose function was looked up, and where each function's module starts.
#[derive(Clone, Default)]
pub(super) struct Derived {
    pages: HashMap<u64, Option<Arc<[u8]>>>,
    rules: HashMap<u64, Option<CodeRule>>,
    cfi_looked_up: HashSet<u64>,
    cfi_modules: HashSet<u64>,
    /// The signal trampolines in each page of code searched so far (their file offsets,
    /// by where the file's page would lie in the process).
    sigreturns: HashMap<u64, Arc<[u64]>>,
}

impl Derived {
    /// Forgets what was learnt of `range`, which is mapped anew; the starts of the
    /// functions' modules there, which the caller takes out of framehop's.
    fn forget(&mut self, range: Range<u64>) -> Vec<u64> {
        self.pages
            .retain(|&page, _| page + PAGE <= range.start || page >= range.end);
        self.rules.retain(|address, _| !range.contains(address));
        self.sigreturns
            .retain(|&page, _| page + PAGE <= range.start || page >= range.end);
        self.cfi_looked_up
            .retain(|address| !range.contains(address));
        let gone: Vec<u64> = self
            .cfi_modules
            .iter()
            .copied()
            .filter(|start| range.contains(start))
            .collect();
        for start in &gone {
            self.cfi_modules.remove(start);
        }
        gone
    }
}

/// One process while it is being recorded: its executable mappings, each with what its
/// user resolved for it once (`T`), what is known of their code, and their CFI.
#[derive(Clone)]
pub(super) struct Process<T> {
    pub(super) space: AddressSpace<T>,
    pub(super) code: AddressSpace<Code>,
    pub(super) modules: cfi::Modules,
    derived: Derived,
}

impl<T> Process<T> {
    /// What a walk over its stacks needs: its CFI, its code, what was derived of it.
    pub(super) fn parts(&mut self) -> (&cfi::Modules, &AddressSpace<Code>, &mut Derived) {
        (&self.modules, &self.code, &mut self.derived)
    }

    /// What is known of the code of `len` bytes at `start` (showing the file from
    /// `file_offset`); what was derived of the code there before is forgotten.
    pub(super) fn map_code(&mut self, start: u64, len: u64, file_offset: u64, code: Code) {
        for module in self.derived.forget(start..start.saturating_add(len)) {
            self.modules.remove(module);
        }
        self.code.map(Region {
            start,
            len,
            file_offset,
            data: code,
        });
    }
}

impl<T> Default for Process<T> {
    fn default() -> Self {
        Process {
            space: AddressSpace::default(),
            code: AddressSpace::default(),
            modules: cfi::Modules::default(),
            derived: Derived::default(),
        }
    }
}

/// The code of a mapping, for CFI: the module's name, where the file's address 0 lies in
/// the process (`bias`), its unwind sections, and its bytes with its entry stub's
/// return addresses (in the file's addresses) when rules are to be derived from its code.
pub struct CodeModule<'a> {
    pub name: &'a str,
    pub bias: u64,
    pub sections: &'a UnwindSections,
    pub text: Option<FileCode<'a>>,
}

/// A file's bytes, indexed by file offset, and its entry stub (its code and the return
/// addresses of its calls), in the file's addresses.
pub struct FileCode<'a> {
    /// The whole file, when it has no CFI (rules are then derived from its code).
    pub bytes: Option<&'a Arc<[u8]>>,
    pub entry_returns: &'a [u64],
    pub entry_stub: Option<Range<u64>>,
    /// The file, to read the code at a frame's address from.
    pub file: Option<At>,
    /// The signal trampolines found in its pages so far (see
    /// [`crate::files::binary::Binary::trampolines`]).
    pub trampolines: Arc<PageMemo>,
}

/// Whether `frame` is in the entry stub of the code `code` (the outermost frame): a
/// return address of one of its calls, or a sampled instruction inside it.
pub(super) fn in_entry_stub(code: &Code, frame: CodeAddress) -> bool {
    let Code::File {
        entry_returns,
        entry_stub,
        ..
    } = code
    else {
        return false;
    };
    match frame {
        CodeAddress::ReturnAddress(a) => entry_returns.contains(&a),
        CodeAddress::InstructionPointer(a) => entry_stub.as_ref().is_some_and(|s| s.contains(&a)),
    }
}

/// What is known of the code at `frame` of process `pid`: CFI, a rule derived from its
/// instructions (code without CFI: JIT code, stubs), or the entry stub.
pub(super) fn classify(
    modules: &cfi::Modules,
    code: &AddressSpace<Code>,
    derived: &mut Derived,
    memory: &mut dyn ProcessMemory,
    pid: i32,
    frame: CodeAddress,
) -> cfi::FrameCode {
    let Some(region) = code.lookup(frame.lookup_address()) else {
        return cfi::FrameCode::NotCode;
    };
    if in_entry_stub(&region.data, frame) {
        return cfi::FrameCode::EntryStub;
    }
    if is_sigreturn(region, &mut derived.sigreturns, frame) {
        return cfi::FrameCode::SignalReturn;
    }
    add_function_cfi(modules, derived, region, frame);
    let address = frame.raw();
    let rule = match &region.data {
        Code::File { has_cfi: true, .. } | Code::Cfi { .. } | Code::Unknown => None,
        Code::File { bytes: None, .. } => None,
        Code::File {
            bytes: Some(bytes), ..
        } => *derived.rules.entry(address).or_insert_with(|| {
            let at = usize::try_from(region.file_offset_of(address)).unwrap_or(usize::MAX);
            let end = at.saturating_add(CODE_WINDOW).min(bytes.len());
            bytes
                .get(at..end)
                .and_then(|b| code::derive_rule(b, address))
        }),
        Code::Anonymous => match derived.rules.get(&address) {
            Some(&known) => known,
            None => {
                let end =
                    (region.start + region.len).min(address.saturating_add(CODE_WINDOW as u64));
                let rule = read_code(&mut derived.pages, memory, pid, address..end)
                    .and_then(|b| code::derive_rule(&b, address));
                derived.rules.insert(address, rule);
                rule
            }
        },
    };
    rule.map_or(cfi::FrameCode::Cfi, cfi::FrameCode::Derived)
}

/// Whether `frame` is in the signal trampoline of a file: a return address at its start
/// (where a handler returns to), or a sampled instruction in it. Each page of a file is
/// searched once for all processes (the file's `trampolines`), and each process asks
/// the file once per page (`known`).
fn is_sigreturn(
    region: &Region<Code>,
    known: &mut HashMap<u64, Arc<[u64]>>,
    frame: CodeAddress,
) -> bool {
    let Code::File {
        bytes,
        file,
        trampolines,
        ..
    } = &region.data
    else {
        return false;
    };
    let region_end = region.start.saturating_add(region.len);
    let code_len = signal::SIGRETURN_CODE.len() as u64;
    let mut starts_at = |address: u64| {
        if address < region.start || address.saturating_add(code_len) > region_end {
            return false;
        }
        let offset = region.file_offset_of(address);
        let page = offset & !(PAGE - 1);
        known
            .entry(address.wrapping_sub(offset - page))
            .or_insert_with(|| {
                trampolines.get_or_search(page, || {
                    trampolines_in(bytes.as_deref(), file.as_ref(), page)
                })
            })
            .contains(&offset)
    };
    match frame {
        CodeAddress::ReturnAddress(a) => starts_at(a),
        CodeAddress::InstructionPointer(a) => signal::SIGRETURN_IPS
            .iter()
            .any(|&offset| a.checked_sub(offset).is_some_and(&mut starts_at)),
    }
}

/// The file offsets of the signal trampolines that start in the page at file offset
/// `page`: its bytes (and the next few, where one may end) read from the file's `bytes`
/// or `file`.
fn trampolines_in(bytes: Option<&[u8]>, file: Option<&At>, page: u64) -> Vec<u64> {
    let len = (PAGE as usize) + signal::SIGRETURN_CODE.len() - 1;
    let code = match (bytes, file) {
        (Some(bytes), _) => usize::try_from(page)
            .ok()
            .and_then(|p| bytes.get(p..p.saturating_add(len).min(bytes.len())))
            .map(<[u8]>::to_vec),
        (None, Some(file)) => file.read_exact_at(page, len),
        (None, None) => None,
    };
    let code = code.unwrap_or_default();
    code.windows(signal::SIGRETURN_CODE.len())
        .enumerate()
        .filter(|(_, w)| signal::is_sigreturn(w))
        .map(|(i, _)| page + i as u64)
        .filter(|&a| a < page + PAGE)
        .collect()
}

/// Adds to framehop's modules the CFI of the function at `frame` in `region`, when the
/// region's file has its CFI read function by function and that function was not added
/// yet. Its module covers the function's addresses within the region.
fn add_function_cfi(
    modules: &cfi::Modules,
    derived: &mut Derived,
    region: &Region<Code>,
    frame: CodeAddress,
) {
    let (Code::Cfi { lazy: Some(lazy) }
    | Code::File {
        lazy: Some(lazy), ..
    }) = &region.data
    else {
        return;
    };
    let address = frame.lookup_address();
    if !derived.cfi_looked_up.insert(address) {
        return;
    }
    let Some(function) = lazy.cfi.function_at(address.wrapping_sub(lazy.bias)) else {
        return;
    };
    let region_end = region.start.saturating_add(region.len);
    let start = function
        .covers
        .start
        .wrapping_add(lazy.bias)
        .max(region.start);
    let end = match function.covers.end {
        u64::MAX => region_end,
        end => end.wrapping_add(lazy.bias).min(region_end),
    };
    if start < end && derived.cfi_modules.insert(start) {
        cfi::add_module(
            modules,
            &lazy.name,
            start..end,
            lazy.bias,
            &function.sections,
        );
    }
}

/// The bytes of `range` of a process's anonymous code, through its page cache.
fn read_code(
    pages: &mut HashMap<u64, Option<Arc<[u8]>>>,
    memory: &mut dyn ProcessMemory,
    pid: i32,
    range: Range<u64>,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(CODE_WINDOW);
    let mut page = range.start & !(PAGE - 1);
    while page < range.end {
        let bytes = pages
            .entry(page)
            .or_insert_with(|| {
                let mut buf = vec![0; PAGE as usize];
                memory.read(pid, page, &mut buf).then(|| buf.into())
            })
            .clone()?;
        let from = range.start.max(page) - page;
        let to = range.end.min(page + PAGE) - page;
        out.extend_from_slice(&bytes[from as usize..to as usize]);
        page += PAGE;
    }
    Some(out)
}

/// One process's code, as the frame-pointer unwinder looks it up.
pub(super) struct ProcessCode<'a, T> {
    pub(super) process: &'a mut Process<T>,
    pub(super) cache: &'a mut CacheX86_64,
    pub(super) memory: &'a mut dyn ProcessMemory,
    pub(super) pid: i32,
}

impl<T: Clone> CodeLookup for ProcessCode<'_, T> {
    fn leaf_frame(&mut self, regs: UserRegs, stack_copy: &[u8]) -> Option<LeafFrame> {
        let (modules, code, derived) = self.process.parts();
        let leaf = CodeAddress::InstructionPointer(regs.ip);
        if let Some(region) = code.lookup(leaf.lookup_address()) {
            add_function_cfi(modules, derived, region, leaf);
        }
        cfi::leaf_frame(modules, self.cache, regs, stack_copy)
    }

    fn is_code(&mut self, address: u64) -> bool {
        self.process.space.lookup(address).is_some()
    }

    fn is_sigreturn(&mut self, address: u64) -> bool {
        let frame = CodeAddress::ReturnAddress(address);
        let process = &mut *self.process;
        process
            .code
            .lookup(frame.lookup_address())
            .is_some_and(|region| is_sigreturn(region, &mut process.derived.sigreturns, frame))
    }

    fn returns_through_rbp(&mut self, at: Interrupted) -> bool {
        let (modules, code, derived) = self.process.parts();
        let frame = CodeAddress::InstructionPointer(at.ip);
        if let Some(region) = code.lookup(at.ip) {
            add_function_cfi(modules, derived, region, frame);
        }
        cfi::returns_through_rbp(modules, self.cache, at)
    }

    fn interrupted_frames(&mut self, at: Interrupted, stack: (u64, &[u8])) -> cfi::Walk {
        let (modules, code, derived) = self.process.parts();
        let (memory, pid) = (&mut *self.memory, self.pid);
        let mut classify = |frame| classify(modules, code, derived, memory, pid, frame);
        cfi::walk(
            modules,
            self.cache,
            CodeAddress::InstructionPointer(at.ip),
            UnwindRegsX86_64::new(at.ip, at.sp, at.bp),
            stack,
            &mut classify,
        )
    }
}
