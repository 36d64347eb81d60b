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

/// Bytes of user stack copied with every sample in hybrid mode (see
/// [`UnwindMode::default_stack_bytes`]).
const HYBRID_STACK_COPY_BYTES: u32 = 16384;

impl UnwindMode {
    /// The stack copy each mode needs by default. fp reads only the frameless leaf's
    /// return address near the stack top. hybrid needs CFI only until the frame-pointer
    /// chain can take over, which it cannot in code without frame pointers that keeps
    /// large buffers on its stack: 16 KiB, measured (scripts/bench-stack-copy): the
    /// sqlite3 shell reading a query from its input is 99.8% `[truncated]` with 8 KiB and
    /// 0% with 16 KiB, `git log -p` 12.7% and 0%; 32,000 bytes (samply's) reached no
    /// further there, for twice the ring traffic and twice root's rings. dwarf has
    /// nothing to fall back on and copies as much. The kernel caps a sample's copy below
    /// 64 KiB.
    pub fn default_stack_bytes(self) -> u32 {
        match self {
            UnwindMode::Fp => FP_STACK_COPY_BYTES,
            UnwindMode::Hybrid => HYBRID_STACK_COPY_BYTES,
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
