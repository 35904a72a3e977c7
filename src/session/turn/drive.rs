//! The one turn loop: whatever drives the agent (a CLI process per prompt, a warm server), its lines go through
//! the agent's translator here, and cancel, the turn's deadline, silence, the sandbox's limits, the review steps,
//! what is stored and sent, and how the turn ends are decided here, once.
//!
//! An engine ([`TurnEngine`]) is only the agent's side of one attempt: it yields what the agent says, starts
//! stopping the agent when told why, and says at the end what the agent's own exit means.

use std::collections::VecDeque;

use agent_client_protocol::v1::schema::{SessionUpdate, ToolCallStatus};

use super::Turn;
use crate::agents::engine::{Attempt, Ended, Seen, Step, Stop, TurnEngine};
use crate::agents::{Output, StreamEnd, Translator, TurnEnd};
use crate::error::Result;
use crate::sandbox::Sandbox;
use crate::session::emitter::Emitter;
use crate::session::note;
use crate::session::review::Review;

/// How many characters of a line the translator could not read are kept and logged.
const UNPARSED_EXCERPT: usize = 2000;

/// How often the sandbox's limits are looked at.
const LIMIT_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl Turn<'_> {
    /// Drives one attempt of the turn through `engine` to its end: every line through `translator`, every update
    /// stored then sent, review steps after each finished tool and at the end, the turn's bounds, the outcome.
    pub(in crate::session) async fn drive(
        &self,
        mut engine: Box<dyn TurnEngine>,
        mut translator: Box<dyn Translator>,
        emit: &Emitter,
        sandbox: &dyn Sandbox,
        review: Option<&Review<'_>>,
        native_id: Option<&str>,
    ) -> Result<Attempt> {
        let idle = self.bridge.config().idle_timeout;
        let deadline = tokio::time::Instant::now() + self.bridge.config().turn_timeout;
        let mut limits = tokio::time::interval(LIMIT_CHECK);
        let mut last_output = tokio::time::Instant::now();
        let mut state = StreamState { native_id: native_id.map(str::to_string), ..StreamState::default() };
        let mut stop: Option<Stop> = None;
        let failed = 'stream: loop {
            let step = tokio::select! {
                biased;
                _ = self.cancel.cancelled(), if stop != Some(Stop::Cancelled) => {
                    // A stop already under way (a timeout, an abort) is overtaken: the user asked to cancel.
                    stop = Some(Stop::Cancelled);
                    engine.stop(&Stop::Cancelled);
                    continue;
                }
                _ = tokio::time::sleep_until(deadline), if stop.is_none() => {
                    stop = Some(Stop::TimedOut);
                    engine.stop(&Stop::TimedOut);
                    continue;
                }
                _ = limits.tick() => {
                    if stop.is_none()
                        && let Some(hit) = engine.limit_hit()
                    {
                        let why = Stop::Limit(hit);
                        engine.stop(&why);
                        stop = Some(why);
                    }
                    continue;
                }
                // The other branches wake the loop often: silence is measured from the last output.
                _ = tokio::time::sleep_until(last_output + idle), if stop.is_none() => {
                    stop = Some(Stop::Stalled);
                    engine.stop(&Stop::Stalled);
                    continue;
                }
                step = engine.next() => step,
            };
            let mut next = Some(step);
            while let Some(step) = next.take() {
                let (mut tool_ended, mut over) = (false, false);
                match step {
                    Step::Ended(Ended::Done) => break 'stream None,
                    Step::Ended(Ended::Failed(error)) => break 'stream Some(error),
                    Step::Note(text) => {
                        last_output = tokio::time::Instant::now();
                        if let Err(error) = emit.send(note(&text)).await {
                            break 'stream Some(error);
                        }
                    }
                    Step::Output(output) => {
                        let said = self.handle(output, &mut engine, emit, &mut state, &mut stop).await;
                        match said {
                            Ok(said) => tool_ended |= said.tool_ended,
                            Err(error) => break 'stream Some(error),
                        }
                    }
                    Step::Line { text, alive } => {
                        if alive {
                            last_output = tokio::time::Instant::now();
                        }
                        if text.trim().is_empty() {
                            continue;
                        }
                        for output in translator.line(&text) {
                            let said = self.handle(output, &mut engine, emit, &mut state, &mut stop).await;
                            match said {
                                Ok(said) => {
                                    tool_ended |= said.tool_ended;
                                    if said.alive {
                                        last_output = tokio::time::Instant::now();
                                    }
                                    over |= said.idle && engine.idle(stop.is_some());
                                }
                                Err(error) => break 'stream Some(error),
                            }
                        }
                    }
                }
                // What a finished tool changed is reviewed at once; once the agent is being stopped, the end of the
                // turn reviews what is left.
                if tool_ended
                    && stop.is_none()
                    && let Err(error) = self.step_after_tool(sandbox, review, emit).await
                {
                    break 'stream Some(error);
                }
                if over {
                    break 'stream None;
                }
                // A cancel still stops a fast stream between two lines.
                if !self.cancel.is_cancelled() {
                    next = engine.ready();
                }
            }
        };
        // What the agent says next could not be kept (the store cannot write): it is stopped, and the turn fails.
        if let Some(error) = failed {
            engine.abandon().await;
            return Err(error);
        }
        engine.close();
        let stream_end = if stop == Some(Stop::Cancelled) { StreamEnd::Cancelled } else { StreamEnd::Stopped };
        for output in translator.finish(stream_end) {
            self.handle(output, &mut engine, emit, &mut state, &mut stop).await?;
        }
        // What the agent changed last (or before it was stopped) is reviewed with the turn. A cancelled turn in a
        // remote sandbox is answered first: its listing and pull (seconds there) are the next turn's `begin`,
        // which runs before that turn's CLI (the session's gate orders turns).
        let remote_cancel = stop == Some(Stop::Cancelled) && sandbox.remote_files().is_some();
        if let Some(review) = review
            && !remote_cancel
        {
            review.step(emit).await?;
        }
        crate::session::protected::sweep(sandbox, emit).await?;
        let seen = Seen { end: state.end.take(), stop, updates: state.updates, unparsed: state.unparsed };
        Ok(engine.conclude(seen, self.agent.display_name()).await)
    }

    /// After a finished tool: what it changed goes to review, and what it wrote into protected paths is moved out.
    async fn step_after_tool(&self, sandbox: &dyn Sandbox, review: Option<&Review<'_>>, emit: &Emitter) -> Result<()> {
        if let Some(review) = review {
            review.step(emit).await?;
        }
        crate::session::protected::sweep(sandbox, emit).await
    }

    /// Acts on one output of the translator.
    async fn handle(
        &self,
        output: Output,
        engine: &mut Box<dyn TurnEngine>,
        emit: &Emitter,
        state: &mut StreamState,
        stop: &mut Option<Stop>,
    ) -> Result<Said> {
        let mut said = Said { tool_ended: ends_a_tool(&output), ..Said::default() };
        match output {
            Output::Update(update) => {
                state.updates = true;
                said.alive = true;
                // An agent that names the session itself (Codex): the session list says its name too.
                if let SessionUpdate::SessionInfoUpdate(info) = &update
                    && let agent_client_protocol::schema::MaybeUndefined::Value(title) = &info.title
                    && !title.trim().is_empty()
                {
                    let (store, session, title) = (self.bridge.store.clone(), self.record.id.clone(), title.clone());
                    emit.write(async move { store.set_title(&session, &title).await }).await?;
                }
                emit.send(update).await?;
            }
            Output::NativeSessionId { id } => {
                if state.native_id.as_deref() != Some(id.as_str()) {
                    tracing::info!(session = %self.record.id, native = %id, "the CLI conversation id");
                    // Kept even when a cancelled turn stops waiting for the store: the next prompt continues it.
                    let (store, session, native) = (self.bridge.store.clone(), self.record.id.clone(), id.clone());
                    emit.write(async move { store.set_native_id(&session, Some(&native)).await }).await?;
                    state.native_id = Some(id);
                }
            }
            Output::End(end) => state.end = Some(end),
            Output::Abort { message } => {
                tracing::warn!(session = %self.record.id, "stopping the agent: {message}");
                if stop.is_none() {
                    let why = Stop::Aborted(message);
                    engine.stop(&why);
                    *stop = Some(why);
                }
            }
            Output::Permission(ask) => {
                said.alive = true;
                engine.permission(ask);
            }
            Output::Question(ask) => {
                said.alive = true;
                engine.question(ask);
            }
            Output::Idle => said.idle = true,
            Output::Unparsed { mut line } => {
                // Kept for the error message and logged: an excerpt of a line that may be megabytes long.
                if let Some((at, _)) = line.char_indices().nth(UNPARSED_EXCERPT) {
                    line.truncate(at);
                    line.push('…');
                }
                tracing::debug!(session = %self.record.id, "unparsed line of the agent: {line}");
                if state.unparsed.len() == 10 {
                    state.unparsed.pop_front();
                }
                state.unparsed.push_back(line);
            }
        }
        Ok(said)
    }
}

/// What one output meant for the loop.
#[derive(Default)]
struct Said {
    /// A tool finished: what it changed is reviewed now.
    tool_ended: bool,
    /// The agent said something that keeps the turn alive.
    alive: bool,
    /// The agent says its turn is over.
    idle: bool,
}

#[derive(Default)]
struct StreamState {
    native_id: Option<String>,
    end: Option<TurnEnd>,
    updates: bool,
    unparsed: VecDeque<String>,
}

/// Whether an output says a tool finished: what it changed is reviewed then.
pub(in crate::session) fn ends_a_tool(output: &Output) -> bool {
    let done =
        |status: Option<ToolCallStatus>| matches!(status, Some(ToolCallStatus::Completed | ToolCallStatus::Failed));
    match output {
        Output::Update(SessionUpdate::ToolCall(call)) => done(Some(call.status)),
        Output::Update(SessionUpdate::ToolCallUpdate(update)) => done(update.fields.status),
        _ => false,
    }
}
