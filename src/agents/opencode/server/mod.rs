//! OpenCode through a warm `opencode serve`: the pool of servers (here), its HTTP client (`client.rs`) and event
//! stream (`sse.rs`), the guard plugin (`guard.rs`), the engine of a turn (`engine.rs`) and the pure translation of
//! its events (`translate.rs`).
//!
//! Warm `opencode serve` processes, each inside a sandbox: one per workspace, shared by the sessions of that
//! workspace's shared sandbox (`--server-scope workspace`, each its own OpenCode session there), or one per session.
//!
//! A server is known by its key (the shared sandbox and the profile it was started for, or the session's id), and
//! the sessions using it are recorded. It is started in the background when a session is created, loaded or
//! resumed, so that the first prompt rarely waits for OpenCode to boot; it stays up between prompts, is stopped
//! after `--server-idle-timeout` and when its last session is closed or deleted, and at most `--max-servers` run
//! at once (the least recently used goes first). Its only way in is a door: a unix socket in the bridge's private run dir, spliced to the server's port
//! inside the sandbox by `sandbox-init`; every request carries the server's own random password, which the guard
//! plugin (`guard.rs`) keeps from the server's tools, as Landlock keeps them off its port. The server dies
//! with the bridge like any command of the sandbox (`--die-with-parent`, or the subreaper's parent-death signal).
//!
//! A workspace's shared sandbox is `<sessions>/workspace-<sha256(agent, cwd, its other roots, the bridge's sandbox
//! settings)[..8] hex>` (`Bridge::shared_sandbox_name`); a session keeps whatever sandbox the store names for it (one
//! made before sharing stays its own). What is the session's stays per session: its OpenCode conversation, its
//! permission ruleset (PATCHed per OpenCode session by each turn right before its prompt, never cached: the
//! sandbox's other server or another bridge may have written it; "always" answers are kept by the bridge in
//! `permissions::AlwaysAllowed` and put in that ruleset, because OpenCode's own `always` is instance-wide and comes
//! after every rule), mode, model, cancel (`/abort` of that session; a kill only when the server serves no other
//! turn or no longer answers), subagent permissions (only those of sessions whose `parentID` chain leads to the
//! turn's), strays (ended only when no other turn runs there). A different profile (approvals, the workspace's
//! configuration) is a different key: a second server in the same sandbox. `session/delete` deletes the OpenCode
//! session on a running shared server (with none running, it is noted in the sandbox's `pending-deletes` for its
//! next server) and the sandbox with its last session. A server's lock (`<data>/locks`, by key) is held while it
//! runs: a second bridge on the data dir does not warm a server the first runs (only a turn starts one beside it).

pub mod client;
pub mod engine;
pub mod events;
pub mod guard;
pub mod service;
pub mod sse;
pub mod translate;
mod turn;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use self::client::Client;
use self::sse::SseEvent;
use crate::sandbox::process::Activity;
use crate::sandbox::progress::{self, Waited};
use crate::sandbox::{ExitInfo, ProcessHandle, RunningProcess};

pub use self::service::Warm;
pub use self::translate::ServeTranslator;

/// Where the server listens inside the sandbox. With a network namespace of its own any port is free; under
/// `--sandbox none` a free port of the host is picked instead.
const INSIDE_PORT: u16 = 4096;

/// At most this much of a line of the server's output is kept.
const LINE_EXCERPT: usize = 2000;

/// Lines of the server's stderr kept for error messages.
const STDERR_LINES: usize = 40;

/// Events of the server waiting for the turn to take them: beyond this, the stream waits for the turn (and the
/// server for the stream), so a flood of deltas costs the bridge a bounded amount however fast it comes.
const EVENT_QUEUE: usize = 64;

/// How long a warm server may take to answer the health check before a turn uses it.
pub const HEALTH_LIMIT: Duration = Duration::from_secs(2);

/// How often the pool looks for idle servers.
const REAP_EVERY: Duration = Duration::from_secs(15);

/// Why no server could be had for a turn.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The server did not come up: the caller falls back to `opencode run`.
    #[error("the OpenCode server did not start: {0}")]
    Start(String),
    /// A background start found the server's lock held: another bridge (editor window) runs this server.
    #[error("another acp-sandbox (another editor window) runs this OpenCode server")]
    Elsewhere,
}

/// One running server.
pub struct Server {
    /// Talks to it.
    pub client: Client,
    /// The version its health check reports.
    pub version: String,
    kill: mpsc::Sender<Control>,
    exited: watch::Receiver<Option<ExitInfo>>,
    limit: Arc<Mutex<Option<String>>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    last_used: Mutex<Instant>,
    /// How many turns use it: never stopped for idleness or for room while one does.
    busy: std::sync::atomic::AtomicUsize,
    /// The OpenCode sessions this server has given their rules: a known one needs no existence check. Never a reason
    /// to skip giving a turn its rules: another server or bridge may have written them since.
    pub served: Mutex<HashSet<String>>,
    /// The editor's MCP servers whose failure to start a session was told of (`session` NUL `name`), once each.
    pub mcp_noted: Mutex<HashSet<String>>,
    /// What it was started for ([`Profile::key`]): a turn that wants another starts a fresh server.
    profile: String,
    /// Where the server's event stream goes: every running turn's receiver (each picks its own session's events).
    /// One stream, opened when the server became ready, saves every turn a subscription.
    listeners: Arc<Mutex<Vec<mpsc::Sender<SseEvent>>>>,
    /// The event stream ended (the server died or dropped it).
    stream_open: Arc<std::sync::atomic::AtomicBool>,
    /// The pool's: told when this server is let go of by its turn.
    freed: Arc<tokio::sync::Notify>,
    /// Its lock in the data dir, held while it runs: another bridge's background start leaves it alone.
    hold: Option<crate::store::lock::TurnLock>,
}

impl Server {
    /// Whether the process still runs and its event stream is open.
    pub fn alive(&self) -> bool {
        self.exited.borrow().is_none() && self.stream_open.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every event from now on, until the returned receiver is dropped. `None` once the stream has ended.
    pub fn listen(&self) -> Option<mpsc::Receiver<SseEvent>> {
        if !self.stream_open.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        let (sender, receiver) = mpsc::channel(EVENT_QUEUE);
        let mut listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        listeners.retain(|listener| !listener.is_closed());
        listeners.push(sender);
        Some(receiver)
    }

    /// Whether more than one turn uses it now: what one turn's end may do to the whole server (end its strays,
    /// kill it) would reach another session's turn.
    pub fn shared_now(&self) -> bool {
        self.busy.load(std::sync::atomic::Ordering::SeqCst) > 1
    }

    /// How it exited, once it did.
    pub fn exit(&self) -> Option<ExitInfo> {
        *self.exited.borrow()
    }

    /// Waits until the process has exited.
    pub async fn exited(&self) {
        let mut exited = self.exited.clone();
        let _ = exited.wait_for(Option::is_some).await;
    }

    /// The sandbox's process or memory limit, once the server's tree ran into it.
    pub fn limit_hit(&self) -> Option<String> {
        self.limit.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The last lines of its stderr.
    pub fn stderr_tail(&self) -> String {
        Vec::from(self.stderr.lock().unwrap_or_else(|p| p.into_inner()).clone()).join("\n")
    }

    /// Ends the server and everything it started, and waits until it is gone.
    pub async fn stop(&self) {
        let _ = self.kill.try_send(Control::Kill);
        self.exited().await;
    }

    /// Ends what the last turn left running in the sandbox beside the server (daemons, `setsid` children).
    pub fn end_strays(&self) {
        let _ = self.kill.try_send(Control::EndStrays);
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }
}

/// Marks a server busy for as long as a turn holds it.
pub struct Lease(Arc<Server>);

impl Lease {
    /// The server.
    pub fn server(&self) -> &Arc<Server> {
        &self.0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.freed.notify_waiters();
    }
}

/// Starting a server: what the session gives (its sandbox's command) and what comes back.
pub struct Started {
    /// The process.
    pub process: RunningProcess,
    /// What it was started for ([`Profile::key`]).
    pub profile: String,
    /// Its password.
    pub password: String,
    /// An earlier bridge started it and kept it warm (`--keep-warm`): it was checked when that bridge started it,
    /// and its output is not this bridge's to read.
    pub adopted: bool,
}

/// What a server is started for: the session's approvals, and whether the workspace's own OpenCode configuration
/// (`.opencode/`, `opencode.json`: plugins, custom tools, MCP servers, commands) is loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// `auto` or `ask`.
    pub approvals: String,
    /// Whether the workspace's configuration loads (`OPENCODE_DISABLE_PROJECT_CONFIG` when not).
    pub project_config: bool,
    /// The editor's MCP servers for the session (in the server's configuration: a different set, another server).
    pub mcp_servers: Vec<agent_client_protocol::v1::schema::McpServer>,
    /// The session's other roots: mounts of the server's sandbox, so other roots (a load that changed them) are
    /// another server, started with them.
    pub roots: Vec<String>,
}

impl Profile {
    /// A profile without the editor's MCP servers or other roots.
    pub fn new(approvals: String, project_config: bool) -> Self {
        Profile { approvals, project_config, mcp_servers: Vec::new(), roots: Vec::new() }
    }

    /// The same profile for these MCP servers.
    pub fn with_mcp_servers(self, mcp_servers: Vec<agent_client_protocol::v1::schema::McpServer>) -> Self {
        Profile { mcp_servers, ..self }
    }

    /// The same profile for these other roots.
    pub fn with_roots(self, roots: Vec<String>) -> Self {
        Profile { roots, ..self }
    }

    /// How a running server's profile is compared.
    pub fn key(&self) -> String {
        let mut key = format!("{} {}", self.approvals, if self.project_config { "project" } else { "no-project" });
        if !self.mcp_servers.is_empty() {
            key.push_str(" mcp-");
            key.push_str(&crate::agents::mcp::digest(&self.mcp_servers));
        }
        if !self.roots.is_empty() {
            key.push_str(" roots-");
            key.push_str(&roots_digest(&self.roots));
        }
        key
    }
}

/// A short digest of a session's other roots, for a profile's key.
fn roots_digest(roots: &[String]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, roots.join("\0").as_bytes());
    digest.as_ref()[..6].iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The warm servers of one bridge.
pub struct Servers {
    idle_stop: Duration,
    max: usize,
    /// By key.
    running: Mutex<HashMap<String, Arc<Server>>>,
    /// The key of each session's server, from the session's first lease or warm start until it is released.
    users: Mutex<HashMap<String, String>>,
    /// Keys whose server is starting: one start at a time per key, others wait for it.
    starting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// How many servers are starting now: they count against `max` like running ones (a cap that counted only
    /// the ready ones let 8 concurrent starts run 9 servers under a cap of 4).
    starting_now: Mutex<usize>,
    /// Told whenever a server stops, finishes starting or is let go of by its turn: room may have been made.
    freed: Arc<tokio::sync::Notify>,
    /// Where the servers' locks are taken (the data dir), across the bridges that share it.
    data_dir: PathBuf,
}

impl Servers {
    /// A pool that stops servers idle for `idle_stop` and keeps at most `max` running; its servers' locks are in
    /// `data_dir`.
    pub fn new(idle_stop: Duration, max: usize, data_dir: PathBuf) -> Arc<Self> {
        let servers = Arc::new(Servers {
            data_dir,
            idle_stop,
            max: max.max(1),
            running: Mutex::default(),
            users: Mutex::default(),
            starting: Mutex::default(),
            starting_now: Mutex::default(),
            freed: Arc::default(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&servers);
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(REAP_EVERY.min(idle_stop / 2).max(Duration::from_millis(200)));
                loop {
                    tick.tick().await;
                    let Some(servers) = weak.upgrade() else { break };
                    servers.stop_idle().await;
                }
            });
        }
        servers
    }

    /// The port a server is told to listen on: inside its own network namespace always the same one, else a port
    /// that is free on the host now.
    pub fn port(private_network: bool) -> u16 {
        if private_network {
            return INSIDE_PORT;
        }
        std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .unwrap_or(INSIDE_PORT)
    }

    /// A fresh password for a server.
    pub fn password() -> String {
        format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
    }

    /// The running server of `key`, if there is one.
    pub fn get(&self, key: &str) -> Option<Arc<Server>> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.get(key).filter(|server| server.alive()).cloned()
    }

    /// The running server `session` last used, if there is one.
    pub fn of_session(&self, session: &str) -> Option<Arc<Server>> {
        let key = self.users.lock().unwrap_or_else(|p| p.into_inner()).get(session).cloned()?;
        self.get(&key)
    }

    /// The server of `key` for one turn of `session`: the running one, or one started by `start` (once, however
    /// many ask at the same time). Makes room first when `max` servers run.
    pub async fn lease<F, Fut>(&self, key: &str, session: &str, profile: &str, start: F) -> Result<Lease, ServeError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Started, ServeError>>,
    {
        self.attach(key, session);
        let server = self.get_or_start(key, Some(profile), start).await?;
        server.busy.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        server.touch();
        Ok(Lease(server))
    }

    /// Starts the server of `key` for `session` unless it runs; for the background start on new, load and resume.
    pub async fn warm<F, Fut>(&self, key: &str, session: &str, start: F) -> Result<Arc<Server>, ServeError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Started, ServeError>>,
    {
        self.attach(key, session);
        self.get_or_start(key, None, start).await
    }

    /// Records that `session` uses the server of `key` (and no longer the one it used before, which is stopped
    /// when nobody else uses it).
    fn attach(&self, key: &str, session: &str) {
        let before = self.users.lock().unwrap_or_else(|p| p.into_inner()).insert(session.to_string(), key.to_string());
        if let Some(before) = before.filter(|before| before != key)
            && !self.used(&before)
            && let Some(server) = self.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&before)
        {
            tracing::info!(key = %before, "stopping an OpenCode server its last session no longer uses");
            let freed = self.freed.clone();
            tokio::spawn(async move {
                server.stop().await;
                freed.notify_waiters();
            });
        }
    }

    /// Whether a session uses the server of `key`.
    fn used(&self, key: &str) -> bool {
        self.users.lock().unwrap_or_else(|p| p.into_inner()).values().any(|used| used == key)
    }

    /// `session` no longer uses its server (closed or deleted): the server stops when no other session uses it.
    pub async fn release(&self, session: &str) {
        let Some(key) = self.users.lock().unwrap_or_else(|p| p.into_inner()).remove(session) else { return };
        if self.used(&key) {
            tracing::debug!(session, key = %key, "the OpenCode server goes on for its other sessions");
            return;
        }
        self.stop(&key).await;
    }

    /// The running server when it was started for `profile` (any, for `None`); else a fresh one.
    async fn get_or_start<F, Fut>(&self, key: &str, profile: Option<&str>, start: F) -> Result<Arc<Server>, ServeError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Started, ServeError>>,
    {
        let gate = {
            let mut starting = self.starting.lock().unwrap_or_else(|p| p.into_inner());
            starting.entry(key.to_string()).or_default().clone()
        };
        let _one = gate.lock().await;
        if let Some(server) = self.get(key) {
            // A turn's server must answer: one stopped (`SIGSTOP`) or wedged between turns would make every request
            // of the turn wait out its deadline. It is replaced instead.
            let answers = profile.is_none() || server.client.health(HEALTH_LIMIT).await.is_some();
            if !answers {
                tracing::warn!(key, "the OpenCode server does not answer; starting a fresh one");
                self.stop(key).await;
            } else if profile.is_none_or(|profile| profile == server.profile) {
                return Ok(server);
            } else {
                // Approvals or the workspace's configuration changed what the server may load or do without
                // asking: what it loaded at its start (plugins, MCP servers) and its configured rules go with it.
                tracing::info!(key, from = %server.profile, to = profile.unwrap_or(""), "restarting the OpenCode server");
                self.stop(key).await;
            }
        }
        // A second bridge (another editor window on the same data dir) warming a server the first one runs would
        // make two servers on one OpenCode database for nothing: only a turn starts one beside it.
        let hold = match crate::store::lock::try_lock(&self.data_dir, &format!("server {key}")) {
            Ok(Some(hold)) => Some(hold),
            Ok(None) if profile.is_none() => return Err(ServeError::Elsewhere),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(key, "could not take the server's lock: {e}");
                None
            }
        };
        let place = self.make_room().await;
        let ready = async {
            let mut server = ready(start().await?, self.freed.clone()).await?;
            server.hold = hold;
            Ok(Arc::new(server))
        }
        .await;
        if let Ok(server) = &ready {
            tracing::info!(key, version = %server.version, "the OpenCode server is ready");
            self.running.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_string(), server.clone());
        }
        // Counted as running from here (or gone); either way its start's place is free.
        drop(place);
        ready
    }

    /// Stops the server of `key` (its last session closed or deleted, a turn that could not be aborted, a server
    /// that died). Its other sessions' next prompts start it again.
    pub async fn stop(&self, key: &str) {
        let server = self.running.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        if let Some(server) = server {
            tracing::info!(key, "stopping the OpenCode server");
            server.stop().await;
            self.freed.notify_waiters();
        }
    }

    /// Leaves every kept-warm server running for the next bridge (`--keep-warm`) and stops the others.
    pub async fn leave_all(&self) {
        let all: Vec<Arc<Server>> =
            self.running.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, server)| server).collect();
        futures::future::join_all(all.iter().map(|server| async move {
            let (left, told) = tokio::sync::oneshot::channel();
            if server.kill.send(Control::Detach(left)).await.is_ok() {
                let _ = told.await;
            }
            // A server that was not started to be kept (its record could not be written) ends as it is dropped.
            server.stop().await;
        }))
        .await;
    }

    /// Stops every server.
    pub async fn stop_all(&self) {
        let all: Vec<Arc<Server>> =
            self.running.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, server)| server).collect();
        // All at once: the bridge's exit waits for the slowest, not for their sum.
        futures::future::join_all(all.iter().map(|server| server.stop())).await;
    }

    async fn stop_idle(&self) {
        let idle: Vec<String> = {
            let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            running
                .iter()
                .filter(|(_, server)| {
                    !server.alive()
                        || (server.busy.load(std::sync::atomic::Ordering::SeqCst) == 0
                            && server.idle_for() >= self.idle_stop)
                })
                .map(|(key, _)| key.clone())
                .collect()
        };
        for key in idle {
            tracing::info!(key = %key, "the OpenCode server was idle; stopping it");
            self.stop(&key).await;
        }
    }

    /// Takes a place for one more server among the `max`: free, or made by stopping the least recently used one
    /// that no turn uses, or else waited for (every place held by a turn or a start). The caller gives the place
    /// back once its server is running or failed (`starting_now`).
    async fn make_room(&self) -> Place<'_> {
        loop {
            let freed = self.freed.notified();
            let victim = {
                let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
                let mut starting = self.starting_now.lock().unwrap_or_else(|p| p.into_inner());
                let alive = running.values().filter(|server| server.alive()).count();
                if alive + *starting < self.max {
                    *starting += 1;
                    return Place(self);
                }
                running
                    .iter()
                    .filter(|(_, server)| server.busy.load(std::sync::atomic::Ordering::SeqCst) == 0)
                    .max_by_key(|(_, server)| (!server.alive(), server.idle_for()))
                    .map(|(key, _)| key.clone())
            };
            match victim {
                Some(key) => {
                    tracing::info!(key = %key, max = self.max, "stopping the least recently used OpenCode server");
                    self.stop(&key).await;
                }
                None => {
                    tracing::info!(
                        max = self.max,
                        "every OpenCode server place is taken by a turn or a start; waiting"
                    );
                    // A server that dies on its own says nothing: looked at again now and then.
                    let _ = tokio::time::timeout(Duration::from_secs(1), freed).await;
                }
            }
        }
    }
}

/// A starting server's place among the pool's `max`, given back when dropped (also when the start is abandoned
/// because the turn was cancelled).
struct Place<'a>(&'a Servers);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        {
            let mut starting = self.0.starting_now.lock().unwrap_or_else(|p| p.into_inner());
            *starting = starting.saturating_sub(1);
        }
        self.0.freed.notify_waiters();
    }
}

/// Supervises a started server and waits until it answers.
async fn ready(started: Started, freed: Arc<tokio::sync::Notify>) -> Result<Server, ServeError> {
    let Started { mut process, password, profile, adopted } = started;
    let Some(door) = process.door.take() else {
        return Err(ServeError::Start("the sandbox made no door to the server".into()));
    };
    let stderr = Arc::new(Mutex::new(VecDeque::new()));
    let (guarded, mut guard_on) = watch::channel(false);
    let guarded = Arc::new(guarded);
    let (said_listening, mut listening) = watch::channel(false);
    let said_listening = Arc::new(said_listening);
    for stream in [&mut process.stderr, &mut process.stdout] {
        let stream = std::mem::replace(stream, Box::pin(tokio::io::empty()));
        tokio::spawn(keep_tail(stream, stderr.clone(), guarded.clone(), said_listening.clone()));
    }
    let (kill, exited, limit, activity) = supervise(process.handle);
    let client = Client::new(door, &password);
    let started_at = Instant::now();
    let mut watch_exit = exited.clone();
    // OpenCode's cold start took up to 18 s on a loaded 2-core machine (its first start also migrates its database):
    // it is waited for as long as its sandbox makes progress, not by a clock.
    let mut progress = progress::Watch::new(started_at.into());
    let sample = || activity.last();
    let version = loop {
        if let Some(exit) = *watch_exit.borrow() {
            let tail = Vec::from(stderr.lock().unwrap_or_else(|p| p.into_inner()).clone()).join("\n");
            return Err(ServeError::Start(format!("it exited with {} at start: {}", exit.describe(), tail.trim())));
        }
        let now = tokio::time::Instant::now();
        let gave_up = if progress.stalled(sample(), now) {
            Some(Waited::<()>::Stalled(started_at.elapsed()))
        } else {
            (started_at.elapsed() >= progress::START_CAP).then_some(Waited::TooLong)
        };
        if let Some(gave_up) = gave_up {
            let _ = kill.try_send(Control::Kill);
            return Err(ServeError::Start(gave_up.why("answer")));
        }
        // A request that reaches OpenCode while it is still setting up its listener is never answered (measured:
        // a first health check hung for 10 s, while one sent a moment later answered in 2 ms), so the first check
        // goes out when the server says it listens (a server that does not say so is checked every second), each
        // check gives up soon and the next one is a fresh connection; on a machine too loaded for that, later
        // checks wait longer.
        if !*listening.borrow() && !adopted {
            tokio::select! {
                _ = listening.wait_for(|said| *said) => {
                    tracing::debug!(after = ?started_at.elapsed(), "the server says it listens");
                }
                _ = tokio::time::sleep(UNSAID_LISTENING) => {}
                _ = watch_exit.changed() => continue,
            }
        }
        let patience = if started_at.elapsed() < Duration::from_secs(10) {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(3)
        };
        if let Some(version) = client.health(patience).await {
            tracing::debug!(after = ?started_at.elapsed(), "the server answered its health check");
            // A warm start does not wait for the version probe: the server's own answer is checked instead.
            if crate::agents::major_version(&version).is_some_and(|major| major >= 2) {
                let _ = kill.try_send(Control::Kill);
                return Err(ServeError::Start(format!(
                    "it is OpenCode {version}, a major version acp-sandbox cannot drive yet"
                )));
            }
            break version;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            _ = watch_exit.changed() => {}
        }
    };
    // The first event says the subscription is live: nothing a turn asks for afterwards can be missed.
    let mut events = client.events().await.map_err(|e| ServeError::Start(format!("its event stream: {e}")))?;
    // It opens once OpenCode has loaded its project and plugins: waited for while that progresses.
    match progress::patiently(futures::StreamExt::next(&mut events), sample, || {}).await {
        Waited::Done(Some(_)) => {}
        Waited::Done(None) => {
            let _ = kill.try_send(Control::Kill);
            return Err(ServeError::Start("its event stream did not open".into()));
        }
        gave_up => {
            let _ = kill.try_send(Control::Kill);
            return Err(ServeError::Start(gave_up.why("open its event stream")));
        }
    }
    tracing::debug!(after = ?started_at.elapsed(), "the server's event stream is open");
    // The event stream opens once OpenCode has loaded its project, plugins included: the guard's line is in the
    // pipe by now, or it never comes. Without it the server's tools could read its password: no prompt goes there.
    let on = adopted
        || tokio::select! {
            on = tokio::time::timeout(GUARD_LIMIT, guard_on.wait_for(|on| *on)) => on.is_ok_and(|on| on.is_ok()),
            _ = watch_exit.wait_for(Option::is_some) => false,
        };
    activity.on.store(false, std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(guarded = on, after = ?started_at.elapsed(), "the server's guard plugin");
    if !on {
        let _ = kill.try_send(Control::Kill);
        let tail = Vec::from(stderr.lock().unwrap_or_else(|p| p.into_inner()).clone()).join("\n");
        return Err(ServeError::Start(format!(
            "the bridge's guard plugin did not run in it, so its tools could read its password: {}",
            tail.trim()
        )));
    }
    let listeners: Arc<Mutex<Vec<mpsc::Sender<SseEvent>>>> = Arc::default();
    let stream_open = Arc::new(std::sync::atomic::AtomicBool::new(true));
    {
        let (listeners, stream_open) = (listeners.clone(), stream_open.clone());
        tokio::spawn(async move {
            while let Some(event) = futures::StreamExt::next(&mut events).await {
                let senders = listeners.lock().unwrap_or_else(|p| p.into_inner()).clone();
                // Waits while a turn is behind: the server's writes wait on the socket meanwhile, so memory stays
                // bounded however many turns listen.
                let mut gone = false;
                if let Some((last, others)) = senders.split_last() {
                    for sender in others {
                        gone |= sender.send(event.clone()).await.is_err();
                    }
                    gone |= last.send(event).await.is_err();
                }
                if gone {
                    listeners.lock().unwrap_or_else(|p| p.into_inner()).retain(|listener| !listener.is_closed());
                }
            }
            stream_open.store(false, std::sync::atomic::Ordering::SeqCst);
            // The turns listening see their channels close.
            listeners.lock().unwrap_or_else(|p| p.into_inner()).clear();
        });
    }
    Ok(Server {
        listeners,
        stream_open,
        client,
        version,
        kill,
        exited,
        limit,
        stderr,
        last_used: Mutex::new(Instant::now()),
        busy: 0.into(),
        served: Mutex::default(),
        mcp_noted: Mutex::default(),
        profile,
        freed,
        hold: None,
    })
}

/// What the supervisor of a server is asked to do.
enum Control {
    Kill,
    EndStrays,
    /// Leave it running past the bridge when it is kept warm; answered once the handle let go of it.
    Detach(tokio::sync::oneshot::Sender<()>),
}

type Supervision = (mpsc::Sender<Control>, watch::Receiver<Option<ExitInfo>>, Arc<Mutex<Option<String>>>, Arc<Sampled>);

/// What a server's sandbox is doing while it starts: sampled by its supervisor every second until its start is
/// over ([`ready`] turns `on` off), so that the start waits for it as long as it progresses.
struct Sampled {
    on: std::sync::atomic::AtomicBool,
    last: Mutex<Option<Activity>>,
}

impl Sampled {
    fn last(&self) -> Option<Activity> {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Owns the process: kills it when asked, says when it exits, and notes when its sandbox hits a limit.
fn supervise(mut handle: Box<dyn ProcessHandle>) -> Supervision {
    let (kill_tx, mut kill_rx) = mpsc::channel::<Control>(4);
    let (exit_tx, exit_rx) = watch::channel(None);
    let limit = Arc::new(Mutex::new(None));
    let noted = limit.clone();
    let sampled = Arc::new(Sampled { on: true.into(), last: Mutex::new(handle.activity()) });
    let activity = sampled.clone();
    tokio::spawn(async move {
        let mut check = tokio::time::interval(Duration::from_secs(1));
        let mut killed = false;
        loop {
            tokio::select! {
                control = kill_rx.recv(), if !killed => match control {
                    Some(Control::EndStrays) => handle.end_strays(),
                    Some(Control::Detach(left)) => {
                        handle.detach();
                        drop(handle);
                        let _ = left.send(());
                        return;
                    }
                    // Dropping the server kills it too.
                    Some(Control::Kill) | None => {
                        killed = true;
                        handle.kill().await;
                    }
                },
                _ = check.tick() => {
                    if let Some(hit) = handle.limit_hit() {
                        *noted.lock().unwrap_or_else(|p| p.into_inner()) = Some(hit);
                    }
                    if sampled.on.load(std::sync::atomic::Ordering::Relaxed) {
                        *sampled.last.lock().unwrap_or_else(|p| p.into_inner()) = handle.activity();
                    }
                }
                exit = handle.wait() => {
                    let exit = exit.unwrap_or(ExitInfo { code: None, signal: None });
                    if let Some(hit) = handle.limit_hit() {
                        *noted.lock().unwrap_or_else(|p| p.into_inner()) = Some(hit);
                    }
                    let _ = exit_tx.send(Some(exit));
                    break;
                }
            }
        }
    });
    (kill_tx, exit_rx, limit, activity)
}

/// What OpenCode prints once its port is open (`opencode server listening on http://127.0.0.1:4096`).
const LISTENING: &str = "server listening on http";

/// How long a start waits for [`LISTENING`] before it checks the server's health anyway (a server that does not
/// print it, or a line lost in a flood of output).
const UNSAID_LISTENING: Duration = Duration::from_secs(1);

/// How long the guard's line may lag behind the event stream's first event (it is already written by then).
const GUARD_LIMIT: Duration = Duration::from_secs(30);

/// Keeps the last lines of a server's output, and says when the guard plugin's line is among them. Bounded like a
/// CLI's: anything in the sandbox may write there (before the guard ran, nothing but OpenCode itself runs there).
async fn keep_tail(
    stream: crate::sandbox::OutputStream,
    tail: Arc<Mutex<VecDeque<String>>>,
    guarded: Arc<watch::Sender<bool>>,
    listening: Arc<watch::Sender<bool>>,
) {
    let mut lines = crate::lines::BoundedLines::new(stream, LINE_EXCERPT);
    while let Ok(Some(line)) = lines.next_line().await {
        let line = String::from_utf8_lossy(&line.bytes).trim_end().to_string();
        if line == guard::MARKER {
            guarded.send_replace(true);
            continue;
        }
        if line.contains(LISTENING) {
            // Said once at every start: not a line that explains an error.
            listening.send_replace(true);
            continue;
        }
        tracing::debug!(target: "acp_sandbox::opencode_server", "{line}");
        let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.push_back(line);
        if tail.len() > STDERR_LINES {
            tail.pop_front();
        }
    }
}

/// Where a shared sandbox's state dir lists the conversations of deleted sessions that no server could delete yet
/// (none ran then): its next server deletes them.
const PENDING_DELETES: &str = "pending-deletes";

/// Notes that OpenCode session `native` of the sandbox at `state_dir` is to be deleted by its next server.
pub fn defer_delete(state_dir: &Path, native: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(state_dir.join(PENDING_DELETES))?;
    writeln!(file, "{native}")
}

/// Deletes on `client`'s server the conversations [`defer_delete`] noted for the sandbox at `state_dir`; what could
/// not be deleted (the server failed) stays noted.
pub async fn delete_pending(state_dir: &Path, client: &Client) {
    let path = state_dir.join(PENDING_DELETES);
    // Taken by a rename first: the warm start and a turn may both get here, and only one asks.
    let taken = state_dir.join(format!("{PENDING_DELETES}.{}", uuid::Uuid::new_v4().simple()));
    if std::fs::rename(&path, &taken).is_err() {
        return;
    }
    let listed = std::fs::read_to_string(&taken).unwrap_or_default();
    let _ = std::fs::remove_file(&taken);
    let mut left = Vec::new();
    for native in listed.lines().filter(|line| !line.is_empty()) {
        // Written by the bridge, but in a dir the agent may write: only an id of OpenCode's shape becomes a path.
        if !native.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            continue;
        }
        match client
            .call_within(Duration::from_secs(5), hyper::Method::DELETE, &format!("/session/{native}"), None)
            .await
        {
            Ok(_) | Err(client::ClientError::Status { .. }) => {
                tracing::info!(native, "deleted the conversation of a deleted session")
            }
            Err(e) => {
                tracing::warn!(native, "could not delete the conversation of a deleted session: {e}");
                left.push(native.to_string());
            }
        }
    }
    for native in left {
        if let Err(e) = defer_delete(state_dir, &native) {
            tracing::warn!("could not note {native} in {} again: {e}", path.display());
        }
    }
}

/// The OpenCode server's argv after the executable.
pub fn server_args(port: u16) -> Vec<String> {
    ["serve", "--hostname", "127.0.0.1", "--port"].iter().map(|s| s.to_string()).chain([port.to_string()]).collect()
}
