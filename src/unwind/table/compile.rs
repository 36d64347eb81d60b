//! From an ELF file's CFI to its unwind table: the FDEs listed and sorted by address,
//! each one's rows evaluated by gimli, clipped to the next FDE's start, converted,
//! merged, and the gaps between FDEs filled with "no entry" rows.
//!
//! Where FDEs overlap, an address takes the rules of the FDE that starts last at or
//! before it, and past that FDE's end it has no entry, as a lookup in `.eh_frame_hdr`
//! finds it (libgcc's unwinder, framehop). A damaged entry never panics and never gives
//! a rule: an FDE that cannot be read, or the rest of one whose instructions cannot,
//! has no entry, and where the section's entries cannot be followed any more, the FDEs
//! beyond are missing; [`UnwindTable::damaged`] counts them.

use std::collections::HashMap;
use std::path::Path;

use gimli::{
    BaseAddresses, CieOrFde, CommonInformationEntry, Reader, ReaderOffset, UnwindContext,
    UnwindOffset, UnwindSection,
};
use object::ReadRef;

use super::row::{Cfa, Row, ROW_BYTES};
use super::{rules, UnwindTable, MAX_ROWS};
use crate::files::elf::{section_data, Elf};

/// Compiles the unwind table of the ELF file `data` read from `path`: from its
/// `.eh_frame`, or its `.debug_frame` when it has no `.eh_frame` (or one without bytes,
/// as in a separate debug file). A file with neither has an empty table. `Err` is one line naming the file: not a 64-bit x86-64 ELF file, a
/// section that cannot be read, or a table beyond the limits (see [`MAX_ROWS`]).
pub fn compile<'d, R: ReadRef<'d>>(path: &Path, data: R) -> Result<UnwindTable, String> {
    compile_as(path, data)
}

/// [`compile`], the rows kept as `K` holds them.
pub fn compile_as<'d, K: RowSink + Default, R: ReadRef<'d>>(
    path: &Path,
    data: R,
) -> Result<UnwindTable<K>, String> {
    compile_into(path, data, K::default())
}

/// [`compile`], the rows given to `sink` as they are made.
pub fn compile_into<'d, K: RowSink, R: ReadRef<'d>>(
    path: &Path,
    data: R,
    sink: K,
) -> Result<UnwindTable<K>, String> {
    let named = |why: String| format!("{}: {why}", path.display());
    let elf = Elf::parse(data).ok_or_else(|| named("not a 64-bit ELF file".into()))?;
    if !elf.is_x86_64() || !elf.is_little_endian() {
        return Err(named(
            "not an x86-64 file: unwind tables are made for x86-64 only".into(),
        ));
    }
    // A separate debug file keeps `.eh_frame`'s header without its bytes (`SHT_NOBITS`),
    // and maybe `.debug_frame`.
    let section = |name: &str| {
        elf.section(name)
            .filter(|s| s.size() > 0 && s.kind() != object::elf::SHT_NOBITS)
    };
    let address = |name: &str| elf.section(name).map_or(0, |s| s.address());
    let built = if let Some(eh_frame) = section(".eh_frame") {
        let bytes = section_data(&elf, &eh_frame).map_err(named)?;
        let mut cfi = gimli::EhFrame::new(&bytes, gimli::LittleEndian);
        cfi.set_address_size(8);
        let bases = BaseAddresses::default()
            .set_eh_frame(eh_frame.address())
            .set_text(address(".text"))
            .set_got(address(".got"));
        build(&cfi, &bases, MAX_ROWS, sink)
    } else if let Some(debug_frame) = section(".debug_frame") {
        let bytes = section_data(&elf, &debug_frame).map_err(named)?;
        let mut cfi = gimli::DebugFrame::new(&bytes, gimli::LittleEndian);
        cfi.set_address_size(8);
        build(&cfi, &BaseAddresses::default(), MAX_ROWS, sink)
    } else {
        Ok(UnwindTable {
            base: 0,
            rows: sink,
            fdes: 0,
            damaged: 0,
        })
    };
    built.map_err(|why| named(why.to_string()))
}

/// Why a table is refused.
#[derive(Debug)]
pub(super) enum TooLarge {
    /// More rows than the limit given.
    Rows(usize),
    Span,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TooLarge::Rows(max) => write!(
                f,
                "its unwind table would have more than {max} rows, the most a table holds"
            ),
            TooLarge::Span => write!(
                f,
                "its call frame information spans more than 4 GiB of addresses, which a table's 32-bit offsets cannot hold"
            ),
        }
    }
}

/// Where an FDE is and what it covers: 16 bytes, for the 200,000 FDEs of
/// librustc_driver, held while its table is made. An FDE that covers 4 GiB or more, or
/// lies 4 GiB or more into its section, is damaged (a table's offsets are 32-bit anyway).
struct Span {
    start: u64,
    len: u32,
    offset: u32,
}

impl Span {
    fn of<R: Reader>(fde: &gimli::FrameDescriptionEntry<R>) -> Option<Span> {
        let len = u32::try_from(fde.len()).ok()?;
        fde.initial_address().checked_add(u64::from(len))?;
        Some(Span {
            start: fde.initial_address(),
            len,
            offset: u32::try_from(fde.offset().into_u64()).ok()?,
        })
    }

    fn end(&self) -> u64 {
        self.start + u64::from(self.len)
    }
}

/// What the FDEs' rows are evaluated with: the CIEs read, and gimli's state (kept from
/// one FDE to the next, which saves an allocation each).
struct Reading<R: Reader> {
    cies: Cies<R>,
    context: Box<UnwindContext<R::Offset>>,
}

/// The CIEs read so far, by their offset in the section. A section has a few CIEs and
/// up to hundreds of thousands of FDEs (libLLVM: 160,805), each naming one; gimli reads
/// an FDE's CIE again for every FDE unless it is given them like this.
struct Cies<R: Reader> {
    read: HashMap<R::Offset, CommonInformationEntry<R>>,
}

impl<R: Reader> Cies<R> {
    fn new() -> Cies<R> {
        Cies {
            read: HashMap::new(),
        }
    }

    /// The CIE at `offset` of `cfi`, as `get_cie` gives it to gimli.
    fn get<S: UnwindSection<R>>(
        &mut self,
        cfi: &S,
        bases: &BaseAddresses,
        offset: S::Offset,
    ) -> gimli::Result<CommonInformationEntry<R>> {
        let key = UnwindOffset::into(offset);
        if let Some(cie) = self.read.get(&key) {
            return Ok(cie.clone());
        }
        let cie = cfi.cie_from_offset(bases, offset)?;
        self.read.insert(key, cie.clone());
        Ok(cie)
    }
}

/// Where a table's rows go as they are made, in address order: a list of [`Row`]s, or
/// their bytes as the kernel's table holds them ([`RowBytes`]). Only the last row is ever
/// taken back ([`RowSink::pop_row`]), and then the one before it is the last: a sink
/// may pass on all rows but the last two.
pub trait RowSink {
    /// The last row, if any.
    fn last_row(&self) -> Option<Row>;
    fn pop_row(&mut self);
    fn push_row(&mut self, row: Row);
    fn row_count(&self) -> usize;
}

impl RowSink for Vec<Row> {
    fn last_row(&self) -> Option<Row> {
        self.as_slice().last().copied()
    }
    fn pop_row(&mut self) {
        Vec::pop(self);
    }
    fn push_row(&mut self, row: Row) {
        Vec::push(self, row);
    }
    fn row_count(&self) -> usize {
        Vec::len(self)
    }
}

/// Rows as the kernel's table holds them, [`ROW_BYTES`] each ([`Row::to_bytes`]): 12
/// bytes where a [`Row`] takes 20, and no conversion afterwards. librustc_driver's 1.4
/// million rows are 17 MB so, 28 MB as rows. The last row is kept decoded too: every
/// row made is compared with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowBytes {
    bytes: Vec<u8>,
    last: Option<Row>,
}

impl RowBytes {
    /// The rows' bytes, one row after the other.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The rows' bytes so far.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Forgets the first `rows` rows (passed on elsewhere); the last row stays the last.
    pub fn drain_front(&mut self, rows: usize) {
        self.bytes.drain(..(rows * ROW_BYTES).min(self.bytes.len()));
        if self.bytes.is_empty() {
            self.last = None;
        }
    }
}

impl RowSink for RowBytes {
    fn last_row(&self) -> Option<Row> {
        self.last
    }
    fn pop_row(&mut self) {
        self.bytes
            .truncate(self.bytes.len().saturating_sub(ROW_BYTES));
        let at = self.bytes.len().checked_sub(ROW_BYTES);
        self.last = at.and_then(|at| Row::from_bytes(self.bytes[at..].try_into().ok()?));
    }
    fn push_row(&mut self, row: Row) {
        self.bytes.extend_from_slice(&row.to_bytes());
        self.last = Some(row);
    }
    fn row_count(&self) -> usize {
        self.bytes.len() / ROW_BYTES
    }
}

/// The table of the CFI section `cfi`, of at most `max_rows` rows.
pub(super) fn build<R: Reader, S: UnwindSection<R>, K: RowSink>(
    cfi: &S,
    bases: &BaseAddresses,
    max_rows: usize,
    sink: K,
) -> Result<UnwindTable<K>, TooLarge> {
    let mut damaged = 0;
    // Sized at once, by a count of the FDEs (their headers only): grown by doubling,
    // librustc_driver's took 6.3 MB, and 9.4 MB as it grew, beside its 7.7 MB `.eh_frame`.
    let mut entries = cfi.entries(bases);
    let mut fdes = 0;
    while let Ok(Some(entry)) = entries.next() {
        fdes += usize::from(matches!(entry, CieOrFde::Fde(_)));
    }
    let mut spans = Vec::with_capacity(fdes);
    let mut cies = Cies::new();
    let mut entries = cfi.entries(bases);
    loop {
        match entries.next() {
            Ok(None) => break,
            Ok(Some(CieOrFde::Cie(_))) => {}
            Ok(Some(CieOrFde::Fde(partial))) => match partial.parse(|s, b, o| cies.get(s, b, o)) {
                Ok(fde) => match Span::of(&fde) {
                    Some(span) => spans.push(span),
                    None => damaged += 1,
                },
                Err(_) => damaged += 1,
            },
            // The entries cannot be followed further: the FDEs beyond are unknown.
            Err(_) => {
                damaged += 1;
                break;
            }
        }
    }
    // FDEs at one address keep their order in the section (the last one counts).
    spans.sort_unstable_by_key(|s| (s.start, s.offset));
    let Some(base) = spans.first().map(|s| s.start) else {
        return Ok(UnwindTable {
            base: 0,
            rows: sink,
            fdes: 0,
            damaged,
        });
    };
    let mut rows = Rows {
        base,
        rows: sink,
        max_rows,
    };
    let mut reading = Reading {
        cies,
        context: Box::new(UnwindContext::new()),
    };
    for (i, span) in spans.iter().enumerate() {
        let next = spans.get(i + 1).map_or(u64::MAX, |n| n.start);
        let limit = span.end().min(next);
        let mut cursor = span.start;
        match rows_of_fde(
            cfi,
            bases,
            &mut reading,
            span,
            limit,
            &mut cursor,
            &mut rows,
        ) {
            Ok(()) => {}
            Err(Failed::TooLarge(why)) => return Err(why),
            Err(Failed::Damaged) => damaged += 1,
        }
        if cursor < next {
            rows.push(Row::no_entry(0), cursor)?;
        }
    }
    Ok(UnwindTable {
        base,
        rows: rows.rows,
        fdes: spans.len(),
        damaged,
    })
}

/// Adds the rows of the FDE at `span` up to `limit` (the next FDE's start or its own
/// end, whichever is first), from `cursor` on; `cursor` is left where they end.
fn rows_of_fde<R: Reader, S: UnwindSection<R>, K: RowSink>(
    cfi: &S,
    bases: &BaseAddresses,
    reading: &mut Reading<R>,
    span: &Span,
    limit: u64,
    cursor: &mut u64,
    rows: &mut Rows<K>,
) -> Result<(), Failed> {
    let offset = R::Offset::from_u32(span.offset);
    let fde = cfi.fde_from_offset(bases, S::Offset::from(offset), |s, b, o| {
        reading.cies.get(s, b, o)
    })?;
    let signal_frame = fde.is_signal_trampoline();
    let encoding = fde.cie().encoding();
    let mut table = fde.rows(cfi, bases, &mut reading.context)?;
    while let Some(row) = table.next_row()? {
        let start = row.start_address().max(*cursor);
        let end = row.end_address().min(limit);
        if start >= end {
            if row.start_address() >= limit {
                break;
            }
            continue;
        }
        if start > *cursor {
            rows.push(Row::no_entry(0), *cursor)?;
        }
        let (cfa, ra, rbp) = rules::convert(cfi, encoding, signal_frame, row);
        rows.push(
            Row {
                start: 0,
                cfa,
                ra,
                rbp,
            },
            start,
        )?;
        *cursor = end;
    }
    Ok(())
}

/// Why an FDE's rows stopped: the file's CFI is damaged there, or the table is too large.
enum Failed {
    Damaged,
    TooLarge(TooLarge),
}

impl From<gimli::Error> for Failed {
    fn from(_: gimli::Error) -> Failed {
        Failed::Damaged
    }
}

impl From<TooLarge> for Failed {
    fn from(why: TooLarge) -> Failed {
        Failed::TooLarge(why)
    }
}

/// The rows made so far, merged as they come.
struct Rows<K> {
    base: u64,
    rows: K,
    max_rows: usize,
}

impl<K: RowSink> Rows<K> {
    /// Adds `row` from address `at` on. Rows come in address order; one with the rules of
    /// the row before it is merged into it, one at the same address replaces it.
    fn push(&mut self, mut row: Row, at: u64) -> Result<(), TooLarge> {
        row.start = at
            .checked_sub(self.base)
            .and_then(|o| u32::try_from(o).ok())
            .ok_or(TooLarge::Span)?;
        if row.cfa == Cfa::NoEntry {
            row = Row::no_entry(row.start);
        }
        if self
            .rows
            .last_row()
            .is_some_and(|last| last.start == row.start)
        {
            self.rows.pop_row();
        }
        if self
            .rows
            .last_row()
            .is_some_and(|last| last.same_rules(&row))
        {
            return Ok(());
        }
        if self.rows.row_count() >= self.max_rows {
            return Err(TooLarge::Rows(self.max_rows));
        }
        self.rows.push_row(row);
        Ok(())
    }
}
