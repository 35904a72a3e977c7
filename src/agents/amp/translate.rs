//! Pure translation of amp's JSONL events (`--stream-json`) into ACP updates.
//!
//! Amp prints whole messages, never deltas: each assistant message becomes its chunks and `tool_call`s, and
//! each `user.tool_result` closes the matching card. Tools still open when the stream ends are failed.

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, MessageId, SessionUpdate, ToolCallContent, ToolCallStatus, ToolKind, UsageUpdate,
};
use serde_json::Value;

use super::events::{AssistantMessage, Block, Event, MessageContent, RunResult};
use crate::agents::tools::{
    ToolStart, abandon_tool, cap, diff_content, error_content, fence, finish_shell, finish_tool, location, one_line,
    plan_from_todos, shown_dir, str_field, strip_line_numbers, text_content, unparsed,
};
use crate::agents::{Output, StreamEnd, TranslateContext, Translator, TurnEnd};

/// A `tool_call` sent whose result has not arrived yet.
struct OpenTool {
    id: String,
    /// Lower-cased tool name.
    name: String,
    kind: ToolKind,
    shell: bool,
    has_diff: bool,
}

/// Translator state for one turn.
pub struct AmpTranslator {
    context: TranslateContext,
    sent_session_id: bool,
    /// Assistant messages seen, for message ids: Amp prints none.
    messages: u64,
    /// Open tool cards, in the order they were opened so `finish` is deterministic.
    open: Vec<OpenTool>,
    /// Todo tools shown as a plan only, whose results are therefore not tool updates.
    todo_ids: Vec<(String, String)>,
    /// The stop reason of the last assistant message: `result` says success even after `max_tokens`.
    last_stop_reason: Option<String>,
    /// The last turn end reported, so the `result` does not repeat it.
    last_end: Option<TurnEnd>,
}

impl AmpTranslator {
    /// A translator for one turn.
    pub fn new(context: TranslateContext) -> Self {
        Self {
            context,
            sent_session_id: false,
            messages: 0,
            open: Vec::new(),
            todo_ids: Vec::new(),
            last_stop_reason: None,
            last_end: None,
        }
    }

    fn assistant(&mut self, message: AssistantMessage) -> Vec<Output> {
        self.messages += 1;
        let message_id = message.id.unwrap_or_else(|| format!("amp-msg-{}{}", self.context.turn_key, self.messages));
        let blocks = match message.content {
            MessageContent::Text(text) => vec![Block::Text { text }],
            MessageContent::Blocks(blocks) => blocks,
        };
        let mut outputs = Vec::new();
        for block in blocks {
            match block {
                Block::Text { text } if !text.is_empty() => {
                    let chunk =
                        ContentChunk::new(ContentBlock::from(text)).message_id(MessageId::new(message_id.as_str()));
                    outputs.push(Output::Update(SessionUpdate::AgentMessageChunk(chunk)));
                }
                Block::Thinking { thinking } if !thinking.is_empty() => {
                    let chunk =
                        ContentChunk::new(ContentBlock::from(thinking)).message_id(MessageId::new(message_id.as_str()));
                    outputs.push(Output::Update(SessionUpdate::AgentThoughtChunk(chunk)));
                }
                Block::ToolUse { id, name, input } => outputs.extend(self.tool_use(id, name, input)),
                // Tool results never come from the assistant; redacted thinking and images have nothing to show.
                _ => {}
            }
        }
        if let Some(usage) = message.usage {
            // Everything the next call reads back: the whole prompt (cached or not) plus this answer.
            let used = usage.input_tokens
                + usage.cache_creation_input_tokens
                + usage.cache_read_input_tokens
                + usage.output_tokens;
            if used > 0 {
                let update = UsageUpdate::new(used, self.context.context_window);
                outputs.push(Output::Update(SessionUpdate::UsageUpdate(update)));
            }
        }
        // In `--stream-json-input` mode no `result` comes per turn, so the assistant's own stop is the end;
        // in one-shot mode the `result` that follows repeats it.
        let end = match message.stop_reason.as_deref() {
            Some("end_turn") => Some(TurnEnd::EndTurn),
            Some("max_tokens") => Some(TurnEnd::MaxTokens),
            _ => None,
        };
        if let Some(end) = end {
            self.last_end = Some(end.clone());
            outputs.push(Output::End(end));
        }
        self.last_stop_reason = message.stop_reason;
        outputs
    }

    fn tool_use(&mut self, id: String, name: String, input: Value) -> Vec<Output> {
        let lower = name.to_ascii_lowercase();
        if matches!(lower.as_str(), "todo_write" | "todowrite") {
            self.todo_ids.push((id, name));
            return plan_from_todos(&input).map(Output::Update).into_iter().collect();
        }
        if matches!(lower.as_str(), "todo_read" | "todoread") {
            self.todo_ids.push((id, name));
            return Vec::new();
        }
        let start = classify(&self.context, &name, &input);
        let update = start.to_update(&self.context, &id, input);
        // A repeated id refines the open card instead of opening a second one, which Zed would reject.
        let update = match (self.open.iter().any(|tool| tool.id == id), update) {
            (true, SessionUpdate::ToolCall(call)) => {
                SessionUpdate::ToolCallUpdate(agent_client_protocol::v1::schema::ToolCallUpdate::from(call))
            }
            (_, update) => {
                self.open.push(OpenTool {
                    id,
                    name: lower,
                    kind: start.kind,
                    shell: start.shell_cwd.is_some(),
                    has_diff: start.has_diff(),
                });
                update
            }
        };
        vec![Output::Update(update)]
    }

    fn tool_result(&mut self, id: String, content: Value, is_error: bool) -> Vec<Output> {
        let text = result_text(&content);
        let raw_output = match serde_json::from_str::<Value>(&text) {
            Ok(parsed @ (Value::Object(_) | Value::Array(_))) => parsed,
            _ => Value::String(text.clone()),
        };

        if let Some(index) = self.todo_ids.iter().position(|(todo, _)| *todo == id) {
            let (todo, name) = self.todo_ids.remove(index);
            if !is_error {
                // `todo_read` answers with the list: worth showing as the plan too.
                return plan_from_todos(&raw_output).map(Output::Update).into_iter().collect();
            }
            // A failed todo update would vanish without a card to carry its error.
            let start = ToolStart::new(&name, "Update the plan", ToolKind::Think);
            let mut outputs = vec![Output::Update(start.to_update(&self.context, &todo, Value::Null))];
            // The error is the content; there is nothing else to put in `rawOutput`.
            outputs.push(Output::Update(finish_tool(&todo, ToolCallStatus::Failed, Some(error_content(&text)), None)));
            return outputs;
        }

        let mut outputs = Vec::new();
        let tool = match self.open.iter().position(|tool| tool.id == id) {
            Some(index) => self.open.remove(index),
            None => {
                // A result whose tool_use we never saw: open a card for it so the editor, which rejects
                // updates for unknown ids, still shows the result.
                let start = ToolStart::new("", "Tool result", ToolKind::Other);
                outputs.push(Output::Update(start.to_update(&self.context, &id, Value::Null)));
                OpenTool { id, name: String::new(), kind: ToolKind::Other, shell: false, has_diff: false }
            }
        };

        let updates = if tool.shell {
            // Bash answers `{"output", "exitCode"}`; an error result is plain text.
            let fallback = if is_error { text.as_str() } else { "" };
            let output = raw_output.get("output").and_then(Value::as_str).unwrap_or(fallback).to_string();
            let exit = raw_output.get("exitCode").and_then(Value::as_i64);
            let ok = !is_error && exit.is_none_or(|code| code == 0);
            let status = if ok { ToolCallStatus::Completed } else { ToolCallStatus::Failed };
            finish_shell(
                &self.context,
                &tool.id,
                &output,
                exit,
                status,
                without(raw_output, Shown::Field("output")),
                None,
            )
        } else if is_error {
            vec![finish_tool(&tool.id, ToolCallStatus::Failed, Some(error_content(&text)), None)]
        } else {
            let (content, shown) = result_content(&tool, &text, &raw_output);
            vec![finish_tool(&tool.id, ToolCallStatus::Completed, content, without(raw_output, shown))]
        };
        outputs.extend(updates.into_iter().map(Output::Update));
        outputs
    }

    fn result(&self, result: RunResult) -> TurnEnd {
        if result.subtype == "error_max_turns" {
            return TurnEnd::MaxTurnRequests;
        }
        if !result.is_error && !result.subtype.starts_with("error") {
            return match self.last_stop_reason.as_deref() {
                Some("max_tokens") => TurnEnd::MaxTokens,
                _ => TurnEnd::EndTurn,
            };
        }
        let message = [result.error, result.result]
            .into_iter()
            .flatten()
            .find(|text| !text.trim().is_empty())
            .unwrap_or_else(|| format!("Amp failed ({})", result.subtype));
        error_end(message)
    }
}

/// Cancelled, auth or plain error, from the words of Amp's error result.
pub fn error_end(message: String) -> TurnEnd {
    let lower = message.to_ascii_lowercase();
    if lower.contains("user cancelled") || lower.contains("user canceled") {
        return TurnEnd::Cancelled;
    }
    let auth = ["api key", "amp login", "unauthorized", "401", "authentication", "not logged in", "log in"];
    if auth.iter().any(|needle| lower.contains(needle)) {
        return TurnEnd::AuthRequired { message };
    }
    TurnEnd::Error { message }
}

/// The text of a tool result: a string, or the text blocks of a block list.
fn result_text(content: &Value) -> String {
    match content {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|block| block.get("text").and_then(Value::as_str).or_else(|| block.as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

/// What a tool's card shows of its result, so that `rawOutput` does not repeat it.
#[derive(Clone, Copy, PartialEq)]
enum Shown {
    /// Nothing: the card keeps its diffs, or the result was empty.
    Nothing,
    /// The whole result (its text, or its JSON laid out).
    All,
    /// One field of an object result (Read's `content`, Bash's `output`).
    Field(&'static str),
}

/// The `rawOutput` of a finished tool: Amp's result (parsed when it is JSON) minus what the card shows, since
/// clients such as acpx print both: Bash keeps its `exitCode`, Read its `absolutePath`, a text result shown as
/// content has none. `None` when nothing is left.
fn without(result: Value, shown: Shown) -> Option<Value> {
    match (shown, result) {
        (Shown::Nothing, result) => Some(result),
        (Shown::All, _) => None,
        (Shown::Field(key), Value::Object(mut map)) => {
            map.shift_remove(key);
            (!map.is_empty()).then_some(Value::Object(map))
        }
        // A plain-text result (Bash's error) is all shown.
        (Shown::Field(_), _) => None,
    }
}

/// The content of a completed (non-shell) tool, and what of the result it shows: diffs stay, a subagent shows
/// its answer as Markdown, a file read its text, anything else its output in a fence.
fn result_content(tool: &OpenTool, text: &str, parsed: &Value) -> (Option<Vec<ToolCallContent>>, Shown) {
    if tool.has_diff {
        return (None, Shown::Nothing);
    }
    if tool.kind == ToolKind::Think {
        return match text.trim().is_empty() {
            true => (None, Shown::Nothing),
            false => (Some(vec![text_content(cap(text))]), Shown::All),
        };
    }
    // Object results (Read's `{absolutePath, content}`) carry the interesting part in one field.
    let (shown, what) = match parsed {
        Value::Object(map) => match ["content", "output", "result", "text"]
            .into_iter()
            .find_map(|key| map.get(key).and_then(Value::as_str).map(|text| (key, text)))
        {
            Some((key, text)) => (text.to_string(), Shown::Field(key)),
            None => (serde_json::to_string_pretty(parsed).unwrap_or_default(), Shown::All),
        },
        // A list of paths or names reads best one a line.
        Value::Array(items) if items.iter().all(Value::is_string) => {
            (items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n"), Shown::All)
        }
        Value::Array(_) => (serde_json::to_string_pretty(parsed).unwrap_or_default(), Shown::All),
        _ => (text.to_string(), Shown::All),
    };
    if shown.trim().is_empty() || tool.name == "create_file" {
        return (None, Shown::Nothing);
    }
    // Read numbers the lines for the model (`1: …`); the editor shows the file.
    let shown = if tool.name == "read" { strip_line_numbers(&shown) } else { shown };
    (Some(vec![text_content(fence(&cap(&shown), ""))]), what)
}

/// Kind, title, locations and input-derived content of an Amp tool.
fn classify(context: &TranslateContext, name: &str, input: &Value) -> ToolStart {
    let path = str_field(input, "path");
    let shown = path.map(|path| shown_dir(context, path));
    let at = |kind: ToolKind, verb: &str| match path {
        Some(path) => ToolStart::new(name, format!("{verb} {}", context.display_path(path)), kind)
            .locations(vec![location(context.editor_path(path), None)]),
        None => ToolStart::new(name, verb, kind),
    };
    match name.to_ascii_lowercase().as_str() {
        "bash" => {
            let command = str_field(input, "cmd").or_else(|| str_field(input, "command")).unwrap_or(name);
            let cwd = str_field(input, "cwd").map_or_else(|| context.workspace.clone(), |cwd| context.editor_path(cwd));
            ToolStart::new(name, command, ToolKind::Execute).shell(cwd)
        }
        "read" => {
            let range: Vec<u64> = input
                .get("read_range")
                .and_then(Value::as_array)
                .map(|range| range.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            let mut start = at(ToolKind::Read, "Read");
            if let [from, to, ..] = range.as_slice() {
                start.title.push_str(&format!(" (lines {from}-{to})"));
            }
            if let (Some(path), Some(line)) = (path, range.first()) {
                start.locations = vec![location(context.editor_path(path), Some(*line as u32))];
            }
            start
        }
        "create_file" => {
            let content = input.get("content").and_then(Value::as_str).unwrap_or("");
            let mut start = at(ToolKind::Edit, "Write");
            if let Some(path) = path {
                start.content = vec![diff_content(context.editor_path(path), None, cap(content))];
            }
            start
        }
        "edit_file" => {
            let mut start = at(ToolKind::Edit, "Edit");
            let old = input.get("old_str").and_then(Value::as_str);
            let new = input.get("new_str").and_then(Value::as_str);
            if let (Some(path), Some(old), Some(new)) = (path, old, new) {
                // An empty old_str on a missing file creates it.
                let old = (!old.is_empty()).then(|| cap(old));
                start.content = vec![diff_content(context.editor_path(path), old, cap(new))];
            }
            start
        }
        "undo_edit" => at(ToolKind::Edit, "Undo edit of"),
        "format_file" => at(ToolKind::Edit, "Format"),
        "delete_file" => at(ToolKind::Delete, "Delete"),
        "move_file" => {
            let from = ["from", "source", "old_path", "path"].iter().find_map(|key| str_field(input, key));
            let to = ["to", "destination", "new_path", "target"].iter().find_map(|key| str_field(input, key));
            let title = match (from, to) {
                (Some(from), Some(to)) => {
                    format!("Move {} to {}", context.display_path(from), context.display_path(to))
                }
                _ => "Move file".to_string(),
            };
            let locations =
                [from, to].into_iter().flatten().map(|path| location(context.editor_path(path), None)).collect();
            ToolStart::new(name, title, ToolKind::Move).locations(locations)
        }
        "glob" => {
            let pattern = str_field(input, "filePattern").or_else(|| str_field(input, "pattern")).unwrap_or("files");
            let title = match &shown {
                Some(path) => format!("Find {pattern} in {path}"),
                None => format!("Find {pattern}"),
            };
            ToolStart::new(name, title, ToolKind::Search).locations(path_location(context, path))
        }
        "grep" => {
            let pattern = str_field(input, "pattern").unwrap_or("");
            let title = match &shown {
                Some(path) => format!("Grep {pattern} in {path}"),
                None => format!("Grep {pattern}"),
            };
            ToolStart::new(name, title, ToolKind::Search).locations(path_location(context, path))
        }
        "finder" => {
            let query = str_field(input, "query").unwrap_or("");
            ToolStart::new(name, format!("Search: {}", one_line(query, 100)), ToolKind::Search)
        }
        "find_thread" => {
            let query = str_field(input, "query").unwrap_or("");
            ToolStart::new(name, format!("Find thread: {}", one_line(query, 100)), ToolKind::Search)
        }
        "read_thread" => {
            let thread = str_field(input, "threadID").or_else(|| str_field(input, "thread_id")).unwrap_or("");
            ToolStart::new(name, format!("Read thread {thread}").trim_end().to_string(), ToolKind::Read)
        }
        "web_search" => {
            let query = str_field(input, "query").unwrap_or("");
            ToolStart::new(name, format!("Web search: {}", one_line(query, 100)), ToolKind::Fetch)
        }
        "read_web_page" => {
            let url = str_field(input, "url").unwrap_or("");
            ToolStart::new(name, format!("Fetch {url}").trim_end().to_string(), ToolKind::Fetch)
        }
        "look_at" => at(ToolKind::Read, "Look at"),
        "get_diagnostics" => at(ToolKind::Read, "Diagnostics for"),
        "oracle" => subagent(name, "Oracle", input, &["task", "prompt", "query"]),
        "librarian" => subagent(name, "Librarian", input, &["query", "task", "prompt"]),
        "task" => {
            let prompt = str_field(input, "prompt").map(|prompt| vec![text_content(cap(prompt))]).unwrap_or_default();
            let title = str_field(input, "description").map_or_else(|| "Task".to_string(), |text| one_line(text, 100));
            ToolStart::new(name, title, ToolKind::Think).content(prompt)
        }
        "skill" => {
            let skill = str_field(input, "name").unwrap_or("");
            ToolStart::new(name, format!("Skill: {skill}").trim_end().to_string(), ToolKind::Other)
        }
        "mermaid" => ToolStart::new(name, "Diagram", ToolKind::Other),
        lower => {
            if let Some(rest) = name.strip_prefix("mcp__") {
                let (server, tool) = rest.split_once("__").unwrap_or((rest, ""));
                let title = if tool.is_empty() { format!("MCP: {server}") } else { format!("MCP: {server}.{tool}") };
                return ToolStart::new(name, title, ToolKind::Other);
            }
            if let Some(tool) = lower.strip_prefix("tb__") {
                return ToolStart::new(name, format!("Toolbox: {tool}"), ToolKind::Other);
            }
            let title = if name.is_empty() { "Tool" } else { name };
            ToolStart::new(name, title, ToolKind::Other)
        }
    }
}

/// A subagent card (`oracle`, `librarian`): titled by its task, which is also shown until its answer comes.
fn subagent(name: &str, label: &str, input: &Value, keys: &[&str]) -> ToolStart {
    let task = keys.iter().find_map(|key| str_field(input, key));
    let title = match task {
        Some(task) => format!("{label}: {}", one_line(task, 100)),
        None => label.to_string(),
    };
    let content = task.map(|task| vec![text_content(cap(task))]).unwrap_or_default();
    ToolStart::new(name, title, ToolKind::Think).content(content)
}

/// The location of a path argument, if any.
fn path_location(
    context: &TranslateContext,
    path: Option<&str>,
) -> Vec<agent_client_protocol::v1::schema::ToolCallLocation> {
    path.map(|path| location(context.editor_path(path), None)).into_iter().collect()
}

impl Translator for AmpTranslator {
    fn line(&mut self, line: &str) -> Vec<Output> {
        let Ok(event) = serde_json::from_str::<Event>(line) else {
            return vec![unparsed(line)];
        };
        let mut outputs = Vec::new();
        if let (false, Some(id)) = (self.sent_session_id, event.session_id().filter(|id| !id.is_empty())) {
            self.sent_session_id = true;
            outputs.push(Output::NativeSessionId { id: id.to_string() });
        }
        match event {
            Event::System { .. } | Event::Unknown => {}
            Event::User { message, .. } => {
                // Text blocks are our own prompt echoed back; only tool results are news.
                if let MessageContent::Blocks(blocks) = message.content {
                    for block in blocks {
                        if let Block::ToolResult { tool_use_id, content, is_error } = block {
                            outputs.extend(self.tool_result(tool_use_id, content, is_error));
                        }
                    }
                }
            }
            Event::Assistant { message, .. } => outputs.extend(self.assistant(message)),
            Event::Result(result) => {
                // Nothing follows the result, so tools without an answer are over: close them before the end.
                let end = self.result(result);
                let stream_end = if end == TurnEnd::Cancelled { StreamEnd::Cancelled } else { StreamEnd::Stopped };
                outputs.extend(self.finish(stream_end));
                // One-shot runs repeat the end the last assistant message already gave.
                if self.last_end.as_ref() != Some(&end) {
                    outputs.push(Output::End(end));
                }
            }
        }
        outputs
    }

    fn finish(&mut self, end: StreamEnd) -> Vec<Output> {
        let open = std::mem::take(&mut self.open);
        let abandon = |tool: &OpenTool| abandon_tool(&self.context, &tool.id, tool.shell, end.note());
        open.iter().flat_map(abandon).map(Output::Update).collect()
    }
}

#[cfg(test)]
#[path = "translate_tests.rs"]
mod tests;
