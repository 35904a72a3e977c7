//! `acp-sandbox sessions list|show|rm`: the stored sessions, read from the store without starting a sandbox.

use std::io::Write;
use std::process::ExitCode;

use acp_sandbox::config::Config;
use acp_sandbox::sandbox::SandboxChoice;
use acp_sandbox::session::Bridge;
use acp_sandbox::store::{TurnStatus, rfc3339};
use agent_client_protocol::v1::schema::{ContentBlock, SessionUpdate};
use anyhow::Context;

use super::SessionsCommand;

pub(super) async fn sessions(config: Config, command: SessionsCommand) -> anyhow::Result<ExitCode> {
    let bridge =
        Bridge::open(Config { sandbox: SandboxChoice::None, ..config }).await.context("cannot open the store")?;
    let store = bridge.store();
    match command {
        SessionsCommand::List { cwd } => {
            // Sessions are stored under their workspace's canonical path.
            let cwd = match cwd {
                Some(dir) => Some(
                    std::fs::canonicalize(&dir)
                        .with_context(|| format!("--cwd {}: no such directory", dir.display()))?
                        .to_string_lossy()
                        .into_owned(),
                ),
                None => None,
            };
            let records = store.list_sessions(None, cwd.as_deref(), None, 1000).await?;
            if records.is_empty() {
                eprintln!("no sessions");
            }
            for record in records {
                out!(
                    "{}  {:<8}  {}  {}  {}",
                    record.id,
                    record.agent,
                    rfc3339(record.updated_at),
                    record.title.as_deref().unwrap_or("(untitled)"),
                    record.cwd
                );
            }
        }
        SessionsCommand::Show { id } => {
            let Some(record) = store.session(&id).await? else {
                eprintln!("{}", no_session(&id, &bridge));
                return Ok(ExitCode::FAILURE);
            };
            out!("session     {}", record.id);
            out!("agent       {}", record.agent);
            out!("title       {}", record.title.as_deref().unwrap_or("(untitled)"));
            out!("workspace   {}", record.cwd);
            out!(
                "sandbox     {} {}",
                record.sandbox_provider,
                record.sandbox_id.as_deref().unwrap_or("(not created yet)")
            );
            out!("cli session {}", record.native_id.as_deref().unwrap_or("(none yet)"));
            out!("config      {}", record.config);
            out!("created     {}", rfc3339(record.created_at));
            out!("updated     {}", rfc3339(record.updated_at));
            let history = store.history(&id, usize::MAX).await?;
            for (number, (turn, events)) in history.turns.into_iter().enumerate() {
                let status = match turn.status {
                    TurnStatus::Running => "running",
                    TurnStatus::Done => "done",
                    TurnStatus::Failed => "failed",
                    TurnStatus::Interrupted => "interrupted",
                };
                let outcome = turn.stop_reason.or(turn.error).map(|o| format!(": {o}")).unwrap_or_default();
                out!("\nturn {} at {}, {status}{outcome}", number + 1, rfc3339(turn.started_at));
                let prompt: Vec<ContentBlock> = serde_json::from_value(turn.prompt).unwrap_or_default();
                for block in prompt {
                    if let ContentBlock::Text(text) = block {
                        out!("  > {}", text.text.trim_end().replace('\n', "\n  > "));
                    }
                }
                let answer: String = events
                    .into_iter()
                    .filter_map(|event| match serde_json::from_value(event) {
                        Ok(SessionUpdate::AgentMessageChunk(chunk)) => match chunk.content {
                            ContentBlock::Text(text) => Some(text.text),
                            _ => None,
                        },
                        _ => None,
                    })
                    .collect();
                for line in answer.trim().lines() {
                    out!("{}", format!("  {line}").trim_end());
                }
            }
        }
        SessionsCommand::Rm { id } => {
            if store.session(&id).await?.is_none() {
                eprintln!("{}", no_session(&id, &bridge));
                return Ok(ExitCode::FAILURE);
            }
            bridge.delete_session(&id).await.map_err(|e| anyhow::anyhow!("{e}"))?;
            eprintln!("deleted {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Says that the store has no such session, and where to look.
fn no_session(id: &str, bridge: &Bridge) -> String {
    format!(
        "no session {id} in {}: `acp-sandbox sessions list` shows the stored ones",
        bridge.config().database_path().display()
    )
}
