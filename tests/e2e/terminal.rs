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

#[test]
fn prompt_on_a_terminal_shows_a_status_line_while_waiting_and_ctrl_c_cancels_with_status_130() {
    let dirs = TestDirs::new("tty-prompt");
    let ws = dirs.workspace("ws");
    let (master, slave) = pty();
    let mut child = Command::new(bridge_bin())
        .args(["prompt", "--sandbox", "none", "--opencode-backend", "run", "--data-dir"])
        .arg(&dirs.data)
        .arg("SCENARIO:hang")
        .current_dir(&ws)
        .env("ACP_SANDBOX_OPENCODE_BIN", fakes_dir().join("opencode"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(slave))
        .spawn()
        .expect("spawn acp-sandbox");
    // What the terminal shows of stderr, as it comes.
    let screen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = {
        let screen = screen.clone();
        std::thread::spawn(move || {
            let mut master = master;
            let mut buffer = [0u8; 4096];
            // Ends with an error once the child and every holder of the slave end are gone.
            while let Ok(n @ 1..) = master.read(&mut buffer) {
                screen.lock().unwrap().extend_from_slice(&buffer[..n]);
            }
        })
    };
    let shown = || String::from_utf8_lossy(&screen.lock().unwrap()).into_owned();
    assert!(
        wait_until(Duration::from_secs(20), || invocations(&ws).len() == 1 && shown().contains("working… 1 s")),
        "no status line while the agent works: {:?}",
        shown()
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let status = wait_exit(&mut child, "Ctrl-C");
    assert_eq!(status.code(), Some(130), "{status}");
    let _ = reader.join();

    let sid = std::fs::read_dir(dirs.data.join("sessions"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .find(|name| name.starts_with("sess_"))
        .expect("the session's state dir");
    let screen = shown();
    let warning = " WARN CLIs run WITHOUT a sandbox: --sandbox none was given\r\n";
    let (before, after) = screen.split_once("cancelling…").unwrap_or_else(|| panic!("{screen:?}"));
    assert_eq!(
        after,
        format!(" (Ctrl-C again to quit at once)\r\ncancelled (session {sid}: continue with --session {sid})\r\n")
    );
    // Every drawing of the status line replaces the last one in place, and the last is erased.
    let drawings: Vec<&str> =
        before.strip_prefix(warning).unwrap_or_else(|| panic!("{screen:?}")).split("\r\x1b[2K").collect();
    assert_eq!((drawings[0], *drawings.last().unwrap()), ("", "\r\n"), "{screen:?}");
    let seconds: Vec<u64> = drawings[1..drawings.len() - 1]
        .iter()
        // An empty drawing: the line was erased for output.
        .filter(|drawing| !drawing.is_empty())
        .map(|drawing| {
            let seconds = drawing.strip_prefix("OpenCode is working… ").and_then(|d| d.strip_suffix(" s"));
            seconds.and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{drawing:?} in {screen:?}"))
        })
        .collect();
    assert_eq!(seconds.first(), Some(&0), "drawn as the turn starts: {screen:?}");
    assert!(seconds.windows(2).all(|pair| pair[0] <= pair[1]), "{screen:?}");
    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    assert!(!stdout.contains('\x1b'), "nothing of the status line on stdout: {stdout:?}");
}
