//! Naming the kernel's addresses: where its text starts, its symbols from
//! `/proc/kallsyms` (named `[kernel] name`), and the symbol cache's entries of its own
//! functions, one per piece of its text, which spare a later run of the same boot from
//! reading kallsyms.

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
    .ok_or_else(|| "/proc/kallsyms hides addresses (kernel.kptr_restrict; run as root)".into())
}

/// Names the `addresses` of the kernel, whose text starts at `base` (they are relative
/// to it). Its own functions are the same for every run of one boot, and reading
/// `/proc/kallsyms` takes longer than anything else sampler does after a short
/// recording, so the cache holds every one of them, from the first run that needed it,
/// in pieces of [`KERNEL_PIECE_BYTES`] of its text: a run loads the pieces its addresses
/// lie in, one at a time (all of them would be 10–15 MB). The code of modules, BPF
/// programs and trampolines, which come and go, is looked up anew.
pub(super) fn name_kernel(base: u64, addresses: &[u64], opts: &SymbolOptions) -> Named {
    // Only where the kernel's addresses can be read, which the cache must not reveal
    // where they cannot.
    let store = opts.cache.as_ref().filter(|_| opts.read_kallsyms);
    let kernel = store.and_then(|store| store.kernel_key(base));
    let key_of = |piece| kernel.as_ref().map(|k| k.kernel_piece(piece));
    let mut piece_missing = false;
    if let Some(store) = store {
        match kernel_from_cache(store, &key_of, addresses) {
            Ok(found) => return Ok(found),
            Err(missing) => piece_missing = missing,
        }
    }
    let kallsyms = kallsyms(opts)?;
    let syms = LibSymbols {
        symbols: kallsyms.map,
        base,
        ..LibSymbols::default()
    };
    // Written when a piece was missing; not when each was there and an address lies
    // outside the kernel's own functions (a module's), which reading kallsyms names.
    if let (Some(store), true, Some(own)) = (store, piece_missing, &kallsyms.own) {
        for (key, bytes) in kernel_entries(&syms, own, &key_of) {
            store.put(&key, bytes);
        }
    }
    Ok((syms.facts(), syms.lookup_many(addresses)))
}

/// Bytes of the kernel's text per cache entry: 64 KiB holds a few hundred functions,
/// an entry of tens of KB; a profile's kernel addresses lie in some dozens of them.
pub const KERNEL_PIECE_BYTES: u64 = 1 << 16;

/// The key of the entry that says where the kernel's own text ends (one interval from
/// its start): past it, an address is a module's, which no piece holds.
pub const KERNEL_EXTENT_PIECE: u64 = u64::MAX;

/// The piece of the kernel's text that a kernel-relative address lies in.
fn kernel_piece(relative: u64) -> u64 {
    relative / KERNEL_PIECE_BYTES
}

/// `addresses` (kernel-relative) named from the cache's pieces, each under the key
/// `key_of` gives it; `Err(true)` when a piece is not there, `Err(false)` when an
/// address lies in none of the functions of its piece (or the kernel has no key).
fn kernel_from_cache(
    store: &cache::SymbolCache,
    key_of: &dyn Fn(u64) -> Option<cache::Key>,
    addresses: &[u64],
) -> Result<(LibFacts, Vec<AddressInfo>), bool> {
    let load = |piece: u64| {
        let key = key_of(piece).ok_or(false)?;
        store
            .load(&key)
            .filter(|e| e.source() == cache::DebugSource::Own)
            .ok_or(true)
    };
    let extent = load(KERNEL_EXTENT_PIECE)?;
    if addresses.iter().any(|&a| extent.lookup(a).is_none()) {
        return Err(false);
    }
    let mut order: Vec<usize> = (0..addresses.len()).collect();
    order.sort_unstable_by_key(|&i| addresses[i]);
    let mut infos = vec![AddressInfo::default(); addresses.len()];
    let mut facts = LibFacts::default();
    for same in order.chunk_by(|&a, &b| kernel_piece(addresses[a]) == kernel_piece(addresses[b])) {
        let entry = load(kernel_piece(addresses[same[0]]))?;
        for &i in same {
            infos[i] = entry.lookup(addresses[i]).ok_or(false)?;
        }
        facts = entry.facts();
    }
    Ok((facts, infos))
}

/// The cache entries of the kernel's own functions (`own`, in its addresses), whose
/// symbols `syms` holds, one per piece of its text (see [`KERNEL_PIECE_BYTES`]), under
/// the key `key_of` gives the piece: each symbol's extent within them, with what a lookup
/// gives there (the symbol, no frames: the kernel has no DWARF here), in every piece it
/// reaches into; and the entry of [`KERNEL_EXTENT_PIECE`].
pub fn kernel_entries(
    syms: &LibSymbols,
    own: &Range<u64>,
    key_of: &dyn Fn(u64) -> Option<cache::Key>,
) -> Vec<(cache::Key, Vec<u8>)> {
    let mut pieces: std::collections::BTreeMap<u64, cache::EntryBuilder> = Default::default();
    for symbol in syms.symbols.symbols() {
        let extent = syms.symbols.extent(symbol.address);
        if !(own.contains(&extent.start) && extent.end <= own.end && extent.start >= syms.base) {
            continue;
        }
        let range = extent.start - syms.base..extent.end - syms.base;
        let symbol = Symbol {
            address: range.start,
            size: symbol.size,
            name: syms.symbols.display_name(symbol),
        };
        for piece in kernel_piece(range.start)..=kernel_piece(range.end - 1) {
            pieces
                .entry(piece)
                .or_default()
                .add_symbol(range.clone(), &symbol);
        }
    }
    let facts = syms.facts();
    if let Some(end) = own.end.checked_sub(syms.base).filter(|&end| end > 0) {
        let mut extent = cache::EntryBuilder::default();
        let text = Symbol {
            address: 0,
            size: Some(end),
            name: "[kernel]".into(),
        };
        extent.add_symbol(0..end, &text);
        pieces.insert(KERNEL_EXTENT_PIECE, extent);
    }
    pieces
        .into_iter()
        .filter_map(|(piece, builder)| {
            let key = key_of(piece)?;
            let bytes = builder.finish(&key, &facts, &cache::DebugSource::Own);
            Some((key, bytes))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_is_named_from_the_pieces_its_addresses_lie_in() {
        // Functions in pieces 0, 1 and 3 of the text; one reaches from piece 1 into 2.
        let text = "\
ffffffff81000000 T _text
ffffffff81000010 t first
ffffffff81010020 T second
ffffffff81030000 t fourth
ffffffff81030100 T last
ffffffffc0001000 t mod_fn\t[kvm]
";
        let kallsyms = Kallsyms::parse(text, KERNEL_PREFIX).unwrap();
        let own = kallsyms.own.clone().unwrap();
        let syms = LibSymbols {
            base: kallsyms.text_start,
            symbols: kallsyms.map,
            ..LibSymbols::default()
        };
        let key_of = |piece: u64| {
            Some(cache::Key {
                build_id: vec![9; 20],
                size: piece,
                stamp: Default::default(),
            })
        };
        let root = crate::files::testdir::TestDir::new("kernel");
        let store = cache::SymbolCache::at(root.path().to_path_buf(), None);
        let entries = kernel_entries(&syms, &own, &key_of);
        let pieces: Vec<u64> = entries.iter().map(|(key, _)| key.size).collect();
        assert_eq!(pieces, [0, 1, 2, 3, KERNEL_EXTENT_PIECE]);
        for (key, bytes) in entries {
            store.put(&key, bytes);
        }
        assert_eq!(store.save(), Ok(5));

        let addresses = [0x30050, 0x10, 0x2_0000, 0x1_0030, 0x18];
        let (_, infos) = kernel_from_cache(&store, &key_of, &addresses).unwrap();
        let names: Vec<&str> = infos
            .iter()
            .map(|i| i.symbol.as_ref().unwrap().name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "[kernel] fourth",
                "[kernel] first",
                "[kernel] second",
                "[kernel] second",
                "[kernel] first"
            ]
        );
        let expected: Vec<AddressInfo> = addresses.iter().map(|&a| syms.lookup(a)).collect();
        assert_eq!(infos, expected, "as kallsyms names them");

        // A module's address is in no piece: kallsyms is read.
        let module = 0xffff_ffff_c000_1000 - syms.base;
        assert_eq!(
            kernel_from_cache(&store, &key_of, &[0x10, module]).err(),
            Some(false)
        );
        // A piece that is gone (evicted): kallsyms is read, and the pieces written again.
        std::fs::remove_file(store.dir().join(key_of(1).unwrap().file_name())).unwrap();
        assert_eq!(
            kernel_from_cache(&store, &key_of, &[0x10]).map(|(_, i)| i.len()),
            Ok(1)
        );
        assert_eq!(
            kernel_from_cache(&store, &key_of, &[0x10, 0x1_0030]).err(),
            Some(true)
        );
    }
}
