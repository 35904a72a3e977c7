//! Wire types of amp's JSONL stream (`amp -x --stream-json`): the five Claude-like line shapes, with every
//! field the translator does not need ignored and the ones the SDK declares but the CLI omits optional.

use serde::Deserialize;
use serde_json::Value;

/// One stdout line.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// Always first: the thread id and the tools.
    System {
        /// `init`.
        #[serde(default)]
        subtype: String,
        /// The thread id `T-…`.
        #[serde(default)]
        session_id: Option<String>,
    },
    /// The prompt echoed back, or the tool results of the previous assistant message.
    User {
        /// The message.
        message: Message,
        /// The thread id.
        #[serde(default)]
        session_id: Option<String>,
    },
    /// One complete assistant message, all blocks together.
    Assistant {
        /// The message.
        message: AssistantMessage,
        /// The thread id.
        #[serde(default)]
        session_id: Option<String>,
    },
    /// The end of the run.
    Result(RunResult),
    /// Any line type this version does not know.
    #[serde(other)]
    Unknown,
}

impl Event {
    /// The thread id the line carries, if any.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Event::System { session_id, .. } | Event::User { session_id, .. } | Event::Assistant { session_id, .. } => {
                session_id.as_deref()
            }
            Event::Result(result) => result.session_id.as_deref(),
            Event::Unknown => None,
        }
    }
}

/// A user message: text blocks (the prompt) and tool results.
#[derive(Debug, Deserialize)]
pub struct Message {
    /// A plain string (never seen, but Claude-style streams allow it) or blocks.
    #[serde(default)]
    pub content: MessageContent,
}

/// Message content: a bare string or a block list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// A bare string.
    Text(String),
    /// Content blocks.
    Blocks(Vec<Block>),
}

impl Default for MessageContent {
    fn default() -> Self {
        MessageContent::Blocks(Vec::new())
    }
}

/// An assistant message.
#[derive(Debug, Deserialize)]
pub struct AssistantMessage {
    /// Declared by the SDK types; the CLI does not print it today.
    #[serde(default)]
    pub id: Option<String>,
    /// Text, thinking and tool-use blocks.
    #[serde(default)]
    pub content: MessageContent,
    /// `tool_use`, `end_turn`, `max_tokens`, or null when the message did not complete.
    #[serde(default)]
    pub stop_reason: Option<String>,
    /// Tokens of the model call that produced the message.
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// One content block.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Text.
    Text {
        /// The text.
        #[serde(default)]
        text: String,
    },
    /// Visible reasoning (with `--stream-json-thinking`).
    Thinking {
        /// The reasoning.
        #[serde(default)]
        thinking: String,
    },
    /// Encrypted reasoning: nothing to show.
    RedactedThinking {},
    /// A tool the agent runs now.
    ToolUse {
        /// The tool-use id, matched by the later result.
        id: String,
        /// The tool name (`Bash`, `edit_file`, `mcp__server__tool`…).
        #[serde(default)]
        name: String,
        /// Its arguments.
        #[serde(default)]
        input: Value,
    },
    /// The result of an earlier tool use.
    ToolResult {
        /// The tool-use id it answers.
        tool_use_id: String,
        /// A string (JSON-stringified for object results); block lists are tolerated.
        #[serde(default)]
        content: Value,
        /// The tool failed, was cancelled or rejected.
        #[serde(default)]
        is_error: bool,
    },
    /// Images and anything newer.
    #[serde(other)]
    Other,
}

/// Token counts of one model call.
#[derive(Debug, Default, Deserialize)]
pub struct Usage {
    /// Uncached input tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Input tokens written to the cache.
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    /// Input tokens read from the cache.
    #[serde(default)]
    pub cache_read_input_tokens: u64,
    /// Output tokens.
    #[serde(default)]
    pub output_tokens: u64,
}

/// The `result` line.
#[derive(Debug, Deserialize)]
pub struct RunResult {
    /// `success`, `error_during_execution` or `error_max_turns`.
    #[serde(default)]
    pub subtype: String,
    /// Whether the run failed.
    #[serde(default)]
    pub is_error: bool,
    /// The error text of a failed run.
    #[serde(default)]
    pub error: Option<String>,
    /// The final text of a successful run.
    #[serde(default)]
    pub result: Option<String>,
    /// The thread id.
    #[serde(default)]
    pub session_id: Option<String>,
}
