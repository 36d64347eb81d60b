//! End-to-end: `sampler diff BASE NEW` on real recordings. Recordings of one program
//! compared with each other show no change beyond noise in its functions; the 70/30
//! target against its 50/50 mode (`split7030 --even`) shows hot_a shrinking and hot_b
//! growing, beyond noise, in the table, the JSON and the differential flame graphs.
//!
//! Shares are fractions of the target's own samples, so a busy machine (the target
//! getting less CPU than its wall time) changes the counts, not the shares compared.

#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use serde_json::Value;

/// Recordings of each program per test: 5 pairs for the same-program test.
const PAIRS: usize = 5;
/// Rounds of work each run of split7030 does (`-n`): about 1 s of CPU, 1,000 samples
/// at 1000 Hz, however busy the machine is (a run of fixed seconds gets fewer samples
/// when it shares its CPU).
const ROUNDS: &str = "1500";

fn sampler(args: &[&str]) -> Output {
    Command::new(sampler_bin())
        .arg("diff")
        .args(args)
        .output()
        .expect("sampler runs")
}

/// Records `split7030 ARGS... -n ROUNDS` into a new file.
fn record_split(args: &[&str]) -> PathBuf {
    let mut cmd = vec![target("split7030")];
    cmd.extend(args.iter().map(|a| a.to_string()));
    cmd.extend(["-n".to_string(), ROUNDS.into()]);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let (o, path) = record(&["-F", "1000"], &cmd);
    assert!(o.status.success(), "recording {cmd:?}: {}", stderr(&o));
    ffp_check(&path);
    path
}

fn diff_json(base: &Path, new: &Path, extra: &[&str]) -> Vec<Value> {
    let (base, new) = (base.display().to_string(), new.display().to_string());
    let mut args = vec![base.as_str(), new.as_str(), "--json"];
    args.extend(extra);
    let out = succeeded("diff --json", &sampler(&args));
    let v: Value = serde_json::from_str(&out).expect("diff --json prints JSON");
    v.as_array().expect("an array").clone()
}

fn row<'a>(rows: &'a [Value], function: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["function"] == function)
        .unwrap_or_else(|| panic!("{function} is not in the comparison: {rows:?}"))
}

fn number(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// Compared with `--user`: kernel frames are sampled too, and on a busy machine what
/// they add differs between runs for reasons outside the program: another process's
/// disk I/O completes in interrupts on the target's CPU, in bursts (25 samples within
/// 270 ms in one run of `split7030 2`, 4 in another), or a periodic kernel job lands
/// every 200 ms in one run and never in the next. Those are real differences of the
/// two recordings, not noise of the sampling; the comparison of all frames is printed.
fn same_program_pairs_show_no_change_beyond_noise() {
    let dir_of = |p: &Path| p.parent().unwrap().to_path_buf();
    let mut dirs = Vec::new();
    let (mut flagged_pairs, mut kernel_flagged_pairs) = (0, 0);
    for pair in 0..PAIRS {
        let (base, new) = (record_split(&[]), record_split(&[]));
        dirs.extend([dir_of(&base), dir_of(&new)]);
        let significant = |rows: &[Value]| -> Vec<String> {
            rows.iter()
                .filter(|r| r["significant"] == true)
                .map(|r| r["function"].as_str().unwrap().to_string())
                .collect()
        };
        let with_kernel = significant(&diff_json(&base, &new, &[]));
        let rows = diff_json(&base, &new, &["--user"]);
        // The statistic is at work: hot_a has its share in both, a delta, and an
        // interval around it at least as wide as the binomial spread of the two shares
        // at the level (wider where the samples were clustered), and much narrower
        // than the change a 50/50 run makes.
        let a = row(&rows, "hot_a");
        for key in ["base_total", "new_total"] {
            let share = number(a, key);
            assert!((55.0..85.0).contains(&share), "hot_a {key} {share}: {a}");
        }
        let interval = a["total_interval"].as_array().unwrap();
        let (low, high) = (interval[0].as_f64().unwrap(), interval[1].as_f64().unwrap());
        let delta = number(a, "delta_total");
        let z = sampler::calltree::diff::normal_quantile_two_sided(1.0 - number(a, "level"));
        let spread = |share: f64, n: f64| share / 100.0 * (1.0 - share / 100.0) / n;
        let width = 200.0
            * z
            * (spread(number(a, "base_total"), number(a, "base_samples"))
                + spread(number(a, "new_total"), number(a, "new_samples")))
            .sqrt();
        assert!(
            low < delta && delta < high && high - low > 0.9 * width && high - low < 40.0,
            "interval {low}..{high}, binomial width {width}: {a}"
        );
        let own = significant(&rows);
        eprintln!(
            "pair {pair}: hot_a {:.2}% -> {:.2}% ({delta:+.2} in [{low:+.2}, {high:+.2}], dispersion {}); beyond noise: {own:?}; with kernel frames: {with_kernel:?}",
            number(a, "base_total"),
            number(a, "new_total"),
            a["total_dispersion"]
        );
        flagged_pairs += usize::from(!own.is_empty());
        kernel_flagged_pairs += usize::from(!with_kernel.is_empty());
        assert!(
            own.is_empty(),
            "two recordings of split7030: changes beyond noise in {own:?}"
        );
    }
    eprintln!(
        "{flagged_pairs} of {PAIRS} same-program pairs flagged a function with --user; {kernel_flagged_pairs} with kernel frames"
    );
    dirs.iter()
        .for_each(|d| std::fs::remove_dir_all(d).unwrap());
}

/// The hue of the fill of the box of `function` in a flame graph.
fn hue_of(svg: &str, function: &str) -> u32 {
    let title = format!("<title>{function}");
    let at = svg
        .match_indices(&title)
        .map(|(at, _)| at)
        .find(|&at| svg[at + title.len()..].starts_with([' ', '\n']))
        .unwrap_or_else(|| panic!("no box of {function}"));
    let rest = &svg[at..];
    let fill = &rest[rest.find("fill=\"hsl(").unwrap() + 10..];
    fill[..fill.find(',').unwrap()].parse().unwrap()
}

fn seventy_thirty_against_fifty_fifty() {
    let base = record_split(&[]);
    let new = record_split(&["--even"]);
    let dir = tempdir();
    let rows = diff_json(&base, &new, &[]);
    let (a, b) = (row(&rows, "hot_a"), row(&rows, "hot_b"));
    eprintln!("hot_a: {a}\nhot_b: {b}");
    // sum_to is inlined into both and is their leaf: their change is in the total share.
    assert!(a["significant"] == true && a["total_significant"] == true);
    assert!(b["significant"] == true && b["total_significant"] == true);
    assert!(number(a, "delta_total") < -10.0 && number(b, "delta_total") > 10.0);
    for (r, want) in [(a, 50.0), (b, 50.0)] {
        let share = number(r, "new_total");
        assert!((share - want).abs() < 8.0, "{r}");
    }
    // Sorted by the size of significant change: the two come first.
    let first: Vec<&str> = rows[..2]
        .iter()
        .map(|r| r["function"].as_str().unwrap())
        .collect();
    assert!(
        first.contains(&"hot_a") && first.contains(&"hot_b"),
        "{first:?}"
    );

    let (base_arg, new_arg) = (base.display().to_string(), new.display().to_string());
    let table = succeeded("diff", &sampler(&[&base_arg, &new_arg]));
    eprintln!("{table}");
    let line = |f: &str| {
        table
            .lines()
            .find(|l| l.ends_with(&format!("  {f}")))
            .unwrap_or_else(|| panic!("no line of {f} in\n{table}"))
            .to_string()
    };
    assert!(line("hot_a").contains('*') && line("hot_b").contains('*'));

    // The differential flame graph: as wide as NEW, hot_a blue (shrank), hot_b red.
    let svg_path = dir.join("d.svg");
    let svg_arg = svg_path.display().to_string();
    succeeded(
        "diff -f svg",
        &sampler(&[&base_arg, &new_arg, "-f", "svg", "-o", &svg_arg]),
    );
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert_eq!(hue_of(&svg, "hot_a"), 220, "hot_a shrank: blue");
    assert_eq!(hue_of(&svg, "hot_b"), 0, "hot_b grew: red");
    let doc = roxmltree::Document::parse(&svg).expect("the SVG is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");

    // A flame graph never replaces a profile it compares.
    let named_svg = dir.join("base.svg");
    std::fs::copy(&base, &named_svg).unwrap();
    let named_arg = named_svg.display().to_string();
    let o = sampler(&[&named_arg, &new_arg, "-f", "svg", "-o", &named_arg]);
    assert!(!o.status.success() && stderr(&o).contains("is the profile"));
    assert_eq!(
        std::fs::read(&named_svg).unwrap(),
        std::fs::read(&base).unwrap()
    );

    // Folded with two counts: every line `stack base new`, summing to each profile's
    // samples.
    let folded = succeeded(
        "diff -f folded -o -",
        &sampler(&[&base_arg, &new_arg, "-f", "folded", "-o", "-"]),
    );
    let (mut base_sum, mut new_sum) = (0u64, 0u64);
    for l in folded.lines() {
        let mut fields = l.rsplitn(3, ' ');
        let n: u64 = fields.next().unwrap().parse().unwrap();
        let b: u64 = fields.next().unwrap().parse().unwrap();
        assert!(fields.next().is_some_and(|s| s.contains(';')), "{l}");
        new_sum += n;
        base_sum += b;
    }
    let samples = |p: &Path| sample_count(&load(p)) as u64;
    assert_eq!((base_sum, new_sum), (samples(&base), samples(&new)));
    assert!(folded
        .lines()
        .any(|l| l.contains(";outer;hot_a;") || l.contains(";outer;hot_a ")));

    for d in [base.parent().unwrap(), new.parent().unwrap(), &dir] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

fn main() {
    run_tests(tests![
        same_program_pairs_show_no_change_beyond_noise: Need::Perf;
        seventy_thirty_against_fifty_fifty: Need::Perf;
    ]);
}
