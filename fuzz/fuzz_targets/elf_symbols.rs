//! The ELF reader and the symbolicator (symbols, DWARF lines and inline chains) on any
//! bytes, with lookups spread over the file's address range, and the whole functions
//! around them resolved as the symbol cache keeps them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sampler::symbolicate::LibSymbols;

fuzz_target!(|data: &[u8]| {
    let _ = sampler::files::binary::Binary::from_bytes("fuzz".into(), std::sync::Arc::from(data));
    if let Some(syms) = LibSymbols::from_elf(data) {
        let addresses: Vec<u64> = (0..0x4000u64).step_by(0x101).chain([u64::MAX, 0]).collect();
        for &a in &addresses {
            let _ = syms.lookup(a);
        }
        let _ = syms.resolve_many(&addresses, &|_| {});
    }
});
