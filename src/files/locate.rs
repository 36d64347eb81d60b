//! Where the bytes of a mapped file are, and where its debug information lives.
//!
//! A mapping names a path, but the file at that path today may not be the one that was
//! mapped: it may have been deleted or replaced since (then the kernel still has the
//! mapped one, under `/proc/PID/map_files/`), or the process may live in another mount
//! namespace, a container, where the path means something else (then it is reached
//! through `/proc/PID/root`). The vdso has no file at all; its image is read from the
//! process's memory. The device and inode the kernel reported with the mapping decide
//! which candidate is the right one: a file found at the path counts only when it is
//! that inode (a file replaced since is a new one), while `/proc/PID/map_files/` is the
//! mapped file itself. An inode number cannot be taken by another file while sampler
//! holds the file open, as it does every file it found.
//!
//! Separate debug files are found as GDB finds them, under each debug root in turn (the
//! user's `--debug-root`s, then `/usr/lib/debug`): by build ID under
//! `ROOT/.build-id/xx/rest.debug`, then by `.gnu_debuglink` next to the file, in its
//! `.debug/` directory and under `ROOT/dir/`. A debug file counts only when its build ID
//! (or, without one, the link's CRC-32) matches.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::files::binary::Binary;

/// A file as the kernel identifies it: its device and inode number. The kernel reports
/// them with each mapping (MMAP2 records, `/proc/PID/maps`), and `fstat` of an open file
/// gives them: a file found at the mapping's path is the one that was mapped only when
/// they agree (a replaced file is a new inode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev_major: u32,
    pub dev_minor: u32,
    pub inode: u64,
}

impl FileId {
    /// The identity of the file `meta` describes.
    pub fn of(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev_major: nix::sys::stat::major(meta.dev()) as u32,
            dev_minor: nix::sys::stat::minor(meta.dev()) as u32,
            inode: meta.ino(),
        }
    }
}

/// Where distributions install separate debug files.
pub const DEFAULT_DEBUG_ROOT: &str = "/usr/lib/debug";

/// The suffix the kernel gives the path of a mapped file that was unlinked.
const DELETED_SUFFIX: &str = " (deleted)";

/// A file mapped into a process, as the recording saw it.
#[derive(Clone, Copy, Debug)]
pub struct MappedFile<'a> {
    pub pid: i32,
    pub path: &'a str,
    pub start: u64,
    pub end: u64,
    /// The file the kernel reported with the mapping, when it did.
    pub file: Option<FileId>,
}

/// How a mapped file was found, for the summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// The path as named.
    Path,
    /// Through `/proc/PID/root` (another mount namespace).
    ProcessRoot,
    /// Through `/proc/PID/map_files` (deleted or replaced since it was mapped).
    MapFiles,
    /// The vdso image read from memory.
    Memory,
}

/// Opens mapped files and caches them: by path for files that match what was mapped, and
/// by the kernel's identity of the file, so one library shared by many processes (or
/// containers) is read once, and the files of a process that has exited (its
/// `/proc/PID/` gone) are still found when another process mapped them before.
#[derive(Default)]
pub struct FileFinder {
    by_path: HashMap<PathBuf, Option<Arc<Binary>>>,
    by_file: HashMap<FileId, Arc<Binary>>,
    /// vdso images by build ID: every process of one kernel has the same.
    vdso_by_build_id: HashMap<Vec<u8>, Arc<Binary>>,
    own_mount_ns: Option<Option<PathBuf>>,
    own_vdso: Option<Option<Arc<Binary>>>,
}

impl FileFinder {
    /// The file behind a mapping, or `None` (with the reason) when no candidate can be
    /// read or is the file the kernel reported.
    pub fn mapped(&mut self, m: &MappedFile) -> Result<(Arc<Binary>, Found), String> {
        if let Some(b) = m.file.and_then(|f| self.by_file.get(&f)) {
            return Ok((b.clone(), Found::Path));
        }
        let (path, deleted) = match m.path.strip_suffix(DELETED_SUFFIX) {
            Some(p) => (p, true),
            None => (m.path, false),
        };
        let mut candidates = Vec::new();
        if !deleted {
            if self.in_other_mount_ns(m.pid) {
                let inside = Path::new(path).strip_prefix("/").unwrap_or(Path::new(path));
                candidates.push((
                    Path::new(&format!("/proc/{}/root", m.pid)).join(inside),
                    Found::ProcessRoot,
                ));
            }
            candidates.push((PathBuf::from(path), Found::Path));
        }
        candidates.push((
            PathBuf::from(format!(
                "/proc/{}/map_files/{:x}-{:x}",
                m.pid, m.start, m.end
            )),
            Found::MapFiles,
        ));
        let mut mismatched = false;
        for (candidate, how) in candidates {
            // Paths under /proc/PID name different files over time; only real paths
            // are cached by path.
            let binary = if how == Found::Path {
                self.by_path
                    .entry(candidate.clone())
                    .or_insert_with(|| Binary::open(&candidate).map(Arc::new))
                    .clone()
            } else {
                Binary::open(&candidate).map(Arc::new)
            };
            let Some(binary) = binary else { continue };
            // map_files is the kernel's link to the mapped file; a path may name another.
            let other = |f: FileId| !binary.file_id().is_some_and(|d| same_file(f, d));
            if how != Found::MapFiles && m.file.is_some_and(other) {
                mismatched = true;
                continue;
            }
            if let Some(f) = m.file {
                self.by_file.insert(f, binary.clone());
            }
            return Ok((binary, how));
        }
        Err(if mismatched {
            "the file was replaced after it was mapped".into()
        } else if deleted {
            "the file was deleted and the process is gone".into()
        } else {
            "the file cannot be read".into()
        })
    }

    /// The vdso image of process `pid`, mapped at `start..end`: read from the process's
    /// memory, or, when that is gone, from sampler's own vdso (the same kernel's image).
    pub fn vdso(&mut self, pid: i32, start: u64, end: u64) -> Result<(Arc<Binary>, Found), String> {
        if let Some(b) = read_memory(pid, start, end).and_then(vdso_binary) {
            if let Some(id) = &b.build_id {
                if let Some(known) = self.vdso_by_build_id.get(id) {
                    return Ok((known.clone(), Found::Memory));
                }
                self.vdso_by_build_id.insert(id.clone(), b.clone());
            }
            return Ok((b, Found::Memory));
        }
        self.own_vdso
            .get_or_insert_with(|| {
                own_vdso_range()
                    .and_then(|(s, e)| read_memory(0, s, e))
                    .and_then(vdso_binary)
            })
            .clone()
            .map(|b| (b, Found::Memory))
            .ok_or_else(|| "the vdso image cannot be read".into())
    }

    /// Whether process `pid` lives in another mount namespace. Asked anew for every
    /// mapping: a process can enter a namespace and exec (what `unshare` does).
    fn in_other_mount_ns(&mut self, pid: i32) -> bool {
        let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
        let ours = self.own_mount_ns.get_or_insert_with(|| ns("self"));
        match (ns(&pid.to_string()), ours) {
            (Some(theirs), Some(ours)) => theirs != *ours,
            _ => false,
        }
    }
}

/// Whether `on_disk` (from `fstat`) is the file the kernel reported as `mapped`. The inode
/// numbers must agree; the devices only when both are block devices: a file system on an
/// anonymous device (major 0: btrfs subvolumes, overlayfs, tmpfs) may give `stat` another
/// anonymous device than its superblock's, which the kernel reports.
fn same_file(mapped: FileId, on_disk: FileId) -> bool {
    let anonymous = mapped.dev_major == 0 || on_disk.dev_major == 0;
    mapped.inode == on_disk.inode
        && (anonymous
            || (mapped.dev_major, mapped.dev_minor) == (on_disk.dev_major, on_disk.dev_minor))
}

fn vdso_binary(bytes: Vec<u8>) -> Option<Arc<Binary>> {
    Binary::from_bytes(PathBuf::from("[vdso]"), Arc::from(bytes)).map(Arc::new)
}

/// `end - start` bytes of process `pid`'s memory (`0`: sampler's own), through
/// `/proc/PID/mem` (which needs the right to trace the process: root, or its parent).
fn read_memory(pid: i32, start: u64, end: u64) -> Option<Vec<u8>> {
    let len = usize::try_from(end.checked_sub(start)?).ok()?;
    if len > MAX_VDSO_BYTES {
        return None;
    }
    let path = match pid {
        0 => "/proc/self/mem".to_string(),
        pid => format!("/proc/{pid}/mem"),
    };
    let mut bytes = vec![0; len];
    File::open(path)
        .ok()?
        .read_exact_at(&mut bytes, start)
        .ok()?;
    Some(bytes)
}

/// The vdso is two to four pages; anything much larger is not a vdso.
const MAX_VDSO_BYTES: usize = 1 << 20;

/// Where sampler's own vdso is mapped.
fn own_vdso_range() -> Option<(u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
    let (start, end) = line.split_whitespace().next()?.split_once('-')?;
    Some((
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    ))
}

/// A separate debug file that was found for a binary.
pub struct DebugFile {
    pub path: PathBuf,
    pub binary: Binary,
}

/// Finds the separate debug file of `binary`, which was mapped from `mapped_path`, under
/// the debug roots `roots`, in order. Candidates whose build ID (or CRC-32) does not
/// match are skipped; their paths are returned for the summary.
pub fn find_debug_file(
    binary: &Binary,
    mapped_path: &str,
    roots: &[PathBuf],
) -> (Option<DebugFile>, Vec<PathBuf>) {
    let mut rejected = Vec::new();
    for (path, crc) in debug_candidates(binary, mapped_path, roots) {
        match debug_file_at(&path, binary, crc) {
            Candidate::Matches(found) => return (Some(*found), rejected),
            Candidate::Missing => {}
            Candidate::Mismatched => rejected.push(path),
        }
    }
    (None, rejected)
}

/// The paths [`find_debug_file`] tries, in order, each with the CRC-32 the debug file
/// must have when it is found through the file's debuglink.
pub fn debug_candidates(
    binary: &Binary,
    mapped_path: &str,
    roots: &[PathBuf],
) -> Vec<(PathBuf, Option<u32>)> {
    let mut candidates: Vec<(PathBuf, Option<u32>)> = Vec::new();
    if let Some(id) = &binary.build_id {
        candidates.extend(roots.iter().map(|root| (build_id_path(root, id), None)));
    }
    if let Some((name, crc)) = &binary.debuglink {
        let path = Path::new(
            mapped_path
                .strip_suffix(DELETED_SUFFIX)
                .unwrap_or(mapped_path),
        );
        if let Some(dir) = path.parent() {
            let relative = dir.strip_prefix("/").unwrap_or(dir);
            let beside = [dir.join(name), dir.join(".debug").join(name)];
            let under_roots = roots.iter().map(|root| root.join(relative).join(name));
            for candidate in beside.into_iter().chain(under_roots) {
                // A link to the file itself (a debuglink left in an unstripped file).
                if candidate != path {
                    candidates.push((candidate, Some(*crc)));
                }
            }
        }
    }
    candidates
}

/// What is at a candidate path for a debug file.
pub enum Candidate {
    /// No ELF file.
    Missing,
    /// An ELF file whose build ID (or, for a binary without one, the CRC-32 its
    /// debuglink gives) does not match.
    Mismatched,
    Matches(Box<DebugFile>),
}

/// Whether `path` holds the debug file of `binary` (`crc`: its debuglink's CRC-32, for a
/// candidate found through the link).
pub fn debug_file_at(path: &Path, binary: &Binary, crc: Option<u32>) -> Candidate {
    let Some(debug) = Binary::open(path) else {
        return Candidate::Missing;
    };
    let matches = match (&binary.build_id, crc) {
        (Some(_), _) => debug.build_id == binary.build_id,
        (None, Some(crc)) => debug.bytes().is_ok_and(|data| crc32(&data) == crc),
        (None, None) => false,
    };
    if !matches {
        return Candidate::Mismatched;
    }
    Candidate::Matches(Box::new(DebugFile {
        path: path.to_path_buf(),
        binary: debug,
    }))
}

/// Where GDB's scheme puts the debug file of build ID `id` under `debug_root`:
/// `.build-id/` + the first byte in hex + `/` + the rest in hex + `.debug`.
pub fn build_id_path(debug_root: &Path, id: &[u8]) -> PathBuf {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let split = hex.len().min(2);
    debug_root
        .join(".build-id")
        .join(&hex[..split])
        .join(format!("{}.debug", &hex[split..]))
}

/// The CRC-32 (IEEE) that `.gnu_debuglink` records of the debug file.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(data);
    crc.sum()
}

/// Opens a file for reading when it is a regular file: not through a link at its own
/// name, and never a fifo or device (opening one could block, reading one could never
/// end). For files whose names a recorded process chose (its JIT dump), or that sit in a
/// cache another user could write to.
pub fn open_regular(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

/// At most `limit` bytes, from `offset` on, of a file that recorded process's user
/// `user` wrote where anyone may write (a JIT's perf map in `/tmp`, the JIT dump it
/// names): read only when it is a regular file reached through no link (see
/// [`open_regular`]), owned by `user` or root (any other user could plant it, and root
/// only reads it for `user`'s process when root has not said who that is: `None`),
/// with one name (a hard link would let one file be read for many processes, or another
/// user's file be passed off as one's own), and holding the bytes it is read for (see
/// [`crate::files::image::Held::check`]: not a sparse file). Its bytes and its length;
/// `Ok(None)` when there is no such file; else why it is not read.
pub fn read_written_by(
    path: &Path,
    offset: u64,
    limit: u64,
    user: Option<u32>,
) -> Result<Option<(Vec<u8>, u64)>, String> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::MetadataExt;
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(None);
    }
    let file = open_regular(path).ok_or("it is not a regular file (or it is a symbolic link)")?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    let owner = meta.uid();
    if owner != 0 && Some(owner) != user {
        return Err(match user {
            Some(user) => {
                format!("it belongs to user {owner}, not to its process's user {user} or root")
            }
            None => format!("it belongs to user {owner}, and its process's user is not known"),
        });
    }
    if meta.nlink() != 1 {
        return Err(format!(
            "it has {} names (hard links), not one",
            meta.nlink()
        ));
    }
    let file = std::sync::Arc::new(file);
    let held = crate::files::image::Held::of(&file).map_err(|e| e.to_string())?;
    let len = meta.len();
    let wanted = len.saturating_sub(offset).min(limit);
    held.check(&"it", offset.min(len), wanted)?;
    let mut data = Vec::new();
    data.try_reserve_exact(usize::try_from(wanted).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let mut reader = &*file;
    reader
        .seek(SeekFrom::Start(offset))
        .map_err(|e| e.to_string())?;
    reader
        .take(wanted)
        .read_to_end(&mut data)
        .map_err(|e| e.to_string())?;
    Ok(Some((data, len)))
}

/// The user a process runs as (its effective user ID), while it runs.
pub fn process_user(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    ids.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_vdso_is_an_elf_image_with_clock_gettime() {
        let (start, end) = own_vdso_range().expect("every x86-64 process has a vdso");
        let b = vdso_binary(read_memory(0, start, end).unwrap()).expect("an ELF image");
        let data = b.bytes().unwrap();
        let file = object::File::parse(&*data).unwrap();
        use object::{Object, ObjectSymbol};
        assert!(file
            .dynamic_symbols()
            .any(|s| s.name().is_ok_and(|n| n.ends_with("clock_gettime"))));
    }

    #[test]
    fn files_are_the_same_by_inode_and_block_device() {
        let f = |dev_major, dev_minor, inode| FileId {
            dev_major,
            dev_minor,
            inode,
        };
        assert!(same_file(f(254, 1, 7), f(254, 1, 7)));
        assert!(!same_file(f(254, 1, 7), f(254, 1, 8)), "another inode");
        assert!(!same_file(f(254, 1, 7), f(254, 2, 7)), "another disk");
        // btrfs: the superblock's anonymous device, and the subvolume's in stat.
        assert!(same_file(f(0, 38, 7), f(0, 41, 7)));
        assert!(!same_file(f(0, 38, 7), f(0, 41, 8)));
    }

    #[test]
    fn own_executable_through_map_files_or_path() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let line = maps
            .lines()
            .find(|l| l.contains(" r-xp ") && l.ends_with(exe.to_str().unwrap()))
            .unwrap();
        let (range, _) = line.split_once(' ').unwrap();
        let (s, e) = range.split_once('-').unwrap();
        let (start, end) = (
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        );
        let pid = std::process::id() as i32;
        let mut finder = FileFinder::default();
        let deleted = format!("{}{DELETED_SUFFIX}", exe.display());
        let m = MappedFile {
            pid,
            path: &deleted,
            start,
            end,
            file: None,
        };
        match finder.mapped(&m) {
            Ok((b, how)) => {
                assert_eq!(how, Found::MapFiles);
                assert_eq!(*b.bytes().unwrap(), *std::fs::read(&exe).unwrap());
            }
            // map_files needs CAP_SYS_ADMIN.
            Err(e) => assert!(!nix::unistd::Uid::effective().is_root(), "{e}"),
        }
        // The file at the path is the one mapped only when it is the inode the kernel
        // named: another inode is a file put there since.
        let on_disk = FileId::of(&std::fs::metadata(&exe).unwrap());
        let m = MappedFile {
            pid: i32::MAX,
            path: exe.to_str().unwrap(),
            file: Some(FileId {
                inode: on_disk.inode + 1,
                ..on_disk
            }),
            ..m
        };
        assert_eq!(
            finder.mapped(&m).unwrap_err(),
            "the file was replaced after it was mapped"
        );
        let (b, how) = finder
            .mapped(&MappedFile {
                file: Some(on_disk),
                ..m
            })
            .unwrap();
        assert_eq!((b.file_id(), how), (Some(on_disk), Found::Path));
    }
}
