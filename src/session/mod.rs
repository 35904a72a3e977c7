//! Sessions: creating, listing, replaying and deleting them, and running one turn at a time per session.
//!
//! [`Bridge`] is what the ACP server (and the `prompt` command) call. It knows nothing of JSON-RPC: updates
//! go out through an [`UpdateSink`], and failures are [`Error`]s that `server` maps to ACP errors.

mod asks;
mod catalog;
mod cli;
mod emitter;
mod fork;
mod given;
mod host;
mod leftovers;
mod lifecycle;
pub mod options;
pub mod prompt;
mod protected;
mod remote;
mod review;
mod servers;
mod turn;
mod versions;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::{ContentBlock, ContentChunk, SessionUpdate};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::paths;
use crate::sandbox::SandboxProvider;
use crate::sandbox::local::LocalProvider;
use crate::store::{SessionRecord, Store, rfc3339};

pub use self::cli::check_cli;
use self::cli::{cli_spec, run_once};
pub use self::given::Given;

pub use crate::agents::host::UpdateSink;

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
    /// The workspace's other roots the session has.
    pub additional_directories: Vec<String>,
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
    /// `elicitation.form`: the editor fills in forms for the agent.
    pub elicitation_form: bool,
}

/// The state of a session that this process has touched.
#[derive(Default)]
struct LiveSession {
    /// Cancels the running turn, if any.
    running: Mutex<Option<CancellationToken>>,
    /// The prompts that arrived and hold a [`PromptTicket`]: queued, starting or running. A cancel cancels them
    /// all, so one sent right after its prompt is not lost before the turn registers in `running`.
    pending: Mutex<Vec<(u64, CancellationToken)>>,
    /// The MCP servers the editor gave the session here (new, load, resume), secrets included: never stored.
    mcp_servers: Mutex<Vec<agent_client_protocol::v1::schema::McpServer>>,
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
    /// The sandboxes of this machine (`own_provider`), whose settings the review copies and kept-warm servers
    /// are made with.
    local: Arc<LocalProvider>,
    /// The sessions open in this process (made, loaded or resumed here, and not closed).
    live: Arc<Mutex<HashMap<String, Arc<LiveSession>>>>,
    client: ClientInfo,
    /// Cancelled when the bridge shuts down: every running turn ends and kills its CLI.
    shutdown: CancellationToken,
    /// The models OpenCode can use.
    catalog: Arc<catalog::ModelCatalog>,
    /// What the agent keeps running across turns (OpenCode's warm servers), if it does.
    service: Option<Arc<dyn crate::agents::host::Service>>,
    /// What `--version` said, per executable file (see [`versions`]; also kept in the data dir).
    versions: Mutex<HashMap<VersionKey, Option<String>>>,
    version_probe: tokio::sync::Mutex<()>,
    /// Per session: see [`Bridge::gate`].
    gates: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Where updates outside any turn go (the editor's connection, once it initialized).
    notifier: Arc<Mutex<Option<Arc<dyn UpdateSink>>>>,
    /// The last [`PromptTicket`] number given.
    tickets: std::sync::atomic::AtomicU64,
    /// What the bridge keeps about sessions in remote sandboxes.
    remote: remote::RemoteSessions,
    /// The running turns the sandboxes' proxies ask about hosts under `--network ask`.
    network_asks: Arc<asks::NetworkAsks>,
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
        if config.network == crate::sandbox::net::proxy::NetworkMode::Host {
            tracing::warn!("--network host: sandboxes share the host's network, its loopback services included");
        }
        let network_asks = Arc::new(asks::NetworkAsks::new(store.clone()));
        let mut local = LocalProvider::start(paths::sessions_dir(&config.data_dir), config.sandbox, |isolation| {
            config.local_settings(isolation)
        })?;
        if config.network.asks() {
            local = local.asking(network_asks.clone());
        }
        let local = Arc::new(local);
        let own_provider: Arc<dyn SandboxProvider> = local.clone();
        let provider = crate::sandbox::session_provider(
            config.sandbox,
            own_provider.clone(),
            crate::auth::provider_variables(&config),
        )?;
        if config.network.asks() && !provider.private_network() {
            // The choice cannot hold here; said where the user may look (`doctor` says it too).
            tracing::warn!(
                "--network {}: the sandboxes have no network of their own behind the bridge's proxy here, so nothing is asked",
                config.network
            );
        }
        // Made again if the agent's settings are settled otherwise (below).
        let catalog = Arc::new(catalog::ModelCatalog::new(config.clone(), own_provider.clone()));
        let bounds = crate::agents::host::ServiceSettings {
            idle_timeout: config.server_idle_timeout,
            max_running: config.max_servers,
            data_dir: config.data_dir.clone(),
            remote_keeps_running: config.remote_idle == crate::config::RemoteIdle::Keep,
        };
        let mut bridge = Self {
            service: None,
            versions: Mutex::default(),
            version_probe: tokio::sync::Mutex::const_new(()),
            gates: Mutex::default(),
            notifier: Arc::default(),
            tickets: std::sync::atomic::AtomicU64::new(0),
            remote: remote::RemoteSessions::default(),
            network_asks,
            catalog,
            config,
            store,
            provider,
            own_provider,
            local,
            live: Arc::default(),
            client: ClientInfo::default(),
            shutdown: CancellationToken::new(),
        };
        if bridge.settle_newer_major().await {
            bridge.catalog = Arc::new(catalog::ModelCatalog::new(bridge.config.clone(), bridge.own_provider.clone()));
        }
        bridge.service = bridge.config.agent.service(&bridge.config.agents, &bounds);
        Ok(bridge)
    }

    /// The settings this bridge runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The store, for the `sessions` command.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// How CLIs are sandboxed, in words.
    pub fn describe_sandbox(&self) -> String {
        self.provider.describe()
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
            elicitation_form: offered.elicitation.as_ref().is_some_and(|elicitation| elicitation.form.is_some()),
        };
        tracing::info!(
            read_text_file = abilities.read_text_file,
            write_text_file = abilities.write_text_file,
            terminal = abilities.terminal,
            elicitation_form = abilities.elicitation_form,
            "the client's capabilities"
        );
        *self.client.abilities.lock().unwrap_or_else(|p| p.into_inner()) = abilities;
    }

    /// The copy on this machine that mirrors a remote sandbox's workspace (`<sessions>/<id>/review`): what the
    /// local sandbox would hide is never in it, and the git dir and protected paths are not reviewed.
    pub(super) fn mirror_copy(&self, record: &SessionRecord) -> crate::workspace::review::WorkspaceCopy {
        self.local
            .settings()
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

    /// The MCP servers the editor gave the session in this process (none for a session it did not open here).
    pub(crate) fn mcp_servers(&self, id: &str) -> Vec<agent_client_protocol::v1::schema::McpServer> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        match live.get(id) {
            Some(session) => session.mcp_servers.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            None => Vec::new(),
        }
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
            if let Some(service) = &self.service {
                service.close(self.config.keep_warm.is_some()).await
            }
        };
        let ended = tokio::time::timeout(SHUTDOWN_GRACE, futures::future::join(turns, servers)).await;
        if ended.is_err() {
            tracing::warn!("turns were still ending at exit; their processes are killed with the bridge");
        }
    }

    /// A lock of one session's setup (its sandbox, its OpenCode conversation), held only while it is made.
    fn gate(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.entry(id.to_string()).or_default().clone()
    }

    fn any_turn_running(&self) -> bool {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.values().any(|session| session.running.lock().unwrap_or_else(|p| p.into_inner()).is_some())
    }

    /// Whether sessions run in sandboxes on this machine (the local provider), not in a remote provider's.
    fn sessions_run_here(&self) -> bool {
        self.provider.runs_here()
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

/// Whether a message chunk is one of the bridge's own notes ([`note`]: an italic paragraph of its own), which is
/// not the agent's answer.
fn is_note(text: &str) -> bool {
    text.len() > 6 && text.starts_with("\n\n_") && text.ends_with("_\n\n")
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
    use serde_json::json;

    use super::cli::RUN_ONCE_OUTPUT_LIMIT;
    use super::*;
    use crate::agents::major_version;
    use crate::sandbox::local::Isolation;

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
        let config = Config::new(crate::agents::AgentKind::parse("opencode").unwrap(), data.path().to_path_buf());
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
                run_once(
                    config,
                    provider,
                    "_test",
                    crate::agents::AgentKind::parse("opencode").unwrap(),
                    head,
                    &args,
                    &Default::default(),
                )
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
    async fn deleting_a_session_turns_its_waiting_forks_into_transcript_forks() {
        let data = tempfile::tempdir().unwrap();
        let config = Config {
            sandbox: crate::sandbox::SandboxChoice::None,
            ..Config::new(crate::agents::AgentKind::parse("opencode").unwrap(), data.path().to_path_buf())
        };
        let bridge = Bridge::open(config).await.unwrap();
        let record = |id: &str, native: Option<&str>, forked: Option<(&str, &str)>| crate::store::SessionRecord {
            id: id.into(),
            agent: "opencode".into(),
            cwd: "/w/project".into(),
            sandbox_provider: "local".into(),
            sandbox_id: None,
            native_id: native.map(String::from),
            title: None,
            config: json!({}),
            context: crate::store::SessionContext {
                forked_from: forked.map(|(session, native)| crate::store::ForkedFrom {
                    session: session.into(),
                    native: Some(native.into()),
                }),
                ..Default::default()
            },
            created_at: 0,
            updated_at: 0,
        };
        for session in [
            record("orig", Some("ses_1"), None),
            record("waiting", None, Some(("orig", "ses_1"))),
            record("started", Some("ses_2"), Some(("orig", "ses_1"))),
            record("other", None, Some(("elsewhere", "ses_9"))),
        ] {
            bridge.store.create_session(&session).await.unwrap();
        }
        bridge.delete_session("orig").await.unwrap();
        let mut natives = Vec::new();
        for id in ["waiting", "started", "other"] {
            let record = bridge.store.session(id).await.unwrap().unwrap();
            natives.push(record.context.forked_from.and_then(|forked| forked.native));
        }
        // A waiting fork would fork a deleted conversation; one with its own, or of another session, is left alone.
        assert_eq!(natives, [None, Some("ses_1".to_string()), Some("ses_9".to_string())]);
    }

    #[tokio::test]
    async fn sessions_with_other_roots_or_under_network_ask_never_share_a_sandbox() {
        let data = tempfile::tempdir().unwrap();
        let config = Config {
            sandbox: crate::sandbox::SandboxChoice::None,
            ..Config::new(crate::agents::AgentKind::parse("opencode").unwrap(), data.path().to_path_buf())
        };
        let bridge = Bridge::open(config).await.unwrap();
        let record = |roots: &[&str]| crate::store::SessionRecord {
            id: "sess_x".into(),
            agent: "opencode".into(),
            cwd: "/w/project".into(),
            sandbox_provider: "local".into(),
            sandbox_id: None,
            native_id: None,
            title: None,
            config: json!({}),
            context: crate::store::SessionContext {
                additional_directories: roots.iter().map(|root| root.to_string()).collect(),
                ..Default::default()
            },
            created_at: 0,
            updated_at: 0,
        };
        let name = |roots: &[&str]| bridge.shared_sandbox_name(&record(roots)).expect("sessions share here");
        assert_eq!(name(&[]), name(&[]));
        assert_eq!(name(&["/w/lib"]), name(&["/w/lib"]));
        assert_ne!(name(&[]), name(&["/w/lib"]));
        assert_ne!(name(&["/w/lib"]), name(&["/w/other"]));
        assert_ne!(name(&["/w/a", "/w/b"]), name(&["/w/ab"]));
        // Under `--network ask` nothing is shared: a shared server's connection could be any of its threads'.
        let data = tempfile::tempdir().unwrap();
        let config = Config {
            sandbox: crate::sandbox::SandboxChoice::None,
            network: crate::sandbox::net::proxy::NetworkMode::Ask(Vec::new()),
            ..Config::new(crate::agents::AgentKind::parse("opencode").unwrap(), data.path().to_path_buf())
        };
        let asking = Bridge::open(config).await.unwrap();
        assert_eq!(asking.shared_sandbox_name(&record(&[])), None);
    }

    #[tokio::test]
    async fn the_clients_fs_and_terminal_capabilities_are_recorded_as_it_sent_them() {
        let data = tempfile::tempdir().unwrap();
        let config = Config {
            sandbox: crate::sandbox::SandboxChoice::None,
            ..Config::new(crate::agents::AgentKind::parse("opencode").unwrap(), data.path().to_path_buf())
        };
        let bridge = Bridge::open(config).await.unwrap();
        assert_eq!(bridge.client_abilities(), ClientAbilities::default());
        let sent = json!({"fs": {"readTextFile": true, "writeTextFile": false}, "terminal": true});
        bridge.set_client_capabilities(&serde_json::from_value(sent).unwrap());
        assert_eq!(
            bridge.client_abilities(),
            ClientAbilities { read_text_file: true, write_text_file: false, terminal: true, elicitation_form: false }
        );
        let sent = json!({"fs": {"writeTextFile": true}, "elicitation": {"form": {}}});
        bridge.set_client_capabilities(&serde_json::from_value(sent).unwrap());
        assert_eq!(
            bridge.client_abilities(),
            ClientAbilities { read_text_file: false, write_text_file: true, terminal: false, elicitation_form: true }
        );
        // A client that offers only URL elicitation fills in no forms.
        let sent = json!({"elicitation": {"url": {}}});
        bridge.set_client_capabilities(&serde_json::from_value(sent).unwrap());
        assert!(!bridge.client_abilities().elicitation_form);
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
