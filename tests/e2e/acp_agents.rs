//! `--agent custom`: an agent that speaks ACP itself (`tests/fakes/acp_agent.py`, scripted and hostile where its
//! prompt says so) runs in the session's sandbox with the bridge as its client. Its answer streams through, its
//! session survives a killed bridge, what it asks of its client stays inside the workspace, its permission request
//! reaches the editor, a cancel it ignores kills it, and a crash is an error naming it.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

/// The bridge running the fake ACP agent, with a HOME of the test's own holding a key.
fn options(dirs: &TestDirs) -> BridgeOptions {
    let home = dirs.root().join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "SECRET-KEY-MATERIAL\n").unwrap();
    std::fs::write(home.join(".bashrc"), "# the user's\n").unwrap();
    BridgeOptions::new("custom", &dirs.data)
        .arg("--agent-command")
        .arg(&fakes_dir().join("acp_agent.py").display().to_string())
        .env("HOME", &home.display().to_string())
}

/// The fake's one-line answer to a scenario.
fn answer(bridge: &mut Bridge, sid: &str, scenario: &str) -> String {
    let turn = bridge.prompt(sid, &format!("SCENARIO:{scenario}"));
    assert_eq!(turn.stop_reason(), "end_turn", "{turn:?}");
    said(&turn.updates)
}

/// The agent's text, without the bridge's own notes (`--sandbox none` says it runs without one).
fn said(updates: &[Value]) -> String {
    let chunks = updates.iter().filter(|u| u["sessionUpdate"] == "agent_message_chunk");
    let texts = chunks.filter_map(|u| u["content"]["text"].as_str());
    texts.filter(|text| !text.trim().starts_with('_')).collect::<String>().trim().to_string()
}

/// A refusal as the fake prints the error it got (Python's JSON separators).
fn refused(message: String) -> String {
    format!("{{\"code\": -32602, \"message\": {}}}", serde_json::to_string(&message).unwrap())
}

/// Whether no text the editor got holds the user's key.
fn no_secret(updates: &[Value]) -> bool {
    !updates.iter().any(|update| update.to_string().contains("SECRET-KEY-MATERIAL"))
}

#[test]
fn an_acp_agent_streams_its_answer_and_its_session_continues_after_a_killed_bridge() {
    let dirs = TestDirs::new("acp-stream");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:text");
    assert_eq!(turn.stop_reason(), "end_turn");
    let chunks: Vec<&str> = turn
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .filter(|text| !text.trim().starts_with('_'))
        .collect();
    assert_eq!(chunks, ["Hello", " from", " ACP"]);
    let after = answer(&mut bridge, &sid, "history");
    assert_eq!(after, r#"history ["SCENARIO:text"]"#, "{}", bridge.stderr());
    bridge.kill9();

    // A new bridge replays our store, not the agent's own replay, and the agent loads its session again.
    let mut bridge = Bridge::start(options(&dirs));
    let loaded = bridge.load_session(&sid, &ws);
    assert!(loaded.result.is_ok(), "{:?}", loaded.result);
    assert_eq!(text_of(&loaded.updates, "user_message_chunk"), "SCENARIO:textSCENARIO:history");
    assert!(!text_of(&loaded.updates, "agent_message_chunk").contains("REPLAYED"), "{:?}", loaded.updates);
    assert_eq!(
        answer(&mut bridge, &sid, "history"),
        r#"history ["SCENARIO:text", "SCENARIO:history"]"#,
        "the follow-up reached the agent's earlier conversation"
    );
}

#[test]
fn what_the_agent_asks_of_its_client_stays_inside_the_workspace() {
    let dirs = TestDirs::new("acp-files");
    let ws = dirs.workspace("ws");
    let home = dirs.root().join("home");
    std::fs::write(ws.join("notes.txt"), "one\ntwo\n").unwrap();
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::os::unix::fs::symlink(home.join(".ssh/id_ed25519"), ws.join("key")).unwrap();
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    let mut seen = Vec::new();
    let mut ask = |bridge: &mut Bridge, scenario: String| {
        let turn = bridge.prompt(&sid, &format!("SCENARIO:{scenario}"));
        assert_eq!(turn.stop_reason(), "end_turn", "{turn:?}");
        seen.extend(turn.updates.clone());
        said(&turn.updates)
    };

    assert_eq!(ask(&mut bridge, format!("read:{}", ws.join("notes.txt").display())), "read ok one\ntwo");
    let secret = home.join(".ssh/id_ed25519");
    assert_eq!(
        ask(&mut bridge, format!("read:{}", secret.display())),
        format!(
            "read error {}",
            refused(format!(
                "{} is outside the workspace: the agent's files are {}",
                secret.display(),
                ws.display()
            ))
        )
    );
    let real_secret = std::fs::canonicalize(&secret).unwrap();
    let real_ws = std::fs::canonicalize(&ws).unwrap();
    assert_eq!(
        ask(&mut bridge, format!("read:{}", ws.join("key").display())),
        format!(
            "read error {}",
            refused(format!(
                "{} leads to {}: {} is outside the workspace: the agent's files are {}",
                ws.join("key").display(),
                real_secret.display(),
                real_secret.display(),
                real_ws.display()
            ))
        )
    );
    let bashrc = home.join(".bashrc");
    assert_eq!(
        ask(&mut bridge, format!("write:{}", bashrc.display())),
        format!(
            "write error {}",
            refused(format!("{} is outside the workspace: the agent's files are {}", bashrc.display(), ws.display()))
        )
    );
    let hook = ws.join(".git/hooks/pre-commit");
    assert_eq!(
        ask(&mut bridge, format!("write:{}", hook.display())),
        format!(
            "write error {}",
            refused(format!(
                "{} is protected (.git/hooks in {}): programs on your machine run or trust it, so the agent may not \
                 write it",
                hook.display(),
                ws.display()
            ))
        )
    );
    assert_eq!(ask(&mut bridge, format!("write:{}", ws.join("out/made.txt").display())), "write ok");

    assert_eq!(std::fs::read_to_string(ws.join("out/made.txt")).unwrap(), "written by the agent");
    assert_eq!(std::fs::read_to_string(&bashrc).unwrap(), "# the user's\n");
    assert!(!hook.exists(), "the hook was written");
    assert!(no_secret(&seen), "the key reached the editor");
}

#[test]
fn under_bubblewrap_the_agents_own_shell_cannot_read_the_users_key() {
    if let Err(why) = bwrap_usable() {
        // A security test that cannot run fails, unless the person running it says bubblewrap is not there.
        assert!(std::env::var("ACP_SANDBOX_SKIP_BWRAP").is_ok_and(|v| v == "1"), "bubblewrap does not work here: {why}");
        eprintln!("SKIPPED under_bubblewrap_the_agents_own_shell_cannot_read_the_users_key: {why}");
        return;
    }
    let dirs = TestDirs::new("acp-shell");
    let ws = dirs.workspace("ws");
    let home = dirs.root().join("home");
    let mut bridge = Bridge::start(options(&dirs).sandbox("bwrap"));
    let sid = bridge.new_session(&ws);
    let key = home.join(".ssh/id_ed25519");
    let said = answer(&mut bridge, &sid, &format!("shell:cat {} 2>/dev/null; echo done", key.display()));
    assert_eq!(said, "shell 0 done", "the agent's shell read the key");
    let said = answer(&mut bridge, &sid, &format!("shell:echo hi > {}/.bashrc 2>/dev/null; echo $?", home.display()));
    assert_ne!(said, "shell 0 0", "the agent's shell wrote the user's .bashrc");
    assert_eq!(std::fs::read_to_string(home.join(".bashrc")).unwrap(), "# the user's\n");
    assert_eq!(answer(&mut bridge, &sid, "shell:echo made > made.txt && cat made.txt"), "shell 0 made");
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap(), "made\n");
}

#[test]
fn its_permission_request_reaches_the_editor_and_the_answer_reaches_it() {
    let dirs = TestDirs::new("acp-permission");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    bridge.permission_answer = Some("reject_once".into());
    assert_eq!(answer(&mut bridge, &sid, "permission"), "permission no");
    bridge.permission_answer = Some("allow_once".into());
    assert_eq!(answer(&mut bridge, &sid, "permission"), "permission yes");
    bridge.permission_answer = None;
    assert_eq!(answer(&mut bridge, &sid, "permission"), "permission cancelled");
    assert_eq!(bridge.permission_requests.len(), 3);
    let asked = &bridge.permission_requests[0];
    assert_eq!(asked["sessionId"], sid.as_str(), "asked in our session, not the agent's: {asked}");
    assert_eq!(asked["toolCall"]["title"], "Delete everything");
    assert_eq!(
        asked["options"],
        json!([
            {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
            {"optionId": "no", "name": "Reject", "kind": "reject_once"},
        ])
    );
}

/// The fake agent's processes running in `ws`.
fn agents_in(ws: &Path) -> Vec<i32> {
    processes_under(ws).into_iter().filter(|(_, cmdline)| cmdline.contains("acp_agent.py")).map(|(pid, _)| pid).collect()
}

#[test]
fn a_cancel_the_agent_ignores_kills_it_and_the_next_prompt_starts_it_again() {
    let dirs = TestDirs::new("acp-cancel");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    let first = answer(&mut bridge, &sid, "whoami");

    // An agent that answers the cancel keeps running.
    let id = bridge.send_prompt(&sid, "SCENARIO:sleep");
    bridge.wait_update(&sid, "sleeping", |u| u["content"]["text"] == "sleeping\n");
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, id).stop_reason(), "cancelled");
    assert_eq!(answer(&mut bridge, &sid, "whoami"), first, "the same agent answers after a cancel it answered");

    // One that ignores it is killed with everything it started.
    let id = bridge.send_prompt(&sid, "SCENARIO:hang");
    bridge.wait_update(&sid, "hanging", |u| u["content"]["text"] == "hanging\n");
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, id).stop_reason(), "cancelled");
    assert!(wait_until(Duration::from_secs(10), || agents_in(&ws).is_empty()), "left running: {:?}", agents_in(&ws));
    let next = answer(&mut bridge, &sid, "whoami");
    assert_ne!(next, first, "a fresh agent serves the next prompt");
    // The turn the agent was killed in is not in its conversation; the others are.
    assert_eq!(
        answer(&mut bridge, &sid, "history"),
        r#"history ["SCENARIO:whoami", "SCENARIO:sleep", "SCENARIO:whoami", "SCENARIO:whoami"]"#
    );
}

#[test]
fn a_crash_mid_turn_is_an_error_that_names_it_and_the_next_prompt_works() {
    let dirs = TestDirs::new("acp-crash");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    assert_eq!(answer(&mut bridge, &sid, "text"), "Hello from ACP");
    let turn = bridge.prompt(&sid, "SCENARIO:crash");
    let error = turn.result.expect_err("a crash fails the turn");
    assert_eq!(
        error.message,
        "The ACP agent stopped in the middle of the turn (it exited with exit code 3)\n\nstderr:\nfake agent crashed"
    );
    assert_eq!(said(&turn.updates), "about to crash", "what it said first was kept");
    let after = answer(&mut bridge, &sid, "history");
    assert_eq!(after, r#"history ["SCENARIO:text"]"#, "{}", bridge.stderr());
}

#[test]
fn the_editors_mcp_servers_reach_the_agents_session() {
    let dirs = TestDirs::new("acp-mcp");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let servers = json!([{"name": "probe", "command": "/bin/echo", "args": ["x"], "env": [{"name": "TOKEN", "value": "t0ken"}]}]);
    let made = bridge.request("session/new", json!({"cwd": ws, "mcpServers": servers})).unwrap();
    let sid = made["sessionId"].as_str().unwrap().to_string();
    assert_eq!(answer(&mut bridge, &sid, "mcp"), r#"mcp [{"name": "probe", "command": "/bin/echo", "url": null}]"#);
}

#[test]
fn a_tool_the_agent_left_open_is_closed_with_the_turn() {
    let dirs = TestDirs::new("acp-open-tool");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:tool");
    assert_eq!(turn.stop_reason(), "end_turn");
    let tools: Vec<&Value> = turn.updates.iter().filter(|u| u["toolCallId"] == "t-open").collect();
    assert_eq!(tools.len(), 2, "{tools:?}");
    assert_eq!(tools[0]["locations"], json!([{"path": ws.join("src/main.rs")}]));
    assert_eq!(tools[1]["status"], "failed");
}

#[test]
fn an_agent_that_never_answers_initialize_is_an_error_and_the_bridge_goes_on() {
    let dirs = TestDirs::new("acp-hang-init");
    let ws = dirs.workspace("ws");
    let mut bridge =
        Bridge::start(options(&dirs).arg("--pass-env").arg("FAKE_ACP_HANG_INIT").env("FAKE_ACP_HANG_INIT", "1"));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:text");
    let error = turn.result.expect_err("no agent, no turn");
    assert_eq!(error.message, "The ACP agent could not be started: it did not answer initialize within 10 s");
    let listed = bridge.request("session/list", json!({})).unwrap();
    assert_eq!(listed["sessions"].as_array().map(Vec::len), Some(1), "the bridge still answers");
}

#[test]
fn the_custom_agent_needs_its_command_line() {
    let dirs = TestDirs::new("acp-no-command");
    let output = BridgeOptions::new("custom", &dirs.data).command().env("RUST_BACKTRACE", "0").output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(output.stdout, b"", "stdout is the protocol's");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        "Error: --agent custom runs the ACP agent that --agent-command (ACP_SANDBOX_AGENT_COMMAND) names: set it, \
         e.g. --agent-command 'my-agent --acp'"
    );
}
