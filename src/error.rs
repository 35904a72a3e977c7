//! The library's error type and the one function that decides what the editor sees for each failure.

use agent_client_protocol::ErrorCode;
use serde_json::json;

use crate::sandbox::{RemoteFailure, SandboxError};
use crate::store::StoreError;

/// Everything that can fail while serving a request. Each variant says who returns it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The client named a session the store does not have (load, resume, prompt, set_config_option).
    #[error("Session not found: {id} is not in the session store {store} ({held}). {hint}")]
    SessionNotFound {
        /// The id the client named.
        id: String,
        /// The database file.
        store: std::path::PathBuf,
        /// What the store holds, in words.
        held: String,
        /// What may have happened and what to do.
        hint: &'static str,
    },

    /// The agent needs a credential that is neither in the bridge's environment nor stored by `acp-sandbox
    /// login`; the CLI was not started.
    #[error(
        "{agent} needs an access token: run `{login}` in a terminal (it stores the token for acp-sandbox), or set {variable}{others} in the agent server's \"env\" in the editor's settings (e.g. Zed's agent_servers) and restart the agent; in a shell, `export {variable}=…`"
    )]
    MissingCredential {
        /// The agent's display name.
        agent: &'static str,
        /// The variable that would carry it.
        variable: &'static str,
        /// The command that stores it.
        login: String,
        /// The other variables that would log it in instead, as words after the variable ("" when none).
        others: String,
    },

    /// `authenticate` found no login for an agent that keeps its own (OpenCode): the words say what to do.
    #[error("{0}")]
    NotLoggedIn(String),

    /// `logout` could not log the agent out: the words say why and what to do.
    #[error("{0}")]
    LogoutFailed(String),

    /// The CLI's provider rejected the credentials (e.g. OpenCode's ProviderAuthError).
    #[error("{0}")]
    AuthRejected(String),

    /// A second prompt arrived while a turn of the same session is running.
    #[error("A turn is already running in this session; wait for it to finish or cancel it first")]
    TurnInProgress,

    /// A prompt of a session whose turn another bridge process (another editor window on the same data dir) runs.
    #[error(
        "This session's turn is running in another window (another acp-sandbox on the same data dir); wait for it to finish there or cancel it there, then send this prompt again"
    )]
    TurnInAnotherWindow,

    /// A delete of a session whose turn another bridge process runs: the session is kept.
    #[error(
        "This session's turn is running in another window (another acp-sandbox on the same data dir), so the session was not deleted: cancel the turn there or wait for it to finish, then delete it"
    )]
    DeleteWhileRunningElsewhere,

    /// The request's parameters cannot be served (bad cursor, bad config value, relative cwd…).
    #[error("{0}")]
    InvalidParams(String),

    /// The session belongs to the other agent: this bridge does not run its CLI.
    #[error(
        "This session runs {session_agent}, but this agent server runs {served}; open it from the {session_agent} agent server"
    )]
    WrongAgent {
        /// The session's agent.
        session_agent: &'static str,
        /// The agent this bridge serves.
        served: &'static str,
    },

    /// The turn ran past `--turn-timeout` and was stopped.
    #[error(
        "{agent} was still working after {minutes} min (--turn-timeout) and was stopped; the conversation is kept and the next prompt continues it"
    )]
    TurnTimeout {
        /// The agent's display name.
        agent: &'static str,
        /// The limit.
        minutes: u64,
    },

    /// The CLI ended the turn with an error, crashed or exited non-zero.
    #[error("{message}")]
    CliFailed {
        /// The CLI's own message, or a description of how it died.
        message: String,
        /// The last lines the CLI wrote on stderr.
        stderr_tail: String,
        /// The exit code, when it exited normally.
        exit_code: Option<i32>,
    },

    /// The CLI printed nothing for too long (or looped) and was killed.
    #[error(
        "{agent} produced no output for {seconds} s and was stopped; the conversation is kept and the next prompt continues it"
    )]
    Stalled {
        /// The agent's display name.
        agent: &'static str,
        /// How long it was silent.
        seconds: u64,
    },

    /// The session's model is one the CLI does not have (OpenCode says only "Unexpected server error" for it
    /// under `run`).
    #[error(
        "{agent} has no model {model} here: pick one in the model picker (these are the models {agent} offers), or run `opencode models` to see them\n\n{agent} said: {said}"
    )]
    UnknownModel {
        /// The agent's display name.
        agent: &'static str,
        /// The model the session asked for.
        model: String,
        /// What the CLI said.
        said: String,
    },

    /// The CLI could not be found or installed.
    #[error("{0}")]
    CliUnavailable(String),

    /// The sandbox could not be prepared or could not run the CLI.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),

    /// The store failed; the request did not take effect. When the store cannot write at all (full disk, lock, data
    /// dir gone), a running turn ends with this, its CLI stopped, and the message says what the user can do.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Maps a library error to the JSON-RPC error the editor receives.
pub fn to_acp_error(error: &Error) -> agent_client_protocol::Error {
    let message = error.to_string();
    match error {
        Error::SessionNotFound { id, .. } => {
            agent_client_protocol::Error::new(ErrorCode::RESOURCE_NOT_FOUND, message).data(json!({ "sessionId": id }))
        }
        Error::MissingCredential { variable, login, .. } => {
            agent_client_protocol::Error::new(ErrorCode::AUTH_REQUIRED, message)
                .data(json!({ "variable": variable, "login": login }))
        }
        Error::AuthRejected(_) | Error::NotLoggedIn(_) => {
            agent_client_protocol::Error::new(ErrorCode::AUTH_REQUIRED, message)
        }
        // A remote sandbox provider refused the bridge's key: a credential to fix, like a CLI's.
        Error::Sandbox(SandboxError::Remote { provider, failure: RemoteFailure::Auth, .. }) => {
            agent_client_protocol::Error::new(ErrorCode::AUTH_REQUIRED, message).data(json!({ "provider": provider }))
        }
        Error::TurnInProgress => agent_client_protocol::Error::new(ErrorCode::INVALID_REQUEST, message),
        Error::TurnInAnotherWindow | Error::DeleteWhileRunningElsewhere => {
            agent_client_protocol::Error::new(ErrorCode::INVALID_REQUEST, message)
        }
        Error::InvalidParams(_) | Error::WrongAgent { .. } => {
            agent_client_protocol::Error::new(ErrorCode::INVALID_PARAMS, message)
        }
        // The session's model option is what is wrong: the data names it, for a client that can point to it.
        Error::UnknownModel { model, .. } => {
            agent_client_protocol::Error::new(ErrorCode::INVALID_PARAMS, message).data(json!({ "model": model }))
        }
        Error::CliFailed { stderr_tail, exit_code, .. } => {
            let shown = if stderr_tail.trim().is_empty() {
                message
            } else {
                format!("{message}\n\nstderr:\n{}", stderr_tail.trim_end())
            };
            agent_client_protocol::Error::new(ErrorCode::INTERNAL_ERROR, shown)
                .data(json!({ "stderr": stderr_tail, "exitCode": exit_code }))
        }
        // The store cannot save: `data` says why and where, so an editor (or a test) need not parse the message.
        Error::Store(store) => {
            let mut data = json!({ "store": store.reason() });
            match store {
                StoreError::DiskFull { data_dir } => data["dataDir"] = json!(data_dir),
                StoreError::Gone { path, data_dir } | StoreError::Unwritable { path, data_dir, .. } => {
                    data["path"] = json!(path);
                    data["dataDir"] = json!(data_dir);
                }
                StoreError::Locked { path, .. } | StoreError::Replaced { path } | StoreError::TooNew { path, .. } => {
                    data["path"] = json!(path)
                }
                StoreError::Stopped | StoreError::Io { .. } | StoreError::Sqlite(_) | StoreError::Corrupt(_) => {}
            }
            agent_client_protocol::Error::new(ErrorCode::INTERNAL_ERROR, message).data(data)
        }
        Error::Stalled { .. }
        | Error::TurnTimeout { .. }
        | Error::CliUnavailable(_)
        | Error::Sandbox(_)
        | Error::LogoutFailed(_) => agent_client_protocol::Error::new(ErrorCode::INTERNAL_ERROR, message),
    }
}

/// Result alias for the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;
