//! How `acp-sandbox prompt` shows a turn to a person: ACP updates rendered as terminal text. Pure, like the
//! translators, so a recorded turn always renders the same (`tests/golden/terminal/`).

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, Diff, PlanEntryStatus, SessionUpdate, StopReason, ToolCallContent, ToolCallStatus, ToolKind,
};

/// The most lines of a command's output (and of a diff, and of a failure) shown; the rest is counted.
pub const OUTPUT_LINES: usize = 40;

/// The most lines shown of what a read, a search or a fetch returns: a glimpse, not the file.
pub const GLIMPSE_LINES: usize = 3;

/// Where the last output left the cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum At {
    #[default]
    LineStart,
    /// Inside a line of the agent's answer.
    Text,
    /// Inside a line of the agent's thoughts.
    Thought,
}

/// What is known of one tool call.
#[derive(Debug, Default)]
struct Tool {
    title: String,
    kind: ToolKind,
    /// Its latest content (an update's content replaces the earlier one).
    content: Vec<ToolCallContent>,
    /// What of it was printed already (a proposed edit's diff is shown when the call starts).
    shown: Vec<ToolCallContent>,
    finished: bool,
}

/// Renders the updates of one turn, in order. Each call returns the text to write to stdout.
#[derive(Debug, Default)]
pub struct Render {
    at: At,
    tools: HashMap<String, Tool>,
    /// The tools by start, for the status line.
    order: Vec<String>,
    /// The tool whose header was printed last: a tool finishing after another one started says its name.
    last_header: Option<String>,
}

impl Render {
    /// A renderer for a new turn.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the output so far ends a line (the agent's text streams without newlines).
    pub fn at_line_start(&self) -> bool {
        self.at == At::LineStart
    }

    /// The title of the newest tool still running, if any: what the status line names.
    pub fn running_tool(&self) -> Option<&str> {
        self.order
            .iter()
            .rev()
            .filter_map(|id| self.tools.get(id))
            .find(|tool| !tool.finished)
            .map(|tool| tool.title.lines().next().unwrap_or_default())
    }

    /// What ends the output of the turn: a newline when it stopped inside a line.
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        self.end_line(&mut out);
        out
    }

    /// The text of one update.
    pub fn update(&mut self, update: &SessionUpdate) -> String {
        let mut out = String::new();
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let ContentBlock::Text(text) = &chunk.content {
                    self.stream(&mut out, At::Text, &text.text);
                }
            }
            SessionUpdate::AgentThoughtChunk(chunk) => {
                if let ContentBlock::Text(text) = &chunk.content {
                    self.stream(&mut out, At::Thought, &text.text);
                }
            }
            SessionUpdate::ToolCall(call) => {
                let id = call.tool_call_id.to_string();
                let kind = match call.kind {
                    ToolKind::Other => String::new(),
                    kind => serde_json::to_value(kind)
                        .ok()
                        .and_then(|k| k.as_str().map(|k| format!(" ({})", k.replace('_', " "))))
                        .unwrap_or_default(),
                };
                let mut title = call.title.lines();
                self.line(&mut out, &format!("▸ {}{kind}", title.next().unwrap_or_default()));
                for more in title {
                    self.line(&mut out, &format!("  {more}"));
                }
                let mut tool = Tool {
                    title: call.title.clone(),
                    kind: call.kind,
                    content: call.content.clone(),
                    ..Tool::default()
                };
                // An edit shows what it changes as it starts: the diff is the point of it.
                for content in &call.content {
                    if let ToolCallContent::Diff(diff) = content {
                        self.block(&mut out, &diff_lines(diff), OUTPUT_LINES);
                        tool.shown.push(content.clone());
                    }
                }
                tool.finished = matches!(call.status, ToolCallStatus::Completed | ToolCallStatus::Failed);
                if tool.finished {
                    self.finished(&mut out, &mut tool, call.status == ToolCallStatus::Failed, false);
                }
                self.last_header = Some(id.clone());
                self.order.push(id.clone());
                self.tools.insert(id, tool);
            }
            SessionUpdate::ToolCallUpdate(update) => {
                let id = update.tool_call_id.to_string();
                let named = self.last_header.as_deref() != Some(id.as_str());
                let mut tool = self.tools.remove(&id).unwrap_or_default();
                if let Some(title) = &update.fields.title {
                    tool.title = title.clone();
                }
                if let Some(kind) = update.fields.kind {
                    tool.kind = kind;
                }
                if let Some(content) = &update.fields.content {
                    tool.content = content.clone();
                }
                match update.fields.status {
                    Some(status @ (ToolCallStatus::Completed | ToolCallStatus::Failed)) if !tool.finished => {
                        tool.finished = true;
                        self.finished(&mut out, &mut tool, status == ToolCallStatus::Failed, named);
                    }
                    _ => {}
                }
                if !self.order.contains(&id) {
                    self.order.push(id.clone());
                }
                self.tools.insert(id, tool);
            }
            SessionUpdate::Plan(plan) => {
                self.line(&mut out, "Plan:");
                for entry in &plan.entries {
                    let status = match entry.status {
                        PlanEntryStatus::Completed => "done",
                        PlanEntryStatus::InProgress => "in progress",
                        _ => "to do",
                    };
                    self.line(&mut out, &format!("  [{status}] {}", entry.content));
                }
            }
            // Usage, titles, commands and options are for an editor's chrome.
            _ => {}
        }
        out
    }

    /// A finished tool: its mark, then what it returned that was not shown yet.
    fn finished(&mut self, out: &mut String, tool: &mut Tool, failed: bool, named: bool) {
        let mark = if failed { "  ✗ failed" } else { "  ✓ done" };
        let title = tool.title.lines().next().unwrap_or_default();
        match named && !title.is_empty() {
            true => self.line(out, &format!("{mark}: {title}")),
            false => self.line(out, mark),
        }
        let glimpse = matches!(tool.kind, ToolKind::Read | ToolKind::Search | ToolKind::Fetch);
        let limit = if glimpse && !failed { GLIMPSE_LINES } else { OUTPUT_LINES };
        for content in tool.content.clone() {
            if tool.shown.contains(&content) {
                continue;
            }
            let lines = match &content {
                ToolCallContent::Diff(diff) => {
                    self.block(out, &diff_lines(diff), OUTPUT_LINES);
                    tool.shown.push(content);
                    continue;
                }
                ToolCallContent::Content(c) => match &c.content {
                    ContentBlock::Text(text) => unfenced(&text.text),
                    _ => continue,
                },
                _ => continue,
            };
            self.block(out, &lines, limit);
            tool.shown.push(content);
        }
    }

    /// Lines indented under a tool, at most `limit` of them and a count of the rest.
    fn block(&mut self, out: &mut String, lines: &[String], limit: usize) {
        for line in lines.iter().take(limit) {
            self.line(out, format!("    {line}").trim_end());
        }
        if lines.len() > limit {
            let more = lines.len() - limit;
            self.line(out, &format!("    … {more} more line{}", if more == 1 { "" } else { "s" }));
        }
    }

    /// Streams the agent's text or thoughts; thoughts are marked at the start of each of their lines.
    fn stream(&mut self, out: &mut String, mode: At, text: &str) {
        if self.at != At::LineStart && self.at != mode {
            self.end_line(out);
        }
        for piece in text.split_inclusive('\n') {
            if self.at == At::LineStart {
                if mode == At::Thought {
                    out.push_str("  (thinking) ");
                }
                self.at = mode;
            }
            out.push_str(piece);
            if piece.ends_with('\n') {
                self.at = At::LineStart;
            }
        }
    }

    /// One whole line, on a line of its own.
    fn line(&mut self, out: &mut String, text: &str) {
        self.end_line(out);
        out.push_str(text);
        out.push('\n');
    }

    fn end_line(&mut self, out: &mut String) {
        if self.at != At::LineStart {
            out.push('\n');
            self.at = At::LineStart;
        }
    }
}

/// A stop reason in words.
pub fn stop_reason_words(stop: StopReason) -> &'static str {
    match stop {
        StopReason::EndTurn => "done",
        StopReason::Cancelled => "cancelled",
        StopReason::MaxTokens => "stopped: the model reached its output limit",
        StopReason::MaxTurnRequests => "stopped: the turn made too many model requests",
        StopReason::Refusal => "the model refused",
        _ => "ended",
    }
}

/// A compact unified diff of an edit (a new file is a diff from nothing).
fn diff_lines(diff: &Diff) -> Vec<String> {
    let path = diff.path.display().to_string();
    let old = diff.old_text.as_deref().unwrap_or_default();
    let text_diff = similar::TextDiff::from_lines(old, diff.new_text.as_str());
    let old_name = if diff.old_text.is_none() { "/dev/null" } else { path.as_str() };
    let unified =
        text_diff.unified_diff().context_radius(3).missing_newline_hint(false).header(old_name, &path).to_string();
    unified.lines().map(str::to_string).collect()
}

/// A tool's text without the Markdown fences the translators put around verbatim output, and without the
/// blank lines at its ends.
fn unfenced(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut fence: Option<usize> = None;
    for line in text.lines() {
        let ticks = line.len() - line.trim_start_matches('`').len();
        match fence {
            None if ticks >= 3 => fence = Some(ticks),
            Some(open) if ticks == open && line.trim_end().len() == ticks => fence = None,
            _ => lines.push(line.to_string()),
        }
    }
    let start = lines.iter().position(|l| !l.trim().is_empty()).unwrap_or(lines.len());
    let end = lines.iter().rposition(|l| !l.trim().is_empty()).map_or(start, |i| i + 1);
    lines[start..end].to_vec()
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::v1::schema::ContentChunk;

    use super::*;

    #[test]
    fn fences_are_dropped_but_not_what_is_outside_or_inside_them() {
        let text = "```console\nerror: x\n```\n\nExited with code 101.";
        assert_eq!(unfenced(text), ["error: x", "", "Exited with code 101."]);
        assert_eq!(unfenced("````\n# Example\nSome ``` backticks\n````"), ["# Example", "Some ``` backticks"]);
        assert_eq!(unfenced("plain\n"), ["plain"]);
    }

    #[test]
    fn a_new_file_is_a_diff_from_nothing() {
        let diff = Diff::new("/ws/a.txt", "one\ntwo\n");
        assert_eq!(diff_lines(&diff), ["--- /dev/null", "+++ /ws/a.txt", "@@ -0,0 +1,2 @@", "+one", "+two"]);
    }

    #[test]
    fn thoughts_and_text_do_not_share_a_line() {
        let mut render = Render::new();
        let thought = |t: &str| SessionUpdate::AgentThoughtChunk(ContentChunk::new(t.to_string().into()));
        let text = |t: &str| SessionUpdate::AgentMessageChunk(ContentChunk::new(t.to_string().into()));
        let out: String = [thought("Let me"), thought(" see.\nOk"), text("Hello"), text(" world")]
            .iter()
            .map(|u| render.update(u))
            .collect::<String>()
            + &render.finish();
        assert_eq!(out, "  (thinking) Let me see.\n  (thinking) Ok\nHello world\n");
    }
}
