//! Lines of bounded length from a stream (a CLI's output, a server's, stdin), and the first line of a text.
//!
//! Whatever writes the stream (a CLI in the sandbox, the editor) may send a line of any length, so a line is
//! never held past its limit: its first `limit` bytes are kept, marked cut, and the rest is consumed as it arrives
//! and dropped. The async reader and the blocking one cut alike, since both feed the same [`Cutter`].

use std::collections::VecDeque;
use std::io::{BufRead, ErrorKind};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// One line of [`BoundedLines`] or [`BlockingLines`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Line {
    /// The line with its newline, or its first `limit` bytes when it was longer.
    pub bytes: Vec<u8>,
    /// The line was longer than the limit: what followed up to its newline was dropped.
    pub cut: bool,
}

/// The line being read: what was kept of it, and whether its rest is being dropped.
struct Cutter {
    limit: usize,
    line: Vec<u8>,
    /// The line in `line` reached the limit; its rest is being dropped.
    cutting: bool,
}

impl Cutter {
    fn new(limit: usize) -> Self {
        Cutter { limit, line: Vec::new(), cutting: false }
    }

    /// Takes what belongs to the current line from `buffer`, what the reader holds (empty at the end of the
    /// stream). Returns how much of it was used, and the answer once there is one: the line when its newline was
    /// among that, `Some(None)` at the end.
    fn feed(&mut self, buffer: &[u8]) -> (usize, Option<Option<Line>>) {
        if buffer.is_empty() {
            return (0, Some(self.at_end()));
        }
        let newline = buffer.iter().position(|&b| b == b'\n');
        let used = newline.map_or(buffer.len(), |at| at + 1);
        if newline.is_some() && self.line.is_empty() && !self.cutting && used <= self.limit {
            // A whole line in the buffer: allocated once at its size, not grown a doubling at a time.
            return (used, Some(Some(Line { bytes: buffer[..used].to_vec(), cut: false })));
        }
        if !self.cutting {
            let room = self.limit - self.line.len();
            let kept = used.min(room);
            self.line.extend_from_slice(&buffer[..kept]);
            // Full without its newline: the rest of the line goes.
            self.cutting = kept < used || (newline.is_none() && self.line.len() == self.limit);
        }
        (used, newline.map(|_| Some(self.take())))
    }

    /// The line `buffer` ends whole within the limit, if there is one: how much of it was used, and the line.
    fn whole_from(&mut self, buffer: &[u8]) -> Option<(usize, Line)> {
        if self.cutting {
            return None;
        }
        let used = buffer.iter().position(|&b| b == b'\n')? + 1;
        if self.line.len() + used > self.limit {
            return None;
        }
        if self.line.is_empty() {
            return Some((used, Line { bytes: buffer[..used].to_vec(), cut: false }));
        }
        self.line.extend_from_slice(&buffer[..used]);
        Some((used, self.take()))
    }

    /// At the end of the stream: a last line without a newline is a line too.
    fn at_end(&mut self) -> Option<Line> {
        (!self.line.is_empty() || self.cutting).then(|| self.take())
    }

    fn take(&mut self) -> Line {
        let cut = std::mem::take(&mut self.cutting);
        Line { bytes: std::mem::take(&mut self.line), cut }
    }
}

/// Reads lines of at most `limit` bytes (newline included) from an async stream without ever holding more.
/// [`BoundedLines::next_line`] is cancel-safe, like `read_until`: what it read stays here.
pub(crate) struct BoundedLines<R> {
    reader: BufReader<R>,
    cutter: Cutter,
}

impl<R: AsyncRead + Unpin> BoundedLines<R> {
    pub(crate) fn new(reader: R, limit: usize) -> Self {
        // A pipe's worth at a time: a fast stream is read in few calls.
        BoundedLines { reader: BufReader::with_capacity(1 << 16, reader), cutter: Cutter::new(limit) }
    }

    /// The next line if it is already read whole (no waiting): what [`BoundedLines::next_line`] would return.
    pub(crate) fn buffered_line(&mut self) -> Option<Line> {
        let (used, line) = self.cutter.whole_from(self.reader.buffer())?;
        self.reader.consume(used);
        Some(line)
    }

    /// The next line; `None` at the end of the stream. A last line without a newline is a line too.
    pub(crate) async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            // The only await: everything below it runs to the end or returns, so nothing read is lost on cancel.
            let buffer = self.reader.fill_buf().await?;
            let (used, answer) = self.cutter.feed(buffer);
            self.reader.consume(used);
            if let Some(line) = answer {
                return Ok(line);
            }
        }
    }
}

/// [`BoundedLines`] for a blocking reader (stdin on its own thread).
pub(crate) struct BlockingLines<R> {
    reader: R,
    cutter: Cutter,
}

impl<R: BufRead> BlockingLines<R> {
    pub(crate) fn new(reader: R, limit: usize) -> Self {
        BlockingLines { reader, cutter: Cutter::new(limit) }
    }

    /// The next line; `None` at the end of the stream. A last line without a newline is a line too.
    pub(crate) fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let buffer = match self.reader.fill_buf() {
                Ok(buffer) => buffer,
                // As `read_until` does: a signal is not the end of the input.
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let (used, answer) = self.cutter.feed(buffer);
            self.reader.consume(used);
            if let Some(line) = answer {
                return Ok(line);
            }
        }
    }
}

/// The first line of `bytes`: up to its first CR or LF, so a lone CR ends it too (it would redraw a terminal's line).
pub(crate) fn first_line(bytes: &[u8]) -> &[u8] {
    bytes.split(|&b| b == b'\r' || b == b'\n').next().unwrap_or_default()
}

/// [`first_line`] of a text.
pub(crate) fn first_text_line(text: &str) -> &str {
    // CR and LF are ASCII, so the cut is on a character boundary.
    &text[..first_line(text.as_bytes()).len()]
}

/// Lines of a CLI's stderr kept for error messages.
const STDERR_TAIL_LINES: usize = 40;

/// The longest line of a CLI's stderr that is read; the rest of a longer one is dropped as it arrives.
const STDERR_LINE_LIMIT: usize = 64 * 1024;

/// Reads a stream to its end, keeping only its last lines (bounded memory for chatty CLIs).
pub(crate) async fn stderr_tail<R: AsyncRead + Unpin>(stream: R) -> String {
    let mut lines: VecDeque<String> = VecDeque::new();
    let mut reader = BoundedLines::new(stream, STDERR_LINE_LIMIT);
    while let Ok(Some(line)) = reader.next_line().await {
        let text = strip_ansi(String::from_utf8_lossy(&line.bytes).trim_end());
        tracing::debug!(target: "acp_sandbox::cli_stderr", "{text}");
        lines.push_back(text.chars().take(2000).collect());
        if lines.len() > STDERR_TAIL_LINES {
            lines.pop_front();
        }
    }
    Vec::from(lines).join("\n")
}

/// Removes terminal escape sequences (OpenCode colours its errors even when not on a TTY). `anstream`'s stripper,
/// not `strip-ansi-escapes`: that one drops tabs and carriage returns too, which a stack trace's lines begin with.
pub(crate) fn strip_ansi(text: &str) -> String {
    anstream::adapter::strip_str(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines_of(input: &[u8], limit: usize) -> Vec<(String, bool)> {
        let mut reader = BoundedLines::new(input, limit);
        let mut lines = Vec::new();
        while let Some(line) = reader.next_line().await.unwrap() {
            lines.push((String::from_utf8(line.bytes).unwrap(), line.cut));
        }
        lines
    }

    fn blocking_lines_of(input: &[u8], limit: usize) -> Vec<(String, bool)> {
        let mut reader = BlockingLines::new(input, limit);
        std::iter::from_fn(|| reader.next_line().unwrap())
            .map(|line| (String::from_utf8(line.bytes).unwrap(), line.cut))
            .collect()
    }

    #[tokio::test]
    async fn lines_longer_than_the_limit_are_cut_and_their_rest_dropped() {
        let input: &[u8] = b"short\n0123456789abc\n01234567\nlast";
        let expected = [("short\n", false), ("01234567", true), ("01234567", true), ("last", false)];
        assert_eq!(lines_of(input, 8).await, expected.map(|(text, cut)| (text.to_string(), cut)));
        assert_eq!(lines_of(b"1234567\n", 8).await, vec![("1234567\n".to_string(), false)]);
        assert_eq!(lines_of(b"0123456789", 8).await, vec![("01234567".to_string(), true)]);
        assert_eq!(lines_of(b"", 8).await, Vec::<(String, bool)>::new());
        for input in [input, b"1234567\n", b"0123456789", b""] {
            assert_eq!(blocking_lines_of(input, 8), lines_of(input, 8).await, "{input:?}");
        }
    }

    #[tokio::test]
    async fn a_line_cut_across_many_reads_keeps_only_the_limit() {
        // A pipe that holds 3 bytes at a time: the rest of the long line is dropped across many reads.
        let (mut writer, reader) = tokio::io::duplex(3);
        let feeder = tokio::spawn(async move {
            tokio::io::AsyncWriteExt::write_all(&mut writer, &[b'x'; 100]).await.unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut writer, b"\nafter\n").await.unwrap();
        });
        let mut lines = BoundedLines::new(reader, 10);
        let first = lines.next_line().await.unwrap().unwrap();
        assert_eq!(first, Line { bytes: vec![b'x'; 10], cut: true });
        let second = lines.next_line().await.unwrap().unwrap();
        assert_eq!(second, Line { bytes: b"after\n".to_vec(), cut: false });
        feeder.await.unwrap();
        assert_eq!(lines.next_line().await.unwrap(), None);
        // The same through a blocking reader that hands over 3 bytes at a time.
        let input = [&[b'x'; 100][..], b"\nafter\n"].concat();
        let mut lines = BlockingLines::new(std::io::BufReader::with_capacity(3, &input[..]), 10);
        assert_eq!(lines.next_line().unwrap(), Some(Line { bytes: vec![b'x'; 10], cut: true }));
        assert_eq!(lines.next_line().unwrap(), Some(Line { bytes: b"after\n".to_vec(), cut: false }));
        assert_eq!(lines.next_line().unwrap(), None);
    }

    /// The lines a turn reads without waiting are the lines `next_line` would return: whole ones only, a long one
    /// left to `next_line` to cut, nothing past what was read.
    #[tokio::test]
    async fn buffered_lines_are_the_lines_next_line_returns() {
        let input: &[u8] = b"one\ntwo\n0123456789abc\nthree\npart";
        let mut lines = BoundedLines::new(input, 8);
        let mut seen = Vec::new();
        while let Some(first) = lines.next_line().await.unwrap() {
            seen.push((String::from_utf8(first.bytes).unwrap(), first.cut, false));
            while let Some(line) = lines.buffered_line() {
                seen.push((String::from_utf8(line.bytes).unwrap(), line.cut, true));
            }
        }
        let expected = [
            ("one\n", false, false),
            ("two\n", false, true),
            ("01234567", true, false),
            ("three\n", false, true),
            ("part", false, false),
        ];
        assert_eq!(seen, expected.map(|(text, cut, buffered)| (text.to_string(), cut, buffered)));
    }

    #[test]
    fn the_first_line_ends_at_either_line_ending() {
        assert_eq!(first_line(b"HTTP/1.1 200 OK\r\nServer: x\r\n"), b"HTTP/1.1 200 OK");
        assert_eq!(first_line(b""), b"");
        assert_eq!(first_text_line("failed \u{2713}\nstderr"), "failed \u{2713}");
        assert_eq!(first_text_line("one\rtwo"), "one");
        assert_eq!(first_text_line("\nsecond"), "");
    }

    #[test]
    fn escape_sequences_go_and_whitespace_stays() {
        assert_eq!(strip_ansi("\u{1b}[91mError:\u{1b}[0m gone"), "Error: gone");
        assert_eq!(strip_ansi("\u{1b}[1;38;5;208mat\u{1b}[m\tf (a.js:1)\r"), "at\tf (a.js:1)\r");
        assert_eq!(strip_ansi("\u{1b}]0;title\u{7}text \u{2713}"), "text \u{2713}", "a title is no text");
    }

    #[tokio::test]
    async fn stderr_tail_keeps_the_last_lines() {
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let tail = stderr_tail(Box::pin(std::io::Cursor::new(text.into_bytes()))).await;
        assert!(tail.starts_with("line 60\n"));
        assert!(tail.ends_with("line 99"));
        // A line of any length costs at most the limit: its start is kept, its rest dropped as it arrives.
        let long = [&[b'x'; 100_000][..], b"\n\x1b[31mlast"].concat();
        let tail = stderr_tail(Box::pin(std::io::Cursor::new(long))).await;
        assert_eq!(tail, format!("{}\nlast", "x".repeat(2000)));
    }
}
