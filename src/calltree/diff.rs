//! Comparing two profiles function by function (`sampler diff BASE NEW`): each
//! function's self and total share of the weight in each profile, the change, and
//! whether the change is beyond sampling noise. The computation is pure (profiles in,
//! rows out); `emit::diff` formats it.
//!
//! The statistic: each sample is taken as an independent draw that lands in a function
//! (self) or passes through it (total) with the function's share as probability, so a
//! share is a binomial proportion. The change of one share between the two profiles
//! gets Newcombe's hybrid score interval for a difference of two independent
//! proportions (Newcombe 1998, method 10: the two Wilson score intervals combined),
//! which keeps its coverage for rare functions, where the plain normal (Wald)
//! interval claims changes that one or two samples make. A change is significant when
//! its interval leaves out 0. Every function is tested twice (self and total), so the
//! level of each interval is Bonferroni's: [`FAMILY_ALPHA`] over the number of tests,
//! and the chance that a comparison of two recordings of one program calls any change
//! significant is at most [`FAMILY_ALPHA`].
//!
//! Samples of a real run are not independent draws (a timer tick on a deterministic
//! loop); on the bench targets the spread of shares between repeated runs was measured
//! at or below the binomial one (README, *Compare two runs*), so the binomial interval is
//! the wider one there. Weighted samples (time, or events when the period varied) count
//! as Kish's effective number of samples, `(Σw)² / Σw²`.

use std::collections::{BinaryHeap, HashMap};

use crate::profile::{CodeKind, FuncIndex, Profile, SampleRow, StackIndex, TimeView};

/// The chance, over all the functions of one comparison, of calling any change
/// significant when both profiles sample the same program: 1%.
pub const FAMILY_ALPHA: f64 = 0.01;

/// Samples per batch of the dispersion estimate (see [`FunctionWeights::of`]): 50 ms at
/// 1000 Hz. Longer than the clustering measured on the bench targets (their batch
/// estimates matched the spread between runs), short enough that a program's phases
/// add little: a function that runs only in the first half of 1,000 samples gets a
/// dispersion of 5 (one step among 19 differences), of 10,000 samples none.
pub const BATCH_SAMPLES: usize = 50;
/// Fewer batches than this estimate nothing: the binomial variance is used alone.
const MIN_BATCHES: usize = 10;

/// One profile's weight per function, as `sampler diff` compares them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FunctionWeights {
    /// Weight of the samples whose leaf frame is in the function.
    pub self_weight: HashMap<String, u64>,
    /// Weight of the samples with the function anywhere on their stack (once per
    /// sample, however often it recurses).
    pub total_weight: HashMap<String, u64>,
    /// How many times the binomial variance of the function's self (total) share its
    /// samples showed, where more than 1 (clustered in time); absent: 1.
    pub self_dispersion: HashMap<String, f64>,
    pub total_dispersion: HashMap<String, f64>,
    /// Weight of all samples.
    pub total: u64,
    /// Kish's effective number of samples: `(Σw)² / Σw²`; the count of samples when
    /// every sample weighs the same.
    pub effective_samples: f64,
}

impl FunctionWeights {
    /// The weights of every thread's samples of `profile`, as `view` weighs them, and
    /// the dispersion of each share: the samples in time order (every thread's merged)
    /// are cut into batches of [`BATCH_SAMPLES`], and the variance of the share is
    /// estimated from the differences of successive batches' shares (von Neumann's
    /// mean square successive difference, which a slow change of the program's mix,
    /// its phases, hardly moves); the dispersion is that variance over the binomial
    /// one. Memory: a few words per function and per batch, none per sample.
    ///
    /// With `user_only`, kernel frames are left out: a sample in the kernel counts for
    /// the user function that entered it (a system call, or the code an interrupt
    /// stopped), and a sample with no user frame is not counted at all.
    pub fn of(profile: &Profile, view: TimeView, user_only: bool) -> FunctionWeights {
        let interval_ns = profile.meta.interval_ns();
        let mut funcs = StackFunctions {
            profile,
            user_only,
            names: Vec::new(),
            name_index: HashMap::new(),
            by_stack: HashMap::new(),
        };
        let weight_of = |row: &SampleRow<StackIndex>| view.weight(row.weight, interval_ns);
        let mut counted = 0usize;
        for row in profile.threads.iter().flat_map(|t| &t.samples) {
            if weight_of(row) > 0 && funcs.of(row.stack).is_some() {
                counted += 1;
            }
        }
        let batches = (counted / BATCH_SAMPLES).max(1);
        let mut batch_total = vec![0u64; batches];
        let (mut self_acc, mut total_acc): (Vec<Successive>, Vec<Successive>) = (vec![], vec![]);
        let (mut sum, mut sum_squares) = (0f64, 0f64);
        let mut i = 0usize;
        for row in in_time_order(profile) {
            let w = weight_of(row);
            let Some((leaf, all)) = funcs.of(row.stack).filter(|_| w > 0) else {
                continue;
            };
            let batch = (i / BATCH_SAMPLES).min(batches - 1);
            i += 1;
            let known = 1 + all.iter().max().copied().unwrap_or(*leaf);
            if self_acc.len() < known {
                self_acc.resize_with(known, Successive::default);
                total_acc.resize_with(known, Successive::default);
            }
            self_acc[*leaf].add(batch, w, &batch_total);
            for &f in all {
                total_acc[f].add(batch, w, &batch_total);
            }
            batch_total[batch] += w;
            sum += w as f64;
            sum_squares += (w as f64) * (w as f64);
        }
        let effective_samples = match sum_squares > 0.0 {
            true => sum * sum / sum_squares,
            false => 0.0,
        };
        let total: u64 = batch_total.iter().sum();
        let mut out = FunctionWeights {
            total,
            effective_samples,
            ..FunctionWeights::default()
        };
        let tables = [
            (self_acc, &mut out.self_weight, &mut out.self_dispersion),
            (total_acc, &mut out.total_weight, &mut out.total_dispersion),
        ];
        for (accumulators, weights, dispersions) in tables {
            for (f, acc) in accumulators.into_iter().enumerate() {
                if acc.weight == 0 {
                    continue;
                }
                let name = funcs.names[f];
                weights.insert(name.to_string(), acc.weight);
                let share = acc.weight as f64 / total as f64;
                let d = acc.dispersion(&batch_total, share, effective_samples);
                if d > 1.0 {
                    dispersions.insert(name.to_string(), d);
                }
            }
        }
        out
    }

    fn share(&self, weights: &HashMap<String, u64>, function: &str) -> f64 {
        match self.total {
            0 => 0.0,
            total => weights.get(function).copied().unwrap_or(0) as f64 / total as f64,
        }
    }
}

/// Function names interned, and per stack its leaf function and its distinct
/// functions (none for a stack without a user frame, with `user_only`).
struct StackFunctions<'p> {
    profile: &'p Profile,
    user_only: bool,
    names: Vec<&'p str>,
    name_index: HashMap<&'p str, usize>,
    by_stack: HashMap<StackIndex, Option<(usize, Vec<usize>)>>,
}

impl<'p> StackFunctions<'p> {
    fn of(&mut self, stack: StackIndex) -> Option<&(usize, Vec<usize>)> {
        if !self.by_stack.contains_key(&stack) {
            let mut ids: Vec<usize> = Vec::new();
            for f in leaf_funcs(self.profile, stack, self.user_only) {
                let name = self.profile.func_name(f);
                let next = self.names.len();
                let id = *self.name_index.entry(name).or_insert(next);
                if id == next {
                    self.names.push(name);
                }
                ids.push(id);
            }
            let funcs = ids.first().copied().map(|leaf| {
                ids.sort_unstable();
                ids.dedup();
                (leaf, ids)
            });
            self.by_stack.insert(stack, funcs);
        }
        self.by_stack[&stack].as_ref()
    }
}

/// The next sample of one thread, ordered for a min-heap: earliest first.
#[derive(PartialEq)]
struct NextSample {
    time_ms: f64,
    thread: usize,
}

impl Eq for NextSample {}

impl Ord for NextSample {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other
            .time_ms
            .total_cmp(&self.time_ms)
            .then(other.thread.cmp(&self.thread))
    }
}

impl PartialOrd for NextSample {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Every thread's samples merged in time order (each thread's are in time order
/// already), by a merge over the threads rather than a sorted copy of the samples.
fn in_time_order(profile: &Profile) -> impl Iterator<Item = &SampleRow<StackIndex>> {
    let mut next: Vec<usize> = vec![0; profile.threads.len()];
    let mut heap: BinaryHeap<NextSample> = profile
        .threads
        .iter()
        .enumerate()
        .filter_map(|(thread, t)| {
            Some(NextSample {
                time_ms: t.samples.first()?.time_ms,
                thread,
            })
        })
        .collect();
    std::iter::from_fn(move || {
        let thread = heap.pop()?.thread;
        let samples = &profile.threads[thread].samples;
        let row = &samples[next[thread]];
        next[thread] += 1;
        if let Some(following) = samples.get(next[thread]) {
            heap.push(NextSample {
                time_ms: following.time_ms,
                thread,
            });
        }
        Some(row)
    })
}

/// The funcs of a stack's frames, leaf first; with `user_only`, of its user frames.
fn leaf_funcs(
    profile: &Profile,
    stack: StackIndex,
    user_only: bool,
) -> impl Iterator<Item = FuncIndex> + '_ {
    std::iter::successors(Some(stack), |s| profile.stacks[s.index()].prefix)
        .map(|s| &profile.frames[profile.stacks[s.index()].frame.index()])
        .filter(move |f| !user_only || f.kind != CodeKind::Kernel)
        .map(|f| f.func)
}

/// One share's weight and the sums its successive differences need, fed batch by
/// batch in order. With `s_b` the batch shares, `Σ (s_b+1 - s_b)²` over all batches is
/// `2 Σ s_b² - s_first² - s_last² - 2 Σ s_b s_b+1`, and only batches where the share
/// has weight add to it: a batch's share is added once the batch is complete (its
/// total known).
#[derive(Clone, Debug, Default)]
struct Successive {
    weight: u64,
    /// The batch being filled and the share's weight in it.
    open: Option<(usize, u64)>,
    /// The last batch added, and the share in it.
    last: Option<(usize, f64)>,
    squares: f64,
}

impl Successive {
    fn add(&mut self, batch: usize, w: u64, totals: &[u64]) {
        self.weight += w;
        match &mut self.open {
            Some((b, weight)) if *b == batch => *weight += w,
            _ => {
                self.close(totals);
                self.open = Some((batch, w));
            }
        }
    }

    /// Adds the batch being filled (now complete) to the sums.
    fn close(&mut self, totals: &[u64]) {
        let Some((batch, weight)) = self.open.take() else {
            return;
        };
        let s = weight as f64 / totals[batch].max(1) as f64;
        let ends = usize::from(batch == 0) + usize::from(batch == totals.len() - 1);
        self.squares += (2 - ends) as f64 * s * s;
        if let Some((previous, p)) = self.last {
            if previous + 1 == batch {
                self.squares -= 2.0 * p * s;
            }
        }
        self.last = Some((batch, s));
    }

    /// The variance of the share estimated from its batches over its binomial variance
    /// `share (1 - share) / n`; 1 when there are too few batches to say. The mean
    /// square successive difference `Σ (s_b+1 - s_b)² / (B - 1)` is twice the variance
    /// of one batch's share when batches are independent, and the variance of the
    /// whole share is that of a batch over `B`.
    fn dispersion(mut self, totals: &[u64], share: f64, n: f64) -> f64 {
        self.close(totals);
        let b = totals.len();
        let binomial = share * (1.0 - share) / n;
        if b < MIN_BATCHES || binomial <= 0.0 {
            return 1.0;
        }
        let batch_variance = self.squares / (2.0 * (b - 1) as f64);
        batch_variance / b as f64 / binomial
    }
}

/// The change of one share (self or total) of one function, in percent of the weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShareChange {
    pub base: f64,
    pub new: f64,
    /// `new - base`, in percentage points.
    pub delta: f64,
    /// The interval on `delta` at the comparison's level, in percentage points.
    pub low: f64,
    pub high: f64,
    /// The share's variance over the binomial one in each profile (at least 1): the
    /// interval counts each profile's samples as this many times fewer.
    pub base_dispersion: f64,
    pub new_dispersion: f64,
}

impl ShareChange {
    /// Beyond noise: the interval leaves out 0.
    pub fn significant(&self) -> bool {
        self.low > 0.0 || self.high < 0.0
    }
}

/// One function of the comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionDiff {
    pub function: String,
    pub self_share: ShareChange,
    pub total_share: ShareChange,
}

impl FunctionDiff {
    /// Either share changed beyond noise.
    pub fn significant(&self) -> bool {
        self.self_share.significant() || self.total_share.significant()
    }

    /// The larger change of the two shares (of the significant ones, when either is),
    /// in percentage points: what rows are sorted by.
    pub fn change(&self) -> f64 {
        let both = [self.self_share, self.total_share];
        let significant = self.significant();
        both.iter()
            .filter(|c| !significant || c.significant())
            .map(|c| c.delta.abs())
            .fold(0.0, f64::max)
    }
}

/// The comparison of two profiles.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Significant changes first, each group by the size of its change, largest first.
    pub functions: Vec<FunctionDiff>,
    /// Tests made (two per function), over which [`FAMILY_ALPHA`] is divided.
    pub tests: usize,
    /// The confidence level of each interval, `1 - FAMILY_ALPHA / tests`.
    pub level: f64,
    pub base_samples: f64,
    pub new_samples: f64,
}

/// Compares every function that has weight in either profile. Both profiles must have
/// samples (the caller says which has none).
pub fn compare(base: &FunctionWeights, new: &FunctionWeights) -> Comparison {
    let mut names: Vec<&str> = base
        .total_weight
        .keys()
        .chain(new.total_weight.keys())
        .map(String::as_str)
        .collect();
    names.sort_unstable();
    names.dedup();
    let tests = 2 * names.len().max(1);
    let alpha = FAMILY_ALPHA / tests as f64;
    let z = normal_quantile_two_sided(alpha);
    let change = |total: bool, name: &str| {
        let of = |w: &FunctionWeights| {
            let (weights, dispersions) = match total {
                true => (&w.total_weight, &w.total_dispersion),
                false => (&w.self_weight, &w.self_dispersion),
            };
            let dispersion = dispersions.get(name).copied().unwrap_or(1.0);
            (w.share(weights, name), dispersion)
        };
        let ((pb, db), (pn, dn)) = (of(base), of(new));
        let (low, high) = newcombe_interval(
            (pb, base.effective_samples / db),
            (pn, new.effective_samples / dn),
            z,
        );
        ShareChange {
            base: 100.0 * pb,
            new: 100.0 * pn,
            delta: 100.0 * (pn - pb),
            low: 100.0 * low,
            high: 100.0 * high,
            base_dispersion: db,
            new_dispersion: dn,
        }
    };
    let mut functions: Vec<FunctionDiff> = names
        .into_iter()
        .map(|name| FunctionDiff {
            function: name.to_string(),
            self_share: change(false, name),
            total_share: change(true, name),
        })
        .collect();
    // Changes equal but for rounding (70 to 50 and 30 to 50 points) sort by name.
    let size = |f: &FunctionDiff| (f.change() * 1e9).round();
    functions.sort_by(|a, b| {
        b.significant()
            .cmp(&a.significant())
            .then(size(b).total_cmp(&size(a)))
            .then_with(|| a.function.cmp(&b.function))
    });
    Comparison {
        functions,
        tests,
        level: 1.0 - alpha,
        base_samples: base.effective_samples,
        new_samples: new.effective_samples,
    }
}

/// Wilson's score interval for a proportion `p` observed in `n` draws, at the level
/// whose two-sided normal quantile is `z`.
pub fn wilson_interval(p: f64, n: f64, z: f64) -> (f64, f64) {
    if n <= 0.0 {
        return (0.0, 1.0);
    }
    let z2 = z * z;
    let denominator = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denominator;
    let half = z / denominator * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Newcombe's hybrid score interval for `p_new - p_base`, each proportion given with its
/// number of draws (`(p, n)`), at the level whose two-sided normal quantile is `z`.
pub fn newcombe_interval(base: (f64, f64), new: (f64, f64), z: f64) -> (f64, f64) {
    let (pb, pn) = (base.0, new.0);
    let (lb, ub) = wilson_interval(pb, base.1, z);
    let (ln, un) = wilson_interval(pn, new.1, z);
    let delta = pn - pb;
    (
        delta - ((pn - ln).powi(2) + (ub - pb).powi(2)).sqrt(),
        delta + ((un - pn).powi(2) + (pb - lb).powi(2)).sqrt(),
    )
}

/// The complementary error function, with a fractional error below 1.2e-7 everywhere
/// (the Chebyshev fit in Numerical Recipes, §6.2): enough for tail probabilities down
/// to those of thousands of tests.
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ]
    .iter()
    .rev()
    .fold(0.0, |acc, c| c + t * acc);
    let r = t * (-z * z + poly).exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// The `z` that a standard normal variable exceeds in absolute value with probability
/// `alpha` (1.96 for 0.05), by bisection on [`erfc`].
pub fn normal_quantile_two_sided(alpha: f64) -> f64 {
    let tail = |z: f64| erfc(z / std::f64::consts::SQRT_2);
    let (mut low, mut high) = (0.0, 40.0);
    // 60 halvings of 40 leave less than 1e-16: as exact as an f64 holds.
    for _ in 0..60 {
        let mid = 0.5 * (low + high);
        if tail(mid) > alpha {
            low = mid;
        } else {
            high = mid;
        }
    }
    0.5 * (low + high)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance
    }

    #[test]
    fn normal_quantiles() {
        assert!(close(normal_quantile_two_sided(0.05), 1.959_964, 1e-5));
        assert!(close(normal_quantile_two_sided(0.01), 2.575_829, 1e-5));
        assert!(close(normal_quantile_two_sided(0.001), 3.290_527, 1e-5));
        assert!(close(normal_quantile_two_sided(1e-6), 4.891_638, 1e-4));
        assert!(close(erfc(0.0), 1.0, 1e-7));
        assert!(close(erfc(-1.0), 1.842_700_79, 1e-6));
    }

    /// Newcombe's own worked example (Statistics in Medicine 17, 873-890, 1998, table
    /// II, example (a)): 56/70 against 48/80, method 10: 0.0524 to 0.3339.
    #[test]
    fn newcombe_worked_example() {
        let z = normal_quantile_two_sided(0.05);
        let (low, high) = newcombe_interval((48.0 / 80.0, 80.0), (56.0 / 70.0, 70.0), z);
        assert!(close(low, 0.0524, 5e-5), "{low}");
        assert!(close(high, 0.3339, 5e-5), "{high}");
    }

    fn weights(counts: &[(&str, u64)], total: u64) -> FunctionWeights {
        let map: HashMap<String, u64> = counts.iter().map(|(f, n)| (f.to_string(), *n)).collect();
        FunctionWeights {
            self_weight: map.clone(),
            total_weight: map,
            total,
            effective_samples: total as f64,
            ..FunctionWeights::default()
        }
    }

    /// Fixed counts: 700/300 of 1000 against 500/500 of 1000. Two functions, four
    /// tests: each interval at 1 - 0.01/4, z = 3.0233; hot_a's Wilson intervals are
    /// 0.4524..0.5476 (new) and 0.6545..0.7418 (base), so its change is -0.2 with the
    /// interval -0.2 -/+ sqrt(0.0476² + 0.0418²) and sqrt(0.0476² + 0.0455²).
    #[test]
    fn seventy_thirty_against_fifty_fifty() {
        let base = weights(&[("hot_a", 700), ("hot_b", 300)], 1000);
        let new = weights(&[("hot_a", 500), ("hot_b", 500)], 1000);
        let c = compare(&base, &new);
        assert_eq!(c.tests, 4);
        assert!(close(c.level, 0.9975, 1e-12));
        let z = normal_quantile_two_sided(0.0025);
        assert!(close(z, 3.023_341, 1e-5));
        let (wl, wh) = wilson_interval(0.5, 1000.0, z);
        assert!(close(wl, 0.452_4, 1e-4) && close(wh, 0.547_6, 1e-4));
        let (bl, bh) = wilson_interval(0.7, 1000.0, z);
        assert!(close(bl, 0.654_5, 1e-4) && close(bh, 0.741_8, 1e-4));
        let a = &c.functions.iter().find(|f| f.function == "hot_a").unwrap();
        assert!(close(a.self_share.base, 70.0, 1e-9));
        assert!(close(a.self_share.new, 50.0, 1e-9));
        assert!(close(a.self_share.delta, -20.0, 1e-9));
        let low = -20.0 - 100.0 * ((0.5 - wl).powi(2) + (bh - 0.7).powi(2)).sqrt();
        let high = -20.0 + 100.0 * ((wh - 0.5).powi(2) + (0.7 - bl).powi(2)).sqrt();
        assert!(close(a.self_share.low, low, 1e-9) && close(a.self_share.high, high, 1e-9));
        assert!(close(a.self_share.low, -26.34, 0.01), "{:?}", a.self_share);
        assert!(close(a.self_share.high, -13.42, 0.01), "{:?}", a.self_share);
        assert!(a.significant() && a.self_share.high < 0.0);
        let b = &c.functions.iter().find(|f| f.function == "hot_b").unwrap();
        assert!(b.significant() && b.self_share.low > 0.0);
        // Equal changes: sorted by name.
        assert_eq!(c.functions[0].function, "hot_a");
    }

    /// 700/300 against 680/320 of 1000 each is two points: within noise at this level
    /// (it would be at 95% for one test, too).
    #[test]
    fn small_changes_are_noise() {
        let base = weights(&[("hot_a", 700), ("hot_b", 300)], 1000);
        let new = weights(&[("hot_a", 680), ("hot_b", 320)], 1000);
        let c = compare(&base, &new);
        assert!(c.functions.iter().all(|f| !f.significant()), "{c:?}");
        // A function seen in one profile only, 12 samples in 1000: 1.2%, not enough
        // among 3 functions (6 tests)...
        let new = weights(&[("hot_a", 690), ("hot_b", 298), ("rare", 12)], 1000);
        let c = compare(&base, &new);
        let rare = c.functions.iter().find(|f| f.function == "rare").unwrap();
        assert!(!rare.significant(), "{rare:?}");
        // ...where the Wald interval (1.2 -/+ 3.19 * 0.344) would have called it.
        assert!(1.2 - 3.19 * 100.0 * (0.012f64 * 0.988 / 1000.0).sqrt() > 0.0);
        // 40 of 1000 is.
        let new = weights(&[("hot_a", 670), ("hot_b", 290), ("rare", 40)], 1000);
        let c = compare(&base, &new);
        assert_eq!(c.functions[0].function, "rare");
        assert!(c.functions[0].significant());
    }

    /// Significant rows come first, largest change first; the rest after them.
    #[test]
    fn order_is_significant_changes_first() {
        let base = weights(&[("a", 5000), ("b", 4990), ("c", 10)], 10_000);
        let new = weights(&[("a", 4000), ("b", 5950), ("c", 50)], 10_000);
        let c = compare(&base, &new);
        let order: Vec<&str> = c.functions.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(order, ["a", "b", "c"]);
        assert!(c.functions[0].significant() && c.functions[1].significant());
    }

    /// 1,000 samples, half in a and half in b: 20 batches of 50.
    fn halves(pattern: impl Fn(usize) -> bool) -> FunctionWeights {
        let stacks: Vec<&[&str]> = (0..1000)
            .map(|i| match pattern(i) {
                true => &["main", "a"] as &[&str],
                false => &["main", "b"],
            })
            .collect();
        FunctionWeights::of(&Profile::from_named_stacks(&stacks), TimeView::Cpu, false)
    }

    #[test]
    fn clustered_samples_count_as_fewer() {
        // a and b in turns: every batch holds 25 of each, steadier than random draws;
        // the binomial variance stays.
        let even = halves(|i| i % 2 == 0);
        assert!(even.total_dispersion.is_empty() && even.self_dispersion.is_empty());
        // Runs of 50: each batch is all a or all b, and successive batches differ by 1:
        // the variance of a batch's share is 19 / (2 * 19) = 0.5, of the whole share
        // 0.5 / 20, against 0.25 / 1000 for independent draws: 100 times.
        let runs = halves(|i| (i / 50) % 2 == 0);
        assert!(close(runs.self_dispersion["a"], 100.0, 1e-9));
        assert!(close(runs.total_dispersion["b"], 100.0, 1e-9));
        assert!(!runs.total_dispersion.contains_key("main"), "a share of 1");
        // A phase: a for the first half, then b: one step among 19 differences, 5.26
        // times (1 / 38 / 20 against 0.25 / 1000).
        let phases = halves(|i| i < 500);
        assert!(close(phases.self_dispersion["a"], 1000.0 / 190.0, 1e-9));
        // The comparison counts 1,000 samples as 10 (runs) and 190 (phases).
        let c = compare(&runs, &phases);
        let a = c.functions.iter().find(|f| f.function == "a").unwrap();
        assert_eq!(a.self_share.base_dispersion, 100.0);
        assert!(close(a.self_share.new_dispersion, 1000.0 / 190.0, 1e-9));
        let z = normal_quantile_two_sided(1.0 - c.level);
        let (low, high) = newcombe_interval((0.5, 10.0), (0.5, 190.0), z);
        assert!(close(a.self_share.low, 100.0 * low, 1e-9));
        assert!(close(a.self_share.high, 100.0 * high, 1e-9));
    }

    #[test]
    fn weights_of_a_profile() {
        let p = Profile::from_named_stacks(&[
            &["main", "f", "f", "g"],
            &["main", "f"],
            &["main", "g"],
            &["main"],
        ]);
        let w = FunctionWeights::of(&p, TimeView::Cpu, false);
        assert_eq!(w.total, 4);
        assert!(close(w.effective_samples, 4.0, 1e-12));
        assert_eq!(w.total_weight["main"], 4);
        assert_eq!(w.total_weight["f"], 2);
        assert_eq!(w.total_weight["g"], 2);
        assert_eq!(w.self_weight["g"], 2);
        assert_eq!(w.self_weight["f"], 1);
        assert_eq!(w.self_weight["main"], 1);
        // g in the kernel: its samples count for the user function that entered it.
        let mut k = p.clone();
        for frame in &mut k.frames {
            if k.funcs[frame.func.index()].name == "g" {
                frame.kind = CodeKind::Kernel;
            }
        }
        let w = FunctionWeights::of(&k, TimeView::Cpu, true);
        assert_eq!(w.total, 4);
        assert!(!w.total_weight.contains_key("g"));
        assert_eq!((w.self_weight["f"], w.self_weight["main"]), (2, 2));
        assert_eq!(w.total_weight["f"], 2);
        // Kish: weights 3, 1, 1, 1 count as 36/12 = 3 samples.
        let mut p = p;
        p.threads[0].samples[0].weight = crate::profile::SampleWeight::OnCpu(3);
        let w = FunctionWeights::of(&p, TimeView::Cpu, false);
        assert_eq!(w.total, 6);
        assert!(close(w.effective_samples, 3.0, 1e-12));
    }
}
