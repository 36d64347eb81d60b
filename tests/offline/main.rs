//! The tests that need neither perf nor root, in one binary (`cargo test --release --test
//! offline`): the symbolicator on programs compiled here, CFI read function by function,
//! the unwinder on captured samples and the corpus of captures, the design's worked
//! examples, bad input for the real `sampler` binary, seeded mutations of the readers of
//! untrusted input, `scripts/install`, the shape of the source tree, the unwind tables made
//! for the kernel against framehop, and the layout of the binary's text. Each module
//! lists its tests; the end-to-end tests that record with perf are in `tests/perf/`, one
//! binary each.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/fixture.rs"]
mod fixture;

mod corpus;
mod fuzz_mutation;
mod house;
mod install;
mod lazy_cfi;
mod robustness;
mod seed_examples;
mod symbolicate;
mod text_order;
mod unwind_fixtures;
mod unwind_table;

fn main() {
    let tests = [
        corpus::tests(),
        fuzz_mutation::tests(),
        house::tests(),
        install::tests(),
        lazy_cfi::tests(),
        robustness::tests(),
        seed_examples::tests(),
        symbolicate::tests(),
        text_order::tests(),
        unwind_fixtures::tests(),
        unwind_table::tests(),
    ];
    common::run_tests(tests.into_iter().flatten().collect())
}
