//! The built bridge with `--sandbox daytona` against the fake Daytona: each session's CLI (the fake OpenCode, at
//! its path on this machine: the fake runs commands on the host) runs in a Daytona sandbox of its own.

use super::*;
use pretty_assertions::assert_eq;

pub(super) fn daytona_options(fake: &FakeDaytona, dirs: &support::TestDirs) -> support::BridgeOptions {
    support::BridgeOptions::new("opencode", &dirs.data)
        .sandbox("daytona")
        .env("DAYTONA_API_KEY", KEY)
        .env("DAYTONA_API_URL", &fake.api_url())
}

pub(super) fn daytona_bridge(fake: &FakeDaytona, dirs: &support::TestDirs) -> support::Bridge {
    support::Bridge::start(daytona_options(fake, dirs))
}

/// The sandboxes the fake holds (a directory each).
pub(super) fn sandboxes(fake: &FakeDaytona) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(&fake.root)
        .map(|entries| entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

pub(super) fn only_sandbox(fake: &FakeDaytona) -> String {
    let ids = sandboxes(fake);
    assert_eq!(ids.len(), 1, "{ids:?}");
    ids[0].clone()
}

/// The sandbox's workspace on the host, where the fake CLI records its runs.
pub(super) fn workspace_of(fake: &FakeDaytona, id: &str) -> PathBuf {
    fake.root.join(id).join("home/workspace")
}

#[test]
fn a_refused_daytona_key_answers_the_prompt_with_an_auth_error() {
    let dir = test_dir("bridge-auth");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-auth");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(daytona_options(&fake, &dirs).env("DAYTONA_API_KEY", "dtn_not_the_key"));
    let sid = bridge.new_session(&ws);
    let error = bridge.prompt(&sid, "Say hello").result.unwrap_err();
    assert_eq!(error.code, -32000);
    assert_eq!(
        error.message,
        "daytona: Daytona refused the API key (HTTP 401) while create a sandbox: check DAYTONA_API_KEY (and \
         DAYTONA_API_URL)"
    );
    assert_eq!(error.data, Some(json!({"provider": "daytona"})));
    assert_eq!(sandboxes(&fake), Vec::<String>::new());
    // The bridge goes on: the next prompt gets the same answer.
    assert_eq!(bridge.prompt(&sid, "Say hello").result.unwrap_err().code, -32000);
}

#[test]
fn opencodes_warm_server_falls_back_to_run_in_a_daytona_sandbox() {
    let dir = test_dir("bridge-serve");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-serve");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(daytona_options(&fake, &dirs).env("ACP_SANDBOX_OPENCODE_BACKEND", "serve"));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(
        turn.agent_text(),
        "\n\n_OpenCode's server could not start here, so this session runs `opencode run` per prompt (no live \
         output): the OpenCode server did not start: sandbox unavailable: a server inside a Daytona sandbox is not \
         supported yet_\n\nHello from the fake model. This is a plain text answer."
    );
    let runs = support::invocations(&workspace_of(&fake, &only_sandbox(&fake)));
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].argv()[0], "run");
}

/// The workspace of a Daytona sandbox is mirrored as E2B's is (the same code, over Daytona's files and commands):
/// uploaded on the first prompt, the agent's edit and new file sent to the editor and not written by the bridge,
/// a rejected edit undone in the sandbox, the user's own edit there before the next turn.
#[test]
fn the_workspace_goes_up_and_the_agents_changes_come_back_through_the_editor() {
    let dir = test_dir("workspace");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-workspace");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    std::fs::write(ws.join("mine.txt"), "mine\n").unwrap();
    let mut bridge = support::Bridge::start_reviewing(daytona_options(&fake, &dirs), false);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(
        &sid,
        &support::ops(json!([["read", "mine.txt"], ["write", "hello.txt", "agent\n"], ["write", "new.txt", "x\n"]])),
    );
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(support::reads(&turn), "READ mine.txt=mine\n");
    let writes: Vec<(PathBuf, String, Option<String>)> =
        bridge.file_writes.iter().map(|w| (w.path.clone(), w.content.clone(), w.before.clone())).collect();
    assert_eq!(
        writes,
        [
            (ws.join("hello.txt"), "agent\n".to_string(), Some("old\n".to_string())),
            (ws.join("new.txt"), "x\n".to_string(), None),
        ]
    );
    // Rejected: the user's files are as they were, and so is the sandbox's copy of them.
    assert_eq!(std::fs::read_to_string(ws.join("hello.txt")).unwrap(), "old\n");
    assert!(!ws.join("new.txt").exists());
    let remote = workspace_of(&fake, &only_sandbox(&fake));
    assert_eq!(std::fs::read_to_string(remote.join("hello.txt")).unwrap(), "old\n");
    assert!(!remote.join("new.txt").exists(), "the rejected new file stayed in the sandbox");

    std::fs::write(ws.join("mine.txt"), "edited by me\n").unwrap();
    let turn = bridge.prompt(&sid, &support::ops(json!([["read", "mine.txt"], ["read", "hello.txt"]])));
    assert_eq!(support::reads(&turn), "READ mine.txt=edited by me\n; hello.txt=old\n");
    assert_eq!(bridge.file_writes.len(), 2, "nothing more was sent");
}

/// Without an override, the CLI is installed in the Daytona sandbox on the first prompt, with the snapshot's own
/// npm (found on the sandbox's PATH, not this machine's), shown as a card, and found there by later prompts.
#[test]
fn the_cli_is_installed_in_the_daytona_sandbox_on_first_use_and_found_there_later() {
    use std::os::unix::fs::PermissionsExt;
    let dir = test_dir("install");
    let dirs = support::TestDirs::new("daytona-install");
    let bin = dirs.root().join("snapshot-bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("npm"), format!("#!/bin/sh\n{}", support::installing_npm())).unwrap();
    std::fs::set_permissions(bin.join("npm"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let fake = FakeDaytona::start_in(&dir, &[], &format!("{}:/usr/bin:/bin", bin.display()));
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(daytona_options(&fake, &dirs).without_env("ACP_SANDBOX_OPENCODE_BIN"));
    let sid = bridge.new_session(&ws);
    let first = bridge.prompt(&sid, "Say hello");
    assert_eq!(first.stop_reason(), "end_turn");
    assert_eq!(first.agent_text(), "Hello from the fake model. This is a plain text answer.");
    let install: Vec<(&Value, &Value)> = first
        .updates
        .iter()
        .filter(|u| u["toolCallId"] == "install-opencode")
        .map(|u| (&u["title"], &u["status"]))
        .collect();
    let title = json!("Installing OpenCode 1.18.33 in the sandbox (first use)");
    assert_eq!(install, [(&title, &json!("in_progress")), (&Value::Null, &json!("completed"))], "{:#?}", first.updates);
    let id = only_sandbox(&fake);
    let npm_log = fake.root.join(&id).join("home/.acp-sandbox/home/npm.log");
    assert_eq!(std::fs::read_to_string(&npm_log).unwrap().lines().count(), 1);

    let second = bridge.prompt(&sid, "Say hello");
    assert_eq!(second.stop_reason(), "end_turn");
    assert!(!second.updates.iter().any(|u| u["toolCallId"] == "install-opencode"), "{:#?}", second.updates);
    assert_eq!(std::fs::read_to_string(&npm_log).unwrap().lines().count(), 1, "npm ran again");
    assert_eq!(support::invocations(&workspace_of(&fake, &id)).len(), 2);
}

/// The text of a turn's agent chunks without the bridge's notes.
fn agent_said(turn: &support::Turn) -> String {
    let chunks = turn.updates.iter().filter(|u| u["sessionUpdate"] == "agent_message_chunk");
    let texts = chunks.filter_map(|u| u["content"]["text"].as_str()).filter(|text| !text.trim().starts_with('_'));
    texts.collect::<String>().trim().to_string()
}

#[test]
fn an_acp_agent_runs_in_a_daytona_sandbox_through_its_input_pipe_and_its_changes_are_reviewed() {
    let dir = test_dir("bridge-acp");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-acp");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("notes.txt"), "the user's\n").unwrap();
    let mut options = daytona_options(&fake, &dirs)
        .arg("--agent-command")
        .arg(&support::fakes_dir().join("acp_agent.py").display().to_string());
    options.agent = "custom".into();
    let mut bridge = support::Bridge::start_reviewing(options, true);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:text");
    assert_eq!(turn.stop_reason(), "end_turn", "{turn:?}");
    assert_eq!(agent_said(&turn), "Hello from ACP");
    let turn = bridge.prompt(&sid, "SCENARIO:read:./notes.txt");
    assert_eq!(agent_said(&turn), "read ok the user's", "{turn:?}");
    let turn = bridge.prompt(&sid, "SCENARIO:write:./made.txt");
    assert_eq!(agent_said(&turn), "write ok", "{turn:?}");
    let id = only_sandbox(&fake);
    assert_eq!(std::fs::read_to_string(workspace_of(&fake, &id).join("made.txt")).unwrap(), "written by the agent");
    let sent: Vec<(PathBuf, String)> = bridge.file_writes.iter().map(|w| (w.path.clone(), w.content.clone())).collect();
    assert_eq!(sent, [(ws.join("made.txt"), "written by the agent".to_string())]);
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap(), "written by the agent");
    // The sandbox stopped between turns (its agent with it): each turn's agent continued the same conversation.
    let turn = bridge.prompt(&sid, "SCENARIO:history");
    assert_eq!(
        agent_said(&turn),
        r#"history ["SCENARIO:text", "SCENARIO:read:./notes.txt", "SCENARIO:write:./made.txt"]"#
    );
}
