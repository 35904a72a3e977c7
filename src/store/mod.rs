//! Persistence: sessions, turns and every ACP update as sent, in one SQLite database (WAL).
//!
//! One writer thread owns the write connection ([`writer`]); callers queue their writes and await the
//! acknowledgement, which comes once the write is committed. Reads run on connections of their own in
//! `spawn_blocking`. So SQLite never runs on the async runtime's threads, a locked or slow database never holds up
//! the protocol, and "persisted" always means committed.
//!
//! Several bridge processes may share one data dir (one per Zed window): WAL plus a busy timeout lets them write
//! without corrupting anything, and a turn is owned by the process (pid) that runs it. The schema is versioned
//! ([`schema`]).

pub mod lock;
mod outbox;
mod records;
mod schema;
mod writer;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params};
use serde_json::Value;
use tokio::sync::oneshot;

pub use outbox::{Ack, Outbox};
pub use records::{ForkedFrom, History, McpServerShape, SessionContext, SessionRecord, TurnRecord, TurnStatus};
pub use schema::VERSION as SCHEMA_VERSION;
use writer::{Ending, Job, Writer};

/// How long a write waits for another process's lock by default before it fails with [`StoreError::Locked`].
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// A store failure. The variants up to [`StoreError::Stopped`] mean the store cannot write at all (see
/// [`StoreError::is_unavailable`]): a turn that meets one ends with it, and it tells the user what to do.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The disk (or quota) holding the data dir is full. Every write fails with it until there is room again;
    /// then the store goes on by itself.
    #[error(
        "The disk holding {data_dir} is full: the session's last update could not be saved; free space on it (saving resumes by itself as soon as there is room)"
    )]
    DiskFull {
        /// The data dir.
        data_dir: PathBuf,
    },

    /// Another process held the database's write lock for longer than the busy timeout.
    #[error(
        "The session store {path} stayed locked by another program for more than {seconds} s, so this could not be saved: close what holds it (an sqlite3 shell, a backup or sync tool) and try again"
    )]
    Locked {
        /// The database file.
        path: PathBuf,
        /// The busy timeout.
        seconds: u64,
    },

    /// The database file (or its whole data dir) was deleted while the bridge ran: what it wrote would be lost.
    #[error(
        "The session store {path} was deleted while acp-sandbox was running, so nothing more can be saved: put the data dir {data_dir} back, or restart the agent server to start a new, empty store"
    )]
    Gone {
        /// The database file.
        path: PathBuf,
        /// The data dir.
        data_dir: PathBuf,
    },

    /// Another file took the database's place while the bridge ran.
    #[error(
        "The session store {path} was replaced by another file while acp-sandbox was running, so nothing more is saved: restart the agent server to use the new file"
    )]
    Replaced {
        /// The database file.
        path: PathBuf,
    },

    /// SQLite cannot write the file (I/O error, read-only, corrupt, not a database).
    #[error(
        "The session store {path} cannot be written ({reason}), so this could not be saved: check the data dir {data_dir} (its disk and permissions)"
    )]
    Unwritable {
        /// The database file.
        path: PathBuf,
        /// The data dir.
        data_dir: PathBuf,
        /// SQLite's words.
        reason: String,
    },

    /// The store's writer thread is gone (it could not start, or the store is being dropped).
    #[error("The session store's writer stopped, so this could not be saved: restart the agent server")]
    Stopped,

    /// The database was written by a newer acp-sandbox: it is left untouched.
    #[error(
        "The session store {path} was written by a newer acp-sandbox (schema version {found}; this one knows up to {known}): update acp-sandbox, or give this one another --data-dir"
    )]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
        /// The newest this build knows.
        known: i64,
    },

    /// The data dir could not be created.
    #[error("session store: cannot create {path}: {reason}")]
    Io {
        /// The directory.
        path: String,
        /// Why.
        reason: String,
    },

    /// SQLite refused this one operation (a constraint…); it did not take effect, and the store still works.
    #[error("session store: {0}")]
    Sqlite(String),

    /// A stored JSON value no longer parses (written by an incompatible version).
    #[error("session store: corrupt record: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Whether the store cannot write at all (as opposed to refusing one operation).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::DiskFull { .. }
                | StoreError::Locked { .. }
                | StoreError::Gone { .. }
                | StoreError::Replaced { .. }
                | StoreError::Unwritable { .. }
                | StoreError::Stopped
        )
    }

    /// A short machine-readable name of why the store cannot work, for the error's `data`.
    pub fn reason(&self) -> &'static str {
        match self {
            StoreError::DiskFull { .. } => "disk_full",
            StoreError::Locked { .. } => "locked",
            StoreError::Gone { .. } => "gone",
            StoreError::Replaced { .. } => "replaced",
            StoreError::Unwritable { .. } => "unwritable",
            StoreError::Stopped => "stopped",
            StoreError::TooNew { .. } => "too_new",
            StoreError::Io { .. } => "io",
            StoreError::Sqlite(_) => "sqlite",
            StoreError::Corrupt(_) => "corrupt",
        }
    }
}

type Result<T> = std::result::Result<T, StoreError>;

/// A failure inside the store, before it is told apart into a [`StoreError`].
#[derive(Debug)]
enum Failure {
    Sqlite(rusqlite::Error),
    Corrupt(String),
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Failure::Sqlite(error)
    }
}

impl From<serde_json::Error> for Failure {
    fn from(error: serde_json::Error) -> Self {
        Failure::Corrupt(error.to_string())
    }
}

/// What every connection of one store shares: where the database is, and which file it is.
struct Context {
    path: PathBuf,
    data_dir: PathBuf,
    /// Device and inode of the database file as opened: the path must still name that file.
    identity: (u64, u64),
    busy_timeout: Duration,
    /// Transactions committed by the writer (for tests and benchmarks: appends are batched).
    commits: std::sync::atomic::AtomicU64,
    /// Since when the writer has been waiting for another program's lock, if it is: what tells a stuck store from
    /// a slow one (see [`Store::waiting_for_a_lock`]).
    lock_wait: Mutex<Option<std::time::Instant>>,
}

impl Context {
    /// Fails when the database file was deleted (its data dir with it) or replaced since it was opened. An open
    /// connection goes on writing into a deleted file without a word; all of that would be lost.
    fn check_file(&self) -> Result<()> {
        match std::fs::metadata(&self.path) {
            Ok(metadata) if (metadata.dev(), metadata.ino()) == self.identity => Ok(()),
            Ok(_) => Err(StoreError::Replaced { path: self.path.clone() }),
            Err(_) => Err(StoreError::Gone { path: self.path.clone(), data_dir: self.data_dir.clone() }),
        }
    }

    /// Tells a failure apart: the store cannot write, or this one operation failed.
    fn error(&self, failure: Failure) -> StoreError {
        let error = match failure {
            Failure::Corrupt(text) => return StoreError::Corrupt(text),
            Failure::Sqlite(error) => error,
        };
        let Some(code) = error.sqlite_error_code() else {
            return StoreError::Sqlite(error.to_string());
        };
        if let Err(moved) = self.check_file() {
            return moved;
        }
        match code {
            ErrorCode::DiskFull => StoreError::DiskFull { data_dir: self.data_dir.clone() },
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                StoreError::Locked { path: self.path.clone(), seconds: self.busy_timeout.as_secs_f64().ceil() as u64 }
            }
            ErrorCode::SystemIoFailure
            | ErrorCode::CannotOpen
            | ErrorCode::ReadOnly
            | ErrorCode::DatabaseCorrupt
            | ErrorCode::NotADatabase
            | ErrorCode::OutOfMemory
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::PermissionDenied => StoreError::Unwritable {
                path: self.path.clone(),
                data_dir: self.data_dir.clone(),
                reason: error.to_string(),
            },
            _ => StoreError::Sqlite(error.to_string()),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing held under these locks can be left half-changed by a panic.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Read connections, opened as needed and kept for the next read.
struct Readers {
    context: Arc<Context>,
    idle: Mutex<Vec<Connection>>,
}

/// Read connections kept open between reads.
const IDLE_READERS: usize = 4;

impl Readers {
    fn run<R>(&self, read: impl FnOnce(&Connection) -> std::result::Result<R, Failure>) -> Result<R> {
        self.context.check_file()?;
        let connection = lock(&self.idle).pop();
        let connection = match connection {
            Some(connection) => connection,
            None => self.open().map_err(|e| self.context.error(e.into()))?,
        };
        let result = read(&connection).map_err(|failure| self.context.error(failure));
        let mut idle = lock(&self.idle);
        if idle.len() < IDLE_READERS {
            idle.push(connection);
        }
        result
    }

    fn open(&self) -> rusqlite::Result<Connection> {
        // Never created here: a database that vanished must not come back empty.
        let connection = Connection::open_with_flags(
            &self.context.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        connection.busy_timeout(self.context.busy_timeout)?;
        connection.pragma_update(None, "query_only", "ON")?;
        Ok(connection)
    }
}

/// The SQLite store. Cheap to share behind an `Arc`. Every method is async and runs nothing of SQLite on the
/// caller's thread: writes go to the writer thread, reads to `spawn_blocking`.
pub struct Store {
    context: Arc<Context>,
    writer: Writer,
    readers: Arc<Readers>,
}

/// How an update makes an earlier one of its turn dead ([`Store::queue_superseding`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Supersedes {
    /// What it replaces: the last row stored under this key in the turn, if that one may die, is deleted.
    pub key: String,
    /// It says nothing but what the key names, so a later update of the key makes it dead in turn.
    pub dies: bool,
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

impl Store {
    /// Opens (and creates or migrates) the store at `path`, with the default busy timeout. Blocks while it
    /// opens: call it before serving, or in `spawn_blocking`.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, DEFAULT_BUSY_TIMEOUT)
    }

    /// Like [`Store::open`]; a write waits at most `busy_timeout` for another process's lock.
    pub fn open_with(path: &Path, busy_timeout: Duration) -> Result<Self> {
        let data_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        crate::paths::create_private_dir(&data_dir)
            .map_err(|e| StoreError::Io { path: data_dir.display().to_string(), reason: e.to_string() })?;
        let unwritable = |error: rusqlite::Error| StoreError::Unwritable {
            path: path.to_path_buf(),
            data_dir: data_dir.clone(),
            reason: error.to_string(),
        };
        let connection = Connection::open(path).map_err(unwritable)?;
        let metadata = std::fs::metadata(path)
            .map_err(|e| StoreError::Io { path: path.display().to_string(), reason: e.to_string() })?;
        let context = Arc::new(Context {
            path: path.to_path_buf(),
            data_dir: data_dir.clone(),
            identity: (metadata.dev(), metadata.ino()),
            busy_timeout,
            commits: Default::default(),
            lock_wait: Mutex::new(None),
        });
        connection.busy_timeout(busy_timeout).map_err(unwritable)?;
        // Two bridges starting at once (two editor windows) race to switch the journal mode; SQLite answers
        // "busy" to the loser without waiting, so it tries again.
        let deadline = std::time::Instant::now() + busy_timeout;
        loop {
            match Self::prepare(&connection) {
                Err(schema::MigrationError::Sqlite(rusqlite::Error::SqliteFailure(failure, _)))
                    if failure.code == ErrorCode::DatabaseBusy && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(schema::MigrationError::TooNew(found)) => {
                    return Err(StoreError::TooNew { path: path.to_path_buf(), found, known: SCHEMA_VERSION });
                }
                Err(schema::MigrationError::Sqlite(error)) => return Err(context.error(error.into())),
                Ok(()) => break,
            }
        }
        // Turns left `running` by a bridge that is gone are over. Best effort: loading the session tries again.
        if let Err(failure) = mark_orphaned(&connection, None) {
            tracing::warn!(path = %path.display(), "could not mark the turns of dead bridges interrupted: {}", context.error(failure));
        }
        let writer = Writer::start(connection, context.clone()).map_err(|_| StoreError::Stopped)?;
        let readers = Arc::new(Readers { context: context.clone(), idle: Mutex::new(Vec::new()) });
        Ok(Self { context, writer, readers })
    }

    fn prepare(connection: &Connection) -> std::result::Result<(), schema::MigrationError> {
        // WAL lets readers (ours and a second bridge's) read while one connection writes; NORMAL keeps every
        // committed update across a process kill (only a power loss can drop the last ones).
        connection.pragma_update(None, "journal_mode", "WAL")?;
        connection.pragma_update(None, "synchronous", "NORMAL")?;
        connection.pragma_update(None, "foreign_keys", "ON")?;
        // The writer checkpoints when it is idle (`writer.rs`): an automatic checkpoint in the middle of a stream
        // held single updates up for milliseconds (it was the whole p99 of the bench's added latency).
        connection.pragma_update(None, "wal_autocheckpoint", 0)?;
        // A burst of large updates (terminals shown in tool calls) grows the WAL: it shrinks back once checkpointed.
        connection.pragma_update(None, "journal_size_limit", 16i64 << 20)?;
        schema::migrate(connection)?;
        Ok(())
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.context.path
    }

    /// How many transactions the writer committed so far (a batch of queued writes is one).
    pub fn commits(&self) -> u64 {
        self.context.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How long the writer has been waiting for another program's write lock, when it is: the only thing that
    /// holds the store up for good (a busy store under load still commits, only later).
    pub fn waiting_for_a_lock(&self) -> Option<Duration> {
        self.context.lock_wait.lock().unwrap_or_else(|p| p.into_inner()).map(|since| since.elapsed())
    }

    /// Keeps the writer busy for `busy` (a slow disk or a loaded machine), without any lock: for tests.
    #[cfg(test)]
    pub(crate) async fn occupy_writer(&self, busy: Duration) -> Result<()> {
        self.write(move |_| {
            std::thread::sleep(busy);
            Ok(())
        })
        .await
    }

    /// Runs `work` on the writer thread, in a transaction shared with whatever else is queued; answers once it is
    /// committed.
    async fn write<R: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> std::result::Result<R, Failure> + Send + 'static,
    ) -> Result<R> {
        let (reply, answer) = oneshot::channel();
        let work: writer::Work =
            Box::new(move |connection| work(connection).map(|value| Box::new(value) as Box<dyn std::any::Any + Send>));
        self.writer.submit(Job::Work { work, reply }).await?;
        let value = answer.await.unwrap_or(Err(StoreError::Stopped))?;
        value.downcast::<R>().map(|value| *value).map_err(|_| StoreError::Stopped)
    }

    /// Runs `read` on a read connection, off the async runtime's threads.
    async fn read<R: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection) -> std::result::Result<R, Failure> + Send + 'static,
    ) -> Result<R> {
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || readers.run(read)).await.unwrap_or(Err(StoreError::Stopped))
    }

    /// Inserts a new session.
    pub async fn create_session(&self, record: &SessionRecord) -> Result<()> {
        let record = record.clone();
        self.write(move |connection| Ok(insert_session(connection, &record)?)).await
    }

    /// Reads one session.
    pub async fn session(&self, id: &str) -> Result<Option<SessionRecord>> {
        let id = id.to_string();
        self.read(move |connection| {
            let record = connection
                .query_row(
                    "SELECT id, agent, cwd, sandbox_provider, sandbox_id, native_id, title, config, created_at, updated_at, context
                     FROM sessions WHERE id = ?1",
                    params![id],
                    session_from_row,
                )
                .optional()?;
            record.transpose()
        })
        .await
    }

    /// Lists sessions, newest first, optionally only those of one agent and one workspace. `before` is a
    /// cursor: the `(updated_at, id)` of the last session of the previous page.
    pub async fn list_sessions(
        &self,
        agent: Option<&str>,
        cwd: Option<&str>,
        before: Option<(i64, &str)>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>> {
        let agent = agent.map(str::to_string);
        let cwd = cwd.map(str::to_string);
        let (before_time, before_id) = match before {
            Some((time, id)) => (Some(time), Some(id.to_string())),
            None => (None, None),
        };
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT id, agent, cwd, sandbox_provider, sandbox_id, native_id, title, config, created_at, updated_at, context
                 FROM sessions
                 WHERE (?1 IS NULL OR cwd = ?1)
                   AND (?2 IS NULL OR updated_at < ?2 OR (updated_at = ?2 AND id < ?3))
                   AND (?5 IS NULL OR agent = ?5)
                 ORDER BY updated_at DESC, id DESC
                 LIMIT ?4",
            )?;
            let rows = statement.query_map(
                params![cwd, before_time, before_id, i64::try_from(limit).unwrap_or(i64::MAX), agent],
                session_from_row,
            )?;
            let mut sessions = Vec::new();
            for row in rows {
                sessions.push(row??);
            }
            Ok(sessions)
        })
        .await
    }

    /// How many sessions the store holds and when the oldest was created: what a "not found" tells the user.
    pub async fn census(&self) -> Result<(u64, Option<i64>)> {
        self.read(|connection| {
            Ok(connection.query_row("SELECT COUNT(*), MIN(created_at) FROM sessions", [], |row| {
                Ok((row.get::<_, i64>(0)?.max(0) as u64, row.get(1)?))
            })?)
        })
        .await
    }

    /// Deletes a session with its turns and events. Deleting an unknown id is not an error.
    pub async fn delete_session(&self, id: &str) -> Result<bool> {
        let id = id.to_string();
        self.write(move |connection| Ok(connection.execute("DELETE FROM sessions WHERE id = ?1", params![id])? > 0))
            .await
    }

    /// Records the CLI's conversation id.
    pub async fn set_native_id(&self, id: &str, native_id: Option<&str>) -> Result<()> {
        let (id, native_id, now) = (id.to_string(), native_id.map(str::to_string), now_ms());
        self.write(move |connection| {
            connection.execute(
                "UPDATE sessions SET native_id = ?2, updated_at = ?3 WHERE id = ?1",
                params![id, native_id, now],
            )?;
            Ok(())
        })
        .await
    }

    /// Records the sandbox that serves the session.
    pub async fn set_sandbox(&self, id: &str, provider: &str, sandbox_id: Option<&str>) -> Result<()> {
        let (id, provider, sandbox_id) = (id.to_string(), provider.to_string(), sandbox_id.map(str::to_string));
        self.write(move |connection| {
            connection.execute(
                "UPDATE sessions SET sandbox_provider = ?2, sandbox_id = ?3 WHERE id = ?1",
                params![id, provider, sandbox_id],
            )?;
            Ok(())
        })
        .await
    }

    /// Sets the title shown in the history.
    pub async fn set_title(&self, id: &str, title: &str) -> Result<()> {
        let (id, title) = (id.to_string(), title.to_string());
        self.write(move |connection| {
            connection.execute("UPDATE sessions SET title = ?2 WHERE id = ?1", params![id, title])?;
            Ok(())
        })
        .await
    }

    /// Creates `fork` with a copy of `original`'s turns and their updates, in one transaction: the fork replays what
    /// the original did, and what either does from now on is its own. A turn still running in the original is
    /// copied as interrupted (the fork never ran it to its end).
    pub async fn fork_session(&self, original: &str, fork: &SessionRecord) -> Result<()> {
        let (original, fork) = (original.to_string(), fork.clone());
        self.write(move |connection| {
            insert_session(connection, &fork)?;
            let turns: Vec<i64> = {
                let mut statement =
                    connection.prepare_cached("SELECT id FROM turns WHERE session_id = ?1 ORDER BY id")?;
                let rows = statement.query_map(params![original], |row| row.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for turn in turns {
                connection.execute(
                    "INSERT INTO turns (session_id, prompt, status, stop_reason, error, owner_pid, started_at, ended_at, cost)
                     SELECT ?2, prompt, CASE status WHEN 'running' THEN 'interrupted' ELSE status END, stop_reason,
                            CASE status WHEN 'running' THEN 'the session was forked during this turn' ELSE error END,
                            owner_pid, started_at, COALESCE(ended_at, ?3), cost
                     FROM turns WHERE id = ?1",
                    params![turn, fork.id, now_ms()],
                )?;
                let copy = connection.last_insert_rowid();
                connection.execute(
                    "INSERT INTO events (session_id, turn_id, payload, created_at)
                     SELECT ?2, ?3, payload, created_at FROM events WHERE turn_id = ?1 ORDER BY id",
                    params![turn, fork.id, copy],
                )?;
            }
            // The thread goes on in the fork: what the user always allowed there holds in it too.
            connection.execute(
                "INSERT INTO allowed_hosts (session_id, host, port, created_at)
                 SELECT ?2, host, port, created_at FROM allowed_hosts WHERE session_id = ?1",
                params![original, fork.id],
            )?;
            Ok(())
        })
        .await
    }

    /// The `(host, port)`s the user always allows the session's sandbox to reach (`--network ask`), oldest first.
    pub async fn allowed_hosts(&self, session_id: &str) -> Result<Vec<(String, u16)>> {
        let session_id = session_id.to_string();
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT host, port FROM allowed_hosts WHERE session_id = ?1 ORDER BY created_at, host, port",
            )?;
            let rows = statement.query_map(params![session_id], |row| Ok((row.get(0)?, row.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await
    }

    /// Records that the user always allows the session's sandbox to reach `host:port`.
    pub async fn allow_host(&self, session_id: &str, host: &str, port: u16) -> Result<()> {
        let (session_id, host, now) = (session_id.to_string(), host.to_string(), now_ms());
        self.write(move |connection| {
            connection.execute(
                "INSERT OR IGNORE INTO allowed_hosts (session_id, host, port, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![session_id, host, port, now],
            )?;
            Ok(())
        })
        .await
    }

    /// Keeps what the agent `identity` (its command line) of `version` announced of itself, replacing what that
    /// one announced before.
    pub async fn keep_agent_offers(&self, identity: &str, version: &str, offers: &Value) -> Result<()> {
        let (identity, version, offers, now) =
            (identity.to_string(), version.to_string(), offers.to_string(), now_ms());
        self.write(move |connection| {
            connection.execute(
                "INSERT INTO agent_offers (identity, version, offers, updated_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (identity, version) DO UPDATE SET offers = excluded.offers, updated_at = excluded.updated_at",
                params![identity, version, offers, now],
            )?;
            Ok(())
        })
        .await
    }

    /// What the agent `identity` announced last, of whichever version announced last: `(version, offers)`.
    pub async fn agent_offers(&self, identity: &str) -> Result<Option<(String, Value)>> {
        let identity = identity.to_string();
        self.read(move |connection| {
            let found: Option<(String, String)> = connection
                .prepare_cached(
                    "SELECT version, offers FROM agent_offers WHERE identity = ?1
                     ORDER BY updated_at DESC, rowid DESC LIMIT 1",
                )?
                .query_row(params![identity], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()?;
            // A row that is no JSON (written by hand) is as if none were kept.
            Ok(found.and_then(|(version, offers)| Some((version, serde_json::from_str(&offers).ok()?))))
        })
        .await
    }

    /// Replaces what the editor gave the session beside its workspace.
    pub async fn set_context(&self, id: &str, context: &SessionContext) -> Result<()> {
        let (id, context) = (id.to_string(), context_json(context));
        self.write(move |connection| {
            connection.execute("UPDATE sessions SET context = ?2 WHERE id = ?1", params![id, context])?;
            Ok(())
        })
        .await
    }

    /// Replaces the session's config object.
    pub async fn set_config(&self, id: &str, config: &Value) -> Result<()> {
        let (id, config) = (id.to_string(), config.to_string());
        self.write(move |connection| {
            connection.execute("UPDATE sessions SET config = ?2 WHERE id = ?1", params![id, config])?;
            Ok(())
        })
        .await
    }

    /// Starts a turn owned by this process.
    pub async fn start_turn(&self, session_id: &str, prompt: &Value) -> Result<i64> {
        let (session_id, prompt, now) = (session_id.to_string(), prompt.to_string(), now_ms());
        self.write(move |connection| {
            connection.execute(
                "INSERT INTO turns (session_id, prompt, status, owner_pid, started_at) VALUES (?1, ?2, 'running', ?3, ?4)",
                params![session_id, prompt, std::process::id(), now],
            )?;
            let turn_id = connection.last_insert_rowid();
            connection.execute("UPDATE sessions SET updated_at = ?2 WHERE id = ?1", params![session_id, now])?;
            Ok(turn_id)
        })
        .await
    }

    /// Queues one update of a turn, waiting only for room in the writer's queue; the [`Ack`] resolves once it is
    /// committed. Updates queued one after the other are committed in that order, most often together.
    pub async fn queue_event(&self, session_id: &str, turn_id: i64, update: &Value) -> Result<Ack> {
        self.queue_json(session_id, turn_id, update.to_string()).await
    }

    /// [`Store::queue_event`] for an update already serialized (`payload` must be one JSON object): a turn
    /// serializes each update once, for the store and the editor alike.
    pub async fn queue_json(&self, session_id: &str, turn_id: i64, payload: String) -> Result<Ack> {
        self.queue_superseding(session_id, turn_id, payload, None).await
    }

    /// [`Store::queue_json`] for an update that makes the last one of the same key in this turn dead (a tool
    /// call's content, replaced as a whole): that one is deleted as this one is stored, so that a call updated
    /// again and again (a terminal's output) keeps one row, its latest.
    pub async fn queue_superseding(
        &self,
        session_id: &str,
        turn_id: i64,
        payload: String,
        key: Option<Supersedes>,
    ) -> Result<Ack> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Append { session_id: session_id.to_string(), turn_id, payload, at: now_ms(), key, reply };
        self.writer.submit(job).await?;
        Ok(Ack(answer))
    }

    /// Appends one update and waits until it is committed.
    pub async fn append_event(&self, session_id: &str, turn_id: i64, update: &Value) -> Result<()> {
        self.queue_event(session_id, turn_id, update).await?.await
    }

    /// Ends a turn, recording what it cost (as the CLI reports it: USD for both). When the store cannot write,
    /// this fails, and the writer keeps trying until the turn is recorded as ended.
    pub async fn end_turn(
        &self,
        turn_id: i64,
        status: TurnStatus,
        stop_reason: Option<&str>,
        error: Option<&str>,
        cost: f64,
    ) -> Result<()> {
        let ending = Ending {
            turn_id,
            status,
            stop_reason: stop_reason.map(str::to_string),
            error: error.map(str::to_string),
            cost,
            at: now_ms(),
        };
        let (reply, answer) = oneshot::channel();
        self.writer.submit(Job::End { ending, reply }).await?;
        answer.await.unwrap_or(Err(StoreError::Stopped))
    }

    /// Marks as interrupted the running turns of a session whose owning process is gone (killed bridge).
    pub async fn mark_orphaned_turns(&self, session_id: &str) -> Result<usize> {
        let session_id = session_id.to_string();
        self.write(move |connection| mark_orphaned(connection, Some(&session_id))).await
    }

    /// Whether another live process runs a turn of this session right now.
    pub async fn running_elsewhere(&self, session_id: &str) -> Result<bool> {
        let session_id = session_id.to_string();
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached("SELECT owner_pid FROM turns WHERE session_id = ?1 AND status = 'running'")?;
            let owners: Vec<i64> =
                statement.query_map(params![session_id], |row| row.get(0))?.collect::<rusqlite::Result<_>>()?;
            Ok(owners.into_iter().any(|pid| pid as u32 != std::process::id() && process_alive(pid)))
        })
        .await
    }

    /// What the session's turns cost together: ACP's usage cost is per session, the CLIs report it per turn.
    pub async fn session_cost(&self, session_id: &str) -> Result<f64> {
        let session_id = session_id.to_string();
        self.read(move |connection| {
            Ok(connection.query_row(
                "SELECT COALESCE(SUM(cost), 0) FROM turns WHERE session_id = ?1",
                params![session_id],
                |row| row.get(0),
            )?)
        })
        .await
    }

    /// The session's turns and their updates within `limit` updates (a prompt counts as one): the newest turns
    /// whole, older ones left out; a newest turn longer than the limit keeps its prompt and its newest updates.
    pub async fn history(&self, session_id: &str, limit: usize) -> Result<History> {
        let session_id = session_id.to_string();
        self.read(move |connection| history(connection, &session_id, limit)).await
    }
}

/// What a replay shows of a session, without its updates (read page by page with [`Store::replay_page`]): the turns
/// kept within the limit, oldest first, each with the id of its first update shown (`None`: none shown).
#[derive(Clone, Debug)]
pub struct ReplayPlan {
    /// Turns that were left out because of the replay limit (the oldest ones).
    pub omitted_turns: usize,
    /// Updates left out of the first turn kept, its oldest ones.
    pub omitted_updates: usize,
    /// The turns shown, oldest first.
    pub turns: Vec<(TurnRecord, Option<i64>)>,
}

/// How many updates one page of a replay reads: a stored update is at most a few MiB (the emitter's cap), so a
/// page holds at most a few tens of MiB, whatever the turn's length.
pub const REPLAY_PAGE: usize = 16;

impl Store {
    /// What a replay of the session shows within `limit` updates, like [`Store::history`], without reading them.
    pub async fn replay_plan(&self, session_id: &str, limit: usize) -> Result<ReplayPlan> {
        let session_id = session_id.to_string();
        self.read(move |connection| {
            let planned = plan(connection, &session_id, limit)?;
            let mut first_statement =
                connection.prepare_cached("SELECT id FROM events WHERE turn_id = ?1 ORDER BY id LIMIT 1 OFFSET ?2")?;
            let mut turns = Vec::with_capacity(planned.turns.len());
            for (turn, skip, keep) in planned.turns {
                let first = match keep {
                    0 => None,
                    _ => first_statement
                        .query_row(params![turn.id, i64::try_from(skip).unwrap_or(i64::MAX)], |row| row.get(0))
                        .optional()?,
                };
                turns.push((turn, first));
            }
            Ok(ReplayPlan { omitted_turns: planned.omitted_turns, omitted_updates: planned.omitted_updates, turns })
        })
        .await
    }

    /// Up to [`REPLAY_PAGE`] updates of a turn from the update `from` on, in order, each with its id; the next page
    /// starts after the last id.
    pub async fn replay_page(&self, turn_id: i64, from: i64) -> Result<Vec<(i64, Value)>> {
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT id, payload FROM events WHERE turn_id = ?1 AND id >= ?2 ORDER BY id LIMIT ?3",
            )?;
            let rows: Vec<(i64, String)> = statement
                .query_map(params![turn_id, from, REPLAY_PAGE as i64], |row| Ok((row.get(0)?, row.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            let mut page = Vec::with_capacity(rows.len());
            for (id, payload) in rows {
                page.push((id, serde_json::from_str(&payload)?));
            }
            Ok(page)
        })
        .await
    }
}

/// The turns a replay within `limit` updates keeps, newest first counted, oldest first returned: each with how many
/// of its oldest updates are skipped and how many are kept.
struct Planned {
    omitted_turns: usize,
    omitted_updates: usize,
    turns: Vec<(TurnRecord, usize, usize)>,
}

fn plan(connection: &Connection, session_id: &str, limit: usize) -> std::result::Result<Planned, Failure> {
    let mut turns_statement = connection.prepare_cached(
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
    let mut count_statement = connection.prepare_cached("SELECT COUNT(*) FROM events WHERE turn_id = ?1")?;
    let mut kept = Vec::new();
    let mut budget = limit;
    let mut omitted_turns = 0;
    let mut omitted_updates = 0;
    for turn in turns {
        if omitted_turns > 0 || (budget == 0 && !kept.is_empty()) {
            omitted_turns += 1;
            continue;
        }
        let count: i64 = count_statement.query_row(params![turn.id], |row| row.get(0))?;
        let count = usize::try_from(count).unwrap_or(0);
        // The prompt itself counts as one update.
        let keep = if count < budget {
            count
        } else if kept.is_empty() {
            // The newest turn alone is longer than the limit: its newest updates, and a word about the others.
            let keep = budget.saturating_sub(1);
            omitted_updates = count - keep;
            keep
        } else {
            omitted_turns = 1;
            continue;
        };
        budget = budget.saturating_sub(keep + 1);
        kept.push((turn, count - keep, keep));
    }
    kept.reverse();
    Ok(Planned { omitted_turns, omitted_updates, turns: kept })
}

fn history(connection: &Connection, session_id: &str, limit: usize) -> std::result::Result<History, Failure> {
    let planned = plan(connection, session_id, limit)?;
    let mut statement =
        connection.prepare_cached("SELECT payload FROM events WHERE turn_id = ?1 ORDER BY id LIMIT ?2 OFFSET ?3")?;
    let mut turns = Vec::with_capacity(planned.turns.len());
    for (turn, skip, keep) in planned.turns {
        let payloads: Vec<String> = statement
            .query_map(
                params![turn.id, i64::try_from(keep).unwrap_or(i64::MAX), i64::try_from(skip).unwrap_or(i64::MAX)],
                |row| row.get(0),
            )?
            .collect::<rusqlite::Result<_>>()?;
        let mut events = Vec::with_capacity(payloads.len());
        for payload in payloads {
            events.push(serde_json::from_str(&payload)?);
        }
        turns.push((turn, events));
    }
    Ok(History { omitted_turns: planned.omitted_turns, omitted_updates: planned.omitted_updates, turns })
}

/// Marks the running turns (of one session, or all) whose owning process is gone as interrupted.
fn mark_orphaned(connection: &Connection, session_id: Option<&str>) -> std::result::Result<usize, Failure> {
    let mut statement = connection.prepare_cached(
        "SELECT id, owner_pid FROM turns WHERE (?1 IS NULL OR session_id = ?1) AND status = 'running'",
    )?;
    let running: Vec<(i64, i64)> = statement
        .query_map(params![session_id], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
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

fn insert_session(connection: &Connection, record: &SessionRecord) -> rusqlite::Result<()> {
    connection.execute(
        "INSERT INTO sessions (id, agent, cwd, sandbox_provider, sandbox_id, native_id, title, config, created_at, updated_at, context)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
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
            record.updated_at,
            context_json(&record.context),
        ],
    )?;
    Ok(())
}

fn context_json(context: &SessionContext) -> String {
    serde_json::to_string(context).unwrap_or_else(|_| "{}".to_string())
}

fn session_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<std::result::Result<SessionRecord, Failure>> {
    let config: String = row.get(7)?;
    let context: String = row.get(10)?;
    let context = match serde_json::from_str(&context) {
        Ok(context) => context,
        Err(e) => return Ok(Err(Failure::from(e))),
    };
    Ok(serde_json::from_str(&config).map_err(Failure::from).map(|config| SessionRecord {
        id: row.get_unwrap(0),
        agent: row.get_unwrap(1),
        cwd: row.get_unwrap(2),
        sandbox_provider: row.get_unwrap(3),
        sandbox_id: row.get_unwrap(4),
        native_id: row.get_unwrap(5),
        title: row.get_unwrap(6),
        config,
        context,
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
#[path = "tests.rs"]
mod tests;
