//! CFI read one function at a time (`sampler::files::lazycfi`) against the whole sections: on
//! real files (libc, and this test's own executable), every function's first, middle and
//! last instruction, the bytes around it and the gaps between functions unwind to the
//! same registers through the function's own small `.eh_frame` as through the file's
//! `.eh_frame` and `.eh_frame_hdr`, as the sampled instruction and as a return address;
//! and the symbolicator finds the same function ranges there for code without symbols.
//! No privileges needed.

use std::path::Path;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use object::{Object, ObjectSection, ObjectSymbol};
use sampler::symbolicate::{EhFrameBytes, EhFrameSource, FunctionRanges};

type Sections = std::sync::Arc<[u8]>;

/// An unwinder that knows one module at `avma` (no bias) with these sections.
fn unwinder(
    avma: std::ops::Range<u64>,
    text: Option<std::ops::Range<u64>>,
    eh_frame: (std::ops::Range<u64>, Sections),
    hdr: Option<(std::ops::Range<u64>, Sections)>,
) -> UnwinderX86_64<Sections> {
    let mut u = UnwinderX86_64::new();
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: text,
        eh_frame_svma: Some(eh_frame.0),
        eh_frame: Some(eh_frame.1),
        eh_frame_hdr_svma: hdr.as_ref().map(|h| h.0.clone()),
        eh_frame_hdr: hdr.map(|h| h.1),
        ..Default::default()
    };
    u.add_module(Module::new("m".into(), avma, 0, info));
    u
}

/// The registers and result of unwinding one frame at `at`, with a stack whose every
/// word holds its own address plus one.
fn step(u: &UnwinderX86_64<Sections>, at: FrameAddress) -> (String, u64, u64) {
    let mut cache = CacheX86_64::new();
    let mut regs = UnwindRegsX86_64::new(at.address(), 0x7ff0_0000, 0x7ff0_0800);
    let r = u.unwind_frame(at, &mut regs, &mut cache, &mut |a| Ok(a + 1));
    (format!("{r:?}"), regs.sp(), regs.bp())
}

fn same_unwinding(path: &Path, min_functions: usize) {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let section = |name: &str| {
        let s = file.section_by_name(name).unwrap();
        let range = s.address()..s.address() + s.size();
        (range, Sections::from(s.data().unwrap()))
    };
    let text = file
        .section_by_name(".text")
        .map(|s| s.address()..s.address() + s.size());
    let end = file
        .sections()
        .map(|s| s.address() + s.size())
        .max()
        .unwrap();
    let whole = unwinder(
        0..end,
        text.clone(),
        section(".eh_frame"),
        Some(section(".eh_frame_hdr")),
    );

    let binary = sampler::files::binary::Binary::open(path).unwrap();
    let lazy = binary
        .unwind
        .lazy
        .clone()
        .expect("read function by function");
    assert!(binary.unwind.eh_frame.is_none(), "not read whole as well");

    let mut addresses: Vec<u64> = Vec::new();
    let symbols = file.symbols().chain(file.dynamic_symbols());
    for s in symbols.filter(|s| s.kind() == object::SymbolKind::Text) {
        let (a, n) = (s.address(), s.size());
        if a == 0 {
            continue;
        }
        addresses.extend([
            a - 1,
            a,
            a + 1,
            a + n / 2,
            (a + n).saturating_sub(1),
            a + n,
            a + n + 1,
        ]);
    }
    addresses.sort_unstable();
    addresses.dedup();
    let mut pieces = std::collections::HashSet::new();
    for &a in &addresses {
        let piece = lazy.function_at(a);
        let one = match &piece {
            Some(f) => {
                assert!(f.covers.contains(&a), "{a:#x} outside {:?}", f.covers);
                pieces.insert(f.covers.start);
                let eh = f.sections.eh_frame.clone().unwrap();
                let hdr = f.sections.eh_frame_hdr.clone();
                unwinder(f.covers.start..f.covers.end.min(end), text.clone(), eh, hdr)
            }
            None => UnwinderX86_64::new(),
        };
        for at in [
            FrameAddress::from_instruction_pointer(a),
            FrameAddress::from_return_address(a + 1).unwrap(),
        ] {
            assert_eq!(
                step(&one, at),
                step(&whole, at),
                "{} at {at:?}",
                path.display()
            );
        }
    }
    assert!(pieces.len() >= min_functions, "{} functions", pieces.len());

    // The symbolicator's function ranges (for code without a symbol) are the same too.
    let (eh_range, eh_bytes) = section(".eh_frame");
    let read = FunctionRanges::read(&EhFrameSource {
        address: eh_range.start,
        bytes: EhFrameBytes::Held(eh_bytes),
        text: text.as_ref().map(|t| t.start),
        endian: gimli::RunTimeEndian::Little,
        address_size: 8,
    });
    assert!(matches!(&read, FunctionRanges::Read(r) if r.len() >= min_functions));
    let looked_up = FunctionRanges::Lazy(lazy.clone());
    for &a in &addresses {
        assert_eq!(looked_up.containing(a), read.containing(a), "{a:#x}");
        assert_eq!(looked_up.extent(a), read.extent(a), "{a:#x}");
    }
}

fn libc_unwinds_the_same_function_by_function() {
    same_unwinding(Path::new("/lib/x86_64-linux-gnu/libc.so.6"), 2000);
}

fn a_rust_program_unwinds_the_same_function_by_function() {
    same_unwinding(&std::env::current_exe().unwrap(), 2000);
}

fn a_function_is_read_once_for_every_process() {
    // Processes that map one file share its `Binary`, and so its functions' CFI: a
    // second lookup of a function, at any of its addresses, gives the same piece.
    let binary =
        sampler::files::binary::Binary::open(Path::new("/lib/x86_64-linux-gnu/libc.so.6")).unwrap();
    let lazy = binary.unwind.lazy.clone().unwrap();
    let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let file = object::File::parse(&*data).unwrap();
    let qsort = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("qsort"))
        .unwrap();
    let first = lazy.function_at(qsort.address()).unwrap();
    let again = lazy.function_at(qsort.address() + 1).unwrap();
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    assert!(first.covers.contains(&qsort.address()));
    let eh = &first.sections.eh_frame.as_ref().unwrap().1;
    assert!(
        eh.len() < 512,
        "one CIE and one FDE, not the section: {} bytes",
        eh.len()
    );
}

fn a_window_keeps_the_pieces_it_used() {
    // A continuous recording ages the pieces at each window's end: those used in the
    // window stay read for the next one, the others are dropped (and read again when met).
    let path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let binary = sampler::files::binary::Binary::open(path).unwrap();
    let lazy = binary.unwind.lazy.clone().unwrap();
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let at = |name: &str| {
        file.dynamic_symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap()
            .address()
    };
    let (qsort, malloc) = (at("qsort"), at("malloc"));
    let q1 = lazy.function_at(qsort).unwrap();
    let m1 = lazy.function_at(malloc).unwrap();
    lazy.age_pieces();
    let q2 = lazy.function_at(qsort + 1).unwrap();
    assert!(std::sync::Arc::ptr_eq(&q1, &q2), "used in the window: kept");
    lazy.age_pieces();
    let m2 = lazy.function_at(malloc).unwrap();
    let q3 = lazy.function_at(qsort).unwrap();
    assert!(
        !std::sync::Arc::ptr_eq(&m1, &m2),
        "unused in a window: read again"
    );
    assert_eq!(m1.covers, m2.covers);
    assert!(std::sync::Arc::ptr_eq(&q1, &q3));
    lazy.forget_pieces();
    assert!(!std::sync::Arc::ptr_eq(
        &q1,
        &lazy.function_at(qsort).unwrap()
    ));
}

/// The tests of this module, for the offline binary's `main`.
pub fn tests() -> Vec<crate::common::Test> {
    crate::tests![
        libc_unwinds_the_same_function_by_function;
        a_rust_program_unwinds_the_same_function_by_function;
        a_function_is_read_once_for_every_process;
        a_window_keeps_the_pieces_it_used;
    ]
}
