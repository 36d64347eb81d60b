//! The ids of kernel tracepoints, which perf events name them by, where tracefs is not
//! mounted (a container, a machine that came up without it): a child sampler reads them
//! in a mount namespace of its own, where it mounts tracefs. Nothing changes outside
//! that namespace, which goes with the child.

use anyhow::{Context, Result};

/// The hidden subcommand of the child ([`tracepoint_id_main`]).
pub const TRACEPOINT_ID_COMMAND: &str = "tracepoint-id";

/// Where tracefs is mounted, in the child's own namespace (as systemd mounts it).
const TRACEFS: &str = "/sys/kernel/tracing";

/// The id of the tracepoint `name` (`group/event`, as tracefs lists them), read by a
/// child in a private mount namespace; `None` when it could not (not root, no tracefs in
/// the kernel, no such tracepoint).
pub(super) fn id_in_private_mount(name: &str) -> Option<u64> {
    use std::process::{Command, Stdio};
    if !nix::unistd::Uid::effective().is_root() {
        return None;
    }
    // Sampler's own file, even when it was replaced on disk since it started.
    let out = Command::new("/proc/self/exe")
        .args([TRACEPOINT_ID_COMMAND, name])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

/// In the child: leaves the machine's mount namespace, makes every mount in the new one
/// private (so that what is mounted next reaches no other namespace), mounts tracefs and
/// prints the id of the tracepoint `name`.
pub fn tracepoint_id_main(name: &str) -> Result<()> {
    use nix::mount::{mount, MsFlags};
    if name.split('/').count() != 2 || name.contains("..") {
        anyhow::bail!("{name}: not a tracepoint's group/event");
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .context("cannot make a mount namespace")?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("cannot make the mounts private")?;
    let mounted = mount(
        Some("tracefs"),
        TRACEFS,
        Some("tracefs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    );
    match mounted {
        // Busy: tracefs is mounted there already (since the parent looked).
        Ok(()) | Err(nix::errno::Errno::EBUSY) => {}
        Err(e) => return Err(e).context("cannot mount tracefs"),
    }
    let path = format!("{TRACEFS}/events/{name}/id");
    let id: u64 = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {path}"))?
        .trim()
        .parse()
        .with_context(|| format!("{path} holds no number"))?;
    println!("{id}");
    Ok(())
}
