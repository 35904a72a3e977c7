//! One turn through a warm OpenCode server: the server it leases, the conversation, the approvals rules, the
//! prompt, permissions; the bridge's turn loop drives the engine it makes (`engine.rs`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    PermissionOption, PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest, StopReason,
};
use hyper::Method;
use serde_json::{Value, json};

use super::ServeTranslator;
use super::client::{Client, ClientError};
use super::service::server_key;
use super::{Profile, Servers, Started, Warm};
use crate::agents::PermissionAsk;
use crate::agents::engine::Attempt;
use crate::agents::host::{BridgeHost, RenderedPrompt, TurnHost, UpdateSink, unless_cancelled};
use crate::agents::opencode::options as opencode_options;
use crate::agents::opencode::permissions::{self, Rule};
use crate::agents::options;
use crate::error::{Error, Result};
use crate::sandbox::Sandbox;

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

/// How long any other request to the server may take: a stopped server accepts connections and never answers.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);

impl Warm {
    /// What the session's server must be started for. Under `ask`, a workspace with OpenCode configuration of its
    /// own (plugins, custom tools, MCP servers: code the server would load) is asked about once, before anything
    /// of it loads; refused, the server starts without it and the user is told.
    async fn profile(&self, host: &dyn TurnHost) -> Result<Profile> {
        let record = host.record();
        let items = match self.profile_known(record) {
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
            format!("workspace-config-{}", host.turn_id()),
            agent_client_protocol::v1::schema::ToolCallUpdateFields::new().title(title),
        );
        let request = RequestPermissionRequest::new(record.id.clone(), card, options);
        let allowed = matches!(
            host.sink().request_permission(request).await,
            Some(RequestPermissionOutcome::Selected(selected)) if selected.option_id.0.as_ref() == "once"
        );
        tracing::info!(session = %record.id, allowed, items = ?items, "the workspace's OpenCode configuration");
        if !allowed {
            host.note(&format!(
                "_OpenCode runs without this workspace's own configuration (`.opencode/`, `opencode.json`): {} \
                 {} not loaded, nor its commands and instructions. Approvals: Auto loads it._",
                items.join("; "),
                if items.len() == 1 { "is" } else { "are" }
            ))
            .await?;
        }
        self.consent_to_project(&record.id, items, allowed);
        Ok(Profile::new(options::approvals(&record.config).to_string(), allowed))
    }

    /// Under `ask`, a command whose template runs shell commands (`` !`…` ``, run by OpenCode as it expands the
    /// template, before any tool and without asking) runs only once the user allowed those commands; a command the
    /// server does not have is not sent at all. `false`: it must not be sent.
    async fn command_allowed(host: &dyn TurnHost, client: &Client, name: &str, arguments: &str) -> Result<bool> {
        let record = host.record();
        let listed =
            client.call_within(REQUEST_LIMIT, Method::GET, "/command", None).await.map_err(|e| Error::CliFailed {
                message: format!("OpenCode's server did not list its commands: {e}"),
                stderr_tail: String::new(),
                exit_code: None,
            })?;
        let Some(command) = listed.as_array().into_iter().flatten().find(|command| command["name"] == name) else {
            // OpenCode would never answer a command it does not have (one of the workspace's, not loaded).
            host.note(&format!(
                "_/{name} is not one of OpenCode's commands here (the workspace's own configuration, where it \
                 comes from, was not loaded), so it was not run._"
            ))
            .await?;
            return Ok(false);
        };
        if options::approvals(&record.config) != options::APPROVALS_ASK {
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
            format!("command-shell-{}", host.turn_id()),
            agent_client_protocol::v1::schema::ToolCallUpdateFields::new().title(title),
        );
        let request = RequestPermissionRequest::new(record.id.clone(), card, options);
        let allowed = matches!(
            host.sink().request_permission(request).await,
            Some(RequestPermissionOutcome::Selected(selected)) if selected.option_id.0.as_ref() == "once"
        );
        if !allowed {
            host.note(&format!("_/{name} was not run: its shell commands were rejected._")).await?;
        }
        Ok(allowed)
    }

    /// One attempt of a turn through the session's server (see [`crate::agents::host::Service::attempt`]).
    pub(super) async fn attempt(
        &self,
        host: &dyn TurnHost,
        sandbox: &Arc<dyn Sandbox>,
        executable: &Path,
        native_id: Option<&str>,
        command: Option<&str>,
        rendered: &RenderedPrompt,
    ) -> Result<Attempt> {
        let record = host.record();
        let servers: &Servers = &self.servers;
        if options::approvals(&record.config) == options::APPROVALS_ASK {
            refuse_agent_written_config(sandbox.state_dir())?;
        }
        let Some(profile) = unless_cancelled(host.cancel(), self.profile(host)).await? else {
            return Ok(Attempt::Finished(Ok(StopReason::Cancelled)));
        };
        let profile = profile
            .with_mcp_servers(host.bridge().mcp_servers(&record.id))
            .with_roots(record.context.additional_directories.clone());
        let profile_key = profile.key();
        let key = server_key(host.bridge(), &record.id, sandbox.as_ref(), &profile_key);
        let start = || {
            start_server(
                host.bridge(),
                &record.id,
                &key,
                sandbox.clone(),
                executable,
                host.credential(),
                host.model(),
                &profile,
            )
        };
        let lease = tokio::select! {
            biased;
            _ = host.cancel().cancelled() => return Ok(Attempt::Finished(Ok(StopReason::Cancelled))),
            lease = crate::agents::host::said_when_slow(
                servers.lease(&key, &record.id, &profile_key, start),
                Some(host),
                "_OpenCode's server is still starting; it is waited for while it makes progress._",
            ) => lease?,
        };
        let lease = match lease {
            Ok(lease) => lease,
            Err(e) => return Ok(Attempt::Unavailable(e.to_string())),
        };
        let server = lease.server().clone();
        let client = &server.client;
        self.learn_models(host.bridge(), client.clone());
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
                    return Ok(Attempt::ConversationMissing);
                }
                Err(e) => return Err(failed(e)),
            },
            None => conversation(host.bridge(), &record.id, client).await?.map_err(failed)?,
        };
        let approvals = options::approvals(&record.config);
        let agent = session_rules(&self.always_rules.of(&record.id), record, &server, &ses).await?;

        if !profile.mcp_servers.is_empty() {
            note_mcp_failures(host, &server, &profile.mcp_servers).await?;
        }
        tracing::debug!(session = %record.id, "server turn: conversation and rules ready");
        // Review mode: the server works on the copy (bound where the workspace is, so a warm server sees each
        // sync), reviewed before the prompt, after each tool and at the end, as under `run`.
        if !host.begin_review().await? {
            return Ok(Attempt::Finished(Ok(StopReason::Cancelled)));
        }
        let Some(events) = server.listen() else {
            return Err(failed(ClientError::Connect("the event stream ended".into())));
        };
        let translator = ServeTranslator::new(host.translate_context(), ses.clone());

        let mut body = json!({ "parts": parts(rendered, command.is_some()) });
        if let Some((provider, model)) = opencode_options::model(&record.config).and_then(|m| m.split_once('/')) {
            body["model"] = json!({ "providerID": provider, "modelID": model });
        }
        if let Some(variant) = opencode_options::variant(&record.config) {
            body["variant"] = json!(variant);
        }
        // The agent whose rules the session's were composed with, also when the mode is OpenCode's default.
        body["agent"] = json!(agent);
        // With each message, not in the server's configuration: one server serves sessions with different prompts.
        if let Some(system) = &record.context.system_prompt {
            body["system"] = json!(system);
        }
        if let Some(name) = command {
            match unless_cancelled(host.cancel(), Self::command_allowed(host, client, name, &rendered.text)).await? {
                None => return Ok(Attempt::Finished(Ok(StopReason::Cancelled))),
                Some(false) => return Ok(Attempt::Finished(Ok(StopReason::EndTurn))),
                Some(true) => {}
            }
        }
        // A command waits for its whole answer, so it runs beside the event loop; a prompt returns at once.
        let command_call = match command {
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
                tracing::debug!(session = %record.id, "server turn: subscribed; prompting");
                client
                    .call_within(REQUEST_LIMIT, Method::POST, &format!("/session/{ses}/prompt_async"), Some(&body))
                    .await
                    .map_err(failed)?;
                tracing::debug!(session = %record.id, "server turn: prompted");
                None
            }
        };

        let answer: super::engine::Answer = {
            let (session, sink, always) = (record.id.clone(), host.sink(), self.always_rules.clone());
            let asking = approvals == options::APPROVALS_ASK;
            let forms = host.bridge().client_fills_forms();
            Box::new(move |client, asked| match asked {
                super::engine::Asked::Permission(ask) => {
                    answer_permission(session.clone(), sink.clone(), always.clone(), asking, client, *ask)
                }
                super::engine::Asked::Question(ask, notes) => {
                    answer_question(session.clone(), sink.clone(), forms, client, ask, notes)
                }
            })
        };
        let engine = super::engine::ServerEngine::new(
            lease,
            self.servers.clone(),
            key,
            &record.id,
            ses,
            events,
            command_call,
            answer,
            crate::agents::opencode::AGENT.display_name(),
            host.timeouts(),
        );
        host.drive(Box::new(engine), Box::new(translator)).await
    }
}

/// Tells the session, once per server, of each of the editor's MCP servers OpenCode could not start (`GET /mcp`:
/// by name, `{status, error}`): the turn goes on without its tools. OpenCode connects them before it answers.
async fn note_mcp_failures(
    host: &dyn TurnHost,
    server: &super::Server,
    servers: &[agent_client_protocol::v1::schema::McpServer],
) -> Result<()> {
    let status = match server.client.call_within(REQUEST_LIMIT, Method::GET, "/mcp", None).await {
        Ok(status) => status,
        Err(e) => {
            tracing::warn!(session = %host.record().id, "could not ask OpenCode how the MCP servers started: {e}");
            return Ok(());
        }
    };
    let session = &host.record().id;
    for name in servers.iter().map(|server| crate::agents::mcp::name(server).to_string()) {
        let state = &status[name.as_str()];
        let failed = match state["status"].as_str() {
            Some("connected") => continue,
            Some("failed") => state["error"].as_str().unwrap_or("it failed").to_string(),
            Some(other) => format!("its status is {other}"),
            None => "OpenCode does not list it".to_string(),
        };
        let first = server.mcp_noted.lock().unwrap_or_else(|p| p.into_inner()).insert(format!("{session}\0{name}"));
        tracing::warn!(session = %session, server = %name, "an MCP server of the editor did not start: {failed}");
        if first {
            host.note(&format!("_The MCP server `{name}` did not start, so its tools are missing: {failed}._")).await?;
        }
    }
    Ok(())
}

/// Answers one question request of OpenCode's `question` tool through the editor's form (`elicitation/create`),
/// or rejects it (OpenCode tells the model the user dismissed it) when the editor offers no forms, the user
/// declined or cancelled, or nothing answered; a rejection is said in the thread.
fn answer_question(
    session: String,
    sink: Arc<dyn UpdateSink>,
    forms: bool,
    client: Client,
    ask: crate::agents::question::QuestionAsk,
    notes: tokio::sync::mpsc::UnboundedSender<String>,
) -> tokio::task::JoinHandle<()> {
    use agent_client_protocol::v1::schema::ElicitationAction;
    tokio::spawn(async move {
        let agent = crate::agents::opencode::AGENT.display_name();
        let answer = match forms {
            true => sink.elicit(crate::agents::question::elicitation(&session, agent, &ask)).await,
            false => None,
        };
        let answers = match answer.map(|answer| answer.action) {
            Some(ElicitationAction::Accept(accepted)) => {
                Some(crate::agents::question::answers(&ask, &accepted.content.unwrap_or_default()))
            }
            _ => None,
        };
        let asked: Vec<&str> = ask.questions.iter().map(|question| question.question.as_str()).collect();
        let (path, body) = match &answers {
            Some(answers) => (format!("/question/{}/reply", ask.request_id), json!({ "answers": answers })),
            None => (format!("/question/{}/reject", ask.request_id), json!({})),
        };
        tracing::info!(session = %session, request = %ask.request_id, answered = answers.is_some(), "answering OpenCode's question");
        if answers.is_none() {
            let why = if forms { "no answer was given" } else { "this editor cannot show questions" };
            // Before the reply: OpenCode ends the turn on it, and the note must be in the turn.
            let _ = notes.send(format!(
                "_{agent} asked \"{}\"; {why}, so it was told the question was dismissed._",
                asked.join(" ")
            ));
        }
        if let Err(e) = client.call_within(REQUEST_LIMIT, Method::POST, &path, Some(&body)).await {
            tracing::warn!(session = %session, "could not answer OpenCode's question: {e}");
        }
    })
}

/// Answers one permission request of OpenCode: at once under `auto`, else by asking the editor.
fn answer_permission(
    session: String,
    sink: Arc<dyn UpdateSink>,
    always: Arc<crate::agents::opencode::permissions::AlwaysAllowed>,
    asking: bool,
    client: Client,
    ask: PermissionAsk,
) -> tokio::task::JoinHandle<()> {
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
        if let Err(e) = client.call_within(REQUEST_LIMIT, Method::POST, &path, Some(&json!({ "reply": reply }))).await {
            tracing::warn!(session = %session, "could not answer the permission request: {e}");
        }
    })
}

/// Gives OpenCode session `ses` on `server` the session's rules (its approvals, mode and "always" answers, composed
/// with the agent's own); answers the agent its turns run. Before every turn, never from a cache: the rules live in
/// OpenCode's database, which another server of the same sandbox (other approvals) or another bridge may have
/// written since, and only the session's own turn (one at a time, across bridges) writes them, right before its
/// prompt.
async fn session_rules(
    allowed: &[Rule],
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
    let ours = permissions::bridge_rules(approvals, mode == Some("plan"), allowed);
    let mut rules = permissions::session_rules(&ours, &own);
    rules.extend(permissions::root_rules(&record.context.additional_directories, &own));
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
pub(super) async fn conversation(
    bridge: &dyn BridgeHost,
    session: &str,
    client: &Client,
) -> Result<std::result::Result<String, ClientError>> {
    let gate = bridge.gate(session);
    let _one = gate.lock().await;
    let record = bridge.store().session(session).await?;
    if let Some(native) = record.as_ref().and_then(|record| record.native_id.clone()) {
        return Ok(Ok(native));
    }
    // A fork in its original's sandbox forks the original's OpenCode session, everything of it.
    let forked = record.as_ref().and_then(|record| record.context.forked_from.as_ref());
    let (path, what) = match forked.and_then(|forked| forked.native.as_deref()) {
        Some(original) => (format!("/session/{original}/fork"), "a fork of the original's conversation"),
        None => ("/session".to_string(), "a new conversation"),
    };
    let created = match client.call_within(REQUEST_LIMIT, Method::POST, &path, Some(&json!({}))).await {
        Ok(created) => created,
        Err(e) => return Ok(Err(e)),
    };
    let Some(native) = created["id"].as_str() else {
        return Ok(Err(ClientError::Invalid { what: format!("POST {path}"), why: "no id".into() }));
    };
    tracing::debug!(session, native, "{what}");
    tracing::info!(session, native, "the CLI conversation id");
    bridge.store().set_native_id(session, Some(native)).await?;
    Ok(Ok(native.to_string()))
}

/// Starts `opencode serve` in the session's sandbox: the same command, environment and isolation as a turn's
/// `opencode run`, plus the server's password and its door.
#[allow(clippy::too_many_arguments)]
pub(super) async fn start_server(
    bridge: &dyn BridgeHost,
    session: &str,
    key: &str,
    sandbox: Arc<dyn Sandbox>,
    executable: &Path,
    credential: Option<&(&'static str, String)>,
    model: Option<&str>,
    profile: &Profile,
) -> std::result::Result<Started, super::ServeError> {
    let password = Servers::password();
    let mut env = bridge.cli_environment(sandbox.as_ref(), credential, model);
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
    crate::agents::opencode::mcp::add_servers(&mut env, &profile.mcp_servers)
        .map_err(|e| super::ServeError::Start(format!("the editor's MCP servers: {e}")))?;
    let port = Servers::port(bridge.private_network());
    let keep_warm = bridge.keep_warm().map(|linger| crate::sandbox::local::warm::KeepWarm {
        key: key.to_string(),
        linger,
        secret: password.clone(),
    });
    let mut spec = crate::sandbox::ExecSpec {
        serve_port: Some(port),
        keep_warm,
        ..bridge.cli_spec(executable, sandbox.as_ref(), env, super::server_args(port))
    };
    spec.net.endpoints.extend(crate::agents::mcp::endpoints(&profile.mcp_servers));
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

#[cfg(test)]
mod tests {
    use super::*;

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
