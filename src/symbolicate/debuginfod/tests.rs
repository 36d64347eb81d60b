//! The client against servers on 127.0.0.1: what is cached, what is refused, what a
//! silent server costs; and the checks of a download's build ID.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cache::CACHED_NAME;
use super::fetch::PREFIX_BYTES;
use super::verify::early_verdict;
use super::*;

/// A server on 127.0.0.1 that answers every request with `status` and `body`, and
/// counts the requests; its URL.
fn serve(status: &'static str, body: Vec<u8>) -> (String, Arc<AtomicU64>) {
    serve_with(status, body, true)
}

/// [`serve`], saying the body's length or (`with_length` false) ending it by closing
/// the connection.
fn serve_with(status: &'static str, body: Vec<u8>, with_length: bool) -> (String, Arc<AtomicU64>) {
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
