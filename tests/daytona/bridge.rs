//! The built bridge with `--sandbox daytona` against the fake Daytona: each session's CLI (the fake OpenCode, at
//! its path on this machine: the fake runs commands on the host) runs in a Daytona sandbox of its own.

use super::*;
use pretty_assertions::assert_eq;

pub(super) fn daytona_options(fake: &FakeDaytona, dirs: &support::TestDirs) -> support::BridgeOptions {
    support::BridgeOptions::new("opencode", &dirs.data)
        .sandbox("daytona")
        .env("DAYTONA_API_KEY", KEY)
        .env("DAYTONA_API_URL", &fake.api_url())
}

pub(super) fn daytona_bridge(fake: &FakeDaytona, dirs: &support::TestDirs) -> support::Bridge {
    support::Bridge::start(daytona_options(fake, dirs))
}

/// The sandboxes the fake holds (a directory each).
pub(super) fn sandboxes(fake: &FakeDaytona) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(&fake.root)
        .map(|entries| entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

pub(super) fn only_sandbox(fake: &FakeDaytona) -> String {
    let ids = sandboxes(fake);
    assert_eq!(ids.len(), 1, "{ids:?}");
    ids[0].clone()
}

/// The sandbox's workspace on the host, where the fake CLI records its runs.
pub(super) fn workspace_of(fake: &FakeDaytona, id: &str) -> PathBuf {
    fake.root.join(id).join("home/workspace")
}

/// The sandbox's state once it is `stopped`, or whatever it is after `patience`.
fn stopped_within(fake: &FakeDaytona, id: &str, patience: std::time::Duration) -> String {
    let until = std::time::Instant::now() + patience;
    loop {
        let state = info(fake, id)["state"].as_str().unwrap_or_default().to_string();
        if state == "stopped" || std::time::Instant::now() > until {
            return state;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// What the control plane says about a sandbox.
fn info(fake: &FakeDaytona, id: &str) -> Value {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let response = reqwest::Client::new()
            .get(format!("{}/sandbox/{id}", fake.api_url()))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        response.json().await.unwrap()
    })
}

/// The key appears nowhere but in the Authorization header of the fake's requests: not in the store, the log
/// files, the bridge's stderr, the CLI's environment or any file of the sandboxes.
fn assert_the_key_stayed_with_the_bridge(fake: &FakeDaytona, dirs: &support::TestDirs, bridge: &support::Bridge) {
    let requests = fake.requests();
    assert!(!requests.is_empty());
    for request in &requests {
        assert_eq!(request["auth"], json!(format!("Bearer {KEY}")), "{request}");
        let mut rest = request.clone();
        rest.as_object_mut().unwrap().remove("auth");
        assert!(!rest.to_string().contains(KEY), "the key is in a request: {request}");
    }
    let data_files: Vec<PathBuf> = std::fs::read_dir(&dirs.data).unwrap().map(|e| e.unwrap().path()).collect();
    let logs: Vec<&PathBuf> =
        data_files.iter().filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("acp-sandbox.log")).collect();
    assert!(!logs.is_empty(), "no log file in {data_files:?}");
    for file in logs.into_iter().chain(data_files.iter().filter(|p| p.ends_with("acp-sandbox.sqlite3"))) {
        let bytes = std::fs::read(file).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains(KEY), "the key is in {}", file.display());
    }
    assert!(!bridge.stderr().contains(KEY), "the key is in the bridge's stderr");
    for id in sandboxes(fake) {
        for run in support::invocations(&workspace_of(fake, &id)) {
            assert!(!run.0["env"].to_string().contains(KEY), "the key reached the CLI: {:?}", run.env_keys());
            assert_eq!(run.env_keys().iter().filter(|k| k.starts_with("DAYTONA_")).count(), 0, "{:?}", run.env_keys());
        }
        let mut stack = vec![fake.root.join(&id)];
        while let Some(path) = stack.pop() {
            if path.is_dir() {
                stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            } else if let Ok(bytes) = std::fs::read(&path) {
                assert!(!String::from_utf8_lossy(&bytes).contains(KEY), "the key is in {}", path.display());
            }
        }
    }
}

#[test]
fn the_bridge_runs_a_session_in_its_own_daytona_sandbox_and_deletes_it_with_the_session() {
    let dir = test_dir("bridge");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-bridge");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = daytona_bridge(&fake, &dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(turn.agent_text(), "Hello from the fake model. This is a plain text answer.");

    // The first prompt made the session's sandbox, labelled with the session, and ran the CLI in its workspace with
    // its state dir as HOME.
    let id = only_sandbox(&fake);
    let sandbox = info(&fake, &id);
    assert_eq!(sandbox["labels"], json!({"acp-sandbox.session": sid}));
    assert_eq!(sandbox["env"], json!({}));
    let inside = workspace_of(&fake, &id);
    let runs = support::invocations(&inside);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].cwd(), inside);
    assert_eq!(runs[0].env("PWD"), Some(inside.display().to_string()));
    assert_eq!(
        runs[0]
            .env("HOME")
            .map(|h| h.starts_with(&fake.root.join(&id).join("home/.acp-sandbox").display().to_string())),
        Some(true)
    );
    assert_eq!(runs[0].stdin_text(), "Say hello");
    assert_eq!(runs[0].argv()[0], "run");
    assert!(support::invocations(&ws).is_empty(), "the CLI ran in the editor's workspace");

    // A follow-up reconnects to the same sandbox, and the CLI continues its conversation.
    let turn = bridge.prompt(&sid, "SCENARIO:followup and now?");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(only_sandbox(&fake), id);
    let runs = support::invocations(&inside);
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].flag_value("--session"), Some(runs[0].cli_session()));

    assert_the_key_stayed_with_the_bridge(&fake, &dirs, &bridge);

    bridge.request("session/delete", json!({"sessionId": sid})).unwrap();
    assert_eq!(sandboxes(&fake), Vec::<String>::new());
    let deletes: Vec<Value> = fake
        .requests()
        .into_iter()
        .filter(|r| r["method"] == "DELETE" && r["path"] == json!(format!("/api/sandbox/{id}")))
        .collect();
    assert_eq!(deletes.len(), 1);
}

#[test]
fn cancel_kills_the_cli_in_the_daytona_sandbox() {
    let dir = test_dir("bridge-cancel");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-cancel");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = daytona_bridge(&fake, &dirs);
    let sid = bridge.new_session(&ws);
    let prompt = bridge.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=100000 FAKE_DELAY_MS=20 keep talking");
    // Output arrives while the CLI still runs (it would take half an hour to finish).
    bridge.wait_update(&sid, "a streamed chunk", |u| u["sessionUpdate"] == "agent_message_chunk");
    let id = only_sandbox(&fake);
    // The fake runs commands on the host: the pid the CLI recorded is this machine's.
    let cli = support::wait_invocations(&workspace_of(&fake, &id), 1)[0].0["pid"].as_i64().unwrap() as i32;
    assert!(support::pid_alive(cli));

    let cancelled = Instant::now();
    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, prompt);
    eprintln!("TIMING daytona cancel to answer: {:?}", cancelled.elapsed());
    assert_eq!(turn.stop_reason(), "cancelled");
    assert!(support::wait_until(support::RECV_TIMEOUT, || !support::pid_alive(cli)), "the CLI {cli} still runs");
    let terminates = fake.requests().iter().filter(|r| r["path"].as_str().unwrap().ends_with("/terminate")).count();
    assert_eq!(terminates, 1);
    // The session goes on: the next prompt runs in the same sandbox.
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert_eq!(only_sandbox(&fake), id);
}

#[test]
fn a_restarted_bridge_reconnects_and_a_gone_sandbox_is_replaced_with_a_note() {
    let dir = test_dir("bridge-restart");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-restart");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = daytona_bridge(&fake, &dirs);
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let first = only_sandbox(&fake);
    bridge.close_stdin();
    drop(bridge);

    // Stopped meanwhile (as Daytona's auto-stop does), it is started again by the next bridge, found by the id in
    // the store, with its files (the CLI's conversation) kept.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let provider = fake.provider(KEY);
    runtime.block_on(provider.suspend(&first)).unwrap();
    assert_eq!(info(&fake, &first)["state"], "stopped");
    let mut bridge = daytona_bridge(&fake, &dirs);
    assert!(bridge.load_session(&sid, &ws).result.is_ok());
    assert_eq!(bridge.prompt(&sid, "SCENARIO:followup again").stop_reason(), "end_turn");
    assert_eq!(only_sandbox(&fake), first);
    // Started for the turn, stopped again once it ended (`--remote-idle pause`, the default), in the background.
    assert_eq!(stopped_within(&fake, &first, std::time::Duration::from_secs(30)), "stopped");
    let runs = support::invocations(&workspace_of(&fake, &first));
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].flag_value("--session"), Some(runs[0].cli_session()));

    // Deleted on Daytona's side, it is replaced by a new sandbox on the next prompt, whose CLI does not know the
    // conversation: it starts a fresh one from the stored transcript, and the thread says so.
    runtime.block_on(provider.destroy(&first)).unwrap();
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    let replaced = only_sandbox(&fake);
    assert_ne!(replaced, first);
    assert_eq!(info(&fake, &replaced)["labels"], json!({"acp-sandbox.session": sid}));
    let runs = support::invocations(&workspace_of(&fake, &replaced));
    assert_eq!(runs.len(), 2);
    assert!(
        runs[0].has_flag("--session") && !runs[1].has_flag("--session"),
        "{:?} {:?}",
        runs[0].argv(),
        runs[1].argv()
    );
    assert!(runs[1].stdin_text().ends_with("Say hello"), "{}", runs[1].stdin_text());
    assert_eq!(
        turn.agent_text(),
        format!(
            "\n\n_The earlier OpenCode conversation ({}) no longer exists in the sandbox, so this prompt starts a fresh \
             one from a transcript of the earlier turns (tool details are not in it)._\n\nYes, I remember: this is \
             turn two of the same session.",
            runs[0].flag_value("--session").unwrap()
        )
    );
    assert_the_key_stayed_with_the_bridge(&fake, &dirs, &bridge);
}

#[test]
fn a_refused_daytona_key_answers_the_prompt_with_an_auth_error() {
    let dir = test_dir("bridge-auth");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-auth");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(daytona_options(&fake, &dirs).env("DAYTONA_API_KEY", "dtn_not_the_key"));
    let sid = bridge.new_session(&ws);
    let error = bridge.prompt(&sid, "Say hello").result.unwrap_err();
    assert_eq!(error.code, -32000);
    assert_eq!(
        error.message,
        "daytona: Daytona refused the API key (HTTP 401) while create a sandbox: check DAYTONA_API_KEY (and \
         DAYTONA_API_URL)"
    );
    assert_eq!(error.data, Some(json!({"provider": "daytona"})));
    assert_eq!(sandboxes(&fake), Vec::<String>::new());
    // The bridge goes on: the next prompt gets the same answer.
    assert_eq!(bridge.prompt(&sid, "Say hello").result.unwrap_err().code, -32000);
}

#[test]
fn opencodes_warm_server_falls_back_to_run_in_a_daytona_sandbox() {
    let dir = test_dir("bridge-serve");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-serve");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(daytona_options(&fake, &dirs).env("ACP_SANDBOX_OPENCODE_BACKEND", "serve"));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(
        turn.agent_text(),
        "\n\n_OpenCode's server could not start here, so this session runs `opencode run` per prompt (no live \
         output): the OpenCode server did not start: sandbox unavailable: a server inside a Daytona sandbox is not \
         supported yet_\n\nHello from the fake model. This is a plain text answer."
    );
    let runs = support::invocations(&workspace_of(&fake, &only_sandbox(&fake)));
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].argv()[0], "run");
}

/// The workspace of a Daytona sandbox is mirrored as E2B's is (the same code, over Daytona's files and commands):
/// uploaded on the first prompt, the agent's edit and new file sent to the editor and not written by the bridge,
/// a rejected edit undone in the sandbox, the user's own edit there before the next turn.
#[test]
fn the_workspace_goes_up_and_the_agents_changes_come_back_through_the_editor() {
    let dir = test_dir("workspace");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-workspace");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    std::fs::write(ws.join("mine.txt"), "mine\n").unwrap();
    let mut bridge = support::Bridge::start_reviewing(daytona_options(&fake, &dirs), false);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(
        &sid,
        &support::ops(json!([["read", "mine.txt"], ["write", "hello.txt", "agent\n"], ["write", "new.txt", "x\n"]])),
    );
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(support::reads(&turn), "READ mine.txt=mine\n");
    let writes: Vec<(PathBuf, String, Option<String>)> =
        bridge.file_writes.iter().map(|w| (w.path.clone(), w.content.clone(), w.before.clone())).collect();
    assert_eq!(
        writes,
        [
            (ws.join("hello.txt"), "agent\n".to_string(), Some("old\n".to_string())),
            (ws.join("new.txt"), "x\n".to_string(), None),
        ]
    );
    // Rejected: the user's files are as they were, and so is the sandbox's copy of them.
    assert_eq!(std::fs::read_to_string(ws.join("hello.txt")).unwrap(), "old\n");
    assert!(!ws.join("new.txt").exists());
    let remote = workspace_of(&fake, &only_sandbox(&fake));
    assert_eq!(std::fs::read_to_string(remote.join("hello.txt")).unwrap(), "old\n");
    assert!(!remote.join("new.txt").exists(), "the rejected new file stayed in the sandbox");

    std::fs::write(ws.join("mine.txt"), "edited by me\n").unwrap();
    let turn = bridge.prompt(&sid, &support::ops(json!([["read", "mine.txt"], ["read", "hello.txt"]])));
    assert_eq!(support::reads(&turn), "READ mine.txt=edited by me\n; hello.txt=old\n");
    assert_eq!(bridge.file_writes.len(), 2, "nothing more was sent");
}

/// Without an override, the CLI is installed in the Daytona sandbox on the first prompt, with the snapshot's own
/// npm (found on the sandbox's PATH, not this machine's), shown as a card, and found there by later prompts.
#[test]
fn the_cli_is_installed_in_the_daytona_sandbox_on_first_use_and_found_there_later() {
    use std::os::unix::fs::PermissionsExt;
    let dir = test_dir("install");
    let dirs = support::TestDirs::new("daytona-install");
    let bin = dirs.root().join("snapshot-bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("npm"), format!("#!/bin/sh\n{}", support::installing_npm())).unwrap();
    std::fs::set_permissions(bin.join("npm"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let fake = FakeDaytona::start_in(&dir, &[], &format!("{}:/usr/bin:/bin", bin.display()));
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(daytona_options(&fake, &dirs).without_env("ACP_SANDBOX_OPENCODE_BIN"));
    let sid = bridge.new_session(&ws);
    let first = bridge.prompt(&sid, "Say hello");
    assert_eq!(first.stop_reason(), "end_turn");
    assert_eq!(first.agent_text(), "Hello from the fake model. This is a plain text answer.");
    let install: Vec<(&Value, &Value)> = first
        .updates
        .iter()
        .filter(|u| u["toolCallId"] == "install-opencode")
        .map(|u| (&u["title"], &u["status"]))
        .collect();
    let title = json!("Installing OpenCode 1.18.33 in the sandbox (first use)");
    assert_eq!(install, [(&title, &json!("in_progress")), (&Value::Null, &json!("completed"))], "{:#?}", first.updates);
    let id = only_sandbox(&fake);
    let npm_log = fake.root.join(&id).join("home/.acp-sandbox/home/npm.log");
    assert_eq!(std::fs::read_to_string(&npm_log).unwrap().lines().count(), 1);

    let second = bridge.prompt(&sid, "Say hello");
    assert_eq!(second.stop_reason(), "end_turn");
    assert!(!second.updates.iter().any(|u| u["toolCallId"] == "install-opencode"), "{:#?}", second.updates);
    assert_eq!(std::fs::read_to_string(&npm_log).unwrap().lines().count(), 1, "npm ran again");
    assert_eq!(support::invocations(&workspace_of(&fake, &id)).len(), 2);
}
