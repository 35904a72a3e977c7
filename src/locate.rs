//! Where a CLI's executable already is, before anything is installed: below both `auth` (whose login runs the
//! CLI) and `session` (whose turns do), so that neither reaches into the other for it.

use std::path::PathBuf;

use crate::agents::AgentKind;
use crate::config::Config;

/// Where a CLI's executable was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// The user named it (`--opencode-bin`, `--amp-bin`).
    Override(PathBuf),
    /// On the bridge's PATH.
    OnPath(PathBuf),
    /// Installed by acp-sandbox on first use, in the tools dir.
    Installed(PathBuf),
}

impl Location {
    /// The executable.
    pub fn into_path(self) -> PathBuf {
        match self {
            Location::Override(path) | Location::OnPath(path) | Location::Installed(path) => path,
        }
    }
}

/// The CLI's executable when it is already there, in this order: the override, PATH, the install cache.
pub fn locate(config: &Config, agent: AgentKind) -> Option<Location> {
    if let Some(path) = config.bin_override(agent) {
        return Some(Location::Override(path.clone()));
    }
    let package = agent.package();
    if let Ok(path) = which::which(package.bin) {
        return Some(Location::OnPath(path));
    }
    let cached = package.executable(&crate::paths::tools_dir(&config.data_dir));
    cached.exists().then_some(Location::Installed(cached))
}

/// [`locate`]'s executable.
pub fn installed_executable(config: &Config, agent: AgentKind) -> Option<PathBuf> {
    locate(config, agent).map(Location::into_path)
}
