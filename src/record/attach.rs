//! Attaching to running processes: checking that each PID is a user process sampler may
//! profile, stopping the processes while their threads are listed and the events opened
//! (so no thread is born unseen), and describing what they already are — their library
//! maps from `/proc/PID/maps`, thread names from `/proc/PID/task/TID/comm` — as the
//! events a launch would have produced.
//!
//! A process that sampler stopped is always continued: by [`Stopped::resume`], by `Drop`
//! when setting up fails with an error or a panic, and when sampler itself is killed
//! (SIGKILL, the OOM killer) by its guardian: a process started before the first SIGSTOP
//! that outlives sampler (see [`guardian_main`]). Each process is named to the guardian
//! before it is stopped, and the guardian continues them all when its input closes
//! without word that sampler has.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::events::{Event, EventKind, Mapping};
use crate::files::FileId;

/// The state letter of `/proc/PID/stat` (R, S, D, T, t, Z, X, …), `None` when the
/// process is gone.
pub fn process_state(pid: i32) -> Option<char> {
    task_state(&format!("/proc/{pid}/stat"))
}

fn task_state(stat_path: &str) -> Option<char> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // The command name is in parentheses and may itself contain ") ".
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The process (thread group) that task `tid` belongs to, from `/proc/TID/status`.
pub fn process_of(tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// Whether the process has ended (gone, or a zombie waiting for its parent).
pub fn has_exited(pid: i32) -> bool {
    matches!(process_state(pid), None | Some('Z' | 'X'))
}

/// Checks that `pid` is a live user process; the error says what is wrong with it.
pub fn check_pid(pid: i32) -> Result<()> {
    match process_state(pid) {
        _ if pid <= 0 => bail!("no process with pid {pid}"),
        None | Some('X') => bail!("no process with pid {pid} (check it with `ps -p {pid}`)"),
        Some('Z') => bail!(
            "pid {pid} is a zombie (exited, not reaped by its parent{}): it runs nothing to record",
            parent_of(pid).map_or_else(String::new, |ppid| format!(", pid {ppid}"))
        ),
        Some(_) => {}
    }
    if pid == std::process::id() as i32 {
        bail!("pid {pid} is sampler itself");
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"));
    if matches!(&maps, Ok(m) if m.is_empty()) {
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        bail!(
            "pid {pid} ({}) is a kernel thread: sampler profiles user processes",
            name.trim()
        );
    }
    Ok(())
}

/// Processes that sampler stopped, continued when this is resumed or dropped, or by the
/// guardian when sampler dies first.
pub struct Stopped {
    pids: Vec<Pid>,
    since: Instant,
    guardian: Option<Guardian>,
}

/// The hidden subcommand that runs the guardian.
pub const GUARDIAN_COMMAND: &str = "continue-stopped";

/// What sampler tells the guardian once it has continued every process itself.
const CONTINUED: &str = "continued";

/// The guardian of the processes sampler stops, told through a pipe (one line each):
/// `PID START` (the pid and its start time) before a process is stopped, and `continued`
/// once sampler has continued them.
struct Guardian {
    process: std::process::Child,
    told: std::process::ChildStdin,
}

impl Guardian {
    fn start() -> Result<Guardian> {
        let mut process = super::stack_limit::spawn_guard(&[GUARDIAN_COMMAND]).map_err(|e| {
            anyhow::anyhow!(
                "cannot start the process that continues the stopped processes if sampler is                  killed ({e}): nothing was stopped"
            )
        })?;
        let told = process
            .stdin
            .take()
            .expect("the guardian's input is a pipe");
        Ok(Guardian { process, told })
    }

    fn tell(&mut self, line: &str) -> std::io::Result<()> {
        use std::io::Write;
        // One write per line: the pipe is not buffered on sampler's side, so each line
        // is the guardian's to read from now on, whatever happens to sampler.
        self.told.write_all(format!("{line}\n").as_bytes())
    }

    /// Says that every process is continued, and waits for the guardian to leave.
    fn dismiss(mut self) {
        let _ = self.tell(CONTINUED);
        drop(self.told);
        let _ = self.process.wait();
    }
}

/// The guardian: ignores the signals a session's user would send to sampler (only
/// SIGKILL ends it), takes a pidfd of each process named on its input (one that is still
/// the process named: the same start time), and when the input closes (sampler exited,
/// however) without `continued` as its last line, sends each of them SIGCONT. Through the
/// pidfd the signal reaches that process or none, never another that took its pid.
pub fn guardian_main() -> Result<()> {
    use std::io::BufRead;
    super::stack_limit::ignore_signals()?;
    let mut held = Vec::new();
    let mut continued = false;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        continued = line == CONTINUED;
        let Some((pid, start)) = line.split_once(' ') else {
            continue;
        };
        let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) else {
            continue;
        };
        if let Ok(fd) = super::sys::pidfd_open(pid) {
            // Checked after the pidfd is taken: a match means it is the process named.
            if super::stack_limit::start_time(pid) == Some(start) {
                held.push(fd);
            }
        }
    }
    if !continued {
        for fd in &held {
            let _ = super::sys::pidfd_send_signal(fd, Signal::SIGCONT);
        }
    }
    Ok(())
}

/// How long to wait for every thread of a stopped process to reach the stop. A thread in
/// uninterruptible sleep (D) stops only when it wakes; past this, attaching goes on.
const STOP_WAIT: Duration = Duration::from_millis(200);

impl Stopped {
    /// Stops each process with SIGSTOP, unless it was stopped already (then it is left
    /// as it was, and not continued later), and waits until its threads have stopped.
    pub fn stop(pids: &[i32]) -> Result<Stopped> {
        let mut stopped = Stopped {
            pids: Vec::new(),
            since: Instant::now(),
            guardian: None,
        };
        for &pid in pids {
            if matches!(process_state(pid), Some('T' | 't')) {
                continue;
            }
            let guardian = match &mut stopped.guardian {
                Some(g) => g,
                None => stopped.guardian.insert(Guardian::start()?),
            };
            let Some(start) = super::stack_limit::start_time(pid) else {
                bail!("no process with pid {pid} (it has exited)");
            };
            guardian.tell(&format!("{pid} {start}")).map_err(|e| {
                anyhow::anyhow!(
                    "the process that continues the stopped processes if sampler is killed \
                     has gone ({e}): pid {pid} was not stopped"
                )
            })?;
            if stopped.pids.is_empty() {
                // Stopped from now: the guardian's start stops nothing.
                stopped.since = Instant::now();
            }
            match kill(Pid::from_raw(pid), Signal::SIGSTOP) {
                Ok(()) => stopped.pids.push(Pid::from_raw(pid)),
                Err(Errno::EPERM) => bail!(
                    "no permission to attach to pid {pid}: it belongs to another user, and \
                     profiling another user's process needs root or CAP_PERFMON whatever \
                     kernel.perf_event_paranoid says (run sampler with sudo)"
                ),
                Err(Errno::ESRCH) => bail!("no process with pid {pid} (it has exited)"),
                Err(e) => bail!("could not stop pid {pid} to attach: {e}"),
            }
        }
        let deadline = Instant::now() + STOP_WAIT;
        for pid in &stopped.pids {
            while Instant::now() < deadline && !all_tasks_stopped(pid.as_raw()) {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(stopped)
    }

    /// Continues the processes; returns how long they were stopped, up to the moment
    /// they were continued. (Waking hundreds of busy threads can keep the caller off the
    /// CPU for a while after that; the processes are running by then.)
    pub fn resume(mut self) -> Duration {
        let stopped = self.since.elapsed();
        self.continue_all();
        stopped
    }

    fn continue_all(&mut self) {
        for pid in self.pids.drain(..) {
            let _ = kill(pid, Signal::SIGCONT);
        }
        if let Some(guardian) = self.guardian.take() {
            guardian.dismiss();
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.continue_all();
    }
}

fn all_tasks_stopped(pid: i32) -> bool {
    tasks(pid).iter().all(|tid| {
        matches!(
            task_state(&format!("/proc/{pid}/task/{tid}/stat")),
            None | Some('T' | 't' | 'Z' | 'X')
        )
    })
}

/// The threads of process `pid`.
pub fn tasks(pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut tids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids
}

/// What process `pid` already is, as events stamped `time_ns`: a COMM for each thread
/// and an MMAP for each executable mapping.
pub fn describe(pid: i32, time_ns: u64) -> Vec<Event> {
    let mut out = Vec::new();
    let comm = |path: String| {
        std::fs::read_to_string(path)
            .map(|n| n.trim_end_matches('\n').to_string())
            .ok()
    };
    for tid in tasks(pid) {
        if let Some(name) = comm(format!("/proc/{pid}/task/{tid}/comm")) {
            let kind = EventKind::Comm {
                pid,
                tid,
                name,
                exec: false,
            };
            out.push(Event { time_ns, kind });
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    out.extend(maps.lines().filter_map(|line| {
        let mapping = parse_maps_line(pid, line)?;
        Some(Event {
            time_ns,
            kind: EventKind::Mmap(mapping),
        })
    }));
    out
}

/// What every process of the machine already is (see [`describe`]). A kernel thread
/// (a child of `kthreadd`, pid 2, or `kthreadd` itself) has no maps; it is described as
/// forked by `kthreadd`, which is how the profile tells kernel threads (and how the
/// kernel's records say it of those started later).
pub fn describe_all(time_ns: u64) -> Vec<Event> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let mut out = Vec::new();
    for pid in pids {
        if pid == KTHREADD || parent_of(pid) == Some(KTHREADD) {
            out.push(Event {
                time_ns,
                kind: EventKind::Fork {
                    pid,
                    ppid: KTHREADD,
                    tid: pid,
                    ptid: KTHREADD,
                },
            });
        }
        out.extend(describe(pid, time_ns));
    }
    out
}

/// The pid of `kthreadd`, the parent of every kernel thread.
pub const KTHREADD: i32 = 2;

/// The parent of process `pid`, from `/proc/PID/stat` (`pid (comm) state ppid ...`; the
/// name may hold spaces and parentheses, so the fields after the last `)` are read).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// One line of `/proc/PID/maps` as a mapping, when it is executable:
/// `start-end perms offset dev inode [path]`.
fn parse_maps_line(pid: i32, line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (range, perms, offset) = (fields.next()?, fields.next()?, fields.next()?);
    let (dev, inode) = (fields.next()?, fields.next()?);
    let path = fields.next().unwrap_or("").trim_start().to_string();
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    Some(Mapping {
        pid,
        start,
        len: end.checked_sub(start)?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        path,
        file: file_id(dev, inode),
        executable: true,
    })
}

/// The file of a maps line from its `major:minor` device (hex) and inode (decimal);
/// `None` for memory without a file (inode 0).
fn file_id(dev: &str, inode: &str) -> Option<FileId> {
    let (major, minor) = dev.split_once(':')?;
    let inode = inode.parse().ok().filter(|&i| i != 0)?;
    Some(FileId {
        dev_major: u32::from_str_radix(major, 16).ok()?,
        dev_minor: u32::from_str_radix(minor, 16).ok()?,
        inode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let m = parse_maps_line(
            7,
            "7f12a4c28000-7f12a4d9d000 r-xp 00028000 fe:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        assert_eq!(
            (m.start, m.len, m.file_offset),
            (0x7f12a4c28000, 0x175000, 0x28000)
        );
        assert_eq!(m.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        let libc = FileId {
            dev_major: 0xfe,
            dev_minor: 1,
            inode: 1234,
        };
        assert_eq!(m.file, Some(libc));
        let deleted =
            parse_maps_line(7, "1000-2000 r-xp 00000000 fe:01 99   /tmp/a b (deleted)").unwrap();
        assert_eq!(deleted.path, "/tmp/a b (deleted)");
        assert_eq!(
            parse_maps_line(7, "1000-2000 r-xp 00000000 00:00 0 ").unwrap(),
            Mapping {
                pid: 7,
                start: 0x1000,
                len: 0x1000,
                file_offset: 0,
                path: String::new(),
                file: None,
                executable: true,
            }
        );
        assert!(parse_maps_line(7, "1000-2000 rw-p 00000000 00:00 0   [heap]").is_none());
    }

    #[test]
    fn own_process_is_described() {
        let pid = std::process::id() as i32;
        assert!(!has_exited(pid) && process_state(pid).is_some());
        let events = describe(pid, 5);
        assert!(events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::Comm { tid, .. } if *tid == pid)));
        assert!(events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::Mmap(m) if m.path.ends_with("[vdso]"))));
        assert!(check_pid(pid).is_err(), "sampler does not attach to itself");
        assert!(check_pid(i32::MAX).is_err());
    }
}
