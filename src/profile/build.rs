//! From recorded events to a [`RawProfile`], incrementally: events are fed in time order
//! (while the command still runs), each process's library map and each thread's name are
//! kept current, every sample is unwound and its stack interned at once, and the sample's
//! raw material (registers, stack copy) is dropped. Memory then grows with the number of
//! unique stacks, not with the number of samples.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::binary::{Binary, BinaryCache, FrameRule};
use crate::maps::{AddressSpaces, Region};
use crate::record::{Event, EventKind, Mapping, Recording, RecordingInfo, Sample};
use crate::unwind::{unwind_frame_pointers, CodeAddress, CodeLookup};

/// Name of the library that holds kernel frames (perf's name for it).
pub const KERNEL_LIB_NAME: &str = "[kernel.kallsyms]";
/// Name of the marker frame at the root of a stack whose outer frames are missing.
pub const TRUNCATED_MARKER: &str = "[truncated]";
/// Kernel addresses are the upper half of the x86-64 address space. Kernel frames are
/// made relative to this when the kernel's text start is unknown (kallsyms hidden), which
/// keeps them below 2^53, exact in JSON numbers.
const KERNEL_SPACE_START: u64 = 0xffff_8000_0000_0000;

/// What one mapping of a process was resolved to, once, when it was mapped.
#[derive(Clone, Copy, Debug)]
struct Module {
    /// `None` for anonymous memory (JIT code, `[heap]`, …).
    lib: Option<LibIndex>,
    /// The file's own address of a byte is its file offset plus this, inside the segment
    /// the mapping shows; `None` when the file could not be read (addresses stay file
    /// offsets).
    svma_delta: Option<i64>,
}

/// Per-thread state while building; times in CLOCK_MONOTONIC ns.
struct ThreadState {
    tid: i32,
    process: ProcessIndex,
    name: String,
    start_ns: u64,
    end_ns: Option<u64>,
    samples: Vec<(u64, RawStackIndex)>,
}

struct ProcessState {
    pid: i32,
    name: String,
    start_ns: u64,
    end_ns: Option<u64>,
}

/// The raw profile and, for each of its libraries, the file that was verified to be the
/// one that was mapped (same build ID), for the symbolicator to use.
pub struct Built {
    pub profile: RawProfile,
    pub lib_binaries: Vec<Option<Arc<Binary>>>,
}

/// Builds a raw profile from events fed in time order.
pub struct ProfileBuilder {
    binaries: BinaryCache,
    kernel_base: u64,
    spaces: AddressSpaces<Module>,
    libs: Interner<Lib, LibIndex>,
    lib_binaries: Vec<Option<Arc<Binary>>>,
    frames: Interner<AddressFrame, AddressFrameIndex>,
    stacks: Interner<RawStack, RawStackIndex>,
    processes: Vec<ProcessState>,
    process_by_pid: HashMap<i32, ProcessIndex>,
    threads: Vec<ThreadState>,
    thread_by_tid: HashMap<i32, usize>,
    frame_rules: HashMap<(LibIndex, u64), Option<FrameRule>>,
    truncated_stacks: u64,
    restored_callers: u64,
}

/// Builds the raw profile of a whole recording at once (see [`ProfileBuilder`]).
pub fn build(recording: &Recording, kernel_base: Option<u64>) -> Built {
    let mut b = ProfileBuilder::new(kernel_base);
    b.add_events(&recording.events);
    b.finish(&recording.info)
}

impl ProfileBuilder {
    /// `kernel_base` is the kernel's text start (from kallsyms), to which kernel frame
    /// addresses are made relative; `None` when unknown.
    pub fn new(kernel_base: Option<u64>) -> ProfileBuilder {
        ProfileBuilder {
            binaries: BinaryCache::default(),
            kernel_base: kernel_base.unwrap_or(KERNEL_SPACE_START),
            spaces: AddressSpaces::default(),
            libs: Interner::default(),
            lib_binaries: Vec::new(),
            frames: Interner::default(),
            stacks: Interner::default(),
            processes: Vec::new(),
            process_by_pid: HashMap::new(),
            threads: Vec::new(),
            thread_by_tid: HashMap::new(),
            frame_rules: HashMap::new(),
            truncated_stacks: 0,
            restored_callers: 0,
        }
    }

    /// Replays `events`, which come after every event fed before, in time order.
    pub fn add_events(&mut self, events: &[Event]) {
        for event in events {
            let t = event.time_ns;
            match &event.kind {
                EventKind::Mmap(m) if m.executable => self.map(m),
                EventKind::Mmap(_) => {}
                EventKind::Comm {
                    pid,
                    tid,
                    name,
                    exec,
                } => {
                    if *exec {
                        self.spaces.exec(*pid);
                    }
                    let th = self.thread(*pid, *tid, t, None);
                    self.threads[th].name = name.clone();
                    if pid == tid {
                        let p = self.threads[th].process;
                        self.processes[p.index()].name = name.clone();
                    }
                }
                EventKind::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                } => {
                    if pid == tid && pid != ppid {
                        self.spaces.fork(*ppid, *pid);
                    }
                    let parent_name = self
                        .thread_by_tid
                        .get(ptid)
                        .map(|&th| self.threads[th].name.clone());
                    self.thread(*pid, *tid, t, parent_name.as_deref());
                }
                EventKind::Exit { pid, tid } => {
                    if let Some(&th) = self.thread_by_tid.get(tid) {
                        self.threads[th].end_ns = Some(t);
                    }
                    if pid == tid {
                        if let Some(&p) = self.process_by_pid.get(pid) {
                            self.processes[p.index()].end_ns = Some(t);
                        }
                    }
                }
                EventKind::Sample(s) => self.sample(t, s),
                EventKind::Lost { .. } | EventKind::Throttle => {}
            }
        }
    }

    /// The raw profile; times become milliseconds since `info.start_ns`.
    pub fn finish(self, info: &RecordingInfo) -> Built {
        let ms = |ns: u64| ns.saturating_sub(info.start_ns) as f64 / 1e6;
        let processes = self
            .processes
            .into_iter()
            .map(|p| Process {
                pid: p.pid,
                name: p.name,
                start_ms: ms(p.start_ns),
                end_ms: p.end_ns.map(ms),
            })
            .collect::<Vec<_>>();
        let threads = self
            .threads
            .into_iter()
            .map(|t| Thread {
                tid: t.tid,
                process: t.process,
                is_main: processes[t.process.index()].pid == t.tid,
                name: t.name,
                start_ms: ms(t.start_ns),
                end_ms: t.end_ns.map(ms),
                samples: t
                    .samples
                    .into_iter()
                    .map(|(time, stack)| SampleRow {
                        time_ms: ms(time),
                        stack,
                        weight: 1,
                    })
                    .collect(),
            })
            .collect();
        let profile = RawProfile {
            meta: Meta {
                start_unix_ms: info.start_unix_ms,
                interval_ms: 1000.0 / info.frequency_hz.max(1) as f64,
                duration_ms: ms(info.end_ns),
                event: info.event.name().to_string(),
                frequency_hz: info.frequency_hz,
                command: info.command.clone(),
                lost_samples: info.lost_samples,
                throttled: info.throttled,
                kernel_included: info.kernel_included,
                truncated_stacks: self.truncated_stacks,
                restored_callers: self.restored_callers,
            },
            libs: self.libs.items,
            address_frames: self.frames.items,
            stacks: self.stacks.items,
            processes,
            threads,
        };
        Built {
            profile,
            lib_binaries: self.lib_binaries,
        }
    }

    /// The thread `tid` of process `pid`, created (with its process) on first sight.
    fn thread(&mut self, pid: i32, tid: i32, time_ns: u64, name: Option<&str>) -> usize {
        if let Some(&th) = self.thread_by_tid.get(&tid) {
            if self.processes[self.threads[th].process.index()].pid == pid {
                return th;
            }
        }
        let process = match self.process_by_pid.get(&pid) {
            Some(&p) => p,
            None => {
                let p = ProcessIndex::new(self.processes.len());
                let process_name = name.map_or_else(|| format!("pid {pid}"), str::to_string);
                self.processes.push(ProcessState {
                    pid,
                    name: process_name,
                    start_ns: time_ns,
                    end_ns: None,
                });
                self.process_by_pid.insert(pid, p);
                p
            }
        };
        let name = name.map_or_else(
            || self.processes[process.index()].name.clone(),
            str::to_string,
        );
        self.threads.push(ThreadState {
            tid,
            process,
            name,
            start_ns: time_ns,
            end_ns: None,
            samples: Vec::new(),
        });
        self.thread_by_tid.insert(tid, self.threads.len() - 1);
        self.threads.len() - 1
    }

    /// Resolves a new mapping once: its library, and whether the file on disk is the one
    /// that was mapped (a different build ID means it was replaced: its symbols and CFI
    /// would be wrong, so it is not used).
    fn map(&mut self, m: &Mapping) {
        let module = if is_anonymous(m) {
            Module {
                lib: None,
                svma_delta: None,
            }
        } else {
            let pseudo = m.path.starts_with('[');
            let binary = if pseudo {
                None
            } else {
                self.binaries.get(Path::new(&m.path))
            };
            let binary = binary.filter(|b| match (&m.build_id, &b.build_id) {
                (Some(mapped), Some(on_disk)) => mapped == on_disk,
                _ => true,
            });
            let svma_delta = binary
                .as_ref()
                .and_then(|b| b.file_offset_to_svma(m.file_offset))
                .map(|svma| svma.wrapping_sub(m.file_offset) as i64);
            let build_id = m
                .build_id
                .clone()
                .or_else(|| binary.as_ref().and_then(|b| b.build_id.clone()));
            let name = Path::new(&m.path)
                .file_name()
                .map_or(m.path.clone(), |n| n.to_string_lossy().into_owned());
            let lib = Lib {
                name,
                path: m.path.clone(),
                build_id,
                kind: if pseudo {
                    LibKind::Pseudo
                } else {
                    LibKind::File
                },
                base: 0,
            };
            let lib = self.intern_lib(lib, binary);
            Module {
                lib: Some(lib),
                svma_delta,
            }
        };
        self.spaces.map(
            m.pid,
            Region {
                start: m.start,
                len: m.len,
                file_offset: m.file_offset,
                data: module,
            },
        );
    }

    /// Interns a library; the first time, records the verified file behind it (kept
    /// parallel to the library table for the symbolicator).
    fn intern_lib(&mut self, lib: Lib, binary: Option<Arc<Binary>>) -> LibIndex {
        let index = self.libs.intern(lib, LibIndex::new);
        if index.index() == self.lib_binaries.len() {
            self.lib_binaries.push(binary);
        }
        index
    }

    fn sample(&mut self, time_ns: u64, s: &Sample) {
        let stack = {
            let mut lookup = Lookup {
                builder: self,
                pid: s.pid,
            };
            unwind_frame_pointers(s, &mut lookup)
        };
        self.truncated_stacks += u64::from(stack.truncated);
        self.restored_callers += u64::from(stack.restored_leaf_caller);
        let mut prefix = None;
        if stack.truncated {
            let marker = AddressFrame {
                lib: None,
                address: 0,
                kind: CodeKind::Marker,
            };
            let frame = self.frames.intern(marker, AddressFrameIndex::new);
            prefix = Some(
                self.stacks
                    .intern(RawStack { prefix, frame }, RawStackIndex::new),
            );
        }
        for &addr in stack.user.iter().rev() {
            let frame = self.user_frame(s.pid, addr);
            prefix = Some(
                self.stacks
                    .intern(RawStack { prefix, frame }, RawStackIndex::new),
            );
        }
        for &addr in stack.kernel.iter().rev() {
            let frame = self.kernel_frame(addr);
            prefix = Some(
                self.stacks
                    .intern(RawStack { prefix, frame }, RawStackIndex::new),
            );
        }
        let th = self.thread(s.pid, s.tid, time_ns, None);
        if let Some(stack) = prefix {
            self.threads[th].samples.push((time_ns, stack));
        }
    }

    /// The (library, address in the file's own address space) of an absolute address.
    fn resolve(&self, pid: i32, address: u64) -> Option<(Option<LibIndex>, u64)> {
        let region = self.spaces.lookup(pid, address)?;
        let file_offset = region.file_offset_of(address);
        Some(match region.data {
            Module { lib: None, .. } => (None, address),
            Module { lib, svma_delta } => (
                lib,
                svma_delta.map_or(file_offset, |d| file_offset.wrapping_add(d as u64)),
            ),
        })
    }

    fn user_frame(&mut self, pid: i32, addr: CodeAddress) -> AddressFrameIndex {
        let lookup = addr.lookup_address();
        let (lib, address) = self.resolve(pid, lookup).unwrap_or((None, lookup));
        self.frames.intern(
            AddressFrame {
                lib,
                address,
                kind: CodeKind::User,
            },
            AddressFrameIndex::new,
        )
    }

    fn kernel_frame(&mut self, addr: CodeAddress) -> AddressFrameIndex {
        let lookup = addr.lookup_address();
        let frame = if lookup >= self.kernel_base {
            let kernel = Lib {
                name: KERNEL_LIB_NAME.into(),
                path: KERNEL_LIB_NAME.into(),
                build_id: None,
                kind: LibKind::Kernel,
                base: self.kernel_base,
            };
            let lib = self.intern_lib(kernel, None);
            AddressFrame {
                lib: Some(lib),
                address: lookup - self.kernel_base,
                kind: CodeKind::Kernel,
            }
        } else {
            AddressFrame {
                lib: None,
                address: lookup,
                kind: CodeKind::Kernel,
            }
        };
        self.frames.intern(frame, AddressFrameIndex::new)
    }
}

/// The unwinder's view of one process's code, through the builder's maps.
struct Lookup<'a> {
    builder: &'a mut ProfileBuilder,
    pid: i32,
}

impl CodeLookup for Lookup<'_> {
    fn frame_rule(&mut self, address: u64) -> Option<FrameRule> {
        let (Some(lib), svma) = self.builder.resolve(self.pid, address)? else {
            return None;
        };
        let binary = self.builder.lib_binaries[lib.index()].as_ref()?;
        *self
            .builder
            .frame_rules
            .entry((lib, svma))
            .or_insert_with(|| binary.frame_rule(svma))
    }

    fn is_code(&mut self, address: u64) -> bool {
        self.builder.spaces.lookup(self.pid, address).is_some()
    }
}

/// Anonymous memory (JIT code, `//anon`, `[anon:…]`, `[heap]`, `[stack]`) has no file.
fn is_anonymous(m: &Mapping) -> bool {
    m.path.is_empty()
        || m.path.starts_with("//anon")
        || m.path.starts_with("[anon")
        || m.path == "[heap]"
        || m.path.starts_with("[stack")
}
