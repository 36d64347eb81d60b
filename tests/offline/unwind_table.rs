//! The unwind tables made for the kernel's walker (`sampler::unwind::table`) against
//! framehop, the user-space unwinder, on real files: libc, the bench targets, this test's
//! own executable and cc1. At every byte address that an FDE covers, one step by the
//! table's row and one by framehop, from the same registers and the same synthetic stack
//! (a word per address, derived from it), must find the same caller (return address,
//! RSP, RBP), or both stop; just past every FDE the table must have no entry. A file
//! whose only CFI is `.debug_frame` is compared the same way. The
//! differences that remain are the ones the table means (see [`Verdict`]), counted and
//! printed. Also the compiler's cost: time and size on libc, cc1 and sampler itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use gimli::UnwindSection;
use object::{Object, ObjectSection};
use sampler::unwind::table::{self, Cfa, Regs, ReturnAddress, Step, UnwindTable};

type Bytes = Arc<[u8]>;

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

/// Where the file is mapped: a page-aligned bias, so that the PLT's rule (which reads the
/// instruction's place in a 16-byte stub) sees the file's own alignment.
const BIAS: u64 = 0x5555_5555_0000;
/// The sampled frame's RSP and RBP (RBP above it, as a frame pointer is).
const SP: u64 = 0x7ffd_0000_1000;
const BP: u64 = SP + 0x2000;

/// The synthetic stack: the word at `address` (never zero, which framehop reads as the
/// end of the stack).
fn word(address: u64) -> u64 {
    let mut z = address.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

/// What one step found: the caller's return address, RSP and RBP (`None`: lost), the
/// end of the stack, or no step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Caller(u64, u64, Option<u64>),
    End,
    Refused,
}

/// How the table's answer at one address compares with framehop's. Every kind but
/// `Agree` and `Unexplained` is a difference the table means (no other kind was met on
/// these files: the table's RBP lost where framehop keeps it, say, would be
/// `Unexplained`):
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Agree,
    /// A CFA rule the kernel's walker cannot follow (a DWARF expression other than the
    /// PLT's, a register other than RSP and RBP): the table stops, where framehop
    /// evaluates the expression...
    UnsupportedFramehopEvaluates,
    /// ... or, where it cannot evaluate it either (an expression that reads memory),
    /// falls back to its frame-pointer guess.
    UnsupportedFramehopGuesses,
    /// The signal trampoline (`S` in its CIE): the table reads the interrupted
    /// registers from the `ucontext` at RSP, as sampler's unwinder does by the
    /// trampoline's code; framehop cannot evaluate glibc's expressions for it, which read
    /// memory, and falls back to its frame-pointer guess.
    SignalFrame,
    /// The return address is not at CFA - 8 (vfork keeps it in RDI while the child
    /// runs on the parent's stack): the table stops, framehop reads CFA - 8 anyway
    /// (where it cannot evaluate the rule it falls back to that slot).
    ReturnAddressElsewhere,
    Unexplained,
}

/// The frame-pointer rule: framehop's guess where it has no rule.
fn frame_pointer_guess() -> Answer {
    Answer::Caller(word(BP + 8), BP + 16, Some(word(BP)))
}

/// framehop's step at `avma`.
fn framehop_step(unwinder: &UnwinderX86_64<Bytes>, cache: &mut CacheX86_64, avma: u64) -> Answer {
    let mut regs = UnwindRegsX86_64::new(avma, SP, BP);
    let step = unwinder.unwind_frame(
        FrameAddress::from_instruction_pointer(avma),
        &mut regs,
        cache,
        &mut |a| Ok(word(a)),
    );
    match step {
        Ok(Some(ra)) => Answer::Caller(ra, regs.sp(), Some(regs.bp())),
        Ok(None) => Answer::End,
        Err(_) => Answer::Refused,
    }
}

/// The table's step at the file's address `svma`.
fn table_step(table: &UnwindTable, svma: u64) -> Answer {
    let Some(row) = table.row_at(svma) else {
        return Answer::Refused;
    };
    let regs = Regs {
        ip: svma + BIAS,
        sp: SP,
        bp: Some(BP),
    };
    match row.step(regs, &mut |a| Some(word(a))) {
        Step::Caller(r) | Step::Interrupted(r) => Answer::Caller(r.ip, r.sp, r.bp),
        Step::Outermost => Answer::End,
        Step::Stop(_) => Answer::Refused,
    }
}

fn verdict(table: &UnwindTable, svma: u64, ours: Answer, theirs: Answer) -> Verdict {
    if ours == theirs {
        return Verdict::Agree;
    }
    let Some(row) = table.row_at(svma) else {
        return Verdict::Unexplained;
    };
    match (row.cfa, ours, theirs) {
        (Cfa::SignalFrame, Answer::Caller(ip, sp, bp), _)
            if (ip, sp, bp) == (word(SP + 168), word(SP + 160), Some(word(SP + 120))) =>
        {
            Verdict::SignalFrame
        }
        (Cfa::Unsupported(_), Answer::Refused, Answer::Caller(..)) => {
            if theirs == frame_pointer_guess() {
                Verdict::UnsupportedFramehopGuesses
            } else {
                Verdict::UnsupportedFramehopEvaluates
            }
        }
        (_, Answer::Refused, Answer::Caller(..)) if row.ra == ReturnAddress::Unknown => {
            Verdict::ReturnAddressElsewhere
        }
        _ => Verdict::Unexplained,
    }
}

/// A file's sections as framehop takes them.
struct Sections {
    data: Vec<u8>,
}

impl Sections {
    fn read(path: &Path) -> Sections {
        Sections {
            data: std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        }
    }

    fn file(&self) -> object::File<'_> {
        object::File::parse(&*self.data).unwrap()
    }

    /// framehop's unwinder for the file, mapped at [`BIAS`], with its CFI as sampler's
    /// unwinder gives it (`unwind::cfi::add_module`).
    fn framehop(&self) -> UnwinderX86_64<Bytes> {
        let file = self.file();
        let range = |name: &str| {
            file.section_by_name(name)
                .map(|s| s.address()..s.address() + s.size())
        };
        let bytes = |name: &str| -> Option<Bytes> {
            Some(Bytes::from(
                &*file.section_by_name(name)?.uncompressed_data().ok()?,
            ))
        };
        let end = file
            .sections()
            .map(|s| s.address() + s.size())
            .max()
            .unwrap();
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: range(".text"),
            got_svma: range(".got"),
            eh_frame_svma: range(".eh_frame"),
            eh_frame: bytes(".eh_frame"),
            eh_frame_hdr_svma: range(".eh_frame_hdr"),
            eh_frame_hdr: bytes(".eh_frame_hdr"),
            debug_frame: bytes(".debug_frame"),
            ..Default::default()
        };
        let mut u = UnwinderX86_64::new();
        u.add_module(Module::new("file".into(), BIAS..BIAS + end, BIAS, info));
        u
    }

    /// The addresses of the instructions from `start` to `end`, decoded from `start`.
    fn instructions(&self, start: u64, end: u64) -> Vec<u64> {
        let file = self.file();
        let Some(section) = file
            .sections()
            .find(|s| (s.address()..s.address() + s.size()).contains(&start))
        else {
            return Vec::new();
        };
        let data = section.data().unwrap();
        let from = (start - section.address()) as usize;
        let to = ((end - section.address()) as usize).min(data.len());
        let mut decoder =
            iced_x86::Decoder::with_ip(64, &data[from..to], start, iced_x86::DecoderOptions::NONE);
        let mut out = Vec::new();
        while decoder.can_decode() {
            out.push(decoder.ip());
            // Only its length matters: the decoder moves past it.
            let _instruction = decoder.decode();
        }
        out
    }

    /// The address ranges of the file's FDEs, listed here apart from the compiler.
    fn fde_ranges(&self) -> Vec<(u64, u64)> {
        let file = self.file();
        let mut ranges = Vec::new();
        let mut push = |fde: gimli::FrameDescriptionEntry<_>| {
            if fde.len() > 0 {
                ranges.push((fde.initial_address(), fde.end_address()));
            }
        };
        if let Some(s) = file.section_by_name(".eh_frame") {
            let data = s.uncompressed_data().unwrap();
            let mut eh = gimli::EhFrame::new(&data, gimli::LittleEndian);
            eh.set_address_size(8);
            let addr = |n: &str| file.section_by_name(n).map_or(0, |s| s.address());
            let bases = gimli::BaseAddresses::default()
                .set_eh_frame(s.address())
                .set_text(addr(".text"))
                .set_got(addr(".got"));
            let mut entries = eh.entries(&bases);
            while let Some(entry) = entries.next().unwrap() {
                if let gimli::CieOrFde::Fde(p) = entry {
                    push(p.parse(gimli::EhFrame::cie_from_offset).unwrap());
                }
            }
        } else if let Some(s) = file.section_by_name(".debug_frame") {
            let data = s.uncompressed_data().unwrap();
            let mut df = gimli::DebugFrame::new(&data, gimli::LittleEndian);
            df.set_address_size(8);
            let bases = gimli::BaseAddresses::default();
            let mut entries = df.entries(&bases);
            while let Some(entry) = entries.next().unwrap() {
                if let gimli::CieOrFde::Fde(p) = entry {
                    push(p.parse(gimli::DebugFrame::cie_from_offset).unwrap());
                }
            }
        }
        ranges.sort_unstable();
        ranges
    }
}

/// What the comparison found on one file.
#[derive(Default)]
struct Tally {
    verdicts: BTreeMap<Verdict, u64>,
    /// Addresses just past an FDE (and in none) where the table has no entry, and
    /// where it wrongly has one.
    gaps: u64,
    gaps_wrong: Vec<u64>,
    examples: Vec<String>,
    /// The first address of each verdict, for the report.
    first: BTreeMap<Verdict, String>,
}

/// Which addresses of an FDE are checked.
#[derive(Clone, Copy)]
enum Every {
    Byte,
    /// Every instruction's first byte, decoding from the FDE's start: a quarter of the
    /// addresses, for a file as large as cc1 (every byte of its 20 M takes 30 s).
    Instruction,
}

/// Compares the table of `path` with framehop at every address (or instruction) its
/// FDEs cover.
fn compare(path: &Path, every: Every) -> Tally {
    let sections = Sections::read(path);
    let table = table::compile(path, &*sections.data).unwrap();
    let unwinder = sections.framehop();
    let mut cache = CacheX86_64::new();
    let ranges = sections.fde_ranges();
    assert!(!ranges.is_empty(), "{}: no FDEs", path.display());
    let mut tally = Tally::default();
    let mut covered_to = 0;
    for (i, &(start, end)) in ranges.iter().enumerate() {
        let addresses: Box<dyn Iterator<Item = u64>> = match every {
            Every::Byte => Box::new(start..end),
            Every::Instruction => Box::new(sections.instructions(start, end).into_iter()),
        };
        for svma in addresses.filter(|&a| a >= covered_to) {
            let ours = table_step(&table, svma);
            let theirs = framehop_step(&unwinder, &mut cache, svma + BIAS);
            let v = verdict(&table, svma, ours, theirs);
            *tally.verdicts.entry(v).or_default() += 1;
            tally.first.entry(v).or_insert_with(|| {
                format!("{}:{svma:#x} {:?}", path.display(), table.row_at(svma))
            });
            if v == Verdict::Unexplained && tally.examples.len() < 20 {
                tally.examples.push(format!(
                    "{:#x}: table {ours:?} by {:?}, framehop {theirs:?}",
                    svma,
                    table.row_at(svma)
                ));
            }
        }
        covered_to = covered_to.max(end);
        let next = ranges.get(i + 1).map_or(u64::MAX, |n| n.0);
        if end < next && end >= covered_to {
            tally.gaps += 1;
            if table.row_at(end).is_some_and(|r| r.cfa != Cfa::NoEntry) {
                tally.gaps_wrong.push(end);
            }
        }
    }
    tally
}

/// Compares the tables of `paths` with framehop, prints the counts and fails on any
/// difference the table does not mean.
fn agrees_with_framehop(what: &str, paths: &[PathBuf], every: Every) {
    let mut all = Tally::default();
    for path in paths {
        let t = compare(path, every);
        for (v, n) in t.verdicts {
            *all.verdicts.entry(v).or_default() += n;
        }
        all.gaps += t.gaps;
        for (v, first) in t.first {
            all.first.entry(v).or_insert(first);
        }
        if !t.gaps_wrong.is_empty() {
            all.examples.push(format!(
                "{}: an entry just past an FDE at {:x?}",
                path.display(),
                &t.gaps_wrong[..t.gaps_wrong.len().min(5)]
            ));
        }
        all.examples.extend(
            t.examples
                .into_iter()
                .map(|e| format!("{}: {e}", path.display())),
        );
    }
    let checked: u64 = all.verdicts.values().sum();
    eprintln!(
        "{what}: {} files, {checked} {} checked, {} gaps between FDEs without an entry; {:?}",
        paths.len(),
        match every {
            Every::Byte => "addresses",
            Every::Instruction => "instructions",
        },
        all.gaps,
        all.verdicts
    );
    for (v, first) in all.first.iter().filter(|(&v, _)| v != Verdict::Agree) {
        eprintln!("  first {v:?}: {first}");
    }
    assert!(checked > 0);
    assert!(
        all.examples.is_empty(),
        "{what}: the table and framehop differ:\n{}",
        all.examples.join("\n")
    );
}

fn unwind_table_agrees_with_framehop_on_libc() {
    agrees_with_framehop("libc", &[PathBuf::from(LIBC)], Every::Byte);
}

fn unwind_table_agrees_with_framehop_on_the_bench_targets() {
    let dir = crate::common::bench_targets();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::read(p).is_ok_and(|d| d.starts_with(b"\x7fELF")))
        .collect();
    paths.sort();
    assert!(paths.len() >= 20, "{} bench targets", paths.len());
    agrees_with_framehop("bench targets", &paths, Every::Byte);
}

fn unwind_table_agrees_with_framehop_on_this_test_binary() {
    agrees_with_framehop(
        "this test binary",
        &[std::env::current_exe().unwrap()],
        Every::Byte,
    );
}

fn unwind_table_reads_debug_frame_where_there_is_no_eh_frame() {
    // gcc writes C's CFI into `.debug_frame` without asynchronous unwind tables; the
    // `.eh_frame` the C runtime's objects bring is taken out after linking.
    let dir = crate::common::tempdir();
    let (linked, path) = (dir.join("nofp-linked"), dir.join("nofp"));
    let targets = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-targets");
    let cc = std::process::Command::new("cc")
        .args([
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
        ])
        .arg("-I")
        .arg(&targets)
        .arg("-o")
        .arg(&linked)
        .arg(targets.join("nofp.c"))
        .status()
        .unwrap();
    assert!(cc.success(), "cc");
    let objcopy = std::process::Command::new("objcopy")
        .args([
            "--remove-section",
            ".eh_frame",
            "--remove-section",
            ".eh_frame_hdr",
        ])
        .arg(&linked)
        .arg(&path)
        .status()
        .unwrap();
    assert!(objcopy.success(), "objcopy");
    let sections = Sections::read(&path);
    let file = sections.file();
    assert!(file.section_by_name(".eh_frame").is_none());
    assert!(file.section_by_name(".debug_frame").is_some());
    let table = table::compile(&path, &*sections.data).unwrap();
    assert!(
        table.fdes >= 4 && table.rows.len() > table.fdes,
        "{table:?}"
    );
    agrees_with_framehop(".debug_frame", &[path], Every::Byte);
    // So does the same file's separate debug file, whose `.eh_frame` has no bytes.
    let debug = dir.join("nofp.debug");
    let keep = std::process::Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&linked)
        .arg(&debug)
        .status()
        .unwrap();
    assert!(keep.success(), "objcopy --only-keep-debug");
    let data = std::fs::read(&debug).unwrap();
    assert_eq!(table::compile(&debug, &*data).unwrap(), table);
    std::fs::remove_dir_all(dir).unwrap();
}

/// GCC's C compiler proper, when GCC is installed.
fn cc1() -> Option<String> {
    let out = std::process::Command::new("gcc")
        .arg("-print-prog-name=cc1")
        .output()
        .ok()?;
    let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
    Path::new(&path).is_file().then_some(path)
}

fn unwind_table_agrees_with_framehop_on_cc1() {
    agrees_with_framehop("cc1", &[PathBuf::from(cc1().unwrap())], Every::Instruction);
}

/// The compiler's cost on large files: time, rows and bytes, printed; the tables fit
/// their limit and take well under a second per file.
fn unwind_table_statistics() {
    let mut files = vec![
        PathBuf::from(LIBC),
        PathBuf::from(crate::common::sampler_bin()),
    ];
    files.extend(cc1().map(PathBuf::from));
    for path in files {
        let data = std::fs::read(&path).unwrap();
        let start = Instant::now();
        let table = table::compile(&path, &*data).unwrap();
        let took = start.elapsed();
        let bytes = table.to_bytes().len();
        eprintln!(
            "{}: {} FDEs ({} damaged), {} rows, {} bytes ({:.1} per FDE), compiled in {:.1} ms",
            path.display(),
            table.fdes,
            table.damaged,
            table.rows.len(),
            bytes,
            bytes as f64 / table.fdes.max(1) as f64,
            took.as_secs_f64() * 1e3
        );
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for row in &table.rows {
            let kind = format!("{:?}", row.cfa);
            let kind = kind
                .split(['(', ' '])
                .next()
                .unwrap_or_default()
                .to_string();
            *kinds.entry(kind).or_default() += 1;
        }
        eprintln!("  rows by CFA rule: {kinds:?}");
        assert_eq!(table.damaged, 0, "{}", path.display());
        assert!(table.rows.len() >= table.fdes, "{}", path.display());
        assert_eq!(bytes, table.rows.len() * table::ROW_BYTES);
    }
}

/// The tests of this module, for the offline binary's `main`.
pub fn tests() -> Vec<crate::common::Test> {
    use crate::common::Need;
    crate::tests![
        unwind_table_agrees_with_framehop_on_libc;
        unwind_table_agrees_with_framehop_on_the_bench_targets;
        unwind_table_agrees_with_framehop_on_this_test_binary;
        unwind_table_agrees_with_framehop_on_cc1: Need::Located("cc1", cc1);
        unwind_table_reads_debug_frame_where_there_is_no_eh_frame;
        unwind_table_statistics;
    ]
}
