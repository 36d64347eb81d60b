//! Capturing unwinder fixtures: the raw material of a recording's first user samples
//! (registers, stack copy, the kernel's frame-pointer chain) with the code modules of
//! their process (address range, bias, CFI sections, function symbols), written as JSON.
//! The unwinder's tests replay such files without perf or privileges; `sampler record`
//! writes one when `SAMPLER_CAPTURE_SAMPLES=FILE` is set (see the README).

use std::path::PathBuf;
use std::sync::Arc;

use object::{Object, ObjectSymbol};
use serde_json::{json, Value};

use crate::events::Sample;
use crate::files::binary::Binary;

/// Samples a fixture holds: enough to cover every function of a small bench target.
const CAPTURED_SAMPLES: usize = 120;

/// Bytes of each stack copy kept: a bench target's frames up to `main` lie within the
/// first few hundred; the rest (libc's start-up frames, the environment) is not needed
/// and would make the fixture a megabyte.
const CAPTURED_STACK_BYTES: usize = 1024;

/// Modules whose `.eh_frame` is larger than this stay out of the fixture (system
/// libraries): frames in them are beyond what the fixture is meant to check.
const MAX_CAPTURED_EH_FRAME: usize = 64 * 1024;

pub struct Capture {
    path: PathBuf,
    pid: Option<i32>,
    modules: Vec<Value>,
    samples: Vec<Value>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Capture {
    pub fn new(path: PathBuf) -> Capture {
        Capture {
            path,
            pid: None,
            modules: Vec::new(),
            samples: Vec::new(),
        }
    }

    /// A code mapping of process `pid` at `avma`, whose file address 0 is at `bias`.
    pub fn module(
        &mut self,
        pid: i32,
        name: &str,
        avma: (u64, u64),
        bias: u64,
        binary: &Arc<Binary>,
    ) {
        let u = &binary.unwind;
        let Some((eh_start, eh)) = u.eh_frame_whole() else {
            return;
        };
        let eh_range = eh_start..eh_start + eh.len() as u64;
        if eh.len() > MAX_CAPTURED_EH_FRAME {
            return;
        }
        let Ok(data) = binary.bytes() else {
            return;
        };
        let functions: Vec<Value> = object::File::parse(&*data)
            .map(|file| {
                file.symbols()
                    .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
                    .filter_map(|s| {
                        Some(json!({
                            "name": s.name().ok()?,
                            "start": s.address().wrapping_add(bias),
                            "end": s.address().wrapping_add(bias) + s.size(),
                        }))
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.modules.push(json!({
            "pid": pid,
            "name": name,
            "start": avma.0,
            "end": avma.1,
            "bias": bias,
            "text": u.text.as_ref().map(|r| [r.start, r.end]),
            "eh_frame": { "start": eh_range.start, "end": eh_range.end, "hex": hex(&eh) },
            "eh_frame_hdr": u.eh_frame_hdr.as_ref().map(|(r, d)| json!({
                "start": r.start, "end": r.end, "hex": hex(d)
            })),
            "functions": functions,
        }));
    }

    /// A sample of the first process that is sampled with registers and a stack copy.
    pub fn sample(&mut self, s: &Sample) {
        let Some(regs) = s.user_regs else { return };
        if s.stack_copy.is_empty() || self.samples.len() >= CAPTURED_SAMPLES {
            return;
        }
        if *self.pid.get_or_insert(s.pid) != s.pid {
            return;
        }
        self.samples.push(json!({
            "ip": regs.ip,
            "sp": regs.sp,
            "bp": regs.bp,
            "fp_chain": s.user_callchain,
            "stack": hex(&s.stack_copy[..s.stack_copy.len().min(CAPTURED_STACK_BYTES)]),
        }));
    }

    /// Writes the fixture: the sampled process's modules and its samples.
    pub fn write(self) -> std::io::Result<()> {
        let pid = self.pid;
        let modules: Vec<Value> = self
            .modules
            .into_iter()
            .filter(|m| m["pid"].as_i64() == pid.map(i64::from))
            .collect();
        let fixture = json!({ "modules": modules, "samples": self.samples });
        std::fs::write(&self.path, serde_json::to_string_pretty(&fixture)?)
    }
}
