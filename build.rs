//! Builds the kernel unwinder's eBPF program, `bpf/unwind.bpf.c`, with clang into the
//! build's output directory, where `record::kernel_walk` includes it. It needs only the
//! kernel's UAPI headers (from the C library's development files) and clang with its BPF
//! target: `scripts/install` and `.ci/run` install clang where it is missing.
//!
//! It also links the binary with its relative relocations packed (DT_RELR), and with the
//! functions a recording runs laid out first in its text (`link/text-order.txt`), where
//! the linker and the C library here support it.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "bpf/unwind.bpf.c";

fn main() {
    pack_relocations();
    order_text();
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=SAMPLER_CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("unwind.bpf.o");
    let clang = std::env::var("SAMPLER_CLANG").unwrap_or_else(|_| "clang".into());
    // The multiarch directory holds asm/ptrace.h, which the BPF target does not search.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("-I/usr/include/{arch}-linux-gnu");
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(multiarch)
        .args(["-c", SOURCE, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} could not compile {SOURCE} ({s})"),
        Err(e) => panic!(
            "{SOURCE} is compiled with clang, which could not be run ({e}): install clang \
             (Debian: apt-get install clang), or set SAMPLER_CLANG to its path"
        ),
    }
}

/// Links the binary with `-z pack-relative-relocs` (DT_RELR; glibc 2.36 reads it) when a
/// program linked so runs here (see `links`). sampler is position-independent: its 11,000
/// relative relocations took 268 KiB of `.rela.dyn`, which the loader reads in full at
/// start and which stayed resident for the whole run; packed, they take 3 KiB. Elsewhere
/// (a cross build, a C library without DT_RELR) they stay as they are; a linker that
/// ignores the flag ignores it for both.
fn pack_relocations() {
    const FLAG: &str = "-Wl,-z,pack-relative-relocs";
    if links("relr", &[FLAG.into()]) {
        println!("cargo:rustc-link-arg-bins={FLAG}");
    }
}

/// Lays out the functions listed in `link/text-order.txt` (written by `scripts/order-text`,
/// which says how) first in the binary's text, in that order, when the linker takes a
/// symbol ordering file (LLD, rustc's linker for this target since 1.90). The kernel maps
/// code 64 KiB at a time around each page first run: scattered over the 6 MB of text,
/// the 1,400 to 1,900 functions of a warm recording kept 4.7 MiB of it resident;
/// together, 2 MiB.
/// Names the binary lacks (another profile's, a stale file's) are skipped in silence.
/// Sets `SAMPLER_TEXT_ORDERED` for the tests when the layout was asked for.
fn order_text() {
    const LIST: &str = "link/text-order.txt";
    println!("cargo:rerun-if-changed={LIST}");
    let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let list = PathBuf::from(dir).join(LIST);
    if !list.is_file() {
        return;
    }
    let flags = [
        format!("-Wl,--symbol-ordering-file={}", list.display()),
        "-Wl,--no-warn-symbol-ordering".to_string(),
    ];
    if links("order", &flags) {
        for flag in &flags {
            println!("cargo:rustc-link-arg-bins={flag}");
        }
        println!("cargo:rustc-env=SAMPLER_TEXT_ORDERED=1");
    }
}

/// Whether a program built here by this rustc, for this target, with this linker and
/// these flags, and linked with `flags` too, builds and runs (never for a cross build).
/// `name` names its files in the build's output directory.
fn links(name: &str, flags: &[String]) -> bool {
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let var = |name: &str| std::env::var(name).ok();
    let (Some(dir), Some(rustc), Some(target)) = (var("OUT_DIR"), var("RUSTC"), var("TARGET"))
    else {
        return false;
    };
    if var("HOST").as_deref() != Some(target.as_str()) {
        return false;
    }
    let dir = PathBuf::from(dir);
    let (source, program) = (dir.join(format!("{name}.rs")), dir.join(name));
    // A reference to a static: a relative relocation (packed by the first caller's flag).
    let code = "static X: i32 = 7;\nstatic P: &i32 = &X;\n\
                fn main() { std::process::exit(*std::hint::black_box(P) - 7) }\n";
    let mut build = Command::new(rustc);
    build.args(["--edition", "2021", "--target", &target]);
    build.args(flags.iter().map(|f| format!("-Clink-arg={f}")));
    if let Some(linker) = var("RUSTC_LINKER") {
        build.arg(format!("-Clinker={linker}"));
    }
    let rustflags = var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    build.args(rustflags.split('\x1f').filter(|f| !f.is_empty()));
    build.arg("-o").arg(&program).arg(&source);
    std::fs::write(&source, code).is_ok()
        && build.status().is_ok_and(|s| s.success())
        && Command::new(&program).status().is_ok_and(|s| s.success())
}
