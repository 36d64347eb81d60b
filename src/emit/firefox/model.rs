//! The Firefox Profiler's processed format, version 70, as sampler writes and reads it:
//! the typed serde structs (their field names are the format's column names), and every
//! name and label the format gives a meaning to — category indexes and names, weight
//! types, the `meta.extra` sections and their labels — spelled once, for the writer
//! ([`super::to_processed`]) and the reader ([`super::from_processed`]) alike. Facts in
//! `docs/firefox-format.md` §4–5. Tables are structs of arrays with a `length`; a reader
//! must still check that every column has that length and every index is in range, which
//! the types alone cannot say ([`Table::columns`] lists what to check).

use serde::{Deserialize, Serialize};

use crate::profile::OffCpuKind;

/// `PROCESSED_PROFILE_VERSION` of the Firefox Profiler this format is.
pub const PROCESSED_PROFILE_VERSION: u32 = 70;

/// `meta.version` is the Gecko format version; processed files ignore it, samply writes 24.
pub const GECKO_VERSION: u32 = 24;

/// Category indexes in `meta.categories`.
pub const CATEGORY_OTHER: u32 = 0;
pub const CATEGORY_USER: u32 = 1;
pub const CATEGORY_KERNEL: u32 = 2;
/// Off-CPU time (profiles recorded with `--off-cpu` only): every frame of an off-CPU
/// stack has it, so that the profiler's category filter leaves on-CPU time alone.
/// Its subcategories are the [`OffCpuKind`]s, at their [`OffCpuKind::index`].
pub const CATEGORY_OFF_CPU: u32 = 3;

/// The categories every profile has, as (name, color), in the order of their indexes
/// ([`CATEGORY_OTHER`], [`CATEGORY_USER`], [`CATEGORY_KERNEL`]).
pub const CATEGORIES: [(&str, &str); 3] =
    [("Other", "grey"), ("User", "yellow"), ("Kernel", "orange")];
/// The one subcategory of the categories above.
pub const SUBCATEGORY_OTHER: &str = "Other";
/// The name and color of the [`CATEGORY_OFF_CPU`] category.
pub const CATEGORY_OFF_CPU_NAME: &str = "Off-CPU";
pub const CATEGORY_OFF_CPU_COLOR: &str = "blue";

/// The name of an Off-CPU subcategory.
pub fn off_cpu_subcategory_name(kind: OffCpuKind) -> &'static str {
    match kind {
        OffCpuKind::Blocked => "Blocked",
        OffCpuKind::Preempted => "Preempted",
    }
}

/// `samples.weightType` of a profile without off-CPU time: every row weighs samples.
pub const WEIGHT_SAMPLES: &str = "samples";
/// `samples.weightType` of a profile with off-CPU time: every row weighs milliseconds.
pub const WEIGHT_TRACING_MS: &str = "tracing-ms";

/// Labels of the `meta.extra` sections (the profile's info panel), which sampler also
/// reads back.
pub const EXTRA_RECORDING: &str = "Recording";
pub const EXTRA_SYMBOLS: &str = "Symbols";
pub const EXTRA_LOST_BY_THREAD: &str = "Lost samples by thread";
/// How a symbol gap entry starts, by what the library lacks.
pub const GAP_SYMBOLS: &str = "some frames unnamed";
pub const GAP_DEBUG_INFO: &str = "no source lines or inlined calls";

/// Labels of the recording facts in the [`EXTRA_RECORDING`] section of `meta.extra`.
pub const RECORDING_EVENT: &str = "Event";
pub const RECORDING_FREQUENCY: &str = "Frequency (Hz)";
/// The events per sample: a number, or [`PERIOD_VARIES`].
pub const RECORDING_PERIOD: &str = "Period (events per sample)";
/// The period's value when the kernel varied it: sample weights are then event counts.
pub const PERIOD_VARIES: &str = "varied: weights are event counts";
pub const RECORDING_LOST: &str = "Lost samples";
pub const RECORDING_TRUNCATED: &str = "Truncated stacks";
pub const RECORDING_RESTORED: &str = "Restored callers";
pub const RECORDING_THROTTLED: &str = "Throttled";
/// Whether kernel frames were recorded: [`KERNEL_YES`] or [`KERNEL_NO`].
pub const RECORDING_KERNEL: &str = "Kernel frames";
pub const KERNEL_YES: &str = "yes";
pub const KERNEL_NO: &str = "no";

/// A table of the format: a struct of arrays whose columns all have its `length`.
pub trait Table {
    /// The table's name in the file, as errors name it.
    const NAME: &'static str;
    /// The number of rows.
    fn length(&self) -> usize;
    /// Each column's name in the file and its length, in the order they are checked.
    fn columns(&self) -> Vec<(&'static str, usize)>;
}

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

impl Meta {
    /// The entries of the `meta.extra` section labelled `label` (none when it is missing).
    pub fn section(&self, label: &str) -> &[ExtraEntry] {
        self.extra
            .iter()
            .find(|s| s.label == label)
            .map_or(&[], |s| s.entries.as_slice())
    }

    /// The value of entry `label` of section `section_label`; null when either is missing.
    pub fn entry(&self, section_label: &str, label: &str) -> &serde_json::Value {
        self.section(section_label)
            .iter()
            .find(|e| e.label == label)
            .map_or(&serde_json::Value::Null, |e| &e.value)
    }
}

impl ExtraEntry {
    /// An entry shown as a number.
    pub fn integer(label: &str, value: u64) -> ExtraEntry {
        ExtraEntry {
            label: label.into(),
            format: "integer".into(),
            value: value.into(),
        }
    }

    /// An entry shown as text.
    pub fn text(label: &str, value: &str) -> ExtraEntry {
        ExtraEntry {
            label: label.into(),
            format: "string".into(),
            value: value.into(),
        }
    }
}

/// Implements [`Table`] for `$table`, named `$name` in the file, whose columns sampler
/// reads are `$column` (the name in the file) in field `$field`, checked in that order.
macro_rules! table {
    ($table:ident, $name:literal, $($column:literal: $field:ident),+) => {
        impl Table for $table {
            const NAME: &'static str = $name;
            fn length(&self) -> usize {
                self.length
            }
            fn columns(&self) -> Vec<(&'static str, usize)> {
                vec![$(($column, self.$field.len())),+]
            }
        }
    };
}

table!(ResourceTable, "resourceTable", "name": name, "host": host, "type": kind);
table!(Sources, "sources", "filename": filename);
table!(FuncTable, "funcTable", "name": name, "resource": resource, "source": source);
table!(
    NativeSymbols,
    "nativeSymbols",
    "libIndex": lib_index,
    "address": address,
    "name": name,
    "functionSize": function_size
);
// `subcategory` is read where present: a missing one counts as none.
table!(
    FrameTable,
    "frameTable",
    "address": address,
    "lib": lib,
    "inlineDepth": inline_depth,
    "category": category,
    "func": func,
    "nativeSymbol": native_symbol,
    "line": line
);
table!(StackTable, "stackTable", "frame": frame, "prefixOffset": prefix_offset);

impl Samples {
    /// The columns sampler reads back (a thread's table has no name of its own: errors
    /// name it `threads[N].samples`); `weight` only where it is written.
    pub fn columns(&self) -> Vec<(&'static str, usize)> {
        let mut columns = vec![("stack", self.stack.len()), ("time", self.time.len())];
        if let Some(w) = &self.weight {
            columns.push(("weight", w.len()));
        }
        columns
    }
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
