//! Names of PLT stubs, the small pieces of code through which a file calls functions of
//! other files: each entry of `.plt`, `.plt.sec` and `.plt.got` is named after the
//! function it jumps to (`malloc@plt`), as objdump and perf name them.
//!
//! On x86-64 every stub that calls out is an indirect jump through a GOT slot
//! (`jmp *slot(%rip)`, after an `endbr64` in IBT builds, or as `bnd jmp`), and the dynamic
//! relocation that fills the slot names the function: `JUMP_SLOT` for lazily bound
//! `.plt`/`.plt.sec` stubs, `GLOB_DAT` for `.plt.got` ones, `IRELATIVE` for calls to an
//! IFUNC of the file itself (named after the IFUNC symbol at the addend). Decoding the
//! jump, rather than pairing entries with `.rela.plt` in order, also holds where the
//! linker orders the relocations differently from the stubs (glibc's `IRELATIVE` ones).
//! Entries that jump through no named slot (the lazy-binding header `PLT0`, the IBT
//! `.plt` entries only the first call runs) and the PLTs of other architectures are
//! named [`PLT_NAME`].

use std::collections::{HashMap, HashSet};

use super::symbol::Symbol;
use super::symtab;
use crate::files::elf::Elf;
use crate::files::image::At;

/// The name of PLT code that is not a stub for one known function.
pub const PLT_NAME: &str = "[plt]";

/// The suffix of a PLT stub's name, after the name of the function it calls.
pub const PLT_SUFFIX: &str = "@plt";

/// The size of an x86-64 PLT entry: a jump, a push and a jump in lazy `.plt` entries;
/// `endbr64` and a jump, padded, in IBT ones.
const ENTRY_SIZE: u64 = 16;
/// The size of a `.plt.got` entry without IBT: a 6-byte jump and a 2-byte `nop`.
const GOT_ENTRY_SIZE: u64 = 8;
/// `endbr64`, which starts every IBT PLT entry.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// `jmp *disp32(%rip)`: opcode FF /4 with ModRM 0x25, then a 32-bit displacement from
/// the end of the 6-byte instruction.
const JMP_RIP: [u8; 2] = [0xff, 0x25];
const JMP_RIP_LEN: usize = 6;

/// The most entries a PLT section is read for; a larger one (a damaged file) is one
/// [`PLT_NAME`] symbol. The largest programs import some tens of thousands of functions.
const MAX_ENTRIES: u64 = 1 << 18;

/// Whether a section of this name holds PLT stubs.
pub fn is_plt_section(name: &str) -> bool {
    matches!(name, ".plt" | ".plt.sec" | ".plt.got")
}

/// One symbol per PLT entry of `file`, whose bytes `at` reads, or with `only` (sorted
/// addresses) per entry that holds one of them; `ifunc_names` names the functions at some
/// addresses of the file (for `IRELATIVE` slots, whose relocation carries an address,
/// not a symbol). Only the dynamic relocations of the slots the stubs named jump through
/// are kept, streamed from the file: a large library has hundreds of thousands of
/// others. Naming only the entries asked for matters there: each entry's name is a read
/// of `.dynsym` and one of its strings, and rustc's LLVM has thousands of entries.
pub fn plt_symbols<'d, R: object::ReadRef<'d>>(
    file: &Elf<'d, R>,
    at: &At,
    only: Option<&[u64]>,
    ifunc_names: impl FnOnce(&[u64]) -> HashMap<u64, String>,
) -> Vec<Symbol> {
    let asked = |address: u64, size: u64| {
        only.is_none_or(|sorted| {
            let i = sorted.partition_point(|&a| a < address);
            sorted.get(i).is_some_and(|&a| a - address < size)
        })
    };
    let x86_64 = file.is_x86_64();
    // Each entry: its address and size, and the GOT slot it jumps through.
    let mut entries: Vec<(u64, u64, Option<u64>)> = Vec::new();
    let mut whole: Vec<Symbol> = Vec::new();
    for section in file.sections() {
        // A separate debug file's sections hold no bytes; the file itself names them.
        if !is_plt_section(section.name) || section.size() == 0 || section.file_range().is_none() {
            continue;
        }
        let data = file.data(&section).unwrap_or(&[]);
        let entry_size = entry_size(section.name, data);
        if !x86_64
            || data.len() as u64 != section.size()
            || section.size() / entry_size > MAX_ENTRIES
        {
            whole.push(Symbol {
                address: section.address(),
                size: Some(section.size()),
                name: PLT_NAME.into(),
            });
            continue;
        }
        for (i, entry) in data.chunks(entry_size as usize).enumerate() {
            let address = section.address().wrapping_add(i as u64 * entry_size);
            if !asked(address, entry.len() as u64) {
                continue;
            }
            let slot = jump_slot(entry).and_then(|(at, disp)| {
                let next = address.checked_add((at + JMP_RIP_LEN) as u64)?;
                Some(next.wrapping_add_signed(i64::from(disp)))
            });
            entries.push((address, entry.len() as u64, slot));
        }
    }
    let wanted: HashSet<u64> = entries.iter().filter_map(|e| e.2).collect();
    let targets = if wanted.is_empty() {
        HashMap::new()
    } else {
        slot_targets(file, at, &wanted)
    };
    let mut ifuncs: Vec<u64> = targets
        .values()
        .filter_map(|t| match t {
            Target::Ifunc(address) => Some(*address),
            Target::Import(_) => None,
        })
        .collect();
    ifuncs.sort_unstable();
    ifuncs.dedup();
    let ifunc_names = if ifuncs.is_empty() {
        HashMap::new()
    } else {
        ifunc_names(&ifuncs)
    };
    let name_of = |slot: u64| match targets.get(&slot)? {
        Target::Import(name) => Some(name.clone()),
        Target::Ifunc(at) => Some(
            ifunc_names
                .get(at)
                .cloned()
                .unwrap_or_else(|| format!("*ABS*+0x{at:x}")),
        ),
    };
    whole.extend(entries.into_iter().map(|(address, size, slot)| {
        Symbol {
            address,
            size: Some(size),
            name: slot
                .and_then(name_of)
                .map_or_else(|| PLT_NAME.to_string(), |f| format!("{f}{PLT_SUFFIX}")),
        }
    }));
    whole
}

/// The size of a PLT section's entries: 16 bytes, except in `.plt.got` without IBT,
/// whose entries are a bare 6-byte jump padded to 8 (with IBT, an `endbr64` first makes
/// them 16, and the section starts with that instruction).
fn entry_size(name: &str, data: &[u8]) -> u64 {
    if name == ".plt.got" && !data.starts_with(&ENDBR64) {
        GOT_ENTRY_SIZE
    } else {
        ENTRY_SIZE
    }
}

/// Where in a PLT entry its `jmp *slot(%rip)` starts, and the displacement.
fn jump_slot(entry: &[u8]) -> Option<(usize, i32)> {
    let at = entry.windows(JMP_RIP.len()).position(|w| w == JMP_RIP)?;
    let disp = entry.get(at + 2..at + JMP_RIP_LEN)?;
    Some((at, i32::from_le_bytes(disp.try_into().ok()?)))
}

/// What a GOT slot will hold, as its dynamic relocation says.
enum Target {
    /// A function of another file, by name (`JUMP_SLOT`, `GLOB_DAT`).
    Import(String),
    /// The IFUNC of the file itself at this address (`IRELATIVE`).
    Ifunc(u64),
}

/// The size of an `Elf64_Rela`.
const RELA_BYTES: usize = 24;

/// Relocation bytes read at a time: 64 KiB of whole entries.
const RELA_CHUNK_BYTES: usize = RELA_BYTES * 2730;

/// What the dynamic relocations of `file` (the `SHT_RELA` sections that refer to its
/// `.dynsym`, or to no table in a static program) put in each of the `wanted` slots,
/// read through `at` a chunk at a time.
fn slot_targets<'d, R: object::ReadRef<'d>>(
    file: &Elf<'d, R>,
    at: &At,
    wanted: &HashSet<u64>,
) -> HashMap<u64, Target> {
    use object::elf::{R_X86_64_GLOB_DAT, R_X86_64_IRELATIVE, R_X86_64_JUMP_SLOT};
    use object::Endian as _;
    let dynsym = file.section_of_kind(object::elf::SHT_DYNSYM);
    let symbols_index = dynsym.map_or(0, |s| s.index);
    let strings = dynsym.and_then(|s| Some((s, file.section_at(s.link())?.file_range()?)));
    let word = |b: &[u8]| file.endian().read_u64(b.try_into().unwrap_or_default());
    let mut targets = HashMap::new();
    let mut chunk = vec![0u8; RELA_CHUNK_BYTES];
    for section in file.sections() {
        if section.kind() != object::elf::SHT_RELA
            || section.link() != symbols_index
            || section.entry_size() != RELA_BYTES as u64
        {
            continue;
        }
        let Some((mut offset, size)) = section.file_range() else {
            continue;
        };
        let end = offset.saturating_add(size);
        while offset < end {
            let n = ((end - offset) as usize).min(RELA_CHUNK_BYTES);
            let n = n - n % RELA_BYTES;
            if n == 0 || at.read_into(offset, &mut chunk[..n]) != Some(n) {
                break;
            }
            for rela in chunk[..n].chunks_exact(RELA_BYTES) {
                let slot = word(&rela[0..8]);
                if !wanted.contains(&slot) {
                    continue;
                }
                let info = word(&rela[8..16]);
                let (kind, symbol) = (object::elf::RelocationType(info as u32), info >> 32);
                let target = match kind {
                    R_X86_64_JUMP_SLOT | R_X86_64_GLOB_DAT if symbol != 0 => {
                        strings.and_then(|(dynsym, strings)| {
                            symtab::name_of_symbol(at, &dynsym, strings, symbol).map(Target::Import)
                        })
                    }
                    R_X86_64_IRELATIVE => Some(Target::Ifunc(word(&rela[16..24]))),
                    _ => None,
                };
                if let Some(target) = target {
                    targets.insert(slot, target);
                }
            }
            offset += n as u64;
        }
    }
    targets
}
