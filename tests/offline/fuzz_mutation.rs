//! A seeded mutation test of the two readers of untrusted input: the profile reader (and
//! everything that runs on what it returns: call trees, transforms, the report, every
//! export) and the ELF/DWARF symbolicator. Real seed inputs are mutated thousands of
//! times each, deterministically; a panic in any case fails the test with its seed and
//! case number, and so does a case that allocates more than [`MEMORY_BOUND`] at once.
//! The coverage-guided fuzz targets in `fuzz/` run the same entry points for longer.

// The counting allocator wraps the system allocator, which is `unsafe` by its nature.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use sampler::calltree::{CallTree, Transform};
use sampler::emit::{self, Format};
use sampler::profile::{Profile, SampleWeight, TimeView};
use sampler::symbolicate::LibSymbols;

/// Bytes live at once that no case may exceed.
const MEMORY_BOUND: usize = 512 << 20;

/// Counts the bytes allocated and keeps the peak, so a case that would take unbounded
/// memory is caught (a single allocation over the bound is refused outright).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MEMORY_BOUND {
            return std::ptr::null_mut();
        }
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's layout contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// splitmix64: a small, well-mixed deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Interesting numbers to put where numbers are.
const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "4294967295",
    "4294967296",
    "-9223372036854775808",
    "18446744073709551615",
    "1e300",
    "0.5",
    "null",
    "\"x\"",
    "[]",
    "{}",
];

/// One mutation of `input`: byte flips, truncation, a splice of itself, or (for JSON)
/// a number replaced by an interesting one.
fn mutate(input: &[u8], rng: &mut Rng, json: bool) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(3) {
        // In JSON, most mutations keep the syntax (numbers replaced), so that the tables'
        // checks and the code behind them are reached, not only the parser.
        let kind = if json && rng.below(3) > 0 {
            4
        } else {
            rng.below(4)
        };
        match kind {
            0 => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(out.len());
                out[i] = rng.next() as u8;
            }
            2 => out.truncate(rng.below(out.len()) + 1),
            3 => {
                let (a, b) = (rng.below(out.len()), rng.below(out.len()));
                let (from, to) = (a.min(b), a.max(b).min(a.min(b) + 64));
                let piece = out[from..to].to_vec();
                let at = rng.below(out.len());
                out.splice(at..at, piece);
            }
            _ => {
                // Replace a run of digits by an interesting number.
                let digits: Vec<usize> = out
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.is_ascii_digit())
                    .map(|(i, _)| i)
                    .collect();
                if digits.is_empty() {
                    continue;
                }
                let start = digits[rng.below(digits.len())];
                let end = (start..out.len())
                    .find(|&i| !out[i].is_ascii_digit())
                    .unwrap_or(out.len());
                let n = NUMBERS[rng.below(NUMBERS.len())].as_bytes().to_vec();
                out.splice(start..end, n);
            }
        }
        if out.is_empty() {
            out.push(b'{');
        }
    }
    out
}

/// Everything that runs on a profile read from a file.
fn use_profile(p: &Profile) {
    let tree = CallTree::all_threads(p);
    let _ = tree.inverted();
    let mut text = String::new();
    let opts = emit::report::ReportOptions {
        width: Some(100),
        color: false,
        max_depth: None,
        min_percent: 0.0,
        time: None,
    };
    emit::report::render_tree(&tree, &opts, &mut text);
    for name in ["main", "work", "nosuch"] {
        for t in [
            Transform::MergeFunction(name.into()),
            Transform::FocusFunction(name.into()),
            Transform::CollapseRecursion(name.into()),
            Transform::DropFunction(name.into()),
        ] {
            let _ = sampler::calltree::transform::apply_all(CallTree::all_threads(p), &[t]);
        }
    }
    for view in [TimeView::Cpu, TimeView::OffCpu, TimeView::Wall] {
        let _ = emit::folded::to_folded(p, true, view);
        let _ = emit::speedscope::to_json(p, view);
        let _ = emit::svg::to_svg(p, true, view);
    }
    let _ = emit::pprof::to_pprof(p);
    let _ = emit::firefox::to_json(p);
}

/// Runs `cases` mutations of `seed` through `run`; fails on a panic or memory over the
/// bound, naming the case.
/// `run` says whether the input got past the reader (so the campaign can tell how much
/// of it reached the code behind).
fn campaign(
    name: &str,
    seed: &[u8],
    cases: usize,
    json: bool,
    run: impl Fn(&[u8]) -> bool,
) -> usize {
    let mut accepted = 0;
    let mut rng = Rng(0x5eed_0000 ^ seed.len() as u64);
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for case in 0..cases {
        let input = mutate(seed, &mut rng, json);
        let before = LIVE.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&input)));
        accepted += usize::from(matches!(outcome, Ok(true)));
        let grew = PEAK.load(Ordering::Relaxed).saturating_sub(before);
        if outcome.is_err() {
            std::panic::set_hook(quiet);
            let file = std::env::temp_dir().join(format!("sampler-{name}-case-{case}"));
            std::fs::write(&file, &input).unwrap();
            panic!(
                "{name}: case {case} panicked; input saved as {}",
                file.display()
            );
        }
        assert!(
            grew <= MEMORY_BOUND,
            "{name}: case {case} took {grew} bytes at once"
        );
    }
    std::panic::set_hook(quiet);
    eprintln!(
        "{name}: {cases} mutated cases ({accepted} read as valid), no panic, each under {MEMORY_BOUND} bytes"
    );
    accepted
}

/// A directory `TMP/sampler-WHAT-PID` for a test's files, removed when the test ends,
/// passed or failed.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("sampler-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mutated_profiles_never_panic() {
    let mut p = Profile::from_named_stacks(&[
        &["main", "work", "level1", "main", "work"],
        &["main", "work", "level2"],
        &["main", "other"],
    ]);
    p.threads[0].samples[1].weight = SampleWeight::OnCpu(3);
    let dir = Scratch::new("mutation");
    let file = dir.0.join("seed.json");
    emit::write(&p, Format::Firefox, &Default::default(), &file, None).unwrap();
    let seed = std::fs::read(&file).unwrap();
    let accepted = campaign("profile", &seed, 20_000, true, |bytes| {
        let Ok(profile) = emit::firefox::from_slice(bytes) else {
            return false;
        };
        use_profile(&profile);
        true
    });
    // Enough mutants get past the reader for the code behind it to be exercised.
    assert!(accepted >= 1000, "only {accepted} mutants were read");
}

fn mutated_elf_files_never_panic() {
    // A small real ELF with compressed DWARF, compiled here.
    let dir = Scratch::new("mutation-elf");
    let bin = dir.0.join("inline3");
    let ok = std::process::Command::new("cc")
        .args(["-O2", "-g", "-gz=zlib", "-I"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-targets"))
        .arg("-o")
        .arg(&bin)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-targets/inline3.c"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "cc");
    let seed = std::fs::read(&bin).unwrap();
    let accepted = campaign("elf", &seed, 10_000, false, |bytes| {
        let _ =
            sampler::files::binary::Binary::from_bytes("fuzz".into(), std::sync::Arc::from(bytes));
        let _ = sampler::unwind::table::compile(Path::new("fuzz"), bytes);
        let Some(syms) = LibSymbols::from_elf(bytes) else {
            return false;
        };
        let addresses = [0x1000u64, 0x1139, 0x1140, 0x2000, u64::MAX];
        for a in addresses {
            let _ = syms.lookup(a);
        }
        // Whole functions, as the symbol cache resolves them: every line row and inlined
        // call of a damaged file's functions.
        let _ = syms.resolve_many(&addresses, &|_| {});
        syms.dwarf.is_some()
    });
    assert!(
        accepted >= 1000,
        "only {accepted} mutants had DWARF to read"
    );
}

/// The tests of this module, for the offline binary's `main`.
pub fn tests() -> Vec<crate::common::Test> {
    crate::tests![
        mutated_profiles_never_panic;
        mutated_elf_files_never_panic;
    ]
}
