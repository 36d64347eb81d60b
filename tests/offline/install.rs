//! `scripts/install PREFIX` (issue 27): builds sampler and installs it as
//! `PREFIX/bin/sampler`, executable by everyone, replacing an older one by a rename and
//! leaving nothing else behind. Needs neither perf nor root (the prefix is a scratch
//! directory).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::common;

fn install(prefix: &Path) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The script runs `cargo`: the one running these tests.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let cargo_dir = Path::new(&cargo).parent().unwrap_or(Path::new("/"));
    let path = format!(
        "{}:{}",
        cargo_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // A user's environment, not the test harness's: cargo would otherwise take the
    // variables it sets for tests (LD_LIBRARY_PATH, CARGO_*) as a reason to rebuild.
    let mut command = Command::new(root.join("scripts/install"));
    command.arg(prefix).env_clear().env("PATH", path);
    for keep in ["HOME", "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN"] {
        if let Some(value) = std::env::var_os(keep) {
            command.env(keep, value);
        }
    }
    command.output().expect("scripts/install runs")
}

fn install_puts_an_executable_sampler_in_prefix_bin_and_replaces_an_old_one() {
    let dir = common::tempdir();
    let prefix = dir.join("prefix");
    let bin = prefix.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // An older sampler, to be replaced (a rename over it: its inode changes).
    std::fs::write(bin.join("sampler"), "#!/bin/sh\necho old\n").unwrap();
    let old_inode =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(bin.join("sampler")).unwrap());
    let out = install(&prefix);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("building sampler"),
        "it says what it does: {stderr}"
    );
    let installed = bin.join("sampler");
    let meta = std::fs::metadata(&installed).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
    assert_ne!(std::os::unix::fs::MetadataExt::ino(&meta), old_inode);
    let version = |exe: &Path| {
        let out = Command::new(exe).arg("--version").output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(
        version(&installed),
        version(Path::new(common::sampler_bin()))
    );
    let left: Vec<String> = std::fs::read_dir(&bin)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        vec!["sampler".to_string()],
        "nothing else in {}",
        bin.display()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The tests of this module, for the offline binary's `main`.
pub fn tests() -> Vec<crate::common::Test> {
    crate::tests![
        install_puts_an_executable_sampler_in_prefix_bin_and_replaces_an_old_one;
    ]
}
