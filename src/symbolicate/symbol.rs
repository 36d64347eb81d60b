//! One named code address, the unit every symbol source yields (ELF tables, PLT stubs,
//! kallsyms, perf maps, JIT dumps). It has a module of its own, beneath the sources and
//! the maps built from them, so that the sources (`symtab`, `plt`) and the symbol map
//! (`symbols`) import it without importing one another in a circle.

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub address: u64,
    /// Size in bytes, when the table gives one.
    pub size: Option<u64>,
    /// Demangled name.
    pub name: String,
}

/// A `.symtab` name without its symbol version (`clock_gettime@@GLIBC_2.17`).
pub(super) fn without_version(name: &str) -> &str {
    match name.find('@') {
        Some(i) if i > 0 => &name[..i],
        _ => name,
    }
}
