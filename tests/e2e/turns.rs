//! Prompt turns against the fake OpenCode: streamed updates, how the CLI is run (argv, stdin, cwd, environment),
//! follow-ups continuing the CLI session, and one turn at a time per session.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// The answer recorded in `tests/fixtures/opencode/opencode-text.jsonl`.
const TEXT_ANSWER: &str = "Hello from the fake model. This is a plain text answer.";
/// The answer recorded in `tests/fixtures/opencode/opencode-followup.jsonl` (a turn continuing a session).
const FOLLOWUP_ANSWER: &str = "Yes, I remember: this is turn two of the same session.";

fn opencode_bridge(dirs: &TestDirs) -> Bridge {
    Bridge::start(BridgeOptions::new("opencode", &dirs.data))
}

/// Every `tool_call_update` must follow the `tool_call` that introduced its id.
fn assert_tool_updates_follow_their_calls(updates: &[Value]) {
    let mut known = HashSet::new();
    for update in updates {
        match update["sessionUpdate"].as_str() {
            Some("tool_call") => {
                known.insert(update["toolCallId"].as_str().unwrap().to_string());
            }
            Some("tool_call_update") => {
                let id = update["toolCallId"].as_str().unwrap();
                assert!(known.contains(id), "tool_call_update before its tool_call: {update}");
            }
            _ => {}
        }
    }
}

#[test]
fn prompt_streams_the_cli_answer_as_agent_message_chunks_and_ends_the_turn() {
    let dirs = TestDirs::new("text-turn");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert!(turn.agent_text().contains(TEXT_ANSWER), "updates: {:?}", turn.updates);

    let runs = invocations(&ws);
    assert_eq!(runs.len(), 1);
    let argv = runs[0].argv();
    assert_eq!(&argv[..3], ["run", "--format", "json"], "argv: {argv:?}");
    assert!(runs[0].has_flag("--auto"), "argv: {argv:?}");
    assert!(!runs[0].has_flag("--session"), "a new session must not pass --session: {argv:?}");
    assert_eq!(runs[0].stdin_text(), "Say hello");
}

#[test]
fn follow_up_prompt_continues_the_same_cli_session() {
    let dirs = TestDirs::new("follow-up");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let second = bridge.prompt(&sid, "Do you remember?");
    assert_eq!(second.stop_reason(), "end_turn");
    assert!(second.agent_text().contains(FOLLOWUP_ANSWER), "updates: {:?}", second.updates);

    let runs = invocations(&ws);
    assert_eq!(runs.len(), 2);
    let first_cli_session = runs[0].cli_session();
    assert_eq!(
        runs[1].flag_value("--session").as_deref(),
        Some(first_cli_session.as_str()),
        "the 2nd run must continue the CLI session of the 1st: {:?}",
        runs[1].argv()
    );
}

#[test]
fn sessions_of_one_bridge_get_separate_cli_sessions() {
    let dirs = TestDirs::new("two-sessions");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let a = bridge.new_session(&ws);
    let b = bridge.new_session(&ws);
    assert_ne!(a, b);
    assert_eq!(bridge.prompt(&a, "Say hello").stop_reason(), "end_turn");
    let turn_b = bridge.prompt(&b, "Say hello");
    assert_eq!(turn_b.stop_reason(), "end_turn");
    assert!(turn_b.agent_text().contains(TEXT_ANSWER), "session b got a follow-up of a: {:?}", turn_b.updates);
    assert!(!invocations(&ws)[1].has_flag("--session"), "session b must start its own CLI session");
}

#[test]
fn prompt_text_reaches_the_cli_stdin_byte_for_byte() {
    let dirs = TestDirs::new("stdin-bytes");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let text = "$(rm -rf /) ; \"quotes\" 'single' \\ \n\t ü `id` && echo $HOME | cat > /etc/x\r\n\n  trailing  ";
    assert_eq!(bridge.prompt(&sid, text).stop_reason(), "end_turn");
    let runs = invocations(&ws);
    assert_eq!(String::from_utf8_lossy(&runs[0].stdin()), text);
    assert_eq!(runs[0].stdin(), text.as_bytes());
    assert!(!runs[0].argv().iter().any(|a| a.contains("rm -rf")), "the prompt must not be in argv");
}

#[test]
fn text_links_and_resources_reach_stdin_inline_with_context_appended() {
    // Zed sends "fix @a.rs now" as three blocks whose text carries its own spacing, so blocks are joined
    // as they are; embedded file contents follow the request as context.
    let dirs = TestDirs::new("stdin-blocks");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let file = ws.join("a b.rs");
    let id = bridge.send_prompt_blocks(
        &sid,
        vec![
            json!({"type": "text", "text": "fix "}),
            json!({"type": "resource_link", "uri": format!("file://{}", ws.join("a%20b.rs").display()), "name": "a b.rs"}),
            json!({"type": "text", "text": " using "}),
            json!({"type": "resource", "resource": {"uri": format!("file://{}", ws.join("x.rs").display()), "text": "fn x() {}"}}),
        ],
    );
    assert_eq!(bridge.finish_turn(&sid, id).stop_reason(), "end_turn");
    let x = ws.join("x.rs");
    assert_eq!(
        invocations(&ws)[0].stdin_text(),
        format!(
            "fix {} using {}\n\n<context ref=\"{}\">\nfn x() {{}}\n</context>",
            file.display(),
            x.display(),
            x.display()
        )
    );
}

#[test]
fn cli_runs_in_the_workspace_with_a_cleared_environment() {
    let dirs = TestDirs::new("cli-env");
    let ws = dirs.workspace("ws");
    let options = BridgeOptions::new("opencode", &dirs.data).env("ACP_E2E_CANARY", "must-not-leak");
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");

    let run = &invocations(&ws)[0];
    assert_eq!(run.cwd(), ws);
    assert_eq!(run.env("PWD").as_deref().map(Path::new), Some(ws.as_path()), "OpenCode takes its directory from PWD");
    assert_eq!(run.env("TERM").as_deref(), Some("dumb"));
    assert!(run.env("PATH").is_some(), "PATH is on the allow-list");
    assert_eq!(run.env("ACP_E2E_CANARY"), None, "the bridge's environment leaked into the CLI");
    assert_eq!(run.env("ACP_SANDBOX_OPENCODE_BIN"), None, "the bridge's own settings leaked into the CLI");
    let home = run.env("HOME").expect("HOME is set for the CLI");
    assert_ne!(Some(home.clone()), std::env::var("HOME").ok(), "HOME must be the session's state dir");
    assert!(Path::new(&home).is_absolute(), "HOME={home}");
}

#[test]
fn opencode_does_not_receive_the_amp_key() {
    let dirs = TestDirs::new("no-amp-key-for-opencode");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let run = &invocations(&ws)[0];
    assert_eq!(run.env("AMP_API_KEY"), None, "Amp's credential leaked into OpenCode");
}

#[test]
fn model_flag_is_passed_to_the_cli() {
    let dirs = TestDirs::new("model");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data).arg("--model").arg("fake/fake-model"));
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert_eq!(invocations(&ws)[0].flag_value("--model").as_deref(), Some("fake/fake-model"));
}

#[test]
fn tool_use_streams_tool_calls_before_their_updates() {
    let dirs = TestDirs::new("tools");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:tools Write hello.txt, cat it with bash, then read it");
    assert_eq!(turn.stop_reason(), "end_turn");
    let tool_calls = turn.updates.iter().filter(|u| u["sessionUpdate"] == "tool_call").count();
    assert_eq!(tool_calls, 3, "write, bash and read: {:?}", kinds(&turn.updates));
    assert_tool_updates_follow_their_calls(&turn.updates);
    assert!(turn.agent_text().contains("Done"), "the final text is streamed too: {:?}", turn.updates);

    // A new file's diff says `"oldText": null` on the wire, live and replayed (Toad draws an empty card without).
    let new_file =
        json!({"type": "diff", "path": ws.join("hello.txt"), "newText": "hello from fake model\n", "oldText": null});
    let write = |updates: &[Value]| {
        let call = updates.iter().find(|u| u["sessionUpdate"] == "tool_call" && u["kind"] == "edit").cloned();
        call.unwrap_or_else(|| panic!("no edit card: {updates:?}"))["content"].clone()
    };
    assert_eq!(write(&turn.updates), json!([new_file]));
    // The output is the content, once: rawOutput keeps OpenCode's structured result.
    let closed = |kind: &str| {
        let call = turn.updates.iter().find(|u| u["sessionUpdate"] == "tool_call" && u["kind"] == kind).unwrap();
        let id = &call["toolCallId"];
        let update = turn.updates.iter().rfind(|u| u["sessionUpdate"] == "tool_call_update" && u["toolCallId"] == *id);
        update.unwrap().clone()
    };
    let bash = closed("execute");
    assert_eq!(bash["content"][0]["content"]["text"], "```console\nhello from fake model\nbash-ok\n```");
    assert_eq!(bash["rawOutput"], json!({"metadata": {"exit": 0, "truncated": false}}));
    let read = closed("read");
    assert_eq!(read["content"][0]["content"]["text"], "```\nhello from fake model\n```");
    let display = json!({"type": "file", "path": ws.join("hello.txt"), "lineStart": 1, "lineEnd": 1, "totalLines": 1, "truncated": false});
    assert_eq!(read["rawOutput"], json!({"metadata": {"truncated": false, "loaded": [], "display": display}}));
    let loaded = bridge.load_session(&sid, &ws);
    assert_eq!(write(&loaded.updates), json!([new_file]));
}

#[test]
fn todo_list_becomes_a_plan() {
    let dirs = TestDirs::new("todo");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:todo Plan the work");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert!(kinds(&turn.updates).contains(&"plan".to_string()), "{:?}", kinds(&turn.updates));
}

#[test]
fn reasoning_is_streamed_as_thought_chunks_when_thinking_is_on() {
    let dirs = TestDirs::new("reasoning");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:reasoning What is 2+2?");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert!(turn.agent_text().contains("2 + 2 = 4."), "{:?}", turn.updates);
    if invocations(&ws)[0].has_flag("--thinking") {
        let thoughts = text_of(&turn.updates, "agent_thought_chunk");
        assert!(thoughts.contains("Let me think about this."), "{:?}", turn.updates);
    }
}

#[test]
fn non_json_lines_from_the_cli_are_skipped() {
    let dirs = TestDirs::new("garbage");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:garbage Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    // Nothing of the garbage reaches the editor: the CLI's only chunk is exactly the recorded answer.
    let answers: Vec<&str> = turn
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk" && u.get("messageId").is_some())
        .map(|u| u["content"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(answers, [TEXT_ANSWER], "{:?}", turn.updates);
    // Our own notes (no message id: the no-sandbox warning under `--sandbox none`) aside, and the options sent
    // again when the background listing of OpenCode's models ends during the turn.
    let theirs: Vec<Value> = turn
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] != "agent_message_chunk" || u.get("messageId").is_some())
        .filter(|u| u["sessionUpdate"] != "config_option_update")
        .cloned()
        .collect();
    assert_eq!(
        kinds(&theirs),
        ["available_commands_update", "session_info_update", "agent_message_chunk", "usage_update"],
        "the answer and its usage; nothing else"
    );
}

#[test]
fn a_line_longer_than_16_mib_is_cut_with_a_note_and_the_turn_ends_normally() {
    let dirs = TestDirs::new("hugeline");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:hugeline Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    let notes: Vec<&serde_json::Value> = turn
        .updates
        .iter()
        .filter(|u| {
            u["sessionUpdate"] == "agent_message_chunk"
                && u["content"]["text"].as_str().is_some_and(|t| t.contains("MiB"))
        })
        .collect();
    assert_eq!(
        notes,
        vec![&json!({
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "\n\n_A line of OpenCode's output was longer than 16 MiB; it was cut there._\n\n"}
        })]
    );
    // What followed the cut line is read as usual.
    assert!(turn.agent_text().ends_with(TEXT_ANSWER), "{}", turn.agent_text());
    assert_eq!(bridge.prompt(&sid, "Say hello again").stop_reason(), "end_turn", "the bridge must serve on");
}

#[test]
fn second_prompt_during_a_running_turn_gets_a_clear_error() {
    let dirs = TestDirs::new("busy");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let first = bridge.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=200 FAKE_DELAY_MS=100 stream for a while");
    let _guard = KillOnDrop(wait_invocations(&ws, 1)[0].pid());
    bridge.wait_update(&sid, "the first streamed chunk", |u| u["sessionUpdate"] == "agent_message_chunk");

    let second = bridge.send_request(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "SCENARIO:text interrupting"}]}),
    );
    let error = bridge.wait_response(second).expect_err("a 2nd prompt while a turn runs must be rejected");
    assert_eq!(error.code, -32600, "{error}");
    assert_eq!(error.message, "A turn is already running in this session; wait for it to finish or cancel it first");

    bridge.cancel(&sid);
    let first = bridge.finish_turn(&sid, first);
    assert_eq!(first.stop_reason(), "cancelled");
    assert_eq!(invocations(&ws).len(), 1, "the rejected prompt must not start the CLI");
}

#[test]
fn edit_shows_a_diff_of_the_file_in_the_workspace() {
    let dirs = TestDirs::new("edit");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:edit Change hello.txt");
    assert_eq!(turn.stop_reason(), "end_turn");
    let diffs: Vec<&Value> =
        turn.updates.iter().filter_map(|u| u["content"].as_array()).flatten().filter(|c| c["type"] == "diff").collect();
    assert!(!diffs.is_empty(), "no diff content: {:?}", turn.updates);
    let expected = ws.join("hello.txt");
    for diff in diffs {
        assert_eq!(diff["path"].as_str().map(Path::new), Some(expected.as_path()), "{diff}");
        assert!(diff["newText"].as_str().unwrap_or_default().contains("hello EDITED by fake model"), "{diff}");
    }
}

#[test]
fn silent_cli_is_ended_after_the_idle_timeout() {
    let dirs = TestDirs::new("idle");
    let ws = dirs.workspace("ws");
    let options = BridgeOptions::new("opencode", &dirs.data).env("ACP_SANDBOX_IDLE_TIMEOUT", "1");
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:hang say nothing");
    eprintln!("a silent CLI ends the turn with: {:?}", turn.result);
    assert_no_processes_under(&ws, "after the idle timeout");
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn", "the session works afterwards");
}

#[test]
fn opencode_commands_are_offered_and_run_with_their_arguments() {
    let dirs = TestDirs::new("slash-commands");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let update =
        bridge.wait_update(&sid, "available_commands_update", |u| u["sessionUpdate"] == "available_commands_update");
    let names: Vec<&str> =
        update["availableCommands"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    assert!(names.contains(&"init") && names.contains(&"review"), "{update}");

    assert_eq!(bridge.prompt(&sid, "/review branch main").stop_reason(), "end_turn");
    let run = &invocations(&ws)[0];
    assert_eq!(run.flag_value("--command").as_deref(), Some("review"), "{:?}", run.argv());
    assert_eq!(run.stdin_text(), "branch main", "the rest of the prompt is the command's arguments");
    assert_eq!(bridge.prompt(&sid, "/etc/hosts looks wrong").stop_reason(), "end_turn");
    assert!(!invocations(&ws)[1].has_flag("--command"), "a path is not a command");
}

#[test]
fn models_and_variants_of_the_users_opencode_config_are_offered_and_reach_the_cli() {
    let dirs = TestDirs::new("models");
    let ws = dirs.workspace("ws");
    let config = dirs.root().join("xdg-config");
    std::fs::create_dir_all(config.join("opencode")).unwrap();
    std::fs::write(
        config.join("opencode/opencode.json"),
        r#"{"provider": {"fake": {"models": {"fast": {}, "thinker": {"variants": {"high": {}, "low": {}}}}}}}"#,
    )
    .unwrap();
    let options = BridgeOptions::new("opencode", &dirs.data).env("XDG_CONFIG_HOME", config.to_str().unwrap());
    let mut bridge = Bridge::start(options);
    let created = bridge.request("session/new", json!({"cwd": ws, "mcpServers": []})).unwrap();
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let offered: Vec<&str> = created["configOptions"][0]["options"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|option| option["value"].as_str())
        .collect();
    // What `opencode models` lists may come first (it is listed in the background); the configured ones
    // are always there.
    assert_eq!(offered[0], "default", "{created}");
    assert!(offered.contains(&"fake/fast") && offered.contains(&"fake/thinker"), "{created}");

    let set = |bridge: &mut Bridge, id: &str, value: &str| {
        bridge
            .request("session/set_config_option", json!({"sessionId": sid, "configId": id, "value": value}))
            .unwrap_or_else(|e| panic!("set {id}={value}: {e}"))
    };
    let after_model = set(&mut bridge, "model", "fake/thinker");
    assert_eq!(after_model["configOptions"][1]["id"], "variant", "{after_model}");
    set(&mut bridge, "variant", "high");
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let run = &invocations(&ws)[0];
    assert_eq!(run.flag_value("--model").as_deref(), Some("fake/thinker"));
    assert_eq!(run.flag_value("--variant").as_deref(), Some("high"));
    let bad =
        bridge.request("session/set_config_option", json!({"sessionId": sid, "configId": "model", "value": "x/y"}));
    assert!(bad.is_err(), "an unknown model is refused");
}

#[test]
fn session_set_model_sets_the_model_option_for_the_next_run() {
    let dirs = TestDirs::new("set-model");
    let ws = dirs.workspace("ws");
    let config = dirs.root().join("xdg-config");
    std::fs::create_dir_all(config.join("opencode")).unwrap();
    std::fs::write(
        config.join("opencode/opencode.json"),
        r#"{"provider": {"fake": {"models": {"fast": {}, "slow": {}}}}}"#,
    )
    .unwrap();
    let options = BridgeOptions::new("opencode", &dirs.data).env("XDG_CONFIG_HOME", config.to_str().unwrap());
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let set = bridge.request("session/set_model", json!({"sessionId": sid, "modelId": "fake/slow"}));
    assert_eq!(set.unwrap_or_else(|e| bridge.fail(&format!("session/set_model: {e}"))), json!({}));
    // The option says so, to clients that read options, and the next run uses the model.
    let update = bridge.take_updates(&sid).into_iter().rev().find(|u| u["sessionUpdate"] == "config_option_update");
    let update = update.unwrap_or_else(|| bridge.fail("no config_option_update after session/set_model"));
    assert_eq!(update["configOptions"][0]["id"], "model", "{update}");
    assert_eq!(update["configOptions"][0]["currentValue"], "fake/slow", "{update}");
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert_eq!(invocations(&ws)[0].flag_value("--model").as_deref(), Some("fake/slow"));
    // The session's stored option is what a reload shows.
    let loaded = bridge.request("session/resume", json!({"sessionId": sid, "cwd": ws, "mcpServers": []})).unwrap();
    assert_eq!(loaded["configOptions"][0]["currentValue"], "fake/slow", "{loaded}");
    // A model OpenCode does not have, and an unknown session, are refused as the config option refuses them.
    let bad = bridge.request("session/set_model", json!({"sessionId": sid, "modelId": "x/y"}));
    assert_eq!(bad.map_err(|e| e.code), Err(-32602));
    let unknown = bridge.request("session/set_model", json!({"sessionId": "sess_nope", "modelId": "fake/fast"}));
    assert_eq!(unknown.map_err(|e| e.code), Err(-32002));
}

#[test]
fn an_image_reaches_opencode_as_an_attached_file() {
    let dirs = TestDirs::new("image");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["promptCapabilities"]["image"], true, "{init}");
    let sid = bridge.new_session(&ws);
    // "hello" in base64.
    let id = bridge.send_prompt_blocks(
        &sid,
        vec![
            json!({"type": "text", "text": "What is in this picture?"}),
            json!({"type": "image", "mimeType": "image/png", "data": "aGVsbG8="}),
        ],
    );
    assert_eq!(bridge.finish_turn(&sid, id).stop_reason(), "end_turn");
    let run = &invocations(&ws)[0];
    let file = run.flag_value("--file").unwrap_or_else(|| panic!("no --file in {:?}", run.argv()));
    assert!(file.ends_with(".png"), "{file}");
    assert_eq!(std::fs::read(&file).unwrap(), b"hello");
    assert_eq!(run.stdin_text(), "What is in this picture?");
}

#[test]
fn amp_does_not_advertise_images() {
    let dirs = TestDirs::new("amp-image");
    let mut bridge = Bridge::spawn(BridgeOptions::new("amp", &dirs.data));
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["promptCapabilities"]["image"], false, "{init}");
}

#[test]
fn shell_output_uses_zeds_terminal_extension_when_the_client_advertises_it() {
    let dirs = TestDirs::new("terminal-meta");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::spawn(BridgeOptions::new("opencode", &dirs.data));
    bridge
        .request(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {"terminal": true, "_meta": {"terminal_output": true}}}),
        )
        .unwrap();
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:tools write, run and read");
    assert_eq!(turn.stop_reason(), "end_turn");
    let call = turn
        .updates
        .iter()
        .find(|u| u["sessionUpdate"] == "tool_call" && u["kind"] == "execute")
        .unwrap_or_else(|| panic!("no execute card: {:?}", turn.updates));
    let terminal = call["_meta"]["terminal_info"]["terminal_id"].clone();
    assert!(terminal.is_string(), "{call}");
    assert_eq!(call["content"][0]["terminalId"], terminal, "{call}");
    let output: String = turn.updates.iter().filter_map(|u| u["_meta"]["terminal_output"]["data"].as_str()).collect();
    assert!(output.contains("bash-ok"), "the command's output goes to the terminal: {output:?}");
    assert!(
        turn.updates.iter().any(|u| u["_meta"]["terminal_exit"]["exit_code"] == 0),
        "the terminal is closed with the exit code"
    );
}

#[test]
fn the_models_opencode_lists_are_offered_and_the_usage_meter_uses_their_context_window() {
    let dirs = TestDirs::new("models-listed");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    // The bridge runs `opencode models --verbose` in the background when it starts.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (sid, created) = loop {
        let created = bridge.request("session/new", json!({"cwd": ws, "mcpServers": []})).unwrap();
        let listed = created["configOptions"][0]["options"]
            .as_array()
            .unwrap()
            .iter()
            .any(|option| option["value"] == "fake/other-model" && option["name"] == "Other Fake Model");
        if listed {
            break (created["sessionId"].as_str().unwrap().to_string(), created);
        }
        assert!(std::time::Instant::now() < deadline, "the listed models never appeared: {created}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let set = bridge
        .request(
            "session/set_config_option",
            json!({"sessionId": sid, "configId": "model", "value": "fake/fake-model"}),
        )
        .unwrap();
    assert_eq!(set["configOptions"][1]["id"], "variant", "the listed model's variants are offered: {set} {created}");
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    let usage = turn.updates.iter().find(|u| u["sessionUpdate"] == "usage_update").expect("a usage update");
    assert_eq!(usage["size"], 128_000, "the model's own context window: {usage}");
    assert!(dirs.data.join("opencode-models.json").exists(), "the listing is cached for the next start");
}

#[test]
fn sessions_opened_while_opencode_lists_its_models_get_the_listed_models_when_it_is_done() {
    let dirs = TestDirs::new("models-announced");
    let ws = dirs.workspace("ws");
    // `opencode models --verbose` answers only once `release` exists, in the listing's own scratch workspace.
    let release = dirs.data.join("models-workspace/release");
    let mut bridge = Bridge::start(
        BridgeOptions::new("opencode", &dirs.data).env("OPENCODE_FAKE_MODELS_HOLD", &release.display().to_string()),
    );
    assert!(wait_until(RECV_TIMEOUT, || release.with_extension("pid").exists()), "the bridge never listed the models");
    let models = |options: &Value| -> Vec<String> {
        let model = options.as_array().unwrap().iter().find(|option| option["id"] == "model").unwrap();
        model["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|option| option["value"].as_str().unwrap().to_string())
            .collect()
    };
    let created = bridge.request("session/new", json!({"cwd": ws, "mcpServers": []})).unwrap();
    let sid = created["sessionId"].as_str().unwrap().to_string();
    assert_eq!(models(&created["configOptions"]), ["default"], "nothing listed yet: {created}");
    std::fs::write(&release, "").unwrap();
    let update = bridge.wait_update(&sid, "config_option_update", |u| u["sessionUpdate"] == "config_option_update");
    assert_eq!(
        models(&update["configOptions"]),
        ["default", "opencode/big-pickle", "fake/fake-model", "fake/other-model"]
    );
}

#[test]
fn opencode_modes_are_session_modes_and_a_config_option_and_reach_the_cli_as_its_agent() {
    let dirs = TestDirs::new("modes");
    let ws = dirs.workspace("ws");
    let mut bridge = opencode_bridge(&dirs);
    let created = bridge.request("session/new", json!({"cwd": ws, "mcpServers": []})).unwrap();
    let sid = created["sessionId"].as_str().unwrap().to_string();
    assert_eq!(created["modes"]["currentModeId"], "build", "{created}");
    let ids: Vec<&str> =
        created["modes"]["availableModes"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["build", "plan"]);
    let option = created["configOptions"].as_array().unwrap().iter().find(|o| o["category"] == "mode").unwrap();
    assert_eq!(option["id"], "mode");
    assert_eq!(option["currentValue"], "build");

    // The default passes no agent: OpenCode's own default is build.
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert_eq!(invocations(&ws)[0].flag_value("--agent"), None);

    // session/set_mode: the config option follows, and the next turn runs OpenCode's plan agent.
    let set = bridge.request("session/set_mode", json!({"sessionId": sid, "modeId": "plan"}));
    assert_eq!(set, Ok(json!({})));
    let update = bridge.wait_update(&sid, "config_option_update", |u| u["sessionUpdate"] == "config_option_update");
    let mode = update["configOptions"].as_array().unwrap().iter().find(|o| o["id"] == "mode").unwrap().clone();
    assert_eq!(mode["currentValue"], "plan");
    assert_eq!(bridge.prompt(&sid, "Plan it").stop_reason(), "end_turn");
    assert_eq!(invocations(&ws)[1].flag_value("--agent").as_deref(), Some("plan"));

    // The config option: the session mode follows.
    let set =
        bridge.request("session/set_config_option", json!({"sessionId": sid, "configId": "mode", "value": "build"}));
    assert!(set.is_ok(), "{set:?}");
    let update = bridge.wait_update(&sid, "current_mode_update", |u| u["sessionUpdate"] == "current_mode_update");
    assert_eq!(update["currentModeId"], "build");
    let resumed = bridge.request("session/resume", json!({"sessionId": sid, "cwd": ws, "mcpServers": []})).unwrap();
    assert_eq!(resumed["modes"]["currentModeId"], "build", "{resumed}");
    assert!(bridge.request("session/set_mode", json!({"sessionId": sid, "modeId": "yolo"})).is_err());
}

#[test]
fn an_opencode_server_that_cannot_start_makes_the_session_run_opencode_run_and_says_so_once() {
    let dirs = TestDirs::new("serve-fallback");
    let ws = dirs.workspace("ws");
    // The fake has no `serve`: it exits 1 at once, as an OpenCode without a server would.
    let mut bridge =
        Bridge::start(BridgeOptions::new("opencode", &dirs.data).env("ACP_SANDBOX_OPENCODE_BACKEND", "serve"));
    let sid = bridge.new_session(&ws);
    let first = bridge.prompt(&sid, "Say hello");
    assert_eq!(first.stop_reason(), "end_turn", "{:?}", first.result);
    let notes: Vec<&str> = first
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .filter(|text| text.contains("could not start"))
        .collect();
    assert_eq!(notes.len(), 1, "{:#?}", first.updates);
    assert!(
        notes[0].starts_with("\n\n_OpenCode's server could not start here, so this session runs `opencode run` per prompt (no live output): "),
        "{}",
        notes[0]
    );
    assert_eq!(invocations(&ws).last().unwrap().argv()[0], "run");
    let second = bridge.prompt(&sid, "Say hello again");
    assert_eq!(second.stop_reason(), "end_turn");
    assert!(
        !second.updates.iter().any(|u| u["content"]["text"].as_str().is_some_and(|t| t.contains("could not start"))),
        "said once: {:#?}",
        second.updates
    );
}

#[test]
fn with_ask_approvals_an_opencode_server_that_cannot_start_fails_the_prompt_instead_of_running_opencode_run() {
    let dirs = TestDirs::new("serve-no-fallback-under-ask");
    let ws = dirs.workspace("ws");
    let mut bridge =
        Bridge::start(BridgeOptions::new("opencode", &dirs.data).env("ACP_SANDBOX_OPENCODE_BACKEND", "serve"));
    let sid = bridge.new_session(&ws);
    let set =
        bridge.request("session/set_config_option", json!({"sessionId": sid, "configId": "approvals", "value": "ask"}));
    assert!(set.is_ok(), "{set:?}");
    for _ in 0..2 {
        let turn = bridge.prompt(&sid, "Say hello");
        let error = turn.result.expect_err("`run` cannot ask: the prompt must fail");
        assert!(
            error.message.starts_with(
                "OpenCode's server could not start, and `opencode run` cannot ask before a tool runs, so this prompt \
                 was not run (Approvals: Ask): "
            ),
            "{error}"
        );
        assert!(
            invocations(&ws).iter().all(|call| call.argv()[0] != "run"),
            "`opencode run` ran: {:?}",
            invocations(&ws)
        );
    }
}

#[test]
fn an_opencode_2_named_by_opencode_bin_is_refused_naming_its_version_and_the_setting() {
    let dirs = TestDirs::new("opencode-2");
    let ws = dirs.workspace("ws");
    // The warm server chosen in so many words: OpenCode 2 has no such API (unset, the backend would be `acp`).
    let options = BridgeOptions::new("opencode", &dirs.data)
        .env("OPENCODE_FAKE_VERSION", "2.0.23")
        .env("ACP_SANDBOX_OPENCODE_BACKEND", "serve");
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "Say hello");
    let error = turn.result.expect_err("OpenCode 2 must not be driven");
    assert_eq!(error.code, -32603);
    let bin = fakes_dir().join("opencode");
    assert_eq!(
        error.message,
        format!(
            "OpenCode 2.0.23 at {} is a major version acp-sandbox cannot drive yet this way (it supports OpenCode 1.x). Point ACP_SANDBOX_OPENCODE_BIN (--opencode-bin) at a 1.x of OpenCode, or unset it to use the pinned 1.18.33; or drive it through its own ACP server: --opencode-backend acp",
            bin.display()
        )
    );
    assert!(invocations(&ws).is_empty(), "nothing but `--version` ran: {:?}", invocations(&ws));
}

#[test]
fn an_opencode_2_is_driven_through_its_own_acp_server_when_chosen_and_by_default() {
    // The scripted ACP agent stands in for OpenCode 2 (whose ACP server is its stable surface).
    for backend in [Some("acp"), None] {
        let dirs = TestDirs::new(&format!("opencode-2-acp-{}", backend.unwrap_or("unset")));
        let ws = dirs.workspace("ws");
        let mut options = BridgeOptions::new("opencode", &dirs.data)
            .env("OPENCODE_FAKE_VERSION", "2.0.23")
            .env("ACP_SANDBOX_OPENCODE_BIN", &fakes_dir().join("acp_agent.py").display().to_string());
        options.env.retain(|(name, _)| name != "ACP_SANDBOX_OPENCODE_BACKEND");
        if let Some(backend) = backend {
            options = options.env("ACP_SANDBOX_OPENCODE_BACKEND", backend);
        }
        let mut bridge = Bridge::start(options);
        let sid = bridge.new_session(&ws);
        let turn = bridge.prompt(&sid, "SCENARIO:text");
        assert_eq!(turn.stop_reason(), "end_turn", "{backend:?}: {turn:?}");
        assert_eq!(turn.agent_chunks().concat(), "Hello from ACP", "{backend:?}");
    }
}
