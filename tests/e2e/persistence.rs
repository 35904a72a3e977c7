//! Sessions survive the bridge: after a SIGKILL mid-turn (what Zed does on close), a new bridge on the same data
//! dir lists them, `session/load` replays their history before answering, and the next prompt continues the same
//! CLI session.

use std::path::PathBuf;

use serde_json::json;

use crate::support::*;

const FIRST_PROMPT: &str = "Say hello to the persistence test";
const FIRST_ANSWER: &str = "Hello from the fake model. This is a plain text answer.";
const FOLLOWUP_ANSWER: &str = "Yes, I remember: this is turn two of the same session.";

/// Runs a completed first turn and a second one that is SIGKILLed mid-stream; returns the session id and the CLI
/// session id of the first turn.
fn session_interrupted_by_kill9(dirs: &TestDirs, ws: &std::path::Path) -> (String, String) {
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(ws);
    assert_eq!(bridge.prompt(&sid, FIRST_PROMPT).stop_reason(), "end_turn");
    bridge.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=300 FAKE_DELAY_MS=100 a long answer");
    let runs = wait_invocations(ws, 2);
    let _guard = KillOnDrop(runs[1].pid());
    bridge.wait_update(&sid, "a streamed chunk of the slow turn", |u| {
        u["sessionUpdate"] == "agent_message_chunk"
            && u["content"]["text"].as_str().unwrap_or("").contains("slow chunk")
    });
    bridge.kill9();
    (sid, runs[0].cli_session())
}

#[test]
fn sessions_survive_kill_9_and_load_replays_history_then_continues_the_cli_session() {
    let dirs = TestDirs::new("kill9");
    let ws = dirs.workspace("ws");
    let (sid, cli_session) = session_interrupted_by_kill9(&dirs, &ws);

    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let list = bridge.request("session/list", json!({})).unwrap();
    let listed = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sessionId"] == sid.as_str())
        .unwrap_or_else(|| panic!("session {sid} not listed after the restart: {list}"))
        .clone();
    assert_eq!(listed["cwd"], json!(ws), "{listed}");
    let title = listed["title"].as_str().unwrap_or_default();
    assert!(!title.trim().is_empty(), "the listed session has no title: {listed}");

    let loaded = bridge.load_session(&sid, &ws);
    assert!(loaded.result.is_ok(), "session/load: {:?}", loaded.result);
    let replay = &loaded.updates;
    let user = text_of(replay, "user_message_chunk");
    assert!(user.contains(FIRST_PROMPT), "the first prompt is not replayed: {:?}", kinds(replay));
    assert!(user.contains("a long answer"), "the interrupted prompt is not replayed: {:?}", kinds(replay));
    let agent = text_of(replay, "agent_message_chunk");
    assert!(agent.contains(FIRST_ANSWER), "the first answer is not replayed: {replay:?}");
    assert!(agent.contains("slow chunk 1 of 300"), "chunks streamed before the kill are not replayed");
    let first_user = replay.iter().position(|u| u["sessionUpdate"] == "user_message_chunk").unwrap();
    let first_agent = replay.iter().position(|u| u["sessionUpdate"] == "agent_message_chunk").unwrap();
    assert!(first_user < first_agent, "replay out of order: {:?}", kinds(replay));

    let next = bridge.prompt(&sid, "Do you remember?");
    assert_eq!(next.stop_reason(), "end_turn");
    assert!(next.agent_text().contains(FOLLOWUP_ANSWER), "{:?}", next.updates);
    let runs = invocations(&ws);
    assert_eq!(runs.len(), 3);
    assert_eq!(
        runs[2].flag_value("--session").as_deref(),
        Some(cli_session.as_str()),
        "the prompt after the restart must continue the CLI session: {:?}",
        runs[2].argv()
    );
}

#[test]
fn resume_restores_a_session_without_replay_and_continues_it() {
    let dirs = TestDirs::new("resume");
    let ws = dirs.workspace("ws");
    let (sid, cli_session) = {
        let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
        let sid = bridge.new_session(&ws);
        assert_eq!(bridge.prompt(&sid, FIRST_PROMPT).stop_reason(), "end_turn");
        bridge.kill9();
        (sid, invocations(&ws)[0].cli_session())
    };

    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let resumed = bridge.request("session/resume", json!({"sessionId": sid, "cwd": ws}));
    assert!(resumed.is_ok(), "session/resume: {resumed:?}");
    let replayed: Vec<_> = bridge
        .take_updates(&sid)
        .into_iter()
        .filter(|u| u["sessionUpdate"] == "user_message_chunk" || u["sessionUpdate"] == "agent_message_chunk")
        .collect();
    assert!(replayed.is_empty(), "session/resume must not replay history: {replayed:?}");

    let next = bridge.prompt(&sid, "Do you remember?");
    assert_eq!(next.stop_reason(), "end_turn");
    assert_eq!(invocations(&ws)[1].flag_value("--session").as_deref(), Some(cli_session.as_str()));
}

#[test]
fn load_caps_the_replay_and_says_what_was_cut() {
    let dirs = TestDirs::new("replay-cap");
    let ws = dirs.workspace("ws");
    // Each turn of the text scenario stores about three updates plus its prompt.
    let options = || BridgeOptions::new("opencode", &dirs.data).arg("--replay-limit").arg("6");
    let mut bridge = Bridge::start(options());
    let sid = bridge.new_session(&ws);
    for n in 1..=3 {
        assert_eq!(bridge.prompt(&sid, &format!("turn number {n}")).stop_reason(), "end_turn");
    }
    drop(bridge);

    let mut bridge = Bridge::start(options());
    let load = bridge.load_session(&sid, &ws);
    load.result.as_ref().expect("load must succeed");
    let user_text = text_of(&load.updates, "user_message_chunk");
    assert!(user_text.contains("turn number 3"), "the newest turn is replayed: {user_text}");
    assert!(!user_text.contains("turn number 1"), "the oldest turn is cut: {user_text}");
    let first_agent_text = load.updates.iter().find(|u| u["sessionUpdate"] == "agent_message_chunk").unwrap();
    assert!(
        first_agent_text["content"]["text"].as_str().unwrap_or_default().contains("not shown"),
        "a visible note must come first and say history was cut: {first_agent_text}"
    );
    assert_eq!(bridge.prompt(&sid, "and now?").stop_reason(), "end_turn", "a cut replay still continues");
}

#[test]
fn load_replays_a_cancelled_and_a_failed_turn_each_with_a_note_of_how_it_ended() {
    let dirs = TestDirs::new("replay-endings");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    let id = bridge.send_prompt(&sid, "SCENARIO:hang wait");
    let runs = wait_invocations(&ws, 1);
    let _guard = KillOnDrop(runs[0].pid());
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, id).stop_reason(), "cancelled");
    let failed = bridge.prompt(&sid, "SCENARIO:error400 fail");
    let error = failed.result.as_ref().expect_err("the error turn fails").message.clone();
    drop(bridge);

    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let load = bridge.load_session(&sid, &ws);
    load.result.as_ref().expect("load must succeed");
    let replay: Vec<(String, String)> = load
        .updates
        .iter()
        .filter(|u| matches!(u["sessionUpdate"].as_str(), Some("user_message_chunk" | "agent_message_chunk")))
        .map(|u| (u["sessionUpdate"].as_str().unwrap().to_string(), u["content"]["text"].as_str().unwrap().to_string()))
        .filter(|(_, text)| !text.contains("WITHOUT a sandbox"))
        .collect();
    let pair = |kind: &str, text: &str| (kind.to_string(), text.to_string());
    assert_eq!(
        replay,
        [
            pair("user_message_chunk", "SCENARIO:hang wait"),
            pair("agent_message_chunk", "\n\n_This turn was cancelled before it finished._\n\n"),
            pair("user_message_chunk", "SCENARIO:error400 fail"),
            pair("agent_message_chunk", &format!("\n\n_This turn failed: {error}_\n\n")),
        ],
        "{:#?}",
        load.updates
    );
}

#[test]
fn a_session_lost_with_its_deleted_data_dir_is_not_found_with_a_word_of_why() {
    let dirs = TestDirs::new("data-dir-deleted");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    bridge.kill9();
    std::fs::remove_dir_all(&dirs.data).unwrap();

    // The editor keeps its own thread list, so after a restart it asks for a session the new store never had.
    let mut next = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let error = next.load_session(&sid, &ws).result.expect_err("the session went with its data dir");
    assert_eq!(error.code, -32002, "{error}");
    let store = dirs.data.join("acp-sandbox.sqlite3");
    assert_eq!(
        error.message,
        format!(
            "Session not found: {sid} is not in the session store {} (it holds no sessions). If the session was made \
             here before, the data dir was deleted or replaced, or --data-dir or XDG_DATA_HOME now names another one",
            store.display()
        )
    );

    // A store that holds sessions says how many and since when, and where to look.
    let other = next.new_session(&ws);
    let listed = next.request("session/list", json!({})).unwrap();
    assert_eq!(listed["sessions"][0]["sessionId"], other.as_str(), "{listed}");
    let error = next.load_session(&sid, &ws).result.expect_err("still not there");
    let (before, after) = error.message.split_once(", the oldest from ").unwrap_or_else(|| panic!("{error}"));
    assert_eq!(before, format!("Session not found: {sid} is not in the session store {} (1 session", store.display()));
    let (created, hint) = after.split_once(')').unwrap_or_else(|| panic!("{error}"));
    assert!(humantime::parse_rfc3339(created).is_ok(), "{created:?} is not a time: {error}");
    assert_eq!(
        hint,
        ". It was deleted, or it is in another data dir (--data-dir); `acp-sandbox sessions list` shows what this store \
         holds"
    );
}

#[test]
fn the_caches_of_sessions_unused_for_two_weeks_are_freed_and_nothing_else() {
    let dirs = TestDirs::new("trim-caches");
    let (ws_old, ws_new) = (dirs.workspace("old"), dirs.workspace("new"));
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let (old, new) = (bridge.new_session(&ws_old), bridge.new_session(&ws_new));
    assert_eq!(bridge.prompt(&old, "Say hello").stop_reason(), "end_turn");
    assert_eq!(bridge.prompt(&new, "Say hello").stop_reason(), "end_turn");
    bridge.kill9();

    // What OpenCode downloads into a session (plugins, npm's cache), a link the agent planted in it, and what
    // must stay: the CLI's conversations, and the file the link points to.
    let precious = dirs.workspace("outside").join("precious");
    std::fs::write(&precious, "keep me").unwrap();
    let state = |sid: &str| dirs.data.join("sessions").join(sid);
    for sid in [&old, &new] {
        let plugin = state(sid).join("cache/opencode/node_modules/some-plugin");
        std::fs::create_dir_all(&plugin).unwrap();
        std::fs::write(plugin.join("index.js"), "export default {}").unwrap();
        std::os::unix::fs::symlink(&precious, state(sid).join("cache/opencode/planted")).unwrap();
        std::fs::create_dir_all(state(sid).join("home/.npm/_cacache")).unwrap();
        std::fs::write(state(sid).join("home/.npm/_cacache/entry"), "packument").unwrap();
        std::fs::write(state(sid).join("data/conversation"), "the CLI's own state").unwrap();
    }
    let fifteen_days_ago = now_ms() - 15 * 86_400_000;
    let connection = rusqlite::Connection::open(dirs.data.join("acp-sandbox.sqlite3")).unwrap();
    connection.execute("UPDATE sessions SET updated_at = ?1 WHERE id = ?2", (fifteen_days_ago, &old)).unwrap();

    let mut next = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let entries = |dir: PathBuf| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|read| read.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    // The caches are emptied one after the other, in the background.
    let caches = || [entries(state(&old).join("cache")), entries(state(&old).join("home/.npm"))];
    let freed = wait_until(RECV_TIMEOUT, || caches().iter().all(Vec::is_empty));
    assert!(freed, "the unused session's caches: {:?}", caches());
    assert_eq!(std::fs::read_to_string(state(&old).join("data/conversation")).unwrap(), "the CLI's own state");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me", "a planted link is removed, not followed");
    // The session used lately keeps everything.
    assert_eq!(entries(state(&new).join("cache/opencode")), ["node_modules", "planted"]);
    assert_eq!(entries(state(&new).join("home/.npm")), ["_cacache"]);

    // The trimmed session goes on as before.
    assert!(next.load_session(&old, &ws_old).result.is_ok());
    assert_eq!(next.prompt(&old, "Say hello again").stop_reason(), "end_turn");
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

const IN_ANOTHER_WINDOW: &str = "This session's turn is running in another window (another acp-sandbox on the same data dir); wait for it to finish there or cancel it there, then send this prompt again";

/// Two editor windows are two bridges on one data dir: while one runs a turn of a session, the other's prompt and
/// delete of it are refused, and a SIGKILLed window leaves nothing locked behind it.
#[test]
fn a_second_window_cannot_prompt_or_delete_a_session_whose_turn_runs_and_a_killed_window_leaves_no_lock() {
    let dirs = TestDirs::new("two-windows");
    let ws = dirs.workspace("ws");
    let mut first = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = first.new_session(&ws);
    let mut second = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    second.load_session(&sid, &ws).result.expect("the second window loads the session");

    first.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=600 FAKE_DELAY_MS=100 a long answer");
    let runs = wait_invocations(&ws, 1);
    let _guard = KillOnDrop(runs[0].pid());
    first.wait_update(&sid, "a streamed chunk of the slow turn", |u| {
        u["sessionUpdate"] == "agent_message_chunk"
            && u["content"]["text"].as_str().unwrap_or("").contains("slow chunk")
    });

    let refused = second.prompt(&sid, "Say hello from the second window");
    let error = refused.result.expect_err("a second window's prompt must be refused while the turn runs");
    assert_eq!((error.code, error.message.as_str()), (-32600, IN_ANOTHER_WINDOW));
    let deleted = second.request("session/delete", json!({"sessionId": sid}));
    let error = deleted.expect_err("a second window's delete must be refused while the turn runs");
    assert_eq!(
        error.message,
        "This session's turn is running in another window (another acp-sandbox on the same data dir), so the session was not deleted: cancel the turn there or wait for it to finish, then delete it"
    );
    assert_eq!(invocations(&ws).len(), 1, "the second window started a CLI");

    first.kill9();
    let mut third = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    third.load_session(&sid, &ws).result.expect("load after the kill");
    assert_eq!(
        third.prompt(&sid, "Say hello after the kill").stop_reason(),
        "end_turn",
        "the killed window left a lock"
    );
    assert_eq!(second.prompt(&sid, "Say hello again").stop_reason(), "end_turn", "the second window's turn");
}

/// Prompts of one session sent to two windows at the same moment: exactly one runs, the other is refused.
#[test]
fn two_windows_prompting_one_session_at_once_run_exactly_one_turn() {
    let dirs = TestDirs::new("two-windows-race");
    let ws = dirs.workspace("ws");
    let mut first = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = first.new_session(&ws);
    let mut second = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    second.load_session(&sid, &ws).result.expect("the second window loads the session");

    let prompt = "SCENARIO:slow FAKE_COUNT=100 FAKE_DELAY_MS=100 one of two";
    let (a, b) = (first.send_prompt(&sid, prompt), second.send_prompt(&sid, prompt));
    let answers = [first.wait_response(a), second.wait_response(b)];
    let ran: Vec<_> = answers.iter().filter(|answer| answer.is_ok()).collect();
    let refused: Vec<_> = answers.iter().filter_map(|answer| answer.as_ref().err()).collect();
    assert_eq!(ran.len(), 1, "exactly one window runs the turn: {answers:?}");
    assert_eq!(ran[0].as_ref().unwrap()["stopReason"], "end_turn");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].message, IN_ANOTHER_WINDOW);
    assert_eq!(invocations(&ws).len(), 1, "both windows started a CLI");
}
