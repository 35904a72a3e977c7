//! The sandbox's only way out: an HTTP/HTTPS proxy on a unix socket that decides which hosts the CLI may reach.
//!
//! A sandbox with its own network namespace has nothing but loopback. The bridge runs this proxy on the host; its
//! socket is mounted into the sandbox, where `init.rs` exposes it on 127.0.0.1. It speaks `CONNECT` and
//! absolute-URI HTTP/1.x requests, one request per connection. A target's name is judged against the
//! [`NetworkMode`] before any DNS lookup (a refused name never leaks through the resolver), then every address it
//! resolves to against the host's own interface addresses (read afresh for each request, so no DNS answer can point
//! back at the host) and the ranges that reach the host and its networks, and the connection goes only to an
//! address that was judged. The configured model endpoints (exact host and port) are the exception: they are
//! reachable even on loopback, a private network or the host's own address. At most [`MAX_CONNECTIONS`]
//! connections of one sandbox are served at once, across all its proxies ([`ConnectionBudget`]); the excess is answered `503` and closed at once, so a sandbox
//! cannot spend the bridge's file descriptors. Each denial is logged with its host. Under `--network ask` a host
//! outside the list is first asked about ([`Asker`], `ask.rs`), by name, before it is resolved and judged.

use std::fmt;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::task::{JoinHandle, JoinSet};

use super::ask::{Asker, Refusal, Verdict};

/// The largest request (or proxy answer) head read, blank line included.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long resolving and connecting to a target may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The connections one proxy (one sandboxed command) serves at once, idle ones included. A CLI needs a handful;
/// every one costs the bridge two descriptors.
pub const MAX_CONNECTIONS: usize = 256;

/// What a sandbox may reach on the network. Parsed from and shown as `open`, `allow=a.com,b.org`, `ask`,
/// `ask=a.com,b.org`, `none`, `host`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetworkMode {
    /// Every public host; the host itself and its private networks stay closed.
    Open,
    /// Only these domains, the CLI's own service domains and the model endpoints. An entry covers the domain and
    /// all its subdomains: `example.com`, `*.example.com` and `.example.com` are the same entry, stored as
    /// `example.com`. Any port of an allowed domain may be reached.
    Allow(Vec<String>),
    /// What [`NetworkMode::Allow`] allows (these domains, none for a bare `ask`), and any other public host once
    /// the user allowed it (see `ask.rs`): the connection waits for the answer.
    Ask(Vec<String>),
    /// Only the model endpoints.
    None,
    /// The host's own network, with no namespace and no proxy (the proxy never runs). Were it asked, it would
    /// judge like [`NetworkMode::Open`].
    Host,
}

impl NetworkMode {
    /// Whether sandboxes of this mode get their own network namespace and reach out through the proxy.
    pub fn uses_proxy(&self) -> bool {
        !matches!(self, NetworkMode::Host)
    }

    /// Whether a host outside the list is asked about (`ask`).
    pub fn asks(&self) -> bool {
        matches!(self, NetworkMode::Ask(_))
    }
}

/// A network mode that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkModeError {
    /// Not one of the four modes.
    #[error("unknown network mode {0:?}: expected open, allow=DOMAIN[,DOMAIN...], ask[=DOMAIN,...], none or host")]
    Unknown(String),
    /// `allow=` without a domain.
    #[error("allow= needs at least one domain (none allows only the model endpoints)")]
    EmptyAllowList,
    /// An entry of `allow=` or `ask=` that is not a domain name.
    #[error("{0:?} in the list is not a domain name (expected e.g. example.com or *.example.com, without a port)")]
    InvalidDomain(String),
}

impl FromStr for NetworkMode {
    type Err = NetworkModeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let domains = |list: &str| {
            list.split(',')
                .map(str::trim)
                .filter(|entry| !entry.is_empty())
                .map(|entry| allow_entry(entry).ok_or_else(|| NetworkModeError::InvalidDomain(entry.to_string())))
                .collect::<Result<Vec<_>, _>>()
        };
        if let Some(list) = text.strip_prefix("allow=") {
            let domains = domains(list)?;
            if domains.is_empty() {
                return Err(NetworkModeError::EmptyAllowList);
            }
            return Ok(NetworkMode::Allow(domains));
        }
        // `ask=` with nothing listed is a bare `ask`.
        if let Some(list) = text.strip_prefix("ask=") {
            return Ok(NetworkMode::Ask(domains(list)?));
        }
        match text {
            "open" => Ok(NetworkMode::Open),
            "ask" => Ok(NetworkMode::Ask(Vec::new())),
            "none" => Ok(NetworkMode::None),
            "host" => Ok(NetworkMode::Host),
            other => Err(NetworkModeError::Unknown(other.to_string())),
        }
    }
}

impl fmt::Display for NetworkMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetworkMode::Open => f.write_str("open"),
            NetworkMode::Allow(domains) => write!(f, "allow={}", domains.join(",")),
            NetworkMode::Ask(domains) if domains.is_empty() => f.write_str("ask"),
            NetworkMode::Ask(domains) => write!(f, "ask={}", domains.join(",")),
            NetworkMode::None => f.write_str("none"),
            NetworkMode::Host => f.write_str("host"),
        }
    }
}

/// One `allow=` entry as the domain it covers, or `None` when it is not a domain name.
fn allow_entry(entry: &str) -> Option<String> {
    let domain = domain_of(entry);
    let labels_ok = domain
        .split('.')
        .all(|label| !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    labels_ok.then_some(domain)
}

/// The domain an entry covers: `*.example.com` and `.example.com` are `example.com`.
fn domain_of(entry: &str) -> String {
    let entry = entry.trim();
    canonical_name(entry.strip_prefix("*.").or_else(|| entry.strip_prefix('.')).unwrap_or(entry))
}

/// A host name as compared: lowercase, without a final dot or IPv6 brackets.
fn canonical_name(host: &str) -> String {
    let host = host.trim();
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// Whether `host` is `domain` or one of its subdomains (both canonical).
fn within(host: &str, domain: &str) -> bool {
    host == domain || host.strip_suffix(domain).is_some_and(|rest| rest.ends_with('.'))
}

/// What the proxy of one sandbox lets through.
#[derive(Clone, Debug)]
pub struct ProxyPolicy {
    /// The user's choice.
    pub mode: NetworkMode,
    /// Exact host and port pairs that are always reachable, even on loopback or a private network: the configured
    /// model endpoints. A request matches by the same host name (case and a final dot aside), or by the same
    /// address when both are IP literals; `localhost` does not match `127.0.0.1`.
    pub endpoints: Vec<(String, u16)>,
    /// The CLI's own service domains (each with its subdomains), reachable in [`NetworkMode::Allow`] and
    /// [`NetworkMode::Ask`] on top of the user's list.
    pub service_hosts: Vec<String>,
}

/// Why the proxy refused a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    /// In `none` mode, a target that is not a model endpoint.
    OnlyEndpoints,
    /// In `allow=` mode, a host outside the allowed and service domains.
    NotListed,
    /// In `ask` mode, a host outside the list that the user did not allow.
    Refused(Refusal),
    /// The name resolved to no address.
    Unresolved,
    /// The target is, or resolves to, an address of one of the host's own interfaces.
    HostAddress {
        /// That address.
        address: IpAddr,
        /// The interface that has it.
        interface: String,
    },
    /// The target is, or resolves to, an address the sandbox must not reach.
    Forbidden {
        /// The first such address.
        address: IpAddr,
        /// What kind of range it is in ("loopback", "private"…).
        range: &'static str,
    },
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::OnlyEndpoints => f.write_str("the network mode is none: only the configured model endpoints"),
            Denial::NotListed => f.write_str("not in the allowed domains"),
            Denial::Refused(refusal) => refusal.fmt(f),
            Denial::Unresolved => f.write_str("the name resolves to no address"),
            Denial::HostAddress { address, interface } => {
                write!(f, "{address} is an address of this host ({interface})")
            }
            Denial::Forbidden { address, range } => write!(f, "{address} is a {range} address"),
        }
    }
}

/// The verdict on one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Connect to these addresses, in this order: all of them were judged.
    Allow(Vec<SocketAddr>),
    /// Refuse the request.
    Deny(Denial),
}

/// How a target's name passed the first check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    /// A model endpoint: any address it resolves to is fine, and it is reached directly.
    Endpoint,
    /// Any other host: its addresses are judged next.
    Public,
    /// A host outside the list of `ask`: the user is asked first, then its addresses are judged as
    /// [`Admission::Public`]'s.
    Ask,
}

impl ProxyPolicy {
    /// Judges a target by its name alone, before any DNS lookup.
    fn admit(&self, host: &str, port: u16) -> Result<Admission, Denial> {
        let host = canonical_name(host);
        if self.is_endpoint(&host, port) {
            return Ok(Admission::Endpoint);
        }
        match &self.mode {
            NetworkMode::None => Err(Denial::OnlyEndpoints),
            NetworkMode::Allow(domains) | NetworkMode::Ask(domains) => {
                let mut listed = domains.iter().chain(&self.service_hosts);
                if listed.any(|domain| within(&host, &domain_of(domain))) {
                    Ok(Admission::Public)
                } else if self.mode.asks() {
                    Ok(Admission::Ask)
                } else {
                    Err(Denial::NotListed)
                }
            }
            NetworkMode::Open | NetworkMode::Host => Ok(Admission::Public),
        }
    }

    fn is_endpoint(&self, host: &str, port: u16) -> bool {
        let literal = host.parse::<IpAddr>().ok();
        self.endpoints.iter().any(|(endpoint, endpoint_port)| {
            let endpoint = canonical_name(endpoint);
            *endpoint_port == port
                && (endpoint == host || literal.is_some_and(|ip| endpoint.parse::<IpAddr>() == Ok(ip)))
        })
    }

    /// The decision on `host:port`, given every address the host resolved to (for a literal IP, that address).
    /// Pure: the proxy resolves once, calls this, and connects only to the addresses it returns. Under `ask`, a
    /// host outside the list is judged as if the user had allowed it: the proxy asks before it resolves.
    ///
    /// A model endpoint is allowed whatever it resolves to. Any other host must pass the mode, and then every
    /// address must lie outside loopback, unspecified, link-local (with the cloud metadata address), private,
    /// shared (CGNAT), multicast, broadcast and reserved ranges, IPv4 addresses wrapped in IPv6 included: one
    /// such address refuses the whole name, so a name cannot smuggle a private address next to a public one.
    pub fn decide(&self, host: &str, port: u16, resolved: &[IpAddr]) -> Decision {
        self.decide_on_host(host, port, resolved, &[])
    }

    /// [`ProxyPolicy::decide`], knowing the host's own interface addresses (`(address, interface)`): any other
    /// host that is, or resolves to, one of them is refused first, whatever range it is in (a host may have a
    /// public address, and a service bound on all interfaces answers there). The ranges are judged first, so a
    /// loopback or private address is still named as such.
    pub fn decide_on_host(
        &self,
        host: &str,
        port: u16,
        resolved: &[IpAddr],
        host_addresses: &[(IpAddr, String)],
    ) -> Decision {
        let admission = match self.admit(host, port) {
            Ok(admission) => admission,
            Err(denial) => return Decision::Deny(denial),
        };
        if resolved.is_empty() {
            return Decision::Deny(Denial::Unresolved);
        }
        if admission != Admission::Endpoint
            && let Some((address, range)) = resolved.iter().find_map(|ip| forbidden_range(*ip).map(|r| (*ip, r)))
        {
            return Decision::Deny(Denial::Forbidden { address, range });
        }
        if admission != Admission::Endpoint
            && let Some((address, interface)) = resolved.iter().find_map(|ip| {
                let ip = unwrapped(*ip);
                host_addresses.iter().find(|(own, _)| unwrapped(*own) == ip).map(|(_, name)| (ip, name.clone()))
            })
        {
            return Decision::Deny(Denial::HostAddress { address, interface });
        }
        Decision::Allow(resolved.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
    }
}

/// The kind of range an address is in when the sandbox must not reach it, `None` for a public address.
pub fn forbidden_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

/// An IPv4 address wrapped in IPv6 (mapped, or NAT64's `64:ff9b::/96`) as the IPv4 address it reaches.
fn unwrapped(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    if v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return IpAddr::V4(Ipv4Addr::from_bits(v6.to_bits() as u32));
    }
    ip
}

/// Every address of the host's interfaces, with the interface's name, read now: addresses come and go (DHCP, VPNs,
/// containers), so they are never cached. Empty when the kernel cannot be asked (logged).
pub fn host_addresses() -> std::io::Result<Vec<(IpAddr, String)>> {
    let interfaces = nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)?;
    Ok(interfaces
        .filter_map(|interface| {
            let address = interface.address?;
            let ip = match (address.as_sockaddr_in(), address.as_sockaddr_in6()) {
                (Some(v4), _) => IpAddr::V4(v4.ip()),
                (_, Some(v6)) => IpAddr::V6(v6.ip()),
                _ => return None,
            };
            Some((ip, interface.interface_name))
        })
        .collect())
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, _, _] = ip.octets();
    Some(match (a, b) {
        // Connecting to 0.0.0.0 reaches the host itself.
        (0, _) => "unspecified",
        (127, _) => "loopback",
        (10, _) | (172, 16..=31) | (192, 168) => "private",
        (100, 64..=127) => "shared (CGNAT)",
        (169, 254) => "link-local",
        (224..=239, _) => "multicast",
        _ if ip.is_broadcast() => "broadcast",
        (240..=255, _) => "reserved",
        _ => return None,
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    // An IPv4 address wrapped in IPv6 reaches that IPv4 address (mapped ::ffff:0:0/96 on a dual-stack socket,
    // NAT64's 64:ff9b::/96 through a translator), so it is judged as one.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    let segments = ip.segments();
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return forbidden_v4(Ipv4Addr::from_bits(ip.to_bits() as u32));
    }
    Some(match segments[0] {
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_unspecified() => "unspecified",
        // The deprecated IPv4-compatible ::a.b.c.d.
        0 if segments[1..6] == [0; 5] => "reserved",
        first if first & 0xffc0 == 0xfe80 => "link-local",
        first if first & 0xffc0 == 0xfec0 => "site-local",
        first if first & 0xfe00 == 0xfc00 => "private (unique local)",
        first if first & 0xff00 == 0xff00 => "multicast",
        _ => return None,
    })
}

/// A proxy that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The socket could not be prepared.
    #[error("proxy: {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// A running proxy for one sandbox. Dropping it (or [`Proxy::stop`]) stops accepting, ends the connections it
/// carries and removes its socket file.
pub struct Proxy {
    socket_path: PathBuf,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `socket_path` (replacing a stale socket there) and serves each connection in its own task.
    /// `label` names the sandbox in logs. When the bridge's own environment has `https_proxy` or `HTTPS_PROXY`
    /// (`http://[user:password@]host:port`), hosts other than the model endpoints are reached through that proxy
    /// with `CONNECT host:port`; the checks above still apply first.
    /// `budget` bounds the connections open at once; every proxy of one sandbox shares the sandbox's.
    pub async fn start(
        socket_path: &Path,
        policy: ProxyPolicy,
        label: String,
        budget: ConnectionBudget,
    ) -> Result<Proxy, ProxyError> {
        Self::start_asking(socket_path, policy, label, budget, None).await
    }

    /// [`Proxy::start`], with whom to ask about a host outside the list under `--network ask`.
    pub async fn start_asking(
        socket_path: &Path,
        policy: ProxyPolicy,
        label: String,
        budget: ConnectionBudget,
        asker: Option<Arc<dyn Asker>>,
    ) -> Result<Proxy, ProxyError> {
        let upstream = UpstreamProxy::from_env();
        if let Some(upstream) = &upstream {
            tracing::info!(label = %label, upstream = %upstream.address, "the sandbox proxy goes out through HTTPS_PROXY");
        }
        let context = Context { policy, label, upstream, fixed_dns: Vec::new(), budget, asker };
        Self::serve(socket_path, context).await
    }

    async fn serve(socket_path: &Path, context: Context) -> Result<Proxy, ProxyError> {
        let io = |what: &str, source| ProxyError::Io { what: format!("{what} {}", socket_path.display()), source };
        match std::fs::symlink_metadata(socket_path) {
            Ok(meta) if meta.file_type().is_socket() => {
                std::fs::remove_file(socket_path).map_err(|e| io("remove", e))?
            }
            Ok(_) => return Err(io("refusing to replace", std::io::Error::other("it exists and is not a socket"))),
            Err(_) => {}
        }
        let listener = UnixListener::bind(socket_path).map_err(|e| io("listen on", e))?;
        std::fs::set_permissions(socket_path, std::fs::Permissions::from_mode(0o600)).map_err(|e| io("chmod", e))?;
        let accept = tokio::spawn(accept_loop(listener, Arc::new(context)));
        Ok(Proxy { socket_path: socket_path.to_path_buf(), accept })
    }

    /// Where the proxy listens.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Stops the proxy (the same as dropping it).
    pub fn stop(self) {}
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.socket_path);
    }
}

/// What every connection of one proxy shares.
struct Context {
    policy: ProxyPolicy,
    label: String,
    upstream: Option<UpstreamProxy>,
    /// Answers used instead of DNS: tests give public names fake public addresses (there is no internet there).
    fixed_dns: Vec<(String, IpAddr)>,
    /// The connections the sandbox may still open.
    budget: ConnectionBudget,
    /// Who is asked about a host outside the list under `--network ask` (`None`: nobody, so it is refused).
    asker: Option<Arc<dyn Asker>>,
}

/// How many connections one sandbox may have open through its proxies at once, counted across all of them (a
/// sandbox runs a proxy per command, and its commands may overlap: the server, a turn's CLI).
#[derive(Clone)]
pub struct ConnectionBudget {
    permits: Arc<tokio::sync::Semaphore>,
    limit: usize,
}

impl ConnectionBudget {
    /// A budget of `limit` connections.
    pub fn new(limit: usize) -> Self {
        Self { permits: Arc::new(tokio::sync::Semaphore::new(limit)), limit }
    }
}

impl Default for ConnectionBudget {
    /// [`MAX_CONNECTIONS`].
    fn default() -> Self {
        Self::new(MAX_CONNECTIONS)
    }
}

impl Context {
    /// Why a request was denied, for the log: the user's own setting where it is the reason.
    fn explain(&self, denial: &Denial) -> String {
        match (denial, &self.policy.mode) {
            (Denial::NotListed, mode) => format!("not in --network {mode}"),
            (Denial::OnlyEndpoints, _) => "--network none allows only the configured model endpoints".into(),
            (Denial::Refused(refusal), mode) => format!("{refusal} (--network {mode})"),
            (denial, _) => denial.to_string(),
        }
    }
}

async fn accept_loop(listener: UnixListener, context: Arc<Context>) {
    // The connections live in this set, so aborting this task when the proxy stops ends them too.
    let mut connections = JoinSet::new();
    let mut refused = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => match context.budget.permits.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let context = context.clone();
                        connections.spawn(async move {
                            handle(context, client).await;
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        refused += 1;
                        let limit = context.budget.limit;
                        // Once per burst (the first, then every 1000th): a flood must not flood the log too.
                        if refused % 1000 == 1 {
                            tracing::warn!(
                                "proxy refused a connection for session {}: {limit} connections are open (the limit)",
                                context.label,
                            );
                        }
                        // One attempt, never a wait: the descriptor is closed right here whatever the client does.
                        let _ = client.try_write(too_many(limit).as_bytes());
                    }
                },
                Err(e) => {
                    tracing::warn!(label = %context.label, "sandbox proxy: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// The answer to a connection past the limit.
fn too_many(limit: usize) -> String {
    let body = format!("acp-sandbox: the sandbox already has {limit} connections open through its proxy\n");
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// What the client asked for.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    /// `CONNECT`, `GET`…
    method: String,
    /// Canonical host name or IP literal.
    host: String,
    port: u16,
    /// `None` for a tunnel (`CONNECT`); else the head to send to the target, in origin form.
    forward: Option<Vec<u8>>,
}

/// Why a connection to the target was not made.
enum Failure {
    Denied(Denial),
    Unreachable(String),
}

/// A connection to the target, and what an upstream proxy already sent past its answer.
struct Connection {
    stream: TcpStream,
    early: Vec<u8>,
}

async fn handle(context: Arc<Context>, mut client: UnixStream) {
    let (head, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Ok(read)) => read,
        Ok(Err(e)) if e.kind() == ErrorKind::InvalidData => {
            return respond(&mut client, "400 Bad Request", "the request head is larger than 64 KiB").await;
        }
        Ok(Err(_)) => return,
        Err(_) => return respond(&mut client, "408 Request Timeout", "the request head took too long").await,
    };
    let request = match parse_request(&head) {
        Ok(request) => request,
        Err(why) => return respond(&mut client, "400 Bad Request", why).await,
    };
    let (host, port) = (request.host.as_str(), request.port);
    // `--network ask`: the user's answer comes first, outside the connect's time bound (`ask.rs` bounds the wait).
    if let Err(denial) = ask_first(&context, host, port).await {
        return deny(&context, &mut client, &request, denial).await;
    }
    let mut target = match tokio::time::timeout(CONNECT_TIMEOUT, connect(&context, host, port)).await {
        Ok(Ok(target)) => target,
        Ok(Err(Failure::Denied(denial))) => return deny(&context, &mut client, &request, denial).await,
        Ok(Err(Failure::Unreachable(why))) => {
            tracing::debug!(label = %context.label, host, port, "sandbox proxy: {why}");
            return respond(&mut client, "502 Bad Gateway", &why).await;
        }
        Err(_) => {
            let message = format!("connecting to {} took too long", authority(host, port));
            return respond(&mut client, "504 Gateway Timeout", &message).await;
        }
    };
    tracing::debug!(label = %context.label, host, port, "sandbox proxy: connected");
    let opening = match &request.forward {
        Some(forward) => target.stream.write_all(forward).await,
        None => client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await,
    };
    if opening.is_err()
        || target.stream.write_all(&rest).await.is_err()
        || client.write_all(&target.early).await.is_err()
    {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut target.stream).await;
}

/// Refuses the request with a 403 that says why, and logs it with the host.
async fn deny(context: &Context, client: &mut UnixStream, request: &Request, denial: Denial) {
    let target = authority(&request.host, request.port);
    tracing::warn!(
        "proxy denied {} {target} for session {}: {}",
        request.method,
        context.label,
        context.explain(&denial)
    );
    respond(client, "403 Forbidden", &format!("access to {target} is blocked: {denial}")).await
}

/// Under `--network ask`, asks about a host outside the list (by its name alone, before any lookup). `Ok` when
/// the host needs no question or the user allowed it; everything else about the target is judged afterwards.
async fn ask_first(context: &Context, host: &str, port: u16) -> Result<(), Denial> {
    if context.policy.admit(host, port) != Ok(Admission::Ask) {
        return Ok(());
    }
    let Some(asker) = &context.asker else { return Err(Denial::Refused(Refusal::NoAsker)) };
    match asker.ask(&context.label, host, port).await {
        Verdict::Allowed => {
            tracing::info!(label = %context.label, "proxy: the user allowed {}", authority(host, port));
            Ok(())
        }
        Verdict::Refused(refusal) => Err(Denial::Refused(refusal)),
    }
}

/// Judges the target, resolving it once, and connects to an address that was judged.
async fn connect(context: &Context, host: &str, port: u16) -> Result<Connection, Failure> {
    let admission = context.policy.admit(host, port).map_err(Failure::Denied)?;
    let resolved = resolve(context, host, port).await?;
    // After the lookup, so the list is as fresh as the answer; without it nothing but an endpoint is reached.
    let own = match (admission, host_addresses()) {
        (Admission::Endpoint, _) => Vec::new(),
        (Admission::Public | Admission::Ask, Ok(own)) => own,
        (Admission::Public | Admission::Ask, Err(e)) => {
            return Err(Failure::Unreachable(format!("cannot list the host's own addresses to exclude them: {e}")));
        }
    };
    let addresses = match context.policy.decide_on_host(host, port, &resolved, &own) {
        Decision::Allow(addresses) => addresses,
        Decision::Deny(denial) => return Err(Failure::Denied(denial)),
    };
    // The bridge's own proxy gets the name, which its rules are written for, and resolves it again: past the checks
    // here, where a public host goes is that proxy's policy. Endpoints (usually on loopback) never go through it.
    if let (Some(upstream), Admission::Public | Admission::Ask) = (&context.upstream, admission) {
        return upstream.tunnel(host, port).await;
    }
    let mut last_error = None;
    for address in addresses {
        match TcpStream::connect(address).await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(Connection { stream, early: Vec::new() });
            }
            Err(e) => last_error = Some(e),
        }
    }
    let why = last_error.map(|e| e.to_string()).unwrap_or_default();
    Err(Failure::Unreachable(format!("cannot connect to {}: {why}", authority(host, port))))
}

async fn resolve(context: &Context, host: &str, port: u16) -> Result<Vec<IpAddr>, Failure> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let fixed: Vec<IpAddr> = context.fixed_dns.iter().filter(|(name, _)| name == host).map(|(_, ip)| *ip).collect();
    if !fixed.is_empty() {
        return Ok(fixed);
    }
    match tokio::net::lookup_host((host, port)).await {
        Ok(found) => Ok(found.map(|address| address.ip()).collect()),
        Err(e) => Err(Failure::Unreachable(format!("cannot resolve {host}: {e}"))),
    }
}

/// The proxy the bridge itself must use to reach the internet.
#[derive(Clone, Debug)]
struct UpstreamProxy {
    /// `host:port`, resolved when connecting (it is the user's own configuration, not the sandbox's request).
    address: String,
    /// The `Proxy-Authorization` value, from the URL's user and password.
    authorization: Option<String>,
}

impl UpstreamProxy {
    fn from_env() -> Option<Self> {
        let url = ["https_proxy", "HTTPS_PROXY"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|url| !url.trim().is_empty()))?;
        let parsed = Self::parse(url.trim());
        if parsed.is_none() {
            tracing::warn!("HTTPS_PROXY is not an http://host:port URL; the sandbox proxy connects directly");
        }
        parsed
    }

    fn parse(url: &str) -> Option<Self> {
        let rest = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some(_) => return None,
            None => url,
        };
        let rest = rest.split('/').next().unwrap_or_default();
        let (user, address) = match rest.rsplit_once('@') {
            Some((user, address)) => (Some(user), address),
            None => (None, rest),
        };
        let (host, port) = split_authority(address, Some(80))?;
        let authorization = user.map(|user| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(percent_encoding::percent_decode_str(user).collect::<Vec<u8>>())
            )
        });
        Some(UpstreamProxy { address: authority(&host, port), authorization })
    }

    async fn tunnel(&self, host: &str, port: u16) -> Result<Connection, Failure> {
        let failed = |why: String| Failure::Unreachable(format!("the upstream proxy {}: {why}", self.address));
        let mut stream = TcpStream::connect(&self.address).await.map_err(|e| failed(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let target = authority(host, port);
        let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(authorization) = &self.authorization {
            request.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await.map_err(|e| failed(e.to_string()))?;
        let (head, early) = read_head(&mut stream).await.map_err(|e| failed(e.to_string()))?;
        if status_code(&head) != Some(200) {
            return Err(failed(format!("answered {}", String::from_utf8_lossy(crate::lines::first_line(&head)))));
        }
        Ok(Connection { stream, early })
    }
}

/// Reads a head up to its blank line. Returns the head (blank line included) and what was read past it. Fails with
/// `InvalidData` past [`MAX_HEAD`] and `UnexpectedEof` when the peer closes first.
pub(crate) async fn read_head<R: AsyncRead + Unpin>(reader: &mut R) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let read = reader.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "closed before the end of the head"));
        }
        // The blank line may straddle two reads.
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..read]);
        let end = head[from..].windows(4).position(|w| w == b"\r\n\r\n").map(|at| from + at + 4);
        if let Some(end) = end.filter(|end| *end <= MAX_HEAD) {
            let rest = head.split_off(end);
            return Ok((head, rest));
        }
        if end.is_some() || head.len() > MAX_HEAD {
            return Err(std::io::Error::new(ErrorKind::InvalidData, "the head is too large"));
        }
    }
}

/// The status code of a response head (`HTTP/1.1 200 Connection established`).
pub(crate) fn status_code(head: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(crate::lines::first_line(head)).ok()?;
    let mut parts = line.split(' ');
    parts.next().filter(|version| version.starts_with("HTTP/1."))?;
    parts.next()?.parse().ok()
}

/// Parses a request head: `CONNECT host:port`, or an absolute `http://` URI whose head is rewritten for the
/// target. The rewritten head has the path in origin form, `Host` from the URI, no proxy or hop-by-hop headers,
/// and `Connection: close`: one request per connection, so a later request to another host can never ride on a
/// connection that was judged for this one.
fn parse_request(head: &[u8]) -> Result<Request, &'static str> {
    std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8")?;
    // httparse also ends a line at a bare LF and skips empty lines before the request line. Neither is let
    // through: what the target reads as the head must be exactly what was judged here.
    let bare = head.iter().enumerate().any(|(at, &b)| match b {
        b'\n' => at == 0 || head[at - 1] != b'\r',
        b'\r' => head.get(at + 1) != Some(&b'\n'),
        _ => false,
    });
    if bare {
        return Err("a line of the request head does not end with CRLF");
    }
    if head.starts_with(b"\r\n") {
        return Err("malformed request line");
    }
    // Every header is a line of its own, so there are never more headers than line ends.
    let mut headers = vec![httparse::EMPTY_HEADER; head.iter().filter(|&&b| b == b'\n').count()];
    let mut parsed = httparse::Request::new(&mut headers);
    match parsed.parse(head) {
        Ok(httparse::Status::Complete(length)) if length == head.len() => {}
        Err(httparse::Error::HeaderName | httparse::Error::HeaderValue) => return Err("malformed header line"),
        _ => return Err("malformed request line"),
    }
    let (Some(method), Some(target), Some(minor)) = (parsed.method, parsed.path, parsed.version) else {
        return Err("malformed request line");
    };
    let version = if minor == 1 { "HTTP/1.1" } else { "HTTP/1.0" };
    if method == "CONNECT" {
        let (host, port) = split_authority(target, None).ok_or("CONNECT needs host:port")?;
        return Ok(Request { method: method.into(), host, port, forward: None });
    }
    let rest = target
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case("http://"))
        .map(|_| &target[7..])
        .ok_or("the proxy takes CONNECT host:port or an absolute http:// URI")?;
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (uri_authority, path) = rest.split_at(split);
    if uri_authority.contains('@') {
        return Err("the URI must not carry credentials");
    }
    let (host, port) = split_authority(uri_authority, Some(80)).ok_or("the URI has no valid host")?;
    let path = match path {
        "" => "/".to_string(),
        query if query.starts_with('?') => format!("/{query}"),
        path => path.to_string(),
    };
    let mut forward = format!("{method} {path} {version}\r\nHost: {uri_authority}\r\n");
    const HOP_BY_HOP: [&str; 5] = ["host", "connection", "proxy-connection", "proxy-authorization", "keep-alive"];
    for header in parsed.headers.iter() {
        if !HOP_BY_HOP.iter().any(|hop| header.name.eq_ignore_ascii_case(hop)) {
            let value = std::str::from_utf8(header.value).map_err(|_| "the request head is not UTF-8")?;
            forward.push_str(header.name);
            forward.push(':');
            if !value.is_empty() {
                forward.push(' ');
                forward.push_str(value);
            }
            forward.push_str("\r\n");
        }
    }
    forward.push_str("Connection: close\r\n\r\n");
    Ok(Request { method: method.into(), host, port, forward: Some(forward.into_bytes()) })
}

/// Splits `host:port`, `[v6]:port` (or, with a default port, a bare host) into a canonical host and a port.
fn split_authority(text: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = match text.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']')?;
            host.parse::<Ipv6Addr>().ok()?;
            let port = if after.is_empty() { None } else { Some(after.strip_prefix(':')?) };
            (host, port)
        }
        None => match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        },
    };
    let port = match port {
        Some(port) if port.bytes().all(|b| b.is_ascii_digit()) => port.parse::<u16>().ok().filter(|p| *p != 0)?,
        Some(_) => return None,
        None => default_port?,
    };
    let host = canonical_name(host);
    let valid = host.parse::<Ipv6Addr>().is_ok()
        || (!host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)));
    valid.then_some((host, port))
}

/// `host:port`, with brackets around an IPv6 literal.
pub fn authority(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// Answers with a one-line plain-text body and closes.
async fn respond<W: AsyncWrite + Unpin>(client: &mut W, status: &str, message: &str) {
    let body = format!("acp-sandbox: {message}\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn policy(mode: NetworkMode, endpoints: &[(&str, u16)]) -> ProxyPolicy {
        ProxyPolicy {
            mode,
            endpoints: endpoints.iter().map(|(host, port)| (host.to_string(), *port)).collect(),
            service_hosts: vec!["opencode.ai".into()],
        }
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    /// A TCP server on 127.0.0.1 that echoes every connection.
    pub(crate) async fn echo_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut reader, mut writer) = stream.split();
                    let _ = tokio::io::copy(&mut reader, &mut writer).await;
                });
            }
        });
        port
    }

    /// A corporate proxy on 127.0.0.1 (its port): records each request head, then tunnels to the echo server on
    /// `echo` whatever the target.
    async fn corporate_proxy(echo: u16) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let corporate = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = corporate.local_addr().unwrap().port();
        let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = corporate.accept().await {
                let (head, _) = read_head(&mut client).await.unwrap();
                seen_tx.send(String::from_utf8(head).unwrap()).unwrap();
                let mut target = TcpStream::connect(("127.0.0.1", echo)).await.unwrap();
                client.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
                tokio::spawn(async move { tokio::io::copy_bidirectional(&mut client, &mut target).await });
            }
        });
        (port, seen)
    }

    async fn start(dir: &tempfile::TempDir, policy: ProxyPolicy) -> Proxy {
        Proxy::start(&dir.path().join("proxy.sock"), policy, "test".into(), ConnectionBudget::default()).await.unwrap()
    }

    /// Sends `request` and returns the answer's head, what followed it, and the connection.
    async fn ask(proxy: &Proxy, request: &[u8]) -> (String, Vec<u8>, UnixStream) {
        let mut stream = UnixStream::connect(proxy.socket_path()).await.unwrap();
        stream.write_all(request).await.unwrap();
        let (head, rest) = read_head(&mut stream).await.unwrap();
        (String::from_utf8(head).unwrap(), rest, stream)
    }

    /// The whole answer to `request`, read to the end.
    async fn reply(proxy: &Proxy, request: &str) -> String {
        let mut stream = UnixStream::connect(proxy.socket_path()).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[test]
    fn network_modes_parse_and_display() {
        for (text, mode) in [
            ("open", NetworkMode::Open),
            ("none", NetworkMode::None),
            ("host", NetworkMode::Host),
            ("allow=a.com,b.org", NetworkMode::Allow(vec!["a.com".into(), "b.org".into()])),
            ("allow=*.A.com, .b.org,c.net.,", NetworkMode::Allow(vec!["a.com".into(), "b.org".into(), "c.net".into()])),
            ("ask", NetworkMode::Ask(Vec::new())),
            ("ask=", NetworkMode::Ask(Vec::new())),
            ("ask=*.A.com,b.org", NetworkMode::Ask(vec!["a.com".into(), "b.org".into()])),
        ] {
            let parsed: NetworkMode = text.parse().unwrap();
            assert_eq!(parsed, mode, "{text}");
            assert_eq!(parsed.to_string().parse::<NetworkMode>().unwrap(), mode);
        }
        assert_eq!(NetworkMode::Allow(vec!["a.com".into(), "b.org".into()]).to_string(), "allow=a.com,b.org");
        assert_eq!("closed".parse::<NetworkMode>(), Err(NetworkModeError::Unknown("closed".into())));
        assert_eq!("allow=".parse::<NetworkMode>(), Err(NetworkModeError::EmptyAllowList));
        for bad in ["a.com:443", "http://a.com", "*", "a..com", "*.*.a.com", "a b.com"] {
            let error = format!("allow={bad}").parse::<NetworkMode>().unwrap_err();
            assert_eq!(error, NetworkModeError::InvalidDomain(bad.into()));
        }
        assert!(!NetworkMode::Host.uses_proxy() && NetworkMode::None.uses_proxy());
        assert_eq!(NetworkMode::Ask(vec!["a.com".into()]).to_string(), "ask=a.com");
        assert_eq!("ask=a.com:443".parse::<NetworkMode>(), Err(NetworkModeError::InvalidDomain("a.com:443".into())));
        assert!(NetworkMode::Ask(Vec::new()).uses_proxy() && NetworkMode::Ask(Vec::new()).asks());
        assert!(!"allow=a.com".parse::<NetworkMode>().unwrap().asks());
    }

    /// An [`Asker`] that answers from a list and records what it was asked, after waiting for `gate`.
    struct Answers {
        allowed: Vec<&'static str>,
        asked: std::sync::Mutex<Vec<(String, String)>>,
        gate: tokio::sync::Semaphore,
    }

    #[async_trait::async_trait]
    impl Asker for Answers {
        async fn ask(&self, label: &str, host: &str, port: u16) -> Verdict {
            self.asked.lock().unwrap().push((label.to_string(), authority(host, port)));
            let _open = self.gate.acquire().await.unwrap();
            if self.allowed.contains(&host) { Verdict::Allowed } else { Verdict::Refused(Refusal::ByUser) }
        }
    }

    #[tokio::test]
    async fn ask_mode_asks_by_name_before_any_lookup_and_judges_an_allowed_host_like_any_other() {
        let echo = echo_server().await;
        // The "internet" of this test.
        let (corporate_port, mut seen) = corporate_proxy(echo).await;
        let answers = Arc::new(Answers {
            allowed: vec!["yes.example", "private.example"],
            asked: Default::default(),
            gate: tokio::sync::Semaphore::new(0),
        });
        let dir = tempfile::tempdir().unwrap();
        let context = Context {
            policy: policy("ask=listed.example".parse().unwrap(), &[("127.0.0.1", echo)]),
            label: "sess".into(),
            upstream: UpstreamProxy::parse(&format!("http://127.0.0.1:{corporate_port}")),
            fixed_dns: ["yes.example", "listed.example", "api.opencode.ai"]
                .iter()
                .map(|name| (name.to_string(), "93.184.216.34".parse().unwrap()))
                .chain([("private.example".to_string(), "10.0.0.7".parse().unwrap())])
                .collect(),
            budget: ConnectionBudget::default(),
            asker: Some(answers.clone()),
        };
        let proxy = Proxy::serve(&dir.path().join("proxy.sock"), context).await.unwrap();
        // Listed, a service host, the endpoint: never asked.
        for target in ["listed.example:443", "api.opencode.ai:443", &format!("127.0.0.1:{echo}")] {
            let (head, _, _) = ask(&proxy, format!("CONNECT {target} HTTP/1.1\r\n\r\n").as_bytes()).await;
            assert!(head.starts_with("HTTP/1.1 200 "), "{target}: {head}");
        }
        assert!(answers.asked.lock().unwrap().is_empty());
        assert!(seen.recv().await.unwrap().starts_with("CONNECT listed.example:443 HTTP/1.1\r\n"));
        assert!(seen.recv().await.unwrap().starts_with("CONNECT api.opencode.ai:443 HTTP/1.1\r\n"));
        // An unlisted host waits for the answer; refused, it is never looked up or reached.
        answers.gate.add_permits(3);
        let (head, _, mut stream) = ask(&proxy, b"CONNECT yes.example:443 HTTP/1.1\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        stream.write_all(b"ping").await.unwrap();
        let mut pong = [0u8; 4];
        stream.read_exact(&mut pong).await.unwrap();
        assert_eq!(&pong, b"ping");
        assert!(seen.recv().await.unwrap().starts_with("CONNECT yes.example:443 HTTP/1.1\r\n"));
        let refused = reply(&proxy, "GET http://no.example:8080/x HTTP/1.1\r\n\r\n").await;
        let body = "acp-sandbox: access to no.example:8080 is blocked: refused by the user\n";
        assert!(refused.starts_with("HTTP/1.1 403 Forbidden\r\n") && refused.ends_with(body), "{refused}");
        // Allowed by the user, a private address is still refused.
        let private = reply(&proxy, "CONNECT private.example:443 HTTP/1.1\r\n\r\n").await;
        assert!(private.ends_with("is blocked: 10.0.0.7 is a private address\n"), "{private}");
        let asked = answers.asked.lock().unwrap().clone();
        let expected = [("sess", "yes.example:443"), ("sess", "no.example:8080"), ("sess", "private.example:443")];
        assert_eq!(asked, expected.map(|(l, t)| (l.to_string(), t.to_string())));
        drop(proxy);
        assert!(seen.try_recv().is_err(), "a refused host went out");
    }

    #[tokio::test]
    async fn ask_mode_without_an_asker_refuses_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let proxy = start(&dir, policy(NetworkMode::Ask(Vec::new()), &[])).await;
        let answer = reply(&proxy, "CONNECT example.com:443 HTTP/1.1\r\n\r\n").await;
        assert!(answer.ends_with("access to example.com:443 is blocked: nobody can be asked here\n"), "{answer}");
    }

    #[test]
    fn an_allowed_domain_covers_itself_and_its_subdomains_only() {
        let policy = policy("allow=example.com".parse().unwrap(), &[]);
        let public = ips(&["93.184.216.34"]);
        for host in ["example.com", "EXAMPLE.com.", "api.example.com", "a.b.example.com", "www.opencode.ai"] {
            assert!(matches!(policy.decide(host, 443, &public), Decision::Allow(_)), "{host}");
        }
        for host in ["badexample.com", "example.com.evil.org", "example.org", "com", "93.184.216.34"] {
            assert_eq!(policy.decide(host, 443, &public), Decision::Deny(Denial::NotListed), "{host}");
        }
    }

    #[test]
    fn every_forbidden_range_is_denied() {
        let table = [
            ("127.0.0.1", Some("loopback")),
            ("127.255.0.9", Some("loopback")),
            ("0.0.0.0", Some("unspecified")),
            ("0.1.2.3", Some("unspecified")),
            ("169.254.169.254", Some("link-local")),
            ("169.254.0.1", Some("link-local")),
            ("10.1.2.3", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("192.168.1.1", Some("private")),
            ("100.64.0.1", Some("shared (CGNAT)")),
            ("100.127.255.255", Some("shared (CGNAT)")),
            ("224.0.0.1", Some("multicast")),
            ("239.255.255.250", Some("multicast")),
            ("255.255.255.255", Some("broadcast")),
            ("240.0.0.1", Some("reserved")),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            ("::127.0.0.1", Some("reserved")),
            ("fe80::1", Some("link-local")),
            ("febf::1", Some("link-local")),
            ("fec0::1", Some("site-local")),
            ("fc00::1", Some("private (unique local)")),
            ("fd12:3456::1", Some("private (unique local)")),
            ("ff02::1", Some("multicast")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:0.0.0.0", Some("unspecified")),
            ("::ffff:169.254.169.254", Some("link-local")),
            ("::ffff:10.0.0.1", Some("private")),
            ("::ffff:172.20.0.1", Some("private")),
            ("::ffff:192.168.0.1", Some("private")),
            ("::ffff:100.100.0.1", Some("shared (CGNAT)")),
            ("::ffff:224.0.0.1", Some("multicast")),
            ("::ffff:255.255.255.255", Some("broadcast")),
            ("64:ff9b::10.0.0.1", Some("private")),
            ("64:ff9b::127.0.0.1", Some("loopback")),
            // Public neighbours of the ranges above.
            ("93.184.216.34", None),
            ("172.15.255.255", None),
            ("172.32.0.0", None),
            ("100.63.255.255", None),
            ("100.128.0.0", None),
            ("169.253.255.255", None),
            ("192.169.0.1", None),
            ("11.0.0.1", None),
            ("223.255.255.255", None),
            ("::ffff:93.184.216.34", None),
            ("64:ff9b::93.184.216.34", None),
            ("2606:2800:220:1:248:1893:25c8:1946", None),
            ("fe7f::1", None),
            ("fbff::1", None),
        ];
        let open = policy(NetworkMode::Open, &[]);
        for (ip, range) in table {
            let address: IpAddr = ip.parse().unwrap();
            assert_eq!(forbidden_range(address), range, "{ip}");
            let decision = open.decide("some.host", 443, &[address]);
            match range {
                Some(range) => assert_eq!(decision, Decision::Deny(Denial::Forbidden { address, range }), "{ip}"),
                None => assert_eq!(decision, Decision::Allow(vec![SocketAddr::new(address, 443)]), "{ip}"),
            }
            // A literal IP is judged like a name that resolved to it.
            assert_eq!(open.decide(ip, 443, &[address]), decision, "{ip}");
        }
    }

    #[test]
    fn one_forbidden_address_denies_the_whole_name() {
        let open = policy(NetworkMode::Open, &[]);
        let decision = open.decide("rebind.example", 443, &ips(&["93.184.216.34", "169.254.169.254"]));
        let address = "169.254.169.254".parse().unwrap();
        assert_eq!(decision, Decision::Deny(Denial::Forbidden { address, range: "link-local" }));
        assert_eq!(open.decide("nothing.example", 443, &[]), Decision::Deny(Denial::Unresolved));
        let both = ips(&["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]);
        let expected = both.iter().map(|ip| SocketAddr::new(*ip, 80)).collect();
        assert_eq!(open.decide("example.com", 80, &both), Decision::Allow(expected));
    }

    #[test]
    fn endpoints_are_allowed_by_exact_host_and_port_in_every_mode() {
        let endpoints = [("127.0.0.1", 11434), ("LocalHost", 8080), ("::1", 9000), ("models.lan", 443)];
        for mode in [NetworkMode::Open, NetworkMode::None, "allow=example.com".parse().unwrap()] {
            let policy = policy(mode, &endpoints);
            let loopback = ips(&["127.0.0.1"]);
            let allowed =
                |host, port, resolved: &[IpAddr]| matches!(policy.decide(host, port, resolved), Decision::Allow(_));
            assert!(allowed("127.0.0.1", 11434, &loopback));
            assert!(allowed("localhost", 8080, &ips(&["::1", "127.0.0.1"])));
            assert!(allowed("[::1]", 9000, &ips(&["::1"])));
            assert!(allowed("0:0::1", 9000, &ips(&["::1"])));
            assert!(allowed("models.lan", 443, &ips(&["192.168.1.20"])));
            // Another port, another name for the same address, or a wrapped form are not the endpoint.
            assert!(!allowed("127.0.0.1", 11435, &loopback));
            assert!(!allowed("localhost", 11434, &loopback));
            assert!(!allowed("::ffff:127.0.0.1", 11434, &ips(&["::ffff:127.0.0.1"])));
        }
    }

    #[test]
    fn none_mode_admits_only_the_endpoints() {
        let none = policy(NetworkMode::None, &[("127.0.0.1", 11434)]);
        let public = ips(&["93.184.216.34"]);
        assert_eq!(none.decide("example.com", 443, &public), Decision::Deny(Denial::OnlyEndpoints));
        assert_eq!(none.decide("opencode.ai", 443, &public), Decision::Deny(Denial::OnlyEndpoints));
        assert_eq!(none.decide("93.184.216.34", 443, &public), Decision::Deny(Denial::OnlyEndpoints));
        assert!(matches!(none.decide("127.0.0.1", 11434, &ips(&["127.0.0.1"])), Decision::Allow(_)));
    }

    #[test]
    fn request_heads_are_parsed_and_rewritten_for_the_target() {
        let connect = parse_request(b"CONNECT Api.Example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(
            connect,
            Request { method: "CONNECT".into(), host: "api.example.com".into(), port: 443, forward: None }
        );
        let v6 = parse_request(b"CONNECT [::1]:8080 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 8080));
        let get = parse_request(
            b"GET http://example.com?q=1 HTTP/1.1\r\nHost: other\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        assert_eq!((get.host.as_str(), get.port), ("example.com", 80));
        let forward = String::from_utf8(get.forward.unwrap()).unwrap();
        assert_eq!(forward, "GET /?q=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n");
        for bad in [
            "GET /path HTTP/1.1\r\n\r\n",
            "GET https://example.com/ HTTP/1.1\r\n\r\n",
            "GET http://user@example.com/ HTTP/1.1\r\n\r\n",
            "GET http:///path HTTP/1.1\r\n\r\n",
            "CONNECT example.com HTTP/1.1\r\n\r\n",
            "CONNECT example.com:0 HTTP/1.1\r\n\r\n",
            "CONNECT example.com:99999 HTTP/1.1\r\n\r\n",
            "CONNECT exa mple.com:443 HTTP/1.1\r\n\r\n",
            "CONNECT fe80::1%eth0:443 HTTP/1.1\r\n\r\n",
            "CONNECT example.com:443 HTTP/2\r\n\r\n",
            "CONNECT example.com:443 HTTP/1.1\r\nBad Header: x\r\n\r\n",
            "CONNECT example.com:443 HTTP/1.1\r\n folded\r\n\r\n",
            "CONNECT example.com:443 HTTP/1.1\r\nX: a\nInjected: b\r\n\r\n",
            "NONSENSE\r\n\r\n",
        ] {
            assert!(parse_request(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    /// What a lenient parser would take, and a target might read otherwise than the proxy judged it, is refused.
    #[test]
    fn request_heads_are_read_strictly() {
        for bad in [
            "\r\nCONNECT example.com:443 HTTP/1.1\r\n\r\n",
            "CONNECT example.com:443 HTTP/1.1\n\n",
            "CONNECT example.com:443 HTTP/1.1\r\nX: a\rInjected: b\r\n\r\n",
            "CONNECT  example.com:443 HTTP/1.1\r\n\r\n",
            "CONNECT example.com:443 HTTP/1.1\r\nX: a\u{1}b\r\n\r\n",
            "GET http://example.com/\u{7f} HTTP/1.1\r\n\r\n",
            "CONNECT example.com:443 HTTP/1.1\r\nX : a\r\n\r\n",
        ] {
            assert!(parse_request(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let get = parse_request(b"GET http://example.com/a HTTP/1.0\r\nX-Empty:\r\nAccept:*/*  \r\n\r\n").unwrap();
        let forward = String::from_utf8(get.forward.unwrap()).unwrap();
        assert_eq!(
            forward,
            "GET /a HTTP/1.0\r\nHost: example.com\r\nX-Empty:\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn the_upstream_proxy_url_is_understood() {
        let upstream = UpstreamProxy::parse("http://user:p%40ss@proxy.corp:3128/").unwrap();
        assert_eq!(upstream.address, "proxy.corp:3128");
        assert_eq!(upstream.authorization.as_deref(), Some("Basic dXNlcjpwQHNz"));
        let literal = UpstreamProxy::parse("http://u:50%zz@proxy.corp:3128").unwrap();
        assert_eq!(literal.authorization.as_deref(), Some("Basic dTo1MCV6eg=="), "what is not an escape stays");
        let bare = UpstreamProxy::parse("proxy.corp").unwrap();
        assert_eq!((bare.address.as_str(), bare.authorization), ("proxy.corp:80", None));
        assert!(UpstreamProxy::parse("socks5://proxy.corp:1080").is_none());
    }

    #[tokio::test]
    async fn a_tunnel_to_an_endpoint_carries_every_byte() {
        let echo = echo_server().await;
        let dir = tempfile::tempdir().unwrap();
        let proxy = start(&dir, policy(NetworkMode::None, &[("127.0.0.1", echo)])).await;
        // Bytes sent right behind the request (a TLS hello, say) must not be lost.
        let request = format!("CONNECT 127.0.0.1:{echo} HTTP/1.1\r\nHost: 127.0.0.1:{echo}\r\n\r\nearly");
        let (head, rest, stream) = ask(&proxy, request.as_bytes()).await;
        assert_eq!(head, "HTTP/1.1 200 Connection established\r\n\r\n");
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 256) as u8).collect();
        let (mut reader, mut writer) = stream.into_split();
        let sent = payload.clone();
        let writing = tokio::spawn(async move {
            writer.write_all(&sent).await.unwrap();
            writer.shutdown().await.unwrap();
        });
        let mut echoed = rest;
        reader.read_to_end(&mut echoed).await.unwrap();
        writing.await.unwrap();
        assert_eq!(&echoed[..5], b"early");
        assert!(echoed[5..] == payload[..], "the echo differs");
    }

    #[tokio::test]
    async fn loopback_that_is_not_an_endpoint_is_denied_with_403() {
        let (echo, other) = (echo_server().await, echo_server().await);
        let dir = tempfile::tempdir().unwrap();
        let proxy = start(&dir, policy(NetworkMode::Open, &[("127.0.0.1", echo)])).await;
        let answer = reply(&proxy, &format!("CONNECT 127.0.0.1:{other} HTTP/1.1\r\n\r\n")).await;
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        assert!(
            answer.ends_with(&format!(
                "\r\n\r\nacp-sandbox: access to 127.0.0.1:{other} is blocked: 127.0.0.1 is a loopback address\n"
            )),
            "{answer}"
        );
        for target in [format!("localhost:{echo}"), format!("[::ffff:127.0.0.1]:{echo}"), format!("0.0.0.0:{echo}")] {
            let answer = reply(&proxy, &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
            assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{target}: {answer}");
        }
        let answer = reply(&proxy, &format!("GET http://127.0.0.1:{other}/ HTTP/1.1\r\n\r\n")).await;
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    }

    #[tokio::test]
    async fn none_mode_denies_everything_but_the_endpoints() {
        let (echo, other) = (echo_server().await, echo_server().await);
        let dir = tempfile::tempdir().unwrap();
        let proxy = start(&dir, policy(NetworkMode::None, &[("127.0.0.1", echo)])).await;
        let (head, _, _) = ask(&proxy, format!("CONNECT 127.0.0.1:{echo} HTTP/1.1\r\n\r\n").as_bytes()).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        // The names are refused before any lookup: there is no DNS here.
        for target in [format!("127.0.0.1:{other}"), "example.com:443".into(), "opencode.ai:443".into()] {
            let answer = reply(&proxy, &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
            assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{target}: {answer}");
            assert!(answer.contains("only the configured model endpoints"), "{answer}");
        }
    }

    #[tokio::test]
    async fn an_absolute_uri_request_reaches_the_endpoint_in_origin_form() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let (head, mut body) = read_head(&mut stream).await.unwrap();
            while body.len() < 5 {
                let mut more = [0u8; 16];
                let read = stream.read(&mut more).await.unwrap();
                body.extend_from_slice(&more[..read]);
            }
            stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").await.unwrap();
            (String::from_utf8(head).unwrap(), body)
        });
        let dir = tempfile::tempdir().unwrap();
        let proxy = start(&dir, policy(NetworkMode::None, &[("127.0.0.1", port)])).await;
        let request = format!(
            "POST http://127.0.0.1:{port}/v1/chat?x=1 HTTP/1.1\r\nHost: elsewhere\r\nProxy-Connection: keep-alive\r\n\
             Proxy-Authorization: Basic c2VjcmV0\r\nContent-Length: 5\r\n\r\nhello"
        );
        let answer = reply(&proxy, &request).await;
        assert_eq!(answer, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        let (head, body) = server.await.unwrap();
        assert_eq!(
            head,
            format!(
                "POST /v1/chat?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"
            )
        );
        assert_eq!(body, b"hello");
    }

    #[tokio::test]
    async fn bad_requests_get_400() {
        let dir = tempfile::tempdir().unwrap();
        let proxy = start(&dir, policy(NetworkMode::Open, &[])).await;
        let huge = format!("CONNECT example.com:443 HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        for request in ["GET /index.html HTTP/1.1\r\nHost: example.com\r\n\r\n", "hello\r\n\r\n", huge.as_str()] {
            let answer = reply(&proxy, request).await;
            assert!(answer.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{answer}");
        }
    }

    #[tokio::test]
    async fn public_hosts_go_through_the_bridges_own_proxy() {
        let echo = echo_server().await;
        let (corporate_port, mut seen) = corporate_proxy(echo).await;
        let dir = tempfile::tempdir().unwrap();
        let context = Context {
            policy: policy("allow=example.com".parse().unwrap(), &[("127.0.0.1", echo)]),
            label: "test".into(),
            upstream: UpstreamProxy::parse(&format!("http://user:p%40ss@127.0.0.1:{corporate_port}")),
            fixed_dns: vec![
                ("api.example.com".into(), "93.184.216.34".parse().unwrap()),
                ("private.example.com".into(), "10.0.0.7".parse().unwrap()),
            ],
            budget: ConnectionBudget::default(),
            asker: None,
        };
        let proxy = Proxy::serve(&dir.path().join("proxy.sock"), context).await.unwrap();

        let (head, _, mut stream) = ask(&proxy, b"CONNECT api.example.com:443 HTTP/1.1\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        stream.write_all(b"ping").await.unwrap();
        let mut pong = [0u8; 4];
        stream.read_exact(&mut pong).await.unwrap();
        assert_eq!(&pong, b"ping");
        assert_eq!(
            seen.recv().await.unwrap(),
            "CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\nProxy-Authorization: Basic dXNlcjpwQHNz\r\n\r\n"
        );

        // The endpoint is reached directly; the checks still come first for everything else.
        let (head, _, _) = ask(&proxy, format!("CONNECT 127.0.0.1:{echo} HTTP/1.1\r\n\r\n").as_bytes()).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        for (target, reason) in
            [("other.org:443", "not in the allowed domains"), ("private.example.com:443", "private")]
        {
            let answer = reply(&proxy, &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
            assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n") && answer.contains(reason), "{answer}");
        }
        drop(proxy);
        assert!(seen.try_recv().is_err(), "only the public host went through the corporate proxy");
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_the_socket_goes_with_the_proxy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let proxy = start(&dir, policy(NetworkMode::Open, &[])).await;
        assert!(UnixStream::connect(&path).await.is_ok());
        proxy.stop();
        assert!(!path.exists());
        assert!(UnixStream::connect(&path).await.is_err());

        std::fs::write(&path, "not a socket").unwrap();
        let error = Proxy::start(&path, policy(NetworkMode::Open, &[]), "test".into(), ConnectionBudget::default())
            .await
            .err()
            .unwrap();
        assert!(error.to_string().contains("not a socket"), "{error}");
    }

    #[test]
    fn the_hosts_own_addresses_are_denied_in_any_form_and_range() {
        let own: Vec<(IpAddr, String)> = vec![
            ("192.0.2.2".parse().unwrap(), "eth0".into()),
            ("2001:db8::2".parse().unwrap(), "eth0".into()),
            ("93.184.216.99".parse().unwrap(), "wlan0".into()),
        ];
        let open = policy(NetworkMode::Open, &[("93.184.216.99", 8080)]);
        for (host, resolved, address, interface) in [
            ("192.0.2.2", "192.0.2.2", "192.0.2.2", "eth0"),
            ("::ffff:192.0.2.2", "::ffff:192.0.2.2", "192.0.2.2", "eth0"),
            ("64:ff9b::c000:202", "64:ff9b::c000:202", "192.0.2.2", "eth0"),
            ("rebind.example", "2001:db8::2", "2001:db8::2", "eth0"),
            ("public.example", "93.184.216.99", "93.184.216.99", "wlan0"),
        ] {
            let decision = open.decide_on_host(host, 443, &ips(&["93.184.216.34", resolved]), &own);
            let denial = Denial::HostAddress { address: address.parse().unwrap(), interface: interface.into() };
            assert_eq!(decision, Decision::Deny(denial.clone()), "{host}");
            assert_eq!(denial.to_string(), format!("{address} is an address of this host ({interface})"));
        }
        // Not the host: allowed; a configured endpoint on the host's address: allowed.
        assert!(matches!(open.decide_on_host("x.example", 443, &ips(&["93.184.216.34"]), &own), Decision::Allow(_)));
        let endpoint = open.decide_on_host("93.184.216.99", 8080, &ips(&["93.184.216.99"]), &own);
        assert_eq!(endpoint, Decision::Allow(vec!["93.184.216.99:8080".parse().unwrap()]));
    }

    #[test]
    fn the_host_addresses_are_read_from_the_kernel() {
        let own = host_addresses().unwrap();
        assert!(own.iter().any(|(ip, name)| *ip == IpAddr::V4(Ipv4Addr::LOCALHOST) && name == "lo"), "{own:?}");
    }

    #[tokio::test]
    async fn a_listener_on_all_interfaces_is_not_reached_at_the_hosts_address() {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let own = host_addresses().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let proxy = start(&dir, policy(NetworkMode::Open, &[])).await;
        // Every address of every interface, loopback included: refused by its range, or else as the host's own.
        for (address, interface) in
            own.iter().filter(|(ip, _)| !matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local()))
        {
            let target = authority(&address.to_string(), port);
            let answer = reply(&proxy, &format!("CONNECT {target} HTTP/1.1\r\n\r\n")).await;
            let why = match forbidden_range(*address) {
                Some(range) => format!("{address} is a {range} address"),
                None => format!("{address} is an address of this host ({interface})"),
            };
            let body = format!("acp-sandbox: access to {target} is blocked: {why}\n");
            assert!(
                answer.starts_with("HTTP/1.1 403 Forbidden\r\n") && answer.ends_with(&format!("\r\n\r\n{body}")),
                "{answer}"
            );
        }
        assert!(listener.accept().is_err(), "the listener was reached");
    }

    #[tokio::test]
    async fn connections_past_the_limit_are_answered_503_and_closed() {
        let dir = tempfile::tempdir().unwrap();
        let context = Context {
            policy: policy(NetworkMode::None, &[]),
            label: "test".into(),
            upstream: None,
            fixed_dns: Vec::new(),
            budget: ConnectionBudget::new(3),
            asker: None,
        };
        let proxy = Proxy::serve(&dir.path().join("proxy.sock"), context).await.unwrap();
        let mut idle = Vec::new();
        for _ in 0..3 {
            idle.push(UnixStream::connect(proxy.socket_path()).await.unwrap());
        }
        let mut answers = Vec::new();
        for _ in 0..5 {
            let mut excess = UnixStream::connect(proxy.socket_path()).await.unwrap();
            let mut answer = String::new();
            excess.read_to_string(&mut answer).await.unwrap();
            answers.push(answer);
        }
        let expected = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
                        Content-Length: 74\r\nConnection: close\r\n\r\n\
                        acp-sandbox: the sandbox already has 3 connections open through its proxy\n";
        assert_eq!(answers, vec![expected.to_string(); 5]);
        // A connection that ends makes room for the next one.
        drop(idle.pop());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            // Until the ended connection is seen, an attempt may meet a closed socket.
            let mut stream = UnixStream::connect(proxy.socket_path()).await.unwrap();
            let mut answer = String::new();
            if stream.write_all(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n").await.is_ok() {
                let _ = stream.read_to_string(&mut answer).await;
            }
            if answer.starts_with("HTTP/1.1 403 ") {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "no room after a connection ended: {answer}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Two proxies of one sandbox (its server's and a turn's) share its budget: connections held open through
    /// one count against the other.
    #[tokio::test]
    async fn the_proxies_of_one_sandbox_share_one_budget() {
        let dir = tempfile::tempdir().unwrap();
        let budget = ConnectionBudget::new(3);
        let start = |name: &str| {
            let path = dir.path().join(name);
            let budget = budget.clone();
            async move { Proxy::start(&path, policy(NetworkMode::None, &[]), "test".into(), budget).await.unwrap() }
        };
        let (first, second) = (start("a.sock").await, start("b.sock").await);
        let mut idle = vec![UnixStream::connect(first.socket_path()).await.unwrap()];
        for _ in 0..2 {
            idle.push(UnixStream::connect(second.socket_path()).await.unwrap());
        }
        // The accept loops take their permits as they accept; wait until all three are held.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while budget.permits.available_permits() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "the three connections were not accepted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut excess = UnixStream::connect(first.socket_path()).await.unwrap();
        let mut answer = String::new();
        // A proxy with a budget of its own would accept and wait for a request: no answer within 10 s.
        let read = tokio::time::timeout(Duration::from_secs(10), excess.read_to_string(&mut answer)).await;
        assert!(read.is_ok(), "the fourth connection was accepted");
        assert_eq!(answer, too_many(3));
        drop(idle);
        // A fresh budget is not affected by another sandbox's.
        let other = Proxy::start(
            &dir.path().join("c.sock"),
            policy(NetworkMode::None, &[]),
            "t".into(),
            ConnectionBudget::new(3),
        )
        .await
        .unwrap();
        let mut stream = UnixStream::connect(other.socket_path()).await.unwrap();
        stream.write_all(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403 "), "{answer}");
    }
}
