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

#[test]
fn a_cli_not_found_is_installed_from_npm_on_first_use_and_shown_as_a_tool_call() {
    let dirs = TestDirs::new("install");
    let ws = dirs.workspace("ws");
    // A stand-in for npm: installs a package whose executable is the fake OpenCode, linked from `.bin` as npm does
    // (so the sandbox shows the fake where it really is, also when the checkout is under /tmp).
    let bin = dirs.root().join("fake-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let npm = bin.join("npm");
    std::fs::write(
        &npm,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{log}'\nwhile [ $# -gt 0 ]; do [ \"$1\" = --prefix ] && prefix=\"$2\"; shift; done\n\
             mkdir -p \"$prefix/node_modules/.bin\"\n\
             ln -s '{fake}' \"$prefix/node_modules/.bin/opencode\"\n",
            log = dirs.root().join("npm.log").display(),
            fake = fakes_dir().join("opencode").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&npm, std::fs::Permissions::from_mode(0o755)).unwrap();
    let options = BridgeOptions::new("opencode", &dirs.data)
        .without_env("ACP_SANDBOX_OPENCODE_BIN")
        .env("PATH", &format!("{}:/usr/bin:/bin", bin.display()));
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);

    let first = bridge.prompt(&sid, "Say hello");
    assert_eq!(first.stop_reason(), "end_turn");
    let install = first
        .updates
        .iter()
        .find(|u| {
            u["sessionUpdate"] == "tool_call" && u["title"].as_str().unwrap_or("").contains("Installing OpenCode")
        })
        .unwrap_or_else(|| panic!("no install card: {:?}", first.updates));
    let id = install["toolCallId"].clone();
    assert!(
        first.updates.iter().any(|u| u["toolCallId"] == id && u["status"] == "completed"),
        "the install card must complete"
    );
    let npm_log = std::fs::read_to_string(dirs.root().join("npm.log")).unwrap();
    assert!(npm_log.contains("install") && npm_log.contains("opencode-ai@1.18.33"), "{npm_log}");

    let second = bridge.prompt(&sid, "Say hello again");
    assert_eq!(second.stop_reason(), "end_turn");
    assert!(
        !second.updates.iter().any(|u| u["title"].as_str().unwrap_or("").contains("Installing")),
        "the second turn reuses the installed CLI"
    );
    assert_eq!(std::fs::read_to_string(dirs.root().join("npm.log")).unwrap().lines().count(), 1);
}
