//! Sandboxes: where a session's CLI runs. The only module that spawns processes.
//!
//! A [`SandboxProvider`] creates, reconnects to, suspends and destroys the sandbox of one session; a
//! [`Sandbox`] runs commands in it with streamed stdout and stderr. The local provider (bubblewrap, Landlock or
//! a plain process group) is the embedded default; remote providers (E2B, Daytona) fit the same shape: their
//! ids are persisted with the session, and `connect` answers `None` when the sandbox is gone.

// The one place allowed to start processes (clippy.toml bans it elsewhere).
#[allow(clippy::disallowed_methods)]
pub mod host;
#[allow(clippy::disallowed_methods)]
pub mod install;
#[allow(clippy::disallowed_methods)]
pub mod local;
pub mod net;
pub mod package;
pub mod process;
pub mod progress;
pub mod remote;

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite};

/// Which sandbox runs the CLIs.
#[derive(Clone, Copy)]
pub enum SandboxChoice {
    /// bubblewrap when its probe works, else the Landlock sandbox, else prompts are refused with the reason.
    Auto,
    /// bubblewrap, and a clear error when it cannot work here.
    Bwrap,
    /// The Landlock + seccomp sandbox without namespaces, and a clear error when the kernel cannot hold it.
    Landlock,
    /// A plain process group in the workspace: no isolation.
    None,
    /// A sandbox per session of a remote provider (preview).
    Remote(&'static dyn remote::Remote),
}

/// Every choice `--sandbox` offers: the local ones, then each remote provider's.
static CHOICES: std::sync::LazyLock<Vec<SandboxChoice>> = std::sync::LazyLock::new(|| {
    let local = [SandboxChoice::Auto, SandboxChoice::Bwrap, SandboxChoice::Landlock, SandboxChoice::None];
    local.into_iter().chain(remote::REMOTES.iter().map(|remote| SandboxChoice::Remote(*remote))).collect()
});

impl SandboxChoice {
    /// The name used on the command line and in `doctor`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxChoice::Auto => "auto",
            SandboxChoice::Bwrap => "bwrap",
            SandboxChoice::Landlock => "landlock",
            SandboxChoice::None => "none",
            SandboxChoice::Remote(remote) => remote.name(),
        }
    }

    /// Whether sessions run in a remote provider's sandboxes.
    pub fn is_remote(self) -> bool {
        matches!(self, SandboxChoice::Remote(_))
    }
}

impl PartialEq for SandboxChoice {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for SandboxChoice {}

impl std::fmt::Debug for SandboxChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl clap::ValueEnum for SandboxChoice {
    fn value_variants<'a>() -> &'a [Self] {
        &CHOICES
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            SandboxChoice::Auto => "bubblewrap when it works here, else the Landlock sandbox, else prompts are refused",
            SandboxChoice::Bwrap => "bubblewrap, and a clear error when it cannot work here",
            SandboxChoice::Landlock => "Landlock and seccomp without namespaces (Linux 6.7+), or a clear error",
            SandboxChoice::None => "A plain process group in the workspace: no isolation",
            SandboxChoice::Remote(remote) => remote.help(),
        };
        Some(clap::builder::PossibleValue::new(self.as_str()).help(help))
    }
}

/// How the agent's writes reach the workspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkspaceMode {
    /// The workspace is bound writable: the agent's writes land in the user's files.
    #[default]
    Direct,
    /// The agent works on a copy of the workspace; its text edits reach the user's files through the editor.
    Review,
}

/// Why there is no local sandbox here (it is Linux's: `cfg(linux_sandbox)`), and what to choose instead: what
/// `--sandbox bwrap`, `auto` and `doctor` say off Linux.
pub fn needs_linux() -> String {
    let remotes: Vec<String> = remote::REMOTES.iter().map(|remote| format!("--sandbox {}", remote.name())).collect();
    format!("the local sandbox (bubblewrap) needs Linux; use {}, or --sandbox none", remotes.join(", "))
}

/// The provider of the sessions' sandboxes as `--sandbox` chose it: the one place that knows every provider.
/// `local` serves `auto`, `bwrap`, `landlock` and `none`, and the bridge's own short commands whatever the choice.
/// `var` reads the providers' settings (the environment, and a key `acp-sandbox login --provider` stored).
pub fn session_provider(
    choice: SandboxChoice,
    local: Arc<dyn SandboxProvider>,
    var: impl Fn(&str) -> Option<String> + Sync,
) -> Result<Arc<dyn SandboxProvider>, SandboxError> {
    match choice {
        SandboxChoice::Remote(remote) => remote.open(&var),
        SandboxChoice::Auto | SandboxChoice::Bwrap | SandboxChoice::Landlock | SandboxChoice::None => Ok(local),
    }
}

/// How `doctor` rates one of its lines about a remote provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckLevel {
    /// What was found, and it works.
    Ok,
    /// Worth knowing, not a problem (a key set for a provider that is not selected).
    Info,
    /// A session would fail: `doctor` exits non-zero.
    Error,
}

/// One line `doctor` prints about a remote provider. Never holds a key's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckLine {
    /// How it is rated.
    pub level: CheckLevel,
    /// The words.
    pub text: String,
}

impl CheckLine {
    pub fn ok(text: impl Into<String>) -> Self {
        CheckLine { level: CheckLevel::Ok, text: text.into() }
    }

    pub fn info(text: impl Into<String>) -> Self {
        CheckLine { level: CheckLevel::Info, text: text.into() }
    }

    pub fn error(text: impl Into<String>) -> Self {
        CheckLine { level: CheckLevel::Error, text: text.into() }
    }
}

/// What `doctor` says about each remote provider that is selected (`--sandbox`) or configured (its key is in the
/// environment `var` reads), by provider name: the selected one is checked against its API (key, reachability,
/// template or snapshot, what a session would use); one that is only configured gets a short INFO line. The one
/// place besides [`session_provider`] that knows every provider.
pub async fn check_remote_providers(
    choice: SandboxChoice,
    var: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Vec<(&'static str, Vec<CheckLine>)> {
    let mut reports = Vec::new();
    for &remote in remote::REMOTES {
        let (name, key, what) = (remote.name(), remote.key_variable(), remote.one_sandbox());
        let lines = if choice == SandboxChoice::Remote(remote) {
            remote.check(var).await
        } else if var(key).is_some_and(|value| !value.trim().is_empty()) {
            vec![CheckLine::info(format!(
                "{key} is set, but sessions run with --sandbox {}; --sandbox {name} would run each in {what} of its \
                 own",
                choice.as_str()
            ))]
        } else {
            continue;
        };
        reports.push((name, lines));
    }
    reports
}

/// A path segment for a provider's URL, percent-encoded: ids come from the store, names from the user (a
/// template's may hold a namespace's `/`), and neither may leave its segment.
pub(crate) fn path_segment(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, UNRESERVED).to_string()
}

/// The variables that say how a program in a sandbox reaches the network: its proxies and CA bundles. Every CLI
/// gets them from the bridge's environment, and a stdio MCP server keeps them from its agent's.
pub const NETWORK_ENV: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
];

/// What a URL carries unencoded anywhere: RFC 3986's unreserved characters. Every other byte is encoded.
pub(crate) const UNRESERVED: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// A sandbox failure.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The requested isolation cannot work on this machine (e.g. `--sandbox bwrap` without bubblewrap).
    #[error("sandbox unavailable: {0}")]
    Unavailable(String),
    /// The sandbox's files could not be prepared.
    #[error("sandbox: {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The command could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The turn was cancelled while this was being done (an install); the caller answers `cancelled`.
    #[error("cancelled")]
    Cancelled,
    /// Installing a CLI failed.
    #[error("installing {package} failed: {message}")]
    Install {
        /// The npm package.
        package: String,
        /// npm's words.
        message: String,
    },
    /// A remote provider (E2B) refused or failed a request.
    #[error("{provider}: {message}")]
    Remote {
        /// The provider's name.
        provider: &'static str,
        /// What kind of failure, for the caller to act on (a gone sandbox is replaced, an auth error shown).
        failure: RemoteFailure,
        /// What happened and what to do, in words for the user.
        message: String,
    },
}

/// The kinds of failure of a remote provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteFailure {
    /// The API key or access token was refused (401/403).
    Auth,
    /// The sandbox (or the process, the file) does not exist (404).
    NotFound,
    /// A rate or concurrency limit (429).
    RateLimited,
    /// The service could not be reached.
    Unreachable,
    /// The service answered what the protocol does not allow.
    Protocol,
    /// Any other refusal.
    Failed,
}

impl SandboxError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SandboxError::Io { what: what.into(), source }
    }
}

/// What a session's sandbox is made for.
#[derive(Clone, Debug)]
pub struct SandboxSpec {
    /// Our session id.
    pub session_id: String,
    /// The editor's workspace, writable by the CLI.
    pub workspace: PathBuf,
    /// The workspace's other roots (ACP's `additionalDirectories`), checked and absolute: writable like the
    /// workspace, with the same protected paths, at their own host paths. Only a local sandbox takes them.
    pub roots: Vec<PathBuf>,
}

/// One command to run inside a sandbox.
#[derive(Clone, Debug, Default)]
pub struct ExecSpec {
    /// The executable (absolute, or looked up on the sandbox's PATH).
    pub program: PathBuf,
    /// Its arguments, passed as they are (never through a shell).
    pub args: Vec<String>,
    /// The complete environment: nothing else is inherited.
    pub env: Vec<(String, String)>,
    /// Working directory (also exported as `PWD`, which OpenCode reads instead of getcwd).
    pub cwd: PathBuf,
    /// Written to stdin, which is then closed: both CLIs read stdin to EOF and hang on an open pipe.
    pub stdin: Vec<u8>,
    /// The command talks on its stdin for as long as it runs (an ACP agent): [`RunningProcess::stdin`] is its pipe,
    /// and `stdin` above is not written. Only a local sandbox runs such a command.
    pub interactive: bool,
    /// Host paths made visible read-only at a path inside the sandbox (the user's own CLI configuration).
    pub read_only: Vec<(PathBuf, PathBuf)>,
    /// Host files shown read-write at a path inside the sandbox (a login the CLI refreshes: Codex's `auth.json`).
    /// Only a local sandbox takes them.
    pub writable: Vec<(PathBuf, PathBuf)>,
    /// Directories of the CLI's installation, shown read-only wherever they are (`/tmp`, the data dir).
    pub tools: Vec<PathBuf>,
    /// Where the CLI must be able to connect whatever the network policy.
    pub net: NetAccess,
    /// The command is a server listening on 127.0.0.1 at this port inside the sandbox: the bridge reaches it
    /// through [`RunningProcess::door`]. The port must be free on the host too (`--sandbox none` shares its network).
    pub serve_port: Option<u16>,
    /// With `serve_port`, a local server that may outlive the bridge (`--keep-warm`): adopted when one kept for the
    /// same key and the same command runs, else started so that the next bridge can adopt it.
    pub keep_warm: Option<local::warm::KeepWarm>,
}

/// What a CLI must reach: its model endpoints (exact host:port, allowed even on loopback or private ranges) and
/// its own service (allowed under `--network allow=…`).
#[derive(Clone, Debug, Default)]
pub struct NetAccess {
    /// Exact host:port pairs.
    pub endpoints: Vec<(String, u16)>,
    /// Domains (and their subdomains).
    pub service_hosts: Vec<String>,
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it, when it was killed.
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// Exited with status 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// A human description: "exit code 3" or "signal 9".
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            (None, None) => "an unknown status".to_string(),
        }
    }
}

/// A byte stream from a running process.
pub type OutputStream = Pin<Box<dyn AsyncRead + Send>>;

/// A byte stream both ways: one connection through a [`Door`].
pub trait Duplex: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Duplex for T {}

/// The way into a server that runs in a sandbox ([`ExecSpec::serve_port`]): each `connect` is a new connection to
/// its port inside, wherever the sandbox runs, so what talks to the server does not care where that is.
#[async_trait]
pub trait Door: Send + Sync + std::fmt::Debug {
    /// A new connection to the server's port.
    async fn connect(&self) -> std::io::Result<Pin<Box<dyn Duplex>>>;
}

/// A local sandbox's door: a unix socket on the host, private to the bridge, spliced to the port inside by the
/// sandbox's first process (`sandbox-init --door-fd`).
#[derive(Clone, Debug)]
pub struct UnixDoor(pub PathBuf);

#[async_trait]
impl Door for UnixDoor {
    async fn connect(&self) -> std::io::Result<Pin<Box<dyn Duplex>>> {
        Ok(Box::pin(tokio::net::UnixStream::connect(&self.0).await?))
    }
}

/// A started command: its output streams and a handle to end it.
pub struct RunningProcess {
    /// With [`ExecSpec::interactive`]: the process's stdin, open until dropped.
    pub stdin: Option<Pin<Box<dyn AsyncWrite + Send>>>,
    /// The process's stdout.
    pub stdout: OutputStream,
    /// The process's stderr.
    pub stderr: OutputStream,
    /// Waits for or ends the process.
    pub handle: Box<dyn ProcessHandle>,
    /// With [`ExecSpec::serve_port`]: the way to the server inside (locally a unix socket on the host, private to
    /// the bridge, removed when the process ends).
    pub door: Option<Arc<dyn Door>>,
    /// The server was not started but adopted (`ExecSpec::keep_warm`): its secret, as the bridge that started it
    /// gave it. Nothing of its output comes (that went to the bridge that started it).
    pub adopted: Option<String>,
}

/// Control over a started command.
#[async_trait]
pub trait ProcessHandle: Send {
    /// Ends the process and everything it started, at once. Calling it again does nothing.
    async fn kill(&mut self);
    /// Waits until the process exits. Cancel-safe: it may be raced against output and timers.
    async fn wait(&mut self) -> Result<ExitInfo, SandboxError>;
    /// Ends what the command's turns left running beside it (a server's sandbox outlives its turns): every
    /// process of the sandbox outside the command's own tree. Does nothing where the sandbox cannot tell.
    fn end_strays(&self) {}
    /// The processes of the command's tree now, for [`ProcessHandle::end_new_groups`]. Empty where the sandbox
    /// cannot tell.
    fn tree(&self) -> std::collections::HashSet<i32> {
        std::collections::HashSet::new()
    }
    /// Ends, with all they started, the process groups that processes of the command's tree lead and that were not
    /// in `before` (a [`ProcessHandle::tree`]): the commands an agent's stopped turn started, each in a group of its
    /// own, which it may leave running after it answered the cancel. The command itself runs on.
    fn end_new_groups(&self, _before: &std::collections::HashSet<i32>) {}
    /// What the command's whole tree is doing now (CPU time used, anything running), for a start that waits as
    /// long as it progresses ([`progress`]). `None`: gone, or the sandbox cannot tell.
    fn activity(&self) -> Option<process::Activity> {
        None
    }
    /// Whether the sandbox ran into its process or memory limit, in words for the user.
    fn limit_hit(&self) -> Option<String> {
        None
    }
    /// Leaves a kept-warm server running past the bridge (`ExecSpec::keep_warm`): dropping the handle then no
    /// longer ends it. Does nothing for any other command, which still ends when the handle is dropped.
    fn detach(&mut self) {}
}

/// A live sandbox of one session.
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// Where the editor's workspace appears to commands in this sandbox.
    fn workspace(&self) -> &Path;
    /// The session's private state dir in the sandbox: the CLI's HOME and XDG dirs live under it and
    /// persist across turns, restarts of the bridge and restarts of the sandbox.
    fn state_dir(&self) -> &Path;
    /// One line for logs and `doctor`: what isolates this sandbox.
    fn isolation(&self) -> String;
    /// Starts a command with streamed output.
    async fn exec(&self, spec: ExecSpec) -> Result<RunningProcess, SandboxError>;
    /// Writes a file the CLI needs (an attachment) at `path` below the state dir, replacing whatever is there and
    /// never following a link the agent planted.
    async fn write_state_file(&self, path: &Path, bytes: &[u8]) -> Result<(), SandboxError>;
    /// In review mode (`--workspace review`): the agent's copy of the workspace, whose changes reach the user's
    /// files only through the session's review. `None` when the agent writes the workspace itself.
    fn review_copy(&self) -> Option<Arc<crate::workspace::review::WorkspaceCopy>> {
        None
    }
    /// This connection to the sandbox found it asleep and woke it (E2B's resume of a pause): what was started
    /// through an earlier connection lost its streams, and is not reached through this one.
    fn woke(&self) -> bool {
        false
    }
    /// A remote sandbox (its workspace is on its own disk, not the user's): its files, through which the session
    /// uploads the workspace, brings the agent's changes back for review and stages what a turn needs. `None` for
    /// a sandbox that sees the user's files where they are.
    fn remote_files(&self) -> Option<&dyn RemoteFiles> {
        None
    }
    /// Moves what a command of this sandbox created at a protected path that did not exist out of the user's
    /// workspace (into the session's quarantine), and answers what was moved since the last call, by this call
    /// or by the watch each running command keeps (`protect.rs`). Empty where the agent does not write the user's
    /// files (review mode, remote sandboxes): there a creation is a change the review handles.
    fn sweep_protected(&self) -> Vec<local::protect::Moved> {
        Vec::new()
    }
    /// Where the agent's files are on this machine, for answering its file requests here by descriptor (never
    /// through a link, so a link swapped in between a check and an open cannot lead elsewhere). `None` for a remote
    /// sandbox, whose files are reached by commands in it.
    fn host_files(&self) -> Option<HostFiles> {
        None
    }
    /// Ends what commands of this session a bridge that is gone (killed mid-turn) left running in the sandbox, with
    /// everything they started, and answers how many it found. Called before a turn runs anything in a sandbox that
    /// outlives the bridge; a local sandbox's leftovers are ended when a bridge starts (`Bridge::reap_leftovers`).
    async fn end_leftovers(&self) -> Result<usize, SandboxError> {
        Ok(0)
    }
}

/// A local sandbox's files as its agent sees them ([`Sandbox::host_files`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostFiles {
    /// Each root (the workspace first) as the agent sees it, and the folder on this machine that it shows (in review
    /// mode the workspace shows the agent's copy).
    pub roots: Vec<(PathBuf, PathBuf)>,
    /// What the sandbox hides, as the agent sees it: asked for, it is answered as a file that does not exist.
    pub hidden: Vec<PathBuf>,
    /// What the sandbox shows read-only in the roots (the protected paths), as the agent sees it.
    pub protected: Vec<PathBuf>,
}

/// The files of a remote sandbox, reached through its provider's API (never through a command line, which a
/// provider may record).
#[async_trait]
pub trait RemoteFiles: Send + Sync {
    /// Writes `bytes` at the absolute `path` in the sandbox, creating its parents and replacing what is there.
    async fn write(&self, path: &Path, bytes: &[u8]) -> Result<(), SandboxError>;
    /// Reads the file at the absolute `path` in the sandbox; `None` when there is none.
    async fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError>;
    /// Reads at most `limit + 1` bytes of the file at `path` (more than `limit`: the file is larger), never holding
    /// more in memory where the provider streams; `None` when there is none.
    async fn read_at_most(&self, path: &Path, limit: u64) -> Result<Option<Vec<u8>>, SandboxError> {
        let bytes = self.read(path).await?;
        Ok(bytes.map(|mut bytes| {
            bytes.truncate(usize::try_from(limit.saturating_add(1)).unwrap_or(usize::MAX));
            bytes
        }))
    }
    /// Downloads the file at `path` into a new file at `dest` on the host (nothing may be there), a chunk at a time
    /// as it arrives, never holding it whole where the provider streams: past `limit` bytes the download stops, what
    /// was written is removed and the answer is [`remote::download::Downloaded::TooLarge`]. A failure leaves nothing at
    /// `dest` either.
    async fn download_to(
        &self,
        path: &Path,
        dest: &Path,
        limit: u64,
    ) -> Result<remote::download::Downloaded, SandboxError> {
        remote::download::save_bytes(self.read_at_most(path, limit).await?, dest, limit).await
    }
}

/// Creates and finds sandboxes of one kind.
#[async_trait]
pub trait SandboxProvider: Send + Sync {
    /// Persisted next to the sandbox id, so a session always returns to the provider that owns its sandbox.
    fn name(&self) -> &'static str;
    /// Creates a sandbox for a session and returns its id.
    async fn create(&self, spec: &SandboxSpec) -> Result<String, SandboxError>;
    /// Reconnects to an existing sandbox (resuming it if suspended); `None` when it no longer exists.
    async fn connect(&self, id: &str, spec: &SandboxSpec) -> Result<Option<Arc<dyn Sandbox>>, SandboxError>;
    /// Lets the sandbox sleep between turns, where the provider can.
    async fn suspend(&self, id: &str) -> Result<(), SandboxError>;
    /// Frees the sandbox and everything in it. Destroying a missing sandbox succeeds.
    async fn destroy(&self, id: &str) -> Result<(), SandboxError>;
    /// Frees what a sandbox keeps only to be faster: the CLI's caches (downloaded plugins, npm's cache), which the
    /// CLI fetches again when it needs them. Called for sessions long unused; a sandbox something still runs in is
    /// left alone. Answers whether anything was there to free.
    async fn trim(&self, _id: &str) -> Result<bool, SandboxError> {
        Ok(false)
    }
    /// Why this provider's sandboxes would not confine the CLI at all, if they would not: the user is told once.
    fn unconfined(&self) -> Option<String> {
        None
    }

    /// What this provider's sandboxes do not hold that bubblewrap's would, if anything: the user is told once.
    fn weaker(&self) -> Option<String> {
        None
    }

    /// Why no sandbox can be made here for what the user chose, if none can: every prompt fails with it.
    fn refusal(&self) -> Option<String> {
        None
    }

    /// What its sandboxes are, in words, for the log.
    fn describe(&self) -> String {
        self.name().to_string()
    }

    /// Whether its sandboxes run on this machine (they see its files and its tools cache).
    fn runs_here(&self) -> bool {
        false
    }

    /// Whether each sandbox has a network of its own, so that a server's port inside is private to it.
    fn private_network(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[tokio::test]
    async fn a_provider_neither_selected_nor_configured_is_not_mentioned_and_a_configured_one_is_one_line() {
        let none = |_: &str| None;
        assert_eq!(check_remote_providers(SandboxChoice::Auto, &none).await, vec![]);
        let keys = |name: &str| matches!(name, "E2B_API_KEY" | "DAYTONA_API_KEY").then(|| "k".to_string());
        assert_eq!(
            check_remote_providers(SandboxChoice::Bwrap, &keys).await,
            vec![
                (
                    "e2b",
                    vec![CheckLine::info(
                        "E2B_API_KEY is set, but sessions run with --sandbox bwrap; --sandbox e2b would run each in an \
                     E2B sandbox of its own"
                    )]
                ),
                (
                    "daytona",
                    vec![CheckLine::info(
                        "DAYTONA_API_KEY is set, but sessions run with --sandbox bwrap; --sandbox daytona would run each \
                     in a Daytona sandbox of its own"
                    )]
                ),
            ]
        );
        // Selected without its key: one error, and nothing is asked of the provider.
        let blank = |name: &str| (name == "DAYTONA_API_KEY").then(|| "  ".to_string());
        let reports = check_remote_providers(SandboxChoice::Remote(&remote::daytona::Daytona), &blank).await;
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].1[0].level, CheckLevel::Error);
    }

    #[test]
    fn path_segments_cannot_leave_their_place() {
        assert_eq!(path_segment("base"), "base");
        assert_eq!(path_segment("team/tpl:v2"), "team%2Ftpl%3Av2");
        assert_eq!(path_segment("../x y"), "..%2Fx%20y");
    }
}
