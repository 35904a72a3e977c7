//! The store's unit tests: records, history cuts, schema migrations from every shipped schema, and what the
//! store does when it cannot write (full disk, lock, deleted or replaced file).

use super::*;
use serde_json::json;

fn record(id: &str, cwd: &str, updated_at: i64) -> SessionRecord {
    SessionRecord {
        id: id.into(),
        agent: "opencode".into(),
        cwd: cwd.into(),
        sandbox_provider: "local".into(),
        sandbox_id: None,
        native_id: None,
        title: None,
        config: json!({}),
        context: Default::default(),
        created_at: updated_at,
        updated_at,
    }
}

fn open(dir: &Path) -> Store {
    Store::open(&dir.join("db.sqlite3")).unwrap()
}

/// A raw connection of the test's own, like another program's.
fn raw(path: &Path) -> Connection {
    let connection = Connection::open(path).unwrap();
    connection.busy_timeout(Duration::from_secs(30)).unwrap();
    connection
}

async fn status_of(store: &Store, session: &str, turn: i64) -> TurnStatus {
    let history = store.history(session, usize::MAX).await.unwrap();
    history.turns.iter().find(|(record, _)| record.id == turn).map(|(record, _)| record.status).unwrap()
}

#[tokio::test]
async fn sessions_round_trip_and_list_by_cwd_with_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("a", "/w1", 1)).await.unwrap();
    store.create_session(&record("b", "/w1", 2)).await.unwrap();
    store.create_session(&record("c", "/w2", 3)).await.unwrap();
    store.set_native_id("a", Some("ses_1")).await.unwrap();
    assert_eq!(store.session("a").await.unwrap().unwrap().native_id.as_deref(), Some("ses_1"));

    let all: Vec<String> = store.list_sessions(None, None, None, 10).await.unwrap().into_iter().map(|s| s.id).collect();
    assert_eq!(all, ["a", "c", "b"], "set_native_id bumps updated_at, so a is newest");
    let w1 = store.list_sessions(None, Some("/w1"), None, 1).await.unwrap();
    assert_eq!(w1.len(), 1);
    let next = store.list_sessions(None, Some("/w1"), Some((w1[0].updated_at, &w1[0].id)), 1).await.unwrap();
    assert_eq!(next[0].id, "b");
    assert!(store.list_sessions(Some("amp"), None, None, 10).await.unwrap().is_empty(), "all are OpenCode's");
    assert!(store.delete_session("a").await.unwrap());
    assert!(!store.delete_session("a").await.unwrap());
    assert!(store.session("a").await.unwrap().is_none());
}

#[tokio::test]
async fn a_failing_write_fails_alone_and_the_rest_of_its_batch_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let duplicate = store.create_session(&record("s", "/w", 1)).await.unwrap_err();
    assert!(matches!(duplicate, StoreError::Sqlite(_)), "{duplicate:?}");
    assert!(!duplicate.is_unavailable());
    let turn = store.start_turn("s", &json!([])).await.unwrap();
    // Queued together, so most likely one transaction: the bad one (an unknown turn) must not take the others.
    let good = store.queue_event("s", turn, &json!({"n": 1})).await.unwrap();
    let bad = store.queue_event("s", 999_999, &json!({"n": 2})).await.unwrap();
    let also_good = store.queue_event("s", turn, &json!({"n": 3})).await.unwrap();
    assert!(good.await.is_ok());
    assert!(matches!(bad.await, Err(StoreError::Sqlite(_))));
    assert!(also_good.await.is_ok());
    let history = store.history("s", usize::MAX).await.unwrap();
    assert_eq!(history.turns[0].1, [json!({"n": 1}), json!({"n": 3})]);
}

#[tokio::test]
async fn history_keeps_newest_turns_within_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    for turn in 0..3 {
        let id = store.start_turn("s", &json!([{"type": "text", "text": format!("p{turn}")}])).await.unwrap();
        for n in 0..4 {
            store.append_event("s", id, &json!({"n": n, "turn": turn})).await.unwrap();
        }
        store.end_turn(id, TurnStatus::Done, Some("end_turn"), None, 0.5).await.unwrap();
    }
    assert_eq!(store.session_cost("s").await.unwrap(), 1.5);
    let full = store.history("s", 100).await.unwrap();
    assert_eq!((full.omitted_turns, full.omitted_updates, full.turns.len()), (0, 0, 3));
    assert_eq!(full.turns[0].1[0], json!({"n": 0, "turn": 0}));
    let cut = store.history("s", 11).await.unwrap();
    assert_eq!((cut.omitted_turns, cut.omitted_updates, cut.turns.len()), (1, 0, 2));
    assert_eq!(cut.turns[0].1[0], json!({"n": 0, "turn": 1}));
}

#[tokio::test]
async fn history_cuts_inside_a_newest_turn_longer_than_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let old = store.start_turn("s", &json!([])).await.unwrap();
    store.append_event("s", old, &json!({"old": true})).await.unwrap();
    let turn = store.start_turn("s", &json!([{"type": "text", "text": "long"}])).await.unwrap();
    let mut acks = Vec::new();
    for n in 0..10_005 {
        acks.push(store.queue_event("s", turn, &json!({ "n": n })).await.unwrap());
    }
    for ack in acks {
        ack.await.unwrap();
    }
    let history = store.history("s", 5000).await.unwrap();
    assert_eq!((history.omitted_turns, history.omitted_updates, history.turns.len()), (1, 5006, 1));
    let (kept, events) = &history.turns[0];
    assert_eq!(kept.id, turn);
    assert_eq!(kept.prompt, json!([{"type": "text", "text": "long"}]));
    let expected: Vec<Value> = (5006..10_005).map(|n| json!({ "n": n })).collect();
    assert_eq!(events, &expected, "the prompt plus the newest 4,999 updates, in order");
}

#[tokio::test]
async fn a_fast_stream_is_committed_in_one_transaction_per_drain_of_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let turn = store.start_turn("s", &json!([])).await.unwrap();
    // Another program holds the write lock while the whole stream is queued, so the queue holds all of it.
    let other = raw(store.path());
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let before = store.commits();
    let mut acks = Vec::new();
    for n in 0..5000 {
        acks.push(store.queue_event("s", turn, &json!({ "n": n })).await.unwrap());
    }
    other.execute_batch("COMMIT").unwrap();
    for ack in acks {
        ack.await.unwrap();
    }
    // The writer may have taken the first update alone before it met the lock; everything else is one drain.
    assert!(store.commits() - before <= 2, "{} transactions for 5,000 queued updates", store.commits() - before);
    assert_eq!(store.history("s", usize::MAX).await.unwrap().turns[0].1.len(), 5000);
}

#[tokio::test]
async fn the_wal_is_checkpointed_into_the_database_once_the_writer_is_idle_not_in_the_middle_of_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let turn = store.start_turn("s", &json!([])).await.unwrap();
    let main_file = || std::fs::metadata(store.path()).unwrap().len();
    // What the opening wrote is checkpointed once the writer has nothing to do.
    let settled = |size: &dyn Fn() -> u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut last = size();
        loop {
            std::thread::sleep(Duration::from_millis(600));
            let now = size();
            if now == last || std::time::Instant::now() > deadline {
                return now;
            }
            last = now;
        }
    };
    let before = settled(&main_file);
    for n in 0..2000 {
        store.append_event("s", turn, &json!({ "n": n, "text": "x".repeat(2500) })).await.unwrap();
    }
    // 5 MB: past the 1,000 pages at which SQLite would checkpoint by itself. Automatic checkpoints are off, so
    // during the stream the updates are only in the WAL...
    assert_eq!(main_file(), before, "the database file was written in the middle of the stream");
    // ...and the idle writer copies them into the database file.
    let after = settled(&main_file);
    assert!(after > before + 2500 * 2000 / 2, "the idle checkpoint did not happen: {before} -> {after} bytes");
    assert_eq!(store.history("s", usize::MAX).await.unwrap().turns[0].1.len(), 2000);
}

#[test]
fn two_stores_on_one_file_write_concurrently_without_losing_anything() {
    // Two Zed windows are two bridge processes on one data dir; two stores model them here.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite3");
    let writers: Vec<_> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|id| {
            let path = path.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                runtime.block_on(async {
                    let store = Store::open(&path).unwrap();
                    store.create_session(&record(id, "/w", 1)).await.unwrap();
                    let turn = store.start_turn(id, &json!([])).await.unwrap();
                    for n in 0..300 {
                        store.append_event(id, turn, &json!({ "n": n })).await.unwrap();
                    }
                    store.end_turn(turn, TurnStatus::Done, Some("end_turn"), None, 0.0).await.unwrap();
                })
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let store = Store::open(&path).unwrap();
        for id in ["a", "b", "c", "d"] {
            let history = store.history(id, usize::MAX).await.unwrap();
            assert_eq!(history.turns[0].1.len(), 300, "session {id}");
        }
    });
    let integrity: String = raw(&path).query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
    assert_eq!(integrity, "ok");
}

#[tokio::test]
async fn running_turn_of_a_dead_process_is_marked_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let turn = store.start_turn("s", &json!([])).await.unwrap();
    assert_eq!(store.mark_orphaned_turns("s").await.unwrap(), 0, "our own running turn is left alone");
    // Pretend a dead process owned it.
    raw(store.path()).execute("UPDATE turns SET owner_pid = 999999999 WHERE id = ?1", params![turn]).unwrap();
    assert_eq!(store.mark_orphaned_turns("s").await.unwrap(), 1);
    assert_eq!(status_of(&store, "s", turn).await, TurnStatus::Interrupted);
}

#[tokio::test]
async fn opening_the_store_ends_the_turns_of_dead_owners() {
    let dir = tempfile::tempdir().unwrap();
    let turn = {
        let store = open(dir.path());
        store.create_session(&record("s", "/w", 1)).await.unwrap();
        let turn = store.start_turn("s", &json!([])).await.unwrap();
        raw(store.path()).execute("UPDATE turns SET owner_pid = 999999999 WHERE id = ?1", params![turn]).unwrap();
        turn
    };
    let store = open(dir.path());
    assert_eq!(status_of(&store, "s", turn).await, TurnStatus::Interrupted);
}

// ---- schema versions -------------------------------------------------------------------------------------------

/// The first schema, as shipped in a2c06f3 (no version, no cost).
const SCHEMA_FIRST: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    cwd TEXT NOT NULL,
    sandbox_provider TEXT NOT NULL,
    sandbox_id TEXT,
    native_id TEXT,
    title TEXT,
    config TEXT NOT NULL DEFAULT '{}',
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_cwd ON sessions (cwd, updated_at);
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    prompt TEXT NOT NULL,
    status TEXT NOT NULL,
    stop_reason TEXT,
    error TEXT,
    owner_pid INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    ended_at INTEGER
);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns (session_id, id);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id INTEGER NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
    payload TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_turn ON events (turn_id, id);
";

/// The second schema, as shipped from c57ba03 until versioning (no version, `turns.cost`).
fn schema_with_cost() -> String {
    SCHEMA_FIRST
        .replace("owner_pid INTEGER NOT NULL,", "owner_pid INTEGER NOT NULL,\n    cost REAL NOT NULL DEFAULT 0,")
}

/// A database of an earlier schema with one session, one ended turn and two updates, written as that version did.
fn earlier_database(path: &Path, schema: &str, with_cost: bool) {
    let connection = Connection::open(path).unwrap();
    connection.pragma_update(None, "journal_mode", "WAL").unwrap();
    connection.execute_batch(schema).unwrap();
    connection
        .execute(
            "INSERT INTO sessions (id, agent, cwd, sandbox_provider, sandbox_id, native_id, title, config, created_at, updated_at)
             VALUES ('old', 'opencode', '/w', 'local', '/data/sessions/old', 'ses_old', 'An old one', '{\"model\":\"m\"}', 10, 20)",
            [],
        )
        .unwrap();
    let cost = if with_cost { ", cost" } else { "" };
    let cost_value = if with_cost { ", 0.25" } else { "" };
    connection
        .execute(
            &format!(
                "INSERT INTO turns (id, session_id, prompt, status, stop_reason, owner_pid, started_at, ended_at{cost})
                 VALUES (1, 'old', '[{{\"type\":\"text\",\"text\":\"hi\"}}]', 'done', 'end_turn', 1, 11, 19{cost_value})"
            ),
            [],
        )
        .unwrap();
    for n in 0..2 {
        connection
            .execute(
                "INSERT INTO events (session_id, turn_id, payload, created_at) VALUES ('old', 1, ?1, 12)",
                params![json!({ "n": n }).to_string()],
            )
            .unwrap();
    }
}

#[tokio::test]
async fn every_earlier_schema_is_migrated_with_its_rows_and_takes_new_turns() {
    for (name, schema, with_cost) in
        [("first", SCHEMA_FIRST.to_string(), false), ("with cost", schema_with_cost(), true)]
    {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite3");
        earlier_database(&path, &schema, with_cost);
        let store = Store::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let version: i64 = raw(&path).pragma_query_value(None, "user_version", |row| row.get(0)).unwrap();
        assert_eq!(version, SCHEMA_VERSION, "{name}");

        let session = store.session("old").await.unwrap().unwrap();
        assert_eq!(
            (session.native_id.as_deref(), session.title.as_deref(), &session.config),
            (Some("ses_old"), Some("An old one"), &json!({"model": "m"})),
            "{name}"
        );
        assert_eq!(session.context, SessionContext::default(), "{name}");
        let history = store.history("old", usize::MAX).await.unwrap();
        assert_eq!(history.turns.len(), 1, "{name}");
        assert_eq!(history.turns[0].0.status, TurnStatus::Done, "{name}");
        assert_eq!(history.turns[0].1, [json!({"n": 0}), json!({"n": 1})], "{name}");
        assert_eq!(store.session_cost("old").await.unwrap(), if with_cost { 0.25 } else { 0.0 }, "{name}");

        let turn = store.start_turn("old", &json!([{"type": "text", "text": "again"}])).await.unwrap();
        let update = json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "ünïcode ✓"}});
        store.append_event("old", turn, &update).await.unwrap();
        store.end_turn(turn, TurnStatus::Done, Some("end_turn"), None, 1.5).await.unwrap();
        let history = store.history("old", usize::MAX).await.unwrap();
        let (record, events) = &history.turns[1];
        assert_eq!(
            (record.id, record.status, record.stop_reason.as_deref(), &record.prompt),
            (turn, TurnStatus::Done, Some("end_turn"), &json!([{"type": "text", "text": "again"}])),
            "{name}"
        );
        assert_eq!(events, &[update], "{name}");
        assert_eq!(store.session_cost("old").await.unwrap(), if with_cost { 1.75 } else { 1.5 }, "{name}");
        drop(store);
        // Opening again changes nothing.
        let store = Store::open(&path).unwrap();
        assert_eq!(store.history("old", usize::MAX).await.unwrap().turns.len(), 2, "{name}");
    }
}

#[tokio::test]
async fn a_sessions_context_is_kept_as_given_and_replaced_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut first = record("s", "/w", 1);
    first.context = SessionContext {
        additional_directories: vec!["/other".into()],
        system_prompt: Some("Answer in French.".into()),
        system_prompt_replaces: false,
        mcp_servers: vec![McpServerShape {
            name: "files".into(),
            transport: "stdio".into(),
            target: "/bin/files".into(),
            args: vec!["--root".into(), "/w".into()],
            secrets: vec!["TOKEN".into()],
        }],
        forked_from: None,
    };
    store.create_session(&first).await.unwrap();
    assert_eq!(store.session("s").await.unwrap().unwrap(), first);
    let text: String =
        raw(store.path()).query_row("SELECT context FROM sessions WHERE id = 's'", [], |row| row.get(0)).unwrap();
    assert_eq!(
        text,
        r#"{"additionalDirectories":["/other"],"systemPrompt":"Answer in French.","mcpServers":[{"name":"files","transport":"stdio","target":"/bin/files","args":["--root","/w"],"secrets":["TOKEN"]}]}"#
    );
    store.set_context("s", &SessionContext::default()).await.unwrap();
    assert_eq!(store.session("s").await.unwrap().unwrap().context, SessionContext::default());
    let text: String =
        raw(store.path()).query_row("SELECT context FROM sessions WHERE id = 's'", [], |row| row.get(0)).unwrap();
    assert_eq!(text, "{}");
}

#[tokio::test]
async fn a_fork_copies_every_turn_and_update_and_then_goes_its_own_way() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("orig", "/w", 1)).await.unwrap();
    let done = store.start_turn("orig", &json!([{"type": "text", "text": "one"}])).await.unwrap();
    store.append_event("orig", done, &json!({"n": 1})).await.unwrap();
    store.append_event("orig", done, &json!({"n": 2})).await.unwrap();
    store.end_turn(done, TurnStatus::Done, Some("end_turn"), None, 0.5).await.unwrap();
    let running = store.start_turn("orig", &json!([{"type": "text", "text": "two"}])).await.unwrap();
    store.append_event("orig", running, &json!({"n": 3})).await.unwrap();

    let mut fork = record("fork", "/w", 2);
    fork.context.forked_from = Some(ForkedFrom { session: "orig".into(), native: Some("ses_1".into()) });
    store.fork_session("orig", &fork).await.unwrap();
    assert_eq!(store.session("fork").await.unwrap().unwrap(), fork);
    let copied = store.history("fork", usize::MAX).await.unwrap();
    let summary: Vec<(TurnStatus, Option<String>, Value, Vec<Value>)> = copied
        .turns
        .iter()
        .map(|(turn, events)| (turn.status, turn.error.clone(), turn.prompt.clone(), events.clone()))
        .collect();
    assert_eq!(
        summary,
        [
            (TurnStatus::Done, None, json!([{"type": "text", "text": "one"}]), vec![json!({"n": 1}), json!({"n": 2})]),
            (
                TurnStatus::Interrupted,
                Some("the session was forked during this turn".to_string()),
                json!([{"type": "text", "text": "two"}]),
                vec![json!({"n": 3})]
            ),
        ]
    );
    assert_eq!(store.session_cost("fork").await.unwrap(), 0.5);

    // From now on each is its own: a turn of the fork is not the original's, and the original goes on.
    let own = store.start_turn("fork", &json!([])).await.unwrap();
    store.append_event("fork", own, &json!({"n": "fork"})).await.unwrap();
    store.append_event("orig", running, &json!({"n": 4})).await.unwrap();
    let original = store.history("orig", usize::MAX).await.unwrap();
    assert_eq!(original.turns.len(), 2);
    assert_eq!(original.turns[1].1, [json!({"n": 3}), json!({"n": 4})]);
    assert_eq!(store.history("fork", usize::MAX).await.unwrap().turns.len(), 3);
    // Deleting the original leaves the fork whole.
    assert!(store.delete_session("orig").await.unwrap());
    assert_eq!(store.history("fork", usize::MAX).await.unwrap().turns[0].1, [json!({"n": 1}), json!({"n": 2})]);
}

#[tokio::test]
async fn a_new_database_gets_the_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let version: i64 = raw(store.path()).pragma_query_value(None, "user_version", |row| row.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
}

#[test]
fn a_database_of_a_newer_version_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite3");
    let connection = Connection::open(&path).unwrap();
    connection.execute_batch("CREATE TABLE future (x); PRAGMA user_version = 99;").unwrap();
    drop(connection);
    let error = Store::open(&path).err().expect("a newer schema must be refused");
    assert!(matches!(error, StoreError::TooNew { found: 99, .. }), "{error:?}");
    assert!(error.to_string().contains("newer acp-sandbox"), "{error}");
    let tables: i64 = raw(&path).query_row("SELECT COUNT(*) FROM sqlite_master", [], |row| row.get(0)).unwrap();
    assert_eq!(tables, 1, "nothing was created in it");
}

// ---- a store that cannot write ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_locked_database_fails_writes_clearly_while_reads_answer_and_turn_ends_are_retried() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(&dir.path().join("db.sqlite3"), Duration::from_millis(300)).unwrap();
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let turn = store.start_turn("s", &json!([])).await.unwrap();
    let other = raw(store.path());
    other.execute_batch("BEGIN IMMEDIATE").unwrap();

    let error = store.append_event("s", turn, &json!({"n": 1})).await.unwrap_err();
    assert!(matches!(error, StoreError::Locked { .. }), "{error:?}");
    assert!(error.to_string().contains(&store.path().display().to_string()), "names the file: {error}");
    assert_eq!(store.list_sessions(None, None, None, 10).await.unwrap().len(), 1, "reads answer while locked");
    let ended = store.end_turn(turn, TurnStatus::Failed, None, Some(&error.to_string()), 0.0).await;
    assert!(matches!(ended, Err(StoreError::Locked { .. })), "{ended:?}");
    assert_eq!(status_of(&store, "s", turn).await, TurnStatus::Running);

    other.execute_batch("COMMIT").unwrap();
    // The writer tries the end again by itself.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while status_of(&store, "s", turn).await != TurnStatus::Failed {
        assert!(std::time::Instant::now() < deadline, "the end of the turn was never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let history = store.history("s", usize::MAX).await.unwrap();
    assert!(history.turns[0].0.error.as_deref().unwrap_or_default().contains("locked"));
    assert!(history.turns[0].1.is_empty(), "the failed update was not stored");
    let next = store.start_turn("s", &json!([])).await.expect("writes work again");
    store.append_event("s", next, &json!({"n": 2})).await.expect("writes work again");
}

#[tokio::test]
async fn after_an_update_of_a_turn_failed_its_later_updates_are_refused_even_once_the_store_can_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(&dir.path().join("db.sqlite3"), Duration::from_millis(200)).unwrap();
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let turn = store.start_turn("s", &json!([])).await.unwrap();
    store.append_event("s", turn, &json!({"n": 0})).await.unwrap();
    let other = raw(store.path());
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert!(matches!(store.append_event("s", turn, &json!({"n": 1})).await, Err(StoreError::Locked { .. })));
    other.execute_batch("COMMIT").unwrap();

    // What the turn stored stays the prefix that was acknowledged: a later update would be a gap's other side.
    let refused = store.append_event("s", turn, &json!({"n": 2})).await;
    assert!(matches!(refused, Err(StoreError::Locked { .. })), "{refused:?}");
    let next = store.start_turn("s", &json!([])).await.unwrap();
    store.append_event("s", next, &json!({"next": true})).await.expect("another turn writes");
    let history = store.history("s", usize::MAX).await.unwrap();
    assert_eq!(history.turns[0].1, [json!({"n": 0})]);
    assert_eq!(history.turns[1].1, [json!({"next": true})]);
}

#[tokio::test]
async fn the_outbox_hands_on_in_order_only_what_was_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(&dir.path().join("db.sqlite3"), Duration::from_millis(200)).unwrap();
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let turn = store.start_turn("s", &json!([])).await.unwrap();
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let outbox = {
        let delivered = delivered.clone();
        Outbox::new(move |run: Vec<i32>| delivered.lock().unwrap().extend(run))
    };
    for n in 0..3 {
        outbox.push(store.queue_event("s", turn, &json!({ "n": n })).await.unwrap(), n).unwrap();
    }
    let stored = tokio::time::timeout(Duration::from_secs(30), async {
        while delivered.lock().unwrap().len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    stored.await.expect("the first three are stored and handed on");
    let other = raw(store.path());
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    outbox.push(store.queue_event("s", turn, &json!({"n": 3})).await.unwrap(), 3).unwrap();
    let flushed = outbox.flush().await;
    assert!(matches!(flushed, Err(StoreError::Locked { .. })), "{flushed:?}");
    assert_eq!(*delivered.lock().unwrap(), [0, 1, 2], "the unstored one is not handed on");
    other.execute_batch("COMMIT").unwrap();
    let history = store.history("s", usize::MAX).await.unwrap();
    assert_eq!(history.turns[0].1, [json!({"n": 0}), json!({"n": 1}), json!({"n": 2})]);
}

/// A commit acknowledges its whole batch, and the outbox hands on together what is acknowledged together: a fast
/// stream costs its editor a hand-off per commit, not per update, and still in order.
#[tokio::test]
async fn the_outbox_hands_on_what_one_commit_stored_as_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let turn = store.start_turn("s", &json!([])).await.unwrap();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let outbox = {
        let runs = runs.clone();
        Outbox::new(move |run: Vec<i32>| runs.lock().unwrap().push(run))
    };
    let commits = store.commits();
    for n in 0..2000 {
        outbox.push(store.queue_event("s", turn, &json!({ "n": n })).await.unwrap(), n).unwrap();
    }
    // The test's runtime has one thread, busy here: the outbox's task has not run yet while the writer commits.
    std::thread::sleep(Duration::from_millis(100));
    outbox.flush().await.unwrap();
    let runs = runs.lock().unwrap();
    assert_eq!(runs.concat(), (0..2000).collect::<Vec<_>>(), "every one, in order");
    assert!(runs.iter().all(|run| !run.is_empty()));
    // A run may end early while the writer is still acknowledging its commit one by one, but not often.
    let transactions = store.commits() - commits;
    assert!(runs.len() <= 200, "{} runs for 2000 updates in {transactions} transactions", runs.len());
}

#[tokio::test]
async fn a_deleted_data_dir_fails_writes_and_reads_until_it_is_back() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let store = Store::open(&data.join("db.sqlite3")).unwrap();
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let turn = store.start_turn("s", &json!([])).await.unwrap();
    store.append_event("s", turn, &json!({"n": 1})).await.unwrap();

    let away = root.path().join("moved-away");
    std::fs::rename(&data, &away).unwrap();
    let error = store.append_event("s", turn, &json!({"n": 2})).await.unwrap_err();
    assert!(matches!(error, StoreError::Gone { .. }), "{error:?}");
    assert!(error.to_string().contains(&data.display().to_string()), "names the data dir: {error}");
    assert!(matches!(store.list_sessions(None, None, None, 10).await, Err(StoreError::Gone { .. })));
    assert!(matches!(store.session("s").await, Err(StoreError::Gone { .. })));
    assert!(!data.exists(), "nothing recreated the data dir");

    std::fs::rename(&away, &data).unwrap();
    let next = store.start_turn("s", &json!([])).await.expect("the same file is back: writes work again");
    store.append_event("s", next, &json!({"n": 3})).await.unwrap();
    let history = store.history("s", usize::MAX).await.unwrap();
    assert_eq!(history.turns[0].1, [json!({"n": 1})]);
    assert_eq!(history.turns[1].1, [json!({"n": 3})]);

    std::fs::remove_dir_all(&data).unwrap();
    let error = store.append_event("s", next, &json!({"n": 4})).await.unwrap_err();
    assert!(matches!(error, StoreError::Gone { .. }), "{error:?}");
    assert!(error.is_unavailable());
}

#[tokio::test]
async fn a_replaced_database_file_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let other = dir.path().join("other.sqlite3");
    Connection::open(&other).unwrap().execute_batch("CREATE TABLE x (y)").unwrap();
    std::fs::rename(&other, store.path()).unwrap();
    let error = store.set_title("s", "new").await.unwrap_err();
    assert!(matches!(error, StoreError::Replaced { .. }), "{error:?}");
    assert!(matches!(store.session("s").await, Err(StoreError::Replaced { .. })));
}

/// A size-limited tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts one at `path`; fails the test when it cannot (not root), or answers `None` under
    /// `ACP_SANDBOX_SKIP_MOUNT=1`.
    #[allow(clippy::print_stderr)]
    fn mount(path: &Path, size: &str) -> Option<Tmpfs> {
        use std::os::unix::ffi::OsStrExt;
        std::fs::create_dir_all(path).unwrap();
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

#[tokio::test]
async fn a_full_disk_fails_writes_clearly_keeps_what_was_acknowledged_and_recovers_when_space_is_freed() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let Some(_tmpfs) = Tmpfs::mount(&data, "4m") else { return };
    // Room to free later.
    std::fs::write(data.join("ballast"), vec![0u8; 1024 * 1024]).unwrap();
    let store = Store::open(&data.join("db.sqlite3")).unwrap();
    store.create_session(&record("s", "/w", 1)).await.unwrap();
    let turn = store.start_turn("s", &json!([])).await.unwrap();
    let text = "x".repeat(500);
    let mut acknowledged = Vec::new();
    let error = loop {
        let mut acks = Vec::new();
        for _ in 0..100 {
            let update = json!({ "n": acknowledged.len() + acks.len(), "text": text });
            acks.push((store.queue_event("s", turn, &update).await.unwrap(), update));
        }
        let mut failed = None;
        for (ack, update) in acks {
            match ack.await {
                Ok(()) if failed.is_none() => acknowledged.push(update),
                Ok(()) => panic!("an update after a failed one was acknowledged"),
                Err(error) => failed = failed.or(Some(error)),
            }
        }
        if let Some(error) = failed {
            break error;
        }
        assert!(acknowledged.len() < 100_000, "the disk never filled up");
    };
    assert!(matches!(error, StoreError::DiskFull { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        format!(
            "The disk holding {} is full: the session's last update could not be saved; free space on it (saving resumes by itself as soon as there is room)",
            data.display()
        )
    );
    let ended = store.end_turn(turn, TurnStatus::Failed, None, Some(&error.to_string()), 0.0).await;
    let stored = store.history("s", usize::MAX).await.unwrap();
    assert_eq!(stored.turns[0].1, acknowledged, "exactly what was acknowledged is stored");

    // A second bridge starting on the full disk opens the store and reads it.
    let second = Store::open(&data.join("db.sqlite3")).expect("a full disk does not stop the store from opening");
    assert_eq!(second.history("s", usize::MAX).await.unwrap().turns[0].1, acknowledged);
    drop(second);

    std::fs::remove_file(data.join("ballast")).unwrap();
    if ended.is_err() {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while status_of(&store, "s", turn).await != TurnStatus::Failed {
            assert!(std::time::Instant::now() < deadline, "the end of the turn was never recorded");
            // Not back to back: a reader always inside a read keeps the WAL from starting over, so on a disk this
            // full every retry would find it full again.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let next = store.start_turn("s", &json!([])).await.expect("writes work again once there is room");
    store.append_event("s", next, &json!({"after": true})).await.unwrap();
    store.end_turn(next, TurnStatus::Done, Some("end_turn"), None, 0.0).await.unwrap();
    drop(store);
    let store = Store::open(&data.join("db.sqlite3")).expect("the store opens after a full disk");
    let history = store.history("s", usize::MAX).await.unwrap();
    assert_eq!(history.turns[0].1, acknowledged);
    assert_eq!(history.turns[0].0.status, TurnStatus::Failed);
    assert_eq!(history.turns[1].1, [json!({"after": true})]);
}

#[tokio::test]
async fn hosts_allowed_always_are_the_sessions_go_with_its_forks_and_go_away_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.create_session(&record("a", "/w", 1)).await.unwrap();
    store.create_session(&record("b", "/w", 2)).await.unwrap();
    assert!(store.allowed_hosts("a").await.unwrap().is_empty());
    store.allow_host("a", "example.com", 443).await.unwrap();
    store.allow_host("a", "example.com", 443).await.unwrap();
    store.allow_host("a", "other.org", 80).await.unwrap();
    let expected = vec![("example.com".to_string(), 443), ("other.org".to_string(), 80)];
    assert_eq!(store.allowed_hosts("a").await.unwrap(), expected);
    assert!(store.allowed_hosts("b").await.unwrap().is_empty(), "another session's are not these");
    // Kept on disk: a new store (a restarted bridge) reads them.
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.allowed_hosts("a").await.unwrap(), expected);
    store.fork_session("a", &record("fork", "/w", 3)).await.unwrap();
    assert_eq!(store.allowed_hosts("fork").await.unwrap(), expected);
    assert!(store.delete_session("a").await.unwrap());
    assert!(store.allowed_hosts("a").await.unwrap().is_empty());
    assert_eq!(store.allowed_hosts("fork").await.unwrap(), expected);
}

#[tokio::test]
async fn what_an_agent_announced_is_kept_by_its_command_line_newest_version_first_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let claude = "/opt/claude-agent-acp";
    assert_eq!(store.agent_offers(claude).await.unwrap(), None);
    store.keep_agent_offers(claude, "0.100.0", &json!({"prompt": {"image": false}})).await.unwrap();
    store.keep_agent_offers("/opt/codex-acp", "2.6.0", &json!({"prompt": {"image": true}})).await.unwrap();
    assert_eq!(
        store.agent_offers(claude).await.unwrap(),
        Some(("0.100.0".into(), json!({"prompt": {"image": false}})))
    );
    // Another version of it: the one announced last is the one that counts.
    std::thread::sleep(Duration::from_millis(2));
    store.keep_agent_offers(claude, "0.101.0", &json!({"prompt": {"image": true}})).await.unwrap();
    assert_eq!(store.agent_offers(claude).await.unwrap(), Some(("0.101.0".into(), json!({"prompt": {"image": true}}))));
    // The same version again replaces its row.
    std::thread::sleep(Duration::from_millis(2));
    store.keep_agent_offers(claude, "0.101.0", &json!({"prompt": {"audio": true}})).await.unwrap();
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.agent_offers(claude).await.unwrap(), Some(("0.101.0".into(), json!({"prompt": {"audio": true}}))));
    assert_eq!(store.agent_offers("/opt/codex-acp").await.unwrap().unwrap().0, "2.6.0");
    assert_eq!(
        store.agent_offers("/opt/codex-acp --other").await.unwrap(),
        None,
        "another command line is another agent"
    );
    let rows: i64 = raw(store.path()).query_row("SELECT COUNT(*) FROM agent_offers", [], |row| row.get(0)).unwrap();
    assert_eq!(rows, 3);
}
