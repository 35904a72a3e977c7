//! The binary as a person meets it on a terminal: `acp-sandbox` started by hand under a real pseudo-terminal.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// A pseudo-terminal: the master end the test types into, the slave end the child's terminal.
fn pty() -> (std::fs::File, OwnedFd) {
    let pty = nix::pty::openpty(None, None).expect("openpty");
    (std::fs::File::from(pty.master), pty.slave)
}

/// Waits (bounded) for the child to exit; kills it and fails the test when it does not.
fn wait_exit(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let mut status = None;
    wait_until(Duration::from_secs(20), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("{what}: acp-sandbox did not exit");
    })
}

#[test]
fn serving_on_a_terminal_prints_a_hint_and_one_ctrl_d_after_a_typed_line_ends_it() {
    let dirs = TestDirs::new("tty-serve");
    let (mut master, slave) = pty();
    let mut child = Command::new(bridge_bin())
        .args(["--sandbox", "none", "--data-dir"])
        .arg(&dirs.data)
        .env_remove("RUST_LOG")
        .stdin(Stdio::from(slave))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn acp-sandbox");
    // A request typed without Enter, then one Ctrl-D (the terminal's end-of-file character).
    let request = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#;
    std::io::Write::write_all(&mut master, format!("{request}\x04").as_bytes()).unwrap();
    let status = wait_exit(&mut child, "one Ctrl-D after a typed line");
    assert_eq!(status.code(), Some(0), "{status}");

    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let answers: Vec<serde_json::Value> = stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(answers.len(), 1, "{stdout}");
    assert_eq!((&answers[0]["id"], &answers[0]["result"]["protocolVersion"]), (&1.into(), &1.into()), "{stdout}");
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert_eq!(
        stderr.lines().next(),
        Some(
            "acp-sandbox speaks the Agent Client Protocol on stdin/stdout, for an editor to run (see the editor \
             setup in the README); Ctrl-D quits. For a person: acp-sandbox prompt \"…\""
        ),
        "{stderr}"
    );
}

#[test]
fn serving_on_a_pipe_prints_no_hint() {
    let dirs = TestDirs::new("pipe-serve");
    let output = Command::new(bridge_bin())
        .args(["--sandbox", "none", "--data-dir"])
        .arg(&dirs.data)
        .env("RUST_LOG", "off")
        .stdin(Stdio::null())
        .output()
        .expect("run acp-sandbox");
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&output.stderr), "", "an editor's pipe gets nothing but logs");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
}
