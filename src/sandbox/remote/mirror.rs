//! The workspace of a remote sandbox, mirrored through the host's review copy: `push` makes the sandbox's
//! workspace equal to the copy, `pull` brings what the agent changed there back into the copy, where the review
//! finds it as it finds a local agent's changes.
//!
//! What the remote workspace holds is recorded in `review/remote.json` beside the copy: per path, the copy's
//! stamp when it was last made equal to the remote file and the remote file's stamp as `find` printed it (size,
//! mode, mtime, ctime, inode), or a link's target. A pull lists the workspace with one command and downloads only
//! what moved; a push sends what differs as tar archives (a few requests, however many files) extracted by one
//! command, which also deletes what is gone. File contents never travel on a command line. What git ignores (the
//! user's `.gitignore` files and `.git/info/exclude`) is neither uploaded nor brought back, so the agent's build
//! outputs stay in the sandbox; the git dir and the protected paths are uploaded and never brought back. The
//! manifest is tied to the sandbox by a token the first push leaves there: a new sandbox (the old one was gone)
//! is uploaded afresh, and never reads as the agent deleting everything. A file of the agent's over the review's
//! apply limit (by the size the listing shows, or by what a bounded download got) is never brought back: it stays
//! in the sandbox and the review says so once; FIFOs, sockets and devices are never mirrored. Downloads never hold a
//! file in memory: each is written as it arrives into `review/partial/` (beside the copy, on its filesystem) and
//! renamed into the copy once whole.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt, PermissionsExt};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use super::download::Downloaded;
use crate::sandbox::local::policy::SECRETS;
use crate::sandbox::{ExecSpec, RemoteFiles, Sandbox, SandboxError};
use crate::workspace::ignore::Ignores;
use crate::workspace::review::{APPLY_LIMIT, WorkspaceCopy, check_relative, remove, same_content, walk};
use crate::workspace::statedir::StateDir;

/// The manifest's file name in the review dir.
const MANIFEST: &str = "remote.json";
/// The review dir's directory of files being downloaded.
const PARTIAL: &str = "partial";
/// At most this many bytes of file content go into one archive (a push of a large workspace is several).
const ARCHIVE_LIMIT: usize = 32 * 1024 * 1024;
/// Downloads in flight at once.
const DOWNLOADS: usize = 8;
/// The commands' PATH: the sandbox's `sh`, `find`, `xargs`, `rm` and `tar` (GNU findutils and tar).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Lists the workspace: the mirror's token, then per entry its type, mode, size, mtime, ctime, inode, path and
/// link target, every field ended by NUL (so any file name is one field); or only `unchanged` when the entries'
/// SHA-256 is `$3` (what the bridge last applied: a tool that changed nothing costs a few bytes, not a listing).
/// `$4…` prunes what is never mirrored. What it prints is encoded as text (a first line naming the encoding, then
/// base64, or hex from `od` where there is no `base64`): a provider may pass output through a shell's `read`,
/// which drops NUL bytes (Daytona's daemon labels each line of output so, and bash and dash lose every NUL).
const LIST: &str = r#"cd "$1" || exit 90
token=$(cat "$2" 2>/dev/null)
known=$3
shift 3
listing=$(mktemp) || exit 91
trap 'rm -f "$listing"' EXIT
find . -mindepth 1 "$@" -printf '%y\0%m\0%s\0%T@\0%C@\0%i\0%P\0%l\0' > "$listing" || exit $?
{
  printf '%s\0' "$token"
  if [ -n "$known" ] && [ "$(sha256sum < "$listing" | cut -d ' ' -f 1)" = "$known" ]; then
    printf 'unchanged\0'
  else
    cat "$listing"
  fi
} | if command -v base64 > /dev/null 2>&1; then echo base64; base64; else echo hex; od -A n -v -t x1; fi"#;
/// Deletes the NUL-separated paths on stdin (with `$2` = `delete`: stdin is read only then), then extracts the
/// archives `$3…` in order and removes them.
const APPLY: &str = r#"set -e
cd "$1"
if [ "$2" = delete ]; then xargs -0 -r rm -rf --; fi
shift 2
for archive in "$@"; do tar -x -p --no-same-owner -f "$archive"; rm -f "$archive"; done"#;

/// File names of private keys (SSH's own names; what ends in `.pub` is the public half).
const KEY_NAMES: &[&str] = &["id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk", "identity"];
/// Extensions of key and keystore files.
const KEY_EXTENSIONS: &[&str] = &["pem", "key", "p12", "pfx", "ppk", "jks", "keystore", "asc", "gpg"];

/// Whether the user's file at `rel` (relative to the workspace) is a secret a remote sandbox does not get unless
/// the user allows it: a `.env*` file, a private key, or, at any depth, one of the paths the local sandbox hides
/// in the home ([`SECRETS`]: a workspace's `.ssh/`, `.aws/`, `.npmrc`, ...).
pub fn is_secret(rel: &Path) -> bool {
    let parts: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part),
            _ => None,
        })
        .collect();
    let Some(name) = parts.last().map(|n| n.as_bytes()) else { return false };
    if name.starts_with(b".env") || KEY_NAMES.iter().any(|key| name == key.as_bytes()) {
        return true;
    }
    let extension = Path::new(OsStr::from_bytes(name)).extension().map(OsStr::as_bytes);
    if extension.is_some_and(|ext| KEY_EXTENSIONS.iter().any(|key| ext.eq_ignore_ascii_case(key.as_bytes()))) {
        return true;
    }
    (0..parts.len()).any(|from| {
        let tail: PathBuf = parts[from..].iter().collect();
        SECRETS.iter().any(|secret| tail.starts_with(secret))
    })
}

/// One entry of the remote workspace as `find` printed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteStamp {
    size: u64,
    mode: u32,
    mtime: String,
    ctime: String,
    ino: u64,
}

/// What kind of entry a listed path is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteKind {
    File,
    Link(PathBuf),
    Dir,
    /// A fifo, socket or device: never mirrored.
    Other,
}

/// The remote workspace as one listing saw it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// The mirror's token the sandbox holds (empty when none).
    pub token: String,
    pub entries: BTreeMap<PathBuf, (RemoteKind, RemoteStamp)>,
    /// The entries' SHA-256 (hex), as the sandbox computes it.
    pub digest: String,
    /// The sandbox said only that the entries are those of the digest it was given.
    pub unchanged: bool,
}

/// The bytes [`LIST`] encoded: its first line names the encoding (`base64`, or `hex` as `od` prints it); the rest
/// is that encoding, whatever whitespace a provider added (line breaks, a last newline).
pub fn decode_listing(out: &[u8]) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    let at = out.iter().position(|b| *b == b'\n').ok_or("the listing has no encoding line")?;
    let (name, body) = (&out[..at], &out[at + 1..]);
    let text: Vec<u8> = body.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
    match name.trim_ascii() {
        b"base64" => base64::engine::general_purpose::STANDARD
            .decode(&text)
            .map_err(|e| format!("the listing is not base64: {e}")),
        b"hex" => {
            if !text.len().is_multiple_of(2) {
                return Err("the listing's hex is cut mid-byte".into());
            }
            text.chunks(2)
                .map(|pair| {
                    std::str::from_utf8(pair)
                        .ok()
                        .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                        .ok_or_else(|| "the listing's hex has a character that is not hex".to_string())
                })
                .collect()
        }
        other => Err(format!("the listing's encoding {:?} is not one of ours", String::from_utf8_lossy(other))),
    }
}

/// Parses what [`LIST`] printed, once decoded ([`decode_listing`]). A path that is not plainly inside the workspace is refused: the sandbox's
/// `find` is the agent's to replace.
pub fn parse_listing(out: &[u8]) -> Result<Listing, String> {
    // A provider that streams output by lines ends the last one with a newline it added (Daytona's daemon).
    let out = match out {
        [rest @ .., 0, b'\n'] => &out[..rest.len() + 1],
        _ => out,
    };
    let mut fields = out.split(|b| *b == 0);
    let token = String::from_utf8_lossy(fields.next().unwrap_or_default()).trim().to_string();
    let records = out.iter().position(|b| *b == 0).map_or(&[][..], |at| &out[at + 1..]);
    if records == b"unchanged\0" {
        return Ok(Listing { token, unchanged: true, ..Listing::default() });
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, records);
    let digest: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let rest: Vec<&[u8]> = fields.collect();
    // The output ends with a NUL: the last split is empty.
    let rest = match rest.split_last() {
        Some((&[], rest)) => rest,
        None => &[][..],
        Some(_) => return Err("the listing ends mid-record".into()),
    };
    if rest.len() % 8 != 0 {
        return Err(format!("the listing has {} fields, not records of 8", rest.len()));
    }
    let mut entries = BTreeMap::new();
    for record in rest.chunks(8) {
        let text = |at: usize| String::from_utf8_lossy(record[at]).into_owned();
        let number = |at: usize, radix: u32| {
            u64::from_str_radix(&text(at), radix).map_err(|_| format!("a bad number {:?} in the listing", text(at)))
        };
        let path = PathBuf::from(OsStr::from_bytes(record[6]));
        check_relative(&path).map_err(|e| e.to_string())?;
        let kind = match record[0] {
            b"f" => RemoteKind::File,
            b"d" => RemoteKind::Dir,
            b"l" => RemoteKind::Link(PathBuf::from(OsStr::from_bytes(record[7]))),
            _ => RemoteKind::Other,
        };
        let stamp = RemoteStamp {
            mode: number(1, 8)? as u32,
            size: number(2, 10)?,
            mtime: text(3),
            ctime: text(4),
            ino: number(5, 10)?,
        };
        entries.insert(path, (kind, stamp));
    }
    Ok(Listing { token, entries, digest, unchanged: false })
}

/// The copy's side of a mirrored path when it was last made equal to the remote one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyStamp {
    len: u64,
    mode: u32,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl CopyStamp {
    fn of(meta: &cap_std::fs::Metadata) -> Self {
        CopyStamp {
            len: meta.len(),
            mode: meta.mode(),
            ino: meta.ino(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// One path the remote workspace holds as the mirror made it or last saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mirrored {
    /// The copy's file when it was equal to the remote one.
    copy: CopyStamp,
    /// The remote file's stamp, when a listing saw it (never for pruned paths: the git dir).
    remote: Option<RemoteStamp>,
    /// A link's target.
    link: Option<PathBuf>,
}

/// What the remote workspace holds, and which of its directories listings skip.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Manifest {
    /// The token the sandbox holds when this manifest describes it.
    token: String,
    entries: BTreeMap<PathBuf, Mirrored>,
    /// Ignored directories seen in the sandbox: later listings do not walk them (`node_modules`, `target`).
    pruned: BTreeSet<PathBuf>,
    /// The digest of the listing the entries were last made from by a pull (none after a push, whose listing
    /// may hold what the agent wrote meanwhile, not brought back yet).
    #[serde(default)]
    listed: Option<String>,
    /// Files of the agent too large to bring back ([`APPLY_LIMIT`], by the listed size or by what a download got),
    /// as last listed: each is said once, stays in the sandbox, and is not downloaded again until it moves.
    #[serde(default)]
    oversized: BTreeMap<PathBuf, RemoteStamp>,
    /// The user's secret files ([`is_secret`]) kept out of this sandbox and said already.
    #[serde(default)]
    withheld: BTreeSet<PathBuf>,
}

/// What a pull brings into the copy.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PullPlan {
    /// Files to download, with their mode and stamp.
    pub download: Vec<(PathBuf, RemoteStamp)>,
    /// Links to make.
    pub link: Vec<(PathBuf, PathBuf, RemoteStamp)>,
    /// Paths the agent removed.
    pub remove: Vec<PathBuf>,
    /// Files too large to bring back (by their listed size, or known so from an earlier download while the listing
    /// shows them unchanged): never downloaded, they stay in the sandbox.
    pub oversized: Vec<(PathBuf, RemoteStamp)>,
    /// The ignored directories the next listings skip.
    pub pruned: BTreeSet<PathBuf>,
}

/// Compares a listing with the manifest. `ignored` says what git ignores, `skipped` what is never brought back.
pub fn plan_pull(
    manifest: &Manifest,
    listing: &Listing,
    ignored: impl Fn(&Path, bool) -> bool,
    skipped: impl Fn(&Path) -> bool,
) -> PullPlan {
    let mut plan = PullPlan::default();
    let mut present = BTreeSet::new();
    let out_of_view = |rel: &Path, dir: bool, plan: &mut PullPlan| {
        if skipped(rel) || plan.pruned.iter().any(|p| rel.starts_with(p)) {
            return true;
        }
        if ignored(rel, dir) {
            if dir {
                plan.pruned.insert(rel.to_path_buf());
            }
            return true;
        }
        false
    };
    for (rel, (kind, stamp)) in &listing.entries {
        if out_of_view(rel, *kind == RemoteKind::Dir, &mut plan) {
            continue;
        }
        let known = manifest.entries.get(rel);
        match kind {
            // Over the bound by its listed size, or by what a download of it got while it was as it is now.
            RemoteKind::File if stamp.size > APPLY_LIMIT || manifest.oversized.get(rel) == Some(stamp) => {
                present.insert(rel.clone());
                plan.oversized.push((rel.clone(), stamp.clone()));
            }
            RemoteKind::File => {
                present.insert(rel.clone());
                if !known.is_some_and(|m| m.link.is_none() && m.remote.as_ref() == Some(stamp)) {
                    plan.download.push((rel.clone(), stamp.clone()));
                }
            }
            RemoteKind::Link(target) => {
                present.insert(rel.clone());
                if known.and_then(|m| m.link.as_ref()) != Some(target) {
                    plan.link.push((rel.clone(), target.clone(), stamp.clone()));
                }
            }
            RemoteKind::Dir | RemoteKind::Other => {}
        }
    }
    // Directories pruned before are not listed: what they hold is out of view, not gone.
    for dir in &manifest.pruned {
        if ignored(dir, true) && !skipped(dir) {
            plan.pruned.insert(dir.clone());
        }
    }
    for rel in manifest.entries.keys() {
        let hidden = skipped(rel) || plan.pruned.iter().any(|p| rel.starts_with(p)) || ignored(rel, false);
        if !present.contains(rel) && !hidden {
            plan.remove.push(rel.clone());
        }
    }
    plan
}

/// One entry of the copy as a push sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyEntry {
    pub stamp: CopyStamp,
    pub link: Option<PathBuf>,
}

/// What a push sends.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PushPlan {
    /// Files and links to upload.
    pub upload: Vec<PathBuf>,
    /// Paths to remove in the sandbox (first: a directory in the way of a file goes too).
    pub delete: Vec<PathBuf>,
    /// Paths the agent changed since the last pull: left alone, the next pull brings them.
    pub held: Vec<PathBuf>,
}

/// Compares the copy with the manifest. With `guard` (a listing made just now), a path whose remote state moved
/// since the manifest saw it is held back, so a push never overwrites what the agent wrote meanwhile; `fresh`
/// (the sandbox is new to the mirror) also deletes what the sandbox holds beyond the copy.
pub fn plan_push(
    manifest: &Manifest,
    copy: &BTreeMap<PathBuf, CopyEntry>,
    guard: Option<&Listing>,
    fresh: bool,
    ignored: impl Fn(&Path, bool) -> bool,
) -> PushPlan {
    let mut plan = PushPlan::default();
    let moved = |rel: &Path| {
        let Some(listing) = guard else { return false };
        let Some(known) = manifest.entries.get(rel) else {
            return !fresh && listing.entries.get(rel).is_some_and(|(kind, _)| *kind != RemoteKind::Dir);
        };
        let Some(expected) = &known.remote else { return false };
        match listing.entries.get(rel) {
            Some((RemoteKind::File, stamp)) => known.link.is_some() || stamp != expected,
            Some((RemoteKind::Link(target), _)) => known.link.as_ref() != Some(target),
            _ => true,
        }
    };
    for (rel, entry) in copy {
        let same = manifest.entries.get(rel).is_some_and(|m| m.copy == entry.stamp && m.link == entry.link);
        if same {
            continue;
        }
        if moved(rel) {
            plan.held.push(rel.clone());
            continue;
        }
        // A directory of the sandbox where this file goes is removed first.
        let next = manifest.entries.range(rel.clone()..).find(|(p, _)| *p != rel);
        if next.is_some_and(|(p, _)| p.starts_with(rel)) {
            plan.delete.push(rel.clone());
        }
        plan.upload.push(rel.clone());
    }
    for rel in manifest.entries.keys() {
        if copy.contains_key(rel) || ignored(rel, false) || manifest.pruned.iter().any(|p| rel.starts_with(p)) {
            continue;
        }
        if moved(rel) {
            plan.held.push(rel.clone());
        } else {
            plan.delete.push(rel.clone());
        }
    }
    if fresh && let Some(listing) = guard {
        for (rel, (kind, _)) in &listing.entries {
            if matches!(kind, RemoteKind::File | RemoteKind::Link(_))
                && !copy.contains_key(rel)
                && !manifest.entries.contains_key(rel)
                && !ignored(rel, false)
            {
                plan.delete.push(rel.clone());
            }
        }
    }
    plan.delete.sort();
    plan.delete.dedup();
    plan
}

/// What a push sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Files and links uploaded.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// The mirror of one remote sandbox's workspace in the session's review copy.
pub struct Mirror<'a> {
    sandbox: &'a dyn Sandbox,
    files: &'a dyn RemoteFiles,
    copy: Arc<WorkspaceCopy>,
    /// The agent's files too large to bring back that pulls found and did not say yet: path and size.
    oversized: Mutex<Vec<(PathBuf, u64)>>,
    /// Whether the user's secret files go up too (`--remote-upload-secrets`).
    upload_secrets: bool,
    /// The user's secret files a push kept out of the sandbox and did not say yet.
    withheld: Mutex<Vec<PathBuf>>,
}

impl<'a> Mirror<'a> {
    /// The mirror of `sandbox` in `copy`; `None` for a sandbox that sees the user's files where they are.
    pub fn new(sandbox: &'a dyn Sandbox, copy: Arc<WorkspaceCopy>) -> Option<Self> {
        Some(Mirror {
            files: sandbox.remote_files()?,
            sandbox,
            copy,
            oversized: Mutex::default(),
            upload_secrets: false,
            withheld: Mutex::default(),
        })
    }

    /// Uploads the user's secret files too (`--remote-upload-secrets`).
    pub fn uploading_secrets(mut self, allowed: bool) -> Self {
        self.upload_secrets = allowed;
        self
    }

    /// The user's secret files kept out of the sandbox found since the last call, each once per sandbox.
    pub fn take_withheld(&self) -> Vec<PathBuf> {
        std::mem::take(&mut *self.withheld.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The agent's files too large to bring back found since the last call, each once: path and size.
    pub fn take_oversized(&self) -> Vec<(PathBuf, u64)> {
        std::mem::take(&mut *self.oversized.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn manifest_path(&self) -> PathBuf {
        self.copy.review_dir().join(MANIFEST)
    }

    /// Where pulled files are written as they arrive, before they are renamed into the copy: the bridge's own
    /// state beside the copy (so on its filesystem), neither in the copy nor in the sandbox.
    fn partial_dir(&self) -> PathBuf {
        self.copy.review_dir().join(PARTIAL)
    }

    fn token_path(&self) -> PathBuf {
        self.sandbox.state_dir().join("mirror-token")
    }

    /// Brings what the agent changed in the sandbox's workspace into the copy (downloads, links, removals).
    /// Answers `false`, touching nothing, when the sandbox is new to the mirror (its workspace is not the
    /// copy's yet: the next push uploads it). `quick` (mid-turn, the user's ignore rules unchanged): a sandbox
    /// whose listing is the one last applied answers in a few bytes.
    pub async fn pull(&self, quick: bool) -> Result<bool, SandboxError> {
        let copy = self.copy.clone();
        let path = self.manifest_path();
        let partial = self.partial_dir();
        let manifest = blocking(move || {
            copy.ensure()?;
            // What an earlier pull left there (a bridge killed mid-download) is never applied: pulls of one
            // session run one at a time, so nothing there is still being written.
            clear_partial(&partial)?;
            Ok(load(&path))
        })
        .await?;
        if manifest.token.is_empty() {
            return Ok(false);
        }
        let known = if quick { manifest.listed.clone() } else { None };
        let listing = self.list(&manifest, known.as_deref()).await?;
        if listing.token == manifest.token && listing.unchanged {
            return Ok(true);
        }
        if listing.token != manifest.token {
            tracing::info!(sandbox = %self.sandbox.isolation(), "the sandbox is new to the mirror: its workspace is uploaded afresh");
            // Forgotten, so that the next push sends everything.
            let path = self.manifest_path();
            blocking(move || store(&path, &Manifest::default())).await?;
            return Ok(false);
        }
        let copy = self.copy.clone();
        let (manifest, plan, digest) = blocking(move || {
            let ignores = Ignores::new(copy.workspace());
            let plan = plan_pull(&manifest, &listing, |rel, dir| ignores.ignored(rel, dir), |rel| copy.skips(rel));
            Ok((manifest, plan, listing.digest))
        })
        .await?;
        let root = self.sandbox.workspace().to_path_buf();
        let mut oversized: BTreeMap<PathBuf, RemoteStamp> = plan.oversized.iter().cloned().collect();
        // Each file goes to a file of its own in the partial dir as it arrives, never whole into memory.
        let partial = self.partial_dir();
        let downloads = futures::stream::iter(plan.download.clone().into_iter().enumerate())
            .map(|(at, (rel, stamp))| {
                let (remote, dest) = (root.join(&rel), partial.join(at.to_string()));
                async move {
                    let got = self.files.download_to(&remote, &dest, APPLY_LIMIT).await?;
                    Ok::<_, SandboxError>((rel, stamp, PathBuf::from(at.to_string()), got))
                }
            })
            .buffer_unordered(DOWNLOADS)
            .try_collect::<Vec<_>>()
            .await;
        let downloads = match downloads {
            Ok(downloads) => downloads,
            Err(e) => {
                // The downloads finished before the failure are not applied: they go now, not at the next pull.
                let _ = blocking(move || clear_partial(&partial)).await;
                return Err(e);
            }
        };
        let mut downloaded: Vec<(PathBuf, RemoteStamp, PathBuf)> = Vec::new();
        // The sizes cut-off downloads got (more than the listing said): what the review names.
        let mut seen: BTreeMap<PathBuf, u64> = BTreeMap::new();
        for (rel, stamp, name, got) in downloads {
            match got {
                Downloaded::Whole(_) => downloaded.push((rel, stamp, name)),
                // Grown past the bound between the listing and the download: not brought back either.
                Downloaded::TooLarge(size) => {
                    seen.insert(rel.clone(), size);
                    oversized.insert(rel, stamp);
                }
                // Gone between the listing and the download: the next pull sees it gone.
                Downloaded::Missing => {}
            }
        }
        {
            let mut said = self.oversized.lock().unwrap_or_else(|p| p.into_inner());
            for (rel, stamp) in &oversized {
                if manifest.oversized.get(rel) != Some(stamp) {
                    said.push((rel.clone(), seen.get(rel).copied().unwrap_or(stamp.size)));
                }
            }
        }
        let copy = self.copy.clone();
        let path = self.manifest_path();
        blocking(move || {
            let mut manifest = manifest;
            manifest.oversized = oversized;
            let dir = Dir::open_ambient_dir(copy.path(), ambient_authority())?;
            let state = StateDir::open(&copy.path())?;
            let arrived = Dir::open_ambient_dir(&partial, ambient_authority())?;
            let placed = (|| {
                // Removals first: a directory the agent replaced by a link is emptied while it is still a directory.
                for rel in plan.remove {
                    remove(&dir, &rel)?;
                    manifest.entries.remove(&rel);
                }
                for (rel, stamp, name) in downloaded {
                    // The same bytes as the copy holds: left as they are (the review sees no change).
                    if same_content(&dir, &rel, &arrived, &name)? {
                        arrived.remove_file(&name)?;
                    } else {
                        // The partial dir is beside the copy, on its filesystem: one rename, nothing copied.
                        state.move_file_in(&arrived, &name, &rel)?;
                    }
                    // Readable and writable by the bridge whatever the agent set.
                    let mode = (stamp.mode & 0o777) | 0o600;
                    if dir.symlink_metadata(&rel)?.mode() & 0o777 != mode {
                        dir.set_permissions(&rel, cap_std::fs::Permissions::from_mode(mode))?;
                    }
                    let copy_stamp = CopyStamp::of(&dir.symlink_metadata(&rel)?);
                    manifest.entries.insert(rel, Mirrored { copy: copy_stamp, remote: Some(stamp), link: None });
                }
                io::Result::Ok(())
            })();
            if placed.is_err() {
                let _ = clear_partial(&partial);
            }
            placed?;
            for (rel, target, stamp) in plan.link {
                state.symlink(&target, &rel)?;
                let copy_stamp = CopyStamp::of(&dir.symlink_metadata(&rel)?);
                manifest.entries.insert(rel, Mirrored { copy: copy_stamp, remote: Some(stamp), link: Some(target) });
            }
            manifest.pruned = plan.pruned;
            manifest.listed = Some(digest);
            store(&path, &manifest)
        })
        .await?;
        Ok(true)
    }

    /// Makes the sandbox's workspace equal to the copy, but for what the agent changed there since the last pull
    /// (left for the next one). A sandbox new to the mirror gets the whole copy, and loses what it held beyond it.
    pub async fn push(&self) -> Result<Pushed, SandboxError> {
        let (copy, path) = (self.copy.clone(), self.manifest_path());
        let keep_secrets = !self.upload_secrets;
        // A secret is neither sent nor deleted there: one the agent made in the sandbox stays its own.
        let kept = move |rel: &Path| keep_secrets && is_secret(rel);
        let (manifest, entries, quick, withheld) = blocking(move || {
            copy.ensure()?;
            let manifest = load(&path);
            let mut entries = copy_entries(&copy)?;
            let withheld: BTreeSet<PathBuf> =
                entries.keys().filter(|rel| kept(rel) && !manifest.entries.contains_key(*rel)).cloned().collect();
            entries.retain(|rel, _| !kept(rel));
            let ignores = Ignores::new(copy.workspace());
            let quick = plan_push(&manifest, &entries, None, false, |rel, dir| ignores.ignored(rel, dir) || kept(rel));
            Ok((manifest, entries, quick, withheld))
        })
        .await?;
        if !manifest.token.is_empty()
            && quick.upload.is_empty()
            && quick.delete.is_empty()
            && withheld == manifest.withheld
        {
            return Ok(Pushed::default());
        }
        // Something to send: a listing made now holds back what the agent wrote since the last pull.
        let guard = self.list(&manifest, None).await?;
        let fresh = manifest.token.is_empty() || guard.token != manifest.token;
        let manifest = if fresh { Manifest::default() } else { manifest };
        let copy = self.copy.clone();
        let (mut manifest, entries, plan) = blocking(move || {
            let ignores = Ignores::new(copy.workspace());
            let plan =
                plan_push(&manifest, &entries, Some(&guard), fresh, |rel, dir| ignores.ignored(rel, dir) || kept(rel));
            Ok((manifest, entries, plan))
        })
        .await?;
        {
            let mut said = self.withheld.lock().unwrap_or_else(|p| p.into_inner());
            said.extend(withheld.difference(&manifest.withheld).cloned());
        }
        manifest.withheld = withheld;
        if !plan.held.is_empty() {
            tracing::debug!(held = plan.held.len(), "paths the agent changed since the last pull are not overwritten");
        }
        let archives = self.upload(&plan.upload).await?;
        let mut stdin = Vec::new();
        for rel in &plan.delete {
            stdin.extend_from_slice(rel.as_os_str().as_bytes());
            stdin.push(0);
        }
        let deletes = if stdin.is_empty() { "keep" } else { "delete" };
        let mut args = vec![self.sandbox.workspace().display().to_string(), deletes.to_string()];
        args.extend(archives.iter().map(|a| a.display().to_string()));
        self.run(APPLY, args, stdin).await?;
        let token = if fresh { uuid::Uuid::new_v4().simple().to_string() } else { manifest.token.clone() };
        if fresh {
            self.files.write(&self.token_path(), token.as_bytes()).await?;
        }
        let mut manifest = Manifest { token, listed: None, ..manifest };
        let after = self.list(&manifest, None).await?;
        let pushed = Pushed {
            files: plan.upload.len(),
            bytes: plan.upload.iter().filter_map(|rel| entries.get(rel)).map(|e| e.stamp.len).sum(),
        };
        for rel in &plan.delete {
            manifest.entries.remove(rel);
        }
        for rel in plan.upload {
            let Some(entry) = entries.get(&rel) else { continue };
            let remote = after.entries.get(&rel).map(|(_, stamp)| stamp.clone());
            manifest.entries.insert(rel, Mirrored { copy: entry.stamp, remote, link: entry.link.clone() });
        }
        let path = self.manifest_path();
        blocking(move || store(&path, &manifest)).await?;
        Ok(pushed)
    }

    /// Sends the files and links of `paths` as archives of at most [`ARCHIVE_LIMIT`] bytes each, one in memory
    /// at a time; answers where they are in the sandbox.
    async fn upload(&self, paths: &[PathBuf]) -> Result<Vec<PathBuf>, SandboxError> {
        let mut archives = Vec::new();
        let mut rest: Vec<PathBuf> = paths.to_vec();
        while !rest.is_empty() {
            let copy = self.copy.clone();
            let (archive, left) = blocking(move || archive(&copy.path(), rest)).await?;
            rest = left;
            let at = self.sandbox.state_dir().join(format!("mirror-{}.tar", archives.len()));
            self.files.write(&at, &archive).await?;
            archives.push(at);
        }
        Ok(archives)
    }

    async fn list(&self, manifest: &Manifest, known: Option<&str>) -> Result<Listing, SandboxError> {
        let mut args = vec![
            self.sandbox.workspace().display().to_string(),
            self.token_path().display().to_string(),
            known.unwrap_or_default().to_string(),
        ];
        let mut pruned: Vec<String> = manifest.pruned.iter().filter_map(|p| p.to_str()).map(find_pattern).collect();
        pruned.extend(self.copy.skipped_paths().iter().filter_map(|p| p.to_str()).map(find_pattern));
        if !pruned.is_empty() {
            args.push("(".into());
            for (at, pattern) in pruned.into_iter().enumerate() {
                if at > 0 {
                    args.push("-o".into());
                }
                args.extend(["-path".to_string(), pattern]);
            }
            args.extend([")".into(), "-prune".into(), "-o".into()]);
        }
        let out = self.run(LIST, args, Vec::new()).await?;
        decode_listing(&out)
            .and_then(|out| parse_listing(&out))
            .map_err(|why| failed(format!("its workspace listing is unreadable: {why}")))
    }

    /// Runs a script of ours with `sh` and answers its stdout; a failure carries its stderr.
    async fn run(&self, script: &str, args: Vec<String>, stdin: Vec<u8>) -> Result<Vec<u8>, SandboxError> {
        let mut argv = vec!["-c".to_string(), script.to_string(), "sh".to_string()];
        argv.extend(args);
        let spec = ExecSpec {
            program: PathBuf::from("/bin/sh"),
            args: argv,
            env: vec![("PATH".into(), PATH.into()), ("LC_ALL".into(), "C".into())],
            cwd: PathBuf::from("/"),
            stdin,
            ..ExecSpec::default()
        };
        let mut process = self.sandbox.exec(spec).await?;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (read_out, read_err) =
            tokio::join!(process.stdout.read_to_end(&mut out), process.stderr.read_to_end(&mut err));
        read_out.and(read_err).map_err(|e| SandboxError::io("read a workspace command's output", e))?;
        let exit = process.handle.wait().await?;
        if exit.success() {
            return Ok(out);
        }
        let said = String::from_utf8_lossy(&err);
        Err(failed(format!(
            "a command on its workspace ended with {}: {}",
            exit.describe(),
            said.lines().take(5).collect::<Vec<_>>().join(" / ")
        )))
    }
}

/// Every file and link of the copy, never following a link.
fn copy_entries(copy: &WorkspaceCopy) -> io::Result<BTreeMap<PathBuf, CopyEntry>> {
    let dir = Dir::open_ambient_dir(copy.path(), ambient_authority())?;
    let mut entries = BTreeMap::new();
    for rel in walk(&dir, |_, _| false)?.paths {
        let meta = dir.symlink_metadata(&rel)?;
        let link = if meta.is_symlink() {
            Some(dir.read_link_contents(&rel)?)
        } else if meta.is_file() {
            None
        } else {
            continue;
        };
        entries.insert(rel, CopyEntry { stamp: CopyStamp::of(&meta), link });
    }
    Ok(entries)
}

/// An archive of the first of `paths` (at least one, then up to [`ARCHIVE_LIMIT`] bytes), and the rest.
fn archive(root: &Path, mut paths: Vec<PathBuf>) -> io::Result<(Vec<u8>, Vec<PathBuf>)> {
    let dir = Dir::open_ambient_dir(root, ambient_authority())?;
    let mut builder = tar::Builder::new(Vec::new());
    let mut size = 0;
    let mut taken = 0;
    for rel in &paths {
        if taken > 0 && size >= ARCHIVE_LIMIT {
            break;
        }
        taken += 1;
        let meta = dir.symlink_metadata(rel)?;
        let mut header = tar::Header::new_gnu();
        header.set_mode(meta.mode() & 0o777);
        header.set_mtime(meta.mtime().max(0) as u64);
        if meta.is_symlink() {
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            builder.append_link(&mut header, rel, dir.read_link_contents(rel)?)?;
        } else {
            let bytes = dir.read(rel)?;
            size += bytes.len();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(bytes.len() as u64);
            builder.append_data(&mut header, rel, bytes.as_slice())?;
        }
    }
    let rest = paths.split_off(taken);
    Ok((builder.into_inner()?, rest))
}

/// A `find -path` pattern matching exactly `./rel`.
fn find_pattern(rel: &str) -> String {
    let mut pattern = String::from("./");
    for c in rel.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern
}

fn load(path: &Path) -> Manifest {
    std::fs::read(path).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default()
}

fn store(path: &Path, manifest: &Manifest) -> io::Result<()> {
    let bytes = serde_json::to_vec(manifest).map_err(io::Error::other)?;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::other("the manifest has no directory"));
    };
    StateDir::open(dir)?.write_file(Path::new(name), &bytes)
}

/// Makes the partial dir an empty real directory (what was in it removed, a link in its place too).
fn clear_partial(partial: &Path) -> io::Result<()> {
    let (Some(review), Some(name)) = (partial.parent(), partial.file_name()) else {
        return Err(io::Error::other("the partial dir has no parent"));
    };
    let review = StateDir::open(review)?;
    review.ensure_dir(Path::new(name))?;
    review.empty_dir(Path::new(name)).map(drop)
}

/// What to do is the same whatever failed: the workspace and the sandbox could not be made equal.
fn failed(message: String) -> SandboxError {
    SandboxError::io("sync the workspace with the remote sandbox", io::Error::other(message))
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> io::Result<T> + Send + 'static) -> Result<T, SandboxError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(io::Error::other)
        .and_then(|done| done)
        .map_err(|e| SandboxError::io("sync the workspace with the remote sandbox", e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn stamp(size: u64, mtime: &str) -> RemoteStamp {
        RemoteStamp { size, mode: 0o644, mtime: mtime.into(), ctime: mtime.into(), ino: 7 }
    }

    fn copy_stamp(len: u64) -> CopyStamp {
        CopyStamp { len, mode: 0o100644, ino: 1, mtime: (1, 0), ctime: (1, 0) }
    }

    fn listing(entries: &[(&str, RemoteKind, RemoteStamp)]) -> Listing {
        Listing {
            token: "t".into(),
            entries: entries.iter().map(|(p, k, s)| (PathBuf::from(p), (k.clone(), s.clone()))).collect(),
            ..Listing::default()
        }
    }

    fn manifest(entries: &[(&str, u64, RemoteStamp)]) -> Manifest {
        Manifest {
            token: "t".into(),
            entries: entries
                .iter()
                .map(|(p, len, s)| {
                    (PathBuf::from(p), Mirrored { copy: copy_stamp(*len), remote: Some(s.clone()), link: None })
                })
                .collect(),
            pruned: BTreeSet::new(),
            listed: None,
            oversized: BTreeMap::new(),
            withheld: BTreeSet::new(),
        }
    }

    /// Fields as the listing prints them: each ended by a NUL.
    fn ended(fields: &[&str]) -> Vec<u8> {
        fields.iter().flat_map(|field| field.bytes().chain([0])).collect()
    }

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn a_listing_is_records_of_eight_nul_ended_fields_after_the_token() {
        let out = ended(&[
            "tok", "f", "755", "12", "1700.5", "1700.6", "42", "dir/a\nb", "", "l", "777", "3", "1.0", "1.0", "43",
            "link", "a\nb",
        ]);
        let parsed = parse_listing(&out).unwrap();
        assert_eq!(parsed.token, "tok");
        assert_eq!(
            parsed.entries,
            BTreeMap::from([
                (
                    PathBuf::from("dir/a\nb"),
                    (
                        RemoteKind::File,
                        RemoteStamp { size: 12, mode: 0o755, mtime: "1700.5".into(), ctime: "1700.6".into(), ino: 42 }
                    )
                ),
                (
                    PathBuf::from("link"),
                    (
                        RemoteKind::Link("a\nb".into()),
                        RemoteStamp { size: 3, mode: 0o777, mtime: "1.0".into(), ctime: "1.0".into(), ino: 43 }
                    )
                ),
            ])
        );
        let empty = parse_listing(b"\0").unwrap();
        assert_eq!((empty.token.as_str(), empty.entries.len(), empty.unchanged), ("", 0, false));
        assert_eq!(empty.digest, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        let mut lined = ended(&["t", "unchanged"]);
        lined.push(b'\n');
        assert!(
            parse_listing(&lined).unwrap().unchanged,
            "a newline a provider added after the last NUL is not a field"
        );
        let unchanged = parse_listing(&ended(&["t", "unchanged"])).unwrap();
        assert!(unchanged.unchanged && unchanged.token == "t" && unchanged.entries.is_empty());
        let bad = |fields: &[&str]| parse_listing(&ended(fields)).is_err();
        assert!(bad(&["t", "f", "644", "1", "1", "1", "1", "../x", ""]), "a path out of the workspace");
        assert!(bad(&["t", "f", "644", "1", "1"]), "a record cut short");
        assert!(bad(&["t", "f", "644", "x", "1", "1", "1", "a", ""]), "a size that is not a number");
    }

    #[test]
    fn a_listing_decodes_from_base64_or_od_hex_whatever_line_breaks_a_provider_added() {
        // Long enough for `base64` to wrap its lines; NULs and a newline inside, as file names may have.
        let raw: Vec<u8> = (0..200u8).flat_map(|i| [i, 0, b'\n']).collect();
        let printed = |encoder: &str| {
            let mut out = script(&format!("cat | {encoder}"), &[], &raw);
            // Daytona's labeller ends the last line with a newline of its own.
            out.push(b'\n');
            out
        };
        assert_eq!(decode_listing(&printed("{ echo base64; base64; }")).unwrap(), raw);
        assert_eq!(decode_listing(&printed("{ echo hex; od -A n -v -t x1; }")).unwrap(), raw);
        assert_eq!(decode_listing(b"base64\n").unwrap(), b"");
        assert_eq!(decode_listing(b"tok\0f\0").unwrap_err(), "the listing has no encoding line");
        assert_eq!(decode_listing(b"hex\n0a 0").unwrap_err(), "the listing's hex is cut mid-byte");
        assert_eq!(decode_listing(b"hex\n0g").unwrap_err(), "the listing's hex has a character that is not hex");
        assert_eq!(decode_listing(b"rot13\nx").unwrap_err(), "the listing's encoding \"rot13\" is not one of ours");
        assert!(decode_listing(b"base64\n!!").unwrap_err().starts_with("the listing is not base64: "));
    }

    #[test]
    fn secrets_are_env_files_private_keys_and_what_the_local_policy_hides_in_the_home_at_any_depth() {
        for secret in [
            ".env",
            ".env.local",
            "app/.env.production",
            ".ssh/id_ed25519",
            "deploy/id_rsa",
            "certs/server.key",
            "certs/tls.PEM",
            ".aws/credentials",
            "nested/.npmrc",
            "home/.config/gh/hosts.yml",
            ".docker/config.json",
        ] {
            assert!(is_secret(Path::new(secret)), "{secret}");
        }
        for plain in ["src/env.rs", "environment.md", "id_rsa.pub", ".ssh-notes.txt", "keys.rs", "config/gh.txt", ""] {
            assert!(!is_secret(Path::new(plain)), "{plain}");
        }
    }

    #[test]
    fn a_pull_downloads_what_moved_and_removes_what_is_gone_but_never_what_is_out_of_view() {
        let old = stamp(1, "1.0");
        let mut known = manifest(&[
            ("same.txt", 1, old.clone()),
            ("moved.txt", 1, old.clone()),
            ("gone.txt", 1, old.clone()),
            ("vendor/lib.rs", 1, old.clone()),
        ]);
        known.pruned.insert("node_modules".into());
        let listed = listing(&[
            ("same.txt", RemoteKind::File, old.clone()),
            ("moved.txt", RemoteKind::File, stamp(2, "2.0")),
            ("new.txt", RemoteKind::File, stamp(3, "2.0")),
            ("link", RemoteKind::Link("same.txt".into()), old.clone()),
            ("target", RemoteKind::Dir, old.clone()),
            ("target/debug/app", RemoteKind::File, old.clone()),
            (".git/config", RemoteKind::File, stamp(9, "3.0")),
            ("fifo", RemoteKind::Other, old.clone()),
            ("huge.bin", RemoteKind::File, stamp(2 << 30, "2.0")),
        ]);
        // The user's rules now ignore `vendor/`: what the mirror knew there is out of view, not deleted.
        let ignored =
            |rel: &Path, _dir: bool| ["target", "node_modules", "vendor"].iter().any(|top| rel.starts_with(top));
        // A download of `grew.bin` got more than the bound: not tried again while it is listed as it was then;
        // `regrown.bin` moved since, so it is.
        known.oversized.insert("grew.bin".into(), stamp(5, "2.0"));
        known.oversized.insert("regrown.bin".into(), stamp(5, "2.0"));
        let mut listed = listed;
        listed.entries.insert("grew.bin".into(), (RemoteKind::File, stamp(5, "2.0")));
        listed.entries.insert("regrown.bin".into(), (RemoteKind::File, stamp(6, "3.0")));
        let plan = plan_pull(&known, &listed, ignored, |rel| rel.starts_with(".git"));
        assert_eq!(
            plan,
            PullPlan {
                download: vec![
                    ("moved.txt".into(), stamp(2, "2.0")),
                    ("new.txt".into(), stamp(3, "2.0")),
                    ("regrown.bin".into(), stamp(6, "3.0"))
                ],
                link: vec![("link".into(), "same.txt".into(), old.clone())],
                remove: paths(&["gone.txt"]),
                oversized: vec![("grew.bin".into(), stamp(5, "2.0")), ("huge.bin".into(), stamp(2 << 30, "2.0"))],
                pruned: BTreeSet::from(["node_modules".into(), "target".into()]),
            }
        );
    }

    #[test]
    fn a_push_sends_what_the_copy_changed_and_holds_back_what_the_agent_wrote_meanwhile() {
        let old = stamp(1, "1.0");
        let known = manifest(&[
            ("same.txt", 1, old.clone()),
            ("settled.txt", 1, old.clone()),
            ("rewritten.txt", 1, old.clone()),
            ("dropped.txt", 1, old.clone()),
            ("was-a-dir/file", 1, old.clone()),
        ]);
        let entry = |len| CopyEntry { stamp: copy_stamp(len), link: None };
        let copy = BTreeMap::from([
            (PathBuf::from("same.txt"), entry(1)),
            (PathBuf::from("settled.txt"), entry(5)),
            (PathBuf::from("rewritten.txt"), entry(5)),
            (PathBuf::from("added.txt"), entry(2)),
            (PathBuf::from("was-a-dir"), entry(2)),
        ]);
        let no_ignores = |_: &Path, _: bool| false;
        let plan = plan_push(&known, &copy, None, false, no_ignores);
        assert_eq!(plan.upload, paths(&["added.txt", "rewritten.txt", "settled.txt", "was-a-dir"]));
        assert_eq!(plan.delete, paths(&["dropped.txt", "was-a-dir", "was-a-dir/file"]));

        // The agent wrote `rewritten.txt` again after the pull, and made `late.txt`: neither is touched.
        let guard = listing(&[
            ("same.txt", RemoteKind::File, old.clone()),
            ("settled.txt", RemoteKind::File, old.clone()),
            ("rewritten.txt", RemoteKind::File, stamp(4, "5.0")),
            ("dropped.txt", RemoteKind::File, old.clone()),
            ("was-a-dir", RemoteKind::Dir, old.clone()),
            ("was-a-dir/file", RemoteKind::File, old.clone()),
            ("late.txt", RemoteKind::File, old.clone()),
        ]);
        let plan = plan_push(&known, &copy, Some(&guard), false, no_ignores);
        assert_eq!(plan.held, paths(&["rewritten.txt"]));
        assert_eq!(plan.upload, paths(&["added.txt", "settled.txt", "was-a-dir"]));
        assert_eq!(plan.delete, paths(&["dropped.txt", "was-a-dir", "was-a-dir/file"]));

        // A sandbox new to the mirror gets everything, and loses what it held beyond the copy but what git ignores.
        let guard =
            listing(&[("stray.txt", RemoteKind::File, old.clone()), ("target/out", RemoteKind::File, old.clone())]);
        let plan = plan_push(&Manifest::default(), &copy, Some(&guard), true, |rel, _| rel.starts_with("target"));
        assert_eq!(plan.upload, copy.keys().cloned().collect::<Vec<_>>());
        assert_eq!((plan.delete, plan.held), (paths(&["stray.txt"]), vec![]));
    }

    #[test]
    fn archives_hold_files_modes_and_links_and_are_cut_by_size() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::write(dir.path().join("bin/run"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(dir.path().join("bin/run"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("big"), vec![b'x'; ARCHIVE_LIMIT]).unwrap();
        std::os::unix::fs::symlink("bin/run", dir.path().join("link")).unwrap();
        let (first, rest) = archive(dir.path(), paths(&["bin/run", "big", "link"])).unwrap();
        assert_eq!(rest, paths(&["link"]), "the archive is full after `big`");
        let mut read = tar::Archive::new(first.as_slice());
        let entries: Vec<(PathBuf, u32, u64)> = read
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().into_owned(), e.header().mode().unwrap(), e.size())
            })
            .collect();
        assert_eq!(entries, vec![("bin/run".into(), 0o755, 10), ("big".into(), 0o644, ARCHIVE_LIMIT as u64)]);
        let (second, rest) = archive(dir.path(), rest).unwrap();
        assert!(rest.is_empty());
        let mut read = tar::Archive::new(second.as_slice());
        let link = read.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(link.header().entry_type(), tar::EntryType::Symlink);
        assert_eq!(link.link_name().unwrap().unwrap(), Path::new("bin/run"));
    }

    /// Runs one of the scripts with the host's `sh`, as the sandbox would.
    #[allow(clippy::disallowed_methods)]
    fn script(script: &str, args: &[&str], stdin: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", script, "sh"])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{script} failed");
        out.stdout
    }

    #[test]
    fn the_scripts_list_prune_delete_and_extract_with_the_systems_tools() {
        let dir = tempfile::tempdir().unwrap();
        let (ws, token) = (dir.path().join("ws"), dir.path().join("token"));
        std::fs::create_dir_all(ws.join("node_modules/x")).unwrap();
        std::fs::create_dir_all(ws.join("old")).unwrap();
        std::fs::write(ws.join("node_modules/x/i.js"), "x").unwrap();
        std::fs::write(ws.join("old/a"), "a").unwrap();
        std::fs::write(ws.join("gone"), "g").unwrap();
        std::fs::write(&token, "tok").unwrap();
        let (ws_arg, token_arg) = (ws.to_str().unwrap(), token.to_str().unwrap());
        let prune = ["(", "-path", "./node_modules", ")", "-prune", "-o"];
        let list = |known: &str| {
            let mut args = vec![ws_arg, token_arg, known];
            args.extend(prune);
            parse_listing(&decode_listing(&script(LIST, &args, b"")).unwrap()).unwrap()
        };
        let first = list("");
        assert_eq!(first.token, "tok");
        assert_eq!(first.entries.keys().cloned().collect::<Vec<_>>(), paths(&["gone", "old", "old/a"]));
        assert_eq!(first.entries[Path::new("old/a")].0, RemoteKind::File);
        let again = list(&first.digest);
        assert!(again.unchanged, "the sandbox's sha256sum agrees with ours");

        // Deletions from stdin, then archives in order; the listing is whole again afterwards.
        let src = dir.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        // `old` was a directory in the sandbox: it is deleted, then comes back as a file.
        std::fs::write(src.join("old"), "now a file").unwrap();
        std::fs::write(src.join("new.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(src.join("new.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (archive_bytes, _) = archive(&src, paths(&["new.sh", "old"])).unwrap();
        let at = dir.path().join("push.tar");
        std::fs::write(&at, archive_bytes).unwrap();
        script(APPLY, &[ws_arg, "delete", at.to_str().unwrap()], b"gone\0old\0");
        assert!(!at.exists(), "the archive is removed once extracted");
        assert!(!ws.join("gone").exists());
        assert_eq!(std::fs::read_to_string(ws.join("old")).unwrap(), "now a file");
        assert_eq!(std::fs::metadata(ws.join("new.sh")).unwrap().permissions().mode() & 0o777, 0o755);
        let after = list(&first.digest);
        assert!(!after.unchanged);
        assert_eq!(after.entries.keys().cloned().collect::<Vec<_>>(), paths(&["new.sh", "old"]));
        assert_eq!(after.entries[Path::new("new.sh")].1.mode, 0o755);
    }

    #[test]
    fn pruned_paths_are_find_patterns_matching_only_themselves() {
        assert_eq!(find_pattern("node_modules"), "./node_modules");
        assert_eq!(find_pattern("a*b/[x]?\\"), "./a\\*b/\\[x\\]\\?\\\\");
    }
}
