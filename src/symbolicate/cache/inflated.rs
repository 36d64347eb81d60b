//! Inflated copies of debug files whose DWARF is compressed (`SHF_COMPRESSED`, as
//! Debian's libc6-dbg ships libc's): a small ELF file of the file's debug sections,
//! inflated, that a later run reads instead.
//!
//! A zlib stream is read from its start: to name one function of libc, a run inflated
//! all 2.3 MB of its compressed `.debug_info` (5.8 MB inflated) and more, some 20 ms,
//! each time an address outside the symbol cache's entry came up (most warm runs, as a
//! run samples a few of some hundred startup functions, other ones each time). From an
//! inflated copy, only the compilation units the addresses lie in are read.
//!
//! - Name: `inflated-` and the debug file's build ID (files without one get no copy).
//! - Use: only for the very file it was made from: its section [`SOURCE_SECTION`]
//!   holds that file's identity (device, inode, size, change time; [`At::identity`]),
//!   compared with the file found now. Otherwise it is an ELF file like any other, read
//!   through the same checks (every section inside what the file holds).
//! - Made: the first time a run needs the DWARF of a compressed debug file, before it
//!   reads it: each section is inflated once, as a stream, into a new file beside the
//!   entries, which the run then reads as a copy (from the page cache) and renames into
//!   the cache as it saves (a run that does not save removes it). Location lists
//!   (`.debug_loc`, `.debug_loclists`), which naming never reads, are left out: libc's
//!   copy is 8.6 MB. Reading the compressed file, a run inflated most of it anyway,
//!   so the first run pays nothing more (`kprelude /bin/true`, 6 cold runs each: 114
//!   ms of CPU before, 104 after). When the copy was made in the second run instead,
//!   after the profile, that run took 53–74 ms from the command's exit to its end; it
//!   now takes 12–13 ms (3 runs each).
//! - Bounds: [`super::MAX_ENTRY_BYTES`] per copy; copies count with the entries
//!   towards [`super::MAX_TOTAL_BYTES`] and are evicted with them.

use std::io::{Read, Write};

use object::ReadRef;

use crate::files::elf::{section_size, section_stream, Elf};
use crate::files::image::At;

/// The prefix of a copy's name among the entries.
const PREFIX: &str = "inflated-";

/// The section that names the file a copy was made from: its [`At::identity`], five
/// little-endian u64s.
pub const SOURCE_SECTION: &str = ".sampler.source";

/// Bytes of an ELF64 file header and of a section header.
const HEADER_BYTES: usize = 64;
const SECTION_HEADER_BYTES: usize = 64;

/// The copy's name for the debug file of build ID `build_id`.
pub fn file_name(build_id: &[u8]) -> String {
    format!("{PREFIX}{}", crate::symbolicate::debuginfod::hex(build_id))
}

/// Whether `elf`'s DWARF is compressed (its `.debug_info`), which a copy is made for.
pub fn is_compressed<'d, R: ReadRef<'d>>(elf: &Elf<'d, R>) -> bool {
    elf.section(".debug_info").is_some_and(|s| s.compressed())
}

/// The name a section keeps in the copy, for the sections copied: every DWARF section
/// (`.zdebug_` ones renamed) but the location lists.
fn copied_name(name: &str) -> Option<String> {
    let rest = name
        .strip_prefix(".debug_")
        .or_else(|| name.strip_prefix(".zdebug_"))?;
    (!matches!(rest, "loc" | "loclists")).then(|| format!(".debug_{rest}"))
}

/// The sections of `elf` a copy holds, with the names they keep there: the DWARF
/// sections [`copied_name`] names, with bytes in the file.
fn copied_sections<'e, 'd, R: ReadRef<'d>>(
    elf: &'e Elf<'d, R>,
) -> impl Iterator<Item = (crate::files::elf::Section<'d>, String)> + 'e {
    elf.sections()
        .filter(|section| section.kind() != object::elf::SHT_NOBITS)
        .filter_map(|section| Some((section, copied_name(section.name)?)))
}

/// Whether the copy `elf` was made from the file whose identity is `identity`.
pub fn made_from<'d, R: ReadRef<'d>>(elf: &Elf<'d, R>, at: &At, identity: &[u64; 5]) -> bool {
    let Some((offset, size)) = elf
        .section(SOURCE_SECTION)
        .and_then(|s| s.file_range())
        .filter(|&(_, size)| size == 40)
    else {
        return false;
    };
    let Some(bytes) = at.read_exact_at(offset, size as usize) else {
        return false;
    };
    bytes.len() == 40
        && bytes
            .chunks_exact(8)
            .zip(identity)
            .all(|(word, &want)| u64::from_le_bytes(word.try_into().unwrap_or_default()) == want)
}

/// Why a copy was not written.
#[derive(Debug)]
pub enum NotWritten {
    /// The file cannot be made a copy of (its sections, its size).
    Unfit(String),
    /// Writing failed.
    Io(std::io::Error),
}

/// Bytes in memory at once while a section is copied: libc's `.debug_info` is 5.8 MB
/// inflated, which is not to be held whole.
const COPY_BUFFER_BYTES: usize = 64 << 10;

/// Copies the `len` bytes `from` gives into `out`: `Unfit` when it gives fewer or fails
/// (a damaged section), `Io` when `out` fails.
fn copy_section(
    from: &mut dyn Read,
    len: u64,
    out: &mut std::fs::File,
    name: &str,
) -> Result<(), NotWritten> {
    let mut buffer = vec![0u8; COPY_BUFFER_BYTES];
    let mut left = len;
    while left > 0 {
        let want = buffer
            .len()
            .min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = match from.read(&mut buffer[..want]) {
            Ok(0) => {
                return Err(NotWritten::Unfit(format!(
                    "its section {name} is shorter than it says"
                )))
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(NotWritten::Unfit(format!(
                    "its section {name} cannot be inflated: {e}"
                )))
            }
        };
        out.write_all(&buffer[..n]).map_err(NotWritten::Io)?;
        left -= n as u64;
    }
    Ok(())
}

/// Writes into `out` the copy of the 64-bit little-endian ELF file `elf` (read through
/// `at`), whose identity is `identity`: the file header, each DWARF section inflated as
/// it comes (at most `max_bytes` in all, as the section headers say, before any is
/// inflated), the source section, the section names and the section table. `Err` says
/// why not: the file cannot be made a copy of, or `out` could not take it (a full disk).
pub fn write<'d, R: ReadRef<'d>>(
    elf: &Elf<'d, R>,
    at: &At,
    identity: &[u64; 5],
    out: &mut std::fs::File,
    max_bytes: u64,
) -> Result<(), NotWritten> {
    if !elf.is_little_endian() {
        return Err(NotWritten::Unfit("not a little-endian file".into()));
    }
    let io = NotWritten::Io;
    // Nothing is inflated for a copy that would not fit.
    let mut size = HEADER_BYTES as u64;
    for (section, _) in copied_sections(elf) {
        size += section_size(elf, &section).map_err(NotWritten::Unfit)? as u64;
    }
    if size > max_bytes {
        return Err(NotWritten::Unfit(format!(
            "more than {max_bytes} bytes inflated"
        )));
    }
    // (name offset in the names, type, offset, size) of each section after the null one.
    let mut table: Vec<(u32, u32, u64, u64)> = Vec::new();
    let mut names = vec![0u8];
    let name = |names: &mut Vec<u8>, n: &str| {
        let at = names.len() as u32;
        names.extend_from_slice(n.as_bytes());
        names.push(0);
        at
    };
    out.write_all(&[0u8; HEADER_BYTES]).map_err(io)?;
    let mut offset = HEADER_BYTES as u64;
    for (section, copied) in copied_sections(elf) {
        let (mut bytes, len) = section_stream(elf, &section, at).map_err(NotWritten::Unfit)?;
        let len = len as u64;
        copy_section(&mut bytes, len, out, section.name)?;
        let at = name(&mut names, &copied);
        table.push((at, object::elf::SHT_PROGBITS.0, offset, len));
        offset += len;
    }
    let source: Vec<u8> = identity.iter().flat_map(|w| w.to_le_bytes()).collect();
    out.write_all(&source).map_err(io)?;
    let at = name(&mut names, SOURCE_SECTION);
    table.push((at, object::elf::SHT_PROGBITS.0, offset, source.len() as u64));
    offset += source.len() as u64;
    let at = name(&mut names, ".shstrtab");
    table.push((at, object::elf::SHT_STRTAB.0, offset, names.len() as u64));
    out.write_all(&names).map_err(io)?;
    offset += names.len() as u64;
    // The section table, 8-byte aligned.
    let pad = offset.next_multiple_of(8) - offset;
    out.write_all(&vec![0u8; pad as usize]).map_err(io)?;
    let table_at = offset + pad;
    let mut headers = vec![0u8; SECTION_HEADER_BYTES];
    for &(name, kind, offset, size) in &table {
        let mut h = [0u8; SECTION_HEADER_BYTES];
        h[0..4].copy_from_slice(&name.to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&offset.to_le_bytes());
        h[32..40].copy_from_slice(&size.to_le_bytes());
        h[48..56].copy_from_slice(&1u64.to_le_bytes());
        headers.extend_from_slice(&h);
    }
    out.write_all(&headers).map_err(io)?;
    let count = u16::try_from(table.len() + 1).map_err(|e| NotWritten::Unfit(e.to_string()))?;
    let mut header = [0u8; HEADER_BYTES];
    header[0..4].copy_from_slice(b"\x7fELF");
    // ELFCLASS64, ELFDATA2LSB, EV_CURRENT; an ET_REL file (no program headers).
    header[4] = 2;
    header[5] = 1;
    header[6] = 1;
    header[16..18].copy_from_slice(&1u16.to_le_bytes());
    header[18..20].copy_from_slice(&elf.machine().to_le_bytes());
    header[20..24].copy_from_slice(&1u32.to_le_bytes());
    header[40..48].copy_from_slice(&table_at.to_le_bytes());
    header[52..54].copy_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
    header[58..60].copy_from_slice(&(SECTION_HEADER_BYTES as u16).to_le_bytes());
    header[60..62].copy_from_slice(&count.to_le_bytes());
    header[62..64].copy_from_slice(&(count - 1).to_le_bytes());
    std::os::unix::fs::FileExt::write_all_at(out, &header, 0).map_err(io)
}
