//! The agent's copy of the workspace in review mode: made equal to the user's files before each turn, compared
//! with what it was made of after each tool, and reset to the user's file once the editor has taken a change.
//!
//! The copy lives in the session's state dir (`review/copy`, hidden from the sandbox but where it is bound over
//! the workspace); `review/manifest.json` records, per file, the stamps of the user's file and of the copy when
//! they were last made equal, so a change is the copy's stamp moving (the agent wrote) and a user's edit is the
//! workspace's stamp moving. Every path is walked and written through `cap-std`: nothing follows a link out of
//! the workspace or the copy, whatever the agent planted in the copy.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, Metadata, MetadataExt};
use serde::{Deserialize, Serialize};

use super::statedir::StateDir;

/// What of one file the copy and the workspace are compared by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    len: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &Metadata) -> Self {
        Stamp {
            len: meta.len(),
            ino: meta.ino(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// One path of the workspace as the copy was last made of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Base {
    /// A regular file: the user's file's stamp, and the copy's (`None` once the copy must be compared again).
    File { workspace: Stamp, copy: Option<Stamp> },
    /// A symlink and its target.
    Link { target: PathBuf },
}

/// Something the agent changed in its copy, relative to the workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A regular file written or created: its content in the copy, and whether it is new to the workspace.
    Written { path: PathBuf, bytes: Vec<u8>, new: bool },
    /// A file or link removed (or replaced by a directory).
    Deleted { path: PathBuf },
    /// A symlink created or changed.
    Linked { path: PathBuf, target: PathBuf },
}

impl Change {
    /// The path, relative to the workspace.
    pub fn path(&self) -> &Path {
        match self {
            Change::Written { path, .. } | Change::Deleted { path } | Change::Linked { path, .. } => path,
        }
    }
}

/// The review copy of one session's workspace.
pub struct WorkspaceCopy {
    /// `<state dir>/review`.
    root: PathBuf,
    /// The user's workspace.
    workspace: PathBuf,
    /// Absolute paths inside the workspace never copied (secrets the sandbox hides).
    never_copied: Vec<PathBuf>,
    /// Relative paths whose changes stay in the copy: the git dir and the protected paths. The next sync resets
    /// them to the user's.
    not_reviewed: Vec<PathBuf>,
    /// What git ignores is left out of the copy (a remote sandbox's mirror: build outputs stay in the sandbox).
    git_ignores: bool,
}

/// The manifest's file name in the review dir.
const MANIFEST: &str = "manifest.json";
/// The copy's dir name in the review dir.
const COPY: &str = "copy";

impl WorkspaceCopy {
    /// The copy of `workspace` kept in `review_dir`.
    pub fn new(
        review_dir: PathBuf,
        workspace: PathBuf,
        never_copied: Vec<PathBuf>,
        not_reviewed: Vec<PathBuf>,
    ) -> Self {
        WorkspaceCopy { root: review_dir, workspace, never_copied, not_reviewed, git_ignores: false }
    }

    /// The same copy without what git ignores in the workspace (the mirror of a remote sandbox).
    pub fn without_git_ignored(self) -> Self {
        WorkspaceCopy { git_ignores: true, ..self }
    }

    /// The user's workspace.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The relative paths whose changes stay in the copy (the git dir, the protected paths).
    pub fn skipped_paths(&self) -> &[PathBuf] {
        &self.not_reviewed
    }

    /// Whether changes to `rel` stay in the copy.
    pub fn skips(&self, rel: &Path) -> bool {
        self.skipped(rel)
    }

    /// Where the copy is on the host.
    pub fn path(&self) -> PathBuf {
        self.root.join(COPY)
    }

    /// The review dir (hidden from the sandbox).
    pub fn review_dir(&self) -> &Path {
        &self.root
    }

    /// Makes sure the copy's directory exists (a command may run before the first sync).
    pub fn ensure(&self) -> io::Result<()> {
        crate::config::create_private_dir(&self.root)?;
        StateDir::open(&self.root)?.ensure_dir(Path::new(COPY))
    }

    fn open(&self) -> io::Result<(Dir, StateDir, Dir)> {
        self.ensure()?;
        let workspace = Dir::open_ambient_dir(&self.workspace, ambient_authority())?;
        let copy_root = StateDir::open(&self.path())?;
        let copy = Dir::open_ambient_dir(self.path(), ambient_authority())?;
        Ok((workspace, copy_root, copy))
    }

    fn load(&self) -> BTreeMap<PathBuf, Base> {
        std::fs::read(self.root.join(MANIFEST))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    fn store(&self, manifest: &BTreeMap<PathBuf, Base>) -> io::Result<()> {
        let bytes = serde_json::to_vec(manifest).map_err(io::Error::other)?;
        StateDir::open(&self.root)?.write_file(Path::new(MANIFEST), &bytes)
    }

    /// Makes the copy equal to the user's workspace: what changed there is copied, what is gone is removed, and
    /// whatever the agent left unreviewed is overwritten. Called before a turn, after its pending changes were
    /// reviewed.
    pub fn sync(&self) -> io::Result<()> {
        let (workspace, copy_root, copy) = self.open()?;
        let old = self.load();
        let mut manifest = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let ignores = self.git_ignores.then(|| super::mirror::Ignores::new(&self.workspace));
        let hidden = |rel: &Path, dir: bool| {
            self.never_copied.iter().any(|hidden| self.workspace.join(rel).starts_with(hidden))
                || ignores.as_ref().is_some_and(|ignores| ignores.ignored(rel, dir))
        };
        for rel in walk(&workspace, hidden)?.paths {
            let Ok(meta) = workspace.symlink_metadata(&rel) else { continue };
            if meta.is_dir() {
                if !copy.symlink_metadata(&rel).is_ok_and(|m| m.is_dir()) {
                    copy_root.ensure_dir(&rel)?;
                }
                // The user's mode again: a directory the agent made unreadable in its copy would stop every sync.
                copy.set_permissions(&rel, meta.permissions())?;
                seen.insert(rel);
            } else if meta.is_symlink() {
                let target = workspace.read_link_contents(&rel)?;
                if copy.read_link_contents(&rel).ok().as_ref() != Some(&target) {
                    copy_root.symlink(&target, &rel)?;
                }
                seen.insert(rel.clone());
                manifest.insert(rel, Base::Link { target });
            } else if meta.is_file() {
                let stamp = Stamp::of(&meta);
                let copy_now = copy.symlink_metadata(&rel).ok().filter(Metadata::is_file).map(|m| Stamp::of(&m));
                let same = matches!(old.get(&rel), Some(Base::File { workspace: w, copy: Some(c) })
                    if *w == stamp && Some(*c) == copy_now);
                let copy_stamp = if same {
                    copy_now
                } else {
                    match copy_file(&workspace, &copy_root, &copy, &rel, &meta) {
                        Ok(stamp) => Some(stamp),
                        // A file the user's own account cannot read is not the agent's either.
                        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                            tracing::warn!(path = %rel.display(), "not copied for review: {e}");
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                };
                seen.insert(rel.clone());
                manifest.insert(rel, Base::File { workspace: stamp, copy: copy_stamp });
            }
        }
        // What the copy holds beyond the workspace: the agent's leftovers, placeholders of protected paths.
        for rel in walk(&copy, |_, _| false)?.paths {
            if !seen.contains(&rel) && !seen_parent_missing(&rel, &seen) {
                remove(&copy, &rel)?;
            }
        }
        self.store(&manifest)
    }

    /// What the agent changed in the copy since it was last made equal to the workspace.
    pub fn changes(&self) -> io::Result<Vec<Change>> {
        // No copy (never made, trimmed, removed by hand): nothing was changed, whatever a manifest says; its
        // entries would otherwise read as deletions of every file.
        if !std::fs::symlink_metadata(self.path()).is_ok_and(|m| m.is_dir()) {
            return Ok(Vec::new());
        }
        let (_, _, copy) = self.open()?;
        let manifest = self.load();
        let mut changes = Vec::new();
        let mut present = BTreeSet::new();
        let walked = walk(&copy, |rel, _| self.skipped(rel))?;
        for rel in walked.paths {
            let Ok(meta) = copy.symlink_metadata(&rel) else { continue };
            if meta.is_file() {
                present.insert(rel.clone());
                match manifest.get(&rel) {
                    Some(Base::File { copy: Some(stamp), .. }) if *stamp == Stamp::of(&meta) => {}
                    base => {
                        let bytes = copy.read(&rel)?;
                        changes.push(Change::Written { path: rel, bytes, new: base.is_none() });
                    }
                }
            } else if meta.is_symlink() {
                present.insert(rel.clone());
                let target = copy.read_link_contents(&rel)?;
                if manifest.get(&rel) != Some(&Base::Link { target: target.clone() }) {
                    changes.push(Change::Linked { path: rel, target });
                }
            }
        }
        for rel in manifest.keys() {
            let unreadable = walked.unreadable.iter().any(|dir| rel.starts_with(dir));
            if !present.contains(rel) && !self.skipped(rel) && !unreadable {
                changes.push(Change::Deleted { path: rel.clone() });
            }
        }
        changes.sort_by(|a, b| a.path().cmp(b.path()));
        Ok(changes)
    }

    /// Whether the user's file at `rel` holds exactly `bytes` (a change the agent reverted, or the same edit).
    pub fn workspace_holds(&self, rel: &Path, bytes: &[u8]) -> bool {
        let Ok(workspace) = Dir::open_ambient_dir(&self.workspace, ambient_authority()) else { return false };
        workspace.symlink_metadata(rel).is_ok_and(|m| m.is_file() && m.len() == bytes.len() as u64)
            && workspace.read(rel).is_ok_and(|held| held == bytes)
    }

    /// Drops the agent's version of `rel` once the editor has it: the copy takes the user's file as it is now
    /// (kept or rejected), unless the agent changed the copy again since `sent` was read, which then stays a
    /// change to review.
    pub fn settle(&self, rel: &Path, sent: &[u8]) -> io::Result<()> {
        check_relative(rel)?;
        let (workspace, copy_root, copy) = self.open()?;
        let mut manifest = self.load();
        let unchanged = copy.read(rel).is_ok_and(|held| held == sent);
        match workspace.symlink_metadata(rel) {
            Ok(meta) if meta.is_file() => {
                let stamp = Stamp::of(&meta);
                let copy_stamp =
                    if unchanged { Some(copy_file(&workspace, &copy_root, &copy, rel, &meta)?) } else { None };
                manifest.insert(rel.to_path_buf(), Base::File { workspace: stamp, copy: copy_stamp });
            }
            _ => {
                if unchanged {
                    remove(&copy, rel)?;
                    manifest.remove(rel);
                } else {
                    // The editor did not create it and the agent wrote it again: still new.
                    manifest.remove(rel);
                }
            }
        }
        self.store(&manifest)
    }

    /// Applies a change to the user's files directly (no review): a deletion, a link, or a file the editor cannot
    /// take. A deletion leaves a file the user changed since the copy was made, and answers `false`.
    pub fn apply(&self, change: &Change) -> io::Result<bool> {
        check_relative(change.path())?;
        let (workspace, _, copy) = self.open()?;
        let mut manifest = self.load();
        let rel = change.path().to_path_buf();
        let applied = match change {
            Change::Written { bytes, .. } => {
                if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
                    workspace.create_dir_all(parent)?;
                }
                if workspace.symlink_metadata(&rel).is_ok_and(|m| m.is_dir()) {
                    workspace.remove_dir_all(&rel)?;
                }
                workspace.write(&rel, bytes)?;
                if let Ok(meta) = copy.symlink_metadata(&rel) {
                    workspace.set_permissions(&rel, meta.permissions())?;
                }
                let stamp = Stamp::of(&workspace.symlink_metadata(&rel)?);
                let copy_stamp = copy.symlink_metadata(&rel).ok().map(|m| Stamp::of(&m));
                manifest.insert(rel, Base::File { workspace: stamp, copy: copy_stamp });
                true
            }
            Change::Linked { target, .. } => {
                if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
                    workspace.create_dir_all(parent)?;
                }
                match workspace.symlink_metadata(&rel) {
                    Ok(meta) if meta.is_dir() => workspace.remove_dir_all(&rel)?,
                    Ok(_) => workspace.remove_file(&rel)?,
                    Err(_) => {}
                }
                workspace.symlink_contents(target, &rel)?;
                manifest.insert(rel, Base::Link { target: target.clone() });
                true
            }
            Change::Deleted { .. } => {
                let untouched = match (manifest.get(&rel), workspace.symlink_metadata(&rel)) {
                    (Some(Base::File { workspace: stamp, .. }), Ok(meta)) => {
                        meta.is_file() && Stamp::of(&meta) == *stamp
                    }
                    (Some(Base::Link { target }), Ok(meta)) => {
                        meta.is_symlink() && workspace.read_link_contents(&rel).ok().as_ref() == Some(target)
                    }
                    (_, Err(_)) => true,
                    (None, Ok(_)) => false,
                };
                if untouched {
                    match workspace.remove_file(&rel) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
                // Either way the deletion is decided: the next sync brings a file the user changed back.
                manifest.remove(&rel);
                untouched
            }
        };
        self.store(&manifest)?;
        Ok(applied)
    }

    /// Changes under the git dir and the protected paths stay in the copy.
    fn skipped(&self, rel: &Path) -> bool {
        self.not_reviewed.iter().any(|skip| rel.starts_with(skip))
    }
}

/// Copies the user's file at `rel` into the copy (replacing whatever is there) and answers the copy's stamp.
fn copy_file(workspace: &Dir, copy_root: &StateDir, copy: &Dir, rel: &Path, meta: &Metadata) -> io::Result<Stamp> {
    let bytes = workspace.read(rel)?;
    copy_root.write_file(rel, &bytes)?;
    copy.set_permissions(rel, meta.permissions())?;
    Ok(Stamp::of(&copy.symlink_metadata(rel)?))
}

/// Every path below `dir` but the `pruned` ones and what they hold (directories before what they hold), never
/// following a link.
pub(super) fn walk(dir: &Dir, pruned: impl Fn(&Path, bool) -> bool) -> io::Result<Walked> {
    let mut out = Walked::default();
    let mut dirs = vec![PathBuf::new()];
    while let Some(current) = dirs.pop() {
        let entries = match if current.as_os_str().is_empty() { dir.entries() } else { dir.read_dir(&current) } {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && !current.as_os_str().is_empty() => {
                tracing::warn!(path = %current.display(), "not walked for review: {e}");
                out.unreadable.push(current);
                continue;
            }
            Err(e) => return Err(e),
        };
        for entry in entries {
            let rel = current.join(entry?.file_name());
            let is_dir = dir.symlink_metadata(&rel).is_ok_and(|m| m.is_dir());
            if pruned(&rel, is_dir) {
                continue;
            }
            if is_dir {
                dirs.push(rel.clone());
            }
            out.paths.push(rel);
        }
    }
    Ok(out)
}

/// What [`walk`] found.
#[derive(Default)]
pub(super) struct Walked {
    pub(super) paths: Vec<PathBuf>,
    /// Directories it could not read: what they hold is neither seen nor gone.
    unreadable: Vec<PathBuf>,
}

/// Whether an ancestor of `rel` is already gone from `seen` (so `rel` went with it).
fn seen_parent_missing(rel: &Path, seen: &BTreeSet<PathBuf>) -> bool {
    rel.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()).any(|a| !seen.contains(a))
}

/// Removes the file, link or directory tree at `rel`, never following a link; a missing one is fine.
pub(super) fn remove(dir: &Dir, rel: &Path) -> io::Result<()> {
    let result = match dir.symlink_metadata(rel) {
        Ok(meta) if meta.is_dir() => dir.remove_dir_all(rel),
        Ok(_) => dir.remove_file(rel),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Refuses a path that is not plainly inside the workspace.
pub(super) fn check_relative(rel: &Path) -> io::Result<()> {
    if rel.as_os_str().is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not inside the workspace", rel.display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, WorkspaceCopy, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("src")).unwrap();
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(ws.join("secret")).unwrap();
        std::fs::write(ws.join("src/a.txt"), "a\n").unwrap();
        std::fs::write(ws.join("b.txt"), "b\n").unwrap();
        std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
        std::fs::write(ws.join("secret/key"), "k").unwrap();
        let copy = WorkspaceCopy::new(
            dir.path().join("state/review"),
            ws.clone(),
            vec![ws.join("secret")],
            vec![PathBuf::from(".git")],
        );
        std::fs::create_dir_all(dir.path().join("state")).unwrap();
        copy.sync().unwrap();
        (dir, copy, ws)
    }

    #[test]
    fn the_copy_holds_the_workspace_but_its_hidden_paths() {
        let (_dir, copy, _ws) = setup();
        let root = copy.path();
        assert_eq!(std::fs::read_to_string(root.join("src/a.txt")).unwrap(), "a\n");
        assert_eq!(std::fs::read_to_string(root.join(".git/config")).unwrap(), "[core]\n");
        assert!(!root.join("secret").exists());
        assert_eq!(copy.changes().unwrap(), vec![]);
    }

    #[test]
    fn the_agents_writes_are_changes_until_settled_and_the_users_edits_are_not() {
        let (_dir, copy, ws) = setup();
        let root = copy.path();
        std::fs::write(root.join("src/a.txt"), "agent\n").unwrap();
        std::fs::write(root.join("new.txt"), "new\n").unwrap();
        std::fs::remove_file(root.join("b.txt")).unwrap();
        std::fs::write(root.join(".git/config"), "[core]\nhooksPath=x\n").unwrap();
        std::fs::write(ws.join("b.txt"), "the user's\n").unwrap();
        let changes = copy.changes().unwrap();
        assert_eq!(
            changes,
            vec![
                Change::Deleted { path: "b.txt".into() },
                Change::Written { path: "new.txt".into(), bytes: b"new\n".to_vec(), new: true },
                Change::Written { path: "src/a.txt".into(), bytes: b"agent\n".to_vec(), new: false },
            ]
        );
        // The editor rejected the edit (the user's file is unchanged) and kept the new file.
        copy.settle(Path::new("src/a.txt"), b"agent\n").unwrap();
        std::fs::write(ws.join("new.txt"), "new\n").unwrap();
        copy.settle(Path::new("new.txt"), b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(root.join("src/a.txt")).unwrap(), "a\n");
        // The user changed b.txt since: the deletion is not applied.
        assert!(!copy.apply(&Change::Deleted { path: "b.txt".into() }).unwrap());
        assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "the user's\n");
        assert_eq!(copy.changes().unwrap(), vec![], "a deletion is decided once");
        copy.sync().unwrap();
        assert_eq!(copy.changes().unwrap(), vec![]);
        assert_eq!(std::fs::read_to_string(root.join("b.txt")).unwrap(), "the user's\n");
        assert_eq!(std::fs::read_to_string(root.join(".git/config")).unwrap(), "[core]\n");
    }

    #[test]
    fn a_copy_gone_without_its_manifest_deletes_nothing() {
        let (_dir, copy, ws) = setup();
        std::fs::remove_dir_all(copy.path()).unwrap();
        assert_eq!(copy.changes().unwrap(), vec![]);
        copy.sync().unwrap();
        assert_eq!(copy.changes().unwrap(), vec![]);
        assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "b\n");
        assert_eq!(std::fs::read_to_string(copy.path().join("b.txt")).unwrap(), "b\n");
    }

    #[test]
    fn a_write_after_the_sent_one_stays_a_change() {
        let (_dir, copy, _ws) = setup();
        let root = copy.path();
        std::fs::write(root.join("b.txt"), "first\n").unwrap();
        std::fs::write(root.join("b.txt"), "second\n").unwrap();
        copy.settle(Path::new("b.txt"), b"first\n").unwrap();
        assert_eq!(
            copy.changes().unwrap(),
            vec![Change::Written { path: "b.txt".into(), bytes: b"second\n".to_vec(), new: false }]
        );
    }

    #[test]
    fn direct_applications_never_leave_the_workspace() {
        let (dir, copy, ws) = setup();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, copy.path().join("out")).unwrap();
        let link = Change::Linked { path: "out".into(), target: outside.clone() };
        assert_eq!(copy.changes().unwrap(), vec![link.clone()]);
        assert!(copy.apply(&link).unwrap());
        let through = Change::Written { path: "out/x.bin".into(), bytes: vec![0, 1], new: true };
        assert!(copy.apply(&through).is_err());
        assert!(!outside.join("x.bin").exists());
        assert!(copy.apply(&Change::Written { path: "../x".into(), bytes: vec![], new: true }).is_err());
        assert!(std::fs::symlink_metadata(ws.join("out")).unwrap().is_symlink());
    }
}
