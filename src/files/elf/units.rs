//! Sections read as streams: a section's bytes inflated (or not) as they are read, and
//! sections of units (`.debug_info`, `.debug_line`) read keeping only the units wanted.
//! Neither holds a compressed section's input whole.

use object::{CompressedFileRange, CompressionFormat};

use super::{stored_range, Elf, Section};
use crate::files::image::{At, SectionBytes};

/// A section made of units that each start with their 32-bit length (`.debug_info`,
/// `.debug_line`), read keeping only the units at the offsets `keep` wants, into the
/// buffer `zeroed` gives (zeros that may cost no memory until written:
/// `record::zeroed_shared`). Each run of units left out between them is handed to
/// `stand_in` as its bytes in the buffer (zeros) to write there what readers of the
/// section are to find instead, if anything; nothing else of a run is written, so its
/// pages cost nothing. Gives the bytes and where every unit of the section starts. A
/// compressed section is inflated as a stream, through a small buffer. `None` when the
/// section is not laid out as such units (a unit in the 64-bit format, one too short for
/// a header, one past the end, or more than [`MAX_UNITS`] of them) or `stand_in` could
/// not stand in for a run (it says so with `false`): the caller reads it whole.
pub fn section_units<'d, R: object::ReadRef<'d>>(
    elf: &Elf<'d, R>,
    section: &Section<'d>,
    at: &At,
    keep: &dyn Fn(usize) -> bool,
    stand_in: &dyn Fn(&mut [u8]) -> bool,
    zeroed: &dyn Fn(usize) -> Result<SectionBytes, String>,
) -> Result<Option<(SectionBytes, Vec<usize>)>, String> {
    use gimli::Endianity as _;
    let name = section.name;
    let unreadable =
        |why: &dyn std::fmt::Display| format!("its section {name} cannot be read: {why}");
    let (range, len) = stored_range(elf, section)?;
    let mut source = match range.format {
        CompressionFormat::None => UnitSource::Stored(at.clone(), range.offset),
        _ => UnitSource::Inflating(inflating(section, &range, at)?, 0),
    };
    let mut data = zeroed(len)?;
    let out = std::sync::Arc::get_mut(&mut data)
        .filter(|out| out.len() == len)
        .ok_or_else(|| unreadable(&"no buffer of its own"))?;
    let endian = elf.gimli_endian();
    let mut starts = Vec::new();
    // Where the run of units left out that reaches `start` began.
    let mut run: Option<usize> = None;
    let mut start = 0;
    while start < len {
        let length_end = len.min(start + 4);
        let mut head = [0u8; 4];
        let got = &mut head[..length_end - start];
        source.copy(start, got, name)?;
        if length_end - start < 4 {
            // Padding after the last unit.
            out[start..length_end].copy_from_slice(got);
            break;
        }
        let length = endian.read_u32(&head);
        // 0xffff_fff0 and above: the 64-bit format, or reserved values.
        if !(MIN_UNIT_LENGTH..0xffff_fff0).contains(&length) || starts.len() == MAX_UNITS {
            return Ok(None);
        }
        let Some(end) = (length_end)
            .checked_add(length as usize)
            .filter(|&end| end <= len)
        else {
            return Ok(None);
        };
        starts.push(start);
        if keep(start) {
            if let Some(from) = run.take() {
                if !stand_in(&mut out[from..start]) {
                    return Ok(None);
                }
            }
            out[start..length_end].copy_from_slice(&head);
            source.copy(length_end, &mut out[length_end..end], name)?;
        } else {
            run.get_or_insert(start);
            source.skip_to(end, name)?;
        }
        start = end;
    }
    if let Some(from) = run {
        if !stand_in(&mut out[from..start]) {
            return Ok(None);
        }
    }
    Ok(Some((data, starts)))
}

/// How many bytes a section holds (inflated, when compressed), as its headers say
/// (checked as [`section_stream`] checks them).
pub fn section_size<'d, R: object::ReadRef<'d>>(
    elf: &Elf<'d, R>,
    section: &Section<'d>,
) -> Result<usize, String> {
    stored_range(elf, section).map(|(_, len)| len)
}

/// A section's bytes (inflated when compressed) as a stream read from the file through
/// `at` (a compressed section's input too: neither is held whole), and how many bytes
/// it gives: exactly that many, or the reader fails.
pub fn section_stream<'d, R: object::ReadRef<'d>>(
    elf: &Elf<'d, R>,
    section: &Section<'d>,
    at: &At,
) -> Result<(Box<dyn std::io::Read>, usize), String> {
    use std::io::Read as _;
    let (range, len) = stored_range(elf, section)?;
    let stream = match range.format {
        CompressionFormat::None => Box::new(positioned(at, range.offset)?.take(len as u64)),
        _ => inflating(section, &range, at)?,
    };
    Ok((stream, len))
}

/// `at`, reading from `offset`.
fn positioned(at: &At, offset: u64) -> Result<At, String> {
    use std::io::Seek as _;
    let mut reader = at.clone();
    reader
        .seek(std::io::SeekFrom::Start(offset))
        .map_err(|e| e.to_string())?;
    Ok(reader)
}

/// The inflating stream of a compressed section stored at `range`, reading its input from
/// the file as it goes.
fn inflating(
    section: &Section<'_>,
    range: &CompressedFileRange,
    at: &At,
) -> Result<Box<dyn std::io::Read>, String> {
    use std::io::Read as _;
    let name = section.name;
    let input = positioned(at, range.offset)?.take(range.compressed_size);
    Ok(match range.format {
        CompressionFormat::Zlib => Box::new(flate2::read::ZlibDecoder::new(input)),
        CompressionFormat::Zstandard => Box::new(
            ruzstd::decoding::StreamingDecoder::new(input)
                .map_err(|e| format!("its section {name} cannot be inflated: {e}"))?,
        ),
        other => return Err(format!("{other:?} compression is not supported")),
    })
}

/// The shortest length a unit of [`section_units`] can give after its length field: a
/// DWARF 2-4 unit header's version, abbreviation offset and address size (7 bytes; a line
/// program's header is longer). A shorter one is a damaged section, whose starts could
/// otherwise be 4 bytes apart.
const MIN_UNIT_LENGTH: u32 = 7;

/// The most units [`section_units`] keeps the starts of: 2^20, far beyond the largest
/// programs' (tens of thousands of compilation units) and 8 MB of starts; a section with
/// more is read whole.
pub const MAX_UNITS: usize = 1 << 20;

/// Where [`section_units`] reads a section's bytes: the file, where the section starts
/// (read through the reader's read-ahead: units' lengths are a few bytes each, a few
/// kilobytes apart, and a read of the file for each, 2,000 for libc's debug file, cost
/// more than the bytes themselves); or its inflating stream, and how far
/// it has inflated (it reads only forward).
enum UnitSource<'a> {
    Stored(At, u64),
    Inflating(Box<dyn std::io::Read + 'a>, usize),
}

impl UnitSource<'_> {
    /// Fills `out` with the section's bytes from `from` (for a stream, where it is).
    fn copy(&mut self, from: usize, out: &mut [u8], name: &str) -> Result<(), String> {
        use std::io::{Read as _, Seek as _};
        let short = || format!("its section {name} cannot be read: it is shorter than it says");
        match self {
            UnitSource::Stored(reader, offset) => reader
                .seek(std::io::SeekFrom::Start(*offset + from as u64))
                .and_then(|_| reader.read_exact(out))
                .map_err(|_| short()),
            UnitSource::Inflating(stream, at) => {
                debug_assert_eq!(*at, from, "a stream is read forward only");
                stream.read_exact(out).map_err(|_| short())?;
                *at += out.len();
                Ok(())
            }
        }
    }

    /// Passes over the section's bytes up to `to` (a stream inflates them, unkept).
    fn skip_to(&mut self, to: usize, name: &str) -> Result<(), String> {
        if let UnitSource::Inflating(stream, at) = self {
            let want = (to - *at) as u64;
            use std::io::Read as _;
            let got = std::io::copy(&mut stream.by_ref().take(want), &mut std::io::sink())
                .map_err(|e| format!("its section {name} cannot be inflated: {e}"))?;
            if got != want {
                return Err(format!(
                    "its section {name} cannot be read: it is shorter than it says"
                ));
            }
            *at = to;
        }
        Ok(())
    }
}
