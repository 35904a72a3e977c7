//! Resolved settings of one bridge process: flags and environment, merged with defaults.

use std::path::PathBuf;
use std::time::Duration;

use crate::agents::AgentKind;
use crate::agents::opencode::catalog::ModelInfo;
use crate::agents::opencode::providers::ProviderNeeds;
use crate::sandbox::local::limits::Limits;
use crate::sandbox::local::policy::{Policy, Profile};
use crate::sandbox::net::proxy::NetworkMode;

/// How the agent's writes reach the workspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkspaceMode {
    /// The workspace is bound writable: the agent's writes land in the user's files.
    #[default]
    Direct,
    /// The agent works on a copy of the workspace; its text edits reach the user's files through the editor.
    Review,
}

/// What a remote sandbox (E2B, Daytona) does between turns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RemoteIdle {
    /// Suspended once each turn ended (E2B pauses it, Daytona stops it); the next prompt resumes it.
    #[default]
    Pause,
    /// Left running until the provider's own idle timeout.
    Keep,
}

/// Which sandbox runs the CLIs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SandboxChoice {
    /// bubblewrap when its probe works, a plain process group otherwise.
    Auto,
    /// bubblewrap, and a clear error when it cannot work here.
    Bwrap,
    /// A plain process group in the workspace: no isolation.
    None,
    /// An E2B sandbox per session (preview): `E2B_API_KEY` in the bridge's environment.
    E2b,
    /// A Daytona sandbox per session (preview): `DAYTONA_API_KEY` in the bridge's environment.
    Daytona,
}

impl SandboxChoice {
    /// The name used on the command line and in `doctor`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxChoice::Auto => "auto",
            SandboxChoice::Bwrap => "bwrap",
            SandboxChoice::None => "none",
            SandboxChoice::E2b => "e2b",
            SandboxChoice::Daytona => "daytona",
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
    /// How long a write to the store waits for another process's lock before the store reports it locked.
    pub store_busy_timeout: Duration,
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
    /// How OpenCode is driven.
    pub opencode_backend: OpenCodeBackend,
    /// Whether the agent's edits go through the editor's review first.
    pub workspace: WorkspaceMode,
    /// A warm OpenCode server unused for this long is stopped.
    pub server_idle_timeout: Duration,
    /// At most this many warm OpenCode servers run at once.
    pub max_servers: usize,
    /// Whether the sessions of one workspace share a sandbox and a warm server.
    pub server_scope: ServerScope,
    /// `--keep-warm`: a local warm server outlives its bridge for this long, for the next bridge to adopt.
    /// `None` (the default, and `0`) keeps none, and stops those an earlier bridge kept.
    pub keep_warm: Option<Duration>,
    /// What a remote sandbox does between turns.
    pub remote_idle: RemoteIdle,
    /// `--remote-upload-secrets`: a remote sandbox gets the workspace's secret files too (`.env*`, private keys,
    /// the paths the local policy hides in the home); kept back otherwise.
    pub remote_upload_secrets: bool,
}

/// How OpenCode is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OpenCodeBackend {
    /// One warm `opencode serve` per session: live tokens and tool output, permissions, fast follow-ups.
    Serve,
    /// One `opencode run --format json` per prompt.
    Run,
}

/// What one warm OpenCode server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerScope {
    /// The new sessions of one workspace (same agent, same sandbox policy) share one sandbox and one server, each
    /// its own OpenCode session there: a new thread starts no server. The workspace is the trust boundary.
    Workspace,
    /// Every session its own sandbox and server.
    Session,
}

impl Config {
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
            store_busy_timeout: crate::store::DEFAULT_BUSY_TIMEOUT,
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
            opencode_backend: OpenCodeBackend::Serve,
            workspace: WorkspaceMode::Direct,
            server_idle_timeout: Duration::from_secs(600),
            max_servers: 4,
            server_scope: ServerScope::Workspace,
            keep_warm: None,
            remote_idle: RemoteIdle::Pause,
            remote_upload_secrets: false,
        }
    }

    /// What the local sandbox hides, shows and protects.
    pub fn policy(&self) -> Policy {
        let path_dirs = std::env::var_os("PATH").map(|path| std::env::split_paths(&path).collect()).unwrap_or_default();
        Policy {
            profile: self.profile,
            home: crate::paths::home(),
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
            let Some(value) = read_opencode_config(&config_dir.join("opencode").join(name)) else { continue };
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

/// Reads one of OpenCode's config files (`opencode.json`, `opencode.jsonc`, ...) the way OpenCode does: JSON
/// with comments and trailing commas. A missing file is `None`; so is a broken one, with a warning, since
/// what it configures (models, commands) then silently goes missing.
pub fn read_opencode_config(path: &std::path::Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    match parse_opencode_config(&text) {
        Ok(value) => Some(value),
        Err(e) => {
            tracing::warn!(path = %path.display(), "ignoring an OpenCode config that does not parse: {e}");
            None
        }
    }
}

/// Parses OpenCode's JSONC: `//` and `/* */` comments and trailing commas, nothing else of JSON5, like the
/// `jsonc-parser` options OpenCode reads its config with.
pub(crate) fn parse_opencode_config(text: &str) -> Result<serde_json::Value, jsonc_parser::errors::ParseError> {
    let options = jsonc_parser::ParseOptions {
        allow_comments: true,
        allow_trailing_commas: true,
        allow_loose_object_property_names: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    };
    jsonc_parser::parse_to_serde_value(text, &options)
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

    #[test]
    fn opencode_config_is_read_as_jsonc() {
        let text = r#"{
            // a line comment
            "url": "https://example.com//not-a-comment", /* a block
            comment */ "glob": "src/**/*.rs",
            "escaped": "a \" // still a string",
            "command": { "deploy": { "description": "ship it", }, },
            "list": [1, 2,],
        }"#;
        let value = parse_opencode_config(text).unwrap();
        assert_eq!(value["url"], "https://example.com//not-a-comment");
        assert_eq!(value["glob"], "src/**/*.rs");
        assert_eq!(value["escaped"], "a \" // still a string");
        assert_eq!(value["command"]["deploy"]["description"], "ship it");
        assert_eq!(value["list"], serde_json::json!([1, 2]));
        assert!(parse_opencode_config("{ 'single': 1 }").is_err(), "JSON5 is more than OpenCode accepts");
        assert!(parse_opencode_config("{ \"a\": 1 /* unterminated ").is_err());
    }

    #[test]
    fn a_block_comment_or_trailing_comma_no_longer_hides_the_users_models() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("opencode")).unwrap();
        std::fs::write(
            dir.path().join("opencode/opencode.json"),
            "{ /* mine */ \"model\": \"a/b\", \"provider\": {\"p\": {\"models\": {\"m\": {},},},}, }",
        )
        .unwrap();
        let found = OpenCodeModels::read(dir.path());
        assert_eq!(found.models.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["a/b", "p/m"]);
        assert_eq!(read_opencode_config(&dir.path().join("missing.json")), None);
    }
}
