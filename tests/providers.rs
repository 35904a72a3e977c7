//! One suite for every place a session's sandbox can be: this machine (`--sandbox none` or bubblewrap, as
//! `ACP_SANDBOX_E2E_SANDBOX` says), E2B and Daytona (their fakes, `tests/fakes/fake_e2b.py` and `fake_daytona.py`,
//! which run commands on this machine). Each scenario is written once against [`Case`] and instantiated per
//! provider by `suite!`; what only one provider has (its API's requests, where its key may go) is its case's own
//! check, and its own file (`tests/e2b.rs`, `tests/daytona.rs`) tests the rest of it.
//!
//! The CLI is the fake OpenCode (`opencode run`), which records every run in `.fake-cli/` of its workspace.

#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/fake_daytona.rs"]
mod fake_daytona;
#[path = "support/fake_e2b.rs"]
mod fake_e2b;
mod support;

use std::path::PathBuf;

use acp_sandbox::sandbox::SandboxProvider;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{Bridge, BridgeOptions, Invocation, TestDirs, invocations, wait_until};

/// A provider, as the suite sees it.
trait Case: Sized {
    /// The host pid of a run of the fake CLI (a remote fake runs its commands on this machine; a local sandbox's
    /// CLI says its pid in its own PID namespace).
    fn cli_pid(&self, run: &Invocation) -> i32 {
        run.0["pid"].as_i64().unwrap() as i32
    }

    /// Starts what the provider needs (its fake) for the test `name`.
    fn start(name: &str) -> Self;

    /// The bridge's options for this provider.
    fn options(&self) -> BridgeOptions;

    /// The editor's workspace.
    fn workspace(&self) -> PathBuf;

    /// Whether the sandbox is elsewhere (its workspace a copy of the editor's).
    fn remote(&self) -> bool;

    /// What a session's first answer begins with here (under `--sandbox none`, that there is no sandbox).
    fn first_words(&self) -> &'static str {
        ""
    }

    /// The ids of the sandboxes there are now, sorted.
    fn sandboxes(&self) -> Vec<String>;

    /// The session a sandbox is tagged with.
    fn session_of(&self, id: &str) -> Option<String>;

    /// Where, on this machine, the CLI of sandbox `id` works (and records its runs).
    fn runs_in(&self, id: &str) -> PathBuf;

    /// The CLI's working directory and its HOME's parent (the sandbox's state dir), as the CLI sees them.
    fn seen_by_the_cli(&self, id: &str) -> (PathBuf, PathBuf);

    /// Pauses the sandbox the way the provider does between bridges.
    fn suspend(&self, id: &str);

    /// The sandbox goes away behind the bridge's back.
    fn destroy(&self, id: &str);

    /// The provider's own checks once the bridge ran turns (where its key may be).
    fn after_turns(&self, _bridge: &Bridge) {}

    /// The provider's own checks after a cancelled turn in sandbox `id`.
    fn after_cancel(&self, _id: &str) {}

    /// The provider's own checks once the session of sandbox `id` was deleted.
    fn after_delete(&self, _id: &str) {}
}

/// Blocks on one call of a provider.
fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Runtime::new().unwrap().block_on(future)
}

struct Local {
    dirs: TestDirs,
}

impl Case for Local {
    fn cli_pid(&self, run: &Invocation) -> i32 {
        run.pid()
    }

    fn start(name: &str) -> Self {
        Local { dirs: TestDirs::new(&format!("providers-local-{name}")) }
    }

    fn options(&self) -> BridgeOptions {
        BridgeOptions::new("opencode", &self.dirs.data)
    }

    fn workspace(&self) -> PathBuf {
        self.dirs.workspace("ws")
    }

    fn remote(&self) -> bool {
        false
    }

    fn first_words(&self) -> &'static str {
        match std::env::var("ACP_SANDBOX_E2E_SANDBOX").as_deref() {
            Ok("bwrap") => "",
            _ => {
                "\n\n_OpenCode runs WITHOUT a sandbox here (--sandbox none was given): it can read and write everything \
                 you can._\n\n"
            }
        }
    }

    fn sandboxes(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.dirs.data.join("sessions")) else { return Vec::new() };
        let mut ids: Vec<String> = entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            // The bridge's own sandboxes (`_models`) are not sessions'.
            .filter(|name| !name.starts_with('_'))
            .collect();
        ids.sort();
        ids
    }

    fn session_of(&self, id: &str) -> Option<String> {
        // A local sandbox is named after its session.
        id.starts_with("sess_").then(|| id.to_string())
    }

    fn runs_in(&self, _id: &str) -> PathBuf {
        // The workspace itself, bound into the sandbox.
        self.workspace()
    }

    fn seen_by_the_cli(&self, id: &str) -> (PathBuf, PathBuf) {
        (self.workspace(), self.dirs.data.join("sessions").join(id))
    }

    fn suspend(&self, _id: &str) {}

    fn destroy(&self, id: &str) {
        std::fs::remove_dir_all(self.dirs.data.join("sessions").join(id)).unwrap();
    }
}

struct E2b {
    fake: fake_e2b::FakeE2b,
    dirs: TestDirs,
}

impl Case for E2b {
    fn start(name: &str) -> Self {
        E2b { fake: fake_e2b::FakeE2b::start(), dirs: TestDirs::new(&format!("providers-e2b-{name}")) }
    }

    fn options(&self) -> BridgeOptions {
        BridgeOptions::new("opencode", &self.dirs.data)
            .sandbox("e2b")
            .env("E2B_API_KEY", fake_e2b::KEY)
            .env("E2B_API_URL", &self.fake.api_url())
            .env("E2B_SANDBOX_URL", &self.fake.sandbox_url())
    }

    fn workspace(&self) -> PathBuf {
        self.dirs.remote_workspace("ws")
    }

    fn remote(&self) -> bool {
        true
    }

    fn sandboxes(&self) -> Vec<String> {
        self.fake.state().as_object().unwrap().keys().cloned().collect()
    }

    fn session_of(&self, id: &str) -> Option<String> {
        let state = self.fake.state();
        let metadata = state[id]["metadata"].as_object()?;
        assert_eq!(metadata.len(), 1, "{metadata:?}");
        metadata["acp_session"].as_str().map(str::to_string)
    }

    fn runs_in(&self, id: &str) -> PathBuf {
        self.fake.host_path(id, acp_sandbox::sandbox::remote::e2b::WORKSPACE)
    }

    fn seen_by_the_cli(&self, _id: &str) -> (PathBuf, PathBuf) {
        use acp_sandbox::sandbox::remote::e2b::{STATE_DIR, WORKSPACE};
        (PathBuf::from(WORKSPACE), PathBuf::from(STATE_DIR))
    }

    fn suspend(&self, id: &str) {
        block_on(self.fake.provider().suspend(id)).unwrap();
    }

    fn destroy(&self, id: &str) {
        block_on(self.fake.provider().destroy(id)).unwrap();
    }

    fn after_turns(&self, bridge: &Bridge) {
        // The key went only to the control plane: never to envd, the store or the bridge's log.
        for record in self.fake.records().iter().filter(|r| r["port"] == "envd") {
            assert!(!record.to_string().contains(fake_e2b::KEY), "the key went to envd: {record}");
        }
        for id in self.sandboxes() {
            for run in invocations(&self.runs_in(&id)) {
                // (E2B's own `E2B_SANDBOX` and `E2B_SANDBOX_ID` are the sandbox's, as in every E2B sandbox.)
                assert_eq!(run.env("E2B_API_KEY"), None, "{:?}", run.env_keys());
            }
        }
        assert_key_stays(&self.dirs, bridge, fake_e2b::KEY);
    }

    fn after_cancel(&self, id: &str) {
        assert_eq!(self.fake.state()[id]["processes"], json!([]));
        let kills = self.fake.records().iter().filter(|r| r["path"] == "/process.Process/SendSignal").count();
        assert_eq!(kills, 1);
    }
}

struct Daytona {
    fake: fake_daytona::FakeDaytona,
    dirs: TestDirs,
}

impl Case for Daytona {
    fn start(name: &str) -> Self {
        let dir = fake_daytona::test_dir(&format!("providers-{name}"));
        Daytona {
            fake: fake_daytona::FakeDaytona::start(&dir),
            dirs: TestDirs::new(&format!("providers-daytona-{name}")),
        }
    }

    fn options(&self) -> BridgeOptions {
        BridgeOptions::new("opencode", &self.dirs.data)
            .sandbox("daytona")
            .env("DAYTONA_API_KEY", fake_daytona::KEY)
            .env("DAYTONA_API_URL", &self.fake.api_url())
    }

    fn workspace(&self) -> PathBuf {
        self.dirs.remote_workspace("ws")
    }

    fn remote(&self) -> bool {
        true
    }

    fn sandboxes(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.fake.root) else { return Vec::new() };
        let mut ids: Vec<String> = entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        ids.sort();
        ids
    }

    fn session_of(&self, id: &str) -> Option<String> {
        let info = self.info(id);
        assert_eq!(info["env"], json!({}), "nothing of the session is in the sandbox's own environment");
        let labels = info["labels"].as_object()?;
        assert_eq!(labels.len(), 1, "{labels:?}");
        labels["acp-sandbox.session"].as_str().map(str::to_string)
    }

    fn runs_in(&self, id: &str) -> PathBuf {
        self.fake.root.join(id).join("home/workspace")
    }

    fn seen_by_the_cli(&self, id: &str) -> (PathBuf, PathBuf) {
        // The fake runs commands on this machine, in the sandbox's directory.
        (self.runs_in(id), self.fake.root.join(id).join("home/.acp-sandbox"))
    }

    fn suspend(&self, id: &str) {
        block_on(self.fake.provider(fake_daytona::KEY).suspend(id)).unwrap();
        assert_eq!(self.info(id)["state"], "stopped");
    }

    fn destroy(&self, id: &str) {
        block_on(self.fake.provider(fake_daytona::KEY).destroy(id)).unwrap();
    }

    fn after_turns(&self, bridge: &Bridge) {
        // The key is in the Authorization header of the fake's requests and nowhere else of them.
        let requests = self.fake.requests();
        assert!(!requests.is_empty());
        for request in &requests {
            assert_eq!(request["auth"], json!(format!("Bearer {}", fake_daytona::KEY)), "{request}");
            let mut rest = request.clone();
            rest.as_object_mut().unwrap().remove("auth");
            assert!(!rest.to_string().contains(fake_daytona::KEY), "the key is in a request: {request}");
        }
        assert_key_stays(&self.dirs, bridge, fake_daytona::KEY);
        for id in self.sandboxes() {
            for run in invocations(&self.runs_in(&id)) {
                assert_eq!(
                    run.env_keys().iter().filter(|k| k.starts_with("DAYTONA_")).count(),
                    0,
                    "{:?}",
                    run.env_keys()
                );
                // Daytona's shell starts in the sandbox's home: the CLI is told its directory.
                assert_eq!(run.env("PWD"), Some(self.runs_in(&id).display().to_string()));
            }
            let mut stack = vec![self.fake.root.join(&id)];
            while let Some(path) = stack.pop() {
                if path.is_dir() {
                    stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                } else if let Ok(bytes) = std::fs::read(&path) {
                    assert!(
                        !String::from_utf8_lossy(&bytes).contains(fake_daytona::KEY),
                        "the key is in {}",
                        path.display()
                    );
                }
            }
        }
    }

    fn after_delete(&self, id: &str) {
        let path = json!(format!("/api/sandbox/{id}"));
        let deletes = self.fake.requests().into_iter().filter(|r| r["method"] == "DELETE" && r["path"] == path).count();
        assert_eq!(deletes, 1);
    }

    fn after_cancel(&self, _id: &str) {
        let requests = self.fake.requests();
        let terminates = requests.iter().filter(|r| r["path"].as_str().unwrap().ends_with("/terminate")).count();
        assert_eq!(terminates, 1);
    }
}

impl Daytona {
    /// What the control plane says about a sandbox.
    fn info(&self, id: &str) -> Value {
        block_on(async {
            let response = reqwest::Client::new()
                .get(format!("{}/sandbox/{id}", self.fake.api_url()))
                .bearer_auth(fake_daytona::KEY)
                .send()
                .await
                .unwrap();
            response.json().await.unwrap()
        })
    }
}

/// The provider's key is in none of the bridge's files, its stderr, or the CLI's runs.
fn assert_key_stays(dirs: &TestDirs, bridge: &Bridge, key: &str) {
    let files: Vec<PathBuf> = std::fs::read_dir(&dirs.data).unwrap().map(|e| e.unwrap().path()).collect();
    let ours = |path: &&PathBuf| {
        let name = path.file_name().unwrap().to_string_lossy();
        name.starts_with("acp-sandbox.log") || name == "acp-sandbox.sqlite3"
    };
    let checked: Vec<&PathBuf> = files.iter().filter(ours).collect();
    assert!(checked.len() >= 2, "no store or log in {files:?}");
    for file in checked {
        let bytes = std::fs::read(file).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains(key), "the key is in {}", file.display());
    }
    assert!(!bridge.stderr().contains(key), "the key is in the bridge's stderr");
}

/// The one sandbox there is.
fn only_sandbox(case: &impl Case) -> String {
    let ids = case.sandboxes();
    assert_eq!(ids.len(), 1, "{ids:?}");
    ids[0].clone()
}

/// The runs of the fake CLI in sandbox `id`, checked to have been made where the sandbox keeps its workspace.
fn runs(case: &impl Case, id: &str) -> Vec<Invocation> {
    let runs = invocations(&case.runs_in(id));
    let (cwd, state) = case.seen_by_the_cli(id);
    for run in &runs {
        assert_eq!(run.cwd(), cwd);
        let home = PathBuf::from(run.env("HOME").expect("HOME"));
        assert!(
            home.starts_with(&state),
            "HOME {} is not in the sandbox's state dir {}",
            home.display(),
            state.display()
        );
    }
    runs
}

fn runs_in_its_own_sandbox_that_goes_with_the_session<C: Case>() {
    let case = C::start("own");
    let ws = case.workspace();
    let mut bridge = Bridge::start(case.options());
    let sid = bridge.new_session(&ws);
    assert_eq!(case.sandboxes(), Vec::<String>::new(), "the sandbox is made by the first prompt, not before");
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(
        turn.agent_text(),
        format!("{}Hello from the fake model. This is a plain text answer.", case.first_words())
    );

    let id = only_sandbox(&case);
    assert_eq!(case.session_of(&id), Some(sid.clone()));
    let first = runs(&case, &id);
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].argv()[0].as_str(), first[0].stdin_text().as_str()), ("run", "Say hello"));
    if case.remote() {
        assert!(invocations(&ws).is_empty(), "the CLI ran in the editor's workspace");
    }

    // A follow-up runs in the same sandbox and continues the CLI's conversation.
    let turn = bridge.prompt(&sid, "SCENARIO:followup and now?");
    assert_eq!(turn.agent_text(), "Yes, I remember: this is turn two of the same session.");
    assert_eq!(only_sandbox(&case), id);
    let both = runs(&case, &id);
    assert_eq!(both.len(), 2);
    assert_eq!(both[1].flag_value("--session"), Some(both[0].cli_session()));
    case.after_turns(&bridge);

    bridge.request("session/delete", json!({"sessionId": sid})).unwrap();
    assert_eq!(case.sandboxes(), Vec::<String>::new(), "the sandbox goes with its session");
    case.after_delete(&id);
}

fn a_cancel_ends_the_cli_there_and_the_session_goes_on<C: Case>() {
    let case = C::start("cancel");
    let ws = case.workspace();
    let mut bridge = Bridge::start(case.options());
    let sid = bridge.new_session(&ws);
    let prompt = bridge.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=100000 FAKE_DELAY_MS=20 keep talking");
    // Output arrives while the CLI still runs (it would take half an hour to finish).
    bridge.wait_update(&sid, "a streamed chunk", |u| u["sessionUpdate"] == "agent_message_chunk");
    // (The first chunk may be the note that there is no sandbox, said before the sandbox is made.)
    assert!(wait_until(support::RECV_TIMEOUT, || !case.sandboxes().is_empty()), "no sandbox was made");
    let id = only_sandbox(&case);
    let cli = case.cli_pid(&support::wait_invocations(&case.runs_in(&id), 1)[0]);
    assert!(support::pid_alive(cli), "the CLI {cli} does not run");

    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, prompt).stop_reason(), "cancelled");
    assert!(wait_until(support::RECV_TIMEOUT, || !support::pid_alive(cli)), "the CLI {cli} still runs");
    case.after_cancel(&id);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert_eq!(only_sandbox(&case), id);
}

fn made_again_from_the_transcript<C: Case>() {
    let case = C::start("again");
    let ws = case.workspace();
    let mut bridge = Bridge::start(case.options());
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let first = only_sandbox(&case);
    bridge.close_stdin();
    drop(bridge);

    // Paused meanwhile, it is resumed by the next bridge, found by the id in the store, with its files (the CLI's
    // conversation) kept.
    case.suspend(&first);
    let mut bridge = Bridge::start(case.options());
    assert!(bridge.load_session(&sid, &ws).result.is_ok());
    assert_eq!(bridge.prompt(&sid, "SCENARIO:followup again").stop_reason(), "end_turn");
    assert_eq!(only_sandbox(&case), first);
    let earlier = runs(&case, &first);
    assert_eq!(earlier.len(), 2);
    assert_eq!(earlier[1].flag_value("--session"), Some(earlier[0].cli_session()));

    // Gone behind the bridge's back, it is made again by the next prompt, whose CLI does not know the
    // conversation: it starts a fresh one from the stored transcript, and the thread says so.
    case.destroy(&first);
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    let again = only_sandbox(&case);
    assert_eq!(case.session_of(&again), Some(sid.clone()));
    if case.remote() {
        assert_ne!(again, first, "a new sandbox");
    }
    let all = runs(&case, &again);
    let [tried, fresh] = &all[all.len() - 2..] else { unreachable!() };
    assert_eq!(tried.flag_value("--session"), Some(earlier[0].cli_session()), "the old conversation is tried first");
    assert_eq!(fresh.flag_value("--session"), None);
    let handed_over = fresh.stdin_text();
    assert!(handed_over.contains("Hello from the fake model.") && handed_over.ends_with("Say hello"), "{handed_over}");
    assert_eq!(
        turn.agent_text(),
        format!(
            "\n\n_The earlier OpenCode conversation ({}) no longer exists in the sandbox, so this prompt starts a fresh \
             one from a transcript of the earlier turns (tool details are not in it)._\n\nYes, I remember: this is \
             turn two of the same session.",
            earlier[0].cli_session()
        )
    );
    case.after_turns(&bridge);
}

/// The editor's MCP servers reach the CLI wherever it runs, in its configuration only: a stdio server wrapped to get
/// exactly the editor's variable, an http one with its header; neither value is in the bridge's log.
fn the_editors_mcp_servers_reach_the_cli_there<C: Case>() {
    let case = C::start("mcp");
    let ws = case.workspace();
    let mut bridge = Bridge::start(case.options());
    let servers = json!([
        {"name": "files", "command": "/usr/bin/true", "args": ["--x"], "env": [{"name": "TOKEN", "value": "mcp-env-secret"}]},
        {"type": "http", "name": "web", "url": "http://127.0.0.1:9/mcp", "headers": [{"name": "A", "value": "mcp-header-secret"}]}
    ]);
    let created = bridge.request("session/new", json!({"cwd": ws, "mcpServers": servers})).unwrap();
    let sid = created["sessionId"].as_str().unwrap().to_string();
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let run = &runs(&case, &only_sandbox(&case))[0];
    assert_eq!(run.env("TOKEN"), None, "the editor's variable is the server's, not the CLI's");
    let content: Value =
        serde_json::from_str(&run.env("OPENCODE_CONFIG_CONTENT").expect("the config content")).unwrap();
    let files = &content["mcp"]["files"];
    assert_eq!((&files["type"], &files["environment"]), (&json!("local"), &json!({"TOKEN": "mcp-env-secret"})));
    let command: Vec<&str> = files["command"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!((command[0], &command[3..]), ("/bin/sh", &["mcp-files", "/usr/bin/true", "--x"][..]), "{command:?}");
    assert_eq!(
        content["mcp"]["web"],
        json!({"type": "remote", "url": "http://127.0.0.1:9/mcp", "headers": {"A": "mcp-header-secret"}, "oauth": false, "enabled": true})
    );
    let log = bridge.stderr();
    assert!(!log.contains("mcp-env-secret") && !log.contains("mcp-header-secret"), "a secret is in the log");
}

/// An ACP agent kept across turns (`--remote-idle keep`; a local sandbox always keeps it): the same process answers
/// each turn. Once a remote sandbox is suspended behind the bridge's back (E2B's pause when its timeout ends, which
/// cuts the agent's streams; Daytona's auto-stop, which ends it), the next turn starts the agent again on the same
/// conversation.
fn an_acp_agent_stays_across_turns_while_its_sandbox_runs<C: Case>() {
    let case = C::start("acp-keep");
    let ws = case.workspace();
    let mut options = case
        .options()
        .env("ACP_SANDBOX_REMOTE_IDLE", "keep")
        .arg("--agent-command")
        .arg(&support::fakes_dir().join("acp_agent.py").display().to_string());
    options.agent = "custom".into();
    let mut bridge = Bridge::start_reviewing(options, true);
    let sid = bridge.new_session(&ws);
    let said = |turn: support::Turn| -> String {
        let chunks = turn.updates.iter().filter(|u| u["sessionUpdate"] == "agent_message_chunk");
        let text: String =
            chunks.filter_map(|u| u["content"]["text"].as_str()).filter(|text| !text.trim().starts_with('_')).collect();
        text.trim().to_string()
    };
    let first = said(bridge.prompt(&sid, "SCENARIO:whoami"));
    assert!(first.starts_with("process "), "{first}");
    assert_eq!(said(bridge.prompt(&sid, "SCENARIO:whoami")), first, "another agent answered the second turn");
    let sandboxes = case.sandboxes();
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    case.suspend(&sandboxes[0]);
    let third = said(bridge.prompt(&sid, "SCENARIO:whoami"));
    assert!(third.starts_with("process "), "{third}");
    assert_eq!(third == first, !case.remote(), "{third} after {first}: started again only where the sandbox slept");
    assert_eq!(
        said(bridge.prompt(&sid, "SCENARIO:history")),
        r#"history ["SCENARIO:whoami", "SCENARIO:whoami", "SCENARIO:whoami"]"#
    );
}

macro_rules! suite {
    ($($provider:ident: $case:ty),* $(,)?) => {$(
        mod $provider {
            use super::*;

            #[test]
            fn a_session_runs_in_a_sandbox_of_its_own_that_goes_with_it() {
                runs_in_its_own_sandbox_that_goes_with_the_session::<$case>()
            }

            #[test]
            fn a_cancel_ends_the_cli_in_its_sandbox_and_the_session_goes_on() {
                a_cancel_ends_the_cli_there_and_the_session_goes_on::<$case>()
            }

            #[test]
            fn a_new_bridge_finds_the_sandbox_and_one_gone_is_made_again_from_the_transcript() {
                made_again_from_the_transcript::<$case>()
            }

            #[test]
            fn the_editors_mcp_servers_reach_the_cli_in_its_sandbox() {
                the_editors_mcp_servers_reach_the_cli_there::<$case>()
            }

            #[test]
            fn an_acp_agent_stays_across_turns_while_its_sandbox_runs() {
                super::an_acp_agent_stays_across_turns_while_its_sandbox_runs::<$case>()
            }
        }
    )*};
}

suite! {
    local: Local,
    e2b: E2b,
    daytona: Daytona,
}
