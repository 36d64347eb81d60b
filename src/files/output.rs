//! Where outputs go, safely. sampler runs as root on people's machines, often in
//! directories other users can write, so an output path is checked before recording
//! starts and written only at the end, atomically:
//!
//! - [`check_destination`] says what is wrong with `-o` before anything is recorded, and
//!   creates, truncates and deletes nothing: a failed run leaves every file as it was.
//! - [`AtomicFile`] writes a new file in the same directory (a fresh name, created
//!   exclusively, never through a symbolic link), flushes it to disk, hands it to the
//!   sudo user through its open descriptor (never by path), and only then renames it
//!   over the old name. When anything fails, the new file is removed and the old one is
//!   untouched; every error names the path. New files of the same name that a killed
//!   run left (its pid is gone; they are this user's) are removed once the output is
//!   written: a run that fails deletes nothing.
//! - As root, the path itself must not be a symbolic link, nor a file of a user other
//!   than root or the one who ran sudo: someone else may have put it there. Under sudo
//!   the directory must be one the user who ran sudo could write: the output is handed
//!   to them, and they could not have created it there themselves.
//! - When the output cannot be written at the end (its file system full or read-only),
//!   the recording is not lost: [`write_elsewhere`] gives a private new file in `$TMPDIR`
//!   (else `/tmp`), then in the user's cache directory, never replacing anything.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

pub use crate::files::usercache::SudoUser;

/// The directory an output lands in (`.` for a bare name).
fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// What is wrong with writing an output at `path`, found without creating anything: its
/// directory must exist and be writable, the name must not be a directory, and as root
/// (`root`) not a symbolic link nor a file of another user than root or `sudo`.
pub fn check_destination(path: &Path, root: bool, sudo: Option<SudoUser>) -> Result<()> {
    let dir = directory_of(path);
    let dir_meta = std::fs::metadata(dir).with_context(|| {
        format!(
            "cannot write {}: no directory {}",
            path.display(),
            dir.display()
        )
    })?;
    if !dir_meta.is_dir() {
        bail!(
            "cannot write {}: {} is not a directory",
            path.display(),
            dir.display()
        );
    }
    if nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_err() {
        bail!(
            "cannot write {}: the directory {} is not writable (choose another -o)",
            path.display(),
            dir.display()
        );
    }
    if let Some(user) = sudo.filter(|_| root) {
        if !user.may_write_dir(&dir_meta) {
            bail!(
                "cannot write {}: user {} (who ran sudo) may not write in {}, and sampler does not create files there on their behalf (choose another -o)",
                path.display(),
                user.uid,
                dir.display()
            );
        }
    }
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        if root {
            bail!(
                "{} is a symbolic link: sampler runs as root and does not write through one (remove it, or choose another -o)",
                path.display()
            );
        }
    } else if meta.is_dir() {
        bail!(
            "{} is a directory (choose a file name for -o)",
            path.display()
        );
    } else if !meta.is_file() {
        // A device, fifo or socket: the rename would replace it (as root, `/dev/null`).
        bail!(
            "{} is not a regular file (a device, fifo or socket): choose a file name for -o",
            path.display()
        );
    } else if root && meta.uid() != 0 && sudo.is_none_or(|s| s.uid != meta.uid()) {
        bail!(
            "{} belongs to user {}: sampler runs as root and does not replace another user's file (remove it, or choose another -o)",
            path.display(),
            meta.uid()
        );
    }
    Ok(())
}

/// A new file that takes the place of `path` only when [`AtomicFile::commit`] is called;
/// dropped uncommitted, it is removed.
pub struct AtomicFile {
    path: PathBuf,
    temp: PathBuf,
    file: Option<File>,
}

/// Permission bits of a new output: readable by everyone, as files a user creates are
/// under the usual umask.
const OUTPUT_MODE: u32 = 0o644;

impl AtomicFile {
    /// Creates the new file beside `path`: `.NAME.sampler-PID-N`, exclusively (an
    /// existing file or link of that name is an error, never followed).
    pub fn create(path: &Path) -> Result<AtomicFile> {
        let dir = directory_of(path);
        let name = path
            .file_name()
            .with_context(|| format!("cannot write {}: it names no file", path.display()))?;
        let mut attempt = 0u32;
        loop {
            let temp = dir.join(format!(
                ".{}.sampler-{}-{attempt}",
                name.to_string_lossy(),
                std::process::id()
            ));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(OUTPUT_MODE)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&temp)
            {
                Ok(file) => {
                    return Ok(AtomicFile {
                        path: path.to_path_buf(),
                        temp,
                        file: Some(file),
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot write {}", path.display()))
                }
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open new file, to write into.
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("written before commit")
    }

    /// Flushes the new file to disk, gives it to `owner` (through the descriptor), and
    /// renames it over `path`; then removes what killed runs left beside it
    /// (`remove_left_behind`).
    pub fn commit(mut self, owner: Option<SudoUser>) -> Result<()> {
        let file = self.file.take().expect("committed once");
        let what = || format!("cannot write {}", self.path.display());
        file.sync_all().with_context(what)?;
        if let Some(user) = owner {
            std::os::unix::fs::fchown(&file, Some(user.uid), Some(user.gid)).with_context(
                || format!("cannot give {} to uid {}", self.path.display(), user.uid),
            )?;
        }
        drop(file);
        std::fs::rename(&self.temp, &self.path).with_context(what)?;
        if let Some(name) = self.path.file_name() {
            remove_left_behind(directory_of(&self.path), &name.to_string_lossy());
        }
        Ok(())
    }
}

/// Removes the new files of outputs named `name` in `dir` (`.NAME.sampler-PID-N`) that
/// runs killed before they could rename or remove them (SIGKILL, a power cut) left:
/// those of a pid that is gone, and regular files of this process's user only (never
/// another user's, never through a link). A live pid's may be a run writing now.
fn remove_left_behind(dir: &Path, name: &str) {
    let prefix = format!(".{name}.sampler-");
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    let me = nix::unistd::Uid::effective().as_raw();
    for entry in listing.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
            .filter(|&pid| pid > 0)
        else {
            continue;
        };
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.uid() == me);
        if gone && ours {
            let _ = std::fs::remove_file(&path);
        }
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file().flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Permission bits of an output written to a fallback place: the user's alone, since
/// `/tmp` is shared and a profile tells what their programs did.
const FALLBACK_MODE: u32 = 0o600;

/// The directories below the user's cache directory where an output goes when neither
/// its own directory nor the temporary one can take it.
const FALLBACK_CACHE_DIRS: [&str; 2] = ["sampler", "unsaved"];

/// Writes an output that could not be written at `path` (its file system full or
/// read-only) into a new file elsewhere, in order: `$TMPDIR` (else `/tmp`), then the
/// user's cache directory (`~/.cache/sampler/unsaved`). The new file is named
/// `sampler-TIME-PID-NAME` after `path`'s file name (so it still implies its format),
/// created exclusively (never through a link, never replacing a file), readable by its
/// user only, and given to `owner`. Returns where it went, or why each place failed.
pub fn write_elsewhere(
    path: &Path,
    owner: Option<SudoUser>,
    write: &mut dyn FnMut(&mut File) -> std::io::Result<()>,
) -> std::result::Result<PathBuf, Vec<String>> {
    let file_name = path.file_name().map_or_else(
        || "profile".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let name = format!("sampler-{now}-{}-{file_name}", std::process::id());
    let mut failures = Vec::new();
    let temp = std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    match write_new_in(&temp, &name, owner, write) {
        Ok(written) => return Ok(written),
        Err(e) => failures.push(format!("{}: {e}", temp.display())),
    }
    match crate::files::usercache::user_cache_home(owner) {
        None => failures.push("no cache directory (no home directory)".to_string()),
        Some(root) => match write_in_cache(&root, &name, owner, write) {
            Ok(written) => return Ok(written),
            Err(e) => failures.push(format!(
                "{}: {e}",
                root.join(FALLBACK_CACHE_DIRS.join("/")).display()
            )),
        },
    }
    Err(failures)
}

/// Creates `dir/name` exclusively and writes it whole, or removes it again.
fn write_new_in(
    dir: &Path,
    name: &str,
    owner: Option<SudoUser>,
    write: &mut dyn FnMut(&mut File) -> std::io::Result<()>,
) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FALLBACK_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)?;
    let written = write(&mut file)
        .and_then(|()| file.sync_all())
        .and_then(|()| match owner {
            Some(user) => std::os::unix::fs::fchown(&file, Some(user.uid), Some(user.gid)),
            None => Ok(()),
        });
    if let Err(e) = written {
        drop(file);
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok(path)
}

/// Writes `name` into the user's cache directory `root`, below [`FALLBACK_CACHE_DIRS`],
/// opened and created as the caches are (see [`crate::files::usercache`]).
fn write_in_cache(
    root: &Path,
    name: &str,
    owner: Option<SudoUser>,
    write: &mut dyn FnMut(&mut File) -> std::io::Result<()>,
) -> std::io::Result<PathBuf> {
    use crate::files::usercache::{open_dir, Access, TempFile};
    let dir = open_dir(root, &FALLBACK_CACHE_DIRS, owner, true, Access::Private)?;
    let mut temp = TempFile::create(dir, name, FALLBACK_MODE)?;
    write(&mut temp.file)?;
    temp.commit_new(owner, true)?;
    Ok(root.join(FALLBACK_CACHE_DIRS.join("/")).join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> crate::files::testdir::TestDir {
        crate::files::testdir::TestDir::new(&format!("output-{name}"))
    }

    #[test]
    fn the_old_file_stays_until_the_new_one_is_complete() {
        let dir = scratch("atomic");
        let path = dir.join("out.json");
        std::fs::write(&path, "old").unwrap();
        let mut new = AtomicFile::create(&path).unwrap();
        new.write_all(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        drop(new);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "the new file is gone"
        );
        let mut new = AtomicFile::create(&path).unwrap();
        new.write_all(b"new").unwrap();
        new.commit(None).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn destinations_are_checked_without_creating_anything() {
        let dir = scratch("check");
        let path = dir.join("out.json");
        check_destination(&path, true, None).unwrap();
        assert!(!path.exists());
        let err = check_destination(&dir.join("nodir/out.json"), false, None).unwrap_err();
        assert!(format!("{err:#}").contains("no directory"), "{err:#}");
        let err = check_destination(dir.path(), false, None).unwrap_err();
        assert!(format!("{err:#}").contains("is a directory"), "{err:#}");
        let err = check_destination(Path::new("/dev/null"), true, None).unwrap_err();
        assert!(format!("{err:#}").contains("not a regular file"), "{err:#}");
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        let err = check_destination(&path, true, None).unwrap_err();
        assert!(format!("{err:#}").contains("symbolic link"), "{err:#}");
    }
}
