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
        let upstream = upstream.trim().trim_end_matches('/').to_string();
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let key = (scope.to_string(), upstream.clone());
        let id = routes.by_scope.entry(key).or_insert_with(random_hex).clone();
        let route = routes.by_id.entry(id.clone()).or_insert_with(|| Route { upstream, credentials: Vec::new() });
        let placeholder = match route.credentials.iter_mut().find(|c| c.name == name) {
            Some(credential) => {
                credential.value = Secret(value.to_string());
                credential.placeholder.clone()
            }
            None => {
                let placeholder = placeholder_for(value);
                route.credentials.push(Credential {
                    name: name.to_string(),
                    placeholder: placeholder.clone(),
                    value: Secret(value.to_string()),
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
    let Some(route) = route else {
        return answer(StatusCode::NOT_FOUND, "no such route");
    };
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
