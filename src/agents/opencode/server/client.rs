//! HTTP to one `opencode serve` through its door (`sandbox::Door`: locally a unix socket private to the bridge, see
//! `sandbox::local::init`).
//!
//! One connection per request keeps the client free of pooling state; the socket is local, so a connection costs
//! well under a millisecond. The event stream (`GET /event`) is one long-lived connection of its own.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures::Stream;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::sse::SseEvent;

/// The user name of OpenCode's basic auth.
const USER: &str = "opencode";

/// At most this much of a response body is read (the model list of a big config is the largest, ~1 MiB).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// A failure to talk to the server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The door could not be reached or the connection broke.
    #[error("cannot reach the OpenCode server: {0}")]
    Connect(String),
    /// The server answered with an error status.
    #[error("the OpenCode server answered {status} to {what}: {body}")]
    Status {
        /// What was asked.
        what: String,
        /// The HTTP status.
        status: StatusCode,
        /// The start of its answer.
        body: String,
    },
    /// No answer in time (a stopped or stuck server).
    #[error("the OpenCode server did not answer {what} within {} ms", .limit.as_millis())]
    Timeout {
        /// What was asked.
        what: String,
        /// How long it had.
        limit: Duration,
    },
    /// The answer was not what the API promises.
    #[error("the OpenCode server's answer to {what} is not valid: {why}")]
    Invalid {
        /// What was asked.
        what: String,
        /// Why.
        why: String,
    },
}

/// Talks to one server.
#[derive(Clone, Debug)]
pub struct Client {
    door: Arc<dyn crate::sandbox::Door>,
    authorization: String,
}

impl Client {
    /// A client of the server behind `door`, with the server's password.
    pub fn new(door: Arc<dyn crate::sandbox::Door>, password: &str) -> Self {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{password}"));
        Client { door, authorization: format!("Basic {token}") }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let stream = self.door.connect().await.map_err(|e| ClientError::Connect(e.to_string()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let bytes = match body {
            Some(body) => Bytes::from(serde_json::to_vec(body).unwrap_or_default()),
            None => Bytes::new(),
        };
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "opencode")
            .header(hyper::header::AUTHORIZATION, &self.authorization);
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(bytes)).map_err(|e| ClientError::Connect(e.to_string()))?;
        sender.send_request(request).await.map_err(|e| ClientError::Connect(e.to_string()))
    }

    /// One request; the answer's JSON (`Value::Null` for an empty body). A status other than 2xx is an error.
    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, ClientError> {
        let what = format!("{method} {}", path.split('?').next().unwrap_or(path));
        let response = self.send(method, path, body).await?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| ClientError::Connect(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return Err(ClientError::Status { what, status, body: text.chars().take(500).collect() });
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Invalid { what, why: e.to_string() })
    }

    /// [`Client::call`] with a deadline: a server that is stopped (`SIGSTOP`) or stuck accepts the connection and
    /// never answers, so nothing that must end waits on it unbounded.
    pub async fn call_within(
        &self,
        limit: Duration,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        let what = format!("{method} {}", path.split('?').next().unwrap_or(path));
        tokio::time::timeout(limit, self.call(method, path, body))
            .await
            .unwrap_or(Err(ClientError::Timeout { what, limit }))
    }

    /// Whether the server is up and answers with its version within `limit`.
    pub async fn health(&self, limit: Duration) -> Option<String> {
        let answer = tokio::time::timeout(limit, self.call(Method::GET, "/global/health", None));
        match answer.await {
            Ok(Ok(value)) if value["healthy"] == true => Some(value["version"].as_str().unwrap_or("").to_string()),
            _ => None,
        }
    }

    /// Subscribes to the server's events: each item is one event's JSON text (or the size of one too big to keep,
    /// see [`super::sse`]), in order. The stream ends when the connection does.
    pub async fn events(&self) -> Result<impl Stream<Item = SseEvent> + Send + Unpin + use<>, ClientError> {
        let response = self.send(Method::GET, "/event", None).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(ClientError::Status { what: "GET /event".into(), status, body: String::new() });
        }
        let body = http_body_util::BodyStream::new(response.into_body());
        let chunks = futures::StreamExt::filter_map(body, |frame| {
            std::future::ready(match frame {
                Ok(frame) => frame.into_data().ok().map(Ok),
                Err(e) => Some(Err(e)),
            })
        });
        Ok(super::sse::events(Box::pin(chunks), super::sse::MAX_EVENT))
    }
}
