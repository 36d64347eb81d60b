//! Starting the profiled command: fork a child that waits at a gate before `exec`, so
//! that the perf events (with `enable_on_exec`) are attached to it before it runs a
//! single instruction of the command.

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

impl GatedChild {
    /// Forks; the child unblocks the signals in `unblock`, waits until the gate opens, then
    /// `execvp`s `argv`.
    pub fn spawn(argv: &[String], unblock: &SigSet) -> io::Result<GatedChild> {
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

        // SAFETY: between fork and exec/_exit the child only calls async-signal-safe
        // functions (sigprocmask, read, execvp, write, _exit) on memory prepared above.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            unsafe {
                // The Rust runtime ignores SIGPIPE, and an ignored signal stays ignored
                // across exec: give the command the default a shell would.
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::sigprocmask(libc::SIG_UNBLOCK, &sigset, std::ptr::null_mut());
                libc::close(gate_write.as_raw_fd());
                let mut byte = 0u8;
                let n = libc::read(gate_read.as_raw_fd(), (&mut byte as *mut u8).cast(), 1);
                if n == 1 {
                    libc::execvp(c_ptrs[0], c_ptrs.as_ptr());
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
