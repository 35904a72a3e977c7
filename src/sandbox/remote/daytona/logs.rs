//! A session command's output as Daytona streams it: the followed-logs WebSocket, whose bytes carry the daemon's
//! markers (`01 01 01` before each stdout line, `02 02 02` before each stderr line, split anywhere across
//! messages), demultiplexed into the command's stdout and stderr pipes. The demultiplexer is pure.

use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use super::api::{DaytonaError, SOURCE, Toolbox};

const STDOUT_MARKER: [u8; 3] = [1, 1, 1];
const STDERR_MARKER: [u8; 3] = [2, 2, 2];

/// Which pipe bytes belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pipe {
    /// stdout.
    Stdout,
    /// stderr.
    Stderr,
}

/// Splits the marked log stream into stdout and stderr pieces. Bytes before any marker (a daemon that strips
/// them) count as stdout.
#[derive(Debug)]
pub struct Demuxer {
    current: Pipe,
    /// The end of the last chunk when it may be the start of a marker.
    held: Vec<u8>,
}

impl Default for Demuxer {
    fn default() -> Self {
        Self { current: Pipe::Stdout, held: Vec::new() }
    }
}

impl Demuxer {
    /// The pieces of one more chunk, in order; adjacent bytes of one pipe come as one piece.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<(Pipe, Vec<u8>)> {
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(chunk);
        self.split(&data)
    }

    /// What is still held at the end of the stream (it was no marker after all).
    pub fn finish(&mut self) -> Vec<(Pipe, Vec<u8>)> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() { Vec::new() } else { vec![(self.current, held)] }
    }

    fn split(&mut self, data: &[u8]) -> Vec<(Pipe, Vec<u8>)> {
        let mut pieces: Vec<(Pipe, Vec<u8>)> = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < data.len() {
            let marker = match data.get(i..i + 3) {
                Some(m) if m == STDOUT_MARKER => Some(Pipe::Stdout),
                Some(m) if m == STDERR_MARKER => Some(Pipe::Stderr),
                Some(_) => None,
                // The last one or two bytes may begin a marker: they wait for the next chunk.
                None if STDOUT_MARKER.starts_with(&data[i..]) || STDERR_MARKER.starts_with(&data[i..]) => {
                    push(&mut pieces, self.current, &data[start..i]);
                    self.held = data[i..].to_vec();
                    return pieces;
                }
                None => None,
            };
            if let Some(pipe) = marker {
                push(&mut pieces, self.current, &data[start..i]);
                self.current = pipe;
                i += 3;
                start = i;
            } else {
                i += 1;
            }
        }
        push(&mut pieces, self.current, &data[start..]);
        pieces
    }
}

fn push(pieces: &mut Vec<(Pipe, Vec<u8>)>, pipe: Pipe, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    match pieces.last_mut() {
        Some((last, buf)) if *last == pipe => buf.extend_from_slice(bytes),
        _ => pieces.push((pipe, bytes.to_vec())),
    }
}

/// The write ends of a command's stdout and stderr.
pub struct Sinks {
    /// stdout.
    pub stdout: DuplexStream,
    /// stderr.
    pub stderr: DuplexStream,
}

impl Sinks {
    async fn write(&mut self, pieces: Vec<(Pipe, Vec<u8>)>) {
        for (pipe, bytes) in pieces {
            let sink = match pipe {
                Pipe::Stdout => &mut self.stdout,
                Pipe::Stderr => &mut self.stderr,
            };
            // A reader that went away (the turn ended) does not stop the stream from being drained.
            let _ = sink.write_all(&bytes).await;
        }
    }
}

/// How often a dropped log stream is opened again before the rest is read at the end.
const RECONNECTS: usize = 3;

/// Follows a command's logs until the daemon closes the stream (the command ended), writing them to `sinks`.
/// A dropped connection is opened again (the daemon replays the log from its start, so what was already seen is
/// skipped); after [`RECONNECTS`] failures it answers how many raw bytes arrived, so that the rest can be read
/// from the plain logs once the command ends.
pub async fn follow(
    toolbox: &Toolbox,
    session: &str,
    command: &str,
    demuxer: &mut Demuxer,
    sinks: &mut Sinks,
) -> Result<usize, (usize, DaytonaError)> {
    let mut seen = 0;
    let mut failures = 0;
    loop {
        let error = match stream_once(toolbox, session, command, seen, demuxer, sinks).await {
            Ok((total, true)) => return Ok(total),
            Ok((total, false)) => {
                seen = total;
                "the stream ended without a close".to_string()
            }
            Err((total, e)) => {
                seen = total;
                e
            }
        };
        failures += 1;
        if failures > RECONNECTS {
            return Err((seen, DaytonaError::Stream(error)));
        }
        tracing::debug!(command, "the log stream dropped ({error}); opening it again");
        tokio::time::sleep(Duration::from_millis(200 * failures as u64)).await;
    }
}

/// One connection of the followed logs: the bytes after the first `skip`; answers the total seen and whether the
/// daemon closed the stream.
async fn stream_once(
    toolbox: &Toolbox,
    session: &str,
    command: &str,
    skip: usize,
    demuxer: &mut Demuxer,
    sinks: &mut Sinks,
) -> Result<(usize, bool), (usize, String)> {
    let url = toolbox.logs_ws_url(session, command);
    let mut request = url.as_str().into_client_request().map_err(|e| (skip, e.to_string()))?;
    let endpoint = toolbox.client().endpoint();
    let headers = request.headers_mut();
    let mut bearer = HeaderValue::from_str(&format!("Bearer {}", endpoint.api_key))
        .map_err(|_| (skip, "the API key is not a valid header value".to_string()))?;
    bearer.set_sensitive(true);
    headers.insert("Authorization", bearer);
    headers.insert("X-Daytona-Split-Output", HeaderValue::from_static("true"));
    headers.insert("X-Daytona-Source", HeaderValue::from_static(SOURCE));
    if let Some(org) = endpoint.organization_id.as_deref().and_then(|o| HeaderValue::from_str(o).ok()) {
        headers.insert("X-Daytona-Organization-ID", org);
    }
    let connect = tokio_tungstenite::connect_async(request);
    let (mut socket, _) = tokio::time::timeout(Duration::from_secs(30), connect)
        .await
        .map_err(|_| (skip, "connecting timed out".to_string()))?
        .map_err(|e| (skip, e.to_string()))?;
    let mut total = 0;
    while let Some(message) = socket.next().await {
        let bytes = match message {
            Ok(Message::Binary(bytes)) => bytes.to_vec(),
            Ok(Message::Text(text)) => text.as_bytes().to_vec(),
            Ok(Message::Close(_)) => return Ok((total.max(skip), true)),
            Ok(_) => continue,
            Err(e) => return Err((total.max(skip), e.to_string())),
        };
        let new = bytes.get(skip.saturating_sub(total)..).unwrap_or_default();
        total += bytes.len();
        if !new.is_empty() {
            sinks.write(demuxer.feed(new)).await;
        }
    }
    Ok((total.max(skip), false))
}

/// Writes what the followed stream missed (from byte `seen` of the plain logs) and what the demuxer still holds.
pub async fn complete(demuxer: &mut Demuxer, sinks: &mut Sinks, rest: &[u8]) {
    sinks.write(demuxer.feed(rest)).await;
    sinks.write(demuxer.finish()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn run(chunks: &[&[u8]]) -> Vec<(Pipe, Vec<u8>)> {
        let mut demuxer = Demuxer::default();
        let mut out = Vec::new();
        for chunk in chunks {
            for piece in demuxer.feed(chunk) {
                push(&mut out, piece.0, &piece.1);
            }
        }
        for piece in demuxer.finish() {
            push(&mut out, piece.0, &piece.1);
        }
        out
    }

    #[test]
    fn lines_go_to_the_pipe_their_marker_names() {
        let log = b"\x01\x01\x01one\n\x02\x02\x02oops\n\x01\x01\x01two\n";
        assert_eq!(
            run(&[log]),
            vec![
                (Pipe::Stdout, b"one\n".to_vec()),
                (Pipe::Stderr, b"oops\n".to_vec()),
                (Pipe::Stdout, b"two\n".to_vec())
            ]
        );
    }

    #[test]
    fn markers_split_across_messages_are_recognised() {
        let log: &[u8] = b"\x01\x01\x01one\n\x02\x02\x02oops\n\x01\x01\x01two\n";
        // Every split point, including inside each marker.
        for at in 0..=log.len() {
            assert_eq!(run(&[&log[..at], &log[at..]]), run(&[log]), "split at {at}");
        }
        assert_eq!(
            run(&[b"\x01", b"\x01", b"\x01a\n\x02", b"\x02", b"\x02b\n"]),
            vec![(Pipe::Stdout, b"a\n".to_vec()), (Pipe::Stderr, b"b\n".to_vec())]
        );
    }

    #[test]
    fn held_bytes_that_were_no_marker_are_output() {
        let mut demuxer = Demuxer::default();
        assert_eq!(demuxer.feed(b"\x02\x02\x02x\x01"), vec![(Pipe::Stderr, b"x".to_vec())]);
        assert_eq!(demuxer.feed(b"y"), vec![(Pipe::Stderr, b"\x01y".to_vec())]);
        assert_eq!(demuxer.feed(b"\x01\x01"), vec![]);
        assert_eq!(demuxer.finish(), vec![(Pipe::Stderr, b"\x01\x01".to_vec())]);
    }

    #[tokio::test]
    async fn a_tls_stream_fails_cleanly_where_nothing_speaks_tls() {
        // wss:// uses rustls with the process's ring provider: a peer that hangs up is an error, never a panic.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                drop(socket);
            }
        });
        let endpoint = super::super::api::Endpoint {
            api_url: format!("https://127.0.0.1:{port}/api"),
            api_key: "k".into(),
            organization_id: None,
        };
        let client = super::super::api::Client::new(endpoint).unwrap();
        let info = super::super::api::SandboxInfo {
            id: "sb".into(),
            state: Some("started".into()),
            error_reason: None,
            toolbox_proxy_url: Some(format!("https://127.0.0.1:{port}/toolbox")),
            daemon_version: None,
        };
        let toolbox = client.toolbox(&info).await.unwrap();
        let (stdout, _keep_out) = tokio::io::duplex(64);
        let (stderr, _keep_err) = tokio::io::duplex(64);
        let mut sinks = Sinks { stdout, stderr };
        let result = stream_once(&toolbox, "s", "c", 0, &mut Demuxer::default(), &mut sinks).await;
        let (seen, message) = result.unwrap_err();
        assert_eq!(seen, 0);
        assert!(message.starts_with("IO error"), "{message}");
    }

    #[test]
    fn unmarked_output_is_stdout() {
        assert_eq!(run(&[b"plain\n"]), vec![(Pipe::Stdout, b"plain\n".to_vec())]);
        assert_eq!(run(&[]), vec![]);
    }
}
