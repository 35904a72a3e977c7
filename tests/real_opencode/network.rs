//! `--network ask` with OpenCode's warm server under bubblewrap: a connection its bash tool makes during a turn is
//! asked about in that thread, and "always" spares the next question.

use super::*;

/// Run by OpenCode's bash tool: the same host twice through the sandbox's proxy, with the fake CLI's client
/// (`proxy_connect` of `tests/fakes/fake_cli.py`, copied into the workspace's `.attack/`: the checkout may be where
/// the sandbox shows nothing, such as `/tmp`), each result in `.server-attack.json`.
fn connect_twice(ws: &Path) -> String {
    std::fs::create_dir_all(ws.join(".attack")).unwrap();
    std::fs::copy(fakes_dir().join("fake_cli.py"), ws.join(".attack/fake_cli.py")).unwrap();
    "import json, sys\nsys.path.insert(0, \".attack\")\nfrom fake_cli import proxy_connect\n\
     json.dump([proxy_connect(\"203.0.113.21:443\", \"ping\") for _ in range(2)], open(\".server-attack.json\", \"w\"))\n"
        .to_string()
}

#[test]
fn a_warm_servers_bash_tool_is_asked_about_in_its_thread_and_always_is_answered_once() {
    let test = "a_warm_servers_bash_tool_is_asked_about_in_its_thread_and_always_is_answered_once";
    if !bwrap_ok(test) {
        return;
    }
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::write(ws.join(".attack.py"), connect_twice(&ws)).unwrap();
    let upstream = UpstreamProxy::start();
    let options = world
        .backend_options("bwrap", "serve")
        .arg("--network")
        .arg("ask")
        .env("HTTPS_PROXY", &format!("http://127.0.0.1:{}", upstream.port));
    let mut bridge = world.start_with(options);
    bridge.permission_answer = Some("allow_always".into());
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:attack set the project up", "network ask");
    assert_end_turn(&bridge, &turn);
    let report = std::fs::read_to_string(ws.join(".server-attack.json"))
        .unwrap_or_else(|e| bridge.fail(&format!("the bash tool wrote no result ({e}): {:#?}", turn.updates)));
    assert_eq!(serde_json::from_str::<Value>(&report).unwrap(), json!(["200 ping", "200 ping"]));
    let asked: Vec<&str> = bridge
        .permission_requests
        .iter()
        .filter_map(|request| request["toolCall"]["title"].as_str())
        .filter(|title| title.starts_with("Connect to"))
        .collect();
    assert_eq!(asked, ["Connect to 203.0.113.21:443"], "{:#?}", bridge.permission_requests);
    assert_eq!(upstream.seen(), ["CONNECT 203.0.113.21:443 HTTP/1.1"; 2]);
}
