//! OpenCode: how to run `opencode run --format json`, and its events.
//!
//! The prompt goes on stdin, then EOF (OpenCode reads a non-TTY stdin to the end and hangs on an open
//! pipe). The session id (`ses_…`) comes from the first event and is passed back with `--session`, from
//! the same directory: OpenCode binds a session to the `PWD` it was created in.

pub mod events;
pub mod translate;

use std::path::{Path, PathBuf};

use super::TurnRequest;
use crate::sandbox::install::NpmPackage;

/// The pinned npm package installed on first use.
pub const PACKAGE: NpmPackage =
    NpmPackage { name: "opencode-ai", version: "1.18.33", bin: "opencode", postinstall: Some("postinstall.mjs") };

/// The argv after the executable.
pub fn args(turn: &TurnRequest<'_>) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--format", "json", "--auto", "--thinking"].map(String::from).to_vec();
    if let Some(model) = turn.model {
        args.extend(["--model".to_string(), model.to_string()]);
    }
    if let Some(variant) = turn.variant {
        args.extend(["--variant".to_string(), variant.to_string()]);
    }
    if let Some(session) = turn.native_id {
        args.extend(["--session".to_string(), session.to_string()]);
    }
    for file in turn.files {
        args.extend(["--file".to_string(), file.display().to_string()]);
    }
    args
}

/// Whether a variable of the user's environment reaches OpenCode: its own settings and model-provider
/// credentials (OpenCode talks to many providers, each with its own key variable).
pub fn passes_env(name: &str) -> bool {
    // Other tools' secrets never reach OpenCode, even when they look like provider keys.
    const NOT_OURS: &[&str] = &["AMP_", "ACP_SANDBOX_", "E2B_", "DAYTONA_"];
    if NOT_OURS.iter().any(|prefix| name.starts_with(prefix)) {
        return false;
    }
    name.starts_with("OPENCODE_")
        || name.ends_with("_API_KEY")
        || name.ends_with("_API_TOKEN")
        || name.ends_with("_BASE_URL")
        || name.starts_with("AWS_")
        || name.starts_with("GOOGLE_")
        || name.starts_with("AZURE_")
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

/// Whether stderr says the `--session` we passed is gone (the state dir was lost).
pub fn session_missing(stderr: &str) -> bool {
    stderr.contains("Session not found")
}
