//! Little-endian words read out of bytes, and the hash that mixes them, which checks an
//! entry (`format`) and the kernel's table (`kernel_table`), and whose word reader
//! `key` uses: beneath them all, so that none imports another's.

/// Where an entry's and the kernel table's header keep their checksum, the word [`checksum`] leaves out.
pub(super) const CHECKSUM_AT: usize = 24;

/// A checksum of `bytes` but for the checksum field: words are mixed in one by one
/// through steps that are each one-to-one, so a change within any one word always
/// changes it (and almost always one anywhere else). It guards against damage, not
/// against someone who writes an entry on purpose: what is in the user's cache is theirs,
/// and every entry is checked for soundness as well.
pub(super) fn checksum(bytes: &[u8]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64 ^ bytes.len() as u64;
    let mut mix = |word: u64| {
        h = (h ^ word)
            .wrapping_mul(0xff51_afd7_ed55_8ccd)
            .rotate_left(29);
    };
    let mut chunks = bytes.chunks_exact(8);
    for (i, chunk) in chunks.by_ref().enumerate() {
        if i != CHECKSUM_AT / 8 {
            mix(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    mix(u64::from_le_bytes(last));
    h
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// The checks every flat buffer of the cache starts with (an entry, the kernel's table):
/// at least `header` bytes, `magic` first, then `version` (u32 at 8), its own length (u64
/// at 16) and the checksum (at [`CHECKSUM_AT`]).
pub(super) fn check_frame(
    bytes: &[u8],
    header: usize,
    magic: &[u8; 8],
    version: u32,
) -> Result<(), &'static str> {
    check_header(bytes, header, magic, version, bytes.len() as u64)?;
    if u64_at(bytes, CHECKSUM_AT) != checksum(bytes) {
        return Err("bad checksum");
    }
    Ok(())
}

/// [`check_frame`]'s checks of the header at the start of `bytes` alone, for a buffer
/// `len` bytes long of which `bytes` may be only the start: at least `header` bytes,
/// `magic`, `version` and the length.
pub(super) fn check_header(
    bytes: &[u8],
    header: usize,
    magic: &[u8; 8],
    version: u32,
    len: u64,
) -> Result<(), &'static str> {
    if bytes.len() < header.max(CHECKSUM_AT + 8) {
        return Err("shorter than its header");
    }
    if bytes[..8] != magic[..] {
        return Err("bad magic");
    }
    if u32_at(bytes, 8) != version {
        return Err("another version");
    }
    if u64_at(bytes, 16) != len {
        return Err("length differs");
    }
    Ok(())
}
