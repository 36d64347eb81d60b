//! The HTTP request for one debug file and its limits: the time-outs, the least rate, the
//! largest size, and the first bytes that must be the file asked for; a download is
//! streamed into the cache's new file, never held in memory.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::client::Client;
use super::report::size;
use super::verify::early_verdict;

/// The slowest a download may go, averaged over each span of the time-out
/// (`DEBUGINFOD_TIMEOUT`): 100 KiB/s, as elfutils' client asks of a server (curl's low
/// speed limit). A server below it would not deliver a debug file within
/// [`DEFAULT_MAX_TIME`](super::DEFAULT_MAX_TIME) anyway.
pub const MIN_RATE: u64 = 100 << 10;

/// How much of a download's start is kept to check that it is an ELF file with the
/// build ID asked for: 64 KiB holds an ELF header, its program headers and the notes
/// they place at the start, where linkers put the build ID.
pub(super) const PREFIX_BYTES: usize = 64 << 10;

/// A download at least this large is announced before it starts: 20 MB take seconds on
/// an ordinary connection, long enough for a silent pause to look like a hang.
const ANNOUNCED_SIZE: u64 = 20_000_000;

/// What one server said to one request.
pub(super) enum Answer {
    Fetched(PathBuf, u64),
    NotFound,
    /// This file is not used (wrong build ID, too large, not storable); the server is
    /// still asked for others.
    Refused(String),
    /// The server is not asked again in this run.
    Down(String),
    /// The cache cannot be written: no server is asked.
    NoCache(String),
}

impl Client {
    /// Asks `server` for the debug file of `id` (`hex` spelled out; of the file `name`)
    /// and stores it in the cache.
    pub(super) fn fetch(
        &self,
        server: &str,
        cache: &Path,
        hex: &str,
        id: &[u8],
        name: &str,
    ) -> Answer {
        let url = format!("{server}/buildid/{hex}/debuginfo");
        let mut response = match self.agent.get(&url).call() {
            Ok(r) => r,
            Err(e) => return Answer::Down(self.describe(&e)),
        };
        match response.status().as_u16() {
            200 => {}
            404 => return Answer::NotFound,
            status => return Answer::Refused(format!("HTTP status {status}")),
        }
        let limit = self.config.max_size;
        let too_large = || {
            Answer::Refused(format!(
                "the debug file of {hex} is larger than the limit of {limit} bytes (DEBUGINFOD_MAXSIZE)"
            ))
        };
        match response.body().content_length() {
            Some(n) if n > limit => return too_large(),
            Some(n) if n >= ANNOUNCED_SIZE => {
                say!(
                    "sampler: debuginfod: downloading the debug file of {name} ({}) from {server}",
                    size(n)
                );
            }
            _ => {}
        }
        let mut temp = match self.new_download(cache, hex) {
            Ok(t) => t,
            Err(answer) => return answer,
        };
        let mut body = response.body_mut().as_reader();
        let mut buffer = vec![0u8; 64 << 10];
        let mut prefix = Vec::new();
        let mut bytes = 0u64;
        // Bytes by the start of the current span of the time-out, and when it began.
        let mut span = (Instant::now(), 0u64);
        loop {
            if let Some(signal) = crate::record::interrupt::stopped() {
                return Answer::Refused(format!("{signal} stopped the download"));
            }
            let n = match body.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Answer::Down(self.broke_off(e)),
            };
            bytes += n as u64;
            if bytes > limit {
                return too_large();
            }
            if let Err(e) = temp.file.write_all(&buffer[..n]) {
                return Answer::Refused(format!("cannot write into {}: {e}", cache.display()));
            }
            if prefix.len() < PREFIX_BYTES {
                let take = n.min(PREFIX_BYTES - prefix.len());
                prefix.extend_from_slice(&buffer[..take]);
                if let Some(Err(why)) = early_verdict(&prefix, id) {
                    return Answer::Refused(format!(
                        "sent a file for {hex} that is not its debug file: {why}"
                    ));
                }
            }
            if let Some(timeout) = self.config.timeout {
                if span.0.elapsed() >= timeout {
                    let sent = bytes - span.1;
                    if sent < MIN_RATE * timeout.as_secs().max(1) {
                        return Answer::Down(format!(
                            "sent {} in {} s, slower than {} KiB/s (DEBUGINFOD_TIMEOUT)",
                            size(sent),
                            timeout.as_secs(),
                            MIN_RATE >> 10
                        ));
                    }
                    span = (Instant::now(), bytes);
                }
            }
        }
        self.keep_download(temp, cache, hex, id, bytes)
    }

    /// One clause for a download that broke off with `e`.
    fn broke_off(&self, e: io::Error) -> String {
        match ureq::Error::from(e) {
            timeout @ ureq::Error::Timeout(_) => self.describe(&timeout),
            ureq::Error::Io(io) => format!("the download broke off: {}", io_reason(&io)),
            other => format!("the download broke off: {other}"),
        }
    }

    /// One clause for a failed request.
    fn describe(&self, e: &ureq::Error) -> String {
        match e {
            ureq::Error::Timeout(ureq::Timeout::PerCall | ureq::Timeout::Global) => {
                "the download took longer than DEBUGINFOD_MAXTIME".to_string()
            }
            ureq::Error::Timeout(_) => match self.config.timeout {
                Some(t) => format!("no answer within {} s (DEBUGINFOD_TIMEOUT)", t.as_secs()),
                None => "timed out".to_string(),
            },
            ureq::Error::HostNotFound => "unreachable (host not found)".to_string(),
            ureq::Error::Io(io) => format!("unreachable ({})", io_reason(io)),
            other => format!("unreachable ({other})"),
        }
    }
}

/// An I/O error as a short reason (`connection refused`), without its OS error number.
fn io_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        io::ErrorKind::TimedOut => "timed out".into(),
        _ => e.to_string(),
    }
}
