//! The text of the source files a profile's frames name, to embed in the profile (the
//! Firefox Profiler's source view shows it, with each line's samples), read with the
//! rights of the user who asked for the profile and never more.
//!
//! The names come from the debug information of the programs profiled, which their
//! authors wrote: a hostile program can name `/etc/shadow` as its source. So:
//! - under sudo, the files are read by a child process that runs as the invoking user
//!   (`SUDO_UID`/`SUDO_GID`, without supplementary groups): what they could not read is
//!   left out;
//! - as root without sudo, only files that every user may read (mode `o+r`);
//! - any other user reads with their own rights.
//!
//! Only regular files are read (a FIFO or a device named as a source is skipped, and
//! never waited on), only text (UTF-8), each no larger than what the total still allows,
//! and the total is capped ([`MAX_SOURCE_BYTES`]).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::files::usercache::SudoUser;

/// The most source text embedded in one profile: the hottest files first. 2 MiB holds
/// the sources of a program of a few tens of thousands of lines; past that, the files
/// of few samples are left out rather than the profile growing by megabytes.
pub const MAX_SOURCE_BYTES: usize = 2 << 20;

/// The hidden subcommand that reads sources as the invoking user.
pub const READ_SOURCES_COMMAND: &str = "read-sources";

/// How long the child that reads as the user may take: sources are on local disks; a
/// file on a hung network mount is not worth holding the profile for.
const CHILD_TIMEOUT: Duration = Duration::from_secs(10);

/// Whose rights the sources are read with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// This process's own (a user who is not root).
    Own,
    /// Root without sudo: only files every user may read.
    WorldReadable,
    /// Root under sudo: the invoking user's, in a child process.
    User(SudoUser),
}

impl Reader {
    /// The reader for this process: the invoking user under sudo, else as above.
    pub fn for_this_process() -> Reader {
        match (
            nix::unistd::Uid::effective().is_root(),
            SudoUser::from_env(),
        ) {
            (true, Some(user)) => Reader::User(user),
            (true, None) => Reader::WorldReadable,
            (false, _) => Reader::Own,
        }
    }
}

/// The texts of `paths` (hottest first) that can be read, within `budget` bytes in all:
/// a file that does not fit is skipped, and a smaller one after it may still be taken.
pub fn read_texts(paths: &[String], budget: usize, reader: Reader) -> BTreeMap<String, String> {
    match reader {
        Reader::Own => read_in_process(paths, budget, false),
        Reader::WorldReadable => read_in_process(paths, budget, true),
        Reader::User(user) => match read_as_user(paths, budget, user) {
            Ok(texts) => texts,
            Err(why) => {
                crate::say!("sampler: the source files are not embedded: {why}");
                BTreeMap::new()
            }
        },
    }
}

fn read_in_process(
    paths: &[String],
    budget: usize,
    world_readable_only: bool,
) -> BTreeMap<String, String> {
    let mut left = budget;
    let mut texts = BTreeMap::new();
    for path in paths {
        if let Some(text) = read_one(path, left, world_readable_only) {
            left -= text.len();
            texts.insert(path.clone(), text);
        }
    }
    texts
}

/// A regular file's text, when it is UTF-8, holds at most `limit` bytes, and (when
/// asked) every user may read it. The file is opened without waiting (a FIFO would
/// block) and its length is checked on the open file before anything is read.
fn read_one(path: &str, limit: usize, world_readable_only: bool) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    let readable_by_all = meta.mode() & 0o004 != 0;
    if !meta.is_file() || meta.len() > limit as u64 || (world_readable_only && !readable_by_all) {
        return None;
    }
    let mut bytes = Vec::new();
    // One byte more than the length: a file that grew since is not the one measured.
    file.take(meta.len() + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 != meta.len() {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// Reads as `user` in a child process: `sampler read-sources BUDGET` with the paths on
/// its standard input (NUL-separated), answering with a JSON object of the texts.
fn read_as_user(
    paths: &[String],
    budget: usize,
    user: SudoUser,
) -> Result<BTreeMap<String, String>, String> {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new("/proc/self/exe")
        .arg(READ_SOURCES_COMMAND)
        .arg(budget.to_string())
        .uid(user.uid)
        .gid(user.gid)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start a reader as user {}: {e}", user.uid))?;
    let mut list = Vec::new();
    for path in paths {
        list.extend_from_slice(path.as_bytes());
        list.push(0);
    }
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let writer = std::thread::spawn(move || stdin.write_all(&list));
    // JSON escapes a byte in at most 6: the answer is bounded by the budget.
    let limit = (budget as u64) * 6 + 4096;
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let reader = std::thread::spawn(move || {
        let mut answer = Vec::new();
        (&mut stdout)
            .take(limit)
            .read_to_end(&mut answer)
            .map(|_| answer)
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > CHILD_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "reading them took more than {} s",
                    CHILD_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e.to_string()),
        }
    };
    let _ = writer.join();
    let answer = reader
        .join()
        .map_err(|_| "the reader's answer was lost".to_string())?
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the reader as user {} failed ({status})", user.uid));
    }
    let texts: BTreeMap<String, String> =
        serde_json::from_slice(&answer).map_err(|e| format!("the reader's answer: {e}"))?;
    // The child is trusted no further than its budget.
    let total: usize = texts.values().map(String::len).sum();
    match total <= budget && texts.keys().all(|k| paths.contains(k)) {
        true => Ok(texts),
        false => Err("the reader answered more than it was asked".into()),
    }
}

/// The child's side (`sampler read-sources BUDGET`, running as the invoking user):
/// reads the NUL-separated paths on standard input with its own rights and prints the
/// texts it could read as one JSON object.
pub fn read_sources_main(budget: usize) -> anyhow::Result<()> {
    let mut input = Vec::new();
    // Paths of a profile's functions: bounded like the answer.
    std::io::stdin().take(64 << 20).read_to_end(&mut input)?;
    let paths: Vec<String> = input
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let texts = read_in_process(&paths, budget.min(MAX_SOURCE_BYTES), false);
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &texts)?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_text_files_within_the_budget_are_read() {
        let dir = crate::files::testdir::TestDir::new("sources");
        let write = |name: &str, text: &[u8], mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
            path.display().to_string()
        };
        let hot = write("hot.c", b"int hot(void) { return 1; }\n", 0o644);
        let big = write("big.c", &[b'x'; 100], 0o644);
        let small = write("small.c", b"int s;\n", 0o600);
        let binary = write("bin.c", &[0xff, 0xfe, 0], 0o644);
        let fifo = dir.path().join("fifo.c");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let fifo = fifo.display().to_string();
        let paths = [
            hot.clone(),
            fifo,
            big.clone(),
            binary,
            small.clone(),
            "rel.c".into(),
        ];
        // 40 bytes: hot (28) fits, big (100) does not, small (7) still does.
        let texts = read_in_process(&paths, 40, false);
        assert_eq!(texts.keys().collect::<Vec<_>>(), vec![&hot, &small]);
        assert_eq!(texts[&hot], "int hot(void) { return 1; }\n");
        // Only what every user may read, for root without sudo.
        let texts = read_in_process(&paths, 40, true);
        assert_eq!(texts.keys().collect::<Vec<_>>(), vec![&hot]);
    }
}
