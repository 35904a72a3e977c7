//! The ACP agent's `fs/read_text_file` and `fs/write_text_file`, answered inside the session's sandbox: a path
//! outside the workspace and its other roots is refused, a write into a protected path (`.git/hooks`, …) too, and
//! what is left runs as a small command in the same sandbox as the agent, so that it sees exactly what the agent
//! would (its hidden secrets hidden, its read-only mounts read-only) and a link cannot lead the bridge elsewhere.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use tokio::io::AsyncReadExt;

use crate::sandbox::local::policy::PROTECTED;
use crate::sandbox::{ExecSpec, Sandbox};

/// The largest file the agent may read through the bridge.
pub const READ_LIMIT: usize = 16 << 20;

/// How many of its requests run at once: each is a process in the sandbox, and an agent that sends thousands at
/// once must not start thousands (the others wait their turn).
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
        check_resolved(&self.roots, path, false)?;
        let script = format!("exec head -c {} -- \"$1\"", READ_LIMIT + 1);
        let (bytes, _) = self.run(&script, path, Vec::new()).await?;
        if bytes.len() > READ_LIMIT {
            return Err(format!("{} is larger than {} MiB", path.display(), READ_LIMIT >> 20));
        }
        let text = String::from_utf8_lossy(&bytes);
        Ok(select_lines(&text, line, limit))
    }

    /// Writes `content` at `path` (making its folder), or says why not.
    pub async fn write(&self, path: &Path, content: &str) -> Result<(), String> {
        check(&self.roots, path, true)?;
        check_resolved(&self.roots, path, true)?;
        let script = "mkdir -p -- \"$(dirname -- \"$1\")\" && exec cat > \"$1\"";
        self.run(script, path, content.as_bytes().to_vec()).await.map(|_| ())
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
/// it (or into a protected path) is refused even where no sandbox would stop the command (`--sandbox none`).
pub fn check_resolved(roots: &[PathBuf], path: &Path, writing: bool) -> Result<(), String> {
    let canonical: Vec<PathBuf> =
        roots.iter().map(|root| std::fs::canonicalize(root).unwrap_or_else(|_| root.clone())).collect();
    let Some(resolved) = resolve(path) else { return Ok(()) };
    check(&canonical, &resolved, writing)
        .map_err(|why| format!("{} leads to {}: {why}", path.display(), resolved.display()))
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
    fn a_link_that_leads_out_of_the_workspace_or_into_a_protected_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (ws, outside) = (dir.path().join("ws"), dir.path().join("outside"));
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("out")).unwrap();
        std::os::unix::fs::symlink(ws.join(".git/hooks"), ws.join("hooks")).unwrap();
        let roots = vec![ws.clone()];
        let real = |path: &Path| std::fs::canonicalize(path).unwrap();
        assert_eq!(check_resolved(&roots, &ws.join("new/file.txt"), true), Ok(()));
        assert_eq!(
            check_resolved(&roots, &ws.join("out/secret"), false),
            Err(format!(
                "{} leads to {}: {} is outside the workspace: the agent's files are {}",
                ws.join("out/secret").display(),
                real(&outside).join("secret").display(),
                real(&outside).join("secret").display(),
                real(&ws).display()
            ))
        );
        let hook = real(&ws).join(".git/hooks/pre-commit");
        assert_eq!(
            check_resolved(&roots, &ws.join("hooks/pre-commit"), true),
            Err(format!(
                "{} leads to {}: {} is protected (.git/hooks in {}): programs on your machine run or trust it, so \
                 the agent may not write it",
                ws.join("hooks/pre-commit").display(),
                hook.display(),
                hook.display(),
                real(&ws).display()
            ))
        );
        assert_eq!(check_resolved(&roots, &ws.join("hooks/pre-commit"), false), Ok(()));
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
