//! `--agent custom`: an agent that speaks ACP itself (`tests/fakes/acp_agent.py`, scripted and hostile where its
//! prompt says so) runs in the session's sandbox with the bridge as its client. Its answer streams through, its
//! session survives a killed bridge, what it asks of its client stays inside the workspace, its permission request
//! reaches the editor, a cancel it ignores kills it, and a crash is an error naming it.

use std::path::{Path, PathBuf};
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
    assert_eq!(turn.agent_chunks(), ["Hello", " from", " ACP"]);
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
            refused(format!("{} is outside the workspace: the agent's files are {}", secret.display(), ws.display()))
        )
    );
    // A link is never followed, and its target never named.
    assert_eq!(
        ask(&mut bridge, format!("read:{}", ws.join("key").display())),
        format!(
            "read error {}",
            refused(format!(
                "{} is not a regular file, or a folder on its way is a link (links are never followed)",
                ws.join("key").display()
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
    // Its terminals are the bridge's, in its sandbox, and start only inside the workspace.
    assert_eq!(
        ask(&mut bridge, format!("terminal-at:{}", home.display())),
        format!(
            "terminal error {}",
            refused(format!("{} is outside the workspace: the agent's files are {}", home.display(), ws.display()))
        )
    );

    assert_eq!(std::fs::read_to_string(ws.join("out/made.txt")).unwrap(), "written by the agent");
    assert_eq!(std::fs::read_to_string(&bashrc).unwrap(), "# the user's\n");
    assert!(!hook.exists(), "the hook was written");
    assert!(no_secret(&seen), "the key reached the editor");
}

#[test]
fn under_bubblewrap_the_agents_own_shell_cannot_read_the_users_key() {
    if let Err(why) = bwrap_usable() {
        // A security test that cannot run fails, unless the person running it says bubblewrap is not there.
        assert!(
            std::env::var("ACP_SANDBOX_SKIP_BWRAP").is_ok_and(|v| v == "1"),
            "bubblewrap does not work here: {why}"
        );
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
    // Its terminals run in the same sandbox.
    assert_eq!(
        answer(&mut bridge, &sid, &format!("terminal:cat {} 2>/dev/null; echo done", key.display())),
        "terminal 0 done\nafter release \"no terminal term-1 in this session\""
    );
    let said =
        answer(&mut bridge, &sid, &format!("terminal:echo hi > {}/.bashrc 2>/dev/null; echo $?", home.display()));
    assert_ne!(said.lines().next(), Some("terminal 0 0"), "the agent's terminal wrote the user's .bashrc");
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap(), "made\n");
}

#[test]
fn its_terminals_run_in_its_sandbox_and_their_output_is_shown_in_its_tool_call_as_it_grows() {
    let dirs = TestDirs::new("acp-terminal");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:terminal:echo one; sleep 1; echo two >&2; echo made > made.txt; exit 3");
    assert_eq!(turn.stop_reason(), "end_turn", "{turn:?}");
    assert_eq!(said(&turn.updates), "terminal 3 one\ntwo\nafter release \"no terminal term-1 in this session\"");
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap(), "made\n", "it ran in the workspace");
    // The editor has no terminal of that id: the call shows its output instead, as it grows.
    let shown: Vec<Vec<String>> = turn
        .updates
        .iter()
        .filter(|u| u["toolCallId"] == "term-call")
        .map(|u| {
            u["content"].as_array().unwrap().iter().map(|c| c["content"]["text"].as_str().unwrap().into()).collect()
        })
        .collect();
    assert!(shown.iter().all(|content| content[0] == "running:"), "{shown:?}");
    assert!(shown.iter().any(|content| content[1] == "```console\none\n```"), "no update while it ran: {shown:?}");
    assert_eq!(shown.last().unwrap()[1], "```console\none\ntwo\n```\n\nexit code 3");
    let statuses: Vec<&Value> =
        turn.updates.iter().filter(|u| u["toolCallId"] == "term-call").map(|u| &u["status"]).collect();
    assert_eq!(statuses.first().unwrap().as_str(), Some("in_progress"));
    assert!(statuses.iter().any(|status| status.as_str() == Some("completed")), "{statuses:?}");

    // A kill ends its command (and nothing of it is left), and says how it ended.
    let killed = answer(&mut bridge, &sid, "terminal-kill");
    assert_eq!(
        killed,
        r#"terminal-kill {"signal": "SIGKILL"} {"output": "", "truncated": false, "exitStatus": {"signal": "SIGKILL"}}"#
    );
    assert!(
        wait_until(Duration::from_secs(5), || !processes_under(&ws).iter().any(|(_, cmd)| cmd.contains("sleep 30"))),
        "left running: {:?}",
        processes_under(&ws)
    );
}

#[test]
fn stop_ends_the_terminals_the_stopped_turn_started_and_their_daemons_but_not_the_agent() {
    let dirs = TestDirs::new("acp-terminal-stop");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    let first = answer(&mut bridge, &sid, "whoami");
    let sleepers = |ws: &Path| -> Vec<(i32, String)> {
        processes_under(ws).into_iter().filter(|(_, cmd)| cmd.starts_with("sleep 317")).collect()
    };
    let id = bridge.send_prompt(&sid, "SCENARIO:terminal-sleep");
    bridge.wait_update(&sid, "sleeping", |u| u["content"]["text"] == "sleeping\n");
    assert!(wait_until(Duration::from_secs(5), || sleepers(&ws).len() == 2), "not started: {:?}", sleepers(&ws));
    // The agent answers the cancel at once and leaves its terminal as it is: the bridge ends it, daemon and all.
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, id).stop_reason(), "cancelled");
    assert!(wait_until(Duration::from_secs(5), || sleepers(&ws).is_empty()), "left running: {:?}", sleepers(&ws));
    assert_eq!(answer(&mut bridge, &sid, "whoami"), first, "the agent itself still runs");
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

#[test]
fn its_forms_reach_the_editor_and_the_answers_reach_it() {
    let dirs = TestDirs::new("acp-form");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::spawn(options(&dirs));
    bridge.elicitation_answer = Some(json!({"action": "accept", "content": {"name": "Ada"}}));
    bridge.initialize();
    let sid = bridge.new_session(&ws);
    assert_eq!(answer(&mut bridge, &sid, "form"), r#"form {"action": "accept", "content": {"name": "Ada"}}"#);
    assert_eq!(bridge.elicitations.len(), 1);
    let asked = &bridge.elicitations[0];
    assert_eq!(asked["sessionId"], sid.as_str(), "asked in our session, not the agent's: {asked}");
    assert_eq!(asked["message"], "Who are you?");
    bridge.elicitation_answer = Some(json!({"action": "decline"}));
    assert_eq!(answer(&mut bridge, &sid, "form"), r#"form {"action": "decline"}"#);
}

#[test]
fn a_form_and_a_permission_an_agent_leaves_open_when_it_exits_are_withdrawn_in_the_editor() {
    let dirs = TestDirs::new("acp-withdraw");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::spawn(options(&dirs));
    // The user answers neither.
    bridge.elicitation_answer = Some(Value::Null);
    bridge.hold_permissions = true;
    bridge.initialize();
    let sid = bridge.new_session(&ws);
    let id = bridge.send_prompt(&sid, "SCENARIO:ask-and-exit");
    let turn = bridge.finish_turn(&sid, id);
    assert_eq!(turn.result.as_ref().map_err(|e| e.code), Err(-32603), "{turn:?}");
    assert_eq!((bridge.elicitation_ids.len(), bridge.permission_ids.len()), (1, 1));
    // The editor is told that neither question stands any more.
    let asked = [bridge.elicitation_ids[0].clone(), bridge.permission_ids[0].clone()];
    bridge.pump_until("both questions withdrawn", Duration::from_secs(5), |bridge| {
        asked.iter().all(|id| bridge.withdrawn.contains(id))
    });
}

#[test]
fn max_servers_counts_what_runs_and_a_prompt_waits_for_room_instead_of_failing() {
    let dirs = TestDirs::new("acp-room");
    let mut bridge = Bridge::start(options(&dirs).arg("--max-servers").arg("2"));
    // Six sessions opened at once: their agents start ahead, at most two at a time; none runs a turn.
    let sessions: Vec<String> = (0..6).map(|i| bridge.new_session(&dirs.workspace(&format!("ws{i}")))).collect();
    assert_eq!(answer(&mut bridge, &sessions[5], "text"), "Hello from ACP");
    // Two turns hold both agents: a third prompt waits, says so, and runs once one of them is stopped.
    let mut held = Vec::new();
    for sid in &sessions[..2] {
        held.push(bridge.send_prompt(sid, "SCENARIO:sleep"));
        bridge.wait_update(sid, "sleeping", |u| u["content"]["text"] == "sleeping\n");
    }
    let third = bridge.send_prompt(&sessions[2], "SCENARIO:text");
    // Past the note of its first turn that it runs without a sandbox (`--sandbox none`).
    let waiting = bridge.wait_update(&sessions[2], "the wait said", |u| {
        u["sessionUpdate"] == "agent_message_chunk"
            && !u["content"]["text"].as_str().is_some_and(|text| text.contains("WITHOUT a sandbox"))
    });
    assert_eq!(
        waiting["content"]["text"].as_str().map(str::trim),
        Some(
            "_all 2 agents that --max-servers allows are in a turn or starting: this prompt starts when one of them is \
         done._"
        )
    );
    bridge.cancel(&sessions[0]);
    assert_eq!(bridge.finish_turn(&sessions[0], held[0]).stop_reason(), "cancelled");
    let turn = bridge.finish_turn(&sessions[2], third);
    assert_eq!(turn.stop_reason(), "end_turn", "{turn:?}");
    assert_eq!(said(&turn.updates), "Hello from ACP");
    bridge.cancel(&sessions[1]);
    assert_eq!(bridge.finish_turn(&sessions[1], held[1]).stop_reason(), "cancelled");
}

/// The fake agent's processes running in `ws`.
fn agents_in(ws: &Path) -> Vec<i32> {
    processes_under(ws)
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains("acp_agent.py"))
        .map(|(pid, _)| pid)
        .collect()
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
        "ACP agent stopped in the middle of the turn (it exited with exit code 3)\n\nstderr:\nfake agent crashed"
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
    let servers =
        json!([{"name": "probe", "command": "/bin/echo", "args": ["x"], "env": [{"name": "TOKEN", "value": "t0ken"}]}]);
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

/// What the thread says while a turn waits for its agent's start.
const STILL_STARTING: &str = "_ACP agent is still starting; it is waited for while it makes progress._";

#[test]
fn an_agent_that_never_answers_initialize_is_an_error_and_the_bridge_goes_on() {
    let dirs = TestDirs::new("acp-hang-init");
    let ws = dirs.workspace("ws");
    let mut bridge =
        Bridge::start(options(&dirs).arg("--pass-env").arg("FAKE_ACP_HANG_INIT").env("FAKE_ACP_HANG_INIT", "1"));
    let sid = bridge.new_session(&ws);
    let id = bridge.send_prompt(&sid, "SCENARIO:text");
    // Reported once it made no progress for a while (no timed assertion: the bound only ends a hung test).
    let result = bridge.wait_response_within(id, Duration::from_secs(300)).expect("the start is reported");
    let error = result.expect_err("no agent, no turn");
    assert_eq!(
        error.message,
        "ACP agent could not be started: it did not answer initialize and made no progress (no CPU used, nothing \
         running) for 20 s"
    );
    let notes = notes(&Turn { result: Err(error), updates: bridge.take_updates(&sid) });
    assert!(notes.contains(&STILL_STARTING.to_string()), "{notes:?}");
    let listed = bridge.request("session/list", json!({})).unwrap();
    assert_eq!(listed["sessions"].as_array().map(Vec::len), Some(1), "the bridge still answers");
}

/// An agent whose start takes longer than the 10 s `initialize` was given before, busy all along (a loaded
/// machine), is waited for: the thread says it is still starting, then it answers.
#[test]
fn an_agent_that_starts_slowly_but_makes_progress_is_waited_for() {
    let dirs = TestDirs::new("acp-slow-init");
    let ws = dirs.workspace("ws");
    let mut bridge =
        Bridge::start(options(&dirs).arg("--pass-env").arg("FAKE_ACP_SLOW_INIT").env("FAKE_ACP_SLOW_INIT", "12"));
    let sid = bridge.new_session(&ws);
    let id = bridge.send_prompt(&sid, "SCENARIO:text");
    let result = bridge.wait_response_within(id, Duration::from_secs(300)).expect("the turn ends");
    let turn = Turn { result, updates: bridge.take_updates(&sid) };
    assert_eq!(turn.stop_reason(), "end_turn", "{:#?}", turn.updates);
    assert!(notes(&turn).contains(&STILL_STARTING.to_string()), "{:#?}", turn.updates);
    assert!(!turn.agent_text().is_empty(), "{:#?}", turn.updates);
}

#[test]
fn doctor_says_whether_the_custom_agents_command_is_there() {
    let dirs = TestDirs::new("acp-doctor");
    let line = |args: &[&str]| {
        let (code, out, _) = doctor_with(&dirs.data, &[&["--sandbox", "none"], args].concat(), &[]);
        (code, out.lines().find(|line| line.starts_with("ACP agent ")).unwrap_or_default().to_string())
    };
    let missing = "--agent custom runs the ACP agent that --agent-command (ACP_SANDBOX_AGENT_COMMAND) names: set it, \
                   e.g. --agent-command 'my-agent --acp'";
    assert_eq!(line(&[]), (Some(0), format!("ACP agent   not set up: {missing}")));
    assert_eq!(line(&["--agent", "custom"]), (Some(1), format!("ACP agent   ERROR {missing}")));
    let gone = dirs.root().join("no-such-agent");
    assert_eq!(
        line(&["--agent", "custom", "--agent-command", &format!("{} --acp", gone.display())]),
        (Some(1), format!("ACP agent   ERROR {} not found (from --agent-command)", gone.display()))
    );
    let fake = fakes_dir().join("acp_agent.py");
    assert_eq!(
        line(&["--agent", "custom", "--agent-command", &fake.display().to_string()]),
        (Some(0), format!("ACP agent   {} (from --agent-command)", fake.display()))
    );
}

#[test]
fn an_agent_that_wants_a_login_says_so_as_auth_required_and_the_bridge_goes_on() {
    let dirs = TestDirs::new("acp-auth");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs).arg("--pass-env").arg("FAKE_ACP_AUTH").env("FAKE_ACP_AUTH", "1"));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:text");
    let error = turn.result.unwrap_err();
    assert_eq!(
        (error.code, error.message.as_str()),
        (
            -32000,
            "ACP agent could not make a session without a login: Authentication required (it offers: Fake sign-in). \
             It runs in the sandbox, whose HOME is the session's own, with only the variables acp-sandbox passes it: \
             give it its key as a variable (for --agent custom, named by --pass-env and set in the agent server's \
             \"env\")"
        )
    );
    // The same again on the next prompt, and the bridge still serves.
    assert_eq!(bridge.prompt(&sid, "SCENARIO:text").result.unwrap_err().code, -32000);
    assert!(bridge.request("session/list", json!({})).is_ok());
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

#[test]
fn the_agents_config_options_are_the_sessions_and_setting_one_reaches_it() {
    let dirs = TestDirs::new("acp-options");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    // The agent starts with the session (in the background) and announces its options.
    let announced = bridge.wait_update(&sid, "the agent's options", |u| u["sessionUpdate"] == "config_option_update");
    let model = |options: &Value| options[0]["currentValue"].clone();
    assert_eq!(announced["configOptions"][0]["id"], "model");
    assert_eq!(model(&announced["configOptions"]), "fast");
    let set =
        bridge.request("session/set_config_option", json!({"sessionId": sid, "configId": "model", "value": "smart"}));
    assert_eq!(model(&set.unwrap()["configOptions"]), "smart");
    assert_eq!(answer(&mut bridge, &sid, "options"), "model smart", "the choice reached the agent");
    let refused = bridge
        .request("session/set_config_option", json!({"sessionId": sid, "configId": "model", "value": "huge"}))
        .unwrap_err();
    assert_eq!(
        (refused.code, refused.message.as_str()),
        (-32602, "\"huge\" is not a value of ACP agent's option \"model\"")
    );
    bridge.kill9();

    // A new bridge offers what the agent announced last before the agent runs again, and the new agent process
    // (which starts at its default, `fast`) is given the user's choice.
    let mut bridge = Bridge::start(options(&dirs));
    let loaded = bridge.request("session/load", json!({"sessionId": sid, "cwd": ws, "mcpServers": []})).unwrap();
    assert_eq!(model(&loaded["configOptions"]), "smart");
    assert_eq!(answer(&mut bridge, &sid, "options"), "model smart", "the new agent was given the choice");
}

#[test]
fn a_new_session_has_the_options_its_agent_said_last_time_and_a_choice_made_before_it_starts_reaches_it() {
    let dirs = TestDirs::new("acp-seed");
    let ws = dirs.workspace("ws");
    let options = || options(&dirs).arg("--pass-env").arg("FAKE_ACP_MODES").env("FAKE_ACP_MODES", "1");
    let mut bridge = Bridge::start(options());
    let first = bridge.new_session(&ws);
    assert_eq!(answer(&mut bridge, &first, "settings"), "mode ask model fast");
    bridge.request("session/set_mode", json!({"sessionId": first, "modeId": "plan"})).unwrap();

    // The next session of the same agent has its options at once (as it said them when it made its session, not
    // the first session's choices), so that an editor can apply its own defaults right away, as Zed does.
    let made = bridge.request("session/new", json!({"cwd": ws, "mcpServers": []})).unwrap();
    let second = made["sessionId"].as_str().unwrap().to_string();
    assert_eq!(made["configOptions"], old_style_options("ask", "fast"));
    let set = bridge
        .request("session/set_config_option", json!({"sessionId": second, "configId": "model", "value": "smart"}))
        .unwrap();
    assert_eq!(set["configOptions"], old_style_options("ask", "smart"));
    assert_eq!(answer(&mut bridge, &second, "settings"), "mode ask model smart", "the choice reached its agent");

    // Another agent (another command line) starts with none.
    let mut other = Bridge::start(
        BridgeOptions::new("custom", &dirs.data)
            .arg("--agent-command")
            .arg(&format!("{} --other", fakes_dir().join("acp_agent.py").display()))
            .env("HOME", &dirs.root().join("home").display().to_string()),
    );
    let made = other.request("session/new", json!({"cwd": ws, "mcpServers": []})).unwrap();
    assert_eq!(made["configOptions"], json!([]));
}

/// The options of the agent that says modes and models the older way (FAKE_ACP_MODES: Gemini CLI's way).
fn old_style_options(mode: &str, model: &str) -> Value {
    json!([
        {"id": "mode", "name": "Mode", "category": "mode", "type": "select", "currentValue": mode, "options": [
            {"value": "ask", "name": "Ask", "description": "Asks before it acts"},
            {"value": "code", "name": "Code"},
            {"value": "plan", "name": "Plan", "description": "Reads only"}]},
        {"id": "model", "name": "Model", "category": "model", "type": "select", "currentValue": model, "options": [
            {"value": "fast", "name": "Fast"}, {"value": "smart", "name": "Smart"}]}
    ])
}

#[test]
fn its_modes_and_models_are_the_sessions_options_and_every_new_process_of_it_is_given_the_users_choices() {
    let dirs = TestDirs::new("acp-modes");
    let ws = dirs.workspace("ws");
    let options = || {
        options(&dirs)
            .arg("--pass-env")
            .arg("FAKE_ACP_MODES")
            .env("FAKE_ACP_MODES", "1")
            .arg("--server-idle-timeout")
            .arg("2")
    };
    let mut bridge = Bridge::start(options());
    let made = bridge.request("session/new", json!({"cwd": ws, "mcpServers": []})).unwrap();
    let sid = made["sessionId"].as_str().unwrap().to_string();
    // Before the agent has started: an empty list, which its options then replace (Zed takes a later update only
    // for a session that began with a list).
    assert_eq!(made, json!({"sessionId": sid, "configOptions": []}));
    let announced = bridge.wait_update(&sid, "the agent's options", |u| u["sessionUpdate"] == "config_option_update");
    assert_eq!(announced["configOptions"], old_style_options("ask", "fast"));

    // session/set_mode reaches it as session/set_mode, the model option as session/set_model.
    bridge.request("session/set_mode", json!({"sessionId": sid, "modeId": "plan"})).unwrap();
    let set = bridge
        .request("session/set_config_option", json!({"sessionId": sid, "configId": "model", "value": "smart"}))
        .unwrap();
    assert_eq!(set["configOptions"], old_style_options("plan", "smart"));
    assert_eq!(answer(&mut bridge, &sid, "settings"), "mode plan model smart");
    let refused = bridge.request("session/set_mode", json!({"sessionId": sid, "modeId": "yolo"})).unwrap_err();
    assert_eq!(
        (refused.code, refused.message.as_str()),
        (-32602, "\"yolo\" is not a value of ACP agent's option \"mode\"")
    );

    // It changes its own mode: the editor sees the option change, and that is where its next process starts.
    let turn = bridge.prompt(&sid, "SCENARIO:switch-mode:code");
    let changed: Vec<&Value> = turn.updates.iter().filter(|u| u["sessionUpdate"] == "config_option_update").collect();
    assert_eq!(changed.len(), 1, "{:#?}", turn.updates);
    assert_eq!(changed[0]["configOptions"], old_style_options("code", "smart"));
    assert!(!turn.updates.iter().any(|u| u["sessionUpdate"] == "current_mode_update"), "{:#?}", turn.updates);

    // Stopped when idle, it is set all the same: the choice is given to its next process.
    assert!(wait_until(Duration::from_secs(20), || agents_in(&ws).is_empty()), "the idle agent still runs");
    let set = bridge
        .request("session/set_config_option", json!({"sessionId": sid, "configId": "model", "value": "fast"}))
        .unwrap();
    assert_eq!(set["configOptions"], old_style_options("code", "fast"));
    assert_eq!(answer(&mut bridge, &sid, "settings"), "mode code model fast");
    bridge.kill9();

    // A new bridge says them as options and as modes before the agent runs, and its agent is given them.
    let mut bridge = Bridge::start(options());
    let loaded = bridge.request("session/load", json!({"sessionId": sid, "cwd": ws, "mcpServers": []})).unwrap();
    assert_eq!(loaded["configOptions"], old_style_options("code", "fast"));
    assert_eq!(
        loaded["modes"],
        json!({"currentModeId": "code", "availableModes": [
            {"id": "ask", "name": "Ask", "description": "Asks before it acts"},
            {"id": "code", "name": "Code"},
            {"id": "plan", "name": "Plan", "description": "Reads only"}]})
    );
    assert_eq!(answer(&mut bridge, &sid, "settings"), "mode code model fast");
}

#[test]
fn in_review_mode_the_agents_writes_reach_the_users_files_only_through_the_editor() {
    let dirs = TestDirs::new("acp-review");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("notes.txt"), "the user's\n").unwrap();
    let mut bridge = Bridge::start_reviewing(options(&dirs).arg("--workspace").arg("review"), false);
    let sid = bridge.new_session(&ws);
    // Through the bridge's fs/write_text_file, and with its own shell: both land in its copy.
    assert_eq!(answer(&mut bridge, &sid, "write:./notes.txt"), "write ok");
    assert_eq!(answer(&mut bridge, &sid, "shell:echo made > made.txt && echo done"), "shell 0 done");
    let sent: Vec<(PathBuf, String, Option<String>)> =
        bridge.file_writes.iter().map(|w| (w.path.clone(), w.content.clone(), w.before.clone())).collect();
    assert_eq!(
        sent,
        [
            (ws.join("notes.txt"), "written by the agent".to_string(), Some("the user's\n".to_string())),
            (ws.join("made.txt"), "made\n".to_string(), None),
        ]
    );
    // The editor refused both: the user's files are as they were.
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "the user's\n");
    assert!(!ws.join("made.txt").exists());
    // The agent reads the user's file again (its copy follows the user's).
    assert_eq!(answer(&mut bridge, &sid, "read:./notes.txt"), "read ok the user's");
}

#[test]
fn an_agent_that_cannot_load_resumes_or_starts_afresh_from_the_transcript() {
    for (resume, expected) in [
        ("1", r#"history ["SCENARIO:text"]"#),
        // Neither load nor resume: a fresh session of the agent's, whose prompt carries the transcript.
        ("0", "history []"),
    ] {
        let dirs = TestDirs::new("acp-no-load");
        let ws = dirs.workspace("ws");
        let options = || {
            options(&dirs)
                .arg("--pass-env")
                .arg("FAKE_ACP_NO_LOAD,FAKE_ACP_RESUME")
                .env("FAKE_ACP_NO_LOAD", "1")
                .env("FAKE_ACP_RESUME", resume)
        };
        let mut bridge = Bridge::start(options());
        let sid = bridge.new_session(&ws);
        assert_eq!(answer(&mut bridge, &sid, "text"), "Hello from ACP");
        bridge.kill9();
        let db = rusqlite::Connection::open(dirs.data.join("acp-sandbox.sqlite3")).unwrap();
        let native: String =
            db.query_row("SELECT native_id FROM sessions WHERE id = ?1", [&sid], |row| row.get(0)).unwrap();
        let mut bridge = Bridge::start(options());
        assert!(bridge.load_session(&sid, &ws).result.is_ok());
        let turn = bridge.prompt(&sid, "SCENARIO:history");
        assert_eq!(said(&turn.updates), expected, "FAKE_ACP_RESUME={resume}");
        let fresh = format!(
            "_The earlier ACP agent conversation ({native}) no longer exists in the sandbox, so this prompt starts a \
             fresh one from a transcript of the earlier turns (tool details are not in it)._"
        );
        let expected_notes: Vec<String> =
            notes(&turn).into_iter().filter(|note| !note.contains("WITHOUT a sandbox")).collect();
        assert_eq!(expected_notes, if resume == "0" { vec![fresh] } else { vec![] }, "FAKE_ACP_RESUME={resume}");
    }
}

#[test]
fn its_slash_commands_reach_the_editor_when_it_starts() {
    let dirs = TestDirs::new("acp-commands");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    let commands = bridge.wait_update(&sid, "its commands", |u| u["sessionUpdate"] == "available_commands_update");
    assert_eq!(
        commands["availableCommands"],
        json!([{"name": "greet", "description": "Says hello", "input": {"hint": "whom"}}])
    );
}

#[test]
fn an_idle_agent_is_stopped_and_the_cap_stops_the_one_unused_longest() {
    let dirs = TestDirs::new("acp-idle");
    let ws = dirs.workspace("ws");
    let other = dirs.workspace("other");
    let mut bridge = Bridge::start(options(&dirs).arg("--server-idle-timeout").arg("2").arg("--max-servers").arg("1"));
    let first = bridge.new_session(&ws);
    let token = answer(&mut bridge, &first, "whoami");
    assert!(wait_until(Duration::from_secs(20), || agents_in(&ws).is_empty()), "the idle agent still runs");
    let again = answer(&mut bridge, &first, "whoami");
    assert_ne!(again, token, "a fresh agent after the idle stop");

    // One at most: the other session's agent takes the first one's place.
    let second = bridge.new_session(&other);
    assert_eq!(answer(&mut bridge, &second, "text"), "Hello from ACP");
    assert!(wait_until(Duration::from_secs(10), || agents_in(&ws).is_empty()), "two agents run under --max-servers 1");
    assert!(!agents_in(&other).is_empty(), "the second session's agent runs");
    assert_eq!(
        answer(&mut bridge, &first, "history"),
        r#"history ["SCENARIO:whoami", "SCENARIO:whoami"]"#,
        "the first session goes on in a fresh agent"
    );
}

#[test]
fn its_prompt_carries_the_editors_images_as_they_are() {
    let dirs = TestDirs::new("acp-images");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    let id = bridge.send_prompt_blocks(
        &sid,
        vec![
            json!({"type": "text", "text": "SCENARIO:images"}),
            json!({"type": "image", "mimeType": "image/png", "data": png}),
        ],
    );
    let turn = bridge.finish_turn(&sid, id);
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(said(&turn.updates), format!(r#"images [["image/png", {}]]"#, png.len()));
}

#[test]
fn a_line_of_the_agent_that_is_not_json_rpc_is_passed_over() {
    let dirs = TestDirs::new("acp-garbage");
    let ws = dirs.workspace("ws");
    let mut bridge =
        Bridge::start(options(&dirs).arg("--pass-env").arg("FAKE_ACP_GARBAGE").env("FAKE_ACP_GARBAGE", "1"));
    let sid = bridge.new_session(&ws);
    assert_eq!(answer(&mut bridge, &sid, "text"), "Hello from ACP");
}

#[test]
fn a_flood_of_file_requests_is_all_answered_and_the_agent_goes_on() {
    let dirs = TestDirs::new("acp-flood");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("notes.txt"), "n\n").unwrap();
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    // Each request is a process in the sandbox: 200 at once wait behind a few (`files::AT_ONCE`), and all are answered.
    assert_eq!(answer(&mut bridge, &sid, "flood:200"), "flood 200/200");
    assert_eq!(answer(&mut bridge, &sid, "text"), "Hello from ACP");
}

#[test]
fn the_agents_end_with_the_bridge_whether_it_exits_or_is_killed() {
    let dirs = TestDirs::new("acp-exit");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    assert_eq!(answer(&mut bridge, &sid, "text"), "Hello from ACP");
    bridge.close_stdin();
    assert!(bridge.wait_exit(Duration::from_secs(20)).is_some(), "the bridge did not exit");
    assert!(wait_until(Duration::from_secs(10), || agents_in(&ws).is_empty()), "left running: {:?}", agents_in(&ws));

    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    assert_eq!(answer(&mut bridge, &sid, "text"), "Hello from ACP");
    bridge.kill9();
    assert!(wait_until(Duration::from_secs(10), || agents_in(&ws).is_empty()), "left running: {:?}", agents_in(&ws));
}

/// Review mode in a git workspace, under `sandbox`: the agent starts, its writes reach the user's files only through
/// the editor, and a link it makes in its copy is never followed when the bridge reads for it.
fn reviewing_a_git_workspace(sandbox: &str) {
    let dirs = TestDirs::new(&format!("acp-review-git-{sandbox}"));
    let ws = dirs.workspace("ws");
    let git = std::process::Command::new("git").arg("init").arg("-q").arg(&ws).status().unwrap();
    assert!(git.success());
    std::fs::write(ws.join("notes.txt"), "the user's\n").unwrap();
    let outside = dirs.root().join("home/outside.txt");
    std::fs::create_dir_all(outside.parent().unwrap()).unwrap();
    std::fs::write(&outside, "OUTSIDE-BYTES\n").unwrap();
    let mut bridge = Bridge::start_reviewing(options(&dirs).sandbox(sandbox).arg("--workspace").arg("review"), false);
    let sid = bridge.new_session(&ws);
    assert_eq!(answer(&mut bridge, &sid, "shell:echo made > made.txt && echo done"), "shell 0 done");
    let sent: Vec<(PathBuf, String)> = bridge.file_writes.iter().map(|w| (w.path.clone(), w.content.clone())).collect();
    assert_eq!(sent, [(ws.join("made.txt"), "made\n".to_string())]);
    assert!(!ws.join("made.txt").exists(), "the editor refused it");
    let link = format!("shell:ln -s {} peek && echo linked", outside.display());
    assert_eq!(answer(&mut bridge, &sid, &link), "shell 0 linked");
    let read = answer(&mut bridge, &sid, "read:./peek");
    assert!(read.starts_with("read error "), "{read}");
    assert!(!read.contains("OUTSIDE-BYTES"), "{read}");
}

#[test]
fn review_mode_works_in_a_git_workspace_none() {
    reviewing_a_git_workspace("none");
}

#[test]
fn review_mode_works_in_a_git_workspace_bwrap() {
    if let Err(why) = bwrap_usable() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    reviewing_a_git_workspace("bwrap");
}

// ---- what the editor is shown is true (issue 43) ---------------------------------------------------------------

/// Under `--sandbox none` the first turn of every session says the agent runs without a sandbox, also when the
/// agent started ahead of the prompt (at `session/new`, which made the session's sandbox), and later turns do not.
#[test]
fn the_unsandboxed_note_is_in_the_first_turn_of_every_session() {
    let dirs = TestDirs::new("acp-unsandboxed-note");
    let mut bridge = Bridge::start(options(&dirs).sandbox("none"));
    let note = "_ACP agent runs WITHOUT a sandbox here (--sandbox none was given): it can read and write \
                everything you can._";
    for round in 0..10 {
        let ws = dirs.workspace(&format!("ws{round}"));
        let sid = bridge.new_session(&ws);
        // Half of them once their agent runs (its start at session/new made the sandbox), half at once.
        if round % 2 == 0 {
            let started = wait_until(Duration::from_secs(20), || !agents_in(&ws).is_empty());
            assert!(started, "the agent of session {round} did not start ahead of its prompt");
        }
        let first = bridge.prompt(&sid, "SCENARIO:text");
        assert_eq!(first.stop_reason(), "end_turn", "{first:?}");
        assert_eq!(notes(&first), [note], "session {round}: {:#?}", first.updates);
        let second = bridge.prompt(&sid, "SCENARIO:text");
        assert_eq!(notes(&second), Vec::<String>::new(), "session {round}: {:#?}", second.updates);
    }
}

/// An agent that answers `session/load` first and replays its conversation after (as Gemini CLI does): nothing of the
/// replay reaches the editor, neither in the load (the store's replay is the editor's) nor in the next answer.
#[test]
fn what_the_agent_replays_after_answering_its_load_reaches_no_turn() {
    let dirs = TestDirs::new("acp-late-replay");
    let ws = dirs.workspace("ws");
    let options = || options(&dirs).arg("--pass-env").arg("FAKE_ACP_LATE_REPLAY").env("FAKE_ACP_LATE_REPLAY", "1");
    let mut bridge = Bridge::start(options());
    let sid = bridge.new_session(&ws);
    for _ in 0..4 {
        assert_eq!(answer(&mut bridge, &sid, "text"), "Hello from ACP");
    }
    bridge.close_stdin();
    assert!(bridge.wait_exit(Duration::from_secs(20)).is_some(), "the bridge did not exit");

    let mut bridge = Bridge::start(options());
    let loaded = bridge.load_session(&sid, &ws);
    assert!(loaded.result.is_ok(), "{:?}", loaded.result);
    assert_eq!(text_of(&loaded.updates, "user_message_chunk"), "SCENARIO:text".repeat(4));
    let turn = bridge.prompt(&sid, "SCENARIO:history");
    assert_eq!(turn.stop_reason(), "end_turn", "{turn:?}");
    assert_eq!(said(&turn.updates), format!("history {:?}", ["SCENARIO:text"; 4]), "{:#?}", turn.updates);
    let kinds: Vec<&str> = turn.updates.iter().filter_map(|u| u["sessionUpdate"].as_str()).collect();
    assert!(!kinds.contains(&"user_message_chunk"), "{:#?}", turn.updates);
}

/// The bridge stops its agents so that they keep what they wrote: when it exits (its editor went away), when it
/// lets a session go, and when an agent is idle, the agent first sees the end of its input.
#[test]
fn an_agent_sees_the_end_of_its_input_before_the_bridge_stops_it() {
    let dirs = TestDirs::new("acp-gentle-stop");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    assert_eq!(answer(&mut bridge, &sid, "text"), "Hello from ACP");
    // The agent's HOME is the session's.
    let ended = sandbox_state(&dirs.data, &sid).join("home/.fake-acp/ended.txt");
    let pid = bridge.pid();
    bridge.close_stdin();
    assert!(bridge.wait_exit(Duration::from_secs(20)).is_some(), "the bridge {pid} did not exit");
    assert!(wait_until(Duration::from_secs(10), || agents_in(&ws).is_empty()), "left running: {:?}", agents_in(&ws));
    let said = std::fs::read_to_string(&ended).unwrap_or_default();
    assert_eq!(said.lines().count(), 1, "killed before it saw the end of its input: {said:?}\n{}", bridge.stderr());
    assert!(said.ends_with(" saw the end of its input\n"), "{said:?}");
}

/// An agent that dies before it initializes (a sandbox that could not be made, a missing library) is an error that
/// carries what it wrote on stderr: the editor sees why.
#[test]
fn an_agent_that_dies_before_initialize_is_an_error_with_its_stderr() {
    let dirs = TestDirs::new("acp-dies-at-start");
    let ws = dirs.workspace("ws");
    let script = dirs.root().join("dies.sh");
    std::fs::write(&script, "#!/bin/sh\necho 'boom: the agent cannot start' >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let options = BridgeOptions::new("custom", &dirs.data).arg("--agent-command").arg(&script.display().to_string());
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let error = bridge.prompt(&sid, "SCENARIO:text").result.expect_err("no agent, no turn");
    assert_eq!(error.data.as_ref().map(|data| data["stderr"].clone()), Some(json!("boom: the agent cannot start")));
    assert!(error.message.starts_with("ACP agent could not be started: it did not initialize"), "{}", error.message);
}
