//! The `sampler` command line: parses arguments, runs the pipeline, prints the summary,
//! and turns errors into one line and a non-zero exit.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use sampler::calltree::{self, CallTree, Transform};
use sampler::record::{self, RecordOptions};
use sampler::{emit, profile, symbolicate};

#[derive(Parser)]
#[command(
    name = "sampler",
    version,
    about = "A sampling profiler for Linux that writes Firefox Profiler profiles"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Profile a command (`sampler record [OPTIONS] -- CMD ARGS...`) or running processes
    /// (`sampler record -p PID[,PID...] [-d SECONDS]`)
    Record(RecordArgs),
    /// Print the function, inlined calls and source line of addresses in an ELF file, as
    /// the profile would name them (like `addr2line -f -i -C`, innermost call first).
    Symbolize(SymbolizeArgs),
    /// Write a profile that sampler wrote in another format (folded stacks, speedscope,
    /// pprof, an SVG flame graph, or Firefox again)
    Convert(ConvertArgs),
    /// Print the call tree of a profile that sampler wrote, with transforms applied in the
    /// order given (paths are CallNodePaths: A>B>C, from the root)
    Report(ReportArgs),
    /// Internal: the watchdog that puts kernel.perf_event_max_stack back for a recording
    /// session that died (see `record::stack_limit`).
    #[command(name = record::stack_limit::WATCHDOG_COMMAND, hide = true)]
    RestoreMaxStack { pid: i32, start: u64 },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum FormatArg {
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
}

impl FormatArg {
    fn format(self) -> emit::Format {
        match self {
            FormatArg::Firefox => emit::Format::Firefox,
            FormatArg::Folded => emit::Format::Folded,
            FormatArg::Speedscope => emit::Format::Speedscope,
            FormatArg::Pprof => emit::Format::Pprof,
            FormatArg::Svg => emit::Format::Svg,
        }
    }
}

/// Output format and file: `--format` or else what the `-o` name implies, else Firefox;
/// `-o` or else the format's default name.
fn output_choice(format: Option<FormatArg>, output: Option<PathBuf>) -> (emit::Format, PathBuf) {
    let format = format
        .map(FormatArg::format)
        .or_else(|| output.as_deref().and_then(emit::Format::from_output_name))
        .unwrap_or(emit::Format::Firefox);
    let output = output.unwrap_or_else(|| PathBuf::from(format.default_output()));
    (format, output)
}

#[derive(clap::Args)]
struct ConvertArgs {
    /// A profile written by `sampler record` (.json or .json.gz).
    file: PathBuf,
    /// Output format [default: what the -o name implies (.folded, .speedscope.json,
    /// .pb.gz, .svg, .json[.gz])]
    #[arg(short = 'f', long = "format", value_enum)]
    format: Option<FormatArg>,
    /// Output file [default: profile.folded, profile.speedscope.json, profile.pb.gz,
    /// profile.svg or profile.json.gz, by format]
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// folded and svg: start every stack with its process and thread.
    #[arg(long = "thread-roots")]
    thread_roots: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ColorArg {
    Auto,
    Always,
    Never,
}

#[derive(clap::Args)]
struct ReportArgs {
    /// A profile written by `sampler record` (.json or .json.gz).
    file: PathBuf,
    /// Only these threads (a tid, a thread name or a process name; repeatable)
    /// [default: all threads merged]
    #[arg(long = "thread", value_name = "NAME|TID")]
    threads: Vec<String>,
    /// One tree per thread instead of all threads merged.
    #[arg(long = "per-thread")]
    per_thread: bool,
    /// Show the tree bottom-up: roots are the functions that ran, children their callers.
    #[arg(long)]
    invert: bool,
    /// Deepest level shown (roots are level 1).
    #[arg(long, value_name = "N")]
    depth: Option<usize>,
    /// Leave out nodes below this percentage of the samples (0 shows all).
    #[arg(long = "min-percent", value_name = "P", default_value_t = 0.5)]
    min_percent: f64,
    /// Merge function: its call nodes disappear and their time goes to their callers.
    #[arg(long = "merge", value_name = "FUNC")]
    merge: Vec<String>,
    /// Merge one call node into its caller.
    #[arg(long = "merge-node", value_name = "A>B>C")]
    merge_node: Vec<String>,
    /// Merge a call node's subtree into its caller (its time becomes the caller's self time).
    #[arg(long = "prune", value_name = "A>B>C")]
    prune: Vec<String>,
    /// Drop the samples whose stack contains the function.
    #[arg(long = "drop", value_name = "FUNC")]
    drop: Vec<String>,
    /// Only the samples through this call node, with it as the root.
    #[arg(long = "focus", value_name = "A>B>C")]
    focus: Vec<String>,
    /// Only the samples that call the function, with every call of it as a root.
    #[arg(long = "focus-function", value_name = "FUNC")]
    focus_function: Vec<String>,
    /// Show the frames of a library as one node named after it.
    #[arg(long = "collapse-lib", value_name = "LIB")]
    collapse_lib: Vec<String>,
    /// Show a function that calls itself directly as one node.
    #[arg(long = "collapse-recursion", value_name = "FUNC")]
    collapse_recursion: Vec<String>,
    /// Merge every call of the function made while it is already on the stack.
    #[arg(long = "collapse-indirect-recursion", value_name = "FUNC")]
    collapse_indirect_recursion: Vec<String>,
    /// Sample counts per source line of the function, instead of the tree.
    #[arg(long = "lines", value_name = "FUNC")]
    lines: Option<String>,
    /// Columns to fit the output in (0: no limit) [default: the terminal's width, else
    /// $COLUMNS, else no limit]
    #[arg(long, value_name = "N")]
    width: Option<usize>,
    /// Colour the output [default: auto, when stdout is a terminal and NO_COLOR is unset]
    #[arg(long, value_enum, default_value_t = ColorArg::Auto)]
    color: ColorArg,
}

#[derive(clap::Args)]
struct SymbolizeArgs {
    /// The ELF file (executable or shared library).
    #[arg(short = 'e', long = "exe")]
    exe: PathBuf,
    /// Root of separate debug files (.build-id/xx/rest.debug, .gnu_debuglink paths).
    #[arg(long = "debug-root", default_value = symbolicate::DEFAULT_DEBUG_ROOT)]
    debug_root: PathBuf,
    /// Addresses in the file's own address space (hex, `0x` optional); read from stdin,
    /// whitespace-separated, when none are given.
    addresses: Vec<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum UnwindArg {
    Hybrid,
    Fp,
    Dwarf,
}

#[derive(clap::Args)]
struct RecordArgs {
    /// Sampling frequency in Hz (per thread); lowered to kernel.perf_event_max_sample_rate.
    #[arg(short = 'F', long = "freq", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    frequency: u64,
    /// Output file; gzip-compressed when a Firefox profile's name ends in `.gz`
    /// [default: profile.json.gz, or the --format's default name]
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// Output format [default: what the -o name implies, else firefox]
    #[arg(short = 'f', long = "format", value_enum)]
    format: Option<FormatArg>,
    /// folded and svg: start every stack with its process and thread.
    #[arg(long = "thread-roots")]
    thread_roots: bool,
    /// Data pages per CPU ring buffer (a power of two) [default: what
    /// kernel.perf_event_mlock_kb allows, 128 with its default of 516]
    #[arg(short = 'm', long = "mmap-pages")]
    mmap_pages: Option<usize>,
    /// How user stacks are unwound: hybrid (CFI through a stack copy, then the frame
    /// pointer chain), fp (frame pointers only, cheapest), dwarf (CFI only).
    #[arg(long = "unwind", value_enum, default_value_t = UnwindArg::Hybrid)]
    unwind: UnwindArg,
    /// Bytes of user stack copied with each sample [default: fp 512, hybrid 8192, dwarf
    /// 16384].
    #[arg(long = "stack-size", value_name = "BYTES")]
    stack_size: Option<u32>,
    /// Attach to running processes instead of launching a command.
    #[arg(short = 'p', long = "pid", value_delimiter = ',', value_name = "PID")]
    pids: Vec<i32>,
    /// With -p: stop recording after this many seconds (else at Ctrl-C, or when every
    /// attached process has exited).
    #[arg(short = 'd', long = "duration", value_name = "SECONDS")]
    duration: Option<f64>,
    /// Root of separate debug files (.build-id/xx/rest.debug, .gnu_debuglink paths).
    #[arg(long = "debug-root", default_value = symbolicate::DEFAULT_DEBUG_ROOT)]
    debug_root: PathBuf,
    /// Deepest stack (frames) the kernel walks per sample. Above
    /// kernel.perf_event_max_stack, sampler (as root) raises that setting while it
    /// records and puts it back after; at or below it, nothing machine-wide changes.
    #[arg(long = "max-stack", value_name = "FRAMES",
          default_value_t = record::stack_limit::DEFAULT_MAX_STACK,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(record::stack_limit::MAX_FITTING_FRAMES)))]
    max_stack: u16,
    /// The command to profile, with its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = match cli.command {
        Command::Record(args) => record_main(args),
        Command::Symbolize(args) => symbolize_main(args).map(|()| 0),
        Command::Convert(args) => convert_main(args).map(|()| 0),
        Command::RestoreMaxStack { pid, start } => {
            record::stack_limit::watchdog_main(pid, start).map(|()| 0)
        }
        Command::Report(args) => {
            let sub = matches
                .subcommand_matches("report")
                .expect("the report subcommand was parsed");
            report_transforms(sub).and_then(|t| report_main(args, &t).map(|()| 0))
        }
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            sampler::say!("sampler: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Developer aid: where to write an unwinder fixture of the recording's first samples
/// (see `sampler::replay`).
const CAPTURE_ENV: &str = "SAMPLER_CAPTURE_SAMPLES";

fn record_main(args: RecordArgs) -> Result<i32> {
    if let Some(pages) = args.mmap_pages.filter(|p| !p.is_power_of_two()) {
        bail!("-m/--mmap-pages must be a power of two (got {pages})");
    }
    let target = match (args.pids.is_empty(), args.command.is_empty()) {
        (true, true) => bail!(
            "nothing to record: give a command (`sampler record -- CMD ARGS`) or running processes (`-p PID`)"
        ),
        (false, false) => bail!(
            "-p attaches to running processes; give either -p PID or a command, not both"
        ),
        (true, false) => record::Target::Command(args.command),
        (false, true) => record::Target::Pids(args.pids),
    };
    let duration = match args.duration {
        None => None,
        Some(_) if matches!(target, record::Target::Command(_)) => bail!(
            "-d/--duration is for attached processes (-p); a command is recorded until it exits"
        ),
        Some(d) if d.is_finite() && d > 0.0 => Some(std::time::Duration::from_secs_f64(d)),
        Some(d) => bail!("-d/--duration must be a positive number of seconds (got {d})"),
    };
    let mode = match args.unwind {
        UnwindArg::Hybrid => sampler::unwind::UnwindMode::Hybrid,
        UnwindArg::Fp => sampler::unwind::UnwindMode::Fp,
        UnwindArg::Dwarf => sampler::unwind::UnwindMode::Dwarf,
    };
    let stack_bytes = args
        .stack_size
        .unwrap_or_else(|| mode.default_stack_bytes());
    if stack_bytes % 8 != 0 || !(8..=65_528).contains(&stack_bytes) {
        bail!("--stack-size must be a multiple of 8 between 8 and 65528 (got {stack_bytes})");
    }
    let opts = RecordOptions {
        stack_bytes,
        target,
        frequency_hz: args.frequency,
        mmap_pages: args.mmap_pages,
        duration,
        max_stack: args.max_stack,
    };
    let (format, output_path) = output_choice(args.format, args.output.clone());
    let output = std::fs::File::create(&output_path).with_context(|| {
        format!(
            "cannot write the profile to {} (choose another -o)",
            output_path.display()
        )
    })?;
    // Samples are unwound and interned while the command runs (see ProfileBuilder).
    let mut builder = sampler::replay::ProfileBuilder::new(mode);
    if let Some(path) = std::env::var_os(CAPTURE_ENV) {
        builder.capture_samples(PathBuf::from(path));
    }
    let (info, ended) = match record::record(&opts, &mut |events| builder.add_events(events)) {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&output_path);
            return Err(e);
        }
    };
    let exited = Instant::now();
    // The kernel's symbols, read once, and only when a sample was in the kernel: its text
    // start places kernel frames, its names name them.
    let kernel = builder
        .has_kernel_frames()
        .then(symbolicate::read_kallsyms)
        .flatten();
    let built = builder.finish(&info, kernel.as_ref().map(|k| k.kernel_text_start()));
    let symbol_options = symbolicate::SymbolOptions {
        debug_root: args.debug_root.clone(),
        kernel,
    };
    let profile = symbolicate::symbolicate(built.profile, &built.lib_binaries, &symbol_options);
    let export = emit::ExportOptions {
        thread_roots: args.thread_roots,
    };
    emit::write(&profile, format, &export, output, &output_path)?;
    give_to_sudo_user(&output_path)?;
    let write_ms = exited.elapsed().as_secs_f64() * 1000.0;

    let samples: usize = profile.threads.iter().map(|t| t.samples.len()).sum();
    let m = &profile.meta;
    sampler::say!(
        "sampler: {}",
        match ended {
            record::Ended::Command(record::CommandExit::Code(c)) =>
                format!("command exited with code {c}"),
            record::Ended::Command(record::CommandExit::Signal(s)) =>
                format!("command was killed by signal {s}"),
            record::Ended::Detached(record::DetachReason::Duration) =>
                "recorded for the -d duration; the processes go on running".to_string(),
            record::Ended::Detached(record::DetachReason::Interrupted) =>
                "recording interrupted; the processes go on running".to_string(),
            record::Ended::Detached(record::DetachReason::AllExited) =>
                "every attached process exited".to_string(),
        }
    );
    if let Some(stopped) = info.stopped_for {
        sampler::say!(
            "sampler: the processes were stopped for {:.1} ms while sampler attached",
            stopped.as_secs_f64() * 1000.0
        );
    }
    sampler::say!(
        "sampler: {} samples ({}, {} Hz), {} lost, {} threads in {} processes, {:.2} s",
        samples,
        m.event,
        m.frequency_hz,
        m.lost_samples,
        profile.threads.len(),
        profile.processes.len(),
        m.duration_ms / 1000.0
    );
    if samples > 0 {
        sampler::say!(
            "sampler: {} unwinding, {:.1} MB of samples ({} bytes per sample)",
            mode.name(),
            info.sample_bytes as f64 / 1e6,
            info.sample_bytes / samples as u64
        );
    }
    print_lost_by_thread(&profile);
    if m.truncated_stacks > 0 {
        sampler::say!(
            "sampler: {} stacks could not be unwound to their outermost frame and start with [truncated] (the stack copy or the kernel's frame limit ended them; a larger --stack-size helps the first)",
            m.truncated_stacks
        );
    }
    print_why_incomplete(&info, samples);
    if m.throttled > 0 {
        sampler::say!(
            "sampler: the kernel throttled sampling {} times (lower -F)",
            m.throttled
        );
    }
    print_symbol_gaps(&profile);
    sampler::say!(
        "sampler: wrote {} ({:.0} ms after the command ended); {}",
        output_path.display(),
        write_ms,
        how_to_open(format, &output_path)
    );
    Ok(match ended {
        record::Ended::Command(exit) => exit.shell_code(),
        record::Ended::Detached(_) => 0,
    })
}

/// Says why a profile is empty, or misses stack frames, processes or samples, where
/// sampler knows: one line each, so that nothing is missing silently.
fn print_why_incomplete(info: &sampler::events::RecordingInfo, samples: usize) {
    use sampler::events::StackLimit;
    let gaps = &info.gaps;
    if gaps.stack_limit == StackLimit::Refused {
        let why = if nix::unistd::Uid::effective().is_root() {
            "another perf session's callchain events (perf record -g, another profiler) keep the kernel from changing it"
        } else {
            "only root may change it"
        };
        sampler::say!(
            "sampler: stacks deeper than {} frames are cut and start with [truncated]: kernel.perf_event_max_stack could not be raised ({why})",
            info.max_stack
        );
    }
    if gaps.unreadable_bytes > 0 {
        sampler::say!(
            "sampler: {} bytes of the ring buffers could not be parsed (a corrupt record); the about {} samples in them are counted as lost",
            gaps.unreadable_bytes,
            gaps.unreadable_samples
        );
    }
    for pid in &gaps.left_stopped {
        sampler::say!(
            "sampler: pid {pid} was already stopped when sampler attached and was left so: a stopped process runs no code, so it has no samples (`kill -CONT {pid}` continues it)"
        );
    }
    if !gaps.outliving.is_empty() {
        let list: Vec<String> = gaps
            .outliving
            .iter()
            .map(|(pid, name)| format!("{pid} ({name})"))
            .collect();
        sampler::say!(
            "sampler: {} processes the command started were still running when it exited, and were recorded only until then: {} (`sampler record -p PID` records a daemon)",
            list.len(),
            list.join(", ")
        );
    }
    if samples == 0 {
        match &gaps.set_id_program {
            Some(file) => sampler::say!(
                "sampler: no samples: {} is a set-user-ID or set-group-ID program, and the kernel stops sampling a program that gains privileges when it starts",
                file.display()
            ),
            None if gaps.left_stopped.is_empty() => sampler::say!(
                "sampler: no samples: what was recorded used less than one sampling period of CPU time ({:.1} ms at {} Hz), or waited the whole time",
                1000.0 / info.frequency_hz as f64,
                info.frequency_hz
            ),
            None => {}
        }
    }
}

/// The threads that lost samples, most first (at most ten), so that a thread whose
/// profile is thin for that reason can be told apart.
fn print_lost_by_thread(profile: &profile::Profile) {
    let mut lost: Vec<_> = profile
        .threads
        .iter()
        .filter(|t| t.lost_samples > 0)
        .collect();
    if lost.is_empty() {
        return;
    }
    lost.sort_by_key(|t| std::cmp::Reverse(t.lost_samples));
    let shown: Vec<String> = lost
        .iter()
        .take(10)
        .map(|t| format!("{} ({}) {}", t.name, t.tid, t.lost_samples))
        .collect();
    let more = lost.len().saturating_sub(10);
    sampler::say!(
        "sampler: lost samples by thread: {}{} (a larger -m or a lower -F loses fewer)",
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    );
}

/// Tells which sampled libraries lack names or debug information, and why, so that a
/// `0x…` frame or a missing line is explained.
fn print_symbol_gaps(profile: &profile::Profile) {
    for (missing, heading) in [
        (
            profile::Missing::Symbols,
            "frames left as addresses (0x…), for want of symbols",
        ),
        (
            profile::Missing::DebugInfo,
            "no source lines or inlined calls (install the debug package, or pass --debug-root)",
        ),
    ] {
        let gaps: Vec<_> = profile
            .symbol_gaps
            .iter()
            .filter(|g| g.missing == missing)
            .collect();
        if gaps.is_empty() {
            continue;
        }
        sampler::say!("sampler: {heading}:");
        for g in gaps {
            sampler::say!("sampler:   {}: {}", profile.libs[g.lib.index()].name, g.why);
        }
    }
}

/// `sampler symbolize`: each address, then its functions innermost first, each followed
/// by `file:line` (`??:0` where unknown).
fn symbolize_main(args: SymbolizeArgs) -> Result<()> {
    use std::io::{Read, Write};
    let binary = sampler::binary::Binary::open(&args.exe)
        .with_context(|| format!("cannot read {} as an ELF file", args.exe.display()))?;
    let opts = symbolicate::SymbolOptions {
        debug_root: args.debug_root,
        kernel: None,
    };
    let path = args.exe.canonicalize().unwrap_or(args.exe.clone());
    let syms = symbolicate::LibSymbols::load(&binary, &path.to_string_lossy(), &opts)
        .context("not an ELF file")?;
    let mut input = String::new();
    let words: Vec<&str> = if args.addresses.is_empty() {
        std::io::stdin().read_to_string(&mut input)?;
        input.split_whitespace().collect()
    } else {
        args.addresses.iter().map(String::as_str).collect()
    };
    let addresses = words
        .iter()
        .map(|word| {
            let hex = word.trim_start_matches("0x").trim_start_matches("0X");
            u64::from_str_radix(hex, 16).with_context(|| format!("{word} is not a hex address"))
        })
        .collect::<Result<Vec<u64>>>()?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (address, info) in addresses.iter().zip(syms.lookup_many(&addresses)) {
        writeln!(out, "0x{address:x}")?;
        if info.frames.is_empty() {
            let name = info.symbol.map_or("??".to_string(), |s| s.name);
            writeln!(out, "{name}\n??:0")?;
        }
        for f in info.frames.iter().rev() {
            let file = f.file.as_deref().unwrap_or("??");
            let line = f.line.unwrap_or(0);
            writeln!(out, "{}\n{file}:{line}", f.function)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Under `sudo`, hands the output file to the user who ran sudo, so it is not root's.
/// Only root can give a file away; a non-root run with a stale `SUDO_UID` keeps it.
fn give_to_sudo_user(path: &Path) -> Result<()> {
    let id = |var: &str| std::env::var(var).ok().and_then(|v| v.parse::<u32>().ok());
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(());
    }
    if let (Some(uid), gid) = (id("SUDO_UID"), id("SUDO_GID")) {
        std::os::unix::fs::chown(path, Some(uid), gid)
            .with_context(|| format!("cannot give {} to uid {uid}", path.display()))?;
    }
    Ok(())
}

/// Makes a transform from one value of its flag.
type MakeTransform = fn(String) -> Transform;

/// The report's transforms in the order they were given on the command line, whatever
/// their flags (clap keeps each flag's values apart, so order comes from their indexes).
fn report_transforms(matches: &clap::ArgMatches) -> Result<Vec<Transform>> {
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
fn report_width(arg: Option<usize>, tty: bool) -> Option<usize> {
    match arg {
        Some(0) => None,
        Some(w) => Some(w),
        None => tty
            .then(|| terminal_size::terminal_size().map(|(w, _)| usize::from(w.0)))
            .flatten()
            .or_else(|| std::env::var("COLUMNS").ok()?.parse().ok()),
    }
}

fn report_main(args: ReportArgs, transforms: &[Transform]) -> Result<()> {
    use std::io::{IsTerminal, Write};
    if !(0.0..=100.0).contains(&args.min_percent) {
        bail!(
            "--min-percent must be between 0 and 100 (got {})",
            args.min_percent
        );
    }
    let profile = emit::load::read_profile(&args.file)?;
    let threads =
        emit::report::select_threads(&profile, &args.threads).map_err(anyhow::Error::msg)?;
    let tty = std::io::stdout().is_terminal();
    let opts = emit::report::ReportOptions {
        width: report_width(args.width, tty),
        color: match args.color {
            ColorArg::Always => true,
            ColorArg::Never => false,
            ColorArg::Auto => tty && std::env::var_os("NO_COLOR").is_none(),
        },
        max_depth: args.depth,
        min_percent: args.min_percent,
    };
    let groups: Vec<Vec<usize>> = if args.per_thread {
        threads
            .iter()
            .filter(|&&t| !profile.threads[t].samples.is_empty())
            .map(|&t| vec![t])
            .collect()
    } else {
        vec![threads]
    };
    let mut out = String::new();
    let m = &profile.meta;
    out.push_str(&format!(
        "{}: {} ({} Hz, {:.2} s)\n",
        args.file.display(),
        m.event,
        m.frequency_hz,
        m.duration_ms / 1000.0
    ));
    for group in groups {
        let samples: u64 = group
            .iter()
            .flat_map(|&t| &profile.threads[t].samples)
            .map(|s| u64::from(s.weight))
            .sum();
        let who = match group.as_slice() {
            [t] => {
                let th = &profile.threads[*t];
                let process = &profile.processes[th.process.index()];
                format!(
                    "thread {} (tid {}) of {} (pid {})",
                    th.name, th.tid, process.name, process.pid
                )
            }
            many => {
                let processes: std::collections::BTreeSet<_> =
                    many.iter().map(|&t| profile.threads[t].process).collect();
                format!(
                    "{} threads in {} processes, merged",
                    many.len(),
                    processes.len()
                )
            }
        };
        out.push_str(&format!("{who}: {samples} samples\n"));
        if let Some(func) = &args.lines {
            let lines = calltree::lines::function_lines(&profile, &group, func)
                .map_err(anyhow::Error::msg)?;
            emit::report::render_lines(&lines, samples, &opts, &source_line, &mut out);
            continue;
        }
        let tree = calltree::transform::apply_all(CallTree::build(&profile, &group), transforms)
            .map_err(anyhow::Error::msg)?;
        if !transforms.is_empty() {
            let names: Vec<String> = transforms.iter().map(|t| t.to_string()).collect();
            out.push_str(&format!(
                "after {}: {} of {} samples\n",
                names.join(", then "),
                tree.total(),
                samples
            ));
        }
        let tree = if args.invert { tree.inverted() } else { tree };
        emit::report::render_tree(&tree, &opts, &mut out);
        out.push('\n');
    }
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Line `line` (1-based) of a source file, when the file can be read here.
fn source_line(file: &str, line: u32) -> Option<String> {
    thread_local! {
        static FILES: std::cell::RefCell<std::collections::HashMap<String, Option<Vec<String>>>> =
            Default::default();
    }
    FILES.with(|files| {
        let mut files = files.borrow_mut();
        let lines = files.entry(file.to_string()).or_insert_with(|| {
            std::fs::read_to_string(file)
                .ok()
                .map(|t| t.lines().map(str::to_string).collect())
        });
        lines.as_ref()?.get(line.checked_sub(1)? as usize).cloned()
    })
}

/// What to do with a written file, for the last line of the summary.
fn how_to_open(format: emit::Format, path: &Path) -> String {
    let p = path.display();
    match format {
        emit::Format::Firefox => format!(
            "open it at https://profiler.firefox.com (\"Load a profile from file\"), or `sampler report {p}`"
        ),
        emit::Format::Folded => format!("draw it with `flamegraph.pl {p} > flame.svg` or `inferno-flamegraph`"),
        emit::Format::Speedscope => "open it at https://www.speedscope.app".to_string(),
        emit::Format::Pprof => format!("read it with `go tool pprof -top {p}`"),
        emit::Format::Svg => "open it in a browser".to_string(),
    }
}

fn convert_main(args: ConvertArgs) -> Result<()> {
    let profile = emit::load::read_profile(&args.file)?;
    let (format, output_path) = output_choice(args.format, args.output);
    let output = std::fs::File::create(&output_path)
        .with_context(|| format!("cannot write {} (choose another -o)", output_path.display()))?;
    let export = emit::ExportOptions {
        thread_roots: args.thread_roots,
    };
    emit::write(&profile, format, &export, output, &output_path)?;
    give_to_sudo_user(&output_path)?;
    sampler::say!(
        "sampler: wrote {}; {}",
        output_path.display(),
        how_to_open(format, &output_path)
    );
    Ok(())
}
