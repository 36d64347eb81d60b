//! speedscope's file format (`https://www.speedscope.app/file-format-schema.json`): shared
//! frames, one per function, and one `sampled` profile per thread with samples in time
//! order, weighted in milliseconds (of sampling interval for on-CPU samples, of the time
//! off the CPU for off-CPU rows), so that speedscope's time-order view shows the
//! thread's timeline.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::profile::{FuncIndex, Profile, TimeView, WeightUnit};

/// The schema every speedscope file names.
pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// The profile as a speedscope file.
pub fn to_json(profile: &Profile, view: TimeView) -> Value {
    let interval_ns = profile.meta.interval_ns();
    let mut frames: Vec<Value> = Vec::new();
    let mut frame_of: HashMap<FuncIndex, usize> = HashMap::new();
    let mut profiles = Vec::new();
    for t in &profile.threads {
        if t.samples
            .iter()
            .all(|s| view.weight(s.weight, interval_ns) == 0)
        {
            continue;
        }
        // A stack's frame list is made once, however many samples share it.
        let mut paths: HashMap<crate::profile::StackIndex, Vec<usize>> = HashMap::new();
        let mut samples = Vec::with_capacity(t.samples.len());
        let mut weights = Vec::with_capacity(t.samples.len());
        for s in &t.samples {
            let ms = match view.weight(s.weight, interval_ns) {
                0 => continue,
                w if view.unit() == WeightUnit::Samples => w as f64 * profile.meta.interval_ms,
                w => w as f64 / 1e6,
            };
            let path = paths.entry(s.stack).or_insert_with(|| {
                super::func_path(profile, s.stack)
                    .into_iter()
                    .map(|f| {
                        *frame_of.entry(f).or_insert_with(|| {
                            let func = &profile.funcs[f.index()];
                            let file = func
                                .file
                                .clone()
                                .or_else(|| func.lib.map(|l| profile.libs[l.index()].name.clone()));
                            frames.push(match file {
                                Some(file) => json!({ "name": func.name, "file": file }),
                                None => json!({ "name": func.name }),
                            });
                            frames.len() - 1
                        })
                    })
                    .collect()
            });
            samples.push(path.clone());
            weights.push(ms);
        }
        let process = &profile.processes[t.process.index()];
        let end: f64 = weights.iter().sum();
        profiles.push(json!({
            "type": "sampled",
            "name": format!("{} ({}) {} ({})", process.name, process.pid, t.name, t.tid),
            "unit": "milliseconds",
            "startValue": 0.0,
            "endValue": end,
            "samples": samples,
            "weights": weights,
        }));
    }
    let command = profile.meta.command.join(" ");
    json!({
        "$schema": SCHEMA,
        "name": if command.is_empty() { "sampler profile".to_string() } else { command },
        "exporter": concat!("sampler ", env!("CARGO_PKG_VERSION")),
        "activeProfileIndex": 0,
        "shared": { "frames": frames },
        "profiles": profiles,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_001_as_speedscope() {
        let p = Profile::from_named_stacks(&[
            &["A", "B", "C", "D", "E"],
            &["A", "B", "C", "F", "G"],
            &["A", "B", "H", "F"],
        ]);
        let v = to_json(&p, TimeView::Cpu);
        assert_eq!(v["$schema"], SCHEMA);
        let names: Vec<&str> = v["shared"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["A", "B", "C", "D", "E", "F", "G", "H"]);
        let prof = &v["profiles"][0];
        assert_eq!(
            prof["samples"],
            json!([[0, 1, 2, 3, 4], [0, 1, 2, 5, 6], [0, 1, 7, 5]])
        );
        assert_eq!(prof["weights"], json!([1.0, 1.0, 1.0]));
        assert_eq!(prof["endValue"], 3.0);
    }
}
