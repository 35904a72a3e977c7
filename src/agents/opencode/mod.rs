//! OpenCode: how to run `opencode run --format json`, and its events.
//!
//! The prompt goes on stdin, then EOF (OpenCode reads a non-TTY stdin to the end and hangs on an open
//! pipe). The session id (`ses_…`) comes from the first event and is passed back with `--session`, from
//! the same directory: OpenCode binds a session to the `PWD` it was created in.

pub mod catalog;
pub mod config;
pub mod credentials;
pub mod events;
pub mod mcp;
pub mod options;
pub mod permissions;
pub mod project;
pub mod providers;
pub mod server;
pub mod translate;

use std::path::{Path, PathBuf};

use serde_json::Value;

use self::catalog::ModelInfo;
use self::providers::ProviderNeeds;
use super::{
    Agent, AgentKind, AgentSettings, Extras, Login, OptionSpec, SlashCommand, TranslateContext, Translator, TurnRequest,
};
use crate::sandbox::package::NpmPackage;

/// OpenCode, as the bridge drives it.
pub struct OpenCode;

/// OpenCode's entry of [`crate::agents::AGENTS`].
pub const AGENT: AgentKind = AgentKind::of(&OpenCode);

/// OpenCode's own settings of the bridge.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct Settings {
    /// Run this executable instead of the installed `opencode` (same argv, stdin and environment).
    #[arg(long, global = true, env = "ACP_SANDBOX_OPENCODE_BIN")]
    pub opencode_bin: Option<PathBuf>,
    /// How OpenCode is driven: a warm `opencode serve` per session (serve), `opencode run` per prompt (run), or
    /// OpenCode's own ACP server per session, the bridge its client (acp). Unset: serve, or acp when
    /// --opencode-bin is an OpenCode 2 (whose ACP server is its only stable surface).
    #[arg(long, global = true, env = "ACP_SANDBOX_OPENCODE_BACKEND", value_enum)]
    pub opencode_backend: Option<Backend>,
    /// Models named by the user's OpenCode config; `opencode models` adds what it can use.
    #[arg(skip)]
    pub models: Vec<ModelInfo>,
    /// The model OpenCode uses when none is chosen (`model` of the user's config).
    #[arg(skip)]
    pub default_model: Option<String>,
    /// What the user's OpenCode config needs: its providers' variables and model endpoints.
    #[arg(skip)]
    pub needs: ProviderNeeds,
}

impl Settings {
    /// How OpenCode is driven: as chosen, else the warm server.
    pub fn backend(&self) -> Backend {
        self.opencode_backend.unwrap_or(Backend::Serve)
    }

    /// Adds what the user's OpenCode config (in `user_config_dir`) says: its models, default model and needs.
    pub fn read_user_config(&mut self, user_config_dir: &Path) {
        let found = config::OpenCodeModels::read(user_config_dir);
        self.models = found.models;
        self.default_model = found.default;
        self.needs = found.needs;
    }
}

/// How OpenCode is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// One warm `opencode serve` per session: live tokens and tool output, permissions, fast follow-ups.
    Serve,
    /// One `opencode run --format json` per prompt.
    Run,
    /// One `opencode acp` per session in its sandbox, the bridge its ACP client: OpenCode's own options, modes and
    /// permissions, as its adapter has them.
    Acp,
}

impl Agent for OpenCode {
    fn id(&self) -> &'static str {
        "opencode"
    }

    fn name(&self) -> &'static str {
        "OpenCode"
    }

    fn package(&self) -> NpmPackage {
        PACKAGE
    }

    fn bin_override<'a>(&self, settings: &'a AgentSettings) -> Option<&'a PathBuf> {
        settings.opencode.opencode_bin.as_ref()
    }

    fn args(&self, turn: &TurnRequest<'_>) -> Vec<String> {
        args(turn)
    }

    fn translator(&self, context: TranslateContext) -> Box<dyn Translator> {
        Box::new(translate::OpenCodeTranslator::new(context))
    }

    fn session_missing(&self, stderr: &str) -> bool {
        session_missing(stderr)
    }

    fn passes_env(&self, name: &str) -> bool {
        passes_env(name)
    }

    fn fixed_env(&self) -> Vec<(String, String)> {
        fixed_env()
    }

    fn turn_env(&self, session_config: &Value, extras: &Extras<'_>, state_dir: &Path, env: &mut Vec<(String, String)>) {
        // `run` takes no session rules: plan mode's are the configuration's, for every agent of the turn.
        let plan = options::agent(session_config) == Some("plan");
        permissions::set_env(env, "OPENCODE_PERMISSION", |user| permissions::run_permission(plan, extras.roots, user));
        if let Err(e) = mcp::run_env(extras, state_dir, env) {
            // The user's own OPENCODE_CONFIG_CONTENT is not one OpenCode reads either: it says so when it starts.
            tracing::warn!("the editor's MCP servers and system prompt are not given to OpenCode: {e}");
        }
    }

    fn turn_files(&self, extras: &Extras<'_>) -> Vec<(PathBuf, Vec<u8>)> {
        mcp::run_files(extras)
    }

    fn takes_system_prompt(&self) -> bool {
        true
    }

    fn takes_mcp_servers(&self) -> bool {
        true
    }

    fn service_hosts(&self) -> &'static [&'static str] {
        providers::SERVICE_HOSTS
    }

    fn user_config(&self, user_config_dir: &Path, user_data_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
        user_config(user_config_dir, user_data_dir, state_dir)
    }

    fn shipped_config(&self, executable: &Path, user_config_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
        plugin_package(executable, user_config_dir, state_dir)
    }

    fn companion(&self, executable: &Path, user_config_dir: &Path) -> Option<&'static str> {
        plugin_wanted(executable, user_config_dir).then_some(PLUGIN_PACKAGE)
    }

    fn companion_config(&self, dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
        plugin_copy(dir, state_dir)
    }

    fn credential_files(&self) -> &'static [&'static str] {
        CREDENTIAL_FILES
    }

    fn credentials_line(&self) -> String {
        "credentials: its providers' keys, the API logins of auth.json and its Anthropic and GitHub Copilot OAuth \
         logins stay with the bridge (model gateway; the agent holds placeholders, the bridge refreshes the logins); \
         its ChatGPT and other OAuth logins, and a key you wrote in opencode.json, enter as they are"
            .into()
    }

    fn keep_credentials(
        &self,
        settings: &AgentSettings,
        keep: &mut crate::sandbox::net::gateway::Keep<'_>,
        env: &mut Vec<(String, String)>,
        read_only: &mut Vec<(PathBuf, PathBuf)>,
    ) {
        credentials::keep(&settings.opencode.needs, &crate::paths::user_data_dir(), keep, env, read_only);
    }

    fn credential_env(&self, user_data_dir: &Path) -> Vec<(String, String)> {
        credential_env(user_data_dir)
    }

    fn login(&self) -> Login {
        Login::Own { args: &["auth", "login"] }
    }

    fn logged_in(&self, settings: &AgentSettings, login_command: &str) -> Result<(), String> {
        if providers::configured(&settings.opencode.needs, &crate::paths::user_data_dir()) {
            return Ok(());
        }
        Err(format!(
            "OpenCode has no provider login: run `{login_command}` (or `opencode auth login`) in a terminal, or set your provider's API key (e.g. ANTHROPIC_API_KEY) in the agent server's env, then try again"
        ))
    }

    fn commands(&self, user_config_dir: &Path, workspace: &Path) -> Vec<SlashCommand> {
        commands(user_config_dir, workspace)
    }

    fn accepts_images(&self) -> bool {
        true
    }

    fn options(&self, session_config: &Value, settings: &AgentSettings, models: &[ModelInfo]) -> Vec<OptionSpec> {
        options::specs(session_config, settings, models)
    }

    fn default_option(&self) -> &'static str {
        "model"
    }

    fn mode_description(&self, mode: &str) -> Option<&'static str> {
        options::MODES.iter().find(|(id, _, _)| *id == mode).map(|(_, _, about)| *about)
    }

    fn chosen_model<'a>(&self, session_config: &'a Value) -> Option<&'a str> {
        Some(options::model(session_config).unwrap_or(super::options::DEFAULT))
    }

    fn default_model<'a>(&self, settings: &'a AgentSettings) -> Option<&'a str> {
        settings.opencode.default_model.as_deref()
    }

    fn newest_major(&self, settings: &AgentSettings) -> Option<u64> {
        // OpenCode 2 replaced the server API and moved `run` onto a server (which could run tools outside the
        // sandbox); its ACP server is its stable surface, which the `acp` backend drives whatever the version.
        (settings.opencode.backend() != Backend::Acp).then_some(1)
    }

    fn drive_newer_major(&self, settings: &mut AgentSettings, major: u64) -> Option<String> {
        if settings.opencode.opencode_backend.is_some() {
            return None;
        }
        settings.opencode.opencode_backend = Some(Backend::Acp);
        Some(format!(
            "OpenCode {major}.x is driven through its own ACP server (`opencode acp`), its only stable surface"
        ))
    }

    fn newer_major_hint(&self) -> Option<&'static str> {
        Some("or drive it through its own ACP server: --opencode-backend acp")
    }

    fn provider_env(
        &self,
        settings: &AgentSettings,
        providers: &mut dyn Iterator<Item = &str>,
    ) -> std::collections::BTreeSet<String> {
        settings.opencode.needs.env_names(providers)
    }

    fn model_endpoints(&self, settings: &AgentSettings) -> Vec<(String, u16)> {
        settings.opencode.needs.endpoints.iter().cloned().collect()
    }

    fn says_unknown_model(&self, message: &str) -> bool {
        message.starts_with("Unexpected server error") || message.starts_with("Model not found")
    }

    fn serves(&self, settings: &AgentSettings) -> bool {
        matches!(settings.opencode.backend(), Backend::Serve | Backend::Acp)
    }

    fn model_listing(&self) -> Option<crate::agents::ModelListing> {
        Some(crate::agents::ModelListing {
            args: catalog::LIST_ARGS,
            parse: catalog::parse,
            env: |settings| {
                let mut names = settings.opencode.needs.env_names(std::iter::empty());
                names.extend(providers::all_provider_env().into_iter().map(String::from));
                names
            },
            cache: "opencode-models.json",
        })
    }

    fn configured_models(&self, settings: &AgentSettings) -> Vec<ModelInfo> {
        settings.opencode.models.clone()
    }

    fn service(
        &self,
        settings: &AgentSettings,
        bounds: &crate::agents::host::ServiceSettings,
    ) -> Option<std::sync::Arc<dyn crate::agents::host::Service>> {
        match settings.opencode.backend() {
            Backend::Serve => Some(std::sync::Arc::new(server::Warm::new(bounds))),
            Backend::Acp => Some(crate::agents::acp::service(self.name(), vec!["acp".to_string()], bounds, None)),
            Backend::Run => None,
        }
    }

    fn describe_backend(&self, settings: &AgentSettings, server: Result<&str, &str>) -> Option<String> {
        Some(match (settings.opencode.backend(), server) {
            (Backend::Serve, Ok(how)) => format!("serve: a warm `opencode serve` per {how}"),
            (Backend::Serve, Err(why)) => format!("run: one `opencode run` per prompt (a warm `opencode serve` {why})"),
            (Backend::Run, _) => "run: one `opencode run` per prompt".to_string(),
            (Backend::Acp, _) => {
                "acp: one `opencode acp` per session in its sandbox, acp-sandbox its ACP client".to_string()
            }
        })
    }

    fn doctor_lines(&self, settings: &AgentSettings, cli_model: Option<&str>) -> Vec<String> {
        let model = match (cli_model, &settings.opencode.default_model) {
            (Some(model), _) => format!("{model} (--model)"),
            (None, Some(model)) => format!("{model} (the `model` of your OpenCode config)"),
            (None, None) => "OpenCode's own choice (no --model, and no `model` in your OpenCode config)".to_string(),
        };
        let logins = config::read_opencode_config(&crate::paths::user_data_dir().join("opencode").join("auth.json"));
        let providers = providers::found(&settings.opencode.needs, logins.as_ref());
        let providers = if providers.is_empty() {
            "providers: none found in your OpenCode config, its logins or the environment: run `opencode auth login`, \
             or set a provider's key (e.g. ANTHROPIC_API_KEY)"
                .to_string()
        } else {
            format!("providers: {}", providers.join(", "))
        };
        vec![format!("model: {model}"), providers]
    }
}

/// The pinned npm package installed on first use.
pub const PACKAGE: NpmPackage = NpmPackage {
    name: "opencode-ai",
    version: "1.18.33",
    bin: "opencode",
    postinstall: Some("postinstall.mjs"),
    companions: &[PLUGIN_PACKAGE],
};

/// The package OpenCode wants in every config dir before it loads a plugin (the warm server's guard is one).
pub const PLUGIN_PACKAGE: &str = "@opencode-ai/plugin";

/// The argv after the executable.
pub fn args(turn: &TurnRequest<'_>) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--format", "json", "--auto", "--thinking"].map(String::from).to_vec();
    if let Some(model) = options::model(turn.options) {
        args.extend(["--model".to_string(), model.to_string()]);
    }
    if let Some(variant) = options::variant(turn.options) {
        args.extend(["--variant".to_string(), variant.to_string()]);
    }
    // The session's mode is one of OpenCode's primary agents (build, plan).
    if let Some(agent) = super::options::stored(turn.options, "mode") {
        args.extend(["--agent".to_string(), agent.to_string()]);
    }
    match (turn.native_id, turn.fork_of) {
        (Some(session), _) => args.extend(["--session".to_string(), session.to_string()]),
        // A fork's first run forks the original's conversation (the same sandbox holds it).
        (None, Some(original)) => args.extend(["--session".to_string(), original.to_string(), "--fork".to_string()]),
        (None, None) => {}
    }
    if let Some(command) = turn.command {
        // The prompt on stdin becomes the command's arguments.
        args.extend(["--command".to_string(), command.to_string()]);
    }
    for file in turn.files {
        args.extend(["--file".to_string(), file.display().to_string()]);
    }
    args
}

/// Whether a variable of the user's environment reaches OpenCode by its name alone: its own settings. Provider
/// credentials are passed by exact name ([`providers`]), never by a pattern such as `*_API_KEY`.
pub fn passes_env(name: &str) -> bool {
    name.starts_with("OPENCODE_")
}

/// Fixed variables: no self-update inside a sandbox.
pub fn fixed_env() -> Vec<(String, String)> {
    vec![("OPENCODE_DISABLE_AUTOUPDATE".into(), "1".into())]
}

/// The user's OpenCode configuration and credentials, shown read-only inside the session's state dir.
pub fn user_config(user_config_dir: &Path, user_data_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    vec![
        (user_config_dir.join("opencode"), state_dir.join("config").join("opencode")),
        (user_data_dir.join("opencode").join("auth.json"), state_dir.join("data").join("opencode").join("auth.json")),
    ]
}

/// The plugin package and the manifest that lists it, from the npm prefix the executable was installed into,
/// shown in the session's config dir when the user's own config dir has no packages of its own.
///
/// Before it loads any plugin OpenCode waits until each of its config dirs has `@opencode-ai/plugin` (its
/// `package-lock.json` must name it), and installs it from npm where it is missing: 64 MiB and 15 s for every new
/// session, whose config dir is its own, or three retries over 75 s where the sandbox cannot reach npm. The bridge's
/// install of the CLI brings that package beside it ([`PACKAGE`]); any other OpenCode gets a copy of the tools cache
/// ([`plugin_wanted`]). Either way every session shares one read-only copy.
pub fn plugin_package(executable: &Path, user_config_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    if users_own_packages(user_config_dir) {
        return Vec::new();
    }
    install_prefix(executable).map(|prefix| shown_packages(&prefix, state_dir)).unwrap_or_default()
}

/// Whether this OpenCode needs the plugin package from elsewhere: its own install does not bring it (one found on
/// PATH, a standalone binary) and the user's config dir has no packages of its own.
pub fn plugin_wanted(executable: &Path, user_config_dir: &Path) -> bool {
    !users_own_packages(user_config_dir) && install_prefix(executable).is_none()
}

/// The packages of `dir`, a copy of the plugin package installed for this OpenCode's version, as
/// [`plugin_package`] shows them; nothing when it is not a whole copy.
pub fn plugin_copy(dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    if !dir.join("node_modules").join(PLUGIN_PACKAGE).join("package.json").is_file()
        || !lock_names(&dir.join("package-lock.json"), PLUGIN_PACKAGE)
    {
        return Vec::new();
    }
    shown_packages(dir, state_dir)
}

/// Whether the user's own OpenCode config dir has packages: those are theirs, and OpenCode installs them as it would
/// without the bridge.
fn users_own_packages(user_config_dir: &Path) -> bool {
    let users = user_config_dir.join("opencode");
    ["node_modules", "package.json", "package-lock.json", "bun.lock"].iter().any(|name| users.join(name).exists())
}

/// The npm prefix the executable was installed into, when it holds the plugin package and its lockfile names it.
fn install_prefix(executable: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(executable).unwrap_or_else(|_| executable.to_path_buf());
    real.ancestors()
        .skip(1)
        .find(|dir| {
            dir.join("node_modules").join(PLUGIN_PACKAGE).join("package.json").is_file()
                && lock_names(&dir.join("package-lock.json"), PLUGIN_PACKAGE)
        })
        .map(Path::to_path_buf)
}

/// The packages of an npm prefix, shown in the session's config dir.
fn shown_packages(prefix: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let target = state_dir.join("config").join("opencode");
    ["node_modules", "package.json", "package-lock.json"]
        .into_iter()
        .map(|name| (prefix.join(name), target.join(name)))
        .collect()
}

/// Whether the lockfile at `path` lists `package` as a direct dependency (what OpenCode checks).
fn lock_names(path: &Path, package: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else { return false };
    serde_json::from_str::<serde_json::Value>(&text)
        .is_ok_and(|lock| lock["packages"][""]["dependencies"].get(package).is_some())
}

/// OpenCode's logins (`opencode auth login`) and its MCP servers' OAuth tokens.
pub const CREDENTIAL_FILES: &[&str] = &["auth.json", "mcp-auth.json"];

/// The user's `auth.json` as `OPENCODE_AUTH_CONTENT`, which OpenCode reads instead of the file (1.18 does).
pub fn credential_env(user_data_dir: &Path) -> Vec<(String, String)> {
    match std::fs::read_to_string(user_data_dir.join("opencode").join("auth.json")) {
        Ok(text) if !text.trim().is_empty() => vec![("OPENCODE_AUTH_CONTENT".into(), text)],
        _ => Vec::new(),
    }
}

/// Whether stderr says the `--session` we passed is gone (the state dir was lost).
pub fn session_missing(stderr: &str) -> bool {
    stderr.contains("Session not found")
}

/// OpenCode's commands: its built-ins, then the user's (`command` in `opencode.json`, Markdown files in
/// `command/` or `commands/` of the user's config dir and of the workspace's `.opencode/`). Later
/// definitions of a name replace earlier ones, as in OpenCode.
pub fn commands(user_config_dir: &Path, workspace: &Path) -> Vec<SlashCommand> {
    let mut commands = vec![
        SlashCommand { name: "init".into(), description: "guided AGENTS.md setup".into(), hint: None },
        SlashCommand {
            name: "review".into(),
            description: "review changes [commit|branch|pr], defaults to uncommitted".into(),
            hint: Some("commit|branch|pr".into()),
        },
    ];
    let mut add = |command: SlashCommand| {
        commands.retain(|existing| existing.name != command.name);
        commands.push(command);
    };
    for dir in [user_config_dir.join("opencode"), workspace.join(".opencode")] {
        for name in ["opencode.json", "opencode.jsonc"] {
            let Some(config) = config::read_opencode_config(&dir.join(name)) else { continue };
            for (name, body) in config.get("command").and_then(|c| c.as_object()).into_iter().flatten() {
                let description = body.get("description").and_then(|d| d.as_str()).unwrap_or("custom command");
                add(SlashCommand { name: name.clone(), description: description.to_string(), hint: None });
            }
        }
        for sub in ["command", "commands"] {
            let Ok(entries) = std::fs::read_dir(dir.join(sub)) else { continue };
            let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for file in files {
                if file.extension().and_then(|e| e.to_str()) != Some("md") {
                    continue;
                }
                let Some(name) = file.file_stem().and_then(|s| s.to_str()) else { continue };
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                let description = front_matter(&text, "description").unwrap_or_else(|| "custom command".into());
                add(SlashCommand { name: name.to_string(), description, hint: None });
            }
        }
    }
    commands
}

/// A `key: value` of a Markdown file's front matter.
fn front_matter(text: &str, key: &str) -> Option<String> {
    let body = text.strip_prefix("---")?;
    let end = body.find("\n---")?;
    body[..end].lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name.trim() == key).then(|| value.trim().trim_matches('"').trim_matches('\'').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_package_of_the_install_is_shown_unless_the_user_has_packages() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("tools/opencode-ai@1");
        let bin = prefix.join("node_modules/opencode-linux-x64/bin/opencode");
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        std::fs::write(&bin, "").unwrap();
        let user = dir.path().join("config");
        std::fs::create_dir_all(user.join("opencode")).unwrap();
        let state = dir.path().join("state");
        // No plugin package in the prefix: nothing.
        assert_eq!(plugin_package(&bin, &user, &state), vec![]);
        std::fs::create_dir_all(prefix.join("node_modules/@opencode-ai/plugin")).unwrap();
        std::fs::write(prefix.join("node_modules/@opencode-ai/plugin/package.json"), "{}").unwrap();
        // A lockfile that does not name it would make OpenCode install it anyway.
        std::fs::write(prefix.join("package-lock.json"), r#"{"packages":{"":{"dependencies":{"opencode-ai":"1"}}}}"#)
            .unwrap();
        assert_eq!(plugin_package(&bin, &user, &state), vec![]);
        let lock = r#"{"packages":{"":{"dependencies":{"opencode-ai":"1","@opencode-ai/plugin":"1"}}}}"#;
        std::fs::write(prefix.join("package-lock.json"), lock).unwrap();
        let prefix = prefix.canonicalize().unwrap();
        let target = state.join("config/opencode");
        assert_eq!(
            plugin_package(&bin, &user, &state),
            ["node_modules", "package.json", "package-lock.json"].map(|name| (prefix.join(name), target.join(name)))
        );
        assert!(!plugin_wanted(&bin, &user));
        // An OpenCode elsewhere (on PATH, a standalone binary) wants the tools cache's copy, shown once it is whole.
        let own = dir.path().join("bin/opencode");
        std::fs::create_dir_all(own.parent().unwrap()).unwrap();
        std::fs::write(&own, "").unwrap();
        assert_eq!(plugin_package(&own, &user, &state), vec![]);
        assert!(plugin_wanted(&own, &user));
        assert_eq!(plugin_copy(&dir.path().join("tools/none"), &state), vec![]);
        assert_eq!(
            plugin_copy(&prefix, &state),
            ["node_modules", "package.json", "package-lock.json"].map(|name| (prefix.join(name), target.join(name)))
        );
        // The user's own packages are theirs: OpenCode installs those as it would without the bridge.
        std::fs::write(user.join("opencode/package.json"), "{}").unwrap();
        assert_eq!(plugin_package(&bin, &user, &state), vec![]);
        assert!(!plugin_wanted(&own, &user));
    }

    #[test]
    fn a_lost_session_is_recognized_in_the_real_stderr() {
        let stderr = include_str!("../../../tests/fixtures/opencode/opencode-session-notfound.stderr.txt");
        assert!(session_missing(stderr), "{stderr:?}");
        assert!(!session_missing("Error: fake upstream error"));
    }

    #[test]
    fn only_its_own_settings_reach_opencode_by_name_alone() {
        assert!(passes_env("OPENCODE_CONFIG"));
        for name in ["ANTHROPIC_API_KEY", "STRIPE_API_KEY", "MY_API_TOKEN", "AWS_SECRET_ACCESS_KEY", "GOOGLE_X", "HOME"]
        {
            assert!(!passes_env(name), "{name}");
        }
    }

    #[test]
    fn commands_are_the_builtins_plus_the_users_and_the_projects() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        let workspace = dir.path().join("ws");
        std::fs::create_dir_all(config.join("opencode/command")).unwrap();
        std::fs::create_dir_all(workspace.join(".opencode/commands")).unwrap();
        std::fs::write(
            config.join("opencode/opencode.json"),
            r#"{"command": {"test": {"template": "run the tests", "description": "Run tests"}}}"#,
        )
        .unwrap();
        std::fs::write(config.join("opencode/command/fix.md"), "---\ndescription: Fix the build\n---\nFix it").unwrap();
        std::fs::write(workspace.join(".opencode/commands/test.md"), "no front matter").unwrap();
        let names: Vec<(String, String)> =
            commands(&config, &workspace).into_iter().map(|c| (c.name, c.description)).collect();
        assert_eq!(
            names,
            [
                ("init".to_string(), "guided AGENTS.md setup".to_string()),
                ("review".into(), "review changes [commit|branch|pr], defaults to uncommitted".into()),
                ("fix".into(), "Fix the build".into()),
                ("test".into(), "custom command".into()),
            ]
        );
    }

    #[test]
    fn commands_of_a_jsonc_config_with_block_comments_and_trailing_commas_are_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws/.opencode")).unwrap();
        std::fs::write(
            dir.path().join("ws/.opencode/opencode.jsonc"),
            "{\n  /* team commands */\n  \"command\": {\n    \"deploy\": { \"description\": \"Ship it\", }, // prod\n  },\n}\n",
        )
        .unwrap();
        let found = commands(&dir.path().join("no-config"), &dir.path().join("ws"));
        assert!(found.iter().any(|c| c.name == "deploy" && c.description == "Ship it"), "{found:?}");
    }
}
