//! One prompt turn: prepare the sandbox and the CLI, run it, translate its stream, decide the outcome.

use std::collections::{BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use agent_client_protocol::v1::schema::{
    ContentBlock, SessionInfoUpdate, SessionUpdate, StopReason, ToolCall, ToolCallContent, ToolCallStatus,
    ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use tokio_util::sync::CancellationToken;

use super::serve::ServeOutcome;
use super::{Bridge, UpdateSink, note, prompt};
use crate::agents::{AgentKind, ModelInfo, Output, StreamEnd, TranslateContext, TurnEnd, TurnRequest};
use crate::error::{Error, Result};
use crate::lines::BoundedLines;
use crate::sandbox::{ExecSpec, OutputStream, Sandbox, install};
use crate::store::{Outbox, SessionRecord, Store, TurnStatus};

/// Variables of the bridge's environment every CLI gets: what programs need to run and to reach the
/// network (proxies, CA bundles). Everything else is dropped; each agent adds its own settings and keys.
pub(super) const BASE_ENV: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "USER",
    "LOGNAME",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
];

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
        .filter(|(name, _)| {
            BASE_ENV.contains(&name.as_str())
                || name.starts_with("LC_")
                || agent.passes_env(name)
                || names.contains(name)
        })
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

/// At most this many characters of earlier turns are handed to a fresh CLI conversation.
const TRANSCRIPT_LIMIT: usize = 24_000;

/// Lines of stderr kept for error messages.
const STDERR_TAIL_LINES: usize = 40;

/// The longest line of a CLI's stderr that is read; the rest of a longer one is dropped as it arrives.
const STDERR_LINE_LIMIT: usize = 64 * 1024;

/// Everything one turn needs.
pub(super) struct Turn<'a> {
    pub bridge: &'a Bridge,
    pub record: SessionRecord,
    pub agent: AgentKind,
    pub credential: Option<(&'static str, String)>,
    pub blocks: Vec<ContentBlock>,
    pub sink: Arc<dyn UpdateSink>,
    pub cancel: CancellationToken,
    /// What is known about the model in use (OpenCode): its context window and whether it takes images.
    pub model: Option<ModelInfo>,
}

/// Persists each update, then sends it once the store acknowledged it: what the editor saw is what
/// `session/load` replays. Updates are queued without waiting for each commit, so a fast stream is written in
/// batches; they reach the editor in order.
pub(super) struct Emitter {
    store: Arc<Store>,
    /// Hands each update's JSON to the editor's sink once it is committed.
    outbox: Outbox<String>,
    session_id: String,
    pub(super) turn_id: i64,
    /// What earlier turns cost: added to this turn's running cost, since ACP reports it per session.
    prior_cost: f64,
    /// This turn's running cost as the CLI reported it.
    turn_cost: std::sync::Mutex<f64>,
    /// The turn's cancel: once it fires, the turn waits for its store only while the store is not stuck (see
    /// [`Emitter::unless_given_up`]).
    cancel: CancellationToken,
    /// When a cancelled turn stops waiting for its store at the latest.
    deadline: std::sync::OnceLock<tokio::time::Instant>,
    /// The cancelled turn gave up on its store: later steps are not waited for either.
    given_up: std::sync::atomic::AtomicBool,
}

/// The most text one update keeps, stored and sent (its long strings together: a message chunk's text, a tool's
/// output, a diff): what is beyond is cut, with [`cut_note`] where it was cut. A CLI or server that sends one
/// enormous event costs a bounded store, replay and editor, whatever the backend.
pub(super) const UPDATE_TEXT_LIMIT: usize = 2 * 1024 * 1024;

/// Strings up to this long are never cut (ids, kinds, paths, titles): only text counts against the limit.
const SHORT_TEXT: usize = 4096;

/// What an update whose text was cut says where it was cut.
pub(super) fn cut_note(dropped: usize) -> String {
    format!(
        "\n\n[acp-sandbox cut this text here: {dropped} more bytes did not fit in one update, which keeps at most {} MiB]",
        UPDATE_TEXT_LIMIT >> 20
    )
}

/// Cuts the update's text to [`UPDATE_TEXT_LIMIT`] (the notes included), in order, each cut string ending with
/// [`cut_note`]; a tool's
/// raw input or output still too large after that (many short strings) is replaced by a note. Whether it cut.
pub(super) fn bound_update(update: &mut serde_json::Value) -> bool {
    fn cut(value: &mut serde_json::Value, budget: &mut usize) -> bool {
        match value {
            serde_json::Value::String(text) if text.len() > SHORT_TEXT => {
                if text.len() <= *budget {
                    *budget -= text.len();
                    return false;
                }
                // The note fits in the budget too, so that an update cut once is never cut again (on replay).
                let keep = text.floor_char_boundary(budget.saturating_sub(cut_note(text.len()).len()));
                let dropped = text.len() - keep;
                text.truncate(keep);
                text.push_str(&cut_note(dropped));
                text.shrink_to_fit();
                *budget = 0;
                true
            }
            serde_json::Value::Array(items) => items.iter_mut().fold(false, |was, item| cut(item, budget) | was),
            serde_json::Value::Object(fields) => fields.values_mut().fold(false, |was, field| cut(field, budget) | was),
            _ => false,
        }
    }
    /// About how many bytes the value takes serialized.
    fn size(value: &serde_json::Value) -> usize {
        match value {
            serde_json::Value::String(text) => text.len() + 2,
            serde_json::Value::Array(items) => items.iter().map(|item| size(item) + 1).sum::<usize>() + 2,
            serde_json::Value::Object(fields) => fields.iter().map(|(key, field)| key.len() + 4 + size(field)).sum(),
            _ => 8,
        }
    }
    let mut budget = UPDATE_TEXT_LIMIT;
    let mut was_cut = cut(update, &mut budget);
    if size(update) > 2 * UPDATE_TEXT_LIMIT
        && let Some(fields) = update.as_object_mut()
    {
        for raw in ["rawInput", "rawOutput"] {
            if let Some(field) = fields.get_mut(raw)
                && size(field) > UPDATE_TEXT_LIMIT
            {
                *field = serde_json::Value::String(cut_note(size(field)));
                was_cut = true;
            }
        }
    }
    was_cut
}

/// Whether the disk holding `dir` has (next to) no room left for an unprivileged writer.
fn disk_full(dir: &std::path::Path) -> bool {
    const ROOM: u64 = 1024 * 1024;
    nix::sys::statvfs::statvfs(dir)
        .is_ok_and(|stat| stat.blocks_available().saturating_mul(stat.fragment_size()) < ROOM)
}

/// How long a cancelled turn waits for a store that waits for another program's lock. Such a store must not hold
/// the cancel until its busy timeout: the turn is answered, and what could not be written yet is written (not sent)
/// once the store can. Only a lock wait counts: a store that is slow (a loaded machine, a long backlog of updates)
/// still commits, and its last updates are sent before the answer.
const CANCEL_STORE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a cancelled turn waits for its store at most, stuck or not: a disk that stopped answering.
const CANCEL_STORE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a cancelled turn looks whether its store is stuck.
const CANCEL_STORE_CHECK: std::time::Duration = std::time::Duration::from_millis(25);

impl Emitter {
    /// The turn's cancel.
    pub(super) fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Queues one update; fails when the store cannot write it (or could not write an earlier one).
    pub(super) async fn send(&self, update: SessionUpdate) -> Result<()> {
        let update = match update {
            SessionUpdate::UsageUpdate(mut usage) => {
                if let Some(cost) = usage.cost.as_mut() {
                    *self.turn_cost.lock().unwrap_or_else(|p| p.into_inner()) = cost.amount;
                    cost.amount += self.prior_cost;
                }
                SessionUpdate::UsageUpdate(usage)
            }
            other => other,
        };
        let Some(json) = self.serialize(&update) else { return Ok(()) };
        drop(update);
        // Given up on (the turn was cancelled and the store is stuck): neither stored nor sent.
        let Some(ack) = self.unless_given_up(self.store.queue_json(&self.session_id, self.turn_id, json.clone())).await
        else {
            return Ok(());
        };
        Ok(self.outbox.push(ack?, json)?)
    }

    /// The update's JSON, serialized once for the store and the editor alike: what is sent is what is stored, byte
    /// for byte. Bounded to [`UPDATE_TEXT_LIMIT`], and a new file's diff says `"oldText": null` (see
    /// [`crate::agents::tools::explicit_new_files`]). `None` when it cannot be serialized: not stored, so not
    /// sent either, and a replay shows what the editor saw.
    fn serialize(&self, update: &SessionUpdate) -> Option<String> {
        let new_file = crate::agents::tools::has_new_file_diff(update);
        if !new_file {
            match serde_json::to_string(update) {
                // No more text than the limit in the whole JSON: nothing to cut (the hot path, one serialization).
                Ok(json) if json.len() <= UPDATE_TEXT_LIMIT => return Some(json),
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(session = %self.session_id, "could not serialize an update: {e}");
                    return None;
                }
            }
        }
        let mut value = match serde_json::to_value(update) {
            Ok(value) => value,
            Err(e) => {
                tracing::error!(session = %self.session_id, "could not serialize an update: {e}");
                return None;
            }
        };
        if bound_update(&mut value) {
            tracing::warn!(session = %self.session_id, "an update had more than {} MiB of text: the rest was cut", UPDATE_TEXT_LIMIT >> 20);
        }
        if new_file {
            crate::agents::tools::explicit_new_files(&mut value);
        }
        Some(value.to_string())
    }

    /// Waits until every update queued so far is stored and sent. A cancelled turn waits only for its grace;
    /// what is left is stored but no longer sent.
    async fn flush(&self) -> Result<()> {
        match self.unless_given_up(self.outbox.flush()).await {
            Some(flushed) => Ok(flushed?),
            None => {
                self.outbox.mute();
                tracing::warn!(session = %self.session_id, "the store is stuck: the cancelled turn is answered without its last updates, which are stored once it can write");
                Ok(())
            }
        }
    }

    /// Awaits a step that waits for the store, unless the turn is cancelled and the store is stuck: its writer has
    /// waited for another program's lock for [`CANCEL_STORE_GRACE`], or [`CANCEL_STORE_DEADLINE`] passed since the
    /// cancel. Then `None`, and the step is dropped; so are later steps that are not done at once.
    pub(super) async fn unless_given_up<F: Future>(&self, step: F) -> Option<F::Output> {
        use std::sync::atomic::Ordering;
        let mut step = std::pin::pin!(step);
        if !self.cancel.is_cancelled() {
            tokio::select! {
                biased;
                done = &mut step => return Some(done),
                _ = self.cancel.cancelled() => {}
            }
        }
        if self.given_up.load(Ordering::Relaxed) {
            return tokio::time::timeout(std::time::Duration::ZERO, step).await.ok();
        }
        let deadline = *self.deadline.get_or_init(|| tokio::time::Instant::now() + CANCEL_STORE_DEADLINE);
        loop {
            tokio::select! {
                biased;
                done = &mut step => return Some(done),
                _ = tokio::time::sleep(CANCEL_STORE_CHECK) => {}
            }
            let stuck = self.store.waiting_for_a_lock().is_some_and(|waited| waited >= CANCEL_STORE_GRACE);
            if stuck || tokio::time::Instant::now() >= deadline {
                self.given_up.store(true, Ordering::Relaxed);
                return None;
            }
        }
    }

    /// Like [`Emitter::unless_given_up`], for a write that must happen even when the turn stops waiting for it:
    /// it runs on a task of its own, and the store's writer commits it once it can.
    pub(super) async fn write<T: Send + 'static>(
        &self,
        write: impl Future<Output = std::result::Result<T, crate::store::StoreError>> + Send + 'static,
    ) -> Result<Option<T>> {
        let task = tokio::spawn(write);
        match self.unless_given_up(task).await {
            None => Ok(None),
            Some(Ok(written)) => Ok(Some(written?)),
            Some(Err(_)) => Err(Error::Store(crate::store::StoreError::Stopped)),
        }
    }
}

/// How one run of the CLI ended.
enum Attempt {
    /// The turn is over.
    Finished(Result<StopReason>),
    /// The CLI says the conversation we continue no longer exists: start a fresh one.
    ConversationMissing,
}

impl Turn<'_> {
    /// The model the session's choices name, else the agent's configured default, for an agent with a model choice.
    fn chosen_model(&self) -> Option<&str> {
        let chosen =
            self.agent.chosen_model(&self.record.config).filter(|model| *model != crate::agents::options::DEFAULT);
        chosen.or(self.agent.default_model(&self.bridge.config().agents))
    }

    pub async fn run(self) -> Result<StopReason> {
        let store = self.bridge.store.clone();
        let prompt_json = serde_json::to_value(&self.blocks).unwrap_or_default();
        // Read first: once the turn row exists, nothing may fail before the turn is ended.
        let prior_cost = store.session_cost(&self.record.id).await?;
        // The turn row is written on a task of its own: a cancel while the store waits for a lock answers at
        // once, and a row written after that is ended as cancelled.
        let mut started = {
            let store = store.clone();
            let session = self.record.id.clone();
            tokio::spawn(async move { store.start_turn(&session, &prompt_json).await })
        };
        let turn_id = tokio::select! {
            biased;
            started = &mut started => started.map_err(|_| Error::Store(crate::store::StoreError::Stopped))??,
            _ = self.cancel.cancelled() => {
                let store = store.clone();
                tokio::spawn(async move {
                    if let Ok(Ok(turn_id)) = started.await {
                        let _ = store.end_turn(turn_id, TurnStatus::Done, Some("cancelled"), None, 0.0).await;
                    }
                });
                tracing::info!(session = %self.record.id, "cancelled while the store was busy: turn ended");
                return Ok(StopReason::Cancelled);
            }
        };
        let sink = self.sink.clone();
        let sink_session = self.record.id.clone();
        let emitter = Emitter {
            store: store.clone(),
            outbox: Outbox::new(move |run| sink.send_json_run(&sink_session, run)),
            session_id: self.record.id.clone(),
            turn_id,
            prior_cost,
            turn_cost: std::sync::Mutex::new(0.0),
            cancel: self.cancel.clone(),
            deadline: std::sync::OnceLock::new(),
            given_up: std::sync::atomic::AtomicBool::new(false),
        };
        let session_id = self.record.id.clone();
        let result = self.run_turn(&emitter).await.map_err(|error| self.explain(error));
        // Every update is stored and sent before the prompt is answered; one that could not be stored fails the turn
        // with the store's words (what the user can do about it), whatever else went wrong.
        let result = match emitter.flush().await {
            Err(error) if !matches!(result, Err(Error::Store(_))) => Err(error),
            _ => result,
        };
        let cost = *emitter.turn_cost.lock().unwrap_or_else(|p| p.into_inner());
        let (status, stop, error) = match &result {
            Ok(stop) => (TurnStatus::Done, Some(stop_reason_name(*stop)), None),
            Err(error) => (TurnStatus::Failed, None, Some(error.to_string())),
        };
        let ending = {
            let store = store.clone();
            async move { store.end_turn(turn_id, status, stop, error.as_deref(), cost).await }
        };
        match emitter.write(ending).await {
            Ok(Some(())) => {}
            Ok(None) => {
                tracing::warn!(session = %session_id, "the end of the cancelled turn is recorded once the store can write")
            }
            // The store keeps trying; a later bridge marks the turn interrupted if this one dies first.
            Err(e) => tracing::error!(session = %session_id, "could not record the end of the turn yet: {e}"),
        }
        match &result {
            Ok(stop) => {
                tracing::info!(session = %session_id, stop = stop_reason_name(*stop), "turn ended")
            }
            Err(error) => tracing::warn!(session = %session_id, "turn failed: {error}"),
        }
        result
    }

    /// Says what a CLI's failure means when the CLI itself does not: OpenCode answers a model it does not have
    /// with "Unexpected server error" (`run`) or "Model not found" (`serve`), which name neither the picker nor
    /// `opencode models`.
    fn explain(&self, mut error: Error) -> Error {
        // The CLI keeps its own database on the data dir's disk (OpenCode then says only "Failed to execute
        // statement"): a full disk is named with what to free.
        let data_dir = &self.bridge.config().data_dir;
        if let Error::CliFailed { message, .. } = &mut error
            && disk_full(data_dir)
        {
            *message = format!(
                "The disk holding {} is full, so {} could not save its conversation: free space on it, then send the prompt again\n\n{} said: {message}",
                data_dir.display(),
                self.agent.display_name(),
                self.agent.display_name(),
            );
            return error;
        }
        if let Error::CliFailed { message, .. } = &mut error
            && message.starts_with("Cannot connect to API")
        {
            let model = self.chosen_model().map(|model| format!(" of {model}")).unwrap_or_default();
            message.push_str(&format!(
                "\n\nThe model's provider{model} could not be reached: check that it is up, that the sandbox's network policy lets it through (`--network`; `acp-sandbox doctor` shows the policy), or pick another model"
            ));
            return error;
        }
        let Error::CliFailed { message, .. } = &error else { return error };
        if self.model.is_some() || !self.agent.says_unknown_model(message) {
            return error;
        }
        let chosen = self.chosen_model();
        // Only a model missing from what OpenCode listed is known to be the cause.
        match chosen {
            Some(model) if !self.bridge.catalog.models().is_empty() => Error::UnknownModel {
                agent: self.agent.display_name(),
                model: model.to_string(),
                said: message.clone(),
            },
            _ => error,
        }
    }

    async fn run_turn(&self, emit: &Emitter) -> Result<StopReason> {
        let workspace = PathBuf::from(&self.record.cwd);
        if !workspace.is_dir() {
            return Err(Error::InvalidParams(format!("the workspace {} does not exist", workspace.display())));
        }
        if self.record.title.is_none()
            && let Some(title) = prompt::title(&self.blocks)
        {
            let (store, id, stored_title) = (self.bridge.store.clone(), self.record.id.clone(), title.clone());
            emit.write(async move { store.set_title(&id, &stored_title).await }).await?;
            emit.send(SessionUpdate::SessionInfoUpdate(SessionInfoUpdate::new().title(title))).await?;
        }
        // The user must know when the agent has their whole machine: said once, in the session's first turn.
        if self.record.sandbox_id.is_none()
            && let Some(why) = self.bridge.provider.unconfined()
        {
            emit.send(note(&format!(
                "_{} runs WITHOUT a sandbox here ({why}): it can read and write everything you can._",
                self.agent.display_name()
            )))
            .await?;
        }
        // A model known not to take images gets none (OpenCode would fail the whole turn on them).
        let images = self.agent.accepts_images() && self.model.as_ref().is_none_or(|model| model.image);
        let mut rendered = prompt::render(&self.blocks, images);
        let commands = self.agent.commands(&crate::paths::user_config_dir(), &workspace);
        let command = prompt::split_command(&mut rendered.text, commands.iter().map(|c| c.name.as_str()));
        if !rendered.dropped.is_empty() {
            emit.send(note(&format!(
                "_{} cannot take {}; {} left out of this prompt._",
                self.agent.display_name(),
                rendered.dropped.join(", "),
                if rendered.dropped.len() == 1 { "it was" } else { "they were" }
            )))
            .await?;
        }
        // A cancel (or the bridge's exit) while the CLI is installed, probed or its sandbox made ends the turn
        // there; what those steps started is stopped with them. A CLI of this machine is found first; a remote
        // sandbox, which does not see this machine, gets its CLI (and the user's config of it) inside.
        let mut found = None;
        if self.bridge.sessions_run_here() {
            found = Some(self.local_executable(emit).await);
        }
        let Some(sandbox) = self.unless_cancelled(self.bridge.session_sandbox(&self.record)).await? else {
            return Ok(StopReason::Cancelled);
        };
        let found = match (sandbox.remote_files(), found) {
            (Some(files), _) => self.remote_executable(emit, sandbox.as_ref(), files).await,
            (None, Some(found)) => found,
            (None, None) => self.local_executable(emit).await,
        };
        let executable = match found {
            Err(Error::Sandbox(crate::sandbox::SandboxError::Cancelled)) => return Ok(StopReason::Cancelled),
            other => other?,
        };
        let mut native_id = self.record.native_id.clone();
        // A session whose server could not start runs `run` for the rest of this bridge's life: every prompt
        // would otherwise wait for another failing start.
        // Under `ask` there is no falling back: `run` cannot ask.
        let mut serve = self.bridge.serves(&self.record)
            && (crate::agents::options::approvals(&self.record.config) == crate::agents::options::APPROVALS_ASK
                || !self.bridge.fallback_told.lock().unwrap_or_else(|p| p.into_inner()).contains(&self.record.id));
        loop {
            if self.cancel.is_cancelled() {
                return Ok(StopReason::Cancelled);
            }
            let attempt = if serve {
                match self
                    .serve_attempt(emit, &sandbox, &executable, native_id.as_deref(), command.as_deref(), &rendered)
                    .await?
                {
                    ServeOutcome::Finished(result) => Attempt::Finished(result),
                    ServeOutcome::ConversationMissing => Attempt::ConversationMissing,
                    ServeOutcome::Unavailable(why) => {
                        if crate::agents::options::approvals(&self.record.config)
                            == crate::agents::options::APPROVALS_ASK
                        {
                            // `opencode run` cannot ask: it would run every tool the user wanted to be asked about.
                            return Err(Error::CliFailed {
                                message: format!(
                                    "OpenCode's server could not start, and `opencode run` cannot ask before a tool \
                                     runs, so this prompt was not run (Approvals: Ask): {}",
                                    crate::lines::first_text_line(&why)
                                ),
                                stderr_tail: String::new(),
                                exit_code: None,
                            });
                        }
                        serve = false;
                        tracing::warn!(session = %self.record.id, "running `opencode run` instead of the server: {why}");
                        let first = self
                            .bridge
                            .fallback_told
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(self.record.id.clone());
                        if first {
                            emit.send(note(&format!(
                                "_OpenCode's server could not start here, so this session runs `opencode run` per prompt (no live output): {}_",
                                crate::lines::first_text_line(&why)
                            )))
                            .await?;
                        }
                        continue;
                    }
                }
            } else {
                self.attempt(emit, sandbox.as_ref(), &executable, native_id.as_deref(), command.as_deref(), &rendered)
                    .await?
            };
            match attempt {
                Attempt::Finished(result) => return result,
                Attempt::ConversationMissing => {
                    let Some(old) = native_id.take() else {
                        return Err(Error::CliFailed {
                            message: format!("{} could not start a conversation", self.agent.display_name()),
                            stderr_tail: String::new(),
                            exit_code: None,
                        });
                    };
                    tracing::warn!(session = %self.record.id, native = %old, "the CLI conversation is gone; starting a fresh one");
                    self.bridge.store.set_native_id(&self.record.id, None).await?;
                    // Our store still has the conversation: the fresh one starts from its transcript.
                    let history = self.bridge.store.history(&self.record.id, self.bridge.config().replay_limit).await?;
                    let earlier: Vec<_> =
                        history.turns.into_iter().filter(|(turn, _)| turn.id != emit.turn_id).collect();
                    let transcript = prompt::transcript(&earlier, TRANSCRIPT_LIMIT);
                    let told = if transcript.is_empty() {
                        "so this prompt starts a fresh one".to_string()
                    } else {
                        rendered.text = format!("{transcript}\n\n{}", rendered.text);
                        "so this prompt starts a fresh one from a transcript of the earlier turns (tool details are not in it)"
                            .to_string()
                    };
                    emit.send(note(&format!(
                        "_The earlier {} conversation ({old}) no longer exists in the sandbox, {told}._",
                        self.agent.display_name()
                    )))
                    .await?;
                }
            }
        }
    }

    /// Runs a step before the CLI starts: `None` when the turn is cancelled first (the step is dropped, which
    /// stops what it started) or the step says it was.
    pub(super) async fn unless_cancelled<T>(&self, step: impl Future<Output = Result<T>>) -> Result<Option<T>> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Ok(None),
            result = step => match result {
                Err(Error::Sandbox(crate::sandbox::SandboxError::Cancelled)) => Ok(None),
                other => other.map(Some),
            },
        }
    }

    /// The CLI's executable on this machine: the override, PATH, the tools cache, or an install on first use; for
    /// a version the bridge can drive (see [`Bridge::supported_executable`]).
    async fn local_executable(&self, emit: &Emitter) -> Result<PathBuf> {
        // The install hears the cancel itself, so that its card says how it ended.
        let executable = self.executable(emit).await?;
        let found = self.bridge.supported_executable(self.agent, &executable, &self.cancel);
        match self.unless_cancelled(found).await? {
            Some((pinned, _)) => Ok(pinned),
            None => Err(Error::Sandbox(crate::sandbox::SandboxError::Cancelled)),
        }
    }

    /// The CLI's executable: the override, PATH, the tools cache, or an install on first use.
    async fn executable(&self, emit: &Emitter) -> Result<PathBuf> {
        if let Some(path) = crate::locate::installed_executable(self.bridge.config(), self.agent) {
            return Ok(path);
        }
        let tools = crate::paths::tools_dir(&self.bridge.config().data_dir);
        let install = install::install(self.agent.package(), &tools, &self.cancel);
        let fix = format!(
            "Put `{}` on PATH or set ACP_SANDBOX_{}_BIN.",
            self.agent.package().bin,
            self.agent.as_str().to_uppercase()
        );
        self.install_card(emit, "", install, &fix).await
    }

    /// Runs an install of the CLI behind a tool card that says how it went: done, cancelled, or npm's words. `place`
    /// says where, for the card and the error (empty: this machine); `fix` what the user can do when it fails.
    pub(super) async fn install_card(
        &self,
        emit: &Emitter,
        place: &str,
        install: impl Future<Output = std::result::Result<PathBuf, crate::sandbox::SandboxError>>,
        fix: &str,
    ) -> Result<PathBuf> {
        let package = self.agent.package();
        let call_id = format!("install-{}", package.bin);
        emit.send(SessionUpdate::ToolCall(
            ToolCall::new(
                call_id.clone(),
                format!("Installing {} {}{place} (first use)", self.agent.display_name(), package.version),
            )
            .kind(ToolKind::Other)
            .status(ToolCallStatus::InProgress)
            .raw_input(serde_json::json!({ "npm": format!("{}@{}", package.name, package.version) })),
        ))
        .await?;
        match install.await {
            Ok(path) => {
                emit.send(update(&call_id, ToolCallUpdateFields::new().status(ToolCallStatus::Completed))).await?;
                // The model listing runs on this machine: only a local install changes it.
                if place.is_empty() {
                    self.bridge.refresh_models();
                }
                Ok(path)
            }
            Err(crate::sandbox::SandboxError::Cancelled) => {
                emit.send(update(
                    &call_id,
                    ToolCallUpdateFields::new()
                        .status(ToolCallStatus::Failed)
                        .content(vec![ToolCallContent::from("The install was cancelled.".to_string())]),
                ))
                .await?;
                Err(Error::Sandbox(crate::sandbox::SandboxError::Cancelled))
            }
            Err(e) => {
                emit.send(update(
                    &call_id,
                    ToolCallUpdateFields::new()
                        .status(ToolCallStatus::Failed)
                        .content(vec![ToolCallContent::from(e.to_string())]),
                ))
                .await?;
                Err(Error::CliUnavailable(format!(
                    "{} is not installed{place} and could not be installed: {e}. {fix}",
                    self.agent.display_name(),
                )))
            }
        }
    }

    /// The review of this turn, in review mode and in every remote sandbox: what the agent changes goes to the
    /// editor first.
    pub(super) fn review<'s>(&self, sandbox: &'s dyn Sandbox) -> Option<super::review::Review<'s>> {
        super::review::Review::of(
            sandbox,
            || self.bridge.mirror_copy(&self.record),
            self.sink.clone(),
            &self.record.id,
            PathBuf::from(&self.record.cwd),
            self.bridge.client_abilities().write_text_file,
        )
        .map(|review| review.uploading_secrets(self.bridge.config().remote_upload_secrets))
    }

    async fn attempt(
        &self,
        emit: &Emitter,
        sandbox: &dyn Sandbox,
        executable: &std::path::Path,
        native_id: Option<&str>,
        command: Option<&str>,
        rendered: &prompt::RenderedPrompt,
    ) -> Result<Attempt> {
        let review = self.review(sandbox);
        // Uploading a remote sandbox's workspace may take a while: a cancel stops it (the next turn starts over).
        if let Some(review) = &review
            && self.unless_cancelled(review.begin(emit)).await?.is_none()
        {
            return Ok(Attempt::Finished(Ok(StopReason::Cancelled)));
        }
        let mut files = Vec::new();
        if !rendered.images.is_empty() {
            let dir = prompt::attachments_dir(sandbox.state_dir(), emit.turn_id);
            for (name, bytes) in &rendered.images {
                let path = dir.join(name);
                sandbox.write_state_file(&path, bytes).await?;
                files.push(path);
            }
        }
        let config = &self.record.config;
        let request = TurnRequest { native_id, options: config, files: &files, command };
        let mut env = cli_environment(
            self.agent,
            sandbox.state_dir(),
            self.credential.as_ref(),
            &self.bridge.env_names(self.agent, self.model.as_ref().map(|m| m.id.as_str())),
        );
        self.agent.turn_env(config, &mut env);
        let spec = ExecSpec {
            stdin: rendered.text.clone().into_bytes(),
            ..super::cli_spec(self.bridge.config(), self.agent, executable, sandbox, env, self.agent.args(&request))
        };
        tracing::info!(
            session = %self.record.id,
            program = %spec.program.display(),
            args = ?spec.args,
            env = ?spec.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            "running the CLI"
        );
        let mut process = sandbox.exec(spec).await?;
        let mut stderr_task =
            tokio::spawn(stderr_tail(std::mem::replace(&mut process.stderr, Box::pin(tokio::io::empty()))));
        let mut translator = self.agent.translator(self.translate_context(sandbox, emit));
        let mut state = StreamState { native_id: native_id.map(str::to_string), ..StreamState::default() };
        let mut reader = BoundedLines::new(process.stdout, LINE_LIMIT);
        let idle = self.bridge.config().idle_timeout;
        let deadline = tokio::time::Instant::now() + self.bridge.config().turn_timeout;
        let mut stop = Stop::Eof;
        let mut told_cut = false;
        let mut failed = None;
        let mut exited = None;
        // After the CLI exits, what it printed is read for a moment more; a descendant that still holds the pipe
        // does not hold the turn.
        let mut drain_until: Option<tokio::time::Instant> = None;
        let mut limits = tokio::time::interval(LIMIT_CHECK);
        let mut last_output = tokio::time::Instant::now();
        'read: loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => { stop = Stop::Cancelled; break; }
                _ = tokio::time::sleep_until(deadline) => { stop = Stop::TimedOut; break; }
                _ = limits.tick() => if let Some(hit) = process.handle.limit_hit() {
                    stop = Stop::Limit(hit);
                    break;
                },
                exit = process.handle.wait(), if exited.is_none() => {
                    exited = Some(exit?);
                    drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
                }
                _ = sleep_until_or_never(drain_until) => break,
                // The other branches wake the loop often: silence is measured from the last output.
                _ = tokio::time::sleep_until(last_output + idle) => { stop = Stop::Stalled; break; }
                // Cancel-safe: a read interrupted by another branch keeps what it had read in `reader`.
                read = reader.next_line() => match read {
                    Ok(None) => break,
                    Ok(Some(first)) => {
                        // The lines already read follow without another round of this select (its timers cost
                        // more than a short line): a fast stream is handled a buffer at a time. A cancel still
                        // stops it between two lines.
                        let mut next = Some(first);
                        while let Some(line) = next.take() {
                        'line: {
                        last_output = tokio::time::Instant::now();
                        if line.cut && !told_cut {
                            told_cut = true;
                            tracing::warn!(session = %self.record.id, "a line of the CLI's output was longer than {LINE_LIMIT} bytes; cut");
                            if let Err(error) = emit.send(note(&format!(
                                "_A line of {}'s output was longer than {} MiB; it was cut there._",
                                self.agent.display_name(),
                                LINE_LIMIT / (1024 * 1024)
                            ))).await {
                                failed = Some(error);
                                break 'read;
                            }
                        }
                        let text = line_text(line.bytes);
                        if text.trim().is_empty() {
                            break 'line;
                        }
                        let mut tool_ended = false;
                        for output in translator.line(&text) {
                            tool_ended |= ends_a_tool(&output);
                            if let Err(error) = self.handle(output, emit, &mut state).await {
                                failed = Some(error);
                                break 'read;
                            }
                        }
                        if failed.is_none()
                            && tool_ended
                            && let Some(review) = &review
                            && let Err(error) = review.step(emit).await
                        {
                            failed = Some(error);
                        }
                        if failed.is_none()
                            && tool_ended
                            && let Err(error) = super::protected::sweep(sandbox, emit).await
                        {
                            failed = Some(error);
                        }
                        if failed.is_some() {
                            break 'read;
                        }
                        if state.abort.is_some() {
                            stop = Stop::Aborted;
                            break 'read;
                        }
                        }
                        if !self.cancel.is_cancelled() {
                            next = reader.buffered_line();
                        }
                        }
                    }
                    Err(e) => { tracing::warn!(session = %self.record.id, "reading the CLI's output failed: {e}"); break; }
                },
            }
        }
        if stop != Stop::Eof || failed.is_some() {
            process.handle.kill().await;
        }
        if stop == Stop::Cancelled && failed.is_none() {
            // What the CLI printed before it was stopped (its conversation id above all) may still be in the pipe:
            // a cancel that won the race against it must not lose it, or the next prompt would start a new
            // conversation. The CLI is dead, so the pipe ends at once; the bound covers a descendant holding it.
            let drain = async {
                while let Ok(Some(line)) = reader.next_line().await {
                    let text = String::from_utf8_lossy(&line.bytes).trim_end_matches(['\n', '\r']).to_string();
                    if text.trim().is_empty() {
                        continue;
                    }
                    for output in translator.line(&text) {
                        if self.handle(output, emit, &mut state).await.is_err() {
                            return;
                        }
                    }
                }
            };
            let _ = tokio::time::timeout(CANCEL_DRAIN, drain).await;
        }
        // What the CLI says next could not be kept (the store cannot write): it is stopped, and the turn fails.
        if let Some(error) = failed {
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, process.handle.wait()).await;
            stderr_task.abort();
            return Err(error);
        }
        let exit = match exited {
            Some(exit) => exit,
            // The CLI closed its stdout but may still run: it gets the same bounds as while it printed.
            None => loop {
                tokio::select! {
                    biased;
                    _ = self.cancel.cancelled(), if stop == Stop::Eof => { stop = Stop::Cancelled; process.handle.kill().await; }
                    _ = tokio::time::sleep(idle), if stop == Stop::Eof => { stop = Stop::Stalled; process.handle.kill().await; }
                    exit = process.handle.wait() => break exit?,
                }
            },
        };
        // Every process of the turn is gone by now, so stderr ends; the bound covers what is not ours to kill.
        let stderr = match tokio::time::timeout(DRAIN_AFTER_EXIT, &mut stderr_task).await {
            Ok(tail) => tail.unwrap_or_default(),
            Err(_) => {
                stderr_task.abort();
                String::new()
            }
        };
        let limit_hit = process.handle.limit_hit();
        let stream_end = if stop == Stop::Cancelled { StreamEnd::Cancelled } else { StreamEnd::Stopped };
        for output in translator.finish(stream_end) {
            self.handle(output, emit, &mut state).await?;
        }
        // What the agent changed last (or before it was stopped) is reviewed with the turn. A cancelled turn in a
        // remote sandbox is answered first: its listing and pull (seconds there) are the next turn's `begin`,
        // which runs before that turn's CLI (the session's gate orders turns).
        let remote_cancel = stop == Stop::Cancelled && sandbox.remote_files().is_some();
        if let Some(review) = &review
            && !remote_cancel
        {
            review.step(emit).await?;
        }
        super::protected::sweep(sandbox, emit).await?;
        let name = self.agent.display_name();
        tracing::debug!(session = %self.record.id, exit = %exit.describe(), "the CLI exited");
        let failure = |message: String| Error::CliFailed { message, stderr_tail: stderr.clone(), exit_code: exit.code };
        let result = match stop {
            Stop::Cancelled => Ok(StopReason::Cancelled),
            Stop::Stalled => Err(Error::Stalled { agent: name, seconds: idle.as_secs() }),
            Stop::TimedOut => Err(Error::TurnTimeout {
                agent: name,
                minutes: self.bridge.config().turn_timeout.as_secs().div_ceil(60),
            }),
            Stop::Limit(hit) => Err(failure(format!("{name} was stopped: {hit}"))),
            Stop::Eof if limit_hit.is_some() && !exit.success() => {
                Err(failure(format!("{name} failed ({}): {}", exit.describe(), limit_hit.unwrap_or_default())))
            }
            Stop::Aborted => Err(failure(state.abort.take().unwrap_or_default())),
            Stop::Eof => {
                if native_id.is_some() && !exit.success() && !state.updates && self.agent.session_missing(&stderr) {
                    return Ok(Attempt::ConversationMissing);
                }
                match state.end.take() {
                    Some(TurnEnd::EndTurn) if exit.success() => Ok(StopReason::EndTurn),
                    Some(TurnEnd::EndTurn) => {
                        Err(failure(format!("{name} finished its answer but then exited with {}", exit.describe())))
                    }
                    Some(TurnEnd::MaxTokens) => Ok(StopReason::MaxTokens),
                    Some(TurnEnd::MaxTurnRequests) => Ok(StopReason::MaxTurnRequests),
                    Some(TurnEnd::Refusal) => Ok(StopReason::Refusal),
                    Some(TurnEnd::Cancelled) => Ok(StopReason::Cancelled),
                    Some(TurnEnd::AuthRequired { message }) => Err(Error::AuthRejected(message)),
                    Some(TurnEnd::Error { message }) => Err(failure(message)),
                    None if exit.success() => Ok(StopReason::EndTurn),
                    None => Err(failure(crash_message(name, &exit.describe(), &stderr, &state.unparsed))),
                }
            }
        };
        Ok(Attempt::Finished(result))
    }

    /// What the translator of this turn is told: the workspaces, the client's rendering, the model's window.
    pub(super) fn translate_context(&self, sandbox: &dyn Sandbox, emit: &Emitter) -> TranslateContext {
        TranslateContext {
            workspace: PathBuf::from(&self.record.cwd),
            agent_workspace: sandbox.workspace().to_path_buf(),
            terminal_output: self.bridge.terminal_output(),
            context_window: self
                .model
                .as_ref()
                .and_then(|model| model.context)
                .unwrap_or(self.bridge.config().context_window),
            turn_key: format!("{}-", emit.turn_id),
        }
    }

    async fn handle(&self, output: Output, emit: &Emitter, state: &mut StreamState) -> Result<()> {
        match output {
            Output::Update(update) => {
                state.updates = true;
                emit.send(update).await?;
            }
            Output::NativeSessionId { id } => {
                if state.native_id.as_deref() != Some(id.as_str()) {
                    tracing::info!(session = %self.record.id, native = %id, "the CLI conversation id");
                    // Kept even when a cancelled turn stops waiting for the store: the next prompt continues it.
                    let (store, session, native) = (self.bridge.store.clone(), self.record.id.clone(), id.clone());
                    emit.write(async move { store.set_native_id(&session, Some(&native)).await }).await?;
                    state.native_id = Some(id);
                }
            }
            Output::End(end) => state.end = Some(end),
            Output::Abort { message } => {
                tracing::warn!(session = %self.record.id, "stopping the CLI: {message}");
                state.abort.get_or_insert(message);
            }
            // Only the server backend's translator asks or says idle; a CLI run per turn ends with its stdout.
            Output::Permission(_) | Output::Idle => {}
            Output::Unparsed { mut line } => {
                // Kept for the error message and logged: an excerpt of a line that may be megabytes long.
                if let Some((at, _)) = line.char_indices().nth(UNPARSED_EXCERPT) {
                    line.truncate(at);
                    line.push('…');
                }
                tracing::debug!(session = %self.record.id, "unparsed CLI line: {line}");
                if state.unparsed.len() == 10 {
                    state.unparsed.pop_front();
                }
                state.unparsed.push_back(line);
            }
        }
        Ok(())
    }
}

#[derive(Default)]
struct StreamState {
    native_id: Option<String>,
    /// Set when the translator says the CLI is stuck.
    abort: Option<String>,
    end: Option<TurnEnd>,
    updates: bool,
    unparsed: VecDeque<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Stop {
    Eof,
    Cancelled,
    Stalled,
    Aborted,
    TimedOut,
    /// The sandbox hit its process or memory limit (a fork bomb, a runaway build).
    Limit(String),
}

/// How many characters of a line the translator could not read are kept and logged.
const UNPARSED_EXCERPT: usize = 2000;

/// The longest line of a CLI's output that is kept whole; the rest of a longer one is read and dropped.
const LINE_LIMIT: usize = 16 * 1024 * 1024;

/// A line's text without its line ending, lossy where it is not UTF-8 (and not copied where it is).
fn line_text(bytes: Vec<u8>) -> String {
    let mut text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    let end = text.trim_end_matches(['\n', '\r']).len();
    text.truncate(end);
    text
}

/// How long what a cancelled CLI printed before it died is still read.
const CANCEL_DRAIN: std::time::Duration = std::time::Duration::from_millis(300);

/// How long output is still read after the CLI exited.
const DRAIN_AFTER_EXIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How often the sandbox's limits are looked at.
const LIMIT_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_or_never(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Whether an output says a tool finished: what it changed is reviewed then.
pub(super) fn ends_a_tool(output: &Output) -> bool {
    let done =
        |status: Option<ToolCallStatus>| matches!(status, Some(ToolCallStatus::Completed | ToolCallStatus::Failed));
    match output {
        Output::Update(SessionUpdate::ToolCall(call)) => done(Some(call.status)),
        Output::Update(SessionUpdate::ToolCallUpdate(update)) => done(update.fields.status),
        _ => false,
    }
}

fn update(id: &str, fields: ToolCallUpdateFields) -> SessionUpdate {
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.to_string(), fields))
}

/// The message of a CLI that died without saying why in its stream: its own `Error:` line if it printed
/// one, otherwise how it exited.
fn crash_message(name: &str, exit: &str, stderr: &str, unparsed: &VecDeque<String>) -> String {
    // `Error: …`, also behind a prefix such as the sandbox's own `acp-sandbox sandbox-init: Error: …`.
    let said = stderr.lines().rev().map(|line| strip_ansi(line.trim())).find_map(|line| {
        line.find("Error").filter(|&at| at == 0 || line[..at].ends_with(": ")).map(|at| line[at..].to_string())
    });
    match said {
        Some(line) => format!("{name} failed ({exit}): {line}"),
        None if !unparsed.is_empty() => {
            format!(
                "{name} exited with {exit}; its last output was: {}",
                unparsed.back().map(String::as_str).unwrap_or("")
            )
        }
        None => format!("{name} exited with {exit} before finishing the turn"),
    }
}

/// Removes terminal escape sequences (OpenCode colours its errors even when not on a TTY). `anstream`'s stripper,
/// not `strip-ansi-escapes`: that one drops tabs and carriage returns too, which a stack trace's lines begin with.
fn strip_ansi(text: &str) -> String {
    anstream::adapter::strip_str(text).to_string()
}

/// Reads a stream to its end, keeping only its last lines (bounded memory for chatty CLIs).
pub(super) async fn stderr_tail(stream: OutputStream) -> String {
    let mut lines: VecDeque<String> = VecDeque::new();
    let mut reader = BoundedLines::new(stream, STDERR_LINE_LIMIT);
    while let Ok(Some(line)) = reader.next_line().await {
        let text = strip_ansi(String::from_utf8_lossy(&line.bytes).trim_end());
        tracing::debug!(target: "acp_sandbox::cli_stderr", "{text}");
        lines.push_back(text.chars().take(2000).collect());
        if lines.len() > STDERR_TAIL_LINES {
            lines.pop_front();
        }
    }
    Vec::from(lines).join("\n")
}

/// The wire name of a stop reason, for the store and logs.
pub fn stop_reason_name(stop: StopReason) -> &'static str {
    match stop {
        StopReason::EndTurn => "end_turn",
        StopReason::MaxTokens => "max_tokens",
        StopReason::MaxTurnRequests => "max_turn_requests",
        StopReason::Refusal => "refusal",
        StopReason::Cancelled => "cancelled",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_is_cut_to_the_limit_at_a_character_boundary_with_the_note_and_never_cut_twice() {
        // Three-byte characters, so that the limit falls inside one.
        let text = "€".repeat(UPDATE_TEXT_LIMIT);
        let mut update = serde_json::json!({
            "sessionUpdate": "tool_call_update",
            "toolCallId": "call_1",
            "title": "x".repeat(100),
            "content": [{"type": "content", "content": {"type": "text", "text": text}}],
            "rawOutput": {"output": "z".repeat(SHORT_TEXT + 1)},
        });
        assert!(bound_update(&mut update));
        let cut = update["content"][0]["content"]["text"].as_str().unwrap();
        let kept = cut.find("\n\n[acp-sandbox").unwrap();
        assert_eq!(cut.len(), kept + cut_note(text.len() - kept).len());
        assert!(cut.len() <= UPDATE_TEXT_LIMIT && kept.is_multiple_of(3), "cut inside a character or past the limit");
        assert_eq!(&cut[kept..], cut_note(text.len() - kept));
        // The budget is spent: the long output after it keeps nothing but its note; short strings are kept.
        assert_eq!(update["rawOutput"]["output"], cut_note(SHORT_TEXT + 1).as_str());
        assert_eq!(update["title"], "x".repeat(100).as_str());
        let once = update.clone();
        assert!(!bound_update(&mut update) || update == once, "an update cut once was cut again");
        assert_eq!(update, once);
        let mut small =
            serde_json::json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}});
        assert!(!bound_update(&mut small));
    }

    /// A cancelled turn's emitter on a fresh store, and what it sent.
    async fn cancelled_emitter(
        dir: &std::path::Path,
        busy_timeout: std::time::Duration,
    ) -> (Emitter, Arc<std::sync::Mutex<Vec<String>>>) {
        let store = Arc::new(Store::open_with(&dir.join("db.sqlite3"), busy_timeout).unwrap());
        let record = SessionRecord {
            id: "s".into(),
            agent: "opencode".into(),
            cwd: "/w".into(),
            sandbox_provider: "local".into(),
            sandbox_id: None,
            native_id: None,
            title: None,
            config: serde_json::json!({}),
            created_at: 1,
            updated_at: 1,
        };
        store.create_session(&record).await.unwrap();
        let turn_id = store.start_turn("s", &serde_json::json!([])).await.unwrap();
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = sent.clone();
        let cancel = CancellationToken::new();
        cancel.cancel();
        let emitter = Emitter {
            store,
            outbox: Outbox::new(move |run| seen.lock().unwrap().extend(run)),
            session_id: "s".into(),
            turn_id,
            prior_cost: 0.0,
            turn_cost: std::sync::Mutex::new(0.0),
            cancel,
            deadline: std::sync::OnceLock::new(),
            given_up: std::sync::atomic::AtomicBool::new(false),
        };
        (emitter, sent)
    }

    fn chunk(text: &str) -> SessionUpdate {
        SessionUpdate::AgentMessageChunk(agent_client_protocol::v1::schema::ContentChunk::new(ContentBlock::from(
            text.to_string(),
        )))
    }

    /// What made the grace misfire under load: a store that is only slow (its writer busy for longer than the grace,
    /// as on a loaded machine with a backlog) is waited for, and the cancelled turn's last update is sent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_turn_waits_for_a_slow_store_and_sends_its_last_update() {
        let dir = tempfile::tempdir().unwrap();
        let (emitter, sent) = cancelled_emitter(dir.path(), std::time::Duration::from_secs(600)).await;
        let store = emitter.store.clone();
        let busy = tokio::spawn(async move { store.occupy_writer(CANCEL_STORE_GRACE * 3).await });
        // The writer takes the slow job first.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        emitter.send(chunk("the last words")).await.unwrap();
        emitter.flush().await.unwrap();
        busy.await.unwrap().unwrap();
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 1, "the last update was not sent: {sent:?}");
        assert_eq!(sent[0], serde_json::to_string(&chunk("the last words")).unwrap(), "sent as it was serialized");
        assert!(!emitter.given_up.load(std::sync::atomic::Ordering::Relaxed), "gave up on a store that was not stuck");
    }

    /// Each update is serialized once: the editor gets the very bytes the store kept, also for an update whose text
    /// was cut and for a new file's diff (which says `"oldText": null`, as `tools::update_json` writes it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_is_sent_is_what_was_stored_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let (emitter, sent) = cancelled_emitter(dir.path(), std::time::Duration::from_secs(600)).await;
        let new_file =
            SessionUpdate::ToolCall(ToolCall::new("call_1", "write").content(vec![ToolCallContent::Diff(
                agent_client_protocol::v1::schema::Diff::new("/w/new.txt", "text"),
            )]));
        emitter.send(chunk("plain")).await.unwrap();
        emitter.send(chunk(&"x".repeat(UPDATE_TEXT_LIMIT + 10))).await.unwrap();
        emitter.send(new_file).await.unwrap();
        emitter.flush().await.unwrap();
        let sent = sent.lock().unwrap().clone();
        let stored: Vec<String> = rusqlite::Connection::open(dir.path().join("db.sqlite3"))
            .unwrap()
            .prepare("SELECT payload FROM events ORDER BY id")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(sent, stored);
        assert_eq!(sent[0], serde_json::to_string(&chunk("plain")).unwrap());
        assert!(sent[1].len() <= UPDATE_TEXT_LIMIT + 100 && sent[1].contains("acp-sandbox cut this text"), "cut");
        let diff: serde_json::Value = serde_json::from_str(&sent[2]).unwrap();
        assert_eq!(diff["content"][0].get("oldText"), Some(&serde_json::Value::Null), "{diff}");
    }

    /// A store whose writer waits for another program's lock is given up on (within the test's deadline, long before
    /// the busy timeout): the cancelled turn is answered, its update is not sent, and it is stored once the lock goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_turn_gives_up_on_a_store_that_waits_for_another_programs_lock() {
        let dir = tempfile::tempdir().unwrap();
        let (emitter, sent) = cancelled_emitter(dir.path(), std::time::Duration::from_secs(600)).await;
        let other = rusqlite::Connection::open(dir.path().join("db.sqlite3")).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let answered = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            emitter.send(chunk("held up")).await.unwrap();
            emitter.flush().await.unwrap();
        })
        .await;
        assert!(answered.is_ok(), "the cancelled turn waited for the lock");
        assert!(emitter.given_up.load(std::sync::atomic::Ordering::Relaxed));
        assert!(sent.lock().unwrap().is_empty(), "an update was sent before it was stored");
        assert!(emitter.store.waiting_for_a_lock().is_some(), "the writer still waits for the lock");
        other.execute_batch("COMMIT").unwrap();
        let stored = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            loop {
                let history = emitter.store.history("s", 100).await.unwrap();
                if !history.turns[0].1.is_empty() {
                    return history.turns[0].1.clone();
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the update is stored once the lock is released");
        assert_eq!(stored, [serde_json::to_value(chunk("held up")).unwrap()]);
        assert_eq!(emitter.store.waiting_for_a_lock(), None);
    }

    #[test]
    fn crash_message_prefers_the_clis_own_error_line() {
        let stderr = "booting\n\u{1b}[91mError: Session not found\u{1b}[0m\n";
        assert_eq!(
            crash_message("OpenCode", "exit code 1", stderr, &VecDeque::new()),
            "OpenCode failed (exit code 1): Error: Session not found"
        );
        assert_eq!(
            crash_message("Amp", "signal 9", "", &VecDeque::new()),
            "Amp exited with signal 9 before finishing the turn"
        );
    }

    #[test]
    fn a_lines_text_is_lossy_and_without_its_ending() {
        assert_eq!(line_text(b"a\xffb\r\n".to_vec()), "a\u{fffd}b");
    }

    #[test]
    fn escape_sequences_go_and_whitespace_stays() {
        assert_eq!(strip_ansi("\u{1b}[91mError:\u{1b}[0m gone"), "Error: gone");
        assert_eq!(strip_ansi("\u{1b}[1;38;5;208mat\u{1b}[m\tf (a.js:1)\r"), "at\tf (a.js:1)\r");
        assert_eq!(strip_ansi("\u{1b}]0;title\u{7}text \u{2713}"), "text \u{2713}", "a title is no text");
    }

    #[tokio::test]
    async fn stderr_tail_keeps_the_last_lines() {
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let tail = stderr_tail(Box::pin(std::io::Cursor::new(text.into_bytes()))).await;
        assert!(tail.starts_with("line 60\n"));
        assert!(tail.ends_with("line 99"));
        // A line of any length costs at most the limit: its start is kept, its rest dropped as it arrives.
        let long = [&[b'x'; 100_000][..], b"\n\x1b[31mlast"].concat();
        let tail = stderr_tail(Box::pin(std::io::Cursor::new(long))).await;
        assert_eq!(tail, format!("{}\nlast", "x".repeat(2000)));
    }
}
