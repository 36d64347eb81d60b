//! A profile that uses every part of the processed format, for the round-trip tests of
//! the reader and writer and for the golden files of every export.

use crate::profile::*;

/// A profile that uses every part of the format: libraries of each kind, files,
/// native symbols and inline depths, kernel and marker frames, two processes, sample
/// weights, lost samples and symbol gaps.
pub(crate) fn rich_profile() -> Profile {
    let mut p = Profile::from_named_stacks(&[
        &[
            "[truncated]",
            "main",
            "work",
            "level1",
            "[kernel] do_syscall_64",
        ],
        &["main", "work", "level1"],
        &["main", "work"],
    ]);
    for (name, kind) in [
        ("app", LibKind::File),
        (KERNEL_LIB_NAME, LibKind::Kernel),
        (VDSO_NAME, LibKind::File),
        ("perf-42.map", LibKind::PerfMap),
    ] {
        p.libs.push(Lib {
            name: name.into(),
            path: format!("/x/{name}"),
            build_id: (kind == LibKind::File).then(|| vec![0xab, 0x01, 0xff]),
            kind,
            base: 0,
        });
    }
    p.native_symbols.push(NativeSymbol {
        lib: LibIndex(0),
        address: 0x1000,
        size: Some(64),
        name: "work".into(),
    });
    for f in &mut p.funcs {
        match f.name.as_str() {
            "main" | "work" | "level1" => {
                f.lib = Some(LibIndex(0));
                f.file = Some("/src/app.c".into());
            }
            "[kernel] do_syscall_64" => f.lib = Some(LibIndex(1)),
            _ => {}
        }
    }
    for fr in &mut p.frames {
        let func = &p.funcs[fr.func.index()];
        fr.lib = func.lib;
        match func.name.as_str() {
            "[truncated]" => fr.kind = CodeKind::Marker,
            "[kernel] do_syscall_64" => {
                fr.kind = CodeKind::Kernel;
                fr.address = Some(0x77);
            }
            "work" => {
                fr.address = Some(0x1010);
                fr.native_symbol = Some(NativeSymbolIndex(0));
                fr.line = Some(12);
            }
            "level1" => {
                fr.address = Some(0x1010);
                fr.native_symbol = Some(NativeSymbolIndex(0));
                fr.inline_depth = 1;
                fr.line = Some(3);
            }
            _ => fr.address = Some(0x2000),
        }
    }
    p.threads[0].samples[1].weight = SampleWeight::OnCpu(3);
    p.threads[0].lost_samples = 7;
    let mut other = p.threads[0].clone();
    other.tid = 99;
    other.name = "worker".into();
    other.is_main = false;
    other.process = ProcessIndex(1);
    other.end_ms = Some(2.5);
    p.threads.push(other);
    p.processes.push(Process {
        pid: 99,
        name: "child".into(),
        start_ms: 1.0,
        end_ms: Some(3.0),
    });
    p.symbol_gaps = vec![
        SymbolGap {
            lib: LibIndex(3),
            missing: Missing::Symbols,
            why: "JIT code, but no /tmp/perf-42.map was written".into(),
        },
        SymbolGap {
            lib: LibIndex(0),
            missing: Missing::DebugInfo,
            why: "no DWARF".into(),
        },
    ];
    p.meta = Meta {
        start_unix_ms: 1.7e12,
        interval_ms: 0.5,
        duration_ms: 3.0,
        event: "cpu-clock".into(),
        time_event: true,
        frequency_hz: 2000,
        period: Some(500_000),
        command: vec!["app".into(), "-n".into(), "3 4".into()],
        lost_samples: 14,
        throttled: 2,
        kernel_included: true,
        truncated_stacks: 2,
        restored_callers: 1,
        logical_cpus: 2,
        off_cpu: false,
    };
    p
}
