//! One warm OpenCode server per workspace (`--server-scope workspace`, the default), against the fake `opencode
//! serve` (`tests/fakes/fake_serve.py`, which logs what it was asked in `<workspace>/.fake-serve/*.log`): the new
//! sessions of a workspace share one sandbox and one server, each its own OpenCode session there, with its own
//! conversation, rules, mode and cancel; a session with other approvals gets a server of its own; deleting one
//! leaves the others; `--server-scope session` gives each session its own server again.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Bridge, BridgeOptions, TestDirs, pid_alive, read_pid_file, wait_until};

fn serve_options(dirs: &TestDirs) -> BridgeOptions {
    BridgeOptions::new("opencode", &dirs.data)
        .env("ACP_SANDBOX_OPENCODE_BACKEND", "serve")
        .env("OPENCODE_FAKE_SERVE", "1")
}

/// How many servers started in this workspace.
fn starts(ws: &Path) -> usize {
    std::fs::read_to_string(ws.join(".fake-serve/starts.log")).unwrap_or_default().lines().count()
}

/// What the fake servers of `ws` logged under `what` (`prompt`, `patch`, `delete`), a JSON value per request.
fn logged(ws: &Path, what: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(ws.join(format!(".fake-serve/{what}.log"))).unwrap_or_default();
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// The agent's own text of a turn.
fn reply(turn: &crate::support::Turn) -> String {
    turn.updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk" && u["messageId"].is_string())
        .filter_map(|u| u["content"]["text"].as_str())
        .collect()
}

/// The OpenCode session of a plain turn's answer (`turn <k> of <ses>`).
fn opencode_session(turn: &crate::support::Turn) -> String {
    reply(turn).rsplit(" of ").next().unwrap().to_string()
}

fn set_option(bridge: &mut Bridge, sid: &str, option: &str, value: &str) {
    let set =
        bridge.request("session/set_config_option", json!({"sessionId": sid, "configId": option, "value": value}));
    set.unwrap_or_else(|e| bridge.fail(&format!("set {option} to {value}: {e}")));
}

/// The state dirs of the data dir's sessions' sandboxes: `workspace-…` for shared ones.
fn sandboxes(dirs: &TestDirs) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dirs.data.join("sessions"))
        .map(|entries| entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    // `_version` is the bridge's own, for `--version`.
    names.retain(|name| name.starts_with("sess_") || name.starts_with("workspace-"));
    names.sort();
    names
}

#[test]
fn the_sessions_of_one_workspace_share_one_server_and_keep_conversations_modes_and_rules_apart() {
    let dirs = TestDirs::new("shared-server");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(serve_options(&dirs));
    let first = bridge.new_session(&ws);
    let a = bridge.prompt(&first, "hello");
    assert_eq!(a.stop_reason(), "end_turn", "{:?}", a.result);
    let second = bridge.new_session(&ws);
    set_option(&mut bridge, &second, "mode", "plan");
    let b = bridge.prompt(&second, "hello");
    assert_eq!(b.stop_reason(), "end_turn", "{:?}", b.result);
    let (ses_a, ses_b) = (opencode_session(&a), opencode_session(&b));
    assert_ne!(ses_a, ses_b, "each editor session is its own OpenCode session");
    assert_eq!(reply(&a), format!("turn 1 of {ses_a}"));
    assert_eq!(reply(&b), format!("turn 1 of {ses_b}"));
    let again = bridge.prompt(&first, "again");
    assert_eq!(reply(&again), format!("turn 2 of {ses_a}"), "the first conversation goes on");
    assert_eq!(starts(&ws), 1, "the second session started no server");
    assert_eq!(sandboxes(&dirs).len(), 1, "one shared sandbox: {:?}", sandboxes(&dirs));
    assert!(sandboxes(&dirs)[0].starts_with("workspace-"), "{:?}", sandboxes(&dirs));

    // One server took every prompt, each with its session's own agent (mode).
    let prompts = logged(&ws, "prompt");
    let seen: Vec<(String, String)> = prompts
        .iter()
        .map(|p| (p["session"].as_str().unwrap().to_string(), p["agent"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        seen,
        [
            (ses_a.clone(), "build".to_string()),
            (ses_b.clone(), "plan".to_string()),
            (ses_a.clone(), "build".to_string())
        ]
    );
    assert!(prompts.iter().all(|p| p["server"] == prompts[0]["server"]), "{prompts:?}");
    // Each OpenCode session got its own rules: plan mode's deny edits, build's do not.
    let patches = logged(&ws, "patch");
    let rules = |ses: &str| -> Value {
        patches.iter().rfind(|p| p["session"] == ses).map(|p| p["permission"].clone()).unwrap_or(Value::Null)
    };
    let denies_edits =
        |rules: &Value| rules.as_array().unwrap().iter().any(|r| r["permission"] == "edit" && r["action"] == "deny");
    assert!(!denies_edits(&rules(&ses_a)), "{}", rules(&ses_a));
    assert!(denies_edits(&rules(&ses_b)), "{}", rules(&ses_b));
}

#[test]
fn a_session_with_other_approvals_gets_a_server_of_its_own() {
    let dirs = TestDirs::new("shared-approvals");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(serve_options(&dirs));
    let first = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&first, "hello").stop_reason(), "end_turn");
    let second = bridge.new_session(&ws);
    set_option(&mut bridge, &second, "approvals", "ask");
    assert_eq!(bridge.prompt(&second, "hello").stop_reason(), "end_turn");
    assert_eq!(bridge.prompt(&first, "again").stop_reason(), "end_turn");
    assert_eq!(starts(&ws), 2);
    let servers: Vec<Value> = logged(&ws, "prompt").iter().map(|p| p["server"].clone()).collect();
    assert_eq!(servers.len(), 3);
    assert_ne!(servers[0], servers[1], "the ask session's prompt went to the auto server");
    assert_eq!(servers[0], servers[2], "the first session's server was stopped for the second's");
}

#[test]
fn a_cancel_of_one_session_leaves_the_other_sessions_turn_on_the_shared_server_running() {
    let dirs = TestDirs::new("shared-cancel");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(serve_options(&dirs));
    let first = bridge.new_session(&ws);
    let second = bridge.new_session(&ws);
    let a = bridge.send_prompt(&first, "FAULT:slow");
    let b = bridge.send_prompt(&second, "FAULT:slow");
    let tick = |u: &Value| u["content"]["text"].as_str().is_some_and(|t| t.starts_with("tick"));
    bridge.wait_update(&first, "a tick of the first", tick);
    bridge.wait_update(&second, "a tick of the second", tick);
    let server = read_pid_file(&ws, &ws.join(".fake-serve/server.pid")).unwrap();
    bridge.cancel(&first);
    assert_eq!(bridge.finish_turn(&first, a).stop_reason(), "cancelled");
    // The second turn still streams from the same server after the first's answer.
    bridge.take_updates(&second);
    bridge.wait_update(&second, "a tick after the other session's cancel", tick);
    assert!(pid_alive(server), "the shared server was stopped by the other session's cancel");
    bridge.cancel(&second);
    assert_eq!(bridge.finish_turn(&second, b).stop_reason(), "cancelled");
    assert_eq!(starts(&ws), 1);
    let next = bridge.prompt(&first, "hello");
    assert_eq!(next.stop_reason(), "end_turn", "{:?}", next.result);
    assert_eq!(starts(&ws), 1, "the server went on after both cancels");
}

#[test]
fn deleting_one_session_of_a_shared_server_leaves_the_others_and_the_last_takes_the_sandbox() {
    let dirs = TestDirs::new("shared-delete");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(serve_options(&dirs));
    let first = bridge.new_session(&ws);
    let ses_a = opencode_session(&bridge.prompt(&first, "hello"));
    let second = bridge.new_session(&ws);
    let ses_b = opencode_session(&bridge.prompt(&second, "hello"));
    let server = read_pid_file(&ws, &ws.join(".fake-serve/server.pid")).unwrap();

    bridge.request("session/delete", json!({"sessionId": first})).unwrap();
    let deletes = logged(&ws, "delete");
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!((deletes[0]["session"].as_str(), deletes[0]["found"].as_bool()), (Some(ses_a.as_str()), Some(true)));
    assert!(pid_alive(server), "deleting one session stopped the others' server");
    let next = bridge.prompt(&second, "again");
    assert_eq!(reply(&next), format!("turn 2 of {ses_b}"));
    assert_eq!(starts(&ws), 1);
    assert_eq!(sandboxes(&dirs).len(), 1);

    bridge.request("session/delete", json!({"sessionId": second})).unwrap();
    assert!(wait_until(Duration::from_secs(10), || !pid_alive(server)), "the server outlived its last session");
    assert_eq!(sandboxes(&dirs), Vec::<String>::new(), "the shared sandbox outlived its last session");
}

#[test]
fn with_server_scope_session_every_session_has_its_own_server_and_sandbox() {
    let dirs = TestDirs::new("shared-scope-session");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(serve_options(&dirs).arg("--server-scope").arg("session"));
    let first = bridge.new_session(&ws);
    let second = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&first, "hello").stop_reason(), "end_turn");
    assert_eq!(bridge.prompt(&second, "hello").stop_reason(), "end_turn");
    assert_eq!(starts(&ws), 2);
    let servers: Vec<Value> = logged(&ws, "prompt").iter().map(|p| p["server"].clone()).collect();
    assert_ne!(servers[0], servers[1]);
    assert_eq!(sandboxes(&dirs), {
        let mut own = vec![first.clone(), second.clone()];
        own.sort();
        own
    });
}

/// A second editor window (a second bridge on the same data dir) that opens a thread whose server the first runs
/// does not warm a second server on the same OpenCode database; its prompt (the first window being idle) starts
/// one then, and both windows' turns work.
#[test]
fn a_second_window_does_not_warm_a_server_the_first_runs() {
    let dirs = TestDirs::new("shared-two-windows");
    let ws = dirs.workspace("ws");
    let mut first = Bridge::start(serve_options(&dirs));
    let sid = first.new_session(&ws);
    assert_eq!(first.prompt(&sid, "hello").stop_reason(), "end_turn");
    assert_eq!(starts(&ws), 1);

    let mut second = Bridge::start(serve_options(&dirs));
    second.load_session(&sid, &ws).result.expect("load in the second window");
    let skipped = "the OpenCode server was not started ahead of the first prompt: another acp-sandbox (another \
                   editor window) runs this OpenCode server";
    assert!(
        wait_until(Duration::from_secs(20), || second.stderr().contains(skipped)),
        "the second window's background start did not stop at the first's server: {}",
        second.stderr()
    );
    assert_eq!(starts(&ws), 1, "the second window warmed a server of its own");
    let turn = second.prompt(&sid, "from the second window");
    assert_eq!(turn.stop_reason(), "end_turn", "{:?}", turn.result);
    assert_eq!(starts(&ws), 2, "the second window's prompt started its own server");
    assert_eq!(first.prompt(&sid, "back in the first").stop_reason(), "end_turn");
}

/// An "always" answer in one session allows the pattern in that session's own rules from its next turn on, and
/// nowhere else: OpenCode is answered `once` (its own `always` would allow it for every session of the server, and
/// over plan mode's refusals).
#[test]
fn an_always_answer_stays_in_its_session() {
    let dirs = TestDirs::new("shared-always");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(serve_options(&dirs));
    bridge.permission_answer = Some("allow_always".into());
    let first = bridge.new_session(&ws);
    let second = bridge.new_session(&ws);
    set_option(&mut bridge, &first, "approvals", "ask");
    set_option(&mut bridge, &second, "approvals", "ask");
    let asked = bridge.prompt(&first, "FAULT:ask");
    assert_eq!(asked.stop_reason(), "end_turn", "{:?}", asked.result);
    let ses_a = opencode_session(&asked);
    let replies: Vec<Value> = logged(&ws, "reply").iter().map(|r| r["reply"].clone()).collect();
    assert_eq!(replies, [json!("once")]);
    let ses_b = opencode_session(&bridge.prompt(&second, "hello"));
    assert_eq!(bridge.prompt(&first, "again").stop_reason(), "end_turn");
    let servers: Vec<Value> = logged(&ws, "prompt").iter().map(|p| p["server"].clone()).collect();
    assert!(servers.len() == 3 && servers.iter().all(|s| *s == servers[0]), "one server for both: {servers:?}");
    let allowed = json!({"permission": "bash", "pattern": "git status *", "action": "allow"});
    let patches = logged(&ws, "patch");
    let has = |ses: &str| -> Vec<bool> {
        patches
            .iter()
            .filter(|p| p["session"] == ses)
            .map(|p| p["permission"].as_array().unwrap().contains(&allowed))
            .collect()
    };
    // The warm start may give a conversation its rules ahead (on the auto server it starts), then each turn on the
    // ask server: only the first session's last rules carry its answer.
    let first_rules = has(&ses_a);
    assert_eq!(first_rules.last(), Some(&true), "{first_rules:?}");
    assert_eq!(first_rules.iter().filter(|with| **with).count(), 1, "{first_rules:?}");
    let second_rules = has(&ses_b);
    assert!(!second_rules.is_empty() && second_rules.iter().all(|with| !with), "{second_rules:?}");
}

/// A session deleted while no server of its shared sandbox runs (here: in a fresh bridge) has its conversation
/// deleted by the sandbox's next server, before that server's first prompt.
#[test]
fn a_conversation_deleted_while_no_server_runs_is_deleted_by_the_next_server() {
    let dirs = TestDirs::new("shared-delete-later");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(serve_options(&dirs));
    let first = bridge.new_session(&ws);
    let ses_a = opencode_session(&bridge.prompt(&first, "hello"));
    let second = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&second, "hello").stop_reason(), "end_turn");
    bridge.kill9();

    let mut later = Bridge::start(serve_options(&dirs));
    later.request("session/delete", json!({"sessionId": first})).unwrap();
    assert_eq!(logged(&ws, "delete"), Vec::<Value>::new(), "no server ran to delete it on");
    later.load_session(&second, &ws).result.expect("load the other session");
    let turn = later.prompt(&second, "again");
    assert_eq!(turn.stop_reason(), "end_turn", "{:?}", turn.result);
    let deletes: Vec<(Value, Value)> =
        logged(&ws, "delete").iter().map(|d| (d["session"].clone(), d["found"].clone())).collect();
    assert_eq!(deletes, [(json!(ses_a), json!(true))]);
    assert_eq!(sandboxes(&dirs).len(), 1, "the shared sandbox went with a session that was not its last");
}

/// A session's rules live in the sandbox's OpenCode database, which both servers of a sandbox (other approvals)
/// write: every turn gives them again on its own server. Switching `ask` → `auto` → `ask` must not leave the auto
/// rules in force because the ask server remembers having given the ask rules once.
#[test]
fn every_turn_gives_its_rules_again_whatever_another_server_wrote_since() {
    let dirs = TestDirs::new("shared-rules-again");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(serve_options(&dirs));
    // Another ask session keeps the ask server running while the first one is on the auto server.
    let other = bridge.new_session(&ws);
    set_option(&mut bridge, &other, "approvals", "ask");
    assert_eq!(bridge.prompt(&other, "hello").stop_reason(), "end_turn");
    let sid = bridge.new_session(&ws);
    let mut ses = None;
    for approvals in ["ask", "auto", "ask"] {
        set_option(&mut bridge, &sid, "approvals", approvals);
        let turn = bridge.prompt(&sid, "hello");
        assert_eq!(turn.stop_reason(), "end_turn", "{:?}", turn.result);
        ses = Some(opencode_session(&turn));
    }
    let ses = ses.unwrap();
    let asks = |p: &Value| p["permission"].as_array().unwrap().iter().any(|r| r["action"] == "ask");
    let given: Vec<(bool, Value)> =
        logged(&ws, "patch").iter().filter(|p| p["session"] == ses).map(|p| (asks(p), p["server"].clone())).collect();
    let prompts: Vec<Value> =
        logged(&ws, "prompt").iter().filter(|p| p["session"] == ses).map(|p| p["server"].clone()).collect();
    assert_eq!(
        given,
        [(true, prompts[0].clone()), (false, prompts[1].clone()), (true, prompts[2].clone())],
        "each turn's own rules, on its own server"
    );
    assert_eq!(prompts[0], prompts[2], "the ask server served both ask turns");
}
