//! Review before write: the agent's changes to its copy of the workspace reach the user's files only through the
//! editor, or not at all. A text file goes to the editor with `fs/write_text_file` (which Zed lists for
//! Keep/Reject); everything else (deletions, renames, links, binary and large files, the executable bit, the files
//! beyond the first 100 of a review, and every change when the editor cannot take writes) is named on a tool card
//! with `session/request_permission`, and applied only on an explicit allow. What is not allowed, or cannot be
//! applied at all, is held back: it stays in the agent's copy, said once in a note. A remote sandbox is always
//! reviewed: its workspace is mirrored in a copy on this machine, pulled before each review and pushed after it
//! (`sandbox::remote::mirror`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::sync::atomic::{AtomicUsize, Ordering};

use agent_client_protocol::v1::schema::{
    Diff, PermissionOption, PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest, SessionUpdate,
    ToolCall, ToolCallContent, ToolCallLocation, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
    WriteTextFileRequest,
};

use super::emitter::Emitter;
use super::{UpdateSink, note};
use crate::error::{Error, Result};
use crate::sandbox::remote::mirror::{Mirror, Pushed};
use crate::sandbox::{Sandbox, SandboxError};
use crate::workspace::review::{APPLY_LIMIT, Change, TEXT_LIMIT, WorkspaceCopy};

/// At most this many files go to the editor per review (a generated tree would flood its review list); the
/// rest is offered on the permission card, applied only if the user allows it.
const WRITES_PER_REVIEW: usize = 100;
/// At most this many paths are named in a note.
const NOTE_PATHS: usize = 20;
/// At most this many bytes of new text are shown as diffs on one permission card; the rest is named.
const CARD_DIFFS: usize = 4 * 1024 * 1024;

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
    /// The permission cards of this turn so far (their ids).
    cards: AtomicUsize,
}

/// Why a change is held back in the agent's copy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Why {
    /// The user did not allow it (or could not be asked).
    Declined,
    /// Its path in the user's workspace goes through a link.
    Link,
    /// Not a regular file.
    Special,
    /// Over [`APPLY_LIMIT`].
    TooLarge,
    /// Applying it failed.
    Failed(String),
    /// A remote sandbox's file over [`APPLY_LIMIT`]: never brought back, it stays in the sandbox.
    Remote,
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
        Some(Review {
            copy,
            sink,
            session_id: session_id.to_string(),
            workspace,
            editor_writes,
            mirror,
            cards: AtomicUsize::new(0),
        })
    }

    /// A remote sandbox gets the user's secret files too (`--remote-upload-secrets`).
    pub fn uploading_secrets(mut self, allowed: bool) -> Self {
        self.mirror = self.mirror.map(|mirror| mirror.uploading_secrets(allowed));
        self
    }

    /// Names the user's secret files a push kept out of the sandbox (once per sandbox).
    async fn say_withheld(&self, emit: &Emitter) -> Result<()> {
        let Some(mirror) = &self.mirror else { return Ok(()) };
        let withheld = mirror.take_withheld();
        if withheld.is_empty() {
            return Ok(());
        }
        emit.send(note(&format!(
            "_Not uploaded to the sandbox, because {} secret: {} (the agent does not see {}; \
             `--remote-upload-secrets` sends such files)._",
            if withheld.len() == 1 { "it looks" } else { "they look" },
            paths(withheld.iter().map(PathBuf::as_path)),
            if withheld.len() == 1 { "it" } else { "them" },
        )))
        .await
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
            return self.say_withheld(emit).await;
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
        pushed.map_err(Error::Sandbox)?;
        self.say_withheld(emit).await
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

    /// Every change of the copy goes to the editor, or on a permission card, or is held back (and noted once). A
    /// change that cannot be read now stays in the copy for the next review.
    async fn review(&self, emit: &Emitter) -> Result<()> {
        let copy = self.copy.clone();
        let found = blocking(move || {
            let all = copy.changes()?;
            let fresh = copy.unheld(&all);
            Ok((all, fresh))
        })
        .await;
        let (all, mut changes) = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(session = %self.session_id, "could not read the agent's changes: {e}");
                return Ok(());
            }
        };
        // Deletions first: a directory the agent replaced by a link is emptied before the link takes its place
        // (its files are never reached through the link).
        changes.sort_by_key(|change| !matches!(change, Change::Deleted { .. }));
        let mut offer: Vec<Change> = Vec::new();
        let mut held: Vec<(Change, Why)> = Vec::new();
        let mut refused: Vec<(PathBuf, String)> = Vec::new();
        let mut kept: Vec<PathBuf> = Vec::new();
        let mut sent = 0;
        for change in changes {
            let path = change.path().to_path_buf();
            let (copy, rel) = (self.copy.clone(), path.clone());
            let plain = blocking(move || Ok(copy.plain_in_workspace(&rel))).await.unwrap_or(false);
            match &change {
                Change::Written { bytes, .. } => {
                    let (copy, rel, held_bytes) = (self.copy.clone(), path.clone(), bytes.clone());
                    if blocking(move || Ok(copy.workspace_holds(&rel, &held_bytes))).await.unwrap_or(false) {
                        // The user's file already says this (the agent wrote it back): nothing to review.
                        self.settle(&path, bytes).await;
                        continue;
                    }
                    if !plain {
                        held.push((change, Why::Link));
                        continue;
                    }
                    match text_of(bytes) {
                        Some(text) if self.editor_writes && sent < WRITES_PER_REVIEW => {
                            sent += 1;
                            let request = WriteTextFileRequest::new(
                                self.session_id.clone(),
                                self.workspace.join(&path),
                                text.to_string(),
                            );
                            let answer = self.sink.write_text_file(request).await;
                            // Kept, rejected or refused: the agent's copy takes the user's file as it is now.
                            self.settle(&path, bytes).await;
                            if let Err(why) = answer {
                                tracing::warn!(session = %self.session_id, path = %path.display(), "the editor refused a write: {why}");
                                refused.push((path, why));
                            }
                        }
                        _ => offer.push(change),
                    }
                }
                Change::Large { len, .. } if *len > APPLY_LIMIT => held.push((change, Why::TooLarge)),
                Change::Large { .. } if !plain => held.push((change, Why::Link)),
                Change::Special { .. } => held.push((change, Why::Special)),
                _ => offer.push(change),
            }
        }
        if !offer.is_empty() {
            let allowed = self.ask(emit, &offer).await?;
            // Cancelled: left as they are (neither applied nor held), the next turn asks again.
            let offer = if allowed.is_some() { offer } else { Vec::new() };
            let allowed = allowed == Some(true);
            for change in offer {
                if !allowed {
                    held.push((change, Why::Declined));
                    continue;
                }
                let copy = self.copy.clone();
                let applying = change.clone();
                match blocking(move || copy.apply(&applying)).await {
                    Ok(true) => {}
                    Ok(false) => match change {
                        Change::Deleted { path } => kept.push(path),
                        Change::Renamed { .. } => {
                            held.push((change, Why::Failed("you changed the file since the agent saw it".into())))
                        }
                        // An executable bit on a file the editor did not keep: nothing to set.
                        _ => {}
                    },
                    Err(e) => held.push((change, Why::Failed(e.to_string()))),
                }
            }
        }
        held.sort_by(|a, b| a.0.path().cmp(b.0.path()));
        let holds: Vec<Change> = held.iter().map(|(change, _)| change.clone()).collect();
        let copy = self.copy.clone();
        if let Err(e) = blocking(move || copy.hold(&holds, &all)).await {
            tracing::warn!(session = %self.session_id, "could not record the held-back changes: {e}");
        }
        if let Some(mirror) = &self.mirror {
            for (path, len) in mirror.take_oversized() {
                let new = std::fs::symlink_metadata(self.copy.path().join(&path)).is_err();
                held.push((Change::Large { path, len, new, stamp: String::new() }, Why::Remote));
            }
        }
        if !refused.is_empty() {
            emit.send(note(&refused_note(&refused))).await?;
        }
        if !held.is_empty() {
            emit.send(note(&held_note(&held, &self.copy.path()))).await?;
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
        Ok(())
    }

    /// Names `changes` on a tool card and asks the user to allow them (`session/request_permission`): `true`
    /// only on an explicit allow; `None` when the turn was cancelled meanwhile.
    async fn ask(&self, emit: &Emitter, changes: &[Change]) -> Result<Option<bool>> {
        let id = format!("{}-review-{}", emit.turn_id, self.cards.fetch_add(1, Ordering::Relaxed));
        let title = match changes {
            [one] => format!("Apply to your files: {}", describe(one).replace('`', "")),
            _ => format!("Apply {} changes of the agent to your files", changes.len()),
        };
        let mut list = String::from(
            "The agent made these changes in its copy of the workspace; they reach your files only if you allow \
             them:\n",
        );
        for change in changes {
            list.push_str(&format!("- {}\n", describe(change)));
        }
        let mut content = vec![ToolCallContent::from(list)];
        let mut shown = 0;
        for change in changes {
            if let Change::Written { path, bytes, .. } = change
                && let Some(text) = text_of(bytes)
                && shown + bytes.len() <= CARD_DIFFS
            {
                shown += bytes.len();
                let (copy, rel) = (self.copy.clone(), path.clone());
                let old = blocking(move || Ok(copy.workspace_text(&rel, TEXT_LIMIT))).await.ok().flatten();
                content.push(ToolCallContent::Diff(Diff::new(self.workspace.join(path), text).old_text(old)));
            }
        }
        let locations: Vec<ToolCallLocation> =
            changes.iter().map(|c| ToolCallLocation::new(self.workspace.join(c.path()))).collect();
        emit.send(SessionUpdate::ToolCall(
            ToolCall::new(id.clone(), title.clone())
                .kind(ToolKind::Edit)
                .status(ToolCallStatus::Pending)
                .content(content.clone())
                .locations(locations.clone()),
        ))
        .await?;
        let options = vec![
            PermissionOption::new("apply", "Apply to my files", PermissionOptionKind::AllowOnce),
            PermissionOption::new("hold", "Keep them in the agent's copy", PermissionOptionKind::RejectOnce),
        ];
        let fields = ToolCallUpdateFields::new().title(title).content(content).locations(locations);
        let request =
            RequestPermissionRequest::new(self.session_id.clone(), ToolCallUpdate::new(id.clone(), fields), options);
        // A cancelled turn does not wait for an answer: the changes stay as they are, asked for again by the next
        // turn's first review.
        let answer = tokio::select! {
            biased;
            _ = emit.cancel().cancelled() => Err(()),
            answer = self.sink.request_permission(request) => Ok(answer),
        };
        let allowed = match answer {
            Ok(Some(RequestPermissionOutcome::Selected(selected))) => Some(selected.option_id.0.as_ref() == "apply"),
            Ok(_) => Some(false),
            Err(()) => None,
        };
        tracing::info!(session = %self.session_id, changes = changes.len(), ?allowed, "asked to apply the agent's changes");
        let status = if allowed == Some(true) { ToolCallStatus::Completed } else { ToolCallStatus::Failed };
        emit.send(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id, ToolCallUpdateFields::new().status(status))))
            .await?;
        Ok(allowed)
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

/// The text of a file the editor can show: UTF-8 without a NUL byte, at most [`TEXT_LIMIT`] bytes.
fn text_of(bytes: &[u8]) -> Option<&str> {
    if bytes.len() as u64 > TEXT_LIMIT {
        return None;
    }
    std::str::from_utf8(bytes).ok().filter(|text| !text.contains('\0'))
}

/// A size as people read it.
fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1024 * 1024 * 1024 => format!("{:.1} GiB", b as f64 / (1024.0 * 1024.0 * 1024.0)),
        b if b >= 1024 * 1024 => format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)),
        b => format!("{b} bytes"),
    }
}

/// A path as a card or note names it: in backticks, or, when it holds a control character or a backtick (a name
/// made to look like another line of the list), quoted with those escaped.
fn shown(path: &Path) -> String {
    let text = path.to_string_lossy();
    if text.chars().any(|c| c.is_control() || c == '`') { format!("{text:?}") } else { format!("`{text}`") }
}

/// One change, exactly: its kind and path(s).
fn describe(change: &Change) -> String {
    match change {
        Change::Written { path, bytes, new } => {
            let what = match (text_of(bytes).is_some(), new) {
                (true, true) => "new text file",
                (true, false) => "text written to",
                (false, true) => "new binary file",
                (false, false) => "binary written to",
            };
            format!("{what} {} ({})", shown(path), size(bytes.len() as u64))
        }
        Change::Large { path, len, new, .. } => {
            format!(
                "{} {} ({}, too large to show)",
                if *new { "new file" } else { "written to" },
                shown(path),
                size(*len)
            )
        }
        Change::Deleted { path } => format!("delete {}", shown(path)),
        Change::Renamed { from, path } => format!("rename {} → {}", shown(from), shown(path)),
        Change::Linked { path, target } => format!("link {} → {}", shown(path), shown(target)),
        Change::Exec { path, set: true } => format!("set the executable bit of {}", shown(path)),
        Change::Exec { path, set: false } => format!("clear the executable bit of {}", shown(path)),
        Change::Special { path } => format!("{} (a FIFO, socket or device)", shown(path)),
    }
}

/// The note on writes the editor refused.
fn refused_note(refused: &[(PathBuf, String)]) -> String {
    let mut by_reason: std::collections::BTreeMap<&str, Vec<&Path>> = Default::default();
    for (path, why) in refused {
        by_reason.entry(why.as_str()).or_default().push(path);
    }
    let parts: Vec<String> =
        by_reason.into_iter().map(|(why, picked)| format!("{} ({why})", paths(picked.into_iter()))).collect();
    format!(
        "_The editor refused the agent's writes of {}: your files stay as they were, and the agent's copy has your \
         version again._",
        parts.join("; ")
    )
}

/// The note on what is held back in the agent's copy, and how to get it.
fn held_note(held: &[(Change, Why)], copy: &Path) -> String {
    let mut items: Vec<String> = held
        .iter()
        .take(NOTE_PATHS)
        .map(|(change, why)| {
            let why = match why {
                Why::Declined => "not allowed".to_string(),
                Why::Link => "its path in your workspace goes through a link, which is never followed".into(),
                Why::Special => "never applied".into(),
                Why::TooLarge => format!("over the {} limit", size(APPLY_LIMIT)),
                Why::Remote => {
                    format!("over the {} limit: it stays in the sandbox, not brought back", size(APPLY_LIMIT))
                }
                Why::Failed(e) => e.clone(),
            };
            format!("{} ({why})", describe(change))
        })
        .collect();
    if held.len() > NOTE_PATHS {
        items.push(format!("and {} more", held.len() - NOTE_PATHS));
    }
    format!(
        "_Held back, not applied to your files: {}. They stay in the agent's copy, where it keeps seeing them; to \
         take one, copy it from `{}` or make the change yourself._",
        items.join("; "),
        copy.display()
    )
}

fn paths<'a>(all: impl Iterator<Item = &'a Path>) -> String {
    let all: Vec<&Path> = all.collect();
    let mut named: Vec<String> = all.iter().take(NOTE_PATHS).map(|path| shown(path)).collect();
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
    fn notes_name_each_held_change_and_where_it_is() {
        let held = vec![
            (Change::Deleted { path: "old.txt".into() }, Why::Declined),
            (Change::Written { path: "logo.png".into(), bytes: vec![0, 1, 2], new: true }, Why::Declined),
            (Change::Linked { path: "p".into(), target: "/etc/passwd".into() }, Why::Declined),
            (Change::Renamed { from: "a".into(), path: "b".into() }, Why::Failed("boom".into())),
            (Change::Exec { path: "run.sh".into(), set: true }, Why::Declined),
            (Change::Special { path: "fifo".into() }, Why::Special),
            (Change::Large { path: "big".into(), len: 2 << 30, new: true, stamp: String::new() }, Why::TooLarge),
            (Change::Written { path: "x/y".into(), bytes: b"t".to_vec(), new: false }, Why::Link),
        ];
        assert_eq!(
            held_note(&held, Path::new("/d/copy")),
            "_Held back, not applied to your files: delete `old.txt` (not allowed); new binary file `logo.png` (3 \
             bytes) (not allowed); link `p` → `/etc/passwd` (not allowed); rename `a` → `b` (boom); set the \
             executable bit of `run.sh` (not allowed); `fifo` (a FIFO, socket or device) (never applied); new file \
             `big` (2.0 GiB, too large to show) (over the 64.0 MiB limit); text written to `x/y` (1 bytes) (its \
             path in your workspace goes through a link, which is never followed). They stay in the agent's copy, \
             where it keeps seeing them; to take one, copy it from `/d/copy` or make the change yourself._"
        );
        // A name made to look like another line of the card is shown escaped.
        assert_eq!(describe(&Change::Deleted { path: "a\n- delete `x`".into() }), "delete \"a\\n- delete `x`\"");
        assert_eq!(
            refused_note(&[("a.txt".into(), "invalid path".into()), ("b.txt".into(), "invalid path".into())]),
            "_The editor refused the agent's writes of `a.txt`, `b.txt` (invalid path): your files stay as they \
             were, and the agent's copy has your version again._"
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
        assert!(text_of(b"fn main() {}\n").is_some());
        assert!(text_of(&[0xff, 0xfe]).is_none());
        assert!(text_of(b"a\0b").is_none());
        assert!(text_of(&vec![b'a'; TEXT_LIMIT as usize + 1]).is_none());
    }
}
