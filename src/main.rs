//! The `sampler` command line: parses arguments, runs the pipeline, prints the summary,
//! and turns errors into one line and a non-zero exit.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

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

/// The stack copy each mode needs by default. fp reads only the frameless leaf's return
/// address near the stack top. hybrid needs CFI only until the frame-pointer chain can
/// take over: 8 KiB covers the no-frame-pointer library frames measured here (qsort's
/// merge recursion, Rust std) with room. dwarf has nothing to fall back on, so it copies
/// twice that. The kernel caps a sample's copy below 64 KiB.
fn default_stack_bytes(mode: sampler::unwind::UnwindMode) -> u32 {
    match mode {
        sampler::unwind::UnwindMode::Fp => record::FP_STACK_COPY_BYTES,
        sampler::unwind::UnwindMode::Hybrid => 8192,
        sampler::unwind::UnwindMode::Dwarf => 16384,
    }
}

#[derive(clap::Args)]
struct RecordArgs {
    /// Sampling frequency in Hz (per thread); lowered to kernel.perf_event_max_sample_rate.
    #[arg(short = 'F', long = "freq", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    frequency: u64,
    /// Output file; gzip-compressed when it ends in `.gz`.
    #[arg(short = 'o', long = "output", default_value = "profile.json.gz")]
    output: PathBuf,
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
    /// The command to profile, with its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Record(args) => record_main(args),
        Command::Symbolize(args) => symbolize_main(args).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("sampler: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Developer aid: where to write an unwinder fixture of the recording's first samples
/// (see `sampler::profile::capture`).
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
    let stack_bytes = args.stack_size.unwrap_or_else(|| default_stack_bytes(mode));
    let unwind_name = match mode {
        sampler::unwind::UnwindMode::Hybrid => "hybrid",
        sampler::unwind::UnwindMode::Fp => "fp",
        sampler::unwind::UnwindMode::Dwarf => "dwarf",
    };
    if stack_bytes % 8 != 0 || !(8..=65_528).contains(&stack_bytes) {
        bail!("--stack-size must be a multiple of 8 between 8 and 65528 (got {stack_bytes})");
    }
    let opts = RecordOptions {
        stack_bytes,
        target,
        frequency_hz: args.frequency,
        mmap_pages: args.mmap_pages,
        duration,
    };
    let output = std::fs::File::create(&args.output).with_context(|| {
        format!(
            "cannot write the profile to {} (choose another -o)",
            args.output.display()
        )
    })?;
    // Samples are unwound and interned while the command runs (see ProfileBuilder).
    let mut builder = profile::ProfileBuilder::new(symbolicate::kernel_text_start(), mode);
    if let Some(path) = std::env::var_os(CAPTURE_ENV) {
        builder.capture_samples(PathBuf::from(path));
    }
    let (info, ended) = match record::record(&opts, &mut |events| builder.add_events(events)) {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&args.output);
            return Err(e);
        }
    };
    let exited = Instant::now();
    let built = builder.finish(&info);
    let symbol_options = symbolicate::SymbolOptions {
        debug_root: args.debug_root.clone(),
    };
    let profile = symbolicate::symbolicate(built.profile, &built.lib_binaries, &symbol_options);
    emit::write_firefox(&profile, output, &args.output)?;
    give_to_sudo_user(&args.output)?;
    let write_ms = exited.elapsed().as_secs_f64() * 1000.0;

    let samples: usize = profile.threads.iter().map(|t| t.samples.len()).sum();
    let m = &profile.meta;
    eprintln!(
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
        eprintln!(
            "sampler: the processes were stopped for {:.1} ms while sampler attached",
            stopped.as_secs_f64() * 1000.0
        );
    }
    eprintln!(
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
        eprintln!(
            "sampler: {} unwinding, {:.1} MB of samples ({} bytes per sample)",
            unwind_name,
            info.sample_bytes as f64 / 1e6,
            info.sample_bytes / samples as u64
        );
    }
    print_lost_by_thread(&profile);
    if m.truncated_stacks > 0 {
        eprintln!(
            "sampler: {} stacks could not be unwound to their outermost frame and start with [truncated] (the stack copy or the kernel's frame limit ended them; a larger --stack-size helps the first)",
            m.truncated_stacks
        );
    }
    if m.throttled > 0 {
        eprintln!(
            "sampler: the kernel throttled sampling {} times (lower -F)",
            m.throttled
        );
    }
    print_symbol_gaps(&profile);
    eprintln!(
        "sampler: wrote {} ({:.0} ms after the command ended); open it at https://profiler.firefox.com (\"Load a profile from file\")",
        args.output.display(),
        write_ms
    );
    Ok(match ended {
        record::Ended::Command(exit) => exit.shell_code(),
        record::Ended::Detached(_) => 0,
    })
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
    eprintln!(
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
        eprintln!("sampler: {heading}:");
        for g in gaps {
            eprintln!("sampler:   {}: {}", profile.libs[g.lib.index()].name, g.why);
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
