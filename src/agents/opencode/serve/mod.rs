//! Placeholder of the server-event translator (replaced by the real one): text deltas and idle only.

use agent_client_protocol::v1::schema::{ContentBlock, ContentChunk, SessionUpdate};
use serde_json::Value;

use crate::agents::{Output, TranslateContext, Translator};

/// Translates `GET /event` events of one OpenCode session.
pub struct ServeTranslator {
    session_id: String,
    idle: bool,
}

impl ServeTranslator {
    /// A translator for one turn of `session_id`.
    pub fn new(_context: TranslateContext, session_id: String) -> Self {
        Self { session_id, idle: false }
    }
}

impl Translator for ServeTranslator {
    fn line(&mut self, line: &str) -> Vec<Output> {
        let Ok(event) = serde_json::from_str::<Value>(line) else { return Vec::new() };
        let props = &event["properties"];
        if props["sessionID"].as_str() != Some(self.session_id.as_str()) {
            return Vec::new();
        }
        match event["type"].as_str() {
            Some("message.part.delta") => {
                let text = props["delta"].as_str().unwrap_or("").to_string();
                vec![Output::Update(SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from(text))))]
            }
            Some("session.idle") if !self.idle => {
                self.idle = true;
                vec![Output::Idle]
            }
            _ => Vec::new(),
        }
    }

    fn finish(&mut self) -> Vec<Output> {
        Vec::new()
    }
}
