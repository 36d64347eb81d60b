//! What the environment tells of debuginfod, read as elfutils' client reads it: the
//! servers (`DEBUGINFOD_URLS`), the cache directory, the time-outs and the size limit.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::files::usercache::{self, SudoUser};

/// How long a server may take to accept the connection, to start answering, and, once
/// it sends the file, to send the next bytes, when `DEBUGINFOD_TIMEOUT` does not say.
/// elfutils waits 90 s, which suits a debugger a person waits on for one file; a
/// profiler asks for many files after the command has ended. 10 s is far more than a
/// server on the network needs to answer (tens of milliseconds to find a file it has,
/// a few seconds to pull one out of a large package), and since a server that times out
/// is not asked again, it is also the most a server that is down can add to a run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a download may take in all, when `DEBUGINFOD_MAXTIME` does not say:
/// 60 s. Every file a profile lacks is asked for after its command has ended, with the
/// person waiting for the profile; 60 s fetches a debug file of hundreds of MB on an
/// ordinary connection (a distribution's libc's is a few MB), and one that takes longer
/// is better fetched by hand (`debuginfod-find`) than by every profile.
pub const DEFAULT_MAX_TIME: Duration = Duration::from_secs(60);

/// The largest file downloaded, when `DEBUGINFOD_MAXSIZE` does not say: 4 GiB. The
/// largest debug files of real programs (a browser's or a compiler's, with full DWARF)
/// are one to three GiB; symbolication reads a debug file whole into memory, so
/// anything larger is more than a machine should be made to hold for one library.
pub const DEFAULT_MAX_SIZE: u64 = 4 << 30;

/// The cache directory's name under `$XDG_CACHE_HOME` (or `~/.cache`), as elfutils names it.
const CACHE_DIR_NAME: &str = "debuginfod_client";

/// The server URLs of a `DEBUGINFOD_URLS` value: separated by white space, without a
/// trailing `/`. elfutils' `ima:` policy tags are not URLs and are left out.
pub fn parse_urls(value: &str) -> Vec<String> {
    let mut urls: Vec<String> = Vec::new();
    for word in value.split_whitespace() {
        if word.starts_with("ima:") {
            continue;
        }
        let url = word.trim_end_matches('/').to_string();
        if !url.is_empty() && !urls.contains(&url) {
            urls.push(url);
        }
    }
    urls
}

/// Where the cache is, as elfutils' client chooses it: `DEBUGINFOD_CACHE_PATH`, else
/// `$XDG_CACHE_HOME/debuginfod_client`, else `HOME/.cache/debuginfod_client`. Empty
/// values count as unset.
pub fn cache_dir(
    cache_path: Option<&str>,
    xdg_cache_home: Option<&str>,
    home: Option<&Path>,
) -> Option<PathBuf> {
    match cache_path.filter(|v| !v.is_empty()) {
        Some(path) => Some(PathBuf::from(path)),
        None => Some(usercache::cache_home(xdg_cache_home, home)?.join(CACHE_DIR_NAME)),
    }
}

/// A time-out in seconds as `DEBUGINFOD_TIMEOUT` or `DEBUGINFOD_MAXTIME` gives it:
/// zero or negative is none; unset or not a number is `default`.
pub fn parse_timeout(value: Option<&str>, default: Duration) -> Option<Duration> {
    match value.map(str::trim).map(str::parse::<i64>) {
        Some(Ok(s)) if s <= 0 => None,
        Some(Ok(s)) => Some(Duration::from_secs(s.unsigned_abs())),
        _ => Some(default),
    }
}

/// What sampler was told about debuginfod: the servers, the cache, the limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub servers: Vec<String>,
    pub cache: Option<PathBuf>,
    /// Who the cache belongs to: under sudo, the user who ran it.
    pub owner: Option<SudoUser>,
    pub timeout: Option<Duration>,
    /// `DEBUGINFOD_MAXTIME`: the longest one download may take ([`DEFAULT_MAX_TIME`]).
    pub max_time: Option<Duration>,
    pub max_size: u64,
}

impl Config {
    /// The configuration the environment gives; `None` when there is no server to ask
    /// (`DEBUGINFOD_URLS` unset or empty).
    pub fn from_env() -> Option<Config> {
        let var = |name: &str| std::env::var(name).ok();
        let servers = parse_urls(&var("DEBUGINFOD_URLS")?);
        if servers.is_empty() {
            return None;
        }
        let owner = SudoUser::from_env();
        // Under sudo HOME may still be the user's or already root's; the cache is the
        // user's either way.
        let home = usercache::user_home(owner);
        Some(Config {
            servers,
            cache: cache_dir(
                var("DEBUGINFOD_CACHE_PATH").as_deref(),
                var("XDG_CACHE_HOME").as_deref(),
                home.as_deref(),
            ),
            owner,
            timeout: parse_timeout(var("DEBUGINFOD_TIMEOUT").as_deref(), DEFAULT_TIMEOUT),
            max_time: parse_timeout(var("DEBUGINFOD_MAXTIME").as_deref(), DEFAULT_MAX_TIME),
            max_size: var("DEBUGINFOD_MAXSIZE")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|&s| s > 0)
                .map_or(DEFAULT_MAX_SIZE, |s| s.min(DEFAULT_MAX_SIZE)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_split_on_white_space_without_tags_or_trailing_slashes() {
        assert_eq!(
            parse_urls(" https://a.example/  http://127.0.0.1:8002\n\thttps://a.example ima:enforcing https://b.example//"),
            ["https://a.example", "http://127.0.0.1:8002", "https://b.example"]
        );
        assert!(parse_urls("").is_empty());
        assert!(parse_urls("   ").is_empty());
    }

    #[test]
    fn the_cache_is_where_elfutils_puts_it() {
        let home = Some(Path::new("/home/u"));
        assert_eq!(
            cache_dir(Some("/c"), Some("/x"), home),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            cache_dir(None, Some("/x"), home),
            Some(PathBuf::from("/x/debuginfod_client"))
        );
        assert_eq!(
            cache_dir(Some(""), Some(""), home),
            Some(PathBuf::from("/home/u/.cache/debuginfod_client"))
        );
        assert_eq!(cache_dir(None, None, None), None);
    }

    #[test]
    fn time_outs_as_elfutils_reads_them() {
        let parse = |v| parse_timeout(v, DEFAULT_TIMEOUT);
        assert_eq!(parse(None), Some(DEFAULT_TIMEOUT));
        assert_eq!(parse(Some("3")), Some(Duration::from_secs(3)));
        assert_eq!(parse(Some("0")), None);
        assert_eq!(parse(Some("-1")), None);
        assert_eq!(parse(Some("soon")), Some(DEFAULT_TIMEOUT));
        assert_eq!(
            parse_timeout(None, DEFAULT_MAX_TIME),
            Some(Duration::from_secs(60)),
            "a download has 60 s unless DEBUGINFOD_MAXTIME says"
        );
    }
}
