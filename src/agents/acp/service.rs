//! The ACP agents of a bridge as its [`Service`]: one agent process per session, started in the session's sandbox
//! ahead of its first prompt (or by it), its conversation made or loaded there, stopped after the idle timeout or
//! when the session lets go, and at most `--max-servers` running (starting ones count; a turn waits for room).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    ConfigOptionUpdate, ContentBlock, LoadSessionRequest, NewSessionRequest, PromptRequest, ResumeSessionRequest,
    SessionConfigOption, SessionConfigOptionValue, SessionUpdate, SetSessionConfigOptionRequest, SetSessionModeRequest,
    StopReason, SystemPrompt, SystemPromptMode, TextContent,
};
use tokio::time::Instant;

use super::connection::{Connection, ConnectionError};
use super::engine::AcpEngine;
use super::offers::Offers;
use super::options::{MODE, MODEL, Selectors, Via, choices, choose, keep_defaults, refused, seeded, take_refused};
use super::translate::AcpTranslator;
use super::wire;
use crate::agents::engine::Attempt;
use crate::agents::host::{
    BridgeHost, Release, RenderedPrompt, Service, ServiceSettings, TurnHost, UpdateSink, unless_cancelled,
};
use crate::error::{Error, Result};
use crate::sandbox::Sandbox;
use crate::store::SessionRecord;

/// How long an agent that is stopped (idle, let go, or the bridge exits) has to exit on its own once its input
/// ended, before it is killed: short, as the bridge's exit waits for it.
const STOP_GRACE: Duration = Duration::from_millis(400);

/// How long the connection to a started agent has to come up (its `initialize` is waited for while it progresses).
const INITIALIZE_LIMIT: Duration = Duration::from_secs(10);

/// How many of the newest sessions of the agent a new one looks through for the options it starts with.
const SEED_FROM: usize = 20;

/// How long it has to make or load a session.
const SESSION_LIMIT: Duration = Duration::from_secs(60);

/// How long a turn waits for room under `--max-servers` (every agent in a turn or starting) before it fails.
const ROOM_WAIT: Duration = Duration::from_secs(120);

/// A start under way, which every waiter shares.
/// Its failure is why, and the end of the agent's stderr.
type Starting = futures::future::Shared<
    futures::future::BoxFuture<'static, std::result::Result<Arc<Connection>, (String, String)>>,
>;

/// One session's agent.
struct Entry {
    connection: Arc<Connection>,
    last_used: Instant,
    /// A turn runs through it now.
    in_turn: bool,
}

/// What the bridge keeps of its ACP agents.
pub struct AcpService {
    name: &'static str,
    /// The agent's arguments after its executable.
    args: Vec<String>,
    idle_timeout: Duration,
    max_running: usize,
    /// `--remote-idle keep`: an agent in a remote sandbox stays across turns like a local one.
    remote_keeps_running: bool,
    running: Arc<Mutex<HashMap<String, Entry>>>,
    /// The starts under way, by session: they count against the cap, and a turn waits for the one its session's
    /// opening began instead of starting another.
    starting: Mutex<HashMap<String, Starting>>,
    /// One cap check at a time, so that it is counted right.
    start_lock: tokio::sync::Mutex<()>,
    /// Told when room may have been made: a turn ended, a start ended, an agent stopped.
    room: Arc<tokio::sync::Notify>,
    reaper: std::sync::Once,
    /// What the version the project installs announces of itself, until the agent announced its own.
    builtin: Option<Offers>,
    /// Run in the sandbox before a new process loads the agent's own session (see [`AcpService::before_load`]).
    before_load: Option<&'static str>,
}

impl AcpService {
    /// No agent running yet.
    pub fn new(name: &'static str, args: Vec<String>, bounds: &ServiceSettings, builtin: Option<Offers>) -> Self {
        Self {
            name,
            args,
            builtin,
            idle_timeout: bounds.idle_timeout,
            max_running: bounds.max_running.max(1),
            remote_keeps_running: bounds.remote_keeps_running,
            running: Arc::default(),
            starting: Mutex::default(),
            start_lock: tokio::sync::Mutex::new(()),
            room: Arc::default(),
            reaper: std::sync::Once::new(),
            before_load: None,
        }
    }

    /// Runs `script` (`sh`, the agent's session id as `$1`) in the session's sandbox before a new process of the
    /// agent starts for a session of its own to load: what works around the agent's own way of keeping sessions.
    pub fn before_load(mut self, script: &'static str) -> Self {
        self.before_load = Some(script);
        self
    }

    /// Which agent `executable` runs with this service's arguments: a later session takes the options it announced
    /// only from a session of the same one.
    fn identity(&self, executable: &Path) -> String {
        std::iter::once(executable.display().to_string()).chain(self.args.iter().cloned()).collect::<Vec<_>>().join(" ")
    }

    /// What the agent `executable` runs announced of itself last (kept in the store), else the built-in table's.
    async fn offers(&self, host: &dyn BridgeHost, executable: &Path) -> Option<Offers> {
        let identity = self.identity(executable);
        match host.store().agent_offers(&identity).await {
            Ok(Some((_, kept))) => Offers::parse(kept).or_else(|| self.builtin.clone()),
            Ok(None) => self.builtin.clone(),
            Err(e) => {
                tracing::warn!("could not read what the ACP agent announced before: {e}");
                self.builtin.clone()
            }
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops agents idle for longer than the idle timeout, from now on.
    fn start_reaper(&self) {
        self.reaper.call_once(|| {
            let (running, idle) = (Arc::downgrade(&self.running), self.idle_timeout);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval((idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(30)));
                loop {
                    tick.tick().await;
                    let Some(running) = running.upgrade() else { return };
                    let idle: Vec<Arc<Connection>> = {
                        let mut running = running.lock().unwrap_or_else(|p| p.into_inner());
                        let gone: Vec<String> = running
                            .iter()
                            .filter(|(_, entry)| {
                                !entry.connection.alive() || (!entry.in_turn && entry.last_used.elapsed() > idle)
                            })
                            .map(|(id, _)| id.clone())
                            .collect();
                        gone.iter().filter_map(|id| running.remove(id)).map(|entry| entry.connection).collect()
                    };
                    for connection in idle {
                        tracing::info!("stopping an idle ACP agent");
                        connection.end(STOP_GRACE).await;
                    }
                }
            });
        });
    }

    /// The session's running agent, started when none runs. For a turn (`turn`) the agent is marked as in a turn
    /// before it is answered (so that no other start evicts it meanwhile; [`InTurn`] clears it), and when
    /// `--max-servers` agents are all in turns or starting, the turn waits for room (saying so in the thread) up to
    /// [`ROOM_WAIT`]; a start ahead of the first prompt never waits, nor evicts an agent in a turn.
    #[allow(clippy::too_many_arguments)]
    async fn connection(
        &self,
        bridge: &dyn BridgeHost,
        record: &SessionRecord,
        sandbox: &Arc<dyn Sandbox>,
        executable: &Path,
        credential: Option<&(&'static str, String)>,
        model: Option<&str>,
        turn: Option<&dyn TurnHost>,
    ) -> Result<Arc<Connection>> {
        let for_turn = turn.is_some();
        if sandbox.woke()
            && let Some(connection) = self.live(&record.id, false)
            && !Arc::ptr_eq(&connection.sandbox, sandbox)
        {
            tracing::info!(session = %record.id, "the sandbox slept since its ACP agent started, which cut the agent's streams: starting it again");
            self.release(&record.id).await;
        }
        if let Some(connection) = self.live(&record.id, for_turn) {
            return Ok(connection);
        }
        let deadline = Instant::now() + ROOM_WAIT;
        let mut said = false;
        let start = loop {
            // Asked for before the cap is looked at, so that room made meanwhile is not missed.
            let room = self.room.clone();
            let notified = room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = {
                let _one = self.start_lock.lock().await;
                if let Some(connection) = self.live(&record.id, for_turn) {
                    return Ok(connection);
                }
                let under_way = self.starting.lock().unwrap_or_else(|p| p.into_inner()).get(&record.id).cloned();
                match under_way {
                    Some(start) => Some((start, None)),
                    None => self.make_room().map(|evicted| {
                        let start = self.start(bridge, record, sandbox, executable, credential, model);
                        self.starting
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(record.id.clone(), start.clone());
                        (start, evicted)
                    }),
                }
            };
            match next {
                Some((start, evicted)) => {
                    if let Some(connection) = evicted {
                        tracing::info!(
                            "stopping the ACP agent unused longest: --max-servers {} reached",
                            self.max_running
                        );
                        connection.end(STOP_GRACE).await;
                    }
                    break start;
                }
                None => {
                    let full =
                        format!("all {} agents that --max-servers allows are in a turn or starting", self.max_running);
                    let Some(turn) = turn else { return Err(Error::CliUnavailable(full)) };
                    if Instant::now() >= deadline {
                        return Err(Error::CliUnavailable(format!(
                            "{full}, and none finished within {} s: wait for one to finish, or raise --max-servers",
                            ROOM_WAIT.as_secs()
                        )));
                    }
                    if !said {
                        said = true;
                        tracing::info!(session = %record.id, "{full}: the turn waits for one");
                        turn.note(&format!("_{full}: this prompt starts when one of them is done._")).await?;
                    }
                    let _ = tokio::time::timeout_at(deadline, notified).await;
                }
            }
        };
        let slow = format!("_{} is still starting; it is waited for while it makes progress._", self.name);
        let started = crate::agents::host::said_when_slow(start, turn, &slow).await?;
        self.starting.lock().unwrap_or_else(|p| p.into_inner()).remove(&record.id);
        self.room.notify_waiters();
        let connection = started.map_err(|(why, stderr_tail)| Error::CliFailed {
            message: format!("{} could not be started: {why}", self.name),
            stderr_tail,
            exit_code: None,
        })?;
        let mut running = self.running();
        let entry = running.entry(record.id.clone()).or_insert_with(|| Entry {
            connection: connection.clone(),
            last_used: Instant::now(),
            in_turn: false,
        });
        entry.in_turn |= for_turn;
        drop(running);
        self.start_reaper();
        Ok(connection)
    }

    /// The session's agent when it runs and can be used (marked as in a turn with `claim`); a dead one is
    /// forgotten.
    fn live(&self, session: &str, claim: bool) -> Option<Arc<Connection>> {
        let mut running = self.running();
        match running.get_mut(session) {
            Some(entry) if entry.connection.alive() => {
                entry.in_turn |= claim;
                Some(entry.connection.clone())
            }
            Some(_) => {
                running.remove(session);
                None
            }
            None => None,
        }
    }

    /// Room for one more agent under `--max-servers`: `Some` with the agent unused longest, to be stopped, when the
    /// cap is reached; `None` when every agent is in a turn or starting.
    fn make_room(&self) -> Option<Option<Arc<Connection>>> {
        let mut running = self.running();
        running.retain(|_, entry| entry.connection.alive());
        let starting = self.starting.lock().unwrap_or_else(|p| p.into_inner()).len();
        if running.len() + starting < self.max_running {
            return Some(None);
        }
        let oldest = running
            .iter()
            .filter(|(_, entry)| !entry.in_turn)
            .min_by_key(|(_, entry)| entry.last_used)
            .map(|(id, _)| id.clone())?;
        Some(running.remove(&oldest).map(|entry| entry.connection))
    }

    /// Marks the session's agent as out of its turn when dropped, whatever way the turn ends.
    fn in_turn(&self, session: &str) -> InTurn {
        InTurn { running: self.running.clone(), room: self.room.clone(), session: session.to_string() }
    }

    /// Starts the session's agent: a future every waiter shares.
    fn start(
        &self,
        bridge: &dyn BridgeHost,
        record: &SessionRecord,
        sandbox: &Arc<dyn Sandbox>,
        executable: &Path,
        credential: Option<&(&'static str, String)>,
        model: Option<&str>,
    ) -> Starting {
        use futures::FutureExt;
        // A start ahead of the first prompt (at the session's opening) has no turn to bring the key: the bridge's.
        let kept = credential.is_none().then(|| bridge.credential()).flatten();
        let env = bridge.cli_environment(sandbox.as_ref(), credential.or(kept.as_ref()), model);
        let mut spec = bridge.cli_spec(executable, sandbox.as_ref(), env, self.args.clone());
        spec.net.endpoints.extend(crate::agents::mcp::endpoints(&bridge.mcp_servers(&record.id)));
        let mut roots = vec![sandbox.workspace().to_path_buf()];
        roots.extend(record.context.additional_directories.iter().map(PathBuf::from));
        tracing::info!(session = %record.id, program = %spec.program.display(), "starting the ACP agent");
        let (sandbox, session, forms) = (sandbox.clone(), record.id.clone(), bridge.client_fills_forms());
        let identity = self.identity(executable);
        let outside = bridge.notifier().map(|sink| {
            let titles: Arc<dyn UpdateSink> = Arc::new(KeepsTitles { sink, store: bridge.store().clone() });
            (record.id.clone(), titles)
        });
        let before_load = self.before_load.zip(record.native_id.clone());
        // A task of its own: a turn cancelled while it waits does not stop the start its session's next turn uses.
        let task = tokio::spawn(async move {
            if let Some((script, native)) = before_load {
                prepare_load(sandbox.as_ref(), &spec, script, &native).await;
            }
            let connection = Connection::start(sandbox, identity, spec, roots, INITIALIZE_LIMIT, forms, outside)
                .await
                .map_err(|e| match e {
                    ConnectionError::NotStarted { why, stderr } => (why, stderr),
                    other => (other.to_string(), String::new()),
                })?;
            let info = connection.info.as_ref().map(|info| format!("{} {}", info.name, info.version));
            tracing::info!(session = %session, agent = ?info, load = connection.capabilities.load_session, "the ACP agent started");
            Ok(connection)
        });
        async move { task.await.unwrap_or_else(|e| Err((e.to_string(), String::new()))) }.boxed().shared()
    }
}

/// What the agent says between turns, on to the editor; a name it gives the session (Codex names its thread once a
/// turn has ended) kept first, so that the session list says it by the time the editor hears it.
struct KeepsTitles {
    sink: Arc<dyn UpdateSink>,
    store: Arc<crate::store::Store>,
}

impl UpdateSink for KeepsTitles {
    fn send(&self, session_id: &str, update: SessionUpdate) {
        let title = match &update {
            SessionUpdate::SessionInfoUpdate(info) => match &info.title {
                agent_client_protocol::schema::MaybeUndefined::Value(title) if !title.trim().is_empty() => {
                    title.clone()
                }
                _ => return self.sink.send(session_id, update),
            },
            _ => return self.sink.send(session_id, update),
        };
        let (sink, store, session) = (self.sink.clone(), self.store.clone(), session_id.to_string());
        tokio::spawn(async move {
            if let Err(e) = store.set_title(&session, &title).await {
                tracing::warn!(session, "could not keep the ACP agent's name of the session: {e}");
            }
            sink.send(&session, update);
        });
    }
}

/// Runs `script` with `native` as `$1` in `sandbox`, as the agent `spec` starts would run (its HOME, workspace and
/// tools); a failure is logged, and the load says the rest.
async fn prepare_load(sandbox: &dyn Sandbox, spec: &crate::sandbox::ExecSpec, script: &str, native: &str) {
    let env = spec.env.iter().filter(|(name, _)| name == "PATH" || name == "HOME").cloned().collect();
    let prepare = crate::sandbox::ExecSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), script.into(), "sh".into(), native.into()],
        env,
        cwd: spec.cwd.clone(),
        read_only: spec.read_only.clone(),
        tools: spec.tools.clone(),
        ..crate::sandbox::ExecSpec::default()
    };
    let ran = match sandbox.exec(prepare).await {
        Ok(mut process) => process.handle.wait().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match ran {
        Ok(exit) if exit.success() => {}
        Ok(exit) => tracing::warn!(native, "preparing the ACP agent's load failed with {}", exit.describe()),
        Err(e) => tracing::warn!(native, "could not prepare the ACP agent's load: {e}"),
    }
}

/// A turn of a session's agent: when it ends the agent is no longer in a turn, and another start may take its room.
struct InTurn {
    running: Arc<Mutex<HashMap<String, Entry>>>,
    room: Arc<tokio::sync::Notify>,
    session: String,
}

impl Drop for InTurn {
    fn drop(&mut self) {
        if let Some(entry) = self.running.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&self.session) {
            entry.in_turn = false;
            entry.last_used = Instant::now();
        }
        self.room.notify_waiters();
    }
}

/// Why the session's conversation could not be had in the agent.
enum Conversation {
    /// It is there (made or loaded): its id.
    Here(String),
    /// The one the store names is not (the agent cannot load it, or does not know it).
    Missing,
    /// The agent could not load or resume it, for a reason of its own (its words).
    Unloadable(String),
}

/// The session's conversation in `connection`: the one this process already has, the store's loaded, or a new one.
async fn conversation(
    connection: &Connection,
    bridge: &dyn BridgeHost,
    record: &SessionRecord,
    sandbox: &dyn Sandbox,
    native_id: Option<&str>,
    name: &str,
) -> Result<Conversation> {
    let mut held = connection.session.lock().await;
    if let Some(session) = held.clone() {
        return Ok(Conversation::Here(session));
    }
    let cwd = sandbox.workspace().to_path_buf();
    let mcp_servers = bridge.mcp_servers(&record.id);
    let capabilities = &connection.capabilities;
    let roots: Vec<PathBuf> = if capabilities.session_capabilities.additional_directories.is_some() {
        record.context.additional_directories.iter().map(PathBuf::from).collect()
    } else {
        Vec::new()
    };
    let offered = capabilities.session_capabilities.system_prompt.as_ref();
    let replaces = record.context.system_prompt_replaces && record.context.system_prompt.is_some();
    if replaces && offered.and_then(|p| p.mode.as_ref()).and_then(|m| m.override_.as_ref()).is_none() {
        // What the editor chose holds, or the session is not made: the agent's own prompt would stay.
        return Err(Error::InvalidParams(format!(
            "{name} does not take a system prompt that replaces its own (systemPrompt mode override)"
        )));
    }
    let system_prompt = record.context.system_prompt.as_ref().filter(|_| offered.is_some()).map(|text| {
        let prompt = SystemPrompt::new(vec![ContentBlock::Text(TextContent::new(text.clone()))]);
        if replaces { prompt.mode(SystemPromptMode::Override) } else { prompt }
    });
    let failed = |what: &str, e: agent_client_protocol::Error| {
        if e.code == agent_client_protocol::ErrorCode::AUTH_REQUIRED {
            return Error::AuthRejected(needs_login(name, what, &e.message, &connection.auth_methods));
        }
        Error::CliFailed {
            message: format!("{name} could not {what}: {}", e.message),
            stderr_tail: connection.stderr_tail(),
            exit_code: None,
        }
    };
    let made = if let Some(native) = native_id {
        // Its own `session/load` (which replays what this bridge already has: not forwarded), else `session/resume`
        // (which does not replay), else a fresh one from the transcript.
        let answer = if capabilities.load_session {
            let request = LoadSessionRequest::new(native.to_string(), cwd)
                .mcp_servers(mcp_servers)
                .additional_directories(roots)
                .system_prompt(system_prompt);
            within(connection, connection.cx.send_request(wire::Load(request)).block_task()).await
        } else if capabilities.session_capabilities.resume.is_some() {
            let request = ResumeSessionRequest::new(native.to_string(), cwd)
                .mcp_servers(mcp_servers)
                .additional_directories(roots)
                .system_prompt(system_prompt);
            within(connection, connection.cx.send_request(wire::Resume(request)).block_task()).await
        } else {
            tracing::info!(session = %record.id, "the ACP agent can neither load nor resume: a fresh one from the transcript");
            return Ok(Conversation::Missing);
        };
        match answer {
            Some(Ok(opened)) => {
                connection.set_selectors(opened.selectors());
                settled(connection, record).await;
                native.to_string()
            }
            Some(Err(e)) => {
                tracing::warn!(session = %record.id, native, data = ?e.data, "the ACP agent could not continue its session: {}", e.message);
                // Gone when it says so (ACP's "resource not found"); anything else is said as it is.
                if e.code == agent_client_protocol::ErrorCode::RESOURCE_NOT_FOUND {
                    return Ok(Conversation::Missing);
                }
                return Ok(Conversation::Unloadable(super::engine::said(&e)));
            }
            None => return Err(timed_out(connection, name, "continue its session").await),
        }
    } else {
        let request = NewSessionRequest::new(cwd)
            .mcp_servers(mcp_servers)
            .additional_directories(roots)
            .system_prompt(system_prompt);
        match within(connection, connection.cx.send_request(wire::New(request)).block_task()).await {
            Some(Ok(opened)) => {
                let Some(made) = opened.session_id.clone().filter(|id| !id.is_empty()) else {
                    return Err(failed(
                        "make a session",
                        agent_client_protocol::Error::new(
                            agent_client_protocol::ErrorCode::INVALID_PARAMS,
                            "its answer to session/new has no sessionId".to_string(),
                        ),
                    ));
                };
                let selectors = opened.selectors();
                connection.set_selectors(selectors.clone());
                edit_config(bridge, &record.id, |config| keep_defaults(config, &connection.identity, &selectors)).await;
                // What the next bridge offers before it starts this agent.
                let offers = Offers::of(capabilities, &selectors).to_value();
                let version = connection.info.as_ref().map(|info| info.version.clone()).unwrap_or_default();
                if let Err(e) = bridge.store().keep_agent_offers(&connection.identity, &version, &offers).await {
                    tracing::warn!(session = %record.id, "could not keep what the ACP agent announced: {e}");
                }
                made
            }
            Some(Err(e)) => return Err(failed("make a session", e)),
            None => return Err(timed_out(connection, name, "make a session").await),
        }
    };
    *held = Some(made.clone());
    // What the editor is told, once: the agent's settings with the user's choices given.
    give_choices(connection, bridge, &record.id, &made, name).await;
    keep(bridge, &record.id, &connection.selectors(), true).await;
    Ok(Conversation::Here(made))
}

/// What the agent gets of a prompt: its text as the bridge rendered it (text, links, embedded context), then the
/// editor's images and audio as they are where `takes` says the agent takes them; with what was left out, for the
/// thread's note.
fn prompt_blocks(
    text: &str,
    editor: &[ContentBlock],
    takes: &agent_client_protocol::v1::schema::PromptCapabilities,
) -> (Vec<ContentBlock>, Vec<String>) {
    let mut blocks = Vec::new();
    let mut left_out = Vec::new();
    for block in editor {
        match block {
            ContentBlock::Image(_) if takes.image => blocks.push(block.clone()),
            ContentBlock::Image(image) => left_out.push(format!("an image ({})", image.mime_type)),
            ContentBlock::Audio(_) if takes.audio => blocks.push(block.clone()),
            ContentBlock::Audio(audio) => left_out.push(format!("audio ({})", audio.mime_type)),
            _ => {}
        }
    }
    // A prompt of an image alone has no text to send.
    if !text.is_empty() || blocks.is_empty() {
        blocks.insert(0, ContentBlock::Text(TextContent::new(text.to_string())));
    }
    (blocks, left_out)
}

/// How long the agent has to answer the bridge's [`wire::Sync`] after a load: what it replays meanwhile is dropped.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// Waits until what the agent sent on its own after it answered the load of its session has been read: its replay,
/// which belongs to no turn (the editor's replay is the store's). No turn is routed yet, so all of it is dropped
/// here; without the wait, the rest of the replay would reach the next turn as part of its answer.
async fn settled(connection: &Connection, record: &SessionRecord) {
    let synced = tokio::select! {
        answer = tokio::time::timeout(SETTLE_LIMIT, connection.cx.send_request(wire::Sync {}).block_task()) => answer.is_ok(),
        _ = connection.closed.cancelled() => true,
    };
    if !synced {
        tracing::warn!(session = %record.id, "the ACP agent did not answer within {} s after its load: what it replays later may reach the turn", SETTLE_LIMIT.as_secs());
    }
}

/// The words of an agent's refusal to `what` until it is logged in (`said`), with the ways it named at its start.
fn needs_login(name: &str, what: &str, said: &str, methods: &[String]) -> String {
    let offered = if methods.is_empty() { String::new() } else { format!(" (it offers: {})", methods.join(", ")) };
    format!(
        "{name} could not {what} without a login: {said}{offered}. It runs in the sandbox, whose HOME is the \
         session's own, with only the variables acp-sandbox passes it: give it its key as a variable (for --agent \
         custom, named by --pass-env and set in the agent server's \"env\")"
    )
}

/// Gives a new process of the agent the choices the user made in the session where it says otherwise: it starts at
/// its defaults, or at what its own session kept. A choice it no longer offers or refuses is forgotten.
async fn give_choices(connection: &Connection, bridge: &dyn BridgeHost, session: &str, native: &str, name: &str) {
    let Ok(Some(record)) = bridge.store().session(session).await else { return };
    for (option, value) in choices(&record.config) {
        let now = connection.selectors();
        if now.value(&option).as_deref() == Some(value.as_str()) {
            continue;
        }
        let given = match now.check(name, &option, &value) {
            Ok(()) => send_choice(connection, native, &now, &option, &value).await,
            Err(why) => Err(Refusal::Refused(why)),
        };
        match given {
            Ok(after) => connection.set_selectors(after),
            // Gone, it keeps the choice for its next process.
            Err(Refusal::Gone) => return,
            Err(Refusal::Refused(why)) => {
                tracing::warn!(session, option, value, "the ACP agent did not take the session's choice: {why}");
                let said = format!("{name} did not take {value:?} for its option {option:?}: {why}");
                edit_config(bridge, session, |config| {
                    choose(config, &option, None);
                    refused(config, &said);
                })
                .await;
            }
        }
    }
}

/// Why the agent did not take a choice.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// It answered an error.
    #[error("{0}")]
    Refused(String),
    /// It did not answer in time, or ended.
    #[error("it did not answer")]
    Gone,
}

/// Gives the agent's session `native` the choice of `value` for the option `option`, the way it takes it; what it
/// says of its settings afterwards.
async fn send_choice(
    connection: &Connection,
    native: &str,
    selectors: &Selectors,
    option: &str,
    value: &str,
) -> std::result::Result<Selectors, Refusal> {
    let mut after = selectors.clone();
    let answered = match selectors.via(option) {
        Some(Via::Option(own)) => {
            let value = if selectors.is_boolean(option) {
                SessionConfigOptionValue::boolean(value == "true")
            } else {
                SessionConfigOptionValue::value_id(value.to_string())
            };
            let request = SetSessionConfigOptionRequest::new(native.to_string(), own, value);
            within(connection, connection.cx.send_request(request).block_task())
                .await
                .map(|answer| answer.map(|answer| after.options = Some(answer.config_options)))
        }
        Some(Via::Mode) => {
            let request = SetSessionModeRequest::new(native.to_string(), value.to_string());
            within(connection, connection.cx.send_request(request).block_task())
                .await
                .map(|answer| answer.map(|_| after.select(MODE, value)))
        }
        Some(Via::Model) => {
            let request = wire::SetModel { session_id: native.to_string(), model_id: value.to_string() };
            within(connection, connection.cx.send_request(request).block_task())
                .await
                .map(|answer| answer.map(|_| after.select(MODEL, value)))
        }
        None => return Err(Refusal::Refused(format!("no option {option:?}"))),
    };
    match answered {
        Some(Ok(())) => Ok(after),
        Some(Err(e)) => Err(Refusal::Refused(e.message)),
        None => Err(Refusal::Gone),
    }
}

/// Keeps what the agent says of its settings in `session`'s stored config (the editor sees it on a load before the
/// agent runs again), and tells the editor when it changed and `tell` (a turn forwarded it already).
async fn keep(bridge: &dyn BridgeHost, session: &str, selectors: &Selectors, tell: bool) {
    if edit_config(bridge, session, |config| selectors.keep(config)).await && tell {
        bridge.notify(session, SessionUpdate::ConfigOptionUpdate(ConfigOptionUpdate::new(selectors.offered())));
    }
}

/// Changes `session`'s stored config with `edit`: whether that changed it.
async fn edit_config(bridge: &dyn BridgeHost, session: &str, edit: impl FnOnce(&mut serde_json::Value)) -> bool {
    let store = bridge.store();
    let mut config = match store.session(session).await {
        Ok(Some(record)) => record.config,
        _ => return false,
    };
    let before = config.clone();
    edit(&mut config);
    if config == before {
        return false;
    }
    if let Err(e) = store.set_config(session, &config).await {
        tracing::warn!(session, "could not keep the ACP agent's settings: {e}");
    }
    true
}

/// `request`'s answer within [`SESSION_LIMIT`], unless the agent ends first (`None` then too).
async fn within<T>(
    connection: &Connection,
    request: impl std::future::Future<Output = std::result::Result<T, agent_client_protocol::Error>>,
) -> Option<std::result::Result<T, agent_client_protocol::Error>> {
    tokio::select! {
        answer = tokio::time::timeout(SESSION_LIMIT, request) => answer.ok(),
        _ = connection.closed.cancelled() => None,
    }
}

/// The agent did not do `what` in time, or ended first: it is killed.
async fn timed_out(connection: &Connection, name: &str, what: &str) -> Error {
    let message = if connection.closed.is_cancelled() {
        connection.failure(&format!("{name} ended before it could {what}")).await
    } else {
        format!("{name} did not {what} within {} s", SESSION_LIMIT.as_secs())
    };
    connection.kill().await;
    Error::CliFailed { message, stderr_tail: connection.stderr_tail(), exit_code: None }
}

#[async_trait::async_trait]
impl Service for AcpService {
    async fn attempt(
        &self,
        host: &dyn TurnHost,
        sandbox: &Arc<dyn Sandbox>,
        executable: &Path,
        native_id: Option<&str>,
        _command: Option<&str>,
        prompt: &RenderedPrompt,
    ) -> Result<Attempt> {
        let record = host.record();
        let started =
            self.connection(host.bridge(), record, sandbox, executable, host.credential(), host.model(), Some(host));
        let in_turn = self.in_turn(&record.id);
        let Some(connection) = unless_cancelled(host.cancel(), started).await? else {
            return Ok(Attempt::Finished(Ok(StopReason::Cancelled)));
        };
        let made = conversation(&connection, host.bridge(), record, sandbox.as_ref(), native_id, self.name);
        let session = match unless_cancelled(host.cancel(), made).await? {
            None => return Ok(Attempt::Finished(Ok(StopReason::Cancelled))),
            Some(Conversation::Missing) => return Ok(Attempt::ConversationMissing),
            Some(Conversation::Unloadable(why)) => return Ok(Attempt::ConversationUnloadable(why)),
            Some(Conversation::Here(session)) => session,
        };
        // Review mode: the agent's copy of the workspace is made current first; what it changes there (with its own
        // tools, or through the bridge's `fs/write_text_file`, which writes inside the sandbox) goes to the editor
        // after each finished tool and at the end of the turn.
        if !host.begin_review().await? {
            return Ok(Attempt::Finished(Ok(StopReason::Cancelled)));
        }
        // The choices made before it ran are in effect for this prompt (one made while it started, after its start
        // gave the session's choices, is given now); one it refused is said here, once.
        give_choices(&connection, host.bridge(), &record.id, &session, self.name).await;
        keep(host.bridge(), &record.id, &connection.selectors(), true).await;
        let mut said = Vec::new();
        edit_config(host.bridge(), &record.id, |config| said = take_refused(config)).await;
        for why in said {
            host.note(&format!("_{why}; this prompt runs without it._")).await?;
        }
        let events = connection.route_to(&session);
        connection.begin_turn().await;
        let (blocks, left_out) =
            prompt_blocks(&prompt.text, host.prompt_blocks(), &connection.capabilities.prompt_capabilities);
        if !left_out.is_empty() {
            host.note(&format!(
                "_{} cannot take {}; {} left out of this prompt._",
                self.name,
                left_out.join(", "),
                if left_out.len() == 1 { "it was" } else { "they were" }
            ))
            .await?;
        }
        let request = PromptRequest::new(session.clone(), blocks);
        let sent = connection.cx.send_request(request);
        let answer = tokio::spawn(sent.block_task());
        let engine = AcpEngine::new(
            connection.clone(),
            session.clone(),
            record.id.clone(),
            events,
            answer,
            host.sink(),
            native_id != Some(session.as_str()),
            host.timeouts(),
            self.name,
        );
        let translator = AcpTranslator::new(host.translate_context());
        let result = host.drive(Box::new(engine), Box::new(translator)).await;
        drop(in_turn);
        if let Some(selectors) = connection.take_announced() {
            // What it changed on its own (it left plan mode) is where it is now: its next process is given that.
            edit_config(host.bridge(), &record.id, |config| {
                selectors.keep(config);
                for (option, chosen) in choices(config) {
                    if let Some(now) = selectors.value(&option).filter(|now| *now != chosen) {
                        choose(config, &option, Some(&now));
                    }
                }
            })
            .await;
        }
        // A remote sandbox sleeps between turns (E2B pauses it, which cuts the agent's streams): its agent is
        // stopped with the turn, and the next turn starts it again on the same conversation (`session/load`).
        // Left running (`--remote-idle keep`), it keeps its agent; a provider's own timeout that pauses it later
        // cuts the streams, and the next turn finds the agent gone and starts it again the same way.
        if sandbox.remote_files().is_some() && !self.remote_keeps_running {
            self.release(&record.id).await;
        }
        result
    }

    async fn warm(
        &self,
        host: &dyn BridgeHost,
        record: &SessionRecord,
        sandbox: Arc<dyn Sandbox>,
        executable: PathBuf,
    ) -> std::result::Result<(), String> {
        let connection =
            self.connection(host, record, &sandbox, &executable, None, None, None).await.map_err(|e| e.to_string())?;
        let made = conversation(&connection, host, record, sandbox.as_ref(), record.native_id.as_deref(), self.name);
        made.await.map(|_| ()).map_err(|e| e.to_string())
    }

    fn serving(&self, session: &str) -> bool {
        self.live(session, false).is_some()
    }

    fn held(&self, _session: &str) -> Box<dyn Release> {
        Box::new(Nothing)
    }

    async fn release(&self, session: &str) {
        let entry = self.running().remove(session);
        if let Some(entry) = entry {
            entry.connection.end(STOP_GRACE).await;
        }
        self.room.notify_waiters();
    }

    async fn close(&self, _keep: bool) {
        let all: Vec<Entry> = self.running().drain().map(|(_, entry)| entry).collect();
        // All at once: the bridge's exit waits for the longest grace, not for their sum.
        futures::future::join_all(all.iter().map(|entry| entry.connection.end(STOP_GRACE))).await;
    }

    fn fall_back(&self, _session: &str) -> bool {
        false
    }

    fn fell_back(&self, _session: &str) -> bool {
        false
    }

    fn fallen_back(&self, why: &str) -> String {
        format!("{} could not start: {why}", self.name)
    }

    fn cannot_ask_without_it(&self, why: &str) -> String {
        format!("{} could not start: {why}", self.name)
    }

    async fn seeded_config(&self, host: &dyn BridgeHost, agent: &str, executable: &Path) -> Option<serde_json::Value> {
        // What the same agent announced last; else what a session of it said (a store from before the agent's
        // announcements were kept); else what the version the project installs is known to announce.
        let identity = self.identity(executable);
        if let Ok(Some((_, kept))) = host.store().agent_offers(&identity).await
            && let Some(seeded) = Offers::parse(kept).and_then(|offers| offers.seeded_config())
        {
            return Some(seeded);
        }
        let recent = host.store().list_sessions(Some(agent), None, None, SEED_FROM).await.ok().unwrap_or_default();
        recent
            .iter()
            .find_map(|earlier| seeded(&earlier.config, &identity))
            .or_else(|| self.builtin.as_ref().and_then(Offers::seeded_config))
    }

    async fn capabilities(
        &self,
        host: &dyn BridgeHost,
        executable: &Path,
    ) -> Option<(
        agent_client_protocol::v1::schema::PromptCapabilities,
        agent_client_protocol::v1::schema::SessionCapabilities,
    )> {
        self.offers(host, executable).await.map(|offers| (offers.prompt_capabilities, offers.session_capabilities))
    }

    fn announced_options(&self, session_config: &serde_json::Value) -> Option<Vec<SessionConfigOption>> {
        // None announced yet (the agent has not run for the session): none to offer.
        Some(Selectors::stored(session_config).offered())
    }

    async fn set_option(
        &self,
        host: &dyn BridgeHost,
        record: &SessionRecord,
        option: &str,
        value: &str,
    ) -> Option<Result<Vec<SessionConfigOption>>> {
        Some(self.set(host, record, option, value).await)
    }
}

impl AcpService {
    /// Sets an option of the agent's session: in the running agent, which answers; else kept for it, as the user's
    /// choices are, and given to it when it next starts.
    async fn set(
        &self,
        host: &dyn BridgeHost,
        record: &SessionRecord,
        option: &str,
        value: &str,
    ) -> Result<Vec<SessionConfigOption>> {
        let running = match self.live(&record.id, false) {
            Some(connection) => {
                let session = connection.session.lock().await.clone();
                session.map(|session| (connection, session))
            }
            None => None,
        };
        let Some((connection, session)) = running else {
            let mut offered = Vec::new();
            let mut refused = None;
            edit_config(host, &record.id, |config| {
                let mut selectors = Selectors::stored(config);
                if let Err(why) = selectors.check(self.name, option, value) {
                    refused = Some(why);
                    return;
                }
                selectors.select(option, value);
                selectors.keep(config);
                choose(config, option, Some(value));
                offered = selectors.offered();
            })
            .await;
            return match refused {
                Some(why) => Err(Error::InvalidParams(why)),
                None => Ok(offered),
            };
        };
        let now = connection.selectors();
        now.check(self.name, option, value).map_err(Error::InvalidParams)?;
        let after = match send_choice(&connection, &session, &now, option, value).await {
            Ok(after) => after,
            Err(Refusal::Refused(why)) => {
                return Err(Error::InvalidParams(format!("{} refused it: {why}", self.name)));
            }
            Err(Refusal::Gone) => return Err(timed_out(&connection, self.name, "set the option").await),
        };
        connection.set_selectors(after.clone());
        edit_config(host, &record.id, |config| {
            after.keep(config);
            choose(config, option, Some(value));
        })
        .await;
        Ok(after.offered())
    }
}

/// A session's agent holds nothing once it is stopped.
struct Nothing;

#[async_trait::async_trait]
impl Release for Nothing {
    async fn forget(self: Box<Self>, _record: &SessionRecord) {}
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::v1::schema::{AudioContent, ImageContent, PromptCapabilities};

    use super::*;

    #[test]
    fn images_and_audio_pass_as_they_are_where_the_agent_takes_them_and_only_what_is_left_out_is_said() {
        let editor = vec![
            ContentBlock::Text(TextContent::new("look")),
            ContentBlock::Image(ImageContent::new("aW1n", "image/png")),
            ContentBlock::Audio(AudioContent::new("YXVk", "audio/wav")),
        ];
        let all = PromptCapabilities::new().image(true).audio(true);
        let (blocks, left_out) = prompt_blocks("look", &editor, &all);
        assert_eq!(blocks, editor);
        assert!(left_out.is_empty());
        let images = PromptCapabilities::new().image(true);
        let (blocks, left_out) = prompt_blocks("look", &editor, &images);
        assert_eq!(blocks, editor[..2]);
        assert_eq!(left_out, ["audio (audio/wav)"]);
        let (blocks, left_out) = prompt_blocks("look", &editor, &PromptCapabilities::new());
        assert_eq!(blocks, editor[..1]);
        assert_eq!(left_out, ["an image (image/png)", "audio (audio/wav)"]);
        // An image alone: no empty text beside it; nothing the agent takes: the (empty) text still goes.
        let (blocks, _) = prompt_blocks("", &editor[1..2], &images);
        assert_eq!(blocks, editor[1..2]);
        let (blocks, _) = prompt_blocks("", &editor[1..2], &PromptCapabilities::new());
        assert_eq!(blocks, [ContentBlock::Text(TextContent::new(""))]);
    }
}
