//! The bubblewrap side of a local command's start (Linux only): the policy's plan for this sandbox, the
//! command's proxy in the sandbox's network namespace, the seccomp filter's fd, and bubblewrap's argv around it.

use std::os::fd::AsRawFd;
use std::path::Path;

use tokio::process::Command;

use super::bwrap::{self, NetSetup, bwrap_netns, bwrap_userns};
use super::limits::Limits;
use super::policy::{Disk, Plan, RealDisk, Subject};
use super::{LocalSandbox, ProcessGuards, protect, seccomp, warm};
use crate::paths;
use crate::sandbox::net::proxy::{NetworkMode, Proxy, ProxyPolicy};
use crate::sandbox::{ExecSpec, SandboxError};

/// The port of the proxy inside the sandbox.
const PROXY_PORT: u16 = 3128;

impl LocalSandbox {
    /// The command that runs `spec` under bubblewrap at `bwrap`, with the fds and the proxy it needs kept in
    /// `guards`; and whether a model endpoint below port 1024 must be opened in its network namespace once it runs.
    pub(super) async fn bwrap_command(
        &self,
        bwrap: &Path,
        spec: &mut ExecSpec,
        guards: &mut ProcessGuards,
        watch: Option<Limits>,
        door: Option<(i32, u16)>,
    ) -> Result<(Command, bool), SandboxError> {
        let subject = self.subject(spec);
        let plan = self.settings.policy.plan(&subject, &RealDisk);
        let net = if !self.settings.network.uses_proxy() {
            None
        } else if let Err(why) = bwrap_netns() {
            // The default degrades with a warning; a policy the user asked for is never dropped silently.
            if self.settings.network != NetworkMode::Open {
                return Err(SandboxError::Unavailable(format!(
                    "--network {} needs a network namespace of the sandbox's own: {why}",
                    self.settings.network
                )));
            }
            tracing::warn!(session = %self.session_id, "the sandbox shares the host's network: {why}");
            None
        } else {
            let (proxy, net) = self.start_proxy(spec).await?;
            guards.proxy = Some(proxy);
            spec.env.retain(|(name, _)| !name.to_ascii_lowercase().ends_with("_proxy"));
            spec.env.extend(proxy_env(net.port));
            Some(net)
        };
        let seccomp_fd = match seccomp::filter_fd() {
            Ok(fd) => {
                let raw = fd.as_raw_fd();
                guards.inherited.push(fd);
                Some(raw)
            }
            Err(e) => {
                tracing::warn!("running without a seccomp filter: {e}");
                None
            }
        };
        let low_ports = net.as_ref().is_some_and(|net| net.expose.iter().any(|port| *port < 1024));
        let mut command = Command::new(bwrap);
        command.args(self.bwrap_args(spec, &plan, net.as_ref(), seccomp_fd, watch, door));
        Ok((command, low_ports))
    }

    /// The argv of bubblewrap around a command: [`bwrap::argv`] of what this sandbox is.
    pub(super) fn bwrap_args(
        &self,
        spec: &ExecSpec,
        plan: &Plan,
        net: Option<&NetSetup>,
        seccomp_fd: Option<i32>,
        watch: Option<Limits>,
        door: Option<(i32, u16)>,
    ) -> Vec<String> {
        // The plan mounts the workspace where it really is (it may be named through a link).
        let real_workspace = RealDisk.canonical(&self.host_workspace).unwrap_or_else(|| self.host_workspace.clone());
        bwrap::argv(&bwrap::Wrap {
            spec,
            plan,
            copy: self.copy.as_ref().map(|copy| (real_workspace.as_path(), copy.path())),
            init_program: self.settings.init_program.as_deref(),
            userns: bwrap_userns(),
            net,
            seccomp_fd,
            watch,
            door,
        })
    }

    /// Starts the proxy of one command and says how the sandbox reaches it: a kept-warm server's proxy serves its
    /// socket in a directory of its own, at the same path whichever bridge serves it.
    pub(super) async fn start_proxy(&self, spec: &ExecSpec) -> Result<(Proxy, NetSetup), SandboxError> {
        let run_dir = &self.settings.run_dir;
        paths::create_private_dir(run_dir).map_err(|e| SandboxError::io(format!("create {}", run_dir.display()), e))?;
        let socket = match &spec.keep_warm {
            Some(keep) => {
                let socket = warm::proxy_socket(run_dir, &keep.key);
                if let Some(dir) = socket.parent() {
                    paths::create_private_dir(dir)
                        .map_err(|e| SandboxError::io(format!("create {}", dir.display()), e))?;
                }
                // What the bridge that served it before left (it was killed): replaced by this bridge's socket.
                let _ = std::fs::remove_file(&socket);
                socket
            }
            None => run_dir.join(format!("{}.sock", &uuid::Uuid::new_v4().simple().to_string()[..12])),
        };
        let expose: Vec<u16> = spec
            .net
            .endpoints
            .iter()
            .filter(|(host, _)| is_loopback_name(host))
            .map(|(_, port)| *port)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let port = (PROXY_PORT..).find(|port| !expose.contains(port)).unwrap_or(PROXY_PORT);
        // The tunnel of an exposed port asks for 127.0.0.1, whatever loopback name the config used.
        let mut endpoints = spec.net.endpoints.clone();
        endpoints.extend(expose.iter().map(|port| ("127.0.0.1".to_string(), *port)));
        let policy = ProxyPolicy {
            mode: self.settings.network.clone(),
            endpoints,
            service_hosts: spec.net.service_hosts.clone(),
        };
        let asker = self.asker.clone();
        let proxy = Proxy::start_asking(&socket, policy, self.session_id.clone(), self.budget.clone(), asker)
            .await
            .map_err(|e| SandboxError::Unavailable(format!("cannot start the network proxy: {e}")))?;
        let in_dir = spec.keep_warm.is_some();
        Ok((proxy, NetSetup { socket, port, expose, in_dir }))
    }
}

/// Host names that mean the loopback of whoever resolves them.
fn is_loopback_name(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The variables that send the CLI's traffic to the proxy inside the sandbox.
pub(super) fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name.to_string(), url.clone()));
        env.push((name.to_lowercase(), url.clone()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_string(), "localhost,127.0.0.1,::1".to_string()));
    }
    env
}

impl LocalSandbox {
    /// The host paths one command's sandbox is made of: where the agent sees the workspace (its copy in review mode
    /// without bubblewrap), the other roots, the state dir, the CLI's install, and the state dir's private parts.
    pub(super) fn subject(&self, spec: &ExecSpec) -> Subject {
        Subject {
            workspace: self.workspace.clone(),
            roots: self.roots.clone(),
            state_dir: self.state_dir.clone(),
            tools: spec.tools.clone(),
            private: self
                .copy
                .iter()
                .map(|copy| copy.review_dir().to_path_buf())
                .chain([self.state_dir.join(protect::QUARANTINE)])
                .collect(),
        }
    }
}
