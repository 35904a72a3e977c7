//! The ACP server: the only module that knows the JSON-RPC connection (official `agent-client-protocol`).
//!
//! Handlers are thin: they call [`Bridge`] and map its errors with [`to_acp_error`]. A prompt turn, and every
//! request that touches the store, runs in its own tokio task so the dispatch loop keeps reading (a
//! `session/cancel` must get through while a turn runs, a `session/list` while the database is locked) and so a
//! panicking turn cannot take the connection down: the SDK answers its dropped responder.
//! `transport` frames stdin and stdout, so no input can end the connection: only the end of stdin does.

mod transport;

use std::collections::HashMap;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentAuthCapabilities, AgentCapabilities, AvailableCommandsUpdate, CancelNotification, CloseSessionRequest,
    CloseSessionResponse, ConfigOptionUpdate, CurrentModeUpdate, DeleteSessionRequest, DeleteSessionResponse,
    ForkSessionRequest, ForkSessionResponse, Implementation, InitializeRequest, InitializeResponse,
    ListSessionsRequest, ListSessionsResponse, LoadSessionRequest, LoadSessionResponse, LogoutCapabilities,
    McpCapabilities, NewSessionRequest, NewSessionResponse, PromptCapabilities, PromptRequest, PromptResponse,
    ResumeSessionRequest, ResumeSessionResponse, SessionAdditionalDirectoriesCapabilities, SessionCapabilities,
    SessionCloseCapabilities, SessionDeleteCapabilities, SessionForkCapabilities, SessionInfo, SessionListCapabilities,
    SessionNotification, SessionResumeCapabilities, SessionSystemPromptCapabilities, SessionUpdate,
    SetSessionConfigOptionRequest, SetSessionConfigOptionResponse, SetSessionModeRequest, SetSessionModeResponse,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client};

use crate::error::to_acp_error;
use crate::session::{Bridge, Given, UpdateSink};

/// `session/set_model`, the unstable method ACP dropped for the model config option (schema 0.13.5); clients
/// such as acpc still call it to pick a model, so it sets the `model` option as `session/set_config_option` does.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, agent_client_protocol::JsonRpcRequest)]
#[request(method = "session/set_model", response = SetSessionModelResponse)]
#[serde(rename_all = "camelCase")]
struct SetSessionModelRequest {
    session_id: String,
    model_id: String,
}

/// The answer to `session/set_model`: empty, as the unstable schema had it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, agent_client_protocol::JsonRpcResponse)]
struct SetSessionModelResponse {}

/// Sends updates to the editor over the connection's single outgoing queue.
struct ConnectionSink {
    connection: ConnectionTo<Client>,
}

#[async_trait::async_trait]
impl UpdateSink for ConnectionSink {
    fn send(&self, session_id: &str, update: SessionUpdate) {
        let new_file = crate::agents::tools::has_new_file_diff(&update);
        let notification = SessionNotification::new(session_id.to_string(), update);
        // Untyped only when needed, to send the update as `tools::update_json` writes it (a new file's diff with
        // `"oldText": null`): the detour through a JSON value costs a fifth of a stream's throughput.
        let sent = if new_file {
            agent_client_protocol::JsonRpcMessage::to_untyped_message(&notification).and_then(|mut message| {
                crate::agents::tools::explicit_new_files(&mut message.params["update"]);
                self.connection.send_notification(message)
            })
        } else {
            self.connection.send_notification(notification)
        };
        if let Err(e) = sent {
            // The editor went away; the update is already persisted and will be replayed on load.
            tracing::debug!(session = session_id, "could not send an update: {e}");
        }
    }

    fn send_json(&self, session_id: &str, update: String) {
        self.send_json_run(session_id, vec![update]);
    }

    fn send_json_run(&self, session_id: &str, updates: Vec<String>) {
        // The updates as the store kept them, byte for byte (a new file's diff already says `"oldText": null`),
        // through the SDK as one message: one hand-off for the run, not one per update.
        if updates.is_empty() {
            return;
        }
        let notification = transport::prepared_updates(session_id, &updates);
        drop(updates);
        if let Err(e) = self.connection.send_notification(notification) {
            tracing::debug!(session = session_id, "could not send an update: {e}");
        }
    }

    async fn request_permission(
        &self,
        request: agent_client_protocol::v1::schema::RequestPermissionRequest,
    ) -> Option<agent_client_protocol::v1::schema::RequestPermissionOutcome> {
        // Untyped like `send`: the tool call's new-file diffs say `"oldText": null`.
        let asked = async {
            let mut message = agent_client_protocol::JsonRpcMessage::to_untyped_message(&request)?;
            crate::agents::tools::explicit_new_files(&mut message.params["toolCall"]);
            // Turns run in tasks of their own, never in the dispatch loop, so waiting here cannot deadlock it.
            let answer = self.connection.send_request(message).block_task().await?;
            serde_json::from_value::<agent_client_protocol::v1::schema::RequestPermissionResponse>(answer)
                .map_err(agent_client_protocol::Error::into_internal_error)
        };
        match asked.await {
            Ok(response) => Some(response.outcome),
            Err(e) => {
                tracing::warn!("the editor did not answer a permission request: {e}");
                None
            }
        }
    }

    async fn write_text_file(
        &self,
        request: agent_client_protocol::v1::schema::WriteTextFileRequest,
    ) -> Result<(), String> {
        // Turns run in tasks of their own, never in the dispatch loop, so waiting here cannot deadlock it.
        match self.connection.send_request(request).block_task().await {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn elicit(
        &self,
        request: agent_client_protocol::v1::schema::CreateElicitationRequest,
    ) -> Option<agent_client_protocol::v1::schema::CreateElicitationResponse> {
        // Asked only of an editor that offers forms; turns run in tasks of their own, so waiting cannot deadlock.
        match self.connection.send_request(request).block_task().await {
            Ok(answer) => Some(answer),
            Err(e) => {
                tracing::warn!("the editor did not answer a question: {e}");
                None
            }
        }
    }
}

fn respond<T>(responder: Responder<T>, result: crate::error::Result<T>) -> Result<(), agent_client_protocol::Error>
where
    T: agent_client_protocol::JsonRpcResponse + Send,
{
    match result {
        Ok(value) => responder.respond(value),
        Err(error) => responder.respond_with_error(to_acp_error(&error)),
    }
}

/// Requests about one session start in the order they arrived, as when every handler ran inside the dispatch
/// loop: a prompt sent right after a `session/set_config_option` runs with the new option. Only requests of one
/// session wait, and only for those before them; a `session/list` waits for nothing.
#[derive(Default)]
struct SessionOrder {
    /// Per session, what the latest request's place resolves to when it is done.
    tails: std::sync::Mutex<HashMap<String, Shared<BoxFuture<'static, ()>>>>,
}

impl SessionOrder {
    /// The next place in `session`'s order. Called in the dispatch loop, so places follow the arrival order.
    fn enter(&self, session: &str) -> Place {
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let finished = finished.map(|_| ()).boxed().shared();
        let mut tails = self.tails.lock().unwrap_or_else(|p| p.into_inner());
        // Places of sessions with nothing in flight any more are forgotten.
        tails.retain(|_, tail| tail.peek().is_none());
        let previous = tails.insert(session.to_string(), finished);
        Place { previous, done: Some(done) }
    }
}

/// A request's place in its session's order: [`Place::wait`] for the request before it; dropping the place (or
/// [`Place::release`]) lets the next one start.
struct Place {
    previous: Option<Shared<BoxFuture<'static, ()>>>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Place {
    async fn wait(&mut self) {
        if let Some(previous) = self.previous.take() {
            previous.await;
        }
    }

    fn release(&mut self) {
        self.done.take();
    }
}

/// Answers a request from a task of its own: the dispatch loop goes on at once, whatever the store does (a
/// locked database, a slow disk), so an unrelated request is never held up behind it.
fn spawn_answer<T>(responder: Responder<T>, work: impl Future<Output = crate::error::Result<T>> + Send + 'static)
where
    T: agent_client_protocol::JsonRpcResponse + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = respond(responder, work.await) {
            tracing::debug!("could not answer a request: {e}");
        }
    });
}

/// Answers a request that made a session (new, fork) with `response`, then starts its server and tells the editor
/// its slash commands: after the response, so the editor knows the session when the update arrives.
async fn answer_made<T>(
    bridge: &Arc<Bridge>,
    cx: ConnectionTo<Client>,
    responder: Responder<T>,
    made: crate::error::Result<(String, Vec<agent_client_protocol::v1::schema::SessionConfigOption>)>,
    response: impl FnOnce(
        String,
        Vec<agent_client_protocol::v1::schema::SessionConfigOption>,
        Option<agent_client_protocol::v1::schema::SessionModeState>,
    ) -> T,
) where
    T: agent_client_protocol::JsonRpcResponse + Send,
{
    let id = made.as_ref().ok().map(|(id, _)| id.clone());
    let modes = match &id {
        Some(id) => bridge.session_modes(id).await.ok().flatten(),
        None => None,
    };
    if respond(responder, made.map(|(id, options)| response(id, options, modes))).is_err() {
        return;
    }
    let Some(id) = id else { return };
    bridge.warm_server(&id);
    if let Ok(commands) = bridge.available_commands(&id).await
        && !commands.is_empty()
    {
        ConnectionSink { connection: cx }
            .send(&id, SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(commands)));
    }
}

/// Serves ACP on stdin/stdout until the editor closes stdin, then ends every running turn.
pub async fn serve(bridge: Arc<Bridge>) -> Result<(), agent_client_protocol::Error> {
    let (channel, stdio) =
        transport::StdioTransport::start().map_err(agent_client_protocol::Error::into_internal_error)?;
    let order = Arc::new(SessionOrder::default());
    let result = Agent
        .v1()
        .name("acp-sandbox")
        .on_receive_request(
            {
                let bridge = bridge.clone();
                async move |request: InitializeRequest, responder: Responder<InitializeResponse>, cx| {
                    bridge.set_notifier(Arc::new(ConnectionSink { connection: cx.clone() }));
                    let terminal_output = request
                        .client_capabilities
                        .meta
                        .as_ref()
                        .and_then(|meta| meta.get("terminal_output"))
                        .and_then(|value| value.as_bool())
                        .unwrap_or(false);
                    bridge.set_client_terminal_output(terminal_output);
                    bridge.set_client_capabilities(&request.client_capabilities);
                    let agent = bridge.config().agent;
                    // What the agent itself takes, as it announced it (an ACP agent's, kept from its last run or
                    // its folder's table); the bridge renders embedded context into the prompt for every agent.
                    let announced = bridge.agent_capabilities().await;
                    let (image, audio) = match &announced {
                        Some((prompt, _)) => (prompt.image, prompt.audio),
                        None => (agent.accepts_images(), false),
                    };
                    let mut sessions = SessionCapabilities::new()
                        .list(SessionListCapabilities::new())
                        .resume(SessionResumeCapabilities::new())
                        .close(SessionCloseCapabilities::new())
                        .delete(SessionDeleteCapabilities::new())
                        .fork(SessionForkCapabilities::new());
                    if agent.takes_system_prompt() {
                        // `override` where the agent offers it and the bridge passes it on (Claude Code's).
                        let replaces = announced.as_ref().and_then(|(_, sessions)| sessions.system_prompt.as_ref());
                        let mode = replaces
                            .and_then(|prompt| prompt.mode.clone())
                            .filter(|mode| mode.override_.is_some() && agent.replaces_system_prompt());
                        sessions = sessions.system_prompt(SessionSystemPromptCapabilities::new().mode(mode));
                    }
                    // Only where a session can have them: a local sandbox that binds each root (a remote one and
                    // review mode refuse them, so a client must not be told to send them).
                    if bridge.takes_roots() {
                        sessions = sessions.additional_directories(SessionAdditionalDirectoriesCapabilities::new());
                    }
                    let mut capabilities = AgentCapabilities::new()
                        .load_session(true)
                        .prompt_capabilities(PromptCapabilities::new().embedded_context(true).image(image).audio(audio))
                        .session_capabilities(sessions);
                    if agent.takes_mcp_servers() {
                        capabilities = capabilities.mcp_capabilities(McpCapabilities::new().http(true).sse(true));
                    }
                    // Zed shows typed terminal methods only behind a flag; otherwise it runs the older
                    // `_meta["terminal-auth"]` launch, when the client says it reads one.
                    let legacy_terminal = request
                        .client_capabilities
                        .meta
                        .as_ref()
                        .and_then(|meta| meta.get("terminal-auth"))
                        .and_then(|value| value.as_bool())
                        .unwrap_or(false);
                    let launch = legacy_terminal
                        .then(std::env::current_exe)
                        .and_then(|found| found.ok())
                        .map(|executable| crate::auth::login_launch(bridge.config(), &executable));
                    let auth_methods =
                        crate::auth::auth_methods(agent, request.client_capabilities.auth.terminal, launch);
                    let mut auth = AgentAuthCapabilities::new();
                    if crate::auth::can_log_out(agent) {
                        auth = auth.logout(LogoutCapabilities::new());
                    }
                    let capabilities = capabilities.auth(auth);
                    responder.respond(
                        InitializeResponse::new(ProtocolVersion::V1)
                            .agent_capabilities(capabilities)
                            .auth_methods(auth_methods)
                            .agent_info(
                                Implementation::new("acp-sandbox", env!("CARGO_PKG_VERSION"))
                                    .title(format!("{} (sandboxed)", agent.display_name())),
                            ),
                    )
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                // Reads only the environment and two small files: answered in the loop.
                async move |request: agent_client_protocol::v1::schema::AuthenticateRequest,
                            responder: Responder<agent_client_protocol::v1::schema::AuthenticateResponse>,
                            _cx| {
                    let config = bridge.config();
                    let result = crate::auth::authenticate(config, config.agent, &request.method_id.0)
                        .map(|()| agent_client_protocol::v1::schema::AuthenticateResponse::new());
                    respond(responder, result)
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                // Deletes one small file: answered in the loop.
                async move |_request: agent_client_protocol::v1::schema::LogoutRequest,
                            responder: Responder<agent_client_protocol::v1::schema::LogoutResponse>,
                            _cx| {
                    let config = bridge.config();
                    let result = crate::auth::logout(config, config.agent)
                        .map(|()| agent_client_protocol::v1::schema::LogoutResponse::new());
                    respond(responder, result)
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                async move |request: NewSessionRequest, responder: Responder<NewSessionResponse>, cx| {
                    let bridge = bridge.clone();
                    tokio::spawn(async move {
                        let given = Given {
                            additional_directories: request.additional_directories,
                            system_prompt: request.system_prompt,
                            mcp_servers: request.mcp_servers,
                        };
                        let result = bridge.new_session(&request.cwd, &given).await;
                        answer_made(&bridge, cx, responder, result, |id, options, modes| {
                            // The options as a list even when it is empty (an ACP agent says its own once it has
                            // started): Zed takes a later `config_option_update` only for a session that began
                            // with a list.
                            NewSessionResponse::new(id).config_options(options).modes(modes)
                        })
                        .await;
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                let order = order.clone();
                async move |request: LoadSessionRequest, responder: Responder<LoadSessionResponse>, cx| {
                    let bridge = bridge.clone();
                    let mut place = order.enter(&request.session_id.to_string());
                    spawn_answer(responder, async move {
                        place.wait().await;
                        let sink = ConnectionSink { connection: cx };
                        let id = request.session_id.to_string();
                        let given = Given {
                            additional_directories: request.additional_directories,
                            system_prompt: request.system_prompt,
                            mcp_servers: request.mcp_servers,
                        };
                        let options = bridge.load_session(&id, &given, &sink).await?;
                        bridge.warm_server(&id);
                        let modes = bridge.session_modes(&id).await?;
                        Ok(LoadSessionResponse::new().config_options(options).modes(modes))
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                let order = order.clone();
                async move |request: ResumeSessionRequest, responder: Responder<ResumeSessionResponse>, _cx| {
                    let bridge = bridge.clone();
                    let mut place = order.enter(&request.session_id.to_string());
                    spawn_answer(responder, async move {
                        place.wait().await;
                        let id = request.session_id.to_string();
                        let given = Given {
                            additional_directories: request.additional_directories,
                            system_prompt: request.system_prompt,
                            mcp_servers: request.mcp_servers,
                        };
                        let options = bridge.resume_session(&id, &given).await?;
                        bridge.warm_server(&id);
                        let modes = bridge.session_modes(&id).await?;
                        Ok(ResumeSessionResponse::new().config_options(options).modes(modes))
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                let order = order.clone();
                async move |request: ForkSessionRequest, responder: Responder<ForkSessionResponse>, cx| {
                    let bridge = bridge.clone();
                    // After what came before it for the original: a fork sent right after a prompt's answer copies it.
                    let mut place = order.enter(&request.session_id.to_string());
                    tokio::spawn(async move {
                        place.wait().await;
                        let given = Given {
                            additional_directories: request.additional_directories,
                            system_prompt: request.system_prompt,
                            mcp_servers: request.mcp_servers,
                        };
                        let result = bridge.fork_session(&request.session_id.to_string(), &request.cwd, &given).await;
                        place.release();
                        answer_made(&bridge, cx, responder, result, |id, options, modes| {
                            ForkSessionResponse::new(id).config_options(options).modes(modes)
                        })
                        .await;
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                async move |request: ListSessionsRequest, responder: Responder<ListSessionsResponse>, _cx| {
                    let bridge = bridge.clone();
                    spawn_answer(responder, async move {
                        let page = bridge.list_sessions(request.cwd.as_deref(), request.cursor.as_deref()).await?;
                        let sessions = page
                            .sessions
                            .into_iter()
                            .map(|s| {
                                SessionInfo::new(s.id, s.cwd)
                                    .title(s.title)
                                    .updated_at(s.updated_at)
                                    .additional_directories(
                                        s.additional_directories.into_iter().map(Into::into).collect(),
                                    )
                            })
                            .collect();
                        Ok(ListSessionsResponse::new(sessions).next_cursor(page.next_cursor))
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                async move |request: CloseSessionRequest, responder: Responder<CloseSessionResponse>, _cx| {
                    let result =
                        bridge.close_session(&request.session_id.to_string()).map(|()| CloseSessionResponse::new());
                    respond(responder, result)
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                let order = order.clone();
                async move |request: DeleteSessionRequest, responder: Responder<DeleteSessionResponse>, _cx| {
                    let bridge = bridge.clone();
                    let mut place = order.enter(&request.session_id.to_string());
                    tokio::spawn(async move {
                        place.wait().await;
                        let result = bridge
                            .delete_session(&request.session_id.to_string())
                            .await
                            .map(|()| DeleteSessionResponse::new());
                        let _ = respond(responder, result);
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                let order = order.clone();
                async move |request: SetSessionConfigOptionRequest,
                            responder: Responder<SetSessionConfigOptionResponse>,
                            cx| {
                    let value = match request.value.as_value_id() {
                        Some(value) => value.to_string(),
                        None => request.value.as_bool().map(|b| b.to_string()).unwrap_or_default(),
                    };
                    let bridge = bridge.clone();
                    let mut place = order.enter(&request.session_id.to_string());
                    spawn_answer(responder, async move {
                        place.wait().await;
                        let session_id = request.session_id.to_string();
                        let option = request.config_id.to_string();
                        let options = bridge.set_config_option(&session_id, &option, &value).await?;
                        if option == "mode" {
                            ConnectionSink { connection: cx }.send(
                                &session_id,
                                SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new(value.clone())),
                            );
                        }
                        Ok(SetSessionConfigOptionResponse::new(options))
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                let order = order.clone();
                async move |request: SetSessionModeRequest, responder: Responder<SetSessionModeResponse>, cx| {
                    let bridge = bridge.clone();
                    let mut place = order.enter(&request.session_id.to_string());
                    spawn_answer(responder, async move {
                        place.wait().await;
                        let session_id = request.session_id.to_string();
                        let options =
                            bridge.set_config_option(&session_id, "mode", &request.mode_id.to_string()).await?;
                        // The config option says the same as the mode: clients that read only options see it too.
                        ConnectionSink { connection: cx }
                            .send(&session_id, SessionUpdate::ConfigOptionUpdate(ConfigOptionUpdate::new(options)));
                        Ok(SetSessionModeResponse::new())
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                let order = order.clone();
                async move |request: SetSessionModelRequest, responder: Responder<SetSessionModelResponse>, cx| {
                    let bridge = bridge.clone();
                    let mut place = order.enter(&request.session_id);
                    spawn_answer(responder, async move {
                        place.wait().await;
                        let options = bridge.set_config_option(&request.session_id, "model", &request.model_id).await?;
                        // Clients that read the options (Zed's model picker) see the choice too.
                        ConnectionSink { connection: cx }.send(
                            &request.session_id,
                            SessionUpdate::ConfigOptionUpdate(ConfigOptionUpdate::new(options)),
                        );
                        Ok(SetSessionModelResponse::default())
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            {
                let bridge = bridge.clone();
                let order = order.clone();
                async move |request: PromptRequest, responder: Responder<PromptResponse>, cx| {
                    let bridge = bridge.clone();
                    let sink: Arc<dyn UpdateSink> = Arc::new(ConnectionSink { connection: cx.clone() });
                    let cancellation = responder.cancellation();
                    let mut place = order.enter(&request.session_id.to_string());
                    // Taken here, in the order of the connection: a `session/cancel` read after this prompt
                    // cancels it even when its task has not started the turn yet.
                    let ticket = bridge.prompt_arrived(&request.session_id.to_string());
                    tokio::spawn(async move {
                        // `$/cancel_request` for the prompt cancels its turn like `session/cancel`, so it
                        // answers `cancelled` (the method's own cancel value).
                        let watcher = {
                            let canceller = ticket.canceller();
                            tokio::spawn(async move {
                                cancellation.cancelled().await;
                                canceller.cancel();
                            })
                        };
                        // Starts after what came before it; what comes after need not wait for the whole turn.
                        place.wait().await;
                        place.release();
                        let session_id = request.session_id.to_string();
                        let result = bridge
                            .prompt_queued(&session_id, ticket, request.prompt, sink)
                            .await
                            .map(PromptResponse::new);
                        watcher.abort();
                        if let Err(e) = respond(responder, result) {
                            tracing::debug!(session = %session_id, "could not answer the prompt: {e}");
                        }
                    });
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            {
                let bridge = bridge.clone();
                async move |notification: CancelNotification, _cx| {
                    bridge.cancel(&notification.session_id.to_string());
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(channel)
        .await;
    // What is queued for stdout is written, unless the editor stopped reading: the exit is not held up for it.
    if tokio::time::timeout(crate::session::SHUTDOWN_GRACE, stdio.finish()).await.is_err() {
        tracing::warn!("stdout did not take the last messages; exiting without them");
    }
    bridge.shutdown().await;
    result
}
