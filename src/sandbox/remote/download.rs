//! Downloads of a remote sandbox's files straight to a file on the host, a chunk at a time as they arrive: a file
//! of any size costs the bridge a few chunk buffers, never its whole length in memory, and one past its bound is
//! cut off as soon as the bound is passed (what was written of it removed).

use std::io;
use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;

use crate::sandbox::SandboxError;

/// What a bounded download to a file got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Downloaded {
    /// The remote file does not exist; nothing was written.
    Missing,
    /// The whole file, of this many bytes, is at the destination.
    Whole(u64),
    /// The file is larger than the bound: at least this many bytes (its announced length, or the bound plus one
    /// for a download cut off as it passed the bound). Nothing is left at the destination.
    TooLarge(u64),
}

/// A file being written from a download: removed when dropped unless [`Partial::finish`] kept it, so a download
/// that fails, is cut off or is cancelled (its future dropped) leaves nothing behind.
pub struct Partial {
    file: Option<tokio::fs::File>,
    path: PathBuf,
    written: u64,
    limit: u64,
}

impl Partial {
    /// A new file at `path` (none may be there: a leftover is never written through) for at most `limit` bytes.
    pub async fn create(path: &Path, limit: u64) -> io::Result<Self> {
        let file = tokio::fs::OpenOptions::new().write(true).create_new(true).open(path).await?;
        Ok(Partial { file: Some(file), path: path.to_path_buf(), written: 0, limit })
    }

    /// Appends a chunk. Answers `false`, having removed the file, when the chunk takes it past the limit: the
    /// download is to stop there (nothing is written of that chunk, and nothing more may be pushed).
    pub async fn push(&mut self, chunk: &[u8]) -> io::Result<bool> {
        let Some(file) = self.file.as_mut() else { return Ok(false) };
        let total = self.written.saturating_add(chunk.len() as u64);
        if total > self.limit {
            // How much more there is is never read: one byte over is what is known.
            self.written = self.limit.saturating_add(1);
            self.discard().await;
            return Ok(false);
        }
        file.write_all(chunk).await?;
        self.written = total;
        Ok(true)
    }

    /// The bytes pushed so far (once cut off: the limit plus one).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Flushes the file and keeps it; answers its length.
    pub async fn finish(mut self) -> io::Result<u64> {
        let Some(mut file) = self.file.take() else {
            return Err(io::Error::other("the download was cut off at its limit"));
        };
        if let Err(e) = file.flush().await {
            drop(file);
            let _ = std::fs::remove_file(&self.path);
            return Err(e);
        }
        Ok(self.written)
    }

    async fn discard(&mut self) {
        if let Some(file) = self.file.take() {
            drop(file);
            let _ = tokio::fs::remove_file(&self.path).await;
        }
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            // Unlinking is one quick call; a dropped future cannot await it.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Writes the body of a successful `response` to a new file at `dest`, at most `limit` bytes of it: a body
/// announced or found larger is cut off ([`Downloaded::TooLarge`], nothing left at `dest`). `transport` names a
/// failure of the connection in the provider's words.
pub async fn save(
    mut response: reqwest::Response,
    dest: &Path,
    limit: u64,
    transport: impl Fn(reqwest::Error) -> SandboxError,
) -> Result<Downloaded, SandboxError> {
    // A length announced over the bound: not one byte is read.
    if let Some(len) = response.content_length()
        && len > limit
    {
        return Ok(Downloaded::TooLarge(len));
    }
    let write_error = |e| SandboxError::io(format!("write a download to {}", dest.display()), e);
    let mut partial = Partial::create(dest, limit).await.map_err(write_error)?;
    while let Some(chunk) = response.chunk().await.map_err(&transport)? {
        if !partial.push(&chunk).await.map_err(write_error)? {
            return Ok(Downloaded::TooLarge(partial.written()));
        }
    }
    Ok(Downloaded::Whole(partial.finish().await.map_err(write_error)?))
}

/// Writes `bytes` (read already, at most `limit + 1` of them) to a new file at `dest` as [`save`] would: for a
/// provider that cannot stream.
pub async fn save_bytes(bytes: Option<Vec<u8>>, dest: &Path, limit: u64) -> Result<Downloaded, SandboxError> {
    let Some(bytes) = bytes else { return Ok(Downloaded::Missing) };
    let write_error = |e| SandboxError::io(format!("write a download to {}", dest.display()), e);
    let mut partial = Partial::create(dest, limit).await.map_err(write_error)?;
    if !partial.push(&bytes).await.map_err(write_error)? {
        return Ok(Downloaded::TooLarge(partial.written()));
    }
    Ok(Downloaded::Whole(partial.finish().await.map_err(write_error)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_partial_file_stops_at_its_limit_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("part");
        let mut partial = Partial::create(&at, 10).await.unwrap();
        assert!(partial.push(b"0123").await.unwrap());
        assert!(partial.push(b"456789").await.unwrap(), "exactly the limit is within it");
        assert!(at.exists());
        assert!(!partial.push(b"xyz").await.unwrap(), "over");
        assert_eq!(partial.written(), 11);
        assert!(!at.exists(), "the partial file is removed at once");
        assert!(!partial.push(b"y").await.unwrap(), "nothing more is taken");
        assert!(!at.exists());
        assert!(partial.finish().await.is_err(), "a cut-off download is never kept");
        assert!(!at.exists());
    }

    #[tokio::test]
    async fn a_finished_file_is_kept_and_a_dropped_one_removed() {
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("kept");
        let mut partial = Partial::create(&kept, 1 << 20).await.unwrap();
        for chunk in [&b"ab"[..], b"", b"cd"] {
            assert!(partial.push(chunk).await.unwrap());
        }
        assert_eq!(partial.finish().await.unwrap(), 4);
        assert_eq!(std::fs::read(&kept).unwrap(), b"abcd");

        // A download whose future is dropped mid-way (cancelled, or a sibling download failed).
        let dropped = dir.path().join("dropped");
        let mut partial = Partial::create(&dropped, 1 << 20).await.unwrap();
        assert!(partial.push(b"half").await.unwrap());
        drop(partial);
        assert!(!dropped.exists());

        // A leftover at the destination is never written through.
        std::fs::write(&dropped, "leftover").unwrap();
        assert_eq!(Partial::create(&dropped, 1).await.err().map(|e| e.kind()), Some(io::ErrorKind::AlreadyExists));
        assert_eq!(std::fs::read(&dropped).unwrap(), b"leftover");
    }

    #[tokio::test]
    async fn bytes_read_already_are_saved_within_the_same_bound() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("f");
        assert_eq!(save_bytes(None, &at, 4).await.unwrap(), Downloaded::Missing);
        assert!(!at.exists());
        assert_eq!(save_bytes(Some(b"12345".to_vec()), &at, 4).await.unwrap(), Downloaded::TooLarge(5));
        assert!(!at.exists());
        assert_eq!(save_bytes(Some(b"1234".to_vec()), &at, 4).await.unwrap(), Downloaded::Whole(4));
        assert_eq!(std::fs::read(&at).unwrap(), b"1234");
    }
}
