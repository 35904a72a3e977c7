//! `session/cancel` and `session/close` end the CLI's whole process tree and the prompt answers `cancelled`.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// Starts a `SCENARIO:child` turn and returns (prompt request id, CLI pid, grandchild pid) once both run.
fn start_turn_with_grandchild(bridge: &mut Bridge, sid: &str, ws: &std::path::Path) -> (i64, i32, i32) {
    let id = bridge.send_prompt(sid, "SCENARIO:child run the test suite in the background");
    let cli = wait_invocations(ws, 1)[0].pid();
    let pid_file = ws.join(".fake-cli/child.pid");
    let mut grandchild = None;
    assert!(
        wait_until(RECV_TIMEOUT, || {
            grandchild = read_pid_file(ws, &pid_file);
            grandchild.is_some()
        }),
        "the fake never started its grandchild"
    );
    let grandchild = grandchild.unwrap_or_default();
    assert!(pid_alive(cli) && pid_alive(grandchild), "CLI {cli}, grandchild {grandchild}");
    (id, cli, grandchild)
}

/// Options whose fake `opencode --version` answers only once the returned file exists. The file is in the
/// probe's scratch workspace, the one directory of the host a probe's sandbox sees.
fn probe_held(dirs: &TestDirs) -> (BridgeOptions, std::path::PathBuf) {
    let hold = dirs.data.join("version-workspace/release");
    let mut options = BridgeOptions::new("opencode", &dirs.data);
    options.env.push(("OPENCODE_FAKE_VERSION_HOLD".into(), hold.display().to_string()));
    (options, hold)
}

/// Waits until the held probe of [`probe_held`] runs; returns its pid.
fn wait_probe(hold: &std::path::Path) -> i32 {
    let (dir, pid_file) = (hold.parent().unwrap_or(hold), hold.with_extension("pid"));
    let mut probe = None;
    let found = wait_until(RECV_TIMEOUT, || {
        probe = read_pid_file(dir, &pid_file);
        probe.is_some()
    });
    assert!(found, "the bridge never probed the version");
    probe.unwrap_or_default()
}

#[test]
fn cancel_kills_the_cli_process_tree_and_the_prompt_answers_cancelled() {
    let dirs = TestDirs::new("cancel");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    let (id, cli, grandchild) = start_turn_with_grandchild(&mut bridge, &sid, &ws);
    let _guards = (KillOnDrop(cli), KillOnDrop(grandchild));

    // The CLI and its grandchild would run forever: only the cancel can answer the prompt (how fast is the bench's).
    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, id);
    assert_eq!(turn.stop_reason(), "cancelled");
    assert!(wait_until(Duration::from_secs(5), || !pid_alive(cli)), "the CLI {cli} survived the cancel");
    assert!(
        wait_until(Duration::from_secs(5), || !pid_alive(grandchild)),
        "the CLI's grandchild {grandchild} (own session, like OpenCode's bash tool) survived the cancel"
    );
    assert_no_processes_under(&ws, "after the cancel");

    let next = bridge.prompt(&sid, "Say hello again");
    assert_eq!(next.stop_reason(), "end_turn", "the session must work after a cancel");
}

#[test]
fn cancel_during_the_first_use_install_answers_cancelled_and_ends_npm() {
    let dirs = TestDirs::new("cancel-install");
    let ws = dirs.workspace("ws");
    let npm_dir = dirs.workspace("npm");
    let mut bridge = Bridge::start(installing_forever(&dirs.data, &npm_dir));
    let sid = bridge.new_session(&ws);
    let id = bridge.send_prompt(&sid, "Say hello");
    let (npm, child) = wait_npm(&npm_dir);
    let _guards = (KillOnDrop(npm), KillOnDrop(child));

    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, id);
    assert_eq!(turn.stop_reason(), "cancelled");
    assert!(
        wait_until(RECV_TIMEOUT, || !pid_alive(npm) && !pid_alive(child)),
        "npm {npm} or its child {child} outlived the cancel"
    );
    let statuses: Vec<String> = turn
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "tool_call_update")
        .map(|u| u["status"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(statuses, vec!["failed".to_string()], "the install's card: {:?}", turn.updates);
    assert!(invocations(&ws).is_empty(), "no CLI may run after the cancel");
}

#[test]
fn a_cancel_sent_right_after_its_prompt_always_cancels_it() {
    let dirs = TestDirs::new("cancel-race");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    // Each cancel may reach the bridge before its prompt's turn started, while the CLI starts or while it hangs:
    // every one must be heard (a lost one leaves the `hang` turn running and its prompt unanswered).
    let stops: Vec<String> = (0..30)
        .map(|_| {
            let id = bridge.send_prompt(&sid, "SCENARIO:hang");
            bridge.cancel(&sid);
            bridge.finish_turn(&sid, id).stop_reason()
        })
        .collect();
    assert_eq!(stops, vec!["cancelled".to_string(); 30]);
    assert_no_processes_under(&ws, "after the cancels");
    // An earlier cancel does not cancel a later prompt.
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn", "the session must work after the cancels");
}

#[test]
fn cancel_while_the_cli_is_still_being_probed_answers_cancelled_and_no_cli_runs() {
    let dirs = TestDirs::new("cancel-probe");
    let ws = dirs.workspace("ws");
    let (options, hold) = probe_held(&dirs);
    let mut bridge = Bridge::start(options);
    let _guard = KillOnDrop(wait_probe(&hold));
    let sid = bridge.new_session(&ws);
    // The turn waits for the version before it starts the CLI: the cancel must end it there.
    let id = bridge.send_prompt(&sid, "Say hello");
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, id).stop_reason(), "cancelled");
    assert!(invocations(&ws).is_empty(), "no CLI may run for a cancelled prompt");

    std::fs::write(&hold, b"").unwrap();
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn", "the session must work after the cancel");
}

#[test]
fn cancel_of_an_idle_session_is_harmless() {
    let dirs = TestDirs::new("cancel-idle");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    bridge.cancel(&sid);
    bridge.cancel("no-such-session");
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
}

#[test]
fn closing_a_session_cancels_its_running_turn() {
    let dirs = TestDirs::new("close");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    let (id, cli, grandchild) = start_turn_with_grandchild(&mut bridge, &sid, &ws);
    let _guards = (KillOnDrop(cli), KillOnDrop(grandchild));

    let closed = bridge.request("session/close", json!({"sessionId": sid}));
    assert!(closed.is_ok(), "session/close: {closed:?}");
    let turn = bridge.finish_turn(&sid, id);
    assert_eq!(turn.stop_reason(), "cancelled");
    assert!(wait_until(Duration::from_secs(5), || !pid_alive(grandchild)), "the grandchild survived the close");
}

#[test]
fn amp_cancel_kills_the_grandchild_amp_leaves_behind() {
    let dirs = TestDirs::new("amp-cancel-tree");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("amp", &dirs.data));
    let sid = bridge.new_session(&ws);
    let (id, cli, grandchild) = start_turn_with_grandchild(&mut bridge, &sid, &ws);
    let _guards = (KillOnDrop(cli), KillOnDrop(grandchild));
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, id).stop_reason(), "cancelled");
    assert!(wait_until(Duration::from_secs(5), || !pid_alive(grandchild)), "Amp's grandchild survived the cancel");
    assert_no_processes_under(&ws, "after the cancel");
}

#[test]
fn cancel_inside_bwrap_ends_every_process_of_the_turn() {
    if let Err(why) = bwrap_usable() {
        eprintln!("SKIPPED cancel_inside_bwrap_ends_every_process_of_the_turn: {why}");
        return;
    }
    let dirs = TestDirs::new("bwrap-cancel");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data).sandbox("bwrap"));
    let sid = bridge.new_session(&ws);
    let id = bridge.send_prompt(&sid, "SCENARIO:child run the test suite in the background");
    let pid_file = ws.join(".fake-cli/child.pid");
    assert!(wait_until(RECV_TIMEOUT, || pid_file.exists()), "the fake never started its grandchild");
    // The pid file is written by the fake right after the fork; the exec of `sleep` may still be under way.
    assert!(
        wait_until(Duration::from_secs(5), || processes_under(&ws)
            .iter()
            .any(|(_, cmd)| cmd.starts_with("sleep 1000"))),
        "the sandboxed grandchild is not visible: {:?}",
        processes_under(&ws)
    );
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, id).stop_reason(), "cancelled");
    assert_no_processes_under(&ws, "after the cancel");
}

#[test]
fn processes_of_a_killed_bridge_end_with_it_and_the_next_bridge_continues() {
    // Without bubblewrap nothing takes down a grandchild in its own session when the bridge is SIGKILLed
    // (what Zed does); the next bridge on the data dir finds it by its HOME and ends it.
    let dirs = TestDirs::new("leftovers");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    let (_, cli, grandchild) = start_turn_with_grandchild(&mut bridge, &sid, &ws);
    let _guards = (KillOnDrop(cli), KillOnDrop(grandchild));
    bridge.kill9();
    assert!(wait_until(Duration::from_secs(5), || !pid_alive(cli)), "the CLI dies with its bridge");
    // The CLI's supervisor (the bridge's own binary as its subreaper) takes its descendants along.
    assert!(
        wait_until(Duration::from_secs(5), || !pid_alive(grandchild)),
        "a daemon of the CLI outlived the killed bridge"
    );

    let mut next = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    assert!(
        wait_until(Duration::from_secs(5), || !pid_alive(grandchild)),
        "the next bridge must end what the killed one left running"
    );
    let load = next.load_session(&sid, &ws);
    assert!(load.result.is_ok(), "{:?}", load.result);
    assert_eq!(next.prompt(&sid, "Say hello").stop_reason(), "end_turn");
}

#[test]
fn another_bridge_or_a_sessions_command_leaves_a_live_bridges_processes_alone() {
    // The first bridge's version probe (a process carrying a sandbox's HOME, with no turn recorded for it) and a
    // turn waiting behind it run while a `sessions list` and a second serving bridge start on the same data dir.
    let dirs = TestDirs::new("live-owner");
    let ws = dirs.workspace("ws");
    let (options, hold) = probe_held(&dirs);
    let mut first = Bridge::start(options);
    let probe = wait_probe(&hold);
    let _guard = KillOnDrop(probe);
    let sid = first.new_session(&ws);
    let id = first.send_prompt(&sid, "Say hello");

    let listed = std::process::Command::new(bridge_bin())
        .args(["sessions", "list", "--data-dir"])
        .arg(&dirs.data)
        .env("ACP_SANDBOX_OPENCODE_BIN", fakes_dir().join("opencode"))
        .env_remove("ACP_SANDBOX_AGENT")
        .env_remove("ACP_SANDBOX_DATA_DIR")
        .output()
        .unwrap();
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    assert!(pid_alive(probe), "`sessions list` killed the first bridge's process {probe}");
    // A serving bridge reaps before it answers `initialize`.
    let mut second = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    assert!(pid_alive(probe), "a second bridge killed the first bridge's process {probe}");

    std::fs::write(&hold, b"").unwrap();
    assert_eq!(first.finish_turn(&sid, id).stop_reason(), "end_turn", "the first bridge's turn ends normally");
    let other = second.new_session(&ws);
    assert_eq!(second.prompt(&other, "Say hello").stop_reason(), "end_turn");
}

#[test]
fn cancel_request_for_a_running_prompt_cancels_the_turn() {
    let dirs = TestDirs::new("cancel-request");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    let (id, cli, grandchild) = start_turn_with_grandchild(&mut bridge, &sid, &ws);
    let _guards = (KillOnDrop(cli), KillOnDrop(grandchild));
    bridge.notify("$/cancel_request", json!({"requestId": id}));
    let turn = bridge.finish_turn(&sid, id);
    assert_eq!(turn.stop_reason(), "cancelled");
    assert!(wait_until(Duration::from_secs(5), || !pid_alive(grandchild)), "the CLI's tree survived");
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
}
