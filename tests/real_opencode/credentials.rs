//! The model gateway with the real OpenCode: a key from the environment and the API login of `auth.json` reach the
//! fake model through the bridge, while a hostile tool run by OpenCode's bash finds neither, nor the tokens of the
//! Anthropic and GitHub Copilot OAuth logins of `auth.json`, in its environment, any process's environment or
//! command line, or a file it can read; the placeholder it sends elsewhere arrives as it is.

use super::*;

/// 32 hex digits that differ from run to run: keys of this test's own (the source and test binaries are readable).
fn fresh() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{:032x}", nanos ^ (u128::from(std::process::id()) << 64))
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn no_credential_inside(backend: &str, sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let login = format!("sk-login-{}", fresh());
    let refresh = format!("refresh-{}", fresh());
    let access = format!("access-{}", fresh());
    let github = format!("gho_{}", fresh());
    let copilot = format!("copilot-{}", fresh());
    let env_key = format!("sk-ant-api03-{}", fresh());
    // The fake provider with no key in the config: its key is the login in auth.json.
    let keyed = world.root.path().join("keyed");
    std::fs::create_dir_all(&keyed).unwrap();
    let server = FakeOpenAi::start_keyed(&keyed, Some(&login));
    let config = include_str!("../fixtures/real-opencode/opencode.json")
        .replace("http://127.0.0.1:18080/v1", &server.base_url())
        .replace(r#", "apiKey": "fake-key""#, "");
    assert!(!config.contains("fake-key"), "{config}");
    std::fs::write(world.user_config.join("opencode/opencode.json"), config).unwrap();
    let logins = world.home.join(".local/share/opencode");
    std::fs::create_dir_all(&logins).unwrap();
    let auth = serde_json::json!({
        "fake": {"type": "api", "key": login},
        "anthropic": {"type": "oauth", "refresh": refresh, "access": access, "expires": 1},
        "github-copilot": {"type": "oauth", "refresh": github, "access": copilot, "expires": 0},
    });
    std::fs::write(logins.join("auth.json"), auth.to_string()).unwrap();
    let ws = world.workspace("ws");
    std::fs::copy(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/hunt_key.py"), ws.join("hunt_key.py"))
        .unwrap();
    let mode = if sandbox == "none" { "tree" } else { "all" };
    let needles = [&login, &env_key, &refresh, &access, &github, &copilot].map(|s| hex(s)).join(",");
    let leak = format!("http://127.0.0.1:{}/leak", server.port);
    std::fs::write(
        ws.join(".attack.py"),
        format!(
            "import subprocess\nsubprocess.run(['python3', 'hunt_key.py', {needles:?}, {mode:?}, {leak:?}, \
             'ANTHROPIC_API_KEY'], stdout=open('hunt.txt', 'w'), stderr=subprocess.STDOUT)\n"
        ),
    )
    .unwrap();
    // A provider's key OpenCode is given (the hermetic catalog names no provider but the fake: `--pass-env` says it).
    let options = world
        .backend_options(sandbox, backend)
        .env("ANTHROPIC_API_KEY", &env_key)
        .env("ACP_SANDBOX_PASS_ENV", "ANTHROPIC_API_KEY");
    let mut bridge = world.start_with(options);
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:attack hunt for the keys", "hunt");
    assert_end_turn(&bridge, &turn);
    let report = std::fs::read_to_string(ws.join("hunt.txt")).unwrap_or_else(|e| bridge.fail(&format!("{e}")));
    assert_eq!(report.lines().collect::<Vec<_>>(), ["FOUND 0", "PLACEHOLDER yes", "LEAK 404"], "{report}");
    // The placeholder sent to another address of the fake arrives as it is.
    let leaked: Vec<Value> =
        server.requests().into_iter().filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/leak"))).collect();
    assert_eq!(leaked.len(), 1, "{leaked:#?}");
    let sent = leaked[0]["authorization"].as_str().unwrap_or_default();
    assert!(sent.contains("acpsandbox") && !sent.contains(&env_key), "{sent}");
    assert_eq!(leaked[0]["key_ok"], false);
    // The model got the login's real key on every request, through the gateway.
    let chats = server.chats("attack");
    assert!(chats.len() >= 2, "both steps reached the model: {chats:#?}");
    assert!(chats.iter().all(|chat| chat["key_ok"] == true), "a request lacked the key: {chats:#?}");
    bridge.close_stdin();
    bridge.wait_exit(Duration::from_secs(20));
    for secret in [&login, &refresh, &access, &github, &copilot, &env_key] {
        assert!(!bridge.stderr().contains(secret.as_str()), "a credential is in the bridge's log");
    }
}

#[test]
fn serve_keeps_every_credential_out_none() {
    no_credential_inside("serve", "none", "serve_keeps_every_credential_out_none");
}

#[test]
fn serve_keeps_every_credential_out_bwrap() {
    if bwrap_ok("serve_keeps_every_credential_out_bwrap") {
        no_credential_inside("serve", "bwrap", "serve_keeps_every_credential_out_bwrap");
    }
}

#[test]
fn run_keeps_every_credential_out_bwrap() {
    if bwrap_ok("run_keeps_every_credential_out_bwrap") {
        no_credential_inside("run", "bwrap", "run_keeps_every_credential_out_bwrap");
    }
}

#[test]
fn acp_keeps_every_credential_out_bwrap() {
    if bwrap_ok("acp_keeps_every_credential_out_bwrap") {
        no_credential_inside("acp", "bwrap", "acp_keeps_every_credential_out_bwrap");
    }
}

#[test]
fn serve_keeps_every_credential_out_landlock() {
    no_credential_inside("serve", "landlock", "serve_keeps_every_credential_out_landlock");
}
