//! What a first prompt does not wait for: the version probe (a warm server starts beside it, and its version is
//! cached in the data dir per executable file, probed again when the file changes).

use std::path::Path;

use crate::support::{
    Bridge, BridgeOptions, RECV_TIMEOUT, TestDirs, fakes_dir, pid_alive, processes_under, read_pid_file, wait_until,
};

/// How many times the fake `opencode --version` ran.
fn probes(log: &Path) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().lines().count()
}

/// A bridge whose OpenCode is `bin`, logging its `--version` runs to `log` (the cache's keys are files, so this test
/// needs one of its own to change; `--sandbox none`, where any path is the same file inside).
fn with_bin(dirs: &TestDirs, bin: &Path, log: &Path) -> BridgeOptions {
    BridgeOptions::new("opencode", &dirs.data)
        .sandbox("none")
        .env("ACP_SANDBOX_OPENCODE_BIN", &bin.display().to_string())
        .env("OPENCODE_FAKE_VERSION_LOG", &log.display().to_string())
}

#[test]
fn the_version_is_probed_once_per_executable_file_across_bridges_and_again_when_the_file_changes() {
    let dirs = TestDirs::new("version-cache");
    let ws = dirs.workspace("ws");
    let bin = dirs.root().join("opencode");
    let log = dirs.root().join("probes.log");
    let wrapper = format!("#!/bin/sh\nexec '{}' \"$@\"\n", fakes_dir().join("opencode").display());
    std::fs::write(&bin, &wrapper).unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let prompt_once = || {
        let mut bridge = Bridge::start(with_bin(&dirs, &bin, &log));
        let sid = bridge.new_session(&ws);
        let turn = bridge.prompt(&sid, "Say hello");
        assert_eq!(turn.stop_reason(), "end_turn", "{:?}", turn.result);
    };
    prompt_once();
    assert_eq!(probes(&log), 1, "the first bridge probes once");
    prompt_once();
    assert_eq!(probes(&log), 1, "a later bridge takes the version from the data dir's cache");
    // The same path, another file: probed again.
    std::fs::write(&bin, format!("{wrapper}# replaced\n")).unwrap();
    prompt_once();
    assert_eq!(probes(&log), 2, "the changed executable was not probed again");
}

#[test]
fn a_warm_server_starts_while_the_version_probe_still_runs() {
    let dirs = TestDirs::new("version-warm");
    let ws = dirs.workspace("ws");
    let hold = dirs.data.join("version-workspace/release");
    let options = BridgeOptions::new("opencode", &dirs.data)
        .env("ACP_SANDBOX_OPENCODE_BACKEND", "serve")
        .env("OPENCODE_FAKE_SERVE", "1")
        .env("OPENCODE_FAKE_VERSION_HOLD", &hold.display().to_string());
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let (dir, pid_file) = (hold.parent().unwrap(), hold.with_extension("pid"));
    let mut probe = None;
    assert!(wait_until(RECV_TIMEOUT, || {
        probe = read_pid_file(dir, &pid_file);
        probe.is_some()
    }));
    let started = || std::fs::read_to_string(ws.join(".fake-serve/starts.log")).unwrap_or_default().lines().count();
    assert!(wait_until(RECV_TIMEOUT, || started() == 1), "the warm server waited for the version probe");
    assert!(pid_alive(probe.unwrap()), "the probe ended before the server started: this proves nothing");
    std::fs::write(&hold, b"").unwrap();
    let turn = bridge.prompt(&sid, "hello");
    assert_eq!(turn.stop_reason(), "end_turn", "{:?}", turn.result);
    assert_eq!(started(), 1, "the prompt used the warm server");
}

/// Not waiting for the probe does not mean driving an OpenCode 2: the server's own health answer names its
/// version, and a 2.x is stopped before anything is sent to it.
#[test]
fn a_warm_server_that_answers_as_opencode_2_is_stopped_at_once() {
    let dirs = TestDirs::new("version-warm-2");
    let ws = dirs.workspace("ws");
    let options = BridgeOptions::new("opencode", &dirs.data)
        .env("ACP_SANDBOX_OPENCODE_BACKEND", "serve")
        .env("OPENCODE_FAKE_SERVE", "1")
        .env("OPENCODE_FAKE_VERSION", "2.0.23");
    let mut bridge = Bridge::start(options);
    bridge.new_session(&ws);
    let refused = "the OpenCode server was not started ahead of the first prompt: the OpenCode server did not \
                   start: it is OpenCode 2.0.23, a major version acp-sandbox cannot drive yet";
    assert!(wait_until(RECV_TIMEOUT, || bridge.stderr().contains(refused)), "{}", bridge.stderr());
    let serving = || processes_under(dirs.root()).iter().any(|(_, cmd)| cmd.contains("fake_serve.py"));
    assert!(wait_until(RECV_TIMEOUT, || !serving()), "the 2.x server still runs");
    assert_eq!(std::fs::read_to_string(ws.join(".fake-serve/starts.log")).unwrap_or_default().lines().count(), 1);
    let prompts = std::fs::read_to_string(ws.join(".fake-serve/prompt.log")).unwrap_or_default();
    assert_eq!(prompts, "", "a prompt reached the 2.x server");
}
