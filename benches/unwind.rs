//! Unwinding throughput on captured samples (tests/fixtures/nofp-samples.json): samples
//! unwound per second in each mode, on one core, the stacks' raw material already in
//! memory. Run with `cargo bench --bench unwind`.

#[path = "../tests/common/fixture.rs"]
mod fixture;

use std::path::Path;
use std::time::{Duration, Instant};

use sampler::binary::FrameRule;
use sampler::unwind::{unwind_frame_pointers, CodeLookup, UnwindMode};

/// How long each mode is timed.
const MEASURE: Duration = Duration::from_secs(1);

/// The frame-pointer walk needs no CFI; every address counts as code.
struct AllCode;

impl CodeLookup for AllCode {
    fn frame_rule(&mut self, _: u64) -> Option<FrameRule> {
        None
    }
    fn is_code(&mut self, _: u64) -> bool {
        true
    }
}

fn main() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nofp-samples.json");
    let f = fixture::Fixture::load(&path);
    println!(
        "{} captured samples of nofp (no frame pointers)",
        f.samples.len()
    );
    for (name, mode) in [
        ("fp", UnwindMode::Fp),
        ("hybrid", UnwindMode::Hybrid),
        ("dwarf", UnwindMode::Dwarf),
    ] {
        let mut unwinders = f.unwinders();
        let (mut count, mut frames) = (0u64, 0u64);
        let start = Instant::now();
        while start.elapsed() < MEASURE {
            for s in &f.samples {
                let stack = match mode {
                    UnwindMode::Fp => unwind_frame_pointers(s, &mut AllCode),
                    mode => unwinders.unwind(s, mode).expect("registers and stack"),
                };
                frames += stack.user.len() as u64;
                count += 1;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{name:7} {:>12.0} samples/s  {:>6.0} ns/sample  {:.1} frames/sample",
            count as f64 / secs,
            secs * 1e9 / count as f64,
            frames as f64 / count as f64
        );
    }
}
