//! The bookkeeping of the followed processes' mappings (see [`Followed`]): which
//! mappings with tables each one has, and its slot in the program's array of mappings.

use std::collections::HashMap;

use super::MAX_MAPPINGS;

/// One mapping in a process's list (`struct mapping` once its file's rows are known).
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub(super) start: u64,
    pub(super) end: u64,
    /// Process address minus file address.
    pub(super) bias: u64,
    /// The mapped file (an index into `KernelWalker::rows`).
    pub(super) file: usize,
}

/// Which mappings with tables each followed process has, and each walked process's slot
/// in the program's array of mappings: the bookkeeping of `KernelWalker`, which writes
/// a process's list to the program whenever it changes.
///
/// Invariants: a list is sorted by start, its mappings do not overlap, and it holds at
/// most [`MAX_MAPPINGS`]; a process has a slot exactly while its list is not empty (and
/// a slot was free), and no two processes share one.
pub(super) struct Followed {
    lists: HashMap<i32, Vec<Entry>>,
    slots: HashMap<i32, u32>,
    free_slots: Vec<u32>,
    /// Whole-machine recording: every process is followed but this one (sampler).
    all_but: Option<i32>,
}

impl Followed {
    pub(super) fn new(slots: u32) -> Followed {
        Followed {
            lists: HashMap::new(),
            slots: HashMap::new(),
            free_slots: (0..slots).rev().collect(),
            all_but: None,
        }
    }

    pub(super) fn follow(&mut self, pid: i32) {
        self.lists.entry(pid).or_default();
    }

    /// Follows every process but `except`: those whose mappings come later as events
    /// too, each from its first event (a process forked by one not followed starts with
    /// no mappings).
    pub(super) fn follow_all_but(&mut self, except: i32) {
        self.all_but = Some(except);
    }

    pub(super) fn is_followed(&self, pid: i32) -> bool {
        self.lists.contains_key(&pid) || self.all_but.is_some_and(|e| e != pid)
    }

    /// `pid`'s list, made when every process is followed.
    fn list_mut(&mut self, pid: i32) -> Option<&mut Vec<Entry>> {
        match self.all_but {
            Some(except) if except != pid => Some(self.lists.entry(pid).or_default()),
            _ => self.lists.get_mut(&pid),
        }
    }

    /// Puts `entry` in `pid`'s list in place of what it overlaps (as `mmap` replaces
    /// what was mapped there); whether `pid` is followed.
    pub(super) fn map(&mut self, pid: i32, entry: Entry) -> bool {
        let Some(list) = self.list_mut(pid) else {
            return false;
        };
        list.retain(|e| e.end <= entry.start || e.start >= entry.end);
        let at = list.partition_point(|e| e.start < entry.start);
        if at < MAX_MAPPINGS {
            list.insert(at, entry);
            list.truncate(MAX_MAPPINGS);
        }
        true
    }

    /// Takes out of `pid`'s list what `range` overlaps (mapped anew with no rows);
    /// whether the list changed.
    pub(super) fn unmap(&mut self, pid: i32, range: std::ops::Range<u64>) -> bool {
        let Some(list) = self.list_mut(pid) else {
            return false;
        };
        let before = list.len();
        list.retain(|e| e.end <= range.start || e.start >= range.end);
        list.len() != before
    }

    /// A new process `pid` forked by `ppid`: followed, with its parent's mappings, when
    /// the parent is (when every process is, with none if the parent's are not known).
    pub(super) fn fork(&mut self, pid: i32, ppid: i32) -> bool {
        let parent = self.lists.get(&ppid).cloned();
        let Some(parent) = parent.or_else(|| self.is_followed(pid).then(Vec::new)) else {
            return false;
        };
        self.lists.insert(pid, parent);
        true
    }

    /// Process `pid` ran a new program: its mappings are gone (the new ones follow).
    pub(super) fn exec(&mut self, pid: i32) -> bool {
        match self.list_mut(pid) {
            Some(list) => {
                list.clear();
                true
            }
            None => false,
        }
    }

    /// Process `pid` exited: no longer followed.
    pub(super) fn exit(&mut self, pid: i32) -> bool {
        self.lists.remove(&pid).is_some()
    }

    /// The processes that map `file`.
    pub(super) fn mapping(&self, file: usize) -> Vec<i32> {
        self.lists
            .iter()
            .filter(|(_, list)| list.iter().any(|e| e.file == file))
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// `pid`'s slot and mappings, when it has mappings to walk by; its slot is taken
    /// now if it had none (`None` when none is free), and given back when its list is
    /// empty or it is no longer followed.
    pub(super) fn slot_and_list(&mut self, pid: i32) -> Option<(u32, &[Entry])> {
        let list = self.lists.get(&pid).filter(|l| !l.is_empty());
        if list.is_none() {
            if let Some(slot) = self.slots.remove(&pid) {
                self.free_slots.push(slot);
            }
            return None;
        }
        let slot = match self.slots.get(&pid) {
            Some(&slot) => slot,
            None => {
                let slot = self.free_slots.pop()?;
                self.slots.insert(pid, slot);
                slot
            }
        };
        Some((slot, self.lists.get(&pid).map(Vec::as_slice)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u64, end: u64) -> Entry {
        Entry {
            start,
            end,
            bias: 0,
            file: 0,
        }
    }

    fn starts(f: &mut Followed, pid: i32) -> Vec<u64> {
        f.slot_and_list(pid)
            .map(|(_, l)| l.iter().map(|e| e.start).collect())
            .unwrap_or_default()
    }

    #[test]
    fn mappings_follow_forks_execs_and_exits() {
        let mut f = Followed::new(2);
        assert!(!f.map(7, entry(0x1000, 0x2000)), "7 is not followed");
        f.follow(1);
        assert!(f.map(1, entry(0x5000, 0x6000)));
        assert!(f.map(1, entry(0x1000, 0x2000)));
        assert!(f.map(1, entry(0x3000, 0x4000)));
        assert_eq!(starts(&mut f, 1), [0x1000, 0x3000, 0x5000]);
        // A mapping over others replaces what it overlaps, as mmap does.
        assert!(f.map(1, entry(0x1800, 0x3800)));
        assert_eq!(starts(&mut f, 1), [0x1800, 0x5000]);
        // One without rows (JIT code, a file without CFI) only takes their place.
        assert!(f.unmap(1, 0x1000..0x2000));
        assert!(!f.unmap(1, 0x1000..0x2000), "nothing left there");
        assert_eq!(starts(&mut f, 1), [0x5000]);
        assert!(f.map(1, entry(0x1800, 0x3800)));
        // A fork starts with its parent's mappings; an exec empties the list.
        assert!(f.fork(2, 1));
        assert_eq!(starts(&mut f, 2), [0x1800, 0x5000]);
        assert!(!f.fork(9, 8), "8 is not followed");
        assert!(f.exec(2));
        assert!(f.slot_and_list(2).is_none());
        assert!(f.map(2, entry(0x9000, 0xa000)));
        assert_eq!(starts(&mut f, 2), [0x9000]);
        // Two slots: a third process waits for one.
        assert!(f.fork(3, 1));
        assert!(f.slot_and_list(3).is_none(), "no slot free");
        assert!(f.exit(1));
        assert!(f.slot_and_list(1).is_none());
        let (slot, _) = f.slot_and_list(3).unwrap();
        let (other, _) = f.slot_and_list(2).unwrap();
        assert_ne!(slot, other);
        assert!(!f.exit(1), "already gone");
    }

    #[test]
    fn the_whole_machine_follows_every_process_but_one() {
        let mut f = Followed::new(4);
        f.follow_all_but(99);
        assert!(f.is_followed(7) && !f.is_followed(99));
        assert!(
            f.map(7, entry(0x1000, 0x2000)),
            "followed from its first mapping"
        );
        assert!(!f.map(99, entry(0x1000, 0x2000)), "sampler itself is not");
        assert!(f.slot_and_list(99).is_none());
        // A child of a process whose mappings are known starts with them; one of a
        // process never seen starts with none, and is followed from its own mappings.
        assert!(f.fork(8, 7));
        assert_eq!(starts(&mut f, 8), [0x1000]);
        assert!(f.fork(9, 5));
        assert!(f.slot_and_list(9).is_none());
        assert!(f.exec(10), "a process first seen at its exec");
        assert!(f.map(10, entry(0x3000, 0x4000)));
        assert_eq!(starts(&mut f, 10), [0x3000]);
    }

    #[test]
    fn a_list_holds_at_most_max_mappings() {
        let mut f = Followed::new(1);
        f.follow(1);
        for i in 0..MAX_MAPPINGS as u64 + 10 {
            f.map(1, entry(0x1000 * (i + 1), 0x1000 * (i + 1) + 0x800));
        }
        let list = starts(&mut f, 1);
        assert_eq!(list.len(), MAX_MAPPINGS);
        assert!(list.windows(2).all(|w| w[0] < w[1]));
    }
}
