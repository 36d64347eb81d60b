//! The unwinder on captured samples (tests/fixtures/, see tests/common/fixture.rs): no
//! perf, no privileges. nofp-samples.json holds samples of bench-targets' nofp, built
//! without frame pointers, whose call tree is main > outer > middle > hot_a | hot_b.

use std::path::Path;

use crate::fixture::Fixture;
use sampler::events::UserRegs;
use sampler::unwind::{unwind_frame_pointers, CodeAddress, CodeLookup, LeafFrame, UnwindMode};

fn nofp() -> Fixture {
    Fixture::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nofp-samples.json"))
}

/// Function names of a leaf-first stack, as far as the fixture's modules name them.
fn names(f: &Fixture, stack: &[CodeAddress]) -> Vec<String> {
    stack
        .iter()
        .map_while(|a| f.function(a.lookup_address()).map(str::to_string))
        .collect()
}

fn cfi_unwinds_code_without_frame_pointers_from_captured_samples() {
    let f = nofp();
    assert!(f.samples.len() >= 100, "{} samples", f.samples.len());
    for mode in [UnwindMode::Hybrid, UnwindMode::Dwarf] {
        let mut unwinder = f.unwinder(mode);
        let (mut hot, mut whole) = (0, 0);
        for s in &f.samples {
            let stack = unwinder.unwind(s);
            let names = names(&f, &stack.user);
            if !names.first().is_some_and(|n| n == "hot_a" || n == "hot_b") {
                continue;
            }
            hot += 1;
            if names[1..].starts_with(&["middle".into(), "outer".into(), "main".into()]) {
                whole += 1;
            }
        }
        eprintln!("{mode:?}: {whole} of {hot} samples in hot_a/hot_b unwind to main");
        // Every captured sample is in hot_a or hot_b, and each unwinds whole.
        assert_eq!((hot, whole), (120, 120), "{mode:?}");
    }
}

/// Frame pointers alone, with no CFI at all.
struct NoCfi;

impl CodeLookup for NoCfi {
    fn leaf_frame(&mut self, _: UserRegs, _: &[u8]) -> Option<LeafFrame> {
        None
    }
    fn is_code(&mut self, _: u64) -> bool {
        false
    }
}

fn frame_pointers_on_code_without_them_are_wrong_but_do_not_fail() {
    let f = nofp();
    let mut whole = 0;
    for s in &f.samples {
        let stack = unwind_frame_pointers(s, &mut NoCfi);
        assert!(
            !stack.user.is_empty(),
            "the sampled instruction is always there"
        );
        let names = names(&f, &stack.user);
        whole += usize::from(names.len() >= 4 && names[1..4] == ["middle", "outer", "main"]);
    }
    eprintln!("fp: {whole} of {} samples unwind to main", f.samples.len());
    assert_eq!(
        (whole, f.samples.len()),
        (0, 120),
        "frame pointers cannot follow this program"
    );
}

fn the_frame_pointer_repair_reads_the_leafs_cfi() {
    // In fp mode the sampled function's CFI (through framehop) gives back the caller
    // that the chain skips: in this program no function has an RBP frame, so every
    // sampled leaf is frameless, and its caller is `middle`.
    let f = nofp();
    let mut unwinder = f.unwinder(UnwindMode::Fp);
    let (mut repaired, mut into_middle) = (0, 0);
    for s in &f.samples {
        let stack = unwinder.unwind(s);
        repaired += usize::from(stack.restored_leaf_caller);
        let names = names(&f, &stack.user);
        into_middle += usize::from(names.get(1).is_some_and(|n| n == "middle"));
    }
    eprintln!("fp: {repaired} leaves repaired, {into_middle} with middle as caller");
    assert_eq!((repaired, into_middle), (120, 120));
}

/// The tests of this module, for the offline binary's `main`.
pub fn tests() -> Vec<crate::common::Test> {
    crate::tests![
        cfi_unwinds_code_without_frame_pointers_from_captured_samples;
        frame_pointers_on_code_without_them_are_wrong_but_do_not_fail;
        the_frame_pointer_repair_reads_the_leafs_cfi;
    ]
}
