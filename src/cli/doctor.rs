//! `acp-sandbox doctor`: what this machine, this configuration and each agent's CLI allow, one line each, with an
//! ERROR line for each problem that would stop a session.

use std::io::Write;
use std::process::ExitCode;

use acp_sandbox::agents::{AGENTS, AgentKind};
use acp_sandbox::config::Config;
use acp_sandbox::config::ServerScope;
use acp_sandbox::locate::Location;
use acp_sandbox::sandbox::CheckLevel;
use acp_sandbox::sandbox::local::Isolation;
#[cfg(linux_sandbox)]
use acp_sandbox::sandbox::local::probe_bwrap;
use acp_sandbox::sandbox::{SandboxChoice, WorkspaceMode};

/// What `doctor` says about how the agent will be driven, given the version it printed; an error when it cannot be.
fn backend(config: &Config, agent: AgentKind, version: &str) -> Option<Result<String, String>> {
    let major = acp_sandbox::agents::major_version(version);
    if let Some(newest) = agent.newest_major(&config.agents)
        && major.is_some_and(|major| major > newest)
    {
        let name = agent.display_name();
        let mut settled = config.agents.clone();
        if let (Some(_), Some(major)) = (agent.bin_override(&config.agents), major)
            && let Some(how) = agent.drive_newer_major(&mut settled, major)
        {
            return agent.describe_backend(&settled, Ok("session")).map(|backend| Ok(format!("{backend}; {how}")));
        }
        return Some(match agent.bin_override(&config.agents) {
            Some(_) => Err(format!(
                "{name} {version} is a major version acp-sandbox cannot drive yet; point --{}-bin at a {newest}.x",
                agent.as_str()
            )),
            None => Ok(format!(
                "{name} {version} is not driven (a {}.x): the pinned {} of the tools cache is used instead",
                newest + 1,
                agent.package().version
            )),
        });
    }
    let server = match config.sandbox {
        // Sessions in a remote sandbox fall back to one process per prompt (their provider starts no server there
        // yet).
        SandboxChoice::Remote(_) => {
            Err(format!("does not run in a remote sandbox yet, --sandbox {}", config.sandbox.as_str()))
        }
        _ => Ok(format!(
            "{} (stopped after {} s idle, at most {} at once)",
            match (config.server_scope, config.workspace) {
                (ServerScope::Workspace, WorkspaceMode::Direct) =>
                    "workspace, shared by its new threads (--server-scope workspace)",
                (ServerScope::Workspace, _) => "session (review mode gives each its own copy)",
                (ServerScope::Session, _) => "session (--server-scope session)",
            },
            config.server_idle_timeout.as_secs(),
            config.max_servers
        )),
    };
    agent.describe_backend(&config.agents, server.as_deref().map_err(String::as_str)).map(Ok)
}

/// Which agents' `--<agent>-bin` was set by its environment variable rather than by the flag.
#[derive(Clone, Debug)]
pub(super) struct BinSource {
    from_env: Vec<AgentKind>,
}

impl BinSource {
    pub(super) fn of(matches: &clap::ArgMatches) -> Self {
        let from_env = |agent: &AgentKind| {
            let id = agent.bin_setting().map_or_else(|| format!("{}_bin", agent.as_str()), |(id, _, _)| id.to_string());
            matches.value_source(&id) == Some(clap::parser::ValueSource::EnvVariable)
        };
        Self { from_env: AGENTS.iter().copied().filter(from_env).collect() }
    }

    /// Where the override of `agent`'s executable came from, in words.
    fn describe(&self, agent: AgentKind) -> String {
        match (self.from_env.contains(&agent), agent.bin_setting()) {
            (true, Some((_, _, variable))) => format!("from {variable}"),
            (false, Some((_, flag, _))) => format!("from {flag}"),
            (true, None) => format!("from ACP_SANDBOX_{}_BIN", agent.as_str().to_uppercase()),
            (false, None) => format!("from --{}-bin", agent.as_str()),
        }
    }
}

/// What to do when bubblewrap cannot run here: install it, or allow the user namespaces it needs.
#[cfg(linux_sandbox)]
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

pub(super) async fn doctor(config: Config, bins: BinSource) -> anyhow::Result<ExitCode> {
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
    for &agent in AGENTS.iter().filter(|agent| !agent.test_only() || **agent == config.agent) {
        let package = agent.package();
        let used = agent == config.agent;
        let found = match acp_sandbox::locate::locate(&config, agent) {
            // A bare name is looked up on PATH when the agent starts, as a shell would.
            Some(Location::Override(path))
                if !path.exists() && (path.components().count() > 1 || which::which(&path).is_err()) =>
            {
                let missing = format!("{} not found ({})", path.display(), bins.describe(agent));
                if used { error(missing) } else { missing }
            }
            Some(Location::Override(path)) => format!("{} ({})", path.display(), bins.describe(agent)),
            Some(Location::OnPath(path)) => format!("{} (on PATH)", path.display()),
            Some(Location::Installed(path)) => format!("{} (installed by acp-sandbox)", path.display()),
            // Nothing to install: the agent is named by a setting that is not given (`--agent custom` without its
            // `--agent-command`).
            None if let Some(problem) = agent.settings_problem(&config.agents) => {
                if used {
                    error(problem)
                } else {
                    format!("not set up: {problem}")
                }
            }
            None if which::which("npm").is_ok() => {
                to_install |= used;
                format!("not installed: {}@{} will be installed from npm on first use", package.name, package.version)
            }
            None if used => error("not found, and npm is missing to install it".to_string()),
            None => "not found, and npm is missing to install it".to_string(),
        };
        out!("{:<11} {found}", agent.display_name());
        if let Some(variable) = agent.required_credential() {
            let state = match acp_sandbox::auth::source(&config, agent) {
                Some(acp_sandbox::auth::Source::Environment(_)) => "set".to_string(),
                Some(acp_sandbox::auth::Source::Stored(path)) => format!("stored by login in {}", path.display()),
                Some(acp_sandbox::auth::Source::Own(with, path)) => {
                    format!("not needed: signed in with {with} (login in {})", path.display())
                }
                None => {
                    let login = acp_sandbox::auth::login_command(agent);
                    let own = agent.own_login().map(|own| format!(" (with `--own`: sign in with {})", own.with));
                    let missing = format!("missing: set {variable} or run `{login}`{}", own.unwrap_or_default());
                    if used { error(missing) } else { missing }
                }
            };
            out!("{:<11} {variable}: {state}", "");
        }
        for line in agent.doctor_lines(&config.agents, config.model.as_deref()) {
            out!("{:<11} {line}", "");
        }
        if config.sandbox.is_remote() {
            out!("{:<11} {}", "", remote_credentials_line(agent));
        } else {
            out!("{:<11} {}", "", agent.credentials_line());
        }
    }
    out!();
    let isolation = Isolation::resolve(config.sandbox);
    match &isolation {
        // Its description says why there is no isolation, `--sandbox none` among the reasons.
        Ok(isolation @ Isolation::None(_)) => out!("sandbox     {}", isolation.describe()),
        // Every prompt would be refused: an error.
        Ok(isolation @ Isolation::Refused(_)) => out!("sandbox     {}", error(isolation.describe())),
        // A remote choice leaves the local sandbox to the bridge's own short commands (the provider has its lines).
        Ok(isolation) if config.sandbox.is_remote() => out!(
            "sandbox     {} for the bridge's own commands; sessions: --sandbox {} (below)",
            isolation.describe(),
            config.sandbox.as_str()
        ),
        Ok(isolation) => out!("sandbox     {} (--sandbox {})", isolation.describe(), config.sandbox.as_str()),
        Err(e) => out!("sandbox     {}", error(e.to_string())),
    }
    // Off Linux the sandbox line says why there is no bubblewrap and what to use instead.
    #[cfg(linux_sandbox)]
    if !matches!(config.sandbox, SandboxChoice::None | SandboxChoice::Landlock) && probe_bwrap().is_err() {
        for line in bwrap_advice(which::which("bwrap").is_ok()) {
            out!("            {line}");
        }
    }
    // Refused: nothing runs, so there is nothing more to say about what would hold.
    if let Ok(isolation) = isolation
        && !matches!(isolation, Isolation::Refused(_))
    {
        let settings = config.local_settings(isolation);
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
                if let Some(backend) = backend(&config, agent, &version) {
                    let backend = backend.unwrap_or_else(&mut error);
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
    for line in acp_sandbox::sandbox::local::warm::describe(&acp_sandbox::paths::run_dir(&config.data_dir)) {
        out!("            {line}");
    }
    if errors > 0 {
        eprintln!("{errors} problem{} found (the ERROR lines)", if errors == 1 { "" } else { "s" });
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `doctor`'s line on what of the agent's credentials enters a remote sandbox, which cannot reach the model gateway:
/// its key variables and its stored logins' variable, as they are; never the remote provider's key.
fn remote_credentials_line(agent: AgentKind) -> String {
    let mut parts = Vec::new();
    let keys: Vec<&str> =
        agent.required_credential().into_iter().chain(agent.other_credentials().iter().copied()).collect();
    if !keys.is_empty() {
        parts.push(format!("{} (from your environment or `login`)", keys.join(", ")));
    }
    // Only the names: the values are read from the user's files and dropped here.
    for (name, _) in agent.credential_env(&acp_sandbox::paths::user_data_dir()) {
        parts.push(format!("{name} (every login of its file, OAuth ones included)"));
    }
    parts.push("the model keys of your environment it takes, and what --pass-env gives it".into());
    // A login file (Codex's ChatGPT login) is local only; a printed token is kept as a key is.
    let own = agent
        .own_login()
        .filter(|own| matches!(own.keeps, acp_sandbox::agents::Keeps::File(_)))
        .map(|own| format!("; a sign-in of `login --own` ({}) is not used there", own.with));
    format!(
        "credentials: in a remote sandbox (no model gateway there) these reach its CLI as variables, as they are: {}{}",
        parts.join("; "),
        own.unwrap_or_default()
    )
}
