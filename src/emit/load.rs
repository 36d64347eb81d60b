//! Reads a profile that sampler wrote (Firefox Profiler processed format, version 70)
//! back into a [`Profile`], so that `report` and `convert` work from the file alone, on
//! any machine. It is the inverse of [`super::firefox::to_json`]: every table, the
//! recording facts in `meta.extra`, and the symbol gaps come back as they were written.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use super::firefox::{
    CATEGORY_KERNEL, CATEGORY_OTHER, EXTRA_LOST_BY_THREAD, EXTRA_RECORDING, EXTRA_SYMBOLS,
    GAP_DEBUG_INFO, GAP_SYMBOLS, PROCESSED_PROFILE_VERSION,
};
use crate::profile::*;

/// Reads a profile file (plain or gzipped JSON).
pub fn read_profile(path: &Path) -> Result<Profile> {
    let value = super::read_json(path)?;
    from_json(&value).with_context(|| {
        format!(
            "{} is not a profile that sampler wrote (Firefox Profiler processed format)",
            path.display()
        )
    })
}

fn column<'a>(table: &'a Value, table_name: &str, name: &str) -> Result<&'a [Value]> {
    table[name]
        .as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| anyhow!("{table_name}.{name} is missing"))
}

fn index(v: &Value, what: &str, len: usize) -> Result<usize> {
    match v.as_u64() {
        Some(i) if (i as usize) < len => Ok(i as usize),
        _ => bail!("{what} = {v} is not an index below {len}"),
    }
}

/// An index column entry that may be null or -1 (none).
fn optional_index(v: &Value, what: &str, len: usize) -> Result<Option<usize>> {
    if v.is_null() || v.as_i64() == Some(-1) {
        Ok(None)
    } else {
        index(v, what, len).map(Some)
    }
}

fn entries<'a>(meta: &'a Value, label: &str) -> &'a [Value] {
    meta["extra"]
        .as_array()
        .and_then(|sections| sections.iter().find(|s| s["label"] == label))
        .and_then(|s| s["entries"].as_array())
        .map_or(&[], Vec::as_slice)
}

fn entry<'a>(meta: &'a Value, section: &str, label: &str) -> &'a Value {
    entries(meta, section)
        .iter()
        .find(|e| e["label"] == label)
        .map_or(&Value::Null, |e| &e["value"])
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
    (hex.len() % 2 == 0)
        .then(|| {
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
                .collect()
        })
        .flatten()
}

/// The profile in a processed-format JSON value.
pub fn from_json(p: &Value) -> Result<Profile> {
    let version = p["meta"]["preprocessedProfileVersion"].as_u64();
    if version != Some(u64::from(PROCESSED_PROFILE_VERSION)) {
        bail!(
            "meta.preprocessedProfileVersion is {}, sampler reads version {PROCESSED_PROFILE_VERSION}",
            version.map_or("missing".into(), |v| v.to_string())
        );
    }
    let meta = &p["meta"];
    let shared = &p["shared"];
    let strings: Vec<&str> = column(shared, "shared", "stringArray")?
        .iter()
        .map(|s| {
            s.as_str()
                .ok_or_else(|| anyhow!("a string is not a string"))
        })
        .collect::<Result<_>>()?;
    let string = |v: &Value, what: &str| -> Result<String> {
        Ok(strings[index(v, what, strings.len())?].to_string())
    };

    let libs: Vec<Lib> = p["libs"]
        .as_array()
        .ok_or_else(|| anyhow!("libs is missing"))?
        .iter()
        .map(|l| {
            let name = l["name"].as_str().unwrap_or_default().to_string();
            Lib {
                kind: lib_kind(&name),
                path: l["path"].as_str().unwrap_or_default().to_string(),
                build_id: l["codeId"].as_str().and_then(parse_build_id),
                base: 0,
                name,
            }
        })
        .collect();
    let lib_by_name: HashMap<&str, usize> = libs
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name.as_str(), i))
        .collect();

    // Resources are libraries, matched by name.
    let rt = &shared["resourceTable"];
    let resource_lib: Vec<Option<LibIndex>> = column(rt, "resourceTable", "name")?
        .iter()
        .map(|n| {
            let name = string(n, "resourceTable.name")?;
            Ok(lib_by_name.get(name.as_str()).map(|&i| LibIndex::new(i)))
        })
        .collect::<Result<_>>()?;

    let sources = &shared["sources"];
    let source_files: Vec<String> = column(sources, "sources", "filename")?
        .iter()
        .map(|f| string(f, "sources.filename"))
        .collect::<Result<_>>()?;

    let ft = &shared["funcTable"];
    let names = column(ft, "funcTable", "name")?;
    let resources = column(ft, "funcTable", "resource")?;
    let func_sources = column(ft, "funcTable", "source")?;
    let funcs: Vec<Func> = (0..names.len())
        .map(|i| {
            let resource = optional_index(&resources[i], "funcTable.resource", resource_lib.len())?;
            let source = optional_index(&func_sources[i], "funcTable.source", source_files.len())?;
            Ok(Func {
                name: string(&names[i], "funcTable.name")?,
                file: source.map(|s| source_files[s].clone()),
                lib: resource.and_then(|r| resource_lib[r]),
            })
        })
        .collect::<Result<_>>()?;

    let ns = &shared["nativeSymbols"];
    let ns_lib = column(ns, "nativeSymbols", "libIndex")?;
    let ns_address = column(ns, "nativeSymbols", "address")?;
    let ns_name = column(ns, "nativeSymbols", "name")?;
    let ns_size = column(ns, "nativeSymbols", "functionSize")?;
    let native_symbols: Vec<NativeSymbol> = (0..ns_lib.len())
        .map(|i| {
            Ok(NativeSymbol {
                lib: LibIndex::new(index(&ns_lib[i], "nativeSymbols.libIndex", libs.len())?),
                address: ns_address[i].as_u64().unwrap_or(0),
                size: ns_size[i].as_u64(),
                name: string(&ns_name[i], "nativeSymbols.name")?,
            })
        })
        .collect::<Result<_>>()?;

    let fr = &shared["frameTable"];
    let f_func = column(fr, "frameTable", "func")?;
    let f_lib = column(fr, "frameTable", "lib")?;
    let f_address = column(fr, "frameTable", "address")?;
    let f_depth = column(fr, "frameTable", "inlineDepth")?;
    let f_symbol = column(fr, "frameTable", "nativeSymbol")?;
    let f_line = column(fr, "frameTable", "line")?;
    let f_category = column(fr, "frameTable", "category")?;
    let frames: Vec<Frame> = (0..f_func.len())
        .map(|i| {
            let func = FuncIndex::new(index(&f_func[i], "frameTable.func", funcs.len())?);
            let kind = match f_category[i].as_u64().map(|c| c as u32) {
                Some(CATEGORY_KERNEL) => CodeKind::Kernel,
                Some(CATEGORY_OTHER) => CodeKind::Marker,
                _ => CodeKind::User,
            };
            Ok(Frame {
                func,
                lib: optional_index(&f_lib[i], "frameTable.lib", libs.len())?.map(LibIndex::new),
                address: f_address[i].as_u64(),
                inline_depth: f_depth[i].as_u64().unwrap_or(0) as u32,
                native_symbol: optional_index(
                    &f_symbol[i],
                    "frameTable.nativeSymbol",
                    native_symbols.len(),
                )?
                .map(NativeSymbolIndex::new),
                line: f_line[i].as_u64().map(|l| l as u32),
                kind,
            })
        })
        .collect::<Result<_>>()?;

    let st = &shared["stackTable"];
    let s_frame = column(st, "stackTable", "frame")?;
    let s_offset = column(st, "stackTable", "prefixOffset")?;
    let stacks: Vec<Stack> = (0..s_frame.len())
        .map(|i| {
            let offset = index(&s_offset[i], "stackTable.prefixOffset", i + 1)?;
            Ok(Stack {
                prefix: (offset > 0).then(|| StackIndex::new(i - offset)),
                frame: FrameIndex::new(index(&s_frame[i], "stackTable.frame", frames.len())?),
            })
        })
        .collect::<Result<_>>()?;

    let lost_by_thread: HashMap<String, u64> = entries(meta, EXTRA_LOST_BY_THREAD)
        .iter()
        .filter_map(|e| Some((e["label"].as_str()?.to_string(), e["value"].as_u64()?)))
        .collect();
    let mut processes: Vec<Process> = Vec::new();
    let mut process_by_pid: HashMap<String, ProcessIndex> = HashMap::new();
    let mut threads = Vec::new();
    for t in p["threads"]
        .as_array()
        .ok_or_else(|| anyhow!("threads is missing"))?
    {
        let pid_text = t["pid"].as_str().unwrap_or_default().to_string();
        let process = *process_by_pid.entry(pid_text.clone()).or_insert_with(|| {
            processes.push(Process {
                pid: pid_text.parse().unwrap_or(0),
                name: t["processName"].as_str().unwrap_or_default().to_string(),
                start_ms: t["processStartupTime"].as_f64().unwrap_or(0.0),
                end_ms: t["processShutdownTime"].as_f64(),
            });
            ProcessIndex::new(processes.len() - 1)
        });
        let samples = &t["samples"];
        let stack_col = column(samples, "samples", "stack")?;
        let times: Vec<f64> = match samples["time"].as_array() {
            Some(times) => times.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect(),
            None => column(samples, "samples", "timeDeltas")?
                .iter()
                .scan(0.0, |at, d| {
                    *at += d.as_f64().unwrap_or(0.0);
                    Some(*at)
                })
                .collect(),
        };
        let weights = samples["weight"].as_array();
        let mut rows = Vec::with_capacity(stack_col.len());
        for (i, s) in stack_col.iter().enumerate() {
            // A sample without a stack has nothing a call tree or export could show.
            let Some(stack) = optional_index(s, "samples.stack", stacks.len())? else {
                continue;
            };
            rows.push(SampleRow {
                time_ms: times.get(i).copied().unwrap_or(0.0),
                stack: StackIndex::new(stack),
                weight: weights
                    .and_then(|w| w.get(i))
                    .and_then(Value::as_u64)
                    .map_or(1, |w| w as u32),
            });
        }
        let name = t["name"].as_str().unwrap_or_default().to_string();
        let tid = t["tid"]
            .as_i64()
            .or_else(|| t["tid"].as_str().and_then(|s| s.parse().ok()))
            .unwrap_or(0) as i32;
        threads.push(Thread {
            lost_samples: lost_by_thread
                .get(&format!("{name} ({tid})"))
                .copied()
                .unwrap_or(0),
            tid,
            process,
            name,
            is_main: t["isMainThread"].as_bool().unwrap_or(false),
            start_ms: t["registerTime"].as_f64().unwrap_or(0.0),
            end_ms: t["unregisterTime"].as_f64(),
            samples: rows,
        });
    }

    let symbol_gaps = entries(meta, EXTRA_SYMBOLS)
        .iter()
        .filter_map(|e| {
            let lib = *lib_by_name.get(e["label"].as_str()?)?;
            let value = e["value"].as_str()?;
            let (missing, why) = if let Some(why) = value.strip_prefix(GAP_SYMBOLS) {
                (Missing::Symbols, why)
            } else {
                (Missing::DebugInfo, value.strip_prefix(GAP_DEBUG_INFO)?)
            };
            Some(SymbolGap {
                lib: LibIndex::new(lib),
                missing,
                why: why.trim_start_matches(": ").to_string(),
            })
        })
        .collect();

    let command = meta["arguments"].as_str().unwrap_or_default();
    let recording = |label: &str| entry(meta, EXTRA_RECORDING, label);
    let meta = Meta {
        start_unix_ms: meta["startTime"].as_f64().unwrap_or(0.0),
        interval_ms: meta["interval"].as_f64().unwrap_or(1.0),
        duration_ms: meta["profilingEndTime"].as_f64().unwrap_or(0.0),
        event: recording("Event").as_str().unwrap_or("unknown").to_string(),
        frequency_hz: recording("Frequency (Hz)").as_u64().unwrap_or(0),
        command: command.split_whitespace().map(str::to_string).collect(),
        lost_samples: recording("Lost samples").as_u64().unwrap_or(0),
        throttled: recording("Throttled").as_u64().unwrap_or(0),
        kernel_included: recording("Kernel frames") == "yes",
        truncated_stacks: recording("Truncated stacks").as_u64().unwrap_or(0),
        restored_callers: recording("Restored callers").as_u64().unwrap_or(0),
    };
    Ok(Profile {
        meta,
        libs,
        funcs,
        native_symbols,
        frames,
        stacks,
        processes,
        threads,
        symbol_gaps,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A profile that uses every part of the format: libraries of each kind, files,
    /// native symbols and inline depths, kernel and marker frames, two processes, sample
    /// weights, lost samples and symbol gaps.
    pub(crate) fn rich_profile() -> Profile {
        let mut p = Profile::from_named_stacks(&[
            &[
                "[truncated]",
                "main",
                "work",
                "level1",
                "[kernel] do_syscall_64",
            ],
            &["main", "work", "level1"],
            &["main", "work"],
        ]);
        for (name, kind) in [
            ("app", LibKind::File),
            (KERNEL_LIB_NAME, LibKind::Kernel),
            (VDSO_NAME, LibKind::File),
            ("perf-42.map", LibKind::PerfMap),
        ] {
            p.libs.push(Lib {
                name: name.into(),
                path: format!("/x/{name}"),
                build_id: (kind == LibKind::File).then(|| vec![0xab, 0x01, 0xff]),
                kind,
                base: 0,
            });
        }
        p.native_symbols.push(NativeSymbol {
            lib: LibIndex(0),
            address: 0x1000,
            size: Some(64),
            name: "work".into(),
        });
        for f in &mut p.funcs {
            match f.name.as_str() {
                "main" | "work" | "level1" => {
                    f.lib = Some(LibIndex(0));
                    f.file = Some("/src/app.c".into());
                }
                "[kernel] do_syscall_64" => f.lib = Some(LibIndex(1)),
                _ => {}
            }
        }
        for fr in &mut p.frames {
            let func = &p.funcs[fr.func.index()];
            fr.lib = func.lib;
            match func.name.as_str() {
                "[truncated]" => fr.kind = CodeKind::Marker,
                "[kernel] do_syscall_64" => {
                    fr.kind = CodeKind::Kernel;
                    fr.address = Some(0x77);
                }
                "work" => {
                    fr.address = Some(0x1010);
                    fr.native_symbol = Some(NativeSymbolIndex(0));
                    fr.line = Some(12);
                }
                "level1" => {
                    fr.address = Some(0x1010);
                    fr.native_symbol = Some(NativeSymbolIndex(0));
                    fr.inline_depth = 1;
                    fr.line = Some(3);
                }
                _ => fr.address = Some(0x2000),
            }
        }
        p.threads[0].samples[1].weight = 3;
        p.threads[0].lost_samples = 7;
        let mut other = p.threads[0].clone();
        other.tid = 99;
        other.name = "worker".into();
        other.is_main = false;
        other.process = ProcessIndex(1);
        other.end_ms = Some(2.5);
        p.threads.push(other);
        p.processes.push(Process {
            pid: 99,
            name: "child".into(),
            start_ms: 1.0,
            end_ms: Some(3.0),
        });
        p.symbol_gaps = vec![
            SymbolGap {
                lib: LibIndex(3),
                missing: Missing::Symbols,
                why: "JIT code, but no /tmp/perf-42.map was written".into(),
            },
            SymbolGap {
                lib: LibIndex(0),
                missing: Missing::DebugInfo,
                why: "no DWARF".into(),
            },
        ];
        p.meta = Meta {
            start_unix_ms: 1.7e12,
            interval_ms: 0.5,
            duration_ms: 3.0,
            event: "cpu-clock".into(),
            frequency_hz: 2000,
            command: vec!["app".into(), "-n".into(), "3".into()],
            lost_samples: 14,
            throttled: 2,
            kernel_included: true,
            truncated_stacks: 2,
            restored_callers: 1,
        };
        p
    }

    #[test]
    fn reads_back_what_the_writer_wrote() {
        let p = rich_profile();
        let back = from_json(&super::super::firefox::to_json(&p)).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn refuses_other_versions_and_broken_indexes() {
        let mut v = super::super::firefox::to_json(&rich_profile());
        v["meta"]["preprocessedProfileVersion"] = 55.into();
        let err = from_json(&v).unwrap_err().to_string();
        assert!(err.contains("is 55, sampler reads version 70"), "{err}");
        let mut v = super::super::firefox::to_json(&rich_profile());
        v["shared"]["stackTable"]["frame"][0] = 1000.into();
        let err = from_json(&v).unwrap_err().to_string();
        assert!(err.contains("stackTable.frame = 1000"), "{err}");
    }
}
