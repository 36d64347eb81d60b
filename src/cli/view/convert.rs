//! What `sampler view` hands the viewer for a file that is not a Firefox profile: the
//! other formats sampler writes that keep samples are turned into a Firefox profile in
//! memory. Folded stacks (`a;b;c 42`, sampler's `-f folded` or any stack collapser's)
//! give one thread; a speedscope file one thread per sampled profile; a pprof file one
//! thread per `thread` label (sampler's), else one. Each stack stands for as many
//! samples as its count says. An SVG flame graph keeps no samples and is refused.
//!
//! Files are read within bounds: [`crate::emit::load::MAX_PROFILE_TEXT`] bytes in all (after
//! gzip), [`MAX_LINE_BYTES`] per folded line and [`MAX_SAMPLES`] samples, so that no file
//! (`/dev/zero` named `x.folded`) can take unbounded memory or time.

use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::emit::{self, Format};
use crate::profile::{Profile, SampleRow};

/// The longest line read: a stack of 8,171 frames (the deepest the kernel walks) of
/// 500-byte names.
pub const MAX_LINE_BYTES: u64 = 4 << 20;

/// The most samples a file may stand for: each becomes a sample row of the profile and
/// some 17 bytes of the served JSON; 4 million of them in 10,000 stacks took 270 MB at
/// the peak and 1 s.
pub const MAX_SAMPLES: u64 = 4_000_000;

/// What `path`'s name says it holds, for the formats that are not Firefox profiles.
pub fn other_format(path: &Path) -> Option<Format> {
    Format::from_output_name(path).filter(|f| *f != Format::Firefox)
}

/// The Firefox profile (JSON text) for `path`, a file in `format`.
pub fn to_firefox_json(path: &Path, format: Format) -> Result<(Vec<u8>, Profile)> {
    let threads = match format {
        Format::Folded => read_folded(path)?,
        Format::Speedscope => read_speedscope(path)?,
        Format::Pprof => read_pprof(path)?,
        Format::Svg => bail!(
            "{} is an SVG flame graph, which keeps no samples: open it in a browser as it is, or view the profile it was made from",
            path.display()
        ),
        Format::Otlp => bail!(
            "{} is an OTLP export request, which a profiling back end reads: view the profile it was made from",
            path.display()
        ),
        Format::Firefox => unreachable!("a Firefox profile is served as it is"),
    };
    let profile = build(path, threads)?;
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

/// A thread read from another format: its name, and its stacks (function names, root
/// first) with their sample counts.
struct Stacks {
    name: String,
    stacks: Vec<(Vec<String>, u64)>,
}

/// Sample counts added up, refused past [`MAX_SAMPLES`].
struct Total<'a> {
    path: &'a Path,
    samples: u64,
}

impl Total<'_> {
    fn add(&mut self, count: u64) -> Result<()> {
        self.samples = self.samples.saturating_add(count);
        if self.samples > MAX_SAMPLES {
            bail!(
                "{} stands for more than {MAX_SAMPLES} samples: sampler view converts files up to that",
                self.path.display()
            );
        }
        Ok(())
    }
}

/// The profile of `threads`: one process named after the file, each stack's row
/// repeated as often as its count says, one interval apart.
fn build(path: &Path, threads: Vec<Stacks>) -> Result<Profile> {
    let threads: Vec<Stacks> = threads
        .into_iter()
        .filter(|t| {
            t.stacks
                .iter()
                .any(|(path, count)| *count > 0 && !path.is_empty())
        })
        .collect();
    if threads.is_empty() {
        bail!("{} has no samples", path.display());
    }
    let paths: Vec<Vec<&str>> = threads
        .iter()
        .flat_map(|t| &t.stacks)
        .map(|(names, _)| names.iter().map(String::as_str).collect())
        .collect();
    let slices: Vec<&[&str]> = paths.iter().map(Vec::as_slice).collect();
    // One row per stack (an empty stack has none), then each repeated by its count.
    let mut profile = Profile::from_named_stacks(&slices);
    let template = profile.threads.pop().expect("one thread");
    let mut one_each = template.samples.iter();
    let interval_ms = profile.meta.interval_ms;
    let mut longest = 0usize;
    for (i, t) in threads.into_iter().enumerate() {
        let mut samples = Vec::new();
        for (names, count) in &t.stacks {
            if names.is_empty() {
                continue;
            }
            let row = *one_each.next().expect("a row per stack");
            for _ in 0..*count {
                let time_ms = samples.len() as f64 * interval_ms;
                samples.push(SampleRow { time_ms, ..row });
            }
        }
        longest = longest.max(samples.len());
        profile.threads.push(crate::profile::Thread {
            tid: i as i32 + 1,
            name: t.name,
            is_main: i == 0,
            samples,
            ..template.clone()
        });
    }
    profile.meta.duration_ms = longest as f64 * interval_ms;
    // Kernel functions keep their colour: sampler names them `[kernel] name`.
    for frame in &mut profile.frames {
        let name = &profile.funcs[frame.func.index()].name;
        if name.starts_with(crate::symbolicate::KERNEL_PREFIX) {
            frame.kind = crate::profile::CodeKind::Kernel;
        }
    }
    profile.processes[0].name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(profile)
}

/// The file's bytes, gunzipped when they are gzip, within [`emit::load::MAX_PROFILE_TEXT`].
fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    emit::load::open_plain(path)?
        .take(emit::load::MAX_PROFILE_TEXT + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {} (gzip data damaged?)", path.display()))?;
    if bytes.len() as u64 > emit::load::MAX_PROFILE_TEXT {
        bail!(
            "{} holds more than {} MiB: sampler view reads files up to that size",
            path.display(),
            emit::load::MAX_PROFILE_TEXT >> 20
        );
    }
    Ok(bytes)
}

#[derive(Deserialize)]
struct SpeedscopeFile {
    shared: SpeedscopeShared,
    profiles: Vec<SpeedscopeProfile>,
}

#[derive(Deserialize)]
struct SpeedscopeShared {
    frames: Vec<SpeedscopeFrame>,
}

#[derive(Deserialize)]
struct SpeedscopeFrame {
    name: String,
}

#[derive(Deserialize)]
struct SpeedscopeProfile {
    r#type: String,
    name: String,
    /// Frame indexes of each sample, root first.
    #[serde(default)]
    samples: Vec<Vec<usize>>,
}

/// Reads a speedscope file: a thread per sampled profile, each sample counted once.
fn read_speedscope(path: &Path) -> Result<Vec<Stacks>> {
    let text = emit::load::read_json_text(path)?;
    let file: SpeedscopeFile =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&text))
            .map_err(|e| {
                // The place in the file, `profiles[0].samples`, or none at its top.
                let at = match e.path().to_string() {
                    top if top == "." => String::new(),
                    at => format!("{at}: "),
                };
                anyhow::anyhow!(
                    "{}: not a speedscope file: {at}{}",
                    path.display(),
                    e.inner()
                )
            })?;
    let names: Vec<&str> = file.shared.frames.iter().map(|f| f.name.as_str()).collect();
    let mut total = Total { path, samples: 0 };
    let mut threads = Vec::new();
    for (p, profile) in file.profiles.iter().enumerate() {
        if profile.r#type != "sampled" {
            bail!(
                "{}: profiles[{p}] is {:?}: sampler view reads speedscope's sampled profiles",
                path.display(),
                profile.r#type
            );
        }
        let mut counts: HashMap<&[usize], u64> = HashMap::new();
        let mut order = Vec::new();
        for (i, sample) in profile.samples.iter().enumerate() {
            if let Some(bad) = sample.iter().find(|&&f| f >= names.len()) {
                bail!(
                    "{}: profiles[{p}].samples[{i}] names frame {bad}, but there are {}",
                    path.display(),
                    names.len()
                );
            }
            total.add(1)?;
            let count = counts.entry(sample).or_insert_with(|| {
                order.push(sample.as_slice());
                0
            });
            *count += 1;
        }
        let stacks = order
            .into_iter()
            .map(|s| (s.iter().map(|&f| names[f].to_string()).collect(), counts[s]))
            .collect();
        threads.push(Stacks {
            name: profile.name.clone(),
            stacks,
        });
    }
    Ok(threads)
}

/// Reads a pprof file (gzipped or not): a thread per `thread` and `tid` label (sampler
/// writes them on every sample), else one named after the file; the first value of each sample is its
/// count.
fn read_pprof(path: &Path) -> Result<Vec<Stacks>> {
    use prost::Message;
    let bytes = read_bounded(path)?;
    let pprof = emit::pprof::PprofProfile::decode(&bytes[..])
        .map_err(|e| anyhow::anyhow!("{}: not a pprof profile: {e}", path.display()))?;
    let string = |i: i64| -> Result<&str> {
        usize::try_from(i)
            .ok()
            .and_then(|i| pprof.string_table.get(i))
            .map(String::as_str)
            .ok_or_else(|| {
                anyhow::anyhow!("{}: string {i} is not in the string table", path.display())
            })
    };
    let functions: HashMap<u64, &str> = pprof
        .function
        .iter()
        .map(|f| Ok((f.id, string(f.name)?)))
        .collect::<Result<_>>()?;
    let locations: HashMap<u64, &emit::pprof::Location> =
        pprof.location.iter().map(|l| (l.id, l)).collect();
    let key = |name: &str| pprof.string_table.iter().position(|s| s == name);
    let (thread_key, tid_key) = (key("thread"), key("tid"));
    let mut total = Total { path, samples: 0 };
    let mut threads: Vec<Stacks> = Vec::new();
    // Threads by name and tid: two threads may have one name.
    let mut thread_of: HashMap<(String, i64), usize> = HashMap::new();
    for (i, sample) in pprof.sample.iter().enumerate() {
        let count = sample.value.first().copied().unwrap_or(0).max(0) as u64;
        total.add(count)?;
        let mut names = Vec::new();
        // Locations leaf first, and in each the innermost inlined function first.
        for id in sample.location_id.iter().rev() {
            let location = locations.get(id).ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: sample {i} names location {id}, which is not there",
                    path.display()
                )
            })?;
            for line in location.line.iter().rev() {
                let name = functions.get(&line.function_id).ok_or_else(|| {
                    anyhow::anyhow!(
                        "{}: location {id} names function {}, which is not there",
                        path.display(),
                        line.function_id
                    )
                })?;
                names.push(name.to_string());
            }
        }
        let label = |key: Option<usize>| {
            sample
                .label
                .iter()
                .find(|l| key.is_some_and(|k| l.key == k as i64))
        };
        let thread = label(thread_key)
            .map(|l| string(l.str))
            .transpose()?
            .unwrap_or("");
        let tid = label(tid_key).map_or(0, |l| l.num);
        let at = *thread_of
            .entry((thread.to_string(), tid))
            .or_insert_with(|| {
                threads.push(Stacks {
                    name: match thread {
                        "" => path
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default(),
                        named => named.to_string(),
                    },
                    stacks: Vec::new(),
                });
                threads.len() - 1
            });
        threads[at].stacks.push((names, count));
    }
    Ok(threads)
}

/// Reads folded stacks: one thread, named after the file.
fn read_folded(path: &Path) -> Result<Vec<Stacks>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut reader = std::io::BufReader::new(file.take(emit::load::MAX_PROFILE_TEXT));
    let mut stacks: Vec<(Vec<String>, u64)> = Vec::new();
    let mut total = Total { path, samples: 0 };
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
        total.add(count)?;
        stacks.push((stack.split(';').map(str::to_string).collect(), count));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(vec![Stacks { name, stacks }])
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
        build(&path, read_folded(&path)?)
    }

    /// Every sample's function path (`a;b;c`), as often as its weight counts, sorted.
    fn paths(p: &Profile) -> Vec<String> {
        let mut out = Vec::new();
        for t in &p.threads {
            for row in &t.samples {
                let path = crate::emit::func_path(p, row.stack)
                    .into_iter()
                    .map(|f| p.func_name(f).to_string())
                    .collect::<Vec<_>>()
                    .join(";");
                let n = match row.weight {
                    crate::profile::SampleWeight::OnCpu(n) => n,
                    other => panic!("{other:?}"),
                };
                out.extend(std::iter::repeat_n(path, n as usize));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn speedscope_and_pprof_files_come_back_with_their_stacks() {
        let seed = crate::calltree::tests::seed_001();
        let dir = crate::files::testdir::TestDir::new("view-formats");
        for (name, format) in [
            ("s.speedscope.json", Format::Speedscope),
            ("s.pb.gz", Format::Pprof),
        ] {
            let path = dir.join(name);
            let mut file = std::fs::File::create(&path).unwrap();
            emit::write_stream(&seed, format, &emit::ExportOptions::default(), &mut file).unwrap();
            assert_eq!(other_format(&path), Some(format));
            let (json, converted) = to_firefox_json(&path, format).unwrap();
            assert_eq!(paths(&converted), paths(&seed), "{name}");
            assert_eq!(
                paths(&crate::emit::firefox::from_slice(&json).unwrap()),
                paths(&seed)
            );
            let threads: Vec<&str> = converted.threads.iter().map(|t| t.name.as_str()).collect();
            assert!(
                threads
                    .iter()
                    .all(|t| seed.threads.iter().any(|s| t.starts_with(&s.name))),
                "{name}: {threads:?}"
            );
        }
        let svg = dir.join("s.svg");
        std::fs::write(&svg, "<svg/>").unwrap();
        let err = to_firefox_json(&svg, Format::Svg).unwrap_err().to_string();
        assert!(err.contains("keeps no samples"), "{err}");
        let bad = dir.join("bad.pb.gz");
        std::fs::write(&bad, b"\x0a\xff\xff").unwrap();
        let err = to_firefox_json(&bad, Format::Pprof)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a pprof profile"), "{err}");
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
        let p = folded(b"main;[kernel] irq 1\n").unwrap();
        let kinds: Vec<_> = p.frames.iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [
                crate::profile::CodeKind::User,
                crate::profile::CodeKind::Kernel
            ]
        );
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
            (b"\n\n", "has no samples"),
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
