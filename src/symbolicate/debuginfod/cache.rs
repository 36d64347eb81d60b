//! The on-disk cache debuginfod's clients share (`CACHE/HEX/debuginfo`): where a debug
//! file is kept, a download's new file beside its final name and its commit, and the
//! new files killed runs left behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::client::Client;
use super::fetch::Answer;
use super::verify::{hex, verify_written};
use crate::files::usercache::{self, SudoUser, TempFile};

/// New files of downloads older than this were left by a run that was killed: a week,
/// far longer than any download takes.
const STALE_DOWNLOAD: Duration = Duration::from_secs(7 * 24 * 3600);

/// The name elfutils' client gives a debug file in its cache: `CACHE/HEX/debuginfo`.
pub(super) const CACHED_NAME: &str = "debuginfo";

/// Permission bits of a cached file: the user's, readable by others as files under the
/// usual umask are (debug files are not secret).
const FILE_MODE: u32 = 0o644;

/// debuginfod's cache is shared with elfutils' tools, and its debug files are public.
const SHARED: usercache::Access = usercache::Access::Shared;

impl Client {
    /// Where the cache keeps the debug file of build ID `id`, whether it is there or not.
    pub fn cached_path(&self, id: &[u8]) -> Option<PathBuf> {
        Some(self.config.cache.as_ref()?.join(hex(id)).join(CACHED_NAME))
    }

    /// A new file for the download of `hex` in the cache at `cache`, in the build ID's
    /// directory (created as the user's); the first download of a run also sweeps what
    /// killed runs left. The answer when the cache cannot be used.
    pub(super) fn new_download(&self, cache: &Path, hex: &str) -> Result<TempFile, Answer> {
        let dir = match usercache::open_dir(cache, &[hex], self.config.owner, true, SHARED) {
            Ok(dir) => dir,
            Err(e) => {
                return Err(Answer::NoCache(format!(
                    "cannot use the cache {}: {e}",
                    cache.display()
                )))
            }
        };
        self.cleaned
            .call_once(|| remove_stale_downloads(cache, self.config.owner));
        TempFile::create(dir, CACHED_NAME, FILE_MODE)
            .map_err(|e| Answer::Refused(format!("cannot write into {}: {e}", cache.display())))
    }

    /// Keeps the download of `hex` (`bytes` long) written into `temp` as its debug file,
    /// when it has build ID `id`; else it is dropped, and no file is left.
    pub(super) fn keep_download(
        &self,
        mut temp: TempFile,
        cache: &Path,
        hex: &str,
        id: &[u8],
        bytes: u64,
    ) -> Answer {
        if let Err(why) = verify_written(&mut temp, id) {
            return Answer::Refused(format!(
                "sent a file for {hex} that is not its debug file: {why}"
            ));
        }
        match temp.commit(self.config.owner, true) {
            Ok(()) => Answer::Fetched(cache.join(hex).join(CACHED_NAME), bytes),
            Err(e) => Answer::Refused(format!("cannot write into {}: {e}", cache.display())),
        }
    }
}

/// Removes from the cache at `cache` (its user's, `owner`) the new files of downloads
/// that runs killed before they ended left, once older than [`STALE_DOWNLOAD`]; only
/// sampler's (named [`usercache::TEMP_PREFIX`]…), in the build IDs' directories, never
/// through a link.
fn remove_stale_downloads(cache: &Path, owner: Option<SudoUser>) {
    let Ok(top) = usercache::open_dir(cache, &[], owner, false, SHARED) else {
        return;
    };
    for name in usercache::names_in(&top) {
        let Some(name) = name.to_str() else {
            continue;
        };
        if name.len() < 2 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        if let Ok(dir) = usercache::open_dir(cache, &[name], owner, false, SHARED) {
            usercache::remove_stale_temps(&dir, STALE_DOWNLOAD);
        }
    }
}
