//! The symbolicator against binaries compiled by the test: ELF symbols, DWARF lines,
//! inline chains, demangling, DWARF 4 and 5 with and without compressed sections, and
//! separate debug files found by `.gnu_debuglink`. Needs a C and a C++ compiler and GNU
//! binutils (objcopy, strip); no privileges.

use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSymbol};
use sampler::symbolicate::LibSymbols;

fn compile(compiler: &str, source: &str, ext: &str, name: &str) -> PathBuf {
    compile_with(compiler, source, ext, name, &[])
}

/// Compiles `source` with `-O2 -g` and `flags` (bench-targets' headers are on the
/// include path) into a fresh directory.
fn compile_with(compiler: &str, source: &str, ext: &str, name: &str, flags: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-tmp")
        .join(format!("sym-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.{ext}"));
    std::fs::create_dir_all(src.parent().unwrap()).unwrap();
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let status = Command::new(compiler)
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-I"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-targets"))
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("{compiler} runs: {e}"));
    assert!(status.success(), "{compiler} {flags:?} failed");
    out
}

fn inline3_source() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-targets/inline3.c"))
        .unwrap()
}

/// What the symbolicator says about every byte of function `name` in `data`.
fn lookups(syms: &LibSymbols, data: &[u8], name: &str) -> Vec<sampler::symbolicate::AddressInfo> {
    let (start, size) = symbol_range(data, name);
    (start..start + size).map(|a| syms.lookup(a)).collect()
}

/// The DWARF version of the first unit, and how `.debug_info` is compressed.
fn dwarf_layout(data: &[u8]) -> (u16, &'static str) {
    use object::ObjectSection;
    let file = object::File::parse(data).unwrap();
    let (section, how) = match file.section_by_name(".zdebug_info") {
        Some(s) => (s, "zlib-gnu"),
        None => {
            let s = file.section_by_name(".debug_info").unwrap();
            let how = match s.compressed_file_range().unwrap().format {
                object::CompressionFormat::None => "none",
                object::CompressionFormat::Zstandard => "zstd",
                _ => "zlib",
            };
            (s, how)
        }
    };
    let bytes = section.uncompressed_data().unwrap();
    // A unit header: 4-byte length (32-bit DWARF), then the 2-byte version.
    (u16::from_le_bytes([bytes[4], bytes[5]]), how)
}

fn dwarf_4_and_5_compressed_or_not_give_the_same_answers() {
    let source = inline3_source();
    // Compression must not change a single answer; DWARF 4 and 5 (gcc emits slightly
    // different line tables for them) must both give the inline chain and the names.
    // gcc cannot write zstd: that variant is the previous one, recompressed by objcopy.
    let variants: [(&[&str], u16, &str); 5] = [
        (&["-gdwarf-5"], 5, "none"),
        (&["-gdwarf-5", "-gz=zlib"], 5, "zlib"),
        (&["-gdwarf-5"], 5, "zstd"),
        (&["-gdwarf-4"], 4, "none"),
        (&["-gdwarf-4", "-gz=zlib-gnu"], 4, "zlib-gnu"),
    ];
    let mut uncompressed = None;
    for (i, (flags, version, compression)) in variants.iter().enumerate() {
        // The same file name in each variant's directory, so the answers can be equal.
        let bin = compile_with("cc", &source, "c", &format!("v{i}/inline3"), flags);
        if *compression == "zstd" {
            binutils(
                bin.parent().unwrap(),
                "objcopy",
                &["--compress-debug-sections=zstd", "inline3"],
            );
        }
        let data = std::fs::read(&bin).unwrap();
        assert_eq!(
            dwarf_layout(&data),
            (*version, *compression),
            "{flags:?} gives the layout under test"
        );
        let syms = LibSymbols::from_elf(&data).unwrap();
        assert!(syms.dwarf.is_some(), "{flags:?}: DWARF is read");
        let answers: Vec<_> = lookups(&syms, &data, "work")
            .into_iter()
            .map(|mut a| {
                // Each variant lives in its own directory.
                for f in &mut a.frames {
                    f.file = f.file.take().map(|p| p.replace(&format!("/v{i}/"), "/"));
                }
                a
            })
            .collect();
        let names: Vec<&str> = answers
            .iter()
            .max_by_key(|a| a.frames.len())
            .unwrap()
            .frames
            .iter()
            .map(|f| f.function.as_str())
            .collect();
        assert_eq!(names, ["work", "level1", "level2", "level3"], "{flags:?}");
        // Read from the file, each section inflated into a buffer of its own, as
        // recording reads libraries: the same answers.
        let binary = sampler::files::binary::Binary::open(&bin).unwrap();
        let opts = sampler::symbolicate::SymbolOptions::default();
        let from_file = LibSymbols::load(&binary, bin.to_str().unwrap(), &opts).unwrap();
        let (start, size) = symbol_range(&data, "work");
        let again: Vec<_> = (start..start + size).map(|a| from_file.lookup(a)).collect();
        assert_eq!(
            again,
            lookups(&syms, &data, "work"),
            "{flags:?} ({compression}) read from the file"
        );
        if *compression == "none" {
            uncompressed = Some(answers);
        } else {
            assert_eq!(
                uncompressed.as_ref(),
                Some(&answers),
                "{flags:?} answers as the same DWARF uncompressed"
            );
        }
    }
}

/// A file whose DWARF is compressed, named through the symbol cache: the first run
/// makes an inflated copy and reads it, kept when the run saves (a run that does not
/// leaves nothing); the second, which meets a function the cache's entry lacks, reads
/// the copy (its use renews its modification time). Every run gives the answers the
/// file gives. A copy made from another version of the file is not used.
fn compressed_dwarf_is_read_from_an_inflated_copy_on_later_runs() {
    use sampler::symbolicate::cache::{inflated, SymbolCache};
    use std::time::{Duration, SystemTime};
    let source = inline3_source();
    for (i, (flags, recompress)) in [
        (&["-gdwarf-5", "-gz=zlib"][..], None),
        (&["-gdwarf-5"][..], Some("zstd")),
        (&["-gdwarf-4", "-gz=zlib-gnu"][..], None),
    ]
    .into_iter()
    .enumerate()
    {
        let bin = compile_with("cc", &source, "c", &format!("inflate{i}/inline3"), flags);
        if let Some(how) = recompress {
            binutils(
                bin.parent().unwrap(),
                "objcopy",
                &[&format!("--compress-debug-sections={how}"), "inline3"],
            );
        }
        let data = std::fs::read(&bin).unwrap();
        assert_ne!(dwarf_layout(&data).1, "none", "{flags:?} compresses");
        let path = bin.to_str().unwrap();
        let root = bin.parent().unwrap().join("cache");
        let cache = std::sync::Arc::new(SymbolCache::at(root.clone(), None));
        let opts = sampler::symbolicate::SymbolOptions {
            cache: Some(cache.clone()),
            ..Default::default()
        };
        let binary = sampler::files::binary::Binary::open(&bin).unwrap();
        let copy = cache
            .dir()
            .join(inflated::file_name(binary.build_id.as_ref().unwrap()));
        // A copy that would not fit is refused before anything is inflated or written.
        let at = binary.at();
        let reader = object::ReadCache::new(at.clone());
        let elf = sampler::files::elf::Elf::parse(&reader).unwrap();
        let mut small = tempfile_in(bin.parent().unwrap());
        let refused = inflated::write(&elf, &at, &[0; 5], &mut small, 100);
        assert!(
            matches!(refused, Err(inflated::NotWritten::Unfit(_))),
            "{flags:?}: a copy over the bound is refused"
        );
        assert_eq!(
            small.metadata().unwrap().len(),
            0,
            "{flags:?}: nothing written"
        );
        let whole = LibSymbols::from_elf(&data).unwrap();
        let name = |function: &str| {
            let (start, size) = symbol_range(&data, function);
            let addresses: Vec<u64> = (start..start + size).collect();
            let (_, infos) =
                sampler::symbolicate::name_file(&binary, path, &addresses, &opts).unwrap();
            let expected: Vec<_> = addresses.iter().map(|&a| whole.lookup(a)).collect();
            assert_eq!(
                infos, expected,
                "{flags:?}: {function} as the file names it"
            );
            cache.save().unwrap();
        };
        {
            let unsaved = std::sync::Arc::new(SymbolCache::at(root.clone(), None));
            let opts = sampler::symbolicate::SymbolOptions {
                cache: Some(unsaved.clone()),
                ..Default::default()
            };
            let (start, _) = symbol_range(&data, "work");
            sampler::symbolicate::name_file(&binary, path, &[start], &opts).unwrap();
        }
        assert!(
            !root.join("sampler").exists(),
            "{flags:?}: a run that does not save leaves neither copy nor directory"
        );
        name("work");
        assert!(copy.exists(), "{flags:?}: the first reading makes a copy");
        let copied = std::fs::read(&copy).unwrap();
        assert!(
            dwarf_layout(&copied) == (dwarf_layout(&data).0, "none"),
            "{flags:?}: the copy's DWARF is inflated"
        );
        let old = SystemTime::now() - Duration::from_secs(3600);
        // Whether the copy is still as old as `make_old` made it (a use renews it).
        let unused = || {
            std::fs::metadata(&copy).unwrap().modified().unwrap() < old + Duration::from_secs(60)
        };
        let make_old = || {
            let file = std::fs::File::options().write(true).open(&copy).unwrap();
            file.set_modified(old).unwrap();
        };
        make_old();
        name("main");
        assert!(!unused(), "{flags:?}: the second reading uses the copy");
        // The file changes (its change time): the copy is another version's.
        make_old();
        std::fs::set_permissions(&bin, std::fs::metadata(&bin).unwrap().permissions()).unwrap();
        let binary = sampler::files::binary::Binary::open(&bin).unwrap();
        let (start, _) = symbol_range(&data, "register_tm_clones");
        sampler::symbolicate::name_file(&binary, path, &[start], &opts).unwrap();
        assert!(unused(), "{flags:?}: another version's copy is not used");
    }
}

/// A new, empty file in `dir`, open for writing.
fn tempfile_in(dir: &Path) -> std::fs::File {
    std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("small-copy"))
        .unwrap()
}

/// Runs a GNU binutils command in `dir`.
fn binutils(dir: &Path, program: &str, args: &[&str]) {
    let status = Command::new(program)
        .current_dir(dir)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(status.success(), "{program} {args:?}");
}

fn debuglink_without_build_id_is_matched_by_crc() {
    let source = inline3_source();
    let bin = compile_with("cc", &source, "c", "linked", &["-Wl,--build-id=none"]);
    let dir = bin.parent().unwrap();
    let original = std::fs::read(&bin).unwrap();
    let expected = lookups(&LibSymbols::from_elf(&original).unwrap(), &original, "work");
    binutils(
        dir,
        "objcopy",
        &["--only-keep-debug", "linked", "linked.debug"],
    );
    binutils(dir, "strip", &["--strip-all", "linked"]);
    binutils(
        dir,
        "objcopy",
        &["--add-gnu-debuglink=linked.debug", "linked"],
    );

    let load = || {
        let binary = sampler::files::binary::Binary::open(&bin).unwrap();
        assert!(binary.build_id.is_none() && binary.debuglink.is_some());
        let opts = sampler::symbolicate::SymbolOptions {
            debug_roots: vec![dir.join("no-debug-root")],
            ..Default::default()
        };
        LibSymbols::load(&binary, bin.to_str().unwrap(), &opts).unwrap()
    };
    let syms = load();
    assert_eq!(
        syms.debug_file.as_deref(),
        Some(dir.join("linked.debug").as_path())
    );
    let (start, size) = symbol_range(&original, "work");
    let got: Vec<_> = (start..start + size).map(|a| syms.lookup(a)).collect();
    assert_eq!(
        got, expected,
        "the debug file answers as the unstripped file did"
    );

    // A debug file whose CRC differs (rebuilt, or changed since) is not used.
    let mut changed = std::fs::read(dir.join("linked.debug")).unwrap();
    changed.push(0);
    std::fs::write(dir.join("linked.debug"), changed).unwrap();
    let syms = load();
    assert!(syms.dwarf.is_none() && syms.debug_file.is_none());
    assert!(
        syms.no_debug_info
            .as_deref()
            .unwrap()
            .contains("does not match"),
        "{:?}",
        syms.no_debug_info
    );
}

fn symbol_range(data: &[u8], name: &str) -> (u64, u64) {
    let file = object::File::parse(data).unwrap();
    let s = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no symbol {name}"));
    (s.address(), s.size())
}

fn inline_chain_lines_and_symbols_of_a_compiled_program() {
    let source = inline3_source();
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

/// g++ mangles `std::is_enum<T>::value` in a return type the old way (`sr <type>
/// <name>`, issue 13); the profile's name and `sampler demangle` give what c++filt gives,
/// in cpp_demangle's parentheses.
fn gcc_names_of_qualified_members_are_demangled() {
    let source = r#"
        #include <type_traits>
        template <typename T>
        __attribute__((noinline)) typename std::enable_if<!std::is_enum<T>::value
            && std::is_integral<typename std::remove_pointer<T>::type>::value, int>::type
        pick(T x) { return (int)x * 3; }
        int main(int argc, char **) { return pick<long>(argc); }
    "#;
    let bin = compile("c++", source, "cc", "gcc_sr");
    let data = std::fs::read(&bin).unwrap();
    let mangled = "_Z4pickIlENSt9enable_ifIXaantsrSt7is_enumIT_E5valuesrSt11is_integralINSt14remove_pointerIS2_E4typeEE5valueEiE4typeES2_";
    let want = "std::enable_if<(!(std::is_enum<long>::value))&&(std::is_integral<std::remove_pointer<long>::type>::value), int>::type pick<long>(long)";
    let syms = LibSymbols::from_elf(&data).unwrap();
    let (start, _) = symbol_range(&data, mangled);
    let info = syms.lookup(start);
    assert_eq!(info.symbol.unwrap().name, want);
    assert_eq!(info.frames.last().unwrap().function, want, "from DWARF");
    let out = Command::new(env!("CARGO_BIN_EXE_sampler"))
        .args(["demangle", mangled, "main"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{want}\nmain\n")
    );
}

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
            lost_samples: 0,
            samples: vec![
                SampleRow {
                    time_ms: 0.0,
                    stack: RawStackIndex(0),
                    weight: sampler::profile::SampleWeight::OnCpu(1),
                },
                SampleRow {
                    time_ms: 1.0,
                    stack: RawStackIndex(1),
                    weight: sampler::profile::SampleWeight::OnCpu(1),
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

fn many_addresses_on_several_threads_answer_as_one_at_a_time() {
    // This test's own executable: large enough for lookup_many to split the work.
    let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let syms = LibSymbols::from_elf(&data).unwrap();
    assert!(syms.dwarf.is_some(), "test binaries carry line tables");
    let file = object::File::parse(&*data).unwrap();
    let mut addresses: Vec<u64> = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 4)
        .flat_map(|s| [s.address(), s.address() + s.size() / 2])
        .take(6000)
        .collect();
    // Out of order, as a profile's addresses come.
    addresses.reverse();
    assert!(addresses.len() >= 4000, "{} addresses", addresses.len());
    let one_by_one: Vec<_> = addresses.iter().map(|&a| syms.lookup(a)).collect();
    assert!(one_by_one.iter().filter(|i| !i.frames.is_empty()).count() > addresses.len() / 2);
    assert_eq!(syms.lookup_many(&addresses), one_by_one);
}

/// The PLT entries objdump names in `bin`: (start, name), for labels `<name@plt>`.
fn objdump_plt_entries(bin: &Path) -> Vec<(u64, String)> {
    let out = Command::new("objdump")
        .arg("-d")
        .arg(bin)
        .output()
        .expect("objdump runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (address, label) = line.strip_suffix(">:")?.split_once(" <")?;
            label.strip_suffix("@plt")?;
            Some((u64::from_str_radix(address, 16).ok()?, label.to_string()))
        })
        .collect()
}

fn plt_entries_are_named_after_the_functions_they_call() {
    let source = r#"
        #include <stdio.h>
        #include <string.h>
        int main(int argc, char **argv) {
            size_t n = 0;
            for (int i = 0; i < argc; i++) n += strlen(argv[i]);
            printf("%zu\n", n);
            return 0;
        }
    "#;
    // Lazy binding (`.plt`, entries after the header), and IBT (`.plt.sec`), both with
    // `.plt.got` for `__cxa_finalize`.
    for (name, flags, stubs) in [
        ("plt_lazy", &[][..], ".plt"),
        (
            "plt_ibt",
            &["-fcf-protection", "-Wl,-z,ibtplt"][..],
            ".plt.sec",
        ),
    ] {
        let bin = compile_with("cc", source, "c", name, flags);
        let data = std::fs::read(&bin).unwrap();
        let file = object::File::parse(&*data).unwrap();
        assert!(file.section_by_name(stubs).is_some(), "{name} has {stubs}");
        let syms = LibSymbols::from_elf(&data).unwrap();
        let entries = objdump_plt_entries(&bin);
        let mut names: Vec<&str> = entries.iter().map(|(_, n)| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["__cxa_finalize@plt", "printf@plt", "strlen@plt"],
            "{name}"
        );
        for (start, want) in &entries {
            // Every byte of the stub, as a sample could land on any of them.
            for address in *start..start + 6 {
                let got = syms.lookup(address).symbol.expect("a PLT symbol");
                assert_eq!((got.name.as_str(), got.address), (want.as_str(), *start));
            }
        }
        // Loaded for the addresses of a profile (as recording names a library), the
        // stubs that hold one are named the same; the others are not read.
        let binary = sampler::files::binary::Binary::open(&bin).unwrap();
        let opts = sampler::symbolicate::SymbolOptions::default();
        let (asked_start, asked_name) = &entries[0];
        let asked = [asked_start + 3];
        let few = LibSymbols::load_for(&binary, bin.to_str().unwrap(), &opts, Some(&asked), false)
            .unwrap();
        let got = few.lookup(asked[0]).symbol.expect("the stub asked for");
        assert_eq!(
            (got.name.as_str(), got.address),
            (asked_name.as_str(), *asked_start)
        );
        for (start, name) in &entries[1..] {
            let other = few.lookup(*start).symbol.map(|s| s.name);
            assert_ne!(
                other.as_deref(),
                Some(name.as_str()),
                "{name} was not asked for"
            );
        }
        // The lazy-binding header calls no one function.
        let plt = file.section_by_name(".plt").unwrap();
        use object::ObjectSection;
        assert_eq!(
            syms.lookup(plt.address()).symbol.unwrap().name,
            sampler::symbolicate::PLT_NAME
        );
    }
}

fn plt_stubs_of_cpp_functions_are_demangled() {
    assert_eq!(
        sampler::symbolicate::demangle("_ZdlPvm@plt"),
        "operator delete(void*, unsigned long)@plt"
    );
}

fn symbolize_names_an_address_as_the_profile_does() {
    // `impl_free` is the function DWARF describes; `pub_free` a global alias of it, the
    // name a profile shows (as glibc's DWARF says `__GI___libc_free` where its symbol
    // table says `free`).
    let source = r#"
        __attribute__((noinline)) static int impl_free(int x) { return x * 7 + 1; }
        extern int pub_free(int) __attribute__((alias("impl_free")));
        int main(int argc, char **argv) { (void)argv; return pub_free(argc); }
    "#;
    let bin = compile("cc", source, "c", "aliases");
    let data = std::fs::read(&bin).unwrap();
    let (start, _) = symbol_range(&data, "pub_free");
    assert_eq!(symbol_range(&data, "impl_free").0, start, "one address");
    let info = LibSymbols::from_elf(&data).unwrap().lookup(start);
    assert_eq!(info.frames[0].function, "impl_free", "DWARF's name");
    assert_eq!(info.symbol.as_ref().unwrap().name, "pub_free");
    assert_eq!(info.function_names(), ["pub_free"]);
    let out = Command::new(env!("CARGO_BIN_EXE_sampler"))
        .args(["symbolize", "-e"])
        .arg(&bin)
        .arg(format!("{start:x}"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..2], [format!("0x{start:x}").as_str(), "pub_free"]);
}

/// Addresses that probe every edge of `file`'s function symbols: each symbol's first,
/// middle and last byte and the bytes just outside it, and every byte of its PLTs.
fn probing_addresses(data: &[u8], every: usize) -> Vec<u64> {
    use object::ObjectSection;
    let file = object::File::parse(data).unwrap();
    let mut addresses: Vec<u64> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0)
        .step_by(every)
        .flat_map(|s| {
            let (a, n) = (s.address(), s.size());
            [a - 1, a, a + n / 2, (a + n).saturating_sub(1), a + n]
        })
        .collect();
    for s in file.sections() {
        if matches!(s.name(), Ok(".plt" | ".plt.sec" | ".plt.got")) {
            addresses.extend(s.address()..s.address() + s.size());
        }
    }
    addresses
}

fn symbol_tables_read_for_some_addresses_answer_as_the_whole_tables() {
    // libc (its separate debug file from libc6-dbg when installed: DWARF, a full symbol
    // table, IFUNCs behind its PLT), this test's own executable (Rust, with DWARF), and a
    // copy of it without `.debug_aranges` (as Go and clang's DWARF 5 write them), whose
    // units are found by the ranges their roots give.
    let exe = std::env::current_exe().unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-tmp")
        .join(format!("sym-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let no_aranges = dir.join("no-aranges");
    binutils(
        &dir,
        "objcopy",
        &[
            "--remove-section=.debug_aranges",
            exe.to_str().unwrap(),
            no_aranges.to_str().unwrap(),
        ],
    );
    for (path, every) in [
        (PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"), 1),
        (exe, 5),
        (no_aranges.clone(), 5),
    ] {
        some_addresses_answer_as_the_whole_file(&path, every);
    }
    std::fs::remove_file(&no_aranges).unwrap();
}

/// A Go program (stdlib only): Go writes no `.debug_aranges`, and an inlined function's
/// abstract entry lies in its package's unit, which a unit looked up refers to.
fn go_programs_read_for_some_addresses_answer_as_the_whole_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-tmp")
        .join(format!("go-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("main.go"),
        "package main\n\nimport (\n\t\"encoding/json\"\n\t\"fmt\"\n\t\"os\"\n)\n\n\
         func main() {\n\tout, _ := json.Marshal(map[string]int{\"a\": len(os.Args)})\n\
         \tfmt.Println(string(out))\n}\n",
    )
    .unwrap();
    let status = Command::new("go")
        .args(["build", "-o", "jsonout", "main.go"])
        .current_dir(&dir)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "")
        .status()
        .unwrap();
    assert!(status.success(), "go build");
    let bin = dir.join("jsonout");
    let data = std::fs::read(&bin).unwrap();
    let file = object::File::parse(&*data).unwrap();
    use object::Object;
    assert!(
        file.section_by_name(".debug_aranges").is_none(),
        "Go writes no aranges"
    );
    some_addresses_answer_as_the_whole_file(&bin, 3);

    // Each address where a function of another package is inlined, looked up alone:
    // the unit of that package (where the inlined function's entry lies) is read too.
    let opts = sampler::symbolicate::SymbolOptions::default();
    let name = bin.to_str().unwrap();
    let binary = sampler::files::binary::Binary::open(&bin).unwrap();
    let whole = LibSymbols::load(&binary, name, &opts).unwrap();
    let package = |function: &str| function.split('.').next().unwrap_or("").to_string();
    let across: Vec<u64> = probing_addresses(&data, 1)
        .into_iter()
        .filter(|&a| {
            let frames = whole.lookup(a).frames;
            frames.len() > 1 && package(&frames[0].function) != package(&frames[1].function)
        })
        .step_by(7)
        .take(12)
        .collect();
    assert!(
        across.len() >= 5,
        "{} addresses inline across packages",
        across.len()
    );
    for a in across {
        let alone = LibSymbols::load_for(&binary, name, &opts, Some(&[a]), false).unwrap();
        assert!(alone.dwarf.as_ref().unwrap().units_left_out() > 0);
        assert_eq!(alone.lookup(a), whole.lookup(a), "at {a:#x}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Symbols and DWARF read for some addresses of `path` (every `every`th function's
/// edges, then a profile's few) answer each as the whole file read does, with DWARF
/// units left out for the few.
fn some_addresses_answer_as_the_whole_file(path: &Path, every: usize) {
    let binary = sampler::files::binary::Binary::open(path).unwrap();
    let data = std::fs::read(path).unwrap();
    let addresses = probing_addresses(&data, every);
    assert!(
        addresses.len() > 2000,
        "{}: {} addresses",
        path.display(),
        addresses.len()
    );
    let opts = sampler::symbolicate::SymbolOptions::default();
    let name = path.to_str().unwrap();
    let whole = LibSymbols::load(&binary, name, &opts).unwrap();
    let some = LibSymbols::load_for(&binary, name, &opts, Some(&addresses), false).unwrap();
    assert!(some.symbols.len() < whole.symbols.len());
    let mut inlined = 0;
    for &a in &addresses {
        let expected = whole.lookup(a);
        inlined += expected.frame_symbols.iter().skip(1).flatten().count();
        assert_eq!(some.lookup(a), expected, "{} at {a:#x}", path.display());
    }
    assert_eq!(some.facts(), whole.facts());
    assert!(
        inlined > 0,
        "{}: no inlined function also called",
        path.display()
    );

    // A profile's few addresses: the symbols, and the DWARF units `.debug_aranges`
    // places none of them in left out, answer them as the whole file does.
    let few: Vec<u64> = addresses.iter().step_by(97).copied().collect();
    let some = LibSymbols::load_for(&binary, name, &opts, Some(&few), false).unwrap();
    if let Some(dwarf) = &some.dwarf {
        assert!(
            dwarf.units_left_out() > 0,
            "{}: no unit left out",
            path.display()
        );
    }
    let mut with_lines = 0;
    for &a in &few {
        let expected = whole.lookup(a);
        with_lines += usize::from(expected.frames.iter().any(|f| f.line.is_some()));
        assert_eq!(some.lookup(a), expected, "{} at {a:#x}", path.display());
    }
    assert!(
        with_lines * 2 > few.len(),
        "{}: {with_lines} of {} with lines",
        path.display(),
        few.len()
    );

    // Continuous mode's memo: the first load streams the tables, the second scans
    // and keeps them, the third (for other addresses) finds its symbols and index by
    // name there; all answer as the whole file does.
    let memo = std::sync::Arc::new(sampler::symbolicate::ScanMemo::default());
    let memo_opts = sampler::symbolicate::SymbolOptions {
        scan_memo: Some(memo.clone()),
        ..Default::default()
    };
    for (set, kept_files) in [(&few, 0), (&addresses, 1), (&few, 1)] {
        let kept = LibSymbols::load_for(&binary, name, &memo_opts, Some(set), false).unwrap();
        for &a in set {
            let expected = whole.lookup(a);
            assert_eq!(kept.lookup(a), expected, "{} at {a:#x}", path.display());
        }
        assert_eq!(memo.files(), kept_files, "{}", path.display());
    }
}

/// The tests of this module, for the offline binary's `main`.
pub fn tests() -> Vec<crate::common::Test> {
    crate::tests![
        dwarf_4_and_5_compressed_or_not_give_the_same_answers;
        compressed_dwarf_is_read_from_an_inflated_copy_on_later_runs;
        debuglink_without_build_id_is_matched_by_crc;
        inline_chain_lines_and_symbols_of_a_compiled_program;
        cpp_names_are_demangled;
        gcc_names_of_qualified_members_are_demangled;
        a_function_both_inlined_and_called_is_one_func;
        many_addresses_on_several_threads_answer_as_one_at_a_time;
        plt_entries_are_named_after_the_functions_they_call;
        plt_stubs_of_cpp_functions_are_demangled;
        symbolize_names_an_address_as_the_profile_does;
        symbol_tables_read_for_some_addresses_answer_as_the_whole_tables;
        go_programs_read_for_some_addresses_answer_as_the_whole_file:
            crate::common::Need::Program("go", &["version"]);
    ]
}
