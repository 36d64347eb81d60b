//! A profile file on disk, read back: plain or gzipped JSON, bounded in size, and checked
//! to start like JSON before more of it is read, then given to the Firefox format's
//! reader ([`super::firefox::from_slice`]). Errors name the file.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::firefox;
use crate::profile::Profile;

/// Reads a profile file (plain or gzipped JSON, bounded: see [`read_json_text`]). The
/// text goes straight into the typed model.
pub fn read_profile(path: &Path) -> Result<Profile> {
    let text = read_json_text(path)?;
    firefox::from_slice(&text).with_context(|| {
        format!(
            "{} is not a profile that sampler wrote (Firefox Profiler processed format)",
            path.display()
        )
    })
}

/// The largest profile text read back: 256 MiB of JSON (about ten million samples).
/// Parsed into the typed model it takes less than its text; the limit keeps a damaged or
/// hostile file (a gzip bomb, `/dev/zero`) from taking more memory than that.
pub const MAX_PROFILE_TEXT: u64 = 256 << 20;

/// Bytes read before checking that a file starts like a JSON object (after whitespace).
const JSON_START_WINDOW: u64 = 4096;

/// Reads the text of a JSON file, gunzipping it when it starts with the gzip magic bytes,
/// and refusing it once it is over [`MAX_PROFILE_TEXT`], or when it cannot be JSON at all.
/// Errors name the file.
pub fn read_json_text(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let damaged = || format!("cannot read {} (gzip data damaged?)", path.display());
    let mut source = open_plain(path)?.take(MAX_PROFILE_TEXT + 1);
    let mut text = Vec::new();
    // The first bytes say whether it can be a JSON object at all (not `/dev/zero`).
    (&mut source)
        .take(JSON_START_WINDOW)
        .read_to_end(&mut text)
        .with_context(damaged)?;
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        bail!(
            "{} is not a JSON profile (it does not start with {{)",
            path.display()
        );
    }
    source.read_to_end(&mut text).with_context(damaged)?;
    if text.len() as u64 > MAX_PROFILE_TEXT {
        bail!(
            "{} holds more than {} MiB of JSON: sampler reads profiles up to that size",
            path.display(),
            MAX_PROFILE_TEXT >> 20
        );
    }
    Ok(text)
}

/// A file's bytes as a reader, gunzipped when they start with the gzip magic bytes;
/// unbounded (callers take what they allow). Errors name the file.
pub fn open_plain(path: &Path) -> Result<Box<dyn std::io::Read>> {
    use std::io::BufRead;
    let fail = || format!("cannot read {}", path.display());
    let file = std::fs::File::open(path).with_context(fail)?;
    let mut reader = std::io::BufReader::new(file);
    let gzip = reader
        .fill_buf()
        .with_context(fail)?
        .starts_with(&[0x1f, 0x8b]);
    Ok(match gzip {
        true => Box::new(flate2::read::GzDecoder::new(reader)),
        false => Box::new(reader),
    })
}

/// Reads a JSON file (see [`read_json_text`]).
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = read_json_text(path)?;
    serde_json::from_slice(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}
