//! The small HTTP/1.1 server of `sampler view`: it hands one or two profiles to the
//! Firefox Profiler in a browser, and nothing else. It listens on 127.0.0.1 only, answers
//! GET, HEAD and OPTIONS, and serves each profile under a path that starts with a secret
//! of [`SECRET_CHARS`] random characters, so that another user of the machine (or a web
//! page that guesses ports) cannot read it; only those paths carry the CORS header the
//! viewer's page needs to read across origins, and every other path is 404.
//!
//! A local client is not trusted either: a request head is read within
//! [`MAX_HEAD_BYTES`] and [`HEAD_DEADLINE`], a response is written within
//! [`WRITE_DEADLINE`], at most [`MAX_CONNECTIONS`] are served at once (one thread
//! each), and every response closes its connection.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Characters of the secret path: 32 from a 32-letter alphabet carry 160 random bits.
pub const SECRET_CHARS: usize = 32;

/// The alphabet of the secret (RFC 4648 base32, lower case): safe in a URL as it is.
const SECRET_ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// A request head (request line and headers) larger than this is refused: a browser's
/// GET is under 2 KiB, so 16 KiB leaves room for long cookies and is still small.
pub const MAX_HEAD_BYTES: usize = 16 << 10;

/// Time for a client to send its whole request head; a browser sends it at once.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(10);

/// Time to write one response: on loopback the largest profile (256 MiB of JSON) takes
/// seconds; a client that reads slower than that is dropped.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(300);

/// Connections served at once; more are closed unanswered. The viewer opens one per
/// profile; the cap bounds the threads a local client can make sampler start.
pub const MAX_CONNECTIONS: usize = 16;

/// Bytes written per write call, so that the deadline is looked at between them.
const WRITE_CHUNK: usize = 256 << 10;

/// How often the serving loop looks at its stop condition while no client connects.
const POLL_INTERVAL_MS: u16 = 200;

/// One profile served: its path after the secret (`1/NAME.json`), its JSON text, the text gzipped (made on the first
/// request that accepts gzip), and whether a GET has fetched it whole.
pub struct Document {
    pub path: String,
    json: Vec<u8>,
    gzipped: OnceLock<Vec<u8>>,
    fetched: AtomicBool,
}

impl Document {
    pub fn new(path: String, json: Vec<u8>) -> Document {
        Document {
            path,
            json,
            gzipped: OnceLock::new(),
            fetched: AtomicBool::new(false),
        }
    }

    fn gzipped(&self) -> &[u8] {
        self.gzipped.get_or_init(|| {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&self.json)
                .and_then(|()| gz.finish())
                .expect("compressing into memory does not fail")
        })
    }

    pub fn was_fetched(&self) -> bool {
        self.fetched.load(Ordering::Relaxed)
    }
}

/// What the server serves: the secret its paths start with, and the documents.
pub struct Site {
    pub secret: String,
    pub documents: Vec<Document>,
}

/// A new secret of [`SECRET_CHARS`] characters from the kernel's random source.
pub fn new_secret() -> std::io::Result<String> {
    let mut bytes = [0u8; SECRET_CHARS];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    // 256 is a multiple of 32: every letter is equally likely.
    Ok(bytes
        .iter()
        .map(|b| char::from(SECRET_ALPHABET[usize::from(*b) % SECRET_ALPHABET.len()]))
        .collect())
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The parts of a request that the server looks at.
#[derive(Debug, PartialEq)]
pub struct Request {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    pub accepts_gzip: bool,
    /// A preflight from a public page to this local server asks for this (Chromium's
    /// private network access).
    pub private_network: bool,
}

/// A response's status line and headers; the body is a document's, when there is one.
#[derive(Debug, PartialEq)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    /// The index of the document sent, and whether gzipped.
    pub body: Option<(usize, bool)>,
}

impl Response {
    fn empty(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: None,
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    }
}

/// The request in a complete head (up to and without its blank line); `Err` is the
/// status that answers a malformed one.
pub fn parse_head(head: &[u8]) -> Result<Request, u16> {
    let text = std::str::from_utf8(head).map_err(|_| 400u16)?;
    let mut lines = text.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (first.next(), first.next(), first.next(), first.next())
    else {
        return Err(400);
    };
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1") || !target.starts_with('/') {
        return Err(400);
    }
    let mut request = Request {
        method: method.to_string(),
        path: target.split(['?', '#']).next().unwrap_or("").to_string(),
        accepts_gzip: false,
        private_network: false,
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(400);
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("accept-encoding") {
            request.accepts_gzip = value.split(',').any(|coding| {
                let mut parts = coding.split(';').map(str::trim);
                let name = parts.next().unwrap_or("");
                // `gzip;q=0` refuses it.
                name.eq_ignore_ascii_case("gzip") && !parts.any(|p| p.replace(' ', "") == "q=0")
            });
        } else if name.eq_ignore_ascii_case("access-control-request-private-network") {
            request.private_network = value.eq_ignore_ascii_case("true");
        }
    }
    Ok(request)
}

/// The answer to `request`: a document under the secret path, else 404 (without CORS).
pub fn route(site: &Site, request: &Request) -> Response {
    let under_secret = request
        .path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .filter(|(secret, _)| same_secret(secret.as_bytes(), site.secret.as_bytes()));
    let Some((_, rest)) = under_secret else {
        return Response::empty(404);
    };
    let Some(index) = site.documents.iter().position(|d| d.path == rest) else {
        return Response::empty(404);
    };
    let mut response = Response::empty(200);
    response
        .headers
        .push(("Access-Control-Allow-Origin", "*".into()));
    match request.method.as_str() {
        "GET" | "HEAD" => {
            let gzip = request.accepts_gzip;
            response
                .headers
                .push(("Content-Type", "application/json".into()));
            response.headers.push(("Cache-Control", "no-store".into()));
            if gzip {
                response.headers.push(("Content-Encoding", "gzip".into()));
            }
            response.headers.push(("Vary", "Accept-Encoding".into()));
            response.body = Some((index, gzip));
        }
        "OPTIONS" => {
            response.status = 204;
            response
                .headers
                .push(("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS".into()));
            response
                .headers
                .push(("Access-Control-Allow-Headers", "*".into()));
            if request.private_network {
                response
                    .headers
                    .push(("Access-Control-Allow-Private-Network", "true".into()));
            }
        }
        _ => {
            response.status = 405;
            response
                .headers
                .push(("Allow", "GET, HEAD, OPTIONS".into()));
        }
    }
    response
}

/// Reads a request head within the limits; `Err(Some(status))` answers, `Err(None)` just
/// closes (the client went away or was too slow).
fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, Option<u16>> {
    let start = Instant::now();
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        let left = HEAD_DEADLINE.checked_sub(start.elapsed()).ok_or(None)?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|_| None)?;
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return Err(None),
            Ok(n) => n,
        };
        // Only the new bytes and the three before them can complete the blank line.
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(from + end);
            return Ok(head);
        }
        if head.len() > MAX_HEAD_BYTES {
            return Err(Some(431));
        }
    }
}

/// Writes all of `bytes` before `deadline`.
fn write_before(stream: &mut TcpStream, bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    for chunk in bytes.chunks(WRITE_CHUNK) {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(std::io::ErrorKind::TimedOut)?;
        stream.set_write_timeout(Some(left))?;
        stream.write_all(chunk)?;
    }
    Ok(())
}

/// Answers the one request of a connection.
fn serve_connection(mut stream: TcpStream, site: &Site) {
    let request = read_head(&mut stream).and_then(|head| parse_head(&head).map_err(Some));
    let (response, head_only) = match request {
        Ok(request) => (route(site, &request), request.method == "HEAD"),
        Err(Some(status)) => (Response::empty(status), false),
        Err(None) => return,
    };
    let body: &[u8] = match response.body {
        Some((i, true)) => site.documents[i].gzipped(),
        Some((i, false)) => &site.documents[i].json,
        None => &[],
    };
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        response.status,
        reason(response.status),
        body.len()
    );
    for (name, value) in &response.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let deadline = Instant::now() + WRITE_DEADLINE;
    let mut sent = write_before(&mut stream, head.as_bytes(), deadline);
    if !head_only {
        sent = sent.and_then(|()| write_before(&mut stream, body, deadline));
    }
    if sent
        .and_then(|()| stream.shutdown(std::net::Shutdown::Write))
        .is_ok()
        && !head_only
    {
        if let Some((i, _)) = response.body {
            site.documents[i].fetched.store(true, Ordering::Relaxed);
        }
    }
}

/// Serves `site` on `listener` until `stop` says so (looked at between connections and
/// every `POLL_INTERVAL_MS`).
pub fn serve(listener: TcpListener, site: Arc<Site>, stop: &dyn Fn(&Site) -> bool) {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let active = Arc::new(AtomicUsize::new(0));
    // Non-blocking, so that an accept after a wake-up whose client already left does not
    // wait for the next one.
    let _ = listener.set_nonblocking(true);
    while !stop(&site) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        if let Err(e) = nix::poll::poll(&mut fds, PollTimeout::from(POLL_INTERVAL_MS)) {
            if e != nix::errno::Errno::EINTR {
                crate::say!("sampler: the viewer's server stopped: {e}");
                return;
            }
        }
        let Ok((stream, _)) = listener.accept() else {
            continue;
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (site, active) = (Arc::clone(&site), Arc::clone(&active));
        let started = std::thread::Builder::new()
            .name("sampler-view".into())
            .spawn(move || {
                if stream.set_nonblocking(false).is_ok() {
                    serve_connection(stream, &site);
                }
                active.fetch_sub(1, Ordering::SeqCst);
            });
        if started.is_err() {
            crate::say!("sampler: the viewer's server cannot start a thread for a request");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site() -> Site {
        Site {
            secret: "s".repeat(SECRET_CHARS),
            documents: vec![Document::new("1/a.json".into(), b"{}".to_vec())],
        }
    }

    fn get(path: &str) -> Request {
        Request {
            method: "GET".into(),
            path: path.into(),
            accepts_gzip: false,
            private_network: false,
        }
    }

    fn has_cors(r: &Response) -> bool {
        r.headers
            .iter()
            .any(|(name, _)| *name == "Access-Control-Allow-Origin")
    }

    #[test]
    fn only_the_secret_path_is_served_and_only_it_has_cors() {
        let site = site();
        let secret = &site.secret;
        let ok = route(&site, &get(&format!("/{secret}/1/a.json")));
        assert_eq!((ok.status, ok.body), (200, Some((0, false))));
        assert!(has_cors(&ok));
        for path in [
            "/".to_string(),
            "/1/a.json".to_string(),
            format!("/{}/1/a.json", &secret[1..]),
            format!("/{secret}x/1/a.json"),
            format!("/{secret}/1/b.json"),
            format!("/{secret}/"),
            format!("/{secret}"),
        ] {
            let r = route(&site, &get(&path));
            assert_eq!(r.status, 404, "{path}");
            assert!(!has_cors(&r), "{path}");
        }
        let mut post = get(&format!("/{secret}/1/a.json"));
        post.method = "POST".into();
        assert_eq!(route(&site, &post).status, 405);
        post.method = "OPTIONS".into();
        post.private_network = true;
        let preflight = route(&site, &post);
        assert_eq!(preflight.status, 204);
        assert!(preflight
            .headers
            .contains(&("Access-Control-Allow-Private-Network", "true".into())));
    }

    #[test]
    fn request_heads_are_parsed_strictly() {
        let r = parse_head(b"GET /a/b?x=1 HTTP/1.1\r\nHost: h\r\nAccept-Encoding: br, GZip;q=0.5")
            .unwrap();
        assert_eq!((r.path.as_str(), r.accepts_gzip), ("/a/b", true));
        let r = parse_head(b"GET / HTTP/1.1\r\nAccept-Encoding: gzip;q=0").unwrap();
        assert!(!r.accepts_gzip);
        assert_eq!(parse_head(b"GET / HTTP/2\r\n"), Err(400));
        assert_eq!(parse_head(b"GET http://x/ HTTP/1.1"), Err(400));
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\nno colon"), Err(400));
        assert_eq!(parse_head(b"GET  / HTTP/1.1"), Err(400));
        assert_eq!(parse_head(b"\xff / HTTP/1.1"), Err(400));
    }

    #[test]
    fn secrets_are_long_random_and_url_safe() {
        let (a, b) = (new_secret().unwrap(), new_secret().unwrap());
        assert_eq!(a.len(), SECRET_CHARS);
        assert_ne!(a, b);
        assert!(a.bytes().all(|c| SECRET_ALPHABET.contains(&c)));
        assert!(same_secret(a.as_bytes(), a.as_bytes()));
        assert!(!same_secret(a.as_bytes(), b.as_bytes()));
        assert!(!same_secret(a.as_bytes(), &a.as_bytes()[1..]));
    }
}
