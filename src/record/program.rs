//! The target before it is recorded: the file a command runs (as `execvp` finds it, and
//! whether it is set-user-ID), and the processes a `-p` list names.

use anyhow::Result;

use super::attach;

/// The file `execvp` runs for `program`: the path itself, or the first file of that
/// name in `PATH`.
pub fn program_path(program: &str) -> Option<std::path::PathBuf> {
    exec_candidates(program)
        .into_iter()
        .find(|c| c.metadata().is_ok_and(|m| m.is_file()))
}

/// The files `execvp` tries for `program`, in order: the path itself when it has a
/// `/`, else the name in each directory of `PATH`.
pub(crate) fn exec_candidates(program: &str) -> Vec<std::path::PathBuf> {
    if program.contains('/') {
        return vec![program.into()];
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(program)).collect())
        .unwrap_or_default()
}

/// The program's file, when it has the set-user-ID or set-group-ID bit.
pub(super) fn set_id_program(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let file = program_path(program)?;
    let mode = file.metadata().ok()?.permissions().mode();
    (mode & (libc::S_ISUID | libc::S_ISGID) != 0).then_some(file)
}

/// The processes to attach to: each pid once, in the order given; the pid of a thread
/// that is not its process's main thread becomes its process's (with a line saying so);
/// a pid that is no user process is refused, before anything else happens.
pub fn resolve_pids(pids: &[i32]) -> Result<Vec<i32>> {
    let mut out: Vec<i32> = Vec::with_capacity(pids.len());
    for &pid in pids {
        attach::check_pid(pid)?;
        let process = attach::process_of(pid).unwrap_or(pid);
        if process != pid {
            say!("sampler: {pid} is a thread of process {process}; recording the whole process");
        }
        if !out.contains(&process) {
            out.push(process);
        }
    }
    Ok(out)
}
