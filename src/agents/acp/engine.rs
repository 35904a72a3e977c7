//! One turn of an ACP agent: its `session/prompt` sent, its updates yielded to the bridge's turn loop in the order
//! it sent them, its permission requests and forms asked of the editor, and a cancel forwarded (its tree killed when it has
//! not answered within a second).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::Responder;
use agent_client_protocol::v1::schema::{
    CancelNotification, CreateElicitationResponse, ElicitationAction, ElicitationMode, ElicitationScope,
    PromptResponse, RequestPermissionOutcome, RequestPermissionResponse, SessionUpdate, StopReason, ToolCallUpdate,
    ToolCallUpdateFields,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::connection::Connection;
use super::route::Event;
use crate::agents::engine::{Attempt, Ended, Seen, Step, Stop, TurnEngine, ended, sleep_until_or_never, stopped};
use crate::agents::host::UpdateSink;
use crate::agents::{Output, TurnEnd};
use crate::error::Error;

/// How long the agent has to answer a cancel before its tree is killed: short enough that Stop is answered within a
/// second whatever the agent does (as the warm OpenCode server's abort grace is).
pub const CANCEL_GRACE: Duration = Duration::from_millis(600);

/// What the agent asked of the editor and is not answered yet, by our key.
enum Open {
    Permission(Responder<RequestPermissionResponse>),
    Form(Responder<CreateElicitationResponse>),
}

impl Open {
    /// Answers that nobody will answer: `cancelled` (ACP's rule for a cancelled turn).
    fn withdraw(self) {
        let _ = match self {
            Open::Permission(responder) => {
                responder.respond(RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled))
            }
            Open::Form(responder) => responder.respond(CreateElicitationResponse::new(ElicitationAction::Cancel)),
        };
    }
}

/// What the agent asked, while the editor is asked it: withdrawing it answers the agent and, by ending the
/// request to the editor (the SDK sends `$/cancel_request` for a request dropped before its answer), takes the
/// question away in the editor too.
struct Asking {
    open: Open,
    editor: Option<tokio::task::AbortHandle>,
}

impl Asking {
    fn withdraw(self) {
        if let Some(editor) = self.editor {
            editor.abort();
        }
        self.open.withdraw();
    }
}

/// The requests asked of the editor and not answered yet, by our key.
type Asked = Arc<Mutex<HashMap<u64, Asking>>>;

/// One turn through a running ACP agent.
pub struct AcpEngine {
    connection: Arc<Connection>,
    /// The agent's session.
    session: String,
    /// Ours, as the editor knows it.
    ours: String,
    events: mpsc::Receiver<Event>,
    prompt: Option<JoinHandle<Result<PromptResponse, agent_client_protocol::Error>>>,
    queued: VecDeque<Step>,
    sink: Arc<dyn UpdateSink>,
    asked: Asked,
    next_key: u64,
    /// When a stop the agent has not answered kills it.
    kill_at: Option<tokio::time::Instant>,
    /// The turn was stopped: a tool the agent says finished after that did not (see [`cancelled_tool`]).
    stopped: bool,
    over: bool,
    /// The turn's silence and its whole deadline, for the loop's own stops.
    timeouts: (Duration, Duration),
    /// The agent's name, for messages.
    name: &'static str,
}

impl AcpEngine {
    /// The engine of a turn whose prompt `prompt` was sent to `session` of `connection`; `events` are its messages.
    /// `native` is set when the session is new to the store: the loop keeps it first.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        connection: Arc<Connection>,
        session: String,
        ours: String,
        events: mpsc::Receiver<Event>,
        prompt: JoinHandle<Result<PromptResponse, agent_client_protocol::Error>>,
        sink: Arc<dyn UpdateSink>,
        native: bool,
        timeouts: (Duration, Duration),
        name: &'static str,
    ) -> Self {
        let mut queued = VecDeque::new();
        if native {
            queued.push_back(Step::Output(Output::NativeSessionId { id: session.clone() }));
        }
        Self {
            connection,
            session,
            ours,
            events,
            prompt: Some(prompt),
            queued,
            sink,
            asked: Arc::default(),
            next_key: 0,
            kill_at: None,
            stopped: false,
            over: false,
            timeouts,
            name,
        }
    }

    /// Acts on one message of the agent: an update for the loop, a permission request asked of the editor.
    fn take(&mut self, event: Event) -> Option<Step> {
        match event {
            Event::Update(json) if self.stopped => Some(Step::Line { text: cancelled_tool(json), alive: true }),
            Event::Update(json) => Some(Step::Line { text: json, alive: true }),
            Event::Permission(asked) => {
                let (mut request, responder) = *asked;
                let key = self.open(Open::Permission(responder))?;
                let card = asked_about(&request.tool_call);
                request.session_id = self.ours.clone().into();
                let (sink, asked) = (self.sink.clone(), self.asked.clone());
                let editor = tokio::spawn(async move {
                    let outcome = sink.request_permission(request).await.unwrap_or(RequestPermissionOutcome::Cancelled);
                    if let Some(Open::Permission(responder)) = take(&asked, key) {
                        let _ = responder.respond(RequestPermissionResponse::new(outcome));
                    }
                });
                self.asking_editor(key, editor.abort_handle());
                card.map(|text| Step::Line { text, alive: true })
            }
            Event::Elicit(asked) => {
                let (mut request, responder) = *asked;
                let key = self.open(Open::Form(responder))?;
                if let ElicitationMode::Form(form) = &mut request.mode
                    && let ElicitationScope::Session(scope) = &mut form.scope
                {
                    scope.session_id = self.ours.clone().into();
                }
                let (sink, asked) = (self.sink.clone(), self.asked.clone());
                let editor = tokio::spawn(async move {
                    let answer = sink.elicit(request).await;
                    if let Some(Open::Form(responder)) = take(&asked, key) {
                        let answer =
                            answer.unwrap_or_else(|| CreateElicitationResponse::new(ElicitationAction::Cancel));
                        let _ = responder.respond(answer);
                    }
                });
                self.asking_editor(key, editor.abort_handle());
                None
            }
        }
    }

    /// Keeps what the agent asked until the editor answers: its key, or `None` when the turn is ending (it is
    /// answered `cancelled` then).
    fn open(&mut self, open: Open) -> Option<u64> {
        if self.kill_at.is_some() || self.over {
            open.withdraw();
            return None;
        }
        let key = self.next_key;
        self.next_key += 1;
        self.asked.lock().unwrap_or_else(|p| p.into_inner()).insert(key, Asking { open, editor: None });
        Some(key)
    }

    /// `editor` asks the editor what `key` holds; a withdrawal ends it.
    fn asking_editor(&self, key: u64, editor: tokio::task::AbortHandle) {
        if let Some(asking) = self.asked.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&key) {
            asking.editor = Some(editor);
        }
    }

    /// Every permission request still open is answered `cancelled` (ACP's rule for a cancelled turn).
    fn withdraw_asks(&self) {
        let open: Vec<_> = self.asked.lock().unwrap_or_else(|p| p.into_inner()).drain().collect();
        for (_, open) in open {
            open.withdraw();
        }
    }

    /// What the prompt's answer means, after every message the agent sent before it.
    async fn answered(&mut self, answer: Result<PromptResponse, agent_client_protocol::Error>) -> Step {
        while let Ok(event) = self.events.try_recv() {
            if let Some(step) = self.take(event) {
                self.queued.push_back(step);
            }
        }
        self.over = true;
        self.withdraw_asks();
        let end = match answer {
            Ok(response) => turn_end(response.stop_reason),
            Err(_) if !self.connection.alive() || self.connection.ending().await => {
                let why = self.connection.failure(&format!("{} stopped in the middle of the turn", self.name)).await;
                self.queued.push_back(Step::Ended(Ended::Failed(self.failed(why))));
                return self.queued.pop_front().unwrap_or(Step::Ended(Ended::Done));
            }
            Err(e) => {
                let message = said(&e);
                if e.code == agent_client_protocol::ErrorCode::AUTH_REQUIRED {
                    TurnEnd::AuthRequired { message }
                } else {
                    TurnEnd::Error { message }
                }
            }
        };
        self.queued.push_back(Step::Output(Output::End(end)));
        self.queued.push_back(Step::Ended(Ended::Done));
        self.queued.pop_front().unwrap_or(Step::Ended(Ended::Done))
    }

    fn failed(&self, message: String) -> Error {
        Error::CliFailed { message, stderr_tail: self.connection.stderr_tail(), exit_code: None }
    }
}

/// What was asked under `key`, once: its answer is the editor's, or the withdrawal's.
fn take(asked: &Asked, key: u64) -> Option<Open> {
    asked.lock().unwrap_or_else(|p| p.into_inner()).remove(&key).map(|asking| asking.open)
}

/// What woke a wait for the agent.
enum Woke {
    Event(Option<Event>),
    Answer(Result<Result<PromptResponse, agent_client_protocol::Error>, tokio::task::JoinError>),
    Kill,
    Closed,
}

/// The prompt's answer, once it came (never, without a prompt). Cancel-safe.
async fn answer_of(
    prompt: &mut Option<JoinHandle<Result<PromptResponse, agent_client_protocol::Error>>>,
) -> Result<Result<PromptResponse, agent_client_protocol::Error>, tokio::task::JoinError> {
    match prompt {
        Some(prompt) => prompt.await,
        None => std::future::pending().await,
    }
}

/// The tool call a permission request asks about, as an update of the turn (its name and kind only): a call the agent
/// announced only in the request (Gemini CLI) is announced by it (the translator makes an unknown call's first
/// update its announcement), so its card is the turn's and ends with it, also when the turn is stopped before the
/// agent says more of it. For a call announced before, it changes nothing.
fn asked_about(call: &ToolCallUpdate) -> Option<String> {
    let mut fields = ToolCallUpdateFields::new();
    fields.title = call.fields.title.clone();
    fields.kind = call.fields.kind;
    let update = SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(call.tool_call_id.clone(), fields));
    serde_json::to_string(&update).ok()
}

/// An update of the agent's after the turn was stopped (`json`), where a tool call it says `completed` is `failed`:
/// a tool the stop ended did not finish, whatever the agent calls it (Gemini CLI says "completed" with "Command
/// cancelled by user."), so its card ends as every agent's stopped tool does.
fn cancelled_tool(json: String) -> String {
    let Ok(mut update) = serde_json::from_str::<serde_json::Value>(&json) else { return json };
    let tool = matches!(update["sessionUpdate"].as_str(), Some("tool_call" | "tool_call_update"));
    if !tool || update["status"] != "completed" {
        return json;
    }
    update["status"] = "failed".into();
    update.to_string()
}

/// An error the agent answered, in its words (its message, and its data when that is text).
pub(super) fn said(error: &agent_client_protocol::Error) -> String {
    match error.data.as_ref() {
        Some(serde_json::Value::String(data)) if !data.is_empty() => format!("{}: {data}", error.message),
        Some(data) if !data.is_null() => format!("{}: {data}", error.message),
        _ => error.message.clone(),
    }
}

/// The end an ACP stop reason says.
fn turn_end(stop: StopReason) -> TurnEnd {
    match stop {
        StopReason::MaxTokens => TurnEnd::MaxTokens,
        StopReason::MaxTurnRequests => TurnEnd::MaxTurnRequests,
        StopReason::Refusal => TurnEnd::Refusal,
        StopReason::Cancelled => TurnEnd::Cancelled,
        _ => TurnEnd::EndTurn,
    }
}

#[async_trait::async_trait]
impl TurnEngine for AcpEngine {
    async fn next(&mut self) -> Step {
        loop {
            if let Some(step) = self.queued.pop_front() {
                return step;
            }
            if self.over {
                return Step::Ended(Ended::Done);
            }
            let pending = self.prompt.is_some();
            let (events, prompt, connection, kill_at) =
                (&mut self.events, &mut self.prompt, &self.connection, self.kill_at);
            let woke = tokio::select! {
                biased;
                event = events.recv() => Woke::Event(event),
                answer = answer_of(prompt), if pending => Woke::Answer(answer),
                _ = sleep_until_or_never(kill_at) => Woke::Kill,
                _ = connection.closed.cancelled(), if pending => Woke::Closed,
            };
            match woke {
                Woke::Event(Some(event)) => {
                    if let Some(step) = self.take(event) {
                        return step;
                    }
                }
                // The connection let go of this turn's route (it was killed): its answer says the rest.
                Woke::Event(None) => {
                    if self.prompt.is_none() {
                        self.over = true;
                    }
                }
                Woke::Answer(answer) => {
                    self.prompt = None;
                    let answer = answer.unwrap_or_else(|_| Err(agent_client_protocol::Error::internal_error()));
                    return self.answered(answer).await;
                }
                Woke::Kill => {
                    tracing::warn!(session = %self.ours, "the ACP agent did not answer the stop within {CANCEL_GRACE:?}: killed");
                    self.connection.kill().await;
                    self.kill_at = None;
                    self.over = true;
                    return Step::Ended(Ended::Done);
                }
                Woke::Closed => {
                    // Its answer will not come: what it sent before it ended is still the turn's.
                    self.prompt = None;
                    return self.answered(Err(agent_client_protocol::Error::internal_error())).await;
                }
            }
        }
    }

    fn stop(&mut self, why: &Stop) {
        self.withdraw_asks();
        if self.kill_at.is_some() || self.over {
            return;
        }
        self.stopped = true;
        tracing::info!(session = %self.ours, why = ?why, "stopping the ACP agent's turn");
        if let Err(e) = self.connection.cx.send_notification(CancelNotification::new(self.session.clone())) {
            tracing::warn!(session = %self.ours, "could not send the cancel: {e}");
        }
        self.kill_at = Some(tokio::time::Instant::now() + CANCEL_GRACE);
    }

    fn limit_hit(&self) -> Option<String> {
        None
    }

    async fn abandon(&mut self) {
        self.withdraw_asks();
        self.connection.kill().await;
    }

    async fn conclude(self: Box<Self>, seen: Seen, name: &'static str) -> Attempt {
        self.connection.unroute();
        let (idle, turn_timeout) = self.timeouts;
        let failed =
            |message: String| Error::CliFailed { message, stderr_tail: self.connection.stderr_tail(), exit_code: None };
        if let Some(result) = stopped(&seen.stop, name, idle, turn_timeout, failed) {
            // What the stopped turn started ends with it, whatever the agent answered: its terminals and commands.
            // What its tools started outside the agent's tree is ended too, and once more when the agent has had a
            // moment to end its tools (whose daemons leave its tree only then).
            if self.connection.alive() {
                self.connection.end_turn().await;
                self.connection.end_strays().await;
                let connection = self.connection.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(CANCEL_GRACE).await;
                    if connection.alive() {
                        connection.end_strays().await;
                    }
                });
            }
            return Attempt::Finished(result);
        }
        Attempt::Finished(match seen.end {
            Some(end) => ended(end, failed),
            None => Err(failed(format!("{name} ended the turn without saying how"))),
        })
    }
}

impl Drop for AcpEngine {
    fn drop(&mut self) {
        self.withdraw_asks();
        self.connection.unroute();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permission_announces_its_tool_by_name_and_kind_only() {
        let asked: ToolCallUpdate = serde_json::from_value(serde_json::json!({
            "toolCallId": "g1", "title": "Shell", "kind": "execute", "status": "pending",
            "content": [{"type": "content", "content": {"type": "text", "text": "rm -rf"}}]
        }))
        .unwrap();
        let card: serde_json::Value = serde_json::from_str(&asked_about(&asked).unwrap()).unwrap();
        assert_eq!(
            card,
            serde_json::json!({"sessionUpdate": "tool_call_update", "toolCallId": "g1", "title": "Shell", "kind": "execute"})
        );
    }

    #[test]
    fn a_tool_the_agent_says_completed_after_the_stop_failed_and_nothing_else_changes() {
        let gemini = r#"{"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed","content":[{"type":"content","content":{"type":"text","text":"Command cancelled by user."}}]}"#;
        let turned: serde_json::Value = serde_json::from_str(&cancelled_tool(gemini.to_string())).unwrap();
        assert_eq!(turned["status"], "failed");
        assert_eq!(turned["content"][0]["content"]["text"], "Command cancelled by user.");
        let announced = r#"{"sessionUpdate":"tool_call","toolCallId":"t2","title":"Run","status":"completed"}"#;
        let turned: serde_json::Value = serde_json::from_str(&cancelled_tool(announced.to_string())).unwrap();
        assert_eq!(turned["status"], "failed");
        for kept in [
            r#"{"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"in_progress"}"#,
            r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"completed"}}"#,
        ] {
            assert_eq!(cancelled_tool(kept.to_string()), kept);
        }
    }
}
