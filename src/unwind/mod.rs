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

mod cfi;
mod code;
pub mod maps;

use code::CodeRule;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use framehop::x86_64::CacheX86_64;

use crate::events::{NoMemory, ProcessMemory};
use crate::events::{Sample, UserRegs};
use crate::files::lazycfi::LazyCfi;
use crate::files::lazycfi::UnwindSections;
use crate::unwind::maps::{AddressSpace, Region};

/// How the user part of stacks is unwound (docs/design.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnwindMode {
    /// CFI through the stack copy, then the frame-pointer chain beyond it.
    #[default]
    Hybrid,
    /// The kernel's frame-pointer chain only (with the frameless-leaf repair).
    Fp,
    /// CFI through the stack copy only.
    Dwarf,
}

/// Bytes of user stack copied with every sample in frame-pointer mode. The copy lets the
/// unwinder read the return address of a frameless leaf function (one that has not
/// pushed RBP, which gcc does for every -O2 leaf even with -fno-omit-frame-pointer): it
/// lies at `sp + CFA offset - 8`, and 512 bytes cover leaves with up to ~500 bytes of
/// locals while keeping a sample record around 700 bytes.
const FP_STACK_COPY_BYTES: u32 = 512;

impl UnwindMode {
    /// The stack copy each mode needs by default. fp reads only the frameless leaf's
    /// return address near the stack top. hybrid needs CFI only until the frame-pointer
    /// chain can take over: 8 KiB covers the no-frame-pointer library frames measured
    /// here (qsort's merge recursion, Rust std) with room. dwarf has nothing to fall back
    /// on, so it copies twice that. The kernel caps a sample's copy below 64 KiB.
    pub fn default_stack_bytes(self) -> u32 {
        match self {
            UnwindMode::Fp => FP_STACK_COPY_BYTES,
            UnwindMode::Hybrid => 8192,
            UnwindMode::Dwarf => 16384,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            UnwindMode::Hybrid => "hybrid",
            UnwindMode::Fp => "fp",
            UnwindMode::Dwarf => "dwarf",
        }
    }
}

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
    /// Why the outermost frames are missing, if they are.
    pub truncated: Option<Truncation>,
    /// A caller the frame-pointer chain skipped was restored from the stack copy.
    pub restored_leaf_caller: bool,
}

/// Why a stack lacks its outermost frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Truncation {
    /// The kernel's frame limit cut the frame-pointer chain (`--max-stack`).
    FrameLimit,
    /// The copy of the user stack ended first (`--stack-size` reaches further).
    StackCopy,
    /// Code with no unwind rule that led on: neither CFI, nor a rule from its
    /// instructions, nor a frame-pointer chain (a larger stack copy does not help).
    NoUnwindInfo,
    /// A user thread sampled in the kernel after its memory was released (as it exits):
    /// the kernel could not walk its user stack.
    MemoryGone,
}

/// How many stacks were truncated, by cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TruncatedBy {
    pub frame_limit: u64,
    pub stack_copy: u64,
    pub no_unwind_info: u64,
    pub memory_gone: u64,
}

impl TruncatedBy {
    pub fn total(&self) -> u64 {
        self.frame_limit + self.stack_copy + self.no_unwind_info + self.memory_gone
    }

    pub fn count(&mut self, cause: Truncation) {
        match cause {
            Truncation::FrameLimit => self.frame_limit += 1,
            Truncation::StackCopy => self.stack_copy += 1,
            Truncation::NoUnwindInfo => self.no_unwind_info += 1,
            Truncation::MemoryGone => self.memory_gone += 1,
        }
    }
}

/// What CFI says of the sampled function's own frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafFrame {
    /// It has no RBP frame of its own (yet, or any more): RBP still holds its caller's
    /// frame, so the frame-pointer chain skips the caller, whose return address this is.
    Frameless { return_address: u64 },
    /// RBP points at its own frame: the frame-pointer chain is right.
    Framed,
}

/// What the frame-pointer unwinder needs to know about the code of the sample's process.
pub trait CodeLookup {
    /// The sampled function's frame, by its CFI, through the stack copy; `None` when
    /// there is no CFI for it or the copy does not reach its return address.
    fn leaf_frame(&mut self, regs: UserRegs, stack_copy: &[u8]) -> Option<LeafFrame>;
    /// Whether an absolute address lies in executable memory of the process.
    fn is_code(&mut self, address: u64) -> bool;
}

/// Builds the stack of `sample` from its frame-pointer callchain, restoring the caller
/// that the chain skips when the sampled function has no RBP frame.
pub fn unwind_frame_pointers(sample: &Sample, code: &mut dyn CodeLookup) -> UnwoundStack {
    let mut user_raw = callchain(&sample.user_callchain);
    let mut restored = false;
    if let (Some(regs), Some(&leaf)) = (sample.user_regs, user_raw.first()) {
        if regs.ip == leaf {
            if let Some(ra) = frameless_return_address(regs, &sample.stack_copy, code) {
                // The kernel read the next entry at RBP + 8, and RBP still holds the
                // caller's frame: that entry is the caller's caller, so the caller always
                // goes in between (even when both are the same call site, in recursion).
                user_raw.insert(1, ra);
                restored = true;
            }
        }
    }
    // The user leaf is an exact instruction address even in a sample taken in the kernel:
    // after a `syscall` it is the next instruction, still inside the wrapper, and after a
    // fault or an interrupt it is the interrupted instruction itself.
    let user = leaf_first(&user_raw);
    UnwoundStack {
        kernel: kernel_frames(sample),
        user,
        truncated: sample.callchain_truncated.then_some(Truncation::FrameLimit),
        restored_leaf_caller: restored,
    }
}

/// A part of a sample's callchain without the zero entries the kernel leaves where its
/// walk found nothing.
fn callchain(addresses: &[u64]) -> Vec<u64> {
    addresses.iter().copied().filter(|&a| a != 0).collect()
}

/// The kernel part of a sample's callchain, leaf first.
fn kernel_frames(sample: &Sample) -> Vec<CodeAddress> {
    leaf_first(&callchain(&sample.kernel_callchain))
}

/// Marks a leaf-first list of addresses: the first is the sampled instruction, every
/// other one the return address of a call.
fn leaf_first(addresses: &[u64]) -> Vec<CodeAddress> {
    let mut out: Vec<CodeAddress> = addresses
        .iter()
        .map(|&a| CodeAddress::ReturnAddress(a))
        .collect();
    if let Some(first) = out.first_mut() {
        *first = CodeAddress::InstructionPointer(first.raw());
    }
    out
}

/// The return address of a leaf that has no RBP frame, from its CFI and the stack copy;
/// only believed when it points into executable memory.
fn frameless_return_address(
    regs: UserRegs,
    stack_copy: &[u8],
    code: &mut dyn CodeLookup,
) -> Option<u64> {
    match code.leaf_frame(regs, stack_copy)? {
        LeafFrame::Frameless { return_address } => {
            code.is_code(return_address).then_some(return_address)
        }
        LeafFrame::Framed => None,
    }
}

/// A file's CFI read one function at a time, where the file lies in the process
/// (`bias`), and its name for framehop.
#[derive(Clone, Debug)]
struct LazyCode {
    cfi: Arc<LazyCfi>,
    bias: u64,
    name: Arc<str>,
}

/// What the unwinder knows of the code of one mapping.
#[derive(Clone, Debug)]
enum Code {
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
struct Derived {
    pages: HashMap<u64, Option<Arc<[u8]>>>,
    rules: HashMap<u64, Option<CodeRule>>,
    cfi_looked_up: HashSet<u64>,
    cfi_modules: HashSet<u64>,
}

impl Derived {
    /// Forgets what was learnt of `range`, which is mapped anew; the starts of the
    /// functions' modules there, which the caller takes out of framehop's.
    fn forget(&mut self, range: Range<u64>) -> Vec<u64> {
        self.pages
            .retain(|&page, _| page + PAGE <= range.start || page >= range.end);
        self.rules.retain(|address, _| !range.contains(address));
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
struct Process<T> {
    space: AddressSpace<T>,
    code: AddressSpace<Code>,
    modules: cfi::Modules,
    derived: Derived,
}

impl<T> Process<T> {
    /// What a walk over its stacks needs: its CFI, its code, what was derived of it.
    fn parts(&mut self) -> (&cfi::Modules, &AddressSpace<Code>, &mut Derived) {
        (&self.modules, &self.code, &mut self.derived)
    }

    /// What is known of the code of `len` bytes at `start` (showing the file from
    /// `file_offset`); what was derived of the code there before is forgotten.
    fn map_code(&mut self, start: u64, len: u64, file_offset: u64, code: Code) {
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

/// The one entry into unwinding: every process's code mappings as they change (replayed
/// in time order: maps, forks, execs), their CFI, and the mode's policy. Each mapping
/// carries a payload `T` that the caller resolves once (its library, how its addresses
/// translate), which [`Unwinder::lookup`] hands back for a frame's address.
pub struct Unwinder<T> {
    mode: UnwindMode,
    processes: HashMap<i32, Process<T>>,
    cache: CacheX86_64,
    memory: Box<dyn ProcessMemory>,
    /// The outermost frames of each thread's stack beyond a given return address, once
    /// read from its memory (`None`: they could not be): the bottom of a stack does not
    /// change while the thread lives.
    bottoms: HashMap<(i32, u64), Option<Arc<[CodeAddress]>>>,
    /// How many times each thread's stack memory was read for [`Self::bottoms`].
    bottom_reads: HashMap<i32, u32>,
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
}

/// Reads of one thread's stack memory for its outermost frames: a thread's chains end at
/// a handful of return addresses (its start, a few callers without frame pointers); one
/// that ends somewhere new at every sample is broken, and is not read for each.
const MAX_BOTTOM_READS: u32 = 32;

/// How much of a thread's stack is searched for the outermost frames of a deep stack:
/// the main thread's start frames lie below its environment and auxiliary vector, and a
/// thread's below its thread control block and static TLS, both a few KiB from the top.
const STACK_BOTTOM_BYTES: u64 = 64 * 1024;

impl<T: Clone> Unwinder<T> {
    /// An unwinder that reads no process memory.
    pub fn new(mode: UnwindMode) -> Unwinder<T> {
        Unwinder::with_memory(mode, Box::new(NoMemory))
    }

    /// An unwinder that reads the memory of the processes it unwinds (live recording).
    pub fn with_memory(mode: UnwindMode, memory: Box<dyn ProcessMemory>) -> Unwinder<T> {
        Unwinder {
            mode,
            processes: HashMap::new(),
            cache: CacheX86_64::default(),
            memory,
            bottoms: HashMap::new(),
            bottom_reads: HashMap::new(),
        }
    }

    /// A mapping of process `pid`; whatever it overlaps is unmapped, as `mmap(MAP_FIXED)`
    /// does. `code` is its CFI, when its file could be read.
    pub fn map(&mut self, pid: i32, region: Region<T>, code: Option<CodeModule<'_>>) {
        let process = self.processes.entry(pid).or_default();
        let avma: Range<u64> = region.start..region.start + region.len;
        let known = match code {
            Some(code) => {
                let lazy = code.sections.lazy.as_ref().map(|cfi| LazyCode {
                    cfi: cfi.clone(),
                    bias: code.bias,
                    name: code.name.into(),
                });
                match lazy {
                    // Its functions are added as frames meet them.
                    Some(_) => process.modules.remove(avma.start),
                    None => cfi::add_module(
                        &process.modules,
                        code.name,
                        avma.clone(),
                        code.bias,
                        code.sections,
                    ),
                }
                match code.text {
                    Some(text) => Code::File {
                        bytes: text.bytes.cloned(),
                        has_cfi: code.sections.has_cfi(),
                        entry_returns: text
                            .entry_returns
                            .iter()
                            .map(|a| a.wrapping_add(code.bias))
                            .collect(),
                        entry_stub: text.entry_stub.map(|r| {
                            r.start.wrapping_add(code.bias)..r.end.wrapping_add(code.bias)
                        }),
                        lazy,
                    },
                    None => Code::Cfi { lazy },
                }
            }
            None => Code::Unknown,
        };
        process.map_code(region.start, region.len, region.file_offset, known);
        process.space.map(region);
    }

    /// Anonymous executable memory of process `pid` (JIT code): what was read of it
    /// before is forgotten, as the code may have changed.
    pub fn map_anonymous(&mut self, pid: i32, region: Region<T>) {
        let process = self.processes.entry(pid).or_default();
        process.map_code(
            region.start,
            region.len,
            region.file_offset,
            Code::Anonymous,
        );
        process.space.map(region);
    }

    /// CFI that a JIT gave for its code at `code` in process `pid` (from its JIT dump):
    /// `.eh_frame` and its header, whose addresses are relative to where they lie, which
    /// the header's table says: its first entry is the code's start. Ignored when the
    /// header is not in the encodings JITs write (pc-relative and data-relative 4-byte
    /// values).
    pub fn add_jit_cfi(
        &mut self,
        pid: i32,
        code: Range<u64>,
        eh_frame: &[u8],
        eh_frame_hdr: &[u8],
    ) -> bool {
        let Some(first) = jit_hdr_first_entry(eh_frame_hdr) else {
            return false;
        };
        // framehop takes addresses relative to the module's base, as 32 bits: the code's
        // start is the base, and every section address is relative to it.
        let len = code.end - code.start;
        let hdr_at = first.wrapping_neg() as u64;
        let frame_at = hdr_at.wrapping_sub(eh_frame.len() as u64);
        let sections = UnwindSections {
            text: Some(0..len),
            eh_frame: Some((frame_at..hdr_at, eh_frame.into())),
            eh_frame_hdr: Some((
                hdr_at..hdr_at + eh_frame_hdr.len() as u64,
                eh_frame_hdr.into(),
            )),
            ..UnwindSections::default()
        };
        let process = self.processes.entry(pid).or_default();
        cfi::add_module(&process.modules, "jit", code.clone(), code.start, &sections);
        process.map_code(code.start, len, 0, Code::Cfi { lazy: None });
        true
    }

    /// A new process starts with a copy of its parent's mappings.
    pub fn fork(&mut self, parent: i32, child: i32) {
        if parent != child {
            let copy = self.processes.get(&parent).cloned().unwrap_or_default();
            self.processes.insert(child, copy);
        }
    }

    /// `exec` replaces the whole address space; the new program's mappings follow.
    pub fn exec(&mut self, pid: i32) {
        self.processes.insert(pid, Process::default());
        self.bottoms.retain(|&(tid, _), _| tid != pid);
        self.bottom_reads.remove(&pid);
    }

    /// Drops what is known of process `pid` and of its threads `tids`: it has exited,
    /// and no sample of it is to come.
    pub fn forget(&mut self, pid: i32, tids: &[i32]) {
        self.processes.remove(&pid);
        self.bottoms.retain(|(tid, _), _| !tids.contains(tid));
        for tid in tids {
            self.bottom_reads.remove(tid);
        }
    }

    /// The mapping of process `pid` that contains `address`.
    pub fn lookup(&self, pid: i32, address: u64) -> Option<&Region<T>> {
        self.processes.get(&pid)?.space.lookup(address)
    }

    /// The stack of `sample`, as the mode says: hybrid takes CFI through the stack copy
    /// and the frame-pointer chain beyond it, and the frame-pointer chain alone where
    /// CFI knew nothing of the sampled code (fewer than two frames: a file that could
    /// not be read); dwarf takes CFI only; fp the chain with its leaf repaired. Code
    /// without CFI is unwound by rules derived from its instructions. A stack whose
    /// frame-pointer chain ended short of the outermost frame gets its outermost frames
    /// from the thread's stack memory.
    pub fn unwind(&mut self, sample: &Sample) -> UnwoundStack {
        let has_code = |p: &Process<T>| !p.space.regions().is_empty();
        if sample.user_callchain.is_empty()
            && !sample.kernel_callchain.is_empty()
            && self.processes.get(&sample.pid).is_some_and(has_code)
        {
            // A user process's thread (its process has mappings, which a kernel thread
            // has not) whose user stack the kernel did not walk: its memory is gone (it
            // is exiting). Its kernel frames are all there is.
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

/// The first table entry of an `.eh_frame_hdr` as JITs write it (version 1, table encoded
/// data-relative signed 4-byte, the `.eh_frame` pointer and count 4 bytes): the offset of
/// the first function's start from the header.
fn jit_hdr_first_entry(hdr: &[u8]) -> Option<i64> {
    /// DW_EH_PE_datarel | DW_EH_PE_sdata4.
    const DATAREL_SDATA4: u8 = 0x3b;
    let [1, ptr_enc, count_enc, DATAREL_SDATA4, ..] = *hdr else {
        return None;
    };
    // Both 4-byte encodings: pc-relative/absolute (s|u)data4.
    if ptr_enc & 0x0f != 0x0b && ptr_enc & 0x0f != 0x03 || count_enc & 0x0f != 0x03 {
        return None;
    }
    let entry = hdr.get(12..16)?;
    Some(i64::from(i32::from_le_bytes(entry.try_into().ok()?)))
}

/// Why a stack lacks its outermost frames, from how its walk ended.
fn truncation(ended: cfi::Ended) -> Option<Truncation> {
    match ended {
        cfi::Ended::Root | cfi::Ended::ChainEnd => None,
        cfi::Ended::StackCopy => Some(Truncation::StackCopy),
        cfi::Ended::NoRule => Some(Truncation::NoUnwindInfo),
        cfi::Ended::FrameLimit => Some(Truncation::FrameLimit),
    }
}

/// Whether `frame` is in the entry stub of the code `code` (the outermost frame): a
/// return address of one of its calls, or a sampled instruction inside it.
fn in_entry_stub(code: &Code, frame: CodeAddress) -> bool {
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
fn classify(
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
struct ProcessCode<'a, T> {
    process: &'a mut Process<T>,
    cache: &'a mut CacheX86_64,
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
    const PY_TRAMPOLINE_CFI: [u8; 68] = [
        0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x7a, 0x52, 0x00, 0x01, 0x78, 0x10,
        0x01, 0x1b, 0x0c, 0x07, 0x08, 0x90, 0x01, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x1c, 0x00,
        0x00, 0x00, 0xd0, 0xff, 0xff, 0xff, 0x0b, 0x00, 0x00, 0x00, 0x00, 0x44, 0x0e, 0x10, 0x46,
        0x0e, 0x08, 0x00, 0x01, 0x1b, 0x03, 0x3b, 0xcc, 0xff, 0xff, 0xff, 0x01, 0x00, 0x00, 0x00,
        0xc0, 0xff, 0xff, 0xff, 0xe8, 0xff, 0xff, 0xff,
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
}
