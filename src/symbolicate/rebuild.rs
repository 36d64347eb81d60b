//! Rebuilding the profile's tables with names: the raw profile's address frames, given
//! what is known of each address, become funcs, native symbols and frames (an address
//! with inlined calls one frame per inline depth, outer first), and its stacks are
//! rebuilt on them, prefixes first. Pure: it reads no file, and what it makes depends
//! only on the raw profile and the answers.

use std::collections::HashMap;

use super::{AddressInfo, LibFacts, Named, KERNEL_PREFIX};
use crate::profile::*;
use crate::profile::{marker_name, VDSO_NAME};

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

    /// Appends to `out` the frames (outer first) of one raw address frame.
    fn expand(&mut self, raw: &AddressFrame, info: Option<AddressInfo>, out: &mut Vec<FrameIndex>) {
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
            let name = marker_name(raw.address);
            let func = self.func(FuncKey::Named(None, name.into(), None), || Func {
                name: name.into(),
                file: None,
                lib: None,
            });
            out.push(self.frames.intern(plain(func, None), FrameIndex::new));
            return;
        }
        let info = info.unwrap_or_default();
        let (Some(lib), Some(symbol)) = (raw.lib, info.symbol.as_ref()) else {
            // No symbol: name the frame after the DWARF function if there is one, else
            // after the address.
            let outer = info.frames.first();
            let name = match info.function_names().first() {
                Some(name) => name.to_string(),
                None if raw.kind == CodeKind::Kernel => {
                    format!("{KERNEL_PREFIX}0x{:x}", raw.address)
                }
                None => format!("0x{:x}", raw.address),
            };
            let file = outer.and_then(|f| f.file.clone());
            let func = self.func(FuncKey::Named(raw.lib, name.clone(), file.clone()), || {
                Func {
                    name,
                    file,
                    lib: raw.lib,
                }
            });
            out.push(
                self.frames
                    .intern(plain(func, outer.and_then(|f| f.line)), FrameIndex::new),
            );
            return;
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
    }
}

/// The unique addresses of each library: for each library index, the indexes of its
/// address frames in `raw`.
pub(super) fn frames_by_lib(raw: &RawProfile) -> Vec<Vec<usize>> {
    let mut by_lib: Vec<Vec<usize>> = vec![Vec::new(); raw.libs.len()];
    for (i, af) in raw.address_frames.iter().enumerate() {
        if let Some(frames) = af.lib.and_then(|lib| by_lib.get_mut(lib.index())) {
            frames.push(i);
        }
    }
    by_lib
}

/// The lib-relative addresses of `frames` (indexes of address frames of `raw`).
pub(super) fn addresses_of(raw: &RawProfile, frames: &[usize]) -> Vec<u64> {
    frames
        .iter()
        .map(|&i| raw.address_frames[i].address)
        .collect()
}

/// The final profile, given what naming each library gave (`None`: it was not loaded).
pub(super) fn assemble(
    raw: RawProfile,
    by_lib: &[Vec<usize>],
    named: Vec<Option<Named>>,
) -> Profile {
    // Each unique address was looked up once, a library's addresses together: address
    // frame `i`'s answer is `found[lib][k]` for `(lib, k) = place[i]`, taken out of that
    // list as the frame is expanded (a second list of every answer, in frame order,
    // would be 4 MB more at the peak of naming a build).
    let mut place: Vec<Option<(u32, u32)>> = vec![None; raw.address_frames.len()];
    let mut found: Vec<Vec<AddressInfo>> = Vec::with_capacity(named.len());
    let mut lib_facts: Vec<Option<Result<LibFacts, String>>> = Vec::with_capacity(named.len());
    for (lib, (frames, named)) in by_lib.iter().zip(named).enumerate() {
        let (facts, answers) = match named {
            Some(Ok((facts, answers))) => (Some(Ok(facts)), answers),
            Some(Err(why)) => (Some(Err(why)), Vec::new()),
            None => (None, Vec::new()),
        };
        for (k, &i) in frames.iter().enumerate().take(answers.len()) {
            place[i] = Some((lib as u32, k as u32));
        }
        lib_facts.push(facts);
        found.push(answers);
    }
    let mut tables = Tables::default();
    let mut unnamed: Vec<LibIndex> = Vec::new();
    let mut sampled: Vec<LibIndex> = Vec::new();
    // The frames of address frame `i` are `expanded[expanded_at[i]..expanded_at[i + 1]]`.
    let mut expanded: Vec<FrameIndex> = Vec::with_capacity(raw.address_frames.len());
    let mut expanded_at: Vec<usize> = Vec::with_capacity(raw.address_frames.len() + 1);
    expanded_at.push(0);
    for (af, place) in raw.address_frames.iter().zip(place) {
        let info = place.map(|(lib, k)| std::mem::take(&mut found[lib as usize][k as usize]));
        if let (Some(lib), CodeKind::User | CodeKind::Kernel) = (af.lib, af.kind) {
            if !sampled.contains(&lib) {
                sampled.push(lib);
            }
            if info
                .as_ref()
                .is_none_or(|i| i.symbol.is_none() || i.unnamed)
                && !unnamed.contains(&lib)
            {
                unnamed.push(lib);
            }
        }
        tables.expand(af, info, &mut expanded);
        expanded_at.push(expanded.len());
    }
    drop(found);
    let symbol_gaps = sampled
        .into_iter()
        .filter_map(|lib| {
            let syms = lib_facts.get(lib.index()).and_then(Option::as_ref);
            symbol_gap(lib, syms, unnamed.contains(&lib), &raw.libs)
        })
        .collect();
    let mut stacks: Interner<Stack, StackIndex> = Interner::default();
    let mut stack_map: Vec<StackIndex> = Vec::with_capacity(raw.stacks.len());
    for rs in &raw.stacks {
        // Prefixes come first, so the prefix is already mapped.
        let mut prefix = rs.prefix.map(|p| stack_map[p.index()]);
        let i = rs.frame.index();
        for &frame in &expanded[expanded_at[i]..expanded_at[i + 1]] {
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
        symbol_gaps,
        sources: Default::default(),
    }
}

/// What `lib` of `libs` lacks, if anything the profile should list: names, when some of
/// its sampled addresses are `unnamed`, or debug information; `syms` is what naming it
/// said of it as a whole (`None`: it was not loaded).
fn symbol_gap(
    lib: LibIndex,
    syms: Option<&Result<LibFacts, String>>,
    unnamed: bool,
    libs: &[Lib],
) -> Option<SymbolGap> {
    let (missing, why) = if unnamed {
        let why = match syms {
            Some(Err(why)) => why.clone(),
            Some(Ok(s)) => {
                let what = if s.symbols_empty {
                    "no symbol table"
                } else if s.no_debug_info.is_some() {
                    "only exported symbols"
                } else {
                    "addresses outside every symbol"
                };
                match &s.no_debug_info {
                    Some(why) => format!("{what}; {why}"),
                    None => what.to_string(),
                }
            }
            None => "not loaded".to_string(),
        };
        (Missing::Symbols, why)
    } else {
        let Some(Ok(LibFacts {
            no_debug_info: Some(why),
            ..
        })) = syms
        else {
            return None;
        };
        // The vdso's few clock functions have no source anyone would install
        // for; saying so on every run would only be noise.
        let lib_info = &libs[lib.index()];
        if lib_info.kind != LibKind::File || lib_info.name == VDSO_NAME {
            return None;
        }
        (Missing::DebugInfo, why.clone())
    };
    Some(SymbolGap { lib, missing, why })
}
