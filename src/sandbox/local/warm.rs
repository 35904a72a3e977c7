//! Servers kept warm past their bridge (`--keep-warm`): the record each leaves in the bridge's private run dir, by
//! which the next bridge adopts it, `doctor` lists it, and a bridge with other settings stops it.
//!
//! A record names the server's root process (pid and start time, so that a reused pid is never taken for it), its
//! door, the directory its proxy's socket is served in (the next bridge serves it there again: the sandbox has the
//! directory mounted, not the socket), its secret (the server's password), and digests of the command and of the
//! bridge's sandbox settings it was started with: a command or settings that differ never adopt it. The run dir is
//! the bridge's own (0700, never mounted into a sandbox) and each record is written 0600.
//!
//! A record is still only believed for what a bridge itself makes: one left by a crashed bridge, or planted where
//! the data dir is writable, must not make the next bridge delete, signal or connect to whatever it names. So a
//! record is read only when it is the bridge user's own regular file and names only paths a bridge makes there (its
//! door and proxy directory in the run dir, cgroups under an `acp-sandbox` group), and its process counts as the
//! server only when that process carries [`MARK_VAR`]: a digest of the record's secret, set by the bridge that
//! started it. Anything else is only forgotten: its record removed, nothing it names touched.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sandbox::ExecSpec;

/// What makes a server kept warm: the bridge's key for it, how long it outlives its last bridge, its secret.
#[derive(Clone)]
pub struct KeepWarm {
    /// The bridge's key of the server (its sandbox and profile): one kept server per key.
    pub key: String,
    /// How long it runs on once no bridge uses it.
    pub linger: Duration,
    /// What the adopting bridge needs to talk to it (the server's password), kept in the record.
    pub secret: String,
}

impl std::fmt::Debug for KeepWarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepWarm").field("key", &self.key).field("linger", &self.linger).finish_non_exhaustive()
    }
}

/// A kept-warm server, as its record in the run dir says.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    /// The bridge's key of the server.
    pub key: String,
    /// The name of its sandbox (the state dir's).
    pub sandbox: String,
    /// The workspace it serves, for `doctor`.
    pub workspace: PathBuf,
    /// The digest of the command and the settings ([`fingerprint`]).
    pub fingerprint: String,
    /// The digest of the bridge's sandbox settings alone ([`settings_digest`]).
    pub settings: String,
    /// Its root process.
    pub pid: i32,
    /// When that started (`/proc/<pid>/stat`, clock ticks since boot).
    pub start: u64,
    /// The host end of its door.
    pub door: PathBuf,
    /// Where its proxy's socket is served, when it has one.
    pub proxy_socket: Option<PathBuf>,
    /// Its cgroups, removed once it is gone.
    pub cgroups: Vec<PathBuf>,
    /// The server's secret.
    pub secret: String,
    /// How long it outlives its last bridge, in seconds.
    pub linger_secs: u64,
    /// When it was started (ms since the epoch).
    pub started_ms: i64,
}

impl Record {
    /// Whether its root process still runs: the same process (its start time) and the server a bridge started
    /// (it carries the mark of this record's secret), not some other process a record names.
    pub fn alive(&self) -> bool {
        crate::sandbox::process::start_time(self.pid) == Some(self.start) && carries_mark(self.pid, &self.secret)
    }
}

/// The variable a kept server's root process is started with: [`mark`] of its secret.
pub const MARK_VAR: &str = "ACP_SANDBOX_KEPT";

/// A digest of a kept server's secret, by which its process is told from any other (the secret itself stays out
/// of the environment, which the sandbox's tools may read).
pub fn mark(secret: &str) -> String {
    digest_hex(&format!("acp-sandbox kept-warm server {secret}"))
}

/// Whether the process `pid` was started with the mark of `secret` (its environment as it was started with).
fn carries_mark(pid: i32, secret: &str) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { return false };
    let expected = format!("{MARK_VAR}={}", mark(secret));
    environ.split(|byte| *byte == 0).any(|entry| entry == expected.as_bytes())
}

/// Whether `record`, read from `path`, names only what a bridge makes in `run_dir`: its own record file, a door of
/// the run dir, its key's proxy directory, cgroups of an `acp-sandbox` group.
fn made_here(run_dir: &Path, path: &Path, record: &Record) -> bool {
    let door = record.door.parent() == Some(run_dir)
        && record.door.file_name().and_then(|name| name.to_str()).is_some_and(|name| {
            name.strip_suffix(".door")
                .is_some_and(|stem| stem.len() == 12 && stem.bytes().all(|b| b.is_ascii_hexdigit()))
        });
    let proxy = record.proxy_socket.as_ref().is_none_or(|socket| *socket == proxy_socket(run_dir, &record.key));
    let cgroups = record.cgroups.iter().all(|dir| {
        dir.starts_with("/sys/fs/cgroup")
            && dir
                .components()
                .all(|part| matches!(part, std::path::Component::RootDir | std::path::Component::Normal(_)))
            // `<base>/acp-sandbox/<session>/<command>`: a command's group inside its session's.
            && dir.ancestors().nth(2).and_then(Path::file_name).is_some_and(|name| name == "acp-sandbox")
    });
    door && proxy && cgroups && record_path(run_dir, &record.key) == path
}

/// Where the records are.
pub fn records_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("warm")
}

/// A short, path-safe name for a key (keys hold spaces and a profile).
fn digest_hex(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The record of `key`.
pub fn record_path(run_dir: &Path, key: &str) -> PathBuf {
    records_dir(run_dir).join(format!("{}.json", &digest_hex(key)[..16]))
}

/// Where the proxy of the server of `key` serves its socket: a directory of its own, mounted into the sandbox, so
/// that a bridge that adopts the server can serve a new socket where the sandbox looks. Short: a socket's path is.
pub fn proxy_socket(run_dir: &Path, key: &str) -> PathBuf {
    run_dir.join(format!("{}.n", &digest_hex(key)[..11])).join("s")
}

/// Writes `record` (0600, replacing the one of its key at once).
pub fn write(run_dir: &Path, record: &Record) -> std::io::Result<()> {
    let dir = records_dir(run_dir);
    crate::paths::create_private_dir(run_dir)?;
    crate::paths::create_private_dir(&dir)?;
    let path = record_path(run_dir, &record.key);
    let partial = path.with_extension(format!("json.{}", std::process::id()));
    let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&partial)?;
    file.write_all(&bytes)?;
    drop(file);
    std::fs::rename(&partial, &path)
}

/// The record of `key`, when there is a readable one a bridge made ([`list`] says which).
pub fn read(run_dir: &Path, key: &str) -> Option<Record> {
    let path = record_path(run_dir, key);
    let record = read_file(&path)?;
    if made_here(run_dir, &path, &record) {
        return Some(record);
    }
    tracing::warn!(record = %path.display(), "forgetting a kept-warm record that names what no bridge made");
    let _ = std::fs::remove_file(&path);
    None
}

/// The record at `path` when it is the bridge user's own regular file (a link is never followed) and parses.
fn read_file(path: &Path) -> Option<Record> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return None;
    }
    serde_json::from_reader(std::io::BufReader::new(file)).ok()
}

/// Every readable record a bridge made. One that cannot be read, or that names what no bridge makes (a door or a
/// cgroup elsewhere), is removed and nothing it names is touched (a server it named is ended by its own linger).
pub fn list(run_dir: &Path) -> Vec<Record> {
    let Ok(entries) = std::fs::read_dir(records_dir(run_dir)) else { return Vec::new() };
    let mut records = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|ext| ext != "json") {
            continue;
        }
        match read_file(&path) {
            Some(record) if made_here(run_dir, &path, &record) => records.push(record),
            _ => {
                tracing::warn!(record = %path.display(), "forgetting a kept-warm record no bridge made");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    records.sort_by(|a, b| a.key.cmp(&b.key));
    records
}

/// One line per kept server that runs, for `doctor`: its workspace, pid, start and linger.
pub fn describe(run_dir: &Path) -> Vec<String> {
    list(run_dir)
        .into_iter()
        .filter(Record::alive)
        .map(|record| {
            let started = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(record.started_ms).unwrap_or(0));
            format!(
                "{}: pid {}, started {}, ends {} s after its last bridge let go of it",
                record.workspace.display(),
                record.pid,
                humantime::format_rfc3339_seconds(started),
                record.linger_secs
            )
        })
        .collect()
}

/// Removes what `record` left in the run dir (the record, the door, the proxy's directory) and its cgroups; for a
/// server that is gone.
pub fn forget(run_dir: &Path, record: &Record) {
    let path = record_path(run_dir, &record.key);
    // Only its own record: a newer server of the key may have replaced it meanwhile.
    if read_file(&path).is_some_and(|current| current.pid == record.pid && current.start == record.start) {
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::remove_file(&record.door);
    if let Some(socket) = &record.proxy_socket {
        let _ = std::fs::remove_file(socket);
        if let Some(dir) = socket.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
    for cgroup in &record.cgroups {
        let _ = std::fs::remove_dir(cgroup);
    }
}

/// Ends the server of `record` (its whole tree) and forgets it.
pub fn stop(run_dir: &Path, record: &Record) {
    if record.alive()
        && let Ok(pid) = u32::try_from(record.pid)
    {
        crate::sandbox::process::kill_tree(pid);
    }
    forget(run_dir, record);
}

/// A digest of everything the bridge's local sandboxes are made of (isolation, policy, network, limits): a kept
/// server made under other settings is never adopted, and a serving bridge with other settings stops it.
pub fn settings_digest(settings: &super::LocalSettings) -> String {
    digest_hex(&format!("{settings:?}"))
}

/// A digest of the command a kept server runs and the settings of its sandbox: adopting is for the same command
/// only (the same program, arguments, environment — its model credentials included —, mounts and network). The
/// server's port and secret are left out: they are the server's, not what it was asked to be.
pub fn fingerprint(spec: &ExecSpec, settings: &str) -> String {
    let secret = spec.keep_warm.as_ref().map(|keep| keep.secret.as_str());
    let port = spec.serve_port.map(|port| port.to_string());
    let args: Vec<&str> =
        spec.args.iter().map(|arg| if Some(arg) == port.as_ref() { "<port>" } else { arg.as_str() }).collect();
    let mut env: Vec<(&str, &str)> = spec
        .env
        .iter()
        .filter(|(_, value)| Some(value.as_str()) != secret)
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    env.sort();
    let described = serde_json::json!({
        "settings": settings,
        "program": spec.program,
        "args": args,
        "env": env,
        "cwd": spec.cwd,
        "stdin": String::from_utf8_lossy(&spec.stdin),
        "read_only": spec.read_only,
        "tools": spec.tools,
        "endpoints": spec.net.endpoints,
        "service_hosts": spec.net.service_hosts,
    });
    digest_hex(&described.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for a kept server's root process; `marked` as the bridge starts one.
    struct Server(std::process::Child);

    impl Server {
        fn start(marked: bool) -> Server {
            let mut command = std::process::Command::new("sleep");
            command.arg("60");
            if marked {
                command.env(MARK_VAR, mark("s3cret"));
            }
            let server = Server(command.spawn().unwrap());
            // Its environment is the new program's once it runs `sleep`, not the test's.
            while std::fs::read_link(format!("/proc/{}/exe", server.pid())).is_ok_and(|exe| !exe.ends_with("sleep")) {
                std::thread::sleep(Duration::from_millis(5));
            }
            server
        }

        fn pid(&self) -> i32 {
            i32::try_from(self.0.id()).unwrap()
        }

        fn runs(&mut self) -> bool {
            self.0.try_wait().unwrap().is_none()
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn record(run: &Path, key: &str, server: &Server) -> Record {
        Record {
            key: key.into(),
            sandbox: "workspace-0011".into(),
            workspace: "/ws".into(),
            fingerprint: "f".into(),
            settings: "s".into(),
            pid: server.pid(),
            start: crate::sandbox::process::start_time(server.pid()).unwrap(),
            door: run.join("0123456789ab.door"),
            proxy_socket: Some(proxy_socket(run, key)),
            cgroups: vec!["/sys/fs/cgroup/user.slice/acp-sandbox/workspace-0011/3".into()],
            secret: "s3cret".into(),
            linger_secs: 60,
            started_ms: 1,
        }
    }

    #[test]
    fn a_record_is_private_and_read_back_whole() {
        use std::os::unix::fs::PermissionsExt;
        let run = tempfile::tempdir().unwrap();
        let server = Server::start(true);
        let written = record(run.path(), "workspace-0011 auto project", &server);
        write(run.path(), &written).unwrap();
        let path = record_path(run.path(), &written.key);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(read(run.path(), &written.key) == Some(written.clone()));
        assert!(read(run.path(), "workspace-0011 ask project").is_none(), "another key has no record");
        assert!(list(run.path()) == vec![written.clone()]);
        assert!(written.alive(), "the marked process is its root");
        assert_eq!(
            describe(run.path()),
            vec![format!(
                "/ws: pid {}, started 1970-01-01T00:00:00Z, ends 60 s after its last bridge let go of it",
                written.pid
            )]
        );
    }

    #[test]
    fn an_unreadable_record_is_dropped_and_a_reused_pid_is_not_alive() {
        let run = tempfile::tempdir().unwrap();
        let server = Server::start(true);
        let mut stale = record(run.path(), "a", &server);
        stale.start += 1;
        assert!(!stale.alive(), "same pid, another start time");
        write(run.path(), &stale).unwrap();
        std::fs::write(records_dir(run.path()).join("0000000000000000.json"), b"{ not json").unwrap();
        assert!(list(run.path()) == vec![stale.clone()]);
        assert_eq!(std::fs::read_dir(records_dir(run.path())).unwrap().count(), 1, "the unreadable one is gone");
        forget(run.path(), &stale);
        assert!(list(run.path()).is_empty());
    }

    #[test]
    fn a_process_a_bridge_did_not_start_is_never_the_server_nor_stopped() {
        let run = tempfile::tempdir().unwrap();
        let mut other = Server::start(false);
        let forged = record(run.path(), "a", &other);
        assert!(!forged.alive(), "no mark: some other process of the user's");
        stop(run.path(), &forged);
        assert!(other.runs(), "a record's word alone kills nothing");
        let mut marked = Server::start(true);
        let wrong_secret = Record { secret: "guessed".into(), ..record(run.path(), "a", &marked) };
        assert!(!wrong_secret.alive(), "the mark is of the record's own secret");
        stop(run.path(), &wrong_secret);
        assert!(marked.runs());
    }

    #[test]
    fn a_record_naming_what_no_bridge_makes_is_forgotten_and_nothing_it_names_is_touched() {
        let run = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("precious");
        std::fs::write(&victim, b"keep me").unwrap();
        let empty_dir = outside.path().join("acp-sandbox").join("s").join("empty");
        std::fs::create_dir_all(&empty_dir).unwrap();
        let server = Server::start(true);
        let honest = record(run.path(), "a", &server);
        let forgeries = [
            Record { door: victim.clone(), ..honest.clone() },
            Record { door: run.path().join("../precious.door"), ..honest.clone() },
            Record { proxy_socket: Some(victim.clone()), ..honest.clone() },
            Record { cgroups: vec![empty_dir.clone()], ..honest.clone() },
            Record { cgroups: vec!["/sys/fs/cgroup/acp-sandbox/s/../../../tmp".into()], ..honest.clone() },
            Record { cgroups: vec!["/sys/fs/cgroup/acp-sandbox/s".into()], ..honest.clone() },
        ];
        for forged in forgeries {
            write(run.path(), &forged).unwrap();
            assert!(list(run.path()).is_empty(), "{:?} {:?} {:?}", forged.door, forged.proxy_socket, forged.cgroups);
            assert!(!record_path(run.path(), "a").exists(), "it is forgotten");
            write(run.path(), &forged).unwrap();
            assert!(read(run.path(), "a").is_none());
            assert!(!record_path(run.path(), "a").exists());
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert!(empty_dir.is_dir());
        // Filed under another key's name, or a link to a record elsewhere: not read either.
        write(run.path(), &honest).unwrap();
        std::fs::rename(record_path(run.path(), "a"), record_path(run.path(), "b")).unwrap();
        assert!(list(run.path()).is_empty());
        write(outside.path(), &honest).unwrap();
        std::fs::create_dir_all(records_dir(run.path())).unwrap();
        std::os::unix::fs::symlink(record_path(outside.path(), "a"), record_path(run.path(), "a")).unwrap();
        assert!(read(run.path(), "a").is_none(), "a link is never followed");
        write(run.path(), &honest).unwrap();
        assert!(read(run.path(), "a") == Some(honest), "the honest record still reads");
    }

    #[test]
    fn forgetting_an_older_server_leaves_the_newer_record_of_its_key() {
        let run = tempfile::tempdir().unwrap();
        let server = Server::start(true);
        let older = Record { start: 7, ..record(run.path(), "a", &server) };
        let newer = record(run.path(), "a", &server);
        write(run.path(), &newer).unwrap();
        forget(run.path(), &older);
        assert!(read(run.path(), "a") == Some(newer));
    }

    #[test]
    fn the_fingerprint_ignores_the_port_and_secret_and_nothing_else() {
        let spec = |port: u16, secret: &str, model_key: &str| ExecSpec {
            program: "/opt/opencode".into(),
            args: vec!["serve".into(), "--port".into(), port.to_string()],
            env: vec![("OPENCODE_SERVER_PASSWORD".into(), secret.into()), ("OPENAI_API_KEY".into(), model_key.into())],
            serve_port: Some(port),
            keep_warm: Some(KeepWarm { key: "k".into(), linger: Duration::from_secs(1), secret: secret.into() }),
            ..ExecSpec::default()
        };
        let base = fingerprint(&spec(4096, "one", "k1"), "settings");
        assert_eq!(fingerprint(&spec(5001, "two", "k1"), "settings"), base);
        assert_ne!(fingerprint(&spec(4096, "one", "k2"), "settings"), base, "another credential");
        assert_ne!(fingerprint(&spec(4096, "one", "k1"), "other settings"), base);
        let mut moved = spec(4096, "one", "k1");
        moved.cwd = "/elsewhere".into();
        assert_ne!(fingerprint(&moved, "settings"), base);
    }

    #[test]
    fn the_secret_never_shows_in_debug_output() {
        let keep = KeepWarm { key: "k".into(), linger: Duration::from_secs(5), secret: "s3cret".into() };
        let shown = format!("{keep:?}");
        assert_eq!(shown, r#"KeepWarm { key: "k", linger: 5s, .. }"#);
    }
}
