//! The stdio framing of the ACP connection: stdin is cut into bounded lines here, and only well-formed
//! JSON-RPC reaches the SDK; everything else is answered here, with the request's id whenever it can be read.
//!
//! The SDK's own stdio transport ends the connection on the first line that is not UTF-8, answers a request
//! with scalar `params` with `id: null` (so the editor waits forever), and echoes a whole unparsable line in
//! its error. The SDK is therefore fed through a [`Channel`] of parsed frames instead: each line is parsed once,
//! by the SDK's own [`TransportFrame::parse_json`], so what is forwarded is exactly what its transport would
//! have accepted. Both directions run on plain threads, so a blocked stdin or stdout never holds up the tokio
//! runtime's shutdown, and one writer thread owns stdout, so the SDK's lines and ours never interleave.

use std::io::{BufRead, Read, Write};
use std::sync::mpsc;

use agent_client_protocol::schema::MaybeUndefined;
use agent_client_protocol::v1::schema::AGENT_METHOD_NAMES;
use agent_client_protocol::{
    Channel, ErrorCode, RawJsonRpcError, RawJsonRpcId, RawJsonRpcMessage, RawJsonRpcNotification, RawJsonRpcParams,
    RawJsonRpcResponse, TransportFrame, UntypedMessage,
};
use futures::StreamExt;
use serde_json::{Value, json};

/// Longest line accepted on stdin. Far above any real request (an image prompt is a few MiB), low enough
/// that a runaway writer cannot make the bridge buffer without bound.
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// How much of an offending line an error may quote.
const EXCERPT_CHARS: usize = 200;

/// How much of an over-long line is kept to find its id and quote it; the id comes early in every client.
const KEPT_PREFIX_BYTES: usize = 64 * 1024;

/// Longest message of an error about the client's input: those messages may quote a value it sent.
const MESSAGE_CHARS: usize = 1024;

/// Every ACP method a client may call on an agent. Their params are always an object, so an array is the
/// wrong type; other methods (extensions) may take one.
const ACP_METHODS: [&str; 13] = [
    AGENT_METHOD_NAMES.initialize,
    AGENT_METHOD_NAMES.authenticate,
    AGENT_METHOD_NAMES.logout,
    AGENT_METHOD_NAMES.session_new,
    AGENT_METHOD_NAMES.session_load,
    AGENT_METHOD_NAMES.session_resume,
    AGENT_METHOD_NAMES.session_list,
    AGENT_METHOD_NAMES.session_prompt,
    AGENT_METHOD_NAMES.session_cancel,
    AGENT_METHOD_NAMES.session_set_config_option,
    AGENT_METHOD_NAMES.session_set_mode,
    AGENT_METHOD_NAMES.session_close,
    AGENT_METHOD_NAMES.session_delete,
];

/// One line of input as the framing read it, without its line ending.
#[derive(Debug, PartialEq)]
enum Frame {
    Line(Vec<u8>),
    /// A line over the limit, discarded as it was read: only its start is kept.
    TooLong {
        prefix: Vec<u8>,
    },
}

/// Cuts a byte stream into lines of at most `limit` bytes (line ending not counted); a longer line is skipped to
/// its newline.
struct LineReader<R> {
    lines: crate::lines::BlockingLines<R>,
}

impl<R: BufRead> LineReader<R> {
    fn new(reader: R, limit: usize) -> Self {
        // The bounded reader counts the newline in the limit.
        Self { lines: crate::lines::BlockingLines::new(reader, limit + 1) }
    }

    /// The next line, or `None` at the end of input. A last line without a newline still counts.
    fn next_frame(&mut self) -> std::io::Result<Option<Frame>> {
        let Some(crate::lines::Line { mut bytes, cut }) = self.lines.next_line()? else {
            return Ok(None);
        };
        if cut {
            bytes.truncate(KEPT_PREFIX_BYTES);
            return Ok(Some(Frame::TooLong { prefix: bytes }));
        }
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        Ok(Some(Frame::Line(bytes)))
    }
}

/// Stdin as the framing reads it. A terminal in canonical mode hands over a typed line when it is ended by Enter
/// (with its newline) or by Ctrl-D (without): the kernel reports the end of input only for a Ctrl-D at the start
/// of a line, so after typing `abc` one Ctrl-D would hand over `abc` and the bridge would wait for more. Here a
/// chunk without a newline from such a terminal is the last one: it is framed as the last line, then input ends.
struct TypedEof<R> {
    input: R,
    canonical_tty: bool,
    ended: bool,
}

impl<R: Read> Read for TypedEof<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.ended {
            return Ok(0);
        }
        let read = self.input.read(buf)?;
        // A canonical terminal never returns more than one line per read, so a short chunk is a Ctrl-D.
        if self.canonical_tty && read > 0 && buf[read - 1] != b'\n' {
            self.ended = true;
        }
        Ok(read)
    }
}

/// Whether `input` is a terminal in canonical (line-editing) mode, where Ctrl-D ends a line without a newline.
fn canonical_tty(input: &impl std::os::fd::AsFd) -> bool {
    nix::sys::termios::tcgetattr(input)
        .is_ok_and(|termios| termios.local_flags.contains(nix::sys::termios::LocalFlags::ICANON))
}

/// What becomes of one line.
#[derive(Debug)]
enum Routed {
    /// Well-formed: the SDK takes it.
    Forward(TransportFrame),
    /// Answered here, with this response.
    Reply(RawJsonRpcMessage),
}

/// Decides what becomes of one line; `None` drops it (blank lines, malformed responses and notifications).
fn route(frame: Frame) -> Option<Routed> {
    let bytes = match frame {
        Frame::Line(bytes) => bytes,
        Frame::TooLong { prefix } => {
            let text = String::from_utf8_lossy(&prefix);
            tracing::warn!("rejected an input line over the {MAX_LINE_BYTES}-byte limit");
            let reason = format!("the line is longer than {MAX_LINE_BYTES} bytes, the most a line may have");
            return Some(reply(recover_id(&text), agent_client_protocol::Error::invalid_request(), &reason, &text));
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(e.as_bytes());
            tracing::debug!(bytes = e.as_bytes().len(), at, "rejected an input line that is not UTF-8");
            let reason = format!("the line is not UTF-8 (at byte {at})");
            return Some(reply(recover_id(&text), agent_client_protocol::Error::parse_error(), &reason, &text));
        }
    };
    match TransportFrame::parse_json(&text) {
        TransportFrame::Single(RawJsonRpcMessage::Request(request))
            if matches!(request.params, Some(RawJsonRpcParams::Array(_))) && is_acp_method(&request.method) =>
        {
            let reason = format!("the params of {} must be an object, not an array", request.method);
            Some(reply(request.id, agent_client_protocol::Error::invalid_params(), &reason, ""))
        }
        TransportFrame::Malformed { error, .. } => malformed(&text, error),
        frame => Some(Routed::Forward(frame)),
    }
}

fn is_acp_method(method: &str) -> bool {
    ACP_METHODS.contains(&method)
}

/// Answers a line the SDK rejected, with what the SDK would have said but the request's id and a short quote.
fn malformed(text: &str, sdk_error: agent_client_protocol::Error) -> Option<Routed> {
    let value = match serde_json::from_str::<Value>(text) {
        Ok(value) => value,
        Err(e) => {
            tracing::debug!(bytes = text.len(), "rejected an input line that is not JSON: {e}");
            return Some(reply(recover_id(text), agent_client_protocol::Error::parse_error(), &e.to_string(), text));
        }
    };
    let Some(object) = value.as_object() else {
        // A batch or a bare value: the SDK's error says which.
        let reason =
            sdk_error.data.as_ref().and_then(Value::as_str).unwrap_or("not a JSON-RPC 2.0 message").to_string();
        return Some(reply(RawJsonRpcId::Null, sdk_error, &reason, text));
    };
    let method = object.get("method").and_then(Value::as_str);
    if method.is_none() && (object.contains_key("result") || object.contains_key("error")) {
        // A broken answer to a request of ours: answering an answer would start a ping-pong.
        tracing::debug!("dropped a malformed response from the client");
        return None;
    }
    if method.is_some() && !object.contains_key("id") {
        // JSON-RPC never answers a notification, and an answer without an id could not be matched anyway.
        tracing::warn!("dropped a malformed notification");
        return None;
    }
    let id = object.get("id").and_then(|id| serde_json::from_value(id.clone()).ok()).unwrap_or(RawJsonRpcId::Null);
    if let (Some(method), Some(params @ (Value::Bool(_) | Value::Number(_) | Value::String(_)))) =
        (method, object.get("params"))
    {
        let kind = match params {
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            _ => "a string",
        };
        let reason = if is_acp_method(method) {
            format!("the params of {method} must be an object, not {kind}")
        } else {
            format!("params must be an object or an array, not {kind}")
        };
        return Some(reply(id, agent_client_protocol::Error::invalid_params(), &reason, ""));
    }
    Some(reply(id, sdk_error, "not a valid JSON-RPC 2.0 request", text))
}

/// An error response; `quote` is the offending input (empty when the reason says it all).
fn reply(id: RawJsonRpcId, error: agent_client_protocol::Error, reason: &str, quote: &str) -> Routed {
    let mut data = json!({ "reason": cap(reason, EXCERPT_CHARS) });
    if !quote.is_empty() {
        data["excerpt"] = Value::String(cap(quote, EXCERPT_CHARS));
    }
    Routed::Reply(RawJsonRpcMessage::response(id, Err(error.data(data))))
}

/// `text` cut to `max` characters, marked when cut.
fn cap(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// The id of a request whose line cannot be parsed whole: the value of its top-level `"id"` member, when that
/// member is complete (a number cut by the end of the text is not trusted). Scans without recursion, so no
/// nesting depth can overflow the stack.
fn recover_id(text: &str) -> RawJsonRpcId {
    let bytes = text.as_bytes();
    let skip_space = |mut i: usize| {
        while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let mut i = skip_space(0);
    if bytes.get(i) != Some(&b'{') {
        return RawJsonRpcId::Null;
    }
    i += 1;
    let mut depth = 1usize;
    let mut id = RawJsonRpcId::Null;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let Some(end) = string_end(bytes, i) else { break };
                let colon = skip_space(end);
                if depth == 1 && bytes.get(colon) == Some(&b':') {
                    match &text[i + 1..end - 1] {
                        "id" => id = complete_id(&text[colon + 1..]).unwrap_or(RawJsonRpcId::Null),
                        // A response: nothing of ours to answer.
                        "result" | "error" => return RawJsonRpcId::Null,
                        _ => {}
                    }
                }
                i = end;
            }
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    id
}

/// The index just past the string starting at `start` (a quote), if it is closed.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// A number or string id at the start of `text`, when something follows it (so it was not cut short).
fn complete_id(text: &str) -> Option<RawJsonRpcId> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<RawJsonRpcId>();
    let id = values.next()?.ok()?;
    match id {
        RawJsonRpcId::Str(_) => Some(id),
        RawJsonRpcId::Number(_) if values.byte_offset() < text.len() => Some(id),
        _ => None,
    }
}

/// Shortens an error the SDK or a handler built from the client's input (bad JSON-RPC, unknown method or
/// session, bad params): they quote the offending params, method or id whole, which can be megabytes. Other
/// errors (a failed turn's stderr) are the bridge's own words and pass unchanged.
fn shorten_error(error: &mut RawJsonRpcError) {
    const ABOUT_INPUT: [i32; 5] = [
        ErrorCode::PARSE_ERROR.value(),
        ErrorCode::INVALID_REQUEST.value(),
        ErrorCode::METHOD_NOT_FOUND.value(),
        ErrorCode::INVALID_PARAMS.value(),
        ErrorCode::RESOURCE_NOT_FOUND.value(),
    ];
    if !ABOUT_INPUT.contains(&error.code) {
        return;
    }
    if error.message.len() > MESSAGE_CHARS {
        error.message = cap(&error.message, MESSAGE_CHARS);
    }
    match &mut error.data {
        MaybeUndefined::Value(Value::Object(members)) => members.values_mut().for_each(shorten_value),
        MaybeUndefined::Value(data) => shorten_value(data),
        _ => {}
    }
}

/// Cuts a string to an excerpt, or replaces a large structured value by an excerpt of its JSON.
fn shorten_value(value: &mut Value) {
    match value {
        Value::String(text) if text.len() > EXCERPT_CHARS => *text = cap(text, EXCERPT_CHARS),
        Value::Array(_) | Value::Object(_) => {
            let json = value.to_string();
            if json.len() > EXCERPT_CHARS {
                *value = Value::String(cap(&json, EXCERPT_CHARS));
            }
        }
        _ => {}
    }
}

/// The one member of the params of [`prepared_updates`]: its value is the lines to write, each ended by a newline
/// but the last.
const PREPARED_LINE: &str = "acpSandboxPreparedLine";

/// The `session/update` notifications of updates already serialized (each the JSON of a `SessionUpdate`), to send
/// through the SDK as one message: they keep their place among everything else the connection sends (a turn's
/// updates stay before its answer), but neither the SDK nor the transport serializes an update again, and a run of
/// them costs the SDK one message. It carries their whole lines, which [`outgoing_line`] writes as they are: for a
/// stream of updates that saves most of the bridge's work.
pub(super) fn prepared_updates(session_id: &str, updates: &[String]) -> UntypedMessage {
    let method = agent_client_protocol::v1::schema::CLIENT_METHOD_NAMES.session_update;
    let session = serde_json::to_string(session_id).unwrap_or_else(|_| "\"\"".into());
    let size = updates.iter().map(|update| update.len() + session.len() + 81).sum();
    let mut lines = String::with_capacity(size);
    for update in updates {
        if !lines.is_empty() {
            lines.push('\n');
        }
        // The members in the order the SDK writes a `SessionNotification`, so the line is the one it would write.
        lines.push_str(r#"{"jsonrpc":"2.0","method":""#);
        lines.push_str(method);
        lines.push_str(r#"","params":{"sessionId":"#);
        lines.push_str(&session);
        lines.push_str(r#","update":"#);
        lines.push_str(update);
        lines.push_str("}}");
    }
    let mut members = serde_json::Map::new();
    members.insert(PREPARED_LINE.to_string(), Value::String(lines));
    UntypedMessage { method: method.to_string(), params: Value::Object(members) }
}

/// One outgoing line, with errors about the client's input shortened. `None` for what is not ours to send.
fn outgoing_line(frame: TransportFrame) -> Option<String> {
    let mut message = match frame {
        TransportFrame::Single(message) => message,
        _ => {
            // Only relays emit malformed frames; an agent has nothing to relay.
            tracing::warn!("dropped a malformed outgoing frame");
            return None;
        }
    };
    if let RawJsonRpcMessage::Notification(RawJsonRpcNotification {
        params: Some(RawJsonRpcParams::Object(params)),
        ..
    }) = &mut message
        && params.len() == 1
        && let Some(Value::String(line)) = params.get_mut(PREPARED_LINE)
    {
        return Some(std::mem::take(line));
    }
    if let RawJsonRpcMessage::Response(RawJsonRpcResponse::Error { error, .. }) = &mut message {
        shorten_error(error);
    }
    match serde_json::to_string(&message) {
        Ok(line) => Some(line),
        Err(e) => {
            tracing::error!("could not serialize an outgoing message: {e}");
            // The peer still waits for an answer; an internal error is one.
            let id = message.response_id()?.clone();
            serde_json::to_string(&RawJsonRpcMessage::response(id, Err(agent_client_protocol::Error::internal_error())))
                .ok()
        }
    }
}

/// At most this many lines are handed to the stdout thread at once.
const OUT_BATCH: usize = 1024;

/// What the writer thread is asked to do.
enum Out {
    Line(String),
    /// Lines in order, from one drain of the SDK's queue.
    Lines(Vec<String>),
    /// Answered once every line queued before it is written and flushed.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The running stdio transport; [`StdioTransport::finish`] flushes it after the connection ended.
pub(super) struct StdioTransport {
    out: mpsc::Sender<Out>,
    forwarder: tokio::task::JoinHandle<()>,
}

impl StdioTransport {
    /// Starts reading stdin and writing stdout; the returned channel is the SDK's end of the connection.
    /// Must be called inside the tokio runtime.
    pub(super) fn start() -> std::io::Result<(Channel, StdioTransport)> {
        // Unlocked handles: a lock cannot move to the threads. Stdin skips its own buffer for reads this big.
        let stdin = TypedEof { canonical_tty: canonical_tty(&std::io::stdin()), input: std::io::stdin(), ended: false };
        Self::start_with(std::io::BufReader::with_capacity(1 << 16, stdin), std::io::stdout(), MAX_LINE_BYTES)
    }

    fn start_with(
        input: impl BufRead + Send + 'static,
        output: impl Write + Send + 'static,
        limit: usize,
    ) -> std::io::Result<(Channel, StdioTransport)> {
        let (ours, sdk) = Channel::duplex();
        let Channel { rx: mut from_sdk, tx: to_sdk, .. } = ours;
        let (out, lines) = mpsc::channel();
        std::thread::Builder::new().name("acp-stdout".into()).spawn(move || write_lines(lines, output))?;
        let replies = out.clone();
        std::thread::Builder::new()
            .name("acp-stdin".into())
            .spawn(move || read_lines(LineReader::new(input, limit), to_sdk, replies))?;
        let sdk_lines = out.clone();
        let forwarder = tokio::spawn(async move {
            while let Some(frame) = from_sdk.next().await {
                // What else the SDK has queued goes along in one batch: one wakeup of the stdout thread for a
                // stream's burst of updates, not one per update (nothing waits for more than is there).
                let mut lines: Vec<String> = outgoing_line(frame).into_iter().collect();
                while lines.len() < OUT_BATCH
                    && let Some(Some(frame)) = futures::FutureExt::now_or_never(from_sdk.next())
                {
                    lines.extend(outgoing_line(frame));
                }
                if !lines.is_empty() && sdk_lines.send(Out::Lines(lines)).is_err() {
                    // stdout is gone: dropping `from_sdk` ends the connection.
                    break;
                }
            }
        });
        Ok((sdk, StdioTransport { out, forwarder }))
    }

    /// Waits until everything the connection sent is on stdout. Call after the connection ended.
    pub(super) async fn finish(self) {
        let _ = self.forwarder.await;
        let (done, flushed) = tokio::sync::oneshot::channel();
        if self.out.send(Out::Flush(done)).is_ok() {
            let _ = flushed.await;
        }
    }
}

/// The stdin thread: well-formed lines go to the SDK, answers to the rest to stdout. Ends at end of input,
/// which closes the SDK's incoming side and so ends the connection.
fn read_lines(
    mut lines: LineReader<impl BufRead>,
    to_sdk: futures::channel::mpsc::UnboundedSender<TransportFrame>,
    replies: mpsc::Sender<Out>,
) {
    loop {
        let frame = match lines.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("reading stdin failed, taking it as the end of input: {e}");
                return;
            }
        };
        let delivered = match route(frame) {
            Some(Routed::Forward(frame)) => to_sdk.unbounded_send(frame).is_ok(),
            Some(Routed::Reply(message)) => match serde_json::to_string(&message) {
                Ok(line) => replies.send(Out::Line(line)).is_ok(),
                Err(e) => {
                    tracing::error!("could not serialize an error answer: {e}");
                    true
                }
            },
            None => true,
        };
        if !delivered {
            return;
        }
    }
}

/// The stdout thread: the only writer of stdout, one whole line at a time, flushed whenever the queue is empty.
fn write_lines(queue: mpsc::Receiver<Out>, output: impl Write) {
    // A pipe's worth: a burst of updates is written in few calls, and still flushed as soon as the queue is empty.
    let mut output = std::io::BufWriter::with_capacity(1 << 16, output);
    while let Ok(first) = queue.recv() {
        let mut next = Some(first);
        while let Some(out) = next {
            let written = match out {
                Out::Line(line) => output.write_all(line.as_bytes()).and_then(|()| output.write_all(b"\n")),
                Out::Lines(lines) => lines
                    .iter()
                    .try_for_each(|line| output.write_all(line.as_bytes()).and_then(|()| output.write_all(b"\n"))),
                Out::Flush(done) => {
                    let flushed = output.flush();
                    let _ = done.send(());
                    flushed
                }
            };
            if let Err(e) = written {
                tracing::warn!("writing stdout failed, the editor is gone: {e}");
                return;
            }
            next = queue.try_recv().ok();
        }
        if let Err(e) = output.flush() {
            tracing::warn!("writing stdout failed, the editor is gone: {e}");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(input: &[u8], limit: usize) -> Vec<Frame> {
        let mut reader = LineReader::new(input, limit);
        std::iter::from_fn(|| reader.next_frame().unwrap()).collect()
    }

    #[test]
    fn lines_over_the_limit_are_skipped_to_their_newline() {
        let input = b"short\r\n0123456789abc\nnext\nlast";
        assert_eq!(
            frames(input, 10),
            [
                Frame::Line(b"short".to_vec()),
                Frame::TooLong { prefix: b"0123456789a".to_vec() },
                Frame::Line(b"next".to_vec()),
                Frame::Line(b"last".to_vec()),
            ]
        );
        assert_eq!(frames(b"0123456789\n", 10), [Frame::Line(b"0123456789".to_vec())], "exactly the limit");
        assert_eq!(frames(b"0123456789abc", 10), [Frame::TooLong { prefix: b"0123456789a".to_vec() }]);
    }

    /// Hands over one chunk per read, as a terminal hands over one typed line.
    struct Chunks(std::collections::VecDeque<&'static [u8]>);

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let chunk = self.0.pop_front().unwrap_or_default();
            buf[..chunk.len()].copy_from_slice(chunk);
            Ok(chunk.len())
        }
    }

    #[test]
    fn a_terminal_chunk_without_a_newline_is_the_last_line() {
        // `ping⏎`, `pong` + Ctrl-D, then `later⏎`.
        let typed = |canonical_tty: bool| {
            let input = Chunks([&b"ping\n"[..], b"pong", b"later\n"].into());
            let reader = TypedEof { input, canonical_tty, ended: false };
            let mut lines = LineReader::new(std::io::BufReader::new(reader), 100);
            std::iter::from_fn(|| lines.next_frame().unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(typed(true), [Frame::Line(b"ping".to_vec()), Frame::Line(b"pong".to_vec())]);
        assert_eq!(
            typed(false),
            [Frame::Line(b"ping".to_vec()), Frame::Line(b"ponglater".to_vec())],
            "the chunks of a pipe are not lines"
        );
    }

    fn reply_of(line: &[u8]) -> Value {
        match route(Frame::Line(line.to_vec())) {
            Some(Routed::Reply(message)) => serde_json::to_value(&message).unwrap(),
            other => panic!("{:?} was not answered here: {other:?}", String::from_utf8_lossy(line)),
        }
    }

    fn forwarded(line: &str) -> bool {
        matches!(route(Frame::Line(line.as_bytes().to_vec())), Some(Routed::Forward(_)))
    }

    #[test]
    fn invalid_utf8_is_a_parse_error_with_the_requests_id() {
        let answer =
            reply_of(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"session/new\",\"params\":{\"cwd\":\"/\xff\"}}");
        assert_eq!(answer["id"], 7, "{answer}");
        assert_eq!(answer["error"]["code"], -32700, "{answer}");
        assert_eq!(reply_of(b"\xff")["id"], Value::Null);
    }

    #[test]
    fn scalar_and_array_params_are_invalid_params_with_the_id() {
        for params in ["\"x\"", "1", "true"] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":"req-1","method":"session/new","params":{params}}}"#);
            let answer = reply_of(line.as_bytes());
            assert_eq!(answer["id"], "req-1", "{answer}");
            assert_eq!(answer["error"]["code"], -32602, "{answer}");
        }
        let answer = reply_of(br#"{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":[1]}"#);
        assert_eq!((answer["id"].clone(), answer["error"]["code"].clone()), (json!(3), json!(-32602)), "{answer}");
        assert!(forwarded(r#"{"jsonrpc":"2.0","id":3,"method":"_x/ext","params":[1]}"#), "extensions may take arrays");
        assert!(forwarded(r#"{"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd":"/"}}"#));
        assert!(forwarded(r#"{"jsonrpc":"2.0","id":3,"method":"session/list"}"#));
    }

    #[test]
    fn blank_lines_and_malformed_responses_and_notifications_are_dropped() {
        assert!(route(Frame::Line(b" \t".to_vec())).is_none());
        assert!(route(Frame::Line(br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{}}"#.to_vec())).is_none());
        assert!(route(Frame::Line(br#"{"jsonrpc":"2.0","method":"session/cancel","params":1}"#.to_vec())).is_none());
    }

    #[test]
    fn errors_quote_at_most_an_excerpt() {
        let mut line = br#"{"jsonrpc":"2.0","id":5,"method":"session/new","params":{"cwd":""#.to_vec();
        line.extend(std::iter::repeat_n(b'x', 100_000));
        let answer = reply_of(&line);
        assert_eq!(answer["id"], 5, "a cut request still names its id");
        assert!(answer.to_string().len() < 1024, "{answer}");
        let too_long = route(Frame::TooLong { prefix: line });
        let Some(Routed::Reply(message)) = too_long else { panic!("{too_long:?}") };
        let answer = serde_json::to_value(&message).unwrap();
        assert_eq!((answer["id"].clone(), answer["error"]["code"].clone()), (json!(5), json!(-32600)), "{answer}");
        assert!(answer.to_string().len() < 1024, "{answer}");
    }

    #[test]
    fn the_id_is_recovered_only_when_complete_and_top_level() {
        let id = |text: &str| serde_json::to_value(recover_id(text)).unwrap();
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":12,"method":"x","params":{"#), 12);
        assert_eq!(id(r#" { "id" : "a\"b" , "#), "a\"b");
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":12"#), Value::Null, "the number may go on");
        assert_eq!(id(r#"{"params":{"id":3},"method":"x""#), Value::Null, "not top level");
        assert_eq!(id(r#"{"id":3,"result":{"#), Value::Null, "a response");
        assert_eq!(id(r#"{"id":1.5,"#), Value::Null);
        assert_eq!(id(&format!(r#"{{"params":{}"id":1}}"#, "[".repeat(100_000))), Value::Null);
        assert_eq!(id(&format!(r#"{{"id":9,"params":{}"#, "[".repeat(100_000))), 9);
    }

    #[test]
    fn deep_nesting_is_a_parse_error_not_a_stack_overflow() {
        let line = format!(r#"{{"jsonrpc":"2.0","id":4,"method":"session/new","params":{}}}"#, "[".repeat(100_000));
        let answer = reply_of(line.as_bytes());
        assert_eq!((answer["id"].clone(), answer["error"]["code"].clone()), (json!(4), json!(-32700)), "{answer}");
    }

    #[test]
    fn sdk_errors_about_the_input_are_shortened() {
        let big = "y".repeat(10_000);
        let error = agent_client_protocol::Error::invalid_params()
            .data(json!({"error": format!("invalid type: string {big:?}"), "json": {"cwd": big}, "phase": "x"}));
        let line =
            outgoing_line(TransportFrame::Single(RawJsonRpcMessage::response(RawJsonRpcId::Number(1), Err(error))));
        let line = line.unwrap();
        assert!(line.len() < 1024, "{line}");
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(answer["error"]["data"]["phase"], "x");

        let stderr = agent_client_protocol::Error::internal_error().data(json!({"stderr": big}));
        let line =
            outgoing_line(TransportFrame::Single(RawJsonRpcMessage::response(RawJsonRpcId::Number(2), Err(stderr))));
        assert!(line.unwrap().len() > 10_000, "a failed turn keeps its stderr");
    }

    /// What the SDK writes for a typed `SessionNotification`.
    fn sdk_line(session_id: &str, update: &agent_client_protocol::v1::schema::SessionUpdate) -> String {
        use agent_client_protocol::JsonRpcMessage;
        let notification =
            agent_client_protocol::v1::schema::SessionNotification::new(session_id.to_string(), update.clone());
        let UntypedMessage { method, params } = notification.to_untyped_message().unwrap();
        outgoing_line(TransportFrame::Single(RawJsonRpcMessage::notification(method, params).unwrap())).unwrap()
    }

    /// What the SDK hands the transport for an untyped notification.
    fn through_the_sdk(message: UntypedMessage) -> Option<String> {
        outgoing_line(TransportFrame::Single(RawJsonRpcMessage::notification(message.method, message.params).unwrap()))
    }

    #[test]
    fn a_prepared_update_is_written_as_the_sdk_writes_the_typed_notification() {
        use agent_client_protocol::v1::schema::{ContentBlock, ContentChunk, SessionUpdate};
        for (session, text) in [("ses_1", "plain"), ("ses \"2\"\n\u{1}", "a \"quoted\"\nline\u{0} é \u{2028}")] {
            let update = SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from(text.to_string())));
            let json = serde_json::to_string(&update).unwrap();
            let line = through_the_sdk(prepared_updates(session, std::slice::from_ref(&json))).unwrap();
            assert_eq!(line, sdk_line(session, &update));
            assert!(!line.contains('\n'), "one line: {line}");
        }
    }

    #[test]
    fn a_run_of_prepared_updates_is_written_as_their_lines_one_after_the_other() {
        use agent_client_protocol::v1::schema::{ContentBlock, ContentChunk, SessionUpdate};
        let updates: Vec<SessionUpdate> = ["one", "two\nlines", "three"]
            .into_iter()
            .map(|text| SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from(text.to_string()))))
            .collect();
        let json: Vec<String> = updates.iter().map(|update| serde_json::to_string(update).unwrap()).collect();
        let written = through_the_sdk(prepared_updates("ses_1", &json)).unwrap();
        let expected: Vec<String> = updates.iter().map(|update| sdk_line("ses_1", update)).collect();
        assert_eq!(written, expected.join("\n"));
    }

    #[test]
    fn only_the_prepared_member_alone_is_taken_as_a_line() {
        let mut members = serde_json::Map::new();
        members.insert(PREPARED_LINE.to_string(), json!("x"));
        members.insert("sessionId".to_string(), json!("s"));
        let message = UntypedMessage { method: "session/update".into(), params: Value::Object(members.clone()) };
        let line = through_the_sdk(message).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&line).unwrap()["params"], Value::Object(members));
    }

    /// Stdout as a test reads it.
    #[derive(Clone, Default)]
    struct Written(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Written {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// However the forwarder batches what the SDK queued, stdout gets every line once, whole, in the SDK's order:
    /// prepared updates and the SDK's own messages (the prompt's answer after the turn's updates) alike.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batched_lines_keep_the_sdks_order() {
        let written = Written::default();
        let (sdk, transport) = StdioTransport::start_with(std::io::empty(), written.clone(), 1024).unwrap();
        let mut expected = Vec::new();
        for n in 0..5000 {
            let update =
                format!(r#"{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{n}"}}}}"#);
            let UntypedMessage { method, params } = prepared_updates("ses_1", std::slice::from_ref(&update));
            expected.push(format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"ses_1","update":{update}}}}}"#
            ));
            sdk.tx
                .unbounded_send(TransportFrame::Single(RawJsonRpcMessage::notification(method, params).unwrap()))
                .unwrap();
            if n % 1000 == 999 {
                let answer =
                    RawJsonRpcMessage::response(RawJsonRpcId::Number(n), Ok(json!({"stopReason": "end_turn"})));
                expected.push(outgoing_line(TransportFrame::Single(answer.clone())).unwrap());
                sdk.tx.unbounded_send(TransportFrame::Single(answer)).unwrap();
            }
            if n % 7 == 0 {
                tokio::task::yield_now().await;
            }
        }
        drop(sdk);
        transport.finish().await;
        let output = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = output.lines().collect();
        assert_eq!(lines.len(), expected.len());
        for (at, (line, expected)) in lines.iter().zip(&expected).enumerate() {
            assert_eq!(line, expected, "line {at}");
        }
    }
}
