//! Nothing lost, nothing hung: what the bridge does when its store cannot write (a full disk, a data dir deleted
//! while it runs, another program holding the write lock), with databases of earlier schemas, and with a turn
//! longer than the replay limit. The editor must only ever see what the store kept, and a turn that cannot be
//! kept ends with an error that says what to do.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

fn database(dirs: &TestDirs) -> PathBuf {
    dirs.data.join("acp-sandbox.sqlite3")
}

/// A connection of the test's own to the bridge's database, like another program's.
fn other_program(path: &Path) -> rusqlite::Connection {
    let connection = rusqlite::Connection::open(path).unwrap();
    connection.busy_timeout(Duration::from_secs(60)).unwrap();
    connection
}

/// The status of a session's turns, oldest first, read from the database.
fn turn_statuses(path: &Path, session: &str) -> Vec<String> {
    let connection = other_program(path);
    let mut statement = connection.prepare("SELECT status FROM turns WHERE session_id = ?1 ORDER BY id").unwrap();
    statement.query_map([session], |row| row.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
}

/// The store error of a failed prompt: its `data.store` reason, failing the test if the prompt did not fail so.
fn store_error(turn: &Turn) -> (String, RpcError) {
    let error = turn.result.clone().expect_err("the turn must fail when its updates cannot be stored");
    let reason = error.data.as_ref().and_then(|data| data["store"].as_str()).unwrap_or_default().to_string();
    (reason, error)
}

/// The updates a replay shows for one turn: those after its prompt, up to the note that closes a failed turn.
fn replayed_turn(replay: &[Value], prompt: &str) -> Vec<Value> {
    let start = replay
        .iter()
        .position(|u| u["sessionUpdate"] == "user_message_chunk" && u["content"]["text"] == prompt)
        .unwrap_or_else(|| panic!("the prompt {prompt:?} is not replayed: {:?}", kinds(replay)));
    replay[start + 1..]
        .iter()
        .take_while(|u| {
            u["sessionUpdate"] != "user_message_chunk"
                && !u["content"]["text"].as_str().unwrap_or_default().contains("_This turn failed")
        })
        .cloned()
        .collect()
}

/// A turn's updates without the session's command list, which is not part of any turn (it follows
/// `session/new` and `session/load`, and may arrive after a prompt was sent).
fn of_the_turn(updates: &[Value]) -> Vec<Value> {
    // Updates of the session, not of a turn: its commands, and its options once OpenCode listed its models.
    let session_wide = ["available_commands_update", "config_option_update"];
    updates.iter().filter(|u| !session_wide.iter().any(|kind| u["sessionUpdate"] == *kind)).cloned().collect()
}

/// What a full disk says, exactly.
fn disk_full_message(data_dir: &Path) -> String {
    format!(
        "The disk holding {} is full: the session's last update could not be saved; free space on it (saving resumes by itself as soon as there is room)",
        data_dir.display()
    )
}

fn is_failed_note(update: &Value, words: &str) -> bool {
    let text = update["content"]["text"].as_str().unwrap_or_default();
    text.contains("This turn failed") && text.contains(words)
}

/// A size-limited tmpfs mounted at a test's path, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts one; fails the test when it cannot (not root), or answers `None` under `ACP_SANDBOX_SKIP_MOUNT=1`.
    fn mount(path: &Path, size: &str) -> Option<Tmpfs> {
        use std::os::unix::ffi::OsStrExt;
        let target = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let options = std::ffi::CString::new(format!("size={size},mode=0700")).unwrap();
        // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
        let result =
            unsafe { libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, options.as_ptr().cast()) };
        if result != 0 {
            let why = std::io::Error::last_os_error();
            // A full disk needs a mount (root, as in CI): a test that cannot make one fails, unless told to skip.
            if std::env::var("ACP_SANDBOX_SKIP_MOUNT").is_ok_and(|v| v == "1") {
                eprintln!("SKIPPED (ACP_SANDBOX_SKIP_MOUNT=1): cannot mount a tmpfs at {}: {why}", path.display());
                return None;
            }
            panic!(
                "cannot mount a tmpfs at {} ({why}): run as root, or set ACP_SANDBOX_SKIP_MOUNT=1 to skip",
                path.display()
            );
        }
        Some(Tmpfs(path.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        use std::os::unix::ffi::OsStrExt;
        let target = std::ffi::CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn a_full_disk_fails_the_turn_clearly_the_editor_saw_only_what_was_stored_and_saving_resumes_once_space_is_freed() {
    let dirs = TestDirs::new("store-full");
    let ws = dirs.workspace("ws");
    let Some(_tmpfs) = Tmpfs::mount(&dirs.data, "4m") else { return };
    // Room to free later, without restarting the bridge.
    let ballast = dirs.data.join("ballast");
    std::fs::write(&ballast, vec![0u8; 1024 * 1024]).unwrap();
    let options =
        || BridgeOptions::new("opencode", &dirs.data).env("RUST_LOG", "warn").arg("--replay-limit").arg("1000000");
    let mut bridge = Bridge::start(options());
    let sid = bridge.new_session(&ws);
    let prompt = "SCENARIO:slow FAKE_COUNT=100000 FAKE_DELAY_MS=0 fill the disk";
    let turn = bridge.prompt(&sid, prompt);

    let (reason, error) = store_error(&turn);
    assert_eq!(reason, "disk_full", "{error}");
    assert_eq!(error.message, disk_full_message(&dirs.data), "names the disk's data dir and what to do");
    assert_eq!(error.data.as_ref().unwrap()["dataDir"], json!(dirs.data));
    let cli = invocations(&ws)[0].pid();
    assert!(wait_until(Duration::from_secs(10), || !pid_alive(cli)), "the CLI must be stopped");
    let streamed = turn.updates.iter().filter(|u| u["sessionUpdate"] == "agent_message_chunk").count();
    assert!(streamed > 0 && streamed < 100_000, "the disk filled up mid-turn ({streamed} chunks sent)");

    std::fs::remove_file(&ballast).unwrap();
    let next = bridge.prompt(&sid, "and now?");
    assert_eq!(next.stop_reason(), "end_turn", "saving resumes once there is room");
    assert_eq!(turn_statuses(&database(&dirs), &sid), ["failed", "done"], "the failed turn is ended");
    drop(bridge);

    let mut bridge = Bridge::start(options());
    let load = bridge.load_session(&sid, &ws);
    load.result.as_ref().expect("the session loads after a full disk");
    let replay = replayed_turn(&load.updates, prompt);
    assert_eq!(replay, of_the_turn(&turn.updates), "the replay is exactly what the editor was sent");
    let failed_note = format!("\n\n_This turn failed: {}_\n\n", disk_full_message(&dirs.data));
    assert!(
        load.updates.iter().any(|u| u["content"]["text"] == failed_note.as_str()),
        "the replay says the turn failed and why ({failed_note:?}): {:?}",
        load.updates
    );
}

#[test]
fn a_cli_that_fails_on_a_full_disk_is_answered_with_the_disk_named_and_the_next_prompt_works_once_space_is_freed() {
    let dirs = TestDirs::new("store-full-cli");
    let ws = dirs.workspace("ws");
    let Some(_tmpfs) = Tmpfs::mount(&dirs.data, "8m") else { return };
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data).env("RUST_LOG", "warn"));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "SCENARIO:fill-disk write your database");
    let error = turn.result.expect_err("the CLI failed");
    assert_eq!(
        error.message,
        format!(
            "The disk holding {} is full, so OpenCode could not save its conversation: free space on it, then send the prompt again\n\nOpenCode said: OpenCode failed (exit code 1): Error: Failed to execute statement\n\nstderr:\nError: Failed to execute statement",
            dirs.data.display()
        )
    );
    let fillers: Vec<PathBuf> = std::fs::read_dir(dirs.data.join("sessions"))
        .unwrap()
        .flatten()
        .map(|entry| entry.path().join("home/filler"))
        .filter(|filler| filler.exists())
        .collect();
    assert_eq!(fillers.len(), 1, "the CLI's filler");
    std::fs::remove_file(&fillers[0]).unwrap();
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn", "the session goes on once there is room");
}

#[test]
fn a_data_dir_deleted_mid_turn_fails_the_turn_naming_it_stops_the_cli_and_later_requests_say_so() {
    let dirs = TestDirs::new("store-gone");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    let id = bridge.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=3000 FAKE_DELAY_MS=20 a long answer");
    bridge.wait_update(&sid, "a streamed chunk", |u| {
        u["content"]["text"].as_str().unwrap_or_default().contains("slow chunk")
    });
    let cli = invocations(&ws)[0].pid();
    let _guard = KillOnDrop(cli);
    // The bridge may be writing a file there meanwhile (its log, the model list): then the removal goes again.
    let removed = (0..20).any(|_| std::fs::remove_dir_all(&dirs.data).is_ok() || !dirs.data.exists());
    assert!(removed, "could not remove the data dir");

    let turn = bridge.finish_turn(&sid, id);
    let (reason, error) = store_error(&turn);
    assert_eq!(reason, "gone", "{error}");
    assert!(error.message.contains("was deleted"), "{error}");
    assert!(error.message.contains(&dirs.data.display().to_string()), "names the data dir: {error}");
    assert!(wait_until(Duration::from_secs(10), || !pid_alive(cli)), "the CLI must be stopped");
    assert!(!dirs.data.exists(), "the bridge did not recreate an empty data dir behind the user's back");

    let list = bridge.request("session/list", json!({})).expect_err("the list would lie: its store is gone");
    assert_eq!(list.data.as_ref().unwrap()["store"], "gone", "{list}");
    let new = bridge.request("session/new", json!({"cwd": ws, "mcpServers": []})).expect_err("nothing can be saved");
    assert_eq!(new.data.as_ref().unwrap()["store"], "gone", "{new}");
}

/// A session whose store another program holds locked before anything is prompted, with a busy timeout far
/// longer than the test: a prompt waits for the lock however slow the machine is.
fn locked_before_the_prompt(dirs: &TestDirs) -> (Bridge, PathBuf, String, rusqlite::Connection) {
    let ws = dirs.workspace("ws");
    let options = BridgeOptions::new("opencode", &dirs.data).arg("--store-busy-timeout").arg("600");
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let other = other_program(&database(dirs));
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    (bridge, ws, sid, other)
}

#[test]
fn session_list_answers_while_another_program_holds_the_write_lock_and_the_waiting_prompt_goes_on_after() {
    let dirs = TestDirs::new("store-lock");
    let (mut bridge, _ws, sid, other) = locked_before_the_prompt(&dirs);

    let prompt = bridge.send_prompt(&sid, "Say hello");
    let list = bridge.request("session/list", json!({})).expect("session/list answers while the lock is held");
    assert_eq!(list["sessions"][0]["sessionId"], sid.as_str(), "{list}");
    assert!(
        bridge.wait_response_within(prompt, Duration::ZERO).is_none(),
        "the prompt cannot have started its turn: the lock is still held"
    );

    other.execute_batch("COMMIT").unwrap();
    let turn = bridge.finish_turn(&sid, prompt);
    assert_eq!(turn.stop_reason(), "end_turn", "the prompt goes on once the lock is released");
}

/// A turn streaming a long answer, caught mid-stream by another program taking the store's write lock.
struct Locked {
    bridge: Bridge,
    ws: PathBuf,
    sid: String,
    prompt: String,
    id: i64,
    /// The other program, holding the lock until it commits.
    other: rusqlite::Connection,
    /// The CLI, still printing.
    cli: i32,
}

impl Locked {
    fn mid_stream(dirs: &TestDirs, busy_timeout: u64, delay_ms: u64) -> Locked {
        let ws = dirs.workspace("ws");
        let options =
            BridgeOptions::new("opencode", &dirs.data).arg("--store-busy-timeout").arg(&busy_timeout.to_string());
        let mut bridge = Bridge::start(options);
        let sid = bridge.new_session(&ws);
        let prompt = format!("SCENARIO:slow FAKE_COUNT=3000 FAKE_DELAY_MS={delay_ms} a long answer");
        let id = bridge.send_prompt(&sid, &prompt);
        let other = other_program(&database(dirs));
        // Mid-stream: the first chunks are stored (the harness keeps every update it received meanwhile).
        let streaming = wait_until(Duration::from_secs(60), || {
            other
                .query_row("SELECT COUNT(*) FROM events WHERE payload LIKE '%slow chunk%'", [], |row| {
                    row.get::<_, i64>(0)
                })
                .unwrap()
                > 0
        });
        assert!(streaming, "the turn never streamed");
        let cli = invocations(&ws)[0].pid();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        Locked { bridge, ws, sid, prompt, id, other, cli }
    }
}

#[test]
fn a_lock_held_past_the_busy_timeout_fails_the_running_turn_clearly_and_the_turn_is_ended_once_it_is_released() {
    let dirs = TestDirs::new("store-locked-turn");
    let locked = Locked::mid_stream(&dirs, 1, 20);
    let (mut bridge, ws, sid, prompt, id, other, cli) =
        (locked.bridge, locked.ws, locked.sid, locked.prompt, locked.id, locked.other, locked.cli);
    let _guard = KillOnDrop(cli);

    let turn = bridge.finish_turn(&sid, id);
    let (reason, error) = store_error(&turn);
    assert_eq!(reason, "locked", "{error}");
    assert!(error.message.contains(&database(&dirs).display().to_string()), "names the database: {error}");
    assert!(wait_until(Duration::from_secs(10), || !pid_alive(cli)), "the CLI must be stopped");
    assert_eq!(turn_statuses(&database(&dirs), &sid), ["running"], "cannot be recorded while locked");

    other.execute_batch("COMMIT").unwrap();
    let ended = wait_until(Duration::from_secs(60), || turn_statuses(&database(&dirs), &sid) == ["failed"]);
    assert!(
        ended,
        "the turn is recorded as failed once the store can write: {:?}",
        turn_statuses(&database(&dirs), &sid)
    );
    assert_eq!(bridge.prompt(&sid, "and now?").stop_reason(), "end_turn", "the store works again");

    let load = bridge.load_session(&sid, &ws);
    load.result.as_ref().expect("load");
    // Everything the editor got from the failed turn, and only that, was stored.
    assert_eq!(replayed_turn(&load.updates, &prompt), of_the_turn(&turn.updates));
    assert!(load.updates.iter().any(|u| is_failed_note(u, "locked")), "{:?}", kinds(&load.updates));
}

#[test]
fn a_cancel_while_another_program_holds_the_lock_is_answered_at_once_and_the_turn_is_recorded_once_released() {
    let dirs = TestDirs::new("store-locked-cancel");
    // A busy timeout far longer than the test: only the cancel can end the turn while the lock is held.
    let locked = Locked::mid_stream(&dirs, 600, 5);
    let (mut bridge, ws, sid, prompt, id, other, cli) =
        (locked.bridge, locked.ws, locked.sid, locked.prompt, locked.id, locked.other, locked.cli);
    let _guard = KillOnDrop(cli);
    // The writer is stuck behind the lock and the CLI goes on printing: its queue fills up.
    std::thread::sleep(Duration::from_secs(2));

    // The busy timeout is far longer than the harness waits for an answer: only giving up on the locked store can
    // answer the cancel, and the turn's row, still `running` below, shows the lock was still held then.
    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, id);
    assert_eq!(turn.stop_reason(), "cancelled");
    assert!(wait_until(Duration::from_secs(10), || !pid_alive(cli)), "the CLI must be stopped");
    assert_no_processes_under(&ws, "after the cancel");
    assert_eq!(turn_statuses(&database(&dirs), &sid), ["running"], "cannot be recorded while locked");

    other.execute_batch("COMMIT").unwrap();
    let ended = wait_until(Duration::from_secs(60), || turn_statuses(&database(&dirs), &sid) == ["done"]);
    assert!(ended, "the turn is recorded once the store can write: {:?}", turn_statuses(&database(&dirs), &sid));
    assert_eq!(bridge.prompt(&sid, "and now?").stop_reason(), "end_turn", "the session goes on");

    // The editor saw a prefix of what was stored: what the CLI printed before it was stopped is kept, and what
    // was still waiting for the lock when the prompt was answered was not sent after it.
    let load = bridge.load_session(&sid, &ws);
    load.result.as_ref().expect("load");
    let replayed = replayed_turn(&load.updates, &prompt);
    let seen = of_the_turn(&turn.updates);
    assert!(!seen.is_empty() && seen.len() <= replayed.len(), "saw {}, stored {}", seen.len(), replayed.len());
    assert_eq!(replayed[..seen.len()], seen[..]);
}

#[test]
fn a_prompt_waiting_for_the_lock_is_cancelled_at_once_and_recorded_as_cancelled_once_released() {
    let dirs = TestDirs::new("store-locked-cancel-early");
    let (mut bridge, ws, sid, other) = locked_before_the_prompt(&dirs);
    let id = bridge.send_prompt(&sid, "Say hello");
    std::thread::sleep(Duration::from_millis(500));
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, id).stop_reason(), "cancelled");
    assert!(invocations(&ws).is_empty(), "no CLI may run for a prompt cancelled before its turn was recorded");

    other.execute_batch("COMMIT").unwrap();
    let stop = |connection: &rusqlite::Connection| -> Vec<(String, Option<String>)> {
        let mut statement = connection.prepare("SELECT status, stop_reason FROM turns ORDER BY id").unwrap();
        statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?))).unwrap().collect::<Result<_, _>>().unwrap()
    };
    let ended = wait_until(Duration::from_secs(60), || !stop(&other).is_empty() && stop(&other)[0].0 != "running");
    assert!(ended, "{:?}", stop(&other));
    assert_eq!(stop(&other), [("done".to_string(), Some("cancelled".to_string()))]);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn", "the session goes on");
}

/// The first schema, as shipped before the `cost` column and before versioning.
const SCHEMA_FIRST: &str = "
CREATE TABLE sessions (id TEXT PRIMARY KEY, agent TEXT NOT NULL, cwd TEXT NOT NULL, sandbox_provider TEXT NOT NULL,
    sandbox_id TEXT, native_id TEXT, title TEXT, config TEXT NOT NULL DEFAULT '{}', created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL);
CREATE INDEX sessions_by_cwd ON sessions (cwd, updated_at);
CREATE TABLE turns (id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE, prompt TEXT NOT NULL, status TEXT NOT NULL,
    stop_reason TEXT, error TEXT, owner_pid INTEGER NOT NULL, started_at INTEGER NOT NULL, ended_at INTEGER);
CREATE INDEX turns_by_session ON turns (session_id, id);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id INTEGER NOT NULL REFERENCES turns (id) ON DELETE CASCADE, payload TEXT NOT NULL,
    created_at INTEGER NOT NULL);
CREATE INDEX events_by_turn ON events (turn_id, id);
";

#[test]
fn a_database_from_before_the_cost_column_is_migrated_replayed_and_prompted() {
    let dirs = TestDirs::new("store-old-schema");
    let ws = dirs.workspace("ws");
    let old = other_program(&database(&dirs));
    old.execute_batch(SCHEMA_FIRST).unwrap();
    old.execute(
        "INSERT INTO sessions (id, agent, cwd, sandbox_provider, title, created_at, updated_at)
         VALUES ('sess_old', 'opencode', ?1, 'local', 'From an older bridge', 1, 2)",
        [ws.display().to_string()],
    )
    .unwrap();
    let chunk = json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "an old answer"}});
    old.execute_batch(&format!(
        "INSERT INTO turns (id, session_id, prompt, status, stop_reason, owner_pid, started_at, ended_at)
             VALUES (1, 'sess_old', '[{{\"type\":\"text\",\"text\":\"an old prompt\"}}]', 'done', 'end_turn', 1, 1, 2);
         INSERT INTO turns (id, session_id, prompt, status, owner_pid, started_at)
             VALUES (2, 'sess_old', '[{{\"type\":\"text\",\"text\":\"cut by a crash\"}}]', 'running', 999999999, 3);
         INSERT INTO events (session_id, turn_id, payload, created_at) VALUES ('sess_old', 1, '{chunk}', 1);"
    ))
    .unwrap();
    drop(old);

    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let list = bridge.request("session/list", json!({})).unwrap();
    assert_eq!(list["sessions"][0]["sessionId"], "sess_old", "{list}");
    assert_eq!(list["sessions"][0]["title"], "From an older bridge", "{list}");
    let load = bridge.load_session("sess_old", &ws);
    load.result.as_ref().expect("an old session loads");
    assert_eq!(replayed_turn(&load.updates, "an old prompt"), [chunk]);
    assert!(
        text_of(&load.updates, "agent_message_chunk").contains("interrupted"),
        "the turn a dead bridge left running is interrupted: {:?}",
        load.updates
    );
    let turn = bridge.prompt("sess_old", "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn", "prompts work on a migrated database: {:?}", turn.result);
    assert_eq!(turn_statuses(&database(&dirs), "sess_old"), ["done", "interrupted", "done"]);
}

#[test]
fn a_turn_longer_than_the_replay_limit_replays_its_newest_updates_and_says_how_many_were_cut() {
    let dirs = TestDirs::new("store-replay-cut");
    let ws = dirs.workspace("ws");
    let options =
        || BridgeOptions::new("opencode", &dirs.data).env("RUST_LOG", "info").arg("--replay-limit").arg("5000");
    let mut bridge = Bridge::start(options());
    let sid = bridge.new_session(&ws);
    let prompt = "SCENARIO:slow FAKE_COUNT=10005 FAKE_DELAY_MS=0 a very long answer";
    let turn = bridge.prompt(&sid, prompt);
    assert_eq!(turn.stop_reason(), "end_turn");
    let sent = of_the_turn(&turn.updates);
    assert!(sent.len() > 10_005, "{} updates", sent.len());
    drop(bridge);

    let mut bridge = Bridge::start(options());
    let load = bridge.load_session(&sid, &ws);
    load.result.as_ref().expect("load");
    let replay = replayed_turn(&load.updates, prompt);
    let cut = sent.len() - 4999;
    let note = &replay[0];
    assert!(
        note["content"]["text"].as_str().unwrap_or_default().contains(&format!("The first {cut} updates of this turn")),
        "the replay says how many updates were cut: {note}"
    );
    assert_eq!(replay[1..1 + 4999], sent[cut..], "the prompt, the note, then the newest 4,999 updates");
}

#[test]
fn a_prompt_sent_right_after_set_config_option_runs_with_the_new_option_even_while_the_store_is_locked() {
    let dirs = TestDirs::new("store-order");
    let ws = dirs.workspace("ws");
    let config = dirs.root().join("xdg-config");
    std::fs::create_dir_all(config.join("opencode")).unwrap();
    std::fs::write(config.join("opencode/opencode.json"), r#"{"provider": {"fake": {"models": {"thinker": {}}}}}"#)
        .unwrap();
    let options = BridgeOptions::new("opencode", &dirs.data)
        .env("XDG_CONFIG_HOME", config.to_str().unwrap())
        .arg("--store-busy-timeout")
        .arg("600");
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    // The option's write waits for the lock; the prompt must not overtake it and run with the old model.
    let other = other_program(&database(&dirs));
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let set = bridge.send_request(
        "session/set_config_option",
        json!({"sessionId": sid, "configId": "model", "value": "fake/thinker"}),
    );
    let prompt = bridge.send_prompt(&sid, "Say hello");
    let list = bridge.request("session/list", json!({})).expect("session/list waits for no session's requests");
    assert_eq!(list["sessions"][0]["sessionId"], sid.as_str(), "{list}");
    other.execute_batch("COMMIT").unwrap();

    bridge.wait_response(set).expect("the option is set once the lock is released");
    assert_eq!(bridge.finish_turn(&sid, prompt).stop_reason(), "end_turn");
    assert_eq!(invocations(&ws)[0].flag_value("--model").as_deref(), Some("fake/thinker"));
}

/// The bridge's peak resident memory (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).expect("VmHWM in /proc/<pid>/status");
    let kib: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmHWM's value");
    kib * 1024
}

/// The documented bound of the bridge's peak memory with one 12 MiB text event (README, "Limits").
const PEAK_RSS_WITH_A_HUGE_EVENT: u64 = 256 * 1024 * 1024;

#[test]
fn one_enormous_text_event_is_cut_to_the_update_limit_with_a_note_stored_bounded_and_replayed_as_sent() {
    let dirs = TestDirs::new("store-huge-update");
    let ws = dirs.workspace("ws");
    let options = || BridgeOptions::new("opencode", &dirs.data).env("RUST_LOG", "info");
    let mut bridge = Bridge::start(options());
    let sid = bridge.new_session(&ws);
    let bytes = 12 * 1024 * 1024;
    let turn = bridge.prompt(&sid, &format!("SCENARIO:hugetext FAKE_BYTES={bytes} one enormous answer"));
    assert_eq!(turn.stop_reason(), "end_turn");
    let limit = 2 * 1024 * 1024;
    let note = |dropped: usize| {
        format!(
            "\n\n[acp-sandbox cut this text here: {dropped} more bytes did not fit in one update, which keeps at most 2 MiB]"
        )
    };
    // The note counts against the limit: the text cut is exactly the limit long.
    let kept = limit - note(bytes).len();
    let expected = format!("{}{}", "y".repeat(kept), note(bytes - kept));
    assert_eq!(expected.len(), limit);
    let chunks: Vec<&str> = turn
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .filter(|text| text.starts_with('y'))
        .collect();
    assert_eq!(chunks.len(), 1, "one chunk of the huge text");
    assert!(chunks[0] == expected, "the chunk sent is the limit's worth and the note ({} bytes)", chunks[0].len());
    let peak = peak_rss(bridge.pid());
    assert!(peak < PEAK_RSS_WITH_A_HUGE_EVENT, "the bridge's peak memory was {} MiB", peak >> 20);
    eprintln!("peak RSS with a {} MiB event: {} MiB", bytes >> 20, peak >> 20);

    let stored: i64 = other_program(&database(&dirs))
        .query_row("SELECT COALESCE(MAX(LENGTH(payload)), 0) FROM events", [], |row| row.get(0))
        .unwrap();
    assert!(stored as usize <= limit + 4096, "the largest stored update has {stored} bytes");
    drop(bridge);

    let mut bridge = Bridge::start(options());
    let load = bridge.load_session(&sid, &ws);
    load.result.as_ref().expect("the session loads");
    let prompt = format!("SCENARIO:hugetext FAKE_BYTES={bytes} one enormous answer");
    let (replayed, sent) = (of_the_turn(&replayed_turn(&load.updates, &prompt)), of_the_turn(&turn.updates));
    // After the turn, the load's own title update.
    assert_eq!(kinds(&replayed[sent.len()..]), ["session_info_update"], "{:?}", kinds(&replayed));
    for (index, (replayed, sent)) in replayed.iter().zip(&sent).enumerate() {
        let short = |update: &Value| update.to_string().chars().take(300).collect::<String>();
        assert!(replayed == sent, "update {index} replayed {} as sent {}", short(replayed), short(sent));
    }
}
