//! What recording reads and changes of the machine besides its perf events: kernel
//! settings (`/proc/sys/kernel`), the open-file limit, the recorder's priority, and the
//! clock the events are stamped with.

/// The number in the kernel setting `/proc/sys/kernel/<name>`, when it can be read.
pub(super) fn read_sysctl(name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Attaching opens one event per thread and CPU: a process with 500 threads on 8 CPUs
/// needs 4,000 descriptors, past the usual soft limit of 1,024. The soft limit is raised
/// to the hard one (what perf does too); if that fails, opening events says so. Each
/// mapped file is kept open until it is named, too (see `crate::files::binary`).
pub(super) fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// The recorder's nice value when it may raise its priority: ahead of ordinary
/// processes (0) without approaching real-time-like values.
pub(super) const RECORDER_NICE: i32 = -10;

/// Now on the clock the events are stamped with (`CLOCK_MONOTONIC`), in nanoseconds.
pub(super) fn monotonic_ns() -> u64 {
    let ts =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}
