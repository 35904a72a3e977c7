//! acp-sandbox against the REAL ACP agents from npm — Claude Code (`@agentclientprotocol/claude-agent-acp`), Codex
//! (`@agentclientprotocol/codex-acp` with `@openai/codex`) and Gemini CLI (`@google/gemini-cli`) — each talking to
//! its scripted fake model on 127.0.0.1 (`tests/fakes/fake_anthropic.py`, `fake_openai_responses.py`,
//! `fake_gemini.py`, run through `keyed_fake.py`, which notes whether each request carried the test's key).
//! Nothing leaves the machine.
//!
//! For each agent, under `--sandbox bwrap` and `--sandbox none`, with a HOME of the test's own: one streamed answer
//! (several `agent_message_chunk`s, `end_turn`), one tool call that creates `hello.txt` in the workspace (the
//! permission request answered "allow once" where the agent asks), the key reached the model (the fake saw it) and
//! is nowhere in the bridge's log or its store.
//!
//! Run: `.ci/install-acp-agents.sh && cargo test --test real_acp_agents -- --nocapture` (`TIMING` lines say how long
//! each start and turn took). The tests look where `.ci/install-acp-agents.sh` installs
//! (`${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox`); `ACP_SANDBOX_TEST_ACP_AGENTS` names another such folder. When an
//! agent is not there its tests FAIL and say to run the script; `ACP_SANDBOX_SKIP_REAL_ACP_AGENTS=1` skips them.
// Tests start the bridge and the fake servers themselves.
#![allow(clippy::disallowed_methods)]
// A test fails by panicking: unwrap and expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

/// One real agent as these tests drive it.
struct Real {
    /// Its `--agent`.
    id: &'static str,
    /// Its prefix under the install script's folder, and its launcher there.
    prefix: &'static str,
    launcher: &'static str,
    /// Its override variable of the bridge.
    bin_env: &'static str,
    /// Its fake model, the variable with its base URL and what goes after the port.
    fake: &'static str,
    base_url_env: &'static str,
    base_path: &'static str,
    /// Its key's variable.
    key_env: &'static str,
    /// What its fake calls its model in the text scenario's answer.
    model_name: &'static str,
    /// How many permission requests the write scenario makes.
    write_asks: usize,
    /// Checks what the bridge configured the agent with in the session's HOME, after a session's turns.
    configured: fn(&Path),
    /// A mode it offers besides the one it starts in, which `session/set_mode` picks.
    other_mode: &'static str,
}

const CLAUDE: Real = Real {
    id: "claude",
    prefix: "claude-agent-acp@0.101.0",
    launcher: "node_modules/.bin/claude-agent-acp",
    bin_env: "ACP_SANDBOX_CLAUDE_BIN",
    fake: "fake_anthropic.py",
    model_name: "Anthropic",
    base_url_env: "ANTHROPIC_BASE_URL",
    base_path: "",
    key_env: "ANTHROPIC_API_KEY",
    // Claude Code asks before its Bash tool runs (permissions.defaultMode "default", the bridge's default settings).
    write_asks: 1,
    configured: |home| {
        // The test's HOME has no settings: the session got the bridge's default, which made the write above ask.
        let settings = std::fs::read_to_string(home.join(".claude/settings.json")).unwrap();
        assert_eq!(settings, acp_sandbox::agents::claude::DEFAULT_SETTINGS);
        // Claude Code kept the conversation there.
        assert!(home.join(".claude/projects").is_dir(), "no transcripts in {}", home.display());
    },
    other_mode: "acceptEdits",
};

const CODEX: Real = Real {
    id: "codex",
    prefix: "codex-acp@2.6.0",
    launcher: "node_modules/.bin/codex-acp",
    bin_env: "ACP_SANDBOX_CODEX_BIN",
    fake: "fake_openai_responses.py",
    model_name: "Responses",
    base_url_env: "OPENAI_BASE_URL",
    base_path: "/v1",
    key_env: "OPENAI_API_KEY",
    // Full access (the bridge's mode for Codex: its own bubblewrap cannot run inside ours) never asks.
    write_asks: 0,
    configured: |home| {
        // CODEX_HOME is the session's `~/.codex`, where Codex keeps its threads: not under /tmp, so its own helpers
        // would work, and it survives the agent.
        assert!(home.join(".codex/sessions").is_dir(), "no Codex threads in {}", home.display());
        assert!(!home.join(".codex/auth.json").exists(), "Codex stored a login: the key came by its variable");
    },
    other_mode: "read-only",
};

const GEMINI: Real = Real {
    id: "gemini",
    prefix: "gemini-cli@0.61.0",
    launcher: "node_modules/.bin/gemini",
    bin_env: "ACP_SANDBOX_GEMINI_BIN",
    fake: "fake_gemini.py",
    model_name: "Gemini",
    base_url_env: "GOOGLE_GEMINI_BASE_URL",
    base_path: "",
    key_env: "GEMINI_API_KEY",
    // Gemini CLI asks before run_shell_command (its "default" mode).
    write_asks: 1,
    configured: |home| {
        let settings: Value =
            serde_json::from_str(&std::fs::read_to_string(home.join(".gemini/settings.json")).unwrap()).unwrap();
        assert_eq!(settings, acp_sandbox::agents::gemini::settings());
    },
    // Gemini CLI says its modes and models only the older way (`modes`, `models`): the bridge offers them as options.
    other_mode: "autoEdit",
};

/// The key every agent gets: a test fails when it shows up in the bridge's log or store.
const KEY: &str = "acp-sandbox-real-agent-KEY-7f3a9c";

/// Upper bound of one real turn (a cold start of a 300 MB native binary on a busy 2-core machine included).
const TURN_LIMIT: Duration = Duration::from_secs(180);

// ---- finding the agents --------------------------------------------------------------------------------------

/// The agent's launcher, or `None` when the tests are told to skip. Panics with the install hint when missing.
fn launcher(agent: &Real, test: &str) -> Option<PathBuf> {
    if std::env::var("ACP_SANDBOX_SKIP_REAL_ACP_AGENTS").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED {test}: ACP_SANDBOX_SKIP_REAL_ACP_AGENTS=1");
        return None;
    }
    let hint = format!(
        "run `.ci/install-acp-agents.sh {}` (it installs into ${{XDG_CACHE_HOME:-$HOME/.cache}}/acp-sandbox; \
         ACP_SANDBOX_TEST_ACP_AGENTS names another such folder), or set ACP_SANDBOX_SKIP_REAL_ACP_AGENTS=1 to skip",
        agent.id
    );
    let root = match std::env::var_os("ACP_SANDBOX_TEST_ACP_AGENTS").filter(|p| !p.is_empty()) {
        Some(root) => PathBuf::from(root),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
            .expect("neither XDG_CACHE_HOME nor HOME is set")
            .join("acp-sandbox"),
    };
    let path = root.join(agent.prefix).join(agent.launcher);
    assert!(path.exists(), "{} is not installed (looked for {}): {hint}", agent.id, path.display());
    Some(path)
}

/// Fails unless bubblewrap works here (it does on the CI image); `ACP_SANDBOX_SKIP_BWRAP=1` skips instead.
fn bwrap_ok(test: &str) -> bool {
    match bwrap_usable() {
        Ok(()) => true,
        Err(_) if std::env::var("ACP_SANDBOX_SKIP_BWRAP").is_ok_and(|v| v == "1") => {
            eprintln!("SKIPPED {test}: ACP_SANDBOX_SKIP_BWRAP=1");
            false
        }
        Err(why) => panic!("bubblewrap does not work here ({why}); set ACP_SANDBOX_SKIP_BWRAP=1 to skip"),
    }
}

// ---- the fake model ------------------------------------------------------------------------------------------

/// The agent's fake model on a free port of 127.0.0.1; killed when dropped.
struct Fake {
    child: Child,
    port: u16,
    record: PathBuf,
}

impl Fake {
    fn start(agent: &Real, dir: &Path, key: &str, tls: Option<&(PathBuf, PathBuf)>) -> Fake {
        let record = dir.join("fake-model-requests.jsonl");
        let fakes = fakes_dir();
        let mut child = Command::new("python3")
            .arg(fakes.join("keyed_fake.py"))
            .arg(fakes.join(agent.fake))
            .arg("--record")
            .arg(&record)
            .env("FAKE_EXPECTED_KEY", key)
            .envs(tls.iter().flat_map(|(cert, key)| [("FAKE_TLS_CERT", cert), ("FAKE_TLS_KEY", key)]))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(dir.join("fake-model.log")).unwrap()))
            .spawn()
            .expect("start python3 tests/fakes/keyed_fake.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("read the fake's port");
        let port = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("the fake did not say its port: {line:?}"));
        Fake { child, port, record }
    }

    /// Every request received so far: `{kind, scenario, step, key_ok, …}`.
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a recorded request is JSON"))
            .collect()
    }

    /// The chat (not side) requests of `scenario`.
    fn chats(&self, scenario: &str) -> Vec<Value> {
        self.requests().into_iter().filter(|r| r["kind"] == "chat" && r["scenario"] == scenario).collect()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test CA and a certificate for 127.0.0.1 it signed, made by `openssl` in `dir`: (certificate, its key).
fn test_ca(dir: &Path) -> (PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=acp-sandbox test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    (dir.join("server.pem"), dir.join("server.key"))
}

// ---- one test's world ----------------------------------------------------------------------------------------

/// Where a test's directories go: [`test_root`] unless it is inside a git checkout (it normally is: `target/` of
/// this repository), since every one of these agents takes the nearest `.git` above its workspace for its project
/// (Claude Code lists its files, Codex and Gemini CLI look for its root); then `/var/tmp`, which bubblewrap shows.
fn world_parent() -> PathBuf {
    let root = test_root();
    if !root.ancestors().any(|dir| dir.join(".git").exists()) {
        return root;
    }
    let uid = nix::unistd::getuid();
    let parent = PathBuf::from(format!("/var/tmp/acp-sandbox-real-acp-agents-{uid}"));
    std::fs::create_dir_all(&parent).unwrap();
    assert!(!parent.ancestors().any(|dir| dir.join(".git").exists()), "{} is inside a git checkout", parent.display());
    parent
}

/// A fake model, a HOME and data dir of the test's own, a workspace.
struct World {
    root: tempfile::TempDir,
    fake: Fake,
    launcher: PathBuf,
    home: PathBuf,
    data: PathBuf,
    /// The key the agent gets.
    key: String,
    /// Its fake serves HTTPS.
    tls: bool,
}

impl World {
    fn new(agent: &Real, test: &str) -> Option<World> {
        Self::with_key(agent, test, KEY, false)
    }

    /// A world whose agent gets `key` instead of [`KEY`]; with `tls`, its fake serves HTTPS with a certificate of a
    /// test CA (`ca.pem` in the world), which only the bridge is told to trust.
    fn with_key(agent: &Real, test: &str, key: &str, tls: bool) -> Option<World> {
        let launcher = launcher(agent, test)?;
        let root = tempfile::Builder::new().prefix(&format!("{test}-")).tempdir_in(world_parent()).unwrap();
        let certificate = tls.then(|| test_ca(root.path()));
        let fake = Fake::start(agent, root.path(), key, certificate.as_ref());
        let home = root.path().join("home");
        let data = root.path().join("data");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        Some(World { root, fake, launcher, home, data, key: key.to_string(), tls })
    }

    fn workspace(&self) -> PathBuf {
        let path = self.root.path().join("ws");
        std::fs::create_dir_all(&path).unwrap();
        path.canonicalize().unwrap()
    }

    /// The bridge running the real agent against the fake, the key in its environment.
    fn options(&self, agent: &Real, sandbox: &str) -> BridgeOptions {
        // The override names the launcher inside the install script's prefix: the sandbox shows the launcher's own
        // folder, and the prefix (the native programs beside it) is shown read-only here.
        let prefix = self.launcher.ancestors().nth(3).unwrap().to_path_buf();
        BridgeOptions::new(agent.id, &self.data)
            .sandbox(sandbox)
            .env(agent.bin_env, &self.launcher.display().to_string())
            .env("ACP_SANDBOX_ALLOW_READ", &prefix.display().to_string())
            .env("HOME", &self.home.display().to_string())
            .env("XDG_CONFIG_HOME", &self.home.join(".config").display().to_string())
            .env("XDG_DATA_HOME", &self.home.join(".local/share").display().to_string())
            .env("XDG_CACHE_HOME", &self.home.join(".cache").display().to_string())
            .env(agent.key_env, &self.key)
            .env(
                agent.base_url_env,
                &format!(
                    "{}://127.0.0.1:{}{}",
                    if self.tls { "https" } else { "http" },
                    self.fake.port,
                    agent.base_path
                ),
            )
            // A machine that says IS_SANDBOX=yes made Claude Code refuse to start as root: the bridge never
            // passes it on, which this proves.
            .env("IS_SANDBOX", "yes")
            // Codex's default model gets its tools as JavaScript ("code mode"), which the fake cannot script; the
            // notes' model gets them as functions.
            .env("ACP_SANDBOX_CODEX_MODEL", "gpt-5.5")
            .env("RUST_LOG", &std::env::var("RUST_LOG").unwrap_or_else(|_| "debug".into()))
    }
}

impl Drop for World {
    /// A failing test kills its bridge mid-turn; under `--sandbox none` the agent would live on.
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

// ---- the checks ----------------------------------------------------------------------------------------------

/// One prompt, waited for patiently (a real agent is silent while it starts cold or runs a tool).
fn turn(bridge: &mut Bridge, sid: &str, text: &str, label: &str) -> Turn {
    let started = Instant::now();
    let id = bridge.send_prompt(sid, text);
    let result = bridge
        .wait_response_within(id, TURN_LIMIT)
        .unwrap_or_else(|| bridge.fail(&format!("no answer to the {label} prompt within {TURN_LIMIT:?}")));
    eprintln!("TIMING {label} ({}): {:?}", bridge.options.sandbox, started.elapsed());
    Turn { result, updates: bridge.take_updates(sid) }
}

/// The agent's own text pieces (the bridge's notes, e.g. that `--sandbox none` runs without one, start with `_`).
fn chunks(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .filter(|text| !text.trim().starts_with('_'))
        .map(str::to_string)
        .collect()
}

fn assert_end_turn(bridge: &Bridge, turn: &Turn) {
    match &turn.result {
        Ok(result) if result["stopReason"] == "end_turn" => {}
        other => bridge.fail(&format!("expected end_turn, got {other:?}\nupdates: {:#?}", turn.updates)),
    }
}

/// Every file of the bridge's own under its data dir (the store, its logs), without the sessions' state dirs,
/// which are the agents' HOMEs.
fn bridge_files(data: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![data.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() && path != data.join("sessions") {
                dirs.push(path);
            } else if kind.is_file() {
                files.push(path);
            }
        }
    }
    files
}

fn real_agent(agent: &Real, sandbox: &str, test: &str) {
    let Some(world) = World::new(agent, test) else { return };
    let ws = world.workspace();
    let started = Instant::now();
    let mut bridge = Bridge::start(world.options(agent, sandbox));
    let sid = bridge.new_session(&ws);
    eprintln!("TIMING bridge start + session/new ({sandbox}): {:?}", started.elapsed());

    let answer = turn(&mut bridge, &sid, "SCENARIO:text Say hello", "text");
    assert_end_turn(&bridge, &answer);
    let pieces = chunks(&answer.updates);
    assert!(pieces.len() >= 2, "a streamed answer comes in pieces: {pieces:?}\n{:#?}", answer.updates);
    assert_eq!(
        pieces.concat(),
        format!("Hello from the fake {} model. It streams in pieces. TEXT-ANSWER-OK", agent.model_name),
        "{pieces:?}"
    );

    bridge.permission_answer = Some("allow_once".into());
    let write = turn(&mut bridge, &sid, "SCENARIO:write Create hello.txt", "write");
    assert_end_turn(&bridge, &write);
    assert_eq!(
        std::fs::read_to_string(ws.join("hello.txt")).unwrap_or_else(|e| bridge.fail(&format!("no hello.txt: {e}"))),
        format!("hi from {}", agent.id),
        "the tool ran in the workspace"
    );
    assert_eq!(bridge.permission_requests.len(), agent.write_asks, "{:#?}", bridge.permission_requests);
    assert_eq!(
        chunks(&write.updates).concat(),
        "I will create the file.The file hello.txt is written. WRITE-DONE",
        "{:#?}",
        write.updates
    );
    // The tool's card, under the id the permission asked about: announced, then completed (Gemini CLI announces its
    // call only in the permission request, so its first update is the announcement, already completed).
    let completed: Vec<&Value> = write
        .updates
        .iter()
        .filter(|u| {
            (u["sessionUpdate"] == "tool_call_update" || u["sessionUpdate"] == "tool_call")
                && u["status"] == "completed"
        })
        .collect();
    assert_eq!(completed.len(), 1, "one tool finished: {:#?}", write.updates);
    let id = &completed[0]["toolCallId"];
    let announced =
        write.updates.iter().filter(|u| u["sessionUpdate"] == "tool_call" && &u["toolCallId"] == id).count();
    assert_eq!(announced, 1, "one tool_call for {id}: {:#?}", write.updates);
    if let Some(asked) = bridge.permission_requests.first() {
        assert_eq!(&asked["toolCall"]["toolCallId"], id, "the permission asked about the tool that ran: {asked:#}");
    }

    // Its modes and models are the session's options (announced when it started); session/set_mode reaches it.
    let announced = answer.updates.iter().rev().find(|u| u["sessionUpdate"] == "config_option_update");
    let options = announced.unwrap_or_else(|| bridge.fail("no config_option_update"))["configOptions"].clone();
    let of = |options: &Value, category: &str| -> Value {
        let found = options.as_array().into_iter().flatten().find(|o| o["category"] == category).cloned();
        found.unwrap_or_else(|| panic!("no {category} option in {options:#}"))
    };
    let modes: Vec<String> = of(&options, "mode")["options"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|choice| choice["value"].as_str().map(str::to_string))
        .collect();
    assert!(modes.iter().any(|m| m == agent.other_mode), "{} offers no mode {}: {modes:?}", agent.id, agent.other_mode);
    assert_ne!(of(&options, "mode")["currentValue"], agent.other_mode);
    assert!(of(&options, "model")["options"].as_array().is_some_and(|models| !models.is_empty()), "{options:#}");
    bridge
        .request("session/set_mode", serde_json::json!({"sessionId": sid, "modeId": agent.other_mode}))
        .unwrap_or_else(|e| bridge.fail(&format!("set_mode: {e:?}")));
    let changed =
        bridge.wait_update(&sid, "the options after set_mode", |u| u["sessionUpdate"] == "config_option_update");
    assert_eq!(of(&changed["configOptions"], "mode")["currentValue"], agent.other_mode, "{changed:#}");
    // Another of its models, through the model option (Gemini CLI's through session/set_model).
    let model = of(&changed["configOptions"], "model");
    let other = model["options"].as_array().into_iter().flatten().find_map(|choice| {
        let value = choice["value"].as_str()?;
        (value != model["currentValue"]).then(|| value.to_string())
    });
    let other = other.unwrap_or_else(|| panic!("one model only: {model:#}"));
    let set = bridge
        .request(
            "session/set_config_option",
            serde_json::json!({"sessionId": sid, "configId": model["id"], "value": other}),
        )
        .unwrap_or_else(|e| bridge.fail(&format!("set the model {other}: {e:?}")));
    assert_eq!(of(&set["configOptions"], "model")["currentValue"], other.as_str(), "{set:#}");

    // The key reached the model, through the agent, and only through it.
    let chats: Vec<Value> = ["text", "write"].iter().flat_map(|s| world.fake.chats(s)).collect();
    assert!(chats.len() >= 3, "the fake saw the text and the two write steps: {chats:#?}");
    assert!(chats.iter().all(|chat| chat["key_ok"] == true), "a model request lacked the key: {chats:#?}");
    // What the bridge configured the agent with, in the session's HOME (the state dir, never /tmp).
    let home = sandbox_state(&world.data, &sid).join("home");
    (agent.configured)(&home);
    bridge.close_stdin();
    bridge.wait_exit(Duration::from_secs(20));
    assert!(!bridge.stderr().contains(KEY), "the key is in the bridge's log");
    let files = bridge_files(&world.data);
    let named = |prefix: &str| files.iter().any(|f| f.file_name().unwrap().to_string_lossy().starts_with(prefix));
    assert!(named("acp-sandbox.sqlite3") && named("acp-sandbox.log"), "no store or log in {files:?}");
    for file in files {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
            "the key is in the bridge's {}",
            file.display()
        );
    }
}

macro_rules! real {
    ($none:ident, $bwrap:ident, $agent:expr) => {
        #[test]
        fn $none() {
            real_agent(&$agent, "none", stringify!($none));
        }

        #[test]
        fn $bwrap() {
            if bwrap_ok(stringify!($bwrap)) {
                real_agent(&$agent, "bwrap", stringify!($bwrap));
            }
        }
    };
}

real!(claude_streams_and_writes_none, claude_streams_and_writes_bwrap, CLAUDE);
real!(codex_streams_and_writes_none, codex_streams_and_writes_bwrap, CODEX);
real!(gemini_streams_and_writes_none, gemini_streams_and_writes_bwrap, GEMINI);

/// Claude Code with a user who has their own `~/.claude/settings.json` (every Bash command allowed) and a login in
/// `~/.claude/.credentials.json`: the settings reach Claude Code (its write no longer asks), the login never does.
fn claude_with_the_users_settings(sandbox: &str, test: &str) {
    let Some(world) = World::new(&CLAUDE, test) else { return };
    let ws = world.workspace();
    let dot_claude = world.home.join(".claude");
    std::fs::create_dir_all(&dot_claude).unwrap();
    let settings = r#"{"permissions": {"defaultMode": "default", "allow": ["Bash"]}}"#;
    std::fs::write(dot_claude.join("settings.json"), settings).unwrap();
    std::fs::write(dot_claude.join(".credentials.json"), r#"{"claudeAiOauth": {"accessToken": "OAUTH-SECRET-1d2c"}}"#)
        .unwrap();
    let mut bridge = Bridge::start(world.options(&CLAUDE, sandbox));
    let sid = bridge.new_session(&ws);
    bridge.permission_answer = Some("reject_once".into());
    let write = turn(&mut bridge, &sid, "SCENARIO:write Create hello.txt", "write");
    assert_end_turn(&bridge, &write);
    assert_eq!(std::fs::read_to_string(ws.join("hello.txt")).unwrap(), "hi from claude");
    assert_eq!(bridge.permission_requests, Vec::<Value>::new(), "the user's allow rule did not reach Claude Code");
    let state = sandbox_state(&world.data, &sid);
    assert!(!state.join("home/.claude/.credentials.json").exists(), "the user's login was shown to Claude Code");
    let mut dirs = vec![state];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let (path, kind) = (entry.path(), entry.file_type().unwrap());
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() {
                let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
                assert!(!text.contains("OAUTH-SECRET-1d2c"), "the user's login is in {}", path.display());
            }
        }
    }
}

#[test]
fn claude_gets_the_users_settings_and_never_their_login_none() {
    claude_with_the_users_settings("none", "claude_gets_the_users_settings_and_never_their_login_none");
}

#[test]
fn claude_gets_the_users_settings_and_never_their_login_bwrap() {
    if bwrap_ok("claude_gets_the_users_settings_and_never_their_login_bwrap") {
        claude_with_the_users_settings("bwrap", "claude_gets_the_users_settings_and_never_their_login_bwrap");
    }
}

/// The model gateway: a hostile tool the agent runs hunts for the key in its environment, every process's
/// environment and command line it sees and the files it can read, and finds none, while the fake model gets the
/// key on every request and the turn works. The agent's variable holds the gateway's placeholder, and that
/// placeholder sent anywhere else arrives as it is (under bubblewrap the fake is no longer reachable from inside at
/// all: only the gateway is).
fn the_key_stays_with_the_bridge(agent: &Real, sandbox: &str, stored: bool, test: &str) {
    // A key of this test's own: the source and the test binaries hold [`KEY`], and the sandbox may see them.
    let key = format!("sk-ant-api03-{}", uuid_like());
    let Some(world) = World::with_key(agent, test, &key, false) else { return };
    let ws = world.workspace();
    std::fs::copy(fakes_dir().join("hunt_key.py"), ws.join("hunt_key.py")).unwrap();
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    let mode = if sandbox == "none" { "tree" } else { "all" };
    let leak = format!("http://127.0.0.1:{}/leak", world.fake.port);
    let script = format!("exec python3 hunt_key.py {hex} {mode} {leak} {} > hunt.txt 2>&1\n", agent.key_env);
    std::fs::write(ws.join("hunt.sh"), script).unwrap();
    let mut options = world.options(agent, sandbox);
    if stored {
        // Kept by `acp-sandbox login` in the data dir, none in the bridge's environment.
        options = options.without_env(agent.key_env);
        log_in(&world, agent, &options, &key);
    }
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    bridge.permission_answer = Some("allow_once".into());
    let hunt = turn(&mut bridge, &sid, "SCENARIO:hunt Run the hunt", "hunt");
    assert_end_turn(&bridge, &hunt);
    let report =
        std::fs::read_to_string(ws.join("hunt.txt")).unwrap_or_else(|e| bridge.fail(&format!("no hunt.txt: {e}")));
    let lines: Vec<&str> = report.lines().filter(|line| !line.starts_with("LEAK")).collect();
    assert_eq!(lines, ["FOUND 0", "PLACEHOLDER yes"], "{report}");
    let leaked: Vec<Value> = world
        .fake
        .requests()
        .into_iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/leak")))
        .collect();
    if sandbox == "none" {
        // Sent straight to another server: the placeholder, never the key.
        assert!(report.contains("LEAK 404"), "{report}");
        assert_eq!(leaked.len(), 1, "{leaked:#?}");
        assert_eq!(leaked[0]["key_ok"], false, "{:#}", leaked[0]);
        let sent = leaked[0]["headers"]["authorization"].as_str().unwrap_or_default();
        assert!(sent.starts_with("Bearer ") && sent.contains("acpsandbox") && !sent.contains(&key), "{sent}");
    } else {
        // The fake is no model endpoint of the sandbox any more: the proxy refuses it.
        assert!(report.contains("LEAK 403"), "{report}");
        assert!(leaked.is_empty(), "{leaked:#?}");
    }
    let chats = world.fake.chats("hunt");
    assert!(chats.len() >= 2, "the fake saw both steps: {chats:#?}");
    assert!(chats.iter().all(|chat| chat["key_ok"] == true), "a model request lacked the key: {chats:#?}");
    bridge.close_stdin();
    bridge.wait_exit(Duration::from_secs(20));
    assert!(!bridge.stderr().contains(&key), "the key is in the bridge's log");
}

/// A model API behind TLS, with a certificate of a CA only the bridge is told to trust (`ACP_SANDBOX_EXTRA_CA`):
/// the gateway re-originates TLS to it, and the turn works with the key the fake wanted.
#[test]
fn claude_reaches_an_https_model_api_through_the_gateway() {
    let test = "claude_reaches_an_https_model_api_through_the_gateway";
    if !bwrap_ok(test) {
        return;
    }
    let Some(world) = World::with_key(&CLAUDE, test, KEY, true) else { return };
    let ws = world.workspace();
    let ca = world.root.path().join("ca.pem").display().to_string();
    let mut bridge = Bridge::start(world.options(&CLAUDE, "bwrap").env("ACP_SANDBOX_EXTRA_CA", &ca));
    let sid = bridge.new_session(&ws);
    let answer = turn(&mut bridge, &sid, "SCENARIO:text Say hello", "text");
    assert_end_turn(&bridge, &answer);
    let chats = world.fake.chats("text");
    assert!(!chats.is_empty() && chats.iter().all(|chat| chat["key_ok"] == true), "{chats:#?}");
}

/// 32 hex digits that differ from run to run.
fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{:032x}", nanos ^ (u128::from(std::process::id()) << 64))
}

#[test]
fn claude_keeps_no_key_inside_none() {
    the_key_stays_with_the_bridge(&CLAUDE, "none", false, "claude_keeps_no_key_inside_none");
}

#[test]
fn claude_keeps_no_key_inside_bwrap() {
    if bwrap_ok("claude_keeps_no_key_inside_bwrap") {
        the_key_stays_with_the_bridge(&CLAUDE, "bwrap", false, "claude_keeps_no_key_inside_bwrap");
    }
}

#[test]
fn gemini_keeps_no_key_inside_bwrap() {
    if bwrap_ok("gemini_keeps_no_key_inside_bwrap") {
        the_key_stays_with_the_bridge(&GEMINI, "bwrap", false, "gemini_keeps_no_key_inside_bwrap");
    }
}

#[test]
fn codex_keeps_no_key_inside_bwrap() {
    if bwrap_ok("codex_keeps_no_key_inside_bwrap") {
        the_key_stays_with_the_bridge(&CODEX, "bwrap", false, "codex_keeps_no_key_inside_bwrap");
    }
}

#[test]
fn claude_keeps_no_stored_key_inside_bwrap() {
    if bwrap_ok("claude_keeps_no_stored_key_inside_bwrap") {
        the_key_stays_with_the_bridge(&CLAUDE, "bwrap", true, "claude_keeps_no_stored_key_inside_bwrap");
    }
}

/// `acp-sandbox login --agent <agent>` with `token` typed in; answers what it printed.
fn log_in(world: &World, agent: &Real, options: &BridgeOptions, token: &str) -> String {
    let mut login = Command::new(bridge_bin());
    login.args(["login", "--agent", agent.id, "--data-dir"]).arg(&world.data);
    login.envs(options.env.iter().map(|(key, value)| (key, value))).env_remove(agent.key_env);
    login.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = login.spawn().unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), format!("{token}\n").as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "login: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

/// A key kept by `acp-sandbox login` (none in the bridge's environment) reaches the agent just the same.
fn a_stored_key_reaches_the_agent(agent: &Real, test: &str) {
    let Some(world) = World::new(agent, test) else { return };
    let ws = world.workspace();
    let options = world.options(agent, "none").without_env(agent.key_env);
    log_in(&world, agent, &options, KEY);
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let answer = turn(&mut bridge, &sid, "SCENARIO:text Say hello", "text");
    assert_end_turn(&bridge, &answer);
    let chats = world.fake.chats("text");
    assert!(!chats.is_empty() && chats.iter().all(|chat| chat["key_ok"] == true), "{chats:#?}");
}

#[test]
fn a_stored_key_reaches_gemini() {
    a_stored_key_reaches_the_agent(&GEMINI, "a_stored_key_reaches_gemini");
}

/// A Claude subscription: the token `claude setup-token` prints, kept by `acp-sandbox login`, reaches Claude Code as
/// `CLAUDE_CODE_OAUTH_TOKEN`, which it sends as a bearer token with its OAuth beta (no API key at all), under
/// bubblewrap where it runs.
#[test]
fn a_claude_subscription_token_reaches_claude_code_as_its_oauth_token() {
    let test = "a_claude_subscription_token_reaches_claude_code_as_its_oauth_token";
    let Some(world) = World::new(&CLAUDE, test) else { return };
    let sandbox = if bwrap_ok(test) { "bwrap" } else { "none" };
    let ws = world.workspace();
    let token = format!("sk-ant-oat01-{KEY}");
    let options = world.options(&CLAUDE, sandbox).without_env(CLAUDE.key_env);
    let said = log_in(&world, &CLAUDE, &options, &token);
    assert!(said.contains("acp-sandbox passes it to Claude Code as CLAUDE_CODE_OAUTH_TOKEN;"), "{said}");
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let answer = turn(&mut bridge, &sid, "SCENARIO:text Say hello", "text");
    assert_end_turn(&bridge, &answer);
    let chats = world.fake.chats("text");
    assert!(!chats.is_empty(), "no model request");
    for chat in &chats {
        assert_eq!(chat["headers"]["authorization"], format!("Bearer {token}"), "{chat:#}");
        let betas: Vec<&str> = chat["headers"]["anthropic-beta"].as_str().unwrap_or("").split(',').collect();
        assert!(betas.contains(&"oauth-2025-04-20"), "not sent as a subscription's token: {betas:?}");
        assert_eq!(chat["key_ok"], false, "an API key was sent too: {chat:#}");
    }
    bridge.close_stdin();
    bridge.wait_exit(Duration::from_secs(20));
    assert!(!bridge.stderr().contains(&token), "the token is in the bridge's log");

    // The same token in the agent server's environment instead (the login deleted): it logs Claude Code in alike.
    let logout = Command::new(bridge_bin())
        .args(["logout", "--agent", "claude", "--data-dir"])
        .arg(&world.data)
        .envs(world.options(&CLAUDE, sandbox).without_env(CLAUDE.key_env).env.iter().map(|(k, v)| (k, v)))
        .env_remove(CLAUDE.key_env)
        .output()
        .unwrap();
    assert!(logout.status.success(), "logout: {}", String::from_utf8_lossy(&logout.stderr));
    let from_env = format!("sk-ant-oat01-env-{KEY}");
    let options = world.options(&CLAUDE, sandbox).without_env(CLAUDE.key_env).env("CLAUDE_CODE_OAUTH_TOKEN", &from_env);
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    let answer = turn(&mut bridge, &sid, "SCENARIO:text Say hello again", "text");
    assert_end_turn(&bridge, &answer);
    let sent: Vec<Value> =
        world.fake.chats("text").iter().map(|chat| chat["headers"]["authorization"].clone()).collect();
    assert_eq!(sent.last(), Some(&Value::from(format!("Bearer {from_env}"))), "{sent:?}");
}

/// OpenAI's login server faked (`tests/fakes/fake_openai_auth.py`): a device code, two polls before the person
/// "entered" it, then the tokens of a ChatGPT Plus account.
struct FakeLogin {
    child: Child,
    port: u16,
}

impl FakeLogin {
    fn start(dir: &Path) -> FakeLogin {
        let mut child = Command::new("python3")
            .arg(fakes_dir().join("fake_openai_auth.py"))
            .args(["--pending", "2", "--record"])
            .arg(dir.join("fake-login-requests.jsonl"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python3 tests/fakes/fake_openai_auth.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("read the fake's port");
        let port = line.strip_prefix("PORT ").and_then(|p| p.trim().parse().ok()).expect("the login fake's port");
        FakeLogin { child, port }
    }
}

impl Drop for FakeLogin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Codex's own ChatGPT sign-in: `acp-sandbox login --agent codex --own` runs Codex's device-code login with its
/// home in the data dir (the key stored before is deleted: one login at a time); a session given no key sees the
/// login as its `~/.codex/auth.json` and its model requests carry the login's access token and account; `logout`
/// deletes it, and the next prompt asks for a login again.
fn codex_signs_in_with_chatgpt(sandbox: &str, test: &str) {
    let Some(world) = World::new(&CODEX, test) else { return };
    let ws = world.workspace();
    let login_server = FakeLogin::start(world.root.path());
    let options = world
        .options(&CODEX, sandbox)
        .without_env(CODEX.key_env)
        .env("ACP_SANDBOX_CODEX_ISSUER", &format!("http://127.0.0.1:{}", login_server.port));
    log_in(&world, &CODEX, &options, "sk-stored-before-the-sign-in");
    let key_file = world.data.join("credentials/codex");
    assert!(key_file.exists());

    let signed_in = Command::new(bridge_bin())
        .args(["login", "--agent", "codex", "--own", "--data-dir"])
        .arg(&world.data)
        .envs(options.env.iter().map(|(key, value)| (key, value)))
        .env_remove(CODEX.key_env)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&signed_in.stderr).into_owned() + &String::from_utf8_lossy(&signed_in.stdout);
    assert!(signed_in.status.success(), "login --own: {said}");
    // Codex's own words show the code to enter; ours say where the login went.
    assert!(said.contains("FAKE-CODE1"), "the device code was not shown: {said}");
    let login = world.data.join("logins/codex/auth.json");
    let ours = String::from_utf8_lossy(&signed_in.stderr);
    let lines: Vec<&str> = ours.lines().rev().take(2).collect();
    assert_eq!(
        lines,
        [
            format!(
                "Signed in with ChatGPT: the login is kept in {} (readable by you only) and each session on this \
                 machine sees it as its ~/.codex/auth.json, where Codex refreshes it. OPENAI_API_KEY set in the agent \
                 server's environment wins. `acp-sandbox logout` deletes it.",
                login.display()
            ),
            format!("Deleted the key stored before in {}: sessions use this sign-in now.", key_file.display()),
        ],
        "{said}"
    );
    assert!(!key_file.exists(), "the key stored before is gone");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&login).unwrap().permissions().mode() & 0o077, 0, "the login is the user's only");
    let auth: Value = serde_json::from_str(&std::fs::read_to_string(&login).unwrap()).unwrap();
    assert_eq!(auth["auth_mode"], "chatgpt", "{auth:#}");
    assert!(!world.home.join(".codex/auth.json").exists(), "the sign-in wrote to the user's own ~/.codex");
    let doctor = Command::new(bridge_bin())
        .args(["doctor", "--agent", "codex", "--data-dir"])
        .arg(&world.data)
        .envs(options.env.iter().map(|(key, value)| (key, value)))
        .env_remove(CODEX.key_env)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    let key_line: Vec<&str> = report.lines().filter(|line| line.trim_start().starts_with("OPENAI_API_KEY:")).collect();
    assert_eq!(
        key_line,
        [format!("            OPENAI_API_KEY: not needed: signed in with ChatGPT (login in {})", login.display())],
        "{report}"
    );

    let mut bridge = Bridge::start(options.clone());
    let sid = bridge.new_session(&ws);
    let answer = turn(&mut bridge, &sid, "SCENARIO:text Say hello", "text");
    assert_end_turn(&bridge, &answer);
    assert_eq!(
        chunks(&answer.updates).concat(),
        "Hello from the fake Responses model. It streams in pieces. TEXT-ANSWER-OK",
        "{:#?}",
        answer.updates
    );
    let chats = world.fake.chats("text");
    assert!(!chats.is_empty(), "no model request");
    for chat in &chats {
        assert_eq!(chat["bearer_jwt"]["tag"], "fake-chatgpt-access-1", "not the login's access token: {chat:#}");
        assert_eq!(chat["headers"]["chatgpt-account-id"], "acct-fake-1", "{chat:#}");
        assert_eq!(chat["key_ok"], false, "an API key was sent: {chat:#}");
    }
    // The session's `~/.codex/auth.json` is the login itself: a link without a sandbox, and under bubblewrap an
    // empty mount point on the session's disk (the login was only ever in the data dir).
    let shown = sandbox_state(&world.data, &sid).join("home/.codex/auth.json");
    match sandbox {
        "none" => assert_eq!(std::fs::read_link(&shown).unwrap(), login),
        _ => assert_eq!(std::fs::read(&shown).unwrap(), b""),
    }

    let logout = Command::new(bridge_bin())
        .args(["logout", "--agent", "codex", "--data-dir"])
        .arg(&world.data)
        .envs(options.env.iter().map(|(key, value)| (key, value)))
        .env_remove(CODEX.key_env)
        .output()
        .unwrap();
    assert!(logout.status.success(), "logout: {}", String::from_utf8_lossy(&logout.stderr));
    assert_eq!(String::from_utf8_lossy(&logout.stderr), format!("Deleted {}.\n", login.display()));
    let id = bridge.send_prompt(&sid, "SCENARIO:text Say hello again");
    match bridge.wait_response_within(id, TURN_LIMIT) {
        Some(Err(error)) => {
            assert_eq!((error.code, error.data.unwrap()["variable"].clone()), (-32000, "OPENAI_API_KEY".into()))
        }
        other => bridge.fail(&format!("a prompt after the logout was answered {other:?}")),
    }
}

#[test]
fn codex_signs_in_with_chatgpt_none() {
    codex_signs_in_with_chatgpt("none", "codex_signs_in_with_chatgpt_none");
}

#[test]
fn codex_signs_in_with_chatgpt_bwrap() {
    if bwrap_ok("codex_signs_in_with_chatgpt_bwrap") {
        codex_signs_in_with_chatgpt("bwrap", "codex_signs_in_with_chatgpt_bwrap");
    }
}

// ---- Stop ---------------------------------------------------------------------------------------------------

/// The commands of `sleep 317` running in the workspace, as `(pid, "pgid sid cmdline")`.
fn sleepers(ws: &Path) -> Vec<(i32, String)> {
    processes_under(ws)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("sleep 317"))
        .map(|(pid, cmd)| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
            let cmd: String = cmd.chars().take(80).collect();
            (pid, format!("ppid {} pgid {} {cmd}", fields.get(1).unwrap_or(&"?"), fields.get(2).unwrap_or(&"?")))
        })
        .collect()
}

/// Stop while the agent's own shell tool runs `sleep 317`: once the cancel is answered nothing of the command is
/// left, and the agent itself answers the next prompt.
fn stop_ends_the_agents_command(agent: &Real, sandbox: &str, test: &str) {
    let Some(world) = World::new(agent, test) else { return };
    let ws = world.workspace();
    let mut bridge = Bridge::start(world.options(agent, sandbox));
    let sid = bridge.new_session(&ws);
    bridge.permission_answer = Some("allow_once".into());
    let id = bridge.send_prompt(&sid, "SCENARIO:sleep:317 Sleep a while");
    // The bridge is read meanwhile, so that the agent's permission request is answered.
    let deadline = Instant::now() + TURN_LIMIT;
    let sleeping = |ws: &Path| sleepers(ws).iter().any(|(_, cmd)| cmd.ends_with(" sleep 317"));
    while !sleeping(&ws) {
        if Instant::now() > deadline {
            bridge.fail("the agent's command never ran");
        }
        bridge.drain_stdout(Duration::from_millis(100));
    }
    // Still running a moment later: the agent's own tool, not a command that failed at once.
    std::thread::sleep(Duration::from_millis(500));
    assert!(sleeping(&ws), "{:?}", sleepers(&ws));
    bridge.cancel(&sid);
    let result = bridge.wait_response_within(id, TURN_LIMIT).unwrap_or_else(|| bridge.fail("no answer to the cancel"));
    assert_eq!(result.as_ref().ok().map(|r| r["stopReason"].clone()), Some(Value::from("cancelled")), "{result:?}");
    assert!(wait_until(Duration::from_secs(3), || sleepers(&ws).is_empty()), "left running: {:?}", sleepers(&ws));
    let answer = turn(&mut bridge, &sid, "SCENARIO:text Say hello", "text after the stop");
    assert_end_turn(&bridge, &answer);
}

macro_rules! stop_ends {
    ($none:ident, $bwrap:ident, $agent:expr) => {
        #[test]
        fn $none() {
            stop_ends_the_agents_command(&$agent, "none", stringify!($none));
        }

        #[test]
        fn $bwrap() {
            if bwrap_ok(stringify!($bwrap)) {
                stop_ends_the_agents_command(&$agent, "bwrap", stringify!($bwrap));
            }
        }
    };
}

stop_ends!(stop_ends_claudes_command_none, stop_ends_claudes_command_bwrap, CLAUDE);
stop_ends!(stop_ends_codexs_command_none, stop_ends_codexs_command_bwrap, CODEX);
stop_ends!(stop_ends_geminis_command_none, stop_ends_geminis_command_bwrap, GEMINI);

// ---- Codex's command output ------------------------------------------------------------------------------------

/// The texts of a tool call's content in an update (the bridge's cards carry text).
fn card_texts(update: &Value) -> Vec<String> {
    let items = update["content"].as_array().into_iter().flatten();
    items.filter_map(|item| item["content"]["text"].as_str().map(str::to_string)).collect()
}

/// Codex runs the workspace's `hunt.sh` itself and announces it as a terminal of its own (`_meta.terminal_info`, its
/// output in `terminal_output_delta`, its end in `terminal_exit`): the card shows what the command printed, where it
/// used to read "(terminal call_… was released)".
fn codexs_command_shows_its_output(sandbox: &str, test: &str) {
    let Some(world) = World::new(&CODEX, test) else { return };
    let ws = world.workspace();
    std::fs::write(ws.join("hunt.sh"), "echo CARD-OUTPUT-ONE\necho CARD-OUTPUT-TWO\n").unwrap();
    let mut bridge = Bridge::start(world.options(&CODEX, sandbox));
    let sid = bridge.new_session(&ws);
    bridge.permission_answer = Some("allow_once".into());
    let run = turn(&mut bridge, &sid, "SCENARIO:hunt Run the script", "hunt");
    assert_end_turn(&bridge, &run);
    let calls: Vec<&Value> = run.updates.iter().filter(|u| u["toolCallId"].is_string()).collect();
    let released: Vec<String> =
        calls.iter().flat_map(|u| card_texts(u)).filter(|t| t.contains("was released")).collect();
    assert!(released.is_empty(), "{released:?}\n{calls:#?}");
    let shown = calls.iter().find(|u| card_texts(u).iter().any(|t| t.contains("CARD-OUTPUT-ONE")));
    let id = &shown.unwrap_or_else(|| bridge.fail(&format!("no card shows the output: {calls:#?}")))["toolCallId"];
    let last = calls.iter().rev().find(|u| &u["toolCallId"] == id && u.get("content").is_some()).unwrap();
    assert_eq!(card_texts(last), ["```console\nCARD-OUTPUT-ONE\nCARD-OUTPUT-TWO\n```"], "{calls:#?}");
    // Its `_meta` chunks became the card's text: none reaches the editor on its own.
    let chunks = calls.iter().filter(|u| u["_meta"].get("terminal_output_delta").is_some()).count();
    assert_eq!(chunks, 0, "{calls:#?}");
}

#[test]
fn codexs_command_shows_its_output_none() {
    codexs_command_shows_its_output("none", "codexs_command_shows_its_output_none");
}

#[test]
fn codexs_command_shows_its_output_bwrap() {
    if bwrap_ok("codexs_command_shows_its_output_bwrap") {
        codexs_command_shows_its_output("bwrap", "codexs_command_shows_its_output_bwrap");
    }
}
