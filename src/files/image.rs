//! Reading a file sampler did not write, by position, without trusting its headers: what
//! the open file really holds ([`Held`]: its length and the bytes its blocks store), a
//! reader by position ([`At`]) that `object`'s read cache reads through, and buffers made
//! at their final size, refused rather than aborting when the size cannot be had.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// A shared buffer of `len` bytes that `fill` writes: made once at its final size and
/// filled in place, never a copy of another buffer. A size the system cannot give is
/// refused, not a reason to abort the run: `Arc<[u8]>` has no fallible constructor, so
/// the same size is first reserved (and given back) as a `Vec`, which has one.
pub(super) fn shared_filled(
    len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), String>,
) -> Result<Arc<[u8]>, String> {
    Vec::<u8>::new()
        .try_reserve_exact(len)
        .map_err(|_| format!("{len} bytes cannot be allocated"))?;
    let mut data: Arc<[u8]> = std::iter::repeat_n(0u8, len).collect();
    fill(Arc::get_mut(&mut data).expect("a new buffer has one owner"))?;
    Ok(data)
}

/// Reads an open file whole into one shared buffer, when it holds all of its length
/// (see [`Held::check`]).
pub(super) fn read_whole(file: &Arc<std::fs::File>) -> std::io::Result<Arc<[u8]>> {
    let held = Held::of(file)?;
    held.check(&"the file", 0, held.len)
        .map_err(std::io::Error::other)?;
    let len = usize::try_from(held.len).map_err(std::io::Error::other)?;
    shared_filled(len, |buffer| {
        file.read_exact_at(buffer, 0).map_err(|e| e.to_string())
    })
    .map_err(std::io::Error::other)
}

/// A region that a file's headers give may be this much larger than all the bytes the
/// file stores on disk before its holes are looked for: a tiny file's data may live in
/// its inode (no blocks at all), and a block holds up to 64 KiB on some filesystems.
const UNSTORED_SLACK: u64 = 1 << 20;

/// What an open file really holds: its length, and the bytes its blocks store (fewer
/// than its length when it has holes: a sparse file, which reads as zeros there and
/// costs whoever made it nothing). Every size that the file's headers give is checked
/// against both, and against `MAX_SECTION_BYTES`, before it is read or allocated.
#[derive(Clone, Debug)]
pub struct Held {
    file: Arc<std::fs::File>,
    len: u64,
    stored: u64,
}

impl Held {
    /// What `file` holds now.
    pub fn of(file: &Arc<std::fs::File>) -> std::io::Result<Held> {
        use std::os::unix::fs::MetadataExt;
        let meta = file.metadata()?;
        Ok(Held {
            file: file.clone(),
            len: meta.len(),
            // st_blocks counts 512-byte units whatever the filesystem's block size.
            stored: meta.blocks().saturating_mul(512),
        })
    }

    /// Whether the `size` bytes from `offset` that a header calls `what` are bytes the
    /// file holds: inside its length, at most `MAX_SECTION_BYTES`, and, when more than
    /// the file stores on disk, without a hole among them (a filesystem that compresses
    /// stores fewer bytes than it holds, but has no holes there). The error says which
    /// and is one line, for the message that names the file.
    pub fn check(
        &self,
        what: &dyn std::fmt::Display,
        offset: u64,
        size: u64,
    ) -> Result<(), String> {
        // Nothing is read of an empty part, wherever it says it is.
        if size == 0 {
            return Ok(());
        }
        let end = offset
            .checked_add(size)
            .filter(|&end| end <= self.len)
            .ok_or_else(|| {
                format!(
                    "{what} says it has {size} bytes from offset {offset}, past the file's end at {} (a damaged file)",
                    self.len
                )
            })?;
        if size > MAX_SECTION_BYTES {
            return Err(format!(
                "{what} says it has {size} bytes, more than the {MAX_SECTION_BYTES} that sampler reads of any part of a file (a damaged file)"
            ));
        }
        if size > self.stored.saturating_add(UNSTORED_SLACK) && self.has_hole(offset, end) {
            return Err(format!(
                "{what} says it has {size} bytes, but the file stores only {} on disk and the rest are holes (a sparse file)",
                self.stored
            ));
        }
        Ok(())
    }

    /// Whether `start..end` of the file has a hole (`SEEK_HOLE`, which finds the
    /// file's end when there is none before it).
    fn has_hole(&self, start: u64, end: u64) -> bool {
        let Ok(from) = i64::try_from(start) else {
            return true;
        };
        match nix::unistd::lseek(&*self.file, from, nix::unistd::Whence::SeekHole) {
            Ok(hole) => u64::try_from(hole).map_or(true, |hole| hole < end),
            // A filesystem that cannot say: its files are taken as having no holes.
            Err(_) => false,
        }
    }
}

/// No debug section of a real program is larger than this once inflated (the largest
/// seen here, a Rust compiler's `.debug_info`, is a few hundred MiB).
pub(super) const MAX_SECTION_BYTES: u64 = 4 << 30;

/// Section bytes, shared between the binary and the unwinders of every process mapping it.
pub type SectionBytes = Arc<[u8]>;

/// Where a binary's bytes are.
#[derive(Clone, Debug)]
pub(super) enum Image {
    /// In memory: the vdso, a debug file read whole, bytes given by a test.
    Bytes(Arc<[u8]>),
    /// The open file, read where needed.
    File(Arc<std::fs::File>),
}

/// Reads a binary's bytes by position (an open file with `pread`, so that readers of one
/// file in several threads never share an offset); `object`'s read cache reads through
/// it, keeping only what was read.
#[derive(Clone)]
pub struct At {
    image: Image,
    pos: u64,
    /// The file's bytes from `window.0` on, read ahead: a symbol table's names are read
    /// one small read at a time, mostly in order.
    window: (u64, Vec<u8>),
}

impl At {
    pub(super) fn new(image: Image) -> At {
        At {
            image,
            pos: 0,
            window: (0, Vec::new()),
        }
    }

    /// A reader of the open file `file`.
    pub fn of_file(file: Arc<std::fs::File>) -> At {
        At::new(Image::File(file))
    }

    /// A reader of bytes held in memory.
    pub fn of_bytes(data: Arc<[u8]>) -> At {
        At::new(Image::Bytes(data))
    }

    /// `len` bytes from `offset` (fewer at the end of the file), read as they are, with
    /// no read-ahead and leaving the position alone: for lookups that jump around.
    pub fn read_exact_at(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = Vec::new();
        buf.try_reserve_exact(len).ok()?;
        buf.resize(len, 0);
        let got = self.read_into(offset, &mut buf)?;
        buf.truncate(got);
        Some(buf)
    }

    /// Fills `buf` from `offset` (less of it at the end of the file); how much was read.
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Option<usize> {
        let len = buf.len();
        let mut got = 0;
        while got < len {
            let n = match &self.image {
                Image::File(file) => file.read_at(&mut buf[got..], offset + got as u64).ok()?,
                Image::Bytes(data) => {
                    let start = usize::try_from(offset)
                        .ok()?
                        .saturating_add(got)
                        .min(data.len());
                    let n = (len - got).min(data.len() - start);
                    buf[got..got + n].copy_from_slice(&data[start..start + n]);
                    n
                }
            };
            if n == 0 {
                break;
            }
            got += n;
        }
        Some(got)
    }
}

impl At {
    /// Which version of which file it reads, for telling a file read before from another
    /// one: its device and inode, size and change time (which any write changes, and no
    /// user can set). `None` for bytes in memory, or a file that cannot be asked.
    pub fn identity(&self) -> Option<[u64; 5]> {
        use std::os::unix::fs::MetadataExt;
        let Image::File(file) = &self.image else {
            return None;
        };
        let m = file.metadata().ok()?;
        Some([
            m.dev(),
            m.ino(),
            m.size(),
            m.ctime() as u64,
            m.ctime_nsec() as u64,
        ])
    }
}

/// The image it reads, not the bytes read ahead.
impl std::fmt::Debug for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("At").field("image", &self.image).finish()
    }
}

/// How much a small read of an open file reads ahead (see [`At`]).
const READ_AHEAD: usize = 64 * 1024;

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = match &self.image {
            Image::File(file) if buf.len() >= READ_AHEAD => file.read_at(buf, self.pos)?,
            Image::File(file) => {
                let (start, bytes) = &mut self.window;
                let inside = self.pos >= *start
                    && self.pos + buf.len() as u64 <= *start + bytes.len() as u64;
                if !inside {
                    bytes.resize(READ_AHEAD, 0);
                    let got = file.read_at(bytes, self.pos)?;
                    bytes.truncate(got);
                    *start = self.pos;
                }
                let from = (self.pos - *start) as usize;
                let n = buf.len().min(bytes.len() - from);
                buf[..n].copy_from_slice(&bytes[from..from + n]);
                n
            }
            Image::Bytes(data) => {
                let start = usize::try_from(self.pos)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                let n = buf.len().min(data.len() - start);
                buf[..n].copy_from_slice(&data[start..start + n]);
                n
            }
        };
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for At {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => {
                let len = match &self.image {
                    Image::File(file) => file.metadata()?.len(),
                    Image::Bytes(data) => data.len() as u64,
                };
                len.checked_add_signed(d)
            }
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| std::io::Error::other("seek out of range"))?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::binary::Binary;
    use std::path::Path;

    #[test]
    fn reads_through_the_open_file_are_the_files_bytes() {
        let exe = std::env::current_exe().unwrap();
        let whole = std::fs::read(&exe).unwrap();
        let image = Image::File(Arc::new(std::fs::File::open(&exe).unwrap()));
        let mut at = At::new(image);
        // Small reads in and out of the read-ahead window, a large one, the end.
        let len = whole.len() as u64;
        let reads = [
            (0, 16),
            (8, 300),
            (70_000, 5),
            (10, 4),
            (len - 3, 10),
            (100, 200_000),
        ];
        for (offset, size) in reads {
            at.seek(SeekFrom::Start(offset)).unwrap();
            let mut buf = vec![0; size];
            let mut got = 0;
            while got < size {
                match at.read(&mut buf[got..]).unwrap() {
                    0 => break,
                    n => got += n,
                }
            }
            let end = (offset as usize + size).min(whole.len());
            assert_eq!(&buf[..got], &whole[offset as usize..end], "{offset}+{size}");
        }
        assert_eq!(at.seek(SeekFrom::End(0)).unwrap(), len);
    }

    #[test]
    fn real_files_hold_what_their_headers_say_and_a_sparse_one_does_not() {
        let mut files = vec![std::env::current_exe().unwrap()];
        for path in ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/ls"] {
            if Path::new(path).exists() {
                files.push(path.into());
            }
        }
        for path in files {
            let b = Binary::open(&path).unwrap();
            assert_eq!(b.damaged, None, "{}", path.display());
            assert!(b.unwind.has_cfi(), "{}", path.display());
        }
        let path = std::env::temp_dir().join(format!("sampler-held-{}", std::process::id()));
        let file = Arc::new(std::fs::File::create(&path).unwrap());
        file.write_all_at(b"a few real bytes", 0).unwrap();
        file.set_len(5 << 30).unwrap();
        let held = Held::of(&file).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(held.check(&"a", 0, 16), Ok(()));
        assert_eq!(held.check(&"nothing", u64::MAX, 0), Ok(()));
        let holes = held.check(&"its section .x", 0, 64 << 20).unwrap_err();
        assert!(
            holes.starts_with("its section .x says it has 67108864 bytes"),
            "{holes}"
        );
        assert!(holes.ends_with("(a sparse file)"), "{holes}");
        let past = held.check(&"b", 1 << 20, 5 << 30).unwrap_err();
        assert!(past.contains("past the file's end"), "{past}");
        let huge = held.check(&"c", 0, MAX_SECTION_BYTES + 1).unwrap_err();
        assert!(huge.contains("more than the 4294967296"), "{huge}");
    }
}
