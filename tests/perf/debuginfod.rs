//! End-to-end: debug files that are not on the machine are fetched from a debuginfod
//! server, elfutils' own (Debian package `debuginfod`), started by the test on
//! 127.0.0.1 to serve a directory that holds the debug file of a stripped bench target.
//! Also what happens without it: a file the server does not have, a server that is
//! down or never answers, `--no-debuginfod`. Skipped (visibly) where there is no
//! `debuginfod` program; `SAMPLER_REQUIRE_CONSUMERS=1` (CI) makes that a failure.

#[path = "../common/mod.rs"]
mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use object::Object;

/// How long the server may take to scan its directory and serve the file.
const SERVER_READY_LIMIT: Duration = Duration::from_secs(60);

/// How long the stripped program runs, in seconds.
const RUN_SECONDS: &str = "0.3";

fn debuginfod_installed() -> bool {
    Command::new("debuginfod")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

const DEBUGINFOD: Need = Need::Consumer(
    "debuginfod (elfutils' server; scripts/install-consumers installs it)",
    debuginfod_installed,
);

/// elfutils' debuginfod serving `dir`, stopped when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// Starts the server on `dir` and waits until it serves the debug file of `hex`.
    fn start(dir: &Path, database: &Path, hex: &str) -> Server {
        let port = free_port();
        let child = Command::new("debuginfod")
            .arg("-F")
            .arg(dir)
            .args(["-p", &port.to_string(), "-d"])
            .arg(database)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("debuginfod starts");
        let server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let url = format!("{}/buildid/{hex}/debuginfo", server.url);
        let deadline = Instant::now() + SERVER_READY_LIMIT;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        while agent.get(&url).call().is_err() {
            assert!(
                Instant::now() < deadline,
                "debuginfod did not serve {url} within {SERVER_READY_LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The build ID of `file`, in lower-case hex.
fn build_id_hex(file: &Path) -> String {
    let data = std::fs::read(file).unwrap();
    let file = object::File::parse(&*data).unwrap();
    sampler::symbolicate::debuginfod::hex(file.build_id().unwrap().expect("a build ID"))
}

/// `sampler record ARGS -- PROGRAM 0.3` with `DEBUGINFOD_URLS=urls` and the cache at
/// `cache`; checks that it succeeded and that the profile loads. Also how long it took.
fn record_with(
    urls: &str,
    cache: &Path,
    extra_env: &[(&str, &str)],
    args: &[&str],
    program: &Path,
) -> (Output, Vec<FrameInfo>, Duration) {
    let out = tempdir().join("profile.json");
    let started = Instant::now();
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&out)
        .args(args)
        .arg("--")
        .arg(program)
        .arg(RUN_SECONDS)
        .env("DEBUGINFOD_URLS", urls)
        .env("DEBUGINFOD_CACHE_PATH", cache)
        .envs(extra_env.iter().copied())
        .output()
        .expect("sampler runs");
    let took = started.elapsed();
    assert!(o.status.success(), "sampler failed: {}", stderr(&o));
    let p = load(&out);
    check_processed_profile(&p);
    let frames = thread_frames(&p)
        .into_iter()
        .flat_map(|(_, stacks)| stacks)
        .flatten()
        .collect();
    (o, frames, took)
}

/// The summary's debuginfod line (the last: a large download is announced before).
fn debuginfod_line(err: &str) -> &str {
    err.lines()
        .rfind(|l| l.starts_with("sampler: debuginfod: "))
        .unwrap_or_else(|| panic!("no debuginfod summary line: {err}"))
}

/// Whether inline3's inline chain, with its source file and lines, is in the frames:
/// only its debug file has them.
fn inline3_named(frames: &[FrameInfo]) -> bool {
    frames.iter().any(|f| {
        f.name == "level3"
            && f.inline_depth == 3
            && f.line.is_some()
            && f.file.as_deref().is_some_and(|s| s.ends_with("inline3.c"))
    })
}

/// Whether the frames of the stripped program are all addresses, and libc's are named
/// (from /usr/lib/debug): the run kept the names it has.
fn only_libc_named(frames: &[FrameInfo]) -> bool {
    let stripped = frames
        .iter()
        .filter(|f| f.lib.as_deref() == Some("stripped"))
        // The entry point is named from the ELF header even without symbols.
        .all(|f| f.name.starts_with("0x") || f.name.starts_with("fn_0x") || f.name == "_start");
    let libc = frames
        .iter()
        .any(|f| f.lib.as_deref() == Some("libc.so.6") && f.name.contains("libc_start"));
    stripped && libc
}

/// A stripped inline3 in `dir`, and a directory `dir/served` that holds its debug file
/// (and nothing sampler would look in); the build ID in hex.
fn stripped_inline3_served(dir: &Path) -> (PathBuf, PathBuf, String) {
    let (stripped, debug) = split_debug(&target("inline3"), dir);
    let served = dir.join("served");
    std::fs::create_dir_all(&served).unwrap();
    std::fs::rename(&debug, served.join("inline3.debug")).unwrap();
    let hex = build_id_hex(&stripped);
    (stripped, served, hex)
}

fn missing_debug_files_are_fetched_from_debuginfod_and_cached() {
    let test = "missing_debug_files_are_fetched_from_debuginfod_and_cached";
    let dir = tempdir();
    let (stripped, served, hex) = stripped_inline3_served(&dir);
    let started = Instant::now();
    let mut server = Server::start(&served, &dir.join("db.sqlite"), &hex);
    eprintln!("{test}: debuginfod ready after {:?}", started.elapsed());

    let cache = dir.join("cache");
    let (o, frames, took) = record_with(&server.url, &cache, &[], &[], &stripped);
    let err = stderr(&o);
    eprintln!("{test}: first run {took:?}: {err}");
    assert!(
        inline3_named(&frames),
        "names and lines from the fetched file"
    );
    let line = debuginfod_line(&err);
    assert!(
        line.contains("fetched 1 debug file (") && line.contains(&server.url),
        "{line}"
    );
    let cached = cache.join(&hex).join("debuginfo");
    assert_eq!(
        std::fs::read(&cached).unwrap(),
        std::fs::read(served.join("inline3.debug")).unwrap(),
        "the cache holds BUILDID/debuginfo, the served file"
    );
    let entries: Vec<_> = std::fs::read_dir(cache.join(&hex)).unwrap().collect();
    assert_eq!(entries.len(), 1, "no temporary file is left in the cache");

    // A file the server does not have (another program's): its 404 is said, and the
    // run keeps the names it has.
    let (unserved, _) = split_debug(&target("split7030"), &tempdir());
    let other_cache = dir.join("cache-404");
    let (o, frames, _) = record_with(&server.url, &other_cache, &[], &[], &unserved);
    let err = stderr(&o);
    assert!(
        err.contains("debuginfod: fetched nothing; ") && err.contains(" not on any server"),
        "{err}"
    );
    assert!(only_libc_named(&frames));
    assert!(
        !other_cache.join(build_id_hex(&unserved)).exists(),
        "a 404 leaves nothing in the cache"
    );

    // --no-debuginfod: nothing asked, nothing cached.
    let off_cache = dir.join("cache-off");
    let (o, frames, _) = record_with(
        &server.url,
        &off_cache,
        &[],
        &["--no-debuginfod"],
        &stripped,
    );
    assert!(!stderr(&o).contains("debuginfod:"), "{}", stderr(&o));
    assert!(only_libc_named(&frames));
    assert!(!off_cache.exists(), "--no-debuginfod creates no cache");

    // The server stopped: the cache still names the program, without asking.
    server.stop();
    let (o, frames, took) = record_with(&server.url, &cache, &[], &[], &stripped);
    let err = stderr(&o);
    eprintln!("{test}: from the cache {took:?}: {err}");
    assert!(inline3_named(&frames), "names and lines from the cache");
    assert!(
        err.contains("debuginfod: 1 from the cache ") && !err.contains("fetched 1"),
        "{err}"
    );
}

fn unreachable_or_silent_servers_cost_one_time_out_and_the_run_goes_on() {
    let test = "unreachable_or_silent_servers_cost_one_time_out_and_the_run_goes_on";
    let dir = tempdir();
    let (stripped, _, _) = stripped_inline3_served(&dir);

    // Nobody listens: refused at once.
    let down = format!("http://127.0.0.1:{}", free_port());
    let (o, frames, took) = record_with(&down, &dir.join("cache-down"), &[], &[], &stripped);
    let err = stderr(&o);
    eprintln!("{test}: server down {took:?}: {err}");
    assert!(
        err.contains("debuginfod: fetched nothing; ")
            && err.contains(&format!("{down}: unreachable (connection refused)")),
        "{err}"
    );
    assert!(only_libc_named(&frames));
    assert!(
        !dir.join("cache-down").exists(),
        "nothing fetched, nothing created"
    );

    // Accepts connections (the kernel does, into the backlog) but never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let (o, frames, took) = record_with(
        &url,
        &dir.join("cache-silent"),
        &[("DEBUGINFOD_TIMEOUT", "1")],
        &[],
        &stripped,
    );
    let err = stderr(&o);
    eprintln!("{test}: silent server {took:?}: {err}");
    assert!(
        err.contains(&format!("{url}: no answer within 1 s (DEBUGINFOD_TIMEOUT)")),
        "{err}"
    );
    let line = debuginfod_line(&err);
    assert_eq!(
        line.matches("no answer within").count(),
        1,
        "the server is given up on after one time-out: {line}"
    );
    assert!(
        !line.contains("not on any server"),
        "it was not asked: {line}"
    );
    assert!(only_libc_named(&frames));
    assert!(
        took < Duration::from_secs(4),
        "the silent server held the run up for more than its time-out: {took:?}"
    );
}

/// A server on 127.0.0.1 that sends `file` for `/buildid/HEX/debuginfo` and 404 for
/// anything else; its URL.
fn serve_one(hex: &str, file: Vec<u8>) -> String {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let wanted = format!("GET /buildid/{hex}/debuginfo ");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0u8; 4096];
            let n = stream.read(&mut request).unwrap_or(0);
            let body: &[u8] = if request[..n].starts_with(wanted.as_bytes()) {
                &file
            } else {
                b""
            };
            let status = if body.is_empty() {
                "404 Not Found"
            } else {
                "200 OK"
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body);
        }
    });
    url
}

/// User and group nobody, whom the sudo tests pretend ran sudo.
const NOBODY: u32 = 65534;

/// `sampler symbolize -e PROGRAM ADDR` as root under a pretended sudo by nobody, fetching
/// from `url` into `cache`; checks that it succeeded, and returns its stdout and stderr.
fn symbolize_as_sudo(program: &Path, address: u64, url: &str, cache: &Path) -> (String, String) {
    let o = Command::new(sampler_bin())
        .args(["symbolize", "-e"])
        .arg(program)
        .arg(format!("{address:x}"))
        .env("SUDO_UID", NOBODY.to_string())
        .env("SUDO_GID", NOBODY.to_string())
        .env("DEBUGINFOD_URLS", url)
        .env("DEBUGINFOD_CACHE_PATH", cache)
        .output()
        .expect("sampler runs");
    assert!(o.status.success(), "sampler failed: {}", stderr(&o));
    (String::from_utf8_lossy(&o.stdout).into_owned(), stderr(&o))
}

fn under_sudo_the_cache_is_the_users_and_links_are_not_followed() {
    use std::os::unix::fs::{chown, symlink, MetadataExt};
    let dir = tempdir();
    let (stripped, served, hex) = stripped_inline3_served(&dir);
    let debug = std::fs::read(served.join("inline3.debug")).unwrap();
    let work = {
        use object::ObjectSymbol;
        let file = object::File::parse(&*debug).unwrap();
        file.symbols()
            .find(|s| s.name() == Ok("work"))
            .unwrap()
            .address()
    };
    let url = serve_one(&hex, debug.clone());
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();

    // The cache does not exist yet: sampler creates it, and everything in it is nobody's.
    let cache = home.join(".cache/debuginfod_client");
    let (out, err) = symbolize_as_sudo(&stripped, work, &url, &cache);
    assert!(
        out.contains("work\n") && out.contains("inline3.c:"),
        "{out}{err}"
    );
    assert!(err.contains("debuginfod: fetched 1 debug file ("), "{err}");
    let file = cache.join(&hex).join("debuginfo");
    assert_eq!(std::fs::read(&file).unwrap(), debug);
    for path in [home.join(".cache"), cache.clone(), cache.join(&hex), file] {
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (NOBODY, NOBODY),
            "{} belongs to the user who ran sudo",
            path.display()
        );
    }

    // The user's cache, or a build ID's directory in it, is a link to a directory of
    // root's: nothing is written there, the run goes on and says why.
    let roots_dir = dir.join("roots");
    std::fs::create_dir_all(&roots_dir).unwrap();
    let linked = home.join("linked-cache");
    symlink(&roots_dir, &linked).unwrap();
    let own = home.join("own-cache");
    std::fs::create_dir_all(&own).unwrap();
    chown(&own, Some(NOBODY), Some(NOBODY)).unwrap();
    symlink(&roots_dir, own.join(&hex)).unwrap();
    for cache in [linked, own] {
        let (out, err) = symbolize_as_sudo(&stripped, work, &url, &cache);
        assert!(!out.contains("inline3.c:"), "{out}");
        let line = debuginfod_line(&err);
        eprintln!("{}: {line}", cache.display());
        assert!(line.contains("cannot use the cache"), "{line}");
        assert_eq!(
            std::fs::read_dir(&roots_dir).unwrap().count(),
            0,
            "nothing written through the link into root's directory"
        );
    }
}

/// A server on 127.0.0.1 that answers the request for the debug file of `hex` with 200,
/// a length of `length` bytes, and then those bytes (`body`'s, zeros past its end),
/// `chunk` at a time with `pause` between; 404 to anything else. It counts the bytes
/// that it got to send, and says on `requested` when the file is asked for.
struct SlowServer {
    url: String,
    sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
    requested: std::sync::mpsc::Receiver<()>,
}

fn serve_slowly(
    hex: &str,
    body: Vec<u8>,
    length: u64,
    chunk: usize,
    pause: Duration,
) -> SlowServer {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let wanted = format!("GET /buildid/{hex}/debuginfo ");
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (tell, requested) = std::sync::mpsc::channel();
    let (counted, body) = (sent.clone(), std::sync::Arc::new(body));
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let (counted, body, tell, wanted) =
                (counted.clone(), body.clone(), tell.clone(), wanted.clone());
            std::thread::spawn(move || {
                let mut request = [0u8; 4096];
                let n = stream.read(&mut request).unwrap_or(0);
                if !request[..n].starts_with(wanted.as_bytes()) {
                    let _ = stream.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    return;
                }
                let _ = tell.send(());
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
                );
                if stream.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let mut at = 0u64;
                let mut bytes = vec![0u8; chunk];
                while at < length {
                    let n = chunk.min((length - at) as usize);
                    for (i, b) in bytes[..n].iter_mut().enumerate() {
                        *b = body.get(at as usize + i).copied().unwrap_or(0);
                    }
                    if stream.write_all(&bytes[..n]).is_err() {
                        return;
                    }
                    at += n as u64;
                    counted.fetch_add(n as u64, Ordering::SeqCst);
                    std::thread::sleep(pause);
                }
            });
        }
    });
    SlowServer {
        url,
        sent,
        requested,
    }
}

/// sampler, started in the background; killed when dropped, so that a run that hangs
/// does not outlive its test.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `sampler record -o OUT -- PROGRAM 0.3` with `DEBUGINFOD_URLS=url`, the cache at
/// `cache` and `env`, in the background.
fn start_recording(
    url: &str,
    cache: &Path,
    env: &[(&str, &str)],
    program: &Path,
    out: &Path,
) -> Started {
    Started(
        Command::new(sampler_bin())
            .args(["record", "-o"])
            .arg(out)
            .arg("--")
            .arg(program)
            .arg(RUN_SECONDS)
            .env("DEBUGINFOD_URLS", url)
            .env("DEBUGINFOD_CACHE_PATH", cache)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sampler runs"),
    )
}

/// Waits at most `limit` for the background sampler to end; its stderr and how long it
/// took, or a failure that says it hung.
fn finish(mut run: Started, limit: Duration, what: &str) -> (String, Duration) {
    let started = Instant::now();
    let status = wait_with_timeout(&mut run.0, limit);
    let took = started.elapsed();
    let Some(status) = status else {
        panic!("{what}: sampler still runs after {limit:?}");
    };
    let mut err = String::new();
    use std::io::Read;
    run.0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{what}: sampler failed: {err}");
    (err, took)
}

/// Whether a file on its way in (sampler's `.sampler-…`) is anywhere in `cache`.
fn new_files_in(cache: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in std::fs::read_dir(cache).into_iter().flatten() {
        let dir = dir.unwrap().path();
        for file in std::fs::read_dir(&dir).into_iter().flatten() {
            let file = file.unwrap().path();
            if file
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".sampler-")
            {
                found.push(file);
            }
        }
    }
    found
}

/// A server that sends a byte now and then (each within the time-out between bytes)
/// is given up on when it falls below 100 kB/s over a time-out's span: with
/// DEBUGINFOD_TIMEOUT=2 and a byte a second, within a few seconds, where sampler used to
/// wait for the whole file for ever.
fn a_server_that_trickles_is_given_up_on() {
    let (stripped, server) = stripped_inline3_served_slowly(1, 1, Duration::from_secs(1));
    let (took, _) = record_from_slow_server(
        &server,
        &stripped,
        &[("DEBUGINFOD_TIMEOUT", "2")],
        "a byte a second",
        "slower than 100 KiB/s (DEBUGINFOD_TIMEOUT)",
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// A stripped inline3, in a new directory, and a server that sends its debug file made
/// `times` as long (zeros past its end), `chunk` bytes every `pause`.
fn stripped_inline3_served_slowly(
    times: u64,
    chunk: usize,
    pause: Duration,
) -> (PathBuf, SlowServer) {
    let dir = tempdir();
    let (stripped, served, hex) = stripped_inline3_served(&dir);
    let debug = std::fs::read(served.join("inline3.debug")).unwrap();
    let length = debug.len() as u64 * times;
    (stripped, serve_slowly(&hex, debug, length, chunk, pause))
}

/// Records `program` with debuginfod's `server` and `env`, in the background, allowing
/// it 120 s; checks that the summary's debuginfod line `says` so, that the profile
/// loads, and that no new file is left in the cache. How long it took, and the bytes
/// the server sent.
fn record_from_slow_server(
    server: &SlowServer,
    program: &Path,
    env: &[(&str, &str)],
    what: &str,
    says: &str,
) -> (Duration, u64) {
    let dir = tempdir();
    let (cache, out) = (dir.join("cache"), dir.join("profile.json"));
    let run = start_recording(&server.url, &cache, env, program, &out);
    let (err, took) = finish(run, Duration::from_secs(120), what);
    let sent = server.sent.load(std::sync::atomic::Ordering::SeqCst);
    let line = debuginfod_line(&err);
    eprintln!("{what}: sampler ended after {took:?}, {sent} bytes sent: {line}");
    assert!(line.contains(says), "{err}");
    check_processed_profile(&load(&out));
    assert!(
        new_files_in(&cache).is_empty(),
        "{:?}",
        new_files_in(&cache)
    );
    (took, sent)
}

/// A download that keeps going fast enough, but for too long, ends at its bound in all
/// (`DEBUGINFOD_MAXTIME`; 60 s when unset).
fn a_download_ends_at_its_time_bound() {
    // 320 KiB/s: above the least rate, and some hundred seconds for the whole.
    let (stripped, server) =
        stripped_inline3_served_slowly(1000, 64 << 10, Duration::from_millis(200));
    let (took, _) = record_from_slow_server(
        &server,
        &stripped,
        &[("DEBUGINFOD_MAXTIME", "2")],
        "320 KiB/s for too long",
        "the download took longer than DEBUGINFOD_MAXTIME",
    );
    assert!(took < Duration::from_secs(6), "{took:?}");
}

/// Ctrl-C (or SIGTERM, SIGHUP) while sampler names the profile's functions stops the
/// naming: the download it waits on is given up, and the profile is written with what
/// is named, within seconds (sampler used to ignore them, and only SIGKILL ended it);
/// the download leaves nothing in the cache.
fn a_signal_while_naming_stops_it_and_the_profile_is_written() {
    use nix::sys::signal::Signal;
    let dir = tempdir();
    let (stripped, served, hex) = stripped_inline3_served(&dir);
    let debug = std::fs::read(served.join("inline3.debug")).unwrap();
    let length = debug.len() as u64;
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // Fast enough for the progress bound (100 kB/s), too slow to end in the test's time.
        let server = serve_slowly(
            &hex,
            debug.clone(),
            length * 1000,
            64 << 10,
            Duration::from_millis(200),
        );
        let cache = dir.join(format!("cache-{signal}"));
        let out = dir.join(format!("{signal}.json"));
        let run = start_recording(&server.url, &cache, &[], &stripped, &out);
        server
            .requested
            .recv_timeout(Duration::from_secs(30))
            .expect("the debug file is asked for");
        std::thread::sleep(Duration::from_millis(500));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(run.0.id() as i32), signal).unwrap();
        let (err, took) = finish(
            run,
            Duration::from_secs(5),
            &format!("{signal} while naming"),
        );
        eprintln!("{signal} while naming: sampler ended {took:?} after it");
        assert!(
            err.contains(&format!("sampler: {signal} stopped the naming")),
            "{err}"
        );
        let p = load(&out);
        check_processed_profile(&p);
        assert!(
            new_files_in(&cache).is_empty(),
            "{:?}",
            new_files_in(&cache)
        );
        assert!(!cache.join(&hex).join("debuginfo").exists());
    }
}

/// A body whose first bytes are not an ELF file is refused at once: 2 GiB of zeros,
/// which sampler used to download whole before it looked.
fn a_body_that_is_no_elf_file_is_refused_at_its_first_bytes() {
    let dir = tempdir();
    let (stripped, _, hex) = stripped_inline3_served(&dir);
    let server = serve_slowly(&hex, Vec::new(), 2 << 30, 64 << 10, Duration::ZERO);
    let (_, sent) = record_from_slow_server(
        &server,
        &stripped,
        &[],
        "2 GiB of zeros",
        "not its debug file: not an ELF file",
    );
    assert!(
        sent < 64 << 20,
        "{sent} bytes were taken before the file was refused"
    );
}

/// New files of downloads that killed runs left in the cache are removed once a week
/// old, when the next download starts; younger ones, and files not sampler's, stay.
fn downloads_killed_runs_left_are_removed_after_a_week() {
    let dir = tempdir();
    let (stripped, served, hex) = stripped_inline3_served(&dir);
    let debug = std::fs::read(served.join("inline3.debug")).unwrap();
    let url = serve_one(&hex, debug);
    let cache = dir.join("cache");
    let day = Duration::from_secs(86_400);
    let plant = |id: &str, name: &str, age: Duration| {
        let path = cache.join(id).join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"half a download").unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(std::time::SystemTime::now() - age)
            .unwrap();
        path
    };
    let week_old = plant("aa11", ".sampler-12345-0.debuginfo", 8 * day);
    let day_old = plant("bb22", ".sampler-12346-0.debuginfo", day);
    let not_ours = plant("cc33", ".other-tool.tmp", 8 * day);
    let (o, frames, _) = record_with(&url, &cache, &[], &[], &stripped);
    assert!(inline3_named(&frames), "{}", stderr(&o));
    assert!(!week_old.exists(), "{} is left", week_old.display());
    assert!(day_old.exists(), "a day-old one was removed");
    assert!(not_ours.exists(), "another tool's file was removed");
}

fn main() {
    run_tests(tests![
        missing_debug_files_are_fetched_from_debuginfod_and_cached: Need::Perf, DEBUGINFOD;
        unreachable_or_silent_servers_cost_one_time_out_and_the_run_goes_on: Need::Perf;
        under_sudo_the_cache_is_the_users_and_links_are_not_followed: Need::Root;
        a_server_that_trickles_is_given_up_on: Need::Perf;
        a_download_ends_at_its_time_bound: Need::Perf;
        a_signal_while_naming_stops_it_and_the_profile_is_written: Need::Perf;
        a_body_that_is_no_elf_file_is_refused_at_its_first_bytes: Need::Perf;
        downloads_killed_runs_left_are_removed_after_a_week: Need::Perf;
    ]);
}
