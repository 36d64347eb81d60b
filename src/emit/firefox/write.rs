//! Writes a [`Profile`] into the processed format's model ([`super::model`]), one
//! function per table: shared struct-of-arrays tables, one thread entry per thread,
//! symbols embedded so that the viewer never asks a symbol server, and inline frames
//! linked outer-first with their native symbol so they get the "(inlined)" badge.

use std::collections::HashMap;

use serde_json::Value;

use super::model::{self as fx, ExtraEntry, ExtraSection, ProcessedProfile};
use crate::profile::cpu::{self, CpuDeltaUnit};
use crate::profile::{
    CodeKind, FrameIndex, Lib, Missing, OffCpuKind, Profile, SampleWeight, StackIndex,
};

/// Strings are stored once, in `shared.stringArray`.
type Strings = crate::emit::StringTable;

/// The Breakpad debug ID of an ELF build ID: its first 16 bytes as a GUID (the first
/// three fields byte-swapped), followed by the age, 0.
pub fn breakpad_id(build_id: &[u8]) -> String {
    let mut guid = [0u8; 16];
    let n = build_id.len().min(16);
    guid[..n].copy_from_slice(&build_id[..n]);
    guid[0..4].reverse();
    guid[4..6].reverse();
    guid[6..8].reverse();
    let mut s: String = guid.iter().map(|b| format!("{b:02X}")).collect();
    s.push('0');
    s
}

/// One entry per sampled library that lacks names or debug information, saying why, so
/// that `0x…` frames are explained where they are seen.
fn symbol_gap_entries(profile: &Profile) -> Vec<ExtraEntry> {
    profile
        .symbol_gaps
        .iter()
        .map(|g| {
            let what = match g.missing {
                Missing::Symbols => fx::GAP_SYMBOLS,
                Missing::DebugInfo => fx::GAP_DEBUG_INFO,
            };
            ExtraEntry::text(
                &profile.libs[g.lib.index()].name,
                &format!("{what}: {}", g.why),
            )
        })
        .collect()
}

fn lib_entry(lib: &Lib) -> fx::Lib {
    let (breakpad_id, code_id) = match &lib.build_id {
        Some(id) => (
            self::breakpad_id(id),
            Some(id.iter().map(|b| format!("{b:02x}")).collect()),
        ),
        None => ("0".repeat(33), None),
    };
    fx::Lib {
        arch: "x86_64".into(),
        name: lib.name.clone(),
        path: lib.path.clone(),
        debug_name: lib.name.clone(),
        debug_path: lib.path.clone(),
        breakpad_id,
        code_id,
    }
}

fn category(kind: CodeKind) -> u32 {
    match kind {
        CodeKind::User => fx::CATEGORY_USER,
        CodeKind::Kernel => fx::CATEGORY_KERNEL,
        CodeKind::Marker => fx::CATEGORY_OTHER,
    }
}

/// The profile as a processed-format JSON value.
pub fn to_json(profile: &Profile) -> Value {
    serde_json::to_value(to_processed(profile)).expect("the model serializes")
}

/// The profile in the processed format's model.
pub fn to_processed(profile: &Profile) -> ProcessedProfile {
    // Strings are numbered as first met: library names, then function names and their
    // files, then native symbol names.
    let mut strings = Strings::default();
    let resource_table = resource_table(profile, &mut strings);
    let (func_table, sources) = func_table(profile, &mut strings);
    let native_symbols = native_symbols(profile, &mut strings);
    let copies = OffCpuCopies::of(profile);
    let mut stack_table = stack_table(profile);
    let mut frame_table = frame_table(profile);
    copies.append_to(profile, &mut frame_table, &mut stack_table);
    ProcessedProfile {
        meta: meta(profile),
        libs: profile.libs.iter().map(lib_entry).collect(),
        shared: fx::Shared {
            string_array: strings.into_list(),
            stack_table,
            frame_table,
            func_table,
            resource_table,
            native_symbols,
            sources,
            source_location_table: fx::SourceLocationTable::default(),
        },
        threads: threads(profile, &copies),
    }
}

/// One resource per library, in library order.
fn resource_table(profile: &Profile, strings: &mut Strings) -> fx::ResourceTable {
    let resources = profile.libs.len();
    fx::ResourceTable {
        name: profile
            .libs
            .iter()
            .map(|l| index(strings.get(&l.name)))
            .collect(),
        host: vec![None; resources],
        kind: vec![1; resources],
        length: resources,
    }
}

/// The functions, and the source files they name (each once, in order of first use).
fn func_table(profile: &Profile, strings: &mut Strings) -> (fx::FuncTable, fx::Sources) {
    let mut source_index: HashMap<&str, u32> = HashMap::new();
    // Each file's name and its index in the string table, interned as it is first met.
    let mut source_files: Vec<(&str, u32)> = Vec::new();
    let mut func_table = fx::FuncTable::default();
    for f in &profile.funcs {
        func_table.name.push(index(strings.get(&f.name)));
        func_table
            .resource
            .push(f.lib.map_or(-1, |l| l.index() as i64));
        func_table.source.push(f.file.as_deref().map(|file| {
            *source_index.entry(file).or_insert_with(|| {
                source_files.push((file, index(strings.get(file))));
                index(source_files.len() - 1)
            })
        }));
    }
    let funcs = profile.funcs.len();
    func_table.is_js = vec![false; funcs];
    func_table.relevant_for_js = vec![false; funcs];
    func_table.line_number = vec![None; funcs];
    func_table.column_number = vec![None; funcs];
    func_table.original_location = vec![None; funcs];
    func_table.length = funcs;
    (func_table, sources(profile, &source_files))
}

/// The source files by name, with their text where it was embedded (the viewer's source
/// view shows it).
fn sources(profile: &Profile, files: &[(&str, u32)]) -> fx::Sources {
    let count = files.len();
    fx::Sources {
        id: vec![None; count],
        filename: files.iter().map(|&(_, name)| name).collect(),
        start_line: vec![1; count],
        start_column: vec![1; count],
        source_map_url: vec![None; count],
        content: files
            .iter()
            .map(|(file, _)| profile.sources.get(*file).cloned())
            .collect(),
        length: count,
    }
}

fn native_symbols(profile: &Profile, strings: &mut Strings) -> fx::NativeSymbols {
    let syms = &profile.native_symbols;
    fx::NativeSymbols {
        lib_index: syms.iter().map(|s| index(s.lib.index())).collect(),
        address: syms.iter().map(|s| s.address).collect(),
        name: syms.iter().map(|s| index(strings.get(&s.name))).collect(),
        function_size: syms.iter().map(|s| s.size).collect(),
        length: syms.len(),
    }
}

/// The off-CPU stacks' own frames and stacks: a copy of each frame and stack that
/// off-CPU rows use, per [`OffCpuKind`], in the Off-CPU category, after the profile's
/// own (frames and stacks at `profile.frames.len()` and `profile.stacks.len()` on).
#[derive(Default)]
struct OffCpuCopies {
    frames: Vec<(FrameIndex, OffCpuKind)>,
    frame_of: HashMap<(FrameIndex, OffCpuKind), u32>,
    /// (prefix, frame) as Firefox table indexes.
    stacks: Vec<(Option<u32>, u32)>,
    stack_of: HashMap<(StackIndex, OffCpuKind), u32>,
}

impl OffCpuCopies {
    fn of(profile: &Profile) -> OffCpuCopies {
        let mut copies = OffCpuCopies::default();
        for t in &profile.threads {
            for s in &t.samples {
                if let SampleWeight::OffCpu { kind, .. } = s.weight {
                    copies.stack(profile, s.stack, kind);
                }
            }
        }
        copies
    }

    /// The Firefox index of the off-CPU copy of `stack`, made with its prefixes'.
    fn stack(&mut self, profile: &Profile, stack: StackIndex, kind: OffCpuKind) -> u32 {
        if let Some(&i) = self.stack_of.get(&(stack, kind)) {
            return i;
        }
        let st = profile.stacks[stack.index()];
        let prefix = st.prefix.map(|p| self.stack(profile, p, kind));
        let frames = profile.frames.len();
        let frame = *self.frame_of.entry((st.frame, kind)).or_insert_with(|| {
            self.frames.push((st.frame, kind));
            index(frames + self.frames.len() - 1)
        });
        self.stacks.push((prefix, frame));
        let i = index(profile.stacks.len() + self.stacks.len() - 1);
        self.stack_of.insert((stack, kind), i);
        i
    }

    /// The Firefox stack of a sample row.
    fn of_row(&self, stack: StackIndex, weight: SampleWeight) -> u32 {
        match weight {
            SampleWeight::OnCpu(_) => index(stack.index()),
            SampleWeight::OffCpu { kind, .. } => self.stack_of[&(stack, kind)],
        }
    }

    fn append_to(
        &self,
        profile: &Profile,
        frames: &mut fx::FrameTable,
        stacks: &mut fx::StackTable,
    ) {
        for &(f, kind) in &self.frames {
            let i = f.index();
            frames.address.push(frames.address[i]);
            frames.lib.push(frames.lib[i]);
            frames.inline_depth.push(frames.inline_depth[i]);
            frames.category.push(Some(fx::CATEGORY_OFF_CPU));
            frames.subcategory.push(Some(kind.index() as u32));
            frames.func.push(frames.func[i]);
            frames.native_symbol.push(frames.native_symbol[i]);
            frames.inner_window_id.push(frames.inner_window_id[i]);
            frames.line.push(frames.line[i]);
            frames.column.push(None);
            frames.original_location.push(None);
        }
        frames.length = frames.func.len();
        let base = profile.stacks.len();
        for (k, &(prefix, frame)) in self.stacks.iter().enumerate() {
            let i = base + k;
            stacks.frame.push(frame);
            stacks
                .prefix_offset
                .push(prefix.map_or(0, |p| index(i - p as usize)));
        }
        stacks.length = stacks.frame.len();
    }
}

/// Table indexes are u32 in the model (the profile's own indexes are u32 too).
fn index(i: usize) -> u32 {
    i as u32
}

fn frame_table(profile: &Profile) -> fx::FrameTable {
    let frames = &profile.frames;
    fx::FrameTable {
        address: frames
            .iter()
            .map(|f| f.address.map_or(-1, |a| a as i64))
            .collect(),
        lib: frames
            .iter()
            .map(|f| f.lib.map_or(-1, |l| l.index() as i64))
            .collect(),
        inline_depth: frames.iter().map(|f| f.inline_depth).collect(),
        category: frames.iter().map(|f| Some(category(f.kind))).collect(),
        subcategory: vec![Some(0); frames.len()],
        func: frames.iter().map(|f| index(f.func.index())).collect(),
        native_symbol: frames
            .iter()
            .map(|f| f.native_symbol.map(|n| index(n.index())))
            .collect(),
        inner_window_id: vec![Some(0); frames.len()],
        line: frames.iter().map(|f| f.line).collect(),
        column: vec![None; frames.len()],
        original_location: vec![None; frames.len()],
        length: frames.len(),
    }
}

fn stack_table(profile: &Profile) -> fx::StackTable {
    let stacks = &profile.stacks;
    fx::StackTable {
        frame: stacks.iter().map(|s| index(s.frame.index())).collect(),
        prefix_offset: stacks
            .iter()
            .enumerate()
            .map(|(i, s)| index(s.prefix.map_or(0, |p| i - p.index())))
            .collect(),
        length: stacks.len(),
    }
}

/// Each process's pid as the profile writes it: the Firefox Profiler makes one track of
/// the threads of one pid, so a process that took the pid of one that exited before it
/// (the kernel reuses pids) is written as `PID.N`, the Nth process of that pid.
fn track_pids(profile: &Profile) -> Vec<String> {
    let mut seen: HashMap<i32, u32> = HashMap::new();
    profile
        .processes
        .iter()
        .map(|p| {
            let n = seen.entry(p.pid).or_default();
            *n += 1;
            match *n {
                1 => p.pid.to_string(),
                n => format!("{}.{n}", p.pid),
            }
        })
        .collect()
}

fn threads(profile: &Profile, copies: &OffCpuCopies) -> Vec<fx::Thread> {
    let off_cpu = profile.meta.off_cpu;
    let interval_ms = profile.meta.interval_ms;
    let pids = track_pids(profile);
    profile
        .threads
        .iter()
        .map(|t| {
            let process = &profile.processes[t.process.index()];
            fx::Thread {
                process_type: "default".into(),
                process_startup_time: process.start_ms,
                process_shutdown_time: process.end_ms,
                register_time: t.start_ms,
                unregister_time: t.end_ms,
                paused_ranges: Vec::new(),
                name: t.name.clone(),
                is_main_thread: t.is_main,
                process_name: process.name.clone(),
                pid: pids[t.process.index()].clone(),
                tid: i64::from(t.tid),
                samples: fx::Samples {
                    stack: t
                        .samples
                        .iter()
                        .map(|s| Some(copies.of_row(s.stack, s.weight)))
                        .collect(),
                    time: t.samples.iter().map(|s| s.time_ms).collect(),
                    weight: if off_cpu {
                        Some(
                            t.samples
                                .iter()
                                .map(|s| match s.weight {
                                    SampleWeight::OnCpu(n) => n as f64 * interval_ms,
                                    SampleWeight::OffCpu { ns, .. } => ns as f64 / 1e6,
                                })
                                .collect(),
                        )
                    } else {
                        let count = |s: &crate::profile::SampleRow<StackIndex>| match s.weight {
                            SampleWeight::OnCpu(n) => n,
                            SampleWeight::OffCpu { .. } => 0,
                        };
                        (!t.samples.iter().all(|s| count(s) == 1))
                            .then(|| t.samples.iter().map(|s| count(s) as f64).collect())
                    },
                    weight_type: if off_cpu {
                        fx::WEIGHT_TRACING_MS.into()
                    } else {
                        fx::WEIGHT_SAMPLES.into()
                    },
                    thread_cpu_delta: cpu::thread_cpu_deltas(&profile.meta, &t.samples)
                        .map(|deltas| deltas.into_iter().map(Some).collect()),
                    length: t.samples.len(),
                },
                markers: fx::Markers::default(),
            }
        })
        .collect()
}

fn meta(profile: &Profile) -> fx::Meta {
    let meta = &profile.meta;
    let command = fx::quote_command(&meta.command);
    fx::Meta {
        interval: meta.interval_ms,
        start_time: meta.start_unix_ms,
        end_time: meta.start_unix_ms + meta.duration_ms,
        profiling_start_time: 0.0,
        profiling_end_time: meta.duration_ms,
        process_type: 0,
        product: if command.is_empty() {
            "sampler".to_string()
        } else {
            format!("sampler: {command}")
        },
        stackwalk: 1,
        version: fx::GECKO_VERSION,
        preprocessed_profile_version: fx::PROCESSED_PROFILE_VERSION,
        symbolicated: true,
        platform: "Linux".into(),
        oscpu: "Linux x86_64".into(),
        logical_cpus: meta.logical_cpus,
        arguments: command,
        imported_from: "sampler".into(),
        uses_only_one_stack_type: true,
        source_code_is_not_on_searchfox: true,
        keep_profile_thread_order: true,
        sample_units: fx::SampleUnits {
            time: "ms".into(),
            event_delay: "ms".into(),
            thread_cpu_delta: CpuDeltaUnit::of(meta)
                .unwrap_or(CpuDeltaUnit::Nanoseconds)
                .firefox_name()
                .into(),
        },
        categories: categories(meta.off_cpu),
        marker_schema: Vec::new(),
        extra: extra_sections(profile),
    }
}

/// `meta.categories`, in the order of the `CATEGORY_*` indexes; the Off-CPU category
/// only in a profile with off-CPU time.
fn categories(off_cpu: bool) -> Vec<fx::Category> {
    let mut categories: Vec<fx::Category> = fx::CATEGORIES
        .iter()
        .map(|&(name, color)| fx::Category {
            name: name.into(),
            color: color.into(),
            subcategories: vec![fx::SUBCATEGORY_OTHER.into()],
        })
        .collect();
    if off_cpu {
        categories.push(fx::Category {
            name: fx::CATEGORY_OFF_CPU_NAME.into(),
            color: fx::CATEGORY_OFF_CPU_COLOR.into(),
            subcategories: OffCpuKind::ALL
                .map(|k| fx::off_cpu_subcategory_name(k).to_string())
                .to_vec(),
        });
    }
    categories
}

/// `meta.extra`: the recording facts, the symbol gaps and the lost samples per thread.
fn extra_sections(profile: &Profile) -> Vec<ExtraSection> {
    let meta = &profile.meta;
    vec![
        ExtraSection {
            label: fx::EXTRA_RECORDING.into(),
            entries: vec![
                ExtraEntry::text(fx::RECORDING_EVENT, &meta.event),
                ExtraEntry::integer(fx::RECORDING_FREQUENCY, meta.frequency_hz),
                match meta.period {
                    Some(p) => ExtraEntry::integer(fx::RECORDING_PERIOD, p),
                    None => ExtraEntry::text(fx::RECORDING_PERIOD, fx::PERIOD_VARIES),
                },
                ExtraEntry::integer(fx::RECORDING_LOST, meta.lost_samples),
                ExtraEntry::integer(fx::RECORDING_TRUNCATED, meta.truncated_stacks),
                ExtraEntry::integer(fx::RECORDING_RESTORED, meta.restored_callers),
                ExtraEntry::integer(fx::RECORDING_THROTTLED, meta.throttled),
                ExtraEntry::text(
                    fx::RECORDING_KERNEL,
                    if meta.kernel_included {
                        fx::KERNEL_YES
                    } else {
                        fx::KERNEL_NO
                    },
                ),
            ],
        },
        ExtraSection {
            label: fx::EXTRA_SYMBOLS.into(),
            entries: symbol_gap_entries(profile),
        },
        ExtraSection {
            label: fx::EXTRA_LOST_BY_THREAD.into(),
            entries: profile
                .threads
                .iter()
                .filter(|t| t.lost_samples > 0)
                .map(|t| ExtraEntry::integer(&format!("{} ({})", t.name, t.tid), t.lost_samples))
                .collect(),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakpad_id_swaps_guid_fields() {
        let id: Vec<u8> = (0u8..20).collect();
        assert_eq!(breakpad_id(&id), "030201000504070608090A0B0C0D0E0F0");
    }
}
