//! The subcommands that read what sampler or a compiler wrote, without recording:
//! `symbolize` (addresses of a file to names and lines), `report` (a profile in the
//! terminal), `convert` (a profile to another format), `demangle` and `view` (a profile
//! in the Firefox Profiler).

use anyhow::{Context, Result};

use crate::cli::summary::how_to_open;
use crate::cli::{self, ConvertArgs, ReportArgs, SymbolizeArgs};
use crate::emit;
use crate::files::output;
use crate::symbolicate;

pub fn symbolize(args: SymbolizeArgs) -> Result<()> {
    use std::io::{Read, Write};
    let binary = crate::files::binary::Binary::open(&args.exe)
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
        crate::say!("sampler: {line}");
    }
    if let Some(why) = &facts.no_debug_info {
        crate::say!(
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
    crate::cli::run::save_cache(&opts);
    Ok(())
}

pub fn report(args: ReportArgs, transforms: &[crate::calltree::Transform]) -> Result<()> {
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
            true => crate::files::diag::terminal_safe(&text).into_owned(),
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

pub fn convert(args: ConvertArgs) -> Result<()> {
    use std::io::IsTerminal;
    let push = args.push.destinations()?;
    // With --otlp or --push alone, the input is the file kept: nothing else is written.
    if !push.is_empty() && args.format.is_none() && args.output.is_none() {
        let profile = emit::load::read_profile(&args.file)?;
        return emit::push::send_all(&profile, &push, false, &args.file);
    }
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
    if tty && format == emit::Format::Otlp {
        anyhow::bail!(
            "otlp is a binary format: write it to a file (-o NAME.otlp), not to a terminal"
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
    if time.is_some_and(|t| t != crate::profile::TimeView::Cpu) && !profile.meta.off_cpu {
        anyhow::bail!(
            "{} has no off-CPU time (record with --off-cpu); only --time cpu can be written",
            args.file.display()
        );
    }
    let export = emit::ExportOptions {
        thread_roots: args.thread_roots,
        time,
        just_recorded: false,
    };
    if to_stdout {
        let mut stdout = std::io::stdout().lock();
        match emit::write_stream(&profile, format, &export, &mut stdout) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other.context("cannot write the conversion to standard output")?,
        }
        return emit::push::send_all(&profile, &push, false, &args.file);
    }
    emit::write(&profile, format, &export, &output_path, sudo)
        .with_context(|| format!("converting {}", args.file.display()))?;
    crate::say!(
        "sampler: wrote {}; {}",
        output_path.display(),
        how_to_open(format, &output_path)
    );
    emit::push::send_all(&profile, &push, false, &output_path)
}

/// One name per argument, else per line of standard input; names that are not mangled
/// are printed as they are.
pub fn demangle(names: &[String]) -> Result<()> {
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

/// Serves one profile, or two to compare, to the Firefox Profiler until Ctrl-C (or until
/// fetched, with `--exit-after-fetch`).
pub fn view(args: cli::ViewArgs) -> Result<()> {
    let options = args.serve.options()?;
    let files: Vec<std::path::PathBuf> = std::iter::once(args.file).chain(args.file2).collect();
    // Ctrl-C ends the serving, not sampler in the middle of it.
    crate::record::interrupt::watch(&crate::record::STOP_SIGNALS)
        .context("cannot take the signals that stop the viewer's server")?;
    crate::cli::view::view(&files, &options)
}
