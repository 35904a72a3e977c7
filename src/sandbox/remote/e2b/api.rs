//! E2B's REST control plane (`https://api.<domain>`): create, connect (resumes), pause, timeout, kill; and
//! how its answers become [`SandboxError`]s.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{ApiKey, PROVIDER};
use crate::sandbox::{RemoteFailure, SandboxError};

/// Unary calls never take longer than this; a hung API fails the turn instead of holding it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The body of `POST /v2/sandboxes`, as the official SDKs send it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox<'a> {
    /// Template id or alias.
    #[serde(rename = "templateID")]
    pub template_id: &'a str,
    /// Seconds until the sandbox times out (the API's own default is 15 s).
    pub timeout: u64,
    /// On timeout the sandbox is paused, not killed (`lifecycle.onTimeout: "pause"`).
    pub auto_pause: bool,
    /// A paused sandbox wakes on traffic.
    pub auto_resume: AutoResume,
    /// Labels of the sandbox (which session it serves).
    pub metadata: BTreeMap<String, String>,
    /// The environment of every process; never a secret of ours.
    pub env_vars: BTreeMap<String, String>,
}

/// `autoResume` of a new sandbox.
#[derive(Debug, Serialize)]
pub struct AutoResume {
    /// Whether traffic resumes a paused sandbox.
    pub enabled: bool,
}

/// A sandbox as create and connect describe it.
#[derive(Clone, Debug, Deserialize)]
pub struct SandboxInfo {
    /// Its id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// The version of envd inside.
    #[serde(rename = "envdVersion", default)]
    pub envd_version: String,
    /// The token envd wants in `X-Access-Token`: a per-connect secret, never stored.
    #[serde(rename = "envdAccessToken", default)]
    pub envd_access_token: Option<String>,
    /// The domain of its envd, when it is not the client's.
    #[serde(default)]
    pub domain: Option<String>,
}

/// What a pause did.
#[derive(Debug, PartialEq, Eq)]
pub enum Paused {
    /// It is paused now.
    Paused,
    /// It was paused already (409).
    Already,
    /// It no longer exists (404).
    Gone,
}

/// The control plane of one E2B account.
pub struct ControlPlane {
    http: reqwest::Client,
    base: Url,
    key: ApiKey,
}

impl ControlPlane {
    pub fn new(http: reqwest::Client, base: Url, key: ApiKey) -> Self {
        ControlPlane { http, base, key }
    }

    /// `https://api.e2b.app` or what `E2B_API_URL` said: for `doctor` and errors.
    pub fn base(&self) -> &Url {
        &self.base
    }

    fn url(&self, path: &str) -> Url {
        let mut url = self.base.clone();
        let joined = format!("{}/{}", self.base.path().trim_end_matches('/'), path.trim_start_matches('/'));
        url.set_path(&joined);
        url
    }

    async fn call(&self, method: Method, path: &str, body: Option<serde_json::Value>) -> Result<Answer, SandboxError> {
        let url = self.url(path);
        let mut key = HeaderValue::from_str(self.key.expose())
            .map_err(|_| remote(RemoteFailure::Auth, "E2B_API_KEY holds characters no HTTP header can carry"))?;
        key.set_sensitive(true);
        let mut request = self.http.request(method.clone(), url).timeout(REQUEST_TIMEOUT).header("X-API-Key", key);
        if let Some(body) = body {
            request = request.header(CONTENT_TYPE, "application/json").body(body.to_string());
        }
        let response = request.send().await.map_err(|e| unreachable(&self.base, &e))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| unreachable(&self.base, &e))?;
        tracing::debug!(provider = PROVIDER, %method, path, status = status.as_u16(), "control plane");
        Ok(Answer { status, text })
    }

    /// Creates a sandbox.
    pub async fn create(&self, body: &NewSandbox<'_>) -> Result<SandboxInfo, SandboxError> {
        let body = serde_json::to_value(body).map_err(|e| remote(RemoteFailure::Protocol, e.to_string()))?;
        let answer = self.call(Method::POST, "/v2/sandboxes", Some(body)).await?;
        match answer.status {
            StatusCode::CREATED | StatusCode::OK => answer.json("create a sandbox"),
            status => Err(classify(status, &answer.text, "create a sandbox")),
        }
    }

    /// Connects to a sandbox, resuming it when paused, and makes it live `timeout` from now at least. `None`:
    /// it is gone. The flag says whether it was resumed (201) rather than running (200).
    pub async fn connect(&self, id: &str, timeout: Duration) -> Result<Option<(SandboxInfo, bool)>, SandboxError> {
        let path = format!("/v2/sandboxes/{}/connect", checked_id(id)?);
        let answer = self.call(Method::POST, &path, Some(json!({ "timeout": timeout.as_secs() }))).await?;
        match answer.status {
            StatusCode::OK => Ok(Some((answer.json("connect to a sandbox")?, false))),
            StatusCode::CREATED => Ok(Some((answer.json("resume a sandbox")?, true))),
            StatusCode::NOT_FOUND => Ok(None),
            status => Err(classify(status, &answer.text, "connect to a sandbox")),
        }
    }

    /// Pauses a sandbox (its memory is kept; running processes freeze).
    pub async fn pause(&self, id: &str) -> Result<Paused, SandboxError> {
        let path = format!("/sandboxes/{}/pause", checked_id(id)?);
        let answer = self.call(Method::POST, &path, Some(json!({}))).await?;
        match answer.status {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(Paused::Paused),
            StatusCode::CONFLICT => Ok(Paused::Already),
            StatusCode::NOT_FOUND => Ok(Paused::Gone),
            status => Err(classify(status, &answer.text, "pause a sandbox")),
        }
    }

    /// Makes a sandbox time out `timeout` from now.
    pub async fn set_timeout(&self, id: &str, timeout: Duration) -> Result<(), SandboxError> {
        let path = format!("/sandboxes/{}/timeout", checked_id(id)?);
        let answer = self.call(Method::POST, &path, Some(json!({ "timeout": timeout.as_secs() }))).await?;
        match answer.status {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(()),
            status => Err(classify(status, &answer.text, "extend a sandbox's timeout")),
        }
    }

    /// Whether a sandbox still exists (running or paused): `false` once it was killed, by anyone, or timed out
    /// without auto-pause.
    pub async fn exists(&self, id: &str) -> Result<bool, SandboxError> {
        let path = format!("/sandboxes/{}", checked_id(id)?);
        let answer = self.call(Method::GET, &path, None).await?;
        match answer.status {
            StatusCode::OK => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            status => Err(classify(status, &answer.text, "look up a sandbox")),
        }
    }

    /// Kills a sandbox; `false` when it was already gone.
    pub async fn kill(&self, id: &str) -> Result<bool, SandboxError> {
        let path = format!("/sandboxes/{}", checked_id(id)?);
        let answer = self.call(Method::DELETE, &path, None).await?;
        match answer.status {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            status => Err(classify(status, &answer.text, "kill a sandbox")),
        }
    }
}

/// Whose a template is, as `GET /templates/aliases/{alias}` says.
#[derive(Debug, PartialEq, Eq)]
pub enum TemplateOwner {
    /// The key's team owns it (E2B's id of it).
    Yours(String),
    /// It exists but is another team's: E2B's public templates such as `base` answer so.
    Other,
}

impl ControlPlane {
    /// Whether a template exists: `None` when E2B knows no template of that name.
    pub async fn template(&self, name: &str) -> Result<Option<TemplateOwner>, SandboxError> {
        let answer =
            self.call(Method::GET, &format!("/templates/aliases/{}", crate::sandbox::path_segment(name)), None).await?;
        #[derive(Deserialize)]
        struct Alias {
            #[serde(rename = "templateID")]
            template_id: String,
        }
        match answer.status {
            StatusCode::OK => serde_json::from_str::<Alias>(&answer.text)
                .map(|alias| Some(TemplateOwner::Yours(alias.template_id)))
                .map_err(|e| remote(RemoteFailure::Protocol, format!("E2B answered what is not a template ({e})"))),
            // Before the 403, E2B has accepted the key: the alias exists and belongs to another team.
            StatusCode::FORBIDDEN => Ok(Some(TemplateOwner::Other)),
            StatusCode::NOT_FOUND => Ok(None),
            status => Err(classify(status, &answer.text, "look up a template")),
        }
    }
}

struct Answer {
    status: StatusCode,
    text: String,
}

impl Answer {
    fn json<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T, SandboxError> {
        serde_json::from_str(&self.text).map_err(|e| {
            remote(
                RemoteFailure::Protocol,
                format!("cannot {what}: E2B answered what is not a sandbox ({e}): {}", excerpt(&self.text)),
            )
        })
    }
}

/// A sandbox id read from the store goes into URL paths: only the characters E2B's ids use.
pub fn checked_id(id: &str) -> Result<&str, SandboxError> {
    if !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        Ok(id)
    } else {
        Err(remote(RemoteFailure::NotFound, format!("{:?} is not an E2B sandbox id", excerpt(id))))
    }
}

pub(super) fn remote(failure: RemoteFailure, message: impl Into<String>) -> SandboxError {
    SandboxError::Remote { provider: PROVIDER, failure, message: message.into() }
}

pub(super) fn unreachable(base: &Url, error: &reqwest::Error) -> SandboxError {
    // reqwest's Display omits the cause ("error sending request"); the source says what really failed.
    let mut why = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        why = format!("{why}: {cause}");
        source = cause.source();
    }
    remote(RemoteFailure::Unreachable, format!("cannot reach {base}: {why}"))
}

/// The first 300 characters of a body, for an error message.
pub(super) fn excerpt(text: &str) -> String {
    let mut out: String = text.chars().take(300).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// What a failed answer means, in words that say what to do. E2B's errors are `{"code", "message"}`.
pub fn classify(status: StatusCode, body: &str, what: &str) -> SandboxError {
    #[derive(Deserialize)]
    struct ApiError {
        message: Option<String>,
    }
    let said =
        serde_json::from_str::<ApiError>(body).ok().and_then(|e| e.message).unwrap_or_else(|| excerpt(body.trim()));
    let code = status.as_u16();
    let (failure, message) = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => (
            RemoteFailure::Auth,
            format!("E2B refused the API key (HTTP {code}: {said}); check E2B_API_KEY in the bridge's environment"),
        ),
        StatusCode::NOT_FOUND => (RemoteFailure::NotFound, format!("cannot {what}: not found (HTTP 404: {said})")),
        StatusCode::TOO_MANY_REQUESTS => (
            RemoteFailure::RateLimited,
            format!(
                "cannot {what}: E2B's rate or concurrency limit was reached (HTTP 429: {said}); try again later, or \
                 kill sandboxes this account no longer needs"
            ),
        ),
        _ => (RemoteFailure::Failed, format!("cannot {what}: HTTP {code}: {said}")),
    };
    remote(failure, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(error: &SandboxError) -> (RemoteFailure, String) {
        match error {
            SandboxError::Remote { failure, message, .. } => (*failure, message.clone()),
            other => panic!("not a remote error: {other:?}"),
        }
    }

    #[test]
    fn a_new_sandbox_is_serialized_as_the_sdks_send_it() {
        let body = NewSandbox {
            template_id: "base",
            timeout: 3600,
            auto_pause: true,
            auto_resume: AutoResume { enabled: true },
            metadata: BTreeMap::from([("acp_session".into(), "s1".into())]),
            env_vars: BTreeMap::new(),
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"templateID":"base","timeout":3600,"autoPause":true,"autoResume":{"enabled":true},"metadata":{"acp_session":"s1"},"envVars":{}}"#
        );
    }

    #[test]
    fn a_sandbox_answer_keeps_its_token_and_domain() {
        let info: SandboxInfo = serde_json::from_str(
            r#"{"templateID":"base","sandboxID":"i1","clientID":"c","envdVersion":"0.5.7","envdAccessToken":"tok","domain":null}"#,
        )
        .unwrap();
        assert_eq!(
            (info.sandbox_id.as_str(), info.envd_version.as_str(), info.envd_access_token.as_deref(), info.domain),
            ("i1", "0.5.7", Some("tok"), None)
        );
    }

    #[test]
    fn failures_say_what_happened_and_what_to_do() {
        let (kind, message) = failure(&classify(
            StatusCode::UNAUTHORIZED,
            r#"{"code":401,"message":"Invalid API key"}"#,
            "create a sandbox",
        ));
        assert_eq!(kind, RemoteFailure::Auth);
        assert_eq!(
            message,
            "E2B refused the API key (HTTP 401: Invalid API key); check E2B_API_KEY in the bridge's environment"
        );

        let (kind, message) =
            failure(&classify(StatusCode::NOT_FOUND, r#"{"code":404,"message":"gone"}"#, "pause a sandbox"));
        assert_eq!(
            (kind, message.as_str()),
            (RemoteFailure::NotFound, "cannot pause a sandbox: not found (HTTP 404: gone)")
        );

        let (kind, message) = failure(&classify(StatusCode::TOO_MANY_REQUESTS, "slow down", "create a sandbox"));
        assert_eq!(kind, RemoteFailure::RateLimited);
        assert_eq!(
            message,
            "cannot create a sandbox: E2B's rate or concurrency limit was reached (HTTP 429: slow down); try again \
             later, or kill sandboxes this account no longer needs"
        );

        let (kind, message) = failure(&classify(StatusCode::BAD_GATEWAY, "", "kill a sandbox"));
        assert_eq!((kind, message.as_str()), (RemoteFailure::Failed, "cannot kill a sandbox: HTTP 502: "));
    }

    #[test]
    fn ids_from_the_store_cannot_leave_their_path_segment() {
        assert_eq!(checked_id("i1b2c3-d_4").unwrap(), "i1b2c3-d_4");
        for bad in ["", "../templates", "a/b", "a?b", "a b", &"x".repeat(129)] {
            assert_eq!(failure(&checked_id(bad).unwrap_err()).0, RemoteFailure::NotFound, "{bad}");
        }
    }

    #[test]
    fn paths_join_below_the_base() {
        let http = super::super::http_client().unwrap();
        let plane =
            ControlPlane::new(http, Url::parse("http://127.0.0.1:9/prefix/").unwrap(), ApiKey::new("e2b_1".into()));
        assert_eq!(plane.url("/v2/sandboxes").as_str(), "http://127.0.0.1:9/prefix/v2/sandboxes");
    }
}
