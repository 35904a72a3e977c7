//! `tests/fakes/fake_e2b.py` for the tests that need it (`tests/e2b.rs`, the provider suite): E2B's control plane
//! and envd on two ports of 127.0.0.1, with hooks to look at and fail it.

#![allow(dead_code)] // each test crate uses a different part

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};

use acp_sandbox::sandbox::remote::e2b::{E2bProvider, E2bSettings};
use serde_json::{Value, json};

/// The API key the fake accepts.
pub const KEY: &str = "e2b_0123456789abcdef0123456789abcdef";

/// `tests/fakes/fake_e2b.py` on two free ports; it ends (killing its sandboxes' processes) when dropped.
pub struct FakeE2b {
    child: Child,
    _stdin: ChildStdin,
    api: u16,
    envd: u16,
    pub record: PathBuf,
    pub root: PathBuf,
    _dir: tempfile::TempDir,
}

impl FakeE2b {
    pub fn start() -> FakeE2b {
        Self::start_with(&[])
    }

    /// With more arguments of the fake (`--templates`, `--template-path`).
    pub fn start_with(args: &[&str]) -> FakeE2b {
        let dir = super::support::temp_dir("e2b-fake");
        let root = dir.path().join("sandboxes");
        let record = dir.path().join("requests.jsonl");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/fake_e2b.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg("--root")
            .arg(&root)
            .arg("--record")
            .arg(&record)
            .arg("--api-key")
            .arg(KEY)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python3 tests/fakes/fake_e2b.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let ports: Vec<u16> =
            line.trim().strip_prefix("PORTS ").expect("PORTS line").split(' ').map(|p| p.parse().unwrap()).collect();
        let stdin = child.stdin.take().unwrap();
        FakeE2b { child, _stdin: stdin, api: ports[0], envd: ports[1], record, root, _dir: dir }
    }

    pub fn api_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.api)
    }

    pub fn sandbox_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.envd)
    }

    pub fn settings(&self, key: &str) -> E2bSettings {
        let (api, envd) = (self.api_url(), self.sandbox_url());
        E2bSettings::from_env(|name| match name {
            "E2B_API_KEY" => Some(key.to_string()),
            "E2B_API_URL" => Some(api.clone()),
            "E2B_SANDBOX_URL" => Some(envd.clone()),
            _ => None,
        })
        .unwrap()
    }

    pub fn provider(&self) -> E2bProvider {
        E2bProvider::new(self.settings(KEY)).unwrap()
    }

    /// One request to the fake's test hooks (HTTP/1.1 by hand: the hooks answer small JSON and close).
    pub fn hook(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        use std::io::{Read, Write};
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.api)).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let (head, text) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 20"), "{method} {path}: {answer}");
        if text.is_empty() { Value::Null } else { serde_json::from_str(text).unwrap() }
    }

    /// Every sandbox the fake holds, by id.
    pub fn state(&self) -> Value {
        self.hook("GET", "/_fake/state", None)
    }

    /// The next `count` control-plane requests fail with `status`.
    pub fn fail_next(&self, status: u16, message: &str) {
        self.hook("POST", "/_fake/fail", Some(json!({"status": status, "message": message, "count": 1})));
    }

    pub fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The host directory standing for `path` inside sandbox `id`.
    pub fn host_path(&self, id: &str, path: &str) -> PathBuf {
        self.root.join(id).join(path.trim_start_matches('/'))
    }
}

impl Drop for FakeE2b {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
