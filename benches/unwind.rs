//! Unwinding throughput on captured samples (tests/fixtures/nofp-samples.json): samples
//! unwound per second in each mode, on one core, the stacks' raw material already in
//! memory. Run with `cargo bench --bench unwind`.

#[path = "../tests/common/fixture.rs"]
mod fixture;

use std::path::Path;
use std::time::{Duration, Instant};

use sampler::unwind::UnwindMode;

/// How long each mode is timed.
const MEASURE: Duration = Duration::from_secs(1);

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
        let mut unwinder = f.unwinder(mode);
        let (mut count, mut frames) = (0u64, 0u64);
        let start = Instant::now();
        while start.elapsed() < MEASURE {
            for s in &f.samples {
                let stack = unwinder.unwind(s);
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
