//! Symbolication: names every unique (library, address) of a [`RawProfile`] once, and
//! produces the final [`Profile`], in which one address with inlined calls becomes one
//! frame per inline depth (outer first, sharing the outer function's native symbol).
//!
//! Sources, per kind of library: the mapped ELF file (`.symtab`, `.dynsym`, DWARF) and its
//! separate debug file (found by [`crate::files::locate::find_debug_file`] under the debug roots,
//! else fetched by [`crate::symbolicate::debuginfod`]); `/proc/kallsyms`
//! for the kernel, whose frames are named `[kernel] name`; `/tmp/perf-PID.map` for a
//! process's JIT code. Code that no symbol names is named after the start of its function
//! as the file's `.eh_frame` gives it (`fn_0x4a2c0`), else after its address (`0x…`), and
//! its library is listed in [`Profile::symbol_gaps`] with the reason; nothing here fails
//! the run.
//!
//! The parts: `library` names one library's addresses (its ELF file and debug
//! information, or a process's perf map and JIT dump), `kernel` the kernel's, and
//! `rebuild` turns the raw profile's tables and those names into the final tables,
//! with inline frames expanded, reading nothing. This module holds what they share and
//! the pipeline's entry, [`symbolicate`].

pub mod cache;
mod cfi;
pub mod debuginfod;
mod dwarf;
mod gcc_names;
mod kernel;
mod library;
mod memo;
mod plt;
mod rebuild;
mod symbol;
pub mod symbols;
mod symtab;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::files::binary::Binary;
use crate::files::binary::LibFile;
pub use crate::files::locate::DEFAULT_DEBUG_ROOT;
use crate::profile::{Lib, LibKind, Profile, RawProfile};
pub use cfi::{EhFrameBytes, EhFrameSource, FunctionRanges, UNNAMED_PREFIX};
pub use dwarf::{DwarfInfo, SourceFrame};
pub use kernel::{kernel_table, read_kallsyms, KERNEL_PREFIX};
pub use library::{name_file, Keep, LibSymbols};
pub use memo::{NameMemo, MAX_MEMO_BYTES};
pub use plt::{PLT_NAME, PLT_SUFFIX};
pub use symbols::{demangle, Kallsyms, Symbol, SymbolMap};
pub use symtab::{ScanMemo, MAX_SCAN_MEMO_BYTES};

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
    /// Where the function symbols of files are kept between the profiles of one run
    /// (continuous mode's windows), if anywhere.
    pub scan_memo: Option<Arc<ScanMemo>>,
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
            scan_memo: None,
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

/// What naming one library gave: what it says of itself, and what is known of each of
/// its addresses (in the order of [`rebuild::frames_by_lib`]); or why it has no names.
type Named = Result<(LibFacts, Vec<AddressInfo>), String>;

/// Turns a raw profile into the final one, given the symbols of each library (or why a
/// library has none).
pub fn apply(raw: RawProfile, lib_symbols: &[Result<LibSymbols, String>]) -> Profile {
    let by_lib = rebuild::frames_by_lib(&raw);
    let named: Vec<Option<Named>> = by_lib
        .iter()
        .enumerate()
        .map(|(lib, frames)| {
            let named = match lib_symbols.get(lib)? {
                Ok(syms) => Ok((
                    syms.facts(),
                    syms.lookup_many(&rebuild::addresses_of(&raw, frames)),
                )),
                Err(why) => Err(why.clone()),
            };
            Some(named)
        })
        .collect();
    rebuild::assemble(raw, &by_lib, named)
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
    let by_lib = rebuild::frames_by_lib(&raw);
    let cpus = std::thread::available_parallelism().map_or(1, |w| w.get());
    let name = |i: usize| {
        let addresses = rebuild::addresses_of(&raw, &by_lib[i]);
        name_lib(&raw.libs[i], &lib_binaries[i], &addresses, opts)
    };
    let mut named: Vec<Option<Named>> = (0..n).map(|_| None).collect();
    let (large, small): (Vec<usize>, Vec<usize>) =
        (0..n).partition(|&i| cpus > 1 && by_lib[i].len() >= 2 * library::ADDRESSES_PER_WORKER);
    for &i in &large {
        named[i] = Some(name(i));
    }
    let workers = cpus.clamp(1, small.len().max(1));
    // Each worker takes the next library when it is done with one: one that must read
    // debug information (tens of milliseconds) holds up only its own worker.
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let (small, name, next) = (&small, &name, &next);
                scope.spawn(move || {
                    std::iter::from_fn(|| {
                        let &i =
                            small.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))?;
                        Some((i, name(i)))
                    })
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
    rebuild::assemble(raw, &by_lib, named)
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
    if let Some(signal) = crate::record::interrupt::stopped() {
        return Err(format!("not read: {signal} stopped the naming"));
    }
    match lib.kind {
        LibKind::File => {
            let binary = readable(binary)?;
            name_file(binary, &lib.path, addresses, opts).ok_or_else(|| "not an ELF file".into())
        }
        LibKind::Kernel => kernel::name_kernel(lib.base, addresses, opts),
        _ => {
            let syms = load_lib(lib, binary, opts)?;
            Ok((syms.facts(), syms.lookup_many(addresses)))
        }
    }
}

/// The symbols of one library, or why there are none.
fn load_lib(lib: &Lib, binary: &LibFile, opts: &SymbolOptions) -> Result<LibSymbols, String> {
    match lib.kind {
        LibKind::File => {
            let binary = readable(binary)?;
            LibSymbols::load(binary, &lib.path, opts).ok_or_else(|| "not an ELF file".into())
        }
        LibKind::Kernel => Ok(LibSymbols {
            symbols: kernel::kallsyms(opts)?.map,
            base: lib.base,
            ..LibSymbols::default()
        }),
        LibKind::PerfMap => library::load_perf_map(lib, opts),
        LibKind::Pseudo => Err("no file behind it".into()),
    }
}
