//! A file's `.eh_frame` read one function at a time, from the open file, when a frame in
//! that function is first unwound. A compiler's libraries carry 6–8 MB of `.eh_frame`
//! each, of which a profile touches the entries of a few thousand functions: reading the
//! sections whole was most of the memory sampler held while recording a build.
//!
//! The file's `.eh_frame_hdr` table (sorted function starts, each with where its FDE
//! lies) is binary-searched in place, 8 bytes per step. The FDE found and its CIE are
//! copied into a small `.eh_frame` of their own, placed so that the FDE keeps its
//! address (its pc-relative pointers stay right) and with its CIE pointer set to the
//! copy, with a header whose table lists that FDE alone; framehop unwinds with those as
//! it would with the whole sections. Each piece covers the addresses from its function's
//! start to the next function's start (the first one from address 0), as a lookup in the
//! whole table does: an address outside the FDE gets framehop's rule for code no FDE
//! covers.
//!
//! Only the usual layout is read this way (a table of data-relative 4-byte entries, FDEs
//! with 32-bit lengths); any other file's sections are read whole, as before.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::files::image::{At, SectionBytes};

/// `DW_EH_PE_datarel | DW_EH_PE_sdata4`: the encoding of the table's entries.
const DATAREL_SDATA4: u8 = 0x3b;
/// `DW_EH_PE_pcrel | DW_EH_PE_sdata4`: the encoding of the `.eh_frame` pointer written.
const PCREL_SDATA4: u8 = 0x1b;
/// `DW_EH_PE_udata4`: the encoding of the entry count.
const UDATA4: u8 = 0x03;
/// `DW_EH_PE_omit`.
const OMIT: u8 = 0xff;
/// Bytes of one table entry: the function's start and its FDE's address.
const ENTRY_BYTES: u64 = 8;
/// The largest CIE or FDE read: 64 KiB. Real ones are tens of bytes (a few KB for a
/// function with a long series of pushes and pops); a larger length is a damaged file.
const MAX_RECORD_BYTES: u32 = 64 << 10;

/// The sections CFI unwinding needs, in the file's own addresses (SVMA).
#[derive(Clone, Debug, Default)]
pub struct UnwindSections {
    pub text: Option<std::ops::Range<u64>>,
    pub eh_frame: Option<(std::ops::Range<u64>, SectionBytes)>,
    pub eh_frame_hdr: Option<(std::ops::Range<u64>, SectionBytes)>,
    pub debug_frame: Option<SectionBytes>,
    pub got: Option<std::ops::Range<u64>>,
    /// `.eh_frame` read one function at a time (then `eh_frame` and `eh_frame_hdr` are
    /// not read): see [`LazyCfi`].
    pub lazy: Option<Arc<LazyCfi>>,
}

impl UnwindSections {
    /// Whether the file has call frame information at all.
    pub fn has_cfi(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some() || self.lazy.is_some()
    }

    /// `.eh_frame` and its address, read whole now when it is read lazily.
    pub fn eh_frame_whole(&self) -> Option<(u64, SectionBytes)> {
        match (&self.eh_frame, &self.lazy) {
            (Some((range, bytes)), _) => Some((range.start, bytes.clone())),
            (None, Some(lazy)) => lazy.whole(),
            (None, None) => None,
        }
    }
}

/// One function's CFI, as framehop takes it.
pub struct FunctionCfi {
    /// The addresses (the file's own) this CFI answers for: from the function's start to
    /// the next one's.
    pub covers: Range<u64>,
    /// The addresses its FDE describes (within `covers`); `None` when it describes none.
    pub fde: Option<Range<u64>>,
    pub sections: UnwindSections,
}

/// See the module's description.
pub struct LazyCfi {
    at: At,
    /// `.eh_frame`: its addresses and where it lies in the file.
    eh_frame: Range<u64>,
    eh_frame_offset: u64,
    /// The header's address, and its table's file offset and length.
    hdr_address: u64,
    table_offset: u64,
    count: u64,
    text: Option<Range<u64>>,
    got: Option<Range<u64>>,
    /// The pieces read so far, shared by every process that maps the file.
    pieces: Mutex<Pieces>,
    /// The pages of the table read so far, by their index: a search's first steps read
    /// the same few entries every time, and its last ones fall in one page.
    table_pages: Mutex<HashMap<u64, Arc<[u8]>>>,
}

/// Bytes of the table read at once: 512 entries.
const TABLE_PAGE: u64 = 4096;
/// The most table pages kept per file (1 MiB): a compiler's library has some 400 (a
/// table of 200,000 functions); past this they are all dropped and read again.
const MAX_TABLE_PAGES: usize = 256;

/// The pieces of a [`LazyCfi`] read so far. A function met again (in this process or the
/// next one that maps the file: a build runs the same compiler hundreds of times) is
/// found by address here, without searching the table in the file again.
#[derive(Default)]
struct Pieces {
    /// By table entry (`None`: unreadable), each with whether it was used since the
    /// last [`LazyCfi::age_pieces`].
    by_entry: HashMap<u64, (Option<Arc<FunctionCfi>>, bool)>,
    /// The table entry of each readable piece, by the start of the addresses it covers
    /// (pieces cover disjoint ranges: from one table entry's start to the next's).
    by_start: BTreeMap<u64, u64>,
}

impl Pieces {
    /// The piece read before whose addresses cover `address`, marked as used.
    fn covering(&mut self, address: u64) -> Option<Arc<FunctionCfi>> {
        let (_, &entry) = self.by_start.range(..=address).next_back()?;
        match self.by_entry.get_mut(&entry)? {
            (Some(piece), used) if piece.covers.contains(&address) => {
                *used = true;
                Some(piece.clone())
            }
            _ => None,
        }
    }
}

impl std::fmt::Debug for LazyCfi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyCfi")
            .field("eh_frame", &self.eh_frame)
            .field("functions", &self.count)
            .finish()
    }
}

impl LazyCfi {
    /// The lazy form of a file's `.eh_frame` at `eh_frame` (its addresses, and file
    /// offset) with its header at `hdr` (likewise), when the header is in the layout read
    /// this way.
    pub fn new(
        at: At,
        eh_frame: (Range<u64>, u64),
        hdr: (Range<u64>, u64),
        text: Option<Range<u64>>,
        got: Option<Range<u64>>,
    ) -> Option<LazyCfi> {
        let (hdr_range, hdr_offset) = hdr;
        let head = at.read_exact_at(hdr_offset, 12)?;
        // Version 1; the .eh_frame pointer in any 4-byte encoding; a 4-byte count; the
        // table in 4-byte data-relative entries.
        let [1, ptr_enc, UDATA4, DATAREL_SDATA4, ..] = head[..] else {
            return None;
        };
        if ptr_enc == OMIT || ptr_enc & 0x0f != 0x0b && ptr_enc & 0x0f != 0x03 {
            return None;
        }
        let count = u64::from(u32::from_le_bytes(head[8..12].try_into().ok()?));
        let table_offset = hdr_offset + 12;
        let hdr_len = hdr_range.end - hdr_range.start;
        if 12 + count.checked_mul(ENTRY_BYTES)? > hdr_len {
            return None;
        }
        Some(LazyCfi {
            at,
            eh_frame: eh_frame.0,
            eh_frame_offset: eh_frame.1,
            hdr_address: hdr_range.start,
            table_offset,
            count,
            text,
            got,
            pieces: Mutex::new(Pieces::default()),
            table_pages: Mutex::new(HashMap::new()),
        })
    }

    /// The table's `i`th entry: a function's start and its FDE's address.
    fn entry(&self, i: u64) -> Option<(u64, u64)> {
        let at = i * ENTRY_BYTES;
        let (page, within) = (at / TABLE_PAGE, (at % TABLE_PAGE) as usize);
        let bytes = {
            let mut pages = self.table_pages.lock().unwrap_or_else(|e| e.into_inner());
            match pages.get(&page) {
                Some(bytes) => bytes.clone(),
                None => {
                    let len = (self.count * ENTRY_BYTES - page * TABLE_PAGE).min(TABLE_PAGE);
                    let read: Arc<[u8]> = self
                        .at
                        .read_exact_at(self.table_offset + page * TABLE_PAGE, len as usize)?
                        .into();
                    if pages.len() >= MAX_TABLE_PAGES {
                        pages.clear();
                    }
                    pages.insert(page, read.clone());
                    read
                }
            }
        };
        let bytes = bytes.get(within..within + ENTRY_BYTES as usize)?;
        let rel = |b: &[u8]| i32::from_le_bytes(b.try_into().unwrap_or_default()) as i64;
        Some((
            self.hdr_address.wrapping_add_signed(rel(&bytes[..4])),
            self.hdr_address.wrapping_add_signed(rel(&bytes[4..])),
        ))
    }

    /// The CFI of the function at or before `address` (the file's own), when the table
    /// lists one and it can be read.
    pub fn function_at(&self, address: u64) -> Option<Arc<FunctionCfi>> {
        if self.count == 0 {
            return None;
        }
        if let Some(known) = self.lock_pieces().covering(address) {
            return Some(known);
        }
        // The last entry whose start is at or below the address; below the first entry,
        // the first one: a lookup in the whole table gives it (and then finds the
        // address outside its FDE).
        let (mut low, mut high) = (0, self.count);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.entry(mid)?.0 <= address {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        let i = low.saturating_sub(1);
        let mut pieces = self.lock_pieces();
        if let Some((known, used)) = pieces.by_entry.get_mut(&i) {
            *used = true;
            return known.clone();
        }
        let piece = self.piece(i).map(Arc::new);
        if let Some(piece) = &piece {
            pieces.by_start.insert(piece.covers.start, i);
        }
        pieces.by_entry.insert(i, (piece.clone(), true));
        piece
    }

    fn lock_pieces(&self) -> std::sync::MutexGuard<'_, Pieces> {
        self.pieces.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the pieces read so far: once recording ends, unwinding needs none of them
    /// (a build's profile holds some 2.5 MB of them), and naming reads again the few
    /// it looks up.
    pub fn forget_pieces(&self) {
        *self.lock_pieces() = Pieces::default();
        self.forget_table_pages();
    }

    fn forget_table_pages(&self) {
        *self.table_pages.lock().unwrap_or_else(|e| e.into_inner()) = HashMap::new();
    }

    /// Drops the pieces not used since the last call (a continuous recording's window):
    /// what the machine runs now stays read, and a machine's libraries do not pile up.
    pub fn age_pieces(&self) {
        let pieces = &mut *self.lock_pieces();
        pieces.by_entry.retain(|_, (_, used)| std::mem::take(used));
        let by_entry = &pieces.by_entry;
        pieces
            .by_start
            .retain(|_, entry| by_entry.contains_key(entry));
        self.forget_table_pages();
    }

    /// Reads the `i`th function's FDE and CIE into a `.eh_frame` of their own.
    fn piece(&self, i: u64) -> Option<FunctionCfi> {
        let (start, fde_address) = self.entry(i)?;
        let end = match i + 1 < self.count {
            true => self.entry(i + 1)?.0,
            false => u64::MAX,
        };
        let fde_at = fde_address.checked_sub(self.eh_frame.start)?;
        let fde = self.record(fde_at)?;
        let cie_pointer = u64::from(u32::from_le_bytes(fde.get(4..8)?.try_into().ok()?));
        let cie = self.record((fde_at + 4).checked_sub(cie_pointer)?)?;
        // The CIE first, then the FDE, pointing back to it.
        let mut bytes = cie.clone();
        bytes.extend_from_slice(&fde);
        let pointer = u32::try_from(cie.len() + 4).ok()?;
        bytes[cie.len() + 4..cie.len() + 8].copy_from_slice(&pointer.to_le_bytes());
        let at = fde_address.checked_sub(cie.len() as u64)?;
        let len = bytes.len() as u64;
        // And a header with a one-entry table, right after it: framehop looks an address
        // up in a table as in the whole file's (where an address outside the FDE gets
        // the rule for code without CFI, not the one for no module).
        let hdr_at = at + len;
        let rel = |to: u64, from: u64| i32::try_from(to.wrapping_sub(from) as i64).ok();
        let mut hdr = vec![1, PCREL_SDATA4, UDATA4, DATAREL_SDATA4];
        hdr.extend_from_slice(&rel(at, hdr_at + 4)?.to_le_bytes());
        hdr.extend_from_slice(&1u32.to_le_bytes());
        hdr.extend_from_slice(&rel(start, hdr_at)?.to_le_bytes());
        hdr.extend_from_slice(&rel(fde_address, hdr_at)?.to_le_bytes());
        let hdr_len = hdr.len() as u64;
        let covers = if i == 0 { 0 } else { start }..end.max(start + 1);
        let eh_frame: SectionBytes = bytes.into();
        let fde = self.fde_range(at, &eh_frame);
        Some(FunctionCfi {
            covers,
            fde,
            sections: UnwindSections {
                text: self.text.clone(),
                got: self.got.clone(),
                eh_frame: Some((at..at + len, eh_frame)),
                eh_frame_hdr: Some((hdr_at..hdr_at + hdr_len, hdr.into())),
                ..UnwindSections::default()
            },
        })
    }

    /// The addresses described by the FDE of a piece's `.eh_frame` (`bytes`, at `at`):
    /// its CIE, then the FDE.
    fn fde_range(&self, at: u64, bytes: &[u8]) -> Option<Range<u64>> {
        use gimli::{CieOrFde, EhFrame, LittleEndian, UnwindSection};
        let eh_frame = EhFrame::new(bytes, LittleEndian);
        let mut bases = gimli::BaseAddresses::default().set_eh_frame(at);
        if let Some(text) = &self.text {
            bases = bases.set_text(text.start);
        }
        let mut entries = eh_frame.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            if let CieOrFde::Fde(partial) = entry {
                let fde = partial
                    .parse(|section, bases, offset| section.cie_from_offset(bases, offset))
                    .ok()?;
                let start = fde.initial_address();
                let end = start.checked_add(fde.len())?;
                return (end > start).then_some(start..end);
            }
        }
        None
    }

    /// The CIE or FDE at `offset` in `.eh_frame`, with its length field.
    fn record(&self, offset: u64) -> Option<Vec<u8>> {
        if offset >= self.eh_frame.end - self.eh_frame.start {
            return None;
        }
        let at = self.eh_frame_offset + offset;
        let len = u32::from_le_bytes(self.at.read_exact_at(at, 4)?.try_into().ok()?);
        // 0: the terminator; 0xffffffff: a 64-bit length, which x86-64 files do not use.
        if len == 0 || len > MAX_RECORD_BYTES {
            return None;
        }
        let bytes = self.at.read_exact_at(at, 4 + len as usize)?;
        (bytes.len() == 4 + len as usize).then_some(bytes)
    }

    /// The whole `.eh_frame`, read now, with its address.
    pub fn whole(&self) -> Option<(u64, SectionBytes)> {
        let len = usize::try_from(self.eh_frame.end - self.eh_frame.start).ok()?;
        let bytes = self.at.read_exact_at(self.eh_frame_offset, len)?;
        (bytes.len() == len).then(|| (self.eh_frame.start, bytes.into()))
    }
}
