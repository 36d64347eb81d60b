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

mod cfi;
mod dwarf;
mod gcc_names;
mod plt;
pub mod symbols;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::binary::Binary;
use crate::debuginfod;
pub use crate::locate::DEFAULT_DEBUG_ROOT;
use crate::locate::{build_id_path, debug_file_at, find_debug_file, Candidate};
use crate::profile::*;
use crate::profile::{TRUNCATED_MARKER, VDSO_NAME};
use crate::replay::LibFile;
use cfi::EhFrameSource;
pub use cfi::{FunctionRanges, UNNAMED_PREFIX};
pub use dwarf::{DwarfInfo, SourceFrame};
pub use plt::{PLT_NAME, PLT_SUFFIX};
pub use symbols::{demangle, Symbol, SymbolMap};

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
    pub kernel: Option<SymbolMap>,
    /// The JIT dump each process wrote, by the path of its perf map (the library its JIT
    /// code is in).
    pub jit_dumps: HashMap<String, PathBuf>,
}

impl Default for SymbolOptions {
    fn default() -> Self {
        SymbolOptions {
            debug_roots: debug_roots(&[]),
            debuginfod: None,
            kernel: None,
            jit_dumps: HashMap::new(),
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
}

impl LibSymbols {
    /// Loads the symbols of an ELF file held in `data`, with nothing from elsewhere.
    pub fn from_elf(data: &[u8]) -> Option<LibSymbols> {
        let data: Arc<[u8]> = Arc::from(data);
        let file = object::File::parse(&*data).ok()?;
        let (dwarf, no_debug_info) = match DwarfInfo::load(&file, &data) {
            Ok(dwarf) => (Some(dwarf), None),
            Err(why) => (None, Some(why)),
        };
        Some(LibSymbols {
            symbols: SymbolMap::from_elf(&[&file]),
            no_debug_info,
            dwarf,
            eh_frame: EhFrameSource::of(&file, None),
            ..LibSymbols::default()
        })
    }

    /// Loads the symbols of `binary`, mapped from `mapped_path`: its own, and those of its
    /// separate debug file when it lacks DWARF or a full symbol table.
    pub fn load(binary: &Binary, mapped_path: &str, opts: &SymbolOptions) -> Option<LibSymbols> {
        // Only the parts that name things are read (symbol tables, DWARF), not its code;
        // what is kept is copied out of the reader, which goes at the end.
        let reader = binary.reader();
        let file = object::File::parse(&reader).ok()?;
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
        let debug_object = debug_reader
            .as_ref()
            .and_then(|reader| object::File::parse(reader).ok());
        // The debug file's full symbol table first: of two names at one address, it has
        // the better one.
        let mut files: Vec<Vec<(bool, Symbol)>> =
            debug_object.iter().map(symbols::elf_symbols).collect();
        files.push(symbols::elf_symbols(&file));
        let mut symbols = SymbolMap::from_elf_symbols(files);
        if let Some(stub) = &binary.entry_stub {
            symbols = symbols.or_named(stub.clone(), "_start");
        }
        let loaded = match (binary.has_dwarf, &debug, &debug_object) {
            (false, Some(_), Some(object)) => DwarfInfo::load(object, &Arc::from(&[][..])),
            _ => DwarfInfo::load(&file, &Arc::from(&[][..])),
        };
        let (dwarf, no_debug_info) = match loaded {
            Ok(dwarf) => (Some(dwarf), None),
            // DWARF that is there but cannot be used says so.
            Err(why) if binary.has_dwarf || debug.is_some() => (None, Some(why)),
            Err(_) => (
                None,
                Some(match rejected.first() {
                    Some(path) => {
                        format!("{} does not match the file (build ID)", path.display())
                    }
                    None => match &binary.build_id {
                        Some(id) => {
                            let paths: Vec<String> = opts
                                .debug_roots
                                .iter()
                                .map(|root| build_id_path(root, id).display().to_string())
                                .collect();
                            let mut why =
                                format!("no DWARF, and no debug file {}", paths.join(" or "));
                            if let Some(fetch) = not_fetched {
                                why = format!("{why}; {fetch}");
                            }
                            why
                        }
                        None => "no DWARF, and no build ID to find a debug file by".to_string(),
                    },
                }),
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
            ),
            functions: OnceLock::new(),
        })
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
        }
    }

    /// Looks up many lib-relative addresses, in address order, split across the CPUs when
    /// there are enough of them: each thread gets a contiguous share of the addresses (so
    /// it parses only the compile units that cover them) and its own DWARF context.
    pub fn lookup_many(&self, addresses: &[u64]) -> Vec<AddressInfo> {
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(addresses.len() / ADDRESSES_PER_WORKER)
            .max(1);
        let mut order: Vec<usize> = (0..addresses.len()).collect();
        order.sort_unstable_by_key(|&i| addresses[i]);
        let mut out = vec![AddressInfo::default(); addresses.len()];
        let forks: Option<Vec<Option<DwarfInfo>>> = match &self.dwarf {
            Some(d) if workers > 1 => (0..workers).map(|_| d.fork().map(Some)).collect(),
            _ => None,
        };
        let Some(forks) = forks else {
            for i in order {
                out[i] = self.lookup(addresses[i]);
            }
            return out;
        };
        std::thread::scope(|scope| {
            let handles: Vec<_> = order
                .chunks(addresses.len().div_ceil(workers))
                .zip(forks)
                .map(|(share, dwarf)| {
                    let names = self.names();
                    scope.spawn(move || {
                        share
                            .iter()
                            .map(|&i| (i, names.lookup(dwarf.as_ref(), addresses[i])))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for handle in handles {
                for (i, info) in handle.join().unwrap_or_default() {
                    out[i] = info;
                }
            }
        });
        out
    }
}

/// Below this many addresses per CPU, a second thread costs more (its own DWARF context
/// re-reads every unit's header and ranges) than it saves.
const ADDRESSES_PER_WORKER: usize = 1000;

/// See [`LibSymbols::names`].
#[derive(Clone, Copy)]
struct Names<'a> {
    symbols: &'a SymbolMap,
    base: u64,
    eh_frame: Option<&'a EhFrameSource>,
    functions: &'a OnceLock<FunctionRanges>,
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
        let (symbols, base) = (&self.symbols, self.base);
        let probe = address.wrapping_add(base);
        let frames: Vec<SourceFrame> = dwarf.map(|d| d.frames(probe)).unwrap_or_default();
        let mut symbol = symbols.lookup_stored(probe).map(|s| Symbol {
            address: s.address.wrapping_sub(base),
            // DWARF usually has the outer function under the same linkage name, already
            // demangled.
            name: match frames.first() {
                Some(f) if f.linkage_name.as_deref() == Some(s.name.as_str()) => f.function.clone(),
                _ => symbols.display_name(s),
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
                symbols
                    .by_name(f.linkage_name.as_deref()?)
                    .map(|s| s.address.wrapping_sub(base))
            })
            .collect();
        AddressInfo {
            unnamed: unnamed && symbol.is_some(),
            symbol,
            frames,
            frame_symbols,
        }
    }
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

    /// The frames (outer first) of one raw address frame.
    fn expand(&mut self, raw: &AddressFrame, info: Option<&AddressInfo>) -> Vec<FrameIndex> {
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
            let func = self.func(FuncKey::Named(None, TRUNCATED_MARKER.into(), None), || {
                Func {
                    name: TRUNCATED_MARKER.into(),
                    file: None,
                    lib: None,
                }
            });
            return vec![self.frames.intern(plain(func, None), FrameIndex::new)];
        }
        let info = info.cloned().unwrap_or_default();
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
            return vec![self
                .frames
                .intern(plain(func, outer.and_then(|f| f.line)), FrameIndex::new)];
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
        let mut out = Vec::with_capacity(info.frames.len().max(1));
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
        out
    }
}

/// What the summary needs to know of a library's symbols once its addresses are named
/// and the symbols themselves are gone.
pub struct LibOutcome {
    /// Why it has no symbols at all (it could not be read), else `None`.
    pub unreadable: Option<String>,
    pub has_symbols: bool,
    /// Why it has no DWARF, when it has none.
    pub no_debug_info: Option<String>,
}

impl LibOutcome {
    fn of(symbols: &Result<LibSymbols, String>) -> LibOutcome {
        match symbols {
            Ok(s) => LibOutcome {
                unreadable: None,
                has_symbols: !s.symbols.is_empty(),
                no_debug_info: s.no_debug_info.clone(),
            },
            Err(why) => LibOutcome {
                unreadable: Some(why.clone()),
                has_symbols: false,
                no_debug_info: None,
            },
        }
    }
}

/// The address frames of each library: indexes into `raw.address_frames`.
fn frames_by_lib(raw: &RawProfile) -> HashMap<LibIndex, Vec<usize>> {
    let mut by_lib: HashMap<LibIndex, Vec<usize>> = HashMap::new();
    for (i, af) in raw.address_frames.iter().enumerate() {
        if let Some(lib) = af.lib {
            by_lib.entry(lib).or_default().push(i);
        }
    }
    by_lib
}

/// Looks up the addresses of `frames` (one library's) in `symbols`.
fn name_frames(
    raw: &RawProfile,
    frames: &[usize],
    symbols: &Result<LibSymbols, String>,
) -> Vec<(usize, AddressInfo)> {
    let Ok(symbols) = symbols else {
        return Vec::new();
    };
    let addresses: Vec<u64> = frames
        .iter()
        .map(|&i| raw.address_frames[i].address)
        .collect();
    frames
        .iter()
        .copied()
        .zip(symbols.lookup_many(&addresses))
        .collect()
}

/// Turns a raw profile into the final one, given the symbols of each library (or why a
/// library has none).
pub fn apply(raw: RawProfile, lib_symbols: &[Result<LibSymbols, String>]) -> Profile {
    // Each unique address is looked up once, a library's addresses together.
    let mut infos: Vec<Option<AddressInfo>> = vec![None; raw.address_frames.len()];
    for (lib, frames) in frames_by_lib(&raw) {
        if let Some(symbols) = lib_symbols.get(lib.index()) {
            for (i, info) in name_frames(&raw, &frames, symbols) {
                infos[i] = Some(info);
            }
        }
    }
    let outcomes: Vec<Option<LibOutcome>> = lib_symbols
        .iter()
        .map(|s| Some(LibOutcome::of(s)))
        .collect();
    build(raw, infos, &outcomes)
}

/// The final profile from the raw one, each address frame's information (`None` where
/// nothing names it), and what became of each library's symbols (`None`: not loaded).
fn build(
    raw: RawProfile,
    infos: Vec<Option<AddressInfo>>,
    outcomes: &[Option<LibOutcome>],
) -> Profile {
    let mut tables = Tables::default();
    let mut unnamed: Vec<LibIndex> = Vec::new();
    let mut sampled: Vec<LibIndex> = Vec::new();
    let expanded: Vec<Vec<FrameIndex>> = raw
        .address_frames
        .iter()
        .zip(&infos)
        .map(|(af, info)| {
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
            tables.expand(af, info.as_ref())
        })
        .collect();
    let symbol_gaps = sampled
        .into_iter()
        .filter_map(|lib| {
            let outcome = outcomes.get(lib.index()).and_then(Option::as_ref);
            let (missing, why) = if unnamed.contains(&lib) {
                let why = match outcome {
                    Some(LibOutcome {
                        unreadable: Some(why),
                        ..
                    }) => why.clone(),
                    Some(o) => {
                        let what = if !o.has_symbols {
                            "no symbol table"
                        } else if o.no_debug_info.is_some() {
                            "only exported symbols"
                        } else {
                            "addresses outside every symbol"
                        };
                        match &o.no_debug_info {
                            Some(why) => format!("{what}; {why}"),
                            None => what.to_string(),
                        }
                    }
                    None => "not loaded".to_string(),
                };
                (Missing::Symbols, why)
            } else {
                let Some(LibOutcome {
                    no_debug_info: Some(why),
                    ..
                }) = outcome
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
        for &frame in &expanded[rs.frame.index()] {
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

/// Reads the kernel's symbols from `/proc/kallsyms`, named `[kernel] name`; `None` when
/// they are hidden.
pub fn read_kallsyms() -> Option<SymbolMap> {
    let file = std::fs::File::open("/proc/kallsyms").ok()?;
    let map = SymbolMap::read_kallsyms(std::io::BufReader::new(file)).ok()??;
    Some(map.prefixed(KERNEL_PREFIX))
}

/// Loads the symbols of every library of `raw` from the files the profile builder
/// verified (`lib_binaries`, parallel to `raw.libs`), and symbolicates; kernel frames
/// with `opts.kernel`. Libraries load in parallel, one worker per CPU.
pub fn symbolicate(raw: RawProfile, lib_binaries: &[LibFile], opts: &SymbolOptions) -> Profile {
    // Only libraries with sampled addresses are read; each one's symbols are dropped as
    // soon as its addresses are named, so at most one library per worker is in memory.
    let mut todo: Vec<(LibIndex, Vec<usize>)> = frames_by_lib(&raw).into_iter().collect();
    // The largest first: the workers finish together.
    todo.sort_by_key(|(lib, frames)| (std::cmp::Reverse(frames.len()), lib.index()));
    let workers = std::thread::available_parallelism()
        .map_or(1, |w| w.get())
        .clamp(1, todo.len().max(1));
    let mut infos: Vec<Option<AddressInfo>> = vec![None; raw.address_frames.len()];
    let mut outcomes: Vec<Option<LibOutcome>> = (0..raw.libs.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (raw, todo) = (&raw, &todo);
                scope.spawn(move || {
                    todo.iter()
                        .skip(w)
                        .step_by(workers)
                        .map(|(lib, frames)| {
                            let i = lib.index();
                            let symbols = match lib_binaries.get(i) {
                                Some(binary) => load_lib(&raw.libs[i], binary, opts),
                                None => Err("reading it failed".into()),
                            };
                            let named = name_frames(raw, frames, &symbols);
                            (*lib, LibOutcome::of(&symbols), named)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for handle in handles {
            for (lib, outcome, named) in handle.join().unwrap_or_default() {
                outcomes[lib.index()] = Some(outcome);
                for (i, info) in named {
                    infos[i] = Some(info);
                }
            }
        }
    });
    build(raw, infos, &outcomes)
}

/// The most of a perf map that is read: a line of about a hundred bytes per piece of JIT
/// code keeps even a long-running JIT's far below this.
const MAX_PERF_MAP_BYTES: u64 = 1 << 30;

/// The symbols of one library, or why there are none.
fn load_lib(lib: &Lib, binary: &LibFile, opts: &SymbolOptions) -> Result<LibSymbols, String> {
    match lib.kind {
        LibKind::File => {
            let binary = binary.as_ref().map_err(String::clone)?;
            LibSymbols::load(binary, &lib.path, opts).ok_or_else(|| "not an ELF file".into())
        }
        LibKind::Kernel => Ok(LibSymbols {
            symbols: opts
                .kernel
                .clone()
                .ok_or("/proc/kallsyms hides addresses (kernel.kptr_restrict; run as root)")?,
            base: lib.base,
            ..LibSymbols::default()
        }),
        LibKind::PerfMap => {
            // The name is predictable and /tmp anyone's: a link or a fifo planted there is
            // not read, nor more than a perf map can sensibly hold.
            let mut entries =
                crate::locate::read_regular(Path::new(&lib.path), 0, MAX_PERF_MAP_BYTES)
                    .map(|text| symbols::perf_map_entries(&String::from_utf8_lossy(&text)))
                    .ok();
            let dump = opts.jit_dumps.get(&lib.path);
            if let Some(path) = dump {
                let read = crate::jitdump::read_from(path, 0).map_err(|e| e.to_string());
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
            let entries =
                entries.ok_or_else(|| format!("JIT code, but no {} was written", lib.path))?;
            Ok(LibSymbols {
                symbols: SymbolMap::from_written(entries),
                ..LibSymbols::default()
            })
        }
        LibKind::Pseudo => Err("no file behind it".into()),
    }
}
