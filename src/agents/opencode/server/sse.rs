//! A bounded reader of a server-sent event stream (`text/event-stream`): the `data` of each event, one at a time.
//!
//! OpenCode's event stream is written by the agent's own server, so nothing in it may cost the bridge more than a
//! fixed amount of memory: an event whose data exceeds [`MAX_EVENT`] is counted and skipped as its bytes arrive,
//! never held (a line-buffering parser held a 512 MiB event whole, twice over), and bytes that are not UTF-8 are
//! replaced rather than ending the stream.

use std::collections::VecDeque;

use futures::{Stream, StreamExt};
use hyper::body::Bytes;

/// At most this much data of one event is kept (OpenCode's largest events, a finished part with a long text or a
/// tool's output, are well under 1 MiB; a bigger one is dropped with a note).
pub const MAX_EVENT: usize = 4 * 1024 * 1024;

/// One event of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseEvent {
    /// Its data (the `data:` lines joined by newlines), decoded lossily.
    Data(String),
    /// An event with more than the bound of data: how many bytes it had; none of them was kept.
    Oversize(usize),
}

/// The parser: bytes in, complete events out. Holds at most one line's worth of [`MAX_EVENT`] bytes, plus the
/// events of the last chunk fed.
#[derive(Debug)]
pub struct SseParser {
    max: usize,
    /// The current line, while it is within the bound.
    line: Vec<u8>,
    /// The current line went over the bound: its bytes are counted, not kept.
    line_over: bool,
    /// The current line's length so far, and that of its field's name and colon (`data: `) when it went over.
    line_len: usize,
    line_field: usize,
    /// The current event's data so far.
    data: Vec<u8>,
    /// The current event had a `data` line (an event of only comments or other fields is no event).
    has_data: bool,
    /// The current event went over the bound: the size of its data so far.
    over: Option<usize>,
    /// The last byte fed was a CR, so an LF right after it ends no second line.
    after_cr: bool,
}

impl SseParser {
    /// A parser that keeps at most `max` bytes of one event's data.
    pub fn new(max: usize) -> Self {
        SseParser {
            max,
            line: Vec::new(),
            line_over: false,
            line_len: 0,
            line_field: 0,
            data: Vec::new(),
            has_data: false,
            over: None,
            after_cr: false,
        }
    }

    /// Feeds the next bytes; every event they complete is pushed onto `out`.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut VecDeque<SseEvent>) {
        while !bytes.is_empty() {
            if self.after_cr && bytes[0] == b'\n' {
                bytes = &bytes[1..];
                self.after_cr = false;
                continue;
            }
            self.after_cr = false;
            match bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(end) => {
                    self.push_line_bytes(&bytes[..end]);
                    self.after_cr = bytes[end] == b'\r';
                    bytes = &bytes[end + 1..];
                    self.end_line(out);
                }
                None => {
                    self.push_line_bytes(bytes);
                    bytes = &[];
                }
            }
        }
    }

    /// The stream ended: an event not closed by a blank line is dropped, as the SSE standard says.
    pub fn finish(&mut self) {
        *self = SseParser::new(self.max);
    }

    fn push_line_bytes(&mut self, bytes: &[u8]) {
        self.line_len += bytes.len();
        if self.line_over {
            return;
        }
        // `data:` plus the bound: a line longer than that makes the event oversize whatever its field.
        if self.line.len() + bytes.len() > self.max + 6 {
            self.line_over = true;
            let mut head = std::mem::take(&mut self.line);
            head.extend_from_slice(&bytes[..bytes.len().min(8)]);
            self.line_field = match head.iter().position(|&b| b == b':') {
                Some(colon) if head.get(colon + 1) == Some(&b' ') => colon + 2,
                Some(colon) => colon + 1,
                None => 0,
            };
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    fn end_line(&mut self, out: &mut VecDeque<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        let (over, len) = (self.line_over, self.line_len - self.line_field);
        self.line_over = false;
        self.line_len = 0;
        self.line_field = 0;
        if over {
            // Only a `data` line can be this long in OpenCode's stream; any field's size counts against the event.
            let before = self.over.unwrap_or(self.data.len()) + usize::from(self.has_data);
            self.has_data = true;
            self.over = Some(before + len);
            self.data = Vec::new();
            return;
        }
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (&line[..], &[][..]),
        };
        if field != b"data" {
            return;
        }
        let added = value.len() + usize::from(self.has_data);
        self.has_data = true;
        if let Some(size) = self.over.as_mut() {
            *size += added;
            return;
        }
        if self.data.len() + added > self.max {
            self.over = Some(self.data.len() + added);
            self.data = Vec::new();
            return;
        }
        if !self.data.is_empty() || added > value.len() {
            self.data.push(b'\n');
        }
        self.data.extend_from_slice(value);
    }

    fn dispatch(&mut self, out: &mut VecDeque<SseEvent>) {
        let data = std::mem::take(&mut self.data);
        let (has_data, over) = (self.has_data, self.over.take());
        self.has_data = false;
        if let Some(size) = over {
            out.push_back(SseEvent::Oversize(size));
        } else if has_data {
            out.push_back(SseEvent::Data(String::from_utf8_lossy(&data).into_owned()));
        }
    }
}

/// The events of a body's chunks, in order, parsed as they come; ends when the body ends or fails.
pub fn events<S, E>(body: S, max: usize) -> impl Stream<Item = SseEvent> + Send + Unpin
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
{
    let state = (body, SseParser::new(max), VecDeque::new(), false);
    Box::pin(futures::stream::unfold(state, |(mut body, mut parser, mut ready, mut done)| async move {
        loop {
            if let Some(event) = ready.pop_front() {
                return Some((event, (body, parser, ready, done)));
            }
            if done {
                return None;
            }
            match body.next().await {
                Some(Ok(chunk)) => parser.feed(&chunk, &mut ready),
                Some(Err(_)) | None => {
                    parser.finish();
                    done = true;
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: &[&[u8]], max: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::new(max);
        let mut out = VecDeque::new();
        for chunk in chunks {
            parser.feed(chunk, &mut out);
        }
        out.into_iter().collect()
    }

    fn data(text: &str) -> SseEvent {
        SseEvent::Data(text.to_string())
    }

    #[test]
    fn events_are_the_data_lines_joined_whatever_the_chunks_and_line_ends() {
        let stream: &[u8] = b": hello\ndata: {\"a\":1}\n\nevent: x\nid: 3\ndata: one\ndata:two\n\r\ndata: crlf\r\n\r\n";
        let whole = parse(&[stream], 100);
        assert_eq!(whole, vec![data("{\"a\":1}"), data("one\ntwo"), data("crlf")]);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(parse(&bytes, 100), whole);
        // A CR at a chunk's end and its LF at the next one's start end one line, not two.
        assert_eq!(parse(&[b"data: a\r", b"\n\r", b"\n"], 100), vec![data("a")]);
        // Comments and other fields alone make no event; an empty data line does.
        assert_eq!(parse(&[b": ping\n\nretry: 5\n\ndata:\n\n"], 100), vec![data("")]);
    }

    #[test]
    fn an_event_over_the_bound_is_counted_and_skipped_and_the_next_one_comes_through() {
        let big = vec![b'x'; 1000];
        let mut stream = b"data: ".to_vec();
        stream.extend_from_slice(&big);
        stream.extend_from_slice(b"\n\ndata: after\n\n");
        let chunks: Vec<&[u8]> = stream.chunks(7).collect();
        assert_eq!(parse(&chunks, 100), vec![SseEvent::Oversize(1000), data("after")]);
        // Many data lines, each within the bound, over it together.
        let many = "data: 0123456789\n".repeat(20) + "\ndata: ok\n\n";
        assert_eq!(parse(&[many.as_bytes()], 100), vec![SseEvent::Oversize(219), data("ok")]);
        // Exactly the bound fits.
        let exact = format!("data: {}\n\n", "y".repeat(100));
        assert_eq!(parse(&[exact.as_bytes()], 100), vec![data(&"y".repeat(100))]);
    }

    #[test]
    fn a_line_over_the_bound_is_never_held() {
        let mut parser = SseParser::new(64);
        let mut out = VecDeque::new();
        parser.feed(b"data: ", &mut out);
        for _ in 0..10_000 {
            parser.feed(&[b'z'; 1024], &mut out);
            assert!(parser.line.capacity() <= 64 + 6 + 1024, "the parser holds {} bytes", parser.line.capacity());
        }
        parser.feed(b"\n\n", &mut out);
        assert_eq!(out.into_iter().collect::<Vec<_>>(), vec![SseEvent::Oversize(10_240_000)]);
    }

    #[test]
    fn invalid_utf8_is_replaced_and_the_stream_goes_on() {
        let events = parse(&[b"data: {\"t\":\"a\xff\xfeb\"}\n\ndata: next\n\n"], 100);
        assert_eq!(events, vec![data("{\"t\":\"a\u{fffd}\u{fffd}b\"}"), data("next")]);
        // A character split across chunks is whole again.
        assert_eq!(parse(&[b"data: \xc3", b"\xa9\n\n"], 100), vec![data("é")]);
    }

    #[test]
    fn an_unfinished_event_at_the_end_is_dropped() {
        let mut parser = SseParser::new(100);
        let mut out = VecDeque::new();
        parser.feed(b"data: done\n\ndata: cut", &mut out);
        parser.finish();
        assert_eq!(out.into_iter().collect::<Vec<_>>(), vec![data("done")]);
    }

    #[tokio::test]
    async fn the_stream_yields_events_as_chunks_come_and_ends_with_the_body() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"data: a\n")),
            Ok(Bytes::from_static(b"\ndata: b\n\n")),
            Err(std::io::Error::other("cut")),
            Ok(Bytes::from_static(b"data: never\n\n")),
        ];
        let stream = events(futures::stream::iter(chunks), 100);
        assert_eq!(stream.collect::<Vec<_>>().await, vec![data("a"), data("b")]);
    }
}
