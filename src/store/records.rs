//! What the store keeps, as the rest of the bridge reads it: a session's record and context, a turn's record and
//! status, a session's history.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One persisted session.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRecord {
    /// Our session id, the one the editor knows.
    pub id: String,
    /// `amp` or `opencode`.
    pub agent: String,
    /// The editor's workspace (absolute).
    pub cwd: String,
    /// The sandbox provider that owns `sandbox_id` (`local`, …).
    pub sandbox_provider: String,
    /// The provider's id for this session's sandbox, once created.
    pub sandbox_id: Option<String>,
    /// The CLI's own conversation id (`ses_…`, `T-…`), once the first turn printed it.
    pub native_id: Option<String>,
    /// Title shown in the editor's history.
    pub title: Option<String>,
    /// Session config (model, mode…) as a JSON object.
    pub config: Value,
    /// What the editor gave the session beside its workspace.
    pub context: SessionContext,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// Milliseconds since the Unix epoch.
    pub updated_at: i64,
}

/// What the editor gave a session beside its workspace, as stored: never a value of an MCP server's environment
/// or headers (those live only in the bridge's memory, for as long as the editor has the session open).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SessionContext {
    /// More workspace roots (absolute), writable in the sandbox like the workspace.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_directories: Vec<String>,
    /// Instructions the agent gets beside its own (ACP's `systemPrompt`, append mode), or instead of them
    /// (`system_prompt_replaces`: `override` mode, where the agent offers it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// The system prompt replaces the agent's own (ACP's `override` mode).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub system_prompt_replaces: bool,
    /// The editor's MCP servers as last given, without their secrets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<McpServerShape>,
    /// The session this one was forked from, until its agent has a conversation of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
}

/// Where a fork's conversation comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkedFrom {
    /// The original session.
    pub session: String,
    /// The original's agent conversation, when the fork's agent can fork it where the fork runs (the same sandbox):
    /// else the fork's first prompt starts a new one from the stored transcript.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<String>,
}

/// One MCP server the editor gave a session, as stored: what it is and the names (never the values) of what it
/// was given, enough to tell on `session/load` whether the editor's set changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpServerShape {
    /// The server's name, as the editor shows it.
    pub name: String,
    /// `stdio`, `http` or `sse`.
    pub transport: String,
    /// The command (stdio) or URL (http, sse).
    pub target: String,
    /// The command's arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The names of the variables (stdio) or headers (http, sse) it was given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// How a turn ended, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnStatus {
    /// Still running in the process that owns it.
    Running,
    /// Ended with a stop reason.
    Done,
    /// Ended with an error.
    Failed,
    /// Its bridge died before it ended.
    Interrupted,
}

impl TurnStatus {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            TurnStatus::Running => "running",
            TurnStatus::Done => "done",
            TurnStatus::Failed => "failed",
            TurnStatus::Interrupted => "interrupted",
        }
    }

    pub(super) fn parse(text: &str) -> Self {
        match text {
            "running" => TurnStatus::Running,
            "done" => TurnStatus::Done,
            "failed" => TurnStatus::Failed,
            _ => TurnStatus::Interrupted,
        }
    }
}

/// One persisted turn.
#[derive(Clone, Debug)]
pub struct TurnRecord {
    /// Row id.
    pub id: i64,
    /// The session.
    pub session_id: String,
    /// The ACP prompt content blocks, as JSON.
    pub prompt: Value,
    /// How it ended.
    pub status: TurnStatus,
    /// The ACP stop reason when it ended normally.
    pub stop_reason: Option<String>,
    /// The error message when it failed.
    pub error: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub started_at: i64,
    /// Milliseconds since the Unix epoch.
    pub ended_at: Option<i64>,
}

/// The history of one session, ready to replay.
#[derive(Clone, Debug)]
pub struct History {
    /// Turns that were left out because of the replay limit (the oldest ones).
    pub omitted_turns: usize,
    /// Updates left out of the first turn kept, its oldest ones: the newest turn alone was longer than the limit.
    pub omitted_updates: usize,
    /// The remaining turns, oldest first, each with its updates in the order they were sent.
    pub turns: Vec<(TurnRecord, Vec<Value>)>,
}
