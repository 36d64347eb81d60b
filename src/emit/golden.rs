//! Golden files: every export of two fixed profiles (docs/design.md §3's seed 001, and a profile
//! that uses every part of the format) compared with `tests/golden/`, byte for byte. A
//! change to any output shows as a diff of these files; when it is meant,
//! `SAMPLER_BLESS=1 cargo test golden` writes them anew.

use std::path::PathBuf;

use super::report::{render_tree, ReportOptions};
use super::{firefox, folded, pprof, speedscope, svg};
use crate::calltree::CallTree;
use crate::profile::{Profile, TimeView};

/// Set to 1 to write the golden files instead of comparing with them.
const BLESS_ENV: &str = "SAMPLER_BLESS";

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `actual` with the golden file `name`, or writes it when blessing.
fn check(name: &str, actual: &str) {
    let path = golden_dir().join(name);
    if std::env::var(BLESS_ENV).as_deref() == Ok("1") {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with {BLESS_ENV}=1 to write it)",
            path.display()
        )
    });
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the output at line {} (run with {BLESS_ENV}=1 if the change is meant):\n  golden: {:?}\n  actual: {:?}",
            path.display(),
            line + 1,
            expected.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}

fn every_export(name: &str, profile: &Profile) {
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap() + "\n";
    check(
        &format!("{name}.firefox.json"),
        &pretty(&firefox::to_json(profile)),
    );
    check(
        &format!("{name}.speedscope.json"),
        &pretty(&speedscope::to_json(profile, TimeView::Cpu)),
    );
    check(
        &format!("{name}.folded"),
        &folded::to_folded(profile, false, TimeView::Cpu),
    );
    check(
        &format!("{name}.roots.folded"),
        &folded::to_folded(profile, true, TimeView::Cpu),
    );
    check(
        &format!("{name}.pprof.txt"),
        &format!("{:#?}\n", pprof::to_pprof(profile)),
    );
    check(
        &format!("{name}.svg"),
        &svg::to_svg(profile, false, TimeView::Cpu),
    );
    let opts = ReportOptions {
        width: Some(100),
        color: false,
        max_depth: None,
        min_percent: 0.0,
        time: None,
    };
    let mut report = String::new();
    let tree = CallTree::all_threads(profile);
    render_tree(&tree, &opts, &mut report);
    report.push('\n');
    render_tree(&tree.inverted(), &opts, &mut report);
    check(&format!("{name}.report.txt"), &report);
}

#[test]
fn golden_seed_001() {
    every_export("seed001", &crate::calltree::tests::seed_001());
}

#[test]
fn golden_rich_profile() {
    every_export("rich", &super::firefox::fixture::rich_profile());
}

#[test]
fn golden_firefox_profiles_load_in_the_firefox_profiler() {
    let tool = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/ffp-check");
    if !tool.exists() {
        if std::env::var("SAMPLER_REQUIRE_PERF").as_deref() == Ok("1") {
            panic!("{} is required here but missing", tool.display());
        }
        eprintln!("SKIPPED golden ffp-check: no {}", tool.display());
        return;
    }
    for name in ["seed001", "rich"] {
        let file = golden_dir().join(format!("{name}.firefox.json"));
        let out = std::process::Command::new(&tool)
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
