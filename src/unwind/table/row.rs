//! One row of an unwind table: the rules that hold from its address to the next row's,
//! as a Rust value and as the 12 bytes a BPF map holds, and one unwinding step by them.

use super::super::signal;

/// The bytes of one row in a BPF map (see [`Row::to_bytes`]): 12, with no padding (cc1's
/// 478,579 rows take 5.7 MB).
pub const ROW_BYTES: usize = 12;

/// How the canonical frame address (CFA, the caller's stack pointer) is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cfa {
    /// No FDE covers the address: the table has no rule for it (between functions, past
    /// the last one, or the rest of an FDE whose instructions could not be read).
    NoEntry,
    /// RSP + offset.
    Rsp(i32),
    /// RBP + offset.
    Rbp(i32),
    /// A PLT stub's rule, which the linker writes as one DWARF expression for all the
    /// stubs of `.plt`: RSP + `offset`, plus 8 where the instruction's place in its
    /// 16-byte stub, `RIP & 15`, is at or past `threshold` (after the stub's `push`).
    /// binutils writes `DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and;
    /// DW_OP_litN; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`, N the offset past the
    /// stub's `push` (11 in the classic stub: a 6-byte `jmp *GOT`, a 5-byte `push`).
    Plt { offset: i32, threshold: u8 },
    /// The kernel's signal frame, whose FDE's CIE has the `S` augmentation (libc's
    /// `__restore_rt`): the interrupted code's registers are in the `ucontext` at RSP
    /// (as the unwinder's signal module reads them), not found by a CFA.
    SignalFrame,
    /// A rule the kernel's walker cannot follow.
    Unsupported(Unsupported),
}

/// Why a CFA rule is one the kernel's walker cannot follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unsupported {
    /// A DWARF expression other than the PLT's.
    Expression,
    /// An offset from a register other than RSP and RBP.
    Register,
    /// An offset from RSP or RBP beyond an `i32`.
    Offset,
}

/// Where the return address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReturnAddress {
    /// At CFA - 8, where `call` pushed it: the rule of every x86-64 function.
    AtCfaMinus8,
    /// Undefined: this is the outermost frame (`_start`, a thread's entry), no caller.
    Outermost,
    /// Any other rule: not recoverable by the kernel's walker.
    Unknown,
}

/// How the caller's RBP is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rbp {
    /// The function has not changed it (or the CFI says nothing of it).
    Unchanged,
    /// Saved at CFA + offset.
    AtCfa(i16),
    /// Any other rule: the caller's RBP is lost (later frames cannot use it).
    Unknown,
}

/// One row of a table: from `start` to the next row's start, these rules.
///
/// Invariants (kept by [`super::compile()`]): in a table, the first row starts at 0 (the
/// table's base) and rows are sorted by `start`, strictly increasing; two neighbours never have the same rules (they are merged); a row
/// with [`Cfa::NoEntry`] has `ReturnAddress::Unknown` and `Rbp::Unchanged`; the last row
/// of a table is a `NoEntry` row at the end of the last FDE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    /// The first address the row covers, as an offset from its table's
    /// [`super::UnwindTable::base`].
    pub start: u32,
    pub cfa: Cfa,
    pub ra: ReturnAddress,
    pub rbp: Rbp,
}

/// The kinds of CFA rule in a row's byte 10 (low four bits).
mod kind {
    pub const NO_ENTRY: u8 = 0;
    pub const RSP: u8 = 1;
    pub const RBP: u8 = 2;
    pub const PLT: u8 = 3;
    pub const SIGNAL_FRAME: u8 = 4;
    pub const UNSUPPORTED_EXPRESSION: u8 = 5;
    pub const UNSUPPORTED_REGISTER: u8 = 6;
    pub const UNSUPPORTED_OFFSET: u8 = 7;
}

impl Row {
    /// The rules of a row the table has no entry for (from `start`).
    pub fn no_entry(start: u32) -> Row {
        Row {
            start,
            cfa: Cfa::NoEntry,
            ra: ReturnAddress::Unknown,
            rbp: Rbp::Unchanged,
        }
    }

    /// Whether `other` has the same rules (whatever its start).
    pub fn same_rules(&self, other: &Row) -> bool {
        (self.cfa, self.ra, self.rbp) == (other.cfa, other.ra, other.rbp)
    }

    /// The row as a BPF map holds it, little-endian, 12 bytes:
    ///
    /// | bytes | field |
    /// | --- | --- |
    /// | 0..4 | `start`, u32 |
    /// | 4..8 | the CFA's offset, i32 (RSP, RBP or PLT; else 0) |
    /// | 8..10 | RBP's offset from the CFA, i16 (with RBP kind 1; else 0) |
    /// | 10 | bits 0–3: CFA kind (0 no entry, 1 RSP, 2 RBP, 3 PLT, 4 signal frame, 5–7 unsupported: expression, register, offset); bits 4–7: the PLT's threshold |
    /// | 11 | bits 0–1: return address (0 unknown, 1 at CFA-8, 2 outermost); bits 2–3: RBP (0 unchanged, 1 at CFA + offset, 2 unknown) |
    pub fn to_bytes(&self) -> [u8; ROW_BYTES] {
        let (cfa_kind, cfa_offset, threshold) = match self.cfa {
            Cfa::NoEntry => (kind::NO_ENTRY, 0, 0),
            Cfa::Rsp(o) => (kind::RSP, o, 0),
            Cfa::Rbp(o) => (kind::RBP, o, 0),
            Cfa::Plt { offset, threshold } => (kind::PLT, offset, threshold),
            Cfa::SignalFrame => (kind::SIGNAL_FRAME, 0, 0),
            Cfa::Unsupported(Unsupported::Expression) => (kind::UNSUPPORTED_EXPRESSION, 0, 0),
            Cfa::Unsupported(Unsupported::Register) => (kind::UNSUPPORTED_REGISTER, 0, 0),
            Cfa::Unsupported(Unsupported::Offset) => (kind::UNSUPPORTED_OFFSET, 0, 0),
        };
        let ra = match self.ra {
            ReturnAddress::Unknown => 0,
            ReturnAddress::AtCfaMinus8 => 1,
            ReturnAddress::Outermost => 2,
        };
        let (rbp, rbp_offset) = match self.rbp {
            Rbp::Unchanged => (0, 0),
            Rbp::AtCfa(o) => (1, o),
            Rbp::Unknown => (2, 0),
        };
        let mut out = [0; ROW_BYTES];
        out[0..4].copy_from_slice(&self.start.to_le_bytes());
        out[4..8].copy_from_slice(&cfa_offset.to_le_bytes());
        out[8..10].copy_from_slice(&rbp_offset.to_le_bytes());
        out[10] = cfa_kind | (threshold & 0x0f) << 4;
        out[11] = ra | rbp << 2;
        out
    }

    /// The row that [`Row::to_bytes`] wrote; `None` for bytes it never writes.
    pub fn from_bytes(bytes: &[u8; ROW_BYTES]) -> Option<Row> {
        let word = |at: usize| {
            i32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let start = word(0) as u32;
        let cfa_offset = word(4);
        let rbp_offset = i16::from_le_bytes([bytes[8], bytes[9]]);
        let threshold = bytes[10] >> 4;
        let cfa = match bytes[10] & 0x0f {
            kind::NO_ENTRY => Cfa::NoEntry,
            kind::RSP => Cfa::Rsp(cfa_offset),
            kind::RBP => Cfa::Rbp(cfa_offset),
            kind::PLT => Cfa::Plt {
                offset: cfa_offset,
                threshold,
            },
            kind::SIGNAL_FRAME => Cfa::SignalFrame,
            kind::UNSUPPORTED_EXPRESSION => Cfa::Unsupported(Unsupported::Expression),
            kind::UNSUPPORTED_REGISTER => Cfa::Unsupported(Unsupported::Register),
            kind::UNSUPPORTED_OFFSET => Cfa::Unsupported(Unsupported::Offset),
            _ => return None,
        };
        let ra = match bytes[11] & 0x03 {
            0 => ReturnAddress::Unknown,
            1 => ReturnAddress::AtCfaMinus8,
            2 => ReturnAddress::Outermost,
            _ => return None,
        };
        let rbp = match bytes[11] >> 2 {
            0 => Rbp::Unchanged,
            1 => Rbp::AtCfa(rbp_offset),
            2 => Rbp::Unknown,
            _ => return None,
        };
        let row = Row {
            start,
            cfa,
            ra,
            rbp,
        };
        (row.to_bytes() == *bytes).then_some(row)
    }

    /// One unwinding step by this row's rules from the frame whose registers are `regs`
    /// (`regs.ip` the frame's own instruction in the process, whose table row this is;
    /// the PLT's rule reads its low 4 bits): what the kernel's walker does, in Rust.
    /// `read` reads the stack word at an address.
    pub fn step(&self, regs: Regs, read: &mut dyn FnMut(u64) -> Option<u64>) -> Step {
        let base = match self.cfa {
            Cfa::NoEntry => return Step::Stop(Stop::NoEntry),
            Cfa::Unsupported(why) => return Step::Stop(Stop::Unsupported(why)),
            Cfa::SignalFrame => {
                let mut read_stack = |a: u64| read(a).ok_or(());
                return match signal::interrupted(regs.sp, &mut read_stack) {
                    Some(at) => Step::Interrupted(Regs {
                        ip: at.ip,
                        sp: at.sp,
                        bp: Some(at.bp),
                    }),
                    None => Step::Stop(Stop::Unreadable),
                };
            }
            Cfa::Rsp(o) => regs.sp.checked_add_signed(i64::from(o)),
            Cfa::Rbp(o) => match regs.bp {
                Some(bp) => bp.checked_add_signed(i64::from(o)),
                None => return Step::Stop(Stop::RbpLost),
            },
            Cfa::Plt { offset, threshold } => {
                let pushed = if regs.ip & 15 >= u64::from(threshold) {
                    8
                } else {
                    0
                };
                regs.sp
                    .checked_add_signed(i64::from(offset))
                    .and_then(|a| a.checked_add(pushed))
            }
        };
        let Some(cfa) = base else {
            return Step::Stop(Stop::Unreadable);
        };
        match self.ra {
            ReturnAddress::AtCfaMinus8 => {}
            ReturnAddress::Outermost => return Step::Outermost,
            ReturnAddress::Unknown => return Step::Stop(Stop::ReturnAddressUnknown),
        }
        let Some(ip) = cfa.checked_sub(8).and_then(&mut *read) else {
            return Step::Stop(Stop::Unreadable);
        };
        let bp = match self.rbp {
            Rbp::Unchanged => regs.bp,
            Rbp::AtCfa(o) => match cfa.checked_add_signed(i64::from(o)).and_then(&mut *read) {
                Some(bp) => Some(bp),
                None => return Step::Stop(Stop::Unreadable),
            },
            Rbp::Unknown => None,
        };
        Step::Caller(Regs { ip, sp: cfa, bp })
    }
}

/// The registers an unwinding step needs: the frame's instruction, stack pointer and
/// frame pointer (`None` once a step has lost it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: Option<u64>,
}

/// What one step by a row found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The caller's registers; `ip` is a return address.
    Caller(Regs),
    /// Through a signal frame: the interrupted code's registers; `ip` is where it
    /// resumes, not a return address.
    Interrupted(Regs),
    /// The frame is the outermost one.
    Outermost,
    /// The step cannot be taken.
    Stop(Stop),
}

/// Why a step cannot be taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    NoEntry,
    Unsupported(Unsupported),
    ReturnAddressUnknown,
    /// The CFA is RBP-based and an earlier step lost RBP.
    RbpLost,
    /// The stack could not be read where the rules say (or an address overflowed).
    Unreadable,
}
