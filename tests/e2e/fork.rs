//! `session/fork` against the fake Amp, whose threads live outside the sandbox, and the fake ACP agent: the fork
//! replays the original's turns, its first prompt starts a new thread from their transcript, and each goes its own
//! way from then on.

use serde_json::json;

use crate::support::*;

#[test]
fn a_fork_replays_the_original_starts_from_its_transcript_and_neither_sees_the_others_turns() {
    let dirs = TestDirs::new("fork");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("amp", &dirs.data));
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"]["fork"], json!({}), "{init}");
    let original = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&original, "Say hello").stop_reason(), "end_turn");
    assert_eq!(bridge.prompt(&original, "Do you remember what I asked first?").stop_reason(), "end_turn");
    let thread = invocations(&ws)[0].cli_session();

    let forked = bridge.request("session/fork", json!({"sessionId": original, "cwd": ws, "mcpServers": []})).unwrap();
    let fork = forked["sessionId"].as_str().unwrap().to_string();
    assert_ne!(fork, original);
    assert_eq!(forked["configOptions"][0]["id"], "mode", "{forked}");

    // Replayed whole, as the original would be.
    let replay = bridge.load_session(&fork, &ws);
    replay.result.as_ref().unwrap();
    let asked: Vec<String> = replay
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "user_message_chunk")
        .map(|u| u["content"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(asked, ["Say hello", "Do you remember what I asked first?"]);

    // The fork's first prompt: a new thread, told the conversation so far; the note says so.
    let turn = bridge.prompt(&fork, "And now?");
    assert_eq!(turn.stop_reason(), "end_turn");
    let runs = invocations(&ws);
    let fork_run = &runs[2];
    assert_eq!(fork_run.argv()[0], "-x", "a new thread, not a continued one: {:?}", fork_run.argv());
    let stdin = fork_run.stdin_text();
    assert!(stdin.starts_with("<earlier-conversation>\n"), "{stdin}");
    assert!(stdin.contains("User:\nSay hello\n\nAssistant:\nHello! How can I help you today?"), "{stdin}");
    assert!(stdin.ends_with("</earlier-conversation>\n\nAnd now?"), "{stdin}");
    assert_eq!(
        text_of(&turn.updates, "agent_message_chunk")
            .matches("This fork's Amp conversation starts from a transcript")
            .count(),
        1,
        "{:?}",
        turn.updates
    );
    // Its next prompt continues its own thread, without the transcript again.
    assert_eq!(bridge.prompt(&fork, "Still there?").stop_reason(), "end_turn");
    let runs = invocations(&ws);
    let fork_thread = runs[2].cli_session();
    assert_eq!(&runs[3].argv()[..3], ["threads", "continue", fork_thread.as_str()]);
    assert_eq!(runs[3].stdin_text(), "Still there?");

    // The original goes on with its own thread, and its replay has none of the fork's turns.
    assert_eq!(bridge.prompt(&original, "Back to you").stop_reason(), "end_turn");
    let runs = invocations(&ws);
    assert_eq!(&runs[4].argv()[..3], ["threads", "continue", thread.as_str()]);
    assert_eq!(runs[4].stdin_text(), "Back to you");
    assert_ne!(fork_thread, thread);
    let replay = bridge.load_session(&original, &ws);
    let asked = replay.updates.iter().filter(|u| u["sessionUpdate"] == "user_message_chunk").count();
    assert_eq!(asked, 3);

    // Both are listed.
    let listed = bridge.request("session/list", json!({"cwd": ws})).unwrap();
    let mut ids: Vec<&str> =
        listed["sessions"].as_array().unwrap().iter().map(|s| s["sessionId"].as_str().unwrap()).collect();
    ids.sort();
    let mut expected = [original.as_str(), fork.as_str()];
    expected.sort();
    assert_eq!(ids, expected);
}

#[test]
fn a_fork_of_an_unknown_session_or_into_another_workspace_is_refused() {
    let dirs = TestDirs::new("fork-refused");
    let ws = dirs.workspace("ws");
    let other = dirs.workspace("other");
    let mut bridge = Bridge::start(BridgeOptions::new("amp", &dirs.data));
    let unknown =
        bridge.request("session/fork", json!({"sessionId": "sess_nope", "cwd": ws, "mcpServers": []})).unwrap_err();
    assert_eq!(unknown.code, -32002, "{unknown:?}");
    let original = bridge.new_session(&ws);
    let moved =
        bridge.request("session/fork", json!({"sessionId": original, "cwd": other, "mcpServers": []})).unwrap_err();
    assert_eq!(
        (moved.code, moved.message),
        (-32602, format!("a fork keeps its session's workspace {}, not {}", ws.display(), other.display()))
    );
}

/// A fork of an ACP agent's session (in the workspace's shared sandbox) continues the conversation: its agent
/// conversation starts from the transcript of the original's turns.
#[test]
fn a_fork_of_an_acp_agents_session_starts_from_the_transcript() {
    let dirs = TestDirs::new("fork-acp");
    let ws = dirs.workspace("ws");
    let options = BridgeOptions::new("custom", &dirs.data)
        .arg("--agent-command")
        .arg(&fakes_dir().join("acp_agent.py").display().to_string());
    let mut bridge = Bridge::start(options);
    let original = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&original, "SCENARIO:text").stop_reason(), "end_turn");
    let forked = bridge.request("session/fork", json!({"sessionId": original, "cwd": ws, "mcpServers": []})).unwrap();
    let fork = forked["sessionId"].as_str().unwrap().to_string();
    let first = bridge.prompt(&fork, "SCENARIO:text And now?");
    assert_eq!(first.stop_reason(), "end_turn");
    assert_eq!(
        notes(&first).into_iter().filter(|note| note.contains("transcript")).collect::<Vec<_>>(),
        [
            "_This fork's ACP agent conversation starts from a transcript of the earlier turns (tool details are not in it)._"
        ]
    );
    let turn = bridge.prompt(&fork, "SCENARIO:history");
    let said = text_of(&turn.updates, "agent_message_chunk");
    let history: Vec<String> =
        serde_json::from_str(said.trim().rsplit_once("history ").map(|(_, list)| list).unwrap_or("[]")).unwrap();
    assert_eq!(
        history,
        ["<earlier-conversation>\nThe conversation so far was lost; here is its transcript. Continue from it.\n\n\
          User:\nSCENARIO:text\n\nAssistant:\nHello from ACP\n</earlier-conversation>\n\nSCENARIO:text And now?"],
        "{said}"
    );
}
