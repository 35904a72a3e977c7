//! One attempt of a turn as an agent's service sees it ([`TurnHost`]): the session, the turn's notes and asks,
//! its cancel and bounds, the review, and the one loop.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Turn;
use crate::agents::engine::{Attempt, TurnEngine};
use crate::agents::host::{BridgeHost, TurnHost, unless_cancelled};
use crate::agents::{TranslateContext, Translator};
use crate::error::Result;
use crate::sandbox::Sandbox;
use crate::session::emitter::Emitter;
use crate::session::review::Review;
use crate::session::{UpdateSink, note};
use crate::store::SessionRecord;

/// One attempt of a turn, as the agent's service sees it.
pub(in crate::session) struct AttemptHost<'a> {
    pub turn: &'a Turn<'a>,
    pub emit: &'a Emitter,
    pub sandbox: &'a dyn Sandbox,
    /// Made once for the attempt: begun before the prompt, stepped by the loop.
    pub review: Option<Review<'a>>,
}

#[async_trait::async_trait]
impl TurnHost for AttemptHost<'_> {
    fn bridge(&self) -> &dyn BridgeHost {
        self.turn.bridge
    }

    fn record(&self) -> &SessionRecord {
        &self.turn.record
    }

    fn turn_id(&self) -> i64 {
        self.emit.turn_id
    }

    fn prompt_blocks(&self) -> &[agent_client_protocol::v1::schema::ContentBlock] {
        &self.turn.blocks
    }

    fn credential(&self) -> Option<&(&'static str, String)> {
        self.turn.credential.as_ref()
    }

    fn model(&self) -> Option<&str> {
        self.turn.model.as_ref().map(|model| model.id.as_str())
    }

    fn sink(&self) -> Arc<dyn UpdateSink> {
        self.turn.sink.clone()
    }

    fn cancel(&self) -> &CancellationToken {
        &self.turn.cancel
    }

    fn timeouts(&self) -> (Duration, Duration) {
        let config = self.turn.bridge.config();
        (config.idle_timeout, config.turn_timeout)
    }

    async fn note(&self, text: &str) -> Result<()> {
        self.emit.send(note(text)).await
    }

    async fn begin_review(&self) -> Result<bool> {
        match &self.review {
            Some(review) => Ok(unless_cancelled(&self.turn.cancel, review.begin(self.emit)).await?.is_some()),
            None => Ok(true),
        }
    }

    fn translate_context(&self) -> TranslateContext {
        self.turn.translate_context(self.sandbox, self.emit)
    }

    async fn drive(&self, engine: Box<dyn TurnEngine>, translator: Box<dyn Translator>) -> Result<Attempt> {
        self.turn.drive(engine, translator, self.emit, self.sandbox, self.review.as_ref(), None).await
    }
}
