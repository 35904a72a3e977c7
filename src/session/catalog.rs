//! The models the bridge's agent can use, kept fresh in the background: its CLI's listing (OpenCode's `opencode
//! models --verbose`), run in a small sandbox of the bridge's own with the user's configuration, and cached in the
//! data dir for the next start.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::agents::ModelInfo;
use crate::config::Config;
use crate::sandbox::SandboxProvider;

/// The sandbox the listing runs in: not a session's, so no session's CLI state is touched.
const CATALOG_SANDBOX: &str = "_models";

/// The listed models and how to list them again.
pub struct ModelCatalog {
    config: Config,
    provider: Arc<dyn SandboxProvider>,
    listed: RwLock<Vec<ModelInfo>>,
    refreshing: AtomicBool,
}

impl ModelCatalog {
    /// A catalog holding what the last bridge listed, if anything.
    pub fn new(config: Config, provider: Arc<dyn SandboxProvider>) -> Self {
        let cached = cache_path(&config)
            .and_then(|path| std::fs::read_to_string(path).ok())
            .and_then(|text| serde_json::from_str::<Vec<ModelInfo>>(&text).ok())
            .unwrap_or_default();
        Self { config, provider, listed: RwLock::new(cached), refreshing: AtomicBool::new(false) }
    }

    /// Every model the agent can use as far as known: what it listed, then what the user's config names that it
    /// did not list.
    pub fn models(&self) -> Vec<ModelInfo> {
        let mut models = self.listed.read().unwrap_or_else(|p| p.into_inner()).clone();
        for model in self.config.agent.configured_models(&self.config.agents) {
            if !models.iter().any(|known| known.id == model.id) {
                models.push(model);
            }
        }
        models
    }

    /// Only what the agent itself listed (its usable providers), not the config's additions.
    pub fn listed(&self) -> Vec<ModelInfo> {
        self.listed.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Lists the models again in the background, when the agent lists its models and is installed. One listing at a time: `None` when
    /// one runs already. The task answers whether the list changed.
    pub fn refresh(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<bool>> {
        if self.config.agent.model_listing().is_none() || self.refreshing.swap(true, Ordering::SeqCst) {
            return None;
        }
        let catalog = self.clone();
        Some(tokio::spawn(async move {
            let changed = match catalog.list().await {
                Ok(models) if !models.is_empty() => {
                    tracing::info!(count = models.len(), "{} models listed", catalog.config.agent.display_name());
                    catalog.set(models)
                }
                Ok(_) => {
                    tracing::debug!("{}'s model listing listed nothing", catalog.config.agent.display_name());
                    false
                }
                Err(why) => {
                    tracing::warn!("could not list {}'s models: {why}", catalog.config.agent.display_name());
                    false
                }
            };
            catalog.refreshing.store(false, Ordering::SeqCst);
            changed
        }))
    }

    /// Takes the models a warm server reported; answers whether the list changed.
    pub fn set(&self, models: Vec<ModelInfo>) -> bool {
        if models.is_empty() {
            return false;
        }
        let mut listed = self.listed.write().unwrap_or_else(|p| p.into_inner());
        if *listed == models {
            return false;
        }
        if let (Some(path), Ok(text)) = (cache_path(&self.config), serde_json::to_string_pretty(&models)) {
            let _ = std::fs::write(path, text);
        }
        *listed = models;
        true
    }

    async fn list(&self) -> Result<Vec<ModelInfo>, String> {
        let agent = self.config.agent;
        let Some(listing) = agent.model_listing() else { return Ok(Vec::new()) };
        let Some(executable) = crate::locate::installed_executable(&self.config, agent) else {
            return Ok(Vec::new());
        };
        let mut names = (listing.env)(&self.config.agents);
        names.extend(self.config.pass_env.iter().cloned());
        let output = super::run_once(
            &self.config,
            self.provider.as_ref(),
            CATALOG_SANDBOX,
            agent,
            &executable,
            listing.args,
            &names,
        )
        .await?;
        Ok((listing.parse)(&output))
    }
}

fn cache_path(config: &Config) -> Option<PathBuf> {
    Some(config.data_dir.join(config.agent.model_listing()?.cache))
}
