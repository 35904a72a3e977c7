//! What `<cli> --version` said, remembered in the data dir across bridges, per executable file.
//!
//! A probe costs a process (0.6–1.0 s of OpenCode's start-up on a quiet machine), and the answer only changes with
//! the file: an entry holds the executable's canonical path with its device, inode, size and mtime, and is used only
//! while all of them still match, so a binary replaced or upgraded in place is probed again. The file is a cache:
//! one that cannot be read or parsed is ignored (and overwritten by the next probe), and it is written whole to a
//! temporary file and renamed, so a reader never sees half of it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file, in the data dir.
pub const FILE: &str = "versions.json";

/// At most this many executables are remembered (a machine has a few; the oldest are dropped beyond it).
const MAX_ENTRIES: usize = 32;

/// Which file a version belongs to: equal keys mean the same bytes for every practical purpose (a replaced file has
/// a new inode or mtime, a rewritten one a new mtime or size).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Key {
    /// The executable with every link resolved (a PATH entry is often a link into a versioned install).
    pub path: PathBuf,
    pub dev: u64,
    pub inode: u64,
    pub size: u64,
    /// Modification time in nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl Key {
    /// The key of the file `executable` is now, or `None` when it cannot be resolved.
    pub fn of(executable: &Path) -> Option<Key> {
        use std::os::unix::fs::MetadataExt;
        let path = std::fs::canonicalize(executable).ok()?;
        let meta = std::fs::metadata(&path).ok()?;
        Some(Key {
            path,
            dev: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        })
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Cache {
    /// By canonical path: the file it was, its version line, and when it was learned (for dropping the oldest).
    entries: BTreeMap<PathBuf, Entry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    key: Key,
    version: String,
    learned_ms: i64,
}

fn read(file: &Path) -> Cache {
    match std::fs::read(file) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::debug!(file = %file.display(), "ignoring an unreadable version cache: {e}");
            Cache::default()
        }),
        Err(_) => Cache::default(),
    }
}

/// The version remembered for exactly this file, if any.
pub fn lookup(data_dir: &Path, key: &Key) -> Option<String> {
    let cache = read(&data_dir.join(FILE));
    cache.entries.get(&key.path).filter(|entry| entry.key == *key).map(|entry| entry.version.clone())
}

/// Remembers `version` for this file. A failure is logged only: the next bridge probes again.
pub fn remember(data_dir: &Path, key: &Key, version: &str) {
    let file = data_dir.join(FILE);
    let mut cache = read(&file);
    cache.entries.insert(
        key.path.clone(),
        Entry { key: key.clone(), version: version.to_string(), learned_ms: crate::store::now_ms() },
    );
    while cache.entries.len() > MAX_ENTRIES {
        let Some(oldest) = cache.entries.iter().min_by_key(|(_, e)| e.learned_ms).map(|(p, _)| p.clone()) else {
            break;
        };
        cache.entries.remove(&oldest);
    }
    if let Err(e) = write_atomically(&file, &serde_json::to_vec_pretty(&cache).unwrap_or_default()) {
        tracing::warn!(file = %file.display(), "could not remember the CLI's version: {e}");
    }
}

/// Writes a temporary file beside `file` and renames it over `file`: readers see the old or the new file whole, and
/// two bridges writing at once never share a temporary file.
fn write_atomically(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut temporary = tempfile::NamedTempFile::new_in(file.parent().unwrap_or(Path::new(".")))?;
    temporary.write_all(bytes)?;
    temporary.as_file().sync_all()?;
    temporary.persist(file).map(drop).map_err(|e| e.error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_follows_links_and_changes_with_a_rewritten_or_replaced_file() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let real = dir.join("opencode-1");
        std::fs::write(&real, "#!/bin/sh\necho 1.0.0\n").unwrap();
        let link = dir.join("opencode");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let first = Key::of(&link).unwrap();
        assert_eq!(first.path, std::fs::canonicalize(&real).unwrap());
        assert_eq!(first.size, 21);
        assert_eq!(Key::of(&real), Some(first.clone()), "a link and its target are one file");

        // Same size, later mtime: a rewrite in place.
        std::fs::write(&real, "#!/bin/sh\necho 1.0.1\n").unwrap();
        let times = std::fs::FileTimes::new()
            .set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(2_000_000_000));
        std::fs::File::options().write(true).open(&real).unwrap().set_times(times).unwrap();
        let rewritten = Key::of(&link).unwrap();
        assert_eq!((rewritten.inode, rewritten.size), (first.inode, first.size));
        assert_ne!(rewritten, first);

        // A new file renamed over it, with the very same mtime and size: a new inode.
        let next = dir.join("next");
        std::fs::write(&next, "#!/bin/sh\necho 1.0.2\n").unwrap();
        std::fs::File::options().write(true).open(&next).unwrap().set_times(times).unwrap();
        std::fs::rename(&next, &real).unwrap();
        let replaced = Key::of(&link).unwrap();
        assert_eq!((replaced.size, replaced.mtime_ns), (rewritten.size, rewritten.mtime_ns));
        assert_ne!(replaced.inode, rewritten.inode);
        assert_ne!(replaced, rewritten);

        assert_eq!(Key::of(&dir.join("missing")), None);
    }

    #[test]
    fn a_version_is_found_only_for_the_same_file_and_a_corrupt_cache_is_ignored() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let exe = dir.join("opencode");
        std::fs::write(&exe, "one").unwrap();
        let key = Key::of(&exe).unwrap();
        assert_eq!(lookup(dir, &key), None);
        remember(dir, &key, "1.18.33");
        assert_eq!(lookup(dir, &key), Some("1.18.33".to_string()));
        std::fs::write(&exe, "longer").unwrap();
        assert_eq!(lookup(dir, &Key::of(&exe).unwrap()), None, "a changed file is not the one remembered");

        std::fs::write(dir.join(FILE), "{\"entries\": {\"/x\": [").unwrap();
        assert_eq!(lookup(dir, &key), None);
        remember(dir, &key, "1.18.34");
        assert_eq!(lookup(dir, &key), Some("1.18.34".to_string()), "a corrupt cache is replaced whole");
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 2, "no temporary file is left: {left:?}");
    }
}
