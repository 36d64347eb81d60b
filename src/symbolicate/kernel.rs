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
/// come and go, is looked up in kallsyms anew, keeping only the symbols of the
/// addresses that need them.
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
        .and_then(|(s, k)| s.load_kernel_table(k, addresses.len()));
    let mut infos = vec![AddressInfo::default(); addresses.len()];
    let mut outside = Vec::new();
    for (i, &address) in addresses.iter().enumerate() {
        match table.as_ref().map(|t| t.lookup(address)) {
            Some(cache::InTable::Function(start, name)) => infos[i] = named(start, &name),
            _ => outside.push(i),
        }
    }
    if outside.is_empty() {
        return Ok((LibFacts::default(), infos));
    }
    let probes: Vec<u64> = outside
        .iter()
        .map(|&i| addresses[i].wrapping_add(base))
        .collect();
    let found = match (store, &key, &table) {
        // The boot's first run: every function read, for the table.
        (Some(store), Some(key), None) => {
            let listing = Listing::read().ok_or(HIDDEN)?;
            if let Some(bytes) = listing.table(key, base) {
                store.put_kernel_table(key, bytes);
            }
            probes
                .iter()
                .map(|&probe| listing.lookup(probe).map(|(a, n)| (a, n.to_string())))
                .collect()
        }
        // Only what the addresses need: a module's, or everything without the cache.
        _ => {
            let file = std::fs::File::open("/proc/kallsyms").map_err(|_| HIDDEN)?;
            let reader = std::io::BufReader::with_capacity(KALLSYMS_READ, file);
            symbols_at(reader, &probes).ok_or(HIDDEN)?
        }
    };
    for (i, symbol) in outside.into_iter().zip(found) {
        if let Some((start, name)) = symbol {
            infos[i] = named(start.wrapping_sub(base), &name);
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
/// in a few blocks rather than one string each (the kernel has some 120,000).
#[derive(Debug, Default)]
struct Listing {
    /// By address; of several at one address, the first listed.
    symbols: Vec<Listed>,
    names: NameBlocks,
    /// The addresses of the kernel's own functions, as [`Kallsyms::own`] says.
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
    /// Reads `/proc/kallsyms`; `None` when it cannot be read or hides the addresses.
    fn read() -> Option<Listing> {
        let file = std::fs::File::open("/proc/kallsyms").ok()?;
        Listing::parse(std::io::BufReader::with_capacity(KALLSYMS_READ, file))
    }

    /// [`Listing::read`] of kallsyms text from `text`.
    fn parse(text: impl std::io::BufRead) -> Option<Listing> {
        let mut listing = Listing::default();
        let mut others: Vec<u64> = Vec::new();
        let shown = code_symbols(text, |address, name, module| {
            if !module {
                let range = listing.own.get_or_insert(address..address);
                range.start = range.start.min(address);
                range.end = range.end.max(address);
            } else {
                others.push(address);
            }
            let Ok(name_len) = u16::try_from(name.len()) else {
                return;
            };
            let Some(name_at) = listing.names.push(name) else {
                return;
            };
            listing.symbols.push(Listed {
                address,
                name_at,
                name_len,
                own: !module,
            });
        });
        if !shown {
            return None;
        }
        // Stable: the first listed at an address stays first.
        listing.symbols.sort_by_key(|s| s.address);
        listing.symbols.dedup_by_key(|s| s.address);
        listing.own = listing
            .own
            .filter(|own| !others.iter().any(|a| own.start <= *a && *a <= own.end));
        Some(listing)
    }

    fn name(&self, s: &Listed) -> &str {
        self.names.get(s.name_at, s.name_len)
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
        let starts = functions().map(|s| s.address - base);
        let names = functions().map(|s| self.name(s));
        cache::KernelTable::build(key, starts, names, own.end.checked_sub(base)?)
    }
}

/// Names kept in blocks of [`NAME_BLOCK`] bytes, none across two, each block made at its
/// full size: they grow a block at a time and are never copied. The kernel's 2.9 MB of
/// names in one string doubled their way there, 5.8 MB at the peak of a first run of a
/// boot (heaptrack, `cargo build` with an empty cache), beside the table made of them.
#[derive(Debug, Default)]
struct NameBlocks {
    blocks: Vec<String>,
}

/// Bytes of a block of names: 256 KiB, a twelfth of the kernel's.
const NAME_BLOCK: usize = 1 << 18;

impl NameBlocks {
    /// Keeps `name`; where it is (its block times [`NAME_BLOCK`], plus its place in the
    /// block), `None` for a name longer than a block or beyond 4 GiB.
    fn push(&mut self, name: &str) -> Option<u32> {
        if name.len() > NAME_BLOCK {
            return None;
        }
        if self
            .blocks
            .last()
            .is_none_or(|block| block.len() + name.len() > NAME_BLOCK)
        {
            self.blocks.push(String::with_capacity(NAME_BLOCK));
        }
        let block = self.blocks.len() - 1;
        let last = self.blocks.last_mut()?;
        let at = u32::try_from(block * NAME_BLOCK + last.len()).ok()?;
        last.push_str(name);
        Some(at)
    }

    /// The name of `len` bytes kept at `at` ("" where none is).
    fn get(&self, at: u32, len: u16) -> &str {
        let (block, offset) = (at as usize / NAME_BLOCK, at as usize % NAME_BLOCK);
        self.blocks
            .get(block)
            .and_then(|b| b.get(offset..offset + len as usize))
            .unwrap_or("")
    }
}

/// The buffer kallsyms is read through: 64 KiB (the kernel formats a page of lines per
/// read whatever the size; a larger buffer only saves calls into it).
const KALLSYMS_READ: usize = 1 << 16;

/// The code symbol of kallsyms text `text` that covers each of `probes` (absolute
/// addresses, in any order), as a lookup among all its symbols gives it (the highest at
/// or below; of several at one address, the first listed): its address and name. Only
/// what the probes need is kept, whatever the size of the text: for each, ordered, the
/// best symbol at or above the probe before it. `None` when the addresses are hidden.
fn symbols_at(text: impl std::io::BufRead, probes: &[u64]) -> Option<Vec<Option<(u64, String)>>> {
    let mut order: Vec<usize> = (0..probes.len()).collect();
    order.sort_unstable_by_key(|&i| probes[i]);
    let sorted: Vec<u64> = order.iter().map(|&i| probes[i]).collect();
    // best[j]: the highest symbol in [sorted[j - 1] + 1, sorted[j]] read so far.
    let mut best: Vec<Option<(u64, String)>> = vec![None; sorted.len()];
    let shown = code_symbols(text, |address, name, _| {
        let j = sorted.partition_point(|&p| p < address);
        match best.get_mut(j) {
            Some(Some((at, held))) if *at < address => {
                *at = address;
                held.clear();
                held.push_str(name);
            }
            Some(slot @ None) => *slot = Some((address, name.to_string())),
            _ => {}
        }
    });
    if !shown {
        return None;
    }
    // A probe's symbol is the highest among its own slot and those of the probes below.
    let mut answers: Vec<Option<(u64, String)>> = vec![None; probes.len()];
    let mut below: Option<(u64, String)> = None;
    for (j, slot) in best.into_iter().enumerate() {
        if slot.is_some() {
            below = slot;
        }
        answers[order[j]] = below.clone();
    }
    Some(answers)
}

/// Hands each code symbol (types `T`, `t`, `W`, `w`) of kallsyms text `text` to `each`,
/// in the order listed: its address, name, and whether a module's name follows (it is
/// not the kernel's own). Returns whether any address was shown (not all zero).
fn code_symbols(mut text: impl std::io::BufRead, mut each: impl FnMut(u64, &str, bool)) -> bool {
    let mut shown = false;
    let mut line = Vec::new();
    loop {
        line.clear();
        match text.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Some((address, kind, name, module)) = kallsyms_fields(&line) else {
            continue;
        };
        shown |= address != 0;
        if address != 0 && matches!(kind, b'T' | b't' | b'W' | b'w') {
            each(address, name, module);
        }
    }
    shown
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
    Listing::parse(kallsyms.as_bytes())?.table(key, base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fill_blocks_without_crossing_them_and_read_back_whole() {
        let mut blocks = NameBlocks::default();
        let name = |i: usize| format!("function_{i:06}_{}", "x".repeat(i % 200));
        // Some 30 MB of names: over a hundred blocks.
        let at: Vec<(u32, String)> = (0..250_000)
            .map(|i| (blocks.push(&name(i)).unwrap(), name(i)))
            .collect();
        assert!(blocks.blocks.len() > 100);
        assert!(blocks.blocks.iter().all(|b| b.capacity() == NAME_BLOCK));
        for (place, name) in &at {
            assert_eq!(blocks.get(*place, name.len() as u16), name);
        }
        assert_eq!(blocks.push(&"y".repeat(NAME_BLOCK + 1)), None);
        assert_eq!(blocks.get(u32::MAX, 4), "");
    }

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
                    assert_eq!(
                        (start + BASE, name.as_str()),
                        (expected.address, &*expected.name)
                    );
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
            cache::InTable::Function(0, "_text".into()),
            "the first listed of two at one address"
        );
    }

    #[test]
    fn only_the_symbols_the_addresses_need_are_kept_and_they_answer_as_kallsyms_does() {
        let kallsyms = Kallsyms::parse(TEXT, "").unwrap();
        let mut probes: Vec<u64> = (BASE - 0x10..BASE + 0x3_0200).step_by(4).collect();
        probes.extend([0xffff_ffff_c000_0fff, 0xffff_ffff_c000_1234, u64::MAX, 0]);
        // In any order, repeated.
        probes.reverse();
        probes.push(BASE + 0x44);
        let found = symbols_at(TEXT.as_bytes(), &probes).unwrap();
        for (&probe, symbol) in probes.iter().zip(&found) {
            let expected = kallsyms.map.lookup(probe).map(|s| (s.address, s.name));
            assert_eq!(symbol, &expected, "0x{probe:x}");
        }
        assert_eq!(symbols_at(TEXT.as_bytes(), &[]), Some(vec![]));

        let all = Listing::parse(TEXT.as_bytes()).unwrap();
        assert_eq!(all.own, Some(BASE..0xffff_ffff_8103_0100));
        assert_eq!(all.lookup(BASE + 0x104), Some((BASE + 0x40, "weak_one")));
        // Hidden addresses: nothing; a BPF program among the kernel's own: no table.
        let hidden = "0000000000000000 T _text\n0000000000000000 t first\n";
        assert!(Listing::parse(hidden.as_bytes()).is_none());
        assert!(symbols_at(hidden.as_bytes(), &[BASE]).is_none());
        let inside = format!("{TEXT}ffffffff81000800 t bpf_prog_1\t[bpf]\n");
        assert_eq!(kernel_table(&inside, BASE, &key()), None);
        // Lines that are not kallsyms' are passed over.
        let odd = format!("zz T x\nffffffff81000000 T\n\n{BASE:x} TT y\n{TEXT}");
        assert_eq!(Listing::parse(odd.as_bytes()).unwrap().symbols.len(), 8);
    }
}
