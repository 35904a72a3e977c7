//! The terminal commands of the binary: `prompt` (one turn, `--json` prints ACP notifications), `sessions
//! list|show|rm` and `doctor`.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::schema::Schemas;
use crate::support::*;

/// Runs `acp-sandbox <args> --data-dir <data>` in `cwd` with the fake CLIs; fails the test unless it exits 0.
fn run(args: &[&str], data: &Path, cwd: &Path) -> Output {
    let output = Command::new(bridge_bin())
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .current_dir(cwd)
        .env("ACP_SANDBOX_OPENCODE_BIN", fakes_dir().join("opencode"))
        .env("ACP_SANDBOX_AMP_BIN", fakes_dir().join("amp"))
        .env_remove("ACP_SANDBOX_AGENT")
        .env_remove("ACP_SANDBOX_DATA_DIR")
        .output()
        .expect("run acp-sandbox");
    assert!(
        output.status.success(),
        "acp-sandbox {args:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The `--json` output: one `SessionNotification` per line, each checked against the schema.
fn notifications(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
            Schemas::get().validate("SessionNotification", &value).unwrap();
            value
        })
        .collect()
}

#[test]
fn prompt_command_prints_acp_updates_and_its_session_can_be_continued_listed_and_removed() {
    let dirs = TestDirs::new("prompt-command");
    let ws = dirs.workspace("ws");
    let common = ["--agent", "opencode", "--sandbox", "none"];

    let first = notifications(&run(&[&["prompt", "--json"], &common[..], &["Say hello"]].concat(), &dirs.data, &ws));
    let sid = first[0]["sessionId"].as_str().expect("sessionId").to_string();
    let updates: Vec<Value> = first.iter().map(|n| n["update"].clone()).collect();
    assert!(text_of(&updates, "agent_message_chunk").contains("Hello from the fake model"), "{updates:?}");
    assert_eq!(invocations(&ws)[0].cwd(), ws, "the prompt command works in the current directory");

    let args = [&["prompt", "--json", "--session", sid.as_str()], &common[..], &["Do you remember?"]].concat();
    let second = notifications(&run(&args, &dirs.data, &ws));
    let updates: Vec<Value> = second.iter().map(|n| n["update"].clone()).collect();
    assert!(text_of(&updates, "agent_message_chunk").contains("turn two of the same session"), "{updates:?}");
    let runs = invocations(&ws);
    assert_eq!(runs[1].flag_value("--session"), Some(runs[0].cli_session()));

    let list = String::from_utf8_lossy(&run(&["sessions", "list"], &dirs.data, &ws).stdout).into_owned();
    assert!(list.contains(&sid) && list.contains("Say hello"), "sessions list: {list}");
    let show = String::from_utf8_lossy(&run(&["sessions", "show", &sid], &dirs.data, &ws).stdout).into_owned();
    assert!(show.contains(&sid), "sessions show: {show}");
    run(&["sessions", "rm", &sid], &dirs.data, &ws);
    let list = String::from_utf8_lossy(&run(&["sessions", "list"], &dirs.data, &ws).stdout).into_owned();
    assert!(!list.contains(&sid), "removed session still listed: {list}");
}

#[test]
fn doctor_reports_the_configured_cli_and_sandbox() {
    let dirs = TestDirs::new("doctor");
    let out = run(&["doctor"], &dirs.data, dirs.root());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&fakes_dir().join("opencode").display().to_string()), "doctor: {text}");
}
