//! OpenCode's warm servers as the bridge's [`Service`]: what the bridge keeps of them (the pool, the sessions told
//! of a fallback, the answers about a workspace's configuration and the "always" answers), starting a session's
//! server ahead of its first prompt, and what a session's server is started for.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::client::Client;
use super::{Profile, Server, Servers};
use crate::agents::engine::Attempt;
use crate::agents::host::{BridgeHost, Release, RenderedPrompt, Service, ServiceSettings, TurnHost};
use crate::agents::opencode::permissions::AlwaysAllowed;
use crate::agents::opencode::{catalog, project};
use crate::agents::options;
use crate::error::Result;
use crate::sandbox::Sandbox;
use crate::store::SessionRecord;

/// What the bridge keeps of OpenCode's servers.
pub struct Warm {
    /// The servers, one per key.
    pub servers: Arc<Servers>,
    /// Sessions told in this process that their server could not start.
    fallback_told: Mutex<HashSet<String>>,
    /// Per session under `ask`: the workspace's OpenCode configuration the user was asked about, and the answer.
    project_consent: Mutex<HashMap<String, (Vec<String>, bool)>>,
    /// What the user allowed "always" in each session (its own rules carry it, never the server's instance).
    pub always_rules: Arc<AlwaysAllowed>,
    /// A server already reported its models in this process.
    models_from_server: AtomicBool,
}

impl Warm {
    /// Nothing known yet, nothing running.
    pub fn new(settings: &ServiceSettings) -> Self {
        Self {
            servers: Servers::new(settings.idle_timeout, settings.max_running, settings.data_dir.clone()),
            fallback_told: Mutex::default(),
            project_consent: Mutex::default(),
            always_rules: Arc::default(),
            models_from_server: AtomicBool::new(false),
        }
    }

    /// What the session's server is started for, when that needs nobody's answer: under `auto` (the sandbox is the
    /// boundary) and for a workspace without OpenCode configuration of its own the workspace's configuration loads;
    /// under `ask` it loads once the user allowed what it is now. Else `Err` with what it is, to ask about.
    pub(super) fn profile_known(&self, record: &SessionRecord) -> std::result::Result<Profile, Vec<String>> {
        let approvals = options::approvals(&record.config).to_string();
        if approvals != options::APPROVALS_ASK {
            return Ok(Profile::new(approvals, true));
        }
        let items = project::loaders(Path::new(&record.cwd));
        if items.is_empty() {
            return Ok(Profile::new(approvals, true));
        }
        match self.project_consent.lock().unwrap_or_else(|p| p.into_inner()).get(&record.id) {
            Some((asked, allowed)) if *asked == items => Ok(Profile::new(approvals, *allowed)),
            _ => Err(items),
        }
    }

    /// Records the user's answer about the workspace's configuration `items`.
    pub(super) fn consent_to_project(&self, session: &str, items: Vec<String>, allowed: bool) {
        self.project_consent.lock().unwrap_or_else(|p| p.into_inner()).insert(session.to_string(), (items, allowed));
    }

    /// Takes the model list from the first warm server (instead of a separate `opencode models` run competing with
    /// the first prompt).
    pub(super) fn learn_models(&self, bridge: &dyn BridgeHost, client: Client) {
        if self.models_from_server.swap(true, Ordering::SeqCst) {
            return;
        }
        bridge.learn_models(Box::pin(async move {
            match client.call(hyper::Method::GET, "/config/providers", None).await {
                Ok(answer) => {
                    let models = catalog::parse_providers(&answer);
                    tracing::info!(count = models.len(), "OpenCode models from the server");
                    Some(models)
                }
                Err(e) => {
                    tracing::warn!("could not ask the OpenCode server for its models: {e}");
                    None
                }
            }
        }));
    }
}

/// The key of the server a turn of `session` uses in `sandbox` for `profile`: one per shared sandbox and profile,
/// else the session's own.
pub(super) fn server_key(bridge: &dyn BridgeHost, session: &str, sandbox: &dyn Sandbox, profile: &str) -> String {
    match bridge.shared_sandbox(sandbox) {
        Some(shared) => format!("{shared} {profile}"),
        None => session.to_string(),
    }
}

#[async_trait::async_trait]
impl Service for Warm {
    fn forks_in_place(&self) -> bool {
        // A fork in the workspace's shared sandbox is forked by the server (`fork` of the original's session).
        true
    }

    async fn attempt(
        &self,
        host: &dyn TurnHost,
        sandbox: &Arc<dyn Sandbox>,
        executable: &Path,
        native_id: Option<&str>,
        command: Option<&str>,
        prompt: &RenderedPrompt,
    ) -> Result<Attempt> {
        Warm::attempt(self, host, sandbox, executable, native_id, command, prompt).await
    }

    async fn warm(
        &self,
        host: &dyn BridgeHost,
        record: &SessionRecord,
        sandbox: Arc<dyn Sandbox>,
        executable: PathBuf,
    ) -> std::result::Result<(), String> {
        let id = record.id.as_str();
        if options::approvals(&record.config) == options::APPROVALS_ASK
            && !project::agent_written(sandbox.state_dir()).is_empty()
        {
            return Err("the agent wrote plugins or tools into its own OpenCode configuration".into());
        }
        let model = crate::agents::opencode::options::model(&record.config).map(str::to_string);
        // Nobody is asked here, and the user may still choose `ask` before the first prompt: the workspace's own
        // configuration (plugins, MCP servers) loads only with a turn that allows it, which restarts this server
        // then.
        let has_config = !project::loaders(Path::new(&record.cwd)).is_empty();
        let profile = match self.profile_known(record) {
            Ok(profile) if !has_config || profile.approvals == options::APPROVALS_ASK => profile,
            _ => Profile::new(options::approvals(&record.config).to_string(), false),
        }
        .with_mcp_servers(host.mcp_servers(id))
        .with_roots(record.context.additional_directories.clone());
        let key = server_key(host, id, sandbox.as_ref(), &profile.key());
        let warmed = self
            .servers
            .warm(&key, id, || {
                super::turn::start_server(
                    host,
                    id,
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
        self.learn_models(host, warmed.client.clone());
        super::delete_pending(sandbox.state_dir(), &warmed.client).await;
        // The conversation is made ahead too (OpenCode sets up its instance for the workspace then), so the first
        // prompt does not wait for that. Its rules are not: only its turn writes them (`turn::session_rules`).
        if record.native_id.is_none()
            && let Err(e) = super::turn::conversation(host, id, &warmed.client).await.map_err(|e| e.to_string())?
        {
            tracing::debug!(session = %id, "could not make the conversation ahead: {e}");
        }
        Ok(())
    }

    fn serving(&self, session: &str) -> bool {
        self.servers.of_session(session).is_some()
    }

    fn held(&self, session: &str) -> Box<dyn Release> {
        Box::new(Released(self.servers.of_session(session)))
    }

    async fn release(&self, session: &str) {
        self.servers.release(session).await;
    }

    async fn close(&self, keep: bool) {
        if keep { self.servers.leave_all().await } else { self.servers.stop_all().await }
    }

    fn fall_back(&self, session: &str) -> bool {
        self.fallback_told.lock().unwrap_or_else(|p| p.into_inner()).insert(session.to_string())
    }

    fn fell_back(&self, session: &str) -> bool {
        self.fallback_told.lock().unwrap_or_else(|p| p.into_inner()).contains(session)
    }

    fn fallen_back(&self, why: &str) -> String {
        format!(
            "OpenCode's server could not start here, so this session runs `opencode run` per prompt (no live output): \
             {why}"
        )
    }

    fn cannot_ask_without_it(&self, why: &str) -> String {
        format!(
            "OpenCode's server could not start, and `opencode run` cannot ask before a tool runs, so this prompt was \
             not run (Approvals: Ask): {why}"
        )
    }
}

/// The server a released session used, if one ran.
struct Released(Option<Arc<Server>>);

#[async_trait::async_trait]
impl Release for Released {
    /// Deletes the conversation from the shared server the session used, when that still runs (else its sandbox's
    /// next server deletes it: until then it stays in the shared database, unlisted, as nothing of ours names it).
    async fn forget(self: Box<Self>, record: &SessionRecord) {
        let Some(native) = &record.native_id else { return };
        let Some(server) = self.0.filter(|server| server.alive()) else {
            if let Some(state_dir) = &record.sandbox_id
                && let Err(e) = super::defer_delete(Path::new(state_dir), native)
            {
                tracing::warn!(session = %record.id, native, "could not note the conversation for deletion: {e}");
            }
            return;
        };
        let path = format!("/session/{native}");
        match server.client.call_within(std::time::Duration::from_secs(5), hyper::Method::DELETE, &path, None).await {
            Ok(_) => tracing::info!(session = %record.id, native, "deleted the conversation on the shared server"),
            Err(e) => tracing::warn!(session = %record.id, native, "could not delete the conversation: {e}"),
        }
    }
}
