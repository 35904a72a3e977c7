//! What the editor gives a session beside its workspace, through the real OpenCode: its MCP servers (a stdio one
//! inside the sandbox, an http one through the proxy) and its system prompt, kept across a restart; and a fork,
//! whose OpenCode session is a fork of the original's.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use super::support::Bridge;
use super::{World, assert_end_turn, bwrap_ok, of_kind, timed_prompt, tool_results};

/// The stdio probe (`tests/fakes/mcp_probe.py`) copied into the workspace, where the sandbox surely shows it,
/// and a planted private key in the user's home that it must not read.
fn probe_server(world: &World, ws: &Path) -> (Value, PathBuf) {
    let script = ws.join("tools/mcp_probe.py");
    std::fs::create_dir_all(script.parent().unwrap()).unwrap();
    std::fs::copy(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/mcp_probe.py"), &script).unwrap();
    let key = world.home.join(".ssh/id_ed25519");
    std::fs::create_dir_all(key.parent().unwrap()).unwrap();
    std::fs::write(&key, "-----BEGIN OPENSSH PRIVATE KEY-----\nplanted\n").unwrap();
    let server = json!({
        "name": "probe",
        "command": "/usr/bin/python3",
        "args": [script.display().to_string(), key.display().to_string()],
        "env": [{"name": "GIVEN", "value": "from-the-editor"}]
    });
    (server, key)
}

fn new_session_with(bridge: &mut Bridge, ws: &Path, params: Value) -> String {
    let mut request = json!({"cwd": ws, "mcpServers": []});
    request.as_object_mut().unwrap().extend(params.as_object().unwrap().clone());
    let answer = bridge.request("session/new", request).unwrap_or_else(|e| bridge.fail(&format!("session/new: {e:?}")));
    answer["sessionId"].as_str().unwrap().to_string()
}

/// The probe's one line, as the model received it as the tool's result.
fn probe_line(world: &World) -> String {
    let results = tool_results(&world.server, "mcp", 1);
    results
        .lines()
        .find(|line| line.starts_with("MCP-PROBE"))
        .unwrap_or_else(|| panic!("the probe's answer: {results:?}"))
        .to_string()
}

fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split(' ')
        .find_map(|part| part.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} in {line:?}"))
}

fn stdio_server_inside_the_sandbox(sandbox: &str, backend: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let (server, _key) = probe_server(&world, &ws);
    let mut bridge = world.start_with(world.backend_options(sandbox, backend));
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["mcpCapabilities"], json!({"http": true, "sse": true}), "{init}");
    let sid = new_session_with(&mut bridge, &ws, json!({"mcpServers": [server]}));
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:mcp:probe call the probe", "mcp");
    assert_end_turn(&bridge, &turn);
    let line = probe_line(&world);
    // Exactly the editor's variable over the sandbox's plain base: no model key, no password, no OpenCode setting.
    assert_eq!(field(&line, "given"), "rotide-eht-morf", "{line}");
    let names: Vec<&str> = field(&line, "env").split(',').collect();
    // The editor's variable, the base the bridge keeps for any stdio server, and what Python sets for itself.
    let mut allowed: Vec<&str> = vec!["GIVEN", "LC_CTYPE"];
    allowed.extend(acp_sandbox::agents::mcp::KEPT);
    allowed.extend(acp_sandbox::sandbox::NETWORK_ENV);
    let extra: Vec<&&str> = names.iter().filter(|name| !allowed.contains(name)).collect();
    assert!(extra.is_empty(), "the stdio server got more than the editor's env and the base: {extra:?} in {line}");
    assert!(names.contains(&"GIVEN") && names.contains(&"PATH") && names.contains(&"HOME"), "{line}");
    if sandbox == "bwrap" {
        assert_eq!(field(&line, "key"), "denied:ENOENT", "the planted key is hidden from it: {line}");
        assert_eq!(
            field(&line, "init"),
            "bwrap",
            "it is in the sandbox's PID namespace (bubblewrap is its pid 1): {line}"
        );
    }
    // Its result shows in the editor's tool card.
    let calls = of_kind(&turn.updates, "tool_call");
    assert_eq!(calls.len(), 1, "{:#?}", turn.updates);
    let id = calls[0]["toolCallId"].as_str().unwrap();
    let shown: String = of_kind(&turn.updates, "tool_call_update")
        .iter()
        .filter(|u| u["toolCallId"] == id)
        .flat_map(|u| u["content"].as_array().into_iter().flatten())
        .filter_map(|c| c["content"]["text"].as_str())
        .collect();
    assert!(shown.contains(&line), "the card shows the probe's line: {shown:?}");
    // Nothing the editor gave in a variable is kept: not in the store, not in the bridge's log.
    assert!(line.contains("rotide-eht-morf") && !line.contains("from-the-editor"), "{line}");
    for file in ["acp-sandbox.sqlite3", "acp-sandbox.sqlite3-wal"] {
        let bytes = std::fs::read(world.data.join(file)).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&bytes).contains("from-the-editor"), "{file} holds the variable's value");
    }
    let stored = std::fs::read(world.data.join("acp-sandbox.sqlite3")).unwrap_or_default();
    let wal = std::fs::read(world.data.join("acp-sandbox.sqlite3-wal")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&stored).contains("rotide-eht-morf")
            || String::from_utf8_lossy(&wal).contains("rotide-eht-morf"),
        "the check reads where the store keeps the turn's updates"
    );
    assert!(!bridge.stderr().contains("from-the-editor"), "the log holds the variable's value");
}

#[test]
fn a_stdio_mcp_server_runs_inside_the_sandbox_with_only_the_editors_env_bwrap_serve() {
    let test = "a_stdio_mcp_server_runs_inside_the_sandbox_with_only_the_editors_env_bwrap_serve";
    if bwrap_ok(test) {
        stdio_server_inside_the_sandbox("bwrap", "serve", test);
    }
}

#[test]
fn a_stdio_mcp_server_runs_inside_the_sandbox_with_only_the_editors_env_bwrap_run() {
    let test = "a_stdio_mcp_server_runs_inside_the_sandbox_with_only_the_editors_env_bwrap_run";
    if bwrap_ok(test) {
        stdio_server_inside_the_sandbox("bwrap", "run", test);
    }
}

#[test]
fn a_stdio_mcp_server_gets_only_the_editors_env_none() {
    stdio_server_inside_the_sandbox("none", "serve", "a_stdio_mcp_server_gets_only_the_editors_env_none");
}

/// `tests/fakes/mcp_http.py` on the host's 127.0.0.1; killed when dropped.
struct HttpMcp {
    child: Child,
    port: u16,
    record: PathBuf,
}

impl HttpMcp {
    fn start(dir: &Path) -> HttpMcp {
        let record = dir.join("mcp-http-requests.jsonl");
        let mut child = Command::new("/usr/bin/python3")
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/mcp_http.py"))
            .arg(&record)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(dir.join("mcp-http.log")).unwrap()))
            .spawn()
            .expect("start tests/fakes/mcp_http.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("PORT ").and_then(|p| p.parse().ok()).expect("its port");
        HttpMcp { child, port, record }
    }

    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

impl Drop for HttpMcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_http_mcp_server_is_reached_through_the_proxy_with_its_header_whatever_the_network_allows() {
    let test = "an_http_mcp_server_is_reached_through_the_proxy_with_its_header_whatever_the_network_allows";
    if !bwrap_ok(test) {
        return;
    }
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let http = HttpMcp::start(world.root.path());
    let options = world.backend_options("bwrap", "serve").arg("--network").arg("allow=example.test");
    let mut bridge = world.start_with(options);
    let server = json!({
        "type": "http",
        "name": "web",
        "url": format!("http://127.0.0.1:{}/mcp", http.port),
        "headers": [{"name": "Authorization", "value": "Bearer editor-secret"}]
    });
    let sid = new_session_with(&mut bridge, &ws, json!({"mcpServers": [server]}));
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:mcp:web call the web server", "mcp http");
    assert_end_turn(&bridge, &turn);
    assert!(tool_results(&world.server, "mcp", 1).contains("MCP-HTTP-PROBE"), "{:#?}", world.server.chats("mcp"));
    let calls: Vec<Value> = http.requests().into_iter().filter(|r| r["method"] == "tools/call").collect();
    assert_eq!(calls, [json!({"method": "tools/call", "authorization": "Bearer editor-secret"})]);
    assert!(!bridge.stderr().contains("editor-secret"), "the log holds the header");
}

#[test]
fn the_system_prompt_reaches_the_model_and_survives_a_restart_serve() {
    let test = "the_system_prompt_reaches_the_model_and_survives_a_restart_serve";
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start_with(world.backend_options("none", "serve"));
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"]["systemPrompt"], json!({}), "{init}");
    let system = json!({"mode": "append", "content": [{"type": "text", "text": "SYSTEM-MARKER-7 answer in haiku"}]});
    let sid = new_session_with(&mut bridge, &ws, json!({"systemPrompt": system}));
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:system one", "system");
    assert_end_turn(&bridge, &turn);
    let systems = |world: &World| -> Vec<bool> {
        world
            .server
            .chats("system")
            .iter()
            .map(|r| super::messages_text(r, "system").iter().any(|text| text.contains("SYSTEM-MARKER-7")))
            .collect()
    };
    assert_eq!(systems(&world), [true], "{:#?}", world.server.chats("system"));
    // An override is refused: the bridge cannot replace OpenCode's own instructions.
    let refused = bridge
        .request("session/new", json!({"cwd": ws, "mcpServers": [], "systemPrompt": {"mode": "override", "content": [{"type": "text", "text": "x"}]}}))
        .unwrap_err();
    assert_eq!(
        (refused.code, refused.message.as_str()),
        (-32602, "systemPrompt mode \"override\" is not supported: only append")
    );
    drop(bridge);

    let mut bridge = world.start_with(world.backend_options("none", "serve"));
    bridge.request("session/resume", json!({"sessionId": sid, "cwd": ws, "systemPrompt": system})).unwrap();
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:system two", "system again");
    assert_end_turn(&bridge, &turn);
    assert_eq!(systems(&world), [true, true]);
}

#[test]
fn a_broken_mcp_server_is_a_note_and_after_a_restart_load_with_the_same_servers_brings_the_tool_back() {
    let test = "a_broken_mcp_server_is_a_note_and_after_a_restart_load_with_the_same_servers_brings_the_tool_back";
    if !bwrap_ok(test) {
        return;
    }
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let (probe, _key) = probe_server(&world, &ws);
    let broken = json!({"name": "broken", "command": "/nonexistent/mcp-server", "args": [], "env": []});
    let servers = json!([probe, broken]);
    let mut bridge = world.start_with(world.backend_options("bwrap", "serve"));
    let sid = new_session_with(&mut bridge, &ws, json!({"mcpServers": servers}));
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:mcp:probe first", "mcp with a broken one");
    assert_end_turn(&bridge, &turn);
    let notes: Vec<String> = of_kind(&turn.updates, "agent_message_chunk")
        .iter()
        .filter_map(|u| u["content"]["text"].as_str())
        .filter(|text| text.contains("MCP server"))
        .map(|text| text.trim().to_string())
        .collect();
    // OpenCode's own words for a server whose command is missing (the wrapper's `env` exits at once).
    assert_eq!(
        notes,
        ["_The MCP server `broken` did not start, so its tools are missing: MCP error -32000: Connection closed._"]
    );
    assert_eq!(field(&probe_line(&world), "given"), "rotide-eht-morf");
    drop(bridge);

    // A new bridge knows the servers' shape, not their secrets: the editor's load brings them back.
    let mut bridge = world.start_with(world.backend_options("bwrap", "serve"));
    bridge
        .request("session/load", json!({"sessionId": sid, "cwd": ws, "mcpServers": servers}))
        .unwrap_or_else(|e| bridge.fail(&format!("session/load: {e:?}")));
    bridge.take_updates(&sid);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:mcp:probe again", "mcp after load");
    assert_end_turn(&bridge, &turn);
    // The model's second call after the tool carries both turns' results: the probe answered again.
    let after_tool: Vec<Value> = world.server.chats("mcp").into_iter().filter(|r| r["step"] == 1).collect();
    assert_eq!(after_tool.len(), 2, "{after_tool:#?}");
    let results = super::messages_text(&after_tool[1], "tool").join("\n");
    let lines: Vec<&str> = results.lines().filter(|line| line.starts_with("MCP-PROBE")).collect();
    assert_eq!(lines.len(), 2, "both turns called the probe: {results}");
    assert_eq!(field(lines[1], "given"), "rotide-eht-morf");
}

/// The user messages of the last chat request of `scenario`.
fn last_user_messages(world: &World, scenario: &str) -> String {
    let chats = world.server.chats(scenario);
    let last = chats.last().unwrap_or_else(|| panic!("no {scenario} request"));
    super::messages_text(last, "user").join("\n")
}

fn fork_in_the_shared_sandbox(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start_with(world.backend_options(sandbox, "serve"));
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"]["fork"], json!({}), "{init}");
    let original = bridge.new_session(&ws);
    for text in ["SCENARIO:text FORK-ONE", "SCENARIO:text FORK-TWO"] {
        let turn = timed_prompt(&mut bridge, &original, &ws, text, "before the fork");
        assert_end_turn(&bridge, &turn);
    }
    let forked = bridge
        .request("session/fork", json!({"sessionId": original, "cwd": ws, "mcpServers": []}))
        .unwrap_or_else(|e| bridge.fail(&format!("session/fork: {e:?}")));
    let fork = forked["sessionId"].as_str().unwrap().to_string();
    let replay = bridge.load_session(&fork, &ws);
    let asked: Vec<&str> =
        of_kind(&replay.updates, "user_message_chunk").iter().map(|u| u["content"]["text"].as_str().unwrap()).collect();
    assert_eq!(asked, ["SCENARIO:text FORK-ONE", "SCENARIO:text FORK-TWO"]);

    // The fork's OpenCode session is a fork of the original's: the model sees both earlier turns as messages.
    let turn = timed_prompt(&mut bridge, &fork, &ws, "SCENARIO:followup FORK-THREE", "in the fork");
    assert_end_turn(&bridge, &turn);
    let seen = last_user_messages(&world, "followup");
    assert!(seen.contains("FORK-ONE") && seen.contains("FORK-TWO") && seen.contains("FORK-THREE"), "{seen}");
    assert!(!seen.contains("<earlier-conversation>"), "a forked conversation, not a transcript: {seen}");
    assert!(!turn.agent_text().contains("transcript"), "{:#?}", turn.updates);

    // The original's next prompt does not see the fork's turn.
    let turn = timed_prompt(&mut bridge, &original, &ws, "SCENARIO:followup ORIGINAL-FOUR", "back in the original");
    assert_end_turn(&bridge, &turn);
    let seen = last_user_messages(&world, "followup");
    assert!(seen.contains("FORK-ONE") && seen.contains("ORIGINAL-FOUR"), "{seen}");
    assert!(!seen.contains("FORK-THREE"), "the original saw the fork's turn: {seen}");

    let listed = bridge.request("session/list", json!({"cwd": ws})).unwrap();
    let mut ids: Vec<String> =
        listed["sessions"].as_array().unwrap().iter().map(|s| s["sessionId"].as_str().unwrap().to_string()).collect();
    ids.sort();
    let mut expected = vec![original, fork];
    expected.sort();
    assert_eq!(ids, expected);
}

#[test]
fn a_fork_continues_a_fork_of_the_opencode_session_and_the_original_never_sees_it_none() {
    fork_in_the_shared_sandbox(
        "none",
        "a_fork_continues_a_fork_of_the_opencode_session_and_the_original_never_sees_it_none",
    );
}

#[test]
fn a_fork_continues_a_fork_of_the_opencode_session_and_the_original_never_sees_it_bwrap() {
    let test = "a_fork_continues_a_fork_of_the_opencode_session_and_the_original_never_sees_it_bwrap";
    if bwrap_ok(test) {
        fork_in_the_shared_sandbox("bwrap", test);
    }
}

fn question_turn(
    sandbox: &str,
    test: &str,
    answer: Option<Value>,
) -> Option<(World, super::support::Turn, Vec<Value>)> {
    let world = World::new(test)?;
    let ws = world.workspace("ws");
    let mut bridge = Bridge::spawn(world.backend_options(sandbox, "serve"));
    bridge.elicitation_answer = answer;
    bridge.initialize();
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:question pick a colour", "question");
    assert_end_turn(&bridge, &turn);
    let elicitations = bridge.elicitations.clone();
    Some((world, turn, elicitations))
}

#[test]
fn a_question_of_opencode_is_answered_through_the_editors_form_and_the_model_gets_the_answer_bwrap() {
    let test = "a_question_of_opencode_is_answered_through_the_editors_form_and_the_model_gets_the_answer_bwrap";
    if !bwrap_ok(test) {
        return;
    }
    let answer = json!({"action": "accept", "content": {"q0": "Blue"}});
    let Some((world, turn, elicitations)) = question_turn("bwrap", test, Some(answer)) else { return };
    assert_eq!(elicitations.len(), 1, "{elicitations:#?}");
    let form = &elicitations[0];
    assert_eq!(form["mode"], "form");
    assert_eq!(form["message"], "OpenCode asks: Which colour should the button be?");
    assert_eq!(form["toolCallId"], "call_fake_0_0", "{form}");
    assert_eq!(
        form["requestedSchema"]["properties"]["q0"]["oneOf"],
        json!([{"const": "Red", "title": "Red", "description": "Warm"}, {"const": "Blue", "title": "Blue", "description": "Cool"}])
    );
    assert_eq!(form["requestedSchema"].get("required"), None, "an own answer may stand for the choice: {form}");
    let result = tool_results(&world.server, "question", 1);
    assert!(result.contains(r#""Which colour should the button be?"="Blue""#), "the model got: {result}");
    assert!(turn.agent_text().contains("QUESTION-DONE"), "{:#?}", turn.updates);
    assert!(!turn.agent_text().contains("dismissed"), "{:#?}", turn.updates);
}

#[test]
fn a_question_an_editor_cannot_show_is_dismissed_with_a_note_none() {
    let test = "a_question_an_editor_cannot_show_is_dismissed_with_a_note_none";
    let Some((world, turn, elicitations)) = question_turn("none", test, None) else { return };
    assert!(elicitations.is_empty());
    let notes: Vec<String> = of_kind(&turn.updates, "agent_message_chunk")
        .iter()
        .filter_map(|u| u["content"]["text"].as_str())
        .filter(|text| text.contains("dismissed"))
        .map(|text| text.trim().to_string())
        .collect();
    assert_eq!(
        notes,
        [
            "_OpenCode asked \"Which colour should the button be?\"; this editor cannot show questions, so it was told the question was dismissed._"
        ]
    );
    assert_dismissed(&world, &turn);
}

/// OpenCode ends the turn on a dismissed question: its card fails saying so, and the model is not asked again.
fn assert_dismissed(world: &World, turn: &super::support::Turn) {
    let last =
        of_kind(&turn.updates, "tool_call_update").into_iter().rfind(|u| u["toolCallId"] == "call_fake_0_0").cloned();
    let last = last.unwrap_or_else(|| panic!("the question's card: {:#?}", turn.updates));
    assert_eq!(last["status"], "failed", "{last}");
    assert_eq!(last["content"][0]["content"]["text"], "```\nThe user dismissed this question\n```", "{last}");
    assert_eq!(world.server.chats("question").len(), 1, "the model was asked again");
}

#[test]
fn a_declined_question_is_dismissed_with_a_note_none() {
    let test = "a_declined_question_is_dismissed_with_a_note_none";
    let Some((world, turn, elicitations)) = question_turn("none", test, Some(json!({"action": "decline"}))) else {
        return;
    };
    assert_eq!(elicitations.len(), 1);
    assert!(
        turn.agent_text().contains("no answer was given, so it was told the question was dismissed"),
        "{:#?}",
        turn.updates
    );
    assert_dismissed(&world, &turn);
}

#[test]
fn opencodes_bash_writes_in_an_extra_root_and_not_in_a_directory_not_named_bwrap() {
    let test = "opencodes_bash_writes_in_an_extra_root_and_not_in_a_directory_not_named_bwrap";
    if !bwrap_ok(test) {
        return;
    }
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let root = world.workspace("lib");
    let other = world.workspace("elsewhere");
    let mut bridge = world.start_with(world.backend_options("bwrap", "serve"));
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"]["additionalDirectories"], json!({}), "{init}");
    let sid = new_session_with(&mut bridge, &ws, json!({"additionalDirectories": [root]}));
    let prompt = format!("SCENARIO:rootbash ROOT={} OTHER={}", root.display(), other.display());
    let turn = timed_prompt(&mut bridge, &sid, &ws, &prompt, "bash in the extra root");
    assert_end_turn(&bridge, &turn);
    assert_eq!(std::fs::read_to_string(root.join("made.txt")).unwrap_or_default(), "from-opencode\n");
    assert!(!other.join("made.txt").exists(), "a directory not named was written");
    let first = tool_results(&world.server, "rootbash", 1);
    assert!(first.contains("root-ok"), "{first}");
    let second = tool_results(&world.server, "rootbash", 2);
    assert!(second.contains("exit=1") || second.contains("exit=2"), "the write outside the roots: {second}");
}

#[test]
fn a_question_pending_when_the_turn_is_cancelled_is_a_note_and_the_turn_answers_cancelled_none() {
    let test = "a_question_pending_when_the_turn_is_cancelled_is_a_note_and_the_turn_answers_cancelled_none";
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = Bridge::spawn(world.backend_options("none", "serve"));
    bridge.elicitation_answer = Some(Value::Null);
    bridge.initialize();
    let sid = bridge.new_session(&ws);
    let id = bridge.send_prompt(&sid, "SCENARIO:question nobody answers");
    bridge.wait_elicitations(1, super::TURN_LIMIT);
    bridge.cancel(&sid);
    let turn = super::finish_served_turn(&mut bridge, &sid, id);
    assert_eq!(
        turn.result.as_ref().map(|r| r["stopReason"].clone()).ok(),
        Some(json!("cancelled")),
        "{:?}",
        turn.result
    );
    let notes: Vec<String> = of_kind(&turn.updates, "agent_message_chunk")
        .iter()
        .filter_map(|u| u["content"]["text"].as_str())
        .filter(|text| text.contains("asked"))
        .map(|text| text.trim().to_string())
        .collect();
    assert_eq!(
        notes,
        ["_OpenCode asked \"Which colour should the button be?\"; the turn stopped before an answer came._"]
    );
    // The editor is told to take the form away.
    assert_eq!(bridge.withdrawn, bridge.elicitation_ids, "the question's form was not withdrawn");
    // Stored like every update: the replay shows it too.
    let replay = bridge.load_session(&sid, &ws);
    assert!(
        replay.updates.iter().any(|u| u["content"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("the turn stopped before an answer came"))),
        "{:#?}",
        replay.updates
    );
}

/// Plan mode never edits: an MCP server's tool, which could, is refused like any tool plan mode does not allow
/// (under `auto` nobody is asked, so it does not run).
fn plan_mode_refuses_mcp_tools(backend: &str, test: &str) {
    if !bwrap_ok(test) {
        return;
    }
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let (server, _key) = probe_server(&world, &ws);
    let mut bridge = world.start_with(world.backend_options("bwrap", backend));
    let sid = new_session_with(&mut bridge, &ws, json!({"mcpServers": [server]}));
    bridge
        .request("session/set_config_option", json!({"sessionId": sid, "configId": "mode", "value": "plan"}))
        .unwrap_or_else(|e| bridge.fail(&format!("set mode: {e:?}")));
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:mcp:probe in plan mode", "mcp in plan mode");
    assert_end_turn(&bridge, &turn);
    let results = tool_results(&world.server, "mcp", 1);
    assert!(!results.contains("MCP-PROBE"), "the MCP tool ran in plan mode: {results}");
    let calls = of_kind(&turn.updates, "tool_call_update");
    let last =
        calls.iter().rfind(|u| u["toolCallId"] == "call_fake_0_0").unwrap_or_else(|| panic!("{:#?}", turn.updates));
    assert_eq!(last["status"], "failed", "{last}");
}

#[test]
fn plan_mode_refuses_an_mcp_servers_tool_serve() {
    plan_mode_refuses_mcp_tools("serve", "plan_mode_refuses_an_mcp_servers_tool_serve");
}

#[test]
fn plan_mode_refuses_an_mcp_servers_tool_run() {
    plan_mode_refuses_mcp_tools("run", "plan_mode_refuses_an_mcp_servers_tool_run");
}
