//! The bridge's warm servers: which sessions are served by one, starting it ahead of the first prompt, the
//! sandbox a workspace's sessions share, the key a server is known by, and the model list a server says.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::SessionUpdate;

use crate::agents::AgentKind;
use crate::agents::opencode::permissions;
use crate::agents::options as agent_options;
use crate::config::Config;
use crate::locate::installed_executable;
use crate::store::{SessionRecord, Store};

use super::{Bridge, LiveSession, UpdateSink, catalog, options, serve};

impl Bridge {
    /// Whether this session's prompts go to a warm OpenCode server.
    pub(super) fn serves(&self, record: &SessionRecord) -> bool {
        self.agent_of(record) == self.config.agent && self.config.agent.serves(&self.config.agents)
    }

    /// Whether sandboxes get a network namespace of their own (a server's port is then private to its sandbox).
    pub(super) fn private_network(&self) -> bool {
        self.own_provider.private_network()
    }

    /// Starts the session's OpenCode server in the background, so that its first prompt finds it warm. Does
    /// nothing when the CLI is not installed yet (the first prompt installs it) or the server already runs.
    pub fn warm_server(self: &Arc<Self>, id: &str) {
        if !self.config.agent.serves(&self.config.agents)
            || self.warm.servers.of_session(id).is_some()
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
                // now and its health answer says its version (`serve::ready` refuses a 2.x), while the probe started
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
                let sandbox = bridge.session_sandbox(&record).await.map_err(|e| e.to_string())?;
                if agent_options::approvals(&record.config) == agent_options::APPROVALS_ASK
                    && !crate::agents::opencode::project::agent_written(sandbox.state_dir()).is_empty()
                {
                    return Err("the agent wrote plugins or tools into its own OpenCode configuration".into());
                }
                let model = crate::agents::opencode::options::model(&record.config).map(str::to_string);
                // Nobody is asked here, and the user may still choose `ask` before the first prompt: the workspace's
                // own configuration (plugins, MCP servers) loads only with a turn that allows it, which restarts
                // this server then.
                let has_config = !crate::agents::opencode::project::loaders(Path::new(&record.cwd)).is_empty();
                let profile = match bridge.server_profile(&record) {
                    Ok(profile) if !has_config || profile.approvals == agent_options::APPROVALS_ASK => profile,
                    _ => serve::Profile {
                        approvals: agent_options::approvals(&record.config).to_string(),
                        project_config: false,
                    },
                };
                let key = bridge.server_key(&id, sandbox.as_ref(), &profile.key());
                let warmed = bridge
                    .warm
                    .servers
                    .warm(&key, &id, || {
                        serve::start_server(
                            &bridge,
                            &id,
                            &key,
                            sandbox.clone(),
                            &executable,
                            None,
                            model.as_deref(),
                            &profile,
                        )
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                bridge.learn_models(warmed.client.clone());
                serve::delete_pending(sandbox.state_dir(), &warmed.client).await;
                // The conversation is made ahead too (OpenCode sets up its instance for the workspace then), so
                // the first prompt does not wait for that. Its rules are not: only its turn writes them
                // (`serve::turn::session_rules`).
                if record.native_id.is_none()
                    && let Err(e) =
                        serve::conversation(&bridge, &id, &warmed.client).await.map_err(|e| e.to_string())?
                {
                    tracing::debug!(session = %id, "could not make the conversation ahead: {e}");
                }
                Ok::<(), String>(())
            };
            if let Err(e) = result.await {
                tracing::info!(session = %id, "the OpenCode server was not started ahead of the first prompt: {e}");
            }
        });
    }

    /// What the session's server is started for, when that needs nobody's answer: under `auto` (the sandbox is the
    /// boundary) and for a workspace without OpenCode configuration of its own the workspace's configuration loads;
    /// under `ask` it loads once the user allowed what it is now. Else `Err` with what it is, to ask about.
    pub(super) fn server_profile(&self, record: &SessionRecord) -> std::result::Result<serve::Profile, Vec<String>> {
        let approvals = agent_options::approvals(&record.config).to_string();
        if approvals != agent_options::APPROVALS_ASK {
            return Ok(serve::Profile { approvals, project_config: true });
        }
        let items = crate::agents::opencode::project::loaders(Path::new(&record.cwd));
        if items.is_empty() {
            return Ok(serve::Profile { approvals, project_config: true });
        }
        match self.warm.project_consent.lock().unwrap_or_else(|p| p.into_inner()).get(&record.id) {
            Some((asked, allowed)) if *asked == items => Ok(serve::Profile { approvals, project_config: *allowed }),
            _ => Err(items),
        }
    }

    /// The rules the user's "always" answers of session `id` made.
    pub(super) fn always_allowed(&self, id: &str) -> Vec<permissions::Rule> {
        self.warm.always_rules.of(id)
    }

    /// Records the user's answer about the workspace's configuration `items`.
    pub(super) fn consent_to_project(&self, session: &str, items: Vec<String>, allowed: bool) {
        self.warm
            .project_consent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.to_string(), (items, allowed));
    }

    /// The sandbox a new session of `record` shares with the other new sessions of its workspace, where sessions
    /// share one (a local sandbox writing the workspace itself, OpenCode through its server, `--server-scope
    /// workspace`): named after the agent, the workspace and everything of the bridge's settings that shapes a
    /// sandbox, so that a bridge started with another policy gets a sandbox of its own.
    pub(super) fn shared_sandbox_name(&self, record: &SessionRecord) -> Option<String> {
        let shares = self.serves(record)
            && self.config.server_scope == crate::config::ServerScope::Workspace
            && self.config.workspace == crate::sandbox::WorkspaceMode::Direct
            && self.provider.name() == "local";
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
        let digest = hash.finish();
        Some(format!("{SHARED_SANDBOX}{}", digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect::<String>()))
    }

    /// The key of the server a turn of `session` uses in `sandbox` for `profile`: one per shared sandbox and
    /// profile, else the session's own.
    pub(super) fn server_key(&self, session: &str, sandbox: &dyn crate::sandbox::Sandbox, profile: &str) -> String {
        let shared = sandbox.state_dir().file_name().and_then(|n| n.to_str()).filter(|n| is_shared_sandbox(n));
        match shared {
            Some(shared) if self.config.server_scope == crate::config::ServerScope::Workspace => {
                format!("{shared} {profile}")
            }
            _ => session.to_string(),
        }
    }

    /// Where updates that belong to no turn go (a changed model list); set by the server once the editor connected.
    pub fn set_notifier(&self, sink: Arc<dyn UpdateSink>) {
        *self.notifier.lock().unwrap_or_else(|p| p.into_inner()) = Some(sink);
    }

    /// Takes the model list from the first warm server (instead of a separate `opencode models` run competing with
    /// the first prompt); when it differs from what sessions were offered, each open session gets the new options.
    pub(super) fn learn_models(&self, client: serve::client::Client) {
        if self.warm.models_from_server.swap(true, Ordering::SeqCst) {
            return;
        }
        let announce = self.model_announcer();
        tokio::spawn(async move {
            let answer = match client.call(hyper::Method::GET, "/config/providers", None).await {
                Ok(answer) => answer,
                Err(e) => return tracing::warn!("could not ask the OpenCode server for its models: {e}"),
            };
            let models = crate::agents::opencode::catalog::parse_providers(&answer);
            tracing::info!(count = models.len(), "OpenCode models from the server");
            if announce.catalog.set(models) {
                announce.announce().await;
            }
        });
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
        let servers = self.warm.servers.clone();
        let id = id.to_string();
        tokio::spawn(async move { servers.release(&id).await });
    }

    /// Lists OpenCode's models again in the background (when this bridge runs OpenCode and it is installed). With
    /// the server backend the first warm server says them instead.
    /// When the list changed, each open session gets the new options, as with [`Bridge::learn_models`].
    pub fn refresh_models(&self) {
        if self.config.agent != crate::agents::opencode::AGENT || self.config.agent.serves(&self.config.agents) {
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
    catalog: Arc<catalog::ModelCatalog>,
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
