//! DWARF line and inline information through `addr2line`: for one address, the chain of
//! functions the compiler inlined there, each with its file and line.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::ops::Range;
use std::sync::Arc;

use gimli::{EndianArcSlice, RunTimeEndian};

use crate::files::elf::{Elf, Section, UNIT_HEAD_BYTES};

/// One function level at an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFrame {
    /// Demangled function name (`"??"` when DWARF has none).
    pub function: String,
    /// The name as the symbol table would store it (the linkage name, mangled), to find
    /// the function's own symbol by.
    pub linkage_name: Option<String>,
    pub file: Option<String>,
    /// The line executing in this function: for an outer level, the line of the call
    /// that was inlined.
    pub line: Option<u32>,
}

type Reader = EndianArcSlice<RunTimeEndian>;

/// A section as loaded: its reader, and the buffer that reader alone reads when the
/// section was read into one of its own.
type Loaded = (Reader, Option<Arc<[u8]>>);

/// Reads a section made of units keeping whole only those at the offsets it is given,
/// and the first bytes of the others ([`crate::files::elf::section_units`]); `None` when
/// the section is not laid out for it.
type ReadUnits<'d, 'a> =
    dyn Fn(&Section<'d>, usize, &dyn Fn(usize) -> bool) -> Result<Option<Arc<[u8]>>, String> + 'a;

/// The abbreviation table that units left out of `.debug_info` are pointed at: code 1, a
/// compilation unit without children or attributes, then the table's end. Appended to
/// `.debug_abbrev`. A left-out unit's entries become this one entry and zeros, so that
/// reading its root (which `addr2line` does for every unit as it starts) stops at once:
/// zeroed entries alone read as null entries, which the search for the root steps over
/// one byte at a time, through the whole unit (for libc's debug file, all 5.8 MB of
/// `.debug_info`: a fifth of the CPU of a first run).
const LEFT_OUT_ABBREVIATIONS: [u8; 6] = [1, 0x11, 0, 0, 0, 0];

/// The compilation units of `.debug_info`, by offset, that `.debug_aranges` lists, and
/// of those the ones whose ranges hold an address looked up.
struct Units {
    listed: HashSet<usize>,
    needed: HashSet<usize>,
}

impl Units {
    /// The units for `addresses`; `None` when the table lists none.
    fn of(aranges: &gimli::DebugAranges<Reader>, addresses: &[u64]) -> Option<Units> {
        // The units by the address ranges the table gives them.
        let mut listed: Vec<(u64, u64, usize)> = Vec::new();
        let mut headers = aranges.headers();
        while let Ok(Some(header)) = headers.next() {
            let unit = header.debug_info_offset().0;
            let mut entries = header.entries();
            while let Ok(Some(entry)) = entries.next() {
                let range = entry.range();
                listed.push((range.begin, range.end, unit));
            }
        }
        if listed.is_empty() {
            return None;
        }
        let mut needed: HashSet<usize> = HashSet::new();
        listed.sort_unstable();
        for &address in addresses {
            // Ranges do not overlap in real files; a few before the address are checked.
            let i = listed.partition_point(|&(begin, _, _)| begin <= address);
            for &(begin, end, unit) in listed[..i].iter().rev().take(8) {
                if (begin..end).contains(&address) {
                    needed.insert(unit);
                }
            }
        }
        let listed = listed.iter().map(|&(_, _, unit)| unit).collect();
        Some(Units { listed, needed })
    }

    /// Whether lookups read the unit at `offset`: a unit the table does not list may
    /// hold any address.
    fn kept(&self, offset: usize) -> bool {
        !self.listed.contains(&offset) || self.needed.contains(&offset)
    }
}

/// `.debug_info` with only the compilation units `kept` (those lookups of a set of addresses need) left
/// as they are: each unit that `.debug_aranges` lists, for ranges holding none of the
/// addresses, keeps its place and header but points at [`LEFT_OUT_ABBREVIATIONS`] and
/// has its entries reduced to that table's one entry, so that `addr2line` passes over it
/// (a unit with an empty root) without parsing its abbreviations and line program.
/// libc's debug file has some 1,800 units, whose abbreviations alone take about 15 MB
/// once parsed, and a profile's addresses lie in a few dozen. Units that the table does
/// not list (it may miss some), and references between units, which keep their offsets,
/// are untouched. Returned as the changes to make (see [`LeaveOut::apply`]); `None` when
/// nothing would be left out, or the layout is not the usual one (32-bit DWARF).
fn only_units_for(dwarf: &gimli::Dwarf<Reader>, kept: &Units) -> Option<LeaveOut> {
    // Where each unit left out starts, has its abbreviation offset and its entries.
    let mut left_out: Vec<LeftOut> = Vec::new();
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let offset = header.debug_info_offset()?.0;
        if kept.kept(offset) {
            continue;
        }
        let encoding = header.encoding();
        if encoding.format != gimli::Format::Dwarf32 {
            return None;
        }
        let abbrev_at = offset + if encoding.version >= 5 { 8 } else { 6 };
        let entries = offset + header.header_size()..offset + 4 + header.unit_length();
        if !entries.is_empty() {
            left_out.push(LeftOut {
                unit: offset,
                abbrev_at,
                entries,
            });
        }
    }
    use gimli::Section as _;
    let table = u32::try_from(dwarf.debug_abbrev.reader().len()).ok()?;
    (!left_out.is_empty()).then_some(LeaveOut { table, left_out })
}

/// The offsets in `.debug_line` of the line programs of the units of `dwarf` (the units
/// left out have none); `None` when a unit's root cannot be read, and every program is
/// to be kept.
fn line_programs(dwarf: &gimli::Dwarf<Reader>) -> Option<HashSet<usize>> {
    let mut programs = HashSet::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next().ok()? {
        let abbreviations = dwarf.abbreviations(&header).ok()?;
        let mut entries = header.entries(&abbreviations);
        let root = entries.next_dfs().ok()??;
        if let Some(gimli::AttributeValue::DebugLineRef(at)) =
            root.attr_value(gimli::DW_AT_stmt_list)
        {
            programs.insert(at.0);
        }
    }
    Some(programs)
}

/// The units [`only_units_for`] leaves out of `.debug_info`: where in `.debug_abbrev`
/// [`LEFT_OUT_ABBREVIATIONS`] is appended (its end), and for each unit where its
/// abbreviation offset lies and its entries.
struct LeaveOut {
    table: u32,
    left_out: Vec<LeftOut>,
}

/// One unit left out of `.debug_info`: where it starts, where its abbreviation offset
/// lies, and its entries (after its header, to its end).
struct LeftOut {
    unit: usize,
    abbrev_at: usize,
    entries: Range<usize>,
}

impl LeaveOut {
    /// Makes the changes in `info` (`.debug_info`), or none when it is not the section
    /// they were found in (one of them would lie outside it). `sparse`: `info` was read
    /// by [`crate::files::elf::section_units`], which left the units left out zero past
    /// their first [`UNIT_HEAD_BYTES`]; only those bytes are cleared, and the rest of the
    /// buffer stays unwritten.
    fn apply(&self, info: &mut [u8], sparse: bool) {
        let fits = |r: &Range<usize>| r.start < r.end && r.end <= info.len();
        if !self
            .left_out
            .iter()
            .all(|u| fits(&(u.abbrev_at..u.abbrev_at + 4)) && fits(&u.entries))
        {
            return;
        }
        for LeftOut {
            unit,
            abbrev_at,
            entries,
        } in &self.left_out
        {
            info[*abbrev_at..abbrev_at + 4].copy_from_slice(&self.table.to_le_bytes());
            let written_to = match sparse {
                true => entries.end.min(unit + UNIT_HEAD_BYTES).max(entries.start),
                false => entries.end,
            };
            info[entries.start..written_to].fill(0);
            info[entries.start] = LEFT_OUT_ABBREVIATIONS[0];
        }
    }

    /// `.debug_abbrev` (`abbrev`) with [`LEFT_OUT_ABBREVIATIONS`] appended.
    fn abbreviations(&self, abbrev: &[u8]) -> Arc<[u8]> {
        abbrev
            .iter()
            .chain(&LEFT_OUT_ABBREVIATIONS)
            .copied()
            .collect()
    }
}

/// The DWARF of one file: the sections, shared, and a lookup context over them (which
/// parses units lazily and caches them, so it is used by one thread at a time).
pub struct DwarfInfo {
    sections: Arc<gimli::Dwarf<Reader>>,
    context: addr2line::Context<Reader>,
}

impl DwarfInfo {
    /// Loads the DWARF sections of `file`, whose bytes are `data`: uncompressed sections
    /// are borrowed from `data`, compressed ones inflated. The error says why there is
    /// none: no `.debug_info`, or a section that cannot be read.
    pub fn load<'d, R: object::ReadRef<'d>>(
        file: &Elf<'d, R>,
        data: &Arc<[u8]>,
    ) -> Result<DwarfInfo, String> {
        let endian = file.gimli_endian();
        let whole = EndianArcSlice::new(data.clone(), endian);
        let read = |section: &Section<'d>| {
            let bytes = crate::files::elf::section_data(file, section)?;
            // A borrowed section lies inside `data`: share it rather than copy it.
            let within = match &bytes {
                Cow::Borrowed(slice) => (slice.as_ptr() as usize)
                    .checked_sub(data.as_ptr() as usize)
                    .filter(|start| start + slice.len() <= data.len()),
                Cow::Owned(_) => None,
            };
            Ok(match within {
                Some(start) => (whole.range(start..start + bytes.len()), None),
                None => {
                    let own: Arc<[u8]> = Arc::from(&*bytes);
                    (EndianArcSlice::new(own.clone(), endian), Some(own))
                }
            })
        };
        DwarfInfo::load_with(file, None, &read, None)
    }

    /// [`DwarfInfo::load`] for a file read through `at`: each section is read (and
    /// inflated) into a buffer of its own. For looking up `addresses` only, when they
    /// are given: the compilation units `.debug_aranges` places none of them in are left
    /// out (see `only_units_for`), and neither they nor their line programs are read
    /// (only their headers, into a buffer whose other bytes cost no memory): in
    /// sampler's own release binary, 15 MB of `.debug_info` and 6 MB of `.debug_line`, of
    /// which a profile's addresses need a few hundred KB.
    pub fn load_for<'d, R: object::ReadRef<'d>>(
        file: &Elf<'d, R>,
        at: &crate::files::image::At,
        addresses: Option<&[u64]>,
    ) -> Result<DwarfInfo, String> {
        let endian = file.gimli_endian();
        let read = |section: &Section<'d>| {
            crate::files::elf::section_shared(file, section, at)
                .map(|own| (EndianArcSlice::new(own.clone(), endian), Some(own)))
        };
        let read_units = |section: &Section<'d>, head: usize, keep: &dyn Fn(usize) -> bool| {
            crate::files::elf::section_units(
                file,
                section,
                at,
                head,
                keep,
                &crate::record::zeroed_shared,
            )
        };
        DwarfInfo::load_with(file, addresses, &read, Some(&read_units))
    }

    /// Loads the sections of `file` that naming needs with `read`, which gives each one's
    /// reader and, when it made one, the buffer the reader reads alone; with
    /// `read_units` and `addresses`, `.debug_info` and `.debug_line` keep whole only what
    /// lookups of the addresses read.
    fn load_with<'d, R: object::ReadRef<'d>>(
        file: &Elf<'d, R>,
        addresses: Option<&[u64]>,
        read: &dyn Fn(&Section<'d>) -> Result<Loaded, String>,
        read_units: Option<&ReadUnits<'d, '_>>,
    ) -> Result<DwarfInfo, String> {
        if file.section(".debug_info").is_none() {
            return Err("no DWARF in the file".into());
        }
        let refused: std::cell::RefCell<Option<String>> = Default::default();
        let endian = file.gimli_endian();
        let empty = || EndianArcSlice::new(Arc::from(&[][..]), endian);
        let own_info: std::cell::RefCell<Option<Arc<[u8]>>> = Default::default();
        // The units lookups read, from `.debug_aranges` read first (and handed to gimli).
        let aranges: std::cell::RefCell<Option<Reader>> = Default::default();
        let kept = match (addresses, read_units, file.section(".debug_aranges")) {
            (Some(addresses), Some(_), Some(section)) => read(&section).ok().and_then(|(r, _)| {
                *aranges.borrow_mut() = Some(r.clone());
                Units::of(&r.into(), addresses)
            }),
            _ => None,
        };
        let read_units = read_units.filter(|_| kept.is_some());
        let sparse_info = std::cell::Cell::new(false);
        let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
            // Location lists say where variables live, which naming code never needs;
            // leaving them out saves reading (and inflating) them.
            if matches!(
                id,
                gimli::SectionId::DebugLoc | gimli::SectionId::DebugLocLists
            ) {
                return Ok(empty());
            }
            let Some(section) = file.section(id.name()) else {
                return Ok(empty());
            };
            let refuse = |why: String| {
                refused.borrow_mut().get_or_insert(why);
                gimli::Error::Io
            };
            match (id, read_units, &kept) {
                (gimli::SectionId::DebugAranges, _, _) => {
                    if let Some(reader) = aranges.borrow_mut().take() {
                        return Ok(reader);
                    }
                }
                (gimli::SectionId::DebugInfo, Some(read_units), Some(kept)) => {
                    let keep = |unit: usize| kept.kept(unit);
                    if let Some(own) =
                        read_units(&section, UNIT_HEAD_BYTES, &keep).map_err(refuse)?
                    {
                        sparse_info.set(true);
                        *own_info.borrow_mut() = Some(own.clone());
                        return Ok(EndianArcSlice::new(own, endian));
                    }
                }
                // Read once the units kept say which line programs they use.
                (gimli::SectionId::DebugLine, Some(_), Some(_)) => return Ok(empty()),
                _ => {}
            }
            let (reader, own) = read(&section).map_err(refuse)?;
            if id == gimli::SectionId::DebugInfo {
                *own_info.borrow_mut() = own;
            }
            Ok(reader)
        };
        let unreadable = |e: gimli::Error| {
            refused
                .borrow_mut()
                .take()
                .unwrap_or_else(|| format!("its DWARF cannot be read: {e}"))
        };
        let mut sections = gimli::Dwarf::load(load).map_err(unreadable)?;
        // The units found before `.debug_info` was read, else from the sections loaded.
        let kept = kept.or_else(|| addresses.and_then(|a| Units::of(&sections.debug_aranges, a)));
        if let Some(leave_out) = kept.as_ref().and_then(|k| only_units_for(&sections, k)) {
            // Changed in place when the section is a buffer of its own (once the reader
            // is taken out of the sections, the only reference to it), else in a copy.
            use gimli::Section as _;
            let reader = std::mem::replace(&mut sections.debug_info, empty().into());
            let mut info = own_info
                .take()
                .unwrap_or_else(|| Arc::from(reader.reader().bytes()));
            drop(reader);
            leave_out.apply(Arc::make_mut(&mut info), sparse_info.get());
            sections.debug_info = EndianArcSlice::new(info, endian).into();
            let abbrev = leave_out.abbreviations(sections.debug_abbrev.reader().bytes());
            sections.debug_abbrev = EndianArcSlice::new(abbrev, endian).into();
        }
        if let (Some(read_units), Some(section)) = (read_units, file.section(".debug_line")) {
            let programs = line_programs(&sections);
            let sparse = match &programs {
                Some(programs) => read_units(&section, 0, &|at| programs.contains(&at))?,
                None => None,
            };
            let reader = match sparse {
                Some(own) => EndianArcSlice::new(own, endian),
                None => read(&section)?.0,
            };
            sections.debug_line = reader.into();
        }
        let sections = Arc::new(sections);
        let context = addr2line::Context::from_arc_dwarf(sections.clone())
            .map_err(|e| format!("its DWARF cannot be read: {e}"))?;
        Ok(DwarfInfo { sections, context })
    }

    /// A second, independent lookup context over the same sections, for another thread.
    pub fn fork(&self) -> Option<DwarfInfo> {
        let context = addr2line::Context::from_arc_dwarf(self.sections.clone()).ok()?;
        Some(DwarfInfo {
            sections: self.sections.clone(),
            context,
        })
    }

    /// The functions at `address` (in the file's address space), outer first. Empty when
    /// DWARF does not cover the address.
    pub fn frames(&self, address: u64) -> Vec<SourceFrame> {
        self.frames_with(address, &mut |name| super::symbols::demangle(name))
            .0
    }

    /// [`DwarfInfo::frames`], with names demangled by `demangle`; and the unit offset of
    /// the DIE of the outer (not inlined) function, when DWARF has one.
    fn frames_with(
        &self,
        address: u64,
        demangle: &mut dyn FnMut(&str) -> String,
    ) -> (Vec<SourceFrame>, Option<gimli::UnitOffset<usize>>) {
        let mut out = Vec::new();
        let mut function = None;
        let Ok(mut iter) = self.context.find_frames(address).skip_all_loads() else {
            return (out, function);
        };
        while let Ok(Some(frame)) = iter.next() {
            // The last frame is the outer function.
            function = frame.dw_die_offset;
            let linkage_name = frame
                .function
                .as_ref()
                .and_then(|f| f.raw_name().ok().map(Cow::into_owned));
            // sampler's demangling, as for symbols (GCC's older C++ forms included).
            let function = linkage_name
                .as_deref()
                .map_or_else(|| "??".to_string(), &mut *demangle);
            let (file, line) = frame
                .location
                .as_ref()
                .map_or((None, None), |l| (l.file.map(str::to_string), l.line));
            out.push(SourceFrame {
                function,
                linkage_name,
                file,
                line,
            });
        }
        out.reverse();
        (out, function)
    }

    /// The frames of every address of `range`, as pieces in which they are the same:
    /// each starts where a line-table row starts or ends, or where the range of a
    /// function or of a call inlined into it starts or ends, and holds the frames of its
    /// first address (see [`DwarfInfo::frames`]). `None` when that takes more than
    /// `max_pieces` pieces.
    pub fn pieces(
        &self,
        range: Range<u64>,
        max_pieces: usize,
        demangle: &mut dyn FnMut(&str) -> String,
    ) -> Option<Vec<(Range<u64>, Vec<SourceFrame>)>> {
        let mut cuts: BTreeSet<u64> = BTreeSet::from([range.end]);
        let cut = |cuts: &mut BTreeSet<u64>, at: u64| {
            if range.start < at && at < range.end {
                cuts.insert(at);
            }
        };
        if let Ok(rows) = self.context.find_location_range(range.start, range.end) {
            for (start, len, _) in rows {
                cut(&mut cuts, start);
                cut(&mut cuts, start.saturating_add(len));
                if cuts.len() > max_pieces {
                    return None;
                }
            }
        }
        // Functions whose ranges were cut at, by the offset of their DIE.
        let mut seen: HashSet<gimli::UnitOffset<usize>> = HashSet::new();
        let mut pieces = Vec::new();
        let mut at = range.start;
        while at < range.end {
            let (frames, function) = self.frames_with(at, demangle);
            if let Some(offset) = function.filter(|&f| seen.insert(f)) {
                for bound in self.function_bounds(at, offset) {
                    cut(&mut cuts, bound);
                }
            }
            if cuts.len() > max_pieces {
                return None;
            }
            let next = cuts.range(at + 1..).next().copied().unwrap_or(range.end);
            pieces.push((at..next, frames));
            at = next;
        }
        Some(pieces)
    }

    /// Where the ranges of the function whose DIE is at `offset` (in the unit that holds
    /// `address`), of the calls inlined into it and of the functions nested in it start
    /// and end: where the inline chain within it can change.
    fn function_bounds(&self, address: u64, offset: gimli::UnitOffset<usize>) -> Vec<u64> {
        let mut bounds = Vec::new();
        let Some(unit) = self.context.find_dwarf_and_unit(address).skip_all_loads() else {
            return bounds;
        };
        let Ok(mut cursor) = unit.entries_at_offset(offset) else {
            return bounds;
        };
        let mut first = true;
        while let Ok(Some(entry)) = cursor.next_dfs() {
            // The function's subtree ends at its next sibling.
            if !std::mem::take(&mut first) && entry.depth() <= 0 {
                break;
            }
            if !matches!(
                entry.tag(),
                gimli::DW_TAG_subprogram | gimli::DW_TAG_inlined_subroutine
            ) {
                continue;
            }
            let Ok(mut ranges) = unit.die_ranges(entry) else {
                continue;
            };
            while let Ok(Some(r)) = ranges.next() {
                bounds.extend([r.begin, r.end]);
            }
        }
        bounds
    }
}
