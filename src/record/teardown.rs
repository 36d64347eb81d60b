//! The end of a recording that the kernel takes its time to undo: closing its events, the
//! kernel walker, and giving up the frame limit's claim, without making the user wait
//! for the kernel where nothing depends on it.

use super::kernel_walk::KernelWalker;
use super::open::OpenEvents;
use super::stack_limit;
use super::sys;

/// What is left of a finished recording that the kernel takes its time to undo: closing
/// the last event on a tracepoint (the teardown stacks' `exit_group`) waits for an RCU
/// grace period (35-60 ms here), and a raised frame limit can be put back only once
/// every callchain event is freed, after another. Without a raised limit, a child
/// process that holds copies of the events frees them as it exits, and nobody waits.
/// With one, the events are closed and the limit put back on a thread of its own while
/// the profile is named and written; dropping this waits for that thread, so sampler
/// does not exit before the setting is back. (Killed meanwhile, the kernel closes the
/// events and the frame limit's watchdog puts it back.)
#[must_use = "dropping it waits for the events to be closed"]
pub struct Teardown(Option<std::thread::JoinHandle<()>>);

impl Teardown {
    /// Closes `events` and the kernel walker, then gives up the frame limit's claim
    /// (see [`Teardown`]).
    pub(super) fn start(
        events: OpenEvents,
        walker: Option<KernelWalker>,
        deeper: stack_limit::DeeperStacks,
    ) -> Teardown {
        // Without a claim to give up, nothing waits for the events to be freed: a child
        // holding copies of them frees them as it exits, and nobody waits for that.
        if !deeper.holds_claim() {
            if let Ok(release) = sys::release_in_child() {
                drop(walker);
                drop(events);
                drop(release);
                return Teardown(None);
            }
        }
        // libbpf's object stays on the thread that made it.
        drop(walker);
        // A thread that cannot be made drops its closure, and what it holds, here.
        let thread = std::thread::Builder::new()
            .name("sampler-teardown".into())
            .spawn(move || {
                drop(events);
                drop(deeper);
            });
        Teardown(thread.ok())
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            let _ = thread.join();
        }
    }
}
