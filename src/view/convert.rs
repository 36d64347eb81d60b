//! What `sampler view` hands the viewer for a file that is not a Firefox profile: folded
//! stacks (`a;b;c 42`, sampler's `-f folded` or any stack collapser's) are turned into a
//! Firefox profile in memory, one thread whose samples are the lines' stacks, each line
//! standing for as many samples as its count. The other formats are refused with one
//! line: an SVG flame graph has no samples left in it, and speedscope and pprof files
//! have no reader here yet.
//!
//! The file is read line by line within bounds: [`crate::emit::MAX_PROFILE_TEXT`] bytes
//! in all, [`MAX_LINE_BYTES`] per line and [`MAX_SAMPLES`] samples, so that no file
//! (`/dev/zero` named `x.folded`) can take unbounded memory or time.

use std::io::{BufRead, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::emit::{self, Format};
use crate::profile::{Profile, SampleRow};

/// The longest line read: a stack of 8,171 frames (the deepest the kernel walks) of
/// 500-byte names.
pub const MAX_LINE_BYTES: u64 = 4 << 20;

/// The most samples a folded file may stand for: each becomes a sample row of the
/// profile and some 17 bytes of the served JSON; 4 million of them in 10,000 stacks
/// took 270 MB at the peak and 1 s.
pub const MAX_SAMPLES: u64 = 4_000_000;

/// What `path`'s name says it holds, for the formats that are not Firefox profiles.
pub fn other_format(path: &Path) -> Option<Format> {
    Format::from_output_name(path).filter(|f| *f != Format::Firefox)
}

/// The Firefox profile (JSON text) for `path`, a file in `format`.
pub fn to_firefox_json(path: &Path, format: Format) -> Result<(Vec<u8>, Profile)> {
    let profile = match format {
        Format::Folded => read_folded(path)?,
        Format::Svg => bail!(
            "{} is an SVG flame graph, which keeps no samples: open it in a browser as it is, or view the Firefox profile it was made from",
            path.display()
        ),
        other => bail!(
            "{} is a {} file: sampler view reads Firefox profiles and folded stacks (record with -f firefox, the default)",
            path.display(),
            other.name()
        ),
    };
    let mut json = Vec::new();
    emit::write_stream(
        &profile,
        Format::Firefox,
        &emit::ExportOptions::default(),
        &mut json,
    )
    .with_context(|| format!("cannot convert {}", path.display()))?;
    Ok((json, profile))
}

/// Reads folded stacks: a profile of one thread, named after the file.
fn read_folded(path: &Path) -> Result<Profile> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut reader = std::io::BufReader::new(file.take(emit::MAX_PROFILE_TEXT));
    let mut stacks: Vec<(String, u64)> = Vec::new();
    let mut total: u64 = 0;
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        let n = (&mut reader)
            .take(MAX_LINE_BYTES + 1)
            .read_until(b'\n', &mut line)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        let bad = |why: &str| anyhow::anyhow!("{}: line {number}: {why}", path.display());
        if n as u64 > MAX_LINE_BYTES {
            return Err(bad("longer than 4 MiB: not folded stacks"));
        }
        let text =
            std::str::from_utf8(&line).map_err(|_| bad("not UTF-8 text: not folded stacks"))?;
        let text = text.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() {
            continue;
        }
        let (stack, count) = text
            .rsplit_once(' ')
            .ok_or_else(|| bad("no sample count: folded stacks are `a;b;c COUNT`"))?;
        let count: u64 = count
            .parse()
            .map_err(|_| bad("the count after the stack is not a whole number"))?;
        if stack.is_empty() || stack.split(';').any(str::is_empty) {
            return Err(bad("an empty frame name: folded stacks are `a;b;c COUNT`"));
        }
        total = total.saturating_add(count);
        if total > MAX_SAMPLES {
            bail!(
                "{} stands for more than {MAX_SAMPLES} samples: sampler view converts folded files up to that",
                path.display()
            );
        }
        stacks.push((stack.to_string(), count));
    }
    if stacks.is_empty() {
        bail!("{} has no stacks: it is empty", path.display());
    }
    let paths: Vec<Vec<&str>> = stacks.iter().map(|(s, _)| s.split(';').collect()).collect();
    let slices: Vec<&[&str]> = paths.iter().map(Vec::as_slice).collect();
    // One row per line, then each line's row repeated as often as its count says.
    let mut profile = Profile::from_named_stacks(&slices);
    let thread = &mut profile.threads[0];
    let one_each = std::mem::take(&mut thread.samples);
    let interval_ms = profile.meta.interval_ms;
    for (row, (_, count)) in one_each.iter().zip(&stacks) {
        for _ in 0..*count {
            let time_ms = thread.samples.len() as f64 * interval_ms;
            thread.samples.push(SampleRow { time_ms, ..*row });
        }
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    profile.meta.duration_ms = total as f64 * interval_ms;
    thread.name = name.clone();
    profile.processes[0].name = name;
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folded(text: &[u8]) -> Result<Profile> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = crate::files::testdir::TestDir::new(&format!(
            "folded-{}",
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let path = dir.join("x.folded");
        std::fs::write(&path, text).unwrap();
        read_folded(&path)
    }

    #[test]
    fn each_line_stands_for_its_count() {
        let p = folded(b"main;a 2\nmain;b;c 3\n\nmain;a 1\n").unwrap();
        let t = &p.threads[0];
        assert_eq!(t.samples.len(), 6);
        let names = |row: &SampleRow<_>| {
            crate::emit::func_path(&p, row.stack)
                .into_iter()
                .map(|f| p.func_name(f).to_string())
                .collect::<Vec<_>>()
                .join(";")
        };
        let paths: Vec<String> = t.samples.iter().map(names).collect();
        assert_eq!(
            paths,
            ["main;a", "main;a", "main;b;c", "main;b;c", "main;b;c", "main;a"]
        );
        assert_eq!(t.name, "x.folded");
    }

    #[test]
    fn what_is_not_folded_stacks_is_refused_with_its_line() {
        for (text, says) in [
            (&b"main;a 2\nmain;b\n"[..], "line 2: no sample count"),
            (
                b"main;a x\n",
                "line 1: the count after the stack is not a whole number",
            ),
            (b"main;;a 1\n", "line 1: an empty frame name"),
            (b"\n\n", "has no stacks"),
            (b"a 4000001\n", "more than 4000000 samples"),
            (b"a 1\n\xff 1\n", "line 2: not UTF-8"),
        ] {
            let err = format!("{:#}", folded(text).map(|_| ()).unwrap_err());
            assert!(
                err.contains(says),
                "{}: {err}",
                String::from_utf8_lossy(text)
            );
        }
    }
}
