//! Codex through its ACP adapter (`@agentclientprotocol/codex-acp`, a node program that starts `codex app-server`
//! from `@openai/codex`): the adapter runs in the session's sandbox, one process per session; the bridge is its ACP
//! client (`agents::acp`). This folder says only what is Codex's own: its package, its key, its configuration.
//!
//! What running the real package taught (docs/notes/acp-agents.md): Codex keeps its state in `CODEX_HOME`
//! (`~/.codex`, here in the session's HOME: the state dir, never /tmp, where Codex refuses to make the helper its
//! own sandbox needs); a local endpoint needs a `model_providers` entry with `wire_api = "responses"`; the adapter
//! takes its configuration as JSON in `CODEX_CONFIG` (the provider becomes `-c` overrides of `codex app-server`),
//! and its first mode from `INITIAL_AGENT_MODE`.

pub mod credentials;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::host::{Service, ServiceSettings};
use super::{Agent, AgentKind, AgentSettings, Keeps, Login, LoginFile, OwnLogin, TranslateContext, Translator};
use crate::sandbox::package::NpmPackage;

/// Codex, as the bridge drives it.
pub struct Codex;

/// Codex's entry of [`crate::agents::AGENTS`].
pub const AGENT: AgentKind = AgentKind::of(&Codex);

/// Codex's own settings of the bridge.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct Settings {
    /// Run this executable instead of the installed `codex-acp` (an ACP agent on stdio, same environment).
    #[arg(long, global = true, env = "ACP_SANDBOX_CODEX_BIN")]
    pub codex_bin: Option<PathBuf>,
}

/// The pinned adapter. It depends on `@openai/codex ^0.166.0`, which npm resolves to a 0.166 patch release; a
/// companion would be installed at the adapter's own version (2.6.0), which `@openai/codex` has not, so the install
/// script's exact 0.166.0 pin is left to npm's range here.
pub const PACKAGE: NpmPackage = NpmPackage {
    name: "@agentclientprotocol/codex-acp",
    version: "2.6.0",
    bin: "codex-acp",
    postinstall: None,
    companions: &[],
};

/// The credential Codex needs: the key of its model provider (the one [`codex_config`] names).
pub const CREDENTIAL: &str = "OPENAI_API_KEY";

/// The variable that points Codex at another OpenAI-compatible endpoint (a local one included).
pub const BASE_URL: &str = "OPENAI_BASE_URL";

/// Its key, kept by the bridge: Codex sends it to its provider's `base_url`.
const GATEWAY: &[crate::agents::GatewayCredential] =
    &[crate::agents::GatewayCredential { variables: &[CREDENTIAL], base_url: BASE_URL, upstream: OPENAI_API }];

/// The bridge's variable that names the model Codex starts with (Codex has none of its own, and the editor's model
/// choice does not reach an ACP agent yet): read where [`fixed_env`] is made, which sees no flags, so a variable
/// only. Without it Codex picks its own default.
pub const MODEL: &str = "ACP_SANDBOX_CODEX_MODEL";

/// The bridge's variable that sends Codex's ChatGPT sign-in to another login server (its `--experimental_issuer`,
/// e.g. a test's fake of auth.openai.com).
pub const ISSUER: &str = "ACP_SANDBOX_CODEX_ISSUER";

/// OpenAI's API, and where its keys and ChatGPT logins are made.
pub const SERVICE_HOSTS: &[&str] = &["api.openai.com", "auth.openai.com", "chatgpt.com"];

/// Where models are served without [`BASE_URL`].
const OPENAI_API: &str = "https://api.openai.com/v1";

/// The name of the provider the bridge configures.
const PROVIDER: &str = "acp-sandbox";

/// The mode a session starts in: full access (approval "never", no sandbox of Codex's own).
///
/// Our sandbox is the boundary. Codex's own modes (read-only, workspace-write, and "agent", whose escalations go to
/// an LLM reviewer) run every command in a bubblewrap of Codex's own, and that cannot start inside ours:
/// bubblewrap here runs with `--disable-userns`, so no process in the session's sandbox can make the user
/// namespace a second bubblewrap needs, and every command would fail. Full access runs the commands directly, in
/// our sandbox; under `--sandbox none` that means unconfined, as the bridge says for that setting.
pub const INITIAL_MODE: &str = "agent-full-access";

/// Files of `~/.codex` that hold credentials: never shown, never copied.
pub const CREDENTIAL_FILES: &[&str] = &["auth.json"];

/// The user's own Codex configuration shown read-only in the session's `CODEX_HOME` (names under `~/.codex`): their
/// instructions and prompts. Not `config.toml`: Codex writes it (trust, migrations) and the bridge configures the
/// provider itself.
const USER_CONFIG: &[&str] = &["AGENTS.md", "prompts"];

/// Whether a variable of the user's environment reaches Codex: its key and endpoint only (`CODEX_HOME` and the
/// adapter's own knobs are the bridge's).
pub fn passes_env(name: &str) -> bool {
    name == CREDENTIAL || name == BASE_URL
}

/// Codex's configuration for the adapter's `CODEX_CONFIG`: one provider, at `base_url` (OpenAI's when `None`), on
/// the Responses API, with the key from [`CREDENTIAL`], and `model` when given; no update checks, analytics,
/// feedback, telemetry or plugin and app fetches (without these it reaches chatgpt.com and github.com at every
/// start).
pub fn codex_config(base_url: Option<&str>, model: Option<&str>) -> Value {
    let base_url = base_url.map(str::trim).filter(|url| !url.is_empty()).unwrap_or(OPENAI_API);
    let mut config = json!({
        "model_provider": PROVIDER,
        "model_providers": {
            PROVIDER: {
                "name": "OpenAI (through acp-sandbox)",
                "base_url": base_url,
                "wire_api": "responses",
                "env_key": CREDENTIAL,
            }
        },
        "check_for_update_on_startup": false,
        "analytics": {"enabled": false},
        "feedback": {"enabled": false},
        "otel": {"exporter": "none"},
        "features": {"plugins": false, "plugin_discovery_prefetch": false, "remote_plugin": false, "apps": false},
    });
    if let Some(model) = model.map(str::trim).filter(|model| !model.is_empty()) {
        config["model"] = json!(model);
    }
    config
}

/// Codex's configuration for a session signed in with ChatGPT ([`own_login`]): its own OpenAI provider, which
/// sends the login's token to ChatGPT's backend (and finds the account's workspace there); with a `base_url`, a
/// provider there that takes the same login (`requires_openai_auth`: a proxy of ChatGPT's Codex API, or a test's
/// fake). The login is read from and refreshed in `auth.json`, never a keyring (there is none in a sandbox).
pub fn chatgpt_config(base_url: Option<&str>, model: Option<&str>) -> Value {
    let mut config = codex_config(base_url, model);
    match base_url.map(str::trim).filter(|url| !url.is_empty()) {
        Some(_) => {
            let provider = &mut config["model_providers"][PROVIDER];
            provider["name"] = json!("ChatGPT (through acp-sandbox)");
            provider.as_object_mut().map(|provider| provider.remove("env_key"));
            provider["requires_openai_auth"] = json!(true);
        }
        None => {
            config.as_object_mut().map(|config| config.remove("model_providers"));
            config["model_provider"] = json!("openai");
        }
    }
    config["forced_login_method"] = json!("chatgpt");
    config["cli_auth_credentials_store"] = json!("file");
    config
}

/// Codex's own ChatGPT sign-in by device code (`codex login --device-auth`: a code to enter at a URL, no redirect
/// to a local port), through `issuer` when given; sessions then run with [`chatgpt_config`].
pub fn own_login(issuer: Option<&str>, base_url: Option<&str>, model: Option<&str>) -> OwnLogin {
    let mut args = vec!["login".to_string(), "--device-auth".to_string()];
    if let Some(issuer) = issuer.map(str::trim).filter(|issuer| !issuer.is_empty()) {
        args.extend(["--experimental_issuer".to_string(), issuer.to_string()]);
    }
    OwnLogin {
        with: "ChatGPT",
        program: Some("codex"),
        args,
        keeps: Keeps::File(LoginFile {
            home_variable: "CODEX_HOME",
            file: "auth.json",
            inside: ".codex/auth.json",
            env: vec![("CODEX_CONFIG".into(), chatgpt_config(base_url, model).to_string())],
        }),
    }
}

/// Fixed variables, given the user's [`BASE_URL`] and [`MODEL`].
pub fn fixed_env(base_url: Option<&str>, model: Option<&str>) -> Vec<(String, String)> {
    vec![
        ("CODEX_CONFIG".into(), codex_config(base_url, model).to_string()),
        ("INITIAL_AGENT_MODE".into(), INITIAL_MODE.into()),
        ("CODEX_ACP_PROMPT_SUGGESTIONS".into(), "false".into()),
        ("NO_BROWSER".into(), "1".into()),
    ]
}

/// The user's `~/.codex` entries of [`USER_CONFIG`], each shown at the same place of the session's `~/.codex`.
pub fn user_config(codex_home: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    USER_CONFIG.iter().map(|name| (codex_home.join(name), state_dir.join("home").join(".codex").join(name))).collect()
}

/// The user's own `CODEX_HOME` (`~/.codex` unless they moved it).
fn users_codex_home() -> PathBuf {
    std::env::var_os("CODEX_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::paths::home().join(".codex"))
}

/// The bridge's variable `name`, when set to something.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.trim().is_empty())
}

impl Agent for Codex {
    fn id(&self) -> &'static str {
        "codex"
    }

    fn name(&self) -> &'static str {
        "Codex"
    }

    fn package(&self) -> NpmPackage {
        PACKAGE
    }

    fn bin_override<'a>(&self, settings: &'a AgentSettings) -> Option<&'a PathBuf> {
        settings.codex.codex_bin.as_ref()
    }

    fn translator(&self, context: TranslateContext) -> Box<dyn Translator> {
        super::acp::translator(context)
    }

    fn passes_env(&self, name: &str) -> bool {
        passes_env(name)
    }

    fn fixed_env(&self) -> Vec<(String, String)> {
        fixed_env(var(BASE_URL).as_deref(), var(MODEL).as_deref())
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

    fn credentials_line(&self) -> String {
        format!(
            "credentials: {CREDENTIAL} and a ChatGPT login (`--own`) stay with the bridge (model gateway; the agent \
             holds placeholders, the bridge refreshes the login)"
        )
    }

    fn keep_own_login(
        &self,
        shown: &(PathBuf, PathBuf),
        keep: &mut crate::sandbox::net::gateway::Keep<'_>,
        env: &mut Vec<(String, String)>,
    ) -> bool {
        credentials::keep_chatgpt(shown, keep, env)
    }

    fn point_at_gateway(
        &self,
        credential: &crate::agents::GatewayCredential,
        url: &str,
        env: &mut Vec<(String, String)>,
    ) {
        env.retain(|(name, _)| name != credential.base_url);
        env.push((credential.base_url.to_string(), url.to_string()));
        // Codex reads its provider's URL from its config, which the fixed variables made from the real one.
        for (_, value) in env.iter_mut().filter(|(name, _)| name == "CODEX_CONFIG") {
            if let Ok(mut config) = serde_json::from_str::<Value>(value)
                && let Some(provider) = config.pointer_mut(&format!("/model_providers/{PROVIDER}"))
            {
                provider["base_url"] = json!(url);
                *value = config.to_string();
            }
        }
    }

    fn user_config(&self, _user_config_dir: &Path, _user_data_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
        user_config(&users_codex_home(), state_dir)
    }

    fn required_credential(&self) -> Option<&'static str> {
        Some(CREDENTIAL)
    }

    fn credential_files(&self) -> &'static [&'static str] {
        CREDENTIAL_FILES
    }

    fn login(&self) -> Login {
        Login::Token { page: "https://platform.openai.com/api-keys" }
    }

    fn own_login(&self) -> Option<OwnLogin> {
        Some(own_login(var(ISSUER).as_deref(), var(BASE_URL).as_deref(), var(MODEL).as_deref()))
    }

    fn serves(&self, _settings: &AgentSettings) -> bool {
        true
    }

    fn service(&self, _settings: &AgentSettings, bounds: &ServiceSettings) -> Option<Arc<dyn Service>> {
        Some(super::acp::service(self.name(), Vec::new(), bounds, Some(offers())))
    }

    fn describe_backend(&self, _settings: &AgentSettings, _server: Result<&str, &str>) -> Option<String> {
        Some(format!(
            "runs `{}` {} (ACP, with `codex app-server`), one process per session in its sandbox, in {INITIAL_MODE} \
             mode (the session's sandbox is the boundary); the bridge is its ACP client",
            PACKAGE.bin, PACKAGE.version
        ))
    }

    fn doctor_lines(&self, _settings: &AgentSettings, _cli_model: Option<&str>) -> Vec<String> {
        doctor_lines(var(BASE_URL).as_deref(), var(MODEL).as_deref())
    }
}

/// `doctor`'s lines: where the model calls go, and which model Codex starts with.
pub fn doctor_lines(base_url: Option<&str>, model: Option<&str>) -> Vec<String> {
    vec![
        match base_url {
            Some(url) => format!("model API: {url} ({BASE_URL}, Responses API, key {CREDENTIAL})"),
            None => format!(
                "model API: {OPENAI_API} with a key, ChatGPT's backend when signed in with ChatGPT (set {BASE_URL} \
                 for another endpoint; key {CREDENTIAL})"
            ),
        },
        match model {
            Some(model) => format!("model: {model} ({MODEL})"),
            None => format!("model: Codex's own default (set {MODEL} to choose)"),
        },
    ]
}

/// What codex-acp 2.6 (the version [`Agent::package`] installs) announces of itself: its `initialize` answer's prompt
/// and session capabilities and its `session/new` answer's modes, in [`INITIAL_MODE`] (its models come from the
/// account, so only a run says them). A bridge that has not run it yet offers these; what it announces replaces them.
pub fn offers() -> serde_json::Value {
    serde_json::json!({
        "promptCapabilities": {"image": true, "embeddedContext": true},
        "sessionCapabilities": {"resume": {}, "list": {}, "close": {}, "delete": {}, "fork": {}, "title": {},
            "additionalDirectories": {}, "subagents": {}, "systemPrompt": {}},
        "session": {"agent_modes": {"currentModeId": "agent-full-access", "availableModes": [
                {"id": "read-only", "name": "Read-only", "description": "Requires approval to edit files and access the internet."},
                {"id": "workspace-write", "name": "Workspace access", "description": "Edit workspace files; ask before writing outside the workspace or accessing the network."},
                {"id": "agent", "name": "Auto review", "description": "Only ask for actions detected as potentially unsafe"},
                {"id": "agent-full-access", "name": "Full access", "description": "Unrestricted access to the internet and any file on your computer"}
            ]}}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_becomes_the_provider_codex_uses() {
        let config = codex_config(Some("http://127.0.0.1:8080/v1"), Some("gpt-5.5"));
        assert_eq!(config["model"], "gpt-5.5");
        assert_eq!(config["model_provider"], PROVIDER);
        assert_eq!(
            config["model_providers"][PROVIDER],
            json!({
                "name": "OpenAI (through acp-sandbox)",
                "base_url": "http://127.0.0.1:8080/v1",
                "wire_api": "responses",
                "env_key": "OPENAI_API_KEY",
            })
        );
        assert_eq!(codex_config(None, None)["model_providers"][PROVIDER]["base_url"], OPENAI_API);
        assert_eq!(codex_config(Some("  "), Some(" "))["model_providers"][PROVIDER]["base_url"], OPENAI_API);
        assert!(codex_config(None, Some(" ")).get("model").is_none(), "a blank model is Codex's own choice");
        assert_eq!(config["features"]["plugins"], false);
    }

    #[test]
    fn a_chatgpt_login_uses_codexs_own_provider_or_one_at_the_base_url_that_takes_the_login() {
        let own = chatgpt_config(None, None);
        assert_eq!(own["model_provider"], "openai");
        assert_eq!(own.get("model_providers"), None, "no provider of ours asks for a key");
        assert_eq!(
            (&own["forced_login_method"], &own["cli_auth_credentials_store"]),
            (&json!("chatgpt"), &json!("file"))
        );
        let proxy = chatgpt_config(Some("http://127.0.0.1:9/v1"), Some("gpt-5.5"));
        assert_eq!(proxy["model_provider"], PROVIDER);
        assert_eq!(proxy["model"], "gpt-5.5");
        assert_eq!(
            proxy["model_providers"][PROVIDER],
            json!({
                "name": "ChatGPT (through acp-sandbox)",
                "base_url": "http://127.0.0.1:9/v1",
                "wire_api": "responses",
                "requires_openai_auth": true,
            })
        );
        assert_eq!(proxy["features"], codex_config(None, None)["features"], "the same quiet start");
        let login = own_login(Some("http://127.0.0.1:7"), None, None);
        assert_eq!(login.args, ["login", "--device-auth", "--experimental_issuer", "http://127.0.0.1:7"]);
        assert_eq!(own_login(Some(" "), None, None).args, ["login", "--device-auth"]);
        let Keeps::File(file) = login.keeps else { panic!("{:?}", login.keeps) };
        assert_eq!(file.env, [("CODEX_CONFIG".to_string(), chatgpt_config(None, None).to_string())]);
    }

    #[test]
    fn the_environment_sets_the_mode_and_passes_only_the_key_and_endpoint() {
        let env = fixed_env(None, None);
        assert!(env.contains(&("INITIAL_AGENT_MODE".into(), "agent-full-access".into())));
        let config = env.iter().find(|(name, _)| name == "CODEX_CONFIG").map(|(_, value)| value).unwrap();
        assert_eq!(serde_json::from_str::<Value>(config).unwrap(), codex_config(None, None));
        assert!(passes_env("OPENAI_API_KEY") && passes_env("OPENAI_BASE_URL"));
        for name in ["CODEX_HOME", "CODEX_CONFIG", "INITIAL_AGENT_MODE", "ANTHROPIC_API_KEY", "OPENAI_ORG"] {
            assert!(!passes_env(name), "{name}");
        }
    }

    #[test]
    fn the_users_instructions_are_shown_and_never_their_login() {
        let shown = user_config(Path::new("/home/u/.codex"), Path::new("/s"));
        assert_eq!(
            shown,
            [
                ("/home/u/.codex/AGENTS.md", "/s/home/.codex/AGENTS.md"),
                ("/home/u/.codex/prompts", "/s/home/.codex/prompts")
            ]
            .map(|(host, inside)| (PathBuf::from(host), PathBuf::from(inside)))
        );
        assert_eq!(
            doctor_lines(None, Some("gpt-5.5")),
            [
                "model API: https://api.openai.com/v1 with a key, ChatGPT's backend when signed in with ChatGPT (set \
                 OPENAI_BASE_URL for another endpoint; key OPENAI_API_KEY)",
                "model: gpt-5.5 (ACP_SANDBOX_CODEX_MODEL)"
            ]
        );
    }
}
