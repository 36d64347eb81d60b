//! The addresses unwinding produces: a code address marked as the sampled instruction or
//! a return address, the unwound stack of one sample, and the reading of the kernel's
//! callchains into them.

use crate::events::Sample;

use super::truncation::Truncation;

/// A code address found on a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CodeAddress {
    /// The instruction that was executing when the sample was taken.
    InstructionPointer(u64),
    /// A return address: the instruction after a call. It belongs to the call, so it is
    /// looked up at `address - 1`; otherwise a call that ends a function or a line would
    /// be attributed to the next one.
    ReturnAddress(u64),
}

impl CodeAddress {
    /// The address to look up in symbol and line tables.
    pub fn lookup_address(self) -> u64 {
        match self {
            CodeAddress::InstructionPointer(a) => a,
            CodeAddress::ReturnAddress(a) => a.saturating_sub(1),
        }
    }

    pub fn raw(self) -> u64 {
        match self {
            CodeAddress::InstructionPointer(a) | CodeAddress::ReturnAddress(a) => a,
        }
    }
}

/// The unwound stack of one sample, each part leaf first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnwoundStack {
    pub kernel: Vec<CodeAddress>,
    pub user: Vec<CodeAddress>,
    /// Why the outermost frames are missing, if they are.
    pub truncated: Option<Truncation>,
    /// A caller the frame-pointer chain skipped was restored from the stack copy.
    pub restored_leaf_caller: bool,
}

/// A part of a sample's callchain without the zero entries the kernel leaves where its
/// walk found nothing.
pub(super) fn callchain(addresses: &[u64]) -> Vec<u64> {
    addresses.iter().copied().filter(|&a| a != 0).collect()
}

/// The kernel part of a sample's callchain, leaf first.
pub(super) fn kernel_frames(sample: &Sample) -> Vec<CodeAddress> {
    leaf_first(&callchain(&sample.kernel_callchain))
}

/// Marks a leaf-first list of addresses: the first is the sampled instruction, every
/// other one the return address of a call.
pub(super) fn leaf_first(addresses: &[u64]) -> Vec<CodeAddress> {
    let mut out: Vec<CodeAddress> = addresses
        .iter()
        .map(|&a| CodeAddress::ReturnAddress(a))
        .collect();
    if let Some(first) = out.first_mut() {
        *first = CodeAddress::InstructionPointer(first.raw());
    }
    out
}
