//! Builds the kernel unwinder's eBPF program, `bpf/unwind.bpf.c`, with clang into the
//! build's output directory, where `record::kernel_walk` includes it. It needs only the
//! kernel's UAPI headers (from the C library's development files) and clang with its BPF
//! target: `scripts/install` and `.ci/run` install clang where it is missing.

use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "bpf/unwind.bpf.c";

fn main() {
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
