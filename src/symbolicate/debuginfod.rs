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
//!   ([`usercache::remove_unfinished`]). New files a killed run left are removed a week
//!   later.
//! - Nothing here fails the run: what went wrong is said in [`Client::summary`].

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::files::usercache::SudoUser;
use crate::files::usercache::{self, TempFile};

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

/// The slowest a download may go, averaged over each span of the time-out
/// (`DEBUGINFOD_TIMEOUT`): 100 KiB/s, as elfutils' client asks of a server (curl's low
/// speed limit). A server below it would not deliver a debug file within
/// [`DEFAULT_MAX_TIME`] anyway.
pub const MIN_RATE: u64 = 100 << 10;

/// How much of a download's start is kept to check that it is an ELF file with the
/// build ID asked for: 64 KiB holds an ELF header, its program headers and the notes
/// they place at the start, where linkers put the build ID.
const PREFIX_BYTES: usize = 64 << 10;

/// How often a lookup looks whether a signal has stopped the naming: 100 ms, well within
/// the few seconds a person waits after Ctrl-C.
const STOP_POLL: Duration = Duration::from_millis(100);

/// New files of downloads older than this were left by a run that was killed: a week,
/// far longer than any download takes.
const STALE_DOWNLOAD: Duration = Duration::from_secs(7 * 24 * 3600);

/// The largest file downloaded, when `DEBUGINFOD_MAXSIZE` does not say: 4 GiB. The
/// largest debug files of real programs (a browser's or a compiler's, with full DWARF)
/// are one to three GiB; symbolication reads a debug file whole into memory, so
/// anything larger is more than a machine should be made to hold for one library.
pub const DEFAULT_MAX_SIZE: u64 = 4 << 30;

/// A download at least this large is announced before it starts: 20 MB take seconds on
/// an ordinary connection, long enough for a silent pause to look like a hang.
const ANNOUNCED_SIZE: u64 = 20_000_000;

/// The name elfutils' client gives a debug file in its cache: `CACHE/HEX/debuginfo`.
const CACHED_NAME: &str = "debuginfo";

/// The cache directory's name under `$XDG_CACHE_HOME` (or `~/.cache`), as elfutils names it.
const CACHE_DIR_NAME: &str = "debuginfod_client";

/// Permission bits of a cached file: the user's, readable by others as files under the
/// usual umask are (debug files are not secret).
const FILE_MODE: u32 = 0o644;

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

/// The lower-case hex of a build ID, as URLs and cache names spell it.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `data` (an ELF file, in memory or behind a reader) has build ID `id`; if not,
/// what it is instead.
pub fn verify<'d, R: object::ReadRef<'d>>(data: R, id: &[u8]) -> Result<(), String> {
    use object::Object;
    let file = object::File::parse(data).map_err(|_| "not an ELF file".to_string())?;
    match file.build_id() {
        Ok(Some(found)) if found == id => Ok(()),
        Ok(Some(found)) => Err(format!("its build ID is {}, not {}", hex(found), hex(id))),
        _ => Err("it has no build ID".to_string()),
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

/// What became of the lookups, for the summary.
#[derive(Default)]
struct Report {
    /// Per server, in the order listed: files fetched and their bytes.
    fetched: HashMap<usize, (usize, u64)>,
    from_cache: usize,
    /// Build IDs every server asked said it does not have.
    not_found: usize,
    /// Build IDs no server answered for (down, or what it sent was not used).
    unanswered: usize,
    /// Why servers were given up on, or why a file they sent was not used.
    problems: Vec<String>,
    /// Why nothing could be fetched at all (the cache cannot be used).
    no_cache: Option<String>,
    fetch_time: Duration,
}

/// The answer for one build ID, found once: the debug file, or why there is none.
type Lookup = OnceLock<Result<PathBuf, String>>;

/// The debuginfod client of one run.
pub struct Client {
    config: Config,
    agent: ureq::Agent,
    lookups: Mutex<HashMap<Vec<u8>, Arc<Lookup>>>,
    /// Servers not asked again: index into `config.servers`.
    down: Mutex<Vec<usize>>,
    report: Mutex<Report>,
    /// New files killed runs left in the cache are looked for once per run.
    cleaned: std::sync::Once,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .finish()
    }
}

/// What one server said to one request.
enum Answer {
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

/// The system's roots of trust, as curl (elfutils' client) uses: a CA that the
/// machine's administrator added is trusted here too. For every HTTPS client of sampler's.
pub(crate) fn system_trust() -> ureq::tls::TlsConfig {
    ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build()
}

impl Client {
    pub fn new(config: Config) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_resolve(config.timeout)
            .timeout_connect(config.timeout)
            .timeout_recv_response(config.timeout)
            .timeout_per_read(config.timeout)
            .timeout_per_call(config.max_time)
            .user_agent(format!("sampler/{}", env!("CARGO_PKG_VERSION")))
            .tls_config(system_trust())
            .build()
            .new_agent();
        Client {
            config,
            agent,
            lookups: Mutex::default(),
            down: Mutex::default(),
            report: Mutex::default(),
            cleaned: std::sync::Once::new(),
        }
    }

    /// Where the cache keeps the debug file of build ID `id`, whether it is there or not.
    pub fn cached_path(&self, id: &[u8]) -> Option<PathBuf> {
        Some(self.config.cache.as_ref()?.join(hex(id)).join(CACHED_NAME))
    }

    /// The debug file of build ID `id` (of the file `name`, for messages), from the cache
    /// or else from the first server that has it; or why there is none. Asked once per
    /// build ID: later calls get the answer of the first. A signal that stops the naming
    /// ends the wait at once (the lookup, in a thread of its own, gives up at its next
    /// read).
    pub fn find(self: &Arc<Self>, id: &[u8], name: &str) -> Result<PathBuf, String> {
        let cell = self
            .lookups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_vec())
            .or_default()
            .clone();
        cell.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (client, owned_id, owned_name) = (self.clone(), id.to_vec(), name.to_string());
            let spawned = std::thread::Builder::new()
                .name("sampler-debuginfod".into())
                .spawn(move || {
                    let _ = tx.send(client.look_up(&owned_id, &owned_name));
                });
            if spawned.is_err() {
                return self.look_up(id, name);
            }
            loop {
                match rx.recv_timeout(STOP_POLL) {
                    Ok(answer) => return answer,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        if let Some(signal) = crate::record::interrupt::stopped() {
                            return Err(format!("debuginfod: {signal} stopped the lookup"));
                        }
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                        return Err("debuginfod: the lookup failed".into())
                    }
                }
            }
        })
        .clone()
    }

    fn look_up(&self, id: &[u8], name: &str) -> Result<PathBuf, String> {
        let Some(cache) = &self.config.cache else {
            self.note(|r| {
                r.no_cache = Some("no cache directory (HOME is not set)".into());
                r.unanswered += 1;
            });
            return Err("debuginfod: no cache directory".into());
        };
        let hex = hex(id);
        let cached = cache.join(&hex).join(CACHED_NAME);
        if crate::files::locate::open_regular(&cached)
            .is_some_and(|f| verify(&object::ReadCache::new(f), id).is_ok())
        {
            self.note(|r| r.from_cache += 1);
            return Ok(cached);
        }
        let mut why = None;
        for (index, server) in self.config.servers.iter().enumerate() {
            if self.is_down(index) {
                why.get_or_insert(format!("debuginfod: {server} was given up on"));
                continue;
            }
            let started = Instant::now();
            let answer = self.fetch(server, cache, &hex, id, name);
            self.note(|r| r.fetch_time += started.elapsed());
            let problem = match answer {
                Answer::Fetched(path, bytes) => {
                    self.note(|r| {
                        let entry = r.fetched.entry(index).or_default();
                        entry.0 += 1;
                        entry.1 += bytes;
                    });
                    return Ok(path);
                }
                Answer::NotFound => continue,
                Answer::NoCache(why) => {
                    self.note(|r| {
                        r.no_cache = Some(why.clone());
                        r.unanswered += 1;
                    });
                    return Err(format!("debuginfod: {why}"));
                }
                Answer::Refused(problem) => problem,
                Answer::Down(problem) => {
                    self.down
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(index);
                    problem
                }
            };
            self.note(|r| r.problems.push(format!("{server}: {problem}")));
            why.get_or_insert(format!("debuginfod: {server}: {problem}"));
        }
        match why {
            None => {
                self.note(|r| r.not_found += 1);
                Err("not on the debuginfod servers".into())
            }
            Some(why) => {
                self.note(|r| r.unanswered += 1);
                Err(why)
            }
        }
    }

    fn is_down(&self, server: usize) -> bool {
        self.down
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&server)
    }

    fn note(&self, change: impl FnOnce(&mut Report)) {
        change(&mut self.report.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Asks `server` for the debug file of `id` (`hex` spelled out; of the file `name`)
    /// and stores it in the cache.
    fn fetch(&self, server: &str, cache: &Path, hex: &str, id: &[u8], name: &str) -> Answer {
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
        let dir = match usercache::open_dir(cache, &[hex], self.config.owner, true, SHARED) {
            Ok(dir) => dir,
            Err(e) => {
                return Answer::NoCache(format!("cannot use the cache {}: {e}", cache.display()))
            }
        };
        self.cleaned
            .call_once(|| remove_stale_downloads(cache, self.config.owner));
        let mut temp = match TempFile::create(dir, CACHED_NAME, FILE_MODE) {
            Ok(t) => t,
            Err(e) => {
                return Answer::Refused(format!("cannot write into {}: {e}", cache.display()))
            }
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

    /// The summary line: what was fetched, from where, and what went wrong; `None` when
    /// nothing was asked for.
    pub fn summary(&self) -> Option<String> {
        let r = self.report.lock().unwrap_or_else(|e| e.into_inner());
        let fetched: usize = r.fetched.values().map(|(n, _)| n).sum();
        if fetched + r.from_cache + r.not_found + r.unanswered == 0 {
            return None;
        }
        let mut parts = Vec::new();
        for (index, server) in self.config.servers.iter().enumerate() {
            if let Some((n, bytes)) = r.fetched.get(&index) {
                parts.push(format!(
                    "fetched {n} debug file{} ({}) from {server}",
                    plural(*n),
                    size(*bytes)
                ));
            }
        }
        match parts.len() {
            0 if r.from_cache == 0 => parts.push("fetched nothing".to_string()),
            0 => {}
            n => parts[n - 1].push_str(&format!(" in {} ms", r.fetch_time.as_millis())),
        }
        if r.from_cache > 0 {
            let dir = self.config.cache.as_deref().unwrap_or(Path::new(""));
            parts.push(format!("{} from the cache {}", r.from_cache, dir.display()));
        }
        if r.not_found > 0 {
            parts.push(format!("{} not on any server", r.not_found));
        }
        if r.unanswered > 0 {
            parts.push(format!("{} not answered", r.unanswered));
        }
        if let Some(why) = &r.no_cache {
            parts.push(why.clone());
        }
        for problem in &r.problems {
            if !parts.contains(problem) {
                parts.push(problem.clone());
            }
        }
        Some(format!("debuginfod: {}", parts.join("; ")))
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A byte count for people: kB, MB or GB.
pub(crate) fn size(bytes: u64) -> String {
    match bytes {
        0..1_000_000 => format!("{:.1} kB", bytes as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", bytes as f64 / 1e6),
        _ => format!("{:.2} GB", bytes as f64 / 1e9),
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

/// What the first bytes of a download (`prefix`) tell of it: `Some(Err)` when they are not
/// an ELF file, or one whose build ID (in the notes its program headers place among
/// them) is not `id`; `Some(Ok)` when it is `id`; `None` when they cannot tell yet (the
/// whole file is checked once it is in).
fn early_verdict(prefix: &[u8], id: &[u8]) -> Option<Result<(), String>> {
    if prefix.len() < object::elf::ELFMAG.len() {
        return None;
    }
    if prefix[..object::elf::ELFMAG.len()] != object::elf::ELFMAG {
        return Some(Err("not an ELF file".into()));
    }
    let found = match object::FileKind::parse(prefix).ok()? {
        object::FileKind::Elf64 => {
            build_id_note::<object::elf::FileHeader64<object::Endianness>>(prefix)
        }
        object::FileKind::Elf32 => {
            build_id_note::<object::elf::FileHeader32<object::Endianness>>(prefix)
        }
        _ => None,
    }?;
    Some(match found == id {
        true => Ok(()),
        false => Err(format!("its build ID is {}, not {}", hex(found), hex(id))),
    })
}

/// The build ID in the notes that the program headers of the ELF file starting `data`
/// place within `data`.
fn build_id_note<Elf: object::read::elf::FileHeader<Endian = object::Endianness>>(
    data: &[u8],
) -> Option<&[u8]> {
    use object::read::elf::ProgramHeader;
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    for segment in header.program_headers(endian, data).ok()? {
        let Ok(Some(mut notes)) = segment.notes(endian, data) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == b"GNU" && note.n_type(endian) == object::elf::NT_GNU_BUILD_ID {
                return Some(note.desc());
            }
        }
    }
    None
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

/// debuginfod's cache is shared with elfutils' tools, and its debug files are public.
const SHARED: usercache::Access = usercache::Access::Shared;

/// Whether what was written into `temp` has build ID `id`, read back through a second
/// descriptor of the same file (only its headers and notes are read).
fn verify_written(temp: &mut TempFile, id: &[u8]) -> Result<(), String> {
    temp.file.flush().map_err(|e| e.to_string())?;
    let file = temp.reopen().map_err(|e| e.to_string())?;
    verify(&object::ReadCache::new(file), id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

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

    /// A server on 127.0.0.1 that answers every request with `status` and `body`, and
    /// counts the requests; its URL.
    fn serve(status: &'static str, body: Vec<u8>) -> (String, Arc<AtomicU64>) {
        serve_with(status, body, true)
    }

    /// [`serve`], saying the body's length or (`with_length` false) ending it by closing
    /// the connection.
    fn serve_with(
        status: &'static str,
        body: Vec<u8>,
        with_length: bool,
    ) -> (String, Arc<AtomicU64>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicU64::new(0));
        let counted = requests.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                counted.fetch_add(1, Ordering::SeqCst);
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                let length = if with_length {
                    format!("Content-Length: {}\r\n", body.len())
                } else {
                    String::new()
                };
                let head = format!("HTTP/1.1 {status}\r\n{length}Connection: close\r\n\r\n");
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&body);
            }
        });
        (url, requests)
    }

    fn client(servers: Vec<String>, cache: &Path, timeout: u64) -> Arc<Client> {
        Arc::new(Client::new(Config {
            servers,
            cache: Some(cache.to_path_buf()),
            owner: None,
            timeout: Some(Duration::from_secs(timeout)),
            max_time: None,
            max_size: DEFAULT_MAX_SIZE,
        }))
    }

    /// A scratch directory (removed when the test ends) and the cache in it, not yet
    /// created.
    fn scratch(name: &str) -> (crate::files::testdir::TestDir, PathBuf) {
        let dir = crate::files::testdir::TestDir::new(&format!("debuginfod-{name}"));
        let cache = dir.join("cache");
        (dir, cache)
    }

    /// An ELF file with a build ID (`/bin/true` is a small one), and the ID.
    fn elf_with_build_id(path: &str) -> (Vec<u8>, Vec<u8>) {
        use object::Object;
        let data = std::fs::read(path).unwrap();
        let id = object::File::parse(&*data)
            .unwrap()
            .build_id()
            .unwrap()
            .expect("the file has a build ID")
            .to_vec();
        (data, id)
    }

    #[test]
    fn a_download_is_cached_under_its_build_id_once_per_run() {
        let (elf, id) = elf_with_build_id("/bin/true");
        let (url, requests) = serve("200 OK", elf.clone());
        let (_dir, cache) = scratch("fetch");
        let c = client(vec![url.clone()], &cache.join("new/cache"), 5);
        let path = c.find(&id, "test").unwrap();
        assert_eq!(
            path,
            cache.join("new/cache").join(hex(&id)).join(CACHED_NAME)
        );
        assert_eq!(std::fs::read(&path).unwrap(), elf);
        assert_eq!(c.find(&id, "test").unwrap(), path);
        assert_eq!(requests.load(Ordering::SeqCst), 1, "asked once");
        let line = c.summary().unwrap();
        assert!(
            line.starts_with("debuginfod: fetched 1 debug file ("),
            "{line}"
        );
        assert!(line.contains(&url), "{line}");
        // A new run finds it in the cache without asking.
        let again = client(vec![url], &cache.join("new/cache"), 5);
        assert_eq!(again.find(&id, "test").unwrap(), path);
        assert_eq!(requests.load(Ordering::SeqCst), 1, "not asked again");
        assert!(again.summary().unwrap().contains("1 from the cache"));
    }

    #[test]
    fn a_download_with_another_build_id_is_not_kept() {
        let (elf, mut id) = elf_with_build_id("/bin/true");
        id[0] ^= 0xff;
        let (url, _) = serve("200 OK", elf);
        let (_dir, cache) = scratch("wrong");
        let c = client(vec![url], &cache, 5);
        let err = c.find(&id, "test").unwrap_err();
        assert!(err.contains("not its debug file: its build ID is"), "{err}");
        let dir = cache.join(hex(&id));
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "neither the file nor a temporary one is left"
        );
    }

    #[test]
    fn a_download_over_the_size_limit_is_not_kept() {
        let (elf, id) = elf_with_build_id("/bin/true");
        for with_length in [true, false] {
            let (url, _) = serve_with("200 OK", elf.clone(), with_length);
            let (_dir, cache) = scratch(&format!("large-{with_length}"));
            let c = Arc::new(Client::new(Config {
                max_size: elf.len() as u64 - 1,
                ..client(vec![url], &cache, 5).config.clone()
            }));
            let err = c.find(&id, "test").unwrap_err();
            assert!(err.contains("is larger than the limit of"), "{err}");
            let left = std::fs::read_dir(cache.join(hex(&id))).map_or(0, |d| d.count());
            assert_eq!(left, 0, "nothing is left in the cache");
        }
    }

    #[test]
    fn a_silent_server_costs_one_time_out() {
        // The kernel accepts connections into the backlog; nobody answers.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (not_found, _) = serve("404 Not Found", Vec::new());
        let url = format!("http://{}", silent.local_addr().unwrap());
        let (_dir, cache) = scratch("silent");
        let c = client(vec![url.clone(), not_found], &cache, 1);
        let started = Instant::now();
        assert!(c.find(&[1; 20], "test").is_err());
        assert!(c.find(&[2; 20], "test").is_err());
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(1900),
            "two lookups took {took:?}"
        );
        let line = c.summary().unwrap();
        assert_eq!(line.matches("no answer within 1 s").count(), 1, "{line}");
        assert!(!cache.exists(), "nothing fetched, nothing created");
    }

    #[test]
    fn the_first_bytes_of_a_download_say_what_it_is_not() {
        let (elf, id) = elf_with_build_id("/bin/true");
        let mut other = id.clone();
        other[0] ^= 0xff;
        assert_eq!(early_verdict(&[0; 3], &id), None, "too short to tell");
        assert_eq!(
            early_verdict(&[0; 4], &id),
            Some(Err("not an ELF file".into()))
        );
        assert_eq!(early_verdict(&elf[..64], &id), None, "no notes yet");
        let prefix = &elf[..elf.len().min(PREFIX_BYTES)];
        assert_eq!(early_verdict(prefix, &id), Some(Ok(())));
        let wrong = early_verdict(prefix, &other).unwrap().unwrap_err();
        assert!(wrong.starts_with("its build ID is "), "{wrong}");
        for len in 0..256.min(elf.len()) {
            let _ = early_verdict(&elf[..len], &id);
        }
    }

    #[test]
    fn a_download_is_used_only_with_the_build_id_asked_for() {
        let (data, id) = elf_with_build_id("/proc/self/exe");
        assert_eq!(verify(&*data, &id), Ok(()));
        let mut other = id.clone();
        other[0] ^= 0xff;
        let err = verify(&*data, &other).unwrap_err();
        assert!(err.starts_with("its build ID is "), "{err}");
        assert_eq!(
            verify(&b"<html>404</html>"[..], &id).unwrap_err(),
            "not an ELF file"
        );
        assert_eq!(verify(&data[..64], &id).unwrap_err(), "not an ELF file");
    }
}
