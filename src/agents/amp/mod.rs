//! Amp: how to run `amp -x --stream-json`, and its events.
//!
//! The first turn starts a thread (`T-…`, from the `init` line) and must not archive it; later turns run
//! `amp threads continue T-… -x`. The prompt goes on stdin, then EOF. Amp never runs without
//! `AMP_API_KEY`: without it, it prints a login prompt on stdout and blocks.

pub mod events;
pub mod translate;

use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema::SessionConfigOptionCategory;
use serde_json::Value;

use super::options::{OptionSpec, capitalize, stored};
use super::{Agent, AgentKind, AgentSettings, Login, ModelInfo, TranslateContext, Translator, TurnRequest};
use crate::sandbox::package::NpmPackage;

/// Amp, as the bridge drives it.
pub struct Amp;

/// Amp's entry of [`crate::agents::AGENTS`].
pub const AGENT: AgentKind = AgentKind::of(&Amp);

/// Amp's own settings of the bridge.
#[derive(clap::Args, Clone, Debug)]
#[group(skip)]
pub struct Settings {
    /// Run this executable instead of the installed `amp` (same argv, stdin and environment).
    #[arg(long, global = true, env = "ACP_SANDBOX_AMP_BIN")]
    pub amp_bin: Option<PathBuf>,
    /// Amp modes offered in the editor (comma-separated; the first is the default).
    #[arg(
        long,
        global = true,
        env = "ACP_SANDBOX_AMP_MODES",
        value_delimiter = ',',
        default_value = "medium,low,high,ultra"
    )]
    pub amp_modes: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self { amp_bin: None, amp_modes: DEFAULT_MODES.map(String::from).to_vec() }
    }
}

impl Settings {
    /// Drops blank modes; none left keeps the default ones.
    pub fn tidy(&mut self) {
        let modes: Vec<String> =
            self.amp_modes.iter().map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect();
        self.amp_modes = if modes.is_empty() { DEFAULT_MODES.map(String::from).to_vec() } else { modes };
    }
}

/// The modes offered when the user names none.
const DEFAULT_MODES: [&str; 4] = ["medium", "low", "high", "ultra"];

impl Agent for Amp {
    fn id(&self) -> &'static str {
        "amp"
    }

    fn name(&self) -> &'static str {
        "Amp"
    }

    fn package(&self) -> NpmPackage {
        PACKAGE
    }

    fn bin_override<'a>(&self, settings: &'a AgentSettings) -> Option<&'a PathBuf> {
        settings.amp.amp_bin.as_ref()
    }

    fn args(&self, turn: &TurnRequest<'_>) -> Vec<String> {
        args(turn)
    }

    fn translator(&self, context: TranslateContext) -> Box<dyn Translator> {
        Box::new(translate::AmpTranslator::new(context))
    }

    fn session_missing(&self, stderr: &str) -> bool {
        session_missing(stderr)
    }

    fn passes_env(&self, name: &str) -> bool {
        passes_env(name)
    }

    fn service_hosts(&self) -> &'static [&'static str] {
        SERVICE_HOSTS
    }

    fn credentials_line(&self) -> String {
        format!("credentials: {CREDENTIAL} enters the sandbox as it is (Amp's service is not behind the model gateway)")
    }

    fn user_config(&self, user_config_dir: &Path, _user_data_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
        user_config(user_config_dir, state_dir)
    }

    fn required_credential(&self) -> Option<&'static str> {
        Some(CREDENTIAL)
    }

    fn credential_files(&self) -> &'static [&'static str] {
        CREDENTIAL_FILES
    }

    fn login(&self) -> Login {
        Login::Token { page: "https://ampcode.com/settings" }
    }

    fn options(&self, session_config: &Value, settings: &AgentSettings, _models: &[ModelInfo]) -> Vec<OptionSpec> {
        let choices: Vec<(String, String)> =
            settings.amp.amp_modes.iter().map(|mode| (mode.clone(), capitalize(mode))).collect();
        let fallback = choices.first().map(|(value, _)| value.clone()).unwrap_or_else(|| "medium".into());
        let current = stored(session_config, "mode").map(str::to_string).unwrap_or(fallback);
        vec![OptionSpec {
            id: "mode",
            name: "Mode",
            category: Some(SessionConfigOptionCategory::Mode),
            choices,
            current,
        }]
    }

    fn default_option(&self) -> &'static str {
        "mode"
    }

    fn takes_mcp_servers(&self) -> bool {
        true
    }
}

/// The pinned npm package installed on first use (a version whose platform binary exists).
pub const PACKAGE: NpmPackage = NpmPackage {
    name: "@ampcode/cli",
    version: "0.0.1790142911-g7618fb",
    bin: "amp",
    postinstall: Some("install.cjs"),
    companions: &[],
};

/// The credential Amp cannot run without.
pub const CREDENTIAL: &str = "AMP_API_KEY";

/// Amp's own service (it runs the model calls itself).
pub const SERVICE_HOSTS: &[&str] = &["ampcode.com", "sourcegraph.com"];

/// The argv after the executable.
pub fn args(turn: &TurnRequest<'_>) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    if let Some(thread) = turn.native_id {
        args.extend(["threads", "continue", thread].map(String::from));
    }
    args.extend(["-x", "--stream-json", "--stream-json-thinking", "--dangerously-allow-all"].map(String::from));
    if turn.native_id.is_none() {
        // Without it the thread is archived after the run and cannot be continued.
        args.push("--no-archive-after-execute".into());
    }
    if let Some(mode) = stored(turn.options, "mode") {
        args.extend(["--mode".to_string(), mode.to_string()]);
    }
    if !turn.extras.mcp_servers.is_empty() {
        args.extend([crate::agents::mcp::CONFIG_FLAG.to_string(), mcp_config(turn.extras.mcp_servers).to_string()]);
    }
    args
}

/// Amp's `--mcp-config` for the editor's servers (merged with the user's settings by Amp): a stdio server wrapped
/// (`agents::mcp::stdio`) with the editor's variables as its `env`, an http or sse one by its URL and headers.
fn mcp_config(servers: &[agent_client_protocol::v1::schema::McpServer]) -> Value {
    use agent_client_protocol::v1::schema::McpServer;
    let headers = |headers: &[agent_client_protocol::v1::schema::HttpHeader]| -> serde_json::Map<String, Value> {
        headers.iter().map(|header| (header.name.clone(), Value::String(header.value.clone()))).collect()
    };
    let mut config = serde_json::Map::new();
    for server in servers {
        let (name, entry) = match server {
            McpServer::Stdio(stdio) => {
                let wrapped = crate::agents::mcp::stdio(stdio);
                (&stdio.name, serde_json::json!({"command": wrapped.program, "args": wrapped.args, "env": wrapped.env}))
            }
            McpServer::Http(http) => {
                (&http.name, serde_json::json!({"url": http.url, "headers": headers(&http.headers)}))
            }
            McpServer::Sse(sse) => (&sse.name, serde_json::json!({"url": sse.url, "headers": headers(&sse.headers)})),
            // Non-exhaustive: transports this build does not enable.
            _ => continue,
        };
        config.insert(name.clone(), entry);
    }
    Value::Object(config)
}

/// Whether a variable of the user's environment reaches Amp.
pub fn passes_env(name: &str) -> bool {
    name.starts_with("AMP_")
}

/// The user's Amp settings, shown read-only inside the session's state dir.
pub fn user_config(user_config_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    vec![(user_config_dir.join("amp"), state_dir.join("config").join("amp"))]
}

/// Where Amp keeps its access token when it stores one itself.
pub const CREDENTIAL_FILES: &[&str] = &["secrets.json"];

/// Whether stderr says the thread we continue is gone or cannot be continued.
pub fn session_missing(stderr: &str) -> bool {
    stderr.contains("does not exist") || stderr.contains("is archived") || stderr.contains("Invalid thread")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_turn_starts_an_unarchived_thread_and_later_turns_continue_it() {
        let options = serde_json::json!({"mode": "high"});
        let first = args(&TurnRequest {
            native_id: None,
            fork_of: None,
            options: &options,
            files: &[],
            command: None,
            extras: Default::default(),
        });
        assert_eq!(
            first,
            [
                "-x",
                "--stream-json",
                "--stream-json-thinking",
                "--dangerously-allow-all",
                "--no-archive-after-execute",
                "--mode",
                "high"
            ]
        );
        let none = serde_json::json!({});
        let next = args(&TurnRequest {
            native_id: Some("T-1"),
            fork_of: None,
            options: &none,
            files: &[],
            command: None,
            extras: Default::default(),
        });
        assert_eq!(next[..3], ["threads", "continue", "T-1"]);
        assert!(!next.contains(&"--no-archive-after-execute".to_string()));
    }

    #[test]
    fn a_lost_thread_is_recognized() {
        assert!(session_missing("Error: Thread https://ampcode.com/threads/T-1 does not exist."));
        assert!(session_missing("Error: This thread is archived and cannot be continued."));
        assert!(!session_missing("Error: Couldn't connect to the Amp server"));
        assert!(passes_env("AMP_API_KEY") && !passes_env("OPENAI_API_KEY"));
    }
}
