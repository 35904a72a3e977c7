//! Persistence: sessions, turns and every ACP update as sent, in one SQLite database (WAL).
//!
//! Updates are appended one by one as they are sent, so a SIGKILL loses at most the update being written.
//! Several bridge processes may share one data dir (one per Zed window): WAL plus a busy timeout lets them
//! write without corrupting anything, and a turn is owned by the process (pid) that runs it.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused; the operation did not take effect.
    #[error("session store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The data dir could not be created.
    #[error("session store: cannot create {path}: {source}")]
    Io {
        /// The directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A stored JSON value no longer parses (written by an incompatible version).
    #[error("session store: corrupt record: {0}")]
    Corrupt(String),
}

type Result<T> = std::result::Result<T, StoreError>;

/// One persisted session.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRecord {
    /// Our session id, the one the editor knows.
    pub id: String,
    /// `amp` or `opencode`.
    pub agent: String,
    /// The editor's workspace (absolute).
    pub cwd: String,
    /// The sandbox provider that owns `sandbox_id` (`local`, …).
    pub sandbox_provider: String,
    /// The provider's id for this session's sandbox, once created.
    pub sandbox_id: Option<String>,
    /// The CLI's own conversation id (`ses_…`, `T-…`), once the first turn printed it.
    pub native_id: Option<String>,
    /// Title shown in the editor's history.
    pub title: Option<String>,
    /// Session config (model, mode…) as a JSON object.
    pub config: Value,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// Milliseconds since the Unix epoch.
    pub updated_at: i64,
}

/// How a turn ended, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnStatus {
    /// Still running in the process that owns it.
    Running,
    /// Ended with a stop reason.
    Done,
    /// Ended with an error.
    Failed,
    /// Its bridge died before it ended.
    Interrupted,
}

impl TurnStatus {
    fn as_str(self) -> &'static str {
        match self {
            TurnStatus::Running => "running",
            TurnStatus::Done => "done",
            TurnStatus::Failed => "failed",
            TurnStatus::Interrupted => "interrupted",
        }
    }

    fn parse(text: &str) -> Self {
        match text {
            "running" => TurnStatus::Running,
            "done" => TurnStatus::Done,
            "failed" => TurnStatus::Failed,
            _ => TurnStatus::Interrupted,
        }
    }
}

/// One persisted turn.
#[derive(Clone, Debug)]
pub struct TurnRecord {
    /// Row id.
    pub id: i64,
    /// The session.
    pub session_id: String,
    /// The ACP prompt content blocks, as JSON.
    pub prompt: Value,
    /// How it ended.
    pub status: TurnStatus,
    /// The ACP stop reason when it ended normally.
    pub stop_reason: Option<String>,
    /// The error message when it failed.
    pub error: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub started_at: i64,
    /// Milliseconds since the Unix epoch.
    pub ended_at: Option<i64>,
}

/// The history of one session, ready to replay.
#[derive(Clone, Debug)]
pub struct History {
    /// Turns that were left out because of the replay limit (the oldest ones).
    pub omitted_turns: usize,
    /// The remaining turns, oldest first, each with its updates in the order they were sent.
    pub turns: Vec<(TurnRecord, Vec<Value>)>,
}

/// The SQLite store. Cheap to share behind an `Arc`; every call is a short transaction.
pub struct Store {
    connection: Mutex<Connection>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Formats epoch milliseconds as RFC 3339 (what ACP's `updatedAt` wants).
pub fn rfc3339(ms: i64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(time).to_string()
}

const SCHEMA: &str = "
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
    cost REAL NOT NULL DEFAULT 0,
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

impl Store {
    /// Opens (and creates or migrates) the store at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(parent) = path.parent() {
            crate::config::create_private_dir(parent)
                .map_err(|source| StoreError::Io { path: parent.display().to_string(), source })?;
        }
        let connection = Connection::open(path)?;
        connection.busy_timeout(Duration::from_secs(10))?;
        // Two bridges starting at once (two editor windows) race to switch the journal mode and create the
        // tables; SQLite answers "busy" to the loser without waiting, so it tries again.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match Self::prepare(&connection) {
                Err(rusqlite::Error::SqliteFailure(failure, _))
                    if failure.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                result => break result?,
            }
        }
        Ok(Self { connection: Mutex::new(connection) })
    }

    fn prepare(connection: &Connection) -> rusqlite::Result<()> {
        // WAL lets a second bridge process read while this one writes; NORMAL keeps every committed
        // update across a process kill (only a power loss can drop the last ones).
        connection.pragma_update(None, "journal_mode", "WAL")?;
        connection.pragma_update(None, "synchronous", "NORMAL")?;
        connection.pragma_update(None, "foreign_keys", "ON")?;
        connection.execute_batch(SCHEMA)
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite inconsistent (it has its own transactions),
        // so a poisoned lock is still safe to use.
        self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Inserts a new session.
    pub fn create_session(&self, record: &SessionRecord) -> Result<()> {
        self.lock().execute(
            "INSERT INTO sessions (id, agent, cwd, sandbox_provider, sandbox_id, native_id, title, config, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                record.id,
                record.agent,
                record.cwd,
                record.sandbox_provider,
                record.sandbox_id,
                record.native_id,
                record.title,
                record.config.to_string(),
                record.created_at,
                record.updated_at
            ],
        )?;
        Ok(())
    }

    /// Reads one session.
    pub fn session(&self, id: &str) -> Result<Option<SessionRecord>> {
        let connection = self.lock();
        let record = connection
            .query_row(
                "SELECT id, agent, cwd, sandbox_provider, sandbox_id, native_id, title, config, created_at, updated_at
                 FROM sessions WHERE id = ?1",
                params![id],
                session_from_row,
            )
            .optional()?;
        record.transpose()
    }

    /// Lists sessions, newest first, optionally only those of one agent and one workspace. `before` is a
    /// cursor: the `(updated_at, id)` of the last session of the previous page.
    pub fn list_sessions(
        &self,
        agent: Option<&str>,
        cwd: Option<&str>,
        before: Option<(i64, &str)>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>> {
        let connection = self.lock();
        let mut statement = connection.prepare(
            "SELECT id, agent, cwd, sandbox_provider, sandbox_id, native_id, title, config, created_at, updated_at
             FROM sessions
             WHERE (?1 IS NULL OR cwd = ?1)
               AND (?2 IS NULL OR updated_at < ?2 OR (updated_at = ?2 AND id < ?3))
               AND (?5 IS NULL OR agent = ?5)
             ORDER BY updated_at DESC, id DESC
             LIMIT ?4",
        )?;
        let (before_time, before_id) = match before {
            Some((time, id)) => (Some(time), Some(id)),
            None => (None, None),
        };
        let rows = statement.query_map(params![cwd, before_time, before_id, limit as i64, agent], session_from_row)?;
        let mut sessions = Vec::new();
        for row in rows {
            sessions.push(row??);
        }
        Ok(sessions)
    }

    /// Deletes a session with its turns and events. Deleting an unknown id is not an error.
    pub fn delete_session(&self, id: &str) -> Result<bool> {
        let deleted = self.lock().execute("DELETE FROM sessions WHERE id = ?1", params![id])?;
        Ok(deleted > 0)
    }

    /// Records the CLI's conversation id.
    pub fn set_native_id(&self, id: &str, native_id: Option<&str>) -> Result<()> {
        self.lock().execute(
            "UPDATE sessions SET native_id = ?2, updated_at = ?3 WHERE id = ?1",
            params![id, native_id, now_ms()],
        )?;
        Ok(())
    }

    /// Records the sandbox that serves the session.
    pub fn set_sandbox(&self, id: &str, provider: &str, sandbox_id: Option<&str>) -> Result<()> {
        self.lock().execute(
            "UPDATE sessions SET sandbox_provider = ?2, sandbox_id = ?3 WHERE id = ?1",
            params![id, provider, sandbox_id],
        )?;
        Ok(())
    }

    /// Sets the title shown in the history.
    pub fn set_title(&self, id: &str, title: &str) -> Result<()> {
        self.lock().execute("UPDATE sessions SET title = ?2 WHERE id = ?1", params![id, title])?;
        Ok(())
    }

    /// Replaces the session's config object.
    pub fn set_config(&self, id: &str, config: &Value) -> Result<()> {
        self.lock().execute("UPDATE sessions SET config = ?2 WHERE id = ?1", params![id, config.to_string()])?;
        Ok(())
    }

    /// Starts a turn owned by this process.
    pub fn start_turn(&self, session_id: &str, prompt: &Value) -> Result<i64> {
        let connection = self.lock();
        let now = now_ms();
        connection.execute(
            "INSERT INTO turns (session_id, prompt, status, owner_pid, started_at) VALUES (?1, ?2, 'running', ?3, ?4)",
            params![session_id, prompt.to_string(), std::process::id(), now],
        )?;
        let turn_id = connection.last_insert_rowid();
        connection.execute("UPDATE sessions SET updated_at = ?2 WHERE id = ?1", params![session_id, now])?;
        Ok(turn_id)
    }

    /// Appends one update as sent to the editor.
    pub fn append_event(&self, session_id: &str, turn_id: i64, update: &Value) -> Result<()> {
        self.lock().execute(
            "INSERT INTO events (session_id, turn_id, payload, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![session_id, turn_id, update.to_string(), now_ms()],
        )?;
        Ok(())
    }

    /// Ends a turn, recording what it cost (as the CLI reports it: USD for both).
    pub fn end_turn(
        &self,
        turn_id: i64,
        status: TurnStatus,
        stop_reason: Option<&str>,
        error: Option<&str>,
        cost: f64,
    ) -> Result<()> {
        let connection = self.lock();
        let now = now_ms();
        connection.execute(
            "UPDATE turns SET status = ?2, stop_reason = ?3, error = ?4, ended_at = ?5, cost = ?6 WHERE id = ?1",
            params![turn_id, status.as_str(), stop_reason, error, now, cost],
        )?;
        connection.execute(
            "UPDATE sessions SET updated_at = ?2 WHERE id = (SELECT session_id FROM turns WHERE id = ?1)",
            params![turn_id, now],
        )?;
        Ok(())
    }

    /// Marks as interrupted the running turns of a session whose owning process is gone (killed bridge).
    pub fn mark_orphaned_turns(&self, session_id: &str) -> Result<usize> {
        let connection = self.lock();
        let mut statement =
            connection.prepare("SELECT id, owner_pid FROM turns WHERE session_id = ?1 AND status = 'running'")?;
        let running: Vec<(i64, i64)> = statement
            .query_map(params![session_id], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        drop(statement);
        let mut marked = 0;
        for (turn_id, pid) in running {
            if pid as u32 == std::process::id() || process_alive(pid) {
                continue;
            }
            marked += connection.execute(
                "UPDATE turns SET status = 'interrupted', error = 'the bridge stopped during this turn', ended_at = ?2 WHERE id = ?1",
                params![turn_id, now_ms()],
            )?;
        }
        Ok(marked)
    }

    /// Whether another live process runs a turn of this session right now.
    pub fn running_elsewhere(&self, session_id: &str) -> Result<bool> {
        let connection = self.lock();
        let mut statement =
            connection.prepare("SELECT owner_pid FROM turns WHERE session_id = ?1 AND status = 'running'")?;
        let owners: Vec<i64> =
            statement.query_map(params![session_id], |row| row.get(0))?.collect::<rusqlite::Result<_>>()?;
        Ok(owners.into_iter().any(|pid| pid as u32 != std::process::id() && process_alive(pid)))
    }

    /// What the session's turns cost together: ACP's usage cost is per session, the CLIs report it per turn.
    pub fn session_cost(&self, session_id: &str) -> Result<f64> {
        let cost: f64 = self.lock().query_row(
            "SELECT COALESCE(SUM(cost), 0) FROM turns WHERE session_id = ?1",
            params![session_id],
            |row| row.get(0),
        )?;
        Ok(cost)
    }

    /// The session's turns and their updates, newest turns kept first until `limit` updates are reached.
    pub fn history(&self, session_id: &str, limit: usize) -> Result<History> {
        let connection = self.lock();
        let mut turns_statement = connection.prepare(
            "SELECT id, session_id, prompt, status, stop_reason, error, started_at, ended_at
             FROM turns WHERE session_id = ?1 ORDER BY id DESC",
        )?;
        let turns: Vec<TurnRecord> = turns_statement
            .query_map(params![session_id], |row| {
                let prompt: String = row.get(2)?;
                let status: String = row.get(3)?;
                Ok(TurnRecord {
                    id: row.get(0)?,
                    session_id: row.get(1)?,
                    prompt: serde_json::from_str(&prompt).unwrap_or(Value::Null),
                    status: TurnStatus::parse(&status),
                    stop_reason: row.get(4)?,
                    error: row.get(5)?,
                    started_at: row.get(6)?,
                    ended_at: row.get(7)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut events_statement = connection.prepare("SELECT payload FROM events WHERE turn_id = ?1 ORDER BY id")?;
        let mut kept = Vec::new();
        let mut budget = limit;
        let mut omitted_turns = 0;
        for turn in turns {
            if omitted_turns > 0 {
                omitted_turns += 1;
                continue;
            }
            let payloads: Vec<String> =
                events_statement.query_map(params![turn.id], |row| row.get(0))?.collect::<rusqlite::Result<_>>()?;
            // The prompt itself counts as one update.
            let cost = payloads.len() + 1;
            if cost > budget && !kept.is_empty() {
                omitted_turns = 1;
                continue;
            }
            budget = budget.saturating_sub(cost);
            let mut events = Vec::with_capacity(payloads.len());
            for payload in payloads {
                events.push(serde_json::from_str(&payload).map_err(|e| StoreError::Corrupt(e.to_string()))?);
            }
            kept.push((turn, events));
        }
        kept.reverse();
        Ok(History { omitted_turns, turns: kept })
    }
}

fn session_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Result<SessionRecord>> {
    let config: String = row.get(7)?;
    Ok(serde_json::from_str(&config).map_err(|e| StoreError::Corrupt(e.to_string())).map(|config| SessionRecord {
        id: row.get_unwrap(0),
        agent: row.get_unwrap(1),
        cwd: row.get_unwrap(2),
        sandbox_provider: row.get_unwrap(3),
        sandbox_id: row.get_unwrap(4),
        native_id: row.get_unwrap(5),
        title: row.get_unwrap(6),
        config,
        created_at: row.get_unwrap(8),
        updated_at: row.get_unwrap(9),
    }))
}

fn process_alive(pid: i64) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // Signal 0 checks existence; EPERM still means the process exists.
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(errno) => errno == nix::errno::Errno::EPERM,
    }
}

#[cfg(test)]
mod tests {
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
            created_at: updated_at,
            updated_at,
        }
    }

    #[test]
    fn sessions_round_trip_and_list_by_cwd_with_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite3")).unwrap();
        store.create_session(&record("a", "/w1", 1)).unwrap();
        store.create_session(&record("b", "/w1", 2)).unwrap();
        store.create_session(&record("c", "/w2", 3)).unwrap();
        store.set_native_id("a", Some("ses_1")).unwrap();
        assert_eq!(store.session("a").unwrap().unwrap().native_id.as_deref(), Some("ses_1"));

        let all: Vec<String> = store.list_sessions(None, None, None, 10).unwrap().into_iter().map(|s| s.id).collect();
        assert_eq!(all, ["a", "c", "b"], "set_native_id bumps updated_at, so a is newest");
        let w1 = store.list_sessions(None, Some("/w1"), None, 1).unwrap();
        assert_eq!(w1.len(), 1);
        let next = store.list_sessions(None, Some("/w1"), Some((w1[0].updated_at, &w1[0].id)), 1).unwrap();
        assert_eq!(next[0].id, "b");
        assert!(store.list_sessions(Some("amp"), None, None, 10).unwrap().is_empty(), "all are OpenCode's");
        assert!(store.delete_session("a").unwrap());
        assert!(!store.delete_session("a").unwrap());
        assert!(store.session("a").unwrap().is_none());
    }

    #[test]
    fn history_keeps_newest_turns_within_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite3")).unwrap();
        store.create_session(&record("s", "/w", 1)).unwrap();
        for turn in 0..3 {
            let id = store.start_turn("s", &json!([{"type": "text", "text": format!("p{turn}")}])).unwrap();
            for n in 0..4 {
                store.append_event("s", id, &json!({"n": n, "turn": turn})).unwrap();
            }
            store.end_turn(id, TurnStatus::Done, Some("end_turn"), None, 0.5).unwrap();
        }
        assert_eq!(store.session_cost("s").unwrap(), 1.5);
        let full = store.history("s", 100).unwrap();
        assert_eq!((full.omitted_turns, full.turns.len()), (0, 3));
        assert_eq!(full.turns[0].1[0], json!({"n": 0, "turn": 0}));
        let cut = store.history("s", 11).unwrap();
        assert_eq!((cut.omitted_turns, cut.turns.len()), (1, 2));
        assert_eq!(cut.turns[0].1[0], json!({"n": 0, "turn": 1}));
    }

    #[test]
    fn two_stores_on_one_file_write_concurrently_without_losing_anything() {
        // Two Zed windows are two bridge processes on one data dir; two connections model them here.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite3");
        let writers: Vec<_> = ["a", "b", "c", "d"]
            .into_iter()
            .map(|id| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let store = Store::open(&path).unwrap();
                    store.create_session(&record(id, "/w", 1)).unwrap();
                    let turn = store.start_turn(id, &json!([])).unwrap();
                    for n in 0..300 {
                        store.append_event(id, turn, &json!({ "n": n })).unwrap();
                    }
                    store.end_turn(turn, TurnStatus::Done, Some("end_turn"), None, 0.0).unwrap();
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        let store = Store::open(&path).unwrap();
        for id in ["a", "b", "c", "d"] {
            let history = store.history(id, usize::MAX).unwrap();
            assert_eq!(history.turns[0].1.len(), 300, "session {id}");
        }
        let integrity: String = store.lock().query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
        assert_eq!(integrity, "ok");
    }

    #[test]
    fn running_turn_of_a_dead_process_is_marked_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite3")).unwrap();
        store.create_session(&record("s", "/w", 1)).unwrap();
        let turn = store.start_turn("s", &json!([])).unwrap();
        assert_eq!(store.mark_orphaned_turns("s").unwrap(), 0, "our own running turn is left alone");
        // Pretend a dead process owned it.
        store.lock().execute("UPDATE turns SET owner_pid = 999999999 WHERE id = ?1", params![turn]).unwrap();
        assert_eq!(store.mark_orphaned_turns("s").unwrap(), 1);
        let history = store.history("s", 10).unwrap();
        assert_eq!(history.turns[0].0.status, TurnStatus::Interrupted);
    }
}
