//! Symbol tables: ELF `.symtab`/`.dynsym` and `/proc/kallsyms`, with the lookup rule of
//! docs/design.md §2 (the symbol with the highest start address at or below the address), and
//! demangling of Rust and C++ names.

use std::collections::HashMap;

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

use super::symbol::without_version;
pub use super::symbol::Symbol;
use crate::record::kallsyms_line;

/// Symbols sorted by start address, at most one per address.
///
/// ELF names are kept as the file has them (mangled) and demangled only when looked up:
/// a profile names a few hundred functions, a large binary has hundreds of thousands.
#[derive(Clone, Debug, Default)]
pub struct SymbolMap {
    symbols: Vec<Symbol>,
    /// By the name as stored (mangled, for ELF symbols); made when first asked for
    /// (only DWARF's linkage names are looked up by name, and the kernel has none).
    by_name: std::sync::OnceLock<HashMap<String, usize>>,
    /// Whether stored names are mangled and demangled on lookup.
    mangled: bool,
}

impl SymbolMap {
    /// Builds the map; of several symbols at one address the first one given wins, so
    /// callers list preferred symbols (sized, global) first. Names are used as given.
    pub fn new(mut symbols: Vec<Symbol>) -> SymbolMap {
        // A stable sort keeps the caller's preference order among equal addresses.
        symbols.sort_by_key(|s| s.address);
        symbols.dedup_by_key(|s| s.address);
        SymbolMap {
            symbols,
            by_name: std::sync::OnceLock::new(),
            mangled: false,
        }
    }

    /// The symbol whose name, as the file stores it (mangled: a DWARF linkage name), is
    /// `name`.
    pub fn by_name(&self, name: &str) -> Option<&Symbol> {
        let by_name = self.by_name.get_or_init(|| {
            let mut by_name = HashMap::with_capacity(self.symbols.len());
            for (i, s) in self.symbols.iter().enumerate() {
                by_name.entry(s.name.clone()).or_insert(i);
            }
            by_name
        });
        by_name.get(name).map(|&i| &self.symbols[i])
    }

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// The symbol with the highest start address `<= address` (docs/design.md §2), unless that
    /// symbol's size is known and the address lies past its end: then the address is in
    /// code the table has no name for (a static function missing from `.dynsym`), and a
    /// neighbour's name would be a lie. The name is demangled.
    pub fn lookup(&self, address: u64) -> Option<Symbol> {
        self.lookup_stored(address).map(|s| Symbol {
            name: self.display_name(s),
            ..s.clone()
        })
    }

    /// [`SymbolMap::lookup`], with the name as stored (mangled, for ELF symbols).
    pub fn lookup_stored(&self, address: u64) -> Option<&Symbol> {
        let i = self.symbols.partition_point(|s| s.address <= address);
        let s = self.symbols.get(i.checked_sub(1)?)?;
        match s.size {
            Some(size) if address >= s.address + size => None,
            _ => Some(s),
        }
    }

    /// The addresses around `address` that [`SymbolMap::lookup_stored`] gives the same
    /// answer for: from the start of its symbol (or the end of the one before) to the
    /// start of the next symbol or the end of its own, whichever comes first.
    pub fn extent(&self, address: u64) -> std::ops::Range<u64> {
        let i = self.symbols.partition_point(|s| s.address <= address);
        let next = self.symbols.get(i).map_or(u64::MAX, |s| s.address);
        let Some(s) = i.checked_sub(1).map(|i| &self.symbols[i]) else {
            return 0..next;
        };
        match s.size.map(|size| s.address.saturating_add(size)) {
            Some(end) if address >= end => end..next,
            Some(end) => s.address..end.min(next),
            None => s.address..next,
        }
    }

    /// The name to show for a symbol of this map.
    pub fn display_name(&self, s: &Symbol) -> String {
        if self.mangled {
            demangle(&s.name)
        } else {
            s.name.clone()
        }
    }

    /// The function symbols of ELF files that describe one address space (a file and
    /// its separate debug file), each file's from [`elf_symbols`] (`.symtab` and
    /// `.dynsym`). Where several symbols start at one address, the earlier file wins,
    /// then sized, then global symbols.
    pub fn from_elf_symbols(files: Vec<Vec<(bool, Symbol)>>) -> SymbolMap {
        let mut symbols: Vec<(usize, bool, Symbol)> = Vec::new();
        for (rank, file) in files.into_iter().enumerate() {
            symbols.extend(file.into_iter().map(|(global, s)| (rank, global, s)));
        }
        symbols.sort_by_key(|(rank, global, s)| (s.address, *rank, s.size.is_none(), !global));
        SymbolMap::from_preferred(symbols.into_iter().map(|(_, _, s)| s).collect())
    }

    /// ELF symbols already in order of preference where several start at one address
    /// (see [`SymbolMap::from_elf_symbols`]).
    pub fn from_preferred(symbols: Vec<Symbol>) -> SymbolMap {
        SymbolMap {
            mangled: true,
            ..SymbolMap::new(symbols)
        }
    }

    /// Parses a JIT's perf map (`/tmp/perf-PID.map`): lines of `START SIZE name`, hex
    /// numbers with or without `0x`. Code can be replaced at an address; the entry
    /// written last wins.
    pub fn from_perf_map(text: &str) -> SymbolMap {
        SymbolMap::from_written(perf_map_entries(text))
    }

    /// The map with `name` for `range` where no symbol covers its start (a stripped
    /// program's `_start`, which its ELF header locates).
    pub fn or_named(self, range: std::ops::Range<u64>, name: &str) -> SymbolMap {
        if self.lookup_stored(range.start).is_some() {
            return self;
        }
        let mangled = self.mangled;
        let mut symbols = self.symbols;
        symbols.push(Symbol {
            address: range.start,
            size: Some(range.end - range.start),
            name: name.to_string(),
        });
        SymbolMap {
            mangled,
            ..SymbolMap::new(symbols)
        }
    }

    /// JIT code's names in the order they were written: the one written last at an
    /// address wins.
    pub fn from_written(mut symbols: Vec<Symbol>) -> SymbolMap {
        symbols.reverse();
        SymbolMap::new(symbols)
    }
}

/// The entries of a perf map, in the order they were written (see
/// [`SymbolMap::from_perf_map`]).
pub fn perf_map_entries(text: &str) -> Vec<Symbol> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    text.lines()
        .filter_map(|line| {
            let mut parts = line.trim().splitn(3, ' ');
            let (start, size, name) = (parts.next()?, parts.next()?, parts.next()?);
            Some(Symbol {
                address: hex(start)?,
                size: hex(size).filter(|&s| s > 0),
                name: demangle(name.trim()),
            })
        })
        .collect()
}

/// Functions, and the untyped labels that assembly code defines in executable sections
/// (`_start`, `_dl_start_user`): they name code nothing else names. A separate debug
/// file's `.text` holds no bytes (`SHT_NOBITS`), so the section's flags decide, not its
/// kind.
fn is_code_symbol<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    s: &object::Symbol<'d, '_, R>,
) -> bool {
    match s.kind() {
        SymbolKind::Text => true,
        SymbolKind::Unknown => s
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
            .is_some_and(|section| match section.flags() {
                object::SectionFlags::Elf { sh_flags, .. } => {
                    sh_flags.0 & object::elf::SHF_EXECINSTR.0 != 0
                }
                _ => false,
            }),
        _ => false,
    }
}

/// An IFUNC symbol (`STT_GNU_IFUNC`), which `object` does not count as a definition: its
/// address is its resolver's, the code that picks the implementation, and PLT stubs that
/// call the IFUNC are named after it.
fn is_ifunc<'d, R: object::ReadRef<'d>>(s: &object::Symbol<'d, '_, R>) -> bool {
    matches!(s.flags(), object::SymbolFlags::Elf { st_info, .. }
        if st_info.st_type() == object::elf::STT_GNU_IFUNC)
        && s.section_index().is_some()
}

/// The named function symbols of one ELF file, with whether each is global (its PLT
/// stubs: [`with_plt`]).
pub fn elf_symbols<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> Vec<(bool, Symbol)> {
    file.symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| (s.is_definition() || is_ifunc(s)) && s.address() != 0)
        .filter(|s| is_code_symbol(file, s))
        .filter_map(|s| {
            let name = s.name().ok()?;
            if name.is_empty() {
                return None;
            }
            Some((
                s.is_global(),
                Symbol {
                    address: s.address(),
                    size: (s.size() > 0).then_some(s.size()),
                    name: without_version(name).to_string(),
                },
            ))
        })
        .collect()
}

/// `functions` (a file's, from [`elf_symbols`]) with a symbol for each PLT entry of the
/// file (see `symbolicate::plt`), whose IFUNC stubs are named from `functions`.
pub fn with_plt<'d, R: object::ReadRef<'d>>(
    mut functions: Vec<(bool, Symbol)>,
    file: &crate::files::elf::Elf<'d, R>,
    at: &crate::files::image::At,
) -> Vec<(bool, Symbol)> {
    let plt = super::plt::plt_symbols(file, at, None, |addresses| {
        let mut named: HashMap<u64, String> = HashMap::new();
        for (global, s) in &functions {
            if addresses.binary_search(&s.address).is_err() {
                continue;
            }
            if *global || !named.contains_key(&s.address) {
                named.insert(s.address, s.name.clone());
            }
        }
        named
    });
    functions.extend(plt.into_iter().map(|s| (false, s)));
    functions
}

impl SymbolMap {
    /// Parses `/proc/kallsyms` text; `None` when the addresses are hidden (all zero).
    pub fn from_kallsyms(text: &str) -> Option<SymbolMap> {
        Some(Kallsyms::parse(text, "")?.map)
    }

    /// The kernel's text start (`_text`, else `_stext`, else the lowest symbol).
    pub fn kernel_text_start(&self) -> u64 {
        ["_text", "_stext"]
            .iter()
            .find_map(|want| self.symbols.iter().find(|s| s.name == *want))
            .or(self.symbols.first())
            .map_or(0, |s| s.address)
    }

    /// The symbols, by address.
    pub fn symbols(&self) -> &[Symbol] {
        &self.symbols
    }
}

/// The kernel's code symbols, as `/proc/kallsyms` lists them.
#[derive(Clone, Debug, Default)]
pub struct Kallsyms {
    pub map: SymbolMap,
    /// Where the kernel's text starts: `_text`, else `_stext`, else its lowest symbol.
    pub text_start: u64,
    /// The addresses of the kernel's own functions (the lines that name no module: not
    /// a module's, a BPF program's or a trampoline's), which one build of the kernel
    /// always has alike; `None` when another symbol lies among them.
    pub own: Option<std::ops::Range<u64>>,
}

impl Kallsyms {
    /// Parses `/proc/kallsyms` text, naming each symbol `prefix` + its name; `None` when
    /// the addresses are hidden (all zero).
    pub fn parse(text: &str, prefix: &str) -> Option<Kallsyms> {
        let mut symbols: Vec<Symbol> = Vec::new();
        let (mut text_start, mut stext) = (None, None);
        let mut own: Option<std::ops::Range<u64>> = None;
        let mut others: Vec<u64> = Vec::new();
        for line in text.lines() {
            let Some((address, kind, name)) = kallsyms_line(line) else {
                continue;
            };
            if address == 0 || !matches!(kind, "T" | "t" | "W" | "w") {
                continue;
            }
            match name {
                "_text" => text_start = text_start.or(Some(address)),
                "_stext" => stext = stext.or(Some(address)),
                _ => {}
            }
            // A module's name follows the symbol's, in brackets.
            if line.split_whitespace().nth(3).is_some() {
                others.push(address);
            } else {
                let range = own.get_or_insert(address..address);
                range.start = range.start.min(address);
                range.end = range.end.max(address);
            }
            symbols.push(Symbol {
                address,
                size: None,
                name: format!("{prefix}{name}"),
            });
        }
        let lowest = symbols.iter().map(|s| s.address).min()?;
        let own = own.filter(|own| !others.iter().any(|a| own.start <= *a && *a <= own.end));
        Some(Kallsyms {
            map: SymbolMap::new(symbols),
            text_start: text_start.or(stext).unwrap_or(lowest),
            own,
        })
    }
}

/// Demangles a Rust (legacy or v0, without the hash) or C++ symbol name; other names are
/// returned as they are.
pub fn demangle(name: &str) -> String {
    // A PLT stub is named after the function it calls.
    if let Some(callee) = name.strip_suffix(super::plt::PLT_SUFFIX) {
        return format!("{}{}", demangle(callee), super::plt::PLT_SUFFIX);
    }
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z") {
        let cpp = |name: &str| cpp_demangle::Symbol::new(name).ok()?.demangle().ok();
        let gcc = || super::gcc_names::restore(&cpp(&super::gcc_names::rewrite(name)?)?);
        if let Some(d) = cpp(name).or_else(gcc) {
            return d;
        }
    }
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(address: u64, name: &str) -> Symbol {
        Symbol {
            address,
            size: None,
            name: name.into(),
        }
    }

    #[test]
    fn lookup_takes_the_highest_start_at_or_below() {
        // Seed 003: main at 0x01, doSomething at 0x0F, someInterlude at 0x14.
        let map = SymbolMap::new(vec![
            sym(0x14, "someInterlude"),
            sym(0x01, "main"),
            sym(0x0f, "doSomething"),
        ]);
        assert_eq!(map.lookup(0x02).unwrap().name, "main");
        assert_eq!(map.lookup(0x09).unwrap().name, "main");
        assert_eq!(map.lookup(0x0f).unwrap().name, "doSomething");
        assert_eq!(map.lookup(0x11).unwrap().name, "doSomething");
        assert_eq!(map.lookup(0x15).unwrap().name, "someInterlude");
        assert!(map.lookup(0x00).is_none());
    }

    #[test]
    fn a_sized_symbol_does_not_cover_addresses_past_its_end() {
        let sized = |address, size, name: &str| Symbol {
            address,
            size: Some(size),
            name: name.into(),
        };
        let map = SymbolMap::new(vec![
            sized(0x100, 0x20, "exported"),
            sized(0x200, 0x10, "next"),
        ]);
        assert_eq!(map.lookup(0x11f).unwrap().name, "exported");
        assert!(
            map.lookup(0x120).is_none(),
            "a hidden static function after `exported`"
        );
        assert_eq!(map.by_name("next").unwrap().address, 0x200);
    }

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_ZN3foo3barEi"), "foo::bar(int)");
        assert_eq!(demangle("plain_c"), "plain_c");
    }

    #[test]
    fn demangles_plt_stubs_and_clones() {
        assert_eq!(demangle("_ZN3foo3barEv@plt"), "foo::bar()@plt");
        assert_eq!(demangle("malloc@plt"), "malloc@plt");
        assert_eq!(
            demangle("_ZN3foo3barEv.constprop.0.isra.0"),
            "foo::bar() [clone .constprop.0] [clone .isra.0]"
        );
    }

    #[test]
    fn kallsyms_text_symbols() {
        let text = "ffffffff81000000 T _text\nffffffff81001000 t helper\nffffffff82000000 D some_data\nffffffffc0001000 t mod_fn\t[kvm]\n";
        let map = SymbolMap::from_kallsyms(text).unwrap();
        assert_eq!(map.len(), 3);
        let kallsyms = Kallsyms::parse(text, "k ").unwrap();
        assert_eq!(kallsyms.text_start, 0xffff_ffff_8100_0000);
        assert_eq!(
            kallsyms.own,
            Some(0xffff_ffff_8100_0000..0xffff_ffff_8100_1000)
        );
        assert_eq!(
            kallsyms.map.lookup(0xffff_ffff_8100_0004).unwrap().name,
            "k _text"
        );
        let inside = format!("{text}ffffffff81000800 t bpf_prog_1\t[bpf]\n");
        assert_eq!(Kallsyms::parse(&inside, "").unwrap().own, None);
        assert_eq!(map.kernel_text_start(), 0xffff_ffff_8100_0000);
        assert_eq!(map.lookup(0xffff_ffff_8100_1234).unwrap().name, "helper");
        assert!(SymbolMap::from_kallsyms("0000000000000000 T _text\n").is_none());
    }
}
