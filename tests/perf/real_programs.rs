//! End-to-end stacks of real programs that nobody here wrote: CPython 3.12 with its perf
//! trampolines (`-X perf`: JIT code with neither CFI nor frame pointers), node with its
//! perf map and its JIT dump, a `make -j2` of a generated C project (many short
//! processes, the loader, gcc's deep recursions), and where stacks end: every complete
//! stack has one of the roots a Linux thread starts in, and no complete stack is marked
//! `[truncated]`.

#[path = "../common/mod.rs"]
mod common;

use std::process::Command;

use common::*;

/// The functions a thread's first frame is in: a program's or the loader's entry stub
/// (whose second part, after the call to `_dl_start`, the loader names
/// `_dl_start_user`), and glibc's thread start.
const ROOTS: [&str; 5] = ["_start", "_dl_start_user", "__clone3", "clone3", "clone"];

/// CPython 3.12 (pyenv's, or on the PATH): the first with perf trampoline support.
fn python312() -> Option<String> {
    python("3.12", "perf")
}

/// CPython 3.13, which writes a JIT dump with CFI for its trampolines (`-X perf_jit`).
fn python313() -> Option<String> {
    python("3.13", "perf_jit")
}

/// A CPython `version` (pyenv's, or on the PATH) that runs with `-X option`.
fn python(version: &str, option: &str) -> Option<String> {
    let pyenv = std::env::var("HOME")
        .ok()
        .map(|h| format!("{h}/.pyenv/versions"));
    let mut found: Vec<String> = pyenv
        .and_then(|dir| std::fs::read_dir(dir).ok())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(version))
        .map(|e| {
            let bin = e.path().join(format!("bin/python{version}"));
            bin.to_string_lossy().into_owned()
        })
        .collect();
    found.sort();
    found.push(format!("python{version}"));
    found.into_iter().find(|p| {
        let probe = Command::new(p)
            .args([
                "-X",
                option,
                "-c",
                "import sys; assert sys.is_stack_trampoline_active()",
            ])
            .current_dir(tempdir())
            .spawn();
        let Ok(probe) = probe else {
            return false;
        };
        // The probe writes a perf map (or a JIT dump in its directory) as it starts.
        let pid = probe.id();
        let ok = probe.wait_with_output().is_ok_and(|o| o.status.success());
        let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
        let _ = std::fs::remove_file(format!("/tmp/jit-{pid}.dump"));
        ok
    })
}

/// The percentage of `paths` that start at one of [`ROOTS`].
fn rooted_share(paths: &[Vec<String>]) -> f64 {
    let n = paths
        .iter()
        .filter(|p| p.first().is_some_and(|f| ROOTS.contains(&f.as_str())))
        .count();
    100.0 * n as f64 / paths.len().max(1) as f64
}

/// What [`assert_roots_honest`] found among the stacks marked `[truncated]`.
struct Marked {
    /// Their percentage of all stacks.
    share: f64,
    /// How many of them have neither known cause: a thread in its first instructions,
    /// or a thread sampled as it exits.
    unexplained: usize,
}

/// Asserts that no stack marked `[truncated]` is complete: its outermost frame is not a
/// root; and that every unmarked stack starts at a root.
fn assert_roots_honest(test: &str, paths: &[Vec<String>]) -> Marked {
    let mut marked = 0;
    let mut unexplained = 0;
    for p in paths {
        if p[0] == "[truncated]" {
            marked += 1;
            let outermost = p.get(1).map_or("", String::as_str);
            // A thread sampled in its first instructions, where `clone3`'s child path
            // has no CFI yet, is one frame the unwinder cannot prove outermost: per-CPU
            // sampling (root) catches a few of those in a build. Known, and marked.
            let first_instructions = p.len() >= 2
                && outermost == "__clone3"
                && p.get(2).is_none_or(|f| f.starts_with("[kernel] "));
            // A thread sampled in the kernel as its process exits, after its memory is
            // released: the kernel's chain alone, through do_exit.
            let exiting = p[1..].iter().all(|f| f.starts_with("[kernel] "))
                && p.iter().any(|f| f == "[kernel] do_exit");
            assert!(
                !ROOTS.contains(&outermost) || first_instructions,
                "{test}: a complete stack is marked truncated: {p:?}"
            );
            if !first_instructions && !exiting {
                eprintln!("{test}: marked for another reason: {p:?}");
                unexplained += 1;
            }
        } else {
            assert!(
                ROOTS.contains(&p[0].as_str()),
                "{test}: an unmarked stack starts at {:?}: {p:?}",
                p[0]
            );
        }
    }
    Marked {
        share: 100.0 * marked as f64 / paths.len().max(1) as f64,
        unexplained,
    }
}

/// A CPU-bound script whose three functions do 60, 30 and 10% of its work. Every
/// iteration costs the same: the values stay below 2^16, one-digit Python ints (`s +=
/// i * i` grew past 2^30 in the longest loop only, whose iterations then cost more: it
/// took 60.4–65.4% of the samples).
const PY_WORK: &str = r#"
import sys, time

def spin(n):
    s = 0
    for i in range(n):
        s ^= i
    return s

def sixty():
    return spin(60000)

def thirty():
    return spin(30000)

def ten():
    return spin(10000)

def main(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sixty()
        thirty()
        ten()

main(float(sys.argv[1]))
"#;

fn python_perf_trampolines_unwind_to_main_with_shares() {
    let test = "python_perf_trampolines_unwind_to_main_with_shares";
    let python = python312().unwrap();
    let script = tempdir().join("work.py");
    std::fs::write(&script, PY_WORK).unwrap();
    let (o, path) = record(&[], &[&python, "-X", "perf", script.to_str().unwrap(), "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    remove_perf_maps(&load(&path));
    let paths = all_paths(&path);
    let reach = rooted_share(&paths);
    let under_main: Vec<&Vec<String>> = paths
        .iter()
        .filter(|p| p.iter().any(|f| f.starts_with("py::main:")))
        .collect();
    let main_share = 100.0 * under_main.len() as f64 / paths.len().max(1) as f64;
    let share = |function: &str| {
        let prefix = format!("py::{function}:");
        let n = under_main
            .iter()
            .filter(|p| {
                // The Python caller above the callee: main, then the function, then spin.
                let at = |name: &str| p.iter().position(|f| f.starts_with(name));
                matches!(
                    (at("py::main:"), at(&prefix), at("py::spin:")),
                    (Some(m), Some(f), Some(s)) if m < f && f < s
                )
            })
            .count();
        100.0 * n as f64 / under_main.len().max(1) as f64
    };
    let (sixty, thirty, ten) = (share("sixty"), share("thirty"), share("ten"));
    eprintln!(
        "{test}: {} samples, {reach:.1}% reach _start, {main_share:.1}% under py::main; sixty {sixty:.1}%, thirty {thirty:.1}%, ten {ten:.1}%",
        paths.len()
    );
    assert!(paths.len() > 1500, "{} samples", paths.len());
    assert!(reach >= 95.0, "{reach:.1}% of stacks reach _start");
    assert!(main_share >= 95.0, "{main_share:.1}% under py::main");
    for (got, want) in [(sixty, 60.0), (thirty, 30.0), (ten, 10.0)] {
        assert!(
            (got - want).abs() <= 3.0,
            "{got:.1}% where {want}% was expected"
        );
    }
}

fn python_jit_dump_with_cfi_names_and_unwinds() {
    let test = "python_jit_dump_with_cfi_names_and_unwinds";
    let python = python313().unwrap();
    let dir = tempdir();
    let script = dir.join("work.py");
    std::fs::write(&script, PY_WORK).unwrap();
    let out = dir.join("profile.json");
    let o = Command::new(sampler_bin())
        .args(["record", "-o"])
        .arg(&out)
        .args([
            "--",
            &python,
            "-X",
            "perf_jit",
            script.to_str().unwrap(),
            "2",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{test}: {}", stderr(&o));
    remove_perf_maps(&load(&out));
    let paths = all_paths(&out);
    let reach = rooted_share(&paths);
    let named = paths
        .iter()
        .filter(|p| p.iter().any(|f| f.starts_with("py::sixty:")))
        .count();
    eprintln!(
        "{test}: {} samples, {reach:.1}% reach _start, {named} through py::sixty",
        paths.len()
    );
    assert!(reach >= 95.0, "{reach:.1}%");
    assert!(
        named * 3 > paths.len(),
        "py::sixty named from the dump in {named}"
    );
}

/// A CPU-bound script: `spin` is hot enough for V8 to optimize it.
const JS_WORK: &str = r#"
function spin(n) { let s = 0; for (let i = 0; i < n; i++) { s += Math.sqrt(i) * (i & 7); } return s; }
function main(seconds) {
  const end = Date.now() + seconds * 1000;
  let t = 0;
  while (Date.now() < end) { t += spin(600000); }
  return t;
}
main(Number(process.argv[2]));
"#;

/// Records node running [`JS_WORK`] with `flag`, in a directory of its own (where a JIT
/// dump is written): the paths and the frames' libraries of the JIT frames.
fn record_node(test: &str, flag: &str) -> (Vec<Vec<String>>, Vec<String>, std::path::PathBuf) {
    let dir = tempdir();
    let script = dir.join("work.js");
    std::fs::write(&script, JS_WORK).unwrap();
    let out = dir.join("profile.json");
    let o = Command::new(sampler_bin())
        .current_dir(&dir)
        .args(["record", "-o"])
        .arg(&out)
        .args(["--", "node", flag])
        .arg(&script)
        .arg("2")
        .output()
        .unwrap();
    assert!(o.status.success(), "{test}: {}", stderr(&o));
    let profile = load_checked(&out);
    remove_perf_maps(&profile);
    let mut spin_libs = Vec::new();
    let mut paths = Vec::new();
    for (t, frames) in thread_frames(&profile) {
        paths.extend(t.paths);
        for stack in frames {
            spin_libs.extend(
                stack
                    .iter()
                    .filter(|f| f.name.contains("spin") && f.name.contains("work.js"))
                    .map(|f| f.lib.clone().unwrap_or_default()),
            );
        }
    }
    (paths, spin_libs, dir)
}

fn node_perf_basic_prof_stacks_are_complete_and_named() {
    let test = "node_perf_basic_prof_stacks_are_complete_and_named";
    let (paths, spin_libs, _) = record_node(test, "--perf-basic-prof");
    let reach = rooted_share(&paths);
    eprintln!(
        "{test}: {} samples, {reach:.1}% reach a root, {} frames in the JIT's spin",
        paths.len(),
        spin_libs.len()
    );
    assert!(reach >= 95.0, "{reach:.1}%");
    assert!(
        spin_libs.len() * 2 > paths.len(),
        "spin named in too few samples"
    );
    assert!(
        spin_libs.iter().all(|l| l.starts_with("perf-")),
        "{spin_libs:?}"
    );
}

fn node_jit_dump_names_the_code() {
    let test = "node_jit_dump_names_the_code";
    let (paths, spin_libs, dir) = record_node(test, "--perf-prof");
    let dumps: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("jit-"))
        .collect();
    let reach = rooted_share(&paths);
    eprintln!(
        "{test}: {} samples, {reach:.1}% reach a root, {} frames in the JIT's spin, named from {:?}",
        paths.len(),
        spin_libs.len(),
        dumps.iter().map(|d| d.file_name()).collect::<Vec<_>>()
    );
    assert_eq!(dumps.len(), 1, "node wrote one JIT dump");
    // No perf map was written: the names come from the dump alone.
    let pid = dumps[0].file_name().to_string_lossy()[4..]
        .trim_end_matches(".dump")
        .to_string();
    assert!(!std::path::Path::new(&format!("/tmp/perf-{pid}.map")).exists());
    assert!(
        spin_libs.len() * 2 > paths.len(),
        "spin named in too few samples"
    );
    assert!(reach >= 95.0, "{reach:.1}%");
}

fn make_j2_every_process_and_honest_roots() {
    let test = "make_j2_every_process_and_honest_roots";
    let dir = tempdir();
    let files = 12;
    let mut main = String::new();
    for i in 0..files {
        let mut c = String::new();
        for j in 0..40 {
            c.push_str(&format!(
                "static int g{j}(int x) {{ int a[16]; for (int k = 0; k < 16; k++) a[k] = x * k + {j}; int s = 0; for (int k = 0; k < 16; k++) s += a[k] * (k ^ {j}); return s; }}\n"
            ));
        }
        let calls: Vec<String> = (0..40).map(|j| format!("g{j}(x)")).collect();
        c.push_str(&format!(
            "int f{i}(int x) {{ return {}; }}\n",
            calls.join(" + ")
        ));
        std::fs::write(dir.join(format!("f{i}.c")), c).unwrap();
        main.push_str(&format!("int f{i}(int);\n"));
    }
    let calls: Vec<String> = (0..files).map(|i| format!("s += f{i}(s);")).collect();
    main.push_str(&format!(
        "int main(void) {{ int s = 0; {} return s & 1; }}\n",
        calls.join(" ")
    ));
    std::fs::write(dir.join("main.c"), main).unwrap();
    let objects: Vec<String> = (0..files).map(|i| format!("f{i}.o")).collect();
    std::fs::write(
        dir.join("Makefile"),
        format!(
            "prog: main.o {}\n\tcc -o $@ $^\n%.o: %.c\n\tcc -O2 -c $<\n",
            objects.join(" ")
        ),
    )
    .unwrap();
    let (o, path) = record(&[], &["make", "-s", "-j2", "-C", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.join("prog").exists());
    let threads = thread_paths(&load_checked(&path));
    let names: std::collections::BTreeSet<String> =
        threads.iter().map(|t| t.name.clone()).collect();
    for process in ["make", "cc", "cc1", "as", "collect2", "ld"] {
        assert!(names.contains(process), "no {process} in {names:?}");
    }
    assert!(
        threads.iter().filter(|t| t.name == "cc1").count() >= files,
        "a cc1 for each file"
    );
    let paths: Vec<Vec<String>> = threads.into_iter().flat_map(|t| t.paths).collect();
    let marked = assert_roots_honest(test, &paths);
    eprintln!(
        "{test}: {} samples in {} process names, {:.1}% marked truncated ({} of them not at a thread's start or exit: gcc's recursions beyond the stack copy)",
        paths.len(),
        names.len(),
        marked.share,
        marked.unexplained
    );
}

fn one_program_one_root_deep_static_and_threads() {
    let test = "one_program_one_root_deep_static_and_threads";
    for mode in ["hybrid", "fp"] {
        // 2,000-deep recursion: beyond the stack copy, and beyond where glibc's frames
        // without frame pointers end the kernel's chain.
        let (o, path) = record(&["--unwind", mode], &[&target("deep"), "1", "2000"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let paths = all_paths(&path);
        let at_start = paths.iter().filter(|p| p[0] == "_start").count();
        eprintln!(
            "{test}: deep, {mode}: {at_start} of {} start at _start",
            paths.len()
        );
        assert!(
            at_start * 100 >= paths.len() * 99,
            "{mode}: {at_start} of {}",
            paths.len()
        );
    }
    // A static program with threads: its own _start and clone3.
    let (o, path) = record(&[], &[&target("busy_static"), "2", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let paths = all_paths(&path);
    // Only a thread sampled in its first instructions or as it exits (its memory gone)
    // may be marked: 0 to 6 of about 2,000 samples seen, as the exit's teardown happens
    // to meet a tick or not.
    let marked = assert_roots_honest(test, &paths);
    eprintln!(
        "{test}: busy_static: {:.2}% marked, {} for another reason",
        marked.share, marked.unexplained
    );
    // With two CPU hogs beside the suite, 1 such stack in about 2,000 was seen in 2 runs
    // of 4 (not reproduced in 6 runs alone); its frames are printed above for the cause.
    assert!(
        marked.unexplained <= 1,
        "{} marked for another reason",
        marked.unexplained
    );
    assert!(marked.share <= 1.0, "{}% marked", marked.share);
    assert!(paths.iter().any(|p| p[0] == "__clone3"), "thread roots");
}

fn main() {
    run_tests(tests![
        python_perf_trampolines_unwind_to_main_with_shares: Need::Perf, Need::Located("CPython 3.12 with -X perf", python312);
        python_jit_dump_with_cfi_names_and_unwinds: Need::Perf, Need::Located("CPython 3.13 with -X perf_jit", python313);
        node_perf_basic_prof_stacks_are_complete_and_named: Need::Perf, Need::Program("node", &["--version"]);
        node_jit_dump_names_the_code: Need::Perf, Need::Program("node", &["--version"]);
        make_j2_every_process_and_honest_roots: Need::Perf, Need::Program("make", &["--version"]), Need::Program("cc", &["--version"]);
        one_program_one_root_deep_static_and_threads: Need::Perf;
    ]);
}
