//! End-to-end: sampler never loses or hijacks a file. A run that fails to start creates,
//! truncates and deletes nothing; an output is replaced only by a complete file; as root
//! it writes through no symbolic link and over no other user's file; under sudo the
//! command runs as the user who ran sudo; the command line's mistakes are refused before
//! anything happens.

#[path = "../common/mod.rs"]
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;

fn sampler(args: &[&str], dir: &Path) -> Output {
    Command::new(sampler_bin())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("sampler runs")
}

/// Every file in `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let bytes = std::fs::read(&p).unwrap_or_default();
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

fn failed_starts_touch_nothing() {
    let dir = tempdir();
    std::fs::write(dir.join("keep.json.gz"), b"a profile the user keeps").unwrap();
    std::fs::copy(target("split7030"), dir.join("myprog")).unwrap();
    let before = snapshot(&dir);
    let cases: &[(&[&str], &str)] = &[
        (
            &["record", "-p", "99999999", "-o", "keep.json.gz"],
            "no process with pid 99999999",
        ),
        (
            &["record", "-p", "2", "-o", "keep.json.gz"],
            "kernel thread",
        ),
        (
            &["record", "--bogus", "-o", "keep.json.gz", "--", "true"],
            "--bogus",
        ),
        (
            &["record", "-o", "keep.json.gz", "--", "/nonexistent/program"],
            "could not run `/nonexistent/program`: no such program",
        ),
        (
            &["record", "-o", "myprog", "--", "./myprog", "0.1"],
            "-o myprog is the program being profiled",
        ),
        (
            &["record", "-m", "3", "-o", "keep.json.gz", "--", "true"],
            "power of two",
        ),
        (
            &["record", "-p", "1", "-d", "1e20", "-o", "keep.json.gz"],
            "at most 2592000",
        ),
        (
            &[
                "record", "-o", "keep.svg", "--format", "pprof", "--", "true",
            ],
            "names a svg file, but --format says pprof",
        ),
        (
            &["convert", "nonexistent.json", "-o", "keep.json.gz"],
            "nonexistent.json",
        ),
        (
            &["record", "-o", "/dev/null", "--", "true"],
            "/dev/null is not a regular file",
        ),
    ];
    for (args, says) in cases {
        let o = sampler(args, &dir);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert_eq!(snapshot(&dir), before, "{args:?} changed a file");
    }
}

fn output_names_imply_their_format_in_any_case() {
    let dir = tempdir();
    let o = sampler(&["record", "-o", "P.SVG", "--", "true"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read_to_string(dir.join("P.SVG"))
        .unwrap()
        .contains("<svg"));
    let o = sampler(&["record", "-o", "P.JSON.GZ", "--", "true"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(dir.join("P.JSON.GZ")).unwrap();
    assert_eq!(bytes[..2], [0x1f, 0x8b], "gzipped");
}

fn commands_that_cannot_run_exit_as_a_shell_would() {
    let dir = tempdir();
    std::fs::write(dir.join("noexec"), "#!/bin/sh\n").unwrap();
    let o = sampler(
        &["record", "-o", "x.json", "--", "/nonexistent/program"],
        &dir,
    );
    assert_eq!(o.status.code(), Some(127), "{}", stderr(&o));
    let o = sampler(&["record", "-o", "x.json", "--", "./noexec"], &dir);
    assert_eq!(o.status.code(), Some(126), "{}", stderr(&o));
    let errors = stderr(&o);
    assert_eq!(errors.lines().count(), 1, "one line: {errors}");
    assert!(errors.contains("permission denied"), "{errors}");
    assert!(!dir.join("x.json").exists());
}

/// A tmpfs of `kib` KiB at a new directory, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(kib: u32) -> SmallDisk {
        let dir = tempdir().join("small");
        std::fs::create_dir(&dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs");
        SmallDisk(dir)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Runs `sampler record -o OUT -- CMD` with `TMPDIR` and `XDG_CACHE_HOME` set, so that
/// an output written elsewhere lands where the test looks (and cleans up).
fn record_with_fallbacks(out: &Path, tmpdir: &Path, cache: &Path, cmd: &[&str]) -> Output {
    Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(out)
        .arg("--")
        .args(cmd)
        .env("TMPDIR", tmpdir)
        .env("XDG_CACHE_HOME", cache)
        .output()
        .unwrap()
}

/// The one path that sampler's error line says the profile was written to instead.
fn written_instead(o: &Output) -> PathBuf {
    let err = stderr(o);
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "one error line: {err}");
    let path = errors[0]
        .split("the profile was written to ")
        .nth(1)
        .and_then(|rest| rest.strip_suffix(" instead"))
        .unwrap_or_else(|| panic!("no fallback named: {err}"));
    PathBuf::from(path)
}

fn a_full_disk_keeps_the_old_file_and_the_recording() {
    let disk = SmallDisk::mount(8);
    let old = disk.0.join("out.json");
    std::fs::write(&old, b"the previous profile").unwrap();
    let before = snapshot(&disk.0);
    let spare = tempdir();
    let cache = tempdir();
    // Uncompressed, a 2,000-deep recursion's profile is larger than 8 KiB.
    let o = record_with_fallbacks(&old, &spare, &cache, &[&target("deep"), "0.3"]);
    assert!(!o.status.success(), "the profile fitted: {}", stderr(&o));
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.contains("error"))
        .unwrap_or_default();
    assert!(
        line.contains(&format!("cannot write {}", old.display())) && line.contains("No space"),
        "{err}"
    );
    assert_eq!(
        snapshot(&disk.0),
        before,
        "the old file changed or a partial one is left"
    );
    // The recording is in the temporary directory, whole, and private.
    let saved = written_instead(&o);
    assert_eq!(saved.parent(), Some(spare.as_path()), "{err}");
    assert!(saved.to_string_lossy().ends_with("-out.json"), "{err}");
    assert_eq!(
        std::fs::metadata(&saved).unwrap().mode() & 0o777,
        0o600,
        "readable by its user only"
    );
    assert!(sample_count(&load_checked(&saved)) > 0);
    // With the temporary directory full too, it goes to the user's cache directory.
    let spare_disk = SmallDisk::mount(8);
    let o = record_with_fallbacks(&old, &spare_disk.0, &cache, &[&target("deep"), "0.3"]);
    assert!(!o.status.success());
    let saved = written_instead(&o);
    assert!(
        saved.starts_with(cache.join("sampler/unsaved")),
        "{}",
        stderr(&o)
    );
    assert!(sample_count(&load_checked(&saved)) > 0);
    assert_eq!(snapshot(&spare_disk.0), vec![], "nothing partial left");
    // The same for convert, whose input is still there: an error, nothing written.
    let (o, big) = record(&[], &[&target("deep"), "0.3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = Command::new(sampler_bin())
        .arg("convert")
        .arg(&big)
        .arg("-o")
        .arg(&old)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&format!("cannot write {}", old.display())),
        "{}",
        stderr(&o)
    );
    assert_eq!(snapshot(&disk.0), before);
}

fn a_file_system_made_read_only_keeps_the_recording() {
    let disk = SmallDisk::mount(4096);
    let out = disk.0.join("out.json.gz");
    let spare = tempdir();
    let cache = tempdir();
    let child = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&out)
        .args(["--", &target("split7030"), "1.5"])
        .env("TMPDIR", &spare)
        .env("XDG_CACHE_HOME", &cache)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Checked writable at the start, read-only by the end.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let ro = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&disk.0)
        .status()
        .unwrap();
    assert!(ro.success(), "remounting read-only");
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("Read-only file system"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
    let saved = written_instead(&o);
    assert_eq!(saved.parent(), Some(spare.as_path()));
    let p = load_checked(&saved);
    let hot: usize = thread_paths(&p)
        .iter()
        .flat_map(|t| &t.paths)
        .filter(|path| path.iter().any(|f| f == "hot_a"))
        .count();
    assert!(hot > 0, "the saved profile has split7030's samples");
}

/// `sampler record -o OUT -- true` as if run by `sudo` from user `uid`.
fn as_sudo(out: &Path, uid: &str) -> Output {
    Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(out)
        .args(["--", "true"])
        .env("SUDO_UID", uid)
        .env("SUDO_GID", uid)
        .env("SUDO_USER", "nobody")
        .output()
        .unwrap()
}

/// Under sudo the output is handed to the user who ran it: a directory they may not
/// write in is refused, even though root could write there.
fn under_sudo_an_output_where_the_user_may_not_write_is_refused() {
    let dir = tempdir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.join("theirs.json");
    let o = as_sudo(&out, "65534");
    assert!(!o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("user 65534 (who ran sudo) may not write in"),
        "{err}"
    );
    assert!(!out.exists());
    // A directory they own, or one open to all, is theirs to write in.
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let o = as_sudo(&out, "65534");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&out).unwrap().uid(), 65534);
}

fn as_root_planted_links_and_other_users_files_are_refused() {
    let dir = tempdir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let secret = dir.join("root-only");
    std::fs::write(&secret, b"root's data").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    // User nobody plants a link where root will write.
    let link = dir.join("out.json");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
    let o = as_sudo(&link, "65534");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is a symbolic link"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&secret).unwrap(), b"root's data");
    let meta = std::fs::metadata(&secret).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    // A file of another user than root and the one who ran sudo.
    let theirs = dir.join("theirs.json");
    std::fs::write(&theirs, b"nobody's").unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let o = as_sudo(&theirs, "1234");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("belongs to user 65534"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&theirs).unwrap(), b"nobody's");
    // The sudo user's own file is replaced, and the new one is theirs.
    let o = as_sudo(&theirs, "65534");
    assert!(o.status.success(), "{}", stderr(&o));
    let meta = std::fs::metadata(&theirs).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    load_checked(&theirs);
}

fn under_sudo_the_command_runs_as_the_user_who_ran_it() {
    let dir = tempdir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Theirs: under sudo, the output goes only where the user could have written it.
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let script = format!("id -u; id -g; exec {} 0.5", target("split7030"));
    let run = |keep_root: bool| {
        let out = dir.join(format!("sudo-{keep_root}.json"));
        let mut c = Command::new(sampler_bin());
        c.args(["record", "-o"]).arg(&out);
        if keep_root {
            c.arg("--keep-root");
        }
        let o = c
            .args(["--", "sh", "-c", &script])
            .env("SUDO_UID", "65534")
            .env("SUDO_GID", "65534")
            .env("SUDO_USER", "nobody")
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        (String::from_utf8_lossy(&o.stdout).into_owned(), o, out)
    };
    let (ids, o, out) = run(false);
    assert_eq!(ids, "65534\n65534\n", "{}", stderr(&o));
    // The recording keeps root's abilities: kernel frames, and the output is theirs.
    assert!(
        !stderr(&o).contains("kernel frames not permitted"),
        "{}",
        stderr(&o)
    );
    let n = sample_count(&load_checked(&out));
    assert!(n > 100, "{n} samples of the command run as nobody");
    assert_eq!(std::fs::metadata(&out).unwrap().uid(), 65534);
    let (ids, _, out) = run(true);
    assert_eq!(ids, "0\n0\n");
    assert!(sample_count(&load_checked(&out)) > 100);
}

fn attaching_twice_or_to_a_thread_records_the_process_once() {
    let target = Running::start("threads", &["30"]);
    let pid = target.0.id() as i32;
    let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|&t| t != pid)
        .expect("a thread besides main");
    let out = tempdir().join("once.json");
    let list = format!("{pid},{pid},{tid}");
    let o = Command::new(sampler_bin())
        .args(["record", "-d", "0.5", "-p", &list, "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("{tid} is a thread of process {pid}")),
        "{}",
        stderr(&o)
    );
    let p = load_checked(&out);
    let threads = thread_paths(&p);
    let pids: std::collections::BTreeSet<&str> = threads.iter().map(|t| t.pid.as_str()).collect();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let mut tids: Vec<i64> = threads.iter().map(|t| t.tid).collect();
    let all = tids.len();
    tids.dedup();
    assert_eq!(tids.len(), all, "a thread is in the profile twice");
}

fn convert_names_its_output_after_its_input_and_replaces_nothing() {
    let dir = tempdir();
    let (o, recorded) = record(&[], &[&target("split7030"), "0.3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::copy(&recorded, dir.join("a.json")).unwrap();
    // An unrelated profile of the default name, which convert once replaced.
    std::fs::write(dir.join("profile.json.gz"), b"another profile").unwrap();
    std::fs::write(dir.join("profile.folded"), b"other stacks 1\n").unwrap();
    let o = sampler(&["convert", "a.json", "-f", "folded"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("wrote a.folded"), "{}", stderr(&o));
    let folded = std::fs::read_to_string(dir.join("a.folded")).unwrap();
    assert!(folded.contains("hot_a"), "{folded}");
    assert_eq!(
        std::fs::read(dir.join("profile.folded")).unwrap(),
        b"other stacks 1\n"
    );
    assert_eq!(
        std::fs::read(dir.join("profile.json.gz")).unwrap(),
        b"another profile"
    );
    // The derived name exists now (and, for Firefox, is the input): refused, untouched.
    let o = sampler(&["convert", "a.json", "-o", "a.json.gz"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = snapshot(&dir);
    for (input, format) in [("a.json", "folded"), ("a.json.gz", "firefox")] {
        let o = sampler(&["convert", input, "-f", format], &dir);
        assert!(!o.status.success(), "{format}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("exists") && err.contains("give -o"), "{err}");
        assert_eq!(snapshot(&dir), before, "{format}");
    }
    // Named with -o, it is replaced.
    let o = sampler(&["convert", "a.json", "-o", "a.folded"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    // `-o -`: standard output.
    let o = sampler(&["convert", "a.json", "-f", "folded", "-o", "-"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), folded);
}

fn ring_buffers_too_small_for_one_sample_are_refused() {
    let dir = tempdir();
    let before = snapshot(&dir);
    // 16 KiB of stack with each hybrid sample: 1, 2 and 4 pages hold none, 8 do.
    for pages in ["1", "2", "4"] {
        let o = sampler(&["record", "-m", pages, "-o", "x.json", "--", "true"], &dir);
        assert!(!o.status.success(), "-m {pages}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("-m {pages} is too small to hold one sample"))
                && err.contains("give -m 8 or more"),
            "{err}"
        );
        assert_eq!(snapshot(&dir), before);
    }
    let o = sampler(
        &[
            "record", "--unwind", "dwarf", "-m", "4", "-o", "x.json", "--", "true",
        ],
        &dir,
    );
    assert!(stderr(&o).contains("give -m 8 or more"), "{}", stderr(&o));
    let (o, path) = record(&["-m", "8"], &[&target("split7030"), "0.3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(sample_count(&load_checked(&path)) > 0, "{}", stderr(&o));
    // Frame pointers copy 512 bytes: one page holds a sample.
    let (o, path) = record(
        &["--unwind", "fp", "-m", "1"],
        &[&target("split7030"), "0.3"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(sample_count(&load_checked(&path)) > 0, "{}", stderr(&o));
}

fn zombies_and_directories_are_called_what_they_are() {
    let dir = tempdir();
    // A child that exits and is never waited for stays a zombie while this test runs.
    let mut zombie = Command::new("true").spawn().unwrap();
    let pid = zombie.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| !s.contains(") Z "))
    {
        assert!(std::time::Instant::now() < deadline, "no zombie");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let o = sampler(&["record", "-p", &pid.to_string(), "-o", "x.json"], &dir);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "pid {pid} is a zombie (exited, not reaped by its parent, pid {})",
            std::process::id()
        )),
        "{err}"
    );
    zombie.wait().unwrap();
    let o = sampler(&["record", "-o", "x.json", "--", "/tmp"], &dir);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(126), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("could not run `/tmp`: is a directory, not a program"),
        "{err}"
    );
    assert!(!dir.join("x.json").exists());
}

/// The bytes `ctlnames` names its function with, in place of its placeholder of the
/// same length: ESC ] 0 ; … BEL sets a terminal's title, ESC [ 2 J clears its screen.
const CONTROL_NAME: &[u8] = b"ctl\x1b]0;pwned!!\x07\x1b[2J";
const PLACEHOLDER: &[u8] = b"ctl_name_XXXXXXXXXX";

/// Runs `args` on a terminal (`script` gives it one) and returns what it printed there.
fn on_a_terminal(args: &[&str]) -> Vec<u8> {
    let line: Vec<String> = std::iter::once(sampler_bin())
        .chain(args.iter().copied())
        .map(|a| format!("'{a}'"))
        .collect();
    let o = Command::new("script")
        .args(["-qec", &line.join(" "), "/dev/null"])
        .current_dir(tempdir())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    o.stdout
}

fn control_characters_in_names_never_reach_a_terminal() {
    assert_eq!(CONTROL_NAME.len(), PLACEHOLDER.len());
    let dir = tempdir();
    let mut program = std::fs::read(target("ctlnames")).unwrap();
    let mut patched = 0;
    while let Some(at) = program
        .windows(PLACEHOLDER.len())
        .position(|w| w == PLACEHOLDER)
    {
        program[at..at + CONTROL_NAME.len()].copy_from_slice(CONTROL_NAME);
        patched += 1;
    }
    assert!(patched >= 2, "symbol and debug names: {patched}");
    let exe = dir.join("ctlnames");
    std::fs::write(&exe, &program).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let profile = dir.join("p.json");
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&profile)
        .args(["--", exe.to_str().unwrap(), "0.5"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // The file keeps the names as the program chose them.
    let p = load_checked(&profile);
    let name = String::from_utf8(CONTROL_NAME.to_vec()).unwrap();
    let sampled = thread_paths(&p)
        .iter()
        .flat_map(|t| &t.paths)
        .filter(|path| path.last() == Some(&name))
        .count();
    assert!(sampled > 0, "the function is named as the program named it");
    let profile = profile.to_str().unwrap();
    let shown = [
        on_a_terminal(&["report", "--color", "never", profile]),
        on_a_terminal(&["report", "--color", "always", "--per-thread", profile]),
        on_a_terminal(&["convert", profile, "-f", "folded", "-o", "-"]),
    ];
    for screen in shown {
        let text = String::from_utf8_lossy(&screen);
        assert!(
            !screen.contains(&0x07),
            "a BEL reached the terminal: {text:?}"
        );
        assert!(
            !screen.windows(2).any(|w| w == b"\x1b]"),
            "a title sequence reached the terminal: {text:?}"
        );
        assert!(
            !screen.windows(4).any(|w| w == b"\x1b[2J"),
            "a clear-screen sequence reached the terminal: {text:?}"
        );
        // (Folded stacks write a name's `;` as `:`.)
        assert!(
            text.contains("ctl\\x1b]0;pwned!!\\x07\\x1b[2J")
                || text.contains("ctl\\x1b]0:pwned!!\\x07\\x1b[2J"),
            "{text:?}"
        );
    }
    // In a pipe, a folded conversion keeps the names as they are, for the tools after it.
    let o = sampler(&["convert", profile, "-f", "folded", "-o", "-"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let folded_name: Vec<u8> = CONTROL_NAME
        .iter()
        .map(|&b| if b == b';' { b':' } else { b })
        .collect();
    assert!(o
        .stdout
        .windows(folded_name.len())
        .any(|w| w == folded_name));
}

/// A copy at `to` of the ELF file `from` whose `.debug_info` header says it has `size`
/// bytes, made a sparse file of that length: it stores what `from` does, and its
/// length covers the lie. Executable by anyone.
fn lying_copy(from: &Path, to: &Path, size: u64) {
    use object::{Object, ObjectSection};
    let mut data = std::fs::read(from).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let section = file.section_by_name(".debug_info").expect(".debug_info");
    let (offset, _) = section.file_range().unwrap();
    let index = section.index().0 as u64;
    // Elf64_Ehdr's e_shoff; sh_size is the sixth field (at 32) of a 64-byte Elf64_Shdr.
    let table = u64::from_le_bytes(data[0x28..0x30].try_into().unwrap());
    let at = (table + index * 64 + 32) as usize;
    data[at..at + 8].copy_from_slice(&size.to_le_bytes());
    std::fs::write(to, &data).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(to).unwrap();
    f.set_len(offset + size).unwrap();
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The largest peak resident set, in KiB, of the children this test program has waited
/// for (one test runs at a time): an upper bound on the last one's.
fn children_peak_kib() -> u64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN).unwrap().max_rss() as u64
}

/// What no run on a lying file may reach: 1 GiB resident.
const LIAR_MEMORY_KIB: u64 = 1 << 20;

/// Lies of 64 GiB (past any section's cap) and 2 GiB (within it, but holes).
const LIES: [(&str, u64); 2] = [("liar64g", 64 << 30), ("liar2g", 2 << 30)];

fn a_file_whose_section_lies_about_its_size_is_refused_by_symbolize() {
    let dir = tempdir();
    let (name, size) = LIES[1];
    let liar = dir.join(name);
    lying_copy(Path::new(&target("split7030")), &liar, size);
    let started = std::time::Instant::now();
    let o = sampler(
        &[
            "symbolize",
            "--no-cache",
            "-e",
            &liar.display().to_string(),
            "0x1000",
        ],
        &dir,
    );
    let took = started.elapsed();
    let kib = children_peak_kib();
    let err = stderr(&o);
    eprintln!("symbolize {name}: {took:?}, at most {kib} KiB: {err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains(&liar.display().to_string()) && lines[0].contains("a sparse file"),
        "{err}"
    );
    assert!(kib < LIAR_MEMORY_KIB, "{kib} KiB");
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn as_root_recording_the_machine_survives_another_users_lying_files() {
    let dir = tempdir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let liars: Vec<Running> = LIES
        .iter()
        .map(|&(name, size)| {
            let liar = dir.join(name);
            lying_copy(Path::new(&target("split7030")), &liar, size);
            let child = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(&liar)
                .arg("4")
                .stdout(Stdio::null())
                .spawn()
                .expect("setpriv runs");
            Running(child)
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = dir.join("machine.json");
    let o = sampler(
        &["record", "-a", "-d", "2", "-o", &out.display().to_string()],
        &dir,
    );
    let kib = children_peak_kib();
    drop(liars);
    let err = stderr(&o);
    eprintln!("record -a beside lying files: at most {kib} KiB");
    assert!(o.status.success(), "{err}");
    for (name, _) in LIES {
        let said: Vec<&str> = err
            .lines()
            .filter(|l| l.contains(name) && l.contains("not read: its section .debug_info"))
            .collect();
        assert_eq!(said.len(), 1, "one line on {name}: {err}");
    }
    assert!(kib < LIAR_MEMORY_KIB, "{kib} KiB");
    load_checked(&out);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A JIT bench target running for a while, as user nobody or as root; its perf map.
fn jit_process(as_nobody: bool) -> (Running, PathBuf) {
    let mut c = Command::new("setpriv");
    if as_nobody {
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
    }
    let child = c
        .args([&target("jit"), "8"])
        .stdout(Stdio::null())
        .spawn()
        .expect("setpriv runs");
    let map = PathBuf::from(format!("/tmp/perf-{}.map", child.id()));
    (Running(child), map)
}

fn as_root_planted_perf_maps_are_ignored() {
    // Two of nobody's JIT processes whose maps become one 1 GiB file (sparse) with two
    // names; a third of theirs keeps its own map; root's JIT process gets a map nobody
    // owns.
    let jits: Vec<(Running, PathBuf)> = [true, true, true, false]
        .into_iter()
        .map(jit_process)
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let big = PathBuf::from(format!("/tmp/sampler-test-{}-big.map", std::process::id()));
    std::fs::File::create(&big)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    std::os::unix::fs::chown(&big, Some(65534), Some(65534)).unwrap();
    for (_, map) in &jits[..2] {
        std::fs::remove_file(map).unwrap();
        std::fs::hard_link(&big, map).unwrap();
    }
    std::fs::remove_file(&big).unwrap();
    std::os::unix::fs::chown(&jits[3].1, Some(65534), Some(65534)).unwrap();
    let dir = tempdir();
    let out = dir.join("jits.json");
    let o = sampler(
        &["record", "-a", "-d", "2", "-o", &out.display().to_string()],
        &dir,
    );
    let kib = children_peak_kib();
    let pids: Vec<String> = jits.iter().map(|(r, _)| r.pid()).collect();
    for (running, map) in jits {
        drop(running);
        let _ = std::fs::remove_file(map);
    }
    let err = stderr(&o);
    eprintln!("record -a beside planted perf maps: at most {kib} KiB");
    assert!(o.status.success(), "{err}");
    let ignored = |pid: &str, why: &str| {
        let said = format!("/tmp/perf-{pid}.map is ignored: {why}");
        assert!(err.contains(&said), "{said}: {err}");
    };
    ignored(&pids[0], "it has 2 names (hard links), not one");
    ignored(&pids[1], "it has 2 names (hard links), not one");
    ignored(
        &pids[3],
        "it belongs to user 65534, not to its process's user 0 or root",
    );
    let p = load_checked(&out);
    let named: Vec<bool> = pids
        .iter()
        .map(|pid| {
            thread_frames(&p)
                .iter()
                .filter(|(t, _)| &t.pid == pid)
                .flat_map(|(_, stacks)| stacks.iter().flatten())
                .any(|f| f.name == "jit_hot_a")
        })
        .collect();
    assert_eq!(named, [false, false, true, false], "{err}");
    assert!(kib < LIAR_MEMORY_KIB, "{kib} KiB");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A pid that no process has now: that of a child that has exited and been reaped.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// The new file a run killed while writing `out` (SIGKILL) left beside it is removed by
/// the next run that writes `out`; not those of a run still going (its pid lives), of
/// another output, or of another user.
fn new_files_that_killed_runs_left_are_removed() {
    let dir = tempdir();
    let out = dir.join("out.json");
    let dead = dead_pid();
    let left = |name: &str, pid: u32| {
        let path = dir.join(format!(".{name}.sampler-{pid}-0"));
        std::fs::write(&path, b"half a profile").unwrap();
        path
    };
    let killed = left("out.json", dead);
    let killed_again = dir.join(format!(".out.json.sampler-{dead}-1"));
    std::fs::write(&killed_again, b"half a profile").unwrap();
    let running = left("out.json", std::process::id());
    let other_output = left("other.json", dead);
    let others = dir.join(format!(".out.json.sampler-{dead}-7"));
    std::fs::write(&others, b"another user's").unwrap();
    let root = nix::unistd::Uid::effective().is_root();
    if root {
        std::os::unix::fs::chown(&others, Some(65534), Some(65534)).unwrap();
    }
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/rich.firefox.json");
    let o = sampler(
        &["convert", golden.to_str().unwrap(), "-o", "out.json"],
        &dir,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.exists());
    assert!(!killed.exists(), "{} is left", killed.display());
    assert!(!killed_again.exists(), "{} is left", killed_again.display());
    assert!(running.exists(), "a live run's new file was removed");
    assert!(other_output.exists(), "another output's was removed");
    assert_eq!(others.exists(), root, "another user's was removed");
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    run_tests(tests![
        failed_starts_touch_nothing: Need::Perf;
        commands_that_cannot_run_exit_as_a_shell_would: Need::Perf;
        output_names_imply_their_format_in_any_case: Need::Perf;
        a_full_disk_keeps_the_old_file_and_the_recording: Need::Perf, Need::Root;
        a_file_system_made_read_only_keeps_the_recording: Need::Perf, Need::Root;
        under_sudo_an_output_where_the_user_may_not_write_is_refused: Need::Perf, Need::Root;
        convert_names_its_output_after_its_input_and_replaces_nothing: Need::Perf;
        ring_buffers_too_small_for_one_sample_are_refused: Need::Perf;
        zombies_and_directories_are_called_what_they_are: Need::Perf;
        control_characters_in_names_never_reach_a_terminal: Need::Perf, Need::Program("script", &["--version"]);
        as_root_planted_links_and_other_users_files_are_refused: Need::Perf, Need::Root;
        under_sudo_the_command_runs_as_the_user_who_ran_it: Need::Perf, Need::Root;
        attaching_twice_or_to_a_thread_records_the_process_once: Need::Perf;
        a_file_whose_section_lies_about_its_size_is_refused_by_symbolize;
        as_root_recording_the_machine_survives_another_users_lying_files: Need::Perf, Need::Root;
        as_root_planted_perf_maps_are_ignored: Need::Perf, Need::Root;
        new_files_that_killed_runs_left_are_removed;
    ]);
}
