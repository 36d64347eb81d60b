//! The code a replay's processes map: each executable mapping resolved once to its
//! library (the file verified to be the one mapped, or JIT code named by a perf map, or a
//! pseudo-mapping) and how its addresses become the library's, with the file's CFI handed
//! to the unwinder; and the JIT dumps, read as they grow. Kept apart from the dispatch so
//! that what a mapping is stays in one place.

use std::path::Path;
use std::sync::Arc;

use crate::events::Mapping;
use crate::files::binary::Binary;
use crate::files::locate::MappedFile;
use crate::profile::{Lib, LibIndex, LibKind, VDSO_NAME};
use crate::unwind::maps::Region;
use crate::unwind::{CodeModule, FileCode, Unwinder};

use super::{LibFile, ProfileBuilder};

/// What one mapping of a process was resolved to, once, when it was mapped.
#[derive(Clone, Copy, Debug)]
pub(super) struct Module {
    lib: Option<LibIndex>,
    translate: Translate,
}

/// How an address in a mapping becomes an address of its library.
#[derive(Clone, Copy, Debug)]
enum Translate {
    /// JIT code: the absolute address is what the perf map names.
    Absolute,
    /// The file could not be read: addresses stay file offsets.
    FileOffset,
    /// The file's own address of a byte is its file offset plus this, inside the segment
    /// the mapping shows.
    Delta(i64),
}

impl ProfileBuilder {
    /// Reads what the JIT dumps gained since they were last read, and gives the
    /// unwinder the CFI they hold for their code. The JIT writes a record before the code
    /// runs, so the records of code that the events' samples ran in are there.
    pub(super) fn read_jit_dumps(&mut self) {
        for (&pid, (path, offset)) in &mut self.jit_tails {
            let user = self.jit_users.get(&perf_map_path(pid)).copied();
            let Ok(data) = crate::files::jitdump::read_from(path, *offset, user) else {
                continue;
            };
            let (found, used) = crate::files::jitdump::unwind_records(&data, *offset == 0);
            *offset += used as u64;
            for jit in found {
                self.unwinder
                    .add_jit_cfi(pid, jit.code, &jit.eh_frame, &jit.eh_frame_hdr);
            }
        }
    }

    /// Resolves a new mapping once: its library, and the file that was mapped (found
    /// through [`FileFinder`], which checks the inode: a replaced file's symbols and CFI
    /// would be wrong, so it is not used).
    pub(super) fn on_mmap(&mut self, m: &Mapping) {
        self.stacks.maps_changed(m.pid);
        if is_jit_dump(&m.path) || is_anonymous(m) {
            self.note_jit_user(m.pid);
        }
        if is_jit_dump(&m.path) {
            // The JIT marks its dump by mapping it; the dump names the process's JIT code,
            // which is in its anonymous memory (the perf map's library).
            self.jit_dumps
                .insert(perf_map_path(m.pid), m.path.clone().into());
            self.jit_tails.insert(m.pid, (m.path.clone().into(), 0));
            return;
        }
        // The file's code, for CFI: (its name, the process's address of its address 0).
        let mut code: Option<(Arc<Binary>, String, u64)> = None;
        let (module, file_offset) = if is_anonymous(m) {
            // Anonymous executable memory is JIT code, named (if at all) by the
            // process's perf map; its addresses stay absolute.
            let module = self.fileless_module(
                format!("perf-{}.map", m.pid),
                perf_map_path(m.pid),
                LibKind::PerfMap,
                Translate::Absolute,
            );
            (module, m.file_offset)
        } else if m.path.starts_with('[') && m.path != VDSO_NAME {
            let module = self.fileless_module(
                m.path.clone(),
                m.path.clone(),
                LibKind::Pseudo,
                Translate::FileOffset,
            );
            (module, m.file_offset)
        } else {
            let end = m.start + m.len;
            let (found, file_offset) = if m.path == VDSO_NAME {
                // The image read from memory starts at the mapping.
                (self.files.vdso(m.pid, m.start, end), 0)
            } else {
                let mapped = MappedFile {
                    pid: m.pid,
                    path: &m.path,
                    start: m.start,
                    end,
                    file: m.file,
                };
                (self.files.mapped(&mapped), m.file_offset)
            };
            let binary = found.map(|(b, _)| b);
            let translate = binary
                .as_ref()
                .ok()
                .and_then(|b| b.code_svma_delta(file_offset, m.len))
                .map_or(Translate::FileOffset, Translate::Delta);
            let build_id = binary.as_ref().ok().and_then(|b| b.build_id.clone());
            let path = m.path.strip_suffix(" (deleted)").unwrap_or(&m.path);
            let name = Path::new(path)
                .file_name()
                .map_or(path.to_string(), |n| n.to_string_lossy().into_owned());
            let lib = Lib {
                name,
                path: path.to_string(),
                build_id,
                kind: LibKind::File,
                base: 0,
            };
            if let (Ok(binary), Translate::Delta(delta)) = (&binary, translate) {
                // The process's address of the file's address 0.
                let bias = m.start.wrapping_sub(file_offset).wrapping_sub(delta as u64);
                if let Some(capture) = &mut self.capture {
                    capture.module(m.pid, &lib.name, (m.start, end), bias, binary);
                }
                code = Some((binary.clone(), lib.name.clone(), bias));
            }
            let lib = self.intern_lib(lib, binary);
            let module = Module {
                lib: Some(lib),
                translate,
            };
            (module, file_offset)
        };
        let region = Region {
            start: m.start,
            len: m.len,
            file_offset,
            data: module,
        };
        if is_anonymous(m) {
            self.unwinder.map_anonymous(m.pid, region);
            return;
        }
        let code = code.as_ref().map(|(binary, name, bias)| CodeModule {
            name,
            bias: *bias,
            sections: &binary.unwind,
            text: Some(FileCode {
                bytes: binary.code_without_cfi.as_ref(),
                entry_returns: &binary.entry_returns,
                entry_stub: binary.entry_stub.clone(),
                file: Some(binary.file_reader()),
                trampolines: binary.trampolines.clone(),
            }),
        });
        self.unwinder.map(m.pid, region, code);
    }

    /// Notes the user process `pid` runs as, the first time it maps JIT code or a dump
    /// (while it runs): whose perf map and dump are its own.
    fn note_jit_user(&mut self, pid: i32) {
        if let std::collections::hash_map::Entry::Vacant(entry) =
            self.jit_users.entry(perf_map_path(pid))
        {
            if let Some(user) = crate::files::locate::process_user(pid) {
                entry.insert(user);
            }
        }
    }

    /// The module of memory with no file behind it.
    fn fileless_module(
        &mut self,
        name: String,
        path: String,
        kind: LibKind,
        translate: Translate,
    ) -> Module {
        let lib = Lib {
            name,
            path,
            build_id: None,
            kind,
            base: 0,
        };
        Module {
            lib: Some(self.intern_lib(lib, Err("no file".into()))),
            translate,
        }
    }

    /// Interns a library; the first time, records the verified file behind it (kept
    /// parallel to the library table for the symbolicator).
    pub(super) fn intern_lib(&mut self, lib: Lib, binary: LibFile) -> LibIndex {
        let index = self.libs.intern(lib, LibIndex::new);
        if index.index() == self.lib_binaries.len() {
            self.lib_binaries.push(binary);
        }
        index
    }
}

/// The (library, address in the file's own address space) of an absolute address of
/// process `pid`.
pub(super) fn resolve(
    unwinder: &Unwinder<Module>,
    pid: i32,
    address: u64,
) -> Option<(Option<LibIndex>, u64)> {
    let region = unwinder.lookup(pid, address)?;
    let file_offset = region.file_offset_of(address);
    let address = match region.data.translate {
        Translate::Absolute => address,
        Translate::FileOffset => file_offset,
        Translate::Delta(d) => file_offset.wrapping_add(d as u64),
    };
    Some((region.data.lib, address))
}

/// Where a JIT writes the names of process `pid`'s code for profilers.
pub(super) fn perf_map_path(pid: i32) -> String {
    format!("/tmp/perf-{pid}.map")
}

/// Whether a mapped file is a JIT dump: `jit-PID.dump`, in any directory.
fn is_jit_dump(path: &str) -> bool {
    let name = Path::new(path).file_name().and_then(|n| n.to_str());
    name.and_then(|n| n.strip_prefix("jit-")?.strip_suffix(".dump"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// Anonymous memory (JIT code, `//anon`, `[anon:…]`, `[heap]`, `[stack]`) has no file.
fn is_anonymous(m: &Mapping) -> bool {
    m.path.is_empty()
        || m.path.starts_with("//anon")
        || m.path.starts_with("[anon")
        || m.path == "[heap]"
        || m.path.starts_with("[stack")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, EventKind, Sample};
    use crate::profile::CodeKind;
    use crate::replay::tests::{at, fork};
    use crate::unwind::UnwindMode;

    /// An executable mapping of process 10 with no file behind it.
    fn mmap(time_ns: u64, start: u64, file_offset: u64, path: &str) -> Event {
        let mapping = Mapping {
            pid: 10,
            start,
            len: 0x1000,
            file_offset,
            path: path.to_string(),
            file: None,
            executable: true,
        };
        at(time_ns, EventKind::Mmap(mapping))
    }

    fn sample(time_ns: u64, ip: u64) -> Event {
        let s = Sample {
            pid: 10,
            tid: 10,
            user_callchain: vec![ip],
            ..Sample::default()
        };
        at(time_ns, EventKind::Sample(s))
    }

    #[test]
    fn jit_code_stays_absolute_and_a_pseudo_mapping_is_at_its_file_offset() {
        let mut b = ProfileBuilder::new(UnwindMode::Fp);
        b.add_events(&[
            fork(1, 10, 10),
            mmap(2, 0x7000_0000, 0, "//anon"),
            mmap(3, 0x8000_0000, 0x40, "[uprobes]"),
            // A JIT dump is noted, not mapped as code.
            mmap(4, 0x9000_0000, 0, "/tmp/jit-10.dump"),
            sample(5, 0x7000_0010),
            sample(6, 0x8000_0010),
            sample(7, 0x9000_0010),
        ]);
        let frames: Vec<(Option<(String, LibKind)>, u64)> = b
            .stacks
            .frames
            .items
            .iter()
            .filter(|f| f.kind == CodeKind::User)
            .map(|f| {
                let lib = f.lib.map(|l| &b.libs.items[l.index()]);
                (lib.map(|l| (l.name.clone(), l.kind)), f.address)
            })
            .collect();
        assert_eq!(
            frames,
            [
                (Some(("perf-10.map".into(), LibKind::PerfMap)), 0x7000_0010),
                (Some(("[uprobes]".into(), LibKind::Pseudo)), 0x50),
                (None, 0x9000_0010),
            ]
        );
        assert_eq!(
            b.jit_dumps[&perf_map_path(10)],
            Path::new("/tmp/jit-10.dump")
        );
        assert_eq!(b.lib_binaries.len(), 2);
    }

    #[test]
    fn a_jit_dump_is_named_jit_pid_dump() {
        assert!(is_jit_dump("/home/u/.debug/jit/x/jit-4242.dump"));
        assert!(!is_jit_dump("/tmp/jit-.dump") && !is_jit_dump("/tmp/jit-12a.dump"));
        assert!(!is_jit_dump("/tmp/perf-12.map"));
    }
}
