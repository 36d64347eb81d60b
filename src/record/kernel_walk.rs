//! The unwinder in the kernel (`--unwind kernel`; `bpf/unwind.bpf.c`): its eBPF program
//! loaded and attached to the sampling events, the unwind tables of the followed
//! processes' files given to it as their mappings appear, and the samples it walked read
//! back as events.
//!
//! Each executable file mapping of a followed process (from its MMAP2 record, or from
//! /proc when attaching) has its file's `.eh_frame` compiled once into rows
//! ([`crate::unwind::table`]) appended to the program's one table of rows; each process
//! has a sorted list of its mappings and where their rows are. A forked process starts
//! with its parent's list, an `exec` empties it, an exit removes it. The program walks
//! only the processes that have a list, and hands every walk it cannot finish back to
//! the user-space unwinder as an ordinary sample with its stack copy.
//!
//! Rows are never freed while recording: a file's rows serve every process that maps it,
//! and the table's size bounds them (files beyond it are walked in user space).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use libbpf_rs::{MapCore, MapFlags, ObjectBuilder, RingBufferBuilder};

use crate::events::{Event, EventKind, KernelWalk, Mapping, Sample};
use crate::files::locate::{FileFinder, MappedFile};
use crate::profile::VDSO_NAME;
use crate::unwind::table::{compile, ROW_BYTES};

/// The program, compiled from `bpf/unwind.bpf.c` by build.rs.
const OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/unwind.bpf.o"));

/// Rows the kernel's table holds: 2^21 (24 MiB of kernel memory, taken when the program
/// loads). GCC's cc1 needs 478,579, sampler itself 121,116; a recording whose files need
/// more has the rest walked in user space.
const TABLE_ROWS: u32 = 1 << 21;
/// The most processes walked at once: each has a slot of [`MAX_MAPPINGS`] in the
/// program's array of mappings (8 MiB in all); processes beyond are unwound in user
/// space.
const MAX_PROCESSES: u32 = 1024;
/// Mappings with tables per process (the program searches them in 9 steps): a compiler
/// maps some 30 files, a browser some 150.
const MAX_MAPPINGS: usize = 256;
/// Bytes of one mapping (`struct mapping`).
const MAPPING_BYTES: usize = 32;
/// Bytes of a record's header (`struct record` up to `ips`).
const RECORD_HEADER_BYTES: usize = 40;
/// Rows written to the kernel in one call.
const ROWS_PER_BATCH: usize = 1 << 16;
/// The program's `stop` values that end a walk it sends (0-2), and how many there are.
const STOP_REASONS: usize = 10;

/// Why a walk ended, as the program counts them (`enum stop`).
pub const STOP_NAMES: [&str; STOP_REASONS] = [
    "the outermost frame",
    "the frame limit (1024)",
    "a step that did not move up the stack",
    "code without a table or frame pointer (not loaded yet, or JIT code)",
    "an address its file's table has no row for",
    "a rule the walker cannot follow",
    "a return address not at CFA - 8",
    "a CFA from RBP after RBP was lost",
    "stack memory that could not be read",
    "a process without tables",
];

/// A file's rows in the kernel's table.
#[derive(Clone, Copy, Debug)]
struct FileRows {
    first_row: u32,
    rows: u32,
    /// The file address the rows' starts are offsets from.
    base: u64,
}

/// One mapping in a process's list (`struct mapping`).
#[derive(Clone, Copy, Debug)]
struct Entry {
    start: u64,
    end: u64,
    /// Process address minus table offset.
    to_table: u64,
    rows: FileRows,
}

/// See the module's description.
pub(super) struct KernelWalker {
    object: libbpf_rs::Object,
    _links: Vec<libbpf_rs::Link>,
    ring: libbpf_rs::RingBuffer<'static>,
    /// The records the ring's callback parsed, until the session takes them.
    received: Arc<Mutex<Received>>,
    files: FileFinder,
    /// Each file's rows (`None`: it has none, or they do not fit), by its identity.
    rows_of: HashMap<FileKey, Option<FileRows>>,
    next_row: u32,
    processes: HashMap<i32, Vec<Entry>>,
    /// Each walked process's slot in the program's mappings, and the slots free.
    slots: HashMap<i32, u32>,
    free_slots: Vec<u32>,
    /// Why files got no rows, said once each at the end.
    pub(super) refused: Vec<String>,
}

/// Samples the program sent, and their bytes.
#[derive(Default)]
struct Received {
    events: Vec<Event>,
    bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum FileKey {
    File(crate::files::locate::FileId),
    Path(String),
}

impl KernelWalker {
    /// Loads the program (the kernel verifies it) with its maps; `with_kernel`: whether
    /// samples keep their kernel frames. `Err` is one line saying why it cannot run here.
    pub(super) fn load(with_kernel: bool) -> Result<KernelWalker, String> {
        // libbpf's messages (the verifier's log among them) only when asked for.
        match std::env::var_os("SAMPLER_BPF_LOG") {
            Some(_) => {
                let print = |_: libbpf_rs::PrintLevel, line: String| eprint!("libbpf: {line}");
                libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, print)));
            }
            None => {
                libbpf_rs::set_print(None);
            }
        }
        let mut open = ObjectBuilder::default()
            .open_memory(OBJECT)
            .map_err(|e| format!("the eBPF program could not be opened: {e}"))?;
        for mut map in open.maps_mut() {
            let name = map.name().to_string_lossy().into_owned();
            let set = match name.as_str() {
                "rows" => map.set_max_entries(TABLE_ROWS),
                "processes" => map.set_max_entries(MAX_PROCESSES),
                "mappings" => map.set_max_entries(MAX_PROCESSES * MAX_MAPPINGS as u32),
                n if n.ends_with(".rodata") => {
                    if let Some(data) = map.initial_value_mut() {
                        if data.len() >= 4 {
                            data[..4].copy_from_slice(&u32::from(with_kernel).to_ne_bytes());
                        }
                    }
                    Ok(())
                }
                _ => Ok(()),
            };
            set.map_err(|e| format!("the eBPF program's map {name}: {e}"))?;
        }
        let object = open.load().map_err(|e| load_error(&e))?;
        let received = Arc::new(Mutex::new(Received::default()));
        let ring = {
            let samples = object
                .maps()
                .find(|m| m.name() == "samples")
                .ok_or("the eBPF program has no ring buffer")?;
            let mut builder = RingBufferBuilder::new();
            let into = received.clone();
            builder
                .add(&samples, move |data: &[u8]| {
                    let mut into = into.lock().unwrap_or_else(|e| e.into_inner());
                    into.bytes += data.len() as u64;
                    if let Some(event) = parse_record(data) {
                        into.events.push(event);
                    }
                    0
                })
                .map_err(|e| format!("the eBPF ring buffer: {e}"))?;
            builder
                .build()
                .map_err(|e| format!("the eBPF ring buffer: {e}"))?
        };
        Ok(KernelWalker {
            object,
            _links: Vec::new(),
            ring,
            received,
            files: FileFinder::default(),
            rows_of: HashMap::new(),
            next_row: 0,
            processes: HashMap::new(),
            slots: HashMap::new(),
            free_slots: (0..MAX_PROCESSES).rev().collect(),
            refused: Vec::new(),
        })
    }

    /// Attaches the program to the sampling events `fds` (their children, which
    /// inherit them, carry it too).
    pub(super) fn attach(&mut self, fds: &[&OwnedFd]) -> Result<(), String> {
        let program = self
            .object
            .progs_mut()
            .find(|p| p.name() == "walk_stack")
            .ok_or("the eBPF program is missing")?;
        for fd in fds {
            let link = program
                .attach_perf_event(fd.as_raw_fd())
                .map_err(|e| format!("the eBPF program could not be attached: {e}"))?;
            self._links.push(link);
        }
        Ok(())
    }

    /// Walks process `pid` and the processes it starts from now on (its mappings come
    /// as events).
    pub(super) fn follow(&mut self, pid: i32) {
        self.processes.entry(pid).or_default();
    }

    /// Follows what `event` changes of the followed processes' mappings (events in time
    /// order; those of other processes change nothing).
    pub(super) fn on_event(&mut self, event: &Event) {
        match &event.kind {
            EventKind::Mmap(m) if m.executable && self.processes.contains_key(&m.pid) => {
                self.on_mmap(m)
            }
            EventKind::Fork { pid, ppid, tid, .. } if pid == tid && pid != ppid => {
                if let Some(parent) = self.processes.get(ppid).cloned() {
                    self.processes.insert(*pid, parent);
                    self.write_process(*pid);
                }
            }
            EventKind::Comm {
                pid, exec: true, ..
            } if self.processes.contains_key(pid) => {
                self.processes.insert(*pid, Vec::new());
                self.write_process(*pid);
            }
            EventKind::Exit { pid, tid } if pid == tid && self.processes.remove(pid).is_some() => {
                self.write_process(*pid);
            }
            _ => {}
        }
    }

    fn on_mmap(&mut self, m: &Mapping) {
        let end = m.start + m.len;
        let is_file = !m.path.starts_with('[') && !m.path.starts_with("//anon");
        if !is_file && m.path != VDSO_NAME {
            return;
        }
        let key = match (m.file, m.path == VDSO_NAME) {
            (_, true) => FileKey::Path(VDSO_NAME.into()),
            (Some(file), false) => FileKey::File(file),
            (None, false) => FileKey::Path(m.path.clone()),
        };
        let found = match m.path == VDSO_NAME {
            true => self.files.vdso(m.pid, m.start, end),
            false => self.files.mapped(&MappedFile {
                pid: m.pid,
                path: &m.path,
                start: m.start,
                end,
                file: m.file,
            }),
        };
        let Ok((binary, _)) = found else {
            return;
        };
        let file_offset = if m.path == VDSO_NAME {
            0
        } else {
            m.file_offset
        };
        let Some(delta) = binary.code_svma_delta(file_offset, m.len) else {
            return;
        };
        let rows = match self.rows_of.get(&key) {
            Some(known) => *known,
            None => {
                let rows = self.load_rows(&binary);
                self.rows_of.insert(key, rows);
                rows
            }
        };
        let Some(rows) = rows else {
            return;
        };
        let bias = m.start.wrapping_sub(file_offset).wrapping_sub(delta as u64);
        let entry = Entry {
            start: m.start,
            end,
            to_table: bias.wrapping_add(rows.base),
            rows,
        };
        let list = self.processes.entry(m.pid).or_default();
        list.retain(|e| e.end <= m.start || e.start >= end);
        let at = list.partition_point(|e| e.start < m.start);
        list.insert(at, entry);
        list.truncate(MAX_MAPPINGS);
        self.write_process(m.pid);
    }

    /// Compiles `binary`'s table and appends its rows to the kernel's.
    fn load_rows(&mut self, binary: &crate::files::binary::Binary) -> Option<FileRows> {
        let table = match compile(&binary.path, &binary.reader()) {
            Ok(table) => table,
            Err(why) => {
                self.refused.push(why);
                return None;
            }
        };
        let count = u32::try_from(table.rows.len()).ok()?;
        if count == 0 {
            return None;
        }
        if count > TABLE_ROWS - self.next_row {
            self.refused.push(format!(
                "{}: its {count} rows do not fit in the kernel's table ({} of {TABLE_ROWS} used)",
                binary.path.display(),
                self.next_row
            ));
            return None;
        }
        let first_row = self.next_row;
        let map = self.map("rows")?;
        for (chunk_index, chunk) in table.rows.chunks(ROWS_PER_BATCH).enumerate() {
            let from = first_row + (chunk_index * ROWS_PER_BATCH) as u32;
            let keys: Vec<u8> = (0..chunk.len() as u32)
                .flat_map(|i| (from + i).to_ne_bytes())
                .collect();
            let values: Vec<u8> = chunk.iter().flat_map(|r| r.to_bytes()).collect();
            debug_assert_eq!(values.len(), chunk.len() * ROW_BYTES);
            if let Err(e) = map.update_batch(
                &keys,
                &values,
                chunk.len() as u32,
                MapFlags::ANY,
                MapFlags::ANY,
            ) {
                self.refused.push(format!(
                    "{}: its rows could not be given to the kernel: {e}",
                    binary.path.display()
                ));
                return None;
            }
        }
        self.next_row += count;
        Some(FileRows {
            first_row,
            rows: count,
            base: table.base,
        })
    }

    /// Writes process `pid`'s list to the program's maps: its mappings into its slot,
    /// then where they are. A process with none (or no slot free) is not walked.
    fn write_process(&mut self, pid: i32) {
        let key = pid.to_ne_bytes();
        let list = self.processes.get(&pid).filter(|l| !l.is_empty());
        let Some(list) = list else {
            if let Some(slot) = self.slots.remove(&pid) {
                self.free_slots.push(slot);
                if let Some(map) = self.map("processes") {
                    let _ = map.delete(&key);
                }
            }
            return;
        };
        let slot = match self.slots.get(&pid) {
            Some(&slot) => slot,
            None => match self.free_slots.pop() {
                Some(slot) => *self.slots.entry(pid).or_insert(slot),
                None => return,
            },
        };
        let first = slot * MAX_MAPPINGS as u32;
        let mut keys = Vec::with_capacity(list.len() * 4);
        let mut values = Vec::with_capacity(list.len() * MAPPING_BYTES);
        for (i, e) in list.iter().enumerate() {
            keys.extend((first + i as u32).to_ne_bytes());
            values.extend(e.start.to_ne_bytes());
            values.extend(e.end.to_ne_bytes());
            values.extend(e.to_table.to_ne_bytes());
            values.extend(e.rows.first_row.to_ne_bytes());
            values.extend(e.rows.rows.to_ne_bytes());
        }
        let count = list.len() as u32;
        let mut process = first.to_ne_bytes().to_vec();
        process.extend(count.to_ne_bytes());
        if let (Some(mappings), Some(processes)) = (self.map("mappings"), self.map("processes")) {
            let written =
                mappings.update_batch(&keys, &values, count, MapFlags::ANY, MapFlags::ANY);
            if written.is_ok() {
                let _ = processes.update(&key, &process, MapFlags::ANY);
            }
        }
    }

    fn map(&self, name: &str) -> Option<libbpf_rs::Map<'_>> {
        self.object.maps().find(|m| m.name() == name)
    }

    /// The samples the program sent since the last call, and their bytes.
    pub(super) fn take(&mut self) -> (Vec<Event>, u64) {
        let _ = self.ring.consume();
        let mut received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = std::mem::take(&mut received.bytes);
        (std::mem::take(&mut received.events), bytes)
    }

    /// How the program's walks ended so far, by reason ([`STOP_NAMES`]), summed over
    /// the CPUs.
    pub(super) fn stops(&self) -> [u64; STOP_REASONS] {
        let mut out = [0; STOP_REASONS];
        let Some(map) = self.map("stops") else {
            return out;
        };
        for (i, total) in out.iter_mut().enumerate() {
            if let Ok(Some(per_cpu)) = map.lookup_percpu(&(i as u32).to_ne_bytes(), MapFlags::ANY) {
                *total = per_cpu
                    .iter()
                    .filter_map(|v| Some(u64::from_ne_bytes(v.get(..8)?.try_into().ok()?)))
                    .sum();
            }
        }
        out
    }
}

/// Why the program did not load, in one line: the kernel's refusal (no privilege, no
/// BTF, lockdown) as libbpf reports it.
fn load_error(e: &libbpf_rs::Error) -> String {
    let text = e.to_string();
    let hint = match e.kind() {
        libbpf_rs::ErrorKind::PermissionDenied => {
            " (loading eBPF programs needs root, or CAP_BPF and CAP_PERFMON; a kernel in \
             lockdown refuses them to root too)"
        }
        _ if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() => {
            " (this kernel has no BTF: /sys/kernel/btf/vmlinux is missing)"
        }
        _ => "",
    };
    format!("the eBPF program could not be loaded: {text}{hint}")
}

/// The event of one record the program sent (`struct record`); `None` when it is
/// shorter than its header says.
fn parse_record(data: &[u8]) -> Option<Event> {
    let u64_at = |at: usize| Some(u64::from_ne_bytes(data.get(at..at + 8)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_ne_bytes(data.get(at..at + 4)?.try_into().ok()?));
    let u16_at = |at: usize| Some(u16::from_ne_bytes(data.get(at..at + 2)?.try_into().ok()?));
    let time_ns = u64_at(0)?;
    let (pid, tid, cpu) = (u32_at(8)? as i32, u32_at(12)? as i32, u32_at(16)?);
    let (kernel_nr, user_nr) = (usize::from(u16_at(20)?), usize::from(u16_at(22)?));
    let period = u64_at(24)?;
    let walk = match u32_at(32)? {
        0 => KernelWalk::Outermost,
        1 => KernelWalk::FrameLimit,
        2 => KernelWalk::NotUp,
        _ => return None,
    };
    let frame = |i: usize| u64_at(RECORD_HEADER_BYTES + 8 * i);
    let kernel_callchain = (0..kernel_nr).map(frame).collect::<Option<Vec<u64>>>()?;
    let user_callchain = (kernel_nr..kernel_nr + user_nr)
        .map(frame)
        .collect::<Option<Vec<u64>>>()?;
    Some(Event {
        time_ns,
        kind: EventKind::Sample(Sample {
            pid,
            tid,
            cpu,
            kernel_callchain,
            user_callchain,
            callchain_truncated: false,
            user_regs: None,
            stack_copy: Vec::new(),
            period,
            kernel_walk: Some(walk),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_becomes_a_sample_with_its_kernel_and_user_frames() {
        let mut data = Vec::new();
        data.extend(123_456u64.to_ne_bytes());
        data.extend(10u32.to_ne_bytes());
        data.extend(11u32.to_ne_bytes());
        data.extend(1u32.to_ne_bytes());
        data.extend(1u16.to_ne_bytes());
        data.extend(2u16.to_ne_bytes());
        data.extend(1_000_000u64.to_ne_bytes());
        data.extend(0u32.to_ne_bytes());
        data.extend(0u32.to_ne_bytes());
        for frame in [0xffff_ffff_8100_0000u64, 0x40_1000, 0x40_2005] {
            data.extend(frame.to_ne_bytes());
        }
        let event = parse_record(&data).unwrap();
        assert_eq!(event.time_ns, 123_456);
        let EventKind::Sample(s) = event.kind else {
            panic!("not a sample")
        };
        assert_eq!((s.pid, s.tid, s.cpu, s.period), (10, 11, 1, 1_000_000));
        assert_eq!(s.kernel_callchain, [0xffff_ffff_8100_0000]);
        assert_eq!(s.user_callchain, [0x40_1000, 0x40_2005]);
        assert_eq!(s.kernel_walk, Some(KernelWalk::Outermost));
        // A record cut short of the frames its header counts is not a sample.
        assert!(parse_record(&data[..data.len() - 1]).is_none());
    }
}
