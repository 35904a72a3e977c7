//! The command line: `serve` (the default, for editors), `prompt`, `sessions` and `doctor` (for people), and the
//! hidden `sandbox-init`, the entry process inside a sandbox.
//!
//! Only the terminal commands print to stdout; `serve` leaves stdout to the ACP connection and `sandbox-init` to the
//! CLI it runs.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acp_sandbox::agents::AgentKind;
use acp_sandbox::config::{Config, OpenCodeModels, SandboxChoice};
use acp_sandbox::error::to_acp_error;
use acp_sandbox::locate::Location;
use acp_sandbox::sandbox::CheckLevel;
use acp_sandbox::sandbox::local::{Isolation, probe_bwrap};
use acp_sandbox::sandbox::policy::Profile;
use acp_sandbox::sandbox::proxy::NetworkMode;
use acp_sandbox::session::{Bridge, UpdateSink};
use acp_sandbox::store::{TurnStatus, rfc3339};
use acp_sandbox::terminal::{Render, stop_reason_words};
use agent_client_protocol::RawJsonRpcMessage;
use agent_client_protocol::v1::schema::{CLIENT_METHOD_NAMES, ContentBlock, SessionNotification, SessionUpdate};
use anyhow::Context;
use clap::{Args, Parser, Subcommand};

/// Run the Amp or OpenCode coding agent in a sandbox, for editors that speak the Agent Client Protocol.
#[derive(Parser, Debug)]
#[command(name = "acp-sandbox", version, about)]
struct Cli {
    #[command(flatten)]
    settings: Settings,
    #[command(subcommand)]
    command: Option<Invocation>,
}

#[derive(Subcommand, Debug)]
enum Invocation {
    #[command(flatten)]
    Command(Command),
    /// Inside a sandbox: open its network doors to the bridge's proxy, then run PROGRAM (internal).
    #[command(hide = true)]
    SandboxInit(SandboxInit),
}

#[derive(Args, Debug)]
struct SandboxInit {
    /// The bridge's proxy socket, as mounted in the sandbox.
    #[arg(long, default_value = acp_sandbox::sandbox::init::PROXY_SOCKET)]
    proxy_socket: PathBuf,
    /// Serve the proxy on 127.0.0.1 at this port (the CLI's HTTP_PROXY).
    #[arg(long)]
    proxy_port: Option<u16>,
    /// Tunnel 127.0.0.1:PORT to the same port on the host (repeatable).
    #[arg(long, value_name = "PORT")]
    expose: Vec<u16>,
    /// A listening unix socket passed by the bridge: splice each connection to 127.0.0.1:--door-port.
    #[arg(long, requires = "door_port")]
    door_fd: Option<i32>,
    /// The port of the server PROGRAM runs, inside the sandbox.
    #[arg(long, requires = "door_fd")]
    door_port: Option<u16>,
    /// Keep PROGRAM and everything it starts from connecting to --door-port (a Landlock rule); refuse to run
    /// where the kernel cannot.
    #[arg(long, requires = "door_port")]
    guard_door: bool,
    /// Keep PROGRAM and everything it starts from making AF_UNIX sockets (a seccomp filter), so no host socket
    /// is reachable by its path.
    #[arg(long)]
    no_unix_sockets: bool,
    /// Be the reaper of PROGRAM's descendants and end them all when it exits or this process is told to stop
    /// (`--sandbox none`, where no PID namespace does it).
    #[arg(long)]
    reap: bool,
    /// A kept-warm server: relay PROGRAM's output (its reader may go away) and end everything once no
    /// connection has come through the door for SECS seconds.
    #[arg(long, requires = "door_port", value_name = "SECS")]
    keep_warm_secs: Option<u64>,
    /// Stop everything once the tree has more than N processes (where no cgroup limits it).
    #[arg(long)]
    max_processes: Option<u64>,
    /// Stop everything once the tree holds more than BYTES of memory (where no cgroup limits it).
    #[arg(long)]
    max_memory: Option<u64>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct Settings {
    /// The agent CLI that new sessions run.
    #[arg(long, global = true, env = "ACP_SANDBOX_AGENT", value_enum, default_value = "opencode")]
    agent: AgentKind,
    /// Where CLIs run: bubblewrap when available (auto), bubblewrap or fail (bwrap), no sandbox (none), or an E2B
    /// or Daytona sandbox per session (e2b, daytona; preview: need E2B_API_KEY, DAYTONA_API_KEY).
    #[arg(long, global = true, env = "ACP_SANDBOX_SANDBOX", value_enum, default_value = "auto")]
    sandbox: SandboxChoice,
    /// How the agent's writes reach your files: at once (direct), or through the editor's review (review).
    #[arg(long, global = true, env = "ACP_SANDBOX_WORKSPACE", value_enum, default_value = "direct")]
    workspace: acp_sandbox::config::WorkspaceMode,
    /// Sessions, logs and installed CLIs live here [default: $XDG_DATA_HOME/acp-sandbox, or
    /// ~/.local/share/acp-sandbox when XDG_DATA_HOME is unset].
    #[arg(long, global = true, env = "ACP_SANDBOX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Default model for OpenCode (`provider/model`) or mode for Amp, for new sessions.
    #[arg(long, global = true, env = "ACP_SANDBOX_MODEL")]
    model: Option<String>,
    /// Run this executable instead of the installed `opencode` (same argv, stdin and environment).
    #[arg(long, global = true, env = "ACP_SANDBOX_OPENCODE_BIN")]
    opencode_bin: Option<PathBuf>,
    /// Run this executable instead of the installed `amp` (same argv, stdin and environment).
    #[arg(long, global = true, env = "ACP_SANDBOX_AMP_BIN")]
    amp_bin: Option<PathBuf>,
    /// End a turn whose CLI prints nothing for this many seconds.
    #[arg(long, global = true, env = "ACP_SANDBOX_IDLE_TIMEOUT", default_value_t = 900)]
    idle_timeout: u64,
    /// When an editor reopens a session, replay at most this many updates (a prompt counts as one): the newest
    /// turns whole and no older ones; a newest turn longer than this keeps its prompt and its newest updates.
    /// Each cut is said in a note.
    #[arg(long, global = true, env = "ACP_SANDBOX_REPLAY_LIMIT", default_value_t = 5000)]
    replay_limit: usize,
    /// How many seconds a write to the session store waits for another program's lock on it.
    #[arg(long, global = true, env = "ACP_SANDBOX_STORE_BUSY_TIMEOUT", default_value_t = 10)]
    store_busy_timeout: u64,
    /// Context window (tokens) shown in the editor's usage meter.
    #[arg(long, global = true, env = "ACP_SANDBOX_CONTEXT_WINDOW", default_value_t = 200_000)]
    context_window: u64,
    /// Amp modes offered in the editor (comma-separated; the first is the default).
    #[arg(
        long,
        global = true,
        env = "ACP_SANDBOX_AMP_MODES",
        value_delimiter = ',',
        default_value = "medium,low,high,ultra"
    )]
    amp_modes: Vec<String>,
    /// Where the sandbox may connect: `open` (any public host), `allow=HOST,...` (those and the CLI's own
    /// service), `none` (only the model endpoints of your config), or `host` (the host's network, unfiltered).
    #[arg(long, global = true, env = "ACP_SANDBOX_NETWORK", default_value = "open")]
    network: NetworkMode,
    /// How much of your home the sandbox shows: `default` (all but secrets) or `strict` (only the workspace,
    /// the CLI's config and the toolchains on PATH).
    #[arg(long, global = true, env = "ACP_SANDBOX_PROFILE", value_enum, default_value = "default")]
    profile: Profile,
    /// Also hide this path from the sandbox (repeatable).
    #[arg(long, global = true, env = "ACP_SANDBOX_DENY_READ", value_delimiter = ',')]
    deny_read: Vec<PathBuf>,
    /// Show this path read-only in the sandbox even where it would be hidden (repeatable).
    #[arg(long, global = true, env = "ACP_SANDBOX_ALLOW_READ", value_delimiter = ',')]
    allow_read: Vec<PathBuf>,
    /// Also keep this path of the workspace read-only (repeatable; relative to the workspace).
    #[arg(long, global = true, env = "ACP_SANDBOX_PROTECT", value_delimiter = ',')]
    protect: Vec<PathBuf>,
    /// Pass this variable of your environment to the CLI (repeatable).
    #[arg(long, global = true, env = "ACP_SANDBOX_PASS_ENV", value_delimiter = ',')]
    pass_env: Vec<String>,
    /// At most this many processes in one sandbox.
    #[arg(long, global = true, env = "ACP_SANDBOX_MAX_PROCESSES")]
    max_processes: Option<u64>,
    /// At most this much memory for one sandbox (`512M`, `8G`) [default: half the machine's].
    #[arg(long, global = true, env = "ACP_SANDBOX_MAX_MEMORY", value_parser = parse_size)]
    max_memory: Option<u64>,
    /// How OpenCode is driven: a warm `opencode serve` per session (serve), or `opencode run` per prompt (run).
    #[arg(long, global = true, env = "ACP_SANDBOX_OPENCODE_BACKEND", value_enum, default_value = "serve")]
    opencode_backend: acp_sandbox::config::OpenCodeBackend,
    /// Stop a warm OpenCode server after this many seconds without a prompt.
    #[arg(long, global = true, env = "ACP_SANDBOX_SERVER_IDLE_TIMEOUT", default_value_t = 600)]
    server_idle_timeout: u64,
    /// At most this many warm OpenCode servers at once (the least recently used is stopped first).
    #[arg(long, global = true, env = "ACP_SANDBOX_MAX_SERVERS", default_value_t = 4)]
    max_servers: usize,
    /// What a warm OpenCode server serves: the new threads of one workspace together, each its own OpenCode
    /// session in one sandbox (workspace), or each thread its own sandbox and server (session).
    #[arg(long, global = true, env = "ACP_SANDBOX_SERVER_SCOPE", value_enum, default_value = "workspace")]
    server_scope: acp_sandbox::config::ServerScope,
    /// Keep a warm OpenCode server running this long after its editor quit (`10m`, `2h`; a bare number is
    /// seconds), for the next start to use at once; 0 keeps none and stops those kept before [default: 0].
    #[arg(long, global = true, env = "ACP_SANDBOX_KEEP_WARM", value_parser = parse_linger, value_name = "DURATION")]
    keep_warm: Option<Duration>,
    /// End a turn still running after this many seconds.
    #[arg(long, global = true, env = "ACP_SANDBOX_TURN_TIMEOUT", default_value_t = 1800)]
    turn_timeout: u64,
    /// What a remote sandbox (`--sandbox e2b`) does between turns: suspended once each turn ended (pause; the next
    /// prompt resumes it), or left running until the provider's own timeout (keep).
    #[arg(long, global = true, env = "ACP_SANDBOX_REMOTE_IDLE", value_enum, default_value = "pause")]
    remote_idle: acp_sandbox::config::RemoteIdle,
    /// Upload the workspace's secret files to a remote sandbox too (`.env*`, private keys such as
    /// `.ssh/id_ed25519`, and the paths the local sandbox hides in the home); without it they stay on this machine
    /// and the turn names them.
    #[arg(long, global = true, env = "ACP_SANDBOX_REMOTE_UPLOAD_SECRETS")]
    remote_upload_secrets: bool,
}

fn parse_size(text: &str) -> Result<u64, String> {
    acp_sandbox::sandbox::limits::parse_size(text).map_err(|e| e.to_string())
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve ACP on stdin/stdout (what editors run; the default).
    Serve,
    /// Run one turn from the terminal and print the updates as they stream.
    Prompt {
        /// The prompt; `-` or nothing reads it from stdin.
        text: Option<String>,
        /// Print the ACP `session/update` notifications instead, exactly as an editor receives them (JSON-RPC),
        /// one per line.
        #[arg(long)]
        json: bool,
        /// Continue this session instead of starting one in the current directory.
        #[arg(long)]
        session: Option<String>,
    },
    /// Inspect the stored sessions.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// Say which CLIs are found, which sandbox is used and why, and which credentials are missing.
    Doctor,
    /// Log in for the agent: Amp asks for its access token and stores it (mode 0600); OpenCode runs its own
    /// `opencode auth login`. With `--provider`, stores a remote sandbox provider's API key instead.
    Login {
        /// Store this provider's API key (E2B_API_KEY, DAYTONA_API_KEY), used when it is not in the environment.
        #[arg(long, value_parser = ["e2b", "daytona"])]
        provider: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum SessionsCommand {
    /// List sessions, newest first.
    List {
        /// Only sessions of this workspace.
        #[arg(long)]
        cwd: Option<PathBuf>,
    },
    /// Show one session and its turns.
    Show {
        /// The session id.
        id: String,
    },
    /// Delete a session and its sandbox.
    Rm {
        /// The session id.
        id: String,
    },
}

impl Settings {
    fn config(&self) -> Config {
        let data_dir = self.data_dir.clone().unwrap_or_else(acp_sandbox::paths::default_data_dir);
        let mut config = Config::new(self.agent, data_dir);
        config.sandbox = self.sandbox;
        config.workspace = self.workspace;
        config.model = self.model.clone();
        config.opencode_bin = self.opencode_bin.clone();
        config.amp_bin = self.amp_bin.clone();
        config.idle_timeout = Duration::from_secs(self.idle_timeout.max(1));
        config.replay_limit = self.replay_limit;
        config.store_busy_timeout = Duration::from_secs(self.store_busy_timeout.max(1));
        config.context_window = self.context_window;
        let modes: Vec<String> =
            self.amp_modes.iter().map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect();
        if !modes.is_empty() {
            config.amp_modes = modes;
        }
        config.network = self.network.clone();
        config.profile = self.profile;
        config.deny_read = self.deny_read.iter().map(|p| absolute(p)).collect();
        config.allow_read = self.allow_read.iter().map(|p| absolute(p)).collect();
        config.protect = self.protect.clone();
        config.pass_env = self.pass_env.clone();
        if let Some(max) = self.max_processes {
            config.limits.max_processes = max.max(1);
        }
        if let Some(max) = self.max_memory {
            config.limits.max_memory_bytes = max;
        }
        config.turn_timeout = Duration::from_secs(self.turn_timeout.max(1));
        config.opencode_backend = self.opencode_backend;
        config.server_idle_timeout = Duration::from_secs(self.server_idle_timeout.max(1));
        config.max_servers = self.max_servers.max(1);
        config.server_scope = self.server_scope;
        config.keep_warm = self.keep_warm.filter(|linger| !linger.is_zero());
        config.remote_idle = self.remote_idle;
        config.remote_upload_secrets = self.remote_upload_secrets;
        if let Some(dirs) = directories::BaseDirs::new() {
            let models = OpenCodeModels::read(dirs.config_dir());
            config.opencode_models = models.models;
            config.opencode_default_model = models.default;
            config.opencode_needs = models.needs;
        }
        config
    }
}

/// A `--keep-warm` duration: humantime's `90s`, `10m`, `2h 30m`, or a bare number of seconds.
fn parse_linger(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    match text.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => humantime::parse_duration(text).map_err(|e| format!("{e} (for example 600, 90s, 10m or 2h)")),
    }
}

/// A path given on the command line, made absolute against the current directory.
fn absolute(path: &std::path::Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Settings that only the server uses: `prompt --help` does not list them.
const SERVER_ONLY: [&str; 7] =
    ["replay_limit", "context_window", "amp_modes", "server_idle_timeout", "max_servers", "server_scope", "keep_warm"];

/// The command line, with each subcommand's help showing only the settings it uses (they are global, so that
/// `acp-sandbox serve --agent amp` works as well as `acp-sandbox --agent amp`).
fn command_line() -> clap::Command {
    let command = <Cli as clap::CommandFactory>::command();
    let settings: Vec<clap::Arg> = command.get_arguments().filter(|arg| arg.is_global_set()).cloned().collect();
    // A subcommand that already has a global setting keeps its own copy of it: a hidden one.
    let hide = |subcommand: clap::Command, hidden: &dyn Fn(&str) -> bool| {
        settings
            .iter()
            .filter(|arg| hidden(arg.get_id().as_str()))
            .fold(subcommand, |subcommand, arg| subcommand.arg(arg.clone().hide(true)))
    };
    command
        .mut_subcommand("prompt", |prompt| hide(prompt, &|name| SERVER_ONLY.contains(&name)))
        .mut_subcommand("sessions", |sessions| hide(sessions, &|name| name != "data_dir"))
}

/// Parses the command line and runs the command.
pub fn main() -> anyhow::Result<ExitCode> {
    let matches = command_line().get_matches();
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let command = match cli.command {
        // Inside the sandbox the data dir is not visible: no config, no log file, no store.
        Some(Invocation::SandboxInit(init)) => return Ok(sandbox_init(init)),
        Some(Invocation::Command(command)) => Some(command),
        None => None,
    };
    let config = cli.settings.config();
    let bins = BinSource::of(&matches);
    // A person reads short log lines on the terminal; a turn's own failure is said once, as the error.
    let _guard = match &command {
        None | Some(Command::Serve) => acp_sandbox::logging::init(&config.log_path(), "info", "info", false),
        Some(Command::Prompt { .. }) => acp_sandbox::logging::init(
            &config.log_path(),
            "warn,acp_sandbox::session::turn=error,acp_sandbox::session::serve::turn=error",
            "info",
            true,
        ),
        // `sessions` opens the bridge without a sandbox, which the bridge would warn about.
        Some(Command::Sessions { .. }) => {
            acp_sandbox::logging::init(&config.log_path(), "warn,acp_sandbox::session=error", "warn", true)
        }
        Some(_) => acp_sandbox::logging::init(&config.log_path(), "warn", "warn", true),
    };
    match acp_sandbox::sandbox::limits::raise_open_files_limit() {
        Ok((before, after)) if before < after => tracing::debug!("open files limit raised from {before} to {after}"),
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise the open files limit: {e}"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(async move {
        match command {
            None | Some(Command::Serve) => serve(config).await,
            Some(Command::Prompt { text, json, session }) => prompt(config, text, json, session).await,
            Some(Command::Sessions { command }) => sessions(config, command).await,
            Some(Command::Doctor) => doctor(config, bins).await,
            Some(Command::Login { provider }) => Ok(ExitCode::from(
                acp_sandbox::auth::login(&config, provider.as_deref(), &mut std::io::stderr()).await?,
            )),
        }
    });
    // Dropping the tasks still running kills their processes; a blocking read of the store (waiting out a lock)
    // must not hold up the exit the editor waits for.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(code) => Ok(code),
        // `acp-sandbox sessions list | head -1`: the reader has all it wanted.
        Err(error) if broken_pipe(&error) => Ok(ExitCode::SUCCESS),
        Err(error) => Err(error),
    }
}

/// Whether `error` is a write to a pipe whose reader is gone.
fn broken_pipe(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(|cause| cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}

/// One line to stdout; a failed write (a closed pipe) is an error the command stops at, not a panic.
macro_rules! out {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*)?
    };
}

fn sandbox_init(init: SandboxInit) -> ExitCode {
    let mut command = init.command.into_iter();
    let program = command.next().unwrap_or_default().into();
    let code = acp_sandbox::sandbox::init::run(acp_sandbox::sandbox::init::InitArgs {
        proxy_socket: init.proxy_socket,
        proxy_port: init.proxy_port,
        expose: init.expose,
        door: init.door_fd.zip(init.door_port),
        guard_door: init.guard_door,
        no_unix_sockets: init.no_unix_sockets,
        reap: init.reap,
        keep_warm: init.keep_warm_secs.map(Duration::from_secs),
        max_processes: init.max_processes,
        max_memory: init.max_memory,
        program,
        args: command.collect(),
    });
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// What `acp-sandbox` says when a person, not an editor, started it on a terminal.
const SERVE_HINT: &str = "acp-sandbox speaks the Agent Client Protocol on stdin/stdout, for an editor to run (see \
    the editor setup in the README); Ctrl-D quits. For a person: acp-sandbox prompt \"…\"";

async fn serve(config: Config) -> anyhow::Result<ExitCode> {
    if std::io::stdin().is_terminal() {
        eprintln!("{SERVE_HINT}");
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        agent = %config.agent,
        data_dir = %config.data_dir.display(),
        "acp-sandbox starting"
    );
    let bridge = Arc::new(Bridge::open(config).await.context("cannot start")?);
    tracing::info!("sandbox: {}", bridge.isolation().describe());
    bridge.reap_leftovers().await.context("cannot start")?;
    bridge.trim_idle_caches();
    bridge.refresh_opencode_models();
    bridge.probe_opencode();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    // `server::serve` shuts the bridge down itself when stdin ends; after a signal it is done here (a second call
    // returns at once).
    tokio::select! {
        result = acp_sandbox::server::serve(bridge.clone()) => {
            result.map_err(|e| anyhow::anyhow!("ACP connection failed: {e}"))?;
            tracing::info!("the editor closed the connection; exiting");
        }
        // A polite stop still ends every CLI: dropping the runtime kills their process trees.
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; exiting"),
        _ = terminate.recv() => tracing::info!("terminated; exiting"),
        _ = hangup.recv() => tracing::info!("hung up; exiting"),
    }
    bridge.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// The line on stderr that says a turn is under way while nothing else shows it. Only on a terminal: it is
/// redrawn in place and erased before any output.
struct Status {
    /// Off when stderr is not a terminal, and once the turn is over.
    enabled: AtomicBool,
    agent: &'static str,
    started: Instant,
    state: Mutex<StatusState>,
}

#[derive(Default)]
struct StatusState {
    /// Whether the line is on the screen now.
    shown: bool,
    /// Whether stdout ends a line: the status line never cuts into the agent's text.
    at_line_start: bool,
    /// The tool that runs, if any.
    tool: Option<String>,
}

/// The most characters the status line takes: a wrapped line could not be erased in place.
const STATUS_CHARS: usize = 60;

impl Status {
    fn new(agent: &'static str, enabled: bool) -> Self {
        let state = StatusState { at_line_start: true, ..StatusState::default() };
        Self { enabled: AtomicBool::new(enabled), agent, started: Instant::now(), state: Mutex::new(state) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, StatusState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Draws the line, with the time so far.
    fn draw(&self) {
        let mut state = self.state();
        if !self.enabled.load(Ordering::SeqCst) || !state.at_line_start {
            return;
        }
        let seconds = self.started.elapsed().as_secs();
        let doing = match &state.tool {
            Some(tool) => format!("{}: {tool}", self.agent),
            None => format!("{} is working", self.agent),
        };
        let doing: String = doing.chars().take(STATUS_CHARS).collect();
        eprint!("\r\x1b[2K{doing}… {seconds} s");
        state.shown = true;
    }

    /// Erases the line if it is shown; `update` then records where stdout is and what runs.
    fn clear(&self) {
        let mut state = self.state();
        if state.shown {
            eprint!("\r\x1b[2K");
            state.shown = false;
        }
    }

    fn update(&self, at_line_start: bool, tool: Option<&str>) {
        let mut state = self.state();
        state.at_line_start = at_line_start;
        state.tool = tool.map(str::to_string);
    }

    /// Erases the line for good.
    fn stop(&self) {
        self.clear();
        self.enabled.store(false, Ordering::SeqCst);
    }
}

/// Prints a turn's updates for a person, or as the JSON-RPC notifications an editor gets.
struct PrintSink {
    json: bool,
    render: Mutex<Render>,
    status: Arc<Status>,
}

impl UpdateSink for PrintSink {
    fn send(&self, session_id: &str, update: SessionUpdate) {
        if self.json {
            let notification = SessionNotification::new(session_id.to_string(), update);
            let message = serde_json::to_value(notification).map_err(|e| e.to_string()).and_then(|mut params| {
                // As the editor gets it: a new file's diff says `"oldText": null`.
                acp_sandbox::agents::tools::explicit_new_files(&mut params["update"]);
                RawJsonRpcMessage::notification(CLIENT_METHOD_NAMES.session_update.to_string(), params)
                    .map_err(|e| e.to_string())
            });
            match message.and_then(|message| serde_json::to_string(&message).map_err(|e| e.to_string())) {
                Ok(line) => {
                    self.status.clear();
                    let _ = writeln!(std::io::stdout().lock(), "{line}");
                }
                Err(e) => tracing::warn!("could not print an update as JSON: {e}"),
            }
            return;
        }
        let mut render = self.render.lock().unwrap_or_else(|p| p.into_inner());
        let text = render.update(&update);
        if !text.is_empty() {
            self.status.clear();
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
        self.status.update(render.at_line_start(), render.running_tool());
    }
}

/// The exit status of a command stopped by Ctrl-C, as shells report a process killed by SIGINT.
const INTERRUPTED: u8 = 130;

async fn prompt(config: Config, text: Option<String>, json: bool, session: Option<String>) -> anyhow::Result<ExitCode> {
    let text = match text.as_deref() {
        Some("-") | None => {
            if std::io::stdin().is_terminal() {
                eprintln!("Type the prompt, then Ctrl-D:");
            }
            let mut buffer = String::new();
            std::io::stdin().read_to_string(&mut buffer).context("reading the prompt from stdin")?;
            buffer
        }
        Some(text) => text.to_string(),
    };
    // Refused before anything starts or is stored.
    if text.trim().is_empty() {
        eprintln!("error: the prompt is empty: give it as an argument (acp-sandbox prompt \"…\") or on stdin");
        return Ok(ExitCode::from(2));
    }
    let agent = config.agent.display_name();
    let bridge = Arc::new(Bridge::open(config).await.context("cannot start")?);
    let session_id = match session {
        Some(id) => {
            bridge.resume_session(&id).await.map_err(|e| anyhow::anyhow!("{e}"))?;
            id
        }
        None => {
            let cwd = std::env::current_dir()?;
            bridge.new_session(&cwd).await.map_err(|e| anyhow::anyhow!("{e}"))?.0
        }
    };
    let status = Arc::new(Status::new(agent, std::io::stderr().is_terminal()));
    let sink = Arc::new(PrintSink { json, render: Mutex::new(Render::new()), status: status.clone() });
    let interrupted = Arc::new(AtomicBool::new(false));
    // Listening from here on: a Ctrl-C never kills the command before the turn is cancelled.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let signals = {
        let (bridge, session_id, status, interrupted) =
            (bridge.clone(), session_id.clone(), status.clone(), interrupted.clone());
        tokio::spawn(async move {
            // Either signal cancels the turn, which kills the CLI's whole tree before this command exits.
            tokio::select! {
                _ = interrupt.recv() => {
                    interrupted.store(true, Ordering::SeqCst);
                    status.stop();
                    eprintln!("\ncancelling… (Ctrl-C again to quit at once)");
                }
                _ = terminate.recv() => {}
            }
            bridge.cancel(&session_id);
            if interrupt.recv().await.is_some() {
                std::process::exit(i32::from(INTERRUPTED));
            }
        })
    };
    status.draw();
    let ticker = {
        let status = status.clone();
        tokio::spawn(async move {
            let second = Duration::from_secs(1);
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + second, second);
            loop {
                tick.tick().await;
                status.draw();
            }
        })
    };
    let result = bridge.prompt(&session_id, vec![ContentBlock::from(text)], sink.clone()).await;
    ticker.abort();
    status.stop();
    let rest = sink.render.lock().unwrap_or_else(|p| p.into_inner()).finish();
    print!("{rest}");
    let _ = std::io::stdout().flush();
    let code = match result {
        Ok(stop) => {
            eprintln!("{} (session {session_id}: continue with --session {session_id})", stop_reason_words(stop));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {}", to_acp_error(&error).message);
            eprintln!("(session {session_id}: continue with --session {session_id})");
            ExitCode::FAILURE
        }
    };
    signals.abort();
    Ok(if interrupted.load(Ordering::SeqCst) { ExitCode::from(INTERRUPTED) } else { code })
}

async fn sessions(config: Config, command: SessionsCommand) -> anyhow::Result<ExitCode> {
    let bridge =
        Bridge::open(Config { sandbox: SandboxChoice::None, ..config }).await.context("cannot open the store")?;
    let store = bridge.store();
    match command {
        SessionsCommand::List { cwd } => {
            // Sessions are stored under their workspace's canonical path.
            let cwd = match cwd {
                Some(dir) => Some(
                    std::fs::canonicalize(&dir)
                        .with_context(|| format!("--cwd {}: no such directory", dir.display()))?
                        .to_string_lossy()
                        .into_owned(),
                ),
                None => None,
            };
            let records = store.list_sessions(None, cwd.as_deref(), None, 1000).await?;
            if records.is_empty() {
                eprintln!("no sessions");
            }
            for record in records {
                out!(
                    "{}  {:<8}  {}  {}  {}",
                    record.id,
                    record.agent,
                    rfc3339(record.updated_at),
                    record.title.as_deref().unwrap_or("(untitled)"),
                    record.cwd
                );
            }
        }
        SessionsCommand::Show { id } => {
            let Some(record) = store.session(&id).await? else {
                eprintln!("{}", no_session(&id, &bridge));
                return Ok(ExitCode::FAILURE);
            };
            out!("session     {}", record.id);
            out!("agent       {}", record.agent);
            out!("title       {}", record.title.as_deref().unwrap_or("(untitled)"));
            out!("workspace   {}", record.cwd);
            out!(
                "sandbox     {} {}",
                record.sandbox_provider,
                record.sandbox_id.as_deref().unwrap_or("(not created yet)")
            );
            out!("cli session {}", record.native_id.as_deref().unwrap_or("(none yet)"));
            out!("config      {}", record.config);
            out!("created     {}", rfc3339(record.created_at));
            out!("updated     {}", rfc3339(record.updated_at));
            let history = store.history(&id, usize::MAX).await?;
            for (number, (turn, events)) in history.turns.into_iter().enumerate() {
                let status = match turn.status {
                    TurnStatus::Running => "running",
                    TurnStatus::Done => "done",
                    TurnStatus::Failed => "failed",
                    TurnStatus::Interrupted => "interrupted",
                };
                let outcome = turn.stop_reason.or(turn.error).map(|o| format!(": {o}")).unwrap_or_default();
                out!("\nturn {} at {}, {status}{outcome}", number + 1, rfc3339(turn.started_at));
                let prompt: Vec<ContentBlock> = serde_json::from_value(turn.prompt).unwrap_or_default();
                for block in prompt {
                    if let ContentBlock::Text(text) = block {
                        out!("  > {}", text.text.trim_end().replace('\n', "\n  > "));
                    }
                }
                let answer: String = events
                    .into_iter()
                    .filter_map(|event| match serde_json::from_value(event) {
                        Ok(SessionUpdate::AgentMessageChunk(chunk)) => match chunk.content {
                            ContentBlock::Text(text) => Some(text.text),
                            _ => None,
                        },
                        _ => None,
                    })
                    .collect();
                for line in answer.trim().lines() {
                    out!("{}", format!("  {line}").trim_end());
                }
            }
        }
        SessionsCommand::Rm { id } => {
            if store.session(&id).await?.is_none() {
                eprintln!("{}", no_session(&id, &bridge));
                return Ok(ExitCode::FAILURE);
            }
            bridge.delete_session(&id).await.map_err(|e| anyhow::anyhow!("{e}"))?;
            eprintln!("deleted {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Says that the store has no such session, and where to look.
fn no_session(id: &str, bridge: &Bridge) -> String {
    format!(
        "no session {id} in {}: `acp-sandbox sessions list` shows the stored ones",
        bridge.config().database_path().display()
    )
}

/// What `doctor` says about how OpenCode will be driven, given the version it printed; an error when it cannot be.
fn opencode_backend(config: &Config, version: &str) -> Result<String, String> {
    let major = acp_sandbox::session::major_version(version);
    if major.is_some_and(|major| major >= 2) {
        return match config.opencode_bin {
            Some(_) => Err(format!(
                "OpenCode {version} is a major version acp-sandbox cannot drive yet; point --opencode-bin at a 1.x"
            )),
            None => Ok(format!(
                "OpenCode {version} is not driven (a 2.x): the pinned {} of the tools cache is used instead",
                acp_sandbox::agents::opencode::PACKAGE.version
            )),
        };
    }
    Ok(match config.opencode_backend {
        // Sessions in a remote sandbox fall back to `run` (their provider starts no server there yet).
        acp_sandbox::config::OpenCodeBackend::Serve
            if matches!(config.sandbox, SandboxChoice::E2b | SandboxChoice::Daytona) =>
        {
            format!(
                "run: one `opencode run` per prompt (a warm `opencode serve` does not run in a remote sandbox yet, \
                 --sandbox {})",
                config.sandbox.as_str()
            )
        }
        acp_sandbox::config::OpenCodeBackend::Serve => format!(
            "serve: a warm `opencode serve` per {} (stopped after {} s idle, at most {} at once)",
            match (config.server_scope, config.workspace) {
                (acp_sandbox::config::ServerScope::Workspace, acp_sandbox::config::WorkspaceMode::Direct) =>
                    "workspace, shared by its new threads (--server-scope workspace)",
                (acp_sandbox::config::ServerScope::Workspace, _) => "session (review mode gives each its own copy)",
                (acp_sandbox::config::ServerScope::Session, _) => "session (--server-scope session)",
            },
            config.server_idle_timeout.as_secs(),
            config.max_servers
        ),
        acp_sandbox::config::OpenCodeBackend::Run => "run: one `opencode run` per prompt".to_string(),
    })
}

/// Whether `--opencode-bin` and `--amp-bin` were set by their environment variables or by the flags.
#[derive(Clone, Copy, Debug)]
struct BinSource {
    opencode_from_env: bool,
    amp_from_env: bool,
}

impl BinSource {
    fn of(matches: &clap::ArgMatches) -> Self {
        let from_env = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::EnvVariable);
        Self { opencode_from_env: from_env("opencode_bin"), amp_from_env: from_env("amp_bin") }
    }

    /// Where the override of `agent`'s executable came from, in words.
    fn describe(self, agent: AgentKind) -> String {
        let from_env = match agent {
            AgentKind::OpenCode => self.opencode_from_env,
            AgentKind::Amp => self.amp_from_env,
        };
        match from_env {
            true => format!("from ACP_SANDBOX_{}_BIN", agent.as_str().to_uppercase()),
            false => format!("from --{}-bin", agent.as_str()),
        }
    }
}

/// What to do when bubblewrap cannot run here: install it, or allow the user namespaces it needs.
fn bwrap_advice(installed: bool) -> &'static [&'static str] {
    if !installed {
        return &["install the `bubblewrap` package for isolation"];
    }
    &[
        "bubblewrap is installed, but user namespaces are disabled or restricted here. Check:",
        "`sysctl kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10 and later: 1 restricts them; allow bwrap",
        "with an AppArmor profile, or set it to 0), `sysctl kernel.unprivileged_userns_clone` (older Debian: 1 allows",
        "them), `sysctl user.max_user_namespaces` (0 disables them); in a container, allow user namespaces.",
    ]
}

/// The model OpenCode starts new sessions with, and where that comes from.
fn opencode_model(config: &Config) -> String {
    match (&config.model, &config.opencode_default_model) {
        (Some(model), _) => format!("{model} (--model)"),
        (None, Some(model)) => format!("{model} (the `model` of your OpenCode config)"),
        (None, None) => "OpenCode's own choice (no --model, and no `model` in your OpenCode config)".to_string(),
    }
}

/// The model providers OpenCode can find: in the user's config, in its stored logins, or in the environment.
fn opencode_providers(config: &Config, logins: Option<&serde_json::Value>) -> Vec<String> {
    let mut found: Vec<String> =
        config.opencode_needs.providers.iter().map(|provider| format!("{provider} (your OpenCode config)")).collect();
    for provider in logins.and_then(|l| l.as_object()).into_iter().flat_map(|logins| logins.keys()) {
        found.push(format!("{provider} (`opencode auth login`)"));
    }
    for variable in acp_sandbox::agents::opencode::providers::all_provider_env() {
        if std::env::var_os(variable).is_some_and(|value| !value.is_empty()) {
            found.push(format!("{variable} is set"));
        }
    }
    found
}

async fn doctor(config: Config, bins: BinSource) -> anyhow::Result<ExitCode> {
    let mut errors = 0;
    let mut error = |text: String| {
        errors += 1;
        format!("ERROR {text}")
    };
    out!("acp-sandbox {}", env!("CARGO_PKG_VERSION"));
    out!("data dir    {}", config.data_dir.display());
    out!("log files   {}.<date>", config.log_path().display());
    out!();
    // Whether the agent in use is still to be installed from npm: nothing to run in the sandbox yet.
    let mut to_install = false;
    for agent in [AgentKind::OpenCode, AgentKind::Amp] {
        let package = agent.package();
        let used = agent == config.agent;
        let found = match acp_sandbox::locate::locate(&config, agent) {
            Some(Location::Override(path)) => format!("{} ({})", path.display(), bins.describe(agent)),
            Some(Location::OnPath(path)) => format!("{} (on PATH)", path.display()),
            Some(Location::Installed(path)) => format!("{} (installed by acp-sandbox)", path.display()),
            None if which::which("npm").is_ok() => {
                to_install |= used;
                format!("not installed: {}@{} will be installed from npm on first use", package.name, package.version)
            }
            None if used => error("not found, and npm is missing to install it".to_string()),
            None => "not found, and npm is missing to install it".to_string(),
        };
        out!("{:<10}  {found}", agent.display_name());
        if let Some(variable) = agent.required_credential() {
            let state = match acp_sandbox::auth::source(&config, agent) {
                Some(acp_sandbox::auth::Source::Environment(_)) => "set".to_string(),
                Some(acp_sandbox::auth::Source::Stored(path)) => format!("stored by login in {}", path.display()),
                None => {
                    let missing =
                        format!("missing: set {variable} or run `{}`", acp_sandbox::auth::login_command(agent));
                    if used { error(missing) } else { missing }
                }
            };
            out!("{:<10}  {variable}: {state}", "");
        }
        if agent == AgentKind::OpenCode {
            out!("{:<10}  model: {}", "", opencode_model(&config));
            let logins = directories::BaseDirs::new().and_then(|dirs| {
                acp_sandbox::config::read_opencode_config(&dirs.data_dir().join("opencode").join("auth.json"))
            });
            let providers = opencode_providers(&config, logins.as_ref());
            if providers.is_empty() {
                out!(
                    "{:<10}  providers: none found in your OpenCode config, its logins or the environment: run \
                     `opencode auth login`, or set a provider's key (e.g. ANTHROPIC_API_KEY)",
                    ""
                );
            } else {
                out!("{:<10}  providers: {}", "", providers.join(", "));
            }
        }
    }
    out!();
    let isolation = Isolation::resolve(config.sandbox);
    match &isolation {
        // Its description says why there is no isolation, `--sandbox none` among the reasons.
        Ok(isolation @ Isolation::None(_)) => out!("sandbox     {}", isolation.describe()),
        // A remote choice leaves the local sandbox to the bridge's own short commands (the provider has its lines).
        Ok(isolation) if matches!(config.sandbox, SandboxChoice::E2b | SandboxChoice::Daytona) => out!(
            "sandbox     {} for the bridge's own commands; sessions: --sandbox {} (below)",
            isolation.describe(),
            config.sandbox.as_str()
        ),
        Ok(isolation) => out!("sandbox     {} (--sandbox {})", isolation.describe(), config.sandbox.as_str()),
        Err(e) => out!("sandbox     {}", error(e.to_string())),
    }
    if config.sandbox != SandboxChoice::None && probe_bwrap().is_err() {
        for line in bwrap_advice(which::which("bwrap").is_ok()) {
            out!("            {line}");
        }
    }
    if let Ok(isolation) = isolation {
        let settings = acp_sandbox::sandbox::local::LocalSettings::from_config(&config, isolation);
        for (name, on, text) in settings.describe() {
            out!("  {:<12}  {} {text}", name, if on { "on " } else { "OFF" });
        }
        let hidden: Vec<String> = settings
            .policy
            .hidden_paths()
            .into_iter()
            .filter(|path| path.exists())
            .map(|path| path.display().to_string())
            .collect();
        out!(
            "  hidden here   {}",
            if hidden.is_empty() { "(none of the listed secrets exist)".into() } else { hidden.join(", ") }
        );
        let agent = config.agent;
        match acp_sandbox::session::check_cli(&config, agent).await {
            Err(_) if to_install => {
                out!("  {:<12}  `{} --version` runs in the sandbox once it is installed", "run", agent.package().bin)
            }
            Ok(version) => {
                out!("  {:<12}  ok  `{} --version` in the sandbox: {version}", "run", agent.package().bin);
                if agent == AgentKind::OpenCode {
                    let backend = opencode_backend(&config, &version).unwrap_or_else(&mut error);
                    out!("  {:<12}  {backend}", "backend");
                }
            }
            Err(why) => {
                let line = error(format!("`{} --version` in the sandbox: {why}", agent.package().bin));
                out!("  {:<12}  {line}", "run")
            }
        }
    }
    let var = acp_sandbox::auth::provider_variables(&config);
    for (provider, lines) in acp_sandbox::sandbox::check_remote_providers(config.sandbox, &var).await {
        for (i, line) in lines.into_iter().enumerate() {
            let text = match line.level {
                CheckLevel::Ok => line.text,
                CheckLevel::Info => format!("INFO {}", line.text),
                CheckLevel::Error => error(line.text),
            };
            out!("{:<10}  {text}", if i == 0 { provider } else { "" });
        }
    }
    match acp_sandbox::store::Store::open(&config.database_path()) {
        Ok(store) => {
            let count = store.list_sessions(None, None, None, 100_000).await.map(|s| s.len()).unwrap_or(0);
            out!(
                "store       {} ({count} sessions, schema version {})",
                config.database_path().display(),
                acp_sandbox::store::SCHEMA_VERSION
            );
        }
        Err(e) => out!("store       {}", error(e.to_string())),
    }
    match config.keep_warm {
        Some(linger) => out!(
            "keep warm   a warm server outlives its editor for {} (--keep-warm)",
            humantime::format_duration(linger)
        ),
        None => out!("keep warm   off: servers end with their editor (--keep-warm)"),
    }
    for line in acp_sandbox::sandbox::warm::describe(&acp_sandbox::paths::run_dir(&config.data_dir)) {
        out!("            {line}");
    }
    if errors > 0 {
        eprintln!("{errors} problem{} found (the ERROR lines)", if errors == 1 { "" } else { "s" });
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
