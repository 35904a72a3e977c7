//! The store's schema, versioned with `PRAGMA user_version` and brought up to date by ordered migrations.
//!
//! `rusqlite_migration` would do this, but no release of it works with rusqlite 0.43 (2.6.0, the newest, needs
//! 0.40), so this is the same idea in a few lines: migration N takes the schema from version N to N + 1, each
//! runs in the transaction that records its number, and a database newer than this build is left untouched.
//!
//! The first two schemas shipped without a version (`user_version` 0): [`unversioned`] tells them apart by
//! their columns, so each is a start point.

use rusqlite::{Connection, OptionalExtension};

/// The schema this build writes.
pub const VERSION: i64 = MIGRATIONS.len() as i64;

/// Migration `i` takes the schema from version `i` to `i + 1`. Append only: a shipped migration never changes.
const MIGRATIONS: &[&str] = &[
    // 0 → 1: the first schema (sessions, turns, events), as shipped before versioning.
    "
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
    ",
    // 1 → 2: what each turn cost (the session's usage is the sum).
    "ALTER TABLE turns ADD COLUMN cost REAL NOT NULL DEFAULT 0;",
    // 2 → 3: what the editor gave the session beside its workspace (extra roots, system prompt, MCP servers).
    "ALTER TABLE sessions ADD COLUMN context TEXT NOT NULL DEFAULT '{}';",
    // 3 → 4: the hosts the user always allows a session's sandbox to reach (`--network ask`).
    "
    CREATE TABLE IF NOT EXISTS allowed_hosts (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        host TEXT NOT NULL,
        port INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (session_id, host, port)
    );
    ",
    // 4 → 5: what each ACP agent (its command line and version) last announced of itself (capabilities, modes,
    // options), so that a fresh bridge offers it before the agent starts.
    "
    CREATE TABLE IF NOT EXISTS agent_offers (
        identity TEXT NOT NULL,
        version TEXT NOT NULL,
        offers TEXT NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (identity, version)
    );
    ",
];

/// Why the schema could not be brought up to date.
#[derive(Debug)]
pub enum MigrationError {
    /// SQLite failed; nothing was changed by the failing migration.
    Sqlite(rusqlite::Error),
    /// The database was written by a newer build.
    TooNew(i64),
}

impl From<rusqlite::Error> for MigrationError {
    fn from(error: rusqlite::Error) -> Self {
        MigrationError::Sqlite(error)
    }
}

/// Brings the database to [`VERSION`]. Each step is its own `BEGIN IMMEDIATE` transaction, so two bridges opening
/// one database at once migrate it once: the second one reads the version again under the lock.
pub fn migrate(connection: &Connection) -> Result<i64, MigrationError> {
    // Up to date is the common case: it takes no lock and writes nothing (a full disk must not stop a bridge
    // from starting and reading its sessions).
    let version: i64 = connection.pragma_query_value(None, "user_version", |row| row.get(0))?;
    if version == VERSION {
        return Ok(VERSION);
    }
    if version > VERSION {
        return Err(MigrationError::TooNew(version));
    }
    loop {
        connection.execute_batch("BEGIN IMMEDIATE")?;
        let step = (|| -> Result<Option<i64>, MigrationError> {
            let mut version: i64 = connection.pragma_query_value(None, "user_version", |row| row.get(0))?;
            if version == 0 {
                version = unversioned(connection)?;
            }
            if version > VERSION {
                return Err(MigrationError::TooNew(version));
            }
            let Some(sql) = MIGRATIONS.get(version as usize) else {
                // Up to date; the version is written when an unversioned schema was recognised.
                let stored: i64 = connection.pragma_query_value(None, "user_version", |row| row.get(0))?;
                if stored != version {
                    connection.pragma_update(None, "user_version", version)?;
                }
                return Ok(None);
            };
            connection.execute_batch(sql)?;
            connection.pragma_update(None, "user_version", version + 1)?;
            Ok(Some(version + 1))
        })();
        match step {
            Ok(next) => {
                connection.execute_batch("COMMIT")?;
                if next.is_none() {
                    return Ok(VERSION);
                }
            }
            Err(error) => {
                let _ = connection.execute_batch("ROLLBACK");
                return Err(error);
            }
        }
    }
}

/// The version of a database whose `user_version` is 0: empty (0), or one of the schemas shipped before
/// versioning, told apart by their columns.
fn unversioned(connection: &Connection) -> rusqlite::Result<i64> {
    let has_turns: Option<String> = connection
        .query_row("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'turns'", [], |row| row.get(0))
        .optional()?;
    if has_turns.is_none() {
        return Ok(0);
    }
    let has_cost: i64 =
        connection
            .query_row("SELECT COUNT(*) FROM pragma_table_info('turns') WHERE name = 'cost'", [], |row| row.get(0))?;
    Ok(if has_cost > 0 { 2 } else { 1 })
}
