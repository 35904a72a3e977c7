//! The local sandbox: bubblewrap where it works, a plain process group otherwise.
//!
//! Each session owns a state dir under the data dir (the CLI's HOME and XDG dirs); its id is that path.
//! Under bubblewrap the root is read-only, `/tmp` is private, only the workspace and the state dir are
//! writable, the CLI gets its own PID namespace (killing bubblewrap ends the whole tree) and dies with the
//! bridge. Without bubblewrap the CLI runs in its own process group and is killed with every descendant,
//! including those that started their own session (OpenCode's bash tool does).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use super::{ExecSpec, ExitInfo, ProcessHandle, RunningProcess, Sandbox, SandboxError, SandboxProvider, SandboxSpec};
use crate::config::SandboxChoice;

/// How the local provider isolates commands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// bubblewrap at this path.
    Bwrap(PathBuf),
    /// A plain process group; the string says why there is no bubblewrap.
    None(String),
}

impl Isolation {
    /// Decides the isolation for a sandbox choice, probing bubblewrap once per process.
    pub fn resolve(choice: SandboxChoice) -> Result<Self, SandboxError> {
        match choice {
            SandboxChoice::None => Ok(Isolation::None("--sandbox none was given".into())),
            SandboxChoice::Bwrap => match probe_bwrap() {
                Ok(path) => Ok(Isolation::Bwrap(path)),
                Err(why) => Err(SandboxError::Unavailable(format!("--sandbox bwrap cannot work here: {why}"))),
            },
            SandboxChoice::Auto => Ok(match probe_bwrap() {
                Ok(path) => Isolation::Bwrap(path),
                Err(why) => Isolation::None(why),
            }),
        }
    }

    /// One line for logs and `doctor`.
    pub fn describe(&self) -> String {
        match self {
            Isolation::Bwrap(path) => format!(
                "bubblewrap ({}): read-only root, private /tmp, writable workspace and session state, own PID namespace",
                path.display()
            ),
            Isolation::None(why) => format!("plain process group, NO isolation ({why})"),
        }
    }
}

/// Checks once whether bubblewrap can create its namespaces here; the answer is cached.
pub fn probe_bwrap() -> Result<PathBuf, String> {
    static PROBE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let path = which::which("bwrap").map_err(|_| "bubblewrap (bwrap) is not installed".to_string())?;
            let output = std::process::Command::new(&path)
                .args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid"])
                .args(["--die-with-parent", "--", "true"])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
            if output.status.success() {
                Ok(path)
            } else {
                let stderr = String::from_utf8_lossy(&output.stderr);
                Err(format!("bubblewrap cannot create namespaces here: {}", stderr.trim()))
            }
        })
        .clone()
}

/// Sandboxes that are folders under the data dir.
pub struct LocalProvider {
    sessions_dir: PathBuf,
    isolation: Isolation,
}

impl LocalProvider {
    /// A provider keeping state dirs under `sessions_dir`.
    pub fn new(sessions_dir: PathBuf, isolation: Isolation) -> Self {
        Self { sessions_dir, isolation }
    }

    fn state_dir(&self, session_id: &str) -> PathBuf {
        self.sessions_dir.join(session_id)
    }
}

#[async_trait]
impl SandboxProvider for LocalProvider {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<String, SandboxError> {
        let dir = self.state_dir(&spec.session_id);
        for sub in ["home", "config", "data", "cache", "state"] {
            let path = dir.join(sub);
            tokio::fs::create_dir_all(&path)
                .await
                .map_err(|e| SandboxError::io(format!("create {}", path.display()), e))?;
        }
        Ok(dir.display().to_string())
    }

    async fn connect(&self, id: &str, spec: &SandboxSpec) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        let state_dir = PathBuf::from(id);
        if !state_dir.join("home").is_dir() {
            return Ok(None);
        }
        Ok(Some(Arc::new(LocalSandbox {
            state_dir,
            workspace: spec.workspace.clone(),
            isolation: self.isolation.clone(),
        })))
    }

    async fn suspend(&self, _id: &str) -> Result<(), SandboxError> {
        // Nothing runs between turns locally.
        Ok(())
    }

    async fn destroy(&self, id: &str) -> Result<(), SandboxError> {
        let path = PathBuf::from(id);
        // Only ever remove what this provider created.
        if !path.starts_with(&self.sessions_dir) {
            return Ok(());
        }
        match tokio::fs::remove_dir_all(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(SandboxError::io(format!("remove {}", path.display()), e)),
        }
    }
}

/// One session's local sandbox.
pub struct LocalSandbox {
    state_dir: PathBuf,
    workspace: PathBuf,
    isolation: Isolation,
}

impl LocalSandbox {
    /// The argv of bubblewrap around a command (pure, so it is unit-tested).
    pub fn bwrap_args(&self, spec: &ExecSpec) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| args.extend(items.iter().map(|s| s.to_string()));
        push(&["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]);
        // /tmp must be mounted before the binds: the workspace or the state dir may live under /tmp.
        push(&["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]);
        for dir in [&self.state_dir, &self.workspace] {
            let dir = dir.display().to_string();
            push(&["--bind", &dir, &dir]);
        }
        for (host, target) in &spec.read_only {
            push(&["--ro-bind-try", &host.display().to_string(), &target.display().to_string()]);
        }
        push(&["--chdir", &spec.cwd.display().to_string(), "--"]);
        args.push(spec.program.display().to_string());
        args.extend(spec.args.iter().cloned());
        args
    }
}

#[async_trait]
impl Sandbox for LocalSandbox {
    fn workspace(&self) -> &Path {
        &self.workspace
    }

    fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    fn isolation(&self) -> String {
        self.isolation.describe()
    }

    async fn exec(&self, mut spec: ExecSpec) -> Result<RunningProcess, SandboxError> {
        // A shown directory becomes a real, writable directory of the state dir holding its entries: the CLI may
        // add files next to them (OpenCode creates `.gitignore` in its config dir and fails on a read-only one),
        // and those land in the session's state, never in the user's own directory.
        spec.read_only = expand_read_only_dirs(&spec.read_only);
        let mut command = match &self.isolation {
            Isolation::Bwrap(bwrap) => {
                let mut command = Command::new(bwrap);
                command.args(self.bwrap_args(&spec));
                command
            }
            Isolation::None(_) => {
                // Without bubblewrap the user's config can't be mounted; link each entry instead.
                for (host, target) in &spec.read_only {
                    if host.exists() && std::fs::symlink_metadata(target).is_err() {
                        if let Some(parent) = target.parent() {
                            let _ = std::fs::create_dir_all(parent);
                        }
                        let _ = std::os::unix::fs::symlink(host, target);
                    }
                }
                let mut command = Command::new(&spec.program);
                command.args(&spec.args).current_dir(&spec.cwd);
                // SAFETY: the closure runs in the forked child before exec and only makes one
                // async-signal-safe syscall. If the bridge is killed (Zed SIGKILLs it), the CLI dies too
                // instead of running on unsupervised; bubblewrap does the same with --die-with-parent.
                unsafe {
                    command.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from));
                }
                command
            }
        };
        command
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("PWD", &spec.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let program = spec.program.display().to_string();
        let mut child = command.spawn().map_err(|source| SandboxError::Spawn { program: program.clone(), source })?;
        let pid = child.id();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let (Some(mut stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
            return Err(SandboxError::Spawn { program, source: std::io::Error::other("missing stdio pipes") });
        };
        let input = spec.stdin;
        // Written from a task: a prompt larger than the pipe buffer must not block reading stdout.
        tokio::spawn(async move {
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        });
        tracing::debug!(program = %program, pid = ?pid, isolation = %self.isolation.describe(), "started");
        Ok(RunningProcess {
            stdout: Box::pin(stdout),
            stderr: Box::pin(stderr),
            handle: Box::new(LocalProcess { child, pid, exited: None }),
        })
    }
}

/// Replaces each (host dir, target) pair by one pair per entry of the host dir, and makes the target a real
/// directory (an older version linked the whole directory there: that link is replaced), cleared of the links
/// and mount points of earlier runs. Files and missing paths stay as they are.
fn expand_read_only_dirs(pairs: &[(PathBuf, PathBuf)]) -> Vec<(PathBuf, PathBuf)> {
    let mut expanded = Vec::new();
    for (host, target) in pairs {
        if !host.is_dir() {
            expanded.push((host.clone(), target.clone()));
            continue;
        }
        if std::fs::symlink_metadata(target).is_ok_and(|m| m.file_type().is_symlink()) {
            let _ = std::fs::remove_file(target);
        }
        if let Err(e) = std::fs::create_dir_all(target) {
            tracing::warn!("cannot create {}: {e}", target.display());
            continue;
        }
        // What earlier runs left: links (no sandbox) and empty mount points (bubblewrap), possibly of entries the
        // user has removed since. They are made again below; what the CLI wrote itself stays.
        for entry in std::fs::read_dir(target).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            if meta.file_type().is_symlink() || (meta.is_file() && meta.len() == 0) {
                let _ = std::fs::remove_file(&path);
            } else if meta.is_dir() {
                let _ = std::fs::remove_dir(&path); // only when empty
            }
        }
        let mut names: Vec<_> =
            std::fs::read_dir(host).into_iter().flatten().flatten().map(|entry| entry.file_name()).collect();
        names.sort();
        expanded.extend(names.into_iter().map(|name| (host.join(&name), target.join(&name))));
    }
    expanded
}

struct LocalProcess {
    child: Child,
    pid: Option<u32>,
    exited: Option<ExitInfo>,
}

#[async_trait]
impl ProcessHandle for LocalProcess {
    async fn kill(&mut self) {
        if self.exited.is_some() {
            return;
        }
        if let Some(pid) = self.pid {
            kill_tree(pid);
        }
        let _ = self.child.start_kill();
    }

    async fn wait(&mut self) -> Result<ExitInfo, SandboxError> {
        if let Some(exit) = self.exited {
            return Ok(exit);
        }
        let status = self.child.wait().await.map_err(|e| SandboxError::io("wait for the CLI", e))?;
        use std::os::unix::process::ExitStatusExt;
        let exit = ExitInfo { code: status.code(), signal: status.signal() };
        self.exited = Some(exit);
        // Whatever the CLI left behind in its process group goes with it.
        if let Some(pid) = self.pid {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        Ok(exit)
    }
}

impl Drop for LocalProcess {
    fn drop(&mut self) {
        if self.exited.is_none()
            && let Some(pid) = self.pid
        {
            kill_tree(pid);
        }
    }
}

/// Kills a process, its process group and every descendant, including those that left the group with
/// `setsid`. The tree is frozen first so nothing forks away between the walk and the kill.
pub fn kill_tree(root: u32) {
    let mut seen: HashSet<i32> = HashSet::new();
    let root = root as i32;
    let _ = killpg(Pid::from_raw(root), Signal::SIGSTOP);
    loop {
        let found = descendants(root);
        let fresh: Vec<i32> = found.into_iter().filter(|pid| !seen.contains(pid)).collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
            seen.insert(pid);
        }
    }
    let _ = killpg(Pid::from_raw(root), Signal::SIGKILL);
    let _ = kill(Pid::from_raw(root), Signal::SIGKILL);
    for pid in seen {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Processes that CLIs of this data dir left running when their bridge was killed (a plain process group
/// has nothing like bubblewrap's PID namespace to take them down): every process a CLI starts inherits its
/// HOME, `<sessions dir>/<session id>/home`. Returns (pid, session id).
pub fn leftover_processes(sessions_dir: &Path) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let own = std::process::id() as i32;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        if pid == own {
            continue;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let home = environ.split(|&b| b == 0).find_map(|var| var.strip_prefix(b"HOME="));
        let Some(home) = home.and_then(|h| std::str::from_utf8(h).ok()).map(Path::new) else { continue };
        if home.file_name().is_some_and(|name| name == "home")
            && let Some(session_dir) = home.parent()
            && session_dir.parent() == Some(sessions_dir)
            && let Some(session) = session_dir.file_name().and_then(|name| name.to_str())
        {
            found.push((pid, session.to_string()));
        }
    }
    found
}

/// The processes below `root` (by parent links) and in its process group, read from `/proc`.
fn descendants(root: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    let mut in_group = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may contain spaces and parentheses: fields start after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(ppid), Some(pgrp)) =
            (fields.get(1).and_then(|f| f.parse().ok()), fields.get(2).and_then(|f| f.parse::<i32>().ok()))
        else {
            continue;
        };
        children.entry(ppid).or_default().push(pid);
        if pgrp == root && pid != root {
            in_group.push(pid);
        }
    }
    let mut result = in_group;
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            result.push(child);
            stack.push(child);
        }
    }
    result.sort_unstable();
    result.dedup();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bwrap_mounts_tmp_before_binding_workspace_and_state() {
        let sandbox = LocalSandbox {
            state_dir: "/tmp/data/sessions/s1".into(),
            workspace: "/tmp/ws".into(),
            isolation: Isolation::Bwrap("/usr/bin/bwrap".into()),
        };
        let spec = ExecSpec {
            program: "/opt/opencode".into(),
            args: vec!["run".into(), "--format".into(), "json".into()],
            cwd: "/tmp/ws".into(),
            read_only: vec![("/home/u/.config/opencode".into(), "/tmp/data/sessions/s1/config/opencode".into())],
            ..ExecSpec::default()
        };
        let args = sandbox.bwrap_args(&spec).join(" ");
        let tmpfs = args.find("--tmpfs /tmp").unwrap();
        assert!(tmpfs < args.find("--bind /tmp/ws /tmp/ws").unwrap());
        assert!(tmpfs < args.find("--bind /tmp/data/sessions/s1 /tmp/data/sessions/s1").unwrap());
        assert!(args.contains("--ro-bind / /"));
        assert!(args.contains("--unshare-pid") && args.contains("--die-with-parent"));
        assert!(!args.contains("--unshare-net"), "the CLI needs its model's API");
        assert!(args.contains("--ro-bind-try /home/u/.config/opencode /tmp/data/sessions/s1/config/opencode"));
        assert!(args.ends_with("--chdir /tmp/ws -- /opt/opencode run --format json"));
    }

    #[test]
    fn shown_directories_become_writable_directories_of_their_entries() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("user/opencode");
        std::fs::create_dir_all(host.join("agent")).unwrap();
        std::fs::write(host.join("opencode.json"), "{}").unwrap();
        let state = dir.path().join("state/config/opencode");
        std::fs::create_dir_all(state.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&host, &state).unwrap();
        let file = (dir.path().join("user/auth.json"), dir.path().join("state/auth.json"));
        let pairs = expand_read_only_dirs(&[(host.clone(), state.clone()), file.clone()]);
        assert_eq!(
            pairs,
            vec![
                (host.join("agent"), state.join("agent")),
                (host.join("opencode.json"), state.join("opencode.json")),
                file
            ]
        );
        assert!(state.is_dir() && !std::fs::symlink_metadata(&state).unwrap().file_type().is_symlink());
        // A mount point of an entry the user removed goes; what the CLI wrote stays.
        std::fs::write(state.join("removed.json"), "").unwrap();
        std::fs::write(state.join(".gitignore"), "node_modules").unwrap();
        expand_read_only_dirs(&[(host.clone(), state.clone())]);
        assert!(!state.join("removed.json").exists());
        assert!(state.join(".gitignore").exists());
    }

    #[tokio::test]
    async fn kill_tree_reaches_children_that_left_the_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child.pid");
        let sandbox = LocalSandbox {
            state_dir: dir.path().into(),
            workspace: dir.path().into(),
            isolation: Isolation::None("test".into()),
        };
        let script = format!("setsid sleep 1000 & echo $! > {}; sleep 1000", pid_file.display());
        let mut process = sandbox
            .exec(ExecSpec {
                program: "/bin/sh".into(),
                args: vec!["-c".into(), script],
                env: vec![("PATH".into(), "/usr/bin:/bin".into())],
                cwd: dir.path().into(),
                ..ExecSpec::default()
            })
            .await
            .unwrap();
        let grandchild = loop {
            if let Ok(text) = std::fs::read_to_string(&pid_file)
                && let Ok(pid) = text.trim().parse::<i32>()
            {
                break pid;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        process.handle.kill().await;
        let exit = process.handle.wait().await.unwrap();
        assert_eq!(exit.signal, Some(9));
        // The grandchild is not our child: poll until the kernel has removed it (or it is a zombie).
        let mut alive = true;
        for _ in 0..100 {
            let state = std::fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap_or_default();
            if state.is_empty() || state.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')) {
                alive = false;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(!alive, "grandchild {grandchild} survived");
    }
}
