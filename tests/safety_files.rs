//! End-to-end: sampler never loses or hijacks a file. A run that fails to start creates,
//! truncates and deletes nothing; an output is replaced only by a complete file; as root
//! it writes through no symbolic link and over no other user's file; under sudo the
//! command runs as the user who ran sudo; the command line's mistakes are refused before
//! anything happens.

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

fn a_full_disk_keeps_the_old_file_and_leaves_nothing_partial() {
    let disk = SmallDisk::mount(8);
    let old = disk.0.join("out.json");
    std::fs::write(&old, b"the previous profile").unwrap();
    let before = snapshot(&disk.0);
    // Uncompressed, a 2,000-deep recursion's profile is larger than 8 KiB.
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&old)
        .args(["--", &target("deep"), "0.3"])
        .output()
        .unwrap();
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
    // The same for convert.
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
    let as_sudo = |out: &Path, uid: &str| {
        Command::new(sampler_bin())
            .args(["record", "-o"])
            .arg(out)
            .args(["--", "true"])
            .env("SUDO_UID", uid)
            .env("SUDO_GID", uid)
            .env("SUDO_USER", "nobody")
            .output()
            .unwrap()
    };
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
        a_full_disk_keeps_the_old_file_and_leaves_nothing_partial: Need::Perf, Need::Root;
        as_root_planted_links_and_other_users_files_are_refused: Need::Perf, Need::Root;
        under_sudo_the_command_runs_as_the_user_who_ran_it: Need::Perf, Need::Root;
        attaching_twice_or_to_a_thread_records_the_process_once: Need::Perf;
        new_files_that_killed_runs_left_are_removed;
    ]);
}
