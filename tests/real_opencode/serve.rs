//! The real OpenCode driven through a warm `opencode serve` per session (the default backend): live tokens, live
//! command output, follow-ups, cancel, approvals, the idle stop, and no server outliving a killed bridge.

use super::*;

fn serve(world: &World, sandbox: &str) -> Bridge {
    world.start_with(world.backend_options(sandbox, "serve"))
}

/// The text of the model's own chunks (ours, such as the no-sandbox note, carry no message id), in order.
fn model_chunks(updates: &[Value]) -> Vec<String> {
    of_kind(updates, "agent_message_chunk")
        .into_iter()
        .filter(|u| u.get("messageId").is_some())
        .map(|u| u["content"]["text"].as_str().unwrap_or("").to_string())
        .collect()
}

/// OpenCode servers (and their sandbox's first process) running in this test's directories.
pub(super) fn servers_of(world: &World) -> Vec<(i32, String)> {
    processes_under(world.root.path()).into_iter().filter(|(_, cmd)| cmd.contains(" serve --hostname")).collect()
}

fn serve_followup(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = serve(&world, sandbox);
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text Say hello", "1 (serve, first prompt)");
    assert_end_turn(&bridge, &turn);
    assert_eq!(
        model_chunks(&turn.updates).concat(),
        "Hello from the fake model. PLAIN-ANSWER-OK",
        "{:#?}",
        turn.updates
    );
    // The model picker comes from the warm server (no separate `opencode models` run): a changed list is sent.
    let listed = match turn.updates.iter().find(|u| u["sessionUpdate"] == "config_option_update") {
        Some(update) => update.clone(),
        None => bridge.wait_update(&sid, "config_option_update", |u| u["sessionUpdate"] == "config_option_update"),
    };
    let offered: Vec<&str> = listed["configOptions"][0]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["value"].as_str().unwrap())
        .collect();
    assert_eq!(offered[0], "default", "{listed}");
    assert!(offered.contains(&"fake/fake-model") && offered.contains(&"fake/other-model"), "{offered:?}");
    assert!(offered.len() > 3, "the server's providers add their models to the config's: {offered:?}");
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:followup Do you remember?", "2 (serve, follow-up)");
    assert_end_turn(&bridge, &turn);
    assert_eq!(model_chunks(&turn.updates).concat(), "FOLLOWUP-OK: I remember the earlier turn.");
    assert_continued(&world.server, "SCENARIO:text Say hello", "PLAIN-ANSWER-OK");
    assert_eq!(
        servers_of(&world).iter().filter(|(_, cmd)| !cmd.contains("sandbox-init")).count(),
        1,
        "one warm server for the session: {:?}",
        servers_of(&world)
    );
    // OpenCode found the plugin package its config dir needs (the install's, shown there): it installed nothing
    // from npm into the session's state (a fresh config dir otherwise gets 64 MiB, and the first prompt waits).
    let config = support::sandbox_state(&world.data, &sid).join("config/opencode");
    assert!(config.join("node_modules").is_dir(), "the install's packages are shown in {}", config.display());
    assert_eq!(bytes_written_under(&config.join("node_modules")), 0, "npm wrote into {}", config.display());
}

/// The bytes of the regular files under `dir`, not following links (the shown entries are links without a sandbox
/// and empty mount points under bubblewrap).
pub(super) fn bytes_written_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => bytes_written_under(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[test]
fn serve_answers_and_continues_none() {
    serve_followup("none", "serve_answers_and_continues_none");
}

#[test]
fn serve_answers_and_continues_bwrap() {
    if bwrap_ok("serve_answers_and_continues_bwrap") {
        serve_followup("bwrap", "serve_answers_and_continues_bwrap");
    }
}

/// OpenCode's warm server in the Landlock sandbox: reached through `sandbox-init`'s door, not by its tools.
#[test]
fn serve_answers_and_continues_landlock() {
    serve_followup("landlock", "serve_answers_and_continues_landlock");
}

fn tokens_and_live_output(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = serve(&world, sandbox);
    let sid = bridge.new_session(&ws);

    // Ten pieces 200 ms apart: each is its own chunk, in order.
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:tokens:10 stream", "tokens");
    assert_end_turn(&bridge, &turn);
    let expected: Vec<String> = (0..10).map(|i| format!("tok{i} ")).collect();
    assert_eq!(model_chunks(&turn.updates), expected, "one chunk per piece the model sent: {:#?}", turn.updates);

    // A command printing a line a second: its output reaches the editor while it runs.
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:livebash:5 tick", "livebash");
    assert_end_turn(&bridge, &turn);
    let updates = &turn.updates;
    let call = updates
        .iter()
        .find(|u| u["sessionUpdate"] == "tool_call" && u["kind"] == "execute")
        .unwrap_or_else(|| panic!("no execute tool call: {updates:#?}"));
    let id = call["toolCallId"].clone();
    let of_call: Vec<&Value> = updates.iter().filter(|u| u["toolCallId"] == id).collect();
    let completed_at = of_call
        .iter()
        .position(|u| u["status"] == "completed")
        .unwrap_or_else(|| panic!("the command never completed: {of_call:#?}"));
    let live: Vec<String> = of_call[..completed_at]
        .iter()
        .filter_map(|u| u["content"].as_array())
        .map(|content| content.iter().map(|c| c["content"]["text"].as_str().unwrap_or("")).collect::<String>())
        .filter(|text| text.contains("tick"))
        .collect();
    assert!(
        live.len() >= 3,
        "at least three updates of the running command's output before it completed: {of_call:#?}"
    );
    for (earlier, later) in live.iter().zip(live.iter().skip(1)) {
        assert!(later.len() >= earlier.len(), "the output so far only grows: {live:#?}");
    }
    assert!(live.last().is_some_and(|text| text.contains("tick4")), "{live:#?}");
    assert_eq!(model_chunks(updates).concat(), "LIVEBASH-DONE");
}

#[test]
fn serve_streams_tokens_and_live_command_output_none() {
    tokens_and_live_output("none", "serve_streams_tokens_and_live_command_output_none");
}

#[test]
fn serve_streams_tokens_and_live_command_output_bwrap() {
    if bwrap_ok("serve_streams_tokens_and_live_command_output_bwrap") {
        tokens_and_live_output("bwrap", "serve_streams_tokens_and_live_command_output_bwrap");
    }
}

/// A long command's cancel through `backend` (`serve`, `acp`): `cancelled`, the command and the daemon it started
/// with `setsid` gone, and the conversation goes on.
pub(super) fn cancel_running_command(backend: &str, sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start_with(world.backend_options(sandbox, backend));
    let sid = bridge.new_session(&ws);
    let n = 100_000 + u32::from(world.server.port) * 2 + u32::from(sandbox == "bwrap");
    let (child_arg, grandchild_arg) = (n.to_string(), (n + 1).to_string());
    let child_argv = ["sleep", child_arg.as_str()];
    let grandchild_argv = ["sleep", grandchild_arg.as_str()];
    let id = bridge.send_prompt(&sid, &format!("SCENARIO:longbash:{n} run something long"));
    let started = wait_until(TURN_LIMIT, || {
        !processes_with_argv(&child_argv).is_empty() && !processes_with_argv(&grandchild_argv).is_empty()
    });
    let leftovers = || [processes_with_argv(&child_argv), processes_with_argv(&grandchild_argv)].concat();
    let _guards: Vec<KillOnDrop> = leftovers().into_iter().map(KillOnDrop).collect();
    if !started {
        bridge.fail("the long command did not start");
    }
    bridge.cancel(&sid);
    let turn = finish_served_turn(&mut bridge, &sid, id);
    match &turn.result {
        Ok(result) if result["stopReason"] == "cancelled" => {}
        other => bridge.fail(&format!("expected cancelled, got {other:?}")),
    }
    let gone = wait_until(Duration::from_secs(10), || leftovers().is_empty());
    assert!(gone, "the command and the daemon it started survived the cancel: {:?}", leftovers());
    // The conversation goes on (on the same server, or a fresh one on the same database).
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:followup still there?", "after cancel");
    assert_end_turn(&bridge, &turn);
    assert_eq!(agent_text_without_notes(&turn.updates), "FOLLOWUP-OK: I remember the earlier turn.");
}

/// The agent's text without the bridge's own notes (`_…_` chunks).
pub(super) fn agent_text_without_notes(updates: &[Value]) -> String {
    of_kind(updates, "agent_message_chunk")
        .into_iter()
        .filter_map(|u| u["content"]["text"].as_str())
        .filter(|text| !text.trim().starts_with('_'))
        .collect()
}

#[test]
fn serve_cancel_ends_the_running_command_none() {
    cancel_running_command("serve", "none", "serve_cancel_ends_the_running_command_none");
}

#[test]
fn serve_cancel_ends_the_running_command_bwrap() {
    if bwrap_ok("serve_cancel_ends_the_running_command_bwrap") {
        cancel_running_command("serve", "bwrap", "serve_cancel_ends_the_running_command_bwrap");
    }
}

/// `ask` approvals: OpenCode's permission request reaches the editor; allow runs the command, reject does not.
fn approvals(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = serve(&world, sandbox);
    let sid = bridge.new_session(&ws);
    let set =
        bridge.request("session/set_config_option", json!({"sessionId": sid, "configId": "approvals", "value": "ask"}));
    assert!(set.is_ok(), "{set:?}");

    bridge.permission_answer = Some("reject_once".into());
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:tools write then run", "ask, rejected");
    assert_eq!(
        bridge.permission_requests.len(),
        1,
        "one request, then the turn ends: {:#?}",
        bridge.permission_requests
    );
    let asked = &bridge.permission_requests[0];
    assert_eq!(asked["sessionId"], sid.as_str());
    assert_eq!(asked["toolCall"]["toolCallId"], "call_fake_0_0", "{asked:#}");
    let kinds: Vec<&str> = asked["options"].as_array().unwrap().iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["allow_once", "allow_always", "reject_once"]);
    assert!(!ws.join("hello.txt").exists(), "a rejected write must not happen: {:#?}", turn.updates);

    bridge.permission_requests.clear();
    bridge.permission_answer = Some("allow_once".into());
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:tools write then run", "ask, allowed");
    assert_end_turn(&bridge, &turn);
    assert!(
        bridge.permission_requests.len() >= 2,
        "the write and the command were asked: {:#?}",
        bridge.permission_requests
    );
    assert_eq!(std::fs::read_to_string(ws.join("hello.txt")).unwrap(), "hello EDITED by fake model\n");
    assert_eq!(model_chunks(&turn.updates).concat(), "I will write the file.TOOLS-DONE", "{:#?}", turn.updates);
}

#[test]
fn serve_ask_approvals_reach_the_editor_none() {
    approvals("none", "serve_ask_approvals_reach_the_editor_none");
}

#[test]
fn serve_ask_approvals_reach_the_editor_bwrap() {
    if bwrap_ok("serve_ask_approvals_reach_the_editor_bwrap") {
        approvals("bwrap", "serve_ask_approvals_reach_the_editor_bwrap");
    }
}

/// An idle server is stopped; the next prompt starts a fresh one and the conversation continues.
#[test]
fn serve_idle_server_stops_and_the_next_prompt_continues() {
    let Some(world) = World::new("serve_idle_server_stops") else { return };
    let ws = world.workspace("ws");
    let mut bridge =
        world.start_with(world.backend_options("none", "serve").env("ACP_SANDBOX_SERVER_IDLE_TIMEOUT", "2"));
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text Say hello", "before the idle stop");
    assert_end_turn(&bridge, &turn);
    assert!(
        wait_until(Duration::from_secs(30), || servers_of(&world).is_empty()),
        "the idle server still runs: {:?}",
        servers_of(&world)
    );
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:followup Do you remember?", "after the idle stop");
    assert_end_turn(&bridge, &turn);
    assert_continued(&world.server, "SCENARIO:text Say hello", "PLAIN-ANSWER-OK");
}

/// SIGKILL of the bridge (what Zed does) takes the warm server with it.
fn killed_bridge_leaves_no_server(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = serve(&world, sandbox);
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text Say hello", "before the kill");
    assert_end_turn(&bridge, &turn);
    assert!(!servers_of(&world).is_empty(), "a warm server runs after the turn");
    bridge.kill9();
    assert!(
        wait_until(Duration::from_secs(10), || servers_of(&world).is_empty()),
        "the server outlived its bridge: {:?}",
        servers_of(&world)
    );
}

#[test]
fn serve_killed_bridge_leaves_no_server_none() {
    killed_bridge_leaves_no_server("none", "serve_killed_bridge_leaves_no_server_none");
}

#[test]
fn serve_killed_bridge_leaves_no_server_bwrap() {
    if bwrap_ok("serve_killed_bridge_leaves_no_server_bwrap") {
        killed_bridge_leaves_no_server("bwrap", "serve_killed_bridge_leaves_no_server_bwrap");
    }
}

/// With `--max-servers 1`, a second session's server stops the first one's; the first session then continues on a
/// fresh server (OpenCode's database in its state dir keeps the conversation).
#[test]
fn serve_at_most_max_servers_run_and_the_stopped_ones_continue() {
    let Some(world) = World::new("serve_max_servers") else { return };
    let (ws_a, ws_b) = (world.workspace("a"), world.workspace("b"));
    let mut bridge = world.start_with(world.backend_options("none", "serve").env("ACP_SANDBOX_MAX_SERVERS", "1"));
    let a = bridge.new_session(&ws_a);
    let turn = timed_prompt(&mut bridge, &a, &ws_a, "SCENARIO:text Say hello", "session a");
    assert_end_turn(&bridge, &turn);
    let b = bridge.new_session(&ws_b);
    let turn = timed_prompt(&mut bridge, &b, &ws_b, "SCENARIO:tokens:2 hi", "session b");
    assert_end_turn(&bridge, &turn);
    let running = || servers_of(&world).into_iter().filter(|(_, cmd)| !cmd.contains("sandbox-init")).count();
    assert!(wait_until(Duration::from_secs(10), || running() == 1), "one server at most: {:?}", servers_of(&world));
    assert!(processes_under(&ws_a).is_empty(), "session a's server was stopped: {:?}", processes_under(&ws_a));
    let turn = timed_prompt(&mut bridge, &a, &ws_a, "SCENARIO:followup Do you remember?", "session a again");
    assert_end_turn(&bridge, &turn);
    assert_continued(&world.server, "SCENARIO:text Say hello", "PLAIN-ANSWER-OK");
    assert!(wait_until(Duration::from_secs(10), || running() == 1), "still one: {:?}", servers_of(&world));
}

/// Two threads of one workspace share one real `opencode serve`: each has its own OpenCode conversation (the
/// follow-up of the first carries the first's history and none of the second's), and the second thread's prompt
/// starts no server.
fn two_threads_share_a_server(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = serve(&world, sandbox);
    let first = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &first, &ws, "SCENARIO:text Say hello FIRST-THREAD", "first thread");
    assert_end_turn(&bridge, &turn);
    let second = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &second, &ws, "SCENARIO:text Say hello SECOND-THREAD", "new thread");
    assert_end_turn(&bridge, &turn);
    assert_eq!(model_chunks(&turn.updates).concat(), "Hello from the fake model. PLAIN-ANSWER-OK");
    let turn = timed_prompt(&mut bridge, &first, &ws, "SCENARIO:followup Do you remember?", "first, follow-up");
    assert_end_turn(&bridge, &turn);
    assert_eq!(model_chunks(&turn.updates).concat(), "FOLLOWUP-OK: I remember the earlier turn.");
    let followup = world.server.chats("followup");
    let users = messages_text(followup.last().unwrap(), "user");
    assert!(users.iter().any(|u| u.contains("FIRST-THREAD")), "{users:?}");
    assert!(!users.iter().any(|u| u.contains("SECOND-THREAD")), "the other thread's prompt leaked in: {users:?}");
    let running: Vec<_> = servers_of(&world).into_iter().filter(|(_, cmd)| !cmd.contains("sandbox-init")).collect();
    assert_eq!(running.len(), 1, "one server for the workspace's threads: {running:?}");
    assert_eq!(support::sandbox_state(&world.data, &first), support::sandbox_state(&world.data, &second));
}

#[test]
fn serve_threads_of_a_workspace_share_one_server_none() {
    two_threads_share_a_server("none", "shared_none");
}

#[test]
fn serve_threads_of_a_workspace_share_one_server_bwrap() {
    two_threads_share_a_server("bwrap", "shared_bwrap");
}
