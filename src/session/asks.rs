//! `--network ask` on the bridge's side: a host outside the allow-list becomes a permission card in the thread
//! whose turn runs in the sandbox that wants to reach it.
//!
//! Each turn of a bridge under `ask` registers here while it runs ([`NetworkAsks::enter`]); the proxies of the
//! local sandboxes ask through [`Asker`]. The sandbox is found by its name: under `ask` each session has a sandbox
//! of its own (`servers.rs` shares none), so a connection is always the session's. A session that kept a shared
//! sandbox from an earlier bridge is asked only while its turn is the only one running there. Concurrent
//! connections to one host wait on one question; "always" is kept in the store (`allowed_hosts`) and read for each
//! connection, so it holds after a restart and for another bridge on the same data dir.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::{
    PermissionOption, PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest, SessionUpdate,
    ToolCall, ToolCallContent, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio_util::sync::CancellationToken;

use super::UpdateSink;
use super::emitter::Emitter;
use crate::sandbox::net::ask::{ASK_TIMEOUT, Asker, Refusal, Verdict};
use crate::sandbox::net::proxy::authority;
use crate::store::Store;

/// The option ids of a network card.
const ONCE: &str = "once";
const ALWAYS: &str = "always";
const REJECT: &str = "reject";

/// The questions open: one per session and `host:port`, shared by the connections that wait for it.
type OpenQuestions = Arc<Mutex<HashMap<(String, String, u16), Shared<BoxFuture<'static, Verdict>>>>>;

/// The turns that can be asked, and the questions open.
pub(super) struct NetworkAsks {
    store: Arc<Store>,
    /// By session id.
    turns: Arc<Mutex<HashMap<String, Arc<Asking>>>>,
    open: OpenQuestions,
    /// How long a question waits for its answer: [`ASK_TIMEOUT`].
    timeout: std::time::Duration,
}

/// One running turn that may be asked.
struct Asking {
    session: String,
    /// The name of the sandbox it runs in, once known.
    sandbox: Mutex<Option<String>>,
    emit: Arc<Emitter>,
    sink: Arc<dyn UpdateSink>,
    /// Cancelled with the turn, and when the turn ends.
    cancel: CancellationToken,
    /// Held (read) by each question being asked: the end of the turn waits (write) until they are closed.
    questions: Arc<tokio::sync::RwLock<()>>,
    cards: AtomicU64,
}

impl Asking {
    fn runs_in(&self, sandbox: &str) -> bool {
        let placed = self.sandbox.lock().unwrap_or_else(|p| p.into_inner());
        placed.as_deref().unwrap_or(&self.session) == sandbox
    }
}

/// A turn's place in [`NetworkAsks`]: [`Entered::close`] at its end; dropped, it is left at once.
pub(super) struct Entered {
    turns: Arc<Mutex<HashMap<String, Arc<Asking>>>>,
    asking: Arc<Asking>,
}

impl Entered {
    /// Says which sandbox the turn runs in (its state dir's name).
    pub(super) fn place(&self, sandbox: &str) {
        *self.asking.sandbox.lock().unwrap_or_else(|p| p.into_inner()) = Some(sandbox.to_string());
    }

    /// Ends the turn's questions: each open one is withdrawn and refused, its card closed, before this returns.
    pub(super) async fn close(self) {
        self.leave();
        let _closed = self.asking.questions.write().await;
    }

    fn leave(&self) {
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        if turns.get(&self.asking.session).is_some_and(|asking| Arc::ptr_eq(asking, &self.asking)) {
            turns.remove(&self.asking.session);
        }
        self.asking.cancel.cancel();
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.leave();
    }
}

impl NetworkAsks {
    pub(super) fn new(store: Arc<Store>) -> Self {
        Self { store, turns: Arc::default(), open: Arc::default(), timeout: ASK_TIMEOUT }
    }

    /// Registers the running turn of `session` (its updates go through `emit`, its questions to `sink`) until
    /// the returned place is closed or dropped.
    pub(super) fn enter(
        &self,
        session: &str,
        emit: Arc<Emitter>,
        sink: Arc<dyn UpdateSink>,
        cancel: &CancellationToken,
    ) -> Entered {
        let asking = Arc::new(Asking {
            session: session.to_string(),
            sandbox: Mutex::new(None),
            emit,
            sink,
            cancel: cancel.child_token(),
            questions: Arc::default(),
            cards: AtomicU64::new(0),
        });
        self.turns.lock().unwrap_or_else(|p| p.into_inner()).insert(session.to_string(), asking.clone());
        Entered { turns: self.turns.clone(), asking }
    }

    /// The one turn running in `sandbox`.
    fn turn_in(&self, sandbox: &str) -> Result<Arc<Asking>, Refusal> {
        let turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        let found: Vec<&Arc<Asking>> = turns.values().filter(|asking| asking.runs_in(sandbox)).collect();
        match found.as_slice() {
            [] => Err(Refusal::NoTurn),
            [one] => Ok((*one).clone()),
            many => Err(Refusal::Shared(many.len())),
        }
    }
}

#[async_trait::async_trait]
impl Asker for NetworkAsks {
    async fn ask(&self, label: &str, host: &str, port: u16) -> Verdict {
        let asking = match self.turn_in(label) {
            Ok(asking) => asking,
            Err(refusal) => return Verdict::Refused(refusal),
        };
        if allowed_always(&self.store, &asking.session, host, port).await {
            return Verdict::Allowed;
        }
        let key = (asking.session.clone(), host.to_string(), port);
        let question = {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            match open.get(&key) {
                Some(question) => question.clone(),
                None => {
                    // A task of its own: the question, its card and an "always" are settled even when the
                    // connection that asked goes away.
                    let task = tokio::spawn(question(
                        self.store.clone(),
                        self.timeout,
                        asking,
                        host.to_string(),
                        port,
                        self.open.clone(),
                        key.clone(),
                    ));
                    let question =
                        async move { task.await.unwrap_or(Verdict::Refused(Refusal::TurnEnded)) }.boxed().shared();
                    open.insert(key, question.clone());
                    question
                }
            }
        };
        question.await
    }
}

/// Whether the user always allows `session`'s sandbox to reach `host:port` (as the store says now; a store that
/// cannot be read allows nothing, so the user is asked).
async fn allowed_always(store: &Store, session: &str, host: &str, port: u16) -> bool {
    match store.allowed_hosts(session).await {
        Ok(allowed) => allowed.iter().any(|(h, p)| h == host && *p == port),
        Err(e) => {
            tracing::warn!(session, "cannot read the hosts allowed always: {e}");
            false
        }
    }
}

/// Asks the user about `host:port` on a card of the turn, and settles the answer: the card closed, "always"
/// stored, the question no longer open.
async fn question(
    store: Arc<Store>,
    timeout: std::time::Duration,
    asking: Arc<Asking>,
    host: String,
    port: u16,
    open: OpenQuestions,
    key: (String, String, u16),
) -> Verdict {
    let verdict = ask_user(&store, timeout, &asking, &host, port).await;
    open.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
    verdict
}

async fn ask_user(store: &Store, timeout: std::time::Duration, asking: &Asking, host: &str, port: u16) -> Verdict {
    let _open = asking.questions.clone().read_owned().await;
    if asking.cancel.is_cancelled() {
        return Verdict::Refused(Refusal::TurnEnded);
    }
    // A question about the same host may have been answered "always" since this connection looked.
    if allowed_always(store, &asking.session, host, port).await {
        return Verdict::Allowed;
    }
    let target = authority(host, port);
    let id = format!("network-{}-{}", asking.emit.turn_id, asking.cards.fetch_add(1, Ordering::Relaxed));
    let title = format!("Connect to {target}");
    let content = vec![ToolCallContent::from(format!(
        "A program in the sandbox wants to connect to {target}, which `--network` does not allow. The connection \
         waits for your answer (at most {} s).",
        timeout.as_secs()
    ))];
    let raw = serde_json::json!({"host": host, "port": port});
    let card = ToolCall::new(id.clone(), title.clone())
        .kind(ToolKind::Fetch)
        .status(ToolCallStatus::Pending)
        .content(content.clone())
        .raw_input(raw.clone());
    if let Err(e) = asking.emit.send(SessionUpdate::ToolCall(card)).await {
        tracing::warn!(session = %asking.session, "cannot show the network card: {e}");
        return Verdict::Refused(Refusal::NoEditor);
    }
    let options = vec![
        PermissionOption::new(ONCE, "Allow once", PermissionOptionKind::AllowOnce),
        PermissionOption::new(
            ALWAYS,
            format!("Always allow {target} in this thread"),
            PermissionOptionKind::AllowAlways,
        ),
        PermissionOption::new(REJECT, "Refuse", PermissionOptionKind::RejectOnce),
    ];
    let fields = ToolCallUpdateFields::new().title(title).content(content).raw_input(raw);
    let request =
        RequestPermissionRequest::new(asking.session.clone(), ToolCallUpdate::new(id.clone(), fields), options);
    // Dropping the request withdraws it in the editor (`$/cancel_request`).
    let answer = tokio::select! {
        biased;
        _ = asking.cancel.cancelled() => Err(Refusal::TurnEnded),
        answer = tokio::time::timeout(timeout, asking.sink.request_permission(request)) => match answer {
            Err(_) => Err(Refusal::Unanswered(timeout)),
            Ok(None) => Err(Refusal::NoEditor),
            Ok(Some(RequestPermissionOutcome::Selected(selected))) => Ok(selected.option_id.0.to_string()),
            Ok(Some(_)) => Err(Refusal::ByUser),
        },
    };
    let (verdict, said) = match answer.as_deref() {
        Ok(ONCE) => (Verdict::Allowed, "Allowed once.".to_string()),
        Ok(ALWAYS) => match store.allow_host(&asking.session, host, port).await {
            Ok(()) => (Verdict::Allowed, format!("Allowed, from now on in this thread: {target}.")),
            Err(e) => {
                tracing::warn!(session = %asking.session, "cannot keep {target} as always allowed: {e}");
                (Verdict::Allowed, "Allowed once (it could not be kept for the thread).".to_string())
            }
        },
        Ok(_) => (Verdict::Refused(Refusal::ByUser), "Refused.".to_string()),
        Err(refusal) => (Verdict::Refused(refusal.clone()), format!("Refused: {refusal}.")),
    };
    tracing::info!(session = %asking.session, target = %target, allowed = (verdict == Verdict::Allowed), "asked about a connection");
    let status = if verdict == Verdict::Allowed { ToolCallStatus::Completed } else { ToolCallStatus::Failed };
    let fields = ToolCallUpdateFields::new().status(status).content(vec![ToolCallContent::from(said)]);
    if let Err(e) = asking.emit.send(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id, fields))).await {
        tracing::warn!(session = %asking.session, "cannot close the network card: {e}");
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An editor that records each question and answers every one with `answer` once `gate` opens.
    struct Editor {
        asked: Mutex<Vec<RequestPermissionRequest>>,
        answer: &'static str,
        gate: tokio::sync::Semaphore,
    }

    #[async_trait::async_trait]
    impl UpdateSink for Editor {
        fn send(&self, _session_id: &str, _update: SessionUpdate) {}

        async fn request_permission(&self, request: RequestPermissionRequest) -> Option<RequestPermissionOutcome> {
            self.asked.lock().unwrap().push(request);
            let _open = self.gate.acquire().await.ok()?;
            let selected = agent_client_protocol::v1::schema::SelectedPermissionOutcome::new(self.answer);
            Some(RequestPermissionOutcome::Selected(selected))
        }
    }

    async fn world(answer: &'static str) -> (tempfile::TempDir, Arc<Store>, Arc<Editor>, Arc<Emitter>) {
        let dir = tempfile::tempdir().unwrap();
        let (store, turn) =
            super::super::emitter::store_with_a_turn(dir.path(), std::time::Duration::from_secs(10)).await;
        let editor = Arc::new(Editor { asked: Mutex::default(), answer, gate: tokio::sync::Semaphore::new(0) });
        let emit = Arc::new(Emitter::new(store.clone(), editor.clone(), "s", turn, 0.0, CancellationToken::new()));
        (dir, store, editor, emit)
    }

    #[tokio::test]
    async fn connections_waiting_on_one_host_share_one_question_and_always_is_stored() {
        let (_dir, store, editor, emit) = world(ALWAYS).await;
        let asks = Arc::new(NetworkAsks::new(store.clone()));
        assert_eq!(asks.ask("s", "example.com", 443).await, Verdict::Refused(Refusal::NoTurn));
        let cancel = CancellationToken::new();
        let entered = asks.enter("s", emit, editor.clone(), &cancel);
        let waiting: Vec<_> = (0..3)
            .map(|_| {
                let asks = asks.clone();
                tokio::spawn(async move { asks.ask("s", "example.com", 443).await })
            })
            .collect();
        // All three wait for the one question: held by the map and by each of them.
        let held = || asks.open.lock().unwrap().values().map(|question| question.strong_count()).collect::<Vec<_>>();
        while held() != [Some(4)] {
            tokio::task::yield_now().await;
        }
        editor.gate.add_permits(10);
        for waiting in waiting {
            assert_eq!(waiting.await.unwrap(), Verdict::Allowed);
        }
        assert_eq!(editor.asked.lock().unwrap().len(), 1);
        assert_eq!(store.allowed_hosts("s").await.unwrap(), [("example.com".to_string(), 443)]);
        // Allowed always: no second question; another port is another host:port.
        assert_eq!(asks.ask("s", "example.com", 443).await, Verdict::Allowed);
        assert_eq!(editor.asked.lock().unwrap().len(), 1);
        assert_eq!(asks.ask("s", "example.com", 80).await, Verdict::Allowed);
        assert_eq!(editor.asked.lock().unwrap().len(), 2);
        let title = editor.asked.lock().unwrap()[1].tool_call.fields.title.clone();
        assert_eq!(title.as_deref(), Some("Connect to example.com:80"));
        // Another sandbox has no turn here; once the turn ended, neither has this one.
        assert_eq!(asks.ask("other", "example.com", 443).await, Verdict::Refused(Refusal::NoTurn));
        entered.close().await;
        assert_eq!(asks.ask("s", "example.org", 443).await, Verdict::Refused(Refusal::NoTurn));
    }

    #[tokio::test]
    async fn a_question_unanswered_in_time_is_a_refusal() {
        let (_dir, store, editor, emit) = world(ONCE).await;
        // A bound of a few milliseconds instead of two minutes; the editor never answers.
        let bound = std::time::Duration::from_millis(20);
        let asks = NetworkAsks { timeout: bound, ..NetworkAsks::new(store.clone()) };
        let cancel = CancellationToken::new();
        let _entered = asks.enter("s", emit, editor.clone(), &cancel);
        assert_eq!(asks.ask("s", "example.com", 443).await, Verdict::Refused(Refusal::Unanswered(bound)));
        assert_eq!(editor.asked.lock().unwrap().len(), 1);
        assert_eq!(Refusal::Unanswered(ASK_TIMEOUT).to_string(), "the user did not answer within 120 s");
    }

    #[tokio::test]
    async fn the_end_of_the_turn_refuses_an_open_question() {
        let (_dir, store, editor, emit) = world(ONCE).await;
        let asks = Arc::new(NetworkAsks::new(store.clone()));
        let cancel = CancellationToken::new();
        let entered = asks.enter("s", emit, editor.clone(), &cancel);
        entered.place("workspace-1");
        assert_eq!(asks.ask("s", "example.com", 443).await, Verdict::Refused(Refusal::NoTurn));
        let waiting = {
            let asks = asks.clone();
            tokio::spawn(async move { asks.ask("workspace-1", "example.com", 443).await })
        };
        while editor.asked.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        entered.close().await;
        assert_eq!(waiting.await.unwrap(), Verdict::Refused(Refusal::TurnEnded));
        assert!(store.allowed_hosts("s").await.unwrap().is_empty());
    }
}
