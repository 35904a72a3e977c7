//! `--keep-warm`: the real `opencode serve` outlives its bridge, the next bridge adopts it (no server start, the
//! conversation intact), it ends on its own after the linger, and a stale record (a changed password, a server
//! killed while no bridge ran) makes the next bridge start a fresh one. A bridge without `--keep-warm` stops what
//! an earlier one kept.

use super::*;

/// The OpenCode servers (not their sandbox's first process) running in this test's directories.
fn servers(world: &World) -> Vec<i32> {
    let mut pids: Vec<i32> = processes_under(world.root.path())
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(" serve --hostname") && !cmd.contains("sandbox-init"))
        .map(|(pid, _)| pid)
        .collect();
    pids.sort();
    pids
}

fn keeping(world: &World, sandbox: &str, linger: &str) -> BridgeOptions {
    world.backend_options(sandbox, "serve").env("ACP_SANDBOX_KEEP_WARM", linger)
}

/// The records kept servers left in the data dir's run dir.
fn records(world: &World) -> Vec<PathBuf> {
    let dir = world.data.join("run/warm");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    found.sort();
    found
}

/// Ends a bridge as an editor does when it quits: stdin closes, the bridge exits by itself.
fn quit(mut bridge: Bridge) {
    bridge.close_stdin();
    assert!(bridge.wait_exit(Duration::from_secs(30)).is_some(), "the bridge did not exit: {}", bridge.stderr());
}

/// One prompt and its first reply in a fresh thread; then the editor quits.
fn first_thread(world: &World, options: BridgeOptions, ws: &Path) -> String {
    let mut bridge = world.start_with(options);
    let sid = bridge.new_session(ws);
    let turn = timed_prompt(&mut bridge, &sid, ws, "SCENARIO:text Say hello", "first bridge");
    assert_end_turn(&bridge, &turn);
    quit(bridge);
    sid
}

/// The thread reopened in a fresh bridge and continued.
fn reopen_and_continue(world: &World, options: BridgeOptions, ws: &Path, sid: &str, label: &str) -> Bridge {
    let mut bridge = world.start_with(options);
    bridge.load_session(sid, ws);
    let turn = timed_prompt(&mut bridge, sid, ws, "SCENARIO:followup Do you remember?", label);
    assert_end_turn(&bridge, &turn);
    assert_eq!(
        of_kind(&turn.updates, "agent_message_chunk")
            .into_iter()
            .filter(|u| u.get("messageId").is_some())
            .map(|u| u["content"]["text"].as_str().unwrap_or("").to_string())
            .collect::<String>(),
        "FOLLOWUP-OK: I remember the earlier turn.",
        "{:#?}",
        turn.updates
    );
    assert_continued(&world.server, "SCENARIO:text Say hello", "PLAIN-ANSWER-OK");
    bridge
}

/// `doctor` names the kept server: its workspace, the process that holds its sandbox, when it started and its
/// linger.
fn assert_doctor_lists(world: &World, record: &Path, server: i32) {
    let record: Value = serde_json::from_str(&std::fs::read_to_string(record).unwrap()).unwrap();
    let pid = record["pid"].as_i64().unwrap();
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "the record names a live process, {pid} (the server is {server})"
    );
    let started = std::time::UNIX_EPOCH + Duration::from_millis(record["started_ms"].as_u64().unwrap());
    let (code, out, err) = doctor_with(&world.data, &[], &[("ACP_SANDBOX_KEEP_WARM", "120")]);
    assert!(code.is_some(), "doctor ran: {err}");
    assert_eq!(
        doctor_section(&out, "keep warm"),
        vec![
            "keep warm   a warm server outlives its editor for 2m (--keep-warm)".to_string(),
            format!(
                "            {}: pid {pid}, started {}, ends 120 s after its last bridge let go of it",
                record["workspace"].as_str().unwrap(),
                humantime::format_rfc3339_seconds(started)
            ),
        ],
        "{out}"
    );
}

/// The editor quits and comes back: the server it left runs on and the next bridge uses it, across a graceful
/// quit and a SIGKILL alike; a bridge without `--keep-warm` then stops it.
fn adopted(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let sid = first_thread(&world, keeping(&world, sandbox, "120"), &ws);
    let kept = servers(&world);
    assert_eq!(kept.len(), 1, "the server outlived its bridge: {kept:?}");
    assert_eq!(records(&world).len(), 1, "one record of it: {:?}", records(&world));
    assert_doctor_lists(&world, &records(&world)[0], kept[0]);
    let mut second = reopen_and_continue(&world, keeping(&world, sandbox, "120"), &ws, &sid, "reopened, kept warm");
    assert_eq!(servers(&world), kept, "the reopened thread ran on the kept server, none was started");
    second.kill9();
    let _ = second.wait_exit(Duration::from_secs(10));
    assert!(!wait_until(Duration::from_secs(3), || servers(&world) != kept), "the SIGKILL ended the kept server");
    let third = world.start_with(world.backend_options(sandbox, "serve"));
    assert!(
        wait_until(Duration::from_secs(20), || servers(&world).is_empty()),
        "a bridge without --keep-warm left the kept server running: {:?}",
        servers(&world)
    );
    assert!(records(&world).is_empty(), "its record is gone: {:?}", records(&world));
    quit(third);
}

#[test]
fn keep_warm_the_next_bridge_adopts_the_server_none() {
    adopted("none", "keep_warm_adopted_none");
}

#[test]
fn keep_warm_the_next_bridge_adopts_the_server_bwrap() {
    if bwrap_ok("keep_warm_adopted_bwrap") {
        adopted("bwrap", "keep_warm_adopted_bwrap");
    }
}

/// With no bridge, a kept server ends itself once its linger has passed.
fn expires(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    first_thread(&world, keeping(&world, sandbox, "5s"), &ws);
    assert_eq!(servers(&world).len(), 1, "kept after the quit");
    assert!(
        wait_until(Duration::from_secs(60), || servers(&world).is_empty()),
        "the kept server outlived its linger: {:?}",
        servers(&world)
    );
    assert_no_processes_under(world.root.path(), "after the linger");
}

#[test]
fn keep_warm_a_kept_server_ends_after_its_linger_none() {
    expires("none", "keep_warm_expires_none");
}

#[test]
fn keep_warm_a_kept_server_ends_after_its_linger_bwrap() {
    if bwrap_ok("keep_warm_expires_bwrap") {
        expires("bwrap", "keep_warm_expires_bwrap");
    }
}

/// A record whose password the server does not take, and a server killed while no bridge ran: the next bridge
/// starts a fresh server (the conversation continues), and the stale one is gone.
fn stale(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let options = || keeping(&world, sandbox, "120");
    let sid = first_thread(&world, options(), &ws);
    let kept = servers(&world);
    assert_eq!(kept.len(), 1, "kept: {kept:?}");
    let [record] = records(&world).try_into().unwrap();
    let mut written: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    written["secret"] = json!("not-the-servers-password");
    std::fs::write(&record, serde_json::to_vec(&written).unwrap()).unwrap();
    let second = reopen_and_continue(&world, options(), &ws, &sid, "a stale password");
    let fresh = servers(&world);
    assert_eq!(fresh.len(), 1, "one server: {fresh:?}");
    assert_ne!(fresh, kept, "the server that refused the recorded password was replaced");
    assert!(!pid_alive(kept[0]), "and ended");
    quit(second);
    assert_eq!(servers(&world), fresh, "the fresh one is kept in turn");
    for pid in &fresh {
        let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(wait_until(Duration::from_secs(20), || servers(&world).is_empty()), "killed");
    let third = reopen_and_continue(&world, options(), &ws, &sid, "after the kept server was killed");
    assert_eq!(servers(&world).len(), 1, "a fresh server: {:?}", servers(&world));
    assert_ne!(servers(&world), fresh);
    quit(third);
    let last = world.start_with(world.backend_options(sandbox, "serve"));
    assert!(wait_until(Duration::from_secs(20), || servers(&world).is_empty()), "stopped by a bridge that keeps none");
    quit(last);
}

#[test]
fn keep_warm_a_stale_record_starts_a_fresh_server_none() {
    stale("none", "keep_warm_stale_none");
}

#[test]
fn keep_warm_a_stale_record_starts_a_fresh_server_bwrap() {
    if bwrap_ok("keep_warm_stale_bwrap") {
        stale("bwrap", "keep_warm_stale_bwrap");
    }
}
