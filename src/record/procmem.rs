//! Reading the memory of live processes through `/proc/PID/mem` and `/proc/PID/maps`,
//! for the unwinder: the code of JIT mappings (which exists in no file) and the bottom of
//! a thread's stack (beyond what a sample copies). Reading needs the same right as
//! ptrace: root, or the recorded command being sampler's child. Where it is refused, the
//! unwinder does without.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use crate::events::ProcessMemory;

/// The memory of the processes being recorded, each `/proc/PID/mem` opened once.
#[derive(Default)]
pub struct LiveMemory {
    /// `None`: it could not be opened (gone, or not allowed); not tried again.
    files: HashMap<i32, Option<File>>,
}

impl ProcessMemory for LiveMemory {
    fn read(&mut self, pid: i32, address: u64, buf: &mut [u8]) -> bool {
        let file = self
            .files
            .entry(pid)
            .or_insert_with(|| File::open(format!("/proc/{pid}/mem")).ok());
        match file {
            Some(f) => f.read_exact_at(buf, address).is_ok(),
            None => false,
        }
    }

    fn mapping_containing(&mut self, pid: i32, address: u64) -> Option<Range<u64>> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        maps.lines().find_map(|line| {
            let (start, end) = line.split_whitespace().next()?.split_once('-')?;
            let range = u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?;
            range.contains(&address).then_some(range)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_stack_mapping() {
        let value: u64 = 0x1234_5678_9abc_def0;
        let address = &value as *const u64 as u64;
        let pid = std::process::id() as i32;
        let mut memory = LiveMemory::default();
        let mut buf = [0u8; 8];
        assert!(memory.read(pid, address, &mut buf));
        assert_eq!(u64::from_le_bytes(buf), value);
        let stack = memory.mapping_containing(pid, address).unwrap();
        assert!(stack.contains(&address));
        assert!(!memory.read(pid, 0, &mut buf), "page 0 is not mapped");
    }
}
