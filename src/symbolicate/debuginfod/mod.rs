//! debuginfod: separate debug files fetched by build ID from the servers the user lists
//! in `DEBUGINFOD_URLS`, as gdb, perf and elfutils fetch them, and kept in the same
//! client cache they use, so that one download serves every tool.
//!
//! What it owns and why it is careful:
//!
//! - The request is `GET URL/buildid/HEX/debuginfo`: 200 is the file, 404 is "not here".
//!   Servers are asked in the order listed; one that cannot be reached or does not answer
//!   in time is not asked again in this run, so a server that is down costs one time-out,
//!   not one per library.
//! - Each build ID is looked up once per run, however many libraries or threads ask.
//! - A download goes into a new file beside its final name (created exclusively, never
//!   through a symbolic link), is streamed there (never held in memory), must have the
//!   build ID that was asked for, and only then is flushed, handed to the user, and
//!   renamed to `CACHE/HEX/debuginfo`. A failed or refused download leaves no file.
//! - Under sudo the cache is the invoking user's (their home, their files): every
//!   directory is opened relative to one already opened and checked to be theirs, new
//!   ones are created and given to them through their descriptors, never by path
//!   ([`crate::files::usercache`], which the symbol cache shares).
//! - Time: a download has [`DEFAULT_MAX_TIME`] in all, and must keep going at
//!   [`MIN_RATE`] over each time-out's span, so that a server sending a byte now and
//!   then cannot hold sampler; its first bytes must be an ELF file, with the build ID
//!   asked for when its notes are among them, or nothing more is read. A signal that
//!   stops the naming ([`crate::record::interrupt`]) leaves a lookup at once; the download is
//!   dropped, and its new file removed before sampler exits
//!   ([`usercache::remove_unfinished`](crate::files::usercache::remove_unfinished)). New files a killed run left are removed a week
//!   later.
//! - Nothing here fails the run: what went wrong is said in [`Client::summary`].
//!
//! One concern per file: `config` (what the environment says), `client` (one lookup per
//! build ID, server after server), `fetch` (the HTTP request and its limits), `verify`
//! (whether a file is the one asked for), `cache` (the on-disk cache elfutils shares)
//! and `report` (the summary line).

mod cache;
mod client;
mod config;
mod fetch;
mod report;
mod verify;

pub use client::Client;
pub use config::{
    cache_dir, parse_timeout, parse_urls, Config, DEFAULT_MAX_SIZE, DEFAULT_MAX_TIME,
    DEFAULT_TIMEOUT,
};
pub use fetch::MIN_RATE;
pub(crate) use report::size;
pub use verify::{hex, verify};

#[cfg(test)]
mod tests;

/// The system's roots of trust, as curl (elfutils' client) uses: a CA that the
/// machine's administrator added is trusted here too. For every HTTPS client of sampler's.
pub(crate) fn system_trust() -> ureq::tls::TlsConfig {
    ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build()
}
