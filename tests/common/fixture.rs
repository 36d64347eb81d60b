#![allow(dead_code)]

//! Unwinder fixtures (written by `SAMPLER_CAPTURE_SAMPLES=FILE sampler record ...`, read
//! through the writer's own model, `sampler::replay::capture`): the registers, stack
//! copies and frame-pointer chains of real samples, with the CFI sections and function
//! symbols of the modules they ran in.

use std::path::Path;

use sampler::events::Sample;
use sampler::replay::capture::Capture;
use sampler::unwind::maps::Region;
use sampler::unwind::{CodeModule, UnwindMode, Unwinder};

pub struct Fixture {
    pub samples: Vec<Sample>,
    /// (start, end, name) of every function, in the process's addresses.
    pub functions: Vec<(u64, u64, String)>,
    pub capture: Capture,
}

/// The pid the fixture's samples are replayed under.
pub const PID: i32 = 1;

impl Fixture {
    pub fn load(path: &Path) -> Fixture {
        let capture = Capture::read(path).unwrap_or_else(|e| panic!("{e}"));
        let samples = capture.samples.iter().map(|s| s.to_sample(PID)).collect();
        let functions = capture
            .modules
            .iter()
            .flat_map(|m| &m.functions)
            .map(|f| (f.start, f.end, f.name.clone()))
            .collect();
        Fixture {
            samples,
            functions,
            capture,
        }
    }

    /// An unwinder in `mode` that knows the fixture's modules.
    pub fn unwinder(&self, mode: UnwindMode) -> Unwinder<()> {
        let mut unwinder = Unwinder::new(mode);
        for m in &self.capture.modules {
            let sections = m.sections();
            let region = Region {
                start: m.start,
                len: m.end - m.start,
                file_offset: 0,
                data: (),
            };
            let code = CodeModule {
                name: &m.name,
                bias: m.bias,
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
