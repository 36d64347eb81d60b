//! End to end: `sampler view` and `record --view` serve a profile to the Firefox Profiler,
//! and the profiler, opened in a real browser at the URL sampler printed, shows the
//! recorded program's call tree. The browser is Debian's headless Chromium driven by
//! `../shared/tools/ffp-web/check.cjs` (through npm's playwright-core, which
//! `scripts/install-consumers` installs into target/playwright/), and the profiler is the
//! local build of the web app in `../shared/tools/ffp-web/`, served by its `serve.py`:
//! no network is needed. The server's own rules (only the secret path, CORS only there,
//! limits against a hostile local client) are tested with plain sockets. The source view
//! (double-click a call tree row) is driven by our own `tests/browser/source-view.cjs`,
//! which reads the lines and the per-line sample counts the view shows; the flame graph (a
//! canvas) is read by pointing at it, by `tests/browser/flame-graph.cjs`.
//!
//! `SAMPLER_VIEW_SHOTS=DIR` keeps the browser's screenshots there (else they go with the
//! test's directory).

#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Need, *};
use serde_json::Value;

/// The Firefox Profiler's build and its browser driver, beside the repository.
fn ffp_web() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/ffp-web")
}

/// Where `scripts/install-consumers` puts playwright-core.
fn playwright_modules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/playwright/node_modules")
}

fn browser_present() -> bool {
    let chromium = std::env::var_os("CHROMIUM").unwrap_or("/usr/bin/chromium".into());
    Path::new(&chromium).exists()
        && playwright_modules().join("playwright-core").is_dir()
        && ffp_web().join("check.cjs").exists()
        && ffp_web().join("serve.py").exists()
        && Command::new("node").arg("--version").output().is_ok()
}

const BROWSER: Need = Need::Consumer(
    "the real browser (Debian's chromium, npm's playwright-core in target/playwright: scripts/install-consumers installs them; ../shared/tools/ffp-web beside the repository)",
    browser_present,
);

/// The functions of split7030's call tree that the viewer must show.
const SPLIT7030_FUNCTIONS: [&str; 4] = ["main", "outer", "hot_a", "hot_b"];

/// A child process that is killed and reaped when the test ends, however it ends.
struct Reaped(Child);

impl Reaped {
    /// All the child's (piped) stderr, once it has exited or been killed.
    fn stderr_text(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut pipe) = self.0.stderr.take() {
            pipe.read_to_string(&mut err).unwrap();
        }
        err
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The local Firefox Profiler (`serve.py PORT`), listening once `start` returns.
struct Profiler {
    url: String,
    _server: Reaped,
}

impl Profiler {
    fn start() -> Profiler {
        // A port the kernel says is free; serve.py takes it a moment later.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new("python3")
            .arg(ffp_web().join("serve.py"))
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs serve.py");
        let stdout = child.stdout.take().unwrap();
        let server = Reaped(child);
        let line = first_line_within(stdout, Duration::from_secs(30), |_| true)
            .expect("serve.py says it is serving");
        assert!(line.starts_with("serving"), "{line}");
        Profiler {
            url: format!("http://127.0.0.1:{port}"),
            _server: server,
        }
    }
}

/// The first line of `out` that `wanted` accepts, read within `limit` (the reader goes
/// on in a thread of its own, so a silent child cannot hang the test).
fn first_line_within(
    out: ChildStdout,
    limit: Duration,
    wanted: impl Fn(&str) -> bool + Send + 'static,
) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            if wanted(&line) {
                let _ = tx.send(line);
                return;
            }
        }
    });
    rx.recv_timeout(limit).ok()
}

/// Starts `sampler ARGS` with stdout piped, and returns it with the first stdout line
/// that starts with `prefix` (the viewer's URL).
fn start_sampler(args: &[&str], prefix: &str) -> (Reaped, String) {
    let mut child = Command::new(sampler_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sampler runs");
    let stdout = child.stdout.take().unwrap();
    let mut child = Reaped(child);
    let wanted = prefix.to_string();
    let line = first_line_within(stdout, Duration::from_secs(120), move |l| {
        l.starts_with(&wanted)
    });
    let Some(line) = line else {
        let _ = child.0.kill();
        let err = child.stderr_text();
        panic!("sampler {args:?} printed no URL starting with {prefix}: {err}");
    };
    (child, line)
}

/// Waits for `child` to exit by itself; its exit code and stderr.
fn finished(mut child: Reaped, limit: Duration) -> (Option<i32>, String) {
    let status = wait_with_timeout(&mut child.0, limit)
        .unwrap_or_else(|| panic!("sampler did not exit within {limit:?}"));
    (status.code(), child.stderr_text())
}

/// Opens `url` in headless Chromium (check.cjs) and returns what the page showed:
/// `{ok, tracks, rows: ["69% 687 — | hot_a /path"], errors, message}`. The screenshot
/// goes to `shot` (or to `$SAMPLER_VIEW_SHOTS`).
fn open_in_browser(url: &str, shot: &Path) -> Value {
    let shot = match std::env::var_os("SAMPLER_VIEW_SHOTS") {
        Some(dir) => Path::new(&dir).join(shot.file_name().unwrap()),
        None => shot.to_path_buf(),
    };
    let (success, page) = run_driver(&ffp_web().join("check.cjs"), &[url.as_ref(), shot.as_ref()]);
    assert!(
        success && page["ok"] == true,
        "the profiler showed no call tree for {url}: {page:#}"
    );
    assert_eq!(page["errors"], Value::Array(vec![]), "{page:#}");
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    page
}

/// Runs the browser driver `script` (node, with playwright-core) with `args`; whether it
/// exited 0, and the JSON it printed.
fn run_driver(script: &Path, args: &[&std::ffi::OsStr]) -> (bool, Value) {
    let out = Command::new("node")
        .arg(script)
        .args(args)
        .env("NODE_PATH", playwright_modules())
        .output()
        .expect("node runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let page = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "{} printed no JSON ({e}): {text}{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), page)
}

/// The call tree's rows as (running samples, function name), from check.cjs's
/// `"TOTAL% TOTAL SELF | NAME LIBRARY"` texts. A comparison's tree shows "—" where the
/// two profiles have as many samples (a node such as `[truncated]` that a busy machine
/// gave each run once): a difference of 0.
fn tree_rows(page: &Value) -> Vec<(i64, String)> {
    page["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let row = row.as_str().unwrap();
            let (numbers, name) = row.split_once(" | ").unwrap_or(("", row));
            let count = numbers
                .split_whitespace()
                .nth(1)
                .and_then(|n| match n {
                    "—" => Some(0),
                    n => n.replace(',', "").parse().ok(),
                })
                .unwrap_or_else(|| panic!("no sample count in the row {row:?}"));
            let name = name.split_whitespace().next().unwrap_or("").to_string();
            (count, name)
        })
        .collect()
}

fn assert_shows(rows: &[(i64, String)], functions: &[&str], page: &Value) {
    for f in functions {
        assert!(
            rows.iter().any(|(_, name)| name == f),
            "the call tree has no row for {f}: {page:#}"
        );
    }
}

/// The viewer's counts of split7030's call nodes are the file's: it got the whole profile.
fn assert_counts_match(rows: &[(i64, String)], file: &Path, page: &Value) {
    let paths: Vec<Vec<String>> = thread_paths(&load(file))
        .into_iter()
        .flat_map(|t| t.paths)
        .collect();
    for run in [["main", "outer"], ["outer", "hot_a"], ["outer", "hot_b"]] {
        let shown = rows.iter().find(|(_, name)| name == run[1]).unwrap().0;
        let (in_file, _) = count_run(&paths, &run);
        assert!(in_file > 0, "{run:?}");
        assert_eq!(shown as usize, in_file, "{run:?}: {page:#}");
    }
}

/// The profile URL inside a viewer URL `<profiler>/from-url/<encoded>/...`.
fn profile_url_in(viewer_url: &str) -> String {
    let encoded = viewer_url
        .split("/from-url/")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no /from-url/ in {viewer_url}"));
    percent_decode(encoded)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Checks a served profile URL's form: loopback, and a secret first segment of at least
/// 16 characters.
fn assert_secret_url(profile_url: &str) {
    let rest = profile_url
        .strip_prefix("http://127.0.0.1:")
        .unwrap_or_else(|| panic!("not served on 127.0.0.1: {profile_url}"));
    let secret = rest.split('/').nth(1).unwrap_or("");
    assert!(
        secret.len() >= 16 && secret.chars().all(|c| c.is_ascii_alphanumeric()),
        "{profile_url}"
    );
}

/// Records `CMD` into DIR/NAME (a Firefox profile is checked by ffp-check); sampler's
/// stderr and the file.
fn record_into(dir: &Path, name: &str, cmd: &[&str]) -> (String, PathBuf) {
    let out = dir.join(name);
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&out)
        .arg("--")
        .args(cmd)
        .output()
        .expect("sampler runs");
    assert!(o.status.success(), "{}", stderr(&o));
    if name.contains(".json") {
        ffp_check(&out);
    }
    (stderr(&o), out)
}

/// Opens `url` in the browser and checks that the call tree shows split7030's functions
/// with the counts of `file`.
fn assert_page_shows_split7030(url: &str, file: &Path, shot: &Path) {
    let page = open_in_browser(url, shot);
    let rows = tree_rows(&page);
    assert_shows(&rows, &SPLIT7030_FUNCTIONS, &page);
    assert_counts_match(&rows, file, &page);
}

/// Waits for sampler to exit by itself, and checks that it exited 0; its stderr.
fn assert_exits_0(child: Reaped) -> String {
    let (code, err) = finished(child, Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    err
}

/// Starts `sampler view --no-open --exit-after-fetch` of `files` for `profiler`; it and
/// the URL it printed, which starts with `<profiler>/<page>`.
fn start_view(profiler: &Profiler, files: &[&Path], page: &str) -> (Reaped, String) {
    let mut args = vec![
        "view",
        "--no-open",
        "--exit-after-fetch",
        "--profiler-url",
        &profiler.url,
    ];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    start_sampler(&args, &format!("{}/{page}", profiler.url))
}

fn view_opens_the_call_tree_in_the_profiler() {
    let dir = tempdir();
    let (err, file) = record_into(&dir, "split.json.gz", &[&target("split7030"), "1"]);
    // The summary ends with the command that views the file.
    assert_eq!(
        err.lines().last(),
        Some(format!("sampler: view it: sampler view {}", file.display()).as_str()),
        "{err}"
    );
    let profiler = Profiler::start();
    let (view, url) = start_view(&profiler, &[&file], "from-url/");
    assert!(url.ends_with('/'), "{url}");
    let served = profile_url_in(&url);
    assert_secret_url(&served);
    assert!(served.ends_with("/split.json"), "{served}");
    assert_page_shows_split7030(&url, &file, &dir.join("view-calltree.png"));
    let err = assert_exits_0(view);
    assert!(err.contains("until it has fetched them"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn record_view_serves_the_profile_it_wrote() {
    let dir = tempdir();
    let file = dir.join("recorded.json");
    let profiler = Profiler::start();
    let prefix = format!("{}/from-url/", profiler.url);
    let (record, url) = start_sampler(
        &[
            "record",
            "--view",
            "--no-open",
            "--exit-after-fetch",
            "--profiler-url",
            &profiler.url,
            "-o",
            file.to_str().unwrap(),
            "--",
            &target("split7030"),
            "1",
        ],
        &prefix,
    );
    // The URL is printed once the profile is written.
    ffp_check(&file);
    assert!(profile_url_in(&url).ends_with("/recorded.json"), "{url}");
    assert_page_shows_split7030(&url, &file, &dir.join("record-view-calltree.png"));
    let err = assert_exits_0(record);
    assert!(err.contains("sampler: wrote "), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn view_compares_two_profiles() {
    let dir = tempdir();
    let (_, base) = record_into(&dir, "base.json.gz", &[&target("split7030"), "1"]);
    let (_, other) = record_into(&dir, "busy.json", &[&target("busy"), "1", "0.5"]);
    let profiler = Profiler::start();
    let (view, url) = start_view(&profiler, &[&base, &other], "compare/?");
    // Each profile's own viewer URL, with a thread selected, in a profiles[] parameter.
    let params: Vec<String> = url
        .split_once('?')
        .unwrap()
        .1
        .split('&')
        .map(|p| {
            let value = p
                .strip_prefix("profiles[]=")
                .unwrap_or_else(|| panic!("{url}"));
            percent_decode(value)
        })
        .collect();
    assert_eq!(params.len(), 2, "{url}");
    for (param, name) in params.iter().zip(["base.json", "busy.json"]) {
        assert!(
            param.starts_with(&format!("{}/from-url/", profiler.url)),
            "{param}"
        );
        assert!(param.contains("/calltree/?thread="), "{param}");
        let served = profile_url_in(param);
        assert_secret_url(&served);
        assert!(served.ends_with(name), "{served}");
    }
    let page = open_in_browser(&url, &dir.join("view-compare.png"));
    let tracks = page["tracks"].to_string();
    for track in ["from profile 1", "from profile 2", "Diff between 1 and 2"] {
        assert!(tracks.contains(track), "no {track} track: {page:#}");
    }
    // busy has none of split7030's functions: the difference is all of them.
    let rows = tree_rows(&page);
    assert_shows(&rows, &SPLIT7030_FUNCTIONS, &page);
    assert_exits_0(view);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The golden profile: a Firefox profile that sampler reads, without recording.
fn golden_profile() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/rich.firefox.json")
}

/// Sends `request` to 127.0.0.1:`port`; the response's status, headers (names in lower
/// case) and body.
fn http(port: u16, request: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head: {}", String::from_utf8_lossy(&all)));
    let head = String::from_utf8(all[..end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    (status, headers, all[end + 4..].to_vec())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n")
}

fn the_server_serves_only_its_secret_path() {
    let golden = golden_profile();
    let (view, url) = start_sampler(
        &[
            "view",
            "--no-open",
            "--profiler-url",
            "http://viewer.invalid",
            golden.to_str().unwrap(),
        ],
        "http://viewer.invalid/from-url/",
    );
    let served = profile_url_in(&url);
    assert_secret_url(&served);
    let (port, path) = port_and_path(&served);
    let secret = path.split('/').nth(1).unwrap().to_string();
    let json = std::fs::read(&golden).unwrap();

    let (status, headers, body) = http(port, &get(&path, ""));
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "access-control-allow-origin"), Some("*"));
    assert_eq!(body, json);
    let (status, headers, body) = http(port, &get(&path, "Accept-Encoding: gzip, br\r\n"));
    assert_eq!(
        (status, header(&headers, "content-encoding")),
        (200, Some("gzip"))
    );
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, json);
    let (status, headers, body) = http(port, &format!("HEAD {path} HTTP/1.1\r\n\r\n"));
    assert_eq!((status, body.len()), (200, 0));
    assert_eq!(
        header(&headers, "content-length"),
        Some(json.len().to_string().as_str())
    );

    // Anything else is 404, without the CORS header.
    let mut wrong = secret.clone().into_bytes();
    wrong[0] = if wrong[0] == b'a' { b'b' } else { b'a' };
    let wrong = String::from_utf8(wrong).unwrap();
    for other in [
        "/".to_string(),
        "/index.html".to_string(),
        path.replacen(&secret, &wrong, 1),
        path.replacen(&secret, &secret[..16], 1),
        format!("/{secret}/"),
        format!("/{secret}/1/other.json"),
        format!("/{secret}/../{secret}/1/rich.firefox.json"),
    ] {
        let (status, headers, body) = http(port, &get(&other, ""));
        assert_eq!(status, 404, "{other}");
        assert_eq!(
            header(&headers, "access-control-allow-origin"),
            None,
            "{other}"
        );
        assert!(body.is_empty(), "{other}");
    }
    let (status, _, _) = http(
        port,
        &format!("POST {path} HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
    );
    assert_eq!(status, 405);
    let (status, _, _) = http(port, "NONSENSE\r\n\r\n");
    assert_eq!(status, 400);
    let huge = format!("X-Pad: {}\r\n", "x".repeat(20_000));
    let (status, _, _) = http(port, &get(&path, &huge));
    assert_eq!(status, 431);

    // Clients that connect and say nothing hold nobody else up, and are dropped.
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let started = Instant::now();
    assert_eq!(http(port, &get(&path, "")).0, 200);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let mut first = &idle[0];
    first
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut byte = [0u8; 1];
    let started = Instant::now();
    assert_eq!(
        first.read(&mut byte).unwrap(),
        0,
        "the idle connection is closed"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );

    // Ctrl-C ends it, and it had said so.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(view.0.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let (code, err) = finished(view, Duration::from_secs(10));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("until Ctrl-C"), "{err}");
}

fn view_refuses_what_it_cannot_show() {
    let dir = tempdir();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let speedscope = write("x.speedscope.json", "{\"profiles\": []}");
    let svg = write("x.svg", "<svg/>");
    let json = write("x.json", "{\"meta\": {}}");
    let folded = write("x.folded", "main;work\n");
    let golden = golden_profile();
    let golden = golden.to_str().unwrap();
    let listing = || {
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = listing();
    for (args, says) in [
        (
            vec!["view", &speedscope],
            format!("{speedscope}: not a speedscope file: missing field `shared`"),
        ),
        (vec!["view", &svg], format!("{svg} is an SVG flame graph")),
        (
            vec!["view", &json],
            format!("{json} is not a profile that sampler wrote"),
        ),
        (
            vec!["view", &folded],
            format!("{folded}: line 1: no sample count"),
        ),
        (
            vec!["view", golden, &svg],
            format!("{svg} is an SVG flame graph"),
        ),
        (
            vec!["view", "--profiler-url", "ftp://x", golden],
            "not the http:// or https:// address".into(),
        ),
        (
            vec!["record", "--port", "1", "--", "true"],
            "go with --view".into(),
        ),
        (
            vec!["record", "--view", "-o", "x.svg", "--", "true"],
            "an SVG flame graph keeps no samples to show there".into(),
        ),
    ] {
        let o = Command::new(sampler_bin())
            .args(&args)
            .arg("--no-open")
            .current_dir(&dir)
            .output()
            .expect("sampler runs");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(&says), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    // Nothing was written.
    assert_eq!(listing(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The folded file's stacks, each as often as its count says, sorted.
fn folded_stacks(path: &Path) -> Vec<String> {
    let mut stacks = Vec::new();
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        stacks.extend(std::iter::repeat_n(
            stack.to_string(),
            count.parse().unwrap(),
        ));
    }
    stacks.sort();
    stacks
}

fn view_converts_folded_stacks_into_a_firefox_profile() {
    let folded = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/rich.folded");
    let (view, url) = start_sampler(
        &[
            "view",
            "--no-open",
            "--exit-after-fetch",
            "--profiler-url",
            "http://viewer.invalid",
            folded.to_str().unwrap(),
        ],
        "http://viewer.invalid/from-url/",
    );
    let served = profile_url_in(&url);
    assert!(served.ends_with("/rich.folded.json"), "{served}");
    let (port, path) = port_and_path(&served);
    let (status, _, body) = http(port, &get(&path, ""));
    assert_eq!(status, 200);
    assert_exits_0(view);
    let dir = tempdir();
    let file = dir.join("converted.json");
    std::fs::write(&file, body).unwrap();
    ffp_check(&file);
    let mut stacks: Vec<String> = thread_paths(&load(&file))
        .into_iter()
        .flat_map(|t| t.paths)
        .map(|p| p.join(";"))
        .collect();
    stacks.sort();
    assert_eq!(stacks, folded_stacks(&folded));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn view_shows_every_format_that_keeps_samples() {
    let dir = tempdir();
    let (_, firefox) = record_into(&dir, "split.json", &[&target("split7030"), "1"]);
    for name in ["split.folded", "split.pb.gz", "split.speedscope.json"] {
        let file = dir.join(name);
        let o = Command::new(sampler_bin())
            .arg("convert")
            .arg(&firefox)
            .arg("-o")
            .arg(&file)
            .output()
            .expect("sampler runs");
        assert!(o.status.success(), "{}", stderr(&o));
        let profiler = Profiler::start();
        let (view, url) = start_view(&profiler, &[&file], "from-url/");
        // The converted file shows the recording's counts.
        let shot = dir.join(format!("view-{name}.png"));
        assert_page_shows_split7030(&url, &firefox, &shot);
        assert_exits_0(view);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The port and path of a served profile's URL.
fn port_and_path(served: &str) -> (u16, String) {
    let rest = served.strip_prefix("http://127.0.0.1:").unwrap();
    let (port, path) = rest.split_once('/').unwrap();
    (port.parse().unwrap(), format!("/{path}"))
}

/// Runs `sampler view --exit-after-fetch` of the golden profile with `env` (sudo's and
/// the display's variables removed unless `env` sets them), calls `meanwhile` with the
/// URL it printed, then fetches the profile as the viewer would, so that it exits; its
/// stderr.
fn view_with_env(env: &[(&str, &str)], meanwhile: impl FnOnce(&str)) -> String {
    let mut command = Command::new(sampler_bin());
    command
        .args([
            "view",
            "--exit-after-fetch",
            "--profiler-url",
            "http://viewer.invalid",
        ])
        .arg(golden_profile())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in [
        "SUDO_UID",
        "SUDO_GID",
        "SUDO_USER",
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "BROWSER",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    let mut child = Reaped(command.spawn().expect("sampler runs"));
    let stdout = child.0.stdout.take().unwrap();
    let url = first_line_within(stdout, Duration::from_secs(30), |_| true).expect("a URL");
    meanwhile(&url);
    let (port, path) = port_and_path(&profile_url_in(&url));
    assert_eq!(http(port, &get(&path, "")).0, 200);
    assert_exits_0(child)
}

fn the_browser_is_the_sudo_users_never_roots() {
    let dir = tempdir();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // The browser ($BROWSER): it writes its uid, all its groups (root's are dropped) and
    // the URL it got.
    let who = dir.join("who");
    let browser = dir.join("browser");
    std::fs::write(
        &browser,
        format!(
            "#!/bin/sh\n{{ id -u; id -G; echo \"$1\"; }} > {}.tmp && mv {0}.tmp {0}\n",
            who.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &browser,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let browser = browser.to_str().unwrap();
    let sudo_nobody = [
        ("SUDO_UID", "65534"),
        ("SUDO_GID", "65534"),
        ("SUDO_USER", "nobody"),
        ("BROWSER", browser),
    ];
    let mut with_display = sudo_nobody.to_vec();
    with_display.push(("DISPLAY", ":97"));
    let err = view_with_env(&with_display, |url| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !who.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let seen = std::fs::read_to_string(&who).expect("xdg-open ran the browser");
        assert_eq!(seen, format!("65534\n65534\n{url}\n"));
    });
    assert!(!err.contains("no browser"), "{err}");
    // Root without sudo starts no browser; neither does a session without a display.
    let err = view_with_env(&[("DISPLAY", ":97"), ("BROWSER", browser)], |_| {});
    assert!(
        err.contains("no browser opened (sampler runs as root, not under sudo"),
        "{err}"
    );
    let err = view_with_env(&sudo_nobody, |_| {});
    assert!(err.contains("no browser opened (no display"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Where the browser's screenshots go: `$SAMPLER_VIEW_SHOTS` if set, else `dir`.
fn shots_dir(dir: &Path) -> PathBuf {
    std::env::var_os("SAMPLER_VIEW_SHOTS").map_or(dir.to_path_buf(), PathBuf::from)
}

/// Our own browser driver for the source view (tests/browser/source-view.cjs).
fn source_view_driver() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/source-view.cjs")
}

/// Opens `url` in headless Chromium, double-clicks the call tree row of each of
/// `functions` in turn and returns what the source view showed for each:
/// `[{function, ok, file, lines: [{line, text, total, self}], unavailable, error}]`.
/// Screenshots go to `<shot_prefix>-FUNCTION.png`.
fn source_views(url: &str, shot_prefix: &Path, functions: &[&str]) -> Vec<Value> {
    let mut args: Vec<&std::ffi::OsStr> = vec![url.as_ref(), shot_prefix.as_ref()];
    args.extend(functions.iter().map(std::ffi::OsStr::new));
    let (_, page) = run_driver(&source_view_driver(), &args);
    assert_eq!(page["errors"], Value::Array(vec![]), "{page:#}");
    let views = page["views"].as_array().unwrap().clone();
    assert_eq!(views.len(), functions.len(), "{page:#}");
    for (view, f) in views.iter().zip(functions) {
        let shot = PathBuf::from(format!("{}-{f}.png", shot_prefix.display()));
        assert!(shot.exists(), "no screenshot at {}", shot.display());
        assert_eq!(view["error"], "", "{view:#}");
    }
    views
}

/// Records split7030 for a second into DIR/NAME with `extra` options; the file (checked
/// by ffp-check) and the CPU time the program used.
fn record_split7030(dir: &Path, name: &str, extra: &[&str]) -> (PathBuf, f64) {
    let file = dir.join(name);
    let o = Command::new(sampler_bin())
        .arg("record")
        .args(extra)
        .arg("-o")
        .arg(&file)
        .args(["--", &target("split7030"), "1"])
        .output()
        .expect("sampler runs");
    assert!(o.status.success(), "{}", stderr(&o));
    ffp_check(&file);
    (file, command_cpu_ms(&o))
}

/// What the viewer's source view of `source` must show beside each line, from the
/// profile: (total, self) samples, where total counts the samples with a frame of a
/// function of `source` at that line anywhere on their stack (once a sample), and self
/// those whose innermost frame it is.
fn line_counts(p: &Value, source: &str) -> std::collections::BTreeMap<u64, (u64, u64)> {
    let mut counts = std::collections::BTreeMap::new();
    for (_, stacks) in thread_frames(p) {
        for stack in stacks {
            let at = |f: &FrameInfo| f.line.filter(|_| f.file.as_deref() == Some(source));
            let mut lines: Vec<u64> = stack.iter().filter_map(at).collect();
            lines.sort_unstable();
            lines.dedup();
            for line in lines {
                counts.entry(line).or_insert((0, 0)).0 += 1;
            }
            if let Some(line) = stack.last().and_then(at) {
                counts.entry(line).or_insert((0, 0)).1 += 1;
            }
        }
    }
    counts
}

/// The line of `view` numbered `number`.
fn shown_line(view: &Value, number: u64) -> &Value {
    view["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["line"] == number)
        .unwrap_or_else(|| panic!("line {number} is not shown: {view:#}"))
}

/// Checks that `view` shows the text of `source` (a file of bench-targets/) with the
/// profile's count beside every line; the number of the line whose text is `hot`.
fn assert_source_shown(view: &Value, source: &str, hot: &str, p: &Value) -> u64 {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("bench-targets")
        .join(source);
    let path = path.canonicalize().unwrap().display().to_string();
    assert_eq!(view["ok"], true, "{view:#}");
    assert_eq!(view["file"], path.as_str(), "{view:#}");
    let text = std::fs::read_to_string(&path).unwrap();
    // As the editor does, the text after the last newline (empty) is a line too.
    let file_lines: Vec<&str> = text.split('\n').collect();
    let counts = line_counts(p, &path);
    let lines = view["lines"].as_array().unwrap();
    assert!(!lines.is_empty(), "{view:#}");
    for line in lines {
        let number = line["line"].as_u64().unwrap_or_else(|| panic!("{line}"));
        let shown = line["text"].as_str().unwrap().trim_end_matches('\n');
        assert_eq!(shown, file_lines[number as usize - 1], "line {number}");
        let (total, own) = counts.get(&number).copied().unwrap_or((0, 0));
        assert_eq!(
            (line["total"].as_u64(), line["self"].as_u64()),
            (Some(total), Some(own)),
            "line {number} of {source}: {line}; the profile's counts: {counts:?}"
        );
    }
    let number = file_lines.iter().position(|l| *l == hot).unwrap() as u64 + 1;
    assert_eq!(shown_line(view, number)["text"], hot, "{view:#}");
    number
}

fn view_shows_hot_lines_in_the_source_view() {
    let dir = tempdir();
    let shots = shots_dir(&dir);
    let (file, cpu_ms) = record_split7030(&dir, "split.json", &[]);
    let p = load(&file);
    let profiler = Profiler::start();
    let (view, url) = start_view(&profiler, &[&file], "from-url/");
    let views = source_views(&url, &shots.join("source-view"), &["hot_a", "sum_to"]);
    assert_exits_0(view);

    // hot_a's file, split7030.c: its line (which calls the inlined sum_to) is on the
    // stack of hot_a's ~70% of the samples, and the innermost frame of none. sum_to's
    // file, work.h: its loop runs in almost every sample, innermost.
    let hot_a = "__attribute__((noinline)) void hot_a(long n) { sum_to(n); }";
    let sum_to = "    for (long i = 0; i < n; i++) s += (double)i * 1.000001;";
    for (view, source, hot, column, share) in [
        (&views[0], "split7030.c", hot_a, "total", 0.45),
        (&views[1], "work.h", sum_to, "self", 0.75),
    ] {
        let number = assert_source_shown(view, source, hot, &p);
        let count = shown_line(view, number)[column].as_u64().unwrap();
        let what = format!("{source}:{number}'s {column} count");
        assert_covers_cpu(&what, count as usize, cpu_ms, share);
    }

    // Without the sources in the file, the viewer has no text to show for hot_a.
    let (bare, _) = record_split7030(&dir, "bare.json", &["--no-sources"]);
    let (view, url) = start_view(&profiler, &[&bare], "from-url/");
    let views = source_views(&url, &shots.join("no-sources"), &["hot_a"]);
    assert_exits_0(view);
    assert_eq!(views[0]["ok"], false, "{:#}", views[0]);
    let says = views[0]["unavailable"].as_str().unwrap();
    assert!(says.starts_with("Source code not available"), "{says}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The number after "Overall" in a flame graph tooltip: "… Running Self Overall 659 samples …".
fn tooltip_samples(tooltip: &Value) -> usize {
    let text = tooltip
        .as_str()
        .unwrap_or_else(|| panic!("no tooltip: {tooltip}"));
    text.split(" Overall ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.replace(',', "").parse().ok())
        .unwrap_or_else(|| panic!("no sample count in the tooltip {text:?}"))
}

fn view_draws_hot_a_and_hot_b_70_30_in_the_flame_graph() {
    let dir = tempdir();
    let (file, _) = record_split7030(&dir, "split.json", &[]);
    let paths: Vec<Vec<String>> = thread_paths(&load(&file))
        .into_iter()
        .flat_map(|t| t.paths)
        .collect();
    let profiler = Profiler::start();
    let (view, url) = start_view(&profiler, &[&file], "from-url/");
    let shot = shots_dir(&dir).join("view-flame-graph.png");
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/flame-graph.cjs");
    let url = format!("{url}flame-graph/");
    let args = [
        url.as_ref(),
        shot.as_ref(),
        "hot_a".as_ref(),
        "hot_b".as_ref(),
    ];
    let (found, graph) = run_driver(&driver, &args);
    assert!(found, "{graph:#}");
    assert_eq!(graph["errors"], Value::Array(vec![]), "{graph:#}");
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    assert_exits_0(view);
    let mut widths = Vec::new();
    for f in ["hot_a", "hot_b"] {
        // The box's tooltip has the file's count, and its width is its share of the samples
        // (to the driver's 1/200 steps, and a pixel or two of gaps between boxes).
        let (in_file, percent) = count_run(&paths, &["outer", f]);
        assert_eq!(
            tooltip_samples(&graph["tooltips"][f]),
            in_file,
            "{f}: {graph:#}"
        );
        let width = graph["widths"][f].as_f64().unwrap();
        assert!(
            (width - percent / 100.0).abs() <= 0.02,
            "{f}: {percent}%: {graph:#}"
        );
        widths.push(width);
    }
    // Roughly 70/30: hot_a does 7 units of work a round, hot_b 3.
    let share_a = widths[0] / (widths[0] + widths[1]);
    assert!((0.62..=0.78).contains(&share_a), "{share_a}: {graph:#}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn main() {
    run_tests(tests![
        view_opens_the_call_tree_in_the_profiler: Need::Perf, BROWSER;
        record_view_serves_the_profile_it_wrote: Need::Perf, BROWSER;
        view_compares_two_profiles: Need::Perf, BROWSER;
        the_server_serves_only_its_secret_path;
        view_refuses_what_it_cannot_show;
        view_converts_folded_stacks_into_a_firefox_profile;
        view_shows_every_format_that_keeps_samples: Need::Perf, BROWSER;
        the_browser_is_the_sudo_users_never_roots: Need::Root;
        view_shows_hot_lines_in_the_source_view: Need::Perf, BROWSER;
        view_draws_hot_a_and_hot_b_70_30_in_the_flame_graph: Need::Perf, BROWSER;
    ]);
}
