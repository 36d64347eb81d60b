//! The end-of-recording summary: what was recorded and how it ended, what the profile
//! lacks and why (frames cut, samples lost, names missing, an empty profile), and where
//! it was written. A value first, so that its lines are tested; printed on stderr, where
//! a line that cannot be written is dropped.

use std::path::Path;

use crate::emit::Format;
use crate::events::{OffCpuRecording, RecordingInfo, Scope, StackLimit};
use crate::profile::{off_cpu_ns, Missing, Profile, TimeView};
use crate::record::{CommandExit, DetachReason, Ended};
use crate::unwind::{TruncatedBy, UnwindMode};

/// Everything the summary says.
pub struct Summary<'a> {
    pub info: &'a RecordingInfo,
    pub profile: &'a Profile,
    pub ended: Ended,
    pub mode: UnwindMode,
    pub format: Format,
    pub output: &'a Path,
    /// Milliseconds from the end of the recording to the file being written.
    pub write_ms: f64,
    /// Whether sampler runs as root (what it could have done about a refused limit).
    pub root: bool,
    /// Bytes of user stack copied with each sample.
    pub stack_bytes: u32,
    /// The truncated stacks by cause.
    pub truncated: TruncatedBy,
    /// Where stacks cut by code without unwind rules ended: library, count; most first.
    pub no_unwind_info_in: &'a [(String, u64)],
    /// What debuginfod fetched, or why not (see [`crate::symbolicate::debuginfod::Client::summary`]).
    pub debuginfod: Option<String>,
}

/// Runtimes whose JIT code keeps no frame pointers unless told to, by a library they map,
/// with what tells them.
const JIT_FLAGS: [(&str, &str); 1] = [(
    "libjvm.so",
    "the JVM's compiled code keeps no frame pointers: run java with -XX:+PreserveFramePointer, and stacks go on through it",
)];

/// The flag that gives frame pointers to the JIT code stacks were cut in (code named by
/// a perf map), when the profile's processes run a runtime that has one.
fn jit_flag_hint(cut_in: &[(String, u64)], profile: &Profile) -> Option<String> {
    let in_jit_code = cut_in
        .iter()
        .any(|(lib, _)| lib.starts_with("perf-") && lib.ends_with(".map"));
    if !in_jit_code {
        return None;
    }
    JIT_FLAGS
        .iter()
        .find(|(lib, _)| profile.libs.iter().any(|l| l.name == *lib))
        .map(|(_, hint)| hint.to_string())
}

impl Summary<'_> {
    /// With `--off-cpu`: how much time the threads spent off the CPU, and how often they
    /// left it.
    fn off_cpu_line(&self) -> Option<String> {
        let OffCpuRecording::On { switch_period } = self.info.off_cpu else {
            return None;
        };
        let rows = || self.profile.threads.iter().flat_map(|t| &t.samples);
        let [blocked, preempted] = off_cpu_ns(rows());
        let switches = rows().filter(|s| s.weight.off_cpu_kind().is_some()).count();
        Some(format!(
            "off-CPU: {} ms blocked, {} ms preempted, {switches} stacks where threads left the CPU{}",
            crate::emit::ms_text(blocked),
            crate::emit::ms_text(preempted),
            match switch_period {
                1 => String::new(),
                n => format!(" (every {n}th switch's)"),
            }
        ))
    }

    /// How the recording followed its threads, when the user should know: per task
    /// (short threads may be missed), whole CPUs (`-C`), and what a command's samples
    /// stand for against the CPU time it used.
    fn scope_lines(&self) -> Vec<String> {
        let info = self.info;
        let m = &self.profile.meta;
        let mut out = Vec::new();
        if info.scope == Scope::Tasks {
            out.push(format!(
                "per-task sampling (watching whole CPUs needs root or CAP_PERFMON): threads that ran less than one sampling period ({}) may have no samples; as root every thread is counted",
                match (info.event.is_time(), info.period) {
                    (true, Some(ns)) => format!("{} ms", crate::emit::ms_text(ns)),
                    (_, Some(p)) => format!("{p} {}", info.event.name()),
                    (_, None) => format!("1/{} s", info.frequency_hz),
                }
            ));
        }
        if !info.cpus.is_empty() {
            let list = crate::record::cpu_list_text(&info.cpus);
            out.push(format!("recorded on CPU {list} only (-C)"));
        }
        if info.lost_elsewhere > 0 {
            out.push(format!(
                "the CPUs' buffers also lost {} samples while other processes ran; the kernel does not say whose, so some may be the recorded processes' (a larger -m keeps them)",
                info.lost_elsewhere
            ));
        }
        if info.own_samples > 0 {
            let all = info.own_samples + on_cpu_samples(self.profile) as u64;
            out.push(format!(
                "sampler's own samples ({}, {:.1}% of all) are left out of the profile",
                info.own_samples,
                info.own_samples as f64 * 100.0 / all as f64
            ));
        }
        if let (Some(cpu), true, Some(_)) = (info.command_cpu, info.event.is_time(), m.period) {
            let sampled_ns = on_cpu_weight(self.profile) * m.interval_ns();
            let used_ns = cpu.as_nanos() as u64;
            out.push(format!(
                "the command used {} ms of CPU (getrusage); its samples stand for {} ms{}",
                crate::emit::ms_text(used_ns),
                crate::emit::ms_text(sampled_ns),
                match used_ns {
                    0 => String::new(),
                    n => format!(" ({:.0}%)", sampled_ns as f64 * 100.0 / n as f64),
                }
            ));
        }
        out
    }

    /// The summary's lines, each starting with `sampler: `.
    pub fn lines(&self) -> Vec<String> {
        let (info, profile) = (self.info, self.profile);
        let m = &profile.meta;
        let samples = on_cpu_samples(profile);
        let mut out = vec![match self.ended {
            Ended::Command(CommandExit::Code(c)) => format!("command exited with code {c}"),
            Ended::Command(CommandExit::Signal(s)) => format!("command was killed by signal {s}"),
            Ended::Detached(DetachReason::Duration) => {
                "recorded for the -d duration; the processes go on running".to_string()
            }
            Ended::Detached(DetachReason::Interrupted) => {
                "recording interrupted; the processes go on running".to_string()
            }
            Ended::Detached(DetachReason::AllExited) => "every attached process exited".to_string(),
        }];
        if let Some(stopped) = info.stopped_for {
            out.push(format!(
                "the processes were stopped for {:.1} ms while sampler attached",
                stopped.as_secs_f64() * 1000.0
            ));
        }
        out.push(format!(
            "{} samples ({}), {} lost, {} threads in {} processes, {:.2} s",
            samples,
            rate_text(profile),
            m.lost_samples,
            profile.threads.len(),
            profile.processes.len(),
            m.duration_ms / 1000.0
        ));
        if samples > 0 {
            out.push(format!(
                "{} unwinding, {:.1} MB of samples ({} bytes per sample)",
                match info.walked_in_kernel {
                    true => "kernel (eBPF)",
                    false => self.mode.name(),
                },
                info.sample_bytes as f64 / 1e6,
                info.sample_bytes / samples as u64
            ));
        }
        out.extend(self.off_cpu_line());
        out.extend(self.scope_lines());
        out.extend(lost_by_thread(profile));
        out.extend(self.truncated_lines());
        out.extend(self.why_incomplete(samples));
        if m.throttled > 0 {
            out.push(format!(
                "the kernel throttled sampling {} times (lower -F)",
                m.throttled
            ));
        }
        out.extend(self.debuginfod.clone());
        out.extend(symbol_gaps(profile));
        out.push(format!(
            "wrote {} ({:.0} ms after the command ended); {}",
            self.output.display(),
            self.write_ms,
            how_to_open(self.format, self.output)
        ));
        if self.format == Format::Firefox {
            out.push(format!(
                "view it: {}",
                crate::cli::view::view_command(self.output)
            ));
        }
        out.into_iter().map(|l| format!("sampler: {l}")).collect()
    }

    pub fn print(&self) {
        for line in self.lines() {
            say!("{line}");
        }
    }

    /// One line for each cause of stacks that start with `[truncated]`, with what helps.
    fn truncated_lines(&self) -> Vec<String> {
        let t = self.truncated;
        let mut out = Vec::new();
        if t.stack_copy > 0 {
            out.push(format!(
                "{} stacks start with [truncated]: the copy of the stack taken with each sample ({} bytes) ended before their outermost frame, in code without frame pointers; a larger --stack-size (at most 65528) reaches further",
                t.stack_copy, self.stack_bytes
            ));
        }
        if t.no_unwind_info > 0 {
            let places: Vec<String> = self
                .no_unwind_info_in
                .iter()
                .take(3)
                .map(|(lib, n)| format!("{lib} ({n})"))
                .collect();
            out.push(format!(
                "{} stacks start with [truncated]: they reach code with neither unwind information nor frame pointers, in {} (a larger --stack-size does not help)",
                t.no_unwind_info,
                places.join(", ")
            ));
            out.extend(jit_flag_hint(self.no_unwind_info_in, self.profile));
        }
        if t.memory_gone > 0 {
            out.push(format!(
                "{} stacks start with [truncated]: their thread was sampled in the kernel as it exited, after its memory was released, so its user stack could not be walked",
                t.memory_gone
            ));
        }
        if t.stack_not_up > 0 {
            out.push(format!(
                "{} stacks start with [truncated]: a step of their unwinding did not move the stack pointer up (a frame-pointer chain that loops, or wrong unwind information), so their walk stopped there",
                t.stack_not_up
            ));
        }
        if t.frame_limit > 0 && self.info.gaps.stack_limit != StackLimit::Refused {
            out.push(format!(
                "{} stacks were deeper than --max-stack {} frames and start with [truncated]",
                t.frame_limit, self.info.max_stack
            ));
        }
        out
    }

    /// Why the profile is empty, or misses frames, processes or samples, where sampler
    /// knows: one line each, so that nothing is missing silently.
    fn why_incomplete(&self, samples: usize) -> Vec<String> {
        let info = self.info;
        let gaps = &info.gaps;
        let mut out = Vec::new();
        if gaps.stack_limit == StackLimit::Refused {
            let why = if self.root {
                "another perf session's callchain events (perf record -g, another profiler) keep the kernel from changing it"
            } else {
                "only root may change it"
            };
            out.push(format!(
                "stacks deeper than {} frames are cut and start with [truncated]: kernel.perf_event_max_stack could not be raised ({why})",
                info.max_stack
            ));
        }
        if gaps.unreadable_bytes > 0 {
            out.push(format!(
                "{} bytes of the ring buffers could not be parsed (a corrupt record); the about {} samples in them are counted as lost",
                gaps.unreadable_bytes, gaps.unreadable_samples
            ));
        }
        for pid in &gaps.left_stopped {
            out.push(format!(
                "pid {pid} was already stopped when sampler attached and was left so: a stopped process runs no code, so it has no samples (`kill -CONT {pid}` continues it)"
            ));
        }
        if !gaps.outliving.is_empty() {
            let list: Vec<String> = gaps
                .outliving
                .iter()
                .map(|(pid, name)| format!("{pid} ({name})"))
                .collect();
            out.push(format!(
                "{} processes the command started were still running when it exited, and were recorded only until then: {} (`sampler record -p PID` records a daemon)",
                list.len(),
                list.join(", ")
            ));
        }
        if samples == 0 {
            match &gaps.set_id_program {
                Some(file) => out.push(format!(
                    "no samples: {} is a set-user-ID or set-group-ID program, and the kernel stops sampling a program that gains privileges when it starts",
                    file.display()
                )),
                None if gaps.left_stopped.is_empty() => out.push(format!(
                    "no samples: what was recorded used less than one sampling period of CPU time ({:.1} ms at {} Hz), or waited the whole time",
                    1000.0 / info.frequency_hz.max(1) as f64,
                    info.frequency_hz
                )),
                None => {}
            }
        }
        out
    }
}

/// The event and how often it was sampled: "cpu-clock, 1000 Hz", "page-faults, every 1",
/// "page-faults, 1000 Hz, 51,200 events".
fn rate_text(profile: &Profile) -> String {
    let m = &profile.meta;
    match m.period {
        Some(_) => format!("{}, {}", m.event, m.rate_text()),
        None => format!(
            "{}, {}, {} events",
            m.event,
            m.rate_text(),
            on_cpu_weight(profile)
        ),
    }
}

/// The on-CPU samples of every thread.
fn on_cpu_samples(profile: &Profile) -> usize {
    profile
        .threads
        .iter()
        .flat_map(|t| &t.samples)
        .filter(|s| s.weight.off_cpu_kind().is_none())
        .count()
}

/// The on-CPU weight of every thread: samples, or events where the period varied.
fn on_cpu_weight(profile: &Profile) -> u64 {
    profile
        .threads
        .iter()
        .flat_map(|t| &t.samples)
        .map(|s| TimeView::Cpu.weight(s.weight, 0))
        .sum()
}

/// The threads that lost samples, most first (at most ten), so that a thread whose
/// profile is thin for that reason can be told apart.
fn lost_by_thread(profile: &Profile) -> Option<String> {
    let mut lost: Vec<_> = profile
        .threads
        .iter()
        .filter(|t| t.lost_samples > 0)
        .collect();
    if lost.is_empty() {
        return None;
    }
    lost.sort_by_key(|t| std::cmp::Reverse(t.lost_samples));
    let shown: Vec<String> = lost
        .iter()
        .take(10)
        .map(|t| format!("{} ({}) {}", t.name, t.tid, t.lost_samples))
        .collect();
    let more = lost.len().saturating_sub(10);
    // With off-CPU time, the stacks taken at every switch fill the buffers, which a lower
    // -F hardly changes.
    let fewer = match profile.meta.off_cpu {
        true => "a stack at fewer switches (--off-cpu-every 8) or a larger -m loses fewer",
        false => "a larger -m or a lower -F loses fewer",
    };
    Some(format!(
        "lost samples by thread: {}{} ({fewer})",
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ))
}

/// Which sampled libraries lack names or debug information, and why, so that a `0x…` or
/// `fn_0x…` frame or a missing line is explained.
fn symbol_gaps(profile: &Profile) -> Vec<String> {
    let mut out = Vec::new();
    for (missing, heading) in [
        (
            Missing::Symbols,
            "frames left as addresses (fn_0x… for a function's start, else 0x…), for want of symbols",
        ),
        (
            Missing::DebugInfo,
            "no source lines or inlined calls (install the debug package, pass --debug-root, or list a debuginfod server in DEBUGINFOD_URLS)",
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
        out.push(format!("{heading}:"));
        for g in gaps {
            out.push(format!("  {}: {}", profile.libs[g.lib.index()].name, g.why));
        }
    }
    out
}

/// What to do with a written file, for the last line of the summary.
pub fn how_to_open(format: Format, path: &Path) -> String {
    let p = path.display();
    match format {
        Format::Firefox => format!(
            "open it at https://profiler.firefox.com (\"Load a profile from file\"), or `sampler report {p}`"
        ),
        Format::Folded => {
            format!("draw it with `flamegraph.pl {p} > flame.svg` or `inferno-flamegraph`")
        }
        Format::Speedscope => "open it at https://www.speedscope.app".to_string(),
        Format::Pprof => format!("read it with `go tool pprof -top {p}`"),
        Format::Svg => "open it in a browser".to_string(),
        Format::Otlp => "send it to an OTLP/HTTP endpoint with `--otlp URL`, or POST it as application/x-protobuf".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::RecordingGaps;

    fn info(gaps: RecordingGaps) -> RecordingInfo {
        RecordingInfo {
            gaps,
            ..RecordingInfo::example()
        }
    }

    fn lines(info: &RecordingInfo, profile: &Profile) -> Vec<String> {
        lines_truncated(info, profile, TruncatedBy::default(), &[])
    }

    fn lines_truncated(
        info: &RecordingInfo,
        profile: &Profile,
        truncated: TruncatedBy,
        no_unwind_info_in: &[(String, u64)],
    ) -> Vec<String> {
        Summary {
            info,
            profile,
            ended: Ended::Command(CommandExit::Code(0)),
            mode: UnwindMode::Hybrid,
            format: Format::Firefox,
            output: Path::new("out.json"),
            write_ms: 12.0,
            root: true,
            stack_bytes: 8192,
            truncated,
            no_unwind_info_in,
            debuginfod: None,
        }
        .lines()
    }

    #[test]
    fn each_cause_of_truncation_gets_its_own_advice() {
        let profile = Profile::from_named_stacks(&[&["main"]]);
        let info = info(RecordingGaps::default());
        let truncated = TruncatedBy {
            frame_limit: 3,
            stack_copy: 5,
            no_unwind_info: 7,
            memory_gone: 2,
            stack_not_up: 4,
        };
        let places = [("perf-12.map".to_string(), 6), ("libjit.so".to_string(), 1)];
        let out = lines_truncated(&info, &profile, truncated, &places);
        let line = |needle: &str| {
            out.iter()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no line with {needle:?} in {out:#?}"))
                .clone()
        };
        assert!(line("5 stacks start")
            .contains("a larger --stack-size (at most 65528) reaches further"));
        let no_info = line("7 stacks start");
        assert!(
            no_info.contains("in perf-12.map (6), libjit.so (1)"),
            "{no_info}"
        );
        assert!(no_info.contains("a larger --stack-size does not help"));
        assert!(line("2 stacks start").contains("as it exited, after its memory was released"));
        assert!(line("4 stacks start").contains("did not move the stack pointer up"));
        assert!(line("3 stacks were deeper").contains("--max-stack 127"));
        let none = lines(&info, &profile);
        assert!(!none.iter().any(|l| l.contains("[truncated]")), "{none:#?}");
        // Cut in JIT code of a process that is no JVM: no flag to name.
        assert!(!out.iter().any(|l| l.contains("PreserveFramePointer")));
    }

    #[test]
    fn stacks_cut_in_a_jvm_s_jit_code_name_its_frame_pointer_flag() {
        let mut profile = Profile::from_named_stacks(&[&["main"]]);
        profile.libs.push(crate::profile::Lib {
            name: "libjvm.so".into(),
            path: "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so".into(),
            build_id: None,
            kind: crate::profile::LibKind::File,
            base: 0,
        });
        let info = info(RecordingGaps::default());
        let truncated = TruncatedBy {
            no_unwind_info: 7,
            ..TruncatedBy::default()
        };
        let hint = |places: &[(String, u64)]| {
            lines_truncated(&info, &profile, truncated, places)
                .iter()
                .any(|l| l.contains("run java with -XX:+PreserveFramePointer"))
        };
        assert!(hint(&[("perf-12.map".to_string(), 7)]));
        // Cut in a file's code: its flag would not help.
        assert!(!hint(&[("libfoo.so".to_string(), 7)]));
    }

    #[test]
    fn an_empty_profile_says_why() {
        let mut empty = Profile::from_named_stacks(&[]);
        empty.threads.clear();
        let gaps = RecordingGaps {
            stack_limit: StackLimit::Refused,
            left_stopped: vec![42],
            outliving: vec![(77, "daemon".into())],
            ..RecordingGaps::default()
        };
        let text = lines(&info(gaps), &empty).join("\n");
        for want in [
            "sampler: command exited with code 0",
            "sampler: 0 samples (synthetic, 1000 Hz), 0 lost, 0 threads",
            "stacks deeper than 127 frames are cut",
            "another perf session's callchain events",
            "pid 42 was already stopped",
            "1 processes the command started were still running when it exited, and were recorded only until then: 77 (daemon)",
            "sampler: wrote out.json (12 ms after the command ended)",
        ] {
            assert!(text.contains(want), "{want}:\n{text}");
        }
        assert!(
            text.ends_with("\nsampler: view it: sampler view out.json"),
            "{text}"
        );
        assert!(!text.contains("no samples: what was recorded"), "{text}");
        let text = lines(&info(RecordingGaps::default()), &empty).join("\n");
        assert!(
            text.contains("no samples: what was recorded used less than one sampling period of CPU time (1.0 ms at 1000 Hz)"),
            "{text}"
        );
        let gaps = RecordingGaps {
            set_id_program: Some("/usr/bin/passwd".into()),
            ..RecordingGaps::default()
        };
        let text = lines(&info(gaps), &empty).join("\n");
        assert!(
            text.contains("no samples: /usr/bin/passwd is a set-user-ID"),
            "{text}"
        );
    }

    #[test]
    fn every_line_is_the_tool_speaking() {
        let p = crate::calltree::tests::seed_001();
        let all = lines(&info(RecordingGaps::default()), &p);
        assert!(all.iter().all(|l| l.starts_with("sampler: ")), "{all:?}");
        assert!(all.iter().any(|l| l.contains("3 samples (synthetic")));
        assert!(!all.iter().any(|l| l.contains("no samples")));
    }

    #[test]
    fn losses_of_others_and_own_samples_are_said_apart() {
        let profile = Profile::from_named_stacks(&[&["main"], &["main"], &["main"]]);
        let mut info = info(RecordingGaps::default());
        info.lost_elsewhere = 40;
        info.own_samples = 1;
        let out = lines(&info, &profile);
        assert!(out
            .iter()
            .any(|l| l.contains("3 samples (") && l.contains(", 0 lost")));
        assert!(
            out.iter()
                .any(|l| l.contains("buffers also lost 40 samples while other processes ran")),
            "{out:#?}"
        );
        assert!(
            out.iter()
                .any(|l| l.contains("sampler's own samples (1, 25.0% of all) are left out")),
            "{out:#?}"
        );
        info.lost_elsewhere = 0;
        info.own_samples = 0;
        let out = lines(&info, &profile);
        assert!(!out
            .iter()
            .any(|l| l.contains("also lost") || l.contains("own")));
    }
}
