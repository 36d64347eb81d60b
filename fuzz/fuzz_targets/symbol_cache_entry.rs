//! The symbol cache's entry reader on any bytes, given the checksum they need (else
//! nearly every input would stop there): checked, then every interval read back and
//! looked up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sampler::symbolicate::cache::{self, Entry, Key};

fuzz_target!(|data: &[u8]| {
    // The key the entry says it is for, so that the checks behind it are reached.
    let word = |at: usize, len: usize| {
        data.get(at..at + len).map_or(0, |b| {
            b.iter()
                .rev()
                .fold(0u64, |n, &byte| n << 8 | u64::from(byte))
        })
    };
    let id_len = (word(76, 4) as usize).min(64);
    let key = Key {
        build_id: data.get(80..80 + id_len).unwrap_or_default().to_vec(),
        size: word(32, 8),
        stamp: Default::default(),
    };
    if let Ok(entry) = Entry::parse(cache::with_checksum(data.to_vec()), &key) {
        let _ = (entry.facts(), entry.source());
        for (range, info) in entry.intervals() {
            assert_eq!(entry.lookup(range.start), Some(info));
        }
    }
});
