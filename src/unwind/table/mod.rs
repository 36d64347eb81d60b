//! Unwind tables for an unwinder in the kernel: a file's call frame information
//! (`.eh_frame`, or `.debug_frame` where that is all there is) compiled ahead of time into
//! one sorted array of fixed-size rows, which an eBPF program searches by a bounded binary
//! search and follows without evaluating DWARF (issue 29's kernel unwinder; this module is
//! its compiler, in plain Rust, with a Rust model of the walker's step for its tests).
//!
//! A row says, from its address to the next row's, how the caller's frame is found on
//! x86-64: the CFA (RSP or RBP plus an offset, the PLT stubs' rule, a signal frame, or a
//! mark that the walker cannot follow it), the return address (at CFA - 8, none in the
//! outermost frame, or unknown) and the caller's RBP (unchanged, or saved at CFA +
//! offset). gimli evaluates the CFI (`row`, `rules` and `compile` hold the layout, the
//! conversion of gimli's rules, and the pass over the FDEs).
//!
//! Addresses are the file's own (its SVMA, what framehop's modules and
//! [`crate::files::binary::Binary`] use): a process address minus the mapping's bias. A
//! return address is looked up at `address - 1`, as
//! [`crate::unwind::CodeAddress::lookup_address`] does.

mod cache;
mod compile;
mod row;
mod rules;

pub use cache::TableCache;
pub use compile::{compile, compile_as, compile_into, RowBytes, RowSink};
pub use row::{Cfa, Rbp, Regs, ReturnAddress, Row, Step, Stop, Unsupported, ROW_BYTES};

/// The most rows a table holds: 2^22 (4,194,304 rows, 48 MiB). GCC 12's `cc1`, a 33 MB
/// program of 45,201 functions, needs 478,579 (5.7 MB), sampler itself 121,116: the limit
/// leaves room for a program eight times cc1's size, and refuses a file beyond it rather
/// than fill memory that the kernel pins.
pub const MAX_ROWS: usize = 1 << 22;

/// Steps of the binary search that finds a row: enough for [`MAX_ROWS`] rows (one
/// more than its bits), the bound an eBPF program's loop needs.
pub const SEARCH_STEPS: u32 = MAX_ROWS.ilog2() + 1;

/// One file's unwind table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnwindTable<K = Vec<Row>> {
    /// The address rows' `start`s are offsets from: the first FDE's start.
    pub base: u64,
    /// The rows (see [`Row`] for their invariants); empty when the file has no CFI. As
    /// [`Row`]s, or as the kernel's table holds them ([`RowBytes`]).
    pub rows: K,
    /// The FDEs the rows come from.
    pub fdes: usize,
    /// FDEs that could not be read (their addresses have no entry), counting as one the
    /// rest of a section whose entries could not be followed.
    pub damaged: usize,
}

impl UnwindTable {
    /// The row for the file's address `address`: the last one starting at or before it.
    /// `None` below the first row (no entry). The search takes at most
    /// [`SEARCH_STEPS`] steps.
    pub fn row_at(&self, address: u64) -> Option<&Row> {
        let offset = u32::try_from(address.checked_sub(self.base)?).ok();
        // Past 4 GiB from the base: beyond the last row, whose rules apply.
        let Some(offset) = offset else {
            return self.rows.last();
        };
        // The first row starting after `offset` is at `high`, with `low <= high`.
        let (mut low, mut high) = (0, self.rows.len());
        for _ in 0..SEARCH_STEPS {
            if low >= high {
                break;
            }
            let mid = low + (high - low) / 2;
            if self.rows[mid].start <= offset {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low.checked_sub(1).map(|i| &self.rows[i])
    }

    /// The rows as a BPF map holds them, one after the other (see [`Row::to_bytes`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.rows.iter().flat_map(Row::to_bytes).collect()
    }
}

/// The table of the file at `path` (read through `data`) as the unwinder in the kernel
/// loads it, compiled in memory: what [`TableCache`] (the
/// [`crate::events::KernelTables`] the command line gives recording) does without a
/// cache.
pub fn kernel_table(
    path: &std::path::Path,
    data: &object::ReadCache<crate::files::image::At>,
) -> Result<crate::events::KernelTable, String> {
    let table = compile_as::<RowBytes, _>(path, data)?;
    Ok(crate::events::KernelTable {
        base: table.base,
        count: table.rows.row_count(),
        rows: Box::new(table.rows.into_bytes()),
    })
}

const _: () = assert!(ROW_BYTES == crate::events::KernelTable::ROW_BYTES);

#[cfg(test)]
mod tests;
