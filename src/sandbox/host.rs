//! The one command the bridge runs outside every sandbox: a CLI's own interactive login (`opencode auth
//! login`, `codex login`), started by a person from `acp-sandbox login` on their terminal. It must write a
//! credential store no sandbox may write (the user's own, or the bridge's in its data dir), so it runs as the person
//! would run it.

use std::ffi::OsStr;
use std::path::Path;
use std::process::ExitStatus;

/// Runs `program args` with this process's terminal and environment (plus `env`), and waits for it.
pub async fn run_interactive<A: AsRef<OsStr>>(
    program: &Path,
    args: &[A],
    env: &[(&str, &Path)],
) -> std::io::Result<ExitStatus> {
    let mut command = tokio::process::Command::new(program);
    command.args(args).kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    command.status().await
}
