//! The cache's directory: where it is and whose, its secret, reading an entry, writing
//! this run's entries atomically after the profile, and evicting the least recently
//! used beyond the bound.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use super::inflated;
use super::kernel_table::{self, KernelTable, TableBytes};
use super::key::kernel_key_with;
use super::{Entry, Key, Secret, MAX_ENTRY_BYTES, MAX_TOTAL_BYTES};
use crate::files::elf::Elf;
use crate::files::image::{At, Held};
use crate::files::usercache::SudoUser;
use crate::files::usercache::{self, TempFile};

/// The cache's directory under the user's cache directory, and the directory of symbol
/// entries within it (other caches may come beside it).
const DIRS: [&str; 2] = ["sampler", "symbols"];

/// Permission bits of an entry and of the secret: the user's alone. An entry says which
/// files the user profiles, and the kernel's entries where the kernel lies.
const FILE_MODE: u32 = 0o600;

/// The file of the cache's secret, in `sampler/` beside the entries' directory.
const SECRET_NAME: &str = "secret";

/// Entries of at least this many bytes are written as they are made, into files on
/// their way in (see [`Pending`]): 256 KiB. A build's profile makes a few entries of
/// 1-2 MB (rustc's libraries, cargo, libc), which held until the end took some 8 MB of
/// its peak memory; the many small ones stay in memory, so that a run holds few files
/// open.
const WRITTEN_AT_ONCE_BYTES: usize = 256 << 10;

/// The most entries written as they are made that a run holds open (three descriptors
/// each: the file, and its directory twice) before it keeps the rest in memory.
const MOST_WRITTEN_AT_ONCE: usize = 64;

/// An entry to put into the cache at [`SymbolCache::save`]: already written into a file
/// on its way in (removed unless saved: a run that fails leaves nothing), or its bytes,
/// in pieces to be written one after the other.
enum Pending {
    Written(TempFile),
    Bytes(String, Vec<Vec<u8>>),
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pending::Written(temp) => write!(f, "Written({})", temp.final_name()),
            Pending::Bytes(name, pieces) => {
                let size: usize = pieces.iter().map(Vec::len).sum();
                write!(f, "Bytes({name}, {size})")
            }
        }
    }
}

/// The symbol cache of one run: where it is, whose it is, and the entries to write.
#[derive(Debug)]
pub struct SymbolCache {
    /// The user's cache directory, which holds [`DIRS`].
    root: PathBuf,
    owner: Option<SudoUser>,
    pending: Mutex<Vec<Pending>>,
    /// How many of `pending` were written as they were made (or are being written).
    written_at_once: std::sync::atomic::AtomicUsize,
    /// The kernel table among `pending`, if any, and the prefix of the entries an older
    /// sampler kept of the same kernel (see `kernel_table::evict_other_tables`).
    kernel_table: Mutex<Option<(String, String)>>,
    /// Read or made once, when the kernel's entries are first needed.
    secret: std::sync::OnceLock<Option<Secret>>,
    /// The directories made for the entries written as they were made: removed again,
    /// after those entries' files (the fields before), unless the run saves.
    made: usercache::MadeDirs,
}

impl SymbolCache {
    /// The cache of the user running sampler (under sudo, the invoking user's); `None`
    /// when they have no home directory.
    pub fn from_env() -> Option<SymbolCache> {
        let owner = SudoUser::from_env();
        let root = usercache::user_cache_home(owner)?;
        Some(SymbolCache::at(root, owner))
    }

    /// The cache in the cache directory `root` (entries in `root/sampler/symbols`),
    /// owned by `owner` (else by whoever runs sampler). `root` is opened by path (a link
    /// there is the user's choice); no link below it is followed.
    pub fn at(root: PathBuf, owner: Option<SudoUser>) -> SymbolCache {
        SymbolCache {
            root,
            owner,
            pending: Mutex::default(),
            written_at_once: Default::default(),
            kernel_table: Mutex::default(),
            secret: std::sync::OnceLock::new(),
            made: usercache::MadeDirs::default(),
        }
    }

    /// The key of the running kernel's own symbols, whose text starts at `text_start`
    /// (see `kernel_key_with`); `None` when the kernel says no build ID, or the cache
    /// has no secret and cannot be given one. Its table is [`SymbolCache::load_kernel_table`].
    pub fn kernel_key(&self, text_start: u64) -> Option<Key> {
        let secret = self
            .secret
            .get_or_init(|| self.read_or_make_secret().ok())
            .as_ref()?;
        kernel_key_with(secret, text_start)
    }

    /// The cache's secret, made (16 bytes of the kernel's randomness) when there is none
    /// or it is damaged. Two runs that make one at once keep the first written.
    fn read_or_make_secret(&self) -> std::io::Result<Secret> {
        let dir = usercache::open_dir(&self.root, &DIRS[..1], self.owner, true, PRIVATE)?;
        let read = || -> std::io::Result<Option<Secret>> {
            let file = usercache::open_file(&dir, SECRET_NAME, self.owner)?;
            usercache::make_private(&file)?;
            let mut bytes = Vec::new();
            file.take(17).read_to_end(&mut bytes)?;
            Ok(bytes.try_into().ok().map(Secret))
        };
        let damaged = match read() {
            Ok(Some(secret)) => return Ok(secret),
            Ok(None) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        let mut secret = [0u8; 16];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut secret)?;
        let mut temp = TempFile::create(dir.try_clone()?, SECRET_NAME, FILE_MODE)?;
        temp.file.write_all(&secret)?;
        let written = match damaged {
            true => temp.commit(self.owner, true),
            false => temp.commit_new(self.owner, true),
        };
        match written {
            Ok(()) => Ok(Secret(secret)),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                read()?.ok_or_else(|| std::io::Error::other("the cache's secret is damaged"))
            }
            Err(e) => Err(e),
        }
    }

    /// Where the entries are.
    pub fn dir(&self) -> PathBuf {
        DIRS.iter()
            .fold(self.root.clone(), |dir, name| dir.join(name))
    }

    /// The entry of `key`, when there is one and it is sound; its use is recorded (its
    /// modification time), which keeps it from eviction.
    pub fn load(&self, key: &Key) -> Option<Entry> {
        self.read(&key.file_name(), |bytes| Entry::parse(bytes, key).ok())
    }

    /// The kernel table of `key` ([`SymbolCache::kernel_key`]), when there is one and
    /// it is sound; its use is recorded as an entry's is.
    pub fn load_kernel_table(&self, key: &Key, lookups: usize) -> Option<KernelTable> {
        let (file, len) = self.open_entry(&kernel_table::file_name(key))?;
        let used = file.try_clone();
        let table = KernelTable::open(file, len, key, lookups).ok()?;
        if let Ok(used) = used {
            let _ = used.set_modified(SystemTime::now());
        }
        Some(table)
    }

    /// What `read` makes of the inflated copy of the debug file with build ID `build_id`
    /// that `at` reads (the copy parsed, and a reader of it): the one in the cache when
    /// it was made from that very file (its use is then recorded as an entry's is), else
    /// with `make` one made now. `None` when there is none, or `read` makes nothing of it.
    ///
    /// A copy made now is written into a new file on its way in, the directories made if
    /// need be, and kept as a large entry is: renamed into the cache when the run saves,
    /// else removed. None is made when the file is not one to copy, the directory cannot
    /// take it, or too many files are held open already.
    pub fn with_inflated<T>(
        &self,
        build_id: &[u8],
        at: &At,
        make: bool,
        read: impl Fn(&Elf<'_, &object::ReadCache<At>>, &At) -> Option<T>,
    ) -> Option<T> {
        let identity = at.identity()?;
        let name = inflated::file_name(build_id);
        if let Some((file, _)) = self.open_entry(&name) {
            let file = std::sync::Arc::new(file);
            if let Some(made) = read_copy(&file, Some(&identity), &read) {
                let _ = file.set_modified(SystemTime::now());
                return Some(made);
            }
        }
        if !make {
            return None;
        }
        let reader = object::ReadCache::new(at.clone());
        let elf = Elf::parse(&reader)?;
        if !self.take_open_place() {
            return None;
        }
        let dir = usercache::make_dir(&self.root, &DIRS, self.owner, PRIVATE, &self.made).ok()?;
        let mut temp = TempFile::create(dir, &name, FILE_MODE).ok()?;
        inflated::write(&elf, at, &identity, &mut temp.file, MAX_ENTRY_BYTES).ok()?;
        let file = std::sync::Arc::new(temp.file.try_clone().ok()?);
        let made = read_copy(&file, None, &read)?;
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Pending::Written(temp));
        Some(made)
    }

    /// Takes one of the [`MOST_WRITTEN_AT_ONCE`] places among the files held open until
    /// the run saves; `false` when none is left.
    fn take_open_place(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.written_at_once
            .fetch_update(Relaxed, Relaxed, |n| {
                (n < MOST_WRITTEN_AT_ONCE).then_some(n + 1)
            })
            .is_ok()
    }

    /// The file `name` of the entries' directory, opened as the cache's own (its owner
    /// checked, no link followed, made private), and its length: `None` when it is not
    /// there or is larger than [`MAX_ENTRY_BYTES`].
    fn open_entry(&self, name: &str) -> Option<(std::fs::File, u64)> {
        let dir = usercache::open_dir(&self.root, &DIRS, self.owner, false, PRIVATE).ok()?;
        let file = usercache::open_file(&dir, name, self.owner).ok()?;
        usercache::make_private(&file).ok()?;
        let len = file.metadata().ok()?.len();
        (len <= MAX_ENTRY_BYTES).then_some((file, len))
    }

    /// The file `name` of the entries' directory, read whole (at most
    /// [`MAX_ENTRY_BYTES`]) and checked by `parse`; when sound, its use is recorded.
    fn read<T>(&self, name: &str, parse: impl FnOnce(Vec<u8>) -> Option<T>) -> Option<T> {
        let (file, len) = self.open_entry(name)?;
        let mut bytes = Vec::with_capacity(len as usize);
        (&file)
            .take(MAX_ENTRY_BYTES + 1)
            .read_to_end(&mut bytes)
            .ok()?;
        let parsed = parse(bytes)?;
        let _ = file.set_modified(SystemTime::now());
        Some(parsed)
    }

    /// Keeps `table` to be written as the kernel table of `key` by [`SymbolCache::save`],
    /// which then removes the tables of other boots beyond the last few, and the entries
    /// an older sampler kept of this kernel.
    pub fn put_kernel_table(&self, key: &Key, table: TableBytes) {
        if table.size() <= MAX_ENTRY_BYTES {
            let name = kernel_table::file_name(key);
            let legacy = format!("{}-", crate::symbolicate::debuginfod::hex(&key.build_id));
            *self.kernel_table.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((name.clone(), legacy));
            self.keep(name, table.into_pieces());
        }
    }

    /// Keeps `bytes` (an entry [`super::EntryBuilder::finish`] made) to be written as the entry
    /// of `key` by [`SymbolCache::save`].
    pub fn put(&self, key: &Key, bytes: Vec<u8>) {
        if bytes.len() as u64 <= MAX_ENTRY_BYTES {
            self.keep(key.file_name(), vec![bytes]);
        }
    }

    /// Keeps entry `name` of the bytes of `pieces` (one after the other) for
    /// [`SymbolCache::save`]: a large one written at once into a file on its way in (see
    /// [`WRITTEN_AT_ONCE_BYTES`]), the directories made if need be (a run that does not
    /// save removes the file, then the directories it made), else its bytes.
    fn keep(&self, name: String, pieces: Vec<Vec<u8>>) {
        // A place among the files held open, taken before writing (outside the lock, so
        // that other workers keep theirs meanwhile).
        let size: usize = pieces.iter().map(Vec::len).sum();
        let write = size >= WRITTEN_AT_ONCE_BYTES && self.take_open_place();
        let entry = match write {
            true => match self.write_temp(&name, &pieces) {
                Ok(temp) => Pending::Written(temp),
                // A full disk: tried again, and reported, as the run saves.
                Err(_) => Pending::Bytes(name, pieces),
            },
            false => Pending::Bytes(name, pieces),
        };
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(entry);
    }

    /// The bytes of `pieces` written into a new file on its way in to be entry `name`,
    /// in the entries' directory, made if need be.
    fn write_temp(&self, name: &str, pieces: &[Vec<u8>]) -> std::io::Result<TempFile> {
        let dir = usercache::make_dir(&self.root, &DIRS, self.owner, PRIVATE, &self.made)?;
        write_new(dir, name, pieces)
    }

    /// Writes the entries kept by [`SymbolCache::put`], then evicts the least recently
    /// used entries beyond [`MAX_TOTAL_BYTES`]. Returns how many were written, or why
    /// not all could be: after a write that failed (a full disk, a quota), the cache is
    /// halved as well, so that it does not keep its file system full.
    pub fn save(&self) -> Result<usize, String> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if pending.is_empty() {
            return Ok(0);
        }
        let cannot = |e: std::io::Error| format!("cannot write into {}: {e}", self.dir().display());
        // Saved: the directories stay, whatever is written into them below.
        self.made.keep();
        let dir =
            usercache::open_dir(&self.root, &DIRS, self.owner, true, PRIVATE).map_err(cannot)?;
        let mut written: Vec<String> = Vec::new();
        let mut failed = None;
        for entry in pending {
            let made_before = matches!(entry, Pending::Written(_));
            let (name, write) = match entry {
                Pending::Written(temp) => (temp.final_name().to_string(), Ok(temp)),
                Pending::Bytes(name, pieces) => {
                    let temp = dir
                        .try_clone()
                        .and_then(|dir| write_new(dir, &name, &pieces));
                    (name, temp)
                }
            };
            // Not flushed to disk: an entry cut short by a crash fails its checks and is
            // rebuilt, which is cheaper than waiting for the disk on every run.
            match write.and_then(|temp| temp.commit(self.owner, false)) {
                Ok(()) => written.push(name),
                // Taken for a file left by a dead process (a run that named for more
                // than `usercache::STALE_TEMP`): this entry only is not kept.
                Err(e) if made_before && e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let table = self
            .kernel_table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((name, legacy)) = table.filter(|(name, _)| written.contains(name)) {
            kernel_table::evict_other_tables(&dir, &name, &legacy);
        }
        let kept: Vec<&str> = written.iter().map(String::as_str).collect();
        let evicted = usercache::evict(&dir, self.owner, &kept, MAX_TOTAL_BYTES, failed.is_some());
        match failed {
            None => Ok(written.len()),
            Some(e) => Err(format!(
                "{}; {} entries ({}) removed to make room",
                cannot(e),
                evicted.0,
                crate::symbolicate::debuginfod::size(evicted.1)
            )),
        }
    }
}

/// The bytes of `pieces`, one after the other, written into a new file of `dir` on its
/// way in to be entry `name`.
fn write_new(
    dir: std::os::fd::OwnedFd,
    name: &str,
    pieces: &[Vec<u8>],
) -> std::io::Result<TempFile> {
    let mut temp = TempFile::create(dir, name, FILE_MODE)?;
    for piece in pieces {
        temp.file.write_all(piece)?;
    }
    Ok(temp)
}

/// What `read` makes of the inflated copy open as `file` (parsed, its every section
/// inside what the file holds), when it was made from the file whose identity is
/// `identity` (unless `None`: a copy just made).
fn read_copy<T>(
    file: &std::sync::Arc<std::fs::File>,
    identity: Option<&[u64; 5]>,
    read: impl Fn(&Elf<'_, &object::ReadCache<At>>, &At) -> Option<T>,
) -> Option<T> {
    let held = Held::of(file).ok()?;
    let copy = At::of_file(file.clone());
    let reader = object::ReadCache::new(copy.clone());
    let elf = Elf::parse_held(&reader, Some(&held)).ok()?;
    if identity.is_some_and(|identity| !inflated::made_from(&elf, &copy, identity)) {
        return None;
    }
    read(&elf, &copy)
}

/// The symbol cache is its user's alone (see the module's text).
const PRIVATE: usercache::Access = usercache::Access::Private;

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::time::Duration;

    use super::*;
    use crate::files::usercache::{evict, STALE_TEMP};

    #[test]
    fn eviction_removes_the_least_recently_used_beyond_the_bound() {
        let scratch = crate::files::testdir::TestDir::new("evict");
        let cache = SymbolCache::at(scratch.path().to_path_buf(), None);
        let fd = usercache::open_dir(scratch.path(), &DIRS, None, true, PRIVATE).unwrap();
        let entries = cache.dir();
        let old = SystemTime::now() - Duration::from_secs(2 * STALE_TEMP.as_secs());
        let plant = |names: &[&str]| {
            for (i, name) in names.iter().enumerate() {
                std::fs::write(entries.join(name), vec![0u8; 100]).unwrap();
                let file = std::fs::File::options()
                    .write(true)
                    .open(entries.join(name))
                    .unwrap();
                file.set_modified(old + Duration::from_secs(i as u64 * 10))
                    .unwrap();
            }
        };
        let left = || {
            let mut left: Vec<String> = std::fs::read_dir(&entries)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            left.sort();
            left
        };
        plant(&["a", "b", "c", "d"]);
        let stale = format!("{}1-2.x", usercache::TEMP_PREFIX);
        std::fs::write(entries.join(&stale), b"left by a dead process").unwrap();
        std::fs::File::options()
            .write(true)
            .open(entries.join(&stale))
            .unwrap()
            .set_modified(old)
            .unwrap();
        // What 100 bytes take of the disk: a block.
        let block = std::fs::metadata(entries.join("a")).unwrap().blocks() * 512;
        assert!(block >= 512, "{block}");
        // "a" is the oldest but was just written; "b" and "c" go: counted by their
        // length (400 bytes), all four would stay.
        assert_eq!(evict(&fd, None, &["a"], 2 * block, false), (2, 2 * block));
        assert_eq!(left(), ["a", "d"]);
        // A write failed: half of what is there goes, least recently used first.
        plant(&["e", "f", "g", "h", "i", "j"]);
        assert_eq!(evict(&fd, None, &[], u64::MAX, true), (4, 4 * block));
        assert_eq!(left(), ["d", "h", "i", "j"]);
    }

    /// A large entry is written as it is made, into a file on its way in: no entry until
    /// the run saves, and gone when the run ends without saving (a run that fails leaves
    /// nothing); a small one is held in memory until then.
    #[test]
    fn large_entries_are_written_as_made_and_kept_only_when_saved() {
        let scratch = crate::files::testdir::TestDir::new("written-at-once");
        // The directory a run before made.
        usercache::open_dir(scratch.path(), &DIRS, None, true, PRIVATE).unwrap();
        let cache_at = || SymbolCache::at(scratch.path().to_path_buf(), None);
        let names = || {
            let mut names: Vec<String> = std::fs::read_dir(cache_at().dir())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            names
        };
        let key = |n: u8| Key {
            build_id: vec![n; 20],
            size: 1,
            stamp: Default::default(),
        };
        let (large, small) = (vec![7u8; WRITTEN_AT_ONCE_BYTES], vec![9u8; 100]);
        {
            let cache = cache_at();
            cache.put(&key(1), large.clone());
            cache.put(&key(2), small.clone());
            let now = names();
            assert_eq!(now.len(), 1, "{now:?}");
            assert!(now[0].starts_with(usercache::TEMP_PREFIX), "{now:?}");
            assert!(now[0].ends_with(&key(1).file_name()), "{now:?}");
        }
        assert!(names().is_empty(), "{:?}", names());
        let cache = cache_at();
        cache.put(&key(1), large.clone());
        cache.put(&key(2), small.clone());
        assert_eq!(cache.save(), Ok(2));
        let mut saved = vec![key(1).file_name(), key(2).file_name()];
        saved.sort();
        assert_eq!(names(), saved);
        let read = |n: u8| std::fs::read(cache.dir().join(key(n).file_name())).unwrap();
        assert!(read(1) == large && read(2) == small);
        // A file on its way in that another run took for a dead process's and removed
        // (after an hour): that entry only is not kept, and the save goes on.
        let cache = cache_at();
        cache.put(&key(3), large.clone());
        cache.put(&key(4), small.clone());
        let temp = names()
            .into_iter()
            .find(|n| n.starts_with(usercache::TEMP_PREFIX))
            .unwrap();
        std::fs::remove_file(cache.dir().join(temp)).unwrap();
        assert_eq!(cache.save(), Ok(1));
        assert!(names().contains(&key(4).file_name()));
        assert!(!names().contains(&key(3).file_name()));

        // A first run: no directory yet. A large entry makes it, and a run that does not
        // save leaves no directory behind; one that saves keeps it.
        let first = crate::files::testdir::TestDir::new("written-at-once-first");
        let root = first.path().join("cache");
        let first_at = || SymbolCache::at(root.clone(), None);
        {
            let cache = first_at();
            cache.put(&key(5), large.clone());
            assert!(cache.dir().is_dir());
        }
        assert!(
            !root.exists(),
            "a run that did not save left {}",
            root.display()
        );
        let cache = first_at();
        cache.put(&key(5), large.clone());
        assert_eq!(cache.save(), Ok(1));
        drop(cache);
        assert!(first_at().dir().join(key(5).file_name()).is_file());
    }

    /// Ten boots of one kernel, each run writing its table (as large as this machine's
    /// kernel makes it, when kallsyms shows its addresses): the cache keeps three of
    /// them, some 12 MB of the disk, where one entry per 64 KiB of text for each boot
    /// took 15 MB a boot (150 MB for ten, all kept below the 256 MiB bound).
    #[test]
    fn ten_boots_of_kernel_tables_take_under_50_mb() {
        let real = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        let text = match crate::symbolicate::read_kallsyms() {
            Some(k) if k.own.is_some() => real,
            // A kernel of this one's size: 120,000 functions in 30 MB of text.
            _ => (0..120_000u64)
                .map(|i| {
                    format!(
                        "{:x} t some_kernel_function_{i}\n",
                        0xffff_ffff_8100_0000u64 + i * 256
                    )
                })
                .collect(),
        };
        let base = crate::symbolicate::Kallsyms::parse(&text, "")
            .unwrap()
            .text_start;
        let scratch = crate::files::testdir::TestDir::new("ten-boots");
        let cache = SymbolCache::at(scratch.path().to_path_buf(), None);
        let mut one = 0;
        for boot in 0..10u64 {
            // What the keyed hash of this boot's ID (and text start) would be.
            let key = Key {
                build_id: vec![0xbe; 20],
                size: 0x1000 + boot,
                stamp: Default::default(),
            };
            let bytes = crate::symbolicate::kernel_table(&text, base, &key).unwrap();
            one = bytes.size();
            cache.put_kernel_table(&key, bytes);
            assert_eq!(cache.save(), Ok(1));
            assert!(cache.load_kernel_table(&key, 1).is_some(), "boot {boot}");
        }
        let files: Vec<_> = std::fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        let disk: u64 = files
            .iter()
            .map(|e| e.metadata().unwrap().blocks() * 512)
            .sum();
        eprintln!(
            "one table: {one} bytes; after ten boots: {} files, {disk} bytes of the disk",
            files.len()
        );
        assert_eq!(files.len(), kernel_table::KEPT);
        assert!(disk < 50 << 20, "{disk}");
        let last = Key {
            build_id: vec![0xbe; 20],
            size: 0x1000 + 9,
            stamp: Default::default(),
        };
        assert!(cache.load_kernel_table(&last, 1).is_some());
    }
}
