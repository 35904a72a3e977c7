//! The Daytona HTTP API as the provider uses it: the control plane (sandboxes) and the toolbox of one sandbox
//! (sessions, commands, files), over `reqwest`; the request bodies and the error mapping are pure and unit-tested.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::sandbox::path_segment as seg;

/// What the provider reports to the SDK-aware daemon: no SDK version, but split stdout and stderr (the markers).
pub(crate) const SOURCE: &str = "acp-sandbox";

/// A Daytona failure, in words for the user.
#[derive(Debug, thiserror::Error)]
pub enum DaytonaError {
    /// No key in the environment.
    #[error("Daytona needs an API key: set DAYTONA_API_KEY, or run `acp-sandbox login --provider daytona`")]
    MissingKey,
    /// The key was refused.
    #[error("Daytona refused the API key (HTTP 401) while {what}: check DAYTONA_API_KEY (and DAYTONA_API_URL)")]
    Auth {
        /// What was being done.
        what: String,
    },
    /// The sandbox (or the session, command, file) does not exist.
    #[error("Daytona: {what}: not found (HTTP 404): {message}")]
    NotFound {
        /// What was being done.
        what: String,
        /// Daytona's words.
        message: String,
    },
    /// Any other refusal.
    #[error("Daytona: {what}: HTTP {status}: {message}")]
    Api {
        /// What was being done.
        what: String,
        /// The HTTP status.
        status: u16,
        /// Daytona's words.
        message: String,
    },
    /// The API could not be reached, or answered something unreadable.
    #[error("Daytona: {what}: {}", with_causes(source))]
    Transport {
        /// What was being done.
        what: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The sandbox is in a state it cannot leave by itself.
    #[error("Daytona sandbox {id} is {state}{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    State {
        /// The sandbox.
        id: String,
        /// Its state.
        state: String,
        /// Daytona's `errorReason`.
        reason: Option<String>,
    },
    /// Waiting for a state took too long.
    #[error("Daytona: {what}: still not done after {seconds} s")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long.
        seconds: u64,
    },
    /// The log stream failed.
    #[error("Daytona: streaming the command's logs: {0}")]
    Stream(String),
    /// A setting is wrong.
    #[error("{0}")]
    Config(String),
    /// The sandbox went while a command ran in it (deleted, or stopped, by someone else than the bridge).
    #[error(
        "the Daytona sandbox {id} was deleted or stopped outside the bridge while the turn ran; the next prompt \
         starts it again, or makes a new one if it is gone"
    )]
    Gone {
        /// The sandbox.
        id: String,
    },
}

/// An error with its causes: reqwest's own words alone ("error sending request") do not say what failed.
fn with_causes(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

impl DaytonaError {
    /// A 404: the thing is gone.
    pub fn is_not_found(&self) -> bool {
        matches!(self, DaytonaError::NotFound { .. })
    }

    /// A 409: the sandbox is changing state (a stop or start under way) and refuses another change until it is done.
    pub fn is_conflict(&self) -> bool {
        matches!(self, DaytonaError::Api { status: 409, .. })
    }
}

impl From<DaytonaError> for crate::sandbox::SandboxError {
    /// A refusal of Daytona's becomes a remote failure the session can act on (a refused key is a credential to fix,
    /// a gone sandbox is replaced); a setting that is wrong says so before anything is asked.
    fn from(e: DaytonaError) -> Self {
        use crate::sandbox::{RemoteFailure, SandboxError};
        let failure = match &e {
            DaytonaError::MissingKey | DaytonaError::Config(_) => return SandboxError::Unavailable(e.to_string()),
            DaytonaError::Auth { .. } => RemoteFailure::Auth,
            DaytonaError::NotFound { .. } => RemoteFailure::NotFound,
            DaytonaError::Api { status: 429, .. } => RemoteFailure::RateLimited,
            DaytonaError::Transport { source, .. } if source.is_decode() => RemoteFailure::Protocol,
            DaytonaError::Transport { .. } => RemoteFailure::Unreachable,
            // Not `NotFound`: that would run the prompt again at once in a new sandbox, after the agent already
            // answered part of it; the turn ends saying why, and the next prompt replaces the sandbox.
            DaytonaError::Gone { .. }
            | DaytonaError::Api { .. }
            | DaytonaError::State { .. }
            | DaytonaError::Timeout { .. }
            | DaytonaError::Stream(_) => RemoteFailure::Failed,
        };
        SandboxError::Remote { provider: super::PROVIDER, failure, message: e.to_string() }
    }
}

/// The error for a refused request (pure): 401 says to check the key, 404 that the thing is gone; the message is
/// Daytona's own (`message`, a string or a list of strings, or the body's first 300 characters).
pub fn status_error(status: u16, what: &str, body: &str) -> DaytonaError {
    let message = match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(map)) => match map.get("message") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("; "),
            _ => map.get("error").and_then(Value::as_str).unwrap_or_default().to_string(),
        },
        _ => body.chars().take(300).collect(),
    };
    let what = what.to_string();
    match status {
        401 => DaytonaError::Auth { what },
        404 => DaytonaError::NotFound { what, message },
        status => DaytonaError::Api { what, status, message },
    }
}

/// A sandbox as the control plane describes it (the fields the provider reads).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    /// Its id.
    pub id: String,
    /// `started`, `stopped`, `starting`, … (absent while unknown).
    #[serde(default)]
    pub state: Option<String>,
    /// Why it is in `error`.
    #[serde(default)]
    pub error_reason: Option<String>,
    /// Where its toolbox is reached: `{toolboxProxyUrl}/{id}/…`.
    #[serde(default)]
    pub toolbox_proxy_url: Option<String>,
    /// The version of the daemon inside (`v0.190.0`), when the control plane knows it.
    #[serde(default)]
    pub daemon_version: Option<String>,
}

impl SandboxInfo {
    /// The state, `unknown` when absent.
    pub fn state(&self) -> &str {
        self.state.as_deref().unwrap_or("unknown")
    }
}

/// What a new sandbox is made of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateRequest {
    /// The snapshot, or Daytona's default.
    pub snapshot: Option<String>,
    /// The region.
    pub target: Option<String>,
    /// Labels (the session id, so that sandboxes can be told apart in the dashboard).
    pub labels: BTreeMap<String, String>,
    /// Minutes of inactivity before Daytona stops it by itself (0: never).
    pub auto_stop_minutes: u32,
}

impl CreateRequest {
    /// The `POST /sandbox` body (pure). It carries no environment: nothing of the bridge's (least of all its key)
    /// enters the sandbox; each command gets its own environment.
    pub fn body(&self) -> Value {
        let mut body = json!({
            "env": {},
            "labels": self.labels,
            "autoStopInterval": self.auto_stop_minutes,
        });
        if let Some(snapshot) = &self.snapshot {
            body["snapshot"] = json!(snapshot);
        }
        if let Some(target) = &self.target {
            body["target"] = json!(target);
        }
        body
    }
}

/// The `POST /process/session/{id}/exec` body of an asynchronous command (pure).
pub fn exec_body(command: &str) -> Value {
    // The command's input carries its environment: the daemon must not echo it into the command's log on disk.
    json!({ "command": command, "runAsync": true, "suppressInputEcho": true })
}

/// A snapshot as the control plane describes it (the fields `doctor` reads).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    /// Its name.
    pub name: String,
    /// `active` when sandboxes can start from it (`pending`, `building`, `error`, … otherwise).
    pub state: String,
    /// Why it is in `error`.
    #[serde(default)]
    pub error_reason: Option<String>,
}

/// One command of a session, as the toolbox reports it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CommandInfo {
    /// Its id.
    pub id: String,
    /// Absent while it runs.
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// A toolbox session, as `GET /process/session` lists it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    /// Its name.
    pub session_id: String,
    /// Its commands (older daemons send `null` for none).
    #[serde(default)]
    pub commands: Option<Vec<CommandInfo>>,
}

impl SessionInfo {
    /// Whether a command of it still runs.
    pub fn running(&self) -> bool {
        self.commands.iter().flatten().any(|command| command.exit_code.is_none())
    }
}

/// What a synchronous `exec` answers once its command ended.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Finished {
    /// The exit code.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Its stdout (with the split output every request of ours asks for).
    #[serde(default)]
    pub stdout: Option<String>,
}

#[derive(Deserialize)]
struct CmdId {
    #[serde(rename = "cmdId")]
    cmd_id: String,
}

#[derive(Deserialize)]
struct Dir {
    dir: String,
}

/// Connection settings of the API.
#[derive(Clone)]
pub struct Endpoint {
    /// `https://app.daytona.io/api` or `DAYTONA_API_URL`.
    pub api_url: String,
    /// The key, sent only in the `Authorization` header.
    pub api_key: String,
    /// `X-Daytona-Organization-ID`, when set.
    pub organization_id: Option<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("api_url", &self.api_url)
            .field("api_key", &"<redacted>")
            .field("organization_id", &self.organization_id)
            .finish()
    }
}

/// The HTTP client of one Daytona account.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    endpoint: Endpoint,
}

/// The toolbox of one sandbox.
#[derive(Clone, Debug)]
pub struct Toolbox {
    client: Client,
    /// `{toolboxProxyUrl}/{sandboxId}`.
    base: String,
    /// The sandbox's id.
    sandbox: String,
    /// Whether its daemon has no `terminate` route (found by a first 404, then never asked again).
    no_terminate: Arc<AtomicBool>,
}

static CRYPTO: Once = Once::new();

impl Client {
    /// A client for the account (rustls with the ring provider; no native TLS).
    pub fn new(endpoint: Endpoint) -> Result<Self, DaytonaError> {
        CRYPTO.call_once(|| {
            // Another part of the bridge may have installed it first; either is fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        });
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(15))
            .user_agent(concat!("acp-sandbox/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| DaytonaError::Transport { what: "set up the HTTP client".into(), source })?;
        Ok(Self { http, endpoint })
    }

    /// The account's settings.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub(crate) fn request(&self, method: Method, url: &str) -> RequestBuilder {
        let mut request = self
            .http
            .request(method, url)
            .bearer_auth(&self.endpoint.api_key)
            .header("X-Daytona-Source", SOURCE)
            .header("X-Daytona-Split-Output", "true");
        if let Some(org) = &self.endpoint.organization_id {
            request = request.header("X-Daytona-Organization-ID", org);
        }
        request
    }

    fn api(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint.api_url.trim_end_matches('/'))
    }

    /// `POST /sandbox`.
    pub async fn create(&self, request: &CreateRequest) -> Result<SandboxInfo, DaytonaError> {
        let what = "create a sandbox";
        let response = send(self.request(Method::POST, &self.api("/sandbox")).json(&request.body()), what).await?;
        json_of(response, what).await
    }

    /// `GET /sandbox/{id}`.
    pub async fn get(&self, id: &str) -> Result<SandboxInfo, DaytonaError> {
        let what = format!("get sandbox {id}");
        let response = send(self.request(Method::GET, &self.api(&format!("/sandbox/{}", seg(id)))), &what).await?;
        json_of(response, &what).await
    }

    /// `POST /sandbox/{id}/start`.
    pub async fn start(&self, id: &str) -> Result<SandboxInfo, DaytonaError> {
        let what = format!("start sandbox {id}");
        let url = self.api(&format!("/sandbox/{}/start", seg(id)));
        json_of(send(self.request(Method::POST, &url), &what).await?, &what).await
    }

    /// `POST /sandbox/{id}/stop`: its processes end, its files stay.
    pub async fn stop(&self, id: &str) -> Result<(), DaytonaError> {
        let what = format!("stop sandbox {id}");
        let url = self.api(&format!("/sandbox/{}/stop", seg(id)));
        send(self.request(Method::POST, &url), &what).await.map(drop)
    }

    /// `DELETE /sandbox/{id}`.
    pub async fn delete(&self, id: &str) -> Result<(), DaytonaError> {
        let what = format!("delete sandbox {id}");
        let url = self.api(&format!("/sandbox/{}", seg(id)));
        send(self.request(Method::DELETE, &url), &what).await.map(drop)
    }

    /// `GET /config` (public): the snapshot a sandbox created without one starts from.
    pub async fn default_snapshot(&self) -> Result<String, DaytonaError> {
        let what = "read Daytona's configuration";
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Config {
            default_snapshot: String,
        }
        let response = send(self.request(Method::GET, &self.api("/config")), what).await?;
        Ok(json_of::<Config>(response, what).await?.default_snapshot)
    }

    /// `GET /snapshots/{idOrName}`.
    pub async fn snapshot(&self, name: &str) -> Result<SnapshotInfo, DaytonaError> {
        let what = format!("get snapshot {name}");
        let response = send(self.request(Method::GET, &self.api(&format!("/snapshots/{}", seg(name)))), &what).await?;
        json_of(response, &what).await
    }

    /// The toolbox of a sandbox, at its `toolboxProxyUrl` (asked for when the sandbox did not say).
    pub async fn toolbox(&self, info: &SandboxInfo) -> Result<Toolbox, DaytonaError> {
        let proxy = match &info.toolbox_proxy_url {
            Some(url) if !url.is_empty() => url.clone(),
            _ => {
                let what = format!("find the toolbox of sandbox {}", info.id);
                let url = self.api(&format!("/sandbox/{}/toolbox-proxy-url", seg(&info.id)));
                let response = send(self.request(Method::GET, &url), &what).await?;
                #[derive(Deserialize)]
                struct Url {
                    url: String,
                }
                json_of::<Url>(response, &what).await?.url
            }
        };
        Ok(Toolbox {
            client: self.clone(),
            base: format!("{}/{}", proxy.trim_end_matches('/'), seg(&info.id)),
            sandbox: info.id.clone(),
            no_terminate: Arc::default(),
        })
    }
}

impl Toolbox {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The sandbox's id.
    pub fn sandbox(&self) -> &str {
        &self.sandbox
    }

    /// Shares what another toolbox of the same sandbox found out about its daemon's routes.
    pub(crate) fn with_routes(mut self, no_terminate: Arc<AtomicBool>) -> Self {
        self.no_terminate = no_terminate;
        self
    }

    /// Whether the sandbox is still there and started, as the control plane says (`false` when it says it is gone,
    /// stopped or stopping; `true` when it cannot be asked).
    pub async fn still_started(&self) -> bool {
        match self.client.get(&self.sandbox).await {
            Ok(info) => info.state() == "started",
            Err(e) => !e.is_not_found(),
        }
    }

    /// The WebSocket URL of a command's followed logs.
    pub fn logs_ws_url(&self, session: &str, command: &str) -> String {
        let url = self.url(&format!("/process/session/{}/command/{}/logs?follow=true", seg(session), seg(command)));
        if let Some(rest) = url.strip_prefix("https://") {
            format!("wss://{rest}")
        } else if let Some(rest) = url.strip_prefix("http://") {
            format!("ws://{rest}")
        } else {
            url
        }
    }

    /// `GET /user-home-dir`.
    pub async fn home_dir(&self) -> Result<String, DaytonaError> {
        let what = "find the sandbox's home directory";
        let response = send(self.client.request(Method::GET, &self.url("/user-home-dir")), what).await?;
        Ok(json_of::<Dir>(response, what).await?.dir)
    }

    /// `POST /files/folder`.
    pub async fn create_folder(&self, path: &str) -> Result<(), DaytonaError> {
        let what = format!("create {path} in the sandbox");
        let request =
            self.client.request(Method::POST, &self.url("/files/folder")).query(&[("path", path), ("mode", "0755")]);
        send(request, &what).await.map(drop)
    }

    /// `POST /files/bulk-upload`: each file replaces what is at its path (parents are created).
    pub async fn upload(&self, files: Vec<(String, Vec<u8>)>) -> Result<(), DaytonaError> {
        let what = match files.as_slice() {
            [(path, _)] => format!("upload {path}"),
            _ => format!("upload {} files", files.len()),
        };
        let mut form = reqwest::multipart::Form::new();
        for (i, (path, bytes)) in files.into_iter().enumerate() {
            form = form
                .text(format!("files[{i}].path"), path.clone())
                .part(format!("files[{i}].file"), reqwest::multipart::Part::bytes(bytes).file_name(path));
        }
        send(self.client.request(Method::POST, &self.url("/files/bulk-upload")).multipart(form), &what).await.map(drop)
    }

    /// `DELETE /files`: removes a file (a missing one is a 404).
    pub async fn delete_file(&self, path: &str) -> Result<(), DaytonaError> {
        let what = format!("delete {path}");
        let request = self.client.request(Method::DELETE, &self.url("/files")).query(&[("path", path)]);
        send(request, &what).await.map(drop)
    }

    /// `GET /files/download`.
    pub async fn download(&self, path: &str) -> Result<Vec<u8>, DaytonaError> {
        self.download_at_most(path, u64::MAX).await
    }

    /// `GET /files/download`, reading at most `limit + 1` bytes (the rest is never read): more means larger.
    pub async fn download_at_most(&self, path: &str, limit: u64) -> Result<Vec<u8>, DaytonaError> {
        let (mut response, what) = self.download_response(path).await?;
        let mut bytes = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(source) => return Err(DaytonaError::Transport { what, source }),
            }
            if bytes.len() as u64 > limit {
                break;
            }
        }
        Ok(bytes)
    }

    /// `GET /files/download`: the successful answer, its body not read yet, and what it was in words (for a
    /// failure while the body is read).
    pub async fn download_response(&self, path: &str) -> Result<(Response, String), DaytonaError> {
        let what = format!("download {path}");
        let request = self.client.request(Method::GET, &self.url("/files/download")).query(&[("path", path)]);
        Ok((send(request, &what).await?, what))
    }

    /// `POST /process/session`.
    pub async fn create_session(&self, session: &str) -> Result<(), DaytonaError> {
        let what = format!("create session {session}");
        let request =
            self.client.request(Method::POST, &self.url("/process/session")).json(&json!({"sessionId": session}));
        send(request, &what).await.map(drop)
    }

    /// `DELETE /process/session/{id}`: ends whatever still runs in it.
    pub async fn delete_session(&self, session: &str) -> Result<(), DaytonaError> {
        let what = format!("delete session {session}");
        let url = self.url(&format!("/process/session/{}", seg(session)));
        send(self.client.request(Method::DELETE, &url), &what).await.map(drop)
    }

    /// `POST /process/session/{id}/exec` with `runAsync`: the command's id.
    pub async fn execute(&self, session: &str, command: &str) -> Result<String, DaytonaError> {
        let what = format!("start a command in session {session}");
        let url = self.url(&format!("/process/session/{}/exec", seg(session)));
        let response = send(self.client.request(Method::POST, &url).json(&exec_body(command)), &what).await?;
        Ok(json_of::<CmdId>(response, &what).await?.cmd_id)
    }

    /// `POST /process/session/{id}/exec` without `runAsync`: answers once the command ended.
    pub async fn execute_sync(&self, session: &str, command: &str) -> Result<Finished, DaytonaError> {
        let what = format!("run a command in session {session}");
        let url = self.url(&format!("/process/session/{}/exec", seg(session)));
        let response =
            send(self.client.request(Method::POST, &url).json(&json!({ "command": command })), &what).await?;
        json_of(response, &what).await
    }

    /// `GET /process/session`: every session of the sandbox, with its commands.
    pub async fn sessions(&self) -> Result<Vec<SessionInfo>, DaytonaError> {
        let what = "list the sandbox's sessions";
        json_of(send(self.client.request(Method::GET, &self.url("/process/session")), what).await?, what).await
    }

    /// `POST …/command/{cmd}/input`: `data` goes to the command's stdin through the daemon's input pipe (a FIFO:
    /// kernel memory, never a file), with a newline appended when it has none.
    pub async fn send_input(&self, session: &str, command: &str, data: &str) -> Result<(), DaytonaError> {
        let what = format!("send input to command {command}");
        let url = self.url(&format!("/process/session/{}/command/{}/input", seg(session), seg(command)));
        send(self.client.request(Method::POST, &url).json(&json!({ "data": data })), &what).await.map(drop)
    }

    /// `GET /process/session/{id}/command/{cmd}`.
    pub async fn command(&self, session: &str, command: &str) -> Result<CommandInfo, DaytonaError> {
        let what = format!("get command {command}");
        let url = self.url(&format!("/process/session/{}/command/{}", seg(session), seg(command)));
        json_of(send(self.client.request(Method::GET, &url), &what).await?, &what).await
    }

    /// `GET …/command/{cmd}/logs` without following: the whole log so far, markers included.
    pub async fn logs(&self, session: &str, command: &str) -> Result<Vec<u8>, DaytonaError> {
        let what = format!("get the logs of command {command}");
        let url = self.url(&format!("/process/session/{}/command/{}/logs", seg(session), seg(command)));
        let response = send(self.client.request(Method::GET, &url).header("Accept", "text/plain"), &what).await?;
        let bytes = response.bytes().await.map_err(|source| DaytonaError::Transport { what, source })?;
        Ok(bytes.to_vec())
    }

    /// `POST …/command/{cmd}/terminate`: SIGKILL to the command's process group (daemons of 2026 on).
    /// A daemon without the route (every public one so far) answers 404 once: later calls fail at once with
    /// [`DaytonaError::NotFound`], asking nothing.
    pub async fn terminate(&self, session: &str, command: &str) -> Result<(), DaytonaError> {
        let what = format!("terminate command {command}");
        if self.no_terminate.load(Ordering::Relaxed) {
            return Err(DaytonaError::NotFound { what, message: "this daemon has no terminate route".into() });
        }
        let url = self.url(&format!("/process/session/{}/command/{}/terminate", seg(session), seg(command)));
        let answer = send(self.client.request(Method::POST, &url), &what).await.map(drop);
        // Gin's own 404 (not the daemon's JSON "command not found"), or 405: the route does not exist.
        let missing = |e: &DaytonaError| match e {
            DaytonaError::NotFound { message, .. } => message.trim() == "404 page not found",
            DaytonaError::Api { status, .. } => *status == StatusCode::METHOD_NOT_ALLOWED.as_u16(),
            _ => false,
        };
        if let Err(e) = &answer
            && missing(e)
        {
            self.no_terminate.store(true, Ordering::Relaxed);
        }
        answer
    }
}

async fn send(request: RequestBuilder, what: &str) -> Result<Response, DaytonaError> {
    let response = request
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .map_err(|source| DaytonaError::Transport { what: what.to_string(), source: source.without_url() })?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    Err(status_error(status.as_u16(), what, &body))
}

async fn json_of<T: serde::de::DeserializeOwned>(response: Response, what: &str) -> Result<T, DaytonaError> {
    response.json().await.map_err(|source| DaytonaError::Transport { what: what.to_string(), source })
}

/// Whether a status says the route does not exist (an older daemon without `terminate`).
pub(crate) fn is_missing_route(e: &DaytonaError) -> bool {
    matches!(e, DaytonaError::NotFound { .. })
        || matches!(e, DaytonaError::Api { status, .. } if *status == StatusCode::METHOD_NOT_ALLOWED.as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn refusals_say_what_to_do() {
        assert_eq!(
            status_error(401, "create a sandbox", r#"{"message":"Unauthorized","statusCode":401}"#).to_string(),
            "Daytona refused the API key (HTTP 401) while create a sandbox: check DAYTONA_API_KEY (and DAYTONA_API_URL)"
        );
        let gone = status_error(
            404,
            "get sandbox s1",
            r#"{"statusCode":404,"message":"Sandbox with ID s1 not found","error":"Not Found"}"#,
        );
        assert!(gone.is_not_found());
        assert_eq!(gone.to_string(), "Daytona: get sandbox s1: not found (HTTP 404): Sandbox with ID s1 not found");
        assert_eq!(
            status_error(400, "create a sandbox", r#"{"statusCode":400,"message":["env.A must be a string","b"]}"#)
                .to_string(),
            "Daytona: create a sandbox: HTTP 400: env.A must be a string; b"
        );
        assert_eq!(status_error(502, "x", "Bad Gateway").to_string(), "Daytona: x: HTTP 502: Bad Gateway");
        assert!(!status_error(500, "x", "").is_not_found());
        assert!(is_missing_route(&status_error(405, "x", "")));
        assert!(!is_missing_route(&status_error(410, "x", "")));
    }

    #[test]
    fn a_new_sandbox_carries_no_environment() {
        let request = CreateRequest {
            snapshot: Some("daytona-small".into()),
            target: None,
            labels: BTreeMap::from([("acp-sandbox.session".to_string(), "s1".to_string())]),
            auto_stop_minutes: 60,
        };
        assert_eq!(
            request.body(),
            json!({"env": {}, "labels": {"acp-sandbox.session": "s1"}, "autoStopInterval": 60, "snapshot": "daytona-small"})
        );
        let bare = CreateRequest { target: Some("eu".into()), ..CreateRequest::default() };
        assert_eq!(bare.body(), json!({"env": {}, "labels": {}, "autoStopInterval": 0, "target": "eu"}));
        assert_eq!(exec_body("echo hi"), json!({"command": "echo hi", "runAsync": true, "suppressInputEcho": true}));
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let endpoint = Endpoint { api_url: "http://x/api".into(), api_key: "dtn_secret".into(), organization_id: None };
        assert!(!format!("{endpoint:?}").contains("dtn_secret"));
    }

    #[test]
    fn ids_are_encoded_as_path_segments() {
        assert_eq!(seg("abc-1_2.3"), "abc-1_2.3");
        assert_eq!(seg("../x y"), "..%2Fx%20y");
    }

    #[tokio::test]
    async fn log_urls_follow_the_toolbox_scheme() {
        let client =
            Client::new(Endpoint { api_url: "http://x/api".into(), api_key: "k".into(), organization_id: None })
                .unwrap();
        let info = SandboxInfo {
            id: "sb1".into(),
            state: Some("started".into()),
            error_reason: None,
            toolbox_proxy_url: Some("https://proxy.app.daytona.io/toolbox/".into()),
            daemon_version: None,
        };
        let toolbox = client.toolbox(&info).await.unwrap();
        assert_eq!(
            toolbox.logs_ws_url("s", "c"),
            "wss://proxy.app.daytona.io/toolbox/sb1/process/session/s/command/c/logs?follow=true"
        );
    }
}
