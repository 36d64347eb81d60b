//! The layout of the binary's text (`link/text-order.txt`, written by `scripts/order-text`,
//! given to the linker by `build.rs`): the functions a recording runs come first, in the
//! listed order, and the list still names the functions of this build, so that it is
//! regenerated when a toolchain or dependency update renames them.

use object::{Object, ObjectSymbol, SymbolKind};
use std::collections::{HashMap, HashSet};

/// The least share of the list's release names the release binary must still have: a
/// Rust symbol's name changes with its crate's version, the profile and rustc, not with
/// the code, so only functions renamed, removed or newly inlined since the list was
/// written are missing (none the day it was).
const MIN_FOUND: f64 = 0.75;

/// The functions listed for the release profile, in order.
fn release_names() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/link/text-order.txt");
    let text = std::fs::read_to_string(path).expect("link/text-order.txt is readable");
    let mut release = false;
    let mut names = Vec::new();
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("# ") {
            release = heading.starts_with("release: ");
        } else if release && !line.is_empty() {
            names.push(line.to_string());
        }
    }
    names
}

/// The binary's function symbols: name to (address, size).
fn functions() -> HashMap<String, (u64, u64)> {
    let data = std::fs::read(crate::common::sampler_bin()).expect("the binary is readable");
    let file = object::File::parse(&*data).expect("the binary parses");
    file.symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .filter_map(|s| Some((s.name().ok()?.to_string(), (s.address(), s.size()))))
        .collect()
}

/// Whether a name is Rust's (legacy or v0 mangling): one function per section, laid out
/// one by one. A C function moves with the rest of its object file's text.
fn is_rust(name: &str) -> bool {
    name.starts_with("_ZN") || name.starts_with("_R")
}

fn the_list_still_names_this_builds_functions() {
    let names = release_names();
    assert!(
        names.len() > 1000,
        "the list has {} release names",
        names.len()
    );
    let functions = functions();
    let found = names.iter().filter(|n| functions.contains_key(*n)).count();
    let share = found as f64 / names.len() as f64;
    assert!(
        share >= MIN_FOUND,
        "the binary has {found} of link/text-order.txt's {} release functions ({:.0}%, \
         under {:.0}%): run scripts/order-text",
        names.len(),
        share * 100.0,
        MIN_FOUND * 100.0
    );
}

fn listed_functions_come_first_in_their_order() {
    let functions = functions();
    let listed: Vec<(u64, u64, &str)> = release_names()
        .iter()
        .filter(|n| is_rust(n))
        .filter_map(|n| functions.get_key_value(n.as_str()))
        .map(|(n, &(address, size))| (address, size, n.as_str()))
        .collect();
    // Equal addresses are aliases: functions the compiler found identical and merged.
    for pair in listed.windows(2) {
        assert!(
            pair[0].0 <= pair[1].0,
            "{} (at {:#x}) is listed before {} (at {:#x})",
            pair[0].2,
            pair[0].0,
            pair[1].2,
            pair[1].0
        );
    }
    // Before the last listed Rust function lie only listed functions, their aliases, and C
    // functions (the program's entry, those that came with a listed one's object file):
    // the listed ones come first.
    let (first, last) = (listed[0].0, listed[listed.len() - 1].0);
    let addresses: HashSet<u64> = listed.iter().map(|l| l.0).collect();
    let before: Vec<&str> = functions
        .iter()
        .filter(|(n, &(a, _))| is_rust(n) && a < last && !addresses.contains(&a))
        .map(|(n, _)| n.as_str())
        .collect();
    assert!(
        before.is_empty(),
        "{} unlisted Rust functions lie before or among the listed ones, e.g. {:?}",
        before.len(),
        &before[..before.len().min(3)]
    );
    let span = listed[listed.len() - 1].0 + listed[listed.len() - 1].1 - first;
    let sizes: u64 = listed.iter().map(|l| l.1).sum();
    eprintln!(
        "{} listed Rust functions found, {} KiB, in {} KiB of text",
        listed.len(),
        sizes / 1024,
        span / 1024
    );
}

/// A release build linked by a linker that takes the list (`build.rs` says so).
fn ordered_release_build() -> bool {
    option_env!("SAMPLER_TEXT_ORDERED").is_some() && !cfg!(debug_assertions)
}

pub fn tests() -> Vec<crate::common::Test> {
    use crate::common::Need::Build;
    const ORDERED: crate::common::Need = Build(
        "a release build linked with link/text-order.txt",
        ordered_release_build,
    );
    crate::tests![
        the_list_still_names_this_builds_functions: ORDERED;
        listed_functions_come_first_in_their_order: ORDERED;
    ]
}
