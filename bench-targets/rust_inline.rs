//! A Rust bench target for symbolication: demangled names without hashes, inline frames of
//! Rust functions, and a trait method on a generic type. Call tree:
//!   main > rust_inline::run > rust_inline::work > (inlined) level1 > (inlined) level2
//!   main > rust_inline::run > <rust_inline::Squares<u64> as rust_inline::Summer>::total
//! Usage: rust_inline [seconds] (default 2)
use std::hint::black_box;
use std::time::{Duration, Instant};

#[inline(always)]
fn level2(n: u64) -> f64 {
    let mut s = 0.0;
    for i in 0..n {
        s += black_box(i as f64) * 0.999_999;
    }
    s
}

#[inline(always)]
fn level1(n: u64) -> f64 {
    level2(n) + 1.0
}

#[inline(never)]
fn work(n: u64) -> f64 {
    level1(n) * 2.0
}

trait Summer {
    fn total(&self) -> u64;
}

struct Squares<T> {
    upto: T,
}

impl Summer for Squares<u64> {
    #[inline(never)]
    fn total(&self) -> u64 {
        (0..black_box(self.upto)).fold(0u64, |acc, i| acc.wrapping_add(black_box(i * i)))
    }
}

#[inline(never)]
fn run(seconds: f64) -> f64 {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let squares = Squares { upto: 300_000u64 };
    let mut sink = 0.0;
    while Instant::now() < end {
        sink += work(700_000);
        sink += squares.total() as f64;
    }
    sink
}

fn main() {
    let seconds = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    black_box(run(seconds));
}
