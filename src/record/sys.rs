//! The few lines that talk to the kernel: `perf_event_open`, its ioctls, and the shared
//! ring buffer it writes into; the one call that tunes the C library's allocator, and the
//! one buffer made of zeros the system gives without their being written.
//! Every `unsafe` block of the crate lives here or in `launch.rs`, each with the reason
//! it is sound.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use perf_event_open_sys as sys;

/// Has glibc's allocator give memory back as sampler's phases end, so that its peak is
/// what one phase holds, not what all of them left behind: one arena for every thread
/// (a naming thread's own arena kept what it freed, and could not reuse what recording
/// freed), and blocks of 128 KiB or more mapped on their own and the top of the heap
/// trimmed past 128 KiB (glibc raises both thresholds as a program frees large blocks,
/// after which freed tables stay resident). On a `cargo build` this took sampler's peak
/// from about 54 to 36 MB. Call it first, before any thread starts.
#[cfg(target_env = "gnu")]
pub fn tune_allocator() {
    /// 128 KiB: glibc's own starting value for both thresholds, kept fixed.
    const THRESHOLD: libc::c_int = 128 << 10;
    for (param, value) in [
        (libc::M_ARENA_MAX, 1),
        (libc::M_TRIM_THRESHOLD, THRESHOLD),
        (libc::M_MMAP_THRESHOLD, THRESHOLD),
    ] {
        // SAFETY: mallopt only sets a parameter of the allocator, which glibc reads under
        // its own lock; it touches no memory of ours, and a refused value (return 0)
        // leaves the default.
        unsafe { libc::mallopt(param, value) };
    }
}

/// Other C libraries keep their own policy.
#[cfg(not(target_env = "gnu"))]
pub fn tune_allocator() {}

/// Gives the pages that freed memory left anywhere in the heap back to the system, not
/// only at its top: for a long-running process between phases (a continuous recording's
/// windows), whose naming of a large library leaves freed holes that would otherwise stay
/// resident until reused.
#[cfg(target_env = "gnu")]
pub fn release_free_memory() {
    // SAFETY: malloc_trim only returns free pages of the allocator's own heap to the
    // system (madvise), under the allocator's lock; no memory in use is touched.
    unsafe { libc::malloc_trim(0) };
}

/// Other C libraries keep their own policy.
#[cfg(not(target_env = "gnu"))]
pub fn release_free_memory() {}

/// A shared buffer of `len` zero bytes that costs no memory until written: the
/// allocator asks the system for zeroed memory (with [`tune_allocator`]'s threshold, a
/// block of its own, which the system maps on first touch), so a buffer of which only a
/// few parts are filled costs those parts. The size is first reserved (and given back)
/// as a `Vec`, so that one the system cannot give is refused rather than aborting the run.
pub fn zeroed_shared(len: usize) -> Result<std::sync::Arc<[u8]>, String> {
    Vec::<u8>::new()
        .try_reserve_exact(len)
        .map_err(|_| format!("{len} bytes cannot be allocated"))?;
    let zeroed = std::sync::Arc::<[u8]>::new_zeroed_slice(len);
    // SAFETY: the memory is zeroed, and all-zero bytes are valid `u8`s.
    Ok(unsafe { zeroed.assume_init() })
}

/// Opens one perf event for `pid` on `cpu`. The attribute is copied, so the caller's
/// value stays as it was (the kernel may write the size it expects into it).
pub fn perf_event_open(
    attr: &sys::bindings::perf_event_attr,
    pid: i32,
    cpu: i32,
) -> io::Result<OwnedFd> {
    let mut attr = *attr;
    // SAFETY: `attr` is a fully initialised perf_event_attr whose `size` field is set by
    // the caller; the kernel reads at most `size` bytes of it and may write `size` back.
    let fd = unsafe {
        sys::perf_event_open(
            &mut attr,
            pid,
            cpu,
            -1,
            sys::bindings::PERF_FLAG_FD_CLOEXEC as _,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pidfd of process `pid` (`pidfd_open`, Linux 5.3): a signal sent through it reaches
/// that process or none, never a later one that reuses its pid.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags (none) and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Forks a child that holds a copy of every descriptor of this process until the
/// descriptor returned (a pipe's write end) is closed, and then exits. What this process
/// closes meanwhile, and of which the child holds the last copy, is freed by the kernel
/// as the child exits, and not in this process's `close`: for files whose release waits
/// for the kernel (the last perf event on a tracepoint unregisters it and waits for an
/// RCU grace period). The child is left to be reaped by whoever reaps orphans.
pub fn release_in_child() -> io::Result<OwnedFd> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: between fork and _exit the child only calls async-signal-safe functions
    // (close, read, _exit) on descriptors made above.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        unsafe {
            libc::close(write.as_raw_fd());
            let mut byte = 0u8;
            // Until every copy of the write end is closed (EOF), or this process dies.
            loop {
                let n = libc::read(read.as_raw_fd(), (&mut byte as *mut u8).cast(), 1);
                if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                    break;
                }
            }
            libc::_exit(0);
        }
    }
    Ok(write)
}

/// Sends `signal` to the process of `pidfd`, as `kill` would (`pidfd_send_signal`).
pub fn pidfd_send_signal(pidfd: &OwnedFd, signal: nix::sys::signal::Signal) -> io::Result<()> {
    // SAFETY: a live pidfd, a signal number, no siginfo (the kernel fills in what kill
    // sends) and no flags; nothing is written to our memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal as i32,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns an event off (`PERF_EVENT_IOC_DISABLE`); used when recording stops so that the
/// last drain sees a buffer that no longer grows.
pub fn disable(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: the ioctl takes no pointer argument and `fd` is a live perf event descriptor.
    let rc = unsafe { sys::ioctls::DISABLE(fd.as_raw_fd(), 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns an event on (`PERF_EVENT_IOC_ENABLE`): the per-CPU events of a launched
/// command start just before the command is let go.
pub fn enable(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: the ioctl takes no pointer argument and `fd` is a live perf event descriptor.
    let rc = unsafe { sys::ioctls::ENABLE(fd.as_raw_fd(), 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel's id of an event (`PERF_EVENT_IOC_ID`): what `PERF_SAMPLE_IDENTIFIER`
/// writes into each of its records, and into those of the events `inherit` creates from
/// it in new threads (the kernel writes the parent event's id for them).
pub fn event_id(fd: &OwnedFd) -> io::Result<u64> {
    let mut id = 0u64;
    // SAFETY: the ioctl writes one u64 through the pointer, which points at `id`, live
    // for the call; `fd` is a live perf event descriptor.
    let rc = unsafe { sys::ioctls::ID(fd.as_raw_fd(), &mut id) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(id)
}

/// This thread's nice value (0 when it cannot be read).
pub fn nice() -> i32 {
    // SAFETY: getpriority takes plain integers and touches no memory of ours; errno is
    // this thread's. -1 is a nice value too: errno, cleared before, tells it from an
    // error.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if nice == -1 && *libc::__errno_location() != 0 {
            0
        } else {
            nice
        }
    }
}

/// Sets this thread's nice value (lower runs first), which the threads and processes it
/// starts afterwards inherit; needs root to go below zero.
pub fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes plain integers; `who = 0` is the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends the records of `fd` into the ring buffer of `target`
/// (`PERF_EVENT_IOC_SET_OUTPUT`), so that all events on one CPU share one buffer. The
/// kernel allows it only between events on the same CPU with the same clock.
pub fn set_output(fd: &OwnedFd, target: &OwnedFd) -> io::Result<()> {
    // SAFETY: the ioctl takes a descriptor number, and both descriptors are live perf
    // events that we own.
    let rc = unsafe { sys::ioctls::SET_OUTPUT(fd.as_raw_fd(), target.as_raw_fd()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes `values` (of `value_size` bytes each) into the elements of the mappable BPF
/// array map `map` (`BPF_F_MMAPABLE`, of `elements` elements `stride` bytes apart, as
/// the kernel lays them out) from element `first`. The pages that hold those elements
/// are mapped for the copy and unmapped after it: the kernel maps every page of a
/// mapping of a BPF array at once, and they count as the process's own memory while
/// mapped (a chunk of unwind-table rows mapped whole added 1 MiB to a recording's peak).
pub fn write_mapped_array(
    map: std::os::fd::BorrowedFd<'_>,
    elements: usize,
    stride: usize,
    first: usize,
    values: &[u8],
    value_size: usize,
) -> io::Result<()> {
    let count = values.len() / value_size.max(1);
    if value_size == 0 || value_size > stride || first + count > elements {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "values beyond the array",
        ));
    }
    if count == 0 {
        return Ok(());
    }
    let page = page_size();
    let from = first * stride / page * page;
    let to = (first + count) * stride;
    let memory = MmapOptions::new()
        .offset(from as u64)
        .len(to.next_multiple_of(page) - from)
        .map_raw(map.as_raw_fd())?;
    let base = memory.as_mut_ptr();
    let first_at = first * stride - from;
    // Unwind-table rows are 12 bytes: copied as such, each copy is two moves, where a
    // copy of a size known only at run time is a call (3.8 million of them for a build's
    // tables).
    match value_size {
        // SAFETY: checked above: the elements `first..first + count` lie within the
        // array, and the mapping holds the pages from the one `first` starts in to the
        // one the last ends in: byte `first_at + i * stride` of the mapping is where
        // element `first + i` starts. 12 = `value_size` <= `stride`.
        12 => unsafe { copy_strided::<12>(base, first_at, stride, values) },
        _ => {
            for (i, value) in values.chunks_exact(value_size).enumerate() {
                // SAFETY: as in `copy_strided`, for `value_size` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        value.as_ptr(),
                        base.add(first_at + i * stride),
                        value_size,
                    );
                }
            }
        }
    }
    Ok(())
}

/// Copies `values`, `N` bytes each, into the mapped array at `to`: the first at byte
/// `first_at`, the next `stride` bytes further, and so on.
///
/// # Safety
///
/// The mapping at `to` (writable, shared with the kernel only: nothing in this process
/// refers to it) must hold the `values.len() / N` elements from byte `first_at`,
/// `stride` bytes apart, and `N <= stride`.
unsafe fn copy_strided<const N: usize>(to: *mut u8, first_at: usize, stride: usize, values: &[u8]) {
    for (i, value) in values.chunks_exact(N).enumerate() {
        // SAFETY: this element lies within the mapping and holds `N` bytes (the
        // caller's promise); `value` is our own slice, which does not overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(value.as_ptr(), to.add(first_at + i * stride), N);
        }
    }
}

/// One perf ring buffer: the metadata page followed by `2^n` data pages, shared with the
/// kernel. The kernel advances `data_head`; we read what lies between our tail and the
/// head and then publish the new `data_tail`, which frees the space for the kernel.
pub struct RingBuffer {
    map: MmapRaw,
    data_offset: usize,
    data_size: usize,
}

/// The bytes of one record as they sit in the ring: one slice, or two when the record
/// wraps around the end of the buffer.
pub struct RingRecord<'a> {
    pub kind: u32,
    pub misc: u16,
    pub body: (&'a [u8], &'a [u8]),
}

pub const PAGE_SIZE: usize = 4096;

/// The size of a page of memory, as the kernel says ([`PAGE_SIZE`] where it cannot be
/// asked).
pub fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .filter(|p| p.is_power_of_two())
        .unwrap_or(PAGE_SIZE)
}

impl RingBuffer {
    /// Maps the ring buffer of `fd` with `data_pages` data pages (a power of two).
    pub fn map(fd: &OwnedFd, data_pages: usize) -> io::Result<RingBuffer> {
        let len = (data_pages + 1) * PAGE_SIZE;
        let map = MmapOptions::new().len(len).map_raw(fd.as_raw_fd())?;
        Ok(RingBuffer {
            map,
            data_offset: PAGE_SIZE,
            data_size: data_pages * PAGE_SIZE,
        })
    }

    fn head_and_tail(&self) -> (&AtomicU64, &AtomicU64) {
        let page = self.map.as_mut_ptr() as *const sys::bindings::perf_event_mmap_page;
        // SAFETY: the mapping is at least one page long and starts with the kernel's
        // perf_event_mmap_page; data_head and data_tail are naturally aligned u64 fields
        // that the kernel and we access atomically (the protocol of perf_event_open(2)).
        unsafe {
            let head = std::ptr::addr_of!((*page).data_head) as *const AtomicU64;
            let tail = std::ptr::addr_of!((*page).data_tail) as *const AtomicU64;
            (&*head, &*tail)
        }
    }

    /// Hands every complete record now in the buffer to `each`, then releases the space.
    /// Returns how much was read, and how much of it could not be.
    pub fn drain(&mut self, mut each: impl FnMut(RingRecord<'_>)) -> Drained {
        let (head_atomic, tail_atomic) = self.head_and_tail();
        let head = head_atomic.load(Ordering::Acquire);
        let tail = tail_atomic.load(Ordering::Relaxed);
        let available = (head - tail) as usize;
        if available == 0 {
            return Drained::default();
        }
        // The readable bytes [tail, head) as one or two slices (when they wrap around).
        let start = (tail as usize) % self.data_size;
        let first_len = available.min(self.data_size - start);
        // SAFETY: both ranges lie inside the data area of the mapping, and between the
        // tail we own and the head the kernel published (acquire ordering above) the
        // kernel does not write until we move the tail.
        let (first, second) = unsafe {
            let data = self.map.as_ptr().add(self.data_offset);
            (
                std::slice::from_raw_parts(data.add(start), first_len),
                std::slice::from_raw_parts(data, available - first_len),
            )
        };
        let drained = parse_records(first, second, &mut each);
        tail_atomic.store(head, Ordering::Release);
        drained
    }
}

/// What one drain of a ring buffer read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    pub records: usize,
    /// Bytes from the first record that could not be a kernel record (a size that is
    /// not a multiple of 8, or runs past what the kernel published, or an unknown type)
    /// to the end of what was read. The kernel publishes whole records only, so the rest
    /// cannot be told apart from garbage: it is skipped, and the caller reports it.
    pub unreadable_bytes: usize,
}

/// Splits `first ++ second` into records. Records are 8-byte aligned and `first` ends at
/// the end of the buffer, a multiple of 8, so a record header never straddles the two.
fn parse_records(first: &[u8], second: &[u8], each: &mut impl FnMut(RingRecord<'_>)) -> Drained {
    let total = first.len() + second.len();
    let mut at = 0;
    let mut count = 0;
    while at < total {
        if at + 8 > total {
            return Drained {
                records: count,
                unreadable_bytes: total - at,
            };
        }
        let header = if at < first.len() {
            &first[at..at + 8]
        } else {
            &second[at - first.len()..][..8]
        };
        let kind = u32::from_ne_bytes(header[0..4].try_into().unwrap());
        let misc = u16::from_ne_bytes(header[4..6].try_into().unwrap());
        let size = u16::from_ne_bytes(header[6..8].try_into().unwrap()) as usize;
        let known = (1..sys::bindings::PERF_RECORD_MAX).contains(&kind);
        if size < 8 || !size.is_multiple_of(8) || at + size > total || !known {
            return Drained {
                records: count,
                unreadable_bytes: total - at,
            };
        }
        let (body_start, body_end) = (at + 8, at + size);
        let body = if body_end <= first.len() {
            (&first[body_start..body_end], &second[..0])
        } else if body_start >= first.len() {
            (
                &second[body_start - first.len()..body_end - first.len()],
                &second[..0],
            )
        } else {
            (&first[body_start..], &second[..body_end - first.len()])
        };
        each(RingRecord { kind, misc, body });
        at += size;
        count += 1;
    }
    Drained {
        records: count,
        unreadable_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, body: &[u8]) -> Vec<u8> {
        let mut r = kind.to_ne_bytes().to_vec();
        r.extend_from_slice(&0u16.to_ne_bytes());
        r.extend_from_slice(&((8 + body.len()) as u16).to_ne_bytes());
        r.extend_from_slice(body);
        r
    }

    #[test]
    fn records_are_split_across_the_wrap() {
        let mut bytes = record(1, &[1; 16]);
        bytes.extend(record(2, &[2; 24]));
        bytes.extend(record(3, &[3; 8]));
        // Wrap inside the second record's body.
        let (first, second) = bytes.split_at(40);
        let mut seen = Vec::new();
        let n = parse_records(first, second, &mut |r: RingRecord<'_>| {
            let body: Vec<u8> = r.body.0.iter().chain(r.body.1).copied().collect();
            seen.push((r.kind, body));
        });
        assert_eq!(
            n,
            Drained {
                records: 3,
                unreadable_bytes: 0
            }
        );
        assert_eq!(seen[0], (1, vec![1; 16]));
        assert_eq!(seen[1], (2, vec![2; 24]));
        assert_eq!(seen[2], (3, vec![3; 8]));
    }

    #[test]
    fn corrupt_records_are_counted_not_dropped_silently() {
        // A size wrapped past 16 bits leaves a record whose size field is too small for
        // it: what follows is the middle of a callchain, not a record.
        let good = record(9, &[0; 16]);
        let mut wrapped = 9u32.to_ne_bytes().to_vec();
        wrapped.extend_from_slice(&0u16.to_ne_bytes());
        wrapped.extend_from_slice(&12u16.to_ne_bytes());
        wrapped.extend_from_slice(&[0xff; 36]);
        let mut bytes = good.clone();
        bytes.extend(&wrapped);
        let n = parse_records(&bytes, &[], &mut |_| {});
        assert_eq!(
            n,
            Drained {
                records: 1,
                unreadable_bytes: wrapped.len()
            }
        );
        // An unknown record type, and a record running past the published head.
        let mut unknown = good.clone();
        unknown.extend(record(0x4000, &[1; 8]));
        assert_eq!(
            parse_records(&unknown, &[], &mut |_| {}).unreadable_bytes,
            16
        );
        let cut = &good[..good.len() - 8];
        assert_eq!(parse_records(cut, &[], &mut |_| {}).unreadable_bytes, 16);
        assert_eq!(
            parse_records(&good[..4], &[], &mut |_| {}).unreadable_bytes,
            4
        );
    }
}
