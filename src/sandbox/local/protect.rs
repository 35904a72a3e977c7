//! Protected paths that do not exist when a sandbox starts: never mounted (bubblewrap would make their mount points
//! in the user's workspace, and a SIGKILLed bridge leaves them there), but watched while the sandbox runs and moved
//! out of the workspace, into the session's quarantine, as soon as something creates one.
//!
//! A command's [`Watch`] holds an inotify watch on the workspace and on every existing directory on the way to a
//! missing protected path (the git dir, a `--protect` path's parents); each event, and each [`sweep`] the turn
//! asks for after a tool and at its end (which covers an overflowed queue), looks at every missing path again.
//! Whatever is found is renamed away from the directory that holds it, opened name by name without following a
//! link (`openat` with `O_NOFOLLOW`, then `cap-std`): a link is moved as a link, never followed. What was moved is
//! kept per workspace until the turn's next sweep says so in the thread.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::io;
#[cfg(linux_sandbox)]
use std::os::fd::RawFd;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt};
#[cfg(linux_sandbox)]
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
#[cfg(linux_sandbox)]
use tokio::io::unix::AsyncFd;

use crate::workspace::statedir::StateDir;

/// The session's quarantine, in its state dir: hidden from the sandbox under bubblewrap.
pub const QUARANTINE: &str = "quarantine";

/// A protected path something created in the workspace while a sandbox ran, and where it went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    /// Where it was created (absolute, in the workspace).
    pub path: PathBuf,
    /// Where it is now, or why it could not be moved.
    pub outcome: Result<PathBuf, String>,
}

/// What one command guards: the protected paths missing when it started, and the quarantine of its session.
#[derive(Clone, Debug)]
struct Guard {
    workspace: PathBuf,
    missing: Vec<PathBuf>,
    state_dir: PathBuf,
}

/// The guards of one workspace and what they moved that no turn reported yet.
#[derive(Default)]
struct Guarded {
    running: HashMap<u64, Guard>,
    /// The guard of the command that ended last: the end of its turn still sweeps with it.
    last: Option<Guard>,
    moved: Vec<Moved>,
}

fn guarded() -> MutexGuard<'static, HashMap<PathBuf, Guarded>> {
    static GUARDED: OnceLock<Mutex<HashMap<PathBuf, Guarded>>> = OnceLock::new();
    GUARDED.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// Guards the missing protected paths of a workspace for as long as one command lives.
pub struct Watch {
    id: u64,
    workspace: PathBuf,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Watch {
    /// Starts guarding `missing` (absolute paths in `workspace`) for one command of the session whose state dir
    /// is `state_dir`. Only what does not exist even as a link is guarded: what is there is the user's.
    pub fn start(workspace: &Path, mut missing: Vec<PathBuf>, state_dir: &Path) -> Watch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        missing.retain(|path| std::fs::symlink_metadata(path).is_err());
        let guard = Guard { workspace: workspace.to_path_buf(), missing, state_dir: state_dir.to_path_buf() };
        {
            let mut all = guarded();
            let entry = all.entry(guard.workspace.clone()).or_default();
            entry.last = None;
            entry.running.insert(id, guard.clone());
        }
        #[cfg(linux_sandbox)]
        let task = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(inotify) if !guard.missing.is_empty() => Some(tokio::spawn(watch(inotify, guard))),
            Ok(_) => None,
            Err(e) => {
                // The sweeps after each tool and at the end of the turn still move what was created.
                tracing::warn!(workspace = %workspace.display(), "cannot watch the protected paths: {e}");
                None
            }
        };
        // Off Linux no inotify: the sweeps after each tool and at the end of the turn move what was created.
        #[cfg(not(linux_sandbox))]
        let task = None;
        Watch { id, workspace: workspace.to_path_buf(), task }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let mut all = guarded();
        if let Some(entry) = all.get_mut(&self.workspace)
            && let Some(guard) = entry.running.remove(&self.id)
        {
            entry.last = Some(guard);
        }
    }
}

/// Sweeps `workspace` now with the guards of its running commands (or of the one that ended last) and returns
/// what was moved since the last call, this sweep's and the watches' alike.
pub fn sweep(workspace: &Path) -> Vec<Moved> {
    let guards: Vec<Guard> = {
        let all = guarded();
        let Some(entry) = all.get(workspace) else { return Vec::new() };
        entry.running.values().chain(entry.last.iter()).cloned().collect()
    };
    // A watch's sweep still under way (its command just ended) finishes first, so its moves are in this answer.
    let _one = one_sweep_at_a_time();
    for guard in &guards {
        record(guard, sweep_once(guard));
    }
    let mut all = guarded();
    all.get_mut(workspace).map(|entry| std::mem::take(&mut entry.moved)).unwrap_or_default()
}

/// Held while a sweep moves and records: a sweep that answers what was moved never misses one still being moved.
fn one_sweep_at_a_time() -> MutexGuard<'static, ()> {
    static SWEEPING: Mutex<()> = Mutex::new(());
    SWEEPING.lock().unwrap_or_else(|p| p.into_inner())
}

fn record(guard: &Guard, moved: Vec<Moved>) {
    for item in &moved {
        match &item.outcome {
            Ok(to) => tracing::warn!(from = %item.path.display(), to = %to.display(), "moved a created protected path"),
            Err(e) => tracing::warn!(path = %item.path.display(), "cannot move a created protected path: {e}"),
        }
    }
    if !moved.is_empty() {
        guarded().entry(guard.workspace.clone()).or_default().moved.extend(moved);
    }
}

/// The inotify fd, readable through tokio.
#[cfg(linux_sandbox)]
struct WatchFd(Inotify);

#[cfg(linux_sandbox)]
impl AsRawFd for WatchFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

#[cfg(linux_sandbox)]
async fn watch(inotify: Inotify, guard: Guard) {
    // SAFETY: the inotify fd is owned by the `WatchFd` inside the `AsyncFd` and lives exactly as long as it.
    let fd = match unsafe { AsyncFd::register_with_interest(WatchFd(inotify), tokio::io::Interest::READABLE) } {
        Ok(fd) => fd,
        Err(e) => {
            let e = io::Error::from(e);
            tracing::warn!(workspace = %guard.workspace.display(), "cannot watch the protected paths: {e}");
            return;
        }
    };
    let mut watched: HashMap<PathBuf, WatchDescriptor> = HashMap::new();
    let mask = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ONLYDIR
        | AddWatchFlags::IN_DONT_FOLLOW;
    loop {
        // Watches first, then the sweep: what was made before a directory was watched is found by the sweep.
        for dir in dirs_to_watch(&guard) {
            // The workspace may be reached through a link of the user's; below it nothing is followed.
            let mask = if dir == guard.workspace { mask - AddWatchFlags::IN_DONT_FOLLOW } else { mask };
            match fd.get_ref().0.add_watch(&dir, mask) {
                Ok(wd) => {
                    // A directory replaced by another: the old one's watch goes, so that replacing it in a loop
                    // cannot use up the user's inotify watches.
                    if let Some(old) = watched.insert(dir, wd)
                        && old != wd
                    {
                        let _ = fd.get_ref().0.rm_watch(old);
                    }
                }
                Err(e) => tracing::debug!(dir = %dir.display(), "cannot watch: {e}"),
            }
        }
        // Moved and recorded in one go: this task is aborted when its command ends, and what a sweep moved must
        // reach the turn's note even then.
        let sweeping = guard.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || {
            let _one = one_sweep_at_a_time();
            record(&sweeping, sweep_once(&sweeping));
        })
        .await
        {
            tracing::warn!("the sweep of protected paths failed: {e}");
        }
        loop {
            let Ok(mut ready) = fd.readable().await else { return };
            match ready.try_io(|inner| inner.get_ref().0.read_events().map_err(io::Error::from)) {
                // Any event (an overflowed queue too) means: look again.
                Ok(Ok(_)) => break,
                Ok(Err(e)) => {
                    tracing::warn!(workspace = %guard.workspace.display(), "watching the protected paths ended: {e}");
                    return;
                }
                Err(_would_block) => continue,
            }
        }
    }
}

/// The workspace and every real directory on the way to a missing protected path.
#[cfg(linux_sandbox)]
fn dirs_to_watch(guard: &Guard) -> Vec<PathBuf> {
    let mut dirs = vec![guard.workspace.clone()];
    for path in &guard.missing {
        let Some(names) = names_below(path, &guard.workspace) else { continue };
        let mut current = guard.workspace.clone();
        for name in &names[..names.len().saturating_sub(1)] {
            current.push(name);
            if !std::fs::symlink_metadata(&current).is_ok_and(|meta| meta.is_dir()) {
                break;
            }
            dirs.push(current.clone());
        }
    }
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The plain names of `path` below `root`, or `None` when it is not plainly below it.
fn names_below<'a>(path: &'a Path, root: &Path) -> Option<Vec<&'a OsStr>> {
    let rel = path.strip_prefix(root).ok()?;
    let names: Option<Vec<&OsStr>> =
        rel.components().map(|c| if let Component::Normal(name) = c { Some(name) } else { None }).collect();
    names.filter(|names| !names.is_empty())
}

/// Moves what now exists of the guard's missing paths out of the workspace: the protected path itself, or the
/// first thing on the way to it that is not a real directory (a `.git` file naming another git dir, a link).
fn sweep_once(guard: &Guard) -> Vec<Moved> {
    // One sweep at a time: a watch's and a turn's would otherwise both find the same path, and one of them fail.
    static SWEEPING: Mutex<()> = Mutex::new(());
    let _one = SWEEPING.lock().unwrap_or_else(|p| p.into_inner());
    let mut moved = Vec::new();
    let Ok(root) = Dir::open_ambient_dir(&guard.workspace, ambient_authority()) else { return moved };
    let stamp = format!(
        "{}-{}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0),
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    );
    for path in &guard.missing {
        let Some(names) = names_below(path, &guard.workspace) else { continue };
        let Ok(mut dir) = root.try_clone() else { continue };
        for (i, name) in names.iter().enumerate() {
            let Ok(meta) = dir.symlink_metadata(name) else { break };
            let last = i + 1 == names.len();
            if !last && meta.is_dir() {
                match open_dir_nofollow(&dir, name) {
                    Ok(next) => {
                        dir = next;
                        continue;
                    }
                    Err(_) => break,
                }
            }
            let rel: PathBuf = names[..=i].iter().collect();
            let outcome = match quarantine(&dir, name, &rel, &guard.state_dir, &stamp) {
                Ok(to) => Ok(to),
                // Gone meanwhile (another sweep of the workspace moved it, or its maker removed it).
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) => Err(e.to_string()),
            };
            moved.push(Moved { path: guard.workspace.join(&rel), outcome });
            break;
        }
    }
    moved
}

/// Moves `name` of `dir` (at `rel` in the workspace) to `<state>/quarantine/<stamp>/<rel>`; across filesystems it
/// is copied (regular files, links and directories, as far as they can be read; nothing else) and removed.
fn quarantine(dir: &Dir, name: &OsStr, rel: &Path, state_dir: &Path, stamp: &str) -> io::Result<PathBuf> {
    let state = StateDir::open(state_dir)?;
    let dest = Path::new(QUARANTINE).join(stamp).join(rel);
    let parent = dest.parent().unwrap_or(Path::new(QUARANTINE));
    let to = state.open_dir(parent)?;
    match dir.rename(name, &to, name) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            // What cannot be copied is lost rather than left where a program of the user's would trust it.
            if let Err(e) = copy_out(dir, name, &to) {
                tracing::warn!(path = %rel.display(), "not all of it reached the quarantine: {e}");
            }
            if dir.symlink_metadata(name)?.is_dir() {
                dir.remove_dir_all(name)?;
            } else {
                dir.remove_file(name)?;
            }
        }
        Err(e) => return Err(e),
    }
    Ok(state_dir.join(dest))
}

fn copy_out(from: &Dir, name: &OsStr, to: &Dir) -> io::Result<()> {
    let meta = from.symlink_metadata(name)?;
    if meta.is_symlink() {
        to.symlink_contents(from.read_link_contents(name)?, name)
    } else if meta.is_dir() {
        to.create_dir(name)?;
        let (inner_from, inner_to) = (open_dir_nofollow(from, name)?, open_dir_nofollow(to, name)?);
        let mut failed = Ok(());
        for entry in inner_from.entries()? {
            if let Err(e) = copy_out(&inner_from, &entry?.file_name(), &inner_to) {
                failed = Err(e);
            }
        }
        failed
    } else if meta.is_file() {
        let mut source = from.open(name)?;
        let mut target = to.create(name)?;
        io::copy(&mut source, &mut target).map(|_| ())
    } else {
        Ok(())
    }
}

/// Opens the directory `name` of `dir`, refusing a link in its place.
fn open_dir_nofollow(dir: &Dir, name: &OsStr) -> io::Result<Dir> {
    let name = CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let at: BorrowedFd<'_> = dir.as_fd();
    // SAFETY: `at` is an open directory fd and `name` a NUL-terminated string; the fd returned is owned by the
    // `File` it is wrapped in at once.
    let fd = unsafe {
        libc::openat(
            at.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(Dir::from_std_file(unsafe { std::fs::File::from_raw_fd(fd) }))
}

/// Removes what an older bridge left of its mount points at protected paths of `workspace` (it made them there for
/// missing paths, and a SIGKILL kept them), returning what it removed. Only what is provably such a mount point
/// goes: bubblewrap made a file's as an empty file with no write bit (`0444` less the umask), which nobody keeps
/// as their own `.envrc`, and a directory's as an empty directory in the same instant as the others of that
/// sandbox; so an empty directory goes only when another such leftover was made within a second of it (a user's
/// own empty `.vscode` made by itself stays).
pub fn clear_old_placeholders(workspace: &Path, protected: &[PathBuf]) -> Vec<PathBuf> {
    let Ok(root) = Dir::open_ambient_dir(workspace, ambient_authority()) else { return Vec::new() };
    let uid = nix::unistd::geteuid().as_raw();
    // Candidate -> (a file, its ctime in nanoseconds).
    let mut candidates: BTreeMap<PathBuf, (bool, i128)> = BTreeMap::new();
    for path in protected {
        let Some(names) = names_below(path, workspace) else { continue };
        let Ok(mut dir) = root.try_clone() else { continue };
        let mut rel = PathBuf::new();
        for name in names {
            rel.push(name);
            let Ok(meta) = dir.symlink_metadata(name) else { break };
            let ctime = i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec());
            if meta.is_file() {
                if meta.len() == 0 && meta.mode() & 0o333 == 0 && meta.nlink() == 1 && meta.uid() == uid {
                    candidates.insert(rel.clone(), (true, ctime));
                }
                break;
            }
            if !meta.is_dir() {
                break;
            }
            let Ok(inner) = open_dir_nofollow(&dir, name) else { break };
            if inner.entries().is_ok_and(|mut entries| entries.next().is_none()) {
                if meta.uid() == uid {
                    candidates.insert(rel.clone(), (false, ctime));
                }
                break;
            }
            dir = inner;
        }
    }
    let made_with_another = |rel: &Path, ctime: i128| {
        candidates.iter().any(|(other, (_, time))| other != rel && (time - ctime).abs() <= 1_000_000_000)
    };
    let mut removed = Vec::new();
    for (rel, (file, ctime)) in candidates.iter().rev() {
        let gone = if *file {
            root.remove_file(rel).is_ok()
        } else {
            made_with_another(rel, *ctime) && root.remove_dir(rel).is_ok()
        };
        if gone {
            tracing::info!(path = %workspace.join(rel).display(), "removed an older version's mount point");
            removed.push(workspace.join(rel));
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn guard(dir: &Path, missing: &[&str]) -> Guard {
        let workspace = dir.join("ws");
        std::fs::create_dir_all(workspace.join(".git")).unwrap();
        std::fs::create_dir_all(dir.join("state")).unwrap();
        Guard {
            missing: missing.iter().map(|rel| workspace.join(rel)).collect(),
            workspace,
            state_dir: dir.join("state"),
        }
    }

    #[test]
    fn what_is_created_at_a_missing_protected_path_is_moved_whole_and_links_are_moved_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let guard = guard(dir.path(), &[".envrc", ".vscode", ".git/hooks", ".git/config", "tools/hooks"]);
        let ws = &guard.workspace;
        std::fs::write(ws.join(".envrc"), "export X=1\n").unwrap();
        std::fs::create_dir_all(ws.join(".vscode")).unwrap();
        std::fs::write(ws.join(".vscode/tasks.json"), "{}").unwrap();
        std::fs::create_dir_all(ws.join("outside")).unwrap();
        std::fs::write(ws.join("outside/keep"), "kept").unwrap();
        std::os::unix::fs::symlink(ws.join("outside"), ws.join(".git/hooks")).unwrap();
        // A file where a directory of the path is expected: it is what is moved.
        std::fs::write(ws.join("tools"), "not a directory").unwrap();
        let moved = sweep_once(&guard);
        let paths: Vec<&Path> = moved.iter().map(|m| m.path.strip_prefix(ws).unwrap()).collect();
        assert_eq!(paths, [Path::new(".envrc"), Path::new(".vscode"), Path::new(".git/hooks"), Path::new("tools")]);
        for m in &moved {
            let to = m.outcome.as_ref().unwrap();
            assert!(to.starts_with(dir.path().join("state/quarantine")), "{to:?}");
            assert!(std::fs::symlink_metadata(&m.path).is_err(), "{:?} is still there", m.path);
        }
        let hooks = moved[2].outcome.as_ref().unwrap();
        assert!(std::fs::symlink_metadata(hooks).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(ws.join("outside/keep")).unwrap(), "kept");
        assert_eq!(std::fs::read_to_string(moved[1].outcome.as_ref().unwrap().join("tasks.json")).unwrap(), "{}");
        assert_eq!(sweep_once(&guard), Vec::new(), "a second sweep finds nothing");
    }

    #[test]
    fn across_filesystems_what_was_created_is_copied_into_the_quarantine_and_removed() {
        // The state dir on another filesystem than the workspace: /dev/shm is a tmpfs where it exists.
        let shm = Path::new("/dev/shm");
        let dir = tempfile::tempdir().unwrap();
        let Ok(state) = tempfile::tempdir_in(shm) else { return };
        use std::os::unix::fs::MetadataExt as _;
        if std::fs::metadata(shm).unwrap().dev() == std::fs::metadata(dir.path()).unwrap().dev() {
            return;
        }
        let mut guard = guard(dir.path(), &[".vscode", ".envrc"]);
        guard.state_dir = state.path().to_path_buf();
        let ws = guard.workspace.clone();
        std::fs::create_dir_all(ws.join(".vscode/sub")).unwrap();
        std::fs::write(ws.join(".vscode/sub/tasks.json"), "{}").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.join(".vscode/link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.join(".envrc")).unwrap();
        let moved = sweep_once(&guard);
        assert_eq!(moved.len(), 2, "{moved:?}");
        let vscode = moved[0].outcome.as_ref().unwrap();
        assert_eq!(std::fs::read_to_string(vscode.join("sub/tasks.json")).unwrap(), "{}");
        assert_eq!(std::fs::read_link(vscode.join("link")).unwrap(), Path::new("/etc/passwd"));
        assert_eq!(std::fs::read_link(moved[1].outcome.as_ref().unwrap()).unwrap(), Path::new("/etc/passwd"));
        assert!(!ws.join(".vscode").exists() && std::fs::symlink_metadata(ws.join(".envrc")).is_err());
    }

    #[test]
    fn only_provable_mount_points_of_an_older_version_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        let protected: Vec<PathBuf> =
            [".envrc", ".gitmodules", ".vscode", ".idea", ".git/hooks"].iter().map(|rel| ws.join(rel)).collect();
        // What bubblewrap made: an empty read-only file and empty directories, all at once.
        std::fs::write(ws.join(".envrc"), "").unwrap();
        std::fs::set_permissions(ws.join(".envrc"), std::fs::Permissions::from_mode(0o444)).unwrap();
        std::fs::create_dir(ws.join(".vscode")).unwrap();
        std::fs::create_dir(ws.join(".git/hooks")).unwrap();
        // The user's own: an empty but writable file, a directory with content.
        std::fs::write(ws.join(".gitmodules"), "").unwrap();
        std::fs::create_dir(ws.join(".idea")).unwrap();
        std::fs::write(ws.join(".idea/x.xml"), "<x/>").unwrap();
        let mut removed = clear_old_placeholders(&ws, &protected);
        removed.sort();
        assert_eq!(removed, [ws.join(".envrc"), ws.join(".git/hooks"), ws.join(".vscode")]);
        assert!(ws.join(".gitmodules").is_file() && ws.join(".idea/x.xml").is_file());

        // A lone empty directory is the user's: nothing made with it tells it from one they made.
        let other = dir.path().join("other");
        std::fs::create_dir_all(other.join(".vscode")).unwrap();
        assert_eq!(
            clear_old_placeholders(&other, &[other.join(".vscode"), other.join(".envrc")]),
            Vec::<PathBuf>::new()
        );
        assert!(other.join(".vscode").is_dir());
    }
}
