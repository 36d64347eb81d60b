//! End-to-end (issue 27): every Firefox profile carries the text of the source files its
//! sampled functions name, read with the rights of the user who asked for it, and a CPU
//! graph (each sample's `threadCPUDelta`).
//!
//! The programs are compiled here from copies of `bench-targets/split7030.c`, so that the
//! tests decide who may read the source file the debug information names.

#[path = "../common/mod.rs"]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// A copy of split7030 built in its own directory, with `mode` on its `.c` file: the
/// directory, the program and the path the debug information names for the source.
fn build_split7030(mode: u32) -> (PathBuf, PathBuf, String) {
    let dir = tempdir();
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-targets");
    for file in ["split7030.c", "now.h", "work.h"] {
        std::fs::copy(bench.join(file), dir.join(file)).unwrap();
    }
    let source = dir.join("split7030.c");
    let program = dir.join("split7030");
    let status = Command::new("cc")
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&program)
        .arg(&source)
        .status()
        .unwrap();
    assert!(status.success(), "cc split7030.c");
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(mode)).unwrap();
    (dir, program, source.display().to_string())
}

/// The embedded text of each source file of `p`, by name (`None`: named, not embedded).
fn source_texts(p: &Value) -> Vec<(String, Option<String>)> {
    let strings = p["shared"]["stringArray"].as_array().unwrap();
    let sources = &p["shared"]["sources"];
    let names = sources["filename"].as_array().unwrap();
    let texts = sources["content"].as_array().unwrap();
    names
        .iter()
        .zip(texts)
        .map(|(n, t)| {
            let name = strings[n.as_u64().unwrap() as usize].as_str().unwrap();
            (name.to_string(), t.as_str().map(str::to_string))
        })
        .collect()
}

fn text_of(p: &Value, file: &str) -> Option<String> {
    let texts = source_texts(p);
    let (_, text) = texts
        .iter()
        .find(|(name, _)| name == file)
        .unwrap_or_else(|| panic!("{file} is not among the sources: {texts:?}"));
    text.clone()
}

fn record_to(
    out: &Path,
    extra: &[&str],
    program: &Path,
    env: &[(&str, &str)],
) -> std::process::Output {
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(out)
        .args(extra)
        .arg("--")
        .arg(program)
        .arg("0.5")
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .env_remove("SUDO_USER")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    ffp_check(out);
    o
}

fn sources_of_the_sampled_functions_are_in_the_file_and_the_viewer_loads_it() {
    let (dir, program, source) = build_split7030(0o644);
    let out = dir.join("p.json");
    record_to(&out, &[], &program, &[]);
    let p = load(&out);
    let want = std::fs::read_to_string(&source).unwrap();
    assert_eq!(text_of(&p, &source).as_deref(), Some(want.as_str()));
    let work_h = dir.join("work.h").display().to_string();
    assert!(text_of(&p, &work_h).is_some_and(|t| t.contains("sum_to")));
    // libc's sources are named relative to where libc was built: not on this machine.
    for (name, text) in source_texts(&p) {
        assert!(name.starts_with('/') || text.is_none(), "{name} embedded");
    }
    // --no-sources: the files are named, nothing is embedded.
    let bare = dir.join("bare.json");
    record_to(&bare, &["--no-sources"], &program, &[]);
    let p = load(&bare);
    assert!(source_texts(&p).iter().all(|(_, t)| t.is_none()));
    let (with, without) = (
        std::fs::metadata(&out).unwrap(),
        std::fs::metadata(&bare).unwrap(),
    );
    eprintln!(
        "with sources {} bytes, without {}",
        with.len(),
        without.len()
    );
    std::fs::remove_dir_all(dir).unwrap();
}

fn as_root_without_sudo_only_files_every_user_may_read_are_embedded() {
    let (dir, program, source) = build_split7030(0o600);
    let out = dir.join("p.json");
    record_to(&out, &[], &program, &[]);
    let p = load(&out);
    assert_eq!(
        text_of(&p, &source),
        None,
        "a 0600 file of root's was embedded"
    );
    let work_h = dir.join("work.h").display().to_string();
    assert!(text_of(&p, &work_h).is_some(), "work.h (0644) is embedded");
    std::fs::remove_dir_all(dir).unwrap();
}

fn under_sudo_sources_are_read_as_the_invoking_user() {
    let (dir, program, source) = build_split7030(0o600);
    // The output where nobody (the "invoking user") may write.
    let outdir = dir.join("out");
    std::fs::create_dir(&outdir).unwrap();
    nix::unistd::chown(&outdir, Some(65534.into()), Some(65534.into())).unwrap();
    let sudo = [("SUDO_UID", "65534"), ("SUDO_GID", "65534")];
    let out = outdir.join("p.json");
    record_to(&out, &[], &program, &sudo);
    let p = load(&out);
    assert_eq!(
        text_of(&p, &source),
        None,
        "nobody cannot read the 0600 file"
    );
    let work_h = dir.join("work.h").display().to_string();
    assert!(text_of(&p, &work_h).is_some(), "nobody reads work.h (0644)");
    // Readable by all: embedded, as nobody read it.
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = outdir.join("q.json");
    record_to(&out, &[], &program, &sudo);
    let p = load(&out);
    assert!(text_of(&p, &source).is_some_and(|t| t.contains("hot_a")));
    std::fs::remove_dir_all(dir).unwrap();
}

fn every_recording_has_a_cpu_graph() {
    let (dir, program, _) = build_split7030(0o644);
    let out = dir.join("p.json");
    let o = record_to(&out, &[], &program, &[]);
    let p = load(&out);
    assert_eq!(p["meta"]["sampleUnits"]["threadCPUDelta"], "ns");
    let samples = &p["threads"][0]["samples"];
    let deltas: Vec<u64> = samples["threadCPUDelta"]
        .as_array()
        .expect("threadCPUDelta in an on-CPU recording")
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect();
    assert_eq!(deltas.len(), samples["length"].as_u64().unwrap() as usize);
    // Every sample stands for one period of the thread's CPU (the first is not read).
    let period_ns = (p["meta"]["interval"].as_f64().unwrap() * 1e6).round() as u64;
    assert!(
        deltas[1..].iter().all(|&d| d == period_ns),
        "{period_ns}: {deltas:?}"
    );
    let graph_ms = deltas.iter().sum::<u64>() as f64 / 1e6;
    let cpu_ms = command_cpu_ms(&o);
    eprintln!("CPU graph {graph_ms:.0} ms, the command's CPU {cpu_ms:.0} ms");
    assert!(graph_ms >= 0.9 * cpu_ms && graph_ms <= 1.15 * cpu_ms + 20.0);
    // Page faults say nothing of CPU time: no graph from them.
    let faults = dir.join("faults.json");
    record_to(&faults, &["-e", "page-faults", "-c", "1"], &program, &[]);
    let p = load(&faults);
    assert!(p["threads"][0]["samples"].get("threadCPUDelta").is_none());
    std::fs::remove_dir_all(dir).unwrap();
}

fn main() {
    run_tests(tests![
        sources_of_the_sampled_functions_are_in_the_file_and_the_viewer_loads_it: Need::Perf;
        as_root_without_sudo_only_files_every_user_may_read_are_embedded: Need::Perf, Need::Root;
        under_sudo_sources_are_read_as_the_invoking_user: Need::Perf, Need::Root;
        every_recording_has_a_cpu_graph: Need::Perf;
    ]);
}
