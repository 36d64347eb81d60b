//! pprof: a gzipped `profile.proto` (github.com/google/pprof, proto/profile.proto), as
//! `go tool pprof` and continuous-profiling back ends read it. One location per unique
//! code address, its `line`s innermost first (so inlined calls are kept), one function
//! per func, one mapping per library, and per (thread, stack) a sample with two values:
//! the sample count and the CPU time it stands for.
//!
//! The messages are written out here with their field numbers, for prost to encode.

use std::collections::HashMap;

use prost::Message;

use crate::profile::{Meta, OffCpuKind, Profile, SampleWeight, StackIndex, Thread};

#[derive(Clone, PartialEq, Message)]
pub struct PprofProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Innermost inlined function first; the last is the function the code is in.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// pprof's string table, whose entry 0 must be the empty string; indexes are i64.
struct Strings(super::StringTable);

impl Strings {
    fn new() -> Strings {
        let mut table = super::StringTable::default();
        table.get("");
        Strings(table)
    }
    fn get(&mut self, s: &str) -> i64 {
        self.0.get(s) as i64
    }
}

/// A pprof sample's stack and, for off-CPU time, its kind.
type RowKey = (StackIndex, Option<OffCpuKind>);

/// The profile as a pprof message, built table by table. The order of the calls is the
/// order in which strings are first met, which numbers the string table: the sample
/// types, the functions, the mappings, the samples' labels, the comment.
pub fn to_pprof(profile: &Profile) -> PprofProfile {
    let meta = &profile.meta;
    let mut strings = Strings::new();
    let values = SampleValues::of(meta, &mut strings);
    let function = functions(profile, &mut strings);
    let mapping = mappings(profile, &mut strings);
    let mut locations = Locations::new(profile);
    let sample = samples(profile, &values, &mut locations, &mut strings);
    let comment = vec![strings.get(&comment(meta))];
    PprofProfile {
        sample_type: values.sample_types(),
        sample,
        mapping,
        location: locations.list,
        function,
        string_table: strings.0.into_list(),
        time_nanos: (meta.start_unix_ms * 1e6) as i64,
        duration_nanos: (meta.duration_ms * 1e6) as i64,
        period_type: Some(values.period_type),
        period: values.period,
        comment,
        default_sample_type: 0,
    }
}

/// What each sample's values are: the sample count; then CPU time for a time event
/// (each sample its interval), else the event's count (each sample its fixed period).
/// When the period varied, the rows hold event counts already, and they are the only
/// on-CPU value. Off-CPU time (`--off-cpu`) comes last.
struct SampleValues {
    /// The on-CPU values' types.
    on_cpu: Vec<ValueType>,
    period_type: ValueType,
    period: i64,
    /// The second value of a sample counted once.
    per_count: i64,
    /// `go tool pprof -sample_index=off-cpu`.
    off_cpu: Option<ValueType>,
}

impl SampleValues {
    fn of(meta: &Meta, strings: &mut Strings) -> SampleValues {
        let samples_type = ValueType {
            r#type: strings.get("samples"),
            unit: strings.get("count"),
        };
        let (on_cpu, period_type, period, per_count) = match (meta.event.as_str(), meta.period) {
            _ if meta.time_event => {
                let cpu = ValueType {
                    r#type: strings.get("cpu"),
                    unit: strings.get("nanoseconds"),
                };
                let ns = meta.interval_ns() as i64;
                (vec![samples_type, cpu.clone()], cpu, ns, ns)
            }
            (event, Some(p)) => {
                let events = ValueType {
                    r#type: strings.get(event),
                    unit: strings.get("count"),
                };
                let p = p as i64;
                (vec![samples_type, events.clone()], events, p, p)
            }
            (event, None) => {
                let events = ValueType {
                    r#type: strings.get(event),
                    unit: strings.get("count"),
                };
                (vec![events.clone()], events, 0, 1)
            }
        };
        let off_cpu = meta.off_cpu.then(|| ValueType {
            r#type: strings.get("off-cpu"),
            unit: strings.get("nanoseconds"),
        });
        SampleValues {
            on_cpu,
            period_type,
            period,
            per_count,
            off_cpu,
        }
    }

    fn sample_types(&self) -> Vec<ValueType> {
        self.on_cpu.iter().chain(&self.off_cpu).cloned().collect()
    }

    /// The values of a sample of `count` on-CPU samples and `off_ns` off the CPU.
    fn values(&self, count: u64, off_ns: u64) -> Vec<i64> {
        let mut value = vec![count as i64];
        if self.on_cpu.len() == 2 {
            value.push(count as i64 * self.per_count);
        }
        if self.off_cpu.is_some() {
            value.push(off_ns as i64);
        }
        value
    }
}

/// One function per func: ids are func index + 1.
fn functions(profile: &Profile, strings: &mut Strings) -> Vec<Function> {
    profile
        .funcs
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let name = strings.get(&f.name);
            Function {
                id: i as u64 + 1,
                name,
                system_name: name,
                filename: f.file.as_deref().map_or(0, |file| strings.get(file)),
            }
        })
        .collect()
}

/// One mapping per library: ids are lib index + 1; addresses are library-relative, so
/// each mapping covers the addresses its locations use, from 0.
fn mappings(profile: &Profile, strings: &mut Strings) -> Vec<Mapping> {
    let mut limits = vec![0u64; profile.libs.len()];
    for f in &profile.frames {
        if let (Some(lib), Some(address)) = (f.lib, f.address) {
            limits[lib.index()] = limits[lib.index()].max(address + 1);
        }
    }
    profile
        .libs
        .iter()
        .enumerate()
        .map(|(i, lib)| {
            let build_id = lib.build_id.as_ref().map_or(0, |id| {
                strings.get(&id.iter().map(|b| format!("{b:02x}")).collect::<String>())
            });
            Mapping {
                id: i as u64 + 1,
                memory_start: 0,
                memory_limit: limits[i],
                file_offset: 0,
                filename: strings.get(&lib.path),
                build_id,
                has_functions: true,
                has_filenames: true,
                has_line_numbers: true,
                has_inline_frames: true,
            }
        })
        .collect()
}

/// The locations: one per address, i.e. per run of frames from inline depth 0 up to the
/// innermost inlined frame, which are consecutive stacks outer first. Made as samples
/// first use them, so their ids are in order of first use.
struct Locations<'a> {
    profile: &'a Profile,
    /// For each stack: the stack where its run starts (its frame at inline depth 0).
    run_start: Vec<Option<StackIndex>>,
    /// The location each stack completes, once asked for.
    of_stack: HashMap<StackIndex, u64>,
    /// Locations by their frames, innermost first.
    by_frames: HashMap<Vec<u64>, u64>,
    list: Vec<Location>,
}

impl<'a> Locations<'a> {
    fn new(profile: &'a Profile) -> Locations<'a> {
        let mut run_start: Vec<Option<StackIndex>> = Vec::with_capacity(profile.stacks.len());
        for (i, s) in profile.stacks.iter().enumerate() {
            let depth = profile.frames[s.frame.index()].inline_depth;
            // A frame of depth > 0 continues the run of its prefix.
            let start = match (depth, s.prefix) {
                (d, Some(p)) if d > 0 => run_start[p.index()],
                _ => Some(StackIndex::new(i)),
            };
            run_start.push(start);
        }
        Locations {
            profile,
            run_start,
            of_stack: HashMap::new(),
            by_frames: HashMap::new(),
            list: Vec::new(),
        }
    }

    /// The location ids of a sample's stack, leaf first.
    fn stack_ids(&mut self, leaf: StackIndex) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut at = Some(leaf);
        while let Some(s) = at {
            ids.push(self.id_of(s));
            at = self.run_start[s.index()]
                .and_then(|first| self.profile.stacks[first.index()].prefix);
        }
        ids
    }

    /// The id of the location whose innermost frame is `leaf`'s, made when new.
    fn id_of(&mut self, leaf: StackIndex) -> u64 {
        if let Some(&id) = self.of_stack.get(&leaf) {
            return id;
        }
        let profile = self.profile;
        let first =
            self.run_start[leaf.index()].expect("every stack starts a run or continues one");
        let mut frames = Vec::new();
        let mut at = leaf;
        loop {
            frames.push(profile.stacks[at.index()].frame);
            if at == first {
                break;
            }
            at = profile.stacks[at.index()]
                .prefix
                .expect("a run continues its prefix");
        }
        // frames: innermost first, as pprof wants the lines.
        let key: Vec<u64> = frames.iter().map(|f| f.0 as u64).collect();
        let list = &mut self.list;
        let id = *self.by_frames.entry(key).or_insert_with(|| {
            let outer = &profile.frames[frames.last().expect("a run has a frame").index()];
            let id = list.len() as u64 + 1;
            list.push(Location {
                id,
                mapping_id: outer.lib.map_or(0, |l| l.index() as u64 + 1),
                address: outer.address.unwrap_or(0),
                line: frames
                    .iter()
                    .map(|f| {
                        let fr = &profile.frames[f.index()];
                        Line {
                            function_id: fr.func.index() as u64 + 1,
                            line: fr.line.map_or(0, i64::from),
                        }
                    })
                    .collect(),
            });
            id
        });
        self.of_stack.insert(leaf, id);
        id
    }
}

/// The keys of the labels every sample has.
struct LabelKeys {
    thread: i64,
    tid: i64,
    process: i64,
    pid: i64,
    /// Off-CPU samples' kind, in profiles with off-CPU time.
    off_cpu_state: Option<i64>,
}

/// The samples: one per (thread, stack, off-CPU kind), in first-seen order, labelled
/// with their thread and process.
fn samples(
    profile: &Profile,
    values: &SampleValues,
    locations: &mut Locations,
    strings: &mut Strings,
) -> Vec<Sample> {
    let keys = LabelKeys {
        thread: strings.get("thread"),
        tid: strings.get("tid"),
        pid: strings.get("pid"),
        process: strings.get("process"),
        off_cpu_state: profile.meta.off_cpu.then(|| strings.get("off-cpu state")),
    };
    let mut sample = Vec::new();
    for t in &profile.threads {
        let labels = thread_labels(profile, t, &keys, strings);
        for ((leaf, kind), (count, off_ns)) in thread_rows(t) {
            let mut labels = labels.clone();
            if let (Some(kind), Some(state_key)) = (kind, keys.off_cpu_state) {
                labels.push(Label {
                    key: state_key,
                    str: strings.get(match kind {
                        OffCpuKind::Blocked => "blocked",
                        OffCpuKind::Preempted => "preempted",
                    }),
                    num: 0,
                });
            }
            sample.push(Sample {
                location_id: locations.stack_ids(leaf),
                value: values.values(count, off_ns),
                label: labels,
            });
        }
    }
    sample
}

/// The labels of every sample of `thread`: its name and tid, its process's name and pid.
fn thread_labels(
    profile: &Profile,
    thread: &Thread<StackIndex>,
    keys: &LabelKeys,
    strings: &mut Strings,
) -> Vec<Label> {
    let process = &profile.processes[thread.process.index()];
    vec![
        Label {
            key: keys.thread,
            str: strings.get(&thread.name),
            num: 0,
        },
        Label {
            key: keys.tid,
            str: 0,
            num: i64::from(thread.tid),
        },
        Label {
            key: keys.process,
            str: strings.get(&process.name),
            num: 0,
        },
        Label {
            key: keys.pid,
            str: 0,
            num: i64::from(process.pid),
        },
    ]
}

/// A thread's samples per (stack, off-CPU kind): on-CPU samples and off-CPU
/// nanoseconds, in first-seen order.
fn thread_rows(thread: &Thread<StackIndex>) -> Vec<(RowKey, (u64, u64))> {
    let mut rows: Vec<(RowKey, (u64, u64))> = Vec::new();
    let mut row_of: HashMap<RowKey, usize> = HashMap::new();
    for s in &thread.samples {
        let key = (s.stack, s.weight.off_cpu_kind());
        let i = *row_of.entry(key).or_insert_with(|| {
            rows.push((key, (0, 0)));
            rows.len() - 1
        });
        match s.weight {
            SampleWeight::OnCpu(n) => rows[i].1 .0 += n,
            SampleWeight::OffCpu { ns, .. } => rows[i].1 .1 += ns,
        }
    }
    rows
}

/// The profile's one comment: the event, its rate and the command.
fn comment(meta: &Meta) -> String {
    format!(
        "sampler: {} {}{}",
        meta.event,
        match meta.frequency_hz {
            0 => meta.rate_text(),
            _ => format!("at {}", meta.rate_text()),
        },
        if meta.command.is_empty() {
            String::new()
        } else {
            format!(", {}", meta.command.join(" "))
        }
    )
}

impl PprofProfile {
    /// The encoded message, gzipped, as pprof files are stored.
    pub fn to_gzipped_bytes(&self) -> std::io::Result<Vec<u8>> {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&self.encode_to_vec())?;
        gz.finish()
    }
}
