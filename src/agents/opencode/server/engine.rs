//! The server engine: one turn of a warm OpenCode server, as the turn loop sees it. Its stream is the server's
//! event stream (shared with the server's other sessions); stopping it asks OpenCode to abort, then kills the
//! server after a grace; its end is the session going idle, or the server's death.

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::schema::StopReason;
use hyper::Method;
use serde_json::Value;
use tokio::sync::mpsc;

use super::client::{Client, ClientError};
use super::sse::{MAX_EVENT, SseEvent};
use super::{Lease, Server, Servers};
use crate::agents::engine::{Attempt, Ended, Seen, Step, Stop, TurnEngine, ended, sleep_until_or_never, stopped};
use crate::agents::{Output, PermissionAsk, TurnEnd};
use crate::error::Error;

/// How long the stream must be quiet after an aborted OpenCode went idle before the turn ends.
const SETTLE: Duration = Duration::from_millis(500);

/// How long OpenCode gets to go idle after an abort before its server is killed: with the kill, the cancel is
/// answered within a second whatever the server does (stopped, not answering `/abort`, never going idle).
const ABORT_GRACE: Duration = Duration::from_millis(600);

/// After a cancel, the turn ends by then at the latest, also when a server that went idle keeps sending.
const CANCEL_LIMIT: Duration = Duration::from_millis(900);

/// How long a server that did not abort in time gets to say it still serves other turns.
const SHARED_HEALTH: Duration = Duration::from_secs(1);

/// How the server's side of a turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The session went idle: the turn is over.
    Idle,
    /// The server did not stop the turn in time, or ran into the sandbox's limit.
    KillServer,
    /// The server exited.
    ServerDied,
    /// The event stream ended.
    StreamEnded,
}

/// What the server's session asks of the user: a permission, or the `question` tool's questions.
pub enum Asked {
    /// A tool waits for approval (boxed: its card is most of the enum's size).
    Permission(Box<PermissionAsk>),
    /// The model asks questions; what the thread should be told of them goes to the sender, which the engine
    /// yields as notes (stored, then sent, like every update of the turn).
    Question(crate::agents::question::QuestionAsk, mpsc::UnboundedSender<String>),
}

/// What answers what the server's session asks.
pub type Answer = Box<dyn Fn(Client, Asked) -> tokio::task::JoinHandle<()> + Send + Sync>;

/// One turn through a warm server.
pub struct ServerEngine {
    server: Arc<Server>,
    lease: Lease,
    servers: Arc<Servers>,
    key: String,
    client: Client,
    /// The OpenCode session of the turn.
    ses: String,
    /// Our session, for the log.
    session: String,
    events: mpsc::Receiver<SseEvent>,
    /// A command runs beside the event stream: its call waits for its whole answer.
    command_call: Option<tokio::task::JoinHandle<Result<serde_json::Value, ClientError>>>,
    /// Answers the permission requests of the turn.
    answer: Answer,
    name: &'static str,
    idle: Duration,
    turn_timeout: Duration,
    /// Permission answers under way.
    pending: Vec<tokio::task::JoinHandle<()>>,
    /// Questions under way (their words, for the note when the turn stops first).
    questions: Vec<(tokio::task::JoinHandle<()>, String)>,
    /// Notes about questions, from their tasks: yielded by [`TurnEngine::next`].
    notes: (mpsc::UnboundedSender<String>, mpsc::UnboundedReceiver<String>),
    /// The OpenCode sessions of this turn's subagents (a shared server also runs other editor sessions' turns,
    /// whose permission requests are theirs to answer).
    children: Vec<String>,
    abort_deadline: Option<tokio::time::Instant>,
    /// After a stopped turn went idle: until the stream has been quiet for a moment.
    settle: Option<tokio::time::Instant>,
    settle_cap: Option<tokio::time::Instant>,
    /// Once cancelled: the turn ends by then whatever the server does.
    hard_end: Option<tokio::time::Instant>,
    outcome: Option<Outcome>,
}

impl ServerEngine {
    /// The engine of a turn prompted on `server`'s OpenCode session `ses`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        lease: Lease,
        servers: Arc<Servers>,
        key: String,
        session: &str,
        ses: String,
        events: mpsc::Receiver<SseEvent>,
        command_call: Option<tokio::task::JoinHandle<Result<serde_json::Value, ClientError>>>,
        answer: Answer,
        name: &'static str,
        (idle, turn_timeout): (Duration, Duration),
    ) -> Self {
        let server = lease.server().clone();
        Self {
            client: server.client.clone(),
            server,
            lease,
            servers,
            key,
            ses,
            session: session.to_string(),
            events,
            command_call,
            answer,
            name,
            idle,
            turn_timeout,
            pending: Vec::new(),
            questions: Vec::new(),
            notes: mpsc::unbounded_channel(),
            children: Vec::new(),
            abort_deadline: None,
            settle: None,
            settle_cap: None,
            hard_end: None,
            outcome: None,
        }
    }

    fn end(&mut self, outcome: Outcome) -> Step {
        self.outcome = Some(outcome);
        Step::Ended(Ended::Done)
    }

    fn abort(&self) {
        abort(&self.client, &self.ses);
    }

    fn drop_pending(&mut self) {
        for task in self.pending.drain(..) {
            task.abort();
        }
        for (task, asked) in self.questions.drain(..) {
            if !task.is_finished() {
                task.abort();
                let _ = self
                    .notes
                    .0
                    .send(format!("_{} asked \"{asked}\"; the turn stopped before an answer came._", self.name));
            }
        }
    }
}

#[async_trait::async_trait]
impl TurnEngine for ServerEngine {
    async fn next(&mut self) -> Step {
        // A note about a question belongs to the turn, also when it is ending.
        if let Ok(note) = self.notes.1.try_recv() {
            return Step::Note(note);
        }
        if let Some(outcome) = self.outcome {
            return self.end(outcome);
        }
        let name = self.name;
        loop {
            tokio::select! {
                biased;
                Some(note) = self.notes.1.recv() => return Step::Note(note),
                _ = sleep_until_or_never(if self.settle.is_some() { None } else { self.abort_deadline }) => {
                    return self.end(Outcome::KillServer);
                }
                _ = sleep_until_or_never(self.settle) => return self.end(Outcome::Idle),
                _ = self.server.exited() => return self.end(Outcome::ServerDied),
                // Never pending for good: the branch is off once the call is answered.
                result = async {
                    match self.command_call.as_mut() {
                        Some(call) => call.await,
                        None => std::future::pending().await,
                    }
                }, if self.command_call.is_some() => {
                    self.command_call = None;
                    if let Ok(Err(e)) = result {
                        tracing::warn!(session = %self.session, "the command failed: {e}");
                        let message = format!("{name} could not run the command: {e}");
                        return Step::Output(Output::End(TurnEnd::Error { message }));
                    }
                }
                event = self.events.recv() => {
                    let event = match event {
                        None => return self.end(Outcome::StreamEnded),
                        Some(SseEvent::Data(event)) => event,
                        Some(SseEvent::Oversize(bytes)) => {
                            tracing::warn!(session = %self.session, bytes, "dropped an oversize server event");
                            return Step::Note(format!(
                                "_{name}'s server sent an event of {}, more than the {} one event may hold: it was \
                                 dropped, so part of this turn may be missing here._",
                                crate::sandbox::local::limits::format_size(bytes as u64),
                                crate::sandbox::local::limits::format_size(MAX_EVENT as u64),
                            ));
                        }
                    };
                    if let Some(cap) = self.settle_cap {
                        self.settle = Some((tokio::time::Instant::now() + SETTLE).min(cap));
                    }
                    if let Some(child) = child_session(&event, &self.ses, &self.children) {
                        self.children.push(child);
                    }
                    if let Some(ask) = foreign_permission(&event, &self.children) {
                        // A subagent's own session asks: no card of ours shows it, so it is asked in words.
                        let task = (self.answer)(self.client.clone(), Asked::Permission(Box::new(ask)));
                        self.pending.push(task);
                        continue;
                    }
                    return Step::Line { text: event, alive: false };
                }
            }
        }
    }

    fn stop(&mut self, why: &Stop) {
        let now = tokio::time::Instant::now();
        match why {
            Stop::Cancelled => {
                self.drop_pending();
                self.hard_end = Some(now + CANCEL_LIMIT);
                // A stop already under way (a timeout, an abort) keeps its grace, within the cancel's.
                if self.abort_deadline.is_none() && self.settle.is_none() {
                    self.abort();
                }
                self.abort_deadline = Some(self.abort_deadline.unwrap_or(now + ABORT_GRACE).min(now + ABORT_GRACE));
                self.settle_cap = self.settle_cap.map(|cap| cap.min(now + CANCEL_LIMIT));
                self.settle = self.settle.map(|at| at.min(now + CANCEL_LIMIT));
            }
            Stop::TimedOut | Stop::Stalled => {
                self.abort();
                self.abort_deadline = Some(now + ABORT_GRACE);
            }
            Stop::Limit(_) => self.outcome = Some(Outcome::KillServer),
            Stop::Aborted(_) => {
                self.abort();
                self.abort_deadline.get_or_insert(now + ABORT_GRACE);
            }
        }
    }

    fn limit_hit(&self) -> Option<String> {
        self.server.limit_hit()
    }

    fn permission(&mut self, ask: PermissionAsk) {
        self.pending.retain(|task| !task.is_finished());
        let task = (self.answer)(self.client.clone(), Asked::Permission(Box::new(ask)));
        self.pending.push(task);
    }

    fn question(&mut self, ask: crate::agents::question::QuestionAsk) {
        self.questions.retain(|(task, _)| !task.is_finished());
        let asked = ask.questions.iter().map(|question| question.question.as_str()).collect::<Vec<_>>().join(" ");
        let task = (self.answer)(self.client.clone(), Asked::Question(ask, self.notes.0.clone()));
        self.questions.push((task, asked));
    }

    fn idle(&mut self, stopping: bool) -> bool {
        if !stopping {
            self.outcome = Some(Outcome::Idle);
            return true;
        }
        // An aborted OpenCode goes idle before its tool and message say so (measured: 260 ms later, then idle
        // again); those belong to this turn, not to the next one.
        let now = tokio::time::Instant::now();
        let cap = (now + SETTLE * 6).min(self.hard_end.unwrap_or(now + Duration::from_secs(86_400 * 365)));
        self.settle = Some((now + SETTLE).min(cap));
        self.settle_cap = Some(cap);
        false
    }

    async fn abandon(&mut self) {
        // Nothing may reach the editor that is not stored: the turn stops here.
        self.abort();
        self.drop_pending();
        end_strays(&self.server);
    }

    fn close(&mut self) {
        self.drop_pending();
        if let Some(call) = self.command_call.take() {
            call.abort();
        }
    }

    async fn conclude(self: Box<Self>, seen: Seen, name: &'static str) -> Attempt {
        let server = &self.server;
        let outcome = self.outcome.unwrap_or(Outcome::StreamEnded);
        // Like a turn of `opencode run`, a turn leaves nothing running: the server stays, its strays go.
        end_strays(server);
        let kill = match outcome {
            Outcome::ServerDied | Outcome::StreamEnded => true,
            // A server that ran into the sandbox's limit goes whoever else uses it; one that would not abort this
            // session's turn goes unless it still answers other sessions' turns (it aborts this one in its time).
            Outcome::KillServer => {
                matches!(seen.stop, Some(Stop::Limit(_)))
                    || !server.shared_now()
                    || server.client.health(SHARED_HEALTH).await.is_none()
            }
            Outcome::Idle => false,
        };
        if kill {
            // A server that would not stop, or is gone: the next prompt starts a fresh one on the same database.
            drop(self.lease);
            self.servers.stop(&self.key).await;
        } else if outcome == Outcome::KillServer {
            tracing::warn!(session = %self.session, "the server did not abort this turn in time; it serves other turns, so it stays");
        }
        let stderr_tail = server.stderr_tail();
        let failure = |message: String| Error::CliFailed { message, stderr_tail: stderr_tail.clone(), exit_code: None };
        if let Some(result) = stopped(&seen.stop, name, self.idle, self.turn_timeout, failure) {
            return Attempt::Finished(result);
        }
        Attempt::Finished(match outcome {
            Outcome::ServerDied | Outcome::StreamEnded | Outcome::KillServer => Err(Error::CliFailed {
                message: death(name, server.exit(), server.limit_hit(), outcome == Outcome::StreamEnded),
                stderr_tail,
                exit_code: server.exit().and_then(|exit| exit.code),
            }),
            Outcome::Idle => match seen.end {
                None => Ok(StopReason::EndTurn),
                Some(end) => {
                    ended(end, |message| Error::CliFailed { message, stderr_tail: String::new(), exit_code: None })
                }
            },
        })
    }
}

/// How long the `/abort` request itself may take (it runs beside the turn, which never waits for it).
const ABORT_CALL: Duration = Duration::from_millis(500);

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

#[cfg(test)]
mod tests {
    use serde_json::json;

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
}
