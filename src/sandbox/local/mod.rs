//! The local sandbox: bubblewrap where it works, else Landlock and seccomp (`landlock.rs`), else none: then
//! prompts are refused, unless the user chose `--sandbox none` (a plain process group).
//!
//! Each session owns a state dir under the data dir (the CLI's HOME and XDG dirs); its id is that path.
//! Under bubblewrap the mounts come from `policy.rs`; the sandbox also gets its own user, PID, IPC, UTS and
//! network namespaces (its only way out is the proxy of `proxy.rs`), no capabilities, the seccomp filter, a cgroup
//! for its limits, and dies with the bridge. Without bubblewrap the CLI runs under the bridge's own binary as its
//! subreaper (`init.rs`), so every descendant, daemons included, ends with the turn.

mod adopt;
// What needs Linux (namespaces, Landlock, seccomp, `prctl`) is compiled under `cfg(linux_sandbox)`, which build.rs
// sets for Linux targets; elsewhere the provider runs commands as a plain process group (`--sandbox none`).
#[cfg(linux_sandbox)]
pub mod bwrap;
#[cfg(linux_sandbox)]
mod describe;
#[cfg(linux_sandbox)]
pub mod guard;
#[cfg(linux_sandbox)]
pub mod init;
mod init_args;
mod isolation;
#[cfg(linux_sandbox)]
pub mod landlock;
pub mod limits;
pub mod owners;
pub mod policy;
pub mod protect;
#[cfg(linux_sandbox)]
pub mod seccomp;
pub mod warm;
#[cfg(linux_sandbox)]
mod wrap;

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use self::adopt::Warm;
#[cfg(linux_sandbox)]
use self::bwrap::open_low_ports;
pub use self::init_args::MIN_LINGER_SECS;
use self::init_args::{door_args, linger_args, watch_args};
pub use self::isolation::{Isolation, LANDLOCK_GAPS, probe_bwrap, probe_landlock};
use self::limits::Limits;
use self::owners::record_owner;
use self::policy::{Policy, RealDisk};
#[cfg(not(linux_sandbox))]
use super::needs_linux;
use super::net::proxy::NetworkMode;
#[cfg(linux_sandbox)]
use super::net::proxy::{ConnectionBudget, Proxy};
use super::process::{descendant_pids, home_of, kill_tree, process_table};
use super::{
    ExecSpec, ExitInfo, ProcessHandle, RunningProcess, Sandbox, SandboxChoice, SandboxError, SandboxProvider,
    SandboxSpec,
};
use crate::paths;
use crate::workspace::statedir::StateDir;

/// What every local sandbox of this bridge is made of.
#[derive(Clone, Debug)]
pub struct LocalSettings {
    /// bubblewrap or nothing.
    pub isolation: Isolation,
    /// What is hidden, shown and protected.
    pub policy: Policy,
    /// Where the sandbox may connect.
    pub network: NetworkMode,
    /// Processes and memory.
    pub limits: Limits,
    /// A private directory of the bridge for the proxies' sockets.
    pub run_dir: PathBuf,
    /// The bridge's own executable: the sandbox's first process (`sandbox-init`).
    pub init_program: Option<PathBuf>,
    /// Whether the agent writes the workspace or a copy of it that the editor reviews.
    pub workspace_mode: super::WorkspaceMode,
}

impl LocalSettings {
    /// The review copy of a session's workspace: never a secret of the workspace in it, and changes to the git
    /// dir and the protected paths kept out of the review (they stay in the copy until the next turn resets them).
    pub fn review_copy(&self, state_dir: &Path, workspace: &Path) -> crate::workspace::review::WorkspaceCopy {
        let never_copied = self.policy.hidden_paths().into_iter().filter(|path| path.starts_with(workspace)).collect();
        let mut not_reviewed: Vec<PathBuf> = self
            .policy
            .protected_paths(workspace, &RealDisk)
            .iter()
            .filter_map(|path| path.strip_prefix(workspace).ok().map(Path::to_path_buf))
            .collect();
        not_reviewed.push(".git".into());
        crate::workspace::review::WorkspaceCopy::new(
            state_dir.join("review"),
            workspace.to_path_buf(),
            never_copied,
            not_reviewed,
        )
    }
}

/// Sandboxes that are folders under the data dir.
pub struct LocalProvider {
    sessions_dir: PathBuf,
    settings: Arc<LocalSettings>,
    /// Each sandbox's proxy connections, by state dir name: one budget however often the sandbox is opened.
    #[cfg(linux_sandbox)]
    budgets: std::sync::Mutex<HashMap<String, ConnectionBudget>>,
    /// Who the proxies ask about a host under `--network ask` (the bridge's sessions).
    asker: Option<Arc<dyn crate::sandbox::net::ask::Asker>>,
    /// Each sandbox's `RLIMIT_NPROC` ceiling while a command of it runs, by state dir name: one budget for the agent
    /// and its terminals however often the sandbox is opened.
    ceilings: std::sync::Mutex<HashMap<String, SharedCeiling>>,
}

/// The process ceiling a sandbox's running commands share (see [`limits::Ceiling`]).
type SharedCeiling = Arc<std::sync::Mutex<std::sync::Weak<limits::Ceiling>>>;

impl LocalProvider {
    /// A provider keeping state dirs under `sessions_dir`.
    pub fn new(sessions_dir: PathBuf, settings: Arc<LocalSettings>) -> Self {
        Self {
            sessions_dir,
            settings,
            #[cfg(linux_sandbox)]
            budgets: Default::default(),
            asker: None,
            ceilings: Default::default(),
        }
    }

    /// The same provider, whose proxies ask `asker` about a host under `--network ask`.
    pub fn asking(self, asker: Arc<dyn crate::sandbox::net::ask::Asker>) -> Self {
        Self { asker: Some(asker), ..self }
    }

    /// The provider of a bridge's local sandboxes for `--sandbox choice` (the bridge's own commands use it whatever
    /// the choice), whose settings `settings` renders for the isolation this machine allows: fails when `--sandbox
    /// bwrap` cannot work. Without isolation the bridge becomes the subreaper of what its CLIs leave behind, and
    /// says that they run unconfined.
    pub fn start(
        sessions_dir: PathBuf,
        choice: SandboxChoice,
        settings: impl FnOnce(Isolation) -> LocalSettings,
    ) -> Result<Self, SandboxError> {
        let provider = Self::choose(sessions_dir, choice, settings)?;
        if let Isolation::None(why) = &provider.settings.isolation {
            // Falling back silently would hide that the agent has the whole machine.
            tracing::warn!("CLIs run WITHOUT a sandbox: {why}");
            // Off Linux there is no subreaper: only the CLI's process group ends with the turn.
            #[cfg(linux_sandbox)]
            crate::sandbox::process::become_subreaper();
        }
        match &provider.settings.isolation {
            Isolation::Landlock(_) => {
                tracing::warn!("CLIs run in the Landlock sandbox, not bubblewrap: {LANDLOCK_GAPS}");
                // `sandbox-init` reaps each turn's tree; should it die first, its orphans come to the bridge.
                #[cfg(linux_sandbox)]
                crate::sandbox::process::become_subreaper();
            }
            Isolation::Refused(why) => tracing::error!("no sandbox for the CLIs; prompts are refused: {why}"),
            _ => {}
        }
        Ok(provider)
    }

    /// [`LocalProvider::start`] without its effects on the bridge's process, for a command that only looks
    /// (`doctor`).
    pub fn choose(
        sessions_dir: PathBuf,
        choice: SandboxChoice,
        settings: impl FnOnce(Isolation) -> LocalSettings,
    ) -> Result<Self, SandboxError> {
        let isolation = Isolation::resolve(choice)?;
        Ok(Self::new(sessions_dir, Arc::new(settings(isolation))))
    }

    /// What its sandboxes are made of.
    pub fn settings(&self) -> &LocalSettings {
        &self.settings
    }

    /// The connection budget of the sandbox `session_id` (made on first use; a sandbox keeps its budget for the
    /// bridge's life, a few bytes each).
    #[cfg(linux_sandbox)]
    fn budget(&self, session_id: &str) -> ConnectionBudget {
        let mut budgets = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        budgets.entry(session_id.to_string()).or_default().clone()
    }

    /// The process ceiling of the sandbox `session_id` (made on first use, a few bytes each).
    fn ceiling(&self, session_id: &str) -> SharedCeiling {
        let mut ceilings = self.ceilings.lock().unwrap_or_else(|e| e.into_inner());
        ceilings.entry(session_id.to_string()).or_default().clone()
    }

    fn state_dir(&self, session_id: &str) -> PathBuf {
        self.sessions_dir.join(session_id)
    }

    /// The state dir an id names, if it is one of ours: exactly `<sessions dir>/<plain name>`. An id read from the
    /// store is never trusted as a path.
    fn owned(&self, id: &str) -> Option<PathBuf> {
        let path = Path::new(id);
        let name = path.file_name()?.to_str()?;
        let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        (plain && path.parent() == Some(self.sessions_dir.as_path())).then(|| path.to_path_buf())
    }
}

/// What of a state dir is cache (XDG_CACHE_HOME, npm's and other tools' caches in HOME): 7-14 MB of OpenCode's
/// plugins and npm downloads per session, fetched again when needed. Never the CLI's data (its conversations).
/// The review copy goes whole, manifest and all (a copy without its manifest would read as deletions): the next
/// turn copies the workspace again.
const TRIMMED_CACHES: [&str; 4] = ["cache", "home/.npm", "home/.cache", "review"];

#[async_trait]
impl SandboxProvider for LocalProvider {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<String, SandboxError> {
        let dir = self.state_dir(&spec.session_id);
        if self.owned(&dir.display().to_string()).is_none() {
            return Err(SandboxError::Unavailable(format!("{:?} cannot name a sandbox", spec.session_id)));
        }
        paths::create_private_dir(&dir).map_err(|e| SandboxError::io(format!("create {}", dir.display()), e))?;
        let state = StateDir::open(&dir).map_err(|e| SandboxError::io(format!("open {}", dir.display()), e))?;
        for sub in ["home", "config", "data", "cache", "state"] {
            state
                .ensure_dir(Path::new(sub))
                .map_err(|e| SandboxError::io(format!("create {sub} in {}", dir.display()), e))?;
        }
        Ok(dir.display().to_string())
    }

    async fn connect(&self, id: &str, spec: &SandboxSpec) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        let Some(state_dir) = self.owned(id) else {
            tracing::warn!(session = %spec.session_id, sandbox = id, "the stored sandbox id is not a state dir of ours; ignoring it");
            return Ok(None);
        };
        if !std::fs::symlink_metadata(state_dir.join("home")).is_ok_and(|m| m.is_dir()) {
            return Ok(None);
        }
        let copy = (self.settings.workspace_mode == super::WorkspaceMode::Review)
            .then(|| Arc::new(self.settings.review_copy(&state_dir, &spec.workspace)));
        // Without bubblewrap nothing can be bound over the workspace: the agent works in its copy, where it lives.
        let workspace = match (&copy, &self.settings.isolation) {
            (Some(copy), Isolation::None(_) | Isolation::Landlock(_)) => copy.path(),
            _ => spec.workspace.clone(),
        };
        // The review copy covers the workspace alone: with it, the other roots are never writable (the session
        // refuses them in review mode; this keeps the copy's promise whatever asks).
        let roots = if copy.is_some() { Vec::new() } else { spec.roots.clone() };
        Ok(Some(Arc::new(LocalSandbox {
            copy,
            workspace,
            roots,
            state_dir,
            host_workspace: spec.workspace.clone(),
            session_id: spec.session_id.clone(),
            settings: self.settings.clone(),
            #[cfg(linux_sandbox)]
            budget: self.budget(&spec.session_id),
            asker: self.asker.clone(),
            ceiling: self.ceiling(&spec.session_id),
        })))
    }

    async fn suspend(&self, _id: &str) -> Result<(), SandboxError> {
        // Nothing runs between turns locally.
        Ok(())
    }

    fn unconfined(&self) -> Option<String> {
        match &self.settings.isolation {
            Isolation::None(why) => Some(why.clone()),
            Isolation::Bwrap(_) | Isolation::Landlock(_) | Isolation::Refused(_) => None,
        }
    }

    fn weaker(&self) -> Option<String> {
        matches!(self.settings.isolation, Isolation::Landlock(_)).then(|| LANDLOCK_GAPS.to_string())
    }

    fn refusal(&self) -> Option<String> {
        match &self.settings.isolation {
            Isolation::Refused(why) => Some(why.clone()),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        self.settings.isolation.describe()
    }

    fn runs_here(&self) -> bool {
        true
    }

    // The trait's `false` off Linux: only bubblewrap gives a sandbox a network of its own.
    #[cfg(linux_sandbox)]
    fn private_network(&self) -> bool {
        matches!(self.settings.isolation, Isolation::Bwrap(_))
            && self.settings.network.uses_proxy()
            && bwrap::bwrap_netns().is_ok()
    }

    async fn trim(&self, id: &str) -> Result<bool, SandboxError> {
        let Some(path) = self.owned(id) else { return Ok(false) };
        let work = tokio::task::spawn_blocking(move || -> std::io::Result<bool> {
            // Something still runs in it (another bridge's warm server, a leftover): its caches stay.
            let home = path.join("home");
            if process_table().iter().any(|entry| home_of(entry.pid).as_deref() == Some(home.as_path())) {
                return Ok(false);
            }
            let state = match StateDir::open(&path) {
                Ok(state) => state,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(e),
            };
            let mut freed = false;
            for cache in TRIMMED_CACHES {
                freed |= state.empty_dir(Path::new(cache))?;
            }
            Ok(freed)
        });
        match work.await {
            Ok(result) => result.map_err(|e| SandboxError::io(format!("trim the caches of {id}"), e)),
            Err(e) => Err(SandboxError::Unavailable(format!("trimming {id} failed: {e}"))),
        }
    }

    async fn destroy(&self, id: &str) -> Result<(), SandboxError> {
        // Only ever remove what this provider created.
        let Some(path) = self.owned(id) else {
            tracing::warn!(sandbox = id, "not removing a sandbox id that is not a state dir of ours");
            return Ok(());
        };
        // `remove_dir_all` removes links, never what they point to.
        match tokio::fs::remove_dir_all(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(SandboxError::io(format!("remove {}", path.display()), e)),
        }
    }
}

/// One session's local sandbox.
pub struct LocalSandbox {
    /// In review mode, the agent's copy of the workspace: bound over the workspace under bubblewrap (overlayfs
    /// is not used: the bubblewrap here may lack `--overlay`, and a layer cannot change under a mounted overlay,
    /// which settling a reviewed file mid-turn must do), the agent's working directory without it.
    copy: Option<Arc<crate::workspace::review::WorkspaceCopy>>,
    /// Where the agent sees the workspace: the workspace, or its copy in review mode without bubblewrap.
    workspace: PathBuf,
    state_dir: PathBuf,
    /// The user's workspace on the host.
    host_workspace: PathBuf,
    /// The workspace's other roots, writable at their host paths and protected like the workspace.
    roots: Vec<PathBuf>,
    session_id: String,
    settings: Arc<LocalSettings>,
    /// The `RLIMIT_NPROC` ceiling its running commands share, where only that limits them.
    ceiling: SharedCeiling,
    /// The connections its proxies may still open, shared by all of them.
    #[cfg(linux_sandbox)]
    budget: ConnectionBudget,
    /// Who its proxies ask under `--network ask`.
    // Read by the proxy's start, which only the Linux backend has.
    #[cfg_attr(not(linux_sandbox), allow(dead_code))]
    asker: Option<Arc<dyn crate::sandbox::net::ask::Asker>>,
}

impl LocalSandbox {
    /// Binds the bridge's end of a server's door in the bridge's run dir (mode 0700, never mounted into a
    /// sandbox) and hands its listening fd to the command; returns the fd number the command inherits.
    fn open_door(&self, guards: &mut ProcessGuards) -> Result<i32, SandboxError> {
        if self.settings.init_program.is_none() {
            // Its door is spliced by `sandbox-init`, which only the Linux backend has.
            let why = if cfg!(linux_sandbox) {
                "a server in the sandbox needs the bridge's own binary (its executable could not be found)"
            } else {
                "a server in the sandbox needs the sandbox's first process, which only Linux has here"
            };
            return Err(SandboxError::Unavailable(why.into()));
        }
        paths::create_private_dir(&self.settings.run_dir)
            .map_err(|e| SandboxError::io(format!("create {}", self.settings.run_dir.display()), e))?;
        let path = self.settings.run_dir.join(format!("{}.door", &uuid::Uuid::new_v4().simple().to_string()[..12]));
        let listener = std::os::unix::net::UnixListener::bind(&path)
            .map_err(|e| SandboxError::io(format!("listen on {}", path.display()), e))?;
        let fd = OwnedFd::from(listener);
        let raw = fd.as_raw_fd();
        guards.inherited.push(fd);
        guards.door = Some(path);
        Ok(raw)
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

    fn review_copy(&self) -> Option<Arc<crate::workspace::review::WorkspaceCopy>> {
        self.copy.clone()
    }

    fn sweep_protected(&self) -> Vec<protect::Moved> {
        if self.copy.is_some() {
            return Vec::new();
        }
        std::iter::once(&self.host_workspace).chain(&self.roots).flat_map(|root| protect::sweep(root)).collect()
    }

    fn isolation(&self) -> String {
        self.settings.isolation.describe()
    }

    fn host_files(&self) -> Option<super::HostFiles> {
        let shown = self.copy.as_ref().map_or_else(|| self.host_workspace.clone(), |copy| copy.path());
        let roots: Vec<(PathBuf, PathBuf)> = std::iter::once((self.workspace.clone(), shown))
            .chain(self.roots.iter().map(|root| (root.clone(), root.clone())))
            .collect();
        let protected = roots
            .iter()
            .flat_map(|(seen, host)| {
                let paths = self.settings.policy.protected_paths(host, &RealDisk);
                paths.into_iter().filter_map(|path| Some(seen.join(path.strip_prefix(host).ok()?))).collect::<Vec<_>>()
            })
            .collect();
        Some(super::HostFiles { roots, hidden: self.settings.policy.hidden_paths(), protected })
    }

    async fn write_state_file(&self, path: &Path, bytes: &[u8]) -> Result<(), SandboxError> {
        StateDir::open(&self.state_dir)
            .and_then(|state| state.write_file(path, bytes))
            .map_err(|e| SandboxError::io(format!("write {}", path.display()), e))
    }

    async fn exec(&self, mut spec: ExecSpec) -> Result<RunningProcess, SandboxError> {
        if let Isolation::Refused(why) = &self.settings.isolation {
            return Err(SandboxError::Unavailable(why.clone()));
        }
        // Before anything of the command runs: another bridge's reaper must know it is ours. Without the record the
        // command still runs; only a bridge started meanwhile could take it for a leftover.
        if let Err(e) = record_owner(&self.settings.run_dir, &self.session_id) {
            tracing::warn!(session = %self.session_id, "could not record this bridge as the owner: {e}");
        }
        let kept = match (&spec.keep_warm, spec.serve_port) {
            (Some(keep), Some(_)) => {
                // The roots are mounts of the server's sandbox: a server kept with other roots is not this one.
                let settings = format!("{} {:?}", warm::settings_digest(&self.settings), self.roots);
                let fingerprint = warm::fingerprint(&spec, &settings);
                if let Some(record) = warm::read(&self.settings.run_dir, &keep.key) {
                    if record.fingerprint == fingerprint && record.alive() && record.door.exists() {
                        return self.adopt(record, &spec).await;
                    }
                    tracing::info!(key = %keep.key, pid = record.pid, "stopping a kept-warm server started for another command or settings");
                    warm::stop(&self.settings.run_dir, &record);
                }
                Some((keep.clone(), fingerprint))
            }
            _ => None,
        };
        let state = StateDir::open(&self.state_dir)
            .map_err(|e| SandboxError::io(format!("open {}", self.state_dir.display()), e))?;
        // A shown directory becomes a real, writable directory of the state dir holding its entries: the CLI may
        // add files next to them (OpenCode creates `.gitignore` in its config dir and fails on a read-only one),
        // and those land in the session's state, never in the user's own directory.
        spec.read_only = expand_read_only_dirs(&state, &spec.read_only);
        // A file shown writable gets its place in the state dir (what else was there replaced, never written
        // through): an empty mount point under bubblewrap, a link to the file without it.
        for (host, target) in &spec.writable {
            let placed = match self.settings.isolation {
                Isolation::None(_) | Isolation::Landlock(_) | Isolation::Refused(_) => state.symlink(host, target),
                Isolation::Bwrap(_) => state.place_mount_point(target),
            };
            placed.map_err(|e| SandboxError::io(format!("place {}", target.display()), e))?;
        }
        if let Some(copy) = &self.copy {
            copy.ensure_made().map_err(|e| SandboxError::io(format!("make {}", copy.path().display()), e))?;
        }
        let mut guards = ProcessGuards::default();
        // The agent writes the user's files (no review copy): a protected path that does not exist is not mounted
        // (its mount point would stay in the workspace) but watched, and moved out as soon as it appears.
        if self.copy.is_none() {
            let policy = &self.settings.policy;
            state
                .ensure_dir(&self.state_dir.join(protect::QUARANTINE))
                .map_err(|e| SandboxError::io(format!("create {}", protect::QUARANTINE), e))?;
            // Each root is guarded like the workspace, with one watch of its own.
            for root in std::iter::once(&self.host_workspace).chain(&self.roots) {
                protect::clear_old_placeholders(root, &policy.protected_paths(root, &RealDisk));
                let missing = policy.missing_protected(root, &RealDisk);
                guards.watches.push(protect::Watch::start(root, missing, &self.state_dir));
            }
        }
        let enforcement = limits::probe();
        // A group of the command's own inside the session's, whose limits the agent and its terminals share.
        let cgroup = match limits::SandboxCgroup::create(
            &enforcement,
            &self.session_id,
            &uuid::Uuid::new_v4().simple().to_string()[..8],
            &self.settings.limits,
        ) {
            Ok(cgroup) => cgroup,
            Err(e) => {
                tracing::warn!(session = %self.session_id, "no cgroup for this command: {e}");
                None
            }
        };
        // Without a cgroup the sandbox's first process watches the limits itself.
        let watch = cgroup.is_none().then_some(self.settings.limits);
        #[cfg(linux_sandbox)]
        if spec.serve_port.is_some()
            && matches!(self.settings.isolation, Isolation::Bwrap(_))
            && let Err(why) = guard::port_guard_available()
        {
            // A server its tools could reach would let them answer their own approvals: no server then.
            return Err(SandboxError::Unavailable(format!(
                "no server in this sandbox: its tools could reach it ({why})"
            )));
        }
        let door = match spec.serve_port {
            Some(port) => Some((self.open_door(&mut guards)?, port)),
            None => None,
        };
        // A model endpoint below port 1024 is opened in the sandbox's network namespace once it exists.
        #[cfg(linux_sandbox)]
        let mut low_ports = false;
        let mut command = match &self.settings.isolation {
            #[cfg(linux_sandbox)]
            Isolation::Bwrap(bwrap) => {
                let (command, low) = self.bwrap_command(bwrap, &mut spec, &mut guards, watch, door).await?;
                low_ports = low;
                command
            }
            // Never chosen off Linux (`probe_bwrap` says why): settings made by hand get the same answer.
            #[cfg(not(linux_sandbox))]
            Isolation::Bwrap(_) => return Err(SandboxError::Unavailable(needs_linux())),
            #[cfg(linux_sandbox)]
            Isolation::Landlock(_) => {
                link_read_only(&state, &spec);
                self.landlock_command(&state, &mut spec, &mut guards, watch, door).await?
            }
            #[cfg(not(linux_sandbox))]
            Isolation::Landlock(_) => return Err(SandboxError::Unavailable(needs_linux())),
            Isolation::Refused(why) => return Err(SandboxError::Unavailable(why.clone())),
            Isolation::None(_) => {
                link_read_only(&state, &spec);
                // The bridge's own binary goes first: a subreaper that ends every descendant, daemons included,
                // when the CLI exits or the bridge goes.
                let mut command = match &self.settings.init_program {
                    Some(init) => {
                        let mut command = Command::new(init);
                        command
                            .args(["sandbox-init", "--reap"])
                            .args(watch_args(watch))
                            .args(door_args(door))
                            .args(linger_args(&spec));
                        command.arg("--");
                        command.arg(&spec.program).args(&spec.args);
                        command
                    }
                    None => {
                        let mut command = Command::new(&spec.program);
                        command.args(&spec.args);
                        command
                    }
                };
                command.current_dir(&spec.cwd);
                command
            }
        };
        let mut join = cgroup.as_ref().map(|cgroup| cgroup.pre_exec_join());
        // RLIMIT_NPROC counts the whole user's processes (bubblewrap's too, in its user namespace); root ignores it.
        let ceiling = (cgroup.is_none()
            && matches!(self.settings.isolation, Isolation::None(_) | Isolation::Landlock(_) | Isolation::Bwrap(_))
            && !nix::unistd::getuid().is_root())
        .then(|| limits::Ceiling::shared(&self.ceiling, &self.settings.limits));
        let mut rlimit = ceiling.as_deref().map(limits::rlimit_pre_exec);
        guards.ceiling = ceiling;
        let inherited: Vec<i32> = guards.inherited.iter().map(|fd| fd.as_raw_fd()).collect();
        #[cfg(linux_sandbox)]
        let init_dies_politely = matches!(self.settings.isolation, Isolation::None(_) | Isolation::Landlock(_))
            && self.settings.init_program.is_some();
        // A kept-warm server is not told of the bridge's death: it lingers, then ends itself.
        let dies_with_bridge = kept.is_none();
        // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe syscalls on
        // data prepared before the fork. If the bridge is killed (Zed SIGKILLs it), the sandbox dies too instead of
        // running on unsupervised; bubblewrap does the same with --die-with-parent. The subreaper of `--sandbox
        // none` gets SIGTERM instead, so that it can kill its descendants first.
        unsafe {
            command.pre_exec(move || {
                for fd in &inherited {
                    clear_cloexec(*fd)?;
                }
                if let Some(join) = join.as_mut() {
                    join()?;
                }
                if let Some(rlimit) = rlimit.as_mut() {
                    rlimit()?;
                }
                // Off Linux there is no parent-death signal: `kill_on_drop` and the bridge's kills end it.
                #[cfg(linux_sandbox)]
                if dies_with_bridge {
                    let signal = if init_dies_politely { Signal::SIGTERM } else { Signal::SIGKILL };
                    nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from)?;
                }
                Ok(())
            });
        }
        command.env_clear().envs(spec.env.iter().map(|(k, v)| (k, v)));
        if let Some((keep, _)) = &kept {
            // What ties the record written below to this process, for the bridge that adopts it.
            command.env(warm::MARK_VAR, warm::mark(&keep.secret));
        }
        command
            .env("PWD", &spec.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(dies_with_bridge);
        let program = spec.program.display().to_string();
        // The child is recorded as the bridge's own under the same lock that `end_orphans` reads the process table
        // under: a command of the same sandbox ending right now must not take this one, which carries its HOME,
        // for an orphan in the moment between its start and its record.
        let mut live = live_children();
        let spawned = command.spawn();
        if let Ok(child) = &spawned
            && let Some(pid) = child.id()
        {
            live.insert(pid);
        }
        drop(live);
        let mut child = spawned.map_err(|source| SandboxError::Spawn { program: program.clone(), source })?;
        guards.inherited.clear();
        guards.cgroup = cgroup;
        let pid = child.id();
        #[cfg(linux_sandbox)]
        if let (true, Some(bwrap)) = (low_ports, pid) {
            // sandbox-init waits for this before it binds the endpoint's port, and fails saying so without it.
            let session = self.session_id.clone();
            tokio::task::spawn_blocking(move || {
                if let Err(why) = open_low_ports(bwrap) {
                    tracing::warn!(session = %session, "a model endpoint below port 1024 cannot be served: {why}");
                }
            });
        }
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let (Some(mut stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
            return Err(SandboxError::Spawn { program, source: std::io::Error::other("missing stdio pipes") });
        };
        let interactive: Option<std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>> = if spec.interactive {
            Some(Box::pin(stdin))
        } else {
            let input = spec.stdin;
            // Written from a task: a prompt larger than the pipe buffer must not block reading stdout.
            tokio::spawn(async move {
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            });
            None
        };
        tracing::debug!(program = %program, pid = ?pid, isolation = %self.settings.isolation.describe(), "started");
        let door = guards.door.clone();
        let warm = match (kept, pid, &door) {
            (Some((keep, fingerprint)), Some(pid), Some(door)) => {
                self.keep_record(keep, fingerprint, pid, door, &guards)
            }
            _ => None,
        };
        Ok(RunningProcess {
            stdin: interactive,
            door: door.map(|path| Arc::new(crate::sandbox::UnixDoor(path)) as Arc<dyn crate::sandbox::Door>),
            stdout: Box::pin(stdout),
            stderr: Box::pin(stderr),
            handle: Box::new(LocalProcess {
                child,
                pid,
                exited: None,
                orphans_home: matches!(self.settings.isolation, Isolation::None(_) | Isolation::Landlock(_))
                    .then(|| self.state_dir.join("home")),
                guards,
                warm,
                detached: false,
            }),
            adopted: None,
        })
    }
}

/// What lives as long as one command: its proxy, its cgroup, the watch of its missing protected paths, fds passed
/// to bubblewrap.
#[derive(Default)]
struct ProcessGuards {
    #[cfg(linux_sandbox)]
    proxy: Option<Proxy>,
    /// The host end of a server's door (a socket file in the run dir), removed with the process.
    door: Option<PathBuf>,
    cgroup: Option<limits::SandboxCgroup>,
    /// The session's process ceiling, shared while this command runs.
    ceiling: Option<Arc<limits::Ceiling>>,
    watches: Vec<protect::Watch>,
    inherited: Vec<OwnedFd>,
}

/// Lets `fd` survive exec. Async-signal-safe (one `fcntl`), so it may run in a `pre_exec` closure.
pub fn clear_cloexec(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: F_SETFD only changes the flags of an fd number; no memory is passed.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// Without bubblewrap the user's config can't be mounted: each entry is linked into the state dir instead.
fn link_read_only(state: &StateDir, spec: &ExecSpec) {
    for (host, target) in &spec.read_only {
        if host.exists()
            && std::fs::symlink_metadata(target).is_err()
            && let Err(e) = state.symlink(host, target)
        {
            tracing::warn!("cannot link {}: {e}", target.display());
        }
    }
}

/// Replaces each (host dir, target) pair by one pair per entry of the host dir, and makes the target a real
/// directory of the state dir (a link planted there is replaced, never followed), cleared of the links and mount
/// points of earlier runs. Files and missing paths stay as they are.
fn expand_read_only_dirs(state: &StateDir, pairs: &[(PathBuf, PathBuf)]) -> Vec<(PathBuf, PathBuf)> {
    let mut expanded = Vec::new();
    for (host, target) in pairs {
        if state.relative(target).is_err() {
            tracing::warn!("not showing {} outside the state dir", target.display());
            continue;
        }
        if !host.is_dir() {
            // Its directory must be a real one of the state dir: a link planted there would redirect the mount.
            if let Some(parent) = target.parent()
                && let Err(e) = state.ensure_dir(parent)
            {
                tracing::warn!("cannot create {}: {e}", parent.display());
                continue;
            }
            if std::fs::symlink_metadata(target).is_ok_and(|m| m.file_type().is_symlink() || m.is_dir()) {
                let _ = state.write_file(target, b"");
            }
            expanded.push((host.clone(), target.clone()));
            continue;
        }
        if let Err(e) = state.ensure_dir(target) {
            tracing::warn!("cannot create {}: {e}", target.display());
            continue;
        }
        // What earlier runs left: links (no sandbox) and empty mount points (bubblewrap), possibly of entries the
        // user has removed since. They are made again below; what the CLI wrote itself stays.
        if let Err(e) = state.clear_placeholders(target) {
            tracing::warn!("cannot clear {}: {e}", target.display());
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
    /// The CLI's HOME, when orphans can reach the bridge (no bubblewrap): they are known by it.
    orphans_home: Option<PathBuf>,
    guards: ProcessGuards,
    /// A kept-warm server's record (`ExecSpec::keep_warm`): removed when it ends.
    warm: Option<Warm>,
    /// Left running past the bridge ([`ProcessHandle::detach`]).
    detached: bool,
}

impl LocalProcess {
    /// The command was reaped (or is being dropped): its pid is no longer one of the bridge's own children.
    fn forget(&self) {
        if let Some(pid) = self.pid {
            live_children().remove(&pid);
        }
    }

    /// Ends what may outlive the command itself: the rest of its cgroup and orphans carrying its HOME.
    fn end_leftovers(&self) {
        if let Some(cgroup) = &self.guards.cgroup {
            cgroup.kill_all();
        }
        if let Some(home) = &self.orphans_home {
            end_orphans(home);
        }
    }
}

#[async_trait]
impl ProcessHandle for LocalProcess {
    fn end_strays(&self) {
        if let Some(root) = self.pid {
            signal_init_of(root);
        }
    }

    fn tree(&self) -> HashSet<i32> {
        self.pid.map(|root| descendant_pids(root).into_iter().collect()).unwrap_or_default()
    }

    fn activity(&self) -> Option<crate::sandbox::process::Activity> {
        if self.exited.is_some() {
            return None;
        }
        self.pid.and_then(crate::sandbox::process::activity)
    }

    fn end_new_groups(&self, before: &HashSet<i32>) {
        if let Some(root) = self.pid {
            let ended = super::process::kill_new_groups(root, before);
            if !ended.is_empty() {
                tracing::info!(processes = ended.len(), "ended what the stopped turn left running");
            }
        }
    }

    fn detach(&mut self) {
        if self.warm.is_some() {
            self.detached = true;
        }
    }

    async fn kill(&mut self) {
        if self.exited.is_some() {
            return;
        }
        if let Some(pid) = self.pid {
            kill_tree(pid);
        }
        self.end_leftovers();
        let _ = self.child.start_kill();
    }

    fn limit_hit(&self) -> Option<String> {
        self.guards.cgroup.as_ref().and_then(|cgroup| cgroup.oom_or_pids_hit())
    }

    async fn wait(&mut self) -> Result<ExitInfo, SandboxError> {
        if let Some(exit) = self.exited {
            return Ok(exit);
        }
        let status = self.child.wait().await.map_err(|e| SandboxError::io("wait for the CLI", e))?;
        use std::os::unix::process::ExitStatusExt;
        let exit = ExitInfo { code: status.code(), signal: status.signal() };
        self.exited = Some(exit);
        self.forget();
        if let Some(warm) = &self.warm {
            warm::forget(&warm.run_dir, &warm.record);
        }
        // Whatever the CLI left behind goes with it, after every turn.
        if let Some(pid) = self.pid {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        self.end_leftovers();
        Ok(exit)
    }
}

impl ProcessGuards {
    /// Whether the command has a proxy.
    #[cfg(linux_sandbox)]
    fn has_proxy(&self) -> bool {
        self.proxy.is_some()
    }

    /// Off Linux no command has a proxy (only bubblewrap's sandboxes do).
    #[cfg(not(linux_sandbox))]
    fn has_proxy(&self) -> bool {
        false
    }
}

impl Drop for ProcessGuards {
    fn drop(&mut self) {
        if let Some(door) = self.door.take() {
            let _ = std::fs::remove_file(door);
        }
    }
}

impl Drop for LocalProcess {
    fn drop(&mut self) {
        if self.detached {
            // It runs on, with its door, its cgroup and its record, for the next bridge.
            self.guards.door = None;
            std::mem::forget(self.guards.cgroup.take());
            self.forget();
            return;
        }
        if let Some(warm) = &self.warm {
            warm::forget(&warm.run_dir, &warm.record);
        }
        if self.exited.is_none() {
            if let Some(pid) = self.pid {
                kill_tree(pid);
            }
            self.end_leftovers();
        }
        self.forget();
        // Its processes are gone; removing the group waits for the kernel to let go of it, which need not hold
        // up the turn's answer.
        if let Some(cgroup) = self.guards.cgroup.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn_blocking(move || drop(cgroup));
        }
    }
}

/// Tells the sandbox's first process below `root` (`sandbox-init`) to end what turns left beside its command.
fn signal_init_of(root: u32) {
    // The sandbox's first process is the command itself under `--sandbox none`, two levels below bubblewrap.
    let init = std::iter::once(root as i32).chain(descendant_pids(root)).find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| cmdline.split(|&b| b == 0).nth(1) == Some(b"sandbox-init".as_slice()))
    });
    if let Some(init) = init {
        let _ = nix::sys::signal::kill(Pid::from_raw(init), Signal::SIGUSR1);
    }
}

/// The commands this bridge started and has not reaped: children of the bridge that are not orphans.
fn live_children() -> std::sync::MutexGuard<'static, HashSet<u32>> {
    static LIVE: OnceLock<Mutex<HashSet<u32>>> = OnceLock::new();
    LIVE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// Ends the orphans re-parented to the bridge whose HOME is `home` (the session's), and what they started, then
/// waits for them so that none stays a zombie. Only ever waits for what it killed: tokio waits for the rest.
/// A command the bridge started itself and still runs (the session's server, another of its commands) is a child
/// with that HOME too, but no orphan: it is left alone.
fn end_orphans(home: &Path) {
    let own = std::process::id() as i32;
    // Read under the lock a command's start records its child under (see `exec`): no child of the bridge is seen
    // before it is known as one.
    let orphans: Vec<i32> = {
        let live = live_children();
        process_table()
            .into_iter()
            .filter(|p| p.ppid == own && !live.contains(&(p.pid as u32)) && home_of(p.pid).as_deref() == Some(home))
            .map(|p| p.pid)
            .collect()
    };
    let mut killed: Vec<i32> = orphans.into_iter().flat_map(|pid| kill_tree(pid as u32)).collect();
    // A killed orphan's descendants become the bridge's children only once it is dead: look a few times.
    for _ in 0..50 {
        killed.retain(|&pid| {
            match nix::sys::wait::waitpid(Pid::from_raw(pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
                Ok(nix::sys::wait::WaitStatus::StillAlive) => true,
                Ok(_) => false,
                Err(_) => std::path::Path::new(&format!("/proc/{pid}")).exists(),
            }
        });
        if killed.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(linux_sandbox)]
    use crate::sandbox::local::bwrap::NetSetup;
    #[cfg(linux_sandbox)]
    use crate::sandbox::local::policy::{Mount, Plan};

    fn test_config(dir: &Path) -> crate::config::Config {
        crate::config::Config::new(crate::agents::AgentKind::parse("opencode").unwrap(), dir.to_path_buf())
    }

    fn sandbox(dir: &Path, isolation: Isolation) -> LocalSandbox {
        let mut settings = test_config(dir).local_settings(isolation);
        settings.policy = Policy::default();
        LocalSandbox {
            copy: None,
            workspace: dir.into(),
            state_dir: dir.into(),
            host_workspace: dir.into(),
            roots: Vec::new(),
            session_id: "s1".into(),
            settings: Arc::new(settings),
            #[cfg(linux_sandbox)]
            budget: ConnectionBudget::default(),
            asker: None,
            ceiling: SharedCeiling::default(),
        }
    }

    #[cfg(linux_sandbox)]
    #[test]
    fn in_review_mode_the_workspace_and_its_protected_paths_come_from_the_copy() {
        let mut sandbox = sandbox(Path::new("/tmp/ws"), Isolation::Bwrap("/usr/bin/bwrap".into()));
        sandbox.state_dir = "/tmp/data/sessions/s1".into();
        let copy = crate::workspace::review::WorkspaceCopy::new(
            "/tmp/data/sessions/s1/review".into(),
            "/tmp/ws".into(),
            vec![],
            vec![],
        );
        sandbox.copy = Some(Arc::new(copy));
        let spec = ExecSpec { program: "/opt/opencode".into(), cwd: "/tmp/ws".into(), ..ExecSpec::default() };
        let plan = Plan {
            mounts: vec![
                Mount::Writable("/tmp/data/sessions/s1".into()),
                Mount::EmptyDir("/tmp/data/sessions/s1/review".into()),
                Mount::Writable("/tmp/ws".into()),
                Mount::Writable("/tmp/ws/.git".into()),
                Mount::ReadOnly("/tmp/ws/.git/hooks".into()),
                Mount::EmptyFile("/tmp/ws/.envrc".into()),
            ],
        };
        let args = sandbox.bwrap_args(&spec, &plan, None, None, None, None).join(" ");
        assert!(
            args.contains(
                "--bind /tmp/data/sessions/s1 /tmp/data/sessions/s1 --tmpfs /tmp/data/sessions/s1/review --bind \
                 /tmp/data/sessions/s1/review/copy /tmp/ws --bind-try /tmp/data/sessions/s1/review/copy/.git /tmp/ws/.git \
                 --ro-bind-try /tmp/data/sessions/s1/review/copy/.git/hooks /tmp/ws/.git/hooks --ro-bind /dev/null \
                 /tmp/ws/.envrc"
            ),
            "{args}"
        );
        assert!(args.contains("--remount-ro /tmp/data/sessions/s1/review"), "{args}");
    }

    #[cfg(linux_sandbox)]
    #[test]
    fn bwrap_runs_the_cli_without_network_capabilities_or_namespaces_of_its_own() {
        let mut sandbox = sandbox(Path::new("/tmp/ws"), Isolation::Bwrap("/usr/bin/bwrap".into()));
        sandbox.state_dir = "/tmp/data/sessions/s1".into();
        let spec = ExecSpec {
            program: "/opt/opencode".into(),
            args: vec!["run".into(), "--format".into(), "json".into()],
            cwd: "/tmp/ws".into(),
            read_only: vec![("/home/u/.config/opencode".into(), "/tmp/data/sessions/s1/config/opencode".into())],
            ..ExecSpec::default()
        };
        let plan = Plan {
            mounts: vec![
                Mount::Scratch("/tmp".into()),
                Mount::EmptyDir("/home/u/.ssh".into()),
                Mount::Writable("/tmp/data/sessions/s1".into()),
                Mount::Writable("/tmp/ws".into()),
                Mount::ReadOnly("/tmp/ws/.git/config".into()),
                Mount::EmptyFile("/tmp/ws/.envrc".into()),
            ],
        };
        let net = NetSetup { socket: "/data/run/x.sock".into(), port: 3128, expose: vec![4010], in_dir: false };
        let args = sandbox.bwrap_args(&spec, &plan, Some(&net), Some(7), None, None).join(" ");
        let init = std::env::current_exe().unwrap().display().to_string();
        let expected_start = "--die-with-parent --new-session --unshare-pid --unshare-ipc --unshare-uts --unshare-net";
        assert!(args.starts_with(expected_start), "{args}");
        assert!(
            args.contains("--cap-drop ALL --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --tmpfs /home/u/.ssh")
        );
        assert!(args.contains(
            "--bind /tmp/data/sessions/s1 /tmp/data/sessions/s1 --bind /tmp/ws /tmp/ws --ro-bind /tmp/ws/.git/config \
             /tmp/ws/.git/config --ro-bind /dev/null /tmp/ws/.envrc"
        ));
        assert!(args.contains("--ro-bind-try /home/u/.config/opencode /tmp/data/sessions/s1/config/opencode"));
        assert!(args.contains(&format!("--ro-bind {init} /run/acp-sandbox/acp-sandbox")));
        assert!(
            args.contains(
                "--ro-bind /data/run/x.sock /run/acp-sandbox/proxy.sock --remount-ro /home/u/.ssh --seccomp 7"
            )
        );
        assert!(args.ends_with(
            "--chdir /tmp/ws -- /run/acp-sandbox/acp-sandbox sandbox-init --proxy-socket /run/acp-sandbox/proxy.sock \
             --proxy-port 3128 --expose 4010 --no-unix-sockets -- /opt/opencode run --format json"
        ));
        let host = sandbox
            .bwrap_args(
                &spec,
                &plan,
                None,
                None,
                Some(Limits { max_processes: 9, max_memory_bytes: 99 }),
                Some((5, 4096)),
            )
            .join(" ");
        assert!(
            host.ends_with(
                "sandbox-init --max-processes 9 --max-memory 99 --door-fd 5 --door-port 4096 --guard-door --no-unix-sockets -- /opt/opencode \
                 run --format json"
            ),
            "{host}"
        );
        assert!(!host.contains("--unshare-net") && !host.contains("--proxy-"), "{host}");
    }

    #[test]
    fn shown_directories_become_writable_directories_of_their_entries() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("user/opencode");
        std::fs::create_dir_all(host.join("agent")).unwrap();
        std::fs::write(host.join("opencode.json"), "{}").unwrap();
        let root = dir.path().join("state");
        let state = root.join("config/opencode");
        std::fs::create_dir_all(state.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&host, &state).unwrap();
        let file = (dir.path().join("user/auth.json"), root.join("data/auth.json"));
        let sd = StateDir::open(&root).unwrap();
        let pairs = expand_read_only_dirs(&sd, &[(host.clone(), state.clone()), file.clone()]);
        assert_eq!(
            pairs,
            vec![
                (host.join("agent"), state.join("agent")),
                (host.join("opencode.json"), state.join("opencode.json")),
                file
            ]
        );
        assert!(state.is_dir() && !std::fs::symlink_metadata(&state).unwrap().file_type().is_symlink());
        assert!(root.join("data").is_dir(), "the file's directory is made real");
        // A mount point of an entry the user removed goes; what the CLI wrote stays.
        std::fs::write(state.join("removed.json"), "").unwrap();
        std::fs::write(state.join(".gitignore"), "node_modules").unwrap();
        expand_read_only_dirs(&sd, &[(host.clone(), state.clone())]);
        assert!(!state.join("removed.json").exists());
        assert!(state.join(".gitignore").exists());
        // Nothing outside the state dir is ever a target.
        assert_eq!(expand_read_only_dirs(&sd, &[(host.clone(), dir.path().join("elsewhere"))]), vec![]);
    }

    // Compiled everywhere, run only where `cfg(linux_sandbox)` is off (macOS, BSDs): Linux CI never runs it; there
    // `.ci/run`'s `ACP_SANDBOX_PORTABLE_CHECK=1 cargo check` proves that the rest compiles without the sandbox.
    #[cfg(not(linux_sandbox))]
    #[test]
    fn off_linux_bwrap_is_refused_with_what_to_use_and_auto_runs_without_isolation() {
        let refusal =
            "the local sandbox (bubblewrap) needs Linux; use --sandbox e2b, --sandbox daytona, or --sandbox none";
        let settings = |isolation| test_config(Path::new("/data")).local_settings(isolation);
        match LocalProvider::choose("/data/sessions".into(), SandboxChoice::Bwrap, settings) {
            Err(SandboxError::Unavailable(why)) => {
                assert_eq!(why, format!("--sandbox bwrap cannot work here: {refusal}"))
            }
            Err(other) => panic!("not the refusal: {other}"),
            Ok(_) => panic!("--sandbox bwrap was accepted"),
        }
        for choice in [SandboxChoice::Auto, SandboxChoice::None] {
            let provider = LocalProvider::choose("/data/sessions".into(), choice, settings).unwrap();
            assert!(matches!(provider.settings().isolation, Isolation::None(_)), "{choice:?}");
            assert_eq!(provider.settings().init_program, None, "no sandbox-init off Linux");
        }
        let auto = LocalProvider::choose("/data/sessions".into(), SandboxChoice::Auto, settings).unwrap();
        assert_eq!(auto.unconfined(), Some(refusal.to_string()));
        assert!(!auto.private_network());
    }

    #[test]
    fn only_plain_state_dirs_of_ours_are_sandbox_ids() {
        let provider = LocalProvider::new(
            "/data/sessions".into(),
            Arc::new(test_config(Path::new("/data")).local_settings(Isolation::None("test".into()))),
        );
        assert_eq!(provider.owned("/data/sessions/sess_1"), Some(PathBuf::from("/data/sessions/sess_1")));
        for bad in [
            "/",
            "",
            "sess_1",
            "../../victim",
            "/data/sessions/../../victim",
            "/data/sessions/a/b",
            "/data/sessions/..",
        ] {
            assert_eq!(provider.owned(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn trimming_drops_the_review_copy_with_its_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let sessions = dir.path().join("sessions");
        let provider = LocalProvider::new(
            sessions.clone(),
            Arc::new(test_config(dir.path()).local_settings(Isolation::None("test".into()))),
        );
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let spec = SandboxSpec { session_id: "s1".into(), workspace: ws, roots: Vec::new() };
        let id = provider.create(&spec).await.unwrap();
        let review = Path::new(&id).join("review");
        std::fs::create_dir_all(review.join("copy")).unwrap();
        std::fs::write(review.join("copy/a.txt"), "a").unwrap();
        std::fs::write(review.join("manifest.json"), "{}").unwrap();
        assert!(provider.trim(&id).await.unwrap());
        assert_eq!(std::fs::read_dir(&review).unwrap().count(), 0);
        assert!(Path::new(&id).join("home").is_dir());
    }

    #[tokio::test]
    async fn a_sandbox_something_still_runs_in_keeps_its_caches() {
        let dir = tempfile::tempdir().unwrap();
        let provider = LocalProvider::new(
            dir.path().join("sessions"),
            Arc::new(test_config(dir.path()).local_settings(Isolation::None("test".into()))),
        );
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let id =
            provider.create(&SandboxSpec { session_id: "s1".into(), workspace: ws, roots: Vec::new() }).await.unwrap();
        std::fs::write(Path::new(&id).join("cache/plugin.js"), "x").unwrap();
        let mut running =
            std::process::Command::new("sleep").arg("30").env("HOME", Path::new(&id).join("home")).spawn().unwrap();
        let kept = provider.trim(&id).await.unwrap();
        running.kill().unwrap();
        running.wait().unwrap();
        assert!(!kept, "a cache in use was emptied");
        assert!(Path::new(&id).join("cache/plugin.js").exists());
        assert!(provider.trim(&id).await.unwrap(), "once nothing runs there, it is emptied");
        assert!(!Path::new(&id).join("cache/plugin.js").exists());
    }

    /// The pid a command wrote to `file`, once it has.
    async fn pid_written(file: &Path) -> i32 {
        loop {
            if let Ok(text) = std::fs::read_to_string(file)
                && let Ok(pid) = text.trim().parse::<i32>()
            {
                return pid;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn kill_tree_reaches_children_that_left_the_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child.pid");
        let mut sandbox = sandbox(dir.path(), Isolation::None("test".into()));
        // Without the supervisor, so that the bridge's own tree walk is what is tested.
        Arc::get_mut(&mut sandbox.settings).unwrap().init_program = None;
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
        let grandchild = pid_written(&pid_file).await;
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
    #[tokio::test]
    async fn a_commands_end_leaves_the_other_running_commands_of_its_sandbox_alone() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("server.pid");
        let mut sandbox = sandbox(dir.path(), Isolation::None("test".into()));
        Arc::get_mut(&mut sandbox.settings).unwrap().init_program = None;
        // Both carry the session's HOME, as a warm server and a turn's command do: the one that ends looks for
        // orphans with that HOME, and the other, the bridge's own running child, is none.
        let spec = |script: String| ExecSpec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script],
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("HOME".into(), sandbox.state_dir().join("home").display().to_string()),
            ],
            cwd: dir.path().into(),
            ..ExecSpec::default()
        };
        let mut server =
            sandbox.exec(spec(format!("echo $$ > {}; exec sleep 1000", pid_file.display()))).await.unwrap();
        let pid = pid_written(&pid_file).await;
        let mut short = sandbox.exec(spec("true".into())).await.unwrap();
        assert!(short.handle.wait().await.unwrap().success());
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = state.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'));
        assert!(running, "the other command ({pid}) was ended with the short one: {state:?}");
        server.handle.kill().await;
        assert_eq!(server.handle.wait().await.unwrap().signal, Some(9));
    }
}
