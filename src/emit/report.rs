//! The terminal report: a call tree drawn with guides, running and self samples with
//! percentages, names shortened to fit the width, and the per-line counts of a function.
//! Colour only when asked for (the command line asks when stdout is a terminal).

use std::fmt::Write as _;

use crate::calltree::lines::FunctionLines;
use std::path::Path;

use crate::calltree::{CallNodeIndex, CallTree, Transform};
use crate::profile::{off_cpu_ns, Profile, TimeView, WeightUnit};

#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// Columns to fit in; `None` for no limit.
    pub width: Option<usize>,
    pub color: bool,
    /// Deepest level shown (roots are level 1).
    pub max_depth: Option<usize>,
    /// Nodes whose running weight is below this share of the total are left out (and
    /// counted in a `…` line under their parent).
    pub min_percent: f64,
    /// Which time the tree weighs; `None`: the profile's default (wall-clock time when
    /// it has off-CPU time, else on-CPU samples).
    pub time: Option<TimeView>,
}

impl ReportOptions {
    /// What the weights drawn count (a tree is built in the view `time` says).
    fn unit(&self) -> WeightUnit {
        self.time.map_or(WeightUnit::Samples, TimeView::unit)
    }

    /// A weight as a column shows it: a count, or milliseconds for time.
    fn number(&self, weight: u64) -> String {
        match self.unit() {
            WeightUnit::Samples => weight.to_string(),
            WeightUnit::Nanoseconds => format!("{:.1}", weight as f64 / 1e6),
        }
    }

    /// A weight with its unit, for sentences.
    fn amount(&self, weight: u64) -> String {
        super::amount(self.unit(), weight)
    }
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            width: None,
            color: false,
            max_depth: None,
            min_percent: 0.0,
            time: None,
        }
    }
}

/// ANSI styles, used only when colour is on.
const RED: &str = "\x1b[31m";
const YELLOW: &str = "\x1b[33m";
const DIM: &str = "\x1b[2m";
const CYAN: &str = "\x1b[36m";
const RESET: &str = "\x1b[0m";

/// A share at or above this is drawn red; above [`WARM_PERCENT`] yellow.
const HOT_PERCENT: f64 = 20.0;
const WARM_PERCENT: f64 = 5.0;
/// The guides of a deep node never take more than this share of the width; deeper
/// levels are abbreviated to their depth number.
const MAX_GUIDE_SHARE: f64 = 0.5;
/// Without a width to fit, guides still stop growing here (40 levels), so that a tree
/// thousands of levels deep prints in time and memory linear in its depth.
const MAX_GUIDE_CHARS: usize = 120;
/// Names are never shortened below this many characters.
const MIN_NAME: usize = 12;

/// The threads that `selectors` name (a tid, a thread name, or a process name), in
/// profile order; every thread when there are none.
pub fn select_threads(profile: &Profile, selectors: &[String]) -> Result<Vec<usize>, String> {
    if selectors.is_empty() {
        return Ok((0..profile.threads.len()).collect());
    }
    let mut out = Vec::new();
    for sel in selectors {
        let tid: Option<i32> = sel.parse().ok();
        let mut matched: Vec<usize> = (0..profile.threads.len())
            .filter(|&i| Some(profile.threads[i].tid) == tid || profile.threads[i].name == *sel)
            .collect();
        if matched.is_empty() {
            matched = (0..profile.threads.len())
                .filter(|&i| profile.processes[profile.threads[i].process.index()].name == *sel)
                .collect();
        }
        if matched.is_empty() {
            let mut busiest: Vec<usize> = (0..profile.threads.len()).collect();
            busiest.sort_by_key(|&i| std::cmp::Reverse(profile.threads[i].samples.len()));
            let names: Vec<String> = busiest
                .iter()
                .take(8)
                .map(|&i| format!("{} ({})", profile.threads[i].name, profile.threads[i].tid))
                .collect();
            return Err(format!(
                "no thread or process named {sel}, and no thread with that tid (threads: {})",
                names.join(", ")
            ));
        }
        out.extend(matched);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn percent(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * part as f64 / total as f64
    }
}

fn paint(text: &str, style: &str, on: bool) -> String {
    if on && !style.is_empty() {
        format!("{style}{text}{RESET}")
    } else {
        text.to_string()
    }
}

fn heat(p: f64) -> &'static str {
    if p >= HOT_PERCENT {
        RED
    } else if p >= WARM_PERCENT {
        YELLOW
    } else {
        ""
    }
}

/// Replaces each outermost bracketed part that starts with `open` by `open…close`.
fn collapse_brackets(name: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(name.len());
    let mut depth = 0usize;
    for c in name.chars() {
        if c == open {
            if depth == 0 {
                out.push(open);
                out.push('…');
            }
            depth += 1;
        } else if c == close && depth > 0 {
            depth -= 1;
            if depth == 0 {
                out.push(close);
            }
        } else if depth == 0 {
            out.push(c);
        }
    }
    out
}

/// `name` in at most `max` characters: first without parameter lists, then without
/// template or generic arguments, then cut, keeping the end of a `::` path (its most
/// specific part) or the start of anything else.
pub fn shorten(name: &str, max: usize) -> String {
    let max = max.max(MIN_NAME);
    let len = |s: &str| s.chars().count();
    if len(name) <= max {
        return name.to_string();
    }
    let no_params = collapse_brackets(name, '(', ')');
    if len(&no_params) <= max {
        return no_params;
    }
    let short = collapse_brackets(&no_params, '<', '>');
    if len(&short) <= max {
        return short;
    }
    let chars: Vec<char> = short.chars().collect();
    if short.contains("::") {
        let tail: String = chars[chars.len() - (max - 1)..].iter().collect();
        format!("…{tail}")
    } else {
        let head: String = chars[..max - 1].iter().collect();
        format!("{head}…")
    }
}

/// Draws a call tree: a header line, then one line per node shown.
pub fn render_tree(tree: &CallTree, opts: &ReportOptions, out: &mut String) {
    let total = tree.total();
    let digits = opts.number(total).len().max(4);
    let _ = writeln!(
        out,
        "{:>w$} {:>6}  {:>w$} {:>6}  {}",
        "running",
        "%",
        "self",
        "%",
        if tree.inverted {
            "function ← callers (bottom-up)"
        } else {
            "call tree"
        },
        w = digits.max(7)
    );
    let mut r = TreeRenderer {
        tree,
        opts,
        total,
        digits: digits.max(7),
        out,
    };
    let roots = r.visible(&tree.roots);
    let hidden = tree.roots.len() - roots.len();
    for (i, &root) in roots.iter().enumerate() {
        let last = i + 1 == roots.len() && hidden == 0;
        r.subtree(root, last);
    }
    r.hidden_line(&tree.roots[roots.len()..], None);
}

/// One step of the depth-first walk that draws a subtree (a loop over an explicit stack:
/// a tree may be tens of thousands of levels deep).
enum Step<'t> {
    /// Draw this node and schedule its children.
    Node {
        id: CallNodeIndex,
        depth: usize,
        last: bool,
        parent_lib: Option<&'t str>,
    },
    /// After a node's children: the `…` line for those left out, and the guides back to
    /// this many levels.
    Close {
        hidden: &'t [CallNodeIndex],
        levels_len: usize,
    },
}

struct TreeRenderer<'a> {
    tree: &'a CallTree,
    opts: &'a ReportOptions,
    total: u64,
    digits: usize,
    out: &'a mut String,
}

impl TreeRenderer<'_> {
    /// The children worth a line (children are sorted heaviest first, so they are a
    /// prefix of the list).
    fn visible(&self, nodes: &[CallNodeIndex]) -> Vec<CallNodeIndex> {
        nodes
            .iter()
            .copied()
            .take_while(|&n| {
                percent(self.tree.node(n).running_weight, self.total) >= self.opts.min_percent
            })
            .collect()
    }

    fn columns(&self, running: u64, self_w: u64) -> String {
        let (rp, sp) = (percent(running, self.total), percent(self_w, self.total));
        let c = self.opts.color;
        format!(
            "{:>w$} {}  {:>w$} {}  ",
            self.opts.number(running),
            paint(&format!("{rp:5.1}%"), heat(rp), c),
            self.opts.number(self_w),
            paint(&format!("{sp:5.1}%"), heat(sp), c),
            w = self.digits
        )
    }

    /// The guide text for a node: a column per ancestor level (`levels[i]`: whether the
    /// ancestor at that level was its parent's last child), then `connector`. When that
    /// would take too much of the width (or, with none, [`MAX_GUIDE_CHARS`]), it is the
    /// depth number and the last levels. Costs the length of what is shown, whatever the
    /// depth.
    fn guides(&self, levels: &[bool], connector: &str, depth: usize) -> String {
        let cap = self
            .opts
            .width
            .map_or(MAX_GUIDE_CHARS, |w| (w as f64 * MAX_GUIDE_SHARE) as usize);
        let column = |&last: &bool| if last { "   " } else { "│  " };
        let length = levels.len() * 3 + connector.chars().count();
        if length <= cap {
            let mut text: String = levels.iter().map(column).collect();
            text.push_str(connector);
            return text;
        }
        let mark = format!("[{depth}]");
        let room = cap.saturating_sub(mark.len() + connector.chars().count());
        let shown = (room / 3).min(levels.len());
        let mut text = mark;
        text.extend(levels[levels.len() - shown..].iter().map(column));
        text.push_str(connector);
        text
    }

    /// Draws `root` and, depth first, what is shown of its subtree.
    fn subtree(&mut self, root: CallNodeIndex, last: bool) {
        let tree = self.tree;
        // Per ancestor level below the root: whether it was its parent's last child.
        let mut levels: Vec<bool> = Vec::new();
        let mut stack = vec![Step::Node {
            id: root,
            depth: 1,
            last,
            parent_lib: None,
        }];
        while let Some(step) = stack.pop() {
            match step {
                Step::Close { hidden, levels_len } => {
                    if !hidden.is_empty() {
                        let guides = self.guides(&levels, "└─ ", levels.len() + 1);
                        self.hidden_line(hidden, Some(&guides));
                    }
                    levels.truncate(levels_len);
                }
                Step::Node {
                    id,
                    depth,
                    last,
                    parent_lib,
                } => {
                    let root = depth == 1;
                    self.line(id, &levels, depth, last, root, parent_lib);
                    if self.opts.max_depth.is_some_and(|d| depth >= d) {
                        continue;
                    }
                    let n = tree.node(id);
                    let kids = self.visible(&n.children);
                    let hidden = &n.children[kids.len()..];
                    stack.push(Step::Close {
                        hidden,
                        levels_len: levels.len(),
                    });
                    if !root {
                        levels.push(last);
                    }
                    let lib_here = tree.func(id).lib.as_deref().or(parent_lib);
                    for (i, &k) in kids.iter().enumerate().rev() {
                        stack.push(Step::Node {
                            id: k,
                            depth: depth + 1,
                            last: i + 1 == kids.len() && hidden.is_empty(),
                            parent_lib: lib_here,
                        });
                    }
                }
            }
        }
    }

    /// The line of one node.
    fn line(
        &mut self,
        id: CallNodeIndex,
        levels: &[bool],
        depth: usize,
        last: bool,
        root: bool,
        parent_lib: Option<&str>,
    ) {
        let n = self.tree.node(id);
        let func = self.tree.func(id);
        let connector = match (root, last) {
            (true, _) => "",
            (false, true) => "└─ ",
            (false, false) => "├─ ",
        };
        let guides = self.guides(levels, connector, depth);
        let columns = self.columns(n.running_weight, n.self_weight);
        // The library is named where it changes, so runs of one library stay readable.
        let lib = func
            .lib
            .as_deref()
            .filter(|&l| Some(l) != parent_lib && l != func.name);
        let inlined = if n.inlined { " (inlined)" } else { "" };
        let lib_text = lib.map(|l| format!("  {l}")).unwrap_or_default();
        let used = self.digits * 2 + 18 + guides.chars().count();
        let name = match self.opts.width {
            Some(w) => shorten(
                &func.name,
                w.saturating_sub(used + inlined.len() + lib_text.chars().count()),
            ),
            None => func.name.clone(),
        };
        let c = self.opts.color;
        let _ = writeln!(
            self.out,
            "{columns}{}{name}{}{}",
            paint(&guides, DIM, c),
            paint(inlined, CYAN, c),
            paint(&lib_text, DIM, c)
        );
    }

    /// One `…` line for the children left out by `--min-percent`, after `guides` (for
    /// roots, `None`: they have no guides).
    fn hidden_line(&mut self, hidden: &[CallNodeIndex], guides: Option<&str>) {
        if hidden.is_empty() {
            return;
        }
        let weight: u64 = hidden
            .iter()
            .map(|&h| self.tree.node(h).running_weight)
            .sum();
        let blank = " ".repeat(self.digits * 2 + 18);
        let _ = writeln!(
            self.out,
            "{blank}{}{}",
            paint(guides.unwrap_or(""), DIM, self.opts.color),
            paint(
                &format!(
                    "… {} more, {} ({:.1}%), each below {}%",
                    hidden.len(),
                    self.opts.amount(weight),
                    percent(weight, self.total),
                    self.opts.min_percent
                ),
                DIM,
                self.opts.color
            )
        );
    }
}

/// Draws the per-line counts of functions; `source` gives a file's line text where the
/// source file can be read.
pub fn render_lines(
    functions: &[FunctionLines],
    total: u64,
    opts: &ReportOptions,
    source: &dyn Fn(&str, u32) -> Option<String>,
    out: &mut String,
) {
    for f in functions {
        let place = match (&f.file, &f.lib) {
            (Some(file), Some(lib)) => format!("  {file} in {lib}"),
            (Some(file), None) => format!("  {file}"),
            (None, Some(lib)) => format!("  {lib}"),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "{}{}\n  running {} ({:.1}%), self {} ({:.1}%)",
            f.name,
            paint(&place, DIM, opts.color),
            opts.amount(f.running_weight),
            percent(f.running_weight, total),
            opts.amount(f.self_weight),
            percent(f.self_weight, total)
        );
        let w = opts.number(total).len().max(7);
        let _ = writeln!(
            out,
            "{:>6}  {:>w$} {:>6}  {:>w$} {:>6}  source",
            "line", "running", "%", "self", "%"
        );
        for row in &f.rows {
            let line = row.line.map_or("?".to_string(), |l| l.to_string());
            let text = match (&f.file, row.line) {
                (Some(file), Some(l)) => source(file, l).unwrap_or_default(),
                _ => String::new(),
            };
            let mut text = text.trim_end().replace('\t', "    ");
            let used = 6 + 2 + (w + 7) * 2 + 2 + 2;
            if let Some(width) = opts.width {
                let room = width.saturating_sub(used);
                if text.chars().count() > room {
                    text = text
                        .chars()
                        .take(room.saturating_sub(1))
                        .collect::<String>()
                        + "…";
                }
            }
            let (rp, sp) = (
                percent(row.running_weight, total),
                percent(row.self_weight, total),
            );
            let _ = writeln!(
                out,
                "{line:>6}  {:>w$} {}  {:>w$} {}  {}",
                opts.number(row.running_weight),
                paint(&format!("{rp:5.1}%"), heat(rp), opts.color),
                opts.number(row.self_weight),
                paint(&format!("{sp:5.1}%"), heat(sp), opts.color),
                paint(&text, DIM, opts.color)
            );
        }
        out.push('\n');
    }
}

/// What `sampler report` was asked to show, checked.
pub struct ReportRequest<'a> {
    /// The file's name, for the heading.
    pub file: &'a Path,
    /// Threads by tid, name or process name (none: all).
    pub threads: &'a [String],
    pub per_thread: bool,
    /// Per-line counts of this function instead of the tree.
    pub lines: Option<&'a str>,
    pub transforms: &'a [Transform],
    pub invert: bool,
    pub options: ReportOptions,
}

/// The whole report as text: a heading, then for each group of threads (all merged, or
/// one per thread) its tree after the transforms, or its function's lines.
/// `source_line(file, line)` gives a source line's text where it can be read.
pub fn render_report(
    profile: &Profile,
    request: &ReportRequest<'_>,
    source_line: &dyn Fn(&str, u32) -> Option<String>,
) -> Result<String, String> {
    let threads = select_threads(profile, request.threads)?;
    let groups: Vec<Vec<usize>> = if request.per_thread {
        threads
            .iter()
            .filter(|&&t| !profile.threads[t].samples.is_empty())
            .map(|&t| vec![t])
            .collect()
    } else {
        vec![threads]
    };
    let m = &profile.meta;
    let view = request
        .options
        .time
        .unwrap_or_else(|| TimeView::default_for(m));
    if view != TimeView::Cpu && !m.off_cpu {
        return Err(format!(
            "{} has no off-CPU time (record with --off-cpu); only --time cpu can be shown",
            request.file.display()
        ));
    }
    let opts = &ReportOptions {
        time: Some(view),
        ..request.options.clone()
    };
    let interval_ns = m.interval_ns();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: {} ({}, {:.2} s){}",
        request.file.display(),
        m.event,
        match m.period {
            Some(_) => m.rate_text(),
            None => format!("{}; weighed by each sample's period", m.rate_text()),
        },
        m.duration_ms / 1000.0,
        if m.off_cpu {
            format!("; showing {} (--time cpu|off-cpu|wall)", view.name())
        } else {
            String::new()
        }
    );
    for group in groups {
        let rows = || group.iter().flat_map(|&t| &profile.threads[t].samples);
        let samples: u64 = rows().map(|s| view.weight(s.weight, interval_ns)).sum();
        let on_cpu: u64 = rows()
            .map(|s| TimeView::Cpu.weight(s.weight, interval_ns))
            .sum();
        let who = match group.as_slice() {
            [t] => {
                let th = &profile.threads[*t];
                let process = &profile.processes[th.process.index()];
                format!(
                    "thread {} (tid {}) of {} (pid {})",
                    th.name, th.tid, process.name, process.pid
                )
            }
            many => {
                let processes: std::collections::BTreeSet<_> =
                    many.iter().map(|&t| profile.threads[t].process).collect();
                format!(
                    "{} threads in {} processes, merged",
                    many.len(),
                    processes.len()
                )
            }
        };
        if m.off_cpu {
            let [blocked, preempted] = off_cpu_ns(rows());
            let _ = writeln!(
                out,
                "{who}: {on_cpu} samples on the CPU ({} ms), {} ms off it ({} ms blocked, {} ms preempted)",
                super::ms_text(on_cpu * interval_ns),
                super::ms_text(blocked + preempted),
                super::ms_text(blocked),
                super::ms_text(preempted),
            );
        } else {
            let _ = writeln!(out, "{who}: {samples} {}", m.on_cpu_unit());
        }
        if let Some(func) = request.lines {
            let lines = crate::calltree::lines::function_lines(profile, &group, func, view)?;
            render_lines(&lines, samples, opts, source_line, &mut out);
            continue;
        }
        let tree = crate::calltree::transform::apply_all(
            CallTree::build(profile, &group, view),
            request.transforms,
        )?;
        if !request.transforms.is_empty() {
            let names: Vec<String> = request.transforms.iter().map(|t| t.to_string()).collect();
            let _ = writeln!(
                out,
                "after {}: {} of {}",
                names.join(", then "),
                opts.number(tree.total()),
                opts.amount(samples)
            );
        }
        let tree = if request.invert {
            tree.inverted()
        } else {
            tree
        };
        render_tree(&tree, opts, &mut out);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn seed_tree() -> CallTree {
        CallTree::all_threads(&Profile::from_named_stacks(&[
            &["A", "B", "C", "D", "E"],
            &["A", "B", "C", "F", "G"],
            &["A", "B", "H", "F"],
        ]))
    }

    #[test]
    fn draws_the_seed_tree_with_guides() {
        let mut out = String::new();
        render_tree(&seed_tree(), &ReportOptions::default(), &mut out);
        let expected = "\
running      %     self      %  call tree
      3 100.0%        0   0.0%  A
      3 100.0%        0   0.0%  └─ B
      2  66.7%        0   0.0%     ├─ C
      1  33.3%        0   0.0%     │  ├─ D
      1  33.3%        1  33.3%     │  │  └─ E
      1  33.3%        0   0.0%     │  └─ F
      1  33.3%        1  33.3%     │     └─ G
      1  33.3%        0   0.0%     └─ H
      1  33.3%        1  33.3%        └─ F
";
        assert_eq!(out, expected);
    }

    #[test]
    fn depth_and_min_percent_leave_nodes_out_visibly() {
        let p = Profile::from_named_stacks(&[
            &["main", "big"],
            &["main", "big"],
            &["main", "big"],
            &["main", "tiny1"],
            &["main", "tiny2"],
        ]);
        let tree = CallTree::all_threads(&p);
        let mut out = String::new();
        let opts = ReportOptions {
            min_percent: 30.0,
            ..ReportOptions::default()
        };
        render_tree(&tree, &opts, &mut out);
        let expected = "\
running      %     self      %  call tree
      5 100.0%        0   0.0%  main
      3  60.0%        3  60.0%  ├─ big
                                └─ … 2 more, 2 samples (40.0%), each below 30%
";
        assert_eq!(out, expected);
        let mut out = String::new();
        let opts = ReportOptions {
            max_depth: Some(1),
            ..ReportOptions::default()
        };
        render_tree(&tree, &opts, &mut out);
        assert_eq!(out.lines().count(), 2, "{out}");
    }

    #[test]
    fn colour_only_when_asked() {
        let mut plain = String::new();
        render_tree(&seed_tree(), &ReportOptions::default(), &mut plain);
        assert!(!plain.contains('\x1b'));
        let mut coloured = String::new();
        let opts = ReportOptions {
            color: true,
            ..ReportOptions::default()
        };
        render_tree(&seed_tree(), &opts, &mut coloured);
        assert!(coloured.contains(RED));
    }

    #[test]
    fn names_shorten_sensibly() {
        let cpp = "std::_Hash_bytes(void const*, unsigned long, unsigned long)";
        assert_eq!(shorten(cpp, 80), cpp);
        assert_eq!(shorten(cpp, 30), "std::_Hash_bytes(…)");
        let rust = "<alloc::vec::Vec<T,A> as core::ops::drop::Drop>::drop";
        assert_eq!(shorten(rust, 20), "<…>::drop");
        let long = "std::collections::hash::map::HashMap<K,V,S>::insert_with_some_long_name";
        let s = shorten(long, 30);
        assert_eq!(s.chars().count(), 30);
        assert!(
            s.starts_with('…') && s.ends_with("insert_with_some_long_name"),
            "{s}"
        );
        let plain = "a_very_long_c_function_name_without_any_namespaces";
        assert_eq!(shorten(plain, 20), "a_very_long_c_funct…");
    }

    #[test]
    fn lines_fit_the_width_on_a_deep_tree() {
        let path: Vec<String> = (0..200)
            .map(|i| format!("recursive_function_{i}"))
            .collect();
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        let p = Profile::from_named_stacks(&[&refs]);
        let mut out = String::new();
        let opts = ReportOptions {
            width: Some(100),
            ..ReportOptions::default()
        };
        render_tree(&CallTree::all_threads(&p), &opts, &mut out);
        assert_eq!(out.lines().count(), 201);
        for line in out.lines() {
            assert!(line.chars().count() <= 100, "{line}");
        }
        assert!(out.lines().last().unwrap().contains("[200]"));
    }
}
