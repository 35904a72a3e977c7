//! What the local sandbox protects here, one line per protection with whether it holds and why (for `doctor`
//! and the bridge's log at start-up): the settings read against what this kernel and bubblewrap can do.

use super::bwrap::{bwrap_netns, bwrap_userns};
use super::policy::{PROTECTED, SECRETS};
use super::{Isolation, LocalSettings, guard, limits, seccomp};
use crate::sandbox::WorkspaceMode;
use crate::sandbox::net::proxy::NetworkMode;

impl LocalSettings {
    /// One line per protection for `doctor` and the log: what applies and what does not, with the reason.
    pub fn describe(&self) -> Vec<(String, bool, String)> {
        if let Isolation::Landlock(abi) = self.isolation {
            return self.describe_landlock(abi);
        }
        let bwrap = matches!(self.isolation, Isolation::Bwrap(_));
        let off = |why: &str| (false, why.to_string());
        let mut lines = Vec::new();
        let mut add = |name: &str, (on, text): (bool, String)| lines.push((name.to_string(), on, text));
        let no_bwrap = "needs bubblewrap";
        add(
            "filesystem",
            if bwrap {
                (
                    true,
                    format!(
                        "read-only system, writable workspace and session state; profile {}",
                        self.policy.profile.as_str()
                    ),
                )
            } else {
                off("NOT isolated: the CLI can read and write everything you can")
            },
        );
        add(
            "secrets",
            if bwrap {
                (
                    true,
                    format!(
                        "{} built-in paths and {} --deny-read hidden; data dir hidden",
                        SECRETS.len(),
                        self.policy.deny_read.len()
                    ),
                )
            } else {
                off(no_bwrap)
            },
        );
        add(
            "protected",
            if bwrap {
                (true, format!("read-only in the workspace, moved out when created: {}", PROTECTED.join(", ")))
            } else {
                off("needs bubblewrap to be read-only; only what is created where one is missing is moved out")
            },
        );
        add(
            "workspace",
            match self.workspace_mode {
                WorkspaceMode::Direct => off("direct: the agent's writes land in your files at once"),
                WorkspaceMode::Review => (
                    true,
                    "review: the agent works on a copy; its text edits reach your files through the editor".into(),
                ),
            },
        );
        add(
            "network",
            match (&self.network, bwrap) {
                (NetworkMode::Host, _) => {
                    off("--network host: the host's network, loopback and every host service included")
                }
                (NetworkMode::Ask(_), false) => off("needs bubblewrap: the host's network, and nothing is asked"),
                (_, false) => off("needs bubblewrap: the host's network"),
                (mode, true) => match bwrap_netns() {
                    Ok(()) if mode.asks() => (
                        true,
                        format!(
                            "own network namespace; out only through the bridge's proxy ({mode}): any other host is \
                             asked about on a card in the thread whose turn runs (each session its own sandbox)"
                        ),
                    ),
                    Ok(()) => (true, format!("own network namespace; out only through the bridge's proxy ({mode})")),
                    Err(why) => off(&format!("{why}: the host's network")),
                },
            },
        );
        add(
            "capabilities",
            if bwrap {
                (true, format!("all dropped{}", if bwrap_userns() { ", own user namespace" } else { "" }))
            } else {
                off(no_bwrap)
            },
        );
        add(
            "seccomp",
            match (bwrap, seccomp::filter_bytes()) {
                (true, Ok(_)) => {
                    (true, format!("denies {}; {}", seccomp::DENIED.join(", "), seccomp::RESTRICTED.join("; ")))
                }
                (true, Err(e)) => off(&format!("cannot build the filter: {e}")),
                (false, _) => off(no_bwrap),
            },
        );
        add(
            "unix sockets",
            match (bwrap, seccomp::no_unix_sockets_program()) {
                (true, Ok(_)) => (
                    true,
                    "the CLI's tree cannot make AF_UNIX sockets: no host socket is reachable by its path \
                     (socketpair works)"
                        .into(),
                ),
                (true, Err(e)) => off(&format!("cannot build the filter: {e}")),
                (false, _) => off(no_bwrap),
            },
        );
        add(
            "server",
            match (bwrap, guard::port_guard_available()) {
                (true, Ok(abi)) => (
                    true,
                    format!(
                        "OpenCode's warm server is out of its tools' reach: its port closed to them (Landlock ABI \
                         {abi}), its password out of their environment, sandbox-init not inspectable"
                    ),
                ),
                (true, Err(why)) => off(&format!(
                    "no warm server: {why}, so its tools could reach it and answer their own approvals; OpenCode \
                     turns use `opencode run`"
                )),
                (false, _) => off(
                    "NOT isolated: under --sandbox none any tool can reach OpenCode's warm server (its port, its door, \
                     its password) and answer its own approvals",
                ),
            },
        );
        let enforcement = limits::probe();
        // Only a group actually made proves a cgroup works for us; otherwise the sandbox's first process watches.
        let trial = limits::SandboxCgroup::create(
            &enforcement,
            &format!("doctor-{}", std::process::id()),
            "probe",
            &self.limits,
        );
        add(
            "limits",
            match trial {
                Ok(Some(_)) => (true, enforcement.describe(&self.limits)),
                Ok(None) | Err(_) if self.init_program.is_some() => (
                    true,
                    format!(
                        "no usable cgroup ({}): at most {} processes and {} watched by the sandbox's first process",
                        trial.err().map(|e| e.to_string()).unwrap_or_else(|| enforcement.describe(&self.limits)),
                        self.limits.max_processes,
                        limits::format_size(self.limits.max_memory_bytes)
                    ),
                ),
                _ => (false, enforcement.describe(&self.limits)),
            },
        );
        add(
            "processes",
            if bwrap {
                (true, "own PID namespace; everything dies with the turn and the bridge".into())
            } else {
                (true, "a subreaper kills every descendant, daemons included, at the end of the turn".into())
            },
        );
        lines
    }
}

impl LocalSettings {
    /// The lines of the Landlock sandbox (`landlock.rs`): what it holds and, as OFF lines, what it does not.
    fn describe_landlock(&self, abi: i32) -> Vec<(String, bool, String)> {
        let mut lines: Vec<(String, bool, String)> = Vec::new();
        let mut add = |name: &str, on: bool, text: String| lines.push((name.to_string(), on, text));
        add(
            "filesystem",
            true,
            format!(
                "Landlock ABI {abi}: system readable, writable workspace and session state only, a private TMPDIR in \
                 it (no /tmp, /run or /dev/shm); profile {}",
                self.policy.profile.as_str()
            ),
        );
        add(
            "secrets",
            true,
            format!(
                "{} built-in paths and {} --deny-read unreadable; data dir unreadable",
                SECRETS.len(),
                self.policy.deny_read.len()
            ),
        );
        add(
            "protected",
            false,
            "Landlock cannot keep a file read-only in a writable workspace: .git/config, hooks, .envrc are writable \
             (--workspace review keeps them out of your files); what is created where one is missing is moved out"
                .into(),
        );
        add(
            "workspace",
            self.workspace_mode == WorkspaceMode::Review,
            match self.workspace_mode {
                WorkspaceMode::Direct => "direct: the agent's writes land in your files at once".into(),
                WorkspaceMode::Review => {
                    "review: the agent works on a copy; its edits reach you through the editor".into()
                }
            },
        );
        let network = match &self.network {
            NetworkMode::Host => {
                (false, "--network host: the host's network, loopback and every host service included".into())
            }
            mode => (
                true,
                format!(
                    "TCP only to the bridge's proxy ({mode}) and the model endpoints on loopback, by port (Landlock \
                     cannot tell hosts apart: those ports are open on any host); no UDP, raw or unix sockets"
                ),
            ),
        };
        add("network", network.0, network.1);
        add("capabilities", true, "all dropped, bounding set included; no_new_privs".into());
        add(
            "seccomp",
            true,
            format!("denies {}; sockets other than TCP and netlink refused", seccomp::DENIED.join(", ")),
        );
        add(
            "scoping",
            abi >= super::landlock::SCOPE_ABI,
            if abi >= super::landlock::SCOPE_ABI {
                "no signal and no abstract unix socket outside the sandbox".into()
            } else {
                format!(
                    "Landlock ABI {abi} < {}: the agent can signal your other processes and reach abstract unix \
                     sockets",
                    super::landlock::SCOPE_ABI
                )
            },
        );
        add(
            "processes",
            false,
            "the host's process list and command lines are visible (no PID namespace); a subreaper ends every \
             descendant with the turn"
                .into(),
        );
        add(
            "limits",
            true,
            format!(
                "at most {} processes and {} (a cgroup where one can be made, else watched by the sandbox's first \
                 process)",
                self.limits.max_processes,
                limits::format_size(self.limits.max_memory_bytes)
            ),
        );
        lines
    }
}
