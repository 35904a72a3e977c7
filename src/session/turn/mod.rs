//! One prompt turn: store it, prepare the sandbox and the CLI, run an attempt through an engine (`engine.rs`: the
//! one loop; `process.rs`: a CLI per prompt; an agent's own, e.g. OpenCode's warm server, through its service and `session/host.rs`), retry with a fresh conversation when
//! the old one is gone, and record how it ended.

use std::path::PathBuf;
use std::sync::Arc;

use agent_client_protocol::v1::schema::{
    ContentBlock, SessionInfoUpdate, SessionUpdate, StopReason, ToolCall, ToolCallContent, ToolCallStatus,
    ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use tokio_util::sync::CancellationToken;

mod drive;
mod host;
mod process;
mod setup;

use super::cli::cli_environment;
use super::emitter::Emitter;
pub(super) use super::emitter::bound_update;

use super::{Bridge, UpdateSink, note, prompt};
use crate::agents::engine::Attempt;
use crate::agents::{AgentKind, Extras, ModelInfo, TranslateContext, TurnRequest};
use crate::error::{Error, Result};
use crate::sandbox::{ExecSpec, Sandbox};
use crate::store::{SessionRecord, TurnStatus};

/// At most this many characters of earlier turns are handed to a fresh CLI conversation.
const TRANSCRIPT_LIMIT: usize = 24_000;

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

/// Whether the disk holding `dir` has (next to) no room left for an unprivileged writer.
fn disk_full(dir: &std::path::Path) -> bool {
    const ROOM: u64 = 1024 * 1024;
    nix::sys::statvfs::statvfs(dir)
        .is_ok_and(|stat| stat.blocks_available().saturating_mul(stat.fragment_size()) < ROOM)
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
        let emitter = Arc::new(Emitter::new(
            store.clone(),
            self.sink.clone(),
            &self.record.id,
            turn_id,
            prior_cost,
            self.cancel.clone(),
        ));
        let session_id = self.record.id.clone();
        // Under `--network ask`, the sandbox's connections are asked about in this turn while it runs.
        let asking = self
            .bridge
            .config()
            .network
            .asks()
            .then(|| self.bridge.network_asks.enter(&session_id, emitter.clone(), self.sink.clone(), &self.cancel));
        let result = self.run_turn(&emitter, asking.as_ref()).await.map_err(|error| self.explain(error));
        // Its open questions are withdrawn and their cards closed before the turn's last updates.
        if let Some(asking) = asking {
            asking.close().await;
        }
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

    async fn run_turn(&self, emit: &Emitter, asking: Option<&super::asks::Entered>) -> Result<StopReason> {
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
        // Never unsandboxed by surprise: without any sandbox here (and none chosen), the prompt fails saying why.
        if let Some(why) = self.bridge.provider.refusal() {
            return Err(crate::sandbox::SandboxError::Unavailable(format!(
                "no sandbox can run {} here, so this prompt was not run: {why}",
                self.agent.display_name()
            ))
            .into());
        }
        // The user must know when the agent has their whole machine: said once, in the session's first turn (or
        // the first in a sandbox of its own, a fork's). Not by whether its sandbox exists yet: an agent started
        // ahead of the first prompt (at the session's opening) made it already.
        let first = self.record.sandbox_id.is_none() || self.first_turn().await?;
        if first && let Some(why) = self.bridge.provider.unconfined() {
            emit.send(note(&format!(
                "_{} runs WITHOUT a sandbox here ({why}): it can read and write everything you can._",
                self.agent.display_name()
            )))
            .await?;
        }
        // And when its sandbox is the weaker one: what it does not hold.
        if first && let Some(gaps) = self.bridge.provider.weaker() {
            emit.send(note(&format!(
                "_{} runs in the Landlock sandbox here, not bubblewrap: {gaps}._",
                self.agent.display_name()
            )))
            .await?;
        }
        // A model known not to take images gets none (OpenCode would fail the whole turn on them).
        let images = self.agent.accepts_images() && self.model.as_ref().is_none_or(|model| model.image);
        let mut rendered = prompt::render_taking(&self.blocks, images, self.agent.accepts_audio());
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
        if let (Some(asking), Some(name)) = (asking, sandbox.state_dir().file_name().and_then(|name| name.to_str())) {
            asking.place(name);
        }
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
        // A fork whose agent cannot fork the conversation where the fork runs (its own sandbox, or an agent whose
        // conversations are not in the sandbox) starts one from the transcript of the turns it copied, once: its
        // first turn gives it a conversation of its own.
        let service = self.bridge.service.as_ref().filter(|_| self.bridge.serves(&self.record));
        if native_id.is_none()
            && let Some(forked) = &self.record.context.forked_from
            && (forked.native.is_none() || service.is_some_and(|service| !service.forks_in_place()))
        {
            let history = self.bridge.store.history(&self.record.id, self.bridge.config().replay_limit).await?;
            let earlier: Vec<_> = history.turns.into_iter().filter(|(turn, _)| turn.id != emit.turn_id).collect();
            let transcript = prompt::transcript(&earlier, TRANSCRIPT_LIMIT);
            if !transcript.is_empty() {
                rendered.text = format!("{transcript}\n\n{}", rendered.text);
                emit.send(note(&format!(
                    "_This fork's {} conversation starts from a transcript of the earlier turns (tool details are \
                     not in it)._",
                    self.agent.display_name()
                )))
                .await?;
            }
        }
        // A session whose server could not start runs `run` for the rest of this bridge's life: every prompt
        // would otherwise wait for another failing start.
        // Under `ask` there is no falling back: `run` cannot ask.
        let mut serve = service.is_some_and(|service| {
            crate::agents::options::approvals(&self.record.config) == crate::agents::options::APPROVALS_ASK
                || !service.fell_back(&self.record.id)
        });
        loop {
            if self.cancel.is_cancelled() {
                return Ok(StopReason::Cancelled);
            }
            let attempt = if let Some(service) = service.filter(|_| serve) {
                let host = host::AttemptHost {
                    turn: self,
                    emit,
                    sandbox: sandbox.as_ref(),
                    review: self.review(sandbox.as_ref()),
                };
                match service
                    .attempt(&host, &sandbox, &executable, native_id.as_deref(), command.as_deref(), &rendered)
                    .await?
                {
                    Attempt::Unavailable(why) => {
                        let why = crate::lines::first_text_line(&why);
                        if crate::agents::options::approvals(&self.record.config)
                            == crate::agents::options::APPROVALS_ASK
                        {
                            // The CLI per prompt cannot ask: it would run every tool the user wanted to be asked
                            // about.
                            return Err(Error::CliFailed {
                                message: service.cannot_ask_without_it(why),
                                stderr_tail: String::new(),
                                exit_code: None,
                            });
                        }
                        serve = false;
                        tracing::warn!(session = %self.record.id, "running the CLI per prompt instead of the server: {why}");
                        if service.fall_back(&self.record.id) {
                            emit.send(note(&format!("_{}_", service.fallen_back(why)))).await?;
                        }
                        continue;
                    }
                    attempt => attempt,
                }
            } else {
                self.attempt(emit, sandbox.as_ref(), &executable, native_id.as_deref(), command.as_deref(), &rendered)
                    .await?
            };
            match attempt {
                Attempt::Finished(result) => return result,
                // Only a server can be unavailable, and the server's is taken above.
                Attempt::Unavailable(why) => return Err(Error::CliUnavailable(why)),
                missing @ (Attempt::ConversationMissing | Attempt::ConversationUnloadable(_)) => {
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
                    let name = self.agent.display_name();
                    // Gone only when the agent says so; else what it said, which may be passing.
                    let what = match missing {
                        Attempt::ConversationUnloadable(why) => {
                            format!("could not be continued ({name} said: {})", why.trim_end_matches('.'))
                        }
                        _ => "no longer exists in the sandbox".to_string(),
                    };
                    emit.send(note(&format!("_The earlier {name} conversation ({old}) {what}, {told}._"))).await?;
                }
            }
        }
    }

    /// Whether this is the session's first turn: the store holds no turn of it before this one.
    async fn first_turn(&self) -> Result<bool> {
        // A plan within no updates reads every turn's row but the updates of the newest only (this one).
        let plan = self.bridge.store.replay_plan(&self.record.id, 0).await?;
        Ok(plan.omitted_turns == 0 && plan.turns.len() <= 1)
    }

    /// Runs a step before the CLI starts: `None` when the turn is cancelled first (the step is dropped, which
    /// stops what it started) or the step says it was.
    pub(super) async fn unless_cancelled<T>(&self, step: impl Future<Output = Result<T>>) -> Result<Option<T>> {
        crate::agents::host::unless_cancelled(&self.cancel, step).await
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
        let mcp_servers =
            if self.agent.takes_mcp_servers() { self.bridge.mcp_servers(&self.record.id) } else { Vec::new() };
        let extras = Extras {
            system_prompt: self.record.context.system_prompt.as_deref(),
            mcp_servers: &mcp_servers,
            roots: &self.record.context.additional_directories,
        };
        for (path, bytes) in self.agent.turn_files(&extras) {
            sandbox.write_state_file(&sandbox.state_dir().join(path), &bytes).await?;
        }
        let fork_of = self.record.context.forked_from.as_ref().and_then(|forked| forked.native.as_deref());
        let request = TurnRequest { native_id, fork_of, options: config, files: &files, command, extras };
        let mut env = cli_environment(
            self.agent,
            sandbox.state_dir(),
            self.credential.as_ref(),
            &self.bridge.env_names(self.agent, self.model.as_ref().map(|m| m.id.as_str())),
        );
        self.agent.turn_env(config, &extras, sandbox.state_dir(), &mut env);
        let mut spec = ExecSpec {
            stdin: rendered.text.clone().into_bytes(),
            ..super::cli_spec(self.bridge.config(), self.agent, executable, sandbox, env, self.agent.args(&request))
        };
        spec.net.endpoints.extend(crate::agents::mcp::endpoints(&mcp_servers));
        tracing::info!(
            session = %self.record.id,
            program = %spec.program.display(),
            args = ?crate::agents::mcp::loggable(&spec.args),
            env = ?spec.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            "running the CLI"
        );
        let process = sandbox.exec(spec).await?;
        let engine = process::ProcessEngine::new(
            self.agent,
            &self.record.id,
            process,
            native_id.is_some(),
            self.bridge.config(),
        );
        let translator = self.agent.translator(self.translate_context(sandbox, emit));
        self.drive(Box::new(engine), translator, emit, sandbox, review.as_ref(), native_id).await
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
}

fn update(id: &str, fields: ToolCallUpdateFields) -> SessionUpdate {
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.to_string(), fields))
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
mod tests;
