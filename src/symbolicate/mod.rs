//! Symbolication: names every unique (library, address) of a [`RawProfile`] once, and
//! produces the final [`Profile`], in which one address with inlined calls becomes one
//! frame per inline depth (outer first, sharing the outer function's native symbol).
//!
//! Sources, per kind of library: the mapped ELF file (`.symtab`, `.dynsym`, DWARF) and its
//! separate debug file (found by [`crate::locate::find_debug_file`] under the debug roots,
//! else fetched by [`crate::debuginfod`]); `/proc/kallsyms`
//! for the kernel, whose frames are named `[kernel] name`; `/tmp/perf-PID.map` for a
//! process's JIT code. Code that no symbol names is named after the start of its function
//! as the file's `.eh_frame` gives it (`fn_0x4a2c0`), else after its address (`0x…`), and
//! its library is listed in [`Profile::symbol_gaps`] with the reason; nothing here fails
//! the run.

pub mod cache;
mod cfi;
mod dwarf;
mod gcc_names;
mod plt;
mod symbol;
pub mod symbols;
mod symtab;

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::binary::Binary;
use crate::debuginfod;
use crate::elf::Elf;
pub use crate::locate::DEFAULT_DEBUG_ROOT;
use crate::locate::{build_id_path, debug_file_at, find_debug_file, Candidate};
use crate::profile::*;
use crate::profile::{marker_name, VDSO_NAME};
use crate::replay::LibFile;
pub use cfi::{EhFrameBytes, EhFrameSource, FunctionRanges, UNNAMED_PREFIX};
pub use dwarf::{DwarfInfo, SourceFrame};
pub use plt::{PLT_NAME, PLT_SUFFIX};
pub use symbols::{demangle, Kallsyms, Symbol, SymbolMap};

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
    /// The symbol is not from a symbol table: no name covers the address, and `symbol`
    /// is the function range `.eh_frame` gives for it, named after its start (`fn_0x…`).
    pub unnamed: bool,
}

impl AddressInfo {
    /// The function of each inline depth, outer first, as profiles name them: the outer
    /// one by its symbol (of aliases at one address, the one the symbol table prefers;
    /// DWARF would give an internal alias such as `__GI___libc_free` for `free`), the
    /// inlined ones as DWARF names them. Empty when neither knows the address.
    pub fn function_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.frames.iter().map(|f| f.function.as_str()).collect();
        match (&self.symbol, names.first_mut()) {
            (Some(symbol), Some(outer)) => *outer = &symbol.name,
            (Some(symbol), None) => names.push(&symbol.name),
            (None, _) => {}
        }
        names
    }
}

/// Where symbolication looks for what files do not carry themselves.
#[derive(Clone, Debug)]
pub struct SymbolOptions {
    /// The roots of separate debug files (`.build-id/xx/rest.debug`, and debuglink
    /// paths), searched in order.
    pub debug_roots: Vec<PathBuf>,
    /// Where debug files found under no root are fetched from, if anywhere.
    pub debuginfod: Option<Arc<debuginfod::Client>>,
    /// The kernel's symbols ([`read_kallsyms`], read once), for kernel frames.
    pub kernel: Option<Kallsyms>,
    /// Without `kernel`: read them from `/proc/kallsyms` when kernel frames need them
    /// (not when the cache names every one).
    pub read_kallsyms: bool,
    /// The JIT dump each process wrote, by the path of its perf map (the library its JIT
    /// code is in).
    pub jit_dumps: HashMap<String, PathBuf>,
    /// The user each JIT process ran as, by the path of its perf map: the owner its perf
    /// map and dump must have (or root) to be read. A process not listed was not seen
    /// running: only root's files are read for it.
    pub jit_users: HashMap<String, u32>,
    /// Where what was learned about files is kept between runs, if anywhere.
    pub cache: Option<Arc<cache::SymbolCache>>,
}

impl Default for SymbolOptions {
    fn default() -> Self {
        SymbolOptions {
            debug_roots: debug_roots(&[]),
            debuginfod: None,
            kernel: None,
            read_kallsyms: false,
            jit_dumps: HashMap::new(),
            jit_users: HashMap::new(),
            cache: None,
        }
    }
}

/// The debug roots searched: the user's, in the order given, then [`DEFAULT_DEBUG_ROOT`]
/// (unless the user named it already).
pub fn debug_roots(given: &[PathBuf]) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for root in given
        .iter()
        .cloned()
        .chain([PathBuf::from(DEFAULT_DEBUG_ROOT)])
    {
        if !roots.contains(&root) {
            roots.push(root);
        }
    }
    roots
}

/// What symbolication says about a library as a whole, for the list of libraries that
/// lack names or debug information.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LibFacts {
    /// It has no symbol table at all.
    pub symbols_empty: bool,
    /// Why it has no DWARF, when it has none.
    pub no_debug_info: Option<String>,
}

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
    pub tables: Option<(symtab::Tables, OnceLock<symtab::NameIndex>)>,
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
        let at = crate::binary::At::of_bytes(data.clone());
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
        LibSymbols::load_for(binary, mapped_path, opts, None)
    }

    /// [`LibSymbols::load`], keeping of the symbol tables only what looking up
    /// `addresses` needs, when they are given (see `symtab`): every other address may
    /// be named wrongly.
    pub fn load_for(
        binary: &Binary,
        mapped_path: &str,
        opts: &SymbolOptions,
        addresses: Option<&[u64]>,
    ) -> Option<LibSymbols> {
        // Only the parts that name things are read (symbol tables, DWARF), not its code;
        // what is kept is copied out of the reader, which goes at the end.
        let reader = binary.reader();
        let file = binary.elf(&reader)?;
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
        let tables = addresses.and_then(|_| symtab::Tables::of(&files));
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
            (false, Some(d), Some(elf)) => DwarfInfo::load_for(elf, &d.binary.at(), addresses),
            _ => DwarfInfo::load_for(&file, &binary.at(), addresses),
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
            tables: tables.map(|t| (t, OnceLock::new())),
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
            tables: self.tables.as_ref().map(|(t, index)| (t, index)),
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

/// What receives the pieces of each function [`LibSymbols::resolve_many`] resolves.
pub type Keep<'a> = dyn Fn(&[(Range<u64>, AddressInfo)]) + Sync + 'a;

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
    let load =
        || LibSymbols::load_for(binary, mapped_path, opts, Some(addresses)).ok_or_else(String::new);
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
    name_cached(store, &key, source, addresses, load, |mut facts| {
        // That message names the debug roots, which may be others now.
        if missing && !binary.has_dwarf && facts.no_debug_info.is_some() {
            facts.no_debug_info = Some(no_debug_file(binary, &[], &opts.debug_roots, None));
        }
        facts
    })
    .ok()
}

/// Names `addresses` through the cache's entry of `key`, made from the debug
/// information `source` (`None`: which is not known without reading it, so the entry is
/// neither used nor written): from the entry when it holds every address's function
/// (its facts about the library adjusted by `cached_facts`), else from the symbols
/// `load` reads, whose functions are then added to the entry.
fn name_cached(
    store: &cache::SymbolCache,
    key: &cache::Key,
    source: Option<cache::DebugSource>,
    addresses: &[u64],
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
const ADDRESSES_PER_WORKER: usize = 1000;

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
    plt::plt_symbols(file, &binary.at(), |asked| tables.names_at(asked))
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
fn frames_by_lib(raw: &RawProfile) -> Vec<Vec<usize>> {
    let mut by_lib: Vec<Vec<usize>> = vec![Vec::new(); raw.libs.len()];
    for (i, af) in raw.address_frames.iter().enumerate() {
        if let Some(frames) = af.lib.and_then(|lib| by_lib.get_mut(lib.index())) {
            frames.push(i);
        }
    }
    by_lib
}

/// The lib-relative addresses of `frames` (indexes of address frames of `raw`).
fn addresses_of(raw: &RawProfile, frames: &[usize]) -> Vec<u64> {
    frames
        .iter()
        .map(|&i| raw.address_frames[i].address)
        .collect()
}

/// What naming one library gave: what it says of itself, and what is known of each of
/// its addresses (in the order of [`frames_by_lib`]); or why it has no names.
type Named = Result<(LibFacts, Vec<AddressInfo>), String>;

/// Turns a raw profile into the final one, given the symbols of each library (or why a
/// library has none).
pub fn apply(raw: RawProfile, lib_symbols: &[Result<LibSymbols, String>]) -> Profile {
    let by_lib = frames_by_lib(&raw);
    let named: Vec<Option<Named>> = by_lib
        .iter()
        .enumerate()
        .map(|(lib, frames)| {
            let named = match lib_symbols.get(lib)? {
                Ok(syms) => Ok((syms.facts(), syms.lookup_many(&addresses_of(&raw, frames)))),
                Err(why) => Err(why.clone()),
            };
            Some(named)
        })
        .collect();
    assemble(raw, &by_lib, named)
}

/// The final profile, given what naming each library gave (`None`: it was not loaded).
fn assemble(raw: RawProfile, by_lib: &[Vec<usize>], named: Vec<Option<Named>>) -> Profile {
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
            let (missing, why) = if unnamed.contains(&lib) {
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
                let lib_info = &raw.libs[lib.index()];
                if lib_info.kind != LibKind::File || lib_info.name == VDSO_NAME {
                    return None;
                }
                (Missing::DebugInfo, why.clone())
            };
            Some(SymbolGap { lib, missing, why })
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
    }
}

/// Kernel functions are named `[kernel] name`, so they stand out wherever names are
/// shown without their library (terminal, folded stacks).
pub const KERNEL_PREFIX: &str = "[kernel] ";

/// Where the kernel's text starts (`_text`), which places kernel frames, without
/// reading all of `/proc/kallsyms` when its first lines say (they do: the kernel lists
/// its own symbols first, in address order); else read whole, and then its symbols
/// come too. `(None, None)` when the addresses are hidden.
pub fn kernel_base() -> (Option<u64>, Option<Kallsyms>) {
    use std::io::BufRead;
    let head = std::fs::File::open("/proc/kallsyms").ok().and_then(|file| {
        std::io::BufReader::new(file)
            .lines()
            .take(KALLSYMS_HEAD_LINES)
            .map_while(Result::ok)
            .find_map(|line| match symbols::kallsyms_line(&line) {
                Some((address, "T" | "t", "_text")) => Some(address),
                _ => None,
            })
            .filter(|&address| address != 0)
    });
    if head.is_some() {
        return (head, None);
    }
    let kallsyms = read_kallsyms();
    (kallsyms.as_ref().map(|k| k.text_start), kallsyms)
}

/// How many lines of `/proc/kallsyms` are looked through for `_text`: it is within the
/// first few (after the per-CPU variables, a few hundred, on kernels that list them).
const KALLSYMS_HEAD_LINES: usize = 4096;

/// Reads the kernel's symbols from `/proc/kallsyms`, named `[kernel] name`; `None` when
/// they are hidden.
pub fn read_kallsyms() -> Option<Kallsyms> {
    Kallsyms::parse(
        &std::fs::read_to_string("/proc/kallsyms").ok()?,
        KERNEL_PREFIX,
    )
}

/// Loads the symbols of every library of `raw` from the files the profile builder
/// verified (`lib_binaries`, parallel to `raw.libs`), and symbolicates; kernel frames
/// with `opts.kernel`. A library with enough addresses to be looked up on every CPU (see
/// [`LibSymbols::lookup_many`]) is named alone, one after the other: two of them at a
/// time would only share the CPUs, and hold both files' symbols and answers at once
/// (rustc's two large libraries in a build: the difference between below perf's peak
/// memory and 10 MB above it). The others are named in parallel, one worker per CPU.
pub fn symbolicate(raw: RawProfile, lib_binaries: &[LibFile], opts: &SymbolOptions) -> Profile {
    let n = raw.libs.len();
    let by_lib = frames_by_lib(&raw);
    let cpus = std::thread::available_parallelism().map_or(1, |w| w.get());
    let name = |i: usize| {
        let addresses = addresses_of(&raw, &by_lib[i]);
        name_lib(&raw.libs[i], &lib_binaries[i], &addresses, opts)
    };
    let mut named: Vec<Option<Named>> = (0..n).map(|_| None).collect();
    let (large, small): (Vec<usize>, Vec<usize>) =
        (0..n).partition(|&i| cpus > 1 && by_lib[i].len() >= 2 * ADDRESSES_PER_WORKER);
    for &i in &large {
        named[i] = Some(name(i));
    }
    let workers = cpus.clamp(1, small.len().max(1));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (small, name) = (&small, &name);
                scope.spawn(move || {
                    small
                        .iter()
                        .skip(w)
                        .step_by(workers)
                        .map(|&i| (i, name(i)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for handle in handles {
            for (i, result) in handle.join().unwrap_or_default() {
                named[i] = Some(result);
            }
        }
    });
    let named = named
        .into_iter()
        .map(|l| Some(l.unwrap_or_else(|| Err("reading it failed".into()))))
        .collect();
    assemble(raw, &by_lib, named)
}

/// The file behind a library, or why it is not read: none was found, or its headers
/// claim more than it holds.
fn readable(binary: &LibFile) -> Result<&Binary, String> {
    let binary = binary.as_ref().map_err(String::clone)?;
    match &binary.damaged {
        Some(why) => Err(format!("not read: {why}")),
        None => Ok(binary),
    }
}

/// Names the `addresses` of one library (through the cache for files and the kernel), or
/// says why it has no names.
fn name_lib(lib: &Lib, binary: &LibFile, addresses: &[u64], opts: &SymbolOptions) -> Named {
    // A library mapped but never sampled is named nowhere, and what it lacks is not
    // reported: nothing of it is read.
    if addresses.is_empty() {
        return Ok((LibFacts::default(), Vec::new()));
    }
    if let Some(signal) = crate::interrupt::stopped() {
        return Err(format!("not read: {signal} stopped the naming"));
    }
    match lib.kind {
        LibKind::File => {
            let binary = readable(binary)?;
            name_file(binary, &lib.path, addresses, opts).ok_or_else(|| "not an ELF file".into())
        }
        LibKind::Kernel => name_kernel(lib.base, addresses, opts),
        _ => {
            let syms = load_lib(lib, binary, opts)?;
            Ok((syms.facts(), syms.lookup_many(addresses)))
        }
    }
}

/// Names the `addresses` of the kernel, whose text starts at `base` (they are relative
/// to it). Its own functions are the same for every run of one boot, and reading
/// `/proc/kallsyms` takes longer than anything else sampler does after a short
/// recording, so the cache holds every one of them, from the first run that needed it,
/// in pieces of [`KERNEL_PIECE_BYTES`] of its text: a run loads the pieces its addresses
/// lie in, one at a time (all of them would be 10–15 MB). The code of modules, BPF
/// programs and trampolines, which come and go, is looked up anew.
fn name_kernel(base: u64, addresses: &[u64], opts: &SymbolOptions) -> Named {
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
    let kallsyms = match &opts.kernel {
        Some(kernel) => Some(kernel.clone()),
        None if opts.read_kallsyms => read_kallsyms(),
        None => None,
    }
    .ok_or("/proc/kallsyms hides addresses (kernel.kptr_restrict; run as root)")?;
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

/// The most of a perf map that is read: a line of about a hundred bytes per piece of JIT
/// code makes this over a million pieces, far more than even a long-running JIT's; the
/// text and the names made of it are held at once (about three times this), as root
/// too. The rest of a larger map is left out, with a line that says so.
const MAX_PERF_MAP_BYTES: u64 = 128 << 20;

/// The symbols of one library, or why there are none.
fn load_lib(lib: &Lib, binary: &LibFile, opts: &SymbolOptions) -> Result<LibSymbols, String> {
    match lib.kind {
        LibKind::File => {
            let binary = readable(binary)?;
            LibSymbols::load(binary, &lib.path, opts).ok_or_else(|| "not an ELF file".into())
        }
        LibKind::Kernel => Ok(LibSymbols {
            symbols: match &opts.kernel {
                Some(kernel) => Some(kernel.map.clone()),
                None if opts.read_kallsyms => read_kallsyms().map(|k| k.map),
                None => None,
            }
            .ok_or("/proc/kallsyms hides addresses (kernel.kptr_restrict; run as root)")?,
            base: lib.base,
            ..LibSymbols::default()
        }),
        LibKind::PerfMap => {
            // The name is predictable and /tmp anyone's: only a map the process's user
            // (or root) wrote, under that one name, holding its bytes, is read.
            let user = opts.jit_users.get(&lib.path).copied();
            let path = Path::new(&lib.path);
            let (mut entries, ignored) = match crate::locate::read_written_by(
                path,
                0,
                MAX_PERF_MAP_BYTES,
                user,
            ) {
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
                let read = crate::jitdump::read_from(path, 0, user);
                match read.and_then(|data| crate::jitdump::parse(&data)) {
                    Ok(loads) => entries.get_or_insert_with(Vec::new).extend(loads),
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
        LibKind::Pseudo => Err("no file behind it".into()),
    }
}

#[cfg(test)]
mod kernel_tests {
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
        let root = crate::testdir::TestDir::new("kernel");
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
