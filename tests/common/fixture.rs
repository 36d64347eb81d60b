#![allow(dead_code)]

//! Unwinder fixtures (written by `SAMPLER_CAPTURE_SAMPLES=FILE sampler record ...`): the
//! registers, stack copies and frame-pointer chains of real samples, with the CFI
//! sections and function symbols of the modules they ran in.

use std::path::Path;
use std::sync::Arc;

use sampler::events::{Sample, UserRegs};
use sampler::files::lazycfi::UnwindSections;
use sampler::unwind::maps::Region;
use sampler::unwind::{CodeModule, UnwindMode, Unwinder};
use serde_json::Value;

pub struct Fixture {
    pub samples: Vec<Sample>,
    /// (start, end, name) of every function, in the process's addresses.
    pub functions: Vec<(u64, u64, String)>,
    json: Value,
}

/// The pid the fixture's samples are replayed under.
pub const PID: i32 = 1;

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

impl Fixture {
    pub fn load(path: &Path) -> Fixture {
        let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let samples = json["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| Sample {
                pid: PID,
                tid: PID,
                user_callchain: s["fp_chain"].as_array().unwrap().iter().map(num).collect(),
                user_regs: Some(UserRegs {
                    ip: num(&s["ip"]),
                    sp: num(&s["sp"]),
                    bp: num(&s["bp"]),
                }),
                stack_copy: unhex(s["stack"].as_str().unwrap()),
                ..Sample::default()
            })
            .collect();
        let functions = json["modules"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["functions"].as_array().unwrap().iter())
            .map(|f| {
                (
                    num(&f["start"]),
                    num(&f["end"]),
                    f["name"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        Fixture {
            samples,
            functions,
            json,
        }
    }

    /// An unwinder in `mode` that knows the fixture's modules.
    pub fn unwinder(&self, mode: UnwindMode) -> Unwinder<()> {
        let mut unwinder = Unwinder::new(mode);
        for m in self.json["modules"].as_array().unwrap() {
            let section = |s: &Value| -> Option<(std::ops::Range<u64>, Arc<[u8]>)> {
                let bytes: Arc<[u8]> = Arc::from(unhex(s["hex"].as_str()?));
                Some((num(&s["start"])..num(&s["end"]), bytes))
            };
            let sections = UnwindSections {
                text: m["text"].as_array().map(|r| num(&r[0])..num(&r[1])),
                eh_frame: section(&m["eh_frame"]),
                eh_frame_hdr: section(&m["eh_frame_hdr"]),
                ..UnwindSections::default()
            };
            let name = m["name"].as_str().unwrap();
            let (start, end) = (num(&m["start"]), num(&m["end"]));
            let region = Region {
                start,
                len: end - start,
                file_offset: 0,
                data: (),
            };
            let code = CodeModule {
                name,
                bias: num(&m["bias"]),
                sections: &sections,
                text: None,
            };
            unwinder.map(PID, region, Some(code));
        }
        unwinder
    }

    /// The function an address lies in.
    pub fn function(&self, address: u64) -> Option<&str> {
        self.functions
            .iter()
            .find(|(start, end, _)| (*start..*end).contains(&address))
            .map(|(_, _, name)| name.as_str())
    }
}
