//! envd, the daemon inside an E2B sandbox (port 49983): `process.Process` over Connect-RPC with the JSON codec
//! (Start and Connect stream, the rest are unary JSON calls), and the files API.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{StatusCode, Url};
use serde_json::{Value, json};

use super::api::{excerpt, remote, unreachable};
use super::connect;
use crate::sandbox::remote::download::{self, Downloaded};
use crate::sandbox::{ExecSpec, ExitInfo, RemoteFailure, SandboxError};

/// The port envd listens on inside every sandbox.
pub const ENVD_PORT: u16 = 49983;
/// How often envd sends a keepalive on an idle stream: what the SDKs ask for.
const KEEPALIVE_SECS: u32 = 50;
/// Unary calls and file transfers of a few MiB finish well within this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Domains whose sandboxes are reached at `https://sandbox.<domain>` with routing headers, as the SDKs do.
const ROUTED_DOMAINS: &[&str] = &["e2b.app", "e2b.dev", "e2b.pro", "e2b-staging.dev"];

/// Where a sandbox's envd answers: `E2B_SANDBOX_URL` when set, `https://sandbox.<domain>` for E2B's own
/// domains, else `https://49983-<id>.<domain>`.
pub fn envd_url(sandbox_url: Option<&Url>, domain: &str, id: &str) -> Result<Url, SandboxError> {
    if let Some(url) = sandbox_url {
        return Ok(url.clone());
    }
    let text = if ROUTED_DOMAINS.contains(&domain) {
        format!("https://sandbox.{domain}")
    } else {
        format!("https://{ENVD_PORT}-{id}.{domain}")
    };
    Url::parse(&text).map_err(|e| remote(RemoteFailure::Protocol, format!("the sandbox URL {text} is invalid: {e}")))
}

/// One event of a process stream.
#[derive(Debug, PartialEq)]
pub enum Event {
    /// The process started with this pid (also the first event of a re-attached stream).
    Start(u32),
    /// Bytes it wrote to stdout.
    Stdout(Vec<u8>),
    /// Bytes it wrote to stderr.
    Stderr(Vec<u8>),
    /// It ended.
    End(ExitInfo),
    /// Nothing happened (a keepalive, PTY output, or a field a newer envd added).
    Nothing,
}

/// Reads one `{"event": {...}}` message. Proto3 JSON leaves out defaults: a missing `exitCode` is 0.
pub fn parse_event(message: &Value) -> Result<Event, String> {
    let event =
        message.get("event").ok_or_else(|| format!("a message without an event: {}", excerpt(&message.to_string())))?;
    if let Some(start) = event.get("start") {
        let pid = start.get("pid").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok()).unwrap_or(0);
        return Ok(Event::Start(pid));
    }
    if let Some(data) = event.get("data") {
        let decode = |field: &Value| {
            field
                .as_str()
                .ok_or_else(|| "output that is not base64 text".to_string())
                .and_then(|text| B64.decode(text).map_err(|e| format!("output that is not base64: {e}")))
        };
        if let Some(out) = data.get("stdout") {
            return decode(out).map(Event::Stdout);
        }
        if let Some(err) = data.get("stderr") {
            return decode(err).map(Event::Stderr);
        }
        return Ok(Event::Nothing);
    }
    if let Some(end) = event.get("end") {
        return Ok(Event::End(exit_info(end)));
    }
    Ok(Event::Nothing)
}

/// envd reports Go's view of the exit: `exited` with `exitCode`, or `exitCode: -1` and a status such as
/// `signal: killed` when a signal ended it.
fn exit_info(end: &Value) -> ExitInfo {
    let code = end.get("exitCode").and_then(Value::as_i64).unwrap_or(0);
    let exited = end.get("exited").and_then(Value::as_bool).unwrap_or(false);
    let status = end.get("status").and_then(Value::as_str).unwrap_or("");
    if exited {
        return ExitInfo { code: i32::try_from(code).ok(), signal: None };
    }
    let signal = status.strip_prefix("signal: ").and_then(|name| match name {
        "killed" => Some(9),
        "terminated" => Some(15),
        "interrupt" => Some(2),
        "hangup" => Some(1),
        "aborted" => Some(6),
        "segmentation fault" => Some(11),
        other => other.parse().ok(),
    });
    match signal {
        Some(signal) => ExitInfo { code: None, signal: Some(signal) },
        // Neither exited nor signalled by a name we know: keep whatever code envd gave.
        None => ExitInfo { code: i32::try_from(code).ok().filter(|c| *c >= 0), signal: None },
    }
}

/// The `StartRequest` of a command: its argv as it is (no shell), its whole environment, its cwd, and stdin
/// only when there is something to write or the command talks on it.
pub fn start_request(spec: &ExecSpec, tag: Option<&str>) -> Value {
    let envs: serde_json::Map<String, Value> =
        spec.env.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
    let mut process = json!({
        "cmd": spec.program.to_string_lossy(),
        "args": spec.args,
        "envs": envs,
    });
    if !spec.cwd.as_os_str().is_empty() {
        process["cwd"] = Value::String(spec.cwd.to_string_lossy().into_owned());
    }
    let mut request = json!({ "process": process, "stdin": spec.interactive || !spec.stdin.is_empty() });
    if let Some(tag) = tag {
        request["tag"] = Value::String(tag.to_string());
    }
    request
}

/// The envd of one connected sandbox.
pub struct Envd {
    http: reqwest::Client,
    base: Url,
    headers: HeaderMap,
}

impl Envd {
    /// `token` is the sandbox's current `envdAccessToken`.
    pub fn new(http: reqwest::Client, base: Url, id: &str, token: Option<&str>) -> Result<Self, SandboxError> {
        let mut headers = HeaderMap::new();
        let bad = |what: &str| remote(RemoteFailure::Protocol, format!("E2B gave a {what} no HTTP header can carry"));
        headers.insert(
            HeaderName::from_static("e2b-sandbox-id"),
            HeaderValue::from_str(id).map_err(|_| bad("sandbox id"))?,
        );
        headers.insert(HeaderName::from_static("e2b-sandbox-port"), HeaderValue::from(ENVD_PORT));
        if let Some(token) = token {
            let mut value = HeaderValue::from_str(token).map_err(|_| bad("access token"))?;
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-access-token"), value);
        }
        Ok(Envd { http, base, headers })
    }

    fn url(&self, path: &str) -> Url {
        let mut url = self.base.clone();
        url.set_path(&format!("{}/{}", self.base.path().trim_end_matches('/'), path.trim_start_matches('/')));
        url
    }

    /// Opens a server stream (`Start` or `Connect`): the response whose body is the envelopes.
    pub async fn stream(&self, method: &str, request: &Value) -> Result<reqwest::Response, SandboxError> {
        let response = self
            .http
            .post(self.url(&format!("/process.Process/{method}")))
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Keepalive-Ping-Interval", KEEPALIVE_SECS)
            .body(connect::encode(request))
            .send()
            .await
            .map_err(|e| unreachable(&self.base, &e))?;
        if response.status() == StatusCode::OK {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Err(envd_error(status, &text, method))
    }

    /// A unary `process.Process` call.
    pub async fn unary(&self, method: &str, request: &Value) -> Result<Value, SandboxError> {
        let response = self
            .http
            .post(self.url(&format!("/process.Process/{method}")))
            .timeout(REQUEST_TIMEOUT)
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("Connect-Protocol-Version", "1")
            .body(request.to_string())
            .send()
            .await
            .map_err(|e| unreachable(&self.base, &e))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| unreachable(&self.base, &e))?;
        if status != StatusCode::OK {
            return Err(envd_error(status, &text, method));
        }
        serde_json::from_str(&text)
            .map_err(|e| remote(RemoteFailure::Protocol, format!("envd's {method} answered what is not JSON ({e})")))
    }

    /// Signals a process by pid (`SIGNAL_SIGKILL`, `SIGNAL_SIGTERM`).
    pub async fn signal(&self, pid: u32, signal: &str) -> Result<(), SandboxError> {
        self.unary("SendSignal", &json!({ "process": { "pid": pid }, "signal": signal })).await.map(drop)
    }

    /// Writes to a process's stdin, then closes it.
    pub async fn feed_stdin(&self, pid: u32, bytes: &[u8]) -> Result<(), SandboxError> {
        // Each call carries one JSON body: pieces keep a large prompt's bodies small.
        for piece in bytes.chunks(1 << 20) {
            self.send_input(pid, piece).await?;
        }
        self.close_stdin(pid).await
    }

    /// Writes `bytes` to a process's stdin.
    pub async fn send_input(&self, pid: u32, bytes: &[u8]) -> Result<(), SandboxError> {
        let input = json!({ "process": { "pid": pid }, "input": { "stdin": B64.encode(bytes) } });
        self.unary("SendInput", &input).await.map(drop)
    }

    /// Closes a process's stdin.
    pub async fn close_stdin(&self, pid: u32) -> Result<(), SandboxError> {
        self.unary("CloseStdin", &json!({ "process": { "pid": pid } })).await.map(drop)
    }

    /// Writes a file (parents are created, an existing file replaced).
    pub async fn upload(&self, path: &str, bytes: &[u8]) -> Result<(), SandboxError> {
        let mut url = self.url("/files");
        url.query_pairs_mut().append_pair("path", path);
        // Multipart works with every envd; raw bodies only from 0.5.7.
        let boundary = format!("acp-sandbox-{}", uuid::Uuid::new_v4().simple());
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\nContent-Type: \
             application/octet-stream\r\n\r\n",
            path.replace(['"', '\r', '\n'], "_")
        )
        .into_bytes();
        body.extend_from_slice(bytes);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let response = self
            .http
            .post(url)
            .timeout(REQUEST_TIMEOUT)
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"))
            .body(body)
            .send()
            .await
            .map_err(|e| unreachable(&self.base, &e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let text = response.text().await.unwrap_or_default();
        Err(envd_error(status, &text, &format!("upload {path}")))
    }

    /// Reads a file; `None` when it does not exist.
    pub async fn download(&self, path: &str) -> Result<Option<Vec<u8>>, SandboxError> {
        self.download_at_most(path, u64::MAX).await
    }

    /// Downloads at most `limit + 1` bytes of a file (the rest is never read): more than `limit` means larger.
    pub async fn download_at_most(&self, path: &str, limit: u64) -> Result<Option<Vec<u8>>, SandboxError> {
        let Some(mut response) = self.get_file(path).await? else { return Ok(None) };
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| unreachable(&self.base, &e))? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() as u64 > limit {
                break;
            }
        }
        Ok(Some(bytes))
    }

    /// Downloads a file into a new file at `dest` on the host, a chunk at a time, at most `limit` bytes of it
    /// ([`download::save`]).
    pub async fn download_to(&self, path: &str, dest: &Path, limit: u64) -> Result<Downloaded, SandboxError> {
        let Some(response) = self.get_file(path).await? else { return Ok(Downloaded::Missing) };
        download::save(response, dest, limit, |e| unreachable(&self.base, &e)).await
    }

    /// `GET /files`: the successful answer, its body not read yet; `None` when the file does not exist.
    async fn get_file(&self, path: &str) -> Result<Option<reqwest::Response>, SandboxError> {
        let mut url = self.url("/files");
        url.query_pairs_mut().append_pair("path", path);
        let response = self
            .http
            .get(url)
            .timeout(REQUEST_TIMEOUT)
            .headers(self.headers.clone())
            .send()
            .await
            .map_err(|e| unreachable(&self.base, &e))?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(envd_error(status, &text, &format!("download {path}")));
        }
        Ok(Some(response))
    }
}

/// An envd (or E2B proxy) error answer: `{"code": "not_found", "message"}` from envd, `{"code": 502, ...}`
/// from the proxy when the sandbox is gone.
pub fn envd_error(status: StatusCode, body: &str, what: &str) -> SandboxError {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let said = parsed
        .as_ref()
        .and_then(|v| v.get("message"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| excerpt(body.trim()));
    let code = status.as_u16();
    let failure = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => RemoteFailure::Auth,
        StatusCode::NOT_FOUND | StatusCode::BAD_GATEWAY => RemoteFailure::NotFound,
        StatusCode::TOO_MANY_REQUESTS => RemoteFailure::RateLimited,
        _ => RemoteFailure::Failed,
    };
    let hint = match failure {
        RemoteFailure::Auth => "; the sandbox's access token was refused (reconnect to get a new one)",
        RemoteFailure::NotFound if status == StatusCode::BAD_GATEWAY => "; the sandbox may be gone or paused",
        _ => "",
    };
    remote(failure, format!("envd: cannot {what}: HTTP {code}: {said}{hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_sandbox_url_follows_the_sdks_rules() {
        let own = Url::parse("http://127.0.0.1:5000").unwrap();
        assert_eq!(envd_url(Some(&own), "e2b.app", "i1").unwrap().as_str(), "http://127.0.0.1:5000/");
        assert_eq!(envd_url(None, "e2b.app", "i1").unwrap().as_str(), "https://sandbox.e2b.app/");
        assert_eq!(envd_url(None, "cloud.example", "i1").unwrap().as_str(), "https://49983-i1.cloud.example/");
    }

    #[test]
    fn a_start_request_is_the_argv_env_and_cwd_as_given() {
        let spec = ExecSpec {
            program: PathBuf::from("/usr/bin/opencode"),
            args: vec!["run".into(), "--format".into(), "json".into()],
            env: vec![("HOME".into(), "/home/user/.acp".into()), ("A".into(), "b c".into())],
            cwd: PathBuf::from("/home/user/workspace"),
            stdin: b"hello".to_vec(),
            ..ExecSpec::default()
        };
        assert_eq!(
            start_request(&spec, Some("acp-s1-1")),
            json!({
                "process": {
                    "cmd": "/usr/bin/opencode",
                    "args": ["run", "--format", "json"],
                    "envs": {"HOME": "/home/user/.acp", "A": "b c"},
                    "cwd": "/home/user/workspace"
                },
                "tag": "acp-s1-1",
                "stdin": true
            })
        );
        let quiet = ExecSpec { program: PathBuf::from("true"), ..ExecSpec::default() };
        assert_eq!(
            start_request(&quiet, None),
            json!({"process": {"cmd": "true", "args": [], "envs": {}}, "stdin": false})
        );
    }

    #[test]
    fn events_are_read_as_envd_writes_them() {
        let parse = |text: &str| parse_event(&serde_json::from_str(text).unwrap());
        assert_eq!(parse(r#"{"event":{"start":{"pid":42}}}"#), Ok(Event::Start(42)));
        assert_eq!(parse(r#"{"event":{"data":{"stdout":"aGVsbG8K"}}}"#), Ok(Event::Stdout(b"hello\n".to_vec())));
        assert_eq!(parse(r#"{"event":{"data":{"stderr":"b29wcwo="}}}"#), Ok(Event::Stderr(b"oops\n".to_vec())));
        assert_eq!(parse(r#"{"event":{"keepalive":{}}}"#), Ok(Event::Nothing));
        assert_eq!(
            parse(r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#),
            Ok(Event::End(ExitInfo { code: Some(0), signal: None }))
        );
        assert_eq!(
            parse(r#"{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}"#),
            Ok(Event::End(ExitInfo { code: Some(3), signal: None }))
        );
        assert_eq!(
            parse(r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed"}}}"#),
            Ok(Event::End(ExitInfo { code: None, signal: Some(9) }))
        );
        assert!(parse(r#"{"event":{"data":{"stdout":"***"}}}"#).unwrap_err().contains("not base64"));
        assert!(parse(r#"{"nothing":1}"#).unwrap_err().starts_with("a message without an event"));
    }

    #[test]
    fn envd_errors_name_the_call_and_the_cause() {
        let message = |e: SandboxError| match e {
            SandboxError::Remote { failure, message, .. } => (failure, message),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            message(envd_error(
                StatusCode::NOT_FOUND,
                r#"{"code":"not_found","message":"process not found"}"#,
                "SendSignal"
            )),
            (RemoteFailure::NotFound, "envd: cannot SendSignal: HTTP 404: process not found".to_string())
        );
        assert_eq!(
            message(envd_error(
                StatusCode::BAD_GATEWAY,
                r#"{"code":502,"message":"The sandbox i1 was not found"}"#,
                "Start"
            )),
            (
                RemoteFailure::NotFound,
                "envd: cannot Start: HTTP 502: The sandbox i1 was not found; the sandbox may be gone or paused"
                    .to_string()
            )
        );
        assert_eq!(message(envd_error(StatusCode::UNAUTHORIZED, "", "List")).0, RemoteFailure::Auth);
    }
}
