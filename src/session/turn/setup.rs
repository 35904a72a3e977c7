//! What a turn installs before its agent runs: the CLI's executable (found, or installed on first use, on a card)
//! and the packages OpenCode wants beside a binary of the user's own.

use std::path::{Path, PathBuf};

use super::*;
use crate::sandbox::install;

impl Turn<'_> {
    /// The CLI's executable on this machine: the override, PATH, the tools cache, or an install on first use; for
    /// a version the bridge can drive (see [`Bridge::supported_executable`]).
    pub(super) async fn local_executable(&self, emit: &Emitter) -> Result<PathBuf> {
        // The install hears the cancel itself, so that its card says how it ended.
        let executable = self.executable(emit).await?;
        let found = self.bridge.supported_executable(self.agent, &executable, &self.cancel);
        let executable = match self.unless_cancelled(found).await? {
            Some((pinned, _)) => pinned,
            None => return Err(Error::Sandbox(crate::sandbox::SandboxError::Cancelled)),
        };
        self.companion(emit, &executable).await?;
        Ok(executable)
    }

    /// Installs the package the agent wants beside this executable (OpenCode's plugin package) unless the tools
    /// cache has it, behind a card: without it the agent would install it itself, in every new session, and wait
    /// on npm before it answers. A failed install is said and the turn goes on.
    pub(super) async fn companion(&self, emit: &Emitter, executable: &Path) -> Result<()> {
        let Some(companion) = self.bridge.companion(self.agent, executable).await else { return Ok(()) };
        if companion.installed() {
            return Ok(());
        }
        let call_id = format!("install-{}", companion.package);
        emit.send(SessionUpdate::ToolCall(
            ToolCall::new(
                call_id.clone(),
                format!(
                    "Installing {} {} for {} (once per version)",
                    companion.package,
                    companion.version,
                    self.agent.display_name()
                ),
            )
            .kind(ToolKind::Other)
            .status(ToolCallStatus::InProgress)
            .raw_input(serde_json::json!({ "npm": format!("{}@{}", companion.package, companion.version) })),
        ))
        .await?;
        let (status, said) = match companion.install(&self.bridge.config().data_dir, &self.cancel).await {
            Ok(_) => (ToolCallStatus::Completed, None),
            Err(crate::sandbox::SandboxError::Cancelled) => {
                emit.send(update(&call_id, ToolCallUpdateFields::new().status(ToolCallStatus::Failed))).await?;
                return Err(Error::Sandbox(crate::sandbox::SandboxError::Cancelled));
            }
            Err(e) => (
                ToolCallStatus::Failed,
                Some(format!("{e}. {} will try to install it itself.", self.agent.display_name())),
            ),
        };
        let mut fields = ToolCallUpdateFields::new().status(status);
        if let Some(said) = said {
            fields = fields.content(vec![ToolCallContent::from(said)]);
        }
        emit.send(update(&call_id, fields)).await?;
        Ok(())
    }

    /// The CLI's executable: the override, PATH, the tools cache, or an install on first use.
    pub(super) async fn executable(&self, emit: &Emitter) -> Result<PathBuf> {
        if let Some(path) = crate::locate::installed_executable(self.bridge.config(), self.agent) {
            return Ok(path);
        }
        let tools = crate::paths::tools_dir(&self.bridge.config().data_dir);
        let install = install::install(self.agent.package(), &tools, &self.cancel);
        let fix = format!(
            "Put `{}` on PATH or set ACP_SANDBOX_{}_BIN.",
            self.agent.package().bin,
            self.agent.as_str().to_uppercase()
        );
        self.install_card(emit, "", install, &fix).await
    }

    /// Runs an install of the CLI behind a tool card that says how it went: done, cancelled, or npm's words. `place`
    /// says where, for the card and the error (empty: this machine); `fix` what the user can do when it fails.
    pub(in crate::session) async fn install_card(
        &self,
        emit: &Emitter,
        place: &str,
        install: impl Future<Output = std::result::Result<PathBuf, crate::sandbox::SandboxError>>,
        fix: &str,
    ) -> Result<PathBuf> {
        let package = self.agent.package();
        let call_id = format!("install-{}", package.bin);
        emit.send(SessionUpdate::ToolCall(
            ToolCall::new(
                call_id.clone(),
                format!("Installing {} {}{place} (first use)", self.agent.display_name(), package.version),
            )
            .kind(ToolKind::Other)
            .status(ToolCallStatus::InProgress)
            .raw_input(serde_json::json!({ "npm": format!("{}@{}", package.name, package.version) })),
        ))
        .await?;
        match install.await {
            Ok(path) => {
                emit.send(update(&call_id, ToolCallUpdateFields::new().status(ToolCallStatus::Completed))).await?;
                // The model listing runs on this machine: only a local install changes it.
                if place.is_empty() {
                    self.bridge.refresh_models();
                }
                Ok(path)
            }
            Err(crate::sandbox::SandboxError::Cancelled) => {
                emit.send(update(
                    &call_id,
                    ToolCallUpdateFields::new()
                        .status(ToolCallStatus::Failed)
                        .content(vec![ToolCallContent::from("The install was cancelled.".to_string())]),
                ))
                .await?;
                Err(Error::Sandbox(crate::sandbox::SandboxError::Cancelled))
            }
            Err(e) => {
                emit.send(update(
                    &call_id,
                    ToolCallUpdateFields::new()
                        .status(ToolCallStatus::Failed)
                        .content(vec![ToolCallContent::from(e.to_string())]),
                ))
                .await?;
                Err(Error::CliUnavailable(format!(
                    "{} is not installed{place} and could not be installed: {e}. {fix}",
                    self.agent.display_name(),
                )))
            }
        }
    }
}
