//! The stdio framing: no input ends the bridge, every request whose id can be read is answered with that id,
//! and no answer quotes more than an excerpt of what was sent. Ends with a seeded fuzz run over one bridge.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::*;

/// One request line, newline included; `params` is raw JSON (or not JSON at all).
fn request_line(id: i64, method: &str, params: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#)
        .into_bytes()
        .into_iter()
        .chain(*b"\n")
        .collect()
}

/// The size of an error as it went over the wire, near enough.
fn wire_size(error: &RpcError) -> usize {
    error.message.len() + error.data.as_ref().map_or(0, |data| data.to_string().len())
}

/// Every ACP method a client may call on an agent.
const METHODS: [&str; 13] = [
    "initialize",
    "authenticate",
    "session/new",
    "session/load",
    "session/resume",
    "session/list",
    "session/prompt",
    "session/cancel",
    "session/set_config_option",
    "session/set_mode",
    "session/set_model",
    "session/close",
    "session/delete",
];

#[test]
fn invalid_utf8_after_initialize_in_the_same_write_neither_ends_the_bridge_nor_loses_the_initialize() {
    let dirs = TestDirs::new("utf8-after-init");
    let mut bridge = Bridge::spawn(BridgeOptions::new("opencode", &dirs.data));
    let id = bridge.reserve_id("initialize");
    let mut write = request_line(id, "initialize", r#"{"protocolVersion":1,"clientCapabilities":{}}"#);
    write.extend_from_slice(b"\xff\n");
    bridge.send_raw_bytes(&write);

    let init = bridge.wait_response(id).unwrap_or_else(|e| bridge.fail(&format!("initialize failed: {e}")));
    assert_eq!(init["protocolVersion"], 1, "{init}");
    let error = bridge.wait_null_id_error();
    assert_eq!(error.code, -32700, "{error}");

    let ws = dirs.workspace("ws");
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
}

#[test]
fn invalid_utf8_inside_a_request_is_a_parse_error_with_its_id() {
    let dirs = TestDirs::new("utf8-in-request");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let ws = dirs.workspace("ws");
    let id = bridge.reserve_id("session/new");
    let cwd = ws.display().to_string();
    bridge.send_raw_bytes(&request_line(
        id,
        "session/new",
        &format!("{{\"cwd\":\"{cwd}/\u{fffd}\",\"mcpServers\":[]}}"),
    ));
    let line = [
        format!(r#"{{"jsonrpc":"2.0","id":{},"method":"session/new","params":{{"cwd":"{cwd}/"#, id + 1).as_bytes(),
        b"\xc3\x28\xed\xa0\x80",
        br#"","mcpServers":[]}}"#,
        b"\n",
    ]
    .concat();
    let broken = bridge.reserve_id("session/new");
    assert_eq!(broken, id + 1);
    bridge.send_raw_bytes(&line);

    assert!(bridge.wait_response(id).is_ok(), "the replacement character itself is valid UTF-8");
    let error = bridge.wait_response(broken).expect_err("a line that is not UTF-8 cannot succeed");
    assert_eq!(error.code, -32700, "{error}");
    assert!(bridge.is_running());
}

#[test]
fn scalar_and_array_params_are_answered_with_the_request_id() {
    let dirs = TestDirs::new("scalar-params");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    for method in METHODS {
        for params in [r#""x""#, "1", "true", "[]", r#"[{"cwd":"/"}]"#] {
            let id = bridge.reserve_id(method);
            bridge.send_raw_bytes(&request_line(id, method, params));
            let error = bridge.wait_response(id).expect_err(&format!("{method} with params {params} succeeded"));
            assert_eq!(error.code, -32602, "{method} with params {params}: {error}");
        }
    }
    // `null` is no params: what a method without them (session/list) accepts, the others refuse with their id.
    for method in ["initialize", "session/new", "session/load", "session/prompt", "session/resume", "session/close"] {
        let id = bridge.reserve_id(method);
        bridge.send_raw_bytes(&request_line(id, method, "null"));
        let error = bridge.wait_response(id).expect_err(&format!("{method} with null params succeeded"));
        assert_eq!(error.code, -32602, "{method} with null params: {error}");
    }
    let ws = dirs.workspace("ws");
    bridge.new_session(&ws);
}

#[test]
fn a_line_over_the_limit_is_refused_briefly_with_its_id_and_the_bridge_continues() {
    let dirs = TestDirs::new("huge-line");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let id = bridge.reserve_id("session/prompt");
    let text = "a".repeat(70 << 20);
    let params = format!(r#"{{"sessionId":"s","prompt":[{{"type":"text","text":"{text}"}}]}}"#);
    bridge.send_raw_bytes(&request_line(id, "session/prompt", &params));
    drop((text, params));

    let error = bridge.wait_response(id).expect_err("a 70 MiB line cannot succeed");
    assert_eq!(error.code, -32600, "{error}");
    assert!(wire_size(&error) < 1024, "the answer quotes too much: {} bytes", wire_size(&error));
    let ws = dirs.workspace("ws");
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
}

#[test]
fn errors_about_huge_input_under_the_limit_are_short() {
    let dirs = TestDirs::new("huge-garbage");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let mut garbage = vec![b'z'; 50_000_000];
    garbage.push(b'\n');
    bridge.send_raw_bytes(&garbage);
    let error = bridge.wait_null_id_error();
    assert_eq!(error.code, -32700, "{error}");
    assert!(wire_size(&error) < 1024, "a parse error quotes {} bytes", wire_size(&error));

    // Valid JSON of the wrong type: the SDK's own error quotes the params and serde's message quotes the value.
    let big = "y".repeat(50_000_000);
    let id = bridge.reserve_id("session/new");
    bridge.send_raw_bytes(&request_line(id, "session/new", &format!(r#"{{"cwd":5,"mcpServers":"{big}"}}"#)));
    let error = bridge.wait_response(id).expect_err("a cwd of 5 cannot succeed");
    assert_eq!(error.code, -32602, "{error}");
    assert!(wire_size(&error) < 1024, "an invalid-params error quotes {} bytes", wire_size(&error));

    let id = bridge.reserve_id("session/new");
    bridge.send_raw_bytes(&request_line(id, "session/new", &format!(r#"{{"cwd":"{big}","mcpServers":[]}}"#)));
    let error = bridge.wait_response(id).expect_err("a relative cwd cannot succeed");
    assert!(wire_size(&error) < 2048, "the bridge's own error quotes {} bytes", wire_size(&error));

    let id = bridge.reserve_id("session/load");
    bridge.send_raw_bytes(&request_line(
        id,
        "session/load",
        &format!(r#"{{"sessionId":"{big}","cwd":"/","mcpServers":[]}}"#),
    ));
    let error = bridge.wait_response(id).expect_err("an unknown session cannot load");
    assert_eq!(error.code, -32002, "{error}");
    assert!(wire_size(&error) < 2048, "session not found quotes {} bytes", wire_size(&error));

    let id = bridge.reserve_id("x");
    bridge.send_raw_bytes(&request_line(id, &big, "{}"));
    let error = bridge.wait_response(id).expect_err("an unknown method cannot succeed");
    assert_eq!(error.code, -32601, "{error}");
    assert!(wire_size(&error) < 2048, "method not found quotes {} bytes", wire_size(&error));
    assert!(bridge.is_running());
}

#[test]
fn deep_nesting_is_answered_and_does_not_overflow_the_stack() {
    let dirs = TestDirs::new("deep-nesting");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let deep = 100_000;
    for params in ["[".repeat(deep), format!("{}{}", "[".repeat(deep), "]".repeat(deep))] {
        let id = bridge.reserve_id("session/new");
        bridge.send_raw_bytes(&request_line(id, "session/new", &params));
        let error = bridge.wait_response(id).expect_err("100k levels of nesting cannot succeed");
        assert_eq!(error.code, -32700, "{error}");
        assert!(wire_size(&error) < 1024, "{error}");
    }
    bridge.send_raw_bytes(format!("{}\n", "{\"a\":".repeat(deep)).as_bytes());
    assert_eq!(bridge.wait_null_id_error().code, -32700);

    // 127 levels in all, one under serde_json's limit: parsed, then deserialized by the SDK into the request.
    let nested = format!("{}{}", "[".repeat(124), "]".repeat(124));
    let params =
        json!({"cwd": ws, "mcpServers": [], "_meta": {"x": "NESTED"}}).to_string().replace("\"NESTED\"", &nested);
    let id = bridge.reserve_id("session/new");
    bridge.send_raw_bytes(&request_line(id, "session/new", &params));
    let created = bridge.wait_response(id).unwrap_or_else(|e| bridge.fail(&format!("session/new failed: {e}")));
    assert!(created["sessionId"].is_string(), "{created}");
    assert!(bridge.is_running());
}

// ---- fuzzing -------------------------------------------------------------------------------------------------

/// xorshift64*: small, seeded, and the same sequence everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// A random JSON value, nested at most `depth` deep.
    fn value(&mut self, depth: usize) -> Value {
        match self.below(if depth == 0 { 5 } else { 8 }) {
            0 => Value::Null,
            1 => json!(self.chance(50)),
            2 => json!(self.next() as i64 >> self.below(64)),
            3 => json!(f64::from(self.next() as u32) / 7.0),
            4 => json!(
                self.pick(&["", "x", "/", "/tmp", "relative/path", "naïve ✓ 🦀", "\u{0}\n\"\\", "sess-1"]).to_string()
            ),
            5 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
            _ => {
                let keys = [
                    "sessionId",
                    "cwd",
                    "mcpServers",
                    "prompt",
                    "protocolVersion",
                    "configId",
                    "value",
                    "modeId",
                    "cursor",
                    "type",
                    "text",
                    "_meta",
                    "x",
                ];
                Value::Object(
                    (0..self.below(5)).map(|_| (self.pick(&keys).to_string(), self.value(depth - 1))).collect(),
                )
            }
        }
    }

    /// Params for any method: scalars, arrays, wrong-typed and nearly right objects, deep nesting.
    fn params(&mut self) -> String {
        let fixed = [
            r#""x""#,
            "1",
            "-1.5e300",
            "true",
            "false",
            "null",
            "[]",
            "[1]",
            r#"[{"sessionId":"s"}]"#,
            "{}",
            r#"{"sessionId":5}"#,
            r#"{"sessionId":"no-such-session"}"#,
            r#"{"sessionId":null}"#,
            r#"{"cwd":7,"mcpServers":[]}"#,
            r#"{"cwd":"relative","mcpServers":[]}"#,
            r#"{"cwd":"/no/such/dir","mcpServers":{}}"#,
            r#"{"sessionId":"no-such-session","prompt":"hi"}"#,
            // An id that is a path: nothing may be made there (`/acp-sandbox-fuzz-escape.lock` is checked below).
            r#"{"sessionId":"/acp-sandbox-fuzz-escape","prompt":[{"type":"text","text":"hi"}]}"#,
            r#"{"sessionId":"no-such-session","prompt":[{"type":"text","text":"hi"}]}"#,
            r#"{"sessionId":"no-such-session","prompt":[{"type":"nope"}]}"#,
            r#"{"protocolVersion":"one"}"#,
            r#"{"protocolVersion":1,"clientCapabilities":5}"#,
            r#"{"sessionId":"no-such-session","configId":1,"value":[]}"#,
            r#"{"sessionId":"no-such-session","modeId":"x"}"#,
            r#"{"cursor":"!!!"}"#,
            r#"{"cursor":5}"#,
            r#"{"methodId":[]}"#,
            r#"{"sessionId":"\ud800"}"#,
            r#"{"sessionId":"a\u0000b"}"#,
        ];
        match self.below(10) {
            0..=5 => self.pick(&fixed).to_string(),
            6 | 7 => self.value(4).to_string(),
            8 => {
                // Nested deeper than serde_json's limit of 128, or just under it.
                let depth = if self.chance(50) { 125 } else { 129 + self.below(5000) };
                format!(r#"{{"sessionId":{}{}}}"#, "[".repeat(depth), "]".repeat(depth))
            }
            _ => {
                let mut params = json!({"sessionId": "no-such-session", "cwd": "/no/such/dir", "mcpServers": []});
                params[self.pick(&["prompt", "value", "_meta", "cursor"])] = self.value(3);
                params.to_string()
            }
        }
    }
}

/// What the bridge owes the test for one line.
enum Owed {
    /// Exactly one answer with this id.
    Answer(i64),
    /// Nothing with an id: at most an error with `id: null`.
    Nothing,
}

/// One fuzz case: its bytes (a whole line, newline included) and what it is owed.
fn case(rng: &mut Rng, bridge: &mut Bridge, next_unreserved: &mut i64) -> (Vec<u8>, Owed) {
    let method = *rng.pick(&METHODS);
    match rng.below(20) {
        // Well-formed requests with wrong, odd or random params (the last arm too).
        0..=6 => {
            let id = bridge.reserve_id(method);
            (request_line(id, method, &rng.params()), Owed::Answer(id))
        }
        // Not UTF-8 inside a string: still a request with a readable id.
        7 | 8 => {
            let id = bridge.reserve_id(method);
            let bad: &[u8] =
                rng.pick::<&[u8]>(&[b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"]);
            let line = [
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{"sessionId":"a"#).as_bytes(),
                bad,
                br#"b"}}"#,
                b"\n",
            ]
            .concat();
            (line, Owed::Answer(id))
        }
        // Cut short: readable when the cut comes after the comma that ends the id.
        9 | 10 => {
            *next_unreserved += 1;
            let id = *next_unreserved;
            let mut line = request_line(id, method, &rng.params());
            line.pop();
            let cut = 1 + rng.below(line.len() - 1);
            line.truncate(cut);
            line.push(b'\n');
            let id_end = format!(r#"{{"jsonrpc":"2.0","id":{id}"#).len();
            if cut > id_end {
                bridge.reserve_this_id(id, method);
                (line, Owed::Answer(id))
            } else {
                (line, Owed::Nothing)
            }
        }
        // Random bytes, newlines excepted.
        11 | 12 => {
            let len = rng.below(300);
            let mut line: Vec<u8> = rng.bytes(len).into_iter().map(|b| if b == b'\n' { b' ' } else { b }).collect();
            line.push(b'\n');
            (line, Owed::Nothing)
        }
        // JSON-ish soup without an "id" key.
        13 => {
            let tokens = [
                "{",
                "}",
                "[",
                "]",
                "\"",
                ":",
                ",",
                "1",
                "true",
                "null",
                "\"a\"",
                "\"jsonrpc\"",
                "\"2.0\"",
                "\"method\"",
                "\\",
                " ",
                "\r",
            ];
            let mut line: String = (0..rng.below(60)).map(|_| *rng.pick(&tokens)).collect();
            line.push('\n');
            (line.into_bytes(), Owed::Nothing)
        }
        // Unreadable ids, batches, responses and notifications: nothing to answer by id.
        14 | 15 => {
            *next_unreserved += 1;
            let id = *next_unreserved;
            let line = match rng.below(8) {
                0 => format!(r#"{{"jsonrpc":"2.0","id":{id}.5,"method":"{method}","params":{{}}}}"#),
                1 => format!(r#"{{"jsonrpc":"2.0","id":true,"method":"{method}","params":{{}}}}"#),
                2 => format!(r#"{{"jsonrpc":"2.0","id":{{"n":{id}}},"method":"{method}"}}"#),
                3 => format!(r#"{{"jsonrpc":"2.0","id":99999999999999999999{id},"method":"{method}"}}"#),
                4 => format!(r#"[{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}]"#),
                5 => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{}}}"#, rng.value(2)),
                6 => format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":1,"message":"m"}}}}"#),
                _ => format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{}}}"#, rng.params()),
            };
            (format!("{line}\n").into_bytes(), Owed::Nothing)
        }
        // Broken envelopes around a readable id: answered with it.
        16 => {
            let id = bridge.reserve_id(method);
            let line = match rng.below(4) {
                0 => format!(r#"{{"jsonrpc":"1.0","id":{id},"method":"{method}","params":{{}}}}"#),
                1 => format!(r#"{{"id":{id},"method":"{method}","params":{{}}}}"#),
                2 => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":5}}"#),
                _ => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}} trailing"#),
            };
            (format!("{line}\n").into_bytes(), Owed::Answer(id))
        }
        // Deep nesting outside any request, blank lines, CRLF.
        17 => {
            let line = match rng.below(3) {
                0 => "[".repeat(1 + rng.below(100_000)),
                1 => " \t ".to_string(),
                _ => "{\"a\":".repeat(1 + rng.below(50_000)),
            };
            (format!("{line}\r\n").into_bytes(), Owed::Nothing)
        }
        // Big lines under the limit, sized 1 B to 1 MiB on a log scale: a long prompt or a long garbage run.
        18 => {
            let size = 1 << rng.below(21);
            if rng.chance(50) {
                let id = bridge.reserve_id("session/prompt");
                let params = format!(
                    r#"{{"sessionId":"no-such-session","prompt":[{{"type":"text","text":"{}"}}]}}"#,
                    "w".repeat(size)
                );
                (request_line(id, "session/prompt", &params), Owed::Answer(id))
            } else {
                let mut line = vec![b'q'; size];
                line.push(b'\n');
                (line, Owed::Nothing)
            }
        }
        _ => {
            let id = bridge.reserve_id(method);
            (request_line(id, method, &rng.params()), Owed::Answer(id))
        }
    }
}

#[test]
fn fuzzed_input_never_ends_the_bridge_and_every_readable_request_is_answered_once() {
    let seed = std::env::var("ACP_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_acb5_a11d_0001u64);
    eprintln!("fuzz seed {seed:#x} (set ACP_FUZZ_SEED to replay)");
    let mut rng = Rng(seed | 1);
    let dirs = TestDirs::new("fuzz");
    let options = BridgeOptions::new("opencode", &dirs.data).env("RUST_LOG", "warn,agent_client_protocol=error");
    let mut bridge = Bridge::start(options);
    let started = Instant::now();

    let (batches, per_batch) = (100, 100);
    let mut owed = Vec::new();
    // Ids the test never reserves: an answer to one fails the harness at once.
    let mut next_unreserved = 10_000_000;
    for batch in 0..batches {
        let mut write = Vec::new();
        for _ in 0..per_batch {
            let (line, expect) = case(&mut rng, &mut bridge, &mut next_unreserved);
            write.extend_from_slice(&line);
            if let Owed::Answer(id) = expect {
                owed.push(id);
            }
        }
        if batch == batches / 2 {
            // One line over the limit, its id first, in the middle of everything else.
            let id = bridge.reserve_id("session/new");
            write.extend_from_slice(&request_line(
                id,
                "session/new",
                &format!(r#"{{"x":"{}"}}"#, "h".repeat(65 << 20)),
            ));
            owed.push(id);
        }
        bridge.send_raw_bytes(&write);
        assert!(bridge.is_running(), "the bridge exited during batch {batch} (seed {seed:#x})");
    }

    for id in &owed {
        // Each answer is checked as it arrives: valid JSON-RPC 2.0, the schema of its method, never a second one.
        let _ = bridge.wait_response(*id);
    }
    let list = bridge.request("session/list", json!({}));
    assert!(list.is_ok(), "the bridge no longer serves: {list:?}");
    let escaped = std::path::Path::new("/acp-sandbox-fuzz-escape.lock");
    assert!(!escaped.exists(), "a session id became a path: {} was made", escaped.display());
    assert!(bridge.is_running(), "the bridge exited (seed {seed:#x})");
    eprintln!("{} cases, {} answers owed, in {:?}", batches * per_batch, owed.len(), started.elapsed());

    bridge.close_stdin();
    bridge.drain_stdout(RECV_TIMEOUT);
    let status = bridge.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| bridge.fail("no exit on stdin EOF"));
    assert_eq!(status.code(), Some(0), "exit status on stdin EOF: {status}");
}
