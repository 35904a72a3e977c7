//! The agent's side of one attempt of a turn, as the bridge's one turn loop (`session::turn`) drives it: what an
//! engine yields, why the loop stops it, and what is left once it concluded. An agent that runs a CLI per prompt
//! uses the bridge's process engine; one that keeps something running (OpenCode's warm server) brings its own.

use std::collections::VecDeque;

use agent_client_protocol::v1::schema::StopReason;

use super::{Output, PermissionAsk, TurnEnd};
use crate::error::{Error, Result};

/// Why the loop stops the agent before it finished by itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The user cancelled the turn.
    Cancelled,
    /// The agent said nothing for the idle timeout.
    Stalled,
    /// The turn ran past its deadline.
    TimedOut,
    /// The sandbox hit its process or memory limit (a fork bomb, a runaway build), in words.
    Limit(String),
    /// The translator says the agent is stuck, in words for the user.
    Aborted(String),
}

/// One thing an engine has for the loop.
// Nearly every step is a line; boxing the rare output would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Step {
    /// A line of the agent's stream, for the translator. `alive`: it counts as the agent saying something (a shared
    /// server's stream also carries other sessions' events, which do not keep this turn alive).
    Line {
        /// The line, without its ending.
        text: String,
        /// Whether it resets the idle timer by itself.
        alive: bool,
    },
    /// Something the engine learned beside the stream (e.g. a command call that failed).
    Output(Output),
    /// A note for the user in the thread.
    Note(String),
    /// The agent's side of the attempt is over: how.
    Ended(Ended),
}

/// How an engine's stream ended.
pub enum Ended {
    /// The agent's stream is over (a CLI closed its stdout and exited, a server said the session is idle): the
    /// engine says what that means in [`TurnEngine::conclude`].
    Done,
    /// The engine failed (the CLI could not be waited for, a server died): the turn fails with this.
    Failed(Error),
}

/// What is left of an attempt once the engine concluded.
pub enum Attempt {
    /// The turn is over.
    Finished(Result<StopReason>),
    /// The agent says the conversation we continue no longer exists: start a fresh one.
    ConversationMissing,
    /// The agent could not continue the conversation, for another reason (its words): start a fresh one, and say
    /// that reason rather than that the conversation is gone.
    ConversationUnloadable(String),
    /// This engine cannot run here (no server could be had): the turn may run another. Why, in words.
    Unavailable(String),
}

/// What the loop knows of the stream when the engine concludes.
pub struct Seen {
    /// The last end the agent said.
    pub end: Option<TurnEnd>,
    /// Why the loop stopped the agent, if it did.
    pub stop: Option<Stop>,
    /// Whether any update came.
    pub updates: bool,
    /// The last lines the translator could not read, for an error message.
    pub unparsed: VecDeque<String>,
}

/// The agent's side of one attempt of a turn. Every method that waits is cancel-safe: the loop races it against
/// its timers.
#[async_trait::async_trait]
pub trait TurnEngine: Send {
    /// The next thing the agent says, or how its stream ended. Called again after `Ended` is not allowed.
    async fn next(&mut self) -> Step;

    /// A line that is there without waiting (what the last read brought with it), so that a fast stream is handled a
    /// buffer at a time, without a round of the loop's timers per line.
    fn ready(&mut self) -> Option<Step> {
        None
    }

    /// Starts stopping the agent for this cause; [`TurnEngine::next`] goes on yielding what it still says, then
    /// its end.
    fn stop(&mut self, why: &Stop);

    /// Whether the sandbox ran into its process or memory limit, in words.
    fn limit_hit(&self) -> Option<String>;

    /// The agent asks before it runs a tool.
    fn permission(&mut self, _ask: PermissionAsk) {}

    /// The agent asks the user questions. Only an engine whose translator says [`Output::Question`] gets any.
    fn question(&mut self, _ask: crate::agents::question::QuestionAsk) {}

    /// The agent says its turn is over (a server: the session went idle). `true`: the stream ends now; `false`: the
    /// engine still collects what belongs to the turn before it ends.
    fn idle(&mut self, _stopping: bool) -> bool {
        true
    }

    /// The turn cannot go on (what the agent says cannot be kept): stop everything of the attempt at once.
    async fn abandon(&mut self);

    /// The stream is over: ends what the engine still runs beside it (e.g. a command call).
    fn close(&mut self) {}

    /// How the attempt ended, from what the agent did (its exit, its server's death) and what the stream said.
    async fn conclude(self: Box<Self>, seen: Seen, name: &'static str) -> Attempt;
}

/// What the loop's own stops answer, whatever drove the agent: `None` when the agent was not stopped.
pub fn stopped(
    stop: &Option<Stop>,
    name: &'static str,
    idle: std::time::Duration,
    turn_timeout: std::time::Duration,
    failure: impl Fn(String) -> Error,
) -> Option<Result<StopReason>> {
    Some(match stop.as_ref()? {
        Stop::Cancelled => Ok(StopReason::Cancelled),
        Stop::Stalled => Err(Error::Stalled { agent: name, seconds: idle.as_secs() }),
        Stop::TimedOut => Err(Error::TurnTimeout { agent: name, minutes: turn_timeout.as_secs().div_ceil(60) }),
        Stop::Limit(hit) => Err(failure(format!("{name} was stopped: {hit}"))),
        Stop::Aborted(message) => Err(failure(message.clone())),
    })
}

/// The stop reason an end the agent said means, or the error it says.
pub fn ended(end: TurnEnd, failure: impl Fn(String) -> Error) -> Result<StopReason> {
    match end {
        TurnEnd::EndTurn => Ok(StopReason::EndTurn),
        TurnEnd::MaxTokens => Ok(StopReason::MaxTokens),
        TurnEnd::MaxTurnRequests => Ok(StopReason::MaxTurnRequests),
        TurnEnd::Refusal => Ok(StopReason::Refusal),
        TurnEnd::Cancelled => Ok(StopReason::Cancelled),
        TurnEnd::AuthRequired { message } => Err(Error::AuthRejected(message)),
        TurnEnd::Error { message } => Err(failure(message)),
    }
}

/// Sleeps until `deadline`, or forever without one.
pub async fn sleep_until_or_never(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
