//! The invoking user's cache directory, and how sampler reads and writes files in it
//! when it may be running as root: the debuginfod client's downloads
//! ([`crate::symbolicate::debuginfod`]) and the symbol cache ([`crate::symbolicate::cache`]).
//!
//! Under sudo the cache is the user's who ran sudo (their home, their files), never
//! root's: every directory is opened relative to one already opened and checked to be
//! theirs, without following a symbolic link; new directories and files are created
//! exclusively and given to them through their descriptors, never by path. A file is
//! written atomically: a new file beside its final name, renamed over it when complete,
//! and removed when it is not.
//!
//! [`SudoUser`], the user who ran sudo, lives here, with the files made for them: the
//! caches, and the outputs of [`crate::files::output`], which re-exports it.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{openat, renameat2, OFlag, RenameFlags, AT_FDCWD};
use nix::sys::stat::{fchmod, fstat, mkdirat, Mode};
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};

/// The user who ran `sudo`, when sampler runs as root under it: outputs are theirs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SudoUser {
    pub uid: u32,
    pub gid: u32,
}

impl SudoUser {
    /// `SUDO_UID`/`SUDO_GID`, when this process is root (only root can give files away,
    /// and a non-root process with a stale `SUDO_UID` keeps its files).
    pub fn from_env() -> Option<SudoUser> {
        if !nix::unistd::Uid::effective().is_root() {
            return None;
        }
        let id = |var: &str| std::env::var(var).ok()?.parse::<u32>().ok();
        let uid = id("SUDO_UID")?;
        Some(SudoUser {
            uid,
            gid: id("SUDO_GID").unwrap_or(uid),
        })
    }

    /// The groups the user is in: their own and, from the group database, the others.
    fn groups(&self) -> Vec<u32> {
        let mut groups = vec![self.gid];
        let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(self.uid))
            .ok()
            .flatten()
            .and_then(|u| std::ffi::CString::new(u.name).ok());
        if let Some(name) = name {
            if let Ok(list) = nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(self.gid))
            {
                groups.extend(list.iter().map(|g| g.as_raw()));
            }
        }
        groups
    }

    /// Whether the user may create a file in the directory `dir` describes, by its
    /// permission bits as the kernel reads them for them: the owner's, else the group's
    /// when they are in its group, else everyone's (write and search both needed).
    pub fn may_write_dir(&self, dir: &std::fs::Metadata) -> bool {
        const WRITE_AND_SEARCH: u32 = 0o3;
        let bits = if dir.uid() == self.uid {
            dir.mode() >> 6
        } else if self.groups().contains(&dir.gid()) {
            dir.mode() >> 3
        } else {
            dir.mode()
        };
        bits & WRITE_AND_SEARCH == WRITE_AND_SEARCH
    }
}

/// Who may read a cache besides its user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Everyone, as directories under the usual umask are (0755): debuginfod's cache,
    /// whose debug files are public and which other tools share.
    Shared,
    /// Its user only (0700): the symbol cache, where which files were profiled, and
    /// what the running kernel's entries are called, are the user's business. A
    /// directory found open to others is closed to them when opened.
    Private,
}

impl Access {
    /// Permission bits of a new directory.
    fn dir_mode(self) -> u32 {
        match self {
            Access::Shared => 0o755,
            Access::Private => 0o700,
        }
    }
}

/// Takes the group's and others' permissions off `fd` when it has any (a private cache
/// made before it was private, or under a loose umask).
pub fn make_private(fd: &impl AsFd) -> io::Result<()> {
    let mode = fstat(fd.as_fd())?.st_mode;
    if mode & 0o077 != 0 {
        fchmod(fd.as_fd(), Mode::from_bits_truncate(mode & 0o700))?;
    }
    Ok(())
}

/// The home directory of the cache's user: under sudo the invoking user's, from the
/// password database (HOME may still be theirs or already root's), else `$HOME`.
pub fn user_home(owner: Option<SudoUser>) -> Option<PathBuf> {
    match owner {
        Some(user) => nix::unistd::User::from_uid(Uid::from_raw(user.uid))
            .ok()
            .flatten()
            .map(|u| u.dir),
        None => std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from),
    }
}

/// The user's cache directory as the XDG base directory specification places it:
/// `$XDG_CACHE_HOME`, else `HOME/.cache`. An empty value counts as unset.
pub fn cache_home(xdg_cache_home: Option<&str>, home: Option<&Path>) -> Option<PathBuf> {
    match xdg_cache_home.filter(|v| !v.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => Some(home?.join(".cache")),
    }
}

/// The cache directory of `owner` (else of whoever runs sampler), as [`cache_home`]
/// places it from this process's `XDG_CACHE_HOME` and their home; `None` without a home.
pub fn user_cache_home(owner: Option<SudoUser>) -> Option<PathBuf> {
    let home = user_home(owner);
    let xdg = std::env::var("XDG_CACHE_HOME").ok();
    cache_home(xdg.as_deref(), home.as_deref())
}

/// The uid that owns the cache: the sudo user, else whoever runs sampler.
fn cache_user(owner: Option<SudoUser>) -> u32 {
    owner.map_or_else(|| Uid::effective().as_raw(), |u| u.uid)
}

/// Directories made for one owner of them (a cache of one run) by [`make_dir`], removed
/// again when it is dropped (those that are empty, each before the one that holds it),
/// unless [`MadeDirs::keep`] was called: a run that fails after it made them (and removed
/// its files on their way in) leaves no directory behind.
#[derive(Debug, Default)]
pub struct MadeDirs(std::sync::Mutex<Vec<(OwnedFd, std::ffi::OsString)>>);

impl MadeDirs {
    /// Keeps the directories made so far: the run saved what it made.
    pub fn keep(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

impl Drop for MadeDirs {
    fn drop(&mut self) {
        let made = self.0.get_mut().unwrap_or_else(|e| e.into_inner());
        // Passes until one removes nothing: threads that made a directory and one below
        // it may have noted them in either order. One not empty (another run's files, or
        // a file not removed) is left as it is.
        loop {
            let before = made.len();
            made.retain(|(parent, name)| {
                unlinkat(parent, name.as_os_str(), UnlinkatFlags::RemoveDir).is_err()
            });
            if made.is_empty() || made.len() == before {
                break;
            }
        }
    }
}

/// [`open_dir`] with `create`, noting in `made` each directory it made.
pub fn make_dir(
    root: &Path,
    below: &[&str],
    owner: Option<SudoUser>,
    access: Access,
    made: &MadeDirs,
) -> io::Result<OwnedFd> {
    open_dir_noting(root, below, owner, true, access, Some(made))
}

/// Opens the directory `root/below[0]/below[1]/…`. `root` is opened by path (a link
/// there is the user's own choice); each name of `below` is opened relative to its
/// parent without following a link. Every directory opened must belong to the cache's
/// user (the sudo user, else whoever runs sampler). With `create`, what is missing is
/// created, `root` included (from the nearest directory that exists), and given to the
/// user; without it, a missing directory is an error. `access` says the mode of new
/// directories, and with [`Access::Private`] those of `below` are made private.
pub fn open_dir(
    root: &Path,
    below: &[&str],
    owner: Option<SudoUser>,
    create: bool,
    access: Access,
) -> io::Result<OwnedFd> {
    open_dir_noting(root, below, owner, create, access, None)
}

/// [`open_dir`], noting in `made` (if any) each directory it made.
fn open_dir_noting(
    root: &Path,
    below: &[&str],
    owner: Option<SudoUser>,
    create: bool,
    access: Access,
    made: Option<&MadeDirs>,
) -> io::Result<OwnedFd> {
    let user = cache_user(owner);
    // Names still to open, the next one last; those of `root` may be created too.
    let mut missing: Vec<std::ffi::OsString> = below.iter().rev().map(|n| n.into()).collect();
    let mut existing = root.to_path_buf();
    let directory = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
    let mut dir = loop {
        match openat(AT_FDCWD, &existing, directory, Mode::empty()) {
            Ok(fd) => break fd,
            Err(Errno::ENOENT) if create => {
                let name = existing.file_name().map(|n| n.to_os_string());
                match (name, existing.parent()) {
                    (Some(name), Some(parent)) if !parent.as_os_str().is_empty() => {
                        missing.push(name);
                        existing = parent.to_path_buf();
                    }
                    _ => return Err(Errno::ENOENT.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    };
    check_owner(&dir, user, &existing)?;
    while let Some(name) = missing.pop() {
        let created = create
            && match mkdirat(
                &dir,
                name.as_os_str(),
                Mode::from_bits_truncate(access.dir_mode()),
            ) {
                Ok(()) => true,
                Err(Errno::EEXIST) => false,
                Err(e) => return Err(e.into()),
            };
        existing.push(&name);
        let sub = match openat(
            &dir,
            name.as_os_str(),
            directory | OFlag::O_NOFOLLOW,
            Mode::empty(),
        ) {
            Ok(sub) => sub,
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(io::Error::other(format!(
                    "{} is a symbolic link or not a directory",
                    existing.display()
                )))
            }
            Err(e) => return Err(e.into()),
        };
        if created {
            if let Some(u) = owner {
                fchown(&sub, Some(Uid::from_raw(u.uid)), Some(Gid::from_raw(u.gid)))?;
            }
            // Given to its user first: one not noted (no descriptor left) only stays.
            if let (Some(made), Ok(parent)) = (made, dir.try_clone()) {
                let mut list = made.0.lock().unwrap_or_else(|e| e.into_inner());
                list.push((parent, name.clone()));
            }
        }
        check_owner(&sub, user, &existing)?;
        if access == Access::Private && missing.len() < below.len() {
            make_private(&sub)?;
        }
        dir = sub;
    }
    Ok(dir)
}

/// Refuses a directory or file of another user than `user`: someone else could have put
/// it, or a link to it, where the cache is.
fn check_owner(fd: &impl AsFd, user: u32, path: &Path) -> io::Result<()> {
    let owner = fstat(fd.as_fd())?.st_uid;
    if owner != user {
        return Err(io::Error::other(format!(
            "{} belongs to user {owner}, not to user {user}",
            path.display()
        )));
    }
    Ok(())
}

/// Opens the file `name` in `dir` for reading: not through a link, only a regular file
/// (never a fifo or device, which could block or never end), and only one of the cache's
/// user.
pub fn open_file(dir: &OwnedFd, name: &str, owner: Option<SudoUser>) -> io::Result<File> {
    let fd = openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let file = File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::other(format!("{name} is not a regular file")));
    }
    check_owner(&file, cache_user(owner), Path::new(name))?;
    Ok(file)
}

/// Removes the file `name` from `dir` (a link is removed, never followed).
pub fn remove_file(dir: &impl AsFd, name: &OsStr) -> io::Result<()> {
    Ok(unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?)
}

/// The prefix of the name of a file on its way into a cache directory: hidden, and
/// named after sampler, so that one left behind by a killed process can be recognised.
pub const TEMP_PREFIX: &str = ".sampler-";

/// The names of what `dir` holds (`.` and `..` left out).
pub fn names_in(dir: &OwnedFd) -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(mut listing) = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return Vec::new();
    };
    listing
        .iter()
        .flatten()
        .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
        .filter(|n| n != "." && n != "..")
        .collect()
}

/// What `dir/name` is, when it is a regular file (a link is not followed).
pub fn regular_file_at(dir: &OwnedFd, name: &OsStr) -> Option<nix::sys::stat::FileStat> {
    let stat = nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
    (stat.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(stat)
}

/// Removes from `dir` the files on their way in ([`TEMP_PREFIX`]) last written longer
/// than `age` ago: left by a process that was killed. Regular files only, never
/// through a link.
pub fn remove_stale_temps(dir: &OwnedFd, age: std::time::Duration) {
    use std::os::unix::ffi::OsStrExt;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    for name in names_in(dir) {
        if !name.as_bytes().starts_with(TEMP_PREFIX.as_bytes()) {
            continue;
        }
        let Some(stat) = regular_file_at(dir, &name) else {
            continue;
        };
        if now - stat.st_mtime > age.as_secs() as i64 {
            let _ = remove_file(dir, &name);
        }
    }
}

/// The files on their way in that this process has not committed or removed yet: their
/// directory and name, by a number of their own.
static UNFINISHED: std::sync::Mutex<Vec<(u64, OwnedFd, String)>> =
    std::sync::Mutex::new(Vec::new());

/// Removes the files on their way in that are still unfinished: for a process about to
/// exit while a thread still writes one (a download that a signal made it give up on).
pub fn remove_unfinished() {
    let unfinished = std::mem::take(&mut *UNFINISHED.lock().unwrap_or_else(|e| e.into_inner()));
    for (_, dir, name) in unfinished {
        let _ = remove_file(&dir, OsStr::new(&name));
    }
}

/// A file on its way into a cache directory: a new file beside its final name, removed
/// unless committed (and by [`remove_unfinished`], should the process exit first).
pub struct TempFile {
    dir: OwnedFd,
    name: String,
    final_name: String,
    pub file: File,
    committed: bool,
    /// Its number among the [`UNFINISHED`].
    number: u64,
}

impl TempFile {
    /// Creates the new file (exclusively, never through a link) in `dir`, to be renamed
    /// to `final_name`, with permission bits `mode`; open for reading too (a cache may
    /// read what it has just written).
    pub fn create(dir: OwnedFd, final_name: &str, mode: u32) -> io::Result<TempFile> {
        static N: AtomicU64 = AtomicU64::new(0);
        let number = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("{TEMP_PREFIX}{}-{number}.{final_name}", std::process::id());
        let fd = openat(
            &dir,
            name.as_str(),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )?;
        if let Ok(copy) = dir.try_clone() {
            UNFINISHED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((number, copy, name.clone()));
        }
        Ok(TempFile {
            dir,
            name,
            final_name: final_name.to_string(),
            file: File::from(fd),
            committed: false,
            number,
        })
    }

    /// A second descriptor of the file, for reading back what was written.
    pub fn reopen(&self) -> io::Result<File> {
        let fd = openat(
            &self.dir,
            self.name.as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// The name it gets when it is committed.
    pub fn final_name(&self) -> &str {
        &self.final_name
    }

    /// The directory the file is in.
    pub fn dir(&self) -> &OwnedFd {
        &self.dir
    }

    /// Flushes the file to disk when `sync` asks for it, gives it to `owner`, and renames
    /// it to its final name.
    pub fn commit(self, owner: Option<SudoUser>, sync: bool) -> io::Result<()> {
        self.rename(owner, sync, RenameFlags::empty())
    }

    /// [`TempFile::commit`], unless a file of the final name exists: then that one is
    /// kept, this one removed, and the error is `EEXIST`. For a file that must be the
    /// same for every process that reads it once one has written it.
    pub fn commit_new(self, owner: Option<SudoUser>, sync: bool) -> io::Result<()> {
        self.rename(owner, sync, RenameFlags::RENAME_NOREPLACE)
    }

    fn rename(mut self, owner: Option<SudoUser>, sync: bool, flags: RenameFlags) -> io::Result<()> {
        if sync {
            self.file.sync_all()?;
        }
        if let Some(u) = owner {
            fchown(
                &self.file,
                Some(Uid::from_raw(u.uid)),
                Some(Gid::from_raw(u.gid)),
            )?;
        }
        renameat2(
            &self.dir,
            self.name.as_str(),
            &self.dir,
            self.final_name.as_str(),
            flags,
        )?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        UNFINISHED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(number, _, _)| *number != self.number);
        if !self.committed {
            let _ = remove_file(&self.dir, OsStr::new(&self.name));
        }
    }
}

/// The longest one run spends removing entries: 1 s. A removal is microseconds on most
/// file systems, but milliseconds where blocks are discarded as they are freed (2.2 ms
/// each on ext4 mounted with `discard`): the 34,000 entries a cache of 100,000 small
/// ones had to give up took 125 s there. What is left over goes in later runs.
pub const EVICT_TIME: Duration = Duration::from_secs(1);

/// A file on its way into the cache that is this old was left by a process that died
/// while writing it (a write takes milliseconds).
pub const STALE_TEMP: Duration = Duration::from_secs(3600);

/// Removes the least recently modified entries of `dir` until the rest take at most
/// `limit` bytes of the disk (never those just written, `keep`; files are `owner`'s), or with `shrink` (a
/// write failed) at most half of what they took, and files left on their way in by a
/// process that died, for at most [`EVICT_TIME`]. Entries that others may read are made
/// private. Returns how many entries were removed, and the bytes of the disk they took.
pub fn evict(
    dir: &std::os::fd::OwnedFd,
    owner: Option<SudoUser>,
    keep: &[&str],
    limit: u64,
    shrink: bool,
) -> (usize, u64) {
    use std::os::unix::ffi::OsStrExt;
    remove_stale_temps(dir, STALE_TEMP);
    let mut files: Vec<(i64, u64, std::ffi::OsString)> = Vec::new();
    let mut total = 0u64;
    for name in names_in(dir) {
        let Some(stat) = regular_file_at(dir, &name) else {
            continue;
        };
        let temp = name.as_bytes().starts_with(TEMP_PREFIX.as_bytes());
        if temp {
            continue;
        }
        if stat.st_mode & 0o077 != 0 {
            let _ = open_file(dir, &name.to_string_lossy(), owner).and_then(|f| make_private(&f));
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
        if remove_file(dir, &name).is_ok() {
            total -= size;
            removed.0 += 1;
            removed.1 += size;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> crate::files::testdir::TestDir {
        crate::files::testdir::TestDir::new(&format!("usercache-{name}"))
    }

    #[test]
    fn the_cache_home_is_where_xdg_puts_it() {
        let home = Some(Path::new("/home/u"));
        assert_eq!(cache_home(Some("/x"), home), Some(PathBuf::from("/x")));
        assert_eq!(
            cache_home(Some(""), home),
            Some(PathBuf::from("/home/u/.cache"))
        );
        assert_eq!(cache_home(None, None), None);
    }

    #[test]
    fn directories_made_are_removed_again_unless_kept_and_only_when_empty() {
        let scratch = scratch("made");
        let root = scratch.join("a");
        std::fs::create_dir(&root).unwrap();
        // Made below a directory that was there: b, c and d go again, a stays.
        let made = MadeDirs::default();
        make_dir(&root, &["b", "c", "d"], None, Access::Private, &made).unwrap();
        assert!(root.join("b/c/d").is_dir());
        drop(made);
        assert!(root.is_dir() && !root.join("b").exists());
        // Kept: they stay.
        let made = MadeDirs::default();
        make_dir(&root, &["b", "c"], None, Access::Private, &made).unwrap();
        made.keep();
        drop(made);
        assert!(root.join("b/c").is_dir());
        // Only what this one made, and not a directory that holds something.
        let made = MadeDirs::default();
        make_dir(&root, &["b", "c", "e", "f"], None, Access::Private, &made).unwrap();
        std::fs::write(root.join("b/c/e/file"), b"x").unwrap();
        drop(made);
        assert!(root.join("b/c/e/file").is_file() && !root.join("b/c/e/f").exists());
        // Noted child first (two threads making them at once), so that the last noted is
        // the parent, not empty yet: both go.
        let made = MadeDirs::default();
        std::fs::create_dir_all(root.join("g/h")).unwrap();
        let open = |path: &Path| OwnedFd::from(File::open(path).unwrap());
        made.0.lock().unwrap().extend([
            (open(&root.join("g")), "h".into()),
            (open(&root), "g".into()),
        ]);
        drop(made);
        assert!(!root.join("g").exists());
    }

    #[test]
    fn directories_are_created_and_a_file_lands_atomically() {
        let scratch = scratch("create");
        let root = scratch.join("a");
        assert!(
            open_dir(&root, &["b"], None, false, Access::Shared).is_err(),
            "not created"
        );
        let dir = open_dir(&root, &["b", "c"], None, true, Access::Shared).unwrap();
        let mut temp = TempFile::create(dir, "entry", 0o644).unwrap();
        use std::io::Write;
        temp.file.write_all(b"bytes").unwrap();
        let final_path = root.join("b/c/entry");
        assert!(!final_path.exists(), "only once committed");
        temp.commit(None, false).unwrap();
        assert_eq!(std::fs::read(&final_path).unwrap(), b"bytes");
        let dir = open_dir(&root, &["b", "c"], None, false, Access::Shared).unwrap();
        let mut read = String::new();
        use std::io::Read;
        open_file(&dir, "entry", None)
            .unwrap()
            .read_to_string(&mut read)
            .unwrap();
        assert_eq!(read, "bytes");
        // A file dropped uncommitted leaves nothing.
        drop(TempFile::create(dir, "other", 0o644).unwrap());
        let names: Vec<_> = std::fs::read_dir(root.join("b/c"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["entry"]);
    }

    #[test]
    fn links_inside_the_cache_are_not_followed() {
        let scratch = scratch("links");
        let root = scratch.path();
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::write(root.join("real/file"), b"x").unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("real/file"), root.join("real/alias")).unwrap();
        let err = open_dir(root, &["link"], None, true, Access::Shared).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let dir = open_dir(root, &["real"], None, false, Access::Shared).unwrap();
        assert!(open_file(&dir, "file", None).is_ok());
        assert!(open_file(&dir, "alias", None).is_err());
    }
}
