//! An ELF file's headers and section table, parsed without touching its symbol tables or
//! relocations. `object::File::parse` reads `.symtab`, `.dynsym` and their relocation
//! sections whole as it opens a file: through `object`'s read cache that is a copy kept
//! for as long as the file is open (rustc's driver library: 7 MB of symbols and 3 MB of
//! dynamic relocations), though sampler reads symbols for a few addresses
//! (`symbolicate::symtab`) and relocations for a few PLT slots. Every reader of
//! a binary's parts — unwinding's sections, DWARF, symbol tables, PLT stubs — goes
//! through [`Elf`], which reads a section's bytes only when asked.
//!
//! 64-bit ELF only, of either byte order: the files sampler unwinds and names.

use crate::files::image::{shared_filled, At, Held, SectionBytes, MAX_SECTION_BYTES};
use object::elf::{FileHeader64, SectionHeader64};
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _, SectionTable};
use object::{CompressedFileRange, CompressionFormat, Endian as _, Endianness, ReadRef};

mod units;
pub use units::{section_size, section_stream, section_units, MAX_UNITS};

/// The prefix of a section compressed the older GNU way (`.zdebug_info`): the section's
/// bytes start with `ZLIB` and the inflated size as 8 big-endian bytes.
const GNU_ZLIB_MAGIC: &[u8; 4] = b"ZLIB";
const GNU_ZLIB_HEADER_BYTES: u64 = 12;

/// The size of an `Elf64_Phdr`, the program header table's entries.
const PROGRAM_HEADER_BYTES: u64 = 56;

/// A parsed 64-bit ELF file: its header and section table, over the reader of its bytes.
pub struct Elf<'d, R: ReadRef<'d>> {
    data: R,
    endian: Endianness,
    header: &'d FileHeader64<Endianness>,
    table: SectionTable<'d, FileHeader64<Endianness>, R>,
}

/// One section: its name and header.
#[derive(Clone, Copy)]
pub struct Section<'d> {
    pub name: &'d str,
    pub index: usize,
    header: &'d SectionHeader64<Endianness>,
    endian: Endianness,
}

impl Section<'_> {
    /// Its address in the file's address space (SVMA).
    pub fn address(&self) -> u64 {
        self.header.sh_addr(self.endian)
    }

    /// Its `sh_size`: for a compressed section, the size of what the file stores.
    pub fn size(&self) -> u64 {
        self.header.sh_size(self.endian)
    }

    /// Where its bytes lie in the file, `None` when it has none there (`SHT_NOBITS`).
    pub fn file_range(&self) -> Option<(u64, u64)> {
        self.header.file_range(self.endian)
    }

    pub fn kind(&self) -> object::elf::SectionType {
        self.header.sh_type(self.endian)
    }

    /// The section its `sh_link` names (a symbol table's strings, a relocation
    /// section's symbols).
    pub fn link(&self) -> usize {
        self.header.sh_link(self.endian) as usize
    }

    pub fn entry_size(&self) -> u64 {
        self.header.sh_entsize(self.endian)
    }

    /// Whether its bytes are compressed (`SHF_COMPRESSED`, or a `.zdebug_` name).
    pub fn compressed(&self) -> bool {
        self.name.starts_with(".zdebug_")
            || self.header.sh_flags(self.endian).0 & object::elf::SHF_COMPRESSED.0 != 0
    }

    /// Whether it holds code (`SHF_EXECINSTR`).
    pub fn executable(&self) -> bool {
        self.header.sh_flags(self.endian).0 & object::elf::SHF_EXECINSTR.0 != 0
    }
}

impl<'d, R: ReadRef<'d>> Elf<'d, R> {
    /// `None` when `data` is not a 64-bit ELF file or its section table cannot be read.
    /// For bytes in memory, whose every read is bounded by their length; a file read
    /// through its reader is parsed with [`Elf::parse_held`].
    pub fn parse(data: R) -> Option<Elf<'d, R>> {
        Elf::parse_held(data, None).ok()
    }

    /// Parses the ELF file whose bytes `data` reads and which really holds `held`: its
    /// section table, program headers and every section's bytes must lie in what it
    /// holds (see [`Held::check`]), checked before any of them is read, so that no size
    /// a header gives is allocated unless the file has the bytes. `Err(None)` when it is
    /// not a 64-bit ELF file; `Err(Some(why))` when its headers claim what it does not
    /// hold (a damaged or hostile file).
    pub fn parse_held(data: R, held: Option<&Held>) -> Result<Elf<'d, R>, Option<String>> {
        let header = FileHeader64::<Endianness>::parse(data).map_err(|_| None)?;
        let endian = header.endian().map_err(|_| None)?;
        if let Some(held) = held {
            let count = u64::from(header.shnum(endian, data).map_err(|_| None)?);
            let entry = u64::from(header.e_shentsize(endian));
            let bytes = count.checked_mul(entry).ok_or(None)?;
            held.check(&"its section table", header.e_shoff(endian), bytes)
                .map_err(Some)?;
            let count = u64::from(header.phnum(endian, data).map_err(|_| None)?);
            held.check(
                &"its program headers",
                header.e_phoff(endian),
                count * PROGRAM_HEADER_BYTES,
            )
            .map_err(Some)?;
        }
        let table = header.sections(endian, data).map_err(|_| None)?;
        let elf = Elf {
            data,
            endian,
            header,
            table,
        };
        if let Some(held) = held {
            for section in elf.sections() {
                if let Some((offset, size)) = section.file_range() {
                    held.check(&format_args!("its section {}", section.name), offset, size)
                        .map_err(Some)?;
                }
            }
        }
        Ok(elf)
    }

    /// The file's byte order, which reads its fields (`object::Endian`).
    pub fn endian(&self) -> Endianness {
        self.endian
    }

    pub fn is_little_endian(&self) -> bool {
        self.endian == Endianness::Little
    }

    /// The byte order as gimli takes it, for the file's DWARF and CFI.
    pub fn gimli_endian(&self) -> gimli::RunTimeEndian {
        match self.endian {
            Endianness::Little => gimli::RunTimeEndian::Little,
            Endianness::Big => gimli::RunTimeEndian::Big,
        }
    }

    /// Its `e_machine`: the architecture it is for.
    pub fn machine(&self) -> u16 {
        self.header.e_machine(self.endian).0
    }

    pub fn is_x86_64(&self) -> bool {
        self.header.e_machine(self.endian) == object::elf::EM_X86_64
    }

    /// The entry point's address.
    pub fn entry(&self) -> u64 {
        self.header.e_entry(self.endian)
    }

    /// Every section, in the table's order (the null section at index 0 included): the
    /// `n`th is the one at index `n`.
    pub fn sections(&self) -> impl Iterator<Item = Section<'d>> + '_ {
        (0..self.table.len()).filter_map(|index| self.section_at(index))
    }

    /// The section at `index` of the table (named `""` when its name cannot be read).
    pub fn section_at(&self, index: usize) -> Option<Section<'d>> {
        let header = self.table.section(object::SectionIndex(index)).ok()?;
        let name = self.table.section_name(self.endian, header).unwrap_or(&[]);
        Some(Section {
            name: std::str::from_utf8(name).unwrap_or(""),
            index,
            header,
            endian: self.endian,
        })
    }

    /// The first section named `name`; for a DWARF section (`.debug_*`), its older
    /// compressed form (`.zdebug_*`) when the file has only that.
    pub fn section(&self, name: &str) -> Option<Section<'d>> {
        let by_name = |name: &str| self.sections().find(|s| s.name == name);
        by_name(name).or_else(|| {
            let rest = name.strip_prefix(".debug_")?;
            by_name(&format!(".zdebug_{rest}"))
        })
    }

    /// The first section of type `kind` (`SHT_SYMTAB`, `SHT_DYNSYM`).
    pub fn section_of_kind(&self, kind: object::elf::SectionType) -> Option<Section<'d>> {
        self.sections().find(|s| s.kind() == kind)
    }

    /// A section's bytes as stored (compressed ones not inflated), read through the
    /// file's reader; empty for a section without bytes in the file.
    pub fn data(&self, section: &Section<'d>) -> Option<&'d [u8]> {
        section.header.data(self.endian, self.data).ok()
    }

    /// Where a section's bytes lie and how they are compressed.
    pub fn compressed_range(&self, section: &Section<'d>) -> Result<CompressedFileRange, String> {
        let endian = self.endian;
        if let Some((header, offset, compressed_size)) = section
            .header
            .compression(endian, self.data)
            .map_err(|e| e.to_string())?
        {
            let format = match header.ch_type.get(endian) {
                object::elf::ELFCOMPRESS_ZLIB => CompressionFormat::Zlib,
                object::elf::ELFCOMPRESS_ZSTD => CompressionFormat::Zstandard,
                other => return Err(format!("compression type {other} is not supported")),
            };
            return Ok(CompressedFileRange {
                format,
                offset,
                compressed_size,
                uncompressed_size: header.ch_size.get(endian),
            });
        }
        let range = section.file_range();
        if let (true, Some((offset, size))) = (section.name.starts_with(".zdebug_"), range) {
            let head = self
                .data
                .read_bytes_at(offset, GNU_ZLIB_HEADER_BYTES)
                .ok()
                .filter(|h| h.starts_with(GNU_ZLIB_MAGIC))
                .ok_or("it has no ZLIB header")?;
            let mut inflated = [0u8; 8];
            inflated.copy_from_slice(&head[4..]);
            return Ok(CompressedFileRange {
                format: CompressionFormat::Zlib,
                offset: offset + GNU_ZLIB_HEADER_BYTES,
                compressed_size: size.saturating_sub(GNU_ZLIB_HEADER_BYTES),
                uncompressed_size: u64::from_be_bytes(inflated),
            });
        }
        Ok(CompressedFileRange::none(range))
    }

    /// The bytes a compressed range covers, still compressed.
    pub fn compressed_data(
        &self,
        section: &Section<'d>,
    ) -> Result<object::CompressedData<'d>, String> {
        self.compressed_range(section)?
            .data(self.data)
            .map_err(|e| e.to_string())
    }

    /// Whether the file has a (non-empty) full symbol table.
    pub fn has_symtab(&self) -> bool {
        self.section_of_kind(object::elf::SHT_SYMTAB)
            .is_some_and(|s| s.file_range().is_some_and(|(_, size)| size > 0))
    }

    /// The GNU build ID, from the first `NT_GNU_BUILD_ID` note of a note section.
    pub fn build_id(&self) -> Option<&'d [u8]> {
        self.table.iter().find_map(|header| {
            let mut notes = header.notes(self.endian, self.data).ok()??;
            while let Ok(Some(note)) = notes.next() {
                if note.name() == object::elf::ELF_NOTE_GNU
                    && note.n_type(self.endian) == object::elf::NT_GNU_BUILD_ID
                {
                    return Some(note.desc());
                }
            }
            None
        })
    }

    /// `.gnu_debuglink`: the debug file's name and the CRC-32 of its bytes.
    pub fn gnu_debuglink(&self) -> Option<(&'d [u8], u32)> {
        let data = self.data(&self.section(".gnu_debuglink")?)?;
        let end = data.iter().position(|&b| b == 0)?;
        // The CRC follows the name's terminating zero, aligned to 4 bytes.
        let crc_at = (end + 1).next_multiple_of(4);
        let crc = data.get(crc_at..crc_at + 4)?.try_into().ok()?;
        Some((&data[..end], self.endian.read_u32(crc)))
    }

    /// The loadable segments.
    pub fn segments(&self) -> Vec<LoadSegment> {
        let Ok(headers) = self.header.program_headers(self.endian, self.data) else {
            return Vec::new();
        };
        headers
            .iter()
            .filter(|h| h.p_type(self.endian) == object::elf::PT_LOAD)
            .map(|h| LoadSegment {
                file_offset: h.p_offset(self.endian),
                file_size: h.p_filesz(self.endian),
                vaddr: h.p_vaddr(self.endian),
                executable: h.p_flags(self.endian).0 & object::elf::PF_X.0 != 0,
            })
            .collect()
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

/// Where a section's bytes lie, how they are compressed, and the size they inflate to,
/// checked (see `check_compressed`).
fn stored_range<'d, R: object::ReadRef<'d>>(
    elf: &Elf<'d, R>,
    section: &Section<'d>,
) -> Result<(CompressedFileRange, usize), String> {
    let name = section.name;
    let unreadable = |why: String| format!("its section {name} cannot be read: {why}");
    let range = elf.compressed_range(section).map_err(unreadable)?;
    check_compressed(
        name,
        range.format,
        range.compressed_size,
        range.uncompressed_size,
    )?;
    let len = usize::try_from(range.uncompressed_size).map_err(|e| unreadable(e.to_string()))?;
    Ok((range, len))
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
    // The inflated size is known before reading: the buffer is made at its size.
    let (range, len) = stored_range(elf, section)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object, ObjectSection, ObjectSegment};

    /// Each header fact, as [`Elf`] and as `object::File` read it, for real files: this
    /// test program (Rust, with `.symtab`), libc (stripped, a build ID) and `ls` (a
    /// `.gnu_debuglink` on Debian).
    #[test]
    fn headers_read_as_object_reads_them() {
        let mut files = vec![std::env::current_exe().unwrap()];
        for path in ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/ls"] {
            if std::path::Path::new(path).exists() {
                files.push(path.into());
            }
        }
        for path in files {
            let data = std::fs::read(&path).unwrap();
            let elf = Elf::parse(&*data).unwrap();
            let file = object::File::parse(&*data).unwrap();
            let at = path.display();
            assert_eq!(elf.build_id(), file.build_id().unwrap(), "{at}");
            assert_eq!(elf.gnu_debuglink(), file.gnu_debuglink().unwrap(), "{at}");
            assert_eq!(elf.entry(), file.entry(), "{at}");
            assert_eq!(elf.has_symtab(), file.symbol_table().is_some(), "{at}");
            assert!(elf.is_x86_64() && elf.is_little_endian(), "{at}");
            let segments: Vec<(u64, u64, u64)> = file
                .segments()
                .map(|s| (s.file_range().0, s.file_range().1, s.address()))
                .collect();
            let ours: Vec<(u64, u64, u64)> = elf
                .segments()
                .iter()
                .map(|s| (s.file_offset, s.file_size, s.vaddr))
                .collect();
            assert_eq!(ours, segments, "{at}");
            for section in file.sections() {
                let name = section.name().unwrap();
                let mine = elf.section_at(section.index().0).unwrap();
                assert_eq!(mine.name, name, "{at}");
                assert_eq!(
                    (mine.address(), mine.size(), mine.file_range()),
                    (section.address(), section.size(), section.file_range()),
                    "{at} {name}"
                );
                assert_eq!(
                    elf.compressed_range(&mine).unwrap(),
                    section.compressed_file_range().unwrap(),
                    "{at} {name}"
                );
                if !name.is_empty() {
                    assert_eq!(elf.section(name).unwrap().index, mine.index, "{at} {name}");
                }
            }
        }
    }

    #[test]
    fn what_is_not_a_64_bit_elf_file_is_refused() {
        assert!(Elf::parse(&b"not an ELF file at all, not even close"[..]).is_none());
        let mut data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // EI_CLASS: ELFCLASS32.
        data[4] = 1;
        assert!(Elf::parse(&*data).is_none());
        assert!(Elf::parse(&data[..40]).is_none());
    }

    /// [`section_units`] on real sections, stored (this test program's `.debug_info` and
    /// `.debug_line`) and zlib-compressed (libc's debug file, when libc6-dbg is there):
    /// keeping every unit gives the section as [`section_shared`] reads it, and where
    /// each unit starts; keeping every third, those units as they are, each run of the
    /// others handed to the stand-in once and otherwise zeros; a stand-in that cannot be
    /// made, or a unit too short for a header, is refused; a file cut short is refused,
    /// not read past.
    #[test]
    fn sections_of_units_keep_what_is_asked_and_zeros() {
        let exe = std::env::current_exe().unwrap();
        let mut files = vec![(exe, CompressionFormat::None)];
        let libc = std::fs::read("/usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let id = Elf::parse(&*libc).unwrap().build_id().unwrap().to_vec();
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let debug = std::path::PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        ));
        if debug.exists() {
            files.push((debug, CompressionFormat::Zlib));
        }
        let zeroed = |len| Ok(vec![0; len].into());
        let nothing = |_: &mut [u8]| true;
        for (path, format) in files {
            let data: std::sync::Arc<[u8]> = std::fs::read(&path).unwrap().into();
            let elf = Elf::parse(&*data).unwrap();
            let at = At::of_bytes(data.clone());
            for name in [".debug_info", ".debug_line"] {
                let what = format!("{} {name}", path.display());
                let section = elf.section(name).unwrap();
                assert_eq!(elf.compressed_range(&section).unwrap().format, format);
                let whole = section_shared(&elf, &section, &at).unwrap();
                let (all, starts) =
                    section_units(&elf, &section, &at, &|_| true, &nothing, &zeroed)
                        .unwrap()
                        .unwrap();
                assert!(*all == *whole, "{what}");
                // Each unit's start, from the lengths in the section.
                let (mut start, mut expected) = (0, Vec::new());
                while start + 4 <= whole.len() {
                    expected.push(start);
                    let length = u32::from_le_bytes(whole[start..start + 4].try_into().unwrap());
                    start += 4 + length as usize;
                }
                assert_eq!(starts, expected, "{what}");
                assert!(starts.len() > 10, "{what}: {} units", starts.len());

                let kept = |unit: usize| starts.binary_search(&unit).is_ok_and(|i| i % 3 == 0);
                let runs = std::cell::RefCell::new(Vec::new());
                let mark = |run: &mut [u8]| {
                    assert!(
                        run.iter().all(|&b| b == 0),
                        "{what}: a run is handed over zeroed"
                    );
                    runs.borrow_mut().push(run.len());
                    run[0] = 0xa5;
                    true
                };
                let (some, again) = section_units(&elf, &section, &at, &kept, &mark, &zeroed)
                    .unwrap()
                    .unwrap();
                assert_eq!(again, starts, "{what}");
                let mut expected_runs = Vec::new();
                for (i, &unit) in starts.iter().enumerate() {
                    let end = starts.get(i + 1).copied().unwrap_or(whole.len());
                    match kept(unit) {
                        true => assert!(some[unit..end] == whole[unit..end], "{what} at {unit}"),
                        false => {
                            let first = i == 0 || kept(starts[i - 1]);
                            if first {
                                expected_runs.push(0);
                            }
                            *expected_runs.last_mut().unwrap() += end - unit;
                            let zeros = &some[unit + usize::from(first)..end];
                            assert!(zeros.iter().all(|&b| b == 0), "{what} at {unit}");
                            assert_eq!(some[unit] == 0xa5, first, "{what} at {unit}");
                        }
                    }
                }
                assert_eq!(*runs.borrow(), expected_runs, "{what}");
                let refused = section_units(&elf, &section, &at, &kept, &|_| false, &zeroed);
                assert!(refused.unwrap().is_none(), "{what}");

                // A unit too short for a header (a damaged section): read whole instead.
                if format == CompressionFormat::None {
                    let first = section.file_range().unwrap().0 as usize;
                    for length in [0u32, 3] {
                        let mut damaged = data.to_vec();
                        damaged[first..first + 4].copy_from_slice(&length.to_le_bytes());
                        let at = At::of_bytes(damaged.into());
                        let read = section_units(&elf, &section, &at, &|_| true, &nothing, &zeroed);
                        assert!(read.unwrap().is_none(), "{what}: a unit of length {length}");
                    }
                }

                let cut = match format {
                    CompressionFormat::None => section.file_range().unwrap().0 as usize + 1000,
                    _ => elf.compressed_range(&section).unwrap().offset as usize + 1000,
                };
                let short = At::of_bytes(data[..cut].into());
                let refused = section_units(&elf, &section, &short, &|_| true, &nothing, &zeroed)
                    .unwrap_err();
                assert!(refused.contains(name), "{what}: {refused}");
            }
        }
    }
}
