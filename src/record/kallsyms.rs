//! Where the running kernel's text starts (`_text` in `/proc/kallsyms`): a fact of the
//! recording, stamped on it when kernel frames were recorded, because kernel addresses
//! are placed relative to it (KASLR moves the kernel at each boot). Only the address is
//! read here; the kernel's symbols are the symbolicator's business.

use std::io::BufRead;

/// The kernel lists its own text symbols first, in address order: `_text` is within
/// its first lines (after the per-CPU variables, a few hundred, on kernels that list
/// them). Past these lines the rest of the file (some 200,000 lines) is read too.
const HEAD_LINES: usize = 4096;

/// The address of `_text`, or `None` when `/proc/kallsyms` cannot be read or hides the
/// addresses (it shows zeros to those without `CAP_SYSLOG` under `kptr_restrict`).
pub fn kernel_text_start() -> Option<u64> {
    let file = std::fs::File::open("/proc/kallsyms").ok()?;
    let text = |line: &str| -> Option<u64> {
        let mut fields = line.split_ascii_whitespace();
        let (address, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
        let text_symbol = matches!(kind, "T" | "t") && name == "_text";
        text_symbol.then(|| u64::from_str_radix(address, 16).ok())?
    };
    let mut lines = std::io::BufReader::new(file).lines().map_while(Result::ok);
    let found = lines.by_ref().take(HEAD_LINES).find_map(|l| text(&l));
    found
        .or_else(|| lines.find_map(|l| text(&l)))
        .filter(|&address| address != 0)
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
