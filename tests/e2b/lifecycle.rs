//! A session's life in an E2B sandbox through the built bridge: the CLI installed inside on first use (and its
//! failures), the user's CLI configuration staged without its credentials, the sandbox paused after each turn,
//! cancel ending the CLI's whole tree, a bridge killed mid-turn, and where the keys may and may not appear.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use acp_sandbox::sandbox::{Sandbox, SandboxProvider};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::support::{self, BridgeOptions, TestDirs};
use super::{FakeE2b, KEY, STATE_DIR, WORKSPACE, e2b_options, only_sandbox};

/// Where the pinned OpenCode is installed inside a sandbox, and its stamp.
const TOOLS: &str = "/home/user/.acp-sandbox/tools/opencode-ai@1.18.33";
const INSTALL_TITLE: &str = "Installing OpenCode 1.18.33 in the sandbox (first use)";
const HELLO: &str = "Hello from the fake model. This is a plain text answer.";

/// A directory of executables for a template's PATH: each `(name, script)` a `#!/bin/sh` script, each
/// `(name, None)` a link to the host's own program of that name.
fn bin_dir(dirs: &TestDirs, dir: &str, scripts: &[(&str, Option<String>)]) -> PathBuf {
    let bin = dirs.root().join(dir);
    std::fs::create_dir_all(&bin).unwrap();
    for (name, script) in scripts {
        let path = bin.join(name);
        match script {
            Some(body) => {
                std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            None => std::os::unix::fs::symlink(which(name), &path).unwrap(),
        }
    }
    bin
}

fn which(name: &str) -> PathBuf {
    ["/usr/bin", "/bin"].iter().map(|dir| Path::new(dir).join(name)).find(|p| p.exists()).unwrap()
}

/// The fake E2B with a template `node` whose PATH has `npm` (the given script) before the host's.
fn fake_with_npm(dirs: &TestDirs, npm: String) -> FakeE2b {
    let bin = bin_dir(dirs, "node-bin", &[("npm", Some(npm))]);
    FakeE2b::start_with(&[
        "--templates",
        "base,node",
        "--template-path",
        &format!("node={}:/usr/bin:/bin", bin.display()),
    ])
}

/// The bridge in E2B sandboxes of `template`, without an override: the CLI comes from npm inside.
fn installing(fake: &FakeE2b, dirs: &TestDirs, template: &str) -> BridgeOptions {
    e2b_options(fake, dirs).without_env("ACP_SANDBOX_OPENCODE_BIN").env("ACP_SANDBOX_E2B_TEMPLATE", template)
}

/// A fake E2B, a bridge running sessions there with the fake OpenCode (named by the override), and a session.
fn session_in_e2b(name: &str) -> (FakeE2b, TestDirs, PathBuf, support::Bridge, String) {
    let fake = FakeE2b::start();
    let dirs = TestDirs::new(name);
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(e2b_options(&fake, &dirs));
    let sid = bridge.new_session(&ws);
    (fake, dirs, ws, bridge, sid)
}

/// The one sandbox the fake holds, once the bridge made it.
fn wait_sandbox(fake: &FakeE2b) -> String {
    assert!(support::wait_until(support::RECV_TIMEOUT, || fake.state().as_object().is_some_and(|s| !s.is_empty())));
    only_sandbox(fake).0
}

/// The sandbox, and the host pids of the fake CLI of scenario `child` running there and of its grandchild, once
/// both run (the fake E2B has no PID namespace: the pids the fake CLI records are the host's).
fn cli_and_grandchild(fake: &FakeE2b) -> (String, i32, i32) {
    let id = wait_sandbox(fake);
    let inside = fake.host_path(&id, WORKSPACE);
    let cli = support::wait_invocations(&inside, 1)[0].0["pid"].as_i64().unwrap() as i32;
    let child_file = inside.join(".fake-cli/child.pid");
    assert!(support::wait_until(support::RECV_TIMEOUT, || child_file.exists()), "the grandchild never started");
    (id, cli, std::fs::read_to_string(&child_file).unwrap().trim().parse().unwrap())
}

/// Whether the fake soon lists no process of sandbox `id` (it forgets a killed one once its pipes are read).
fn no_processes(fake: &FakeE2b, id: &str) -> bool {
    support::wait_until(support::RECV_TIMEOUT, || fake.state()[id]["processes"] == json!([]))
}

/// Every request of `path` to envd, with its JSON body.
fn envd_calls(fake: &FakeE2b, path: &str) -> Vec<Value> {
    fake.records().iter().filter(|r| r["port"] == "envd" && r["path"] == path).map(body_json).collect()
}

/// The `process` of every `Start` request (its envelope's JSON).
fn starts(fake: &FakeE2b) -> Vec<Value> {
    envd_calls(fake, "/process.Process/Start").into_iter().map(|body| body["process"].clone()).collect()
}

/// The paths of every file upload.
/// The files uploaded into the sandbox but the workspace's mirror (its archives and token, tested apart).
fn uploads(fake: &FakeE2b) -> Vec<String> {
    fake.records()
        .iter()
        .filter(|r| r["port"] == "envd" && r["method"] == "POST" && r["path"].as_str().unwrap().starts_with("/files?"))
        .map(|r| {
            let query = r["path"].as_str().unwrap().split_once('?').unwrap().1;
            percent_decoded(query.strip_prefix("path=").unwrap())
        })
        .filter(|path| !path.starts_with(&format!("{STATE_DIR}/mirror-")))
        .collect()
}

/// The turn's tool cards but the workspace upload's (tested apart).
fn tool_updates(turn: &support::Turn) -> Vec<Value> {
    turn.updates
        .iter()
        .filter(|u| matches!(u["sessionUpdate"].as_str(), Some("tool_call" | "tool_call_update")))
        .filter(|u| !u["toolCallId"].as_str().unwrap_or_default().ends_with("-upload"))
        .cloned()
        .collect()
}

#[test]
fn the_cli_is_installed_in_the_sandbox_on_first_use_with_the_users_config_and_found_there_later() {
    let dirs = TestDirs::new("e2b-install");
    let fake = fake_with_npm(&dirs, support::installing_npm());
    let ws = dirs.remote_workspace("ws");
    // The user's OpenCode config and login, as `user_config` finds them.
    let (config, data) = (dirs.root().join("xdg-config"), dirs.root().join("xdg-data"));
    std::fs::create_dir_all(config.join("opencode/command")).unwrap();
    std::fs::create_dir_all(config.join("opencode/node_modules/plugin")).unwrap();
    std::fs::write(config.join("opencode/opencode.json"), "{\"autoupdate\": false}").unwrap();
    std::fs::write(config.join("opencode/command/hello.md"), "Say hello").unwrap();
    std::fs::write(config.join("opencode/node_modules/plugin/index.js"), "downloaded").unwrap();
    let login = "{\"fake\":{\"type\":\"api\",\"key\":\"sk-login-0123456789\"}}";
    std::fs::create_dir_all(data.join("opencode")).unwrap();
    std::fs::write(data.join("opencode/auth.json"), login).unwrap();
    let options = installing(&fake, &dirs, "node")
        .env("XDG_CONFIG_HOME", &config.display().to_string())
        .env("XDG_DATA_HOME", &data.display().to_string());
    let mut bridge = support::Bridge::start(options);
    let sid = bridge.new_session(&ws);

    let first = bridge.prompt(&sid, "Say hello");
    assert_eq!(first.stop_reason(), "end_turn");
    assert_eq!(first.agent_text(), HELLO);
    let cards = tool_updates(&first);
    assert_eq!(cards.len(), 2, "{cards:#?}");
    assert_eq!(
        (&cards[0]["title"], &cards[0]["status"], &cards[0]["rawInput"]),
        (&json!(INSTALL_TITLE), &json!("in_progress"), &json!({"npm": "opencode-ai@1.18.33"}))
    );
    assert_eq!((&cards[1]["toolCallId"], &cards[1]["status"]), (&cards[0]["toolCallId"], &json!("completed")));
    let (id, _) = only_sandbox(&fake);
    let npm_log = fake.host_path(&id, &format!("{STATE_DIR}/home/npm.log"));
    assert_eq!(
        std::fs::read_to_string(&npm_log).unwrap(),
        "install --no-audit --no-fund --loglevel error --prefix \
         /home/user/.acp-sandbox/tools/.staging-opencode-ai@1.18.33 opencode-ai@1.18.33\n"
    );
    assert_eq!(
        std::fs::read_to_string(fake.host_path(&id, &format!("{TOOLS}/.acp-sandbox-installed"))).unwrap(),
        "opencode-ai@1.18.33\n"
    );
    let runs = support::invocations(&fake.host_path(&id, WORKSPACE));
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].argv()[0], "run");
    let cli = starts(&fake).into_iter().find(|p| p["args"][0] == "run").unwrap();
    assert_eq!(cli["cmd"], format!("{TOOLS}/node_modules/.bin/opencode"));
    // The config is staged where a local sandbox shows it; the login reaches only the CLI, in its environment.
    let config_dir = format!("{STATE_DIR}/config/opencode");
    assert_eq!(uploads(&fake), vec![format!("{config_dir}/command/hello.md"), format!("{config_dir}/opencode.json")]);
    assert_eq!(
        std::fs::read_to_string(fake.host_path(&id, &format!("{config_dir}/opencode.json"))).unwrap(),
        "{\"autoupdate\": false}"
    );
    assert_eq!(runs[0].env("OPENCODE_AUTH_CONTENT").as_deref(), Some(login));
    assert!(!fake.host_path(&id, &format!("{STATE_DIR}/data/opencode/auth.json")).exists());
    // Nothing of this machine's PATH reaches the sandbox's CLI: the template's applies.
    assert_eq!(
        runs[0].env("PATH").as_deref(),
        Some(format!("{}:/usr/bin:/bin", dirs.root().join("node-bin").display()).as_str())
    );

    // The next turn finds the CLI with one small read, and uploads nothing that did not change.
    let second = bridge.prompt(&sid, "Say hello again");
    assert_eq!(second.stop_reason(), "end_turn");
    assert_eq!(tool_updates(&second), Vec::<Value>::new());
    assert_eq!(std::fs::read_to_string(&npm_log).unwrap().lines().count(), 1);
    assert_eq!(uploads(&fake).len(), 2);
    // A changed file is uploaded again, alone.
    std::fs::write(config.join("opencode/command/hello.md"), "Say hello twice").unwrap();
    assert_eq!(bridge.prompt(&sid, "and again").stop_reason(), "end_turn");
    assert_eq!(uploads(&fake)[2..], [format!("{config_dir}/command/hello.md")]);
    assert_eq!(support::invocations(&fake.host_path(&id, WORKSPACE)).len(), 3);

    // A sandbox gone on E2B's side is replaced: the new one gets the CLI and the whole config again.
    tokio::runtime::Runtime::new().unwrap().block_on(fake.provider().destroy(&id)).unwrap();
    let fourth = bridge.prompt(&sid, "Say hello");
    assert_eq!(fourth.stop_reason(), "end_turn");
    assert_eq!(tool_updates(&fourth)[0]["title"], INSTALL_TITLE);
    let (replaced, _) = only_sandbox(&fake);
    assert_ne!(replaced, id);
    assert_eq!(uploads(&fake)[3..], [format!("{config_dir}/command/hello.md"), format!("{config_dir}/opencode.json")]);
    // Its CLI does not know the conversation: a fresh one starts from the stored transcript.
    let runs = support::invocations(&fake.host_path(&replaced, WORKSPACE));
    assert_eq!(runs.iter().map(|run| run.has_flag("--session")).collect::<Vec<_>>(), [true, false]);
}

#[test]
fn an_install_in_the_sandbox_that_cannot_work_says_what_to_do() {
    let dirs = TestDirs::new("e2b-install-fails");
    // `bare`: a template without npm (its PATH has the tools a sandbox has, not npm); `broken`: npm fails.
    let bare = bin_dir(&dirs, "bare-bin", &[("mkdir", None), ("grep", None), ("rm", None), ("mv", None)]);
    let broken = bin_dir(
        &dirs,
        "broken-bin",
        &[(
            "npm",
            Some("echo 'npm error 404 Not Found - GET https://registry.npmjs.org/opencode-ai' >&2\nexit 1\n".into()),
        )],
    );
    let fake = FakeE2b::start_with(&[
        "--templates",
        "base,bare,broken",
        "--template-path",
        &format!("bare={}", bare.display()),
        "--template-path",
        &format!("broken={}:/usr/bin:/bin", broken.display()),
    ]);
    let fix = "Make the sandboxes from a template with Node.js and npm, or set ACP_SANDBOX_OPENCODE_BIN to the CLI's \
               path inside the sandbox.";
    for (template, said) in [
        ("bare", None),
        (
            "broken",
            Some("npm ended with exit code 1: npm error 404 Not Found - GET https://registry.npmjs.org/opencode-ai"),
        ),
    ] {
        let ws = dirs.remote_workspace(template);
        let mut bridge = support::Bridge::start(installing(&fake, &dirs, template));
        let sid = bridge.new_session(&ws);
        let turn = bridge.prompt(&sid, "Say hello");
        let id = fake.state().as_object().unwrap().iter().find(|(_, s)| s["template"] == template).unwrap().0.clone();
        let said = said
            .map(str::to_string)
            .unwrap_or(format!("npm is not installed in the sandbox (E2B sandbox {id} (template bare, envd 0.5.7))"));
        let error = turn.result.as_ref().unwrap_err();
        assert_eq!(
            error.message,
            format!(
                "OpenCode is not installed in the sandbox and could not be installed: installing opencode-ai@1.18.33 \
                 failed: {said}. {fix}"
            )
        );
        let cards = tool_updates(&turn);
        assert_eq!(
            (&cards[1]["status"], &cards[1]["content"][0]["content"]["text"]),
            (&json!("failed"), &json!(format!("installing opencode-ai@1.18.33 failed: {said}")))
        );
        // Nothing looks installed: the next prompt tries again (and says the same).
        assert!(!fake.host_path(&id, &format!("{TOOLS}/.acp-sandbox-installed")).exists());
        assert_eq!(bridge.prompt(&sid, "Say hello").result.unwrap_err().message, error.message);
    }
}

#[test]
fn cancel_during_the_install_in_the_sandbox_ends_npm_and_what_it_started() {
    let dirs = TestDirs::new("e2b-install-cancel");
    let pids = dirs.workspace("npm-pids");
    let npm = format!(
        "sleep 1000 &\necho $! > '{dir}/child.tmp' && mv '{dir}/child.tmp' '{dir}/child.pid'\n\
         echo $$ > '{dir}/npm.tmp' && mv '{dir}/npm.tmp' '{dir}/npm.pid'\nwait\n",
        dir = pids.display()
    );
    let fake = fake_with_npm(&dirs, npm);
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start(installing(&fake, &dirs, "node"));
    let sid = bridge.new_session(&ws);
    let prompt = bridge.send_prompt(&sid, "Say hello");
    let (npm, child) = support::wait_npm(&pids);
    let _guards = (support::KillOnDrop(npm), support::KillOnDrop(child));

    let cancelled = Instant::now();
    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, prompt);
    eprintln!("cancel to answer during the install: {:?}", cancelled.elapsed());
    assert_eq!(turn.stop_reason(), "cancelled");
    let cards = tool_updates(&turn);
    assert_eq!(
        (&cards[0]["title"], &cards[1]["status"], &cards[1]["content"][0]["content"]["text"]),
        (&json!(INSTALL_TITLE), &json!("failed"), &json!("The install was cancelled."))
    );
    assert!(
        support::wait_until(support::RECV_TIMEOUT, || !support::pid_alive(npm) && !support::pid_alive(child)),
        "npm {npm} or its child {child} outlived the cancel"
    );
    let id = only_sandbox(&fake).0;
    assert!(no_processes(&fake, &id), "{}", fake.state());
    assert!(support::invocations(&fake.host_path(&id, WORKSPACE)).is_empty(), "no CLI may run after the cancel");
}

#[test]
fn cancel_ends_the_clis_whole_process_tree_in_the_sandbox() {
    let (fake, _dirs, _ws, mut bridge, sid) = session_in_e2b("e2b-cancel-tree");
    // The CLI starts a grandchild in a session of its own, which a signal to the CLI (or its group) never reaches.
    let prompt = bridge.send_prompt(&sid, "SCENARIO:child start something");
    let (id, cli, child) = cli_and_grandchild(&fake);
    let _guards = (support::KillOnDrop(cli), support::KillOnDrop(child));
    assert!(support::pid_alive(cli) && support::pid_alive(child));

    let cancelled = Instant::now();
    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, prompt);
    assert_eq!(turn.stop_reason(), "cancelled");
    let gone = support::wait_until(support::RECV_TIMEOUT, || !support::pid_alive(cli) && !support::pid_alive(child));
    // Measured, not asserted: the report quotes it.
    eprintln!("cancel to the whole tree gone: {:?}", cancelled.elapsed());
    assert!(gone, "the CLI {cli} or its grandchild {child} outlived the cancel");
    assert!(no_processes(&fake, &id), "{}", fake.state());
    // The session goes on.
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
}

#[test]
fn the_sandbox_is_paused_after_each_turn_and_the_next_prompt_resumes_it() {
    let (fake, dirs, ws, mut bridge, sid) = session_in_e2b("e2b-pause");
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let (id, _) = only_sandbox(&fake);
    assert!(support::wait_until(support::RECV_TIMEOUT, || fake.state()[&id]["state"] == "paused"), "never paused");
    // Prompts right after each answer: each one races the pause of the turn before, and must find its sandbox
    // awake for its whole turn (a pause under a running CLI would cut its stream, which the bridge re-attaches).
    for n in 0..5 {
        let turn = bridge.prompt(&sid, &format!("SCENARIO:slow FAKE_COUNT=3 FAKE_DELAY_MS=30 number {n}"));
        assert_eq!(turn.stop_reason(), "end_turn");
        assert_eq!(turn.agent_text(), "slow chunk 1 of 3. slow chunk 2 of 3. slow chunk 3 of 3. ");
    }
    bridge.close_stdin();
    assert!(bridge.wait_exit(support::RECV_TIMEOUT).is_some_and(|s| s.success()));
    // The bridge waited for the last pause before it exited.
    let state = &fake.state()[&id];
    assert_eq!((&state["state"], &state["pauses"]), (&json!("paused"), &json!(6)));
    assert_eq!(state["resumes"], json!(5));
    assert_eq!(envd_calls(&fake, "/process.Process/Connect"), Vec::<Value>::new(), "a pause cut a running command");
    assert_eq!(support::invocations(&fake.host_path(&id, WORKSPACE)).len(), 6);

    // `--remote-idle keep` leaves it running.
    let mut bridge = support::Bridge::start(e2b_options(&fake, &dirs).env("ACP_SANDBOX_REMOTE_IDLE", "keep"));
    bridge.request("session/load", json!({"sessionId": sid, "cwd": ws, "mcpServers": []})).unwrap();
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    bridge.close_stdin();
    assert!(bridge.wait_exit(support::RECV_TIMEOUT).is_some_and(|s| s.success()));
    let state = &fake.state()[&id];
    assert_eq!((&state["state"], &state["pauses"], &state["resumes"]), (&json!("running"), &json!(6), &json!(6)));
}

#[test]
fn a_cli_left_running_by_a_killed_bridge_is_ended_with_a_note_before_the_next_prompt_runs() {
    let (fake, dirs, ws, mut bridge, sid) = session_in_e2b("e2b-stray");
    bridge.send_prompt(&sid, "SCENARIO:child work for a long time");
    let (id, old, child) = cli_and_grandchild(&fake);
    let inside = fake.host_path(&id, WORKSPACE);
    let _guards = (support::KillOnDrop(old), support::KillOnDrop(child));
    support::wait_native_id(&dirs, &sid);
    bridge.kill9();
    // The sandbox outlives the bridge, and so does its CLI: the premise.
    assert!(support::pid_alive(old), "the CLI died with the bridge");

    let _bridge = support::prompt_after_a_killed_bridge(e2b_options(&fake, &dirs), &ws, &sid);
    assert!(
        !support::pid_alive(old) && !support::pid_alive(child),
        "the earlier CLI {old} or its child {child} runs on"
    );
    // Never two CLIs on one conversation: the stray was killed before the new CLI started.
    let calls: Vec<String> = fake
        .records()
        .iter()
        .filter(|r| r["port"] == "envd" && r["path"].as_str().unwrap().starts_with("/process.Process/"))
        .map(|r| {
            let cli = body_json(r)["process"]["cmd"].as_str().is_some_and(|cmd| cmd.ends_with("fakes/opencode"));
            format!(
                "{}{}",
                r["path"].as_str().unwrap().trim_start_matches("/process.Process/"),
                if cli { " cli" } else { "" }
            )
        })
        .collect();
    let cli_starts: Vec<usize> = calls.iter().enumerate().filter(|(_, c)| *c == "Start cli").map(|(i, _)| i).collect();
    assert_eq!(cli_starts.len(), 2, "{calls:?}");
    let kill = calls.iter().position(|c| c == "SendSignal").expect("the stray was never signalled");
    assert!(cli_starts[0] < kill && kill < cli_starts[1], "{calls:?}");
    assert_eq!(support::invocations(&inside).len(), 2);
    assert!(no_processes(&fake, &id), "{}", fake.state());
}

#[test]
fn the_keys_appear_only_where_they_must() {
    let fake = FakeE2b::start();
    let dirs = TestDirs::new("e2b-keys");
    let ws = dirs.remote_workspace("ws");
    let agent_key = "sgamp_user_only_for_the_cli_4f2a9c";
    // Amp's settings are staged; a secrets file beside them never is.
    let config = dirs.root().join("xdg-config");
    std::fs::create_dir_all(config.join("amp")).unwrap();
    std::fs::write(config.join("amp/settings.json"), "{\"amp.notifications.enabled\": false}").unwrap();
    std::fs::write(config.join("amp/secrets.json"), "{\"apiKey@https://ampcode.com/\": \"sgamp_stored_secret\"}")
        .unwrap();
    let options = BridgeOptions { agent: "amp".into(), ..e2b_options(&fake, &dirs) }
        .env("AMP_API_KEY", agent_key)
        .env("XDG_CONFIG_HOME", &config.display().to_string());
    let mut bridge = support::Bridge::start(options);
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    assert_eq!(bridge.prompt(&sid, "SCENARIO:tools and some tools").stop_reason(), "end_turn");
    let prompt = bridge.send_prompt(&sid, "SCENARIO:hang and stop");
    support::wait_invocations(&fake.host_path(&only_sandbox(&fake).0, WORKSPACE), 3);
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, prompt).stop_reason(), "cancelled");
    let stderr = bridge.stderr();
    bridge.close_stdin();
    assert!(bridge.wait_exit(support::RECV_TIMEOUT).is_some_and(|s| s.success()));
    let (id, _) = only_sandbox(&fake);

    // The store and the logs (every file of the data dir) hold neither key.
    for file in files_under(&dirs.data) {
        let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
        assert!(!text.contains(KEY) && !text.contains(agent_key), "a key is in {}", file.display());
    }
    assert!(!stderr.contains(KEY) && !stderr.contains(agent_key), "a key is in the bridge's stderr");
    // The CLI got the agent's key in its environment, and never the E2B key.
    let runs = support::invocations(&fake.host_path(&id, WORKSPACE));
    assert_eq!(runs.len(), 3);
    for run in &runs {
        assert_eq!(run.env("AMP_API_KEY").as_deref(), Some(agent_key));
        assert!(!run.0["env"].to_string().contains(KEY), "the E2B key reached the CLI");
    }
    // The sandbox's disk: the agent key only in the fake CLI's own record of its environment, the E2B key nowhere;
    // the settings staged, the secrets file not.
    let record = fake.host_path(&id, WORKSPACE).join(".fake-cli/invocations.jsonl");
    for file in files_under(&fake.root.join(&id)) {
        let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
        assert!(!text.contains(KEY), "the E2B key is on the sandbox's disk: {}", file.display());
        assert!(
            file == record || !text.contains(agent_key),
            "the agent key is on the sandbox's disk: {}",
            file.display()
        );
        assert!(
            !text.contains("sgamp_stored_secret"),
            "the stored secret is on the sandbox's disk: {}",
            file.display()
        );
    }
    assert_eq!(uploads(&fake), vec![format!("{STATE_DIR}/config/amp/settings.json")]);
    // What the fake received: the E2B key only as the control plane's `X-API-Key`; the agent key only in the
    // environment of the CLI's own commands.
    for r in fake.records() {
        let mut without_key_header = r.clone();
        // (The test's own hooks carry no key.)
        if r["port"] == "api" && !r["path"].as_str().unwrap().starts_with("/_fake/") {
            assert_eq!(r["headers"]["x-api-key"], KEY);
            without_key_header["headers"].as_object_mut().unwrap().remove("x-api-key");
        }
        assert!(!record_text(&without_key_header).contains(KEY), "the E2B key went elsewhere: {r}");
    }
    let with_agent_key: Vec<Value> =
        fake.records().into_iter().filter(|r| record_text(r).contains(agent_key)).collect();
    assert_eq!(with_agent_key.len(), 3, "{with_agent_key:#?}");
    for r in &with_agent_key {
        assert_eq!(r["path"], "/process.Process/Start");
        let body = body_json(r);
        assert_eq!(body["process"]["envs"]["AMP_API_KEY"], agent_key);
        assert_eq!(body["process"]["cmd"], support::fakes_dir().join("amp").display().to_string());
        let mut rest = body.clone();
        rest["process"]["envs"].as_object_mut().unwrap().remove("AMP_API_KEY");
        assert!(!rest.to_string().contains(agent_key), "{body}");
    }
}

/// `%2F` is `/` again and `+` a space (the query of a file upload).
fn percent_decoded(text: &str) -> String {
    percent_encoding::percent_decode_str(&text.replace('+', " ")).decode_utf8().unwrap().into_owned()
}

/// Every file below `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut queue = vec![dir.to_path_buf()];
    while let Some(dir) = queue.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                queue.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files
}

/// A request's body as the fake received it (text, or base64 when it was not UTF-8).
fn body_bytes(record: &Value) -> Vec<u8> {
    use base64::Engine;
    match (record["body"].as_str(), record["body_b64"].as_str()) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD.decode(b64).unwrap(),
        (None, None) => Vec::new(),
    }
}

/// A request's JSON body; a Connect stream's body is one envelope (5 bytes of header, then the JSON).
fn body_json(record: &Value) -> Value {
    let bytes = body_bytes(record);
    let streams =
        ["/process.Process/Start", "/process.Process/Connect"].contains(&record["path"].as_str().unwrap_or(""));
    serde_json::from_slice(if streams { &bytes[5..] } else { &bytes }).unwrap_or(Value::Null)
}

/// Everything of a request as text: its path, headers and body.
fn record_text(record: &Value) -> String {
    format!("{} {} {}", record["path"], record["headers"], String::from_utf8_lossy(&body_bytes(record)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_command_leaves_running_ends_with_it() {
    let fake = FakeE2b::start();
    let provider = fake.provider();
    let (id, sandbox) = super::created(&fake, &provider, "s-leftover").await;
    // A daemon of the command's: no longer its child once the command exits, and holding none of its pipes.
    let mut process =
        sandbox.exec(super::sh("sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > daemon.pid; exit 0")).await.unwrap();
    assert_eq!(super::within("the exit", process.handle.wait()).await.unwrap().code, Some(0));
    let daemon: u32 = std::fs::read_to_string(fake.host_path(&id, &format!("{WORKSPACE}/daemon.pid")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _guard = support::KillOnDrop(daemon as i32);
    // Gone by the time `wait` answered: the next turn (or a pause) never finds it.
    assert!(!super::host_pid_alive(daemon), "the command's daemon {daemon} outlived it");
    provider.destroy(&id).await.unwrap();
}

/// A sandbox killed on E2B's side while the turn runs (E2B's dashboard, the CLI, a TTL without auto-pause): the
/// turn fails naming that (not an unknown exit status, nor the key), and the next prompt runs in a new sandbox.
#[test]
fn a_sandbox_killed_mid_turn_is_named_and_the_next_prompt_makes_a_new_one() {
    let (fake, _dirs, _ws, mut bridge, sid) = session_in_e2b("e2b-killed-mid-turn");
    // 10 s of talking: killed after its first chunk; the next prompt's CLI replays it from the transcript.
    let prompt = bridge.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=500 FAKE_DELAY_MS=20 keep talking");
    bridge.wait_update(&sid, "a streamed chunk", |u| u["sessionUpdate"] == "agent_message_chunk");
    let id = wait_sandbox(&fake);
    let cli = support::wait_invocations(&fake.host_path(&id, WORKSPACE), 1)[0].pid();
    tokio::runtime::Runtime::new().unwrap().block_on(fake.provider().destroy(&id)).unwrap();
    let error = bridge.finish_turn(&sid, prompt).result.unwrap_err();
    assert_eq!(
        (error.code, error.message.as_str()),
        (
            -32603,
            format!(
                "e2b: the E2B sandbox {id} was killed outside the bridge while the turn ran (or its timeout ended \
                 it); the next prompt makes a new one"
            )
            .as_str()
        )
    );
    assert!(!support::pid_alive(cli), "the CLI {cli} outlived its sandbox");
    // The next prompt runs in a new sandbox, whose CLI starts afresh from the stored transcript (and so talks the
    // slow scenario through, to its end).
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn", "{:?}", turn.result);
    let model_text: String = turn
        .updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk" && u["messageId"].is_string())
        .filter_map(|u| u["content"]["text"].as_str())
        .collect();
    assert_eq!(model_text, (1..=500).map(|n| format!("slow chunk {n} of 500. ")).collect::<String>());
    let notes = support::notes(&turn);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("no longer exists in the sandbox, so this prompt starts a fresh one"), "{notes:?}");
    let (replaced, _) = only_sandbox(&fake);
    assert_ne!(replaced, id);
    let runs = support::invocations(&fake.host_path(&replaced, WORKSPACE));
    // The first run asked for the old conversation, which is not there; the second starts a fresh one.
    assert_eq!(runs.iter().map(|run| run.has_flag("--session")).collect::<Vec<_>>(), [true, false]);
    assert!(runs[1].stdin_text().ends_with("Say hello"), "{}", runs[1].stdin_text());
}
