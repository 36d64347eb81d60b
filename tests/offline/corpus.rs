//! The corpus of captured samples (`tests/fixtures/corpus/NAME.json`, written by
//! `SAMPLER_CAPTURE_SAMPLES`): each capture is unwound in every mode and its stacks,
//! named by the capture's own function symbols, are compared with the golden file beside
//! it (`NAME.frames`). A change to the unwinder that changes a frame of a real program
//! shows as a diff of these files; when it is meant, `SAMPLER_BLESS=1 cargo test
//! --release --test offline corpus` writes them anew. docs/testing.md says how to add a
//! program.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::fixture::Fixture;
use sampler::unwind::{CodeAddress, UnwindMode};

/// Set to 1 to write the golden files instead of comparing with them.
const BLESS_ENV: &str = "SAMPLER_BLESS";

/// The programs the corpus must hold at least (a capture lost by mistake fails the test).
const AT_LEAST: usize = 4;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corpus")
}

/// What a frame at `address` is called: its function, else its module and file address,
/// else `?` (code the capture holds no module of: the system libraries).
fn frame_name(f: &Fixture, address: u64) -> String {
    if let Some(name) = f.function(address) {
        return name.to_string();
    }
    f.capture
        .modules
        .iter()
        .find(|m| (m.start..m.end).contains(&address))
        .map_or("?".to_string(), |m| {
            format!("{}+{:#x}", m.name, address.wrapping_sub(m.bias))
        })
}

/// The golden text of a capture: for each mode, each distinct stack (root first, a
/// truncated stack's cause as its root) with its number of samples, most frequent first.
fn unwound(name: &str, f: &Fixture) -> String {
    let mut text = format!(
        "# {name}.json unwound in each mode: MODE SAMPLES root;...;leaf\n# ({BLESS_ENV}=1 cargo test --release --test offline corpus writes this file anew)\n"
    );
    for (label, mode) in [
        ("fp", UnwindMode::Fp),
        ("hybrid", UnwindMode::Hybrid),
        ("dwarf", UnwindMode::Dwarf),
    ] {
        let mut unwinder = f.unwinder(mode);
        let mut stacks: BTreeMap<String, usize> = BTreeMap::new();
        for s in &f.samples {
            let stack = unwinder.unwind(s);
            let mut frames: Vec<String> = stack
                .user
                .iter()
                .rev()
                .map(|a: &CodeAddress| frame_name(f, a.lookup_address()))
                .collect();
            if let Some(why) = stack.truncated {
                frames.insert(0, format!("[truncated: {why:?}]"));
            }
            *stacks.entry(frames.join(";")).or_default() += 1;
        }
        let mut stacks: Vec<(String, usize)> = stacks.into_iter().collect();
        stacks.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (stack, n) in stacks {
            text.push_str(&format!("{label} {n} {stack}\n"));
        }
    }
    text
}

/// Compares `actual` with the golden file at `path` (or writes it when blessing); what
/// differs, if anything.
fn compare(path: &Path, actual: &str) -> Option<String> {
    if std::env::var(BLESS_ENV).as_deref() == Ok("1") {
        std::fs::write(path, actual).unwrap();
        return None;
    }
    let golden = match std::fs::read_to_string(path) {
        Ok(golden) => golden,
        Err(e) => return Some(format!("{}: {e} ({BLESS_ENV}=1 writes it)", path.display())),
    };
    if golden == actual {
        return None;
    }
    let (g, a): (Vec<&str>, Vec<&str>) = (golden.lines().collect(), actual.lines().collect());
    let at = (0..g.len().max(a.len()))
        .find(|&i| g.get(i) != a.get(i))
        .unwrap_or(0);
    Some(format!(
        "{} differs from the unwound frames at line {} ({BLESS_ENV}=1 if the change is meant):\n  golden: {:?}\n  actual: {:?}",
        path.display(),
        at + 1,
        g.get(at),
        a.get(at)
    ))
}

fn the_corpus_unwinds_to_its_golden_frames() {
    let dir = corpus_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let captures: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_suffix(".json"))
        .collect();
    assert!(
        captures.len() >= AT_LEAST,
        "{} holds {} captures, not at least {AT_LEAST}",
        dir.display(),
        captures.len()
    );
    let mut differences = Vec::new();
    for name in names.iter().filter_map(|n| n.strip_suffix(".frames")) {
        if !captures.contains(&name) {
            differences.push(format!("{name}.frames has no capture {name}.json"));
        }
    }
    for name in &captures {
        let f = Fixture::load(&dir.join(format!("{name}.json")));
        assert!(!f.samples.is_empty(), "{name}.json holds no samples");
        let text = unwound(name, &f);
        eprintln!("{name}: {} samples unwound", f.samples.len());
        differences.extend(compare(&dir.join(format!("{name}.frames")), &text));
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

/// The tests of this module, for the offline binary's `main`.
pub fn tests() -> Vec<crate::common::Test> {
    crate::tests![the_corpus_unwinds_to_its_golden_frames;]
}
