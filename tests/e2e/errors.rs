//! A failing CLI fails only its own prompt, with the CLI's own words; the bridge keeps serving.

use std::time::Duration;

use crate::support::*;

#[test]
fn crashing_cli_fails_the_prompt_with_its_stderr_and_other_sessions_still_complete() {
    let dirs = TestDirs::new("crash");
    let (ws_a, ws_b) = (dirs.workspace("crashing"), dirs.workspace("healthy"));
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let crashing = bridge.new_session(&ws_a);
    let healthy = bridge.new_session(&ws_b);

    let turn = bridge.prompt(&crashing, "SCENARIO:crash please");
    let error = turn.result.expect_err("a CLI that exits 3 must fail the prompt");
    assert!(
        error.full_text().contains("simulated crash: segmentation fault"),
        "the error must carry the CLI's stderr: {error}"
    );

    let other = bridge.prompt(&healthy, "Say hello");
    assert_eq!(other.stop_reason(), "end_turn", "another session on the same bridge must still work");
    let again = bridge.prompt(&crashing, "Say hello");
    assert_eq!(again.stop_reason(), "end_turn", "the crashed session must accept a new prompt");
}

#[test]
fn cli_error_event_fails_the_prompt_with_the_cli_message() {
    let dirs = TestDirs::new("error400");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:error400 make the model refuse");
    let error = turn.result.expect_err("an error event and exit 1 must fail the prompt");
    assert!(
        error.full_text().contains("fake upstream error: model refused (scripted 400)"),
        "the error must carry the CLI's message: {error}"
    );
}

#[test]
fn a_provider_opencode_cannot_reach_is_named_with_its_url_and_what_to_check() {
    let dirs = TestDirs::new("unreachable");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data).arg("--model").arg("local/coder"));
    let sid = bridge.new_session(&ws);
    let error = bridge.prompt(&sid, "SCENARIO:unreachable hello").result.expect_err("the provider cannot be reached");
    assert_eq!(error.code, -32603, "{error}");
    assert_eq!(
        error.message,
        "Cannot connect to API: Unable to connect. Is the computer able to access the url? \
         (http://127.0.0.1:9/v1/chat/completions)\n\nThe model's provider of local/coder could not be reached: check that \
         it is up, that the sandbox's network policy lets it through (`--network`; `acp-sandbox doctor` shows the \
         policy), or pick another model"
    );
}

#[test]
fn a_cli_stuck_re_prompting_after_cut_streams_is_stopped_and_the_session_continues() {
    let dirs = TestDirs::new("loop");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:loop the provider keeps cutting the stream");
    let error = turn.result.expect_err("an endless re-prompt loop must fail the prompt");
    assert!(error.full_text().contains("mid-stream"), "the error must say what happened: {error}");
    let cli = invocations(&ws)[0].pid();
    assert!(wait_until(Duration::from_secs(5), || !pid_alive(cli)), "the looping CLI {cli} was not stopped");
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
}

#[test]
fn a_lost_cli_session_starts_a_fresh_one_from_a_transcript_and_says_so() {
    let dirs = TestDirs::new("lost-session");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    // The sandbox's state (OpenCode's session database) is lost, e.g. deleted by hand.
    std::fs::remove_dir_all(dirs.data.join("sessions").join(&sid)).unwrap();

    let turn = bridge.prompt(&sid, "Do you remember?");
    assert_eq!(turn.stop_reason(), "end_turn", "the turn must still work");
    assert!(
        turn.agent_text().contains("no longer exists") && turn.agent_text().contains("transcript"),
        "the user must be told the conversation was restarted from a transcript: {}",
        turn.agent_text()
    );
    let runs = invocations(&ws);
    let first_session = runs[0].cli_session();
    assert_eq!(runs[1].flag_value("--session"), Some(first_session), "the first try continues the old session");
    assert_eq!(runs[2].flag_value("--session"), None, "the retry starts a fresh one");
    let handed_over = runs[2].stdin_text();
    assert!(
        handed_over.contains("Say hello") && handed_over.contains("Hello from the fake model"),
        "the fresh conversation starts from a transcript of the earlier turns: {handed_over}"
    );
    assert!(handed_over.ends_with("Do you remember?"), "then the new prompt: {handed_over}");
    let third = bridge.prompt(&sid, "And now?");
    assert_eq!(third.stop_reason(), "end_turn");
    assert_eq!(invocations(&ws)[3].flag_value("--session"), Some(runs[2].cli_session()), "then it continues that one");
}

#[test]
fn a_missing_cli_executable_fails_the_prompt_clearly_and_the_bridge_lives() {
    let dirs = TestDirs::new("missing-cli");
    let ws = dirs.workspace("ws");
    let missing = dirs.root().join("no-such-opencode");
    let options = BridgeOptions::new("opencode", &dirs.data).env("ACP_SANDBOX_OPENCODE_BIN", missing.to_str().unwrap());
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let error = bridge.prompt(&sid, "Say hello").result.expect_err("a missing CLI must fail the prompt");
    assert!(error.full_text().contains("no-such-opencode"), "the error must name what is missing: {error}");
    let again = bridge.prompt(&sid, "Say hello").result.expect_err("still missing");
    assert!(!again.message.contains("already running"), "a failed turn must not leave the session busy: {again}");
    assert!(bridge.request("session/list", serde_json::json!({})).is_ok(), "the bridge keeps serving");
}
