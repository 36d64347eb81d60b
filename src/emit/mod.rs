//! Outputs: every format is written from the same symbolicated [`Profile`], so all of them
//! agree on every count. [`load`] reads sampler's own Firefox Profiler files back (through
//! [`firefox`]'s reader), so that `report` and `convert` start from the file alone.

pub mod diff;
pub mod firefox;
pub mod folded;
#[cfg(test)]
mod golden;
pub mod load;
pub mod otlp;
pub mod pprof;
pub mod push;
pub mod report;
pub mod speedscope;
pub mod spool;
pub mod svg;

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};

use flate2::write::GzEncoder;

use crate::files::output;
use crate::profile::{FuncIndex, Profile, StackIndex, Thread, TimeView, WeightUnit};

/// The formats a profile can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Firefox Profiler processed format (gzip when the name ends in `.gz`).
    Firefox,
    /// Brendan Gregg's folded stacks: `a;b;c 42`.
    Folded,
    /// speedscope's file format, one sampled profile per thread.
    Speedscope,
    /// gzipped pprof `profile.proto`.
    Pprof,
    /// A flame graph as a self-contained SVG.
    Svg,
    /// An OTLP profiles export request (binary protobuf), see [`otlp`].
    Otlp,
}

impl Format {
    /// The format's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Firefox => "firefox",
            Format::Folded => "folded",
            Format::Speedscope => "speedscope",
            Format::Pprof => "pprof",
            Format::Svg => "svg",
            Format::Otlp => "otlp",
        }
    }

    /// The output name used when none is given.
    pub fn default_output(self) -> &'static str {
        match self {
            Format::Firefox => "profile.json.gz",
            Format::Folded => "profile.folded",
            Format::Speedscope => "profile.speedscope.json",
            Format::Pprof => "profile.pb.gz",
            Format::Svg => "profile.svg",
            Format::Otlp => "profile.otlp",
        }
    }

    /// The format an output name implies, where it implies one.
    pub fn from_output_name(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        [
            (".speedscope.json", Format::Speedscope),
            (".folded", Format::Folded),
            (".collapsed", Format::Folded),
            (".pb.gz", Format::Pprof),
            (".pprof", Format::Pprof),
            (".svg", Format::Svg),
            (".otlp", Format::Otlp),
            (".json", Format::Firefox),
            (".json.gz", Format::Firefox),
        ]
        .into_iter()
        .find(|(ending, _)| name.ends_with(ending))
        .map(|(_, f)| f)
    }
}

/// Choices that some formats offer.
#[derive(Clone, Debug, Default)]
pub struct ExportOptions {
    /// Folded stacks and flame graphs: start every stack with its process and thread
    /// (`name (pid)`, `name (tid)`), so threads stay apart.
    pub thread_roots: bool,
    /// Folded stacks, speedscope and flame graphs: which time they carry; `None`: the
    /// profile's default (see [`TimeView::default_for`]). pprof and Firefox carry both.
    pub time: Option<TimeView>,
    /// OTLP: the profile was recorded by this run, so the containers of its processes
    /// can be read (see [`otlp::to_request`]); not for a profile read from a file.
    pub just_recorded: bool,
}

/// Writes `profile` in `format` at `path`, atomically (see [`output`]): a new file in the
/// same directory, renamed over `path` only when complete, and given to `owner`.
pub fn write(
    profile: &Profile,
    format: Format,
    opts: &ExportOptions,
    path: &Path,
    owner: Option<output::SudoUser>,
) -> Result<()> {
    let mut file = output::AtomicFile::create(path)?;
    write_to(profile, format, opts, path, &mut file)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.commit(owner)
}

/// Makes every text of `profile` that a recorded program chose (function, file, library,
/// thread and process names, the command line) safe to print on a terminal (see
/// [`crate::files::diag::terminal_safe`]), for the report and any output sent to a terminal.
pub fn escape_for_terminal(profile: &mut Profile) {
    fn escape(text: &mut String) {
        if let std::borrow::Cow::Owned(safe) = crate::files::diag::terminal_safe(text) {
            *text = safe;
        }
    }
    for func in &mut profile.funcs {
        escape(&mut func.name);
        func.file.as_mut().map(escape);
    }
    for lib in &mut profile.libs {
        escape(&mut lib.name);
        escape(&mut lib.path);
    }
    for symbol in &mut profile.native_symbols {
        escape(&mut symbol.name);
    }
    profile.threads.iter_mut().for_each(|t| escape(&mut t.name));
    profile
        .processes
        .iter_mut()
        .for_each(|p| escape(&mut p.name));
    profile.meta.command.iter_mut().for_each(escape);
    escape(&mut profile.meta.event);
}

/// Writes `profile` as [`write()`] would have written it at `path`, into a new file
/// elsewhere (see [`output::write_elsewhere`]), for when `path` could not take it.
/// Returns where it went, or why every place failed.
pub fn write_elsewhere(
    profile: &Profile,
    format: Format,
    opts: &ExportOptions,
    path: &Path,
    owner: Option<output::SudoUser>,
) -> std::result::Result<std::path::PathBuf, Vec<String>> {
    output::write_elsewhere(path, owner, &mut |file| {
        write_to(profile, format, opts, path, file)
    })
}

/// Writes `profile` in `format` to a stream (`-o -`: standard output) rather than a file:
/// a Firefox profile is written as plain JSON.
pub fn write_stream(
    profile: &Profile,
    format: Format,
    opts: &ExportOptions,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    write_to(profile, format, opts, Path::new("-"), out)
}

/// Writes `profile` in `format` into `out`; `path` is the name it will have (a Firefox
/// profile is gzipped when it ends in `.gz`, in any case).
fn write_to(
    profile: &Profile,
    format: Format,
    opts: &ExportOptions,
    path: &Path,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut out = BufWriter::new(out);
    // A recording whose off-CPU time the kernel refused (it said so) has on-CPU
    // samples only, whatever was asked.
    let view = match opts.time {
        Some(_) if !profile.meta.off_cpu => TimeView::Cpu,
        Some(view) => view,
        None => TimeView::default_for(&profile.meta),
    };
    match format {
        Format::Firefox => {
            let model = firefox::to_processed(profile);
            let gzip = path.to_string_lossy().to_ascii_lowercase().ends_with(".gz");
            if gzip {
                let mut gz = GzEncoder::new(&mut out, FIREFOX_GZIP_LEVEL);
                // serde_json writes token by token, and flate2 (1.1) clears its whole
                // output buffer on every write it is given: unbuffered, that was a fifth
                // of a large recording's CPU.
                let mut json = BufWriter::with_capacity(GZIP_INPUT_CHUNK, &mut gz);
                serde_json::to_writer(&mut json, &model)?;
                json.flush()?;
                drop(json);
                gz.finish()?;
            } else {
                serde_json::to_writer(&mut out, &model)?;
            }
        }
        Format::Folded => {
            out.write_all(folded::to_folded(profile, opts.thread_roots, view).as_bytes())?
        }
        Format::Speedscope => serde_json::to_writer(&mut out, &speedscope::to_json(profile, view))?,
        Format::Pprof => out.write_all(&pprof::to_pprof(profile).to_gzipped_bytes()?)?,
        Format::Svg => out.write_all(svg::to_svg(profile, opts.thread_roots, view).as_bytes())?,
        Format::Otlp => {
            use prost::Message;
            out.write_all(&otlp::to_request(profile, opts.just_recorded).encode_to_vec())?
        }
    }
    out.flush()
}

/// How hard a Firefox profile is compressed: gzip level 2. Measured on a whole-machine
/// recording (4.1 MB of JSON, `sampler convert`, 10 runs): level 2 wrote 1.02 MB for
/// 80 ms of CPU in all, the default level 6 0.92 MB for 101 ms, level 1 1.45 MB for
/// about as much as level 2. A tenth larger for a fifth less of the time a user waits
/// for after the command ends.
const FIREFOX_GZIP_LEVEL: flate2::Compression = flate2::Compression::new(2);

/// The bytes of JSON handed to the gzip encoder at a time: 64 KiB, twice its output
/// buffer, so each write fills it.
const GZIP_INPUT_CHUNK: usize = 64 << 10;

/// Strings stored once each, numbered in the order they were first seen: the string
/// tables of the Firefox and pprof formats.
#[derive(Default)]
pub(crate) struct StringTable {
    list: Vec<String>,
    index: HashMap<String, usize>,
}

impl StringTable {
    /// The index of `s`, added at the end when new.
    pub(crate) fn get(&mut self, s: &str) -> usize {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), self.list.len() - 1);
        self.list.len() - 1
    }

    pub(crate) fn into_list(self) -> Vec<String> {
        self.list
    }
}

/// A thread's samples summed per leaf stack as `view` weighs them (`interval_ns`: the
/// sampling interval), in the order stacks were first sampled; stacks of no weight in
/// the view are left out.
pub(crate) fn stack_weights<S>(
    thread: &Thread<S>,
    view: TimeView,
    interval_ns: u64,
) -> Vec<(S, u64)>
where
    S: Copy + Eq + std::hash::Hash,
{
    let mut weights: Vec<(S, u64)> = Vec::new();
    let mut index: HashMap<S, usize> = HashMap::new();
    for s in &thread.samples {
        let weight = view.weight(s.weight, interval_ns);
        if weight == 0 {
            continue;
        }
        let i = *index.entry(s.stack).or_insert_with(|| {
            weights.push((s.stack, 0));
            weights.len() - 1
        });
        weights[i].1 += weight;
    }
    weights
}

/// A weight as people read it: `12 samples`, or milliseconds (`3.5 ms`) for time.
pub(crate) fn amount(unit: WeightUnit, weight: u64) -> String {
    match unit {
        WeightUnit::Samples => format!("{weight} samples"),
        WeightUnit::Nanoseconds => format!("{} ms", ms_text(weight)),
    }
}

/// Nanoseconds as milliseconds, with a decimal below 100 ms.
pub(crate) fn ms_text(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms < 100.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}

/// The funcs of a stack's frames, root first (inlined functions are frames too).
pub(crate) fn func_path(profile: &Profile, stack: StackIndex) -> Vec<FuncIndex> {
    let mut path = Vec::new();
    let mut at = Some(stack);
    while let Some(s) = at {
        let st = &profile.stacks[s.index()];
        path.push(profile.frames[st.frame.index()].func);
        at = st.prefix;
    }
    path.reverse();
    path
}
