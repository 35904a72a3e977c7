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
