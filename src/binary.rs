//! What a mapped ELF file is: its bytes, its load segments (to turn a file offset into
//! the address the file's own tables use), its build ID, and its call frame information
//! (`.eh_frame`), read once per file and shared by the unwinder and the symbolicator.

use std::path::{Path, PathBuf};

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, UnwindContext, UnwindSection,
};
use object::{Object, ObjectSection, ObjectSegment};

/// One `PT_LOAD` segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub vaddr: u64,
    pub file_size: u64,
}

/// How to find the canonical frame address (the caller's stack pointer) at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameRule {
    /// CFA = RSP + offset: the function has not set up (or has torn down) an RBP frame.
    SpOffset(i64),
    /// CFA = RBP + offset: the usual frame-pointer frame.
    BpOffset(i64),
}

/// A section's bytes and the address it is loaded at, in the file's own address space.
#[derive(Clone, Debug, Default)]
struct SectionData {
    address: u64,
    bytes: Vec<u8>,
}

/// An ELF file as read from disk.
#[derive(Debug)]
pub struct Binary {
    pub path: PathBuf,
    pub data: Vec<u8>,
    pub build_id: Option<Vec<u8>>,
    /// The `.gnu_debuglink` of a stripped file: the debug file's name and its CRC-32.
    pub debuglink: Option<(String, u32)>,
    /// Whether the file has DWARF (`.debug_info`) and a full symbol table (`.symtab`),
    /// or needs a separate debug file for them.
    pub has_dwarf: bool,
    pub has_symtab: bool,
    pub segments: Vec<LoadSegment>,
    eh_frame: Option<SectionData>,
    eh_frame_hdr: Option<SectionData>,
    text_address: u64,
}

/// DWARF register numbers on x86-64 (System V psABI, figure 3.36).
const DWARF_REG_RBP: u16 = 6;
const DWARF_REG_RSP: u16 = 7;

impl Binary {
    /// Reads and parses `path`. `None` when the file cannot be read or is not ELF.
    pub fn open(path: &Path) -> Option<Binary> {
        let data = std::fs::read(path).ok()?;
        Binary::from_bytes(path.to_path_buf(), data)
    }

    pub fn from_bytes(path: PathBuf, data: Vec<u8>) -> Option<Binary> {
        let mut binary = {
            let file = object::File::parse(&*data).ok()?;
            let section = |name: &str| {
                let s = file.section_by_name(name)?;
                Some(SectionData {
                    address: s.address(),
                    bytes: s.uncompressed_data().ok()?.into_owned(),
                })
            };
            Binary {
                path,
                // Filled in below, once `file` no longer borrows the bytes.
                data: Vec::new(),
                build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
                debuglink: file
                    .gnu_debuglink()
                    .ok()
                    .flatten()
                    .map(|(name, crc)| (String::from_utf8_lossy(name).into_owned(), crc)),
                has_dwarf: file.section_by_name(".debug_info").is_some(),
                has_symtab: file.symbol_table().is_some(),
                segments: file
                    .segments()
                    .map(|s| {
                        let (offset, size) = s.file_range();
                        LoadSegment {
                            file_offset: offset,
                            vaddr: s.address(),
                            file_size: size,
                        }
                    })
                    .collect(),
                eh_frame: section(".eh_frame"),
                eh_frame_hdr: section(".eh_frame_hdr"),
                text_address: file.section_by_name(".text").map_or(0, |s| s.address()),
            }
        };
        binary.data = data;
        Some(binary)
    }

    /// The address in the file's own address space (its "SVMA", what symbols and DWARF
    /// use) of the byte at `file_offset`: found through the load segment that contains it,
    /// since a segment's `p_vaddr` and `p_offset` may differ.
    pub fn file_offset_to_svma(&self, file_offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| file_offset >= s.file_offset && file_offset < s.file_offset + s.file_size)
            .map(|s| s.vaddr + (file_offset - s.file_offset))
    }

    /// The frame rule at `svma` from `.eh_frame`, when the CFA is RSP- or RBP-based.
    pub fn frame_rule(&self, svma: u64) -> Option<FrameRule> {
        let eh = self.eh_frame.as_ref()?;
        let mut bases = BaseAddresses::default()
            .set_eh_frame(eh.address)
            .set_text(self.text_address);
        let eh_frame = EhFrame::new(&eh.bytes, LittleEndian);
        let mut ctx = UnwindContext::new();
        let row = match &self.eh_frame_hdr {
            Some(hdr) => {
                bases = bases.set_eh_frame_hdr(hdr.address);
                let parsed = EhFrameHdr::new(&hdr.bytes, LittleEndian)
                    .parse(&bases, 8)
                    .ok()?;
                let table = parsed.table()?;
                table
                    .unwind_info_for_address(
                        &eh_frame,
                        &bases,
                        &mut ctx,
                        svma,
                        EhFrame::cie_from_offset,
                    )
                    .ok()?
                    .clone()
            }
            None => eh_frame
                .unwind_info_for_address(&bases, &mut ctx, svma, EhFrame::cie_from_offset)
                .ok()?
                .clone(),
        };
        match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } if register.0 == DWARF_REG_RSP => {
                Some(FrameRule::SpOffset(*offset))
            }
            CfaRule::RegisterAndOffset { register, offset } if register.0 == DWARF_REG_RBP => {
                Some(FrameRule::BpOffset(*offset))
            }
            _ => None,
        }
    }
}
