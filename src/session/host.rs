//! The bridge as an agent's service sees it ([`BridgeHost`]): the store, the session's gate, how its CLI is run,
//! the shared sandboxes, the model list. One turn's side is `turn/host.rs`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::Bridge;
use super::cli::cli_environment;
use super::servers::is_shared_sandbox;
use crate::agents::ModelInfo;
use crate::agents::host::BridgeHost;
use crate::config::ServerScope;
use crate::sandbox::{ExecSpec, Sandbox};
use crate::store::Store;

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

    fn client_fills_forms(&self) -> bool {
        self.client_abilities().elicitation_form
    }

    fn mcp_servers(&self, session: &str) -> Vec<agent_client_protocol::v1::schema::McpServer> {
        Bridge::mcp_servers(self, session)
    }

    fn credential(&self) -> Option<(&'static str, String)> {
        crate::auth::credential(&self.config, self.config.agent).ok().flatten()
    }

    fn notifier(&self) -> Option<Arc<dyn crate::agents::host::UpdateSink>> {
        self.notifier.lock().unwrap_or_else(|p| p.into_inner()).clone()
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
