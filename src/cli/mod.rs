//! The command line: its settings and dispatch, `serve` (the default, for editors) and the hidden `sandbox-init`,
//! the entry process inside a sandbox; the commands for people (`prompt`, `sessions`, `doctor`) have a file each.
//!
//! Only the terminal commands print to stdout; `serve` leaves stdout to the ACP connection and `sandbox-init` to the
//! CLI it runs.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use acp_sandbox::agents::AgentKind;
use acp_sandbox::config::Config;
use acp_sandbox::sandbox::SandboxChoice;
use acp_sandbox::sandbox::local::policy::Profile;
use acp_sandbox::sandbox::net::proxy::NetworkMode;
use acp_sandbox::session::Bridge;
use anyhow::Context;
use clap::{Args, Parser, Subcommand};

/// One line to stdout; a failed write (a closed pipe) is an error the command stops at, not a panic.
macro_rules! out {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*)?
    };
}

mod doctor;
mod prompt;
mod sessions;

use doctor::{BinSource, doctor};
use prompt::prompt;
use sessions::sessions;

/// Run a coding agent (OpenCode, Amp, Claude Code, Codex, Gemini CLI, or any agent that speaks ACP) in a sandbox, for
/// editors that speak the Agent Client Protocol.
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
    /// Inside a sandbox: open its network doors to the bridge's proxy, then run PROGRAM (internal; Linux only).
    #[cfg(linux_sandbox)]
    #[command(hide = true)]
    SandboxInit(SandboxInit),
}

#[cfg(linux_sandbox)]
#[derive(Args, Debug)]
struct SandboxInit {
    /// The bridge's proxy socket, as mounted in the sandbox.
    #[arg(long, default_value = acp_sandbox::sandbox::local::init::PROXY_SOCKET)]
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
    /// Put PROGRAM in the Landlock sandbox these grants describe (JSON, written by the bridge).
    #[arg(long, value_name = "JSON")]
    landlock: Option<String>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct Settings {
    /// The agent CLI that new sessions run.
    #[arg(long, global = true, env = "ACP_SANDBOX_AGENT", value_enum, default_value = "opencode")]
    agent: AgentKind,
    /// Where CLIs run: bubblewrap, else Landlock, else prompts refused (auto), bubblewrap or fail (bwrap), Landlock
    /// or fail (landlock), no sandbox (none), or an E2B or Daytona sandbox per session (e2b, daytona; preview: need
    /// E2B_API_KEY, DAYTONA_API_KEY).
    #[arg(long, global = true, env = "ACP_SANDBOX_SANDBOX", value_enum, default_value = "auto")]
    sandbox: SandboxChoice,
    /// How the agent's writes reach your files: at once (direct), or through the editor's review (review).
    #[arg(long, global = true, env = "ACP_SANDBOX_WORKSPACE", value_enum, default_value = "direct")]
    workspace: acp_sandbox::sandbox::WorkspaceMode,
    /// Sessions, logs and installed CLIs live here [default: $XDG_DATA_HOME/acp-sandbox, or
    /// ~/.local/share/acp-sandbox when XDG_DATA_HOME is unset].
    #[arg(long, global = true, env = "ACP_SANDBOX_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Default model (OpenCode: `provider/model`) or mode (Amp) for new sessions.
    #[arg(long, global = true, env = "ACP_SANDBOX_MODEL")]
    model: Option<String>,
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
    /// Where the sandbox may connect: `open` (any public host), `allow=HOST,...` (those and the CLI's own
    /// service), `ask` or `ask=HOST,...` (those, and any other public host you allow on a card in the thread:
    /// once, always for the thread, or refuse; unanswered in 120 s is a refusal), `none` (only the model endpoints
    /// of your config), or `host` (the host's network, unfiltered).
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
    /// Each agent's own settings, under its name.
    #[command(flatten)]
    agents: acp_sandbox::agents::AgentSettings,
}

fn parse_size(text: &str) -> Result<u64, String> {
    acp_sandbox::sandbox::local::limits::parse_size(text).map_err(|e| e.to_string())
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
    /// Log in for the agent: Amp, Claude Code, Codex and Gemini ask for a key and store it (mode 0600); OpenCode
    /// runs its own `opencode auth login`; `--own` runs the agent's own sign-in (Codex: ChatGPT; Claude Code: a Claude
    /// subscription's token). With `--provider`, stores a remote sandbox provider's API key instead.
    Login {
        /// Store this provider's API key (E2B_API_KEY, DAYTONA_API_KEY), used when it is not in the environment.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(
            acp_sandbox::sandbox::remote::REMOTES.iter().map(|remote| remote.name())
        ))]
        provider: Option<String>,
        /// Run the agent's own sign-in instead of storing a key (Codex: ChatGPT, by a code entered at a URL, its login
        /// kept in the data dir; Claude Code: `claude setup-token`, whose printed token is kept like a key), used by
        /// sessions on this machine.
        #[arg(long, conflicts_with = "provider")]
        own: bool,
    },
    /// Delete what `login` stored: the agent's key or token, or its own sign-in's login, or with `--provider` a
    /// provider's API key. The variables of the environment are not touched.
    Logout {
        /// Delete this provider's stored API key instead.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(
            acp_sandbox::sandbox::remote::REMOTES.iter().map(|remote| remote.name())
        ))]
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
        config.idle_timeout = Duration::from_secs(self.idle_timeout.max(1));
        config.replay_limit = self.replay_limit;
        config.store_busy_timeout = Duration::from_secs(self.store_busy_timeout.max(1));
        config.context_window = self.context_window;
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
        config.server_idle_timeout = Duration::from_secs(self.server_idle_timeout.max(1));
        config.max_servers = self.max_servers.max(1);
        config.server_scope = self.server_scope;
        config.keep_warm = self.keep_warm.filter(|linger| !linger.is_zero());
        config.remote_idle = self.remote_idle;
        config.remote_upload_secrets = self.remote_upload_secrets;
        config.agents = self.agents.clone();
        config.agents.resolve(directories::BaseDirs::new().as_ref().map(|dirs| dirs.config_dir()));
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
        #[cfg(linux_sandbox)]
        Some(Invocation::SandboxInit(init)) => return Ok(sandbox_init(init)),
        Some(Invocation::Command(command)) => Some(command),
        None => None,
    };
    let config = cli.settings.config();
    if matches!(command, None | Some(Command::Serve) | Some(Command::Prompt { .. }))
        && let Some(problem) = config.agent.settings_problem(&config.agents)
    {
        anyhow::bail!("{problem}");
    }
    let bins = BinSource::of(&matches);
    // A person reads short log lines on the terminal; a turn's own failure is said once, as the error.
    let _guard = match &command {
        None | Some(Command::Serve) => acp_sandbox::logging::init(&config.log_path(), "info", "info", false),
        Some(Command::Prompt { .. }) => acp_sandbox::logging::init(
            &config.log_path(),
            "warn,acp_sandbox::session::turn=error,acp_sandbox::agents=error",
            "info",
            true,
        ),
        // `sessions` opens the bridge without a sandbox, which the bridge would warn about.
        Some(Command::Sessions { .. }) => acp_sandbox::logging::init(
            &config.log_path(),
            "warn,acp_sandbox::session=error,acp_sandbox::sandbox::local=error",
            "warn",
            true,
        ),
        Some(_) => acp_sandbox::logging::init(&config.log_path(), "warn", "warn", true),
    };
    match acp_sandbox::sandbox::local::limits::raise_open_files_limit() {
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
            Some(Command::Login { provider, own }) => Ok(ExitCode::from(
                acp_sandbox::auth::login(&config, provider.as_deref(), own, &mut std::io::stderr()).await?,
            )),
            Some(Command::Logout { provider }) => Ok(ExitCode::from(acp_sandbox::auth::logout_command(
                &config,
                provider.as_deref(),
                &mut std::io::stderr(),
            ))),
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

#[cfg(linux_sandbox)]
fn sandbox_init(init: SandboxInit) -> ExitCode {
    let mut command = init.command.into_iter();
    let program = command.next().unwrap_or_default().into();
    let code = acp_sandbox::sandbox::local::init::run(acp_sandbox::sandbox::local::init::InitArgs {
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
        landlock: init.landlock,
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
    tracing::info!("sandbox: {}", bridge.describe_sandbox());
    bridge.reap_leftovers().await.context("cannot start")?;
    bridge.trim_idle_caches();
    bridge.refresh_models();
    bridge.probe_version();
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
