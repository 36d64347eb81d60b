//! Builds the kernel unwinder's eBPF program, `bpf/unwind.bpf.c`, with clang into the
//! build's output directory, where `record::kernel_walk` includes it. It needs only the
//! kernel's UAPI headers (from the C library's development files) and clang with its BPF
//! target: `scripts/install` and `.ci/run` install clang where it is missing.
//!
//! It also links the binary with its relative relocations packed (DT_RELR) where the
//! linker and the C library here support it.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "bpf/unwind.bpf.c";

fn main() {
    pack_relocations();
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
/// program built here by this rustc, for this target, with this linker and these flags,
/// and linked so, runs here. sampler is position-independent: its 11,000 relative
/// relocations took 268 KiB of `.rela.dyn`, which the loader reads in full at start and
/// which stayed resident for the whole run; packed, they take 3 KiB. Elsewhere (a cross
/// build, a C library without DT_RELR) they stay as they are; a linker that ignores the
/// flag ignores it for both.
fn pack_relocations() {
    const FLAG: &str = "-Wl,-z,pack-relative-relocs";
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let var = |name: &str| std::env::var(name).ok();
    let (Some(dir), Some(rustc), Some(target)) = (var("OUT_DIR"), var("RUSTC"), var("TARGET"))
    else {
        return;
    };
    if var("HOST").as_deref() != Some(target.as_str()) {
        return;
    }
    let dir = PathBuf::from(dir);
    let (source, program) = (dir.join("relr.rs"), dir.join("relr"));
    // A reference to a static: a relative relocation, packed by the flag.
    let code = "static X: i32 = 7;\nstatic P: &i32 = &X;\n\
                fn main() { std::process::exit(*std::hint::black_box(P) - 7) }\n";
    let mut build = Command::new(rustc);
    build
        .args(["--edition", "2021", "--target", &target])
        .arg(format!("-Clink-arg={FLAG}"));
    if let Some(linker) = var("RUSTC_LINKER") {
        build.arg(format!("-Clinker={linker}"));
    }
    let flags = var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    build.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    build.arg("-o").arg(&program).arg(&source);
    let runs = std::fs::write(&source, code).is_ok()
        && build.status().is_ok_and(|s| s.success())
        && Command::new(&program).status().is_ok_and(|s| s.success());
    if runs {
        println!("cargo:rustc-link-arg-bins={FLAG}");
    }
}
