//! Gemini CLI (`@google/gemini-cli`) as an ACP agent: `gemini --acp` runs in the session's sandbox, one process per
//! session; the bridge is its ACP client (`agents::acp`). This folder says only what is Gemini's own: its package,
//! its key and endpoint, its settings.
//!
//! What running the real package taught (docs/notes/acp-agents.md): `GOOGLE_GEMINI_BASE_URL` points it at another
//! endpoint (a local one included) for an API key; without `privacy.usageStatisticsEnabled: false` it reports usage
//! to play.googleapis.com; without `GEMINI_CLI_NO_RELAUNCH` it starts node a second time for a bigger heap.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::host::{Service, ServiceSettings};
use super::{Agent, AgentKind, AgentSettings, Login, TranslateContext, Translator, TurnRequest};
use crate::sandbox::package::NpmPackage;

/// Gemini CLI, as the bridge drives it.
pub struct Gemini;

/// Gemini CLI's entry of [`crate::agents::AGENTS`].
pub const AGENT: AgentKind = AgentKind::of(&Gemini);

/// Gemini CLI's own settings of the bridge.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct Settings {
    /// Run this executable instead of the installed `gemini` (started as `gemini --acp`, same environment).
    #[arg(long, global = true, env = "ACP_SANDBOX_GEMINI_BIN")]
    pub gemini_bin: Option<PathBuf>,
}

/// The pinned package, as `.ci/install-acp-agents.sh` installs it (one node bundle, nothing native).
pub const PACKAGE: NpmPackage =
    NpmPackage { name: "@google/gemini-cli", version: "0.61.0", bin: "gemini", postinstall: None, companions: &[] };

/// The credential Gemini CLI needs here (its Google login lives in files we never show).
pub const CREDENTIAL: &str = "GEMINI_API_KEY";

/// The user's variables that reach Gemini CLI by name.
const PASSED: &[&str] = &["GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL", "GEMINI_MODEL"];

/// Google's Gemini API, and where keys and logins are made.
pub const SERVICE_HOSTS: &[&str] = &["generativelanguage.googleapis.com", "aistudio.google.com", "accounts.google.com"];

/// Its key, kept by the bridge: Gemini CLI sends it to `GOOGLE_GEMINI_BASE_URL`.
const GATEWAY: &[crate::agents::GatewayCredential] = &[crate::agents::GatewayCredential {
    variables: &[CREDENTIAL],
    base_url: "GOOGLE_GEMINI_BASE_URL",
    upstream: "https://generativelanguage.googleapis.com",
}];

/// Files of `~/.gemini` that hold credentials: never shown, never copied.
pub const CREDENTIAL_FILES: &[&str] = &["oauth_creds.json", "google_accounts.json", "mcp-oauth-tokens.json"];

/// The user's own memory file, shown read-only in the session's `~/.gemini`.
const USER_CONFIG: &[&str] = &["GEMINI.md"];

/// Whether a variable of the user's environment reaches Gemini CLI: its key, endpoint and model.
pub fn passes_env(name: &str) -> bool {
    PASSED.contains(&name)
}

/// Fixed variables: one node process (no relaunch with a bigger heap), and the API key as the way in.
pub fn fixed_env() -> Vec<(String, String)> {
    vec![("GEMINI_CLI_NO_RELAUNCH".into(), "true".into()), ("GEMINI_DEFAULT_AUTH_TYPE".into(), "gemini-api-key".into())]
}

/// The settings every session gets in its `~/.gemini/settings.json`: the API key (not the user's Google login,
/// whose files stay out), no usage statistics, telemetry or auto-update, and no folder-trust prompt (the workspace
/// is the session's, and the sandbox is the boundary).
///
/// The user's own `settings.json` is not shown: it names their auth type and turns usage statistics on by default.
pub fn settings() -> Value {
    json!({
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": false}},
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
    })
}

/// Where [`settings`] go (relative to the state dir).
pub fn settings_path() -> PathBuf {
    Path::new("home").join(".gemini").join("settings.json")
}

/// Writes [`settings`] into the session's HOME. Every local start of the CLI passes here with the session's state
/// dir (the host path, which the sandbox shows at the same place): written anew each time through
/// [`crate::workspace::statedir::StateDir`], which never follows a link the agent may have planted.
pub fn write_settings(state_dir: &Path) {
    let text = format!("{:#}\n", settings());
    let written = crate::workspace::statedir::StateDir::open(state_dir)
        .and_then(|state| state.write_file(&settings_path(), text.as_bytes()));
    match written {
        Ok(()) => {}
        // Another start of the same session (its warm start and a prompt) wrote the same file meanwhile.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => tracing::warn!("cannot write Gemini CLI's settings into {}: {e}", state_dir.display()),
    }
}

/// Run in the sandbox before Gemini CLI loads its session `$1`. It names a session's file
/// `chats/session-<minute>-<first 8 of the id>.jsonl` by the minute the process began recording, and a process that
/// loads the session begins by recording a fresh one under its own minute: loaded within the minute the file was
/// named in, it resets the conversation in that very file ("No previous sessions found for this project."). The
/// file is moved to a name it never makes (it still lists and loads it by the id inside, and writes on there).
pub const BEFORE_LOAD: &str = r#"id=$(printf '%.8s' "$1")
for file in "$HOME"/.gemini/tmp/*/chats/session-*-"$id".jsonl; do
  if [ -f "$file" ] && [ ! -L "$file" ]; then
    mv -n -- "$file" "${file%.jsonl}-kept-$(date +%s)-$$.jsonl"
  fi
done
exit 0"#;

/// The user's `~/.gemini` entries of [`USER_CONFIG`], each shown at the same place of the session's HOME.
pub fn user_config(home: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    USER_CONFIG
        .iter()
        .map(|name| (home.join(".gemini").join(name), state_dir.join("home").join(".gemini").join(name)))
        .collect()
}

impl Agent for Gemini {
    fn id(&self) -> &'static str {
        "gemini"
    }

    fn name(&self) -> &'static str {
        "Gemini CLI"
    }

    fn package(&self) -> NpmPackage {
        PACKAGE
    }

    fn bin_override<'a>(&self, settings: &'a AgentSettings) -> Option<&'a PathBuf> {
        settings.gemini.gemini_bin.as_ref()
    }

    fn args(&self, _turn: &TurnRequest<'_>) -> Vec<String> {
        vec!["--acp".into()]
    }

    fn translator(&self, context: TranslateContext) -> Box<dyn Translator> {
        super::acp::translator(context)
    }

    fn passes_env(&self, name: &str) -> bool {
        passes_env(name)
    }

    fn fixed_env(&self) -> Vec<(String, String)> {
        fixed_env()
    }

    fn takes_system_prompt(&self) -> bool {
        true
    }

    fn accepts_images(&self) -> bool {
        // Passed on where the agent says it takes them: its ACP service decides, by what it announced.
        true
    }

    fn accepts_audio(&self) -> bool {
        // As images.
        true
    }

    fn takes_mcp_servers(&self) -> bool {
        true
    }

    fn service_hosts(&self) -> &'static [&'static str] {
        SERVICE_HOSTS
    }

    fn gateway_credentials(&self) -> &'static [crate::agents::GatewayCredential] {
        GATEWAY
    }

    fn user_config(&self, _user_config_dir: &Path, _user_data_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
        user_config(&crate::paths::home(), state_dir)
    }

    fn shipped_config(&self, _executable: &Path, _user_config_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
        write_settings(state_dir);
        Vec::new()
    }

    fn required_credential(&self) -> Option<&'static str> {
        Some(CREDENTIAL)
    }

    fn credential_files(&self) -> &'static [&'static str] {
        CREDENTIAL_FILES
    }

    fn login(&self) -> Login {
        Login::Token { page: "https://aistudio.google.com/apikey" }
    }

    fn serves(&self, _settings: &AgentSettings) -> bool {
        true
    }

    fn service(&self, _settings: &AgentSettings, bounds: &ServiceSettings) -> Option<Arc<dyn Service>> {
        Some(super::acp::service_preparing_loads(
            self.name(),
            vec!["--acp".into()],
            bounds,
            Some(offers()),
            BEFORE_LOAD,
        ))
    }

    fn describe_backend(&self, _settings: &AgentSettings, _server: Result<&str, &str>) -> Option<String> {
        Some(format!(
            "runs `{} --acp` {}, one process per session in its sandbox; the bridge is its ACP client",
            PACKAGE.bin, PACKAGE.version
        ))
    }

    fn doctor_lines(&self, _settings: &AgentSettings, _cli_model: Option<&str>) -> Vec<String> {
        doctor_lines(std::env::var("GOOGLE_GEMINI_BASE_URL").ok().as_deref())
    }
}

/// `doctor`'s line: where the model calls go.
pub fn doctor_lines(base_url: Option<&str>) -> Vec<String> {
    vec![match base_url.filter(|url| !url.trim().is_empty()) {
        Some(url) => format!("model API: {url} (GOOGLE_GEMINI_BASE_URL, key {CREDENTIAL})"),
        None => format!("model API: generativelanguage.googleapis.com (key {CREDENTIAL})"),
    }]
}

/// What Gemini CLI 0.61 (the version [`Agent::package`] installs) announces of itself with `--acp`: its `initialize`
/// answer's prompt capabilities (it says no session capabilities) and its `session/new` answer's modes (its models
/// depend on the account, so only a run says them). A bridge that has not run it yet offers these; what it announces
/// replaces them.
pub fn offers() -> serde_json::Value {
    serde_json::json!({
        "promptCapabilities": {"image": true, "audio": true, "embeddedContext": true},
        "session": {"agent_modes": {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Default", "description": "Prompts for approval"},
                {"id": "autoEdit", "name": "Auto Edit", "description": "Auto-approves edit tools"},
                {"id": "yolo", "name": "YOLO", "description": "Auto-approves all tools"},
                {"id": "plan", "name": "Plan", "description": "Read-only mode"}
            ]}}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_key_endpoint_and_model_reach_gemini() {
        for name in ["GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL", "GEMINI_MODEL"] {
            assert!(passes_env(name), "{name}");
        }
        for name in ["GEMINI_CLI_HOME", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_API_KEY", "OPENAI_API_KEY"] {
            assert!(!passes_env(name), "{name}");
        }
        assert_eq!(
            fixed_env(),
            [
                ("GEMINI_CLI_NO_RELAUNCH".to_string(), "true".to_string()),
                ("GEMINI_DEFAULT_AUTH_TYPE".to_string(), "gemini-api-key".to_string())
            ]
        );
    }

    #[test]
    fn every_session_gets_the_bridges_settings_written_through_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(state.join("home/.gemini")).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "mine").unwrap();
        std::os::unix::fs::symlink(&victim, state.join("home/.gemini/settings.json")).unwrap();
        write_settings(&state);
        let written: Value =
            serde_json::from_str(&std::fs::read_to_string(state.join("home/.gemini/settings.json")).unwrap()).unwrap();
        assert_eq!(written, settings());
        assert_eq!(written["privacy"]["usageStatisticsEnabled"], false);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
        assert_eq!(
            user_config(Path::new("/home/u"), Path::new("/s")),
            [(PathBuf::from("/home/u/.gemini/GEMINI.md"), PathBuf::from("/s/home/.gemini/GEMINI.md"))]
        );
        assert_eq!(doctor_lines(None), ["model API: generativelanguage.googleapis.com (key GEMINI_API_KEY)"]);
    }
}
