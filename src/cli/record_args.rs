//! `sampler record`'s command line: its clap arguments, and the checks that turn them
//! into a [`RecordPlan`] (refused with one line that says what to change, before
//! anything is recorded or written).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};

use super::{output_choice, DebugArgs, FormatArg, ServeArgs, TimeArg, TIME_HELP};
use crate::emit;
use crate::events::{Rate, SamplingEvent};
use crate::record::{self, RecordOptions};
use crate::unwind::table::TableCache;
use crate::unwind::UnwindMode;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum UnwindArg {
    Hybrid,
    Fp,
    Dwarf,
    Kernel,
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
    /// How user stacks are unwound: kernel (CFI tables walked in the kernel at each
    /// sample by an eBPF program; needs root), hybrid (CFI through a stack copy, then the
    /// frame-pointer chain), fp (frame pointers only, cheapest), dwarf (CFI only)
    /// [default: kernel where it can run (as root, not with --off-cpu), else hybrid].
    #[arg(long = "unwind", value_enum)]
    pub unwind: Option<UnwindArg>,
    /// Bytes of user stack copied with each sample [default: fp 512, hybrid 16384, dwarf
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
    /// Once the profile is written, open it in the Firefox Profiler as `sampler view`
    /// does (not an SVG flame graph).
    #[arg(long = "view")]
    pub view: bool,
    #[command(flatten)]
    pub serve: ServeArgs,
    /// The command to profile, with its arguments (which may start with `-`; an option
    /// of sampler's own before the command is still an option, or an error).
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
    #[command(flatten)]
    pub push: super::push::PushArgs,
    /// Record continuously: cut the recording into windows of SECONDS, each named,
    /// written (-o DIR/) and sent (--otlp, --push) as it closes, until -d, Ctrl-C or
    /// SIGTERM (which ends the last window early); at 19 Hz unless -F or -c says otherwise.
    #[arg(long = "every", value_name = "SECONDS")]
    pub every: Option<f64>,
    /// With --every and --otlp or --push: where windows wait while the back end is down or
    /// slow, sent in order when it answers [default: ~/.cache/sampler/spool, of the user
    /// who ran sudo under sudo].
    #[arg(long = "spool", value_name = "DIR", requires = "every")]
    pub spool: Option<PathBuf>,
    /// The most the spool holds (bytes, or with K, M or G); past it the oldest windows
    /// are dropped, and counted [default: 256M].
    #[arg(long = "spool-max", value_name = "SIZE", requires = "every", value_parser = parse_size)]
    pub spool_max: Option<u64>,
}

/// The sampling rate of a continuous recording unless `-F` or `-c` says otherwise: 19 Hz,
/// as the fleet profilers sample (the OpenTelemetry eBPF profiler's default is 20 Hz,
/// Parca's agent 19 Hz; a rate that is not a divisor of common timer rates avoids
/// sampling in step with periodic work).
pub const CONTINUOUS_FREQUENCY_HZ: u64 = 19;

/// The shortest and longest window `--every` takes: from 1 s (shorter windows are
/// mostly naming and sending) to a day.
pub const MIN_WINDOW_SECONDS: f64 = 1.0;
pub const MAX_WINDOW_SECONDS: f64 = 24.0 * 3600.0;

/// A continuous recording (`--every`), checked.
#[derive(Clone, Debug)]
pub struct Continuous {
    pub every: Duration,
    /// Where each window's file is written (`-o DIR/`), if anywhere.
    pub dir: Option<PathBuf>,
    /// Where windows wait to be sent (`--spool`); `None`: the user's cache.
    pub spool: Option<PathBuf>,
    pub spool_bytes: u64,
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
    /// A continuous recording (`--every`).
    pub continuous: Option<Continuous>,
    /// The kernel walker's unwind tables (also in `options`), saved after the profile.
    pub tables: Arc<TableCache>,
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
        let continuous = self.continuous(&target)?;
        let tables = Arc::new(TableCache::from_env(!self.debug.no_cache));
        let rate = match (self.period, self.frequency) {
            (Some(p), _) => Rate::Period(p),
            (None, Some(hz)) => Rate::Frequency(hz),
            (None, None) if continuous.is_some() => Rate::Frequency(CONTINUOUS_FREQUENCY_HZ),
            (None, None) => Rate::Frequency(DEFAULT_FREQUENCY_HZ),
        };
        let duration = self.duration(&target)?;
        let mode = self.unwind.map_or(UnwindMode::Hybrid, UnwindArg::mode);
        let stack_bytes = self
            .stack_size
            .unwrap_or_else(|| mode.default_stack_bytes());
        if !stack_bytes.is_multiple_of(8) || !(8..=65_528).contains(&stack_bytes) {
            bail!("--stack-size must be a multiple of 8 between 8 and 65528 (got {stack_bytes})");
        }
        if let Some(pages) = self.mmap_pages {
            check_ring_pages(pages, Some((stack_bytes, mode)))?;
        }
        let output = self.output.clone().filter(|_| continuous.is_none());
        let (format, output) = output_choice(self.format, output)?;
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
                every: continuous.as_ref().map(|c| c.every),
                kernel_unwind: UnwindArg::kernel_unwind(self.unwind),
                kernel_tables: tables.clone(),
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
            continuous,
            tables,
        })
    }

    /// `-d`, checked.
    fn duration(&self, target: &record::Target) -> Result<Option<Duration>> {
        Ok(match self.duration {
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
        })
    }

    /// `--every` and what goes with it, checked: a window's length, and where windows go
    /// (files in a directory, a back end, or both).
    fn continuous(&self, target: &record::Target) -> Result<Option<Continuous>> {
        let Some(seconds) = self.every else {
            return Ok(None);
        };
        if !(MIN_WINDOW_SECONDS..=MAX_WINDOW_SECONDS).contains(&seconds) {
            bail!("--every must be a number of seconds from {MIN_WINDOW_SECONDS} to {MAX_WINDOW_SECONDS} (a day) (got {seconds})");
        }
        if matches!(target, record::Target::Command(_)) {
            bail!("--every is for -a and -p, which are recorded until -d, Ctrl-C or SIGTERM; a command is recorded whole");
        }
        if self.off_cpu {
            bail!("--off-cpu is not cut into windows: record off-CPU time without --every");
        }
        if self.view {
            bail!("--view opens one profile; --every writes one per window: open them with `sampler view DIR/*.json.gz`");
        }
        let dir = match &self.output {
            None => None,
            Some(dir) if dir.is_dir() => Some(dir.clone()),
            Some(dir) if dir.as_os_str().to_string_lossy().ends_with('/') => bail!(
                "-o {}: no such directory (create it first)",
                dir.display()
            ),
            Some(file) => bail!(
                "-o {}: with --every, -o names the directory each window's file goes to (end it with /)",
                file.display()
            ),
        };
        if dir.is_none() && self.push.otlp.is_none() && self.push.push.is_none() {
            bail!("--every: say where the windows go: -o DIR/, --otlp [URL] or --push URL");
        }
        Ok(Some(Continuous {
            every: Duration::from_secs_f64(seconds),
            dir,
            spool: self.spool.clone(),
            spool_bytes: self.spool_max.unwrap_or(emit::spool::DEFAULT_SPOOL_BYTES),
        }))
    }
}

/// A size in bytes, with an optional K, M or G (powers of 1024): from 1 KiB to 1 TiB.
fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let upper = text.trim().to_ascii_uppercase();
    let upper = upper
        .strip_suffix("IB")
        .or(upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (number, shift) = match upper.char_indices().last() {
        Some((i, 'K')) => (&upper[..i], 10),
        Some((i, 'M')) => (&upper[..i], 20),
        Some((i, 'G')) => (&upper[..i], 30),
        _ => (upper, 0),
    };
    let bytes = number
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{text:?} is not a size (bytes, or a number with K, M or G)"))?;
    if !(1 << 10..=1 << 40).contains(&bytes) {
        return Err(format!("{text}: give a size from 1K to 1024G"));
    }
    Ok(bytes)
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
    /// Whether the kernel walks user stacks: required with `--unwind kernel`, where it
    /// can without `--unwind`, not with another mode.
    fn kernel_unwind(arg: Option<UnwindArg>) -> record::KernelUnwind {
        match arg {
            Some(UnwindArg::Kernel) => record::KernelUnwind::Require,
            Some(_) => record::KernelUnwind::Off,
            None => record::KernelUnwind::Prefer,
        }
    }

    pub fn mode(self) -> UnwindMode {
        match self {
            UnwindArg::Hybrid => UnwindMode::Hybrid,
            UnwindArg::Fp => UnwindMode::Fp,
            UnwindArg::Dwarf => UnwindMode::Dwarf,
            // Samples the kernel's walker hands back are unwound as hybrid does.
            UnwindArg::Kernel => UnwindMode::Hybrid,
        }
    }
}
