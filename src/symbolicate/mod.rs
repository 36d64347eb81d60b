//! Symbolication: names every unique (library, address) of a [`RawProfile`] once, and
//! produces the final [`Profile`], in which one address with inlined calls becomes one
//! frame per inline depth (outer first, sharing the outer function's native symbol).
//!
//! A library that cannot be read, or has no symbols, leaves its addresses as `0x…`
//! names; nothing here fails the run.

mod dwarf;
pub mod symbols;

use std::collections::HashMap;
use std::sync::Arc;

use crate::binary::Binary;
use crate::profile::build::TRUNCATED_MARKER;
use crate::profile::*;
pub use dwarf::{DwarfInfo, SourceFrame};
pub use symbols::{demangle, Symbol, SymbolMap};

/// Everything known about one address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressInfo {
    /// The symbol covering the address (lib-relative start).
    pub symbol: Option<Symbol>,
    /// Source frames, outer first: the real function, then each inlined call.
    pub frames: Vec<SourceFrame>,
    /// For each of `frames`, the lib-relative start of the symbol of the same name, when
    /// the function also exists out of line: its inlined and called copies are one func.
    pub frame_symbols: Vec<Option<u64>>,
}

/// The symbol sources of one library.
pub struct LibSymbols {
    pub symbols: SymbolMap,
    pub dwarf: Option<DwarfInfo>,
    /// Added to a lib-relative address to get the address the tables use.
    pub base: u64,
}

impl LibSymbols {
    /// Loads the symbols of an ELF file held in `data`.
    pub fn from_elf(data: &[u8]) -> Option<LibSymbols> {
        let file = object::File::parse(data).ok()?;
        Some(LibSymbols {
            symbols: SymbolMap::from_elf(&file),
            dwarf: DwarfInfo::load(&file),
            base: 0,
        })
    }

    /// Looks up a lib-relative address.
    pub fn lookup(&self, address: u64) -> AddressInfo {
        let probe = address.wrapping_add(self.base);
        let symbol = self.symbols.lookup(probe).map(|s| Symbol {
            address: s.address - self.base,
            ..s.clone()
        });
        let frames: Vec<SourceFrame> = self
            .dwarf
            .as_ref()
            .map(|d| d.frames(probe))
            .unwrap_or_default();
        let frame_symbols = frames
            .iter()
            .map(|f| {
                self.symbols
                    .by_name(&f.function)
                    .map(|s| s.address.wrapping_sub(self.base))
            })
            .collect();
        AddressInfo {
            symbol,
            frames,
            frame_symbols,
        }
    }
}

/// Identity of a func: the symbol it starts at, or (for inlined functions and addresses
/// without a symbol) its name and file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum FuncKey {
    Symbol(LibIndex, u64),
    Named(Option<LibIndex>, String, Option<String>),
}

#[derive(Default)]
struct Tables {
    funcs: Vec<Func>,
    func_keys: HashMap<FuncKey, FuncIndex>,
    native_symbols: Interner<NativeSymbol, NativeSymbolIndex>,
    frames: Interner<Frame, FrameIndex>,
}

impl Tables {
    fn func(&mut self, key: FuncKey, make: impl FnOnce() -> Func) -> FuncIndex {
        if let Some(&f) = self.func_keys.get(&key) {
            return f;
        }
        let f = FuncIndex::new(self.funcs.len());
        self.funcs.push(make());
        self.func_keys.insert(key, f);
        f
    }

    /// The frames (outer first) of one raw address frame.
    fn expand(&mut self, raw: &AddressFrame, info: Option<&AddressInfo>) -> Vec<FrameIndex> {
        let plain = |func, line| Frame {
            func,
            lib: raw.lib,
            address: raw.lib.map(|_| raw.address),
            inline_depth: 0,
            native_symbol: None,
            line,
            kind: raw.kind,
        };
        if raw.kind == CodeKind::Marker {
            let func = self.func(FuncKey::Named(None, TRUNCATED_MARKER.into(), None), || {
                Func {
                    name: TRUNCATED_MARKER.into(),
                    file: None,
                    lib: None,
                }
            });
            return vec![self.frames.intern(plain(func, None), FrameIndex::new)];
        }
        let info = info.cloned().unwrap_or_default();
        let (Some(lib), Some(symbol)) = (raw.lib, info.symbol.as_ref()) else {
            // No symbol: name the frame after the DWARF function if there is one, else
            // after the address.
            let outer = info.frames.first();
            let name = outer.map_or_else(|| format!("0x{:x}", raw.address), |f| f.function.clone());
            let file = outer.and_then(|f| f.file.clone());
            let func = self.func(FuncKey::Named(raw.lib, name.clone(), file.clone()), || {
                Func {
                    name,
                    file,
                    lib: raw.lib,
                }
            });
            return vec![self
                .frames
                .intern(plain(func, outer.and_then(|f| f.line)), FrameIndex::new)];
        };
        let native = self.native_symbols.intern(
            NativeSymbol {
                lib,
                address: symbol.address,
                size: symbol.size,
                name: symbol.name.clone(),
            },
            NativeSymbolIndex::new,
        );
        let outer_file = info.frames.first().and_then(|f| f.file.clone());
        let outer_func = self.func(FuncKey::Symbol(lib, symbol.address), || Func {
            name: symbol.name.clone(),
            file: outer_file,
            lib: Some(lib),
        });
        let mut out = Vec::with_capacity(info.frames.len().max(1));
        out.push(self.frames.intern(
            Frame {
                native_symbol: Some(native),
                ..plain(outer_func, info.frames.first().and_then(|f| f.line))
            },
            FrameIndex::new,
        ));
        for (depth, sf) in info.frames.iter().enumerate().skip(1) {
            let key = match info.frame_symbols.get(depth).copied().flatten() {
                Some(address) => FuncKey::Symbol(lib, address),
                None => FuncKey::Named(Some(lib), sf.function.clone(), sf.file.clone()),
            };
            let func = self.func(key, || Func {
                name: sf.function.clone(),
                file: sf.file.clone(),
                lib: Some(lib),
            });
            out.push(self.frames.intern(
                Frame {
                    inline_depth: depth as u32,
                    native_symbol: Some(native),
                    ..plain(func, sf.line)
                },
                FrameIndex::new,
            ));
        }
        out
    }
}

/// Turns a raw profile into the final one, given the symbols of each library (`None`
/// where a library has none).
pub fn apply(raw: RawProfile, lib_symbols: &[Option<LibSymbols>]) -> Profile {
    // Each unique address is looked up once.
    let infos: Vec<Option<AddressInfo>> = raw
        .address_frames
        .iter()
        .map(|af| {
            let syms = lib_symbols.get(af.lib?.index())?.as_ref()?;
            Some(syms.lookup(af.address))
        })
        .collect();
    let mut tables = Tables::default();
    let mut libs_without_symbols = Vec::new();
    let expanded: Vec<Vec<FrameIndex>> = raw
        .address_frames
        .iter()
        .zip(&infos)
        .map(|(af, info)| {
            if let (Some(lib), CodeKind::User | CodeKind::Kernel) = (af.lib, af.kind) {
                if info.as_ref().is_none_or(|i| i.symbol.is_none())
                    && !libs_without_symbols.contains(&lib)
                {
                    libs_without_symbols.push(lib);
                }
            }
            tables.expand(af, info.as_ref())
        })
        .collect();
    let mut stacks: Interner<Stack, StackIndex> = Interner::default();
    let mut stack_map: Vec<StackIndex> = Vec::with_capacity(raw.stacks.len());
    for rs in &raw.stacks {
        // Prefixes come first, so the prefix is already mapped.
        let mut prefix = rs.prefix.map(|p| stack_map[p.index()]);
        for &frame in &expanded[rs.frame.index()] {
            prefix = Some(stacks.intern(Stack { prefix, frame }, StackIndex::new));
        }
        stack_map.push(prefix.expect("every address frame expands to at least one frame"));
    }
    let threads = raw
        .threads
        .into_iter()
        .map(|t| t.map_stacks(|s| stack_map[s.index()]))
        .collect();
    Profile {
        meta: raw.meta,
        libs: raw.libs,
        funcs: tables.funcs,
        native_symbols: tables.native_symbols.items,
        frames: tables.frames.items,
        stacks: stacks.items,
        processes: raw.processes,
        threads,
        libs_without_symbols,
    }
}

/// Reads the kernel's symbols from `/proc/kallsyms`; `None` when they are hidden.
pub fn read_kallsyms() -> Option<SymbolMap> {
    SymbolMap::from_kallsyms(&std::fs::read_to_string("/proc/kallsyms").ok()?)
}

/// The kernel's text start (`_text`), read from the first lines of `/proc/kallsyms`
/// without loading the whole table; `None` when the addresses are hidden.
pub fn kernel_text_start() -> Option<u64> {
    use std::io::BufRead;
    let file = std::fs::File::open("/proc/kallsyms").ok()?;
    for line in std::io::BufReader::new(file)
        .lines()
        .take(KALLSYMS_TEXT_SEARCH_LINES)
    {
        let line = line.ok()?;
        if let Some((address, _, "_text" | "_stext")) = symbols::kallsyms_line(&line) {
            return (address != 0).then_some(address);
        }
    }
    None
}

/// `_text` is among the first lines of kallsyms (after a few absolute symbols); past this
/// many lines the full table is needed anyway.
const KALLSYMS_TEXT_SEARCH_LINES: usize = 1000;

/// Loads the symbols of every library of `raw` from the files the profile builder
/// verified (`lib_binaries`, parallel to `raw.libs`), and symbolicates. Kernel symbols are
/// read only when the profile has kernel frames.
pub fn symbolicate(raw: RawProfile, lib_binaries: &[Option<Arc<Binary>>]) -> Profile {
    let mut kallsyms = if raw.libs.iter().any(|l| l.kind == LibKind::Kernel) {
        read_kallsyms()
    } else {
        None
    };
    let lib_symbols: Vec<Option<LibSymbols>> = raw
        .libs
        .iter()
        .zip(lib_binaries)
        .map(|(lib, binary)| match lib.kind {
            LibKind::File => LibSymbols::from_elf(&binary.as_ref()?.data),
            LibKind::Kernel => Some(LibSymbols {
                symbols: kallsyms.take()?,
                dwarf: None,
                base: lib.base,
            }),
            LibKind::Pseudo => None,
        })
        .collect();
    apply(raw, &lib_symbols)
}
