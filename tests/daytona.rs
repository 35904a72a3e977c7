//! The Daytona provider against `tests/fakes/fake_daytona.py` (a fake Daytona on 127.0.0.1 that runs commands for
//! real in a directory per sandbox), and the proof that the fake speaks Daytona's protocol: the official Python SDK
//! (PyPI `daytona`, pinned in `.ci/install-daytona-sdk.sh`) drives it through create, a streamed session command,
//! files, stop, start and delete (`tests/fakes/fake_daytona_sdk_check.py`); so does the official npm SDK
//! (`daytona/npm_sdk.rs`, `tests/fakes/daytona_sdk_check.mjs`).
//!
//! The SDK comes from `ACP_SANDBOX_TEST_DAYTONA_PYTHON` (a python that imports it) or else from the install
//! script, which installs it once under the cache dir and prints that python; without it the test FAILS.
// Tests start the fake server and the SDK themselves.
#![allow(clippy::disallowed_methods)]
// A test fails by panicking: unwrap and expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/node_sdk.rs"]
mod node_sdk;
#[path = "daytona/npm_sdk.rs"]
mod npm_sdk;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acp_sandbox::sandbox::remote::daytona::api::Endpoint;
use acp_sandbox::sandbox::remote::daytona::{DaytonaProvider, DaytonaSettings};
use acp_sandbox::sandbox::{
    ExecSpec, ExitInfo, RemoteFailure, RunningProcess, Sandbox, SandboxError, SandboxProvider, SandboxSpec,
};
use fake_daytona::{FakeDaytona, KEY, test_dir};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader as AsyncBufReader};

#[path = "support/fake_daytona.rs"]
mod fake_daytona;
mod support;

#[path = "daytona/bridge.rs"]
mod bridge;
#[path = "daytona/doctor.rs"]
mod doctor;
#[path = "daytona/faults.rs"]
mod faults;
#[path = "daytona/lifecycle.rs"]
mod lifecycle;
#[path = "daytona/pulls.rs"]
mod pulls;
#[path = "daytona/secrets.rs"]
mod secrets;

fn spec(session: &str) -> SandboxSpec {
    SandboxSpec {
        session_id: session.into(),
        workspace: PathBuf::from("/nonexistent/editor/workspace"),
        roots: Vec::new(),
    }
}

async fn created(fake: &FakeDaytona, session: &str) -> (DaytonaProvider, String, Arc<dyn Sandbox>) {
    let provider = fake.provider(KEY);
    let id = provider.create(&spec(session)).await.unwrap();
    let sandbox = provider.connect(&id, &spec(session)).await.unwrap().expect("the new sandbox is there");
    (provider, id, sandbox)
}

fn shell(sandbox: &dyn Sandbox, script: &str, env: &[(&str, &str)]) -> ExecSpec {
    let mut all = vec![("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string())];
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    ExecSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), script.into()],
        env: all,
        cwd: sandbox.workspace().to_path_buf(),
        ..ExecSpec::default()
    }
}

/// Guards against a hang (never a timed assertion: a minute is far beyond any expectation).
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), future).await.unwrap_or_else(|_| panic!("{what} hung"))
}

async fn read_all(stream: &mut acp_sandbox::sandbox::OutputStream) -> String {
    let mut text = String::new();
    within("reading to EOF", stream.read_to_string(&mut text)).await.unwrap();
    text
}

#[test]
fn the_official_sdk_agrees_with_the_fake() {
    let dir = test_dir("sdk");
    let fake = FakeDaytona::start(&dir);
    let python = match std::env::var("ACP_SANDBOX_TEST_DAYTONA_PYTHON") {
        Ok(python) => PathBuf::from(python),
        Err(_) => {
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ci/install-daytona-sdk.sh");
            let out = Command::new(&script).stderr(Stdio::inherit()).output().expect("run .ci/install-daytona-sdk.sh");
            assert!(out.status.success(), "the Daytona SDK could not be installed: run .ci/install-daytona-sdk.sh");
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        }
    };
    let check = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/fake_daytona_sdk_check.py");
    let out = Command::new(&python)
        .arg(&check)
        .current_dir(&dir)
        .env("DAYTONA_API_URL", fake.api_url())
        .env("DAYTONA_API_KEY", KEY)
        .env_remove("DAYTONA_TARGET")
        .env_remove("DAYTONA_JWT_TOKEN")
        .env_remove("DAYTONA_ORGANIZATION_ID")
        .env_remove("DAYTONA_SERVER_URL")
        .output()
        .expect("run the SDK check");
    assert!(
        out.status.success(),
        "the SDK disagrees with the fake: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let mut seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    // What only the Python check covers: a command's input (the provider's way in for its environment), snapshots,
    // and the list of sessions (how a new bridge finds what an earlier one left running).
    let only_python = ["input", "missing_snapshot", "sessions"].map(|key| seen.as_object_mut().unwrap().remove(key));
    assert_eq!(
        only_python,
        [
            Some(json!({
                "suppressed": ["got:hello"],
                "echoed": ["got:hello", "hello"],
                "after_exit": "Failed to send session command input: command has already completed with exit code 0",
            })),
            Some(json!("DaytonaNotFoundError")),
            Some(json!([
                [
                    "sdk-check",
                    [
                        ["echo \"$GREETING\"; echo to-stderr >&2; printf \"no newline\"; exit 7", 7],
                        ["echo sync; pwd", 0],
                    ]
                ],
                ["sdk-running", [["sleep 1000", null]]],
            ])),
        ]
    );
    assert_the_sdk_agreed(&seen, &fake.sdk_calls(), "0.226.1");
}

/// What an official SDK's check (Python or npm) reports, exactly; and that each of its calls carried the key only
/// as a bearer token and named the SDK's version.
fn assert_the_sdk_agreed(seen: &Value, calls: &[Value], sdk_version: &str) {
    assert_eq!(
        seen,
        &json!({
            "stdout": "hello from env\nno newline\n",
            "stderr": "to-stderr\n",
            "exit_code": 7,
            "read_back": "first file\n",
            "gone": "DaytonaNotFoundError",
        })
    );
    assert!(calls.len() > 10);
    for request in calls {
        assert_eq!(request["auth"], json!(format!("Bearer {KEY}")), "{request}");
        assert_eq!(request["sdk"], json!(sdk_version), "{request}");
    }
}

#[tokio::test]
async fn output_streams_while_the_command_runs_and_the_exit_code_follows() {
    let dir = test_dir("stream");
    let fake = FakeDaytona::start(&dir);
    let (_provider, _id, sandbox) = created(&fake, "s-stream").await;
    let go = sandbox.state_dir().join("go");
    let script = r#"echo one; echo warn >&2; while [ ! -f "$GO" ]; do sleep 0.02; done; echo two; exit 3"#;
    let RunningProcess { stdout, mut stderr, mut handle, door, .. } =
        sandbox.exec(shell(sandbox.as_ref(), script, &[("GO", &go.display().to_string())])).await.unwrap();
    assert!(door.is_none());
    let mut lines = AsyncBufReader::new(stdout).lines();
    // The first line arrives while the command still waits for `go`: it is streamed, not delivered at the end.
    assert_eq!(within("the first line", lines.next_line()).await.unwrap().as_deref(), Some("one"));
    sandbox.write_state_file(Path::new("go"), b"").await.unwrap();
    assert_eq!(within("the second line", lines.next_line()).await.unwrap().as_deref(), Some("two"));
    assert_eq!(within("EOF", lines.next_line()).await.unwrap(), None);
    assert_eq!(read_all(&mut stderr).await, "warn\n");
    assert_eq!(within("the exit", handle.wait()).await.unwrap(), ExitInfo { code: Some(3), signal: None });
    // Waiting again answers the same.
    assert_eq!(within("the exit", handle.wait()).await.unwrap(), ExitInfo { code: Some(3), signal: None });
}

#[tokio::test]
async fn a_dropped_log_stream_is_resumed_without_losing_or_repeating_output() {
    let dir = test_dir("dropped");
    // The first stream of each command breaks inside the second line's stdout marker.
    let fake = FakeDaytona::start_with(&dir, &["--drop-logs-after", "10"]);
    let (_provider, _id, sandbox) = created(&fake, "s-dropped").await;
    let go = sandbox.state_dir().join("go");
    let script = r#"echo first; echo second; while [ ! -f "$GO" ]; do sleep 0.02; done; echo third >&2; echo fourth"#;
    let RunningProcess { stdout, mut stderr, mut handle, .. } =
        sandbox.exec(shell(sandbox.as_ref(), script, &[("GO", &go.display().to_string())])).await.unwrap();
    let mut lines = AsyncBufReader::new(stdout).lines();
    assert_eq!(within("first", lines.next_line()).await.unwrap().as_deref(), Some("first"));
    // Still streaming after the drop: the second line comes before the command may go on.
    assert_eq!(within("second", lines.next_line()).await.unwrap().as_deref(), Some("second"));
    sandbox.write_state_file(Path::new("go"), b"").await.unwrap();
    assert_eq!(within("fourth", lines.next_line()).await.unwrap().as_deref(), Some("fourth"));
    assert_eq!(within("EOF", lines.next_line()).await.unwrap(), None);
    assert_eq!(read_all(&mut stderr).await, "third\n");
    assert_eq!(within("the exit", handle.wait()).await.unwrap(), ExitInfo { code: Some(0), signal: None });
    let streams =
        fake.requests().into_iter().filter(|r| r["path"].as_str().unwrap().ends_with("/logs?follow=true")).count();
    assert_eq!(streams, 2);
}

#[tokio::test]
async fn a_command_gets_exactly_its_environment_and_stdin_and_never_the_key() {
    let dir = test_dir("env");
    let fake = FakeDaytona::start(&dir);
    let (_provider, id, sandbox) = created(&fake, "s-env").await;
    let script = r#"printf '%s|%s|%s|%s|%s' "$FOO" "${HOME-unset}" "$PWD" "$(cat)" "${DAYTONA_API_KEY-unset}""#;
    let mut exec = shell(sandbox.as_ref(), script, &[("FOO", "it's \"quoted\" $x"), ("DAYTONA_API_KEY", KEY)]);
    exec.stdin = b"the prompt\nsecond line".to_vec();
    let RunningProcess { mut stdout, mut stderr, mut handle, .. } = sandbox.exec(exec).await.unwrap();
    let workspace = sandbox.workspace().display().to_string();
    assert_eq!(
        read_all(&mut stdout).await,
        // Daytona's daemon writes output line by line: a last line without a newline gets one.
        format!("it's \"quoted\" $x|unset|{workspace}|the prompt\nsecond line|unset\n")
    );
    assert_eq!(read_all(&mut stderr).await, "");
    assert_eq!(within("the exit", handle.wait()).await.unwrap(), ExitInfo { code: Some(0), signal: None });

    // The key is in no file of the sandbox.
    let sandbox_dir = fake.root.join(&id);
    let mut stack = vec![sandbox_dir];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if let Ok(bytes) = std::fs::read(&path) {
            assert!(!String::from_utf8_lossy(&bytes).contains(KEY), "the key is in {}", path.display());
        }
    }
    // Nor in any request but as the bearer token; the new sandbox got no environment.
    for request in fake.requests() {
        assert!(!request["body"].to_string().contains(KEY), "{request}");
        assert!(!request["path"].to_string().contains(KEY), "{request}");
    }
    let create = fake.requests().into_iter().find(|r| r["method"] == "POST" && r["path"] == "/api/sandbox").unwrap();
    assert_eq!(
        create["body"],
        json!({"env": {}, "labels": {"acp-sandbox.session": "s-env"}, "autoStopInterval": 30, "snapshot": "daytona-small"})
    );
    assert_eq!(create["split"], json!("true"));
}

/// Whether a host process exists and is no zombie (a killed grandchild of the fake waits for init to reap it).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')))
        .unwrap_or(false)
}

async fn cancel(flags: &[&str]) -> Vec<Value> {
    let dir = test_dir(if flags.is_empty() { "cancel" } else { "cancel-old" });
    let fake = FakeDaytona::start_with(&dir, flags);
    let (_provider, _id, sandbox) = created(&fake, "s-cancel").await;
    let script = "echo $$; while true; do echo tick; sleep 0.02; done";
    let RunningProcess { stdout, mut handle, .. } = sandbox.exec(shell(sandbox.as_ref(), script, &[])).await.unwrap();
    let mut lines = AsyncBufReader::new(stdout).lines();
    // The fake runs commands on this host: the pid is a real one.
    let pid: i32 = within("the pid", lines.next_line()).await.unwrap().unwrap().parse().unwrap();
    assert_eq!(within("a tick", lines.next_line()).await.unwrap().as_deref(), Some("tick"));
    assert!(alive(pid));
    let asked = std::time::Instant::now();
    handle.kill().await;
    assert_eq!(within("the exit after kill", handle.wait()).await.unwrap(), ExitInfo { code: None, signal: Some(9) });
    // Measured, not asserted: kill and wait against the fake on this machine.
    eprintln!("TIMING cancel {flags:?}: kill + wait {:?}", asked.elapsed());
    assert!(!alive(pid), "the command still runs after kill and wait");
    // Its output ends too.
    while within("EOF after kill", lines.next_line()).await.unwrap().is_some() {}
    // What the provider asked the toolbox to end it (the session is deleted after the exit either way).
    fake.requests()
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with("/terminate") || r["method"] == "DELETE")
        .map(|r| json!([r["method"], r["path"].as_str().unwrap().rsplit('/').next().unwrap()]))
        .collect()
}

#[tokio::test]
async fn cancel_kills_the_remote_command() {
    let asked = cancel(&[]).await;
    assert_eq!(asked[0], json!(["POST", "terminate"]));
}

#[tokio::test]
async fn cancel_deletes_the_session_on_daemons_without_terminate() {
    let asked = cancel(&["--no-terminate"]).await;
    assert_eq!(asked[0], json!(["POST", "terminate"]));
    assert_eq!(asked[1][0], json!("DELETE"));
    assert!(asked[1][1].as_str().unwrap().starts_with("acp-"), "{asked:?}");
}

#[tokio::test]
async fn stop_and_start_keep_the_files() {
    let dir = test_dir("suspend");
    let fake = FakeDaytona::start(&dir);
    let (provider, id, sandbox) = created(&fake, "s-suspend").await;
    sandbox.write_state_file(Path::new("notes/kept.txt"), b"kept across a stop").await.unwrap();
    provider.suspend(&id).await.unwrap();
    assert_eq!(fake.state(&id).await, "stopped");
    // Suspending a stopped sandbox is fine.
    provider.suspend(&id).await.unwrap();
    let again = provider.connect(&id, &spec("s-suspend")).await.unwrap().expect("the stopped sandbox comes back");
    assert_eq!(fake.state(&id).await, "started");
    let path = again.state_dir().join("notes/kept.txt");
    assert_eq!(
        std::fs::read(fake.root.join(&id).join("home/.acp-sandbox/notes/kept.txt")).unwrap(),
        b"kept across a stop"
    );
    let mut cat = shell(again.as_ref(), r#"cat "$KEPT""#, &[("KEPT", &path.display().to_string())]);
    cat.cwd = again.state_dir().to_path_buf();
    let RunningProcess { mut stdout, mut handle, .. } = again.exec(cat).await.unwrap();
    assert_eq!(read_all(&mut stdout).await, "kept across a stop\n");
    assert_eq!(within("the exit", handle.wait()).await.unwrap(), ExitInfo { code: Some(0), signal: None });
    let starts = fake.requests().into_iter().filter(|r| r["path"] == json!(format!("/api/sandbox/{id}/start"))).count();
    let stops = fake.requests().into_iter().filter(|r| r["path"] == json!(format!("/api/sandbox/{id}/stop"))).count();
    assert_eq!((stops, starts), (1, 1));
}

#[tokio::test]
async fn a_destroyed_or_unknown_sandbox_is_gone() {
    let dir = test_dir("destroy");
    let fake = FakeDaytona::start(&dir);
    let (provider, id, _sandbox) = created(&fake, "s-destroy").await;
    provider.destroy(&id).await.unwrap();
    assert!(!fake.root.join(&id).exists());
    assert!(provider.connect(&id, &spec("s-destroy")).await.unwrap().is_none());
    // Destroying or suspending what is gone succeeds.
    provider.destroy(&id).await.unwrap();
    provider.suspend(&id).await.unwrap();
    assert!(provider.connect("no-such-sandbox", &spec("s-destroy")).await.unwrap().is_none());
}

#[tokio::test]
async fn a_refused_key_is_a_clear_error() {
    let dir = test_dir("auth");
    let fake = FakeDaytona::start(&dir);
    let provider = fake.provider("dtn_wrong");
    let error = provider.create(&spec("s-auth")).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "daytona: Daytona refused the API key (HTTP 401) while create a sandbox: check DAYTONA_API_KEY (and DAYTONA_API_URL)"
    );
    assert!(matches!(error, SandboxError::Remote { failure: RemoteFailure::Auth, .. }), "{error:?}");
    assert!(!format!("{error:?}").contains("dtn_wrong"));
}

#[tokio::test]
async fn the_organization_is_named_when_set() {
    let dir = test_dir("org");
    let fake = FakeDaytona::start(&dir);
    let provider = DaytonaProvider::new(DaytonaSettings {
        endpoint: Endpoint { api_url: fake.api_url(), api_key: KEY.into(), organization_id: Some("org-7".into()) },
        snapshot: None,
        target: Some("eu".into()),
        auto_stop_minutes: 0,
    })
    .unwrap();
    let id = provider.create(&spec("s-org")).await.unwrap();
    let sandbox = provider.connect(&id, &spec("s-org")).await.unwrap().unwrap();
    let RunningProcess { mut stdout, mut handle, .. } =
        sandbox.exec(shell(sandbox.as_ref(), "echo ok", &[])).await.unwrap();
    assert_eq!(read_all(&mut stdout).await, "ok\n");
    assert_eq!(within("the exit", handle.wait()).await.unwrap(), ExitInfo { code: Some(0), signal: None });
    let requests = fake.requests();
    assert!(requests.iter().any(|r| r["path"].as_str().unwrap().ends_with("/logs?follow=true")));
    for request in &requests {
        assert_eq!(request["org"], json!("org-7"), "{request}");
    }
    let create = requests.iter().find(|r| r["method"] == "POST" && r["path"] == "/api/sandbox").unwrap();
    assert_eq!(
        create["body"],
        json!({"env": {}, "labels": {"acp-sandbox.session": "s-org"}, "autoStopInterval": 0, "target": "eu"})
    );
}
