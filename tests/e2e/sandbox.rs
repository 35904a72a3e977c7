//! The bubblewrap sandbox: the CLI runs in the workspace, can write there, and cannot write elsewhere on the host.
//! Skipped (with the reason printed) where unprivileged bubblewrap does not work. And what a bridge leaves for the
//! next one (kept-warm records) is believed only for what a bridge made.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::*;

#[test]
fn bwrap_sandbox_runs_the_cli_in_the_workspace_and_confines_its_writes() {
    if let Err(why) = bwrap_usable() {
        eprintln!("SKIPPED bwrap_sandbox_runs_the_cli_in_the_workspace_and_confines_its_writes: {why}");
        return;
    }
    let dirs = TestDirs::new("bwrap");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data).sandbox("bwrap"));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:probe Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert!(turn.agent_text().contains("Hello from the fake model"), "{:?}", turn.updates);

    let run = &invocations(&ws)[0];
    assert_eq!(run.cwd(), ws, "the workspace appears at the same path inside the sandbox");
    assert_eq!(run.env("PWD").as_deref(), ws.to_str());

    let probe: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ws.join(".fake-cli/probe.json")).unwrap()).unwrap();
    assert_eq!(probe["workspace"]["writable"], true, "{probe:#}");
    assert_eq!(probe["home"]["writable"], true, "HOME is the session's writable state dir: {probe:#}");
    assert_eq!(probe["workspace_parent"]["writable"], false, "writes outside the workspace: {probe:#}");
    let tmp_file = std::path::PathBuf::from(probe["tmp"]["path"].as_str().unwrap());
    let leaked = tmp_file.exists();
    let _ = std::fs::remove_file(&tmp_file);
    assert!(!leaked, "the sandbox's /tmp is the host's /tmp: {probe:#}");

    let next = bridge.prompt(&sid, "Do you remember?");
    assert_eq!(next.stop_reason(), "end_turn");
    assert_eq!(
        invocations(&ws)[1].flag_value("--session"),
        Some(run.cli_session()),
        "the follow-up continues the CLI session inside the sandbox"
    );
}

/// The start time of `pid` (`/proc/<pid>/stat`'s 22nd field), as a kept-warm record names it.
fn start_time(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = stat.rsplit_once(')').unwrap().1;
    after_name.split_whitespace().nth(19).unwrap().parse().unwrap()
}

/// Where a bridge files the kept-warm record of `key` (the first 16 hex digits of its SHA-256).
fn record_file(run: &Path, key: &str) -> PathBuf {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    run.join("warm").join(format!("{}.json", &hex[..16]))
}

#[test]
fn a_forged_kept_warm_record_makes_the_next_bridge_delete_and_kill_nothing() {
    let dirs = TestDirs::new("forged-record");
    let run = dirs.data.join("run");
    std::fs::create_dir_all(run.join("warm")).unwrap();
    std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    // Some process of the user's and a file of theirs, named by records nobody's bridge wrote.
    let mut victim = std::process::Command::new("sleep").arg("120").spawn().unwrap();
    let pid = i32::try_from(victim.id()).unwrap();
    let precious = dirs.root().join("precious.txt");
    std::fs::write(&precious, "keep me").unwrap();
    let in_run_dir = run.join("0123456789ab.door");
    std::fs::write(&in_run_dir, "a door's place").unwrap();
    let forged = |key: &str, door: &Path, proxy: Option<&Path>| {
        json!({
            "key": key, "sandbox": "workspace-0001", "workspace": "/ws", "fingerprint": "f", "settings": "s",
            "pid": pid, "start": start_time(pid), "door": door, "proxy_socket": proxy, "cgroups": [],
            "secret": "guessed", "linger_secs": 600, "started_ms": 1,
        })
    };
    let records = [
        // Its paths are the user's own file: never deleted.
        (record_file(&run, "one"), forged("one", &precious, Some(&precious))),
        // Shaped as a bridge makes them, but the process was never started by a bridge: not killed.
        (record_file(&run, "two"), forged("two", &in_run_dir, None)),
    ];
    for (path, record) in &records {
        std::fs::write(path, record.to_string()).unwrap();
    }
    // Leftovers are looked at before the bridge answers `initialize`.
    let bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    assert!(pid_alive(pid), "the forged record's process was killed: {}", bridge.stderr());
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    for (path, _) in &records {
        assert!(!path.exists(), "{} is forgotten", path.display());
    }
    let _ = victim.kill();
    let _ = victim.wait();
}
