//! Never unsandboxed by surprise: where bubblewrap cannot make its namespaces (a `bwrap` that fails as Ubuntu's
//! AppArmor makes it fail), `auto` runs the Landlock sandbox and says so; without Landlock too (the test-only
//! switch), the bridge runs on and every prompt is refused with the reason; `doctor` says which.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;

/// The test-only switch that makes the bridge's Landlock probe fail.
const NO_LANDLOCK: &str = "ACP_SANDBOX_TEST_ONLY_NO_LANDLOCK";

/// What the Landlock sandbox does not hold, as the bridge says it.
const GAPS: &str = "it does NOT hide the host's processes (their command lines are readable), keep protected \
    workspace paths (.git/config, hooks, .envrc) read-only, or keep TCP to the proxy's port and loopback model ports \
    from reaching other hosts on those ports; servers it starts listen on the host's network";

/// What the failing bubblewrap says, and how the bridge reports it.
const BWRAP_FAILS: &str = "bubblewrap cannot create its namespaces here: bwrap: setting up uid map: Permission denied";

/// A `PATH` whose `bwrap` fails like bubblewrap under Ubuntu's `apparmor_restrict_unprivileged_userns`.
fn path_with_failing_bwrap(dirs: &TestDirs) -> String {
    let bin = dirs.root().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let bwrap = bin.join("bwrap");
    std::fs::write(&bwrap, "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bwrap, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("{}:/usr/bin:/bin", bin.display())
}

/// Whether this kernel has the Landlock ABI the sandbox needs (4); `Err` says why not.
fn landlock_usable() -> Result<(), String> {
    // SAFETY: with a null attribute, size 0 and LANDLOCK_CREATE_RULESET_VERSION, the call only returns the ABI.
    let abi = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    if abi >= 4 { Ok(()) } else { Err(format!("the kernel's Landlock ABI is {abi}; the sandbox needs 4")) }
}

#[test]
fn auto_without_bubblewrap_runs_the_landlock_sandbox_and_says_so() {
    if let Err(why) = landlock_usable() {
        panic!("the Landlock sandbox cannot be tested here: {why}");
    }
    let dirs = TestDirs::new("landlock-auto");
    let ws = dirs.workspace("ws");
    let options =
        BridgeOptions::new("opencode", &dirs.data).sandbox("auto").env("PATH", &path_with_failing_bwrap(&dirs));
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:probe Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert!(turn.agent_text().contains("Hello from the fake model"), "{:?}", turn.updates);
    assert_eq!(notes(&turn), [format!("_OpenCode runs in the Landlock sandbox here, not bubblewrap: {GAPS}._")]);

    let run = &invocations(&ws)[0];
    assert_eq!(run.cwd(), ws);
    let state = sandbox_state(&dirs.data, &sid);
    assert_eq!(run.env("TMPDIR"), Some(state.join("tmp").display().to_string()), "a TMPDIR of the session's own");
    let probe: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ws.join(".fake-cli/probe.json")).unwrap()).unwrap();
    assert_eq!(probe["workspace"]["writable"], true, "{probe:#}");
    assert_eq!(probe["home"]["writable"], true, "HOME is the session's writable state dir: {probe:#}");
    assert_eq!(probe["workspace_parent"]["writable"], false, "writes outside the workspace: {probe:#}");
    assert_eq!(probe["tmp"]["writable"], false, "the host's /tmp: {probe:#}");
    assert!(probe["tmp"]["error"].as_str().unwrap().starts_with("[Errno 13] Permission denied"), "{probe:#}");
    let stderr = bridge.stderr();
    assert!(stderr.contains(&format!("CLIs run in the Landlock sandbox, not bubblewrap: {GAPS}")), "{stderr}");

    // Said once: the next turn has no note.
    let next = bridge.prompt(&sid, "Do you remember?");
    assert_eq!(next.stop_reason(), "end_turn");
    assert_eq!(notes(&next), Vec::<String>::new());
}

#[test]
fn without_bubblewrap_and_landlock_the_prompt_is_refused_with_the_reason() {
    let dirs = TestDirs::new("landlock-refused");
    let ws = dirs.workspace("ws");
    let options = BridgeOptions::new("opencode", &dirs.data)
        .sandbox("auto")
        .env("PATH", &path_with_failing_bwrap(&dirs))
        .env(NO_LANDLOCK, "1");
    let mut bridge = Bridge::start(options);
    // The bridge answers: a session can be made, and its prompt fails saying why and what to do.
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "Say hello");
    let error = turn.result.expect_err("the prompt ran without a sandbox");
    assert_eq!(
        error.message,
        format!(
            "sandbox unavailable: no sandbox can run OpenCode here, so this prompt was not run: {BWRAP_FAILS}; and no \
             Landlock sandbox: Landlock is switched off for a test ({NO_LANDLOCK}=1). Install bubblewrap (on Ubuntu \
             23.10 and later, allow its user namespaces: `sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0`, \
             or an AppArmor profile for bwrap), run on Linux 6.7 or later with Landlock enabled, or choose --sandbox \
             none to run the agent without a sandbox"
        )
    );
    assert!(invocations_of(&ws).is_empty(), "the CLI ran");
    let list = bridge.request("session/list", serde_json::json!({}));
    assert!(list.is_ok(), "the bridge no longer answers: {list:?}");
}

/// The fake CLI's runs in `ws`, none when it never ran.
fn invocations_of(ws: &Path) -> Vec<PathBuf> {
    let log = ws.join(".fake-cli/invocations.jsonl");
    if log.exists() { vec![log] } else { Vec::new() }
}

/// `acp-sandbox doctor --sandbox auto` with the failing bubblewrap: its exit code and its sandbox line.
fn doctor_sandbox_line(dirs: &TestDirs, configure: impl FnOnce(&mut Command)) -> (Option<i32>, String) {
    let mut command = Command::new(bridge_bin());
    command
        .args(["doctor", "--sandbox", "auto", "--data-dir"])
        .arg(&dirs.data)
        .current_dir(dirs.root())
        .env("PATH", path_with_failing_bwrap(dirs))
        .env("ACP_SANDBOX_OPENCODE_BIN", fakes_dir().join("opencode"))
        .env_remove("ACP_SANDBOX_SANDBOX")
        .env_remove("RUST_LOG");
    configure(&mut command);
    let output = command.output().unwrap();
    let out = String::from_utf8_lossy(&output.stdout).into_owned();
    let line = out.lines().find(|line| line.starts_with("sandbox ")).unwrap_or_else(|| panic!("{out}")).to_string();
    (output.status.code(), line)
}

#[test]
fn doctor_says_which_sandbox_auto_got() {
    if let Err(why) = landlock_usable() {
        panic!("the Landlock sandbox cannot be tested here: {why}");
    }
    let dirs = TestDirs::new("landlock-doctor");
    let abi = {
        // SAFETY: as in `landlock_usable`.
        unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) }
    };
    let (_, line) = doctor_sandbox_line(&dirs, |_| {});
    assert_eq!(
        line,
        format!(
            "sandbox     Landlock (ABI {abi}) and seccomp, no bubblewrap: system readable without secrets, writable \
             workspace and session state, TCP only to the bridge's proxy, no capabilities; {GAPS} (--sandbox auto)"
        )
    );
    let (code, line) = doctor_sandbox_line(&dirs, |c| {
        c.env(NO_LANDLOCK, "1");
    });
    assert_eq!(code, Some(1));
    assert!(
        line.starts_with(&format!(
            "sandbox     ERROR NO sandbox can be made here, prompts are refused: {BWRAP_FAILS}; and no Landlock \
             sandbox: Landlock is switched off for a test"
        )),
        "{line}"
    );
}
