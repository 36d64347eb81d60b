//! pprof: a gzipped `profile.proto` (github.com/google/pprof, proto/profile.proto), as
//! `go tool pprof` and continuous-profiling back ends read it. One location per unique
//! code address, its `line`s innermost first (so inlined calls are kept), one function
//! per func, one mapping per library, and per (thread, stack) a sample with two values:
//! the sample count and the CPU time it stands for.
//!
//! The messages are written out here with their field numbers, for prost to encode.

use std::collections::HashMap;

use prost::Message;

use crate::profile::{OffCpuKind, Profile, SampleWeight, StackIndex};

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

/// The profile as a pprof message.
pub fn to_pprof(profile: &Profile) -> PprofProfile {
    let mut strings = Strings::new();
    let meta = &profile.meta;
    let samples_type = ValueType {
        r#type: strings.get("samples"),
        unit: strings.get("count"),
    };
    // The second value: CPU time for a time event (each sample its interval), else the
    // event's count (each sample its fixed period). When the period varied, the rows
    // hold event counts already, and they are the only on-CPU value.
    let time_event = meta.time_event;
    let (value_types, period_type, period, per_count): (Vec<ValueType>, ValueType, i64, i64) =
        match (meta.event.as_str(), meta.period) {
            _ if time_event => {
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
                (
                    vec![samples_type, events.clone()],
                    events,
                    p as i64,
                    p as i64,
                )
            }
            (event, None) => {
                let events = ValueType {
                    r#type: strings.get(event),
                    unit: strings.get("count"),
                };
                (vec![events.clone()], events, 0, 1)
            }
        };
    // Off-CPU time (`--off-cpu`): `go tool pprof -sample_index=off-cpu`.
    let off_cpu_type = profile.meta.off_cpu.then(|| ValueType {
        r#type: strings.get("off-cpu"),
        unit: strings.get("nanoseconds"),
    });

    // Functions: ids are func index + 1.
    let function: Vec<Function> = profile
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
        .collect();

    // Mappings: ids are lib index + 1; addresses are library-relative, so each mapping
    // covers the addresses its locations use, from 0.
    let mut limits = vec![0u64; profile.libs.len()];
    for f in &profile.frames {
        if let (Some(lib), Some(address)) = (f.lib, f.address) {
            limits[lib.index()] = limits[lib.index()].max(address + 1);
        }
    }
    let mapping: Vec<Mapping> = profile
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
        .collect();

    // Locations: one per address, i.e. per run of frames from inline depth 0 up to the
    // innermost inlined frame, which are consecutive stacks outer first. `location_of`
    // gives each stack the location it completes (for the innermost frame of a run)
    // and the stack where the run's outer frame's caller is.
    let mut location: Vec<Location> = Vec::new();
    let mut location_ids: HashMap<Vec<u64>, u64> = HashMap::new();
    // For each stack: the id of the location ending there, the stack before its run.
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
    let mut location_cache: HashMap<StackIndex, u64> = HashMap::new();
    let mut location_of = |leaf: StackIndex, location: &mut Vec<Location>| -> u64 {
        if let Some(&id) = location_cache.get(&leaf) {
            return id;
        }
        let first = run_start[leaf.index()].expect("every stack starts a run or continues one");
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
        let id = *location_ids.entry(key).or_insert_with(|| {
            let outer = &profile.frames[frames.last().expect("a run has a frame").index()];
            let id = location.len() as u64 + 1;
            location.push(Location {
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
        location_cache.insert(leaf, id);
        id
    };

    // Samples: one per (thread, stack), in first-seen order.
    let thread_key = strings.get("thread");
    let tid_key = strings.get("tid");
    let pid_key = strings.get("pid");
    let process_key = strings.get("process");
    let state_key = profile.meta.off_cpu.then(|| strings.get("off-cpu state"));
    let mut sample = Vec::new();
    for t in &profile.threads {
        let process = &profile.processes[t.process.index()];
        let labels = vec![
            Label {
                key: thread_key,
                str: strings.get(&t.name),
                num: 0,
            },
            Label {
                key: tid_key,
                str: 0,
                num: i64::from(t.tid),
            },
            Label {
                key: process_key,
                str: strings.get(&process.name),
                num: 0,
            },
            Label {
                key: pid_key,
                str: 0,
                num: i64::from(process.pid),
            },
        ];
        // Per (stack, off-CPU kind): on-CPU samples and off-CPU nanoseconds, in
        // first-seen order.
        let mut rows: Vec<(RowKey, (u64, u64))> = Vec::new();
        let mut row_of: HashMap<RowKey, usize> = HashMap::new();
        for s in &t.samples {
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
        for ((leaf, kind), (count, off_ns)) in rows {
            let mut labels = labels.clone();
            if let (Some(kind), Some(state_key)) = (kind, state_key) {
                labels.push(Label {
                    key: state_key,
                    str: strings.get(match kind {
                        OffCpuKind::Blocked => "blocked",
                        OffCpuKind::Preempted => "preempted",
                    }),
                    num: 0,
                });
            }
            let mut ids = Vec::new();
            let mut at = Some(leaf);
            while let Some(s) = at {
                ids.push(location_of(s, &mut location));
                at = run_start[s.index()].and_then(|first| profile.stacks[first.index()].prefix);
            }
            let mut value = vec![count as i64];
            if value_types.len() == 2 {
                value.push(count as i64 * per_count);
            }
            if profile.meta.off_cpu {
                value.push(off_ns as i64);
            }
            sample.push(Sample {
                location_id: ids,
                value,
                label: labels,
            });
        }
    }

    let comment = vec![strings.get(&format!(
        "sampler: {} {}{}",
        profile.meta.event,
        match meta.frequency_hz {
            0 => meta.rate_text(),
            _ => format!("at {}", meta.rate_text()),
        },
        if profile.meta.command.is_empty() {
            String::new()
        } else {
            format!(", {}", profile.meta.command.join(" "))
        }
    ))];
    PprofProfile {
        sample_type: value_types.iter().cloned().chain(off_cpu_type).collect(),
        sample,
        mapping,
        location,
        function,
        string_table: strings.0.into_list(),
        time_nanos: (profile.meta.start_unix_ms * 1e6) as i64,
        duration_nanos: (profile.meta.duration_ms * 1e6) as i64,
        period_type: Some(period_type),
        period,
        comment,
        default_sample_type: 0,
    }
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
