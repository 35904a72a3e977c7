//! The ACP agent's `fs/read_text_file` and `fs/write_text_file`: a path outside the workspace and its other roots
//! is refused, a write into a protected path (`.git/hooks`, …) too. In a local sandbox the rest is done here, on the
//! folder the sandbox shows at that root, one component at a time by descriptor and never through a link: the check
//! and the open are one step, so a link the agent swaps in meanwhile leads nowhere, and what the sandbox hides is
//! answered as missing. In a remote sandbox it runs as a small command in the same sandbox as the agent.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use tokio::io::AsyncReadExt;

use crate::sandbox::local::policy::PROTECTED;
use crate::sandbox::{ExecSpec, HostFiles, Sandbox};
use crate::workspace::review::{open_regular, parent_of};

/// The largest file the agent may read through the bridge.
pub const READ_LIMIT: usize = 16 << 20;

/// How many of its requests run at once: each is a process in a remote sandbox or a blocking thread here, and an
/// agent that sends thousands at once must not start thousands (the others wait their turn).
const AT_ONCE: usize = 4;

/// What the agent's file requests may reach, and where they run.
pub struct Files {
    sandbox: Arc<dyn Sandbox>,
    /// The agent's command, whose sandbox settings the file commands share.
    template: ExecSpec,
    /// The workspace and its other roots, as the agent sees them.
    roots: Vec<PathBuf>,
    running: tokio::sync::Semaphore,
}

impl Files {
    /// Requests of an agent started with `template` in `sandbox`, whose roots are `roots` (the workspace first).
    pub fn new(sandbox: Arc<dyn Sandbox>, template: &ExecSpec, roots: Vec<PathBuf>) -> Self {
        let env = template.env.iter().filter(|(name, _)| name == "PATH" || name == "HOME").cloned().collect();
        let template = ExecSpec {
            program: PathBuf::from("/bin/sh"),
            env,
            cwd: template.cwd.clone(),
            read_only: template.read_only.clone(),
            tools: template.tools.clone(),
            ..ExecSpec::default()
        };
        Self { sandbox, template, roots, running: tokio::sync::Semaphore::new(AT_ONCE) }
    }

    /// The text of the file at `path` (from line `line`, 1-based, at most `limit` lines), or why not.
    pub async fn read(&self, path: &Path, line: Option<u32>, limit: Option<u32>) -> Result<String, String> {
        check(&self.roots, path, false)?;
        let bytes = match self.sandbox.host_files() {
            Some(host) => self.here(path, move |path| read_beneath(&host, path)).await?,
            None => {
                check_resolved(&self.roots, path, false)?;
                let script = format!("exec head -c {} -- \"$1\"", READ_LIMIT + 1);
                self.run(&script, path, Vec::new()).await?.0
            }
        };
        if bytes.len() > READ_LIMIT {
            return Err(format!("{} is larger than {} MiB", path.display(), READ_LIMIT >> 20));
        }
        let text = String::from_utf8_lossy(&bytes);
        Ok(select_lines(&text, line, limit))
    }

    /// Writes `content` at `path` (making its folder), or says why not.
    pub async fn write(&self, path: &Path, content: &str) -> Result<(), String> {
        check(&self.roots, path, true)?;
        match self.sandbox.host_files() {
            Some(host) => {
                let content = content.to_string();
                self.here(path, move |path| write_beneath(&host, path, content.as_bytes())).await
            }
            None => {
                check_resolved(&self.roots, path, true)?;
                let script = "mkdir -p -- \"$(dirname -- \"$1\")\" && exec cat > \"$1\"";
                self.run(script, path, content.as_bytes().to_vec()).await.map(|_| ())
            }
        }
    }

    /// Runs `work` on `path` on a blocking thread, as one of the requests that run at once.
    async fn here<T: Send + 'static>(
        &self,
        path: &Path,
        work: impl FnOnce(&Path) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let _turn = self.running.acquire().await.map_err(|e| e.to_string())?;
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || work(&path)).await.map_err(|e| e.to_string())?
    }

    /// Runs `script` with `path` as `$1` in the sandbox: its stdout (at most a byte past the read limit), or its
    /// error in words.
    async fn run(&self, script: &str, path: &Path, stdin: Vec<u8>) -> Result<(Vec<u8>, String), String> {
        let _turn = self.running.acquire().await.map_err(|e| e.to_string())?;
        let mut spec = self.template.clone();
        spec.args = vec!["-c".into(), script.into(), "sh".into(), path.display().to_string()];
        spec.stdin = stdin;
        let mut process = self.sandbox.exec(spec).await.map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        let mut err = Vec::new();
        let limit = (READ_LIMIT + 1) as u64;
        let (mut stdout, mut stderr) = ((&mut process.stdout).take(limit), (&mut process.stderr).take(64 << 10));
        let (read_out, read_err) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        read_out.map_err(|e| e.to_string())?;
        read_err.map_err(|e| e.to_string())?;
        let exit = process.handle.wait().await.map_err(|e| e.to_string())?;
        let stderr = String::from_utf8_lossy(&err).trim().to_string();
        if !exit.success() {
            // `head: cannot open '…' for reading: No such file or directory`: the tool's words name the path.
            let said = stderr.lines().last().unwrap_or("").trim().to_string();
            return Err(if said.is_empty() { format!("failed with {}", exit.describe()) } else { said });
        }
        Ok((out, stderr))
    }
}

/// The folder the sandbox shows at the root holding `path` (opened here) and `path` relative to it; `None` when
/// `path` is hidden in the sandbox or in no root ([`check`] said which, before).
fn beneath<'a>(host: &HostFiles, path: &'a Path) -> Result<Option<(Dir, &'a Path)>, String> {
    if host.hidden.iter().any(|hidden| path.starts_with(hidden)) {
        return Ok(None);
    }
    let Some((shown, rel)) = host.roots.iter().find_map(|(seen, shown)| Some((shown, path.strip_prefix(seen).ok()?)))
    else {
        return Ok(None);
    };
    if rel.as_os_str().is_empty() {
        return Err(format!("{} is a folder", path.display()));
    }
    let dir = Dir::open_ambient_dir(shown, ambient_authority())
        .map_err(|e| format!("{}: the folder it is in cannot be opened: {e}", path.display()))?;
    Ok(Some((dir, rel)))
}

/// The words for a path that is not there as a file the agent may open: the same for a missing one and a hidden
/// one, so that an answer never says more than the sandbox shows.
fn missing(path: &Path) -> String {
    format!("{} does not exist", path.display())
}

/// The words for a path that is a link, or goes through one: never followed, and its target never named.
fn linked(path: &Path) -> String {
    format!("{} is not a regular file, or a folder on its way is a link (links are never followed)", path.display())
}

/// Reads at most a byte past [`READ_LIMIT`] of the regular file at `path` in the sandbox's folders, never through a
/// link.
fn read_beneath(host: &HostFiles, path: &Path) -> Result<Vec<u8>, String> {
    let Some((dir, rel)) = beneath(host, path)? else { return Err(missing(path)) };
    let file = match open_regular(&dir, rel) {
        Ok(Some((file, _))) => file,
        Ok(None) => return Err(missing(path)),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => return Err(linked(path)),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut bytes = Vec::new();
    file.take(READ_LIMIT as u64 + 1).read_to_end(&mut bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(bytes)
}

/// Writes `content` at `path` in the sandbox's folders, making the folders on its way, never through a link and
/// never into what the sandbox shows read-only.
fn write_beneath(host: &HostFiles, path: &Path, content: &[u8]) -> Result<(), String> {
    if host.protected.iter().any(|protected| path.starts_with(protected)) {
        return Err(format!(
            "{} is protected: programs on your machine run or trust it, so the agent may not write it",
            path.display()
        ));
    }
    let Some((dir, rel)) = beneath(host, path)? else {
        return Err(format!("{} cannot be written here", path.display()));
    };
    let (dir, name) = parent_of(&dir, rel, true).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotADirectory => linked(path),
        _ => format!("{}: {e}", path.display()),
    })?;
    let mut options = OpenOptions::new();
    options.write(true).create(true).mode(0o644).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY);
    let mut file = dir.open_with(name, &options).map_err(|e| match e.raw_os_error() {
        // A link (ELOOP), a socket or a FIFO without a reader (ENXIO).
        Some(libc::ELOOP) | Some(libc::ENXIO) => linked(path),
        _ => format!("{}: {e}", path.display()),
    })?;
    let regular = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?.is_file();
    if !regular {
        return Err(linked(path));
    }
    file.set_len(0).and_then(|()| file.write_all(content)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Whether the agent may touch `path`: absolute, without `..`, inside one of `roots`, and (to write) outside the
/// protected paths of that root.
pub fn check(roots: &[PathBuf], path: &Path, writing: bool) -> Result<(), String> {
    if !path.is_absolute() || path.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
        return Err(format!("{} is not an absolute path without `..`", path.display()));
    }
    let Some((root, rel)) = roots.iter().find_map(|root| Some((root, path.strip_prefix(root).ok()?))) else {
        return Err(format!(
            "{} is outside the workspace{}: the agent's files are {}",
            path.display(),
            if roots.len() > 1 { " and its other roots" } else { "" },
            roots.iter().map(|root| root.display().to_string()).collect::<Vec<_>>().join(", ")
        ));
    };
    if writing {
        if rel.as_os_str().is_empty() {
            return Err(format!("{} is a folder", path.display()));
        }
        if let Some(protected) = PROTECTED.iter().find(|protected| rel.starts_with(protected)) {
            return Err(format!(
                "{} is protected ({protected} in {}): programs on your machine run or trust it, so the agent may not \
                 write it",
                path.display(),
                root.display()
            ));
        }
    }
    Ok(())
}

/// [`check`] again with the links on the way resolved, on this machine: a link in the workspace that leads out of
/// it (or into a protected path) is refused even where no sandbox would stop the command (`--sandbox none`). The
/// answer never names where the link leads: the agent may not know what is outside its files.
pub fn check_resolved(roots: &[PathBuf], path: &Path, writing: bool) -> Result<(), String> {
    let canonical: Vec<PathBuf> =
        roots.iter().map(|root| std::fs::canonicalize(root).unwrap_or_else(|_| root.clone())).collect();
    let Some(resolved) = resolve(path) else { return Ok(()) };
    check(&canonical, &resolved, writing).map_err(|_| {
        let what = if writing { "write" } else { "use" };
        format!("{} goes through a link to a path the agent may not {what}", path.display())
    })
}

/// `path` with the links of its longest existing part resolved, the rest as it is.
fn resolve(path: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    let mut existing = path;
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            return Some(rest.iter().rev().fold(real, |acc: PathBuf, name| acc.join(name)));
        }
        rest.push(existing.file_name()?.to_os_string());
        existing = existing.parent()?;
    }
}

/// Lines `line..line + limit` (1-based) of `text`, with their endings.
fn select_lines(text: &str, line: Option<u32>, limit: Option<u32>) -> String {
    if line.is_none() && limit.is_none() {
        return text.to_string();
    }
    let skip = line.map_or(0, |line| line.saturating_sub(1) as usize);
    let take = limit.map_or(usize::MAX, |limit| limit as usize);
    text.split_inclusive('\n').skip(skip).take(take).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn only_the_workspace_and_its_roots_are_reached_and_protected_paths_are_not_written() {
        let roots = vec![PathBuf::from("/w/project"), PathBuf::from("/w/other")];
        assert_eq!(check(&roots, Path::new("/w/project/src/a.rs"), true), Ok(()));
        assert_eq!(check(&roots, Path::new("/w/other/b.txt"), true), Ok(()));
        assert_eq!(check(&roots, Path::new("/w/project/.git/hooks"), false), Ok(()));
        assert_eq!(
            check(&roots, Path::new("/home/me/.ssh/id_ed25519"), false),
            Err("/home/me/.ssh/id_ed25519 is outside the workspace and its other roots: the agent's files are \
                 /w/project, /w/other"
                .to_string())
        );
        assert_eq!(
            check(&roots, Path::new("/w/project/../../home/me/.bashrc"), true),
            Err("/w/project/../../home/me/.bashrc is not an absolute path without `..`".to_string())
        );
        assert_eq!(
            check(&roots, Path::new("a.txt"), false),
            Err("a.txt is not an absolute path without `..`".to_string())
        );
        assert_eq!(
            check(&roots, Path::new("/w/project/.git/hooks/pre-commit"), true),
            Err("/w/project/.git/hooks/pre-commit is protected (.git/hooks in /w/project): programs on your machine \
                 run or trust it, so the agent may not write it"
                .to_string())
        );
        assert_eq!(check(&roots, Path::new("/w/project"), true), Err("/w/project is a folder".to_string()));
        // A name that only begins like a protected one is the agent's.
        assert_eq!(check(&roots, Path::new("/w/project/.git/hooks-notes.txt"), true), Ok(()));
    }

    #[test]
    fn a_link_that_leads_out_of_the_workspace_or_into_a_protected_path_is_refused_without_naming_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let (ws, outside) = (dir.path().join("ws"), dir.path().join("outside"));
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("out")).unwrap();
        std::os::unix::fs::symlink(ws.join(".git/hooks"), ws.join("hooks")).unwrap();
        let roots = vec![ws.clone()];
        assert_eq!(check_resolved(&roots, &ws.join("new/file.txt"), true), Ok(()));
        assert_eq!(
            check_resolved(&roots, &ws.join("out/secret"), false),
            Err(format!("{} goes through a link to a path the agent may not use", ws.join("out/secret").display()))
        );
        assert_eq!(
            check_resolved(&roots, &ws.join("hooks/pre-commit"), true),
            Err(format!(
                "{} goes through a link to a path the agent may not write",
                ws.join("hooks/pre-commit").display()
            ))
        );
        assert_eq!(check_resolved(&roots, &ws.join("hooks/pre-commit"), false), Ok(()));
    }

    /// A workspace `ws` (seen by the agent at `/seen/ws`) with a file, a link out, a folder link out, a hidden
    /// folder and a protected one.
    fn host_files() -> (tempfile::TempDir, HostFiles) {
        let dir = tempfile::tempdir().unwrap();
        let (ws, outside) = (dir.path().join("ws"), dir.path().join("outside"));
        std::fs::create_dir_all(ws.join("secret")).unwrap();
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(ws.join("notes.txt"), "inside\n").unwrap();
        std::fs::write(ws.join("secret/key"), "hidden").unwrap();
        std::fs::write(outside.join("data"), "OUTSIDE").unwrap();
        std::os::unix::fs::symlink(outside.join("data"), ws.join("link")).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("dirlink")).unwrap();
        let seen = PathBuf::from("/seen/ws");
        let host = HostFiles {
            roots: vec![(seen.clone(), ws)],
            hidden: vec![seen.join("secret")],
            protected: vec![seen.join(".git/hooks")],
        };
        (dir, host)
    }

    #[test]
    fn here_a_file_is_reached_by_descriptor_never_through_a_link_and_what_is_hidden_is_missing() {
        let (dir, host) = host_files();
        let seen = Path::new("/seen/ws");
        assert_eq!(read_beneath(&host, &seen.join("notes.txt")), Ok(b"inside\n".to_vec()));
        assert_eq!(read_beneath(&host, &seen.join("link")), Err(linked(&seen.join("link"))));
        assert_eq!(read_beneath(&host, &seen.join("dirlink/data")), Err(missing(&seen.join("dirlink/data"))));
        assert_eq!(read_beneath(&host, &seen.join("secret/key")), Err(missing(&seen.join("secret/key"))));
        assert_eq!(read_beneath(&host, &seen.join("nothing")), Err(missing(&seen.join("nothing"))));
        assert_eq!(read_beneath(&host, seen), Err("/seen/ws is a folder".to_string()));

        assert_eq!(write_beneath(&host, &seen.join("new/dir/file.txt"), b"made"), Ok(()));
        let ws = dir.path().join("ws");
        assert_eq!(std::fs::read_to_string(ws.join("new/dir/file.txt")).unwrap(), "made");
        assert_eq!(write_beneath(&host, &seen.join("notes.txt"), b"x"), Ok(()));
        assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "x", "replaced, not appended");
        assert_eq!(write_beneath(&host, &seen.join("link"), b"x"), Err(linked(&seen.join("link"))));
        assert_eq!(write_beneath(&host, &seen.join("dirlink/new"), b"x"), Err(linked(&seen.join("dirlink/new"))));
        assert_eq!(
            write_beneath(&host, &seen.join("secret/key"), b"x"),
            Err("/seen/ws/secret/key cannot be written here".to_string())
        );
        assert_eq!(
            write_beneath(&host, &seen.join(".git/hooks/pre-commit"), b"x"),
            Err("/seen/ws/.git/hooks/pre-commit is protected: programs on your machine run or trust it, so the \
                 agent may not write it"
                .to_string())
        );
        // Nothing reached the outside or the hidden folder.
        assert_eq!(std::fs::read_to_string(dir.path().join("outside/data")).unwrap(), "OUTSIDE");
        assert!(!dir.path().join("outside/new").exists());
        assert_eq!(std::fs::read_to_string(ws.join("secret/key")).unwrap(), "hidden");
    }

    #[test]
    fn a_read_can_start_at_a_line_and_stop_after_some() {
        let text = "one\ntwo\nthree\nfour";
        assert_eq!(select_lines(text, None, None), text);
        assert_eq!(select_lines(text, Some(2), Some(2)), "two\nthree\n");
        assert_eq!(select_lines(text, Some(3), None), "three\nfour");
        assert_eq!(select_lines(text, None, Some(1)), "one\n");
        assert_eq!(select_lines(text, Some(9), None), "");
    }
}
