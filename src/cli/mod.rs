//! The command line: clap's types for every subcommand and what turns their values
//! into checked options. A mistake is refused here, before anything is recorded or
//! written, with one line that says what to do.

pub mod diff;
pub mod inspect;
pub mod push;
pub mod run;
pub mod summary;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

use crate::calltree::{self, Transform};
use crate::emit;
use crate::events::{Rate, SamplingEvent};
use crate::profile::TimeView;
use crate::record::{self, RecordOptions};
use crate::unwind::UnwindMode;

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
const TIME_HELP: &str = "Profiles with off-CPU time: weigh stacks by on-CPU samples (cpu), \
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
    /// Neither read nor write the symbol cache ($XDG_CACHE_HOME/sampler, else
    /// ~/.cache/sampler): read every file's symbols and debug information anew.
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

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum UnwindArg {
    Hybrid,
    Fp,
    Dwarf,
}

#[derive(clap::Args)]
pub struct RecordArgs {
    /// Sampling frequency in Hz (per thread); lowered to kernel.perf_event_max_sample_rate
    /// [default: 1000].
    #[arg(short = 'F', long = "freq", value_parser = clap::value_parser!(u64).range(1..))]
    pub frequency: Option<u64>,
    /// Take a sample every PERIOD events instead (ns for cpu-clock and task-clock).
    #[arg(short = 'c', long = "count", value_name = "PERIOD", conflicts_with = "frequency",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub period: Option<u64>,
    /// The event to sample, as perf names it: cycles, instructions, cache-misses,
    /// branch-misses (these need a hardware PMU), cpu-clock, task-clock, page-faults,
    /// major-faults, context-switches [default: cycles where the CPU counts them, else
    /// cpu-clock].
    #[arg(short = 'e', long = "event", value_name = "EVENT")]
    pub event: Option<String>,
    /// Record the whole machine: every CPU, every process and kernel thread (until -d,
    /// Ctrl-C or SIGTERM).
    #[arg(short = 'a', long = "all-cpus")]
    pub all_cpus: bool,
    /// Record on these CPUs only ("0,2-3"), with -a or a command.
    #[arg(short = 'C', long = "cpu", value_name = "CPUS")]
    pub cpus: Option<String>,
    /// Output file; gzip-compressed when a Firefox profile's name ends in `.gz`
    /// [default: profile.json.gz, or the --format's default name]
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Output format [default: what the -o name implies, else firefox]
    #[arg(short = 'f', long = "format", value_enum)]
    pub format: Option<FormatArg>,
    /// folded and svg: start every stack with its process and thread.
    #[arg(long = "thread-roots")]
    pub thread_roots: bool,
    /// Firefox: leave out the text of the sampled functions' source files (embedded by
    /// default, hottest first, up to 2 MiB, read with the rights of the user who runs
    /// sampler, or of sudo's invoking user).
    #[arg(long = "no-sources")]
    pub no_sources: bool,
    #[arg(long = "time", value_enum, help = TIME_HELP)]
    pub time: Option<TimeArg>,
    /// Data pages per CPU ring buffer (a power of two) [default: what
    /// kernel.perf_event_mlock_kb allows, 128 with its default of 516]
    #[arg(short = 'm', long = "mmap-pages")]
    pub mmap_pages: Option<usize>,
    /// How user stacks are unwound: hybrid (CFI through a stack copy, then the frame
    /// pointer chain), fp (frame pointers only, cheapest), dwarf (CFI only).
    #[arg(long = "unwind", value_enum, default_value_t = UnwindArg::Hybrid)]
    pub unwind: UnwindArg,
    /// Bytes of user stack copied with each sample [default: fp 512, hybrid 8192, dwarf
    /// 16384].
    #[arg(long = "stack-size", value_name = "BYTES")]
    pub stack_size: Option<u32>,
    /// Attach to running processes instead of launching a command.
    #[arg(short = 'p', long = "pid", value_delimiter = ',', value_name = "PID")]
    pub pids: Vec<i32>,
    /// With -p or -a: stop recording after this many seconds (else at Ctrl-C, or when
    /// every attached process has exited).
    #[arg(short = 'd', long = "duration", value_name = "SECONDS")]
    pub duration: Option<f64>,
    #[command(flatten)]
    pub debug: DebugArgs,
    /// Deepest stack (frames) the kernel walks per sample. Above
    /// kernel.perf_event_max_stack, sampler (as root) raises that setting while it
    /// records and puts it back after; at or below it, nothing machine-wide changes.
    #[arg(long = "max-stack", value_name = "FRAMES",
          default_value_t = crate::record::stack_limit::DEFAULT_MAX_STACK,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(crate::record::stack_limit::MAX_FITTING_FRAMES)))]
    pub max_stack: u16,
    /// Also record where threads wait: every interval a thread spends off the CPU
    /// (blocked on a lock, I/O, a sleep, a pipe; or preempted) is weighted by its
    /// duration at the stack where it left the CPU (needs kernel access: root, or
    /// kernel.perf_event_paranoid <= 1).
    #[arg(long = "off-cpu")]
    pub off_cpu: bool,
    /// With --off-cpu: take the stack of every Nth switch out of a thread only, each
    /// standing for the off-CPU time since the one before (every switch is still timed);
    /// for programs that switch more than some 20,000 times a second per CPU.
    #[arg(long = "off-cpu-every", value_name = "N", requires = "off_cpu",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub off_cpu_every: Option<u64>,
    /// Under sudo, run the command as root too [default: as the user who ran sudo].
    #[arg(long = "keep-root")]
    pub keep_root: bool,
    /// The command to profile, with its arguments (which may start with `-`; an option
    /// of sampler's own before the command is still an option, or an error).
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
    #[command(flatten)]
    pub push: push::PushArgs,
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

/// Samples per second per running thread unless `-F` or `-c` says otherwise.
pub const DEFAULT_FREQUENCY_HZ: u64 = 1000;

/// The most ring-buffer pages per CPU `-m` accepts: 2^20 pages are 4 GiB per CPU, more
/// than the kernel lets anyone lock; a larger value can only be a typo.
pub const MAX_MMAP_PAGES: usize = 1 << 20;

/// The longest `-d` accepted: 30 days. Longer is a typo (and `1e20` would not fit a
/// `Duration`).
pub const MAX_DURATION_SECONDS: f64 = 30.0 * 24.0 * 3600.0;

/// Everything `sampler record` was asked, checked.
#[derive(Clone, Debug)]
pub struct RecordPlan {
    pub options: RecordOptions,
    pub mode: UnwindMode,
    pub format: emit::Format,
    pub output: PathBuf,
    pub export: emit::ExportOptions,
    pub debug: DebugArgs,
    /// Whether the source files' text is embedded (Firefox profiles).
    pub sources: bool,
    /// Where the profile is sent once written (`--otlp`, `--push`).
    pub push: Vec<emit::push::Destination>,
}

impl RecordArgs {
    /// The checked plan of the recording; the error says what to change. Nothing is
    /// created or touched on the way.
    pub fn plan(self) -> Result<RecordPlan> {
        if let Some(pages) = self.mmap_pages {
            check_ring_pages(pages, None)?;
        }
        let target = match (self.all_cpus, self.pids.is_empty(), self.command.is_empty()) {
            (true, false, _) => bail!(
                "-a records the whole machine, -p given processes: give one of them"
            ),
            (true, true, false) => bail!(
                "-a records the whole machine until -d, Ctrl-C or SIGTERM; to limit it to a command's CPUs, give the command without -a"
            ),
            (true, true, true) => record::Target::System,
            (false, true, true) => bail!(
                "nothing to record: give a command (`sampler record -- CMD ARGS`), running processes (`-p PID`) or the whole machine (`-a`)"
            ),
            (false, false, false) => bail!(
                "-p attaches to running processes; give either -p PID or a command, not both"
            ),
            (false, true, false) => record::Target::Command(self.command.clone()),
            (false, false, true) => record::Target::Pids(record::resolve_pids(&self.pids)?),
        };
        let cpus = match &self.cpus {
            None => None,
            Some(_) if matches!(target, record::Target::Pids(_)) => bail!(
                "-C limits -a or a command to some CPUs; an attached process (-p) is followed wherever it runs"
            ),
            Some(list) => {
                Some(record::parse_cpu_list(list).map_err(|e| anyhow::anyhow!("-C {list}: {e}"))?)
            }
        };
        let event = match &self.event {
            None => None,
            Some(name) => Some(SamplingEvent::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = SamplingEvent::ALL.iter().map(|e| e.name()).collect();
                anyhow::anyhow!(
                    "-e {name}: unknown event; sampler samples {}",
                    names.join(", ")
                )
            })?),
        };
        if let (true, Some(e)) = (self.off_cpu, event) {
            if !e.is_time() {
                bail!(
                    "--off-cpu weighs waiting in time, and so the samples beside it must be: use -e cpu-clock or task-clock (or no -e) with it, not -e {}",
                    e.name()
                );
            }
        }
        let rate = match (self.period, self.frequency) {
            (Some(p), _) => Rate::Period(p),
            (None, hz) => Rate::Frequency(hz.unwrap_or(DEFAULT_FREQUENCY_HZ)),
        };
        let duration = match self.duration {
            None => None,
            Some(_) if matches!(target, record::Target::Command(_)) => bail!(
                "-d/--duration is for attached processes (-p) and -a; a command is recorded until it exits"
            ),
            Some(d) if d.is_finite() && d > 0.0 && d <= MAX_DURATION_SECONDS => {
                Some(Duration::from_secs_f64(d))
            }
            Some(d) => bail!(
                "-d/--duration must be a number of seconds above 0 and at most {MAX_DURATION_SECONDS} (30 days) (got {d})"
            ),
        };
        let mode = self.unwind.mode();
        let stack_bytes = self
            .stack_size
            .unwrap_or_else(|| mode.default_stack_bytes());
        if stack_bytes % 8 != 0 || !(8..=65_528).contains(&stack_bytes) {
            bail!("--stack-size must be a multiple of 8 between 8 and 65528 (got {stack_bytes})");
        }
        if let Some(pages) = self.mmap_pages {
            check_ring_pages(pages, Some((stack_bytes, mode)))?;
        }
        let (format, output) = output_choice(self.format, self.output)?;
        if let record::Target::Command(command) = &target {
            if let Some(program) = record::program_path(&command[0]) {
                let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
                    (Ok(a), Ok(b)) => a == b,
                    _ => false,
                };
                if same(&program, &output) {
                    bail!(
                        "-o {} is the program being profiled: choose another output name",
                        output.display()
                    );
                }
            }
        }
        let run_as = if self.keep_root {
            None
        } else {
            record::Credentials::of_sudo_user()?
        };
        Ok(RecordPlan {
            options: RecordOptions {
                stack_bytes,
                target,
                event,
                rate,
                cpus,
                mmap_pages: self.mmap_pages,
                duration,
                max_stack: self.max_stack,
                run_as,
                off_cpu: self.off_cpu.then_some(self.off_cpu_every.unwrap_or(1)),
            },
            mode,
            format,
            output,
            export: emit::ExportOptions {
                thread_roots: self.thread_roots,
                time: self.time.map(TimeArg::view),
                just_recorded: true,
            },
            debug: self.debug,
            sources: !self.no_sources,
            push: self.push.destinations()?,
        })
    }
}

/// What is wrong with `-m PAGES`: not a power of two, more than [`MAX_MMAP_PAGES`], or
/// (once the unwinding mode and its stack copy are known) too small for one sample.
fn check_ring_pages(pages: usize, sample: Option<(u32, UnwindMode)>) -> Result<()> {
    if !pages.is_power_of_two() || pages > MAX_MMAP_PAGES {
        bail!("-m/--mmap-pages must be a power of two from 1 to {MAX_MMAP_PAGES} (got {pages})");
    }
    if let Some((stack_bytes, mode)) = sample {
        let least = record::min_ring_pages(stack_bytes);
        if pages < least {
            bail!(
                "-m {pages} is too small to hold one sample with a {stack_bytes}-byte stack copy ({} unwinding): give -m {least} or more, or a smaller --stack-size",
                mode.name()
            );
        }
    }
    Ok(())
}

impl UnwindArg {
    pub fn mode(self) -> UnwindMode {
        match self {
            UnwindArg::Hybrid => UnwindMode::Hybrid,
            UnwindArg::Fp => UnwindMode::Fp,
            UnwindArg::Dwarf => UnwindMode::Dwarf,
        }
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
