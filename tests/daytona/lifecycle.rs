//! Process lifecycles in a Daytona sandbox: every command is tagged, and what it started ends with it (when it
//! ends, and on cancel, a `setsid` grandchild too); a new bridge ends what a killed one left running (with a note
//! in the thread) and never its own commands. The fake runs commands on this host: the pids they print are real.

use super::bridge::{daytona_bridge, daytona_options, only_sandbox, sandboxes, workspace_of};
use super::*;
use pretty_assertions::assert_eq;

/// The host pids of the fake CLI of scenario `child` running in the session's sandbox, and of its grandchild (in
/// a session of its own), once both run.
fn cli_and_grandchild(fake: &FakeDaytona) -> (String, i32, i32) {
    assert!(support::wait_until(support::RECV_TIMEOUT, || !sandboxes(fake).is_empty()), "no sandbox was made");
    let id = only_sandbox(fake);
    let inside = workspace_of(fake, &id);
    let cli = support::wait_invocations(&inside, 1)[0].0["pid"].as_i64().unwrap() as i32;
    let child_file = inside.join(".fake-cli/child.pid");
    assert!(support::wait_until(support::RECV_TIMEOUT, || child_file.exists()), "the grandchild never started");
    (id, cli, std::fs::read_to_string(&child_file).unwrap().trim().parse().unwrap())
}

/// The toolbox session each start of the fake CLI ran in, in order (named by the command's tag).
fn cli_sessions(fake: &FakeDaytona) -> Vec<String> {
    fake.requests()
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"].as_str().unwrap().ends_with("/exec"))
        .filter(|r| r["body"]["command"].as_str().unwrap_or_default().contains("/fakes/opencode' "))
        .map(|r| r["path"].as_str().unwrap().rsplit('/').nth(1).unwrap().to_string())
        .collect()
}

/// A fake Daytona, a bridge running sessions there, and a session.
fn session_in_daytona(name: &str) -> (FakeDaytona, support::TestDirs, PathBuf, support::Bridge, String) {
    let fake = FakeDaytona::start(&test_dir(name));
    let dirs = support::TestDirs::new(&format!("daytona-{name}"));
    let ws = dirs.remote_workspace("ws");
    let mut bridge = daytona_bridge(&fake, &dirs);
    let sid = bridge.new_session(&ws);
    (fake, dirs, ws, bridge, sid)
}

#[test]
fn cancel_ends_the_clis_whole_process_tree_in_the_daytona_sandbox() {
    let (fake, _dirs, _ws, mut bridge, sid) = session_in_daytona("cancel-tree");
    // The CLI starts a grandchild in a session of its own, which a signal to the CLI's group never reaches (nor
    // does stopping the fake's sandbox after the turn).
    let prompt = bridge.send_prompt(&sid, "SCENARIO:child start something");
    let (id, cli, child) = cli_and_grandchild(&fake);
    let _guards = (support::KillOnDrop(cli), support::KillOnDrop(child));
    assert!(alive(cli) && alive(child));

    let cancelled = Instant::now();
    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, prompt);
    assert_eq!(turn.stop_reason(), "cancelled");
    let gone = support::wait_until(support::RECV_TIMEOUT, || !alive(cli) && !alive(child));
    // Measured, not asserted.
    eprintln!("TIMING daytona cancel to the whole tree gone: {:?}", cancelled.elapsed());
    assert!(gone, "the CLI {cli} or its grandchild {child} outlived the cancel");
    // The CLI's group was killed through the daemon; the rest by the command's mark.
    let terminates = fake.requests().iter().filter(|r| r["path"].as_str().unwrap().ends_with("/terminate")).count();
    assert_eq!(terminates, 1);
    // The session goes on in the same sandbox.
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert_eq!(only_sandbox(&fake), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_command_leaves_running_ends_with_it() {
    let dir = test_dir("lifecycle-leftover");
    let fake = FakeDaytona::start(&dir);
    let (provider, id, sandbox) = created(&fake, "s-leftover").await;
    // Daemons of the command's, one in its process group and one in a session of its own: no longer its children
    // once it exits, and holding none of its pipes.
    let script = "sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > daemon.pid; \
                  setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > setsid.pid; exit 0";
    let mut process = sandbox.exec(shell(sandbox.as_ref(), script, &[])).await.unwrap();
    assert_eq!(within("the exit", process.handle.wait()).await.unwrap(), ExitInfo { code: Some(0), signal: None });
    let pid = |name: &str| -> i32 {
        std::fs::read_to_string(workspace_of(&fake, &id).join(name)).unwrap().trim().parse().unwrap()
    };
    let (daemon, setsid) = (pid("daemon.pid"), pid("setsid.pid"));
    let _guards = (support::KillOnDrop(daemon), support::KillOnDrop(setsid));
    // Gone by the time `wait` answered: the next turn never finds them.
    assert!(!alive(daemon), "the command's daemon {daemon} outlived it");
    assert!(!alive(setsid), "the command's setsid daemon {setsid} outlived it");
    provider.destroy(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_bridge_ends_only_what_earlier_bridges_left_running() {
    let dir = test_dir("lifecycle-earlier");
    let fake = FakeDaytona::start(&dir);
    let (_old_provider, id, old) = created(&fake, "s-earlier").await;
    let script = "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!; echo $$; exec sleep 1000";
    let RunningProcess { stdout, handle: mut old_handle, .. } =
        old.exec(shell(old.as_ref(), script, &[])).await.unwrap();
    let mut lines = AsyncBufReader::new(stdout).lines();
    let mut next_pid = async || -> i32 { within("a pid", lines.next_line()).await.unwrap().unwrap().parse().unwrap() };
    let (old_child, old_cli) = (next_pid().await, next_pid().await);
    let _guards = (support::KillOnDrop(old_child), support::KillOnDrop(old_cli));

    // Another bridge (another provider, so another instance) on the same session and sandbox.
    let new_provider = fake.provider(KEY);
    let new = new_provider.connect(&id, &spec("s-earlier")).await.unwrap().expect("the sandbox is there");
    let RunningProcess { stdout, handle: mut own, .. } =
        new.exec(shell(new.as_ref(), "echo $$; exec sleep 1000", &[])).await.unwrap();
    let own_pid: i32 =
        within("the pid", AsyncBufReader::new(stdout).lines().next_line()).await.unwrap().unwrap().parse().unwrap();
    let _guard = support::KillOnDrop(own_pid);
    // Another session's command in the same sandbox is not this session's to end.
    let other = fake.provider(KEY).connect(&id, &spec("s-other")).await.unwrap().unwrap();
    let RunningProcess { stdout, handle: mut theirs, .. } =
        other.exec(shell(other.as_ref(), "echo $$; exec sleep 1000", &[])).await.unwrap();
    let their_pid: i32 =
        within("the pid", AsyncBufReader::new(stdout).lines().next_line()).await.unwrap().unwrap().parse().unwrap();
    let _guard = support::KillOnDrop(their_pid);

    assert_eq!(within("ending the leftovers", new.end_leftovers()).await.unwrap(), 1);
    assert!(
        !alive(old_cli) && !alive(old_child),
        "the earlier bridge's command {old_cli} or child {old_child} runs on"
    );
    assert!(alive(own_pid), "the bridge ended its own command");
    assert!(alive(their_pid), "another session's command was ended");
    // The earlier command's session went with it: its handle (in a bridge that would be gone) sees no exit code.
    assert_eq!(within("the old exit", old_handle.wait()).await.unwrap(), ExitInfo { code: None, signal: None });
    // Nothing is left to end.
    assert_eq!(within("again", new.end_leftovers()).await.unwrap(), 0);
    assert!(alive(own_pid));
    own.kill().await;
    theirs.kill().await;
    assert!(!alive(own_pid) && !alive(their_pid));
}

#[test]
fn a_cli_left_running_by_a_killed_bridge_is_ended_with_a_note_before_the_next_prompt_runs() {
    let (fake, dirs, ws, mut bridge, sid) = session_in_daytona("stray");
    bridge.send_prompt(&sid, "SCENARIO:child work for a long time");
    let (id, old, child) = cli_and_grandchild(&fake);
    let _guards = (support::KillOnDrop(old), support::KillOnDrop(child));
    support::wait_native_id(&dirs, &sid);
    bridge.kill9();
    // The sandbox outlives the bridge, and so does its CLI: the premise.
    assert!(alive(old), "the CLI died with the bridge");

    let _bridge = support::prompt_after_a_killed_bridge(daytona_options(&fake, &dirs), &ws, &sid);
    assert!(!alive(old) && !alive(child), "the earlier CLI {old} or its child {child} runs on");
    assert_eq!(support::invocations(&workspace_of(&fake, &id)).len(), 2);
    // Never two CLIs on one conversation: the stray's session was listed and deleted before the new CLI started,
    // and each bridge named its commands' sessions with its own instance.
    let sessions = cli_sessions(&fake);
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    let prefix = format!("acp-{sid}-");
    let instances: Vec<&str> =
        sessions.iter().map(|s| s.strip_prefix(&prefix).unwrap().split('-').next().unwrap()).collect();
    assert_ne!(instances[0], instances[1]);
    // The toolbox's calls, as `METHOD /path` below the sandbox's toolbox.
    let calls: Vec<String> = fake
        .requests()
        .iter()
        .filter_map(|r| {
            let path = r["path"].as_str().unwrap().strip_prefix(&format!("/toolbox/{id}"))?;
            Some(format!("{} {}", r["method"].as_str().unwrap(), path.split('?').next().unwrap()))
        })
        .collect();
    let at = |call: String| calls.iter().position(|c| *c == call).unwrap_or_else(|| panic!("no {call} in {calls:?}"));
    let (first, deleted, second) = (
        at(format!("POST /process/session/{}/exec", sessions[0])),
        at(format!("DELETE /process/session/{}", sessions[0])),
        at(format!("POST /process/session/{}/exec", sessions[1])),
    );
    let listed = calls[..deleted].iter().rposition(|c| c == "GET /process/session").unwrap();
    assert!(first < listed && listed < deleted && deleted < second, "{calls:?}");
}
