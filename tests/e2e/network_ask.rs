//! `--network ask` under bubblewrap: a connection to a host outside the list becomes a permission card in the
//! editor, answered allow once, always (kept across a restart) or refuse; a cancel withdraws an open question.
//!
//! There is no internet here: the bridge is given `HTTPS_PROXY` (its own corporate proxy, which it uses for the
//! public hosts it allows) pointing at [`UpstreamProxy`], which records each `CONNECT` and echoes what comes through.
//! The targets are public IP literals, so no lookup is needed. Skipped where bubblewrap does not work: the proxy
//! is the sandbox's only way out only in a network namespace of its own (with `--sandbox none` there is no proxy).

use serde_json::{Value, json};

use crate::support::*;

/// A bridge under `--network ask=listed.example` and bubblewrap, with a session.
struct Lab {
    dirs: TestDirs,
    ws: std::path::PathBuf,
    upstream: UpstreamProxy,
    bridge: Bridge,
    sid: String,
}

impl Lab {
    /// `None` (the test skipped, saying why) where bubblewrap does not work.
    fn start(test: &str) -> Option<Lab> {
        if let Err(why) = bwrap_usable() {
            eprintln!("SKIPPED {test}: {why}");
            return None;
        }
        let dirs = TestDirs::new("net-ask");
        let ws = dirs.workspace("ws");
        let upstream = UpstreamProxy::start();
        let mut bridge = Bridge::start(options(&dirs, &upstream));
        let sid = bridge.new_session(&ws);
        Some(Lab { dirs, ws, upstream, bridge, sid })
    }
}

fn options(dirs: &TestDirs, upstream: &UpstreamProxy) -> BridgeOptions {
    BridgeOptions::new("opencode", &dirs.data)
        .sandbox("bwrap")
        .arg("--network")
        .arg("ask=listed.example")
        .env("HTTPS_PROXY", &format!("http://127.0.0.1:{}", upstream.port))
}

/// The `connect` ops' results of a turn of the fake's `files` scenario, in order.
fn connected(turn: &Turn) -> Vec<String> {
    let text = turn.agent_text();
    let read = text.rsplit("READ ").next().unwrap_or_default();
    read.split("; ").map(str::to_string).collect()
}

fn connects(targets: &[&str]) -> String {
    ops(Value::Array(targets.iter().map(|target| json!(["connect", target, "ping"])).collect()))
}

/// The title and option kinds of each permission request from `from` on.
fn asked(bridge: &Bridge, from: usize) -> Vec<(String, Vec<String>)> {
    bridge.permission_requests[from..]
        .iter()
        .map(|request| {
            let kinds = request["options"].as_array().unwrap().iter();
            (
                request["toolCall"]["title"].as_str().unwrap_or_default().to_string(),
                kinds.map(|option| option["kind"].as_str().unwrap().to_string()).collect(),
            )
        })
        .collect()
}

fn card(target: &str) -> (String, Vec<String>) {
    (format!("Connect to {target}"), ["allow_once", "allow_always", "reject_once"].map(String::from).to_vec())
}

#[test]
fn ask_asks_once_per_new_host_and_always_holds_for_the_thread_across_a_restart() {
    let Some(Lab { dirs, ws, upstream, mut bridge, sid }) =
        Lab::start("ask_asks_once_per_new_host_and_always_holds_for_the_thread_across_a_restart")
    else {
        return;
    };

    // Refused: the tool gets the proxy's 403, nothing goes out, and the log says why.
    bridge.permission_answer = Some("reject_once".into());
    let turn = bridge.prompt(&sid, &connects(&["203.0.113.9:443"]));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(
        connected(&turn),
        ["203.0.113.9:443=403 acp-sandbox: access to 203.0.113.9:443 is blocked: refused by the user"]
    );
    assert_eq!(asked(&bridge, 0), [card("203.0.113.9:443")]);
    assert_eq!(bridge.permission_requests[0]["sessionId"], sid.as_str());
    let cards: Vec<&Value> = turn.updates.iter().filter(|u| u["title"] == "Connect to 203.0.113.9:443").collect();
    assert_eq!(cards.len(), 1, "{:#?}", turn.updates);
    // A status left out is pending (ACP's default).
    let status = cards[0]["status"].as_str().unwrap_or("pending");
    assert_eq!((cards[0]["sessionUpdate"].as_str(), status), (Some("tool_call"), "pending"));
    let id = cards[0]["toolCallId"].clone();
    let closed: Vec<&Value> =
        turn.updates.iter().filter(|u| u["toolCallId"] == id && u["sessionUpdate"] == "tool_call_update").collect();
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0]["status"], "failed");
    assert!(upstream.seen().is_empty(), "a refused host was reached: {:?}", upstream.seen());
    let logged = format!(
        "proxy denied CONNECT 203.0.113.9:443 for session {sid}: refused by the user (--network ask=listed.example)"
    );
    assert!(bridge.stderr().contains(&logged), "not logged: {logged}");

    // Allowed once: asked again for the next connection.
    bridge.permission_answer = Some("allow_once".into());
    let turn = bridge.prompt(&sid, &connects(&["203.0.113.10:443", "203.0.113.10:443"]));
    assert_eq!(connected(&turn), ["203.0.113.10:443=200 ping", "203.0.113.10:443=200 ping"]);
    assert_eq!(asked(&bridge, 1), [card("203.0.113.10:443"), card("203.0.113.10:443")]);
    assert_eq!(upstream.seen(), ["CONNECT 203.0.113.10:443 HTTP/1.1"; 2]);

    // Always: asked once; another port of the same host is another question; a listed host is never asked
    // (there is no DNS here: its lookup fails after the policy let it through).
    bridge.permission_answer = Some("allow_always".into());
    let turn = bridge
        .prompt(&sid, &connects(&["203.0.113.11:443", "203.0.113.11:443", "203.0.113.11:8443", "listed.example:443"]));
    let results = connected(&turn);
    assert_eq!(results[..3], ["203.0.113.11:443=200 ping", "203.0.113.11:443=200 ping", "203.0.113.11:8443=200 ping"]);
    assert!(results[3].starts_with("listed.example:443=502 "), "{results:?}");
    assert_eq!(asked(&bridge, 3), [card("203.0.113.11:443"), card("203.0.113.11:8443")]);

    // After a restart, the thread's "always" holds; anything else is still asked.
    drop(bridge);
    let mut bridge = Bridge::start(options(&dirs, &upstream));
    bridge.load_session(&sid, &ws).result.unwrap();
    bridge.permission_answer = Some("reject_once".into());
    let turn = bridge.prompt(&sid, &connects(&["203.0.113.11:443", "203.0.113.10:443"]));
    assert_eq!(
        connected(&turn),
        [
            "203.0.113.11:443=200 ping",
            "203.0.113.10:443=403 acp-sandbox: access to 203.0.113.10:443 is blocked: refused by the user"
        ]
    );
    assert_eq!(asked(&bridge, 0), [card("203.0.113.10:443")]);

    // Another thread does not get this one's "always".
    let other = bridge.new_session(&ws);
    let turn = bridge.prompt(&other, &connects(&["203.0.113.11:443"]));
    assert_eq!(
        connected(&turn),
        ["203.0.113.11:443=403 acp-sandbox: access to 203.0.113.11:443 is blocked: refused by the user"]
    );
    assert_eq!(bridge.permission_requests[1]["sessionId"], other.as_str());
}

#[test]
fn a_question_open_when_the_turn_is_cancelled_is_withdrawn_and_the_connection_refused() {
    let Some(Lab { dirs: _dirs, upstream, mut bridge, sid, .. }) =
        Lab::start("a_question_open_when_the_turn_is_cancelled_is_withdrawn_and_the_connection_refused")
    else {
        return;
    };
    bridge.hold_permissions = true;
    let prompt = bridge.send_prompt(&sid, &connects(&["203.0.113.12:443"]));
    bridge.wait_permission_requests(1, RECV_TIMEOUT);
    assert_eq!(asked(&bridge, 0), [card("203.0.113.12:443")]);
    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, prompt);
    assert_eq!(turn.stop_reason(), "cancelled");
    assert_eq!(bridge.withdrawn, bridge.permission_ids, "the open question was not withdrawn");
    let id = bridge.permission_requests[0]["toolCall"]["toolCallId"].clone();
    let closed: Vec<&Value> =
        turn.updates.iter().filter(|u| u["toolCallId"] == id && u["sessionUpdate"] == "tool_call_update").collect();
    assert_eq!(closed.len(), 1, "{:#?}", turn.updates);
    assert_eq!(closed[0]["status"], "failed");
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
}

#[test]
fn without_a_network_of_its_own_the_bridge_says_that_nothing_is_asked() {
    let dirs = TestDirs::new("net-ask-none");
    let options = BridgeOptions::new("opencode", &dirs.data).sandbox("none").arg("--network").arg("ask");
    let bridge = Bridge::start(options);
    let warning = " WARN acp_sandbox::session: --network ask: the sandboxes have no network of their own behind the \
                   bridge's proxy here, so nothing is asked\n";
    // Logged before `initialize` is answered; its stderr is read by a thread of its own.
    assert!(wait_until(RECV_TIMEOUT, || bridge.stderr().contains(warning)), "{}", bridge.stderr());
}
