//! The one entry into unwinding, [`Unwinder`], and its registry of processes: every
//! process's code mappings as they change (replayed in time order: maps, forks, execs,
//! exits) and the CFI JITs give for their code. The walk over a sample's stack is in
//! `walk`.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use framehop::x86_64::CacheX86_64;

use crate::events::{NoMemory, ProcessMemory};
use crate::files::lazycfi::UnwindSections;
use crate::unwind::maps::Region;

use super::address::CodeAddress;
use super::cfi;
use super::mode::UnwindMode;
use super::process::{Code, CodeModule, LazyCode, Process};

/// The one entry into unwinding: every process's code mappings as they change (replayed
/// in time order: maps, forks, execs), their CFI, and the mode's policy. Each mapping
/// carries a payload `T` that the caller resolves once (its library, how its addresses
/// translate), which [`Unwinder::lookup`] hands back for a frame's address.
pub struct Unwinder<T> {
    pub(super) mode: UnwindMode,
    pub(super) processes: HashMap<i32, Process<T>>,
    pub(super) cache: CacheX86_64,
    pub(super) memory: Box<dyn ProcessMemory>,
    /// The outermost frames of each thread's stack beyond a given return address, once
    /// read from its memory (`None`: they could not be): the bottom of a stack does not
    /// change while the thread lives.
    pub(super) bottoms: HashMap<(i32, u64), Option<Arc<[CodeAddress]>>>,
    /// How many times each thread's stack memory was read for [`Self::bottoms`].
    pub(super) bottom_reads: HashMap<i32, u32>,
    /// The user stack at which each exiting thread called `exit_group`, by its tid and
    /// by its process's pid: its samples in the kernel after its memory was released
    /// have this one (see [`crate::events::EventKind::ExitStack`]), and so have those of
    /// its process's other threads (the last of them to go releases the memory).
    pub(super) exit_stacks: HashMap<i32, ExitStack>,
}

/// A thread's user stack at its `exit_group`, unwound.
#[derive(Clone, Debug)]
pub(super) struct ExitStack {
    pub(super) user: Arc<[CodeAddress]>,
    pub(super) truncated: Option<super::truncation::Truncation>,
}

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
            exit_stacks: HashMap::new(),
        }
    }

    /// Thread `sample.tid` called `exit_group` with the stack of `sample`: unwound now,
    /// while its process's code is known, and kept for its samples to come.
    pub fn exiting(&mut self, sample: &crate::events::Sample) {
        let stack = self.unwind(sample);
        if !stack.user.is_empty() {
            let exit = ExitStack {
                user: stack.user.into(),
                truncated: stack.truncated,
            };
            self.exit_stacks.insert(sample.pid, exit.clone());
            self.exit_stacks.insert(sample.tid, exit);
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
                        file: text.file,
                        trampolines: text.trampolines,
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
        self.exit_stacks.remove(&pid);
    }

    /// Drops what is known of process `pid` and of its threads `tids`: it has exited,
    /// and no sample of it is to come.
    pub fn forget(&mut self, pid: i32, tids: &[i32]) {
        self.processes.remove(&pid);
        self.exit_stacks.remove(&pid);
        self.bottoms.retain(|(tid, _), _| !tids.contains(tid));
        for tid in tids {
            self.bottom_reads.remove(tid);
            self.exit_stacks.remove(tid);
        }
    }

    /// The mapping of process `pid` that contains `address`.
    pub fn lookup(&self, pid: i32, address: u64) -> Option<&Region<T>> {
        self.processes.get(&pid)?.space.lookup(address)
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
