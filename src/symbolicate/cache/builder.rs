//! Making an entry: what it holds (the intervals of the functions a run resolved, with
//! their symbols, inline chains, files and lines), each string, symbol and description
//! stored once, laid out in the format of `format`.

use std::collections::HashMap;
use std::ops::Range;

use super::format::*;
use super::words::{checksum, u32_at, CHECKSUM_AT};
use super::{DebugSource, Entry, Identity, Key};
use crate::symbolicate::{AddressInfo, LibFacts, Symbol};

/// Makes an entry: intervals with what is known of their addresses, each string, symbol
/// and address description stored once. Strings are told apart by a hash of them (and
/// compared with what was stored for it: of two strings with one hash, the second is
/// stored again), symbols and descriptions by the indexes they are made of, so that
/// nothing is kept twice while an entry is made (the kernel's has 100,000 symbols).
#[derive(Default)]
pub struct EntryBuilder {
    intervals: Vec<(Range<u64>, u32)>,
    infos: Vec<u8>,
    info_ids: FastMap<InfoKey, u32>,
    frames: Vec<u8>,
    frame_count: u32,
    symbols: Vec<u8>,
    symbol_ids: FastMap<(u64, Option<u64>, u32), u32>,
    strings: Vec<u8>,
    string_ids: FastMap<u64, u32>,
    text: Vec<u8>,
}

/// A hash map with a fast hash of keys that no one chooses to collide (indexes,
/// addresses and the hashes of names, of the builder's own making): SipHash, the
/// standard one, made up most of the time the kernel's entry took to make.
pub(crate) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;

/// A multiply-and-rotate hash of the words written to it.
#[derive(Default)]
pub(crate) struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in chunks.by_ref() {
            self.write_u64(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        for &byte in chunks.remainder() {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, word: u64) {
        // The multiplier is 2^64 divided by the golden ratio, made odd: it spreads every
        // bit of the word over the high bits, which the rotation brings down.
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u32(&mut self, word: u32) {
        self.write_u64(u64::from(word));
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }

    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

/// A description as its parts' indexes: symbol, unnamed, and per frame its function,
/// linkage name, file, line and symbol.
type InfoKey = (u32, bool, Vec<(u32, u32, u32, Option<u32>, Option<u64>)>);

impl EntryBuilder {
    /// A builder that holds what `entry` holds, its tables copied as they are (which a
    /// checked entry allows), so that functions are added to it without reading back
    /// what it knew.
    pub fn from_entry(entry: &Entry) -> EntryBuilder {
        let table = |t: usize| {
            let (offset, count) = entry.tables[t];
            entry.bytes[offset..offset + count * RECORD_BYTES[t]].to_vec()
        };
        let mut builder = EntryBuilder {
            infos: table(INFOS),
            frames: table(FRAMES),
            frame_count: entry.count(FRAMES) as u32,
            symbols: table(SYMBOLS),
            strings: table(STRINGS),
            text: table(TEXT),
            ..EntryBuilder::default()
        };
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hasher = BuildHasherDefault::<FastHasher>::default();
        for id in 0..entry.count(STRINGS) as u32 {
            let hash = hasher.hash_one(entry.string(id).unwrap_or_default().as_str());
            builder.string_ids.entry(hash).or_insert(id);
        }
        for id in 0..entry.count(SYMBOLS) {
            let at = entry.record(SYMBOLS, id);
            let size = (entry.u32(at + 20) & HAS_SIZE != 0).then(|| entry.u64(at + 8));
            let key = (entry.u64(at), size, entry.u32(at + 16));
            builder.symbol_ids.entry(key).or_insert(id as u32);
        }
        for id in 0..entry.count(INFOS) {
            let at = entry.record(INFOS, id);
            let (first, count) = (entry.u32(at + 4) as usize, entry.u32(at + 8) as usize);
            let frames = (first..first + count)
                .map(|f| {
                    let at = entry.record(FRAMES, f);
                    let flags = entry.u32(at + 16);
                    (
                        entry.u32(at),
                        entry.u32(at + 4),
                        entry.u32(at + 8),
                        (flags & HAS_LINE != 0).then(|| entry.u32(at + 12)),
                        (flags & HAS_FRAME_SYMBOL != 0).then(|| entry.u64(at + 24)),
                    )
                })
                .collect();
            let key = (entry.u32(at), entry.u32(at + 12) & UNNAMED != 0, frames);
            builder.info_ids.entry(key).or_insert(id as u32);
        }
        for i in 0..entry.count(INTERVALS) {
            let at = entry.record(INTERVALS, i);
            let range = entry.u64(at)..entry.u64(at + 8);
            builder.intervals.push((range, entry.u32(at + 16)));
        }
        builder
    }

    /// Stores `s` without looking for it first.
    fn new_string(&mut self, s: &str) -> u32 {
        let id = (self.strings.len() / RECORD_BYTES[STRINGS]) as u32;
        self.strings
            .extend_from_slice(&(self.text.len() as u32).to_le_bytes());
        self.strings
            .extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.text.extend_from_slice(s.as_bytes());
        id
    }

    fn string(&mut self, s: &str) -> u32 {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hash = BuildHasherDefault::<FastHasher>::default().hash_one(s);
        if let Some(&id) = self.string_ids.get(&hash) {
            let at = id as usize * RECORD_BYTES[STRINGS];
            let (offset, len) = (
                u32_at(&self.strings, at) as usize,
                u32_at(&self.strings, at + 4) as usize,
            );
            if self.text.get(offset..offset + len) == Some(s.as_bytes()) {
                return id;
            }
        }
        let id = self.new_string(s);
        self.string_ids.entry(hash).or_insert(id);
        id
    }

    fn optional_string(&mut self, s: Option<&str>) -> u32 {
        s.map_or(NONE, |s| self.string(s))
    }

    fn symbol(&mut self, s: &Symbol) -> u32 {
        let name = self.string(&s.name);
        let next = (self.symbols.len() / RECORD_BYTES[SYMBOLS]) as u32;
        let id = *self
            .symbol_ids
            .entry((s.address, s.size, name))
            .or_insert(next);
        if id == next {
            self.new_symbol(s, name);
        }
        id
    }

    /// Stores `s`, named by string `name`, without looking for it first.
    fn new_symbol(&mut self, s: &Symbol, name: u32) -> u32 {
        let id = (self.symbols.len() / RECORD_BYTES[SYMBOLS]) as u32;
        self.symbols.extend_from_slice(&s.address.to_le_bytes());
        self.symbols
            .extend_from_slice(&s.size.unwrap_or(0).to_le_bytes());
        self.symbols.extend_from_slice(&name.to_le_bytes());
        let flags = if s.size.is_some() { HAS_SIZE } else { 0 };
        self.symbols.extend_from_slice(&flags.to_le_bytes());
        id
    }

    fn info(&mut self, info: &AddressInfo) -> u32 {
        let symbol = info.symbol.as_ref().map_or(NONE, |s| self.symbol(s));
        let frames: Vec<_> = info
            .frames
            .iter()
            .enumerate()
            .map(|(depth, frame)| {
                (
                    self.string(&frame.function),
                    self.optional_string(frame.linkage_name.as_deref()),
                    self.optional_string(frame.file.as_deref()),
                    frame.line,
                    info.frame_symbols.get(depth).copied().flatten(),
                )
            })
            .collect();
        let key = (symbol, info.unnamed, frames);
        if let Some(&id) = self.info_ids.get(&key) {
            return id;
        }
        let id = self.new_info(&key);
        self.info_ids.insert(key, id);
        id
    }

    /// Stores the description `key` without looking for it first.
    fn new_info(&mut self, key: &InfoKey) -> u32 {
        let id = (self.infos.len() / RECORD_BYTES[INFOS]) as u32;
        let first = self.frame_count;
        for &(function, linkage, file, line, frame_symbol) in &key.2 {
            let mut flags = 0;
            if line.is_some() {
                flags |= HAS_LINE;
            }
            if frame_symbol.is_some() {
                flags |= HAS_FRAME_SYMBOL;
            }
            for word in [function, linkage, file, line.unwrap_or(0), flags, 0] {
                self.frames.extend_from_slice(&word.to_le_bytes());
            }
            self.frames
                .extend_from_slice(&frame_symbol.unwrap_or(0).to_le_bytes());
            self.frame_count += 1;
        }
        let flags = if key.1 { UNNAMED } else { 0 };
        for word in [key.0, first, key.2.len() as u32, flags] {
            self.infos.extend_from_slice(&word.to_le_bytes());
        }
        id
    }

    /// Adds the addresses `range`, which `info` describes. An interval that overlaps one
    /// added before is left out when the entry is made.
    pub fn add(&mut self, range: Range<u64>, info: &AddressInfo) {
        // Frames beyond what frame_symbols says are stored without a symbol, which is
        // what `frame_symbols.get(depth)` gives for them as well.
        if range.start < range.end {
            let id = self.info(info);
            self.intervals.push((range, id));
        }
    }

    /// Adds the addresses `range`, which `info` describes, a symbol and nothing else
    /// (no frames), which no other interval has: nothing is looked for, so that the
    /// kernel's 100,000 symbols are stored quickly.
    pub fn add_symbol(&mut self, range: Range<u64>, symbol: &Symbol) {
        if range.start < range.end {
            let name = self.new_string(&symbol.name);
            let symbol = self.new_symbol(symbol, name);
            let id = self.new_info(&(symbol, false, Vec::new()));
            self.intervals.push((range, id));
        }
    }

    /// The number of intervals added.
    pub fn len(&self) -> usize {
        self.intervals.len()
    }

    pub fn is_empty(&self) -> bool {
        self.intervals.is_empty()
    }

    /// The entry of `key`, made from `source`, with `facts` about the file.
    pub fn finish(mut self, key: &Key, facts: &LibFacts, source: &DebugSource) -> Vec<u8> {
        let (kind, path, identity) = match source {
            DebugSource::Own => (0, None, Identity::default()),
            DebugSource::File { path, identity } => (1, Some(path), *identity),
            DebugSource::Missing => (2, None, Identity::default()),
        };
        let path = path.map(|p| self.string(&p.to_string_lossy()));
        let no_debug_info = self.optional_string(facts.no_debug_info.as_deref());
        // What only served to store things once goes first, and each table once copied:
        // the kernel's entry is some megabytes.
        let EntryBuilder {
            intervals: mut added,
            infos,
            frames,
            symbols,
            strings,
            text,
            ..
        } = self;
        // Sorted, with overlaps dropped, and neighbours that say the same joined.
        added.sort_by_key(|(r, _)| r.start);
        let mut intervals: Vec<(Range<u64>, u32)> = Vec::with_capacity(added.len());
        for (range, id) in added {
            match intervals.last_mut() {
                Some((last, _)) if range.start < last.end => {}
                Some((last, last_id)) if range.start == last.end && *last_id == id => {
                    last.end = range.end
                }
                _ => intervals.push((range, id)),
            }
        }
        let mut interval_bytes = Vec::with_capacity(intervals.len() * RECORD_BYTES[INTERVALS]);
        for (range, id) in intervals {
            interval_bytes.extend_from_slice(&range.start.to_le_bytes());
            interval_bytes.extend_from_slice(&range.end.to_le_bytes());
            interval_bytes.extend_from_slice(&id.to_le_bytes());
            interval_bytes.extend_from_slice(&0u32.to_le_bytes());
        }
        let tables: [Vec<u8>; 6] = [interval_bytes, infos, frames, symbols, strings, text];
        let length = HEADER_BYTES
            + tables
                .iter()
                .map(|t| t.len().next_multiple_of(8))
                .sum::<usize>();
        let mut out = Vec::with_capacity(length);
        out.resize(HEADER_BYTES, 0);
        out[..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&VERSION.to_le_bytes());
        let mut flags = kind << SOURCE_SHIFT;
        if facts.symbols_empty {
            flags |= SYMBOLS_EMPTY;
        }
        out[12..16].copy_from_slice(&flags.to_le_bytes());
        out[32..40].copy_from_slice(&key.size.to_le_bytes());
        out[40..48].copy_from_slice(&identity.dev.to_le_bytes());
        out[48..56].copy_from_slice(&identity.ino.to_le_bytes());
        out[56..64].copy_from_slice(&identity.size.to_le_bytes());
        out[64..72].copy_from_slice(&identity.mtime.to_le_bytes());
        out[72..76].copy_from_slice(&identity.mtime_nsec.to_le_bytes());
        out[76..80].copy_from_slice(&(key.build_id.len() as u32).to_le_bytes());
        out[80..80 + key.build_id.len()].copy_from_slice(&key.build_id);
        out[STAMP_AT..STAMP_AT + 40].copy_from_slice(&stamp_bytes(&key.stamp));
        for (t, table) in tables.into_iter().enumerate() {
            let offset = out.len() as u64;
            let count = (table.len() / RECORD_BYTES[t]) as u64;
            out[TABLES_AT + 16 * t..TABLES_AT + 16 * t + 8].copy_from_slice(&offset.to_le_bytes());
            out[TABLES_AT + 16 * t + 8..TABLES_AT + 16 * t + 16]
                .copy_from_slice(&count.to_le_bytes());
            out.extend_from_slice(&table);
            out.resize(out.len().next_multiple_of(8), 0);
        }
        out[STRINGS_AT..STRINGS_AT + 4].copy_from_slice(&path.unwrap_or(NONE).to_le_bytes());
        out[STRINGS_AT + 4..STRINGS_AT + 8].copy_from_slice(&no_debug_info.to_le_bytes());
        let length = out.len() as u64;
        out[16..24].copy_from_slice(&length.to_le_bytes());
        let sum = checksum(&out);
        out[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
        out
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::key::tests::key;
    use super::*;
    use crate::symbolicate::SourceFrame;

    pub(crate) fn frame(function: &str, file: Option<&str>, line: Option<u32>) -> SourceFrame {
        SourceFrame {
            function: function.into(),
            linkage_name: Some(format!("_Z{function}")),
            file: file.map(str::to_string),
            line,
        }
    }

    /// Two functions: one with an inlined call and lines, one unnamed without DWARF.
    pub(crate) fn sample() -> (Vec<(Range<u64>, AddressInfo)>, Vec<u8>) {
        let outer = Symbol {
            address: 0x1000,
            size: Some(0x40),
            name: "outer".into(),
        };
        let inlined = AddressInfo {
            symbol: Some(outer.clone()),
            frames: vec![
                frame("outer", Some("a.c"), Some(10)),
                frame("helper", Some("h.h"), Some(3)),
            ],
            frame_symbols: vec![Some(0x1000), None],
            unnamed: false,
        };
        let plain = AddressInfo {
            symbol: Some(outer),
            frames: vec![frame("outer", Some("a.c"), None)],
            frame_symbols: vec![Some(0x1000)],
            unnamed: false,
        };
        let unnamed = AddressInfo {
            symbol: Some(Symbol {
                address: 0x2000,
                size: None,
                name: "fn_0x2000".into(),
            }),
            unnamed: true,
            ..AddressInfo::default()
        };
        let intervals = vec![
            (0x1000..0x1010, plain.clone()),
            (0x1010..0x1030, inlined),
            (0x1030..0x1040, plain),
            (0x2000..0x2100, unnamed),
        ];
        let mut builder = EntryBuilder::default();
        for (range, info) in &intervals {
            builder.add(range.clone(), info);
        }
        let facts = LibFacts {
            symbols_empty: false,
            no_debug_info: Some("why ünïcode".into()),
        };
        let source = DebugSource::File {
            path: "/usr/lib/debug/x.debug".into(),
            identity: Identity {
                dev: 1,
                ino: 2,
                size: 3,
                mtime: -4,
                mtime_nsec: 5,
            },
        };
        let bytes = builder.finish(&key(), &facts, &source);
        (intervals, bytes)
    }

    #[test]
    fn an_entry_grows_from_what_it_held() {
        let (intervals, bytes) = sample();
        let entry = Entry::parse(bytes.clone(), &key()).unwrap();
        let facts = entry.facts();
        let source = entry.source();
        let same = EntryBuilder::from_entry(&entry).finish(&key(), &facts, &source);
        assert_eq!(same, bytes, "nothing added, nothing changed");
        let mut builder = EntryBuilder::from_entry(&entry);
        // Known strings, symbols and descriptions are found, not stored again.
        builder.add(0x3000..0x3010, &intervals[1].1);
        let more = AddressInfo {
            frames: vec![frame("new", Some("a.c"), Some(99))],
            frame_symbols: vec![None],
            ..intervals[0].1.clone()
        };
        builder.add(0x3010..0x3020, &more);
        let grown = Entry::parse(builder.finish(&key(), &facts, &source), &key()).unwrap();
        assert_eq!(grown.count(INFOS), entry.count(INFOS) + 1);
        assert_eq!(grown.count(SYMBOLS), entry.count(SYMBOLS));
        assert_eq!(grown.count(STRINGS), entry.count(STRINGS) + 2, "new, _Znew");
        for (range, info) in intervals.iter().chain([
            &(0x3000..0x3010, intervals[1].1.clone()),
            &(0x3010..0x3020, more),
        ]) {
            assert_eq!(grown.lookup(range.start).as_ref(), Some(info));
        }
    }

    #[test]
    fn overlapping_intervals_are_left_out_and_equal_neighbours_joined() {
        let info = AddressInfo::default();
        let mut builder = EntryBuilder::default();
        builder.add(0x10..0x20, &info);
        builder.add(0x20..0x30, &info);
        builder.add(0x18..0x40, &info);
        builder.add(0x30..0x30, &info);
        let bytes = builder.finish(&key(), &LibFacts::default(), &DebugSource::Own);
        let entry = Entry::parse(bytes, &key()).unwrap();
        let ranges: Vec<(u64, u64)> = entry.intervals().map(|(r, _)| (r.start, r.end)).collect();
        assert_eq!(ranges, [(0x10, 0x30)]);
    }
}
