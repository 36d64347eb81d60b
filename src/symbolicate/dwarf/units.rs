//! Which compilation units a lookup of some addresses reads, and `.debug_info` and
//! `.debug_line` read keeping only those: the units are found by `.debug_aranges`, else
//! by the ranges their roots give, with the units they refer to for names; the others
//! are left out, so that their entries, abbreviations and line programs cost neither
//! memory nor time.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use gimli::{EndianArcSlice, RunTimeEndian};

use super::{Loaded, Reader};
use crate::files::elf::Section;

/// Reads a section made of units keeping only those at the offsets it is given, each run
/// of the others handed to a stand-in ([`crate::files::elf::section_units`]): the bytes,
/// and where every unit starts; `None` when the section is not laid out for it.
pub(super) type ReadUnits<'d, 'a> = dyn Fn(
        &Section<'d>,
        &dyn Fn(usize) -> bool,
        &dyn Fn(&mut [u8]) -> bool,
    ) -> Result<Option<(Arc<[u8]>, Vec<usize>)>, String>
    + 'a;

/// Reads `.debug_info` again, keeping only the units kept by the [`Units`] given where it
/// can (each run of the others one [`stand_in`], the rest of them zeros that cost no
/// memory), else whole.
pub(super) type Reread<'a> = dyn Fn(&Units) -> Result<InfoRead, String> + 'a;

/// The bytes of `.debug_info` as read and, when only the units kept were read (the others
/// stood in for), where every unit of the file's section starts.
pub(super) type InfoRead = (Arc<[u8]>, Option<Vec<usize>>);

/// The abbreviation table that units left out of `.debug_info` are pointed at: code 1, a
/// compilation unit without children or attributes, then the table's end. Appended to
/// `.debug_abbrev`. A left-out unit's entries become this one entry and zeros, so that
/// reading its root (which `addr2line` does for every unit as it starts) stops at once:
/// zeroed entries alone read as null entries, which the search for the root steps over
/// one byte at a time, through the whole unit (for libc's debug file, all 5.8 MB of
/// `.debug_info`: a fifth of the CPU of a first run).
pub(super) const LEFT_OUT_ABBREVIATIONS: [u8; 6] = [1, 0x11, 0, 0, 0, 0];

/// The bytes of a [`stand_in`]: a DWARF 4 unit header (its fields' sizes: length 4,
/// version 2, abbreviation offset 4, address size 1) and the root's abbreviation code.
const STAND_IN_BYTES: usize = 12;

/// Writes over `run` (zeros where a run of units left out of `.debug_info` lies) one unit
/// that spans it, whose root is the one entry of [`LEFT_OUT_ABBREVIATIONS`] (at `table`
/// in `.debug_abbrev`) and has no children: readers of the section's units (`addr2line`
/// parses each unit's root as it starts) pass over the whole run in one step, and the
/// units in it are never written, so their pages cost no memory. libc's debug file has
/// about 2,000 units, a few kilobytes apart: writing each one's header touched every page
/// of its 5.8 MB `.debug_info`. `false` when the run is too short for a unit header (a
/// damaged section) or too long for 32-bit DWARF.
pub(super) fn stand_in(run: &mut [u8], table: u32, endian: RunTimeEndian) -> bool {
    use gimli::Endianity as _;
    let Some(length) = run
        .len()
        .checked_sub(4)
        .and_then(|l| u32::try_from(l).ok())
        .filter(|&l| l < 0xffff_fff0)
    else {
        return false;
    };
    if run.len() < STAND_IN_BYTES {
        return false;
    }
    endian.write_u32(&mut run[0..4], length);
    endian.write_u16(&mut run[4..6], 4);
    endian.write_u32(&mut run[6..10], table);
    run[10] = 8;
    run[11] = LEFT_OUT_ABBREVIATIONS[0];
    true
}

/// The compilation units of `.debug_info`, by offset, whose address ranges are listed
/// (by `.debug_aranges`, else by their roots), and of those the ones whose ranges hold
/// an address looked up, or that such units refer to.
pub(super) struct Units {
    listed: HashSet<usize>,
    needed: HashSet<usize>,
}

impl Units {
    /// The units for `addresses`; `None` when the table lists none.
    pub(super) fn of(aranges: &gimli::DebugAranges<Reader>, addresses: &[u64]) -> Option<Units> {
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
        Units::from_listed(listed, addresses)
    }

    /// The units for `addresses` by the ranges each unit's root gives, for files
    /// without `.debug_aranges` (Go's, and clang's DWARF 5): a unit whose ranges cannot
    /// be read is not listed, and so is kept. `None` when no unit gives its ranges.
    pub(super) fn of_roots(dwarf: &gimli::Dwarf<Reader>, addresses: &[u64]) -> Option<Units> {
        let mut listed: Vec<(u64, u64, usize)> = Vec::new();
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            let Some(unit) = header.debug_info_offset().map(|o| o.0) else {
                continue;
            };
            for range in root_ranges(dwarf, &header).unwrap_or_default() {
                listed.push((range.begin, range.end, unit));
            }
        }
        Units::from_listed(listed, addresses)
    }

    /// The units of `listed` (address ranges and the offset of the unit that holds each)
    /// and those that hold one of `addresses`; `None` when nothing is listed.
    fn from_listed(mut listed: Vec<(u64, u64, usize)>, addresses: &[u64]) -> Option<Units> {
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
    pub(super) fn kept(&self, offset: usize) -> bool {
        !self.listed.contains(&offset) || self.needed.contains(&offset)
    }

    /// How many of the units starting at `starts` are left out.
    fn left_out_of(&self, starts: &[usize]) -> usize {
        starts.iter().filter(|&&u| !self.kept(u)).count()
    }

    /// Adds to the units kept those that kept units refer to for names: a function's
    /// `DW_AT_abstract_origin` or `DW_AT_specification` in another unit (Go places an
    /// inlined function's abstract entry in its own package's unit; LTO does the like),
    /// whose entries lookups read. Follows references from the units `readable` says
    /// were read whole, each scanned once (`scanned`), and from the units this adds
    /// among them. Whether it added a unit that was not read (the section must be read
    /// again, keeping it, and scanned on).
    /// `starts`: where every unit starts, when `dwarf`'s `.debug_info` has runs of units
    /// stood in for (whose headers it does not have), else its units are read.
    fn add_referenced(
        &mut self,
        dwarf: &gimli::Dwarf<Reader>,
        starts: Option<&[usize]>,
        scanned: &mut HashSet<usize>,
        readable: &dyn Fn(usize) -> bool,
    ) -> bool {
        let offsets: std::borrow::Cow<[usize]> = match starts {
            Some(starts) => starts.into(),
            None => unit_offsets(dwarf).collect::<Vec<_>>().into(),
        };
        // Whether each abbreviation table allows a reference out (see `may_refer_out`),
        // by its offset: units share tables.
        let mut refer_out: HashMap<usize, bool> = HashMap::new();
        let unit_of = |at: usize| {
            offsets
                .partition_point(|offset| *offset <= at)
                .checked_sub(1)
        };
        let mut work: Vec<usize> = (0..offsets.len())
            .filter(|&i| self.kept(offsets[i]) && readable(offsets[i]))
            .collect();
        let mut unread = false;
        while let Some(i) = work.pop() {
            let offset = offsets[i];
            if !scanned.insert(offset) {
                continue;
            }
            let Ok(header) = dwarf
                .debug_info
                .header_from_offset(gimli::DebugInfoOffset(offset))
            else {
                continue;
            };
            let table = header.debug_abbrev_offset().0;
            if !*refer_out
                .entry(table)
                .or_insert_with(|| may_refer_out(dwarf, &header))
            {
                continue;
            }
            let Ok(abbreviations) = dwarf.abbreviations(&header) else {
                continue;
            };
            let mut entries = header.entries(&abbreviations);
            while let Ok(Some(entry)) = entries.next_dfs() {
                for name in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
                    let Some(gimli::AttributeValue::DebugInfoRef(to)) = entry.attr_value(name)
                    else {
                        continue;
                    };
                    let Some(j) = unit_of(to.0) else { continue };
                    let target = offsets[j];
                    if self.kept(target) {
                        continue;
                    }
                    self.needed.insert(target);
                    match readable(target) {
                        true => work.push(j),
                        false => unread = true,
                    }
                }
            }
        }
        unread
    }
}

/// Whether the abbreviations of the unit of `header` let an entry give its
/// `DW_AT_abstract_origin` or `DW_AT_specification` in another unit (as
/// `DW_FORM_ref_addr`, or a form the entry chooses): only then does
/// [`Units::add_referenced`] read its entries. GCC's units of C refer within themselves
/// alone (`DW_FORM_ref4`): reading the entries of libc's units kept for a profile to
/// find none took a millisecond a run. `true` when the table cannot be read.
fn may_refer_out(dwarf: &gimli::Dwarf<Reader>, header: &gimli::UnitHeader<Reader>) -> bool {
    use gimli::constants::*;
    use gimli::{Reader as _, Section as _};
    let mut table = dwarf.debug_abbrev.reader().clone();
    let read = |table: &mut Reader| -> gimli::Result<bool> {
        table.skip(header.debug_abbrev_offset().0)?;
        // Each abbreviation: its code (0 ends the table), tag and children flag, then
        // (attribute, form) pairs up to (0, 0).
        while table.read_uleb128()? != 0 {
            table.read_uleb128()?;
            table.read_u8()?;
            loop {
                let (name, form) = (table.read_uleb128()?, table.read_uleb128()?);
                if (name, form) == (0, 0) {
                    break;
                }
                let (name, form) = (DwAt(name as u16), DwForm(form as u16));
                if form == DW_FORM_implicit_const {
                    table.read_sleb128()?;
                }
                let named = name == DW_AT_abstract_origin || name == DW_AT_specification;
                if named && (form == DW_FORM_ref_addr || form == DW_FORM_indirect) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    };
    read(&mut table).unwrap_or(true)
}

/// The offsets of the units of `dwarf`'s `.debug_info`.
fn unit_offsets(dwarf: &gimli::Dwarf<Reader>) -> impl Iterator<Item = usize> + '_ {
    let mut units = dwarf.units();
    std::iter::from_fn(move || units.next().ok().flatten())
        .filter_map(|header| header.debug_info_offset().map(|o| o.0))
}

/// The address ranges of the unit of `header` as its root gives them (`DW_AT_low_pc`
/// with `DW_AT_high_pc`, or `DW_AT_ranges`), read without parsing its line program (as
/// `gimli::Unit` would); `None` when the root gives none or they cannot be read.
fn root_ranges(
    dwarf: &gimli::Dwarf<Reader>,
    header: &gimli::UnitHeader<Reader>,
) -> Option<Vec<gimli::Range>> {
    use gimli::AttributeValue as Value;
    let abbreviations = dwarf.abbreviations(header).ok()?;
    let mut entries = header.entries(&abbreviations);
    let root = entries.next_dfs().ok()??;
    let encoding = header.encoding();
    let addr_base = match root.attr_value(gimli::DW_AT_addr_base) {
        Some(Value::DebugAddrBase(base)) => base,
        _ => gimli::DebugAddrBase(0),
    };
    let address = |value: Value<Reader>| match value {
        Value::Addr(address) => Some(address),
        Value::DebugAddrIndex(index) => dwarf
            .debug_addr
            .get_address(encoding.address_size, addr_base, index)
            .ok(),
        _ => None,
    };
    let low_pc = root.attr_value(gimli::DW_AT_low_pc).and_then(address);
    let Some(list) = root.attr_value(gimli::DW_AT_ranges) else {
        let high_pc = match root.attr_value(gimli::DW_AT_high_pc)? {
            Value::Udata(length) => low_pc?.checked_add(length)?,
            value => address(value)?,
        };
        return Some(vec![gimli::Range {
            begin: low_pc?,
            end: high_pc,
        }]);
    };
    let rnglists_base = match root.attr_value(gimli::DW_AT_rnglists_base) {
        Some(Value::DebugRngListsBase(base)) => base,
        _ => gimli::DebugRngListsBase::default_for_encoding_and_file(encoding, dwarf.file_type),
    };
    let offset = match list {
        Value::RangeListsRef(raw)
            if dwarf.file_type == gimli::DwarfFileType::Dwo && encoding.version < 5 =>
        {
            gimli::RangeListsOffset(raw.0.wrapping_add(rnglists_base.0))
        }
        Value::RangeListsRef(raw) => gimli::RangeListsOffset(raw.0),
        Value::DebugRngListsIndex(index) => dwarf
            .ranges
            .get_offset(encoding, rnglists_base, index)
            .ok()?,
        _ => return None,
    };
    let mut list = dwarf
        .ranges
        .ranges(
            offset,
            encoding,
            low_pc.unwrap_or(0),
            &dwarf.debug_addr,
            addr_base,
        )
        .ok()?;
    let mut ranges = Vec::new();
    while let Some(range) = list.next().ok()? {
        ranges.push(range);
    }
    Some(ranges)
}

/// `.debug_info` with only the compilation units `kept` keeps (those lookups of a set
/// of addresses need) left as they are, for a section read whole: each other unit listed
/// (see [`Units`]) keeps its place and header but points at [`LEFT_OUT_ABBREVIATIONS`]
/// (at `appended` in `.debug_abbrev` when it was appended as the section was loaded,
/// else to be appended) and has its entries reduced to that table's one entry, so that
/// `addr2line` passes over it (a unit with an empty root) without parsing its
/// abbreviations and line program. libc's debug file has some 2,000 units, whose
/// abbreviations alone take about 15 MB once parsed, and a profile's addresses lie in a
/// few dozen. Units not listed (the table may miss some) are untouched, and offsets are
/// kept, so references between units still point where they did. Returned as the changes
/// to make (see [`LeaveOut::apply`]); `None` when nothing would be left out, or the
/// layout is not the usual one (32-bit DWARF).
fn only_units_for(
    dwarf: &gimli::Dwarf<Reader>,
    kept: &Units,
    appended: Option<u32>,
) -> Option<LeaveOut> {
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
            left_out.push(LeftOut { abbrev_at, entries });
        }
    }
    use gimli::Section as _;
    let table = match appended {
        Some(table) => table,
        None => u32::try_from(dwarf.debug_abbrev.reader().len()).ok()?,
    };
    (!left_out.is_empty()).then_some(LeaveOut {
        table,
        append: appended.is_none(),
        left_out,
    })
}

/// Leaves out of `sections`' `.debug_info` the units that `kept` does not keep, nor the
/// units it keeps refer to ([`keep_referenced`]); `read`: the bytes `.debug_info` was
/// read into when a buffer of its own, and where its units start when runs of the units
/// left out were stood in for ([`stand_in`]); `appended`: where
/// [`LEFT_OUT_ABBREVIATIONS`] lies in `.debug_abbrev`, when it was appended as the
/// section was loaded. How many units it left out.
pub(super) fn keep_only(
    sections: &mut gimli::Dwarf<Reader>,
    kept: &mut Units,
    read: (Option<Arc<[u8]>>, Option<Vec<usize>>),
    appended: Option<u32>,
    reread: &Reread<'_>,
    endian: RunTimeEndian,
) -> Result<usize, String> {
    let (mut own, mut starts) = read;
    if let Some((again, again_starts)) =
        keep_referenced(sections, kept, starts.as_deref(), reread, endian)?
    {
        (own, starts) = (Some(again), again_starts);
    }
    if let Some(starts) = starts {
        // Left out as it was read.
        return Ok(kept.left_out_of(&starts));
    }
    let Some(leave_out) = only_units_for(sections, kept, appended) else {
        return Ok(0);
    };
    leave_out.leave_out_of(sections, kept, own, reread, endian)
}

/// How many times `.debug_info` is read again for units that kept units refer to (a unit
/// may refer to one left out, which refers on to another): the last of these reads keeps
/// every unit, so that a long chain of references (a damaged or hostile file) costs at
/// most this many reads of the section, not one per link.
const MAX_REREADS: usize = 4;

/// Adds to `kept` the units that kept units refer to ([`Units::add_referenced`]). When
/// `.debug_info` was read keeping only the units kept then (`starts`: where every unit
/// starts), reads it again with `reread` while a unit referred to was not read (at most
/// [`MAX_REREADS`] times), and gives what it read last (now `sections`' `.debug_info`).
fn keep_referenced(
    sections: &mut gimli::Dwarf<Reader>,
    kept: &mut Units,
    starts: Option<&[usize]>,
    reread: &Reread<'_>,
    endian: RunTimeEndian,
) -> Result<Option<InfoRead>, String> {
    let kept_of = |starts: &[usize], kept: &Units| -> HashSet<usize> {
        starts.iter().copied().filter(|&u| kept.kept(u)).collect()
    };
    // The units read whole; `None`: all.
    let mut read_whole = starts.map(|s| kept_of(s, kept));
    let mut scanned = HashSet::new();
    let mut last: Option<InfoRead> = None;
    for round in 1.. {
        let readable = |unit: usize| read_whole.as_ref().is_none_or(|r| r.contains(&unit));
        // Where the units of the section read last start.
        let now = last.as_ref().map_or(starts, |(_, again)| again.as_deref());
        if !kept.add_referenced(sections, now, &mut scanned, &readable) {
            break;
        }
        if round == MAX_REREADS {
            // A chain of references each found only once the last is read: every unit.
            kept.listed.clear();
        }
        let (own, again) = reread(kept)?;
        sections.debug_info = EndianArcSlice::new(own.clone(), endian).into();
        read_whole = again.as_deref().map(|s| kept_of(s, kept));
        last = Some((own, again));
        if round == MAX_REREADS {
            break;
        }
    }
    Ok(last)
}

/// `.debug_line` (`section`) read with `read_units` keeping only the line programs of
/// the units of `sections` (else whole, with `read`): nothing stands in for the others,
/// as line programs are read only where a unit points.
pub(super) fn line_programs_read<'d>(
    sections: &gimli::Dwarf<Reader>,
    section: &Section<'d>,
    read_units: &ReadUnits<'d, '_>,
    read: &dyn Fn(&Section<'d>) -> Result<Loaded, String>,
    endian: RunTimeEndian,
) -> Result<gimli::DebugLine<Reader>, String> {
    let sparse = match line_programs(sections) {
        Some(programs) => read_units(section, &|at| programs.contains(&at), &|_| true)?,
        None => None,
    };
    Ok(match sparse {
        Some((own, _)) => EndianArcSlice::new(own, endian).into(),
        None => read(section)?.0.into(),
    })
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
/// [`LEFT_OUT_ABBREVIATIONS`] lies (its end, when `append`: it is yet to be appended),
/// and for each unit where its abbreviation offset lies and its entries.
struct LeaveOut {
    table: u32,
    append: bool,
    left_out: Vec<LeftOut>,
}

/// One unit left out of `.debug_info`: where its abbreviation offset lies, and its
/// entries (after its header, to its end).
struct LeftOut {
    abbrev_at: usize,
    entries: Range<usize>,
}

impl LeaveOut {
    /// Makes the changes in `info` (`.debug_info`, whole), or none when it is not the
    /// section they were found in (one of them would lie outside it).
    fn apply(&self, info: &mut [u8]) {
        let fits = |r: &Range<usize>| r.start < r.end && r.end <= info.len();
        if !self
            .left_out
            .iter()
            .all(|u| fits(&(u.abbrev_at..u.abbrev_at + 4)) && fits(&u.entries))
        {
            return;
        }
        for LeftOut { abbrev_at, entries } in &self.left_out {
            info[*abbrev_at..abbrev_at + 4].copy_from_slice(&self.table.to_le_bytes());
            info[entries.clone()].fill(0);
            info[entries.start] = LEFT_OUT_ABBREVIATIONS[0];
        }
    }

    /// Leaves the units out of `sections`' `.debug_info` (read whole: `own`, when a
    /// buffer of its own): read again keeping only the units `kept` keeps where it can, so
    /// that the units left out take no memory (each run of them a [`stand_in`]), else
    /// changed in a copy of its own. How many units it left out.
    fn leave_out_of(
        &self,
        sections: &mut gimli::Dwarf<Reader>,
        kept: &Units,
        own: Option<Arc<[u8]>>,
        reread: &Reread<'_>,
        endian: RunTimeEndian,
    ) -> Result<usize, String> {
        use gimli::Section as _;
        let empty = EndianArcSlice::new(Arc::from(&[][..]), endian);
        // The whole section is let go before the units kept are read.
        drop(std::mem::replace(&mut sections.debug_info, empty.into()));
        drop(own);
        let (mut info, starts) = reread(kept)?;
        let left_out = match &starts {
            Some(starts) => kept.left_out_of(starts),
            None => {
                self.apply(Arc::make_mut(&mut info));
                self.left_out.len()
            }
        };
        sections.debug_info = EndianArcSlice::new(info, endian).into();
        if self.append {
            let abbrev = with_left_out_abbreviations(sections.debug_abbrev.reader().bytes());
            sections.debug_abbrev = EndianArcSlice::new(abbrev, endian).into();
        }
        sections.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
        Ok(left_out)
    }
}

/// `abbrev` (`.debug_abbrev`'s bytes) with [`LEFT_OUT_ABBREVIATIONS`] appended, at its
/// end.
pub(super) fn with_left_out_abbreviations(abbrev: &[u8]) -> Arc<[u8]> {
    abbrev
        .iter()
        .chain(&LEFT_OUT_ABBREVIATIONS)
        .copied()
        .collect()
}
