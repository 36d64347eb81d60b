//! Naming one library's addresses: from its ELF file's symbol tables, PLT stubs and
//! DWARF, and its separate debug file (found under the debug roots, else fetched), or
//! from the symbol cache when it holds every address's function; for a process's JIT
//! code, from its perf map and JIT dump. Everything here reads files; what the names
//! become in the profile is [`super::rebuild`]'s.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::{
    cache, cfi, plt, symbols, symtab, AddressInfo, DwarfInfo, EhFrameSource, FunctionRanges,
    LibFacts, Named, SourceFrame, Symbol, SymbolMap, SymbolOptions,
};
use crate::files::binary::Binary;
use crate::files::elf::Elf;
use crate::files::locate::{build_id_path, debug_file_at, find_debug_file, Candidate, DebugFile};
use crate::profile::Lib;

/// The symbol sources of one library.
#[derive(Default)]
pub struct LibSymbols {
    pub symbols: SymbolMap,
    pub dwarf: Option<DwarfInfo>,
    /// Added to a lib-relative address to get the address the tables use.
    pub base: u64,
    /// The separate debug file that was used, if any.
    pub debug_file: Option<PathBuf>,
    /// Why the library has no DWARF (no file/line, no inline frames), when it has none.
    pub no_debug_info: Option<String>,
    /// The file's `.eh_frame`, whose function ranges group code that no symbol names.
    pub eh_frame: Option<EhFrameSource>,
    /// Those ranges, read when the first address without a symbol needs them.
    pub functions: OnceLock<FunctionRanges>,
    /// When `symbols` holds only what some addresses need: the whole tables, whose
    /// names DWARF's linkage names are looked up in (indexed on first use).
    pub tables: Option<(symtab::Tables, Arc<OnceLock<symtab::NameIndex>>)>,
}

impl LibSymbols {
    /// Loads the symbols of an ELF file held in `data`, with nothing from elsewhere.
    pub fn from_elf(data: &[u8]) -> Option<LibSymbols> {
        let data: Arc<[u8]> = Arc::from(data);
        let elf = Elf::parse(&*data)?;
        let file = object::File::parse(&*data).ok()?;
        let (dwarf, no_debug_info) = match DwarfInfo::load(&elf, &data) {
            Ok(dwarf) => (Some(dwarf), None),
            Err(why) => (None, Some(why)),
        };
        let at = crate::files::image::At::of_bytes(data.clone());
        Some(LibSymbols {
            symbols: SymbolMap::from_elf_symbols(vec![symbols::with_plt(
                symbols::elf_symbols(&file),
                &elf,
                &at,
            )]),
            no_debug_info,
            dwarf,
            eh_frame: EhFrameSource::of(&elf, None, None),
            ..LibSymbols::default()
        })
    }

    /// Loads the symbols of `binary`, mapped from `mapped_path`: its own, and those of its
    /// separate debug file when it lacks DWARF or a full symbol table.
    pub fn load(binary: &Binary, mapped_path: &str, opts: &SymbolOptions) -> Option<LibSymbols> {
        LibSymbols::load_for(binary, mapped_path, opts, None, false)
    }

    /// [`LibSymbols::load`], keeping of the symbol tables only what looking up
    /// `addresses` needs, when they are given (see `symtab`): every other address may
    /// be named wrongly. Compressed DWARF is read from the cache's inflated copy when
    /// there is one; with `make_inflated`, one is made when there is none and read
    /// instead of the file (see [`cache::inflated`]).
    pub fn load_for(
        binary: &Binary,
        mapped_path: &str,
        opts: &SymbolOptions,
        addresses: Option<&[u64]>,
        make_inflated: bool,
    ) -> Option<LibSymbols> {
        // Only the parts that name things are read (symbol tables, DWARF), not its code;
        // what is kept is copied out of the reader, which goes at the end.
        let reader = binary.reader();
        let file = binary.elf(&reader)?;
        let (debug, rejected, not_fetched) = separate_debug_file(binary, mapped_path, opts);
        let debug_reader = debug.as_ref().map(|d| d.binary.reader());
        let debug_elf = debug
            .as_ref()
            .zip(debug_reader.as_ref())
            .and_then(|(d, reader)| d.binary.elf(reader));
        // The debug file's full symbol table first: of two names at one address, it has
        // the better one.
        let mut files: Vec<(&Binary, &Elf<'_, _>)> = Vec::new();
        if let (Some(d), Some(elf)) = (&debug, &debug_elf) {
            files.push((&d.binary, elf));
        }
        files.push((binary, &file));
        let tables =
            addresses
                .and_then(|_| symtab::Tables::of(&files))
                .map(|t| match &opts.scan_memo {
                    Some(memo) => t.memoized(memo),
                    None => t,
                });
        let mut symbols = match (&tables, addresses) {
            (Some(tables), Some(addresses)) => {
                let mut found = tables.symbols_for(addresses);
                found.extend(plt_symbols_for(binary, &file, tables, addresses));
                SymbolMap::from_preferred(found)
            }
            // Every symbol: through `object`, which reads the tables whole.
            _ => SymbolMap::from_elf_symbols(
                files
                    .iter()
                    .map(|(binary, elf)| {
                        // Read through a parse that checked the headers against
                        // what the file holds, whose sizes `object` reads by.
                        let reader = binary.reader();
                        let all = binary
                            .elf(&reader)
                            .and_then(|_| object::File::parse(&reader).ok())
                            .map(|f| symbols::elf_symbols(&f))
                            .unwrap_or_default();
                        symbols::with_plt(all, elf, &binary.at())
                    })
                    .collect(),
            ),
        };
        if let Some(stub) = &binary.entry_stub {
            symbols = symbols.or_named(stub.clone(), "_start");
        }
        let loaded = match (binary.has_dwarf, &debug, &debug_elf) {
            (false, Some(d), Some(elf)) => {
                load_dwarf(&d.binary, elf, opts, addresses, make_inflated)
            }
            _ => load_dwarf(binary, &file, opts, addresses, make_inflated),
        };
        let (dwarf, no_debug_info) = match loaded {
            Ok(dwarf) => (Some(dwarf), None),
            // DWARF that is there but cannot be used says so.
            Err(why) if binary.has_dwarf || debug.is_some() => (None, Some(why)),
            Err(_) => (
                None,
                Some(no_debug_file(
                    binary,
                    &rejected,
                    &opts.debug_roots,
                    not_fetched,
                )),
            ),
        };
        Some(LibSymbols {
            symbols,
            dwarf,
            base: 0,
            debug_file: debug.map(|d| d.path),
            no_debug_info,
            eh_frame: EhFrameSource::of(
                &file,
                binary
                    .unwind
                    .eh_frame
                    .as_ref()
                    .map(|(range, bytes)| (range.start, bytes.clone())),
                binary.unwind.lazy.as_ref(),
            ),
            functions: OnceLock::new(),
            tables: tables.map(|t| {
                let index = t.index_slot();
                (t, index)
            }),
        })
    }

    /// What the library says of itself as a whole.
    pub fn facts(&self) -> LibFacts {
        LibFacts {
            symbols_empty: self.symbols.is_empty(),
            no_debug_info: self.no_debug_info.clone(),
        }
    }

    /// Looks up a lib-relative address.
    pub fn lookup(&self, address: u64) -> AddressInfo {
        self.names().lookup(self.dwarf.as_ref(), address)
    }

    /// The function ranges of the file's `.eh_frame` (read on first use).
    pub fn functions(&self) -> &FunctionRanges {
        self.names().functions()
    }

    /// The parts of the library that name addresses apart from DWARF, which threads
    /// share (each has its own DWARF context).
    fn names(&self) -> Names<'_> {
        Names {
            symbols: &self.symbols,
            base: self.base,
            eh_frame: self.eh_frame.as_ref(),
            functions: &self.functions,
            tables: self.tables.as_ref().map(|(t, index)| (t, &**index)),
        }
    }

    /// Looks up many lib-relative addresses, in address order, split across the CPUs when
    /// there are enough of them: each thread gets a contiguous share of the addresses (so
    /// it parses only the compile units that cover them) and its own DWARF context.
    pub fn lookup_many(&self, addresses: &[u64]) -> Vec<AddressInfo> {
        let names = self.names();
        self.across_cpus(addresses, |share, dwarf, out| {
            for (&i, info) in share.iter().zip(out) {
                *info = names.lookup(dwarf, addresses[i]);
            }
        })
    }

    /// [`LibSymbols::lookup_many`], resolving the whole function of each address (see
    /// `Names::resolve`) and handing each function's pieces to `keep` (for the cache)
    /// as it is resolved. Split across the CPUs as `lookup_many` is.
    pub fn resolve_many(&self, addresses: &[u64], keep: &Keep<'_>) -> Vec<AddressInfo> {
        let names = self.names();
        // The addresses of one share, in address order, each function resolved once.
        self.across_cpus(addresses, |share, dwarf, out| {
            let mut function: Vec<(Range<u64>, AddressInfo)> = Vec::new();
            let mut demangled = cache::FastMap::default();
            for (&i, answer) in share.iter().zip(out) {
                let address = addresses[i];
                if piece_at(&function, address).is_none() {
                    if let Some(pieces) = names.resolve(dwarf, address, &mut demangled) {
                        keep(&pieces);
                        function = pieces;
                    }
                }
                *answer = piece_at(&function, address)
                    .cloned()
                    .unwrap_or_else(|| names.lookup(dwarf, address));
            }
        })
    }

    /// The answers for `addresses` that `per_share` writes, given shares of them
    /// (indexes, in address order), a DWARF context and where each answer goes (in the
    /// share's order): one share per CPU when there are enough addresses and every CPU
    /// gets its own context, else one share. The answers are written in address order
    /// into one list, then put in the order of `addresses` in place: a build's profile
    /// names some 30,000 addresses of rustc's libraries at a time, and a second list of
    /// answers would be 3 MB more at the peak.
    fn across_cpus(
        &self,
        addresses: &[u64],
        per_share: impl Fn(&[usize], Option<&DwarfInfo>, &mut [AddressInfo]) + Sync,
    ) -> Vec<AddressInfo> {
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(addresses.len() / ADDRESSES_PER_WORKER)
            .max(1);
        let mut order: Vec<usize> = (0..addresses.len()).collect();
        order.sort_unstable_by_key(|&i| addresses[i]);
        // The first share uses the library's own context; each other one a fork (each
        // holds every unit's abbreviations: about 15 MB for libc's debug file).
        let forks: Option<Vec<Option<DwarfInfo>>> = match &self.dwarf {
            Some(d) if workers > 1 => (1..workers).map(|_| d.fork().map(Some)).collect(),
            _ => None,
        };
        let mut sorted = vec![AddressInfo::default(); addresses.len()];
        match forks {
            None => per_share(&order, self.dwarf.as_ref(), &mut sorted),
            Some(forks) => {
                let size = addresses.len().div_ceil(workers);
                std::thread::scope(|scope| {
                    let mut shares = order.chunks(size).zip(sorted.chunks_mut(size));
                    let first = shares.next();
                    let handles: Vec<_> = shares
                        .zip(forks)
                        .map(|((share, out), dwarf)| {
                            let per_share = &per_share;
                            scope.spawn(move || per_share(share, dwarf.as_ref(), out))
                        })
                        .collect();
                    if let Some((share, out)) = first {
                        per_share(share, self.dwarf.as_ref(), out);
                    }
                    // A share whose thread failed keeps what it wrote (the rest unnamed).
                    for handle in handles {
                        let _ = handle.join();
                    }
                });
            }
        }
        // sorted[k] answers addresses[order[k]]: each answer is swapped to its place.
        for k in 0..sorted.len() {
            while order[k] != k {
                let to = order[k];
                sorted.swap(k, to);
                order.swap(k, to);
            }
        }
        sorted
    }
}

/// The separate debug file of `binary` (mapped from `mapped_path`), unless it has DWARF
/// and a full symbol table itself: under the debug roots, else fetched by build ID from
/// debuginfod; with the debug files found that did not match, and why debuginfod had
/// none.
fn separate_debug_file(
    binary: &Binary,
    mapped_path: &str,
    opts: &SymbolOptions,
) -> (Option<DebugFile>, Vec<PathBuf>, Option<String>) {
    let complete = binary.has_dwarf && binary.has_symtab;
    let (mut debug, rejected) = if complete {
        (None, Vec::new())
    } else {
        find_debug_file(binary, mapped_path, &opts.debug_roots)
    };
    // Fetched only when no root has it, and only by build ID.
    let mut not_fetched = None;
    if let (false, None, Some(client), Some(id)) =
        (complete, &debug, &opts.debuginfod, &binary.build_id)
    {
        match client.find(id, mapped_path) {
            Ok(path) => match debug_file_at(&path, binary, None) {
                Candidate::Matches(found) => debug = Some(*found),
                _ => not_fetched = Some(format!("{} cannot be read", path.display())),
            },
            Err(why) => not_fetched = Some(why),
        }
    }
    (debug, rejected, not_fetched)
}

/// What receives the pieces of each function [`LibSymbols::resolve_many`] resolves.
pub type Keep<'a> = dyn Fn(&[(Range<u64>, AddressInfo)]) + Sync + 'a;

/// The DWARF of `binary` (parsed as `elf`) for looking up `addresses`: from the
/// cache's inflated copy when its DWARF is compressed and there is one (made now with
/// `make_inflated`), else from the file.
fn load_dwarf<'d, R: object::ReadRef<'d>>(
    binary: &Binary,
    elf: &Elf<'d, R>,
    opts: &SymbolOptions,
    addresses: Option<&[u64]>,
    make_inflated: bool,
) -> Result<DwarfInfo, String> {
    let copyable = opts
        .cache
        .as_ref()
        .zip(binary.build_id.as_ref())
        .filter(|_| cache::inflated::is_compressed(elf));
    if let Some((store, build_id)) = copyable {
        let at = binary.at();
        let from_copy = store.with_inflated(build_id, &at, make_inflated, |copy, copy_at| {
            DwarfInfo::load_for(copy, copy_at, addresses).ok()
        });
        if let Some(loaded) = from_copy {
            return Ok(loaded);
        }
    }
    DwarfInfo::load_for(elf, &binary.at(), addresses)
}

/// Names `addresses` (lib-relative) of `binary`, mapped from `mapped_path`, and says what
/// the file lacks: from the cache when it holds every address's function, else from the
/// file and its debug information, whose functions are then added to the cache. `None`
/// when the file is not ELF.
pub fn name_file(
    binary: &Binary,
    mapped_path: &str,
    addresses: &[u64],
    opts: &SymbolOptions,
) -> Option<(LibFacts, Vec<AddressInfo>)> {
    let load = || {
        LibSymbols::load_for(binary, mapped_path, opts, Some(addresses), true)
            .ok_or_else(String::new)
    };
    let Some((store, key)) = opts
        .cache
        .as_ref()
        .and_then(|c| Some((c, cache::Key::of(binary)?)))
    else {
        let syms = load().ok()?;
        return Some((syms.facts(), syms.lookup_many(addresses)));
    };
    let source = cache::predict_source(binary, mapped_path, opts);
    let missing = source == Some(cache::DebugSource::Missing);
    let names_from = match &source {
        Some(cache::DebugSource::File { identity, .. }) => identity.size.max(key.size),
        _ => key.size,
    };
    let large = names_from >= LARGE_TO_NAME_BYTES;
    name_cached(store, &key, source, addresses, large, load, |mut facts| {
        // That message names the debug roots, which may be others now.
        if missing && !binary.has_dwarf && facts.no_debug_info.is_some() {
            facts.no_debug_info = Some(no_debug_file(binary, &[], &opts.debug_roots, None));
        }
        facts
    })
    .ok()
}

/// A library is large to name when the file its names come from (itself, or its
/// separate debug file) has at least this many bytes: 2 MiB, which libc's compressed
/// debug file (4 MB, 8.6 MB of DWARF inflated) and the programs of a build (cargo, cc1,
/// rust-lld) have, and most libraries have not.
const LARGE_TO_NAME_BYTES: u64 = 2 << 20;

/// Held while a large library (see [`LARGE_TO_NAME_BYTES`]) is named from its files:
/// the naming workers read one such library at a time. Each holds some megabytes while
/// it is read (its entry, its symbols and DWARF, what is resolved, the entry made);
/// libc's DWARF and cargo's symbols read at once took a build's peak memory from 25 to
/// 36 MB. Libraries named from the cache alone do not wait for it.
static NAMING_LARGE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Names `addresses` through the cache's entry of `key`, made from the debug
/// information `source` (`None`: which is not known without reading it, so the entry is
/// neither used nor written): from the entry when it holds every address's function
/// (its facts about the library adjusted by `cached_facts`), else from the symbols
/// `load` reads, whose functions are then added to the entry; one large library at a time (`large`, see
/// [`NAMING_LARGE`]).
pub(super) fn name_cached(
    store: &cache::SymbolCache,
    key: &cache::Key,
    source: Option<cache::DebugSource>,
    addresses: &[u64],
    large: bool,
    load: impl FnOnce() -> Result<LibSymbols, String>,
    cached_facts: impl FnOnce(LibFacts) -> LibFacts,
) -> Named {
    let entry = source
        .as_ref()
        .and_then(|source| store.load(key).filter(|e| e.source() == *source));
    let mut infos: Vec<Option<AddressInfo>> = addresses
        .iter()
        .map(|&a| entry.as_ref()?.lookup(a))
        .collect();
    let missing: Vec<usize> = (0..addresses.len())
        .filter(|&i| infos[i].is_none())
        .collect();
    if let (true, Some(entry)) = (missing.is_empty(), &entry) {
        let facts = cached_facts(entry.facts());
        return Ok((facts, infos.into_iter().flatten().collect()));
    }
    let _one_at_a_time = large.then(|| NAMING_LARGE.lock().unwrap_or_else(|e| e.into_inner()));
    // A signal may have stopped the naming while this worker waited.
    if let Some(signal) = crate::record::interrupt::stopped() {
        return Err(format!("not read: {signal} stopped the naming"));
    }
    let syms = load()?;
    let wanted: Vec<u64> = missing.iter().map(|&i| addresses[i]).collect();
    // The functions resolved go into the entry as they come, after those it held, unless
    // that is already half the bound: then this run's functions make a new one.
    let builder = std::sync::Mutex::new(match &entry {
        Some(old) if (old.byte_len() as u64) <= cache::MAX_ENTRY_BYTES / 2 => {
            cache::EntryBuilder::from_entry(old)
        }
        _ => cache::EntryBuilder::default(),
    });
    // The builder holds what the entry did: what is made from here on (a large library's
    // answers, then its new entry) does not sit beside it too.
    drop(entry);
    let keep = |pieces: &[(Range<u64>, AddressInfo)]| {
        let mut builder = builder.lock().unwrap_or_else(|e| e.into_inner());
        for (range, info) in pieces {
            builder.add(range.clone(), info);
        }
    };
    let found = syms.resolve_many(&wanted, &keep);
    for (&i, info) in missing.iter().zip(found) {
        infos[i] = Some(info);
    }
    let facts = syms.facts();
    // Kept only when the debug information used is the one predicted, which is what a
    // later run checks the entry against.
    let used = match &source {
        Some(cache::DebugSource::File { path, .. }) => syms.debug_file.as_ref() == Some(path),
        Some(_) => syms.debug_file.is_none(),
        None => false,
    };
    // Its symbols and DWARF go before the new entry is made.
    drop(syms);
    if let (true, Some(source)) = (used, &source) {
        let builder = builder.into_inner().unwrap_or_else(|e| e.into_inner());
        store.put(key, builder.finish(key, &facts, source));
    }
    Ok((
        facts,
        infos.into_iter().map(Option::unwrap_or_default).collect(),
    ))
}

/// Why a file has no DWARF when neither it nor a separate debug file has any:
/// `rejected` debug files that did not match, else the paths where one was looked for
/// (under `roots`), and why debuginfod had none (`not_fetched`).
fn no_debug_file(
    binary: &Binary,
    rejected: &[PathBuf],
    roots: &[PathBuf],
    not_fetched: Option<String>,
) -> String {
    if let Some(path) = rejected.first() {
        return format!("{} does not match the file (build ID)", path.display());
    }
    let Some(id) = &binary.build_id else {
        return "no DWARF, and no build ID to find a debug file by".to_string();
    };
    let paths: Vec<String> = roots
        .iter()
        .map(|root| build_id_path(root, id).display().to_string())
        .collect();
    let mut why = format!("no DWARF, and no debug file {}", paths.join(" or "));
    if let Some(fetch) = not_fetched {
        why = format!("{why}; {fetch}");
    }
    why
}

/// Below this many addresses per CPU, a second thread costs more (its own DWARF context
/// re-reads every unit's header and ranges) than it saves.
pub(super) const ADDRESSES_PER_WORKER: usize = 1000;

/// The PLT stubs' symbols of `file` when one of `addresses` is in a PLT (else none are
/// needed); the IFUNCs their `IRELATIVE` slots point at are named from `tables`.
fn plt_symbols_for<'d, R: object::ReadRef<'d>>(
    binary: &Binary,
    file: &Elf<'d, R>,
    tables: &symtab::Tables,
    addresses: &[u64],
) -> Vec<Symbol> {
    let in_plt = file
        .sections()
        .filter(|s| plt::is_plt_section(s.name))
        .any(|s| {
            let range = s.address()..s.address().saturating_add(s.size());
            addresses.iter().any(|a| range.contains(a))
        });
    if !in_plt {
        return Vec::new();
    }
    let mut sorted = addresses.to_vec();
    sorted.sort_unstable();
    plt::plt_symbols(file, &binary.at(), Some(&sorted), |asked| {
        tables.names_at(asked)
    })
}

/// See [`LibSymbols::names`].
#[derive(Clone, Copy)]
struct Names<'a> {
    symbols: &'a SymbolMap,
    base: u64,
    eh_frame: Option<&'a EhFrameSource>,
    functions: &'a OnceLock<FunctionRanges>,
    tables: Option<(&'a symtab::Tables, &'a OnceLock<symtab::NameIndex>)>,
}

impl<'a> Names<'a> {
    fn functions(self) -> &'a FunctionRanges {
        self.functions
            .get_or_init(|| self.eh_frame.map(FunctionRanges::read).unwrap_or_default())
    }

    /// What the symbols, `dwarf` (the library's, or a fork of it) and, where neither
    /// names the address, the `.eh_frame` function ranges say about a lib-relative
    /// address.
    fn lookup(&self, dwarf: Option<&DwarfInfo>, address: u64) -> AddressInfo {
        let probe = address.wrapping_add(self.base);
        let frames: Vec<SourceFrame> = dwarf.map(|d| d.frames(probe)).unwrap_or_default();
        self.info(probe, frames, &mut |s| self.symbols.display_name(s))
    }

    /// What is known of `probe` (in the tables' addresses), given its DWARF `frames`;
    /// `display` names a symbol as profiles show it.
    fn info(
        &self,
        probe: u64,
        frames: Vec<SourceFrame>,
        display: &mut dyn FnMut(&Symbol) -> String,
    ) -> AddressInfo {
        let (symbols, base) = (&self.symbols, self.base);
        let mut symbol = symbols.lookup_stored(probe).map(|s| Symbol {
            address: s.address.wrapping_sub(base),
            // DWARF usually has the outer function under the same linkage name, already
            // demangled.
            name: match frames.first() {
                Some(f) if f.linkage_name.as_deref() == Some(s.name.as_str()) => f.function.clone(),
                _ => display(s),
            },
            size: s.size,
        });
        let unnamed = symbol.is_none() && frames.is_empty();
        if unnamed {
            symbol = self.functions().containing(probe).map(|range| Symbol {
                address: range.start.wrapping_sub(base),
                size: Some(range.end - range.start),
                name: cfi::unnamed_function(range.start),
            });
        }
        let frame_symbols = frames
            .iter()
            .map(|f| {
                let name = f.linkage_name.as_deref()?;
                let address = match self.tables {
                    Some((tables, index)) => index.get_or_init(|| tables.index()).address(name),
                    None => symbols.by_name(name).map(|s| s.address),
                };
                address.map(|a| a.wrapping_sub(base))
            })
            .collect();
        AddressInfo {
            unnamed: unnamed && symbol.is_some(),
            symbol,
            frames,
            frame_symbols,
        }
    }

    /// The whole function around a lib-relative `address`, as lib-relative pieces with
    /// what is known of their addresses (each piece the same throughout, and the same as
    /// [`Names::lookup`] gives for any of them): the addresses the symbol lookup gives
    /// the same symbol for (for code without one, those of its `.eh_frame` function),
    /// cut where DWARF's line rows and inlined calls change. `None` when that is too
    /// much to keep: then only the address is looked up. `demangled` keeps names
    /// demangled before (each function repeats the same few).
    fn resolve(
        &self,
        dwarf: Option<&DwarfInfo>,
        address: u64,
        demangled: &mut cache::FastMap<String, String>,
    ) -> Option<Vec<(Range<u64>, AddressInfo)>> {
        let probe = address.wrapping_add(self.base);
        let mut extent = self.symbols.extent(probe);
        let stored = self.symbols.lookup_stored(probe);
        if stored.is_none() {
            let function = self.functions().extent(probe);
            extent = extent.start.max(function.start)..extent.end.min(function.end);
        }
        if extent.end - extent.start > MAX_FUNCTION_BYTES {
            let window = probe & !(WINDOW_BYTES - 1);
            extent = extent.start.max(window)..extent.end.min(window.saturating_add(WINDOW_BYTES));
        }
        // Pieces are cut in the tables' addresses and kept lib-relative: both must hold
        // the whole extent.
        extent.start.checked_sub(self.base)?;
        extent.end.checked_sub(self.base)?;
        let mut demangle = |name: &str| match demangled.get(name) {
            Some(d) => d.clone(),
            None => {
                let d = symbols::demangle(name);
                demangled.insert(name.to_string(), d.clone());
                d
            }
        };
        let pieces = match dwarf {
            Some(d) => d.pieces(extent.clone(), MAX_PIECES, &mut demangle)?,
            None => vec![(extent, Vec::new())],
        };
        // The symbol is the same throughout, so its name is made once.
        let name = stored.map(|s| self.symbols.display_name(s));
        let mut out: Vec<(Range<u64>, AddressInfo)> = Vec::new();
        for (range, frames) in pieces {
            let info = self.info(range.start, frames, &mut |s| {
                name.clone().unwrap_or_else(|| self.symbols.display_name(s))
            });
            let range = range.start - self.base..range.end - self.base;
            match out.last_mut() {
                Some((last, same)) if *same == info && last.end == range.start => {
                    last.end = range.end
                }
                _ => out.push((range, info)),
            }
        }
        Some(out)
    }
}

/// A function larger than this (1 MiB; the largest real ones, interpreters' dispatch
/// loops, are a few hundred KiB) is a symbol that is not one function (a label in
/// assembly code, the last symbol before a long unnamed stretch): it is resolved in
/// windows of [`WINDOW_BYTES`] around the addresses that need it.
const MAX_FUNCTION_BYTES: u64 = 1 << 20;
/// 64 KiB: a few functions' worth of code, aligned, so that nearby addresses share one.
const WINDOW_BYTES: u64 = 1 << 16;
/// The most pieces one function is cut into: a line row every few bytes of a 1 MiB
/// function is about this many; more would be a damaged or hostile file.
const MAX_PIECES: usize = 1 << 18;

/// The piece of `pieces` (sorted, disjoint) that holds `address`.
fn piece_at(pieces: &[(Range<u64>, AddressInfo)], address: u64) -> Option<&AddressInfo> {
    let i = pieces.partition_point(|(r, _)| r.start <= address);
    let (range, info) = pieces.get(i.checked_sub(1)?)?;
    range.contains(&address).then_some(info)
}

/// The most of a perf map that is read: a line of about a hundred bytes per piece of JIT
/// code makes this over a million pieces, far more than even a long-running JIT's; the
/// text and the names made of it are held at once (about three times this), as root
/// too. The rest of a larger map is left out, with a line that says so.
const MAX_PERF_MAP_BYTES: u64 = 128 << 20;

/// The symbols of the JIT code of one process, `lib` (its perf map's path): its perf map
/// and its JIT dump, each read only when written by the process's user (or root).
pub(super) fn load_perf_map(lib: &Lib, opts: &SymbolOptions) -> Result<LibSymbols, String> {
    // The name is predictable and /tmp anyone's: only a map the process's user
    // (or root) wrote, under that one name, holding its bytes, is read.
    let user = opts.jit_users.get(&lib.path).copied();
    let path = Path::new(&lib.path);
    let (mut entries, ignored) =
        match crate::files::locate::read_written_by(path, 0, MAX_PERF_MAP_BYTES, user) {
            Ok(Some((text, len))) => {
                if len > MAX_PERF_MAP_BYTES {
                    crate::say!(
                        "sampler: {}: only its first {MAX_PERF_MAP_BYTES} bytes of {len} are read",
                        lib.path
                    );
                }
                let text = String::from_utf8_lossy(&text);
                (Some(symbols::perf_map_entries(&text)), None)
            }
            Ok(None) => (None, None),
            Err(why) => (None, Some(why)),
        };
    let dump = opts.jit_dumps.get(&lib.path);
    if let Some(path) = dump {
        let read = crate::files::jitdump::read_from(path, 0, user);
        match read.and_then(|data| crate::files::jitdump::parse(&data)) {
            Ok(loads) => entries
                .get_or_insert_with(Vec::new)
                .extend(loads.into_iter().map(|load| Symbol {
                    address: load.address,
                    size: load.size,
                    name: load.name,
                })),
            Err(e) if entries.is_none() => {
                return Err(format!(
                    "JIT code, but its dump {} is unusable: {e}",
                    path.display()
                ))
            }
            Err(_) => {}
        }
    }
    if let (Some(why), Some(_)) = (&ignored, &entries) {
        crate::say!("sampler: {} is ignored: {why}", lib.path);
    }
    let entries = entries.ok_or_else(|| match ignored {
        Some(why) => format!("JIT code, but {} is ignored: {why}", lib.path),
        None => format!("JIT code, but no {} was written", lib.path),
    })?;
    Ok(LibSymbols {
        symbols: SymbolMap::from_written(entries),
        ..LibSymbols::default()
    })
}
