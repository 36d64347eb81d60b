//! Starting the profiled command: fork a child that waits at a gate before `exec`, so
//! that the perf events (with `enable_on_exec`) are attached to it before it runs a
//! single instruction of the command. Under sudo the child becomes the user who ran sudo
//! (their groups, group and user id) just before `exec`: the command runs as they would
//! run it, while sampler keeps root's abilities for the recording. The kernel keeps the
//! events across that change of user, since the program `exec`ed is not set-user-ID.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::signal::{SigSet, SigmaskHow};
use nix::unistd::Pid;

/// A forked child stopped before `exec`. Dropping it without [`GatedChild::release`]
/// makes the child exit without running the command.
pub struct GatedChild {
    pub pid: Pid,
    gate: Option<OwnedFd>,
    exec_error: OwnedFd,
}

/// Exit code of the child when `exec` fails; like a shell's "command not found".
const EXEC_FAILED: i32 = 127;

/// Who the command runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Credentials {
    /// The user who ran sudo (`SUDO_UID`, `SUDO_GID`, and `SUDO_USER`'s groups), when this
    /// process is root under sudo; `None` otherwise.
    pub fn of_sudo_user() -> anyhow::Result<Option<Credentials>> {
        if !nix::unistd::Uid::effective().is_root() {
            return Ok(None);
        }
        let id = |var: &str| -> anyhow::Result<Option<u32>> {
            match std::env::var(var) {
                Err(_) => Ok(None),
                Ok(v) => v
                    .parse()
                    .map(Some)
                    .map_err(|_| anyhow::anyhow!("{var}={v} is not a user or group id")),
            }
        };
        let Some(uid) = id("SUDO_UID")? else {
            return Ok(None);
        };
        let gid = id("SUDO_GID")?.unwrap_or(uid);
        let groups = std::env::var("SUDO_USER")
            .ok()
            .and_then(|user| CString::new(user).ok())
            .and_then(|user| nix::unistd::getgrouplist(&user, nix::unistd::Gid::from_raw(gid)).ok())
            .map(|groups| groups.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|| vec![gid]);
        Ok(Some(Credentials { uid, gid, groups }))
    }
}

/// Why the command could not be run: `exec` (or becoming its user) failed with `error`.
/// Shells exit 127 when the program is not found, 126 when it cannot be run.
#[derive(Debug)]
pub struct NotRun {
    pub program: String,
    pub error: io::Error,
}

impl NotRun {
    pub fn exit_code(&self) -> i32 {
        match self.error.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => 127,
            _ => 126,
        }
    }
}

impl std::fmt::Display for NotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.error.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => "no such program".to_string(),
            Some(libc::EACCES) if names_only_directories(&self.program) => {
                "is a directory, not a program".to_string()
            }
            Some(libc::EACCES) => "permission denied (is it executable?)".to_string(),
            Some(libc::ENOEXEC) => "not a program this system can run".to_string(),
            _ => self.error.to_string(),
        };
        write!(f, "could not run `{}`: {what}", self.program)
    }
}

impl std::error::Error for NotRun {}

/// Whether every file `execvp` would have tried for `program` is a directory (which it
/// reports as EACCES, like a file without execute permission).
fn names_only_directories(program: &str) -> bool {
    let existing: Vec<_> = super::program::exec_candidates(program)
        .into_iter()
        .filter(|c| c.exists())
        .collect();
    !existing.is_empty() && existing.iter().all(|c| c.is_dir())
}

impl GatedChild {
    /// Forks; the child takes the nice value `nice` (the one sampler was started with,
    /// not the recorder's raised one), unblocks the signals in `unblock`, waits until the
    /// gate opens, becomes `run_as` when given, then `execvp`s `argv`.
    pub fn spawn(
        argv: &[String],
        unblock: &SigSet,
        run_as: Option<&Credentials>,
        nice: i32,
    ) -> io::Result<GatedChild> {
        if argv.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no command given",
            ));
        }
        // Everything the child needs is prepared before the fork: after it, only
        // async-signal-safe calls are allowed.
        let c_args: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "argument contains NUL"))?;
        let mut c_ptrs: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        c_ptrs.push(std::ptr::null());
        let (gate_read, gate_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (err_read, err_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let sigset = *unblock.as_ref();
        let groups: Vec<libc::gid_t> = run_as.map_or_else(Vec::new, |c| c.groups.clone());
        let ids = run_as.map(|c| (c.uid, c.gid));

        // SAFETY: between fork and exec/_exit the child only calls async-signal-safe
        // functions (sigprocmask, read, setgroups, setgid, setuid, execvp, write, _exit)
        // and setpriority (a system call that takes no lock) on memory prepared above.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            unsafe {
                // A higher nice value than the recorder's is always allowed.
                libc::setpriority(libc::PRIO_PROCESS, 0, nice);
                // The Rust runtime ignores SIGPIPE, and an ignored signal stays ignored
                // across exec: give the command the default a shell would.
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::sigprocmask(libc::SIG_UNBLOCK, &sigset, std::ptr::null_mut());
                libc::close(gate_write.as_raw_fd());
                let mut byte = 0u8;
                let n = libc::read(gate_read.as_raw_fd(), (&mut byte as *mut u8).cast(), 1);
                if n == 1 {
                    // Groups first, then the group, then the user: once it is no longer
                    // root, the child could change neither.
                    let became = match ids {
                        None => true,
                        Some((uid, gid)) => {
                            libc::setgroups(groups.len(), groups.as_ptr()) == 0
                                && libc::setgid(gid) == 0
                                && libc::setuid(uid) == 0
                        }
                    };
                    if became {
                        libc::execvp(c_ptrs[0], c_ptrs.as_ptr());
                    }
                    let errno = *libc::__errno_location();
                    libc::write(err_write.as_raw_fd(), (&errno as *const i32).cast(), 4);
                }
                libc::_exit(EXEC_FAILED);
            }
        }
        drop(gate_read);
        drop(err_write);
        Ok(GatedChild {
            pid: Pid::from_raw(pid),
            gate: Some(gate_write),
            exec_error: err_read,
        })
    }

    /// Opens the gate: the child execs the command. Returns the `exec` error if it failed.
    pub fn release(&mut self) -> io::Result<()> {
        let gate = self.gate.take().expect("gate released twice");
        nix::unistd::write(&gate, &[1u8])?;
        drop(gate);
        let mut buf = [0u8; 4];
        // The error pipe is close-on-exec: EOF means exec succeeded.
        match nix::unistd::read(&self.exec_error, &mut buf)? {
            4 => Err(io::Error::from_raw_os_error(i32::from_ne_bytes(buf))),
            _ => Ok(()),
        }
    }
}

/// Restores the default disposition of SIGCHLD, which we may have inherited as ignored:
/// then the kernel would reap the command itself and its exit status would be lost.
pub fn default_sigchld() -> io::Result<()> {
    // SAFETY: installs no handler of ours (SIG_DFL), so no signal-safety rules apply.
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGCHLD,
            nix::sys::signal::SigHandler::SigDfl,
        )
    }?;
    Ok(())
}

/// Blocks `signals` in the calling thread (and so in threads and children created later),
/// so that they are delivered through a signalfd instead of interrupting us.
pub fn block_signals(signals: &SigSet) -> io::Result<()> {
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(signals), None)?;
    Ok(())
}
