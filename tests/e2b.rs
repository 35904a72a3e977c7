//! The E2B provider against `tests/fakes/fake_e2b.py`, a fake E2B cloud on 127.0.0.1 whose processes really run;
//! and the proof that the fake speaks E2B's protocol: the official Python SDK (pinned, installed by
//! `.ci/install-e2b-sdk.sh` outside the repository) drives it through create, a streamed command, files, pause,
//! resume and kill, and must agree with it; so must the official npm SDK (`e2b/npm_sdk.rs`).
//!
//! Run: `cargo test --locked --test e2b`.

// Tests start the fake and the SDK themselves.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/fake_e2b.rs"]
mod fake_e2b;
#[path = "support/node_sdk.rs"]
mod node_sdk;
#[path = "e2b/npm_sdk.rs"]
mod npm_sdk;
mod support;
#[path = "e2b/workspace.rs"]
mod workspace;

#[path = "e2b/doctor.rs"]
mod doctor;

#[path = "e2b/lifecycle.rs"]
mod lifecycle;

#[path = "e2b/pulls.rs"]
mod pulls;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use acp_sandbox::sandbox::remote::e2b::{E2bProvider, E2bSandbox, E2bSettings, STATE_DIR, WORKSPACE};
use acp_sandbox::sandbox::{
    ExecSpec, ExitInfo, RemoteFailure, RunningProcess, Sandbox, SandboxError, SandboxProvider, SandboxSpec,
};
use fake_e2b::{FakeE2b, KEY};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader as AsyncBufReader};

fn spec(session: &str) -> SandboxSpec {
    SandboxSpec {
        session_id: session.to_string(),
        workspace: PathBuf::from("/nonexistent-host-workspace"),
        roots: Vec::new(),
    }
}

fn sh(script: &str) -> ExecSpec {
    ExecSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), script.into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into()), ("GREETING".into(), "hi there".into())],
        cwd: PathBuf::from(WORKSPACE),
        ..ExecSpec::default()
    }
}

async fn read_all(process: &mut RunningProcess) -> (String, String) {
    let (mut out, mut err) = (String::new(), String::new());
    let (a, b) = within("its output", async {
        tokio::join!(process.stdout.read_to_string(&mut out), process.stderr.read_to_string(&mut err))
    })
    .await;
    a.unwrap();
    b.unwrap();
    (out, err)
}

fn remote_failure(error: &SandboxError) -> (RemoteFailure, String) {
    match error {
        SandboxError::Remote { failure, message, .. } => (*failure, message.clone()),
        other => panic!("not a remote failure: {other:?}"),
    }
}

async fn created(fake: &FakeE2b, provider: &E2bProvider, session: &str) -> (String, Arc<E2bSandbox>) {
    let id = provider.create(&spec(session)).await.unwrap();
    let sandbox = provider.connect_sandbox(&id, &spec(session)).await.unwrap().expect("the new sandbox");
    assert_eq!(fake.state()[&id]["state"], "running");
    (id, sandbox)
}

/// A command that prints `ready` and then sleeps, once it printed; and its pid (the host's, in the fake).
async fn sleeper(fake: &FakeE2b, id: &str, sandbox: &E2bSandbox) -> (RunningProcess, u32) {
    let mut process = sandbox.exec(sh("echo ready; exec sleep 300")).await.unwrap();
    let mut ready = [0u8; 6];
    within("`ready`", process.stdout.read_exact(&mut ready)).await.unwrap();
    assert_eq!(&ready, b"ready\n");
    let pid = fake.state()[id]["processes"][0]["pid"].as_u64().unwrap() as u32;
    (process, pid)
}

/// Awaits `future`, failing the test with `what` when it takes longer than [`support::RECV_TIMEOUT`].
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(support::RECV_TIMEOUT, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {:?}", support::RECV_TIMEOUT))
}

/// Whether `pid` is gone within a few seconds (a killed process takes a moment to die).
async fn host_pid_ends(pid: u32) -> bool {
    for _ in 0..250 {
        if !host_pid_alive(pid) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    false
}

fn host_pid_alive(pid: u32) -> bool {
    // The fake runs processes on the host: envd's pid is the host's. A zombie is not alive.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

#[test]
fn the_official_sdk_agrees_with_the_fake() {
    let install = Command::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ci/install-e2b-sdk.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run .ci/install-e2b-sdk.sh");
    assert!(install.status.success(), "installing the E2B SDK failed (PyPI reachable? python3-venv installed?)");
    let python = PathBuf::from(String::from_utf8(install.stdout).unwrap().trim());
    let fake = FakeE2b::start();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/e2b_sdk_check.py");
    let out = Command::new(&python)
        .arg(&script)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", fake.root.parent().unwrap())
        .env("E2B_API_URL", fake.api_url())
        .env("E2B_SANDBOX_URL", fake.sandbox_url())
        .env("E2B_API_KEY", KEY)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the SDK disagreed with the fake:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let observed: Value = serde_json::from_str(stdout.lines().last().unwrap().strip_prefix("OK ").unwrap()).unwrap();
    let id = observed["sandbox_id"].as_str().unwrap();
    assert!(observed["stdout_chunks"].as_u64().unwrap() >= 1);
    assert_eq!(observed["templates_exist"], json!([true, false]));

    let records = fake.records();
    let create = &records[0];
    assert_eq!((create["method"].as_str(), create["path"].as_str()), (Some("POST"), Some("/v2/sandboxes")));
    assert_eq!(create["headers"]["x-api-key"], KEY);
    assert_eq!(
        serde_json::from_str::<Value>(create["body"].as_str().unwrap()).unwrap(),
        json!({"templateID": "base", "timeout": 600, "autoPause": true, "autoResume": {"enabled": true},
               "metadata": {"zed_session": "sdk-check"}, "envVars": {"SANDBOX_WIDE": "from-create"}})
    );
    let paths: Vec<String> = records
        .iter()
        .map(|r| {
            format!("{} {} {}", r["port"].as_str().unwrap(), r["method"].as_str().unwrap(), r["path"].as_str().unwrap())
        })
        .collect();
    let expected_calls = [
        "envd POST /process.Process/Start".to_string(),
        "envd POST /process.Process/Connect".to_string(),
        "envd POST /process.Process/List".to_string(),
        "envd POST /process.Process/SendSignal".to_string(),
        format!("api POST /sandboxes/{id}/pause"),
        format!("api POST /v2/sandboxes/{id}/connect"),
        format!("api POST /sandboxes/{id}/timeout"),
        format!("api DELETE /sandboxes/{id}"),
        "api GET /templates/aliases/base".to_string(),
        "api GET /templates/aliases/no-such-template".to_string(),
    ];
    for call in &expected_calls {
        assert!(paths.contains(call), "the SDK never made {call}: {paths:#?}");
    }
    for start in records.iter().filter(|r| r["path"] == "/process.Process/Start") {
        assert_eq!(start["headers"]["content-type"], "application/connect+json");
        assert_eq!(start["headers"]["connect-protocol-version"], "1");
        assert_eq!(start["headers"]["e2b-sandbox-id"], id);
        assert_eq!(start["headers"]["e2b-sandbox-port"], "49983");
    }
    // The SDK's sandbox is gone: the fake killed what the SDK killed.
    assert_eq!(fake.state(), json!({}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_streams_its_output_as_it_prints() {
    let fake = FakeE2b::start();
    let provider = fake.provider();
    let (id, sandbox) = created(&fake, &provider, "s-stream").await;
    let state = &fake.state()[&id];
    assert_eq!(
        (&state["template"], &state["metadata"], &state["autoPause"], &state["autoResume"], &state["timeout"]),
        (&json!("base"), &json!({"acp_session": "s-stream"}), &json!(true), &json!(true), &json!(3600))
    );

    // The command waits for a file the test writes only after it read the first line: the line cannot have
    // come at the end.
    let mut process = sandbox
        .exec(sh(
            "echo \"first $GREETING\"; while [ ! -e go ]; do sleep 0.02; done; echo second; echo warn >&2; exit 7",
        ))
        .await
        .unwrap();
    let mut lines = AsyncBufReader::new(&mut process.stdout).lines();
    assert_eq!(within("a line of output", lines.next_line()).await.unwrap().as_deref(), Some("first hi there"));
    sandbox.upload(&Path::new(WORKSPACE).join("go"), b"").await.unwrap();
    assert_eq!(within("a line of output", lines.next_line()).await.unwrap().as_deref(), Some("second"));
    assert_eq!(within("a line of output", lines.next_line()).await.unwrap(), None);
    let mut err = String::new();
    within("its stderr", process.stderr.read_to_string(&mut err)).await.unwrap();
    assert_eq!(err, "warn\n");
    assert_eq!(within("the exit", process.handle.wait()).await.unwrap(), ExitInfo { code: Some(7), signal: None });

    // The environment is exactly the one given (plus what the sandbox itself sets): no key of the bridge.
    let mut process = sandbox.exec(sh("env | sort")).await.unwrap();
    let (out, _) = read_all(&mut process).await;
    assert!(out.lines().any(|l| l == "GREETING=hi there"), "{out}");
    assert!(!out.contains(KEY), "the API key reached the sandbox: {out}");
    assert_eq!(within("the exit", process.handle.wait()).await.unwrap().code, Some(0));

    // Stdin is written, then closed (the CLIs read it to its end).
    let mut cat = ExecSpec { program: PathBuf::from("cat"), stdin: b"line one\nline two".to_vec(), ..sh("") };
    cat.args.clear();
    let mut process = sandbox.exec(cat).await.unwrap();
    assert_eq!(read_all(&mut process).await.0, "line one\nline two");
    assert_eq!(within("the exit", process.handle.wait()).await.unwrap().code, Some(0));

    // A state file lands below the state dir, and only there.
    let attachment = Path::new(STATE_DIR).join("attachments/1/image.png");
    sandbox.write_state_file(&attachment, b"\x89PNG").await.unwrap();
    assert_eq!(std::fs::read(fake.host_path(&id, &attachment.to_string_lossy())).unwrap(), b"\x89PNG");
    assert_eq!(sandbox.download(&attachment).await.unwrap().as_deref(), Some(b"\x89PNG".as_slice()));
    assert_eq!(sandbox.download(Path::new("/home/user/none")).await.unwrap(), None);
    for outside in ["/home/user/elsewhere", "/home/user/.acp-sandbox/../x"] {
        let err = sandbox.write_state_file(Path::new(outside), b"x").await.unwrap_err();
        assert!(matches!(err, SandboxError::Io { .. }), "{outside}: {err:?}");
    }

    // A missing program is a spawn error naming it.
    let err = sandbox
        .exec(ExecSpec { program: PathBuf::from("/no/such/cli"), ..sh("") })
        .await
        .err()
        .expect("a missing program cannot start");
    assert!(matches!(&err, SandboxError::Spawn { program, .. } if program == "/no/such/cli"), "{err:?}");

    // Neither the key nor anything of the control plane ever went to envd.
    for record in fake.records().iter().filter(|r| r["port"] == "envd") {
        assert!(!record.to_string().contains(KEY), "the key went to envd: {record}");
        assert!(record["headers"].get("x-api-key").is_none(), "{record}");
    }
    provider.destroy(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_ends_the_remote_process() {
    let fake = FakeE2b::start();
    let provider = fake.provider();
    let (id, sandbox) = created(&fake, &provider, "s-kill").await;
    let (mut process, pid) = sleeper(&fake, &id, &sandbox).await;
    let tag = fake.state()[&id]["processes"][0]["tag"].as_str().unwrap().to_string();
    assert!(tag.starts_with("acp-s-kill-"), "{tag}");
    assert!(host_pid_alive(pid));

    let cancelled = Instant::now();
    process.handle.kill().await;
    let exit = within("the exit", process.handle.wait()).await.unwrap();
    // Measured, not asserted (no timed assertions): the report quotes it.
    eprintln!("kill to exit: {:?}", cancelled.elapsed());
    assert_eq!(exit, ExitInfo { code: None, signal: Some(9) });
    assert!(!host_pid_alive(pid), "the process {pid} still runs");
    assert_eq!(fake.state()[&id]["processes"], json!([]));
    let signals: Vec<Value> = fake
        .records()
        .iter()
        .filter(|r| r["path"] == "/process.Process/SendSignal")
        .map(|r| serde_json::from_str(r["body"].as_str().unwrap()).unwrap())
        .collect();
    assert_eq!(signals, vec![json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})]);
    // Killing again does nothing.
    process.handle.kill().await;
    assert_eq!(fake.records().iter().filter(|r| r["path"] == "/process.Process/SendSignal").count(), 1);

    // A handle dropped while its command runs kills the command too.
    let (process, pid) = sleeper(&fake, &id, &sandbox).await;
    drop(process);
    assert!(host_pid_ends(pid).await, "a dropped handle's command {pid} runs on");
    provider.destroy(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_connect_resume_the_sandbox_with_a_fresh_token() {
    let fake = FakeE2b::start();
    let provider = fake.provider();
    let (id, sandbox) = created(&fake, &provider, "s-pause").await;
    sandbox.upload(Path::new("/home/user/workspace/kept.txt"), b"kept\n").await.unwrap();

    provider.suspend(&id).await.unwrap();
    assert_eq!(fake.state()[&id]["state"], "paused");
    // Pausing a paused sandbox is fine (E2B answers 409).
    provider.suspend(&id).await.unwrap();
    assert_eq!(fake.state()[&id]["pauses"], 1);

    let resumed = provider.connect_sandbox(&id, &spec("s-pause")).await.unwrap().expect("resumed");
    assert_eq!((&fake.state()[&id]["state"], &fake.state()[&id]["resumes"]), (&json!("running"), &json!(1)));
    assert_eq!(
        resumed.download(Path::new("/home/user/workspace/kept.txt")).await.unwrap().as_deref(),
        Some(b"kept\n".as_slice())
    );
    let mut process = resumed.exec(sh("cat kept.txt")).await.unwrap();
    assert_eq!(read_all(&mut process).await.0, "kept\n");
    assert_eq!(within("the exit", process.handle.wait()).await.unwrap().code, Some(0));

    // The token of before the pause is dead: only what connect gave works.
    let err = sandbox.exec(sh("true")).await.err().expect("the old token is refused");
    assert_eq!(remote_failure(&err).0, RemoteFailure::Auth);
    let records = fake.records();
    let connects: Vec<&Value> = records.iter().filter(|r| r["path"] == format!("/v2/sandboxes/{id}/connect")).collect();
    assert_eq!(connects.len(), 2);
    assert_eq!(connects[1]["body"], "{\"timeout\":3600}");
    provider.destroy(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_by_a_pause_is_reattached() {
    let fake = FakeE2b::start();
    let provider = fake.provider();
    let (id, sandbox) = created(&fake, &provider, "s-cut").await;
    let mut process =
        sandbox.exec(sh("echo before; while [ ! -e go ]; do sleep 0.02; done; echo after")).await.unwrap();
    let mut lines = AsyncBufReader::new(&mut process.stdout).lines();
    assert_eq!(within("a line of output", lines.next_line()).await.unwrap().as_deref(), Some("before"));
    // The pause freezes the process and cuts the stream; the re-attach's traffic auto-resumes the sandbox. The
    // file is written once the stream is attached again: what is printed while detached is lost, as with envd.
    provider.suspend(&id).await.unwrap();
    let deadline = Instant::now() + support::RECV_TIMEOUT;
    while fake.state()[&id]["processes"][0]["streams"] != 1 {
        assert!(Instant::now() < deadline, "the stream was not attached again within {:?}", support::RECV_TIMEOUT);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!((&fake.state()[&id]["state"], &fake.state()[&id]["resumes"]), (&json!("running"), &json!(1)));
    std::fs::write(fake.host_path(&id, "/home/user/workspace/go"), b"").unwrap();
    assert_eq!(within("a line of output", lines.next_line()).await.unwrap().as_deref(), Some("after"));
    assert_eq!(within("a line of output", lines.next_line()).await.unwrap(), None);
    assert_eq!(within("the exit", process.handle.wait()).await.unwrap().code, Some(0));
    let attaches = fake.records().iter().filter(|r| r["path"] == "/process.Process/Connect").count();
    assert_eq!(attaches, 1);
    provider.destroy(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_kills_and_a_gone_sandbox_is_none() {
    let fake = FakeE2b::start();
    let provider = fake.provider();
    let (id, sandbox) = created(&fake, &provider, "s-gone").await;
    let (mut process, pid) = sleeper(&fake, &id, &sandbox).await;

    provider.destroy(&id).await.unwrap();
    assert_eq!(fake.state(), json!({}));
    assert!(host_pid_ends(pid).await, "the sandbox's process {pid} outlived it");
    assert!(provider.connect(&id, &spec("s-gone")).await.unwrap().is_none());
    // Destroying or pausing what is gone succeeds; running in it says the sandbox is not found.
    provider.destroy(&id).await.unwrap();
    provider.suspend(&id).await.unwrap();
    let err = sandbox.exec(sh("true")).await.err().expect("a gone sandbox runs nothing");
    assert_eq!(remote_failure(&err).0, RemoteFailure::NotFound);
    // A process whose sandbox died under it ends with an error that says so (the control plane was asked), not a
    // hang nor a stream's or the proxy's words.
    let (failure, message) = remote_failure(&within("the exit", process.handle.wait()).await.unwrap_err());
    assert_eq!(
        (failure, message),
        (
            RemoteFailure::Failed,
            format!(
                "the E2B sandbox {id} was killed outside the bridge while the turn ran (or its timeout ended it); \
                 the next prompt makes a new one"
            )
        )
    );
    // An id that is not E2B's never reaches a URL.
    let err = provider.connect("../v2/sandboxes", &spec("s-gone")).await.err().unwrap();
    assert_eq!(remote_failure(&err).0, RemoteFailure::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_become_clear_errors() {
    let fake = FakeE2b::start();
    let wrong = E2bProvider::new(fake.settings("e2b_wrong")).unwrap();
    let (failure, message) = remote_failure(&wrong.create(&spec("s-err")).await.unwrap_err());
    assert_eq!(failure, RemoteFailure::Auth);
    assert_eq!(
        message,
        "E2B refused the API key (HTTP 401: Invalid API key, it must start with 'e2b_' prefix); check E2B_API_KEY in \
         the bridge's environment"
    );
    assert_eq!(fake.state(), json!({}));

    let provider = fake.provider();
    fake.fail_next(429, "Rate limit exceeded");
    let (failure, message) = remote_failure(&provider.create(&spec("s-err")).await.unwrap_err());
    assert_eq!(failure, RemoteFailure::RateLimited);
    assert_eq!(
        message,
        "cannot create a sandbox: E2B's rate or concurrency limit was reached (HTTP 429: Rate limit exceeded); try \
         again later, or kill sandboxes this account no longer needs"
    );

    let unknown = E2bProvider::new(E2bSettings { template: "no-such".into(), ..fake.settings(KEY) }).unwrap();
    let (failure, message) = remote_failure(&unknown.create(&spec("s-err")).await.unwrap_err());
    assert_eq!(
        (failure, message.as_str()),
        (RemoteFailure::NotFound, "cannot create a sandbox: not found (HTTP 404: template 'no-such' not found)")
    );

    fake.fail_next(500, "internal");
    let (failure, message) = remote_failure(&provider.destroy("i123").await.unwrap_err());
    assert_eq!((failure, message.as_str()), (RemoteFailure::Failed, "cannot kill a sandbox: HTTP 500: internal"));

    let nowhere = E2bSettings { api_url: "http://127.0.0.1:9/".parse().unwrap(), ..fake.settings(KEY) };
    let (failure, message) =
        remote_failure(&E2bProvider::new(nowhere).unwrap().create(&spec("s-err")).await.unwrap_err());
    assert_eq!(failure, RemoteFailure::Unreachable);
    assert!(message.starts_with("cannot reach http://127.0.0.1:9/: "), "{message}");
}

/// The bridge with `--sandbox e2b` against the fake, running the fake OpenCode in the session's sandbox.
fn e2b_options(fake: &FakeE2b, dirs: &support::TestDirs) -> support::BridgeOptions {
    support::BridgeOptions::new("opencode", &dirs.data)
        .sandbox("e2b")
        .env("E2B_API_KEY", KEY)
        .env("E2B_API_URL", &fake.api_url())
        .env("E2B_SANDBOX_URL", &fake.sandbox_url())
}

/// The one sandbox the fake holds.
fn only_sandbox(fake: &FakeE2b) -> (String, Value) {
    let state = fake.state();
    let sandboxes = state.as_object().unwrap();
    assert_eq!(sandboxes.len(), 1, "{state}");
    let (id, sandbox) = sandboxes.iter().next().unwrap();
    (id.clone(), sandbox.clone())
}

#[test]
fn opencodes_warm_server_falls_back_to_run_in_an_e2b_sandbox() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-serve");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(e2b_options(&fake, &dirs).env("ACP_SANDBOX_OPENCODE_BACKEND", "serve"));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(
        turn.agent_text(),
        "\n\n_OpenCode's server could not start here, so this session runs `opencode run` per prompt (no live \
         output): the OpenCode server did not start: sandbox unavailable: E2B sandboxes do not run a warm server \
         yet: use `--opencode-backend run`_\n\nHello from the fake model. This is a plain text answer."
    );
    let (id, _) = only_sandbox(&fake);
    let runs = support::invocations(&fake.host_path(&id, WORKSPACE));
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].argv()[0], "run");
}

#[test]
fn a_refused_e2b_key_answers_the_prompt_with_an_auth_error() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-auth");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(e2b_options(&fake, &dirs).env("E2B_API_KEY", "e2b_not_the_key"));
    let sid = bridge.new_session(&ws);
    let error = bridge.prompt(&sid, "Say hello").result.unwrap_err();
    assert_eq!(error.code, -32000);
    assert_eq!(
        error.message,
        "e2b: E2B refused the API key (HTTP 401: Invalid API key, it must start with 'e2b_' prefix); check E2B_API_KEY \
         in the bridge's environment"
    );
    assert_eq!(error.data, Some(json!({"provider": "e2b"})));
    assert_eq!(fake.state(), json!({}));
    // The bridge goes on: the next prompt gets the same answer, not a dead connection.
    assert_eq!(bridge.prompt(&sid, "Say hello").result.unwrap_err().code, -32000);
}

/// The text of a turn's agent chunks without the bridge's notes.
fn agent_said(turn: &support::Turn) -> String {
    let chunks = turn.updates.iter().filter(|u| u["sessionUpdate"] == "agent_message_chunk");
    let texts = chunks.filter_map(|u| u["content"]["text"].as_str()).filter(|text| !text.trim().starts_with('_'));
    texts.collect::<String>().trim().to_string()
}

#[test]
fn an_acp_agent_runs_in_an_e2b_sandbox_with_its_stdin_open_and_its_changes_reviewed() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-acp");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("notes.txt"), "the user's\n").unwrap();
    let mut options = e2b_options(&fake, &dirs)
        .arg("--agent-command")
        .arg(&support::fakes_dir().join("acp_agent.py").display().to_string());
    options.agent = "custom".into();
    let mut bridge = support::Bridge::start_reviewing(options, true);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:text");
    assert_eq!(turn.stop_reason(), "end_turn", "{turn:?}");
    assert_eq!(agent_said(&turn), "Hello from ACP");
    // Its read of the uploaded workspace, and its write through the bridge, run in the E2B sandbox.
    let turn = bridge.prompt(&sid, &format!("SCENARIO:read:{WORKSPACE}/notes.txt"));
    assert_eq!(agent_said(&turn), "read ok the user's", "{turn:?}");
    let turn = bridge.prompt(&sid, &format!("SCENARIO:write:{WORKSPACE}/made.txt"));
    assert_eq!(agent_said(&turn), "write ok");
    let (id, _) = only_sandbox(&fake);
    assert_eq!(
        std::fs::read_to_string(fake.host_path(&id, &format!("{WORKSPACE}/made.txt"))).unwrap(),
        "written by the agent"
    );
    // What it changed there reached the user's files through the editor.
    let sent: Vec<(PathBuf, String)> = bridge.file_writes.iter().map(|w| (w.path.clone(), w.content.clone())).collect();
    assert_eq!(sent, [(ws.join("made.txt"), "written by the agent".to_string())]);
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap(), "written by the agent");
    // The sandbox slept between turns (its agent with it): each turn's agent continued the same conversation.
    let turn = bridge.prompt(&sid, "SCENARIO:history");
    assert_eq!(
        agent_said(&turn),
        format!(
            r#"history ["SCENARIO:text", "SCENARIO:read:{WORKSPACE}/notes.txt", "SCENARIO:write:{WORKSPACE}/made.txt"]"#
        )
    );
}
