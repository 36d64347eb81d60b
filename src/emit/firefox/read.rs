//! Reads a profile that sampler wrote (Firefox Profiler processed format, version 70)
//! back into a [`Profile`], so that `report` and `convert` work from the file alone, on
//! any machine. It is the inverse of [`super::to_processed`], through the same typed model
//! ([`super::model`]): every table, the recording facts in `meta.extra`, and the symbol
//! gaps come back as they were written.
//!
//! A file is checked before anything uses it: every column has its table's length, every
//! index is in range, every stack's prefix comes before it. The [`Profile`] it returns
//! holds the invariants its type documents, so later stages need no checks of their own.

use std::collections::{BTreeMap, HashMap};

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

use super::model::{self as fx, ProcessedProfile, Table};
use crate::events::SamplingEvent;
use crate::profile::*;

/// The version field alone, to say "another version" before anything else is wrong.
#[derive(Deserialize)]
struct VersionOnly {
    meta: VersionMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VersionMeta {
    preprocessed_profile_version: Option<u64>,
}

/// The profile in processed-format JSON text.
pub fn from_slice(text: &[u8]) -> Result<Profile> {
    let version = match serde_json::from_slice::<VersionOnly>(text) {
        Ok(v) => v.meta.preprocessed_profile_version,
        Err(e) if e.is_syntax() || e.is_eof() => bail!("it is not valid JSON: {e}"),
        Err(_) => None,
    };
    check_version(version)?;
    // The error names the place in the file: `shared.frameTable.func[0]: invalid value…`.
    let p: ProcessedProfile =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(text))
            .map_err(|e| anyhow::anyhow!("{}: {}", e.path(), e.inner()))?;
    from_processed(&p)
}

fn check_version(version: Option<u64>) -> Result<()> {
    if version != Some(u64::from(fx::PROCESSED_PROFILE_VERSION)) {
        bail!(
            "meta.preprocessedProfileVersion is {}, sampler reads version {}",
            version.map_or("missing".into(), |v| v.to_string()),
            fx::PROCESSED_PROFILE_VERSION
        );
    }
    Ok(())
}

fn lib_kind(name: &str) -> LibKind {
    if name == VDSO_NAME {
        LibKind::File
    } else if name == KERNEL_LIB_NAME {
        LibKind::Kernel
    } else if name.starts_with("perf-") && name.ends_with(".map") {
        LibKind::PerfMap
    } else if name.starts_with('[') {
        LibKind::Pseudo
    } else {
        LibKind::File
    }
}

fn parse_build_id(hex: &str) -> Option<Vec<u8>> {
    hex.len()
        .is_multiple_of(2)
        .then(|| {
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                .collect()
        })
        .flatten()
}

/// Checks that every column of a table has the table's length.
fn same_length(table: &str, length: usize, columns: &[(&str, usize)]) -> Result<()> {
    for (name, len) in columns {
        if *len != length {
            bail!("{table}.{name} has {len} entries, but {table}.length is {length}");
        }
    }
    Ok(())
}

/// Checks that every column sampler reads of `table` has its length.
fn check_columns<T: Table>(table: &T) -> Result<()> {
    same_length(T::NAME, table.length(), &table.columns())
}

/// `column[row]` as an index below `len`.
fn index(column: &str, row: usize, value: u32, len: usize) -> Result<usize> {
    let i = value as usize;
    if i >= len {
        bail!("{column}[{row}] = {value} is not an index below {len}");
    }
    Ok(i)
}

/// An index column whose "none" is -1.
fn signed_index(column: &str, row: usize, value: i64, len: usize) -> Result<Option<usize>> {
    match value {
        -1 => Ok(None),
        v if v >= 0 && (v as u64) < len as u64 => Ok(Some(v as usize)),
        v => bail!("{column}[{row}] = {v} is not -1 or an index below {len}"),
    }
}

fn optional_index(
    column: &str,
    row: usize,
    value: Option<u32>,
    len: usize,
) -> Result<Option<usize>> {
    value.map(|v| index(column, row, v, len)).transpose()
}

/// The profile in a processed-format JSON value.
pub fn from_json(value: &Value) -> Result<Profile> {
    check_version(value["meta"]["preprocessedProfileVersion"].as_u64())?;
    let p: ProcessedProfile = serde_path_to_error::deserialize(value)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path(), e.inner()))?;
    from_processed(&p)
}

/// The string table, read by index.
struct Strings<'a>(&'a [String]);

impl Strings<'_> {
    /// `column[row]`, an index into the string table.
    fn get(&self, column: &str, row: usize, v: u32) -> Result<String> {
        Ok(self.0[index(column, row, v, self.0.len())?].clone())
    }
}

/// The profile of a processed profile, after checking every table.
pub fn from_processed(p: &ProcessedProfile) -> Result<Profile> {
    let shared = &p.shared;
    let strings = Strings(&shared.string_array);
    let libs: Vec<Lib> = p
        .libs
        .iter()
        .map(|l| Lib {
            kind: lib_kind(&l.name),
            path: l.path.clone(),
            build_id: l.code_id.as_deref().and_then(parse_build_id),
            base: 0,
            name: l.name.clone(),
        })
        .collect();
    let lib_by_name: HashMap<&str, usize> = libs
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name.as_str(), i))
        .collect();
    let resource_lib = read_resources(&shared.resource_table, &strings, &lib_by_name)?;
    let source_files = read_sources(&shared.sources, &strings)?;
    let funcs = read_funcs(&shared.func_table, &strings, &resource_lib, &source_files)?;
    let native_symbols = read_native_symbols(&shared.native_symbols, &strings, libs.len())?;
    let (frames, frames_off_cpu) = read_frames(
        &shared.frame_table,
        funcs.len(),
        &libs,
        native_symbols.len(),
    )?;
    let stacks = read_stacks(&shared.stack_table, frames.len())?;
    let leaf_off_cpu: Vec<Option<OffCpuKind>> = stacks
        .iter()
        .map(|s| frames_off_cpu[s.frame.index()])
        .collect();
    let (processes, threads) = read_threads(p, &leaf_off_cpu)?;
    Ok(Profile {
        meta: read_meta(&p.meta),
        symbol_gaps: read_symbol_gaps(&p.meta, &lib_by_name),
        sources: read_source_texts(&shared.sources, &source_files),
        libs,
        funcs,
        native_symbols,
        frames,
        stacks,
        processes,
        threads,
    })
}

/// Resources are libraries, matched by name.
fn read_resources(
    rt: &fx::ResourceTable,
    strings: &Strings,
    lib_by_name: &HashMap<&str, usize>,
) -> Result<Vec<Option<LibIndex>>> {
    check_columns(rt)?;
    (0..rt.length)
        .map(|i| {
            let name = strings.get("resourceTable.name", i, rt.name[i])?;
            Ok(lib_by_name.get(name.as_str()).map(|&l| LibIndex::new(l)))
        })
        .collect::<Result<_>>()
}

fn read_sources(so: &fx::Sources, strings: &Strings) -> Result<Vec<String>> {
    check_columns(so)?;
    (0..so.length)
        .map(|i| strings.get("sources.filename", i, so.filename[i]))
        .collect::<Result<_>>()
}

/// The embedded texts of the source files, by name.
fn read_source_texts(so: &fx::Sources, names: &[String]) -> BTreeMap<String, String> {
    names
        .iter()
        .zip(&so.content)
        .filter_map(|(name, text)| Some((name.clone(), text.clone()?)))
        .collect()
}

fn read_funcs(
    ft: &fx::FuncTable,
    strings: &Strings,
    resource_lib: &[Option<LibIndex>],
    source_files: &[String],
) -> Result<Vec<Func>> {
    check_columns(ft)?;
    (0..ft.length)
        .map(|i| {
            let resource =
                signed_index("funcTable.resource", i, ft.resource[i], resource_lib.len())?;
            let source = optional_index("funcTable.source", i, ft.source[i], source_files.len())?;
            Ok(Func {
                name: strings.get("funcTable.name", i, ft.name[i])?,
                file: source.map(|s| source_files[s].clone()),
                lib: resource.and_then(|r| resource_lib[r]),
            })
        })
        .collect::<Result<_>>()
}

fn read_native_symbols(
    ns: &fx::NativeSymbols,
    strings: &Strings,
    libs: usize,
) -> Result<Vec<NativeSymbol>> {
    check_columns(ns)?;
    (0..ns.length)
        .map(|i| {
            Ok(NativeSymbol {
                lib: LibIndex::new(index("nativeSymbols.libIndex", i, ns.lib_index[i], libs)?),
                address: ns.address[i],
                size: ns.function_size[i],
                name: strings.get("nativeSymbols.name", i, ns.name[i])?,
            })
        })
        .collect::<Result<_>>()
}

/// The frames, and for each whether it is an off-CPU stack's copy of a frame (in the
/// Off-CPU category; see [`fx::CATEGORY_OFF_CPU`]) and of which kind.
fn read_frames(
    fr: &fx::FrameTable,
    funcs: usize,
    lib_list: &[Lib],
    native_symbols: usize,
) -> Result<(Vec<Frame>, Vec<Option<OffCpuKind>>)> {
    let libs = lib_list.len();
    check_columns(fr)?;
    let mut off_cpu = Vec::with_capacity(fr.length);
    let frames = (0..fr.length)
        .map(|i| {
            let lib = signed_index("frameTable.lib", i, fr.lib[i], libs)?.map(LibIndex::new);
            let kind = match fr.category[i] {
                Some(fx::CATEGORY_KERNEL) => CodeKind::Kernel,
                Some(fx::CATEGORY_OTHER) => CodeKind::Marker,
                // An off-CPU copy: its code kind from where it is.
                Some(fx::CATEGORY_OFF_CPU) => match lib {
                    Some(l) if lib_list[l.index()].kind == LibKind::Kernel => CodeKind::Kernel,
                    None if fr.address[i] < 0 => CodeKind::Marker,
                    _ => CodeKind::User,
                },
                _ => CodeKind::User,
            };
            off_cpu.push(
                match (fr.category[i], fr.subcategory.get(i).copied().flatten()) {
                    // An unknown subcategory counts as blocked.
                    (Some(fx::CATEGORY_OFF_CPU), sub) => Some(
                        sub.and_then(|s| OffCpuKind::ALL.get(s as usize).copied())
                            .unwrap_or(OffCpuKind::Blocked),
                    ),
                    _ => None,
                },
            );
            Ok(Frame {
                func: FuncIndex::new(index("frameTable.func", i, fr.func[i], funcs)?),
                lib,
                address: u64::try_from(fr.address[i]).ok(),
                inline_depth: fr.inline_depth[i],
                native_symbol: optional_index(
                    "frameTable.nativeSymbol",
                    i,
                    fr.native_symbol[i],
                    native_symbols,
                )?
                .map(NativeSymbolIndex::new),
                line: fr.line[i],
                kind,
            })
        })
        .collect::<Result<_>>()?;
    Ok((frames, off_cpu))
}

fn read_stacks(st: &fx::StackTable, frames: usize) -> Result<Vec<Stack>> {
    check_columns(st)?;
    (0..st.length)
        .map(|i| {
            // A prefix lies before its stack: offset 0 (a root) up to i.
            let offset = index("stackTable.prefixOffset", i, st.prefix_offset[i], i + 1)?;
            Ok(Stack {
                prefix: (offset > 0).then(|| StackIndex::new(i - offset)),
                frame: FrameIndex::new(index("stackTable.frame", i, st.frame[i], frames)?),
            })
        })
        .collect::<Result<_>>()
}

/// Threads, and their processes (by pid, in order of first appearance).
fn read_threads(
    p: &ProcessedProfile,
    leaf_off_cpu: &[Option<OffCpuKind>],
) -> Result<(Vec<Process>, Vec<Thread<StackIndex>>)> {
    let meta = &p.meta;
    let interval_ms = if meta.interval > 0.0 {
        meta.interval
    } else {
        1.0
    };
    let lost_by_thread: HashMap<&str, u64> = meta
        .section(fx::EXTRA_LOST_BY_THREAD)
        .iter()
        .filter_map(|e| Some((e.label.as_str(), e.value.as_u64()?)))
        .collect();
    let mut processes: Vec<Process> = Vec::new();
    let mut process_by_pid: HashMap<&str, ProcessIndex> = HashMap::new();
    let mut threads = Vec::new();
    for (t_index, t) in p.threads.iter().enumerate() {
        let process = *process_by_pid.entry(&t.pid).or_insert_with(|| {
            processes.push(Process {
                // `PID.N`: the Nth process of a reused pid (see the writer's `track_pids`).
                pid: t
                    .pid
                    .split('.')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0),
                name: t.process_name.clone(),
                start_ms: t.process_startup_time,
                end_ms: t.process_shutdown_time,
            });
            ProcessIndex::new(processes.len() - 1)
        });
        let what = format!("threads[{t_index}].samples");
        let rows = read_samples(&what, &t.samples, leaf_off_cpu, interval_ms)?;
        let tid = i32::try_from(t.tid)
            .with_context(|| format!("threads[{t_index}].tid = {} is not a thread id", t.tid))?;
        threads.push(Thread {
            lost_samples: lost_by_thread
                .get(format!("{} ({tid})", t.name).as_str())
                .copied()
                .unwrap_or(0),
            tid,
            process,
            name: t.name.clone(),
            is_main: t.is_main_thread,
            start_ms: t.register_time,
            end_ms: t.unregister_time,
            samples: rows,
        });
    }

    Ok((processes, threads))
}

/// A thread's sample table (`what` names it in errors) as rows; a sample without a stack
/// is left out. `leaf_off_cpu` says which stacks are off-CPU copies, and of which kind.
fn read_samples(
    what: &str,
    samples: &fx::Samples,
    leaf_off_cpu: &[Option<OffCpuKind>],
    interval_ms: f64,
) -> Result<Vec<SampleRow<StackIndex>>> {
    let stacks = leaf_off_cpu.len();
    same_length(what, samples.length, &samples.columns())?;
    let mut rows = Vec::with_capacity(samples.length);
    for i in 0..samples.length {
        // A sample without a stack has nothing a call tree or export could show.
        let Some(stack) = optional_index(&format!("{what}.stack"), i, samples.stack[i], stacks)?
        else {
            continue;
        };
        let w = samples.weight.as_ref().map_or(1.0, |w| w[i]);
        if !w.is_finite() || w < 0.0 {
            bail!("{what}.weight[{i}] = {w} is not a weight");
        }
        let weight = match (samples.weight_type.as_str(), leaf_off_cpu[stack]) {
            (fx::WEIGHT_TRACING_MS, Some(kind)) => SampleWeight::OffCpu {
                kind,
                ns: (w * 1e6).round() as u64,
            },
            (fx::WEIGHT_TRACING_MS, None) => SampleWeight::OnCpu((w / interval_ms).round() as u64),
            _ => SampleWeight::OnCpu(w.round() as u64),
        };
        rows.push(SampleRow {
            time_ms: samples.time[i],
            stack: StackIndex::new(stack),
            weight,
        });
    }
    Ok(rows)
}

fn read_symbol_gaps(meta: &fx::Meta, lib_by_name: &HashMap<&str, usize>) -> Vec<SymbolGap> {
    meta.section(fx::EXTRA_SYMBOLS)
        .iter()
        .filter_map(|e| {
            let lib = *lib_by_name.get(e.label.as_str())?;
            let value = e.value.as_str()?;
            let (missing, why) = if let Some(why) = value.strip_prefix(fx::GAP_SYMBOLS) {
                (Missing::Symbols, why)
            } else {
                (Missing::DebugInfo, value.strip_prefix(fx::GAP_DEBUG_INFO)?)
            };
            Some(SymbolGap {
                lib: LibIndex::new(lib),
                missing,
                why: why.trim_start_matches(": ").to_string(),
            })
        })
        .collect()
}

fn read_meta(meta: &fx::Meta) -> Meta {
    let recording = |label: &str| meta.entry(fx::EXTRA_RECORDING, label);
    let count = |label: &str| recording(label).as_u64().unwrap_or(0);
    let event = recording(fx::RECORDING_EVENT)
        .as_str()
        .unwrap_or("unknown")
        .to_string();
    Meta {
        start_unix_ms: meta.start_time,
        interval_ms: meta.interval,
        duration_ms: meta.profiling_end_time,
        time_event: SamplingEvent::from_name(&event).is_some_and(|e| e.is_time()),
        event,
        frequency_hz: count(fx::RECORDING_FREQUENCY),
        // A profile written before the period was recorded had a fixed one: the interval.
        period: match recording(fx::RECORDING_PERIOD) {
            v if v.is_null() => Some((meta.interval * 1e6).round() as u64),
            v => v.as_u64(),
        },
        command: fx::split_command(&meta.arguments),
        lost_samples: count(fx::RECORDING_LOST),
        throttled: count(fx::RECORDING_THROTTLED),
        kernel_included: recording(fx::RECORDING_KERNEL) == fx::KERNEL_YES,
        truncated_stacks: count(fx::RECORDING_TRUNCATED),
        restored_callers: count(fx::RECORDING_RESTORED),
        logical_cpus: meta.logical_cpus,
        off_cpu: meta
            .categories
            .iter()
            .any(|c| c.name == fx::CATEGORY_OFF_CPU_NAME),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emit::firefox::fixture::rich_profile;

    #[test]
    fn reads_back_off_cpu_time_with_its_kind() {
        let mut p = rich_profile();
        p.meta.off_cpu = true;
        let stack = p.threads[0].samples[0].stack;
        for (kind, ns) in [
            (OffCpuKind::Blocked, 2_500_000),
            (OffCpuKind::Preempted, 125_000),
        ] {
            p.threads[0].samples.push(SampleRow {
                time_ms: 2.5,
                stack,
                weight: SampleWeight::OffCpu { kind, ns },
            });
        }
        let json = super::super::to_json(&p);
        assert_eq!(json["threads"][0]["samples"]["weightType"], "tracing-ms");
        let back = from_json(&json).unwrap();
        // The off-CPU rows' frames are copies in the Off-CPU category: the same functions.
        let tree = |p: &Profile, view| {
            let t = crate::calltree::CallTree::all_threads_in(p, view);
            (t.total(), t.roots.len())
        };
        for view in [TimeView::Cpu, TimeView::OffCpu, TimeView::Wall] {
            assert_eq!(tree(&back, view), tree(&p, view), "{view:?}");
        }
        let weights: Vec<SampleWeight> = back.threads[0].samples.iter().map(|s| s.weight).collect();
        let expected: Vec<SampleWeight> = p.threads[0].samples.iter().map(|s| s.weight).collect();
        assert_eq!(weights, expected);
        assert!(back.meta.off_cpu);
    }

    #[test]
    fn reads_back_what_the_writer_wrote() {
        let p = rich_profile();
        let back = from_json(&super::super::to_json(&p)).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn refuses_other_versions_and_broken_indexes() {
        let mut v = super::super::to_json(&rich_profile());
        v["meta"]["preprocessedProfileVersion"] = 55.into();
        let err = from_json(&v).unwrap_err().to_string();
        assert!(err.contains("is 55, sampler reads version 70"), "{err}");
        let mut v = super::super::to_json(&rich_profile());
        v["shared"]["stackTable"]["frame"][0] = 1000.into();
        let err = from_json(&v).unwrap_err().to_string();
        assert!(
            err.contains("stackTable.frame[0] = 1000 is not an index below"),
            "{err}"
        );
        let mut v = super::super::to_json(&rich_profile());
        v["shared"]["frameTable"]["nativeSymbol"]
            .as_array_mut()
            .unwrap()
            .pop();
        let err = from_json(&v).unwrap_err().to_string();
        assert!(
            err.contains("frameTable.nativeSymbol has 4 entries, but frameTable.length is 5"),
            "{err}"
        );
    }
}
