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
//! the user-space unwinder as an ordinary sample with its stack copy. The walks it
//! finishes come through the perf rings too, each as the raw data of a sample of a
//! `bpf-output` event that writes into its CPU's ring: in time order with the other
//! records, without a ring or a mapping of its own.
//!
//! A large file's table is compiled, and its rows written into the kernel's table, on a
//! thread of its own (a large library takes a second), so that the recording thread goes
//! on draining the rings meanwhile; until its rows are in the kernel, the file's
//! mappings are listed as compiling, and the program hands back the samples whose walk
//! reaches one.
//!
//! The program also wakes sampler (a record of a second `bpf-output` event per CPU, whose
//! every record wakes the ring's reader) at a sample it could not walk for want of what
//! sampler may have yet to read: a new process, a new mapping, a table being compiled.
//! It does so at most every [`WAKE_GAP_NS`] (the `wake` map, which this module sets),
//! so that the rings are otherwise read at the pace of a recording without the program.
//!
//! With `-a`, every process but sampler is walked: those running at the start from
//! their mappings in /proc, the others from their events; all tables are then compiled
//! on that thread.
//!
//! Rows are never freed while recording: a file's rows serve every process that maps it,
//! and the table's size bounds them (files beyond it are walked in user space).

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, TryLockError};

use anyhow::{bail, Result};
use libbpf_rs::{MapCore, MapFlags, ObjectBuilder};

use super::open::OpenEvents;
use super::options::{KernelUnwind, RecordOptions};
use super::parse::Walks;
use super::sys;

use crate::events::{Event, EventKind, KernelTable, KernelTables, Mapping};
use crate::files::binary::Binary;
use crate::files::locate::{FileFinder, MappedFile};

mod chunks;
mod followed;
mod records;
mod strangers;

use chunks::{Chunks, Layout};
use followed::{Entry, Followed};
use records::output_attr;
pub(super) use records::parse_record;

/// How the kernel names the vdso's mapping.
const VDSO_NAME: &str = "[vdso]";

/// The program, compiled from `bpf/unwind.bpf.c` by build.rs.
const OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/unwind.bpf.o"));

/// The kernel's table of rows: chunks of 2^16 rows (1 MiB of kernel memory each, made
/// as rows are added; the program's `ROW_CHUNK_SHIFT`), at most 64 (`ROW_CHUNKS`): 2^22
/// rows. rustc needs 2,837,120 (its librustc_driver 1,398,087 and libLLVM 1,439,033),
/// GCC's cc1 478,579, sampler itself 121,116; a recording whose files need more has the
/// rest walked in user space, and says which files did not fit.
const ROW_CHUNK_SHIFT: u32 = 16;
const ROW_CHUNKS: usize = 64;
/// The processes' mappings: chunks of 2^12 (16 processes' slots, 128 KiB; the program's
/// `MAPPING_CHUNK_SHIFT`), at most 64 (`MAPPING_CHUNKS`).
const MAPPING_CHUNK_SHIFT: u32 = 12;
const MAPPING_CHUNKS: usize = 64;
/// The most processes walked at once, each with a slot of [`MAX_MAPPINGS`] in the
/// mappings' chunks (1,024); processes beyond are unwound in user space.
const MAX_PROCESSES: u32 = ((MAPPING_CHUNKS << MAPPING_CHUNK_SHIFT) / MAX_MAPPINGS) as u32;
/// Mappings with tables per process (the program searches them in 9 steps): a compiler
/// maps some 30 files, a browser some 150.
pub(super) const MAX_MAPPINGS: usize = 256;
/// Bytes of one mapping (`struct mapping`).
const MAPPING_BYTES: usize = 32;
/// The program's `stop` values that end a walk it sends (0-2), and how many there are.
const STOP_REASONS: usize = 11;
/// A mapping's `first_row` while its file's table is being compiled (the program's
/// `COMPILING`): the program hands back a walk that reaches it.
const COMPILING: u32 = u32::MAX;
/// How long after waking sampler the program may wake it again: 10 ms, so that JIT code,
/// a process not read of yet or a stranger not named yet wake it at most 100 times a
/// second (each wake-up costs some 60 µs of CPU on the machine this was measured on).
const WAKE_GAP_NS: u64 = 10_000_000;
/// The same at the start of a recording, until [`super::session`] settles it: 1 ms, so
/// that the command's first mappings reach the program within a millisecond or two (a
/// 2,000-deep recursion that starts at once lost its first 12 samples to stack copies
/// at 10 ms).
const START_WAKE_GAP_NS: u64 = 1_000_000;
/// Bytes of the `wake` map's value (`struct wake`): the last wake-up's time (at 0), the
/// gap (at 8), sampler's process id (at 16), padding.
const WAKE_BYTES: usize = 24;
/// Files up to this size (4 MiB) have their tables compiled at once on the recording
/// thread, in a few milliseconds (libc, 2 MiB: about 5 ms), so that a new process's
/// first samples are walked; larger ones (cc1, 30 MiB; rustc's libraries, hundreds)
/// on the compiler's thread, which would keep the rings from being drained for up to a
/// second.
const COMPILE_AT_ONCE_BYTES: u64 = 4 << 20;

/// Why a walk ended, as the program counts them (`enum stop`).
pub const STOP_NAMES: [&str; STOP_REASONS] = [
    "the outermost frame",
    "the frame limit (4096)",
    "a step that did not move up the stack",
    "code without a table or frame pointer (not loaded yet, or JIT code)",
    "an address its file's table has no row for",
    "a rule the walker cannot follow",
    "a return address not at CFA - 8",
    "a CFA from RBP after RBP was lost",
    "stack memory that could not be read",
    "a file whose table was still being compiled",
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

/// What is known of a file's rows in the kernel's table.
#[derive(Clone, Copy, Debug)]
enum Rows {
    /// Its table is being compiled.
    Compiling,
    Loaded(FileRows),
    /// It has none, or they did not fit: its mappings are walked by frame pointers.
    Without,
}

/// The thread that compiles files' tables, in the order they are asked for, and gives
/// their rows to the kernel.
struct Compiler {
    jobs: mpsc::Sender<(usize, Arc<Binary>)>,
    done: mpsc::Receiver<(usize, Loaded)>,
}

/// A file's rows once given to the kernel: where they are (`None`: it has none), or why
/// not (one line naming the file).
type Loaded = Result<Option<FileRows>, String>;

impl Compiler {
    fn start(
        tables: Arc<dyn KernelTables>,
        store: Arc<Mutex<RowStore>>,
    ) -> Result<Compiler, String> {
        let (jobs, asked) = mpsc::channel::<(usize, Arc<Binary>)>();
        let (finished, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("sampler-tables".into())
            .spawn(move || {
                for (file, binary) in asked {
                    let loaded = tables.table(&binary).and_then(|table| {
                        let mut store = store.lock().unwrap_or_else(|e| e.into_inner());
                        store.load(&binary.path, table)
                    });
                    if finished.send((file, loaded)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| format!("the thread that compiles unwind tables: {e}"))?;
        Ok(Compiler { jobs, done })
    }
}

/// The kernel's table of rows, and how much of it is taken. Written by the compiler's
/// thread: a large library's rows (libLLVM: 1.4 million) took 220 ms to write while
/// rustc kept both CPUs busy, a stall of the rings' draining that lost samples when
/// the recording thread did it; small files' rows are written by the recording thread
/// when the store is free (else they wait for the compiler's thread too).
struct RowStore {
    chunks: Chunks,
    next_row: u32,
}

impl RowStore {
    /// Appends the rows of `table` (of the file at `path`) to the kernel's: where they
    /// are, `None` for a table without rows, `Err` when they do not fit or cannot be
    /// given.
    fn load(&mut self, path: &std::path::Path, mut table: KernelTable) -> Loaded {
        let Ok(count) = u32::try_from(table.count) else {
            return Ok(None);
        };
        if count == 0 {
            return Ok(None);
        }
        let capacity = self.chunks.capacity();
        if u64::from(count) > capacity - u64::from(self.next_row) {
            return Err(format!(
                "{}: its {count} rows do not fit in the kernel's table ({} of {capacity} used)",
                path.display(),
                self.next_row
            ));
        }
        let first_row = self.next_row;
        let mut written = 0u32;
        let chunks = &mut self.chunks;
        let given = table.rows.blocks(&mut |block| {
            let rows = (block.len() / KernelTable::ROW_BYTES) as u32;
            if rows > count - written {
                return Err("more rows than its table has".into());
            }
            chunks.write(first_row + written, block)?;
            written += rows;
            Ok(())
        });
        // Rows written before a failure are overwritten by the next file's.
        given
            .and_then(|()| match written == count {
                true => Ok(()),
                false => Err(format!("{written} rows of {count}")),
            })
            .map_err(|e| {
                format!(
                    "{}: its rows could not be given to the kernel: {e}",
                    path.display()
                )
            })?;
        self.next_row += count;
        Ok(Some(FileRows {
            first_row,
            rows: count,
            base: table.base,
        }))
    }
}

/// See the module's description.
pub(super) struct KernelWalker {
    object: libbpf_rs::Object,
    _links: Vec<libbpf_rs::Link>,
    /// The `bpf-output` event of each CPU with a ring, writing into that ring.
    outputs: Vec<OwnedFd>,
    output_ids: HashSet<u64>,
    /// The `bpf-output` event of each CPU with a ring whose records wake sampler.
    wakers: Vec<OwnedFd>,
    waker_ids: HashSet<u64>,
    /// Whether the program may wake sampler only every [`WAKE_GAP_NS`] (else every
    /// [`START_WAKE_GAP_NS`]).
    settled: bool,
    files: FileFinder,
    tables: Arc<dyn KernelTables>,
    compiler: Compiler,
    /// Each mapped file's index in `rows`, by its identity.
    file_index: HashMap<FileKey, usize>,
    /// What is known of each file's rows.
    rows: Vec<Rows>,
    /// The kernel's table of rows, shared with the compiler's thread.
    store: Arc<Mutex<RowStore>>,
    /// The processes' mappings.
    mappings: Chunks,
    followed: Followed,
    /// The processes whose samples the program drops (see the `strangers` module).
    strangers: strangers::Strangers,
    /// Files up to this size have their tables compiled on the recording thread.
    compile_at_once_bytes: u64,
    /// Why files got no rows, said once each at the end.
    pub(super) refused: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum FileKey {
    File(crate::files::locate::FileId),
    Path(String),
}

impl KernelWalker {
    /// Loads the program (the kernel verifies it) with its maps; `with_kernel`: whether
    /// samples keep their kernel frames. `Err` is one line saying why it cannot run here.
    pub(super) fn load(
        with_kernel: bool,
        tables: Arc<dyn KernelTables>,
    ) -> Result<KernelWalker, String> {
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
                "processes" => map.set_max_entries(MAX_PROCESSES),
                // A record per CPU, indexed by CPU number.
                "scratch" => {
                    libbpf_rs::num_possible_cpus().and_then(|n| map.set_max_entries(n as u32))
                }
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
        // With SAMPLER_BPF_STATS too, the verifier's statistics (its time, the
        // instructions and states it went through), the measure of the program's load.
        if std::env::var_os("SAMPLER_BPF_STATS").is_some() {
            for mut prog in open.progs_mut() {
                prog.set_log_level(4);
            }
        }
        let object = open.load().map_err(|e| load_error(&e))?;
        let rows = Chunks::new(
            &object,
            Layout {
                name: "rows",
                shift: ROW_CHUNK_SHIFT,
                most: ROW_CHUNKS,
                value_size: KernelTable::ROW_BYTES,
                mapped: true,
            },
        )?;
        let store = Arc::new(Mutex::new(RowStore {
            chunks: rows,
            next_row: 0,
        }));
        let mappings = Chunks::new(
            &object,
            Layout {
                name: "mappings",
                shift: MAPPING_CHUNK_SHIFT,
                most: MAPPING_CHUNKS,
                value_size: MAPPING_BYTES,
                mapped: false,
            },
        )?;
        Ok(KernelWalker {
            object,
            _links: Vec::new(),
            outputs: Vec::new(),
            output_ids: HashSet::new(),
            wakers: Vec::new(),
            waker_ids: HashSet::new(),
            settled: false,
            files: FileFinder::default(),
            compiler: Compiler::start(tables.clone(), store.clone())?,
            tables,
            file_index: HashMap::new(),
            rows: Vec::new(),
            store,
            mappings,
            followed: Followed::new(MAX_PROCESSES),
            strangers: strangers::Strangers::default(),
            compile_at_once_bytes: COMPILE_AT_ONCE_BYTES,
            refused: Vec::new(),
        })
    }

    /// Attaches the program to the sampling events (their children, which inherit
    /// them, carry it too), and gives it two `bpf-output` events on each CPU that write
    /// into that CPU's ring: one for its walks, one for its wake-ups.
    pub(super) fn attach(&mut self, events: &OpenEvents) -> Result<(), String> {
        let mut given = HashSet::new();
        for (&owner, &cpu) in events.ring_owners.iter().zip(&events.ring_cpus) {
            if !given.insert(cpu) {
                continue;
            }
            for (map, wakes) in [("walks", false), ("wakes", true)] {
                let output = sys::perf_event_open(&output_attr(wakes), -1, cpu)
                    .and_then(|fd| sys::set_output(&fd, &events.fds[owner]).map(|()| fd))
                    .and_then(|fd| sys::event_id(&fd).map(|id| (fd, id)))
                    .map_err(|e| format!("the eBPF program's {map} event on CPU {cpu}: {e}"))?;
                self.map(map)
                    .ok_or_else(|| format!("the eBPF program has no map {map}"))?
                    .update(
                        &(cpu as u32).to_ne_bytes(),
                        &output.0.as_raw_fd().to_ne_bytes(),
                        MapFlags::ANY,
                    )
                    .map_err(|e| format!("the eBPF program's {map} event on CPU {cpu}: {e}"))?;
                let (fds, ids) = match wakes {
                    false => (&mut self.outputs, &mut self.output_ids),
                    true => (&mut self.wakers, &mut self.waker_ids),
                };
                ids.insert(output.1);
                fds.push(output.0);
            }
        }
        self.set_wake_gap(START_WAKE_GAP_NS)?;
        let program = self
            .object
            .progs_mut()
            .find(|p| p.name() == "walk_stack")
            .ok_or("the eBPF program is missing")?;
        for fd in &events.fds[..events.sampling_fds] {
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
        self.followed.follow(pid);
    }

    /// Walks every process but `except` (sampler itself), from the events that describe
    /// them (at the start, from /proc), all tables compiled on the compiler's thread: the
    /// files of a whole machine's processes, read at once, would keep the rings from
    /// being drained.
    pub(super) fn follow_all_but(&mut self, except: i32) {
        self.followed.follow_all_but(except);
        self.compile_at_once_bytes = 0;
    }

    /// Follows what `event` changes of the followed processes' mappings (events in time
    /// order; those of other processes change nothing).
    pub(super) fn on_event(&mut self, event: &Event) {
        let changed = match &event.kind {
            EventKind::Mmap(m) if m.executable && self.followed.is_followed(m.pid) => {
                self.on_mmap(m).then_some(m.pid)
            }
            EventKind::Fork { pid, ppid, tid, .. } if pid == tid && pid != ppid => {
                self.followed.fork(*pid, *ppid).then_some(*pid)
            }
            EventKind::Comm {
                pid, exec: true, ..
            } => self.followed.exec(*pid).then_some(*pid),
            EventKind::Exit { pid, tid } if pid == tid => self.followed.exit(*pid).then_some(*pid),
            _ => None,
        };
        if let Some(pid) = changed {
            self.write_process(pid);
        }
    }

    /// Puts the mapping `m` of a followed process in its list, with its file's rows, in
    /// place of what it overlaps (a mapping without rows, or anonymous memory, only
    /// takes the place of what was there); whether the list changed.
    fn on_mmap(&mut self, m: &Mapping) -> bool {
        match self.entry_of(m) {
            Some(entry) => self.followed.map(m.pid, entry),
            None => self.followed.unmap(m.pid, m.start..m.start + m.len),
        }
    }

    /// The list entry of mapping `m`: its file (whose table is compiled the first time
    /// it is mapped) and where it lies in the process; `None` for a mapping without
    /// rows.
    fn entry_of(&mut self, m: &Mapping) -> Option<Entry> {
        let end = m.start + m.len;
        let vdso = m.path == VDSO_NAME;
        let is_file = !m.path.starts_with('[') && !m.path.starts_with("//anon");
        if !is_file && !vdso {
            return None;
        }
        let key = match (m.file, vdso) {
            (_, true) => FileKey::Path(VDSO_NAME.into()),
            (Some(file), false) => FileKey::File(file),
            (None, false) => FileKey::Path(m.path.clone()),
        };
        let found = match vdso {
            true => self.files.vdso(m.pid, m.start, end),
            false => self.files.mapped(&MappedFile {
                pid: m.pid,
                path: &m.path,
                start: m.start,
                end,
                file: m.file,
            }),
        };
        let (binary, _) = found.ok()?;
        let file_offset = if vdso { 0 } else { m.file_offset };
        let delta = binary.code_svma_delta(file_offset, m.len)?;
        let file = match self.file_index.get(&key) {
            Some(&file) => file,
            None => {
                let file = self.rows.len();
                let small = binary
                    .size()
                    .is_ok_and(|size| size <= self.compile_at_once_bytes);
                // On this thread only when the store is free.
                let free = match small.then(|| self.store.try_lock()) {
                    None | Some(Err(TryLockError::WouldBlock)) => None,
                    Some(Ok(store)) => Some(store),
                    Some(Err(TryLockError::Poisoned(e))) => Some(e.into_inner()),
                };
                let loaded = free.map(|mut store| {
                    self.tables
                        .table(&binary)
                        .and_then(|table| store.load(&binary.path, table))
                });
                let rows = match loaded {
                    Some(loaded) => self.rows_of(loaded),
                    None => match self.compiler.jobs.send((file, binary.clone())) {
                        Ok(()) => Rows::Compiling,
                        Err(_) => Rows::Without,
                    },
                };
                self.rows.push(rows);
                self.file_index.insert(key, file);
                file
            }
        };
        if let Rows::Without = self.rows[file] {
            return None;
        }
        Some(Entry {
            start: m.start,
            end,
            bias: m.start.wrapping_sub(file_offset).wrapping_sub(delta as u64),
            file,
        })
    }

    /// Takes the tables compiled since the last call: their rows go to the kernel, and
    /// the processes that map their files are listed again.
    pub(super) fn collect(&mut self) {
        while let Ok((file, loaded)) = self.compiler.done.try_recv() {
            self.rows[file] = self.rows_of(loaded);
            for pid in self.followed.mapping(file) {
                self.write_process(pid);
            }
        }
    }

    /// What is known of a file's rows once they are loaded: none (said at the end)
    /// when its table could not be compiled or given.
    fn rows_of(&mut self, loaded: Loaded) -> Rows {
        match loaded {
            Ok(Some(rows)) => Rows::Loaded(rows),
            Ok(None) => Rows::Without,
            Err(why) => {
                self.refused.push(why);
                Rows::Without
            }
        }
    }

    /// Writes process `pid`'s list to the program's maps: its mappings into its slot,
    /// then where they are. A process with none (or no slot free) is not walked.
    fn write_process(&mut self, pid: i32) {
        let key = pid.to_ne_bytes();
        let Some((slot, list)) = self.followed.slot_and_list(pid) else {
            if let Some(map) = self.map("processes") {
                let _ = map.delete(&key);
            }
            return;
        };
        let first = slot * MAX_MAPPINGS as u32;
        let mut values = Vec::with_capacity(list.len() * MAPPING_BYTES);
        for e in list {
            let (to_table, first_row, rows) = match self.rows[e.file] {
                Rows::Loaded(r) => (e.bias.wrapping_add(r.base), r.first_row, r.rows),
                Rows::Compiling => (0, COMPILING, 0),
                Rows::Without => (0, 0, 0),
            };
            values.extend(e.start.to_ne_bytes());
            values.extend(e.end.to_ne_bytes());
            values.extend(to_table.to_ne_bytes());
            values.extend(first_row.to_ne_bytes());
            values.extend(rows.to_ne_bytes());
        }
        let count = list.len() as u32;
        let mut process = first.to_ne_bytes().to_vec();
        process.extend(count.to_ne_bytes());
        if self.mappings.write(first, &values).is_ok() {
            if let Some(processes) = self.map("processes") {
                let _ = processes.update(&key, &process, MapFlags::ANY);
            }
        }
    }

    /// Lets the program wake sampler only every [`WAKE_GAP_NS`] from now on, once the
    /// recording's start is over.
    pub(super) fn settle(&mut self) {
        // Failing, the program goes on waking sampler at the start's pace, and this is
        // tried again at the next drain.
        if !self.settled {
            self.settled = self.set_wake_gap(WAKE_GAP_NS).is_ok();
        }
    }

    /// Tells the program how long after waking sampler it may wake it again (and which
    /// process is sampler's); the last wake-up is forgotten.
    fn set_wake_gap(&self, gap_ns: u64) -> Result<(), String> {
        let mut value = [0u8; WAKE_BYTES];
        value[8..16].copy_from_slice(&gap_ns.to_ne_bytes());
        value[16..20].copy_from_slice(&std::process::id().to_ne_bytes());
        self.map("wake")
            .ok_or("the eBPF program has no map wake")?
            .update(&0u32.to_ne_bytes(), &value, MapFlags::ANY)
            .map_err(|e| format!("the eBPF program's map wake: {e}"))
    }

    fn map(&self, name: &str) -> Option<libbpf_rs::Map<'_>> {
        self.object.maps().find(|m| m.name() == name)
    }

    /// How the parser knows the walked samples and the wake-ups in the rings.
    pub(super) fn walks(&self) -> Walks {
        Walks {
            attr: output_attr(false),
            ids: self.output_ids.clone(),
            wake_ids: self.waker_ids.clone(),
        }
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

/// The unwinder in the kernel, loaded when the options ask for it and it can walk this
/// target: an error when `--unwind kernel` requires it and it cannot; else, with what to
/// say of it once the recording has started (not before: a recording that fails to
/// start says only why).
pub(super) fn kernel_walker(
    opts: &RecordOptions,
) -> Result<(Option<KernelWalker>, Option<String>)> {
    let not_here = opts.off_cpu.map(|_| "it does not record off-CPU time yet");
    let loaded = match (opts.kernel_unwind, not_here) {
        (KernelUnwind::Off, _) => return Ok((None, None)),
        // By default it is used where it can be, without a word where it cannot be.
        (KernelUnwind::Prefer, Some(_)) => return Ok((None, None)),
        (KernelUnwind::Require, Some(why)) => Err(why.to_string()),
        (_, None) => KernelWalker::load(true, opts.kernel_tables.clone()),
    };
    match loaded {
        Ok(walker) => Ok((
            Some(walker),
            Some("user stacks are walked in the kernel (eBPF), with stack copies where it cannot finish".into()),
        )),
        Err(why) if opts.kernel_unwind == KernelUnwind::Require => {
            bail!("--unwind kernel: {why}")
        }
        Err(why) => Ok((
            None,
            Some(format!("user stacks are unwound from stack copies (hybrid): the kernel walker cannot run here: {why}")),
        )),
    }
}

/// Says how the kernel's walks ended: how many it sent, and why the others came back as
/// stack copies.
pub(super) fn say_kernel_walks(walker: &KernelWalker) {
    let stops = walker.stops();
    // 0: the outermost frame, 2: a loop (both sent); 10: a process without tables (not
    // walked at all).
    let walked: u64 = stops[..STOP_NAMES.len() - 1].iter().sum();
    let sent = stops[0] + stops[2];
    let handed_back: Vec<String> = (0..STOP_NAMES.len() - 1)
        .filter(|&i| i != 0 && i != 2 && stops[i] > 0)
        .map(|i| format!("{}: {}", STOP_NAMES[i], stops[i]))
        .collect();
    say!(
        "sampler: the kernel walked {walked} user stacks: {} to the outermost frame, {} ending in a loop{}",
        stops[0],
        stops[2],
        match handed_back.is_empty() {
            true => String::new(),
            false => format!(
                "; {} unwound from stack copies instead, the walk having met {}",
                walked - sent,
                handed_back.join("; ")
            ),
        }
    );
    for why in &walker.refused {
        say!("sampler: no kernel unwind table for {why}");
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
