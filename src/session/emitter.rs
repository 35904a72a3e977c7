//! The emitter: every update of a turn stored, then sent once the store acknowledged it, each bounded in size; and
//! how long a cancelled turn still waits for its store.

use std::sync::Arc;

use agent_client_protocol::v1::schema::{SessionUpdate, ToolCallStatus};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::store::{Outbox, Store};

/// Persists each update, then sends it once the store acknowledged it: what the editor saw is what
/// `session/load` replays. Updates are queued without waiting for each commit, so a fast stream is written in
/// batches; they reach the editor in order.
pub(in crate::session) struct Emitter {
    pub(super) store: Arc<Store>,
    /// Hands each update's JSON to the editor's sink once it is committed.
    pub(super) outbox: Outbox<String>,
    pub(super) session_id: String,
    pub(in crate::session) turn_id: i64,
    /// What earlier turns cost: added to this turn's running cost, since ACP reports it per session.
    pub(super) prior_cost: f64,
    /// This turn's running cost as the CLI reported it.
    pub(super) turn_cost: std::sync::Mutex<f64>,
    /// The tool calls this turn ended (`completed`, `failed`): an update that only sets such a call's content after
    /// that is stale (a terminal's coalesced output racing the agent's own completion) and is dropped.
    pub(super) ended_calls: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The turn's cancel: once it fires, the turn waits for its store only while the store is not stuck (see
    /// [`Emitter::unless_given_up`]).
    pub(super) cancel: CancellationToken,
    /// When a cancelled turn stops waiting for its store at the latest.
    pub(super) deadline: std::sync::OnceLock<tokio::time::Instant>,
    /// The cancelled turn gave up on its store: later steps are not waited for either.
    pub(super) given_up: std::sync::atomic::AtomicBool,
}

/// The most text one update keeps, stored and sent (its long strings together: a message chunk's text, a tool's
/// output, a diff): what is beyond is cut, with [`cut_note`] where it was cut. A CLI or server that sends one
/// enormous event costs a bounded store, replay and editor, whatever the backend.
pub(in crate::session) const UPDATE_TEXT_LIMIT: usize = 2 * 1024 * 1024;

/// Strings up to this long are never cut (ids, kinds, paths, titles): only text counts against the limit.
const SHORT_TEXT: usize = 4096;

/// What an update whose text was cut says where it was cut.
pub(in crate::session) fn cut_note(dropped: usize) -> String {
    format!(
        "\n\n[acp-sandbox cut this text here: {dropped} more bytes did not fit in one update, which keeps at most {} MiB]",
        UPDATE_TEXT_LIMIT >> 20
    )
}

/// Cuts the update's text to [`UPDATE_TEXT_LIMIT`] (the notes included), in order, each cut string ending with
/// [`cut_note`]; a tool's
/// raw input or output still too large after that (many short strings) is replaced by a note. Whether it cut.
pub(in crate::session) fn bound_update(update: &mut serde_json::Value) -> bool {
    fn cut(value: &mut serde_json::Value, budget: &mut usize) -> bool {
        match value {
            serde_json::Value::String(text) if text.len() > SHORT_TEXT => {
                if text.len() <= *budget {
                    *budget -= text.len();
                    return false;
                }
                // The note fits in the budget too, so that an update cut once is never cut again (on replay).
                let keep = text.floor_char_boundary(budget.saturating_sub(cut_note(text.len()).len()));
                let dropped = text.len() - keep;
                text.truncate(keep);
                text.push_str(&cut_note(dropped));
                text.shrink_to_fit();
                *budget = 0;
                true
            }
            serde_json::Value::Array(items) => items.iter_mut().fold(false, |was, item| cut(item, budget) | was),
            serde_json::Value::Object(fields) => fields.values_mut().fold(false, |was, field| cut(field, budget) | was),
            _ => false,
        }
    }
    /// About how many bytes the value takes serialized.
    fn size(value: &serde_json::Value) -> usize {
        match value {
            serde_json::Value::String(text) => text.len() + 2,
            serde_json::Value::Array(items) => items.iter().map(|item| size(item) + 1).sum::<usize>() + 2,
            serde_json::Value::Object(fields) => fields.iter().map(|(key, field)| key.len() + 4 + size(field)).sum(),
            _ => 8,
        }
    }
    let mut budget = UPDATE_TEXT_LIMIT;
    let mut was_cut = cut(update, &mut budget);
    if size(update) > 2 * UPDATE_TEXT_LIMIT
        && let Some(fields) = update.as_object_mut()
    {
        for raw in ["rawInput", "rawOutput"] {
            if let Some(field) = fields.get_mut(raw)
                && size(field) > UPDATE_TEXT_LIMIT
            {
                *field = serde_json::Value::String(cut_note(size(field)));
                was_cut = true;
            }
        }
    }
    was_cut
}

/// How `update` makes an earlier stored one dead: a tool call update that sets the call's content (which replaces
/// the content as a whole) makes the last one that set only that content dead. A terminal shown in a call is updated
/// so, again and again: the store keeps its latest state, and a replay shows what the editor saw last.
pub(in crate::session) fn superseding(update: &SessionUpdate) -> Option<crate::store::Supersedes> {
    let SessionUpdate::ToolCallUpdate(call) = update else { return None };
    let fields = &call.fields;
    fields.content.as_ref()?;
    let others = (fields.kind, &fields.status, &fields.title, &fields.name, &fields.locations);
    let dies = others == (None, &None, &None, &None, &None)
        && fields.raw_input.is_none()
        && fields.raw_output.is_none()
        && call.meta.is_none();
    Some(crate::store::Supersedes { key: format!("content {}", call.tool_call_id.0), dies })
}

/// How long a cancelled turn waits for a store that waits for another program's lock. Such a store must not hold
/// the cancel until its busy timeout: the turn is answered, and what could not be written yet is written (not sent)
/// once the store can. Only a lock wait counts: a store that is slow (a loaded machine, a long backlog of updates)
/// still commits, and its last updates are sent before the answer.
const CANCEL_STORE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a cancelled turn waits for its store at most, stuck or not: a disk that stopped answering.
const CANCEL_STORE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a cancelled turn looks whether its store is stuck.
const CANCEL_STORE_CHECK: std::time::Duration = std::time::Duration::from_millis(25);

impl Emitter {
    /// The emitter of turn `turn_id` of `session_id`, whose updates reach `sink` once `store` kept them.
    pub(in crate::session) fn new(
        store: Arc<Store>,
        sink: Arc<dyn crate::session::UpdateSink>,
        session_id: &str,
        turn_id: i64,
        prior_cost: f64,
        cancel: CancellationToken,
    ) -> Self {
        let sink_session = session_id.to_string();
        Self {
            store,
            outbox: Outbox::new(move |run| sink.send_json_run(&sink_session, run)),
            session_id: session_id.to_string(),
            turn_id,
            prior_cost,
            turn_cost: std::sync::Mutex::new(0.0),
            ended_calls: std::sync::Mutex::default(),
            cancel,
            deadline: std::sync::OnceLock::new(),
            given_up: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The turn's cancel.
    pub(in crate::session) fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Queues one update; fails when the store cannot write it (or could not write an earlier one).
    pub(in crate::session) async fn send(&self, update: SessionUpdate) -> Result<()> {
        let update = match update {
            SessionUpdate::UsageUpdate(mut usage) => {
                if let Some(cost) = usage.cost.as_mut() {
                    *self.turn_cost.lock().unwrap_or_else(|p| p.into_inner()) = cost.amount;
                    cost.amount += self.prior_cost;
                }
                SessionUpdate::UsageUpdate(usage)
            }
            other => other,
        };
        if let SessionUpdate::ToolCallUpdate(call) = &update {
            let mut ended = self.ended_calls.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(call.fields.status, Some(ToolCallStatus::Completed | ToolCallStatus::Failed)) {
                ended.insert(call.tool_call_id.0.to_string());
            } else if superseding(&update).is_some_and(|key| key.dies) && ended.contains(call.tool_call_id.0.as_ref()) {
                return Ok(());
            }
        }
        let Some(json) = self.serialize(&update) else { return Ok(()) };
        let key = superseding(&update);
        drop(update);
        // Given up on (the turn was cancelled and the store is stuck): neither stored nor sent.
        let queued = self.store.queue_superseding(&self.session_id, self.turn_id, json.clone(), key);
        let Some(ack) = self.unless_given_up(queued).await else {
            return Ok(());
        };
        Ok(self.outbox.push(ack?, json)?)
    }

    /// The update's JSON, serialized once for the store and the editor alike: what is sent is what is stored, byte
    /// for byte. Bounded to [`UPDATE_TEXT_LIMIT`], and a new file's diff says `"oldText": null` (see
    /// [`crate::agents::tools::explicit_new_files`]). `None` when it cannot be serialized: not stored, so not
    /// sent either, and a replay shows what the editor saw.
    fn serialize(&self, update: &SessionUpdate) -> Option<String> {
        let new_file = crate::agents::tools::has_new_file_diff(update);
        if !new_file {
            match serde_json::to_string(update) {
                // No more text than the limit in the whole JSON: nothing to cut (the hot path, one serialization).
                Ok(json) if json.len() <= UPDATE_TEXT_LIMIT => return Some(json),
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(session = %self.session_id, "could not serialize an update: {e}");
                    return None;
                }
            }
        }
        let mut value = match serde_json::to_value(update) {
            Ok(value) => value,
            Err(e) => {
                tracing::error!(session = %self.session_id, "could not serialize an update: {e}");
                return None;
            }
        };
        if bound_update(&mut value) {
            tracing::warn!(session = %self.session_id, "an update had more than {} MiB of text: the rest was cut", UPDATE_TEXT_LIMIT >> 20);
        }
        if new_file {
            crate::agents::tools::explicit_new_files(&mut value);
        }
        Some(value.to_string())
    }

    /// Waits until every update queued so far is stored and sent. A cancelled turn waits only for its grace;
    /// what is left is stored but no longer sent.
    pub(super) async fn flush(&self) -> Result<()> {
        match self.unless_given_up(self.outbox.flush()).await {
            Some(flushed) => Ok(flushed?),
            None => {
                self.outbox.mute();
                tracing::warn!(session = %self.session_id, "the store is stuck: the cancelled turn is answered without its last updates, which are stored once it can write");
                Ok(())
            }
        }
    }

    /// Awaits a step that waits for the store, unless the turn is cancelled and the store is stuck: its writer has
    /// waited for another program's lock for [`CANCEL_STORE_GRACE`], or [`CANCEL_STORE_DEADLINE`] passed since the
    /// cancel. Then `None`, and the step is dropped; so are later steps that are not done at once.
    pub(in crate::session) async fn unless_given_up<F: Future>(&self, step: F) -> Option<F::Output> {
        use std::sync::atomic::Ordering;
        let mut step = std::pin::pin!(step);
        if !self.cancel.is_cancelled() {
            tokio::select! {
                biased;
                done = &mut step => return Some(done),
                _ = self.cancel.cancelled() => {}
            }
        }
        if self.given_up.load(Ordering::Relaxed) {
            return tokio::time::timeout(std::time::Duration::ZERO, step).await.ok();
        }
        let deadline = *self.deadline.get_or_init(|| tokio::time::Instant::now() + CANCEL_STORE_DEADLINE);
        loop {
            tokio::select! {
                biased;
                done = &mut step => return Some(done),
                _ = tokio::time::sleep(CANCEL_STORE_CHECK) => {}
            }
            let stuck = self.store.waiting_for_a_lock().is_some_and(|waited| waited >= CANCEL_STORE_GRACE);
            if stuck || tokio::time::Instant::now() >= deadline {
                self.given_up.store(true, Ordering::Relaxed);
                return None;
            }
        }
    }

    /// Like [`Emitter::unless_given_up`], for a write that must happen even when the turn stops waiting for it:
    /// it runs on a task of its own, and the store's writer commits it once it can.
    pub(in crate::session) async fn write<T: Send + 'static>(
        &self,
        write: impl Future<Output = std::result::Result<T, crate::store::StoreError>> + Send + 'static,
    ) -> Result<Option<T>> {
        let task = tokio::spawn(write);
        match self.unless_given_up(task).await {
            None => Ok(None),
            Some(Ok(written)) => Ok(Some(written?)),
            Some(Err(_)) => Err(Error::Store(crate::store::StoreError::Stopped)),
        }
    }
}

/// A fresh store in `dir` with a session `s` and a running turn of it (its id).
#[cfg(test)]
pub(in crate::session) async fn store_with_a_turn(
    dir: &std::path::Path,
    busy_timeout: std::time::Duration,
) -> (Arc<Store>, i64) {
    let store = Arc::new(Store::open_with(&dir.join("db.sqlite3"), busy_timeout).unwrap());
    let record = crate::store::SessionRecord {
        id: "s".into(),
        agent: "opencode".into(),
        cwd: "/w".into(),
        sandbox_provider: "local".into(),
        sandbox_id: None,
        native_id: None,
        title: None,
        config: serde_json::json!({}),
        context: Default::default(),
        created_at: 1,
        updated_at: 1,
    };
    store.create_session(&record).await.unwrap();
    let turn_id = store.start_turn("s", &serde_json::json!([])).await.unwrap();
    (store, turn_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{ContentBlock, ToolCall, ToolCallContent};

    #[test]
    fn an_update_is_cut_to_the_limit_at_a_character_boundary_with_the_note_and_never_cut_twice() {
        // Three-byte characters, so that the limit falls inside one.
        let text = "€".repeat(UPDATE_TEXT_LIMIT);
        let mut update = serde_json::json!({
            "sessionUpdate": "tool_call_update",
            "toolCallId": "call_1",
            "title": "x".repeat(100),
            "content": [{"type": "content", "content": {"type": "text", "text": text}}],
            "rawOutput": {"output": "z".repeat(SHORT_TEXT + 1)},
        });
        assert!(bound_update(&mut update));
        let cut = update["content"][0]["content"]["text"].as_str().unwrap();
        let kept = cut.find("\n\n[acp-sandbox").unwrap();
        assert_eq!(cut.len(), kept + cut_note(text.len() - kept).len());
        assert!(cut.len() <= UPDATE_TEXT_LIMIT && kept.is_multiple_of(3), "cut inside a character or past the limit");
        assert_eq!(&cut[kept..], cut_note(text.len() - kept));
        // The budget is spent: the long output after it keeps nothing but its note; short strings are kept.
        assert_eq!(update["rawOutput"]["output"], cut_note(SHORT_TEXT + 1).as_str());
        assert_eq!(update["title"], "x".repeat(100).as_str());
        let once = update.clone();
        assert!(!bound_update(&mut update) || update == once, "an update cut once was cut again");
        assert_eq!(update, once);
        let mut small =
            serde_json::json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}});
        assert!(!bound_update(&mut small));
    }

    /// A cancelled turn's emitter on a fresh store, and what it sent.
    async fn cancelled_emitter(
        dir: &std::path::Path,
        busy_timeout: std::time::Duration,
    ) -> (Emitter, Arc<std::sync::Mutex<Vec<String>>>) {
        let (store, turn_id) = store_with_a_turn(dir, busy_timeout).await;
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = sent.clone();
        let cancel = CancellationToken::new();
        cancel.cancel();
        let emitter = Emitter {
            store,
            outbox: Outbox::new(move |run| seen.lock().unwrap().extend(run)),
            session_id: "s".into(),
            turn_id,
            prior_cost: 0.0,
            turn_cost: std::sync::Mutex::new(0.0),
            ended_calls: std::sync::Mutex::default(),
            cancel,
            deadline: std::sync::OnceLock::new(),
            given_up: std::sync::atomic::AtomicBool::new(false),
        };
        (emitter, sent)
    }

    fn chunk(text: &str) -> SessionUpdate {
        SessionUpdate::AgentMessageChunk(agent_client_protocol::v1::schema::ContentChunk::new(ContentBlock::from(
            text.to_string(),
        )))
    }

    /// What made the grace misfire under load: a store that is only slow (its writer busy for longer than the grace,
    /// as on a loaded machine with a backlog) is waited for, and the cancelled turn's last update is sent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_turn_waits_for_a_slow_store_and_sends_its_last_update() {
        let dir = tempfile::tempdir().unwrap();
        let (emitter, sent) = cancelled_emitter(dir.path(), std::time::Duration::from_secs(600)).await;
        let store = emitter.store.clone();
        let busy = tokio::spawn(async move { store.occupy_writer(CANCEL_STORE_GRACE * 3).await });
        // The writer takes the slow job first.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        emitter.send(chunk("the last words")).await.unwrap();
        emitter.flush().await.unwrap();
        busy.await.unwrap().unwrap();
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 1, "the last update was not sent: {sent:?}");
        assert_eq!(sent[0], serde_json::to_string(&chunk("the last words")).unwrap(), "sent as it was serialized");
        assert!(!emitter.given_up.load(std::sync::atomic::Ordering::Relaxed), "gave up on a store that was not stuck");
    }

    /// Each update is serialized once: the editor gets the very bytes the store kept, also for an update whose text
    /// was cut and for a new file's diff (which says `"oldText": null`, as `tools::update_json` writes it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_is_sent_is_what_was_stored_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let (emitter, sent) = cancelled_emitter(dir.path(), std::time::Duration::from_secs(600)).await;
        let new_file =
            SessionUpdate::ToolCall(ToolCall::new("call_1", "write").content(vec![ToolCallContent::Diff(
                agent_client_protocol::v1::schema::Diff::new("/w/new.txt", "text"),
            )]));
        emitter.send(chunk("plain")).await.unwrap();
        emitter.send(chunk(&"x".repeat(UPDATE_TEXT_LIMIT + 10))).await.unwrap();
        emitter.send(new_file).await.unwrap();
        emitter.flush().await.unwrap();
        let sent = sent.lock().unwrap().clone();
        let stored: Vec<String> = rusqlite::Connection::open(dir.path().join("db.sqlite3"))
            .unwrap()
            .prepare("SELECT payload FROM events ORDER BY id")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(sent, stored);
        assert_eq!(sent[0], serde_json::to_string(&chunk("plain")).unwrap());
        assert!(sent[1].len() <= UPDATE_TEXT_LIMIT + 100 && sent[1].contains("acp-sandbox cut this text"), "cut");
        let diff: serde_json::Value = serde_json::from_str(&sent[2]).unwrap();
        assert_eq!(diff["content"][0].get("oldText"), Some(&serde_json::Value::Null), "{diff}");
    }

    /// A store whose writer waits for another program's lock is given up on (within the test's deadline, long before
    /// the busy timeout): the cancelled turn is answered, its update is not sent, and it is stored once the lock goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_turn_gives_up_on_a_store_that_waits_for_another_programs_lock() {
        let dir = tempfile::tempdir().unwrap();
        let (emitter, sent) = cancelled_emitter(dir.path(), std::time::Duration::from_secs(600)).await;
        let other = rusqlite::Connection::open(dir.path().join("db.sqlite3")).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let answered = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            emitter.send(chunk("held up")).await.unwrap();
            emitter.flush().await.unwrap();
        })
        .await;
        assert!(answered.is_ok(), "the cancelled turn waited for the lock");
        assert!(emitter.given_up.load(std::sync::atomic::Ordering::Relaxed));
        assert!(sent.lock().unwrap().is_empty(), "an update was sent before it was stored");
        assert!(emitter.store.waiting_for_a_lock().is_some(), "the writer still waits for the lock");
        other.execute_batch("COMMIT").unwrap();
        let stored = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            loop {
                let history = emitter.store.history("s", 100).await.unwrap();
                if !history.turns[0].1.is_empty() {
                    return history.turns[0].1.clone();
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the update is stored once the lock is released");
        assert_eq!(stored, [serde_json::to_value(chunk("held up")).unwrap()]);
        assert_eq!(emitter.store.waiting_for_a_lock(), None);
    }
}
