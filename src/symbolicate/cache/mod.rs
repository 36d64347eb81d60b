//! The symbol cache: what symbolication learned about a file (whole functions: their
//! symbol, and for every piece of their code the inline chain with files and lines),
//! kept between runs so that a later run that needs only those functions opens neither
//! the file's separate debug file nor its DWARF. Reading libc's debug information is
//! most of the time and memory a short recording spends after its command ends.
//!
//! - Where: `$XDG_CACHE_HOME/sampler/symbols/`, else `~/.cache/sampler/symbols/`; under
//!   sudo the invoking user's, created and written as [`crate::files::usercache`] does.
//! - Key: one entry per file, named after its build ID and size (`HEX-SIZE`), or for a
//!   file without one after its device, inode and size (`file-DEV-INODE-SIZE`). The
//!   entry holds the file's device, inode, modification and change times ([`Stamp`])
//!   and is used only for that very file: a file rebuilt with a fixed build ID and the
//!   same size is another file (its change time at least differs, and nobody can set
//!   that back). The entry also records where the file's debug information came from
//!   (its own sections, a separate debug file by path, device, inode, size and
//!   modification time, or none), and is used only when the same source would be used
//!   now (see [`predict_source`]): installing or removing a debug package,
//!   or another `--debug-root`, makes the entry stale, and it is rebuilt.
//! - Format: one flat, little-endian buffer (see [`Entry`]) that can be used where it
//!   lies, memory-mapped or, as here, read whole; checked entirely before use (magic,
//!   version, length, checksum, every offset and index in range, sorted intervals,
//!   UTF-8 names). A truncated or damaged entry is ignored and rebuilt.
//! - Bounds: [`MAX_ENTRY_BYTES`] per entry and [`MAX_TOTAL_BYTES`] on the disk (the
//!   blocks the entries take, not their length) for the directory, least recently used
//!   entries (by modification time, which every use renews) evicted after each write;
//!   a write that fails (a full disk) halves the cache, so that it never keeps its file
//!   system full.
//! - The kernel: one table per boot of the running kernel's own functions
//!   ([`KernelTable`]), named `kernel-` and the kernel's key; the first run of a boot
//!   that names a kernel address writes it, and the tables of the boots before, which
//!   no later boot can use, are removed beyond the last few.
//! - Compressed DWARF: an inflated copy of a debug file whose DWARF is compressed,
//!   made the first time it is needed and read instead of it, so that later runs read
//!   only the units they need (see [`inflated`]).
//! - Privacy: the directories are the user's alone (0700, made so when found open to
//!   others), entries 0600. The kernel's tables are named after a keyed hash of the
//!   boot and of where the kernel's text starts (see [`SymbolCache::kernel_key`]), with
//!   a random secret kept in the cache (`sampler/secret`, 0600): from public facts
//!   (build ID, boot ID) and an entry's name nobody can work out the kernel's address.
//! - Writes: atomic (a new file beside the entry, renamed over it) after the profile is
//!   written ([`SymbolCache::save`]), so they never delay it, except that entries of
//!   256 KiB or more are written into their new files as they are made (not to be held
//!   in memory: a first run's kernel table, 4 MB, held until then was at the top of a
//!   cold `cargo build`'s peak) and only renamed then, the directories made for them if need
//!   be; a run that does not save removes those files, then the directories it made. A
//!   failure only means the next run reads the debug information again.
//!
//! The parts: `key` says which file an entry is for and where its debug information
//! came from, `format` reads and checks the flat entry, `builder` makes one from what a
//! run named, `inflated` writes and recognises the inflated copies, `kernel_table`
//! writes, reads and checks the kernel's table, and `store` keeps entries in the
//! directory (secret, writes, eviction).

mod builder;
mod format;
pub mod inflated;
mod kernel_table;
mod key;
mod store;
mod words;

pub use builder::EntryBuilder;
pub(crate) use builder::FastMap;
pub use format::{with_checksum, Entry, Refused};
pub use kernel_table::{InTable, KernelTable, TableBuilder, TableBytes};
pub use key::{predict_source, DebugSource, Identity, Key, Secret, Stamp};
pub use store::SymbolCache;

/// The largest entry written or read: 32 MiB. An entry holds only the functions
/// profiles needed, about 1 KB each with their inline chains (libc's, after a dozen
/// different programs, is tens of KB); a file whose profiled functions fill 32 MiB
/// (some 30,000 functions) is better served by reading its DWARF than by a cache of that
/// size that each run must read and check whole.
pub const MAX_ENTRY_BYTES: u64 = 32 << 20;

/// The most the cache directory holds: 256 MiB, the size of one large debug file, and
/// room for the entries of hundreds of libraries profiled often; past it the least
/// recently used entries go.
pub const MAX_TOTAL_BYTES: u64 = 256 << 20;
