//! Where the running kernel's text starts (`_text` in `/proc/kallsyms`): a fact of the
//! recording, stamped on it when kernel frames were recorded, because kernel addresses
//! are placed relative to it (KASLR moves the kernel at each boot). Only the address is
//! read here; the kernel's symbols are the symbolicator's business, which reads the
//! file's lines with [`kallsyms_line`] too.

use std::io::BufRead;

/// The address of `_text`, or `None` when `/proc/kallsyms` cannot be read or hides the
/// addresses (it shows zeros to those without `CAP_SYSLOG` under `kptr_restrict`). The
/// kernel lists its own text symbols first, so the file is read only up to `_text`
/// (its third line here; after the per-CPU variables, a few hundred, on kernels that
/// list them).
pub fn kernel_text_start() -> Option<u64> {
    let file = std::fs::File::open("/proc/kallsyms").ok()?;
    std::io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| match kallsyms_line(&line) {
            Some((address, "T" | "t", "_text")) => Some(address),
            _ => None,
        })
        .filter(|&address| address != 0)
}

/// One line of `/proc/kallsyms`: address, type letter, name (a module name may follow).
pub fn kallsyms_line(line: &str) -> Option<(u64, &str, &str)> {
    let mut parts = line.split_whitespace();
    let (addr, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
    Some((u64::from_str_radix(addr, 16).ok()?, kind, name))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kernel_text_is_where_kallsyms_says_when_it_shows_addresses() {
        let Some(start) = super::kernel_text_start() else {
            return; // Addresses hidden from this user: nothing to compare.
        };
        let listed = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let line = listed
            .lines()
            .find(|l| l.ends_with(" _text"))
            .expect("kallsyms lists _text");
        assert!(line.starts_with(&format!("{start:016x} ")), "{line}");
    }
}
