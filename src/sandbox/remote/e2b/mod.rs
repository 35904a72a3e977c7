//! E2B sandboxes (preview): each session's sandbox is an E2B microVM, created from a template, paused between
//! turns and resumed by `connect`; commands run through envd with their output streamed as it is printed.
//!
//! The API key (`E2B_API_KEY`) is the bridge's alone: it goes only into `X-API-Key` of control-plane calls, never
//! into a sandbox, a command's environment, the store or a log line. envd is reached with the per-connect access
//! token from the create or connect answer, which is never stored either. `E2B_API_URL`, `E2B_SANDBOX_URL` and
//! `E2B_DOMAIN` are read as the official SDKs read them (the tests point them at a fake on 127.0.0.1).

pub mod api;
pub mod connect;
pub mod envd;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::watch;

use self::api::{AutoResume, ControlPlane, NewSandbox, SandboxInfo, remote};
use self::connect::{Decoder, Frame};
use self::envd::{Envd, Event};
use super::reaper::{self, REAP_LIMIT, Tags};
use crate::sandbox::{
    ExecSpec, ExitInfo, ProcessHandle, RemoteFailure, RunningProcess, Sandbox, SandboxError, SandboxProvider,
    SandboxSpec,
};

/// The provider's name, persisted with each session it created.
pub const PROVIDER: &str = "e2b";
/// The variable holding the key.
pub const KEY_VARIABLE: &str = "E2B_API_KEY";
/// Where the workspace appears inside the sandbox (the base template's user is `user`).
pub const WORKSPACE: &str = "/home/user/workspace";
/// The session's state dir inside the sandbox (the CLI's HOME and XDG dirs).
pub const STATE_DIR: &str = "/home/user/.acp-sandbox";
/// The template when none is configured.
pub const DEFAULT_TEMPLATE: &str = "base";
/// A sandbox lives this long after a connect or a refresh; a running command refreshes it every half of it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
/// Output chunks buffered between envd's stream and the turn that reads it.
const PIPE_BUFFER: usize = 256 * 1024;
/// How often a broken process stream is re-attached before the command counts as lost.
const REATTACH_TRIES: u32 = 3;
/// The E2B API key: shown to nothing but the `X-API-Key` header.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: String) -> Self {
        ApiKey(key)
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// How to reach E2B and what to create.
#[derive(Clone, Debug)]
pub struct E2bSettings {
    /// `E2B_API_KEY`.
    pub api_key: ApiKey,
    /// `E2B_API_URL`, else `https://api.<domain>`.
    pub api_url: Url,
    /// `E2B_SANDBOX_URL`: one envd URL for every sandbox (requests are routed by their headers).
    pub sandbox_url: Option<Url>,
    /// `E2B_DOMAIN`, else `e2b.app`.
    pub domain: String,
    /// The template new sandboxes are made from (`ACP_SANDBOX_E2B_TEMPLATE`, else `base`).
    pub template: String,
    /// How long a sandbox lives without traffic before E2B pauses it.
    pub timeout: Duration,
}

impl E2bSettings {
    /// Reads the settings from the environment, through `var` (so that tests pass their own).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, SandboxError> {
        let set = |name: &str| var(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let api_key = set("E2B_API_KEY").ok_or_else(|| {
            SandboxError::Unavailable(
                "E2B_API_KEY is not set: `--sandbox e2b` needs an E2B API key in the bridge's environment or \
                 stored by `acp-sandbox login --provider e2b` (it is used by the bridge only, never passed into the \
                 sandbox)"
                    .to_string(),
            )
        })?;
        let domain = set("E2B_DOMAIN").unwrap_or_else(|| "e2b.app".to_string());
        let url = |name: &str, value: String| {
            Url::parse(&value).map_err(|e| SandboxError::Unavailable(format!("{name}={value} is not a URL: {e}")))
        };
        let api_url = match set("E2B_API_URL") {
            Some(value) => url("E2B_API_URL", value)?,
            None => url("E2B_DOMAIN", format!("https://api.{domain}"))?,
        };
        let sandbox_url = set("E2B_SANDBOX_URL").map(|value| url("E2B_SANDBOX_URL", value)).transpose()?;
        let template = set("ACP_SANDBOX_E2B_TEMPLATE").unwrap_or_else(|| DEFAULT_TEMPLATE.to_string());
        Ok(E2bSettings {
            api_key: ApiKey::new(api_key),
            api_url,
            sandbox_url,
            domain,
            template,
            timeout: DEFAULT_TIMEOUT,
        })
    }
}

/// The HTTP client of the provider: rustls with the ring provider and the platform's roots, no proxy from the
/// environment (the bridge's own traffic goes where the user configured E2B to be).
pub fn http_client() -> Result<reqwest::Client, SandboxError> {
    // reqwest's rustls without a bundled provider needs one installed once per process; a second install (or
    // another provider some other code installed first) is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(20))
        .no_proxy()
        .build()
        .map_err(|e| SandboxError::Unavailable(format!("cannot build the HTTP client for E2B: {e}")))
}

/// E2B as `--sandbox e2b` selects it.
pub struct E2b;

impl super::Remote for E2b {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn help(&self) -> &'static str {
        "An E2B sandbox per session (preview): `E2B_API_KEY` in the bridge's environment"
    }

    fn one_sandbox(&self) -> &'static str {
        "an E2B sandbox"
    }

    fn key_variable(&self) -> &'static str {
        KEY_VARIABLE
    }

    fn key_page(&self) -> &'static str {
        "https://e2b.dev/dashboard?tab=keys"
    }

    fn open(&self, vars: super::Vars<'_>) -> Result<std::sync::Arc<dyn crate::sandbox::SandboxProvider>, SandboxError> {
        let settings = E2bSettings::from_env(vars)?;
        tracing::info!(api = %settings.api_url, template = %settings.template, "sessions run in E2B sandboxes");
        Ok(std::sync::Arc::new(E2bProvider::new(settings)?))
    }

    fn check<'a>(&self, vars: super::Vars<'a>) -> futures::future::BoxFuture<'a, Vec<crate::sandbox::CheckLine>> {
        Box::pin(check(vars))
    }
}

/// `doctor`'s lines for `--sandbox e2b`: the key, the control plane (reached, the key accepted), the template,
/// and what a session would use.
pub async fn check(var: &(dyn Fn(&str) -> Option<String> + Sync)) -> Vec<crate::sandbox::CheckLine> {
    use crate::sandbox::CheckLine;
    if var(KEY_VARIABLE).is_none_or(|key| key.trim().is_empty()) {
        return vec![CheckLine::error(format!(
            "{KEY_VARIABLE}: missing: --sandbox e2b needs your E2B key in the bridge's environment, or run \
             `acp-sandbox login --provider e2b`"
        ))];
    }
    let settings = match E2bSettings::from_env(var) {
        Ok(settings) => settings,
        Err(e) => return vec![CheckLine::error(e.to_string())],
    };
    let mut lines = vec![CheckLine::ok(format!("{KEY_VARIABLE}: set"))];
    let api = format!("API {}", settings.api_url);
    let template = &settings.template;
    let named = if var("ACP_SANDBOX_E2B_TEMPLATE").is_some_and(|t| !t.trim().is_empty()) {
        format!("template {template} (ACP_SANDBOX_E2B_TEMPLATE)")
    } else {
        format!("template {template} (the default)")
    };
    match http_client() {
        Err(e) => lines.push(CheckLine::error(format!("{api}: {e}"))),
        Ok(http) => {
            let plane = ControlPlane::new(http, settings.api_url.clone(), settings.api_key.clone());
            match plane.template(template).await {
                Ok(found) => {
                    lines.push(CheckLine::ok(format!("{api}: reachable, the key is accepted")));
                    lines.push(match found {
                        Some(api::TemplateOwner::Yours(id)) => {
                            CheckLine::ok(format!("{named}: exists (your team's, id {id})"))
                        }
                        Some(api::TemplateOwner::Other) => {
                            CheckLine::ok(format!("{named}: exists (not your team's: a public one such as E2B's own)"))
                        }
                        None => CheckLine::error(format!(
                            "{named}: E2B has no template of that name: set ACP_SANDBOX_E2B_TEMPLATE to one of yours, \
                             or unset it for `{DEFAULT_TEMPLATE}`"
                        )),
                    });
                }
                Err(SandboxError::Remote { message, .. }) => lines.push(CheckLine::error(format!("{api}: {message}"))),
                Err(e) => lines.push(CheckLine::error(format!("{api}: {e}"))),
            }
        }
    }
    lines.push(CheckLine::ok(format!(
        "sessions: each in an E2B sandbox of its own from template {template}, paused by E2B after {} s without \
         traffic and resumed by the next prompt; {KEY_VARIABLE} stays with the bridge",
        settings.timeout.as_secs()
    )));
    lines
}

/// Creates, resumes, pauses and kills E2B sandboxes.
pub struct E2bProvider {
    settings: E2bSettings,
    http: reqwest::Client,
    api: Arc<ControlPlane>,
    /// Part of every tag of this bridge's commands: a tagged command without it is an earlier bridge's.
    instance: String,
}

impl E2bProvider {
    pub fn new(settings: E2bSettings) -> Result<Self, SandboxError> {
        let http = http_client()?;
        let api = Arc::new(ControlPlane::new(http.clone(), settings.api_url.clone(), settings.api_key.clone()));
        let instance = reaper::instance_id();
        Ok(E2bProvider { settings, http, api, instance })
    }

    fn open(&self, info: SandboxInfo, session_id: &str, woke: bool) -> Result<Arc<E2bSandbox>, SandboxError> {
        let domain = info.domain.clone().unwrap_or_else(|| self.settings.domain.clone());
        let base = envd::envd_url(self.settings.sandbox_url.as_ref(), &domain, &info.sandbox_id)?;
        let envd = Envd::new(self.http.clone(), base, &info.sandbox_id, info.envd_access_token.as_deref())?;
        Ok(Arc::new(E2bSandbox {
            id: info.sandbox_id,
            tags: Tags::new(session_id, &self.instance),
            template: self.settings.template.clone(),
            envd_version: info.envd_version,
            timeout: self.settings.timeout,
            envd: Arc::new(envd),
            api: self.api.clone(),
            workspace: PathBuf::from(WORKSPACE),
            state_dir: PathBuf::from(STATE_DIR),
            woke,
        }))
    }

    /// Like [`SandboxProvider::connect`], with the sandbox's own type (its file transfers).
    pub async fn connect_sandbox(&self, id: &str, spec: &SandboxSpec) -> Result<Option<Arc<E2bSandbox>>, SandboxError> {
        match self.api.connect(id, self.settings.timeout).await? {
            None => Ok(None),
            Some((info, resumed)) => {
                tracing::info!(provider = PROVIDER, sandbox = id, resumed, "connected");
                self.open(info, &spec.session_id, resumed).map(Some)
            }
        }
    }
}

#[async_trait]
impl SandboxProvider for E2bProvider {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<String, SandboxError> {
        let body = NewSandbox {
            template_id: &self.settings.template,
            timeout: self.settings.timeout.as_secs(),
            auto_pause: true,
            auto_resume: AutoResume { enabled: true },
            metadata: BTreeMap::from([("acp_session".to_string(), spec.session_id.clone())]),
            env_vars: BTreeMap::new(),
        };
        let info = self.api.create(&body).await?;
        let id = info.sandbox_id.clone();
        tracing::info!(provider = PROVIDER, sandbox = %id, template = %self.settings.template, "created");
        let sandbox = self.open(info, &spec.session_id, false)?;
        // Commands start in the workspace: it must exist before the first one.
        if let Err(e) = sandbox.make_dirs().await {
            if let Err(kill) = self.api.kill(&id).await {
                tracing::warn!(provider = PROVIDER, sandbox = %id, "could not kill the half-made sandbox: {kill}");
            }
            return Err(e);
        }
        Ok(id)
    }

    async fn connect(&self, id: &str, spec: &SandboxSpec) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        Ok(self.connect_sandbox(id, spec).await?.map(|s| s as Arc<dyn Sandbox>))
    }

    async fn suspend(&self, id: &str) -> Result<(), SandboxError> {
        let outcome = self.api.pause(id).await?;
        tracing::info!(provider = PROVIDER, sandbox = id, ?outcome, "paused");
        Ok(())
    }

    async fn destroy(&self, id: &str) -> Result<(), SandboxError> {
        let existed = self.api.kill(id).await?;
        tracing::info!(provider = PROVIDER, sandbox = id, existed, "killed");
        Ok(())
    }
}

/// A connected E2B sandbox.
pub struct E2bSandbox {
    id: String,
    /// The tags of this session's commands in this bridge.
    tags: Tags,
    template: String,
    envd_version: String,
    timeout: Duration,
    envd: Arc<Envd>,
    api: Arc<ControlPlane>,
    workspace: PathBuf,
    state_dir: PathBuf,
    /// This connection resumed the sandbox from a pause.
    woke: bool,
}

impl E2bSandbox {
    /// E2B's id of the sandbox.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Writes a file anywhere in the sandbox (parents are created).
    pub async fn upload(&self, path: &Path, bytes: &[u8]) -> Result<(), SandboxError> {
        self.envd.upload(&path.to_string_lossy(), bytes).await
    }

    /// Reads a file of the sandbox; `None` when there is none.
    pub async fn download(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        self.envd.download(&path.to_string_lossy()).await
    }

    async fn make_dirs(&self) -> Result<(), SandboxError> {
        let spec = ExecSpec {
            program: PathBuf::from("mkdir"),
            args: vec!["-p".into(), WORKSPACE.into(), STATE_DIR.into()],
            cwd: PathBuf::from("/"),
            ..ExecSpec::default()
        };
        let mut process = self.start(spec, None).await?;
        let exit = process.handle.wait().await?;
        if exit.success() {
            return Ok(());
        }
        Err(remote(
            RemoteFailure::Failed,
            format!("cannot make {WORKSPACE} in the new sandbox: mkdir ended with {}", exit.describe()),
        ))
    }
}

#[async_trait]
impl Sandbox for E2bSandbox {
    fn workspace(&self) -> &Path {
        &self.workspace
    }

    fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    fn isolation(&self) -> String {
        format!("E2B sandbox {} (template {}, envd {})", self.id, self.template, self.envd_version)
    }

    async fn exec(&self, mut spec: ExecSpec) -> Result<RunningProcess, SandboxError> {
        if spec.serve_port.is_some() {
            return Err(SandboxError::Unavailable(
                "E2B sandboxes do not run a warm server yet: use `--opencode-backend run`".to_string(),
            ));
        }
        // The tag finds the command again after a bridge restart (`Process/List`); its mark, everything it started.
        let tag = self.tags.next();
        reaper::mark(&mut spec, &tag);
        self.start(spec, Some(tag)).await
    }

    async fn end_leftovers(&self) -> Result<usize, SandboxError> {
        let listed = self.envd.unary("List", &json!({})).await?;
        let strays: Vec<(u32, String)> = listed
            .get("processes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|process| {
                let tag = process.get("tag").and_then(Value::as_str)?;
                let pid = process.get("pid").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok())?;
                self.tags.is_earlier(tag).then(|| (pid, tag.to_string()))
            })
            .collect();
        if strays.is_empty() {
            return Ok(0);
        }
        for (pid, tag) in &strays {
            tracing::warn!(provider = PROVIDER, sandbox = %self.id, pid, %tag, "ending a command an earlier bridge left running");
            match self.envd.signal(*pid, "SIGNAL_SIGKILL").await {
                Ok(()) | Err(SandboxError::Remote { failure: RemoteFailure::NotFound, .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // What they started, and what earlier bridges' commands of this session left without a parent.
        let (session, own) = self.tags.earlier_patterns();
        let ended = reap(&self.envd, &session, Some(&own)).await?;
        tracing::info!(provider = PROVIDER, sandbox = %self.id, ended, "ended the earlier bridges' processes");
        Ok(strays.len())
    }

    async fn write_state_file(&self, path: &Path, bytes: &[u8]) -> Result<(), SandboxError> {
        let inside = path.strip_prefix(&self.state_dir).map_err(|_| {
            SandboxError::io(
                format!("write {}", path.display()),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "not below the sandbox's state dir"),
            )
        })?;
        if inside.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
            return Err(SandboxError::io(
                format!("write {}", path.display()),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "a path with `..` or `.`"),
            ));
        }
        self.upload(path, bytes).await
    }

    fn woke(&self) -> bool {
        self.woke
    }

    fn remote_files(&self) -> Option<&dyn crate::sandbox::RemoteFiles> {
        Some(self)
    }
}

impl E2bSandbox {
    /// A stdin open for as long as the command runs (an ACP agent's): what is written reaches it in one `SendInput` a
    /// read at a time, in order; dropping it closes the process's stdin.
    fn interactive_stdin(&self, pid: u32) -> std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>> {
        let (writer, mut reader) = tokio::io::duplex(PIPE_BUFFER);
        let envd = self.envd.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0u8; PIPE_BUFFER];
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if let Err(e) = envd.send_input(pid, &buf[..n]).await {
                            tracing::warn!(provider = PROVIDER, pid, "could not write the command's stdin: {e}");
                            return;
                        }
                    }
                }
            }
            if let Err(e) = envd.close_stdin(pid).await {
                tracing::debug!(provider = PROVIDER, pid, "could not close the command's stdin: {e}");
            }
        });
        Box::pin(writer)
    }

    /// Starts a command; with a tag, its leftovers are ended when it ends or is killed.
    async fn start(&self, spec: ExecSpec, tag: Option<String>) -> Result<RunningProcess, SandboxError> {
        let program = spec.program.to_string_lossy().into_owned();
        let response = self.envd.stream("Start", &envd::start_request(&spec, tag.as_deref())).await?;
        let mut stream = EventStream::new(response);
        let pid = loop {
            match stream.next().await {
                Next::Event(Event::Start(pid)) => break pid,
                Next::Event(Event::Nothing) => continue,
                Next::Finished(Some(error)) => {
                    return Err(SandboxError::Spawn { program, source: std::io::Error::other(error.to_string()) });
                }
                other => {
                    return Err(remote(RemoteFailure::Protocol, format!("envd did not start {program}: {other:?}")));
                }
            }
        };
        tracing::debug!(provider = PROVIDER, sandbox = %self.id, pid, ?tag, %program, "started");
        let mark = tag.as_deref().map(reaper::exact_pattern);
        let killed = Arc::new(AtomicBool::new(false));
        let (stdout, stdout_reader) = tokio::io::duplex(PIPE_BUFFER);
        let (stderr, stderr_reader) = tokio::io::duplex(PIPE_BUFFER);
        let (exit_tx, exit_rx) = watch::channel(None);
        let pump = Pump {
            envd: self.envd.clone(),
            api: self.api.clone(),
            sandbox_id: self.id.clone(),
            timeout: self.timeout,
            pid,
            mark: mark.clone(),
            killed: killed.clone(),
            stdout: Some(stdout),
            stderr: Some(stderr),
            exit: exit_tx,
        };
        tokio::spawn(pump.run(stream));
        let interactive = spec.interactive.then(|| self.interactive_stdin(pid));
        if !spec.stdin.is_empty() && !spec.interactive {
            let envd = self.envd.clone();
            let stdin = spec.stdin;
            // Output is read meanwhile, so a command that prints before it reads all its stdin cannot block us.
            tokio::spawn(async move {
                if let Err(e) = envd.feed_stdin(pid, &stdin).await {
                    tracing::warn!(provider = PROVIDER, pid, "could not write the command's stdin: {e}");
                }
            });
        }
        Ok(RunningProcess {
            stdin: interactive,
            stdout: Box::pin(stdout_reader),
            stderr: Box::pin(stderr_reader),
            handle: Box::new(E2bProcess { envd: self.envd.clone(), pid, mark, exit: exit_rx, killed }),
            door: None,
            adopted: None,
        })
    }
}

#[async_trait]
impl crate::sandbox::RemoteFiles for E2bSandbox {
    async fn write(&self, path: &Path, bytes: &[u8]) -> Result<(), SandboxError> {
        self.upload(path, bytes).await
    }

    async fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        self.download(path).await
    }

    async fn read_at_most(&self, path: &Path, limit: u64) -> Result<Option<Vec<u8>>, SandboxError> {
        self.envd.download_at_most(&path.to_string_lossy(), limit).await
    }

    async fn download_to(
        &self,
        path: &Path,
        dest: &Path,
        limit: u64,
    ) -> Result<super::download::Downloaded, SandboxError> {
        self.envd.download_to(&path.to_string_lossy(), dest, limit).await
    }
}

/// What the next read of a process stream gave.
#[derive(Debug)]
enum Next {
    Event(Event),
    /// The end-of-stream message, with the call's error if it failed.
    Finished(Option<connect::ConnectError>),
    /// The stream broke: the connection dropped (a pause cuts it), or envd broke the framing.
    Broken(String),
}

/// The envelopes of a `Start` or `Connect` response, as events.
struct EventStream {
    response: reqwest::Response,
    decoder: Decoder,
}

impl EventStream {
    fn new(response: reqwest::Response) -> Self {
        EventStream { response, decoder: Decoder::default() }
    }

    /// Cancel-safe: bytes are only taken from the response once a chunk is complete.
    async fn next(&mut self) -> Next {
        loop {
            match self.decoder.next_frame() {
                Ok(Some(Frame::Message(message))) => {
                    return match envd::parse_event(&message) {
                        Ok(event) => Next::Event(event),
                        Err(why) => Next::Broken(format!("envd sent {why}")),
                    };
                }
                Ok(Some(Frame::End(error))) => return Next::Finished(error),
                Ok(None) => {}
                Err(e) => return Next::Broken(e.to_string()),
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.decoder.push(&bytes),
                Ok(None) => {
                    return Next::Broken(match self.decoder.finish() {
                        Ok(()) => "envd's stream ended before the command did".to_string(),
                        Err(e) => e.to_string(),
                    });
                }
                Err(e) => return Next::Broken(format!("envd's stream broke: {e}")),
            }
        }
    }
}

type ExitSlot = Option<Result<ExitInfo, String>>;

/// Copies one command's stream into its stdout and stderr pipes until it ends, re-attaching when the stream
/// breaks, and keeps the sandbox from timing out meanwhile.
struct Pump {
    envd: Arc<Envd>,
    api: Arc<ControlPlane>,
    sandbox_id: String,
    timeout: Duration,
    pid: u32,
    /// The pattern of the command's mark: what it left running is ended when it ends.
    mark: Option<String>,
    /// Set by a kill, which ends what the command left itself.
    killed: Arc<AtomicBool>,
    stdout: Option<DuplexStream>,
    stderr: Option<DuplexStream>,
    exit: watch::Sender<ExitSlot>,
}

impl Pump {
    async fn run(mut self, mut stream: EventStream) {
        let mut refresh = tokio::time::interval((self.timeout / 2).max(Duration::from_secs(30)));
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        refresh.tick().await;
        let mut tries = 0;
        let outcome = loop {
            let next = tokio::select! {
                next = stream.next() => next,
                _ = refresh.tick() => {
                    // A sandbox that times out mid-command is paused under it: a long turn keeps it alive.
                    if let Err(e) = self.api.set_timeout(&self.sandbox_id, self.timeout).await {
                        tracing::warn!(provider = PROVIDER, sandbox = %self.sandbox_id, "could not extend the timeout: {e}");
                    }
                    continue;
                }
            };
            match next {
                Next::Event(Event::Stdout(bytes)) => write_or_close(&mut self.stdout, &bytes).await,
                Next::Event(Event::Stderr(bytes)) => write_or_close(&mut self.stderr, &bytes).await,
                Next::Event(Event::End(exit)) => break Ok(exit),
                Next::Event(Event::Start(_) | Event::Nothing) => {}
                Next::Finished(Some(error)) => break Err(format!("envd ended the command's stream: {error}")),
                Next::Finished(None) => break Err("envd ended the command's stream without its exit".to_string()),
                Next::Broken(why) => match self.reattach(&mut tries, &why).await {
                    Ok(again) => stream = again,
                    Err(lost) => break Err(lost),
                },
            }
        };
        if let Err(why) = &outcome {
            tracing::warn!(provider = PROVIDER, sandbox = %self.sandbox_id, pid = self.pid, "{why}");
        }
        // A turn's processes end with it, as in a local sandbox: daemons and `setsid` children of the command too.
        if let Some(mark) = &self.mark
            && !self.killed.load(Ordering::SeqCst)
        {
            end_marked(&self.envd, self.pid, mark).await;
        }
        // The pipes close before the exit is told, so a reader sees all output before `wait` returns.
        drop(self.stdout.take());
        drop(self.stderr.take());
        self.exit.send_replace(Some(outcome));
    }

    /// `Process/Connect` by pid: the process outlives a dropped stream (output printed meanwhile is lost).
    async fn reattach(&self, tries: &mut u32, why: &str) -> Result<EventStream, String> {
        loop {
            if *tries >= REATTACH_TRIES {
                return Err(format!("the command's output stream broke ({why}) and could not be re-attached"));
            }
            *tries += 1;
            tokio::time::sleep(Duration::from_millis(200 * u64::from(*tries))).await;
            tracing::info!(provider = PROVIDER, sandbox = %self.sandbox_id, pid = self.pid, "re-attaching: {why}");
            match self.envd.stream("Connect", &json!({ "process": { "pid": self.pid } })).await {
                Ok(response) => return Ok(EventStream::new(response)),
                Err(SandboxError::Remote { failure: RemoteFailure::NotFound, message, .. }) => {
                    // envd (or E2B's proxy, 502) no longer knows the process: the control plane says whether the
                    // whole sandbox went, which is what the user must hear (not a stream's or a proxy's words).
                    if let Ok(false) = self.api.exists(&self.sandbox_id).await {
                        return Err(gone(&self.sandbox_id));
                    }
                    return Err(format!("the command's stream broke ({why}) and its process is gone: {message}"));
                }
                Err(e) => tracing::warn!(provider = PROVIDER, pid = self.pid, "re-attaching failed: {e}"),
            }
        }
    }
}

/// What a turn hears when its sandbox was killed under it.
fn gone(id: &str) -> String {
    format!(
        "the E2B sandbox {id} was killed outside the bridge while the turn ran (or its timeout ended it); the next \
         prompt makes a new one"
    )
}

async fn write_or_close(pipe: &mut Option<DuplexStream>, bytes: &[u8]) {
    if let Some(writer) = pipe
        && writer.write_all(bytes).await.is_err()
    {
        // The reader is gone: the rest of this stream is dropped, the command goes on.
        *pipe = None;
    }
}

/// A command running in an E2B sandbox.
struct E2bProcess {
    envd: Arc<Envd>,
    pid: u32,
    mark: Option<String>,
    exit: watch::Receiver<ExitSlot>,
    killed: Arc<AtomicBool>,
}

impl E2bProcess {
    fn ended(&self) -> bool {
        self.exit.borrow().is_some()
    }
}

#[async_trait]
impl ProcessHandle for E2bProcess {
    async fn kill(&mut self) {
        if self.ended() || self.killed.swap(true, Ordering::SeqCst) {
            return;
        }
        kill(&self.envd, self.pid, self.mark.as_deref()).await;
    }

    async fn wait(&mut self) -> Result<ExitInfo, SandboxError> {
        loop {
            if let Some(outcome) = self.exit.borrow_and_update().clone() {
                return outcome.map_err(|message| remote(RemoteFailure::Failed, message));
            }
            if self.exit.changed().await.is_err() {
                return Err(remote(RemoteFailure::Failed, "the command's stream stopped without its exit"));
            }
        }
    }
}

impl Drop for E2bProcess {
    fn drop(&mut self) {
        // A handle dropped mid-run (a turn task aborted) must not leave its command running in the sandbox.
        if self.ended() || self.killed.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (envd, pid, mark) = (self.envd.clone(), self.pid, self.mark.clone());
        runtime.spawn(async move { kill(&envd, pid, mark.as_deref()).await });
    }
}

/// Kills a command at once (`SendSignal SIGKILL`), then everything it started.
async fn kill(envd: &Envd, pid: u32, mark: Option<&str>) {
    match envd.signal(pid, "SIGNAL_SIGKILL").await {
        Ok(()) => {}
        // It ended on its own meanwhile (what it left is still ended below).
        Err(SandboxError::Remote { failure: RemoteFailure::NotFound, .. }) => {}
        Err(e) => tracing::warn!(provider = PROVIDER, pid, "could not kill the command: {e}"),
    }
    if let Some(mark) = mark {
        end_marked(envd, pid, mark).await;
    }
}

/// Ends the processes carrying a command's mark (its descendants), logging what could not be done.
async fn end_marked(envd: &Envd, pid: u32, mark: &str) {
    match tokio::time::timeout(REAP_LIMIT, reap(envd, mark, None)).await {
        Ok(Ok(0)) => {}
        Ok(Ok(ended)) => tracing::debug!(provider = PROVIDER, pid, ended, "ended what the command left running"),
        Ok(Err(e)) => tracing::warn!(provider = PROVIDER, pid, "could not end what the command left running: {e}"),
        Err(_) => tracing::warn!(provider = PROVIDER, pid, "ending what the command left running took too long"),
    }
}

/// Runs the reaper in the sandbox: ends every process whose environment matches `kill` and not `spare`; answers
/// how many it ended. Its own environment carries no mark.
async fn reap(envd: &Envd, kill: &str, spare: Option<&str>) -> Result<usize, SandboxError> {
    let spec = reaper::reaper_spec(kill, spare);
    let response = envd.stream("Start", &envd::start_request(&spec, None)).await?;
    let mut stream = EventStream::new(response);
    let mut out = Vec::new();
    loop {
        match stream.next().await {
            Next::Event(Event::Stdout(bytes)) => out.extend_from_slice(&bytes),
            Next::Event(Event::End(exit)) if exit.success() => break,
            Next::Event(Event::End(exit)) => {
                return Err(remote(RemoteFailure::Failed, format!("the reaper ended with {}", exit.describe())));
            }
            Next::Event(_) => {}
            Next::Finished(error) => {
                return Err(remote(RemoteFailure::Failed, format!("the reaper did not run: {error:?}")));
            }
            Next::Broken(why) => {
                return Err(remote(RemoteFailure::Failed, format!("the reaper's stream broke: {why}")));
            }
        }
    }
    Ok(reaper::reaped(&String::from_utf8_lossy(&out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn settings_are_read_as_the_sdks_read_them() {
        let s = E2bSettings::from_env(env(&[("E2B_API_KEY", "e2b_abc")])).unwrap();
        assert_eq!(
            (s.api_url.as_str(), s.sandbox_url, s.domain.as_str(), s.template.as_str(), s.timeout),
            ("https://api.e2b.app/", None, "e2b.app", "base", DEFAULT_TIMEOUT)
        );
        let s = E2bSettings::from_env(env(&[
            ("E2B_API_KEY", "e2b_abc"),
            ("E2B_DOMAIN", "cloud.example"),
            ("E2B_SANDBOX_URL", "http://127.0.0.1:5001"),
            ("ACP_SANDBOX_E2B_TEMPLATE", "acp-opencode"),
        ]))
        .unwrap();
        assert_eq!(s.api_url.as_str(), "https://api.cloud.example/");
        assert_eq!(s.sandbox_url.as_ref().map(Url::as_str), Some("http://127.0.0.1:5001/"));
        assert_eq!(s.template, "acp-opencode");
        let s = E2bSettings::from_env(env(&[("E2B_API_KEY", "k"), ("E2B_API_URL", "http://127.0.0.1:5000")])).unwrap();
        assert_eq!(s.api_url.as_str(), "http://127.0.0.1:5000/");
    }

    #[test]
    fn a_missing_key_or_a_bad_url_is_said_plainly() {
        let err = E2bSettings::from_env(env(&[("E2B_API_KEY", "  ")])).unwrap_err().to_string();
        assert!(err.starts_with("sandbox unavailable: E2B_API_KEY is not set"), "{err}");
        let err = E2bSettings::from_env(env(&[("E2B_API_KEY", "k"), ("E2B_API_URL", "no url")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sandbox unavailable: E2B_API_URL=no url is not a URL: relative URL without a base"
        );
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let s = E2bSettings::from_env(env(&[("E2B_API_KEY", "e2b_secret123")])).unwrap();
        let shown = format!("{s:?}");
        assert!(!shown.contains("secret123"), "{shown}");
        assert!(shown.contains("ApiKey(<redacted>)"), "{shown}");
    }
}
