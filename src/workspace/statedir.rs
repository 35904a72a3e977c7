//! File work of the bridge inside a session's state dir, which the agent can write: nothing here follows a
//! symlink or `..` out of it, and a symlink planted where the bridge expects a directory or file is replaced.

use std::io;
use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

/// A session's state dir, opened once; every path is relative to it.
pub struct StateDir {
    root: PathBuf,
    dir: Dir,
}

impl StateDir {
    /// Opens the state dir at `root` (a path the agent cannot change: its parent is hidden from the sandbox).
    pub fn open(root: &Path) -> io::Result<Self> {
        Ok(Self { root: root.to_path_buf(), dir: Dir::open_ambient_dir(root, ambient_authority())? })
    }

    /// `path` relative to the state dir; an absolute path elsewhere or any `..` is refused.
    pub fn relative<'a>(&self, path: &'a Path) -> io::Result<&'a Path> {
        let rel = if path.is_absolute() { path.strip_prefix(&self.root).map_err(|_| outside(path))? } else { path };
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) || rel.as_os_str().is_empty() {
            return Err(outside(path));
        }
        Ok(rel)
    }

    /// Makes `path` a real directory, component by component: a symlink or file in the way is removed first.
    pub fn ensure_dir(&self, path: &Path) -> io::Result<()> {
        let rel = self.relative(path)?;
        let mut current = PathBuf::new();
        for component in rel.components() {
            current.push(component);
            match self.dir.symlink_metadata(&current) {
                Ok(meta) if meta.is_dir() => continue,
                Ok(_) => self.dir.remove_file(&current)?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            match self.dir.create_dir(&current) {
                Ok(()) => {}
                // Made meanwhile by another task of the bridge (a warm server's start and a prompt both prepare the
                // sandbox): a real directory is what was wanted; anything else is not.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if !self.dir.symlink_metadata(&current).is_ok_and(|meta| meta.is_dir()) {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Makes `path` a real directory (as [`StateDir::ensure_dir`]) and opens it.
    pub fn open_dir(&self, path: &Path) -> io::Result<Dir> {
        self.ensure_dir(path)?;
        self.dir.open_dir(self.relative(path)?)
    }

    /// Writes a new file at `path` (its parents made real directories); whatever was there is replaced, never
    /// written through.
    pub fn write_file(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let rel = self.relative(path)?;
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.ensure_dir(parent)?;
        }
        self.remove_entry(rel)?;
        let mut options = cap_std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        let mut file = self.dir.open_with(rel, &options)?;
        io::Write::write_all(&mut file, bytes)
    }

    /// Makes `path` an empty regular file, to mount a file on: one there already is left as it is (another sandbox
    /// of the state dir may have its file mounted on it, and replacing it would take that mount away), anything
    /// else is replaced.
    pub fn place_mount_point(&self, path: &Path) -> io::Result<()> {
        let rel = self.relative(path)?;
        match self.dir.symlink_metadata(rel) {
            Ok(meta) if meta.is_file() && meta.len() == 0 => Ok(()),
            _ => self.write_file(path, b""),
        }
    }

    /// Moves the file `name` of `from` (a directory on the same filesystem) to `path` (its parents made real
    /// directories) in one rename: whatever was at `path` is replaced, never written through.
    pub fn move_file_in(&self, from: &Dir, name: &Path, path: &Path) -> io::Result<()> {
        let rel = self.relative(path)?;
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.ensure_dir(parent)?;
        }
        self.remove_entry(rel)?;
        from.rename(name, &self.dir, rel)
    }

    /// Creates a symlink at `link` to an absolute `target` (the user's config shown without a sandbox), replacing
    /// what was there.
    pub fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        let rel = self.relative(link)?;
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.ensure_dir(parent)?;
        }
        self.remove_entry(rel)?;
        self.dir.symlink_contents(target, rel)
    }

    /// Removes the links, empty files and empty directories directly in the directory `path` (what earlier runs
    /// left as links or mount points); files with content and non-empty directories stay.
    pub fn clear_placeholders(&self, path: &Path) -> io::Result<()> {
        let rel = self.relative(path)?;
        for entry in self.dir.read_dir(rel)? {
            let entry = entry?;
            let child = rel.join(entry.file_name());
            let Ok(meta) = self.dir.symlink_metadata(&child) else { continue };
            if meta.is_symlink() || (meta.is_file() && meta.len() == 0) {
                let _ = self.dir.remove_file(&child);
            } else if meta.is_dir() {
                let _ = self.dir.remove_dir(&child); // only when empty
            }
        }
        Ok(())
    }

    /// Removes everything in the directory `path`, never following a link (one in its place or inside it is
    /// removed itself); answers whether there was anything. A missing directory, or a link or file where it
    /// should be, has nothing to remove.
    pub fn empty_dir(&self, path: &Path) -> io::Result<bool> {
        let rel = self.relative(path)?;
        match self.dir.symlink_metadata(rel) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        }
        let mut any = false;
        for entry in self.dir.read_dir(rel)? {
            self.remove_entry(&rel.join(entry?.file_name()))?;
            any = true;
        }
        Ok(any)
    }

    /// Removes a file, link or directory tree at `path`, never following a link.
    fn remove_entry(&self, rel: &Path) -> io::Result<()> {
        match self.dir.symlink_metadata(rel) {
            Ok(meta) if meta.is_dir() => self.dir.remove_dir_all(rel),
            Ok(_) => self.dir.remove_file(rel),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn outside(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("{} is not inside the session's state dir", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emptying_a_dir_removes_links_never_what_they_point_to() {
        let dir = tempfile::tempdir().unwrap();
        let (state, victim) = (dir.path().join("state"), dir.path().join("victim"));
        std::fs::create_dir_all(state.join("cache/opencode/node_modules/plugin")).unwrap();
        std::fs::create_dir_all(state.join("home")).unwrap();
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::write(victim.join("keep"), "precious").unwrap();
        std::fs::write(state.join("cache/opencode/node_modules/plugin/index.js"), "x").unwrap();
        std::os::unix::fs::symlink(&victim, state.join("cache/opencode/link")).unwrap();
        // A link where a cache dir should be: not followed, and nothing to empty.
        std::os::unix::fs::symlink(&victim, state.join("home/.npm")).unwrap();
        let sd = StateDir::open(&state).unwrap();

        assert!(sd.empty_dir(Path::new("cache")).unwrap());
        assert_eq!(std::fs::read_dir(state.join("cache")).unwrap().count(), 0);
        assert!(!sd.empty_dir(Path::new("cache")).unwrap(), "nothing left the second time");
        assert!(!sd.empty_dir(Path::new("home/.npm")).unwrap());
        assert!(!sd.empty_dir(Path::new("home/.cache")).unwrap(), "a missing dir");
        assert_eq!(std::fs::read_to_string(victim.join("keep")).unwrap(), "precious");
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1);
        assert!(sd.empty_dir(Path::new("../victim")).is_err());
    }

    #[test]
    fn a_mount_point_is_an_empty_file_left_in_place_and_anything_else_there_is_replaced() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (state, victim) = (dir.path().join("state"), dir.path().join("victim"));
        std::fs::create_dir_all(state.join("home/.codex")).unwrap();
        std::fs::write(&victim, "precious").unwrap();
        let sd = StateDir::open(&state).unwrap();
        let point = state.join("home/.codex/auth.json");
        sd.place_mount_point(&point).unwrap();
        let first = std::fs::metadata(&point).unwrap();
        assert_eq!((first.is_file(), first.len()), (true, 0));
        sd.place_mount_point(&point).unwrap();
        assert_eq!(std::fs::metadata(&point).unwrap().ino(), first.ino(), "an empty file there stays");
        std::fs::write(&point, "planted").unwrap();
        sd.place_mount_point(&point).unwrap();
        assert_eq!(std::fs::read(&point).unwrap(), b"");
        std::fs::remove_file(&point).unwrap();
        std::os::unix::fs::symlink(&victim, &point).unwrap();
        sd.place_mount_point(&point).unwrap();
        assert!(!std::fs::symlink_metadata(&point).unwrap().is_symlink(), "a planted link is replaced");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn planted_symlinks_are_replaced_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let victim = dir.path().join("victim");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::write(victim.join("keep"), "precious").unwrap();
        std::os::unix::fs::symlink(&victim, state.join("config")).unwrap();
        std::os::unix::fs::symlink(&victim, state.join("attachments")).unwrap();
        let sd = StateDir::open(&state).unwrap();

        sd.ensure_dir(&state.join("config/opencode")).unwrap();
        assert!(std::fs::symlink_metadata(state.join("config")).unwrap().is_dir());
        sd.write_file(&state.join("attachments/1/image.png"), b"png").unwrap();
        assert_eq!(std::fs::read(state.join("attachments/1/image.png")).unwrap(), b"png");
        std::os::unix::fs::symlink(victim.join("keep"), state.join("config/opencode/keep")).unwrap();
        sd.clear_placeholders(&state.join("config/opencode")).unwrap();

        assert_eq!(std::fs::read_to_string(victim.join("keep")).unwrap(), "precious");
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1, "nothing new in the victim dir");
        for bad in [dir.path().join("elsewhere"), state.join("../victim"), PathBuf::from("../x")] {
            assert!(sd.write_file(&bad, b"x").is_err(), "{}", bad.display());
        }
    }

    #[test]
    fn a_file_moved_in_replaces_a_file_a_link_or_a_tree_and_never_writes_through() {
        let dir = tempfile::tempdir().unwrap();
        let (state, from, victim) = (dir.path().join("state"), dir.path().join("from"), dir.path().join("victim"));
        for d in [&state, &from, &victim] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(victim.join("keep"), "precious").unwrap();
        std::os::unix::fs::symlink(&victim, state.join("linked")).unwrap();
        std::os::unix::fs::symlink(victim.join("keep"), state.join("file-link")).unwrap();
        std::fs::create_dir_all(state.join("tree/inner")).unwrap();
        let sd = StateDir::open(&state).unwrap();
        let source = Dir::open_ambient_dir(&from, ambient_authority()).unwrap();
        for (name, to) in [("a", "linked/keep"), ("b", "file-link"), ("c", "tree"), ("d", "new/deep/file")] {
            std::fs::write(from.join(name), name).unwrap();
            sd.move_file_in(&source, Path::new(name), Path::new(to)).unwrap();
            assert_eq!(std::fs::read_to_string(state.join(to)).unwrap(), name, "{to}");
            assert!(std::fs::symlink_metadata(state.join(to)).unwrap().is_file());
            assert!(!from.join(name).exists(), "moved, not copied");
        }
        assert_eq!(std::fs::read_to_string(victim.join("keep")).unwrap(), "precious");
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1);
        assert!(sd.move_file_in(&source, Path::new("a"), Path::new("../victim/x")).is_err());
    }
}
