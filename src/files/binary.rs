//! What a mapped ELF file is: its bytes, its load segments (to turn a file offset into
//! the address the file's own tables use), its build ID, and its call frame information
//! (`.eh_frame`), read once per file and shared by the unwinder and the symbolicator.
//!
//! A file opened from disk is not read whole while recording (a compiler's libraries are
//! hundreds of megabytes, nearly all code no profiler reads): its headers are read
//! through the open file, which is kept, and its `.eh_frame` a function at a time as
//! frames need it ([`crate::files::lazycfi`]). The
//! symbolicator reads what it needs later from the same open file, so a file replaced
//! on disk meanwhile is still the one that was mapped.
//!
//! Any user can make a file whose headers claim gigabytes it does not hold (a sparse
//! file costs its maker nothing): every size the headers give is checked against what
//! the open file holds ([`Held`]) before it is read or allocated, and a file that fails
//! is not read at all (`Binary::damaged`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::files::elf::{section_data, Elf, LoadSegment};
use crate::files::image::{read_whole, At, Held, Image, SectionBytes};
use crate::files::lazycfi::{LazyCfi, UnwindSections};
use crate::files::FileId;

/// The file behind a library of a profile, verified to be the one that was mapped, or
/// why there is none: what replay hands the symbolicator for each library.
pub type LibFile = Result<std::sync::Arc<Binary>, String>;

/// The most of a program's entry code read to find its entry stub's calls: `_start` is a
/// few dozen bytes, a static program's some hundred.
const ENTRY_CODE_BYTES: usize = 4096;

/// An ELF file as read from disk.
#[derive(Debug)]
pub struct Binary {
    pub path: PathBuf,
    image: Image,
    /// The whole file, kept only when it has no call frame information at all: unwinding
    /// then derives rules from its instructions (see [`crate::unwind`]).
    pub code_without_cfi: Option<Arc<[u8]>>,
    pub build_id: Option<Vec<u8>>,
    /// Why the file is not used at all when its headers claim more than it holds (see
    /// [`Held::check`]): then it has no symbols, DWARF or CFI here.
    pub damaged: Option<String>,
    /// The `.gnu_debuglink` of a stripped file: the debug file's name and its CRC-32.
    pub debuglink: Option<(String, u32)>,
    /// Whether the file has DWARF (`.debug_info`) and a full symbol table (`.symtab`),
    /// or needs a separate debug file for them.
    pub has_dwarf: bool,
    pub has_symtab: bool,
    pub segments: Vec<LoadSegment>,
    /// What CFI unwinding of this file's code needs (framehop reads it).
    pub unwind: UnwindSections,
    /// The return addresses of the calls its entry stub makes, in the file's addresses:
    /// a frame at one of them is the outermost one (see
    /// [`crate::files::entry::entry_stub_returns`]).
    pub entry_returns: Vec<u64>,
    /// The entry stub's code up to its last call (and the instruction after it), in the
    /// file's addresses: the program's `_start`, which a stripped file does not name.
    pub entry_stub: Option<std::ops::Range<u64>>,
    /// The signal trampolines unwinding found in each page of the file's code it
    /// searched: every process that maps the file searches a page once between them.
    pub trampolines: Arc<PageMemo>,
}

/// What was found in each page of a file's code searched so far (file offsets), by the
/// page's file offset: filled by whoever searches (see [`Binary::trampolines`]), which
/// says what is found.
#[derive(Debug, Default)]
pub struct PageMemo(Mutex<HashMap<u64, Arc<[u64]>>>);

impl PageMemo {
    /// What was found in the page at file offset `page`, searched now with `search` if
    /// it was not before.
    pub fn get_or_search(&self, page: u64, search: impl FnOnce() -> Vec<u64>) -> Arc<[u64]> {
        let mut pages = self.0.lock().unwrap_or_else(|e| e.into_inner());
        pages.entry(page).or_insert_with(|| search().into()).clone()
    }
}

impl Binary {
    /// Opens and parses `path`, reading only its headers and the sections unwinding
    /// needs. `None` when the file cannot be read or is not ELF.
    pub fn open(path: &Path) -> Option<Binary> {
        let file = Arc::new(std::fs::File::open(path).ok()?);
        if !file.metadata().ok()?.is_file() {
            return None;
        }
        let held = Held::of(&file).ok()?;
        let image = Image::File(file);
        let cache = object::ReadCache::new(At::new(image.clone()));
        Binary::parse(path.to_path_buf(), &cache, image, Some(&held))
    }

    /// Parses an ELF image held in `data`, which the binary keeps and shares: DWARF
    /// readers borrow its uncompressed sections rather than copying them.
    pub fn from_bytes(path: PathBuf, data: Arc<[u8]>) -> Option<Binary> {
        let bytes = data.clone();
        Binary::parse(path, &*bytes, Image::Bytes(data), None)
    }

    /// A binary whose headers claim more than the file holds: nothing of it is read,
    /// only why.
    fn damaged(path: PathBuf, image: Image, why: String) -> Binary {
        Binary {
            path,
            image,
            code_without_cfi: None,
            build_id: None,
            damaged: Some(why),
            debuglink: None,
            has_dwarf: false,
            has_symtab: false,
            segments: Vec::new(),
            unwind: UnwindSections::default(),
            entry_returns: Vec::new(),
            entry_stub: None,
            trampolines: Arc::default(),
        }
    }

    fn parse<'d, R: object::ReadRef<'d>>(
        path: PathBuf,
        data: R,
        image: Image,
        held: Option<&Held>,
    ) -> Option<Binary> {
        let elf = match Elf::parse_held(data, held) {
            Ok(elf) => elf,
            Err(None) => return None,
            Err(Some(why)) => return Some(Binary::damaged(path, image, why)),
        };
        let range = |name: &str| {
            let s = elf.section(name)?;
            Some(s.address()..s.address() + s.size())
        };
        let bytes = |name: &str| -> Option<SectionBytes> {
            Some(Arc::from(&*section_data(&elf, &elf.section(name)?).ok()?))
        };
        let with_range = |name: &str| Some((range(name)?, bytes(name)?));
        // In an open file, an uncompressed `.eh_frame` with its header is read a
        // function at a time.
        let placed = |name: &str| {
            let s = elf.section(name)?;
            let (offset, size) = s.file_range()?;
            (size == s.size()
                && elf.compressed_range(&s).ok()?.format == object::CompressionFormat::None)
                .then(|| (s.address()..s.address() + size, offset))
        };
        let lazy = match &image {
            Image::File(_) => {
                placed(".eh_frame")
                    .zip(placed(".eh_frame_hdr"))
                    .and_then(|(eh_frame, hdr)| {
                        LazyCfi::new(
                            At::new(image.clone()),
                            eh_frame,
                            hdr,
                            range(".text"),
                            range(".got"),
                        )
                    })
            }
            Image::Bytes(_) => None,
        };
        let unwind = match lazy {
            Some(lazy) => UnwindSections {
                text: range(".text"),
                got: range(".got"),
                lazy: Some(Arc::new(lazy)),
                ..UnwindSections::default()
            },
            None => UnwindSections {
                text: range(".text"),
                eh_frame: with_range(".eh_frame"),
                eh_frame_hdr: with_range(".eh_frame_hdr"),
                debug_frame: bytes(".debug_frame"),
                got: range(".got"),
                lazy: None,
            },
        };
        let mut binary = Binary {
            path,
            image,
            code_without_cfi: None,
            build_id: elf.build_id().map(<[u8]>::to_vec),
            damaged: None,
            debuglink: elf
                .gnu_debuglink()
                .map(|(name, crc)| (String::from_utf8_lossy(name).into_owned(), crc)),
            has_dwarf: elf.section(".debug_info").is_some(),
            has_symtab: elf.has_symtab(),
            segments: elf.segments(),
            unwind,
            entry_returns: Vec::new(),
            entry_stub: None,
            trampolines: Arc::default(),
        };
        if !binary.unwind.has_cfi() {
            binary.code_without_cfi = binary.bytes().ok();
        }
        let entry = elf.entry();
        if let Some(code) = binary.entry_code(entry) {
            binary.entry_returns = crate::files::entry::entry_stub_returns(&code, entry);
            binary.entry_stub = binary
                .entry_returns
                .iter()
                .max()
                .map(|&last| entry..last + 1);
        }
        Some(binary)
    }

    /// A reader of the file's parts, which keeps what it read until it is dropped: for
    /// `object::File::parse(&reader)`, which then reads only the sections asked for.
    pub fn reader(&self) -> object::ReadCache<At> {
        object::ReadCache::new(At::new(self.image.clone()))
    }

    /// A reader of the file's bytes at any offset, without read-ahead: for the few bytes
    /// of code unwinding looks at (the signal trampoline, see [`crate::unwind`]).
    pub fn file_reader(&self) -> At {
        At::new(self.image.clone())
    }

    /// The file parsed through `reader` (from [`Binary::reader`]), its headers checked
    /// anew against what it holds now (see [`Elf::parse_held`]): its owner may have
    /// changed it since it was opened. `None` when they claim more than it holds.
    pub fn elf<'d>(
        &self,
        reader: &'d object::ReadCache<At>,
    ) -> Option<Elf<'d, &'d object::ReadCache<At>>> {
        let held = match &self.image {
            Image::File(file) => Some(Held::of(file).ok()?),
            Image::Bytes(_) => None,
        };
        Elf::parse_held(reader, held.as_ref()).ok()
    }

    /// A reader of the file's bytes from its start.
    pub fn at(&self) -> At {
        At::new(self.image.clone())
    }

    /// Which file this is, as the kernel identifies it; `None` for an image in memory.
    pub fn file_id(&self) -> Option<FileId> {
        match &self.image {
            Image::Bytes(_) => None,
            Image::File(file) => file.metadata().ok().map(|m| FileId::of(&m)),
        }
    }

    /// The file's size in bytes.
    pub fn size(&self) -> std::io::Result<u64> {
        match &self.image {
            Image::Bytes(data) => Ok(data.len() as u64),
            Image::File(file) => Ok(file.metadata()?.len()),
        }
    }

    /// The file's metadata (inode, times), when it was read from a file and not from
    /// memory.
    pub fn metadata(&self) -> Option<std::fs::Metadata> {
        match &self.image {
            Image::Bytes(_) => None,
            Image::File(file) => file.metadata().ok(),
        }
    }

    /// The whole file's bytes: shared when they are in memory, else read from the open
    /// file (for the symbolicator, which drops them when it is done with the file).
    pub fn bytes(&self) -> std::io::Result<Arc<[u8]>> {
        match &self.image {
            Image::Bytes(data) => Ok(data.clone()),
            Image::File(file) => read_whole(file),
        }
    }

    /// `len` bytes from `offset` (fewer at the end of the file).
    fn read_at(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        self.at().read_exact_at(offset, len)
    }

    /// The file's code from its entry point `entry` (in the file's addresses) on, when it
    /// lies in an executable segment: enough for the entry stub's calls.
    fn entry_code(&self, entry: u64) -> Option<Vec<u8>> {
        let segment = self
            .segments
            .iter()
            .find(|s| s.executable && entry >= s.vaddr && entry - s.vaddr < s.file_size)?;
        let offset = segment.file_offset + (entry - segment.vaddr);
        let left = segment.file_offset + segment.file_size - offset;
        self.read_at(offset, usize::try_from(left).ok()?.min(ENTRY_CODE_BYTES))
    }

    /// What to add to a file offset inside an executable mapping of `len` bytes from
    /// `file_offset` to get the address in the file's own address space (its "SVMA", what
    /// symbols and DWARF use): `p_vaddr - p_offset` of the executable load segment the
    /// mapping shows. Mappings start at a page boundary, so with tightly packed segments
    /// (lld's layout) the first page of a code mapping also holds the end of the segment
    /// before it, whose `p_vaddr - p_offset` differs: the executable one is the one meant.
    pub fn code_svma_delta(&self, file_offset: u64, len: u64) -> Option<i64> {
        let overlapping = || {
            self.segments.iter().filter(move |s| {
                s.file_offset < file_offset + len && file_offset < s.file_offset + s.file_size
            })
        };
        let segment = overlapping()
            .find(|s| s.executable)
            .or_else(|| overlapping().next())?;
        Some(segment.vaddr.wrapping_sub(segment.file_offset) as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(segments: Vec<LoadSegment>) -> Binary {
        Binary {
            path: PathBuf::from("test"),
            image: Image::Bytes(Arc::from(Vec::new())),
            code_without_cfi: None,
            build_id: None,
            damaged: None,
            debuglink: None,
            has_dwarf: false,
            has_symtab: false,
            segments,
            unwind: UnwindSections::default(),
            entry_returns: Vec::new(),
            entry_stub: None,
            trampolines: Arc::default(),
        }
    }

    fn segment(file_offset: u64, vaddr: u64, file_size: u64, executable: bool) -> LoadSegment {
        LoadSegment {
            file_offset,
            vaddr,
            file_size,
            executable,
        }
    }

    #[test]
    fn code_mapping_takes_the_executable_segment_it_shares_a_page_with() {
        // lld's layout (rustc's default linker): the code segment starts mid-page, right
        // after the read-only one, and sits 0x1000 higher in memory than in the file.
        let b = binary(vec![
            segment(0, 0, 0x169bc, false),
            segment(0x169c0, 0x179c0, 0x3efc0, true),
            segment(0x55980, 0x57980, 0x2908, false),
        ]);
        // The kernel maps the code from the page that holds its start.
        assert_eq!(b.code_svma_delta(0x16000, 0x40000), Some(0x1000));
        // GNU ld's layout: the code segment is page-aligned, p_vaddr = p_offset.
        let b = binary(vec![
            segment(0, 0, 0x600, false),
            segment(0x1000, 0x1000, 0x200, true),
        ]);
        assert_eq!(b.code_svma_delta(0x1000, 0x1000), Some(0));
        // A library linked at 0x100000 (bench-targets' libhot.so).
        let b = binary(vec![
            segment(0, 0x100000, 0x418, false),
            segment(0x1000, 0x101000, 0x10d, true),
        ]);
        assert_eq!(b.code_svma_delta(0x1000, 0x1000), Some(0x100000));
        assert_eq!(b.code_svma_delta(0x9000, 0x1000), None, "no segment there");
    }
}
