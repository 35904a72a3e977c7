//! The bubblewrap sandbox: the CLI runs in the workspace, can write there, and cannot write elsewhere on the host.
//! Skipped (with the reason printed) where unprivileged bubblewrap does not work.

use crate::support::*;

#[test]
fn bwrap_sandbox_runs_the_cli_in_the_workspace_and_confines_its_writes() {
    if let Err(why) = bwrap_usable() {
        eprintln!("SKIPPED bwrap_sandbox_runs_the_cli_in_the_workspace_and_confines_its_writes: {why}");
        return;
    }
    let dirs = TestDirs::new("bwrap");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data).sandbox("bwrap"));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:probe Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert!(turn.agent_text().contains("Hello from the fake model"), "{:?}", turn.updates);

    let run = &invocations(&ws)[0];
    assert_eq!(run.cwd(), ws, "the workspace appears at the same path inside the sandbox");
    assert_eq!(run.env("PWD").as_deref(), ws.to_str());

    let probe: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ws.join(".fake-cli/probe.json")).unwrap()).unwrap();
    assert_eq!(probe["workspace"]["writable"], true, "{probe:#}");
    assert_eq!(probe["home"]["writable"], true, "HOME is the session's writable state dir: {probe:#}");
    assert_eq!(probe["workspace_parent"]["writable"], false, "writes outside the workspace: {probe:#}");
    let tmp_file = std::path::PathBuf::from(probe["tmp"]["path"].as_str().unwrap());
    let leaked = tmp_file.exists();
    let _ = std::fs::remove_file(&tmp_file);
    assert!(!leaked, "the sandbox's /tmp is the host's /tmp: {probe:#}");

    let next = bridge.prompt(&sid, "Do you remember?");
    assert_eq!(next.stop_reason(), "end_turn");
    assert_eq!(
        invocations(&ws)[1].flag_value("--session"),
        Some(run.cli_session()),
        "the follow-up continues the CLI session inside the sandbox"
    );
}
