//! The spool of a continuous recording: each window's request, as it will be sent
//! (gzipped), is written to a directory first and removed once a back end took it, so
//! that a back end that is down or slow loses nothing up to the spool's cap; what waits
//! is sent oldest first when it answers again, by this run or the next one with the same
//! spool.
//!
//! Files are named `NNNNNNNNNNNN-KIND.gz` (a sequence number, then `otlp` or `pprof`),
//! written atomically and privately (0600, in a 0700 directory of the user's, opened
//! without following links, as [`crate::files::usercache`] does for the caches), and
//! read back only when they are regular files of that user no larger than the cap. Past
//! the cap the oldest go, counted.

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::push::{self, Destination, Payload};
use crate::files::usercache::{self, Access, SudoUser, TempFile};

/// The default cap: 256 MiB. A 10-second window of a busy machine at 19 Hz is a request
/// of 10–30 KB gzipped, so this holds days of windows; at 1000 Hz some hours.
pub const DEFAULT_SPOOL_BYTES: u64 = 256 << 20;

/// A window waiting in the spool.
#[derive(Clone, Debug)]
struct Waiting {
    name: OsString,
    number: u64,
    payload: Payload,
    bytes: u64,
}

/// What one [`Spool::send`] did.
#[derive(Debug, Default)]
pub struct Sent {
    /// Windows a back end took.
    pub sent: u64,
    /// Windows a back end refused (each with why): sending them again would not help,
    /// so they were removed.
    pub refused: Vec<String>,
    /// Why a back end could not take windows now (they wait).
    pub down: Vec<String>,
    /// Windows still waiting.
    pub waiting: usize,
}

/// The spool directory, opened.
pub struct Spool {
    dir: OwnedFd,
    /// Where it is, for messages.
    pub path: PathBuf,
    owner: Option<SudoUser>,
    max_bytes: u64,
    next: u64,
    /// Windows dropped to keep within the cap.
    pub dropped: u64,
}

impl Spool {
    /// Opens (creating it if needed) the spool at `root/below…`, owned by `owner` (the
    /// sudo user) or whoever runs sampler, holding at most `max_bytes`.
    pub fn open(
        root: &Path,
        below: &[&str],
        owner: Option<SudoUser>,
        max_bytes: u64,
    ) -> std::io::Result<Spool> {
        let dir = usercache::open_dir(root, below, owner, true, Access::Private)?;
        usercache::make_private(&dir)?;
        usercache::remove_stale_temps(&dir, std::time::Duration::from_secs(3600));
        let mut path = root.to_path_buf();
        path.extend(below);
        let mut spool = Spool {
            dir,
            path,
            owner,
            max_bytes,
            next: 0,
            dropped: 0,
        };
        spool.next = spool.waiting().last().map_or(0, |w| w.number + 1);
        Ok(spool)
    }

    /// The windows waiting, oldest first.
    fn waiting(&self) -> Vec<Waiting> {
        let mut waiting: Vec<Waiting> = usercache::names_in(&self.dir)
            .into_iter()
            .filter_map(|name| {
                let (number, payload) = parse_name(name.to_str()?)?;
                let stat = usercache::regular_file_at(&self.dir, &name)?;
                Some(Waiting {
                    name,
                    number,
                    payload,
                    bytes: stat.st_size.max(0) as u64,
                })
            })
            .collect();
        waiting.sort_by_key(|w| w.number);
        waiting
    }

    /// How many windows wait.
    pub fn len(&self) -> usize {
        self.waiting().len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds a window's `body` for destinations of `payload`, then drops the oldest while
    /// the spool holds more than its cap.
    pub fn add(&mut self, payload: Payload, body: &[u8]) -> std::io::Result<()> {
        let name = format!("{:012}-{}.gz", self.next, payload.name());
        let mut temp = TempFile::create(self.dir.try_clone()?, &name, 0o600)?;
        temp.file.write_all(body)?;
        temp.commit(self.owner, false)?;
        self.next += 1;
        let waiting = self.waiting();
        let mut total: u64 = waiting.iter().map(|w| w.bytes).sum();
        for old in &waiting {
            if total <= self.max_bytes {
                break;
            }
            if usercache::remove_file(&self.dir, &old.name).is_ok() {
                total -= old.bytes;
                self.dropped += 1;
            }
        }
        Ok(())
    }

    /// Sends what waits, oldest first, each to the destinations of its kind; what a
    /// destination took or refused is removed. Once a destination cannot take one, the
    /// later ones of its kind wait too (they are sent in order).
    pub fn send(&mut self, dests: &[Destination]) -> Sent {
        let mut sent = Sent::default();
        let mut blocked: HashSet<Payload> = HashSet::new();
        for w in self.waiting() {
            let to: Vec<&Destination> = dests.iter().filter(|d| d.payload == w.payload).collect();
            if to.is_empty() || blocked.contains(&w.payload) {
                sent.waiting += 1;
                continue;
            }
            let body = match self.read(&w) {
                Ok(body) => body,
                Err(e) => {
                    sent.refused
                        .push(format!("{}: unreadable: {e}", self.shown(&w)));
                    let _ = usercache::remove_file(&self.dir, &w.name);
                    continue;
                }
            };
            let mut remove = true;
            for dest in to {
                match push::post(dest, &body) {
                    Ok(()) => {}
                    Err(e) if e.retry => {
                        sent.down.push(format!("{}: {}", dest.url, e.why));
                        remove = false;
                    }
                    Err(e) => sent.refused.push(format!(
                        "{} refused {}: {}",
                        dest.url,
                        self.shown(&w),
                        e.why
                    )),
                }
            }
            if remove {
                sent.sent += 1;
                let _ = usercache::remove_file(&self.dir, &w.name);
            } else {
                blocked.insert(w.payload);
                sent.waiting += 1;
            }
        }
        sent
    }

    fn read(&self, w: &Waiting) -> std::io::Result<Vec<u8>> {
        let name = w.name.to_str().unwrap_or_default();
        let file = usercache::open_file(&self.dir, name, self.owner)?;
        let mut body = Vec::new();
        file.take(self.max_bytes + 1).read_to_end(&mut body)?;
        if body.len() as u64 > self.max_bytes {
            return Err(std::io::Error::other("larger than the spool's cap"));
        }
        Ok(body)
    }

    fn shown(&self, w: &Waiting) -> String {
        self.path.join(&w.name).display().to_string()
    }
}

/// The sequence number and kind of a spooled window's file name.
fn parse_name(name: &str) -> Option<(u64, Payload)> {
    let (number, rest) = name.split_once('-')?;
    if number.len() != 12 || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let payload = match rest {
        "otlp.gz" => Payload::Otlp,
        "pprof.gz" => Payload::Pprof,
        _ => return None,
    };
    Some((number.parse().ok()?, payload))
}
