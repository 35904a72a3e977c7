//! The store's one writer: a thread that owns the write connection, takes jobs from a bounded queue, runs all
//! that are waiting in one transaction, and acknowledges each job only once that transaction is committed.
//!
//! A fast stream of updates therefore costs one commit per drain of the queue, not one per update; and nothing
//! of SQLite (a busy wait, a slow disk) ever runs on the async runtime's threads.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use rusqlite::{Connection, params};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use super::{Context, Failure, StoreError, TurnStatus};

/// At most this many jobs wait in the queue; a writer that falls behind slows its producers down.
const QUEUE: usize = 8192;

/// At most this many jobs share one transaction.
const BATCH: usize = 8192;

/// How often the end of a turn that could not be recorded is tried again.
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// A piece of write work with a result of its own.
pub(super) type Work = Box<dyn FnOnce(&Connection) -> Result<Box<dyn Any + Send>, Failure> + Send>;

/// How a turn ended, to record.
#[derive(Clone, Debug)]
pub(super) struct Ending {
    pub turn_id: i64,
    pub status: TurnStatus,
    pub stop_reason: Option<String>,
    pub error: Option<String>,
    pub cost: f64,
    pub at: i64,
}

/// One job of the writer.
pub(super) enum Job {
    /// Appends one update (the hot path: one prepared insert, no savepoint).
    Append {
        session_id: String,
        turn_id: i64,
        payload: String,
        at: i64,
        /// The update makes the last one of this key in its turn dead: that one is deleted.
        key: Option<super::Supersedes>,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Ends a turn; kept and tried again while the store cannot write, so that no turn stays `running`.
    End { ending: Ending, reply: oneshot::Sender<Result<(), StoreError>> },
    /// Anything else.
    Work { work: Work, reply: oneshot::Sender<Result<Box<dyn Any + Send>, StoreError>> },
}

struct Queued {
    job: Job,
    /// Frees a place in the queue when the job is done.
    _permit: OwnedSemaphorePermit,
}

/// The handle the store keeps: a bounded queue to the writer thread.
pub(super) struct Writer {
    places: Arc<Semaphore>,
    jobs: mpsc::Sender<Queued>,
}

impl Writer {
    /// Starts the writer thread on `connection` (already migrated).
    pub fn start(mut connection: Connection, context: Arc<Context>) -> std::io::Result<Self> {
        connection.busy_handler(Some(lock_waiter(context.clone()))).map_err(std::io::Error::other)?;
        let (jobs, queue) = mpsc::channel();
        let mut thread = WriterThread {
            connection,
            context,
            unended: Vec::new(),
            broken: HashMap::new(),
            latest: HashMap::new(),
            failing: false,
            since_checkpoint: 0,
            written: 0,
        };
        std::thread::Builder::new().name("acp-sandbox-store".into()).spawn(move || thread.run(queue))?;
        Ok(Self { places: Arc::new(Semaphore::new(QUEUE)), jobs })
    }

    /// Queues a job, waiting (asynchronously) for a free place.
    pub async fn submit(&self, job: Job) -> Result<(), StoreError> {
        let permit = self.places.clone().acquire_owned().await.map_err(|_| StoreError::Stopped)?;
        self.jobs.send(Queued { job, _permit: permit }).map_err(|_| StoreError::Stopped)
    }
}

/// Appends one update with `insert`, prepared on its first use.
fn append<'c>(
    connection: &'c Connection,
    insert: &mut Option<rusqlite::CachedStatement<'c>>,
    session_id: &str,
    turn_id: i64,
    payload: &str,
    at: i64,
) -> Result<(), Failure> {
    let statement =
        match insert {
            Some(statement) => statement,
            None => insert.insert(connection.prepare_cached(
                "INSERT INTO events (session_id, turn_id, payload, created_at) VALUES (?1, ?2, ?3, ?4)",
            )?),
        };
    statement.execute(params![session_id, turn_id, payload, at])?;
    Ok(())
}

/// The row just inserted replaces the last one of its key in `turn_id` (`latest` knows it, if it may die), which is
/// deleted; it is that key's last row from now on if it may die in turn.
fn supersede(
    connection: &Connection,
    latest: &mut HashMap<(i64, String), i64>,
    turn_id: i64,
    key: Option<super::Supersedes>,
) -> Result<(), Failure> {
    let Some(super::Supersedes { key, dies }) = key else { return Ok(()) };
    let row = connection.last_insert_rowid();
    if let Some(dead) = latest.remove(&(turn_id, key.clone())) {
        let mut delete = connection.prepare_cached("DELETE FROM events WHERE id = ?1 AND turn_id = ?2")?;
        delete.execute(params![dead, turn_id])?;
    }
    if dies {
        latest.insert((turn_id, key), row);
    }
    Ok(())
}

/// The pauses between tries on another program's lock, in ms (SQLite's own busy timeout's, then the last one over).
const LOCK_RETRY_MS: [u64; 12] = [1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100];

/// The writer's busy handler: SQLite's busy timeout, which also records since when the writer waits, so that a
/// cancelled turn can tell a store that waits for another program (stuck until it lets go) from one that is only
/// slow.
fn lock_waiter(context: Arc<Context>) -> impl FnMut(i32) -> bool + Send + 'static {
    move |attempt| {
        let since = {
            let mut wait = context.lock_wait.lock().unwrap_or_else(|p| p.into_inner());
            if attempt == 0 || wait.is_none() {
                *wait = Some(std::time::Instant::now());
            }
            wait.unwrap_or_else(std::time::Instant::now)
        };
        let Some(left) = context.busy_timeout.checked_sub(since.elapsed()).filter(|left| !left.is_zero()) else {
            return false;
        };
        let pause = LOCK_RETRY_MS.get(attempt as usize).copied().unwrap_or(100);
        std::thread::sleep(Duration::from_millis(pause).min(left));
        true
    }
}

struct WriterThread {
    connection: Connection,
    context: Arc<Context>,
    /// Turn endings that could not be written yet.
    unended: Vec<Ending>,
    /// Turns an update of which could not be written, with why: their later updates are refused too, so that what
    /// a turn stored is always the prefix of its updates that was acknowledged (and sent), never more.
    broken: HashMap<i64, StoreError>,
    /// The row of the last update of each key in each running turn (see [`Job::Append`]).
    latest: HashMap<(i64, String), i64>,
    /// Whether the last transaction failed (to log the failure and the recovery once each).
    failing: bool,
    /// Transactions committed since the last checkpoint of the WAL into the database file.
    since_checkpoint: usize,
    /// Bytes of updates written since then.
    written: usize,
}

/// The WAL is checkpointed once the queue has been empty this long (a turn's stream has paused or ended)...
const CHECKPOINT_WHEN_IDLE: Duration = Duration::from_millis(250);
/// ...or, in a stream that never pauses, after this many transactions, so the WAL stays bounded.
const CHECKPOINT_AT_THE_LATEST: usize = 5_000;
/// ...or once this many bytes of updates were written since the last, so that a stream of large updates (terminals
/// shown in tool calls, whose dead rows are deleted) does not grow the WAL with it.
const CHECKPOINT_AFTER_BYTES: usize = 16 << 20;

/// What a job did inside the transaction, to acknowledge once it is committed.
enum Done {
    /// An update of a turn.
    Append(oneshot::Sender<Result<(), StoreError>>, Result<(), StoreError>, i64),
    Value(oneshot::Sender<Result<Box<dyn Any + Send>, StoreError>>, Result<Box<dyn Any + Send>, StoreError>),
    /// A turn ending: kept for another try if the transaction fails.
    End(oneshot::Sender<Result<(), StoreError>>, Result<(), StoreError>, Ending),
}

impl Done {
    fn acknowledge(self, failure: Option<&StoreError>) {
        match (self, failure) {
            (Done::Append(reply, result, _), None) | (Done::End(reply, result, _), None) => {
                let _ = reply.send(result);
            }
            (Done::Value(reply, result), None) => {
                let _ = reply.send(result);
            }
            (Done::Append(reply, _, _), Some(error)) | (Done::End(reply, _, _), Some(error)) => {
                let _ = reply.send(Err(error.clone()));
            }
            (Done::Value(reply, _), Some(error)) => {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

impl WriterThread {
    fn run(&mut self, queue: mpsc::Receiver<Queued>) {
        loop {
            let first = if self.unended.is_empty() && self.since_checkpoint == 0 {
                match queue.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            } else if self.unended.is_empty() {
                match queue.recv_timeout(CHECKPOINT_WHEN_IDLE) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => {
                        self.checkpoint();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match queue.recv_timeout(RETRY_EVERY) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => {
                        self.batch(Vec::new());
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            };
            let mut batch = vec![first];
            while batch.len() < BATCH {
                match queue.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            self.batch(batch);
            self.since_checkpoint += 1;
            if self.since_checkpoint >= CHECKPOINT_AT_THE_LATEST || self.written >= CHECKPOINT_AFTER_BYTES {
                self.checkpoint();
            }
        }
        // The store is dropped: a last try for the turns that are still not ended.
        if !self.unended.is_empty() {
            self.batch(Vec::new());
        }
        self.checkpoint();
    }

    /// Copies the WAL into the database file without waiting for readers (a reader in the middle of a read keeps
    /// its frames; the next checkpoint takes them).
    fn checkpoint(&mut self) {
        if let Err(e) = self.connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::debug!(path = %self.context.path.display(), "checkpoint of the session store failed: {e}");
        }
        self.since_checkpoint = 0;
        self.written = 0;
    }

    /// Runs the waiting turn endings and `batch` in one transaction, then acknowledges every job.
    fn batch(&mut self, batch: Vec<Queued>) {
        let mut done: Vec<Done> = Vec::with_capacity(batch.len() + self.unended.len());
        let retried = std::mem::take(&mut self.unended);
        let outcome = self.transaction(retried, batch, &mut done);
        match &outcome {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!(path = %self.context.path.display(), "the session store can write again");
            }
            Err(error) if !self.failing => {
                self.failing = true;
                tracing::error!(path = %self.context.path.display(), "the session store cannot write: {error}");
            }
            _ => {}
        }
        *self.context.lock_wait.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let failure = outcome.err();
        if failure.is_some() {
            // Rows of a rolled-back transaction are not there, and their ids will be given again: forgotten, so that
            // nothing but a dead row is ever deleted (one may stay).
            self.latest.clear();
        }
        for item in done {
            match (&failure, &item) {
                (Some(error), Done::End(_, _, ending)) if error.is_unavailable() => self.unended.push(ending.clone()),
                (Some(error), Done::Append(_, _, turn_id)) => {
                    self.broken.entry(*turn_id).or_insert_with(|| error.clone());
                }
                _ => {}
            }
            item.acknowledge(failure.as_ref());
        }
    }

    fn transaction(
        &mut self,
        retried: Vec<Ending>,
        batch: Vec<Queued>,
        done: &mut Vec<Done>,
    ) -> Result<(), StoreError> {
        // Retried endings have nobody waiting: their acknowledgement goes nowhere.
        let mut jobs: Vec<Job> = retried
            .into_iter()
            .map(|ending| Job::End { ending, reply: oneshot::channel().0 })
            .chain(batch.into_iter().map(|queued| queued.job))
            .collect();
        if let Err(error) = self.context.check_file() {
            done.extend(jobs.drain(..).map(unstarted));
            return Err(error);
        }
        let begun = self.connection.execute_batch("BEGIN IMMEDIATE");
        // The write lock is taken (or given up on) here: the writer no longer waits for it.
        *self.context.lock_wait.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if let Err(error) = begun {
            done.extend(jobs.drain(..).map(unstarted));
            return Err(self.context.error(error.into()));
        }
        let mut jobs = jobs.into_iter();
        // The insert of updates, taken from the statement cache once per transaction rather than once per update.
        let mut insert = None;
        for job in jobs.by_ref() {
            let fatal = match job {
                Job::Append { reply, turn_id, .. } if self.broken.contains_key(&turn_id) => {
                    let error = self.broken.get(&turn_id).cloned().unwrap_or(StoreError::Stopped);
                    done.push(Done::Append(reply, Err(error), turn_id));
                    None
                }
                Job::Append { session_id, turn_id, payload, at, key, reply } => {
                    self.written += payload.len();
                    let result = append(&self.connection, &mut insert, &session_id, turn_id, &payload, at)
                        .and_then(|()| supersede(&self.connection, &mut self.latest, turn_id, key))
                        .map_err(|f| self.context.error(f));
                    let fatal = self.fatal(&result);
                    if let Err(error) = &result {
                        self.broken.insert(turn_id, error.clone());
                    }
                    done.push(Done::Append(reply, result, turn_id));
                    fatal
                }
                Job::End { ending, reply } => {
                    self.latest.retain(|(turn, _), _| *turn != ending.turn_id);
                    let result =
                        self.savepoint(|connection| end(connection, &ending)).map_err(|f| self.context.error(f));
                    let fatal = self.fatal(&result);
                    done.push(Done::End(reply, result, ending));
                    fatal
                }
                Job::Work { work, reply } => {
                    let result = self.savepoint(work).map_err(|f| self.context.error(f));
                    let fatal = self.fatal(&result);
                    done.push(Done::Value(reply, result));
                    fatal
                }
            };
            if let Some(error) = fatal {
                done.extend(jobs.map(unstarted));
                self.rollback();
                return Err(error);
            }
        }
        if let Err(error) = self.connection.execute_batch("COMMIT") {
            self.rollback();
            return Err(self.context.error(error.into()));
        }
        self.context.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Committed into a file that is no longer the store's (its data dir deleted meanwhile): lost all the same.
        self.context.check_file()
    }

    /// Runs `work` in a savepoint: a job that fails alone leaves the rest of the transaction as it was.
    fn savepoint<T>(&self, work: impl FnOnce(&Connection) -> Result<T, Failure>) -> Result<T, Failure> {
        self.connection.execute_batch("SAVEPOINT job")?;
        let result = work(&self.connection);
        if !self.connection.is_autocommit() {
            if result.is_err() {
                self.connection.execute_batch("ROLLBACK TO job")?;
            }
            self.connection.execute_batch("RELEASE job")?;
        }
        result
    }

    /// The error that ends the whole transaction, if `result` is one: the store cannot write, or SQLite rolled the
    /// transaction back itself.
    fn fatal<T>(&self, result: &Result<T, StoreError>) -> Option<StoreError> {
        let Err(error) = result else { return None };
        (error.is_unavailable() || self.connection.is_autocommit()).then(|| error.clone())
    }

    fn rollback(&self) {
        if !self.connection.is_autocommit() {
            let _ = self.connection.execute_batch("ROLLBACK");
        }
    }
}

/// A job that never ran because its transaction failed first: it gets that transaction's error.
fn unstarted(job: Job) -> Done {
    let error = Err(StoreError::Stopped);
    match job {
        Job::Append { reply, turn_id, .. } => Done::Append(reply, error, turn_id),
        Job::End { ending, reply } => Done::End(reply, error, ending),
        Job::Work { reply, .. } => Done::Value(reply, Err(StoreError::Stopped)),
    }
}

fn end(connection: &Connection, ending: &Ending) -> Result<(), Failure> {
    connection.execute(
        "UPDATE turns SET status = ?2, stop_reason = ?3, error = ?4, ended_at = ?5, cost = ?6 WHERE id = ?1",
        params![ending.turn_id, ending.status.as_str(), ending.stop_reason, ending.error, ending.at, ending.cost],
    )?;
    connection.execute(
        "UPDATE sessions SET updated_at = ?2 WHERE id = (SELECT session_id FROM turns WHERE id = ?1)",
        params![ending.turn_id, ending.at],
    )?;
    Ok(())
}
