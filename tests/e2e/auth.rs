//! Authentication: the methods `initialize` offers (what the ACP registry's check needs), `authenticate`,
//! `acp-sandbox login` for Amp (a stored token) and OpenCode (its own `opencode auth login`), and where a
//! stored token may and may not go.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::json;

use crate::support::*;

/// Runs `acp-sandbox --data-dir DATA <args>` with `stdin` piped in and without `AMP_API_KEY`; answers its exit
/// code and stderr.
fn run_cli(data: &Path, args: &[&str], stdin: &str, env: &[(&str, &str)]) -> (i32, String) {
    let mut command = Command::new(bridge_bin());
    command
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .env_remove("AMP_API_KEY")
        .env_remove("ACP_SANDBOX_AGENT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.stdout.is_empty(), "login printed on stdout: {:?}", String::from_utf8_lossy(&output.stdout));
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Every file under `dir` whose bytes contain `needle`, but `except`.
fn files_containing(dir: &Path, needle: &str, except: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file()
                && path != except
                && std::fs::read(&path).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                found.push(path);
            }
        }
    }
    found
}

fn initialize_with(bridge: &mut Bridge, auth_terminal: bool) -> serde_json::Value {
    bridge
        .request(
            "initialize",
            json!({
                "protocolVersion": 1,
                "clientCapabilities": {"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": true,
                                       "auth": {"terminal": auth_terminal}},
                "clientInfo": {"name": "acp-sandbox-e2e", "version": "0.0.0"}
            }),
        )
        .unwrap()
}

#[test]
fn initialize_offers_a_check_method_always_and_the_terminal_login_to_clients_that_run_one() {
    let dirs = TestDirs::new("auth-methods");
    let mut bridge = Bridge::spawn(BridgeOptions::new("amp", &dirs.data));
    let init = initialize_with(&mut bridge, true);
    assert_eq!(
        init["authMethods"],
        json!([
            {"id": "amp-login", "name": "Amp login",
             "description": "Checks for Amp's access token: run `acp-sandbox login --agent amp` in a terminal (it stores the token for acp-sandbox), or set AMP_API_KEY in the agent server's env"},
            {"type": "terminal", "id": "amp-login-terminal", "name": "Log in to Amp in a terminal",
             "description": "Asks for your Amp access token in a terminal and stores it for acp-sandbox",
             "args": ["login", "--agent", "amp"]}
        ])
    );
    let mut bridge = Bridge::spawn(BridgeOptions::new("opencode", &dirs.data));
    let init = initialize_with(&mut bridge, false);
    let methods = init["authMethods"].as_array().unwrap();
    assert_eq!(methods.len(), 1, "no terminal method without auth.terminal: {init}");
    assert_eq!(methods[0]["id"], "opencode-login");
    assert_eq!(methods[0].get("type"), None);
}

#[test]
fn amp_login_stores_the_token_0600_and_the_next_prompt_gives_it_to_amp_and_nothing_else() {
    let dirs = TestDirs::new("auth-amp-login");
    let token = "sgamp_user_stored_by_login_e2e";
    let (code, stderr) = run_cli(&dirs.data, &["login", "--agent", "amp"], &format!("{token}\n"), &[]);
    assert_eq!(code, 0, "{stderr}");
    let file = dirs.data.join("credentials/amp");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), format!("{token}\n"));
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(!stderr.contains(token), "login echoed the token: {stderr}");

    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("amp", &dirs.data).without_env("AMP_API_KEY"));
    assert_eq!(bridge.request("authenticate", json!({"methodId": "amp-login"})).unwrap(), json!({}));
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let runs = invocations(&ws);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].env("AMP_API_KEY").as_deref(), Some(token));
    bridge.close_stdin();
    bridge.wait_exit(std::time::Duration::from_secs(20)).expect("the bridge exits on EOF");
    // The store, the logs and the session's sandbox state never hold it: only its own file does.
    assert_eq!(files_containing(&dirs.data, token, &file), Vec::<PathBuf>::new());
    assert!(!bridge.stderr().contains(token), "the token reached the log");
}

#[test]
fn amp_api_key_in_the_environment_wins_over_the_stored_token() {
    let dirs = TestDirs::new("auth-amp-env-wins");
    let (code, stderr) = run_cli(&dirs.data, &["--agent", "amp", "login"], "sgamp_stored\n", &[]);
    assert_eq!(code, 0, "{stderr}");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("amp", &dirs.data));
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert_eq!(invocations(&ws)[0].env("AMP_API_KEY").as_deref(), Some(FAKE_AMP_KEY));
}

#[test]
fn the_terminal_methods_args_appended_to_the_servers_own_log_in_for_that_agent() {
    // Zed runs the agent server's command plus the method's args: `acp-sandbox --agent opencode` + `login --agent
    // amp` must still log in to Amp (the later `--agent` wins), with the token piped as a terminal would type it.
    let dirs = TestDirs::new("auth-terminal-args");
    let (code, stderr) =
        run_cli(&dirs.data, &["--agent", "opencode", "login", "--agent", "amp"], "sgamp_via_terminal\n", &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read_to_string(dirs.data.join("credentials/amp")).unwrap(), "sgamp_via_terminal\n");
}

#[test]
fn an_empty_or_multi_line_token_is_refused_and_nothing_is_stored() {
    let dirs = TestDirs::new("auth-amp-bad-token");
    let (code, stderr) = run_cli(&dirs.data, &["--agent", "amp", "login"], "\n", &[]);
    assert_ne!(code, 0);
    assert!(stderr.contains("no token given"), "{stderr}");
    let (code, stderr) = run_cli(&dirs.data, &["--agent", "amp", "login"], "one\ntwo\n", &[]);
    assert_ne!(code, 0);
    assert!(stderr.contains("not an access token"), "{stderr}");
    assert!(!dirs.data.join("credentials/amp").exists());
}

#[test]
fn authenticate_without_a_credential_is_32000_naming_the_login_and_the_variable() {
    let dirs = TestDirs::new("auth-amp-missing");
    let mut bridge = Bridge::start(BridgeOptions::new("amp", &dirs.data).without_env("AMP_API_KEY"));
    let error = bridge.request("authenticate", json!({"methodId": "amp-login"})).unwrap_err();
    assert_eq!(error.code, -32000, "{error}");
    assert_eq!(
        error.message,
        "Amp needs an access token: run `acp-sandbox login --agent amp` in a terminal (it stores the token for acp-sandbox), or set AMP_API_KEY in the agent server's \"env\" in the editor's settings (e.g. Zed's agent_servers) and restart the agent; in a shell, `export AMP_API_KEY=…`"
    );
    assert_eq!(error.data, Some(json!({"variable": "AMP_API_KEY", "login": "acp-sandbox login --agent amp"})));
    // Logged in meanwhile (another terminal): the same bridge now answers ok, without a restart.
    let (code, stderr) = run_cli(&dirs.data, &["--agent", "amp", "login"], "sgamp_later\n", &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(bridge.request("authenticate", json!({"methodId": "amp-login"})).unwrap(), json!({}));
    let error = bridge.request("authenticate", json!({"methodId": "opencode-login"})).unwrap_err();
    assert_eq!(error.code, -32602, "a method this server does not offer: {error}");
}

#[test]
fn a_missing_claude_login_names_both_of_its_variables() {
    let dirs = TestDirs::new("auth-claude-missing");
    let options = BridgeOptions::new("claude", &dirs.data).without_env("ANTHROPIC_API_KEY");
    let mut bridge = Bridge::start(options.without_env("CLAUDE_CODE_OAUTH_TOKEN"));
    let error = bridge.request("authenticate", json!({"methodId": "claude-login"})).unwrap_err();
    assert_eq!(error.code, -32000, "{error}");
    assert_eq!(
        error.message,
        "Claude Code needs an access token: run `acp-sandbox login --agent claude` in a terminal (it stores the token for acp-sandbox), or set ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN) in the agent server's \"env\" in the editor's settings (e.g. Zed's agent_servers) and restart the agent; in a shell, `export ANTHROPIC_API_KEY=…`"
    );
}

/// A fake `opencode` that records its arguments and exits with 7.
fn recording_opencode(dir: &Path) -> PathBuf {
    let script = dir.join("opencode");
    std::fs::write(&script, format!("#!/bin/sh\necho \"$@\" > '{}'\nexit 7\n", dir.join("argv").display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn opencode_login_runs_opencodes_own_auth_login_and_answers_its_exit_code() {
    let dirs = TestDirs::new("auth-opencode-login");
    let fake = recording_opencode(dirs.root());
    let (code, stderr) =
        run_cli(&dirs.data, &["login", "--agent", "opencode", "--opencode-bin", fake.to_str().unwrap()], "", &[]);
    assert_eq!(code, 7, "{stderr}");
    assert_eq!(std::fs::read_to_string(dirs.root().join("argv")).unwrap(), "auth login\n");
}

#[test]
fn opencode_authenticate_checks_for_a_login_of_opencodes_own() {
    let dirs = TestDirs::new("auth-opencode-check");
    let home = dirs.root().join("home");
    let data_home = home.join(".local/share");
    std::fs::create_dir_all(data_home.join("opencode")).unwrap();
    // A clean environment: no provider key of this machine can count as a login.
    let mut options = BridgeOptions::new("opencode", &dirs.data);
    options.launcher = ["env", "-i", "PATH=/usr/bin:/bin"]
        .map(String::from)
        .into_iter()
        .chain([format!("HOME={}", home.display()), format!("XDG_DATA_HOME={}", data_home.display())])
        .chain([format!("XDG_CONFIG_HOME={}", home.join(".config").display())])
        .collect();
    let mut bridge = Bridge::start(options.clone());
    let error = bridge.request("authenticate", json!({"methodId": "opencode-login"})).unwrap_err();
    assert_eq!(error.code, -32000, "{error}");
    assert_eq!(
        error.message,
        "OpenCode has no provider login: run `acp-sandbox login --agent opencode` (or `opencode auth login`) in a terminal, or set your provider's API key (e.g. ANTHROPIC_API_KEY) in the agent server's env, then try again"
    );
    std::fs::write(data_home.join("opencode/auth.json"), r#"{"anthropic": {"type": "api", "key": "sk-x"}}"#).unwrap();
    assert_eq!(bridge.request("authenticate", json!({"methodId": "opencode-login"})).unwrap(), json!({}));
}

#[test]
fn a_token_typed_on_a_terminal_is_not_echoed() {
    // `script` gives the login a pseudo-terminal; the token is typed once the prompt shows.
    let dirs = TestDirs::new("auth-amp-tty");
    let command = format!("{} --data-dir {} login --agent amp", bridge_bin().display(), dirs.data.display());
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_remove("AMP_API_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs the login on a pseudo-terminal");
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let prompt = b"the input is not shown): ";
    while !seen.windows(prompt.len()).any(|w| w == prompt) {
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut stdout, &mut buf).unwrap();
        assert!(n > 0, "the login ended before asking: {:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"sgamp_typed_on_a_tty\r").unwrap();
    std::io::Read::read_to_end(&mut stdout, &mut seen).unwrap();
    drop(stdin);
    assert!(child.wait().unwrap().success());
    let shown = String::from_utf8_lossy(&seen);
    assert!(!shown.contains("sgamp_typed_on_a_tty"), "the token was echoed: {shown:?}");
    assert!(shown.contains("Stored in "), "{shown:?}");
    assert_eq!(std::fs::read_to_string(dirs.data.join("credentials/amp")).unwrap(), "sgamp_typed_on_a_tty\n");
}

#[test]
fn zeds_older_terminal_login_is_the_whole_command_line_and_it_logs_in() {
    // Zed without its beta flag reads `_meta["terminal-auth"]` and runs that command as it is, in a terminal.
    let dirs = TestDirs::new("auth-terminal-meta");
    let options = BridgeOptions::new("amp", &dirs.data);
    let amp_bin = options.env.iter().find(|(k, _)| k == "ACP_SANDBOX_AMP_BIN").unwrap().1.clone();
    let mut bridge = Bridge::spawn(options);
    let init = bridge
        .request(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {"_meta": {"terminal-auth": true}},
                   "clientInfo": {"name": "acp-sandbox-e2e", "version": "0.0.0"}}),
        )
        .unwrap();
    let launch = &init["authMethods"][1]["_meta"]["terminal-auth"];
    let command = std::fs::canonicalize(bridge_bin()).unwrap().display().to_string();
    let data = dirs.data.display().to_string();
    assert_eq!(
        launch,
        &json!({"command": command, "label": "Log in to Amp in a terminal",
                "args": ["--data-dir", data, "--amp-bin", amp_bin, "login", "--agent", "amp"]})
    );
    assert_eq!(init["agentCapabilities"]["auth"], json!({"logout": {}}));

    let args: Vec<String> = serde_json::from_value(launch["args"].clone()).unwrap();
    let mut login = Command::new(launch["command"].as_str().unwrap())
        .args(&args)
        .env_remove("AMP_API_KEY")
        .env_remove("ACP_SANDBOX_DATA_DIR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    login.stdin.take().unwrap().write_all(b"sgamp_typed_in_zeds_terminal\n").unwrap();
    let output = login.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(std::fs::read_to_string(dirs.data.join("credentials/amp")).unwrap(), "sgamp_typed_in_zeds_terminal\n");
}

#[test]
fn logout_deletes_the_stored_token_and_the_next_prompt_asks_to_log_in_again() {
    let dirs = TestDirs::new("auth-logout");
    let (code, stderr) = run_cli(&dirs.data, &["login", "--agent", "amp"], "sgamp_to_log_out\n", &[]);
    assert_eq!(code, 0, "{stderr}");
    let file = dirs.data.join("credentials/amp");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("amp", &dirs.data).without_env("AMP_API_KEY"));
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");

    assert_eq!(bridge.request("logout", json!({})).unwrap(), json!({}));
    assert!(!file.exists(), "the stored token is still there");
    let error = bridge.prompt(&sid, "Say hello").result.unwrap_err();
    assert_eq!(error.code, -32000, "{}", error.message);
    assert_eq!(invocations(&ws).len(), 1, "Amp ran without a token");
    // Nothing left to delete: logging out again is no error.
    assert_eq!(bridge.request("logout", json!({})).unwrap(), json!({}));
}

#[test]
fn logout_says_when_the_editors_environment_still_logs_the_agent_in_and_opencode_offers_none() {
    let dirs = TestDirs::new("auth-logout-env");
    let (code, stderr) = run_cli(&dirs.data, &["login", "--agent", "amp"], "sgamp_stored_too\n", &[]);
    assert_eq!(code, 0, "{stderr}");
    // The harness gives the bridge AMP_API_KEY, as an editor's settings would.
    let mut bridge = Bridge::start(BridgeOptions::new("amp", &dirs.data));
    let error = bridge.request("logout", json!({})).unwrap_err();
    assert_eq!(
        (error.code, error.message.as_str()),
        (
            -32603,
            "AMP_API_KEY is set in the agent server's environment (the editor's settings of this agent), which \
             acp-sandbox cannot unset: Amp stays logged in until it is removed there"
        )
    );
    assert!(!dirs.data.join("credentials/amp").exists(), "the stored token goes all the same");

    let mut bridge = Bridge::spawn(BridgeOptions::new("opencode", &dirs.data));
    let init = initialize_with(&mut bridge, true);
    assert_eq!(init["agentCapabilities"].get("auth"), Some(&json!({})), "{init}");
}

#[test]
fn the_logout_command_deletes_the_agents_token_or_a_providers_key_and_nothing_else() {
    let dirs = TestDirs::new("auth-logout-cli");
    assert_eq!(run_cli(&dirs.data, &["login", "--agent", "amp"], "sgamp_cli\n", &[]).0, 0);
    assert_eq!(run_cli(&dirs.data, &["login", "--provider", "e2b"], "e2b_cli_key\n", &[]).0, 0);
    let (token, key) = (dirs.data.join("credentials/amp"), dirs.data.join("credentials/e2b"));

    let (code, stderr) = run_cli(&dirs.data, &["logout", "--agent", "amp"], "", &[]);
    assert_eq!((code, stderr), (0, format!("Deleted {}.\n", token.display())));
    assert!(!token.exists() && key.exists());
    let (code, stderr) = run_cli(&dirs.data, &["logout", "--agent", "amp"], "", &[("AMP_API_KEY", "sgamp_env")]);
    assert_eq!(
        (code, stderr),
        (
            0,
            format!(
                "Nothing stored: {} does not exist.\nAMP_API_KEY is still set in this environment, and it logs in \
                 without the file.\n",
                token.display()
            )
        )
    );
    let (code, stderr) = run_cli(&dirs.data, &["logout", "--provider", "e2b"], "", &[]);
    assert_eq!((code, stderr), (0, format!("Deleted {}.\n", key.display())));
    assert!(!key.exists());
    let (code, stderr) = run_cli(&dirs.data, &["logout", "--agent", "opencode"], "", &[]);
    assert_eq!(
        (code, stderr.as_str()),
        (1, "OpenCode keeps its own login, which acp-sandbox does not store: log out with OpenCode itself\n")
    );
}

/// A fake `claude-agent-acp` whose `--cli setup-token` says what Claude Code's does (on stderr here) and records its
/// arguments and HOME; it exits with `code`.
fn setup_token_agent(dir: &Path, code: i32) -> PathBuf {
    let script = dir.join(format!("claude-agent-acp-{code}"));
    let record = dir.join("setup-token");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$* HOME=$HOME\" > '{}'\necho 'Your OAuth token (valid for 1 year): sk-ant-oat01-FAKE' >&2\nexit {code}\n",
            record.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// `login --agent claude --own` runs Claude Code's own `setup-token` (through the adapter's `--cli`, with a HOME of
/// its own in the data dir, never the user's), then keeps the token it printed, pasted by the person, as the
/// subscription's token; a sign-in that failed stores nothing and answers its exit code.
#[test]
fn claude_signs_in_with_its_own_setup_token_and_the_pasted_token_is_kept() {
    let dirs = TestDirs::new("auth-claude-own");
    let failing = setup_token_agent(dirs.root(), 3);
    let args =
        |bin: &Path| ["login", "--agent", "claude", "--own", "--claude-bin", bin.to_str().unwrap()].map(String::from);
    let (code, stderr) = run_cli(&dirs.data, &args(&failing).each_ref().map(String::as_str), "", &[]);
    assert_eq!(code, 3, "{stderr}");
    let token_file = dirs.data.join("credentials/claude");
    assert!(!token_file.exists(), "a failed sign-in stored something");

    let agent = setup_token_agent(dirs.root(), 0);
    let (code, stderr) = run_cli(&dirs.data, &args(&agent).each_ref().map(String::as_str), "sk-ant-oat01-FAKE\n", &[]);
    assert_eq!(code, 0, "{stderr}");
    let home = dirs.data.join("logins/claude");
    assert_eq!(
        std::fs::read_to_string(dirs.root().join("setup-token")).unwrap(),
        format!("--cli setup-token HOME={}\n", home.display())
    );
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        [
            "Your OAuth token (valid for 1 year): sk-ant-oat01-FAKE",
            &format!(
                "Stored in {} (readable by you only). acp-sandbox passes it to Claude Code as CLAUDE_CODE_OAUTH_TOKEN; \
                 ANTHROPIC_API_KEY set in the agent server's environment wins. `acp-sandbox logout` deletes it.",
                token_file.display()
            ),
        ]
    );
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), "sk-ant-oat01-FAKE\n");
    assert_eq!(std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777, 0o600);
}
