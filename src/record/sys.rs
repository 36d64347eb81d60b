//! The few lines that talk to the kernel: `perf_event_open`, its ioctls, and the shared
//! ring buffer it writes into. Every `unsafe` block of the crate lives here or in
//! `launch.rs`, each with the reason it is sound.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use perf_event_open_sys as sys;

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

const PAGE_SIZE: usize = 4096;

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
    /// Returns the number of records read.
    pub fn drain(&mut self, mut each: impl FnMut(RingRecord<'_>)) -> usize {
        let (head_atomic, tail_atomic) = self.head_and_tail();
        let head = head_atomic.load(Ordering::Acquire);
        let mut tail = tail_atomic.load(Ordering::Relaxed);
        // SAFETY: the data area lies entirely inside the mapping; between the tail we own
        // and the head the kernel published (with acquire ordering above) it does not write.
        let data = unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().add(self.data_offset), self.data_size)
        };
        let mut count = 0;
        while tail < head {
            let start = (tail as usize) % self.data_size;
            // A record header is 8 bytes and records are 8-byte aligned in a buffer whose
            // size is a power of two, so the header itself never wraps.
            let kind = u32::from_ne_bytes(data[start..start + 4].try_into().unwrap());
            let misc = u16::from_ne_bytes(data[start + 4..start + 6].try_into().unwrap());
            let size = u16::from_ne_bytes(data[start + 6..start + 8].try_into().unwrap()) as usize;
            if size < 8 {
                // A corrupt header: give up on the rest of this buffer's contents.
                tail = head;
                break;
            }
            let body_start = (start + 8) % self.data_size;
            let body_len = size - 8;
            let body = if body_start + body_len <= self.data_size {
                (&data[body_start..body_start + body_len], &data[0..0])
            } else {
                let first = self.data_size - body_start;
                (&data[body_start..], &data[..body_len - first])
            };
            each(RingRecord { kind, misc, body });
            tail += size as u64;
            count += 1;
        }
        tail_atomic.store(tail, Ordering::Release);
        count
    }
}
