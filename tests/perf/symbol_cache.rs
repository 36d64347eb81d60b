//! The symbol cache against real binaries: what it keeps of a function answers every
//! address in it exactly as reading the file's debug information does (bench-targets'
//! inline3, the sampler binary, libc with its separate debug file, the kernel's
//! symbols), a warm run answers without reading the debug file, and a changed debug
//! file, other debug roots, or a damaged entry make the entry be rebuilt; `symbolize`
//! and `record` through it say what they say without it, and under sudo the cache is
//! the invoking user's. Needs bench-targets built (make), Debian's libc6-dbg for libc,
//! root for sudo, perf for recording.

#[path = "../common/mod.rs"]
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

use object::{Object, ObjectSection, ObjectSymbol};
use sampler::files::binary::Binary;
use sampler::symbolicate::cache::{self, EntryBuilder, Key, SymbolCache};
use sampler::symbolicate::{self, AddressInfo, LibSymbols, SymbolOptions};

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-tmp")
        .join(format!("symbol-cache-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn bench_target(name: &str) -> PathBuf {
    PathBuf::from(target(name))
}

/// The sized function symbols of an ELF file (and of its debug file, when given).
fn functions(files: &[&Path]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for path in files {
        let data = std::fs::read(path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        for s in file.symbols().chain(file.dynamic_symbols()) {
            if s.kind() == object::SymbolKind::Text && s.size() > 0 && s.address() > 0 {
                out.push((s.address(), s.size()));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The addresses of `.text` of `path`, every `stride`th.
fn text_addresses(path: &Path, stride: usize) -> Vec<u64> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let text = file.section_by_name(".text").unwrap();
    (text.address()..text.address() + text.size())
        .step_by(stride)
        .collect()
}

/// Every address of every `nth` function, and every `stride`th of the whole text.
fn addresses(path: &Path, debug: Option<&Path>, nth: usize, stride: usize) -> Vec<u64> {
    let mut files = vec![path];
    files.extend(debug);
    let mut out: Vec<u64> = functions(&files)
        .into_iter()
        .step_by(nth)
        .flat_map(|(start, size)| start..start + size.min(1 << 16))
        .collect();
    out.extend(text_addresses(path, stride));
    out.sort_unstable();
    out.dedup();
    out
}

/// Resolving whole functions gives every address what a lookup of it gives; so does the
/// entry made of those functions, written and read back.
fn check_exact(path: &Path, debug_roots: Vec<PathBuf>, addresses: &[u64]) {
    let binary = Binary::open(path).unwrap();
    let opts = SymbolOptions {
        debug_roots,
        ..Default::default()
    };
    let syms = LibSymbols::load(&binary, path.to_str().unwrap(), &opts).unwrap();
    let expected = syms.lookup_many(addresses);
    let pieces = std::sync::Mutex::new(Vec::new());
    let resolved = syms.resolve_many(addresses, &|function| {
        pieces.lock().unwrap().extend_from_slice(function)
    });
    let pieces = pieces.into_inner().unwrap();
    let mut differ = 0;
    for ((address, want), got) in addresses.iter().zip(&expected).zip(&resolved) {
        if want != got && differ < 5 {
            eprintln!("{}: 0x{address:x}:\n  {want:?}\n  {got:?}", path.display());
        }
        differ += usize::from(want != got);
    }
    assert_eq!(differ, 0, "{}: resolved answers differ", path.display());
    let key = Key::of(&binary).unwrap();
    let mut builder = EntryBuilder::default();
    for (range, info) in &pieces {
        builder.add(range.clone(), info);
    }
    let bytes = builder.finish(&key, &syms.facts(), &cache::DebugSource::Own);
    let entry = cache::Entry::parse(bytes, &key).unwrap();
    for (address, want) in addresses.iter().zip(&expected) {
        assert_eq!(
            entry.lookup(*address).as_ref(),
            Some(want),
            "{}: 0x{address:x} from the entry",
            path.display()
        );
    }
    assert!(
        !expected.iter().all(|i| i.frames.is_empty()),
        "{} has DWARF",
        path.display()
    );
}

fn functions_of_inline3_answer_as_lookups_do() {
    let path = bench_target("inline3");
    let all = addresses(&path, None, 1, 1);
    check_exact(&path, Vec::new(), &all);
}

fn functions_of_the_sampler_binary_answer_as_lookups_do() {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_sampler"));
    let some = addresses(&path, None, 37, 101);
    check_exact(&path, Vec::new(), &some);
}

/// libc's debug file, when Debian's libc6-dbg is installed.
fn libc_debug_file() -> Option<String> {
    let binary = Binary::open(Path::new(LIBC))?;
    let path = sampler::files::locate::build_id_path(
        Path::new(symbolicate::DEFAULT_DEBUG_ROOT),
        binary.build_id.as_ref()?,
    );
    path.exists().then(|| path.display().to_string())
}

fn functions_of_libc_with_its_debug_file_answer_as_lookups_do() {
    let debug = PathBuf::from(libc_debug_file().expect("the test's need"));
    let some = addresses(Path::new(LIBC), Some(&debug), 3, 7);
    check_exact(Path::new(LIBC), symbolicate::debug_roots(&[]), &some);
}

/// Names `addresses` of `path` through a cache at `root`.
fn name(
    path: &Path,
    addresses: &[u64],
    roots: Vec<PathBuf>,
    root: &Path,
) -> (symbolicate::LibFacts, Vec<AddressInfo>) {
    let opts = SymbolOptions {
        debug_roots: symbolicate::debug_roots(&roots),
        cache: Some(std::sync::Arc::new(SymbolCache::at(
            root.to_path_buf(),
            None,
        ))),
        ..Default::default()
    };
    let binary = Binary::open(path).unwrap();
    let named = symbolicate::name_file(&binary, path.to_str().unwrap(), addresses, &opts).unwrap();
    opts.cache.as_ref().unwrap().save().unwrap();
    named
}

/// A copy of inline3 with its debug information in a separate debug file under a debug
/// root of its own, found by build ID.
fn stripped_inline3(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let original = bench_target("inline3");
    let stripped = dir.join("inline3");
    let root = dir.join("debug-root");
    let binary = Binary::open(&original).unwrap();
    let debug = sampler::files::locate::build_id_path(&root, binary.build_id.as_ref().unwrap());
    std::fs::create_dir_all(debug.parent().unwrap()).unwrap();
    let run = |args: &[&std::ffi::OsStr]| {
        let status = Command::new("objcopy").args(args).status().unwrap();
        assert!(status.success());
    };
    run(&[
        "--only-keep-debug".as_ref(),
        original.as_os_str(),
        debug.as_os_str(),
    ]);
    run(&[
        "--strip-debug".as_ref(),
        "--strip-unneeded".as_ref(),
        original.as_os_str(),
        stripped.as_os_str(),
    ]);
    (stripped, root, debug)
}

fn a_warm_run_answers_without_reading_the_debug_file() {
    let dir = scratch("warm");
    let (path, root, debug) = stripped_inline3(&dir);
    let cache_root = dir.join("cache");
    let some = addresses(&bench_target("inline3"), None, 1, 3);
    let (facts, cold) = name(&path, &some, vec![root.clone()], &cache_root);
    assert!(facts.no_debug_info.is_none(), "{facts:?}");
    assert!(cold.iter().any(|i| i.frames.len() > 1), "inline chains");
    // The debug file's bytes are spoilt, its identity kept: a run that read it would
    // find no DWARF (and another build ID).
    let identity = std::fs::metadata(&debug).unwrap();
    let len = identity.len() as usize;
    std::fs::write(&debug, vec![0u8; len]).unwrap();
    let file = std::fs::File::options().write(true).open(&debug).unwrap();
    file.set_modified(identity.modified().unwrap()).unwrap();
    drop(file);
    let (warm_facts, warm) = name(&path, &some, vec![root.clone()], &cache_root);
    assert_eq!(
        (&warm_facts, &warm),
        (&facts, &cold),
        "answered from the cache"
    );

    // A changed debug file (another modification time) is read again.
    let file = std::fs::File::options().write(true).open(&debug).unwrap();
    file.set_modified(std::time::SystemTime::now()).unwrap();
    drop(file);
    let (facts, spoilt) = name(&path, &some, vec![root.clone()], &cache_root);
    assert!(facts.no_debug_info.is_some(), "{facts:?}");
    assert!(spoilt.iter().all(|i| i.frames.is_empty()));
    let _ = std::fs::remove_dir_all(&dir);
}

fn another_debug_root_or_a_new_debug_file_makes_the_entry_stale() {
    let dir = scratch("stale");
    let (path, root, debug) = stripped_inline3(&dir);
    let cache_root = dir.join("cache");
    let some = addresses(&bench_target("inline3"), None, 1, 5);
    // Without the debug root: no DWARF, and a reason naming where it was looked for.
    let (facts, without) = name(&path, &some, vec![dir.join("elsewhere")], &cache_root);
    let why = facts.no_debug_info.unwrap();
    assert!(why.contains("elsewhere/.build-id"), "{why}");
    assert!(without.iter().all(|i| i.frames.is_empty()));
    // Answered from the cache, the reason still names the roots of this run.
    let (facts, again) = name(&path, &some, vec![dir.join("other")], &cache_root);
    assert_eq!(again, without);
    let why = facts.no_debug_info.unwrap();
    assert!(why.contains("other/.build-id"), "{why}");
    // With the root that has the debug file, it is used at once.
    let (facts, with) = name(&path, &some, vec![root.clone()], &cache_root);
    assert!(facts.no_debug_info.is_none(), "{facts:?}");
    assert!(with.iter().any(|i| i.frames.len() > 1));
    // And when it is removed, no longer.
    std::fs::remove_file(&debug).unwrap();
    let (facts, gone) = name(&path, &some, vec![root], &cache_root);
    assert!(facts.no_debug_info.is_some());
    assert_eq!(gone, without);
    let _ = std::fs::remove_dir_all(&dir);
}

fn a_damaged_entry_is_rebuilt() {
    let dir = scratch("damaged");
    let path = bench_target("inline3");
    let cache_root = dir.join("cache");
    let some = addresses(&path, None, 1, 1);
    let (_, first) = name(&path, &some, Vec::new(), &cache_root);
    let entries: Vec<PathBuf> = std::fs::read_dir(cache_root.join("sampler/symbols"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let good = std::fs::read(&entries[0]).unwrap();
    for damage in [good[..good.len() / 2].to_vec(), Vec::new(), {
        let mut b = good.clone();
        let i = b.len() - 3;
        b[i] ^= 0x40;
        b
    }] {
        std::fs::write(&entries[0], &damage).unwrap();
        let (_, again) = name(&path, &some, Vec::new(), &cache_root);
        assert_eq!(again, first);
        assert_eq!(std::fs::read(&entries[0]).unwrap(), good, "rewritten whole");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The kernel's table (all its own functions, from the first run of a boot that needs
/// one) answers every address of them as a lookup in `/proc/kallsyms` does, and none of
/// a module's.
fn the_kernel_table_answers_as_kallsyms_lookups_do() {
    let made_up = "\
ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81000010 t helper
ffffffff81000040 W weak_one
ffffffff81000100 D some_data
ffffffff81000200 T last
ffffffffc0001000 t mod_fn\t[kvm]
ffffffffc0002000 t bpf_prog_6deef7357e7b4530_sd_fw_egress\t[bpf]
";
    let real = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let key = Key {
        build_id: vec![7; 20],
        size: 1,
        stamp: Default::default(),
    };
    for text in [made_up, real.as_str()] {
        let Some(kallsyms) = symbolicate::Kallsyms::parse(text, "") else {
            eprintln!("SKIPPED for /proc/kallsyms: its addresses are hidden (run as root)");
            continue;
        };
        let own = kallsyms.own.clone().expect("modules lie apart");
        let base = kallsyms.text_start;
        let bytes = symbolicate::kernel_table(text, base, &key)
            .unwrap()
            .joined();
        // As a run reads it: from its file; with as many lookups as here, names and all.
        let path = tempdir().join("kernel-table");
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let table = cache::KernelTable::open(file, bytes.len() as u64, &key, usize::MAX).unwrap();
        let starts: Vec<u64> = kallsyms.map.symbols().iter().map(|s| s.address).collect();
        let last_own = starts
            .iter()
            .rfind(|&&s| own.contains(&s))
            .copied()
            .unwrap();
        let mut covered = 0;
        for (i, &start) in starts.iter().enumerate() {
            let end = starts.get(i + 1).copied().unwrap_or(start + 1);
            for probe in [start, start + (end - start) / 2, end - 1] {
                match table.lookup(probe.wrapping_sub(base)) {
                    cache::InTable::Function(at, name) => {
                        assert!(own.contains(&probe), "0x{probe:x} is a module's");
                        let expected = kallsyms.map.lookup(probe).unwrap();
                        assert_eq!(
                            (at + base, name.as_str()),
                            (expected.address, &*expected.name)
                        );
                        covered += 1;
                    }
                    other => assert!(
                        !own.contains(&probe) || probe >= last_own || probe < base,
                        "0x{probe:x} of the kernel's own is not in the table: {other:?}"
                    ),
                }
            }
        }
        eprintln!("{covered} addresses of {} functions", table.len());
        assert!(covered > 0);
    }
}

/// `sampler symbolize -e PROGRAM ADDRESS...` with `options` and the environment `env`;
/// its standard output and error.
fn symbolize(
    program: &Path,
    addresses: &[u64],
    options: &[&str],
    env: &[(&str, &Path)],
) -> (String, String) {
    let mut cmd = Command::new(sampler_bin());
    cmd.args(["symbolize", "-e"]).arg(program).args(options);
    cmd.args(addresses.iter().map(|a| format!("{a:x}")));
    for (name, value) in env {
        cmd.env(name, value);
    }
    let o = cmd.output().expect("sampler runs");
    assert!(o.status.success(), "sampler failed: {}", stderr(&o));
    (String::from_utf8_lossy(&o.stdout).into_owned(), stderr(&o))
}

/// `symbolize` prints the same, cold (filling the cache), warm and with `--no-cache`,
/// which neither reads nor writes it.
fn symbolize_says_the_same_through_the_cache() {
    let dir = scratch("symbolize");
    let (path, root, _) = stripped_inline3(&dir);
    let some = addresses(&bench_target("inline3"), None, 1, 7);
    let cache = dir.join("cache");
    let env = [("XDG_CACHE_HOME", cache.as_path())];
    let root = root.display().to_string();
    let with_root = ["--debug-root", root.as_str()];
    let off = [&with_root[..], &["--no-cache"]].concat();
    let (uncached, _) = symbolize(&path, &some, &off, &env);
    assert!(!cache.exists(), "--no-cache writes nothing");
    assert!(uncached.contains("inline3.c:"), "{uncached}");
    let (cold, _) = symbolize(&path, &some, &with_root, &env);
    let entries = std::fs::read_dir(cache.join("sampler/symbols"))
        .unwrap()
        .count();
    assert_eq!(entries, 1, "one entry, the program's");
    let (warm, _) = symbolize(&path, &some, &with_root, &env);
    assert_eq!(cold, uncached);
    assert_eq!(warm, uncached);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A recording fills the cache; the next one, named from it, names the same functions,
/// inlined calls included.
fn a_recording_fills_the_cache_and_the_next_names_from_it() {
    let dir = scratch("record");
    let cache = dir.join("cache");
    let names = |run: &str| {
        let out = dir.join(format!("{run}.json"));
        let o = Command::new(sampler_bin())
            .args(["record", "-o"])
            .arg(&out)
            .args(["--", &target("split7030"), "1"])
            .env("XDG_CACHE_HOME", &cache)
            .output()
            .expect("sampler runs");
        assert!(o.status.success(), "sampler failed: {}", stderr(&o));
        let p = load_checked(&out);
        ffp_check(&out);
        let mut names: Vec<(String, u64)> = thread_frames(&p)
            .into_iter()
            .flat_map(|(_, stacks)| stacks)
            .flatten()
            .filter(|f| ["main", "outer", "hot_a", "hot_b", "sum_to"].contains(&f.name.as_str()))
            .map(|f| (f.name, f.inline_depth))
            .collect();
        names.sort();
        names.dedup();
        names
    };
    let cold = names("cold");
    assert!(cold.contains(&("sum_to".to_string(), 1)), "{cold:?}");
    let entries: Vec<_> = std::fs::read_dir(cache.join("sampler/symbols"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let split7030 = Binary::open(&bench_target("split7030")).unwrap();
    let hex: String = split7030
        .build_id
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        entries
            .iter()
            .any(|e| e.to_string_lossy().starts_with(&hex)),
        "{entries:?}"
    );
    assert_eq!(names("warm"), cold);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The user nobody, in whose name `sudo` would have been run.
const NOBODY: u32 = 65534;

/// Under sudo the cache is the invoking user's: created in their cache directory and
/// given to them; a link planted in it, or a directory of someone else's, is not written
/// through, and naming goes on without the cache.
fn under_sudo_the_cache_is_the_users_and_links_are_not_followed() {
    use std::os::unix::fs::{chown, symlink, MetadataExt};
    let dir = scratch("sudo");
    let program = bench_target("inline3");
    let some = addresses(&program, None, 1, 13);
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
    let as_sudo = |cache: &Path| {
        let mut cmd = Command::new(sampler_bin());
        cmd.args(["symbolize", "-e"]).arg(&program);
        cmd.args(some.iter().map(|a| format!("{a:x}")));
        let o = cmd
            .env("SUDO_UID", NOBODY.to_string())
            .env("SUDO_GID", NOBODY.to_string())
            .env("XDG_CACHE_HOME", cache)
            .output()
            .expect("sampler runs");
        assert!(o.status.success(), "sampler failed: {}", stderr(&o));
        (String::from_utf8_lossy(&o.stdout).into_owned(), stderr(&o))
    };
    let (expected, _) = symbolize(&program, &some, &["--no-cache"], &[]);

    // The cache does not exist yet: sampler creates it, and everything in it is nobody's.
    let cache = home.join(".cache");
    let (out, _) = as_sudo(&cache);
    assert_eq!(out, expected);
    let symbols = cache.join("sampler/symbols");
    let entry = std::fs::read_dir(&symbols)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    for path in [cache.clone(), cache.join("sampler"), symbols.clone(), entry] {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (NOBODY, NOBODY),
            "{} belongs to the user who ran sudo",
            path.display()
        );
    }
    let (warm, _) = as_sudo(&cache);
    assert_eq!(warm, expected);

    // `sampler` or `sampler/symbols` in the user's cache is a link to a directory of
    // root's, or `sampler` is root's own directory: nothing is written there, the run goes
    // on and says why.
    let roots_dir = dir.join("roots");
    std::fs::create_dir_all(&roots_dir).unwrap();
    let users = |name: &str, dirs: &[&str]| {
        let mut path = home.join(name);
        std::fs::create_dir_all(&path).unwrap();
        chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
        for dir in dirs {
            path = path.join(dir);
            std::fs::create_dir_all(&path).unwrap();
            chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        path
    };
    symlink(&roots_dir, users("linked", &[]).join("sampler")).unwrap();
    symlink(
        &roots_dir,
        users("linked-below", &["sampler"]).join("symbols"),
    )
    .unwrap();
    std::fs::create_dir_all(users("others", &[]).join("sampler")).unwrap();
    for (name, why) in [
        ("linked", "is a symbolic link"),
        ("linked-below", "is a symbolic link"),
        ("others", "belongs to user 0"),
    ] {
        let cache = home.join(name);
        let (out, err) = as_sudo(&cache);
        assert_eq!(out, expected);
        assert!(err.contains("symbol cache: cannot write into"), "{err}");
        assert!(err.contains(why), "{err}");
        eprintln!("{}: {}", cache.display(), err.trim());
        assert_eq!(
            std::fs::read_dir(&roots_dir).unwrap().count(),
            0,
            "nothing written through the link into root's directory"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The mode bits of `path` (not through a link).
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// The running kernel's build ID in hex, from its notes (`NT_GNU_BUILD_ID` of `GNU`).
fn kernel_build_id() -> String {
    let notes = std::fs::read("/sys/kernel/notes").unwrap();
    let mut at = 0;
    let word = |at: usize| u32::from_le_bytes(notes[at..at + 4].try_into().unwrap()) as usize;
    while at + 12 <= notes.len() {
        let (name, desc, kind) = (word(at), word(at + 4), word(at + 8));
        let desc_at = at + 12 + name.next_multiple_of(4);
        if kind == 3 && &notes[at + 12..at + 12 + name] == b"GNU\0" {
            return sampler::symbolicate::debuginfod::hex(&notes[desc_at..desc_at + desc]);
        }
        at = desc_at + desc.next_multiple_of(4);
    }
    panic!("the kernel's notes hold no build ID");
}

/// Records `dd`, which spends its time in the kernel, with the symbol cache in `cache`
/// (and `options`).
fn record_kernel_work(cache: &Path, out: &Path, options: &[&str]) {
    let o = Command::new(sampler_bin())
        .arg("record")
        .args(options)
        .arg("-o")
        .arg(out)
        .args([
            "--",
            "dd",
            "if=/dev/zero",
            "of=/dev/null",
            "bs=64k",
            "count=100000",
        ])
        .env("XDG_CACHE_HOME", cache)
        .output()
        .expect("sampler runs");
    assert!(o.status.success(), "sampler failed: {}", stderr(&o));
    ffp_check(out);
}

/// The cache is its user's alone: directories 0700 and files 0600, those of an older
/// cache (0755, 0644) made so when it is opened; and the kernel's table, whose name was
/// once a checksum of public facts and of where the kernel's text starts (some hundreds
/// of possible values: anyone who could list the cache found the address in seconds),
/// is named with a secret of the cache's: two caches of one boot name it apart.
fn the_cache_is_private_and_its_kernel_names_give_no_address_away() {
    let dir = scratch("private");
    let kernel = kernel_build_id();
    let kernel_tables = |cache: &Path| -> std::collections::BTreeSet<String> {
        std::fs::read_dir(cache.join("sampler/symbols"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(&format!("kernel-{kernel}-")))
            .collect()
    };
    // A cache as an earlier sampler left it, open to everyone.
    let first = dir.join("first");
    let symbols = first.join("sampler/symbols");
    std::fs::create_dir_all(&symbols).unwrap();
    let older = symbols.join("00-0");
    std::fs::write(&older, b"an entry of an older version").unwrap();
    for (path, mode) in [
        (first.join("sampler"), 0o755),
        (symbols.clone(), 0o755),
        (older.clone(), 0o644),
    ] {
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .unwrap();
    }
    record_kernel_work(&first, &dir.join("first.json"), &[]);
    let second = dir.join("second");
    record_kernel_work(&second, &dir.join("second.json"), &[]);

    let (a, b) = (kernel_tables(&first), kernel_tables(&second));
    eprintln!("kernel tables: {a:?} and {b:?}");
    assert!(
        a.len() == 1 && b.len() == 1,
        "the kernel was cached, as one table: {a:?} {b:?}"
    );
    let shared: Vec<&String> = a.intersection(&b).collect();
    assert!(
        shared.is_empty(),
        "{} kernel tables have the same name in two caches: their names follow from public facts and the kernel's address ({:?})",
        shared.len(),
        shared.first()
    );
    for cache in [&first, &second] {
        for sub in ["sampler", "sampler/symbols"] {
            let path = cache.join(sub);
            assert_eq!(mode(&path), 0o700, "{}", path.display());
        }
        let files = std::fs::read_dir(cache.join("sampler/symbols"))
            .unwrap()
            .chain(std::fs::read_dir(cache.join("sampler")).unwrap())
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file());
        for path in files {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The kernel frames of the profile at `out`, each named as a lookup in kallsyms
/// (`text`, whose kernel text starts at `base`) names its address; returns how many.
fn kernel_frames_named_as_kallsyms_says(out: &Path, kallsyms: &symbolicate::Kallsyms) -> usize {
    let mut checked = 0;
    for (_, stacks) in thread_frames(&load_checked(out)) {
        for frame in stacks.into_iter().flatten() {
            if frame.lib.as_deref() != Some("[kernel.kallsyms]") {
                continue;
            }
            let address = frame.address.expect("a kernel frame has its address");
            let expected = kallsyms
                .map
                .lookup(address.wrapping_add(kallsyms.text_start))
                .map(|s| s.name);
            assert_eq!(Some(frame.name.clone()), expected, "0x{address:x}");
            checked += 1;
        }
    }
    checked
}

/// The first run of a boot that names kernel frames writes one table of the kernel's
/// functions (not one entry per 64 KiB of its text: 641 files, 15 MB here), removes the
/// tables of the boots before beyond the two used last, and the entries an older
/// sampler kept of this kernel; a run with the table names the kernel's frames from it
/// as kallsyms does, as does one without the cache, and a damaged table is written
/// anew.
fn a_boot_writes_one_kernel_table_and_the_boots_before_go() {
    let dir = scratch("boots");
    let cache = dir.join("cache");
    let symbols = cache.join("sampler/symbols");
    std::fs::create_dir_all(&symbols).unwrap();
    for path in [cache.join("sampler"), symbols.clone()] {
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
    }
    let kernel = kernel_build_id();
    // Tables of three boots before, used a day, two days and three days ago, and
    // entries of an older sampler's kind for this kernel.
    let day = std::time::Duration::from_secs(86_400);
    let planted: Vec<String> = (1..=3)
        .map(|n| format!("kernel-{kernel}-{n:016x}"))
        .chain((0..5).map(|n| format!("{kernel}-{n:x}")))
        .collect();
    for (i, name) in planted.iter().enumerate() {
        let path = symbols.join(name);
        std::fs::write(&path, vec![1u8; 20_000]).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let when = std::time::SystemTime::now() - day * (i as u32 % 3 + 1);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(when)
            .unwrap();
    }
    let kallsyms = symbolicate::read_kallsyms().expect("root reads kallsyms");
    let listed = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&symbols)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains(&kernel))
            .collect();
        names.sort();
        names
    };
    let cold = dir.join("cold.json");
    record_kernel_work(&cache, &cold, &[]);
    let left = listed();
    let this_boot: Vec<&String> = left.iter().filter(|n| !planted.contains(n)).collect();
    eprintln!("the kernel's files after the first run: {left:?}");
    assert_eq!(this_boot.len(), 1, "one table for this boot: {left:?}");
    assert!(this_boot[0].starts_with(&format!("kernel-{kernel}-")));
    assert_eq!(
        left.iter()
            .filter(|n| planted.contains(n))
            .collect::<Vec<_>>(),
        [&planted[0], &planted[1]],
        "the two tables used last before are kept; the oldest and the older kind's entries go"
    );
    let table = symbols.join(this_boot[0]);
    let size = std::fs::metadata(&table).unwrap().len();
    assert!(size < 16 << 20, "{size} bytes");
    let cold_frames = kernel_frames_named_as_kallsyms_says(&cold, &kallsyms);
    assert!(cold_frames > 0, "dd was sampled in the kernel");

    let warm = dir.join("warm.json");
    record_kernel_work(&cache, &warm, &[]);
    assert_eq!(
        listed(),
        left,
        "a run with the table writes nothing of the kernel"
    );
    assert!(kernel_frames_named_as_kallsyms_says(&warm, &kallsyms) > 0);

    // Without the cache: only what the addresses need is read from kallsyms.
    let uncached = dir.join("uncached.json");
    record_kernel_work(&cache, &uncached, &["--no-cache"]);
    assert!(kernel_frames_named_as_kallsyms_says(&uncached, &kallsyms) > 0);
    assert_eq!(listed(), left);

    // Damaged: cut short. Read anew from kallsyms and written whole again.
    let whole = std::fs::read(&table).unwrap();
    std::fs::write(&table, &whole[..whole.len() / 2]).unwrap();
    let again = dir.join("again.json");
    record_kernel_work(&cache, &again, &[]);
    assert!(kernel_frames_named_as_kallsyms_says(&again, &kallsyms) > 0);
    assert_eq!(std::fs::read(&table).unwrap().len(), whole.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program rebuilt with a fixed `--build-id` and the same size is named from its new
/// symbols, not from the entry of the old build: rewritten in place with its
/// modification time put back, and replaced by a new file.
fn a_file_rebuilt_with_the_same_build_id_and_size_is_named_afresh() {
    rebuilt_in_place_and_replaced(
        "rebuilt",
        "-Wl,--build-id=0x5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a",
    );
}

/// A file without a build ID (as rustc and its libraries are) has an entry named after
/// its device, inode and size, which a later run answers from (and renews); rebuilt in
/// place or replaced, it is named afresh.
fn a_file_without_a_build_id_is_cached_by_its_inode() {
    rebuilt_in_place_and_replaced("no-build-id", "-Wl,--build-id=none");
}

/// Two builds of one size whose functions lie at one address (linked with
/// `build_id_flag`), named through the cache: the first, the second written over it in
/// place (its modification time put back), then the first as a new file.
fn rebuilt_in_place_and_replaced(name: &str, build_id_flag: &str) {
    use std::os::unix::fs::MetadataExt;
    let dir = scratch(name);
    let build = |function: &str, out: &Path| {
        let source = dir.join(format!("{function}.c"));
        std::fs::write(
            &source,
            format!(
                "__attribute__((noinline)) int {function}(int x) {{ return x * 3 + 1; }}\n\
                 int main(int argc, char **argv) {{ (void)argv; return {function}(argc); }}\n"
            ),
        )
        .unwrap();
        run(Command::new("cc")
            .args(["-O1", "-g", build_id_flag, "-o"])
            .arg(out)
            .arg(&source));
        let data = std::fs::read(out).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let address = file
            .symbols()
            .find(|s| s.name() == Ok(function))
            .unwrap()
            .address();
        (data, address)
    };
    let (alpha, alpha_at) = build("alpha_fn", &dir.join("alpha"));
    let (bravo, bravo_at) = build("bravo_fn", &dir.join("bravo"));
    assert_eq!(alpha.len(), bravo.len(), "the two builds have one size");
    assert_eq!(alpha_at, bravo_at, "and their functions one address");
    let cache = dir.join("cache");
    let env = [("XDG_CACHE_HOME", cache.as_path())];
    let program = dir.join("program");
    std::fs::write(&program, &alpha).unwrap();
    let (out, _) = symbolize(&program, &[alpha_at], &[], &env);
    assert!(out.contains("alpha_fn"), "{out}");
    let entries: Vec<PathBuf> = std::fs::read_dir(cache.join("sampler/symbols"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "the program's entry: {entries:?}");
    let meta = std::fs::metadata(&program).unwrap();
    if build_id_flag.ends_with("=none") {
        let want = format!("file-{:x}-{:x}-{:x}", meta.dev(), meta.ino(), meta.len());
        assert!(entries[0].ends_with(&want), "{entries:?}, not {want}");
        // A second run answers from it, and renews it.
        let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let file = std::fs::File::options()
            .write(true)
            .open(&entries[0])
            .unwrap();
        file.set_modified(long_ago).unwrap();
        drop(file);
        let (again, _) = symbolize(&program, &[alpha_at], &[], &env);
        assert_eq!(again, out);
        let used = std::fs::metadata(&entries[0]).unwrap().modified().unwrap();
        assert!(
            used > long_ago + std::time::Duration::from_secs(60),
            "not used"
        );
    }

    // Rewritten in place (same inode), its modification time put back.
    let mtime = std::fs::metadata(&program).unwrap().modified().unwrap();
    std::fs::write(&program, &bravo).unwrap();
    let file = std::fs::File::options().write(true).open(&program).unwrap();
    file.set_modified(mtime).unwrap();
    drop(file);
    let (out, _) = symbolize(&program, &[alpha_at], &[], &env);
    assert!(
        out.contains("bravo_fn") && !out.contains("alpha_fn"),
        "named from the old build: {out}"
    );
    let (again, _) = symbolize(&program, &[alpha_at], &[], &env);
    assert_eq!(again, out, "and from the new entry");

    // Replaced by a new file, as a linker writes it.
    std::fs::write(dir.join("new"), &alpha).unwrap();
    std::fs::rename(dir.join("new"), &program).unwrap();
    let (out, _) = symbolize(&program, &[alpha_at], &[], &env);
    assert!(
        out.contains("alpha_fn") && !out.contains("bravo_fn"),
        "named from the old build: {out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Files in `dir` that look like entries of long ago: `count` of them, each `len` bytes
/// long and taking `allocated` bytes of the disk (fallocate, keeping the length).
fn old_entries(dir: &Path, count: usize, len: usize, allocated: u64) -> std::io::Result<usize> {
    let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
    for i in 0..count {
        let path = dir.join(format!("{i:040x}-100"));
        let file = std::fs::File::create(&path)?;
        let written = (&file).write_all(&vec![7u8; len]).and_then(|()| {
            if allocated > len as u64 {
                nix::fcntl::fallocate(
                    &file,
                    nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                    0,
                    allocated as i64,
                )?;
            }
            file.set_modified(long_ago)
        });
        if let Err(e) = written {
            drop(file);
            let _ = std::fs::remove_file(&path);
            return match e.raw_os_error() {
                Some(libc::ENOSPC) => Ok(i),
                _ => Err(e),
            };
        }
    }
    Ok(count)
}

/// The bytes of the disk the files of `dir` take.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().blocks() * 512)
        .sum()
}

/// The bound of the cache is what its entries take of the disk: three entries of 100
/// bytes that take 100 MiB each are more than the 256 MiB, and the oldest go.
fn the_bound_counts_what_entries_take_of_the_disk() {
    let dir = scratch("blocks");
    let cache = dir.join("cache");
    let symbols = cache.join("sampler/symbols");
    std::fs::create_dir_all(&symbols).unwrap();
    assert_eq!(old_entries(&symbols, 3, 100, 100 << 20).unwrap(), 3);
    let before = allocated(&symbols);
    assert!(before > cache::MAX_TOTAL_BYTES, "{before}");
    let program = bench_target("inline3");
    let some = addresses(&program, None, 1, 13);
    symbolize(&program, &some, &[], &[("XDG_CACHE_HOME", cache.as_path())]);
    let after = allocated(&symbols);
    eprintln!(
        "the cache took {} MiB of the disk, then {} MiB",
        before >> 20,
        after >> 20
    );
    assert!(
        after <= cache::MAX_TOTAL_BYTES,
        "the cache takes {after} bytes of the disk, above its bound"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tmpfs of `kib` KiB at `dir`, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: PathBuf, kib: u32) -> SmallDisk {
        std::fs::create_dir_all(&dir).unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&dir));
        SmallDisk(dir)
    }

    /// Free bytes, as an ordinary user may use them.
    fn free(&self) -> u64 {
        let s = nix::sys::statvfs::statvfs(&self.0).unwrap();
        s.blocks_available() as u64 * s.fragment_size() as u64
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A cache on a file system that it has filled: the write that fails makes the cache
/// give up half of what it holds, so the disk is not left full, and the next run's
/// entry fits.
fn a_full_disk_is_not_kept_full_by_the_cache() {
    let dir = scratch("full");
    let disk = SmallDisk::mount(dir.join("disk"), 1024);
    let symbols = disk.0.join("sampler/symbols");
    std::fs::create_dir_all(&symbols).unwrap();
    std::fs::set_permissions(
        disk.0.join("sampler"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    std::fs::set_permissions(
        &symbols,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let filled = old_entries(&symbols, 1 << 20, 4096, 0).unwrap();
    assert_eq!(disk.free(), 0, "the disk is full after {filled} entries");
    let program = bench_target("inline3");
    let some = addresses(&program, None, 1, 13);
    let env = [("XDG_CACHE_HOME", disk.0.as_path())];
    let (expected, _) = symbolize(&program, &some, &["--no-cache"], &env);
    let (out, err) = symbolize(&program, &some, &[], &env);
    assert_eq!(out, expected, "named as without the cache");
    eprintln!("{}", err.trim());
    assert!(err.contains("symbol cache: cannot write into"), "{err}");
    let free = disk.free();
    eprintln!("free after the failed write: {free} bytes of 1 MiB");
    assert!(
        free >= 400 << 10,
        "the cache keeps the disk full: {free} bytes free"
    );
    // The next run's entry fits.
    let (out, err) = symbolize(&program, &some, &[], &env);
    assert_eq!(out, expected);
    assert!(!err.contains("symbol cache"), "{err}");
    let hex = sampler::symbolicate::debuginfod::hex(
        Binary::open(&program).unwrap().build_id.as_ref().unwrap(),
    );
    assert!(
        std::fs::read_dir(&symbols).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(&hex)),
        "the program's entry was written"
    );
    drop(disk);
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    run_tests(tests![
        functions_of_inline3_answer_as_lookups_do;
        functions_of_the_sampler_binary_answer_as_lookups_do;
        functions_of_libc_with_its_debug_file_answer_as_lookups_do:
            Need::Located("libc's debug file (libc6-dbg)", libc_debug_file);
        a_warm_run_answers_without_reading_the_debug_file;
        another_debug_root_or_a_new_debug_file_makes_the_entry_stale;
        a_damaged_entry_is_rebuilt;
        the_kernel_table_answers_as_kallsyms_lookups_do;
        symbolize_says_the_same_through_the_cache;
        a_recording_fills_the_cache_and_the_next_names_from_it: Need::Perf;
        under_sudo_the_cache_is_the_users_and_links_are_not_followed: Need::Root;
        the_cache_is_private_and_its_kernel_names_give_no_address_away:
            Need::Perf, Need::Root, Need::KernelFrames;
        a_boot_writes_one_kernel_table_and_the_boots_before_go:
            Need::Perf, Need::Root, Need::KernelFrames;
        a_file_rebuilt_with_the_same_build_id_and_size_is_named_afresh;
        the_bound_counts_what_entries_take_of_the_disk;
        a_full_disk_is_not_kept_full_by_the_cache: Need::Root;
        a_file_without_a_build_id_is_cached_by_its_inode;
    ]);
}
