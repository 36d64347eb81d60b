//! The unwinding modes (hybrid, frame pointers, CFI) and the stack copy each needs: what
//! the command line chooses and the recording asks the kernel for.

/// How the user part of stacks is unwound (docs/design.md §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnwindMode {
    /// CFI through the stack copy, then the frame-pointer chain beyond it.
    #[default]
    Hybrid,
    /// The kernel's frame-pointer chain only (with the frameless-leaf repair).
    Fp,
    /// CFI through the stack copy only.
    Dwarf,
}

/// Bytes of user stack copied with every sample in frame-pointer mode. The copy lets the
/// unwinder read the return address of a frameless leaf function (one that has not
/// pushed RBP, which gcc does for every -O2 leaf even with -fno-omit-frame-pointer): it
/// lies at `sp + CFA offset - 8`, and 512 bytes cover leaves with up to ~500 bytes of
/// locals while keeping a sample record around 700 bytes.
const FP_STACK_COPY_BYTES: u32 = 512;

impl UnwindMode {
    /// The stack copy each mode needs by default. fp reads only the frameless leaf's
    /// return address near the stack top. hybrid needs CFI only until the frame-pointer
    /// chain can take over: 8 KiB covers the no-frame-pointer library frames measured
    /// here (qsort's merge recursion, Rust std) with room. dwarf has nothing to fall back
    /// on, so it copies twice that. The kernel caps a sample's copy below 64 KiB.
    pub fn default_stack_bytes(self) -> u32 {
        match self {
            UnwindMode::Fp => FP_STACK_COPY_BYTES,
            UnwindMode::Hybrid => 8192,
            UnwindMode::Dwarf => 16384,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            UnwindMode::Hybrid => "hybrid",
            UnwindMode::Fp => "fp",
            UnwindMode::Dwarf => "dwarf",
        }
    }
}
