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
/// home in the data dir (the key stored before is deleted: one login at a time); a session given no key sees
/// placeholders of the login as its `~/.codex/auth.json`, and its model requests reach the model through the
/// gateway with the login's access token and account. The login's access token has expired: the gateway refreshes
/// it at the login server with the refresh token and stores the new tokens. `logout` deletes the login, and the next
/// prompt asks for a login again.
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
                 machine uses it through the bridge's model gateway, which refreshes it: Codex sees placeholders as \
                 its ~/.codex/auth.json. OPENAI_API_KEY set in the agent server's environment wins. `acp-sandbox \
                 logout` deletes it.",
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

    // The access token expired: the gateway refreshes it before the first model request.
    let mut expired = auth.clone();
    let past = serde_json::json!({"exp": 1_000_000_000, "tag": "expired-access"}).to_string();
    let part = |text: &str| base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, text);
    expired["tokens"]["access_token"] = Value::from(format!("{}.{}.sig", part(r#"{"alg":"none"}"#), part(&past)));
    std::fs::write(&login, expired.to_string()).unwrap();
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
        assert_eq!(chat["bearer_jwt"]["tag"], "fake-chatgpt-access-2", "not the refreshed access token: {chat:#}");
        assert_eq!(chat["headers"]["chatgpt-account-id"], "acct-fake-1", "{chat:#}");
        assert_eq!(chat["key_ok"], false, "an API key was sent: {chat:#}");
    }
    let exchanges: Vec<Value> = std::fs::read_to_string(world.root.path().join("fake-login-requests.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|request| request["body"]["grant_type"] == "refresh_token")
        .map(|request| request["body"].clone())
        .collect();
    assert_eq!(
        exchanges,
        [
            serde_json::json!({"grant_type": "refresh_token", "refresh_token": "fake-refresh-1", "client_id": "app_EMoamEEZ73f0CkXaXp7hrann"})
        ],
        "the gateway refreshed the login once, and nothing else tried"
    );
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(&login).unwrap()).unwrap();
    assert_eq!(stored["tokens"]["refresh_token"], "fake-refresh-2", "the new tokens were not stored: {stored:#}");
    // The session's `~/.codex/auth.json` holds placeholders: no token of the login, old or new.
    let shown = std::fs::read_to_string(sandbox_state(&world.data, &sid).join("home/.codex/auth.json")).unwrap();
    for token in ["fake-refresh-1", "fake-refresh-2"]
        .into_iter()
        .map(String::from)
        .chain([&auth, &stored].map(|a| a["tokens"]["access_token"].as_str().unwrap().to_string()))
        .chain([&auth, &stored].map(|a| a["tokens"]["id_token"].as_str().unwrap().to_string()))
    {
        assert!(!shown.contains(&token), "a token of the login is in the session's auth.json: {shown}");
    }
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["tokens"]["account_id"], "acct-fake-1", "{shown:#}");

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

/// Gives the ChatGPT login at `path` tokens no other file has: a nonce in both JWTs' claims (their tags, which the
/// fake model checks, stay) and in the refresh token. Returns the login as written.
fn unique_tokens(path: &Path) -> Value {
    use base64::Engine;
    let b64 = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let nonce = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap().trim().to_string();
    let mut login: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for name in ["access_token", "id_token"] {
        let token = login["tokens"][name].as_str().unwrap().to_string();
        let mut parts: Vec<String> = token.split('.').map(String::from).collect();
        let mut claims: Value = serde_json::from_slice(&b64.decode(&parts[1]).unwrap()).unwrap();
        claims["nonce"] = Value::from(nonce.clone());
        parts[1] = b64.encode(claims.to_string());
        login["tokens"][name] = Value::from(parts.join("."));
    }
    let refresh = format!("{}-{nonce}", login["tokens"]["refresh_token"].as_str().unwrap());
    login["tokens"]["refresh_token"] = Value::from(refresh);
    std::fs::write(path, login.to_string()).unwrap();
    login
}

/// The model gateway with Codex's ChatGPT login: a hostile tool Codex runs hunts for the login's tokens (access,
/// refresh, id) in its environment, every process's environment and command line it sees and the files it can read,
/// and finds none, while the fake model gets the login's access token on every request and the turn works.
fn codex_keeps_the_chatgpt_login_out(sandbox: &str, test: &str) {
    let Some(world) = World::new(&CODEX, test) else { return };
    let ws = world.workspace();
    let login_server = FakeLogin::start(world.root.path());
    let options = world
        .options(&CODEX, sandbox)
        .without_env(CODEX.key_env)
        .env("ACP_SANDBOX_CODEX_ISSUER", &format!("http://127.0.0.1:{}", login_server.port));
    let signed_in = Command::new(bridge_bin())
        .args(["login", "--agent", "codex", "--own", "--data-dir"])
        .arg(&world.data)
        .envs(options.env.iter().map(|(key, value)| (key, value)))
        .env_remove(CODEX.key_env)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(signed_in.status.success(), "login --own: {}", String::from_utf8_lossy(&signed_in.stderr));
    // Tokens of this run alone: the fake login server issues the same ones to every test, and this file's text names
    // them, so a hunt under bubblewrap (which shows `/`) would find another test's data dir or this source.
    let login = unique_tokens(&world.data.join("logins/codex/auth.json"));
    let tokens: Vec<String> = ["access_token", "refresh_token", "id_token"]
        .map(|name| login["tokens"][name].as_str().unwrap().to_string())
        .to_vec();
    let needles: Vec<String> = tokens.iter().map(|t| t.bytes().map(|b| format!("{b:02x}")).collect()).collect();
    std::fs::copy(fakes_dir().join("hunt_key.py"), ws.join("hunt_key.py")).unwrap();
    let mode = if sandbox == "none" { "tree" } else { "all" };
    let leak = format!("http://127.0.0.1:{}/leak", world.fake.port);
    let script = format!("exec python3 hunt_key.py {} {mode} {leak} CODEX_HOME > hunt.txt 2>&1\n", needles.join(","));
    std::fs::write(ws.join("hunt.sh"), script).unwrap();
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);
    bridge.permission_answer = Some("allow_once".into());
    let hunt = turn(&mut bridge, &sid, "SCENARIO:hunt Run the hunt", "hunt");
    assert_end_turn(&bridge, &hunt);
    let report =
        std::fs::read_to_string(ws.join("hunt.txt")).unwrap_or_else(|e| bridge.fail(&format!("no hunt.txt: {e}")));
    // The login has no variable of its own: only what was found counts.
    let lines: Vec<&str> =
        report.lines().filter(|line| !line.starts_with("LEAK") && !line.starts_with("PLACEHOLDER")).collect();
    assert_eq!(lines, ["FOUND 0"], "{report}");
    let chats = world.fake.chats("hunt");
    assert!(chats.len() >= 2, "the fake saw both steps: {chats:#?}");
    for chat in &chats {
        assert_eq!(chat["bearer_jwt"]["tag"], "fake-chatgpt-access-1", "not the login's access token: {chat:#}");
        assert_eq!(chat["headers"]["chatgpt-account-id"], "acct-fake-1", "{chat:#}");
    }
    bridge.close_stdin();
    bridge.wait_exit(Duration::from_secs(20));
    for token in &tokens {
        assert!(!bridge.stderr().contains(token.as_str()), "a token of the login is in the bridge's log");
    }
}

#[test]
fn codex_keeps_the_chatgpt_login_out_none() {
    codex_keeps_the_chatgpt_login_out("none", "codex_keeps_the_chatgpt_login_out_none");
}

#[test]
fn codex_keeps_the_chatgpt_login_out_bwrap() {
    if bwrap_ok("codex_keeps_the_chatgpt_login_out_bwrap") {
        codex_keeps_the_chatgpt_login_out("bwrap", "codex_keeps_the_chatgpt_login_out_bwrap");
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
    // The stopped command's card ends `failed`, as every agent's does (Gemini CLI calls it completed).
    let updates = bridge.take_updates(&sid);
    let ends = tool_ends(&updates);
    if ends.is_empty() || ends.iter().any(|(_, end)| end != "failed") {
        bridge.fail(&format!("a stopped tool did not end failed: {ends:?}\n{updates:#?}"));
    }
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

// ---- What each agent offers, from the first thread (issues 43 point 1, 44) ---------------------------------------

/// A 1×1 PNG, sent as the editor sends an image.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
/// A WAV of eight samples, sent as the editor sends audio.
const WAV: &str = "UklGRjQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YRAAAAAAAOgDGPz0AQz+AAD6AAb/";

/// The agent's own `initialize` answer, the adapter launched directly as an editor launches it (no bridge).
fn own_initialize(world: &World, agent: &Real) -> Value {
    let home = world.root.path().join("own-home");
    std::fs::create_dir_all(&home).unwrap();
    let mut child = Command::new(&world.launcher)
        .args(if agent.id == "gemini" { &["--acp"][..] } else { &[][..] })
        .current_dir(world.workspace())
        .env("HOME", &home)
        .env(agent.key_env, KEY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the adapter");
    let request = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false}}});
    use std::io::Write;
    writeln!(child.stdin.as_mut().unwrap(), "{request}").unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let answer = loop {
        let line = lines.next().expect("the adapter answers initialize").unwrap();
        let Ok(message) = serde_json::from_str::<Value>(&line) else { continue };
        if message["id"] == 1 {
            break message["result"].clone();
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    answer
}

/// What a `promptCapabilities` says (image, audio, embedded context; left out is false).
fn takes(capabilities: &Value) -> [bool; 3] {
    ["image", "audio", "embeddedContext"].map(|key| capabilities["promptCapabilities"][key] == true)
}

/// The session capabilities of an agent's own the bridge does not advertise (the README says why): Codex's `title`
/// and `subagents`, which the ACP schema the bridge speaks does not have.
fn not_kept(key: &str) -> bool {
    key == "title" || key == "subagents"
}

/// A fresh bridge (a data dir that never ran the agent) advertises the agent's own capabilities and offers its modes
/// in the first `session/new`; a mode chosen before the first prompt is in effect for it; an image (and audio where
/// the agent takes it) reaches the model byte for byte with no note; a bridge started again offers what the agent
/// announced, its models too.
fn offers_from_the_first_thread(agent: &Real, sandbox: &str, test: &str) {
    let Some(world) = World::new(agent, test) else { return };
    let ws = world.workspace();
    let own = own_initialize(&world, agent)["agentCapabilities"].clone();
    let mut bridge = Bridge::spawn(world.options(agent, sandbox));
    let advertised = bridge.initialize()["agentCapabilities"].clone();
    assert_eq!(takes(&advertised), takes(&own), "{advertised:#}\nown: {own:#}");
    for (key, value) in own["sessionCapabilities"].as_object().into_iter().flatten() {
        if !not_kept(key) {
            assert_eq!(&advertised["sessionCapabilities"][key], value, "sessionCapabilities.{key}: {advertised:#}");
        }
    }

    let made = bridge
        .request("session/new", serde_json::json!({"cwd": ws, "mcpServers": []}))
        .unwrap_or_else(|e| bridge.fail(&format!("session/new: {e:?}")));
    let sid = made["sessionId"].as_str().unwrap().to_string();
    let modes: Vec<&str> =
        made["modes"]["availableModes"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str()).collect();
    assert!(modes.contains(&agent.other_mode), "the first session/new offers no mode {}: {made:#}", agent.other_mode);
    let mode_option = made["configOptions"].as_array().into_iter().flatten().find(|o| o["category"] == "mode");
    assert!(mode_option.is_some_and(|o| o["currentValue"] != agent.other_mode), "{made:#}");
    bridge
        .request("session/set_mode", serde_json::json!({"sessionId": sid, "modeId": agent.other_mode}))
        .unwrap_or_else(|e| bridge.fail(&format!("set_mode before the first prompt: {e:?}")));

    let mut blocks = vec![
        serde_json::json!({"type": "text", "text": "SCENARIO:text Say hello"}),
        serde_json::json!({"type": "image", "data": PNG, "mimeType": "image/png"}),
    ];
    let audio = own["promptCapabilities"]["audio"] == true;
    if audio {
        blocks.push(serde_json::json!({"type": "audio", "data": WAV, "mimeType": "audio/wav"}));
    }
    let id = bridge.send_prompt_blocks(&sid, blocks);
    let result = bridge.wait_response_within(id, TURN_LIMIT).unwrap_or_else(|| bridge.fail("no answer to the prompt"));
    let answer = Turn { result, updates: bridge.take_updates(&sid) };
    assert_end_turn(&bridge, &answer);
    let notes: Vec<&str> = answer
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .filter(|text| text.contains("left out") || text.contains("did not take"))
        .collect();
    assert!(notes.is_empty(), "{notes:?}");
    let chats = world.fake.chats("text");
    let sent = serde_json::to_string(&chats.first().unwrap_or_else(|| bridge.fail("the model saw no prompt"))["body"])
        .unwrap();
    assert!(sent.contains(PNG), "the image did not reach the model as it was: {sent}");
    assert!(!audio || sent.contains(WAV), "the audio did not reach the model as it was: {sent}");
    // The mode chosen before the agent ran is the one it runs in: what it answered when the bridge gave it.
    let options = answer.updates.iter().rev().find(|u| u["sessionUpdate"] == "config_option_update");
    let options = options.unwrap_or_else(|| bridge.fail("no config_option_update"))["configOptions"].clone();
    let mode = options.as_array().into_iter().flatten().find(|o| o["category"] == "mode").cloned();
    assert_eq!(mode.unwrap_or_default()["currentValue"], agent.other_mode, "{options:#}");
    if agent.id == "codex" {
        // Codex names the thread itself (its model's name for it, asked once the turn ended): the editor is told, and
        // the session list says it.
        let codex_title = "Fake session title";
        bridge.wait_update(&sid, "Codex's title", |u| {
            u["sessionUpdate"] == "session_info_update" && u["title"] == codex_title
        });
        let listed = bridge.request("session/list", serde_json::json!({})).unwrap();
        assert_eq!(listed["sessions"][0]["title"], codex_title, "{listed:#}");
    }
    bridge.close_stdin();
    bridge.wait_exit(Duration::from_secs(20));

    // A new bridge on the same data dir offers what the agent announced, before it starts: its models too.
    let mut again = Bridge::spawn(world.options(agent, sandbox));
    let advertised = again.initialize()["agentCapabilities"].clone();
    assert_eq!(takes(&advertised), takes(&own), "{advertised:#}");
    let made = again
        .request("session/new", serde_json::json!({"cwd": ws, "mcpServers": []}))
        .unwrap_or_else(|e| again.fail(&format!("session/new: {e:?}")));
    let categories: Vec<&str> =
        made["configOptions"].as_array().into_iter().flatten().filter_map(|o| o["category"].as_str()).collect();
    assert!(categories.contains(&"mode") && categories.contains(&"model"), "{made:#}");
    // The first thread's image (and audio) was kept with its turn: a load replays it as the editor sent it.
    again
        .request("session/load", serde_json::json!({"sessionId": sid, "cwd": ws, "mcpServers": []}))
        .unwrap_or_else(|e| again.fail(&format!("session/load: {e:?}")));
    let replayed = again.take_updates(&sid);
    let sent_back = |kind: &str, data: &str| {
        replayed.iter().any(|u| {
            u["sessionUpdate"] == "user_message_chunk" && u["content"]["type"] == kind && u["content"]["data"] == data
        })
    };
    assert!(sent_back("image", PNG), "{replayed:#?}");
    assert!(!audio || sent_back("audio", WAV), "{replayed:#?}");
    again.close_stdin();
    again.wait_exit(Duration::from_secs(20));
}

macro_rules! offers {
    ($none:ident, $bwrap:ident, $agent:expr) => {
        #[test]
        fn $none() {
            offers_from_the_first_thread(&$agent, "none", stringify!($none));
        }

        #[test]
        fn $bwrap() {
            if bwrap_ok(stringify!($bwrap)) {
                offers_from_the_first_thread(&$agent, "bwrap", stringify!($bwrap));
            }
        }
    };
}

offers!(claude_offers_from_the_first_thread_none, claude_offers_from_the_first_thread_bwrap, CLAUDE);
offers!(codex_offers_from_the_first_thread_none, codex_offers_from_the_first_thread_bwrap, CODEX);
offers!(gemini_offers_from_the_first_thread_none, gemini_offers_from_the_first_thread_bwrap, GEMINI);

/// Claude Code's system prompt `override` mode, which its adapter offers: a session made with one gets it instead
/// of Claude Code's own, and the model sees it.
fn claude_replaces_its_system_prompt(sandbox: &str, test: &str) {
    let Some(world) = World::new(&CLAUDE, test) else { return };
    let ws = world.workspace();
    let mut bridge = Bridge::start(world.options(&CLAUDE, sandbox));
    let ours = "You are OVERRIDE-PROMPT-7c1. Answer tersely.";
    let made = bridge
        .request(
            "session/new",
            serde_json::json!({"cwd": ws, "mcpServers": [],
                "systemPrompt": {"mode": "override", "content": [{"type": "text", "text": ours}]}}),
        )
        .unwrap_or_else(|e| bridge.fail(&format!("session/new with an override prompt: {e:?}")));
    let sid = made["sessionId"].as_str().unwrap().to_string();
    let answer = turn(&mut bridge, &sid, "SCENARIO:text Say hello", "text");
    assert_end_turn(&bridge, &answer);
    let chats = world.fake.chats("text");
    let system =
        serde_json::to_string(&chats.first().unwrap_or_else(|| bridge.fail("no chat"))["body"]["system"]).unwrap();
    assert!(system.contains(ours), "{system}");
    assert!(!system.contains("Claude Code"), "Claude Code's own prompt stayed: {system}");
    // In `append` mode its own prompt stays, ours after it.
    let made = bridge
        .request(
            "session/new",
            serde_json::json!({"cwd": ws, "mcpServers": [],
                "systemPrompt": {"mode": "append", "content": [{"type": "text", "text": ours}]}}),
        )
        .unwrap_or_else(|e| bridge.fail(&format!("session/new with an append prompt: {e:?}")));
    let sid = made["sessionId"].as_str().unwrap().to_string();
    let answer = turn(&mut bridge, &sid, "SCENARIO:text Say hello", "text");
    assert_end_turn(&bridge, &answer);
    let chats = world.fake.chats("text");
    let system = serde_json::to_string(&chats.last().unwrap()["body"]["system"]).unwrap();
    assert!(system.contains(ours) && system.contains("Claude Code"), "{system}");
}

#[test]
fn claude_replaces_its_system_prompt_none() {
    claude_replaces_its_system_prompt("none", "claude_replaces_its_system_prompt_none");
}

#[test]
fn claude_replaces_its_system_prompt_bwrap() {
    if bwrap_ok("claude_replaces_its_system_prompt_bwrap") {
        claude_replaces_its_system_prompt("bwrap", "claude_replaces_its_system_prompt_bwrap");
    }
}

/// Before its first prompt installs it, an agent's pinned version says what it takes: its folder's table.
#[test]
fn an_agent_not_installed_yet_advertises_what_its_pinned_version_takes() {
    let root = tempfile::Builder::new().prefix("not-installed-").tempdir_in(world_parent()).unwrap();
    for (id, audio) in [("claude", false), ("codex", false), ("gemini", true)] {
        let data = root.path().join(id);
        std::fs::create_dir_all(&data).unwrap();
        let mut bridge = Bridge::spawn(BridgeOptions::new(id, &data).env("HOME", &data.display().to_string()));
        let init = bridge.initialize();
        assert_eq!(takes(&init["agentCapabilities"]), [true, audio, true], "{id}: {init:#}");
        let replaces = &init["agentCapabilities"]["sessionCapabilities"]["systemPrompt"]["mode"]["override"];
        assert_eq!(replaces.is_object(), id == "claude", "{id}: {init:#}");
        bridge.close_stdin();
        bridge.wait_exit(Duration::from_secs(20));
    }
}

// ---- what the editor is shown is true (issue 43) -------------------------------------------------------------

/// How each tool card of `updates` ends: its id and the last status it was given.
fn tool_ends(updates: &[Value]) -> Vec<(String, String)> {
    let mut ends: Vec<(String, String)> = Vec::new();
    let tools =
        updates.iter().filter(|u| matches!(u["sessionUpdate"].as_str(), Some("tool_call" | "tool_call_update")));
    for update in tools {
        let id = update["toolCallId"].as_str().unwrap_or_default().to_string();
        let status = update["status"].as_str().map(str::to_string);
        match ends.iter_mut().find(|(seen, _)| *seen == id) {
            Some((_, end)) => {
                if let Some(status) = status {
                    *end = status;
                }
            }
            None => ends.push((id, status.unwrap_or_else(|| "pending".into()))),
        }
    }
    ends
}

/// Whether `body` (a model request) holds `text` in something the model said (an assistant's or model's turn):
/// the agent sent its own earlier conversation, not a transcript of it in the user's prompt.
fn said_before(body: &Value, text: &str) -> bool {
    match body {
        Value::Object(fields) => {
            let speaker = matches!(fields.get("role").and_then(Value::as_str), Some("assistant" | "model"));
            (speaker && body.to_string().contains(text)) || fields.values().any(|value| said_before(value, text))
        }
        Value::Array(items) => items.iter().any(|item| said_before(item, text)),
        _ => false,
    }
}

/// The bridge exits (its editor went away) and another starts 0.1 s later: the agent's own conversation goes on
/// (the model sees the earlier answer as the model's), the editor's replay is the store's, once, and nothing the
/// agent replays while it loads its session reaches the next answer.
fn a_restart_at_once_continues_the_agents_conversation(agent: &Real, sandbox: &str, test: &str) {
    let Some(world) = World::new(agent, test) else { return };
    let ws = world.workspace();
    let mut bridge = Bridge::start(world.options(agent, sandbox));
    let sid = bridge.new_session(&ws);
    let first = turn(&mut bridge, &sid, "SCENARIO:text Remember PELICAN-42", "before the restart");
    assert_end_turn(&bridge, &first);
    // A tool call in the history too: what the agent replays of it must not reach the next answer either.
    bridge.permission_answer = Some("allow_once".into());
    let write = turn(&mut bridge, &sid, "SCENARIO:write Create hello.txt", "write before the restart");
    assert_end_turn(&bridge, &write);
    bridge.close_stdin();
    assert!(bridge.wait_exit(Duration::from_secs(20)).is_some(), "the bridge did not exit");
    let first_log = bridge.stderr();
    std::thread::sleep(Duration::from_millis(100));

    let mut bridge = Bridge::start(world.options(agent, sandbox));
    let loaded = bridge.load_session(&sid, &ws);
    assert!(loaded.result.is_ok(), "{:?}", loaded.result);
    let prompts: Vec<&Value> = loaded.updates.iter().filter(|u| u["sessionUpdate"] == "user_message_chunk").collect();
    let prompts: Vec<&Value> = prompts.iter().map(|u| &u["content"]["text"]).collect();
    assert_eq!(
        prompts,
        ["SCENARIO:text Remember PELICAN-42", "SCENARIO:write Create hello.txt"],
        "the store's replay, once: {:#?}",
        loaded.updates
    );
    let answer = turn(&mut bridge, &sid, "SCENARIO:text Say it again", "after the restart");
    assert_end_turn(&bridge, &answer);
    let kinds: Vec<&str> = answer.updates.iter().filter_map(|u| u["sessionUpdate"].as_str()).collect();
    assert!(
        !kinds.iter().any(|kind| matches!(*kind, "user_message_chunk" | "tool_call" | "tool_call_update")),
        "replayed into the answer: {:#?}",
        answer.updates
    );
    assert_eq!(
        chunks(&answer.updates).concat(),
        format!("Hello from the fake {} model. It streams in pieces. TEXT-ANSWER-OK", agent.model_name),
        "{:#?}",
        answer.updates
    );
    let said = answer.updates.iter().filter_map(|u| u["content"]["text"].as_str()).collect::<String>();
    assert!(!said.contains("no longer exists"), "{said}\n{}", bridge.stderr());
    let chats = world.fake.chats("text");
    let last = chats.last().unwrap_or_else(|| panic!("no model request"));
    assert!(
        said_before(&last["body"], "TEXT-ANSWER-OK"),
        "the model did not get the earlier answer as its own:\n{:#}\nfirst bridge:\n{first_log}\nsecond bridge:\n{}",
        last["body"],
        bridge.stderr()
    );
}

macro_rules! restart_at_once {
    ($bwrap:ident, $agent:expr) => {
        #[test]
        fn $bwrap() {
            if bwrap_ok(stringify!($bwrap)) {
                a_restart_at_once_continues_the_agents_conversation(&$agent, "bwrap", stringify!($bwrap));
            }
        }
    };
}

restart_at_once!(a_restart_at_once_continues_claudes_conversation_bwrap, CLAUDE);
restart_at_once!(a_restart_at_once_continues_codexs_conversation_bwrap, CODEX);
restart_at_once!(a_restart_at_once_continues_geminis_conversation_bwrap, GEMINI);

/// Under `--sandbox none` the first turn says that the agent runs without a sandbox, also when the agent started
/// ahead of it (at `session/new`, which made the session's sandbox), and the next turn does not say it again.
#[test]
fn the_unsandboxed_note_is_in_claudes_first_turn_none() {
    let test = "the_unsandboxed_note_is_in_claudes_first_turn_none";
    let Some(world) = World::new(&CLAUDE, test) else { return };
    let ws = world.workspace();
    let mut bridge = Bridge::start(world.options(&CLAUDE, "none"));
    let sid = bridge.new_session(&ws);
    let started = wait_until(TURN_LIMIT, || !processes_under(&ws).is_empty());
    assert!(started, "Claude Code did not start ahead of the first prompt");
    let note = "_Claude Code runs WITHOUT a sandbox here (--sandbox none was given): it can read and write everything \
                you can._";
    for (label, said) in [("first", vec![note]), ("second", vec![])] {
        let answer = turn(&mut bridge, &sid, "SCENARIO:text Say hello", label);
        assert_end_turn(&bridge, &answer);
        let notes: Vec<&str> = answer
            .updates
            .iter()
            .filter_map(|u| u["content"]["text"].as_str())
            .map(str::trim)
            .filter(|text| text.contains("WITHOUT a sandbox"))
            .collect();
        assert_eq!(notes, said, "{label} turn: {:#?}", answer.updates);
    }
}

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
