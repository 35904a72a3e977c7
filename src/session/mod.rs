//! Sessions: creating, listing, replaying and deleting them, and running one turn at a time per session.
//!
//! [`Bridge`] is what the ACP server (and the `prompt` command) call. It knows nothing of JSON-RPC: updates
//! go out through an [`UpdateSink`], and failures are [`Error`]s that `server` maps to ACP errors.

mod catalog;
pub mod options;
pub mod prompt;
mod protected;
mod remote;
mod review;
pub mod serve;
mod turn;
mod turn_lock;
mod versions;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::{
    AvailableCommand, AvailableCommandInput, AvailableCommandsUpdate, ContentBlock, ContentChunk, SessionConfigOption,
    SessionInfoUpdate, SessionUpdate, StopReason, UnstructuredCommandInput,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::agents::AgentKind;
use crate::agents::opencode::permissions;
use crate::agents::options as agent_options;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::locate::installed_executable;
use crate::paths;
use crate::sandbox::SandboxProvider;
use crate::sandbox::local::{Isolation, LocalProvider};
use crate::store::{SessionRecord, Store, TurnStatus, now_ms, rfc3339};

/// Where a session's updates go: the editor's connection, or the terminal for `acp-sandbox prompt`.
#[async_trait::async_trait]
pub trait UpdateSink: Send + Sync {
    /// Sends one update of one session. Must not block: it queues.
    fn send(&self, session_id: &str, update: SessionUpdate);

    /// Sends one update already serialized, as the store kept it (`update` is the JSON of a [`SessionUpdate`]): a
    /// sink that writes JSON sends these bytes as they are, without serializing the update again.
    fn send_json(&self, session_id: &str, update: String) {
        match serde_json::from_str::<SessionUpdate>(&update) {
            Ok(update) => self.send(session_id, update),
            Err(e) => tracing::error!(session = session_id, "could not read back a serialized update: {e}"),
        }
    }

    /// Sends a run of updates already serialized, in order, as [`UpdateSink::send_json`] would one by one: a sink
    /// that writes JSON hands the whole run on at once.
    fn send_json_run(&self, session_id: &str, updates: Vec<String>) {
        for update in updates {
            self.send_json(session_id, update);
        }
    }

    /// Asks the user to allow a tool call (`session/request_permission`). `None` when nobody can answer (no
    /// editor, or it went away): the caller treats it as a rejection.
    async fn request_permission(
        &self,
        _request: agent_client_protocol::v1::schema::RequestPermissionRequest,
    ) -> Option<agent_client_protocol::v1::schema::RequestPermissionOutcome> {
        None
    }

    /// Hands a file's new text to the editor (`fs/write_text_file`), which shows it for review. `Err` with the
    /// reason when the editor refused it or cannot be asked.
    async fn write_text_file(
        &self,
        _request: agent_client_protocol::v1::schema::WriteTextFileRequest,
    ) -> std::result::Result<(), String> {
        Err("no editor is connected".into())
    }
}

/// A session as listed in the history.
#[derive(Clone, Debug)]
pub struct SessionSummary {
    /// Our id.
    pub id: String,
    /// Its workspace.
    pub cwd: String,
    /// Its title, once it had a prompt.
    pub title: Option<String>,
    /// Last activity, RFC 3339.
    pub updated_at: String,
}

/// A page of the history.
#[derive(Clone, Debug)]
pub struct SessionPage {
    /// The sessions, newest first.
    pub sessions: Vec<SessionSummary>,
    /// Opaque cursor of the next page.
    pub next_cursor: Option<String>,
}

/// What the bridge was told about its client.
#[derive(Debug, Default)]
struct ClientInfo {
    terminal_output: AtomicBool,
    abilities: Mutex<ClientAbilities>,
}

/// What the client offers to do for the agent (`initialize`'s `clientCapabilities`): read and write files through
/// the editor, with its unsaved changes (`fs/read_text_file`, `fs/write_text_file`), and run commands in its own
/// terminals (`terminal/*`). Recorded for the features that use them; nothing does yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientAbilities {
    /// `fs.readTextFile`.
    pub read_text_file: bool,
    /// `fs.writeTextFile`.
    pub write_text_file: bool,
    /// `terminal`.
    pub terminal: bool,
}

/// The state of a session that this process has touched.
#[derive(Default)]
struct LiveSession {
    /// Cancels the running turn, if any.
    running: Mutex<Option<CancellationToken>>,
    /// The prompts that arrived and hold a [`PromptTicket`]: queued, starting or running. A cancel cancels them
    /// all, so one sent right after its prompt is not lost before the turn registers in `running`.
    pending: Mutex<Vec<(u64, CancellationToken)>>,
}

impl LiveSession {
    fn idle(&self) -> bool {
        self.running.lock().unwrap_or_else(|p| p.into_inner()).is_none()
            && self.pending.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }
}

/// A prompt's place, taken when it arrives ([`Bridge::prompt_arrived`], in the order of the connection): a cancel of
/// its session from then on cancels it, whether its turn runs yet or not; a prompt that arrives after the cancel
/// gets a fresh ticket and is not cancelled.
pub struct PromptTicket {
    live: Arc<LiveSession>,
    number: u64,
    /// Cancels this prompt only (its `$/cancel_request`); cancelled with the bridge too.
    token: CancellationToken,
}

impl PromptTicket {
    /// Cancels this prompt, and only it.
    pub fn canceller(&self) -> CancellationToken {
        self.token.clone()
    }
}

impl Drop for PromptTicket {
    fn drop(&mut self) {
        self.live.pending.lock().unwrap_or_else(|p| p.into_inner()).retain(|(number, _)| *number != self.number);
    }
}

/// All sessions of one bridge process.
pub struct Bridge {
    config: Config,
    store: Arc<Store>,
    /// Where sessions run (`--sandbox`).
    provider: Arc<dyn SandboxProvider>,
    /// Where the bridge's own short commands run (`--version` probes, model lists): always on this machine.
    own_provider: Arc<dyn SandboxProvider>,
    isolation: Isolation,
    /// The sessions open in this process (made, loaded or resumed here, and not closed).
    live: Arc<Mutex<HashMap<String, Arc<LiveSession>>>>,
    client: ClientInfo,
    /// Cancelled when the bridge shuts down: every running turn ends and kills its CLI.
    shutdown: CancellationToken,
    /// The models OpenCode can use.
    catalog: Arc<catalog::ModelCatalog>,
    /// Warm OpenCode servers, one per session at most.
    servers: Arc<serve::Servers>,
    /// Sessions told in this process that their OpenCode server could not start.
    fallback_told: Mutex<std::collections::HashSet<String>>,
    /// Per session under `ask`: the workspace's OpenCode configuration the user was asked about, and the answer.
    project_consent: Mutex<HashMap<String, (Vec<String>, bool)>>,
    /// What the user allowed "always" in each session (its own rules carry it, never the server's instance).
    pub(super) always_rules: Arc<permissions::AlwaysAllowed>,
    /// What `--version` said, per executable file (see [`versions`]; also kept in the data dir).
    versions: Mutex<HashMap<VersionKey, Option<String>>>,
    version_probe: tokio::sync::Mutex<()>,
    /// Per session: see [`Bridge::gate`].
    gates: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Where updates outside any turn go (the editor's connection, once it initialized).
    notifier: Arc<Mutex<Option<Arc<dyn UpdateSink>>>>,
    /// A warm server already reported its models in this process.
    models_from_server: AtomicBool,
    /// The last [`PromptTicket`] number given.
    tickets: std::sync::atomic::AtomicU64,
    /// What the bridge keeps about sessions in remote sandboxes.
    remote: remote::RemoteSessions,
}

/// An executable as named, and the file it is now (`None`: it cannot be resolved).
type VersionKey = (PathBuf, Option<versions::Key>);

const LIST_PAGE: usize = 50;

/// How long a session goes unused before its sandbox's caches are freed.
pub const TRIM_CACHES_AFTER: std::time::Duration = std::time::Duration::from_secs(14 * 86_400);

/// How long [`Bridge::shutdown`] waits for the turns it cancelled to be recorded: the editor waits for the exit.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_millis(700);

impl Bridge {
    /// Opens the store and decides the sandbox. Fails when `--sandbox bwrap` cannot work.
    pub async fn open(config: Config) -> Result<Self> {
        let (path, busy_timeout) = (config.database_path(), config.store_busy_timeout);
        // Opening may wait for another bridge's lock and migrate: not on the runtime's threads.
        let store = tokio::task::spawn_blocking(move || Store::open_with(&path, busy_timeout))
            .await
            .map_err(|_| crate::store::StoreError::Stopped)??;
        let store = Arc::new(store);
        let isolation = Isolation::resolve(config.sandbox)?;
        match &isolation {
            // Falling back silently would hide that the agent has the whole machine.
            Isolation::None(why) => {
                tracing::warn!("CLIs run WITHOUT a sandbox: {why}");
                crate::sandbox::process::become_subreaper();
            }
            Isolation::Bwrap(_) => {}
        }
        if config.network == crate::sandbox::net::proxy::NetworkMode::Host {
            tracing::warn!("--network host: sandboxes share the host's network, its loopback services included");
        }
        let settings = Arc::new(config.local_settings(isolation.clone()));
        let own_provider: Arc<dyn SandboxProvider> =
            Arc::new(LocalProvider::new(paths::sessions_dir(&config.data_dir), settings));
        let provider = crate::sandbox::session_provider(
            config.sandbox,
            own_provider.clone(),
            crate::auth::provider_variables(&config),
        )?;
        let catalog = Arc::new(catalog::ModelCatalog::new(config.clone(), own_provider.clone()));
        let servers = serve::Servers::new(config.server_idle_timeout, config.max_servers, config.data_dir.clone());
        Ok(Self {
            servers,
            fallback_told: Mutex::default(),
            project_consent: Mutex::default(),
            always_rules: Arc::default(),
            versions: Mutex::default(),
            version_probe: tokio::sync::Mutex::const_new(()),
            gates: Mutex::default(),
            notifier: Arc::default(),
            models_from_server: AtomicBool::new(false),
            tickets: std::sync::atomic::AtomicU64::new(0),
            remote: remote::RemoteSessions::default(),
            catalog,
            config,
            store,
            provider,
            own_provider,
            isolation,
            live: Arc::default(),
            client: ClientInfo::default(),
            shutdown: CancellationToken::new(),
        })
    }

    /// Kills what CLIs of earlier, killed bridges left running on this data dir: processes carrying a session's
    /// HOME whose owners ([`crate::sandbox::local::owners::record_owner`]) are all gone and whose session no live bridge
    /// runs a turn of. Only a serving bridge does this, before it starts anything; read-only commands never do.
    pub async fn reap_leftovers(&self) -> Result<()> {
        let run_dir = paths::run_dir(&self.config.data_dir);
        let kept = self.sweep_kept_warm();
        for (pid, session) in
            crate::sandbox::local::owners::leftover_processes(&paths::sessions_dir(&self.config.data_dir))
        {
            if kept.contains(&session)
                || crate::sandbox::local::owners::owned_by_a_live_bridge(&run_dir, &session)
                || self.store.running_elsewhere(&session).await?
            {
                continue;
            }
            tracing::warn!(session = %session, pid, "killing a process an earlier, killed bridge left running");
            if let Ok(pid) = u32::try_from(pid) {
                crate::sandbox::process::kill_tree(pid);
            }
        }
        Ok(())
    }

    /// Looks at the servers earlier bridges kept warm (`--keep-warm`): the records of those that are gone are
    /// removed, and those no bridge uses now are stopped when this bridge keeps none or was started with other
    /// sandbox settings (a changed policy must not live on in them). Returns the sandboxes of those that stay.
    fn sweep_kept_warm(&self) -> HashSet<String> {
        use crate::sandbox::local::warm;
        let run_dir = paths::run_dir(&self.config.data_dir);
        let settings = warm::settings_digest(&self.config.local_settings(self.isolation.clone()));
        let mut kept = HashSet::new();
        for record in warm::list(&run_dir) {
            if !record.alive() {
                warm::forget(&run_dir, &record);
                continue;
            }
            let wanted = self.config.keep_warm.is_some() && record.settings == settings;
            // Held by the bridge that uses it now: that one decides.
            let unused = turn_lock::try_lock(&self.config.data_dir, &format!("server {}", record.key));
            if !wanted && let Ok(Some(_unused)) = unused {
                tracing::info!(
                    key = %record.key,
                    pid = record.pid,
                    why = if self.config.keep_warm.is_none() { "--keep-warm is off" } else { "other sandbox settings" },
                    "stopping a server an earlier bridge kept warm"
                );
                warm::stop(&run_dir, &record);
                continue;
            }
            kept.insert(record.sandbox.clone());
        }
        kept
    }

    /// Frees, in the background, the caches of the sandboxes of sessions unused for [`TRIM_CACHES_AFTER`] (OpenCode
    /// downloads its plugins into every session's own cache, so they add up across many sessions); the provider
    /// leaves a sandbox alone while something still runs in it. The CLI fetches what it needs again on the next
    /// prompt. Serving bridges only.
    pub fn trim_idle_caches(self: &Arc<Self>) {
        let bridge = self.clone();
        tokio::spawn(async move {
            let before = now_ms().saturating_sub(TRIM_CACHES_AFTER.as_millis() as i64);
            let Ok(sessions) = bridge.store.list_sessions(None, None, None, usize::MAX).await else { return };
            let mut trimmed = 0;
            // A shared sandbox is trimmed once, and only when none of its sessions was used lately.
            let mut skip: std::collections::HashSet<&str> =
                sessions.iter().filter(|r| r.updated_at >= before).filter_map(|r| r.sandbox_id.as_deref()).collect();
            for record in sessions.iter().filter(|r| r.updated_at < before) {
                let Some(sandbox) = record.sandbox_id.as_deref() else { continue };
                if record.sandbox_provider != bridge.provider.name() || !skip.insert(sandbox) {
                    continue;
                }
                match bridge.provider.trim(sandbox).await {
                    Ok(true) => trimmed += 1,
                    Ok(false) => {}
                    Err(e) => tracing::warn!(session = %record.id, "could not trim the sandbox's caches: {e}"),
                }
            }
            if trimmed > 0 {
                tracing::info!(
                    sessions = trimmed,
                    "freed the caches of sessions unused for {} days",
                    TRIM_CACHES_AFTER.as_secs() / 86_400
                );
            }
        });
    }

    /// The settings this bridge runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The store, for the `sessions` command.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// How CLIs are isolated.
    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    /// Records what the client can render (from `initialize`).
    pub fn set_client_terminal_output(&self, supported: bool) {
        self.client.terminal_output.store(supported, Ordering::Relaxed);
    }

    /// Records what the client offers to do (from `initialize`), for [`Bridge::client_abilities`].
    pub fn set_client_capabilities(&self, offered: &agent_client_protocol::v1::schema::ClientCapabilities) {
        let abilities = ClientAbilities {
            read_text_file: offered.fs.read_text_file,
            write_text_file: offered.fs.write_text_file,
            terminal: offered.terminal,
        };
        tracing::info!(
            read_text_file = abilities.read_text_file,
            write_text_file = abilities.write_text_file,
            terminal = abilities.terminal,
            "the client's capabilities"
        );
        *self.client.abilities.lock().unwrap_or_else(|p| p.into_inner()) = abilities;
    }

    /// The copy on this machine that mirrors a remote sandbox's workspace (`<sessions>/<id>/review`): what the
    /// local sandbox would hide is never in it, and the git dir and protected paths are not reviewed.
    pub(super) fn mirror_copy(&self, record: &SessionRecord) -> crate::workspace::review::WorkspaceCopy {
        self.config
            .local_settings(self.isolation.clone())
            .review_copy(&paths::sessions_dir(&self.config.data_dir).join(&record.id), Path::new(&record.cwd))
    }

    /// What the client offered to do, as last recorded; nothing before it initialized.
    pub fn client_abilities(&self) -> ClientAbilities {
        *self.client.abilities.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live(&self, id: &str) -> Arc<LiveSession> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.entry(id.to_string()).or_default().clone()
    }

    async fn record(&self, id: &str) -> Result<SessionRecord> {
        match self.store.session(id).await? {
            Some(record) => Ok(record),
            None => Err(self.not_found(id).await),
        }
    }

    /// Says why a session may be missing: a store that holds nothing usually means its data dir was deleted or
    /// moved (an editor keeps its thread list on its own, so it asks for sessions a new store never had).
    async fn not_found(&self, id: &str) -> Error {
        let (held, oldest) = self.store.census().await.unwrap_or((0, None));
        let (held, hint) = match oldest {
            None => (
                "it holds no sessions".to_string(),
                "If the session was made here before, the data dir was deleted or replaced, or --data-dir or XDG_DATA_HOME now names another one",
            ),
            Some(oldest) => (
                format!("{held} session{}, the oldest from {}", if held == 1 { "" } else { "s" }, rfc3339(oldest)),
                "It was deleted, or it is in another data dir (--data-dir); `acp-sandbox sessions list` shows what this store holds",
            ),
        };
        Error::SessionNotFound { id: id.to_string(), store: self.store.path().to_path_buf(), held, hint }
    }

    /// Creates a session. The sandbox is prepared on the first prompt, so this answers at once.
    pub async fn new_session(&self, cwd: &Path) -> Result<(String, Vec<SessionConfigOption>)> {
        self.check_workspace(cwd)?;
        let now = now_ms();
        let mut config = json!({});
        if let Some(model) = &self.config.model {
            config[self.config.agent.default_option()] = json!(model);
        }
        let record = SessionRecord {
            id: format!("sess_{}", uuid::Uuid::new_v4().simple()),
            agent: self.config.agent.as_str().to_string(),
            cwd: normalize(cwd),
            sandbox_provider: self.provider.name().to_string(),
            sandbox_id: None,
            native_id: None,
            title: None,
            config,
            created_at: now,
            updated_at: now,
        };
        self.store.create_session(&record).await?;
        tracing::info!(session = %record.id, cwd = %record.cwd, agent = %record.agent, "new session");
        // Open from now on: a changed model list is announced to it.
        self.live(&record.id);
        let options =
            options::config_options(self.agent_of(&record), &record.config, &self.config, &self.catalog.models());
        Ok((record.id, options))
    }

    /// Refuses a workspace that would hand the agent the whole filesystem, the home or the bridge's own data.
    fn check_workspace(&self, cwd: &Path) -> Result<()> {
        if !cwd.is_absolute() {
            return Err(Error::InvalidParams(format!("cwd must be an absolute path, got {}", cwd.display())));
        }
        match crate::sandbox::local::policy::workspace_refusal(cwd, &paths::home(), &self.config.data_dir) {
            Some(why) => Err(Error::InvalidParams(why)),
            None => Ok(()),
        }
    }

    fn agent_of(&self, record: &SessionRecord) -> AgentKind {
        AgentKind::parse(&record.agent).unwrap_or(self.config.agent)
    }

    /// Replays the whole conversation through `sink`, then returns its config options. The next prompt
    /// continues the same CLI conversation.
    pub async fn load_session(&self, id: &str, sink: &dyn UpdateSink) -> Result<Vec<SessionConfigOption>> {
        let record = self.record(id).await?;
        self.check_workspace(Path::new(&record.cwd))?;
        self.store.mark_orphaned_turns(id).await?;
        // Planned first, then read page by page: a long turn is never in memory whole.
        let history = self.store.replay_plan(id, self.config.replay_limit).await?;
        if history.omitted_turns > 0 {
            sink.send(
                id,
                note(&format!(
                    "_{} earlier turn{} of this conversation {} not shown here; the agent still remembers {}._",
                    history.omitted_turns,
                    if history.omitted_turns == 1 { "" } else { "s" },
                    if history.omitted_turns == 1 { "is" } else { "are" },
                    if history.omitted_turns == 1 { "it" } else { "them" },
                )),
            );
        }
        for (index, (turn, first)) in history.turns.into_iter().enumerate() {
            let blocks: Vec<ContentBlock> = serde_json::from_value(turn.prompt).unwrap_or_default();
            for block in blocks {
                sink.send(id, SessionUpdate::UserMessageChunk(ContentChunk::new(block)));
            }
            // Only the first turn kept can be cut: the newest one, alone longer than the replay limit.
            if index == 0 && history.omitted_updates > 0 {
                sink.send(
                    id,
                    note(&format!(
                        "_The first {} update{} of this turn {} not shown here (--replay-limit {}); the agent still remembers {}._",
                        history.omitted_updates,
                        if history.omitted_updates == 1 { "" } else { "s" },
                        if history.omitted_updates == 1 { "is" } else { "are" },
                        self.config.replay_limit,
                        if history.omitted_updates == 1 { "it" } else { "them" },
                    )),
                );
            }
            let mut from = first;
            while let Some(start) = from {
                let page = self.store.replay_page(turn.id, start).await?;
                from = match page.len() {
                    crate::store::REPLAY_PAGE => page.last().map(|(last, _)| last + 1),
                    _ => None,
                };
                for (_, mut event) in page {
                    // Stored before updates were bounded: cut like a new one.
                    turn::bound_update(&mut event);
                    match serde_json::from_value::<SessionUpdate>(event) {
                        Ok(update) => sink.send(id, update),
                        Err(e) => tracing::warn!(session = id, "skipping a stored update that no longer parses: {e}"),
                    }
                }
            }
            match turn.status {
                TurnStatus::Interrupted => {
                    sink.send(id, note("_This turn was interrupted: acp-sandbox stopped before it finished._"))
                }
                TurnStatus::Failed => {
                    let error = turn.error.unwrap_or_default();
                    sink.send(id, note(&format!("_This turn failed: {}_", crate::lines::first_text_line(&error))))
                }
                TurnStatus::Running => sink.send(id, note("_This turn is still running in another window._")),
                // The editor saw its own cancel; a replay would show the prompt with nothing after it.
                TurnStatus::Done
                    if turn.stop_reason.as_deref() == Some(turn::stop_reason_name(StopReason::Cancelled)) =>
                {
                    sink.send(id, note("_This turn was cancelled before it finished._"))
                }
                TurnStatus::Done => {}
            }
        }
        if let Some(title) = &record.title {
            sink.send(id, SessionUpdate::SessionInfoUpdate(SessionInfoUpdate::new().title(title.clone())));
        }
        let commands = self.available_commands(id).await?;
        if !commands.is_empty() {
            sink.send(id, SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(commands)));
        }
        self.live(id);
        Ok(options::config_options(self.agent_of(&record), &record.config, &self.config, &self.catalog.models()))
    }

    /// The slash commands the session's CLI offers, for `available_commands_update`.
    pub async fn available_commands(&self, id: &str) -> Result<Vec<AvailableCommand>> {
        let record = self.record(id).await?;
        let user_config = paths::user_config_dir();
        let commands = self.agent_of(&record).commands(&user_config, Path::new(&record.cwd));
        Ok(commands
            .into_iter()
            .map(|command| {
                let hint =
                    command.hint.map(|hint| AvailableCommandInput::Unstructured(UnstructuredCommandInput::new(hint)));
                AvailableCommand::new(command.name, command.description).input(hint)
            })
            .collect())
    }

    /// Reattaches a session without replay.
    pub async fn resume_session(&self, id: &str) -> Result<Vec<SessionConfigOption>> {
        let record = self.record(id).await?;
        self.check_workspace(Path::new(&record.cwd))?;
        self.store.mark_orphaned_turns(id).await?;
        self.live(id);
        Ok(options::config_options(self.agent_of(&record), &record.config, &self.config, &self.catalog.models()))
    }

    /// Lists this agent's sessions, newest first. The cursor is opaque to the client.
    pub async fn list_sessions(&self, cwd: Option<&Path>, cursor: Option<&str>) -> Result<SessionPage> {
        let before = match cursor {
            None => None,
            Some(cursor) => {
                Some(parse_cursor(cursor).ok_or_else(|| Error::InvalidParams(format!("invalid cursor: {cursor}")))?)
            }
        };
        let cwd = cwd.map(normalize);
        // Each agent server in the editor shows its own threads; the store is shared by both agents.
        let records = self
            .store
            .list_sessions(
                Some(self.config.agent.as_str()),
                cwd.as_deref(),
                before.as_ref().map(|(time, id)| (*time, id.as_str())),
                LIST_PAGE + 1,
            )
            .await?;
        let has_more = records.len() > LIST_PAGE;
        let records = &records[..records.len().min(LIST_PAGE)];
        let next_cursor = if has_more { records.last().map(|r| format!("{}:{}", r.updated_at, r.id)) } else { None };
        Ok(SessionPage {
            sessions: records
                .iter()
                .map(|r| SessionSummary {
                    id: r.id.clone(),
                    cwd: r.cwd.clone(),
                    title: r.title.clone(),
                    updated_at: rfc3339(r.updated_at),
                })
                .collect(),
            next_cursor,
        })
    }

    /// Cancels any running turn and forgets the session's in-memory state. The session stays stored.
    pub fn close_session(&self, id: &str) -> Result<()> {
        self.cancel(id);
        self.stop_server(id);
        self.forget_if_idle(id);
        Ok(())
    }

    /// Forgets the in-memory state of a session with no prompt queued or running. A cancelled turn may still be
    /// winding down; its entry stays until then, so that a prompt sent right after a close waits its turn instead
    /// of running beside it.
    fn forget_if_idle(&self, id: &str) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if live.get(id).is_some_and(|s| s.idle()) {
            live.remove(id);
        }
    }

    /// Cancels any running turn, frees the sandbox and removes the session from the store. Unknown ids
    /// succeed.
    pub async fn delete_session(&self, id: &str) -> Result<()> {
        // A turn of this bridge is cancelled below; one another window runs keeps its session (its sandbox would be
        // removed under it), and holding the lock keeps another window from starting one while this deletes.
        let runs_here = self.live.lock().unwrap_or_else(|p| p.into_inner()).get(id).is_some_and(|s| !s.idle());
        let _turn_lock = match runs_here {
            true => None,
            false => match turn_lock::try_lock(&self.config.data_dir, id)? {
                Some(lock) if !self.store.running_elsewhere(id).await? => Some(lock),
                _ => return Err(Error::DeleteWhileRunningElsewhere),
            },
        };
        let server = self.servers.of_session(id);
        self.close_session(id)?;
        // Its server holds the sandbox's files open: gone first (unless other sessions use it).
        self.servers.release(id).await;
        let Some(record) = self.store.session(id).await? else {
            return Ok(());
        };
        if let Some(sandbox_id) = &record.sandbox_id
            && record.sandbox_provider == self.provider.name()
        {
            let shared = Path::new(sandbox_id).file_name().and_then(|n| n.to_str()).is_some_and(is_shared_sandbox);
            let others = match shared {
                true => self.sandbox_users(sandbox_id).await?.into_iter().filter(|user| user != id).count(),
                false => 0,
            };
            if others == 0 {
                self.provider.destroy(sandbox_id).await?;
            } else {
                // The other sessions' conversations live in the same OpenCode database: only this one goes.
                self.forget_conversation(&record, server).await;
            }
        }
        // A remote sandbox's mirror lives on this machine (a local sandbox's went with its state dir).
        let mirror = paths::sessions_dir(&self.config.data_dir).join(&record.id).join("review");
        if mirror.is_dir()
            && let Err(e) = std::fs::remove_dir_all(&mirror)
        {
            tracing::warn!(session = id, "could not remove the mirror of the sandbox's workspace: {e}");
        }
        self.store.delete_session(id).await?;
        if _turn_lock.is_some() {
            turn_lock::remove(&self.config.data_dir, id);
        }
        tracing::info!(session = id, "deleted session");
        Ok(())
    }

    /// The stored sessions whose sandbox is `sandbox_id`.
    async fn sandbox_users(&self, sandbox_id: &str) -> Result<Vec<String>> {
        let sessions = self.store.list_sessions(None, None, None, usize::MAX).await?;
        Ok(sessions
            .into_iter()
            .filter(|r| r.sandbox_id.as_deref() == Some(sandbox_id) && r.sandbox_provider == self.provider.name())
            .map(|r| r.id)
            .collect())
    }

    /// Deletes a deleted session's OpenCode conversation from the shared server it used, when that still runs
    /// (else the conversation stays in the shared database, unlisted: nothing of ours names it any more).
    async fn forget_conversation(&self, record: &SessionRecord, server: Option<Arc<serve::Server>>) {
        let Some(native) = &record.native_id else { return };
        let Some(server) = server.filter(|server| server.alive()) else {
            // Its sandbox's next server deletes it.
            if let Some(state_dir) = &record.sandbox_id
                && let Err(e) = serve::defer_delete(Path::new(state_dir), native)
            {
                tracing::warn!(session = %record.id, native, "could not note the conversation for deletion: {e}");
            }
            return;
        };
        let path = format!("/session/{native}");
        match server.client.call_within(std::time::Duration::from_secs(5), hyper::Method::DELETE, &path, None).await {
            Ok(_) => tracing::info!(session = %record.id, native, "deleted the conversation on the shared server"),
            Err(e) => tracing::warn!(session = %record.id, native, "could not delete the conversation: {e}"),
        }
    }

    /// Cancels the running turn of a session and every prompt of it that arrived before and has not started
    /// yet. A cancel for an idle or unknown session does nothing (a later prompt is not cancelled).
    pub fn cancel(&self, id: &str) {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned();
        let Some(live) = live else { return };
        let pending = live.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(token) = live.running.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            tracing::info!(session = id, "cancelling the running turn");
            token.cancel();
        }
        if !pending.is_empty() {
            tracing::info!(session = id, count = pending.len(), "cancelling the prompts that arrived");
        }
        for (_, token) in pending.iter() {
            token.cancel();
        }
    }

    /// Takes the place of a prompt of `id` that just arrived: call it where prompts and cancels are received in
    /// order, then run the prompt with [`Bridge::prompt_queued`].
    pub fn prompt_arrived(&self, id: &str) -> PromptTicket {
        let live = self.live(id);
        let number = self.tickets.fetch_add(1, Ordering::SeqCst) + 1;
        let token = self.shutdown.child_token();
        live.pending.lock().unwrap_or_else(|p| p.into_inner()).push((number, token.clone()));
        PromptTicket { live, number, token }
    }

    /// Changes a config option from the next turn on; answers the complete list.
    /// The session's modes (its mode option, as ACP session modes).
    pub async fn session_modes(&self, id: &str) -> Result<Option<agent_client_protocol::v1::schema::SessionModeState>> {
        let record = self.record(id).await?;
        Ok(options::session_modes(self.agent_of(&record), &record.config, &self.config, &self.catalog.models()))
    }

    pub async fn set_config_option(&self, id: &str, option: &str, value: &str) -> Result<Vec<SessionConfigOption>> {
        let record = self.record(id).await?;
        let agent = self.agent_of(&record);
        let models = self.catalog.models();
        let config = options::apply(agent, &record.config, option, value, &self.config, &models)?;
        self.store.set_config(id, &config).await?;
        Ok(options::config_options(agent, &config, &self.config, &models))
    }

    /// Runs one prompt turn to its end. Updates go to `sink` (and the store) as they happen; every one
    /// of them is sent before this returns.
    pub async fn prompt(&self, id: &str, blocks: Vec<ContentBlock>, sink: Arc<dyn UpdateSink>) -> Result<StopReason> {
        let ticket = self.prompt_arrived(id);
        self.prompt_queued(id, ticket, blocks, sink).await
    }

    /// [`Bridge::prompt`] for a prompt whose place was taken when it arrived: cancelled meanwhile, its turn is
    /// recorded and answers `cancelled` without starting the CLI.
    pub async fn prompt_queued(
        &self,
        id: &str,
        ticket: PromptTicket,
        blocks: Vec<ContentBlock>,
        sink: Arc<dyn UpdateSink>,
    ) -> Result<StopReason> {
        // Refused before anything starts or is stored: the CLI would start only to fail on it.
        if blocks.iter().all(|block| matches!(block, ContentBlock::Text(text) if text.text.trim().is_empty())) {
            drop(ticket);
            self.forget_if_idle(id);
            return Err(Error::InvalidParams("The prompt is empty: write something to send".into()));
        }
        let record = match self.record(id).await {
            Ok(record) => record,
            Err(error) => {
                // A prompt of an unknown session leaves nothing behind.
                drop(ticket);
                self.forget_if_idle(id);
                return Err(error);
            }
        };
        let agent = self.agent_of(&record);
        if agent != self.config.agent {
            return Err(Error::WrongAgent {
                session_agent: agent.display_name(),
                served: self.config.agent.display_name(),
            });
        }
        self.check_workspace(Path::new(&record.cwd))?;
        let credential = crate::auth::credential(&self.config, agent)?;
        let live = ticket.live.clone();
        let elsewhere = self.store.running_elsewhere(id).await?;
        let (token, turn_lock) = {
            let mut running = live.running.lock().unwrap_or_else(|p| p.into_inner());
            if running.is_some() {
                return Err(Error::TurnInProgress);
            }
            // Another window's bridge: its lock decides a race that the store's rows cannot (both read before
            // either writes); a row of a bridge that predates the lock still counts.
            let Some(turn_lock) = turn_lock::try_lock(&self.config.data_dir, id)?.filter(|_| !elsewhere) else {
                return Err(Error::TurnInAnotherWindow);
            };
            // The ticket's own token: a cancel that came while the prompt waited has cancelled it already.
            let token = ticket.token.clone();
            *running = Some(token.clone());
            (token, turn_lock)
        };
        // Cleared however the turn ends, even by a panic or a dropped task: a session must never stay busy.
        let _running = RunningGuard(live.clone());
        let model = options::model_info(agent, &record.config, &self.config, &self.catalog.models());
        let result =
            turn::Turn { bridge: self, record, agent, credential, blocks, sink, cancel: token, model }.run().await;
        // The session is let go of first: a suspension checks that no prompt came meanwhile. It counts as on its way
        // from before, so that a shutdown waiting for the turns waits for it too.
        let suspension = self.remote.on_its_way();
        drop(_running);
        drop(turn_lock);
        drop(ticket);
        self.suspend_after_turn(id, live, suspension);
        result
    }

    /// Ends every running turn and stops every warm server, waiting at most [`SHUTDOWN_GRACE`] for the turns to
    /// be recorded. Called when the client goes away: nothing the bridge started may outlive it. A turn still
    /// busy after the grace is dropped with the runtime, which kills its processes; its row is marked
    /// `interrupted` by the next bridge. Only the first call waits; later ones return at once.
    pub async fn shutdown(&self) {
        if self.shutdown.is_cancelled() {
            return;
        }
        self.shutdown.cancel();
        let turns = async {
            while self.any_turn_running() || self.remote.suspending() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        let servers = async {
            if self.config.keep_warm.is_some() { self.servers.leave_all().await } else { self.servers.stop_all().await }
        };
        let ended = tokio::time::timeout(SHUTDOWN_GRACE, futures::future::join(turns, servers)).await;
        if ended.is_err() {
            tracing::warn!("turns were still ending at exit; their processes are killed with the bridge");
        }
    }

    /// Whether this session's prompts go to a warm OpenCode server.
    fn serves(&self, record: &SessionRecord) -> bool {
        self.agent_of(record) == self.config.agent && self.config.agent.serves(&self.config.agents)
    }

    /// Whether sandboxes get a network namespace of their own (a server's port is then private to its sandbox).
    fn private_network(&self) -> bool {
        matches!(self.isolation, Isolation::Bwrap(_))
            && self.config.network.uses_proxy()
            && crate::sandbox::local::bwrap::bwrap_netns().is_ok()
    }

    /// Starts the session's OpenCode server in the background, so that its first prompt finds it warm. Does
    /// nothing when the CLI is not installed yet (the first prompt installs it) or the server already runs.
    pub fn warm_server(self: &Arc<Self>, id: &str) {
        if !self.config.agent.serves(&self.config.agents)
            || self.servers.of_session(id).is_some()
            // A remote sandbox runs no warm server yet, and warming would resume a sandbox paused between turns.
            || !self.sessions_run_here()
        {
            return;
        }
        let Some(executable) = installed_executable(&self.config, self.config.agent) else { return };
        let bridge = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let result = async {
                let record = bridge.record(&id).await.map_err(|e| e.to_string())?;
                if !bridge.serves(&record) {
                    return Ok(());
                }
                // A version the cache knows decides at once; an unknown one is not waited for: the server starts
                // now and its health answer says its version (`serve::ready` refuses a 2.x), while the probe started
                // with the bridge fills the cache for the turn, which does wait for it (it may fall back to `run`).
                let key = bridge.version_key(&executable).await;
                let executable = match bridge.known_version(&key).await {
                    Some(_) => {
                        bridge
                            .supported_executable(bridge.config.agent, &executable, &bridge.shutdown)
                            .await
                            .map_err(|e| e.to_string())?
                            .0
                    }
                    None => executable,
                };
                let sandbox = bridge.session_sandbox(&record).await.map_err(|e| e.to_string())?;
                if agent_options::approvals(&record.config) == agent_options::APPROVALS_ASK
                    && !crate::agents::opencode::project::agent_written(sandbox.state_dir()).is_empty()
                {
                    return Err("the agent wrote plugins or tools into its own OpenCode configuration".into());
                }
                let model = crate::agents::opencode::options::model(&record.config).map(str::to_string);
                // Nobody is asked here, and the user may still choose `ask` before the first prompt: the workspace's
                // own configuration (plugins, MCP servers) loads only with a turn that allows it, which restarts
                // this server then.
                let has_config = !crate::agents::opencode::project::loaders(Path::new(&record.cwd)).is_empty();
                let profile = match bridge.server_profile(&record) {
                    Ok(profile) if !has_config || profile.approvals == agent_options::APPROVALS_ASK => profile,
                    _ => serve::Profile {
                        approvals: agent_options::approvals(&record.config).to_string(),
                        project_config: false,
                    },
                };
                let key = bridge.server_key(&id, sandbox.as_ref(), &profile.key());
                let warmed = bridge
                    .servers
                    .warm(&key, &id, || {
                        serve::start_server(
                            &bridge,
                            &id,
                            &key,
                            sandbox.clone(),
                            &executable,
                            None,
                            model.as_deref(),
                            &profile,
                        )
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                bridge.learn_models(warmed.client.clone());
                serve::delete_pending(sandbox.state_dir(), &warmed.client).await;
                // The conversation is made ahead too (OpenCode sets up its instance for the workspace then), so
                // the first prompt does not wait for that. Its rules are not: only its turn writes them
                // (`serve::turn::session_rules`).
                if record.native_id.is_none()
                    && let Err(e) =
                        serve::conversation(&bridge, &id, &warmed.client).await.map_err(|e| e.to_string())?
                {
                    tracing::debug!(session = %id, "could not make the conversation ahead: {e}");
                }
                Ok::<(), String>(())
            };
            if let Err(e) = result.await {
                tracing::info!(session = %id, "the OpenCode server was not started ahead of the first prompt: {e}");
            }
        });
    }

    /// What the session's server is started for, when that needs nobody's answer: under `auto` (the sandbox is the
    /// boundary) and for a workspace without OpenCode configuration of its own the workspace's configuration loads;
    /// under `ask` it loads once the user allowed what it is now. Else `Err` with what it is, to ask about.
    fn server_profile(&self, record: &SessionRecord) -> std::result::Result<serve::Profile, Vec<String>> {
        let approvals = agent_options::approvals(&record.config).to_string();
        if approvals != agent_options::APPROVALS_ASK {
            return Ok(serve::Profile { approvals, project_config: true });
        }
        let items = crate::agents::opencode::project::loaders(Path::new(&record.cwd));
        if items.is_empty() {
            return Ok(serve::Profile { approvals, project_config: true });
        }
        match self.project_consent.lock().unwrap_or_else(|p| p.into_inner()).get(&record.id) {
            Some((asked, allowed)) if *asked == items => Ok(serve::Profile { approvals, project_config: *allowed }),
            _ => Err(items),
        }
    }

    /// The rules the user's "always" answers of session `id` made.
    pub(super) fn always_allowed(&self, id: &str) -> Vec<permissions::Rule> {
        self.always_rules.of(id)
    }

    /// Records the user's answer about the workspace's configuration `items`.
    fn consent_to_project(&self, session: &str, items: Vec<String>, allowed: bool) {
        self.project_consent.lock().unwrap_or_else(|p| p.into_inner()).insert(session.to_string(), (items, allowed));
    }

    /// The session's sandbox: reconnected when it exists, created (and persisted) otherwise. A session without a
    /// sandbox gets its workspace's shared one where sessions share ([`Bridge::shared_sandbox_name`]); a session
    /// keeps the sandbox it has (its conversation lives there), shared or its own.
    async fn session_sandbox(&self, record: &SessionRecord) -> Result<Arc<dyn crate::sandbox::Sandbox>> {
        // The background start of a server and the first prompt may both get here: one creates, the other connects.
        let gate = self.gate(&record.id);
        let _one = gate.lock().await;
        let provider = self.provider();
        let workspace = PathBuf::from(&record.cwd);
        let current = self.store.session(&record.id).await?;
        let sandbox_id = current.as_ref().and_then(|r| r.sandbox_id.clone());
        let provider_name = current.as_ref().map(|r| r.sandbox_provider.clone()).unwrap_or_default();
        let spec = |name: String| crate::sandbox::SandboxSpec { session_id: name, workspace: workspace.clone() };
        if let Some(id) = &sandbox_id
            && provider_name == provider.name()
        {
            let name = Path::new(id).file_name().and_then(|n| n.to_str()).filter(|n| is_shared_sandbox(n));
            if let Some(sandbox) = provider.connect(id, &spec(name.unwrap_or(&record.id).to_string())).await? {
                return Ok(sandbox);
            }
            tracing::warn!(session = %record.id, sandbox = %id, "the session's sandbox is gone; creating a new one");
        }
        let spec = match self.shared_sandbox_name(record) {
            Some(shared) => {
                // Two sessions of the workspace may make it at the same time: one creates, the other connects.
                let gate = self.gate(&shared);
                let _shared = gate.lock().await;
                let spec = spec(shared);
                let id = provider.create(&spec).await?;
                tracing::info!(session = %record.id, sandbox = %id, "the session shares its workspace's sandbox");
                self.store.set_sandbox(&record.id, provider.name(), Some(&id)).await?;
                return provider.connect(&id, &spec).await?.ok_or_else(|| {
                    Error::Sandbox(crate::sandbox::SandboxError::Unavailable(format!("the sandbox {id} vanished")))
                });
            }
            None => spec(record.id.clone()),
        };
        let id = provider.create(&spec).await?;
        self.store.set_sandbox(&record.id, provider.name(), Some(&id)).await?;
        provider.connect(&id, &spec).await?.ok_or_else(|| {
            Error::Sandbox(crate::sandbox::SandboxError::Unavailable(format!("the new sandbox {id} vanished")))
        })
    }

    /// The sandbox a new session of `record` shares with the other new sessions of its workspace, where sessions
    /// share one (a local sandbox writing the workspace itself, OpenCode through its server, `--server-scope
    /// workspace`): named after the agent, the workspace and everything of the bridge's settings that shapes a
    /// sandbox, so that a bridge started with another policy gets a sandbox of its own.
    fn shared_sandbox_name(&self, record: &SessionRecord) -> Option<String> {
        let shares = self.serves(record)
            && self.config.server_scope == crate::config::ServerScope::Workspace
            && self.config.workspace == crate::sandbox::WorkspaceMode::Direct
            && self.provider.name() == "local";
        if !shares {
            return None;
        }
        let config = &self.config;
        let policy = format!(
            "{:?} {:?} {:?} {:?} {:?} {} {:?} {:?}",
            config.sandbox,
            std::mem::discriminant(&self.isolation),
            config.profile,
            config.deny_read,
            config.allow_read,
            config.network,
            config.protect,
            config.limits
        );
        let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
        for part in [self.agent_of(record).as_str(), record.cwd.as_str(), policy.as_str()] {
            hash.update(part.as_bytes());
            hash.update(&[0]);
        }
        let digest = hash.finish();
        Some(format!("{SHARED_SANDBOX}{}", digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect::<String>()))
    }

    /// The key of the server a turn of `session` uses in `sandbox` for `profile`: one per shared sandbox and
    /// profile, else the session's own.
    pub(super) fn server_key(&self, session: &str, sandbox: &dyn crate::sandbox::Sandbox, profile: &str) -> String {
        let shared = sandbox.state_dir().file_name().and_then(|n| n.to_str()).filter(|n| is_shared_sandbox(n));
        match shared {
            Some(shared) if self.config.server_scope == crate::config::ServerScope::Workspace => {
                format!("{shared} {profile}")
            }
            _ => session.to_string(),
        }
    }

    /// The version line `<cli> --version` prints, asked once per executable file (in a sandbox of the bridge's own),
    /// and remembered in the data dir for later bridges: a cache hit runs no process.
    async fn cli_version(&self, agent: AgentKind, executable: &Path) -> Option<String> {
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
    async fn version_key(&self, executable: &Path) -> VersionKey {
        let path = executable.to_path_buf();
        let file = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || versions::Key::of(&path)).await.ok().flatten()
        };
        (path, file)
    }

    /// The version of this file if this process or the data dir's cache knows it (`Some(None)`: probed here, with
    /// no answer).
    async fn known_version(&self, key: &VersionKey) -> Option<Option<String>> {
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
    /// and its version line.
    async fn supported_executable(
        &self,
        agent: AgentKind,
        found: &Path,
        cancel: &CancellationToken,
    ) -> Result<(PathBuf, Option<String>)> {
        let version = self.cli_version(agent, found).await;
        let Some(newest) = agent.newest_major() else { return Ok((found.to_path_buf(), version)) };
        match version.as_deref().and_then(major_version) {
            Some(major) if major > newest => {}
            _ => return Ok((found.to_path_buf(), version)),
        }
        let shown = version.unwrap_or_default();
        let (name, package) = (agent.display_name(), agent.package());
        if agent.bin_override(&self.config.agents).is_some() {
            return Err(Error::CliUnavailable(format!(
                "{name} {shown} at {} is a major version acp-sandbox cannot drive yet (it supports {name} {newest}.x). \
                 Point ACP_SANDBOX_{}_BIN (--{}-bin) at a {newest}.x of {name}, or unset it to use the pinned {}",
                found.display(),
                agent.as_str().to_uppercase(),
                agent.as_str(),
                package.version
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

    /// Where updates that belong to no turn go (a changed model list); set by the server once the editor connected.
    pub fn set_notifier(&self, sink: Arc<dyn UpdateSink>) {
        *self.notifier.lock().unwrap_or_else(|p| p.into_inner()) = Some(sink);
    }

    /// Takes the model list from the first warm server (instead of a separate `opencode models` run competing with
    /// the first prompt); when it differs from what sessions were offered, each open session gets the new options.
    fn learn_models(&self, client: serve::client::Client) {
        if self.models_from_server.swap(true, Ordering::SeqCst) {
            return;
        }
        let announce = self.model_announcer();
        tokio::spawn(async move {
            let answer = match client.call(hyper::Method::GET, "/config/providers", None).await {
                Ok(answer) => answer,
                Err(e) => return tracing::warn!("could not ask the OpenCode server for its models: {e}"),
            };
            let models = crate::agents::opencode::catalog::parse_providers(&answer);
            tracing::info!(count = models.len(), "OpenCode models from the server");
            if announce.catalog.set(models) {
                announce.announce().await;
            }
        });
    }

    /// What tells the open sessions about a changed model list, from a task of its own.
    fn model_announcer(&self) -> ModelAnnouncer {
        ModelAnnouncer {
            catalog: self.catalog.clone(),
            store: self.store.clone(),
            config: self.config.clone(),
            notifier: self.notifier.clone(),
            live: self.live.clone(),
        }
    }

    /// A lock of one session's setup (its sandbox, its OpenCode conversation), held only while it is made.
    fn gate(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.entry(id.to_string()).or_default().clone()
    }

    /// Asks the agent's version in the background, so that the first session's server does not wait for it.
    pub fn probe_version(self: &Arc<Self>) {
        let agent = self.config.agent;
        if agent.newest_major().is_none() {
            return;
        }
        let Some(executable) = installed_executable(&self.config, agent) else { return };
        let bridge = self.clone();
        tokio::spawn(async move {
            bridge.cli_version(agent, &executable).await;
        });
    }

    /// Lets go of the session's warm server, in the background: it stops unless other sessions use it.
    fn stop_server(&self, id: &str) {
        let servers = self.servers.clone();
        let id = id.to_string();
        tokio::spawn(async move { servers.release(&id).await });
    }

    fn any_turn_running(&self) -> bool {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.values().any(|session| session.running.lock().unwrap_or_else(|p| p.into_inner()).is_some())
    }

    /// Lists OpenCode's models again in the background (when this bridge runs OpenCode and it is installed). With
    /// the server backend the first warm server says them instead.
    /// When the list changed, each open session gets the new options, as with [`Bridge::learn_models`].
    pub fn refresh_models(&self) {
        if self.config.agent != crate::agents::opencode::AGENT || self.config.agent.serves(&self.config.agents) {
            return;
        }
        let Some(listing) = self.catalog.refresh() else { return };
        let announce = self.model_announcer();
        tokio::spawn(async move {
            if listing.await.unwrap_or(false) {
                announce.announce().await;
            }
        });
    }

    /// The exact variables of the bridge's environment a CLI gets beyond its own namespace: for OpenCode, those
    /// of the providers its config names, its catalog lists and the model in use; `--pass-env` for both.
    fn env_names(&self, agent: AgentKind, model: Option<&str>) -> std::collections::BTreeSet<String> {
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

    /// Whether sessions run in sandboxes on this machine (the local provider), not in a remote provider's.
    fn sessions_run_here(&self) -> bool {
        Arc::ptr_eq(&self.provider, &self.own_provider)
    }

    /// The sandbox provider.
    fn provider(&self) -> &Arc<dyn SandboxProvider> {
        &self.provider
    }

    /// The editor's choice of terminal rendering.
    fn terminal_output(&self) -> bool {
        self.client.terminal_output.load(Ordering::Relaxed)
    }
}

/// Tells every open OpenCode session its options again (`config_option_update`) once the model list changed, so
/// that the editor's model picker shows what OpenCode listed.
struct ModelAnnouncer {
    catalog: Arc<catalog::ModelCatalog>,
    store: Arc<Store>,
    config: Config,
    notifier: Arc<Mutex<Option<Arc<dyn UpdateSink>>>>,
    live: Arc<Mutex<HashMap<String, Arc<LiveSession>>>>,
}

impl ModelAnnouncer {
    /// Sends the options to the sessions open now (some were made while OpenCode listed), through the editor's
    /// connection once it initialized.
    async fn announce(&self) {
        let Some(notifier) = self.notifier.lock().unwrap_or_else(|p| p.into_inner()).clone() else { return };
        let mut open: Vec<String> = self.live.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        open.sort();
        let models = self.catalog.models();
        for id in open {
            if let Ok(Some(record)) = self.store.session(&id).await
                && AgentKind::parse(&record.agent) == Some(self.config.agent)
            {
                let options = options::config_options(self.config.agent, &record.config, &self.config, &models);
                notifier.send(
                    &id,
                    SessionUpdate::ConfigOptionUpdate(agent_client_protocol::v1::schema::ConfigOptionUpdate::new(
                        options,
                    )),
                );
            }
        }
    }
}

/// Runs `<cli> --version` in a sandbox made like a session's, for `doctor`: proof that the sandbox can run the CLI.
/// Answers its version line, or the CLI's (or bubblewrap's) own words when it fails.
pub async fn check_cli(config: &Config, agent: AgentKind) -> std::result::Result<String, String> {
    let executable = installed_executable(config, agent).ok_or_else(|| "not installed yet".to_string())?;
    let isolation = Isolation::resolve(config.sandbox).map_err(|e| e.to_string())?;
    let provider =
        LocalProvider::new(paths::sessions_dir(&config.data_dir), Arc::new(config.local_settings(isolation)));
    let output =
        run_once(config, &provider, "_doctor", agent, &executable, &["--version"], &Default::default()).await?;
    Ok(output.lines().next().unwrap_or("").trim().to_string())
}

/// How long a bridge's own run of a CLI (listing models, `--version`) may take.
const RUN_ONCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The most a bridge's own run of a CLI may print (a model listing is some hundred KiB).
const RUN_ONCE_OUTPUT_LIMIT: u64 = 16 * 1024 * 1024;

/// Runs one short command of a CLI in a sandbox of the bridge's own (`sandbox`, never a session's, with its own
/// workspace in the data dir) and answers its stdout, or its own words when it fails.
async fn run_once(
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
    let spec = crate::sandbox::SandboxSpec { session_id: sandbox.into(), workspace };
    let id = provider.create(&spec).await.map_err(|e| e.to_string())?;
    let sandbox = provider.connect(&id, &spec).await.map_err(|e| e.to_string())?.ok_or("the sandbox vanished")?;
    let env = turn::cli_environment(agent, sandbox.state_dir(), None, env_names);
    let args = args.iter().map(|arg| arg.to_string()).collect();
    let mut process = sandbox
        .exec(cli_spec(config, agent, executable, sandbox.as_ref(), env, args))
        .await
        .map_err(|e| e.to_string())?;
    let stderr = tokio::spawn(turn::stderr_tail(std::mem::replace(&mut process.stderr, Box::pin(tokio::io::empty()))));
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
fn cli_spec(
    config: &Config,
    agent: AgentKind,
    executable: &Path,
    sandbox: &dyn crate::sandbox::Sandbox,
    env: Vec<(String, String)>,
    args: Vec<String>,
) -> crate::sandbox::ExecSpec {
    if sandbox.remote_files().is_some() {
        return remote::cli_spec(agent, executable, sandbox, env, args);
    }
    let real = std::fs::canonicalize(executable).unwrap_or_else(|_| executable.to_path_buf());
    let tools_dir = std::fs::canonicalize(paths::tools_dir(&config.data_dir))
        .unwrap_or_else(|_| paths::tools_dir(&config.data_dir));
    // An npm install needs its whole prefix (the platform binary is a sibling package); anything else its folder.
    let tool = match real.strip_prefix(&tools_dir).ok().and_then(|rel| rel.components().next()) {
        Some(first) => tools_dir.join(first),
        None => real.parent().map(Path::to_path_buf).unwrap_or_else(|| real.clone()),
    };
    let mut endpoints: Vec<(String, u16)> = agent.model_endpoints(&config.agents);
    // A base URL the CLI is given in its environment is a model endpoint too (OPENAI_BASE_URL, AMP_URL).
    for (name, value) in &env {
        if (name.ends_with("_BASE_URL") || name == "AMP_URL")
            && let Some(endpoint) = crate::agents::opencode::providers::endpoint_of(value)
        {
            endpoints.push(endpoint);
        }
    }
    endpoints.sort();
    endpoints.dedup();
    let service_hosts = agent.service_hosts().iter().map(|host| host.to_string()).collect();
    let (user_config, user_data) = (paths::user_config_dir(), paths::user_data_dir());
    let read_only = [
        agent.user_config(&user_config, &user_data, sandbox.state_dir()),
        agent.shipped_config(&real, &user_config, sandbox.state_dir()),
    ]
    .concat();
    crate::sandbox::ExecSpec {
        program: real,
        args,
        env,
        cwd: sandbox.workspace().to_path_buf(),
        stdin: Vec::new(),
        read_only,
        tools: vec![tool],
        net: crate::sandbox::NetAccess { endpoints, service_hosts },
        serve_port: None,
        keep_warm: None,
    }
}

/// How the state dirs of shared sandboxes begin (a session's own is named after the session: `sess_…`).
const SHARED_SANDBOX: &str = "workspace-";

/// Whether a sandbox's name (its state dir's) is a shared one.
fn is_shared_sandbox(name: &str) -> bool {
    name.starts_with(SHARED_SANDBOX)
}

/// The major version in a version line such as `1.18.33` or `opencode 2.0.23`, if it is one.
pub fn major_version(line: &str) -> Option<u64> {
    // A word like `1.18.33` or `v2.0.23`; anything else (a CLI that printed something else) is no version.
    line.split_whitespace().find_map(|word| {
        let word = word.trim_start_matches('v');
        let looks = word.contains('.') && word.chars().all(|c| c.is_ascii_digit() || c == '.' || c == '-');
        looks.then(|| word.split('.').next()?.parse().ok()).flatten()
    })
}

/// Marks a session idle when the turn that made it busy ends.
struct RunningGuard(Arc<LiveSession>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        *self.0.running.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// An agent message that is ours, not the CLI's: notes in italics.
fn note(text: &str) -> SessionUpdate {
    SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from(format!("\n\n{text}\n\n"))))
}

/// A workspace path as stored and compared: `/a/b/` and `/a/./b` are `/a/b`.
fn normalize(path: &Path) -> String {
    path.components().collect::<PathBuf>().display().to_string()
}

fn parse_cursor(cursor: &str) -> Option<(i64, String)> {
    let (time, id) = cursor.split_once(':')?;
    Some((time.parse().ok()?, id.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_paths_are_normalized() {
        assert_eq!(normalize(Path::new("/a/b/")), "/a/b");
        assert_eq!(normalize(Path::new("/a/./b")), "/a/b");
        assert_eq!(parse_cursor("17:sess_x"), Some((17, "sess_x".to_string())));
        assert_eq!(parse_cursor("nonsense"), None);
    }

    #[tokio::test]
    async fn a_run_once_that_prints_more_than_its_limit_fails_instead_of_filling_memory() {
        let data = tempfile::tempdir().unwrap();
        let config = Config::new(crate::agents::opencode::AGENT, data.path().to_path_buf());
        let isolation = Isolation::None("a test".into());
        let mut settings = config.local_settings(isolation);
        // The test binary is no `acp-sandbox sandbox-init`: the command runs in a plain process group.
        settings.init_program = None;
        let provider = LocalProvider::new(paths::sessions_dir(&config.data_dir), Arc::new(settings));
        let head = Path::new("/usr/bin/head");
        let run = |bytes: u64| {
            let count = bytes.to_string();
            let (config, provider) = (&config, &provider);
            async move {
                let args = ["-c", count.as_str(), "/dev/zero"];
                run_once(config, provider, "_test", crate::agents::opencode::AGENT, head, &args, &Default::default())
                    .await
            }
        };
        assert_eq!(run(RUN_ONCE_OUTPUT_LIMIT).await.map(|out| out.len() as u64), Ok(RUN_ONCE_OUTPUT_LIMIT));
        assert_eq!(
            run(RUN_ONCE_OUTPUT_LIMIT + 1).await,
            Err(format!("`opencode -c {} /dev/zero` printed more than 16 MiB", RUN_ONCE_OUTPUT_LIMIT + 1))
        );
    }

    #[tokio::test]
    async fn the_clients_fs_and_terminal_capabilities_are_recorded_as_it_sent_them() {
        let data = tempfile::tempdir().unwrap();
        let config = Config {
            sandbox: crate::sandbox::SandboxChoice::None,
            ..Config::new(crate::agents::opencode::AGENT, data.path().to_path_buf())
        };
        let bridge = Bridge::open(config).await.unwrap();
        assert_eq!(bridge.client_abilities(), ClientAbilities::default());
        let sent = json!({"fs": {"readTextFile": true, "writeTextFile": false}, "terminal": true});
        bridge.set_client_capabilities(&serde_json::from_value(sent).unwrap());
        assert_eq!(
            bridge.client_abilities(),
            ClientAbilities { read_text_file: true, write_text_file: false, terminal: true }
        );
        let sent = json!({"fs": {"writeTextFile": true}});
        bridge.set_client_capabilities(&serde_json::from_value(sent).unwrap());
        assert_eq!(
            bridge.client_abilities(),
            ClientAbilities { read_text_file: false, write_text_file: true, terminal: false }
        );
    }

    #[test]
    fn major_versions_are_read_from_version_lines() {
        assert_eq!(major_version("1.18.33"), Some(1));
        assert_eq!(major_version("opencode 2.0.23"), Some(2));
        assert_eq!(major_version("v10.1"), Some(10));
        assert_eq!(major_version("no digits"), None);
        assert_eq!(major_version(r#"{"type":"step_start","timestamp":1795943138587}"#), None);
        assert_eq!(major_version("1795943138587"), None);
    }
}
