//! From a [`Recording`] to a [`RawProfile`]: replay the event log in time order, keeping
//! each process's library map and each thread's name current, unwind every sample, turn
//! its addresses into (library, relative address) frames and intern its stack.

use std::collections::HashMap;
use std::path::Path;

use super::*;
use crate::binary::{BinaryCache, FrameRule};
use crate::maps::AddressSpaces;
use crate::record::{EventKind, Mapping, Recording};
use crate::unwind::{unwind_frame_pointers, CodeAddress};

/// Name of the library that holds kernel frames (perf's name for it).
pub const KERNEL_LIB_NAME: &str = "[kernel.kallsyms]";
/// Name of the marker frame at the root of a stack whose outer frames are missing.
pub const TRUNCATED_MARKER: &str = "[truncated]";
/// Kernel addresses are the upper half of the x86-64 address space.
const KERNEL_SPACE_START: u64 = 0xffff_8000_0000_0000;

struct Builder<'a> {
    start_ns: u64,
    binaries: &'a mut BinaryCache,
    kernel_base: u64,
    spaces: AddressSpaces,
    libs: Interner<Lib, LibIndex>,
    frames: Interner<AddressFrame, AddressFrameIndex>,
    stacks: Interner<RawStack, RawStackIndex>,
    processes: Vec<Process>,
    process_by_pid: HashMap<i32, ProcessIndex>,
    threads: Vec<Thread<RawStackIndex>>,
    thread_by_tid: HashMap<i32, usize>,
    frame_rules: HashMap<(String, u64), Option<FrameRule>>,
    truncated_stacks: u64,
    restored_callers: u64,
}

/// Builds the raw profile. `kernel_base` is the kernel's text start (from kallsyms), to
/// which kernel frame addresses are made relative; 0 when unknown.
pub fn build(recording: &Recording, binaries: &mut BinaryCache, kernel_base: u64) -> RawProfile {
    let mut b = Builder {
        start_ns: recording.start_ns,
        binaries,
        kernel_base,
        spaces: AddressSpaces::default(),
        libs: Interner::default(),
        frames: Interner::default(),
        stacks: Interner::default(),
        processes: Vec::new(),
        process_by_pid: HashMap::new(),
        threads: Vec::new(),
        thread_by_tid: HashMap::new(),
        frame_rules: HashMap::new(),
        truncated_stacks: 0,
        restored_callers: 0,
    };
    let command_name = recording
        .command
        .first()
        .map(|c| {
            Path::new(c)
                .file_name()
                .map_or(c.clone(), |n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    b.thread(
        recording.root_pid,
        recording.root_pid,
        0.0,
        Some(&command_name),
    );
    for event in &recording.events {
        let time_ms = b.ms(event.time_ns);
        match &event.kind {
            EventKind::Mmap(m) if m.executable => b.spaces.map(m.clone()),
            EventKind::Mmap(_) => {}
            EventKind::Comm {
                pid,
                tid,
                name,
                exec,
            } => {
                if *exec {
                    b.spaces.exec(*pid);
                }
                let t = b.thread(*pid, *tid, time_ms, None);
                b.threads[t].name = name.clone();
                if pid == tid {
                    let p = b.threads[t].process;
                    b.processes[p.index()].name = name.clone();
                }
            }
            EventKind::Fork {
                pid,
                ppid,
                tid,
                ptid,
            } => {
                if pid == tid && pid != ppid {
                    b.spaces.fork(*ppid, *pid);
                }
                let parent_name = b
                    .thread_by_tid
                    .get(ptid)
                    .map(|&t| b.threads[t].name.clone());
                b.thread(*pid, *tid, time_ms, parent_name.as_deref());
            }
            EventKind::Exit { pid, tid } => {
                if let Some(&t) = b.thread_by_tid.get(tid) {
                    b.threads[t].end_ms = Some(time_ms);
                }
                if pid == tid {
                    if let Some(&p) = b.process_by_pid.get(pid) {
                        b.processes[p.index()].end_ms = Some(time_ms);
                    }
                }
            }
            EventKind::Sample(s) => {
                let pid = s.pid;
                let stack = {
                    let spaces = &b.spaces;
                    let binaries = &mut *b.binaries;
                    let rules = &mut b.frame_rules;
                    let mut rule = |address: u64| -> Option<FrameRule> {
                        let m = spaces.lookup(pid, address)?;
                        let binary = binaries.get(Path::new(&m.path))?;
                        let svma = binary.file_offset_to_svma(address - m.start + m.file_offset)?;
                        *rules
                            .entry((m.path.clone(), svma))
                            .or_insert_with(|| binary.frame_rule(svma))
                    };
                    unwind_frame_pointers(s, &mut rule)
                };
                if stack.truncated {
                    b.truncated_stacks += 1;
                }
                if stack.restored_leaf_caller {
                    b.restored_callers += 1;
                }
                let mut prefix = None;
                if stack.truncated {
                    let f = b.frames.intern(
                        AddressFrame {
                            lib: None,
                            address: 0,
                            kind: CodeKind::Marker,
                        },
                        AddressFrameIndex::new,
                    );
                    prefix = Some(
                        b.stacks
                            .intern(RawStack { prefix, frame: f }, RawStackIndex::new),
                    );
                }
                for &addr in stack.user.iter().rev() {
                    let frame = b.user_frame(pid, addr);
                    prefix = Some(
                        b.stacks
                            .intern(RawStack { prefix, frame }, RawStackIndex::new),
                    );
                }
                for &addr in stack.kernel.iter().rev() {
                    let frame = b.kernel_frame(addr);
                    prefix = Some(
                        b.stacks
                            .intern(RawStack { prefix, frame }, RawStackIndex::new),
                    );
                }
                let t = b.thread(pid, s.tid, time_ms, None);
                if let Some(stack) = prefix {
                    b.threads[t].samples.push(SampleRow {
                        time_ms,
                        stack,
                        weight: 1,
                    });
                }
            }
            EventKind::Lost { .. } | EventKind::Throttle => {}
        }
    }
    let duration_ms = b.ms(recording.end_ns);
    RawProfile {
        meta: Meta {
            start_unix_ms: recording.start_unix_ms,
            interval_ms: 1000.0 / recording.frequency_hz.max(1) as f64,
            duration_ms,
            event: recording.event.name().to_string(),
            frequency_hz: recording.frequency_hz,
            command: recording.command.clone(),
            lost_samples: recording.lost_samples,
            throttled: recording.throttled,
            kernel_included: recording.kernel_included,
            truncated_stacks: b.truncated_stacks,
            restored_callers: b.restored_callers,
        },
        libs: b.libs.items,
        address_frames: b.frames.items,
        stacks: b.stacks.items,
        processes: b.processes,
        threads: b.threads,
    }
}

impl Builder<'_> {
    fn ms(&self, time_ns: u64) -> f64 {
        time_ns.saturating_sub(self.start_ns) as f64 / 1e6
    }

    /// The thread `tid` of process `pid`, created (with its process) on first sight.
    fn thread(&mut self, pid: i32, tid: i32, time_ms: f64, name: Option<&str>) -> usize {
        if let Some(&t) = self.thread_by_tid.get(&tid) {
            if self.processes[self.threads[t].process.index()].pid == pid {
                return t;
            }
        }
        let process = match self.process_by_pid.get(&pid) {
            Some(&p) => p,
            None => {
                let p = ProcessIndex::new(self.processes.len());
                let process_name = name.map_or_else(|| format!("pid {pid}"), str::to_string);
                self.processes.push(Process {
                    pid,
                    name: process_name,
                    start_ms: time_ms,
                    end_ms: None,
                });
                self.process_by_pid.insert(pid, p);
                p
            }
        };
        let name = name.map_or_else(
            || self.processes[process.index()].name.clone(),
            str::to_string,
        );
        self.threads.push(Thread {
            tid,
            process,
            name,
            is_main: pid == tid,
            start_ms: time_ms,
            end_ms: None,
            samples: Vec::new(),
        });
        self.thread_by_tid.insert(tid, self.threads.len() - 1);
        self.threads.len() - 1
    }

    fn user_frame(&mut self, pid: i32, addr: CodeAddress) -> AddressFrameIndex {
        let lookup = addr.lookup_address();
        let frame = match self.spaces.lookup(pid, lookup).cloned() {
            Some(m) if !is_anonymous(&m) => {
                let (lib, address) = self.lib_address(&m, lookup);
                AddressFrame {
                    lib: Some(lib),
                    address,
                    kind: CodeKind::User,
                }
            }
            _ => AddressFrame {
                lib: None,
                address: lookup,
                kind: CodeKind::User,
            },
        };
        self.frames.intern(frame, AddressFrameIndex::new)
    }

    /// The library of mapping `m` and the lib-relative address of `lookup` in it.
    fn lib_address(&mut self, m: &Mapping, lookup: u64) -> (LibIndex, u64) {
        let file_offset = lookup - m.start + m.file_offset;
        let pseudo = m.path.starts_with('[');
        let binary = if pseudo {
            None
        } else {
            self.binaries.get(Path::new(&m.path))
        };
        let address = binary
            .as_ref()
            .and_then(|b| b.file_offset_to_svma(file_offset))
            .unwrap_or(file_offset);
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
        (self.libs.intern(lib, LibIndex::new), address)
    }

    fn kernel_frame(&mut self, addr: CodeAddress) -> AddressFrameIndex {
        let lookup = addr.lookup_address();
        let frame = if lookup >= KERNEL_SPACE_START {
            let lib = self.libs.intern(
                Lib {
                    name: KERNEL_LIB_NAME.into(),
                    path: KERNEL_LIB_NAME.into(),
                    build_id: None,
                    kind: LibKind::Kernel,
                    base: self.kernel_base,
                },
                LibIndex::new,
            );
            AddressFrame {
                lib: Some(lib),
                address: lookup.wrapping_sub(self.kernel_base),
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

/// Anonymous memory (JIT code, `//anon`, `[anon:…]`, `[heap]`, `[stack]`) has no file.
fn is_anonymous(m: &Mapping) -> bool {
    m.path.is_empty()
        || m.path.starts_with("//anon")
        || m.path.starts_with("[anon")
        || m.path == "[heap]"
        || m.path.starts_with("[stack")
}
