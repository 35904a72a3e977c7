//! The bridge as an agent's service sees it ([`BridgeHost`], [`TurnHost`]): the store, the session's gate, how
//! its CLI is run, the shared sandboxes, the model list, and one turn's notes, asks, review and loop.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::review::Review;
use super::servers::is_shared_sandbox;
use super::turn::{Emitter, Turn, cli_environment};
use super::{Bridge, UpdateSink, note};
use crate::agents::engine::{Attempt, TurnEngine};
use crate::agents::host::{BridgeHost, TurnHost, unless_cancelled};
use crate::agents::{ModelInfo, TranslateContext, Translator};
use crate::config::ServerScope;
use crate::error::Result;
use crate::sandbox::{ExecSpec, Sandbox};
use crate::store::{SessionRecord, Store};

impl BridgeHost for Bridge {
    fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn gate(&self, session: &str) -> Arc<tokio::sync::Mutex<()>> {
        Bridge::gate(self, session)
    }

    fn cli_environment(
        &self,
        sandbox: &dyn Sandbox,
        credential: Option<&(&'static str, String)>,
        model: Option<&str>,
    ) -> Vec<(String, String)> {
        let agent = self.config.agent;
        cli_environment(agent, sandbox.state_dir(), credential, &self.env_names(agent, model))
    }

    fn cli_spec(
        &self,
        executable: &Path,
        sandbox: &dyn Sandbox,
        env: Vec<(String, String)>,
        args: Vec<String>,
    ) -> ExecSpec {
        super::cli_spec(&self.config, self.config.agent, executable, sandbox, env, args)
    }

    fn private_network(&self) -> bool {
        Bridge::private_network(self)
    }

    fn keep_warm(&self) -> Option<Duration> {
        self.config.keep_warm
    }

    fn shared_sandbox(&self, sandbox: &dyn Sandbox) -> Option<String> {
        let name = sandbox.state_dir().file_name()?.to_str()?;
        (is_shared_sandbox(name) && self.config.server_scope == ServerScope::Workspace).then(|| name.to_string())
    }

    fn learn_models(&self, listing: BoxFuture<'static, Option<Vec<ModelInfo>>>) {
        let announce = self.model_announcer();
        tokio::spawn(async move {
            if let Some(models) = listing.await
                && announce.catalog.set(models)
            {
                announce.announce().await;
            }
        });
    }
}

/// One attempt of a turn, as the agent's service sees it.
pub(super) struct AttemptHost<'a> {
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
