//! `tests/fakes/fake_daytona.py` for the tests that need it (`tests/daytona.rs`, the provider suite): Daytona's
//! API and toolbox on a port of 127.0.0.1, its sandboxes as directories of this machine.

#![allow(dead_code)] // each test crate uses a different part

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use acp_sandbox::sandbox::remote::daytona::api::Endpoint;
use acp_sandbox::sandbox::remote::daytona::{DaytonaProvider, DaytonaSettings};
use serde_json::Value;

/// The API key the fake accepts.
pub const KEY: &str = "dtn_fake_key_0123456789";

/// A fresh directory for one test, outside /tmp (see the guide: /tmp need not be visible everywhere).
pub fn test_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("daytona").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `tests/fakes/fake_daytona.py` on a free port; killed when dropped.
pub struct FakeDaytona {
    child: Child,
    pub port: u16,
    pub root: PathBuf,
    pub record: PathBuf,
}

impl FakeDaytona {
    pub fn start(dir: &Path) -> FakeDaytona {
        Self::start_with(dir, &[])
    }

    pub fn start_with(dir: &Path, flags: &[&str]) -> FakeDaytona {
        Self::start_in(dir, flags, &std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
    }

    /// With `path` as the PATH of its sandboxes' commands (a snapshot's own PATH).
    pub fn start_in(dir: &Path, flags: &[&str], path: &str) -> FakeDaytona {
        let root = dir.join("sandboxes");
        let record = dir.join("requests.jsonl");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/fake_daytona.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg("--root")
            .arg(&root)
            .arg("--api-key")
            .arg(KEY)
            .arg("--record")
            .arg(&record)
            .args(flags)
            .env_remove("DAYTONA_API_KEY")
            .env("PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(dir.join("fake-daytona.log")).unwrap()))
            .spawn()
            .expect("start python3 tests/fakes/fake_daytona.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("the fake did not say its port: {line:?}"));
        FakeDaytona { child, port, root, record }
    }

    pub fn api_url(&self) -> String {
        format!("http://127.0.0.1:{}/api", self.port)
    }

    pub fn provider(&self, key: &str) -> DaytonaProvider {
        DaytonaProvider::new(DaytonaSettings {
            endpoint: Endpoint { api_url: self.api_url(), api_key: key.into(), organization_id: None },
            snapshot: Some("daytona-small".into()),
            target: None,
            auto_stop_minutes: 30,
        })
        .unwrap()
    }

    /// Every request so far: `{method, path, auth, org, sdk, split, body}`.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The requests but the SDKs' Socket.IO probes (there is no gateway here: they get 404 and poll instead).
    pub fn sdk_calls(&self) -> Vec<Value> {
        self.requests().into_iter().filter(|r| !r["path"].as_str().unwrap().contains("socket.io")).collect()
    }

    /// What the control plane says about a sandbox, asked directly.
    pub async fn state(&self, id: &str) -> String {
        let response = reqwest::Client::new()
            .get(format!("{}/sandbox/{id}", self.api_url()))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        let info: Value = response.json().await.unwrap();
        info["state"].as_str().unwrap().to_string()
    }
}

impl Drop for FakeDaytona {
    fn drop(&mut self) {
        // Closing its stdin makes the fake kill every command it still runs (they are process groups of their
        // own, which a SIGKILL of the fake would leave behind), then exit.
        drop(self.child.stdin.take());
        for _ in 0..100 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
