//! The coding-agent CLIs we drive: what each one needs to run, and the contract of its translator.
//!
//! Every agent lives in its own folder (`amp/`, `opencode/`) with its wire types (`events.rs`), its pure
//! translation to ACP (`translate.rs`), its settings and its `impl Agent` (`mod.rs`). Adding an agent means adding
//! a folder, one line in [`AGENTS`] and one field of [`AgentSettings`] for its flags.

pub mod acp;
pub mod amp;
pub mod claude;
pub mod codex;
pub mod engine;
pub mod gemini;
pub mod host;
pub mod mcp;
pub mod opencode;
pub mod options;
pub mod question;
#[cfg(debug_assertions)]
pub mod scripted;
pub mod settings;
pub mod tools;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_client_protocol::v1::schema::SessionUpdate;
use serde::Serialize;
use serde_json::Value;

pub use self::opencode::catalog::ModelInfo;
pub use self::options::OptionSpec;
pub use self::settings::AgentSettings;
use crate::sandbox::package::NpmPackage;

/// What one turn asks of the CLI beyond the prompt text.
#[derive(Clone, Debug)]
pub struct TurnRequest<'a> {
    /// The CLI conversation to continue (`ses_…`, `T-…`); `None` starts a new one.
    pub native_id: Option<&'a str>,
    /// Without a conversation yet: the one to fork it from (a fork's first run, in the original's sandbox).
    pub fork_of: Option<&'a str>,
    /// The session's stored option choices (model, mode, …: see [`Agent::options`]).
    pub options: &'a Value,
    /// Files attached to the prompt (images), as the CLI sees them.
    pub files: &'a [PathBuf],
    /// A slash command of the CLI to run, the prompt being its arguments.
    pub command: Option<&'a str>,
    /// What the editor gave the session that the agent is configured with.
    pub extras: Extras<'a>,
}

/// What the editor gave a session that the agent is configured with, for one run or one server start: held in
/// memory only (an MCP server's variables and headers are never stored).
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras<'a> {
    /// Instructions beside the agent's own (ACP's `systemPrompt`, append mode).
    pub system_prompt: Option<&'a str>,
    /// The editor's MCP servers.
    pub mcp_servers: &'a [agent_client_protocol::v1::schema::McpServer],
    /// The workspace's other roots (mounted like the workspace; the agent is told they are its project's too).
    pub roots: &'a [String],
}

/// One coding agent, as the bridge drives it: everything about it that is not the same for every agent. The
/// optional parts have defaults (as Zed's `AgentServer` does), so an agent says only what is its own. Implemented
/// once per folder of this module and listed in [`AGENTS`]; the rest of the bridge knows an agent only by this.
pub trait Agent: Send + Sync + 'static {
    /// The stable lower-case name used in the store, on the command line and in logs.
    fn id(&self) -> &'static str;

    /// The name users know the agent by, for titles and messages.
    fn name(&self) -> &'static str;

    /// The npm package that provides the CLI, installed on first use.
    fn package(&self) -> NpmPackage;

    /// The executable the user named to run instead of the installed one (`--<id>-bin`).
    fn bin_override<'a>(&self, settings: &'a AgentSettings) -> Option<&'a PathBuf>;

    /// The setting that names the executable instead of `--<id>-bin`: (its clap id, its flag, its variable).
    fn bin_setting(&self) -> Option<(&'static str, &'static str, &'static str)> {
        None
    }

    /// Whether the agent exists for the tests only (debug builds): hidden from `--help`.
    fn test_only(&self) -> bool {
        false
    }

    /// What is missing or wrong in the agent's settings for the bridge to run it at all (e.g. the custom agent's
    /// command line): the bridge refuses to serve with these words.
    fn settings_problem(&self, _settings: &AgentSettings) -> Option<String> {
        None
    }

    /// The CLI's argv after the executable (none: an agent that speaks ACP gets its arguments from its service).
    fn args(&self, _turn: &TurnRequest<'_>) -> Vec<String> {
        Vec::new()
    }

    /// A fresh translator for one turn of this agent.
    fn translator(&self, context: TranslateContext) -> Box<dyn Translator>;

    /// Whether the CLI's stderr says the conversation we asked it to continue no longer exists.
    fn session_missing(&self, _stderr: &str) -> bool {
        false
    }

    /// Whether a variable of the bridge's environment reaches the CLI by its name (its own settings).
    fn passes_env(&self, name: &str) -> bool;

    /// Variables the bridge always sets for this CLI.
    fn fixed_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Sets what one CLI run of a turn needs in its environment for the session's choices and what the editor
    /// gave it; `state_dir` is the session's state dir as the CLI sees it, where [`Agent::turn_files`] are.
    fn turn_env(
        &self,
        _session_config: &Value,
        _extras: &Extras<'_>,
        _state_dir: &Path,
        _env: &mut Vec<(String, String)>,
    ) {
    }

    /// Files one CLI run needs in the session's state dir (paths relative to it), written before it starts.
    fn turn_files(&self, _extras: &Extras<'_>) -> Vec<(PathBuf, Vec<u8>)> {
        Vec::new()
    }

    /// Whether the agent takes instructions beside its own for a session (ACP's `systemPrompt`).
    fn takes_system_prompt(&self) -> bool {
        false
    }

    /// Whether the agent connects to the editor's MCP servers.
    fn takes_mcp_servers(&self) -> bool {
        false
    }

    /// The domains of the CLI's own service and its model providers: reachable under `--network allow=…`.
    fn service_hosts(&self) -> &'static [&'static str];

    /// The user's own configuration of the CLI: (host path, path inside the session's state dir).
    fn user_config(&self, user_config_dir: &Path, user_data_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)>;

    /// What the CLI's own install brings for its config dir, shown there beside the user's configuration.
    fn shipped_config(
        &self,
        _executable: &Path,
        _user_config_dir: &Path,
        _state_dir: &Path,
    ) -> Vec<(PathBuf, PathBuf)> {
        Vec::new()
    }

    /// An npm package the CLI wants beside it that this executable's own install does not bring (OpenCode's plugin
    /// package, for an OpenCode found on PATH): the bridge installs it once per version of the CLI into the tools
    /// cache, and [`Agent::companion_config`] shows it to every session.
    fn companion(&self, _executable: &Path, _user_config_dir: &Path) -> Option<&'static str> {
        None
    }

    /// What the installed [`Agent::companion`] in `dir` shows in the session's state dir, beside the user's config.
    fn companion_config(&self, _dir: &Path, _state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
        Vec::new()
    }

    /// The credential variable the CLI cannot start without, if any: kept by `acp-sandbox login` when it is not
    /// in the bridge's environment.
    fn required_credential(&self) -> Option<&'static str> {
        None
    }

    /// Other variables of the bridge's environment that log the CLI in instead of [`Agent::required_credential`]
    /// (Claude Code: `CLAUDE_CODE_OAUTH_TOKEN`, a subscription's token), looked at after it, in this order.
    fn other_credentials(&self) -> &'static [&'static str] {
        &[]
    }

    /// The variable that carries a token kept by `acp-sandbox login` to the CLI: [`Agent::required_credential`],
    /// unless the token is one of the [`Agent::other_credentials`] by its form.
    fn credential_variable(&self, _token: &str) -> Option<&'static str> {
        self.required_credential()
    }

    /// Names of files in the user's configuration of the CLI ([`Agent::user_config`]) that hold credentials:
    /// never copied into a remote sandbox, whose CLI gets them through its environment ([`Agent::credential_env`]).
    fn credential_files(&self) -> &'static [&'static str] {
        &[]
    }

    /// The user's stored logins of the CLI as variables of its environment, for a sandbox that does not see the
    /// user's files.
    fn credential_env(&self, _user_data_dir: &Path) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The model credentials of the agent's environment that the bridge keeps (the model gateway,
    /// `sandbox::net::gateway`): in a local sandbox the agent gets a placeholder for each, and its base URL
    /// variable points at the gateway. Empty: the agent's credentials reach it as they are.
    fn gateway_credentials(&self) -> &'static [GatewayCredential] {
        &[]
    }

    /// Points the agent at `url` instead of the upstream of `credential` (the gateway's route): by default its
    /// base URL variable; an agent that also reads the URL elsewhere (Codex: its `CODEX_CONFIG`) says so here.
    fn point_at_gateway(&self, credential: &GatewayCredential, url: &str, env: &mut Vec<(String, String)>) {
        env.retain(|(name, _)| name != credential.base_url);
        env.push((credential.base_url.to_string(), url.to_string()));
    }

    /// `doctor`'s line on which of the agent's model credentials stay with the bridge and which enter a local
    /// sandbox.
    fn credentials_line(&self) -> String {
        let kept: Vec<&str> = self.gateway_credentials().iter().flat_map(|c| c.variables.iter().copied()).collect();
        if kept.is_empty() {
            return "credentials: what --pass-env gives it enters the sandbox as it is (the bridge cannot tell keys)"
                .into();
        }
        let (stay, placeholders) = if kept.len() == 1 { ("stays", "a placeholder") } else { ("stay", "placeholders") };
        format!(
            "credentials: {} {stay} with the bridge (model gateway; the agent holds {placeholders})",
            kept.join(", ")
        )
    }

    /// Keeps the agent's model credentials that are no plain variable of [`Agent::gateway_credentials`] with the
    /// bridge (OpenCode's logins and providers): `keep(name, upstream, held)` registers one on the gateway and
    /// answers its route and placeholder (`None`: no gateway); `read_only` is what the command is shown of the
    /// user's files.
    fn keep_credentials(
        &self,
        _settings: &AgentSettings,
        _keep: &mut crate::sandbox::net::gateway::Keep<'_>,
        _env: &mut Vec<(String, String)>,
        _read_only: &mut Vec<(PathBuf, PathBuf)>,
    ) {
    }

    /// Keeps the agent's own sign-in (`login --own`), whose file would be shown as `shown` (its path, its path
    /// inside), with the bridge instead: `keep` as for [`Agent::keep_credentials`]. Answers whether it did; then the
    /// file is not shown, and the agent has put what it sees instead (placeholders) in its place.
    fn keep_own_login(
        &self,
        _shown: &(PathBuf, PathBuf),
        _keep: &mut crate::sandbox::net::gateway::Keep<'_>,
        _env: &mut Vec<(String, String)>,
    ) -> bool {
        false
    }

    /// How a person logs in to this agent.
    fn login(&self) -> Login;

    /// The agent's own sign-in, which `acp-sandbox login --own` runs instead of storing a key (Codex: ChatGPT),
    /// if it has one that works from a terminal.
    fn own_login(&self) -> Option<OwnLogin> {
        None
    }

    /// Whether the agent has what it needs to log in to its models now, for `authenticate` of an agent that keeps
    /// its own logins; the error says what to do. An agent with a [`Agent::required_credential`] is checked by it.
    fn logged_in(&self, _settings: &AgentSettings, _login_command: &str) -> Result<(), String> {
        Ok(())
    }

    /// The slash commands the CLI runs non-interactively, for the editor's `/` menu.
    fn commands(&self, _user_config_dir: &Path, _workspace: &Path) -> Vec<SlashCommand> {
        Vec::new()
    }

    /// Whether the CLI can take images with a prompt.
    fn accepts_images(&self) -> bool {
        false
    }

    /// Whether it takes a system prompt that replaces its own (ACP's `override` mode), beside
    /// [`Agent::takes_system_prompt`]'s append mode.
    fn replaces_system_prompt(&self) -> bool {
        false
    }

    /// Whether the CLI can take audio with a prompt (an ACP agent's service passes it on where the agent takes it).
    fn accepts_audio(&self) -> bool {
        false
    }

    /// The session's config options (model, mode, …) in display order, given its stored choices and the models
    /// it can use. None: an agent that speaks ACP announces its own.
    fn options(&self, _session_config: &Value, _settings: &AgentSettings, _models: &[ModelInfo]) -> Vec<OptionSpec> {
        Vec::new()
    }

    /// The config option `--model` sets for a new session.
    fn default_option(&self) -> &'static str {
        "model"
    }

    /// What a mode of the session's mode option does, for ACP session modes.
    fn mode_description(&self, _mode: &str) -> Option<&'static str> {
        None
    }

    /// The model the session's choices name (`default` for the agent's own), when the agent has a model choice.
    fn chosen_model<'a>(&self, _session_config: &'a Value) -> Option<&'a str> {
        None
    }

    /// The model the agent's own configuration makes its default.
    fn default_model<'a>(&self, _settings: &'a AgentSettings) -> Option<&'a str> {
        None
    }

    /// How the CLI lists the models it can use (run in a small sandbox of the bridge's own, in the background),
    /// when it can.
    fn model_listing(&self) -> Option<ModelListing> {
        None
    }

    /// The models the user's configuration of the agent names, offered beside what its CLI lists.
    fn configured_models(&self, _settings: &AgentSettings) -> Vec<ModelInfo> {
        Vec::new()
    }

    /// The newest major version of the CLI the bridge can drive: a newer one found on PATH is replaced by the pinned
    /// install, and one named by the override is refused. `None`: any.
    fn newest_major(&self, _settings: &AgentSettings) -> Option<u64> {
        None
    }

    /// Settles the settings the user left open so that `major`, newer than [`Agent::newest_major`] and named by the
    /// override, is driven after all: answers in words how, or `None` (it is refused).
    fn drive_newer_major(&self, _settings: &mut AgentSettings, _major: u64) -> Option<String> {
        None
    }

    /// How a newer major version than [`Agent::newest_major`] can still be driven, in words for its refusal.
    fn newer_major_hint(&self) -> Option<&'static str> {
        None
    }

    /// The exact variables of the bridge's environment the CLI gets for its model providers: those its
    /// configuration names and those of `providers` (the ones its model list has, and the model in use).
    fn provider_env(
        &self,
        _settings: &AgentSettings,
        _providers: &mut dyn Iterator<Item = &str>,
    ) -> std::collections::BTreeSet<String> {
        Default::default()
    }

    /// The endpoints (host, port) of the model servers the agent's configuration names: reachable whatever the
    /// network policy, on loopback too.
    fn model_endpoints(&self, _settings: &AgentSettings) -> Vec<(String, u16)> {
        Vec::new()
    }

    /// Whether a failure in these words means the model the session chose is not one the CLI knows.
    fn says_unknown_model(&self, _message: &str) -> bool {
        false
    }

    /// Whether this agent's sessions are served by a warm server started when a session opens, rather than by
    /// one CLI process per prompt.
    fn serves(&self, _settings: &AgentSettings) -> bool {
        false
    }

    /// What the agent keeps running for a bridge across turns, when [`Agent::serves`]: made once per bridge.
    fn service(&self, _settings: &AgentSettings, _bounds: &host::ServiceSettings) -> Option<Arc<dyn host::Service>> {
        None
    }

    /// `doctor`'s line on how the agent is driven, given the version its CLI printed and how a warm server would
    /// serve (`server`: its scope and limits, or, `Err`, why none can run here: "does not run …"); `None` when there
    /// is one way only.
    fn describe_backend(&self, _settings: &AgentSettings, _server: Result<&str, &str>) -> Option<String> {
        None
    }

    /// `doctor`'s lines about this agent's configuration beyond its executable and credential (its model, its
    /// providers).
    fn doctor_lines(&self, _settings: &AgentSettings, _cli_model: Option<&str>) -> Vec<String> {
        Vec::new()
    }
}

/// Model credentials an agent reads from its environment and the upstream they go to (see
/// [`Agent::gateway_credentials`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatewayCredential {
    /// The variables that carry a credential for this upstream (an API key, a subscription's token).
    pub variables: &'static [&'static str],
    /// The variable that sets the upstream's base URL.
    pub base_url: &'static str,
    /// The base URL without that variable.
    pub upstream: &'static str,
}

/// A slash command the CLI runs non-interactively (e.g. `opencode run --command NAME`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlashCommand {
    /// The name, typed as `/name`.
    pub name: String,
    /// What it does.
    pub description: String,
    /// A hint for its arguments, if it takes any.
    pub hint: Option<String>,
}

/// The major version in a version line such as `1.18.33` or `opencode 2.0.23`, if it is one.
pub fn major_version(line: &str) -> Option<u64> {
    // A word like `1.18.33` or `v2.0.23`; anything else (a CLI that printed something else) is no version.
    line.split_whitespace().find_map(|word| {
        let word = word.trim_start_matches('v');
        let looks = word.contains('.') && word.chars().all(|c| c.is_ascii_digit() || c == '.' || c == '-');
        looks.then(|| word.split('.').next()?.parse().ok()).flatten()
    })
}

/// How an agent's CLI lists its models.
#[derive(Clone, Copy)]
pub struct ModelListing {
    /// The argv after the executable.
    pub args: &'static [&'static str],
    /// Reads what it printed; what does not parse is skipped.
    pub parse: fn(&str) -> Vec<ModelInfo>,
    /// The variables the listing may need beyond the bridge's own (the providers' keys), given the settings.
    pub env: fn(&AgentSettings) -> std::collections::BTreeSet<String>,
    /// The file in the data dir where the last list is kept for the next start.
    pub cache: &'static str,
}

/// An agent's own sign-in (`acp-sandbox login --own`): its CLI runs on the person's terminal, with its home in the
/// data dir, and what it makes is kept as [`OwnLogin::keeps`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnLogin {
    /// What it signs in with, for people: "ChatGPT".
    pub with: &'static str,
    /// The CLI that signs in: an executable beside the agent's own in its npm install (`.bin/<name>`), or the
    /// agent's own executable when `None`.
    pub program: Option<&'static str>,
    /// Its arguments.
    pub args: Vec<String>,
    /// What it makes, and how sessions get it.
    pub keeps: Keeps,
}

/// What an agent's own sign-in makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keeps {
    /// A login file in its home (Codex's `auth.json`), which a session given no key sees in its own home.
    File(LoginFile),
    /// A token it prints (Claude Code's `setup-token`): the person pastes it, and it is kept as a key is.
    PrintedToken,
}

/// A login the agent's CLI keeps in a file: a session that is given no key runs with [`LoginFile::env`] over the
/// agent's fixed variables, and sees placeholders of the login in its own home where the agent keeps it with the
/// gateway ([`Agent::keep_own_login`]), else that file, writable (the CLI refreshes the login in it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginFile {
    /// The variable that tells the CLI where its home is (`CODEX_HOME`), set to the login's folder.
    pub home_variable: &'static str,
    /// The file the login is kept in, in that folder.
    pub file: &'static str,
    /// Where a session sees the file, relative to the session's HOME.
    pub inside: &'static str,
    /// Variables a session that uses the login gets instead of the fixed ones of the same name.
    pub env: Vec<(String, String)>,
}

/// How a person logs in to an agent (`acp-sandbox login`, the ACP auth methods).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Login {
    /// The bridge asks for the [`Agent::required_credential`] and keeps it; `page` is where a person gets it.
    Token {
        /// Where the token comes from.
        page: &'static str,
    },
    /// The CLI keeps its own logins: its own login command (these arguments) runs on the person's terminal.
    Own {
        /// The CLI's arguments that log in (e.g. `auth login`).
        args: &'static [&'static str],
    },
    /// Nothing to log in to here: the agent takes what it needs from its environment (`--pass-env`).
    None,
}

/// Which agent a session runs: a handle on its entry of [`AGENTS`]. The store keeps its [`Agent::id`].
#[derive(Clone, Copy)]
pub struct AgentKind(&'static dyn Agent);

/// Every agent the bridge can run, one line each; the first is the default.
pub static AGENTS: &[AgentKind] = &[
    opencode::AGENT,
    amp::AGENT,
    acp::AGENT,
    claude::AGENT,
    codex::AGENT,
    gemini::AGENT,
    #[cfg(debug_assertions)]
    scripted::AGENT,
];

impl AgentKind {
    /// The handle on an agent (for its folder's `AGENT`).
    pub const fn of(agent: &'static dyn Agent) -> Self {
        Self(agent)
    }

    /// The agent whose [`Agent::id`] this is.
    pub fn parse(id: &str) -> Option<Self> {
        AGENTS.iter().copied().find(|agent| agent.id() == id)
    }

    /// The stable lower-case name (the agent's [`Agent::id`]).
    pub fn as_str(self) -> &'static str {
        self.0.id()
    }

    /// The name users know the agent by.
    pub fn display_name(self) -> &'static str {
        self.0.name()
    }
}

impl std::ops::Deref for AgentKind {
    type Target = dyn Agent;

    fn deref(&self) -> &Self::Target {
        self.0
    }
}

impl PartialEq for AgentKind {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for AgentKind {}

impl std::hash::Hash for AgentKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id().hash(state);
    }
}

impl std::fmt::Debug for AgentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

impl std::fmt::Display for AgentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

impl clap::ValueEnum for AgentKind {
    fn value_variants<'a>() -> &'a [Self] {
        AGENTS
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.id()).hide(self.test_only()))
    }
}

/// What a translator needs to know about the turn it translates. Plain data, so translation stays pure.
#[derive(Clone, Debug)]
pub struct TranslateContext {
    /// The editor's workspace: every path shown to the editor is absolute and under this root when the CLI
    /// worked inside its own workspace.
    pub workspace: PathBuf,
    /// Where the workspace appears to the CLI. Equal to `workspace` for the local sandbox; a remote
    /// sandbox mounts it elsewhere, and paths the CLI reports are rewritten from here to `workspace`.
    pub agent_workspace: PathBuf,
    /// The client advertised `clientCapabilities._meta.terminal_output`: shell output goes through Zed's
    /// display-only terminal `_meta` extension instead of a fenced block.
    pub terminal_output: bool,
    /// Context window of the model in use, in tokens, for `usage_update.size`.
    pub context_window: u64,
    /// Makes ids the translator invents unique across the turns of a session (e.g. the turn's number);
    /// empty in the golden tests.
    pub turn_key: String,
}

impl TranslateContext {
    /// Maps a path the CLI reported (absolute in its view, or relative to its workspace) to an absolute
    /// path in the editor's workspace.
    pub fn editor_path(&self, reported: &str) -> PathBuf {
        let path = Path::new(reported);
        if path.is_absolute() {
            match path.strip_prefix(&self.agent_workspace) {
                Ok(rest) => self.workspace.join(rest),
                Err(_) => path.to_path_buf(),
            }
        } else {
            self.workspace.join(path)
        }
    }

    /// A path for a human title: relative to the workspace when it is inside it, else absolute.
    pub fn display_path(&self, reported: &str) -> String {
        let absolute = self.editor_path(reported);
        match absolute.strip_prefix(&self.workspace) {
            Ok(rest) if !rest.as_os_str().is_empty() => rest.display().to_string(),
            _ => absolute.display().to_string(),
        }
    }
}

/// How a turn ended, as far as the CLI's own output says. The session decides the final answer from this,
/// the exit status and whether the user cancelled.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TurnEnd {
    /// The agent finished normally.
    EndTurn,
    /// The model hit its output-length limit.
    MaxTokens,
    /// The agent hit its own limit of model requests.
    MaxTurnRequests,
    /// The provider's content filter refused.
    Refusal,
    /// The CLI reports that the user cancelled (e.g. Amp's "User cancelled (SIGINT/SIGTERM)").
    Cancelled,
    /// The provider rejected the credentials: answered as ACP `auth_required` (-32000) with these words.
    AuthRequired {
        /// The CLI's own message.
        message: String,
    },
    /// Any other failure the CLI reported, in its own words.
    Error {
        /// The CLI's own message.
        message: String,
    },
}

/// One thing a translator learned from a CLI line.
// Nearly every output is an update, so boxing it would cost an allocation per line to save space on the rare
// other variants.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "output", rename_all = "snake_case")]
pub enum Output {
    /// An ACP update to persist and send to the editor, in order. Serialized as the editor gets it.
    Update(#[serde(serialize_with = "tools::serialize_wire")] SessionUpdate),
    /// The CLI's own conversation id (OpenCode `ses_…`, Amp `T-…`): persisted so the next turn continues it.
    NativeSessionId {
        /// The id as the CLI prints it.
        id: String,
    },
    /// The CLI said how the turn ends. More output may follow (e.g. OpenCode prints nothing after an
    /// error, Amp exits after its result line); the last one wins.
    End(TurnEnd),
    /// The CLI is stuck (e.g. OpenCode re-prompting forever after a cut stream): the session kills it and
    /// fails the turn with this message. The conversation stays continuable.
    Abort {
        /// Why, for the user.
        message: String,
    },
    /// The agent asks before it runs a tool (OpenCode's `ask` permissions): the session asks the editor with
    /// `session/request_permission` and gives the answer back to the agent.
    Permission(PermissionAsk),
    /// The agent asks the user questions (OpenCode's `question` tool): the session asks the editor with an
    /// elicitation form where it offers them and gives the answers back, else the agent is told no answer came.
    Question(question::QuestionAsk),
    /// The agent says the turn is over (OpenCode's server: the session went idle). A CLI run per turn says it by
    /// closing its stdout instead.
    Idle,
    /// A line that was not a known event: kept for logs and error messages, never shown as agent output.
    Unparsed {
        /// The line, truncated to a sane length.
        line: String,
    },
}

/// A permission the agent asks for, in the words the editor shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PermissionAsk {
    /// The agent's id of the request, to answer it with (OpenCode `per_…`).
    pub request_id: String,
    /// The tool call it is about: its id as the editor knows it, with a title, a kind and (for edits) the diff.
    #[serde(serialize_with = "tools::serialize_wire")]
    pub tool_call: agent_client_protocol::v1::schema::ToolCallUpdate,
    /// What an "always" answer would allow from now on (OpenCode's `always` patterns, e.g. `git status *`), for
    /// the option's label; empty when the agent does not say.
    pub always: Vec<String>,
    /// The permission asked for (OpenCode's: `bash`, `edit`, …), which an "always" answer allows on those patterns.
    pub permission: String,
    /// What this request is about (the commands of a bash call, the paths of an edit): an earlier "always" of the
    /// session that covers every one of them answers it without asking again.
    pub patterns: Vec<String>,
}

/// Turns one CLI's stdout, line by line, into ACP updates. Implementations are pure: no I/O, no clock,
/// no randomness, so a recorded stream always yields the same updates (the golden tests rely on it).
pub trait Translator: Send {
    /// Translates one stdout line (without its newline).
    fn line(&mut self, line: &str) -> Vec<Output>;

    /// The CLI's stdout is closed: closes whatever is still open (e.g. a tool call that never got its
    /// result is reported failed, saying why: `end`), so the editor never shows a spinner forever.
    fn finish(&mut self, end: StreamEnd) -> Vec<Output>;
}

/// Why a translator's stream ended, for the cards it still has open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The CLI stopped (it exited, crashed or was killed for a limit).
    Stopped,
    /// The turn was cancelled.
    Cancelled,
}

impl StreamEnd {
    /// The note on a tool still open when the stream ended.
    pub fn note(self) -> &'static str {
        match self {
            StreamEnd::Stopped => tools::TOOL_NEVER_FINISHED,
            StreamEnd::Cancelled => tools::TOOL_CANCELLED,
        }
    }
}

/// Runs every line of a recorded stream through a fresh translator, then finishes it. Used by the golden
/// tests and the benchmarks; the session feeds lines one at a time as they arrive.
pub fn translate_all(agent: AgentKind, context: TranslateContext, stream: &str) -> Vec<Output> {
    translate_stream(agent.translator(context).as_mut(), stream)
}

/// Runs every non-blank line of a recorded stream through `translator`, then finishes it: [`translate_all`]
/// for a translator that no [`Agent`] builds (e.g. [`opencode::server::ServeTranslator`], whose
/// lines are the `data:` payloads of `opencode serve`'s events).
pub fn translate_stream(translator: &mut dyn Translator, stream: &str) -> Vec<Output> {
    let mut outputs = Vec::new();
    for line in stream.lines() {
        if line.trim().is_empty() {
            continue;
        }
        outputs.extend(translator.line(line));
    }
    outputs.extend(translator.finish(StreamEnd::Stopped));
    outputs
}

/// The `host:port` of a model endpoint's base URL, for the network policy: `http://127.0.0.1:8080/v1` →
/// 127.0.0.1:8080; the scheme gives the default port.
pub fn endpoint_of(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map(|(_, host)| host).unwrap_or(authority);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        (host.to_string(), after.strip_prefix(':').map(str::parse).transpose().ok()?.unwrap_or(default))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.parse().ok()?),
            None => (authority.to_string(), default),
        }
    };
    (!host.is_empty()).then(|| (host.to_ascii_lowercase(), port))
}
