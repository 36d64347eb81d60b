//! What an entry is for: the key that names it (a file's build ID and size, or the
//! kernel's keyed fingerprint of the boot), the stamp that tells that very file from
//! another, and where the file's debug information came from, which the entry is used
//! only with.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::words::u32_at;
use crate::files::binary::Binary;
use crate::symbolicate::SymbolOptions;

/// The cache's secret: a key of `siphash`, 16 random bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub(super) [u8; 16]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The longest build ID cached: 64 bytes, four times the usual SHA-1's 20, so that the
/// entry's name stays far below the 255 bytes a file name can have.
pub(super) const MAX_BUILD_ID: usize = 64;

/// What identifies a file's entry: its build ID and size, which name it, and which
/// file on the disk it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    pub build_id: Vec<u8>,
    pub size: u64,
    pub stamp: Stamp,
}

/// Which file on the disk, in which version: its device and inode, modification and
/// change times. A file written anew (even in place, with its modification time put
/// back) has another change time; a copy or a reinstalled package is another inode, and
/// is named afresh once. Zero for the kernel, which is no file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub ctime: i64,
    pub ctime_nsec: u32,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Option<Stamp> {
        Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime: m.mtime(),
            mtime_nsec: u32::try_from(m.mtime_nsec()).ok()?,
            ctime: m.ctime(),
            ctime_nsec: u32::try_from(m.ctime_nsec()).ok()?,
        })
    }
}

impl Key {
    /// The key of `binary`; `None` with an implausibly long build ID, or when it was
    /// read from memory (no file to tell versions apart). A file without a build ID
    /// (rustc, cargo and rustc's libraries have none) has an empty one, and its entry
    /// is named after its device and inode (`file-DEV-INODE-SIZE`).
    pub fn of(binary: &Binary) -> Option<Key> {
        let build_id = binary.build_id.clone().unwrap_or_default();
        let meta = binary.metadata()?;
        let stamp = Stamp::of(&meta)?;
        (build_id.len() <= MAX_BUILD_ID).then_some(Key {
            build_id,
            size: meta.len(),
            stamp,
        })
    }

    /// The entry's name: `HEX-SIZE`, after the build ID, or `file-DEV-INODE-SIZE` for a
    /// file without one. The stamp in the entry tells the file's versions apart either
    /// way.
    pub(crate) fn file_name(&self) -> String {
        match self.build_id.is_empty() {
            true => format!(
                "file-{:x}-{:x}-{:x}",
                self.stamp.dev, self.stamp.ino, self.size
            ),
            false => format!(
                "{}-{:x}",
                crate::symbolicate::debuginfod::hex(&self.build_id),
                self.size
            ),
        }
    }
}

/// The key of the running kernel's own symbols (`/proc/kallsyms`), whose text starts at
/// `text_start`, in the cache whose secret is `secret`: its build ID, and in place of a
/// size a fingerprint of the boot and of the text start, since where the kernel's code
/// lies is chosen at random at each boot. The fingerprint is keyed with the secret: the
/// build ID and the boot ID can be read by everyone, and the text start has only some
/// hundreds of possible values, so an unkeyed one would give the address away.
pub(super) fn kernel_key_with(secret: &Secret, text_start: u64) -> Option<Key> {
    let notes = std::fs::read("/sys/kernel/notes").ok()?;
    let build_id = gnu_build_id(&notes)?;
    let mut boot = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    boot.extend_from_slice(&text_start.to_le_bytes());
    (!build_id.is_empty() && build_id.len() <= MAX_BUILD_ID).then(|| Key {
        build_id: build_id.to_vec(),
        size: siphash(&secret.0, &boot),
        stamp: Stamp::default(),
    })
}

/// SipHash-2-4 of `data` under `key` (Aumasson and Bernstein, 2012): a keyed hash made
/// for short inputs, from which nobody without the key learns anything of the input.
fn siphash(key: &[u8; 16], data: &[u8]) -> u64 {
    let k0 = u64::from_le_bytes(key[..8].try_into().expect("8 bytes"));
    let k1 = u64::from_le_bytes(key[8..].try_into().expect("8 bytes"));
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let rounds = |v: &mut [u64; 4], n: usize| {
        for _ in 0..n {
            v[0] = v[0].wrapping_add(v[1]);
            v[1] = v[1].rotate_left(13) ^ v[0];
            v[0] = v[0].rotate_left(32);
            v[2] = v[2].wrapping_add(v[3]);
            v[3] = v[3].rotate_left(16) ^ v[2];
            v[0] = v[0].wrapping_add(v[3]);
            v[3] = v[3].rotate_left(21) ^ v[0];
            v[2] = v[2].wrapping_add(v[1]);
            v[1] = v[1].rotate_left(17) ^ v[2];
            v[2] = v[2].rotate_left(32);
        }
    };
    let compress = |v: &mut [u64; 4], m: u64| {
        v[3] ^= m;
        rounds(v, 2);
        v[0] ^= m;
    };
    let mut chunks = data.chunks_exact(8);
    for chunk in chunks.by_ref() {
        compress(
            &mut v,
            u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
        );
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    compress(&mut v, u64::from_le_bytes(last) | (data.len() as u64) << 56);
    v[2] ^= 0xff;
    rounds(&mut v, 4);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// The ELF note type of a build ID, as the ELF gABI's GNU extensions number it.
const NT_GNU_BUILD_ID: u32 = 3;

/// The build ID among ELF notes (`NT_GNU_BUILD_ID` of owner `GNU`).
fn gnu_build_id(mut notes: &[u8]) -> Option<&[u8]> {
    let padded = |n: usize| n.checked_next_multiple_of(4);
    while notes.len() >= 12 {
        let (name_size, desc_size) = (u32_at(notes, 0) as usize, u32_at(notes, 4) as usize);
        let kind = u32_at(notes, 8);
        let desc_at = 12usize.checked_add(padded(name_size)?)?;
        let end = desc_at.checked_add(padded(desc_size)?)?;
        let name = notes.get(12..12 + name_size)?;
        let desc = notes.get(desc_at..desc_at + desc_size)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return Some(desc);
        }
        notes = notes.get(end..)?;
    }
    None
}

/// Where a file's debug information came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DebugSource {
    /// The file's own DWARF and symbol table: nothing else is read.
    Own,
    /// A separate debug file, as it was when it was read.
    File { path: PathBuf, identity: Identity },
    /// None was found, and none could have been fetched.
    Missing,
}

/// What tells one version of a file from another without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
}

impl Identity {
    /// The identity of the file at `path` (through links, as it is read).
    pub fn of(path: &Path) -> Option<Identity> {
        let m = std::fs::metadata(path).ok()?;
        Some(Identity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: u32::try_from(m.mtime_nsec()).ok()?,
        })
    }
}

/// Which debug information a full load of `binary` (mapped from `mapped_path`) would
/// use now, found by looking at paths only, never reading a file: `None` when that
/// cannot be told so (a candidate path holds a file that may not match, or debuginfod
/// would be asked). [`crate::symbolicate::LibSymbols::load`] takes the first candidate that matches;
/// a candidate that exists is taken to be the one, and the entry made from it names it
/// with its identity, so a changed or different file is never mistaken for it.
pub fn predict_source(
    binary: &Binary,
    mapped_path: &str,
    opts: &SymbolOptions,
) -> Option<DebugSource> {
    if binary.has_dwarf && binary.has_symtab {
        return Some(DebugSource::Own);
    }
    let candidates = crate::files::locate::debug_candidates(binary, mapped_path, &opts.debug_roots);
    let found = |path: PathBuf| {
        let identity = Identity::of(&path)?;
        Some(DebugSource::File { path, identity })
    };
    if let Some(first) = candidates
        .into_iter()
        .map(|(path, _)| path)
        .find(|path| std::fs::symlink_metadata(path).is_ok())
    {
        return found(first);
    }
    match (&opts.debuginfod, &binary.build_id) {
        (Some(client), Some(id)) => found(client.cached_path(id)?),
        _ => Some(DebugSource::Missing),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn key() -> Key {
        Key {
            build_id: vec![0xab; 20],
            size: 0x1234,
            stamp: Stamp {
                dev: 1,
                ino: 2,
                mtime: 3,
                mtime_nsec: 4,
                ctime: 5,
                ctime_nsec: 6,
            },
        }
    }

    #[test]
    fn the_kernel_build_id_is_read_from_its_notes() {
        let mut notes = Vec::new();
        for (name, kind, desc) in [
            (&b"Xen\0"[..], 6u32, &[1u8, 2, 3][..]),
            (b"GNU\0", 3, &[0xaa; 20]),
        ] {
            notes.extend_from_slice(&(name.len() as u32).to_le_bytes());
            notes.extend_from_slice(&(desc.len() as u32).to_le_bytes());
            notes.extend_from_slice(&kind.to_le_bytes());
            notes.extend_from_slice(name);
            notes.extend_from_slice(desc);
            notes.resize(notes.len().next_multiple_of(4), 0);
        }
        assert_eq!(gnu_build_id(&notes), Some(&[0xaa; 20][..]));
        for len in 0..notes.len() {
            let _ = gnu_build_id(&notes[..len]);
        }
        assert_eq!(gnu_build_id(&notes[..notes.len() - 4]), None);
        // This machine's kernel, when it says.
        let secret = Secret([9; 16]);
        let kernel_key = |start| kernel_key_with(&secret, start);
        if let Some(key) = kernel_key(0xffff_ffff_8100_0000) {
            assert_eq!(kernel_key(0xffff_ffff_8100_0000), Some(key.clone()));
            let another_cache = kernel_key_with(&Secret([8; 16]), 0xffff_ffff_8100_0000);
            assert_ne!(another_cache, Some(key.clone()), "keyed with the secret");
            let other = kernel_key(0xffff_ffff_8200_0000).unwrap();
            assert_ne!(other, key);
        }
    }

    #[test]
    fn the_key_names_build_id_and_size() {
        assert_eq!(key().file_name(), format!("{}-1234", "ab".repeat(20)));
    }

    #[test]
    fn siphash_gives_the_reference_values() {
        // The test vectors of the SipHash paper: key 00 01 .. 0f, messages 00 01 .. .
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        let message: Vec<u8> = (0..15).collect();
        assert_eq!(siphash(&key, &[]), 0x726f_db47_dd0e_0e31);
        assert_eq!(siphash(&key, &message), 0xa129_ca61_49be_45e5);
    }
}
