//! The table compiler on hand-made CFI (merged rows, gaps, overlapping FDEs, each kind of
//! rule), on damaged CFI, and at its limits; the walker's step by each kind of row. Its
//! agreement with framehop on real files is tested in `tests/offline/unwind_table.rs`.

use std::path::Path;

use gimli::{BaseAddresses, EhFrame, LittleEndian};

use super::compile::{build, TooLarge};
use super::*;

/// Call frame instructions and expression operations, as the bytes of `.eh_frame`.
mod op {
    pub const ADVANCE_LOC: u8 = 0x40;
    pub const OFFSET: u8 = 0x80;
    pub const UNDEFINED: u8 = 0x07;
    pub const REGISTER: u8 = 0x09;
    pub const DEF_CFA: u8 = 0x0c;
    pub const DEF_CFA_REGISTER: u8 = 0x0d;
    pub const DEF_CFA_OFFSET: u8 = 0x0e;
    pub const DEF_CFA_EXPRESSION: u8 = 0x0f;
    pub const RSP: u8 = 7;
    pub const RBP: u8 = 6;
    pub const RA: u8 = 16;
    /// binutils' CFA for `.plt` stubs: `DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15;
    /// DW_OP_and; DW_OP_lit11; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`.
    pub const PLT: [u8; 11] = [
        0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
    ];
}

/// A hand-made `.eh_frame`: CIEs (RA at CFA-8, CFA RSP+8 to start with, addresses as
/// absolute 4-byte values) and FDEs.
#[derive(Default)]
struct Cfi(Vec<u8>);

impl Cfi {
    /// Adds a CIE, of a signal trampoline's with `signal`; its offset.
    fn cie(&mut self, signal: bool) -> usize {
        let at = self.0.len();
        let mut body = vec![0, 0, 0, 0, 1];
        body.extend_from_slice(if signal { b"zRS\0" } else { b"zR\0" });
        // Code alignment 1, data alignment -8, RA register 16, augmentation data (1 byte:
        // DW_EH_PE_udata4).
        body.extend_from_slice(&[1, 0x78, op::RA, 1, 0x03]);
        body.extend_from_slice(&[op::DEF_CFA, op::RSP, 8, op::OFFSET | op::RA, 1]);
        self.entry(&body);
        at
    }

    /// Adds an FDE of `cie` for `start..start + len` with `instructions`.
    fn fde(&mut self, cie: usize, start: u32, len: u32, instructions: &[u8]) -> &mut Cfi {
        let pointer = (self.0.len() + 4 - cie) as u32;
        let mut body = pointer.to_le_bytes().to_vec();
        body.extend_from_slice(&start.to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        body.push(0);
        body.extend_from_slice(instructions);
        self.entry(&body);
        self
    }

    fn entry(&mut self, body: &[u8]) {
        self.0.extend_from_slice(&(body.len() as u32).to_le_bytes());
        self.0.extend_from_slice(body);
    }

    fn table(&self) -> UnwindTable {
        table_of(&self.0, MAX_ROWS).unwrap()
    }
}

fn table_of(bytes: &[u8], max_rows: usize) -> Result<UnwindTable, TooLarge> {
    let mut cfi = EhFrame::new(bytes, LittleEndian);
    cfi.set_address_size(8);
    let table = build(&cfi, &BaseAddresses::default(), max_rows, Vec::new())?;
    check_invariants(&table);
    Ok(table)
}

/// The invariants [`Row`] states, which every table keeps.
fn check_invariants(table: &UnwindTable) {
    let rows = &table.rows;
    assert!(rows.len() <= MAX_ROWS);
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        assert_eq!(first.start, 0, "the first row is at the base");
        assert_eq!(last.cfa, Cfa::NoEntry, "the last row ends the last FDE");
    }
    for pair in rows.windows(2) {
        assert!(pair[0].start < pair[1].start, "{pair:?}");
        assert!(!pair[0].same_rules(&pair[1]), "not merged: {pair:?}");
    }
    for row in rows {
        if row.cfa == Cfa::NoEntry {
            assert_eq!(*row, Row::no_entry(row.start));
        }
        assert_eq!(Row::from_bytes(&row.to_bytes()), Some(*row));
    }
    let bytes = table.to_bytes();
    assert_eq!(bytes.len(), rows.len() * ROW_BYTES);
}

fn row(start: u32, cfa: Cfa, rbp: Rbp) -> Row {
    Row {
        start,
        cfa,
        ra: ReturnAddress::AtCfaMinus8,
        rbp,
    }
}

#[test]
fn rows_merge_and_gaps_between_fdes_have_no_entry() {
    let mut cfi = Cfi::default();
    let cie = cfi.cie(false);
    // push %rbp; mov %rsp,%rbp; ...; leave; ret: then two adjacent functions with the
    // CIE's rules, whose rows merge, after a gap.
    cfi.fde(
        cie,
        0x1000,
        0x20,
        &[
            op::ADVANCE_LOC | 1,
            op::DEF_CFA_OFFSET,
            16,
            op::OFFSET | op::RBP,
            2,
            op::ADVANCE_LOC | 3,
            op::DEF_CFA_REGISTER,
            op::RBP,
            op::ADVANCE_LOC | 0x10,
            op::DEF_CFA,
            op::RSP,
            8,
        ],
    )
    .fde(cie, 0x1030, 0x10, &[])
    .fde(cie, 0x1040, 0x10, &[]);
    let table = cfi.table();
    assert_eq!((table.base, table.fdes, table.damaged), (0x1000, 3, 0));
    assert_eq!(
        table.rows,
        [
            row(0, Cfa::Rsp(8), Rbp::Unchanged),
            row(1, Cfa::Rsp(16), Rbp::AtCfa(-16)),
            row(4, Cfa::Rbp(16), Rbp::AtCfa(-16)),
            row(0x14, Cfa::Rsp(8), Rbp::AtCfa(-16)),
            Row::no_entry(0x20),
            row(0x30, Cfa::Rsp(8), Rbp::Unchanged),
            Row::no_entry(0x50),
        ]
    );
    let at = |a: u64| table.row_at(a).map(|r| r.start);
    assert_eq!(at(0xfff), None, "below the first FDE");
    assert_eq!(at(0x1000), Some(0));
    assert_eq!(at(0x101f), Some(0x14));
    assert_eq!(at(0x1020), Some(0x20), "past the first FDE: no entry");
    assert_eq!(at(0x104f), Some(0x30));
    assert_eq!(at(0x1050), Some(0x50));
    assert_eq!(at(u64::MAX), Some(0x50), "beyond 4 GiB from the base");
    assert_eq!(UnwindTable::default().row_at(0x1000), None);
}

#[test]
fn of_overlapping_fdes_the_later_start_wins_up_to_its_end() {
    let mut cfi = Cfi::default();
    let cie = cfi.cie(false);
    cfi.fde(
        cie,
        0x1000,
        0x40,
        &[op::ADVANCE_LOC | 0x20, op::DEF_CFA_OFFSET, 16],
    )
    .fde(cie, 0x1010, 8, &[op::DEF_CFA_OFFSET, 24]);
    // As a lookup in `.eh_frame_hdr` finds them: past the inner FDE's end, no entry,
    // though the outer one's range goes on.
    assert_eq!(
        cfi.table().rows,
        [
            row(0, Cfa::Rsp(8), Rbp::Unchanged),
            row(0x10, Cfa::Rsp(24), Rbp::Unchanged),
            Row::no_entry(0x18),
        ]
    );
}

#[test]
fn each_kind_of_rule_is_kept_or_marked() {
    let mut cfi = Cfi::default();
    let cie = cfi.cie(false);
    let signal = cfi.cie(true);
    let mut plt = vec![op::DEF_CFA_EXPRESSION, op::PLT.len() as u8];
    plt.extend_from_slice(&op::PLT);
    // The same expression, shifted by 4 instead of 3: not the PLT's.
    let mut other = plt.clone();
    other[2 + 8] = 0x34;
    cfi.fde(cie, 0x1000, 0x10, &plt)
        .fde(cie, 0x1010, 0x10, &other)
        .fde(signal, 0x1020, 0x10, &[])
        .fde(cie, 0x1030, 0x10, &[op::DEF_CFA, 10, 16])
        .fde(cie, 0x1040, 0x10, &[op::UNDEFINED, op::RA])
        .fde(cie, 0x1050, 0x10, &[op::REGISTER, op::RA, 5])
        .fde(cie, 0x1060, 0x10, &[op::REGISTER, op::RBP, 9]);
    let rules: Vec<(Cfa, ReturnAddress, Rbp)> = cfi
        .table()
        .rows
        .iter()
        .map(|r| (r.cfa, r.ra, r.rbp))
        .collect();
    use ReturnAddress::*;
    assert_eq!(
        rules,
        [
            (
                Cfa::Plt {
                    offset: 8,
                    threshold: 11
                },
                AtCfaMinus8,
                Rbp::Unchanged
            ),
            (
                Cfa::Unsupported(Unsupported::Expression),
                AtCfaMinus8,
                Rbp::Unchanged
            ),
            (Cfa::SignalFrame, AtCfaMinus8, Rbp::Unchanged),
            (
                Cfa::Unsupported(Unsupported::Register),
                AtCfaMinus8,
                Rbp::Unchanged
            ),
            (Cfa::Rsp(8), Outermost, Rbp::Unchanged),
            (Cfa::Rsp(8), Unknown, Rbp::Unchanged),
            (Cfa::Rsp(8), AtCfaMinus8, Rbp::Unknown),
            (Cfa::NoEntry, Unknown, Rbp::Unchanged),
        ]
    );
}

/// A stack whose word at `a` is `a + 1`.
fn stack(a: u64) -> Option<u64> {
    Some(a + 1)
}

#[test]
fn a_step_follows_each_kind_of_rule() {
    let regs = Regs {
        ip: 0x5000,
        sp: 0x7000,
        bp: Some(0x7100),
    };
    let step = |cfa, ra, rbp, regs: Regs| {
        Row {
            start: 0,
            cfa,
            ra,
            rbp,
        }
        .step(regs, &mut stack)
    };
    let caller = |ip, sp, bp| Step::Caller(Regs { ip, sp, bp });
    use ReturnAddress::*;
    assert_eq!(
        step(Cfa::Rsp(16), AtCfaMinus8, Rbp::AtCfa(-16), regs),
        caller(0x7009, 0x7010, Some(0x7001))
    );
    assert_eq!(
        step(Cfa::Rbp(16), AtCfaMinus8, Rbp::AtCfa(-16), regs),
        caller(0x7109, 0x7110, Some(0x7101))
    );
    assert_eq!(
        step(Cfa::Rsp(8), AtCfaMinus8, Rbp::Unknown, regs),
        caller(0x7001, 0x7008, None)
    );
    // RBP lost by an earlier step: an RBP-based CFA cannot be found.
    let lost = Regs { bp: None, ..regs };
    assert_eq!(
        step(Cfa::Rbp(16), AtCfaMinus8, Rbp::Unchanged, lost),
        Step::Stop(Stop::RbpLost)
    );
    assert_eq!(
        step(Cfa::Rsp(8), AtCfaMinus8, Rbp::Unchanged, lost),
        caller(0x7001, 0x7008, None)
    );
    // A PLT stub: before its `push` (at 11 of 16) the return address is at RSP, after
    // it above the pushed word.
    let plt = Cfa::Plt {
        offset: 8,
        threshold: 11,
    };
    let at = |ip| Regs { ip, ..regs };
    assert_eq!(
        step(plt, AtCfaMinus8, Rbp::Unchanged, at(0x502a)),
        caller(0x7001, 0x7008, Some(0x7100))
    );
    assert_eq!(
        step(plt, AtCfaMinus8, Rbp::Unchanged, at(0x502b)),
        caller(0x7009, 0x7010, Some(0x7100))
    );
    // The signal frame's ucontext: RIP at 168, RSP at 160, RBP at 120.
    assert_eq!(
        step(Cfa::SignalFrame, Unknown, Rbp::Unknown, regs),
        Step::Interrupted(Regs {
            ip: 0x70a9,
            sp: 0x70a1,
            bp: Some(0x7079)
        })
    );
    assert_eq!(
        step(Cfa::Rsp(8), Outermost, Rbp::Unchanged, regs),
        Step::Outermost
    );
    for (cfa, ra, why) in [
        (Cfa::NoEntry, Unknown, Stop::NoEntry),
        (
            Cfa::Unsupported(Unsupported::Expression),
            AtCfaMinus8,
            Stop::Unsupported(Unsupported::Expression),
        ),
        (Cfa::Rsp(8), Unknown, Stop::ReturnAddressUnknown),
    ] {
        assert_eq!(step(cfa, ra, Rbp::Unchanged, regs), Step::Stop(why));
    }
    // An unreadable stack, and an address that overflows.
    let row = row(0, Cfa::Rsp(8), Rbp::Unchanged);
    assert_eq!(row.step(regs, &mut |_| None), Step::Stop(Stop::Unreadable));
    let top = Regs {
        sp: u64::MAX - 4,
        ..regs
    };
    assert_eq!(row.step(top, &mut stack), Step::Stop(Stop::Unreadable));
}

#[test]
fn rows_round_trip_through_their_bytes() {
    let rows = [
        Row::no_entry(7),
        Row {
            start: 0xffff_fff0,
            cfa: Cfa::Plt {
                offset: 8,
                threshold: 10,
            },
            ra: ReturnAddress::AtCfaMinus8,
            rbp: Rbp::Unchanged,
        },
        Row {
            start: 1,
            cfa: Cfa::Rbp(-0x7fff_0000),
            ra: ReturnAddress::Outermost,
            rbp: Rbp::AtCfa(-32768),
        },
    ];
    for row in rows {
        assert_eq!(Row::from_bytes(&row.to_bytes()), Some(row));
    }
    assert_eq!(
        row(0x0403_0201, Cfa::Rsp(16), Rbp::AtCfa(-16)).to_bytes(),
        [1, 2, 3, 4, 16, 0, 0, 0, 0xf0, 0xff, 1, 1 | 1 << 2]
    );
    // Bytes the layout never has: an unknown kind, an RBP offset without its rule.
    let mut bytes = Row::no_entry(0).to_bytes();
    bytes[10] = 9;
    assert_eq!(Row::from_bytes(&bytes), None);
    let mut bytes = row(0, Cfa::Rsp(8), Rbp::Unchanged).to_bytes();
    bytes[8] = 1;
    assert_eq!(Row::from_bytes(&bytes), None);
}

/// A deterministic sequence of numbers (xorshift).
fn noise(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

#[test]
fn damaged_cfi_gives_no_rule_it_does_not_hold_and_never_panics() {
    let mut cfi = Cfi::default();
    let cie = cfi.cie(false);
    cfi.fde(
        cie,
        0x1000,
        0x20,
        &[op::ADVANCE_LOC | 4, op::DEF_CFA_OFFSET, 16],
    )
    .fde(
        cie,
        0x1020,
        0x20,
        &[op::ADVANCE_LOC | 8, op::DEF_CFA_OFFSET, 24],
    )
    .fde(
        cie,
        0x1040,
        0x20,
        &[op::ADVANCE_LOC | 2, op::DEF_CFA_OFFSET, 32],
    );
    let whole = cfi.table();
    // Cut anywhere: the FDEs that remain whole keep their rules, every other address
    // has no entry.
    for len in 0..cfi.0.len() {
        let cut = table_of(&cfi.0[..len], MAX_ROWS).unwrap();
        for a in 0x1000..0x1060 {
            if let Some(row) = cut.row_at(a).filter(|r| r.cfa != Cfa::NoEntry) {
                assert!(
                    whole.row_at(a).unwrap().same_rules(row),
                    "cut at {len}: {a:#x}"
                );
            }
        }
        assert!(len == cfi.0.len() || cut.fdes < 3 || cut.damaged > 0);
    }
    // Any byte changed to any value, then random bytes of libc's `.eh_frame`: rows
    // that keep the invariants, no panic.
    for at in 0..cfi.0.len() {
        for value in [0, 1, 0x7f, 0x80, 0xff] {
            let mut bytes = cfi.0.clone();
            bytes[at] = value;
            let _ = table_of(&bytes, MAX_ROWS);
        }
    }
    let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let elf = crate::files::elf::Elf::parse(&*data).unwrap();
    let section = elf.section(".eh_frame").unwrap();
    let eh_frame = crate::files::elf::section_data(&elf, &section).unwrap();
    let mut next = noise(0x5eed);
    for _ in 0..40 {
        let mut bytes = eh_frame.to_vec();
        for _ in 0..1 + next() % 64 {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = next() as u8;
        }
        let mut cfi = EhFrame::new(&bytes[..], LittleEndian);
        cfi.set_address_size(8);
        let bases = BaseAddresses::default().set_eh_frame(section.address());
        if let Ok(table) = build(&cfi, &bases, MAX_ROWS, Vec::new()) {
            check_invariants(&table);
        }
    }
}

#[test]
fn tables_beyond_the_limits_are_refused_with_one_line_naming_the_file() {
    let mut cfi = Cfi::default();
    let cie = cfi.cie(false);
    cfi.fde(
        cie,
        0x1000,
        0x20,
        &[op::ADVANCE_LOC | 4, op::DEF_CFA_OFFSET, 16],
    );
    assert_eq!(table_of(&cfi.0, 3).unwrap().rows.len(), 3);
    assert!(matches!(table_of(&cfi.0, 2), Err(TooLarge::Rows(2))));
    // Functions more than 4 GiB apart, more than a row's 32-bit offset spans (a 4-byte
    // address reaches there with its length).
    let mut far = Cfi::default();
    let cie = far.cie(false);
    far.fde(cie, 0x1000, 0x10, &[]);
    far.fde(cie, 0xffff_f000, 0x2000, &[]);
    assert!(matches!(table_of(&far.0, MAX_ROWS), Err(TooLarge::Span)));
    for why in [TooLarge::Rows(MAX_ROWS), TooLarge::Span] {
        assert!(!why.to_string().contains('\n'));
    }
    let path = Path::new("/some/lib.so");
    assert_eq!(
        compile(path, &b"not ELF"[..]).unwrap_err(),
        "/some/lib.so: not a 64-bit ELF file"
    );
}

#[test]
fn libc_has_its_plt_and_signal_frame_rules() {
    let path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let data = std::fs::read(path).unwrap();
    let table = compile(path, &*data).unwrap();
    check_invariants(&table);
    assert!(table.fdes > 2000 && table.damaged == 0, "{table:?}");
    assert!(table.rows.len() > table.fdes);
    assert!(table
        .rows
        .iter()
        .any(|r| matches!(r.cfa, Cfa::Plt { offset: 8, .. })));
    assert!(table.rows.iter().any(|r| r.cfa == Cfa::SignalFrame));
}

#[test]
fn tables_made_as_bytes_are_the_bytes_of_the_tables_made_as_rows() {
    // libc, and this test binary.
    let own = std::env::current_exe().unwrap();
    for path in [Path::new("/lib/x86_64-linux-gnu/libc.so.6"), own.as_path()] {
        let data = std::fs::read(path).unwrap();
        let rows = compile(path, &*data).unwrap();
        let bytes = compile_as::<RowBytes, _>(path, &*data).unwrap();
        assert!(rows.rows.len() > 1000, "{}", path.display());
        assert_eq!(
            bytes.rows.into_bytes(),
            rows.to_bytes(),
            "{}",
            path.display()
        );
        assert_eq!(
            (bytes.base, bytes.fdes, bytes.damaged),
            (rows.base, rows.fdes, rows.damaged)
        );
    }
}
