//! The entry's format: one flat, little-endian buffer, its layout, its checksum, and
//! [`Entry`], a buffer checked whole (every offset and index in range, intervals sorted,
//! names UTF-8) and then read in place.

use std::ops::Range;
use std::path::PathBuf;

use super::key::MAX_BUILD_ID;
use super::words::{check_frame, checksum, u32_at, u64_at, CHECKSUM_AT};
use super::{DebugSource, Identity, Key, Stamp};
use crate::symbolicate::{AddressInfo, LibFacts, SourceFrame, Symbol};

// The layout of an entry. Every number is little-endian; every table starts at a
// multiple of 8 bytes, so the buffer can be used in place.
//
// header (HEADER_BYTES):
//   0 magic, 8 version u32, 12 flags u32, 16 length u64 (of the whole entry),
//   24 checksum u64 (of everything else), 32 file size u64, 40 debug file identity
//   (dev, ino, size u64, mtime i64, mtime_nsec u32), 76 build ID length u32,
//   80 build ID (MAX_BUILD_ID bytes, zero-padded), 144 the tables' (offset u64,
//   count u64) in TABLES order, 240 debug file path (string index), 244 why there is
//   no debug information (string index), 248..256 zero, 256 the file's stamp (dev u64,
//   ino u64, mtime i64, ctime i64, mtime_nsec u32, ctime_nsec u32), 296..304 zero.
// tables:
//   intervals (24 bytes): start u64, end u64, info u32, zero u32; sorted, disjoint.
//   infos (16): symbol u32, first frame u32, frame count u32, flags u32.
//   frames (32): function, linkage name, file (string indexes), line u32, flags u32,
//     zero u32, frame symbol u64.
//   symbols (24): address u64, size u64, name (string index), flags u32.
//   strings (8): offset u32 and length u32 in the text.
//   text (1): the strings' UTF-8 bytes.

pub(super) const MAGIC: [u8; 8] = *b"SMPLSYM\0";
/// Raised whenever the layout or the meaning of a field changes: an entry of another
/// version is ignored and rebuilt.
pub(super) const VERSION: u32 = 2;
pub(super) const HEADER_BYTES: usize = 304;
pub(super) const STAMP_AT: usize = 256;
pub(super) const TABLES_AT: usize = 144;
pub(super) const STRINGS_AT: usize = 240;

/// The tables, in the header's order, with the size of their records.
pub(super) const INTERVALS: usize = 0;
pub(super) const INFOS: usize = 1;
pub(super) const FRAMES: usize = 2;
pub(super) const SYMBOLS: usize = 3;
pub(super) const STRINGS: usize = 4;
pub(super) const TEXT: usize = 5;
pub(super) const RECORD_BYTES: [usize; 6] = [24, 16, 32, 24, 8, 1];

/// An absent string or symbol.
pub(super) const NONE: u32 = u32::MAX;

// Header flags.
pub(super) const SYMBOLS_EMPTY: u32 = 1;
pub(super) const SOURCE_SHIFT: u32 = 1;
pub(super) const SOURCE_MASK: u32 = 3 << SOURCE_SHIFT;
pub(super) const HEADER_FLAGS: u32 = SYMBOLS_EMPTY | SOURCE_MASK;
// Info flags.
pub(super) const UNNAMED: u32 = 1;
// Frame flags.
pub(super) const HAS_LINE: u32 = 1;
pub(super) const HAS_FRAME_SYMBOL: u32 = 2;
// Symbol flags.
pub(super) const HAS_SIZE: u32 = 1;

/// `bytes` with the checksum their other fields would need: for tests and fuzzing, so
/// that damage reaches the checks behind the checksum.
pub fn with_checksum(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.len() >= CHECKSUM_AT + 8 {
        let sum = checksum(&bytes);
        bytes[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
    }
    bytes
}

/// A file's stamp as the header holds it.
pub(super) fn stamp_bytes(stamp: &Stamp) -> [u8; 40] {
    let mut out = [0u8; 40];
    out[..8].copy_from_slice(&stamp.dev.to_le_bytes());
    out[8..16].copy_from_slice(&stamp.ino.to_le_bytes());
    out[16..24].copy_from_slice(&stamp.mtime.to_le_bytes());
    out[24..32].copy_from_slice(&stamp.ctime.to_le_bytes());
    out[32..36].copy_from_slice(&stamp.mtime_nsec.to_le_bytes());
    out[36..40].copy_from_slice(&stamp.ctime_nsec.to_le_bytes());
    out
}

/// Why an entry was refused (for tests; a refused entry is simply rebuilt).
pub type Refused = &'static str;

/// A checked entry: a buffer whose every offset and index has been found in range, read
/// in place.
pub struct Entry {
    pub(super) bytes: Vec<u8>,
    /// Each table's offset and record count.
    pub(super) tables: [(usize, usize); 6],
}

impl Entry {
    /// Checks `bytes` as the entry of `key`.
    pub fn parse(bytes: Vec<u8>, key: &Key) -> Result<Entry, Refused> {
        check_frame(&bytes, HEADER_BYTES, &MAGIC, VERSION)?;
        let flags = u32_at(&bytes, 12);
        if flags & !HEADER_FLAGS != 0 || (flags & SOURCE_MASK) >> SOURCE_SHIFT > 2 {
            return Err("unknown flags");
        }
        let id_len = u32_at(&bytes, 76) as usize;
        if u64_at(&bytes, 32) != key.size
            || stamp_bytes(&key.stamp)[..] != bytes[STAMP_AT..STAMP_AT + 40]
            || id_len != key.build_id.len()
            || bytes[80..80 + id_len.min(MAX_BUILD_ID)] != key.build_id[..]
        {
            return Err("another file's");
        }
        if bytes[80 + id_len..TABLES_AT].iter().any(|&b| b != 0)
            || bytes[248..STAMP_AT].iter().any(|&b| b != 0)
            || bytes[STAMP_AT + 40..HEADER_BYTES].iter().any(|&b| b != 0)
        {
            return Err("padding not zero");
        }
        let mut tables = [(0, 0); 6];
        for (t, table) in tables.iter_mut().enumerate() {
            let offset = u64_at(&bytes, TABLES_AT + 16 * t);
            let count = u64_at(&bytes, TABLES_AT + 16 * t + 8);
            let end = count
                .checked_mul(RECORD_BYTES[t] as u64)
                .and_then(|n| n.checked_add(offset));
            if !offset.is_multiple_of(8)
                || offset < HEADER_BYTES as u64
                || count > u64::from(NONE)
                || end.is_none_or(|end| end > bytes.len() as u64)
            {
                return Err("table out of range");
            }
            *table = (offset as usize, count as usize);
        }
        let entry = Entry { bytes, tables };
        entry.check()?;
        Ok(entry)
    }

    /// The byte offset of record `i` of table `t`.
    pub(super) fn record(&self, t: usize, i: usize) -> usize {
        self.tables[t].0 + i * RECORD_BYTES[t]
    }

    pub(super) fn count(&self, t: usize) -> usize {
        self.tables[t].1
    }

    pub(super) fn u32(&self, at: usize) -> u32 {
        u32_at(&self.bytes, at)
    }

    pub(super) fn u64(&self, at: usize) -> u64 {
        u64_at(&self.bytes, at)
    }

    /// Every record's references in range, and the intervals sorted and disjoint.
    fn check(&self) -> Result<(), Refused> {
        let text = self.tables[TEXT];
        let text = &self.bytes[text.0..text.0 + text.1];
        for i in 0..self.count(STRINGS) {
            let at = self.record(STRINGS, i);
            let (offset, len) = (self.u32(at) as usize, self.u32(at + 4) as usize);
            let s = text
                .get(offset..offset + len)
                .ok_or("string out of range")?;
            std::str::from_utf8(s).map_err(|_| "string not UTF-8")?;
        }
        let strings = self.count(STRINGS);
        let string =
            |index: u32, optional: bool| (index as usize) < strings || (optional && index == NONE);
        if !string(self.u32(STRINGS_AT), true) || !string(self.u32(STRINGS_AT + 4), true) {
            return Err("string index out of range");
        }
        if (self.u32(12) & SOURCE_MASK) >> SOURCE_SHIFT == 1 && self.u32(STRINGS_AT) == NONE {
            return Err("a debug file without a path");
        }
        for i in 0..self.count(SYMBOLS) {
            let at = self.record(SYMBOLS, i);
            if !string(self.u32(at + 16), false) || self.u32(at + 20) & !HAS_SIZE != 0 {
                return Err("bad symbol");
            }
        }
        for i in 0..self.count(FRAMES) {
            let at = self.record(FRAMES, i);
            if !string(self.u32(at), false)
                || !string(self.u32(at + 4), true)
                || !string(self.u32(at + 8), true)
                || self.u32(at + 16) & !(HAS_LINE | HAS_FRAME_SYMBOL) != 0
                || self.u32(at + 20) != 0
            {
                return Err("bad frame");
            }
        }
        for i in 0..self.count(INFOS) {
            let at = self.record(INFOS, i);
            let symbol = self.u32(at);
            let end = u64::from(self.u32(at + 4)) + u64::from(self.u32(at + 8));
            if (symbol != NONE && symbol as usize >= self.count(SYMBOLS))
                || end > self.count(FRAMES) as u64
                || self.u32(at + 12) & !UNNAMED != 0
            {
                return Err("bad info");
            }
        }
        let mut previous_end = 0;
        for i in 0..self.count(INTERVALS) {
            let at = self.record(INTERVALS, i);
            let (start, end) = (self.u64(at), self.u64(at + 8));
            if start >= end
                || (i > 0 && start < previous_end)
                || self.u32(at + 16) as usize >= self.count(INFOS)
                || self.u32(at + 20) != 0
            {
                return Err("bad interval");
            }
            previous_end = end;
        }
        Ok(())
    }

    pub(super) fn string(&self, index: u32) -> Option<String> {
        if index as usize >= self.count(STRINGS) {
            return None;
        }
        let at = self.record(STRINGS, index as usize);
        let (offset, len) = (self.u32(at) as usize, self.u32(at + 4) as usize);
        let text = self.tables[TEXT].0;
        let bytes = self.bytes.get(text + offset..text + offset + len)?;
        std::str::from_utf8(bytes).ok().map(str::to_string)
    }

    /// Where the debug information this entry was made from came from.
    pub fn source(&self) -> DebugSource {
        match (self.u32(12) & SOURCE_MASK) >> SOURCE_SHIFT {
            0 => DebugSource::Own,
            1 => DebugSource::File {
                path: PathBuf::from(self.string(self.u32(STRINGS_AT)).unwrap_or_default()),
                identity: Identity {
                    dev: self.u64(40),
                    ino: self.u64(48),
                    size: self.u64(56),
                    mtime: self.u64(64) as i64,
                    mtime_nsec: self.u32(72),
                },
            },
            _ => DebugSource::Missing,
        }
    }

    /// What the run that made the entry said about the file as a whole.
    pub fn facts(&self) -> LibFacts {
        LibFacts {
            symbols_empty: self.u32(12) & SYMBOLS_EMPTY != 0,
            no_debug_info: self.string(self.u32(STRINGS_AT + 4)),
        }
    }

    /// The entry's size in bytes.
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// The number of intervals (pieces of functions) the entry holds.
    pub fn len(&self) -> usize {
        self.count(INTERVALS)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What is known of `address`, when a function the entry holds covers it.
    pub fn lookup(&self, address: u64) -> Option<AddressInfo> {
        let (mut low, mut high) = (0, self.count(INTERVALS));
        while low < high {
            let mid = low + (high - low) / 2;
            if self.u64(self.record(INTERVALS, mid)) <= address {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        let at = self.record(INTERVALS, low.checked_sub(1)?);
        (address < self.u64(at + 8)).then(|| self.info(self.u32(at + 16)))
    }

    /// Every interval the entry holds, with what is known of its addresses.
    pub fn intervals(&self) -> impl Iterator<Item = (Range<u64>, AddressInfo)> + '_ {
        (0..self.count(INTERVALS)).map(|i| {
            let at = self.record(INTERVALS, i);
            (self.u64(at)..self.u64(at + 8), self.info(self.u32(at + 16)))
        })
    }

    fn info(&self, index: u32) -> AddressInfo {
        if index as usize >= self.count(INFOS) {
            return AddressInfo::default();
        }
        let at = self.record(INFOS, index as usize);
        let symbol = self.u32(at);
        let (first, count) = (self.u32(at + 4) as usize, self.u32(at + 8) as usize);
        let symbol = (symbol != NONE && (symbol as usize) < self.count(SYMBOLS)).then(|| {
            let at = self.record(SYMBOLS, symbol as usize);
            Symbol {
                address: self.u64(at),
                size: (self.u32(at + 20) & HAS_SIZE != 0).then(|| self.u64(at + 8)),
                name: self.string(self.u32(at + 16)).unwrap_or_default(),
            }
        });
        let frames_end = (first + count).min(self.count(FRAMES));
        // The entry's count is input: only the frames it holds are made room for.
        let frames_start = first.min(frames_end);
        let mut frames = Vec::with_capacity(frames_end - frames_start);
        let mut frame_symbols = Vec::with_capacity(frames_end - frames_start);
        for i in frames_start..frames_end {
            let at = self.record(FRAMES, i);
            let flags = self.u32(at + 16);
            frames.push(SourceFrame {
                function: self.string(self.u32(at)).unwrap_or_default(),
                linkage_name: self.string(self.u32(at + 4)),
                file: self.string(self.u32(at + 8)),
                line: (flags & HAS_LINE != 0).then(|| self.u32(at + 12)),
            });
            frame_symbols.push((flags & HAS_FRAME_SYMBOL != 0).then(|| self.u64(at + 24)));
        }
        AddressInfo {
            symbol,
            frames,
            frame_symbols,
            unnamed: self.u32(at + 12) & UNNAMED != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::builder::tests::sample;
    use super::super::key::tests::key;
    use super::*;

    #[test]
    fn an_entry_reads_back_what_was_written() {
        let (intervals, bytes) = sample();
        assert_eq!(bytes.len() % 8, 0);
        let entry = Entry::parse(bytes, &key()).unwrap();
        for (range, info) in &intervals {
            for address in [range.start, range.start + 1, range.end - 1] {
                assert_eq!(entry.lookup(address).as_ref(), Some(info), "0x{address:x}");
            }
        }
        for outside in [0, 0xfff, 0x1040, 0x1fff, 0x2100, u64::MAX] {
            assert_eq!(entry.lookup(outside), None, "0x{outside:x}");
        }
        assert_eq!(entry.intervals().collect::<Vec<_>>(), intervals);
        assert_eq!(entry.facts().no_debug_info.as_deref(), Some("why ünïcode"));
        assert!(
            matches!(entry.source(), DebugSource::File { identity, .. } if identity.mtime == -4)
        );
        let other = Key {
            size: 0x1235,
            ..key()
        };
        assert!(
            Entry::parse(entry.bytes.clone(), &other).is_err(),
            "another file's"
        );
        let rebuilt = Key {
            stamp: Stamp {
                ctime_nsec: 7,
                ..key().stamp
            },
            ..key()
        };
        assert_eq!(
            Entry::parse(entry.bytes.clone(), &rebuilt).err(),
            Some("another file's"),
            "the same name, build ID and size, written anew"
        );
    }

    #[test]
    fn an_entry_cut_short_at_any_length_is_refused() {
        let (_, bytes) = sample();
        for len in 0..bytes.len() {
            assert!(
                Entry::parse(bytes[..len].to_vec(), &key()).is_err(),
                "cut at {len}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Entry::parse(longer, &key()).is_err());
    }

    #[test]
    fn a_changed_byte_anywhere_is_refused() {
        let (_, bytes) = sample();
        for i in 0..bytes.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut damaged = bytes.clone();
                damaged[i] ^= flip;
                assert!(
                    Entry::parse(damaged, &key()).is_err(),
                    "byte {i} ^ {flip:#x}"
                );
            }
        }
    }

    /// Damage the checksum does not catch (an entry written wrong, or on purpose):
    /// random bytes changed, the checksum made right again. The entry is refused, or
    /// reads without a panic and with every answer inside what it holds.

    #[test]
    fn damaged_entries_with_a_valid_checksum_never_panic() {
        let (_, bytes) = sample();
        // xorshift64: a fixed sequence, so a failure can be replayed.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut accepted = 0;
        for round in 0..20_000 {
            let mut damaged = bytes.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() % damaged.len() as u64) as usize;
                damaged[i] = match next() % 4 {
                    0 => 0,
                    1 => 0xff,
                    2 => damaged[i] ^ (1 << (next() % 8)),
                    _ => next() as u8,
                };
            }
            if round % 7 == 0 {
                let len = (next() % damaged.len() as u64) as usize;
                damaged.truncate(len);
                let length = damaged.len() as u64;
                if damaged.len() >= 24 {
                    damaged[16..24].copy_from_slice(&length.to_le_bytes());
                }
            }
            let Ok(entry) = Entry::parse(with_checksum(damaged), &key()) else {
                continue;
            };
            accepted += 1;
            let _ = (entry.facts(), entry.source(), entry.len());
            for (range, info) in entry.intervals() {
                assert!(range.start < range.end);
                assert_eq!(info.frames.len(), info.frame_symbols.len());
                assert_eq!(entry.lookup(range.start), Some(info));
            }
            for probe in [0, 0x1000, 0x1020, 0x2000, next()] {
                let _ = entry.lookup(probe);
            }
        }
        // Changes to names, lines and addresses keep an entry sound.
        assert!(accepted > 0, "some damage leaves a sound entry");
    }
}
