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
    /// Run a command and profile it: `sampler record [-F HZ] [-o FILE] -- CMD ARGS...`
    Record(RecordArgs),
}

#[derive(clap::Args)]
struct RecordArgs {
    /// Sampling frequency in Hz (per thread); lowered to kernel.perf_event_max_sample_rate.
    #[arg(short = 'F', long = "freq", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    frequency: u64,
    /// Output file; gzip-compressed when it ends in `.gz`.
    #[arg(short = 'o', long = "output", default_value = "profile.json.gz")]
    output: PathBuf,
    /// Data pages per CPU ring buffer (a power of two).
    #[arg(short = 'm', long = "mmap-pages", default_value_t = 128)]
    mmap_pages: usize,
    /// The command to profile, with its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "CMD"
    )]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Record(args) => record_main(args),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("sampler: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn record_main(args: RecordArgs) -> Result<i32> {
    if !args.mmap_pages.is_power_of_two() {
        bail!(
            "-m/--mmap-pages must be a power of two (got {})",
            args.mmap_pages
        );
    }
    let opts = RecordOptions {
        command: args.command,
        frequency_hz: args.frequency,
        mmap_pages: args.mmap_pages,
    };
    let output = std::fs::File::create(&args.output).with_context(|| {
        format!(
            "cannot write the profile to {} (choose another -o)",
            args.output.display()
        )
    })?;
    // Samples are unwound and interned while the command runs (see ProfileBuilder).
    let mut builder = profile::ProfileBuilder::new(symbolicate::kernel_text_start());
    let (info, exit) = match record::record_command(&opts, &mut |events| builder.add_events(events))
    {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&args.output);
            return Err(e);
        }
    };
    let exited = Instant::now();
    let built = builder.finish(&info);
    let profile = symbolicate::symbolicate(built.profile, &built.lib_binaries);
    emit::write_firefox(&profile, output, &args.output)?;
    give_to_sudo_user(&args.output)?;
    let write_ms = exited.elapsed().as_secs_f64() * 1000.0;

    let samples: usize = profile.threads.iter().map(|t| t.samples.len()).sum();
    let m = &profile.meta;
    eprintln!(
        "sampler: command {}",
        match exit {
            record::CommandExit::Code(c) => format!("exited with code {c}"),
            record::CommandExit::Signal(s) => format!("was killed by signal {s}"),
        }
    );
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
    if m.truncated_stacks > 0 {
        eprintln!(
            "sampler: {} stacks hit the kernel's frame limit and end in [truncated]",
            m.truncated_stacks
        );
    }
    if m.throttled > 0 {
        eprintln!(
            "sampler: the kernel throttled sampling {} times (lower -F)",
            m.throttled
        );
    }
    if !profile.libs_without_symbols.is_empty() {
        let names: Vec<&str> = profile
            .libs_without_symbols
            .iter()
            .map(|l| profile.libs[l.index()].name.as_str())
            .collect();
        eprintln!(
            "sampler: no symbols for some addresses in: {}",
            names.join(", ")
        );
    }
    eprintln!(
        "sampler: wrote {} ({:.0} ms after the command ended); open it at https://profiler.firefox.com (\"Load a profile from file\")",
        args.output.display(),
        write_ms
    );
    Ok(exit.shell_code())
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
