//! The Firefox Profiler's processed format, version 70, as typed serde structs: the part
//! of it sampler writes, spelled once, used by the writer ([`super::firefox`]) and the
//! reader ([`super::load`]) alike. Facts in `docs/firefox-format.md` §4–5. Tables are
//! structs of arrays with a `length`; a reader must still check that every column has
//! that length and every index is in range, which the types alone cannot say.

use serde::{Deserialize, Serialize};

/// `PROCESSED_PROFILE_VERSION` of the Firefox Profiler this format is.
pub const PROCESSED_PROFILE_VERSION: u32 = 70;

/// A whole processed profile.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessedProfile {
    pub meta: Meta,
    pub libs: Vec<Lib>,
    pub shared: Shared,
    pub threads: Vec<Thread>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    pub interval: f64,
    pub start_time: f64,
    #[serde(default)]
    pub end_time: f64,
    #[serde(default)]
    pub profiling_start_time: f64,
    #[serde(default)]
    pub profiling_end_time: f64,
    #[serde(default)]
    pub process_type: u32,
    #[serde(default)]
    pub product: String,
    #[serde(default)]
    pub stackwalk: u32,
    #[serde(default)]
    pub version: u32,
    pub preprocessed_profile_version: u32,
    #[serde(default)]
    pub symbolicated: bool,
    #[serde(default)]
    pub platform: String,
    #[serde(default)]
    pub oscpu: String,
    #[serde(rename = "logicalCPUs", default)]
    pub logical_cpus: u32,
    /// The command line, as a shell would read it back (see [`quote_command`]).
    #[serde(default)]
    pub arguments: String,
    #[serde(default)]
    pub imported_from: String,
    #[serde(default)]
    pub uses_only_one_stack_type: bool,
    #[serde(default)]
    pub source_code_is_not_on_searchfox: bool,
    #[serde(default)]
    pub keep_profile_thread_order: bool,
    #[serde(default)]
    pub sample_units: SampleUnits,
    #[serde(default)]
    pub categories: Vec<Category>,
    #[serde(default)]
    pub marker_schema: Vec<serde_json::Value>,
    /// Sections of the profile's info panel, which sampler also reads back.
    #[serde(default)]
    pub extra: Vec<ExtraSection>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SampleUnits {
    pub time: String,
    pub event_delay: String,
    #[serde(rename = "threadCPUDelta")]
    pub thread_cpu_delta: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Category {
    pub name: String,
    pub color: String,
    pub subcategories: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ExtraSection {
    pub label: String,
    pub entries: Vec<ExtraEntry>,
}

/// One line of the info panel: `format` is "string" or "integer", as `value` is.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExtraEntry {
    pub label: String,
    pub format: String,
    pub value: serde_json::Value,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Lib {
    pub arch: String,
    pub name: String,
    pub path: String,
    pub debug_name: String,
    pub debug_path: String,
    pub breakpad_id: String,
    /// The ELF build ID in hex, when known.
    pub code_id: Option<String>,
}

/// The tables all threads share.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Shared {
    pub string_array: Vec<String>,
    pub stack_table: StackTable,
    pub frame_table: FrameTable,
    pub func_table: FuncTable,
    pub resource_table: ResourceTable,
    pub native_symbols: NativeSymbols,
    pub sources: Sources,
    #[serde(default)]
    pub source_location_table: SourceLocationTable,
}

/// Stacks as (frame, prefix): a stack's prefix is `prefixOffset` rows before it (0: a
/// root), so prefixes always come first.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StackTable {
    pub frame: Vec<u32>,
    pub prefix_offset: Vec<u32>,
    pub length: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FrameTable {
    /// Library-relative address, -1 where there is none.
    pub address: Vec<i64>,
    /// Index into `libs`, -1 where there is none.
    pub lib: Vec<i64>,
    pub inline_depth: Vec<u32>,
    pub category: Vec<Option<u32>>,
    pub subcategory: Vec<Option<u32>>,
    pub func: Vec<u32>,
    pub native_symbol: Vec<Option<u32>>,
    #[serde(rename = "innerWindowID")]
    pub inner_window_id: Vec<Option<u64>>,
    pub line: Vec<Option<u32>>,
    pub column: Vec<Option<u32>>,
    pub original_location: Vec<Option<u32>>,
    pub length: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FuncTable {
    /// Index into `stringArray`.
    pub name: Vec<u32>,
    #[serde(rename = "isJS")]
    pub is_js: Vec<bool>,
    #[serde(rename = "relevantForJS")]
    pub relevant_for_js: Vec<bool>,
    /// Index into `resourceTable`, -1 where there is none.
    pub resource: Vec<i64>,
    /// Index into `sources`.
    pub source: Vec<Option<u32>>,
    pub line_number: Vec<Option<u32>>,
    pub column_number: Vec<Option<u32>>,
    pub original_location: Vec<Option<u32>>,
    pub length: usize,
}

/// One resource per library.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ResourceTable {
    pub name: Vec<u32>,
    pub host: Vec<Option<u32>>,
    /// 1: a library.
    #[serde(rename = "type")]
    pub kind: Vec<u32>,
    pub length: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NativeSymbols {
    pub lib_index: Vec<u32>,
    pub address: Vec<u64>,
    pub name: Vec<u32>,
    pub function_size: Vec<Option<u64>>,
    pub length: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Sources {
    pub id: Vec<Option<String>>,
    /// Index into `stringArray`.
    pub filename: Vec<u32>,
    pub start_line: Vec<u32>,
    pub start_column: Vec<u32>,
    #[serde(rename = "sourceMapURL")]
    pub source_map_url: Vec<Option<String>>,
    pub content: Vec<Option<String>>,
    pub length: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SourceLocationTable {
    pub source: Vec<u32>,
    pub line: Vec<u32>,
    pub column: Vec<u32>,
    pub length: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Thread {
    pub process_type: String,
    pub process_startup_time: f64,
    pub process_shutdown_time: Option<f64>,
    pub register_time: f64,
    pub unregister_time: Option<f64>,
    pub paused_ranges: Vec<serde_json::Value>,
    pub name: String,
    pub is_main_thread: bool,
    pub process_name: String,
    /// The pid, as a string (the profiler's type).
    pub pid: String,
    pub tid: i64,
    pub samples: Samples,
    pub markers: Markers,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Samples {
    /// Index into `stackTable`; null for a sample without a stack.
    pub stack: Vec<Option<u32>>,
    pub time: Vec<f64>,
    /// Null when every sample weighs 1; in `weightType` units (samples, or milliseconds
    /// for `tracing-ms`).
    pub weight: Option<Vec<f64>>,
    pub weight_type: String,
    /// CPU time of the thread since the sample before, in `meta.sampleUnits`'s unit
    /// (ns); what the thread's CPU usage graph is drawn from. Written for profiles with
    /// off-CPU time, whose rows are not all time on the CPU.
    #[serde(
        rename = "threadCPUDelta",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub thread_cpu_delta: Option<Vec<Option<u64>>>,
    pub length: usize,
}

/// sampler writes no markers; the profiler needs the empty table.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Markers {
    pub data: Vec<serde_json::Value>,
    pub name: Vec<u32>,
    pub start_time: Vec<Option<f64>>,
    pub end_time: Vec<Option<f64>>,
    pub phase: Vec<u32>,
    pub category: Vec<u32>,
    pub length: usize,
}

/// A command line as one string that splits back into the same words with
/// [`split_command`]: a word with anything but `[A-Za-z0-9_@%+=:,./-]` is put in single
/// quotes, a quote inside it as `'\''`, as a POSIX shell reads it.
pub fn quote_command(words: &[String]) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    words
        .iter()
        .map(|w| {
            if !w.is_empty() && w.chars().all(safe) {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The words of a command line written by [`quote_command`] (or typed as a shell would
/// read it: single and double quotes, backslash escapes).
pub fn split_command(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                w.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => w.extend(chars.next()),
                        c => w.push(c),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_round_trip_exactly() {
        let words: Vec<String> = [
            "sh",
            "-c",
            "exit 42",
            "it's",
            "",
            "a\"b",
            "tab\there",
            "x=1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let line = quote_command(&words);
        assert_eq!(line, r#"sh -c 'exit 42' 'it'\''s' '' 'a"b' 'tab	here' x=1"#);
        assert_eq!(split_command(&line), words);
        assert_eq!(
            split_command(r#"a "b c" d\ e"#),
            vec!["a".to_string(), "b c".into(), "d e".into()]
        );
    }
}
