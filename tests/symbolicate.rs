//! The symbolicator against binaries compiled by the test: ELF symbols, DWARF lines,
//! inline chains and demangling. Needs only a C and a C++ compiler.

use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSymbol};
use sampler::symbolicate::LibSymbols;

fn compile(compiler: &str, source: &str, ext: &str, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-tmp")
        .join(format!("sym-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.{ext}"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let status = Command::new(compiler)
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("{compiler} runs: {e}"));
    assert!(status.success());
    out
}

fn symbol_range(data: &[u8], name: &str) -> (u64, u64) {
    let file = object::File::parse(data).unwrap();
    let s = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no symbol {name}"));
    (s.address(), s.size())
}

#[test]
fn inline_chain_lines_and_symbols_of_a_compiled_program() {
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-targets/inline3.c"),
    )
    .unwrap();
    let bin = compile("cc", &source, "c", "inline3");
    let data = std::fs::read(&bin).unwrap();
    let syms = LibSymbols::from_elf(&data).expect("an ELF file");
    assert!(syms.dwarf.is_some(), "-g gives DWARF");
    let (start, size) = symbol_range(&data, "work");
    assert!(size > 0);
    let loop_line = source
        .lines()
        .position(|l| l.contains("s += (double)i * 0.999999"))
        .unwrap() as u32
        + 1;

    let mut found = false;
    let mut checked_lines = false;
    for addr in start..start + size {
        let info = syms.lookup(addr);
        assert_eq!(
            info.symbol.as_ref().unwrap().name,
            "work",
            "every byte of work belongs to work"
        );
        let names: Vec<&str> = info.frames.iter().map(|f| f.function.as_str()).collect();
        if names == ["work", "level1", "level2", "level3"] {
            found = true;
            let inner = info.frames.last().unwrap();
            assert!(inner.file.as_deref().unwrap().ends_with("inline3.c"));
            if inner.line == Some(loop_line) {
                // Outer levels carry the line of the inlined call.
                let call_line = |callee: &str| {
                    source
                        .lines()
                        .position(|l| {
                            l.contains(&format!("return {callee}(n)"))
                                || l.contains(&format!("sink = {callee}(n)"))
                        })
                        .unwrap() as u32
                        + 1
                };
                assert_eq!(info.frames[0].line, Some(call_line("level1")));
                assert_eq!(info.frames[1].line, Some(call_line("level2")));
                checked_lines = true;
                break;
            }
        }
    }
    assert!(
        found,
        "no address of work has the inline chain work > level1 > level2 > level3"
    );
    assert!(
        checked_lines,
        "no address of the inlined loop maps to line {loop_line}"
    );
    // The symbol rule: an address inside main is main.
    let (main_start, _) = symbol_range(&data, "main");
    assert_eq!(syms.lookup(main_start + 1).symbol.unwrap().name, "main");
}

#[test]
fn cpp_names_are_demangled() {
    let source = r#"
        namespace geometry {
        __attribute__((noinline)) double area(double w, double h) { return w * h; }
        }
        int main(int argc, char **) { return (int)geometry::area(argc, 2.0); }
    "#;
    let bin = compile("c++", source, "cc", "cpp_names");
    let data = std::fs::read(&bin).unwrap();
    let syms = LibSymbols::from_elf(&data).unwrap();
    let (start, _) = symbol_range(&data, "_ZN8geometry4areaEdd");
    let info = syms.lookup(start);
    assert_eq!(info.symbol.unwrap().name, "geometry::area(double, double)");
    assert_eq!(
        info.frames.last().unwrap().function,
        "geometry::area(double, double)"
    );
}

#[test]
fn a_function_both_inlined_and_called_is_one_func() {
    // `scale` is inlined into `compute`, and its address is also taken, so an out-of-line
    // copy with its own symbol exists.
    let source = r#"
        static inline __attribute__((always_inline)) double scale(double x) { return x * 3.5 + 1.0; }
        double (*volatile table)(double) = scale;
        __attribute__((noinline)) double compute(double x) { return scale(x) + scale(x + 1); }
        int main(int argc, char **argv) { (void)argv; return (int)(compute(argc) + table(argc)); }
    "#;
    let bin = compile("cc", source, "c", "both");
    let data = std::fs::read(&bin).unwrap();
    let syms = LibSymbols::from_elf(&data).unwrap();
    let (scale_start, _) = symbol_range(&data, "scale");
    let (compute_start, compute_size) = symbol_range(&data, "compute");
    let inlined_at = (compute_start..compute_start + compute_size)
        .find(|&a| syms.lookup(a).frames.iter().any(|f| f.function == "scale"))
        .expect("scale is inlined somewhere in compute");

    // Two samples: main > compute > scale (inlined) and scale (called out of line).
    use sampler::profile::*;
    let lib = Lib {
        name: "both".into(),
        path: bin.display().to_string(),
        build_id: None,
        kind: LibKind::File,
        base: 0,
    };
    let frame = |address| AddressFrame {
        lib: Some(LibIndex(0)),
        address,
        kind: CodeKind::User,
    };
    let raw = RawProfile {
        meta: Profile::from_named_stacks(&[]).meta,
        libs: vec![lib],
        address_frames: vec![frame(inlined_at), frame(scale_start)],
        stacks: vec![
            RawStack {
                prefix: None,
                frame: AddressFrameIndex(0),
            },
            RawStack {
                prefix: None,
                frame: AddressFrameIndex(1),
            },
        ],
        processes: vec![Process {
            pid: 1,
            name: "both".into(),
            start_ms: 0.0,
            end_ms: None,
        }],
        threads: vec![Thread {
            tid: 1,
            process: ProcessIndex(0),
            name: "both".into(),
            is_main: true,
            start_ms: 0.0,
            end_ms: None,
            samples: vec![
                SampleRow {
                    time_ms: 0.0,
                    stack: RawStackIndex(0),
                    weight: 1,
                },
                SampleRow {
                    time_ms: 1.0,
                    stack: RawStackIndex(1),
                    weight: 1,
                },
            ],
        }],
    };
    let p = sampler::symbolicate::apply(raw, &[Ok(syms)]);
    let scale_funcs: Vec<&Func> = p.funcs.iter().filter(|f| f.name == "scale").collect();
    assert_eq!(
        scale_funcs.len(),
        1,
        "inlined and out-of-line scale must be one func: {:?}",
        p.funcs
    );
    let inline_frame = p
        .frames
        .iter()
        .find(|f| p.funcs[f.func.index()].name == "scale" && f.inline_depth > 0);
    assert!(
        inline_frame.is_some(),
        "the inlined copy is an inline frame"
    );
}
