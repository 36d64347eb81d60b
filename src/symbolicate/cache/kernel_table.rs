//! The kernel's table: the running kernel's own functions (their starts and names, as
//! `/proc/kallsyms` lists them), one file per boot, written by the first run of the boot
//! that names a kernel address, so that later runs read neither kallsyms nor anything
//! else of the kernel's. One flat, little-endian buffer, checked whole before use
//! (magic, version, length, checksum, the key, starts sorted, every name in range and
//! UTF-8), then looked up in place by binary search.

use super::key::MAX_BUILD_ID;
use super::words::{check_frame, u32_at, u64_at};
use super::{with_checksum, Key, Refused};

// The layout. Every number is little-endian.
//
// header (HEADER_BYTES):
//   0 magic, 8 version u32, 12 count u32 (of functions), 16 length u64 (of the whole
//   table), 24 checksum u64 (of everything else), 32 the kernel's fingerprint u64 (its
//   key's `size`), 40 text end u64, 48 build ID length u32, 52 names' length u32,
//   56 build ID (MAX_BUILD_ID bytes, zero-padded).
// then:
//   starts (count u32): each function's start, relative to the kernel's text start,
//     strictly ascending, all below the text end.
//   ends (count u32): where each function's name ends in the names; it starts where
//     the one before ends (the first at 0).
//   names: the names' UTF-8 bytes, one after the other.

const MAGIC: [u8; 8] = *b"SMPLKTAB";
/// Raised whenever the layout or the meaning of a field changes: a table of another
/// version is ignored and written anew.
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 56 + MAX_BUILD_ID;

/// The kernel's own functions, relative to its text start, as a run of this boot read
/// them: checked whole, looked up in place.
pub struct KernelTable {
    bytes: Vec<u8>,
    count: usize,
    text_end: u64,
}

/// What a lookup in the table says of an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InTable<'t> {
    /// In the function that starts at this (relative) address, of this name.
    Function(u64, &'t str),
    /// Below the first function: no symbol names it.
    Below,
    /// At or past the text end: not the kernel's own code (a module's, a BPF program's),
    /// which the table does not hold.
    Outside,
}

impl KernelTable {
    /// The bytes of the table of the kernel of `key`, whose own functions start at
    /// `starts` (relative, strictly ascending) with the names `names` (as many), and
    /// whose own text ends at `text_end`; `None` when they do not fit the layout (more
    /// than 4 GiB of names or text).
    pub fn build<'n>(
        key: &Key,
        starts: &[u64],
        names: impl Iterator<Item = &'n str> + Clone,
        text_end: u64,
    ) -> Option<Vec<u8>> {
        let count = u32::try_from(starts.len()).ok()?;
        let (named, names_len) = names
            .clone()
            .fold((0, 0), |(n, len), name| (n + 1, len + name.len()));
        if named != starts.len()
            || key.build_id.len() > MAX_BUILD_ID
            || starts.windows(2).any(|w| w[0] >= w[1])
            || starts.last().is_some_and(|&last| last >= text_end)
        {
            return None;
        }
        let names_len = u32::try_from(names_len).ok()?;
        // Sized at once: 120,000 functions would otherwise grow it a few bytes at a time.
        let mut bytes = vec![0u8; HEADER_BYTES + 8 * starts.len()];
        bytes.reserve_exact(names_len as usize);
        let (start_words, end_words) = bytes[HEADER_BYTES..].split_at_mut(4 * starts.len());
        for (word, &start) in start_words.chunks_exact_mut(4).zip(starts) {
            word.copy_from_slice(&u32::try_from(start).ok()?.to_le_bytes());
        }
        let mut end = 0u32;
        for (word, name) in end_words.chunks_exact_mut(4).zip(names.clone()) {
            end += name.len() as u32;
            word.copy_from_slice(&end.to_le_bytes());
        }
        for name in names {
            bytes.extend_from_slice(name.as_bytes());
        }
        let len = bytes.len() as u64;
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[8..12].copy_from_slice(&VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&count.to_le_bytes());
        bytes[16..24].copy_from_slice(&len.to_le_bytes());
        bytes[32..40].copy_from_slice(&key.size.to_le_bytes());
        bytes[40..48].copy_from_slice(&text_end.to_le_bytes());
        bytes[48..52].copy_from_slice(&(key.build_id.len() as u32).to_le_bytes());
        bytes[52..56].copy_from_slice(&names_len.to_le_bytes());
        bytes[56..56 + key.build_id.len()].copy_from_slice(&key.build_id);
        Some(with_checksum(bytes))
    }

    /// Checks `bytes` as the table of the kernel of `key`.
    pub fn parse(bytes: Vec<u8>, key: &Key) -> Result<KernelTable, Refused> {
        check_frame(&bytes, HEADER_BYTES, &MAGIC, VERSION)?;
        let id_len = u32_at(&bytes, 48) as usize;
        if u64_at(&bytes, 32) != key.size
            || id_len != key.build_id.len()
            || bytes[56..56 + id_len.min(MAX_BUILD_ID)] != key.build_id[..]
        {
            return Err("another kernel's");
        }
        if bytes[56 + id_len..HEADER_BYTES].iter().any(|&b| b != 0) {
            return Err("padding not zero");
        }
        let count = u32_at(&bytes, 12) as usize;
        let names_len = u32_at(&bytes, 52) as usize;
        if HEADER_BYTES + 8 * count + names_len != bytes.len() {
            return Err("tables out of range");
        }
        let table = KernelTable {
            text_end: u64_at(&bytes, 40),
            bytes,
            count,
        };
        table.check(names_len)?;
        Ok(table)
    }

    /// Starts ascending and below the text end, names in order, in range, UTF-8.
    fn check(&self, names_len: usize) -> Result<(), Refused> {
        let mut before = None;
        for i in 0..self.count {
            let start = self.start(i);
            if before.is_some_and(|b| b >= start) || start >= self.text_end {
                return Err("starts out of order");
            }
            before = Some(start);
        }
        let names = &self.bytes[self.bytes.len() - names_len..];
        let names = std::str::from_utf8(names).map_err(|_| "names not UTF-8")?;
        let mut at = 0;
        for i in 0..self.count {
            let end = self.end(i);
            if end < at || end > names.len() || !names.is_char_boundary(end) {
                return Err("name out of range");
            }
            at = end;
        }
        Ok(())
    }

    fn start(&self, i: usize) -> u64 {
        u64::from(u32_at(&self.bytes, HEADER_BYTES + 4 * i))
    }

    fn end(&self, i: usize) -> usize {
        u32_at(&self.bytes, HEADER_BYTES + 4 * (self.count + i)) as usize
    }

    /// The name of function `i` (checked: in range and UTF-8).
    fn name(&self, i: usize) -> &str {
        let names = &self.bytes[HEADER_BYTES + 8 * self.count..];
        let from = if i == 0 { 0 } else { self.end(i - 1) };
        std::str::from_utf8(&names[from..self.end(i)]).unwrap_or_default()
    }

    /// How many functions it holds.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// What the table says of the kernel-relative `address`: the function with the
    /// highest start at or below it, as a lookup in kallsyms gives, when it lies in the
    /// kernel's own text.
    pub fn lookup(&self, address: u64) -> InTable<'_> {
        if address >= self.text_end {
            return InTable::Outside;
        }
        let (mut low, mut high) = (0, self.count);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.start(mid) <= address {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        match low.checked_sub(1) {
            Some(i) => InTable::Function(self.start(i), self.name(i)),
            None => InTable::Below,
        }
    }
}

/// Kernel tables are named `kernel-` and their key's name ([`Key::file_name`]: the build
/// ID, and the keyed fingerprint of the boot and text start), apart from files' entries.
pub(super) const PREFIX: &str = "kernel-";

/// How many kernel tables the cache keeps: 3, the running boot's and the two used last
/// before it. Each is some 4 MB (120,000 functions), and a boot's table serves no other
/// boot; a few are kept for caches that several machines share (a home on the network),
/// whose runs would otherwise remove each other's. Ten boots' worth stay at some 12 MB.
pub(super) const KEPT: usize = 3;

/// The name of the kernel table of `key`.
pub(super) fn file_name(key: &Key) -> String {
    format!("{PREFIX}{}", key.file_name())
}

/// After the table `written` (its file name) has been written into `dir`: removes the
/// kernel tables beyond the [`KEPT`] used last (the one written counts as the latest),
/// and the entries an older sampler kept of this kernel, one per 64 KiB of its text
/// (hundreds), whose names start with `legacy` (its build ID in hex and `-`: no other
/// file has the kernel's build ID). Returns how many were removed.
pub(super) fn evict_other_tables(dir: &std::os::fd::OwnedFd, written: &str, legacy: &str) -> usize {
    use crate::files::usercache;
    let mut tables: Vec<(i64, i64, std::ffi::OsString)> = Vec::new();
    let mut removed = 0;
    for name in usercache::names_in(dir) {
        let text = name.to_string_lossy();
        if text == written {
            continue;
        }
        let Some(stat) = usercache::regular_file_at(dir, &name) else {
            continue;
        };
        if text.starts_with(PREFIX) {
            tables.push((stat.st_mtime, stat.st_mtime_nsec, name));
        } else if text.starts_with(legacy) && usercache::remove_file(dir, &name).is_ok() {
            removed += 1;
        }
    }
    tables.sort_unstable_by(|a, b| b.cmp(a));
    for (_, _, name) in tables.iter().skip(KEPT - 1) {
        if usercache::remove_file(dir, name).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key {
            build_id: vec![0xab; 20],
            size: 0x5eed,
            stamp: Default::default(),
        }
    }

    #[test]
    fn a_table_answers_as_its_functions_say_and_refuses_damage() {
        let starts = [0x10, 0x40, 0x1_0000];
        let names = ["first", "sécond", "third"];
        let bytes = KernelTable::build(&key(), &starts, names.into_iter(), 0x2_0000).unwrap();
        let table = KernelTable::parse(bytes.clone(), &key()).unwrap();
        assert_eq!(table.len(), 3);
        assert_eq!(table.lookup(0x8), InTable::Below);
        assert_eq!(table.lookup(0x10), InTable::Function(0x10, "first"));
        assert_eq!(table.lookup(0x3f), InTable::Function(0x10, "first"));
        assert_eq!(table.lookup(0x40), InTable::Function(0x40, "sécond"));
        assert_eq!(table.lookup(0x1_ffff), InTable::Function(0x1_0000, "third"));
        assert_eq!(table.lookup(0x2_0000), InTable::Outside);
        assert_eq!(table.lookup(u64::MAX), InTable::Outside);

        let other = Key {
            size: 0x5eee,
            ..key()
        };
        assert_eq!(
            KernelTable::parse(bytes.clone(), &other).err(),
            Some("another kernel's")
        );
        // Any byte changed, and any length cut off, is refused.
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x20;
            assert!(KernelTable::parse(damaged, &key()).is_err(), "byte {at}");
        }
        for len in 0..bytes.len() {
            assert!(KernelTable::parse(bytes[..len].to_vec(), &key()).is_err());
        }
        // Unsorted starts, a start past the text end, or names missing: nothing built.
        let build =
            |starts: &[u64], end| KernelTable::build(&key(), starts, names.into_iter(), end);
        assert!(build(&[0x40, 0x10, 0x50], 0x100).is_none());
        assert!(build(&[0x10, 0x40, 0x100], 0x100).is_none());
        assert!(build(&[0x10, 0x40, 0x50, 0x60], 0x100).is_none());
        assert!(build(&[0x10, 0x1_0000_0000], u64::MAX).is_none());
    }

    #[test]
    fn a_table_whose_checksum_is_right_is_still_checked_whole() {
        let bytes =
            KernelTable::build(&key(), &[0x10, 0x40], ["a", "é"].into_iter(), 0x100).unwrap();
        let resum = with_checksum;
        let names_at = bytes.len() - 3;
        let ends_at = names_at - 8;
        let mut swapped = bytes.clone();
        swapped[HEADER_BYTES] = 0x50;
        assert_eq!(
            KernelTable::parse(resum(swapped), &key()).err(),
            Some("starts out of order")
        );
        let mut split = bytes.clone();
        split[ends_at] = 2;
        assert_eq!(
            KernelTable::parse(resum(split), &key()).err(),
            Some("name out of range")
        );
        let mut not_utf8 = bytes.clone();
        not_utf8[names_at + 1] = 0xff;
        assert_eq!(
            KernelTable::parse(resum(not_utf8), &key()).err(),
            Some("names not UTF-8")
        );
        let mut past = bytes.clone();
        past[40..48].copy_from_slice(&0x40u64.to_le_bytes());
        assert_eq!(
            KernelTable::parse(resum(past), &key()).err(),
            Some("starts out of order")
        );
        assert!(KernelTable::parse(resum(bytes), &key()).is_ok());
    }

    #[test]
    fn other_boots_tables_go_beyond_the_last_few_and_older_pieces_of_this_kernel() {
        use crate::files::usercache;
        use std::time::{Duration, SystemTime};
        let scratch = crate::files::testdir::TestDir::new("kernel-tables");
        let dir = usercache::open_dir(
            scratch.path(),
            &["d"],
            None,
            true,
            usercache::Access::Private,
        )
        .unwrap();
        let long_ago = SystemTime::now() - Duration::from_secs(86_400);
        let tables = ["kernel-aa-1", "kernel-aa-2", "kernel-bb-3", "kernel-aa-4"];
        let others = ["abab-1", "abab-ff", "cdcd-1", "kernelish"];
        for (i, name) in tables.iter().chain(&others).enumerate() {
            let path = scratch.join("d").join(name);
            std::fs::write(&path, b"x").unwrap();
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(long_ago + Duration::from_secs(i as u64))
                .unwrap();
        }
        std::fs::write(scratch.join("d").join("kernel-new"), b"x").unwrap();
        assert_eq!(evict_other_tables(&dir, "kernel-new", "abab-"), 4);
        let mut left: Vec<String> = std::fs::read_dir(scratch.join("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        // The written one and the two used last before it; no piece of this kernel; the
        // rest as they were.
        assert_eq!(
            left,
            [
                "cdcd-1",
                "kernel-aa-4",
                "kernel-bb-3",
                "kernel-new",
                "kernelish"
            ]
        );
    }
}
