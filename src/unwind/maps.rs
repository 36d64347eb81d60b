//! Which file backs which address of a process, as it changes over time. The recording's
//! MMAP, FORK and exec COMM events are replayed in time order into one [`AddressSpace`]
//! per process (kept by [`crate::unwind::Unwinder`]), so that each sample is resolved
//! against the map its process had when it was taken. Each
//! region carries a payload `T`: whatever its user resolved once for the mapping (the
//! library and how to turn addresses into the file's own), so that a frame costs only a
//! binary search.

/// A mapped range: `len` bytes at `start`, showing the file from `file_offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region<T> {
    pub start: u64,
    pub len: u64,
    pub file_offset: u64,
    pub data: T,
}

impl<T> Region<T> {
    /// The file offset of the byte at `address` (which must lie in the region).
    pub fn file_offset_of(&self, address: u64) -> u64 {
        address - self.start + self.file_offset
    }
}

/// The executable regions of one process, sorted by start address, never overlapping.
#[derive(Clone, Debug)]
pub struct AddressSpace<T> {
    regions: Vec<Region<T>>,
}

impl<T> Default for AddressSpace<T> {
    fn default() -> Self {
        AddressSpace {
            regions: Vec::new(),
        }
    }
}

impl<T: Clone> AddressSpace<T> {
    /// Adds a region; whatever it overlaps is cut away, as `mmap(MAP_FIXED)` would do.
    pub fn map(&mut self, new: Region<T>) {
        let new_end = new.start + new.len;
        let mut kept = Vec::with_capacity(self.regions.len() + 2);
        for old in self.regions.drain(..) {
            let old_end = old.start + old.len;
            if old_end <= new.start || old.start >= new_end {
                kept.push(old);
                continue;
            }
            if old.start < new.start {
                kept.push(Region {
                    len: new.start - old.start,
                    ..old.clone()
                });
            }
            if old_end > new_end {
                let cut = new_end - old.start;
                kept.push(Region {
                    start: new_end,
                    len: old_end - new_end,
                    file_offset: old.file_offset + cut,
                    ..old
                });
            }
        }
        kept.push(new);
        kept.sort_by_key(|m| m.start);
        self.regions = kept;
    }

    /// The region that contains `address`.
    pub fn lookup(&self, address: u64) -> Option<&Region<T>> {
        let i = self.regions.partition_point(|m| m.start <= address);
        let m = self.regions.get(i.checked_sub(1)?)?;
        (address < m.start + m.len).then_some(m)
    }

    pub fn regions(&self) -> &[Region<T>] {
        &self.regions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, len: u64, file_offset: u64, data: &'static str) -> Region<&'static str> {
        Region {
            start,
            len,
            file_offset,
            data,
        }
    }

    #[test]
    fn later_mapping_cuts_the_earlier_one() {
        let mut s = AddressSpace::default();
        s.map(r(0x1000, 0x3000, 0, "a"));
        s.map(r(0x2000, 0x1000, 0, "b"));
        assert_eq!(s.lookup(0x1fff).unwrap().data, "a");
        assert_eq!(s.lookup(0x2000).unwrap().data, "b");
        let tail = s.lookup(0x3800).unwrap();
        assert_eq!(
            (tail.data, tail.start, tail.file_offset),
            ("a", 0x3000, 0x2000)
        );
        assert_eq!(tail.file_offset_of(0x3800), 0x2800);
        assert!(s.lookup(0x4000).is_none());
        assert!(s.lookup(0xfff).is_none());
        assert_eq!(s.regions().len(), 3);
    }
}
