//! One ACP agent process in a session's sandbox and the bridge's ACP connection to it (the official SDK's client
//! role over the process's stdin and stdout): started, initialized, its session made or loaded, its updates routed
//! to the turn that runs, its requests answered inside the sandbox's policy, and stopped.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, ClientCapabilities, ConfigOptionUpdate, CreateElicitationRequest, CreateElicitationResponse,
    CreateTerminalRequest, CreateTerminalResponse, ElicitationAction, ElicitationCapabilities,
    ElicitationFormCapabilities, ElicitationMode, ElicitationScope, FileSystemCapabilities, Implementation,
    InitializeRequest, KillTerminalRequest, KillTerminalResponse, ReadTextFileRequest, ReadTextFileResponse,
    ReleaseTerminalRequest, ReleaseTerminalResponse, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SessionNotification, SessionUpdate, TerminalOutputRequest, TerminalOutputResponse,
    WaitForTerminalExitRequest, WaitForTerminalExitResponse, WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client, Lines};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::files::Files;
use super::options::{MODE, Selectors};
use super::route::{Event, Route, sender};
use super::terminals::Terminals;
use crate::agents::host::UpdateSink;
use crate::sandbox::progress::Waited;
use crate::sandbox::{ExecSpec, ExitInfo, OutputStream, ProcessHandle, Sandbox, SandboxError};

/// The longest line the agent may send: one more ends the connection (a hostile agent cannot fill the bridge's
/// memory with one message).
const LINE_LIMIT: usize = 64 << 20;

/// How much of the agent's stderr is kept, for its error messages.
const STDERR_KEPT: usize = 16 << 10;

/// How many of the running turn's messages wait for it at most: the agent waits when the turn falls behind.
const ROUTE_DEPTH: usize = 256;

/// Why the agent could not be started or asked.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The sandbox could not run it.
    #[error("{0}")]
    Sandbox(#[from] SandboxError),
    /// Its connection ended, or it answered an error.
    #[error("{0}")]
    Protocol(String),
    /// It did not initialize: why, and the end of what it wrote on stderr (bubblewrap's own error, when the
    /// sandbox could not be made).
    #[error("{why}")]
    NotStarted {
        /// What went wrong.
        why: String,
        /// The end of its stderr.
        stderr: String,
    },
}

/// One running ACP agent and the bridge's connection to it.
pub struct Connection {
    /// Requests and notifications to the agent.
    pub cx: ConnectionTo<Agent>,
    /// What it said it can do.
    pub capabilities: AgentCapabilities,
    /// Its name and version, as it gave them.
    pub info: Option<Implementation>,
    /// The names of the ways it says it can be logged in (for the words of an error that asks for one).
    pub auth_methods: Vec<String>,
    /// Which agent this is: its command line (what a later session of the same agent may take from this one).
    pub identity: String,
    /// The session's conversation in this process, once made or loaded; held while it is made, so that a warm start
    /// and a turn never make two.
    pub session: tokio::sync::Mutex<Option<String>>,
    /// What the agent says of its session's settings.
    announced: Arc<Mutex<Announced>>,
    /// The turn that runs now: its conversation and where its messages go.
    route: Route,
    /// Cancelled when the connection ended (the agent exited, closed its stdout or broke the protocol).
    pub closed: CancellationToken,
    /// Ends the connection.
    stop: CancellationToken,
    process: tokio::sync::Mutex<Box<dyn ProcessHandle>>,
    /// The agent's process tree when the running turn began ([`Connection::begin_turn`]).
    before_turn: Mutex<std::collections::HashSet<i32>>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    /// Cancelled when the agent's stderr was read to its end.
    stderr_read: CancellationToken,
    /// The commands it runs through `terminal/*`.
    terminals: Arc<Terminals>,
    /// Killed (a cancel it did not answer, a stop): never used again.
    dead: AtomicBool,
    /// The connection to the sandbox it was started through.
    pub sandbox: Arc<dyn Sandbox>,
}

impl Connection {
    /// Starts the agent (`spec`, with a stdin of its own) in `sandbox` and initializes it: its connection within
    /// `limit`, its answer as long as it progresses ([`crate::sandbox::progress`]).
    /// `forms`: the editor fills in forms, so the agent is told it may ask for them. `outside`: where what it says
    /// of its session between turns goes (its commands, options and title; ours is the session's id there).
    pub async fn start(
        sandbox: Arc<dyn Sandbox>,
        identity: String,
        mut spec: ExecSpec,
        roots: Vec<PathBuf>,
        limit: Duration,
        forms: bool,
        outside: Option<(String, Arc<dyn UpdateSink>)>,
    ) -> Result<Arc<Self>, ConnectionError> {
        spec.interactive = true;
        let files = Arc::new(Files::new(sandbox.clone(), &spec, roots.clone()));
        let route: Route = Arc::default();
        let terminals = Arc::new(Terminals::new(sandbox.clone(), &spec, roots, route.clone()));
        let process = sandbox.exec(spec).await?;
        let Some(stdin) = process.stdin else {
            return Err(ConnectionError::Protocol("the sandbox gave the agent no stdin".into()));
        };
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_read = CancellationToken::new();
        keep_tail(process.stderr, stderr.clone(), stderr_read.clone());
        let announced: Arc<Mutex<Announced>> = Arc::default();
        let (closed, stop) = (CancellationToken::new(), CancellationToken::new());
        let (cx_tx, cx_rx) = tokio::sync::oneshot::channel();
        let handlers = Handlers {
            route: route.clone(),
            announced: announced.clone(),
            files,
            terminals: terminals.clone(),
            outside,
        };
        tokio::spawn(run(transport(stdin, process.stdout), handlers, cx_tx, stop.clone(), closed.clone()));
        let mut handle = process.handle;
        let cx = match tokio::time::timeout(limit, cx_rx).await {
            Ok(Ok(cx)) => cx,
            _ => return Err(ConnectionError::Protocol("the connection to the agent did not start".into())),
        };
        let request = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(
                ClientCapabilities::new()
                    .fs(FileSystemCapabilities::new().read_text_file(true).write_text_file(true))
                    // Ours, which run in its sandbox: the editor's would run on the host.
                    .terminal(true)
                    .elicitation(
                        forms.then(|| ElicitationCapabilities::new().form(ElicitationFormCapabilities::new())),
                    ),
            )
            .client_info(Implementation::new("acp-sandbox", env!("CARGO_PKG_VERSION")));
        let answer = cx.send_request(request).block_task();
        let answer = async {
            tokio::select! {
                answer = answer => answer,
                _ = closed.cancelled() => Err(agent_client_protocol::Error::internal_error()),
            }
        };
        // Its start in the sandbox is part of `initialize`: waited for as long as it progresses (a loaded machine),
        // not by a clock.
        // Borrowed mutably: a handle is not shared between threads.
        let watched = &mut handle;
        let answer = crate::sandbox::progress::patiently(
            answer,
            move || watched.activity(),
            || {
                tracing::info!("the ACP agent is still starting (it has not answered initialize yet)");
            },
        )
        .await;
        let connection = |capabilities, info, auth_methods| Connection {
            cx: cx.clone(),
            capabilities,
            info,
            auth_methods,
            identity: identity.clone(),
            session: tokio::sync::Mutex::new(None),
            route: route.clone(),
            announced: announced.clone(),
            closed: closed.clone(),
            stop: stop.clone(),
            process: tokio::sync::Mutex::new(handle),
            before_turn: Mutex::default(),
            stderr: stderr.clone(),
            stderr_read: stderr_read.clone(),
            terminals: terminals.clone(),
            dead: AtomicBool::new(false),
            sandbox: sandbox.clone(),
        };
        let started = match answer {
            Waited::Done(Ok(answer)) => {
                let methods = answer.auth_methods.iter().map(|method| method.name().to_string()).collect();
                connection(answer.agent_capabilities, answer.agent_info, methods)
            }
            Waited::Done(Err(e)) => {
                let connection = connection(AgentCapabilities::default(), None, Vec::new());
                // An agent that died answers through its closed transport a moment before the connection says so.
                connection.ending().await;
                let why = connection.failure(&format!("it did not initialize: {}", e.message)).await;
                connection.kill().await;
                return Err(ConnectionError::NotStarted { why, stderr: connection.stderr_tail() });
            }
            gave_up => {
                let connection = connection(AgentCapabilities::default(), None, Vec::new());
                let why = connection.failure(&gave_up.why("answer initialize")).await;
                connection.kill().await;
                return Err(ConnectionError::NotStarted { why, stderr: connection.stderr_tail() });
            }
        };
        Ok(Arc::new(started))
    }

    /// Whether the agent can still be used.
    pub fn alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst) && !self.closed.is_cancelled()
    }

    /// Sends the messages of `session` to a turn from now on: the receiver is the turn's.
    pub fn route_to(&self, session: &str) -> mpsc::Receiver<Event> {
        let (tx, rx) = mpsc::channel(ROUTE_DEPTH);
        self.terminals.begin_turn();
        *self.route.lock().unwrap_or_else(|p| p.into_inner()) = Some((session.to_string(), tx));
        rx
    }

    /// A turn begins: what the agent's tree holds now is not the turn's (see [`Connection::end_turn`]).
    pub async fn begin_turn(&self) {
        let tree = self.process.lock().await.tree();
        *self.before_turn.lock().unwrap_or_else(|p| p.into_inner()) = tree;
    }

    /// Ends what the stopped turn started and left running: the terminals it made through the bridge, and the
    /// commands the agent ran itself in groups of their own (Codex leaves them running after it answered the
    /// cancel). The agent, and what it ran before the turn, run on.
    pub async fn end_turn(&self) {
        self.terminals.end_turn();
        let before = self.before_turn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.process.lock().await.end_new_groups(&before);
    }

    /// What the agent said of its session's settings, when it changed them since this was last asked.
    pub fn take_announced(&self) -> Option<Selectors> {
        let mut announced = self.announced.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut announced.unkept).then(|| announced.now.clone())
    }

    /// What the agent said of its session's settings.
    pub fn selectors(&self) -> Selectors {
        self.announced.lock().unwrap_or_else(|p| p.into_inner()).now.clone()
    }

    /// What the agent says of its session's settings now (it opened the session, or took a choice), kept.
    pub fn set_selectors(&self, selectors: Selectors) {
        *self.announced.lock().unwrap_or_else(|p| p.into_inner()) = Announced { now: selectors, unkept: false };
    }

    /// No turn runs: what the agent says now is not anyone's (a replay of `session/load`, a late update).
    pub fn unroute(&self) {
        self.route.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Ends the agent and everything it started, at once.
    pub async fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.unroute();
        self.stop.cancel();
        self.terminals.end_all();
        self.process.lock().await.kill().await;
    }

    /// Stops the agent so that it keeps what it wrote: the connection ends, which closes its stdin (the end of its
    /// input, on which an ACP agent exits), it gets `grace` to exit, and then it is killed with everything it
    /// started. What a kill at once could cut short (a session file written after the turn) is written by then.
    pub async fn end(&self, grace: Duration) {
        self.dead.store(true, Ordering::SeqCst);
        self.unroute();
        self.stop.cancel();
        self.terminals.end_all();
        let mut process = self.process.lock().await;
        if tokio::time::timeout(grace, process.wait()).await.is_err() {
            tracing::debug!("the ACP agent did not exit within {grace:?} of the end of its input: killed");
        }
        process.kill().await;
    }

    /// Ends what the agent's tools left running beside it in the sandbox (a daemon that left their process group):
    /// everything outside the agent's own process tree.
    pub async fn end_strays(&self) {
        self.process.lock().await.end_strays();
    }

    /// How the agent ended, once it did (waits a moment for its exit status).
    pub async fn exit(&self) -> Option<ExitInfo> {
        let mut process = self.process.lock().await;
        tokio::time::timeout(Duration::from_secs(2), process.wait()).await.ok().and_then(Result::ok)
    }

    /// The end of the agent's stderr.
    pub fn stderr_tail(&self) -> String {
        let kept = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let (a, b) = kept.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        crate::lines::strip_ansi(text.trim())
    }

    /// `what`, with how the agent ended when it did (its stderr goes with the error on its own: what it wrote last
    /// is read first, unless something it left running holds the pipe open).
    pub async fn failure(&self, what: &str) -> String {
        match if self.closed.is_cancelled() { self.exit().await } else { None } {
            Some(exit) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), self.stderr_read.cancelled()).await;
                format!("{what} (it exited with {})", exit.describe())
            }
            None => what.to_string(),
        }
    }

    /// Whether the connection ends within a moment: an answer that failed because the agent went away may come
    /// just before the connection says so.
    pub async fn ending(&self) -> bool {
        tokio::time::timeout(Duration::from_secs(1), self.closed.cancelled()).await.is_ok()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.stop.cancel();
        self.terminals.end_all();
    }
}

/// A request of the agent's the bridge does not carry out, and why.
fn refused(why: String) -> agent_client_protocol::Error {
    agent_client_protocol::Error::new(agent_client_protocol::ErrorCode::INVALID_PARAMS, why)
}

/// Keeps the end of `stream` in `tail`; `read` is cancelled at its end.
fn keep_tail(mut stream: OutputStream, tail: Arc<Mutex<VecDeque<u8>>>, read: CancellationToken) {
    tokio::spawn(async move {
        let _read = read.drop_guard();
        let mut buf = vec![0u8; 8192];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let mut kept = tail.lock().unwrap_or_else(|p| p.into_inner());
            kept.extend(&buf[..n]);
            let over = kept.len().saturating_sub(STDERR_KEPT);
            kept.drain(..over);
        }
    });
}

/// Newline-delimited JSON over the agent's pipes, as the SDK's `Lines` transport takes it; a line longer than
/// [`LINE_LIMIT`] ends the stream with an error.
fn transport(
    stdin: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    stdout: OutputStream,
) -> Lines<
    impl futures::Sink<String, Error = std::io::Error> + Send + 'static,
    impl futures::Stream<Item = std::io::Result<String>> + Send + 'static,
> {
    let outgoing = futures::sink::unfold(stdin, |mut stdin, line: String| async move {
        stdin.write_all(line.as_bytes()).await?;
        stdin.write_all(b"\n").await?;
        stdin.flush().await?;
        Ok::<_, std::io::Error>(stdin)
    });
    let reader = tokio::io::BufReader::new(stdout);
    let incoming = futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut reader).take(LINE_LIMIT as u64 + 1).read_until(b'\n', &mut line).await {
                Ok(0) => return None,
                Ok(_) if line.len() > LINE_LIMIT => {
                    let error = std::io::Error::other(format!("the agent sent a line longer than {LINE_LIMIT} bytes"));
                    return Some((Err(error), None));
                }
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line);
                    let text = text.trim_end_matches(['\n', '\r']);
                    if text.trim().is_empty() {
                        continue;
                    }
                    return Some((Ok(text.to_string()), Some(reader)));
                }
                Err(e) => return Some((Err(e), None)),
            }
        }
    });
    Lines::new(Box::pin(outgoing), Box::pin(incoming))
}

/// What the agent said of its session's settings in this process.
#[derive(Default)]
struct Announced {
    now: Selectors,
    /// It changed them on its own since they were last kept in the store.
    unkept: bool,
}

impl Announced {
    /// `update` as the editor sees it: a change of the agent's options, or of its mode, is the session's whole option
    /// list (its modes and models said the older way are options there, so a list of its own options alone would
    /// take them away); `None`: it changes nothing the editor is shown.
    fn seen(&mut self, update: SessionUpdate) -> Option<SessionUpdate> {
        match update {
            SessionUpdate::ConfigOptionUpdate(update) => {
                self.now.options = Some(update.config_options);
            }
            SessionUpdate::CurrentModeUpdate(update) => {
                let mode = update.current_mode_id.to_string();
                // A mode it never offered is not one the editor could show; the one it has already is no change.
                if !self.now.offers(MODE, &mode) || self.now.value(MODE).as_deref() == Some(mode.as_str()) {
                    return None;
                }
                self.now.select(MODE, &mode);
            }
            update => return Some(update),
        }
        self.unkept = true;
        Some(SessionUpdate::ConfigOptionUpdate(ConfigOptionUpdate::new(self.now.offered())))
    }
}

/// What the connection's handlers share with the [`Connection`].
struct Handlers {
    route: Route,
    announced: Arc<Mutex<Announced>>,
    files: Arc<Files>,
    terminals: Arc<Terminals>,
    outside: Option<(String, Arc<dyn UpdateSink>)>,
}

/// The bridge's side of the connection, until `stop` or the agent's end (then `closed` is cancelled).
async fn run(
    transport: impl agent_client_protocol::ConnectTo<Client> + 'static,
    handlers: Handlers,
    cx_tx: tokio::sync::oneshot::Sender<ConnectionTo<Agent>>,
    stop: CancellationToken,
    closed: CancellationToken,
) {
    let Handlers { route, announced, files, terminals, outside } = handlers;
    let (updates, permissions, elicits) = (route.clone(), route.clone(), route);
    let (reads, writes) = (files.clone(), files);
    let (shown, made, outputs, waits, kills, releases) = (
        terminals.clone(),
        terminals.clone(),
        terminals.clone(),
        terminals.clone(),
        terminals.clone(),
        terminals.clone(),
    );
    let result = Client
        .v1()
        .name("acp-sandbox")
        .on_receive_notification(
            async move |mut notification: SessionNotification, _cx| {
                if !shown.show(&notification.session_id.0, &mut notification.update) {
                    // Only a terminal's output, which the call's coalesced updates show.
                    return Ok(());
                }
                let seen = announced.lock().unwrap_or_else(|p| p.into_inner()).seen(notification.update);
                let Some(update) = seen else { return Ok(()) };
                notification.update = update;
                let Some(tx) = sender(&updates, &notification.session_id.0) else {
                    // Between turns only what describes the session reaches the editor (a load's replay does not).
                    let describes = matches!(
                        notification.update,
                        SessionUpdate::AvailableCommandsUpdate(_)
                            | SessionUpdate::ConfigOptionUpdate(_)
                            | SessionUpdate::SessionInfoUpdate(_)
                    );
                    match &outside {
                        Some((ours, sink)) if describes => sink.send(ours, notification.update),
                        _ => tracing::debug!(session = %notification.session_id.0, "an update of the ACP agent outside a turn"),
                    }
                    return Ok(());
                };
                match serde_json::to_string(&notification.update) {
                    // Awaited here, in the connection's order: the prompt's answer is routed only after it.
                    Ok(json) => drop(tx.send(Event::Update(json)).await),
                    Err(e) => tracing::warn!("an update of the ACP agent could not be serialized: {e}"),
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder: Responder<RequestPermissionResponse>, _cx| {
                let Some(tx) = sender(&permissions, &request.session_id.0) else {
                    return responder.respond(RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled));
                };
                if let Err(mpsc::error::SendError(Event::Permission(asked))) =
                    tx.send(Event::Permission(Box::new((request, responder)))).await
                {
                    let (_, responder) = *asked;
                    return responder.respond(RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled));
                }
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CreateElicitationRequest, responder: Responder<CreateElicitationResponse>, _cx| {
                // Only a form of one of its sessions (the editor shows it in that thread); a URL would send the user
                // to a page the agent chose.
                let session = match &request.mode {
                    ElicitationMode::Form(form) => match &form.scope {
                        ElicitationScope::Session(scope) => Some(scope.session_id.0.to_string()),
                        _ => None,
                    },
                    _ => None,
                };
                let Some(tx) = session.and_then(|session| sender(&elicits, &session)) else {
                    return responder.respond(CreateElicitationResponse::new(ElicitationAction::Decline));
                };
                if let Err(mpsc::error::SendError(Event::Elicit(asked))) =
                    tx.send(Event::Elicit(Box::new((request, responder)))).await
                {
                    let (_, responder) = *asked;
                    return responder.respond(CreateElicitationResponse::new(ElicitationAction::Cancel));
                }
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ReadTextFileRequest, responder: Responder<ReadTextFileResponse>, cx| {
                let files = reads.clone();
                // A read runs a command in the sandbox: not while the connection's other messages wait.
                cx.spawn(async move {
                    match files.read(&request.path, request.line, request.limit).await {
                        Ok(text) => responder.respond(ReadTextFileResponse::new(text)),
                        Err(why) => {
                            tracing::info!(path = %request.path.display(), "refused the ACP agent a read: {why}");
                            responder.respond_with_error(agent_client_protocol::Error::new(
                                agent_client_protocol::ErrorCode::INVALID_PARAMS,
                                why,
                            ))
                        }
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: WriteTextFileRequest, responder: Responder<WriteTextFileResponse>, cx| {
                let files = writes.clone();
                cx.spawn(async move {
                    match files.write(&request.path, &request.content).await {
                        Ok(()) => responder.respond(WriteTextFileResponse::new()),
                        Err(why) => {
                            tracing::info!(path = %request.path.display(), "refused the ACP agent a write: {why}");
                            responder.respond_with_error(agent_client_protocol::Error::new(
                                agent_client_protocol::ErrorCode::INVALID_PARAMS,
                                why,
                            ))
                        }
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CreateTerminalRequest, responder: Responder<CreateTerminalResponse>, cx| {
                let terminals = made.clone();
                cx.spawn(async move {
                    let command = request.command.clone();
                    match terminals.create(request).await {
                        Ok(id) => responder.respond(CreateTerminalResponse::new(id)),
                        Err(why) => {
                            tracing::info!(%command, "refused the ACP agent a terminal: {why}");
                            responder.respond_with_error(refused(why))
                        }
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: TerminalOutputRequest, responder: Responder<TerminalOutputResponse>, _cx| {
                match outputs.output(&request.session_id.0, &request.terminal_id.0) {
                    Ok(output) => responder.respond(output),
                    Err(why) => responder.respond_with_error(refused(why)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: WaitForTerminalExitRequest, responder: Responder<WaitForTerminalExitResponse>, cx| {
                let terminals = waits.clone();
                cx.spawn(async move {
                    match terminals.wait(&request.session_id.0, &request.terminal_id.0).await {
                        Ok(status) => responder.respond(WaitForTerminalExitResponse::new(status)),
                        Err(why) => responder.respond_with_error(refused(why)),
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: KillTerminalRequest, responder: Responder<KillTerminalResponse>, _cx| {
                match kills.kill(&request.session_id.0, &request.terminal_id.0) {
                    Ok(()) => responder.respond(KillTerminalResponse::new()),
                    Err(why) => responder.respond_with_error(refused(why)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ReleaseTerminalRequest, responder: Responder<ReleaseTerminalResponse>, _cx| {
                match releases.release(&request.session_id.0, &request.terminal_id.0) {
                    Ok(()) => responder.respond(ReleaseTerminalResponse::new()),
                    Err(why) => responder.respond_with_error(refused(why)),
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            if cx_tx.send(cx.clone()).is_err() {
                return Ok(());
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = cx.incoming_closed() => {}
            }
            Ok(())
        })
        .await;
    if let Err(e) = result {
        tracing::info!("the connection to the ACP agent ended: {e}");
    }
    terminals.end_all();
    closed.cancel();
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::v1::schema::{CurrentModeUpdate, SessionConfigOption, SessionMode, SessionModeState};
    use serde_json::json;

    use super::*;

    fn gemini_like() -> Announced {
        let modes = SessionModeState::new(
            "default",
            vec![SessionMode::new("default", "Default"), SessionMode::new("plan", "Plan")],
        );
        Announced { now: Selectors { options: None, modes: Some(modes), models: None }, unkept: false }
    }

    fn current_mode(update: Option<SessionUpdate>) -> Option<serde_json::Value> {
        match update? {
            SessionUpdate::ConfigOptionUpdate(update) => {
                let options = serde_json::to_value(update.config_options).unwrap();
                options.as_array()?.iter().find(|o| o["id"] == "mode").map(|o| o["currentValue"].clone())
            }
            _ => None,
        }
    }

    #[test]
    fn a_mode_the_agent_changes_is_said_as_the_option_list_and_a_mode_it_never_offered_is_not() {
        let mut announced = gemini_like();
        let switched = announced.seen(SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new("plan")));
        assert_eq!(current_mode(switched), Some(json!("plan")));
        assert!(std::mem::take(&mut announced.unkept), "to be kept in the store");
        assert_eq!(announced.seen(SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new("plan"))), None);
        assert_eq!(announced.seen(SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new("yolo"))), None);
        assert_eq!(announced.now.value(MODE).as_deref(), Some("plan"));
        assert!(!announced.unkept);
    }

    #[test]
    fn the_agents_own_options_changed_keep_its_modes_in_the_list() {
        let mut announced = gemini_like();
        let options: Vec<SessionConfigOption> = serde_json::from_value(json!([
            {"id": "effort", "name": "Effort", "type": "select", "currentValue": "low",
             "options": [{"value": "low", "name": "Low"}, {"value": "high", "name": "High"}]}
        ]))
        .unwrap();
        let seen = announced.seen(SessionUpdate::ConfigOptionUpdate(ConfigOptionUpdate::new(options)));
        let Some(SessionUpdate::ConfigOptionUpdate(update)) = seen else { panic!("{seen:?}") };
        let ids: Vec<String> = update.config_options.iter().map(|o| o.id.to_string()).collect();
        assert_eq!(ids, ["effort", "mode"]);
        assert!(announced.unkept);
    }
}
