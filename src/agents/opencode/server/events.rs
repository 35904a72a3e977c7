//! Wire types of `opencode serve`'s event stream (`GET /event`, OpenCode 1.18.33): one bus event per SSE
//! `data:` payload, `{"type": …, "properties": {…}}`. Only the events and fields the translator reads are
//! typed; every other event type is [`Event::Other`] and every unknown field is ignored.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use crate::agents::opencode::events::{ErrorInfo, StepFinishPart, ToolPart, ToolState};

/// One event: its session (when it has one) and what happened.
#[derive(Debug)]
pub struct Parsed {
    /// `properties.sessionID`: the OpenCode session (`ses_…`) the event belongs to.
    pub session_id: Option<String>,
    /// The event.
    pub event: Event,
}

/// The events the translator acts on.
#[derive(Debug)]
pub enum Event {
    /// A message was created or changed (`message.updated`): its role, and for an assistant message how it
    /// finished.
    MessageUpdated(MessageInfo),
    /// A part was created or changed (`message.part.updated`): the whole part.
    PartUpdated(Part),
    /// Text streamed into a part (`message.part.delta`).
    PartDelta(PartDelta),
    /// The session is busy, idle or retrying (`session.status`).
    Status(Status),
    /// The session finished its work (`session.idle`).
    Idle,
    /// The session failed (`session.error`); the error is optional in the schema.
    Error(Option<ErrorInfo>),
    /// A tool waits for the user's approval (`permission.asked`).
    PermissionAsked(PermissionAsked),
    /// The `question` tool waits for the user's answers (`question.asked`).
    QuestionAsked(QuestionAsked),
    /// The session's todo list changed (`todo.updated`): the whole list.
    TodoUpdated(Value),
    /// Any other event (`session.updated`, `session.diff`, `file.edited`, `server.connected`…).
    Other,
}

/// The envelope every event shares.
#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    properties: Value,
}

/// How OpenCode writes a `message.part.delta` event's type: near the start (after its `id`), before its properties.
const DELTA_TYPE: &str = r#""type":"message.part.delta","#;

/// How far into an event's JSON its type is looked for.
const DELTA_TYPE_WITHIN: usize = 96;

/// A `message.part.delta` event, read in one pass.
#[derive(Deserialize)]
struct DeltaEnvelope {
    #[serde(rename = "type")]
    kind: String,
    properties: DeltaProperties,
}

/// Its properties: the [`PartDelta`] and the session.
#[derive(Deserialize)]
struct DeltaProperties {
    #[serde(rename = "sessionID", default)]
    session_id: Option<String>,
    #[serde(rename = "messageID")]
    message_id: String,
    #[serde(rename = "partID")]
    part_id: String,
    field: String,
    delta: String,
}

/// The event of a streamed answer, one per token, read straight into its type rather than through a `Value` of its
/// properties first. `None` for anything else, and for a delta with anything unusual about it (another order of
/// its members, a member of another type): [`parse`] reads those the way of every event, to the same result.
fn delta(line: &str) -> Option<Parsed> {
    if !line[..line.floor_char_boundary(DELTA_TYPE_WITHIN)].contains(DELTA_TYPE) {
        return None;
    }
    let DeltaEnvelope { kind, properties } = serde_json::from_str::<DeltaEnvelope>(line).ok()?;
    let DeltaProperties { session_id, message_id, part_id, field, delta } = properties;
    (kind == "message.part.delta")
        .then(|| Parsed { session_id, event: Event::PartDelta(PartDelta { message_id, part_id, field, delta }) })
}

/// Reads one event's JSON. An error only for text that is not a JSON object with a string `type`, or a
/// known event whose fields have the wrong shape; unknown event types are [`Event::Other`].
pub fn parse(line: &str) -> Result<Parsed, serde_json::Error> {
    if let Some(parsed) = delta(line) {
        return Ok(parsed);
    }
    let envelope: Envelope = serde_json::from_str(line)?;
    let properties = envelope.properties;
    let session_id = properties.get("sessionID").and_then(Value::as_str).map(str::to_string);
    let event = match envelope.kind.as_str() {
        "message.updated" => Event::MessageUpdated(field::<MessageUpdated>(properties)?.info),
        "message.part.updated" => Event::PartUpdated(field::<PartUpdated>(properties)?.part),
        "message.part.delta" => Event::PartDelta(field(properties)?),
        "session.status" => Event::Status(field::<StatusChanged>(properties)?.status),
        "session.idle" => Event::Idle,
        "session.error" => Event::Error(field::<SessionError>(properties)?.error),
        "permission.asked" => Event::PermissionAsked(field(properties)?),
        "question.asked" => Event::QuestionAsked(field(properties)?),
        "todo.updated" => Event::TodoUpdated(field::<TodoUpdated>(properties)?.todos),
        _ => Event::Other,
    };
    Ok(Parsed { session_id, event })
}

fn field<T: DeserializeOwned>(properties: Value) -> Result<T, serde_json::Error> {
    serde_json::from_value(properties)
}

#[derive(Debug, Deserialize)]
struct MessageUpdated {
    info: MessageInfo,
}

/// A user or assistant message (`Message` in the OpenAPI document), as far as the translator cares.
#[derive(Debug, Deserialize)]
pub struct MessageInfo {
    /// `msg_…`.
    pub id: String,
    /// `user` or `assistant`.
    #[serde(default)]
    pub role: String,
    /// An assistant message's AI SDK finish reason (`stop`, `tool-calls`, `length`…), once it finished.
    #[serde(default)]
    pub finish: Option<String>,
    /// An assistant message's failure (`MessageAbortedError` when the session was aborted).
    #[serde(default)]
    pub error: Option<ErrorInfo>,
}

#[derive(Debug, Deserialize)]
struct PartUpdated {
    part: Part,
}

/// The parts the translator shows; the rest (`step-start`, `file`, `patch`, `snapshot`, `agent`, `retry`,
/// `compaction`, `subtask`) are [`Part::Other`].
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Part {
    /// Text of a message.
    Text(TextPart),
    /// The model's reasoning.
    Reasoning(TextPart),
    /// A tool call and its state (boxed: it dwarfs the others).
    Tool(Box<ToolPart>),
    /// A model call ended, with its tokens and cost.
    StepFinish(StepFinishPart),
    /// Any other part type.
    #[serde(other)]
    Other,
}

/// A `text` or `reasoning` part: the whole text so far.
#[derive(Debug, Deserialize)]
pub struct TextPart {
    /// `prt_…`, which deltas name.
    pub id: String,
    /// The message it belongs to.
    #[serde(rename = "messageID")]
    pub message_id: String,
    /// The text so far.
    #[serde(default)]
    pub text: String,
    /// OpenCode marks parts the model must not see; they are not agent output either.
    #[serde(default)]
    pub ignored: bool,
}

/// Text streamed into a part.
#[derive(Debug, Deserialize)]
pub struct PartDelta {
    /// The message of the part.
    #[serde(rename = "messageID")]
    pub message_id: String,
    /// The part.
    #[serde(rename = "partID")]
    pub part_id: String,
    /// The field that grew: `text` for text and reasoning parts.
    pub field: String,
    /// What was appended.
    pub delta: String,
}

#[derive(Debug, Deserialize)]
struct StatusChanged {
    status: Status,
}

/// A session's status (`SessionStatus`).
#[derive(Debug, Deserialize)]
pub struct Status {
    /// `idle`, `busy` or `retry`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The retry's number (from 1).
    #[serde(default)]
    pub attempt: Option<u64>,
    /// Why it retries, in OpenCode's words.
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SessionError {
    #[serde(default)]
    error: Option<ErrorInfo>,
}

/// A permission request (`PermissionRequest`).
#[derive(Debug, Deserialize)]
pub struct PermissionAsked {
    /// `per_…`, answered with `POST /permission/{id}/reply`.
    pub id: String,
    /// What is asked: the tool's permission (`bash`, `edit`, `read`, `webfetch`…) or a guard
    /// (`external_directory`, `doom_loop`).
    #[serde(default)]
    pub permission: String,
    /// What it applies to: the commands of a bash call, the paths of an edit.
    #[serde(default)]
    pub patterns: Vec<String>,
    /// Tool-specific details: an edit's `filepath` and unified `diff`, a patch's `files`…
    #[serde(default)]
    pub metadata: Value,
    /// The patterns an "always" answer would allow from now on.
    #[serde(default)]
    pub always: Vec<String>,
    /// The tool call that asks, when a tool asks.
    #[serde(default)]
    pub tool: Option<PermissionTool>,
}

/// The tool call behind a permission request.
#[derive(Debug, Deserialize)]
pub struct PermissionTool {
    /// The assistant message of the call.
    #[serde(rename = "messageID", default)]
    pub message_id: Option<String>,
    /// The model's call id: the same as the tool part's `callID`.
    #[serde(rename = "callID", default)]
    pub call_id: Option<String>,
}

/// A question of the `question` tool (`QuestionRequest` in the OpenAPI document).
#[derive(Debug, Deserialize)]
pub struct QuestionAsked {
    /// `que_…`, answered with `POST /question/{id}/reply` or `/reject`.
    pub id: String,
    /// The questions, in order.
    #[serde(default)]
    pub questions: Vec<QuestionInfo>,
    /// The tool call that asks.
    #[serde(default)]
    pub tool: Option<PermissionTool>,
}

/// One question.
#[derive(Debug, Deserialize)]
pub struct QuestionInfo {
    /// The whole question.
    #[serde(default)]
    pub question: String,
    /// A short label.
    #[serde(default)]
    pub header: String,
    /// The choices.
    #[serde(default)]
    pub options: Vec<QuestionOption>,
    /// Whether several may be chosen.
    #[serde(default)]
    pub multiple: bool,
    /// Whether an answer of one's own may be typed (OpenCode's default).
    #[serde(default = "yes")]
    pub custom: bool,
}

fn yes() -> bool {
    true
}

/// One choice of a question.
#[derive(Debug, Deserialize)]
pub struct QuestionOption {
    /// What is shown and answered.
    #[serde(default)]
    pub label: String,
    /// What it means.
    #[serde(default)]
    pub description: String,
}

#[derive(Debug, Deserialize)]
struct TodoUpdated {
    #[serde(default)]
    todos: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`parse`] reads without its fast way for deltas.
    fn parse_slowly(line: &str) -> Result<Parsed, serde_json::Error> {
        let envelope: Envelope = serde_json::from_str(line)?;
        let session_id = envelope.properties.get("sessionID").and_then(Value::as_str).map(str::to_string);
        let event = match envelope.kind.as_str() {
            "message.part.delta" => Event::PartDelta(field(envelope.properties)?),
            _ => Event::Other,
        };
        Ok(Parsed { session_id, event })
    }

    #[test]
    fn a_delta_reads_the_same_the_fast_way_and_the_slow_one() {
        for line in [
            r#"{"id":"evt_2305295e9001lRUMVz1MyIq36g","type":"message.part.delta","properties":{"sessionID":"ses_dcfad89f3ffe2mORnH6R7NP3T5","messageID":"msg_2305293f8001HxIBlXEAff9j55","partID":"prt_1","field":"text","delta":"é"}}"#,
            r#"{"type":"message.part.delta","properties":{"sessionID":"ses_1","messageID":"msg_1","partID":"prt_1","field":"text","delta":"a \"b\"\n"}}"#,
            r#"{"type":"message.part.delta","properties":{"messageID":"msg_1","partID":"prt_1","field":"text","delta":"x","extra":[1]}}"#,
            r#"{"type":"message.part.delta","properties":{"sessionID":7,"messageID":"msg_1","partID":"prt_1","field":"text","delta":"x"}}"#,
            r#"{"type":"message.part.delta","properties":{"messageID":"msg_1","partID":"prt_1","field":"text"}}"#,
            r#"{"type":"message.part.delta","type":"session.idle","properties":{}}"#,
            r#"{"properties":{"sessionID":"ses_1","messageID":"m","partID":"p","field":"text","delta":"x"},"type":"message.part.delta"}"#,
        ] {
            let fast = parse(line).map(|parsed| format!("{parsed:?}")).map_err(|e| e.to_string());
            let slow = parse_slowly(line).map(|parsed| format!("{parsed:?}")).map_err(|e| e.to_string());
            assert_eq!(fast.is_ok(), slow.is_ok(), "{line}: {fast:?} {slow:?}");
            if let (Ok(fast), Ok(slow)) = (&fast, &slow) {
                assert_eq!(fast, slow, "{line}");
            }
        }
        assert!(delta(r#"{"id":"evt_1","type":"message.part.delta","properties":{"messageID":"m","partID":"p","field":"text","delta":"x"}}"#).is_some(), "OpenCode's deltas take the fast way");
        let parsed = parse(r#"{"type":"message.part.delta","properties":{"sessionID":"ses_1","messageID":"m","partID":"p","field":"text","delta":"hi"}}"#).unwrap();
        assert_eq!(parsed.session_id.as_deref(), Some("ses_1"));
        assert!(matches!(parsed.event, Event::PartDelta(PartDelta { ref delta, .. }) if delta == "hi"));
    }
}
