//! Edge cases of the Amp translator that the reconstructed fixtures do not cover.

use super::*;
use serde_json::json;

fn context(terminal_output: bool) -> TranslateContext {
    TranslateContext {
        workspace: "/home/me/proj".into(),
        agent_workspace: "/sandbox/ws".into(),
        terminal_output,
        context_window: 1000,
        turn_key: String::new(),
    }
}

fn run_with(terminal_output: bool, lines: &[String]) -> Vec<Value> {
    let mut translator = AmpTranslator::new(context(terminal_output));
    let mut outputs: Vec<Output> = lines.iter().flat_map(|line| translator.line(line)).collect();
    outputs.extend(translator.finish(crate::agents::StreamEnd::Stopped));
    outputs.into_iter().map(|output| serde_json::to_value(output).unwrap_or_default()).collect()
}

fn run(lines: &[String]) -> Vec<Value> {
    run_with(false, lines)
}

fn tool_use(id: &str, name: &str, input: Value) -> String {
    json!({"type": "assistant", "message": {"type": "message", "role": "assistant",
        "content": [{"type": "tool_use", "id": id, "name": name, "input": input}], "stop_reason": "tool_use"}})
    .to_string()
}

fn tool_result(id: &str, content: &str, is_error: bool) -> String {
    json!({"type": "user", "message": {"role": "user",
        "content": [{"type": "tool_result", "tool_use_id": id, "content": content, "is_error": is_error}]}})
    .to_string()
}

fn result_error(error: &str) -> String {
    json!({"type": "result", "subtype": "error_during_execution", "is_error": true, "error": error}).to_string()
}

#[test]
fn garbage_is_unparsed_and_never_panics() {
    let out = run(&["Please log in at https://ampcode.com".into(), "{\"type\":\"assistant\"}".into(), "".into()]);
    assert_eq!(out.len(), 3);
    assert!(out.iter().all(|output| output["output"] == "unparsed"));
}

#[test]
fn echoed_prompt_is_skipped_and_unknown_types_ignored() {
    let echo = json!({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "hi"}]}});
    assert_eq!(run(&[echo.to_string(), r#"{"type":"ping"}"#.into()]), Vec::<Value>::new());
}

#[test]
fn unknown_and_mcp_tools_are_other_with_readable_titles() {
    let out = run(&[
        tool_use("t1", "mcp__github__create_issue", json!({"title": "x"})),
        tool_use("t2", "painter", json!({})),
        tool_result("t1", "done", false),
        tool_result("t2", "", false),
    ]);
    assert_eq!(out[0]["title"], "MCP: github.create_issue");
    assert_eq!(out[0].get("kind"), None, "kind other is the default and omitted");
    assert_eq!(out[1]["title"], "painter");
    assert_eq!(out[2]["status"], "completed");
    assert_eq!(out[2]["content"][0]["content"]["text"], "```\ndone\n```");
    assert_eq!(out[3]["status"], "completed");
    assert_eq!(out[3].get("content"), None);
}

#[test]
fn failed_tool_shows_its_error() {
    let out = run(&[
        tool_use("t1", "edit_file", json!({"path": "/sandbox/ws/a.rs", "old_str": "a", "new_str": "b"})),
        tool_result("t1", "old_str not found in file", true),
    ]);
    assert_eq!(out[1]["status"], "failed");
    assert_eq!(out[1]["content"][0]["content"]["text"], "```\nold_str not found in file\n```");
}

#[test]
fn result_without_tool_use_opens_a_card_first() {
    let out = run(&[tool_result("ghost", "some output", false)]);
    assert_eq!(out[0]["sessionUpdate"], "tool_call");
    assert_eq!(out[0]["toolCallId"], "ghost");
    assert_eq!(out[1]["sessionUpdate"], "tool_call_update");
    assert_eq!(out[1]["status"], "completed");
}

#[test]
fn paths_map_from_the_agent_workspace_to_the_editor() {
    let out = run(&[
        tool_use("t1", "edit_file", json!({"path": "/sandbox/ws/src/a.rs", "old_str": "a", "new_str": "b"})),
        tool_use("t2", "Read", json!({"path": "/etc/hosts", "read_range": [3, 9]})),
        tool_use("t3", "create_file", json!({"path": "notes/new.md", "content": "x"})),
    ]);
    assert_eq!(out[0]["title"], "Edit src/a.rs");
    assert_eq!(out[0]["locations"][0]["path"], "/home/me/proj/src/a.rs");
    assert_eq!(
        out[0]["content"][0],
        json!({"type": "diff", "path": "/home/me/proj/src/a.rs", "oldText": "a", "newText": "b"})
    );
    assert_eq!(out[1]["title"], "Read /etc/hosts (lines 3-9)");
    assert_eq!(out[1]["locations"][0], json!({"path": "/etc/hosts", "line": 3}));
    assert_eq!(out[2]["title"], "Write notes/new.md");
    assert_eq!(out[2]["content"][0]["path"], "/home/me/proj/notes/new.md");
    assert_eq!(out[2]["content"][0].get("oldText"), Some(&Value::Null), "a new file: {}", out[2]);
}

#[test]
fn shell_output_fence_escapes_backticks_and_reports_exit() {
    let output = json!({"output": "a ``` b\n", "exitCode": 2}).to_string();
    let out = run(&[tool_use("t1", "Bash", json!({"cmd": "echo"})), tool_result("t1", &output, false)]);
    assert_eq!(out[1]["status"], "failed");
    assert_eq!(out[1]["content"][0]["content"]["text"], "````console\na ``` b\n````\n\nExited with code 2.");
}

#[test]
fn shell_in_terminal_mode_uses_meta_and_cwd_mapping() {
    let output = json!({"output": "hi\n", "exitCode": 0}).to_string();
    let out = run_with(
        true,
        &[
            tool_use("t1", "Bash", json!({"cmd": "echo hi", "cwd": "/sandbox/ws/sub"})),
            tool_result("t1", &output, false),
        ],
    );
    assert_eq!(out[0]["content"], json!([{"type": "terminal", "terminalId": "t1"}]));
    assert_eq!(out[0]["_meta"]["terminal_info"], json!({"terminal_id": "t1", "cwd": "/home/me/proj/sub"}));
    assert_eq!(out[1]["_meta"]["terminal_output"], json!({"terminal_id": "t1", "data": "hi\n"}));
    assert_eq!(out[2]["_meta"]["terminal_exit"], json!({"terminal_id": "t1", "exit_code": 0, "signal": null}));
    assert_eq!(out[2]["status"], "completed");
}

#[test]
fn huge_outputs_are_capped() {
    let big = "y".repeat(crate::agents::tools::MAX_TOOL_TEXT * 2);
    let out = run(&[tool_use("t1", "Read", json!({"path": "big.txt"})), tool_result("t1", &big, false)]);
    let text = out[1]["content"][0]["content"]["text"].as_str().unwrap_or_default();
    assert!(text.len() < crate::agents::tools::MAX_TOOL_TEXT + 100);
    assert!(text.contains("[truncated"));
    let raw = out[1]["rawOutput"].as_str().unwrap_or_default();
    assert!(raw.len() < crate::agents::tools::MAX_TOOL_TEXT + 100);
}

#[test]
fn open_tools_fail_at_finish() {
    let out = run_with(
        true,
        &[tool_use("t1", "Bash", json!({"cmd": "sleep 9"})), tool_use("t2", "Read", json!({"path": "a"}))],
    );
    let last: Vec<&Value> = out.iter().skip(2).collect();
    assert_eq!(last.len(), 3);
    assert_eq!(last[1]["_meta"]["terminal_exit"]["exit_code"], Value::Null);
    assert_eq!(last[1]["status"], "failed");
    assert_eq!(last[2]["toolCallId"], "t2");
    assert_eq!(last[2]["status"], "failed");
}

#[test]
fn todo_write_is_a_plan_without_a_card() {
    let todos = json!({"todos": [{"id": "1", "content": "a", "status": "in-progress", "priority": "high"},
        {"id": "2", "content": "b", "status": "todo"}]});
    let out = run(&[tool_use("t1", "todo_write", todos), tool_result("t1", "ok", false)]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["sessionUpdate"], "plan");
    assert_eq!(out[0]["entries"][0], json!({"content": "a", "status": "in_progress", "priority": "high"}));
    assert_eq!(out[0]["entries"][1], json!({"content": "b", "status": "pending", "priority": "medium"}));
}

#[test]
fn subagents_are_think_cards_with_their_answer() {
    let out = run(&[
        tool_use("t1", "oracle", json!({"task": "Review the design\nin depth"})),
        tool_result("t1", "Looks **fine**.", false),
    ]);
    assert_eq!(out[0]["kind"], "think");
    assert_eq!(out[0]["title"], "Oracle: Review the design…");
    assert_eq!(out[1]["content"][0]["content"]["text"], "Looks **fine**.");
}

#[test]
fn turn_ends() {
    let end = |lines: &[String]| run(lines).last().cloned().unwrap_or_default();
    assert_eq!(end(&[result_error("User cancelled (SIGINT/SIGTERM)")])["kind"], "cancelled");
    assert_eq!(end(&[result_error("Invalid or missing API key. Run amp login.")])["kind"], "auth_required");
    assert_eq!(end(&[result_error("boom")]), json!({"output": "end", "kind": "error", "message": "boom"}));
    let max_turns = json!({"type": "result", "subtype": "error_max_turns", "is_error": true}).to_string();
    assert_eq!(end(&[max_turns])["kind"], "max_turn_requests");
    let truncated = json!({"type": "assistant", "message": {"content": [{"type": "text", "text": "cut"}],
        "stop_reason": "max_tokens"}})
    .to_string();
    let success = json!({"type": "result", "subtype": "success", "is_error": false, "result": "cut"}).to_string();
    assert_eq!(end(&[truncated, success])["kind"], "max_tokens");
}
