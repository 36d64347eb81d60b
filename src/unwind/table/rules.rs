//! The rules of one row of gimli's evaluated CFI, as the table's rules: what the kernel's
//! walker can follow kept as it is, the PLT's expression recognised, the rest marked.

use gimli::{CfaRule, Encoding, Operation, Reader, RegisterRule, UnwindSection, X86_64};

use super::row::{Cfa, Rbp, ReturnAddress, Unsupported};

/// The table's rules for a row of gimli's table, in an FDE whose CIE is (or is not) a
/// signal trampoline's.
pub(super) fn convert<R: Reader, S: gimli::UnwindContextStorage<R::Offset>>(
    section: &impl UnwindSection<R>,
    encoding: Encoding,
    signal_frame: bool,
    row: &gimli::UnwindTableRow<R::Offset, S>,
) -> (Cfa, ReturnAddress, Rbp) {
    let cfa = if signal_frame {
        Cfa::SignalFrame
    } else {
        cfa_rule(section, encoding, row.cfa())
    };
    let ra = match row.register(X86_64::RA) {
        None | Some(RegisterRule::Undefined) => ReturnAddress::Outermost,
        Some(RegisterRule::Offset(-8)) => ReturnAddress::AtCfaMinus8,
        Some(_) => ReturnAddress::Unknown,
    };
    let rbp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => Rbp::Unchanged,
        Some(RegisterRule::Offset(o)) => i16::try_from(o).map_or(Rbp::Unknown, Rbp::AtCfa),
        Some(_) => Rbp::Unknown,
    };
    (cfa, ra, rbp)
}

fn cfa_rule<R: Reader>(
    section: &impl UnwindSection<R>,
    encoding: Encoding,
    rule: &CfaRule<R::Offset>,
) -> Cfa {
    match rule {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(offset) = i32::try_from(*offset) else {
                return Cfa::Unsupported(Unsupported::Offset);
            };
            match *register {
                X86_64::RSP => Cfa::Rsp(offset),
                X86_64::RBP => Cfa::Rbp(offset),
                _ => Cfa::Unsupported(Unsupported::Register),
            }
        }
        CfaRule::Expression(expression) => expression
            .get(section)
            .ok()
            .and_then(|e| plt_rule(e, encoding))
            .unwrap_or(Cfa::Unsupported(Unsupported::Expression)),
    }
}

/// The PLT's rule when `expression` is the linker's expression for PLT stubs (see
/// [`Cfa::Plt`]).
fn plt_rule<R: Reader>(expression: gimli::Expression<R>, encoding: Encoding) -> Option<Cfa> {
    /// The expression's length in operations.
    const OPERATIONS: usize = 9;
    let mut ops = Vec::with_capacity(OPERATIONS);
    let mut iter = expression.operations(encoding);
    while let Some(op) = iter.next().ok()? {
        if ops.len() == OPERATIONS {
            return None;
        }
        ops.push(op);
    }
    use Operation::{And, Ge, Plus, RegisterOffset, Shl, UnsignedConstant};
    match ops.as_slice() {
        [RegisterOffset {
            register: X86_64::RSP,
            offset,
            ..
        }, RegisterOffset {
            register: X86_64::RA,
            offset: 0,
            ..
        }, UnsignedConstant { value: 15 }, And, UnsignedConstant { value: threshold }, Ge, UnsignedConstant { value: 3 }, Shl, Plus] => {
            Some(Cfa::Plt {
                offset: i32::try_from(*offset).ok()?,
                threshold: u8::try_from(*threshold).ok().filter(|&t| t < 16)?,
            })
        }
        _ => None,
    }
}
