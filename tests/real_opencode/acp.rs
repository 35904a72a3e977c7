//! The real OpenCode through its own ACP server (`--opencode-backend acp`: `opencode acp` in the session's sandbox,
//! the bridge its client): streamed text, a file written by its tools, the user's key out of its shell's reach under
//! bubblewrap, cancel of a long command with nothing left running, and a session that survives a killed bridge.

use super::*;

fn acp(world: &World, sandbox: &str) -> Bridge {
    world.start_with(world.backend_options(sandbox, "acp"))
}

/// The model's text chunks: the agent's, without the bridge's own notes.
fn model_text(updates: &[Value]) -> Vec<String> {
    of_kind(updates, "agent_message_chunk")
        .into_iter()
        .filter_map(|u| u["content"]["text"].as_str())
        .filter(|text| !text.trim().starts_with('_'))
        .map(str::to_string)
        .collect()
}

/// Whether `update` belongs to a turn: what describes the session (its options, its commands) is said again with
/// each opening and when it changes, not replayed as part of a turn.
fn of_the_turn(update: &Value) -> bool {
    !["config_option_update", "available_commands_update"].contains(&update["sessionUpdate"].as_str().unwrap_or(""))
}

/// What `.attack.py` writes: whether the user's key could be read from the agent's own shell.
const READ_THE_KEY: &str = r#"import os, sys
try:
    data = open(sys.argv[1]).read()
    result = "READ " + data.strip()
except Exception as e:
    result = "UNREADABLE " + type(e).__name__
open("key-attempt.txt", "w").write(result)
"#;

fn acp_turns(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let key = world.home.join(".ssh/id_ed25519");
    std::fs::create_dir_all(key.parent().unwrap()).unwrap();
    std::fs::write(&key, "USER-KEY-MATERIAL\n").unwrap();
    let mut bridge = acp(&world, sandbox);
    let sid = bridge.new_session(&ws);
    // What each turn sent the editor, prompt first, as a replay says it.
    let mut sent: Vec<Value> = Vec::new();
    let mut keep = |prompt: &str, turn: &Turn| {
        sent.push(
            serde_json::json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": prompt}}),
        );
        sent.extend(turn.updates.iter().filter(|u| of_the_turn(u)).cloned());
    };

    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:tokens:5 stream", "acp tokens");
    keep("SCENARIO:tokens:5 stream", &turn);
    assert_end_turn(&bridge, &turn);
    assert_eq!(model_text(&turn.updates), ["tok0 ", "tok1 ", "tok2 ", "tok3 ", "tok4 "], "{:#?}", turn.updates);

    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:tools write and edit", "acp tools");
    keep("SCENARIO:tools write and edit", &turn);
    assert_end_turn(&bridge, &turn);
    assert_eq!(std::fs::read_to_string(ws.join("hello.txt")).unwrap(), "hello EDITED by fake model\n");
    let calls = of_kind(&turn.updates, "tool_call");
    assert!(calls.iter().any(|call| call["kind"] == "execute"), "its bash ran as a tool call: {calls:#?}");

    std::fs::write(
        ws.join(".attack.py"),
        READ_THE_KEY.replace("sys.argv[1]", &format!("{:?}", key.display().to_string())),
    )
    .unwrap();
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:attack read the key", "acp attack");
    keep("SCENARIO:attack read the key", &turn);
    assert_end_turn(&bridge, &turn);
    let attempt = std::fs::read_to_string(ws.join("key-attempt.txt")).unwrap();
    if sandbox == "bwrap" {
        assert_eq!(attempt, "UNREADABLE FileNotFoundError", "the agent's shell read the user's key");
    } else {
        // No sandbox: the agent has the user's rights, and the bridge said so in the first turn.
        assert_eq!(attempt, "READ USER-KEY-MATERIAL");
    }
    bridge.kill9();

    // A new bridge replays the store, and OpenCode loads its own session for the follow-up.
    let mut bridge = acp(&world, sandbox);
    let loaded = bridge.load_session(&sid, &ws);
    assert!(loaded.result.is_ok(), "{:?}", loaded.result);
    let replayed: Vec<Value> = loaded.updates.iter().filter(|u| of_the_turn(u)).cloned().collect();
    // The replay, then the session's title as every opening says it.
    let (title, replayed) = replayed.split_last().unwrap();
    assert_eq!(
        *title,
        serde_json::json!({"sessionUpdate": "session_info_update", "title": "SCENARIO:tokens:5 stream"})
    );
    assert_eq!(replayed, sent, "the replay is what the editor was sent, prompts included");
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:followup do you remember?", "acp follow-up");
    assert_end_turn(&bridge, &turn);
    assert_eq!(model_text(&turn.updates).concat(), "FOLLOWUP-OK: I remember the earlier turn.");
    assert_continued(&world.server, "SCENARIO:tokens:5 stream", "tok4");
}

#[test]
fn acp_backend_streams_writes_and_continues_after_a_killed_bridge_none() {
    acp_turns("none", "acp_backend_streams_writes_and_continues_after_a_killed_bridge_none");
}

#[test]
fn acp_backend_streams_writes_and_continues_after_a_killed_bridge_bwrap() {
    if bwrap_ok("acp_backend_streams_writes_and_continues_after_a_killed_bridge_bwrap") {
        acp_turns("bwrap", "acp_backend_streams_writes_and_continues_after_a_killed_bridge_bwrap");
    }
}

#[test]
fn acp_backend_cancel_leaves_nothing_running_none() {
    super::serve::cancel_running_command("acp", "none", "acp_backend_cancel_leaves_nothing_running_none");
}

#[test]
fn acp_backend_cancel_leaves_nothing_running_bwrap() {
    if bwrap_ok("acp_backend_cancel_leaves_nothing_running_bwrap") {
        super::serve::cancel_running_command("acp", "bwrap", "acp_backend_cancel_leaves_nothing_running_bwrap");
    }
}
