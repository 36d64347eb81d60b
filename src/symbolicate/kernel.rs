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
    let file = std::fs::File::open("/proc/kallsyms").map_err(|_| HIDDEN)?;
    let reader = std::io::BufReader::with_capacity(KALLSYMS_READ, file);
    let found = match (store, &key, &table) {
        // The boot's first run: every function read, for the table.
        (Some(store), Some(key), None) => {
            let (table, found) = table_and_symbols(reader, base, key, &probes).ok_or(HIDDEN)?;
            if let Some(table) = table {
                store.put_kernel_table(key, table);
            }
            found
        }
        // Only what the addresses need: a module's, or everything without the cache.
        _ => symbols_at(reader, &probes).ok_or(HIDDEN)?,
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

/// The kernel's own functions, as kallsyms lists them (in address order), made into
/// the boot's table as they are read: nothing else of kallsyms is kept.
struct OwnFunctions {
    table: cache::TableBuilder,
    /// Where the kernel's text starts: the table holds the functions from there on.
    base: u64,
    /// The lowest and highest address of the kernel's own functions.
    own: Option<Range<u64>>,
    /// The addresses of the code of modules, BPF programs and trampolines: a table is
    /// made only when none lies among the kernel's own functions.
    others: Vec<u64>,
}

impl OwnFunctions {
    fn new(base: u64) -> OwnFunctions {
        OwnFunctions {
            table: cache::TableBuilder::default(),
            base,
            own: None,
            others: Vec::new(),
        }
    }

    /// Takes in a code symbol of kallsyms, in the order listed; `module`: not the
    /// kernel's own. Of several at one address, the first listed is kept.
    fn add(&mut self, address: u64, name: &str, module: bool) {
        if module {
            self.others.push(address);
            return;
        }
        let range = self.own.get_or_insert(address..address);
        range.start = range.start.min(address);
        range.end = range.end.max(address);
        if let Some(start) = address.checked_sub(self.base) {
            if self.table.last_start() != Some(start) {
                self.table.push(start, name);
            }
        }
    }

    /// The table of the kernel of `key`: its own functions from `base` to the last one,
    /// which ends where no symbol says (past its start, an address is looked up in
    /// kallsyms); `None` when no range of its own lies apart from other code, kallsyms
    /// did not list its functions in address order, or the table cannot hold them.
    fn finish(mut self, key: &cache::Key) -> Option<cache::TableBytes> {
        let own = self.own?;
        if self.others.iter().any(|a| own.start <= *a && *a <= own.end) {
            return None;
        }
        let text_end = own.end.checked_sub(self.base)?;
        if self.table.last_start() == Some(text_end) {
            self.table.pop();
        }
        self.table.finish(key, text_end)
    }
}

/// One pass over kallsyms text `text`, for the first run of a boot: the table of the
/// kernel of `key` whose text starts at `base` (when it can be made), and the symbols
/// of `probes` (as [`symbols_at`] finds them). `None` when the addresses are hidden.
fn table_and_symbols(
    text: impl std::io::BufRead,
    base: u64,
    key: &cache::Key,
    probes: &[u64],
) -> Option<(Option<cache::TableBytes>, Vec<Found>)> {
    let mut own = OwnFunctions::new(base);
    let mut found = Probes::new(probes);
    let shown = code_symbols(text, |address, name, module| {
        own.add(address, name, module);
        found.see(address, name);
    });
    shown.then(|| (own.finish(key), found.answers()))
}

/// The buffer kallsyms is read through: 64 KiB (the kernel formats a page of lines per
/// read whatever the size; a larger buffer only saves calls into it).
const KALLSYMS_READ: usize = 1 << 16;

/// The code symbol of kallsyms text `text` that covers each of `probes` (absolute
/// addresses, in any order), as a lookup among all its symbols gives it (the highest at
/// or below; of several at one address, the first listed): its address and name. Only
/// what the probes need is kept, whatever the size of the text. `None` when the
/// addresses are hidden.
fn symbols_at(text: impl std::io::BufRead, probes: &[u64]) -> Option<Vec<Found>> {
    let mut found = Probes::new(probes);
    code_symbols(text, |address, name, _| found.see(address, name)).then(|| found.answers())
}

/// The symbol found for an address: its start and name.
type Found = Option<(u64, String)>;

/// The symbols of some addresses, found among symbols seen one at a time in any order:
/// for each probe, ordered, the best symbol at or above the probe before it.
struct Probes {
    /// Where each probe is in `sorted`.
    order: Vec<usize>,
    sorted: Vec<u64>,
    /// best[j]: the highest symbol in [sorted[j - 1] + 1, sorted[j]] seen so far.
    best: Vec<Found>,
}

impl Probes {
    fn new(probes: &[u64]) -> Probes {
        let mut order: Vec<usize> = (0..probes.len()).collect();
        order.sort_unstable_by_key(|&i| probes[i]);
        let sorted: Vec<u64> = order.iter().map(|&i| probes[i]).collect();
        Probes {
            order,
            best: vec![None; sorted.len()],
            sorted,
        }
    }

    fn see(&mut self, address: u64, name: &str) {
        let j = self.sorted.partition_point(|&p| p < address);
        match self.best.get_mut(j) {
            Some(Some((at, held))) if *at < address => {
                *at = address;
                held.clear();
                held.push_str(name);
            }
            Some(slot @ None) => *slot = Some((address, name.to_string())),
            _ => {}
        }
    }

    /// Each probe's symbol, in the order the probes were given: the highest among its
    /// own slot and those of the probes below.
    fn answers(self) -> Vec<Found> {
        let mut answers: Vec<Found> = vec![None; self.order.len()];
        let mut below: Found = None;
        for (j, slot) in self.best.into_iter().enumerate() {
            if slot.is_some() {
                below = slot;
            }
            answers[self.order[j]] = below.clone();
        }
        answers
    }
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
pub fn kernel_table(kallsyms: &str, base: u64, key: &cache::Key) -> Option<cache::TableBytes> {
    table_and_symbols(kallsyms.as_bytes(), base, key, &[])?.0
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
            cache::KernelTable::parse(kernel_table(TEXT, BASE, &key()).unwrap().joined(), &key())
                .unwrap();
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

        // The boot's first run finds the same in the pass that makes its table.
        let (table, first) = table_and_symbols(TEXT.as_bytes(), BASE, &key(), &probes).unwrap();
        assert!(table.is_some());
        assert_eq!(first, found);
        // Hidden addresses: nothing; a BPF program among the kernel's own: no table.
        let hidden = "0000000000000000 T _text\n0000000000000000 t first\n";
        assert!(table_and_symbols(hidden.as_bytes(), BASE, &key(), &[BASE]).is_none());
        assert!(symbols_at(hidden.as_bytes(), &[BASE]).is_none());
        let inside = format!("{TEXT}ffffffff81000800 t bpf_prog_1\t[bpf]\n");
        assert!(kernel_table(&inside, BASE, &key()).is_none());
        // Lines that are not kallsyms' are passed over.
        let odd = format!("zz T x\nffffffff81000000 T\n\n{BASE:x} TT y\n{TEXT}");
        let table = |text: &str| kernel_table(text, BASE, &key()).map(|t| t.joined());
        assert_eq!(table(&odd), table(TEXT));
        // The kernel's own functions out of address order: no table, the same symbols.
        let mut lines: Vec<&str> = TEXT.lines().collect();
        lines.swap(2, 5);
        let unordered = lines.join("\n");
        let (table, first) =
            table_and_symbols(unordered.as_bytes(), BASE, &key(), &probes).unwrap();
        assert!(table.is_none());
        assert_eq!(first, found);
    }
}
