//! The command line: `serve` (the default, for editors), `prompt`, `sessions` and `doctor` (for people), and the
//! hidden `sandbox-init`, the entry process inside a sandbox.
//!
//! Only the terminal commands print to stdout; `serve` leaves stdout to the ACP connection and `sandbox-init` to the
//! CLI it runs.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acp_sandbox::agents::AgentKind;
use acp_sandbox::config::{Config, OpenCodeModels, SandboxChoice};
use acp_sandbox::error::to_acp_error;
use acp_sandbox::sandbox::local::{Isolation, probe_bwrap};
use acp_sandbox::sandbox::policy::Profile;
use acp_sandbox::sandbox::proxy::NetworkMode;
use acp_sandbox::session::{Bridge, UpdateSink};
use acp_sandbox::store::rfc3339;
use agent_client_protocol::v1::schema::{
    ContentBlock, SessionNotification, SessionUpdate, ToolCallContent, ToolCallStatus,
};
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
    /// Be the reaper of PROGRAM's descendants and end them all when it exits or this process is told to stop
    /// (`--sandbox none`, where no PID namespace does it).
    #[arg(long)]
    reap: bool,
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
    /// Where CLIs run: bubblewrap when available (auto), bubblewrap or fail (bwrap), or no sandbox (none).
    #[arg(long, global = true, env = "ACP_SANDBOX_SANDBOX", value_enum, default_value = "auto")]
    sandbox: SandboxChoice,
    /// How the agent's writes reach your files: at once (direct), or through the editor's review (review).
    #[arg(long, global = true, env = "ACP_SANDBOX_WORKSPACE", value_enum, default_value = "direct")]
    workspace: acp_sandbox::config::WorkspaceMode,
    /// Sessions, logs and installed CLIs live here [default: the platform data dir].
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
    /// At most this many updates are replayed when the editor reopens a session.
    #[arg(long, global = true, env = "ACP_SANDBOX_REPLAY_LIMIT", default_value_t = 5000)]
    replay_limit: usize,
    /// How many seconds a write to the session store waits for another program's lock on it.
    #[arg(long, global = true, env = "ACP_SANDBOX_STORE_BUSY_TIMEOUT", default_value_t = 10)]
    store_busy_timeout: u64,
    /// Context window (tokens) shown in the editor's usage meter.
    #[arg(long, global = true, env = "ACP_SANDBOX_CONTEXT_WINDOW", default_value_t = 200_000)]
    context_window: u64,
    /// Amp modes offered in the editor (comma-separated; the first is the default).
    #[arg(long, global = true, env = "ACP_SANDBOX_AMP_MODES", value_delimiter = ',')]
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
    /// End a turn still running after this many seconds.
    #[arg(long, global = true, env = "ACP_SANDBOX_TURN_TIMEOUT", default_value_t = 1800)]
    turn_timeout: u64,
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
        /// Print the raw ACP `session/update` notifications, one JSON object per line.
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
    /// `opencode auth login`.
    Login,
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
        let data_dir = self.data_dir.clone().unwrap_or_else(Config::default_data_dir);
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
        if let Some(dirs) = directories::BaseDirs::new() {
            let models = OpenCodeModels::read(dirs.config_dir());
            config.opencode_models = models.models;
            config.opencode_default_model = models.default;
            config.opencode_needs = models.needs;
        }
        config
    }
}

/// A path given on the command line, made absolute against the current directory.
fn absolute(path: &std::path::Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Parses the command line and runs the command.
pub fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let command = match cli.command {
        // Inside the sandbox the data dir is not visible: no config, no log file, no store.
        Some(Invocation::SandboxInit(init)) => return Ok(sandbox_init(init)),
        Some(Invocation::Command(command)) => Some(command),
        None => None,
    };
    let config = cli.settings.config();
    let quiet = !matches!(command, None | Some(Command::Serve));
    let _guard = acp_sandbox::logging::init(&config.log_path(), if quiet { "warn" } else { "info" });
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(async move {
        match command {
            None | Some(Command::Serve) => serve(config).await,
            Some(Command::Prompt { text, json, session }) => prompt(config, text, json, session).await,
            Some(Command::Sessions { command }) => sessions(config, command).await,
            Some(Command::Doctor) => doctor(config).await,
            Some(Command::Login) => {
                Ok(ExitCode::from(acp_sandbox::auth::login(&config, &mut std::io::stderr()).await?))
            }
        }
    });
    // Dropping the tasks still running kills their processes; a blocking read of the store (waiting out a lock)
    // must not hold up the exit the editor waits for.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    result
}

fn sandbox_init(init: SandboxInit) -> ExitCode {
    let mut command = init.command.into_iter();
    let program = command.next().unwrap_or_default().into();
    let code = acp_sandbox::sandbox::init::run(acp_sandbox::sandbox::init::InitArgs {
        proxy_socket: init.proxy_socket,
        proxy_port: init.proxy_port,
        expose: init.expose,
        door: init.door_fd.zip(init.door_port),
        reap: init.reap,
        max_processes: init.max_processes,
        max_memory: init.max_memory,
        program,
        args: command.collect(),
    });
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

async fn serve(config: Config) -> anyhow::Result<ExitCode> {
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

/// Prints updates for a person, or as JSON lines.
struct PrintSink {
    json: bool,
    /// Whether the last thing printed ended a line: agent text streams without newlines.
    at_line_start: Mutex<bool>,
}

impl PrintSink {
    fn line(&self, text: &str) {
        let mut at_start = self.at_line_start.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = std::io::stdout().lock();
        if !*at_start {
            let _ = writeln!(out);
        }
        let _ = writeln!(out, "{text}");
        *at_start = true;
    }
}

impl UpdateSink for PrintSink {
    fn send(&self, session_id: &str, update: SessionUpdate) {
        if self.json {
            let notification = SessionNotification::new(session_id.to_string(), update);
            if let Ok(text) = serde_json::to_string(&notification) {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{text}");
            }
            return;
        }
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let ContentBlock::Text(text) = chunk.content {
                    let mut out = std::io::stdout().lock();
                    let _ = write!(out, "{}", text.text);
                    let _ = out.flush();
                    *self.at_line_start.lock().unwrap_or_else(|p| p.into_inner()) = text.text.ends_with('\n');
                }
            }
            SessionUpdate::AgentThoughtChunk(chunk) => {
                if let ContentBlock::Text(text) = chunk.content {
                    for line in text.text.lines() {
                        self.line(&format!("  (thinking) {line}"));
                    }
                }
            }
            SessionUpdate::ToolCall(call) => {
                // The kind's wire name (`execute`, `read`…) is what a reader of ACP logs knows.
                let kind = serde_json::to_value(call.kind).ok().and_then(|k| k.as_str().map(str::to_string));
                self.line(&format!("▸ {} [{}]", call.title, kind.unwrap_or_default()));
            }
            SessionUpdate::ToolCallUpdate(update) => {
                let mark = match update.fields.status {
                    Some(ToolCallStatus::Completed) => "  ✓ done",
                    Some(ToolCallStatus::Failed) => "  ✗ failed",
                    _ => return,
                };
                let detail = update
                    .fields
                    .content
                    .iter()
                    .flatten()
                    .find_map(|content| match content {
                        ToolCallContent::Content(c) => match &c.content {
                            ContentBlock::Text(t) => t
                                .text
                                .lines()
                                .find(|l| !l.trim().is_empty() && !l.starts_with("```"))
                                .map(str::to_string),
                            _ => None,
                        },
                        ToolCallContent::Diff(diff) => Some(format!("diff of {}", diff.path.display())),
                        _ => None,
                    })
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default();
                self.line(&format!("{mark}{detail}"));
            }
            SessionUpdate::Plan(plan) => {
                self.line("Plan:");
                for entry in plan.entries {
                    self.line(&format!("  [{:?}] {}", entry.status, entry.content));
                }
            }
            SessionUpdate::UsageUpdate(usage) => {
                tracing::info!(used = usage.used, size = usage.size, "usage");
            }
            SessionUpdate::SessionInfoUpdate(_) => {}
            other => tracing::debug!("update: {other:?}"),
        }
    }
}

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
    let sink = Arc::new(PrintSink { json, at_line_start: Mutex::new(true) });
    let cancel_bridge = bridge.clone();
    let cancel_id = session_id.clone();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::spawn(async move {
        // Either signal cancels the turn, which kills the CLI's whole tree before this command exits.
        tokio::select! {
            _ = tokio::signal::ctrl_c() => eprintln!("\ncancelling…"),
            _ = terminate.recv() => {}
        }
        cancel_bridge.cancel(&cancel_id);
    });
    let result = bridge.prompt(&session_id, vec![ContentBlock::from(text)], sink.clone()).await;
    if !*sink.at_line_start.lock().unwrap_or_else(|p| p.into_inner()) {
        println!();
    }
    match result {
        Ok(stop) => {
            eprintln!("[{stop:?}] session {session_id} (continue with --session {session_id})");
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            let acp = to_acp_error(&error);
            eprintln!("error ({:?}): {}", acp.code, acp.message);
            eprintln!("session {session_id}");
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn sessions(config: Config, command: SessionsCommand) -> anyhow::Result<ExitCode> {
    let bridge =
        Bridge::open(Config { sandbox: SandboxChoice::None, ..config }).await.context("cannot open the store")?;
    match command {
        SessionsCommand::List { cwd } => {
            let records = bridge.store().list_sessions(None, cwd.as_ref().and_then(|c| c.to_str()), None, 1000).await?;
            if records.is_empty() {
                eprintln!("no sessions");
            }
            for record in records {
                println!(
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
            let Some(record) = bridge.store().session(&id).await? else {
                eprintln!("no session {id}");
                return Ok(ExitCode::FAILURE);
            };
            println!("session     {}", record.id);
            println!("agent       {}", record.agent);
            println!("title       {}", record.title.as_deref().unwrap_or("(untitled)"));
            println!("workspace   {}", record.cwd);
            println!(
                "sandbox     {} {}",
                record.sandbox_provider,
                record.sandbox_id.as_deref().unwrap_or("(not created yet)")
            );
            println!("cli session {}", record.native_id.as_deref().unwrap_or("(none yet)"));
            println!("config      {}", record.config);
            println!("created     {}", rfc3339(record.created_at));
            println!("updated     {}", rfc3339(record.updated_at));
            let history = bridge.store().history(&id, usize::MAX).await?;
            for (turn, events) in history.turns {
                let outcome = turn.stop_reason.or(turn.error).unwrap_or_default();
                println!("\nturn {} at {}: {:?} {}", turn.id, rfc3339(turn.started_at), turn.status, outcome);
                let prompt: Vec<ContentBlock> = serde_json::from_value(turn.prompt).unwrap_or_default();
                for block in prompt {
                    if let ContentBlock::Text(text) = block {
                        println!("  > {}", text.text.replace('\n', "\n  > "));
                    }
                }
                println!("  {} updates", events.len());
            }
        }
        SessionsCommand::Rm { id } => {
            bridge.delete_session(&id).await.map_err(|e| anyhow::anyhow!("{e}"))?;
            eprintln!("deleted {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `doctor` says about how OpenCode will be driven, given the version it printed.
fn opencode_backend(config: &Config, version: &str) -> String {
    let major = acp_sandbox::session::major_version(version);
    if major.is_some_and(|major| major >= 2) {
        return match config.opencode_bin {
            Some(_) => format!(
                "ERROR OpenCode {version} is a major version acp-sandbox cannot drive yet; point --opencode-bin at a 1.x"
            ),
            None => format!(
                "OpenCode {version} is not driven (a 2.x): the pinned {} of the tools cache is used instead",
                acp_sandbox::agents::opencode::PACKAGE.version
            ),
        };
    }
    match config.opencode_backend {
        acp_sandbox::config::OpenCodeBackend::Serve => format!(
            "serve: a warm `opencode serve` per session (stopped after {} s idle, at most {} at once)",
            config.server_idle_timeout.as_secs(),
            config.max_servers
        ),
        acp_sandbox::config::OpenCodeBackend::Run => "run: one `opencode run` per prompt".to_string(),
    }
}

async fn doctor(config: Config) -> anyhow::Result<ExitCode> {
    println!("acp-sandbox {}", env!("CARGO_PKG_VERSION"));
    println!("data dir    {}", config.data_dir.display());
    println!("log files   {}.<date>", config.log_path().display());
    println!();
    for agent in [AgentKind::OpenCode, AgentKind::Amp] {
        let package = agent.package();
        let found = if let Some(path) = config.bin_override(agent) {
            format!("{} (from ACP_SANDBOX_{}_BIN)", path.display(), agent.as_str().to_uppercase())
        } else if let Ok(path) = which::which(package.bin) {
            format!("{} (on PATH)", path.display())
        } else if package.executable(&config.tools_dir()).exists() {
            format!("{} (installed by acp-sandbox)", package.executable(&config.tools_dir()).display())
        } else if which::which("npm").is_ok() {
            format!("not installed: {}@{} will be installed from npm on first use", package.name, package.version)
        } else {
            "NOT FOUND, and npm is missing to install it".to_string()
        };
        println!("{:<10}  {found}", agent.display_name());
        if let Some(variable) = agent.required_credential() {
            let state = match acp_sandbox::auth::source(&config, agent) {
                Some(acp_sandbox::auth::Source::Environment(_)) => "set".to_string(),
                Some(acp_sandbox::auth::Source::Stored(path)) => format!("stored by login in {}", path.display()),
                None => format!("MISSING: set {variable} or run `{}`", acp_sandbox::auth::login_command(agent)),
            };
            println!("{:<10}  {variable}: {state}", "");
        }
    }
    println!();
    match Isolation::resolve(config.sandbox) {
        Ok(isolation) => println!("sandbox     {} (--sandbox {})", isolation.describe(), config.sandbox.as_str()),
        Err(e) => println!("sandbox     ERROR: {e}"),
    }
    if let Err(why) = probe_bwrap() {
        println!("            bubblewrap: {why}; install the `bubblewrap` package for isolation");
    }
    if let Ok(isolation) = Isolation::resolve(config.sandbox) {
        let settings = acp_sandbox::sandbox::local::LocalSettings::from_config(&config, isolation);
        for (name, on, text) in settings.describe() {
            println!("  {:<12}  {} {text}", name, if on { "on " } else { "OFF" });
        }
        let hidden: Vec<String> = settings
            .policy
            .hidden_paths()
            .into_iter()
            .filter(|path| path.exists())
            .map(|path| path.display().to_string())
            .collect();
        println!(
            "  hidden here   {}",
            if hidden.is_empty() { "(none of the listed secrets exist)".into() } else { hidden.join(", ") }
        );
        for agent in [AgentKind::OpenCode, AgentKind::Amp] {
            if agent != config.agent {
                continue;
            }
            match acp_sandbox::session::check_cli(&config, agent).await {
                Ok(version) => {
                    println!("  {:<12}  ok  `{} --version` in the sandbox: {version}", "run", agent.package().bin);
                    if agent == AgentKind::OpenCode {
                        println!("  {:<12}  {}", "backend", opencode_backend(&config, &version));
                    }
                }
                Err(why) => {
                    println!("  {:<12}  ERROR `{} --version` in the sandbox: {why}", "run", agent.package().bin)
                }
            }
        }
    }
    match acp_sandbox::store::Store::open(&config.database_path()) {
        Ok(store) => {
            let count = store.list_sessions(None, None, None, 100_000).await.map(|s| s.len()).unwrap_or(0);
            println!(
                "store       {} ({count} sessions, schema version {})",
                config.database_path().display(),
                acp_sandbox::store::SCHEMA_VERSION
            );
        }
        Err(e) => println!("store       ERROR: {e}"),
    }
    Ok(ExitCode::SUCCESS)
}
