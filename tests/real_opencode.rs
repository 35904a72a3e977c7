//! acp-sandbox against the REAL OpenCode CLI (npm `opencode-ai@1.18.33`), talking to a scripted fake
//! OpenAI-compatible model on 127.0.0.1 (`tests/fakes/fake_openai.py`). Nothing leaves the machine.
//!
//! The bridge binary is driven over stdio like Zed drives it (the `support` harness checks every message against
//! the ACP schemas). It gets a HOME / XDG_CONFIG_HOME holding `opencode/opencode.json` with the fake provider, which
//! the bridge shows to OpenCode inside each session's state dir.
//!
//! Run: `ACP_SANDBOX_TEST_OPENCODE="$(.ci/install-opencode.sh)" cargo test --test real_opencode -- --nocapture`.
//! Without that variable the test looks in the install script's default prefix; when OpenCode is not there it
//! FAILS and says to run the script. `ACP_SANDBOX_SKIP_REAL_OPENCODE=1` skips every test here (and says so).
//! With `--nocapture` each test prints `TIMING` lines (bridge start, one turn under `none` vs `bwrap`).
// Tests start the bridge, fake CLIs and servers themselves.
#![allow(clippy::disallowed_methods)]
// A test fails by panicking: unwrap and expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// The OpenCode version `.ci/install-opencode.sh` installs.
const OPENCODE_VERSION: &str = "1.18.33";

/// The `.gitignore` OpenCode 1.18.33 creates in every config dir it loads, when it is missing.
const OPENCODE_CONFIG_GITIGNORE: &str = "node_modules\npackage.json\npackage-lock.json\nbun.lock\n.gitignore";

// ---- finding OpenCode ----------------------------------------------------------------------------------------

/// The real OpenCode executable, or `None` when the tests are told to skip. Panics when it cannot be found.
fn opencode_bin(test: &str) -> Option<PathBuf> {
    if std::env::var("ACP_SANDBOX_SKIP_REAL_OPENCODE").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED {test}: ACP_SANDBOX_SKIP_REAL_OPENCODE=1");
        return None;
    }
    let install_hint = "run `.ci/install-opencode.sh` (it prints the path; export it as ACP_SANDBOX_TEST_OPENCODE), \
                        or set ACP_SANDBOX_SKIP_REAL_OPENCODE=1 to skip these tests";
    if let Some(path) = std::env::var_os("ACP_SANDBOX_TEST_OPENCODE").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "ACP_SANDBOX_TEST_OPENCODE={} does not exist: {install_hint}", path.display());
        return Some(path);
    }
    let prefix = match std::env::var_os("ACP_SANDBOX_OPENCODE_PREFIX").filter(|p| !p.is_empty()) {
        Some(prefix) => PathBuf::from(prefix),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
                .expect("neither XDG_CACHE_HOME nor HOME is set");
            cache.join("acp-sandbox").join(format!("opencode-ai@{OPENCODE_VERSION}"))
        }
    };
    let path = prefix.join("node_modules/.bin/opencode");
    assert!(path.exists(), "the real OpenCode CLI is not installed (looked for {}): {install_hint}", path.display());
    Some(path)
}

// ---- the fake model ------------------------------------------------------------------------------------------

/// `tests/fakes/fake_openai.py`, listening on a free port; killed when dropped.
struct FakeOpenAi {
    child: Child,
    port: u16,
    record: PathBuf,
}

impl FakeOpenAi {
    fn start(dir: &Path) -> FakeOpenAi {
        Self::start_keyed(dir, None)
    }

    /// With `key`, each recorded request says whether it carried that key (`key_ok`, `tests/fakes/keyed_fake.py`).
    fn start_keyed(dir: &Path, key: Option<&str>) -> FakeOpenAi {
        let record = dir.join("fake-openai-requests.jsonl");
        let fakes = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fakes");
        let mut command = Command::new("python3");
        if let Some(key) = key {
            command.arg(fakes.join("keyed_fake.py")).env("FAKE_EXPECTED_KEY", key);
        }
        let mut child = command
            .arg(fakes.join("fake_openai.py"))
            .arg("--record")
            .arg(&record)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("fake-openai.log")).expect("create the fake server's log"),
            ))
            .spawn()
            .expect("start python3 tests/fakes/fake_openai.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("read the fake server's port");
        let port = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("the fake server did not say its port: {line:?}"));
        FakeOpenAi { child, port, record }
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Every request received so far: `{kind, scenario, arg, step, body}`.
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a recorded request is JSON"))
            .collect()
    }

    /// The chat (non-title) requests of `scenario`.
    fn chats(&self, scenario: &str) -> Vec<Value> {
        self.requests().into_iter().filter(|r| r["kind"] == "chat" && r["scenario"] == scenario).collect()
    }
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- one test's world ----------------------------------------------------------------------------------------

/// Where a test's directories go: `CARGO_TARGET_TMPDIR` (visible inside bubblewrap, unlike `/tmp`) unless it is
/// inside a git checkout, which it normally is (`target/` of this repo). OpenCode walks up from the workspace to
/// the nearest `.git` and would then treat this whole repository as the project (and snapshot it), so the
/// workspaces must be git-less: then `/var/tmp` is used (also shared with bubblewrap, which only hides `/tmp`).
fn test_root_parent() -> PathBuf {
    let target_tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    if !target_tmp.ancestors().any(|dir| dir.join(".git").exists()) {
        std::fs::create_dir_all(&target_tmp).expect("create CARGO_TARGET_TMPDIR");
        return target_tmp;
    }
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(0);
    let parent = PathBuf::from(format!("/var/tmp/acp-sandbox-real-opencode-{uid}"));
    std::fs::create_dir_all(&parent).expect("create the test root under /var/tmp");
    assert!(!parent.ancestors().any(|dir| dir.join(".git").exists()), "{} is inside a git checkout", parent.display());
    parent
}

/// A fake model, a user config pointing OpenCode at it, a data dir for the bridge, and workspaces.
struct World {
    root: tempfile::TempDir,
    opencode: PathBuf,
    server: FakeOpenAi,
    data: PathBuf,
    home: PathBuf,
    user_config: PathBuf,
}

impl World {
    fn new(test: &str) -> Option<World> {
        let opencode = opencode_bin(test)?;
        let root = tempfile::Builder::new()
            .prefix(&format!("{test}-"))
            .tempdir_in(test_root_parent())
            .expect("create the test root");
        let server = FakeOpenAi::start(root.path());
        let home = root.path().join("home");
        let user_config = home.join(".config");
        let data = root.path().join("data");
        std::fs::create_dir_all(user_config.join("opencode")).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        let template = include_str!("fixtures/real-opencode/opencode.json");
        let config = template.replace("http://127.0.0.1:18080/v1", &server.base_url());
        assert_ne!(config, template, "the fixture config names the placeholder base URL");
        std::fs::write(user_config.join("opencode/opencode.json"), config).unwrap();
        // What OpenCode itself writes into its config dir on its first run (`Config.ensureGitignore`): a user who
        // has used OpenCode has it. `fresh_user_config_under_bwrap` covers a config dir without it.
        std::fs::write(user_config.join("opencode/.gitignore"), OPENCODE_CONFIG_GITIGNORE).unwrap();
        Some(World { root, opencode, server, data, home, user_config })
    }

    /// A new git-less workspace, canonical.
    fn workspace(&self, name: &str) -> PathBuf {
        let path = self.root.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        path.canonicalize().unwrap()
    }

    /// The bridge's options: the real OpenCode, this world's HOME/XDG_CONFIG_HOME, hermetic OpenCode settings.
    fn options(&self, sandbox: &str) -> BridgeOptions {
        self.backend_options(sandbox, "run")
    }

    /// The bridge's options with OpenCode driven by `backend` (`serve` or `run`).
    fn backend_options(&self, sandbox: &str, backend: &str) -> BridgeOptions {
        BridgeOptions::new("opencode", &self.data)
            .sandbox(sandbox)
            .env("ACP_SANDBOX_OPENCODE_BACKEND", backend)
            .env("ACP_SANDBOX_OPENCODE_BIN", &self.opencode.display().to_string())
            .env("HOME", &self.home.display().to_string())
            .env("XDG_CONFIG_HOME", &self.user_config.display().to_string())
            .env("XDG_DATA_HOME", &self.home.join(".local/share").display().to_string())
            .env("XDG_CACHE_HOME", &self.home.join(".cache").display().to_string())
            .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
            .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
            .env("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1")
            .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
            .env("OPENCODE_DISABLE_SHARE", "1")
            .env("RUST_LOG", &std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
    }

    /// Starts a bridge and initializes it, printing how long that took.
    fn start(&self, sandbox: &str) -> Bridge {
        self.start_with(self.options(sandbox))
    }

    fn start_with(&self, options: BridgeOptions) -> Bridge {
        let sandbox = options.sandbox.clone();
        let started = Instant::now();
        let bridge = Bridge::start(options);
        eprintln!("TIMING bridge start + initialize ({sandbox}): {:?}", started.elapsed());
        bridge
    }
}

impl Drop for World {
    /// A failing test kills its bridge with SIGKILL mid-turn; under `--sandbox none` OpenCode and its tools would
    /// then live on (see the report on orphans), so everything still running in this test's directories goes too.
    fn drop(&mut self) {
        for _ in 0..5 {
            let left = processes_under(self.root.path());
            if left.is_empty() {
                break;
            }
            for (pid, _) in left {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Fails unless bubblewrap works here (it does on the CI image); `ACP_SANDBOX_SKIP_BWRAP=1` skips instead.
fn bwrap_ok(test: &str) -> bool {
    if std::env::var("ACP_SANDBOX_SKIP_REAL_OPENCODE").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED {test}: ACP_SANDBOX_SKIP_REAL_OPENCODE=1");
        return false;
    }
    match bwrap_usable() {
        Ok(()) => true,
        Err(_) if std::env::var("ACP_SANDBOX_SKIP_BWRAP").is_ok_and(|v| v == "1") => {
            eprintln!("SKIPPED {test}: ACP_SANDBOX_SKIP_BWRAP=1");
            false
        }
        Err(why) => panic!("bubblewrap does not work here ({why}); set ACP_SANDBOX_SKIP_BWRAP=1 to skip"),
    }
}

/// One prompt, timed.
/// Upper bound of one real turn (a cold OpenCode start on a busy 2-core machine takes about 10 s).
const TURN_LIMIT: Duration = Duration::from_secs(180);

/// Waits for the answer to prompt `id`. The harness fails after 20 s without a message, but real OpenCode is
/// silent while it starts cold or runs a tool, longer on a loaded machine. The bridge answers once OpenCode has
/// exited, so first wait (polling /proc, no messages needed) for OpenCode to appear in the workspace and go.
fn finish_turn_patiently(bridge: &mut Bridge, sid: &str, id: i64, ws: &Path) -> Turn {
    if wait_until(Duration::from_secs(60), || !processes_under(ws).is_empty())
        && !wait_until(TURN_LIMIT, || processes_under(ws).is_empty())
    {
        bridge.fail(&format!("OpenCode still runs after {TURN_LIMIT:?}: {:?}", processes_under(ws)));
    }
    bridge.finish_turn(sid, id)
}

/// A turn of the server backend: OpenCode keeps running after it, so only the answer is waited for.
fn finish_served_turn(bridge: &mut Bridge, sid: &str, id: i64) -> Turn {
    match bridge.wait_response_within(id, TURN_LIMIT) {
        Some(result) => Turn { result, updates: bridge.take_updates(sid) },
        None => bridge.fail(&format!("no answer to the prompt within {TURN_LIMIT:?}")),
    }
}

/// One prompt in workspace `ws`, timed.
fn timed_prompt(bridge: &mut Bridge, sid: &str, ws: &Path, text: &str, label: &str) -> Turn {
    let started = Instant::now();
    let id = bridge.send_prompt(sid, text);
    let turn = if bridge
        .options
        .env
        .iter()
        .any(|(k, v)| k == "ACP_SANDBOX_OPENCODE_BACKEND" && (v == "serve" || v == "acp"))
    {
        finish_served_turn(bridge, sid, id)
    } else {
        finish_turn_patiently(bridge, sid, id, ws)
    };
    eprintln!("TIMING turn {label} ({}): {:?}", bridge.options.sandbox, started.elapsed());
    turn
}

/// The text of the tool results the model got in the request of `scenario` at `step`.
fn tool_results(server: &FakeOpenAi, scenario: &str, step: i64) -> String {
    server
        .chats(scenario)
        .into_iter()
        .filter(|r| r["step"] == step)
        .flat_map(|r| messages_text(&r, "tool"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_end_turn(bridge: &Bridge, turn: &Turn) {
    match &turn.result {
        Ok(result) if result["stopReason"] == "end_turn" => {}
        other => bridge.fail(&format!("expected end_turn, got {other:?}\nupdates: {:#?}", turn.updates)),
    }
}

/// The updates of one `sessionUpdate` kind.
fn of_kind<'a>(updates: &'a [Value], kind: &str) -> Vec<&'a Value> {
    updates.iter().filter(|u| u["sessionUpdate"] == kind).collect()
}

/// The text of every message of `role` in a chat request body.
fn messages_text(request: &Value, role: &str) -> Vec<String> {
    request["body"]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == role)
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"),
            _ => String::new(),
        })
        .collect()
}

/// Checks that the follow-up chat request carried the first turn: its user prompt and the model's answer.
fn assert_continued(server: &FakeOpenAi, first_prompt_marker: &str, first_answer: &str) {
    let followups = server.chats("followup");
    let last = followups.last().expect("the fake model saw the follow-up prompt");
    let users = messages_text(last, "user");
    let assistants = messages_text(last, "assistant");
    assert!(
        users.iter().any(|u| u.contains(first_prompt_marker)),
        "the follow-up request lacks the first turn's prompt ({first_prompt_marker}): users = {users:?}"
    );
    assert!(
        assistants.iter().any(|a| a.contains(first_answer)),
        "the follow-up request lacks the first turn's answer ({first_answer}): assistants = {assistants:?}"
    );
}

// ---- plain answer + follow-up ------------------------------------------------------------------------------

fn plain_answer_then_followup(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start(sandbox);
    let started = Instant::now();
    let sid = bridge.new_session(&ws);
    eprintln!("TIMING session/new ({sandbox}): {:?}", started.elapsed());

    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text Say hello", "1 (plain, fresh OpenCode home)");
    assert_end_turn(&bridge, &turn);
    let text = turn.agent_text();
    assert!(text.contains("Hello from the fake model. PLAIN-ANSWER-OK"), "agent text: {text:?}\n{:#?}", turn.updates);
    assert!(!of_kind(&turn.updates, "agent_message_chunk").is_empty());
    let chats = world.server.chats("text");
    assert_eq!(chats.len(), 1, "one model call for a plain answer: {chats:#?}");
    let user = messages_text(&chats[0], "user");
    assert!(
        user.iter().any(|u| u.contains("SCENARIO:text Say hello") && !u.contains("\"SCENARIO")),
        "the prompt reaches the model verbatim (stdin, not a quoted argv word): {user:?}"
    );

    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:followup Do you remember?", "2 (follow-up)");
    assert_end_turn(&bridge, &turn);
    assert!(turn.agent_text().contains("FOLLOWUP-OK"), "{:#?}", turn.updates);
    assert_continued(&world.server, "SCENARIO:text Say hello", "PLAIN-ANSWER-OK");

    // A third, timed turn: the steady-state cost of one turn.
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text again", "3 (steady state)");
    assert_end_turn(&bridge, &turn);
}

#[test]
fn plain_answer_then_followup_none() {
    plain_answer_then_followup("none", "plain_answer_then_followup_none");
}

#[test]
fn plain_answer_then_followup_bwrap() {
    if bwrap_ok("plain_answer_then_followup_bwrap") {
        plain_answer_then_followup("bwrap", "plain_answer_then_followup_bwrap");
    }
}

#[test]
fn plain_answer_then_followup_landlock() {
    plain_answer_then_followup("landlock", "plain_answer_then_followup_landlock");
}

// ---- write -> bash -> read -> edit ---------------------------------------------------------------------------

fn tool_loop(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start(sandbox);
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:tools write, cat, read and edit hello.txt", "tool loop");
    assert_end_turn(&bridge, &turn);
    assert_eq!(
        std::fs::read_to_string(ws.join("hello.txt")).unwrap_or_default(),
        "hello EDITED by fake model\n",
        "the tools ran in the workspace"
    );
    assert!(turn.agent_text().contains("TOOLS-DONE"), "{:#?}", turn.updates);

    let calls = of_kind(&turn.updates, "tool_call");
    let kinds: Vec<&str> = calls.iter().map(|c| c["kind"].as_str().unwrap_or("?")).collect();
    assert_eq!(kinds, ["edit", "execute", "read", "edit"], "write, bash, read, edit: {calls:#?}");
    let ids: Vec<&str> = calls.iter().map(|c| c["toolCallId"].as_str().unwrap()).collect();
    assert_eq!(ids, ["call_fake_0_0", "call_fake_1_0", "call_fake_2_0", "call_fake_3_0"], "the model's call ids");
    let hello = ws.join("hello.txt");
    let updates = of_kind(&turn.updates, "tool_call_update");
    for id in &ids {
        let done: Vec<_> = updates.iter().filter(|u| u["toolCallId"] == *id).collect();
        assert!(done.iter().any(|u| u["status"] == "completed"), "{id} completes: {:#?}", turn.updates);
    }

    // Every diff, on the tool call or its updates.
    let diffs: Vec<&Value> = turn
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "tool_call" || u["sessionUpdate"] == "tool_call_update")
        .flat_map(|u| u["content"].as_array().into_iter().flatten())
        .filter(|c| c["type"] == "diff")
        .collect();
    let write_diff = diffs
        .iter()
        .find(|d| d["newText"] == "hello from fake model\n")
        .unwrap_or_else(|| panic!("a diff for the write: {diffs:#?}"));
    assert_eq!(write_diff["path"], json!(hello), "diff paths are absolute host paths");
    assert_eq!(
        write_diff.get("oldText"),
        Some(&Value::Null),
        "a new file's old text is an explicit null: {write_diff}"
    );
    let edit_diff = diffs
        .iter()
        .find(|d| d["newText"].as_str().is_some_and(|t| t.contains("EDITED")))
        .unwrap_or_else(|| panic!("a diff for the edit: {diffs:#?}"));
    assert_eq!(edit_diff["path"], json!(hello));
    assert!(edit_diff["oldText"].as_str().is_some_and(|t| t.contains("hello from fake model")), "{edit_diff}");

    // The bash output reaches the editor.
    let bash_text: String = updates
        .iter()
        .filter(|u| u["toolCallId"] == "call_fake_1_0")
        .flat_map(|u| u["content"].as_array().into_iter().flatten())
        .filter_map(|c| c["content"]["text"].as_str())
        .collect();
    assert!(bash_text.contains("hello from fake model") && bash_text.contains("bash-ok"), "bash output: {bash_text:?}");
    // The read shows where it read, and the file as a person reads it (not OpenCode's tagged, numbered text),
    // once: rawOutput keeps only OpenCode's structured result.
    let read = calls[2];
    assert_eq!(read["locations"][0]["path"], json!(hello), "{read}");
    let read_done = updates.iter().rfind(|u| u["toolCallId"] == "call_fake_2_0").unwrap();
    assert_eq!(read_done["content"][0]["content"]["text"], "```\nhello from fake model\n```", "{read_done}");
    assert_eq!(read_done["rawOutput"].get("output"), None, "{read_done}");
    assert_eq!(read_done["rawOutput"]["metadata"].get("preview"), None, "{read_done}");

    // One model call per step, each after the previous tool result.
    let steps: Vec<i64> = world.server.chats("tools").iter().map(|r| r["step"].as_i64().unwrap()).collect();
    assert_eq!(steps, [0, 1, 2, 3, 4]);
}

#[test]
fn tool_loop_write_bash_read_edit_none() {
    tool_loop("none", "tool_loop_write_bash_read_edit_none");
}

#[test]
fn tool_loop_write_bash_read_edit_bwrap() {
    if bwrap_ok("tool_loop_write_bash_read_edit_bwrap") {
        tool_loop("bwrap", "tool_loop_write_bash_read_edit_bwrap");
    }
}

/// The Landlock sandbox (what `auto` runs without bubblewrap): real OpenCode's tools work in it.
#[test]
fn tool_loop_write_bash_read_edit_landlock() {
    tool_loop("landlock", "tool_loop_write_bash_read_edit_landlock");
}

/// Every line of OpenCode's own log files in a session's state dir (wherever its XDG data dir is).
fn opencode_log_lines(state: &Path) -> (usize, Vec<String>) {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "log") && path.parent().is_some_and(|p| p.ends_with("log"))
            {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(state, &mut files);
    let lines = files
        .iter()
        .flat_map(|f| std::fs::read_to_string(f).unwrap_or_default().lines().map(String::from).collect::<Vec<_>>())
        .collect();
    (files.len(), lines)
}

/// A git workspace under bubblewrap: nothing of the sandbox shows in `git status`, OpenCode's snapshots (its undo
/// and diffs, which `git add` every file of the project) work, and an edit's card carries its diff.
fn snapshots_in_a_git_workspace(backend: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("repo");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=T", "-c", "user.email=t@example.invalid", "-C"])
            .arg(&ws)
            .args(args)
            .output()
            .expect("run git");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    std::fs::write(ws.join("README.md"), "a project\n").unwrap();
    git(&["init", "-q"]);
    git(&["add", "README.md"]);
    git(&["commit", "-qm", "init"]);
    let mut bridge = world.start_with(world.backend_options("bwrap", backend));
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:tools write, cat, read and edit hello.txt", "snapshots");
    assert_end_turn(&bridge, &turn);
    assert_eq!(git(&["status", "--porcelain"]), "?? hello.txt", "only the agent's file is new");
    let edit_diff = turn
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "tool_call" || u["sessionUpdate"] == "tool_call_update")
        .filter(|u| u["toolCallId"] == "call_fake_3_0")
        .flat_map(|u| u["content"].as_array().into_iter().flatten())
        .find(|c| c["type"] == "diff")
        .unwrap_or_else(|| panic!("the edit's card has no diff: {:#?}", turn.updates));
    assert_eq!(edit_diff["path"], json!(ws.join("hello.txt")));
    assert_eq!(edit_diff["oldText"], "hello from fake model", "{edit_diff}");
    assert_eq!(edit_diff["newText"], "hello EDITED by fake model", "{edit_diff}");
    let state = support::sandbox_state(&world.data, &sid);
    let (files, lines) = opencode_log_lines(&state);
    assert!(files > 0 && !lines.is_empty(), "no OpenCode log in {}", state.display());
    let failures: Vec<&String> = lines.iter().filter(|l| l.contains("failed to add snapshot files")).collect();
    assert_eq!(failures, Vec::<&String>::new(), "OpenCode's snapshots failed");
    drop(bridge);
}

#[test]
fn snapshots_work_in_a_git_workspace_under_bwrap_run() {
    let test = "snapshots_work_in_a_git_workspace_under_bwrap_run";
    if bwrap_ok(test) {
        snapshots_in_a_git_workspace("run", test);
    }
}

#[test]
fn snapshots_work_in_a_git_workspace_under_bwrap_serve() {
    let test = "snapshots_work_in_a_git_workspace_under_bwrap_serve";
    if bwrap_ok(test) {
        snapshots_in_a_git_workspace("serve", test);
    }
}

// ---- review before write -------------------------------------------------------------------------------------

/// `--workspace review` with OpenCode's own write and edit tools and a client that keeps every write: the file
/// reaches the workspace only through `fs/write_text_file`, and OpenCode's later steps (bash, read, edit) see it.
fn review_mode(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let options = world.options(sandbox).arg("--workspace").arg("review");
    let mut bridge = Bridge::start_reviewing(options, true);
    let sid = bridge.new_session(&ws);
    // Under `none` OpenCode works in the copy in the data dir: its processes are waited for in the whole world.
    let id = bridge.send_prompt(&sid, "SCENARIO:tools write, cat, read and edit hello.txt");
    let turn = finish_turn_patiently(&mut bridge, &sid, id, world.root.path());
    assert_end_turn(&bridge, &turn);
    let hello = ws.join("hello.txt");
    let paths: Vec<&Path> = bridge.file_writes.iter().map(|w| w.path.as_path()).collect();
    assert!(paths.iter().all(|path| *path == hello), "only hello.txt is written: {:#?}", bridge.file_writes);
    // The write and the edit arrive one by one (or, when OpenCode was faster than the review, the edit alone);
    // each while the user's file did not hold it yet.
    let last = bridge.file_writes.last().unwrap_or_else(|| panic!("no write arrived: {:#?}", turn.updates));
    assert_eq!(last.content, "hello EDITED by fake model\n");
    for write in &bridge.file_writes {
        assert_ne!(write.before.as_ref(), Some(&write.content), "{write:?} was on disk already");
    }
    assert_eq!(bridge.file_writes[0].before, None, "hello.txt is new: {:?}", bridge.file_writes);
    assert_eq!(std::fs::read_to_string(&hello).unwrap(), "hello EDITED by fake model\n");
    assert!(turn.agent_text().contains("TOOLS-DONE"), "{:#?}", turn.updates);
    let kinds: Vec<&str> =
        of_kind(&turn.updates, "tool_call").iter().map(|c| c["kind"].as_str().unwrap_or("?")).collect();
    assert_eq!(kinds, ["edit", "execute", "read", "edit"], "{:#?}", turn.updates);
}

#[test]
fn review_mode_sends_opencodes_writes_to_the_editor_none() {
    review_mode("none", "review_mode_sends_opencodes_writes_to_the_editor_none");
}

#[test]
fn review_mode_sends_opencodes_writes_to_the_editor_bwrap() {
    if bwrap_ok("review_mode_sends_opencodes_writes_to_the_editor_bwrap") {
        review_mode("bwrap", "review_mode_sends_opencodes_writes_to_the_editor_bwrap");
    }
}

/// `--workspace review` with the warm server and a client that rejects every write: OpenCode's edit and new file
/// reach the editor and not the user's files, its deletion is asked for and held back, and its next turn reads the
/// user's file as it really is (the rejected edit is gone from its copy).
fn review_mode_served(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::write(ws.join("notes.txt"), "line one\n").unwrap();
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    let options = world.backend_options(sandbox, "serve").arg("--workspace").arg("review");
    let mut bridge = Bridge::start_reviewing(options, false);
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:review", "review");
    assert_end_turn(&bridge, &turn);
    // One review per ended tool, or one for several when OpenCode ran ahead of it: the order is the paths'.
    let mut writes: Vec<(PathBuf, String, Option<String>)> =
        bridge.file_writes.iter().map(|w| (w.path.clone(), w.content.clone(), w.before.clone())).collect();
    writes.sort();
    assert_eq!(
        writes,
        [
            (ws.join("new.txt"), "brand new\n".to_string(), None),
            (ws.join("notes.txt"), "line two\n".to_string(), Some("line one\n".to_string())),
        ],
        "{:#?}",
        turn.updates
    );
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "line one\n");
    assert!(!ws.join("new.txt").exists(), "the rejected new file was written");
    // The deletion was asked for (nobody answered: not allowed) and held back in the agent's copy.
    assert_eq!(std::fs::read_to_string(ws.join("gone.txt")).unwrap(), "bye\n", "the deletion was applied");
    let cards: Vec<String> = bridge.permission_requests.iter().map(card_list).collect();
    assert_eq!(cards, [card(&["delete `gone.txt`"])]);
    assert_eq!(held_notes(&turn), [held_note(&world, &sid, &["delete `gone.txt` (not allowed)"])]);
    assert!(
        !turn.updates.iter().any(|u| u.to_string().contains("runs `opencode run` per prompt")),
        "the warm server was not used: {:#?}",
        turn.updates
    );

    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:readback", "readback");
    assert_end_turn(&bridge, &turn);
    let read = tool_results(&world.server, "readback", 1);
    assert!(read.contains("line one") && !read.contains("line two"), "the agent read: {read:?}");
    assert_eq!(bridge.file_writes.len(), 2, "the read wrote nothing: {:#?}", bridge.file_writes);
}

#[test]
fn review_mode_with_the_warm_server_rejects_notes_deletions_and_rereads_none() {
    review_mode_served("none", "review_mode_with_the_warm_server_rejects_notes_deletions_and_rereads_none");
}

#[test]
fn review_mode_with_the_warm_server_rejects_notes_deletions_and_rereads_bwrap() {
    if bwrap_ok("review_mode_with_the_warm_server_rejects_notes_deletions_and_rereads_bwrap") {
        review_mode_served("bwrap", "review_mode_with_the_warm_server_rejects_notes_deletions_and_rereads_bwrap");
    }
}

/// A client without `fs/write_text_file` in review mode: OpenCode's changes are asked for on permission cards and
/// reach the files only once allowed.
#[test]
fn review_mode_without_the_editors_writes_asks_before_applying() {
    let test = "review_mode_without_the_editors_writes_asks_before_applying";
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::write(ws.join("notes.txt"), "line one\n").unwrap();
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    let options = world.backend_options("none", "serve").arg("--workspace").arg("review");
    let mut bridge = Bridge::start(options);
    bridge.permission_answer = Some("allow_once".into());
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:review", "review");
    assert_end_turn(&bridge, &turn);
    assert!(bridge.file_writes.is_empty(), "{:#?}", bridge.file_writes);
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "line two\n");
    assert_eq!(std::fs::read_to_string(ws.join("new.txt")).unwrap(), "brand new\n");
    assert!(!ws.join("gone.txt").exists());
    // One card per review (one per ended tool, or one for several when OpenCode ran ahead); every change is
    // named exactly once.
    let mut named: Vec<String> = bridge
        .permission_requests
        .iter()
        .flat_map(|r| card_list(r).lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .collect();
    named.sort();
    assert_eq!(
        named,
        ["- delete `gone.txt`", "- new text file `new.txt` (10 bytes)", "- text written to `notes.txt` (9 bytes)"],
        "{:#?}",
        turn.updates
    );
    assert_eq!(held_notes(&turn), Vec::<String>::new());
}

/// The list a permission card of the review names.
fn card_list(request: &Value) -> String {
    request["toolCall"]["content"][0]["content"]["text"].as_str().unwrap_or_default().to_string()
}

fn card(items: &[&str]) -> String {
    let mut text =
        "The agent made these changes in its copy of the workspace; they reach your files only if you allow \
                    them:\n"
            .to_string();
    for item in items {
        text.push_str(&format!("- {item}\n"));
    }
    text
}

/// The review's notes on what it held back.
fn held_notes(turn: &Turn) -> Vec<String> {
    of_kind(&turn.updates, "agent_message_chunk")
        .iter()
        .filter_map(|u| u["content"]["text"].as_str().map(str::trim))
        .filter(|text| text.starts_with("_Held back") || text.starts_with("_The editor refused"))
        .map(str::to_string)
        .collect()
}

fn held_note(world: &World, sid: &str, items: &[&str]) -> String {
    let copy = world.data.join("sessions").join(sid).join("review/copy");
    format!(
        "_Held back, not applied to your files: {}. They stay in the agent's copy, where it keeps seeing them; to take \
         one, copy it from `{}` or make the change yourself._",
        items.join("; "),
        copy.display()
    )
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// OpenCode's own bash (the scripted model plays the hostile agent) makes what the editor cannot show: a script
/// with a NUL byte, invalid UTF-8, a deletion, a rename, a link to `/etc/passwd`, a setuid bit. Each is named on a
/// permission card; rejected, none reaches the user's files, and the agent's next turn still sees its versions.
fn review_mode_holds_back(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    std::fs::write(ws.join("old.txt"), "moved\n").unwrap();
    std::fs::write(ws.join("tool.sh"), "#!/bin/sh\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(ws.join("tool.sh"), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let options = world.backend_options(sandbox, "serve").arg("--workspace").arg("review");
    let mut bridge = Bridge::start_reviewing(options, true);
    bridge.permission_answer = Some("reject_once".into());
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:hostilereview", "hostilereview");
    assert_end_turn(&bridge, &turn);
    assert!(bridge.file_writes.is_empty(), "{:#?}", bridge.file_writes);
    let cards: Vec<String> = bridge.permission_requests.iter().map(card_list).collect();
    assert_eq!(
        cards,
        [card(&[
            "delete `gone.txt`",
            "new binary file `bad.txt` (2 bytes)",
            "rename `old.txt` → `moved.txt`",
            "link `p` → `/etc/passwd`",
            "new binary file `script.sh` (11 bytes)",
            "set the executable bit of `script.sh`",
            "set the executable bit of `tool.sh`",
        ])],
        "{:#?}",
        turn.updates
    );
    assert_eq!(
        held_notes(&turn),
        [held_note(
            &world,
            &sid,
            &[
                "new binary file `bad.txt` (2 bytes) (not allowed)",
                "delete `gone.txt` (not allowed)",
                "rename `old.txt` → `moved.txt` (not allowed)",
                "link `p` → `/etc/passwd` (not allowed)",
                "new binary file `script.sh` (11 bytes) (not allowed)",
                "set the executable bit of `script.sh` (not allowed)",
                "set the executable bit of `tool.sh` (not allowed)",
            ]
        )]
    );
    assert_eq!(std::fs::read_to_string(ws.join("gone.txt")).unwrap(), "bye\n");
    assert_eq!(std::fs::read_to_string(ws.join("old.txt")).unwrap(), "moved\n");
    for absent in ["moved.txt", "p", "script.sh", "bad.txt"] {
        assert!(std::fs::symlink_metadata(ws.join(absent)).is_err(), "{absent} reached the workspace");
    }
    assert_eq!(mode(&ws.join("tool.sh")), 0o644);
}

#[test]
fn review_mode_holds_back_what_opencodes_bash_made_that_the_editor_cannot_show_none() {
    review_mode_holds_back("none", "review_mode_holds_back_what_opencodes_bash_made_that_the_editor_cannot_show_none");
}

#[test]
fn review_mode_holds_back_what_opencodes_bash_made_that_the_editor_cannot_show_bwrap() {
    if bwrap_ok("review_mode_holds_back_what_opencodes_bash_made_that_the_editor_cannot_show_bwrap") {
        review_mode_holds_back(
            "bwrap",
            "review_mode_holds_back_what_opencodes_bash_made_that_the_editor_cannot_show_bwrap",
        );
    }
}

/// OpenCode links `p` to a file outside the workspace (standing for `~/.bashrc`; the user allows the link), then
/// replaces the link by a file: the editor, which writes with a plain `open()`, is never asked to write `p`.
fn review_mode_never_writes_through_a_link(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let victim = world.workspace("victim").join(".bashrc");
    std::fs::write(&victim, "precious\n").unwrap();
    std::fs::write(ws.join(".victim"), victim.display().to_string()).unwrap();
    let options = world.backend_options(sandbox, "serve").arg("--workspace").arg("review");
    let mut bridge = Bridge::start_reviewing(options, true);
    bridge.permission_answer = Some("allow_once".into());
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:linkfile:1", "link");
    assert_end_turn(&bridge, &turn);
    assert_eq!(std::fs::read_link(ws.join("p")).unwrap(), victim);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:linkfile:2", "file");
    assert_end_turn(&bridge, &turn);
    assert!(bridge.file_writes.is_empty(), "{:#?}", bridge.file_writes);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(std::fs::read_link(ws.join("p")).unwrap(), victim);
    assert_eq!(
        held_notes(&turn),
        [held_note(
            &world,
            &sid,
            &["new text file `p` (5 bytes) (its path in your workspace goes through a link, which is never followed)"]
        )]
    );
}

#[test]
fn review_mode_never_writes_through_a_link_the_agent_made_none() {
    review_mode_never_writes_through_a_link("none", "review_mode_never_writes_through_a_link_the_agent_made_none");
}

#[test]
fn review_mode_never_writes_through_a_link_the_agent_made_bwrap() {
    if bwrap_ok("review_mode_never_writes_through_a_link_the_agent_made_bwrap") {
        review_mode_never_writes_through_a_link(
            "bwrap",
            "review_mode_never_writes_through_a_link_the_agent_made_bwrap",
        );
    }
}

/// An editor that refuses OpenCode's write: the user's file stays, and OpenCode's next turn reads the user's
/// version.
#[test]
fn review_mode_with_opencode_a_refused_write_is_never_applied_and_rereads_the_users_file() {
    let test = "review_mode_with_opencode_a_refused_write_is_never_applied_and_rereads_the_users_file";
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::write(ws.join("notes.txt"), "line one\n").unwrap();
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    let options = world.backend_options("bwrap", "serve").arg("--workspace").arg("review");
    if !bwrap_ok(test) {
        return;
    }
    let mut bridge = Bridge::spawn(options);
    bridge.offer_writes = true;
    bridge.refuse_writes = Some("invalid path".into());
    bridge.initialize();
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:review", "review");
    assert_end_turn(&bridge, &turn);
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "line one\n");
    assert!(!ws.join("new.txt").exists());
    // One note per review (one per ended tool, or one for several when OpenCode ran ahead): each names its paths.
    let (head, tail) = (
        "_The editor refused the agent's writes of ",
        " (invalid path): your files stay as they were, and the agent's copy has your version again._",
    );
    let mut named: Vec<String> = Vec::new();
    let notes = held_notes(&turn);
    let (refusals, held): (Vec<String>, Vec<String>) = notes.into_iter().partition(|note| note.starts_with(head));
    assert_eq!(held, [held_note(&world, &sid, &["delete `gone.txt` (not allowed)"])]);
    for note in refusals {
        let list = note.strip_prefix(head).and_then(|rest| rest.strip_suffix(tail));
        let list = list.unwrap_or_else(|| panic!("not a refusal note: {note:?}"));
        named.extend(list.split(", ").map(str::to_string));
    }
    named.sort();
    assert_eq!(named, ["`new.txt`", "`notes.txt`"], "{:#?}", turn.updates);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:readback", "readback");
    assert_end_turn(&bridge, &turn);
    let read = tool_results(&world.server, "readback", 1);
    assert!(read.contains("line one") && !read.contains("line two"), "the agent read: {read:?}");
}

// ---- todowrite, reasoning ------------------------------------------------------------------------------------

#[test]
fn todowrite_becomes_a_plan() {
    let Some(world) = World::new("todowrite_becomes_a_plan") else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start("bwrap");
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:todo plan it", "todowrite");
    assert_end_turn(&bridge, &turn);
    let plans = of_kind(&turn.updates, "plan");
    let plan = plans.last().unwrap_or_else(|| bridge.fail(&format!("no plan update: {:#?}", turn.updates)));
    let entries: Vec<(String, String, String)> = plan["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["content"].as_str().unwrap_or_default().to_string(),
                e["status"].as_str().unwrap_or_default().to_string(),
                e["priority"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        [
            ("Write file".to_string(), "completed".to_string(), "high".to_string()),
            ("Run tests".to_string(), "in_progress".to_string(), "medium".to_string())
        ]
    );
    assert!(turn.agent_text().contains("TODO-DONE"));
}

#[test]
fn reasoning_becomes_thought_chunks() {
    let Some(world) = World::new("reasoning_becomes_thought_chunks") else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start("bwrap");
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:reasoning what is 2+2", "reasoning");
    assert_end_turn(&bridge, &turn);
    let thought = text_of(&turn.updates, "agent_thought_chunk");
    assert!(thought.contains("Let me think: two plus two is four."), "thought: {thought:?}\n{:#?}", turn.updates);
    let text = turn.agent_text();
    assert!(text.contains("REASONING-ANSWER: 4") && !text.contains("two plus two"), "text: {text:?}");
    let order = kinds(&turn.updates);
    let first_thought = order.iter().position(|k| k == "agent_thought_chunk").unwrap();
    // The first message is our note that `--sandbox none` does not isolate; the answer is OpenCode's text.
    let answer = turn
        .updates
        .iter()
        .position(|u| u["sessionUpdate"] == "agent_message_chunk" && u.to_string().contains("REASONING-ANSWER"))
        .unwrap();
    assert!(first_thought < answer, "the thought comes before the answer: {order:?}");
}

// ---- cancel during a long bash tool --------------------------------------------------------------------------

/// Live processes whose argv is exactly `argv`.
fn processes_with_argv(argv: &[&str]) -> Vec<i32> {
    let wanted: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted))
        .filter(|pid| pid_alive(*pid))
        .collect()
}

/// The pids of [`processes_under`] `dir`.
fn pids_under(dir: &Path) -> Vec<i32> {
    processes_under(dir).into_iter().map(|(pid, _)| pid).collect()
}

fn cancel_long_bash(sandbox: &str, backend: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start_with(world.backend_options(sandbox, backend));
    let sid = bridge.new_session(&ws);
    // Sleep lengths unique to this run, to find exactly our processes in /proc.
    let n = 100_000 + u32::from(world.server.port) * 2;
    let (child_arg, grandchild_arg) = (n.to_string(), (n + 1).to_string());
    let child_argv = ["sleep", child_arg.as_str()];
    let grandchild_argv = ["sleep", grandchild_arg.as_str()];
    let id = bridge.send_prompt(&sid, &format!("SCENARIO:longbash:{n} run something long"));
    let started = wait_until(Duration::from_secs(60), || {
        ws.join("longbash.started").exists()
            && !processes_with_argv(&child_argv).is_empty()
            && !processes_with_argv(&grandchild_argv).is_empty()
    });
    let leftovers = || [processes_with_argv(&child_argv), processes_with_argv(&grandchild_argv)].concat();
    let _guards: Vec<KillOnDrop> = leftovers().into_iter().chain(pids_under(&ws)).map(KillOnDrop).collect();
    if !started {
        bridge.fail("the long bash tool did not start (no longbash.started or no sleep processes)");
    }
    let running = processes_under(&ws);
    assert!(running.len() >= 3, "OpenCode, its shell and the sleeps run in the workspace: {running:?}");
    let cancelled_at = Instant::now();
    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, id);
    eprintln!("TIMING cancel -> response ({sandbox}): {:?}", cancelled_at.elapsed());
    match &turn.result {
        Ok(result) if result["stopReason"] == "cancelled" => {}
        other => bridge.fail(&format!("expected cancelled, got {other:?}")),
    }
    let gone = wait_until(Duration::from_secs(10), || leftovers().is_empty());
    assert!(gone, "the bash tool's child and grandchild survived the cancel: {:?}", leftovers());
    assert!(!ws.join("longbash.finished").exists());
    if backend == "run" {
        let all_gone = wait_until(Duration::from_secs(10), || processes_under(&ws).is_empty());
        assert!(all_gone, "processes still running in the workspace after the cancel: {:?}", processes_under(&ws));
        // `opencode run` prints a tool only once it finished: the cancelled one never got a card.
        assert_eq!(of_kind(&turn.updates, "tool_call").len(), 0, "{:#?}", turn.updates);
    } else {
        // The server reports the command it stopped as completed; its card ends failed, with the cancel said.
        let bash = turn.updates.iter().find(|u| u["sessionUpdate"] == "tool_call" && u["kind"] == "execute");
        let Some(bash) = bash.map(|u| u["toolCallId"].clone()) else {
            bridge.fail(&format!("no shell card: {:#?}", turn.updates))
        };
        let card: Vec<&Value> = turn.updates.iter().filter(|u| u["toolCallId"] == bash).collect();
        let statuses: Vec<&str> = card.iter().filter_map(|u| u["status"].as_str()).collect();
        assert_eq!(statuses.last(), Some(&"failed"), "{card:#?}");
        let said = card.iter().rev().find_map(|u| u["content"][0]["content"]["text"].as_str());
        assert_eq!(
            said.and_then(|text| text.rsplit("\n\n").next()),
            Some("Cancelled: stopped before it finished."),
            "{card:#?}"
        );
    }

    // The interrupted OpenCode session goes on.
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:followup after the cancel", "after cancel");
    assert_end_turn(&bridge, &turn);
    assert!(turn.agent_text().contains("FOLLOWUP-OK"), "{:#?}", turn.updates);
    let followup = world.server.chats("followup");
    let users = messages_text(followup.last().unwrap(), "user");
    assert!(
        users.iter().any(|u| u.contains("SCENARIO:longbash")),
        "the turn after the cancel continues the same OpenCode session: {users:?}"
    );
}

#[test]
fn cancel_during_long_bash_kills_its_tree_none() {
    cancel_long_bash("none", "run", "cancel_during_long_bash_kills_its_tree_none");
}

#[test]
fn cancel_during_a_served_long_bash_fails_its_card_none() {
    cancel_long_bash("none", "serve", "cancel_during_a_served_long_bash_fails_its_card_none");
}

#[test]
fn cancel_during_a_served_long_bash_fails_its_card_bwrap() {
    if bwrap_ok("cancel_during_a_served_long_bash_fails_its_card_bwrap") {
        cancel_long_bash("bwrap", "serve", "cancel_during_a_served_long_bash_fails_its_card_bwrap");
    }
}

#[test]
fn cancel_during_long_bash_kills_its_tree_bwrap() {
    if bwrap_ok("cancel_during_long_bash_kills_its_tree_bwrap") {
        cancel_long_bash("bwrap", "run", "cancel_during_long_bash_kills_its_tree_bwrap");
    }
}

/// OpenCode prints nothing while a tool runs: the bridge's idle timeout ends such a turn with an error and takes
/// the whole tree down. (40 s: a cold OpenCode start on a loaded machine was seen silent for more than 25 s.)
#[test]
fn idle_timeout_ends_a_silent_long_tool_and_its_tree() {
    let Some(world) = World::new("idle_timeout") else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start_with(world.options("none").arg("--idle-timeout").arg("40"));
    let sid = bridge.new_session(&ws);
    let n = 100_000 + u32::from(world.server.port) * 2;
    let started = Instant::now();
    let id = bridge.send_prompt(&sid, &format!("SCENARIO:longbash:{n} run something long"));
    let turn = finish_turn_patiently(&mut bridge, &sid, id, &ws);
    eprintln!("TIMING idle-timeout turn (none, --idle-timeout 40): {:?}", started.elapsed());
    let _guards: Vec<KillOnDrop> = pids_under(&ws).into_iter().map(KillOnDrop).collect();
    assert!(ws.join("longbash.started").exists(), "the long tool ran");
    match &turn.result {
        Err(error) => assert_eq!(
            error.message,
            "OpenCode produced no output for 40 s and was stopped; the conversation is kept and the next prompt \
             continues it"
        ),
        Ok(result) => bridge.fail(&format!("expected an idle-timeout error, got {result}")),
    }
    let all_gone = wait_until(Duration::from_secs(10), || processes_under(&ws).is_empty());
    assert!(all_gone, "processes still running in the workspace after the idle timeout: {:?}", processes_under(&ws));
}

/// Zed stops agent servers with SIGTERM (or closes stdin): the bridge must take OpenCode's whole tree down with it.
/// (SIGKILL cannot be handled: under `--sandbox none` the bash tool's tree then survives; see the report.)
#[test]
fn sigterm_of_the_bridge_mid_tool_leaves_nothing_running_none() {
    let Some(world) = World::new("sigterm_mid_tool") else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start("bwrap");
    let sid = bridge.new_session(&ws);
    let n = 100_000 + u32::from(world.server.port) * 2;
    bridge.send_prompt(&sid, &format!("SCENARIO:longbash:{n} run something long"));
    let started = wait_until(Duration::from_secs(60), || ws.join("longbash.started").exists());
    assert!(started, "the long bash tool did not start");
    let running = wait_until(Duration::from_secs(10), || processes_under(&ws).len() >= 3);
    assert!(running, "OpenCode, its shell and the sleeps: {:?}", processes_under(&ws));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(bridge.pid() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let exited = bridge.wait_exit(Duration::from_secs(20));
    assert!(exited.is_some(), "the bridge did not exit within 20 s of SIGTERM");
    let gone = wait_until(Duration::from_secs(10), || processes_under(&ws).is_empty());
    assert!(gone, "left running after the bridge's SIGTERM: {:?}", processes_under(&ws));
}

// ---- provider error ------------------------------------------------------------------------------------------

#[test]
fn provider_http_400_is_a_jsonrpc_error_with_its_text() {
    let Some(world) = World::new("provider_http_400") else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start("bwrap");
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:error please fail", "provider 400");
    match &turn.result {
        Err(error) => assert!(
            error.message.contains("FAKE-PROVIDER-400"),
            "the error message carries the provider's text: {error}"
        ),
        Ok(result) => bridge.fail(&format!("expected a JSON-RPC error, got {result}\n{:#?}", turn.updates)),
    }
    // The session survives the failed turn.
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text after the error", "after error");
    assert_end_turn(&bridge, &turn);
    assert!(turn.agent_text().contains("PLAIN-ANSWER-OK"));
}

// ---- restart between turns -----------------------------------------------------------------------------------

fn restart_between_turns(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut first = world.start(sandbox);
    let sid = first.new_session(&ws);
    let turn = timed_prompt(&mut first, &sid, &ws, "SCENARIO:text remember me", "before restart");
    assert_end_turn(&first, &turn);
    first.kill9();
    drop(first);

    let mut second = world.start(sandbox);
    let loaded = second.load_session(&sid, &ws);
    if let Err(e) = &loaded.result {
        second.fail(&format!("session/load after the restart failed: {e}"));
    }
    let replayed = text_of(&loaded.updates, "agent_message_chunk");
    assert!(replayed.contains("PLAIN-ANSWER-OK"), "session/load replays the first turn: {:#?}", loaded.updates);
    let turn = timed_prompt(&mut second, &sid, &ws, "SCENARIO:followup Do you remember?", "after restart");
    assert_end_turn(&second, &turn);
    assert!(turn.agent_text().contains("FOLLOWUP-OK"), "{:#?}", turn.updates);
    assert_continued(&world.server, "SCENARIO:text remember me", "PLAIN-ANSWER-OK");
}

#[test]
fn restart_between_turns_continues_the_opencode_session_none() {
    restart_between_turns("none", "restart_between_turns_none");
}

#[test]
fn restart_between_turns_continues_the_opencode_session_bwrap() {
    if bwrap_ok("restart_between_turns_bwrap") {
        restart_between_turns("bwrap", "restart_between_turns_bwrap");
    }
}

// ---- a lost OpenCode session ---------------------------------------------------------------------------------

/// The sandbox's state (OpenCode's session database) is deleted between two turns: the real OpenCode says
/// "Session not found", and the bridge starts a fresh OpenCode session from a transcript of the first turn.
#[test]
fn a_lost_opencode_session_continues_from_a_transcript() {
    let Some(world) = World::new("lost_session") else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start("bwrap");
    let sid = bridge.new_session(&ws);
    let first = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text Say hello", "before the loss");
    assert_end_turn(&bridge, &first);
    std::fs::remove_dir_all(support::sandbox_state(&world.data, &sid)).expect("delete the session's sandbox state");

    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:followup Do you remember?", "after the loss");
    assert_end_turn(&bridge, &turn);
    assert!(turn.agent_text().contains("no longer exists"), "the user is told: {}", turn.agent_text());
    let chats = world.server.chats("followup");
    let users = messages_text(chats.last().expect("the fresh session reached the model"), "user");
    assert!(
        users.iter().any(|u| u.contains("SCENARIO:text Say hello") && u.contains("PLAIN-ANSWER-OK")),
        "the fresh OpenCode session got the earlier prompt and answer: {users:?}"
    );
}

// ---- slash commands -----------------------------------------------------------------------------------------

/// A command from the user's `opencode.json` is offered to the editor and `/greet world` runs it for real
/// (`opencode run --command greet`, the arguments on stdin): the model gets the expanded template.
#[test]
fn user_slash_command_runs_in_opencode() {
    let Some(world) = World::new("user_slash_command") else { return };
    let config_path = world.user_config.join("opencode/opencode.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["command"] =
        json!({"greet": {"template": "SCENARIO:text greet $ARGUMENTS please", "description": "Greets someone"}});
    std::fs::write(&config_path, config.to_string()).unwrap();
    let ws = world.workspace("ws");
    let mut bridge = world.start("bwrap");
    let sid = bridge.new_session(&ws);
    let offered =
        bridge.wait_update(&sid, "available_commands_update", |u| u["sessionUpdate"] == "available_commands_update");
    let names: Vec<&str> =
        offered["availableCommands"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    assert!(names.contains(&"greet"), "the user's command is offered: {names:?}");
    let turn = timed_prompt(&mut bridge, &sid, &ws, "/greet world", "slash command");
    assert_end_turn(&bridge, &turn);
    assert!(turn.agent_text().contains("PLAIN-ANSWER-OK"), "{:#?}", turn.updates);
    let chats = world.server.chats("text");
    let users = messages_text(chats.last().expect("the command reached the model"), "user");
    assert!(
        users.iter().any(|u| u.contains("SCENARIO:text greet world please")),
        "the model got the expanded template: {users:?}"
    );
}

// ---- the --model flag ----------------------------------------------------------------------------------------

#[test]
fn model_flag_reaches_opencode() {
    let Some(world) = World::new("model_flag_reaches_opencode") else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start_with(world.options("none").arg("--model").arg("fake/other-model"));
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text which model", "--model");
    assert_end_turn(&bridge, &turn);
    let chats = world.server.chats("text");
    assert_eq!(chats.last().unwrap()["body"]["model"], "other-model", "--model fake/other-model is the model called");
}

/// `session/set_model` (the unstable method some clients still call) picks the model of the next request, on the
/// warm server as on `run`.
fn set_model_reaches_opencode(backend: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start_with(world.backend_options("none", backend));
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text which model first", "default model");
    assert_end_turn(&bridge, &turn);
    assert_eq!(world.server.chats("text").last().unwrap()["body"]["model"], "fake-model");
    let set = bridge.request("session/set_model", json!({"sessionId": sid, "modelId": "fake/other-model"}));
    assert_eq!(set.unwrap_or_else(|e| bridge.fail(&format!("session/set_model: {e}"))), json!({}));
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text which model now", "set_model");
    assert_end_turn(&bridge, &turn);
    assert_eq!(world.server.chats("text").last().unwrap()["body"]["model"], "other-model");
}

#[test]
fn set_model_reaches_opencode_run() {
    set_model_reaches_opencode("run", "set_model_reaches_opencode_run");
}

#[test]
fn set_model_reaches_opencode_serve() {
    set_model_reaches_opencode("serve", "set_model_reaches_opencode_serve");
}

/// A model OpenCode does not know: OpenCode itself says only "Unexpected server error" (`run`) or nothing useful
/// (`serve`); the error must name the model and say where to pick one.
fn unknown_model(backend: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let options = world.backend_options("none", backend).arg("--model").arg("fake/no-such-model");
    let mut bridge = world.start_with(options);
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text which model", "unknown model");
    let error = turn.result.clone().expect_err("a model OpenCode does not know fails the turn");
    eprintln!("{backend}: {error}");
    assert_eq!(error.code, -32602, "{error}");
    assert_eq!(error.data, Some(json!({"model": "fake/no-such-model"})), "{error}");
    let (advice, said) = error.message.split_once("\n\nOpenCode said: ").unwrap_or_else(|| panic!("{error}"));
    assert_eq!(
        advice,
        "OpenCode has no model fake/no-such-model here: pick one in the model picker (these are the models OpenCode \
         offers), or run `opencode models` to see them"
    );
    let expected_said = match backend {
        "run" => "Unexpected server error. Check server logs for details.",
        _ => "Model not found: fake/no-such-model. Did you mean: fake-model, other-model?",
    };
    assert_eq!(said, expected_said);
    assert!(world.server.chats("text").is_empty(), "no model may be called");
}

#[test]
fn an_unknown_model_is_named_in_the_error_run() {
    unknown_model("run", "unknown_model_run");
}

#[test]
fn an_unknown_model_is_named_in_the_error_serve() {
    unknown_model("serve", "unknown_model_serve");
}

// ---- a user config dir OpenCode never wrote to ---------------------------------------------------------------

/// OpenCode creates `.gitignore` in its global config dir when it is missing (`Config.ensureGitignore`) and only
/// tolerates EACCES there, not EROFS. A user whose `~/.config/opencode` lacks that file (a config written by hand
/// or by a dotfiles tool, never used by OpenCode itself) must still be able to run under bubblewrap, and OpenCode
/// must not write into the user's real config dir under `--sandbox none` either.
fn fresh_user_config(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let gitignore = world.user_config.join("opencode/.gitignore");
    std::fs::remove_file(&gitignore).unwrap();
    let ws = world.workspace("ws");
    let mut bridge = world.start(sandbox);
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text hello", "fresh user config");
    assert_end_turn(&bridge, &turn);
    assert!(turn.agent_text().contains("PLAIN-ANSWER-OK"));
    assert!(
        !gitignore.exists(),
        "OpenCode wrote into the user's own config dir {}",
        gitignore.parent().unwrap().display()
    );
}

#[test]
fn fresh_user_config_under_bwrap() {
    if bwrap_ok("fresh_user_config_under_bwrap") {
        fresh_user_config("bwrap", "fresh_user_config_under_bwrap");
    }
}

#[test]
fn fresh_user_config_under_none_is_not_written_to() {
    fresh_user_config("none", "fresh_user_config_under_none");
}

// ---- OpenCode's own bash tool against the sandbox -------------------------------------------------------------

/// What the hostile script reports, attack by attack: `true` when the attack worked.
const ATTACK_SCRIPT: &str = r##"
import json, os, socket
targets = json.load(open(".attack-targets.json"))
result = {}
def attempt(name, action):
    try:
        result[name] = bool(action())
    except Exception:
        result[name] = False
attempt("read_ssh_key", lambda: "CANARY" in open(targets["key"]).read())
attempt("read_store", lambda: len(open(targets["store"], "rb").read(16)) > 0)
def write_bashrc():
    with open(targets["bashrc"], "a") as f:
        f.write("echo pwned\n")
    return True
attempt("write_bashrc", write_bashrc)
def write_hook():
    with open(".git/hooks/pre-commit", "w") as f:
        f.write("#!/bin/sh\necho pwned\n")
    return True
attempt("write_git_hook", write_hook)
attempt("connect_host_loopback", lambda: socket.create_connection(("127.0.0.1", targets["port"]), timeout=2) is not None)
def through_proxy():
    proxy = os.environ.get("HTTPS_PROXY", "")
    if not proxy:
        return False
    host, port = proxy.rsplit("/", 1)[-1].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=2)
    s.sendall(("CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\n" % targets["port"]).encode())
    return s.recv(64).split(b" ")[1] == b"200"
attempt("proxy_to_host_loopback", through_proxy)
def reach_a_door():
    # The bridge's own sockets (the proxies', the servers' doors) live in the data dir's run dir.
    for name in os.listdir(targets["run_dir"]):
        s = socket.socket(socket.AF_UNIX)
        s.connect(os.path.join(targets["run_dir"], name))
        return True
    return False
attempt("reach_the_bridges_sockets", reach_a_door)
def hold_a_listener():
    # A listening socket inherited from the sandbox's first process (a server's door) would let a tool answer the
    # bridge in the server's place.
    for fd in range(3, 256):
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                return True
        except OSError:
            pass
    return False
attempt("hold_a_listening_socket", hold_a_listener)
status = open("/proc/self/status").read()
field = lambda name: [l.split()[1] for l in status.splitlines() if l.startswith(name + ":")][0]
result["capabilities"] = int(field("CapEff"), 16) != 0
result["no_seccomp"] = field("Seccomp") != "2"
json.dump(result, open(".attack-result.json", "w"))
"##;

#[test]
fn opencodes_bash_tool_cannot_escape_the_sandbox() {
    bash_tool_attack("run", "opencodes_bash_tool_cannot_escape_the_sandbox");
}

#[test]
fn opencodes_bash_tool_cannot_escape_the_sandbox_of_a_warm_server() {
    bash_tool_attack("serve", "opencodes_bash_tool_cannot_escape_the_sandbox_of_a_warm_server");
}

fn bash_tool_attack(backend: &str, test: &str) {
    if !bwrap_ok(test) {
        return;
    }
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let git = std::process::Command::new("git").args(["init", "-q"]).current_dir(&ws).status().unwrap();
    assert!(git.success());
    std::fs::create_dir_all(world.home.join(".ssh")).unwrap();
    std::fs::write(world.home.join(".ssh/id_ed25519"), "CANARY private key").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let targets = serde_json::json!({
        "key": world.home.join(".ssh/id_ed25519"),
        "store": world.data.join("acp-sandbox.sqlite3"),
        "bashrc": world.home.join(".bashrc"),
        "port": listener.local_addr().unwrap().port(),
        "run_dir": world.data.join("run"),
    });
    std::fs::write(ws.join(".attack-targets.json"), targets.to_string()).unwrap();
    std::fs::write(ws.join(".attack.py"), ATTACK_SCRIPT).unwrap();
    let mut bridge = world.start_with(world.backend_options("bwrap", backend));
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:attack set the project up", "attack");
    assert_end_turn(&bridge, &turn);
    let report = std::fs::read_to_string(ws.join(".attack-result.json"))
        .unwrap_or_else(|e| bridge.fail(&format!("the bash tool wrote no result ({e}): {:#?}", turn.updates)));
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let worked: Vec<&String> = report
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, worked)| worked.as_bool() != Some(false))
        .map(|(k, _)| k)
        .collect();
    assert!(worked.is_empty(), "attacks that worked through OpenCode's bash tool: {worked:?} in {report}");
    assert_eq!(report.as_object().unwrap().len(), 10, "{report}");
    assert!(!world.home.join(".bashrc").exists() && !ws.join(".git/hooks/pre-commit").exists());
}

#[path = "real_opencode/serve.rs"]
mod serve;

#[path = "real_opencode/acp.rs"]
mod acp;

#[path = "real_opencode/isolation.rs"]
mod isolation;

#[path = "real_opencode/modes.rs"]
mod modes;

#[path = "real_opencode/keep_warm.rs"]
mod keep_warm;

#[path = "real_opencode/editor_context.rs"]
mod editor_context;

#[path = "real_opencode/credentials.rs"]
mod credentials;
#[path = "real_opencode/network.rs"]
mod network;
#[path = "real_opencode/start.rs"]
mod start;
