//! The model gateway: the agent's model credentials stay with the bridge, and the agent holds placeholders.
//!
//! The bridge serves plain HTTP on 127.0.0.1 of the host (a sandbox with its own network namespace reaches it as
//! an exposed model endpoint, at the same address). Each credential is registered on a route, `/<route id>/…`,
//! tied to one upstream base URL; the agent gets the route's URL as its base URL and a random placeholder as its
//! key. A request on a route is re-originated to that route's upstream only (TLS where it is https), with every
//! placeholder of that route found in a header value or the query replaced by its real value, and the answer is
//! streamed back chunk by chunk (SSE). A request that carries none of its route's placeholders is refused, so a
//! process that knows neither the route nor its placeholder cannot spend the key. Nothing is substituted anywhere
//! else: a placeholder sent to another host through the proxy arrives as it is. No credential is ever logged.
//!
//! A refreshable login (an OAuth access token with its refresh token) is kept the same way, and the gateway
//! refreshes it itself: when a request carries the access token's placeholder and the real token expires within a
//! minute, it exchanges the refresh token at the login's token endpoint first (one exchange at a time per login)
//! and hands the new tokens to the login's owner to store, so the refresh token never enters the sandbox either.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The largest request body passed on (a model request with images is a few MiB).
const MAX_BODY: usize = 64 * 1024 * 1024;
/// How long connecting to an upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The variable naming a PEM file of extra CA certificates the gateway trusts beside the platform's roots (a
/// company's TLS-inspecting proxy, a test's CA).
pub const EXTRA_CA_ENV: &str = "ACP_SANDBOX_EXTRA_CA";
/// What every placeholder carries after the real key's kind prefix, so that one is recognised in a log or a file.
const PLACEHOLDER_MARK: &str = "acpsandbox";

/// A gateway that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The listener could not be bound.
    #[error("the model gateway cannot listen on 127.0.0.1: {0}")]
    Listen(std::io::Error),
    /// The HTTP client could not be built.
    #[error("the model gateway cannot make its HTTP client: {0}")]
    Client(String),
}

/// A credential's real value: never printed.
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// One credential of a route: what the agent holds and what the upstream gets instead.
#[derive(Clone, Debug)]
struct Credential {
    name: String,
    placeholder: String,
    value: Secret,
    /// How the value is renewed, for an OAuth access token.
    renew: Option<Renewal>,
}

/// What a credential is: a plain key, or an OAuth login the gateway refreshes.
#[derive(Debug)]
pub enum Held {
    /// A key that does not expire.
    Key(String),
    /// An access token and how to refresh it.
    OAuth(OAuthLogin),
}

/// What registers a credential on the gateway for a command: `keep(name, upstream, held)` answers its route and
/// placeholder (`None`: no gateway).
pub type Keep<'a> = dyn FnMut(&str, &str, Held) -> Option<Granted> + 'a;

/// Called with the new tokens after a refresh (to store them where the login came from).
pub type OnRefresh = Arc<dyn Fn(&Refreshed) + Send + Sync>;

/// An OAuth login kept by the gateway.
pub struct OAuthLogin {
    /// The access token, sent to the upstream.
    pub access: String,
    /// The refresh token, sent to `token_url` only.
    pub refresh: String,
    /// When the access token expires, in milliseconds since the epoch (`None`: the `exp` of the access token if it
    /// is a JWT, else now, so that the first request refreshes it).
    pub expires_ms: Option<i64>,
    /// The login's token endpoint.
    pub token_url: String,
    /// The OAuth client the login was made by (its public id).
    pub client_id: String,
    /// Whether the endpoint takes a form (`application/x-www-form-urlencoded`) rather than JSON.
    pub form: bool,
    /// Further fields of the refresh request (e.g. `scope`).
    pub extra: Vec<(String, String)>,
    /// Stores the new tokens.
    pub on_refresh: Option<OnRefresh>,
    /// The placeholder the agent holds, when it needs a form of its own (a JWT it can parse): it must carry
    /// [`placeholder_for`]'s random part. `None`: the gateway makes one.
    pub placeholder: Option<String>,
}

impl std::fmt::Debug for OAuthLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthLogin").field("token_url", &self.token_url).finish_non_exhaustive()
    }
}

/// The tokens a refresh gave.
pub struct Refreshed {
    /// The new access token.
    pub access: String,
    /// The refresh token to use next (the old one when the endpoint sent none).
    pub refresh: String,
    /// When the new access token expires, in milliseconds since the epoch.
    pub expires_ms: i64,
    /// The endpoint's whole answer (an `id_token`, an account id).
    pub answer: serde_json::Value,
}

impl std::fmt::Debug for Refreshed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refreshed").field("expires_ms", &self.expires_ms).finish_non_exhaustive()
    }
}

/// How a credential's value is renewed.
#[derive(Clone)]
struct Renewal {
    token_url: String,
    client_id: String,
    form: bool,
    extra: Vec<(String, String)>,
    refresh: Secret,
    expires_ms: i64,
    /// Held while one request refreshes, so that the others wait and use its result.
    busy: Arc<tokio::sync::Mutex<()>>,
    on_refresh: Option<OnRefresh>,
}

impl std::fmt::Debug for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewal").field("token_url", &self.token_url).field("expires_ms", &self.expires_ms).finish()
    }
}

impl Renewal {
    /// Whether the access token expires within a minute.
    fn due(&self) -> bool {
        self.expires_ms - 60_000 <= now_ms()
    }
}

/// Milliseconds since the epoch.
fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// The `exp` of a JWT, in milliseconds since the epoch (its signature is not checked: it only times a refresh).
pub fn jwt_expiry_ms(token: &str) -> Option<i64> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&payload).ok()?;
    claims.get("exp")?.as_i64()?.checked_mul(1000)
}

/// One upstream base URL and the credentials whose placeholders it substitutes.
#[derive(Clone, Debug)]
struct Route {
    upstream: String,
    credentials: Vec<Credential>,
}

#[derive(Default)]
struct Routes {
    by_id: HashMap<String, Route>,
    /// (scope, upstream) → route id: a session's routes stay the same across its commands, so a server started
    /// earlier keeps working with what it was given.
    by_scope: HashMap<(String, String), String>,
}

/// What the agent gets for one credential: its base URL and its placeholder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    /// `http://127.0.0.1:<port>/<route id>`, standing for the upstream base URL.
    pub base_url: String,
    /// What the agent sends where it would send the credential.
    pub placeholder: String,
}

/// The bridge's model gateway: one listener, routes registered per session.
pub struct Gateway {
    port: u16,
    routes: Arc<Mutex<Routes>>,
    accept: JoinHandle<()>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

static SHARED: OnceLock<Result<Gateway, String>> = OnceLock::new();

impl Gateway {
    /// Listens on 127.0.0.1 at a free port and serves each connection in its own task (on the current runtime).
    pub fn start() -> Result<Gateway, GatewayError> {
        let client = http_client()?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(GatewayError::Listen)?;
        listener.set_nonblocking(true).map_err(GatewayError::Listen)?;
        let port = listener.local_addr().map_err(GatewayError::Listen)?.port();
        let listener = TcpListener::from_std(listener).map_err(GatewayError::Listen)?;
        let routes = Arc::new(Mutex::new(Routes::default()));
        let accept = tokio::spawn(accept_loop(listener, routes.clone(), client));
        tracing::info!(port, "the model gateway listens on 127.0.0.1");
        Ok(Gateway { port, routes, accept })
    }

    /// The bridge's one gateway, started on first use (on the bridge's runtime). Answers why it cannot run.
    pub fn shared() -> Result<&'static Gateway, String> {
        SHARED.get_or_init(|| Gateway::start().map_err(|e| e.to_string())).as_ref().map_err(Clone::clone)
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The route of `scope` (a session's sandbox) to `upstream` carrying the credential `name` (a variable's or a
    /// login's name) with `value`. The same scope, upstream and name always get the same URL and placeholder; a
    /// changed value replaces the old one.
    pub fn grant(&self, scope: &str, name: &str, upstream: &str, value: &str) -> Granted {
        self.keep(scope, name, upstream, Held::Key(value.to_string()))
    }

    /// [`Gateway::grant`] for a key or an OAuth login: the placeholder stands for the key or the access token.
    pub fn keep(&self, scope: &str, name: &str, upstream: &str, held: Held) -> Granted {
        let (value, renew, shaped) = match held {
            Held::Key(value) => (value, None, None),
            Held::OAuth(login) => {
                let expires_ms = login.expires_ms.or_else(|| jwt_expiry_ms(&login.access)).unwrap_or(0);
                let renew = Renewal {
                    token_url: login.token_url,
                    client_id: login.client_id,
                    form: login.form,
                    extra: login.extra,
                    refresh: Secret(login.refresh),
                    expires_ms,
                    busy: Arc::default(),
                    on_refresh: login.on_refresh,
                };
                (login.access, Some(renew), login.placeholder)
            }
        };
        let upstream = upstream.trim().trim_end_matches('/').to_string();
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let key = (scope.to_string(), upstream.clone());
        let id = routes.by_scope.entry(key).or_insert_with(random_hex).clone();
        let route = routes.by_id.entry(id.clone()).or_insert_with(|| Route { upstream, credentials: Vec::new() });
        let placeholder = match route.credentials.iter_mut().find(|c| c.name == name) {
            Some(credential) => {
                // A login the gateway refreshed since is newer than the one read again from the user's file.
                let refreshed =
                    matches!((&credential.renew, &renew), (Some(old), Some(new)) if old.expires_ms > new.expires_ms);
                if !refreshed {
                    credential.value = Secret(value);
                    credential.renew = renew;
                }
                credential.placeholder.clone()
            }
            None => {
                let placeholder = shaped.unwrap_or_else(|| placeholder_for(&value));
                route.credentials.push(Credential {
                    name: name.to_string(),
                    placeholder: placeholder.clone(),
                    value: Secret(value),
                    renew,
                });
                placeholder
            }
        };
        Granted { base_url: format!("http://127.0.0.1:{}/{id}", self.port), placeholder }
    }
}

/// 32 random hex digits.
fn random_hex() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A placeholder for `value`: its kind prefix (`sk-ant-api03-`, `sk-proj-`: short, public markers some CLIs check
/// the form of), then the mark and 64 random hex digits. Nothing of the value beyond that prefix.
pub fn placeholder_for(value: &str) -> String {
    let mut prefix_len = 0;
    let mut segments = 0;
    let mut start = 0;
    for (i, c) in value.char_indices() {
        if c == '-' || c == '_' {
            let segment = &value[start..i];
            if segment.is_empty() || segment.len() > 5 || segments == 3 {
                break;
            }
            segments += 1;
            prefix_len = i + 1;
            start = i + 1;
        } else if !c.is_ascii_alphanumeric() || i - start >= 5 {
            break;
        }
    }
    format!("{}{PLACEHOLDER_MARK}{}{}", &value[..prefix_len], random_hex(), random_hex())
}

fn http_client() -> Result<reqwest::Client, GatewayError> {
    // reqwest's rustls without a bundled provider needs one installed once per process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("acp-sandbox/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = std::env::var_os(EXTRA_CA_ENV).filter(|p| !p.is_empty()) {
        let pem = std::fs::read(&path)
            .map_err(|e| GatewayError::Client(format!("{EXTRA_CA_ENV}={}: {e}", path.to_string_lossy())))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| GatewayError::Client(format!("{EXTRA_CA_ENV}={}: {e}", path.to_string_lossy())))?;
        builder = builder.tls_certs_merge(certs);
    }
    builder.build().map_err(|e| GatewayError::Client(e.to_string()))
}

async fn accept_loop(listener: TcpListener, routes: Arc<Mutex<Routes>>, client: reqwest::Client) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                let (routes, client) = (routes.clone(), client.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let (routes, client) = (routes.clone(), client.clone());
                        async move { Ok::<_, Infallible>(handle(&routes, &client, request).await) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
            Err(e) => {
                tracing::warn!("model gateway: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A short plain-text answer of the gateway itself.
fn answer(status: StatusCode, message: &str) -> Response<Body> {
    let body = Full::new(Bytes::from(format!("acp-sandbox model gateway: {message}\n")))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert("content-type", HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// Headers of one hop only, never passed on.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

/// `text` with every placeholder of `credentials` replaced by its value, and whether any was.
fn substitute(text: &str, credentials: &[Credential]) -> (String, bool) {
    let mut text = text.to_string();
    let mut found = false;
    for credential in credentials {
        if text.contains(&credential.placeholder) {
            text = text.replace(&credential.placeholder, &credential.value.0);
            found = true;
        }
    }
    (text, found)
}

async fn handle(routes: &Mutex<Routes>, client: &reqwest::Client, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_string();
    let (id, rest) = match path.trim_start_matches('/').split_once('/') {
        Some((id, rest)) => (id.to_string(), format!("/{rest}")),
        None => (path.trim_start_matches('/').to_string(), String::new()),
    };
    let route = routes.lock().unwrap_or_else(|p| p.into_inner()).by_id.get(&id).cloned();
    let Some(mut route) = route else {
        return answer(StatusCode::NOT_FOUND, "no such route");
    };
    // The logins this request uses whose access token expires: refreshed first.
    let due: Vec<String> = {
        let mut texts = request.headers().values().filter_map(|v| v.to_str().ok()).chain(request.uri().query());
        let texts: Vec<&str> = texts.by_ref().collect();
        route
            .credentials
            .iter()
            .filter(|c| c.renew.as_ref().is_some_and(Renewal::due))
            .filter(|c| texts.iter().any(|text| text.contains(&c.placeholder)))
            .map(|c| c.name.clone())
            .collect()
    };
    for name in due {
        if let Err(why) = renew(routes, client, &id, &name).await {
            tracing::warn!(upstream = %host_of(&route.upstream), "model gateway: the login {name} cannot be refreshed: {why}");
            let message = format!("the login {name} cannot be refreshed ({why}): sign in again outside the sandbox");
            return answer(StatusCode::BAD_GATEWAY, &message);
        }
    }
    if let Some(fresh) = routes.lock().unwrap_or_else(|p| p.into_inner()).by_id.get(&id) {
        route = fresh.clone();
    }
    let mut carried = false;
    let mut headers = HeaderMap::new();
    for (name, value) in request.headers() {
        if hop_by_hop(name) {
            continue;
        }
        let value = match value.to_str() {
            Ok(text) => {
                let (text, found) = substitute(text, &route.credentials);
                carried |= found;
                match HeaderValue::from_str(&text) {
                    Ok(value) => value,
                    Err(_) => return answer(StatusCode::BAD_REQUEST, "a header value cannot be passed on"),
                }
            }
            Err(_) => value.clone(),
        };
        headers.append(name.clone(), value);
    }
    let query = match request.uri().query() {
        Some(query) => {
            let (query, found) = substitute(query, &route.credentials);
            carried |= found;
            format!("?{query}")
        }
        None => String::new(),
    };
    if !carried {
        tracing::warn!(upstream = %host_of(&route.upstream), "model gateway: refused a request without its route's placeholder");
        return answer(StatusCode::UNAUTHORIZED, "the request does not carry this route's credential placeholder");
    }
    let method = request.method().clone();
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return answer(StatusCode::PAYLOAD_TOO_LARGE, &format!("the request body cannot be read: {e}")),
    };
    let url = format!("{}{rest}{query}", route.upstream);
    let sent = client.request(method.clone(), &url).headers(headers).body(body).send().await;
    let upstream = match sent {
        Ok(upstream) => upstream,
        Err(e) => {
            // The URL may carry the credential in its query: never in the answer or the log.
            let why = e.without_url().to_string();
            tracing::warn!(upstream = %host_of(&route.upstream), "model gateway: {method} failed: {why}");
            return answer(StatusCode::BAD_GATEWAY, &format!("{} did not answer: {why}", host_of(&route.upstream)));
        }
    };
    tracing::debug!(upstream = %host_of(&route.upstream), status = upstream.status().as_u16(), "model gateway: {method}");
    let status = upstream.status();
    let passed: Vec<(HeaderName, HeaderValue)> = upstream
        .headers()
        .iter()
        .filter(|(name, _)| !hop_by_hop(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    // Each chunk is passed on as it arrives: an SSE stream reaches the agent event by event.
    let stream = futures::stream::unfold(Some(upstream), |state| async move {
        let mut upstream = state?;
        match upstream.chunk().await {
            Ok(Some(chunk)) => Some((Ok(Frame::data(chunk)), Some(upstream))),
            Ok(None) => None,
            Err(e) => Some((Err(Box::new(e.without_url()) as Box<dyn std::error::Error + Send + Sync>), None)),
        }
    });
    let mut response = Response::new(Body::new(StreamBody::new(stream)));
    *response.status_mut() = status;
    for (name, value) in passed {
        response.headers_mut().append(name, value);
    }
    response
}

/// Refreshes the login `name` of route `id` if it is still due once no other request refreshes it: the refresh
/// token goes to the login's token endpoint, the new tokens replace the old ones and go to the login's owner.
async fn renew(routes: &Mutex<Routes>, client: &reqwest::Client, id: &str, name: &str) -> Result<(), String> {
    let current = |routes: &Mutex<Routes>| {
        let routes = routes.lock().unwrap_or_else(|p| p.into_inner());
        let credential = routes.by_id.get(id)?.credentials.iter().find(|c| c.name == name)?;
        credential.renew.clone()
    };
    let Some(busy) = current(routes).map(|r| r.busy) else { return Ok(()) };
    let _refreshing = busy.lock().await;
    let Some(renewal) = current(routes).filter(Renewal::due) else { return Ok(()) };
    let mut fields = vec![
        ("grant_type".to_string(), "refresh_token".to_string()),
        ("refresh_token".to_string(), renewal.refresh.0.clone()),
        ("client_id".to_string(), renewal.client_id.clone()),
    ];
    fields.extend(renewal.extra.iter().cloned());
    let request = client.post(&renewal.token_url).header("accept", "application/json");
    let request = if renewal.form {
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v))).collect();
        request.header("content-type", "application/x-www-form-urlencoded").body(body.join("&"))
    } else {
        let body: serde_json::Map<String, serde_json::Value> =
            fields.into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
        request.json(&body)
    };
    let answer = request
        .send()
        .await
        .map_err(|e| format!("{} did not answer: {}", host_of(&renewal.token_url), e.without_url()))?;
    let status = answer.status();
    if !status.is_success() {
        // Its body may echo the token: never passed on.
        return Err(format!("{} answered {status}", host_of(&renewal.token_url)));
    }
    let answer: serde_json::Value =
        answer.json().await.map_err(|_| format!("{} answered no JSON", host_of(&renewal.token_url)))?;
    let Some(access) = answer.get("access_token").and_then(|v| v.as_str()).filter(|v| !v.is_empty()) else {
        return Err(format!("{} answered no access_token", host_of(&renewal.token_url)));
    };
    let refresh = answer.get("refresh_token").and_then(|v| v.as_str()).filter(|v| !v.is_empty());
    let refresh = refresh.unwrap_or(&renewal.refresh.0).to_string();
    let expires_ms = answer
        .get("expires_in")
        .and_then(|v| v.as_i64())
        .map(|seconds| now_ms() + seconds * 1000)
        .or_else(|| jwt_expiry_ms(access))
        .unwrap_or_else(|| now_ms() + 3_600_000);
    let refreshed = Refreshed { access: access.to_string(), refresh, expires_ms, answer: answer.clone() };
    {
        let mut routes = routes.lock().unwrap_or_else(|p| p.into_inner());
        let credential = routes.by_id.get_mut(id).and_then(|r| r.credentials.iter_mut().find(|c| c.name == name));
        if let Some(credential) = credential {
            credential.value = Secret(refreshed.access.clone());
            if let Some(renew) = credential.renew.as_mut() {
                renew.refresh = Secret(refreshed.refresh.clone());
                renew.expires_ms = expires_ms;
            }
        }
    }
    tracing::info!(upstream = %host_of(&renewal.token_url), "model gateway: refreshed the login {name}");
    if let Some(store) = &renewal.on_refresh {
        store(&refreshed);
    }
    Ok(())
}

/// `text` as a value of a form (`application/x-www-form-urlencoded`).
fn form_encode(text: &str) -> String {
    let mut encoded = String::new();
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => encoded.push(char::from(byte)),
            b' ' => encoded.push('+'),
            _ => encoded.push_str(&format!("%{byte:02X}")),
        }
    }
    encoded
}

/// The authority of a URL (without a user part), for logs and answers.
fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.rsplit_once('@').map_or(authority, |(_, host)| host).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::sync::mpsc;

    /// An upstream on 127.0.0.1 that sends each request head it gets to `heads`, answers an SSE stream's first
    /// event, waits for `more`, then sends the second and ends.
    async fn upstream() -> (String, mpsc::UnboundedReceiver<String>, mpsc::UnboundedSender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (heads_tx, heads) = mpsc::unbounded_channel();
        let (more, mut more_rx) = mpsc::unbounded_channel::<()>();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (head, _) = crate::sandbox::net::proxy::read_head(&mut stream).await.unwrap();
                heads_tx.send(String::from_utf8(head).unwrap()).unwrap();
                let start = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
                stream.write_all(start.as_bytes()).await.unwrap();
                stream.write_all(b"d\r\ndata: first\n\n\r\n").await.unwrap();
                more_rx.recv().await;
                stream.write_all(b"e\r\ndata: second\n\n\r\n0\r\n\r\n").await.unwrap();
            }
        });
        (format!("http://127.0.0.1:{port}/v1/"), heads, more)
    }

    #[tokio::test]
    async fn a_placeholder_becomes_the_credential_on_its_own_route_and_the_answer_streams() {
        let (base, mut heads, more) = upstream().await;
        let gateway = Gateway::start().unwrap();
        let granted = gateway.grant("session-a", "OPENAI_API_KEY", &base, "sk-proj-REALSECRET");
        assert!(granted.placeholder.starts_with("sk-proj-acpsandbox"), "{}", granted.placeholder);
        assert!(!granted.placeholder.contains("REALSECRET"));
        assert_eq!(gateway.grant("session-a", "OPENAI_API_KEY", &base, "sk-proj-REALSECRET"), granted);
        let url = format!("{}/chat/completions?key={}&x=1", granted.base_url, granted.placeholder);
        let mut answer = reqwest::Client::new()
            .post(url)
            .header("authorization", format!("Bearer {}", granted.placeholder))
            .header("x-other", "kept")
            .body("{\"model\":\"m\"}")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.headers()["content-type"], "text/event-stream");
        // The first event arrives while the upstream still holds the second back.
        assert_eq!(answer.chunk().await.unwrap().unwrap(), "data: first\n\n");
        more.send(()).unwrap();
        assert_eq!(answer.chunk().await.unwrap().unwrap(), "data: second\n\n");
        assert_eq!(answer.chunk().await.unwrap(), None);
        let head = heads.recv().await.unwrap();
        assert!(head.starts_with("POST /v1/chat/completions?key=sk-proj-REALSECRET&x=1 HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("authorization: Bearer sk-proj-REALSECRET\r\n"), "{head}");
        assert!(head.contains("x-other: kept\r\n"), "{head}");
        assert!(!head.contains(PLACEHOLDER_MARK), "{head}");
    }

    #[tokio::test]
    async fn a_request_without_its_routes_placeholder_is_refused_and_reaches_nothing() {
        let (base, mut heads, _more) = upstream().await;
        let gateway = Gateway::start().unwrap();
        let mine = gateway.grant("session-a", "KEY", &base, "real-one");
        let other = gateway.grant("session-b", "KEY", &base, "real-two");
        assert_ne!(mine.base_url, other.base_url);
        let client = reqwest::Client::new();
        for (url, key) in [
            (format!("{}/models", mine.base_url), "no-placeholder".to_string()),
            (format!("{}/models", mine.base_url), other.placeholder.clone()),
            (format!("http://127.0.0.1:{}/{}/models", gateway.port(), random_hex()), mine.placeholder.clone()),
        ] {
            let answer = client.get(&url).header("x-api-key", key).send().await.unwrap();
            assert!(matches!(answer.status().as_u16(), 401 | 404), "{url}: {}", answer.status());
            assert!(answer.text().await.unwrap().starts_with("acp-sandbox model gateway: "));
        }
        let answer = client.get(format!("{}/models", other.base_url)).header("x-api-key", &other.placeholder);
        assert_eq!(answer.send().await.unwrap().status(), 200);
        let head = heads.recv().await.unwrap();
        assert!(head.contains("x-api-key: real-two\r\n"), "{head}");
        assert!(heads.try_recv().is_err(), "a refused request reached the upstream");
    }

    #[tokio::test]
    async fn no_path_leads_a_route_away_from_its_upstream() {
        let (base, mut heads, more) = upstream().await;
        let gateway = Gateway::start().unwrap();
        let granted = gateway.grant("session-a", "KEY", &base, "real");
        // Each goes to the route's own upstream (the test's server), whatever the path says.
        for path in ["/..%2f..%2fx", "//evil.example/x", "/@evil.example/x"] {
            let url = format!("{}{path}", granted.base_url);
            // The upstream answers whole at once.
            more.send(()).unwrap();
            let answer = reqwest::Client::new().get(&url).header("x-api-key", &granted.placeholder).send().await;
            let answer = answer.unwrap();
            assert_eq!(answer.status(), 200, "{url}");
            assert_eq!(answer.text().await.unwrap(), "data: first\n\ndata: second\n\n");
            let head = heads.recv().await.unwrap();
            assert!(head.contains("x-api-key: real\r\n"), "{path}: {head}");
        }
    }

    /// A token endpoint on 127.0.0.1 that sends each request (head and body) to `bodies` and answers `status` with
    /// `answer`.
    async fn token_server(status: u16, answer: serde_json::Value) -> (String, mpsc::UnboundedReceiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, bodies) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (head, rest) = crate::sandbox::net::proxy::read_head(&mut stream).await.unwrap();
                let head = String::from_utf8(head).unwrap();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase().strip_prefix("content-length: ").map(|n| n.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                let mut body = rest.to_vec();
                while body.len() < length {
                    let mut more = [0u8; 4096];
                    let n = tokio::io::AsyncReadExt::read(&mut stream, &mut more).await.unwrap();
                    body.extend_from_slice(&more[..n]);
                }
                tx.send(format!("{head}{}", String::from_utf8(body).unwrap())).unwrap();
                let text = answer.to_string();
                let reply = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
                stream.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        (format!("http://127.0.0.1:{port}/oauth/token"), bodies)
    }

    fn login(token_url: &str, expires_ms: Option<i64>, form: bool, stored: &Arc<Mutex<Vec<(String, String)>>>) -> Held {
        let stored = stored.clone();
        Held::OAuth(OAuthLogin {
            access: "REAL-OLD-ACCESS".into(),
            refresh: "REAL-REFRESH".into(),
            expires_ms,
            token_url: token_url.into(),
            client_id: "client-1".into(),
            form,
            extra: vec![("scope".into(), "openid profile".into())],
            on_refresh: Some(Arc::new(move |new: &Refreshed| {
                stored.lock().unwrap().push((new.access.clone(), new.refresh.clone()));
            })),
            placeholder: None,
        })
    }

    #[tokio::test]
    async fn an_expired_login_is_refreshed_by_the_gateway_once_and_stored() {
        let (base, mut heads, more) = upstream().await;
        let answer = serde_json::json!({"access_token": "REAL-NEW-ACCESS", "refresh_token": "REAL-NEW-REFRESH", "expires_in": 3600});
        let (token_url, mut exchanges) = token_server(200, answer).await;
        let gateway = Gateway::start().unwrap();
        let stored = Arc::new(Mutex::new(Vec::new()));
        let granted = gateway.keep("s", "auth.json anthropic", &base, login(&token_url, Some(1), false, &stored));
        assert!(!granted.placeholder.contains("OLD-ACCESS"), "{}", granted.placeholder);
        for _ in 0..2 {
            more.send(()).unwrap();
            let answer = reqwest::Client::new()
                .post(format!("{}/messages", granted.base_url))
                .header("authorization", format!("Bearer {}", granted.placeholder))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 200);
            answer.text().await.unwrap();
            let head = heads.recv().await.unwrap();
            assert!(head.contains("authorization: Bearer REAL-NEW-ACCESS\r\n"), "{head}");
        }
        let exchange = exchanges.recv().await.unwrap();
        assert!(exchange.starts_with("POST /oauth/token HTTP/1.1\r\n"), "{exchange}");
        let body: serde_json::Value = serde_json::from_str(exchange.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"grant_type": "refresh_token", "refresh_token": "REAL-REFRESH", "client_id": "client-1", "scope": "openid profile"})
        );
        assert!(exchanges.try_recv().is_err(), "the fresh token was refreshed again");
        assert_eq!(*stored.lock().unwrap(), [("REAL-NEW-ACCESS".to_string(), "REAL-NEW-REFRESH".to_string())]);
        // The login read again from the user's file (older than the refreshed one) does not replace it.
        let again = gateway.keep("s", "auth.json anthropic", &base, login(&token_url, Some(1), false, &stored));
        assert_eq!(again, granted);
        more.send(()).unwrap();
        let answer = reqwest::Client::new().get(&granted.base_url).header("x-api-key", &granted.placeholder).send();
        answer.await.unwrap().text().await.unwrap();
        assert!(heads.recv().await.unwrap().contains("x-api-key: REAL-NEW-ACCESS\r\n"));
        assert!(exchanges.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_form_endpoint_gets_a_form_and_a_refused_refresh_reaches_no_upstream() {
        let (base, mut heads, _more) = upstream().await;
        let (token_url, mut exchanges) = token_server(401, serde_json::json!({"error": "invalid_grant"})).await;
        let gateway = Gateway::start().unwrap();
        let stored = Arc::new(Mutex::new(Vec::new()));
        let granted = gateway.keep("s", "codex", &base, login(&token_url, None, true, &stored));
        let answer = reqwest::Client::new()
            .get(format!("{}/responses", granted.base_url))
            .header("authorization", format!("Bearer {}", granted.placeholder))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 502);
        let text = answer.text().await.unwrap();
        assert!(text.contains("the login codex cannot be refreshed (127.0.0.1:"), "{text}");
        assert!(!text.contains("REAL"), "{text}");
        let exchange = exchanges.recv().await.unwrap();
        assert!(exchange.contains("content-type: application/x-www-form-urlencoded\r\n"), "{exchange}");
        assert!(
            exchange.ends_with(
                "\r\n\r\ngrant_type=refresh_token&refresh_token=REAL-REFRESH&client_id=client-1&scope=openid+profile"
            ),
            "{exchange}"
        );
        assert!(heads.try_recv().is_err(), "a request without a fresh token reached the upstream");
        assert!(stored.lock().unwrap().is_empty());
    }

    #[test]
    fn a_jwts_expiry_is_read_from_its_claims() {
        use base64::Engine;
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"exp":1700000000,"sub":"x"}"#);
        assert_eq!(jwt_expiry_ms(&format!("h.{claims}.sig")), Some(1_700_000_000_000));
        assert_eq!(jwt_expiry_ms("not-a-jwt"), None);
        assert_eq!(form_encode("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn a_placeholder_keeps_only_the_keys_kind_prefix() {
        let cases = [
            ("sk-ant-api03-AbCdEf", "sk-ant-api03-"),
            ("sk-proj-abcdef", "sk-proj-"),
            ("AIzaSyABCDEF", ""),
            ("abcdefgh-ijkl", ""),
            ("a-b-c-d-e", "a-b-c-"),
            ("", ""),
        ];
        for (value, prefix) in cases {
            let placeholder = placeholder_for(value);
            let rest = placeholder.strip_prefix(prefix).unwrap_or_else(|| panic!("{value}: {placeholder}"));
            assert!(rest.starts_with(PLACEHOLDER_MARK), "{value}: {placeholder}");
            assert_eq!(rest.len(), PLACEHOLDER_MARK.len() + 64, "{value}: {placeholder}");
        }
        assert_ne!(placeholder_for("k"), placeholder_for("k"));
    }

    #[test]
    fn logs_name_the_upstream_by_its_host_only() {
        assert_eq!(host_of("https://user:pw@api.example.com:8443/v1?key=x"), "api.example.com:8443");
        assert_eq!(host_of("http://127.0.0.1:9/v1"), "127.0.0.1:9");
    }

    #[test]
    fn a_secret_is_never_printed() {
        assert_eq!(format!("{:?}", Secret("real".into())), "Secret(<redacted>)");
    }
}
