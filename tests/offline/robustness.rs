//! Bad input gets one clear line, never a panic or runaway memory: malformed profiles for
//! `report` and `convert`, a profile 30,000 frames deep, a gzip bomb and `/dev/zero`, an
//! ELF file whose compressed debug section lies about its size. No perf needed; each
//! case runs the real `sampler` binary and measures its peak memory.

// `wait4` is called directly for the child's peak memory (rusage), which std does not give.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sampler::emit::{self, Format};
use sampler::profile::Profile;

/// Memory no case may reach (peak resident set of the sampler process).
const MEMORY_BOUND_KB: u64 = 1 << 20;

fn dir() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/test-tmp")
        .join(format!("robust-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs sampler with `args`; its output and peak resident memory in KiB (from
/// `getrusage` of the waited-for child).
// The child is reaped by `wait4`, which clippy does not see.
#[allow(clippy::zombie_processes)]
fn sampler(args: &[&str]) -> (Output, u64) {
    let child = Command::new(env!("CARGO_BIN_EXE_sampler"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    // Reap it ourselves with wait4 to read its own rusage.
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes the status and the rusage into the locals given.
    let rc = unsafe { libc::wait4(pid.as_raw(), &mut status, 0, &mut usage) };
    assert_eq!(rc, pid.as_raw());
    let mut stderr = Vec::new();
    use std::io::Read;
    child.stderr.unwrap().read_to_end(&mut stderr).unwrap();
    let output = Output {
        status: std::os::unix::process::ExitStatusExt::from_raw(status),
        stdout: Vec::new(),
        stderr,
    };
    (output, usage.ru_maxrss as u64)
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A clean failure: exit 1 (not a panic's 101 or a signal), one error line naming the
/// file, bounded memory.
fn refused(args: &[&str], file: &Path, says: &str) {
    let (o, kb) = sampler(args);
    let err = text(&o);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: one line, not {err}");
    assert!(
        lines[0].contains(&file.display().to_string()) && lines[0].contains(says),
        "{args:?}: {err}"
    );
    assert!(kb < MEMORY_BOUND_KB, "{args:?}: {kb} KiB");
}

fn write_profile(p: &Profile, path: &Path) {
    emit::write(p, Format::Firefox, &Default::default(), path, None).unwrap();
}

fn seed_profile() -> Profile {
    Profile::from_named_stacks(&[
        &["main", "work", "hot"],
        &["main", "work", "cold"],
        &["main", "other"],
    ])
}

fn malformed_profiles_get_one_line_naming_the_file() {
    let d = dir();
    let good = d.join("good.json");
    write_profile(&seed_profile(), &good);
    let base: serde_json::Value = serde_json::from_slice(&std::fs::read(&good).unwrap()).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let cases: &[(&str, Edit, &str)] = &[
        (
            "index",
            |v| v["shared"]["stackTable"]["frame"][1] = 99.into(),
            "stackTable.frame[1] = 99 is not an index below",
        ),
        (
            "negative",
            |v| v["shared"]["frameTable"]["func"][0] = (-5).into(),
            "frameTable.func",
        ),
        (
            "length",
            |v| {
                v["shared"]["funcTable"]["name"]
                    .as_array_mut()
                    .unwrap()
                    .pop();
            },
            "funcTable.name has",
        ),
        (
            "forward-prefix",
            |v| v["shared"]["stackTable"]["prefixOffset"][0] = 3.into(),
            "stackTable.prefixOffset[0] = 3 is not an index below 1",
        ),
        (
            "string",
            |v| v["shared"]["funcTable"]["name"][0] = 1000.into(),
            "funcTable.name[0] = 1000",
        ),
        ("tid", |v| v["threads"][0]["tid"] = "١٢".into(), "tid"),
        (
            "sample",
            |v| v["threads"][0]["samples"]["stack"][0] = 4_000_000_000u64.into(),
            "samples.stack[0]",
        ),
        (
            "huge-length",
            |v| v["shared"]["stackTable"]["length"] = 1e300.into(),
            "length",
        ),
        (
            "version",
            |v| v["meta"]["preprocessedProfileVersion"] = 55.into(),
            "is 55, sampler reads version 70",
        ),
        (
            "missing-table",
            |v| {
                v["shared"].as_object_mut().unwrap().remove("frameTable");
            },
            "frameTable",
        ),
    ];
    for (name, edit, says) in cases {
        let mut v = base.clone();
        edit(&mut v);
        let file = d.join(format!("bad-{name}.json"));
        std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
        let f = file.display().to_string();
        refused(&["report", &f], &file, says);
        let out = d.join("out.folded").display().to_string();
        refused(&["convert", &f, "-o", &out], &file, says);
    }
    // Not JSON at all, and truncated JSON.
    let file = d.join("garbage.json");
    std::fs::write(&file, b"\x00\x01binary").unwrap();
    refused(
        &["report", &file.display().to_string()],
        &file,
        "not a JSON profile",
    );
    let whole = std::fs::read(&good).unwrap();
    std::fs::write(&file, &whole[..whole.len() / 2]).unwrap();
    refused(
        &["report", &file.display().to_string()],
        &file,
        "not valid JSON",
    );
}

fn a_profile_30000_frames_deep_is_reported_and_converted() {
    const DEPTH: usize = 30_000;
    let names: Vec<String> = (0..DEPTH)
        .map(|i| match i {
            0 => "main".to_string(),
            i if i + 1 == DEPTH => "bottom".to_string(),
            _ => "descend".to_string(),
        })
        .collect();
    let deep: Vec<&str> = names.iter().map(String::as_str).collect();
    let half = &deep[..DEPTH / 2];
    let file = dir().join("deep.json");
    write_profile(&Profile::from_named_stacks(&[&deep, &deep, half]), &file);
    let f = file.display().to_string();
    let (o, kb) = sampler(&["report", &f, "--min-percent", "0"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(kb < MEMORY_BOUND_KB, "{kb} KiB");
    // The tree, and the per-function view, as files to check.
    let report = |extra: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_sampler"))
            .args(["report", &f, "--width", "0"])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let tree = report(&[]);
    // Heading, thread line, column header, then one line per level of the deep path.
    assert_eq!(tree.lines().count(), 3 + DEPTH + 1, "{}", &tree[..300]);
    let last = tree.lines().rev().find(|l| l.contains("bottom")).unwrap();
    assert!(last.contains(&format!("[{DEPTH}]")), "{last}");
    assert!(
        last.trim_start().starts_with("2  66.7%        2  66.7%"),
        "{last}"
    );
    assert!(
        tree.lines().all(|l| l.chars().count() < 200),
        "guides stay short"
    );
    let inverted = report(&["--invert", "--depth", "2"]);
    assert!(inverted.contains("bottom"), "{inverted}");
    for format in ["folded", "speedscope", "pprof", "svg", "firefox"] {
        let out = dir().join(format!("deep.{format}"));
        let o = sampler(&[
            "convert",
            &f,
            "--format",
            format,
            "-o",
            &out.display().to_string(),
        ]);
        assert!(o.0.status.success(), "{format}: {}", text(&o.0));
        assert!(o.1 < MEMORY_BOUND_KB, "{format}: {} KiB", o.1);
    }
    let folded = std::fs::read_to_string(dir().join("deep.folded")).unwrap();
    assert_eq!(folded.lines().count(), 2);
    assert!(folded
        .lines()
        .any(|l| l.ends_with(" 2") && l.split(';').count() == DEPTH));
}

fn decompression_is_bounded() {
    use std::io::Write;
    let d = dir();
    // 4 GiB of 'A' inside a JSON string, gzipped to a few MB.
    let bomb = d.join("bomb.json.gz");
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&bomb).unwrap(),
        flate2::Compression::best(),
    );
    gz.write_all(b"{\"meta\": {\"x\": \"").unwrap();
    let chunk = vec![b'A'; 1 << 20];
    for _ in 0..4096 {
        gz.write_all(&chunk).unwrap();
    }
    gz.write_all(b"\"}}").unwrap();
    gz.finish().unwrap();
    let b = bomb.display().to_string();
    refused(&["report", &b], &bomb, "more than 256 MiB of JSON");
    refused(
        &["convert", &b, "-o", &d.join("x.svg").display().to_string()],
        &bomb,
        "more than 256 MiB",
    );
    let zero = Path::new("/dev/zero");
    refused(&["report", "/dev/zero"], zero, "not a JSON profile");
}

/// The file offset of the `ch_size` word of a compressed section's header.
fn compressed_size_offset(data: &[u8], section: &str) -> Option<usize> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(data).ok()?;
    let s = file.section_by_name(section)?;
    let (offset, _) = s.file_range()?;
    // Elf64_Chdr: ch_type (4), ch_reserved (4), ch_size (8), ch_addralign (8).
    Some(offset as usize + 8)
}

fn a_compressed_section_that_lies_about_its_size_is_refused() {
    let d = dir();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-targets/inline3.c");
    let bin = d.join("inline3-gz");
    let ok = Command::new("cc")
        .args(["-O2", "-g", "-gz=zlib", "-I"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-targets"))
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cc -gz=zlib");
    let mut data = std::fs::read(&bin).unwrap();
    let at = compressed_size_offset(&data, ".debug_info").expect("a compressed .debug_info");
    data[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let liar = d.join("inline3-liar");
    std::fs::write(&liar, &data).unwrap();
    let (o, kb) = sampler(&["symbolize", "-e", &liar.display().to_string(), "0x1000"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(kb < MEMORY_BOUND_KB, "{kb} KiB");
    assert!(
        text(&o).contains("says it holds 1099511627776 bytes"),
        "{}",
        text(&o)
    );
}

/// The tests of this module, for the offline binary's `main`.
pub fn tests() -> Vec<crate::common::Test> {
    crate::tests![
        malformed_profiles_get_one_line_naming_the_file;
        a_profile_30000_frames_deep_is_reported_and_converted;
        decompression_is_bounded;
        a_compressed_section_that_lies_about_its_size_is_refused;
    ]
}
