//! Which bridge owns a session's processes: a record per bridge (pid and start time) in the run dir, written
//! before each command starts, so that another bridge's reaper leaves a live bridge's processes alone and ends
//! only what a killed one left.

use std::path::{Path, PathBuf};

use crate::sandbox::SandboxError;
use crate::sandbox::process::{home_of, process_table, start_time};

/// Processes that CLIs of this data dir left running when their bridge was killed (a plain process group
/// has nothing like bubblewrap's PID namespace to take them down): every process a CLI starts inherits its
/// HOME, `<sessions dir>/<session id>/home`. Returns (pid, session id).
pub fn leftover_processes(sessions_dir: &Path) -> Vec<(i32, String)> {
    let own = std::process::id() as i32;
    let mut found = Vec::new();
    for entry in process_table() {
        if entry.pid == own {
            continue;
        }
        let Some(home) = home_of(entry.pid) else { continue };
        if home.file_name().is_some_and(|name| name == "home")
            && let Some(session_dir) = home.parent()
            && session_dir.parent() == Some(sessions_dir)
            && let Some(session) = session_dir.file_name().and_then(|name| name.to_str())
        {
            found.push((entry.pid, session.to_string()));
        }
    }
    found
}

/// A bridge process as the owner of a session's processes: its pid and its start time (field 22 of
/// `/proc/<pid>/stat`, in clock ticks since boot), so that a pid used again by another process is not taken for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The bridge's pid.
    pub pid: i32,
    /// When it started.
    pub start: u64,
}

impl Owner {
    /// This process.
    pub fn me() -> Option<Owner> {
        let pid = i32::try_from(std::process::id()).ok()?;
        Some(Owner { pid, start: start_time(pid)? })
    }

    /// Whether the process still runs (a zombie does not).
    pub fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }

    fn file_name(&self) -> String {
        format!("{}-{}", self.pid, self.start)
    }

    fn parse(name: &str) -> Option<Owner> {
        let (pid, start) = name.split_once('-')?;
        Some(Owner { pid: pid.parse().ok()?, start: start.parse().ok()? })
    }
}

/// Where the owners of a session's processes are recorded: one empty file per bridge, `<pid>-<start time>`.
fn owners_dir(run_dir: &Path, session: &str) -> PathBuf {
    run_dir.join("owners").join(session)
}

/// Records this bridge as an owner of `session`'s processes (before it starts one), so that another bridge's
/// reaper leaves them alone while it runs.
pub fn record_owner(run_dir: &Path, session: &str) -> Result<(), SandboxError> {
    let Some(me) = Owner::me() else { return Ok(()) };
    let dir = owners_dir(run_dir, session);
    crate::paths::create_private_dir(run_dir)
        .map_err(|e| SandboxError::io(format!("create {}", run_dir.display()), e))?;
    std::fs::create_dir_all(&dir).map_err(|e| SandboxError::io(format!("create {}", dir.display()), e))?;
    let path = dir.join(me.file_name());
    if !path.exists() {
        std::fs::write(&path, b"").map_err(|e| SandboxError::io(format!("write {}", path.display()), e))?;
    }
    Ok(())
}

/// Whether a live bridge recorded itself as an owner of `session`'s processes. Records of bridges that are gone
/// are removed on the way.
pub fn owned_by_a_live_bridge(run_dir: &Path, session: &str) -> bool {
    let dir = owners_dir(run_dir, session);
    let Ok(entries) = std::fs::read_dir(&dir) else { return false };
    let mut live = false;
    for entry in entries.flatten() {
        match entry.file_name().to_str().and_then(Owner::parse) {
            Some(owner) if owner.alive() => live = true,
            _ => {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    if !live {
        let _ = std::fs::remove_dir(&dir);
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_live_bridges_known_by_pid_and_start_time() {
        let run = tempfile::tempdir().unwrap();
        assert!(!owned_by_a_live_bridge(run.path(), "sess_a"), "nobody recorded");
        record_owner(run.path(), "sess_a").unwrap();
        assert!(owned_by_a_live_bridge(run.path(), "sess_a"), "this process recorded itself");
        assert!(!owned_by_a_live_bridge(run.path(), "sess_b"), "only for the session it recorded");
        // The same pid with another start time is another process: not an owner, and its record goes.
        let me = Owner::me().unwrap();
        let dir = owners_dir(run.path(), "sess_c");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{}-{}", me.pid, me.start + 1)), b"").unwrap();
        assert!(!owned_by_a_live_bridge(run.path(), "sess_c"));
        assert!(!dir.exists(), "the record of a gone bridge is removed");
        assert_eq!(Owner::parse(&me.file_name()), Some(me));
        assert!(me.alive());
    }
}
