//! The Firefox Profiler's processed format, version 70 (facts in
//! `shared/firefox-format.md` §4–5): shared struct-of-arrays tables, one thread entry per
//! thread, symbols embedded so that the viewer never asks a symbol server, and inline
//! frames linked outer-first with their native symbol so they get the "(inlined)" badge.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::profile::{CodeKind, Lib, Missing, Profile};

/// `PROCESSED_PROFILE_VERSION` of the Firefox Profiler this writer targets.
pub const PROCESSED_PROFILE_VERSION: u32 = 70;
/// `meta.version` is the Gecko format version; processed files ignore it, samply writes 24.
const GECKO_VERSION: u32 = 24;

/// Category indexes in `meta.categories`.
pub const CATEGORY_OTHER: u32 = 0;
pub const CATEGORY_USER: u32 = 1;
pub const CATEGORY_KERNEL: u32 = 2;

/// Labels of the `meta.extra` sections (the profile's info panel), which
/// [`super::load`] reads back.
pub const EXTRA_RECORDING: &str = "Recording";
pub const EXTRA_SYMBOLS: &str = "Symbols";
pub const EXTRA_LOST_BY_THREAD: &str = "Lost samples by thread";
/// How a symbol gap entry starts, by what the library lacks.
pub const GAP_SYMBOLS: &str = "some frames unnamed";
pub const GAP_DEBUG_INFO: &str = "no source lines or inlined calls";

/// Strings are stored once, in `shared.stringArray`.
#[derive(Default)]
struct Strings {
    list: Vec<String>,
    index: HashMap<String, usize>,
}

impl Strings {
    fn get(&mut self, s: &str) -> usize {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), self.list.len() - 1);
        self.list.len() - 1
    }
}

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
fn symbol_gap_entries(profile: &Profile) -> Vec<Value> {
    profile
        .symbol_gaps
        .iter()
        .map(|g| {
            let what = match g.missing {
                Missing::Symbols => GAP_SYMBOLS,
                Missing::DebugInfo => GAP_DEBUG_INFO,
            };
            json!({
                "label": profile.libs[g.lib.index()].name,
                "format": "string",
                "value": format!("{what}: {}", g.why),
            })
        })
        .collect()
}

fn lib_json(lib: &Lib) -> Value {
    let (breakpad, code_id) = match &lib.build_id {
        Some(id) => (
            breakpad_id(id),
            Value::String(id.iter().map(|b| format!("{b:02x}")).collect()),
        ),
        None => ("0".repeat(33), Value::Null),
    };
    json!({
        "arch": "x86_64",
        "name": lib.name,
        "path": lib.path,
        "debugName": lib.name,
        "debugPath": lib.path,
        "breakpadId": breakpad,
        "codeId": code_id,
    })
}

fn category(kind: CodeKind) -> u32 {
    match kind {
        CodeKind::User => CATEGORY_USER,
        CodeKind::Kernel => CATEGORY_KERNEL,
        CodeKind::Marker => CATEGORY_OTHER,
    }
}

/// The profile as a processed-format JSON value.
pub fn to_json(profile: &Profile) -> Value {
    let mut strings = Strings::default();

    // One resource per library, in library order.
    let resource_name: Vec<usize> = profile.libs.iter().map(|l| strings.get(&l.name)).collect();
    let resource_count = profile.libs.len();

    let mut source_index: HashMap<&str, usize> = HashMap::new();
    let mut source_files: Vec<usize> = Vec::new();
    let mut func_name = Vec::new();
    let mut func_resource = Vec::new();
    let mut func_source = Vec::new();
    for f in &profile.funcs {
        func_name.push(strings.get(&f.name));
        func_resource.push(f.lib.map_or(-1, |l| l.index() as i64));
        func_source.push(f.file.as_deref().map(|file| {
            *source_index.entry(file).or_insert_with(|| {
                source_files.push(strings.get(file));
                source_files.len() - 1
            })
        }));
    }
    let funcs_len = profile.funcs.len();

    let frames = &profile.frames;
    let frame_table = json!({
        "address": frames.iter().map(|f| f.address.map_or(-1, |a| a as i64)).collect::<Vec<_>>(),
        "lib": frames.iter().map(|f| f.lib.map_or(-1, |l| l.index() as i64)).collect::<Vec<_>>(),
        "inlineDepth": frames.iter().map(|f| f.inline_depth).collect::<Vec<_>>(),
        "category": frames.iter().map(|f| category(f.kind)).collect::<Vec<_>>(),
        "subcategory": frames.iter().map(|_| 0).collect::<Vec<_>>(),
        "func": frames.iter().map(|f| f.func.index()).collect::<Vec<_>>(),
        "nativeSymbol": frames.iter().map(|f| f.native_symbol.map(|n| n.index())).collect::<Vec<_>>(),
        "innerWindowID": frames.iter().map(|_| 0).collect::<Vec<_>>(),
        "line": frames.iter().map(|f| f.line).collect::<Vec<_>>(),
        "column": frames.iter().map(|_| Value::Null).collect::<Vec<_>>(),
        "originalLocation": frames.iter().map(|_| Value::Null).collect::<Vec<_>>(),
        "length": frames.len(),
    });

    let stacks = &profile.stacks;
    let stack_table = json!({
        "frame": stacks.iter().map(|s| s.frame.index()).collect::<Vec<_>>(),
        "prefixOffset": stacks.iter().enumerate().map(|(i, s)| s.prefix.map_or(0, |p| i - p.index())).collect::<Vec<_>>(),
        "length": stacks.len(),
    });

    let syms = &profile.native_symbols;
    let native_symbols = json!({
        "libIndex": syms.iter().map(|s| s.lib.index()).collect::<Vec<_>>(),
        "address": syms.iter().map(|s| s.address).collect::<Vec<_>>(),
        "name": syms.iter().map(|s| strings.get(&s.name)).collect::<Vec<_>>(),
        "functionSize": syms.iter().map(|s| s.size).collect::<Vec<_>>(),
        "length": syms.len(),
    });

    let threads: Vec<Value> = profile
        .threads
        .iter()
        .map(|t| {
            let process = &profile.processes[t.process.index()];
            let n = t.samples.len();
            json!({
                "processType": "default",
                "processStartupTime": process.start_ms,
                "processShutdownTime": process.end_ms,
                "registerTime": t.start_ms,
                "unregisterTime": t.end_ms,
                "pausedRanges": [],
                "name": t.name,
                "isMainThread": t.is_main,
                "processName": process.name,
                "pid": process.pid.to_string(),
                "tid": t.tid,
                "samples": {
                    "stack": t.samples.iter().map(|s| s.stack.index()).collect::<Vec<_>>(),
                    "time": t.samples.iter().map(|s| s.time_ms).collect::<Vec<_>>(),
                    "weight": if t.samples.iter().all(|s| s.weight == 1) {
                        Value::Null
                    } else {
                        json!(t.samples.iter().map(|s| s.weight).collect::<Vec<_>>())
                    },
                    "weightType": "samples",
                    "length": n,
                },
                "markers": {
                    "data": [], "name": [], "startTime": [], "endTime": [], "phase": [], "category": [],
                    "length": 0,
                },
            })
        })
        .collect();

    let func_table = json!({
        "name": func_name,
        "isJS": vec![false; funcs_len],
        "relevantForJS": vec![false; funcs_len],
        "resource": func_resource,
        "source": func_source,
        "lineNumber": vec![Value::Null; funcs_len],
        "columnNumber": vec![Value::Null; funcs_len],
        "originalLocation": vec![Value::Null; funcs_len],
        "length": funcs_len,
    });
    let resource_table = json!({
        "name": resource_name,
        "host": vec![Value::Null; resource_count],
        "type": vec![1; resource_count],
        "length": resource_count,
    });
    let sources = json!({
        "id": vec![Value::Null; source_files.len()],
        "filename": source_files,
        "startLine": vec![1; source_files.len()],
        "startColumn": vec![1; source_files.len()],
        "sourceMapURL": vec![Value::Null; source_files.len()],
        "content": vec![Value::Null; source_files.len()],
        "length": source_files.len(),
    });

    let meta = &profile.meta;
    let command = meta.command.join(" ");
    json!({
        "meta": {
            "interval": meta.interval_ms,
            "startTime": meta.start_unix_ms,
            "endTime": meta.start_unix_ms + meta.duration_ms,
            "profilingStartTime": 0.0,
            "profilingEndTime": meta.duration_ms,
            "processType": 0,
            "product": if command.is_empty() { "sampler".to_string() } else { format!("sampler: {command}") },
            "stackwalk": 1,
            "version": GECKO_VERSION,
            "preprocessedProfileVersion": PROCESSED_PROFILE_VERSION,
            "symbolicated": true,
            "platform": "Linux",
            "oscpu": "Linux x86_64",
            "logicalCPUs": std::thread::available_parallelism().map_or(1, |n| n.get()),
            "arguments": command,
            "importedFrom": "sampler",
            "usesOnlyOneStackType": true,
            "sourceCodeIsNotOnSearchfox": true,
            "keepProfileThreadOrder": true,
            "sampleUnits": { "time": "ms", "eventDelay": "ms", "threadCPUDelta": "ns" },
            "categories": [
                { "name": "Other", "color": "grey", "subcategories": ["Other"] },
                { "name": "User", "color": "yellow", "subcategories": ["Other"] },
                { "name": "Kernel", "color": "orange", "subcategories": ["Other"] },
            ],
            "markerSchema": [],
            "extra": [{
                "label": EXTRA_RECORDING,
                "entries": [
                    { "label": "Event", "format": "string", "value": meta.event },
                    { "label": "Frequency (Hz)", "format": "integer", "value": meta.frequency_hz },
                    { "label": "Lost samples", "format": "integer", "value": meta.lost_samples },
                    { "label": "Truncated stacks", "format": "integer", "value": meta.truncated_stacks },
                    { "label": "Restored callers", "format": "integer", "value": meta.restored_callers },
                    { "label": "Throttled", "format": "integer", "value": meta.throttled },
                    { "label": "Kernel frames", "format": "string", "value": if meta.kernel_included { "yes" } else { "no" } },
                ],
            }, {
                "label": EXTRA_SYMBOLS,
                "entries": symbol_gap_entries(profile),
            }, {
                "label": EXTRA_LOST_BY_THREAD,
                "entries": profile.threads.iter().filter(|t| t.lost_samples > 0).map(|t| json!({
                    "label": format!("{} ({})", t.name, t.tid),
                    "format": "integer",
                    "value": t.lost_samples,
                })).collect::<Vec<_>>(),
            }],
        },
        "libs": profile.libs.iter().map(lib_json).collect::<Vec<_>>(),
        "shared": {
            "stringArray": strings.list,
            "stackTable": stack_table,
            "frameTable": frame_table,
            "funcTable": func_table,
            "resourceTable": resource_table,
            "nativeSymbols": native_symbols,
            "sources": sources,
            "sourceLocationTable": { "source": [], "line": [], "column": [], "length": 0 },
        },
        "threads": threads,
    })
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
