//! A kept-warm server (`--keep-warm`) on the local sandbox's side: recorded when it starts, so that the next
//! bridge finds it, and adopted by that bridge: a handle that is not its child, known by pid and start time, whose
//! proxy this bridge serves again.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::owners::record_owner;
use super::{LocalSandbox, MIN_LINGER_SECS, ProcessGuards, signal_init_of, warm};
use crate::sandbox::process::start_time;
use crate::sandbox::{ExecSpec, ExitInfo, ProcessHandle, RunningProcess, SandboxError};

impl LocalSandbox {
    /// Records a kept-warm server just started, for the next bridge to adopt. Without its record it is not kept:
    /// it ends with its handle like any command.
    pub(super) fn keep_record(
        &self,
        keep: warm::KeepWarm,
        fingerprint: String,
        pid: u32,
        door: &Path,
        guards: &ProcessGuards,
    ) -> Option<Warm> {
        let root = i32::try_from(pid).ok()?;
        let record = warm::Record {
            key: keep.key.clone(),
            sandbox: self.session_id.clone(),
            workspace: self.host_workspace.clone(),
            fingerprint,
            settings: warm::settings_digest(&self.settings),
            pid: root,
            start: start_time(root)?,
            door: door.to_path_buf(),
            proxy_socket: guards.has_proxy().then(|| warm::proxy_socket(&self.settings.run_dir, &keep.key)),
            cgroups: guards.cgroup.as_ref().map(|cgroup| cgroup.dirs().to_vec()).unwrap_or_default(),
            secret: keep.secret,
            linger_secs: keep.linger.as_secs().max(MIN_LINGER_SECS),
            started_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0),
        };
        match warm::write(&self.settings.run_dir, &record) {
            Ok(()) => Some(Warm { run_dir: self.settings.run_dir.clone(), record }),
            Err(e) => {
                tracing::warn!(key = %keep.key, "the server is not kept warm: its record could not be written: {e}");
                None
            }
        }
    }

    /// Takes over a server an earlier bridge kept warm: its proxy is served again where its sandbox looks for it.
    // Off Linux no sandbox has a proxy (it is bubblewrap's): `spec` and `guards` serve only that.
    #[cfg_attr(not(linux_sandbox), allow(unused_variables, unused_mut))]
    pub(super) async fn adopt(&self, record: warm::Record, spec: &ExecSpec) -> Result<RunningProcess, SandboxError> {
        if let Err(e) = record_owner(&self.settings.run_dir, &self.session_id) {
            tracing::warn!(session = %self.session_id, "could not record this bridge as the owner: {e}");
        }
        let mut guards = ProcessGuards::default();
        #[cfg(linux_sandbox)]
        if record.proxy_socket.is_some() {
            let (proxy, _) = self.start_proxy(spec).await?;
            guards.proxy = Some(proxy);
        }
        tracing::info!(key = %record.key, pid = record.pid, "adopting a kept-warm server");
        let secret = record.secret.clone();
        let door = record.door.clone();
        Ok(RunningProcess {
            stdin: None,
            stdout: Box::pin(tokio::io::empty()),
            stderr: Box::pin(tokio::io::empty()),
            handle: Box::new(Adopted {
                warm: Warm { run_dir: self.settings.run_dir.clone(), record },
                guards,
                gone: None,
                detached: false,
            }),
            door: Some(std::sync::Arc::new(crate::sandbox::UnixDoor(door))),
            adopted: Some(secret),
        })
    }
}

/// A kept-warm server's record, and where it is.
pub(super) struct Warm {
    pub run_dir: PathBuf,
    pub record: warm::Record,
}

/// A server an earlier bridge kept warm, adopted by this one: not its child, so known by pid and start time.
struct Adopted {
    warm: Warm,
    /// Its proxy, served by this bridge.
    guards: ProcessGuards,
    gone: Option<ExitInfo>,
    detached: bool,
}

/// How often an adopted server is looked at for having exited (it is not the bridge's child).
const ADOPTED_POLL: std::time::Duration = std::time::Duration::from_millis(200);

#[async_trait]
impl ProcessHandle for Adopted {
    fn end_strays(&self) {
        if let Ok(root) = u32::try_from(self.warm.record.pid) {
            signal_init_of(root);
        }
    }

    async fn kill(&mut self) {
        if self.gone.is_none() {
            warm::stop(&self.warm.run_dir, &self.warm.record);
        }
    }

    async fn wait(&mut self) -> Result<ExitInfo, SandboxError> {
        if let Some(gone) = self.gone {
            return Ok(gone);
        }
        while self.warm.record.alive() {
            tokio::time::sleep(ADOPTED_POLL).await;
        }
        warm::forget(&self.warm.run_dir, &self.warm.record);
        let gone = ExitInfo { code: None, signal: None };
        self.gone = Some(gone);
        Ok(gone)
    }

    fn detach(&mut self) {
        self.detached = true;
    }
}

impl Drop for Adopted {
    fn drop(&mut self) {
        if !self.detached && self.gone.is_none() {
            warm::stop(&self.warm.run_dir, &self.warm.record);
        }
        // Its proxy goes with this bridge either way; the next one serves it again.
        self.guards.door = None;
    }
}
