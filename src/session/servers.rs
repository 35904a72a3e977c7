//! The bridge's side of what an agent keeps running (its service: OpenCode's warm servers): which sessions it
//! serves, starting it ahead of the first prompt, the sandbox a workspace's sessions share, and telling the open
//! sessions of a changed model list.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::SessionUpdate;

use crate::agents::AgentKind;
use crate::config::Config;
use crate::locate::installed_executable;
use crate::store::{SessionRecord, Store};

use super::{Bridge, LiveSession, UpdateSink, catalog, options};

impl Bridge {
    /// Whether this session's prompts go to what the agent keeps running (OpenCode's warm server).
    pub(super) fn serves(&self, record: &SessionRecord) -> bool {
        self.agent_of(record) == self.config.agent && self.service.is_some()
    }

    /// Whether sandboxes get a network namespace of their own (a server's port is then private to its sandbox).
    pub(super) fn private_network(&self) -> bool {
        self.own_provider.private_network()
    }

    /// What the agent the bridge runs takes in a prompt and what its sessions can do, as it announced them, known
    /// before it starts ([`crate::agents::host::Service::capabilities`]); `None`: unknown.
    pub async fn agent_capabilities(
        &self,
    ) -> Option<(
        agent_client_protocol::v1::schema::PromptCapabilities,
        agent_client_protocol::v1::schema::SessionCapabilities,
    )> {
        let service = self.service.as_ref()?;
        // Not installed yet: the pinned one, which its first prompt installs (its folder's table says what it takes).
        let executable = installed_executable(&self.config, self.config.agent)
            .unwrap_or_else(|| self.config.agent.package().executable(&crate::paths::tools_dir(&self.config.data_dir)));
        service.capabilities(self, &executable).await
    }

    /// Starts the session's server (the agent's service) in the background, so that its first prompt finds it warm.
    /// Does nothing when the CLI is not installed yet (the first prompt installs it) or the server already runs.
    pub fn warm_server(self: &Arc<Self>, id: &str) {
        if self.service.as_ref().is_none_or(|service| service.serving(id))
            // A remote sandbox runs no warm server yet, and warming would resume a sandbox paused between turns.
            || !self.sessions_run_here()
        {
            return;
        }
        let Some(executable) = installed_executable(&self.config, self.config.agent) else { return };
        let bridge = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let result = async {
                let record = bridge.record(&id).await.map_err(|e| e.to_string())?;
                if !bridge.serves(&record) {
                    return Ok(());
                }
                // A version the cache knows decides at once; an unknown one is not waited for: the server starts
                // now and its health answer says its version (OpenCode's refuses a 2.x), while the probe started
                // with the bridge fills the cache for the turn, which does wait for it (it may fall back to `run`).
                let key = bridge.version_key(&executable).await;
                let executable = match bridge.known_version(&key).await {
                    Some(_) => {
                        bridge
                            .supported_executable(bridge.config.agent, &executable, &bridge.shutdown)
                            .await
                            .map_err(|e| e.to_string())?
                            .0
                    }
                    None => executable,
                };
                // A server started without the package OpenCode wants would install it from npm before it answers.
                bridge.install_companion(bridge.config.agent, &executable).await;
                let sandbox = bridge.session_sandbox(&record).await.map_err(|e| e.to_string())?;
                let Some(service) = &bridge.service else { return Ok(()) };
                service.warm(bridge.as_ref(), &record, sandbox, executable).await?;
                Ok::<(), String>(())
            };
            if let Err(e) = result.await {
                let agent = bridge.config.agent.display_name();
                tracing::info!(session = %id, "the {agent} server was not started ahead of the first prompt: {e}");
            }
        });
    }

    /// The sandbox a new session of `record` shares with the other new sessions of its workspace, where sessions
    /// share one (a local sandbox writing the workspace itself, OpenCode through its server, `--server-scope
    /// workspace`): named after the agent, the workspace, its other roots and everything of the bridge's settings
    /// that shapes a sandbox, so that a bridge started with another policy gets a sandbox of its own.
    pub(super) fn shared_sandbox_name(&self, record: &SessionRecord) -> Option<String> {
        let shares = self.serves(record)
            && self.config.server_scope == crate::config::ServerScope::Workspace
            && self.config.workspace == crate::sandbox::WorkspaceMode::Direct
            && self.provider.name() == "local"
            // Under `ask` a connection is asked about in its session's thread: a shared server's could be anyone's.
            && !self.config.network.asks();
        if !shares {
            return None;
        }
        let config = &self.config;
        let policy = format!(
            "{:?} {:?} {:?} {:?} {:?} {} {:?} {:?}",
            config.sandbox,
            std::mem::discriminant(&self.local.settings().isolation),
            config.profile,
            config.deny_read,
            config.allow_read,
            config.network,
            config.protect,
            config.limits
        );
        let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
        for part in [self.agent_of(record).as_str(), record.cwd.as_str(), policy.as_str()] {
            hash.update(part.as_bytes());
            hash.update(&[0]);
        }
        // The workspace's other roots are mounts of the sandbox: sessions with other roots get another one. Hashed
        // only when there are some, so that the sandbox of a workspace without them keeps its name.
        for root in &record.context.additional_directories {
            hash.update(b"root\0");
            hash.update(root.as_bytes());
            hash.update(&[0]);
        }
        let digest = hash.finish();
        Some(format!("{SHARED_SANDBOX}{}", digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect::<String>()))
    }

    /// Where updates that belong to no turn go (a changed model list); set by the server once the editor connected.
    pub fn set_notifier(&self, sink: Arc<dyn UpdateSink>) {
        *self.notifier.lock().unwrap_or_else(|p| p.into_inner()) = Some(sink);
    }

    /// What tells the open sessions about a changed model list, from a task of its own.
    pub(super) fn model_announcer(&self) -> ModelAnnouncer {
        ModelAnnouncer {
            catalog: self.catalog.clone(),
            store: self.store.clone(),
            config: self.config.clone(),
            notifier: self.notifier.clone(),
            live: self.live.clone(),
        }
    }

    /// Lets go of the session's warm server, in the background: it stops unless other sessions use it.
    pub(super) fn stop_server(&self, id: &str) {
        let Some(service) = self.service.clone() else { return };
        let id = id.to_string();
        tokio::spawn(async move { service.release(&id).await });
    }

    /// Lists the agent's models again in the background (when it lists them and is installed). An agent with a
    /// service (OpenCode's warm server) says them through it instead
    /// ([`crate::agents::host::BridgeHost::learn_models`]).
    /// When the list changed, each open session gets the new options.
    pub fn refresh_models(&self) {
        if self.config.agent.model_listing().is_none() || self.service.is_some() {
            return;
        }
        let Some(listing) = self.catalog.refresh() else { return };
        let announce = self.model_announcer();
        tokio::spawn(async move {
            if listing.await.unwrap_or(false) {
                announce.announce().await;
            }
        });
    }
}

/// How the state dirs of shared sandboxes begin (a session's own is named after the session: `sess_…`).
pub(super) const SHARED_SANDBOX: &str = "workspace-";

/// Whether a sandbox's name (its state dir's) is a shared one.
pub(super) fn is_shared_sandbox(name: &str) -> bool {
    name.starts_with(SHARED_SANDBOX)
}

/// Tells every open OpenCode session its options again (`config_option_update`) once the model list changed, so
/// that the editor's model picker shows what OpenCode listed.
pub(super) struct ModelAnnouncer {
    pub(super) catalog: Arc<catalog::ModelCatalog>,
    store: Arc<Store>,
    config: Config,
    notifier: Arc<Mutex<Option<Arc<dyn UpdateSink>>>>,
    live: Arc<Mutex<HashMap<String, Arc<LiveSession>>>>,
}

impl ModelAnnouncer {
    /// Sends the options to the sessions open now (some were made while OpenCode listed), through the editor's
    /// connection once it initialized.
    pub(super) async fn announce(&self) {
        let Some(notifier) = self.notifier.lock().unwrap_or_else(|p| p.into_inner()).clone() else { return };
        let mut open: Vec<String> = self.live.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        open.sort();
        let models = self.catalog.models();
        for id in open {
            if let Ok(Some(record)) = self.store.session(&id).await
                && AgentKind::parse(&record.agent) == Some(self.config.agent)
            {
                let options = options::config_options(self.config.agent, &record.config, &self.config, &models);
                notifier.send(
                    &id,
                    SessionUpdate::ConfigOptionUpdate(agent_client_protocol::v1::schema::ConfigOptionUpdate::new(
                        options,
                    )),
                );
            }
        }
    }
}
