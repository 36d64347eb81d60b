//! A flame graph as one self-contained SVG file that a browser opens: the call tree of
//! every thread merged (or, with thread roots, side by side under their process and
//! thread), roots at the bottom, each box as wide as its running samples, a tooltip
//! with its counts, and a colour per library with a legend.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::calltree::{CallNodeIndex, CallTree};
use crate::profile::{CodeKind, Profile, TimeView, WeightUnit};

/// Pixel width of the image, and the margin on each side.
const WIDTH: f64 = 1200.0;
const MARGIN: f64 = 10.0;
/// Height of one frame row, and the font size that fits in it.
const ROW: f64 = 16.0;
const FONT_SIZE: f64 = 12.0;
/// Average width of a character of the monospace font at [`FONT_SIZE`].
const CHAR_WIDTH: f64 = 7.2;
/// Space above the frames for the title, the subtitle and the legend.
const HEADER: f64 = 72.0;
/// How many libraries the legend names (the ones with most samples).
const LEGEND_LIBS: usize = 8;

/// One box of the flame graph.
#[derive(Clone, Debug, PartialEq)]
pub struct FlameBox {
    /// Row from the bottom; the `all` box is row 0.
    pub depth: usize,
    /// Sample offset of the left edge, and width in samples.
    pub start: u64,
    pub samples: u64,
    pub self_samples: u64,
    pub name: String,
    pub lib: Option<String>,
    pub kind: CodeKind,
    pub inlined: bool,
}

/// Lays out the boxes: an `all` root, optionally process and thread rows, then each
/// call tree.
pub fn layout(profile: &Profile, thread_roots: bool, view: TimeView) -> Vec<FlameBox> {
    let mut boxes = Vec::new();
    let label = |depth, start, samples, name: String| FlameBox {
        depth,
        start,
        samples,
        self_samples: 0,
        name,
        lib: None,
        kind: CodeKind::Marker,
        inlined: false,
    };
    if !thread_roots {
        let tree = CallTree::all_threads_in(profile, view);
        boxes.push(label(0, 0, tree.total(), "all".into()));
        add_tree(&tree, 0, 1, &mut boxes);
        return boxes;
    }
    let mut offset = 0;
    let mut processes: Vec<FlameBox> = Vec::new();
    for (i, t) in profile.threads.iter().enumerate() {
        let tree = CallTree::build(profile, &[i], view);
        let total = tree.total();
        if total == 0 {
            continue;
        }
        let p = &profile.processes[t.process.index()];
        let process_name = format!("{} ({})", p.name, p.pid);
        match processes.last_mut() {
            Some(last) if last.name == process_name && last.start + last.samples == offset => {
                last.samples += total
            }
            _ => processes.push(label(1, offset, total, process_name)),
        }
        boxes.push(label(2, offset, total, format!("{} ({})", t.name, t.tid)));
        add_tree(&tree, offset, 3, &mut boxes);
        offset += total;
    }
    boxes.insert(0, label(0, 0, offset, "all".into()));
    boxes.extend(processes);
    boxes
}

/// Adds a tree's boxes, its roots at row `depth`, starting at sample `offset`.
fn add_tree(tree: &CallTree, offset: u64, depth: usize, boxes: &mut Vec<FlameBox>) {
    // Explicit stack: recursions thousands deep would overflow the thread's stack.
    let mut todo: Vec<(CallNodeIndex, u64, usize)> = Vec::new();
    let mut at = offset;
    for &r in &tree.roots {
        todo.push((r, at, depth));
        at += tree.node(r).running_weight;
    }
    while let Some((id, start, d)) = todo.pop() {
        let n = tree.node(id);
        let f = tree.func(id);
        boxes.push(FlameBox {
            depth: d,
            start,
            samples: n.running_weight,
            self_samples: n.self_weight,
            name: f.name.clone(),
            lib: f.lib.clone(),
            kind: f.kind,
            inlined: n.inlined,
        });
        let mut child_start = start;
        for &c in &n.children {
            todo.push((c, child_start, d + 1));
            child_start += tree.node(c).running_weight;
        }
    }
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// FNV-1a, for stable colours from names.
fn hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Hues of the libraries with most samples, far apart on the colour wheel (orange, the
/// kernel's, left out); libraries past these get a hue from their name.
const PALETTE: [u64; 10] = [200, 120, 280, 50, 340, 170, 240, 80, 310, 0];

/// The box's colour: its library's hue, its lightness varied a little by function so
/// that neighbours stand apart. Kernel code is orange, sampler's own rows and markers
/// grey.
fn colour(b: &FlameBox, hues: &HashMap<&str, u64>) -> String {
    match (b.kind, &b.lib) {
        (CodeKind::Kernel, _) => format!("hsl(25,85%,{}%)", 55 + hash(&b.name) % 10),
        (CodeKind::Marker, _) | (_, None) => "hsl(220,10%,80%)".to_string(),
        (CodeKind::User, Some(lib)) => format!(
            "hsl({},60%,{}%)",
            hues.get(lib.as_str()).copied().unwrap_or(hash(lib) % 360),
            58 + hash(&b.name) % 14
        ),
    }
}

/// The flame graph of `profile` as SVG text: its boxes, coloured by library, under the
/// command, what was sampled, and a legend of the libraries.
pub fn to_svg(profile: &Profile, thread_roots: bool, view: TimeView) -> String {
    let boxes = layout(profile, thread_roots, view);
    let (hues, legend) = library_hues(&boxes);
    let (title, subtitle) = titles(profile, &boxes, view);
    render(
        &boxes,
        &Canvas {
            title,
            subtitle,
            legend,
            unit: view.unit(),
            colour: &|_, b| colour(b, &hues),
            note: &|_, _| String::new(),
        },
    )
}

/// What a flame graph shows besides its boxes, and how it colours them.
pub struct Canvas<'a> {
    pub title: String,
    pub subtitle: String,
    /// Legend entries: a fill colour and what it stands for.
    pub legend: Vec<(String, String)>,
    /// What the boxes' widths count.
    pub unit: WeightUnit,
    /// The fill of a box (its index in the boxes, and the box).
    pub colour: &'a dyn Fn(usize, &FlameBox) -> String,
    /// More lines for a box's tooltip (plain text, escaped here), or nothing.
    pub note: &'a dyn Fn(usize, &FlameBox) -> String,
}

/// The boxes of a [`layout`] as SVG text, part by part: the document's head, the
/// titles, the legend, then one group per box (the first box is the `all` box, whose
/// width is the whole).
pub fn render(boxes: &[FlameBox], canvas: &Canvas) -> String {
    let total = boxes.first().map_or(0, |b| b.samples).max(1);
    let rows = boxes.iter().map(|b| b.depth + 1).max().unwrap_or(1);
    let height = HEADER + rows as f64 * ROW + MARGIN;
    let scale = Scale {
        total,
        height,
        per_sample: (WIDTH - 2.0 * MARGIN) / total as f64,
    };
    let mut out = String::new();
    write_head(&mut out, total, height);
    write_titles(&mut out, &canvas.title, &canvas.subtitle);
    write_legend(&mut out, &canvas.legend);
    for (i, b) in boxes.iter().enumerate() {
        write_box(&mut out, i, b, &scale, canvas);
    }
    out.push_str("</svg>\n");
    out
}

/// Where boxes go: the image's height, and the width of a sample of `total`.
struct Scale {
    total: u64,
    height: f64,
    per_sample: f64,
}

/// The XML declaration, the `svg` element, the style sheet and the background.
fn write_head(out: &mut String, total: u64, height: f64) {
    let _ = writeln!(
        out,
        r##"<?xml version="1.0" encoding="UTF-8" standalone="no"?>
<svg version="1.1" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" data-total-samples="{total}">
<style>
text {{ font-family: monospace; font-size: {FONT_SIZE}px; fill: #000; }}
.title {{ font-size: 17px; text-anchor: middle; }}
.sub {{ fill: #555; text-anchor: middle; }}
g.f:hover rect {{ stroke: #000; stroke-width: 0.8; }}
g.f text {{ pointer-events: none; }}
</style>
<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fbfbf8"/>"##
    );
}

/// A profile's flame graph's title (the command) and subtitle (the amount, the event,
/// its rate, the duration, and what a box's width means).
fn titles(profile: &Profile, boxes: &[FlameBox], view: TimeView) -> (String, String) {
    let m = &profile.meta;
    let command = m.command.join(" ");
    let title = match command.is_empty() {
        true => "sampler flame graph".to_string(),
        false => command,
    };
    let samples: u64 = boxes.first().map_or(0, |b| b.samples);
    let subtitle = format!(
        "{}{}, {} at {} Hz, {:.2} s; box width = running {}, hover for amounts",
        super::amount(view.unit(), samples),
        match view {
            TimeView::Cpu => "",
            TimeView::OffCpu => " off-CPU",
            TimeView::Wall => " on and off CPU",
        },
        m.event,
        m.frequency_hz,
        m.duration_ms / 1000.0,
        match view.unit() {
            WeightUnit::Samples => "samples",
            WeightUnit::Nanoseconds => "time",
        }
    );
    (title, subtitle)
}

/// The title and the subtitle, escaped.
fn write_titles(out: &mut String, title: &str, subtitle: &str) {
    let _ = writeln!(
        out,
        r#"<text class="title" x="{}" y="22">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    let _ = writeln!(
        out,
        r#"<text class="sub" x="{}" y="40">{}</text>"#,
        WIDTH / 2.0,
        escape(subtitle)
    );
}

/// Each library's hue, from [`PALETTE`] in the order of the samples at the root of
/// their run of frames, and the legend of the first [`LEGEND_LIBS`] of them.
fn library_hues(boxes: &[FlameBox]) -> (HashMap<&str, u64>, Vec<(String, String)>) {
    let mut by_lib: HashMap<&str, u64> = HashMap::new();
    for b in boxes {
        if let (CodeKind::User, Some(lib)) = (b.kind, &b.lib) {
            *by_lib.entry(lib.as_str()).or_default() += b.self_samples;
        }
    }
    let mut libs: Vec<(&str, u64)> = by_lib.into_iter().collect();
    libs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let hues: HashMap<&str, u64> = libs
        .iter()
        .zip(PALETTE)
        .map(|((lib, _), hue)| (*lib, hue))
        .collect();
    let legend = libs
        .iter()
        .take(LEGEND_LIBS)
        .map(|(lib, _)| (format!("hsl({},60%,64%)", hues[lib]), lib.to_string()))
        .collect();
    (hues, legend)
}

/// The legend: a square of each colour and what it stands for, in a row.
fn write_legend(out: &mut String, legend: &[(String, String)]) {
    let mut x = MARGIN;
    for (fill, label) in legend {
        let _ = writeln!(
            out,
            r#"<rect x="{x:.1}" y="50" width="12" height="12" fill="{fill}"/><text x="{:.1}" y="60">{}</text>"#,
            x + 16.0,
            escape(label)
        );
        x += 16.0 + label.chars().count() as f64 * CHAR_WIDTH + 14.0;
    }
}

/// Box `i`: its tooltip, its rectangle, and its name where three characters fit.
fn write_box(out: &mut String, i: usize, b: &FlameBox, scale: &Scale, canvas: &Canvas) {
    let amount = |w: u64| super::amount(canvas.unit, w);
    let total = scale.total;
    let bx = MARGIN + b.start as f64 * scale.per_sample;
    let bw = b.samples as f64 * scale.per_sample;
    let by = scale.height - MARGIN - (b.depth + 1) as f64 * ROW;
    let pct = 100.0 * b.samples as f64 / total as f64;
    let self_pct = 100.0 * b.self_samples as f64 / total as f64;
    let mut title = escape(&b.name);
    if b.inlined {
        title.push_str(" (inlined)");
    }
    if let Some(lib) = &b.lib {
        title.push_str(" in ");
        title.push_str(&escape(lib));
    }
    let note = (canvas.note)(i, b);
    if !note.is_empty() {
        title.push('\n');
        title.push_str(&escape(&note));
    }
    let _ = write!(
        out,
        r#"<g class="f"><title>{title}
{} ({pct:.2}%), self {} ({self_pct:.2}%)</title><rect x="{bx:.3}" y="{by:.1}" width="{bw:.3}" height="{:.1}" rx="2" fill="{}"/>"#,
        amount(b.samples),
        match canvas.unit {
            WeightUnit::Samples => b.self_samples.to_string(),
            WeightUnit::Nanoseconds => amount(b.self_samples),
        },
        ROW - 1.0,
        (canvas.colour)(i, b)
    );
    let fits = ((bw - 6.0) / CHAR_WIDTH).floor();
    if fits >= 3.0 {
        let fits = fits as usize;
        let label: String = if b.name.chars().count() <= fits {
            b.name.clone()
        } else {
            b.name.chars().take(fits - 2).collect::<String>() + ".."
        };
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            bx + 3.0,
            by + ROW - 4.5,
            escape(&label)
        );
    }
    out.push_str("</g>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_001_boxes() {
        let p = Profile::from_named_stacks(&[
            &["A", "B", "C", "D", "E"],
            &["A", "B", "C", "F", "G"],
            &["A", "B", "H", "F"],
        ]);
        let boxes = layout(&p, false, TimeView::Cpu);
        let find = |depth: usize, name: &str| {
            boxes
                .iter()
                .find(|b| b.depth == depth && b.name == name)
                .map(|b| (b.start, b.samples, b.self_samples))
        };
        assert_eq!(find(0, "all"), Some((0, 3, 0)));
        assert_eq!(find(1, "A"), Some((0, 3, 0)));
        assert_eq!(find(3, "C"), Some((0, 2, 0)));
        assert_eq!(find(3, "H"), Some((2, 1, 0)));
        assert_eq!(find(4, "F").map(|f| f.1), Some(1));
        assert_eq!(boxes.len(), 10);
        let with_threads = layout(&p, true, TimeView::Cpu);
        assert_eq!(with_threads.iter().map(|b| b.depth).max(), Some(7));
        let svg = to_svg(&p, false, TimeView::Cpu);
        assert!(svg.contains("<title>C\n2 samples (66.67%), self 0 (0.00%)</title>"));
        assert!(svg.ends_with("</svg>\n"));
    }

    #[test]
    fn names_are_escaped() {
        let p = Profile::from_named_stacks(&[&["std::vector<int>::push_back&\"x\""]]);
        let svg = to_svg(&p, false, TimeView::Cpu);
        assert!(svg.contains("std::vector&lt;int&gt;::push_back&amp;&quot;x&quot;"));
        assert!(!svg.contains("vector<int>"));
    }
}
