//! An ACP agent's `session/update`s as the bridge's own (pure): each line is the JSON of one update the agent sent
//! for its session. The update is the editor's as it is, but for what only the bridge may say: paths move from
//! the sandbox's view to the editor's workspace, the agent's own modes (which the bridge does not offer the editor:
//! its config options are the session's) are left out, the first update of a tool call never announced announces it,
//! and a tool call still open when the stream ends is closed.

use std::collections::BTreeSet;
use std::path::PathBuf;

use agent_client_protocol::v1::schema::{
    SessionUpdate, ToolCall, ToolCallContent, ToolCallLocation, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
};

use crate::agents::{Output, StreamEnd, TranslateContext, Translator};

/// How many characters of a line that is no update are kept for the log.
const EXCERPT: usize = 2000;

/// One turn's translation of an ACP agent's updates.
pub struct AcpTranslator {
    context: TranslateContext,
    /// The tool calls begun and not finished, by id: closed when the stream ends.
    open: BTreeSet<String>,
    /// Every tool call announced this turn.
    seen: BTreeSet<String>,
}

impl AcpTranslator {
    /// A translator for one turn.
    pub fn new(context: TranslateContext) -> Self {
        Self { context, open: BTreeSet::new(), seen: BTreeSet::new() }
    }

    /// A path the agent reported, in the editor's workspace.
    fn path(&self, path: &mut PathBuf) {
        if let Some(text) = path.to_str() {
            *path = self.context.editor_path(text);
        }
    }

    fn locations(&self, locations: &mut [ToolCallLocation]) {
        for location in locations {
            self.path(&mut location.path);
        }
    }

    fn content(&self, content: &mut [ToolCallContent]) {
        for item in content {
            if let ToolCallContent::Diff(diff) = item {
                self.path(&mut diff.path);
            }
        }
    }
}

/// Whether a tool call in this status has finished.
fn finished(status: ToolCallStatus) -> bool {
    matches!(status, ToolCallStatus::Completed | ToolCallStatus::Failed)
}

impl AcpTranslator {
    /// One update of the agent's, as the editor gets it.
    fn update(&mut self, mut update: SessionUpdate) -> Vec<Output> {
        match &mut update {
            SessionUpdate::ToolCall(call) => {
                self.locations(&mut call.locations);
                self.content(&mut call.content);
                let id = call.tool_call_id.0.to_string();
                self.seen.insert(id.clone());
                if finished(call.status) {
                    self.open.remove(&id);
                } else {
                    self.open.insert(id);
                }
            }
            // An update of a call never announced (Gemini CLI announces one that needs approval only in its
            // permission request) is the announcement: an editor shows no card for an update of an unknown call.
            SessionUpdate::ToolCallUpdate(call) if !self.seen.contains(call.tool_call_id.0.as_ref()) => {
                let mut announced = call.clone();
                announced.fields.title.get_or_insert_with(|| "Tool".to_string());
                if let Ok(announced) = ToolCall::try_from(announced) {
                    return self.update(SessionUpdate::ToolCall(announced));
                }
            }
            SessionUpdate::ToolCallUpdate(call) => {
                if let Some(locations) = &mut call.fields.locations {
                    self.locations(locations);
                }
                if let Some(content) = &mut call.fields.content {
                    self.content(content);
                }
                if call.fields.status.is_some_and(finished) {
                    self.open.remove(call.tool_call_id.0.as_ref());
                }
            }
            // Its mode is one of the session's options: the connection says a change of it as the whole option list
            // (`config_option_update`) before it gets here, so a mode update of its own is never the editor's.
            SessionUpdate::CurrentModeUpdate(_) => return Vec::new(),
            _ => {}
        }
        vec![Output::Update(update)]
    }
}

impl Translator for AcpTranslator {
    fn line(&mut self, line: &str) -> Vec<Output> {
        match serde_json::from_str::<SessionUpdate>(line) {
            Ok(update) => self.update(update),
            Err(_) => vec![Output::Unparsed { line: line.chars().take(EXCERPT).collect() }],
        }
    }

    fn finish(&mut self, end: StreamEnd) -> Vec<Output> {
        std::mem::take(&mut self.open)
            .into_iter()
            .map(|id| {
                Output::Update(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                    id,
                    ToolCallUpdateFields::new()
                        .status(ToolCallStatus::Failed)
                        .content(vec![ToolCallContent::from(end.note().to_string())]),
                )))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::translate_stream;
    use pretty_assertions::assert_eq;

    fn context(agent_workspace: &str) -> TranslateContext {
        TranslateContext {
            workspace: PathBuf::from("/home/me/project"),
            agent_workspace: PathBuf::from(agent_workspace),
            terminal_output: false,
            context_window: 200_000,
            turn_key: String::new(),
        }
    }

    fn wire(outputs: &[Output]) -> Vec<serde_json::Value> {
        outputs.iter().map(|output| serde_json::to_value(output).unwrap()).collect()
    }

    #[test]
    fn updates_pass_with_paths_in_the_editors_workspace_and_open_tools_closed_at_the_end() {
        let stream = [
            r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Hi"}}"#,
            r#"{"sessionUpdate":"tool_call","toolCallId":"t1","title":"Edit","kind":"edit","status":"in_progress","locations":[{"path":"/sandbox/ws/a.txt"}],"content":[{"type":"diff","path":"b.txt","oldText":null,"newText":"x"}]}"#,
            r#"{"sessionUpdate":"tool_call","toolCallId":"t2","title":"Run","kind":"execute","status":"pending"}"#,
            r#"{"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed","locations":[{"path":"/etc/hosts"}]}"#,
            r#"{"sessionUpdate":"current_mode_update","currentModeId":"plan"}"#,
            r#"{"sessionUpdate":"tool_call_update","toolCallId":"g1","status":"in_progress","title":"Shell"}"#,
            r#"{"sessionUpdate":"tool_call_update","toolCallId":"g1","status":"completed"}"#,
            "not json",
        ]
        .join("\n");
        let outputs = translate_stream(&mut AcpTranslator::new(context("/sandbox/ws")), &stream);
        assert_eq!(
            wire(&outputs),
            vec![
                serde_json::json!({"output":"update","sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Hi"}}),
                serde_json::json!({"output":"update","sessionUpdate":"tool_call","toolCallId":"t1","title":"Edit","kind":"edit","status":"in_progress","locations":[{"path":"/home/me/project/a.txt"}],"content":[{"type":"diff","path":"/home/me/project/b.txt","oldText":null,"newText":"x"}]}),
                // `pending` is the default status, which the wire leaves out.
                serde_json::json!({"output":"update","sessionUpdate":"tool_call","toolCallId":"t2","title":"Run","kind":"execute"}),
                serde_json::json!({"output":"update","sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed","locations":[{"path":"/etc/hosts"}]}),
                // Never announced: its first update is its announcement.
                serde_json::json!({"output":"update","sessionUpdate":"tool_call","toolCallId":"g1","title":"Shell","status":"in_progress"}),
                serde_json::json!({"output":"update","sessionUpdate":"tool_call_update","toolCallId":"g1","status":"completed"}),
                serde_json::json!({"output":"unparsed","line":"not json"}),
                serde_json::json!({"output":"update","sessionUpdate":"tool_call_update","toolCallId":"t2","status":"failed","content":[{"type":"content","content":{"type":"text","text":crate::agents::tools::TOOL_NEVER_FINISHED}}]}),
            ]
        );
    }
}
