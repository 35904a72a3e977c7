//! Pure translation of `opencode serve`'s events into ACP updates, for one turn of one OpenCode session.
//!
//! Unlike `run --format json`, the server streams: text arrives as deltas, a tool goes pending → running →
//! completed or error (a running shell re-sent with its output so far), permissions are asked, and the session
//! says when it is idle. Every event of another session (other clients of the server, subagents' child
//! sessions) is ignored. Titles, kinds, diffs, tool ids, usage and errors are those of [`super::super::translate`].

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, MessageId, SessionUpdate, ToolCallContent, ToolCallLocation, ToolCallStatus,
    ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use serde_json::Value;

use crate::agents::question::{Question, QuestionAsk};

use super::events::{self, Event, MessageInfo, Part, PartDelta, PermissionAsked, Status, TextPart, ToolPart};
use crate::agents::opencode::translate::{
    StepUsage, classify, closing_updates, error_end, finish_end, is_todo_tool, shell_final_output, tool_call_id,
};
use crate::agents::tools::{
    MAX_TOOL_TEXT, ToolStart, abandon_tool, cap, cap_json, diffs_from_patch, fence, finish_tool, one_line,
    plan_from_todos, str_field, terminal_output, text_content, unparsed,
};
use crate::agents::{Output, PermissionAsk, StreamEnd, TranslateContext, Translator, TurnEnd};

/// Translator state for one turn of one OpenCode session on a shared server.
pub struct ServeTranslator {
    context: TranslateContext,
    /// The session this turn prompts (`ses_…`): the only one whose events count.
    session_id: String,
    /// The role of every message seen: `true` for the assistant's.
    assistant: HashMap<String, bool>,
    /// Text and reasoning parts of assistant messages, by part id.
    texts: HashMap<String, TextState>,
    /// Tool cards by id, and their ids in the order they were opened (so `finish` is deterministic).
    tools: HashMap<String, Card>,
    order: Vec<String>,
    /// Usage per model call, and the cut-stream guard, shared with the `run` translator.
    steps: StepUsage,
    /// The end each assistant message reported, and the last end sent: OpenCode re-sends a message many times.
    message_ends: HashMap<String, TurnEnd>,
    last_end: Option<TurnEnd>,
    /// The retry attempt last shown.
    retry: Option<u64>,
    /// Whether the session was seen working in this turn: an idle before that is the previous turn's.
    active: bool,
    /// Whether [`Output::Idle`] was sent.
    idle: bool,
}

/// What was sent of one text or reasoning part.
struct TextState {
    thought: bool,
    message_id: String,
    /// OpenCode marks parts the model must not see; they are not agent output either.
    ignored: bool,
    /// Everything sent so far (deltas, then whatever a `message.part.updated` had beyond them), as its length
    /// and a running hash: a part's text can grow to hundreds of MiB of deltas, and only whether a full text
    /// starts with what was sent matters, so the text itself is not kept.
    sent: Sent,
}

/// The length and hash of a text sent piece by piece.
#[derive(Clone, Default)]
struct Sent {
    len: usize,
    hash: std::collections::hash_map::DefaultHasher,
}

impl Sent {
    fn push(&mut self, text: &str) {
        use std::hash::Hasher;
        // `write` hashes a stream: the same bytes in any pieces give the same hash.
        self.hash.write(text.as_bytes());
        self.len += text.len();
    }

    /// What `text` has beyond what was sent, when it starts with it.
    fn rest_of<'a>(&self, text: &'a str) -> Option<&'a str> {
        use std::hash::Hasher;
        let head = text.get(..self.len)?;
        let mut hash = std::collections::hash_map::DefaultHasher::default();
        hash.write(head.as_bytes());
        (hash.finish() == self.hash.finish()).then(|| &text[self.len..])
    }
}

/// One tool card: what the editor was last told about it.
struct Card {
    title: String,
    kind: ToolKind,
    locations: Vec<ToolCallLocation>,
    content: Vec<ToolCallContent>,
    input: Value,
    /// A shell tool: its output goes to the terminal (or a fence), never into `content` from the input.
    shell: bool,
    /// Reported `in_progress`.
    running: bool,
    /// Output already sent while the tool ran: the terminal's bytes, or the last fenced snapshot.
    streamed: String,
    /// The terminal reached [`MAX_TOOL_TEXT`] and got no more.
    truncated: bool,
    /// A todo tool: the plan shows it, so it has no card unless it fails.
    hidden: bool,
    closed: bool,
}

impl Card {
    fn new(start: &ToolStart, input: &Value, hidden: bool) -> Self {
        Self {
            title: start.title.clone(),
            kind: start.kind,
            locations: start.locations.clone(),
            content: start.content.clone(),
            input: input.clone(),
            shell: start.shell_cwd.is_some(),
            running: false,
            streamed: String::new(),
            truncated: false,
            hidden,
            closed: false,
        }
    }

    /// The fields of `start` (built from the tool's latest state) that differ from what the editor has.
    fn refresh(&mut self, start: &ToolStart, input: &Value) -> ToolCallUpdateFields {
        let mut fields = ToolCallUpdateFields::new();
        if start.title != self.title {
            self.title = start.title.clone();
            fields.title = Some(self.title.clone());
        }
        if start.kind != self.kind {
            self.kind = start.kind;
            fields.kind = Some(self.kind);
        }
        if start.locations != self.locations {
            self.locations = start.locations.clone();
            fields.locations = Some(self.locations.clone());
        }
        // A shell's content is its terminal or its output; replacing it would drop them.
        if !self.shell && !start.content.is_empty() && start.content != self.content {
            self.content = start.content.clone();
            fields.content = Some(self.content.clone());
        }
        if has_input(input) && *input != self.input {
            self.input = input.clone();
            fields.raw_input = Some(cap_json(input.clone()));
        }
        fields
    }
}

/// Whether a tool's input says anything (a pending tool's is `{}` while the model streams it).
fn has_input(input: &Value) -> bool {
    input.as_object().is_some_and(|map| !map.is_empty())
}

/// A tool input as `rawInput`: nothing while it is still empty.
fn raw_input(input: &Value) -> Value {
    if has_input(input) { input.clone() } else { Value::Null }
}

fn update(id: &str, fields: ToolCallUpdateFields) -> SessionUpdate {
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.to_string(), fields))
}

/// Moves every field set in `from` into `into` where `into` leaves it unset.
fn merge(into: &mut ToolCallUpdateFields, from: ToolCallUpdateFields) {
    into.title = into.title.take().or(from.title);
    into.kind = into.kind.take().or(from.kind);
    into.locations = into.locations.take().or(from.locations);
    into.content = into.content.take().or(from.content);
    into.raw_input = into.raw_input.take().or(from.raw_input);
}

fn chunk(thought: bool, message_id: &str, text: String) -> Vec<Output> {
    let chunk = ContentChunk::new(ContentBlock::from(text)).message_id(Some(MessageId::new(message_id.to_string())));
    let update =
        if thought { SessionUpdate::AgentThoughtChunk(chunk) } else { SessionUpdate::AgentMessageChunk(chunk) };
    vec![Output::Update(update)]
}

impl ServeTranslator {
    /// A translator for one turn that prompts OpenCode session `session_id` (`ses_…`).
    pub fn new(context: TranslateContext, session_id: String) -> Self {
        Self {
            context,
            session_id,
            assistant: HashMap::new(),
            texts: HashMap::new(),
            tools: HashMap::new(),
            order: Vec::new(),
            steps: StepUsage::default(),
            message_ends: HashMap::new(),
            last_end: None,
            retry: None,
            active: false,
            idle: false,
        }
    }

    fn message(&mut self, info: MessageInfo) -> Vec<Output> {
        let assistant = info.role == "assistant";
        self.assistant.insert(info.id.clone(), assistant);
        if !assistant {
            // The user's message is our own prompt: never shown, and re-sent after the turn with its summary,
            // so it says nothing about whether this turn started.
            return Vec::new();
        }
        self.active = true;
        // A failed or aborted message says why; a finished one how (`tool-calls` does not end the turn).
        let end = match info.error {
            Some(error) => Some(error_end(error)),
            None => info.finish.as_deref().and_then(finish_end),
        };
        let Some(end) = end else { return Vec::new() };
        if self.message_ends.get(&info.id) == Some(&end) {
            return Vec::new();
        }
        self.message_ends.insert(info.id, end.clone());
        self.end(end)
    }

    /// Reports how the turn ends, unless that is what was reported last.
    fn end(&mut self, end: TurnEnd) -> Vec<Output> {
        if self.last_end.as_ref() == Some(&end) {
            return Vec::new();
        }
        self.last_end = Some(end.clone());
        vec![Output::End(end)]
    }

    fn part(&mut self, part: Part) -> Vec<Output> {
        match part {
            Part::Text(part) => self.text(part, false),
            Part::Reasoning(part) => self.text(part, true),
            Part::Tool(part) => {
                self.active = true;
                self.tool(*part)
            }
            // Usage comes from `step-finish` parts rather than from the assistant's `message.updated`: a part is
            // published once per model call, while OpenCode re-sends a message several times with the same
            // totals (twice per step in the captures), which would count its cost again each time.
            Part::StepFinish(part) => {
                self.active = true;
                self.steps.step(&self.context, &part)
            }
            Part::Other => Vec::new(),
        }
    }

    fn text(&mut self, part: TextPart, thought: bool) -> Vec<Output> {
        // Only the assistant's parts: the user's part is the echo of our own prompt, and a part of a message
        // never seen cannot be told apart from it.
        if self.assistant.get(&part.message_id) != Some(&true) {
            return Vec::new();
        }
        self.active = true;
        let state = self.texts.entry(part.id).or_insert_with(|| TextState {
            thought,
            message_id: part.message_id,
            ignored: false,
            sent: Sent::default(),
        });
        state.thought = thought;
        state.ignored |= part.ignored;
        if state.ignored {
            return Vec::new();
        }
        // The deltas normally sent it all already; send only what they missed (all of it when there were
        // none). OpenCode trims the end of a finished text, so a shorter text is no news either.
        match state.sent.rest_of(&part.text) {
            Some(rest) if !rest.is_empty() => {
                state.sent.push(rest);
                chunk(state.thought, &state.message_id, rest.to_string())
            }
            _ => Vec::new(),
        }
    }

    fn delta(&mut self, delta: PartDelta) -> Vec<Output> {
        if delta.field != "text" || delta.delta.is_empty() {
            return Vec::new();
        }
        // A part not seen yet (or not the assistant's) is skipped: its `message.part.updated` carries the text.
        let Some(state) = self.texts.get_mut(&delta.part_id) else { return Vec::new() };
        if state.ignored {
            return Vec::new();
        }
        self.active = true;
        state.sent.push(&delta.delta);
        chunk(state.thought, &state.message_id, delta.delta)
    }

    fn tool(&mut self, part: ToolPart) -> Vec<Output> {
        let id = tool_call_id(part.call_id.as_deref(), part.id.as_deref(), &part.tool);
        let name = part.tool.to_ascii_lowercase();
        let state = part.state;
        let start = classify(&self.context, &part.tool, &state.input, state.title.as_deref(), &state.metadata);
        let mut outputs = Vec::new();
        if !self.tools.contains_key(&id) {
            let hidden = is_todo_tool(&name);
            let mut card = Card::new(&start, &state.input, hidden);
            if !hidden {
                let status =
                    if state.status == "pending" { ToolCallStatus::Pending } else { ToolCallStatus::InProgress };
                card.running = status == ToolCallStatus::InProgress;
                outputs.push(Output::Update(start.to_call(&self.context, &id, raw_input(&state.input), status)));
            }
            self.tools.insert(id.clone(), card);
            self.order.push(id.clone());
        }
        let Some(card) = self.tools.get_mut(&id) else { return outputs };
        if card.closed {
            return outputs;
        }
        let finished = matches!(state.status.as_str(), "completed" | "error");
        if card.hidden {
            // The plan comes from `todo.updated`; a failing todo tool still gets a card so its error is not lost.
            if !finished {
                return outputs;
            }
            card.closed = true;
            if state.status == "error" {
                outputs.push(Output::Update(start.to_update(&self.context, &id, raw_input(&state.input))));
                let closing = closing_updates(&self.context, &id, &start, &name, &state, None);
                outputs.extend(closing.into_iter().map(Output::Update));
            }
            return outputs;
        }

        let mut fields = card.refresh(&start, &state.input);
        match state.status.as_str() {
            "running" => {
                if !card.running {
                    card.running = true;
                    fields.status = Some(ToolCallStatus::InProgress);
                }
                if fields != ToolCallUpdateFields::new() {
                    outputs.push(Output::Update(update(&id, fields)));
                }
                if card.shell {
                    let output = state.metadata.get("output").and_then(Value::as_str).unwrap_or("");
                    outputs.extend(live_output(&self.context, &id, card, output).map(Output::Update));
                }
            }
            "completed" | "error" => {
                card.closed = true;
                let rest =
                    (card.shell && self.context.terminal_output).then(|| unsent(card, shell_final_output(&state)));
                let mut closing = closing_updates(&self.context, &id, &start, &name, &state, rest);
                // What changed since the last update (a title from the final state, an edit's line) rides on the
                // closing update rather than on one of its own.
                if let Some(SessionUpdate::ToolCallUpdate(last)) = closing.last_mut() {
                    merge(&mut last.fields, fields);
                }
                outputs.extend(closing.into_iter().map(Output::Update));
            }
            // Still pending: the input streams in.
            _ => {
                if fields != ToolCallUpdateFields::new() {
                    outputs.push(Output::Update(update(&id, fields)));
                }
            }
        }
        outputs
    }

    fn status(&mut self, status: Status) -> Vec<Output> {
        match status.kind.as_str() {
            "busy" => {
                self.active = true;
                Vec::new()
            }
            "retry" => {
                self.active = true;
                let attempt = status.attempt.unwrap_or(0);
                if self.retry == Some(attempt) {
                    return Vec::new();
                }
                self.retry = Some(attempt);
                // A visible message rather than a thought: a provider that keeps failing stalls the turn for
                // minutes, and the user needs to see why even after Zed folds the thinking away. It is a
                // message of its own (own id), so it never runs into the model's text.
                let why = one_line(status.message.as_deref().unwrap_or("no reason given"), 300);
                let text = format!("\n\n_OpenCode is retrying (attempt {attempt}): {why}_\n\n");
                chunk(false, &format!("opencode-retry-{}{attempt}", self.context.turn_key), text)
            }
            "idle" => self.went_idle(),
            _ => Vec::new(),
        }
    }

    fn went_idle(&mut self) -> Vec<Output> {
        // `session.status idle` and `session.idle` come together; a leftover idle of the previous turn, before
        // this one was seen working, must not end it.
        if self.idle || !self.active {
            return Vec::new();
        }
        self.idle = true;
        vec![Output::Idle]
    }

    fn permission(&mut self, ask: PermissionAsked) -> Vec<Output> {
        self.active = true;
        let call_id = ask.tool.as_ref().and_then(|tool| tool.call_id.as_deref());
        // The card's id, built as for the tool part (its `callID`); OpenCode's own ACP agent falls back on the
        // request id for a request without a tool.
        let id = tool_call_id(call_id, Some(&ask.id), &ask.permission);
        let mut fields = ToolCallUpdateFields::new();
        let card = self.tools.get_mut(&id).filter(|card| !card.hidden);
        let (title, kind, locations, content) = match &card {
            Some(card) => (card.title.clone(), card.kind, card.locations.clone(), card.content.clone()),
            None => {
                let start = classify(&self.context, &ask.permission, &ask.metadata, None, &ask.metadata);
                let title = permission_title(&self.context, &ask, &start);
                (title, start.kind, start.locations, start.content)
            }
        };
        let title = match guard_reason(&ask) {
            Some(reason) => format!("{title} ({reason})"),
            None => title,
        };
        if let Some(card) = card {
            // The editor now shows this title; the next refresh restores the tool's own.
            card.title = title.clone();
        }
        fields.title = Some(title);
        fields.kind = Some(kind);
        if !locations.is_empty() {
            fields.locations = Some(locations);
        }
        // An edit asks with the unified diff OpenCode computed from the file itself, truer than the card's
        // diff from the tool's input (a write's old content, the context around an edit).
        let diffs = if ask.permission == "edit" { permission_diffs(&self.context, &ask.metadata) } else { Vec::new() };
        let content = if diffs.is_empty() { content } else { diffs };
        if !content.is_empty() {
            fields.content = Some(content);
        }
        vec![Output::Permission(PermissionAsk {
            request_id: ask.id,
            tool_call: ToolCallUpdate::new(id, fields),
            always: ask.always,
            permission: ask.permission,
            patterns: ask.patterns,
        })]
    }
}

/// The part of a shell's final output its terminal has not shown yet.
fn unsent<'a>(card: &Card, output: &'a str) -> &'a str {
    if card.truncated {
        return "";
    }
    output.strip_prefix(card.streamed.as_str()).unwrap_or("")
}

/// What a running shell printed since the last update: only the new bytes for a terminal (up to
/// [`MAX_TOOL_TEXT`] in all), or the whole output so far in a fence.
fn live_output(context: &TranslateContext, id: &str, card: &mut Card, output: &str) -> Option<SessionUpdate> {
    if output.is_empty() || output == card.streamed {
        return None;
    }
    if !context.terminal_output {
        card.streamed = output.to_string();
        let fields = ToolCallUpdateFields::new().content(vec![text_content(fence(&cap(output), "console"))]);
        return Some(update(id, fields));
    }
    // Bytes a terminal has shown cannot be taken back: output that no longer starts with them (OpenCode
    // rewrote it) gets no more live updates; its end still comes with the result when it matches.
    let new = output.strip_prefix(card.streamed.as_str())?;
    if card.truncated {
        return None;
    }
    let room = MAX_TOOL_TEXT.saturating_sub(card.streamed.len());
    if new.len() <= room {
        card.streamed.push_str(new);
        return Some(terminal_output(id, new));
    }
    let mut end = room;
    while !new.is_char_boundary(end) {
        end -= 1;
    }
    card.truncated = true;
    card.streamed.push_str(&new[..end]);
    Some(terminal_output(id, &format!("{}\n… [output truncated]\n", &new[..end])))
}

/// A permission's title when no card shows its tool: what it would run or touch.
fn permission_title(context: &TranslateContext, ask: &PermissionAsked, start: &ToolStart) -> String {
    let patterns = ask.patterns.join("; ");
    match ask.permission.as_str() {
        "bash" if !patterns.is_empty() => one_line(&patterns, 200),
        "edit" => {
            let files = edit_files(&ask.metadata);
            match files.as_slice() {
                [] => start.title.clone(),
                [(path, _)] => format!("Edit {}", context.display_path(path)),
                many => {
                    let shown: Vec<String> = many.iter().map(|(path, _)| context.display_path(path)).collect();
                    format!("Edit {}", shown.join(", "))
                }
            }
        }
        // A bare name ("Read", "glob", an MCP tool) says more with what it applies to.
        _ if !start.title.contains(' ') && !patterns.is_empty() => {
            format!("{} {}", start.title, one_line(&patterns, 200))
        }
        _ => start.title.clone(),
    }
}

/// Why OpenCode asks when the permission is a guard rather than the tool's own.
fn guard_reason(ask: &PermissionAsked) -> Option<String> {
    match ask.permission.as_str() {
        "external_directory" => {
            let dirs = str_field(&ask.metadata, "parentDir").map_or_else(|| ask.patterns.join(", "), str::to_string);
            Some(format!("outside the workspace: {dirs}"))
        }
        "doom_loop" => Some("the same call again".to_string()),
        _ => None,
    }
}

/// The files of an edit permission with their unified diffs: `files[]` (patches: `filePath`, `movePath`,
/// `patch`) or a single `filepath` with `diff`.
fn edit_files(metadata: &Value) -> Vec<(String, Option<String>)> {
    if let Some(files) = metadata.get("files").and_then(Value::as_array) {
        return files
            .iter()
            .filter_map(|file| {
                let path = str_field(file, "movePath").or_else(|| str_field(file, "filePath"))?;
                Some((path.to_string(), str_field(file, "patch").map(str::to_string)))
            })
            .collect();
    }
    let path = str_field(metadata, "filepath").or_else(|| str_field(metadata, "filePath"));
    path.map(|path| (path.to_string(), str_field(metadata, "diff").map(str::to_string))).into_iter().collect()
}

/// The diffs an edit permission carries, one per hunk.
fn permission_diffs(context: &TranslateContext, metadata: &Value) -> Vec<ToolCallContent> {
    edit_files(metadata)
        .into_iter()
        .filter_map(|(path, patch)| Some(diffs_from_patch(context.editor_path(&path), &patch?)))
        .flatten()
        .collect()
}

impl Translator for ServeTranslator {
    fn line(&mut self, line: &str) -> Vec<Output> {
        let Ok(parsed) = events::parse(line) else {
            return vec![unparsed(line)];
        };
        if parsed.session_id.as_deref() != Some(self.session_id.as_str()) {
            return Vec::new();
        }
        match parsed.event {
            Event::MessageUpdated(info) => self.message(info),
            Event::PartUpdated(part) => self.part(part),
            Event::PartDelta(delta) => self.delta(delta),
            Event::Status(status) => self.status(status),
            Event::Idle => self.went_idle(),
            Event::Error(error) => {
                self.active = true;
                let end = error.map_or_else(
                    || TurnEnd::Error { message: "OpenCode failed without saying why".to_string() },
                    error_end,
                );
                self.end(end)
            }
            Event::PermissionAsked(ask) => self.permission(ask),
            Event::QuestionAsked(ask) => {
                self.active = true;
                let call_id = ask.tool.as_ref().and_then(|tool| tool.call_id.as_deref());
                let card = tool_call_id(call_id, Some(&ask.id), "question");
                vec![Output::Question(QuestionAsk {
                    request_id: ask.id,
                    tool_call_id: self.tools.contains_key(&card).then_some(card),
                    questions: ask
                        .questions
                        .into_iter()
                        .map(|question| Question {
                            question: question.question,
                            header: question.header,
                            options: question
                                .options
                                .into_iter()
                                .map(|option| (option.label, option.description))
                                .collect(),
                            multiple: question.multiple,
                            custom: question.custom,
                        })
                        .collect(),
                })]
            }
            Event::TodoUpdated(todos) => plan_from_todos(&todos).map(Output::Update).into_iter().collect(),
            Event::Other => Vec::new(),
        }
    }

    fn finish(&mut self, end: StreamEnd) -> Vec<Output> {
        let mut outputs = Vec::new();
        for id in &self.order {
            let Some(card) = self.tools.get_mut(id) else { continue };
            if card.closed || card.hidden {
                continue;
            }
            card.closed = true;
            let updates = if card.shell && !self.context.terminal_output && !card.streamed.is_empty() {
                // The fence keeps what the shell printed, with the note under it.
                let text = format!("{}\n\n{}", fence(&cap(&card.streamed), "console"), end.note());
                vec![finish_tool(id, ToolCallStatus::Failed, Some(vec![text_content(text)]), None)]
            } else {
                abandon_tool(&self.context, id, card.shell, end.note())
            };
            outputs.extend(updates.into_iter().map(Output::Update));
        }
        outputs
    }
}

#[cfg(test)]
#[path = "translate_tests.rs"]
mod tests;
