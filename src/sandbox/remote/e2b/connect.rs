//! The Connect protocol's envelope framing for envd's streaming calls, with the JSON codec: pure, no I/O.
//!
//! A streamed message is `[flags u8][length u32 big-endian][JSON]`; flag 0x02 marks the end-of-stream message
//! (`{}` or `{"error": {...}}`), which is where a streaming call's error arrives (with HTTP 200). Flag 0x01 would
//! mean a compressed message, which we never ask for, so one is an error.

use serde::Deserialize;

/// Flag of the message that ends a stream.
const END_STREAM: u8 = 0x02;
/// Flag of a compressed message.
const COMPRESSED: u8 = 0x01;
/// Header bytes of an envelope.
const HEADER: usize = 5;
/// Bigger messages are refused: envd sends output in chunks of at most 32 KiB (base64 makes them 4/3 larger).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// One envelope around a JSON message.
pub fn encode(message: &serde_json::Value) -> Vec<u8> {
    let json = message.to_string().into_bytes();
    let mut out = Vec::with_capacity(HEADER + json.len());
    out.push(0);
    // A request body is ours and small (a command line); `u32::MAX` would need a 4 GiB argv.
    out.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&json);
    out
}

/// What a stream carried.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// A message of the stream.
    Message(serde_json::Value),
    /// The end of the stream; `Some` when the call failed.
    End(Option<ConnectError>),
}

/// A Connect error: its code (`not_found`, `deadline_exceeded`, …) and message.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct ConnectError {
    /// The Connect code.
    #[serde(default)]
    pub code: String,
    /// The server's words.
    #[serde(default)]
    pub message: String,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code.is_empty(), self.message.is_empty()) {
            (false, false) => write!(f, "{}: {}", self.code, self.message),
            (false, true) => f.write_str(&self.code),
            (true, _) => f.write_str(&self.message),
        }
    }
}

/// A stream that breaks the framing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// A compressed message although we asked for none.
    #[error("envd sent a compressed message, which was not asked for")]
    Compressed,
    /// A message longer than [`MAX_MESSAGE`].
    #[error("envd sent a message of {0} bytes, more than the {MAX_MESSAGE} accepted")]
    TooLong(usize),
    /// A message that is not JSON.
    #[error("envd sent a message that is not JSON: {0}")]
    NotJson(String),
    /// The stream ended inside a message.
    #[error("envd's stream ended inside a message ({0} bytes left over)")]
    Truncated(usize),
}

/// Splits a byte stream into frames, however the bytes were chunked.
#[derive(Debug, Default)]
pub struct Decoder {
    buffer: Vec<u8>,
}

#[derive(Deserialize)]
struct EndMessage {
    #[serde(default)]
    error: Option<ConnectError>,
}

impl Decoder {
    /// Adds bytes as they arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete frame, if the bytes so far hold one.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buffer.len() < HEADER {
            return Ok(None);
        }
        let flags = self.buffer[0];
        let len = u32::from_be_bytes([self.buffer[1], self.buffer[2], self.buffer[3], self.buffer[4]]) as usize;
        if flags & COMPRESSED != 0 {
            return Err(FrameError::Compressed);
        }
        if len > MAX_MESSAGE {
            return Err(FrameError::TooLong(len));
        }
        if self.buffer.len() < HEADER + len {
            return Ok(None);
        }
        let body: Vec<u8> = self.buffer.drain(..HEADER + len).skip(HEADER).collect();
        if flags & END_STREAM != 0 {
            let end: EndMessage = serde_json::from_slice(&body).map_err(|e| FrameError::NotJson(e.to_string()))?;
            return Ok(Some(Frame::End(end.error)));
        }
        let message = serde_json::from_slice(&body).map_err(|e| FrameError::NotJson(e.to_string()))?;
        Ok(Some(Frame::Message(message)))
    }

    /// Checks that the stream did not end inside a message.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.buffer.len() {
            0 => Ok(()),
            left => Err(FrameError::Truncated(left)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn frame(flags: u8, json: &str) -> Vec<u8> {
        let mut out = vec![flags];
        out.extend_from_slice(&(json.len() as u32).to_be_bytes());
        out.extend_from_slice(json.as_bytes());
        out
    }

    #[test]
    fn encodes_one_envelope_with_a_big_endian_length() {
        let bytes = encode(&json!({"process": {"pid": 42}}));
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 22]);
        assert_eq!(&bytes[5..], br#"{"process":{"pid":42}}"#);
    }

    #[test]
    fn decodes_frames_split_at_every_byte() {
        let mut stream = frame(0, r#"{"event":{"start":{"pid":7}}}"#);
        stream.extend(frame(0, r#"{"event":{"data":{"stdout":"aGkK"}}}"#));
        stream.extend(frame(2, "{}"));
        let mut decoder = Decoder::default();
        let mut frames = Vec::new();
        for byte in &stream {
            decoder.push(std::slice::from_ref(byte));
            while let Some(frame) = decoder.next_frame().unwrap() {
                frames.push(frame);
            }
        }
        assert_eq!(
            frames,
            vec![
                Frame::Message(json!({"event": {"start": {"pid": 7}}})),
                Frame::Message(json!({"event": {"data": {"stdout": "aGkK"}}})),
                Frame::End(None),
            ]
        );
        decoder.finish().unwrap();
    }

    #[test]
    fn an_end_frame_carries_the_calls_error() {
        let mut decoder = Decoder::default();
        decoder.push(&frame(2, r#"{"error":{"code":"deadline_exceeded","message":"too slow"},"metadata":{}}"#));
        assert_eq!(
            decoder.next_frame().unwrap(),
            Some(Frame::End(Some(ConnectError { code: "deadline_exceeded".into(), message: "too slow".into() })))
        );
    }

    #[test]
    fn refuses_compressed_oversized_and_broken_messages() {
        let mut decoder = Decoder::default();
        decoder.push(&frame(1, "{}"));
        assert_eq!(decoder.next_frame(), Err(FrameError::Compressed));

        let mut decoder = Decoder::default();
        decoder.push(&[0, 0x01, 0, 0, 1]);
        assert_eq!(decoder.next_frame(), Err(FrameError::TooLong(0x0100_0001)));

        let mut decoder = Decoder::default();
        decoder.push(&frame(0, "{not json"));
        assert!(matches!(decoder.next_frame(), Err(FrameError::NotJson(_))));

        let mut decoder = Decoder::default();
        decoder.push(&frame(0, r#"{"event":{}}"#)[..8]);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(decoder.finish(), Err(FrameError::Truncated(8)));
    }
}
