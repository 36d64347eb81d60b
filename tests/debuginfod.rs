//! End-to-end: debug files that are not on the machine are fetched from a debuginfod
//! server, elfutils' own (Debian package `debuginfod`), started by the test on
//! 127.0.0.1 to serve a directory that holds the debug file of a stripped bench target.
//! Also what happens without it: a file the server does not have, a server that is
//! down or never answers, `--no-debuginfod`. Skipped (visibly) where there is no
//! `debuginfod` program; `SAMPLER_REQUIRE_CONSUMERS=1` (CI) makes that a failure.

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

/// A port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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
    sampler::debuginfod::hex(file.build_id().unwrap().expect("a build ID"))
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

/// The summary's debuginfod line.
fn debuginfod_line(err: &str) -> &str {
    err.lines()
        .find(|l| l.starts_with("sampler: debuginfod: "))
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

fn main() {
    run_tests(tests![
        missing_debug_files_are_fetched_from_debuginfod_and_cached: Need::Perf, DEBUGINFOD;
        unreachable_or_silent_servers_cost_one_time_out_and_the_run_goes_on: Need::Perf;
        under_sudo_the_cache_is_the_users_and_links_are_not_followed: Need::Root;
    ]);
}
