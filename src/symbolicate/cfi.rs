//! Functions without names: the ranges of code that `.eh_frame` describes, one FDE per
//! function, which name code no symbol covers (a stripped library's static functions)
//! after their start, `fn_0x4a2c0`, so that its addresses group into functions.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use gimli::{BaseAddresses, CieOrFde, EhFrame, RunTimeEndian, UnwindSection};

use crate::files::elf::Elf;
use crate::files::image::SectionBytes;
use crate::files::lazycfi::LazyCfi;

/// The prefix of a function named after its start: `fn_0x4a2c0`.
pub const UNNAMED_PREFIX: &str = "fn_0x";

/// Where a file's `.eh_frame` is, to read it when an address needs it.
#[derive(Clone, Debug)]
pub struct EhFrameSource {
    /// The section's address in the file's address space (FDEs point relative to it).
    pub address: u64,
    pub bytes: EhFrameBytes,
    /// The address of `.text`, for the rare pointers encoded relative to it.
    pub text: Option<u64>,
    pub endian: RunTimeEndian,
    /// The size of an address: 8 in 64-bit files, 4 in 32-bit ones.
    pub address_size: u8,
}

/// The bytes of an `.eh_frame`: held, or read from the file when first needed.
#[derive(Clone, Debug)]
pub enum EhFrameBytes {
    Held(SectionBytes),
    Lazy(Arc<LazyCfi>),
}

impl EhFrameSource {
    /// The `.eh_frame` of `file`, whose bytes (`bytes`, at `address`) the caller may
    /// already hold, or read when needed (`lazy`); else they are read from the file now.
    pub fn of<'d, R: object::ReadRef<'d>>(
        file: &Elf<'d, R>,
        known: Option<(u64, SectionBytes)>,
        lazy: Option<&Arc<LazyCfi>>,
    ) -> Option<Self> {
        let (address, bytes) = match (known, lazy) {
            (Some((address, bytes)), _) => (address, EhFrameBytes::Held(bytes)),
            (None, Some(lazy)) => (
                file.section(".eh_frame")?.address(),
                EhFrameBytes::Lazy(lazy.clone()),
            ),
            (None, None) => {
                let section = file.section(".eh_frame")?;
                let bytes = crate::files::elf::section_data(file, &section).ok()?;
                (
                    section.address(),
                    EhFrameBytes::Held(SectionBytes::from(&*bytes)),
                )
            }
        };
        Some(EhFrameSource {
            address,
            bytes,
            text: file.section(".text").map(|s| s.address()),
            endian: file.gimli_endian(),
            // Only 64-bit files are read (see [`Elf`]).
            address_size: 8,
        })
    }
}

/// The pc ranges of a file's FDEs: read whole and sorted by start (empty ones left
/// out), or looked up one at a time in the file's `.eh_frame_hdr` table when it has one
/// in the layout [`LazyCfi`] reads. A compiler's library holds 6–8 MB of `.eh_frame`,
/// and a profile names a few of its functions this way.
#[derive(Clone, Debug)]
pub enum FunctionRanges {
    Read(Vec<Range<u64>>),
    Lazy(Arc<LazyCfi>),
}

impl Default for FunctionRanges {
    fn default() -> Self {
        FunctionRanges::Read(Vec::new())
    }
}

impl FunctionRanges {
    /// The ranges of `source`'s FDEs: those of a table in the file are read as they are
    /// needed, others now. A damaged section gives the FDEs before the damage: each FDE
    /// read adds at most one range, so memory is bounded by the section's size.
    pub fn read(source: &EhFrameSource) -> FunctionRanges {
        let bytes = match &source.bytes {
            EhFrameBytes::Held(bytes) => bytes.clone(),
            EhFrameBytes::Lazy(lazy) => return FunctionRanges::Lazy(lazy.clone()),
        };
        let mut eh_frame = EhFrame::new(&bytes, source.endian);
        eh_frame.set_address_size(source.address_size);
        let mut bases = BaseAddresses::default().set_eh_frame(source.address);
        if let Some(text) = source.text {
            bases = bases.set_text(text);
        }
        let mut cies = HashMap::new();
        let mut ranges = Vec::new();
        let mut entries = eh_frame.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let fde = partial.parse(|section, bases, offset| {
                if let Some(cie) = cies.get(&offset) {
                    return Ok(Clone::clone(cie));
                }
                let cie = section.cie_from_offset(bases, offset)?;
                cies.insert(offset, cie.clone());
                Ok(cie)
            });
            let Ok(fde) = fde else { continue };
            let start = fde.initial_address();
            if let Some(end) = start.checked_add(fde.len()).filter(|&end| end > start) {
                ranges.push(start..end);
            }
        }
        ranges.sort_unstable_by_key(|r| (r.start, r.end));
        FunctionRanges::Read(ranges)
    }

    /// The function range holding `address`: of nested or overlapping ones (which real
    /// files do not have), the one that starts last.
    pub fn containing(&self, address: u64) -> Option<Range<u64>> {
        let ranges = match self {
            FunctionRanges::Read(ranges) => ranges,
            FunctionRanges::Lazy(lazy) => {
                let fde = lazy.function_at(address)?.fde.clone()?;
                return fde.contains(&address).then_some(fde);
            }
        };
        let i = ranges.partition_point(|r| r.start <= address);
        ranges[..i]
            .iter()
            .rev()
            .take(MAX_OVERLAP)
            .find(|r| address < r.end)
            .cloned()
    }

    /// The addresses around `address` that [`FunctionRanges::containing`] gives the same
    /// answer for: between the nearest start or end, at or below it, of the ranges it
    /// looks at, and the nearest one above it (or the next range's start).
    pub fn extent(&self, address: u64) -> Range<u64> {
        let ranges = match self {
            FunctionRanges::Read(ranges) => ranges,
            // The table's entry at or below the address (or its first one) covers the
            // addresses up to the next entry's start: inside it, its FDE's range, and the
            // gaps before and after that.
            FunctionRanges::Lazy(lazy) => {
                let Some(function) = lazy.function_at(address) else {
                    return address..address.saturating_add(1);
                };
                let covers = function.covers.clone();
                return match function.fde.clone() {
                    Some(fde) if address < fde.start => covers.start..fde.start,
                    Some(fde) if address < fde.end => fde.start..fde.end.min(covers.end),
                    Some(fde) => fde.end.max(covers.start)..covers.end,
                    None => covers,
                };
            }
        };
        let i = ranges.partition_point(|r| r.start <= address);
        let mut extent = 0..ranges.get(i).map_or(u64::MAX, |r| r.start);
        for r in ranges[..i].iter().rev().take(MAX_OVERLAP) {
            for bound in [r.start, r.end] {
                if bound <= address {
                    extent.start = extent.start.max(bound);
                } else {
                    extent.end = extent.end.min(bound);
                }
            }
        }
        extent
    }
}

/// How many ranges before an address [`FunctionRanges::containing`] looks at: a real
/// file's FDEs do not overlap, so the one just before is the answer, and a few more
/// allow for duplicates without letting a crafted file make each lookup linear.
const MAX_OVERLAP: usize = 4;

/// The name of an unnamed function that starts at `start`.
pub fn unnamed_function(start: u64) -> String {
    format!("{UNNAMED_PREFIX}{start:x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_in_the_range_that_holds_it() {
        let functions = FunctionRanges::Read(vec![0x100..0x140, 0x140..0x180, 0x200..0x210]);
        assert_eq!(functions.containing(0x100), Some(0x100..0x140));
        assert_eq!(functions.containing(0x13f), Some(0x100..0x140));
        assert_eq!(functions.containing(0x140), Some(0x140..0x180));
        assert_eq!(functions.containing(0x180), None, "between functions");
        assert_eq!(functions.containing(0xff), None);
        assert_eq!(unnamed_function(0x4a2c0), "fn_0x4a2c0");
    }

    #[test]
    fn a_damaged_section_gives_what_comes_before_the_damage() {
        let source = |bytes: &[u8]| EhFrameSource {
            address: 0x1000,
            bytes: EhFrameBytes::Held(SectionBytes::from(bytes)),
            text: None,
            endian: RunTimeEndian::Little,
            address_size: 8,
        };
        assert!(
            matches!(FunctionRanges::read(&source(&[])), FunctionRanges::Read(r) if r.is_empty())
        );
        // A length that runs past the end of the section.
        assert!(matches!(
            FunctionRanges::read(&source(&[0xf0, 0xff, 0xff, 0x0f, 0, 0, 0, 0])),
            FunctionRanges::Read(r) if r.is_empty()
        ));
    }
}
