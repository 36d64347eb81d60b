//! ELF symbol tables read for a given set of addresses, straight from the file: the
//! entries are streamed through a small window, and only the symbols that a lookup of
//! those addresses needs are kept, with their names read one by one. A large library
//! (rustc's driver: 165,000 symbols, 20 MB of names) costs a profile that samples a few
//! thousand of its addresses a few thousand symbols, instead of every name copied out
//! twice (by `object`'s read cache, then as owned strings), which was most of the peak
//! memory of recording a build.
//!
//! A lookup (docs/design.md §2, [`super::SymbolMap::lookup`]) needs, for an address, the symbol
//! with the highest start at or below it (with its size) and the start of the next one
//! (where the address's extent ends). With the addresses sorted, a symbol starting at `s`
//! can only be the first of these for the addresses from `s` up to the next address, and
//! only the second for the address just below `s`: so each symbol is offered to the
//! first address at or above its start and to the one before, and a pass in address
//! order afterwards hands each address the best of its own and its predecessors'.
//!
//! DWARF's linkage names are looked up by name ([`NameIndex`]): for the files that have
//! DWARF, the names are streamed once more and kept as hashes.
//!
//! A recording that names its profile window after window ([`ScanMemo`]) keeps each
//! file's function symbols, sorted, and their index by name between windows: a large
//! library is then streamed once, not once per window in which it has new addresses
//! (under a Rust build, rustc's driver in nearly every window: a third of continuous
//! mode's CPU).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex, OnceLock};

use super::symbol::{without_version, Symbol};
use crate::files::binary::Binary;
use crate::files::elf::Elf;
use crate::files::image::At;

/// The string at `offset` of the string table at `strings` (file offset, size), read by
/// `read` (a file offset, a buffer to fill: how many bytes it got), without a version
/// suffix; `None` when it cannot be read or is empty.
fn string_at(
    strings: (u64, u64),
    offset: u32,
    read: &mut dyn FnMut(u64, &mut [u8]) -> Option<usize>,
) -> Option<String> {
    let (start, size) = strings;
    if u64::from(offset) >= size {
        return None;
    }
    let mut pos = start + u64::from(offset);
    let mut name = Vec::new();
    let mut chunk = [0u8; NAME_CHUNK];
    while name.len() < MAX_NAME_BYTES {
        let n = read(pos, &mut chunk)?;
        if n == 0 {
            break;
        }
        match chunk[..n].iter().position(|&b| b == 0) {
            Some(end) => {
                name.extend_from_slice(&chunk[..end]);
                break;
            }
            None => name.extend_from_slice(&chunk[..n]),
        }
        pos += n as u64;
    }
    stored_name(&name, str::to_string)
}

/// What `f` makes of the name a string table's `bytes` hold (up to a NUL, if any),
/// without a version suffix; `None` when it is empty.
fn stored_name<T>(bytes: &[u8], f: impl FnOnce(&str) -> T) -> Option<T> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let name = String::from_utf8_lossy(&bytes[..end]);
    let name = without_version(&name);
    (!name.is_empty()).then(|| f(name))
}

/// The name of entry `index` of the symbol table `table` (a little-endian `.dynsym`,
/// whose strings lie at `strings`), read through `at`.
pub fn name_of_symbol(
    at: &At,
    table: &crate::files::elf::Section<'_>,
    strings: (u64, u64),
    index: u64,
) -> Option<String> {
    let (offset, size) = table.file_range()?;
    let entry = index.checked_mul(SYM_BYTES as u64)?;
    if entry.checked_add(SYM_BYTES as u64)? > size || table.entry_size() != SYM_BYTES as u64 {
        return None;
    }
    let mut name = [0u8; 4];
    (at.read_into(offset + entry, &mut name)? == 4).then_some(())?;
    string_at(strings, u32::from_le_bytes(name), &mut |pos, buf| {
        at.read_into(pos, buf)
    })
}

/// The size of an `Elf64_Sym`.
const SYM_BYTES: usize = 24;

/// Symbol table bytes read at a time: 64 KiB of whole entries (the read-ahead of
/// [`At`] is as large).
const CHUNK_BYTES: usize = SYM_BYTES * 2730;

/// The longest name read: 64 KiB. Mangled C++ and Rust names reach a few KB; a longer
/// one (a damaged table) is cut there.
const MAX_NAME_BYTES: usize = 64 << 10;

/// Bytes of a string table [`Tables::index`] reads at a time: 1 MiB, more than
/// [`MAX_NAME_BYTES`], so that a name lies whole in the window read from its start.
const NAMES_WINDOW: usize = 1 << 20;

/// Bytes of a name read at a time.
const NAME_CHUNK: usize = 256;

/// `st_info` types and the special section indexes that matter here.
const STT_NOTYPE: u8 = 0;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const STB_LOCAL: u8 = 0;
const SHN_UNDEF: u16 = 0;
const SHN_LORESERVE: u16 = 0xff00;
const SHN_XINDEX: u16 = 0xffff;

/// One symbol table of a file (`.symtab` or `.dynsym`) and its string table, as file
/// offsets.
#[derive(Clone)]
struct Table {
    reader: Reader,
    /// The file's place in the order of [`Tables::of`].
    file: u8,
    offset: u64,
    count: u64,
    strings: (u64, u64),
    /// Which sections hold code (`SHF_EXECINSTR`), by index: an untyped symbol there is a
    /// label in code (`_start`).
    executable: std::sync::Arc<[bool]>,
}

/// Reads one file's bytes by position.
#[derive(Clone)]
struct Reader(At);

impl Reader {
    fn at(&self, offset: u64) -> At {
        let mut at = self.0.clone();
        // Seeking from the start cannot fail.
        let _ = at.seek(SeekFrom::Start(offset));
        at
    }
}

/// A function symbol as its table has it: enough to choose among symbols before any
/// name is read.
#[derive(Clone, Copy, Debug)]
struct Entry {
    address: u64,
    size: u64,
    global: bool,
    /// The file's rank: the debug file's symbols before the file's own.
    file: u8,
    /// The table, and the name's offset in its string table.
    table: u8,
    name: u32,
}

impl Entry {
    /// The preference among symbols at one address (lower first): the earlier file,
    /// then sized, then global, then the earlier entry (`.symtab` before `.dynsym`).
    fn order(&self) -> (u8, bool, bool) {
        (self.file, self.size == 0, !self.global)
    }
}

/// The symbol tables of a file and, first, of its separate debug file.
#[derive(Clone, Default)]
pub struct Tables {
    tables: Vec<Table>,
    /// Their function symbols, when a [`ScanMemo`] keeps them.
    scanned: Option<Arc<Scanned>>,
}

/// Every function symbol of one set of [`Tables`], sorted by address and then by
/// preference ([`Entry::order`]), in table order where both are equal; and their index
/// by name once it is made.
pub struct Scanned {
    entries: Vec<Entry>,
    index: Arc<OnceLock<NameIndex>>,
}

impl Scanned {
    /// [`Tables::symbols_for`]'s two candidates for each of the `sorted` addresses, as
    /// the scan would find them: the best symbol starting in `(sorted[i-1], sorted[i]]`
    /// (highest start, then preferred, then first), and the first in
    /// `(sorted[i], sorted[i+1]]`.
    fn candidates(&self, sorted: &[u64]) -> (Vec<Option<Entry>>, Vec<Option<Entry>>) {
        let e = &self.entries;
        let mut below = vec![None; sorted.len()];
        let mut above = vec![None; sorted.len()];
        for (i, &address) in sorted.iter().enumerate() {
            let after = e.partition_point(|x| x.address <= address);
            if let Some(top) = after.checked_sub(1).map(|t| e[t].address) {
                if i == 0 || top > sorted[i - 1] {
                    below[i] = Some(e[e.partition_point(|x| x.address < top)]);
                }
            }
            above[i] = e
                .get(after)
                .filter(|x| sorted.get(i + 1).is_none_or(|&next| x.address <= next))
                .copied();
        }
        (below, above)
    }
}

/// The most memory [`ScanMemo`] keeps: 8 MiB, the sorted symbols of rustc's driver
/// (about 120,000 functions at 32 bytes, and their index by name at 16 more) and of a
/// few dozen ordinary libraries.
pub const MAX_SCAN_MEMO_BYTES: usize = 8 << 20;

/// The function symbols of the files named more than once so far, by the identity of
/// their files ([`crate::files::image::At::identity`]): a file written again is another
/// one. A file named once is streamed as without a memo (sorting and keeping the symbols
/// of the many programs a build runs once cost more than they save). When more than
/// [`MAX_SCAN_MEMO_BYTES`] are kept, the files used longest ago go.
#[derive(Default)]
pub struct ScanMemo {
    kept: Mutex<MemoFiles>,
}

#[derive(Default)]
struct MemoFiles {
    by_file: HashMap<Vec<[u64; 5]>, (Arc<Scanned>, u64)>,
    /// The files named once, not kept: a file is kept when it is named a second time.
    seen_once: std::collections::HashSet<Vec<[u64; 5]>>,
    bytes: usize,
    clock: u64,
}

/// The most files [`ScanMemo`] remembers having named once, before it forgets them all:
/// a build starts thousands of programs that run once.
const MAX_SEEN_ONCE: usize = 4096;

impl std::fmt::Debug for ScanMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.kept.lock().map(|k| (k.by_file.len(), k.bytes));
        f.debug_struct("ScanMemo")
            .field("files, bytes", &kept.ok())
            .finish()
    }
}

impl ScanMemo {
    /// How many files' symbols it keeps.
    pub fn files(&self) -> usize {
        self.kept.lock().map_or(0, |k| k.by_file.len())
    }
}

/// What one file's entries cost in a [`ScanMemo`]: themselves and their index by name.
fn memo_bytes(entries: usize) -> usize {
    entries * (std::mem::size_of::<Entry>() + std::mem::size_of::<(u64, u64)>())
}

impl Tables {
    /// The symbol tables of `files` (each an ELF file and its parsed form), in the order
    /// given; `None` when one is not a 64-bit little-endian ELF file, which the caller
    /// reads the general way.
    pub fn of<'d, R: object::ReadRef<'d>>(files: &[(&Binary, &Elf<'d, R>)]) -> Option<Tables> {
        let mut tables = Vec::new();
        for (rank, (binary, file)) in files.iter().enumerate() {
            if !file.is_little_endian() {
                return None;
            }
            let executable: std::sync::Arc<[bool]> =
                file.sections().map(|s| s.executable()).collect();
            for kind in [object::elf::SHT_SYMTAB, object::elf::SHT_DYNSYM] {
                let Some(table) = file.section_of_kind(kind) else {
                    continue;
                };
                let Some(strings) = file.section_at(table.link()) else {
                    continue;
                };
                if table.entry_size() != SYM_BYTES as u64 {
                    continue;
                }
                let (Some((offset, size)), Some(strings)) =
                    (table.file_range(), strings.file_range())
                else {
                    continue;
                };
                tables.push(Table {
                    reader: Reader(binary.at()),
                    file: rank as u8,
                    offset,
                    count: size / SYM_BYTES as u64,
                    strings,
                    executable: executable.clone(),
                });
            }
        }
        Some(Tables {
            tables,
            scanned: None,
        })
    }

    /// These tables with their function symbols from `memo`, scanned and kept there
    /// first when it has none for these files but has seen them before; unchanged the
    /// first time, or when a file cannot tell which it is.
    pub fn memoized(mut self, memo: &ScanMemo) -> Tables {
        let Some(key) = self
            .tables
            .iter()
            .map(|t| t.reader.0.identity())
            .collect::<Option<Vec<_>>>()
        else {
            return self;
        };
        let Ok(mut kept) = memo.kept.lock() else {
            return self;
        };
        kept.clock += 1;
        let now = kept.clock;
        if let Some((scanned, used)) = kept.by_file.get_mut(&key) {
            *used = now;
            self.scanned = Some(scanned.clone());
            return self;
        }
        if !kept.seen_once.remove(&key) {
            if kept.seen_once.len() >= MAX_SEEN_ONCE {
                kept.seen_once.clear();
            }
            kept.seen_once.insert(key);
            return self;
        }
        let mut entries = Vec::new();
        self.scan(|e| entries.push(e));
        // A stable sort: of equal ones the earlier entry stays first.
        entries.sort_by_key(|e| (e.address, e.order()));
        let bytes = memo_bytes(entries.len());
        let scanned = Arc::new(Scanned {
            entries,
            index: Arc::default(),
        });
        self.scanned = Some(scanned.clone());
        if bytes > MAX_SCAN_MEMO_BYTES {
            return self;
        }
        while kept.bytes + bytes > MAX_SCAN_MEMO_BYTES {
            let Some(oldest) = kept
                .by_file
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((gone, _)) = kept.by_file.remove(&oldest) {
                kept.bytes -= memo_bytes(gone.entries.len());
            }
        }
        kept.bytes += bytes;
        kept.by_file.insert(key, (scanned, now));
        self
    }

    /// Where the index by name of these tables is kept: with their symbols in a memo,
    /// or new.
    pub fn index_slot(&self) -> Arc<OnceLock<NameIndex>> {
        self.scanned
            .as_ref()
            .map_or_else(Arc::default, |s| s.index.clone())
    }

    /// Every function symbol of every table, in table order, handed to `each` (an I/O
    /// error ends a table: what came before it is kept).
    fn scan(&self, mut each: impl FnMut(Entry)) {
        let mut chunk = vec![0u8; CHUNK_BYTES];
        for (index, table) in self.tables.iter().enumerate() {
            let mut at = table.reader.at(table.offset);
            let mut left = table.count;
            while left > 0 {
                let n = (left as usize).min(CHUNK_BYTES / SYM_BYTES);
                let bytes = &mut chunk[..n * SYM_BYTES];
                if at.read_exact(bytes).is_err() {
                    break;
                }
                for raw in bytes.chunks_exact(SYM_BYTES) {
                    if let Some(entry) = function(raw, table, index as u8) {
                        each(entry);
                    }
                }
                left -= n as u64;
            }
        }
    }

    /// The name of `entry`, without a version suffix; `None` when it cannot be read or
    /// is empty.
    fn name(&self, entry: &Entry) -> Option<String> {
        let table = self.tables.get(entry.table as usize)?;
        string_at(table.strings, entry.name, &mut |pos, buf| {
            table.reader.0.read_into(pos, buf)
        })
    }

    /// The symbols a lookup of `addresses` needs (see the module's description), in
    /// address order, the preferred one first where several start at one address (as
    /// [`super::SymbolMap::from_preferred`] takes them); empty when the tables have no
    /// function symbols.
    pub fn symbols_for(&self, addresses: &[u64]) -> Vec<Symbol> {
        let mut sorted = addresses.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() {
            return Vec::new();
        }
        // below[i]: the best symbol starting in (sorted[i-1], sorted[i]];
        // above[i]: the first symbol starting in (sorted[i], sorted[i+1]].
        let (below, above) = match &self.scanned {
            Some(scanned) => scanned.candidates(&sorted),
            None => self.scan_candidates(&sorted),
        };
        // The symbol at or below each address is its own bucket's best, else the one of
        // the address before; the next start is its own bucket's first, else the one of
        // the address after. Only distinct symbols are named.
        let mut wanted: HashMap<(u8, u32, u64), Entry> = HashMap::new();
        let mut last: Option<Entry> = None;
        for b in below.into_iter() {
            last = b.or(last);
            if let Some(e) = last {
                wanted.insert((e.table, e.name, e.address), e);
            }
        }
        let mut next: Option<Entry> = None;
        for a in above.into_iter().rev() {
            next = a.or(next);
            if let Some(e) = next {
                wanted.insert((e.table, e.name, e.address), e);
            }
        }
        let mut entries: Vec<Entry> = wanted.into_values().collect();
        entries.sort_by_key(|e| (e.address, e.order()));
        entries
            .into_iter()
            .filter_map(|e| {
                Some(Symbol {
                    address: e.address,
                    size: (e.size > 0).then_some(e.size),
                    name: self.name(&e)?,
                })
            })
            .collect()
    }

    /// [`Scanned::candidates`], found by streaming the tables.
    fn scan_candidates(&self, sorted: &[u64]) -> (Vec<Option<Entry>>, Vec<Option<Entry>>) {
        let mut below: Vec<Option<Entry>> = vec![None; sorted.len()];
        let mut above: Vec<Option<Entry>> = vec![None; sorted.len()];
        self.scan(|e| {
            let i = sorted.partition_point(|&a| a < e.address);
            if let Some(slot) = below.get_mut(i) {
                let better = slot.is_none_or(|b| {
                    (e.address, std::cmp::Reverse(e.order()))
                        > (b.address, std::cmp::Reverse(b.order()))
                });
                if better {
                    *slot = Some(e);
                }
            }
            if let Some(slot) = i.checked_sub(1).and_then(|i| above.get_mut(i)) {
                if slot.is_none_or(|b| (e.address, e.order()) < (b.address, b.order())) {
                    *slot = Some(e);
                }
            }
        });
        (below, above)
    }

    /// The name of the function at each of `addresses` (sorted) in the last file's own
    /// tables, as its PLT names IFUNCs: of several names the last global one (`.dynsym`'s
    /// after `.symtab`'s), else the first.
    pub fn names_at(&self, addresses: &[u64]) -> HashMap<u64, String> {
        let last = self.tables.iter().map(|t| t.file).max();
        let mut chosen: HashMap<u64, Entry> = HashMap::new();
        self.scan(|e| {
            if Some(e.file) != last || addresses.binary_search(&e.address).is_err() {
                return;
            }
            match chosen.get_mut(&e.address) {
                Some(c) if e.global => *c = e,
                Some(_) => {}
                None => {
                    chosen.insert(e.address, e);
                }
            }
        });
        chosen
            .into_iter()
            .filter_map(|(a, e)| Some((a, self.name(&e)?)))
            .collect()
    }

    /// Every function symbol by name, for [`NameIndex::address`]: of several at one
    /// address only the one a lookup gives (the others' names are not found, as
    /// [`super::SymbolMap::by_name`] does not find them).
    pub fn index(&self) -> NameIndex {
        let mut entries: Vec<Entry> = match &self.scanned {
            Some(scanned) => scanned.entries.clone(),
            None => {
                let mut entries = Vec::new();
                self.scan(|e| entries.push(e));
                // A stable sort: of equal ones the earlier entry wins.
                entries.sort_by_key(|e| (e.address, e.order()));
                entries
            }
        };
        entries.dedup_by_key(|e| e.address);
        // Names read in the order they lie in their tables: in address order each would
        // be a read of the file of its own.
        entries.sort_unstable_by_key(|e| (e.table, e.name));
        let mut by_hash = self.hashed_names(&entries);
        drop(entries);
        by_hash.sort_unstable();
        NameIndex { by_hash }
    }

    /// The hash of the name of each of `entries` (sorted by table and name offset) with
    /// the entry's address; an entry whose name cannot be read or is empty is left out.
    /// Each string table is read forward [`NAMES_WINDOW`] bytes at a time and each name
    /// hashed where it lies (as [`Tables::name`] would read it, without a version
    /// suffix): reading each name on its own into a string took 1.4 ms for libc's 3,700
    /// functions.
    fn hashed_names(&self, entries: &[Entry]) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(entries.len());
        let mut window: Vec<u8> = Vec::new();
        // The window's table and where in its strings it starts, and whether it reaches
        // their end (or the file's): then no later name of the table needs another.
        let mut at: Option<(u8, u64, bool)> = None;
        for e in entries {
            let Some(table) = self.tables.get(e.table as usize) else {
                continue;
            };
            let (start, size) = table.strings;
            let offset = u64::from(e.name);
            if offset >= size {
                continue;
            }
            let fits = |(t, from, to_end): (u8, u64, bool)| {
                let end = from + window.len() as u64;
                t == e.table
                    && offset >= from
                    && (to_end || (offset + MAX_NAME_BYTES as u64).min(size) <= end)
            };
            if !at.is_some_and(fits) {
                let want = ((size - offset) as usize).min(NAMES_WINDOW);
                window.resize(want, 0);
                let Some(got) = table.reader.0.read_into(start + offset, &mut window) else {
                    // This name only cannot be read, as `Tables::name` would say.
                    at = None;
                    continue;
                };
                window.truncate(got);
                let to_end = got < want || offset + got as u64 >= size;
                at = Some((e.table, offset, to_end));
            }
            let from = at.map_or(0, |(_, from, _)| (offset - from) as usize);
            let rest = window.get(from..).unwrap_or_default();
            if let Some(h) = stored_name(&rest[..rest.len().min(MAX_NAME_BYTES)], hash) {
                out.push((h, e.address));
            }
        }
        out
    }
}

/// The function symbol of one raw `Elf64_Sym` (little-endian) of `table`, the `index`th:
/// defined in a section, at a non-zero address, with a name, and a function, an IFUNC
/// resolver or an untyped label in an executable section.
fn function(raw: &[u8], table: &Table, index: u8) -> Option<Entry> {
    let word = |at: usize| u32::from_le_bytes(raw[at..at + 4].try_into().unwrap_or_default());
    let long = |at: usize| u64::from_le_bytes(raw[at..at + 8].try_into().unwrap_or_default());
    let name = word(0);
    let info = raw[4];
    let section = u16::from_le_bytes([raw[6], raw[7]]);
    let (address, size) = (long(8), long(16));
    if name == 0 || address == 0 || section == SHN_UNDEF {
        return None;
    }
    if section >= SHN_LORESERVE && section != SHN_XINDEX {
        return None;
    }
    let code = match info & 0xf {
        STT_FUNC | STT_GNU_IFUNC => true,
        STT_NOTYPE => table
            .executable
            .get(usize::from(section))
            .copied()
            .unwrap_or(false),
        _ => false,
    };
    code.then_some(Entry {
        address,
        size,
        global: info >> 4 != STB_LOCAL,
        file: table.file,
        table: index,
        name,
    })
}

/// The hash names are indexed by.
fn hash(name: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0).hash_one(name)
}

/// Function symbols by name (see [`Tables::index`]): the 64-bit hash of each name and
/// its symbol's address, 16 bytes per symbol (rustc's driver has 120,000). A hash
/// stands for its name: that a name looked up has the hash of another of the file's
/// names is a chance of about one in 10^14 (a file's names are fewer than 2^17, of 2^64
/// hashes), so names are not read again to confirm a match.
pub struct NameIndex {
    by_hash: Vec<(u64, u64)>,
}

impl NameIndex {
    /// The address of the lowest symbol named `name`, as stored (mangled).
    pub fn address(&self, name: &str) -> Option<u64> {
        let h = hash(name);
        let first = self.by_hash.partition_point(|&(x, _)| x < h);
        self.by_hash
            .get(first)
            .filter(|&&(x, _)| x == h)
            .map(|&(_, address)| address)
    }
}
