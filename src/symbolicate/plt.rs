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

use std::collections::HashMap;

use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationTarget};

use super::symbols::{without_version, Symbol};

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

/// One symbol per PLT entry of `file`; `ifunc_name` names the function at an address of
/// the file (for `IRELATIVE` slots, whose relocation carries an address, not a symbol).
pub fn plt_symbols<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    ifunc_name: impl Fn(u64) -> Option<String>,
) -> Vec<Symbol> {
    let x86_64 = matches!(
        file.architecture(),
        object::Architecture::X86_64 | object::Architecture::X86_64_X32
    );
    let slots = if x86_64 {
        slot_names(file, &ifunc_name)
    } else {
        HashMap::new()
    };
    let mut out = Vec::new();
    for section in file.sections() {
        let Ok(name) = section.name() else { continue };
        // A separate debug file's sections hold no bytes; the file itself names them.
        if !is_plt_section(name)
            || section.size() == 0
            || section.kind() == object::SectionKind::UninitializedData
        {
            continue;
        }
        let whole = || Symbol {
            address: section.address(),
            size: Some(section.size()),
            name: PLT_NAME.into(),
        };
        let data = section.data().unwrap_or(&[]);
        let entry_size = entry_size(name, data);
        if !x86_64
            || data.len() as u64 != section.size()
            || section.size() / entry_size > MAX_ENTRIES
        {
            out.push(whole());
            continue;
        }
        for (i, entry) in data.chunks(entry_size as usize).enumerate() {
            let address = section.address().wrapping_add(i as u64 * entry_size);
            let name = jump_slot(entry)
                .and_then(|(at, disp)| {
                    let next = address.checked_add((at + JMP_RIP_LEN) as u64)?;
                    slots.get(&next.wrapping_add_signed(i64::from(disp)))
                })
                .map_or_else(|| PLT_NAME.to_string(), |f| format!("{f}{PLT_SUFFIX}"));
            out.push(Symbol {
                address,
                size: Some(entry.len() as u64),
                name,
            });
        }
    }
    out
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

/// The function each GOT slot that a dynamic relocation fills will hold, by the slot's
/// address.
fn slot_names<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    ifunc_name: &impl Fn(u64) -> Option<String>,
) -> HashMap<u64, String> {
    use object::elf::{R_X86_64_GLOB_DAT, R_X86_64_IRELATIVE, R_X86_64_JUMP_SLOT};
    let mut slots = HashMap::new();
    let Some(relocations) = file.dynamic_relocations() else {
        return slots;
    };
    let dynsym = file.dynamic_symbol_table();
    for (slot, relocation) in relocations {
        let object::RelocationFlags::Elf { r_type } = relocation.flags() else {
            continue;
        };
        let name = match relocation.target() {
            RelocationTarget::Symbol(index)
                if r_type == R_X86_64_JUMP_SLOT || r_type == R_X86_64_GLOB_DAT =>
            {
                dynsym
                    .as_ref()
                    .and_then(|table| table.symbol_by_index(index).ok())
                    .and_then(|s| Some(without_version(s.name().ok()?).to_string()))
                    .filter(|name| !name.is_empty())
            }
            RelocationTarget::Absolute if r_type == R_X86_64_IRELATIVE => {
                let at = relocation.addend() as u64;
                Some(ifunc_name(at).unwrap_or_else(|| format!("*ABS*+0x{at:x}")))
            }
            _ => None,
        };
        if let Some(name) = name {
            slots.insert(slot, name);
        }
    }
    slots
}
