//! One turn per session across bridge processes: an OS file lock (`flock`) per session in the data dir.
//!
//! Two editor windows are two bridges on one data dir; both may be asked to prompt the same session. The store's
//! `running` rows cannot decide that race (both bridges read before either writes), and a pid in a row outlives
//! nothing: the kernel's lock is taken atomically and released when its process dies, however it dies (SIGKILL
//! included), so no bridge can leave a session locked behind it.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use crate::store::StoreError;

/// Held for as long as this bridge runs a turn of the session (or deletes it); released when dropped.
#[derive(Debug)]
pub(super) struct TurnLock(#[allow(dead_code)] File);

/// Where the lock files live: in the data dir, never inside a sandbox (an agent holding its own session's lock
/// would block it).
fn lock_path(data_dir: &Path, session: &str) -> PathBuf {
    data_dir.join("locks").join(format!("{session}.lock"))
}

/// Takes the session's lock, or `None` when another process holds it. Never waits.
pub(super) fn try_lock(data_dir: &Path, session: &str) -> Result<Option<TurnLock>, StoreError> {
    let path = lock_path(data_dir, session);
    let io = |e: std::io::Error| StoreError::Io { path: path.display().to_string(), reason: e.to_string() };
    if let Some(dir) = path.parent() {
        crate::config::create_private_dir(dir).map_err(io)?;
    }
    // Opened without truncating, and never removed while a session exists: another bridge may hold an open file of
    // it, and a lock on a file that was replaced would lock nothing.
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(TurnLock(file))),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(io(e)),
    }
}

/// Removes a deleted session's lock file; the caller holds its lock.
pub(super) fn remove(data_dir: &Path, session: &str) {
    let _ = std::fs::remove_file(lock_path(data_dir, session));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_refuses_another_taker_and_is_free_again_once_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = try_lock(dir.path(), "s").unwrap().expect("a free lock is taken");
        // Another open file of the same lock, as another bridge has: refused while the first is held.
        assert!(try_lock(dir.path(), "s").unwrap().is_none(), "a held lock was taken twice");
        assert!(try_lock(dir.path(), "other").unwrap().is_some(), "sessions do not share a lock");
        drop(first);
        assert!(try_lock(dir.path(), "s").unwrap().is_some(), "a dropped lock is free");
    }
}
