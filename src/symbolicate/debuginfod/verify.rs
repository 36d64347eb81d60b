//! Whether a file is the debug file asked for: its build ID, read from the whole file
//! once it is in, or from the first bytes of a download while it comes.

use std::io::Write;

use crate::files::usercache::TempFile;

/// The lower-case hex of a build ID, as URLs and cache names spell it.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `data` (an ELF file, in memory or behind a reader) has build ID `id`; if not,
/// what it is instead.
pub fn verify<'d, R: object::ReadRef<'d>>(data: R, id: &[u8]) -> Result<(), String> {
    use object::Object;
    let file = object::File::parse(data).map_err(|_| "not an ELF file".to_string())?;
    match file.build_id() {
        Ok(Some(found)) if found == id => Ok(()),
        Ok(Some(found)) => Err(format!("its build ID is {}, not {}", hex(found), hex(id))),
        _ => Err("it has no build ID".to_string()),
    }
}

/// What the first bytes of a download (`prefix`) tell of it: `Some(Err)` when they are not
/// an ELF file, or one whose build ID (in the notes its program headers place among
/// them) is not `id`; `Some(Ok)` when it is `id`; `None` when they cannot tell yet (the
/// whole file is checked once it is in).
pub(super) fn early_verdict(prefix: &[u8], id: &[u8]) -> Option<Result<(), String>> {
    if prefix.len() < object::elf::ELFMAG.len() {
        return None;
    }
    if prefix[..object::elf::ELFMAG.len()] != object::elf::ELFMAG {
        return Some(Err("not an ELF file".into()));
    }
    let found = match object::FileKind::parse(prefix).ok()? {
        object::FileKind::Elf64 => {
            build_id_note::<object::elf::FileHeader64<object::Endianness>>(prefix)
        }
        object::FileKind::Elf32 => {
            build_id_note::<object::elf::FileHeader32<object::Endianness>>(prefix)
        }
        _ => None,
    }?;
    Some(match found == id {
        true => Ok(()),
        false => Err(format!("its build ID is {}, not {}", hex(found), hex(id))),
    })
}

/// The build ID in the notes that the program headers of the ELF file starting `data`
/// place within `data`.
fn build_id_note<Elf: object::read::elf::FileHeader<Endian = object::Endianness>>(
    data: &[u8],
) -> Option<&[u8]> {
    use object::read::elf::ProgramHeader;
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    for segment in header.program_headers(endian, data).ok()? {
        let Ok(Some(mut notes)) = segment.notes(endian, data) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == b"GNU" && note.n_type(endian) == object::elf::NT_GNU_BUILD_ID {
                return Some(note.desc());
            }
        }
    }
    None
}

/// Whether what was written into `temp` has build ID `id`, read back through a second
/// descriptor of the same file (only its headers and notes are read).
pub(super) fn verify_written(temp: &mut TempFile, id: &[u8]) -> Result<(), String> {
    temp.file.flush().map_err(|e| e.to_string())?;
    let file = temp.reopen().map_err(|e| e.to_string())?;
    verify(&object::ReadCache::new(file), id)
}
