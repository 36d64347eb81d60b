//! Which file backs which address of a process, as it changes over time. The recording's
//! MMAP, FORK and exec COMM events are replayed in time order into [`AddressSpaces`], so
//! that each sample is resolved against the map its process had when it was taken.

use std::collections::HashMap;

use crate::record::Mapping;

/// The executable mappings of one process, sorted by start address, never overlapping.
#[derive(Clone, Debug, Default)]
pub struct AddressSpace {
    mappings: Vec<Mapping>,
}

impl AddressSpace {
    /// Adds a mapping; whatever it overlaps is cut away, as `mmap(MAP_FIXED)` would do.
    pub fn map(&mut self, new: Mapping) {
        let new_end = new.start + new.len;
        let mut kept = Vec::with_capacity(self.mappings.len() + 2);
        for old in self.mappings.drain(..) {
            let old_end = old.start + old.len;
            if old_end <= new.start || old.start >= new_end {
                kept.push(old);
                continue;
            }
            if old.start < new.start {
                kept.push(Mapping {
                    len: new.start - old.start,
                    ..old.clone()
                });
            }
            if old_end > new_end {
                let cut = new_end - old.start;
                kept.push(Mapping {
                    start: new_end,
                    len: old_end - new_end,
                    file_offset: old.file_offset + cut,
                    ..old
                });
            }
        }
        kept.push(new);
        kept.sort_by_key(|m| m.start);
        self.mappings = kept;
    }

    /// The mapping that contains `address`.
    pub fn lookup(&self, address: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= address);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        (address < m.start + m.len).then_some(m)
    }

    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }
}

/// The address spaces of every process seen so far, keyed by pid.
#[derive(Clone, Debug, Default)]
pub struct AddressSpaces {
    spaces: HashMap<i32, AddressSpace>,
}

impl AddressSpaces {
    pub fn map(&mut self, mapping: Mapping) {
        self.spaces.entry(mapping.pid).or_default().map(mapping);
    }

    /// A new process starts with a copy of its parent's mappings.
    pub fn fork(&mut self, parent: i32, child: i32) {
        if parent != child {
            let copy = self.spaces.get(&parent).cloned().unwrap_or_default();
            self.spaces.insert(child, copy);
        }
    }

    /// `exec` replaces the whole address space; the new program's mappings follow.
    pub fn exec(&mut self, pid: i32) {
        self.spaces.insert(pid, AddressSpace::default());
    }

    pub fn lookup(&self, pid: i32, address: u64) -> Option<&Mapping> {
        self.spaces.get(&pid)?.lookup(address)
    }

    pub fn space(&self, pid: i32) -> Option<&AddressSpace> {
        self.spaces.get(&pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, len: u64, off: u64, path: &str) -> Mapping {
        Mapping {
            pid: 1,
            start,
            len,
            file_offset: off,
            path: path.into(),
            build_id: None,
            executable: true,
        }
    }

    #[test]
    fn later_mapping_cuts_the_earlier_one() {
        let mut s = AddressSpace::default();
        s.map(m(0x1000, 0x3000, 0, "a"));
        s.map(m(0x2000, 0x1000, 0, "b"));
        assert_eq!(s.lookup(0x1fff).unwrap().path, "a");
        assert_eq!(s.lookup(0x2000).unwrap().path, "b");
        let tail = s.lookup(0x3800).unwrap();
        assert_eq!(
            (tail.path.as_str(), tail.start, tail.file_offset),
            ("a", 0x3000, 0x2000)
        );
        assert!(s.lookup(0x4000).is_none());
        assert!(s.lookup(0xfff).is_none());
    }

    #[test]
    fn fork_copies_and_exec_clears() {
        let mut spaces = AddressSpaces::default();
        spaces.map(m(0x1000, 0x1000, 0, "a"));
        spaces.fork(1, 2);
        assert_eq!(spaces.lookup(2, 0x1800).unwrap().path, "a");
        spaces.exec(2);
        assert!(spaces.lookup(2, 0x1800).is_none());
        assert!(spaces.lookup(1, 0x1800).is_some());
    }
}
