//! Credentials: the ACP auth methods each agent offers, what `authenticate` checks, the token that
//! `acp-sandbox login` keeps for Amp (and the remote providers' API keys), and the login command itself.
//!
//! Amp's access token comes from `AMP_API_KEY` in the bridge's environment (which wins) or from the file
//! `acp-sandbox login --agent amp` wrote: `<data dir>/credentials/amp`, mode 0600 in a 0700 folder, which no
//! sandbox sees (the data dir is hidden in it). The token is read when a prompt starts and goes only into that
//! CLI's environment: never into the store, a log line or a sandbox's files. OpenCode keeps its own logins
//! (`opencode auth login` writes `auth.json`, shown read-only in the sandbox), so its login runs that command.
//! A remote provider's key (`login --provider e2b|daytona`) is kept the same way, and read only for the bridge's
//! own requests to that provider. `login --own` runs an agent's own sign-in with its HOME in `<data
//! dir>/logins/<agent>`: Codex's ChatGPT login file stays there and is shown to its local sessions given no key;
//! the token Claude Code's `setup-token` prints is kept like a key. One login of an agent at a time.

use std::io::{BufRead, IsTerminal, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema::{AuthMethod, AuthMethodAgent, AuthMethodTerminal};

use crate::agents::{AgentKind, Keeps, Login, LoginFile, OwnLogin};
use crate::config::Config;
use crate::error::Error;
use crate::paths;
use crate::sandbox::remote::{REMOTES, Remote};

/// The id of the agent-type method: `authenticate` with it checks that the agent's credential is there now.
pub fn check_method_id(agent: AgentKind) -> String {
    format!("{}-login", agent.as_str())
}

/// The id of the terminal-type method: the client runs our own command with `login` in a terminal.
pub fn terminal_method_id(agent: AgentKind) -> String {
    format!("{}-login-terminal", agent.as_str())
}

/// The id of the terminal-type method that runs the agent's own sign-in ([`OwnLogin`]).
pub fn own_method_id(agent: AgentKind) -> String {
    format!("{}-login-own-terminal", agent.as_str())
}

/// The command a person runs to log in, as the error messages and `doctor` name it.
pub fn login_command(agent: AgentKind) -> String {
    format!("acp-sandbox login --agent {}", agent.as_str())
}

/// The whole command line of `acp-sandbox login` for Zed's older terminal login (`_meta["terminal-auth"]`), which
/// runs it as it is instead of appending to the agent server's command: this executable, the data dir the token
/// goes to and the agent's own executable, if the bridge was given one.
pub fn login_launch(config: &Config, executable: &Path) -> (String, Vec<String>) {
    let agent = config.agent;
    let mut args = vec!["--data-dir".to_string(), config.data_dir.display().to_string()];
    if let Some(bin) = agent.bin_override(&config.agents) {
        args.extend([format!("--{}-bin", agent.as_str()), bin.display().to_string()]);
    }
    args.extend(["login", "--agent", agent.as_str()].map(String::from));
    (executable.display().to_string(), args)
}

/// What `initialize` offers: always a method `authenticate` can answer (the ACP registry requires one of type
/// `agent` or `terminal`, and its check may not run a terminal), and the terminal login where the
/// client can run one (`clientCapabilities.auth.terminal`, or Zed's `_meta["terminal-auth"]`: `launch`, the whole
/// command line of [`login_launch`], is then on the method as `_meta["terminal-auth"]`, which Zed runs when it does
/// not show typed terminal methods). The terminal method's arguments are appended to (or, in older clients,
/// replace) the agent server's own, so they name the agent themselves.
pub fn auth_methods(
    agent: AgentKind,
    client_runs_terminal: bool,
    launch: Option<(String, Vec<String>)>,
) -> Vec<AuthMethod> {
    let (login, name) = (login_command(agent), agent.display_name());
    let own = |args: &[&str]| format!("{} {}", agent.package().bin, args.join(" "));
    if agent.login() == Login::None {
        return Vec::new();
    }
    let description = match (agent.login(), agent.required_credential()) {
        (Login::Token { .. }, Some(variable)) => format!(
            "Checks for {name}'s access token: run `{login}` in a terminal (it stores the token for acp-sandbox), or set {variable} in the agent server's env"
        ),
        (Login::Token { .. }, None) => format!("Checks for {name}'s login: run `{login}` in a terminal"),
        (Login::Own { args }, _) => format!(
            "Checks for a login to {name}: run `{login}` ({name}'s own `{}`) in a terminal, or set your provider's API key in the agent server's env",
            own(args)
        ),
        (Login::None, _) => return Vec::new(),
    };
    let mut methods = vec![AuthMethod::Agent(
        AuthMethodAgent::new(check_method_id(agent), format!("{} login", agent.display_name()))
            .description(description),
    )];
    if client_runs_terminal || launch.is_some() {
        let description = match agent.login() {
            Login::Token { .. } => {
                format!("Asks for your {name} access token in a terminal and stores it for acp-sandbox")
            }
            Login::Own { args } => format!("Runs {name}'s own login (`{}`) in a terminal", own(args)),
            Login::None => return methods,
        };
        let terminal = |id: String, label: String, description: String, extra: &[&str]| {
            let meta = launch.clone().map(|(command, mut args)| {
                args.extend(extra.iter().map(|arg| arg.to_string()));
                let launch = serde_json::json!({ "command": command, "args": args, "label": label });
                serde_json::Map::from_iter([("terminal-auth".to_string(), launch)])
            });
            let args: Vec<String> =
                ["login", "--agent", agent.as_str()].iter().chain(extra).map(|arg| arg.to_string()).collect();
            AuthMethod::Terminal(AuthMethodTerminal::new(id, label).description(description).args(args).meta(meta))
        };
        methods.push(terminal(terminal_method_id(agent), format!("Log in to {name} in a terminal"), description, &[]));
        if let Some(own) = agent.own_login() {
            let kept = match own.keeps {
                Keeps::File(_) => "sessions on this machine use its login instead of a key",
                Keeps::PrintedToken => "the token it prints, pasted there, is kept for acp-sandbox",
            };
            let description = format!(
                "Runs {name}'s own sign-in with {} (`{} {}`) in a terminal; {kept}",
                own.with,
                own.program.unwrap_or(agent.package().bin),
                own.args.join(" ")
            );
            let label = format!("Sign in to {name} with {} in a terminal", own.with);
            methods.push(terminal(own_method_id(agent), label, description, &["--own"]));
        }
    }
    methods
}

/// `authenticate`: answers `Ok` when the agent's credential is there now, else the `-32000` that says what to do.
pub fn authenticate(config: &Config, agent: AgentKind, method_id: &str) -> Result<(), Error> {
    let own = agent.own_login().map(|_| own_method_id(agent));
    if method_id != check_method_id(agent)
        && method_id != terminal_method_id(agent)
        && own.as_deref() != Some(method_id)
    {
        return Err(Error::InvalidParams(format!(
            "Unknown authentication method {method_id:?}; this agent server offers {:?}",
            check_method_id(agent)
        )));
    }
    if agent.required_credential().is_some() {
        return credential(config, agent).map(|_| ());
    }
    agent.logged_in(&config.agents, &login_command(agent)).map_err(Error::NotLoggedIn)
}

/// The credential the agent's CLI needs, as (variable, value): the bridge's environment wins, then the token
/// `acp-sandbox login` stored. `Ok(None)` for an agent that needs none; [`Error::MissingCredential`] when it is
/// missing. Read each time, so a login while the bridge runs counts from the next prompt.
pub fn credential(config: &Config, agent: AgentKind) -> Result<Option<(&'static str, String)>, Error> {
    let Some(variable) = agent.required_credential() else {
        return Ok(None);
    };
    if let Some((name, value)) = env_credential(agent) {
        return Ok(Some((name, value)));
    }
    if let Some(token) = stored_token(config, agent) {
        return Ok(Some((agent.credential_variable(&token).unwrap_or(variable), token)));
    }
    match login_file(config, agent) {
        // The session's sandbox shows the login's file ([`own_login_for`]); a remote one would need it on its disk.
        Some((with, ..)) if config.sandbox.is_remote() => Err(Error::NotLoggedIn(format!(
            "{name}'s {with} sign-in is used only in a sandbox on this machine (a remote sandbox would keep the login \
             on its disk): set {variable} in the agent server's env, or run `{login}` to store a key",
            name = agent.display_name(),
            login = login_command(agent),
        ))),
        Some(_) => Ok(None),
        None => Err(Error::MissingCredential {
            agent: agent.display_name(),
            variable,
            login: login_command(agent),
            others: agent.other_credentials().iter().map(|other| format!(" (or {other})")).collect(),
        }),
    }
}

/// The file of the agent's own sign-in that keeps one ([`Keeps::File`]): where it is (`<data dir>/logins/<agent>/
/// <file>`), whether or not there is a login in it.
fn login_file_path(config: &Config, agent: AgentKind) -> Option<(&'static str, LoginFile, PathBuf)> {
    let OwnLogin { with, keeps: Keeps::File(file), .. } = agent.own_login()? else { return None };
    let path = own_login_dir(config, agent).join(file.file);
    Some((with, file, path))
}

/// [`login_file_path`] when there is a login in it: what it signed in with, the file's description, its path.
pub fn login_file(config: &Config, agent: AgentKind) -> Option<(&'static str, LoginFile, PathBuf)> {
    let (with, file, path) = login_file_path(config, agent)?;
    std::fs::metadata(&path).is_ok_and(|meta| meta.is_file() && meta.len() > 0).then_some((with, file, path))
}

/// The agent's own sign-in's home: its CLI's home while it signs in, in the data dir (which no sandbox sees).
pub fn own_login_dir(config: &Config, agent: AgentKind) -> PathBuf {
    config.data_dir.join("logins").join(agent.as_str())
}

/// How a command uses the agent's own login.
pub struct SignedIn {
    /// The login's file and where the command sees it (writable).
    pub shown: (PathBuf, PathBuf),
    /// The variables that make the CLI use it, in place of the fixed ones of the same names.
    pub env: Vec<(String, String)>,
}

/// For a command that is given no key of the agent's, the agent's own login if there is one, its file shown at its
/// place in the session's HOME (`home`). Local sandboxes only.
pub fn own_login_for(config: &Config, agent: AgentKind, env: &[(String, String)], home: &Path) -> Option<SignedIn> {
    let keyed = env.iter().any(|(name, _)| Some(name.as_str()) == agent.required_credential());
    if keyed || config.sandbox.is_remote() {
        return None;
    }
    let (_, file, path) = login_file(config, agent)?;
    Some(SignedIn { shown: (path, home.join(file.inside)), env: file.env })
}

/// The first of the agent's credential variables set in the bridge's environment, with its value.
fn env_credential(agent: AgentKind) -> Option<(&'static str, String)> {
    let mut names = agent.required_credential().into_iter().chain(agent.other_credentials().iter().copied());
    names.find_map(|name| env_value(name).map(|value| (name, value)))
}

/// A credential variable of the bridge's environment, unless it is unset or blank.
fn env_value(variable: &str) -> Option<String> {
    std::env::var(variable).ok().filter(|value| !value.trim().is_empty())
}

/// Deletes a stored secret: `true` when there was one.
fn delete_secret(path: &Path) -> std::io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Where the credential came from, for `doctor`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The variable is set in the bridge's environment.
    Environment(&'static str),
    /// The file `acp-sandbox login` wrote.
    Stored(PathBuf),
    /// The agent's own sign-in (`acp-sandbox login --own`): what it signed in with, and its file.
    Own(&'static str, PathBuf),
}

/// Where the agent's credential would come from now, if it has one.
pub fn source(config: &Config, agent: AgentKind) -> Option<Source> {
    agent.required_credential()?;
    match env_credential(agent) {
        Some((variable, _)) => Some(Source::Environment(variable)),
        None => match stored_token(config, agent) {
            Some(_) => Some(Source::Stored(token_path(config, agent))),
            None => login_file(config, agent).map(|(with, _, path)| Source::Own(with, path)),
        },
    }
}

/// Whether `logout` can log the agent out: it keeps a token for it (an agent with its own login keeps its own).
pub fn can_log_out(agent: AgentKind) -> bool {
    matches!(agent.login(), Login::Token { .. }) && agent.required_credential().is_some()
}

/// ACP `logout`: deletes the token `acp-sandbox login` stored for the agent, and nothing else. Refused in words when
/// the agent keeps its own login, or when its variable in the agent server's environment would still log it in.
pub fn logout(config: &Config, agent: AgentKind) -> Result<(), Error> {
    let name = agent.display_name();
    if !can_log_out(agent) {
        return Err(Error::InvalidParams(format!(
            "{name} keeps its own login, which acp-sandbox does not store: log out with {name} itself"
        )));
    }
    for path in login_files(config, agent) {
        match delete_secret(&path) {
            Ok(true) => {
                tracing::info!(agent = agent.as_str(), path = %path.display(), "logged out: the stored login is deleted")
            }
            Ok(false) => {}
            Err(e) => return Err(Error::LogoutFailed(format!("could not delete {}: {e}", path.display()))),
        }
    }
    match env_credential(agent) {
        Some((variable, _)) => Err(Error::LogoutFailed(format!(
            "{variable} is set in the agent server's environment (the editor's settings of this agent), which \
             acp-sandbox cannot unset: {name} stays logged in until it is removed there"
        ))),
        None => Ok(()),
    }
}

/// The files that log the agent in which `acp-sandbox login` wrote: its token's, and its own sign-in's.
fn login_files(config: &Config, agent: AgentKind) -> Vec<PathBuf> {
    let own = login_file_path(config, agent).map(|(.., path)| path);
    std::iter::once(token_path(config, agent)).chain(own).collect()
}

/// The file a stored token lives in.
pub fn token_path(config: &Config, agent: AgentKind) -> PathBuf {
    secret_path(&config.data_dir, agent.as_str())
}

/// The stored token, if there is a non-empty one.
pub fn stored_token(config: &Config, agent: AgentKind) -> Option<String> {
    read_secret(&token_path(config, agent))
}

/// The file a provider's stored key lives in.
pub fn provider_key_path(config: &Config, provider: &str) -> PathBuf {
    secret_path(&config.data_dir, provider)
}

/// The variables the remote providers are configured by: the bridge's environment, and for a provider's key
/// (`E2B_API_KEY`, `DAYTONA_API_KEY`) not set there, the one `acp-sandbox login --provider` stored. Read at each
/// call; only the bridge's own requests ever see the key.
pub fn provider_variables(config: &Config) -> impl Fn(&str) -> Option<String> + Send + Sync + 'static {
    let data = config.data_dir.clone();
    move |name| {
        match std::env::var(name) {
            Ok(value) if !value.trim().is_empty() => return Some(value),
            _ => {}
        }
        let remote = REMOTES.iter().find(|remote| remote.key_variable() == name)?;
        read_secret(&secret_path(&data, remote.name()))
    }
}

fn secret_path(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join("credentials").join(name)
}

fn read_secret(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let token = text.trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// Why a token cannot be stored.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// Nothing was typed or piped.
    #[error("no token given: paste the access token (from {0}) and press Enter, or pipe it on stdin")]
    Empty(&'static str),
    /// Several lines, or control characters: not a token.
    #[error("that is not an access token (it has more than one line or control characters); nothing was stored")]
    Malformed,
    /// The agent keeps its own logins, or needs none.
    #[error("{0} keeps no token in acp-sandbox")]
    NotStored(&'static str),
    /// The file could not be written.
    #[error("cannot store the token in {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `--own` for an agent without a sign-in of its own.
    #[error("{0} has no sign-in of its own that acp-sandbox runs: `acp-sandbox login` without --own stores its key")]
    NoOwnLogin(&'static str),
    /// The CLI's own login could not be run.
    #[error("{0}")]
    Cli(String),
}

/// Stores `token` for the agent: a 0600 file written beside its final name and renamed over it, in a 0700
/// folder of the data dir, so no reader ever sees a partial or world-readable token.
pub fn store_token(config: &Config, agent: AgentKind, token: &str) -> Result<PathBuf, LoginError> {
    if agent.required_credential().is_none() {
        return Err(LoginError::NotStored(agent.display_name()));
    }
    store_secret(config, agent.as_str(), token, token_page(agent))
}

/// Stores a remote provider's API key (`acp-sandbox login --provider`), as a token is stored.
pub fn store_provider_key(config: &Config, provider: &dyn Remote, key: &str) -> Result<PathBuf, LoginError> {
    store_secret(config, provider.name(), key, provider.key_page())
}

fn store_secret(config: &Config, name: &str, token: &str, page: &'static str) -> Result<PathBuf, LoginError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(LoginError::Empty(page));
    }
    if token.chars().any(char::is_control) {
        return Err(LoginError::Malformed);
    }
    let path = secret_path(&config.data_dir, name);
    let io = |source| LoginError::Io { path: path.clone(), source };
    let dir = path.parent().unwrap_or(&config.data_dir);
    paths::create_private_dir(&config.data_dir).map_err(io)?;
    paths::create_private_dir(dir).map_err(io)?;
    let staging = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&staging)?;
        // The mode asked for is masked by the umask; a 0600 file needs no widening, so set it exactly.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(token.as_bytes())?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        std::fs::rename(&staging, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&staging);
        return Err(io(e));
    }
    Ok(path)
}

/// Where a person gets the token.
fn token_page(agent: AgentKind) -> &'static str {
    match agent.login() {
        Login::Token { page } => page,
        Login::Own { .. } | Login::None => "your provider",
    }
}

/// Reads one token: from the terminal without echo when stdin is one, else the first line of stdin.
fn read_token(prompt: &str, terminal: &mut dyn Write) -> Result<String, LoginError> {
    let stdin = std::io::stdin();
    let io = |source| LoginError::Io { path: PathBuf::from("stdin"), source };
    let mut line = String::new();
    if stdin.is_terminal() {
        // Off before the prompt shows, so nothing typed after it can be echoed.
        let echo = EchoOff::new(&stdin);
        let _ = write!(terminal, "{prompt}");
        let _ = terminal.flush();
        let read = stdin.lock().read_line(&mut line);
        drop(echo);
        read.map_err(io)?;
    } else {
        stdin.lock().read_line(&mut line).map_err(io)?;
        // A second line means this was not one token (a file piped by mistake): refuse rather than guess.
        let mut rest = String::new();
        stdin.lock().read_line(&mut rest).map_err(io)?;
        if !rest.trim().is_empty() {
            return Err(LoginError::Malformed);
        }
    }
    Ok(line.trim().to_string())
}

/// Turns the terminal's echo off while a token is typed, and back on however reading ends.
struct EchoOff {
    saved: Option<nix::sys::termios::Termios>,
}

impl EchoOff {
    fn new(stdin: &std::io::Stdin) -> Self {
        use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
        let saved = tcgetattr(stdin).ok();
        if let Some(saved) = &saved {
            let mut quiet = saved.clone();
            quiet.local_flags.remove(LocalFlags::ECHO);
            // Enter must still show as a new line.
            quiet.local_flags.insert(LocalFlags::ECHONL);
            let _ = tcsetattr(stdin, SetArg::TCSANOW, &quiet);
        }
        Self { saved }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, saved);
        }
    }
}

/// `acp-sandbox logout`: deletes what `acp-sandbox login` stored, the agent's token or (`provider`) a provider's
/// key, and says on `terminal` what it deleted and what still logs in. Answers the exit code: 1 when the agent
/// keeps its own login (nothing of ours to delete) or the file could not be deleted.
pub fn logout_command(config: &Config, provider: Option<&str>, terminal: &mut dyn Write) -> u8 {
    let (paths, variable) = match provider.map(crate::sandbox::remote::named) {
        Some(Some(remote)) => (vec![provider_key_path(config, remote.name())], remote.key_variable()),
        Some(None) => {
            let _ = writeln!(terminal, "acp-sandbox keeps no key of that provider");
            return 1;
        }
        None => match config.agent.required_credential().filter(|_| can_log_out(config.agent)) {
            Some(variable) => (login_files(config, config.agent), variable),
            None => {
                let name = config.agent.display_name();
                let _ = writeln!(
                    terminal,
                    "{name} keeps its own login, which acp-sandbox does not store: log out with {name} itself"
                );
                return 1;
            }
        },
    };
    let mut deleted = false;
    for path in &paths {
        match delete_secret(path) {
            Ok(true) => {
                deleted = true;
                let _ = writeln!(terminal, "Deleted {}.", path.display());
            }
            Ok(false) => {}
            Err(e) => {
                let _ = writeln!(terminal, "Could not delete {}: {e}", path.display());
                return 1;
            }
        }
    }
    if !deleted {
        let names: Vec<String> = paths.iter().map(|path| path.display().to_string()).collect();
        let _ = writeln!(terminal, "Nothing stored: {} does not exist.", names.join(" or "));
    }
    if env_value(variable).is_some() {
        let _ = writeln!(terminal, "{variable} is still set in this environment, and it logs in without the file.");
    }
    0
}

/// `acp-sandbox login`: for an agent that needs a token, asks for it and stores it; for one that keeps its own
/// logins, runs its own login command on this terminal. Talks to the person on `terminal` (stderr); answers the exit code.
pub async fn login(
    config: &Config,
    provider: Option<&str>,
    own: bool,
    terminal: &mut dyn Write,
) -> Result<u8, LoginError> {
    if own {
        return own_sign_in(config, config.agent, terminal).await;
    }
    if let Some(provider) = provider {
        let Some(remote) = crate::sandbox::remote::named(provider) else {
            return Err(LoginError::NotStored("that provider"));
        };
        let (provider, variable) = (remote.name(), remote.key_variable());
        let key = read_token(&format!("{variable} (from {}; the input is not shown): ", remote.key_page()), terminal)?;
        let path = store_provider_key(config, remote, &key)?;
        let _ = writeln!(
            terminal,
            "Stored in {} (readable by you only). acp-sandbox uses it for `--sandbox {provider}` when {variable} is not in its environment; it never enters a sandbox. `acp-sandbox logout --provider {provider}` deletes it.",
            path.display()
        );
        return Ok(0);
    }
    let agent = config.agent;
    let name = agent.display_name();
    match (agent.login(), agent.required_credential()) {
        (Login::Token { page }, Some(_)) => {
            let token = read_token(&format!("{name} access token (from {page}; the input is not shown): "), terminal)?;
            store_and_say(config, agent, &token, terminal)
        }
        (Login::Token { .. }, None) | (Login::None, _) => Err(LoginError::NotStored(name)),
        (Login::Own { args }, _) => {
            let executable = executable(config, agent, terminal).await?;
            let status = crate::sandbox::host::run_interactive(&executable, args, &[]).await.map_err(|e| {
                LoginError::Cli(format!("cannot run `{} {}`: {e}", executable.display(), args.join(" ")))
            })?;
            Ok(exit_code(status))
        }
    }
}

/// The agent's executable, installed first when it is not there yet.
async fn executable(config: &Config, agent: AgentKind, terminal: &mut dyn Write) -> Result<PathBuf, LoginError> {
    if let Some(path) = crate::locate::installed_executable(config, agent) {
        return Ok(path);
    }
    let (name, package) = (agent.display_name(), agent.package());
    let _ = writeln!(terminal, "Installing {name} {} (first use)…", package.version);
    let cancel = tokio_util::sync::CancellationToken::new();
    crate::sandbox::install::install(package, &paths::tools_dir(&config.data_dir), &cancel)
        .await
        .map_err(|e| LoginError::Cli(format!("{name} is not installed and could not be: {e}")))
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    status.code().and_then(|code| u8::try_from(code).ok()).unwrap_or(1)
}

/// `acp-sandbox login --own`: the agent's own sign-in ([`OwnLogin`]) on this terminal, with its home in the data
/// dir. What it makes replaces what was kept before: one login at a time, the last one made.
async fn own_sign_in(config: &Config, agent: AgentKind, terminal: &mut dyn Write) -> Result<u8, LoginError> {
    let name = agent.display_name();
    let Some(own) = agent.own_login() else {
        return Err(LoginError::NoOwnLogin(name));
    };
    let executable = executable(config, agent, terminal).await?;
    // Beside the agent's own executable, in its install (npm's `.bin`) or wherever it was found.
    let program = match own.program {
        Some(program) => executable.with_file_name(program),
        None => executable.clone(),
    };
    if !program.exists() {
        return Err(LoginError::Cli(format!(
            "{name}'s sign-in needs `{}` beside {}, and it is not there",
            own.program.unwrap_or_default(),
            executable.display()
        )));
    }
    let dir = own_login_dir(config, agent);
    let io = |source| LoginError::Io { path: dir.clone(), source };
    for dir in [&config.data_dir, &config.data_dir.join("logins"), &dir] {
        paths::create_private_dir(dir).map_err(io)?;
    }
    let mut env = vec![("HOME", dir.as_path())];
    if let Keeps::File(file) = &own.keeps {
        env.push((file.home_variable, dir.as_path()));
    }
    let status = crate::sandbox::host::run_interactive(&program, &own.args, &env)
        .await
        .map_err(|e| LoginError::Cli(format!("cannot run `{} {}`: {e}", program.display(), own.args.join(" "))))?;
    if !status.success() {
        return Ok(exit_code(status));
    }
    let Keeps::File(file) = own.keeps else {
        let token = read_token(&format!("Paste the token {name} printed (the input is not shown): "), terminal)?;
        return store_and_say(config, agent, &token, terminal);
    };
    let Some((.., path)) = login_file(config, agent) else {
        return Err(LoginError::Cli(format!(
            "{name} said it signed in, but wrote no login to {}",
            dir.join(file.file).display()
        )));
    };
    let key = token_path(config, agent);
    if delete_secret(&key).map_err(|source| LoginError::Io { path: key.clone(), source })? {
        let _ =
            writeln!(terminal, "Deleted the key stored before in {}: sessions use this sign-in now.", key.display());
    }
    let variable = agent.required_credential().unwrap_or("its key");
    let _ = writeln!(
        terminal,
        "Signed in with {with}: the login is kept in {} (readable by you only) and each session on this machine uses \
         it through the bridge's model gateway, which refreshes it: {name} sees placeholders as its ~/{inside}. \
         {variable} set in the agent server's environment wins. `acp-sandbox logout` deletes it.",
        path.display(),
        with = own.with,
        inside = file.inside,
    );
    Ok(0)
}

/// Stores the agent's token (a login file of its own sign-in goes: one login at a time) and says where it went.
fn store_and_say(config: &Config, agent: AgentKind, token: &str, terminal: &mut dyn Write) -> Result<u8, LoginError> {
    let (name, variable) = (agent.display_name(), agent.required_credential().unwrap_or("its key"));
    let path = store_token(config, agent, token)?;
    if let Some((with, _, signed_in)) = login_file(config, agent) {
        delete_secret(&signed_in).map_err(|source| LoginError::Io { path: signed_in.clone(), source })?;
        let _ = writeln!(terminal, "Deleted the {with} sign-in kept in {}.", signed_in.display());
    }
    let passed = agent.credential_variable(token.trim()).unwrap_or(variable);
    let _ = writeln!(
        terminal,
        "Stored in {} (readable by you only). acp-sandbox passes it to {name} as {passed}; {variable} set in the agent server's environment wins. `acp-sandbox logout` deletes it.",
        path.display()
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amp() -> AgentKind {
        AgentKind::parse("amp").unwrap()
    }

    fn opencode() -> AgentKind {
        AgentKind::parse("opencode").unwrap()
    }

    fn config(dir: &Path) -> Config {
        Config::new(amp(), dir.join("data"))
    }

    #[test]
    fn a_stored_token_is_a_0600_file_in_a_0700_folder_and_reads_back_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let path = store_token(&config, amp(), "  sgamp_user_123 \n").unwrap();
        assert_eq!(path, config.data_dir.join("credentials").join("amp"));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "sgamp_user_123\n");
        assert_eq!(stored_token(&config, amp()).as_deref(), Some("sgamp_user_123"));
        // A second login replaces the first, and leaves no staging file behind.
        store_token(&config, amp(), "sgamp_user_456").unwrap();
        assert_eq!(stored_token(&config, amp()).as_deref(), Some("sgamp_user_456"));
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("amp")]);
    }

    #[test]
    fn empty_multi_line_and_opencode_tokens_are_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        assert!(matches!(store_token(&config, amp(), " \n"), Err(LoginError::Empty(_))));
        assert!(matches!(store_token(&config, amp(), "a\nb"), Err(LoginError::Malformed)));
        assert!(matches!(store_token(&config, opencode(), "x"), Err(LoginError::NotStored("OpenCode"))));
        assert!(!token_path(&config, amp()).exists());
    }

    #[test]
    fn amp_offers_a_check_always_and_the_terminal_login_only_to_clients_that_run_one() {
        let plain = serde_json::to_value(auth_methods(amp(), false, None)).unwrap();
        assert_eq!(plain.as_array().unwrap().len(), 1);
        assert_eq!(plain[0]["id"], "amp-login");
        assert_eq!(plain[0].get("type"), None, "an agent method is the default type");
        let both = serde_json::to_value(auth_methods(amp(), true, None)).unwrap();
        assert_eq!(both[1]["type"], "terminal");
        assert_eq!(both[1]["id"], "amp-login-terminal");
        assert_eq!(both[1]["args"], serde_json::json!(["login", "--agent", "amp"]));
        let opencode = serde_json::to_value(auth_methods(opencode(), true, None)).unwrap();
        assert_eq!(opencode[1]["args"], serde_json::json!(["login", "--agent", "opencode"]));
    }

    fn codex() -> AgentKind {
        AgentKind::parse("codex").unwrap()
    }

    #[test]
    fn codex_offers_its_own_chatgpt_sign_in_as_a_terminal_login_beside_the_key() {
        let methods = serde_json::to_value(auth_methods(codex(), true, None)).unwrap();
        let ids: Vec<&str> = methods.as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["codex-login", "codex-login-terminal", "codex-login-own-terminal"]);
        assert_eq!(methods[2]["type"], "terminal");
        assert_eq!(methods[2]["name"], "Sign in to Codex with ChatGPT in a terminal");
        assert_eq!(methods[2]["args"], serde_json::json!(["login", "--agent", "codex", "--own"]));
        assert_eq!(
            methods[2]["description"],
            "Runs Codex's own sign-in with ChatGPT (`codex login --device-auth`) in a terminal; sessions on this \
             machine use its login instead of a key"
        );
        let claude = serde_json::to_value(auth_methods(AgentKind::parse("claude").unwrap(), true, None)).unwrap();
        assert_eq!(
            (&claude[2]["name"], &claude[2]["description"]),
            (
                &serde_json::json!("Sign in to Claude Code with a Claude subscription in a terminal"),
                &serde_json::json!(
                    "Runs Claude Code's own sign-in with a Claude subscription (`claude-agent-acp --cli setup-token`) \
                     in a terminal; the token it prints, pasted there, is kept for acp-sandbox"
                )
            )
        );
        let launch = ("/bin/acp-sandbox".to_string(), vec!["login".to_string(), "--agent".into(), "codex".into()]);
        let legacy = serde_json::to_value(auth_methods(codex(), false, Some(launch))).unwrap();
        assert_eq!(
            legacy[2]["_meta"]["terminal-auth"]["args"],
            serde_json::json!(["login", "--agent", "codex", "--own"])
        );
        assert_eq!(serde_json::to_value(auth_methods(amp(), true, None)).unwrap().as_array().unwrap().len(), 2);
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(codex(), dir.path().join("data"));
        if env_credential(codex()).is_none() {
            assert!(matches!(
                authenticate(&config, codex(), "codex-login-own-terminal"),
                Err(Error::MissingCredential { .. })
            ));
        }
    }

    #[test]
    fn a_chatgpt_sign_in_logs_codex_in_on_this_machine_only_and_logout_deletes_it_with_the_key() {
        if env_credential(codex()).is_some() {
            return; // OPENAI_API_KEY in this process's environment wins over every login
        }
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new(codex(), dir.path().join("data"));
        let file = own_login_dir(&config, codex()).join("auth.json");
        assert!(matches!(credential(&config, codex()), Err(Error::MissingCredential { .. })));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "").unwrap();
        assert!(
            matches!(credential(&config, codex()), Err(Error::MissingCredential { .. })),
            "an empty file is no login"
        );
        std::fs::write(&file, r#"{"auth_mode": "chatgpt"}"#).unwrap();
        assert_eq!(credential(&config, codex()).unwrap(), None, "signed in: no key to pass");
        assert_eq!(source(&config, codex()), Some(Source::Own("ChatGPT", file.clone())));
        let home = Path::new("/s/home");
        let signed_in = own_login_for(&config, codex(), &[], home).unwrap();
        assert_eq!(signed_in.shown, (file.clone(), home.join(".codex/auth.json")));
        let Some(OwnLogin { keeps: Keeps::File(login), .. }) = codex().own_login() else { panic!("no login file") };
        assert_eq!(signed_in.env, login.env);
        let keyed = [("OPENAI_API_KEY".to_string(), "sk-1".to_string())];
        assert!(own_login_for(&config, codex(), &keyed, home).is_none(), "a key given wins");
        // A stored key wins too (a login replaces the other, so both are there only by hand).
        store_token(&config, codex(), "sk-stored").unwrap();
        assert_eq!(credential(&config, codex()).unwrap(), Some(("OPENAI_API_KEY", "sk-stored".to_string())));
        std::fs::remove_file(token_path(&config, codex())).unwrap();
        config.sandbox = crate::sandbox::SandboxChoice::Remote(crate::sandbox::remote::named("e2b").unwrap());
        match credential(&config, codex()) {
            Err(Error::NotLoggedIn(message)) => assert_eq!(
                message,
                "Codex's ChatGPT sign-in is used only in a sandbox on this machine (a remote sandbox would keep the \
                 login on its disk): set OPENAI_API_KEY in the agent server's env, or run `acp-sandbox login --agent \
                 codex` to store a key"
            ),
            other => panic!("{other:?}"),
        }
        assert!(own_login_for(&config, codex(), &[], home).is_none());
        store_token(&config, codex(), "sk-stored").unwrap();
        logout(&config, codex()).unwrap();
        assert!(!file.exists() && !token_path(&config, codex()).exists(), "logout deletes the sign-in and the key");
    }

    #[test]
    fn an_unknown_method_is_invalid_params() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(authenticate(&config(dir.path()), amp(), "nope"), Err(Error::InvalidParams(_))));
    }

    #[test]
    fn zeds_older_terminal_login_gets_the_whole_command_line_with_the_data_dir_and_the_agents_executable() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path());
        config.agents.amp.amp_bin = Some(PathBuf::from("/opt/amp/bin/amp"));
        let launch = login_launch(&config, Path::new("/usr/local/bin/acp-sandbox"));
        let data = config.data_dir.display().to_string();
        let expected_args = ["--data-dir", &data, "--amp-bin", "/opt/amp/bin/amp", "login", "--agent", "amp"];
        assert_eq!(launch, ("/usr/local/bin/acp-sandbox".to_string(), expected_args.map(String::from).to_vec()));
        let methods = serde_json::to_value(auth_methods(amp(), false, Some(launch))).unwrap();
        assert_eq!(
            methods[1],
            serde_json::json!({
                "type": "terminal", "id": "amp-login-terminal", "name": "Log in to Amp in a terminal",
                "description": "Asks for your Amp access token in a terminal and stores it for acp-sandbox",
                "args": ["login", "--agent", "amp"],
                "_meta": {"terminal-auth": {"command": "/usr/local/bin/acp-sandbox", "args": expected_args,
                                            "label": "Log in to Amp in a terminal"}}
            })
        );
    }

    #[test]
    fn logout_deletes_the_stored_token_only_and_an_agent_with_its_own_login_is_refused_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let path = store_token(&config, amp(), "sgamp_user_123").unwrap();
        let key = store_provider_key(&config, crate::sandbox::remote::named("e2b").unwrap(), "e2b_key").unwrap();
        // AMP_API_KEY in this process's environment would still log Amp in: then logout says so (the e2e tests
        // try both).
        let in_env = std::env::var("AMP_API_KEY").is_ok_and(|value| !value.trim().is_empty());
        let logged_out = |result: Result<(), Error>| match (result, in_env) {
            (Ok(()), false) | (Err(Error::LogoutFailed(_)), true) => {}
            (other, _) => panic!("{other:?} with AMP_API_KEY set: {in_env}"),
        };
        logged_out(logout(&config, amp()));
        assert!(!path.exists());
        assert!(key.exists(), "a provider's key is not the agent's login");
        assert_eq!(stored_token(&config, amp()), None);
        // Logged out already: nothing to delete, and that is no error.
        logged_out(logout(&config, amp()));
        assert_eq!((can_log_out(amp()), can_log_out(opencode())), (true, false));
        match logout(&config, opencode()) {
            Err(Error::InvalidParams(message)) => assert_eq!(
                message,
                "OpenCode keeps its own login, which acp-sandbox does not store: log out with OpenCode itself"
            ),
            other => panic!("{other:?}"),
        }
    }
}
