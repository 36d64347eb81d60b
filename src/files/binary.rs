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

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::events::FileId;
use crate::files::elf::{Elf, Section};

/// The file behind a library of a profile, verified to be the one that was mapped, or
/// why there is none: what replay hands the symbolicator for each library.
pub type LibFile = Result<std::sync::Arc<Binary>, String>;

/// The most of a program's entry code read to find its entry stub's calls: `_start` is a
/// few dozen bytes, a static program's some hundred.
const ENTRY_CODE_BYTES: usize = 4096;

/// A shared buffer of `len` bytes that `fill` writes: made once at its final size and
/// filled in place, never a copy of another buffer. A size the system cannot give is
/// refused, not a reason to abort the run: `Arc<[u8]>` has no fallible constructor, so
/// the same size is first reserved (and given back) as a `Vec`, which has one.
fn shared_filled(
    len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), String>,
) -> Result<Arc<[u8]>, String> {
    Vec::<u8>::new()
        .try_reserve_exact(len)
        .map_err(|_| format!("{len} bytes cannot be allocated"))?;
    let mut data: Arc<[u8]> = std::iter::repeat_n(0u8, len).collect();
    fill(Arc::get_mut(&mut data).expect("a new buffer has one owner"))?;
    Ok(data)
}

/// Reads an open file whole into one shared buffer, when it holds all of its length
/// (see [`Held::check`]).
fn read_whole(file: &Arc<std::fs::File>) -> std::io::Result<Arc<[u8]>> {
    let held = Held::of(file)?;
    held.check(&"the file", 0, held.len)
        .map_err(std::io::Error::other)?;
    let len = usize::try_from(held.len).map_err(std::io::Error::other)?;
    shared_filled(len, |buffer| {
        file.read_exact_at(buffer, 0).map_err(|e| e.to_string())
    })
    .map_err(std::io::Error::other)
}

/// A region that a file's headers give may be this much larger than all the bytes the
/// file stores on disk before its holes are looked for: a tiny file's data may live in
/// its inode (no blocks at all), and a block holds up to 64 KiB on some filesystems.
const UNSTORED_SLACK: u64 = 1 << 20;

/// What an open file really holds: its length, and the bytes its blocks store (fewer
/// than its length when it has holes: a sparse file, which reads as zeros there and
/// costs whoever made it nothing). Every size that the file's headers give is checked
/// against both, and against `MAX_SECTION_BYTES`, before it is read or allocated.
#[derive(Clone, Debug)]
pub struct Held {
    file: Arc<std::fs::File>,
    len: u64,
    stored: u64,
}

impl Held {
    /// What `file` holds now.
    pub fn of(file: &Arc<std::fs::File>) -> std::io::Result<Held> {
        use std::os::unix::fs::MetadataExt;
        let meta = file.metadata()?;
        Ok(Held {
            file: file.clone(),
            len: meta.len(),
            // st_blocks counts 512-byte units whatever the filesystem's block size.
            stored: meta.blocks().saturating_mul(512),
        })
    }

    /// Whether the `size` bytes from `offset` that a header calls `what` are bytes the
    /// file holds: inside its length, at most `MAX_SECTION_BYTES`, and, when more than
    /// the file stores on disk, without a hole among them (a filesystem that compresses
    /// stores fewer bytes than it holds, but has no holes there). The error says which
    /// and is one line, for the message that names the file.
    pub fn check(
        &self,
        what: &dyn std::fmt::Display,
        offset: u64,
        size: u64,
    ) -> Result<(), String> {
        // Nothing is read of an empty part, wherever it says it is.
        if size == 0 {
            return Ok(());
        }
        let end = offset
            .checked_add(size)
            .filter(|&end| end <= self.len)
            .ok_or_else(|| {
                format!(
                    "{what} says it has {size} bytes from offset {offset}, past the file's end at {} (a damaged file)",
                    self.len
                )
            })?;
        if size > MAX_SECTION_BYTES {
            return Err(format!(
                "{what} says it has {size} bytes, more than the {MAX_SECTION_BYTES} that sampler reads of any part of a file (a damaged file)"
            ));
        }
        if size > self.stored.saturating_add(UNSTORED_SLACK) && self.has_hole(offset, end) {
            return Err(format!(
                "{what} says it has {size} bytes, but the file stores only {} on disk and the rest are holes (a sparse file)",
                self.stored
            ));
        }
        Ok(())
    }

    /// Whether `start..end` of the file has a hole (`SEEK_HOLE`, which finds the
    /// file's end when there is none before it).
    fn has_hole(&self, start: u64, end: u64) -> bool {
        let Ok(from) = i64::try_from(start) else {
            return true;
        };
        match nix::unistd::lseek(&*self.file, from, nix::unistd::Whence::SeekHole) {
            Ok(hole) => u64::try_from(hole).map_or(true, |hole| hole < end),
            // A filesystem that cannot say: its files are taken as having no holes.
            Err(_) => false,
        }
    }
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
    /// not read): see [`crate::files::lazycfi`].
    pub lazy: Option<Arc<crate::files::lazycfi::LazyCfi>>,
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
        let mut buf = Vec::new();
        buf.try_reserve_exact(len).ok()?;
        buf.resize(len, 0);
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
                        crate::files::lazycfi::LazyCfi::new(
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

    #[test]
    fn real_files_hold_what_their_headers_say_and_a_sparse_one_does_not() {
        let mut files = vec![std::env::current_exe().unwrap()];
        for path in ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/ls"] {
            if Path::new(path).exists() {
                files.push(path.into());
            }
        }
        for path in files {
            let b = Binary::open(&path).unwrap();
            assert_eq!(b.damaged, None, "{}", path.display());
            assert!(b.unwind.has_cfi(), "{}", path.display());
        }
        let path = std::env::temp_dir().join(format!("sampler-held-{}", std::process::id()));
        let file = Arc::new(std::fs::File::create(&path).unwrap());
        file.write_all_at(b"a few real bytes", 0).unwrap();
        file.set_len(5 << 30).unwrap();
        let held = Held::of(&file).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(held.check(&"a", 0, 16), Ok(()));
        assert_eq!(held.check(&"nothing", u64::MAX, 0), Ok(()));
        let holes = held.check(&"its section .x", 0, 64 << 20).unwrap_err();
        assert!(
            holes.starts_with("its section .x says it has 67108864 bytes"),
            "{holes}"
        );
        assert!(holes.ends_with("(a sparse file)"), "{holes}");
        let past = held.check(&"b", 1 << 20, 5 << 30).unwrap_err();
        assert!(past.contains("past the file's end"), "{past}");
        let huge = held.check(&"c", 0, MAX_SECTION_BYTES + 1).unwrap_err();
        assert!(huge.contains("more than the 4294967296"), "{huge}");
    }

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
