//! Pure translation of opencode's JSONL events (`run --format json`) into ACP updates.
//!
//! OpenCode prints every part once, complete: text as one chunk, and each tool only when it has finished,
//! so a tool becomes a `tool_call` immediately followed by its closing `tool_call_update`.

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, Cost, MessageId, SessionUpdate, ToolCallContent, ToolCallStatus, ToolKind, UsageUpdate,
};
use serde_json::{Value, json};

use super::events::{ErrorInfo, Event, Line, StepFinishPart, TextPart, ToolPart, ToolState};
use crate::agents::tools::{
    TOOL_CANCELLED, ToolStart, cap, diff_content, error_content, fence, finish_shell, finish_tool, first_hunk_line,
    location, one_line, plan_from_todos, shown_dir, str_field, strip_line_numbers, text_content, unparsed,
};
use crate::agents::{Output, StreamEnd, TranslateContext, Translator, TurnEnd};

/// Translator state for one turn.
pub struct OpenCodeTranslator {
    context: TranslateContext,
    /// Whether the native session id was already reported.
    sent_session_id: bool,
    /// Usage and cut streams of the model calls so far.
    steps: StepUsage,
}

/// What the `step-finish` parts of one turn add up to. Shared with the `opencode serve` translator.
#[derive(Default)]
pub(crate) struct StepUsage {
    /// Cost of the model calls of this turn so far: ACP's `cost` is cumulative.
    cost: f64,
    /// Model calls in a row that ended with a cut stream (reason `unknown`, no tokens).
    cut_streams: usize,
}

impl StepUsage {
    /// The `usage_update` of one finished model call, and an abort when OpenCode is stuck re-prompting after
    /// cut streams.
    pub(crate) fn step(&mut self, context: &TranslateContext, part: &StepFinishPart) -> Vec<Output> {
        let mut outputs = Vec::new();
        // What the next call will read back: this call's whole input (cached or not) plus its answer.
        // Reasoning is left out because providers drop it from later requests.
        let tokens = &part.tokens;
        let used = tokens.input + tokens.cache.read + tokens.cache.write + tokens.output;
        self.cost += part.cost.unwrap_or(0.0);
        // A call cut off mid-stream reports all zeros; a zero would wrongly empty the editor's meter.
        if used > 0 {
            let mut usage = UsageUpdate::new(used, context.context_window);
            if part.cost.is_some() {
                // Summing binary floats leaves noise like 0.016300000000000002; no provider bills below 1e-9.
                let cost = (self.cost * 1e9).round() / 1e9;
                usage = usage.cost(Cost::new(cost, "USD"));
            }
            outputs.push(Output::Update(SessionUpdate::UsageUpdate(usage)));
        }
        if part.reason == "unknown" && used == 0 {
            self.cut_streams += 1;
            if self.cut_streams == CUT_STREAM_LIMIT {
                outputs.push(Output::Abort {
                    message: format!(
                        "OpenCode lost the model's answer mid-stream {CUT_STREAM_LIMIT} times in a row and kept retrying; \
                         it was stopped. Check the model provider, then prompt again to continue"
                    ),
                });
            }
        } else {
            self.cut_streams = 0;
        }
        outputs
    }
}

/// The turn end an AI SDK finish reason stands for (`stop`, `length`, `content-filter`); `None` for reasons
/// that do not end the turn (`tool-calls`, `unknown`…).
pub(crate) fn finish_end(reason: &str) -> Option<TurnEnd> {
    match reason {
        "stop" => Some(TurnEnd::EndTurn),
        "length" => Some(TurnEnd::MaxTokens),
        "content-filter" => Some(TurnEnd::Refusal),
        _ => None,
    }
}

/// The id of an OpenCode tool's card: the model's call id, else the part id. The permission requests of
/// `opencode serve` name the call id, so both translators must build it the same way.
pub(crate) fn tool_call_id(call_id: Option<&str>, part_id: Option<&str>, tool: &str) -> String {
    let id = call_id.filter(|id| !id.is_empty()).or(part_id.filter(|id| !id.is_empty()));
    id.map_or_else(|| format!("opencode-{tool}"), str::to_string)
}

/// OpenCode re-prompts at once after a cut stream and can loop forever (hundreds of calls a minute): after
/// this many cut calls in a row the turn is stopped.
const CUT_STREAM_LIMIT: usize = 5;

impl OpenCodeTranslator {
    /// A translator for one turn.
    pub fn new(context: TranslateContext) -> Self {
        Self { context, sent_session_id: false, steps: StepUsage::default() }
    }

    fn chunk(part: TextPart, thought: bool) -> Vec<Output> {
        if part.ignored || part.text.is_empty() {
            return Vec::new();
        }
        let chunk = ContentChunk::new(ContentBlock::from(part.text)).message_id(part.message_id.map(MessageId::new));
        let update =
            if thought { SessionUpdate::AgentThoughtChunk(chunk) } else { SessionUpdate::AgentMessageChunk(chunk) };
        vec![Output::Update(update)]
    }

    fn step_finish(&mut self, part: StepFinishPart) -> Vec<Output> {
        let mut outputs = self.steps.step(&self.context, &part);
        outputs.extend(finish_end(&part.reason).map(Output::End));
        outputs
    }

    fn tool(&self, part: Box<ToolPart>) -> Vec<Output> {
        let id = tool_call_id(part.call_id.as_deref(), part.id.as_deref(), &part.tool);
        let state = part.state;
        let failed = state.status == "error";
        let name = part.tool.to_ascii_lowercase();

        // Todo tools only update the plan (as claude-agent-acp does); a failing one still gets a card so its
        // error is not lost.
        if is_todo_tool(&name) && !failed {
            let todos = if state.metadata.get("todos").is_some() { &state.metadata } else { &state.input };
            let plan = plan_from_todos(todos)
                .or_else(|| state.output.as_deref().and_then(|output| plan_from_todos(&json!(output))));
            return plan.map(Output::Update).into_iter().collect();
        }

        let start = classify(&self.context, &part.tool, &state.input, state.title.as_deref(), &state.metadata);
        let mut updates = vec![start.to_update(&self.context, &id, state.input.clone())];
        updates.extend(closing_updates(&self.context, &id, &start, &name, &state, None));
        updates.into_iter().map(Output::Update).collect()
    }
}

/// Whether a tool only maintains the todo list, which the editor shows as the plan rather than as a card.
pub(crate) fn is_todo_tool(name: &str) -> bool {
    matches!(name.to_ascii_lowercase().as_str(), "todowrite" | "todoread")
}

/// The updates that close a tool's card from its final state (`completed` or `error`): a shell's output and
/// exit, a failure's error, anything else's result (diffs already on the card stay). `shell_output` replaces
/// what is sent of a shell's output when some was already streamed to a terminal; `name` is lower case.
pub(crate) fn closing_updates(
    context: &TranslateContext,
    id: &str,
    start: &ToolStart,
    name: &str,
    state: &ToolState,
    shell_output: Option<&str>,
) -> Vec<SessionUpdate> {
    let failed = state.status == "error";
    if start.shell_cwd.is_some() {
        let printed = shell_printed(state);
        let output = shell_output.unwrap_or_else(|| shell_final_output(state));
        let exit = state.metadata.get("exit").and_then(Value::as_i64);
        let stopped = shell_stopped(state).or_else(|| interrupted(state).then(|| TOOL_CANCELLED.to_string()));
        // The note says it in words: the block or error it came from is not shown again.
        let output = match &stopped {
            Some(_) if interrupted(state) => shell_output.unwrap_or(printed),
            Some(_) => without_shell_metadata(output),
            None => output,
        };
        let ok = !failed && stopped.is_none() && exit.is_none_or(|code| code == 0);
        let status = if ok { ToolCallStatus::Completed } else { ToolCallStatus::Failed };
        let shown = if failed && printed.is_empty() { Shown::Error } else { Shown::Output };
        return finish_shell(context, id, output, exit, status, raw_output(state, shown), stopped.as_deref());
    }
    if failed {
        let content = if interrupted(state) {
            vec![text_content(TOOL_CANCELLED)]
        } else {
            error_content(state.error.as_deref().unwrap_or(""))
        };
        return vec![finish_tool(id, ToolCallStatus::Failed, Some(content), raw_output(state, Shown::Error))];
    }
    let output = state.output.as_deref().unwrap_or("");
    let (content, shown) = result_content(start, name, output, &state.metadata);
    vec![finish_tool(id, ToolCallStatus::Completed, content, raw_output(state, shown))]
}

/// What a finished tool's card shows of its state, so that `rawOutput` does not repeat it.
#[derive(Clone, Copy, PartialEq)]
enum Shown {
    /// Nothing of the result: the card keeps its diffs, or there was nothing to show.
    Nothing,
    /// The output, in the form a person reads (a shell's output, a file's text, a subagent's answer).
    Output,
    /// The error.
    Error,
    /// The patch OpenCode keeps in `metadata.diff` (the output, a summary, is not shown).
    Patch,
}

/// The `rawOutput` of a finished tool: OpenCode's structured result (`metadata`: exit code, counts, paths…),
/// with its `output` or `error` only when the card does not show them. Clients such as acpx print both fields,
/// so what the content shows is left out, and so are the copies `metadata` keeps of it (a shell's `output`, a
/// read's `preview` and `display.text`, a patch's `diff`). `None` when nothing is left.
fn raw_output(state: &ToolState, shown: Shown) -> Option<Value> {
    let mut raw = serde_json::Map::new();
    if let (Some(output), false) = (&state.output, shown == Shown::Output) {
        raw.insert("output".into(), json!(output));
    }
    if let (Some(error), false) = (&state.error, shown == Shown::Error) {
        raw.insert("error".into(), json!(error));
    }
    let mut metadata = state.metadata.clone();
    if let Value::Object(map) = &mut metadata {
        match shown {
            Shown::Output => {
                map.shift_remove("output");
                map.shift_remove("preview");
                if let Some(Value::Object(display)) = map.get_mut("display") {
                    display.shift_remove("text");
                }
            }
            Shown::Patch => {
                map.shift_remove("diff");
            }
            Shown::Nothing | Shown::Error => {}
        }
    }
    if !(metadata.is_null() || metadata == json!({})) {
        raw.insert("metadata".into(), metadata);
    }
    (!raw.is_empty()).then_some(Value::Object(raw))
}

/// Why OpenCode stopped a shell before it exited, when it did: it reports a cancelled command, or one past its
/// timeout, as `completed` with `exit: null` and says why in a `<shell_metadata>` block of its output.
fn shell_stopped(state: &ToolState) -> Option<String> {
    if state.status != "completed" || !matches!(state.metadata.get("exit"), Some(Value::Null)) {
        return None;
    }
    let output = state.output.as_deref().unwrap_or("");
    let said = output
        .rsplit_once("<shell_metadata>")
        .and_then(|(_, rest)| rest.split_once("</shell_metadata>"))
        .map(|(said, _)| said.trim())
        .unwrap_or("");
    Some(match said {
        "" => SHELL_STOPPED.to_string(),
        "User aborted the command" => TOOL_CANCELLED.to_string(),
        said => said.to_string(),
    })
}

/// A shell's output without OpenCode's trailing `<shell_metadata>` block.
fn without_shell_metadata(output: &str) -> &str {
    match output.rsplit_once("<shell_metadata>") {
        Some((before, after)) if after.trim_end().ends_with("</shell_metadata>") => before.trim_end(),
        _ => output,
    }
}

/// Whether OpenCode failed a tool because its turn was aborted (it marks those `interrupted`).
fn interrupted(state: &ToolState) -> bool {
    state.status == "error" && state.metadata.get("interrupted") == Some(&Value::Bool(true))
}

/// The note on a shell card whose command OpenCode stopped without saying why.
const SHELL_STOPPED: &str = "The command was stopped before it finished.";

/// What a shell printed (OpenCode keeps it in `metadata.output` too).
fn shell_printed(state: &ToolState) -> &str {
    str_field(&state.metadata, "output").or(state.output.as_deref()).unwrap_or("")
}

/// All a finished shell tool printed: its output, or its error when it printed nothing.
pub(crate) fn shell_final_output(state: &ToolState) -> &str {
    let output = shell_printed(state);
    if state.status == "error" && output.is_empty() { state.error.as_deref().unwrap_or("") } else { output }
}

/// The content of a completed tool, and what of the state it shows: diffs stay as they are, a subagent shows
/// its answer, a read the file's text, anything else its output in a fence.
fn result_content(
    start: &ToolStart,
    name: &str,
    output: &str,
    metadata: &Value,
) -> (Option<Vec<ToolCallContent>>, Shown) {
    if start.has_diff() {
        return (None, Shown::Nothing);
    }
    if start.kind == ToolKind::Think {
        return (Some(vec![text_content(cap(&task_result(output)))]), Shown::Output);
    }
    if matches!(name, "patch" | "apply_patch") {
        let (patch, shown) = match str_field(metadata, "diff") {
            Some(diff) => (diff, Shown::Patch),
            None => (output, Shown::Output),
        };
        return (Some(vec![text_content(fence(&cap(patch), "diff"))]), shown);
    }
    let output = if name == "read" { read_text(output, metadata) } else { output.to_string() };
    if output.trim().is_empty() {
        return (None, Shown::Nothing);
    }
    (Some(vec![text_content(fence(&cap(&output), ""))]), Shown::Output)
}

/// The text a person reads of a `read`: OpenCode wraps the file for its model in `<path>`, `<type>` and
/// `<content>` tags, numbers its lines (`1: …`) and adds notes such as `(End of file - total 3 lines)`. The plain
/// text OpenCode keeps for display (`metadata.display.text`) when it has it; else the output unwrapped; else
/// the output as it is.
fn read_text(output: &str, metadata: &Value) -> String {
    let display = metadata.get("display").filter(|display| str_field(display, "type") == Some("file"));
    if let Some(text) = display.and_then(|display| display.get("text")).and_then(Value::as_str) {
        return text.to_string();
    }
    let inner = ["content", "entries"].iter().find_map(|tag| {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        let start = output.find(&open)? + open.len();
        let end = output.rfind(&close).filter(|end| *end >= start)?;
        Some(&output[start..end])
    });
    let Some(inner) = inner else { return output.to_string() };
    let mut lines: Vec<&str> = inner.trim_matches('\n').lines().collect();
    // The notes for the model come last, after a blank line.
    while lines.last().is_some_and(|line| line.starts_with('(') && line.ends_with(')')) {
        lines.pop();
        while lines.last().is_some_and(|line| line.trim().is_empty()) {
            lines.pop();
        }
    }
    strip_line_numbers(&lines.join("\n"))
}

/// The subagent's answer from a `task` output (`<task …><task_result>…</task_result></task>`); the whole
/// output when it has another shape.
pub fn task_result(output: &str) -> String {
    for tag in ["task_result", "task_error"] {
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        if let Some(start) = output.find(&open) {
            let rest = &output[start + open.len()..];
            let end = rest.rfind(&close).unwrap_or(rest.len());
            return rest[..end].trim().to_string();
        }
    }
    output.trim().to_string()
}

/// Kind, title, locations and input-derived content of an OpenCode tool.
pub(crate) fn classify(
    context: &TranslateContext,
    tool: &str,
    input: &Value,
    title: Option<&str>,
    metadata: &Value,
) -> ToolStart {
    let title = title.filter(|title| !title.trim().is_empty());
    let file = str_field(input, "filePath").or_else(|| str_field(input, "filepath"));
    let path_or = |key: &str| str_field(input, key).map(|path| shown_dir(context, path));
    match tool.to_ascii_lowercase().as_str() {
        "bash" | "shell" => {
            let command = str_field(input, "command").or_else(|| str_field(input, "cmd"));
            let cwd =
                str_field(input, "workdir").map_or_else(|| context.workspace.clone(), |dir| context.editor_path(dir));
            ToolStart::new(tool, command.or(title).unwrap_or(tool), ToolKind::Execute).shell(cwd)
        }
        "read" => match file {
            Some(file) => {
                let line = input.get("offset").and_then(Value::as_u64).filter(|line| *line > 0);
                ToolStart::new(tool, format!("Read {}", context.display_path(file)), ToolKind::Read)
                    .locations(vec![location(context.editor_path(file), line.map(|line| line as u32))])
            }
            None => ToolStart::new(tool, title.unwrap_or("Read"), ToolKind::Read),
        },
        "write" => match file {
            Some(file) => {
                let path = context.editor_path(file);
                let content = input.get("content").and_then(Value::as_str).unwrap_or("");
                // Overwriting an existing file: OpenCode does not say what was there, so the diff shows the
                // new content as if the file were new. Still the most useful view of what was written.
                ToolStart::new(tool, format!("Write {}", context.display_path(file)), ToolKind::Edit)
                    .locations(vec![location(path.clone(), None)])
                    .content(vec![diff_content(path, None, cap(content))])
            }
            None => ToolStart::new(tool, title.unwrap_or("Write"), ToolKind::Edit),
        },
        "edit" | "multiedit" => match file {
            Some(file) => {
                let path = context.editor_path(file);
                let edits = match input.get("edits").and_then(Value::as_array) {
                    Some(edits) => edits.iter().collect(),
                    None => vec![input],
                };
                let diffs = edits
                    .into_iter()
                    .filter_map(|edit| {
                        let old = edit.get("oldString").and_then(Value::as_str)?;
                        let new = edit.get("newString").and_then(Value::as_str)?;
                        // OpenCode's edit with an empty oldString creates the file.
                        let old = (!old.is_empty()).then(|| cap(old));
                        Some(diff_content(path.clone(), old, cap(new)))
                    })
                    .collect();
                let patch = metadata
                    .get("filediff")
                    .and_then(|diff| str_field(diff, "patch"))
                    .or_else(|| str_field(metadata, "diff"));
                let line = patch.and_then(first_hunk_line);
                ToolStart::new(tool, format!("Edit {}", context.display_path(file)), ToolKind::Edit)
                    .locations(vec![location(path, line)])
                    .content(diffs)
            }
            None => ToolStart::new(tool, title.unwrap_or("Edit"), ToolKind::Edit),
        },
        "patch" | "apply_patch" => {
            let files: Vec<String> = match metadata.get("files").and_then(Value::as_array) {
                Some(files) => files
                    .iter()
                    .filter_map(|file| str_field(file, "movePath").or_else(|| str_field(file, "filePath")))
                    .map(str::to_string)
                    .collect(),
                None => patch_files(str_field(input, "patchText").unwrap_or("")),
            };
            let shown: Vec<String> = files.iter().map(|file| context.display_path(file)).collect();
            let title =
                if shown.is_empty() { "Apply patch".to_string() } else { format!("Patch {}", shown.join(", ")) };
            let locations = files.iter().map(|file| location(context.editor_path(file), None)).collect();
            ToolStart::new(tool, title, ToolKind::Edit).locations(locations)
        }
        "glob" => {
            let pattern = str_field(input, "pattern").unwrap_or("files");
            let title = match path_or("path") {
                Some(path) => format!("Find {pattern} in {path}"),
                None => format!("Find {pattern}"),
            };
            ToolStart::new(tool, title, ToolKind::Search).locations(search_location(context, input))
        }
        "grep" => {
            let pattern = str_field(input, "pattern").unwrap_or("");
            let mut title = format!("Grep {pattern}");
            if let Some(include) = str_field(input, "include") {
                title.push_str(&format!(" ({include})"));
            }
            if let Some(path) = path_or("path") {
                title.push_str(&format!(" in {path}"));
            }
            ToolStart::new(tool, title, ToolKind::Search).locations(search_location(context, input))
        }
        "list" | "ls" => {
            let path = path_or("path").unwrap_or_else(|| ".".to_string());
            ToolStart::new(tool, format!("List {path}"), ToolKind::Read).locations(search_location(context, input))
        }
        "codesearch" => {
            let query = str_field(input, "query").unwrap_or("");
            ToolStart::new(tool, format!("Code search: {}", one_line(query, 100)), ToolKind::Search)
        }
        "webfetch" => {
            let url = str_field(input, "url").or(title).unwrap_or("");
            ToolStart::new(tool, format!("Fetch {url}"), ToolKind::Fetch)
        }
        "websearch" => {
            let query = str_field(input, "query").or(title).unwrap_or("");
            ToolStart::new(tool, format!("Web search: {}", one_line(query, 100)), ToolKind::Fetch)
        }
        "task" => {
            let description = str_field(input, "description").or(title).unwrap_or("Task");
            let title = match str_field(input, "subagent_type") {
                Some(agent) => format!("{description} (@{agent})"),
                None => description.to_string(),
            };
            let prompt = str_field(input, "prompt").map(|prompt| vec![text_content(cap(prompt))]).unwrap_or_default();
            ToolStart::new(tool, title, ToolKind::Think).content(prompt)
        }
        "todowrite" | "todoread" => ToolStart::new(tool, "Update the plan", ToolKind::Think),
        "skill" => {
            let name = str_field(input, "name").or(title).unwrap_or("skill");
            ToolStart::new(tool, format!("Skill: {name}"), ToolKind::Other)
        }
        "question" => {
            let question = input
                .get("questions")
                .and_then(Value::as_array)
                .and_then(|questions| questions.first())
                .and_then(|first| str_field(first, "question").or_else(|| str_field(first, "header")));
            ToolStart::new(tool, one_line(question.or(title).unwrap_or("Question"), 100), ToolKind::Other)
        }
        _ => ToolStart::new(tool, title.unwrap_or(tool), ToolKind::Other),
    }
}

/// The directory a search tool looked in, when it said.
fn search_location(
    context: &TranslateContext,
    input: &Value,
) -> Vec<agent_client_protocol::v1::schema::ToolCallLocation> {
    str_field(input, "path").map(|path| location(context.editor_path(path), None)).into_iter().collect()
}

/// The files an OpenCode patch names (`*** Add File: a`, `*** Update File: b`, `*** Move to: c`…).
fn patch_files(patch: &str) -> Vec<String> {
    patch
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("*** ")?;
            ["Add File:", "Update File:", "Delete File:", "Move to:"]
                .iter()
                .find_map(|prefix| rest.strip_prefix(prefix))
                .map(|path| path.trim().to_string())
        })
        .collect()
}

/// The turn end an OpenCode error name stands for.
pub(crate) fn error_end(error: ErrorInfo) -> TurnEnd {
    let message = str_field(&error.data, "message").map(str::to_string).unwrap_or_else(|| error.name.clone());
    match error.name.as_str() {
        "ProviderAuthError" => TurnEnd::AuthRequired { message },
        "MessageOutputLengthError" => TurnEnd::MaxTokens,
        "ContentFilterError" => TurnEnd::Refusal,
        "MessageAbortedError" => TurnEnd::Cancelled,
        _ => {
            let status = error.data.get("statusCode").and_then(Value::as_u64).filter(|code| {
                // Already said in the message.
                !message.contains(&code.to_string())
            });
            // Where OpenCode sent the request: the message alone ("Cannot connect to API") names no provider.
            let url = error.data.pointer("/metadata/url").and_then(Value::as_str);
            let message = match (status, url) {
                (Some(code), Some(url)) => format!("{message} (HTTP {code} from {url})"),
                (Some(code), None) => format!("{message} (HTTP {code})"),
                (None, Some(url)) => format!("{message} ({url})"),
                (None, None) => message,
            };
            TurnEnd::Error { message }
        }
    }
}

impl Translator for OpenCodeTranslator {
    fn line(&mut self, line: &str) -> Vec<Output> {
        let Ok(parsed) = serde_json::from_str::<Line>(line) else {
            return vec![unparsed(line)];
        };
        let mut outputs = Vec::new();
        if let (false, Some(id)) = (self.sent_session_id, parsed.session_id.filter(|id| !id.is_empty())) {
            self.sent_session_id = true;
            outputs.push(Output::NativeSessionId { id });
        }
        match parsed.event {
            Event::StepStart {} | Event::Unknown => {}
            Event::Text { part } => outputs.extend(Self::chunk(part, false)),
            Event::Reasoning { part } => outputs.extend(Self::chunk(part, true)),
            Event::ToolUse { part } => outputs.extend(self.tool(part)),
            Event::StepFinish { part } => outputs.extend(self.step_finish(part)),
            Event::Error { error } => outputs.push(Output::End(error_end(error))),
        }
        outputs
    }

    fn finish(&mut self, _: StreamEnd) -> Vec<Output> {
        // Every tool is printed complete, so nothing can be left open.
        Vec::new()
    }
}

#[cfg(test)]
#[path = "translate_tests.rs"]
mod tests;
