//! Daytona (preview): sandboxes in Daytona's cloud behind the [`SandboxProvider`] / [`Sandbox`] /
//! [`ProcessHandle`] traits.
//!
//! The control plane creates, starts, stops and deletes sandboxes (`api.rs`); commands run in toolbox sessions, one
//! session per command, with their output streamed over the followed-logs WebSocket and split into stdout and
//! stderr by the daemon's markers (`logs.rs`); `process.rs` builds each command's shell line and ends or awaits it.
//! Each command's session is named by its tag (`sandbox::remote::reaper`), also in its environment: what it started ends
//! with it, and a later bridge finds (in the session list) and ends what this one left running. Between turns the sandbox is stopped (its processes end, its files stay) and started again on `connect`.
//!
//! The API key (`DAYTONA_API_KEY`) is used only in the bridge's own requests: a new sandbox gets no environment,
//! every command's environment is scrubbed of `DAYTONA_*` and of any value holding the key, and nothing here logs
//! it (its `Debug` is redacted). A command's environment (the CLI's keys) and stdin never reach the sandbox's disk
//! or the command line: they travel through the command's input pipe (`process.rs`).

pub mod api;
pub mod logs;
pub mod process;

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;

use self::api::{Client, CreateRequest, DaytonaError, Endpoint, SandboxInfo, Toolbox};
use self::logs::{Demuxer, Sinks};
use self::process::DaytonaProcess;
use crate::sandbox::remote::download::{self, Downloaded};
use crate::sandbox::remote::reaper::{self, Tags};
use crate::sandbox::{
    CheckLine, ExecSpec, RemoteFiles, RunningProcess, Sandbox, SandboxError, SandboxProvider, SandboxSpec,
};

/// The provider's name, persisted with each session it created.
pub const PROVIDER: &str = "daytona";
/// The variable holding the key.
pub const KEY_VARIABLE: &str = "DAYTONA_API_KEY";
/// The cloud's API when `DAYTONA_API_URL` is not set.
pub const DEFAULT_API_URL: &str = "https://app.daytona.io/api";
/// Minutes without activity before Daytona stops a sandbox by itself (the bridge stops it after every turn).
pub const DEFAULT_AUTO_STOP_MINUTES: u32 = 60;
/// How long a sandbox may take to reach the state asked for.
const STATE_WAIT: Duration = Duration::from_secs(180);
/// The label naming the session a sandbox belongs to.
pub const SESSION_LABEL: &str = "acp-sandbox.session";

/// How to reach Daytona and what to create there.
#[derive(Clone, Debug)]
pub struct DaytonaSettings {
    /// The API and its key.
    pub endpoint: Endpoint,
    /// `ACP_SANDBOX_DAYTONA_SNAPSHOT`: the snapshot new sandboxes start from (Daytona's default otherwise).
    pub snapshot: Option<String>,
    /// `DAYTONA_TARGET`: the region.
    pub target: Option<String>,
    /// `ACP_SANDBOX_DAYTONA_AUTO_STOP`: Daytona's own idle stop, in minutes (0: never).
    pub auto_stop_minutes: u32,
}

impl DaytonaSettings {
    /// From the bridge's environment.
    pub fn from_env() -> Result<Self, DaytonaError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// From any lookup of variables (pure, for tests). `DAYTONA_SERVER_URL` is the SDKs' old name of the URL.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, DaytonaError> {
        let set = |name: &str| get(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let api_key = set("DAYTONA_API_KEY").ok_or(DaytonaError::MissingKey)?;
        let api_url = set("DAYTONA_API_URL").or_else(|| set("DAYTONA_SERVER_URL")).unwrap_or(DEFAULT_API_URL.into());
        let auto_stop_minutes = match set("ACP_SANDBOX_DAYTONA_AUTO_STOP") {
            None => DEFAULT_AUTO_STOP_MINUTES,
            Some(text) => text.parse().map_err(|_| {
                DaytonaError::Config(format!("ACP_SANDBOX_DAYTONA_AUTO_STOP must be minutes (0 or more), not {text:?}"))
            })?,
        };
        Ok(Self {
            endpoint: Endpoint { api_url, api_key, organization_id: set("DAYTONA_ORGANIZATION_ID") },
            snapshot: set("ACP_SANDBOX_DAYTONA_SNAPSHOT"),
            target: set("DAYTONA_TARGET"),
            auto_stop_minutes,
        })
    }
}

/// Daytona as `--sandbox daytona` selects it.
pub struct Daytona;

impl super::Remote for Daytona {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn help(&self) -> &'static str {
        "A Daytona sandbox per session (preview): `DAYTONA_API_KEY` in the bridge's environment"
    }

    fn one_sandbox(&self) -> &'static str {
        "a Daytona sandbox"
    }

    fn key_variable(&self) -> &'static str {
        KEY_VARIABLE
    }

    fn key_page(&self) -> &'static str {
        "https://app.daytona.io/dashboard/keys"
    }

    fn open(
        &self,
        vars: super::Vars<'_>,
    ) -> Result<std::sync::Arc<dyn crate::sandbox::SandboxProvider>, crate::sandbox::SandboxError> {
        let settings = DaytonaSettings::from_lookup(vars)?;
        tracing::info!(api = %settings.endpoint.api_url, snapshot = ?settings.snapshot, "sessions run in Daytona sandboxes");
        Ok(std::sync::Arc::new(DaytonaProvider::new(settings)?))
    }

    fn check<'a>(&self, vars: super::Vars<'a>) -> futures::future::BoxFuture<'a, Vec<CheckLine>> {
        Box::pin(check(vars))
    }
}

/// `doctor`'s lines for `--sandbox daytona`: the key, the API (reached, the key accepted), the snapshot (the one
/// configured, or Daytona's default as its public configuration names it), and what a session would use.
pub async fn check(var: &(dyn Fn(&str) -> Option<String> + Sync)) -> Vec<CheckLine> {
    if var(KEY_VARIABLE).is_none_or(|key| key.trim().is_empty()) {
        return vec![CheckLine::error(format!(
            "{KEY_VARIABLE}: missing: --sandbox daytona needs your Daytona key in the bridge's environment, or \
             run `acp-sandbox login --provider daytona`"
        ))];
    }
    let settings = match DaytonaSettings::from_lookup(|name| var(name)) {
        Ok(settings) => settings,
        Err(e) => return vec![CheckLine::error(e.to_string())],
    };
    let mut lines = vec![CheckLine::ok(format!("{KEY_VARIABLE}: set"))];
    let api = format!("API {}", settings.endpoint.api_url);
    let client = match Client::new(settings.endpoint.clone()) {
        Ok(client) => client,
        Err(e) => {
            lines.push(CheckLine::error(format!("{api}: {e}")));
            return lines;
        }
    };
    let (snapshot, named) = match &settings.snapshot {
        Some(snapshot) => (Ok(snapshot.clone()), "(ACP_SANDBOX_DAYTONA_SNAPSHOT)"),
        None => (client.default_snapshot().await, "(Daytona's default)"),
    };
    let snapshot = match snapshot {
        Ok(snapshot) => snapshot,
        Err(e) => {
            lines.push(CheckLine::error(format!("{api}: {e}")));
            return lines;
        }
    };
    match client.snapshot(&snapshot).await {
        Ok(info) => {
            lines.push(CheckLine::ok(format!("{api}: reachable, the key is accepted")));
            lines.push(match info.state.as_str() {
                "active" => CheckLine::ok(format!("snapshot {snapshot} {named}: exists (active)")),
                state => CheckLine::error(format!(
                    "snapshot {snapshot} {named}: is {state}, not active{}: sandboxes cannot start from it",
                    info.error_reason.map(|r| format!(" ({r})")).unwrap_or_default()
                )),
            });
        }
        Err(e) if e.is_not_found() => {
            lines.push(CheckLine::ok(format!("{api}: reachable, the key is accepted")));
            lines.push(CheckLine::error(format!(
                "snapshot {snapshot} {named}: Daytona has no snapshot of that name: set ACP_SANDBOX_DAYTONA_SNAPSHOT \
                 to one of yours, or unset it for Daytona's default"
            )));
        }
        Err(e) => lines.push(CheckLine::error(format!("{api}: {e}"))),
    }
    let stop = match settings.auto_stop_minutes {
        0 => "never stopped by Daytona when idle (ACP_SANDBOX_DAYTONA_AUTO_STOP=0)".to_string(),
        minutes => format!("stopped by Daytona after {minutes} min without activity and started by the next prompt"),
    };
    let target = settings.target.as_deref().map(|t| format!(" in {t}")).unwrap_or_default();
    lines.push(CheckLine::ok(format!(
        "sessions: each in a Daytona sandbox of its own{target} from snapshot {snapshot}, {stop}; {KEY_VARIABLE} \
         stays with the bridge"
    )));
    lines
}

/// Sandboxes in Daytona.
pub struct DaytonaProvider {
    client: Client,
    settings: DaytonaSettings,
    /// Part of every command's tag (and toolbox session name) of this bridge: one without it is an earlier bridge's.
    instance: String,
    /// Per sandbox: whether its daemon lacks the `terminate` route (found once, kept for the bridge's life).
    no_terminate: std::sync::Mutex<std::collections::HashMap<String, Arc<std::sync::atomic::AtomicBool>>>,
}

impl DaytonaProvider {
    /// A provider for the account of `settings`.
    pub fn new(settings: DaytonaSettings) -> Result<Self, DaytonaError> {
        Ok(Self {
            client: Client::new(settings.endpoint.clone())?,
            settings,
            instance: reaper::instance_id(),
            no_terminate: Default::default(),
        })
    }

    /// Polls until the sandbox is in one of `wanted` (passing through Daytona's transitional states).
    async fn wait_for(&self, id: &str, wanted: &[&str]) -> Result<SandboxInfo, DaytonaError> {
        let deadline = Instant::now() + STATE_WAIT;
        let mut pause = Duration::from_millis(100);
        loop {
            let info = self.client.get(id).await?;
            let state = info.state().to_string();
            if wanted.contains(&state.as_str()) {
                return Ok(info);
            }
            if matches!(state.as_str(), "error" | "build_failed" | "destroyed" | "destroying") {
                return Err(DaytonaError::State { id: id.into(), state, reason: info.error_reason });
            }
            if Instant::now() >= deadline {
                return Err(DaytonaError::Timeout {
                    what: format!("waiting for sandbox {id} to be {}", wanted.join(" or ")),
                    seconds: STATE_WAIT.as_secs(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause + pause / 2).min(Duration::from_secs(1));
        }
    }

    async fn open(&self, info: &SandboxInfo, session_id: &str) -> Result<DaytonaSandbox, DaytonaError> {
        let routes =
            self.no_terminate.lock().unwrap_or_else(|p| p.into_inner()).entry(info.id.clone()).or_default().clone();
        let toolbox = self.client.toolbox(info).await?.with_routes(routes);
        let home = PathBuf::from(toolbox.home_dir().await?);
        Ok(DaytonaSandbox {
            id: info.id.clone(),
            workspace: home.join("workspace"),
            state_dir: home.join(".acp-sandbox"),
            toolbox,
            api_key: self.settings.endpoint.api_key.clone(),
            session_id: session_id.to_string(),
            tags: Tags::new(session_id, &self.instance),
            echo_suppressed: process::suppresses_input_echo(info.daemon_version.as_deref()),
            daemon_version: info.daemon_version.clone(),
            woke: false,
        })
    }
}

#[async_trait]
impl SandboxProvider for DaytonaProvider {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<String, SandboxError> {
        let request = CreateRequest {
            snapshot: self.settings.snapshot.clone(),
            target: self.settings.target.clone(),
            labels: BTreeMap::from([(SESSION_LABEL.to_string(), spec.session_id.clone())]),
            auto_stop_minutes: self.settings.auto_stop_minutes,
        };
        let created = self.client.create(&request).await?;
        let info =
            if created.state() == "started" { created } else { self.wait_for(&created.id, &["started"]).await? };
        let sandbox = self.open(&info, &spec.session_id).await?;
        for dir in [&sandbox.workspace, &sandbox.state_dir] {
            sandbox.toolbox.create_folder(&dir.display().to_string()).await?;
        }
        tracing::info!(session = %spec.session_id, sandbox = %info.id, "created a Daytona sandbox");
        Ok(info.id)
    }

    async fn connect(&self, id: &str, spec: &SandboxSpec) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        let info = match self.client.get(id).await {
            Ok(info) => info,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let woke = info.state() != "started";
        let info = match info.state() {
            "started" => info,
            "destroyed" | "destroying" => return Ok(None),
            "error" | "build_failed" => {
                return Err(DaytonaError::State {
                    id: id.into(),
                    state: info.state().into(),
                    reason: info.error_reason,
                }
                .into());
            }
            state => {
                if state == "stopping" {
                    self.wait_for(id, &["stopped"]).await?;
                }
                if matches!(state, "stopped" | "stopping" | "archived" | "paused") {
                    match self.client.start(id).await {
                        Err(e) if e.is_not_found() => return Ok(None),
                        other => drop(other?),
                    }
                }
                self.wait_for(id, &["started"]).await?
            }
        };
        let mut sandbox = self.open(&info, &spec.session_id).await?;
        sandbox.woke = woke;
        Ok(Some(Arc::new(sandbox)))
    }

    async fn suspend(&self, id: &str) -> Result<(), SandboxError> {
        let info = match self.client.get(id).await {
            Ok(info) => info,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if matches!(info.state(), "stopped" | "archived" | "destroyed" | "destroying") {
            return Ok(());
        }
        match self.client.stop(id).await {
            Err(e) if e.is_not_found() => return Ok(()),
            other => other?,
        }
        self.wait_for(id, &["stopped", "archived"]).await?;
        Ok(())
    }

    /// Deletes the sandbox. A stop under way (the bridge's own, after the last turn) makes Daytona refuse with
    /// 409 until it is done: the delete is asked again until then, within [`STATE_WAIT`].
    async fn destroy(&self, id: &str) -> Result<(), SandboxError> {
        let deadline = Instant::now() + STATE_WAIT;
        let mut pause = Duration::from_millis(100);
        loop {
            match self.client.delete(id).await {
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) if e.is_conflict() && Instant::now() < deadline => {
                    tracing::debug!(sandbox = %id, "Daytona is changing the sandbox's state; deleting it once done: {e}");
                    tokio::time::sleep(pause).await;
                    pause = (pause + pause / 2).min(Duration::from_secs(1));
                }
                other => return Ok(other?),
            }
        }
    }
}

/// A started Daytona sandbox of one session.
pub struct DaytonaSandbox {
    id: String,
    toolbox: Toolbox,
    workspace: PathBuf,
    state_dir: PathBuf,
    api_key: String,
    session_id: String,
    /// The tags of this session's commands in this bridge; a command's tag is also its toolbox session's name.
    tags: Tags,
    /// Whether its daemon keeps a command's input out of the on-disk log (commands are refused otherwise).
    echo_suppressed: bool,
    daemon_version: Option<String>,
    /// This connection started the sandbox (it was stopped, which ended its processes).
    woke: bool,
}

/// A path below a directory: absolute inside it (as the session names attachments), or relative; never with `..`.
fn below(dir: &Path, path: &Path) -> Result<PathBuf, SandboxError> {
    let path = path.strip_prefix(dir).unwrap_or(path);
    let plain = path.components().all(|c| matches!(c, Component::Normal(_)));
    if !plain || path.as_os_str().is_empty() {
        return Err(SandboxError::Unavailable(format!("{} is not a plain path below the state dir", path.display())));
    }
    Ok(dir.join(path))
}

impl DaytonaSandbox {
    /// Its Daytona id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Writes a file anywhere in the sandbox (parents are created), replacing what is there.
    pub async fn upload(&self, path: &Path, bytes: Vec<u8>) -> Result<(), SandboxError> {
        Ok(self.toolbox.upload(vec![(path.display().to_string(), bytes)]).await?)
    }

    /// Reads a file of the sandbox; `None` when there is none.
    pub async fn download(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        self.download_at_most(path, u64::MAX).await
    }

    /// Like [`DaytonaSandbox::download`], reading at most `limit + 1` bytes.
    pub async fn download_at_most(&self, path: &Path, limit: u64) -> Result<Option<Vec<u8>>, SandboxError> {
        match self.toolbox.download_at_most(&path.display().to_string(), limit).await {
            Ok(bytes) => Ok(Some(bytes)),
            // The daemon answers a missing file with a bare 404, and so may the proxy for a sandbox that is gone:
            // only a toolbox that still answers makes it a missing file (never "deleted" for a lost sandbox).
            Err(e) if e.is_not_found() => {
                self.toolbox.home_dir().await?;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Downloads a file of the sandbox into a new file at `dest` on the host, a chunk at a time, at most `limit`
    /// bytes of it ([`download::save`]).
    pub async fn download_to(&self, path: &Path, dest: &Path, limit: u64) -> Result<Downloaded, SandboxError> {
        match self.toolbox.download_response(&path.display().to_string()).await {
            Ok((response, what)) => {
                download::save(response, dest, limit, |source| {
                    DaytonaError::Transport { what: what.clone(), source }.into()
                })
                .await
            }
            // As in `download_at_most`: missing only while the toolbox still answers.
            Err(e) if e.is_not_found() => {
                self.toolbox.home_dir().await?;
                Ok(Downloaded::Missing)
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[async_trait]
impl Sandbox for DaytonaSandbox {
    fn workspace(&self) -> &Path {
        &self.workspace
    }

    fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    fn isolation(&self) -> String {
        format!("Daytona sandbox {} (remote)", self.id)
    }

    async fn write_state_file(&self, path: &Path, bytes: &[u8]) -> Result<(), SandboxError> {
        let target = below(&self.state_dir, path)?;
        self.upload(&target, bytes.to_vec()).await
    }

    fn woke(&self) -> bool {
        self.woke
    }

    fn remote_files(&self) -> Option<&dyn RemoteFiles> {
        Some(self)
    }

    async fn end_leftovers(&self) -> Result<usize, SandboxError> {
        let earlier: Vec<_> =
            self.toolbox.sessions().await?.into_iter().filter(|s| self.tags.is_earlier(&s.session_id)).collect();
        if earlier.is_empty() {
            return Ok(0);
        }
        let mut running = 0;
        for session in &earlier {
            if session.running() {
                running += 1;
                tracing::warn!(session = %self.session_id, sandbox = %self.id, daytona_session = %session.session_id, "ending a command an earlier bridge left running");
            }
            // Deleting a session ends its command's process group (what is in none, the reaper ends below).
            match self.toolbox.delete_session(&session.session_id).await {
                Err(e) if !e.is_not_found() => return Err(e.into()),
                _ => {}
            }
        }
        let (kill, spare) = self.tags.earlier_patterns();
        let ended = process::reap(&self.toolbox, &kill, Some(&spare)).await?;
        tracing::info!(session = %self.session_id, sandbox = %self.id, sessions = earlier.len(), ended, "ended the earlier bridges' commands");
        Ok(running)
    }

    async fn exec(&self, spec: ExecSpec) -> Result<RunningProcess, SandboxError> {
        if spec.serve_port.is_some() {
            return Err(SandboxError::Unavailable("a server inside a Daytona sandbox is not supported yet".into()));
        }
        if !spec.read_only.is_empty() || !spec.tools.is_empty() {
            // Host paths mean nothing in the cloud; what a command needs is staged with `write_state_file`.
            tracing::debug!(session = %self.session_id, "host paths of the command are not shown in a Daytona sandbox");
        }
        let mut spec = spec;
        // The tag names the command's session (found again by a later bridge) and marks everything it starts.
        let session = self.tags.next();
        reaper::mark(&mut spec, &session);
        let (env, dropped) = process::scrub_env(std::mem::take(&mut spec.env), &self.api_key);
        if !dropped.is_empty() {
            tracing::warn!(session = %self.session_id, ?dropped, "left Daytona's own variables out of a command");
        }
        let (exports, skipped) = process::env_exports(&env, &spec.cwd);
        if !skipped.is_empty() {
            tracing::warn!(session = %self.session_id, ?skipped, "variables sh cannot export were left out");
        }
        let (input, lines, stdin_len) = process::input(&exports, &spec.stdin).map_err(|why| SandboxError::Spawn {
            program: spec.program.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why),
        })?;
        if !self.echo_suppressed {
            // An older daemon would copy the input (the CLI's keys) into the command's log file on the sandbox's disk.
            return Err(SandboxError::Unavailable(format!(
                "the Daytona sandbox {} runs daemon {}, which writes a command's input to its disk; acp-sandbox needs \
                 daemon 0.144 or later (a newer snapshot)",
                self.id,
                self.daemon_version.as_deref().unwrap_or("?")
            )));
        }
        let line = process::command_line(&spec, lines, (!spec.interactive).then_some(stdin_len));
        // Until the command has its input, failing (or being dropped by a cancel) deletes its session: a command
        // that never got its input would wait for it for as long as the sandbox runs.
        let mut guard = process::SessionGuard::new(self.toolbox.clone(), session.clone());
        self.toolbox.create_session(&session).await?;
        let command = self.toolbox.execute(&session, &line).await?;
        process::send_input(&self.toolbox, &session, &command, &input).await?;
        guard.disarm();
        tracing::debug!(session = %self.session_id, sandbox = %self.id, daytona_session = %session, "started");

        let (stdout_write, stdout_read) = tokio::io::duplex(64 * 1024);
        let (stderr_write, stderr_read) = tokio::io::duplex(64 * 1024);
        let (outcome_tx, outcome_rx) = watch::channel(None);
        let (toolbox, task_session, task_command) = (self.toolbox.clone(), session.clone(), command.clone());
        let sandbox_session = self.session_id.clone();
        tokio::spawn(async move {
            let mut sinks = Sinks { stdout: stdout_write, stderr: stderr_write };
            let mut demuxer = Demuxer::default();
            let streamed = logs::follow(&toolbox, &task_session, &task_command, &mut demuxer, &mut sinks).await;
            let outcome = process::exit_code(&toolbox, &task_session, &task_command).await;
            let rest = match streamed {
                Ok(_) => Vec::new(),
                // The stream broke: what it missed comes from the plain logs, at the end.
                Err((seen, e)) => {
                    tracing::warn!(session = %sandbox_session, "{e}; reading the rest of the output at the end");
                    match toolbox.logs(&task_session, &task_command).await {
                        Ok(all) => all.get(seen..).map(<[u8]>::to_vec).unwrap_or_default(),
                        Err(e) => {
                            tracing::warn!(session = %sandbox_session, "{e}");
                            Vec::new()
                        }
                    }
                }
            };
            logs::complete(&mut demuxer, &mut sinks, &rest).await;
            drop(sinks);
            let _ = outcome_tx.send(Some(outcome));
        });
        let stdin = spec
            .interactive
            .then(|| process::interactive_stdin(self.toolbox.clone(), session.clone(), command.clone()));
        Ok(RunningProcess {
            stdin,
            stdout: Box::pin(stdout_read),
            stderr: Box::pin(stderr_read),
            handle: Box::new(DaytonaProcess {
                toolbox: self.toolbox.clone(),
                mark: reaper::exact_pattern(&session),
                session,
                command,
                outcome: outcome_rx,
                killed: false,
                exited: None,
            }),
            door: None,
            adopted: None,
        })
    }
}

#[async_trait]
impl RemoteFiles for DaytonaSandbox {
    async fn write(&self, path: &Path, bytes: &[u8]) -> Result<(), SandboxError> {
        self.upload(path, bytes.to_vec()).await
    }

    async fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        self.download(path).await
    }

    async fn read_at_most(&self, path: &Path, limit: u64) -> Result<Option<Vec<u8>>, SandboxError> {
        self.download_at_most(path, limit).await
    }

    async fn download_to(&self, path: &Path, dest: &Path, limit: u64) -> Result<Downloaded, SandboxError> {
        DaytonaSandbox::download_to(self, path, dest, limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn settings_come_from_the_environment() {
        let settings = DaytonaSettings::from_lookup(lookup(&[("DAYTONA_API_KEY", " dtn_k ")])).unwrap();
        assert_eq!(settings.endpoint.api_url, DEFAULT_API_URL);
        assert_eq!(settings.endpoint.api_key, "dtn_k");
        assert_eq!(settings.endpoint.organization_id, None);
        assert_eq!((settings.snapshot, settings.target, settings.auto_stop_minutes), (None, None, 60));

        let settings = DaytonaSettings::from_lookup(lookup(&[
            ("DAYTONA_API_KEY", "k"),
            ("DAYTONA_SERVER_URL", "http://old/api"),
            ("DAYTONA_TARGET", "eu"),
            ("DAYTONA_ORGANIZATION_ID", "org1"),
            ("ACP_SANDBOX_DAYTONA_SNAPSHOT", "snap"),
            ("ACP_SANDBOX_DAYTONA_AUTO_STOP", "0"),
        ]))
        .unwrap();
        assert_eq!(settings.endpoint.api_url, "http://old/api");
        assert_eq!(settings.endpoint.organization_id.as_deref(), Some("org1"));
        assert_eq!(
            (settings.snapshot.as_deref(), settings.target.as_deref(), settings.auto_stop_minutes),
            (Some("snap"), Some("eu"), 0)
        );
        let url = DaytonaSettings::from_lookup(lookup(&[
            ("DAYTONA_API_KEY", "k"),
            ("DAYTONA_API_URL", "http://new/api"),
            ("DAYTONA_SERVER_URL", "http://old/api"),
        ]))
        .unwrap();
        assert_eq!(url.endpoint.api_url, "http://new/api");
    }

    #[test]
    fn bad_settings_say_what_is_wrong() {
        assert_eq!(
            DaytonaSettings::from_lookup(lookup(&[("DAYTONA_API_KEY", "  ")])).unwrap_err().to_string(),
            "Daytona needs an API key: set DAYTONA_API_KEY, or run `acp-sandbox login --provider daytona`"
        );
        assert_eq!(
            DaytonaSettings::from_lookup(lookup(&[
                ("DAYTONA_API_KEY", "k"),
                ("ACP_SANDBOX_DAYTONA_AUTO_STOP", "soon")
            ]))
            .unwrap_err()
            .to_string(),
            r#"ACP_SANDBOX_DAYTONA_AUTO_STOP must be minutes (0 or more), not "soon""#
        );
    }

    #[test]
    fn state_files_stay_below_the_state_dir() {
        let dir = Path::new("/home/daytona/.acp-sandbox");
        assert_eq!(below(dir, Path::new("att/a.png")).unwrap(), dir.join("att/a.png"));
        assert_eq!(below(dir, &dir.join("att/a.png")).unwrap(), dir.join("att/a.png"));
        for bad in
            ["/etc/passwd", "../x", "a/../../x", "", "/home/daytona/.acp-sandbox/../x", "/home/daytona/.acp-sandbox"]
        {
            assert!(below(dir, Path::new(bad)).is_err(), "{bad}");
        }
    }
}
