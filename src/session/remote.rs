//! Sessions in remote sandboxes (a [`Sandbox`] with [`Sandbox::remote_files`], which does not see this machine):
//! what an earlier bridge left running is ended, the user's configuration of the CLI is staged through the
//! provider's files API, the CLI is installed inside on first use, its command is made for the sandbox, and the
//! sandbox is suspended once a turn ended (`--remote-idle pause`).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::emitter::Emitter;
use super::turn::Turn;
use super::{Bridge, LiveSession, note};
use crate::agents::AgentKind;
use crate::config::RemoteIdle;
use crate::error::{Error, Result};
use crate::sandbox::{RemoteFiles, Sandbox, SandboxError, install};

/// A file of the user's CLI configuration larger than this is not staged (the log says so).
const STAGE_FILE_LIMIT: u64 = 1024 * 1024;
/// At most this many files of the user's CLI configuration are staged.
const STAGE_FILES: usize = 500;
/// Folders of a CLI's configuration that are the CLI's own downloads, not configuration (OpenCode installs its
/// plugins into `node_modules` there; the CLI in the sandbox fetches them itself).
const NOT_STAGED: &[&str] = &["node_modules", ".git"];

/// What the bridge keeps about its sessions' remote sandboxes.
#[derive(Default)]
pub(super) struct RemoteSessions {
    /// Per session: what was staged into its sandbox.
    staged: Mutex<HashMap<String, Staged>>,
    /// Sessions whose turn ran in a remote sandbox that was not suspended since.
    used: Mutex<HashSet<String>>,
    /// Suspensions in flight: the bridge waits for them (within its grace) when it shuts down.
    suspending: Arc<AtomicUsize>,
}

/// The configuration files staged into one sandbox.
#[derive(Default)]
struct Staged {
    /// The sandbox's id.
    sandbox: String,
    /// Each file's path there, with a hash of the bytes uploaded.
    files: HashMap<PathBuf, u64>,
}

impl RemoteSessions {
    /// Whether a suspension is still on its way.
    pub(super) fn suspending(&self) -> bool {
        self.suspending.load(Ordering::SeqCst) > 0
    }

    /// Counts a suspension as on its way until the guard is dropped (handed to [`Bridge::suspend_after_turn`]).
    pub(super) fn on_its_way(&self) -> Counted {
        self.suspending.fetch_add(1, Ordering::SeqCst);
        Counted(self.suspending.clone())
    }

    /// Uploads the files of the user's configuration of the CLI (what a local sandbox shows read-only) that changed
    /// since they were last uploaded to this session's sandbox, but never a credential file: the CLI gets those
    /// through its environment ([`cli_spec`]). Answers how many were uploaded.
    async fn stage_config(
        &self,
        agent: AgentKind,
        sandbox: &dyn Sandbox,
        files: &dyn RemoteFiles,
        session: &str,
        sandbox_id: &str,
    ) -> std::result::Result<usize, SandboxError> {
        let (user_config, user_data) = (crate::paths::user_config_dir(), crate::paths::user_data_dir());
        let pairs = agent.user_config(&user_config, &user_data, sandbox.state_dir());
        let skip = agent.credential_files();
        let wanted = tokio::task::spawn_blocking(move || config_files(&pairs, skip))
            .await
            .map_err(|_| SandboxError::Unavailable("reading the CLI's configuration stopped".into()))?;
        let mut uploaded = 0;
        for (target, bytes) in wanted {
            let hash = hash(&bytes);
            let known = {
                let mut staged = self.staged.lock().unwrap_or_else(|p| p.into_inner());
                let entry = staged.entry(session.to_string()).or_default();
                // A new sandbox (this bridge's or another's) has nothing staged.
                if entry.sandbox != sandbox_id {
                    *entry = Staged { sandbox: sandbox_id.to_string(), files: HashMap::new() };
                }
                entry.files.get(&target).copied()
            };
            if known == Some(hash) {
                continue;
            }
            files.write(&target, &bytes).await?;
            uploaded += 1;
            if let Some(entry) = self.staged.lock().unwrap_or_else(|p| p.into_inner()).get_mut(session) {
                entry.files.insert(target, hash);
            }
        }
        if uploaded > 0 {
            tracing::info!(session, files = uploaded, "staged the CLI's configuration in the sandbox");
        }
        Ok(uploaded)
    }
}

/// The files below each (host path, sandbox path) pair, as (sandbox path, bytes): regular files (links followed),
/// without credential files, the CLI's downloads, over-large files or more than [`STAGE_FILES`].
fn config_files(pairs: &[(PathBuf, PathBuf)], skip: &[&str]) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut queue: Vec<(PathBuf, PathBuf)> = pairs.to_vec();
    while let Some((host, target)) = queue.pop() {
        let name = host.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if skip.contains(&name.as_str()) {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&host) else { continue };
        if meta.is_dir() {
            if NOT_STAGED.contains(&name.as_str()) {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&host) else { continue };
            for entry in entries.flatten() {
                queue.push((entry.path(), target.join(entry.file_name())));
            }
        } else if meta.is_file() {
            if meta.len() > STAGE_FILE_LIMIT {
                tracing::warn!(file = %host.display(), "not staged in the sandbox: larger than 1 MiB");
                continue;
            }
            if found.len() == STAGE_FILES {
                tracing::warn!(file = %host.display(), "not staged in the sandbox: more than {STAGE_FILES} files");
                continue;
            }
            if let Ok(bytes) = std::fs::read(&host) {
                found.push((target, bytes));
            }
        }
    }
    found.sort();
    found
}

fn hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

impl Turn<'_> {
    /// Makes a remote sandbox ready for the CLI and answers its executable there: what an earlier, killed bridge
    /// left running is ended first (never two CLIs on one conversation), the user's configuration is staged, then
    /// the CLI is the override (`ACP_SANDBOX_<AGENT>_BIN`, a path inside the sandbox), the one an earlier turn
    /// installed, or installed now with npm inside, behind a card like the local first-use install.
    pub(super) async fn remote_executable(
        &self,
        emit: &Emitter,
        sandbox: &dyn Sandbox,
        files: &dyn RemoteFiles,
    ) -> Result<PathBuf> {
        let bridge = self.bridge;
        let session = self.record.id.as_str();
        bridge.remote.used.lock().unwrap_or_else(|p| p.into_inner()).insert(session.to_string());
        let cancelled = || Error::Sandbox(SandboxError::Cancelled);
        let strays =
            self.unless_cancelled(async { Ok(sandbox.end_leftovers().await?) }).await?.ok_or_else(cancelled)?;
        if strays > 0 {
            tracing::warn!(session, strays, "ended what an earlier bridge left running in the sandbox");
            emit.send(note(&format!(
                "_{} was still running in the sandbox from a turn acp-sandbox did not see to its end (it stopped \
                 mid-turn); that run was stopped before this prompt._",
                self.agent.display_name()
            )))
            .await?;
        }
        let staged = async {
            // The sandbox's id as `session_sandbox` just stored it.
            let current = bridge.store.session(session).await?.and_then(|record| record.sandbox_id).unwrap_or_default();
            Ok(bridge.remote.stage_config(self.agent, sandbox, files, session, &current).await?)
        };
        self.unless_cancelled(staged).await?.ok_or_else(cancelled)?;
        if let Some(path) = bridge.config().bin_override(self.agent) {
            return Ok(path.clone());
        }
        let package = self.agent.package();
        let found = self.unless_cancelled(async { Ok(install::installed_in(package, sandbox, files).await?) });
        if let Some(path) = found.await?.ok_or_else(cancelled)? {
            return Ok(path);
        }
        let fix = format!(
            "Make the sandboxes from a template with Node.js and npm, or set ACP_SANDBOX_{}_BIN to the CLI's path \
             inside the sandbox.",
            self.agent.as_str().to_uppercase()
        );
        let install = install::install_in(package, sandbox, &self.cancel);
        self.install_card(emit, " in the sandbox", install, &fix).await
    }
}

impl Bridge {
    /// Suspends the session's remote sandbox once its turn ended, unless `--remote-idle keep`, in the background: the
    /// prompt's answer never waits for it. Call it after the turn let go of the session (its ticket and running
    /// mark dropped). A suspension and the next prompt's connect take the session's gate in turn, so the connect
    /// resumes a sandbox paused before it; a prompt that arrived first (queued or running) cancels the suspension.
    pub(super) fn suspend_after_turn(&self, id: &str, live: Arc<LiveSession>, counted: Counted) {
        if !self.remote.used.lock().unwrap_or_else(|p| p.into_inner()).remove(id) {
            return;
        }
        if self.config.remote_idle == RemoteIdle::Keep {
            return;
        }
        let (provider, store, gate, id) = (self.provider.clone(), self.store.clone(), self.gate(id), id.to_string());
        tokio::spawn(async move {
            let _counted = counted;
            let _one = gate.lock().await;
            // Another prompt of the session came meanwhile, here or in another bridge: it needs the sandbox awake.
            if !live.idle() || store.running_elsewhere(&id).await.unwrap_or(true) {
                tracing::debug!(session = %id, "not suspending the sandbox: another prompt came first");
                return;
            }
            let Ok(Some(record)) = store.session(&id).await else { return };
            let Some(sandbox) = record.sandbox_id.filter(|_| record.sandbox_provider == provider.name()) else {
                return;
            };
            match provider.suspend(&sandbox).await {
                Ok(()) => tracing::info!(session = %id, %sandbox, "suspended the sandbox until the next prompt"),
                Err(e) => tracing::warn!(session = %id, %sandbox, "could not suspend the sandbox: {e}"),
            }
        });
    }
}

/// Counts a suspension down when it is dropped: at the end of its task, or when there is none to make.
pub(super) struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    use crate::sandbox::ExecSpec;
    use crate::session::cli::remote_cli_spec as cli_spec;

    #[test]
    fn staged_config_leaves_out_credentials_downloads_and_large_files() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("opencode");
        std::fs::create_dir_all(config.join("command")).unwrap();
        std::fs::create_dir_all(config.join("node_modules/plugin")).unwrap();
        std::fs::write(config.join("opencode.json"), "{}").unwrap();
        std::fs::write(config.join("command/review.md"), "review").unwrap();
        std::fs::write(config.join("auth.json"), "{\"key\":1}").unwrap();
        std::fs::write(config.join("node_modules/plugin/index.js"), "x").unwrap();
        std::fs::write(config.join("big.txt"), vec![b'x'; STAGE_FILE_LIMIT as usize + 1]).unwrap();
        let auth = dir.path().join("data/opencode/auth.json");
        std::fs::create_dir_all(auth.parent().unwrap()).unwrap();
        std::fs::write(&auth, "{\"secret\":1}").unwrap();
        let state = PathBuf::from("/home/user/.acp-sandbox");
        let pairs = vec![
            (config.clone(), state.join("config/opencode")),
            (auth, state.join("data/opencode/auth.json")),
            (dir.path().join("missing"), state.join("config/missing")),
        ];
        let found = config_files(&pairs, crate::agents::AgentKind::parse("opencode").unwrap().credential_files());
        assert_eq!(
            found,
            vec![
                (state.join("config/opencode/command/review.md"), b"review".to_vec()),
                (state.join("config/opencode/opencode.json"), b"{}".to_vec()),
            ]
        );
    }

    #[test]
    fn a_remote_command_has_no_host_paths_and_carries_the_stored_login_in_its_environment() {
        let env = vec![
            ("PATH".to_string(), "/host/bin".to_string()),
            ("HTTPS_PROXY".to_string(), "http://proxy.corp:3128".to_string()),
            ("HOME".to_string(), "/home/user/.acp-sandbox/home".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
        ];
        struct Remote;
        #[async_trait::async_trait]
        impl Sandbox for Remote {
            fn workspace(&self) -> &Path {
                Path::new("/home/user/workspace")
            }
            fn state_dir(&self) -> &Path {
                Path::new("/home/user/.acp-sandbox")
            }
            fn isolation(&self) -> String {
                "remote".into()
            }
            async fn exec(&self, _spec: ExecSpec) -> std::result::Result<crate::sandbox::RunningProcess, SandboxError> {
                Err(SandboxError::Unavailable("a test".into()))
            }
            async fn write_state_file(&self, _path: &Path, _bytes: &[u8]) -> std::result::Result<(), SandboxError> {
                Ok(())
            }
        }
        let spec = cli_spec(
            crate::agents::AgentKind::parse("amp").unwrap(),
            Path::new("/opt/amp"),
            &Remote,
            env,
            vec!["-x".into()],
        );
        assert_eq!(
            (spec.program, spec.args, spec.cwd, spec.env, spec.read_only, spec.tools),
            (
                PathBuf::from("/opt/amp"),
                vec!["-x".to_string()],
                PathBuf::from("/home/user/workspace"),
                vec![
                    ("HOME".to_string(), "/home/user/.acp-sandbox/home".to_string()),
                    ("LANG".to_string(), "C.UTF-8".to_string())
                ],
                vec![],
                vec![]
            )
        );
    }
}
