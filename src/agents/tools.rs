//! Shared building blocks for the agent translators: tool cards, shell output (fenced or Zed's terminal
//! `_meta`), diffs, plans, fences and size caps. Pure functions only, like the translators that use them.

use std::path::PathBuf;

use agent_client_protocol::v1::schema::{
    Content, ContentBlock, Diff, Meta, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus, SessionUpdate, Terminal,
    ToolCall, ToolCallContent, ToolCallLocation, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use serde_json::{Value, json};

use crate::agents::{Output, TranslateContext};

/// Most text one tool card carries (per content block and per `rawOutput` string): a runaway `cat` must not
/// turn into a multi-megabyte notification that the editor and the session store both have to swallow.
pub const MAX_TOOL_TEXT: usize = 256 * 1024;

/// Most of an unparsed line that is kept: enough to recognise it in a log or an error message.
pub const MAX_UNPARSED: usize = 2000;

/// Shown in place of a tool that never reported back (the CLI exited or was killed mid-tool).
pub const TOOL_NEVER_FINISHED: &str = "The agent stopped before this tool finished.";

/// Shown on a tool that the turn's cancel stopped before it reported back.
pub const TOOL_CANCELLED: &str = "Cancelled: stopped before it finished.";

/// Cuts `text` to at most `max` bytes on a char boundary, saying how much was cut so a reader never
/// mistakes a truncated output for the whole of it.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n… [truncated {} bytes]", &text[..end], text.len() - end)
}

/// [`truncate`] at the per-tool cap.
pub fn cap(text: &str) -> String {
    truncate(text, MAX_TOOL_TEXT)
}

/// Caps every string inside a JSON value, so `rawOutput` obeys the same limit as the visible content.
pub fn cap_json(value: Value) -> Value {
    match value {
        Value::String(text) if text.len() > MAX_TOOL_TEXT => Value::String(cap(&text)),
        Value::Array(items) => Value::Array(items.into_iter().map(cap_json).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(key, item)| (key, cap_json(item))).collect()),
        other => other,
    }
}

/// A line that is not a known event, kept (shortened) for logs.
pub fn unparsed(line: &str) -> Output {
    Output::Unparsed { line: truncate(line, MAX_UNPARSED) }
}

/// Wraps `text` in a Markdown code fence longer than any backtick run inside it, so tool output can never
/// close the fence early and leak into the surrounding Markdown.
pub fn fence(text: &str, lang: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for ch in text.chars() {
        if ch == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    let ticks = "`".repeat(longest.max(2) + 1);
    let body = text.strip_suffix('\n').unwrap_or(text);
    format!("{ticks}{lang}\n{body}\n{ticks}")
}

/// A Markdown text block as tool content.
pub fn text_content(text: impl Into<String>) -> ToolCallContent {
    ToolCallContent::Content(Content::new(ContentBlock::from(text.into())))
}

/// A diff as tool content. `old` is `None` for a new file, sent as `"oldText": null` (see [`update_json`]).
pub fn diff_content(path: PathBuf, old: Option<String>, new: String) -> ToolCallContent {
    ToolCallContent::Diff(Diff::new(path, new).old_text(old))
}

/// An update as the client gets it: the ACP crate's JSON, except that a new file's diff says `"oldText": null`.
/// The crate leaves a `None` out, which the schema allows, but some clients (Toad) then draw an empty card. The
/// connection sends this, and the goldens record it.
pub fn update_json(update: &SessionUpdate) -> serde_json::Result<Value> {
    let mut value = serde_json::to_value(update)?;
    explicit_new_files(&mut value);
    Ok(value)
}

/// Whether the crate's JSON of `update` would leave out a diff's `oldText` (a new file): only such an update
/// needs [`explicit_new_files`], so every other one is sent without the detour through a JSON value.
pub fn has_new_file_diff(update: &SessionUpdate) -> bool {
    let content = match update {
        SessionUpdate::ToolCall(call) => Some(&call.content),
        SessionUpdate::ToolCallUpdate(update) => update.fields.content.as_ref(),
        _ => None,
    };
    content.is_some_and(|items| {
        items.iter().any(|item| matches!(item, ToolCallContent::Diff(diff) if diff.old_text.is_none()))
    })
}

/// Gives every diff in the `content` of an update's JSON (a `tool_call` or `tool_call_update`, also the tool
/// call of a permission request) an `oldText`, `null` where it had none.
pub fn explicit_new_files(update: &mut Value) {
    let Some(content) = update.get_mut("content").and_then(Value::as_array_mut) else { return };
    for item in content {
        if let Some(diff) = item.as_object_mut().filter(|item| item.get("type") == Some(&json!("diff"))) {
            diff.entry("oldText").or_insert(Value::Null);
        }
    }
}

/// Serializes an update, or a permission request's tool call, as [`update_json`] does: for `Output`'s
/// `Serialize`, so that the goldens show the wire form.
pub(crate) fn serialize_wire<T: serde::Serialize, S: serde::Serializer>(
    item: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    let mut value = serde_json::to_value(item).map_err(serde::ser::Error::custom)?;
    explicit_new_files(&mut value);
    value.serialize(serializer)
}

/// A file's text without the line numbers a CLI adds for its model (`1: fn main`, `00001| fn main`): only
/// when every line has one, so a file whose lines merely start with digits is left as it is.
pub fn strip_line_numbers(text: &str) -> String {
    let number = |line: &str| -> Option<usize> {
        let digits = line.len() - line.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let rest = &line[digits..];
        let sep = if rest.starts_with(": ") || rest.starts_with("| ") {
            2
        } else if rest == ":" || rest == "|" {
            1
        } else {
            0
        };
        (digits > 0 && sep > 0).then_some(digits + sep)
    };
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() || !lines.iter().all(|line| number(line).is_some()) {
        return text.to_string();
    }
    let mut plain: String = lines.iter().map(|line| &line[number(line).unwrap_or(0)..]).collect::<Vec<_>>().join("\n");
    if text.ends_with('\n') {
        plain.push('\n');
    }
    plain
}

/// A location to follow, with a line when one is known.
pub fn location(path: PathBuf, line: Option<u32>) -> ToolCallLocation {
    ToolCallLocation::new(path).line(line)
}

/// One line of `text`, at most `max` chars, for titles built from free text (a subagent's task, a query).
pub fn one_line(text: &str, max: usize) -> String {
    let first = text.lines().find(|line| !line.trim().is_empty()).unwrap_or("").trim();
    if first.chars().count() <= max {
        let more = text.trim().lines().count() > 1;
        return if more { format!("{first}…") } else { first.to_string() };
    }
    let cut: String = first.chars().take(max).collect();
    format!("{cut}…")
}

/// What a translator knows about a tool when it starts, independent of the CLI it came from.
pub struct ToolStart {
    /// The CLI's tool name (ACP `name`); empty when unknown.
    pub name: String,
    /// Human title: the command, "Read src/a.rs", the pattern…
    pub title: String,
    /// ACP kind, which picks the card Zed draws.
    pub kind: ToolKind,
    /// Absolute editor paths the tool touches.
    pub locations: Vec<ToolCallLocation>,
    /// Content known from the input alone (diffs, a subagent's prompt).
    pub content: Vec<ToolCallContent>,
    /// `Some(cwd)` for shell tools: their output goes to a terminal (when the client has one) or a fence.
    pub shell_cwd: Option<PathBuf>,
}

impl ToolStart {
    /// A plain card of `kind` titled `title`.
    pub fn new(name: &str, title: impl Into<String>, kind: ToolKind) -> Self {
        Self {
            name: name.to_string(),
            title: title.into(),
            kind,
            locations: Vec::new(),
            content: Vec::new(),
            shell_cwd: None,
        }
    }

    /// Adds locations.
    pub fn locations(mut self, locations: Vec<ToolCallLocation>) -> Self {
        self.locations = locations;
        self
    }

    /// Adds input-derived content.
    pub fn content(mut self, content: Vec<ToolCallContent>) -> Self {
        self.content = content;
        self
    }

    /// Marks a shell tool running in `cwd`.
    pub fn shell(mut self, cwd: PathBuf) -> Self {
        self.shell_cwd = Some(cwd);
        self
    }

    /// Whether the card shows diffs, which the completion must not replace on success.
    pub fn has_diff(&self) -> bool {
        self.content.iter().any(|item| matches!(item, ToolCallContent::Diff(_)))
    }

    /// The `tool_call` that opens the card, already running: both CLIs only report tools they execute.
    pub fn to_update(&self, context: &TranslateContext, id: &str, raw_input: Value) -> SessionUpdate {
        self.to_call(context, id, raw_input, ToolCallStatus::InProgress)
    }

    /// The `tool_call` that opens the card with `status` (`pending` while the input streams or waits for
    /// approval). A shell's card gets its terminal here, when the client has one.
    pub fn to_call(
        &self,
        context: &TranslateContext,
        id: &str,
        raw_input: Value,
        status: ToolCallStatus,
    ) -> SessionUpdate {
        let mut content = self.content.clone();
        let name = (!self.name.is_empty()).then(|| self.name.clone());
        let mut call = ToolCall::new(id.to_string(), self.title.clone())
            .name(name)
            .kind(self.kind)
            .status(status)
            .locations(self.locations.clone())
            .raw_input((!raw_input.is_null()).then(|| cap_json(raw_input)));
        if let (Some(cwd), true) = (&self.shell_cwd, context.terminal_output) {
            content.insert(0, ToolCallContent::Terminal(Terminal::new(id.to_string())));
            call = call.meta(meta("terminal_info", json!({ "terminal_id": id, "cwd": cwd })));
        }
        SessionUpdate::ToolCall(call.content(content))
    }
}

/// A `_meta` object with one key.
fn meta(key: &str, value: Value) -> Meta {
    let mut map = Meta::new();
    map.insert(key.to_string(), value);
    map
}

/// The final `tool_call_update` of a non-shell tool: status, optional replacement content, raw output.
pub fn finish_tool(
    id: &str,
    status: ToolCallStatus,
    content: Option<Vec<ToolCallContent>>,
    raw_output: Option<Value>,
) -> SessionUpdate {
    let mut fields = ToolCallUpdateFields::new().status(status);
    if let Some(content) = content {
        fields = fields.content(content);
    }
    if let Some(raw_output) = raw_output {
        fields = fields.raw_output(cap_json(raw_output));
    }
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.to_string(), fields))
}

/// The closing updates of a shell tool. With the terminal extension: the output as `terminal_output`,
/// then `terminal_exit` with the status; otherwise the output as a fenced `console` block.
/// `exit_code` is `None` when the CLI did not say (killed, rejected).
pub fn finish_shell(
    context: &TranslateContext,
    id: &str,
    output: &str,
    exit_code: Option<i64>,
    status: ToolCallStatus,
    raw_output: Option<Value>,
    note: Option<&str>,
) -> Vec<SessionUpdate> {
    let mut output = cap(output);
    let mut fields = ToolCallUpdateFields::new().status(status);
    if let Some(raw_output) = raw_output {
        fields = fields.raw_output(cap_json(raw_output));
    }
    if context.terminal_output {
        // The terminal is what the card shows: a note goes there as its last line.
        if let Some(note) = note {
            output.push_str(&format!("\n{note}\n"));
        }
        let mut updates = Vec::new();
        if !output.is_empty() {
            updates.push(terminal_output(id, &output));
        }
        let exit = json!({ "terminal_id": id, "exit_code": exit_code, "signal": null });
        updates.push(SessionUpdate::ToolCallUpdate(
            ToolCallUpdate::new(id.to_string(), fields).meta(meta("terminal_exit", exit)),
        ));
        return updates;
    }
    let mut text = if output.is_empty() { String::new() } else { fence(&output, "console") };
    match exit_code {
        Some(0) => {}
        Some(code) => text.push_str(&format!("\n\nExited with code {code}.")),
        None => {}
    }
    if let Some(note) = note {
        text.push_str(&format!("\n\n{note}"));
    }
    let text = text.trim_start().to_string();
    let content = if text.is_empty() { Vec::new() } else { vec![text_content(text)] };
    vec![SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.to_string(), fields.content(content)))]
}

/// Bytes for the display-only terminal of shell card `id` (Zed's `_meta.terminal_output`): appended to what
/// the terminal already shows.
pub fn terminal_output(id: &str, data: &str) -> SessionUpdate {
    SessionUpdate::ToolCallUpdate(
        ToolCallUpdate::new(id.to_string(), ToolCallUpdateFields::new())
            .meta(meta("terminal_output", json!({ "terminal_id": id, "data": data }))),
    )
}

/// Diffs of `path` from a unified diff, one per hunk: each hunk's old side (context and removed lines)
/// against its new side (context and added lines). A hunk that starts from nothing (`-0,0`) is a new file.
/// Empty when the text has no hunks.
pub fn diffs_from_patch(path: PathBuf, patch: &str) -> Vec<ToolCallContent> {
    let mut diffs = Vec::new();
    let mut hunk: Option<(bool, String, String)> = None;
    let close = |hunk: Option<(bool, String, String)>, diffs: &mut Vec<ToolCallContent>| {
        if let Some((new_file, old, new)) = hunk {
            let old = (!new_file).then(|| cap(&old));
            diffs.push(diff_content(path.clone(), old, cap(&new)));
        }
    };
    for line in patch.lines() {
        if line.starts_with("@@ ") {
            close(hunk.take(), &mut diffs);
            let old_side = line.split_whitespace().find(|part| part.starts_with('-')).unwrap_or("");
            hunk = Some((old_side == "-0,0", String::new(), String::new()));
            continue;
        }
        let Some((_, old, new)) = hunk.as_mut() else { continue };
        if let Some(rest) = line.strip_prefix('+') {
            new.push_str(rest);
            new.push('\n');
        } else if let Some(rest) = line.strip_prefix('-') {
            old.push_str(rest);
            old.push('\n');
        } else if let Some(rest) = line.strip_prefix(' ') {
            old.push_str(rest);
            old.push('\n');
            new.push_str(rest);
            new.push('\n');
        } else if line.is_empty() {
            // Some writers drop the space of an empty context line.
            old.push('\n');
            new.push('\n');
        }
        // `\ No newline at end of file` and anything else is not content.
    }
    close(hunk.take(), &mut diffs);
    diffs
}

/// Closes a tool whose result never came (the stream ended first), as failed, with `note` (why). A terminal
/// card keeps its terminal (replacing the content would drop it) and gets the note as its last output instead.
pub fn abandon_tool(context: &TranslateContext, id: &str, shell: bool, note: &str) -> Vec<SessionUpdate> {
    if shell && context.terminal_output {
        return finish_shell(context, id, "", None, ToolCallStatus::Failed, None, Some(note));
    }
    vec![finish_tool(id, ToolCallStatus::Failed, Some(vec![text_content(note)]), None)]
}

/// The content shown for a failed tool: its error text, fenced so paths and symbols stay literal.
pub fn error_content(error: &str) -> Vec<ToolCallContent> {
    if error.trim().is_empty() {
        return vec![text_content("The tool failed without saying why.")];
    }
    vec![text_content(fence(&cap(error), ""))]
}

/// Extracts a plan entry list from a todo array as both CLIs write it (`content`/`text`/`description`,
/// `status`, `priority`). Unknown statuses count as pending; `cancelled` counts as completed because ACP
/// has no cancelled state and the entry is no longer to do.
pub fn plan_from_todos(todos: &Value) -> Option<SessionUpdate> {
    let items = match todos {
        Value::Array(items) => items,
        Value::Object(map) => map.get("todos")?.as_array()?,
        Value::String(text) => return plan_from_todos(&serde_json::from_str(text).ok()?),
        _ => return None,
    };
    let entries = items
        .iter()
        .filter_map(|item| {
            let content = ["content", "text", "description", "title"]
                .iter()
                .find_map(|key| item.get(*key).and_then(Value::as_str))?;
            let status = item.get("status").and_then(Value::as_str).unwrap_or("");
            let status = match status.to_ascii_lowercase().replace('-', "_").as_str() {
                "in_progress" | "active" | "doing" | "running" => PlanEntryStatus::InProgress,
                "completed" | "complete" | "done" | "cancelled" | "canceled" => PlanEntryStatus::Completed,
                _ => PlanEntryStatus::Pending,
            };
            let priority = match item.get("priority").and_then(Value::as_str).unwrap_or("") {
                "high" => PlanEntryPriority::High,
                "low" => PlanEntryPriority::Low,
                _ => PlanEntryPriority::Medium,
            };
            Some(PlanEntry::new(content, priority, status))
        })
        .collect();
    Some(SessionUpdate::Plan(Plan::new(entries)))
}

/// Reads a string field of a JSON object, trimmed to `None` when empty.
pub fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str).filter(|text| !text.trim().is_empty())
}

/// A directory for a title: relative to the workspace, `.` for the workspace itself.
pub fn shown_dir(context: &TranslateContext, path: &str) -> String {
    if context.editor_path(path) == context.workspace {
        return ".".to_string();
    }
    context.display_path(path)
}

/// The first line number of the new side of a unified diff (`@@ -a,b +c,d @@`), for a location line.
pub fn first_hunk_line(patch: &str) -> Option<u32> {
    let header = patch.lines().find(|line| line.starts_with("@@ "))?;
    let plus = header.split_whitespace().find(|part| part.starts_with('+'))?;
    plus.trim_start_matches('+').split(',').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_is_longer_than_any_backtick_run() {
        assert_eq!(fence("plain", "sh"), "```sh\nplain\n```");
        assert_eq!(fence("a ```` b", ""), "`````\na ```` b\n`````");
        assert_eq!(fence("ends with newline\n", ""), "```\nends with newline\n```");
    }

    #[test]
    fn truncate_respects_char_boundaries_and_says_so() {
        let text = "é".repeat(10);
        let cut = truncate(&text, 5);
        assert!(cut.starts_with("éé\n"));
        assert!(cut.ends_with("[truncated 16 bytes]"));
        assert_eq!(truncate("short", 10), "short");
    }

    #[test]
    fn cap_json_caps_nested_strings() {
        let big = "x".repeat(MAX_TOOL_TEXT + 10);
        let capped = cap_json(json!({ "a": [big] }));
        let text = capped["a"][0].as_str().unwrap_or_default();
        assert!(text.len() < MAX_TOOL_TEXT + 100);
        assert!(text.ends_with("[truncated 10 bytes]"));
    }

    #[test]
    fn todos_map_statuses_and_priorities() {
        let plan = plan_from_todos(&json!([
            {"content": "a", "status": "cancelled", "priority": "low"},
            {"content": "b", "status": "in-progress"},
            {"content": "c", "status": "todo", "priority": "high"},
            {"status": "pending"}
        ]));
        let value = serde_json::to_value(plan).unwrap_or_default();
        assert_eq!(
            value["entries"],
            json!([
                {"content": "a", "status": "completed", "priority": "low"},
                {"content": "b", "status": "in_progress", "priority": "medium"},
                {"content": "c", "status": "pending", "priority": "high"}
            ])
        );
    }

    #[test]
    fn patch_hunks_become_diffs() {
        let patch = "Index: /w/a.txt\n===\n--- /w/a.txt\n+++ /w/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+deux\n three\n\
                     @@ -10,1 +10,2 @@\n ten\n+eleven\n\\ No newline at end of file\n";
        let diffs = serde_json::to_value(diffs_from_patch("/w/a.txt".into(), patch)).unwrap_or_default();
        assert_eq!(
            diffs,
            json!([
                {"type": "diff", "path": "/w/a.txt", "oldText": "one\ntwo\nthree\n", "newText": "one\ndeux\nthree\n"},
                {"type": "diff", "path": "/w/a.txt", "oldText": "ten\n", "newText": "ten\neleven\n"}
            ])
        );
        let created = diffs_from_patch("/w/n.txt".into(), "--- /w/n.txt\n+++ /w/n.txt\n@@ -0,0 +1,1 @@\n+hi\n");
        let created = serde_json::to_value(created).unwrap_or_default();
        assert_eq!(created, json!([{"type": "diff", "path": "/w/n.txt", "newText": "hi\n"}]));
        assert!(diffs_from_patch("/w/a".into(), "no hunks").is_empty());
    }

    #[test]
    fn a_new_files_diff_says_old_text_null_on_the_wire() {
        let call = ToolCall::new("t1", "Write a").content(vec![
            diff_content("/w/new.txt".into(), None, "hi\n".into()),
            diff_content("/w/old.txt".into(), Some("was\n".into()), "is\n".into()),
            text_content("done"),
        ]);
        let wire = update_json(&SessionUpdate::ToolCall(call.clone())).unwrap_or_default();
        assert_eq!(
            wire["content"],
            json!([
                {"type": "diff", "path": "/w/new.txt", "newText": "hi\n", "oldText": null},
                {"type": "diff", "path": "/w/old.txt", "oldText": "was\n", "newText": "is\n"},
                {"type": "content", "content": {"type": "text", "text": "done"}}
            ])
        );
        // Nothing else changes: a message's `content` is no list of tool content.
        let chunk = SessionUpdate::AgentMessageChunk(agent_client_protocol::v1::schema::ContentChunk::new(
            ContentBlock::from("hi".to_string()),
        ));
        assert_eq!(update_json(&chunk).ok(), serde_json::to_value(&chunk).ok());
        // Only an update with a new file's diff takes the detour.
        let edit = ToolCallUpdate::new(
            "t2",
            ToolCallUpdateFields::new().content(vec![diff_content("/w/old.txt".into(), Some("a".into()), "b".into())]),
        );
        let created = ToolCallUpdate::new(
            "t3",
            ToolCallUpdateFields::new().content(vec![diff_content("/w/new.txt".into(), None, "b".into())]),
        );
        assert_eq!(
            [
                &SessionUpdate::ToolCall(call),
                &SessionUpdate::ToolCallUpdate(edit),
                &SessionUpdate::ToolCallUpdate(created),
                &chunk
            ]
            .map(has_new_file_diff),
            [true, false, true, false]
        );
    }

    #[test]
    fn line_numbers_are_stripped_only_when_every_line_has_one() {
        assert_eq!(strip_line_numbers("1: fn a() {}\n2: \n3:\n10: }\n"), "fn a() {}\n\n\n}\n");
        assert_eq!(strip_line_numbers("00001| a\n00002| b"), "a\nb");
        assert_eq!(strip_line_numbers("1: a\nplain"), "1: a\nplain");
        assert_eq!(strip_line_numbers("2024: a year"), "a year");
        assert_eq!(strip_line_numbers(""), "");
    }

    #[test]
    fn hunk_line() {
        assert_eq!(first_hunk_line("--- a\n+++ b\n@@ -3,2 +5,4 @@\n-x"), Some(5));
        assert_eq!(first_hunk_line("no hunks"), None);
    }

    #[test]
    fn one_line_titles() {
        assert_eq!(one_line("short", 10), "short");
        assert_eq!(one_line("first\nsecond", 10), "first…");
        assert_eq!(one_line("abcdefghijkl", 5), "abcde…");
    }
}
