//! JIT dump files (`jit-PID.dump`): what `node --perf-prof`, CPython's `-X perf_jit` and
//! Java agents write for profilers, in the format perf defines
//! (`tools/perf/Documentation/jitdump-specification.txt`): a header, then records, each
//! starting with its kind, its total size and a timestamp. A code-load record names a
//! range of JIT code; a code-move record moves named code to a new address. The writing
//! process marks the file by mapping it executable, so it shows up in the recording's
//! mmap events. Names are read once the recording is finished; unwind-information
//! records (`.eh_frame_hdr` and `.eh_frame` for the code load that follows) are read
//! while it runs, as the dump grows, so that samples in that code unwind with its CFI.

/// The most of a dump that is read: a dump grows by a record of about a hundred bytes per
/// piece of code compiled (and the code's bytes), so even a long-running JIT's stays far
/// below this; the dump is held whole while its names are read, as root too.
pub const MAX_DUMP_BYTES: u64 = 256 << 20;

/// Reads the dump at `path` from `offset` on, at most up to [`MAX_DUMP_BYTES`], when the
/// process's user `user` (or root) wrote it (see [`crate::files::locate::read_written_by`]: the
/// recorded process chose the name, maybe in a directory anyone may write); why not.
pub fn read_from(
    path: &std::path::Path,
    offset: u64,
    user: Option<u32>,
) -> Result<Vec<u8>, String> {
    let limit = MAX_DUMP_BYTES.saturating_sub(offset);
    match crate::files::locate::read_written_by(path, offset, limit, user)? {
        Some((data, _)) => Ok(data),
        None => Err("there is no such file".into()),
    }
}

/// "JiTD" as a little-endian u32: the first word of every dump.
const MAGIC: u32 = 0x4a69_5444;
/// magic, version, total_size, elf_mach, pad1, pid, timestamp (u64), flags (u64).
const MIN_HEADER: usize = 40;
/// id (u32), total_size (u32), timestamp (u64).
const RECORD_HEADER: usize = 16;
const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_MOVE: u32 = 1;
const JIT_CODE_UNWINDING_INFO: u32 = 4;
/// An unwinding record's fixed part: unwinding_size, eh_frame_hdr_size, mapped_size.
const UNWIND_FIXED: usize = 24;
/// A code load's fixed part after the record header: pid, tid (u32 each), vma,
/// code_addr, code_size, code_index (u64 each); the name follows.
const LOAD_FIXED: usize = 40;
/// A code move's: pid, tid, vma, old_code_addr, new_code_addr, code_size, code_index.
const MOVE_FIXED: usize = 48;

/// A function a JIT compiler wrote, as its dump says: where its code starts, how long it
/// is (none when the dump says 0) and its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeLoad {
    pub address: u64,
    pub size: Option<u64>,
    pub name: String,
}

/// The named code ranges of a dump, in the order they were written (a later one at the
/// same address replaces an earlier one). A dump cut short (the process was killed while
/// writing) gives what it has; a file that is not a dump is an error.
pub fn parse(data: &[u8]) -> Result<Vec<CodeLoad>, String> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            data.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
    };
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(
            data.get(at..at.checked_add(8)?)?.try_into().ok()?,
        ))
    };
    if u32_at(0) != Some(MAGIC) {
        return Err("not a JIT dump (no JiTD magic, or big-endian)".into());
    }
    let header_size = u32_at(8).ok_or("its header is cut short")? as usize;
    if header_size < MIN_HEADER || header_size > data.len() {
        return Err(format!("its header size {header_size} is impossible"));
    }
    let mut symbols: Vec<CodeLoad> = Vec::new();
    for (id, body, end) in records(data, header_size) {
        let size = end - body + RECORD_HEADER;
        match id {
            JIT_CODE_LOAD if size >= RECORD_HEADER + LOAD_FIXED => {
                let (address, code_size) = (u64_at(body + 16), u64_at(body + 24));
                let name_bytes = &data[body + LOAD_FIXED..end];
                let name_len = name_bytes
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(name_bytes.len());
                if let (Some(address), Some(code_size)) = (address, code_size) {
                    symbols.push(CodeLoad {
                        address,
                        size: (code_size > 0).then_some(code_size),
                        name: String::from_utf8_lossy(&name_bytes[..name_len]).into_owned(),
                    });
                }
            }
            JIT_CODE_MOVE if size >= RECORD_HEADER + MOVE_FIXED => {
                let (old, new) = (u64_at(body + 16), u64_at(body + 24));
                if let (Some(old), Some(new)) = (old, new) {
                    if let Some(moved) = symbols.iter().rev().find(|s| s.address == old) {
                        let moved = CodeLoad {
                            address: new,
                            ..moved.clone()
                        };
                        symbols.push(moved);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(symbols)
}

/// The records of `data` that are written in full, from `at` on: each one's kind, the
/// start of its body (after the record header) and its end.
fn records(data: &[u8], mut at: usize) -> impl Iterator<Item = (u32, usize, usize)> + '_ {
    std::iter::from_fn(move || {
        let word = |from: usize| -> Option<u32> {
            Some(u32::from_le_bytes(
                data.get(from..from.checked_add(4)?)?.try_into().ok()?,
            ))
        };
        let (id, size) = (word(at)?, word(at.checked_add(4)?)? as usize);
        let end = at
            .checked_add(size)
            .filter(|&e| size >= RECORD_HEADER && e <= data.len())?;
        let record = (id, at + RECORD_HEADER, end);
        at = end;
        Some(record)
    })
}

/// The CFI of one range of JIT code, as its dump gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JitUnwind {
    pub code: std::ops::Range<u64>,
    pub eh_frame: Vec<u8>,
    pub eh_frame_hdr: Vec<u8>,
}

/// The unwind information of the code loads in `data`, the dump's bytes from its start
/// (`at_start`: the header comes first) or from a record's start, and how many bytes were
/// read: a dump is read again as it grows, from there. A record not yet written in full
/// is left for the next read.
pub fn unwind_records(data: &[u8], at_start: bool) -> (Vec<JitUnwind>, usize) {
    let word = |at: usize, n: usize| -> Option<u64> {
        let b = data.get(at..at.checked_add(n)?)?;
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(b);
        Some(u64::from_le_bytes(v))
    };
    let mut at = 0;
    if at_start {
        match (word(0, 4), word(8, 4)) {
            (Some(m), Some(h)) if m == u64::from(MAGIC) && h as usize >= MIN_HEADER => {
                at = h as usize
            }
            _ => return (Vec::new(), 0),
        }
    }
    let mut found = Vec::new();
    // The unwind record applies to the code load that follows it.
    let mut pending: Option<(Vec<u8>, Vec<u8>)> = None;
    let mut used = at;
    for (id, body, end) in records(data, at) {
        let size = end - body + RECORD_HEADER;
        used = end;
        match id {
            JIT_CODE_UNWINDING_INFO if size >= RECORD_HEADER + UNWIND_FIXED => {
                let (total, hdr) = (word(body, 8), word(body + 8, 8));
                let unwind = total.zip(hdr).and_then(|(total, hdr)| {
                    let bytes = data
                        .get(body + UNWIND_FIXED..)?
                        .get(..usize::try_from(total).ok()?)?;
                    let split = bytes.len().checked_sub(usize::try_from(hdr).ok()?)?;
                    // The `.eh_frame` comes first and its header after it, as CPython
                    // and V8 write them.
                    Some((bytes[..split].to_vec(), bytes[split..].to_vec()))
                });
                pending = unwind;
            }
            JIT_CODE_LOAD if size >= RECORD_HEADER + LOAD_FIXED => {
                if let (Some((eh_frame, eh_frame_hdr)), Some(address), Some(len)) =
                    (pending.take(), word(body + 16, 8), word(body + 24, 8))
                {
                    found.push(JitUnwind {
                        code: address..address.saturating_add(len),
                        eh_frame,
                        eh_frame_hdr,
                    });
                }
            }
            _ => {}
        }
    }
    (found, used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Vec<u8> {
        let mut h = Vec::new();
        for word in [MAGIC, 1, MIN_HEADER as u32, 62, 0, 77] {
            h.extend_from_slice(&word.to_le_bytes());
        }
        h.extend_from_slice(&[0; 16]);
        h
    }

    fn record(id: u32, fields: &[u64], name: &str) -> Vec<u8> {
        let mut body = vec![0u8; 8];
        for f in fields {
            body.extend_from_slice(&f.to_le_bytes());
        }
        body.extend_from_slice(name.as_bytes());
        if !name.is_empty() {
            body.push(0);
        }
        let mut r = id.to_le_bytes().to_vec();
        r.extend_from_slice(&((RECORD_HEADER + body.len()) as u32).to_le_bytes());
        r.extend_from_slice(&5u64.to_le_bytes());
        r.extend_from_slice(&body);
        r
    }

    #[test]
    fn loads_and_moves_name_code() {
        let mut d = header();
        d.extend(record(
            JIT_CODE_LOAD,
            &[0x1000, 0x1000, 0x40, 1],
            "LazyCompile:*spin a.js:1",
        ));
        d.extend(record(7, &[1, 2, 3], ""));
        d.extend(record(JIT_CODE_MOVE, &[0, 0x1000, 0x2000, 0x40, 1], ""));
        // A record cut short by a kill is ignored, with what came before kept.
        let mut cut = record(JIT_CODE_LOAD, &[0x3000, 0x3000, 0x10, 2], "cut");
        cut.truncate(30);
        d.extend(cut);
        let s = parse(&d).unwrap();
        let at: Vec<(u64, Option<u64>, &str)> = s
            .iter()
            .map(|s| (s.address, s.size, s.name.as_str()))
            .collect();
        assert_eq!(
            at,
            vec![
                (0x1000, Some(0x40), "LazyCompile:*spin a.js:1"),
                (0x2000, Some(0x40), "LazyCompile:*spin a.js:1"),
            ]
        );
        assert!(parse(b"ELF").is_err());
        let mut bad = header();
        bad[8] = 0xff;
        assert!(parse(&bad).is_err());
    }
    #[test]
    fn unwind_records_go_with_the_next_code_load_and_are_read_as_the_dump_grows() {
        let mut unwind = 0x7u64.to_le_bytes().to_vec();
        unwind.extend_from_slice(&3u64.to_le_bytes());
        unwind.extend_from_slice(&16u64.to_le_bytes());
        unwind.extend_from_slice(&[1, 2, 3, 4, 0xa, 0xb, 0xc, 0]);
        let mut record4 = JIT_CODE_UNWINDING_INFO.to_le_bytes().to_vec();
        record4.extend_from_slice(&((RECORD_HEADER + unwind.len()) as u32).to_le_bytes());
        record4.extend_from_slice(&5u64.to_le_bytes());
        record4.extend_from_slice(&unwind);
        let mut d = header();
        let head = d.len();
        d.extend(record(JIT_CODE_LOAD, &[0x1000, 0x1000, 0x40, 1], "no cfi"));
        d.extend(&record4);
        d.extend(record(
            JIT_CODE_LOAD,
            &[0x2000, 0x2000, 0x20, 2],
            "with cfi",
        ));
        let whole = d.len();
        // Half of the next record is written: it waits for the next read.
        d.extend(&record4[..10]);
        let (found, used) = unwind_records(&d, true);
        assert_eq!(
            found,
            vec![JitUnwind {
                code: 0x2000..0x2020,
                eh_frame: vec![1, 2, 3, 4],
                eh_frame_hdr: vec![0xa, 0xb, 0xc],
            }]
        );
        assert_eq!(used, whole);
        assert!(used > head);
        assert_eq!(unwind_records(&d[used..], false), (Vec::new(), 0));
        assert_eq!(unwind_records(b"not a dump", true), (Vec::new(), 0));
    }
    #[test]
    fn a_dump_is_read_only_as_a_regular_file_and_from_an_offset() {
        let dir = crate::files::testdir::TestDir::new("jitdump");
        let me = Some(nix::unistd::Uid::effective().as_raw());
        let dump = dir.join("jit-77.dump");
        std::fs::write(&dump, header()).unwrap();
        assert_eq!(read_from(&dump, 0, me).unwrap(), header());
        assert_eq!(read_from(&dump, 8, me).unwrap(), header()[8..].to_vec());
        // A link at the dump's name (to a file root may read) is not followed, and a fifo
        // is not opened for reading (that would block until someone writes).
        let link = dir.join("jit-78.dump");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dump, &link).unwrap();
        assert!(read_from(&link, 0, me).is_err());
        let fifo = dir.join("jit-79.dump");
        let _ = std::fs::remove_file(&fifo);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(read_from(&fifo, 0, me).is_err());
        assert_eq!(
            read_from(&dir.join("jit-80.dump"), 0, me),
            Err("there is no such file".to_string())
        );
    }

    #[test]
    fn a_dump_of_another_user_with_two_names_or_sparse_is_not_read() {
        let dir = crate::files::testdir::TestDir::new("jitdump-owners");
        let me = nix::unistd::Uid::effective().as_raw();
        let dump = dir.join("jit-81.dump");
        std::fs::write(&dump, header()).unwrap();
        // A file of a user other than root (as root, nobody's).
        let owner = match me {
            0 => {
                std::os::unix::fs::chown(&dump, Some(65534), Some(65534)).unwrap();
                65534
            }
            me => me,
        };
        assert_eq!(read_from(&dump, 0, Some(owner)).unwrap(), header());
        // Another user's process, or one whose user is not known: only its own files,
        // or root's, are read for it.
        let refused = read_from(&dump, 0, Some(owner + 1)).unwrap_err();
        assert!(
            refused.contains(&format!("belongs to user {owner}")),
            "{refused}"
        );
        assert!(read_from(&dump, 0, None).is_err());
        // A second name: one file read for two processes.
        let twin = dir.join("jit-82.dump");
        std::fs::hard_link(&dump, &twin).unwrap();
        let refused = read_from(&dump, 0, Some(owner)).unwrap_err();
        assert!(refused.contains("2 names"), "{refused}");
        std::fs::remove_file(&twin).unwrap();
        // 64 MiB of holes.
        let sparse = dir.join("jit-83.dump");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let refused = read_from(&sparse, 0, Some(me)).unwrap_err();
        assert!(refused.contains("a sparse file"), "{refused}");
    }
}
