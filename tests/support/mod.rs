//! Test support for the end-to-end tests: spawns the real `acp-sandbox` binary with the fake CLIs and talks ACP to
//! it over stdio, one JSON-RPC message per line.
//!
//! Every line the bridge writes to stdout is parsed and checked: it must be JSON-RPC 2.0, responses must answer a
//! request we sent and match the ACP schema of that request's method, `session/update` params must match
//! `SessionNotification`, errors must match `Error`. Anything else (a stray log line, an unknown notification, an
//! unexpected request) fails the test at once, with the bridge's stderr attached.

#![allow(dead_code)] // each test module uses a different part of the harness

pub mod acp_client;
pub mod schema;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use schema::Schemas;

/// Upper bound for every single receive from the bridge. Only a failure bound: nothing waits this long normally.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(20);
/// Upper bound for a whole request (a turn may stream for longer than one receive timeout).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The bridge binary under test: `ACP_SANDBOX_E2E_BIN` if set (e.g. an installed build), else cargo's build.
pub fn bridge_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("ACP_SANDBOX_E2E_BIN") {
        return PathBuf::from(path);
    }
    PathBuf::from(env!("CARGO_BIN_EXE_acp-sandbox"))
}

/// The directory with the fake `opencode` and `amp` executables.
pub fn fakes_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fakes")
}

/// Where the tests' directories go: `CARGO_TARGET_TMPDIR`, unless the checkout is under `/tmp`; then
/// `/var/tmp/acp-sandbox-tests-<uid>`. The sandbox's `/tmp` is a private tmpfs: a test's home, data dir or workspace
/// parent under `/tmp` would be invisible inside, and a write there would land in that tmpfs and fake a "blocked".
pub fn test_root() -> PathBuf {
    let target_tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let root = if target_tmp.starts_with(std::env::temp_dir()) {
        let uid = nix::unistd::getuid();
        PathBuf::from(format!("/var/tmp/acp-sandbox-tests-{uid}"))
    } else {
        target_tmp
    };
    std::fs::create_dir_all(&root).expect("create the tests' root dir");
    root
}

/// A fresh directory under [`test_root`].
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir_in(test_root()).expect("create a temp dir")
}

/// The directories of one test: a data dir for the bridge and workspaces for its sessions.
pub struct TestDirs {
    root: tempfile::TempDir,
    pub data: PathBuf,
}

impl TestDirs {
    pub fn new(name: &str) -> Self {
        let root = temp_dir(&format!("{name}-"));
        let data = root.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        TestDirs { root, data }
    }

    /// A new workspace directory (a session's `cwd`), canonical and absolute.
    pub fn workspace(&self, name: &str) -> PathBuf {
        let path = self.root.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        path.canonicalize().unwrap()
    }

    /// A workspace for a remote sandbox: its `.gitignore` keeps the fake CLI's record of its runs (`.fake-cli/`) in
    /// the sandbox, so it never comes back to the user's files as a change of the agent.
    pub fn remote_workspace(&self, name: &str) -> PathBuf {
        let ws = self.workspace(name);
        std::fs::write(ws.join(".gitignore"), ".fake-cli/\n").unwrap();
        ws
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }
}

impl Drop for TestDirs {
    /// Whatever a test leaves running (a fake CLI the bridge failed to kill, its grandchild) is killed here, so
    /// a failing test never leaks processes. Only processes that still look like ours are touched.
    fn drop(&mut self) {
        for (pid, cmdline) in processes_under(self.root.path()) {
            if cmdline.contains("fake_cli.py") || cmdline.starts_with("sleep 1000") {
                kill_if_cmdline_contains(pid, &cmdline);
            }
        }
        let Ok(entries) = std::fs::read_dir(self.root.path()) else {
            return;
        };
        for workspace in entries.flatten().map(|e| e.path()) {
            for run in invocations(&workspace) {
                kill_if_cmdline_contains(run.pid(), "fake_cli.py");
            }
            if let Some(pid) = read_pid_file(&workspace, &workspace.join(".fake-cli/child.pid")) {
                kill_if_cmdline_contains(pid, "sleep");
            }
        }
    }
}

fn kill_if_cmdline_contains(pid: i32, needle: &str) {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if pid > 0 && String::from_utf8_lossy(&cmdline).contains(needle) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// How to start the bridge.
#[derive(Clone, Debug)]
pub struct BridgeOptions {
    pub agent: String,
    pub sandbox: String,
    pub data_dir: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub env_remove: Vec<String>,
    /// Start as `acp-sandbox serve ...` instead of the bare `acp-sandbox ...` that editors run.
    pub serve_subcommand: bool,
    /// Pass agent, sandbox and data dir as `ACP_SANDBOX_*` variables instead of flags.
    pub config_via_env: bool,
    /// A command the bridge is started through, e.g. `setpriv --reuid=65534 ...` or `env -C DIR` (empty: none).
    pub launcher: Vec<String>,
    /// The bridge's binary, when not [`bridge_bin`] (a copy another user can run).
    pub bin: Option<PathBuf>,
}

/// OpenCode without `--opencode-bin` and not on PATH, so the first prompt installs it, with `tests/fakes/npm` as
/// the `npm` it installs with: an install that never ends. The fake writes its pid and its child's to `npm_dir`.
pub fn installing_forever(data_dir: &Path, npm_dir: &Path) -> BridgeOptions {
    let mut options = BridgeOptions::new("opencode", data_dir);
    options.env.retain(|(name, _)| name != "ACP_SANDBOX_OPENCODE_BIN");
    options.env.push(("PATH".into(), format!("{}:/usr/bin:/bin", fakes_dir().join("npm").display())));
    options.env.push(("FAKE_NPM_DIR".into(), npm_dir.display().to_string()));
    options
}

/// Waits until the fake npm of [`installing_forever`] runs; returns its pid and its child's.
pub fn wait_npm(npm_dir: &Path) -> (i32, i32) {
    let npm_pid = npm_dir.join("npm.pid");
    assert!(wait_until(RECV_TIMEOUT, || npm_pid.exists()), "the install never started npm");
    let read = |name: &str| -> i32 { std::fs::read_to_string(npm_dir.join(name)).unwrap().trim().parse().unwrap() };
    (read("npm.pid"), read("child.pid"))
}

/// The Amp key the tests give the bridge (the fake only checks that one is set).
pub const FAKE_AMP_KEY: &str = "sgamp_user_e2e_dummy_key";

impl BridgeOptions {
    /// `acp-sandbox --agent <agent> --sandbox none --data-dir <data_dir>`, with the fake CLIs and an Amp key.
    pub fn new(agent: &str, data_dir: &Path) -> Self {
        let fakes = fakes_dir();
        BridgeOptions {
            agent: agent.to_string(),
            // `ACP_SANDBOX_E2E_SANDBOX=bwrap` runs the whole suite under bubblewrap (what most users get).
            sandbox: std::env::var("ACP_SANDBOX_E2E_SANDBOX").unwrap_or_else(|_| "none".to_string()),
            data_dir: data_dir.to_path_buf(),
            args: vec![],
            env: vec![
                ("ACP_SANDBOX_OPENCODE_BIN".into(), fakes.join("opencode").display().to_string()),
                ("ACP_SANDBOX_AMP_BIN".into(), fakes.join("amp").display().to_string()),
                ("AMP_API_KEY".into(), FAKE_AMP_KEY.into()),
                // The fake `opencode` behaves like `opencode run`; the server backend is tested with the real CLI.
                ("ACP_SANDBOX_OPENCODE_BACKEND".into(), "run".into()),
                // The fake CLIs replay recorded streams from tests/fixtures, which the sandbox hides with the rest
                // of /tmp when the checkout is there: shown like any data a CLI needs besides its own folder.
                ("ACP_SANDBOX_ALLOW_READ".into(), fakes.with_file_name("fixtures").display().to_string()),
                ("RUST_LOG".into(), std::env::var("RUST_LOG").unwrap_or_else(|_| "debug".into())),
            ],
            env_remove: vec!["ACP_SANDBOX_AGENT".into(), "ACP_SANDBOX_SANDBOX".into(), "ACP_SANDBOX_DATA_DIR".into()],
            serve_subcommand: false,
            config_via_env: false,
            launcher: vec![],
            bin: None,
        }
    }

    /// The bridge's command line and environment (its stdio is the caller's to set).
    pub fn command(&self) -> Command {
        let bin = self.bin.clone().unwrap_or_else(bridge_bin);
        let mut command = match self.launcher.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&bin);
                command
            }
            None => Command::new(&bin),
        };
        if self.serve_subcommand {
            command.arg("serve");
        }
        for key in &self.env_remove {
            command.env_remove(key);
        }
        if self.config_via_env {
            command
                .env("ACP_SANDBOX_AGENT", &self.agent)
                .env("ACP_SANDBOX_SANDBOX", &self.sandbox)
                .env("ACP_SANDBOX_DATA_DIR", &self.data_dir);
        } else {
            command
                .arg("--agent")
                .arg(&self.agent)
                .arg("--sandbox")
                .arg(&self.sandbox)
                .arg("--data-dir")
                .arg(&self.data_dir);
        }
        command.args(&self.args);
        for (key, value) in &self.env {
            command.env(key, value);
        }
        command
    }

    pub fn sandbox(mut self, sandbox: &str) -> Self {
        self.sandbox = sandbox.to_string();
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    pub fn without_env(mut self, key: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env_remove.push(key.to_string());
        self
    }
}

/// A JSON-RPC error object received from the bridge.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    /// Message and data as one string, to look for text the error must carry.
    pub fn full_text(&self) -> String {
        match &self.data {
            Some(data) => format!("{} {}", self.message, data),
            None => self.message.clone(),
        }
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JSON-RPC error {}: {}", self.code, self.message)?;
        if let Some(data) = &self.data {
            write!(f, " (data: {data})")?;
        }
        Ok(())
    }
}

/// What the bridge answered to one prompt, with the `session/update`s it sent for the session before answering.
#[derive(Debug)]
pub struct Turn {
    pub result: Result<Value, RpcError>,
    pub updates: Vec<Value>,
}

impl Turn {
    /// The stop reason, failing the test with the error if the prompt failed.
    pub fn stop_reason(&self) -> String {
        match &self.result {
            Ok(result) => result["stopReason"].as_str().unwrap_or_default().to_string(),
            Err(e) => panic!("the prompt failed: {e}"),
        }
    }

    pub fn agent_text(&self) -> String {
        text_of(&self.updates, "agent_message_chunk")
    }

    /// The agent's own text chunks, in order: the bridge's notes (a `_…_` line) left out.
    pub fn agent_chunks(&self) -> Vec<&str> {
        self.updates
            .iter()
            .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|u| u["content"]["text"].as_str())
            .filter(|text| !text.trim().starts_with('_'))
            .collect()
    }
}

/// A prompt of the fake OpenCode's `files` scenario: the ops of `list`, done in its working directory.
pub fn ops(list: Value) -> String {
    format!("SCENARIO:files OPS:{list}")
}

/// The notes of a turn: its agent text chunks that are a whole `_…_` line.
pub fn notes(turn: &Turn) -> Vec<String> {
    turn.updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .map(|text| text.trim().to_string())
        .filter(|text| text.starts_with('_') && text.ends_with('_'))
        .collect()
}

/// What the fake's `read` ops found, from its last text.
pub fn reads(turn: &Turn) -> String {
    let text = turn.agent_text();
    text[text.find("READ ").unwrap_or_else(|| panic!("no READ in {text:?}"))..].to_string()
}

/// The concatenated text of every update of `kind` (e.g. `agent_message_chunk`).
pub fn text_of(updates: &[Value], kind: &str) -> String {
    updates.iter().filter(|u| u["sessionUpdate"] == kind).filter_map(|u| u["content"]["text"].as_str()).collect()
}

/// The `sessionUpdate` kinds of `updates`, in order.
pub fn kinds(updates: &[Value]) -> Vec<String> {
    updates.iter().map(|u| u["sessionUpdate"].as_str().unwrap_or("?").to_string()).collect()
}

enum Line {
    Stdout(String),
    Eof,
}

/// A running bridge and the client side of its ACP connection.
pub struct Bridge {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Line>,
    stdout_closed: bool,
    stderr: Arc<Mutex<Vec<u8>>>,
    next_id: i64,
    /// Requests sent and not answered yet: id -> method.
    pending: HashMap<i64, String>,
    /// Responses that arrived while we waited for something else.
    responses: HashMap<i64, Result<Value, RpcError>>,
    /// `session/update` params not consumed yet, in arrival order.
    updates: VecDeque<Value>,
    /// Error responses with `id: null` (parse errors).
    null_id_errors: VecDeque<RpcError>,
    /// Every message received, for failure messages.
    transcript: Vec<String>,
    /// How `session/request_permission` is answered: the option of this kind (`allow_once`, `reject_once`, …);
    /// `None` answers `cancelled`.
    pub permission_answer: Option<String>,
    /// Every `session/request_permission` received (its params), in order.
    pub permission_requests: Vec<Value>,
    /// Their request ids, in the same order.
    pub permission_ids: Vec<Value>,
    /// Leave every `session/request_permission` unanswered, as a user who does not answer (recorded all the same).
    pub hold_permissions: bool,
    /// Advertise `fs.writeTextFile` in `initialize` (a client like Zed that reviews the agent's writes).
    pub offer_writes: bool,
    /// How `fs/write_text_file` is answered: write the content to disk (Keep) or answer without writing, which
    /// leaves the user's file as it was (Reject).
    pub keep_writes: bool,
    /// Answer `fs/write_text_file` with this JSON-RPC error message instead (an editor that refuses).
    pub refuse_writes: Option<String>,
    /// Every `fs/write_text_file` received, in order.
    pub file_writes: Vec<FileWrite>,
    /// Offer `elicitation.form` in `initialize` and answer each `elicitation/create` with this result
    /// (`{"action": "accept", "content": {…}}`, `{"action": "decline"}`); `null` leaves it unanswered, as a user
    /// who does not answer.
    pub elicitation_answer: Option<Value>,
    /// Every `elicitation/create` received (its params), in order.
    pub elicitations: Vec<Value>,
    /// The ids of the bridge's own requests it withdrew (`$/cancel_request`), and of its elicitations, in order.
    pub withdrawn: Vec<Value>,
    pub elicitation_ids: Vec<Value>,
    pub options: BridgeOptions,
}

/// One `fs/write_text_file` the bridge sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileWrite {
    pub path: PathBuf,
    pub content: String,
    /// What the file held on disk when the request arrived (`None`: no file).
    pub before: Option<String>,
}

impl Bridge {
    /// Starts the bridge; does not initialize it.
    pub fn spawn(options: BridgeOptions) -> Bridge {
        let mut command = options.command();
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn acp-sandbox");

        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Line::Eof);
                        return;
                    }
                    Ok(_) => {
                        if tx.send(Line::Stdout(line)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = stderr.clone();
        let mut pipe = child.stderr.take().unwrap();
        thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });

        Bridge {
            stdin: child.stdin.take(),
            child,
            lines,
            stdout_closed: false,
            stderr,
            next_id: 0,
            pending: HashMap::new(),
            responses: HashMap::new(),
            updates: VecDeque::new(),
            null_id_errors: VecDeque::new(),
            transcript: Vec::new(),
            permission_answer: None,
            elicitation_answer: None,
            elicitations: Vec::new(),
            withdrawn: Vec::new(),
            elicitation_ids: Vec::new(),
            permission_requests: Vec::new(),
            permission_ids: Vec::new(),
            hold_permissions: false,
            offer_writes: false,
            keep_writes: true,
            refuse_writes: None,
            file_writes: Vec::new(),
            options,
        }
    }

    /// Starts the bridge and completes `initialize`.
    pub fn start(options: BridgeOptions) -> Bridge {
        let mut bridge = Bridge::spawn(options);
        bridge.initialize();
        bridge
    }

    /// Starts the bridge and completes `initialize` as a client that offers `fs/write_text_file` and keeps
    /// (`keep`: writes to disk) or rejects (answers without writing) every write.
    pub fn start_reviewing(options: BridgeOptions, keep: bool) -> Bridge {
        let mut bridge = Bridge::spawn(options);
        bridge.offer_writes = true;
        bridge.keep_writes = keep;
        bridge.initialize();
        bridge
    }

    /// Sends `initialize` the way Zed does (protocol 1, no terminal; fs writes only with `offer_writes`) and
    /// returns the result.
    pub fn initialize(&mut self) -> Value {
        let writes = self.offer_writes;
        let mut capabilities = json!({"fs": {"readTextFile": false, "writeTextFile": writes}, "terminal": false});
        if self.elicitation_answer.is_some() {
            capabilities["elicitation"] = json!({"form": {}});
        }
        self.request(
            "initialize",
            json!({
                "protocolVersion": 1,
                "clientCapabilities": capabilities,
                "clientInfo": {"name": "acp-sandbox-e2e", "title": "acp-sandbox e2e tests", "version": "0.0.0"}
            }),
        )
        .unwrap_or_else(|e| self.fail(&format!("initialize failed: {e}")))
    }

    /// The bridge's stderr so far (its logs).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Fails the test with `message`, the last messages received and the bridge's stderr tail.
    pub fn fail(&self, message: &str) -> ! {
        let stderr = self.stderr();
        let tail: String =
            stderr.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        let recent: Vec<&String> = self.transcript.iter().rev().take(15).rev().collect();
        panic!(
            "{message}\n--- last messages from the bridge ---\n{}\n--- bridge stderr (tail) ---\n{tail}",
            recent.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
        );
    }

    // ---- sending -----------------------------------------------------------------------------------------------

    /// Writes one raw line (a newline is appended).
    pub fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        let ok = stdin.write_all(line.as_bytes()).and_then(|_| stdin.write_all(b"\n")).and_then(|_| stdin.flush());
        if let Err(e) = ok {
            self.fail(&format!("writing to the bridge's stdin failed: {e}"));
        }
    }

    /// Writes bytes exactly as given, in one write: several lines, invalid UTF-8, no final newline.
    pub fn send_raw_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        if let Err(e) = stdin.write_all(bytes).and_then(|_| stdin.flush()) {
            self.fail(&format!("writing to the bridge's stdin failed: {e}"));
        }
    }

    /// Reserves a request id for a request the test writes itself (with [`Bridge::send_raw_bytes`]): an answer
    /// with this id is then accepted once, checked against `method`'s schema. A reserved id that is never answered
    /// is fine unless the test waits for it.
    pub fn reserve_id(&mut self, method: &str) -> i64 {
        self.next_id += 1;
        self.pending.insert(self.next_id, method.to_string());
        self.next_id
    }

    /// Like [`Bridge::reserve_id`] for an id the test picked.
    pub fn reserve_this_id(&mut self, id: i64, method: &str) {
        assert!(self.pending.insert(id, method.to_string()).is_none(), "id {id} reserved twice");
    }

    /// Whether the bridge process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends a request without waiting; returns its id for [`Bridge::wait_response`].
    pub fn send_request(&mut self, method: &str, params: Value) -> i64 {
        self.next_id += 1;
        let id = self.next_id;
        self.pending.insert(id, method.to_string());
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_raw(&message.to_string());
        id
    }

    /// Sends a notification (no answer expected).
    pub fn notify(&mut self, method: &str, params: Value) {
        let message = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.send_raw(&message.to_string());
    }

    /// Sends a request and waits for its response, buffering the notifications that arrive meanwhile.
    pub fn request(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.send_request(method, params);
        self.wait_response(id)
    }

    /// Closes the bridge's stdin (what an editor does when it goes away cleanly).
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    // ---- receiving ---------------------------------------------------------------------------------------------

    /// Waits for the response to request `id`.
    pub fn wait_response(&mut self, id: i64) -> Result<Value, RpcError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            if let Some(response) = self.responses.remove(&id) {
                return response;
            }
            if Instant::now() > deadline {
                self.fail(&format!("no response to request {id} within {REQUEST_TIMEOUT:?}"));
            }
            let method = self.pending.get(&id).cloned().unwrap_or_default();
            self.pump_or_fail(&format!("the response to {method} (id {id})"));
        }
    }

    /// Like [`Bridge::wait_response`], but gives up after `timeout` (a failure bound chosen by the test), returning
    /// `None`, instead of failing when the bridge stays silent for one receive timeout.
    pub fn wait_response_within(&mut self, id: i64, timeout: Duration) -> Option<Result<Value, RpcError>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(response) = self.responses.remove(&id) {
                return Some(response);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.pump(left);
        }
    }

    /// Waits until the bridge sent `count` `session/request_permission`s in all, failing after `timeout`.
    pub fn wait_permission_requests(&mut self, count: usize, timeout: Duration) {
        self.wait_requests("session/request_permission", |bridge| bridge.permission_requests.len() >= count, timeout);
    }

    /// Waits until the bridge asked `count` `elicitation/create`s in all, failing after `timeout`.
    pub fn wait_elicitations(&mut self, count: usize, timeout: Duration) {
        self.wait_requests("elicitation/create", |bridge| bridge.elicitations.len() >= count, timeout);
    }

    /// Reads messages until `enough` of the bridge's `method` requests came, failing after `timeout`.
    fn wait_requests(&mut self, method: &str, enough: impl Fn(&Self) -> bool, timeout: Duration) {
        self.pump_until(&format!("the bridge's {method}"), timeout, enough);
    }

    /// Reads the bridge until `done` holds, failing after `timeout`.
    pub fn pump_until(&mut self, what: &str, timeout: Duration, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.fail(&format!("{what}: not within {timeout:?}"));
            }
            self.pump(left.min(Duration::from_millis(100)));
        }
    }

    /// Reads and checks one message from the bridge, waiting at most `timeout`. Returns false on timeout.
    fn pump(&mut self, timeout: Duration) -> bool {
        if self.stdout_closed {
            self.fail("the bridge closed its stdout while a message was still expected");
        }
        match self.lines.recv_timeout(timeout) {
            Ok(Line::Stdout(line)) => {
                self.accept(line);
                true
            }
            Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => {
                self.stdout_closed = true;
                let status = self.child.try_wait().ok().flatten();
                self.fail(&format!(
                    "the bridge closed its stdout while a message was still expected (exit status: {status:?})"
                ));
            }
            Err(RecvTimeoutError::Timeout) => false,
        }
    }

    /// Like [`Bridge::pump`], failing the test on timeout.
    fn pump_or_fail(&mut self, what: &str) {
        if !self.pump(RECV_TIMEOUT) {
            self.fail(&format!("the bridge sent nothing for {RECV_TIMEOUT:?} while we waited for {what}"));
        }
    }

    /// Validates one stdout line and files it as a response, an update or a null-id error.
    fn accept(&mut self, line: String) {
        let schemas = Schemas::get();
        let trimmed = line.strip_suffix('\n').unwrap_or(&line).to_string();
        self.transcript.push(trimmed.clone());
        if !line.ends_with('\n') {
            self.fail(&format!("the bridge wrote a line without a newline before closing stdout: {trimmed:?}"));
        }
        let message: Value = match serde_json::from_str(&trimmed) {
            Ok(v) => v,
            Err(e) => self.fail(&format!("the bridge wrote a non-JSON line to stdout ({e}): {trimmed:?}")),
        };
        if message.get("jsonrpc") != Some(&json!("2.0")) {
            self.fail(&format!("not a JSON-RPC 2.0 message: {trimmed}"));
        }
        let check = |this: &Self, schema: &str, value: &Value| {
            if let Err(e) = schemas.validate(schema, value) {
                this.fail(&format!("schema violation: {e}\nmessage: {trimmed}"));
            }
        };

        if let Some(method) = message.get("method").and_then(Value::as_str) {
            if method == "session/request_permission"
                && let Some(id) = message.get("id").cloned()
            {
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                check(self, "RequestPermissionRequest", &params);
                self.permission_ids.push(id.clone());
                if self.hold_permissions {
                    self.permission_requests.push(params);
                    return;
                }
                let chosen = self.permission_answer.as_ref().and_then(|kind| {
                    params["options"]
                        .as_array()?
                        .iter()
                        .find(|o| o["kind"] == kind.as_str())
                        .map(|o| o["optionId"].clone())
                });
                let outcome = match chosen {
                    Some(option) => json!({"outcome": "selected", "optionId": option}),
                    None => json!({"outcome": "cancelled"}),
                };
                self.permission_requests.push(params);
                self.send_raw(&json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": outcome}}).to_string());
                return;
            }
            if method == "elicitation/create"
                && let (Some(id), Some(answer)) = (message.get("id").cloned(), self.elicitation_answer.clone())
            {
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                check(self, "CreateElicitationRequest", &params);
                self.elicitations.push(params);
                self.elicitation_ids.push(id.clone());
                if !answer.is_null() {
                    self.send_raw(&json!({"jsonrpc": "2.0", "id": id, "result": answer}).to_string());
                }
                return;
            }
            if method == "fs/write_text_file"
                && self.offer_writes
                && let Some(id) = message.get("id").cloned()
            {
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                check(self, "WriteTextFileRequest", &params);
                let path = PathBuf::from(params["path"].as_str().unwrap_or_default());
                let content = params["content"].as_str().unwrap_or_default().to_string();
                if !path.is_absolute() {
                    self.fail(&format!("fs/write_text_file with a relative path: {trimmed}"));
                }
                let before = std::fs::read_to_string(&path).ok();
                if let Some(message) = self.refuse_writes.clone() {
                    self.file_writes.push(FileWrite { path, content, before });
                    let error = json!({"code": -32603, "message": message});
                    self.send_raw(&json!({"jsonrpc": "2.0", "id": id, "error": error}).to_string());
                    return;
                }
                if self.keep_writes {
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    std::fs::write(&path, &content).unwrap();
                }
                self.file_writes.push(FileWrite { path, content, before });
                self.send_raw(&json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string());
                return;
            }
            if method == "$/cancel_request" && message.get("id").is_none() {
                self.withdrawn.push(message["params"]["requestId"].clone());
                return;
            }
            if message.get("id").is_some() {
                self.fail(&format!(
                    "unexpected request from the bridge (the tests grant no client capabilities): {trimmed}"
                ));
            }
            if method != "session/update" {
                self.fail(&format!("unexpected notification from the bridge: {trimmed}"));
            }
            let params = message.get("params").cloned().unwrap_or(Value::Null);
            check(self, "SessionNotification", &params);
            self.updates.push_back(params);
            return;
        }

        let has_result = message.get("result").is_some();
        let has_error = message.get("error").is_some();
        if has_result == has_error {
            self.fail(&format!("a response must have exactly one of result and error: {trimmed}"));
        }
        let outcome = if has_error {
            let error = &message["error"];
            check(self, "Error", error);
            Err(RpcError {
                code: error["code"].as_i64().unwrap_or_default(),
                message: error["message"].as_str().unwrap_or_default().to_string(),
                data: error.get("data").cloned(),
            })
        } else {
            Ok(message["result"].clone())
        };
        match message.get("id") {
            Some(Value::Null) if has_error => self.null_id_errors.push_back(outcome.unwrap_err()),
            Some(Value::Number(n)) if n.as_i64().is_some_and(|id| self.pending.contains_key(&id)) => {
                let id = n.as_i64().unwrap();
                let method = self.pending.remove(&id).unwrap();
                if let (Ok(result), Some(schema)) = (&outcome, schema::response_schema(&method)) {
                    check(self, schema, result);
                }
                self.responses.insert(id, outcome);
            }
            _ => self.fail(&format!("a response to no request of ours: {trimmed}")),
        }
    }

    /// Takes every buffered `session/update` of `session_id` (the `update` objects).
    pub fn take_updates(&mut self, session_id: &str) -> Vec<Value> {
        let mut taken = Vec::new();
        self.updates.retain(|n| {
            if n["sessionId"] == session_id {
                taken.push(n["update"].clone());
                false
            } else {
                true
            }
        });
        taken
    }

    /// Waits until an update of `session_id` satisfies `pred`; returns it. Earlier updates of the session are
    /// consumed; updates of other sessions stay buffered.
    pub fn wait_update(&mut self, session_id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            while let Some(pos) = self.updates.iter().position(|n| n["sessionId"] == session_id) {
                let update = self.updates.remove(pos).unwrap()["update"].clone();
                if pred(&update) {
                    return update;
                }
            }
            if Instant::now() > deadline {
                self.fail(&format!("no update of {session_id} matching {what}"));
            }
            self.pump_or_fail(what);
        }
    }

    /// Waits for an error response with `id: null` (the answer to an unparsable line).
    pub fn wait_null_id_error(&mut self) -> RpcError {
        loop {
            if let Some(error) = self.null_id_errors.pop_front() {
                return error;
            }
            self.pump_or_fail("an error response with id null");
        }
    }

    // ---- ACP helpers -------------------------------------------------------------------------------------------

    /// `session/new` in `cwd`; returns the session id.
    pub fn new_session(&mut self, cwd: &Path) -> String {
        let result = self
            .request("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .unwrap_or_else(|e| self.fail(&format!("session/new failed: {e}")));
        result["sessionId"].as_str().expect("sessionId").to_string()
    }

    /// Sends a prompt made of one text block, without waiting. Stale updates of the session are dropped first.
    pub fn send_prompt(&mut self, session_id: &str, text: &str) -> i64 {
        self.send_prompt_blocks(session_id, vec![json!({"type": "text", "text": text})])
    }

    pub fn send_prompt_blocks(&mut self, session_id: &str, blocks: Vec<Value>) -> i64 {
        self.take_updates(session_id);
        self.send_request("session/prompt", json!({"sessionId": session_id, "prompt": blocks}))
    }

    /// Waits for the answer to a prompt sent with [`Bridge::send_prompt`], with the session's updates.
    pub fn finish_turn(&mut self, session_id: &str, id: i64) -> Turn {
        let result = self.wait_response(id);
        Turn { result, updates: self.take_updates(session_id) }
    }

    /// A whole turn: one text block in, the updates and the answer out.
    pub fn prompt(&mut self, session_id: &str, text: &str) -> Turn {
        let id = self.send_prompt(session_id, text);
        self.finish_turn(session_id, id)
    }

    /// `session/load`: the updates replayed before the answer, and the answer.
    pub fn load_session(&mut self, session_id: &str, cwd: &Path) -> Turn {
        self.take_updates(session_id);
        let result = self.request("session/load", json!({"sessionId": session_id, "cwd": cwd, "mcpServers": []}));
        Turn { result, updates: self.take_updates(session_id) }
    }

    pub fn cancel(&mut self, session_id: &str) {
        self.notify("session/cancel", json!({"sessionId": session_id}));
    }

    // ---- process control ---------------------------------------------------------------------------------------

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, like Zed closing the project; waits for the process to be gone.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the bridge to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whatever the bridge still writes after its last expected message must be valid too; returns when stdout
    /// closes or after `timeout`.
    pub fn drain_stdout(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.stdout_closed && Instant::now() < deadline {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Line::Stdout(line)) => self.accept(line),
                Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => self.stdout_closed = true,
                Err(RecvTimeoutError::Timeout) => break,
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---- the fake CLIs' records ----------------------------------------------------------------------------------

/// One run of a fake CLI, as it recorded itself in `<cwd>/.fake-cli/invocations.jsonl`.
#[derive(Clone, Debug)]
pub struct Invocation(pub Value, PathBuf);

impl Invocation {
    pub fn argv(&self) -> Vec<String> {
        self.0["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
    }

    /// The value following `flag` in argv, if the flag is there.
    pub fn flag_value(&self, flag: &str) -> Option<String> {
        let argv = self.argv();
        argv.iter().position(|a| a == flag).and_then(|i| argv.get(i + 1).cloned())
    }

    pub fn has_flag(&self, flag: &str) -> bool {
        self.argv().iter().any(|a| a == flag)
    }

    /// stdin exactly as the CLI received it.
    pub fn stdin(&self) -> Vec<u8> {
        use base64::Engine;
        let b64 = self.0["stdin_b64"].as_str().expect("stdin was read");
        base64::engine::general_purpose::STANDARD.decode(b64).unwrap()
    }

    /// stdin as text (lossy), for readable assertions.
    pub fn stdin_text(&self) -> String {
        String::from_utf8_lossy(&self.stdin()).into_owned()
    }

    pub fn env(&self, key: &str) -> Option<String> {
        self.0["env"][key].as_str().map(str::to_string)
    }

    pub fn env_keys(&self) -> Vec<String> {
        self.0["env"].as_object().unwrap().keys().cloned().collect()
    }

    pub fn cwd(&self) -> PathBuf {
        PathBuf::from(self.0["cwd"].as_str().unwrap())
    }

    /// The run's pid as this test sees it (the fake records its pid inside the sandbox's PID namespace, if any);
    /// -1 once the run is gone.
    pub fn pid(&self) -> i32 {
        host_pid(&self.1, self.0["pid"].as_i64().unwrap() as i32).unwrap_or(-1)
    }

    /// The OpenCode session / Amp thread id the fake used (generated, or the one it was asked to continue).
    pub fn cli_session(&self) -> String {
        self.0["session"].as_str().unwrap_or_default().to_string()
    }
}

/// The state dir of the session's local sandbox, as the store names it: its own (`sessions/<sid>`) or the one its
/// workspace's sessions share (`sessions/workspace-…`).
pub fn sandbox_state(data: &Path, sid: &str) -> PathBuf {
    let db = rusqlite::Connection::open(data.join("acp-sandbox.sqlite3")).unwrap();
    let id: Option<String> =
        db.query_row("SELECT sandbox_id FROM sessions WHERE id = ?1", [sid], |row| row.get(0)).unwrap();
    PathBuf::from(id.unwrap_or_else(|| panic!("the session {sid} has no sandbox yet")))
}

/// Waits until the store has the session's CLI conversation id (written while the turn runs).
pub fn wait_native_id(dirs: &TestDirs, sid: &str) {
    let db = rusqlite::Connection::open(dirs.data.join("acp-sandbox.sqlite3")).unwrap();
    let stored = || {
        db.query_row("SELECT native_id FROM sessions WHERE id = ?1", [sid], |row| row.get::<_, Option<String>>(0))
            .ok()
            .flatten()
            .is_some()
    };
    assert!(wait_until(RECV_TIMEOUT, stored), "the CLI's conversation id was never stored");
}

/// A new bridge (`options`) after one was SIGKILLed mid-turn in a remote sandbox: it loads the session and
/// prompts, and what the killed bridge left running is ended first, said in a note before the answer.
pub fn prompt_after_a_killed_bridge(options: BridgeOptions, ws: &Path, sid: &str) -> Bridge {
    let mut bridge = Bridge::start(options);
    bridge.request("session/load", json!({"sessionId": sid, "cwd": ws, "mcpServers": []})).unwrap();
    let turn = bridge.prompt(sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(
        turn.agent_text(),
        "\n\n_OpenCode was still running in the sandbox from a turn acp-sandbox did not see to its end (it stopped \
         mid-turn); that run was stopped before this prompt._\n\nYes, I remember: this is turn two of the same session."
    );
    bridge
}

/// Every fake CLI run in `workspace`, oldest first.
pub fn invocations(workspace: &Path) -> Vec<Invocation> {
    let path = workspace.join(".fake-cli/invocations.jsonl");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let record = |line: &str| serde_json::from_str(line).expect("invocation record is JSON");
            text.lines().map(|line| Invocation(record(line), workspace.to_path_buf())).collect()
        }
        Err(_) => vec![],
    }
}

// ---- processes -----------------------------------------------------------------------------------------------

/// Waits until the fake CLI has recorded at least `count` runs in `workspace`; returns them.
pub fn wait_invocations(workspace: &Path, count: usize) -> Vec<Invocation> {
    let found = wait_until(RECV_TIMEOUT, || invocations(workspace).len() >= count);
    let runs = invocations(workspace);
    assert!(found, "expected {count} fake CLI runs in {}, found {}", workspace.display(), runs.len());
    runs
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` is a live process (zombies count as dead).
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name, which may itself contain spaces or parens.
            let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// Live processes whose working directory is `dir` or below: what is left of the turns run there. Works for
/// sandboxed CLIs too, whose pids inside their PID namespace mean nothing out here.
pub fn processes_under(dir: &Path) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return vec![] };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir)))
        .filter(|&pid| pid_alive(pid))
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (pid, String::from_utf8_lossy(&cmdline).replace('\0', " ").trim().to_string())
        })
        .collect()
}

/// The pid, as this test sees it, of the live process under `dir` that has pid `inner` in its own PID namespace:
/// a sandboxed process knows only the pid inside its sandbox, and without a sandbox the two are the same.
pub fn host_pid(dir: &Path, inner: i32) -> Option<i32> {
    processes_under(dir).into_iter().map(|(pid, _)| pid).find(|&pid| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let nspid = status.lines().find_map(|line| line.strip_prefix("NSpid:"));
        nspid.and_then(|pids| pids.split_whitespace().last()).and_then(|p| p.parse().ok()) == Some(inner)
    })
}

/// The pid a fake wrote to `file` (from inside its sandbox, if any), as this test sees it: `None` when there is no
/// such file or the process under `dir` is gone.
pub fn read_pid_file(dir: &Path, file: &Path) -> Option<i32> {
    host_pid(dir, std::fs::read_to_string(file).ok()?.trim().parse().ok()?)
}

/// Asserts that no process is left running in `dir` (waiting up to 5 s for them to go).
pub fn assert_no_processes_under(dir: &Path, when: &str) {
    let gone = wait_until(Duration::from_secs(5), || processes_under(dir).is_empty());
    assert!(gone, "processes left running in {} {when}: {:?}", dir.display(), processes_under(dir));
}

/// Kills `pid` with SIGKILL when dropped, so a test that fails never leaks the processes it started.
pub struct KillOnDrop(pub i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0 > 0 && pid_alive(self.0) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Whether unprivileged bubblewrap works here; `Err` says why not.
pub fn bwrap_usable() -> Result<(), String> {
    match Command::new("bwrap")
        .args(["--unshare-user", "--ro-bind", "/", "/", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`bwrap --unshare-user --ro-bind / / true` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run bwrap: {e}")),
    }
}

// ---- doctor --------------------------------------------------------------------------------------------------

/// `acp-sandbox doctor <args> --data-dir <data>` with only `env` (and a PATH, a HOME in the data dir and the fake
/// CLIs): nothing of the machine's own keys. Its exit code, stdout and stderr.
pub fn doctor_with(data: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let output = Command::new(bridge_bin())
        .arg("doctor")
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .current_dir(data)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", data)
        .env("ACP_SANDBOX_OPENCODE_BIN", fakes_dir().join("opencode"))
        .env("ACP_SANDBOX_OPENCODE_BACKEND", "run")
        .envs(env.iter().copied())
        .output()
        .expect("run acp-sandbox doctor");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

/// The lines of `doctor`'s section that starts with `label` (its first line) and goes on with indented lines.
pub fn doctor_section<'a>(out: &'a str, label: &str) -> Vec<&'a str> {
    let head = format!("{label:<10}  ");
    out.lines()
        .skip_while(|line| !line.starts_with(&head))
        .enumerate()
        .take_while(|(i, line)| *i == 0 || line.starts_with("            "))
        .map(|(_, line)| line)
        .collect()
}

/// An npm that "installs" the fake OpenCode (`.bin/opencode` runs it) and logs its argv to `$HOME/npm.log` (the
/// session's HOME inside a remote sandbox): the body of a `#!/bin/sh` script.
pub fn installing_npm() -> String {
    format!(
        "echo \"$@\" >> \"$HOME/npm.log\"\n\
         while [ $# -gt 0 ]; do [ \"$1\" = --prefix ] && prefix=\"$2\"; shift; done\n\
         mkdir -p \"$prefix/node_modules/.bin\"\n\
         printf '#!/bin/sh\\nexec /usr/bin/python3 %s opencode \"$@\"\\n' '{}' > \"$prefix/node_modules/.bin/opencode\"\n\
         chmod +x \"$prefix/node_modules/.bin/opencode\"\n",
        fakes_dir().join("fake_cli.py").display()
    )
}

/// A bridge's upstream proxy (its `HTTPS_PROXY`) on 127.0.0.1, the "internet" of the `--network ask` tests: records
/// the first line of each request, answers 200 and echoes what comes through the tunnel.
pub struct UpstreamProxy {
    pub port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl UpstreamProxy {
    pub fn start() -> UpstreamProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let record = record.clone();
                std::thread::spawn(move || {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if stream.read(&mut byte).unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    record.lock().unwrap().push(head.lines().next().unwrap_or_default().to_string());
                    stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
                    let mut buf = [0u8; 4096];
                    while let Ok(read) = stream.read(&mut buf) {
                        if read == 0 || stream.write_all(&buf[..read]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        UpstreamProxy { port, seen }
    }

    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}
