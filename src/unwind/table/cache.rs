//! The cache of compiled unwind tables: the kernel walker's table of a file, kept
//! between runs so that a later run that maps the same file reads its rows instead of
//! compiling its CFI again. rustc's two large libraries, librustc_driver and libLLVM
//! (2.6 million rows, 31 MB), took 188 ms of CPU to compile in a cargo build; read back
//! from the cache, checked and written into the kernel's table, 46 ms, in blocks, never
//! whole in memory.
//!
//! - Where: `sampler/unwind/` beside the symbol cache's `sampler/symbols/`, whose rules
//!   it shares ([`crate::files::usercache`]: the user's, under sudo the invoking
//!   user's; directories 0700, entries 0600, never through a link). `--no-cache`
//!   switches it off with the symbol cache.
//! - Key: one entry per file, named after its device and inode, holding its size,
//!   modification and change times and build ID (if any); used only for that very file
//!   in that very version (a file written anew, even with its times put back, has
//!   another change time). rustc's libraries have no build ID, so none is needed. Code
//!   read from memory (the vDSO) is compiled every time.
//! - Format: a [`HEADER_BYTES`] header, then the rows as the kernel's table holds them.
//!   Checked before use (magic, key, length) and as it is read (rows in address order,
//!   the checksum of the rows): a damaged entry is refused as the rows are given to the
//!   kernel, and that file is walked by frame pointers for the rest of the run.
//! - Writes: a table compiled on a miss goes straight into a new file beside its entry,
//!   in blocks; that file is renamed into place only by [`TableCache::save`], after the
//!   profile, so a run that fails leaves nothing behind (the file is removed, then the
//!   directories made for it). Least recently used entries
//!   beyond [`MAX_TOTAL_BYTES`] are removed then.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use super::compile::{compile_into, RowBytes, RowSink};
use super::row::{Row, ROW_BYTES};
use super::MAX_ROWS;
use crate::events::{KernelTable, KernelTables, TableRows};
use crate::files::binary::Binary;
use crate::files::usercache::{self, SudoUser, TempFile};

/// The cache's directories under the user's cache directory.
const DIRS: [&str; 2] = ["sampler", "unwind"];

/// The entries' bound on the disk: 256 MiB. A Rust toolchain's two large libraries
/// (librustc_driver's 1.44 million rows, libLLVM's 1.15 million) take 31 MB, GCC's cc1
/// 6 MB, a C program and its libraries well under 1 MB: room for several toolchains.
const MAX_TOTAL_BYTES: u64 = 256 << 20;

/// The first bytes of an entry: its kind and version (2: the checksum of four lanes).
const MAGIC: [u8; 8] = *b"SMPLUNW\x02";

/// An entry's header: magic, then as 64-bit words its base, row count and checksum, the
/// file's size, device, inode, modification and change times (seconds and nanoseconds
/// each), then the build ID's length (32 bits) and the build ID (at most
/// [`MAX_BUILD_ID`] bytes), zero-padded to 160 bytes.
const HEADER_BYTES: usize = 160;

/// The longest build ID kept (a SHA-1 is 20 bytes; some linkers write longer ones).
const MAX_BUILD_ID: usize = 64;

/// Rows written at a time: 1 MiB of rows.
const BLOCK_ROWS: usize = (1 << 20) / ROW_BYTES;

/// Rows read at a time: 256 KiB of rows. A block read is handed on to the kernel and
/// then read over: a recording's memory holds one block at once; 1 MiB blocks were
/// at the top of a short recording's peak.
const READ_BLOCK_ROWS: usize = (256 << 10) / ROW_BYTES;

/// Permission bits of an entry: the user's alone (it says which files they profile).
const FILE_MODE: u32 = 0o600;

/// Where the kernel walker's tables come from: compiled, and kept in the cache when
/// there is one. See the module's description.
pub struct TableCache {
    /// The user's cache directory, which holds [`DIRS`]; `None`: no cache, every table
    /// is compiled.
    root: Option<PathBuf>,
    owner: Option<SudoUser>,
    /// Tables compiled this run, written beside their entries, to be renamed into place.
    pending: Mutex<Vec<TempFile>>,
    /// The directories made for `pending`: removed again, after its files, unless the
    /// run saves.
    made: usercache::MadeDirs,
}

impl TableCache {
    /// The cache of the user running sampler (under sudo, the invoking user's) when
    /// `enabled`; otherwise, or without a home directory, none.
    pub fn from_env(enabled: bool) -> TableCache {
        let owner = SudoUser::from_env();
        let root = enabled.then(|| usercache::user_cache_home(owner)).flatten();
        TableCache::at(root, owner)
    }

    /// The cache in the cache directory `root` (entries in `root/sampler/unwind`), or
    /// none.
    pub fn at(root: Option<PathBuf>, owner: Option<SudoUser>) -> TableCache {
        TableCache {
            root,
            owner,
            pending: Mutex::default(),
            made: usercache::MadeDirs::default(),
        }
    }

    /// Renames the tables compiled this run into place, then removes the least recently
    /// used entries beyond 256 MiB. Returns how many were written.
    pub fn save(&self) -> Result<usize, String> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let Some(root) = self.root.as_ref().filter(|_| !pending.is_empty()) else {
            return Ok(0);
        };
        self.made.keep();
        let dir = DIRS.iter().fold(root.clone(), |d, n| d.join(n));
        let mut names = Vec::new();
        let mut failed = None;
        let mut evict_from = None;
        for temp in pending {
            let name = temp.final_name().to_string();
            evict_from = evict_from.or_else(|| temp.dir().try_clone().ok());
            match temp.commit(self.owner, false) {
                Ok(()) => names.push(name),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(fd) = evict_from {
            let keep: Vec<&str> = names.iter().map(String::as_str).collect();
            usercache::evict(&fd, self.owner, &keep, MAX_TOTAL_BYTES, failed.is_some());
        }
        match failed {
            None => Ok(names.len()),
            Some(e) => Err(format!("cannot write into {}: {e}", dir.display())),
        }
    }

    /// The entry of `key`, checked but for its rows (checked as they are read).
    fn load(&self, key: &Key) -> Option<KernelTable> {
        let root = self.root.as_ref()?;
        let dir = usercache::open_dir(root, &DIRS, self.owner, false, PRIVATE).ok()?;
        let file = usercache::open_file(&dir, &key.file_name(), self.owner).ok()?;
        usercache::make_private(&file).ok()?;
        let mut header = [0u8; HEADER_BYTES];
        file.read_exact_at(&mut header, 0).ok()?;
        let (base, count, checksum) = key.check(&header)?;
        let len = file.metadata().ok()?.len();
        if len != (HEADER_BYTES + count * ROW_BYTES) as u64 {
            return None;
        }
        let _ = file.set_modified(SystemTime::now());
        let entry = Some((dir, key.file_name()));
        Some(CachedRows::table(file, base, count, checksum, entry))
    }

    /// Compiles the table of `binary` into a new file beside its entry; `None` when
    /// that file cannot be made or written (the table is then compiled in memory).
    fn compile_to_file(&self, binary: &Binary, key: &Key) -> Option<Result<KernelTable, String>> {
        let root = self.root.as_ref()?;
        let dir = usercache::make_dir(root, &DIRS, self.owner, PRIVATE, &self.made).ok()?;
        let temp = TempFile::create(dir, &key.file_name(), FILE_MODE).ok()?;
        let sink = FileSink {
            file: &temp.file,
            at: HEADER_BYTES as u64,
            tail: RowBytes::default(),
            written: 0,
            checksum: Checksum::default(),
            failed: None,
        };
        let table = match compile_into(&binary.path, &binary.reader(), sink) {
            Ok(table) => table,
            Err(why) => return Some(Err(why)),
        };
        let base = table.base;
        let (count, rows) = table.rows.finish().ok()?;
        let checksum = rows.with_seed(seed(base, count));
        temp.file
            .write_all_at(&key.header(base, count, checksum), 0)
            .ok()?;
        let file = temp.reopen().ok()?;
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(temp);
        Some(Ok(CachedRows::table(file, base, count, checksum, None)))
    }
}

impl std::fmt::Debug for TableCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableCache")
            .field("root", &self.root)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// The entries are their user's alone.
const PRIVATE: usercache::Access = usercache::Access::Private;

impl KernelTables for TableCache {
    fn table(&self, binary: &Binary) -> Result<KernelTable, String> {
        // Without a cache, the file's metadata is not even read.
        if let Some(key) = self.root.as_ref().and_then(|_| Key::of(binary)) {
            if let Some(table) = self.load(&key) {
                return Ok(table);
            }
            if let Some(table) = self.compile_to_file(binary, &key) {
                return table;
            }
        }
        super::kernel_table(&binary.path, &binary.reader())
    }
}

/// Which file an entry is for (see the module's description).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    build_id: Vec<u8>,
    /// Size, device, inode, modification and change times (seconds and nanoseconds).
    file: [u64; 7],
}

impl Key {
    fn of(binary: &Binary) -> Option<Key> {
        let m = binary.metadata()?;
        let id = binary.build_id.clone().unwrap_or_default();
        (id.len() <= MAX_BUILD_ID).then(|| Key {
            build_id: id,
            file: [
                m.len(),
                m.dev(),
                m.ino(),
                m.mtime() as u64,
                m.mtime_nsec() as u64,
                m.ctime() as u64,
                m.ctime_nsec() as u64,
            ],
        })
    }

    /// Its entry's name: the file's device and inode (one entry per file; a file
    /// written anew replaces its entry, and one replaced by another is evicted in
    /// time).
    fn file_name(&self) -> String {
        format!("{:x}-{:x}", self.file[1], self.file[2])
    }

    fn header(&self, base: u64, count: usize, checksum: u64) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[..8].copy_from_slice(&MAGIC);
        let words = [base, count as u64, checksum].into_iter().chain(self.file);
        for (i, word) in words.enumerate() {
            h[8 + i * 8..16 + i * 8].copy_from_slice(&word.to_le_bytes());
        }
        h[88..92].copy_from_slice(&(self.build_id.len() as u32).to_le_bytes());
        h[92..92 + self.build_id.len()].copy_from_slice(&self.build_id);
        h
    }

    /// The base, row count and checksum of an entry's header, when it is an entry of
    /// this key.
    fn check(&self, header: &[u8; HEADER_BYTES]) -> Option<(u64, usize, u64)> {
        let word = |i: usize| {
            let at = 8 + i * 8;
            u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"))
        };
        let (base, count, checksum) = (word(0), usize::try_from(word(1)).ok()?, word(2));
        let ours = self.header(base, count, checksum);
        (count <= MAX_ROWS && header[..] == ours[..]).then_some((base, count, checksum))
    }
}

/// What an entry's checksum starts from: its base and row count.
fn seed(base: u64, count: usize) -> u64 {
    base.rotate_left(17) ^ count as u64
}

/// A checksum of rows: row `i` is mixed into lane `i % 4`, and the lanes are folded
/// together at the end. Each step is one-to-one, so a change in any row changes its
/// lane; four lanes are four independent chains of multiplications, which a CPU runs
/// side by side (rustc's 2.8 million rows are checked in about a quarter of the time one
/// chain took). It guards against damage; what is in the user's cache is theirs, and the
/// kernel walker checks every row it follows anyway.
#[derive(Clone, Copy, Debug, Default)]
struct Checksum {
    lanes: [u64; 4],
    rows: u64,
}

/// One row mixed into a lane: its first 8 bytes, then its last 4.
fn mix_row(lane: u64, row: &[u8]) -> u64 {
    let mix = |h: u64, word: u64| {
        (h ^ word)
            .wrapping_mul(0xff51_afd7_ed55_8ccd)
            .rotate_left(29)
    };
    let first = row[..8].try_into().map_or(0, u64::from_le_bytes);
    let last = row[8..12].try_into().map_or(0, u32::from_le_bytes);
    mix(mix(lane, first), u64::from(last))
}

impl Checksum {
    /// Mixes in the rows of `bytes` (a whole number of rows).
    fn add_rows(&mut self, bytes: &[u8]) {
        let whole = bytes.len() - bytes.len() % ROW_BYTES;
        let mut rest = &bytes[..whole];
        while !self.rows.is_multiple_of(4) && !rest.is_empty() {
            self.add(&rest[..ROW_BYTES]);
            rest = &rest[ROW_BYTES..];
        }
        let mut quads = rest.chunks_exact(4 * ROW_BYTES);
        let [mut a, mut b, mut c, mut d] = self.lanes;
        for quad in &mut quads {
            a = mix_row(a, &quad[..ROW_BYTES]);
            b = mix_row(b, &quad[ROW_BYTES..2 * ROW_BYTES]);
            c = mix_row(c, &quad[2 * ROW_BYTES..3 * ROW_BYTES]);
            d = mix_row(d, &quad[3 * ROW_BYTES..]);
            self.rows += 4;
        }
        self.lanes = [a, b, c, d];
        for row in quads.remainder().chunks_exact(ROW_BYTES) {
            self.add(row);
        }
    }

    fn add(&mut self, row: &[u8]) {
        let lane = &mut self.lanes[(self.rows % 4) as usize];
        *lane = mix_row(*lane, row);
        self.rows += 1;
    }

    fn with_seed(self, seed: u64) -> u64 {
        self.lanes
            .into_iter()
            .fold(seed, |h, lane| {
                (h ^ lane)
                    .wrapping_mul(0xc4ce_b9fe_1a85_ec53)
                    .rotate_left(31)
            })
            .wrapping_mul(0xc4ce_b9fe_1a85_ec53)
    }
}

/// Rows written to a file as they are made, from byte `at` on, all but the last two
/// (which [`RowSink::pop_row`] may still take back) as soon as a block is full.
struct FileSink<'f> {
    file: &'f File,
    at: u64,
    tail: RowBytes,
    written: usize,
    checksum: Checksum,
    failed: Option<std::io::Error>,
}

impl FileSink<'_> {
    /// Writes all rows but the last `keep`.
    fn flush(&mut self, keep: usize) {
        let bytes = self.tail.bytes();
        let out = bytes.len().saturating_sub(keep * ROW_BYTES);
        if out == 0 || self.failed.is_some() {
            return;
        }
        self.checksum.add_rows(&bytes[..out]);
        match self.file.write_all_at(&bytes[..out], self.at) {
            Ok(()) => {
                self.at += out as u64;
                self.written += out / ROW_BYTES;
                self.tail.drain_front(out / ROW_BYTES);
            }
            Err(e) => self.failed = Some(e),
        }
    }

    /// Writes what is left: the row count and their checksum (without its seed).
    fn finish(mut self) -> std::io::Result<(usize, Checksum)> {
        self.flush(0);
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        Ok((self.written, self.checksum))
    }
}

impl RowSink for FileSink<'_> {
    fn last_row(&self) -> Option<Row> {
        self.tail.last_row()
    }
    fn pop_row(&mut self) {
        if self.tail.row_count() == 0 {
            self.failed = Some(std::io::Error::other(
                "a row taken back after it was written",
            ));
        }
        self.tail.pop_row();
    }
    fn push_row(&mut self, row: Row) {
        self.tail.push_row(row);
        if self.tail.row_count() >= BLOCK_ROWS {
            self.flush(2);
        }
    }
    fn row_count(&self) -> usize {
        self.written + self.tail.row_count()
    }
}

/// An entry's rows, read in blocks as they are given to the kernel, and checked.
struct CachedRows {
    file: File,
    count: usize,
    checksum: u64,
    seed: u64,
    /// The entry's directory and name (none for a table just compiled), so that a
    /// damaged entry is removed, and compiled anew by the next run.
    entry: Option<(OwnedFd, String)>,
}

impl CachedRows {
    /// The table of the entry `file`, from its header's base, row count and checksum.
    fn table(
        file: File,
        base: u64,
        count: usize,
        checksum: u64,
        entry: Option<(OwnedFd, String)>,
    ) -> KernelTable {
        let rows = CachedRows {
            file,
            count,
            checksum,
            seed: seed(base, count),
            entry,
        };
        KernelTable {
            base,
            count,
            rows: Box::new(rows),
        }
    }
}

impl CachedRows {
    /// Removes the entry, when it is still the file read (another run may have put a
    /// new one in its place meanwhile).
    fn remove_entry(&self) {
        let Some((dir, name)) = &self.entry else {
            return;
        };
        let same = usercache::regular_file_at(dir, std::ffi::OsStr::new(name)).is_some_and(|s| {
            self.file
                .metadata()
                .is_ok_and(|m| m.ino() == s.st_ino && m.dev() == s.st_dev)
        });
        if same {
            let _ = usercache::remove_file(dir, std::ffi::OsStr::new(name));
        }
    }

    /// [`TableRows::blocks`] without the removal of a damaged entry.
    fn read_blocks(
        &mut self,
        take: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut block = vec![0u8; READ_BLOCK_ROWS.min(self.count.max(1)) * ROW_BYTES];
        let mut checksum = Checksum::default();
        let mut left = self.count;
        let mut at = HEADER_BYTES as u64;
        // Below every row's start: the first row's start is not compared.
        let mut last_start = -1i64;
        let damaged = || DAMAGED.to_string();
        while left > 0 {
            let rows = left.min(READ_BLOCK_ROWS);
            let bytes = &mut block[..rows * ROW_BYTES];
            self.file
                .read_exact_at(bytes, at)
                .map_err(|e| format!("its cached unwind table could not be read: {e}"))?;
            for row in bytes.chunks_exact(ROW_BYTES) {
                let start = row[..4].try_into().map_or(0, u32::from_le_bytes);
                if i64::from(start) <= last_start {
                    return Err(damaged());
                }
                last_start = i64::from(start);
            }
            checksum.add_rows(bytes);
            take(bytes)?;
            at += bytes.len() as u64;
            left -= rows;
        }
        match checksum.with_seed(self.seed) == self.checksum {
            true => Ok(()),
            false => Err(damaged()),
        }
    }
}

impl TableRows for CachedRows {
    fn blocks(&mut self, take: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> {
        let read = self.read_blocks(take);
        if read.as_ref().is_err_and(|e| e.contains(DAMAGED)) {
            self.remove_entry();
        }
        read
    }
}

/// What a damaged entry is said to be.
const DAMAGED: &str = "its cached unwind table is damaged";

/// Reads an entry whole, for the tests.
#[cfg(test)]
fn read_rows(table: &mut KernelTable) -> Result<Vec<u8>, String> {
    let mut all = Vec::new();
    table.rows.blocks(&mut |b| {
        all.extend_from_slice(b);
        Ok(())
    })?;
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sampler's own test binary: a file with a build ID and thousands of FDEs.
    fn this_binary() -> Binary {
        let path = std::env::current_exe().unwrap();
        Binary::open(&path).unwrap()
    }

    fn compiled(binary: &Binary) -> KernelTable {
        super::super::kernel_table(&binary.path, &binary.reader()).unwrap()
    }

    #[test]
    fn the_checksum_is_the_same_however_the_rows_are_split_and_changes_with_any_row() {
        let rows: Vec<u8> = (0..37 * ROW_BYTES)
            .map(|i| (i * 7 + i / 13) as u8)
            .collect();
        let mut one_by_one = Checksum::default();
        rows.chunks_exact(ROW_BYTES).for_each(|r| one_by_one.add(r));
        let whole = one_by_one.with_seed(5);
        for split in [1, 3, 4, 5, 17, 36] {
            let mut parts = Checksum::default();
            parts.add_rows(&rows[..split * ROW_BYTES]);
            parts.add_rows(&rows[split * ROW_BYTES..]);
            assert_eq!(parts.with_seed(5), whole, "split after {split} rows");
        }
        for at in [0, 11, 12, 200, rows.len() - 1] {
            let mut changed = rows.clone();
            changed[at] ^= 0x10;
            let mut sum = Checksum::default();
            sum.add_rows(&changed);
            assert_ne!(sum.with_seed(5), whole, "byte {at} changed");
        }
        // Two rows of one lane (0 and 36) swapped: a lane's chain is in order.
        let mut swapped = rows.clone();
        swapped.copy_within(..ROW_BYTES, 36 * ROW_BYTES);
        swapped[..ROW_BYTES].copy_from_slice(&rows[36 * ROW_BYTES..]);
        let mut sum = Checksum::default();
        sum.add_rows(&swapped);
        assert_ne!(sum.with_seed(5), whole);
    }

    #[test]
    fn a_table_from_the_cache_has_the_rows_compiled_and_a_damaged_one_is_refused() {
        let scratch = crate::files::testdir::TestDir::new("table-cache");
        let binary = this_binary();
        let mut fresh = compiled(&binary);
        let expected = read_rows(&mut fresh).unwrap();
        assert!(fresh.count > 10_000, "{} rows", fresh.count);

        // A miss compiles into a file beside the entry, readable at once.
        let cache = TableCache::at(Some(scratch.path().to_path_buf()), None);
        let mut first = cache.table(&binary).unwrap();
        assert_eq!((first.base, first.count), (fresh.base, fresh.count));
        assert_eq!(read_rows(&mut first).unwrap(), expected);
        let entries = scratch.path().join("sampler/unwind");
        assert_eq!(std::fs::read_dir(&entries).unwrap().count(), 1);
        assert_eq!(cache.save(), Ok(1));
        let name = Key::of(&binary).unwrap().file_name();
        let entry = entries.join(&name);
        let len = std::fs::metadata(&entry).unwrap().len();
        assert_eq!(len, (HEADER_BYTES + fresh.count * ROW_BYTES) as u64);

        // A hit reads the same rows; nothing is written.
        let again = TableCache::at(Some(scratch.path().to_path_buf()), None);
        let mut second = again.load(&Key::of(&binary).unwrap()).unwrap();
        assert_eq!(read_rows(&mut second).unwrap(), expected);
        assert_eq!(again.save(), Ok(0));

        // One byte changed in the rows: refused as the rows are read.
        let mut bytes = std::fs::read(&entry).unwrap();
        bytes[HEADER_BYTES + 1000 * ROW_BYTES + 5] ^= 1;
        std::fs::write(&entry, &bytes).unwrap();
        let mut damaged = again.load(&Key::of(&binary).unwrap()).unwrap();
        assert_eq!(read_rows(&mut damaged), Err(DAMAGED.to_string()));
        assert!(!entry.exists(), "a damaged entry is removed");
        // Cut short: refused before any row is read.
        std::fs::write(&entry, &bytes[..bytes.len() - 1]).unwrap();
        assert!(again.load(&Key::of(&binary).unwrap()).is_none());
        // Another file's key: not used.
        let mut other = Key::of(&binary).unwrap();
        other.file[2] ^= 1;
        std::fs::write(&entry, &bytes).unwrap();
        assert!(again.load(&other).is_none());
    }

    #[test]
    fn without_a_cache_tables_are_compiled_and_nothing_is_written() {
        let scratch = crate::files::testdir::TestDir::new("table-cache-off");
        let binary = this_binary();
        let cache = TableCache::at(None, None);
        let mut table = cache.table(&binary).unwrap();
        assert_eq!(
            read_rows(&mut table).unwrap(),
            read_rows(&mut compiled(&binary)).unwrap()
        );
        assert_eq!(cache.save(), Ok(0));
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_table_not_saved_leaves_no_file_nor_directory() {
        let scratch = crate::files::testdir::TestDir::new("table-cache-unsaved");
        let binary = this_binary();
        {
            let cache = TableCache::at(Some(scratch.path().to_path_buf()), None);
            cache.table(&binary).unwrap();
            assert!(scratch.path().join("sampler/unwind").is_dir());
        }
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
    }
}
