//! A typed ACP client of an agent server over stdio, built on the official SDK's client role
//! (`agent_client_protocol::Client`): the bench and the integration tests that only need well-formed ACP use it.
//!
//! It spawns the server from a `Command`, drives the SDK connection on a runtime of its own (one worker thread, so
//! that the client never takes more than one core from the server it measures) and gives blocking calls to the
//! test's thread: `initialize`, `session/new`, `session/prompt`, `session/cancel`, `session/load`. Every
//! `session/update` is decoded as a `SessionNotification` and kept per session with when it arrived, stamped in
//! the SDK's dispatch loop: the loop finishes each notification before the next message, so a prompt's answer is
//! seen only after every update the server sent before it (a raw-throughput bench only counts them instead:
//! [`Updates::Counted`]). The server's requests are answered as an editor would:
//! `session/request_permission` with the option of a chosen kind, `fs/write_text_file` written to disk or not.
//!
//! Protocol tests that send malformed bytes keep the raw client of `tests/support/mod.rs`: the SDK sends only
//! well-formed JSON-RPC.
#![allow(dead_code)] // the bench and each test crate use a different part

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, ContentChunk, FileSystemCapabilities, Implementation,
    InitializeRequest, InitializeResponse, LoadSessionRequest, LoadSessionResponse, NewSessionRequest,
    PermissionOptionKind, PromptRequest, PromptResponse, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionId, SessionNotification, SessionUpdate, StopReason,
    TextContent, WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::{Agent, Client, Error, JsonRpcRequest, Lines};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// Upper bound for one request's answer (a turn may stream for long). Only a failure bound: nothing waits this
/// long normally.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// How the client answers what the server asks.
#[derive(Clone, Debug)]
pub struct Answers {
    /// `session/request_permission` is answered with the first option of this kind; `None`, or no option of that
    /// kind, answers `cancelled`.
    pub permission: Option<PermissionOptionKind>,
    /// Offer `fs.writeTextFile` in `initialize` (a client like Zed that reviews the agent's writes).
    pub offer_writes: bool,
    /// Write what `fs/write_text_file` carries to disk (true), or answer without writing, which leaves the user's
    /// file as it was (false).
    pub keep_writes: bool,
}

impl Default for Answers {
    fn default() -> Self {
        Answers { permission: None, offer_writes: false, keep_writes: true }
    }
}

/// One `session/update` and when it arrived (both clocks: `at` for durations in this process, `wall` to compare
/// with a time another process printed).
#[derive(Clone, Debug)]
pub struct Received {
    pub at: Instant,
    pub wall: SystemTime,
    pub update: SessionUpdate,
}

/// One `fs/write_text_file` the server sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileWrite {
    pub path: PathBuf,
    pub content: String,
    /// What the file held on disk when the request arrived (`None`: no file).
    pub before: Option<String>,
}

/// The answer to a prompt (or a `session/load`) and the session's updates that arrived before it.
#[derive(Debug)]
pub struct Turn<T = PromptResponse> {
    pub result: Result<T, Error>,
    pub updates: Vec<Received>,
}

impl<T> Turn<T> {
    /// The text of the agent's message chunks, in order.
    pub fn agent_text(&self) -> String {
        chunk_text(&self.updates, |update| match update {
            SessionUpdate::AgentMessageChunk(chunk) => Some(chunk),
            _ => None,
        })
    }

    /// The text of the user's message chunks (a replay sends the prompts as those), in order.
    pub fn user_text(&self) -> String {
        chunk_text(&self.updates, |update| match update {
            SessionUpdate::UserMessageChunk(chunk) => Some(chunk),
            _ => None,
        })
    }

    /// How many updates `pick` accepts.
    pub fn count(&self, pick: impl Fn(&SessionUpdate) -> bool) -> usize {
        self.updates.iter().filter(|received| pick(&received.update)).count()
    }
}

impl Turn<PromptResponse> {
    /// The stop reason; a failed prompt fails the test with its error.
    pub fn stop_reason(&self) -> StopReason {
        match &self.result {
            Ok(response) => response.stop_reason,
            Err(e) => panic!("the prompt failed: {e:?}"),
        }
    }
}

/// The concatenated text of the text chunks `pick` takes from `updates`.
pub fn chunk_text(updates: &[Received], pick: impl Fn(&SessionUpdate) -> Option<&ContentChunk>) -> String {
    updates
        .iter()
        .filter_map(|received| pick(&received.update))
        .filter_map(|chunk| match &chunk.content {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect()
}

/// An agent text chunk's text, with whether it carries a message id (a model's text does; the bridge's own notes
/// do not).
pub fn agent_chunk(update: &SessionUpdate) -> Option<(&str, bool)> {
    match update {
        SessionUpdate::AgentMessageChunk(ContentChunk { content: ContentBlock::Text(text), message_id, .. }) => {
            Some((text.text.as_str(), message_id.is_some()))
        }
        _ => None,
    }
}

/// What the connection's handlers share with the test's thread.
struct Shared {
    state: Mutex<State>,
    /// Signalled on every update and every answer.
    changed: Condvar,
}

struct State {
    /// Updates not taken yet, per session, in arrival order.
    updates: HashMap<SessionId, Vec<Received>>,
    /// Every `session/update` decoded.
    notifications: usize,
    answers: Answers,
    /// Every `session/request_permission` received, in order.
    permission_requests: Vec<RequestPermissionRequest>,
    /// Every `fs/write_text_file` received, in order.
    file_writes: Vec<FileWrite>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A handler that panicked has failed the test already; what it left is still worth reading.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A request sent and not answered yet.
pub struct Pending<T> {
    task: tokio::task::JoinHandle<Result<T, Error>>,
    done: Arc<AtomicBool>,
    method: String,
}

impl<T> Pending<T> {
    /// Whether its answer (or the connection's end) has arrived.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }
}

/// A running agent server and the client side of its ACP connection.
pub struct AcpClient {
    pub child: Child,
    cx: ConnectionTo<Agent>,
    shared: Arc<Shared>,
    /// The `session/update` lines counted, not decoded ([`Updates::Counted`]).
    counted: Arc<AtomicUsize>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Ends the connection's main function: the transport, and with it the server's stdin, is dropped.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    connection: Option<tokio::task::JoinHandle<Result<(), Error>>>,
    runtime: tokio::runtime::Runtime,
}

/// What the client does with the `session/update`s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Updates {
    /// Decoded by the SDK as `SessionNotification`s and kept per session.
    Decoded,
    /// Only counted, by their line's prefix, before the SDK sees them: for a bench of raw throughput, where
    /// decoding 100,000 of them would measure the client (it takes the bridge's other core) instead of the bridge.
    /// The bridge writes its lines compact, `jsonrpc` then `method` first; a line written otherwise is decoded (and
    /// counts the same).
    Counted,
}

/// How every `session/update` line of the bridge starts.
const NOTIFICATION: &str = r#"{"jsonrpc":"2.0","method":"session/update","#;

/// At most this much of the server's stderr is kept (its tail), for failure messages.
const STDERR_KEPT: usize = 1 << 20;

impl AcpClient {
    /// Spawns `command` (stdin, stdout and stderr piped) and connects; does not initialize.
    pub fn spawn(command: Command, answers: Answers) -> AcpClient {
        Self::spawn_with(command, answers, Updates::Decoded)
    }

    /// Like [`AcpClient::spawn`], with the updates handled as `updates` says.
    pub fn spawn_with(mut command: Command, answers: Answers, updates: Updates) -> AcpClient {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("acp-client")
            .enable_all()
            .build()
            .expect("the client's runtime");
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = stderr.clone();
        let mut pipe = child.stderr.take().expect("stderr piped");
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut kept = sink.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > STDERR_KEPT {
                    let cut = kept.len() - STDERR_KEPT / 2;
                    kept.drain(..cut);
                }
            }
        });
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                updates: HashMap::new(),
                notifications: 0,
                answers,
                permission_requests: Vec::new(),
                file_writes: Vec::new(),
            }),
            changed: Condvar::new(),
        });
        let (stdin, stdout) = {
            // Tokio's pipes register with the runtime's reactor when made.
            let _context = runtime.enter();
            (
                tokio::process::ChildStdin::from_std(child.stdin.take().expect("stdin piped")).expect("async stdin"),
                tokio::process::ChildStdout::from_std(child.stdout.take().expect("stdout piped"))
                    .expect("async stdout"),
            )
        };
        let (cx_tx, cx_rx) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let counted = Arc::new(AtomicUsize::new(0));
        let tap = matches!(updates, Updates::Counted).then(|| counted.clone());
        let connection = runtime.spawn(connect(transport(stdin, stdout, tap), shared.clone(), cx_tx, stopped));
        let Ok(cx) = cx_rx.blocking_recv() else {
            let outcome = runtime.block_on(connection);
            panic!("the ACP connection ended before it started: {outcome:?}");
        };
        AcpClient { child, cx, shared, counted, stderr, stop: Some(stop), connection: Some(connection), runtime }
    }

    /// Spawns `command`, connects and completes `initialize`.
    pub fn start(command: Command, answers: Answers) -> AcpClient {
        let client = Self::spawn(command, answers);
        client.initialize();
        client
    }

    /// `initialize` the way Zed sends it (protocol 1, no terminal; fs writes only with `offer_writes`).
    pub fn initialize(&self) -> InitializeResponse {
        let writes = self.shared.lock().answers.offer_writes;
        let request = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(
                ClientCapabilities::new()
                    .fs(FileSystemCapabilities::new().read_text_file(false).write_text_file(writes))
                    .terminal(false),
            )
            .client_info(Implementation::new("acp-sandbox-tests", "0.0.0"));
        self.request(request).unwrap_or_else(|e| self.fail(&format!("initialize failed: {e:?}")))
    }

    /// Sends a request without waiting for its answer.
    pub fn send<Req>(&self, request: Req) -> Pending<Req::Response>
    where
        Req: JsonRpcRequest,
        Req::Response: Send + 'static,
    {
        let method = request.method().to_string();
        let sent = self.cx.send_request(request);
        let done = Arc::new(AtomicBool::new(false));
        let (shared, flag) = (self.shared.clone(), done.clone());
        let task = self.runtime.spawn(async move {
            let answer = sent.block_task().await;
            // Under the lock: a waiter checks the flag under it, so it cannot miss this signal.
            let _state = shared.lock();
            flag.store(true, Ordering::SeqCst);
            shared.changed.notify_all();
            answer
        });
        Pending { task, done, method }
    }

    /// Waits for the answer to `pending`, failing the test after [`REQUEST_TIMEOUT`].
    pub fn wait<T>(&self, pending: Pending<T>) -> Result<T, Error> {
        let Pending { task, method, .. } = pending;
        match self.runtime.block_on(within(task)) {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => self.fail(&format!("waiting for the answer to {method}: {e}")),
            Err(_) => self.fail(&format!("no answer to {method} within {REQUEST_TIMEOUT:?}")),
        }
    }

    /// Sends a request and waits for its answer.
    pub fn request<Req>(&self, request: Req) -> Result<Req::Response, Error>
    where
        Req: JsonRpcRequest,
        Req::Response: Send + 'static,
    {
        self.wait(self.send(request))
    }

    /// `session/new` in `cwd`; returns the session id.
    pub fn new_session(&self, cwd: &Path) -> SessionId {
        let response = self
            .request(NewSessionRequest::new(cwd))
            .unwrap_or_else(|e| self.fail(&format!("session/new failed: {e:?}")));
        response.session_id
    }

    /// Sends a prompt of one text block without waiting. The session's updates not taken yet are dropped first:
    /// what [`AcpClient::finish_turn`] returns is this turn's.
    pub fn send_prompt(&self, session: &SessionId, text: &str) -> Pending<PromptResponse> {
        self.take_updates(session);
        self.send(PromptRequest::new(session.clone(), vec![ContentBlock::Text(TextContent::new(text))]))
    }

    /// Waits for the answer to a prompt of [`AcpClient::send_prompt`]; with the session's updates before it.
    pub fn finish_turn(&self, session: &SessionId, pending: Pending<PromptResponse>) -> Turn {
        let result = self.wait(pending);
        Turn { result, updates: self.take_updates(session) }
    }

    /// A whole turn: one text block in, the updates and the answer out.
    pub fn prompt(&self, session: &SessionId, text: &str) -> Turn {
        let pending = self.send_prompt(session, text);
        self.finish_turn(session, pending)
    }

    /// `session/load` of `session` in `cwd`: the updates replayed before the answer, and the answer.
    pub fn load_session(&self, session: &SessionId, cwd: &Path) -> Turn<LoadSessionResponse> {
        self.take_updates(session);
        let result = self.request(LoadSessionRequest::new(session.clone(), cwd));
        Turn { result, updates: self.take_updates(session) }
    }

    /// `session/cancel` of `session`.
    pub fn cancel(&self, session: &SessionId) {
        if let Err(e) = self.cx.send_notification(CancelNotification::new(session.clone())) {
            self.fail(&format!("session/cancel could not be sent: {e:?}"));
        }
    }

    /// Takes the session's updates received so far.
    pub fn take_updates(&self, session: &SessionId) -> Vec<Received> {
        self.shared.lock().updates.remove(session).unwrap_or_default()
    }

    /// Waits until an update of `session` that `pred` accepts arrives while `pending` is not answered; returns
    /// it, and leaves it and the updates before it taken. Fails the test when `pending` is answered first or
    /// after [`REQUEST_TIMEOUT`].
    pub fn wait_update<T>(
        &self,
        session: &SessionId,
        pending: &Pending<T>,
        pred: impl Fn(&SessionUpdate) -> bool,
    ) -> Received {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let mut state = self.shared.lock();
        loop {
            if let Some(updates) = state.updates.get_mut(session)
                && let Some(at) = updates.iter().position(|received| pred(&received.update))
            {
                return updates.drain(..=at).next_back().expect("the update found");
            }
            if pending.is_done() {
                drop(state);
                self.fail(&format!("{} was answered before the update awaited arrived", pending.method));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(state);
                self.fail(&format!("the update awaited did not arrive within {REQUEST_TIMEOUT:?}"));
            }
            state = self.shared.changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Every `session/update` received so far, of every session, decoded or only counted.
    pub fn notifications(&self) -> usize {
        self.shared.lock().notifications + self.counted.load(Ordering::SeqCst)
    }

    /// Every `session/request_permission` received so far.
    pub fn permission_requests(&self) -> Vec<RequestPermissionRequest> {
        self.shared.lock().permission_requests.clone()
    }

    /// Every `fs/write_text_file` received so far.
    pub fn file_writes(&self) -> Vec<FileWrite> {
        self.shared.lock().file_writes.clone()
    }

    /// Changes how the server's requests are answered from now on.
    pub fn set_answers(&self, answers: Answers) {
        self.shared.lock().answers = answers;
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's stderr so far (its tail).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|poisoned| poisoned.into_inner())).into_owned()
    }

    /// Fails the test with `message` and the server's stderr tail.
    pub fn fail(&self, message: &str) -> ! {
        let stderr = self.stderr();
        let tail: Vec<&str> = stderr.lines().rev().take(60).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!("{message}\n--- the agent server's stderr (tail) ---\n{}", tail.join("\n"));
    }

    /// Ends the connection as an editor that goes away cleanly does: the server's stdin is closed.
    pub fn close_stdin(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(connection) = self.connection.take() {
            // The transport is dropped when the connection's future ends.
            match self.runtime.block_on(within(connection)) {
                Ok(Ok(Ok(()))) => {}
                outcome => self.fail(&format!("the ACP connection did not end cleanly: {outcome:?}")),
            }
        }
    }

    /// Closes the server's stdin and waits for it to exit on its own.
    pub fn close(mut self) -> ExitStatus {
        self.close_stdin();
        self.child.wait().expect("wait for the agent server")
    }

    /// SIGKILL, like Zed closing the project; waits for the process to be gone.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AcpClient {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// `future`, or an `Elapsed` after [`REQUEST_TIMEOUT`]. (A timer is made inside the runtime: it needs the runtime's
/// clock.)
async fn within<F: std::future::IntoFuture>(future: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    tokio::time::timeout(REQUEST_TIMEOUT, future).await
}

/// Newline-delimited JSON over the child's pipes, as the SDK's `Lines` transport takes it. (Its `ByteStreams`
/// takes `futures::io` streams, which tokio's pipes are only through `tokio-util`'s `compat` feature: turning that
/// on would rebuild the library and every dependent of `tokio-util` in each profile, for these few lines.)
/// With `counted`, the `session/update` lines are counted there and never reach the SDK ([`Updates::Counted`]).
fn transport(
    stdin: tokio::process::ChildStdin,
    stdout: tokio::process::ChildStdout,
    counted: Option<Arc<AtomicUsize>>,
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
    let lines = tokio::io::BufReader::new(stdout).lines();
    let incoming = futures::stream::unfold((lines, counted), |(mut lines, counted)| async move {
        loop {
            match lines.next_line().await {
                Ok(Some(line)) => {
                    if let Some(counted) = &counted
                        && line.starts_with(NOTIFICATION)
                    {
                        // Counted before the next line is read: before the answer that follows it reaches the SDK.
                        counted.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    return Some((Ok(line), (lines, counted)));
                }
                Ok(None) => return None,
                Err(e) => return Some((Err(e), (lines, counted))),
            }
        }
    });
    Lines::new(Box::pin(outgoing), Box::pin(incoming))
}

/// The SDK's client role on `transport`: updates recorded, the server's requests answered; runs until `stopped`.
async fn connect(
    transport: impl agent_client_protocol::ConnectTo<Client> + 'static,
    shared: Arc<Shared>,
    cx_tx: tokio::sync::oneshot::Sender<ConnectionTo<Agent>>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), Error> {
    let (updates, permissions, writes) = (shared.clone(), shared.clone(), shared);
    Client
        .v1()
        .name("acp-sandbox-tests")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                let (at, wall) = (Instant::now(), SystemTime::now());
                let mut state = updates.lock();
                state.notifications += 1;
                let received = Received { at, wall, update: notification.update };
                state.updates.entry(notification.session_id).or_default().push(received);
                updates.changed.notify_all();
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                let mut state = permissions.lock();
                let chosen = state.answers.permission.and_then(|kind| {
                    request.options.iter().find(|option| option.kind == kind).map(|option| option.option_id.clone())
                });
                state.permission_requests.push(request);
                drop(state);
                let outcome = match chosen {
                    Some(option) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(option)),
                    None => RequestPermissionOutcome::Cancelled,
                };
                responder.respond(RequestPermissionResponse::new(outcome))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: WriteTextFileRequest, responder, _cx| {
                let mut state = writes.lock();
                if !state.answers.offer_writes {
                    drop(state);
                    return responder.respond_with_error(Error::method_not_found());
                }
                let WriteTextFileRequest { path, content, .. } = request;
                assert!(path.is_absolute(), "fs/write_text_file with a relative path: {}", path.display());
                let before = std::fs::read_to_string(&path).ok();
                if state.answers.keep_writes {
                    std::fs::create_dir_all(path.parent().expect("an absolute path has a parent")).unwrap();
                    std::fs::write(&path, &content).unwrap();
                }
                state.file_writes.push(FileWrite { path, content, before });
                drop(state);
                responder.respond(WriteTextFileResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            if cx_tx.send(cx).is_err() {
                return Ok(());
            }
            // The connection is the test's until it is dropped or closes the server's stdin.
            let _ = stopped.await;
            Ok(())
        })
        .await
}
