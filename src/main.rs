//! The `sampler` binary: parses the command line ([`sampler::cli`]), runs the pipeline
//! for the subcommand, and turns an error into one line and a non-zero exit.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches};

use sampler::cli::{
    self, Cli, Command, ConvertArgs, RecordArgs, ReportArgs, SymbolizeArgs, ViewArgs,
};
use sampler::emit::{self, output};
use sampler::record::{self, stack_limit};
use sampler::replay::ProfileBuilder;
use sampler::summary::{how_to_open, Summary};
use sampler::symbolicate;

fn main() -> ExitCode {
    record::tune_allocator();
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = match cli.command {
        Command::Record(args) => {
            let code = record_main(args);
            // A download a signal made naming give up on may still be writing its new
            // file into the debuginfod cache: it goes with sampler.
            sampler::usercache::remove_unfinished();
            code
        }
        Command::Symbolize(args) => symbolize_main(args).map(|()| 0),
        Command::Convert(args) => convert_main(args).map(|()| 0),
        Command::View(args) => view_main(args).map(|()| 0),
        Command::Demangle { names } => demangle_main(&names).map(|()| 0),
        Command::RestoreMaxStack { pid, start } => {
            stack_limit::watchdog_main(pid, start).map(|()| 0)
        }
        Command::ContinueStopped => record::guardian_main().map(|()| 0),
        Command::Report(args) => {
            let sub = matches
                .subcommand_matches("report")
                .expect("the report subcommand was parsed");
            cli::report_transforms(sub).and_then(|t| report_main(args, &t).map(|()| 0))
        }
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            sampler::say!("sampler: error: {e:#}");
            // A command that could not be run exits as a shell would have (127, 126).
            let code = e
                .downcast_ref::<record::NotRun>()
                .map_or(1, record::NotRun::exit_code);
            ExitCode::from(code as u8)
        }
    }
}

/// Developer aid: where to write an unwinder fixture of the recording's first samples
/// (see `sampler::replay`).
const CAPTURE_ENV: &str = "SAMPLER_CAPTURE_SAMPLES";

/// Records, names and writes; returns the exit code (the command's, or 0 for `-p`).
fn record_main(args: RecordArgs) -> Result<i32> {
    let view = args.view_options()?;
    let plan = args.plan()?;
    let root = nix::unistd::Uid::effective().is_root();
    let sudo = output::SudoUser::from_env();
    // Checked now, created only once the profile is complete: a failed run touches nothing.
    output::check_destination(&plan.output, root, sudo)?;
    // Samples are unwound and interned while the command runs (see ProfileBuilder).
    let mut builder =
        ProfileBuilder::live(plan.mode, Box::new(sampler::procmem::LiveMemory::default()));
    if let Some(path) = std::env::var_os(CAPTURE_ENV) {
        builder.capture_samples(PathBuf::from(path));
    }
    if let Some(period) = plan.options.off_cpu {
        builder.record_off_cpu(period);
    }
    let (info, ended) = record::record(&plan.options, &mut |events| builder.add_events(events))?;
    let exited = Instant::now();
    // Naming can take long (a slow debuginfod server): a signal now stops it, and the
    // profile is written with the names found until then.
    if let Err(e) = sampler::interrupt::watch(&record::STOP_SIGNALS) {
        sampler::say!("sampler: warning: signals cannot stop the naming: {e}");
    }
    // Where the kernel's text starts, which places kernel frames, read only when a sample
    // was in the kernel; its symbols are read when the cache does not name every frame.
    let (kernel_base, kernel) = match builder.has_kernel_frames() {
        true => symbolicate::kernel_base(),
        false => (None, None),
    };
    let built = builder.finish(&info, kernel_base);
    let symbol_options = symbolicate::SymbolOptions {
        kernel,
        read_kallsyms: kernel_base.is_some(),
        jit_dumps: built.jit_dumps.clone(),
        jit_users: built.jit_users.clone(),
        ..plan.debug.symbol_options()
    };
    let profile = symbolicate::symbolicate(built.profile, &built.lib_binaries, &symbol_options);
    let written = emit::write(&profile, plan.format, &plan.export, &plan.output, sudo);
    if let Err(e) = written {
        return Err(save_elsewhere(e, &profile, &plan, sudo));
    }
    let write_ms = exited.elapsed().as_secs_f64() * 1000.0;
    if let Some(signal) = sampler::interrupt::stopped() {
        sampler::say!(
            "sampler: {signal} stopped the naming: the profile has the names found until then (libraries not reached are listed below)"
        );
    }
    // After the profile, which it must not delay; a cache that cannot be written only
    // means that the next run reads the debug information again.
    save_cache(&symbol_options);
    Summary {
        info: &info,
        profile: &profile,
        ended,
        mode: plan.mode,
        format: plan.format,
        output: &plan.output,
        write_ms,
        root,
        stack_bytes: plan.options.stack_bytes,
        truncated: built.truncated,
        no_unwind_info_in: &built.no_unwind_info_in,
        debuginfod: symbol_options.debuginfod.as_ref().and_then(|d| d.summary()),
    }
    .print();
    if let Some(options) = view {
        sampler::view::view(std::slice::from_ref(&plan.output), &options)?;
    }
    Ok(match ended {
        record::Ended::Command(exit) => exit.shell_code(),
        record::Ended::Detached(_) => 0,
    })
}

/// When the profile could not be written where asked (its file system full or
/// read-only), the recording is not lost: it goes to a new file elsewhere, and the error
/// says where.
fn save_elsewhere(
    error: anyhow::Error,
    profile: &sampler::profile::Profile,
    plan: &cli::RecordPlan,
    sudo: Option<output::SudoUser>,
) -> anyhow::Error {
    match emit::write_elsewhere(profile, plan.format, &plan.export, &plan.output, sudo) {
        Ok(path) => anyhow::anyhow!(
            "{error:#}; the profile was written to {} instead",
            path.display()
        ),
        Err(failures) => anyhow::anyhow!(
            "{error:#}; the profile is lost: it could not be written elsewhere either ({})",
            failures.join("; ")
        ),
    }
}

/// One name per argument, else per line of standard input; names that are not mangled
/// are printed as they are.
fn demangle_main(names: &[String]) -> Result<()> {
    use std::io::{BufRead, Write};
    let write_all = || -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let mut put = |name: &str| writeln!(out, "{}", symbolicate::symbols::demangle(name));
        if names.is_empty() {
            for line in std::io::stdin().lock().lines() {
                put(&line?)?;
            }
        } else {
            names.iter().try_for_each(|name| put(name))?;
        }
        out.flush()
    };
    match write_all() {
        // The reader has all it wanted (`| head`).
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot demangle standard input to standard output"),
    }
}

/// Writes what symbolication added to the symbol cache; says why when it could not.
fn save_cache(opts: &symbolicate::SymbolOptions) {
    if let Some(Err(why)) = opts.cache.as_ref().map(|c| c.save()) {
        sampler::say!("sampler: symbol cache: {why}");
    }
}

fn symbolize_main(args: SymbolizeArgs) -> Result<()> {
    use std::io::{Read, Write};
    let binary = sampler::binary::Binary::open(&args.exe)
        .with_context(|| format!("cannot read {} as an ELF file", args.exe.display()))?;
    if let Some(why) = &binary.damaged {
        anyhow::bail!("{} is not read: {why}", args.exe.display());
    }
    let opts = args.debug.symbol_options();
    let path = args.exe.canonicalize().unwrap_or(args.exe.clone());
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
    let (facts, infos) =
        symbolicate::name_file(&binary, &path.to_string_lossy(), &addresses, &opts)
            .context("not an ELF file")?;
    if let Some(line) = opts.debuginfod.as_ref().and_then(|d| d.summary()) {
        sampler::say!("sampler: {line}");
    }
    if let Some(why) = &facts.no_debug_info {
        sampler::say!(
            "sampler: {}: no source lines or inlined calls: {why}",
            args.exe.display()
        );
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (address, info) in addresses.iter().zip(infos) {
        writeln!(out, "0x{address:x}")?;
        let names = info.function_names();
        if names.is_empty() {
            writeln!(out, "??\n??:0")?;
        }
        for (depth, name) in names.iter().enumerate().rev() {
            let frame = info.frames.get(depth);
            let file = frame.and_then(|f| f.file.as_deref()).unwrap_or("??");
            let line = frame.and_then(|f| f.line).unwrap_or(0);
            writeln!(out, "{name}\n{file}:{line}")?;
        }
    }
    out.flush()?;
    drop(out);
    save_cache(&opts);
    Ok(())
}

fn report_main(args: ReportArgs, transforms: &[sampler::calltree::Transform]) -> Result<()> {
    use std::io::{IsTerminal, Write};
    let tty = std::io::stdout().is_terminal();
    let options = args.options(tty)?;
    let mut profile = emit::load::read_profile(&args.file)?;
    if tty {
        emit::escape_for_terminal(&mut profile);
    }
    let request = emit::report::ReportRequest {
        file: &args.file,
        threads: &args.threads,
        per_thread: args.per_thread,
        lines: args.lines.as_deref(),
        transforms,
        invert: args.invert,
        options,
    };
    let source_line = |file: &str, line: u32| {
        let text = source_line(file, line)?;
        Some(match tty {
            true => sampler::diag::terminal_safe(&text).into_owned(),
            false => text,
        })
    };
    let out = emit::report::render_report(&profile, &request, &source_line)
        .map_err(anyhow::Error::msg)?;
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

fn convert_main(args: ConvertArgs) -> Result<()> {
    use std::io::IsTerminal;
    let (format, output_path) = cli::convert_output(args.format, args.output, &args.file)?;
    let to_stdout = output_path.as_os_str() == "-";
    let tty = to_stdout && std::io::stdout().is_terminal();
    let root = nix::unistd::Uid::effective().is_root();
    let sudo = output::SudoUser::from_env();
    if tty && format == emit::Format::Pprof {
        anyhow::bail!(
            "pprof is a binary format: write it to a file (-o NAME.pb.gz), not to a terminal"
        );
    }
    if !to_stdout {
        output::check_destination(&output_path, root, sudo)?;
    }
    let mut profile = emit::load::read_profile(&args.file)?;
    if tty {
        emit::escape_for_terminal(&mut profile);
    }
    let time = args.time.map(cli::TimeArg::view);
    if time.is_some_and(|t| t != sampler::profile::TimeView::Cpu) && !profile.meta.off_cpu {
        anyhow::bail!(
            "{} has no off-CPU time (record with --off-cpu); only --time cpu can be written",
            args.file.display()
        );
    }
    let export = emit::ExportOptions {
        thread_roots: args.thread_roots,
        time,
    };
    if to_stdout {
        let mut stdout = std::io::stdout().lock();
        return match emit::write_stream(&profile, format, &export, &mut stdout) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => other.context("cannot write the conversion to standard output"),
        };
    }
    emit::write(&profile, format, &export, &output_path, sudo)
        .with_context(|| format!("converting {}", args.file.display()))?;
    sampler::say!(
        "sampler: wrote {}; {}",
        output_path.display(),
        how_to_open(format, &output_path)
    );
    Ok(())
}

/// Serves one profile, or two to compare, to the Firefox Profiler until Ctrl-C (or until
/// fetched, with `--exit-after-fetch`).
fn view_main(args: ViewArgs) -> Result<()> {
    let options = args.serve.options()?;
    let files: Vec<PathBuf> = std::iter::once(args.file).chain(args.file2).collect();
    // Ctrl-C ends the serving, not sampler in the middle of it.
    sampler::interrupt::watch(&record::STOP_SIGNALS)
        .context("cannot take the signals that stop the viewer's server")?;
    sampler::view::view(&files, &options)
}
