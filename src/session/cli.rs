//! The agent's CLI as the bridge runs it outside a turn: its version (probed once per executable file), the
//! executable the bridge may drive, the variables it gets, and every command line of it (`cli_spec`, `run_once`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::agents::{AgentKind, major_version};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::lines::stderr_tail;
use crate::locate::installed_executable;
use crate::paths;
use crate::sandbox::NETWORK_ENV;
use crate::sandbox::local::LocalProvider;
use crate::sandbox::net::gateway::{Gateway, Held};
use crate::sandbox::{ExecSpec, Sandbox, SandboxProvider};

use super::{Bridge, VersionKey, versions};

impl Bridge {
    /// The version line `<cli> --version` prints, asked once per executable file (in a sandbox of the bridge's own),
    /// and remembered in the data dir for later bridges: a cache hit runs no process.
    pub(super) async fn cli_version(&self, agent: AgentKind, executable: &Path) -> Option<String> {
        let key = self.version_key(executable).await;
        if let Some(known) = self.known_version(&key).await {
            return known;
        }
        // One probe at a time: the one started with the bridge is usually the answer of the first session's.
        let _one = self.version_probe.lock().await;
        if let Some(known) = self.known_version(&key).await {
            return known;
        }
        let version = run_once(
            &self.config,
            self.own_provider.as_ref(),
            "_version",
            agent,
            executable,
            &["--version"],
            &Default::default(),
        )
        .await
        .ok()
        .and_then(|out| out.lines().next().map(|line| line.trim().to_string()))
        .filter(|line| !line.is_empty());
        tracing::info!(executable = %executable.display(), version = ?version, "the CLI's version");
        // A failed probe is remembered in this process only: it may have been the machine, not the file.
        if let (Some(file), Some(version)) = (key.1.clone(), version.clone()) {
            let data_dir = self.config.data_dir.clone();
            let _ = tokio::task::spawn_blocking(move || versions::remember(&data_dir, &file, &version)).await;
        }
        self.versions.lock().unwrap_or_else(|p| p.into_inner()).insert(key, version.clone());
        version
    }

    /// Which file `executable` is now (a stat, no process).
    pub(super) async fn version_key(&self, executable: &Path) -> VersionKey {
        let path = executable.to_path_buf();
        let file = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || versions::Key::of(&path)).await.ok().flatten()
        };
        (path, file)
    }

    /// The version of this file if this process or the data dir's cache knows it (`Some(None)`: probed here, with
    /// no answer).
    pub(super) async fn known_version(&self, key: &VersionKey) -> Option<Option<String>> {
        if let Some(known) = self.versions.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
            return Some(known.clone());
        }
        let file = key.1.clone()?;
        let data_dir = self.config.data_dir.clone();
        let cached = tokio::task::spawn_blocking(move || versions::lookup(&data_dir, &file)).await.ok().flatten()?;
        tracing::debug!(executable = %key.0.display(), version = %cached, "the CLI's version, from the cache");
        self.versions.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), Some(cached.clone()));
        Some(Some(cached))
    }

    /// The agent's executable as this bridge may drive it: a major version it supports
    /// ([`crate::agents::Agent::newest_major`]). A newer one found on PATH is replaced by the pinned install of the
    /// tools cache (installed now when missing), and one named by the override is refused. Answers the executable
    /// and, where a version gate asked for it, its version line.
    pub(super) async fn supported_executable(
        &self,
        agent: AgentKind,
        found: &Path,
        cancel: &CancellationToken,
    ) -> Result<(PathBuf, Option<String>)> {
        // Without a version gate nothing waits for the probe (an ACP agent's first prompt would, a process start).
        let Some(newest) = agent.newest_major(&self.config.agents) else { return Ok((found.to_path_buf(), None)) };
        let version = self.cli_version(agent, found).await;
        match version.as_deref().and_then(major_version) {
            Some(major) if major > newest => {}
            _ => return Ok((found.to_path_buf(), version)),
        }
        let shown = version.unwrap_or_default();
        let (name, package) = (agent.display_name(), agent.package());
        if agent.bin_override(&self.config.agents).is_some() {
            return Err(Error::CliUnavailable(format!(
                "{name} {shown} at {} is a major version acp-sandbox cannot drive yet this way (it supports {name} \
                 {newest}.x). Point ACP_SANDBOX_{}_BIN (--{}-bin) at a {newest}.x of {name}, or unset it to use the \
                 pinned {}{}",
                found.display(),
                agent.as_str().to_uppercase(),
                agent.as_str(),
                package.version,
                agent.newer_major_hint().map(|hint| format!("; {hint}")).unwrap_or_default()
            )));
        }
        let tools = paths::tools_dir(&self.config.data_dir);
        let pinned = package.executable(&tools);
        tracing::warn!(
            found = %found.display(),
            version = %shown,
            pinned = %pinned.display(),
            "the {name} on PATH is a major version acp-sandbox cannot drive yet; using the pinned install"
        );
        if !pinned.exists() {
            crate::sandbox::install::install(package, &tools, cancel).await?;
        }
        let version = self.cli_version(agent, &pinned).await;
        Ok((pinned, version))
    }

    /// Where the override names a newer major version than the agent drives and the user left open how it is
    /// driven, lets the agent settle that (OpenCode 2: its ACP server) before the bridge makes anything of its
    /// settings. Costs a `--version` only when the agent could settle and the data dir's cache does not know the file.
    /// Answers whether the settings changed.
    pub(super) async fn settle_newer_major(&mut self) -> bool {
        let agent = self.config.agent;
        let Some(newest) = agent.newest_major(&self.config.agents) else { return false };
        if agent.bin_override(&self.config.agents).is_none()
            || agent.drive_newer_major(&mut self.config.agents.clone(), newest + 1).is_none()
        {
            return false;
        }
        let Some(executable) = installed_executable(&self.config, agent) else { return false };
        let version = self.cli_version(agent, &executable).await;
        let Some(major) = version.as_deref().and_then(major_version).filter(|major| *major > newest) else {
            return false;
        };
        let Some(how) = agent.drive_newer_major(&mut self.config.agents, major) else { return false };
        tracing::info!(executable = %executable.display(), version = ?version, "{how}");
        true
    }

    /// The package the agent wants beside this executable ([`crate::agents::Agent::companion`]), for its version
    /// (probed once per file): `None` when it wants none or its version is unknown.
    pub(super) async fn companion(&self, agent: AgentKind, executable: &Path) -> Option<Companion> {
        let package = agent.companion(executable, &paths::user_config_dir())?;
        let version = self.cli_version(agent, executable).await?;
        let version = npm_version(&version)?.to_string();
        let dir = crate::sandbox::install::package_dir(&paths::tools_dir(&self.config.data_dir), package, &version);
        Some(Companion { package, version, dir })
    }

    /// Installs the agent's companion package for this executable unless it is there (no word in any thread: a
    /// session's start ahead of its first prompt, which shows its own install).
    pub(super) async fn install_companion(&self, agent: AgentKind, executable: &Path) {
        let Some(companion) = self.companion(agent, executable).await else { return };
        if !companion.installed()
            && let Err(e) = companion.install(&self.config.data_dir, &self.shutdown).await
        {
            tracing::warn!("{} {} could not be installed: {e}", companion.package, companion.version);
        }
    }

    /// Asks the agent's version in the background, so that the first session's server does not wait for it.
    pub fn probe_version(self: &Arc<Self>) {
        let agent = self.config.agent;
        if agent.newest_major(&self.config.agents).is_none() {
            return;
        }
        let Some(executable) = installed_executable(&self.config, agent) else { return };
        let bridge = self.clone();
        tokio::spawn(async move {
            bridge.cli_version(agent, &executable).await;
        });
    }

    /// The exact variables of the bridge's environment a CLI gets beyond its own namespace: for OpenCode, those
    /// of the providers its config names, its catalog lists and the model in use; `--pass-env` for both.
    pub(super) fn env_names(&self, agent: AgentKind, model: Option<&str>) -> std::collections::BTreeSet<String> {
        let mut names: std::collections::BTreeSet<String> = self.config.pass_env.iter().cloned().collect();
        let models = self.catalog.listed();
        let mut providers = models
            .iter()
            .map(|m| m.id.as_str())
            .chain(model)
            .filter_map(|id| id.split_once('/').map(|(provider, _)| provider));
        names.extend(agent.provider_env(&self.config.agents, &mut providers));
        names
    }
}

/// A package an agent wants beside its CLI, of the CLI's version, and its folder in the tools cache.
pub(super) struct Companion {
    pub package: &'static str,
    pub version: String,
    pub dir: PathBuf,
}

impl Companion {
    /// Whether the tools cache has it (an install is renamed into place whole).
    pub fn installed(&self) -> bool {
        self.dir.join("node_modules").join(self.package).join("package.json").is_file()
    }

    /// Installs it with npm on this machine, into the tools cache.
    pub async fn install(
        &self,
        data_dir: &Path,
        cancel: &CancellationToken,
    ) -> std::result::Result<PathBuf, crate::sandbox::SandboxError> {
        crate::sandbox::install::install_package(self.package, &self.version, &paths::tools_dir(data_dir), cancel).await
    }
}

/// The version npm knows a CLI's release by, from its `--version` line (`1.18.33`, `v1.2.0 (build)`): `None` when
/// the line does not start with one.
fn npm_version(line: &str) -> Option<&str> {
    let version = line.split_whitespace().next()?;
    let version = version.strip_prefix('v').unwrap_or(version);
    (version.starts_with(|c: char| c.is_ascii_digit())
        && version.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+')))
    .then_some(version)
}

/// The installed companion of the agent for this executable, as shown in the session's state dir: its version from
/// the data dir's cache (a session's start probed it), nothing when it is not installed.
fn companion_config(
    config: &Config,
    agent: AgentKind,
    executable: &Path,
    user_config: &Path,
    state_dir: &Path,
) -> Vec<(PathBuf, PathBuf)> {
    let Some(package) = agent.companion(executable, user_config) else { return Vec::new() };
    let Some(version) = versions::Key::of(executable).and_then(|key| versions::lookup(&config.data_dir, &key)) else {
        return Vec::new();
    };
    let Some(version) = npm_version(&version) else { return Vec::new() };
    let dir = crate::sandbox::install::package_dir(&paths::tools_dir(&config.data_dir), package, version);
    agent.companion_config(&dir, state_dir)
}

/// Runs `<cli> --version` in a sandbox made like a session's, for `doctor`: proof that the sandbox can run the CLI.
/// Answers its version line, or the CLI's (or bubblewrap's) own words when it fails.
pub async fn check_cli(config: &Config, agent: AgentKind) -> std::result::Result<String, String> {
    let executable = installed_executable(config, agent).ok_or_else(|| "not installed yet".to_string())?;
    let sessions = paths::sessions_dir(&config.data_dir);
    let provider = LocalProvider::choose(sessions, config.sandbox, |isolation| config.local_settings(isolation))
        .map_err(|e| e.to_string())?;
    let output =
        run_once(config, &provider, "_doctor", agent, &executable, &["--version"], &Default::default()).await?;
    Ok(output.lines().next().unwrap_or("").trim().to_string())
}

/// How long a bridge's own run of a CLI (listing models, `--version`) may take.
pub(super) const RUN_ONCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The most a bridge's own run of a CLI may print (a model listing is some hundred KiB).
pub(super) const RUN_ONCE_OUTPUT_LIMIT: u64 = 16 * 1024 * 1024;

/// Runs one short command of a CLI in a sandbox of the bridge's own (`sandbox`, never a session's, with its own
/// workspace in the data dir) and answers its stdout, or its own words when it fails.
pub(super) async fn run_once(
    config: &Config,
    provider: &dyn SandboxProvider,
    sandbox: &str,
    agent: AgentKind,
    executable: &Path,
    args: &[&str],
    env_names: &std::collections::BTreeSet<String>,
) -> std::result::Result<String, String> {
    let command = format!("`{} {}`", agent.package().bin, args.join(" "));
    let workspace = config.data_dir.join(format!("{}-workspace", sandbox.trim_start_matches('_')));
    paths::create_private_dir(&workspace).map_err(|e| format!("create {}: {e}", workspace.display()))?;
    let spec = crate::sandbox::SandboxSpec { session_id: sandbox.into(), workspace, roots: Vec::new() };
    let id = provider.create(&spec).await.map_err(|e| e.to_string())?;
    let sandbox = provider.connect(&id, &spec).await.map_err(|e| e.to_string())?.ok_or("the sandbox vanished")?;
    let env = cli_environment(agent, sandbox.state_dir(), None, env_names);
    let args = args.iter().map(|arg| arg.to_string()).collect();
    let mut process = sandbox
        .exec(cli_spec(config, agent, executable, sandbox.as_ref(), env, args))
        .await
        .map_err(|e| e.to_string())?;
    let stderr = tokio::spawn(stderr_tail(std::mem::replace(&mut process.stderr, Box::pin(tokio::io::empty()))));
    let mut output = Vec::new();
    // One byte more than allowed tells an output that is too long from one that just fits.
    let mut bounded = tokio::io::AsyncReadExt::take(&mut process.stdout, RUN_ONCE_OUTPUT_LIMIT + 1);
    let read =
        tokio::time::timeout(RUN_ONCE_LIMIT, tokio::io::AsyncReadExt::read_to_end(&mut bounded, &mut output)).await;
    let too_long = output.len() as u64 > RUN_ONCE_OUTPUT_LIMIT;
    if read.is_err() || too_long {
        process.handle.kill().await;
    }
    let exit = process.handle.wait().await.map_err(|e| e.to_string())?;
    let stderr = tokio::time::timeout(std::time::Duration::from_secs(2), stderr).await.ok().and_then(|r| r.ok());
    match read {
        Err(_) => Err(format!("{command} took longer than {} s", RUN_ONCE_LIMIT.as_secs())),
        Ok(_) if too_long => Err(format!("{command} printed more than {} MiB", RUN_ONCE_OUTPUT_LIMIT >> 20)),
        Ok(_) if !exit.success() => {
            Err(format!("{command} failed ({}): {}", exit.describe(), stderr.unwrap_or_default().trim()))
        }
        Ok(_) => Ok(String::from_utf8_lossy(&output).into_owned()),
    }
}

/// A command of a CLI as every run of it is made: the executable as it really is, its install shown in the
/// sandbox, the user's config of the CLI, where it must be able to connect, in the sandbox's workspace.
pub(super) fn cli_spec(
    config: &Config,
    agent: AgentKind,
    executable: &Path,
    sandbox: &dyn crate::sandbox::Sandbox,
    env: Vec<(String, String)>,
    args: Vec<String>,
) -> crate::sandbox::ExecSpec {
    if sandbox.remote_files().is_some() {
        return remote_cli_spec(agent, executable, sandbox, env, args);
    }
    let real = std::fs::canonicalize(executable).unwrap_or_else(|_| executable.to_path_buf());
    let tools_dir = std::fs::canonicalize(paths::tools_dir(&config.data_dir))
        .unwrap_or_else(|_| paths::tools_dir(&config.data_dir));
    // An npm install needs its whole prefix (the platform binary is a sibling package); anything else its folder.
    let tool = match real.strip_prefix(&tools_dir).ok().and_then(|rel| rel.components().next()) {
        Some(first) => tools_dir.join(first),
        None => real.parent().map(Path::to_path_buf).unwrap_or_else(|| real.clone()),
    };
    let (user_config, user_data) = (paths::user_config_dir(), paths::user_data_dir());
    let mut read_only = [
        agent.user_config(&user_config, &user_data, sandbox.state_dir()),
        agent.shipped_config(&real, &user_config, sandbox.state_dir()),
        companion_config(config, agent, &real, &user_config, sandbox.state_dir()),
    ]
    .concat();
    let mut env = env;
    // A command given no key of the agent's uses its own sign-in, if one was made (`login --own`): kept with the
    // gateway where the agent can, else its file shown writable.
    let mut writable = Vec::new();
    let signed_in = crate::auth::own_login_for(config, agent, &env, &sandbox.state_dir().join("home"));
    if let Some(signed_in) = &signed_in {
        env.retain(|(name, _)| !signed_in.env.iter().any(|(own, _)| own == name));
        env.extend(signed_in.env.iter().cloned());
    }
    let scope = sandbox.state_dir().display().to_string();
    let own_login = signed_in.as_ref().map(|signed_in| &signed_in.shown);
    let (gateway, own_kept) = keep_credentials(config, agent, &scope, own_login, &mut env, &mut read_only);
    if let Some(signed_in) = signed_in
        && !own_kept
    {
        writable.push(signed_in.shown);
    }
    let mut endpoints: Vec<(String, u16)> = agent.model_endpoints(&config.agents);
    // The gateway serves the kept credentials' upstreams, which the sandbox then needs no longer.
    endpoints.extend(gateway.map(|port| ("127.0.0.1".to_string(), port)));
    // A base URL the CLI is given in its environment is a model endpoint too (OPENAI_BASE_URL, AMP_URL).
    for (name, value) in &env {
        if (name.ends_with("_BASE_URL") || name == "AMP_URL")
            && let Some(endpoint) = crate::agents::endpoint_of(value)
        {
            endpoints.push(endpoint);
        }
    }
    endpoints.sort();
    endpoints.dedup();
    let service_hosts = agent.service_hosts().iter().map(|host| host.to_string()).collect();
    crate::sandbox::ExecSpec {
        program: real,
        args,
        env,
        cwd: sandbox.workspace().to_path_buf(),
        stdin: Vec::new(),
        interactive: false,
        read_only,
        writable,
        tools: vec![tool],
        net: crate::sandbox::NetAccess { endpoints, service_hosts },
        serve_port: None,
        keep_warm: None,
    }
}

/// Keeps the agent's model credentials with the bridge ([`Gateway`]): each one in `env` (and what else the agent
/// keeps, [`crate::agents::Agent::keep_credentials`]) becomes a placeholder, and the base URL it goes to becomes the
/// gateway's route there, the same for every command of the sandbox `scope`; so does the agent's own sign-in
/// `own_login` (its file and where it would be shown) where the agent can keep it. Answers the gateway's port when a
/// credential was kept, and whether the own sign-in was. Without a gateway (it cannot listen) they stay as they are,
/// which the log says.
fn keep_credentials(
    config: &Config,
    agent: AgentKind,
    scope: &str,
    own_login: Option<&(PathBuf, PathBuf)>,
    env: &mut Vec<(String, String)>,
    read_only: &mut Vec<(PathBuf, PathBuf)>,
) -> (Option<u16>, bool) {
    let mut used = None;
    let mut keep = |name: &str, upstream: &str, held: Held| match Gateway::shared() {
        Ok(gateway) => {
            tracing::debug!(credential = %name, "a model credential stays with the bridge's gateway");
            used = Some(gateway.port());
            Some(gateway.keep(scope, name, upstream, held))
        }
        Err(why) => {
            tracing::warn!("{why}: {name} reaches {} as it is", agent.display_name());
            None
        }
    };
    for credential in agent.gateway_credentials() {
        let upstream = env
            .iter()
            .find(|(name, value)| name == credential.base_url && !value.trim().is_empty())
            .map(|(_, value)| value.trim().to_string())
            .unwrap_or_else(|| credential.upstream.to_string());
        let held = |name: &str, value: &str| credential.variables.contains(&name) && !value.trim().is_empty();
        let mut route = None;
        for (name, value) in env.iter_mut().filter(|(name, value)| held(name, value)) {
            if let Some(granted) = keep(name, &upstream, Held::Key(value.clone())) {
                *value = granted.placeholder;
                route = Some(granted.base_url);
            }
        }
        if let Some(route) = route {
            agent.point_at_gateway(credential, &route, env);
        }
    }
    agent.keep_credentials(&config.agents, &mut keep, env, read_only);
    let own_kept = own_login.is_some_and(|shown| agent.keep_own_login(shown, &mut keep, env));
    (used, own_kept)
}

/// Variables of the bridge's environment every CLI gets: what programs need to run, and to reach the network
/// ([`NETWORK_ENV`]: proxies, CA bundles). Everything else is dropped; each agent adds its own settings and keys.
pub(super) const BASE_ENV: &[&str] = &["PATH", "LANG", "LANGUAGE", "TZ", "USER", "LOGNAME"];

/// Whether a variable of the bridge's environment is one every CLI gets.
fn in_base(name: &str) -> bool {
    BASE_ENV.contains(&name) || NETWORK_ENV.contains(&name)
}

/// The CLI's environment: a cleared one plus the allow-list, its own settings and credentials, and
/// HOME/XDG dirs in the sandbox's state dir (persisted across turns: OpenCode keeps its sessions there).
/// `names` are the exact variables this CLI needs beyond its own namespace (its providers', `--pass-env`).
pub(super) fn cli_environment(
    agent: AgentKind,
    state_dir: &std::path::Path,
    credential: Option<&(&'static str, String)>,
    names: &BTreeSet<String>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(name, _)| in_base(name) || name.starts_with("LC_") || agent.passes_env(name) || names.contains(name))
        .collect();
    for (name, sub) in [
        ("HOME", "home"),
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_DATA_HOME", "data"),
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_STATE_HOME", "state"),
    ] {
        env.push((name.into(), state_dir.join(sub).display().to_string()));
    }
    env.push(("TERM".into(), "dumb".into()));
    env.extend(agent.fixed_env());
    if let Some((name, value)) = credential {
        env.retain(|(existing, _)| existing != name);
        env.push((name.to_string(), value.clone()));
    }
    env
}

/// Of the variables every CLI gets ([`BASE_ENV`]), the only ones a remote sandbox's CLI gets too: the others
/// describe this machine (its PATH, user, proxies and CA files), and the sandbox's own apply instead.
const KEPT_REMOTELY: &[&str] = &["LANG", "LANGUAGE", "TZ"];

/// A command of a CLI in a remote sandbox: the executable as the sandbox has it, in its workspace, with the
/// environment the bridge made minus what describes this machine, plus the user's stored logins of the CLI as
/// variables (only this process gets them: nothing is written to the sandbox's disk).
pub(super) fn remote_cli_spec(
    agent: AgentKind,
    executable: &Path,
    sandbox: &dyn Sandbox,
    env: Vec<(String, String)>,
    args: Vec<String>,
) -> ExecSpec {
    let mut env: Vec<(String, String)> =
        env.into_iter().filter(|(name, _)| !in_base(name) || KEPT_REMOTELY.contains(&name.as_str())).collect();
    for (name, value) in agent.credential_env(&crate::paths::user_data_dir()) {
        // One the user set in the bridge's environment wins, as locally.
        if !env.iter().any(|(existing, _)| *existing == name) {
            env.push((name, value));
        }
    }
    ExecSpec {
        program: executable.to_path_buf(),
        args,
        env,
        cwd: sandbox.workspace().to_path_buf(),
        ..ExecSpec::default()
    }
}

#[cfg(test)]
mod companion_tests {
    use super::npm_version;

    #[test]
    fn the_npm_version_is_the_first_word_of_the_version_line() {
        assert_eq!(npm_version("1.18.33"), Some("1.18.33"));
        assert_eq!(npm_version("v2.0.0-beta.1 (abc)"), Some("2.0.0-beta.1"));
        assert_eq!(npm_version("opencode 1.0"), None);
        assert_eq!(npm_version("1.0/../../x"), None);
        assert_eq!(npm_version(""), None);
    }
}
