//! `sampler view` and `record --view`: from a profile file to the Firefox Profiler in the
//! user's browser in one command. It owns the viewer's URLs (one profile, or two to
//! compare), the browser that is opened (as the user who ran sudo, never as root), and
//! the run of the small server ([`server`]) that hands the profiles to the viewer's page.
//!
//! It is a part of `cli`, not of `emit`: emit turns a [`crate::profile::Profile`] into
//! bytes, while this reads files that were written, serves them over a socket and starts
//! a process as the invoking user; it is the last step after the pipeline, as `report`
//! is.

pub mod args;
pub mod convert;
pub mod server;

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};

use server::{Document, Site};

/// The viewer opened when neither `--profiler-url` nor [`PROFILER_URL_ENV`] names one.
pub const DEFAULT_PROFILER_URL: &str = "https://profiler.firefox.com";

/// The environment variable that names a self-hosted Firefox Profiler.
pub const PROFILER_URL_ENV: &str = "SAMPLER_PROFILER_URL";

/// How a view is served and shown.
#[derive(Clone, Debug)]
pub struct ViewOptions {
    /// Open the URL in the user's browser.
    pub open: bool,
    /// The Firefox Profiler's address, without a trailing `/`.
    pub profiler_url: String,
    /// The port to listen on; 0 lets the kernel choose a free one.
    pub port: u16,
    /// Stop once every profile has been fetched whole, instead of at Ctrl-C.
    pub exit_after_fetch: bool,
}

/// The profiler URL: `--profiler-url`, else [`PROFILER_URL_ENV`], else the default; it
/// must be an http(s) address.
pub fn profiler_url(arg: Option<&str>) -> Result<String> {
    let env = std::env::var(PROFILER_URL_ENV).ok();
    let (url, from) = match (arg, env.as_deref()) {
        (Some(url), _) => (url, "--profiler-url"),
        (None, Some(url)) if !url.is_empty() => (url, PROFILER_URL_ENV),
        _ => (DEFAULT_PROFILER_URL, ""),
    };
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    if rest.is_none_or(|host| host.is_empty() || host.starts_with('/')) {
        bail!("{from} {url} is not the http:// or https:// address of a Firefox Profiler");
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("{from} {url:?} has spaces or control characters: give the address as it is");
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// `text` percent-encoded for a URL path segment or query value, as JavaScript's
/// `encodeURIComponent` does for the characters it can meet here: everything but
/// RFC 3986's unreserved characters is encoded.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The viewer's page for one profile: `<profiler>/from-url/<encoded profile URL>/`.
pub fn viewer_url(profiler: &str, profile_url: &str) -> String {
    format!("{profiler}/from-url/{}/", percent_encode(profile_url))
}

/// The viewer's comparison of two profiles: `/compare/` takes each profile's own viewer
/// URL in a `profiles[]` parameter, with a thread selected in each (without one it says
/// that none is; with a bare `profiles=` it never finishes loading).
pub fn compare_url(profiler: &str, profiles: &[(String, usize)]) -> String {
    let params: Vec<String> = profiles
        .iter()
        .map(|(url, thread)| {
            let one = format!("{}calltree/?thread={thread}", viewer_url(profiler, url));
            format!("profiles[]={}", percent_encode(&one))
        })
        .collect();
    format!("{profiler}/compare/?{}", params.join("&"))
}

/// The command that views `path`, as a shell reads it: `sampler view PATH`, the path in
/// single quotes when it has characters a shell would take apart.
pub fn view_command(path: &Path) -> String {
    let text = path.to_string_lossy();
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./+,:=@%".contains(&b));
    match plain {
        true => format!("sampler view {text}"),
        false => format!("sampler view '{}'", text.replace('\'', "'\\''")),
    }
}

/// The file name a profile is served under: the original's letters, digits, `-`, `_`
/// and `.` (others become `_`), without `.gz` (the text served is plain JSON), ending in
/// `.json`.
fn served_name(path: &Path) -> String {
    let name: String = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() || "-_.".contains(c) {
            true => c,
            false => '_',
        })
        .collect();
    let lower = name.to_ascii_lowercase();
    let stem = match lower.strip_suffix(".gz") {
        Some(_) => &name[..name.len() - 3],
        None => &name,
    };
    match stem.to_ascii_lowercase().ends_with(".json") {
        true => stem.to_string(),
        false => format!("{}.json", stem.trim_start_matches('.')),
    }
}

/// A profile ready to serve: its JSON text (checked to be a profile that sampler
/// reads, or converted from folded stacks) and the thread the comparison selects, the
/// one with the most samples.
struct Loaded {
    json: Vec<u8>,
    busiest_thread: usize,
}

fn load(path: &Path) -> Result<Loaded> {
    let (json, profile) = match convert::other_format(path) {
        Some(format) => convert::to_firefox_json(path, format)?,
        None => {
            let json = crate::emit::load::read_json_text(path)?;
            let profile = crate::emit::firefox::from_slice(&json).with_context(|| {
                format!(
                    "{} is not a profile that sampler wrote (Firefox Profiler processed format); `sampler view` shows those, and folded stacks",
                    path.display()
                )
            })?;
            (json, profile)
        }
    };
    let busiest_thread = (0..profile.threads.len())
        .max_by_key(|&i| (profile.threads[i].samples.len(), std::cmp::Reverse(i)))
        .unwrap_or(0);
    Ok(Loaded {
        json,
        busiest_thread,
    })
}

/// Serves `files` (one profile, or two to compare) and prints the viewer's URL on
/// stdout, opens it unless asked not to, and serves until a signal that ends a recording
/// arrives (which the caller has [`crate::record::interrupt::watch`]ed), or, with
/// `exit_after_fetch`, until every profile was fetched once.
pub fn view(files: &[PathBuf], options: &ViewOptions) -> Result<()> {
    let loaded = files
        .iter()
        .map(|f| load(f))
        .collect::<Result<Vec<Loaded>>>()?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, options.port))
        .with_context(|| format!("cannot listen on 127.0.0.1 port {}", options.port))?;
    let port = listener.local_addr()?.port();
    let secret = server::new_secret()
        .context("cannot read random bytes for the secret path (/dev/urandom)")?;
    // Each profile's text moves into its document (a profile can be 256 MiB).
    let mut documents = Vec::new();
    let mut profile_urls: Vec<(String, usize)> = Vec::new();
    for (i, (file, l)) in files.iter().zip(loaded).enumerate() {
        let document = Document::new(format!("{}/{}", i + 1, served_name(file)), l.json);
        let url = format!("http://127.0.0.1:{port}/{secret}/{}", document.path);
        profile_urls.push((url, l.busiest_thread));
        documents.push(document);
    }
    let url = match profile_urls.as_slice() {
        [(one, _)] => viewer_url(&options.profiler_url, one),
        _ => compare_url(&options.profiler_url, &profile_urls),
    };
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        // A closed stdout only loses the line; the browser and the server go on.
        let _ = writeln!(out, "{url}").and_then(|()| out.flush());
    }
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    crate::say!(
        "sampler: serving {} at http://127.0.0.1:{port}/ for the Firefox Profiler {}",
        names.join(" and "),
        match options.exit_after_fetch {
            true => "until it has fetched them",
            false => "until Ctrl-C",
        }
    );
    if options.open {
        open_in_browser(&url);
    }
    let signals_before = crate::record::interrupt::signals_taken();
    let exit_after_fetch = options.exit_after_fetch;
    let stop = move |site: &Site| {
        crate::record::interrupt::signals_taken() != signals_before
            || (exit_after_fetch && site.documents.iter().all(Document::was_fetched))
    };
    server::serve(listener, Arc::new(Site { secret, documents }), &stop);
    Ok(())
}

/// Opens `url` with `$BROWSER` or `xdg-open`: as the user who ran sudo, with their
/// identity and desktop session, when sampler runs under sudo; never as root. When that
/// cannot be (no display, no opener, root without sudo), one line says so; the URL is on
/// stdout.
pub fn open_in_browser(url: &str) {
    let why_not = match browser_command(url) {
        Ok((mut command, opener)) => match command.spawn() {
            Ok(mut child) => {
                // The opener may wait for the browser it starts: reaped apart, and
                // reported only when it failed.
                let _ = std::thread::Builder::new()
                    .name("sampler-browser".into())
                    .spawn(move || match child.wait() {
                        Ok(status) if !status.success() => crate::say!(
                            "sampler: {opener} could not open a browser ({status}): open the URL above yourself"
                        ),
                        _ => {}
                    });
                return;
            }
            Err(e) => format!("{opener} cannot be run: {e}"),
        },
        Err(why) => why,
    };
    crate::say!("sampler: no browser opened ({why_not}): open the URL above in one");
}

/// The directories a browser's helper is looked for in under sudo (root's PATH is not
/// the user's, and sudo's secure_path is for root).
const USER_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The command that opens `url`, as the user who should see the browser, and its name;
/// or why there is none. The opener is the first entry of `$BROWSER` (a list separated
/// by `:`, as `sensible-browser` reads it) when set, else `xdg-open`.
fn browser_command(url: &str) -> Result<(std::process::Command, String), String> {
    use std::os::unix::process::CommandExt;
    let root = nix::unistd::Uid::effective().is_root();
    let sudo = crate::record::Credentials::of_sudo_user().map_err(|e| e.to_string())?;
    if root && sudo.is_none() {
        return Err("sampler runs as root, not under sudo: no browser is started as root".into());
    }
    // Under sudo, the user's session, not root's environment.
    let env: Option<Vec<(String, String)>> = sudo.as_ref().map(|user| session_env(user.uid));
    let var = |name: &str| match &env {
        Some(env) => env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()),
        None => std::env::var(name).ok().filter(|v| !v.is_empty()),
    };
    let opener = var("BROWSER")
        .and_then(|list| list.split(':').next().map(str::to_string))
        .filter(|first| !first.is_empty())
        .unwrap_or_else(|| "xdg-open".into());
    let path = var("PATH").unwrap_or_else(|| USER_PATH.into());
    let program = match opener.contains('/') {
        true => Some(PathBuf::from(&opener)).filter(|p| p.is_file()),
        false => std::env::split_paths(&path)
            .map(|d| d.join(&opener))
            .find(|p| p.is_file()),
    };
    let Some(program) = program else {
        return Err(format!("{opener} is not installed"));
    };
    if var("DISPLAY").is_none() && var("WAYLAND_DISPLAY").is_none() {
        return Err("no display: neither DISPLAY nor WAYLAND_DISPLAY is set".into());
    }
    let mut command = std::process::Command::new(program);
    command
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Not in the terminal's process group: the Ctrl-C that stops the server leaves
        // the browser open.
        .process_group(0);
    if let (Some(user), Some(env)) = (&sudo, env) {
        command.env_clear().envs(env);
        // std drops root's supplementary groups when it changes the uid.
        command.uid(user.uid).gid(user.gid);
    }
    Ok((command, opener))
}

/// The environment a program of `uid`'s desktop session gets under sudo: their home and
/// names from the password database, the display that sudo kept, and their session's
/// runtime directory, Wayland socket and D-Bus bus when they exist.
fn session_env(uid: u32) -> Vec<(String, String)> {
    let mut env = vec![("PATH".to_string(), USER_PATH.to_string())];
    if let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        env.push(("HOME".into(), user.dir.display().to_string()));
        env.push(("USER".into(), user.name.clone()));
        env.push(("LOGNAME".into(), user.name));
        env.push(("SHELL".into(), user.shell.display().to_string()));
    }
    for name in [
        "DISPLAY",
        "XAUTHORITY",
        "WAYLAND_DISPLAY",
        "LANG",
        "LC_ALL",
        "BROWSER",
    ] {
        if let Some(value) = std::env::var(name).ok().filter(|v| !v.is_empty()) {
            env.push((name.into(), value));
        }
    }
    let runtime = PathBuf::from(format!("/run/user/{uid}"));
    if runtime.is_dir() {
        env.push(("XDG_RUNTIME_DIR".into(), runtime.display().to_string()));
        let bus = runtime.join("bus");
        if bus.exists() {
            env.push((
                "DBUS_SESSION_BUS_ADDRESS".into(),
                format!("unix:path={}", bus.display()),
            ));
        }
        let wayland = runtime.join("wayland-0");
        if std::env::var_os("WAYLAND_DISPLAY").is_none() && wayland.exists() {
            env.push(("WAYLAND_DISPLAY".into(), "wayland-0".into()));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_encoded_as_the_viewer_reads_them() {
        assert_eq!(
            percent_encode("http://127.0.0.1:8/a b~"),
            "http%3A%2F%2F127.0.0.1%3A8%2Fa%20b~"
        );
        assert_eq!(
            viewer_url("https://p.example", "http://127.0.0.1:8/s/1/a.json"),
            "https://p.example/from-url/http%3A%2F%2F127.0.0.1%3A8%2Fs%2F1%2Fa.json/"
        );
        let two = compare_url(
            "http://p",
            &[("http://h/1".into(), 0), ("http://h/2".into(), 3)],
        );
        assert_eq!(
            two,
            "http://p/compare/?profiles[]=http%3A%2F%2Fp%2Ffrom-url%2Fhttp%253A%252F%252Fh%252F1%2Fcalltree%2F%3Fthread%3D0\
             &profiles[]=http%3A%2F%2Fp%2Ffrom-url%2Fhttp%253A%252F%252Fh%252F2%2Fcalltree%2F%3Fthread%3D3"
        );
    }

    #[test]
    fn the_view_command_survives_a_shell() {
        assert_eq!(
            view_command(Path::new("out/p.json.gz")),
            "sampler view out/p.json.gz"
        );
        assert_eq!(
            view_command(Path::new("my run's.json")),
            "sampler view 'my run'\\''s.json'"
        );
    }

    #[test]
    fn served_names_are_plain_json_names() {
        assert_eq!(served_name(Path::new("/x/run 1.json.GZ")), "run_1.json");
        assert_eq!(served_name(Path::new("p.json")), "p.json");
        assert_eq!(served_name(Path::new("profile")), "profile.json");
        assert_eq!(served_name(Path::new("a/.hidden.gz")), "hidden.json");
    }

    #[test]
    fn the_profiler_url_is_an_http_address() {
        assert_eq!(
            profiler_url(Some("http://127.0.0.1:9/")).unwrap(),
            "http://127.0.0.1:9"
        );
        assert!(profiler_url(Some("file:///x")).is_err());
        assert!(profiler_url(Some("https://")).is_err());
        assert!(profiler_url(Some("https://a b")).is_err());
    }
}
