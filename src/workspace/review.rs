//! The agent's copy of the workspace in review mode: made equal to the user's files before each turn, compared
//! with what it was made of after each tool, and reset to the user's file once the editor has taken a change.
//!
//! The copy lives in the session's state dir (`review/copy`, hidden from the sandbox but where it is bound over
//! the workspace); `review/manifest.json` records, per file, the stamps of the user's file and of the copy when
//! they were last made equal, so a change is the copy's stamp moving (the agent wrote) and a user's edit is the
//! workspace's stamp moving. `review/held.json` records the changes held back (not allowed, or never appliable):
//! they stay in the copy, across turns too, until the agent changes them again or the user changes the file.
//!
//! Every path is resolved one component at a time without following a link (`open_dir_nofollow`), in the
//! workspace and in the copy, and only regular files are read, opened with `O_NOFOLLOW | O_NONBLOCK` and checked on
//! the opened descriptor (a FIFO put in a file's place never blocks a review), their size bounded before reading.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, File, Metadata, MetadataExt, OpenOptions, OpenOptionsExt, Permissions, PermissionsExt};
use serde::{Deserialize, Serialize};

use super::statedir::StateDir;

/// The largest file read whole for review (a text file the editor can show); a larger one is streamed.
pub const TEXT_LIMIT: u64 = 2 * 1024 * 1024;
/// At most this many bytes of the agent's files are read into memory by one look at its changes; the files after
/// that are treated like large ones (streamed when applied), so a flood of files cannot fill the bridge's memory.
const READ_BUDGET: u64 = 256 * 1024 * 1024;
/// The largest file that can be applied at all (on the user's explicit allow); a larger one is held back by its
/// apparent size, never read (a sparse file of GiBs costs nothing).
pub const APPLY_LIMIT: u64 = 64 * 1024 * 1024;

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

fn exec_of(meta: &Metadata) -> bool {
    meta.mode() & 0o111 != 0
}

/// One path of the workspace as the copy was last made of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Base {
    /// A regular file: the user's file's stamp, and the copy's (`None` once the copy must be compared again);
    /// whether the user's file was executable (`None` in manifests older than that).
    File {
        workspace: Stamp,
        copy: Option<Stamp>,
        #[serde(default)]
        exec: Option<bool>,
    },
    /// A symlink and its target.
    Link { target: PathBuf },
}

/// Something the agent changed in its copy, relative to the workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A regular file of at most [`TEXT_LIMIT`] bytes written or created: its content in the copy, and whether it
    /// is new to the workspace.
    Written { path: PathBuf, bytes: Vec<u8>, new: bool },
    /// A regular file larger than [`TEXT_LIMIT`] (by its apparent size), never read whole.
    Large { path: PathBuf, len: u64, new: bool, stamp: String },
    /// A file or link removed (or replaced by a directory).
    Deleted { path: PathBuf },
    /// A file moved from `from` to `path`, its content unchanged.
    Renamed { from: PathBuf, path: PathBuf },
    /// A symlink created or changed.
    Linked { path: PathBuf, target: PathBuf },
    /// The executable bit set or cleared (the only mode bit ever applied).
    Exec { path: PathBuf, set: bool },
    /// A FIFO, socket or device where a file was or is: never read, never applied.
    Special { path: PathBuf },
}

impl Change {
    /// The path, relative to the workspace (a rename's new path).
    pub fn path(&self) -> &Path {
        match self {
            Change::Written { path, .. }
            | Change::Large { path, .. }
            | Change::Deleted { path }
            | Change::Renamed { path, .. }
            | Change::Linked { path, .. }
            | Change::Exec { path, .. }
            | Change::Special { path } => path,
        }
    }

    /// What tells this change from another one at its path: a held-back change is not offered or noted again
    /// until this moves.
    pub fn key(&self) -> String {
        match self {
            Change::Written { bytes, .. } => {
                let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
                let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
                format!("write:{hex}")
            }
            Change::Large { stamp, .. } => format!("large:{stamp}"),
            Change::Deleted { .. } => "delete".into(),
            Change::Renamed { from, .. } => format!("rename:{}", from.display()),
            Change::Linked { target, .. } => format!("link:{}", target.display()),
            Change::Exec { set, .. } => format!("exec:{set}"),
            Change::Special { .. } => "special".into(),
        }
    }

    /// Every path of the workspace the change is about (a rename's both).
    fn paths(&self) -> Vec<&Path> {
        match self {
            Change::Renamed { from, path } => vec![from, path],
            other => vec![other.path()],
        }
    }
}

/// What a bounded read of a path found.
#[derive(Debug, PartialEq, Eq)]
pub enum Regular {
    /// A regular file of at most the limit, whole.
    Bytes(Vec<u8>),
    /// A regular file larger than the limit: its apparent size. Nothing was read.
    Large(u64),
    /// A link, directory, FIFO, socket or device (or a link on the way to it).
    NotRegular,
    Missing,
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
/// The held-back changes' file name in the review dir.
const HELD: &str = "held.json";
/// The copy's dir name in the review dir.
const COPY: &str = "copy";

/// The held-back changes: per path, the keys of its changes.
type Held = BTreeMap<PathBuf, BTreeSet<String>>;

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
        crate::paths::create_private_dir(&self.root)?;
        StateDir::open(&self.root)?.ensure_dir(Path::new(COPY))
    }

    /// Makes the copy if it was never made: a command started before the first turn's sync (an agent started ahead,
    /// or before the turn reviews anything) finds the user's files where the sandbox binds them, `.git` included.
    pub fn ensure_made(&self) -> io::Result<()> {
        if self.root.join(MANIFEST).exists() {
            return self.ensure();
        }
        self.sync()
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

    fn load_held(&self) -> Held {
        std::fs::read(self.root.join(HELD))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    fn store_held(&self, held: &Held) -> io::Result<()> {
        let bytes = serde_json::to_vec(held).map_err(io::Error::other)?;
        StateDir::open(&self.root)?.write_file(Path::new(HELD), &bytes)
    }

    /// The changes among `changes` not held back before as they are now.
    pub fn unheld(&self, changes: &[Change]) -> Vec<Change> {
        let held = self.load_held();
        changes
            .iter()
            .filter(|change| !held.get(change.path()).is_some_and(|keys| keys.contains(&change.key())))
            .cloned()
            .collect()
    }

    /// Holds `changes` back: they stay in the copy (the next syncs keep them while the user's file is as it was)
    /// and are not offered again until they change. Every other held change not among `current` is forgotten.
    pub fn hold(&self, changes: &[Change], current: &[Change]) -> io::Result<()> {
        let mut held = self.load_held();
        if held.is_empty() && changes.is_empty() {
            return Ok(());
        }
        self.ensure()?;
        held.retain(|path, keys| {
            keys.retain(|key| {
                current.iter().any(|c| {
                    (c.path() == path && c.key() == *key)
                        || matches!(c, Change::Renamed { from, path: to }
                            if from == path && *key == format!("renamed-to:{}", to.display()))
                })
            });
            !keys.is_empty()
        });
        for change in changes {
            held.entry(change.path().to_path_buf()).or_default().insert(change.key());
            if let Change::Renamed { from, .. } = change {
                held.entry(from.clone()).or_default().insert(format!("renamed-to:{}", change.path().display()));
            }
        }
        self.store_held(&held)
    }

    /// Makes the copy equal to the user's workspace: what changed there is copied, what is gone is removed, and
    /// whatever the agent left unreviewed is overwritten, but the changes held back at paths the user has not
    /// changed since. Called before a turn, after its pending changes were reviewed.
    pub fn sync(&self) -> io::Result<()> {
        let (workspace, copy_root, copy) = self.open()?;
        let old = self.load();
        let mut held = self.load_held();
        let mut kept = BTreeSet::new();
        let mut manifest = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let ignores = self.git_ignores.then(|| super::ignore::Ignores::new(&self.workspace));
        let hidden = |rel: &Path, dir: bool| {
            self.never_copied.iter().any(|hidden| self.workspace.join(rel).starts_with(hidden))
                || ignores.as_ref().is_some_and(|ignores| ignores.ignored(rel, dir))
        };
        for rel in walk(&workspace, hidden)?.paths {
            let Ok(meta) = workspace.symlink_metadata(&rel) else { continue };
            if meta.is_dir() {
                if held.contains_key(&rel) && !copy.symlink_metadata(&rel).is_ok_and(|m| m.is_dir()) {
                    // The agent's link or file where the user's directory is, held back: it stays.
                    kept.insert(rel.clone());
                    seen.insert(rel);
                    continue;
                }
                if !copy.symlink_metadata(&rel).is_ok_and(|m| m.is_dir()) {
                    copy_root.ensure_dir(&rel)?;
                }
                // The user's mode again: a directory the agent made unreadable in its copy would stop every sync.
                let (parent, name) = parent_of(&copy, &rel, false)?;
                parent.set_permissions(name, Permissions::from_mode(meta.mode() & 0o777))?;
                seen.insert(rel);
            } else if meta.is_symlink() {
                let target = workspace.read_link_contents(&rel)?;
                let base = Base::Link { target: target.clone() };
                seen.insert(rel.clone());
                if held.contains_key(&rel) && old.get(&rel) == Some(&base) {
                    kept.insert(rel.clone());
                } else if copy.read_link_contents(&rel).ok().as_ref() != Some(&target) {
                    copy_root.symlink(&target, &rel)?;
                }
                manifest.insert(rel, base);
            } else if meta.is_file() {
                let stamp = Stamp::of(&meta);
                seen.insert(rel.clone());
                if held.contains_key(&rel)
                    && let Some(base @ Base::File { workspace: w, .. }) = old.get(&rel)
                    && *w == stamp
                {
                    // A change held back: the agent keeps its version while the user's file is as it was.
                    kept.insert(rel.clone());
                    manifest.insert(rel, base.clone());
                    continue;
                }
                let copy_now = copy.symlink_metadata(&rel).ok().filter(Metadata::is_file);
                let same = matches!(old.get(&rel), Some(Base::File { workspace: w, copy: Some(c), .. })
                    if *w == stamp && copy_now.as_ref().map(Stamp::of) == Some(*c))
                    && copy_now.as_ref().is_some_and(|m| exec_of(m) == exec_of(&meta));
                let copy_stamp = if same {
                    copy_now.as_ref().map(Stamp::of)
                } else {
                    match copy_file(&workspace, &copy_root, &copy, &rel, None) {
                        Ok(Some(stamp)) => Some(stamp),
                        // Not a regular file any more (swapped meanwhile): not copied.
                        Ok(None) => continue,
                        // A file the user's own account cannot read is not the agent's either.
                        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                            tracing::warn!(path = %rel.display(), "not copied for review: {e}");
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                };
                manifest.insert(rel, Base::File { workspace: stamp, copy: copy_stamp, exec: Some(exec_of(&meta)) });
            }
        }
        // What the copy holds beyond the workspace: the agent's leftovers, placeholders of protected paths; but
        // what it holds back (a new file, a deletion's absence), and the directories on their way.
        let holds = |rel: &Path| held.keys().any(|path| path.starts_with(rel));
        for rel in walk(&copy, |_, _| false)?.paths {
            if holds(&rel) && !seen.contains(&rel) {
                if held.contains_key(&rel) {
                    kept.insert(rel.clone());
                }
                continue;
            }
            if !seen.contains(&rel) && !seen_parent_missing(&rel, &seen) {
                remove(&copy, &rel)?;
            }
        }
        // What the user changed meanwhile is the user's again: those held changes are gone with the sync.
        held.retain(|rel, _| kept.contains(rel));
        self.store_held(&held)?;
        self.store(&manifest)
    }

    /// What the agent changed in the copy since it was last made equal to the workspace.
    pub fn changes(&self) -> io::Result<Vec<Change>> {
        // No copy (never made, trimmed, removed by hand): nothing was changed, whatever a manifest says; its
        // entries would otherwise read as deletions of every file.
        if !std::fs::symlink_metadata(self.path()).is_ok_and(|m| m.is_dir()) {
            return Ok(Vec::new());
        }
        let (workspace, _, copy) = self.open()?;
        let manifest = self.load();
        let mut changes = Vec::new();
        let mut present = BTreeSet::new();
        // New files by the copy's inode: a deleted file's inode again is a rename.
        let mut new_by_ino: BTreeMap<u64, (PathBuf, u64)> = BTreeMap::new();
        let walked = walk(&copy, |rel, _| self.skipped(rel))?;
        let mut budget = READ_BUDGET;
        for rel in walked.paths {
            let Ok(meta) = copy.symlink_metadata(&rel) else { continue };
            if meta.is_file() {
                present.insert(rel.clone());
                let base = manifest.get(&rel);
                let base_exec = match base {
                    Some(Base::File { exec, .. }) => *exec,
                    Some(Base::Link { .. }) => Some(false),
                    None => Some(false),
                };
                match base {
                    Some(Base::File { copy: Some(stamp), .. }) if *stamp == Stamp::of(&meta) => {}
                    base => {
                        let new = !matches!(base, Some(Base::File { .. }));
                        match read_regular(&copy, &rel, TEXT_LIMIT.min(budget))? {
                            (Regular::Bytes(bytes), Some(opened)) => {
                                budget -= bytes.len() as u64;
                                if base.is_none() {
                                    new_by_ino.insert(opened.ino(), (rel.clone(), opened.len()));
                                }
                                changes.push(Change::Written { path: rel.clone(), bytes, new });
                            }
                            (Regular::Large(len), Some(opened)) => {
                                if base.is_none() {
                                    new_by_ino.insert(opened.ino(), (rel.clone(), len));
                                }
                                let s = Stamp::of(&opened);
                                let stamp = format!("{}:{}:{}.{}", s.len, s.ino, s.mtime.0, s.mtime.1);
                                changes.push(Change::Large { path: rel.clone(), len, new, stamp });
                            }
                            (Regular::Missing, _) => {
                                present.remove(&rel);
                                continue;
                            }
                            _ => {
                                changes.push(Change::Special { path: rel });
                                continue;
                            }
                        }
                    }
                }
                let exec = exec_of(&meta);
                if base_exec.is_some_and(|was| was != exec) {
                    changes.push(Change::Exec { path: rel, set: exec });
                }
            } else if meta.is_symlink() {
                present.insert(rel.clone());
                let target = copy.read_link_contents(&rel)?;
                if manifest.get(&rel) != Some(&Base::Link { target: target.clone() }) {
                    changes.push(Change::Linked { path: rel, target });
                }
            } else if !meta.is_dir() {
                // A FIFO, socket or device: never read; where a file was, not a deletion either.
                present.insert(rel.clone());
                changes.push(Change::Special { path: rel });
            }
        }
        for (rel, base) in &manifest {
            let unreadable = walked.unreadable.iter().any(|dir| rel.starts_with(dir));
            if present.contains(rel) || self.skipped(rel) || unreadable {
                continue;
            }
            // The same inode at a new path, with the user's content: a rename.
            if let Base::File { copy: Some(stamp), workspace: w, .. } = base
                && let Some((to, len)) = new_by_ino.get(&stamp.ino).cloned()
                && len == w.len
                && same_content(&workspace, rel, &copy, &to)?
            {
                new_by_ino.remove(&stamp.ino);
                changes.retain(|c| !(c.path() == to && matches!(c, Change::Written { .. } | Change::Large { .. })));
                changes.push(Change::Renamed { from: rel.clone(), path: to });
                continue;
            }
            changes.push(Change::Deleted { path: rel.clone() });
        }
        changes.sort_by(|a, b| a.path().cmp(b.path()));
        Ok(changes)
    }

    /// Whether the user's file at `rel` holds exactly `bytes` (a change the agent reverted, or the same edit).
    pub fn workspace_holds(&self, rel: &Path, bytes: &[u8]) -> bool {
        let Ok(workspace) = Dir::open_ambient_dir(&self.workspace, ambient_authority()) else { return false };
        matches!(read_regular(&workspace, rel, bytes.len() as u64), Ok((Regular::Bytes(held), _)) if held == bytes)
    }

    /// Whether `rel` can be handed to the editor: no component of it in the user's workspace is a link (a client
    /// that writes with a plain `open()` would follow it out), every existing one on the way is a directory, and
    /// the file itself, if there, is a regular file.
    pub fn plain_in_workspace(&self, rel: &Path) -> bool {
        let Ok(workspace) = Dir::open_ambient_dir(&self.workspace, ambient_authority()) else { return false };
        if check_relative(rel).is_err() {
            return false;
        }
        let mut current = PathBuf::new();
        let parts: Vec<&OsStr> = rel.iter().collect();
        for (at, part) in parts.iter().enumerate() {
            current.push(part);
            match workspace.symlink_metadata(&current) {
                Ok(meta) if at + 1 < parts.len() && meta.is_dir() => {}
                Ok(meta) if at + 1 == parts.len() && meta.is_file() => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
                _ => return false,
            }
        }
        true
    }

    /// Drops the agent's version of `rel` once the editor has it: the copy takes the user's file as it is now
    /// (kept or rejected), unless the agent changed the copy again since `sent` was read, which then stays a
    /// change to review. The copy's executable bit stays the agent's (a change of its own, reviewed apart).
    pub fn settle(&self, rel: &Path, sent: &[u8]) -> io::Result<()> {
        check_relative(rel)?;
        let (workspace, copy_root, copy) = self.open()?;
        let mut manifest = self.load();
        let unchanged =
            matches!(read_regular(&copy, rel, sent.len() as u64)?, (Regular::Bytes(held), _) if held == sent);
        let agents_exec = copy.symlink_metadata(rel).ok().filter(Metadata::is_file).map(|m| exec_of(&m));
        match workspace.symlink_metadata(rel) {
            Ok(meta) if meta.is_file() => {
                let stamp = Stamp::of(&meta);
                let copy_stamp =
                    if unchanged { copy_file(&workspace, &copy_root, &copy, rel, agents_exec)? } else { None };
                manifest.insert(
                    rel.to_path_buf(),
                    Base::File { workspace: stamp, copy: copy_stamp, exec: Some(exec_of(&meta)) },
                );
            }
            _ => {
                if unchanged {
                    remove(&copy, rel)?;
                }
                // Either way not the user's: the editor did not create it (and the agent may have written it
                // again: still new).
                manifest.remove(rel);
            }
        }
        self.store(&manifest)
    }

    /// Applies a change to the user's files, on the user's explicit allow. Nothing follows a link: a link on the
    /// way is an error. A deletion or rename leaves a file the user changed since the copy was made, and answers
    /// `false`; so does an executable bit on a file that is not there (the editor did not keep it).
    pub fn apply(&self, change: &Change) -> io::Result<bool> {
        for path in change.paths() {
            check_relative(path)?;
        }
        let (workspace, _, copy) = self.open()?;
        let mut manifest = self.load();
        let rel = change.path().to_path_buf();
        let untouched = |manifest: &BTreeMap<PathBuf, Base>, rel: &Path| -> io::Result<bool> {
            let (dir, name) = match parent_of(&workspace, rel, false) {
                Ok(found) => found,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
                Err(e) => return Err(e),
            };
            Ok(match (manifest.get(rel), dir.symlink_metadata(name)) {
                (Some(Base::File { workspace: stamp, .. }), Ok(meta)) => meta.is_file() && Stamp::of(&meta) == *stamp,
                (Some(Base::Link { target }), Ok(meta)) => {
                    meta.is_symlink() && dir.read_link_contents(name).ok().as_ref() == Some(target)
                }
                (_, Err(e)) if e.kind() == io::ErrorKind::NotFound => true,
                (_, Err(e)) => return Err(e),
                (None, Ok(_)) => false,
            })
        };
        let applied = match change {
            Change::Written { bytes, .. } => {
                let exec = write_file(&workspace, &rel, &mut bytes.as_slice())?;
                let copy_stamp = match read_regular(&copy, &rel, bytes.len() as u64)? {
                    (Regular::Bytes(held), Some(meta)) if held == *bytes => Some(Stamp::of(&meta)),
                    _ => None,
                };
                let stamp = Stamp::of(&workspace.symlink_metadata(&rel)?);
                manifest.insert(rel, Base::File { workspace: stamp, copy: copy_stamp, exec: Some(exec) });
                true
            }
            Change::Large { len, .. } => {
                if *len > APPLY_LIMIT {
                    return Err(io::Error::other(format!("larger than {} MiB", APPLY_LIMIT / (1024 * 1024))));
                }
                let (file, meta) = open_regular(&copy, &rel)?
                    .ok_or_else(|| io::Error::other("not a regular file in the agent's copy"))?;
                if meta.len() > APPLY_LIMIT {
                    return Err(io::Error::other(format!("larger than {} MiB", APPLY_LIMIT / (1024 * 1024))));
                }
                let exec = write_file(&workspace, &rel, &mut file.take(APPLY_LIMIT))?;
                let stamp = Stamp::of(&workspace.symlink_metadata(&rel)?);
                manifest.insert(rel, Base::File { workspace: stamp, copy: Some(Stamp::of(&meta)), exec: Some(exec) });
                true
            }
            Change::Linked { target, .. } => {
                let (dir, name) = parent_of(&workspace, &rel, true)?;
                match dir.symlink_metadata(name) {
                    Ok(meta) if meta.is_dir() => {
                        return Err(io::Error::other("a directory of yours is in the way"));
                    }
                    Ok(_) => dir.remove_file(name)?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                dir.symlink_contents(target, name)?;
                manifest.insert(rel, Base::Link { target: target.clone() });
                true
            }
            Change::Deleted { .. } => {
                let untouched = untouched(&manifest, &rel)?;
                if untouched && let Ok((dir, name)) = parent_of(&workspace, &rel, false) {
                    match dir.remove_file(name) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
                // Either way the deletion is decided: the next sync brings a file the user changed back.
                manifest.remove(&rel);
                untouched
            }
            Change::Renamed { from, .. } => {
                let (from_dir, from_name) = parent_of(&workspace, from, false)?;
                let (to_dir, to_name) = parent_of(&workspace, &rel, true)?;
                let free = matches!(to_dir.symlink_metadata(to_name), Err(e) if e.kind() == io::ErrorKind::NotFound);
                let ok = untouched(&manifest, from)?
                    && from_dir.symlink_metadata(from_name).is_ok_and(|m| m.is_file())
                    && free;
                if ok {
                    from_dir.rename(from_name, &to_dir, to_name)?;
                    let meta = to_dir.symlink_metadata(to_name)?;
                    let copy_stamp = copy.symlink_metadata(&rel).ok().filter(Metadata::is_file).map(|m| Stamp::of(&m));
                    manifest.remove(from);
                    manifest.insert(
                        rel,
                        Base::File { workspace: Stamp::of(&meta), copy: copy_stamp, exec: Some(exec_of(&meta)) },
                    );
                }
                ok
            }
            Change::Exec { set, .. } => {
                let (dir, name) = parent_of(&workspace, &rel, false)?;
                match dir.symlink_metadata(name) {
                    Ok(meta) if meta.is_file() => {
                        let mode = meta.mode() & 0o777;
                        let mode = if *set { mode | ((mode & 0o444) >> 2) } else { mode & !0o111 };
                        dir.set_permissions(name, Permissions::from_mode(mode))?;
                        let meta = dir.symlink_metadata(name)?;
                        if let Some(Base::File { workspace, exec, .. }) = manifest.get_mut(&rel) {
                            *workspace = Stamp::of(&meta);
                            *exec = Some(exec_of(&meta));
                        }
                        true
                    }
                    Ok(_) => return Err(io::Error::other("not a regular file")),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                    Err(e) => return Err(e),
                }
            }
            Change::Special { .. } => return Err(io::Error::other("not a regular file")),
        };
        self.store(&manifest)?;
        Ok(applied)
    }

    /// Reads the user's file at `rel` if it is a regular file of at most `limit` bytes (the old side of a diff).
    pub fn workspace_text(&self, rel: &Path, limit: u64) -> Option<String> {
        let workspace = Dir::open_ambient_dir(&self.workspace, ambient_authority()).ok()?;
        match read_regular(&workspace, rel, limit).ok()? {
            (Regular::Bytes(bytes), _) => String::from_utf8(bytes).ok(),
            _ => None,
        }
    }

    /// Changes under the git dir and the protected paths stay in the copy.
    fn skipped(&self, rel: &Path) -> bool {
        self.not_reviewed.iter().any(|skip| rel.starts_with(skip))
    }
}

/// Opens the directory `rel` below `root` one component at a time, never following a link: a link or anything
/// but a directory on the way is an error; with `create`, a missing directory is made.
pub(crate) fn open_dir_nofollow(root: &Dir, rel: &Path, create: bool) -> io::Result<Dir> {
    let mut dir = root.try_clone()?;
    for component in rel.components() {
        let Component::Normal(name) = component else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not plain", rel.display())));
        };
        match dir.symlink_metadata(name) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{} is not a directory (a link is never followed)", rel.display()),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => match dir.create_dir(name) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            },
            Err(e) => return Err(e),
        }
        let mut options = OpenOptions::new();
        options.read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW);
        let file = dir.open_with(name, &options)?;
        dir = Dir::from_std_file(file.into_std());
    }
    Ok(dir)
}

/// The directory holding `rel` (opened without following a link) and `rel`'s own name in it.
pub(crate) fn parent_of<'a>(root: &Dir, rel: &'a Path, create: bool) -> io::Result<(Dir, &'a OsStr)> {
    check_relative(rel)?;
    let name = rel.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let parent = rel.parent().unwrap_or(Path::new(""));
    Ok((open_dir_nofollow(root, parent, create)?, name))
}

/// Opens `rel` for reading if it is a regular file: never through a link (anywhere on the way), never blocking
/// on a FIFO, its type checked on the opened descriptor.
pub(crate) fn open_regular(root: &Dir, rel: &Path) -> io::Result<Option<(File, Metadata)>> {
    let (dir, name) = match parent_of(root, rel, false) {
        Ok(found) => found,
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = match dir.open_with(name, &options) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // A link (ELOOP), a socket (ENXIO): not regular.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENXIO)) => {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file"));
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file"));
    }
    Ok(Some((file, meta)))
}

/// Reads `rel` if it is a regular file of at most `limit` bytes (by its apparent size, checked before reading,
/// and the read bounded too); answers the opened file's metadata with it.
pub fn read_regular(root: &Dir, rel: &Path, limit: u64) -> io::Result<(Regular, Option<Metadata>)> {
    let (file, meta) = match open_regular(root, rel) {
        Ok(Some(found)) => found,
        Ok(None) => return Ok((Regular::Missing, None)),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok((Regular::NotRegular, None)),
        Err(e) => return Err(e),
    };
    if meta.len() > limit {
        return Ok((Regular::Large(meta.len()), Some(meta)));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Ok((Regular::Large(bytes.len() as u64), Some(meta)));
    }
    Ok((Regular::Bytes(bytes), Some(meta)))
}

/// Whether two regular files hold the same bytes, compared a block at a time.
pub(crate) fn same_content(a_root: &Dir, a: &Path, b_root: &Dir, b: &Path) -> io::Result<bool> {
    let (Some((a, a_meta)), Some((b, b_meta))) =
        (open_regular(a_root, a).ok().flatten(), open_regular(b_root, b).ok().flatten())
    else {
        return Ok(false);
    };
    if a_meta.len() != b_meta.len() || a_meta.len() > APPLY_LIMIT {
        return Ok(false);
    }
    let (mut a, mut b) = (io::BufReader::new(a.take(APPLY_LIMIT)), io::BufReader::new(b.take(APPLY_LIMIT)));
    let (mut x, mut y) = (vec![0; 64 * 1024], vec![0; 64 * 1024]);
    loop {
        let n = a.read(&mut x)?;
        if n == 0 {
            return Ok(b.read(&mut y[..1])? == 0);
        }
        let mut got = 0;
        while got < n {
            let m = b.read(&mut y[got..n])?;
            if m == 0 {
                return Ok(false);
            }
            got += m;
        }
        if x[..n] != y[..n] {
            return Ok(false);
        }
    }
}

/// Writes the user's file at `rel` from `content` through a new file renamed into place: its directories are
/// made real ones (a link on the way is an error), a link or directory in its place is an error, and its mode
/// stays the user's (a new file gets 0644). Answers whether it is executable.
fn write_file(workspace: &Dir, rel: &Path, content: &mut dyn Read) -> io::Result<bool> {
    let (dir, name) = parent_of(workspace, rel, true)?;
    let mode = match dir.symlink_metadata(name) {
        Ok(meta) if meta.is_file() => meta.mode() & 0o777,
        Ok(_) => return Err(io::Error::other("a link or directory is in its place (never followed)")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0o644,
        Err(e) => return Err(e),
    };
    let temp = format!(".{}.acp-sandbox-{}", name.to_string_lossy(), uuid::Uuid::new_v4().simple());
    let mut options = OpenOptions::new();
    options.write(true).create_new(true).custom_flags(libc::O_NOFOLLOW);
    let mut file = dir.open_with(&temp, &options)?;
    let written = io::copy(content, &mut file).and_then(|_| file.flush()).and_then(|()| {
        file.set_permissions(Permissions::from_mode(mode))?;
        dir.rename(&temp, &dir, name)
    });
    if let Err(e) = written {
        let _ = dir.remove_file(&temp);
        return Err(e);
    }
    Ok(mode & 0o111 != 0)
}

/// Copies the user's file at `rel` into the copy (replacing whatever is there), streamed, and answers the copy's
/// stamp; `None` when it is not a regular file (any more). The copy's mode is the user's without the setuid,
/// setgid and sticky bits; its executable bit `exec` when given.
fn copy_file(
    workspace: &Dir,
    copy_root: &StateDir,
    copy: &Dir,
    rel: &Path,
    exec: Option<bool>,
) -> io::Result<Option<Stamp>> {
    let Some((source, meta)) = (match open_regular(workspace, rel) {
        Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(None),
        other => other?,
    }) else {
        return Ok(None);
    };
    if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
        copy_root.ensure_dir(parent)?;
    }
    let (dir, name) = parent_of(copy, rel, false)?;
    match dir.symlink_metadata(name) {
        Ok(meta) if meta.is_dir() => dir.remove_dir_all(name)?,
        Ok(_) => dir.remove_file(name)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut options = OpenOptions::new();
    options.write(true).create_new(true).custom_flags(libc::O_NOFOLLOW);
    let mut target = dir.open_with(name, &options)?;
    io::copy(&mut source.take(meta.len()), &mut target)?;
    let mut mode = meta.mode() & 0o777;
    if let Some(exec) = exec {
        mode = if exec { mode | ((mode & 0o444) >> 2) | 0o100 } else { mode & !0o111 };
    }
    target.set_permissions(Permissions::from_mode(mode))?;
    Ok(Some(Stamp::of(&target.metadata()?)))
}

/// Every path below `dir` but the `pruned` ones and what they hold (directories before what they hold), never
/// following a link.
pub(crate) fn walk(dir: &Dir, pruned: impl Fn(&Path, bool) -> bool) -> io::Result<Walked> {
    let mut out = Walked::default();
    let mut dirs = vec![PathBuf::new()];
    while let Some(current) = dirs.pop() {
        let entries = if current.as_os_str().is_empty() {
            dir.entries()
        } else {
            open_dir_nofollow(dir, &current, false).and_then(|opened| opened.entries())
        };
        let entries = match entries {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && !current.as_os_str().is_empty() => {
                tracing::warn!(path = %current.display(), "not walked for review: {e}");
                out.unreadable.push(current);
                continue;
            }
            // Replaced by a file or link meanwhile: what it held is gone.
            Err(e)
                if matches!(e.kind(), io::ErrorKind::NotADirectory | io::ErrorKind::NotFound)
                    && !current.as_os_str().is_empty() =>
            {
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
pub(crate) struct Walked {
    pub(crate) paths: Vec<PathBuf>,
    /// Directories it could not read: what they hold is neither seen nor gone.
    unreadable: Vec<PathBuf>,
}

/// Whether an ancestor of `rel` is already gone from `seen` (so `rel` went with it).
fn seen_parent_missing(rel: &Path, seen: &BTreeSet<PathBuf>) -> bool {
    rel.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()).any(|a| !seen.contains(a))
}

/// Removes the file, link or directory tree at `rel`, never following a link; a missing one is fine.
pub(crate) fn remove(dir: &Dir, rel: &Path) -> io::Result<()> {
    let (parent, name) = match parent_of(dir, rel, false) {
        Ok(found) => found,
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => return Ok(()),
        Err(e) => return Err(e),
    };
    let result = match parent.symlink_metadata(name) {
        Ok(meta) if meta.is_dir() => parent.remove_dir_all(name),
        Ok(_) => parent.remove_file(name),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Refuses a path that is not plainly inside the workspace.
pub(crate) fn check_relative(rel: &Path) -> io::Result<()> {
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

    fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that lives for the call.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
    }

    #[test]
    fn only_regular_files_are_read_never_through_a_link_nor_past_their_bound() {
        let (dir, copy, ws) = setup();
        let root = Dir::open_ambient_dir(&ws, ambient_authority()).unwrap();
        mkfifo(&ws.join("fifo"));
        let _socket = std::os::unix::net::UnixListener::bind(ws.join("socket")).unwrap();
        std::os::unix::fs::symlink(ws.join("b.txt"), ws.join("link")).unwrap();
        std::os::unix::fs::symlink(ws.join("src"), ws.join("src-link")).unwrap();
        let sparse = std::fs::File::create(ws.join("sparse")).unwrap();
        sparse.set_len(2 << 30).unwrap();
        std::fs::write(ws.join("just-over"), vec![b'a'; 11]).unwrap();
        let read = |rel: &str, limit: u64| read_regular(&root, Path::new(rel), limit).unwrap().0;
        assert_eq!(read("fifo", TEXT_LIMIT), Regular::NotRegular, "a FIFO is never opened for reading");
        assert_eq!(read("socket", TEXT_LIMIT), Regular::NotRegular);
        assert_eq!(read("link", TEXT_LIMIT), Regular::NotRegular);
        assert_eq!(read("src-link/a.txt", TEXT_LIMIT), Regular::Missing, "a link on the way is not followed");
        assert_eq!(read("sparse", TEXT_LIMIT), Regular::Large(2 << 30), "counted by its apparent size, unread");
        assert_eq!(read("just-over", 10), Regular::Large(11));
        assert_eq!(read("src/a.txt", TEXT_LIMIT), Regular::Bytes(b"a\n".to_vec()));
        // The user's special files are not copied either.
        copy.sync().unwrap();
        assert!(std::fs::symlink_metadata(copy.path().join("fifo")).is_err());
        assert!(std::fs::symlink_metadata(copy.path().join("socket")).is_err());
        drop(dir);
    }

    #[test]
    fn renames_exec_bits_and_specials_are_changes_and_held_ones_survive_a_sync() {
        use std::os::unix::fs::PermissionsExt as _;
        let (_dir, copy, ws) = setup();
        let root = copy.path();
        std::fs::rename(root.join("b.txt"), root.join("c.txt")).unwrap();
        std::fs::set_permissions(root.join("src/a.txt"), std::fs::Permissions::from_mode(0o4755)).unwrap();
        mkfifo(&root.join("pipe"));
        let changes = copy.changes().unwrap();
        assert_eq!(
            changes,
            vec![
                Change::Renamed { from: "b.txt".into(), path: "c.txt".into() },
                Change::Special { path: "pipe".into() },
                // The same bytes as the user's (the review settles it), and the bit.
                Change::Written { path: "src/a.txt".into(), bytes: b"a\n".to_vec(), new: false },
                Change::Exec { path: "src/a.txt".into(), set: true },
            ]
        );
        copy.hold(&changes, &changes).unwrap();
        assert_eq!(copy.unheld(&changes), vec![]);
        copy.sync().unwrap();
        assert_eq!(copy.changes().unwrap(), changes, "the sync keeps what is held back");
        assert!(!root.join("b.txt").exists());
        // The user changes the renamed file: the user's version is back in the copy.
        std::fs::write(ws.join("b.txt"), "the user's\n").unwrap();
        copy.hold(&[], &copy.changes().unwrap()).unwrap();
        copy.sync().unwrap();
        assert_eq!(std::fs::read_to_string(root.join("b.txt")).unwrap(), "the user's\n");
        // The only mode bit applied is the executable one.
        assert!(copy.apply(&Change::Exec { path: "src/a.txt".into(), set: true }).unwrap());
        assert_eq!(std::fs::metadata(ws.join("src/a.txt")).unwrap().permissions().mode() & 0o7777, 0o755);
    }

    #[test]
    fn nothing_is_applied_or_offered_through_a_link_in_the_workspace() {
        let (dir, copy, ws) = setup();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("bashrc"), "precious\n").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("d")).unwrap();
        std::os::unix::fs::symlink(outside.join("bashrc"), ws.join("f")).unwrap();
        std::os::unix::fs::symlink("src", ws.join("inner")).unwrap();
        for rel in ["d/bashrc", "f", "inner/a.txt"] {
            assert!(!copy.plain_in_workspace(Path::new(rel)), "{rel}");
            let write = Change::Written { path: rel.into(), bytes: b"evil\n".to_vec(), new: false };
            assert!(copy.apply(&write).is_err(), "{rel}");
        }
        assert!(copy.plain_in_workspace(Path::new("src/a.txt")) && copy.plain_in_workspace(Path::new("new/x")));
        assert_eq!(std::fs::read_to_string(outside.join("bashrc")).unwrap(), "precious\n");
        assert_eq!(std::fs::read_to_string(ws.join("src/a.txt")).unwrap(), "a\n", "not even inside the workspace");
        assert!(copy.apply(&Change::Deleted { path: "d/bashrc".into() }).is_err());
        assert!(outside.join("bashrc").exists());
    }
}
