//! How a session of the real OpenCode starts: an OpenCode of the user's own (found on PATH, not installed by the
//! bridge) gets the plugin package it wants from the bridge's tools cache, so that a new workspace without a
//! network answers its first prompt at once instead of waiting on npm in the sandbox.

use super::*;

/// The user's own OpenCode: the installed binary, linked (or copied) into a folder of its own that is put on PATH,
/// away from the npm prefix that brings the plugin package.
fn own_opencode(world: &World) -> PathBuf {
    let dir = world.root.path().join("own-bin");
    std::fs::create_dir_all(&dir).unwrap();
    let real = world.opencode.canonicalize().unwrap();
    let own = dir.join("opencode");
    if std::fs::hard_link(&real, &own).is_err() {
        std::fs::copy(&real, &own).unwrap();
    }
    dir
}

fn own_opencode_without_network(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let bin = own_opencode(&world);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let options = world
        .backend_options(sandbox, "serve")
        .without_env("ACP_SANDBOX_OPENCODE_BIN")
        .env("PATH", &path)
        .arg("--network")
        .arg("none");
    let mut bridge = world.start_with(options);
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text Say hello", "own OpenCode, no network");
    assert_end_turn(&bridge, &turn);
    assert!(turn.agent_text().contains("PLAIN-ANSWER-OK"), "{:#?}", turn.updates);
    assert_eq!(world.server.chats("text").len(), 1, "{:#?}", world.server.requests());
    // One copy of the plugin package for this OpenCode's version, in the bridge's tools cache.
    let copy = world.data.join(format!("tools/@opencode-ai+plugin@{OPENCODE_VERSION}"));
    let manifest = std::fs::read_to_string(copy.join("node_modules/@opencode-ai/plugin/package.json")).unwrap();
    assert!(manifest.contains(&format!("\"version\": \"{OPENCODE_VERSION}\"")), "{manifest}");
    // Shown in the session's config dir, where OpenCode installed nothing (it would have waited on npm first).
    let config = support::sandbox_state(&world.data, &sid).join("config/opencode");
    assert!(config.join("node_modules").is_dir(), "the tools cache's packages are shown in {}", config.display());
    assert_eq!(serve::bytes_written_under(&config.join("node_modules")), 0, "npm wrote into {}", config.display());
    // An install the turn waited for said so in the thread, and finished.
    for card in turn.updates.iter().filter(|u| u["toolCallId"] == "install-@opencode-ai/plugin") {
        assert_ne!(card["status"], "failed", "{card}");
    }
}

#[test]
fn own_opencode_answers_without_network_and_installs_nothing_in_the_sandbox_bwrap() {
    if bwrap_ok("own_opencode_no_network_bwrap") {
        own_opencode_without_network("bwrap", "own_opencode_no_network_bwrap");
    }
}

#[test]
fn own_opencode_answers_without_network_and_installs_nothing_in_the_sandbox_none() {
    own_opencode_without_network("none", "own_opencode_no_network_none");
}

/// OpenCode's server frozen (`SIGSTOP`) mid-turn: the cancel answers; once the server is resumed the next prompt is
/// answered too (on that server or a fresh one), never left hanging.
fn frozen_then_resumed(sandbox: &str, ended_by: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut options = world.backend_options(sandbox, "serve");
    if ended_by == "timeout" {
        // Long enough for the next prompt's fresh server on a loaded machine (its cold start is counted).
        options = options.arg("--idle-timeout").arg("30");
    }
    let mut bridge = world.start_with(options);
    let sid = bridge.new_session(&ws);
    let n = 200_000 + u32::from(world.server.port) * 2 + u32::from(sandbox == "bwrap");
    let arg = n.to_string();
    let id = bridge.send_prompt(&sid, &format!("SCENARIO:longbash:{n} run something long"));
    if !wait_until(TURN_LIMIT, || !processes_with_argv(&["sleep", arg.as_str()]).is_empty()) {
        bridge.fail("the long command did not start");
    }
    let servers: Vec<i32> = serve::servers_of(&world)
        .into_iter()
        .filter(|(_, cmd)| !cmd.contains("sandbox-init") && !cmd.contains("bwrap"))
        .map(|(pid, _)| pid)
        .collect();
    assert_eq!(servers.len(), 1, "{:?}", serve::servers_of(&world));
    let server = nix::unistd::Pid::from_raw(servers[0]);
    nix::sys::signal::kill(server, nix::sys::signal::Signal::SIGSTOP).unwrap();
    if ended_by == "cancel" {
        bridge.cancel(&sid);
        let turn = finish_served_turn(&mut bridge, &sid, id);
        assert_eq!(turn.result.as_ref().map(|r| r["stopReason"].clone()).ok(), Some("cancelled".into()), "{turn:?}");
    } else {
        let turn = finish_served_turn(&mut bridge, &sid, id);
        let error = turn.result.as_ref().expect_err("the idle timeout ends the turn");
        assert!(error.message.contains("no output for 30 s"), "{error:?}");
    }
    // Resumed, if the bridge left it running.
    let _ = nix::sys::signal::kill(server, nix::sys::signal::Signal::SIGCONT);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:followup still there?", "after a frozen server");
    assert_end_turn(&bridge, &turn);
    assert_eq!(serve::agent_text_without_notes(&turn.updates), "FOLLOWUP-OK: I remember the earlier turn.");
}

#[test]
fn a_frozen_server_resumed_after_a_cancel_answers_the_next_prompt_bwrap() {
    if bwrap_ok("frozen_server_bwrap") {
        frozen_then_resumed("bwrap", "cancel", "frozen_server_bwrap");
    }
}

#[test]
fn a_frozen_server_resumed_after_a_cancel_answers_the_next_prompt_none() {
    frozen_then_resumed("none", "cancel", "frozen_server_none");
}

#[test]
fn a_frozen_server_resumed_after_a_timeout_answers_the_next_prompt_bwrap() {
    if bwrap_ok("frozen_server_timeout_bwrap") {
        frozen_then_resumed("bwrap", "timeout", "frozen_server_timeout_bwrap");
    }
}
