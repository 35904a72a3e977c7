//! Resolved settings of one bridge process: flags and environment, merged with defaults.

use std::path::PathBuf;
use std::time::Duration;

use crate::agents::{AgentKind, AgentSettings};
use crate::paths;
use crate::sandbox::local::limits::Limits;
use crate::sandbox::local::policy::{Policy, Profile};
use crate::sandbox::local::{Isolation, LocalSettings};
use crate::sandbox::net::proxy::NetworkMode;
use crate::sandbox::{SandboxChoice, WorkspaceMode};

/// What a remote sandbox (E2B, Daytona) does between turns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RemoteIdle {
    /// Suspended once each turn ended (E2B pauses it, Daytona stops it); the next prompt resumes it.
    #[default]
    Pause,
    /// Left running until the provider's own idle timeout.
    Keep,
}

/// Everything the library needs to know about how it was started.
#[derive(Clone, Debug)]
pub struct Config {
    /// The agent that new sessions run.
    pub agent: AgentKind,
    /// Every agent's own settings.
    pub agents: AgentSettings,
    /// The sandbox choice for new sessions.
    pub sandbox: SandboxChoice,
    /// Root of the store, the per-session state and the CLI install cache.
    pub data_dir: PathBuf,
    /// Model for OpenCode (`provider/model`) or mode for Amp, when the user picked one on the command line.
    pub model: Option<String>,
    /// A turn that prints nothing for this long is ended with an error and its process tree killed.
    pub idle_timeout: Duration,
    /// At most this many updates are replayed by `session/load`; older turns are cut with a visible note.
    pub replay_limit: usize,
    /// How long a write to the store waits for another process's lock before the store reports it locked.
    pub store_busy_timeout: Duration,
    /// Context window size reported in `usage_update` when the model's own is unknown.
    pub context_window: u64,
    /// How much of the home the sandbox shows.
    pub profile: Profile,
    /// Hidden in the sandbox on top of the built-in secrets.
    pub deny_read: Vec<PathBuf>,
    /// Shown read-only in the sandbox even where it would be hidden.
    pub allow_read: Vec<PathBuf>,
    /// Read-only inside the workspace on top of the built-in protected paths.
    pub protect: Vec<PathBuf>,
    /// Variables of the bridge's environment passed to the CLI on top of what it needs.
    pub pass_env: Vec<String>,
    /// A turn running longer than this is ended with an error and its process tree killed.
    pub turn_timeout: Duration,
    /// Where the sandbox may connect.
    pub network: NetworkMode,
    /// Processes and memory of one sandbox.
    pub limits: Limits,
    /// Whether the agent's edits go through the editor's review first.
    pub workspace: WorkspaceMode,
    /// A warm server unused for this long is stopped.
    pub server_idle_timeout: Duration,
    /// At most this many warm servers run at once.
    pub max_servers: usize,
    /// Whether the sessions of one workspace share a sandbox and a warm server.
    pub server_scope: ServerScope,
    /// `--keep-warm`: a local warm server outlives its bridge for this long, for the next bridge to adopt.
    /// `None` (the default, and `0`) keeps none, and stops those an earlier bridge kept.
    pub keep_warm: Option<Duration>,
    /// What a remote sandbox does between turns.
    pub remote_idle: RemoteIdle,
    /// `--remote-upload-secrets`: a remote sandbox gets the workspace's secret files too (`.env*`, private keys,
    /// the paths the local policy hides in the home); kept back otherwise.
    pub remote_upload_secrets: bool,
}

/// What one warm server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerScope {
    /// The new sessions of one workspace (same agent, same sandbox policy) share one sandbox and one server, each
    /// its own OpenCode session there: a new thread starts no server. The workspace is the trust boundary.
    Workspace,
    /// Every session its own sandbox and server.
    Session,
}

impl Config {
    /// What every local sandbox of a bridge started with these settings is made of.
    pub fn local_settings(&self, isolation: Isolation) -> LocalSettings {
        LocalSettings {
            isolation,
            policy: self.policy(),
            network: self.network.clone(),
            limits: self.limits,
            run_dir: paths::run_dir(&self.data_dir),
            // `sandbox-init` is Linux's (`local/init.rs`): elsewhere the CLI runs as the process group's leader.
            init_program: if cfg!(linux_sandbox) { std::env::current_exe().ok() } else { None },
            workspace_mode: self.workspace,
        }
    }

    /// A config for tests and tools: the given agent and data dir, defaults elsewhere.
    pub fn new(agent: AgentKind, data_dir: PathBuf) -> Self {
        Self {
            agent,
            agents: AgentSettings::default(),
            sandbox: SandboxChoice::Auto,
            data_dir,
            model: None,
            idle_timeout: Duration::from_secs(600),
            replay_limit: 5000,
            store_busy_timeout: crate::store::DEFAULT_BUSY_TIMEOUT,
            context_window: 200_000,
            profile: Profile::Default,
            deny_read: Vec::new(),
            allow_read: Vec::new(),
            protect: Vec::new(),
            pass_env: Vec::new(),
            turn_timeout: Duration::from_secs(30 * 60),
            network: NetworkMode::Open,
            limits: Limits::default(),
            workspace: WorkspaceMode::Direct,
            server_idle_timeout: Duration::from_secs(600),
            max_servers: 4,
            server_scope: ServerScope::Workspace,
            keep_warm: None,
            remote_idle: RemoteIdle::Pause,
            remote_upload_secrets: false,
        }
    }

    /// What the local sandbox hides, shows and protects.
    pub fn policy(&self) -> Policy {
        let path_dirs = std::env::var_os("PATH").map(|path| std::env::split_paths(&path).collect()).unwrap_or_default();
        Policy {
            profile: self.profile,
            home: crate::paths::home(),
            data_dir: self.data_dir.clone(),
            runtime_dir: std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
            path_dirs,
            deny_read: self.deny_read.clone(),
            allow_read: self.allow_read.clone(),
            protect: self.protect.clone(),
        }
    }

    /// The SQLite database file.
    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join("acp-sandbox.sqlite3")
    }

    /// The log file, next to the database.
    pub fn log_path(&self) -> PathBuf {
        self.data_dir.join("acp-sandbox.log")
    }

    /// The override executable for an agent, if any.
    pub fn bin_override(&self, agent: AgentKind) -> Option<&PathBuf> {
        agent.bin_override(&self.agents)
    }
}
