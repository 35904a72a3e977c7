//! The built bridge against the fake Daytona where Daytona differs from the happy path: a session shell without
//! zsh (its output labeller drops NUL bytes), a delete while the bridge's own stop is still under way, a cancel
//! answered before the tidying up, workspace secrets, a daemon without `terminate`, a sandbox deleted mid-turn.

use super::bridge::{daytona_options, only_sandbox, workspace_of};
use super::*;
use pretty_assertions::assert_eq;

/// Under bash and dash, the daemon's labeller loses every NUL byte of a command's output: the mirror's listing
/// still reads (it is encoded as text), so the agent's edit and new file reach the user's files exactly, and the
/// next turn finds them in the sandbox (never uploaded afresh over the agent's work).
#[test]
fn under_a_bash_or_dash_session_shell_the_agents_edits_reach_the_users_files_exactly() {
    for shell in ["bash", "dash"] {
        let dir = test_dir(&format!("shell-{shell}"));
        let fake = FakeDaytona::start_with(&dir, &["--session-shell", shell]);
        let dirs = support::TestDirs::new(&format!("daytona-shell-{shell}"));
        let ws = dirs.remote_workspace("ws");
        std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
        let mut bridge = support::Bridge::start_reviewing(daytona_options(&fake, &dirs), true);
        let sid = bridge.new_session(&ws);
        let turn = bridge.prompt(
            &sid,
            &support::ops(json!([["write", "hello.txt", "agent \\ edit\n"], ["write", "dir/new.txt", "x\n"]])),
        );
        assert_eq!(turn.stop_reason(), "end_turn", "{shell}");
        assert_eq!(std::fs::read_to_string(ws.join("hello.txt")).unwrap(), "agent \\ edit\n", "{shell}");
        assert_eq!(std::fs::read_to_string(ws.join("dir/new.txt")).unwrap(), "x\n", "{shell}");
        assert_eq!(support::notes(&turn), Vec::<String>::new(), "{shell}");
        let turn = bridge.prompt(&sid, &support::ops(json!([["read", "hello.txt"], ["read", "dir/new.txt"]])));
        assert_eq!(support::reads(&turn), "READ hello.txt=agent \\ edit\n; dir/new.txt=x\n", "{shell}");
        let remote = workspace_of(&fake, &only_sandbox(&fake));
        assert_eq!(std::fs::read_to_string(remote.join("hello.txt")).unwrap(), "agent \\ edit\n", "{shell}");
        // The mirror's token goes up with a workspace uploaded afresh: once, on the first prompt, never again.
        let tokens = fake
            .requests()
            .iter()
            .filter(|r| r["path"].as_str().unwrap().ends_with("/files/bulk-upload"))
            .filter(|r| r["body"].to_string().contains("/.acp-sandbox/mirror-token"))
            .count();
        assert_eq!(tokens, 1, "{shell}");
    }
}

/// The workspace's `.env` files and private keys (and what the local sandbox hides in a home) never reach the
/// provider: not in an upload, not on the sandbox's disk; the turn names them. `--remote-upload-secrets` sends them.
#[test]
fn workspace_secrets_are_never_uploaded_unless_the_user_allows_it() {
    for allowed in [false, true] {
        let dir = test_dir(&format!("workspace-secrets-{allowed}"));
        let record_files = dir.join("files.jsonl");
        let fake = FakeDaytona::start_with(&dir, &["--record-files", &record_files.display().to_string()]);
        let dirs = support::TestDirs::new(&format!("daytona-workspace-secrets-{allowed}"));
        let ws = dirs.remote_workspace("ws");
        let secrets = [
            (".env", "TOKEN=env-secret-1\n"),
            ("app/.env.local", "TOKEN=env-secret-2\n"),
            (".ssh/id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\nkey-secret-3\n"),
            (".aws/credentials", "aws_secret_access_key=aws-secret-4\n"),
        ];
        for (rel, text) in secrets {
            std::fs::create_dir_all(ws.join(rel).parent().unwrap()).unwrap();
            std::fs::write(ws.join(rel), text).unwrap();
        }
        std::fs::write(ws.join("main.rs"), "fn main() {}\n").unwrap();
        let mut options = daytona_options(&fake, &dirs);
        if allowed {
            options = options.arg("--remote-upload-secrets");
        }
        let mut bridge = support::Bridge::start_reviewing(options, true);
        let sid = bridge.new_session(&ws);
        let turn = bridge.prompt(&sid, &support::ops(json!([["read", "main.rs"], ["read", ".env"]])));
        assert_eq!(turn.stop_reason(), "end_turn");
        let remote = workspace_of(&fake, &only_sandbox(&fake));
        let uploaded = std::fs::read_to_string(&record_files).unwrap();
        assert_eq!(std::fs::read_to_string(remote.join("main.rs")).unwrap(), "fn main() {}\n");
        if allowed {
            assert_eq!(support::reads(&turn), "READ main.rs=fn main() {}\n; .env=TOKEN=env-secret-1\n");
            assert_eq!(support::notes(&turn), Vec::<String>::new());
            for (rel, text) in secrets {
                assert_eq!(std::fs::read_to_string(remote.join(rel)).unwrap(), text, "{rel}");
            }
            continue;
        }
        assert_eq!(support::reads(&turn), "READ main.rs=fn main() {}\n; .env=<missing>");
        assert_eq!(
            support::notes(&turn),
            ["_Not uploaded to the sandbox, because they look secret: `.aws/credentials`, `.env`, `.ssh/id_ed25519`, \
              `app/.env.local` (the agent does not see them; `--remote-upload-secrets` sends such files)._"]
        );
        for (rel, text) in secrets {
            assert!(!remote.join(rel).exists(), "{rel} reached the sandbox");
            let secret = text.trim().rsplit(['=', '\n']).next().unwrap();
            assert!(!uploaded.contains(secret), "{secret} of {rel} was uploaded");
        }
        // Said once: the next turn sends nothing of them and says nothing, and the user's files are untouched.
        let turn = bridge.prompt(&sid, "Say hello");
        assert_eq!(support::notes(&turn), Vec::<String>::new());
        for (rel, text) in secrets {
            assert_eq!(std::fs::read_to_string(ws.join(rel)).unwrap(), text, "{rel}");
            assert!(!remote.join(rel).exists(), "{rel} reached the sandbox");
        }
    }
}

/// `session/delete` right after a turn meets the bridge's own background stop under way (Daytona refuses a delete
/// then, 409 "Sandbox state change in progress"): the delete waits for the stop and succeeds, and the sandbox goes.
#[test]
fn a_delete_right_after_a_turn_waits_for_the_background_stop_and_the_sandbox_goes() {
    let dir = test_dir("delete-while-stopping");
    let fake = FakeDaytona::start_with(&dir, &["--state-change-seconds", "2"]);
    let dirs = support::TestDirs::new("daytona-delete-while-stopping");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(daytona_options(&fake, &dirs));
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let id = only_sandbox(&fake);
    let stop = format!("/api/sandbox/{id}/stop");
    let stopping = support::wait_until(support::RECV_TIMEOUT, || {
        fake.requests().iter().any(|r| r["method"] == "POST" && r["path"] == json!(stop))
    });
    assert!(stopping, "the bridge did not stop the sandbox after the turn within {:?}", support::RECV_TIMEOUT);
    // The stop takes 2 s: this delete arrives while it is under way.
    assert_eq!(bridge.request("session/delete", json!({"sessionId": sid})), Ok(json!({})));
    assert_eq!(super::bridge::sandboxes(&fake), Vec::<String>::new());
    let deletes = fake
        .requests()
        .iter()
        .filter(|r| r["method"] == "DELETE" && r["path"] == json!(format!("/api/sandbox/{id}")))
        .count();
    assert!(deletes >= 2, "the first delete should have met the stop under way, and been refused: {deletes}");
}

/// A daemon without the `terminate` route (every public one so far) costs one 404 per sandbox: the next cancel
/// goes straight to deleting the command's session.
#[test]
fn a_daemon_without_terminate_is_asked_for_it_once_per_sandbox() {
    let dir = test_dir("no-terminate");
    let fake = FakeDaytona::start_with(&dir, &["--no-terminate"]);
    let dirs = support::TestDirs::new("daytona-no-terminate");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(daytona_options(&fake, &dirs));
    let sid = bridge.new_session(&ws);
    for turn in 1..=2 {
        let prompt = bridge.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=100000 FAKE_DELAY_MS=20 keep talking");
        bridge.wait_update(&sid, "a streamed chunk", |u| u["sessionUpdate"] == "agent_message_chunk");
        let id = only_sandbox(&fake);
        let cli = support::wait_invocations(&workspace_of(&fake, &id), turn)[turn - 1].0["pid"].as_i64().unwrap();
        bridge.cancel(&sid);
        assert_eq!(bridge.finish_turn(&sid, prompt).stop_reason(), "cancelled");
        assert!(
            support::wait_until(support::RECV_TIMEOUT, || !support::pid_alive(cli as i32)),
            "the CLI {cli} still runs {:?} after the cancel of turn {turn}",
            support::RECV_TIMEOUT
        );
    }
    let terminates = fake.requests().iter().filter(|r| r["path"].as_str().unwrap().ends_with("/terminate")).count();
    assert_eq!(terminates, 1);
}

/// A sandbox deleted on Daytona's side while the turn runs: the turn fails saying so (not "an unknown status"),
/// and the next prompt runs in a new sandbox.
#[test]
fn a_sandbox_deleted_mid_turn_is_named_and_the_next_prompt_makes_a_new_one() {
    let dir = test_dir("deleted-mid-turn");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-deleted-mid-turn");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(daytona_options(&fake, &dirs));
    let sid = bridge.new_session(&ws);
    let prompt = bridge.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=100000 FAKE_DELAY_MS=20 keep talking");
    bridge.wait_update(&sid, "a streamed chunk", |u| u["sessionUpdate"] == "agent_message_chunk");
    let id = only_sandbox(&fake);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(fake.provider(KEY).destroy(&id)).unwrap();
    let error = bridge.finish_turn(&sid, prompt).result.unwrap_err();
    assert_eq!(
        (error.code, error.message.as_str()),
        (
            -32603,
            format!(
                "daytona: the Daytona sandbox {id} was deleted or stopped outside the bridge while the turn ran; the \
                 next prompt starts it again, or makes a new one if it is gone"
            )
            .as_str()
        )
    );
    // The next prompt runs in a new sandbox (its CLI replays the stored transcript, slow scenario included: it is
    // cancelled once it runs there).
    let prompt = bridge.send_prompt(&sid, "Say hello");
    let moved = support::wait_until(support::RECV_TIMEOUT, || {
        let ids = super::bridge::sandboxes(&fake);
        ids.len() == 1 && ids[0] != id && !support::invocations(&workspace_of(&fake, &ids[0])).is_empty()
    });
    assert!(
        moved,
        "no new sandbox ran the CLI within {:?}: {:?}",
        support::RECV_TIMEOUT,
        super::bridge::sandboxes(&fake)
    );
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, prompt).stop_reason(), "cancelled");
}

/// A cancel is answered before the end-of-turn tidying: the fake sees no workspace listing between the cancel and
/// its answer; the next prompt lists (and reviews) what the cancelled turn left, before its CLI runs.
#[test]
fn a_cancel_is_answered_before_the_workspace_is_listed() {
    let dir = test_dir("cancel-first");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-cancel-first");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(daytona_options(&fake, &dirs));
    let sid = bridge.new_session(&ws);
    let listings = || {
        fake.requests()
            .iter()
            .filter(|r| r["path"].as_str().unwrap().ends_with("/exec"))
            .filter(|r| r["body"].to_string().contains("-mindepth 1"))
            .count()
    };
    let prompt = bridge.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=100000 FAKE_DELAY_MS=20 keep talking");
    bridge.wait_update(&sid, "a streamed chunk", |u| u["sessionUpdate"] == "agent_message_chunk");
    let before = listings();
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, prompt).stop_reason(), "cancelled");
    assert_eq!(listings(), before, "the workspace was listed before the cancel was answered");
    let runs = support::invocations(&workspace_of(&fake, &only_sandbox(&fake))).len();
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert!(listings() > before, "the next prompt did not list the workspace");
    assert_eq!(support::invocations(&workspace_of(&fake, &only_sandbox(&fake))).len(), runs + 1);
}
