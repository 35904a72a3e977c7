//! The coding-agent CLIs we drive: what each one needs to run, and the contract of its translator.
//!
//! Every agent lives in its own folder (`amp/`, `opencode/`) with its wire types (`events.rs`), its pure
//! translation to ACP (`translate.rs`) and its command line (`mod.rs`). Adding an agent means adding a folder
//! and one arm to [`AgentKind`].

pub mod amp;
pub mod opencode;
pub mod package;
pub mod tools;

use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema::SessionUpdate;
use serde::Serialize;

use self::package::NpmPackage;

/// What one turn asks of the CLI beyond the prompt text.
#[derive(Clone, Debug, Default)]
pub struct TurnRequest<'a> {
    /// The CLI conversation to continue (`ses_…`, `T-…`); `None` starts a new one.
    pub native_id: Option<&'a str>,
    /// OpenCode model (`provider/model`).
    pub model: Option<&'a str>,
    /// OpenCode model variant (reasoning effort).
    pub variant: Option<&'a str>,
    /// Amp mode.
    pub mode: Option<&'a str>,
    /// Files attached to the prompt (images), as the CLI sees them.
    pub files: &'a [PathBuf],
    /// A slash command of the CLI to run, the prompt being its arguments.
    pub command: Option<&'a str>,
}

/// Which CLI a session runs. Persisted with the session, so it never changes for one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    /// Sourcegraph's Amp (`amp -x --stream-json`).
    Amp,
    /// OpenCode (`opencode run --format json`).
    #[value(name = "opencode")]
    OpenCode,
}

impl AgentKind {
    /// The stable lower-case name used in the store, on the command line and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Amp => "amp",
            AgentKind::OpenCode => "opencode",
        }
    }

    /// Parses the name written by [`AgentKind::as_str`].
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "amp" => Some(AgentKind::Amp),
            "opencode" => Some(AgentKind::OpenCode),
            _ => None,
        }
    }

    /// The name users know the agent by, for titles and messages.
    pub fn display_name(self) -> &'static str {
        match self {
            AgentKind::Amp => "Amp",
            AgentKind::OpenCode => "OpenCode",
        }
    }

    /// The npm package that provides the CLI, installed on first use.
    pub fn package(self) -> NpmPackage {
        match self {
            AgentKind::Amp => amp::PACKAGE,
            AgentKind::OpenCode => opencode::PACKAGE,
        }
    }

    /// The credential variable the CLI cannot start without, if any.
    pub fn required_credential(self) -> Option<&'static str> {
        match self {
            AgentKind::Amp => Some(amp::CREDENTIAL),
            AgentKind::OpenCode => None,
        }
    }

    /// The CLI's argv after the executable.
    pub fn args(self, turn: &TurnRequest<'_>) -> Vec<String> {
        match self {
            AgentKind::Amp => amp::args(turn),
            AgentKind::OpenCode => opencode::args(turn),
        }
    }

    /// Whether a variable of the bridge's environment reaches the CLI (its settings and credentials).
    pub fn passes_env(self, name: &str) -> bool {
        match self {
            AgentKind::Amp => amp::passes_env(name),
            AgentKind::OpenCode => opencode::passes_env(name),
        }
    }

    /// The domains of the CLI's own service and its model providers: reachable under `--network allow=…`.
    pub fn service_hosts(self) -> &'static [&'static str] {
        match self {
            AgentKind::Amp => amp::SERVICE_HOSTS,
            AgentKind::OpenCode => opencode::providers::SERVICE_HOSTS,
        }
    }

    /// Variables the bridge always sets for this CLI.
    pub fn fixed_env(self) -> Vec<(String, String)> {
        match self {
            AgentKind::Amp => Vec::new(),
            AgentKind::OpenCode => opencode::fixed_env(),
        }
    }

    /// The user's own configuration of the CLI: (host path, path inside the session's state dir).
    pub fn user_config(
        self,
        user_config_dir: &Path,
        user_data_dir: &Path,
        state_dir: &Path,
    ) -> Vec<(PathBuf, PathBuf)> {
        match self {
            AgentKind::Amp => amp::user_config(user_config_dir, state_dir),
            AgentKind::OpenCode => opencode::user_config(user_config_dir, user_data_dir, state_dir),
        }
    }

    /// What the CLI's own install brings for its config dir, shown there beside the user's configuration.
    pub fn shipped_config(
        self,
        executable: &Path,
        user_config_dir: &Path,
        state_dir: &Path,
    ) -> Vec<(PathBuf, PathBuf)> {
        match self {
            AgentKind::Amp => Vec::new(),
            AgentKind::OpenCode => opencode::plugin_package(executable, user_config_dir, state_dir),
        }
    }

    /// Names of files in the user's configuration of the CLI ([`AgentKind::user_config`]) that hold credentials:
    /// never copied into a remote sandbox, whose CLI gets them through its environment ([`AgentKind::credential_env`]).
    pub fn credential_files(self) -> &'static [&'static str] {
        match self {
            AgentKind::Amp => amp::CREDENTIAL_FILES,
            AgentKind::OpenCode => opencode::CREDENTIAL_FILES,
        }
    }

    /// The user's stored logins of the CLI as variables of its environment, for a sandbox that does not see the
    /// user's files.
    pub fn credential_env(self, user_data_dir: &Path) -> Vec<(String, String)> {
        match self {
            AgentKind::Amp => Vec::new(),
            AgentKind::OpenCode => opencode::credential_env(user_data_dir),
        }
    }

    /// Whether the CLI's stderr says the conversation we asked it to continue no longer exists.
    pub fn session_missing(self, stderr: &str) -> bool {
        match self {
            AgentKind::Amp => amp::session_missing(stderr),
            AgentKind::OpenCode => opencode::session_missing(stderr),
        }
    }

    /// The slash commands the CLI runs non-interactively, for the editor's `/` menu.
    pub fn commands(self, user_config_dir: &Path, workspace: &Path) -> Vec<opencode::Command> {
        match self {
            // Amp's execute mode has no slash commands.
            AgentKind::Amp => Vec::new(),
            AgentKind::OpenCode => opencode::commands(user_config_dir, workspace),
        }
    }

    /// Whether the CLI can take images with a prompt.
    pub fn accepts_images(self) -> bool {
        matches!(self, AgentKind::OpenCode)
    }

    /// A fresh translator for one turn of this agent.
    pub fn translator(self, context: TranslateContext) -> Box<dyn Translator> {
        match self {
            AgentKind::Amp => Box::new(amp::translate::AmpTranslator::new(context)),
            AgentKind::OpenCode => Box::new(opencode::translate::OpenCodeTranslator::new(context)),
        }
    }
}

impl std::fmt::Display for AgentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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
pub fn translate_all(kind: AgentKind, context: TranslateContext, stream: &str) -> Vec<Output> {
    translate_stream(kind.translator(context).as_mut(), stream)
}

/// Runs every non-blank line of a recorded stream through `translator`, then finishes it: [`translate_all`]
/// for a translator that [`AgentKind`] does not build (e.g. [`opencode::serve::ServeTranslator`], whose
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
