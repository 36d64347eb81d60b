//! DWARF line and inline information through `addr2line`: for one address, the chain of
//! functions the compiler inlined there, each with its file and line.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::ops::Range;
use std::sync::Arc;

use gimli::{EndianArcSlice, RunTimeEndian};

use crate::files::elf::{Elf, Section};

mod units;
use units::{keep_only, line_programs_read, InfoRead, ReadUnits, Units};

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

/// `.debug_info` (`section`) read keeping only the units `kept` keeps, each run of the
/// others a stand-in (see `units::stand_in`) with the abbreviation table at `.1` of
/// `keeping`, where `keeping` reads units and the section is laid out for it; else whole,
/// with `read`.
fn info_keeping<'d>(
    section: &Section<'d>,
    kept: &Units,
    keeping: Option<(&ReadUnits<'d, '_>, u32)>,
    read: &dyn Fn(&Section<'d>) -> Result<Loaded, String>,
    endian: RunTimeEndian,
) -> Result<InfoRead, String> {
    if let Some((read_units, table)) = keeping {
        let keep = |unit: usize| kept.kept(unit);
        let stand_in = |run: &mut [u8]| units::stand_in(run, table, endian);
        if let Some((own, starts)) = read_units(section, &keep, &stand_in)? {
            return Ok((own, Some(starts)));
        }
    }
    Ok(match read(section)? {
        (_, Some(own)) => (own, None),
        (whole, None) => (Arc::from(whole.bytes()), None),
    })
}

/// A section as loaded: its reader, and the buffer that reader alone reads when the
/// section was read into one of its own.
type Loaded = (Reader, Option<Arc<[u8]>>);

/// The DWARF of one file: the sections, shared, and a lookup context over them (which
/// parses units lazily and caches them, so it is used by one thread at a time).
pub struct DwarfInfo {
    sections: Arc<gimli::Dwarf<Reader>>,
    context: addr2line::Context<Reader>,
    /// How many compilation units were left out, as none of the addresses it was loaded
    /// for lies in them (0 when loaded for every address).
    units_left_out: usize,
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
    /// (each run of them one small stand-in, in a buffer whose other bytes cost no
    /// memory): in
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
        let read_units = |section: &Section<'d>,
                          keep: &dyn Fn(usize) -> bool,
                          stand_in: &dyn Fn(&mut [u8]) -> bool| {
            crate::files::elf::section_units(
                file,
                section,
                at,
                keep,
                stand_in,
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
        // Where `units::LEFT_OUT_ABBREVIATIONS` lies in `.debug_abbrev`, appended to it
        // as it is loaded when units are read keeping only some (gimli loads it before
        // `.debug_info`).
        let appended: std::cell::Cell<Option<u32>> = Default::default();
        // `.debug_info` read keeping only the units `kept` keeps, where it can.
        let reread = |kept: &Units| -> Result<InfoRead, String> {
            let section = file.section(".debug_info").ok_or("no .debug_info")?;
            let keeping = read_units.zip(appended.get());
            info_keeping(&section, kept, keeping, read, endian)
        };
        let info_starts: std::cell::RefCell<Option<Vec<usize>>> = Default::default();
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
                (gimli::SectionId::DebugAbbrev, Some(_), _) => {
                    let (reader, _) = read(&section).map_err(refuse)?;
                    let bytes = reader.bytes();
                    appended.set(u32::try_from(bytes.len()).ok());
                    let abbrev = units::with_left_out_abbreviations(bytes);
                    return Ok(EndianArcSlice::new(abbrev, endian));
                }
                (gimli::SectionId::DebugInfo, Some(_), Some(kept)) => {
                    let (own, starts) = reread(kept).map_err(refuse)?;
                    *info_starts.borrow_mut() = starts;
                    *own_info.borrow_mut() = Some(own.clone());
                    return Ok(EndianArcSlice::new(own, endian));
                }
                // Read once the units kept say which line programs they use.
                (gimli::SectionId::DebugLine, Some(_), _) => return Ok(empty()),
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
        // Units sharing one abbreviation table (all of Go's) parse it once, not each.
        sections.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
        // The units found before `.debug_info` was read, else from the sections loaded:
        // their `.debug_aranges`, else the ranges their roots give.
        let mut kept = kept.or_else(|| {
            let addresses = addresses?;
            Units::of(&sections.debug_aranges, addresses)
                .or_else(|| Units::of_roots(&sections, addresses))
        });
        let units_left_out = match kept.as_mut() {
            Some(kept) => {
                let read = (own_info.take(), info_starts.take());
                keep_only(&mut sections, kept, read, appended.get(), &reread, endian)?
            }
            None => 0,
        };
        if let (Some(read_units), Some(section)) = (read_units, file.section(".debug_line")) {
            sections.debug_line =
                line_programs_read(&sections, &section, read_units, read, endian)?;
        }
        let sections = Arc::new(sections);
        let context = addr2line::Context::from_arc_dwarf(sections.clone())
            .map_err(|e| format!("its DWARF cannot be read: {e}"))?;
        Ok(DwarfInfo {
            sections,
            context,
            units_left_out,
        })
    }

    /// How many compilation units were left out, as none of the addresses the DWARF was
    /// loaded for lies in them.
    pub fn units_left_out(&self) -> usize {
        self.units_left_out
    }

    /// A second, independent lookup context over the same sections, for another thread.
    pub fn fork(&self) -> Option<DwarfInfo> {
        let context = addr2line::Context::from_arc_dwarf(self.sections.clone()).ok()?;
        Some(DwarfInfo {
            sections: self.sections.clone(),
            context,
            units_left_out: self.units_left_out,
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
