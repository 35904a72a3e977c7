//! One turn per session across bridge processes: an OS file lock (`flock`) per session in the data dir.
//!
//! Two editor windows are two bridges on one data dir; both may be asked to prompt the same session. The store's
//! `running` rows cannot decide that race (both bridges read before either writes), and a pid in a row outlives
//! nothing: the kernel's lock is taken atomically and released when its process dies, however it dies (SIGKILL
//! included), so no bridge can leave a session locked behind it.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use super::StoreError;

/// Held for as long as this bridge runs a turn of the session (or deletes it); released when dropped.
#[derive(Debug)]
pub struct TurnLock(#[allow(dead_code)] File);

/// Where the lock files live: in the data dir, never inside a sandbox (an agent holding its own session's lock
/// would block it).
fn lock_path(data_dir: &Path, session: &str) -> PathBuf {
    data_dir.join("locks").join(lock_name(session))
}

/// The lock file's name: the session id itself when it is one of ours (`sess_…`), else a digest of it. The id comes
/// from the editor: `/x`, `../x` or a name too long for the file system must never become a path.
fn lock_name(session: &str) -> String {
    let plain = session.len() <= 100 && session.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain && !session.is_empty() {
        return format!("{session}.lock");
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, session.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("id-{hex}.lock")
}

/// Takes the session's lock, or `None` when another process holds it. Never waits.
pub fn try_lock(data_dir: &Path, session: &str) -> Result<Option<TurnLock>, StoreError> {
    let path = lock_path(data_dir, session);
    let io = |e: std::io::Error| StoreError::Io { path: path.display().to_string(), reason: e.to_string() };
    if let Some(dir) = path.parent() {
        crate::paths::create_private_dir(dir).map_err(io)?;
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
pub fn remove(data_dir: &Path, session: &str) {
    let _ = std::fs::remove_file(lock_path(data_dir, session));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_never_becomes_a_path_outside_the_locks_dir() {
        let data = Path::new("/data");
        assert_eq!(lock_path(data, "sess_0a1b"), Path::new("/data/locks/sess_0a1b.lock"));
        for hostile in ["/", "/etc/x", "../x", "..", "", "a/b", "a\0b", &"x".repeat(300)] {
            let path = lock_path(data, hostile);
            assert_eq!(path.parent(), Some(Path::new("/data/locks")), "{hostile:?} became {}", path.display());
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(name.starts_with("id-") && name.len() == 3 + 64 + 5, "{hostile:?} became {name}");
        }
    }

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
