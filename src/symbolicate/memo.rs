//! What naming learned, kept across the windows of a continuous recording: each
//! library's answers by address, so that a window names only the addresses that no
//! recent window had. A machine's hot code is much the same from one window to the
//! next; after the first windows, naming one costs a few lookups (the symbol cache on
//! disk spares the next run the same work; this spares the next window).
//!
//! Bounded in bytes, in two generations: answers go to the young one, and an old answer
//! that is used again moves back into it; once the young one holds half of
//! [`MAX_MEMO_BYTES`], it becomes the old one and the one before is dropped. What the
//! machine keeps running stays; the code of a build that ended goes within two turns.

use std::collections::HashMap;

use super::{name_lib, rebuild, AddressInfo, LibFacts, Named, SymbolOptions};
use crate::files::binary::LibFile;
use crate::profile::{Lib, LibKind, Profile, RawProfile};

/// The most the answers take, both generations together: 16 MiB. An answer is a name
/// and its inline chain, 100–1,000 bytes (C++ and Rust names are long); a machine
/// running a compiler meets some 500 new addresses a 10-second window, so the young
/// generation turns over every few minutes there and almost never elsewhere.
pub const MAX_MEMO_BYTES: usize = 16 << 20;

/// A library, numbered in the order it was first named (the builder's libraries, one
/// per mapped file, are the same in every window).
type LibId = u32;

/// Answers by library and address.
#[derive(Default)]
pub struct NameMemo {
    libs: HashMap<Lib, (LibId, LibFacts)>,
    young: HashMap<(LibId, u64), AddressInfo>,
    young_bytes: usize,
    old: HashMap<(LibId, u64), AddressInfo>,
    /// Addresses named (not found in the memo) by the last call of [`Self::symbolicate`].
    pub last_named: usize,
}

/// About what an answer takes in memory: its strings and the structures that hold them.
fn size_of(info: &AddressInfo) -> usize {
    let strings: usize = info.symbol.as_ref().map_or(0, |s| s.name.len())
        + info
            .frames
            .iter()
            .map(|f| {
                f.function.len()
                    + f.linkage_name.as_ref().map_or(0, String::len)
                    + f.file.as_ref().map_or(0, String::len)
                    + std::mem::size_of_val(f)
            })
            .sum::<usize>();
    strings + std::mem::size_of::<AddressInfo>() + 16 * info.frame_symbols.len() + 32
}

impl NameMemo {
    /// Like [`super::symbolicate`], naming only what the memo does not hold, one library
    /// after the other (a window has few new addresses; workers would cost more than
    /// they save). A JIT's code changes under the same addresses: it is named anew each
    /// time.
    pub fn symbolicate(
        &mut self,
        raw: RawProfile,
        lib_binaries: &[LibFile],
        opts: &SymbolOptions,
    ) -> Profile {
        self.last_named = 0;
        let by_lib = rebuild::frames_by_lib(&raw);
        let named: Vec<Option<Named>> = by_lib
            .iter()
            .enumerate()
            .map(|(i, frames)| {
                let addresses = rebuild::addresses_of(&raw, frames);
                Some(self.name(&raw.libs[i], &lib_binaries[i], &addresses, opts))
            })
            .collect();
        if self.young_bytes > MAX_MEMO_BYTES / 2 {
            self.old = std::mem::take(&mut self.young);
            self.young_bytes = 0;
        }
        rebuild::assemble(raw, &by_lib, named)
    }

    /// The answer for `address` of library `lib`, moved to the young generation when
    /// it was old.
    fn recall(&mut self, lib: LibId, address: u64) -> Option<AddressInfo> {
        if let Some(info) = self.young.get(&(lib, address)) {
            return Some(info.clone());
        }
        let info = self.old.remove(&(lib, address))?;
        self.young_bytes += size_of(&info);
        self.young.insert((lib, address), info.clone());
        Some(info)
    }

    fn name(
        &mut self,
        lib: &Lib,
        binary: &LibFile,
        addresses: &[u64],
        opts: &SymbolOptions,
    ) -> Named {
        if matches!(lib.kind, LibKind::PerfMap | LibKind::Pseudo) {
            self.last_named += addresses.len();
            return name_lib(lib, binary, addresses, opts);
        }
        let known = self.libs.get(lib).map(|(id, _)| *id);
        let mut infos: Vec<Option<AddressInfo>> = addresses
            .iter()
            .map(|&a| known.and_then(|id| self.recall(id, a)))
            .collect();
        let mut missing: Vec<u64> = addresses
            .iter()
            .zip(&infos)
            .filter(|(_, info)| info.is_none())
            .map(|(&a, _)| a)
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            self.last_named += missing.len();
            // A library that has no names now (its file gone, the naming stopped) may
            // have some in the next window: that is not kept.
            let (facts, named) = name_lib(lib, binary, &missing, opts)?;
            let next = self.libs.len() as LibId;
            let id = self.libs.entry(lib.clone()).or_insert((next, facts)).0;
            let found: HashMap<u64, AddressInfo> = missing.into_iter().zip(named).collect();
            for (info, address) in infos.iter_mut().zip(addresses) {
                if info.is_none() {
                    *info = found.get(address).cloned();
                }
            }
            for (address, info) in found {
                self.young_bytes += size_of(&info);
                self.young.insert((id, address), info);
            }
        }
        let facts = self
            .libs
            .get(lib)
            .map(|(_, f)| f.clone())
            .unwrap_or_default();
        Ok((
            facts,
            infos.into_iter().map(Option::unwrap_or_default).collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbolicate::Symbol;

    fn answer(name: &str) -> AddressInfo {
        AddressInfo {
            symbol: Some(Symbol {
                address: 0,
                size: None,
                name: name.to_string(),
            }),
            ..AddressInfo::default()
        }
    }

    #[test]
    fn answers_used_again_stay_and_the_rest_go_within_two_turns() {
        let mut memo = NameMemo::default();
        memo.young.insert((0, 1), answer("kept"));
        memo.young.insert((0, 2), answer("dropped"));
        // A turn: the young generation becomes the old one.
        memo.old = std::mem::take(&mut memo.young);
        assert_eq!(memo.recall(0, 1).unwrap().symbol.unwrap().name, "kept");
        assert!(memo.young.contains_key(&(0, 1)) && !memo.old.contains_key(&(0, 1)));
        assert!(memo.young_bytes >= "kept".len());
        // The next turn drops what was not used again.
        memo.old = std::mem::take(&mut memo.young);
        assert!(memo.recall(0, 2).is_none());
        assert!(memo.recall(0, 1).is_some());
        assert!(memo.recall(1, 1).is_none());
    }
}
