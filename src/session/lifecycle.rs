//! The sessions of a bridge from the editor's side: new, load with replay, resume, list, close, delete, cancel,
//! options, and a prompt up to its turn; each session's sandbox.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use agent_client_protocol::v1::schema::{
    AvailableCommand, AvailableCommandInput, AvailableCommandsUpdate, ContentBlock, ContentChunk, SessionConfigOption,
    SessionInfoUpdate, SessionUpdate, StopReason, UnstructuredCommandInput,
};
use serde_json::json;

use crate::agents::AgentKind;
use crate::error::{Error, Result};
use crate::paths;
use crate::store::lock as turn_lock;
use crate::store::{SessionContext, SessionRecord, TurnStatus, now_ms, rfc3339};

use super::servers::is_shared_sandbox;
use super::{
    Bridge, Given, LIST_PAGE, PromptTicket, RunningGuard, SessionPage, SessionSummary, UpdateSink, given, normalize,
    note, options, parse_cursor, turn,
};

impl Bridge {
    /// Creates a session. The sandbox is prepared on the first prompt, so this answers at once.
    pub async fn new_session(&self, cwd: &Path, given: &Given) -> Result<(String, Vec<SessionConfigOption>)> {
        self.check_workspace(cwd)?;
        let roots = self.check_roots(cwd, given)?;
        let context = given::context_after(self.config.agent, &SessionContext::default(), given, roots)?;
        let now = now_ms();
        let mut config = json!({});
        if let Some(model) = &self.config.model {
            config[self.config.agent.default_option()] = json!(model);
        }
        if let Some(service) = self.service.as_ref()
            && let Some(executable) = crate::locate::installed_executable(&self.config, self.config.agent)
            && let Some(seeded) = service.seeded_config(self, self.config.agent.as_str(), &executable).await
            && let (Some(config), Some(seeded)) = (config.as_object_mut(), seeded.as_object())
        {
            config.extend(seeded.clone());
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
            context,
            created_at: now,
            updated_at: now,
        };
        self.store.create_session(&record).await?;
        tracing::info!(session = %record.id, cwd = %record.cwd, agent = %record.agent, "new session");
        // Open from now on: a changed model list is announced to it.
        self.take_mcp_servers(&record.id, given);
        let options = self.config_options_of(&record);
        Ok((record.id, options))
    }

    /// Refuses a workspace that would hand the agent the whole filesystem, the home or the bridge's own data.
    pub(super) fn check_workspace(&self, cwd: &Path) -> Result<()> {
        if !cwd.is_absolute() {
            return Err(Error::InvalidParams(format!("cwd must be an absolute path, got {}", cwd.display())));
        }
        match crate::sandbox::local::policy::workspace_refusal(cwd, &paths::home(), &self.config.data_dir) {
            Some(why) => Err(Error::InvalidParams(why)),
            None => Ok(()),
        }
    }

    /// Whether a session may have more roots than its workspace: only in a local sandbox where the agent writes
    /// the user's files (a remote sandbox holds one uploaded workspace; a review copy covers the workspace alone).
    pub fn takes_roots(&self) -> bool {
        self.provider.runs_here() && self.config.workspace == crate::sandbox::WorkspaceMode::Direct
    }

    /// The roots `given` names beside `cwd`, checked as the workspace is ([`given::check_roots`]); refused where
    /// the session could not have them ([`Bridge::takes_roots`]).
    pub(super) fn check_roots(&self, cwd: &Path, given: &Given) -> Result<Vec<String>> {
        if given.additional_directories.is_empty() {
            return Ok(Vec::new());
        }
        if !self.provider.runs_here() {
            return Err(Error::InvalidParams(format!(
                "additionalDirectories: a remote sandbox ({}) takes one root, the workspace",
                self.provider.name()
            )));
        }
        if !self.takes_roots() {
            return Err(Error::InvalidParams(
                "additionalDirectories: review mode (--workspace review) takes one root, the workspace".into(),
            ));
        }
        let (home, data_dir) = (paths::home(), &self.config.data_dir);
        given::check_roots(cwd, &given.additional_directories, |root| {
            crate::sandbox::local::policy::workspace_refusal(root, &home, data_dir)
        })
    }

    /// The roots of a session its sandbox mounts now: the stored ones that are still directories a workspace could
    /// be (the data dir may be another one since, a root may be gone), each one left out said in the log.
    pub(super) fn live_roots(&self, context: &SessionContext) -> Vec<PathBuf> {
        let home = paths::home();
        context
            .additional_directories
            .iter()
            .map(PathBuf::from)
            .filter(|root| {
                let why = crate::sandbox::local::policy::workspace_refusal(root, &home, &self.config.data_dir)
                    .or_else(|| (!root.is_dir()).then(|| "it is no longer a directory".to_string()));
                if let Some(why) = &why {
                    tracing::warn!(root = %root.display(), "a root of the session is left out: {why}");
                }
                why.is_none()
            })
            .collect()
    }

    /// What the editor gave a stored session on load or resume: kept when it changed (the agent is configured
    /// with the new set from the next turn or server start on), and its MCP servers held for this process.
    async fn take_given(&self, record: &SessionRecord, given: &Given) -> Result<()> {
        let roots = self.check_roots(Path::new(&record.cwd), given)?;
        let context = given::context_after(self.agent_of(record), &record.context, given, roots)?;
        if context != record.context {
            tracing::info!(session = %record.id, "what the editor gives the session changed");
            self.store.set_context(&record.id, &context).await?;
        }
        self.take_mcp_servers(&record.id, given);
        Ok(())
    }

    /// Opens the session in this process with the editor's MCP servers.
    pub(super) fn take_mcp_servers(&self, id: &str, given: &Given) {
        let live = self.live(id);
        *live.mcp_servers.lock().unwrap_or_else(|p| p.into_inner()) = given.mcp_servers.clone();
    }

    pub(super) fn agent_of(&self, record: &SessionRecord) -> AgentKind {
        AgentKind::parse(&record.agent).unwrap_or(self.config.agent)
    }

    /// Replays the whole conversation through `sink`, then returns its config options. The next prompt
    /// continues the same CLI conversation.
    pub async fn load_session(
        &self,
        id: &str,
        given: &Given,
        sink: &dyn UpdateSink,
    ) -> Result<Vec<SessionConfigOption>> {
        let record = self.record(id).await?;
        self.check_workspace(Path::new(&record.cwd))?;
        self.take_given(&record, given).await?;
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
        Ok(self.config_options_of(&record))
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
    pub async fn resume_session(&self, id: &str, given: &Given) -> Result<Vec<SessionConfigOption>> {
        let record = self.record(id).await?;
        self.check_workspace(Path::new(&record.cwd))?;
        self.take_given(&record, given).await?;
        self.store.mark_orphaned_turns(id).await?;
        Ok(self.config_options_of(&record))
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
                    additional_directories: r.context.additional_directories.clone(),
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
    pub(super) fn forget_if_idle(&self, id: &str) {
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
        let held = self.service.as_ref().map(|service| service.held(id));
        self.close_session(id)?;
        // Its server holds the sandbox's files open: gone first (unless other sessions use it).
        if let Some(service) = &self.service {
            service.release(id).await;
        }
        let Some(record) = self.store.session(id).await? else {
            return Ok(());
        };
        self.orphan_forks(&record).await?;
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
                if let Some(held) = held {
                    held.forget(&record).await;
                }
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

    /// The forks of `original` that would still fork its agent conversation (none of their own yet): it goes with
    /// `original`, so they start from the transcript of their copied turns instead.
    async fn orphan_forks(&self, original: &SessionRecord) -> Result<()> {
        let Some(native) = &original.native_id else { return Ok(()) };
        for mut fork in self.store.list_sessions(None, None, None, usize::MAX).await? {
            let waiting = fork.native_id.is_none();
            let Some(forked) = fork.context.forked_from.as_mut() else { continue };
            if !waiting || forked.session != original.id || forked.native.as_ref() != Some(native) {
                continue;
            }
            forked.native = None;
            tracing::info!(session = %fork.id, original = %original.id, "a fork will start from the transcript");
            self.store.set_context(&fork.id, &fork.context).await?;
        }
        Ok(())
    }

    /// The stored sessions whose sandbox is `sandbox_id`.
    pub(super) async fn sandbox_users(&self, sandbox_id: &str) -> Result<Vec<String>> {
        let sessions = self.store.list_sessions(None, None, None, usize::MAX).await?;
        Ok(sessions
            .into_iter()
            .filter(|r| r.sandbox_id.as_deref() == Some(sandbox_id) && r.sandbox_provider == self.provider.name())
            .map(|r| r.id)
            .collect())
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
        if let Some(options) = self.announced_options_of(&record) {
            return Ok(options::modes_of(&options));
        }
        Ok(options::session_modes(self.agent_of(&record), &record.config, &self.config, &self.catalog.models()))
    }

    pub async fn set_config_option(&self, id: &str, option: &str, value: &str) -> Result<Vec<SessionConfigOption>> {
        let record = self.record(id).await?;
        let agent = self.agent_of(&record);
        if let Some(service) = self.service.as_ref().filter(|_| self.serves(&record))
            && let Some(set) = service.set_option(self, &record, option, value).await
        {
            return set;
        }
        let models = self.catalog.models();
        let config = options::apply(agent, &record.config, option, value, &self.config, &models)?;
        self.store.set_config(id, &config).await?;
        Ok(options::config_options(agent, &config, &self.config, &models))
    }

    /// The session's options: what its agent's service announced (an ACP agent's own), else the agent's.
    pub(super) fn config_options_of(&self, record: &SessionRecord) -> Vec<SessionConfigOption> {
        match self.announced_options_of(record) {
            Some(options) => options,
            None => {
                options::config_options(self.agent_of(record), &record.config, &self.config, &self.catalog.models())
            }
        }
    }

    /// The session's options as its agent's service announced them (an ACP agent's own), if it does.
    fn announced_options_of(&self, record: &SessionRecord) -> Option<Vec<SessionConfigOption>> {
        let service = self.service.as_ref().filter(|_| self.serves(record))?;
        service.announced_options(&record.config)
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

    /// The session's sandbox: reconnected when it exists, created (and persisted) otherwise. A session without a
    /// sandbox gets its workspace's shared one where sessions share ([`Bridge::shared_sandbox_name`]); a session
    /// keeps the sandbox it has (its conversation lives there), shared or its own.
    pub(super) async fn session_sandbox(&self, record: &SessionRecord) -> Result<Arc<dyn crate::sandbox::Sandbox>> {
        // The background start of a server and the first prompt may both get here: one creates, the other connects.
        let gate = self.gate(&record.id);
        let _one = gate.lock().await;
        let provider = self.provider();
        let workspace = PathBuf::from(&record.cwd);
        let current = self.store.session(&record.id).await?;
        let sandbox_id = current.as_ref().and_then(|r| r.sandbox_id.clone());
        let provider_name = current.as_ref().map(|r| r.sandbox_provider.clone()).unwrap_or_default();
        // The roots as the store has them now: a load or resume that named others replaced them before this.
        let roots = self.live_roots(&current.as_ref().unwrap_or(record).context);
        let spec = |name: String| crate::sandbox::SandboxSpec {
            session_id: name,
            workspace: workspace.clone(),
            roots: roots.clone(),
        };
        if let Some(id) = &sandbox_id
            && provider_name == provider.name()
        {
            let name = Path::new(id).file_name().and_then(|n| n.to_str()).filter(|n| is_shared_sandbox(n));
            if let Some(sandbox) = provider.connect(id, &spec(name.unwrap_or(&record.id).to_string())).await? {
                return Ok(sandbox);
            }
            tracing::warn!(session = %record.id, sandbox = %id, "the session's sandbox is gone; creating a new one");
        }
        let spec = match self.shared_sandbox_name(current.as_ref().unwrap_or(record)) {
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
}
