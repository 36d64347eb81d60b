//! Outputs: every format is written from the same symbolicated [`Profile`], so all of them
//! agree on every count.

pub mod firefox;
pub mod load;
pub mod report;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};

use flate2::write::GzEncoder;

use crate::profile::Profile;

/// Writes the Firefox Profiler profile into `file` (opened by the caller, so that a bad
/// output path is reported before recording starts), gzip-compressed when `path` ends in
/// `.gz`.
pub fn write_firefox(profile: &Profile, file: File, path: &Path) -> Result<()> {
    let value = firefox::to_json(profile);
    let mut out = BufWriter::new(file);
    if path.extension().is_some_and(|e| e == "gz") {
        let mut gz = GzEncoder::new(out, flate2::Compression::default());
        serde_json::to_writer(&mut gz, &value)?;
        gz.finish()?.flush()?;
    } else {
        serde_json::to_writer(&mut out, &value)?;
        out.flush()?;
    }
    Ok(())
}

/// Reads a JSON file, gunzipping it when it starts with the gzip magic bytes.
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let value = if bytes.starts_with(&[0x1f, 0x8b]) {
        serde_json::from_reader(flate2::read::GzDecoder::new(&bytes[..]))?
    } else {
        serde_json::from_slice(&bytes)?
    };
    Ok(value)
}
