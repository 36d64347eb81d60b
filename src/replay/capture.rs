//! Capturing unwinder fixtures: the raw material of a recording's first user samples
//! (registers, stack copy, the kernel's frame-pointer chain) with the code modules of
//! their process (address range, bias, CFI sections, function symbols), written as JSON.
//! The unwinder's tests replay such files without perf or privileges; `sampler record`
//! writes one when `SAMPLER_CAPTURE_SAMPLES=FILE` is set (see docs/testing.md).
//!
//! The file's model ([`Capture`] and its parts) is here, for the writer
//! ([`CaptureWriter`]) and for the tests that read the files back, so that the two cannot
//! disagree on a field.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::{Object, ObjectSymbol};
use serde::{Deserialize, Serialize};

use crate::events::{Sample, UserRegs};
use crate::files::binary::Binary;
use crate::files::lazycfi::UnwindSections;

/// Samples a fixture holds: enough to cover every function of a small bench target.
const CAPTURED_SAMPLES: usize = 120;

/// Bytes of each stack copy kept: a bench target's frames up to `main` lie within the
/// first few hundred; the rest (libc's start-up frames, the environment) is not needed
/// and would make the fixture a megabyte.
const CAPTURED_STACK_BYTES: usize = 1024;

/// Modules whose `.eh_frame` is larger than this stay out of the fixture (system
/// libraries): frames in them are beyond what the fixture is meant to check.
const MAX_CAPTURED_EH_FRAME: usize = 64 * 1024;

/// A fixture file: the sampled process's code modules and its samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Capture {
    pub modules: Vec<CapturedModule>,
    pub samples: Vec<CapturedSample>,
}

/// A code mapping of the sampled process, with what unwinding and naming its code needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapturedModule {
    pub pid: i32,
    pub name: String,
    /// The mapping's first address in the process.
    pub start: u64,
    /// The address just past the mapping.
    pub end: u64,
    /// The process's address of the file's address 0.
    pub bias: u64,
    /// `.text`, in the file's addresses, as `[start, end]`.
    pub text: Option<[u64; 2]>,
    pub eh_frame: CapturedSection,
    pub eh_frame_hdr: Option<CapturedSection>,
    /// The file's function symbols, in the process's addresses.
    pub functions: Vec<CapturedFunction>,
}

/// A section's file addresses and bytes (hexadecimal in the file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapturedSection {
    pub start: u64,
    pub end: u64,
    #[serde(rename = "hex", with = "hex")]
    pub bytes: Vec<u8>,
}

/// A function symbol, in the process's addresses (`end` is just past it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapturedFunction {
    pub name: String,
    pub start: u64,
    pub end: u64,
}

/// One user sample's raw material.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapturedSample {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The kernel's frame-pointer walk, leaf first.
    pub fp_chain: Vec<u64>,
    /// The first bytes of the stack copy, from `sp` up (hexadecimal in the file).
    #[serde(with = "hex")]
    pub stack: Vec<u8>,
}

impl Capture {
    /// Reads a fixture file; the error names the file and what is wrong with it.
    pub fn read(path: &Path) -> anyhow::Result<Capture> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: not a sample capture: {e}", path.display()))
    }
}

impl CapturedModule {
    /// The module's sections as the unwinder takes them.
    pub fn sections(&self) -> UnwindSections {
        let section = |s: &CapturedSection| (s.start..s.end, Arc::from(s.bytes.as_slice()));
        UnwindSections {
            text: self.text.map(|[start, end]| start..end),
            eh_frame: Some(section(&self.eh_frame)),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(section),
            ..UnwindSections::default()
        }
    }
}

impl CapturedSample {
    /// The sample as replay sees it, in thread `pid` of process `pid`.
    pub fn to_sample(&self, pid: i32) -> Sample {
        Sample {
            pid,
            tid: pid,
            user_callchain: self.fp_chain.clone(),
            user_regs: Some(UserRegs {
                ip: self.ip,
                sp: self.sp,
                bp: self.bp,
            }),
            stack_copy: self.stack.clone(),
            ..Sample::default()
        }
    }
}

/// Bytes as a string of two lowercase hexadecimal digits each.
mod hex {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        if text.len() % 2 != 0 {
            return Err(D::Error::custom("hex bytes of odd length"));
        }
        (0..text.len())
            .step_by(2)
            .map(|i| {
                text.get(i..i + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                    .ok_or_else(|| D::Error::custom(format!("not hex at character {i}")))
            })
            .collect()
    }
}

/// Collects a [`Capture`] while replay runs, and writes it when the profile is finished.
pub struct CaptureWriter {
    path: PathBuf,
    pid: Option<i32>,
    capture: Capture,
}

impl CaptureWriter {
    pub fn new(path: PathBuf) -> CaptureWriter {
        CaptureWriter {
            path,
            pid: None,
            capture: Capture::default(),
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
        if eh.len() > MAX_CAPTURED_EH_FRAME {
            return;
        }
        let Ok(data) = binary.bytes() else {
            return;
        };
        let functions = object::File::parse(&*data)
            .map(|file| {
                file.symbols()
                    .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
                    .filter_map(|s| {
                        let start = s.address().wrapping_add(bias);
                        Some(CapturedFunction {
                            name: s.name().ok()?.to_string(),
                            start,
                            end: start.wrapping_add(s.size()),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let section = |start: u64, bytes: &[u8]| CapturedSection {
            start,
            end: start + bytes.len() as u64,
            bytes: bytes.to_vec(),
        };
        self.capture.modules.push(CapturedModule {
            pid,
            name: name.to_string(),
            start: avma.0,
            end: avma.1,
            bias,
            text: u.text.as_ref().map(|r| [r.start, r.end]),
            eh_frame: section(eh_start, &eh),
            eh_frame_hdr: u.eh_frame_hdr.as_ref().map(|(r, d)| CapturedSection {
                start: r.start,
                end: r.end,
                bytes: d.to_vec(),
            }),
            functions,
        });
    }

    /// A sample of the first process that is sampled with registers and a stack copy.
    pub fn sample(&mut self, s: &Sample) {
        let Some(regs) = s.user_regs else { return };
        if s.stack_copy.is_empty() || self.capture.samples.len() >= CAPTURED_SAMPLES {
            return;
        }
        if *self.pid.get_or_insert(s.pid) != s.pid {
            return;
        }
        let kept = s.stack_copy.len().min(CAPTURED_STACK_BYTES);
        self.capture.samples.push(CapturedSample {
            ip: regs.ip,
            sp: regs.sp,
            bp: regs.bp,
            fp_chain: s.user_callchain.clone(),
            stack: s.stack_copy[..kept].to_vec(),
        });
    }

    /// Writes the fixture: the sampled process's modules and its samples.
    pub fn write(self) -> std::io::Result<()> {
        let mut capture = self.capture;
        capture.modules.retain(|m| Some(m.pid) == self.pid);
        std::fs::write(&self.path, serde_json::to_string_pretty(&capture)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("sampler-capture-{}-{name}", std::process::id()))
    }

    #[test]
    fn what_the_writer_writes_the_model_reads_back() {
        let path = scratch("roundtrip.json");
        let mut w = CaptureWriter::new(path.clone());
        let sample = |pid, ip| Sample {
            pid,
            tid: pid,
            user_callchain: vec![ip, 0x4010],
            user_regs: Some(UserRegs {
                ip,
                sp: 0x7ff0,
                bp: 0,
            }),
            stack_copy: (0..=255).cycle().take(CAPTURED_STACK_BYTES + 8).collect(),
            ..Sample::default()
        };
        w.sample(&sample(7, 0x4001));
        // Another process's sample, and one without registers, are not kept.
        w.sample(&sample(8, 0x4002));
        w.sample(&Sample {
            user_regs: None,
            ..sample(7, 0x4003)
        });
        w.write().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let read = Capture::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(text.contains("\"stack\": \"000102"), "{text}");
        assert_eq!(read.samples.len(), 1);
        let s = &read.samples[0];
        assert_eq!(
            (s.ip, s.sp, s.bp, &s.fp_chain[..]),
            (0x4001, 0x7ff0, 0, &[0x4001, 0x4010][..])
        );
        assert_eq!(s.stack.len(), CAPTURED_STACK_BYTES, "the stack copy is cut");
        assert_eq!(s.stack[..3], [0, 1, 2]);
        let replayed = s.to_sample(1);
        assert_eq!(
            (replayed.pid, replayed.stack_copy.len()),
            (1, CAPTURED_STACK_BYTES)
        );
    }

    #[test]
    fn a_file_that_is_not_a_capture_is_named_with_the_problem() {
        let path = scratch("bad.json");
        for (text, says) in [
            (
                r#"{"modules": [], "samples": [{"ip": 1, "sp": 2, "bp": 3, "fp_chain": [], "stack": "0g"}]}"#,
                "not hex at character 0",
            ),
            (
                r#"{"modules": [], "samples": [{"ip": 1, "sp": 2, "bp": 3, "fp_chain": [], "stack": "abc"}]}"#,
                "odd length",
            ),
            (r#"{"modules": []}"#, "missing field `samples`"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = Capture::read(&path).unwrap_err().to_string();
            assert!(
                err.starts_with(&path.display().to_string()) && err.contains(says),
                "{err}"
            );
        }
        std::fs::remove_file(&path).unwrap();
    }
}
