//! `kernel.perf_event_max_stack`, the one machine-wide setting sampler changes, and the
//! guarantee that it is put back.
//!
//! The kernel walks at most that many frames per callchain (127 by default), which cuts a
//! recursion a few hundred levels deep. Each event may ask for fewer
//! (`sample_max_stack`), never more, so keeping deep stacks whole means raising the
//! setting, as root, for the recording. Three facts shape how it is put back:
//!
//! - The kernel refuses any write while a callchain event exists anywhere on the machine
//!   (EBUSY): a concurrent `perf record -g`, or another sampler, blocks both raising and
//!   lowering it.
//! - Sessions overlap: the value one session read as "original" may be another session's
//!   raised value.
//! - A session can die without running any code of its own (SIGKILL, the OOM killer).
//!
//! So every change goes through one record, the state file [`STATE_FILE`] (a root-only
//! directory; the file is locked with `flock` while it is read and written). It holds the
//! value found before the first session raised it, the value written, and the sessions
//! that rely on it (pid and start time, so a reused pid is not mistaken for a live
//! session). The last live session to leave writes the original value back. If that
//! cannot happen (a perf session still holds callchain events), the record stays, and the
//! next sampler run repairs the setting when it starts. A session killed outright is
//! covered twice: a small watchdog process (sampler itself, run as
//! `sampler restore-max-stack`) waits for the end of its standard input, which closes
//! only when the recording session has gone, however it went, and then leaves on its
//! behalf; and if the watchdog was killed too, the record is there for the next run.
//! If someone else changed the setting meanwhile (it no longer holds the value sampler
//! wrote), it is theirs, and left alone.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};

/// The setting, under `/proc/sys`.
const SYSCTL: &str = "/proc/sys/kernel/perf_event_max_stack";

/// Where the record of a raised setting lives: a directory only root may enter, on the
/// runtime file system, so it is gone after a reboot, as the raised setting is.
const STATE_DIR: &str = "/run/sampler";
pub const STATE_FILE: &str = "/run/sampler/perf_event_max_stack";

/// Frames a sample's callchain may hold so that its record always fits the kernel's
/// 16-bit record size: 65,535 bytes, less the fixed part of our sample record (header,
/// ip, tid, time, cpu, period, the callchain's length, three user registers with their
/// ABI word, the stack copy's two size words: 104 bytes) and up to 8 context markers
/// (`kernel.perf_event_max_contexts_per_stack`), at 8 bytes a frame. A larger callchain
/// wraps the record's size and everything after it in the ring buffer is garbage. (The
/// kernel shrinks the user stack copy to fit what is left, so it needs no room here.)
pub const MAX_FITTING_FRAMES: u16 = ((65_535 - 104) / 8 - 8) as u16;

/// The frame limit sampler asks for by default. Deep enough for the deepest stacks seen
/// in real programs (compilers, recursive parsers: a few thousand frames) and the
/// 2,000-deep bench target; low enough that a walk that never ends (a frame-pointer chain
/// that loops) costs at most 4,096 reads per sample and a 33 KB record, half of what the
/// record could hold. The kernel walks every frame of a deep stack at every sample: at
/// 2,000 frames that is measurable in the target's own CPU time (see the README).
pub const DEFAULT_MAX_STACK: u16 = 4096;

/// How long the last session keeps trying to put the setting back while its own events
/// are being freed (they go shortly after their descriptors close).
const RESTORE_ATTEMPTS: u32 = 40;
const RESTORE_INTERVAL: Duration = Duration::from_millis(25);

/// What the state file says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct State {
    /// The value before the first session raised it.
    original: Option<u64>,
    /// The value sampler wrote.
    raised: Option<u64>,
    /// Sessions relying on the raised value: (pid, start time in clock ticks).
    holders: Vec<(i32, u64)>,
}

impl State {
    fn parse(text: &str) -> State {
        let mut state = State::default();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["original", v] => state.original = v.parse().ok(),
                ["raised", v] => state.raised = v.parse().ok(),
                ["holder", pid, start] => {
                    if let (Ok(pid), Ok(start)) = (pid.parse(), start.parse()) {
                        state.holders.push((pid, start));
                    }
                }
                _ => {}
            }
        }
        state
    }

    fn render(&self) -> String {
        let mut text = String::new();
        if let Some(v) = self.original {
            text.push_str(&format!("original {v}\n"));
        }
        if let Some(v) = self.raised {
            text.push_str(&format!("raised {v}\n"));
        }
        for (pid, start) in &self.holders {
            text.push_str(&format!("holder {pid} {start}\n"));
        }
        text
    }
}

/// The start time of a process (field 22 of `/proc/PID/stat`, clock ticks after boot),
/// which tells a live session from a new process that reuses its pid.
pub(super) fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(") ")?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn alive(holder: (i32, u64)) -> bool {
    start_time(holder.0) == Some(holder.1)
}

pub fn read_setting() -> Option<u64> {
    std::fs::read_to_string(SYSCTL).ok()?.trim().parse().ok()
}

fn write_setting(value: u64) -> std::io::Result<()> {
    std::fs::write(SYSCTL, value.to_string())
}

/// The state file, locked. The directory is created root-only; one that is not a real
/// directory owned by root (a symlink, another user's) is refused, since root would then
/// write where someone else decides.
fn lock_state() -> Result<Flock<File>> {
    match std::fs::DirBuilder::new().mode(0o700).create(STATE_DIR) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {STATE_DIR}")),
    }
    let meta =
        std::fs::symlink_metadata(STATE_DIR).with_context(|| format!("cannot read {STATE_DIR}"))?;
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        bail!("{STATE_DIR} is not a directory that only root may write: not using it");
    }
    loop {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(STATE_FILE)
            .with_context(|| format!("cannot open {STATE_FILE}"))?;
        let locked = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .with_context(|| format!("cannot lock {STATE_FILE}"))?;
        // The session that held the lock may have removed the file meanwhile: a lock on
        // the removed file guards nothing, so open the one at the path again.
        let held = locked.metadata()?;
        match std::fs::symlink_metadata(STATE_FILE) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => return Ok(locked),
            _ => continue,
        }
    }
}

fn load(file: &mut File) -> State {
    let mut text = String::new();
    let _ = file.rewind().and_then(|()| file.read_to_string(&mut text));
    State::parse(&text)
}

/// Writes the state, or removes the file when nothing is left to restore. The file is
/// locked, so rewriting it in place is safe against other sessions.
fn store(file: &mut File, state: &State) -> std::io::Result<()> {
    if state.raised.is_none() && state.holders.is_empty() {
        std::fs::remove_file(STATE_FILE)?;
        return Ok(());
    }
    file.rewind()?;
    file.set_len(0)?;
    file.write_all(state.render().as_bytes())?;
    file.sync_all()
}

/// Puts the setting back if no live session relies on it any more. Returns a message for
/// the user when it could not be put back.
fn settle(state: &mut State, attempts: u32) -> Option<String> {
    state.holders.retain(|&h| alive(h));
    if !state.holders.is_empty() {
        return None;
    }
    let (Some(original), Some(raised)) = (state.original, state.raised) else {
        *state = State::default();
        return None;
    };
    for attempt in 0..attempts {
        if read_setting() != Some(raised) {
            // Someone else set it since: their value stands.
            *state = State::default();
            return None;
        }
        if write_setting(original).is_ok() {
            *state = State::default();
            return None;
        }
        if attempt + 1 < attempts {
            std::thread::sleep(RESTORE_INTERVAL);
        }
    }
    Some(format!(
        "kernel.perf_event_max_stack stays {raised} for now: another perf session's \
         callchain events keep the kernel from changing it. sampler puts it back to \
         {original} when that session ends (it watches for {} s; after that the next \
         sampler run does), or `sudo sysctl kernel.perf_event_max_stack={original}`",
        WATCHDOG_PATIENCE.as_secs()
    ))
}

use crate::events::StackLimit as Raise;

/// This session's claim on a raised `perf_event_max_stack`. Dropping it gives the claim
/// up and puts the setting back if this was the last session relying on it.
pub struct DeeperStacks {
    pub outcome: Raise,
    /// The setting the kernel applies now (the limit of our events).
    pub limit: u64,
    holder: Option<(i32, u64)>,
    watchdog: Option<std::process::Child>,
}

impl DeeperStacks {
    /// Leaves the setting as it is, for a session whose user stacks are not the kernel's
    /// callchains (the kernel walker's own bound is its depth): only a setting that an
    /// earlier session could not put back is repaired (nothing is created for it).
    pub fn unchanged() -> DeeperStacks {
        let left = std::path::Path::new(STATE_FILE).exists();
        if left && nix::unistd::Uid::effective().is_root() {
            if let Ok(mut file) = lock_state() {
                let mut state = load(&mut file);
                let _ = settle(&mut state, 1);
                let _ = store(&mut file, &state);
            }
        }
        DeeperStacks {
            outcome: Raise::NotNeeded,
            limit: read_setting().unwrap_or(127),
            holder: None,
            watchdog: None,
        }
    }

    /// Whether this session holds a claim on a raised setting, to be given up when it is
    /// dropped (once its callchain events are freed).
    pub fn holds_claim(&self) -> bool {
        self.holder.is_some()
    }

    /// Raises the setting to `wanted` frames when it is lower and sampler may, after
    /// repairing a setting that an earlier session could not put back.
    pub fn raise(wanted: u64) -> DeeperStacks {
        let before = read_setting();
        let mut claim = DeeperStacks {
            outcome: Raise::NotNeeded,
            limit: before.unwrap_or(127),
            holder: None,
            watchdog: None,
        };
        if !nix::unistd::Uid::effective().is_root() {
            if before.is_some_and(|v| v < wanted) {
                claim.outcome = Raise::Refused;
            }
            return claim;
        }
        let Ok(mut file) = lock_state() else {
            // Without a record nobody could repair it: do not change it at all.
            claim.outcome = if before.is_some_and(|v| v < wanted) {
                Raise::Refused
            } else {
                Raise::NotNeeded
            };
            return claim;
        };
        let mut state = load(&mut file);
        // A session that died, or one that could not restore, left it raised.
        let _ = settle(&mut state, 1);
        let current = read_setting();
        if current.is_some_and(|v| v >= wanted) && state.raised.is_none() {
            let _ = store(&mut file, &state);
            return claim;
        }
        let me = std::process::id() as i32;
        let holder = (me, start_time(me).unwrap_or(0));
        // The order makes a SIGKILL at any point harmless: the watchdog runs before the
        // record names this session, and the record says what will be written before it
        // is. Killed before the write, the watchdog finds the setting is not the raised
        // value and only clears the record; killed after it, it puts the setting back.
        let watchdog = spawn_watchdog(holder);
        let raising = state.raised.is_none();
        if raising {
            state.original = current;
            state.raised = Some(wanted);
        }
        state.holders.push(holder);
        let recorded = store(&mut file, &state).is_ok();
        if recorded && (!raising || write_setting(wanted).is_ok()) {
            drop(file);
            claim.holder = Some(holder);
            claim.outcome = Raise::Raised;
            claim.limit = read_setting().unwrap_or(wanted);
            claim.watchdog = watchdog;
            return claim;
        }
        // Not recorded (a raise could then outlive us unnoticed) or not writable: leave
        // the setting as it is, or as another live session needs it.
        state.holders.retain(|&h| h != holder);
        if raising {
            state.original = None;
            state.raised = None;
        }
        let _ = settle(&mut state, RESTORE_ATTEMPTS);
        let _ = store(&mut file, &state);
        drop(file);
        dismiss(watchdog);
        claim.outcome = Raise::Refused;
        claim.limit = read_setting().unwrap_or(claim.limit);
        claim
    }
}

/// Ends a watchdog whose session never held a claim: with its input closed it finds the
/// session absent from the record and leaves at once (the record must not be locked).
fn dismiss(watchdog: Option<std::process::Child>) {
    if let Some(mut watchdog) = watchdog {
        drop(watchdog.stdin.take());
        let _ = watchdog.wait();
    }
}

impl Drop for DeeperStacks {
    fn drop(&mut self) {
        let Some(holder) = self.holder.take() else {
            return;
        };
        let settled = match leave(holder, RESTORE_ATTEMPTS) {
            Ok(None) => true,
            Ok(Some(message)) => {
                say!("sampler: {message}");
                false
            }
            Err(e) => {
                say!("sampler: could not put kernel.perf_event_max_stack back: {e:#}");
                false
            }
        };
        if let Some(mut watchdog) = self.watchdog.take() {
            // Closing its input tells it the session is over. When the setting is back it
            // finds nothing to do; otherwise it goes on trying after sampler has exited.
            drop(watchdog.stdin.take());
            if settled {
                let _ = watchdog.wait();
            }
        }
    }
}

/// Removes `holder` from the record and settles the setting.
fn leave(holder: (i32, u64), attempts: u32) -> Result<Option<String>> {
    let mut file = lock_state()?;
    let mut state = load(&mut file);
    state.holders.retain(|&h| h != holder);
    let message = settle(&mut state, attempts);
    store(&mut file, &state).with_context(|| format!("cannot write {STATE_FILE}"))?;
    Ok(message)
}

/// How long the watchdog keeps trying to put the setting back while another perf
/// session blocks it, once a second; after that the record waits for the next run.
const WATCHDOG_PATIENCE: Duration = Duration::from_secs(60);

/// The hidden subcommand that runs the watchdog.
pub const WATCHDOG_COMMAND: &str = "restore-max-stack";

/// Starts the watchdog for `holder`, which reads its standard input until the session's
/// end of the pipe closes.
fn spawn_watchdog(holder: (i32, u64)) -> Option<std::process::Child> {
    spawn_guard(&[
        WATCHDOG_COMMAND,
        &holder.0.to_string(),
        &holder.1.to_string(),
    ])
    .ok()
}

/// Starts sampler's hidden subcommand `args` as a process that outlives sampler: in its
/// own process group (so a terminal's Ctrl-C or hangup does not reach it), told what to
/// do through its standard input, whose closing (sampler's exit, however it happens) it
/// reads as the session's end.
pub(super) fn spawn_guard(args: &[&str]) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    // Sampler's own file, even when it was replaced on disk since it started.
    Command::new("/proc/self/exe")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
}

/// In a process started by [`spawn_guard`]: ignores the signals a session's user would
/// send to sampler, so that only SIGKILL ends it.
pub(super) fn ignore_signals() -> Result<()> {
    use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow};
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None)?;
    Ok(())
}

/// The watchdog: ignores the signals a session's user would send to sampler (only
/// SIGKILL ends it), waits until its standard input closes, then gives up `pid`'s claim
/// the way the session would have.
pub fn watchdog_main(pid: i32, start: u64) -> Result<()> {
    ignore_signals()?;
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    while !matches!(stdin.read(&mut sink), Ok(0) | Err(_)) {}
    // The claim is given up whether or not the session's pid is still being torn down;
    // events it leaves behind for a moment only delay the write (retried below).
    let deadline = std::time::Instant::now() + WATCHDOG_PATIENCE;
    while leave((pid, start), RESTORE_ATTEMPTS)?.is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_ignores_junk() {
        let state = State {
            original: Some(127),
            raised: Some(4096),
            holders: vec![(12, 345), (67, 890)],
        };
        assert_eq!(State::parse(&state.render()), state);
        let junk = State::parse("original x\nholder 1\nraised 9 9\nnonsense\n");
        assert_eq!(junk, State::default());
    }

    #[test]
    fn fitting_frames_fit_a_record() {
        // Fixed part, the context markers and the frames stay within the 16-bit size.
        let bytes = 104 + 8 * (u32::from(MAX_FITTING_FRAMES) + 8);
        assert!(bytes <= 65_535, "{bytes}");
        assert!(bytes + 8 > 65_535 - 8, "the bound is tight: {bytes}");
        const { assert!(DEFAULT_MAX_STACK <= MAX_FITTING_FRAMES) };
    }

    #[test]
    fn own_start_time_is_known_and_a_dead_holder_is_not_alive() {
        let me = std::process::id() as i32;
        let start = start_time(me).expect("own start time");
        assert!(alive((me, start)));
        assert!(!alive((me, start + 1)));
        assert!(!alive((i32::MAX, start)));
    }
}
