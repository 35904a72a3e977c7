//! Connection-level behaviour: initialize, how the server is configured, malformed input, unknown sessions,
//! listing and deleting sessions, and a clean exit on stdin EOF.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

#[test]
fn initialize_advertises_protocol_1_session_capabilities_and_agent_name() {
    let dirs = TestDirs::new("init");
    let mut bridge = Bridge::spawn(BridgeOptions::new("opencode", &dirs.data));
    let init = bridge.initialize();
    assert_eq!(init["protocolVersion"], 1, "{init}");
    assert_eq!(init["agentCapabilities"]["loadSession"], true, "{init}");
    let caps = &init["agentCapabilities"]["sessionCapabilities"];
    for cap in ["list", "resume", "close", "delete"] {
        assert!(caps[cap].is_object(), "sessionCapabilities.{cap} is not advertised: {init}");
    }
    assert_eq!(init["agentInfo"]["name"], "acp-sandbox", "{init}");
}

#[test]
fn serve_subcommand_and_env_variables_configure_the_server_like_flags() {
    let dirs = TestDirs::new("env-config");
    let mut options = BridgeOptions::new("opencode", &dirs.data);
    options.serve_subcommand = true;
    options.config_via_env = true;
    let mut bridge = Bridge::start(options);
    let ws = dirs.workspace("ws");
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(invocations(&ws).len(), 1, "the fake OpenCode (from ACP_SANDBOX_OPENCODE_BIN) ran once");
    assert!(
        std::fs::read_dir(&dirs.data).unwrap().next().is_some(),
        "ACP_SANDBOX_DATA_DIR was not used: {} is empty",
        dirs.data.display()
    );
}

#[test]
fn malformed_json_line_gets_parse_error_and_the_bridge_keeps_serving() {
    let dirs = TestDirs::new("malformed");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    bridge.send_raw(r#"{"jsonrpc":"2.0","method":"session/new","params":{"cwd": oops"#);
    let error = bridge.wait_null_id_error();
    assert_eq!(error.code, -32700, "{error}");
    // A request broken after its id still gets its answer: the editor waits on that id.
    let id = bridge.reserve_id("session/new");
    bridge.send_raw(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"session/new","params":{{"cwd": oops"#));
    let error = bridge.wait_response(id).expect_err("a broken request cannot succeed");
    assert_eq!(error.code, -32700, "{error}");

    let ws = dirs.workspace("ws");
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
}

#[test]
fn unknown_session_id_on_load_prompt_and_resume_is_32002_with_the_session_id() {
    let dirs = TestDirs::new("unknown-session");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let id = "no-such-session-0000";
    let attempts = [
        ("session/load", json!({"sessionId": id, "cwd": ws, "mcpServers": []})),
        ("session/prompt", json!({"sessionId": id, "prompt": [{"type": "text", "text": "hi"}]})),
        ("session/resume", json!({"sessionId": id, "cwd": ws})),
    ];
    for (method, params) in attempts {
        let error = bridge.request(method, params).expect_err(&format!("{method} of an unknown session succeeded"));
        assert_eq!(error.code, -32002, "{method}: {error}");
        assert_eq!(error.data.as_ref().map(|d| &d["sessionId"]), Some(&json!(id)), "{method}: {error}");
    }
    assert!(invocations(&ws).is_empty(), "no CLI may run for an unknown session");
}

#[test]
fn deleting_an_unknown_session_succeeds() {
    let dirs = TestDirs::new("delete-unknown");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let result = bridge.request("session/delete", json!({"sessionId": "never-existed"}));
    assert!(result.is_ok(), "session/delete of an unknown id must succeed silently: {result:?}");
}

#[test]
fn deleted_session_is_gone_from_list_and_load() {
    let dirs = TestDirs::new("delete");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    bridge.request("session/delete", json!({"sessionId": sid})).unwrap();

    let list = bridge.request("session/list", json!({})).unwrap();
    assert!(
        !list["sessions"].as_array().unwrap().iter().any(|s| s["sessionId"] == sid.as_str()),
        "deleted session still listed: {list}"
    );
    let error = bridge.load_session(&sid, &ws).result.expect_err("load of a deleted session");
    assert_eq!(error.code, -32002, "{error}");
}

#[test]
fn session_list_filters_by_cwd() {
    let dirs = TestDirs::new("list-cwd");
    let (ws_a, ws_b) = (dirs.workspace("project-a"), dirs.workspace("project-b"));
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid_a = bridge.new_session(&ws_a);
    let sid_b = bridge.new_session(&ws_b);

    let ids = |list: &serde_json::Value| -> Vec<String> {
        list["sessions"].as_array().unwrap().iter().map(|s| s["sessionId"].as_str().unwrap().to_string()).collect()
    };
    let only_a = bridge.request("session/list", json!({"cwd": ws_a})).unwrap();
    assert_eq!(ids(&only_a), vec![sid_a.clone()], "{only_a}");
    assert_eq!(only_a["sessions"][0]["cwd"], json!(ws_a), "{only_a}");

    let all = ids(&bridge.request("session/list", json!({})).unwrap());
    assert!(all.contains(&sid_a) && all.contains(&sid_b), "{all:?}");

    let none = bridge.request("session/list", json!({"cwd": dirs.root().join("elsewhere")})).unwrap();
    assert_eq!(none["sessions"], json!([]), "{none}");
}

#[test]
fn stdin_eof_exits_0_and_kills_the_running_cli_tree() {
    let dirs = TestDirs::new("eof");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    bridge.send_prompt(&sid, "SCENARIO:child start something long");
    let cli = wait_invocations(&ws, 1)[0].pid();
    let _cli_guard = KillOnDrop(cli);
    let child_pid_file = ws.join(".fake-cli/child.pid");
    let mut grandchild = None;
    let started = wait_until(RECV_TIMEOUT, || {
        grandchild = read_pid_file(&ws, &child_pid_file);
        grandchild.is_some()
    });
    assert!(started, "the fake never started its grandchild");
    let grandchild = grandchild.unwrap_or_default();
    let _grandchild_guard = KillOnDrop(grandchild);

    bridge.close_stdin();
    bridge.drain_stdout(RECV_TIMEOUT);
    let status = bridge.wait_exit(RECV_TIMEOUT).unwrap_or_else(|| bridge.fail("the bridge did not exit on stdin EOF"));
    assert_eq!(status.code(), Some(0), "exit status on stdin EOF: {status}");
    assert!(
        wait_until(Duration::from_secs(5), || !pid_alive(cli)),
        "the CLI process {cli} outlived the bridge: {:?}",
        processes_under(&ws)
    );
    assert!(
        wait_until(Duration::from_secs(5), || !pid_alive(grandchild)),
        "the CLI's grandchild {grandchild} (its own session, like OpenCode's bash tool) outlived the bridge"
    );
    assert_no_processes_under(&ws, "after the bridge exited");
}

#[test]
fn stdin_eof_during_the_first_use_install_exits_0_with_npm_and_its_children_gone() {
    let dirs = TestDirs::new("eof-install");
    let ws = dirs.workspace("ws");
    let npm_dir = dirs.workspace("npm");
    let mut bridge = Bridge::start(installing_forever(&dirs.data, &npm_dir));
    let sid = bridge.new_session(&ws);
    bridge.send_prompt(&sid, "Say hello");
    let (npm, child) = wait_npm(&npm_dir);
    let _guards = (KillOnDrop(npm), KillOnDrop(child));

    bridge.close_stdin();
    bridge.drain_stdout(RECV_TIMEOUT);
    let status = bridge.wait_exit(RECV_TIMEOUT).unwrap_or_else(|| bridge.fail("the bridge did not exit on stdin EOF"));
    assert_eq!(status.code(), Some(0), "exit status on stdin EOF: {status}");
    // Killed before the bridge exited: by now each is gone or a zombie waiting for init.
    assert_eq!(
        (pid_alive(npm), pid_alive(child)),
        (false, false),
        "npm {npm} or its child {child} outlived the bridge"
    );
    assert!(invocations(&ws).is_empty(), "no CLI may run after the editor left");
    let tools = dirs.data.join("tools");
    let staged: Vec<_> =
        std::fs::read_dir(&tools).map(|dir| dir.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert_eq!(staged, Vec::<std::ffi::OsString>::new(), "the half-made install is left in {}", tools.display());
}

#[test]
fn every_kind_of_mcp_server_the_editor_offers_is_accepted() {
    let dirs = TestDirs::new("mcp");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let servers = json!([
        {"name": "local tool", "command": "/usr/bin/true", "args": ["--x"], "env": [{"name": "K", "value": "V"}]},
        {"type": "http", "name": "remote", "url": "http://127.0.0.1:9/mcp", "headers": [{"name": "A", "value": "b"}]},
        {"type": "sse", "name": "old", "url": "http://127.0.0.1:9/sse", "headers": []}
    ]);
    let created = bridge.request("session/new", json!({"cwd": ws, "mcpServers": servers})).expect("session/new");
    let sid = created["sessionId"].as_str().unwrap().to_string();
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    // They reach OpenCode's configuration, and only there: the editor's variable is the stdio server's, never the
    // CLI's own, and the secrets are on no command line.
    let invocation = &invocations(&ws)[0];
    assert_eq!(invocation.env("K"), None);
    let content: Value =
        serde_json::from_str(&invocation.env("OPENCODE_CONFIG_CONTENT").expect("the config content")).expect("JSON");
    let mcp = &content["mcp"];
    assert_eq!(mcp.as_object().map(|m| m.len()), Some(3), "{content}");
    assert_eq!(mcp["local tool"]["type"], "local");
    assert_eq!(mcp["local tool"]["environment"], json!({"K": "V"}));
    let command: Vec<&str> =
        mcp["local tool"]["command"].as_array().unwrap().iter().map(|part| part.as_str().unwrap()).collect();
    assert_eq!(
        (command[0], command[1], &command[3..]),
        ("/bin/sh", "-c", &["mcp-local tool", "/usr/bin/true", "--x"][..])
    );
    assert_eq!(
        mcp["remote"],
        json!({"type": "remote", "url": "http://127.0.0.1:9/mcp", "headers": {"A": "b"}, "oauth": false, "enabled": true})
    );
    assert_eq!(
        mcp["old"],
        json!({"type": "remote", "url": "http://127.0.0.1:9/sse", "headers": {}, "oauth": false, "enabled": true})
    );
    let argv = invocation.argv().join(" ");
    for server in ["local tool", "/usr/bin/true", "127.0.0.1:9"] {
        assert!(!argv.contains(server), "{server} in the CLI's argv: {argv}");
    }
}

#[test]
fn each_agent_server_lists_only_its_own_sessions_of_a_shared_data_dir() {
    let dirs = TestDirs::new("list-by-agent");
    let ws = dirs.workspace("ws");
    let mut opencode = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let oc_session = opencode.new_session(&ws);
    let mut amp = Bridge::start(BridgeOptions::new("amp", &dirs.data));
    let amp_session = amp.new_session(&ws);
    let ids = |bridge: &mut Bridge| -> Vec<String> {
        let list = bridge.request("session/list", json!({})).unwrap();
        list["sessions"].as_array().unwrap().iter().map(|s| s["sessionId"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(ids(&mut opencode), vec![oc_session]);
    assert_eq!(ids(&mut amp), vec![amp_session]);
}

#[test]
fn two_bridges_on_one_data_dir_never_run_two_turns_of_one_session() {
    let dirs = TestDirs::new("two-bridges");
    let ws = dirs.workspace("ws");
    let mut first = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = first.new_session(&ws);
    let running = first.send_prompt(&sid, "SCENARIO:slow FAKE_COUNT=200 FAKE_DELAY_MS=100 stream for a while");
    let _guard = KillOnDrop(wait_invocations(&ws, 1)[0].pid());
    first.wait_update(&sid, "the first streamed chunk", |u| u["sessionUpdate"] == "agent_message_chunk");

    // A second editor window on the same data dir opens the session and prompts while the turn runs.
    let mut second = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let loaded = second.load_session(&sid, &ws);
    assert!(loaded.result.is_ok(), "{:?}", loaded.result);
    let refused = second.prompt(&sid, "SCENARIO:text me too").result.expect_err("one turn per session");
    assert_eq!(refused.code, -32600, "{refused}");
    assert_eq!(
        refused.message,
        "This session's turn is running in another window (another acp-sandbox on the same data dir); wait for it to finish there or cancel it there, then send this prompt again"
    );

    first.cancel(&sid);
    assert_eq!(first.finish_turn(&sid, running).stop_reason(), "cancelled");
    assert_eq!(second.prompt(&sid, "Say hello").stop_reason(), "end_turn", "the session is free once the turn ended");
    assert_eq!(invocations(&ws).len(), 2, "the refused prompt started no CLI");
}
