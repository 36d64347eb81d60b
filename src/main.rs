//! The `sampler` binary: parses the command line ([`sampler::cli`]), runs the pipeline
//! for the subcommand, and turns an error into one line and a non-zero exit.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use sampler::cli::{self, inspect, Cli, Command};
use sampler::record::{self, stack_limit};

fn main() -> ExitCode {
    record::tune_allocator();
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = match cli.command {
        Command::Record(args) => {
            let code = cli::run::record(args);
            // A download a signal made naming give up on may still be writing its new
            // file into the debuginfod cache: it goes with sampler.
            sampler::files::usercache::remove_unfinished();
            code
        }
        Command::Symbolize(args) => inspect::symbolize(args).map(|()| 0),
        Command::Convert(args) => inspect::convert(args).map(|()| 0),
        Command::Diff(args) => cli::diff::diff(args).map(|()| 0),
        Command::Demangle { names } => inspect::demangle(&names).map(|()| 0),
        Command::View(args) => inspect::view(args).map(|()| 0),
        Command::RestoreMaxStack { pid, start } => {
            stack_limit::watchdog_main(pid, start).map(|()| 0)
        }
        Command::ContinueStopped => record::guardian_main().map(|()| 0),
        Command::TracepointId { name } => record::tracepoint_id_main(&name).map(|()| 0),
        Command::ReadSources { budget } => {
            sampler::files::sources::read_sources_main(budget).map(|()| 0)
        }
        Command::Report(args) => {
            let sub = matches
                .subcommand_matches("report")
                .expect("the report subcommand was parsed");
            cli::report_transforms(sub).and_then(|t| inspect::report(args, &t).map(|()| 0))
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
