//! Exact outcomes of the `opencode serve` translator's tricky rules, beyond what the goldens show.

use super::*;
use crate::agents::opencode::translate::OpenCodeTranslator;
use serde_json::json;

const SES: &str = "ses_me";

fn context(terminal_output: bool) -> TranslateContext {
    TranslateContext {
        workspace: "/home/me/proj".into(),
        agent_workspace: "/sandbox/ws".into(),
        terminal_output,
        context_window: 1000,
        turn_key: "7-".to_string(),
    }
}

fn run_with(terminal_output: bool, events: &[Value]) -> Vec<Value> {
    let mut translator = ServeTranslator::new(context(terminal_output), SES.to_string());
    let mut outputs: Vec<Output> = events.iter().flat_map(|event| translator.line(&event.to_string())).collect();
    outputs.extend(translator.finish(crate::agents::StreamEnd::Stopped));
    outputs.into_iter().map(|output| serde_json::to_value(output).unwrap_or_default()).collect()
}

fn run(events: &[Value]) -> Vec<Value> {
    run_with(false, events)
}

fn event(kind: &str, properties: Value) -> Value {
    json!({"id": "evt_1", "type": kind, "properties": properties})
}

fn message(id: &str, role: &str) -> Value {
    event("message.updated", json!({"sessionID": SES, "info": {"id": id, "role": role, "sessionID": SES}}))
}

fn finished(id: &str, finish: &str) -> Value {
    event(
        "message.updated",
        json!({"sessionID": SES, "info": {"id": id, "role": "assistant", "sessionID": SES, "finish": finish}}),
    )
}

fn text_part(message: &str, part: &str, kind: &str, text: &str) -> Value {
    event(
        "message.part.updated",
        json!({"sessionID": SES, "part": {"id": part, "messageID": message, "sessionID": SES, "type": kind,
            "text": text}, "time": 1}),
    )
}

fn delta(message: &str, part: &str, text: &str) -> Value {
    event(
        "message.part.delta",
        json!({"sessionID": SES, "messageID": message, "partID": part, "field": "text", "delta": text}),
    )
}

fn tool(call: &str, name: &str, state: Value) -> Value {
    event(
        "message.part.updated",
        json!({"sessionID": SES, "part": {"id": "prt_tool", "messageID": "msg_a", "sessionID": SES, "type": "tool",
            "tool": name, "callID": call, "state": state}, "time": 1}),
    )
}

fn running_bash(output: Option<&str>) -> Value {
    let mut state = json!({"status": "running", "input": {"command": "make"}, "time": {"start": 1}});
    if let Some(output) = output {
        state["metadata"] = json!({"output": output});
    }
    tool("call_1", "bash", state)
}

fn status(kind: Value) -> Value {
    event("session.status", json!({"sessionID": SES, "status": kind}))
}

/// The text of every agent message chunk, in order.
fn texts(out: &[Value]) -> Vec<&str> {
    out.iter()
        .filter(|output| output["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|output| output["content"]["text"].as_str())
        .collect()
}

#[test]
fn terminal_output_carries_only_the_new_bytes() {
    let out = run_with(
        true,
        &[
            message("msg_a", "assistant"),
            tool("call_1", "bash", json!({"status": "pending", "input": {}, "raw": ""})),
            running_bash(None),
            running_bash(Some("")),
            running_bash(Some("one\n")),
            running_bash(Some("one\n")),
            running_bash(Some("one\ntwo\n")),
            tool(
                "call_1",
                "bash",
                json!({"status": "completed", "input": {"command": "make"}, "output": "one\ntwo\nend\n",
                    "metadata": {"output": "one\ntwo\nend\n", "exit": 0}, "title": "make", "time": {"start": 1, "end": 2}}),
            ),
        ],
    );
    let data: Vec<&Value> = out.iter().filter_map(|output| output["_meta"].get("terminal_output")).collect();
    assert_eq!(
        data,
        vec![
            &json!({"terminal_id": "call_1", "data": "one\n"}),
            &json!({"terminal_id": "call_1", "data": "two\n"}),
            &json!({"terminal_id": "call_1", "data": "end\n"}),
        ]
    );
    assert_eq!(out[0]["sessionUpdate"], "tool_call");
    assert_eq!(out[0].get("status"), None, "pending is the default status");
    assert_eq!(out[0]["_meta"]["terminal_info"], json!({"terminal_id": "call_1", "cwd": "/home/me/proj"}));
    assert_eq!(out[1]["status"], "in_progress");
    assert_eq!(out[1]["title"], "make");
    let last = out.last().cloned().unwrap_or_default();
    assert_eq!(last["status"], "completed");
    assert_eq!(last["_meta"]["terminal_exit"]["exit_code"], 0);
    assert_eq!(out.len(), 6, "{out:#?}");
}

#[test]
fn live_terminal_output_stops_at_the_cap() {
    let big = "x".repeat(MAX_TOOL_TEXT + 10);
    let out = run_with(true, &[running_bash(Some(&big)), running_bash(Some(&format!("{big}more")))]);
    let data: Vec<&str> = out.iter().filter_map(|output| output["_meta"]["terminal_output"]["data"].as_str()).collect();
    assert_eq!(data.len(), 2, "one capped chunk, then the note that the tool never finished");
    assert_eq!(data[0].len(), MAX_TOOL_TEXT + "\n… [output truncated]\n".len());
    assert!(data[0].ends_with("\n… [output truncated]\n"));
}

#[test]
fn fenced_live_output_resends_the_whole_output() {
    let out = run(&[running_bash(Some("one\n")), running_bash(Some("one\ntwo\n"))]);
    let fences: Vec<&str> = out
        .iter()
        .filter_map(|output| output["content"][0]["content"]["text"].as_str())
        .filter(|text| text.starts_with("```console"))
        .collect();
    assert_eq!(
        fences,
        vec![
            "```console\none\n```",
            "```console\none\ntwo\n```",
            "```console\none\ntwo\n```\n\nThe agent stopped before this tool finished."
        ]
    );
}

#[test]
fn no_text_is_sent_twice_when_the_final_part_repeats_the_deltas() {
    let out = run(&[
        message("msg_a", "assistant"),
        text_part("msg_a", "prt_1", "text", ""),
        delta("msg_a", "prt_1", "Hello"),
        delta("msg_a", "prt_1", " world"),
        text_part("msg_a", "prt_1", "text", "Hello world"),
        text_part("msg_a", "prt_1", "text", "Hello world"),
    ]);
    assert_eq!(texts(&out), vec!["Hello", " world"]);
    assert_eq!(out[0]["messageId"], "msg_a");
}

#[test]
fn only_the_missing_suffix_is_sent() {
    let out = run(&[
        message("msg_a", "assistant"),
        text_part("msg_a", "prt_1", "text", ""),
        delta("msg_a", "prt_1", "Hel"),
        text_part("msg_a", "prt_1", "text", "Hello"),
        delta("msg_a", "prt_1", " you"),
        text_part("msg_a", "prt_1", "text", "Hello you, all."),
        // A part without deltas at all, and a final text trimmed by OpenCode.
        text_part("msg_a", "prt_2", "text", "Whole."),
        text_part("msg_a", "prt_3", "text", ""),
        delta("msg_a", "prt_3", "Trailing  \n"),
        text_part("msg_a", "prt_3", "text", "Trailing"),
    ]);
    assert_eq!(texts(&out), vec!["Hel", "lo", " you", ", all.", "Whole.", "Trailing  \n"]);
}

#[test]
fn deltas_of_a_part_not_seen_yet_wait_for_its_text() {
    let out = run(&[
        message("msg_a", "assistant"),
        delta("msg_a", "prt_1", "lost "),
        text_part("msg_a", "prt_1", "text", "lost and found"),
        delta("msg_a", "prt_1", "!"),
    ]);
    assert_eq!(texts(&out), vec!["lost and found", "!"]);
}

#[test]
fn reasoning_is_a_thought_and_ignored_parts_are_not_shown() {
    let out = run(&[
        message("msg_a", "assistant"),
        text_part("msg_a", "prt_r", "reasoning", ""),
        delta("msg_a", "prt_r", "hmm"),
        event(
            "message.part.updated",
            json!({"sessionID": SES, "part": {"id": "prt_i", "messageID": "msg_a", "type": "text",
                "text": "hidden", "ignored": true}}),
        ),
        delta("msg_a", "prt_i", " more hidden"),
    ]);
    assert_eq!(
        out,
        vec![json!({"output": "update", "sessionUpdate": "agent_thought_chunk", "messageId": "msg_a",
            "content": {"type": "text", "text": "hmm"}})]
    );
}

#[test]
fn the_users_prompt_echo_is_not_shown() {
    let out = run(&[
        message("msg_u", "user"),
        text_part("msg_u", "prt_u", "text", "my prompt"),
        delta("msg_u", "prt_u", " again"),
        // A part of a message never seen: it cannot be told apart from the prompt.
        text_part("msg_unknown", "prt_x", "text", "who said this?"),
        message("msg_a", "assistant"),
        text_part("msg_a", "prt_a", "text", "answer"),
    ]);
    assert_eq!(texts(&out), vec!["answer"]);
    assert_eq!(out.len(), 1);
}

#[test]
fn events_of_other_sessions_are_ignored() {
    let other = |mut value: Value| {
        value["properties"]["sessionID"] = json!("ses_other");
        value
    };
    let out = run(&[
        other(message("msg_o", "assistant")),
        other(text_part("msg_o", "prt_o", "text", "not ours")),
        other(status(json!({"type": "busy"}))),
        other(status(json!({"type": "retry", "attempt": 1, "message": "x", "next": 1}))),
        other(event("session.error", json!({"error": {"name": "APIError", "data": {"message": "boom"}}}))),
        other(event("session.idle", json!({}))),
        other(event("todo.updated", json!({"todos": [{"content": "a", "status": "pending", "priority": "low"}]}))),
        other(event("permission.asked", json!({"id": "per_o", "permission": "bash", "patterns": ["ls"]}))),
        other(tool("call_o", "bash", json!({"status": "running", "input": {"command": "ls"}}))),
        // No session at all.
        json!({"type": "server.connected", "properties": {}}),
    ]);
    assert_eq!(out, Vec::<Value>::new());
}

#[test]
fn idle_is_sent_once_and_only_after_the_session_worked() {
    let idle = event("session.idle", json!({"sessionID": SES}));
    let idle_status = status(json!({"type": "idle"}));
    // A leftover idle of the previous turn comes before this one's busy.
    let out =
        run(&[idle.clone(), idle_status.clone(), status(json!({"type": "busy"})), idle_status, idle.clone(), idle]);
    assert_eq!(out, vec![json!({"output": "idle"})]);
}

#[test]
fn ends_are_reported_once_and_a_later_repeat_does_not_override_an_error() {
    let error = event(
        "session.error",
        json!({"sessionID": SES, "error": {"name": "UnknownError", "data": {"message": "disk full"}}}),
    );
    let out = run(&[
        message("msg_a", "assistant"),
        finished("msg_a", "tool-calls"),
        finished("msg_b", "stop"),
        finished("msg_b", "stop"),
        error,
        finished("msg_b", "stop"),
        event("session.idle", json!({"sessionID": SES})),
    ]);
    assert_eq!(
        out,
        vec![
            json!({"output": "end", "kind": "end_turn"}),
            json!({"output": "end", "kind": "error", "message": "disk full"}),
            json!({"output": "idle"}),
        ]
    );
}

#[test]
fn errors_map_like_the_run_translator() {
    let end = |error: Value| {
        let out = run(&[event("session.error", json!({"sessionID": SES, "error": error}))]);
        out.first().cloned().unwrap_or_default()
    };
    assert_eq!(
        end(json!({"name": "ProviderAuthError", "data": {"providerID": "openai", "message": "401 bad key"}})),
        json!({"output": "end", "kind": "auth_required", "message": "401 bad key"})
    );
    assert_eq!(end(json!({"name": "MessageAbortedError", "data": {"message": "Aborted"}}))["kind"], "cancelled");
    assert_eq!(end(json!({"name": "MessageOutputLengthError", "data": {}}))["kind"], "max_tokens");
    assert_eq!(
        end(json!({"name": "APIError", "data": {"message": "Overloaded", "statusCode": 529, "isRetryable": true}})),
        json!({"output": "end", "kind": "error", "message": "Overloaded (HTTP 529)"})
    );
    let bare = run(&[event("session.error", json!({"sessionID": SES}))]);
    assert_eq!(bare, vec![json!({"output": "end", "kind": "error", "message": "OpenCode failed without saying why"})]);
}

#[test]
fn a_retry_is_shown_once_per_attempt() {
    let retry =
        |attempt: u64| status(json!({"type": "retry", "attempt": attempt, "message": "Rate limited", "next": 9}));
    let out = run(&[retry(1), retry(1), retry(2), retry(2)]);
    assert_eq!(
        texts(&out),
        vec![
            "\n\n_OpenCode is retrying (attempt 1): Rate limited_\n\n",
            "\n\n_OpenCode is retrying (attempt 2): Rate limited_\n\n"
        ]
    );
    assert_eq!(out[0]["messageId"], "opencode-retry-7-1");
}

#[test]
fn tool_ids_are_the_run_translators() {
    let serve = run(&[tool("call_same", "read", json!({"status": "running", "input": {"filePath": "a.rs"}}))]);
    let line = json!({"type": "tool_use", "sessionID": SES, "part": {"type": "tool", "tool": "read",
        "callID": "call_same", "id": "prt_tool", "state": {"status": "completed", "input": {"filePath": "a.rs"}}}});
    let mut run_translator = OpenCodeTranslator::new(context(false));
    let run_out = serde_json::to_value(run_translator.line(&line.to_string())).unwrap_or_default();
    assert_eq!(serve[0]["toolCallId"], "call_same");
    assert_eq!(run_out[1]["toolCallId"], serve[0]["toolCallId"]);
    assert_eq!(run_out[1]["title"], serve[0]["title"]);
    assert_eq!(run_out[1]["locations"], serve[0]["locations"]);
    assert_eq!(serve[0]["locations"][0]["path"], "/home/me/proj/a.rs");
}

#[test]
fn a_permission_names_the_card_of_its_tool() {
    let out = run(&[
        tool("call_1", "bash", json!({"status": "running", "input": {"command": "cat /etc/hosts"}})),
        event(
            "permission.asked",
            json!({"id": "per_1", "sessionID": SES, "permission": "external_directory", "patterns": ["/etc/*"],
                "metadata": {"filepath": "/etc/hosts", "parentDir": "/etc"}, "always": ["/etc/*"],
                "tool": {"messageID": "msg_a", "callID": "call_1"}}),
        ),
        tool("call_1", "bash", json!({"status": "running", "input": {"command": "cat /etc/hosts"}})),
    ]);
    assert_eq!(
        out[1],
        json!({"output": "permission", "request_id": "per_1", "always": ["/etc/*"], "permission": "external_directory",
            "patterns": ["/etc/*"], "tool_call": {"toolCallId": "call_1", "title": "cat /etc/hosts (outside the workspace: /etc)", "kind": "execute"}})
    );
    // The tool's own title comes back once the permission is answered.
    assert_eq!(out[2]["title"], "cat /etc/hosts");
}

#[test]
fn a_question_names_its_tools_card_and_keeps_its_choices_in_order() {
    let asked = |tool: &str| {
        event(
            "question.asked",
            json!({"id": "que_1", "sessionID": SES, "tool": {"messageID": "msg_a", "callID": tool}, "questions": [
                {"question": "Which colour?", "header": "Colour", "options": [
                    {"label": "Red", "description": "Warm"}, {"label": "Blue", "description": "Cool"}]},
                {"question": "Sizes?", "header": "Sizes", "multiple": true, "custom": false,
                 "options": [{"label": "S", "description": ""}]}]}),
        )
    };
    let out = run(&[tool("call_1", "question", json!({"status": "running", "input": {}})), asked("call_1")]);
    assert_eq!(
        out[1],
        json!({"output": "question", "request_id": "que_1", "tool_call_id": "call_1", "questions": [
            {"question": "Which colour?", "header": "Colour", "options": [["Red", "Warm"], ["Blue", "Cool"]],
             "multiple": false, "custom": true},
            {"question": "Sizes?", "header": "Sizes", "options": [["S", ""]], "multiple": true, "custom": false}]})
    );
    // Without a card the editor knows, the form is tied to no tool call; another session's question is not ours.
    assert_eq!(run(&[asked("call_9")])[0]["tool_call_id"], Value::Null);
    let other = event("question.asked", json!({"id": "que_2", "sessionID": "ses_other", "questions": []}));
    assert_eq!(run(&[other]), Vec::<Value>::new());
}

#[test]
fn a_permission_without_a_card_describes_itself() {
    let out = run(&[
        event(
            "permission.asked",
            json!({"id": "per_1", "sessionID": SES, "permission": "bash", "patterns": ["git status", "git push"],
                "metadata": {}, "always": [], "tool": {"messageID": "msg_a", "callID": "call_9"}}),
        ),
        event(
            "permission.asked",
            json!({"id": "per_2", "sessionID": SES, "permission": "edit", "patterns": ["a.txt"],
                "metadata": {"filepath": "/sandbox/ws/a.txt", "diff": "--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n"},
                "always": ["*"]}),
        ),
    ]);
    assert_eq!(
        out[0]["tool_call"],
        json!({"toolCallId": "call_9", "title": "git status; git push", "kind": "execute"})
    );
    let read = run(&[event(
        "permission.asked",
        json!({"id": "per_3", "sessionID": SES, "permission": "read", "patterns": [".env"], "metadata": {},
            "always": [".env"]}),
    )]);
    assert_eq!(read[0]["tool_call"], json!({"toolCallId": "per_3", "title": "Read .env", "kind": "read"}));
    assert_eq!(
        out[1]["tool_call"],
        json!({"toolCallId": "per_2", "title": "Edit a.txt", "kind": "edit",
            "locations": [{"path": "/home/me/proj/a.txt", "line": 1}],
            "content": [{"type": "diff", "path": "/home/me/proj/a.txt", "oldText": "x\n", "newText": "y\n"}]})
    );
}

#[test]
fn garbage_is_unparsed_and_unknown_events_and_fields_are_tolerated() {
    let mut translator = ServeTranslator::new(context(false), SES.to_string());
    let unparsed: Vec<Value> = [
        "not json",
        "[1,2]",
        "{\"properties\":{}}",
        "{\"type\":\"message.part.delta\",\"properties\":{\"sessionID\":\"ses_me\"}}",
    ]
    .iter()
    .flat_map(|line| translator.line(line))
    .map(|output| serde_json::to_value(output).unwrap_or_default())
    .collect();
    assert_eq!(unparsed.len(), 4);
    assert!(unparsed.iter().all(|output| output["output"] == "unparsed"));
    let tolerated = run(&[
        event("session.next.step.started", json!({"sessionID": SES, "whatever": [1]})),
        event("message.updated", json!({"sessionID": SES, "info": {"id": "msg_a", "role": "assistant", "new": {}}})),
        event(
            "message.part.updated",
            json!({"sessionID": SES, "part": {"id": "prt_p", "messageID": "msg_a", "type": "patch", "hash": "x"}}),
        ),
        event(
            "message.part.updated",
            json!({"sessionID": SES, "future": true, "part": {"id": "prt_t", "messageID": "msg_a", "type": "text",
                "text": "ok", "novel": 1}}),
        ),
    ]);
    assert_eq!(texts(&tolerated), vec!["ok"]);
    assert_eq!(tolerated.len(), 1);
}

#[test]
fn finish_fails_open_tools_and_nothing_else() {
    let out = run(&[
        message("msg_a", "assistant"),
        tool("call_1", "grep", json!({"status": "pending", "input": {}})),
        tool("call_2", "todowrite", json!({"status": "running", "input": {"todos": []}})),
    ]);
    assert_eq!(out.len(), 2, "{out:#?}");
    assert_eq!(out[1]["toolCallId"], "call_1");
    assert_eq!(out[1]["status"], "failed");
}

#[test]
fn usage_is_counted_per_step() {
    let step = |cost: f64| {
        event(
            "message.part.updated",
            json!({"sessionID": SES, "part": {"id": "prt_f", "messageID": "msg_a", "type": "step-finish",
                "reason": "tool-calls", "cost": cost,
                "tokens": {"input": 10, "output": 5, "reasoning": 3, "cache": {"read": 100, "write": 1}}}}),
        )
    };
    let out = run(&[step(0.01), finished("msg_a", "tool-calls"), finished("msg_a", "tool-calls"), step(0.02)]);
    assert_eq!(
        out,
        vec![
            json!({"output": "update", "sessionUpdate": "usage_update", "used": 116, "size": 1000,
                "cost": {"amount": 0.01, "currency": "USD"}}),
            json!({"output": "update", "sessionUpdate": "usage_update", "used": 116, "size": 1000,
                "cost": {"amount": 0.03, "currency": "USD"}}),
        ]
    );
}
