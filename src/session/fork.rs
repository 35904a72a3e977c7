//! `session/fork`: a new session whose stored history is a copy of the original's and whose agent conversation is
//! a fork of the original's where the agent can fork it in place, else a new one started from the transcript.

use std::path::Path;

use agent_client_protocol::v1::schema::SessionConfigOption;

use crate::error::{Error, Result};
use crate::store::{ForkedFrom, SessionRecord, now_ms};

use super::servers::is_shared_sandbox;
use super::{Bridge, Given, given};

impl Bridge {
    /// Forks `id`. The workspace is the original's. In the workspace's shared sandbox (OpenCode's warm server) the
    /// fork is a session of the same sandbox whose OpenCode session is forked from the original's when its first
    /// prompt (or its server's warm start) needs it; elsewhere the fork gets a sandbox of its own and its first prompt
    /// starts the agent's conversation from the stored transcript. The original is untouched.
    pub async fn fork_session(
        &self,
        id: &str,
        cwd: &Path,
        given: &Given,
    ) -> Result<(String, Vec<SessionConfigOption>)> {
        let original = self.record(id).await?;
        self.check_workspace(Path::new(&original.cwd))?;
        if super::normalize(cwd) != original.cwd {
            return Err(Error::InvalidParams(format!(
                "a fork keeps its session's workspace {}, not {}",
                original.cwd,
                cwd.display()
            )));
        }
        let agent = self.agent_of(&original);
        let roots = self.check_roots(Path::new(&original.cwd), given)?;
        let mut context = given::context_after(agent, &original.context, given, roots)?;
        let shared = original
            .sandbox_id
            .as_deref()
            .filter(|_| original.sandbox_provider == self.provider.name())
            .and_then(|sandbox| Path::new(sandbox).file_name())
            .and_then(|name| name.to_str())
            .is_some_and(is_shared_sandbox);
        context.forked_from =
            Some(ForkedFrom { session: original.id.clone(), native: original.native_id.clone().filter(|_| shared) });
        let now = now_ms();
        let fork = SessionRecord {
            id: format!("sess_{}", uuid::Uuid::new_v4().simple()),
            agent: original.agent.clone(),
            cwd: original.cwd.clone(),
            sandbox_provider: if shared { original.sandbox_provider.clone() } else { self.provider.name().to_string() },
            sandbox_id: original.sandbox_id.clone().filter(|_| shared),
            native_id: None,
            title: original.title.clone(),
            config: original.config.clone(),
            context,
            created_at: now,
            updated_at: now,
        };
        self.store.fork_session(&original.id, &fork).await?;
        tracing::info!(session = %fork.id, original = %original.id, shared, "forked a session");
        self.take_mcp_servers(&fork.id, given);
        let options = self.config_options_of(&fork);
        Ok((fork.id, options))
    }
}
