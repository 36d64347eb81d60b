//! Naming the kernel's addresses: its symbols from `/proc/kallsyms` (named `[kernel]
//! name`), read in one pass without a string per symbol, and the symbol cache's table of
//! its own functions, one per boot, which spares later runs of the boot from reading
//! kallsyms.

use std::ops::Range;

use super::{cache, AddressInfo, Kallsyms, LibFacts, LibSymbols, Named, Symbol, SymbolOptions};

/// Kernel functions are named `[kernel] name`, so they stand out wherever names are
/// shown without their library (terminal, folded stacks).
pub const KERNEL_PREFIX: &str = "[kernel] ";

/// Reads the kernel's symbols from `/proc/kallsyms`, named `[kernel] name`; `None` when
/// they are hidden.
pub fn read_kallsyms() -> Option<Kallsyms> {
    Kallsyms::parse(
        &std::fs::read_to_string("/proc/kallsyms").ok()?,
        KERNEL_PREFIX,
    )
}

/// The kernel's symbols: those given in `opts`, else read from `/proc/kallsyms` when
/// `opts` says to, else why there are none.
pub(super) fn kallsyms(opts: &SymbolOptions) -> Result<Kallsyms, String> {
    match &opts.kernel {
        Some(kernel) => Some(kernel.clone()),
        None if opts.read_kallsyms => read_kallsyms(),
        None => None,
    }
    .ok_or_else(|| HIDDEN.into())
}

/// Why the kernel has no names when kallsyms shows no addresses.
const HIDDEN: &str = "/proc/kallsyms hides addresses (kernel.kptr_restrict; run as root)";

/// Names the `addresses` of the kernel, whose text starts at `base` (they are relative
/// to it). Its own functions are the same for every run of one boot, and reading
/// `/proc/kallsyms` is the most a short recording with kernel samples spends after its
/// command ends (the kernel's formatting of 120,000 lines, some 40 ms), so the first run
/// of a boot writes them into the cache as one table ([`cache::KernelTable`]) and later
/// runs look them up there. The code of modules, BPF programs and trampolines, which
/// come and go, is looked up in kallsyms anew, whose lines of the kernel's own are then
/// skipped unread.
pub(super) fn name_kernel(base: u64, addresses: &[u64], opts: &SymbolOptions) -> Named {
    if let Some(kernel) = &opts.kernel {
        let syms = LibSymbols {
            symbols: kernel.map.clone(),
            base,
            ..LibSymbols::default()
        };
        return Ok((syms.facts(), syms.lookup_many(addresses)));
    }
    // Only where the kernel's addresses can be read, which the cache must not reveal
    // where they cannot.
    if !opts.read_kallsyms {
        return Err(HIDDEN.into());
    }
    let store = opts.cache.as_deref();
    let key = store.and_then(|store| store.kernel_key(base));
    let table = store
        .zip(key.as_ref())
        .and_then(|(s, k)| s.load_kernel_table(k));
    let mut infos = vec![AddressInfo::default(); addresses.len()];
    let mut outside = Vec::new();
    for (i, &address) in addresses.iter().enumerate() {
        match table.as_ref().map(|t| t.lookup(address)) {
            Some(cache::InTable::Function(start, name)) => infos[i] = named(start, name),
            _ => outside.push(i),
        }
    }
    if outside.is_empty() {
        return Ok((LibFacts::default(), infos));
    }
    let listing = Listing::read(table.is_none()).ok_or(HIDDEN)?;
    if let (Some(store), Some(key), None) = (store, &key, &table) {
        if let Some(bytes) = listing.table(key, base) {
            store.put_kernel_table(key, bytes);
        }
    }
    for i in outside {
        if let Some((start, name)) = listing.lookup(addresses[i].wrapping_add(base)) {
            infos[i] = named(start.wrapping_sub(base), name);
        }
    }
    Ok((LibFacts::default(), infos))
}

/// What is known of an address in the kernel function `name` that starts at `start`
/// (relative): as a lookup among kallsyms' symbols gives it.
fn named(start: u64, name: &str) -> AddressInfo {
    AddressInfo {
        symbol: Some(Symbol {
            address: start,
            size: None,
            name: format!("{KERNEL_PREFIX}{name}"),
        }),
        ..AddressInfo::default()
    }
}

/// The kernel's code symbols as one pass over `/proc/kallsyms` gives them, their names
/// in one string rather than one each (the kernel has some 120,000).
#[derive(Debug, Default)]
struct Listing {
    /// By address; of several at one address, the first listed.
    symbols: Vec<Listed>,
    names: String,
    /// The addresses of the kernel's own functions, as [`Kallsyms::own`] says; `None`
    /// when they were skipped.
    own: Option<Range<u64>>,
}

#[derive(Clone, Copy, Debug)]
struct Listed {
    address: u64,
    name_at: u32,
    name_len: u16,
    /// The kernel's own (the line names no module).
    own: bool,
}

impl Listing {
    /// Reads `/proc/kallsyms`, with the kernel's own functions when `own` says (else
    /// only the others: modules', BPF programs', trampolines'); `None` when it cannot be
    /// read or hides the addresses.
    fn read(own: bool) -> Option<Listing> {
        let file = std::fs::File::open("/proc/kallsyms").ok()?;
        // Large reads: the kernel formats as many lines as fit each.
        Listing::parse(std::io::BufReader::with_capacity(1 << 16, file), own)
    }

    /// [`Listing::read`] of kallsyms text from `text`.
    fn parse(mut text: impl std::io::BufRead, own: bool) -> Option<Listing> {
        let mut listing = Listing::default();
        let mut others: Vec<u64> = Vec::new();
        let mut shown = false;
        let mut line = Vec::new();
        loop {
            line.clear();
            match text.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            // Skipped unread: the kernel's own, when not wanted (no module follows).
            let is_own = !line.trim_ascii_end().ends_with(b"]");
            if is_own && !own && shown {
                continue;
            }
            let Some((address, kind, name, module)) = kallsyms_fields(&line) else {
                continue;
            };
            shown |= address != 0;
            if address == 0 || !matches!(kind, b'T' | b't' | b'W' | b'w') {
                continue;
            }
            if !module {
                let range = listing.own.get_or_insert(address..address);
                range.start = range.start.min(address);
                range.end = range.end.max(address);
                if !own {
                    continue;
                }
            } else {
                others.push(address);
            }
            let (Ok(name_at), Ok(name_len)) = (
                u32::try_from(listing.names.len()),
                u16::try_from(name.len()),
            ) else {
                continue;
            };
            listing.names.push_str(name);
            listing.symbols.push(Listed {
                address,
                name_at,
                name_len,
                own: !module,
            });
        }
        if !shown {
            return None;
        }
        // Stable: the first listed at an address stays first.
        listing.symbols.sort_by_key(|s| s.address);
        listing.symbols.dedup_by_key(|s| s.address);
        listing.own = listing
            .own
            .filter(|own| !others.iter().any(|a| own.start <= *a && *a <= own.end))
            .filter(|_| own);
        Some(listing)
    }

    fn name(&self, s: &Listed) -> &str {
        let at = s.name_at as usize;
        &self.names[at..at + s.name_len as usize]
    }

    /// The symbol with the highest address at or below `address`: its address and name.
    fn lookup(&self, address: u64) -> Option<(u64, &str)> {
        let i = self.symbols.partition_point(|s| s.address <= address);
        let s = self.symbols.get(i.checked_sub(1)?)?;
        Some((s.address, self.name(s)))
    }

    /// The table of the kernel of `key`, whose text starts at `base`: its own functions
    /// from `base` to the last one, which ends where no symbol says (past its start,
    /// an address is looked up in kallsyms); `None` when no range of its own lies apart
    /// from other code, or the table cannot hold it.
    fn table(&self, key: &cache::Key, base: u64) -> Option<Vec<u8>> {
        let own = self.own.as_ref()?;
        let functions = || {
            self.symbols
                .iter()
                .filter(move |s| s.own && s.address >= base && s.address < own.end)
        };
        let starts: Vec<u64> = functions().map(|s| s.address - base).collect();
        let names = functions().map(|s| self.name(s));
        cache::KernelTable::build(key, &starts, names, own.end.checked_sub(base)?)
    }
}

/// One line of `/proc/kallsyms` (`ADDRESS TYPE NAME`, then `\t[MODULE]` for what is not
/// the kernel's own): its address, type letter, name and whether a module follows. Read
/// as bytes, for the 120,000 lines a run reads: what `record::kallsyms_line` reads as words.
fn kallsyms_fields(line: &[u8]) -> Option<(u64, u8, &str, bool)> {
    let space = line.iter().position(|&b| b == b' ')?;
    if space == 0 || space > 16 {
        return None;
    }
    let mut address = 0u64;
    for &digit in &line[..space] {
        address = address << 4 | u64::from((digit as char).to_digit(16)?);
    }
    let (&kind, rest) = line.get(space + 1..)?.split_first()?;
    let rest = rest.strip_prefix(b" ")?;
    let end = rest
        .iter()
        .position(|&b| b.is_ascii_whitespace())
        .unwrap_or(rest.len());
    let name = std::str::from_utf8(&rest[..end]).ok()?;
    let module = !rest[end..].trim_ascii().is_empty();
    (!name.is_empty()).then_some((address, kind, name, module))
}

/// The kernel table ([`cache::KernelTable`]) of the kernel of `key` whose text starts at
/// `base`, from its kallsyms text `kallsyms`, as a run that reads it writes it.
pub fn kernel_table(kallsyms: &str, base: u64, key: &cache::Key) -> Option<Vec<u8>> {
    Listing::parse(kallsyms.as_bytes(), true)?.table(key, base)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Own functions (two at one address), data, a weak symbol, a module's function and
    /// a BPF program's.
    const TEXT: &str = "\
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81000010 t first
ffffffff81000040 W weak_one
ffffffff81000100 D some_data
ffffffff81010020 T second
ffffffff81030000 t fourth
ffffffff81030100 T last
ffffffffc0001000 t mod_fn\t[kvm]
ffffffffc0002000 t bpf_prog_6deef7357e7b4530_sd_fw_egress\t[bpf]
";
    const BASE: u64 = 0xffff_ffff_8100_0000;

    fn key() -> cache::Key {
        cache::Key {
            build_id: vec![9; 20],
            size: 42,
            stamp: Default::default(),
        }
    }

    #[test]
    fn the_table_names_the_kernels_own_functions_as_kallsyms_does() {
        let table =
            cache::KernelTable::parse(kernel_table(TEXT, BASE, &key()).unwrap(), &key()).unwrap();
        assert_eq!(
            table.len(),
            5,
            "_text to fourth, one of two at an address; the last one is looked up anew"
        );
        let kallsyms = Kallsyms::parse(TEXT, "").unwrap();
        let own = kallsyms.own.clone().unwrap();
        for probe in (BASE..BASE + 0x3_0200)
            .step_by(8)
            .chain([own.end - 1, own.end])
        {
            let expected = kallsyms.map.lookup(probe).unwrap();
            match table.lookup(probe - BASE) {
                cache::InTable::Function(start, name) => {
                    assert!(probe < own.end, "0x{probe:x}");
                    assert_eq!((start + BASE, name), (expected.address, &*expected.name));
                }
                other => assert!(probe >= own.end, "0x{probe:x}: {other:?}"),
            }
        }
        assert_eq!(
            table.lookup(0xffff_ffff_c000_1000 - BASE),
            cache::InTable::Outside
        );
        assert_eq!(
            table.lookup(0x8),
            cache::InTable::Function(0, "_text"),
            "the first listed of two at one address"
        );
    }

    #[test]
    fn without_the_kernels_own_lines_only_the_others_are_kept() {
        let others = Listing::parse(TEXT.as_bytes(), false).unwrap();
        assert_eq!(others.symbols.len(), 2);
        assert_eq!(
            others.lookup(0xffff_ffff_c000_1234),
            Some((0xffff_ffff_c000_1000, "mod_fn"))
        );
        assert_eq!(others.lookup(0xffff_ffff_8100_0010), None);
        assert_eq!(others.own, None);
        let all = Listing::parse(TEXT.as_bytes(), true).unwrap();
        assert_eq!(all.own, Some(BASE..0xffff_ffff_8103_0100));
        assert_eq!(all.lookup(BASE + 0x44), Some((BASE + 0x40, "weak_one")));
        assert_eq!(all.lookup(BASE + 0x104), Some((BASE + 0x40, "weak_one")));
        // Hidden addresses: nothing; a BPF program among the kernel's own: no table.
        let hidden = "0000000000000000 T _text\n0000000000000000 t first\n";
        assert!(Listing::parse(hidden.as_bytes(), true).is_none());
        assert!(Listing::parse(hidden.as_bytes(), false).is_none());
        // Lines that are not kallsyms' are passed over.
        let odd = format!("zz T x\nffffffff81000000 T\n\n{:x} TT y\n{TEXT}", BASE);
        assert_eq!(
            Listing::parse(odd.as_bytes(), true).unwrap().symbols.len(),
            8
        );
        let inside = format!("{TEXT}ffffffff81000800 t bpf_prog_1\t[bpf]\n");
        assert_eq!(kernel_table(&inside, BASE, &key()), None);
    }
}
