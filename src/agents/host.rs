//! What the bridge gives an agent that keeps something running across turns (OpenCode's warm servers) and what
//! such an agent gives the bridge: the bridge's side ([`BridgeHost`]), one turn's ([`TurnHost`]) and the agent's
//! ([`Service`]). The traits are here, below `session/`, so that the agent's code never names the bridge.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::schema::SessionUpdate;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::engine::{Attempt, TurnEngine};
use super::{ModelInfo, TranslateContext, Translator};
use crate::error::{Error, Result};
use crate::sandbox::{ExecSpec, Sandbox};
use crate::store::{SessionRecord, Store};

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

    /// Asks the user to fill in a form (`elicitation/create`). `None` when the editor offers no forms, did not
    /// answer, or went away.
    async fn elicit(
        &self,
        _request: agent_client_protocol::v1::schema::CreateElicitationRequest,
    ) -> Option<agent_client_protocol::v1::schema::CreateElicitationResponse> {
        None
    }
}

/// A prompt ready for a CLI.
#[derive(Debug, Default, PartialEq)]
pub struct RenderedPrompt {
    /// Written to the CLI's stdin, then closed.
    pub text: String,
    /// Images to write into the sandbox and attach (`opencode run --file`): (file name, bytes).
    pub images: Vec<(String, Vec<u8>)>,
    /// Content the CLI cannot take, said in words for the log.
    pub dropped: Vec<String>,
}

/// What the bridge does for an agent's service, whatever turn is running.
pub trait BridgeHost: Send + Sync {
    /// The session store.
    fn store(&self) -> &Arc<Store>;

    /// The session's gate: one holder at a time per session (its turn, the making of its conversation).
    fn gate(&self, session: &str) -> Arc<tokio::sync::Mutex<()>>;

    /// The environment of the bridge's CLI in `sandbox`, with `credential` and what `model`'s provider needs.
    fn cli_environment(
        &self,
        sandbox: &dyn Sandbox,
        credential: Option<&(&'static str, String)>,
        model: Option<&str>,
    ) -> Vec<(String, String)>;

    /// How the bridge's CLI runs in `sandbox`: the executable as the sandbox sees it, `env` and `args`.
    fn cli_spec(
        &self,
        executable: &Path,
        sandbox: &dyn Sandbox,
        env: Vec<(String, String)>,
        args: Vec<String>,
    ) -> ExecSpec;

    /// The credential the bridge's agent gets (from its environment, or kept by `acp-sandbox login`), for what a
    /// service starts before a turn brings one.
    fn credential(&self) -> Option<(&'static str, String)>;

    /// Whether sandboxes get a network namespace of their own (a port inside is then private to its sandbox).
    fn private_network(&self) -> bool;

    /// How long what a service runs outlives the bridge (`--keep-warm`), if it does.
    fn keep_warm(&self) -> Option<Duration>;

    /// The name of `sandbox` when the sessions in it share what a service runs (`--server-scope workspace`).
    fn shared_sandbox(&self, sandbox: &dyn Sandbox) -> Option<String>;

    /// Whether the editor fills in forms for the agent (`elicitation.form` of its capabilities).
    fn client_fills_forms(&self) -> bool;

    /// The MCP servers the editor gave `session` here, secrets included (never stored).
    fn mcp_servers(&self, session: &str) -> Vec<agent_client_protocol::v1::schema::McpServer>;

    /// Sends `session` an update outside any turn (its options changed), through the editor's connection once it
    /// initialized; nothing otherwise.
    fn notify(&self, session: &str, update: SessionUpdate) {
        if let Some(sink) = self.notifier() {
            sink.send(session, update);
        }
    }

    /// Where updates outside any turn go, once the editor's connection initialized.
    fn notifier(&self) -> Option<Arc<dyn UpdateSink>>;

    /// Takes a model list the service learned (`listing`, run in the background); the open sessions are told
    /// when it changed what they were offered.
    fn learn_models(&self, listing: BoxFuture<'static, Option<Vec<ModelInfo>>>);
}

/// What the bridge does for one turn of a session.
#[async_trait::async_trait]
pub trait TurnHost: Send + Sync {
    /// The bridge's side.
    fn bridge(&self) -> &dyn BridgeHost;

    /// The session.
    fn record(&self) -> &SessionRecord;

    /// The turn's id in the store.
    fn turn_id(&self) -> i64;

    /// The prompt as the editor sent it (an agent that speaks ACP takes its images as they are).
    fn prompt_blocks(&self) -> &[agent_client_protocol::v1::schema::ContentBlock];

    /// The credential the CLI gets, if the agent needs one.
    fn credential(&self) -> Option<&(&'static str, String)>;

    /// The model the turn uses, when known.
    fn model(&self) -> Option<&str>;

    /// Where the session's updates go (and its permission requests).
    fn sink(&self) -> Arc<dyn UpdateSink>;

    /// Cancelled when the user cancels the turn.
    fn cancel(&self) -> &CancellationToken;

    /// How long the agent may be silent, and the whole turn's deadline.
    fn timeouts(&self) -> (Duration, Duration);

    /// Sends a note into the thread (stored first).
    async fn note(&self, text: &str) -> Result<()>;

    /// Review mode: the copy the agent works on is made current before the prompt. `false`: the turn was cancelled
    /// meanwhile.
    async fn begin_review(&self) -> Result<bool>;

    /// What the turn's translator is told.
    fn translate_context(&self) -> TranslateContext;

    /// Drives the attempt through the bridge's one turn loop.
    async fn drive(&self, engine: Box<dyn TurnEngine>, translator: Box<dyn Translator>) -> Result<Attempt>;
}

/// Runs a step before the agent starts: `None` when the turn is cancelled first (the step is dropped, which
/// stops what it started) or the step says it was.
pub async fn unless_cancelled<T>(
    cancel: &CancellationToken,
    step: impl std::future::Future<Output = Result<T>>,
) -> Result<Option<T>> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Ok(None),
        result = step => match result {
            Err(Error::Sandbox(crate::sandbox::SandboxError::Cancelled)) => Ok(None),
            other => other.map(Some),
        },
    }
}

/// Waits for an agent's start that a turn (`turn`) needs, saying so in its thread once it has taken
/// [`crate::sandbox::progress::NOTE_AFTER`]: `note` names what is awaited.
pub async fn said_when_slow<T>(
    start: impl std::future::Future<Output = T>,
    turn: Option<&dyn TurnHost>,
    note: &str,
) -> Result<T> {
    tokio::pin!(start);
    let Some(turn) = turn else { return Ok(start.await) };
    tokio::select! {
        started = &mut start => return Ok(started),
        _ = tokio::time::sleep(crate::sandbox::progress::NOTE_AFTER) => {}
    }
    turn.note(note).await?;
    Ok(start.await)
}

/// How the bridge bounds what a service runs.
#[derive(Clone, Debug)]
pub struct ServiceSettings {
    /// What runs is stopped after this long without a turn.
    pub idle_timeout: Duration,
    /// At most this many run at once.
    pub max_running: usize,
    /// The bridge's data dir (locks, records).
    pub data_dir: PathBuf,
    /// A remote sandbox is left running between turns (`--remote-idle keep`), so what runs in it may stay too.
    pub remote_keeps_running: bool,
}

/// What an agent keeps running for a bridge across turns (OpenCode: its warm servers), and how a turn uses it.
#[async_trait::async_trait]
pub trait Service: Send + Sync {
    /// One attempt of a turn through what the service runs. [`Attempt::Unavailable`] when it cannot run here:
    /// the bridge then runs the agent's CLI per prompt.
    async fn attempt(
        &self,
        host: &dyn TurnHost,
        sandbox: &Arc<dyn Sandbox>,
        executable: &Path,
        native_id: Option<&str>,
        command: Option<&str>,
        prompt: &RenderedPrompt,
    ) -> Result<Attempt>;

    /// Starts what the session's first prompt will use, ahead of it. `Err`: why not, for the log.
    async fn warm(
        &self,
        host: &dyn BridgeHost,
        record: &SessionRecord,
        sandbox: Arc<dyn Sandbox>,
        executable: PathBuf,
    ) -> std::result::Result<(), String>;

    /// Whether something runs for `session` now.
    fn serving(&self, session: &str) -> bool;

    /// Whether a fork's first turn continues the original's conversation in the agent itself (the original's
    /// conversation being in the same sandbox); else the fork starts its own from the stored transcript.
    fn forks_in_place(&self) -> bool {
        false
    }

    /// What runs for `session` now, kept to forget the session's conversation there once it is deleted (taken
    /// before the session lets go of it).
    fn held(&self, session: &str) -> Box<dyn Release>;

    /// Lets go of what runs for `session`: it stops unless other sessions use it.
    async fn release(&self, session: &str);

    /// Stops everything at the bridge's exit, or (`keep`) leaves it running for the next bridge.
    async fn close(&self, keep: bool);

    /// Notes that `session`'s service could not start, so its prompts run the CLI per prompt for the rest of the
    /// bridge's life: `true` the first time.
    fn fall_back(&self, session: &str) -> bool;

    /// Whether `session` fell back.
    fn fell_back(&self, session: &str) -> bool;

    /// What the user is told when a session falls back, `why` being what went wrong.
    fn fallen_back(&self, why: &str) -> String;

    /// Why a turn under `ask` is not run when the service could not start (the CLI per prompt cannot ask).
    fn cannot_ask_without_it(&self, why: &str) -> String;

    /// What a new session of `agent` (run by `executable`) keeps in its config from the start: an ACP agent's
    /// options as a fresh session of the same agent announced them last, so that the editor has them (and applies
    /// its own defaults to them) before the agent has started and says its own.
    async fn seeded_config(
        &self,
        _host: &dyn BridgeHost,
        _agent: &str,
        _executable: &std::path::Path,
    ) -> Option<serde_json::Value> {
        None
    }

    /// What the agent `executable` runs takes in a prompt and what its sessions can do, as it announced them (an ACP
    /// agent's `initialize`), known before it starts; `None`: unknown, or not the service's to say.
    async fn capabilities(
        &self,
        _host: &dyn BridgeHost,
        _executable: &std::path::Path,
    ) -> Option<(
        agent_client_protocol::v1::schema::PromptCapabilities,
        agent_client_protocol::v1::schema::SessionCapabilities,
    )> {
        None
    }

    /// The session's options as what the service runs announced them (an ACP agent's own), kept in its stored
    /// config; `None`: the agent's [`crate::agents::Agent::options`] are the session's.
    fn announced_options(
        &self,
        _session_config: &serde_json::Value,
    ) -> Option<Vec<agent_client_protocol::v1::schema::SessionConfigOption>> {
        None
    }

    /// Sets one of the [`Service::announced_options`] in what the service runs: the new options. `None`: the
    /// service has no options of its own (the bridge sets the agent's).
    async fn set_option(
        &self,
        _host: &dyn BridgeHost,
        _record: &SessionRecord,
        _option: &str,
        _value: &str,
    ) -> Option<Result<Vec<agent_client_protocol::v1::schema::SessionConfigOption>>> {
        None
    }
}

/// What is left of a released session's place in a service.
#[async_trait::async_trait]
pub trait Release: Send {
    /// Deletes the deleted session `record`'s conversation where other sessions still work.
    async fn forget(self: Box<Self>, record: &SessionRecord);
}
