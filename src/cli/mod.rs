//! The command line: clap's types for every subcommand and what turns their values
//! into checked options. A mistake is refused here, before anything is recorded or
//! written, with one line that says what to do.

mod continuous;
pub mod diff;
pub mod inspect;
pub mod push;
mod record_args;
pub mod run;
pub mod summary;
pub mod view;

pub use record_args::{
    Continuous, RecordArgs, RecordPlan, UnwindArg, DEFAULT_FREQUENCY_HZ, MAX_DURATION_SECONDS,
    MAX_MMAP_PAGES,
};
pub use view::args::{ServeArgs, ViewArgs};

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

use crate::calltree::{self, Transform};
use crate::emit;
use crate::profile::TimeView;

#[derive(Parser)]
#[command(
    name = "sampler",
    version,
    about = "A sampling profiler for Linux that writes Firefox Profiler profiles"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Profile a command (`sampler record [OPTIONS] -- CMD ARGS...`) or running processes
    /// (`sampler record -p PID[,PID...] [-d SECONDS]`)
    Record(RecordArgs),
    /// Print the function, inlined calls and source line of addresses in an ELF file, as
    /// the profile would name them (like `addr2line -f -i -C`, innermost call first).
    Symbolize(SymbolizeArgs),
    /// Print symbol names (the arguments, else one per line of standard input) demangled
    /// as profiles show them: Rust, and C++ including GCC's older forms (like `c++filt`)
    Demangle { names: Vec<String> },
    /// Write a profile that sampler wrote in another format (folded stacks, speedscope,
    /// pprof, an SVG flame graph, or Firefox again)
    Convert(ConvertArgs),
    /// Print the call tree of a profile that sampler wrote, with transforms applied in the
    /// order given (paths are CallNodePaths: A>B>C, from the root)
    Report(ReportArgs),
    /// Compare two profiles that sampler wrote: each function's self and total share in
    /// BASE and NEW, the change, and whether it is beyond sampling noise; or (-f) write a
    /// differential flame graph
    Diff(DiffArgs),
    /// Open a profile in the Firefox Profiler: serve it on 127.0.0.1 under a secret path,
    /// print the viewer's URL and open it in the browser; with a second file, compare
    /// the two
    View(ViewArgs),
    /// Internal: the watchdog that puts kernel.perf_event_max_stack back for a recording
    /// session that died (see `crate::record::stack_limit`).
    #[command(name = crate::record::stack_limit::WATCHDOG_COMMAND, hide = true)]
    RestoreMaxStack { pid: i32, start: u64 },
    /// Internal: the guardian that continues the processes `-p` stopped when sampler is
    /// killed while attaching (see `crate::record::guardian_main`).
    #[command(name = crate::record::GUARDIAN_COMMAND, hide = true)]
    ContinueStopped,
    /// Internal: reads source files as sudo's invoking user, to embed them (see
    /// `crate::files::sources`).
    #[command(name = crate::files::sources::READ_SOURCES_COMMAND, hide = true)]
    ReadSources { budget: usize },
    /// Internal: prints a tracepoint's id where tracefs is not mounted (see
    /// `crate::record::tracepoint_id_main`).
    #[command(name = crate::record::TRACEPOINT_ID_COMMAND, hide = true)]
    TracepointId { name: String },
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum FormatArg {
    /// Firefox Profiler processed format (gzip when the name ends in .gz)
    Firefox,
    /// folded stacks, `a;b;c 42` (flamegraph.pl, inferno, speedscope)
    Folded,
    /// speedscope JSON, one profile per thread
    Speedscope,
    /// gzipped pprof profile.proto (go tool pprof, continuous-profiling back ends)
    Pprof,
    /// SVG flame graph
    Svg,
    /// OTLP profiles export request (binary protobuf), as OpenTelemetry receives it
    Otlp,
}

impl FormatArg {
    pub fn format(self) -> emit::Format {
        match self {
            FormatArg::Firefox => emit::Format::Firefox,
            FormatArg::Folded => emit::Format::Folded,
            FormatArg::Speedscope => emit::Format::Speedscope,
            FormatArg::Pprof => emit::Format::Pprof,
            FormatArg::Svg => emit::Format::Svg,
            FormatArg::Otlp => emit::Format::Otlp,
        }
    }
}

/// Output format and file: `--format` or else what the `-o` name implies (in any case),
/// else Firefox; `-o` or else the format's default name. A name that implies another
/// format than `--format` is refused: one of the two is a mistake.
pub fn output_choice(
    format: Option<FormatArg>,
    output: Option<PathBuf>,
) -> Result<(emit::Format, PathBuf)> {
    let implied = output.as_deref().and_then(emit::Format::from_output_name);
    let format = match (format.map(FormatArg::format), implied) {
        (Some(asked), Some(named)) if asked != named => bail!(
            "-o {} names a {} file, but --format says {}: change one of them",
            output.as_deref().unwrap_or(Path::new("")).display(),
            named.name(),
            asked.name()
        ),
        (Some(asked), _) => asked,
        (None, named) => named.unwrap_or(emit::Format::Firefox),
    };
    let output = output.unwrap_or_else(|| PathBuf::from(format.default_output()));
    Ok((format, output))
}

/// `convert`'s format and output: as [`output_choice`], but without `-o` the output is
/// named after the input, beside it (`a.json.gz` to `a.folded`), and a file of that name
/// is never replaced: a convert replaces only the file that `-o` names.
pub fn convert_output(
    format: Option<FormatArg>,
    output: Option<PathBuf>,
    input: &Path,
) -> Result<(emit::Format, PathBuf)> {
    if output.is_some() {
        return output_choice(format, output);
    }
    let (format, _) = output_choice(format, None)?;
    let name = input
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let lower = name.to_ascii_lowercase();
    let stem_len = [".json.gz", ".json", ".gz"]
        .iter()
        .find(|ending| lower.ends_with(*ending))
        .map_or(name.len(), |ending| name.len() - ending.len());
    let stem = match &name[..stem_len] {
        "" => "profile",
        stem => stem,
    };
    let ending = format
        .default_output()
        .strip_prefix("profile")
        .expect("default names start with `profile`");
    let derived = input.with_file_name(format!("{stem}{ending}"));
    if std::fs::symlink_metadata(&derived).is_ok() {
        bail!(
            "{} exists: without -o, convert writes a new file named after its input and replaces none (give -o {} to replace it)",
            derived.display(),
            derived.display()
        );
    }
    Ok((format, derived))
}

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// A profile written by `sampler record` (.json or .json.gz).
    pub file: PathBuf,
    /// Output format [default: what the -o name implies (.folded, .speedscope.json,
    /// .pb.gz, .svg, .json[.gz])]
    #[arg(short = 'f', long = "format", value_enum)]
    pub format: Option<FormatArg>,
    /// Output file [default: the input's name with the format's ending, beside it
    /// (a.json.gz to a.folded, a.speedscope.json, a.pb.gz, a.svg, a.json.gz); never
    /// replacing a file]. `-` writes to standard output (control characters escaped on a
    /// terminal)
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// folded and svg: start every stack with its process and thread.
    #[arg(long = "thread-roots")]
    pub thread_roots: bool,
    #[arg(long = "time", value_enum, help = TIME_HELP)]
    pub time: Option<TimeArg>,
    #[command(flatten)]
    pub push: push::PushArgs,
}

/// Which time a report or an export weighs stacks by (profiles recorded with
/// `--off-cpu`).
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum TimeArg {
    /// On-CPU samples only
    Cpu,
    /// Time off the CPU only (blocked and preempted)
    OffCpu,
    /// Both: each thread's wall-clock time
    Wall,
}

impl TimeArg {
    pub fn view(self) -> TimeView {
        match self {
            TimeArg::Cpu => TimeView::Cpu,
            TimeArg::OffCpu => TimeView::OffCpu,
            TimeArg::Wall => TimeView::Wall,
        }
    }
}

/// `--time` of `report`, `convert` and `record` (folded, speedscope, svg).
pub(crate) const TIME_HELP: &str =
    "Profiles with off-CPU time: weigh stacks by on-CPU samples (cpu), \
time off the CPU (off-cpu), or both (wall) [default: wall when the profile has off-CPU \
time, else cpu]";

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ColorArg {
    Auto,
    Always,
    Never,
}

impl ColorArg {
    /// Whether to colour: `tty` says whether stdout is a terminal.
    pub fn on(self, tty: bool) -> bool {
        match self {
            ColorArg::Always => true,
            ColorArg::Never => false,
            ColorArg::Auto => tty && std::env::var_os("NO_COLOR").is_none(),
        }
    }
}

/// `--min-percent` of `report` and `diff`: a percentage.
fn check_min_percent(p: f64) -> Result<()> {
    if !(0.0..=100.0).contains(&p) {
        bail!("--min-percent must be between 0 and 100 (got {p})");
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct ReportArgs {
    /// A profile written by `sampler record` (.json or .json.gz).
    pub file: PathBuf,
    /// Only these threads (a tid, a thread name or a process name; repeatable)
    /// [default: all threads merged]
    #[arg(long = "thread", value_name = "NAME|TID")]
    pub threads: Vec<String>,
    /// One tree per thread instead of all threads merged.
    #[arg(long = "per-thread")]
    pub per_thread: bool,
    /// Show the tree bottom-up: roots are the functions that ran, children their callers.
    #[arg(long)]
    pub invert: bool,
    /// Deepest level shown (roots are level 1).
    #[arg(long, value_name = "N")]
    pub depth: Option<usize>,
    /// Leave out nodes below this percentage of the samples (0 shows all).
    #[arg(long = "min-percent", value_name = "P", default_value_t = 0.5)]
    pub min_percent: f64,
    /// Merge function: its call nodes disappear and their time goes to their callers.
    #[arg(long = "merge", value_name = "FUNC")]
    pub merge: Vec<String>,
    /// Merge one call node into its caller.
    #[arg(long = "merge-node", value_name = "A>B>C")]
    pub merge_node: Vec<String>,
    /// Merge a call node's subtree into its caller (its time becomes the caller's self time).
    #[arg(long = "prune", value_name = "A>B>C")]
    pub prune: Vec<String>,
    /// Drop the samples whose stack contains the function.
    #[arg(long = "drop", value_name = "FUNC")]
    pub drop: Vec<String>,
    /// Only the samples through this call node, with it as the root.
    #[arg(long = "focus", value_name = "A>B>C")]
    pub focus: Vec<String>,
    /// Only the samples that call the function, with every call of it as a root.
    #[arg(long = "focus-function", value_name = "FUNC")]
    pub focus_function: Vec<String>,
    /// Show the frames of a library as one node named after it.
    #[arg(long = "collapse-lib", value_name = "LIB")]
    pub collapse_lib: Vec<String>,
    /// Show a function that calls itself directly as one node.
    #[arg(long = "collapse-recursion", value_name = "FUNC")]
    pub collapse_recursion: Vec<String>,
    /// Merge every call of the function made while it is already on the stack.
    #[arg(long = "collapse-indirect-recursion", value_name = "FUNC")]
    pub collapse_indirect_recursion: Vec<String>,
    /// Sample counts per source line of the function, instead of the tree.
    #[arg(long = "lines", value_name = "FUNC")]
    pub lines: Option<String>,
    #[arg(long = "time", value_enum, help = TIME_HELP)]
    pub time: Option<TimeArg>,
    /// Columns to fit the output in (0: no limit) [default: the terminal's width, else
    /// $COLUMNS, else no limit]
    #[arg(long, value_name = "N")]
    pub width: Option<usize>,
    /// Colour the output [default: auto, when stdout is a terminal and NO_COLOR is unset]
    #[arg(long, value_enum, default_value_t = ColorArg::Auto)]
    pub color: ColorArg,
}

#[derive(clap::Args)]
pub struct DiffArgs {
    /// The profile to compare against (written by `sampler record`, .json or .json.gz).
    pub base: PathBuf,
    /// The profile compared with BASE.
    pub new: PathBuf,
    /// Print the comparison as a JSON array, one object per function.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Write a differential flame graph to -o instead of the comparison: folded stacks
    /// with both counts (`stack base new`), or an SVG as wide as NEW, red where the share
    /// grew, blue where it shrank [default: what the -o name implies]
    #[arg(short = 'f', long = "format", value_enum)]
    pub format: Option<DiffFormatArg>,
    /// The flame graph's file (`-` for standard output).
    #[arg(short = 'o', long = "output", conflicts_with = "json")]
    pub output: Option<PathBuf>,
    #[arg(long = "time", value_enum, help = TIME_HELP)]
    pub time: Option<TimeArg>,
    /// Compare the user-space functions only: a sample in the kernel counts for the
    /// user function that entered it (what interrupts for other processes' work add
    /// differs from run to run)
    #[arg(long, conflicts_with_all = ["format", "output"])]
    pub user: bool,
    /// The table leaves out functions below this percentage in both profiles whose
    /// change is within noise (0 shows all).
    #[arg(long = "min-percent", value_name = "P", default_value_t = 0.5)]
    pub min_percent: f64,
    /// Columns to fit the table in (0: no limit) [default: the terminal's width, else
    /// $COLUMNS, else no limit]
    #[arg(long, value_name = "N")]
    pub width: Option<usize>,
    /// Colour the changes beyond noise [default: auto, when stdout is a terminal and
    /// NO_COLOR is unset]
    #[arg(long, value_enum, default_value_t = ColorArg::Auto)]
    pub color: ColorArg,
}

/// The differential flame graphs `sampler diff -f` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffFormatArg {
    /// Folded stacks with two counts, `a;b;c 42 57` (difffolded.pl's format)
    Folded,
    /// SVG differential flame graph
    Svg,
}

impl DiffArgs {
    /// The flame graph asked for and its file, if any: `-f` needs `-o`, and an `-o` name
    /// must imply the format `-f` says (`.folded`, `.svg`), or one of them.
    pub fn flame_graph(&self) -> Result<Option<(DiffFormatArg, PathBuf)>> {
        let named = self
            .output
            .as_deref()
            .and_then(emit::Format::from_output_name);
        let implied = match named {
            Some(emit::Format::Folded) => Some(DiffFormatArg::Folded),
            Some(emit::Format::Svg) => Some(DiffFormatArg::Svg),
            Some(other) => bail!(
                "-o {} names a {} file: diff writes a folded or svg flame graph",
                self.output.as_deref().unwrap_or(Path::new("")).display(),
                other.name()
            ),
            None => None,
        };
        match (self.format, &self.output, implied) {
            (None, None, _) => Ok(None),
            (Some(_), None, _) => bail!("diff -f writes a flame graph: name its file with -o FILE (or -o - for standard output)"),
            (Some(asked), Some(o), Some(named)) if asked != named => bail!(
                "-o {} names another format than -f: change one of them",
                o.display()
            ),
            (Some(asked), Some(o), _) => Ok(Some((asked, o.clone()))),
            (None, Some(o), Some(named)) => Ok(Some((named, o.clone()))),
            (None, Some(o), None) => bail!(
                "-o {}: say which flame graph with -f folded or -f svg (or name the file .folded or .svg)",
                o.display()
            ),
        }
    }

    /// How the table is drawn: `tty` says whether stdout is a terminal.
    pub fn table_options(&self, tty: bool) -> Result<emit::diff::TableOptions> {
        check_min_percent(self.min_percent)?;
        Ok(emit::diff::TableOptions {
            width: report_width(self.width, tty),
            color: self.color.on(tty),
            min_percent: self.min_percent,
        })
    }
}

/// Where debug information is looked for: `record` and `symbolize` share these.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DebugArgs {
    /// Also look for separate debug files under DIR (DIR/.build-id/xx/rest.debug,
    /// .gnu_debuglink paths); repeatable, searched in the order given, then
    /// /usr/lib/debug.
    #[arg(long = "debug-root", value_name = "DIR")]
    pub debug_roots: Vec<PathBuf>,
    /// Do not fetch missing debug files from the debuginfod servers in $DEBUGINFOD_URLS.
    #[arg(long = "no-debuginfod")]
    pub no_debuginfod: bool,
    /// Neither read nor write the symbol cache nor the unwind table cache
    /// ($XDG_CACHE_HOME/sampler, else ~/.cache/sampler): read every file's symbols and
    /// debug information anew, and compile every unwind table.
    #[arg(long = "no-cache")]
    pub no_cache: bool,
}

impl DebugArgs {
    /// The symbol options these give: the debug roots, the debuginfod client unless it
    /// is switched off or no server is listed, and the symbol cache unless it is
    /// switched off.
    pub fn symbol_options(&self) -> crate::symbolicate::SymbolOptions {
        use crate::symbolicate::debuginfod;
        crate::symbolicate::SymbolOptions {
            debug_roots: crate::symbolicate::debug_roots(&self.debug_roots),
            debuginfod: (!self.no_debuginfod)
                .then(debuginfod::Config::from_env)
                .flatten()
                .map(|c| std::sync::Arc::new(debuginfod::Client::new(c))),
            cache: (!self.no_cache)
                .then(crate::symbolicate::cache::SymbolCache::from_env)
                .flatten()
                .map(std::sync::Arc::new),
            ..Default::default()
        }
    }
}

#[derive(clap::Args)]
pub struct SymbolizeArgs {
    /// The ELF file (executable or shared library).
    #[arg(short = 'e', long = "exe")]
    pub exe: PathBuf,
    #[command(flatten)]
    pub debug: DebugArgs,
    /// Addresses in the file's own address space (hex, `0x` optional); read from stdin,
    /// whitespace-separated, when none are given.
    pub addresses: Vec<String>,
}

pub type MakeTransform = fn(String) -> Transform;

/// The report's transforms in the order they were given on the command line, whatever
/// their flags (clap keeps each flag's values apart, so order comes from their indexes).
pub fn report_transforms(matches: &clap::ArgMatches) -> Result<Vec<Transform>> {
    let kinds: [(&str, MakeTransform); 9] = [
        ("merge", Transform::MergeFunction),
        ("merge_node", |p| {
            Transform::MergeCallNode(calltree::parse_path(&p))
        }),
        ("prune", |p| {
            Transform::PruneCallNode(calltree::parse_path(&p))
        }),
        ("drop", Transform::DropFunction),
        ("focus", |p| {
            Transform::FocusSubtree(calltree::parse_path(&p))
        }),
        ("focus_function", Transform::FocusFunction),
        ("collapse_lib", Transform::CollapseLibrary),
        ("collapse_recursion", Transform::CollapseRecursion),
        (
            "collapse_indirect_recursion",
            Transform::CollapseIndirectRecursion,
        ),
    ];
    let mut ordered: Vec<(usize, Transform)> = Vec::new();
    for (id, make) in kinds {
        if let (Some(values), Some(indexes)) =
            (matches.get_many::<String>(id), matches.indices_of(id))
        {
            ordered.extend(indexes.zip(values).map(|(i, v)| (i, make(v.clone()))));
        }
    }
    ordered.sort_by_key(|(i, _)| *i);
    Ok(ordered.into_iter().map(|(_, t)| t).collect())
}

/// The width to fit the report in: `--width` (0 = none), the terminal's, `$COLUMNS`.
pub fn report_width(arg: Option<usize>, tty: bool) -> Option<usize> {
    match arg {
        Some(0) => None,
        Some(w) => Some(w),
        None => tty
            .then(|| terminal_size::terminal_size().map(|(w, _)| usize::from(w.0)))
            .flatten()
            .or_else(|| std::env::var("COLUMNS").ok()?.parse().ok()),
    }
}

impl ReportArgs {
    /// How the report is drawn: `tty` says whether stdout is a terminal.
    pub fn options(&self, tty: bool) -> Result<emit::report::ReportOptions> {
        check_min_percent(self.min_percent)?;
        Ok(emit::report::ReportOptions {
            width: report_width(self.width, tty),
            color: self.color.on(tty),
            max_depth: self.depth,
            min_percent: self.min_percent,
            time: self.time.map(TimeArg::view),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("sampler").chain(args.iter().copied()))
    }

    fn record_args(args: &[&str]) -> RecordArgs {
        let mut all = vec!["record"];
        all.extend_from_slice(args);
        match parse(&all).unwrap().command {
            Command::Record(r) => r,
            _ => unreachable!(),
        }
    }

    fn plan_error(args: &[&str]) -> String {
        format!("{:#}", record_args(args).plan().unwrap_err())
    }

    #[test]
    fn the_command_and_its_own_options() {
        let r = record_args(&["./prog", "--flag", "-x"]);
        assert_eq!(r.command, ["./prog", "--flag", "-x"]);
        let r = record_args(&["-F", "99", "--", "prog", "-F", "1"]);
        assert_eq!((r.frequency, r.command.len()), (Some(99), 3));
        // An option of sampler's own before the command is an option, or an error.
        assert!(parse(&["record", "--bogus"]).is_err());
        assert!(parse(&["record", "--bogus", "--", "true"]).is_err());
        Cli::command().debug_assert();
    }

    #[test]
    fn a_continuous_recording_is_checked_and_samples_at_19_hz() {
        let dir = std::env::temp_dir();
        let out = format!("{}/", dir.display());
        let plan = record_args(&["-a", "--every", "10", "-o", &out])
            .plan()
            .unwrap();
        let c = plan.continuous.unwrap();
        assert_eq!(c.every, std::time::Duration::from_secs(10));
        assert_eq!(c.dir.as_deref(), Some(Path::new(&out)));
        assert_eq!(c.spool_bytes, 256 << 20);
        assert_eq!(plan.options.rate, crate::events::Rate::Frequency(19));
        let plan = record_args(&[
            "-a",
            "--every",
            "1",
            "-F",
            "99",
            "--push",
            "http://h/i",
            "--spool-max",
            "20K",
        ])
        .plan()
        .unwrap();
        assert_eq!(plan.options.rate, crate::events::Rate::Frequency(99));
        assert_eq!(plan.continuous.unwrap().spool_bytes, 20 << 10);
        for (args, error) in [
            (vec!["-a", "--every", "10"], "say where the windows go"),
            (vec!["-a", "--every", "0.5", "-o", &out], "--every must be"),
            (
                vec!["--every", "10", "-o", &out, "--", "true"],
                "a command is recorded whole",
            ),
            (
                vec!["-a", "--every", "10", "-o", "/tmp/x.json.gz"],
                "end it with /",
            ),
            (
                vec!["-a", "--every", "10", "-o", "/nonexistent/"],
                "no such directory",
            ),
            (
                vec!["-a", "--every", "10", "--off-cpu", "-o", &out],
                "--off-cpu is not cut",
            ),
        ] {
            let e = plan_error(&args);
            assert!(e.contains(error), "{args:?}: {e}");
        }
        assert!(parse(&[
            "record",
            "-a",
            "--every",
            "1",
            "--push",
            "http://h",
            "--spool-max",
            "12X"
        ])
        .is_err());
        assert!(parse(&["record", "-a", "--spool", "/tmp", "-d", "1"]).is_err());
    }

    #[test]
    fn debug_roots_add_to_the_system_one_in_the_order_given() {
        let r = record_args(&["--debug-root", "/b", "--debug-root", "/a", "--", "true"]);
        let roots = crate::symbolicate::debug_roots(&r.debug.debug_roots);
        assert_eq!(
            roots,
            [
                Path::new("/b"),
                Path::new("/a"),
                Path::new("/usr/lib/debug")
            ]
        );
        let r = record_args(&[
            "--debug-root",
            "/usr/lib/debug",
            "--debug-root",
            "/a",
            "--",
            "true",
        ]);
        let roots = crate::symbolicate::debug_roots(&r.debug.debug_roots);
        assert_eq!(roots, [Path::new("/usr/lib/debug"), Path::new("/a")]);
        assert!(!r.debug.no_debuginfod);
        assert!(
            record_args(&["--no-debuginfod", "--", "true"])
                .debug
                .no_debuginfod
        );
    }

    #[test]
    fn values_that_cannot_work_are_refused() {
        assert!(plan_error(&["-m", "0", "--", "true"]).contains("power of two"));
        assert!(plan_error(&["-m", "3", "--", "true"]).contains("power of two"));
        assert!(plan_error(&["-m", "2097152", "--", "true"]).contains("from 1 to 1048576"));
        assert!(plan_error(&["-p", "1", "-d", "1e20"]).contains("at most 2592000"));
        assert!(plan_error(&["-p", "1", "-d", "0"]).contains("above 0"));
        assert!(plan_error(&["-p", "1", "-d", "NaN"]).contains("above 0"));
        assert!(plan_error(&["-d", "3", "--", "true"]).contains("for attached processes"));
        assert!(plan_error(&["--stack-size", "12", "--", "true"]).contains("multiple of 8"));
        assert!(plan_error(&[]).contains("nothing to record"));
    }

    #[test]
    fn the_output_name_and_the_format_agree() {
        let choice = |f: Option<FormatArg>, o: &str| output_choice(f, Some(o.into()));
        assert_eq!(choice(None, "P.SVG").unwrap().0, emit::Format::Svg);
        assert_eq!(choice(None, "x.JSON.GZ").unwrap().0, emit::Format::Firefox);
        assert_eq!(
            choice(Some(FormatArg::Svg), "x.svg").unwrap().0,
            emit::Format::Svg
        );
        assert_eq!(
            choice(Some(FormatArg::Folded), "out.txt").unwrap().0,
            emit::Format::Folded
        );
        let err = choice(Some(FormatArg::Pprof), "x.svg")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("names a svg file, but --format says pprof"),
            "{err}"
        );
        assert_eq!(
            output_choice(None, None).unwrap().1,
            PathBuf::from("profile.json.gz")
        );
    }

    #[test]
    fn diff_writes_a_flame_graph_only_when_asked_and_named() {
        let graph = |args: &[&str]| {
            let mut all = vec!["sampler", "diff", "a.json", "b.json"];
            all.extend(args);
            match Cli::try_parse_from(all).map_err(|e| e.to_string())?.command {
                Command::Diff(d) => d.flame_graph().map_err(|e| e.to_string()),
                _ => unreachable!("a diff"),
            }
        };
        assert_eq!(graph(&[]).unwrap(), None);
        assert_eq!(
            graph(&["-o", "d.SVG"]).unwrap(),
            Some((DiffFormatArg::Svg, PathBuf::from("d.SVG")))
        );
        assert_eq!(
            graph(&["-f", "folded", "-o", "-"]).unwrap(),
            Some((DiffFormatArg::Folded, PathBuf::from("-")))
        );
        assert!(graph(&["-f", "svg"]).unwrap_err().contains("-o FILE"));
        assert!(graph(&["-f", "svg", "-o", "d.folded"])
            .unwrap_err()
            .contains("another format"));
        assert!(graph(&["-o", "d.txt"])
            .unwrap_err()
            .contains("-f folded or -f svg"));
        assert!(graph(&["--json", "-f", "svg", "-o", "d.svg"]).is_err());
        assert!(graph(&["--user", "-o", "d.svg"]).is_err());
        assert!(graph(&["-f", "svg", "-o", "a.json"])
            .unwrap_err()
            .contains("names a firefox file"));
    }
}
