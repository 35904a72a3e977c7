//! Turns against the fake Amp: the command lines of a new and a continued thread, the key check, thinking,
//! error results, and cancellation through Amp's own SIGTERM handler.

use std::time::Duration;

use crate::support::*;

const AMP_TEXT_ANSWER: &str = "Hello! How can I help you today?";
const AMP_CONTINUE_ANSWER: &str = "Yes - you asked me to say hello.";

fn amp_bridge(dirs: &TestDirs) -> Bridge {
    Bridge::start(BridgeOptions::new("amp", &dirs.data))
}

#[test]
fn amp_prompt_streams_the_answer_and_follow_up_continues_the_thread() {
    let dirs = TestDirs::new("amp-turns");
    let ws = dirs.workspace("ws");
    let mut bridge = amp_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let first = bridge.prompt(&sid, "Say hello");
    assert_eq!(first.stop_reason(), "end_turn");
    assert!(first.agent_text().contains(AMP_TEXT_ANSWER), "{:?}", first.updates);
    let second = bridge.prompt(&sid, "Do you remember what I asked first?");
    assert_eq!(second.stop_reason(), "end_turn");
    assert!(second.agent_text().contains(AMP_CONTINUE_ANSWER), "{:?}", second.updates);

    let runs = invocations(&ws);
    assert_eq!(runs.len(), 2);
    let argv = runs[0].argv();
    assert_eq!(argv[0], "-x", "argv: {argv:?}");
    for flag in ["--stream-json", "--dangerously-allow-all", "--no-archive-after-execute"] {
        assert!(runs[0].has_flag(flag), "first turn lacks {flag}: {argv:?}");
    }
    assert_eq!(runs[0].stdin_text(), "Say hello");
    assert_eq!(runs[0].env("AMP_API_KEY").as_deref(), Some(FAKE_AMP_KEY), "Amp needs its key");
    assert_eq!(runs[0].cwd(), ws);

    let argv = runs[1].argv();
    let thread = runs[0].cli_session();
    assert_eq!(&argv[..3], ["threads", "continue", thread.as_str()], "argv: {argv:?}");
    assert!(runs[1].has_flag("-x") && runs[1].has_flag("--stream-json"), "argv: {argv:?}");
    assert_eq!(runs[1].stdin_text(), "Do you remember what I asked first?");
}

#[test]
fn missing_amp_api_key_is_32000_naming_the_variable_and_amp_is_never_started() {
    let dirs = TestDirs::new("amp-nokey");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("amp", &dirs.data).without_env("AMP_API_KEY"));
    let error = match bridge.request("session/new", serde_json::json!({"cwd": ws, "mcpServers": []})) {
        Err(error) => error,
        Ok(new) => {
            let sid = new["sessionId"].as_str().unwrap().to_string();
            bridge.prompt(&sid, "Say hello").result.expect_err("a prompt without AMP_API_KEY must fail")
        }
    };
    assert_eq!(error.code, -32000, "{error}");
    assert!(error.message.contains("AMP_API_KEY"), "the message must name AMP_API_KEY: {error}");
    assert!(invocations(&ws).is_empty(), "Amp was started without a key (it would block on its login prompt)");
}

#[test]
fn amp_thinking_blocks_become_thought_chunks() {
    let dirs = TestDirs::new("amp-thinking");
    let ws = dirs.workspace("ws");
    let mut bridge = amp_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:thinking What is 2+2?");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert!(turn.agent_text().contains("2 + 2 = 4."), "{:?}", turn.updates);
    let thoughts = text_of(&turn.updates, "agent_thought_chunk");
    assert!(thoughts.contains("trivial arithmetic"), "{:?}", turn.updates);
    assert!(invocations(&ws)[0].has_flag("--stream-json-thinking"));
}

#[test]
fn amp_error_result_fails_the_prompt_with_its_message() {
    let dirs = TestDirs::new("amp-error");
    let ws = dirs.workspace("ws");
    let mut bridge = amp_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:error-inference Say hello");
    let error = turn.result.expect_err("an error result must fail the prompt although Amp exits 0");
    assert!(error.full_text().contains("overloaded (529)"), "{error}");
}

#[test]
fn amp_tool_use_streams_tool_calls() {
    let dirs = TestDirs::new("amp-tools");
    let ws = dirs.workspace("ws");
    let mut bridge = amp_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:tools Write hello.txt, cat it with bash, then read it");
    assert_eq!(turn.stop_reason(), "end_turn");
    let tool_calls = turn.updates.iter().filter(|u| u["sessionUpdate"] == "tool_call").count();
    assert_eq!(tool_calls, 3, "{:?}", kinds(&turn.updates));
}

#[test]
fn amp_cancel_answers_cancelled() {
    let dirs = TestDirs::new("amp-cancel");
    let ws = dirs.workspace("ws");
    let mut bridge = amp_bridge(&dirs);
    let sid = bridge.new_session(&ws);
    let id = bridge.send_prompt(&sid, "SCENARIO:cancelled Run the long test suite");
    let _guard = KillOnDrop(wait_invocations(&ws, 1)[0].pid());
    bridge.wait_update(&sid, "the Bash tool call", |u| u["sessionUpdate"] == "tool_call");
    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, id);
    assert_eq!(turn.stop_reason(), "cancelled");
    let cli = invocations(&ws)[0].pid();
    assert!(wait_until(Duration::from_secs(5), || !pid_alive(cli)), "Amp survived the cancel");
}

#[test]
fn amp_mode_chosen_with_set_config_option_reaches_amp() {
    let dirs = TestDirs::new("amp-mode");
    let ws = dirs.workspace("ws");
    let mut bridge = amp_bridge(&dirs);
    let new = bridge.request("session/new", serde_json::json!({"cwd": ws, "mcpServers": []})).unwrap();
    let sid = new["sessionId"].as_str().unwrap().to_string();
    let mode = new["configOptions"]
        .as_array()
        .and_then(|options| options.iter().find(|o| o["category"] == "mode"))
        .unwrap_or_else(|| panic!("no mode config option: {new}"))
        .clone();
    assert!(mode["options"].as_array().unwrap().iter().any(|o| o["value"] == "high"), "{mode}");

    let set = bridge.request(
        "session/set_config_option",
        serde_json::json!({"sessionId": sid, "configId": mode["id"], "value": "high"}),
    );
    let set = set.unwrap_or_else(|e| bridge.fail(&format!("set_config_option: {e}")));
    let current = set["configOptions"].as_array().unwrap().iter().find(|o| o["id"] == mode["id"]).unwrap().clone();
    assert_eq!(current["currentValue"], "high", "{set}");

    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert_eq!(invocations(&ws)[0].flag_value("--mode").as_deref(), Some("high"), "{:?}", invocations(&ws)[0].argv());
}

#[test]
fn amp_gets_the_editors_mcp_servers_as_its_mcp_config_and_takes_no_system_prompt() {
    let dirs = TestDirs::new("amp-mcp");
    let ws = dirs.workspace("ws");
    let mut bridge = amp_bridge(&dirs);
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["mcpCapabilities"], serde_json::json!({"http": true, "sse": true}));
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"].get("systemPrompt"), None, "{init}");
    let servers = serde_json::json!([
        {"name": "files", "command": "/opt/files", "args": ["--root", "/w"], "env": [{"name": "TOKEN", "value": "amp-mcp-secret"}]},
        {"type": "http", "name": "web", "url": "http://127.0.0.1:7001/mcp", "headers": [{"name": "Authorization", "value": "Bearer amp-header-secret"}]}
    ]);
    let new = bridge.request("session/new", serde_json::json!({"cwd": ws, "mcpServers": servers})).unwrap();
    let sid = new["sessionId"].as_str().unwrap().to_string();
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let run = &invocations(&ws)[0];
    let config: serde_json::Value =
        serde_json::from_str(&run.flag_value("--mcp-config").expect("--mcp-config")).unwrap();
    let files = &config["files"];
    assert_eq!(files["command"], "/bin/sh");
    assert_eq!(files["env"], serde_json::json!({"TOKEN": "amp-mcp-secret"}));
    let args: Vec<&str> = files["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!((args[0], &args[2..]), ("-c", &["mcp-files", "/opt/files", "--root", "/w"][..]), "{args:?}");
    assert!(args[1].starts_with("exec env -i ") && args[1].ends_with(r#" TOKEN="$TOKEN" "$@""#), "{args:?}");
    assert_eq!(
        config["web"],
        serde_json::json!({"url": "http://127.0.0.1:7001/mcp", "headers": {"Authorization": "Bearer amp-header-secret"}})
    );
    assert_eq!(config.as_object().unwrap().len(), 2, "{config}");
    let log = bridge.stderr();
    assert!(!log.contains("amp-mcp-secret") && !log.contains("amp-header-secret"), "the log holds a secret");

    // A system prompt is refused: Amp's CLI has no place for one.
    let refused = bridge
        .request(
            "session/new",
            serde_json::json!({"cwd": ws, "mcpServers": [], "systemPrompt": {"mode": "append", "content": [{"type": "text", "text": "x"}]}}),
        )
        .unwrap_err();
    assert_eq!((refused.code, refused.message.as_str()), (-32602, "Amp takes no system prompt here"));

    // Loaded again without servers: the next run gets none.
    bridge.request("session/load", serde_json::json!({"sessionId": sid, "cwd": ws, "mcpServers": []})).unwrap();
    assert_eq!(bridge.prompt(&sid, "Again").stop_reason(), "end_turn");
    assert_eq!(invocations(&ws)[1].flag_value("--mcp-config"), None);
}
