//! The symbol cache's entry reader on any bytes, given the checksum they need (else
//! nearly every input would stop there): checked, then every interval read back and
//! looked up; and the kernel table's reader on the same bytes (given the checksum of
//! their head), then looked up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sampler::symbolicate::cache::{self, Entry, InTable, KernelTable, Key};

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
    // The kernel table of the key its header says, looked up at the addresses of
    // its words: each answer lies at or below the address, below the text end.
    let id_len = (word(48, 4) as usize).min(64);
    let kernel = Key {
        build_id: data.get(56..56 + id_len).unwrap_or_default().to_vec(),
        size: word(32, 8),
        stamp: Default::default(),
    };
    if let Ok(table) = KernelTable::parse(KernelTable::with_checksum(data.to_vec()), &kernel) {
        for at in (0..data.len()).step_by(4) {
            let probe = word(at, 4);
            if let InTable::Function(start, _) = table.lookup(probe) {
                assert!(start <= probe);
            }
        }
        assert_eq!(table.lookup(u64::MAX), InTable::Outside);
    }
});
