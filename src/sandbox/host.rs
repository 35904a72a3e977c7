//! The one command the bridge runs outside every sandbox: a CLI's own interactive login (`opencode auth
//! login`), started by a person from `acp-sandbox login` on their terminal. It must write the user's own
//! credential store, which a sandbox only ever shows read-only, so it runs as the person would run it.

use std::path::Path;
use std::process::ExitStatus;

/// Runs `program args` with this process's terminal and environment, and waits for it.
pub async fn run_interactive(program: &Path, args: &[&str]) -> std::io::Result<ExitStatus> {
    tokio::process::Command::new(program).args(args).kill_on_drop(true).status().await
}
