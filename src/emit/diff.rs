//! The outputs of `sampler diff BASE NEW`: the comparison of [`crate::calltree::diff`]
//! as a terminal table or JSON, and the differential flame graph, as folded stacks with
//! two counts (`stack base new`, what Brendan Gregg's difffolded.pl writes and
//! flamegraph.pl and inferno read) or as an SVG made by the flame graph's own renderer
//! ([`super::svg::render`]): boxes as wide as NEW's samples, red where a call path's
//! share grew since BASE, blue where it shrank.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{json, Value};

use super::svg::{self, Canvas, FlameBox};
use crate::calltree::diff::{Comparison, ShareChange, FAMILY_ALPHA};
use crate::calltree::CallTree;
use crate::profile::{Profile, TimeView};

/// How the table is drawn.
#[derive(Clone, Debug, Default)]
pub struct TableOptions {
    /// Columns to fit in (the function names are shortened); `None` for no limit.
    pub width: Option<usize>,
    pub color: bool,
    /// Functions whose four shares are all below this percentage, and whose change is
    /// within noise, are counted in one line instead of shown.
    pub min_percent: f64,
}

/// ANSI styles for a change that is beyond noise, used only when colour is on: red
/// for growth, blue for shrinking, as the flame graph colours them.
const GREW: &str = "\x1b[31m";
const SHRANK: &str = "\x1b[34m";
const RESET: &str = "\x1b[0m";

/// The columns before the function name: two groups (self, total) of base, new,
/// change and interval.
const SHARE_COLUMNS: usize = 2 * (7 + 7 + 9 + 18) + 2;

/// `base` and `new` name the profiles in the heading.
pub fn render_table(c: &Comparison, base: &str, new: &str, opts: &TableOptions) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "BASE {base} ({:.0} samples), NEW {new} ({:.0} samples)",
        c.base_samples, c.new_samples
    );
    let significant = c.functions.iter().filter(|f| f.significant()).count();
    let _ = writeln!(
        out,
        "{significant} of {} functions changed beyond noise (* : the {:.4}% interval of the change leaves out 0; {:.0}% chance of any false alarm over the {} tests)",
        c.functions.len(),
        100.0 * c.level,
        100.0 * FAMILY_ALPHA,
        c.tests
    );
    let _ = writeln!(
        out,
        "{:>7}{:>7}{:>9}{:>18}  {:>7}{:>7}{:>9}{:>18}  function",
        "self%", "", "", "", "total%", "", "", ""
    );
    let _ = writeln!(
        out,
        "{:>7}{:>7}{:>9}{:>18}  {:>7}{:>7}{:>9}{:>18}",
        "base", "new", "change", "interval", "base", "new", "change", "interval"
    );
    let name_width = opts.width.map(|w| w.saturating_sub(SHARE_COLUMNS));
    let mut hidden = 0usize;
    for f in &c.functions {
        let (s, t) = (&f.self_share, &f.total_share);
        let largest = [s.base, s.new, t.base, t.new]
            .into_iter()
            .fold(0.0, f64::max);
        if !f.significant() && largest < opts.min_percent {
            hidden += 1;
            continue;
        }
        let name = match name_width {
            Some(w) => super::report::shorten(&f.function, w),
            None => f.function.clone(),
        };
        let _ = writeln!(
            out,
            "{}  {}  {name}",
            share_columns(s, opts.color),
            share_columns(t, opts.color)
        );
    }
    if hidden > 0 {
        let _ = writeln!(
            out,
            "… {hidden} more functions below {}%, none changed beyond noise",
            opts.min_percent
        );
    }
    out
}

/// Base, new, change (with `*` when beyond noise) and interval of one share; a share
/// that is 0 in both has neither change nor interval.
fn share_columns(c: &ShareChange, color: bool) -> String {
    if c.base == 0.0 && c.new == 0.0 {
        return format!("{:>7.2}{:>7.2}{:>27}", 0.0, 0.0, "");
    }
    let mark = if c.significant() { "*" } else { " " };
    let change = format!("{:>+8.2}{mark}", c.delta);
    let change = match (color && c.significant(), c.delta > 0.0) {
        (false, _) => change,
        (true, true) => format!("{GREW}{change}{RESET}"),
        (true, false) => format!("{SHRANK}{change}{RESET}"),
    };
    format!(
        "{:>7.2}{:>7.2}{change}{:>18}",
        c.base,
        c.new,
        format!("[{:+.2}, {:+.2}]", c.low, c.high)
    )
}

/// The comparison as a JSON array, one object per function in the table's order;
/// shares, changes and intervals in percent of each profile's weight.
pub fn to_json(c: &Comparison) -> Value {
    let rows: Vec<Value> = c
        .functions
        .iter()
        .map(|f| {
            let (s, t) = (&f.self_share, &f.total_share);
            json!({
                "function": f.function,
                "base_self": s.base,
                "new_self": s.new,
                "base_total": t.base,
                "new_total": t.new,
                "delta_self": s.delta,
                "delta_total": t.delta,
                "self_interval": [s.low, s.high],
                "total_interval": [t.low, t.high],
                "self_dispersion": [s.base_dispersion, s.new_dispersion],
                "total_dispersion": [t.base_dispersion, t.new_dispersion],
                "self_significant": s.significant(),
                "total_significant": t.significant(),
                "significant": f.significant(),
                "level": c.level,
                "base_samples": c.base_samples,
                "new_samples": c.new_samples,
            })
        })
        .collect();
    Value::Array(rows)
}

/// Both profiles' folded stacks in one: `stack base new` per stack that either has,
/// sorted (difffolded.pl's format; weights as [`super::folded::folded_stacks`] gives).
pub fn diff_folded(base: &Profile, new: &Profile, view: TimeView) -> String {
    let b = super::folded::folded_stacks(base, false, view);
    let n = super::folded::folded_stacks(new, false, view);
    let mut stacks: Vec<&String> = b.keys().chain(n.keys()).collect();
    stacks.sort_unstable();
    stacks.dedup();
    let mut out = String::new();
    for stack in stacks {
        let weight = |m: &std::collections::BTreeMap<String, u64>| m.get(stack).copied();
        let _ = writeln!(
            out,
            "{stack} {} {}",
            weight(&b).unwrap_or(0),
            weight(&n).unwrap_or(0)
        );
    }
    out
}

/// Hues of growth (red) and shrinking (blue).
const HUE_GREW: u32 = 0;
const HUE_SHRANK: u32 = 220;
/// A box whose share did not change.
const SAME: &str = "hsl(0,0%,90%)";

/// The fill of a box whose running share changed by `delta` points, `largest` being the
/// largest change of any box: lightness from 95% (no change) to 50% (the largest).
fn change_colour(delta: f64, largest: f64) -> String {
    if delta == 0.0 || largest <= 0.0 {
        return SAME.to_string();
    }
    let strength = (delta.abs() / largest).min(1.0);
    let hue = if delta > 0.0 { HUE_GREW } else { HUE_SHRANK };
    format!("hsl({hue},80%,{:.0}%)", 95.0 - 45.0 * strength)
}

/// The differential flame graph: NEW's flame graph, each box coloured by how its call
/// path's running share changed since BASE (a path BASE lacks grew from 0).
pub fn diff_svg(
    base: &Profile,
    new: &Profile,
    view: TimeView,
    base_name: &str,
    new_name: &str,
) -> String {
    let boxes = svg::layout(new, false, view);
    let new_total = boxes.first().map_or(0, |b| b.samples);
    let base_tree = CallTree::all_threads_in(base, view);
    let mut base_by_path: HashMap<Vec<&str>, u64> = HashMap::new();
    for i in 0..base_tree.nodes.len() {
        let id = crate::calltree::CallNodeIndex::new(i);
        *base_by_path.entry(base_tree.path(id)).or_default() += base_tree.node(id).running_weight;
    }
    let paths = box_paths(&boxes);
    let mut new_by_path: HashMap<&[&str], u64> = HashMap::new();
    for (path, b) in paths.iter().zip(&boxes).skip(1) {
        *new_by_path.entry(path.as_slice()).or_default() += b.samples;
    }
    let share = |w: u64, total: u64| match total {
        0 => 0.0,
        t => 100.0 * w as f64 / t as f64,
    };
    let shares: Vec<(f64, f64)> = paths
        .iter()
        .enumerate()
        .map(|(i, path)| match i {
            0 => (100.0, 100.0),
            _ => (
                share(
                    base_by_path.get(path).copied().unwrap_or(0),
                    base_tree.total(),
                ),
                share(new_by_path[path.as_slice()], new_total),
            ),
        })
        .collect();
    let largest = shares
        .iter()
        .map(|(b, n)| (n - b).abs())
        .fold(0.0, f64::max);
    let samples = |n: u64| super::amount(view.unit(), n);
    svg::render(
        &boxes,
        &Canvas {
            title: format!("sampler diff: {base_name} → {new_name}"),
            subtitle: format!(
                "box width = NEW's running {} ({}); colour = change of the running share since BASE ({}), strongest at {largest:.2} points",
                match view.unit() {
                    crate::profile::WeightUnit::Samples => "samples",
                    crate::profile::WeightUnit::Nanoseconds => "time",
                },
                samples(new_total),
                samples(base_tree.total()),
            ),
            legend: vec![
                (change_colour(1.0, 1.0), "grew".into()),
                (change_colour(-1.0, 1.0), "shrank".into()),
                (SAME.into(), "same share".into()),
            ],
            unit: view.unit(),
            colour: &|i, _| change_colour(shares[i].1 - shares[i].0, largest),
            note: &|i, _| {
                let (b, n) = shares[i];
                format!(
                    "running share: BASE {b:.2}%, NEW {n:.2}% ({:+.2} points)",
                    n - b
                )
            },
        },
    )
}

/// Each box's call path (names, root first, without the `all` box), from the layout's
/// depth-first order: a box's ancestors are the last boxes seen at each lower depth.
fn box_paths(boxes: &[FlameBox]) -> Vec<Vec<&str>> {
    let mut at: Vec<&str> = Vec::new();
    boxes
        .iter()
        .map(|b| {
            // Depth 0 is the `all` box; a function at depth d has d - 1 callers.
            at.truncate(b.depth.saturating_sub(1));
            if b.depth > 0 {
                at.push(&b.name);
            }
            at.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calltree::diff::{compare, FunctionWeights};

    fn profiles() -> (Profile, Profile) {
        let mut base: Vec<&[&str]> = vec![&["main", "outer", "hot_a"]; 700];
        base.extend(vec![&["main", "outer", "hot_b"] as &[&str]; 300]);
        let mut new: Vec<&[&str]> = vec![&["main", "outer", "hot_a"]; 500];
        new.extend(vec![&["main", "outer", "hot_b"] as &[&str]; 500]);
        new.push(&["main", "fresh"]);
        (
            Profile::from_named_stacks(&base),
            Profile::from_named_stacks(&new),
        )
    }

    #[test]
    fn folded_has_both_counts() {
        let (base, new) = profiles();
        assert_eq!(
            diff_folded(&base, &new, TimeView::Cpu),
            "main;fresh 0 1\nmain;outer;hot_a 700 500\nmain;outer;hot_b 300 500\n"
        );
    }

    /// The fill of the box named `name` in an SVG.
    fn fill_of<'a>(svg: &'a str, name: &str) -> &'a str {
        let start = svg.find(&format!("<title>{name}\n")).expect(name);
        let rest = &svg[start..];
        let fill = rest.find("fill=\"").unwrap() + 6;
        &rest[fill..fill + rest[fill..].find('"').unwrap()]
    }

    #[test]
    fn svg_colours_by_change() {
        let (base, new) = profiles();
        let svg = diff_svg(&base, &new, TimeView::Cpu, "a", "b");
        // 70% to 500/1001: shrank most (blue, darkest); 30% to 500/1001: grew (red).
        assert_eq!(fill_of(&svg, "hot_a"), "hsl(220,80%,50%)");
        assert!(fill_of(&svg, "hot_b").starts_with("hsl(0,80%,"));
        assert!(fill_of(&svg, "fresh").starts_with("hsl(0,80%,9"));
        assert!(svg.contains("running share: BASE 70.00%, NEW 49.95% (-20.05 points)"));
        assert!(
            svg.contains(r#"width="1180.000""#),
            "NEW's total is the width"
        );
    }

    #[test]
    fn table_and_json() {
        let (base, new) = profiles();
        let c = compare(
            &FunctionWeights::of(&base, TimeView::Cpu, false),
            &FunctionWeights::of(&new, TimeView::Cpu, false),
        );
        let table = render_table(&c, "a", "b", &TableOptions::default());
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("BASE a (1000 samples), NEW b (1001 samples)"));
        assert!(lines[4].ends_with("  hot_a"), "{table}");
        assert!(lines[4].contains("-20.05*"), "{table}");
        let json = to_json(&c);
        let a = &json[0];
        assert_eq!(a["function"], "hot_a");
        assert_eq!(a["significant"], true);
        assert_eq!(a["base_self"], 70.0);
        let hidden = render_table(
            &c,
            "a",
            "b",
            &TableOptions {
                min_percent: 5.0,
                ..TableOptions::default()
            },
        );
        assert!(hidden.ends_with("… 1 more functions below 5%, none changed beyond noise\n"));
    }
}
