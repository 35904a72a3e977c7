//! A failing CLI fails only its own prompt, with the CLI's own words; the bridge keeps serving.

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
