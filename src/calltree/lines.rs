//! Sample counts per source line of one function (seed 003, FAQ): the reason stacks are
//! kept beside call nodes. For every sample, the frames of the function in its stack say
//! which lines were running: the leaf frame's line gets self weight, and each line of the
//! function on the stack gets running weight once per sample (once, also in recursion).

use std::collections::HashMap;

use super::transform::name_matches;
use crate::profile::{FuncIndex, Profile, TimeView};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineRow {
    /// `None` for frames without line information.
    pub line: Option<u32>,
    pub self_weight: u64,
    pub running_weight: u64,
}

/// The lines of one function, in line order (unknown line last).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionLines {
    pub func: FuncIndex,
    pub name: String,
    pub file: Option<String>,
    pub lib: Option<String>,
    pub self_weight: u64,
    pub running_weight: u64,
    pub rows: Vec<LineRow>,
}

/// Per-line counts for every function named `query` (see [`name_matches`]) in the
/// samples of `threads`, heaviest function first; an error when no sample has it.
pub fn function_lines(
    profile: &Profile,
    threads: &[usize],
    query: &str,
    view: TimeView,
) -> Result<Vec<FunctionLines>, String> {
    let interval_ns = profile.meta.interval_ns();
    let wanted: Vec<bool> = profile
        .funcs
        .iter()
        .map(|f| name_matches(&f.name, query))
        .collect();
    if !wanted.contains(&true) {
        return Err(format!("no function named {query} in the profile"));
    }
    // (func, line) -> (self, running); func -> (self, running).
    let mut lines: HashMap<(FuncIndex, Option<u32>), (u64, u64)> = HashMap::new();
    let mut funcs: HashMap<FuncIndex, (u64, u64)> = HashMap::new();
    let mut seen: Vec<(FuncIndex, Option<u32>)> = Vec::new();
    for &t in threads {
        for sample in &profile.threads[t].samples {
            let weight = view.weight(sample.weight, interval_ns);
            seen.clear();
            let mut stack = Some(sample.stack);
            let mut leaf = true;
            while let Some(s) = stack {
                let st = &profile.stacks[s.index()];
                let frame = &profile.frames[st.frame.index()];
                if wanted[frame.func.index()] {
                    let key = (frame.func, frame.line);
                    if leaf {
                        lines.entry(key).or_default().0 += weight;
                        funcs.entry(frame.func).or_default().0 += weight;
                    }
                    if !seen.contains(&key) {
                        if !seen.iter().any(|(f, _)| *f == frame.func) {
                            funcs.entry(frame.func).or_default().1 += weight;
                        }
                        lines.entry(key).or_default().1 += weight;
                        seen.push(key);
                    }
                }
                leaf = false;
                stack = st.prefix;
            }
        }
    }
    if funcs.is_empty() {
        return Err(format!("no sample runs in a function named {query}"));
    }
    let mut out: Vec<FunctionLines> = funcs
        .into_iter()
        .map(|(func, (self_weight, running_weight))| {
            let f = &profile.funcs[func.index()];
            let mut rows: Vec<LineRow> = lines
                .iter()
                .filter(|((lf, _), _)| *lf == func)
                .map(|(&(_, line), &(s, r))| LineRow {
                    line,
                    self_weight: s,
                    running_weight: r,
                })
                .collect();
            rows.sort_by_key(|r| (r.line.is_none(), r.line));
            FunctionLines {
                func,
                name: f.name.clone(),
                file: f.file.clone(),
                lib: f.lib.map(|l| profile.libs[l.index()].name.clone()),
                self_weight,
                running_weight,
                rows,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.running_weight
            .cmp(&a.running_weight)
            .then(a.func.cmp(&b.func))
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Frame, FrameIndex, Stack, StackIndex};

    /// seed 003's program with lines: main's loops call doSomething at lines 3 and 9.
    fn profile_with_lines() -> Profile {
        let mut p = Profile::from_named_stacks(&[
            &["main"],
            &["main", "doSomething"],
            &["main", "doSomething"],
            &["main", "doSomething"],
            &["main", "someInterlude"],
        ]);
        // Give each sample its own frames with lines, as symbolication would.
        let frame = |p: &mut Profile, func: usize, line: u32| {
            p.frames.push(Frame {
                func: FuncIndex::new(func),
                line: Some(line),
                ..p.frames[0].clone()
            });
            FrameIndex::new(p.frames.len() - 1)
        };
        let stack = |p: &mut Profile, prefix: Option<StackIndex>, frame| {
            p.stacks.push(Stack { prefix, frame });
            StackIndex::new(p.stacks.len() - 1)
        };
        let (main2, main3, main9, main6) = (
            frame(&mut p, 0, 2),
            frame(&mut p, 0, 3),
            frame(&mut p, 0, 9),
            frame(&mut p, 0, 6),
        );
        let (some11, inter15) = (frame(&mut p, 1, 11), frame(&mut p, 2, 15));
        let s_main2 = stack(&mut p, None, main2);
        let s_main3 = stack(&mut p, None, main3);
        let s_main9 = stack(&mut p, None, main9);
        let s_main6 = stack(&mut p, None, main6);
        let leaves = [
            s_main2,
            stack(&mut p, Some(s_main3), some11),
            stack(&mut p, Some(s_main9), some11),
            stack(&mut p, Some(s_main3), some11),
            stack(&mut p, Some(s_main6), inter15),
        ];
        for (sample, leaf) in p.threads[0].samples.iter_mut().zip(leaves) {
            sample.stack = leaf;
        }
        p
    }

    #[test]
    fn lines_of_main_count_self_and_running() {
        let p = profile_with_lines();
        let out = function_lines(&p, &[0], "main", TimeView::Cpu).unwrap();
        assert_eq!(out.len(), 1);
        let main = &out[0];
        assert_eq!((main.self_weight, main.running_weight), (1, 5));
        let rows: Vec<(Option<u32>, u64, u64)> = main
            .rows
            .iter()
            .map(|r| (r.line, r.self_weight, r.running_weight))
            .collect();
        assert_eq!(
            rows,
            [
                (Some(2), 1, 1),
                (Some(3), 0, 2),
                (Some(6), 0, 1),
                (Some(9), 0, 1)
            ]
        );
        let some = &function_lines(&p, &[0], "doSomething", TimeView::Cpu).unwrap()[0];
        assert_eq!((some.self_weight, some.running_weight), (3, 3));
        assert_eq!(some.rows.len(), 1);
        assert!(function_lines(&p, &[0], "nothing", TimeView::Cpu).is_err());
    }

    #[test]
    fn recursion_counts_a_line_once_per_sample() {
        let p = Profile::from_named_stacks(&[&["f", "f", "f"], &["g", "f"]]);
        let f = &function_lines(&p, &[0], "f", TimeView::Cpu).unwrap()[0];
        assert_eq!((f.self_weight, f.running_weight), (2, 2));
        assert_eq!(
            f.rows,
            [LineRow {
                line: None,
                self_weight: 2,
                running_weight: 2
            }]
        );
    }
}
