//! Claude Code through its ACP adapter (`@agentclientprotocol/claude-agent-acp`): the adapter runs in the session's
//! sandbox, one process per session, and starts the native Claude Code CLI beside it; the bridge is its ACP client
//! (`agents::acp`). This folder says only what is Claude's own: its package, its key and variables, its settings.
//!
//! What running the real package taught (docs/notes/acp-agents.md): it reads `permissions.defaultMode` from
//! `~/.claude/settings.json` and, with none, starts in "auto" and runs tools without asking anyone; it refuses to
//! start as root when `IS_SANDBOX` holds anything but `1`; it needs a writable `/tmp`; and without the variables of
//! [`fixed_env`] it calls api.anthropic.com whatever `ANTHROPIC_BASE_URL` says.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::host::{Service, ServiceSettings};
use super::{Agent, AgentKind, AgentSettings, Keeps, Login, OwnLogin, TranslateContext, Translator};
use crate::sandbox::package::NpmPackage;

/// Claude Code, as the bridge drives it.
pub struct Claude;

/// Claude Code's entry of [`crate::agents::AGENTS`].
pub const AGENT: AgentKind = AgentKind::of(&Claude);

/// Claude Code's own settings of the bridge.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct Settings {
    /// Run this executable instead of the installed `claude-agent-acp` (an ACP agent on stdio, same environment).
    #[arg(long, global = true, env = "ACP_SANDBOX_CLAUDE_BIN")]
    pub claude_bin: Option<PathBuf>,
}

/// The pinned adapter, as `.ci/install-acp-agents.sh` installs it. It pins the Claude Agent SDK exactly, whose
/// platform package brings the native `claude` binary: nothing else to install beside it.
pub const PACKAGE: NpmPackage = NpmPackage {
    name: "@agentclientprotocol/claude-agent-acp",
    version: "0.101.0",
    bin: "claude-agent-acp",
    postinstall: None,
    companions: &[],
};

/// The credential Claude Code cannot work without here (its own OAuth login lives in files we never show).
pub const CREDENTIAL: &str = "ANTHROPIC_API_KEY";

/// Where a Claude subscription's token goes (`claude setup-token` makes one; Claude Code sends it as a bearer token).
pub const OAUTH_TOKEN: &str = "CLAUDE_CODE_OAUTH_TOKEN";

/// How a subscription's token from `claude setup-token` begins (an API key begins `sk-ant-api`).
const OAUTH_TOKEN_PREFIX: &str = "sk-ant-oat";

/// The user's variables that reach Claude Code by name, beside the key.
const PASSED: &[&str] = &["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_MODEL"];

/// Anthropic's model API, and the console and site where keys and logins are made.
pub const SERVICE_HOSTS: &[&str] = &["api.anthropic.com", "console.anthropic.com", "claude.ai"];

/// Its key and subscription token, kept by the bridge: Claude Code sends either to `ANTHROPIC_BASE_URL`.
const GATEWAY: &[crate::agents::GatewayCredential] = &[crate::agents::GatewayCredential {
    variables: &[CREDENTIAL, OAUTH_TOKEN, "ANTHROPIC_AUTH_TOKEN"],
    base_url: "ANTHROPIC_BASE_URL",
    upstream: "https://api.anthropic.com",
}];

/// Files of `~/.claude` that hold credentials: never shown, never copied.
pub const CREDENTIAL_FILES: &[&str] = &[".credentials.json"];

/// The user's own Claude Code configuration shown read-only in the session's HOME (names under `~/.claude`):
/// settings, memory and their own commands and subagents. Never the credentials, nor `~/.claude.json` (account ids).
const USER_CONFIG: &[&str] = &["settings.json", "CLAUDE.md", "commands", "agents"];

/// The settings a session gets when the user has none: Claude Code asks before a tool runs (the editor answers),
/// instead of "auto", where it runs every tool without asking.
pub const DEFAULT_SETTINGS: &str = "{\n  \"permissions\": {\n    \"defaultMode\": \"default\"\n  }\n}\n";

/// Whether a variable of the user's environment reaches Claude Code: its key, endpoint, model and own settings.
pub fn passes_env(name: &str) -> bool {
    PASSED.contains(&name) || name.starts_with("CLAUDE_CODE_")
}

/// Fixed variables: no telemetry, error reports, update checks or other traffic beside the model's (without them it
/// resolves api.anthropic.com even with `ANTHROPIC_BASE_URL` set, and a sandbox's network has no such host).
///
/// `IS_SANDBOX` is left out on purpose: the bridge's environment never reaches the agent (a machine that says
/// `IS_SANDBOX=yes` made every session fail as root: the adapter takes any value, the CLI only `1`), and setting it
/// to `1` would make Claude Code offer its bypass mode as root, which under `--sandbox none` is no sandbox at all.
pub fn fixed_env() -> Vec<(String, String)> {
    [
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("DISABLE_UPDATES", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_ERROR_REPORTING", "1"),
        ("DISABLE_BUG_COMMAND", "1"),
        ("DISABLE_COST_WARNINGS", "1"),
        ("DISABLE_GROWTHBOOK", "1"),
        ("CLAUDE_CODE_ENABLE_TELEMETRY", "0"),
        ("CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION", "false"),
        ("CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY", "1"),
        ("CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL", "1"),
        ("CLAUDE_CODE_DISABLE_TERMINAL_TITLE", "1"),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value.to_string()))
    .collect()
}

/// The user's `~/.claude` entries of [`USER_CONFIG`], each shown at the same place of the session's HOME.
pub fn user_config(home: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    USER_CONFIG
        .iter()
        .map(|name| (home.join(".claude").join(name), state_dir.join("home").join(".claude").join(name)))
        .collect()
}

/// Where the session's settings go when the user has none (relative to the state dir).
pub fn default_settings_path() -> PathBuf {
    Path::new("home").join(".claude").join("settings.json")
}

/// Writes [`DEFAULT_SETTINGS`] into the session's HOME when the user has no `~/.claude/settings.json` of their
/// own to show there. Every local start of the CLI passes here with the session's state dir (the host path, which
/// the sandbox shows at the same place): written anew each time through [`crate::workspace::statedir::StateDir`],
/// which never follows a link the agent may have planted.
pub fn write_default_settings(home: &Path, state_dir: &Path) {
    if home.join(".claude").join("settings.json").exists() {
        return;
    }
    let written = crate::workspace::statedir::StateDir::open(state_dir)
        .and_then(|state| state.write_file(&default_settings_path(), DEFAULT_SETTINGS.as_bytes()));
    match written {
        Ok(()) => {}
        // Another start of the same session (its warm start and a prompt) wrote the same file meanwhile.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => tracing::warn!("cannot write Claude Code's default settings into {}: {e}", state_dir.display()),
    }
}

impl Agent for Claude {
    fn id(&self) -> &'static str {
        "claude"
    }

    fn name(&self) -> &'static str {
        "Claude Code"
    }

    fn package(&self) -> NpmPackage {
        PACKAGE
    }

    fn bin_override<'a>(&self, settings: &'a AgentSettings) -> Option<&'a PathBuf> {
        settings.claude.claude_bin.as_ref()
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

    fn replaces_system_prompt(&self) -> bool {
        // claude-agent-acp offers `override` (its `sessionCapabilities.systemPrompt.mode`): Claude Code's own
        // prompt is replaced.
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
        write_default_settings(&crate::paths::home(), state_dir);
        Vec::new()
    }

    fn required_credential(&self) -> Option<&'static str> {
        Some(CREDENTIAL)
    }

    fn other_credentials(&self) -> &'static [&'static str] {
        &[OAUTH_TOKEN]
    }

    fn credential_variable(&self, token: &str) -> Option<&'static str> {
        Some(if token.starts_with(OAUTH_TOKEN_PREFIX) { OAUTH_TOKEN } else { CREDENTIAL })
    }

    fn credential_files(&self) -> &'static [&'static str] {
        CREDENTIAL_FILES
    }

    fn login(&self) -> Login {
        Login::Token {
            page: "https://console.anthropic.com/settings/keys, or `claude setup-token` for your Claude subscription",
        }
    }

    /// Claude Code's `setup-token` (through the adapter's `--cli`, the Claude Code it brings): a browser sign-in to
    /// the subscription that prints a long-lived token for inference, which is kept like a key and reaches Claude
    /// Code as `CLAUDE_CODE_OAUTH_TOKEN`. Not its `/login`, whose refreshable login file every command of the
    /// session could read and write.
    fn own_login(&self) -> Option<OwnLogin> {
        Some(OwnLogin {
            with: "a Claude subscription",
            program: None,
            args: vec!["--cli".into(), "setup-token".into()],
            keeps: Keeps::PrintedToken,
        })
    }

    fn serves(&self, _settings: &AgentSettings) -> bool {
        true
    }

    fn service(&self, _settings: &AgentSettings, bounds: &ServiceSettings) -> Option<Arc<dyn Service>> {
        Some(super::acp::service(self.name(), Vec::new(), bounds, Some(offers())))
    }

    fn describe_backend(&self, _settings: &AgentSettings, _server: Result<&str, &str>) -> Option<String> {
        Some(format!(
            "runs `{}` {} (ACP), one process per session in its sandbox; the bridge is its ACP client",
            PACKAGE.bin, PACKAGE.version
        ))
    }

    fn doctor_lines(&self, _settings: &AgentSettings, _cli_model: Option<&str>) -> Vec<String> {
        doctor_lines(&crate::paths::home(), std::env::var("ANTHROPIC_BASE_URL").ok().as_deref())
    }
}

/// `doctor`'s lines: where the model calls go, and which settings a session gets.
pub fn doctor_lines(home: &Path, base_url: Option<&str>) -> Vec<String> {
    let endpoint = match base_url.filter(|url| !url.is_empty()) {
        Some(url) => format!("model API: {url} (ANTHROPIC_BASE_URL)"),
        None => "model API: api.anthropic.com".to_string(),
    };
    let settings = if home.join(".claude").join("settings.json").exists() {
        "settings: your ~/.claude/settings.json, shown read-only in each session"
    } else {
        "settings: no ~/.claude/settings.json: each session gets permissions.defaultMode \"default\" (tools ask first)"
    };
    vec![endpoint, settings.to_string()]
}

/// What claude-agent-acp 0.101 (the version [`Agent::package`] installs) announces of itself: its `initialize`
/// answer's prompt and session capabilities and its `session/new` answer's modes (its models come from the account,
/// so only a run says them). A bridge that has not run it yet offers these; what it announces replaces them.
pub fn offers() -> serde_json::Value {
    serde_json::json!({
        "promptCapabilities": {"image": true, "embeddedContext": true},
        "sessionCapabilities": {"additionalDirectories": {}, "close": {}, "delete": {}, "fork": {}, "list": {},
            "resume": {}, "systemPrompt": {"mode": {"override": {}}}},
        "session": {"agent_modes": {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Manual", "description": "Always ask before making changes"},
                {"id": "acceptEdits", "name": "Accept edits", "description": "Automatically accept all file edits"},
                {"id": "plan", "name": "Plan", "description": "Create a plan before making changes"},
                {"id": "auto", "name": "Auto", "description": "Claude handles permission decisions"}
            ]}}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_token_goes_to_its_own_variable_and_a_key_to_the_key_s() {
        assert_eq!(Claude.credential_variable("sk-ant-oat01-abc"), Some("CLAUDE_CODE_OAUTH_TOKEN"));
        assert_eq!(Claude.credential_variable("sk-ant-api03-abc"), Some("ANTHROPIC_API_KEY"));
        assert_eq!(Claude.credential_variable("anything-else"), Some("ANTHROPIC_API_KEY"));
        assert_eq!(Claude.other_credentials(), ["CLAUDE_CODE_OAUTH_TOKEN"]);
    }

    #[test]
    fn only_claudes_variables_reach_it_and_never_is_sandbox() {
        for name in ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_MODEL"] {
            assert!(passes_env(name), "{name}");
        }
        assert!(passes_env("CLAUDE_CODE_USE_BEDROCK"));
        for name in ["IS_SANDBOX", "OPENAI_API_KEY", "ANTHROPIC", "CLAUDE_CONFIG_DIR", "HOME"] {
            assert!(!passes_env(name), "{name}");
        }
        let env = fixed_env();
        assert!(!env.iter().any(|(name, _)| name == "IS_SANDBOX"));
        assert!(env.contains(&("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(), "1".into())));
        assert!(env.contains(&("DISABLE_TELEMETRY".into(), "1".into())));
    }

    #[test]
    fn the_users_settings_are_shown_and_never_their_credentials() {
        let shown = user_config(Path::new("/home/u"), Path::new("/s"));
        assert_eq!(
            shown,
            [
                ("/home/u/.claude/settings.json", "/s/home/.claude/settings.json"),
                ("/home/u/.claude/CLAUDE.md", "/s/home/.claude/CLAUDE.md"),
                ("/home/u/.claude/commands", "/s/home/.claude/commands"),
                ("/home/u/.claude/agents", "/s/home/.claude/agents"),
            ]
            .map(|(host, inside)| (PathBuf::from(host), PathBuf::from(inside)))
        );
        assert!(!shown.iter().any(|(host, _)| host.ends_with(".credentials.json") || host.ends_with(".claude.json")));
    }

    #[test]
    fn without_settings_of_the_users_a_session_gets_ours_written_through_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let (home, state) = (dir.path().join("home"), dir.path().join("state"));
        std::fs::create_dir_all(home.join(".claude")).unwrap();
        std::fs::create_dir_all(state.join("home/.claude")).unwrap();
        // The agent planted a link where the settings go: it is replaced, its target untouched.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "mine").unwrap();
        std::os::unix::fs::symlink(&victim, state.join("home/.claude/settings.json")).unwrap();
        write_default_settings(&home, &state);
        assert_eq!(std::fs::read_to_string(state.join("home/.claude/settings.json")).unwrap(), DEFAULT_SETTINGS);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
        let parsed: serde_json::Value = serde_json::from_str(DEFAULT_SETTINGS).unwrap();
        assert_eq!(parsed["permissions"]["defaultMode"], "default");

        // With the user's own, nothing is written: theirs is shown instead.
        let other = dir.path().join("state2");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(home.join(".claude/settings.json"), "{}").unwrap();
        write_default_settings(&home, &other);
        assert!(!other.join("home/.claude/settings.json").exists());
    }

    #[test]
    fn doctor_says_where_the_model_is_and_which_settings_apply() {
        let dir = tempfile::tempdir().unwrap();
        let lines = doctor_lines(dir.path(), Some("http://127.0.0.1:9/"));
        assert_eq!(lines[0], "model API: http://127.0.0.1:9/ (ANTHROPIC_BASE_URL)");
        assert_eq!(
            lines[1],
            "settings: no ~/.claude/settings.json: each session gets permissions.defaultMode \"default\" (tools ask first)"
        );
        std::fs::create_dir_all(dir.path().join(".claude")).unwrap();
        std::fs::write(dir.path().join(".claude/settings.json"), "{}").unwrap();
        assert_eq!(
            doctor_lines(dir.path(), None)[1],
            "settings: your ~/.claude/settings.json, shown read-only in each session"
        );
        assert_eq!(doctor_lines(dir.path(), None)[0], "model API: api.anthropic.com");
    }
}
