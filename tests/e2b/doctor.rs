//! `acp-sandbox doctor --sandbox e2b` against the fake E2B: the key, the control plane and the template (E2B's
//! `GET /templates/aliases/{alias}`), what a session would use; a refused key or a missing template is an ERROR
//! (exit 1). It never creates a sandbox, and never prints the key.

use super::*;
use pretty_assertions::assert_eq;

/// What E2B was asked, the fake's own test hooks left out.
fn asked(fake: &FakeE2b) -> Vec<Value> {
    fake.records().into_iter().filter(|r| !r["path"].as_str().unwrap().starts_with("/_fake/")).collect()
}

fn run(fake: &FakeE2b, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let dirs = support::TestDirs::new("e2b-doctor");
    let api = fake.api_url();
    let mut all = vec![("E2B_API_URL", api.as_str())];
    all.extend_from_slice(env);
    let (code, out, err) = support::doctor_with(&dirs.data, args, &all);
    for (name, value) in env.iter().filter(|(name, _)| name.ends_with("_KEY")) {
        assert!(!out.contains(value) && !err.contains(value), "doctor printed {name}: {out}{err}");
    }
    assert_eq!(fake.state(), json!({}), "doctor made a sandbox");
    (code, out, err)
}

fn sessions_line(template: &str) -> String {
    format!(
        "            sessions: each in an E2B sandbox of its own from template {template}, paused by E2B after 3600 s \
         without traffic and resumed by the next prompt; E2B_API_KEY stays with the bridge"
    )
}

#[test]
fn doctor_checks_the_key_the_control_plane_and_the_template() {
    let fake = FakeE2b::start_with(&["--templates", "base,acp-opencode", "--own-templates", "acp-opencode"]);
    let (code, out, _) = run(&fake, &["--sandbox", "e2b"], &[("E2B_API_KEY", KEY)]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        support::doctor_section(&out, "e2b"),
        [
            "e2b         E2B_API_KEY: set".to_string(),
            format!("            API {}/: reachable, the key is accepted", fake.api_url()),
            "            template base (the default): exists (not your team's: a public one such as E2B's own)"
                .to_string(),
            sessions_line("base"),
        ],
        "{out}"
    );
    let (code, out, _) =
        run(&fake, &["--sandbox", "e2b"], &[("E2B_API_KEY", KEY), ("ACP_SANDBOX_E2B_TEMPLATE", "acp-opencode")]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        support::doctor_section(&out, "e2b")[2],
        "            template acp-opencode (ACP_SANDBOX_E2B_TEMPLATE): exists (your team's, id acp-opencode)",
        "{out}"
    );
    // What enters a remote sandbox, agent by agent: no model gateway reaches it.
    let said = "            credentials: in a remote sandbox (no model gateway there) these reach its CLI as variables, as \
                they are: ";
    let rest = "the model keys of your environment it takes, and what --pass-env gives it";
    let credentials: Vec<&str> = out.lines().filter(|line| line.trim_start().starts_with("credentials:")).collect();
    assert_eq!(
        credentials,
        [
            format!("{said}{rest}"),
            format!("{said}AMP_API_KEY (from your environment or `login`); {rest}"),
            format!("{said}{rest}"),
            format!("{said}ANTHROPIC_API_KEY, CLAUDE_CODE_OAUTH_TOKEN (from your environment or `login`); {rest}"),
            format!(
                "{said}OPENAI_API_KEY (from your environment or `login`); {rest}; a sign-in of `login --own` \
                 (ChatGPT) is not used there"
            ),
            format!("{said}GEMINI_API_KEY (from your environment or `login`); {rest}"),
        ],
        "{out}"
    );
    let paths: Vec<String> = asked(&fake).iter().map(|r| r["path"].as_str().unwrap().to_string()).collect();
    assert_eq!(paths, ["/templates/aliases/base", "/templates/aliases/acp-opencode"]);
    for record in asked(&fake) {
        assert_eq!(record["headers"]["x-api-key"], KEY, "{record}");
    }
}

#[test]
fn doctor_fails_on_a_refused_key_or_a_missing_template_and_informs_of_an_unselected_key() {
    let fake = FakeE2b::start();
    let (code, out, err) = run(&fake, &["--sandbox", "e2b"], &[("E2B_API_KEY", "e2b_not_the_key")]);
    assert_eq!((code, err.as_str()), (Some(1), "1 problem found (the ERROR lines)\n"), "{out}");
    assert_eq!(
        support::doctor_section(&out, "e2b"),
        [
            "e2b         E2B_API_KEY: set".to_string(),
            format!(
                "            ERROR API {}/: E2B refused the API key (HTTP 401: Invalid API key, it must start with \
                 'e2b_' prefix); check E2B_API_KEY in the bridge's environment",
                fake.api_url()
            ),
            sessions_line("base"),
        ],
        "{out}"
    );

    let (code, out, _) =
        run(&fake, &["--sandbox", "e2b"], &[("E2B_API_KEY", KEY), ("ACP_SANDBOX_E2B_TEMPLATE", "no-such")]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(
        support::doctor_section(&out, "e2b"),
        [
            "e2b         E2B_API_KEY: set".to_string(),
            format!("            API {}/: reachable, the key is accepted", fake.api_url()),
            "            ERROR template no-such (ACP_SANDBOX_E2B_TEMPLATE): E2B has no template of that name: set \
             ACP_SANDBOX_E2B_TEMPLATE to one of yours, or unset it for `base`"
                .to_string(),
            sessions_line("no-such"),
        ],
        "{out}"
    );

    let (code, out, _) = run(&fake, &["--sandbox", "e2b"], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(
        support::doctor_section(&out, "e2b"),
        ["e2b         ERROR E2B_API_KEY: missing: --sandbox e2b needs your E2B key in the bridge's environment, \
          or run `acp-sandbox login --provider e2b`"],
        "{out}"
    );

    let before = asked(&fake).len();
    let (code, out, _) = run(&fake, &["--sandbox", "none"], &[("E2B_API_KEY", KEY)]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        support::doctor_section(&out, "e2b"),
        ["e2b         INFO E2B_API_KEY is set, but sessions run with --sandbox none; --sandbox e2b would run each \
             in an E2B sandbox of its own"],
        "{out}"
    );
    assert_eq!(asked(&fake).len(), before, "an unselected provider is not asked anything");
}

/// `acp-sandbox login --provider e2b` stores the key (mode 0600, in the data dir no sandbox sees); without
/// E2B_API_KEY in the environment, doctor and the sessions use it, and it is never printed.
#[test]
fn a_key_stored_by_login_is_used_when_the_environment_has_none() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-login");
    let mut login = std::process::Command::new(support::bridge_bin())
        .args(["login", "--provider", "e2b", "--data-dir"])
        .arg(&dirs.data)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &dirs.data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    login.stdin.take().unwrap().write_all(format!("{KEY}\n").as_bytes()).unwrap();
    let out = login.wait_with_output().unwrap();
    let stored = dirs.data.join("credentials/e2b");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, b"", "login printed on stdout");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains(KEY), "login printed the key: {said}");
    assert_eq!(std::fs::read_to_string(&stored).unwrap(), format!("{KEY}\n"));
    assert_eq!(std::fs::metadata(&stored).unwrap().permissions().mode() & 0o777, 0o600);

    let api = fake.api_url();
    let (code, out, err) = support::doctor_with(&dirs.data, &["--sandbox", "e2b"], &[("E2B_API_URL", api.as_str())]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains(KEY) && !err.contains(KEY), "doctor printed the key");
    assert_eq!(
        support::doctor_section(&out, "e2b")[..2],
        ["e2b         E2B_API_KEY: set".to_string(), format!("            API {api}/: reachable, the key is accepted")],
        "{out}"
    );
    for record in asked(&fake) {
        assert_eq!(record["headers"]["x-api-key"], KEY, "{record}");
    }

    // A session, too: the bridge's requests carry the stored key.
    let options = support::BridgeOptions::new("opencode", &dirs.data)
        .sandbox("e2b")
        .env("E2B_API_URL", &api)
        .env("E2B_SANDBOX_URL", &fake.sandbox_url());
    let mut bridge = support::Bridge::start(options);
    let ws = dirs.remote_workspace("ws");
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert_eq!(fake.state().as_object().map(|sandboxes| sandboxes.len()), Some(1), "{}", fake.state());
}
