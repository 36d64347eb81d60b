//! The ring buffers the kernel writes samples into: how large they are by default and at
//! least, and their mapping, one per CPU shared by the CPU's events where the kernel
//! allows it.

use anyhow::{Context, Result};

use super::cpus::online_cpus;
use super::host::read_sysctl;
use super::sys;

/// What a sample takes in a ring besides its copy of the user stack: the record's header
/// and fixed fields (about 80 bytes), the user registers (17 on x86-64, 136 bytes) and a
/// callchain of a hundred frames (800 bytes), rounded up.
const SAMPLE_BYTES_BESIDES_STACK: usize = 1024;

/// The fewest data pages (a power of two) a ring needs to hold one sample with a stack
/// copy of `stack_bytes`: the kernel drops a record larger than the whole ring, so a
/// smaller ring records nothing.
pub fn min_ring_pages(stack_bytes: u32) -> usize {
    let page = sys::page_size();
    (stack_bytes as usize + SAMPLE_BYTES_BESIDES_STACK)
        .div_ceil(page)
        .next_power_of_two()
}

/// The default ring size: the largest power of two of data pages such that the ring and
/// its metadata page fit in `kernel.perf_event_mlock_kb` (per CPU, what an unprivileged
/// user may lock; 516 KiB by default, so 128 pages, as perf uses). Root is not bound by
/// it, and gets rings that grow with the sample: one stack-copy KiB per 128 pages, so a
/// hybrid sample (16 KiB copy) gets 2,048 pages (8 KiB, when this was measured, 1,024). Measured: 64 busy threads at 1000 Hz in
/// hybrid mode lost 186 samples in 3 s with 128 pages, none with 512. Off-CPU recording
/// writes a stack at every switch, and root's rings are [`OFF_CPU_RING_FACTOR`] times as
/// large then, within [`OFF_CPU_RING_BUDGET`] for all CPUs together.
pub(super) fn default_ring_pages(stack_bytes: u32, off_cpu: bool) -> usize {
    let kb = read_sysctl("perf_event_mlock_kb").unwrap_or(516) as usize;
    let pages = (kb / 4).saturating_sub(1).max(1);
    let base = 1 << pages.ilog2();
    if !nix::unistd::Uid::effective().is_root() {
        return base;
    }
    let sampling = base * (stack_bytes as usize).div_ceil(1024).next_power_of_two();
    if !off_cpu {
        return sampling;
    }
    let cpus = online_cpus().len().max(1);
    let affordable = OFF_CPU_RING_BUDGET / sys::PAGE_SIZE / cpus;
    // A power of two, as the kernel wants; never below the sampling ring.
    let within = 1 << affordable.max(1).ilog2();
    (sampling * OFF_CPU_RING_FACTOR).min(within).max(sampling)
}

/// How much larger root's rings are with `--off-cpu`: 4 times (4,096 pages, 16 MiB per
/// CPU, in hybrid mode). Each switch out writes a sample with a 2 KiB stack copy, and
/// the recorder must drain them while the CPUs are busy: pingpong at 50,000 switches/s
/// beside two spinning threads on 2 CPUs lost 1,800 to 14,000 records in each of 5 runs
/// with 1,024 pages, none in 5 runs with 4,096.
const OFF_CPU_RING_FACTOR: usize = 4;

/// The most that the larger off-CPU rings take, all CPUs together: 256 MiB, what the
/// sampling rings alone take on 64 CPUs. Past that many CPUs they stay the sampling size.
const OFF_CPU_RING_BUDGET: usize = 256 << 20;

/// Maps one ring per CPU on the first event of that CPU and points the CPU's other events
/// at it. When the kernel refuses a ring size (EPERM: over `perf_event_mlock_kb` and
/// `RLIMIT_MEMLOCK`), halves it and says so, down to `min_pages`, the least that holds a
/// sample.
pub(super) fn map_rings(
    fds: &[(usize, std::os::fd::OwnedFd)],
    cpus: usize,
    mut pages: usize,
    min_pages: usize,
) -> Result<(Vec<sys::RingBuffer>, Vec<usize>, usize)> {
    let leaders: Vec<usize> = (0..cpus)
        .filter_map(|c| fds.iter().position(|(cpu, _)| *cpu == c))
        .collect();
    let requested = pages;
    let mut rings = loop {
        let mapped: std::io::Result<Vec<_>> = leaders
            .iter()
            .map(|&i| sys::RingBuffer::map(&fds[i].1, pages))
            .collect();
        match mapped {
            Ok(rings) => break rings,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && pages > min_pages => pages /= 2,
            Err(e) => {
                return Err(e).context(format!(
                    "could not map {pages}-page perf ring buffers (try a smaller -m / --mmap-pages)"
                ))
            }
        }
    };
    if pages < requested {
        say!(
            "sampler: ring buffers shrunk from {requested} to {pages} pages per CPU: the kernel \
             refused more (kernel.perf_event_mlock_kb, ulimit -l); expect lost samples at high rates"
        );
    }
    let mut owners = leaders.clone();
    for (i, (cpu, fd)) in fds.iter().enumerate() {
        let Some(&leader) = leaders.iter().find(|&&l| fds[l].0 == *cpu) else {
            continue;
        };
        if i != leader && sys::set_output(fd, &fds[leader].1).is_err() {
            // The kernel would not share the buffer: this event gets its own.
            rings.push(sys::RingBuffer::map(fd, pages).context("could not map a ring buffer")?);
            owners.push(i);
        }
    }
    Ok((rings, owners, pages))
}
