//! The turn loop in process: a scripted engine and translator, a recording sink, a real store and sandbox.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, SessionUpdate, StopReason, ToolCall, ToolCallStatus, WriteTextFileRequest,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Turn;
use crate::agents::engine::{Attempt, Ended, Seen, Step, Stop, TurnEngine, ended, stopped};
use crate::agents::{Output, StreamEnd, Translator, TurnEnd};
use crate::config::Config;
use crate::error::Error;
use crate::session::emitter::Emitter;
use crate::session::{Bridge, UpdateSink};

/// What the sink and the engine saw, in the order they saw it.
type Log = Arc<Mutex<Vec<String>>>;

/// Keeps every update sent and every file handed to the editor.
struct RecordingSink {
    log: Log,
}

#[async_trait::async_trait]
impl UpdateSink for RecordingSink {
    fn send(&self, _session_id: &str, update: SessionUpdate) {
        self.log.lock().unwrap().push(serde_json::to_string(&update).unwrap());
    }

    fn send_json(&self, _session_id: &str, update: String) {
        self.log.lock().unwrap().push(update);
    }

    async fn write_text_file(&self, request: WriteTextFileRequest) -> std::result::Result<(), String> {
        self.log.lock().unwrap().push(format!("write {} {}", request.path.display(), request.content));
        Ok(())
    }
}

/// Lines as the scripted agent speaks them: `text:…`, `tool:ID` (a finished tool), `end`, `abort:…`.
struct ScriptTranslator;

fn chunk(text: &str) -> SessionUpdate {
    SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from(text.to_string())))
}

fn chunk_json(text: &str) -> String {
    serde_json::to_string(&chunk(text)).unwrap()
}

impl Translator for ScriptTranslator {
    fn line(&mut self, line: &str) -> Vec<Output> {
        match line.split_once(':').unwrap_or((line, "")) {
            ("text", text) => vec![Output::Update(chunk(text))],
            ("tool", id) => vec![Output::Update(SessionUpdate::ToolCall(
                ToolCall::new(id.to_string(), "write").status(ToolCallStatus::Completed),
            ))],
            ("end", _) => vec![Output::End(TurnEnd::EndTurn)],
            ("abort", message) => vec![Output::Abort { message: message.to_string() }],
            _ => vec![Output::Unparsed { line: line.to_string() }],
        }
    }

    fn finish(&mut self, end: StreamEnd) -> Vec<Output> {
        vec![Output::Update(chunk(&format!("finished {end:?}")))]
    }
}

/// One act of the scripted engine.
enum Act {
    /// Says this line.
    Line(&'static str),
    /// Its stream ends.
    End,
    /// Writes a file, as a tool would.
    Write(PathBuf, &'static str),
    /// The user cancels.
    Cancel(CancellationToken),
    /// Notes in the log that the loop asked for what comes next.
    Mark(&'static str),
    /// Says this line every few milliseconds from now on, until it is stopped.
    Repeat(&'static str),
}

/// An engine that plays its script, then says nothing until it is stopped, and then ends.
struct ScriptedEngine {
    script: VecDeque<Act>,
    log: Log,
    stops: Arc<Mutex<Vec<Stop>>>,
    abandoned: Arc<Mutex<bool>>,
    limit: Option<String>,
    stopped: bool,
    config: Config,
}

#[async_trait::async_trait]
impl TurnEngine for ScriptedEngine {
    async fn next(&mut self) -> Step {
        loop {
            // Cancel-safe as the loop needs: a repeated line stays in the script while its pause runs.
            if let Some(Act::Repeat(text)) = self.script.front()
                && !self.stopped
            {
                let text = text.to_string();
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                return Step::Line { text, alive: true };
            }
            match self.script.pop_front() {
                Some(Act::Line(text)) => return Step::Line { text: text.to_string(), alive: true },
                Some(Act::End) => return Step::Ended(Ended::Done),
                Some(Act::Write(path, text)) => std::fs::write(path, text).unwrap(),
                Some(Act::Cancel(token)) => token.cancel(),
                Some(Act::Mark(mark)) => self.log.lock().unwrap().push(format!("mark {mark}")),
                Some(Act::Repeat(_)) => {}
                None if self.stopped => return Step::Ended(Ended::Done),
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn stop(&mut self, why: &Stop) {
        self.stops.lock().unwrap().push(why.clone());
        self.stopped = true;
    }

    fn limit_hit(&self) -> Option<String> {
        self.limit.clone()
    }

    async fn abandon(&mut self) {
        *self.abandoned.lock().unwrap() = true;
    }

    async fn conclude(self: Box<Self>, seen: Seen, name: &'static str) -> Attempt {
        let failure = |message| Error::CliFailed { message, stderr_tail: String::new(), exit_code: None };
        let (idle, turn_timeout) = (self.config.idle_timeout, self.config.turn_timeout);
        Attempt::Finished(
            stopped(&seen.stop, name, idle, turn_timeout, failure)
                .unwrap_or_else(|| seen.end.map(|end| ended(end, failure)).unwrap_or(Err(failure("no end".into())))),
        )
    }
}

/// A bridge without isolation on a fresh data dir, with one session in a fresh workspace.
struct World {
    _dirs: tempfile::TempDir,
    bridge: Bridge,
    workspace: PathBuf,
    id: String,
    log: Log,
    stops: Arc<Mutex<Vec<Stop>>>,
    abandoned: Arc<Mutex<bool>>,
}

impl World {
    async fn new(adjust: impl FnOnce(&mut Config)) -> Self {
        let dirs = tempfile::tempdir().unwrap();
        let workspace = dirs.path().join("ws");
        std::fs::create_dir_all(&workspace).unwrap();
        let mut config = Config::new(crate::agents::AgentKind::parse("opencode").unwrap(), dirs.path().join("data"));
        config.sandbox = crate::sandbox::SandboxChoice::None;
        adjust(&mut config);
        let bridge = Bridge::open(config).await.unwrap();
        bridge.set_client_capabilities(&serde_json::from_value(json!({"fs": {"writeTextFile": true}})).unwrap());
        let (id, _) = bridge.new_session(&workspace, &Default::default()).await.unwrap();
        let log = Log::default();
        Self { _dirs: dirs, bridge, workspace, id, log, stops: Default::default(), abandoned: Default::default() }
    }

    fn engine(&self, script: Vec<Act>, limit: Option<&str>) -> ScriptedEngine {
        ScriptedEngine {
            script: script.into(),
            log: self.log.clone(),
            stops: self.stops.clone(),
            abandoned: self.abandoned.clone(),
            limit: limit.map(String::from),
            stopped: false,
            config: self.bridge.config().clone(),
        }
    }

    /// Drives one attempt of a turn through `engine`; answers how it ended, once every update was sent.
    async fn drive(&self, engine: ScriptedEngine, cancel: CancellationToken, turn_id: Option<i64>) -> Attempt {
        let record = self.bridge.record(&self.id).await.unwrap();
        let sink: Arc<dyn UpdateSink> = Arc::new(RecordingSink { log: self.log.clone() });
        let store = self.bridge.store.clone();
        let turn_id = match turn_id {
            Some(id) => id,
            None => store.start_turn(&self.id, &json!([])).await.unwrap(),
        };
        let emit = Emitter::new(store, sink.clone(), &self.id, turn_id, 0.0, cancel.clone());
        let sandbox = self.bridge.session_sandbox(&record).await.unwrap();
        let turn = Turn {
            bridge: &self.bridge,
            record,
            agent: crate::agents::AgentKind::parse("opencode").unwrap(),
            credential: None,
            blocks: Vec::new(),
            sink,
            cancel,
            model: None,
        };
        let review = turn.review(sandbox.as_ref());
        if let Some(review) = &review {
            review.begin(&emit).await.unwrap();
        }
        let driven =
            turn.drive(Box::new(engine), Box::new(ScriptTranslator), &emit, sandbox.as_ref(), review.as_ref(), None);
        // A guard against a loop that never ends the turn, not a measure of how fast it does.
        let attempt = tokio::time::timeout(std::time::Duration::from_secs(60), driven)
            .await
            .expect("the turn never ended")
            .unwrap_or_else(|e| Attempt::Finished(Err(e)));
        let _ = emit.flush().await;
        attempt
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn stops(&self) -> Vec<Stop> {
        self.stops.lock().unwrap().clone()
    }
}

fn finished(attempt: Attempt) -> std::result::Result<StopReason, String> {
    match attempt {
        Attempt::Finished(result) => result.map_err(|e| e.to_string()),
        Attempt::ConversationMissing => Err("conversation missing".into()),
        Attempt::ConversationUnloadable(why) => Err(format!("conversation unloadable: {why}")),
        Attempt::Unavailable(why) => Err(format!("unavailable: {why}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_agent_says_is_sent_in_order_and_its_end_answers_the_turn() {
    let world = World::new(|_| {}).await;
    let script = vec![Act::Line("text:one"), Act::Line("text:two"), Act::Line("end"), Act::End];
    let attempt = world.drive(world.engine(script, None), CancellationToken::new(), None).await;
    assert_eq!(finished(attempt), Ok(StopReason::EndTurn));
    assert_eq!(world.log(), [chunk_json("one"), chunk_json("two"), chunk_json("finished Stopped")]);
    assert_eq!(world.stops(), []);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_the_engine_once_and_the_turn_is_answered_cancelled() {
    let world = World::new(|_| {}).await;
    let cancel = CancellationToken::new();
    let script = vec![Act::Line("text:one"), Act::Cancel(cancel.clone())];
    let attempt = world.drive(world.engine(script, None), cancel, None).await;
    assert_eq!(finished(attempt), Ok(StopReason::Cancelled));
    assert_eq!(world.stops(), [Stop::Cancelled]);
    assert_eq!(world.log(), [chunk_json("one"), chunk_json("finished Cancelled")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_says_nothing_is_stopped_as_stalled() {
    let world = World::new(|config| config.idle_timeout = std::time::Duration::from_millis(300)).await;
    let attempt = world.drive(world.engine(vec![Act::Line("text:one")], None), CancellationToken::new(), None).await;
    assert_eq!(
        finished(attempt),
        Err(Error::Stalled { agent: "OpenCode", seconds: 0 }.to_string()),
        "the idle timeout ends a silent turn"
    );
    assert_eq!(world.stops(), [Stop::Stalled]);
    assert_eq!(world.log(), [chunk_json("one"), chunk_json("finished Stopped")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_the_translator_says_stops_the_engine_with_its_words() {
    let world = World::new(|_| {}).await;
    let script = vec![Act::Line("text:one"), Act::Line("abort:OpenCode keeps re-prompting")];
    let attempt = world.drive(world.engine(script, None), CancellationToken::new(), None).await;
    assert_eq!(finished(attempt), Err("OpenCode keeps re-prompting".to_string()));
    assert_eq!(world.stops(), [Stop::Aborted("OpenCode keeps re-prompting".into())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandboxs_limit_stops_the_engine_and_fails_the_turn_naming_it() {
    let world = World::new(|_| {}).await;
    let limit = "the sandbox ran out of memory (limit 512 MiB)";
    let attempt = world.drive(world.engine(Vec::new(), Some(limit)), CancellationToken::new(), None).await;
    assert_eq!(finished(attempt), Err(format!("OpenCode was stopped: {limit}")));
    assert_eq!(world.stops(), [Stop::Limit(limit.into())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_the_store_cannot_keep_fails_the_turn_and_abandons_the_engine() {
    // Should the failure go unnoticed, the turn ends as stalled, not as the store's.
    let world = World::new(|config| config.idle_timeout = std::time::Duration::from_secs(5)).await;
    // A turn the store does not have: nothing of it can be kept, so nothing of it may be sent.
    let script = vec![Act::Repeat("text:lost")];
    let attempt = world.drive(world.engine(script, None), CancellationToken::new(), Some(987_654)).await;
    let Attempt::Finished(Err(Error::Store(_))) = attempt else { panic!("the turn must fail on its store") };
    assert!(*world.abandoned.lock().unwrap(), "the engine was not told to stop everything");
    assert_eq!(world.stops(), [], "the turn ended some other way first");
    assert_eq!(world.log(), Vec::<String>::new(), "an update the store did not keep reached the editor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_tools_changes_are_reviewed_before_the_agent_goes_on() {
    let world = World::new(|config| config.workspace = crate::sandbox::WorkspaceMode::Review).await;
    let record = world.bridge.record(&world.id).await.unwrap();
    let copy = world.bridge.session_sandbox(&record).await.unwrap().workspace().to_path_buf();
    assert_ne!(copy, world.workspace, "review mode works on a copy");
    let script = vec![
        Act::Write(copy.join("notes.txt"), "hello"),
        Act::Line("tool:call_1"),
        Act::Mark("the next line"),
        Act::Line("end"),
        Act::End,
    ];
    let attempt = world.drive(world.engine(script, None), CancellationToken::new(), None).await;
    assert_eq!(finished(attempt), Ok(StopReason::EndTurn));
    let log = world.log();
    let write = format!("write {} hello", world.workspace.join("notes.txt").display());
    let at = |entry: &str| log.iter().position(|seen| seen == entry).unwrap_or_else(|| panic!("{entry} in {log:?}"));
    assert!(at(&write) < at("mark the next line"), "the change was reviewed only after the agent went on: {log:?}");
    assert_eq!(log.iter().filter(|seen| **seen == write).count(), 1, "reviewed more than once: {log:?}");
}
