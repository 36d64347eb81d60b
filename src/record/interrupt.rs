//! Stopping the naming that follows a recording. The signals that end a recording
//! (Ctrl-C, SIGTERM, SIGHUP, …: [`crate::record::STOP_SIGNALS`]) stay blocked once it has
//! ended, so that none of them kills sampler before the profile is written; unwatched,
//! they did nothing at all, and a debuginfod server that sent a byte now and then held
//! sampler until SIGKILL. [`watch`] takes them from then on: the first raises a flag
//! that naming looks at ([`stopped`]: before each library, and between the reads of a
//! download), and the profile is written with the names found until then.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// The signal that stopped the naming, 0 while none has.
static STOPPED: AtomicI32 = AtomicI32::new(0);

/// The signal that asked for the naming to stop, once one has.
pub fn stopped() -> Option<Signal> {
    match STOPPED.load(Ordering::Relaxed) {
        0 => None,
        signo => Signal::try_from(signo).ok(),
    }
}

/// From now on, the first of `signals` to reach sampler stops the naming (see
/// [`stopped`]); later ones are taken and ignored. Those already pending belong to the
/// recording's end (a Ctrl-C that raced the command's exit) and are dropped. The
/// signals are blocked in the calling thread, and so in the threads it starts.
pub fn watch(signals: &[Signal]) -> std::io::Result<()> {
    let mut set = SigSet::empty();
    for &signal in signals {
        set.add(signal);
    }
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
    let pending = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
    while let Ok(Some(_)) = pending.read_signal() {}
    drop(pending);
    let fd = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC)?;
    std::thread::Builder::new()
        .name("sampler-signals".into())
        .spawn(move || loop {
            match fd.read_signal() {
                Ok(Some(info)) => {
                    TAKEN.fetch_add(1, Ordering::Relaxed);
                    let _ = STOPPED.compare_exchange(
                        0,
                        info.ssi_signo as i32,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                }
                Ok(None) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return,
            }
        })?;
    Ok(())
}

/// How many of the watched signals have arrived since [`watch`]; what comes after the
/// naming (`record --view`'s server) stops at the next one.
static TAKEN: AtomicU64 = AtomicU64::new(0);

/// The number of watched signals taken so far.
pub fn signals_taken() -> u64 {
    TAKEN.load(Ordering::Relaxed)
}
