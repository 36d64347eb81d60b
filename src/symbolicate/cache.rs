//! The symbol cache: what symbolication learned about a file (whole functions: their
//! symbol, and for every piece of their code the inline chain with files and lines),
//! kept between runs so that a later run that needs only those functions opens neither
//! the file's separate debug file nor its DWARF. Reading libc's debug information is
//! most of the time and memory a short recording spends after its command ends.
//!
//! - Where: `$XDG_CACHE_HOME/sampler/symbols/`, else `~/.cache/sampler/symbols/`; under
//!   sudo the invoking user's, created and written as [`crate::usercache`] does.
//! - Key: one entry per file, named after its build ID and size (`HEX-SIZE`); files
//!   without a build ID are not cached. The entry holds the file's device, inode,
//!   modification and change times ([`Stamp`]) and is used only for that very file: a
//!   file rebuilt with a fixed build ID and the same size is another file (its change
//!   time at least differs, and nobody can set that back). The entry also records where the file's debug
//!   information came from (its own sections, a separate debug file by path, device,
//!   inode, size and modification time, or none), and is used only when the same source
//!   would be used now (see [`predict_source`]): installing or removing a debug package,
//!   or another `--debug-root`, makes the entry stale, and it is rebuilt.
//! - Format: one flat, little-endian buffer (see [`Entry`]) that can be used where it
//!   lies, memory-mapped or, as here, read whole; checked entirely before use (magic,
//!   version, length, checksum, every offset and index in range, sorted intervals,
//!   UTF-8 names). A truncated or damaged entry is ignored and rebuilt.
//! - Bounds: [`MAX_ENTRY_BYTES`] per entry and [`MAX_TOTAL_BYTES`] on the disk (the
//!   blocks the entries take, not their length) for the directory, least recently used
//!   entries (by modification time, which every use renews) evicted after each write;
//!   a write that fails (a full disk) halves the cache, so that it never keeps its file
//!   system full.
//! - Privacy: the directories are the user's alone (0700, made so when found open to
//!   others), entries 0600. The kernel's entries are named after a keyed hash of the
//!   boot and of where the kernel's text starts (see [`SymbolCache::kernel_key`]), with
//!   a random secret kept in the cache (`sampler/secret`, 0600): from public facts
//!   (build ID, boot ID) and an entry's name nobody can work out the kernel's address.
//! - Writes: atomic (a new file beside the entry, renamed over it), after the profile is
//!   written ([`SymbolCache::save`]), so they never delay it; a failure only means the
//!   next run reads the debug information again.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::{AddressInfo, LibFacts, SourceFrame, Symbol, SymbolOptions};
use crate::binary::Binary;
use crate::emit::output::SudoUser;
use crate::usercache::{self, TempFile};

/// The cache's directory under the user's cache directory, and the directory of symbol
/// entries within it (other caches may come beside it).
const DIRS: [&str; 2] = ["sampler", "symbols"];

/// The largest entry written or read: 32 MiB. An entry holds only the functions
/// profiles needed, about 1 KB each with their inline chains (libc's, after a dozen
/// different programs, is tens of KB); a file whose profiled functions fill 32 MiB
/// (some 30,000 functions) is better served by reading its DWARF than by a cache of that
/// size that each run must read and check whole.
pub const MAX_ENTRY_BYTES: u64 = 32 << 20;

/// The most the cache directory holds: 256 MiB, the size of one large debug file, and
/// room for the entries of hundreds of libraries profiled often; past it the least
/// recently used entries go.
pub const MAX_TOTAL_BYTES: u64 = 256 << 20;

/// The longest one run spends removing entries: 1 s. A removal is microseconds on most
/// file systems, but milliseconds where blocks are discarded as they are freed (2.2 ms
/// each on ext4 mounted with `discard`): the 34,000 entries a cache of 100,000 small
/// ones had to give up took 125 s there. What is left over goes in later runs.
const EVICT_TIME: Duration = Duration::from_secs(1);

/// A file on its way into the cache that is this old was left by a process that died
/// while writing it (a write takes milliseconds).
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// Permission bits of an entry and of the secret: the user's alone. An entry says which
/// files the user profiles, and the kernel's entries where the kernel lies.
const FILE_MODE: u32 = 0o600;

/// The file of the cache's secret, in `sampler/` beside the entries' directory.
const SECRET_NAME: &str = "secret";

/// The cache's secret: a key of [`siphash`], 16 random bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret([u8; 16]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The longest build ID cached: 64 bytes, four times the usual SHA-1's 20, so that the
/// entry's name stays far below the 255 bytes a file name can have.
const MAX_BUILD_ID: usize = 64;

/// What identifies a file's entry: its build ID and size, which name it, and which
/// file on the disk it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    pub build_id: Vec<u8>,
    pub size: u64,
    pub stamp: Stamp,
}

/// Which file on the disk, in which version: its device and inode, modification and
/// change times. A file written anew (even in place, with its modification time put
/// back) has another change time; a copy or a reinstalled package is another inode, and
/// is named afresh once. Zero for the kernel, which is no file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub ctime: i64,
    pub ctime_nsec: u32,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Option<Stamp> {
        Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime: m.mtime(),
            mtime_nsec: u32::try_from(m.mtime_nsec()).ok()?,
            ctime: m.ctime(),
            ctime_nsec: u32::try_from(m.ctime_nsec()).ok()?,
        })
    }
}

impl Key {
    /// The key of `binary`; `None` without a build ID (or an implausibly long one), or
    /// when it was read from memory (no file to tell versions apart).
    pub fn of(binary: &Binary) -> Option<Key> {
        let id = binary.build_id.as_ref()?;
        let meta = binary.metadata()?;
        let stamp = Stamp::of(&meta)?;
        (!id.is_empty() && id.len() <= MAX_BUILD_ID).then(|| Key {
            build_id: id.clone(),
            size: meta.len(),
            stamp,
        })
    }

    pub(crate) fn file_name(&self) -> String {
        format!("{}-{:x}", crate::debuginfod::hex(&self.build_id), self.size)
    }
}

/// The key of the running kernel's own symbols (`/proc/kallsyms`), whose text starts at
/// `text_start`, in the cache whose secret is `secret`: its build ID, and in place of a
/// size a fingerprint of the boot and of the text start, since where the kernel's code
/// lies is chosen at random at each boot. The fingerprint is keyed with the secret: the
/// build ID and the boot ID can be read by everyone, and the text start has only some
/// hundreds of possible values, so an unkeyed one would give the address away.
fn kernel_key_with(secret: &Secret, text_start: u64) -> Option<Key> {
    let notes = std::fs::read("/sys/kernel/notes").ok()?;
    let build_id = gnu_build_id(&notes)?;
    let mut boot = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    boot.extend_from_slice(&text_start.to_le_bytes());
    (!build_id.is_empty() && build_id.len() <= MAX_BUILD_ID).then(|| Key {
        build_id: build_id.to_vec(),
        size: siphash(&secret.0, &boot),
        stamp: Stamp::default(),
    })
}

/// SipHash-2-4 of `data` under `key` (Aumasson and Bernstein, 2012): a keyed hash made
/// for short inputs, from which nobody without the key learns anything of the input.
fn siphash(key: &[u8; 16], data: &[u8]) -> u64 {
    let k0 = u64::from_le_bytes(key[..8].try_into().expect("8 bytes"));
    let k1 = u64::from_le_bytes(key[8..].try_into().expect("8 bytes"));
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let rounds = |v: &mut [u64; 4], n: usize| {
        for _ in 0..n {
            v[0] = v[0].wrapping_add(v[1]);
            v[1] = v[1].rotate_left(13) ^ v[0];
            v[0] = v[0].rotate_left(32);
            v[2] = v[2].wrapping_add(v[3]);
            v[3] = v[3].rotate_left(16) ^ v[2];
            v[0] = v[0].wrapping_add(v[3]);
            v[3] = v[3].rotate_left(21) ^ v[0];
            v[2] = v[2].wrapping_add(v[1]);
            v[1] = v[1].rotate_left(17) ^ v[2];
            v[2] = v[2].rotate_left(32);
        }
    };
    let compress = |v: &mut [u64; 4], m: u64| {
        v[3] ^= m;
        rounds(v, 2);
        v[0] ^= m;
    };
    let mut chunks = data.chunks_exact(8);
    for chunk in chunks.by_ref() {
        compress(
            &mut v,
            u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
        );
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    compress(&mut v, u64::from_le_bytes(last) | (data.len() as u64) << 56);
    v[2] ^= 0xff;
    rounds(&mut v, 4);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

impl Key {
    /// The key of one piece of the kernel's symbols (see
    /// [`super::KERNEL_PIECE_BYTES`]), from the kernel's own key ([`kernel_key`]).
    pub fn kernel_piece(&self, piece: u64) -> Key {
        let mut fingerprint = self.size.to_le_bytes().to_vec();
        fingerprint.extend_from_slice(&piece.to_le_bytes());
        Key {
            build_id: self.build_id.clone(),
            size: checksum(&fingerprint),
            stamp: Stamp::default(),
        }
    }
}

/// The ELF note type of a build ID, as the ELF gABI's GNU extensions number it.
const NT_GNU_BUILD_ID: u32 = 3;

/// The build ID among ELF notes (`NT_GNU_BUILD_ID` of owner `GNU`).
fn gnu_build_id(mut notes: &[u8]) -> Option<&[u8]> {
    let padded = |n: usize| n.checked_next_multiple_of(4);
    while notes.len() >= 12 {
        let (name_size, desc_size) = (u32_at(notes, 0) as usize, u32_at(notes, 4) as usize);
        let kind = u32_at(notes, 8);
        let desc_at = 12usize.checked_add(padded(name_size)?)?;
        let end = desc_at.checked_add(padded(desc_size)?)?;
        let name = notes.get(12..12 + name_size)?;
        let desc = notes.get(desc_at..desc_at + desc_size)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return Some(desc);
        }
        notes = notes.get(end..)?;
    }
    None
}

/// Where a file's debug information came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DebugSource {
    /// The file's own DWARF and symbol table: nothing else is read.
    Own,
    /// A separate debug file, as it was when it was read.
    File { path: PathBuf, identity: Identity },
    /// None was found, and none could have been fetched.
    Missing,
}

/// What tells one version of a file from another without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
}

impl Identity {
    /// The identity of the file at `path` (through links, as it is read).
    pub fn of(path: &Path) -> Option<Identity> {
        let m = std::fs::metadata(path).ok()?;
        Some(Identity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: u32::try_from(m.mtime_nsec()).ok()?,
        })
    }
}

/// Which debug information a full load of `binary` (mapped from `mapped_path`) would
/// use now, found by looking at paths only, never reading a file: `None` when that
/// cannot be told so (a candidate path holds a file that may not match, or debuginfod
/// would be asked). [`super::LibSymbols::load`] takes the first candidate that matches;
/// a candidate that exists is taken to be the one, and the entry made from it names it
/// with its identity, so a changed or different file is never mistaken for it.
pub fn predict_source(
    binary: &Binary,
    mapped_path: &str,
    opts: &SymbolOptions,
) -> Option<DebugSource> {
    if binary.has_dwarf && binary.has_symtab {
        return Some(DebugSource::Own);
    }
    let candidates = crate::locate::debug_candidates(binary, mapped_path, &opts.debug_roots);
    let found = |path: PathBuf| {
        let identity = Identity::of(&path)?;
        Some(DebugSource::File { path, identity })
    };
    if let Some(first) = candidates
        .into_iter()
        .map(|(path, _)| path)
        .find(|path| std::fs::symlink_metadata(path).is_ok())
    {
        return found(first);
    }
    match (&opts.debuginfod, &binary.build_id) {
        (Some(client), Some(id)) => found(client.cached_path(id)?),
        _ => Some(DebugSource::Missing),
    }
}

/// The symbol cache of one run: where it is, whose it is, and the entries to write.
#[derive(Debug)]
pub struct SymbolCache {
    /// The user's cache directory, which holds [`DIRS`].
    root: PathBuf,
    owner: Option<SudoUser>,
    pending: Mutex<Vec<(String, Vec<u8>)>>,
    /// Read or made once, when the kernel's entries are first needed.
    secret: std::sync::OnceLock<Option<Secret>>,
}

impl SymbolCache {
    /// The cache of the user running sampler (under sudo, the invoking user's); `None`
    /// when they have no home directory.
    pub fn from_env() -> Option<SymbolCache> {
        let owner = SudoUser::from_env();
        let home = usercache::user_home(owner);
        let xdg = std::env::var("XDG_CACHE_HOME").ok();
        let root = usercache::cache_home(xdg.as_deref(), home.as_deref())?;
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
            secret: std::sync::OnceLock::new(),
        }
    }

    /// The key of the running kernel's own symbols, whose text starts at `text_start`
    /// (see [`kernel_key_with`]); `None` when the kernel says no build ID, or the cache
    /// has no secret and cannot be given one. Each piece's key is made from it
    /// ([`Key::kernel_piece`]).
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
        let dir = usercache::open_dir(&self.root, &DIRS, self.owner, false, PRIVATE).ok()?;
        let file = usercache::open_file(&dir, &key.file_name(), self.owner).ok()?;
        usercache::make_private(&file).ok()?;
        let len = file.metadata().ok()?.len();
        if len > MAX_ENTRY_BYTES {
            return None;
        }
        let mut bytes = Vec::with_capacity(len as usize);
        (&file)
            .take(MAX_ENTRY_BYTES + 1)
            .read_to_end(&mut bytes)
            .ok()?;
        let entry = Entry::parse(bytes, key).ok()?;
        let _ = file.set_modified(SystemTime::now());
        Some(entry)
    }

    /// Keeps `bytes` (an entry [`EntryBuilder::finish`] made) to be written as the entry
    /// of `key` by [`SymbolCache::save`].
    pub fn put(&self, key: &Key, bytes: Vec<u8>) {
        if bytes.len() as u64 <= MAX_ENTRY_BYTES {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((key.file_name(), bytes));
        }
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
        let dir =
            usercache::open_dir(&self.root, &DIRS, self.owner, true, PRIVATE).map_err(cannot)?;
        let mut written = Vec::new();
        let mut failed = None;
        for (name, bytes) in &pending {
            let write = || -> std::io::Result<()> {
                let mut temp = TempFile::create(dir.try_clone()?, name, FILE_MODE)?;
                temp.file.write_all(bytes)?;
                // Not flushed to disk: an entry cut short by a crash fails its checks and
                // is rebuilt, which is cheaper than waiting for the disk on every run.
                temp.commit(self.owner, false)
            };
            match write() {
                Ok(()) => written.push(name.as_str()),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let evicted = evict(
            &dir,
            self.owner,
            &written,
            MAX_TOTAL_BYTES,
            failed.is_some(),
        );
        match failed {
            None => Ok(written.len()),
            Some(e) => Err(format!(
                "{}; {} entries ({}) removed to make room",
                cannot(e),
                evicted.0,
                crate::debuginfod::size(evicted.1)
            )),
        }
    }
}

/// The symbol cache is its user's alone (see the module's text).
const PRIVATE: usercache::Access = usercache::Access::Private;

/// Removes the least recently modified entries of `dir` until the rest take at most
/// `limit` bytes of the disk (never those just written, `keep`; files are `owner`'s), or with `shrink` (a
/// write failed) at most half of what they took, and files left on their way in by a
/// process that died, for at most [`EVICT_TIME`]. Entries that others may read are made
/// private. Returns how many entries were removed, and the bytes of the disk they took.
fn evict(
    dir: &std::os::fd::OwnedFd,
    owner: Option<SudoUser>,
    keep: &[&str],
    limit: u64,
    shrink: bool,
) -> (usize, u64) {
    use std::os::unix::ffi::OsStrExt;
    usercache::remove_stale_temps(dir, STALE_TEMP);
    let mut files: Vec<(i64, u64, std::ffi::OsString)> = Vec::new();
    let mut total = 0u64;
    for name in usercache::names_in(dir) {
        let Ok(stat) = nix::sys::stat::fstatat(
            dir,
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) else {
            continue;
        };
        let temp = name
            .as_bytes()
            .starts_with(usercache::TEMP_PREFIX.as_bytes());
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG || temp {
            continue;
        }
        if stat.st_mode & 0o077 != 0 {
            let _ = usercache::open_file(dir, &name.to_string_lossy(), owner)
                .and_then(|f| usercache::make_private(&f));
        }
        // What the entry takes of the disk: a small entry takes a whole block (4 KiB,
        // where its length may be a few hundred bytes).
        let size = stat.st_blocks as u64 * 512;
        total += size;
        if !keep.iter().any(|k| name == *k) {
            files.push((stat.st_mtime, size, name));
        }
    }
    files.sort();
    let limit = if shrink { limit.min(total / 2) } else { limit };
    let mut removed = (0, 0);
    let deadline = std::time::Instant::now() + EVICT_TIME;
    for (_, size, name) in files {
        if total <= limit || std::time::Instant::now() > deadline {
            break;
        }
        if usercache::remove_file(dir, &name).is_ok() {
            total -= size;
            removed.0 += 1;
            removed.1 += size;
        }
    }
    removed
}

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

const MAGIC: [u8; 8] = *b"SMPLSYM\0";
/// Raised whenever the layout or the meaning of a field changes: an entry of another
/// version is ignored and rebuilt.
const VERSION: u32 = 2;
const HEADER_BYTES: usize = 304;
const STAMP_AT: usize = 256;
const CHECKSUM_AT: usize = 24;
const TABLES_AT: usize = 144;
const STRINGS_AT: usize = 240;

/// The tables, in the header's order, with the size of their records.
const INTERVALS: usize = 0;
const INFOS: usize = 1;
const FRAMES: usize = 2;
const SYMBOLS: usize = 3;
const STRINGS: usize = 4;
const TEXT: usize = 5;
const RECORD_BYTES: [usize; 6] = [24, 16, 32, 24, 8, 1];

/// An absent string or symbol.
const NONE: u32 = u32::MAX;

// Header flags.
const SYMBOLS_EMPTY: u32 = 1;
const SOURCE_SHIFT: u32 = 1;
const SOURCE_MASK: u32 = 3 << SOURCE_SHIFT;
const HEADER_FLAGS: u32 = SYMBOLS_EMPTY | SOURCE_MASK;
// Info flags.
const UNNAMED: u32 = 1;
// Frame flags.
const HAS_LINE: u32 = 1;
const HAS_FRAME_SYMBOL: u32 = 2;
// Symbol flags.
const HAS_SIZE: u32 = 1;

/// A checksum of `bytes` but for the checksum field: words are mixed in one by one
/// through steps that are each one-to-one, so a change within any one word always
/// changes it (and almost always one anywhere else). It guards against damage, not
/// against someone who writes an entry on purpose: what is in the user's cache is theirs,
/// and every entry is checked for soundness as well.
fn checksum(bytes: &[u8]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ bytes.len() as u64;
    let mut mix = |word: u64| {
        h = (h ^ word)
            .wrapping_mul(0xff51_afd7_ed55_8ccd)
            .rotate_left(29);
    };
    let mut chunks = bytes.chunks_exact(8);
    for (i, chunk) in chunks.by_ref().enumerate() {
        if i != CHECKSUM_AT / 8 {
            mix(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    mix(u64::from_le_bytes(last));
    h
}

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
fn stamp_bytes(stamp: &Stamp) -> [u8; 40] {
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
    bytes: Vec<u8>,
    /// Each table's offset and record count.
    tables: [(usize, usize); 6],
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

impl Entry {
    /// Checks `bytes` as the entry of `key`.
    pub fn parse(bytes: Vec<u8>, key: &Key) -> Result<Entry, Refused> {
        if bytes.len() < HEADER_BYTES {
            return Err("shorter than its header");
        }
        if bytes[..8] != MAGIC {
            return Err("bad magic");
        }
        if u32_at(&bytes, 8) != VERSION {
            return Err("another version");
        }
        if u64_at(&bytes, 16) != bytes.len() as u64 {
            return Err("length differs");
        }
        if u64_at(&bytes, CHECKSUM_AT) != checksum(&bytes) {
            return Err("bad checksum");
        }
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
            if offset % 8 != 0
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
    fn record(&self, t: usize, i: usize) -> usize {
        self.tables[t].0 + i * RECORD_BYTES[t]
    }

    fn count(&self, t: usize) -> usize {
        self.tables[t].1
    }

    fn u32(&self, at: usize) -> u32 {
        u32_at(&self.bytes, at)
    }

    fn u64(&self, at: usize) -> u64 {
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

    fn string(&self, index: u32) -> Option<String> {
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
mod tests {
    use super::*;

    fn key() -> Key {
        Key {
            build_id: vec![0xab; 20],
            size: 0x1234,
            stamp: Stamp {
                dev: 1,
                ino: 2,
                mtime: 3,
                mtime_nsec: 4,
                ctime: 5,
                ctime_nsec: 6,
            },
        }
    }

    fn frame(function: &str, file: Option<&str>, line: Option<u32>) -> SourceFrame {
        SourceFrame {
            function: function.into(),
            linkage_name: Some(format!("_Z{function}")),
            file: file.map(str::to_string),
            line,
        }
    }

    /// Two functions: one with an inlined call and lines, one unnamed without DWARF.
    fn sample() -> (Vec<(Range<u64>, AddressInfo)>, Vec<u8>) {
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

    #[test]
    fn the_kernel_build_id_is_read_from_its_notes() {
        let mut notes = Vec::new();
        for (name, kind, desc) in [
            (&b"Xen\0"[..], 6u32, &[1u8, 2, 3][..]),
            (b"GNU\0", 3, &[0xaa; 20]),
        ] {
            notes.extend_from_slice(&(name.len() as u32).to_le_bytes());
            notes.extend_from_slice(&(desc.len() as u32).to_le_bytes());
            notes.extend_from_slice(&kind.to_le_bytes());
            notes.extend_from_slice(name);
            notes.extend_from_slice(desc);
            notes.resize(notes.len().next_multiple_of(4), 0);
        }
        assert_eq!(gnu_build_id(&notes), Some(&[0xaa; 20][..]));
        for len in 0..notes.len() {
            let _ = gnu_build_id(&notes[..len]);
        }
        assert_eq!(gnu_build_id(&notes[..notes.len() - 4]), None);
        // This machine's kernel, when it says.
        let secret = Secret([9; 16]);
        let kernel_key = |start| kernel_key_with(&secret, start);
        if let Some(key) = kernel_key(0xffff_ffff_8100_0000) {
            assert_eq!(kernel_key(0xffff_ffff_8100_0000), Some(key.clone()));
            let another_cache = kernel_key_with(&Secret([8; 16]), 0xffff_ffff_8100_0000);
            assert_ne!(another_cache, Some(key.clone()), "keyed with the secret");
            let other = kernel_key(0xffff_ffff_8200_0000).unwrap();
            assert_ne!(other, key);
            let piece = key.kernel_piece(3);
            assert_eq!(key.kernel_piece(3), piece);
            assert_ne!(key.kernel_piece(4), piece);
            assert_ne!(other.kernel_piece(3), piece);
            assert_eq!(piece.build_id, key.build_id);
        }
    }

    #[test]
    fn the_key_names_build_id_and_size() {
        assert_eq!(key().file_name(), format!("{}-1234", "ab".repeat(20)));
    }

    #[test]
    fn eviction_removes_the_least_recently_used_beyond_the_bound() {
        let scratch = crate::testdir::TestDir::new("evict");
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

    #[test]
    fn siphash_gives_the_reference_values() {
        // The test vectors of the SipHash paper: key 00 01 .. 0f, messages 00 01 .. .
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        let message: Vec<u8> = (0..15).collect();
        assert_eq!(siphash(&key, &[]), 0x726f_db47_dd0e_0e31);
        assert_eq!(siphash(&key, &message), 0xa129_ca61_49be_45e5);
    }
}
