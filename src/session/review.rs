//! Review before write: the agent's changes to its copy of the workspace reach the user's files through the
//! editor (`fs/write_text_file`, which Zed lists for Keep/Reject), or, where the editor cannot take them, directly
//! with a note in the thread that lists them. A remote sandbox is always reviewed: its workspace is mirrored in a
//! copy on this machine, pulled before each review and pushed after it (`sandbox::mirror`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_client_protocol::v1::schema::{
    SessionUpdate, ToolCall, ToolCallContent, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
    WriteTextFileRequest,
};

use super::turn::Emitter;
use super::{UpdateSink, note};
use crate::error::{Error, Result};
use crate::sandbox::mirror::{Mirror, Pushed};
use crate::sandbox::review::{Change, WorkspaceCopy};
use crate::sandbox::{Sandbox, SandboxError};

/// The largest text file handed to the editor; a larger one is applied directly.
const TEXT_LIMIT: usize = 2 * 1024 * 1024;
/// At most this many files go to the editor per review (a generated tree would flood its review list); the
/// rest is applied directly.
const WRITES_PER_REVIEW: usize = 100;
/// At most this many paths are named in a note.
const NOTE_PATHS: usize = 20;

/// The review of one turn.
pub(super) struct Review<'a> {
    pub copy: Arc<WorkspaceCopy>,
    pub sink: Arc<dyn UpdateSink>,
    pub session_id: String,
    /// The editor's workspace: paths sent to the editor are absolute paths in it.
    pub workspace: PathBuf,
    /// The client advertised `fs.writeTextFile`.
    pub editor_writes: bool,
    /// A remote sandbox, whose workspace the copy mirrors.
    pub mirror: Option<Mirror<'a>>,
}

/// Why a change was applied directly.
#[derive(Debug)]
enum Direct {
    Deleted,
    Linked,
    Binary,
    TooLarge,
    Many,
    NoEditor,
    Refused(String),
}

impl<'a> Review<'a> {
    /// The review of a turn in `sandbox`: in review mode its copy, and for a remote sandbox (whatever the mode) a
    /// copy in the session's state dir on this machine, `review_dir`, that mirrors the sandbox's workspace.
    pub fn of(
        sandbox: &'a dyn Sandbox,
        mirrored: impl FnOnce() -> WorkspaceCopy,
        sink: Arc<dyn UpdateSink>,
        session_id: &str,
        workspace: PathBuf,
        editor_writes: bool,
    ) -> Option<Self> {
        let (copy, mirror) = match sandbox.remote_files() {
            Some(_) => {
                let copy = Arc::new(mirrored().without_git_ignored());
                (copy.clone(), Mirror::new(sandbox, copy))
            }
            None => (sandbox.review_copy()?, None),
        };
        Some(Review { copy, sink, session_id: session_id.to_string(), workspace, editor_writes, mirror })
    }

    /// Before the agent runs: what an earlier turn left unreviewed (a crash, a cancel) is reviewed, then the copy
    /// is made equal to the user's files (and a remote sandbox's workspace to the copy).
    pub async fn begin(&self, emit: &Emitter) -> Result<()> {
        let known = match &self.mirror {
            Some(mirror) => mirror.pull(false).await?,
            None => true,
        };
        self.review(emit).await?;
        let copy = self.copy.clone();
        blocking(move || copy.sync()).await.map_err(|e| Error::Sandbox(SandboxError::io("sync the review copy", e)))?;
        let Some(mirror) = &self.mirror else { return Ok(()) };
        if known {
            mirror.push().await?;
            return Ok(());
        }
        // A whole workspace goes up (the session's first prompt, or a new sandbox): a card shows it happening.
        let id = format!("{}-upload", emit.turn_id);
        emit.send(SessionUpdate::ToolCall(
            ToolCall::new(id.clone(), "Uploading the workspace to the sandbox")
                .kind(ToolKind::Other)
                .status(ToolCallStatus::InProgress),
        ))
        .await?;
        let pushed = mirror.push().await;
        let (status, text) = match &pushed {
            Ok(pushed) => (ToolCallStatus::Completed, uploaded(pushed)),
            Err(e) => (ToolCallStatus::Failed, e.to_string()),
        };
        let fields = ToolCallUpdateFields::new().status(status).content(vec![ToolCallContent::from(text)]);
        emit.send(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id, fields))).await?;
        pushed.map(drop).map_err(Error::Sandbox)
    }

    /// After a tool and at the end of the turn: every change goes to the editor or is applied, and is noted
    /// (for a remote sandbox: brought back first, and what the review reset sent back after).
    pub async fn step(&self, emit: &Emitter) -> Result<()> {
        if let Some(mirror) = &self.mirror
            && let Err(e) = mirror.pull(true).await
        {
            tracing::warn!(session = %self.session_id, "could not bring the agent's changes back from its sandbox: {e}");
            return Ok(());
        }
        self.review(emit).await?;
        if let Some(mirror) = &self.mirror
            && let Err(e) = mirror.push().await
        {
            tracing::warn!(session = %self.session_id, "could not reset the reviewed files in the sandbox: {e}");
        }
        Ok(())
    }

    /// Every change of the copy goes to the editor or is applied, and is noted. A change that cannot be read or
    /// applied now stays in the copy for the next review.
    async fn review(&self, emit: &Emitter) -> Result<()> {
        let copy = self.copy.clone();
        let mut changes = match blocking(move || copy.changes()).await {
            Ok(changes) => changes,
            Err(e) => {
                tracing::warn!(session = %self.session_id, "could not read the agent's changes: {e}");
                return Ok(());
            }
        };
        // Deletions first: a directory the agent replaced by a link is emptied before the link takes its place
        // (its files are never reached through the link).
        changes.sort_by_key(|change| !matches!(change, Change::Deleted { .. }));
        let mut direct: Vec<(PathBuf, Direct)> = Vec::new();
        let mut kept: Vec<PathBuf> = Vec::new();
        let mut failed: Vec<(PathBuf, String)> = Vec::new();
        let mut sent = 0;
        for change in changes {
            let path = change.path().to_path_buf();
            let why = match &change {
                Change::Deleted { .. } => Direct::Deleted,
                Change::Linked { .. } => Direct::Linked,
                Change::Written { bytes, .. } => {
                    let (copy, rel, held) = (self.copy.clone(), path.clone(), bytes.clone());
                    if blocking(move || Ok(copy.workspace_holds(&rel, &held))).await.unwrap_or(false) {
                        // The user's file already says this (the agent wrote it back): nothing to review.
                        self.settle(&path, bytes).await;
                        continue;
                    }
                    match text_of(bytes) {
                        Err(why) => why,
                        Ok(_) if !self.editor_writes => Direct::NoEditor,
                        Ok(_) if sent >= WRITES_PER_REVIEW => Direct::Many,
                        Ok(text) => {
                            sent += 1;
                            let request = WriteTextFileRequest::new(
                                self.session_id.clone(),
                                self.workspace.join(&path),
                                text.to_string(),
                            );
                            match self.sink.write_text_file(request).await {
                                Ok(()) => {
                                    self.settle(&path, bytes).await;
                                    continue;
                                }
                                Err(why) => {
                                    tracing::warn!(session = %self.session_id, path = %path.display(), "the editor refused a write: {why}");
                                    Direct::Refused(why)
                                }
                            }
                        }
                    }
                }
            };
            let copy = self.copy.clone();
            let applied = blocking(move || copy.apply(&change)).await;
            match applied {
                Ok(true) => direct.push((path, why)),
                Ok(false) => kept.push(path),
                Err(e) => failed.push((path, e.to_string())),
            }
        }
        if !direct.is_empty() {
            emit.send(note(&direct_note(&direct, self.editor_writes))).await?;
        }
        if !kept.is_empty() {
            emit.send(note(&format!(
                "_Not deleted, because you changed {} since the agent saw {}: {}._",
                if kept.len() == 1 { "it" } else { "them" },
                if kept.len() == 1 { "it" } else { "them" },
                paths(kept.iter().map(PathBuf::as_path))
            )))
            .await?;
        }
        if !failed.is_empty() {
            let list: Vec<String> =
                failed.iter().take(NOTE_PATHS).map(|(path, why)| format!("`{}` ({why})", path.display())).collect();
            emit.send(note(&format!(
                "_These changes of the agent could not reach your files and stay in its copy: {}._",
                list.join(", ")
            )))
            .await?;
        }
        Ok(())
    }

    async fn settle(&self, path: &Path, bytes: &[u8]) {
        let (copy, rel, sent) = (self.copy.clone(), path.to_path_buf(), bytes.to_vec());
        if let Err(e) = blocking(move || copy.settle(&rel, &sent)).await {
            tracing::warn!(session = %self.session_id, path = %path.display(), "could not reset the agent's copy: {e}");
        }
    }
}

/// What the upload card says once the workspace is in the sandbox.
fn uploaded(pushed: &Pushed) -> String {
    let size = if pushed.bytes >= 1024 * 1024 {
        format!("{:.1} MiB", pushed.bytes as f64 / (1024.0 * 1024.0))
    } else {
        format!("{} KiB", pushed.bytes.div_ceil(1024))
    };
    format!(
        "{} {} ({size}) uploaded; what `.gitignore` ignores and the secrets the sandbox hides stay on this machine.",
        pushed.files,
        if pushed.files == 1 { "file" } else { "files" }
    )
}

/// The text of a file the editor can show, or why it is applied directly.
fn text_of(bytes: &[u8]) -> std::result::Result<&str, Direct> {
    if bytes.len() > TEXT_LIMIT {
        return Err(Direct::TooLarge);
    }
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.contains('\0') => Ok(text),
        _ => Err(Direct::Binary),
    }
}

/// The note that lists what was applied without review.
fn direct_note(direct: &[(PathBuf, Direct)], editor_writes: bool) -> String {
    let group = |label: &str, pick: fn(&Direct) -> bool| {
        let picked: Vec<&Path> = direct.iter().filter(|(_, why)| pick(why)).map(|(path, _)| path.as_path()).collect();
        (!picked.is_empty()).then(|| format!("{label} {}", paths(picked.into_iter())))
    };
    let mut parts: Vec<String> = [
        group("deleted", |why| matches!(why, Direct::Deleted)),
        group("links", |why| matches!(why, Direct::Linked)),
        group("binary", |why| matches!(why, Direct::Binary)),
        group("larger than 2 MiB", |why| matches!(why, Direct::TooLarge)),
        group("beyond the first 100 files", |why| matches!(why, Direct::Many)),
        group("written", |why| matches!(why, Direct::NoEditor)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut refused: std::collections::BTreeMap<&str, Vec<&Path>> = Default::default();
    for (path, why) in direct {
        if let Direct::Refused(reason) = why {
            refused.entry(reason.as_str()).or_default().push(path);
        }
    }
    for (reason, picked) in refused {
        parts.push(format!("refused by the editor ({reason}) {}", paths(picked.into_iter())));
    }
    let head = if editor_writes {
        "Applied to your files directly, without review"
    } else {
        "This editor cannot review file writes (it does not offer `fs/writeTextFile`), so the agent's changes were applied to your files directly"
    };
    format!("_{head}: {}._", parts.join("; "))
}

fn paths<'a>(all: impl Iterator<Item = &'a Path>) -> String {
    let all: Vec<&Path> = all.collect();
    let mut named: Vec<String> = all.iter().take(NOTE_PATHS).map(|path| format!("`{}`", path.display())).collect();
    if all.len() > NOTE_PATHS {
        named.push(format!("and {} more", all.len() - NOTE_PATHS));
    }
    named.join(", ")
}

/// Runs file work off the async runtime's threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(std::io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_note_groups_what_was_applied_directly() {
        let direct = vec![
            (PathBuf::from("old.txt"), Direct::Deleted),
            (PathBuf::from("logo.png"), Direct::Binary),
            (PathBuf::from("b.txt"), Direct::Deleted),
        ];
        assert_eq!(
            direct_note(&direct, true),
            "_Applied to your files directly, without review: deleted `old.txt`, `b.txt`; binary `logo.png`._"
        );
        assert_eq!(
            direct_note(&[(PathBuf::from("a.txt"), Direct::NoEditor)], false),
            "_This editor cannot review file writes (it does not offer `fs/writeTextFile`), so the agent's changes \
             were applied to your files directly: written `a.txt`._"
        );
    }

    #[test]
    fn the_upload_card_says_how_much_went_up() {
        assert_eq!(
            uploaded(&Pushed { files: 1, bytes: 10 }),
            "1 file (1 KiB) uploaded; what `.gitignore` ignores and the secrets the sandbox hides stay on this machine."
        );
        assert_eq!(
            uploaded(&Pushed { files: 2000, bytes: 3 * 1024 * 1024 + 512 * 1024 }),
            "2000 files (3.5 MiB) uploaded; what `.gitignore` ignores and the secrets the sandbox hides stay on this \
             machine."
        );
    }

    #[test]
    fn text_is_utf8_without_nul_and_not_too_large() {
        assert!(text_of(b"fn main() {}\n").is_ok());
        assert!(matches!(text_of(&[0xff, 0xfe]), Err(Direct::Binary)));
        assert!(matches!(text_of(b"a\0b"), Err(Direct::Binary)));
        assert!(matches!(text_of(&vec![b'a'; TEXT_LIMIT + 1]), Err(Direct::TooLarge)));
    }
}
