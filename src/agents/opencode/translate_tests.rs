//! Edge cases of the OpenCode translator that the recorded fixtures do not cover.

use super::*;
use serde_json::json;

fn context() -> TranslateContext {
    TranslateContext {
        workspace: "/home/me/proj".into(),
        agent_workspace: "/sandbox/ws".into(),
        terminal_output: false,
        context_window: 1000,
        turn_key: String::new(),
    }
}

fn run(lines: &[&str]) -> Vec<Value> {
    let mut translator = OpenCodeTranslator::new(context());
    let mut outputs: Vec<Output> = lines.iter().flat_map(|line| translator.line(line)).collect();
    outputs.extend(translator.finish(crate::agents::StreamEnd::Stopped));
    outputs.into_iter().map(|output| serde_json::to_value(output).unwrap_or_default()).collect()
}

#[test]
fn garbage_is_unparsed_and_never_panics() {
    let long = "x".repeat(5000);
    let out = run(&["not json", "{\"type\":\"text\"}", &long, "[1,2]"]);
    assert_eq!(out.len(), 4);
    assert!(out.iter().all(|output| output["output"] == "unparsed"));
    assert!(out[2]["line"].as_str().unwrap_or_default().len() < 2100);
}

#[test]
fn unknown_event_types_are_ignored() {
    assert_eq!(run(&[r#"{"type":"session_status","status":"idle"}"#]), Vec::<Value>::new());
}

fn tool_line(tool: &str, state: Value) -> String {
    json!({"type": "tool_use", "sessionID": "ses_1", "part": {"type": "tool", "tool": tool, "callID": "c1",
        "id": "prt_1", "messageID": "msg_1", "state": state}})
    .to_string()
}

fn error_line(name: &str, data: Value) -> String {
    json!({"type": "error", "sessionID": "ses_1", "error": {"name": name, "data": data}}).to_string()
}

#[test]
fn native_session_id_is_reported_once() {
    let text = json!({"type": "text", "sessionID": "ses_1", "part": {"messageID": "m", "text": "hi"}}).to_string();
    let out = run(&[&text, &text]);
    let ids: Vec<&Value> = out.iter().filter(|output| output["output"] == "native_session_id").collect();
    assert_eq!(ids, vec![&json!({"output": "native_session_id", "id": "ses_1"})]);
}

#[test]
fn errors_map_by_name_and_never_to_end_turn() {
    let end = |line: String| run(&[&line]).last().cloned().unwrap_or_default();
    assert_eq!(
        end(error_line("ProviderAuthError", json!({"providerID": "x", "message": "bad key"}))),
        json!({"output": "end", "kind": "auth_required", "message": "bad key"})
    );
    assert_eq!(end(error_line("MessageOutputLengthError", json!({})))["kind"], "max_tokens");
    assert_eq!(end(error_line("ContentFilterError", json!({"message": "no"})))["kind"], "refusal");
    assert_eq!(end(error_line("MessageAbortedError", json!({"message": "Aborted"})))["kind"], "cancelled");
    assert_eq!(
        end(error_line("APIError", json!({"message": "Service unavailable", "statusCode": 503})))["message"],
        "Service unavailable (HTTP 503)"
    );
    let unreachable = json!({"message": "Cannot connect to API: Unable to connect. Is the computer able to access the url?",
        "isRetryable": true, "metadata": {"url": "http://127.0.0.1:9/v1/chat/completions"}});
    assert_eq!(
        end(error_line("APIError", unreachable))["message"],
        "Cannot connect to API: Unable to connect. Is the computer able to access the url? \
         (http://127.0.0.1:9/v1/chat/completions)"
    );
    let refused = json!({"message": "Bad Request", "statusCode": 400, "metadata": {"url": "https://api.example/v1"}});
    assert_eq!(end(error_line("APIError", refused))["message"], "Bad Request (HTTP 400 from https://api.example/v1)");
    assert_eq!(end(error_line("ContextOverflowError", json!({"message": "too long"})))["kind"], "error");
    assert_eq!(end(error_line("Weird", Value::Null)), json!({"output": "end", "kind": "error", "message": "Weird"}));
}

#[test]
fn unknown_tool_is_other_titled_by_state_title() {
    let out = run(&[&tool_line(
        "lsp_hover",
        json!({"status": "completed", "input": {"line": 3}, "output": "fn x()",
        "title": "hover src/a.rs:3"}),
    )]);
    assert_eq!(out[1]["title"], "hover src/a.rs:3");
    assert_eq!(out[1]["name"], "lsp_hover");
    assert_eq!(out[1].get("kind"), None);
    assert_eq!(out[2]["status"], "completed");
}

#[test]
fn failed_tool_shows_error_text() {
    let out = run(&[&tool_line(
        "edit",
        json!({"status": "error", "input": {"filePath": "a.txt", "oldString": "x",
        "newString": "y"}, "error": "oldString not found"}),
    )]);
    assert_eq!(out[1]["sessionUpdate"], "tool_call");
    assert_eq!(out[1]["status"], "in_progress");
    assert_eq!(out[2]["status"], "failed");
    assert_eq!(out[2]["content"][0]["content"]["text"], "```\noldString not found\n```");
}

#[test]
fn paths_map_from_the_agent_workspace() {
    let out = run(&[&tool_line(
        "edit",
        json!({"status": "completed", "input": {"filePath": "/sandbox/ws/src/a.rs",
        "oldString": "x", "newString": "y"}, "output": "ok"}),
    )]);
    assert_eq!(out[1]["title"], "Edit src/a.rs");
    assert_eq!(out[1]["locations"][0]["path"], "/home/me/proj/src/a.rs");
    assert_eq!(out[1]["content"][0]["path"], "/home/me/proj/src/a.rs");
    let relative = run(&[&tool_line("read", json!({"status": "completed", "input": {"filePath": "b.rs"}}))]);
    assert_eq!(relative[1]["locations"][0]["path"], "/home/me/proj/b.rs");
}

#[test]
fn terminal_mode_maps_workdir_and_reports_exit() {
    let mut translator = OpenCodeTranslator::new(TranslateContext { terminal_output: true, ..context() });
    let line = tool_line(
        "bash",
        json!({"status": "completed", "input": {"command": "ls", "workdir": "/sandbox/ws/sub"},
        "output": "a\n", "metadata": {"output": "a\n", "exit": 3}}),
    );
    let out: Vec<Value> =
        translator.line(&line).into_iter().map(|output| serde_json::to_value(output).unwrap_or_default()).collect();
    assert_eq!(out[1]["_meta"]["terminal_info"]["cwd"], "/home/me/proj/sub");
    assert_eq!(out[2]["_meta"]["terminal_output"]["data"], "a\n");
    assert_eq!(out[3]["_meta"]["terminal_exit"]["exit_code"], 3);
    assert_eq!(out[3]["status"], "failed");
}

#[test]
fn huge_outputs_are_capped() {
    let big = "z".repeat(crate::agents::tools::MAX_TOOL_TEXT + 1000);
    let out = run(&[&tool_line(
        "bash",
        json!({"status": "completed", "input": {"command": "yes"}, "output": big,
        "metadata": {"output": big, "exit": 0}}),
    )]);
    let text = out[2]["content"][0]["content"]["text"].as_str().unwrap_or_default();
    assert!(text.contains("[truncated 1000 bytes]"));
    // The output is the content; rawOutput does not carry it (nor its copy in `metadata`) a second time.
    assert_eq!(out[2]["rawOutput"], json!({"metadata": {"exit": 0}}));
}

#[test]
fn task_result_is_extracted() {
    assert_eq!(
        task_result("<task id=\"s\" state=\"completed\">\n<task_result>\nDone.\n</task_result>\n</task>"),
        "Done."
    );
    assert_eq!(task_result("<task id=\"s\" state=\"error\">\n<task_error>\nBoom\n</task_error>\n</task>"), "Boom");
    assert_eq!(task_result("plain"), "plain");
}

#[test]
fn zero_token_steps_send_no_usage() {
    let finish = json!({"type": "step_finish", "sessionID": "ses_1", "part": {"reason": "unknown",
        "tokens": {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}, "cost": 0}});
    let out = run(&[&finish.to_string()]);
    assert_eq!(out.len(), 1, "only the session id: {out:?}");
}

#[test]
fn a_loop_of_cut_streams_aborts_once() {
    let cut = json!({"type": "step_finish", "sessionID": "ses_1", "part": {"reason": "unknown",
        "tokens": {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}}})
    .to_string();
    let fine = json!({"type": "step_finish", "sessionID": "ses_1", "part": {"reason": "tool-calls",
        "tokens": {"input": 10, "output": 1, "reasoning": 0, "cache": {"read": 0, "write": 0}}}})
    .to_string();
    let aborts = |lines: &[&str]| run(lines).iter().filter(|output| output["output"] == "abort").count();
    assert_eq!(aborts(&[&cut, &cut, &cut, &cut]), 0);
    assert_eq!(aborts(&[&cut, &cut, &cut, &cut, &fine, &cut]), 0, "a good step resets the count");
    assert_eq!(aborts(&[&cut, &cut, &cut, &cut, &cut, &cut, &cut]), 1);
}

/// OpenCode 1.18's shell result for a command the turn's abort stopped: `completed`, `exit: null`.
fn aborted_shell() -> Value {
    json!({"status": "completed", "input": {"command": "sleep 30"},
        "output": "(no output)\n\n<shell_metadata>\nUser aborted the command\n</shell_metadata>",
        "metadata": {"output": "started\n", "exit": null, "truncated": false}})
}

#[test]
fn a_cancelled_command_fails_with_a_note() {
    let out = run(&[&tool_line("bash", aborted_shell())]);
    assert_eq!(out[2]["status"], "failed");
    assert_eq!(out[2]["content"][0]["content"]["text"], format!("```console\nstarted\n```\n\n{TOOL_CANCELLED}"));
    let mut translator = OpenCodeTranslator::new(TranslateContext { terminal_output: true, ..context() });
    let out: Vec<Value> = translator
        .line(&tool_line("bash", aborted_shell()))
        .into_iter()
        .map(|output| serde_json::to_value(output).unwrap_or_default())
        .collect();
    assert_eq!(out[2]["_meta"]["terminal_output"]["data"], format!("started\n\n{TOOL_CANCELLED}\n"));
    assert_eq!(out[3]["status"], "failed");
}

#[test]
fn a_command_past_its_timeout_fails_with_opencodes_words() {
    let said = "shell tool terminated command after exceeding timeout 100 ms.";
    let out = run(&[&tool_line(
        "bash",
        json!({"status": "completed", "input": {"command": "sleep 30"},
            "output": format!("(no output)\n\n<shell_metadata>\n{said}\n</shell_metadata>"),
            "metadata": {"output": "", "exit": null}}),
    )]);
    assert_eq!(out[2]["status"], "failed");
    assert_eq!(out[2]["content"][0]["content"]["text"], format!("```console\n(no output)\n```\n\n{said}"));
    // An exit code of 0 is still a success; a result without `exit` at all (older OpenCode) too.
    let fine = |metadata: Value| {
        run(&[&tool_line(
            "bash",
            json!({"status": "completed", "input": {"command": "true"}, "output": "",
            "metadata": metadata}),
        )])[2]["status"]
            .clone()
    };
    assert_eq!(fine(json!({"output": "", "exit": 0})), "completed");
    assert_eq!(fine(json!({"output": ""})), "completed");
}

#[test]
fn a_tool_the_abort_interrupted_fails_with_the_cancel_said() {
    let interrupted = |tool: &str, input: Value| {
        run(&[&tool_line(
            tool,
            json!({"status": "error", "input": input, "error": "Tool execution aborted",
                "metadata": {"output": "", "interrupted": true}}),
        )])[2]
            .clone()
    };
    let shell = interrupted("bash", json!({"command": "sleep 30"}));
    assert_eq!(shell["status"], "failed");
    assert_eq!(shell["content"][0]["content"]["text"], TOOL_CANCELLED);
    let fetch = interrupted("webfetch", json!({"url": "https://example.test"}));
    assert_eq!(fetch["status"], "failed");
    assert_eq!(fetch["content"][0]["content"]["text"], TOOL_CANCELLED);
}
