//! Amp: how to run `amp -x --stream-json`, and its events.
//!
//! The first turn starts a thread (`T-…`, from the `init` line) and must not archive it; later turns run
//! `amp threads continue T-… -x`. The prompt goes on stdin, then EOF. Amp never runs without
//! `AMP_API_KEY`: without it, it prints a login prompt on stdout and blocks.

pub mod events;
pub mod translate;

use std::path::{Path, PathBuf};

use super::TurnRequest;
use crate::agents::package::NpmPackage;

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
    if let Some(mode) = turn.mode {
        args.extend(["--mode".to_string(), mode.to_string()]);
    }
    args
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
        let first = args(&TurnRequest { mode: Some("high"), ..TurnRequest::default() });
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
        let next = args(&TurnRequest { native_id: Some("T-1"), ..TurnRequest::default() });
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
