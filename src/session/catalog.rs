//! The models OpenCode can use, kept fresh in the background: `opencode models --verbose`, run in a small
//! sandbox of the bridge's own with the user's configuration, and cached in the data dir for the next start.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::agents::opencode::catalog::{self, ModelInfo};
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
        let cached = std::fs::read_to_string(cache_path(&config))
            .ok()
            .and_then(|text| serde_json::from_str::<Vec<ModelInfo>>(&text).ok())
            .unwrap_or_default();
        Self { config, provider, listed: RwLock::new(cached), refreshing: AtomicBool::new(false) }
    }

    /// Every model OpenCode can use as far as known: what it listed, then what the user's config names
    /// that it did not list.
    pub fn models(&self) -> Vec<ModelInfo> {
        let mut models = self.listed.read().unwrap_or_else(|p| p.into_inner()).clone();
        for model in &self.config.agents.opencode.models {
            if !models.iter().any(|known| known.id == model.id) {
                models.push(model.clone());
            }
        }
        models
    }

    /// Only what OpenCode itself listed (its usable providers), not the config's additions.
    pub fn listed(&self) -> Vec<ModelInfo> {
        self.listed.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Lists the models again in the background, when OpenCode is installed. One listing at a time: `None` when
    /// one runs already. The task answers whether the list changed.
    pub fn refresh(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<bool>> {
        if self.refreshing.swap(true, Ordering::SeqCst) {
            return None;
        }
        let catalog = self.clone();
        Some(tokio::spawn(async move {
            let changed = match catalog.list().await {
                Ok(models) if !models.is_empty() => {
                    tracing::info!(count = models.len(), "OpenCode models listed");
                    catalog.set(models)
                }
                Ok(_) => {
                    tracing::debug!("`opencode models` listed nothing");
                    false
                }
                Err(why) => {
                    tracing::warn!("could not list OpenCode's models: {why}");
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
        if let Ok(text) = serde_json::to_string_pretty(&models) {
            let _ = std::fs::write(cache_path(&self.config), text);
        }
        *listed = models;
        true
    }

    fn listing_env_names(&self) -> std::collections::BTreeSet<String> {
        let mut names = self.config.agents.opencode.needs.env_names(std::iter::empty());
        names.extend(crate::agents::opencode::providers::all_provider_env().into_iter().map(String::from));
        names.extend(self.config.pass_env.iter().cloned());
        names
    }

    async fn list(&self) -> Result<Vec<ModelInfo>, String> {
        let Some(executable) = crate::locate::installed_executable(&self.config, crate::agents::opencode::AGENT) else {
            return Ok(Vec::new());
        };
        let (agent, names) = (crate::agents::opencode::AGENT, self.listing_env_names());
        let output = super::run_once(
            &self.config,
            self.provider.as_ref(),
            CATALOG_SANDBOX,
            agent,
            &executable,
            catalog::LIST_ARGS,
            &names,
        )
        .await?;
        Ok(catalog::parse(&output))
    }
}

fn cache_path(config: &Config) -> PathBuf {
    config.data_dir.join("opencode-models.json")
}
