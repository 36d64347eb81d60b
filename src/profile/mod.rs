//! The profile data model: prefix tables as the Firefox Profiler defines them (docs/design.md §2).
//!
//! Two stages share these types:
//! - [`RawProfile`] (built by [`crate::replay`] from a recording): each unique stack is interned
//!   as (prefix, [`AddressFrame`]), an address in a library, before any names are known.
//! - [`Profile`] (made by the symbolicator): frames carry funcs, lines and inline depths;
//!   one address may have become several frames, one per inline level.
//!
//! Invariants, for both stages: every index is in range; a stack's prefix comes before it
//! in the stack table, so one pass from last to first can accumulate times.

pub mod cpu;

/// Name of the library that holds kernel frames (perf's name for it).
pub const KERNEL_LIB_NAME: &str = "[kernel.kallsyms]";
/// Name of the marker frame at the root of a stack whose outer frames are missing.
pub const TRUNCATED_MARKER: &str = "[truncated]";
/// Name of the marker frame of off-CPU time whose stack is unknown: a thread blocked
/// since before `-p` attached, or whose switch-out sample was lost.
pub const UNKNOWN_OFF_CPU_MARKER: &str = "[off-CPU, stack unknown]";

/// The `address` of a raw marker frame ([`CodeKind::Marker`]) says which marker it is.
pub const TRUNCATED_MARKER_ADDRESS: u64 = 0;
pub const UNKNOWN_OFF_CPU_MARKER_ADDRESS: u64 = 1;

/// The name of the marker frame at `address` (see [`TRUNCATED_MARKER_ADDRESS`]).
pub fn marker_name(address: u64) -> &'static str {
    match address {
        UNKNOWN_OFF_CPU_MARKER_ADDRESS => UNKNOWN_OFF_CPU_MARKER,
        _ => TRUNCATED_MARKER,
    }
}
/// The pseudo-path of the kernel's vdso mapping, and the name of its library.
pub const VDSO_NAME: &str = "[vdso]";

/// Why a thread was off the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OffCpuKind {
    /// It waited for something (it went to sleep).
    Blocked,
    /// The scheduler took the CPU from it while it could still run.
    Preempted,
}

impl OffCpuKind {
    /// Every kind, in the order of [`OffCpuKind::index`].
    pub const ALL: [OffCpuKind; 2] = [OffCpuKind::Blocked, OffCpuKind::Preempted];

    /// Its place in [`OffCpuKind::ALL`] (and in per-kind arrays, and the Firefox
    /// profile's Off-CPU subcategories).
    pub fn index(self) -> usize {
        match self {
            OffCpuKind::Blocked => 0,
            OffCpuKind::Preempted => 1,
        }
    }
}

macro_rules! index_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);

        impl $name {
            pub fn new(i: usize) -> Self {
                Self(u32::try_from(i).expect("table larger than u32"))
            }
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
    };
}
pub(crate) use index_type;

index_type!(
    /// Index into [`Profile::libs`] / [`RawProfile::libs`].
    LibIndex
);
index_type!(
    /// Index into [`RawProfile::address_frames`].
    AddressFrameIndex
);
index_type!(
    /// Index into [`RawProfile::stacks`].
    RawStackIndex
);
index_type!(
    /// Index into [`Profile::funcs`].
    FuncIndex
);
index_type!(
    /// Index into [`Profile::frames`].
    FrameIndex
);
index_type!(
    /// Index into [`Profile::stacks`].
    StackIndex
);
index_type!(
    /// Index into [`Profile::native_symbols`].
    NativeSymbolIndex
);
index_type!(
    /// Index into the `processes` of a profile.
    ProcessIndex
);

/// What kind of code a frame is in; becomes the frame's category in viewers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CodeKind {
    User,
    Kernel,
    /// A marker frame that sampler inserted (for example `[truncated]`).
    Marker,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LibKind {
    /// An ELF file mapped into a process (executable, shared library).
    File,
    /// The kernel image with its modules; addresses are relative to `Lib::base`.
    Kernel,
    /// Memory with a pseudo-name and no file, like `[vsyscall]`.
    Pseudo,
    /// A process's anonymous executable memory (JIT code), named by the process's
    /// `/tmp/perf-PID.map`; addresses are absolute.
    PerfMap,
}

/// A library: a file that code was sampled in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Lib {
    pub name: String,
    pub path: String,
    pub build_id: Option<Vec<u8>>,
    pub kind: LibKind,
    /// What a lib-relative address is relative to, in the lib's own address space: 0 for
    /// ELF files (relative addresses are the file's virtual addresses), the kernel's text
    /// start for the kernel.
    pub base: u64,
}

/// A raw frame: an address in a library. For a return address, `address` is already the
/// return address minus one (see [`crate::unwind::CodeAddress::lookup_address`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressFrame {
    /// `None` for code outside any known file (JIT, anonymous memory) and for markers.
    pub lib: Option<LibIndex>,
    /// Lib-relative when `lib` is set, else the absolute address (0 for markers).
    pub address: u64,
    pub kind: CodeKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawStack {
    pub prefix: Option<RawStackIndex>,
    pub frame: AddressFrameIndex,
}

/// What one sample row stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleWeight {
    /// Running: this many samples of the sampling event at the stack (each one sampling
    /// interval of CPU time for cpu-clock, about that for cycles); when the period
    /// varied (`Meta::period` is `None`), this many events instead (the sum of the
    /// samples' periods).
    OnCpu(u64),
    /// Off the CPU for `ns` nanoseconds from the row's time, having left it at the
    /// row's stack (`--off-cpu`).
    OffCpu { kind: OffCpuKind, ns: u64 },
}

impl SampleWeight {
    pub fn off_cpu_kind(self) -> Option<OffCpuKind> {
        match self {
            SampleWeight::OnCpu(_) => None,
            SampleWeight::OffCpu { kind, .. } => Some(kind),
        }
    }
}

/// The off-CPU nanoseconds of `rows`, by kind (at [`OffCpuKind::index`]).
pub fn off_cpu_ns<'a, S: 'a>(rows: impl IntoIterator<Item = &'a SampleRow<S>>) -> [u64; 2] {
    let mut ns = [0; 2];
    for row in rows {
        if let SampleWeight::OffCpu { kind, ns: n } = row.weight {
            ns[kind.index()] += n;
        }
    }
    ns
}

/// Which time call trees and exports weigh samples by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeView {
    /// On-CPU samples only, counted (what a profile without off-CPU time has).
    Cpu,
    /// Off-CPU time only, in nanoseconds.
    OffCpu,
    /// Both: on-CPU samples as their sampling interval and off-CPU time, in
    /// nanoseconds (wall-clock time of each thread).
    Wall,
}

/// What a [`TimeView`]'s weights count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightUnit {
    Samples,
    Nanoseconds,
}

impl TimeView {
    /// The view a profile is shown in unless another is asked for: wall-clock time when
    /// it has off-CPU time, else on-CPU samples.
    pub fn default_for(meta: &Meta) -> TimeView {
        match meta.off_cpu {
            true => TimeView::Wall,
            false => TimeView::Cpu,
        }
    }

    pub fn unit(self) -> WeightUnit {
        match self {
            TimeView::Cpu => WeightUnit::Samples,
            TimeView::OffCpu | TimeView::Wall => WeightUnit::Nanoseconds,
        }
    }

    /// What `w` weighs in this view; `interval_ns` is the sampling interval.
    pub fn weight(self, w: SampleWeight, interval_ns: u64) -> u64 {
        match (self, w) {
            (TimeView::Cpu, SampleWeight::OnCpu(n)) => n,
            (TimeView::Wall, SampleWeight::OnCpu(n)) => n * interval_ns,
            (TimeView::OffCpu | TimeView::Wall, SampleWeight::OffCpu { ns, .. }) => ns,
            (TimeView::OffCpu, SampleWeight::OnCpu(_))
            | (TimeView::Cpu, SampleWeight::OffCpu { .. }) => 0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TimeView::Cpu => "on-CPU samples",
            TimeView::OffCpu => "off-CPU time",
            TimeView::Wall => "wall-clock time (on-CPU and off-CPU)",
        }
    }
}

impl Meta {
    /// The sampling interval in nanoseconds (what an on-CPU sample stands for in time).
    pub fn interval_ns(&self) -> u64 {
        (self.interval_ms * 1e6).round() as u64
    }

    /// How the event was sampled: "1000 Hz", or "every 100" (a fixed period, `-c`).
    pub fn rate_text(&self) -> String {
        match self.frequency_hz {
            0 => format!("every {}", self.period.unwrap_or(1)),
            hz => format!("{hz} Hz"),
        }
    }

    /// What on-CPU weights count: "samples", or the event when they are its counts.
    pub fn on_cpu_unit(&self) -> &str {
        match self.period {
            Some(_) => "samples",
            None => &self.event,
        }
    }
}

/// One sample of a thread. `S` is the stack index type of the profile stage. A thread's
/// rows are in time order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleRow<S> {
    /// Milliseconds since the start of the profile (for off-CPU time: when it began).
    pub time_ms: f64,
    pub stack: S,
    pub weight: SampleWeight,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Thread<S> {
    pub tid: i32,
    pub process: ProcessIndex,
    pub name: String,
    pub is_main: bool,
    pub start_ms: f64,
    pub end_ms: Option<f64>,
    pub samples: Vec<SampleRow<S>>,
    /// Samples of this thread the kernel dropped (full ring buffer).
    pub lost_samples: u64,
}

impl<S> Thread<S> {
    /// The same thread with each sample's stack index translated by `f`.
    pub fn map_stacks<T>(self, f: impl Fn(S) -> T) -> Thread<T> {
        Thread {
            tid: self.tid,
            process: self.process,
            name: self.name,
            is_main: self.is_main,
            start_ms: self.start_ms,
            end_ms: self.end_ms,
            lost_samples: self.lost_samples,
            samples: self
                .samples
                .into_iter()
                .map(|s| SampleRow {
                    time_ms: s.time_ms,
                    stack: f(s.stack),
                    weight: s.weight,
                })
                .collect(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Process {
    pub pid: i32,
    pub name: String,
    pub start_ms: f64,
    pub end_ms: Option<f64>,
}

/// Facts about the recording that travel with the profile.
#[derive(Clone, Debug, PartialEq)]
pub struct Meta {
    pub start_unix_ms: f64,
    /// Sampling interval in milliseconds (1000 / frequency).
    pub interval_ms: f64,
    pub duration_ms: f64,
    /// The sampling event, as perf names it ("cycles", "cpu-clock", "page-faults", ...).
    pub event: String,
    /// Whether the event counts time (cpu-clock, task-clock): a sample's period is then
    /// nanoseconds of CPU, not a count of events.
    pub time_event: bool,
    /// Samples per second asked for (0: a fixed period of a counting event, `-c`).
    pub frequency_hz: u64,
    /// The events each sample stands for (ns for cpu-clock), when fixed; `None` when the
    /// kernel varied it, and on-CPU weights are then event counts (see
    /// [`SampleWeight::OnCpu`]).
    pub period: Option<u64>,
    pub command: Vec<String>,
    pub lost_samples: u64,
    pub throttled: u64,
    pub kernel_included: bool,
    /// Samples whose stack was cut short (they end in a `[truncated]` frame).
    pub truncated_stacks: u64,
    /// Samples in which a caller skipped by the frame-pointer chain was restored.
    pub restored_callers: u64,
    /// CPUs of the machine that recorded it.
    pub logical_cpus: u32,
    /// Whether off-CPU time was recorded (`--off-cpu`): threads have off-CPU rows.
    pub off_cpu: bool,
}

/// The profile before symbolication.
#[derive(Clone, Debug)]
pub struct RawProfile {
    pub meta: Meta,
    pub libs: Vec<Lib>,
    pub address_frames: Vec<AddressFrame>,
    pub stacks: Vec<RawStack>,
    pub processes: Vec<Process>,
    pub threads: Vec<Thread<RawStackIndex>>,
}

/// A function: what call trees group frames by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Func {
    pub name: String,
    pub file: Option<String>,
    pub lib: Option<LibIndex>,
}

/// The machine-code symbol that covers a frame's address (the outer function of an
/// inline stack).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NativeSymbol {
    pub lib: LibIndex,
    /// Lib-relative start address.
    pub address: u64,
    pub size: Option<u64>,
    pub name: String,
}

/// A symbolicated frame. Frames of one address share `lib`, `address` and
/// `native_symbol` and differ in `inline_depth` (0 = the outer, real function).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub func: FuncIndex,
    pub lib: Option<LibIndex>,
    pub address: Option<u64>,
    pub inline_depth: u32,
    pub native_symbol: Option<NativeSymbolIndex>,
    pub line: Option<u32>,
    pub kind: CodeKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stack {
    pub prefix: Option<StackIndex>,
    pub frame: FrameIndex,
}

/// The symbolicated profile that every output is made from.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub meta: Meta,
    pub libs: Vec<Lib>,
    pub funcs: Vec<Func>,
    pub native_symbols: Vec<NativeSymbol>,
    pub frames: Vec<Frame>,
    pub stacks: Vec<Stack>,
    pub processes: Vec<Process>,
    pub threads: Vec<Thread<StackIndex>>,
    /// Sampled libraries whose names or debug information are incomplete, and why.
    pub symbol_gaps: Vec<SymbolGap>,
    /// The text of source files its functions name ([`Func::file`] to text), when they
    /// were embedded (see [`Profile::source_files_by_samples`]); empty otherwise.
    pub sources: std::collections::BTreeMap<String, String>,
}

/// What a sampled library lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    /// Some of its frames found no symbol: they are named after the start of their
    /// function (`fn_0x…`) where `.eh_frame` knows it, else after their address (`0x…`).
    Symbols,
    /// Its frames are named, but have no file/line and no inline frames.
    DebugInfo,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolGap {
    pub lib: LibIndex,
    pub missing: Missing,
    pub why: String,
}

/// Interns values into a table, giving each distinct value one index. The hash table
/// holds only each value's position in `items` (4 bytes), and values are compared and
/// rehashed there: the profile's frame and stack tables are its largest, and a map from
/// value to index held every value twice. It hashes with foldhash (seeded per table, so
/// a recorded program cannot aim at collisions): every frame of every sample is
/// interned, some millions of lookups for deep stacks, where std's SipHash was the
/// largest cost of recording.
#[derive(Clone, Debug)]
pub struct Interner<T, I> {
    pub items: Vec<T>,
    positions: hashbrown::HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    index: std::marker::PhantomData<I>,
}

impl<T, I> Default for Interner<T, I> {
    fn default() -> Self {
        Interner {
            items: Vec::new(),
            positions: hashbrown::HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            index: std::marker::PhantomData,
        }
    }
}

impl<T: Eq + std::hash::Hash, I> Interner<T, I> {
    /// The index of `item`, added when it is new; `make_index` makes the typed index of
    /// a position (and refuses one past `u32`).
    pub fn intern(&mut self, item: T, make_index: impl Fn(usize) -> I) -> I {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one(&item);
        let items = &self.items;
        if let Some(&at) = self.positions.find(hash, |&at| items[at as usize] == item) {
            return make_index(at as usize);
        }
        let at = self.items.len();
        let index = make_index(at);
        self.items.push(item);
        let (items, hasher) = (&self.items, &self.hasher);
        self.positions
            .insert_unique(hash, at as u32, |&at| hasher.hash_one(&items[at as usize]));
        index
    }
}

impl Profile {
    pub fn func_name(&self, func: FuncIndex) -> &str {
        &self.funcs[func.index()].name
    }

    /// The source files its functions name, hottest first: by the samples (of every
    /// thread, on and off the CPU) whose stack has a frame in the file, then by name.
    pub fn source_files_by_samples(&self) -> Vec<String> {
        let mut per_stack = vec![0u64; self.stacks.len()];
        for thread in &self.threads {
            for row in &thread.samples {
                per_stack[row.stack.index()] += 1;
            }
        }
        // Each function's file as a number, so that the walk up each stack (2,000 frames
        // deep in a deep recursion) looks up an array, not a string.
        let mut names: Vec<&str> = Vec::new();
        let mut numbers: std::collections::HashMap<&str, usize> = Default::default();
        let file_of: Vec<Option<usize>> = self
            .funcs
            .iter()
            .map(|func| {
                let file = func.file.as_deref()?;
                Some(*numbers.entry(file).or_insert_with(|| {
                    names.push(file);
                    names.len() - 1
                }))
            })
            .collect();
        // Each stack's count goes once to every file on its path: the second number is
        // the stack it last went to from each file.
        let mut files: Vec<(u64, usize)> = vec![(0, usize::MAX); names.len()];
        for (leaf, &count) in per_stack.iter().enumerate().filter(|(_, &c)| c > 0) {
            let mut at = Some(StackIndex::new(leaf));
            while let Some(stack) = at {
                let frame = &self.frames[self.stacks[stack.index()].frame.index()];
                if let Some(file) = file_of[frame.func.index()] {
                    let entry = &mut files[file];
                    if entry.1 != leaf {
                        *entry = (entry.0 + count, leaf);
                    }
                }
                at = self.stacks[stack.index()].prefix;
            }
        }
        let mut ranked: Vec<(&str, u64)> = names
            .into_iter()
            .zip(files)
            .map(|(f, (n, _))| (f, n))
            .collect();
        ranked.retain(|&(_, n)| n > 0);
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        ranked.into_iter().map(|(f, _)| f.to_string()).collect()
    }

    /// A profile with one thread whose samples are given as function-name paths (root
    /// first). For tests and for importing stacks that have no addresses.
    pub fn from_named_stacks(samples: &[&[&str]]) -> Profile {
        let mut funcs: Interner<Func, FuncIndex> = Interner::default();
        let mut frames: Interner<Frame, FrameIndex> = Interner::default();
        let mut stacks: Interner<Stack, StackIndex> = Interner::default();
        let mut rows = Vec::new();
        for (i, path) in samples.iter().enumerate() {
            let mut prefix = None;
            for name in path.iter() {
                let func = funcs.intern(
                    Func {
                        name: name.to_string(),
                        file: None,
                        lib: None,
                    },
                    FuncIndex::new,
                );
                let frame = frames.intern(
                    Frame {
                        func,
                        lib: None,
                        address: None,
                        inline_depth: 0,
                        native_symbol: None,
                        line: None,
                        kind: CodeKind::User,
                    },
                    FrameIndex::new,
                );
                prefix = Some(stacks.intern(Stack { prefix, frame }, StackIndex::new));
            }
            if let Some(stack) = prefix {
                rows.push(SampleRow {
                    time_ms: i as f64,
                    stack,
                    weight: SampleWeight::OnCpu(1),
                });
            }
        }
        Profile {
            meta: Meta {
                start_unix_ms: 0.0,
                interval_ms: 1.0,
                duration_ms: samples.len() as f64,
                event: "synthetic".into(),
                time_event: false,
                frequency_hz: 1000,
                period: Some(1_000_000),
                command: Vec::new(),
                lost_samples: 0,
                throttled: 0,
                kernel_included: false,
                truncated_stacks: 0,
                restored_callers: 0,
                logical_cpus: 1,
                off_cpu: false,
            },
            libs: Vec::new(),
            funcs: funcs.items,
            native_symbols: Vec::new(),
            frames: frames.items,
            stacks: stacks.items,
            processes: vec![Process {
                pid: 1,
                name: "synthetic".into(),
                start_ms: 0.0,
                end_ms: None,
            }],
            threads: vec![Thread {
                tid: 1,
                process: ProcessIndex(0),
                name: "synthetic".into(),
                is_main: true,
                start_ms: 0.0,
                end_ms: None,
                lost_samples: 0,
                samples: rows,
            }],
            symbol_gaps: Vec::new(),
            sources: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_files_rank_by_the_samples_whose_stacks_pass_through_them_once_each() {
        let mut profile = Profile::from_named_stacks(&[
            &["main", "a", "b"],
            &["main", "a", "b"],
            &["main", "c"],
            &["main", "a", "none"],
            // Through x.c twice: counted once.
            &["main", "a", "a2"],
        ]);
        for func in &mut profile.funcs {
            func.file = match func.name.as_str() {
                "main" => Some("zz.c".into()),
                "a" | "a2" => Some("x.c".into()),
                "b" | "c" => Some("y.c".into()),
                _ => None,
            };
        }
        // zz.c 5, x.c 4, y.c 3 (counted twice, x.c would tie zz.c and come first).
        assert_eq!(profile.source_files_by_samples(), ["zz.c", "x.c", "y.c"]);
    }
}
