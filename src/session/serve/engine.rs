//! The server engine: one turn of a warm OpenCode server, as the turn loop sees it. Its stream is the server's
//! event stream (shared with the server's other sessions); stopping it asks OpenCode to abort, then kills the
//! server after a grace; its end is the session going idle, or the server's death.

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::schema::StopReason;
use tokio::sync::mpsc;

use super::client::{Client, ClientError};
use super::sse::{MAX_EVENT, SseEvent};
use super::{Lease, Server, Servers};
use crate::agents::{Output, PermissionAsk, TurnEnd};
use crate::error::Error;
use crate::session::turn::engine::{
    Attempt, Ended, Seen, Step, Stop, TurnEngine, ended, sleep_until_or_never, stopped,
};

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

/// What answers a permission request of the server's session.
pub(super) type Answer = Box<dyn Fn(Client, PermissionAsk) -> tokio::task::JoinHandle<()> + Send + Sync>;

/// One turn through a warm server.
pub(super) struct ServerEngine {
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
    pub(super) fn new(
        lease: Lease,
        servers: Arc<Servers>,
        key: String,
        session: &str,
        ses: String,
        events: mpsc::Receiver<SseEvent>,
        command_call: Option<tokio::task::JoinHandle<Result<serde_json::Value, ClientError>>>,
        answer: Answer,
        name: &'static str,
        config: &crate::config::Config,
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
            idle: config.idle_timeout,
            turn_timeout: config.turn_timeout,
            pending: Vec::new(),
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
        super::turn::abort(&self.client, &self.ses);
    }

    fn drop_pending(&mut self) {
        for task in self.pending.drain(..) {
            task.abort();
        }
    }
}

impl TurnEngine for ServerEngine {
    async fn next(&mut self) -> Step {
        if let Some(outcome) = self.outcome {
            return self.end(outcome);
        }
        let name = self.name;
        loop {
            tokio::select! {
                biased;
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
                    if let Some(child) = super::turn::child_session(&event, &self.ses, &self.children) {
                        self.children.push(child);
                    }
                    if let Some(ask) = super::turn::foreign_permission(&event, &self.children) {
                        // A subagent's own session asks: no card of ours shows it, so it is asked in words.
                        let task = (self.answer)(self.client.clone(), ask);
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
        let task = (self.answer)(self.client.clone(), ask);
        self.pending.push(task);
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
        super::turn::end_strays(&self.server);
    }

    fn close(&mut self) {
        self.drop_pending();
        if let Some(call) = self.command_call.take() {
            call.abort();
        }
    }

    async fn conclude(self, seen: Seen, name: &'static str) -> Attempt {
        let server = &self.server;
        let outcome = self.outcome.unwrap_or(Outcome::StreamEnded);
        // Like a turn of `opencode run`, a turn leaves nothing running: the server stays, its strays go.
        super::turn::end_strays(server);
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
                message: super::turn::death(name, server.exit(), server.limit_hit(), outcome == Outcome::StreamEnded),
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
