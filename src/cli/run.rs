//! `sampler record`: the whole pipeline for one run, record → replay → symbolicate →
//! emit, then the summary. The profile is unwound while the command runs, named once it
//! has ended, and written atomically; when it cannot be written where asked, it is
//! written elsewhere rather than lost.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;

use crate::cli::summary::Summary;
use crate::cli::{RecordArgs, RecordPlan};
use crate::emit;
use crate::events::RecordingInfo;
use crate::files::output;
use crate::files::sources::{self, Reader};
use crate::record;
use crate::replay::{Built, ProfileBuilder};
use crate::symbolicate;

/// Developer aid: where to write an unwinder fixture of the recording's first samples
/// (see `crate::replay`).
const CAPTURE_ENV: &str = "SAMPLER_CAPTURE_SAMPLES";

/// Records, names and writes; returns the exit code (the command's, or 0 for `-p`).
pub fn record(args: RecordArgs) -> Result<i32> {
    let view = args.view_options()?;
    let plan = args.plan()?;
    if let Some(continuous) = plan.continuous.clone() {
        return crate::cli::continuous::record(plan, continuous);
    }
    let root = nix::unistd::Uid::effective().is_root();
    let sudo = output::SudoUser::from_env();
    // Checked now, created only once the profile is complete: a failed run touches nothing.
    output::check_destination(&plan.output, root, sudo)?;
    // Samples are unwound and interned while the command runs (see ProfileBuilder).
    let mut builder = live_builder(plan.mode);
    if let Some(path) = std::env::var_os(CAPTURE_ENV) {
        builder.capture_samples(PathBuf::from(path));
    }
    if let Some(period) = plan.options.off_cpu {
        builder.record_off_cpu(period);
    }
    let (info, ended, teardown) =
        record::record(&plan.options, &mut |events: &[crate::events::Event]| {
            builder.add_events(events)
        })?;
    let exited = Instant::now();
    stop_naming_on_signals();
    let built = builder.finish(&info);
    let symbol_options = naming_options(&built, &info, plan.debug.symbol_options());
    let mut profile = symbolicate::symbolicate(built.profile, &built.lib_binaries, &symbol_options);
    if plan.sources && plan.format == emit::Format::Firefox {
        let hottest = profile.source_files_by_samples();
        profile.sources = sources::read_texts(
            &hottest,
            sources::MAX_SOURCE_BYTES,
            Reader::for_this_process(),
        );
    }
    let written = emit::write(&profile, plan.format, &plan.export, &plan.output, sudo);
    if let Err(e) = written {
        return Err(save_elsewhere(e, &profile, &plan, sudo));
    }
    let write_ms = exited.elapsed().as_secs_f64() * 1000.0;
    if let Some(signal) = crate::record::interrupt::stopped() {
        crate::say!(
            "sampler: {signal} stopped the naming: the profile has the names found until then (libraries not reached are listed below)"
        );
    }
    // After the profile, which it must not delay; a cache that cannot be written only
    // means that the next run reads the debug information again.
    save_cache(&symbol_options);
    save_tables(&plan.tables);
    // Its messages (a frame limit that could not be put back) come before the summary.
    drop(teardown);
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
    let code = match ended {
        record::Ended::Command(exit) => exit.shell_code(),
        record::Ended::Detached(_) => 0,
    };
    // Sent once the file is written, so that a back end that is down loses nothing; a
    // failed send is an error of sampler's own (exit 1) unless the command's code says more.
    let code = match emit::push::send_all(&profile, &plan.push, true, &plan.output) {
        Err(e) => {
            crate::say!("sampler: error: {e:#}");
            if code == 0 {
                1
            } else {
                code
            }
        }
        Ok(()) => code,
    };
    // Last: the view serves the file until Ctrl-C.
    if let Some(options) = view {
        crate::cli::view::view(std::slice::from_ref(&plan.output), &options)?;
    }
    Ok(code)
}

/// A builder for a recording under way: it reads the recorded processes' memory.
pub(crate) fn live_builder(mode: crate::unwind::UnwindMode) -> ProfileBuilder {
    ProfileBuilder::live(
        mode,
        Box::new(crate::record::procmem::LiveMemory::default()),
    )
}

/// Once recording is over: naming can take long (a slow debuginfod server), and a stop
/// signal now ends it, the profile keeping the names found until then.
pub(crate) fn stop_naming_on_signals() {
    if let Err(e) = crate::record::interrupt::watch(&record::STOP_SIGNALS) {
        crate::say!("sampler: warning: signals cannot stop the naming: {e}");
    }
}

/// The naming options for what `built` holds of a recording described by `info`, on top
/// of `base` (the command line's).
pub(crate) fn naming_options(
    built: &Built,
    info: &RecordingInfo,
    base: symbolicate::SymbolOptions,
) -> symbolicate::SymbolOptions {
    symbolicate::SymbolOptions {
        // The kernel's symbols are read when a sample was in the kernel, its addresses
        // are shown, and the cache does not name every frame.
        read_kallsyms: built.kernel_frames && info.kernel_text.is_some(),
        jit_dumps: built.jit_dumps.clone(),
        jit_users: built.jit_users.clone(),
        ..base
    }
}

/// When the profile could not be written where asked (its file system full or
/// read-only), the recording is not lost: it goes to a new file elsewhere, and the error
/// says where.
fn save_elsewhere(
    error: anyhow::Error,
    profile: &crate::profile::Profile,
    plan: &RecordPlan,
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

/// Writes what symbolication added to the symbol cache; says why when it could not.
pub(crate) fn save_cache(opts: &symbolicate::SymbolOptions) {
    if let Some(Err(why)) = opts.cache.as_ref().map(|c| c.save()) {
        crate::say!("sampler: symbol cache: {why}");
    }
}

/// Puts the unwind tables compiled this run into their cache, after the profile.
pub(crate) fn save_tables(tables: &crate::unwind::table::TableCache) {
    if let Err(why) = tables.save() {
        crate::say!("sampler: unwind table cache: {why}");
    }
}
