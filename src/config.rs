//! Resolved settings of one bridge process: flags and environment, merged with defaults.

use std::path::PathBuf;
use std::time::Duration;

use crate::agents::AgentKind;
use crate::agents::opencode::catalog::ModelInfo;
use crate::agents::opencode::providers::ProviderNeeds;
use crate::sandbox::limits::Limits;
use crate::sandbox::policy::{Policy, Profile};
use crate::sandbox::proxy::NetworkMode;

/// Which sandbox runs the CLIs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SandboxChoice {
    /// bubblewrap when its probe works, a plain process group otherwise.
    Auto,
    /// bubblewrap, and a clear error when it cannot work here.
    Bwrap,
    /// A plain process group in the workspace: no isolation.
    None,
}

impl SandboxChoice {
    /// The name used on the command line and in `doctor`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxChoice::Auto => "auto",
            SandboxChoice::Bwrap => "bwrap",
            SandboxChoice::None => "none",
        }
    }
}

/// Everything the library needs to know about how it was started.
#[derive(Clone, Debug)]
pub struct Config {
    /// The agent that new sessions run.
    pub agent: AgentKind,
    /// The sandbox choice for new sessions.
    pub sandbox: SandboxChoice,
    /// Root of the store, the per-session state and the CLI install cache.
    pub data_dir: PathBuf,
    /// Model for OpenCode (`provider/model`) or mode for Amp, when the user picked one on the command line.
    pub model: Option<String>,
    /// An executable to run instead of the installed `opencode`.
    pub opencode_bin: Option<PathBuf>,
    /// An executable to run instead of the installed `amp`.
    pub amp_bin: Option<PathBuf>,
    /// A turn that prints nothing for this long is ended with an error and its process tree killed.
    pub idle_timeout: Duration,
    /// At most this many updates are replayed by `session/load`; older turns are cut with a visible note.
    pub replay_limit: usize,
    /// Context window size reported in `usage_update` when the model's own is unknown.
    pub context_window: u64,
    /// Amp modes offered in the editor's picker; the first is the default.
    pub amp_modes: Vec<String>,
    /// OpenCode models named by the user's OpenCode config; `opencode models` adds what it can use.
    pub opencode_models: Vec<ModelInfo>,
    /// The model OpenCode uses when none is chosen (`model` of the user's config).
    pub opencode_default_model: Option<String>,
    /// What the user's OpenCode config needs: its providers' variables and model endpoints.
    pub opencode_needs: ProviderNeeds,
    /// How much of the home the sandbox shows.
    pub profile: Profile,
    /// Hidden in the sandbox on top of the built-in secrets.
    pub deny_read: Vec<PathBuf>,
    /// Shown read-only in the sandbox even where it would be hidden.
    pub allow_read: Vec<PathBuf>,
    /// Read-only inside the workspace on top of the built-in protected paths.
    pub protect: Vec<PathBuf>,
    /// Variables of the bridge's environment passed to the CLI on top of what it needs.
    pub pass_env: Vec<String>,
    /// A turn running longer than this is ended with an error and its process tree killed.
    pub turn_timeout: Duration,
    /// Where the sandbox may connect.
    pub network: NetworkMode,
    /// Processes and memory of one sandbox.
    pub limits: Limits,
}

impl Config {
    /// The default data dir of the platform, e.g. `~/.local/share/acp-sandbox`.
    pub fn default_data_dir() -> PathBuf {
        directories::ProjectDirs::from("", "", "acp-sandbox")
            .map(|dirs| dirs.data_dir().to_path_buf())
            .unwrap_or_else(|| std::env::temp_dir().join("acp-sandbox"))
    }

    /// A config for tests and tools: the given agent and data dir, defaults elsewhere.
    pub fn new(agent: AgentKind, data_dir: PathBuf) -> Self {
        Self {
            agent,
            sandbox: SandboxChoice::Auto,
            data_dir,
            model: None,
            opencode_bin: None,
            amp_bin: None,
            idle_timeout: Duration::from_secs(600),
            replay_limit: 5000,
            context_window: 200_000,
            amp_modes: ["medium", "low", "high", "ultra"].map(String::from).to_vec(),
            opencode_models: Vec::new(),
            opencode_default_model: None,
            opencode_needs: ProviderNeeds::default(),
            profile: Profile::Default,
            deny_read: Vec::new(),
            allow_read: Vec::new(),
            protect: Vec::new(),
            pass_env: Vec::new(),
            turn_timeout: Duration::from_secs(30 * 60),
            network: NetworkMode::Open,
            limits: Limits::default(),
        }
    }

    /// A private directory for the sockets of the sandboxes' proxies. Unix socket paths are short (108 bytes), so a
    /// deep data dir falls back to the user's runtime dir.
    pub fn run_dir(&self) -> PathBuf {
        let preferred = self.data_dir.join("run");
        // `<run dir>/<12 hex>.sock` must fit.
        if preferred.as_os_str().len() + 18 < 100 {
            return preferred;
        }
        let uid = nix::unistd::getuid();
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(dir) => PathBuf::from(dir).join("acp-sandbox"),
            None => std::env::temp_dir().join(format!("acp-sandbox-{uid}")),
        }
    }

    /// The user's home (`$HOME`).
    pub fn home() -> PathBuf {
        directories::BaseDirs::new().map(|dirs| dirs.home_dir().to_path_buf()).unwrap_or_else(|| "/nonexistent".into())
    }

    /// What the local sandbox hides, shows and protects.
    pub fn policy(&self) -> Policy {
        let path_dirs = std::env::var_os("PATH").map(|path| std::env::split_paths(&path).collect()).unwrap_or_default();
        Policy {
            profile: self.profile,
            home: Self::home(),
            data_dir: self.data_dir.clone(),
            runtime_dir: std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
            path_dirs,
            deny_read: self.deny_read.clone(),
            allow_read: self.allow_read.clone(),
            protect: self.protect.clone(),
        }
    }

    /// The SQLite database file.
    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join("acp-sandbox.sqlite3")
    }

    /// The log file, next to the database.
    pub fn log_path(&self) -> PathBuf {
        self.data_dir.join("acp-sandbox.log")
    }

    /// Per-session state (the CLI's HOME and XDG dirs) lives under here.
    pub fn sessions_dir(&self) -> PathBuf {
        self.data_dir.join("sessions")
    }

    /// CLIs installed on first use live under here, one folder per pinned version.
    pub fn tools_dir(&self) -> PathBuf {
        self.data_dir.join("tools")
    }

    /// The override executable for an agent, if any.
    pub fn bin_override(&self, agent: AgentKind) -> Option<&PathBuf> {
        match agent {
            AgentKind::Amp => self.amp_bin.as_ref(),
            AgentKind::OpenCode => self.opencode_bin.as_ref(),
        }
    }
}

/// What a user's OpenCode configuration says about models.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpenCodeModels {
    /// Its default `model`, `small_model` and every `provider.<id>.models.<id>`.
    pub models: Vec<ModelInfo>,
    /// The `model` OpenCode uses by default.
    pub default: Option<String>,
    /// Its providers' variables and endpoints.
    pub needs: ProviderNeeds,
}

impl OpenCodeModels {
    /// Reads `opencode.json[c]` of the user's config dir. A missing or unreadable file yields nothing.
    pub fn read(config_dir: &std::path::Path) -> Self {
        let mut found = Self::default();
        let add = |info: ModelInfo, found: &mut Self| {
            if !found.models.iter().any(|known| known.id == info.id) {
                found.models.push(info);
            }
        };
        for name in ["opencode.json", "opencode.jsonc", "config.json"] {
            let Ok(text) = std::fs::read_to_string(config_dir.join("opencode").join(name)) else { continue };
            let Ok(value) = serde_json::from_str::<serde_json::Value>(&strip_line_comments(&text)) else { continue };
            found.needs.merge(ProviderNeeds::from_config(&value));
            if let Some(model) = value.get("model").and_then(|m| m.as_str()) {
                found.default = Some(model.to_string());
            }
            for key in ["model", "small_model"] {
                if let Some(model) = value.get(key).and_then(|m| m.as_str()) {
                    add(ModelInfo::named(model), &mut found);
                }
            }
            for (provider, body) in value.get("provider").and_then(|p| p.as_object()).into_iter().flatten() {
                for (model, spec) in body.get("models").and_then(|m| m.as_object()).into_iter().flatten() {
                    let id = format!("{provider}/{model}");
                    found.models.retain(|known| known.id != id);
                    add(ModelInfo::from_config(id, spec), &mut found);
                }
            }
        }
        found
    }
}

/// Drops `//` comments outside strings (OpenCode accepts JSONC).
pub fn strip_line_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut escaped = false;
        let mut cut = line.len();
        let bytes = line.as_bytes();
        for (i, &byte) in bytes.iter().enumerate() {
            match byte {
                b'\\' if in_string => escaped = !escaped,
                b'"' if !escaped => in_string = !in_string,
                b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => {
                    cut = i;
                    break;
                }
                _ => escaped = false,
            }
            if byte != b'\\' {
                escaped = false;
            }
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

/// Creates a directory (and its parents) readable by its owner only: it holds prompts, answers and the
/// agents' own state.
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => {
            // A directory someone else made (a shared /tmp) must not hold our sockets or data.
            if meta.uid() != nix::unistd::getuid().as_raw() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("{} belongs to another user", dir.display()),
                ));
            }
            if meta.mode() & 0o077 != 0 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            }
            Ok(())
        }
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", dir.display()),
        )),
        Err(_) => std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_come_from_the_users_opencode_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("opencode")).unwrap();
        std::fs::write(
            dir.path().join("opencode/opencode.jsonc"),
            "{ // comment\n \"model\": \"a/b\", \"provider\": {\"fake\": {\"models\": {\"m1\": {\"name\": \"M1\", \"limit\": {\"context\": 128000}}, \"m2\": {\"variants\": {\"high\": {}, \"low\": {}}}}}}}",
        )
        .unwrap();
        let found = OpenCodeModels::read(dir.path());
        let ids: Vec<&str> = found.models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a/b", "fake/m1", "fake/m2"]);
        assert_eq!(found.models[1].name, "M1");
        assert_eq!(found.models[1].context, Some(128_000));
        assert_eq!(found.models[2].variants, ["low", "high"]);
        assert_eq!(found.default.as_deref(), Some("a/b"));
        assert_eq!(OpenCodeModels::read(&dir.path().join("missing")), OpenCodeModels::default());
    }
}
