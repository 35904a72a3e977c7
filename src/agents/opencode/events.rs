//! Wire types of opencode's JSONL stream (`opencode run --format json`, OpenCode 1.18): one event per line,
//! every field the translator does not need ignored, every field it reads optional where OpenCode may omit it.

use serde::Deserialize;
use serde_json::Value;

/// One stdout line: the envelope's session id plus the event itself.
#[derive(Debug, Deserialize)]
pub struct Line {
    /// `ses_…`, on every event.
    #[serde(rename = "sessionID", default)]
    pub session_id: Option<String>,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// The event kinds `run --format json` prints.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
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
    #[serde(other)]
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
