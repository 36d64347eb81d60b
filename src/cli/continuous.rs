//! `sampler record --every SECONDS`: a continuous recording, cut into windows. The
//! recording goes on without pause; as each window closes, replay hands over its raw
//! profile ([`ProfileBuilder::cut`]) and a worker thread names it (through a memo of what
//! earlier windows named, [`NameMemo`], the function symbols of the files they named,
//! [`crate::symbolicate::ScanMemo`], and the symbol cache), writes its file into the
//! directory of `-o DIR/`, and sends it through the spool ([`Spool`]) to `--otlp` and
//! `--push`. The recording thread does not wait for naming or a back end unless the
//! worker is [`QUEUED_WINDOWS`] windows behind. A stop signal or `-d` ends the last
//! window early; it is named and sent like the others.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::Result;

use crate::cli::{Continuous, RecordPlan};
use crate::emit::push::{self, Payload};
use crate::emit::spool::Spool;
use crate::emit::{self};
use crate::events::{Event, RecordingInfo};
use crate::files::output::{self, SudoUser};
use crate::record::{self, Sink};
use crate::replay::{Built, ProfileBuilder};
use crate::symbolicate::NameMemo;

/// Windows closed but not yet named and sent before the recording waits for the worker:
/// two, so that one slow send (a back end that takes its 30 s to time out) does not stall
/// the recording, while memory holds at most a few windows' raw tables.
pub const QUEUED_WINDOWS: usize = 2;

/// One closed window, on its way to the worker.
struct Window {
    number: u64,
    info: RecordingInfo,
    built: Built,
}

/// What became of the windows, for the last line.
#[derive(Default)]
struct Tally {
    windows: u64,
    written: u64,
    write_failures: u64,
    sent: u64,
    refused: u64,
    dropped: u64,
    waiting: usize,
}

/// Records windows until the recording ends. The exit code is 0, or 1 when a window's
/// file could not be written, or windows were refused by a back end or dropped from a
/// full spool (windows still waiting in the spool are not lost: the next run with that
/// spool sends them first).
pub fn record(plan: RecordPlan, continuous: Continuous) -> Result<i32> {
    let root = nix::unistd::Uid::effective().is_root();
    let sudo = output::SudoUser::from_env();
    if let Some(dir) = &continuous.dir {
        output::check_destination(&dir.join("window"), root, sudo)?;
    }
    let spool = match plan.push.is_empty() {
        true => None,
        false => Some(open_spool(&continuous, sudo)?),
    };
    let mut builder = crate::cli::run::live_builder(plan.mode);
    let (queue, windows) = mpsc::sync_channel::<Window>(QUEUED_WINDOWS);
    let job = Job {
        plan: plan.clone(),
        dir: continuous.dir.clone(),
        spool,
        sudo,
    };
    let mut dispatch = Dispatch {
        queue,
        unstarted: Some((job, windows)),
        worker: None,
        number: 0,
    };
    let (info, _ended, teardown) = record::record(
        &plan.options,
        &mut WindowSink {
            builder: &mut builder,
            dispatch: &mut dispatch,
        },
    )?;
    // A second stop signal now ends the naming of the last window.
    crate::cli::run::stop_naming_on_signals();
    let last = builder.cut(&info);
    dispatch.send(last, info);
    let tally = dispatch.finish();
    crate::cli::run::save_tables(&plan.tables);
    drop(teardown);
    crate::say!(
        "sampler: {} windows: {} written, {} sent, {} waiting in the spool, {} dropped, {} refused{}",
        tally.windows,
        tally.written,
        tally.sent,
        tally.waiting,
        tally.dropped,
        tally.refused,
        match tally.write_failures {
            0 => String::new(),
            n => format!(", {n} not written"),
        }
    );
    Ok(i32::from(
        tally.write_failures + tally.refused + tally.dropped > 0,
    ))
}

/// The spool of `--spool DIR`, else the user's `~/.cache/sampler/spool`.
fn open_spool(c: &Continuous, sudo: Option<SudoUser>) -> Result<Spool> {
    let (root, below): (PathBuf, &[&str]) = match &c.spool {
        Some(dir) => (dir.clone(), &[]),
        None => (
            crate::files::usercache::user_cache_home(sudo).ok_or_else(|| {
                anyhow::anyhow!(
                    "--every: no cache directory for the spool (HOME is not set): give --spool DIR"
                )
            })?,
            &["sampler", "spool"],
        ),
    };
    Spool::open(&root, below, sudo, c.spool_bytes).map_err(|e| {
        let mut path = root.clone();
        path.extend(below);
        anyhow::anyhow!("--every: cannot open the spool {}: {e}", path.display())
    })
}

/// What the worker needs besides the windows.
struct Job {
    plan: RecordPlan,
    dir: Option<PathBuf>,
    spool: Option<Spool>,
    sudo: Option<SudoUser>,
}

/// Hands closed windows to the worker, which is started with the first: by then the
/// recording has blocked the stop signals, and a thread inherits that (a worker started
/// before could take a SIGTERM meant for the recording, and die of it).
struct Dispatch {
    queue: mpsc::SyncSender<Window>,
    unstarted: Option<(Job, mpsc::Receiver<Window>)>,
    worker: Option<std::thread::JoinHandle<Tally>>,
    number: u64,
}

impl Dispatch {
    fn send(&mut self, built: Built, info: RecordingInfo) {
        if let Some((job, windows)) = self.unstarted.take() {
            self.worker = Some(std::thread::spawn(move || work(job, windows)));
        }
        self.number += 1;
        let window = Window {
            number: self.number,
            info,
            built,
        };
        if self.queue.send(window).is_err() {
            crate::say!("sampler: window {} is lost: its worker ended", self.number);
        }
    }

    /// Waits for the worker to name and send every window handed to it.
    fn finish(self) -> Tally {
        drop(self.queue);
        match self.worker.map(|w| w.join()) {
            Some(Ok(tally)) => tally,
            Some(Err(_)) => {
                crate::say!("sampler: the windows' worker failed");
                Tally::default()
            }
            None => Tally::default(),
        }
    }
}

/// Names, writes and sends each window as it comes; windows left in the spool by an
/// earlier run are sent first.
fn work(mut job: Job, windows: mpsc::Receiver<Window>) -> Tally {
    // The function symbols of the files named, kept for the windows after.
    let base = crate::symbolicate::SymbolOptions {
        scan_memo: Some(std::sync::Arc::default()),
        ..job.plan.debug.symbol_options()
    };
    let mut memo = NameMemo::default();
    let mut tally = Tally::default();
    if let Some(spool) = job.spool.as_mut().filter(|s| !s.is_empty()) {
        crate::say!(
            "sampler: sending the {} windows an earlier run left in {}",
            spool.len(),
            spool.path.display()
        );
        let said = send_spool(spool, &job.plan, &mut tally);
        crate::say!("sampler: earlier windows: {said}");
    }
    for window in windows {
        let started = Instant::now();
        let Window {
            number,
            info,
            built,
        } = window;
        let opts = crate::cli::run::naming_options(&built, &info, base.clone());
        let profile = memo.symbolicate(built.profile, &built.lib_binaries, &opts);
        crate::cli::run::save_cache(&opts);
        crate::cli::run::save_tables(&job.plan.tables);
        let samples: usize = profile.threads.iter().map(|t| t.samples.len()).sum();
        let mut said = Vec::new();
        if let Some(dir) = &job.dir {
            let path = dir.join(window_name(number, info.start_unix_ms, job.plan.format));
            match emit::write(&profile, job.plan.format, &job.plan.export, &path, job.sudo) {
                Ok(()) => {
                    tally.written += 1;
                    said.push(format!("written to {}", path.display()));
                }
                Err(e) => {
                    tally.write_failures += 1;
                    said.push(format!("not written: {e:#}"));
                }
            }
        }
        if let Some(spool) = &mut job.spool {
            let dropped_before = spool.dropped;
            for payload in payloads(&job.plan.push) {
                let added =
                    push::body(&profile, payload, true).and_then(|body| spool.add(payload, &body));
                if let Err(e) = added {
                    said.push(format!("not spooled ({}): {e}", spool.path.display()));
                }
            }
            said.push(send_spool(spool, &job.plan, &mut tally));
            if spool.dropped > dropped_before {
                said.push(format!(
                    "the spool is full: dropped the {} oldest ({} in all)",
                    spool.dropped - dropped_before,
                    spool.dropped
                ));
            }
        }
        tally.windows += 1;
        drop(profile);
        record::release_free_memory();
        crate::say!(
            "sampler: window {number}: {:.1} s, {samples} samples, {} lost; {} new addresses named in {:.0} ms; {}",
            (info.end_ns - info.start_ns) as f64 / 1e9,
            info.lost_samples,
            memo.last_named,
            started.elapsed().as_secs_f64() * 1000.0,
            said.join("; ")
        );
    }
    if let Some(spool) = &job.spool {
        tally.dropped = spool.dropped;
        tally.waiting = spool.len();
        if tally.waiting > 0 {
            crate::say!(
                "sampler: {} windows wait in {}: the next run with this spool sends them first",
                tally.waiting,
                spool.path.display()
            );
        }
    }
    tally
}

/// Sends what waits in the spool; says what happened, in a phrase.
fn send_spool(spool: &mut Spool, plan: &RecordPlan, tally: &mut Tally) -> String {
    let sent = spool.send(&plan.push);
    tally.sent += sent.sent;
    tally.refused += sent.refused.len() as u64;
    let mut said = Vec::new();
    if sent.sent > 0 {
        let urls: Vec<&str> = plan.push.iter().map(|d| d.url.as_str()).collect();
        said.push(format!("sent {} to {}", sent.sent, urls.join(", ")));
    }
    for why in &sent.refused {
        crate::say!("sampler: a window was refused: {why}");
    }
    if let Some(why) = sent.down.first() {
        said.push(format!(
            "{} waiting in {} ({why})",
            sent.waiting,
            spool.path.display()
        ));
    }
    if said.is_empty() {
        said.push("nothing sent".into());
    }
    said.join("; ")
}

/// The kinds of request the destinations take, each once.
fn payloads(dests: &[push::Destination]) -> Vec<Payload> {
    let mut kinds: Vec<Payload> = dests.iter().map(|d| d.payload).collect();
    kinds.dedup();
    kinds
}

/// A window's file name: its number, then when it started (UTC), then the format's
/// ending: `window-000003-20261126T131700Z.json.gz`. Numbers keep the order of windows
/// that start within one second.
fn window_name(number: u64, start_unix_ms: f64, format: emit::Format) -> String {
    let ending = format
        .default_output()
        .strip_prefix("profile")
        .unwrap_or(".out");
    format!(
        "window-{number:06}-{}{ending}",
        utc_stamp((start_unix_ms / 1000.0).max(0.0) as i64)
    )
}

/// `YYYYMMDDTHHMMSSZ` of a Unix time in seconds (the proleptic Gregorian calendar, from
/// the count of days since 1970-01-01).
fn utc_stamp(unix_seconds: i64) -> String {
    let (days, secs) = (
        unix_seconds.div_euclid(86_400),
        unix_seconds.rem_euclid(86_400),
    );
    // Days to a civil date: eras of 400 years (146,097 days) starting on 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Feeds the builder, and cuts it as each window closes.
struct WindowSink<'a> {
    builder: &'a mut ProfileBuilder,
    dispatch: &'a mut Dispatch,
}

impl Sink for WindowSink<'_> {
    fn events(&mut self, events: &[Event]) {
        self.builder.add_events(events);
    }

    fn window(&mut self, info: RecordingInfo) {
        let built = self.builder.cut(&info);
        self.dispatch.send(built, info);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_names_carry_their_number_and_utc_start() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        // 2026-11-26 13:17:00 UTC; and a leap day.
        assert_eq!(utc_stamp(1_795_699_020), "20261126T131700Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(
            window_name(3, 1_795_699_020_500.0, emit::Format::Firefox),
            "window-000003-20261126T131700Z.json.gz"
        );
        assert_eq!(
            window_name(12, 0.0, emit::Format::Otlp),
            "window-000012-19700101T000000Z.otlp"
        );
    }
}
