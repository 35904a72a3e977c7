//! How the local provider isolates commands, decided once per bridge: bubblewrap, else the Landlock sandbox, else a
//! refusal (or no isolation when the user chose none), with the words the log, `doctor` and the first turn use.

use std::path::PathBuf;

#[cfg(not(linux_sandbox))]
use super::LocalSettings;
#[cfg(linux_sandbox)]
pub use super::bwrap::probe_bwrap;
#[cfg(not(linux_sandbox))]
use crate::sandbox::needs_linux;
use crate::sandbox::{SandboxChoice, SandboxError};

/// How the local provider isolates commands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// bubblewrap at this path.
    Bwrap(PathBuf),
    /// Landlock (this ABI) and seccomp on the CLI, put there by `sandbox-init` (`landlock.rs`).
    Landlock(i32),
    /// A plain process group; the string says why there is no bubblewrap.
    None(String),
    /// No sandbox can be made and the user did not choose none: every command is refused with this reason.
    Refused(String),
}

impl Isolation {
    /// Decides the isolation for a sandbox choice, probing bubblewrap once per process.
    pub fn resolve(choice: SandboxChoice) -> Result<Self, SandboxError> {
        match choice {
            SandboxChoice::None => Ok(Isolation::None("--sandbox none was given".into())),
            SandboxChoice::Bwrap => match probe_bwrap() {
                Ok(path) => Ok(Isolation::Bwrap(path)),
                Err(why) => Err(SandboxError::Unavailable(format!("--sandbox bwrap cannot work here: {why}"))),
            },
            SandboxChoice::Landlock => match probe_landlock() {
                Ok(abi) => Ok(Isolation::Landlock(abi)),
                Err(why) => Err(SandboxError::Unavailable(format!("--sandbox landlock cannot work here: {why}"))),
            },
            // Never unsandboxed by surprise: without bubblewrap the Landlock sandbox, without both a refusal.
            #[cfg(linux_sandbox)]
            SandboxChoice::Auto => Ok(match (probe_bwrap(), probe_landlock()) {
                (Ok(path), _) => Isolation::Bwrap(path),
                (Err(_), Ok(abi)) => Isolation::Landlock(abi),
                (Err(bwrap), Err(landlock)) => Isolation::Refused(refusal(&bwrap, &landlock)),
            }),
            // Off Linux there is neither: `auto` runs the CLI as a plain process group, as it always has there.
            #[cfg(not(linux_sandbox))]
            SandboxChoice::Auto => Ok(Isolation::None(needs_linux())),
            // With a remote provider only the bridge's own short commands (versions, model lists) run here.
            SandboxChoice::Remote(_) => Ok(match probe_bwrap() {
                Ok(path) => Isolation::Bwrap(path),
                Err(why) => Isolation::None(why),
            }),
        }
    }

    /// One line for logs and `doctor`.
    pub fn describe(&self) -> String {
        match self {
            Isolation::Bwrap(path) => format!(
                "bubblewrap ({}): read-only system without secrets, writable workspace and session state, own \
                 namespaces, no capabilities, seccomp",
                path.display()
            ),
            Isolation::Landlock(abi) => format!(
                "Landlock (ABI {abi}) and seccomp, no bubblewrap: system readable without secrets, writable \
                 workspace and session state, TCP only to the bridge's proxy, no capabilities; {}",
                LANDLOCK_GAPS
            ),
            Isolation::None(why) => format!("plain process group, NO isolation ({why})"),
            Isolation::Refused(why) => format!("NO sandbox can be made here, prompts are refused: {why}"),
        }
    }
}

/// What the Landlock sandbox does not hold that bubblewrap's does, in words for the log, `doctor` and the note.
pub const LANDLOCK_GAPS: &str = "it does NOT hide the host's processes (their command lines are readable), keep \
    protected workspace paths (.git/config, hooks, .envrc) read-only, or keep TCP to the proxy's port and loopback \
    model ports from reaching other hosts on those ports; servers it starts listen on the host's network";

/// Why `auto` found no sandbox, and what to do.
#[cfg(linux_sandbox)]
fn refusal(bwrap: &str, landlock: &str) -> String {
    format!(
        "{bwrap}; and no Landlock sandbox: {landlock}. Install bubblewrap (on Ubuntu 23.10 and later, allow its user \
         namespaces: `sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0`, or an AppArmor profile for bwrap), \
         run on Linux 6.7 or later with Landlock enabled, or choose --sandbox none to run the agent without a sandbox"
    )
}

/// Whether the kernel holds the Landlock sandbox: its ABI, or why not.
#[cfg(linux_sandbox)]
pub fn probe_landlock() -> Result<i32, String> {
    super::landlock::probe()
}

/// Off Linux there is no Landlock.
#[cfg(not(linux_sandbox))]
pub fn probe_landlock() -> Result<i32, String> {
    Err(needs_linux())
}

/// Off Linux there is no bubblewrap to probe: `--sandbox bwrap` is refused and `auto` runs without isolation.
#[cfg(not(linux_sandbox))]
pub fn probe_bwrap() -> Result<PathBuf, String> {
    Err(needs_linux())
}

/// Off Linux the protections of `describe.rs` have nothing to stand on: one line says so.
#[cfg(not(linux_sandbox))]
impl LocalSettings {
    /// One line for `doctor` and the log: nothing is isolated here.
    pub fn describe(&self) -> Vec<(String, bool, String)> {
        vec![("isolation".into(), false, format!("NOT isolated: {}", needs_linux()))]
    }
}
