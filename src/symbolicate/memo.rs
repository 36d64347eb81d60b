//! What naming learned, kept across the windows of a continuous recording: each
//! library's answers by address, so that a window names only the addresses that no
//! window before it had. A machine's hot code is much the same from one window to the
//! next; after the first windows, naming one costs a few lookups (the symbol cache on
//! disk spares the next run the same work; this spares the next window).

use std::collections::HashMap;

use super::{name_lib, rebuild, AddressInfo, LibFacts, Named, SymbolOptions};
use crate::files::binary::LibFile;
use crate::profile::{Lib, LibKind, Profile, RawProfile};

/// The most addresses kept, over all libraries: 200,000 answers of some hundred bytes
/// each (a function name shared, an inline chain) are some 20–40 MB at worst; past it,
/// the memo starts afresh before the next window.
pub const MAX_MEMO_ADDRESSES: usize = 200_000;

/// Answers by library (as the profile builder interned it: one per mapped file, the
/// same in every window) and address.
#[derive(Default)]
pub struct NameMemo {
    libs: HashMap<Lib, (LibFacts, HashMap<u64, AddressInfo>)>,
    addresses: usize,
    /// Addresses named (not found in the memo) by the last call of [`Self::symbolicate`].
    pub last_named: usize,
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
        // Checked between windows only: within one, every answer is needed.
        if self.addresses > MAX_MEMO_ADDRESSES {
            self.libs.clear();
            self.addresses = 0;
        }
        let by_lib = rebuild::frames_by_lib(&raw);
        let named: Vec<Option<Named>> = by_lib
            .iter()
            .enumerate()
            .map(|(i, frames)| {
                let addresses = rebuild::addresses_of(&raw, frames);
                Some(self.name(&raw.libs[i], &lib_binaries[i], &addresses, opts))
            })
            .collect();
        rebuild::assemble(raw, &by_lib, named)
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
        let known = self.libs.get(lib);
        let mut missing: Vec<u64> = addresses
            .iter()
            .copied()
            .filter(|a| known.is_none_or(|(_, infos)| !infos.contains_key(a)))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            self.last_named += missing.len();
            // A library that has no names now (its file gone, the naming stopped) may
            // have some in the next window: that is not kept.
            let (facts, infos) = name_lib(lib, binary, &missing, opts)?;
            self.addresses += missing.len();
            let entry = self
                .libs
                .entry(lib.clone())
                .or_insert_with(|| (facts, HashMap::new()));
            entry.1.extend(missing.into_iter().zip(infos));
        }
        let (facts, infos) = &self.libs[lib];
        Ok((
            facts.clone(),
            addresses
                .iter()
                .map(|a| infos.get(a).cloned().unwrap_or_default())
                .collect(),
        ))
    }
}
