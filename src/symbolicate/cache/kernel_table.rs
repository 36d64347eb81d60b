//! The kernel's table: the running kernel's own functions (their starts and names, as
//! `/proc/kallsyms` lists them), one file per boot, written by the first run of the boot
//! that names a kernel address, so that later runs read neither kallsyms nor anything
//! else of the kernel's. One flat, little-endian file. Its head (the header, the starts
//! and where each name ends: an eighth of it) is read and checked whole before use
//! (magic, version, length, checksum, the key, starts sorted, name ends in order and in
//! range), then looked up by binary search; the names (the rest) are read one at a time,
//! only those of the functions looked up, each checked as it is read (UTF-8, no longer
//! than a kernel symbol can be). A run that names a few dozen kernel addresses so reads
//! 1 MB of the 4 MB, and checks only that.

use std::os::unix::fs::FileExt as _;

use super::key::MAX_BUILD_ID;
use super::words::{check_header, checksum, u32_at, u64_at, CHECKSUM_AT};
use super::{Key, Refused};

// The layout. Every number is little-endian.
//
// header (HEADER_BYTES):
//   0 magic, 8 version u32, 12 count u32 (of functions), 16 length u64 (of the whole
//   table), 24 checksum u64 (of the head but this field: header, starts and ends), 32
//   the kernel's fingerprint u64 (its key's `size`), 40 text end u64, 48 build ID
//   length u32, 52 names' length u32, 56 build ID (MAX_BUILD_ID bytes, zero-padded).
// then:
//   starts (count u32): each function's start, relative to the kernel's text start,
//     strictly ascending, all below the text end.
//   ends (count u32): where each function's name ends in the names; it starts where
//     the one before ends (the first at 0).
//   names: the names' UTF-8 bytes, one after the other.

const MAGIC: [u8; 8] = *b"SMPLKTAB";
/// Raised whenever the layout or the meaning of a field changes: a table of another
/// version is ignored and written anew. Version 2: the checksum covers the head only.
const VERSION: u32 = 2;
const HEADER_BYTES: usize = 56 + MAX_BUILD_ID;
/// Up to this many lookups, a table read from its file reads each name found alone;
/// past it, all its names at once. A read of one name takes a system call (some 2 µs);
/// all 2.7 MB of names about 0.5 ms: a whole-machine recording names thousands of
/// kernel addresses, a command's a few dozen.
const NAMES_READ_ONE_BY_ONE: usize = 256;
/// The longest name read: a kernel symbol's name is at most 511 bytes (KSYM_NAME_LEN).
const MAX_NAME_BYTES: usize = 512;

/// The kernel's own functions, relative to its text start, as a run of this boot read
/// them: the head checked whole and held, the names read where needed.
pub struct KernelTable {
    /// The header, the starts and the ends.
    head: Vec<u8>,
    names: Names,
    count: usize,
    names_len: usize,
    text_end: u64,
}

/// Where a table's names are.
enum Names {
    /// Held, after the head: read whole for many lookups, or given whole (`parse`).
    Held(Vec<u8>),
    /// In the table's file, from this offset on.
    File(std::fs::File, u64),
}

/// What a lookup in the table says of an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InTable {
    /// In the function that starts at this (relative) address, of this name.
    Function(u64, String),
    /// Below the first function: no symbol names it.
    Below,
    /// At or past the text end: not the kernel's own code (a module's, a BPF program's),
    /// which the table does not hold.
    Outside,
    /// In a function whose name cannot be read (the file was cut short or damaged since
    /// it was checked): kallsyms names it instead.
    Unreadable,
}

/// A kernel table made a function at a time, in address order, as kallsyms is read: the
/// starts and name ends as words, the names in blocks of 256 KiB. Neither
/// the names nor the table is ever whole in one buffer, so that the kernel's 3 MB of
/// names are held once (a first run of a boot held them three times: as read, in the
/// table, and as the table grew).
#[derive(Debug, Default)]
pub struct TableBuilder {
    starts: Vec<u32>,
    /// Where each name ends in the names.
    ends: Vec<u32>,
    /// The names, one after the other, cut into blocks wherever a block is full.
    names: Vec<Vec<u8>>,
    /// Set once a function did not fit the layout: the table is then not made.
    unfit: bool,
}

/// Bytes of a block of names: 256 KiB, a twelfth of the kernel's names.
const NAME_BLOCK: usize = 1 << 18;

impl TableBuilder {
    /// Adds the function `name` that starts at `start` (relative to the kernel's text);
    /// the table is not made unless each start is above the one before, fits 32 bits,
    /// and each name is no longer than a kernel symbol's.
    pub fn push(&mut self, start: u64, name: &str) {
        if self.unfit {
            return;
        }
        let start = u32::try_from(start)
            .ok()
            .filter(|&s| self.starts.last().is_none_or(|&last| last < s));
        let end = u32::try_from(self.names_len() + name.len() as u64).ok();
        let (Some(start), Some(end), false) = (start, end, name.len() > MAX_NAME_BYTES) else {
            self.unfit = true;
            return;
        };
        self.starts.push(start);
        self.ends.push(end);
        let mut rest = name.as_bytes();
        while !rest.is_empty() {
            if self.names.last().is_none_or(|b| b.len() == NAME_BLOCK) {
                self.names.push(Vec::with_capacity(NAME_BLOCK));
            }
            let Some(block) = self.names.last_mut() else {
                return;
            };
            let (now, later) = rest.split_at(rest.len().min(NAME_BLOCK - block.len()));
            block.extend_from_slice(now);
            rest = later;
        }
    }

    /// The start of the last function added.
    pub fn last_start(&self) -> Option<u64> {
        self.starts.last().map(|&s| u64::from(s))
    }

    /// Takes the last function added back out.
    pub fn pop(&mut self) {
        let before = self.names_len();
        self.starts.pop();
        self.ends.pop();
        let mut extra = before - self.names_len();
        while extra > 0 {
            let Some(block) = self.names.last_mut() else {
                return;
            };
            let cut = (block.len() as u64).min(extra);
            block.truncate(block.len() - cut as usize);
            extra -= cut;
            if block.is_empty() {
                self.names.pop();
            }
        }
    }

    /// How many bytes the names take: where the last one ends.
    fn names_len(&self) -> u64 {
        self.ends.last().map_or(0, |&end| u64::from(end))
    }

    /// The table of the kernel of `key`, whose own text ends at `text_end`; `None` when
    /// a function did not fit (see [`TableBuilder::push`]), the last one starts at or
    /// past `text_end`, or the build ID is longer than the layout holds.
    pub fn finish(self, key: &Key, text_end: u64) -> Option<TableBytes> {
        let below_end = self.last_start().is_none_or(|last| last < text_end);
        if self.unfit || !below_end || key.build_id.len() > MAX_BUILD_ID {
            return None;
        }
        let count = self.starts.len();
        let names_len = u32::try_from(self.names_len()).ok()?;
        let mut head = vec![0u8; HEADER_BYTES + 8 * count];
        let (start_words, end_words) = head[HEADER_BYTES..].split_at_mut(4 * count);
        for (word, start) in start_words.chunks_exact_mut(4).zip(self.starts) {
            word.copy_from_slice(&start.to_le_bytes());
        }
        for (word, end) in end_words.chunks_exact_mut(4).zip(self.ends) {
            word.copy_from_slice(&end.to_le_bytes());
        }
        let len = head.len() as u64 + u64::from(names_len);
        head[..8].copy_from_slice(&MAGIC);
        head[8..12].copy_from_slice(&VERSION.to_le_bytes());
        head[12..16].copy_from_slice(&u32::try_from(count).ok()?.to_le_bytes());
        head[16..24].copy_from_slice(&len.to_le_bytes());
        head[32..40].copy_from_slice(&key.size.to_le_bytes());
        head[40..48].copy_from_slice(&text_end.to_le_bytes());
        head[48..52].copy_from_slice(&(key.build_id.len() as u32).to_le_bytes());
        head[52..56].copy_from_slice(&names_len.to_le_bytes());
        head[56..56 + key.build_id.len()].copy_from_slice(&key.build_id);
        let head = KernelTable::with_checksum(head);
        Some(TableBytes(
            std::iter::once(head).chain(self.names).collect(),
        ))
    }
}

/// A table's bytes as [`TableBuilder::finish`] makes them, in pieces to be written one
/// after the other: its head, then its names in blocks. Not joined, which would hold
/// the names twice.
#[derive(Debug)]
pub struct TableBytes(Vec<Vec<u8>>);

impl TableBytes {
    /// How many bytes the table takes.
    pub fn size(&self) -> u64 {
        self.0.iter().map(|p| p.len() as u64).sum()
    }

    /// The pieces, in order.
    pub fn into_pieces(self) -> Vec<Vec<u8>> {
        self.0
    }

    /// The table in one buffer.
    pub fn joined(self) -> Vec<u8> {
        self.0.concat()
    }
}

impl KernelTable {
    /// The bytes of the table of the kernel of `key`, whose own functions start at
    /// `starts` (relative, strictly ascending) with the names `names` (as many), and
    /// whose own text ends at `text_end`, joined: for tables made by hand, a test's or a
    /// fuzzer's. `None` as for [`TableBuilder::finish`], or when there are more or fewer
    /// names than starts.
    pub fn build<'n>(
        key: &Key,
        starts: impl Iterator<Item = u64>,
        mut names: impl Iterator<Item = &'n str>,
        text_end: u64,
    ) -> Option<Vec<u8>> {
        let mut table = TableBuilder::default();
        for start in starts {
            table.push(start, names.next()?);
        }
        if names.next().is_some() {
            return None;
        }
        Some(table.finish(key, text_end)?.joined())
    }

    /// `bytes` with the checksum of their head, as far as their header says where it
    /// ends (else as they are): for tables made by hand, a test's or a fuzzer's.
    pub fn with_checksum(mut bytes: Vec<u8>) -> Vec<u8> {
        let count = u32_at(&bytes, 12) as usize;
        let head = count
            .checked_mul(8)
            .and_then(|starts| starts.checked_add(HEADER_BYTES))
            .filter(|&head| head <= bytes.len());
        if let Some(head) = head {
            let sum = checksum(&bytes[..head]);
            bytes[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
        }
        bytes
    }

    /// Checks `bytes` as the table of the kernel of `key`, names and all.
    pub fn parse(mut bytes: Vec<u8>, key: &Key) -> Result<KernelTable, Refused> {
        let head_len = head_len(&bytes, bytes.len() as u64)?;
        let names = bytes.split_off(head_len);
        let table = KernelTable::of_head(bytes, key)?;
        if names.len() != table.names_len {
            return Err("tables out of range");
        }
        let text = std::str::from_utf8(&names).map_err(|_| "names not UTF-8")?;
        if (0..table.count).any(|i| !text.is_char_boundary(table.end(i))) {
            return Err("name out of range");
        }
        Ok(KernelTable {
            names: Names::Held(names),
            ..table
        })
    }

    /// Reads and checks the head of the table in `file` (`len` bytes long) as the table
    /// of the kernel of `key`; its names are read from the file as lookups need them, or,
    /// for `lookups` of more than `NAMES_READ_ONE_BY_ONE` (256), at once.
    pub fn open(
        file: std::fs::File,
        len: u64,
        key: &Key,
        lookups: usize,
    ) -> Result<KernelTable, Refused> {
        let mut header = vec![0u8; HEADER_BYTES];
        file.read_exact_at(&mut header, 0)
            .map_err(|_| "shorter than its header")?;
        let head_len = head_len(&header, len)?;
        let mut head = header;
        head.resize(head_len, 0);
        file.read_exact_at(&mut head[HEADER_BYTES..], HEADER_BYTES as u64)
            .map_err(|_| "tables out of range")?;
        let table = KernelTable::of_head(head, key)?;
        let names = if lookups <= NAMES_READ_ONE_BY_ONE {
            Names::File(file, head_len as u64)
        } else {
            let mut names = vec![0u8; table.names_len];
            file.read_exact_at(&mut names, head_len as u64)
                .map_err(|_| "tables out of range")?;
            Names::Held(names)
        };
        Ok(KernelTable { names, ..table })
    }

    /// Checks `head` (the header, starts and ends of a table) as the head of the table of
    /// the kernel of `key`; the table has no names yet, which the caller gives it.
    fn of_head(head: Vec<u8>, key: &Key) -> Result<KernelTable, Refused> {
        if u64_at(&head, CHECKSUM_AT) != checksum(&head) {
            return Err("bad checksum");
        }
        let id_len = u32_at(&head, 48) as usize;
        if u64_at(&head, 32) != key.size
            || id_len != key.build_id.len()
            || head[56..56 + id_len.min(MAX_BUILD_ID)] != key.build_id[..]
        {
            return Err("another kernel's");
        }
        if head[56 + id_len..HEADER_BYTES].iter().any(|&b| b != 0) {
            return Err("padding not zero");
        }
        let table = KernelTable {
            count: u32_at(&head, 12) as usize,
            names_len: u32_at(&head, 52) as usize,
            text_end: u64_at(&head, 40),
            head,
            names: Names::Held(Vec::new()),
        };
        table.check()?;
        Ok(table)
    }

    /// Starts ascending and below the text end, name ends in order, in range, and none
    /// longer than a kernel symbol's.
    fn check(&self) -> Result<(), Refused> {
        let mut before = None;
        for i in 0..self.count {
            let start = self.start(i);
            if before.is_some_and(|b| b >= start) || start >= self.text_end {
                return Err("starts out of order");
            }
            before = Some(start);
        }
        let mut at = 0;
        for i in 0..self.count {
            let end = self.end(i);
            if end < at || end > self.names_len || end - at > MAX_NAME_BYTES {
                return Err("name out of range");
            }
            at = end;
        }
        Ok(())
    }

    fn start(&self, i: usize) -> u64 {
        u64::from(u32_at(&self.head, HEADER_BYTES + 4 * i))
    }

    fn end(&self, i: usize) -> usize {
        u32_at(&self.head, HEADER_BYTES + 4 * (self.count + i)) as usize
    }

    /// The name of function `i`, when it can be read and is UTF-8 (its range was
    /// checked with the head).
    fn name(&self, i: usize) -> Option<String> {
        let from = if i == 0 { 0 } else { self.end(i - 1) };
        let range = from..self.end(i);
        let bytes = match &self.names {
            Names::Held(names) => names.get(range)?.to_vec(),
            Names::File(file, at) => {
                let mut bytes = vec![0u8; range.len()];
                file.read_exact_at(&mut bytes, at + range.start as u64)
                    .ok()?;
                bytes
            }
        };
        String::from_utf8(bytes).ok()
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
    pub fn lookup(&self, address: u64) -> InTable {
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
            Some(i) => match self.name(i) {
                Some(name) => InTable::Function(self.start(i), name),
                None => InTable::Unreadable,
            },
            None => InTable::Below,
        }
    }
}

/// How long the head of the table whose header is at the start of `bytes` is, the whole
/// table being `len` bytes long: checked against the header's magic, version, length,
/// count and names' length.
fn head_len(bytes: &[u8], len: u64) -> Result<usize, Refused> {
    check_header(bytes, HEADER_BYTES, &MAGIC, VERSION, len)?;
    let count = u32_at(bytes, 12) as u64;
    let names_len = u32_at(bytes, 52) as u64;
    let head_len = HEADER_BYTES as u64 + 8 * count;
    if head_len + names_len != len {
        return Err("tables out of range");
    }
    usize::try_from(head_len).map_err(|_| "tables out of range")
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
        let bytes = KernelTable::build(&key(), starts.iter().copied(), names.into_iter(), 0x2_0000)
            .unwrap();
        let table = KernelTable::parse(bytes.clone(), &key()).unwrap();
        let function = |start, name: &str| InTable::Function(start, name.to_string());
        assert_eq!(table.len(), 3);
        assert_eq!(table.lookup(0x8), InTable::Below);
        assert_eq!(table.lookup(0x10), function(0x10, "first"));
        assert_eq!(table.lookup(0x3f), function(0x10, "first"));
        assert_eq!(table.lookup(0x40), function(0x40, "sécond"));
        assert_eq!(table.lookup(0x1_ffff), function(0x1_0000, "third"));
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
        // Any byte of the head changed, and any length cut off, is refused.
        let head = bytes.len() - names.concat().len();
        for at in 0..head {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x20;
            assert!(KernelTable::parse(damaged, &key()).is_err(), "byte {at}");
        }
        for len in 0..bytes.len() {
            assert!(KernelTable::parse(bytes[..len].to_vec(), &key()).is_err());
        }
        // Unsorted starts, a start past the text end, names missing or longer than a
        // kernel symbol's: nothing built.
        let build = |starts: &[u64], end| {
            KernelTable::build(&key(), starts.iter().copied(), names.into_iter(), end)
        };
        assert!(build(&[0x40, 0x10, 0x50], 0x100).is_none());
        assert!(build(&[0x10, 0x40, 0x100], 0x100).is_none());
        assert!(build(&[0x10, 0x40, 0x50, 0x60], 0x100).is_none());
        assert!(build(&[0x10, 0x1_0000_0000], u64::MAX).is_none());
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert!(KernelTable::build(
            &key(),
            [0x10].into_iter(),
            [long.as_str()].into_iter(),
            0x100
        )
        .is_none());
    }

    #[test]
    fn a_table_made_a_function_at_a_time_keeps_names_across_blocks_and_takes_one_back() {
        let name = |i: u64| format!("function_{i:06}_{}", "x".repeat(i as usize % 300));
        let starts = (0..20_000u64).map(|i| 0x10 + 0x20 * i);
        let names: Vec<String> = starts.clone().map(|s| name(s / 0x20)).collect();
        let mut made = TableBuilder::default();
        for (start, name) in starts.clone().zip(&names) {
            made.push(start, name);
        }
        assert!(made.names.len() > 10, "{} blocks", made.names.len());
        let end = 0x10_0000;
        let bytes = made.finish(&key(), end).unwrap().joined();
        let by_hand = KernelTable::build(
            &key(),
            starts.clone(),
            names.iter().map(|n| n.as_str()),
            end,
        );
        assert_eq!(Some(&bytes), by_hand.as_ref());
        let table = KernelTable::parse(bytes, &key()).unwrap();
        assert_eq!(table.len(), names.len());
        for (start, name) in starts.zip(&names) {
            assert_eq!(
                table.lookup(start + 0x1f),
                InTable::Function(start, name.clone())
            );
        }
        // Taken back: a function whose name crossed into a second block.
        let long = "z".repeat(500);
        let (mut one, mut other) = (TableBuilder::default(), TableBuilder::default());
        for i in 0..(NAME_BLOCK / 500) as u64 {
            one.push(i * 0x10, &long);
            other.push(i * 0x10, &long);
        }
        one.push(0x10_0000, &long);
        assert_eq!(one.names.len(), 2);
        one.pop();
        let joined = |made: TableBuilder| made.finish(&key(), 0x20_0000).unwrap().joined();
        assert_eq!(joined(one), joined(other));
        // A start not above the one before: nothing made.
        let mut made = TableBuilder::default();
        made.push(0x40, "a");
        made.push(0x40, "b");
        assert!(made.finish(&key(), 0x100).is_none());
    }

    /// The table of two functions, at 0x10 and 0x40, of these names.
    fn two_functions(names: [&str; 2]) -> Vec<u8> {
        KernelTable::build(&key(), [0x10, 0x40].into_iter(), names.into_iter(), 0x100).unwrap()
    }

    /// Read from its file, a table reads its head and checks it whole, and reads each
    /// name only when a lookup lands in its function: a name damaged on disk later is
    /// `Unreadable` (kallsyms names the address), the others still answer.
    #[test]
    fn a_table_in_a_file_reads_the_names_it_is_asked_for() {
        use std::io::Write as _;
        let scratch = crate::files::testdir::TestDir::new("kernel-table-file");
        let bytes = two_functions(["first", "é"]);
        let path = scratch.join("table");
        let open = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            let file = std::fs::File::open(&path).unwrap();
            KernelTable::open(file, bytes.len() as u64, &key(), 1)
        };
        let table = open(&bytes).unwrap();
        assert_eq!(table.lookup(0x41), InTable::Function(0x40, "é".into()));
        let mut damaged = bytes.clone();
        damaged[HEADER_BYTES] ^= 1;
        assert_eq!(open(&damaged).err(), Some("bad checksum"));
        assert_eq!(
            KernelTable::open(std::fs::File::open(&path).unwrap(), 5, &key(), 1).err(),
            Some("length differs")
        );
        // The last name's bytes overwritten with a byte that is not UTF-8, after the open.
        let table = open(&bytes).unwrap();
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        use std::io::Seek as _;
        file.seek(std::io::SeekFrom::Start(bytes.len() as u64 - 1))
            .unwrap();
        file.write_all(&[0xff]).unwrap();
        assert_eq!(table.lookup(0x40), InTable::Unreadable);
        assert_eq!(table.lookup(0x10), InTable::Function(0x10, "first".into()));
        // Cut short after the open: the names past the end cannot be read.
        file.set_len(bytes.len() as u64 - 2).unwrap();
        assert_eq!(table.lookup(0x40), InTable::Unreadable);
        // For many lookups, every name is read with the head: what the file says later
        // changes nothing.
        std::fs::write(&path, &bytes).unwrap();
        let many = NAMES_READ_ONE_BY_ONE + 1;
        let table = KernelTable::open(
            std::fs::File::open(&path).unwrap(),
            bytes.len() as u64,
            &key(),
            many,
        )
        .unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        assert_eq!(table.lookup(0x41), InTable::Function(0x40, "é".into()));
    }

    #[test]
    fn a_table_whose_checksum_is_right_is_still_checked_whole() {
        let bytes = two_functions(["a", "é"]);
        let resum = KernelTable::with_checksum;
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
