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

fn main() {
    run_tests(tests![
        failed_starts_touch_nothing: Need::Perf;
        commands_that_cannot_run_exit_as_a_shell_would: Need::Perf;
        output_names_imply_their_format_in_any_case: Need::Perf;
        a_full_disk_keeps_the_old_file_and_leaves_nothing_partial: Need::Perf, Need::Root;
        as_root_planted_links_and_other_users_files_are_refused: Need::Perf, Need::Root;
        under_sudo_the_command_runs_as_the_user_who_ran_it: Need::Perf, Need::Root;
        attaching_twice_or_to_a_thread_records_the_process_once: Need::Perf;
        a_file_whose_section_lies_about_its_size_is_refused_by_symbolize;
        as_root_recording_the_machine_survives_another_users_lying_files: Need::Perf, Need::Root;
        as_root_planted_perf_maps_are_ignored: Need::Perf, Need::Root;
    ]);
}
