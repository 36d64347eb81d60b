//! The program's two chunked arrays (`rows` and `mappings` in `bpf/unwind.bpf.c`): each
//! one array indexed from 0, kept as array maps of a fixed size (chunks) in an array of
//! maps, each chunk made the first time an element in it is written. The kernel memory
//! they take is what the recording needs (a C program and its libraries: one chunk of
//! rows, 1 MiB; rustc's 2.8 million rows: 44) rather than the most it could.
//!
//! Putting chunks into the array of maps makes the kernel wait for an RCU grace period
//! (10-20 ms here) so that no program still sees the old slot: the chunks a write needs
//! are put in with one batch (one wait), and the first chunk is made on a thread of its
//! own as the program loads, so that a new process's first tables do not wait for it.

use std::os::fd::{AsFd, AsRawFd};
use std::thread::JoinHandle;

use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

use super::super::sys;

/// The most elements written with one mapping (or batch): 16,384, 256 KiB of
/// unwind-table rows as the kernel lays them out. The pages of a mapping count as
/// sampler's memory while it lasts: a chunk of rows mapped whole added 1 MiB to a short
/// recording's peak. Each mapping costs some 20 µs: with 4,096, the 2.8 million rows of
/// a Rust build's tables took 15 ms more of `-a`'s CPU than whole chunks did.
const WINDOW_ELEMENTS: usize = 16_384;

/// One chunked array; see the module's description.
pub(super) struct Chunks {
    layout: Layout,
    /// The array of maps.
    outer: MapHandle,
    made: Vec<MapHandle>,
    /// The first chunk, being made and put in.
    first: Option<JoinHandle<Result<MapHandle, String>>>,
}

/// What the chunks of one array are.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    /// The array of maps' name in the program.
    pub(super) name: &'static str,
    /// Elements per chunk: 2^shift.
    pub(super) shift: u32,
    /// The most chunks: the array of maps' size.
    pub(super) most: usize,
    pub(super) value_size: usize,
    /// Whether chunks are written through a mapping of their memory (`BPF_F_MMAPABLE`;
    /// large writes) rather than by the kernel's batch update.
    pub(super) mapped: bool,
}

impl Layout {
    /// A new chunk, not yet in the array of maps.
    fn chunk(&self) -> Result<MapHandle, String> {
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
            map_flags: if self.mapped {
                libbpf_sys::BPF_F_MMAPABLE
            } else {
                0
            },
            ..Default::default()
        };
        MapHandle::create(
            MapType::Array,
            Some(self.name),
            4,
            self.value_size as u32,
            1 << self.shift,
            &opts,
        )
        .map_err(|e| format!("a chunk of the eBPF program's {}: {e}", self.name))
    }
}

/// Puts `chunks` into `outer` from slot `from`, in one batch.
fn put(outer: &MapHandle, from: usize, chunks: &[MapHandle], name: &str) -> Result<(), String> {
    let keys: Vec<u8> = (from..from + chunks.len())
        .flat_map(|k| (k as u32).to_ne_bytes())
        .collect();
    let values: Vec<u8> = chunks
        .iter()
        .flat_map(|c| c.as_fd().as_raw_fd().to_ne_bytes())
        .collect();
    outer
        .update_batch(
            &keys,
            &values,
            chunks.len() as u32,
            MapFlags::ANY,
            MapFlags::ANY,
        )
        .map_err(|e| format!("the eBPF program's {name}: {e}"))
}

impl Chunks {
    /// The array `layout.name` of the loaded program `object`; its first chunk is made
    /// at once, on a thread of its own.
    pub(super) fn new(object: &libbpf_rs::Object, layout: Layout) -> Result<Chunks, String> {
        let outer = object
            .maps()
            .find(|m| m.name() == layout.name)
            .ok_or_else(|| format!("the eBPF program has no {}", layout.name))
            .and_then(|m| MapHandle::try_from(&m).map_err(|e| e.to_string()))?;
        let for_first = MapHandle::try_from(&outer).map_err(|e| e.to_string())?;
        let first = std::thread::Builder::new()
            .name("sampler-chunk".into())
            .spawn(move || {
                let chunk = layout.chunk()?;
                put(&for_first, 0, std::slice::from_ref(&chunk), layout.name)?;
                Ok(chunk)
            })
            .ok();
        Ok(Chunks {
            layout,
            outer,
            made: Vec::new(),
            first,
        })
    }

    /// Elements the array can hold.
    pub(super) fn capacity(&self) -> u64 {
        (self.layout.most as u64) << self.layout.shift
    }

    /// Writes `values` (a whole number of elements) from element `first`, making the
    /// chunks they fall in.
    pub(super) fn write(&mut self, first: u32, values: &[u8]) -> Result<(), String> {
        let Layout {
            name,
            shift,
            value_size: size,
            mapped,
            ..
        } = self.layout;
        let per = 1usize << shift;
        let count = values.len() / size;
        if count == 0 {
            return Ok(());
        }
        self.make((first as usize + count - 1) >> shift)?;
        let mut done = 0;
        while done < count {
            let index = first as usize + done;
            let (chunk, at) = (index >> shift, index & (per - 1));
            let n = (per - at).min(count - done).min(WINDOW_ELEMENTS);
            let map = &self.made[chunk];
            let bytes = &values[done * size..(done + n) * size];
            let written = match mapped {
                // The kernel lays an array's elements out 8-byte aligned.
                true => {
                    let stride = size.next_multiple_of(8);
                    sys::write_mapped_array(map.as_fd(), per, stride, at, bytes, size)
                        .map_err(|e| e.to_string())
                }
                false => {
                    let keys: Vec<u8> = (at..at + n)
                        .flat_map(|k| (k as u32).to_ne_bytes())
                        .collect();
                    map.update_batch(&keys, bytes, n as u32, MapFlags::ANY, MapFlags::ANY)
                        .map_err(|e| e.to_string())
                }
            };
            written.map_err(|e| format!("the eBPF program's {name}: {e}"))?;
            done += n;
        }
        Ok(())
    }

    /// Makes the chunks up to `last` and puts them in the array of maps.
    fn make(&mut self, last: usize) -> Result<(), String> {
        if last >= self.layout.most {
            return Err(format!("the eBPF program's {} are full", self.layout.name));
        }
        if self.made.is_empty() {
            let first = match self.first.take().map(JoinHandle::join) {
                Some(Ok(made)) => made?,
                _ => {
                    let chunk = self.layout.chunk()?;
                    put(
                        &self.outer,
                        0,
                        std::slice::from_ref(&chunk),
                        self.layout.name,
                    )?;
                    chunk
                }
            };
            self.made.push(first);
        }
        let from = self.made.len();
        if last < from {
            return Ok(());
        }
        let new = (from..=last)
            .map(|_| self.layout.chunk())
            .collect::<Result<Vec<_>, String>>()?;
        put(&self.outer, from, &new, self.layout.name)?;
        self.made.extend(new);
        Ok(())
    }
}
