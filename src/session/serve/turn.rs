//! One turn through a warm OpenCode server: the conversation, the approvals rules, the prompt, the event stream
//! through the translator, permissions, cancel and the outcome.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    PermissionOption, PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest, StopReason,
};
use hyper::Method;
use serde_json::{Value, json};

use super::client::{Client, ClientError};
use super::sse::{MAX_EVENT, SseEvent};
use super::{Profile, Servers, Started};
use crate::agents::opencode::options as opencode_options;
use crate::agents::opencode::permissions::{self, Rule};
use crate::agents::opencode::serve::ServeTranslator;
use crate::agents::options;
use crate::agents::{Output, PermissionAsk, StreamEnd, Translator, TurnEnd};
use crate::error::{Error, Result};
use crate::sandbox::Sandbox;
use crate::session::prompt::RenderedPrompt;
use crate::session::turn::{Emitter, Turn, cli_environment, ends_a_tool};

/// Under `ask`, no server starts while plugins or tools that a tool wrote into the agent's own OpenCode
/// configuration are there: they would run inside the server unasked (and could answer its permission requests).
fn refuse_agent_written_config(state: &Path) -> Result<()> {
    let found = crate::agents::opencode::project::agent_written(state);
    if found.is_empty() {
        return Ok(());
    }
    let paths: Vec<String> = found.iter().map(|path| format!("`{}`", path.display())).collect();
    Err(Error::CliUnavailable(format!(
        "With Approvals: Ask, OpenCode is not started: the agent wrote plugins or tools into its own OpenCode \
         configuration, which OpenCode would load without asking: {}. Look at them and delete them (they are the \
         agent's, not yours), or choose Approvals: Auto.",
        paths.join(", ")
    )))
}

/// How a turn through the server ended.
pub enum ServeOutcome {
    /// The turn is over.
    Finished(Result<StopReason>),
    /// The OpenCode session we continue is gone from the server's database.
    ConversationMissing,
    /// No server could be had: the turn runs `opencode run` instead. Why, in words.
    Unavailable(String),
}

/// How long the stream must be quiet after an aborted OpenCode went idle before the turn ends.
const SETTLE: Duration = Duration::from_millis(500);

/// How long OpenCode gets to go idle after an abort before its server is killed: with the kill, the cancel is
/// answered within a second whatever the server does (stopped, not answering `/abort`, never going idle).
const ABORT_GRACE: Duration = Duration::from_millis(600);

/// After a cancel, the turn ends by then at the latest, also when a server that went idle keeps sending.
const CANCEL_LIMIT: Duration = Duration::from_millis(900);

/// How long the `/abort` request itself may take (it runs beside the turn, which never waits for it).
const ABORT_CALL: Duration = Duration::from_millis(500);

/// How long any other request to the server may take: a stopped server accepts connections and never answers.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);

/// Asks OpenCode to abort the session's turn, in the background and bounded: the turn's own deadlines (the abort
/// grace, then the kill) never wait on the answer.
fn abort(client: &Client, ses: &str) {
    let (client, path) = (client.clone(), format!("/session/{ses}/abort"));
    tokio::spawn(async move {
        if let Err(e) = client.call_within(ABORT_CALL, Method::POST, &path, None).await {
            tracing::warn!("OpenCode's server did not take the abort: {e}");
        }
    });
}

impl Turn<'_> {
    /// Starts the session's server in its sandbox (the pool calls this when none runs).
    async fn start_server(
        &self,
        key: &str,
        sandbox: Arc<dyn Sandbox>,
        executable: PathBuf,
        profile: &Profile,
    ) -> std::result::Result<Started, super::ServeError> {
        start_server(
            self.bridge,
            &self.record.id,
            key,
            sandbox,
            &executable,
            self.credential.as_ref(),
            self.model.as_ref().map(|m| m.id.as_str()),
            profile,
        )
        .await
    }

    /// What the session's server must be started for. Under `ask`, a workspace with OpenCode configuration of its
    /// own (plugins, custom tools, MCP servers: code the server would load) is asked about once, before anything
    /// of it loads; refused, the server starts without it and the user is told.
    async fn profile(&self, emit: &Emitter) -> Result<Profile> {
        let items = match self.bridge.server_profile(&self.record) {
            Ok(profile) => return Ok(profile),
            Err(items) => items,
        };
        let title = format!(
            "Load this workspace's OpenCode configuration? It runs inside the agent's server: {}",
            items.join("; ")
        );
        let options = vec![
            PermissionOption::new("once", "Load it for this session", PermissionOptionKind::AllowOnce),
            PermissionOption::new("reject", "Start without it", PermissionOptionKind::RejectOnce),
        ];
        let card = agent_client_protocol::v1::schema::ToolCallUpdate::new(
            format!("workspace-config-{}", emit.turn_id),
            agent_client_protocol::v1::schema::ToolCallUpdateFields::new().title(title),
        );
        let request = RequestPermissionRequest::new(self.record.id.clone(), card, options);
        let allowed = matches!(
            self.sink.request_permission(request).await,
            Some(RequestPermissionOutcome::Selected(selected)) if selected.option_id.0.as_ref() == "once"
        );
        tracing::info!(session = %self.record.id, allowed, items = ?items, "the workspace's OpenCode configuration");
        if !allowed {
            emit.send(crate::session::note(&format!(
                "_OpenCode runs without this workspace's own configuration (`.opencode/`, `opencode.json`): {} \
                 {} not loaded, nor its commands and instructions. Approvals: Auto loads it._",
                items.join("; "),
                if items.len() == 1 { "is" } else { "are" }
            )))
            .await?;
        }
        self.bridge.consent_to_project(&self.record.id, items, allowed);
        Ok(Profile { approvals: options::approvals(&self.record.config).to_string(), project_config: allowed })
    }

    /// Under `ask`, a command whose template runs shell commands (`` !`…` ``, run by OpenCode as it expands the
    /// template, before any tool and without asking) runs only once the user allowed those commands; a command the
    /// server does not have is not sent at all. `false`: it must not be sent.
    async fn command_allowed(&self, emit: &Emitter, client: &Client, name: &str, arguments: &str) -> Result<bool> {
        let listed =
            client.call_within(REQUEST_LIMIT, Method::GET, "/command", None).await.map_err(|e| Error::CliFailed {
                message: format!("OpenCode's server did not list its commands: {e}"),
                stderr_tail: String::new(),
                exit_code: None,
            })?;
        let Some(command) = listed.as_array().into_iter().flatten().find(|command| command["name"] == name) else {
            // OpenCode would never answer a command it does not have (one of the workspace's, not loaded).
            emit.send(crate::session::note(&format!(
                "_/{name} is not one of OpenCode's commands here (the workspace's own configuration, where it \
                 comes from, was not loaded), so it was not run._"
            )))
            .await?;
            return Ok(false);
        };
        if options::approvals(&self.record.config) != options::APPROVALS_ASK {
            return Ok(true);
        }
        let template = command["template"].as_str().unwrap_or("");
        let shell: Vec<String> = [template, arguments].iter().flat_map(|text| template_shell(text)).collect();
        if shell.is_empty() {
            return Ok(true);
        }
        let title = format!(
            "/{name} runs shell commands first: {}",
            shell.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")
        );
        let options = vec![
            PermissionOption::new("once", "Allow once", PermissionOptionKind::AllowOnce),
            PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
        ];
        let card = agent_client_protocol::v1::schema::ToolCallUpdate::new(
            format!("command-shell-{}", emit.turn_id),
            agent_client_protocol::v1::schema::ToolCallUpdateFields::new().title(title),
        );
        let request = RequestPermissionRequest::new(self.record.id.clone(), card, options);
        let allowed = matches!(
            self.sink.request_permission(request).await,
            Some(RequestPermissionOutcome::Selected(selected)) if selected.option_id.0.as_ref() == "once"
        );
        if !allowed {
            emit.send(crate::session::note(&format!("_/{name} was not run: its shell commands were rejected._")))
                .await?;
        }
        Ok(allowed)
    }

    pub(in crate::session) async fn serve_attempt(
        &self,
        emit: &Emitter,
        sandbox: &Arc<dyn Sandbox>,
        executable: &Path,
        native_id: Option<&str>,
        command: Option<&str>,
        rendered: &RenderedPrompt,
    ) -> Result<ServeOutcome> {
        let servers: &Servers = &self.bridge.servers;
        if options::approvals(&self.record.config) == options::APPROVALS_ASK {
            refuse_agent_written_config(sandbox.state_dir())?;
        }
        let Some(profile) = self.unless_cancelled(self.profile(emit)).await? else {
            return Ok(ServeOutcome::Finished(Ok(StopReason::Cancelled)));
        };
        let profile_key = profile.key();
        let key = self.bridge.server_key(&self.record.id, sandbox.as_ref(), &profile_key);
        let start = || self.start_server(&key, sandbox.clone(), executable.to_path_buf(), &profile);
        let lease = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Ok(ServeOutcome::Finished(Ok(StopReason::Cancelled))),
            lease = servers.lease(&key, &self.record.id, &profile_key, start) => lease,
        };
        let lease = match lease {
            Ok(lease) => lease,
            Err(e) => return Ok(ServeOutcome::Unavailable(e.to_string())),
        };
        let server = lease.server().clone();
        let client = &server.client;
        self.bridge.learn_models(client.clone());
        super::delete_pending(sandbox.state_dir(), client).await;
        let failed = |e: ClientError| Error::CliFailed {
            message: format!("OpenCode's server failed: {e}"),
            stderr_tail: server.stderr_tail(),
            exit_code: server.exit().and_then(|exit| exit.code),
        };
        let known = |id: &str| server.served.lock().unwrap_or_else(|p| p.into_inner()).contains(id);
        let ses = match native_id {
            // This server already served it: no need to ask again whether it exists.
            Some(id) if known(id) => id.to_string(),
            Some(id) => match client.call_within(REQUEST_LIMIT, Method::GET, &format!("/session/{id}"), None).await {
                Ok(_) => id.to_string(),
                Err(ClientError::Status { status, .. }) if status.as_u16() == 404 || status.as_u16() == 400 => {
                    return Ok(ServeOutcome::ConversationMissing);
                }
                Err(e) => return Err(failed(e)),
            },
            None => conversation(self.bridge, &self.record.id, client).await?.map_err(failed)?,
        };
        let approvals = options::approvals(&self.record.config);
        let agent = session_rules(self.bridge, &self.record, &server, &ses).await?;

        tracing::debug!(session = %self.record.id, "server turn: conversation and rules ready");
        // Review mode: the server works on the copy (bound where the workspace is, so a warm server sees each
        // sync), reviewed before the prompt, after each tool and at the end, as under `run`.
        let review = self.review(sandbox.as_ref());
        if let Some(review) = &review
            && self.unless_cancelled(review.begin(emit)).await?.is_none()
        {
            return Ok(ServeOutcome::Finished(Ok(StopReason::Cancelled)));
        }
        let Some(mut events) = server.listen() else {
            return Err(failed(ClientError::Connect("the event stream ended".into())));
        };
        let mut translator = ServeTranslator::new(self.translate_context(sandbox.as_ref(), emit), ses.clone());

        let mut body = json!({ "parts": parts(rendered, command.is_some()) });
        if let Some((provider, model)) = opencode_options::model(&self.record.config).and_then(|m| m.split_once('/')) {
            body["model"] = json!({ "providerID": provider, "modelID": model });
        }
        if let Some(variant) = opencode_options::variant(&self.record.config) {
            body["variant"] = json!(variant);
        }
        // The agent whose rules the session's were composed with, also when the mode is OpenCode's default.
        body["agent"] = json!(agent);
        if let Some(name) = command {
            match self.unless_cancelled(self.command_allowed(emit, client, name, &rendered.text)).await? {
                None => return Ok(ServeOutcome::Finished(Ok(StopReason::Cancelled))),
                Some(false) => return Ok(ServeOutcome::Finished(Ok(StopReason::EndTurn))),
                Some(true) => {}
            }
        }
        // A command waits for its whole answer, so it runs beside the event loop; a prompt returns at once.
        let mut command_call = match command {
            Some(name) => {
                let mut request = json!({ "command": name, "arguments": rendered.text });
                for key in ["model", "agent", "variant"] {
                    if let Some(value) = body.get(key) {
                        request[key] = match (key, value) {
                            ("model", model) => json!(format!(
                                "{}/{}",
                                model["providerID"].as_str().unwrap_or(""),
                                model["modelID"].as_str().unwrap_or("")
                            )),
                            (_, value) => value.clone(),
                        };
                    }
                }
                let client = client.clone();
                let path = format!("/session/{ses}/command");
                Some(tokio::spawn(async move { client.call(Method::POST, &path, Some(&request)).await }))
            }
            None => {
                tracing::debug!(session = %self.record.id, "server turn: subscribed; prompting");
                client
                    .call_within(REQUEST_LIMIT, Method::POST, &format!("/session/{ses}/prompt_async"), Some(&body))
                    .await
                    .map_err(failed)?;
                tracing::debug!(session = %self.record.id, "server turn: prompted");
                None
            }
        };

        let idle = self.bridge.config().idle_timeout;
        let deadline = tokio::time::Instant::now() + self.bridge.config().turn_timeout;
        let mut last_event = tokio::time::Instant::now();
        let mut limits = tokio::time::interval(Duration::from_secs(1));
        let mut end: Option<TurnEnd> = None;
        let mut stop: Option<Stop> = None;
        let mut abort_deadline: Option<tokio::time::Instant> = None;
        // After a stopped turn went idle: until the stream has been quiet for a moment.
        let mut settle: Option<tokio::time::Instant> = None;
        let mut settle_cap: Option<tokio::time::Instant> = None;
        // Once cancelled: the turn ends by `hard_end` whatever the server does.
        let mut cancelling = false;
        let mut hard_end: Option<tokio::time::Instant> = None;
        let mut pending: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        // The OpenCode sessions of this turn's subagents (a shared server also runs other editor sessions' turns,
        // whose permission requests are theirs to answer).
        let mut children: Vec<String> = Vec::new();
        let name = self.agent.display_name();
        let outcome = loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled(), if !cancelling => {
                    cancelling = true;
                    stop = Some(Stop::Cancelled);
                    for task in pending.drain(..) {
                        task.abort();
                    }
                    let now = tokio::time::Instant::now();
                    hard_end = Some(now + CANCEL_LIMIT);
                    // A stop already under way (a timeout, an abort) keeps its grace, within the cancel's.
                    if abort_deadline.is_none() && settle.is_none() {
                        abort(client, &ses);
                    }
                    abort_deadline = Some(abort_deadline.unwrap_or(now + ABORT_GRACE).min(now + ABORT_GRACE));
                    settle_cap = settle_cap.map(|cap| cap.min(now + CANCEL_LIMIT));
                    settle = settle.map(|at| at.min(now + CANCEL_LIMIT));
                }
                _ = sleep_until_or_never(if settle.is_some() { None } else { abort_deadline }) => break Outcome::KillServer,
                _ = sleep_until_or_never(settle) => break Outcome::Idle,
                _ = tokio::time::sleep_until(deadline), if stop.is_none() => {
                    stop = Some(Stop::TimedOut);
                    abort(client, &ses);
                    abort_deadline = Some(tokio::time::Instant::now() + ABORT_GRACE);
                }
                _ = tokio::time::sleep_until(last_event + idle), if stop.is_none() => {
                    stop = Some(Stop::Stalled);
                    abort(client, &ses);
                    abort_deadline = Some(tokio::time::Instant::now() + ABORT_GRACE);
                }
                _ = limits.tick() => if let Some(hit) = server.limit_hit() {
                    stop = Some(Stop::Limit(hit));
                    break Outcome::KillServer;
                },
                _ = server.exited() => break Outcome::ServerDied,
                // Never pending for good: the branch is off once the call is answered.
                result = async {
                    match command_call.as_mut() {
                        Some(call) => call.await,
                        None => std::future::pending().await,
                    }
                }, if command_call.is_some() => {
                    command_call = None;
                    if let Ok(Err(e)) = result {
                        tracing::warn!(session = %self.record.id, "the command failed: {e}");
                        end.get_or_insert(TurnEnd::Error { message: format!("{name} could not run the command: {e}") });
                    }
                }
                event = events.recv() => {
                    let event = match event {
                        None => break Outcome::StreamEnded,
                        Some(SseEvent::Data(event)) => event,
                        Some(SseEvent::Oversize(bytes)) => {
                            last_event = tokio::time::Instant::now();
                            tracing::warn!(session = %self.record.id, bytes, "dropped an oversize server event");
                            emit.send(crate::session::note(&format!(
                                "_{name}'s server sent an event of {}, more than the {} one event may hold: it was \
                                 dropped, so part of this turn may be missing here._",
                                crate::sandbox::local::limits::format_size(bytes as u64),
                                crate::sandbox::local::limits::format_size(MAX_EVENT as u64),
                            )))
                            .await?;
                            continue;
                        }
                    };
                    if let Some(child) = child_session(&event, &ses, &children) {
                        children.push(child);
                    }
                    if let Some(ask) = foreign_permission(&event, &children) {
                        // A subagent's own session asks: no card of ours shows it, so it is asked in words.
                        pending.push(self.answer_permission(client.clone(), approvals, ask));
                        continue;
                    }
                    let mut idle_now = false;
                    let mut tool_ended = false;
                    for output in translator.line(&event) {
                        tool_ended |= ends_a_tool(&output);
                        match output {
                            Output::Update(update) => {
                                last_event = tokio::time::Instant::now();
                                if let Err(e) = emit.send(update).await {
                                    // Nothing may reach the editor that is not stored: the turn stops here.
                                    abort(client, &ses);
                                    for task in pending.drain(..) {
                                        task.abort();
                                    }
                                    end_strays(&server);
                                    return Err(e);
                                }
                            }
                            Output::NativeSessionId { .. } => {}
                            Output::End(turn_end) => end = Some(turn_end),
                            Output::Abort { message } => {
                                stop.get_or_insert(Stop::Aborted(message));
                                abort(client, &ses);
                                abort_deadline.get_or_insert(tokio::time::Instant::now() + ABORT_GRACE);
                            }
                            Output::Permission(ask) => {
                                last_event = tokio::time::Instant::now();
                                pending.retain(|task| !task.is_finished());
                                pending.push(self.answer_permission(client.clone(), approvals, ask));
                            }
                            Output::Idle => idle_now = true,
                            Output::Unparsed { line } => {
                                tracing::debug!(session = %self.record.id, "unparsed server event: {line}");
                            }
                        }
                    }
                    if tool_ended
                        && let Err(e) = async {
                            if let Some(review) = &review {
                                review.step(emit).await?;
                            }
                            super::super::protected::sweep(sandbox.as_ref(), emit).await
                        }
                        .await
                    {
                        abort(client, &ses);
                        for task in pending.drain(..) {
                            task.abort();
                        }
                        end_strays(&server);
                        return Err(e);
                    }
                    if let Some(cap) = settle_cap {
                        settle = Some((tokio::time::Instant::now() + SETTLE).min(cap));
                    }
                    if idle_now {
                        if stop.is_none() {
                            break Outcome::Idle;
                        }
                        // An aborted OpenCode goes idle before its tool and message say so (measured: 260 ms
                        // later, then idle again); those belong to this turn, not to the next one.
                        let cap = (tokio::time::Instant::now() + SETTLE * 6).min(hard_end.unwrap_or(far_future()));
                        settle = Some((tokio::time::Instant::now() + SETTLE).min(cap));
                        settle_cap = Some(cap);
                    }
                }
            }
        };
        for task in pending {
            task.abort();
        }
        if let Some(call) = command_call {
            call.abort();
        }
        let stream_end = if matches!(stop, Some(Stop::Cancelled)) { StreamEnd::Cancelled } else { StreamEnd::Stopped };
        for output in translator.finish(stream_end) {
            if let Output::Update(update) = output {
                emit.send(update).await?;
            }
        }
        // What the agent changed last (or before it was stopped) is reviewed with the turn.
        if let Some(review) = &review {
            review.step(emit).await?;
        }
        super::super::protected::sweep(sandbox.as_ref(), emit).await?;
        let died = || Error::CliFailed {
            message: death(name, server.exit(), server.limit_hit(), matches!(outcome, Outcome::StreamEnded)),
            stderr_tail: server.stderr_tail(),
            exit_code: server.exit().and_then(|exit| exit.code),
        };
        // Like a turn of `opencode run`, a turn leaves nothing running: the server stays, its strays go.
        end_strays(&server);
        let kill = match outcome {
            Outcome::ServerDied | Outcome::StreamEnded => true,
            // A server that ran into the sandbox's limit goes whoever else uses it; one that would not abort this
            // session's turn goes unless it still answers other sessions' turns (it aborts this one in its time).
            Outcome::KillServer => {
                matches!(stop, Some(Stop::Limit(_)))
                    || !server.shared_now()
                    || server.client.health(SHARED_HEALTH).await.is_none()
            }
            Outcome::Idle => false,
        };
        if kill {
            // A server that would not stop, or is gone: the next prompt starts a fresh one on the same database.
            drop(lease);
            servers.stop(&key).await;
        } else if matches!(outcome, Outcome::KillServer) {
            tracing::warn!(session = %self.record.id, "the server did not abort this turn in time; it serves other turns, so it stays");
        }
        let result = match stop {
            Some(Stop::Cancelled) => Ok(StopReason::Cancelled),
            Some(Stop::Stalled) => Err(Error::Stalled { agent: name, seconds: idle.as_secs() }),
            Some(Stop::TimedOut) => Err(Error::TurnTimeout {
                agent: name,
                minutes: self.bridge.config().turn_timeout.as_secs().div_ceil(60),
            }),
            Some(Stop::Limit(hit)) => Err(Error::CliFailed {
                message: format!("{name} was stopped: {hit}"),
                stderr_tail: server.stderr_tail(),
                exit_code: None,
            }),
            Some(Stop::Aborted(message)) => {
                Err(Error::CliFailed { message, stderr_tail: server.stderr_tail(), exit_code: None })
            }
            None => match outcome {
                Outcome::ServerDied | Outcome::StreamEnded | Outcome::KillServer => Err(died()),
                Outcome::Idle => match end {
                    None | Some(TurnEnd::EndTurn) => Ok(StopReason::EndTurn),
                    Some(TurnEnd::MaxTokens) => Ok(StopReason::MaxTokens),
                    Some(TurnEnd::MaxTurnRequests) => Ok(StopReason::MaxTurnRequests),
                    Some(TurnEnd::Refusal) => Ok(StopReason::Refusal),
                    Some(TurnEnd::Cancelled) => Ok(StopReason::Cancelled),
                    Some(TurnEnd::AuthRequired { message }) => Err(Error::AuthRejected(message)),
                    Some(TurnEnd::Error { message }) => {
                        Err(Error::CliFailed { message, stderr_tail: String::new(), exit_code: None })
                    }
                },
            },
        };
        Ok(ServeOutcome::Finished(result))
    }

    /// Answers one permission request of OpenCode: at once under `auto`, else by asking the editor.
    fn answer_permission(&self, client: Client, approvals: &str, ask: PermissionAsk) -> tokio::task::JoinHandle<()> {
        let session = self.record.id.clone();
        let sink = self.sink.clone();
        let always = self.bridge.always_rules.clone();
        let asking = approvals == options::APPROVALS_ASK;
        tokio::spawn(async move {
            // OpenCode asks again within the turn that an "always" was given in (the session's rules carry it only
            // from its next turn on): the bridge answers for the user what the user already allowed.
            let allowed = asking && always.covers(&session, &ask.permission, &ask.patterns);
            let reply = if allowed {
                "once"
            } else if asking {
                let options = vec![
                    PermissionOption::new("once", "Allow once", PermissionOptionKind::AllowOnce),
                    PermissionOption::new("always", "Always allow", PermissionOptionKind::AllowAlways),
                    PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
                ];
                let request = RequestPermissionRequest::new(session.clone(), ask.tool_call.clone(), options);
                match sink.request_permission(request).await {
                    Some(RequestPermissionOutcome::Selected(selected)) => match selected.option_id.0.as_ref() {
                        "once" => "once",
                        "always" => {
                            // OpenCode's own `always` allows the pattern for its whole instance, after every rule:
                            // for every session of a shared server, and over plan mode's refusals. The session's
                            // own rules carry it instead, from its next turn on, before the mode's.
                            always.allow(&session, &ask.permission, &ask.always);
                            "once"
                        }
                        _ => "reject",
                    },
                    _ => "reject",
                }
            } else {
                "once"
            };
            tracing::info!(session = %session, request = %ask.request_id, reply, allowed, "answering OpenCode's permission request");
            let path = format!("/permission/{}/reply", ask.request_id);
            if let Err(e) =
                client.call_within(REQUEST_LIMIT, Method::POST, &path, Some(&json!({ "reply": reply }))).await
            {
                tracing::warn!(session = %session, "could not answer the permission request: {e}");
            }
        })
    }
}

/// Gives OpenCode session `ses` on `server` the session's rules (its approvals, mode and "always" answers, composed
/// with the agent's own); answers the agent its turns run. Before every turn, never from a cache: the rules live in
/// OpenCode's database, which another server of the same sandbox (other approvals) or another bridge may have
/// written since, and only the session's own turn (one at a time, across bridges) writes them, right before its
/// prompt.
async fn session_rules(
    bridge: &crate::session::Bridge,
    record: &crate::store::SessionRecord,
    server: &super::Server,
    ses: &str,
) -> Result<String> {
    let client = &server.client;
    let failed = |e: ClientError| Error::CliFailed {
        message: format!("OpenCode's server failed: {e}"),
        stderr_tail: server.stderr_tail(),
        exit_code: server.exit().and_then(|exit| exit.code),
    };
    let approvals = options::approvals(&record.config);
    let mode = opencode_options::agent(&record.config);
    let allowed = bridge.always_allowed(&record.id);
    let agents = client.call_within(REQUEST_LIMIT, Method::GET, "/agent", None).await.map_err(failed)?;
    let (agent, own) =
        agent_rules(&agents, mode).map_err(|why| failed(ClientError::Invalid { what: "GET /agent".into(), why }))?;
    if approvals == options::APPROVALS_ASK
        && let Some(loose) = unasked_subagent(&agents)
    {
        return Err(Error::CliFailed {
            message: format!(
                "OpenCode would let its subagent {loose} edit or run commands without asking, so this turn was not \
                 started: its `permission` configuration allows them after the approvals' rules"
            ),
            stderr_tail: String::new(),
            exit_code: None,
        });
    }
    let ours = permissions::bridge_rules(approvals, mode == Some("plan"), &allowed);
    let rules = permissions::session_rules(&ours, &own);
    tracing::debug!(session = %record.id, agent = %agent, rules = rules.len(), "the session's rules");
    client
        .call_within(REQUEST_LIMIT, Method::PATCH, &format!("/session/{ses}"), Some(&json!({ "permission": rules })))
        .await
        .map_err(failed)?;
    server.served.lock().unwrap_or_else(|p| p.into_inner()).insert(ses.to_string());
    Ok(agent)
}

/// The session's OpenCode conversation: the stored one (the background start may have made it ahead), or a new
/// one, stored. One at a time per session, so the warm start and the first prompt never make two.
pub(in crate::session) async fn conversation(
    bridge: &crate::session::Bridge,
    session: &str,
    client: &Client,
) -> Result<std::result::Result<String, ClientError>> {
    let gate = bridge.gate(session);
    let _one = gate.lock().await;
    if let Some(native) = bridge.store.session(session).await?.and_then(|record| record.native_id) {
        return Ok(Ok(native));
    }
    let created = match client.call_within(REQUEST_LIMIT, Method::POST, "/session", Some(&json!({}))).await {
        Ok(created) => created,
        Err(e) => return Ok(Err(e)),
    };
    let Some(native) = created["id"].as_str() else {
        return Ok(Err(ClientError::Invalid { what: "POST /session".into(), why: "no id".into() }));
    };
    tracing::info!(session, native, "the CLI conversation id");
    bridge.store.set_native_id(session, Some(native)).await?;
    Ok(Ok(native.to_string()))
}

/// Starts `opencode serve` in the session's sandbox: the same command, environment and isolation as a turn's
/// `opencode run`, plus the server's password and its door.
#[allow(clippy::too_many_arguments)]
pub(in crate::session) async fn start_server(
    bridge: &crate::session::Bridge,
    session: &str,
    key: &str,
    sandbox: Arc<dyn Sandbox>,
    executable: &Path,
    credential: Option<&(&'static str, String)>,
    model: Option<&str>,
    profile: &Profile,
) -> std::result::Result<Started, super::ServeError> {
    let password = Servers::password();
    let agent = crate::agents::opencode::AGENT;
    let mut env = cli_environment(agent, sandbox.state_dir(), credential, &bridge.env_names(agent, model));
    env.retain(|(name, _)| name != "OPENCODE_SERVER_PASSWORD" && name != "OPENCODE_SERVER_USERNAME");
    env.push(("OPENCODE_SERVER_PASSWORD".into(), password.clone()));
    // The plugin that takes the password away from the server's tools (`guard.rs`), written afresh each time.
    let guard = sandbox.state_dir().join(super::guard::PLUGIN_PATH);
    sandbox
        .write_state_file(&guard, super::guard::PLUGIN.as_bytes())
        .await
        .map_err(|e| super::ServeError::Start(format!("its guard plugin: {e}")))?;
    super::guard::add_plugin(&mut env, &guard).map_err(super::ServeError::Start)?;
    permissions::set_env(&mut env, "OPENCODE_PERMISSION", |user| {
        permissions::server_permission(&profile.approvals, user)
    });
    if !profile.project_config {
        permissions::set_env(&mut env, "OPENCODE_DISABLE_PROJECT_CONFIG", |_| Some("1".into()));
    }
    let port = Servers::port(bridge.private_network());
    let keep_warm = bridge.config().keep_warm.map(|linger| crate::sandbox::local::warm::KeepWarm {
        key: key.to_string(),
        linger,
        secret: password.clone(),
    });
    let spec = crate::sandbox::ExecSpec {
        serve_port: Some(port),
        keep_warm,
        ..crate::session::cli_spec(bridge.config(), agent, executable, sandbox.as_ref(), env, super::server_args(port))
    };
    tracing::info!(session, program = %spec.program.display(), args = ?spec.args, "starting the OpenCode server");
    let mut process = sandbox.exec(spec.clone()).await.map_err(|e| super::ServeError::Start(e.to_string()))?;
    if let (Some(secret), Some(door)) = (process.adopted.clone(), process.door.clone()) {
        // Checked before use: its record is the bridge's own, but the server must still be there and take it.
        if super::client::Client::new(door, &secret).health(super::HEALTH_LIMIT).await.is_some() {
            return Ok(Started { process, password: secret, profile: profile.key(), adopted: true });
        }
        tracing::warn!(session, key, "a kept-warm server did not answer with its password; starting a fresh one");
        process.handle.kill().await;
        process = sandbox.exec(spec).await.map_err(|e| super::ServeError::Start(e.to_string()))?;
        if process.adopted.is_some() {
            process.handle.kill().await;
            return Err(super::ServeError::Start("a kept-warm server could not be replaced".into()));
        }
    }
    Ok(Started { process, password, profile: profile.key(), adopted: false })
}

/// The prompt as OpenCode's message parts: its text and its images (as data URLs, so no file is written).
fn parts(rendered: &RenderedPrompt, command: bool) -> Value {
    use base64::Engine;
    let mut parts = Vec::new();
    if !command {
        parts.push(json!({ "type": "text", "text": rendered.text }));
    }
    for (name, bytes) in &rendered.images {
        let mime = match Path::new(name).extension().and_then(|e| e.to_str()).unwrap_or("") {
            "jpg" | "jpeg" => "image/jpeg",
            "gif" => "image/gif",
            "webp" => "image/webp",
            _ => "image/png",
        };
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        parts.push(
            json!({ "type": "file", "mime": mime, "filename": name, "url": format!("data:{mime};base64,{data}") }),
        );
    }
    Value::Array(parts)
}

/// The agent a turn runs (the mode's, else OpenCode's default: the first primary agent `GET /agent` lists) and its
/// own rules.
fn agent_rules(agents: &Value, mode: Option<&str>) -> std::result::Result<(String, Vec<Rule>), String> {
    let list = agents.as_array().ok_or("not a list")?;
    let agent = list
        .iter()
        .find(|agent| match mode {
            Some(mode) => agent["name"] == mode,
            None => agent["mode"] != "subagent" && agent["hidden"] != true,
        })
        .ok_or_else(|| format!("no agent {}", mode.unwrap_or("to run")))?;
    let name = agent["name"].as_str().ok_or("an agent without a name")?.to_string();
    let rules = serde_json::from_value(agent["permission"].clone()).map_err(|e| format!("{name}'s rules: {e}"))?;
    Ok((name, rules))
}

/// A subagent that could still edit or run a command without asking (its rules after the server's own, which
/// under `ask` make every agent ask): the name of the first one.
fn unasked_subagent(agents: &Value) -> Option<String> {
    agents.as_array()?.iter().filter(|agent| agent["mode"] != "primary").find_map(|agent| {
        let rules: Vec<Rule> = serde_json::from_value(agent["permission"].clone()).ok()?;
        let decides = |permission: &str| {
            rules.iter().rev().find(|rule| permissions::matches(permission, "x", rule)).map(|rule| rule.action.as_str())
        };
        ["edit", "bash"]
            .iter()
            .any(|tool| decides(tool) == Some("allow"))
            .then(|| agent["name"].as_str().unwrap_or("?").to_string())
    })
}

/// The shell commands of a command template (`` !`…` ``), which OpenCode runs as it expands the template.
fn template_shell(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("!`") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('`') else { break };
        if end > 0 {
            found.push(after[..end].to_string());
        }
        rest = &after[end + 1..];
    }
    found
}

/// How long a shared server that did not abort a turn in time may take to show it still serves the others.
const SHARED_HEALTH: Duration = Duration::from_secs(1);

/// Ends what the turn left running beside the server, unless another session's turn runs there now (its
/// commands would be among them).
fn end_strays(server: &super::Server) {
    if !server.shared_now() {
        server.end_strays();
    }
}

/// A new OpenCode session whose parent is the turn's own or one of its subagents' (`children`): a subagent of the
/// turn.
fn child_session(event: &str, ours: &str, children: &[String]) -> Option<String> {
    if !event.contains("\"session.created\"") {
        return None;
    }
    let event: Value = serde_json::from_str(event).ok()?;
    let info = &event["properties"]["info"];
    let parent = info["parentID"].as_str()?;
    (event["type"] == "session.created" && (parent == ours || children.iter().any(|child| child == parent)))
        .then(|| info["id"].as_str().map(str::to_string))
        .flatten()
}

/// A permission request of one of the turn's subagents (`children`: their own OpenCode sessions), which the
/// translator does not show: asked with a card of its own naming what it wants. Requests of other sessions of a
/// shared server are their own turns'.
fn foreign_permission(event: &str, children: &[String]) -> Option<PermissionAsk> {
    if !event.contains("\"permission.asked\"") {
        return None;
    }
    let event: Value = serde_json::from_str(event).ok()?;
    let properties = &event["properties"];
    let session = properties["sessionID"].as_str()?;
    if event["type"] != "permission.asked" || !children.iter().any(|child| child == session) {
        return None;
    }
    let id = properties["id"].as_str()?.to_string();
    let patterns: Vec<&str> = properties["patterns"].as_array()?.iter().filter_map(Value::as_str).collect();
    let title = format!(
        "A subagent asks for {}: {}",
        properties["permission"].as_str().unwrap_or("a tool"),
        patterns.join(", ")
    );
    let tool_call = agent_client_protocol::v1::schema::ToolCallUpdate::new(
        id.clone(),
        agent_client_protocol::v1::schema::ToolCallUpdateFields::new().title(title),
    );
    let always = properties["always"].as_array().into_iter().flatten().filter_map(Value::as_str).map(String::from);
    let permission = properties["permission"].as_str().unwrap_or("").to_string();
    let patterns = patterns.into_iter().map(String::from).collect();
    Some(PermissionAsk { request_id: id, tool_call, always: always.collect(), permission, patterns })
}

enum Outcome {
    Idle,
    ServerDied,
    StreamEnded,
    KillServer,
}

enum Stop {
    Cancelled,
    Stalled,
    TimedOut,
    Limit(String),
    Aborted(String),
}

/// Why a server ended during a turn, naming who ended it where that is known: the sandbox's limit (its cgroup
/// counted an out-of-memory kill or a refused fork), a signal from elsewhere (the bridge only kills a server after
/// the turn's own stop, which is not reported this way), its own exit, or its event stream closing.
fn death(name: &str, exit: Option<crate::sandbox::ExitInfo>, limit: Option<String>, stream_closed: bool) -> String {
    let signal_name = |signal: i32| {
        nix::sys::signal::Signal::try_from(signal).map(|s| s.as_str().to_string()).unwrap_or_else(|_| "?".into())
    };
    // The sandbox's first process (and a shell) report a child killed by signal N as exit code 128 + N.
    let exit = exit.map(|exit| match exit.code {
        Some(code) if (129..=128 + 64).contains(&code) => {
            crate::sandbox::ExitInfo { code: None, signal: Some(code - 128) }
        }
        _ => exit,
    });
    match (exit, limit) {
        (Some(crate::sandbox::ExitInfo { signal: Some(signal), .. }), Some(hit)) => {
            format!("{name}'s server was killed ({}, signal {signal}) during the turn: {hit}", signal_name(signal))
        }
        (Some(crate::sandbox::ExitInfo { signal: Some(signal), .. }), None) => format!(
            "{name}'s server was killed ({}, signal {signal}) during the turn, not by acp-sandbox: by another \
             process (one of the agent's own commands can signal it) or the kernel",
            signal_name(signal)
        ),
        (Some(exit), Some(hit)) => format!("{name}'s server exited with {} during the turn: {hit}", exit.describe()),
        (Some(exit), None) => format!("{name}'s server exited with {} during the turn", exit.describe()),
        (None, Some(hit)) => format!("{name}'s server stopped during the turn: {hit}"),
        (None, None) if stream_closed => format!("{name}'s server closed its event stream during the turn"),
        (None, None) => format!("{name}'s server stopped answering during the turn"),
    }
}

/// A deadline that never comes (an hour on), for `min` with one that may not be set.
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(3600)
}

async fn sleep_until_or_never(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subagents_permission_request_is_asked_in_words_and_ours_is_left_to_the_translator() {
        let event = json!({"type": "permission.asked", "properties": {
            "id": "per_1", "sessionID": "ses_child", "permission": "bash", "patterns": ["rm -rf build"],
            "metadata": {}, "always": []}})
        .to_string();
        let created = |id: &str, parent: &str| {
            json!({"type": "session.created", "properties": {"sessionID": id, "info": {"id": id, "parentID": parent}}})
                .to_string()
        };
        // The turn's own subagent, and that subagent's own: theirs to ask. Another editor session's (a shared
        // server's), or a session without a parent: not this turn's.
        let mut children = Vec::new();
        children.extend(child_session(&created("ses_child", "ses_parent"), "ses_parent", &children));
        children.extend(child_session(&created("ses_grandchild", "ses_child"), "ses_parent", &children));
        assert_eq!(child_session(&created("ses_other_child", "ses_other"), "ses_parent", &children), None);
        let top = json!({"type": "session.created", "properties": {"info": {"id": "ses_other"}}}).to_string();
        assert_eq!(child_session(&top, "ses_parent", &children), None);
        assert_eq!(children, ["ses_child", "ses_grandchild"]);
        let ask = foreign_permission(&event, &children).unwrap();
        assert_eq!(ask.request_id, "per_1");
        let card = serde_json::to_value(&ask.tool_call).unwrap();
        assert_eq!(card, json!({"toolCallId": "per_1", "title": "A subagent asks for bash: rm -rf build"}));
        let others = event.replace("ses_child", "ses_other");
        assert!(foreign_permission(&others, &children).is_none(), "another session's request was taken");
        assert!(foreign_permission(&event, &[]).is_none());
        let idle = r#"{"type":"session.idle","properties":{"sessionID":"ses_child"}}"#;
        assert!(foreign_permission(idle, &children).is_none());
        assert!(foreign_permission("not json \"permission.asked\"", &children).is_none());
    }

    #[test]
    fn the_turns_agent_is_the_modes_or_the_first_primary_one_and_loose_subagents_are_found() {
        let allow_all = json!([{"permission": "*", "pattern": "*", "action": "allow"}]);
        let asked = json!([
            {"permission": "*", "pattern": "*", "action": "allow"},
            {"permission": "*", "pattern": "**", "action": "ask"},
            {"permission": "bash", "pattern": "**", "action": "ask"},
        ]);
        let agents = json!([
            {"name": "build", "mode": "primary", "permission": allow_all},
            {"name": "compaction", "mode": "primary", "hidden": true, "permission": []},
            {"name": "general", "mode": "subagent", "permission": asked},
            {"name": "plan", "mode": "primary", "permission": [{"permission": "edit", "pattern": "*", "action": "deny"}]},
        ]);
        let (name, rules) = agent_rules(&agents, None).unwrap();
        assert_eq!((name.as_str(), rules.len()), ("build", 1));
        let (name, rules) = agent_rules(&agents, Some("plan")).unwrap();
        assert_eq!((name.as_str(), rules[0].action.as_str()), ("plan", "deny"));
        assert!(agent_rules(&agents, Some("nope")).is_err());
        assert_eq!(unasked_subagent(&agents), None, "primary agents get the session's rules");
        let mut loose = agents.clone();
        loose[2]["permission"]
            .as_array_mut()
            .unwrap()
            .push(json!({"permission": "bash", "pattern": "*", "action": "allow"}));
        assert_eq!(unasked_subagent(&loose).as_deref(), Some("general"));
    }

    #[test]
    fn a_servers_death_names_its_cause() {
        use crate::sandbox::ExitInfo;
        let killed = Some(ExitInfo { code: None, signal: Some(9) });
        let memory = Some("the sandbox hit its memory limit (256 MiB)".to_string());
        assert_eq!(
            death("OpenCode", killed, memory.clone(), false),
            "OpenCode's server was killed (SIGKILL, signal 9) during the turn: the sandbox hit its memory limit (256 MiB)"
        );
        // Through the sandbox's first process, the same death is exit code 137.
        assert_eq!(
            death("OpenCode", Some(ExitInfo { code: Some(137), signal: None }), memory, false),
            death("OpenCode", killed, Some("the sandbox hit its memory limit (256 MiB)".into()), false)
        );
        assert_eq!(
            death("OpenCode", Some(ExitInfo { code: None, signal: Some(15) }), None, false),
            "OpenCode's server was killed (SIGTERM, signal 15) during the turn, not by acp-sandbox: by another process \
             (one of the agent's own commands can signal it) or the kernel"
        );
        assert_eq!(
            death("OpenCode", Some(ExitInfo { code: Some(1), signal: None }), None, false),
            "OpenCode's server exited with exit code 1 during the turn"
        );
        assert_eq!(death("OpenCode", None, None, true), "OpenCode's server closed its event stream during the turn");
        assert_eq!(death("OpenCode", None, None, false), "OpenCode's server stopped answering during the turn");
    }

    #[test]
    fn a_templates_shell_commands_are_found_as_opencode_finds_them() {
        assert_eq!(template_shell("Status: !`git status` and !`ls -la`, not `this` or !``"), ["git status", "ls -la"]);
        assert!(template_shell("plain $ARGUMENTS, !not").is_empty());
        assert!(template_shell("!`unclosed").is_empty());
    }

    #[test]
    fn images_become_data_url_file_parts_and_a_command_sends_no_text_part() {
        let rendered =
            RenderedPrompt { text: "look".into(), images: vec![("a.jpg".into(), vec![1, 2, 3])], dropped: Vec::new() };
        assert_eq!(
            parts(&rendered, false),
            json!([
                {"type": "text", "text": "look"},
                {"type": "file", "mime": "image/jpeg", "filename": "a.jpg", "url": "data:image/jpeg;base64,AQID"}
            ])
        );
        assert_eq!(parts(&rendered, true).as_array().unwrap().len(), 1);
    }
}
