//! What a mapped ELF file is: its bytes, its load segments (to turn a file offset into
//! the address the file's own tables use), its build ID, and its call frame information
//! (`.eh_frame`), read once per file and shared by the unwinder and the symbolicator.
//!
//! A file opened from disk is not read whole while recording (a compiler's libraries are
//! hundreds of megabytes, nearly all code no profiler reads): its headers are read
//! through the open file, which is kept, and its `.eh_frame` a function at a time as
//! frames need it ([`crate::lazycfi`]). The
//! symbolicator reads what it needs later from the same open file, so a file replaced
//! on disk meanwhile is still the one that was mapped.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::elf::{Elf, Section};
use crate::events::FileId;

/// The most of a program's entry code read to find its entry stub's calls: `_start` is a
/// few dozen bytes, a static program's some hundred.
const ENTRY_CODE_BYTES: usize = 4096;

/// A shared buffer of `len` bytes that `fill` writes: made once at its final size and
/// filled in place, never a copy of another buffer.
fn shared_filled<E>(
    len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<Arc<[u8]>, E> {
    let mut data: Arc<[u8]> = std::iter::repeat_n(0u8, len).collect();
    fill(Arc::get_mut(&mut data).expect("a new buffer has one owner"))?;
    Ok(data)
}

/// Reads an open file whole into one shared buffer.
fn read_whole(file: &std::fs::File) -> std::io::Result<Arc<[u8]>> {
    let len = usize::try_from(file.metadata()?.len()).map_err(std::io::Error::other)?;
    shared_filled(len, |buffer| file.read_exact_at(buffer, 0))
}

/// One `PT_LOAD` segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub vaddr: u64,
    pub file_size: u64,
    pub executable: bool,
}

/// The most a deflate stream can inflate: a zlib-compressed section can hold at most
/// about 1,032 times its size (deflate's limit); a little more is allowed for headers.
const MAX_ZLIB_RATIO: u64 = 1100;
/// The same for zstd, whose run-length blocks reach about 32,768:1 (a 128 KiB block of one
/// byte in 4 bytes).
const MAX_ZSTD_RATIO: u64 = 33_000;
/// No debug section of a real program is larger than this once inflated (the largest
/// seen here, a Rust compiler's `.debug_info`, is a few hundred MiB).
const MAX_SECTION_BYTES: u64 = 4 << 30;

/// A section's bytes, inflated when it is compressed (`SHF_COMPRESSED`, `.zdebug_*`).
/// A compressed section whose header declares more than its data could inflate to is a
/// damaged or hostile file: it is refused, with the reason, rather than allocated.
pub fn section_data<'d, R: object::ReadRef<'d>>(
    elf: &Elf<'d, R>,
    section: &Section<'d>,
) -> Result<std::borrow::Cow<'d, [u8]>, String> {
    let name = section.name;
    let compressed = elf
        .compressed_data(section)
        .map_err(|e| format!("its section {name} cannot be read: {e}"))?;
    check_compressed(
        name,
        compressed.format,
        compressed.data.len() as u64,
        compressed.uncompressed_size,
    )?;
    compressed
        .decompress()
        .map_err(|e| format!("its section {name} cannot be inflated: {e}"))
}

/// Refuses a compressed section that says it holds more than its format can give from
/// `have` bytes, or more than [`MAX_SECTION_BYTES`].
fn check_compressed(
    name: &str,
    format: object::CompressionFormat,
    have: u64,
    declared: u64,
) -> Result<(), String> {
    let ratio = match format {
        object::CompressionFormat::None => None,
        object::CompressionFormat::Zstandard => Some(MAX_ZSTD_RATIO),
        _ => Some(MAX_ZLIB_RATIO),
    };
    if let Some(ratio) = ratio {
        if declared > MAX_SECTION_BYTES || declared > have.saturating_mul(ratio) + 4096 {
            return Err(format!(
                "its compressed section {name} says it holds {declared} bytes in {have}, more than compression can give (a damaged file)"
            ));
        }
    }
    Ok(())
}

/// A section's bytes (inflated when compressed), read from the file through `at` into
/// one buffer that is then shared, without passing through `object`'s read cache: the
/// DWARF of a large library is tens of MB, which that cache would keep a copy of (and,
/// compressed, the compressed bytes too) for as long as the file is open.
pub fn section_shared<'d, R: object::ReadRef<'d>>(
    elf: &Elf<'d, R>,
    section: &Section<'d>,
    at: &At,
) -> Result<SectionBytes, String> {
    let name = section.name;
    let unreadable =
        |why: &dyn std::fmt::Display| format!("its section {name} cannot be read: {why}");
    let range = elf.compressed_range(section).map_err(|e| unreadable(&e))?;
    check_compressed(
        name,
        range.format,
        range.compressed_size,
        range.uncompressed_size,
    )?;
    // The inflated size is known before reading: the buffer is made at its size.
    let len = usize::try_from(range.uncompressed_size).map_err(|e| unreadable(&e))?;
    let short = || unreadable(&"the file is shorter than its section headers say");
    shared_filled(len, |out| {
        if range.format == object::CompressionFormat::None {
            return match at.read_into(range.offset, out) {
                Some(got) if got == len => Ok(()),
                _ => Err(short()),
            };
        }
        let stored = usize::try_from(range.compressed_size).map_err(|e| unreadable(&e))?;
        let input = at
            .read_exact_at(range.offset, stored)
            .filter(|b| b.len() == stored)
            .ok_or_else(short)?;
        let inflated = match range.format {
            object::CompressionFormat::Zlib => {
                let mut inflate = flate2::Decompress::new(true);
                inflate
                    .decompress(&input, out, flate2::FlushDecompress::Finish)
                    .map_err(|e| e.to_string())
                    .map(|_| inflate.total_out())
            }
            object::CompressionFormat::Zstandard => {
                use std::io::Read;
                ruzstd::decoding::StreamingDecoder::new(&input[..])
                    .map_err(|e| e.to_string())
                    .and_then(|mut d| d.read_exact(out).map_err(|e| e.to_string()))
                    .map(|()| len as u64)
            }
            other => Err(format!("{other:?} compression is not supported")),
        };
        match inflated {
            Ok(n) if n == len as u64 => Ok(()),
            Ok(n) => Err(format!(
                "its section {name} cannot be inflated: {n} bytes where it says {len}"
            )),
            Err(why) => Err(format!("its section {name} cannot be inflated: {why}")),
        }
    })
}

/// Section bytes, shared between the binary and the unwinders of every process mapping it.
pub type SectionBytes = Arc<[u8]>;

/// The sections CFI unwinding needs, in the file's own addresses (SVMA).
#[derive(Clone, Debug, Default)]
pub struct UnwindSections {
    pub text: Option<std::ops::Range<u64>>,
    pub eh_frame: Option<(std::ops::Range<u64>, SectionBytes)>,
    pub eh_frame_hdr: Option<(std::ops::Range<u64>, SectionBytes)>,
    pub debug_frame: Option<SectionBytes>,
    pub got: Option<std::ops::Range<u64>>,
    /// `.eh_frame` read one function at a time (then `eh_frame` and `eh_frame_hdr` are
    /// not read): see [`crate::lazycfi`].
    pub lazy: Option<Arc<crate::lazycfi::LazyCfi>>,
}

impl UnwindSections {
    /// Whether the file has call frame information at all.
    pub fn has_cfi(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some() || self.lazy.is_some()
    }

    /// `.eh_frame` and its address, read whole now when it is read lazily.
    pub fn eh_frame_whole(&self) -> Option<(u64, SectionBytes)> {
        match (&self.eh_frame, &self.lazy) {
            (Some((range, bytes)), _) => Some((range.start, bytes.clone())),
            (None, Some(lazy)) => lazy.whole(),
            (None, None) => None,
        }
    }
}

/// Where a binary's bytes are.
#[derive(Clone, Debug)]
enum Image {
    /// In memory: the vdso, a debug file read whole, bytes given by a test.
    Bytes(Arc<[u8]>),
    /// The open file, read where needed.
    File(Arc<std::fs::File>),
}

/// Reads a binary's bytes by position (an open file with `pread`, so that readers of one
/// file in several threads never share an offset); `object`'s read cache reads through
/// it, keeping only what was read.
#[derive(Clone)]
pub struct At {
    image: Image,
    pos: u64,
    /// The file's bytes from `window.0` on, read ahead: a symbol table's names are read
    /// one small read at a time, mostly in order.
    window: (u64, Vec<u8>),
}

impl At {
    fn new(image: Image) -> At {
        At {
            image,
            pos: 0,
            window: (0, Vec::new()),
        }
    }

    /// A reader of bytes held in memory.
    pub fn of_bytes(data: Arc<[u8]>) -> At {
        At::new(Image::Bytes(data))
    }

    /// `len` bytes from `offset` (fewer at the end of the file), read as they are, with
    /// no read-ahead and leaving the position alone: for lookups that jump around.
    pub fn read_exact_at(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0; len];
        let got = self.read_into(offset, &mut buf)?;
        buf.truncate(got);
        Some(buf)
    }

    /// Fills `buf` from `offset` (less of it at the end of the file); how much was read.
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Option<usize> {
        let len = buf.len();
        let mut got = 0;
        while got < len {
            let n = match &self.image {
                Image::File(file) => file.read_at(&mut buf[got..], offset + got as u64).ok()?,
                Image::Bytes(data) => {
                    let start = usize::try_from(offset)
                        .ok()?
                        .saturating_add(got)
                        .min(data.len());
                    let n = (len - got).min(data.len() - start);
                    buf[got..got + n].copy_from_slice(&data[start..start + n]);
                    n
                }
            };
            if n == 0 {
                break;
            }
            got += n;
        }
        Some(got)
    }
}

/// How much a small read of an open file reads ahead (see [`At`]).
const READ_AHEAD: usize = 64 * 1024;

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = match &self.image {
            Image::File(file) if buf.len() >= READ_AHEAD => file.read_at(buf, self.pos)?,
            Image::File(file) => {
                let (start, bytes) = &mut self.window;
                let inside = self.pos >= *start
                    && self.pos + buf.len() as u64 <= *start + bytes.len() as u64;
                if !inside {
                    bytes.resize(READ_AHEAD, 0);
                    let got = file.read_at(bytes, self.pos)?;
                    bytes.truncate(got);
                    *start = self.pos;
                }
                let from = (self.pos - *start) as usize;
                let n = buf.len().min(bytes.len() - from);
                buf[..n].copy_from_slice(&bytes[from..from + n]);
                n
            }
            Image::Bytes(data) => {
                let start = usize::try_from(self.pos)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                let n = buf.len().min(data.len() - start);
                buf[..n].copy_from_slice(&data[start..start + n]);
                n
            }
        };
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for At {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => {
                let len = match &self.image {
                    Image::File(file) => file.metadata()?.len(),
                    Image::Bytes(data) => data.len() as u64,
                };
                len.checked_add_signed(d)
            }
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| std::io::Error::other("seek out of range"))?;
        Ok(self.pos)
    }
}

/// An ELF file as read from disk.
#[derive(Debug)]
pub struct Binary {
    pub path: PathBuf,
    image: Image,
    /// The whole file, kept only when it has no call frame information at all: unwinding
    /// then derives rules from its instructions (see [`crate::unwind`]).
    pub code_without_cfi: Option<Arc<[u8]>>,
    pub build_id: Option<Vec<u8>>,
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
    /// [`crate::unwind::entry_stub_returns`]).
    pub entry_returns: Vec<u64>,
    /// The entry stub's code up to its last call (and the instruction after it), in the
    /// file's addresses: the program's `_start`, which a stripped file does not name.
    pub entry_stub: Option<std::ops::Range<u64>>,
}

impl Binary {
    /// Opens and parses `path`, reading only its headers and the sections unwinding
    /// needs. `None` when the file cannot be read or is not ELF.
    pub fn open(path: &Path) -> Option<Binary> {
        let file = Arc::new(std::fs::File::open(path).ok()?);
        if !file.metadata().ok()?.is_file() {
            return None;
        }
        let image = Image::File(file);
        let cache = object::ReadCache::new(At::new(image.clone()));
        Binary::parse(path.to_path_buf(), &cache, image)
    }

    /// Parses an ELF image held in `data`, which the binary keeps and shares: DWARF
    /// readers borrow its uncompressed sections rather than copying them.
    pub fn from_bytes(path: PathBuf, data: Arc<[u8]>) -> Option<Binary> {
        let bytes = data.clone();
        Binary::parse(path, &*bytes, Image::Bytes(data))
    }

    fn parse<'d, R: object::ReadRef<'d>>(path: PathBuf, data: R, image: Image) -> Option<Binary> {
        let elf = Elf::parse(data)?;
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
                        crate::lazycfi::LazyCfi::new(
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
            debuglink: elf
                .gnu_debuglink()
                .map(|(name, crc)| (String::from_utf8_lossy(name).into_owned(), crc)),
            has_dwarf: elf.section(".debug_info").is_some(),
            has_symtab: elf.has_symtab(),
            segments: elf.segments(),
            unwind,
            entry_returns: Vec::new(),
            entry_stub: None,
        };
        if !binary.unwind.has_cfi() {
            binary.code_without_cfi = binary.bytes().ok();
        }
        let entry = elf.entry();
        if let Some(code) = binary.entry_code(entry) {
            binary.entry_returns = crate::unwind::entry_stub_returns(&code, entry);
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

    #[test]
    fn reads_through_the_open_file_are_the_files_bytes() {
        let exe = std::env::current_exe().unwrap();
        let whole = std::fs::read(&exe).unwrap();
        let image = Image::File(Arc::new(std::fs::File::open(&exe).unwrap()));
        let mut at = At::new(image);
        // Small reads in and out of the read-ahead window, a large one, the end.
        let len = whole.len() as u64;
        let reads = [
            (0, 16),
            (8, 300),
            (70_000, 5),
            (10, 4),
            (len - 3, 10),
            (100, 200_000),
        ];
        for (offset, size) in reads {
            at.seek(SeekFrom::Start(offset)).unwrap();
            let mut buf = vec![0; size];
            let mut got = 0;
            while got < size {
                match at.read(&mut buf[got..]).unwrap() {
                    0 => break,
                    n => got += n,
                }
            }
            let end = (offset as usize + size).min(whole.len());
            assert_eq!(&buf[..got], &whole[offset as usize..end], "{offset}+{size}");
        }
        assert_eq!(at.seek(SeekFrom::End(0)).unwrap(), len);
    }

    fn binary(segments: Vec<LoadSegment>) -> Binary {
        Binary {
            path: PathBuf::from("test"),
            image: Image::Bytes(Arc::from(Vec::new())),
            code_without_cfi: None,
            build_id: None,
            debuglink: None,
            has_dwarf: false,
            has_symtab: false,
            segments,
            unwind: UnwindSections::default(),
            entry_returns: Vec::new(),
            entry_stub: None,
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
