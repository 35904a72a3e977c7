//! Wire types of opencode's JSONL stream (`opencode run --format json`, OpenCode 1.18): one event per line,
//! every field the translator does not need ignored, every field it reads optional where OpenCode may omit it.

use serde::Deserialize;
use serde_json::Value;

/// One stdout line: the envelope's session id plus the event itself.
///
/// Read by hand rather than as a flattened, internally tagged enum: serde buffers those whole (every string of the
/// line copied into its `Content` twice), which cost a fast stream a fifth of its time. OpenCode writes `type`
/// first, so the part is read straight into its type; a part before its `type` is read as a value first.
#[derive(Debug)]
pub struct Line {
    /// `ses_…`, on every event.
    pub session_id: Option<String>,
    /// What happened.
    pub event: Event,
}

/// The members of a line the translator reads.
enum Member {
    Type,
    SessionId,
    Part,
    Error,
    Other,
}

impl<'de> Deserialize<'de> for Member {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Member;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Member, E> {
                Ok(match name {
                    "type" => Member::Type,
                    "sessionID" => Member::SessionId,
                    "part" => Member::Part,
                    "error" => Member::Error,
                    _ => Member::Other,
                })
            }
        }
        deserializer.deserialize_identifier(Name)
    }
}

/// A `part` or `error` as read: into its type when the line's `type` came first, else as a value.
enum Read<T> {
    Typed(T),
    Value(Value),
}

impl<T: serde::de::DeserializeOwned> Read<T> {
    fn into<E: serde::de::Error>(self) -> Result<T, E> {
        match self {
            Read::Typed(typed) => Ok(typed),
            Read::Value(value) => serde_json::from_value(value).map_err(E::custom),
        }
    }
}

/// What a line's `part` was read as.
enum AnyPart {
    Text(Read<TextPart>),
    Tool(Read<Box<ToolPart>>),
    StepFinish(Read<StepFinishPart>),
    Value(Value),
}

impl<'de> Deserialize<'de> for Line {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(LineVisitor)
    }
}

struct LineVisitor;

impl<'de> serde::de::Visitor<'de> for LineVisitor {
    type Value = Line;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an OpenCode event")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Line, A::Error> {
        use serde::de::Error;
        let mut kind: Option<String> = None;
        let mut session_id = None;
        let mut part: Option<AnyPart> = None;
        let mut error: Option<Read<ErrorInfo>> = None;
        while let Some(member) = map.next_key::<Member>()? {
            match member {
                Member::Type if kind.is_some() => return Err(A::Error::duplicate_field("type")),
                Member::Type => kind = Some(map.next_value()?),
                Member::SessionId => session_id = map.next_value::<Option<String>>()?,
                Member::Part if part.is_some() => return Err(A::Error::duplicate_field("part")),
                Member::Part => {
                    part = Some(match kind.as_deref() {
                        Some("text" | "reasoning") => AnyPart::Text(Read::Typed(map.next_value()?)),
                        Some("tool_use") => AnyPart::Tool(Read::Typed(map.next_value()?)),
                        Some("step_finish") => AnyPart::StepFinish(Read::Typed(map.next_value()?)),
                        _ => AnyPart::Value(map.next_value()?),
                    })
                }
                Member::Error if error.is_some() => return Err(A::Error::duplicate_field("error")),
                Member::Error => {
                    error = Some(match kind.as_deref() {
                        Some("error") => Read::Typed(map.next_value()?),
                        _ => Read::Value(map.next_value()?),
                    })
                }
                Member::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        let kind = kind.ok_or_else(|| A::Error::missing_field("type"))?;
        let part = part.ok_or_else(|| A::Error::missing_field("part"));
        let event = match kind.as_str() {
            "step_start" => Event::StepStart {},
            "text" | "reasoning" => {
                let text = match part? {
                    AnyPart::Text(read) => read.into()?,
                    AnyPart::Value(value) => Read::Value(value).into()?,
                    _ => return Err(A::Error::custom("a text part of another kind")),
                };
                if kind == "text" { Event::Text { part: text } } else { Event::Reasoning { part: text } }
            }
            "tool_use" => match part? {
                AnyPart::Tool(read) => Event::ToolUse { part: read.into()? },
                AnyPart::Value(value) => Event::ToolUse { part: Read::Value(value).into()? },
                _ => return Err(A::Error::custom("a tool part of another kind")),
            },
            "step_finish" => match part? {
                AnyPart::StepFinish(read) => Event::StepFinish { part: read.into()? },
                AnyPart::Value(value) => Event::StepFinish { part: Read::Value(value).into()? },
                _ => return Err(A::Error::custom("a step part of another kind")),
            },
            "error" => Event::Error { error: error.ok_or_else(|| A::Error::missing_field("error"))?.into()? },
            _ => Event::Unknown,
        };
        Ok(Line { session_id, event })
    }
}

/// The event kinds `run --format json` prints (by their `type`, in snake case).
#[derive(Debug)]
pub enum Event {
    /// A model call starts (one assistant message).
    StepStart {},
    /// A finished text part: the whole text, not a delta.
    Text {
        /// The part.
        part: TextPart,
    },
    /// A finished reasoning part (only with `--thinking`).
    Reasoning {
        /// The part.
        part: TextPart,
    },
    /// A tool that reached `completed` or `error` (running tools are never printed).
    ToolUse {
        /// The part (boxed: it dwarfs the other events).
        part: Box<ToolPart>,
    },
    /// A model call ended, with its finish reason, tokens and cost.
    StepFinish {
        /// The part.
        part: StepFinishPart,
    },
    /// The session failed (`session.error` or a failed prompt call); the process exits 1 after it.
    Error {
        /// The error.
        error: ErrorInfo,
    },
    /// Any event type this version does not know.
    Unknown,
}

/// A `text` or `reasoning` part.
#[derive(Debug, Deserialize)]
pub struct TextPart {
    /// The assistant message the part belongs to (`msg_…`).
    #[serde(rename = "messageID", default)]
    pub message_id: Option<String>,
    /// The complete text.
    #[serde(default)]
    pub text: String,
    /// OpenCode marks parts the model must not see; they are not agent output either.
    #[serde(default)]
    pub ignored: bool,
}

/// A `tool` part.
#[derive(Debug, Deserialize)]
pub struct ToolPart {
    /// The part id (`prt_…`), the fallback tool call id.
    #[serde(default)]
    pub id: Option<String>,
    /// The model's tool-call id.
    #[serde(rename = "callID", default)]
    pub call_id: Option<String>,
    /// The tool name (`bash`, `read`, `edit`, an MCP tool…).
    #[serde(default)]
    pub tool: String,
    /// Its final state.
    pub state: ToolState,
}

/// The state of a finished tool.
#[derive(Debug, Deserialize)]
pub struct ToolState {
    /// `completed` or `error` (`pending`/`running` are never printed by `run`).
    #[serde(default)]
    pub status: String,
    /// The arguments the model gave.
    #[serde(default)]
    pub input: Value,
    /// The text the tool returned to the model.
    #[serde(default)]
    pub output: Option<String>,
    /// The error text of a failed tool.
    #[serde(default)]
    pub error: Option<String>,
    /// OpenCode's own short title (a path, a description, "1 todos").
    #[serde(default)]
    pub title: Option<String>,
    /// Tool-specific extras (bash `output`/`exit`, edit `filediff`, task `sessionId`…).
    #[serde(default)]
    pub metadata: Value,
}

/// A `step-finish` part.
#[derive(Debug, Deserialize)]
pub struct StepFinishPart {
    /// The AI SDK finish reason: `stop`, `tool-calls`, `length`, `content-filter`, `unknown`…
    #[serde(default)]
    pub reason: String,
    /// Tokens of this model call.
    #[serde(default)]
    pub tokens: Tokens,
    /// Cost of this model call in USD.
    #[serde(default)]
    pub cost: Option<f64>,
}

/// Token counts of one model call. `input` excludes the cached tokens, which OpenCode counts apart.
#[derive(Debug, Default, Deserialize)]
pub struct Tokens {
    /// Uncached input tokens.
    #[serde(default)]
    pub input: u64,
    /// Output tokens.
    #[serde(default)]
    pub output: u64,
    /// Reasoning tokens.
    #[serde(default)]
    pub reasoning: u64,
    /// Cache reads and writes.
    #[serde(default)]
    pub cache: CacheTokens,
}

/// Cached input tokens.
#[derive(Debug, Default, Deserialize)]
pub struct CacheTokens {
    /// Tokens read from the cache.
    #[serde(default)]
    pub read: u64,
    /// Tokens written to the cache.
    #[serde(default)]
    pub write: u64,
}

/// A named OpenCode error (`APIError`, `ProviderAuthError`, `MessageAbortedError`…).
#[derive(Debug, Deserialize)]
pub struct ErrorInfo {
    /// The error class name.
    #[serde(default)]
    pub name: String,
    /// Its data: `message` always, `statusCode` for API errors.
    #[serde(default)]
    pub data: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Line, serde_json::Error> {
        serde_json::from_str(line)
    }

    #[test]
    fn a_line_reads_the_same_whatever_the_order_of_its_members() {
        for line in [
            r#"{"type":"text","sessionID":"ses_1","part":{"messageID":"msg_1","text":"hi"}}"#,
            r#"{"part":{"messageID":"msg_1","text":"hi"},"sessionID":"ses_1","type":"text"}"#,
            r#"{"timestamp":1,"part":{"text":"hi","messageID":"msg_1","x":[1]},"type":"text","sessionID":"ses_1"}"#,
        ] {
            let parsed = parse(line).unwrap();
            assert_eq!(parsed.session_id.as_deref(), Some("ses_1"), "{line}");
            let Event::Text { part } = parsed.event else { panic!("not a text: {line}") };
            assert_eq!((part.message_id.as_deref(), part.text.as_str(), part.ignored), (Some("msg_1"), "hi", false));
        }
    }

    #[test]
    fn kinds_without_a_part_unknown_kinds_and_broken_lines() {
        assert!(matches!(parse(r#"{"type":"step_start","sessionID":null}"#).unwrap().event, Event::StepStart {}));
        assert!(matches!(parse(r#"{"type":"new_kind","part":{"a":1},"error":2}"#).unwrap().event, Event::Unknown));
        assert!(matches!(parse(r#"{"error":{"name":"X"},"type":"error"}"#).unwrap().event, Event::Error { .. }));
        assert!(parse(r#"{"type":"text"}"#).is_err(), "a text without its part");
        assert!(parse(r#"{"part":{"text":"hi"}}"#).is_err(), "no type");
        assert!(parse(r#"{"type":"text","type":"text","part":{}}"#).is_err(), "two types");
        assert!(parse(r#"{"type":"tool_use","part":{"text":"hi"}}"#).is_err(), "a tool part without a tool");
        assert!(parse(r#"["type","text"]"#).is_err());
    }
}
