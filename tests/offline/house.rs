//! The shape of the source tree (issue 26), checked so that it stays: every module of
//! `src/` in a folder named after its stage or role, no module importing one that comes
//! after it in the pipeline, no file over 800 lines, no function over 120, and `main.rs`
//! a thin dispatch of at most 150 lines. The checks read the source text; they need
//! neither perf nor root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The top-level modules in pipeline order: a module may use those before it, never one
/// after it. `files` is the base every stage stands on; `events` the seam the recording
/// hands over; `profile` the data model replay builds; `cli` the command line over all.
const ORDER: [&str; 10] = [
    "files",
    "events",
    "record",
    "unwind",
    "profile",
    "replay",
    "symbolicate",
    "calltree",
    "emit",
    "cli",
];

/// The most lines a source file may have: past it, a file holds more than one concern.
const MAX_FILE_LINES: usize = 800;
/// The most lines a function may have, from its `fn` line to its closing brace.
const MAX_FUNCTION_LINES: usize = 120;
/// `main.rs` parses the command line and maps errors to exit codes; the work is in the
/// library.
const MAX_MAIN_LINES: usize = 150;

fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
    out.sort();
    out
}

/// The path of `path` under `src/`.
fn relative(path: &Path) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    path.strip_prefix(src).unwrap().display().to_string()
}

/// The lines of code of `text`: comment lines left out, so that a module's prose and an
/// intra-doc link to a later stage are not imports.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l))
}

fn every_module_is_in_a_folder_of_its_stage_or_role() {
    let loose: Vec<String> = sources()
        .iter()
        .map(|p| relative(p))
        .filter(|r| !r.contains('/'))
        .filter(|r| !["lib.rs", "main.rs", "events.rs"].contains(&r.as_str()))
        .collect();
    assert!(
        loose.is_empty(),
        "files loose at the top of src/: {loose:?}"
    );
    for path in sources() {
        let rel = relative(&path);
        let top = rel.split(['/', '.']).next().unwrap();
        assert!(
            ORDER.contains(&top) || rel == "lib.rs" || rel == "main.rs",
            "{rel} is in no stage or role of the pipeline"
        );
    }
}

fn no_module_imports_one_after_it_in_the_pipeline() {
    let rank = |m: &str| ORDER.iter().position(|o| *o == m);
    let mut against = Vec::new();
    for path in sources() {
        let rel = relative(&path);
        let Some(own) = rank(rel.split(['/', '.']).next().unwrap()) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in code_lines(&text) {
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if rank(&name).is_some_and(|r| r > own) {
                    against.push(format!("{rel}:{n} uses crate::{name}"));
                }
            }
        }
    }
    assert!(
        against.is_empty(),
        "imports against the pipeline:\n{}",
        against.join("\n")
    );
}

fn no_file_is_over_800_lines_and_main_is_thin() {
    let mut long: BTreeMap<String, usize> = BTreeMap::new();
    for path in sources() {
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        let rel = relative(&path);
        if lines > MAX_FILE_LINES || (rel == "main.rs" && lines > MAX_MAIN_LINES) {
            long.insert(rel, lines);
        }
    }
    assert!(long.is_empty(), "files too long: {long:?}");
}

/// The functions of `text` and their lengths: a line whose code starts a `fn` item, to
/// the first line after it that closes a brace at the same indentation.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = line.len() - code.len();
        let signature = [
            "fn ",
            "pub fn ",
            "pub(crate) fn ",
            "pub(super) fn ",
            "const fn ",
        ]
        .iter()
        .find_map(|p| code.strip_prefix(p));
        let Some(rest) = signature else { continue };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // A declaration without a body (a trait's) ends at its semicolon.
        let close = " ".repeat(indent) + "}";
        let end = lines[i..]
            .iter()
            .position(|l| l.starts_with(&close) && !l[indent..].starts_with("} else"))
            .filter(|_| {
                !lines[i..]
                    .iter()
                    .take_while(|l| !l.contains('{'))
                    .any(|l| l.ends_with(';'))
            });
        if let Some(end) = end {
            out.push((name, i + 1, end + 1));
        }
    }
    out
}

fn no_function_is_over_120_lines() {
    let mut long = Vec::new();
    for path in sources() {
        let text = std::fs::read_to_string(&path).unwrap();
        for (name, line, len) in functions(&text) {
            if len > MAX_FUNCTION_LINES {
                long.push(format!("{}:{line} {name}: {len} lines", relative(&path)));
            }
        }
    }
    assert!(long.is_empty(), "functions too long:\n{}", long.join("\n"));
}

fn the_function_measure_counts_what_it_should() {
    let text = "fn a() {\n    x;\n}\n\n    pub fn b(\n        y: u8,\n    ) -> u8 {\n        if y {\n        } else {\n        }\n        y\n    }\n    fn decl(&self);\n";
    assert_eq!(
        functions(text),
        vec![("a".to_string(), 1, 3), ("b".to_string(), 5, 8)]
    );
}

pub fn tests() -> Vec<crate::common::Test> {
    crate::tests![
        every_module_is_in_a_folder_of_its_stage_or_role;
        no_module_imports_one_after_it_in_the_pipeline;
        no_file_is_over_800_lines_and_main_is_thin;
        no_function_is_over_120_lines;
        the_function_measure_counts_what_it_should;
    ]
}
