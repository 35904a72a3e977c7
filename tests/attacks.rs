//! Hostile-agent tests: the real bridge runs `tests/fakes/hostile` (a fake `opencode` that attacks its sandbox and
//! reports what worked in `<workspace>/.attack/report.json`) and every test fails when an attack works.
//!
//! Each test builds a "lab": a fake user home full of canary secrets (the bridge's `HOME`), a data dir and a git
//! workspace, all under `support::test_root()`, or a copy of the bridge's kit under `/var/tmp` that nobody can
//! reach when the checkout is not (never `/tmp`, which is private inside the sandbox and would fake a
//! "blocked"). The hostile CLI learns the paths from `<workspace>/.attack/targets.json`; where the host can tell
//! (files written, sockets connected, processes alive) the test checks the host side too.
//!
//! bubblewrap tests run as the current user and, when the tests run as root, again with the bridge started as
//! `nobody` (`setpriv`) in a lab owned by nobody. Claims that hold without a sandbox run under `--sandbox none` too;
//! the file, secret, socket, network and process claims also under `--sandbox landlock`, as both users.
//! A variant that cannot run here (no working bubblewrap, nobody cannot run it) fails the test with the reason: a
//! protection that was not attacked has not held. Every variant of a test runs even when one fails;
//! the failure lists each failed check with the report entry's detail and the bridge's stderr.
//!
//! Run: `cargo test --test attacks`.
// Tests start the bridge, helper processes and servers themselves.
#![allow(clippy::disallowed_methods)]
// A test fails by panicking: unwrap and expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use support::*;

/// uid and gid of `nobody`, the unprivileged user of the second bubblewrap variant.
const NOBODY: u32 = 65534;
/// Failure bound for things that must happen "soon" (processes gone, a marker seen).
const SOON: Duration = Duration::from_secs(10);

/// The canary files of the fake home: what an agent must never read.
const SECRET_FILES: &[&str] = &[
    ".ssh/id_ed25519",
    ".aws/credentials",
    ".config/gcloud/credentials.db",
    ".bash_history",
    ".netrc",
    ".git-credentials",
    ".config/gh/hosts.yml",
    ".npmrc",
    ".docker/config.json",
    ".kube/config",
    ".gnupg/private-keys-v1.d/x.key",
    ".local/share/keyrings/login.keyring",
    ".mozilla/firefox/p/cookies.sqlite",
];

/// Workspace paths that run code or configure tools when the user opens or commits, all present in the lab's
/// workspace (but `.git/hooks/pre-commit` and `.zed/settings.json`, whose directories are): read-only for the agent.
const PROTECTED_PATHS: &[&str] = &[
    ".git/hooks/pre-commit",
    ".git/config",
    ".gitmodules",
    ".envrc",
    ".vscode/tasks.json",
    ".idea/x.xml",
    ".zed/settings.json",
];

/// Secrets in the bridge's environment that no CLI may see (unless passed with `--pass-env`).
const SECRET_VARIABLES: &[&str] = &[
    "STRIPE_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GITHUB_TOKEN",
    "MY_SERVICE_API_TOKEN",
];

/// The variables the tests remove from the bridge's environment: the fake home must be the only user dir, and any
/// proxy the CLI sees must be the bridge's own.
const CLEARED_VARIABLES: &[&str] = &[
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
];

// ---- variants ------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    /// The user running the tests.
    Me,
    /// `nobody`, through `setpriv` (only when the tests run as root).
    Nobody,
}

/// Where and as whom one run of a test happens.
#[derive(Clone, Copy, Debug)]
struct Variant {
    sandbox: &'static str,
    who: Who,
}

impl Variant {
    fn label(&self) -> String {
        let who = match self.who {
            Who::Me => "the current user",
            Who::Nobody => "nobody",
        };
        format!("--sandbox {} as {who}", self.sandbox)
    }

    fn bwrap(&self) -> bool {
        self.sandbox == "bwrap"
    }

    /// Whether the Landlock sandbox hides `path` whatever the test does: it hides the host's `/tmp` and `/var/tmp`
    /// (giving the CLI a tmp dir of its own), where the labs are when the checkout is under `/tmp`. A control read of
    /// an ordinary file there cannot work under it, so only the blocked half of such a test runs.
    fn landlock_hides(&self, path: &Path) -> bool {
        self.sandbox == "landlock" && (path.starts_with("/tmp") || path.starts_with("/var/tmp"))
    }

    /// Whether a sandbox confines the CLI: bubblewrap's or the Landlock one.
    fn sandboxed(&self) -> bool {
        self.bwrap() || self.sandbox == "landlock"
    }

    /// How a direct connection to an outside host fails: no route in bubblewrap's network namespace, Landlock's
    /// refusal of the port without it.
    fn direct_connect_errno(&self) -> &'static str {
        if self.sandbox == "landlock" { "EACCES" } else { "ENETUNREACH" }
    }
}

/// Whether the tests run as root (the effective uid, from `/proc/self/status`).
fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status.lines().find_map(|line| line.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().nth(1));
    uid == Some("0")
}

/// The bubblewrap variants: as the current user and, when the tests run as root, as nobody. A variant that cannot
/// run here fails the test with the reason: a protection that was not attacked has not held.
fn bwrap_variants(test: &str) -> Vec<Variant> {
    if let Err(why) = bwrap_usable() {
        panic!(
            "{test}: bubblewrap does not work here, so its protections cannot be attacked: {why}\n\
             (install it with .ci/deps.sh, or run `cargo test --test attacks` where user namespaces work)"
        );
    }
    let mut variants = vec![Variant { sandbox: "bwrap", who: Who::Me }];
    if is_root() {
        if let Err(why) = &kit().nobody {
            panic!("{test}: the bridge cannot run as nobody here, so no unprivileged run attacks it: {why}");
        }
        variants.push(Variant { sandbox: "bwrap", who: Who::Nobody });
    }
    variants
}

/// The Landlock variants (`--sandbox landlock`, what `auto` runs where bubblewrap cannot): as the current user and,
/// when the tests run as root, as nobody. A kernel without the Landlock ABI it needs fails the test with the reason.
fn landlock_variants(test: &str) -> Vec<Variant> {
    // SAFETY: with a null attribute, size 0 and LANDLOCK_CREATE_RULESET_VERSION, the call only returns the ABI.
    let abi = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
    if abi < 4 {
        panic!("{test}: the kernel's Landlock ABI is {abi}; the Landlock sandbox needs 4, so it cannot be attacked");
    }
    let mut variants = vec![Variant { sandbox: "landlock", who: Who::Me }];
    if is_root() {
        if let Err(why) = &kit().nobody {
            panic!("{test}: the bridge cannot run as nobody here, so no unprivileged run attacks it: {why}");
        }
        variants.push(Variant { sandbox: "landlock", who: Who::Nobody });
    }
    variants
}

/// bubblewrap's variants and Landlock's: the claims both sandboxes make.
fn sandboxed_variants(test: &str) -> Vec<Variant> {
    let mut variants = bwrap_variants(test);
    variants.extend(landlock_variants(test));
    variants
}

/// The bubblewrap variants, the Landlock ones and `--sandbox none`: claims that hold without a sandbox hold in both.
fn all_variants(test: &str) -> Vec<Variant> {
    let mut variants = sandboxed_variants(test);
    variants.push(Variant { sandbox: "none", who: Who::Me });
    variants
}

/// What a lab runs: the bridge, the hostile CLI and where labs go. When the tests run as root from a checkout
/// nobody cannot traverse (under `/root`, say), copies of the bridge and the hostile CLI in a folder of their
/// own under `/var/tmp`, so the unprivileged variant runs from every checkout.
struct Kit {
    bridge: PathBuf,
    fakes: PathBuf,
    labs: PathBuf,
    /// Whether the bridge can run as nobody with this kit (always `Ok` when not root: no such variant).
    nobody: Result<(), String>,
}

fn kit() -> &'static Kit {
    static KIT: OnceLock<Kit> = OnceLock::new();
    KIT.get_or_init(|| {
        let mut kit = Kit { bridge: bridge_bin(), fakes: fakes_dir(), labs: test_root(), nobody: Ok(()) };
        if !is_root() {
            return kit;
        }
        if reachable_by_nobody(&kit).is_err() {
            let copy = PathBuf::from("/var/tmp/acp-sandbox-attacks-kit");
            match make_kit(&copy) {
                Ok(made) => kit = made,
                Err(why) => {
                    kit.nobody = Err(format!("cannot make a copy nobody can run in {}: {why}", copy.display()));
                    return kit;
                }
            }
        }
        kit.nobody = reachable_by_nobody(&kit).and_then(|()| nobody_runs_bwrap());
        kit
    })
}

/// Copies the bridge and the hostile CLI into `dir`, readable and runnable by everyone; labs go below it.
fn make_kit(dir: &Path) -> Result<Kit, String> {
    let fakes = dir.join("fakes");
    let labs = dir.join("labs");
    for made in [dir, &fakes, &labs] {
        std::fs::create_dir_all(made).map_err(|e| format!("{}: {e}", made.display()))?;
        std::fs::set_permissions(made, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
    }
    // Each file is copied beside its place and renamed into it: another test process may be running the last copy.
    let copy = |from: PathBuf, to: PathBuf| {
        let part = to.with_extension(format!("part-{}", std::process::id()));
        std::fs::copy(&from, &part)
            .and_then(|_| std::fs::rename(&part, &to))
            .map_err(|e| format!("{}: {e}", to.display()))
    };
    let bridge = dir.join("acp-sandbox");
    copy(bridge_bin(), bridge.clone())?;
    for name in ["hostile", "hostile.py", "acp_agent.py"] {
        copy(fakes_dir().join(name), fakes.join(name))?;
    }
    Ok(Kit { bridge, fakes, labs, nobody: Ok(()) })
}

/// Whether nobody can reach the kit's bridge, hostile CLI and labs.
fn reachable_by_nobody(kit: &Kit) -> Result<(), String> {
    nobody_can_reach(&kit.labs, 0o001)?;
    nobody_can_reach(&kit.bridge, 0o001)?;
    nobody_can_reach(&kit.fakes.join("hostile"), 0o005)?;
    nobody_can_reach(&kit.fakes.join("acp_agent.py"), 0o005)?;
    nobody_can_reach(&kit.fakes.join("hostile.py"), 0o004)
}

/// Whether bubblewrap works for nobody (`setpriv` exists, user namespaces are open to it).
fn nobody_runs_bwrap() -> Result<(), String> {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "bwrap", "--unshare-user"])
        .args(["--ro-bind", "/", "/", "true"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run setpriv: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "bubblewrap does not work for nobody ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Every parent of `path` must be searchable by nobody and `path` itself allow `others` (mode bits).
fn nobody_can_reach(path: &Path, others: u32) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.mode() & others != others {
        return Err(format!("{} is mode {:o}: nobody cannot use it", path.display(), meta.mode() & 0o7777));
    }
    for dir in path.ancestors().skip(1) {
        let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if meta.uid() != NOBODY && meta.mode() & 0o001 == 0 {
            return Err(format!("{} is mode {:o}: nobody cannot traverse it", dir.display(), meta.mode() & 0o7777));
        }
    }
    Ok(())
}

/// Runs `body` once per variant, each to its end even when another fails, then fails with every failure.
fn for_each_variant(test: &str, variants: Vec<Variant>, body: impl Fn(Variant)) {
    let total = variants.len();
    let mut failures = Vec::new();
    for variant in variants {
        eprintln!("=== {test} [{}]", variant.label());
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| body(variant))) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "(a panic without a message)".into());
            // The full message (with the bridge's stderr) is printed above, as the panic happened.
            let summary = message.split("\n--- bridge stderr").next().unwrap_or_default().to_string();
            failures.push(format!("##### [{}]\n{summary}", variant.label()));
        }
    }
    if !failures.is_empty() {
        panic!("{test}: {} of {total} variants failed\n\n{}", failures.len(), failures.join("\n\n"));
    }
}

// ---- the lab -------------------------------------------------------------------------------------------------

/// One test's world: a fake user home with canaries, a data dir, a git workspace, and a cwd for the bridge.
struct Lab {
    _dir: tempfile::TempDir,
    root: PathBuf,
    variant: Variant,
    /// Unique per lab: in canaries, markers and file names, so parallel tests never see each other's.
    nonce: String,
    home: PathBuf,
    data: PathBuf,
    ws: PathBuf,
    /// The bridge's working directory, two levels below the root (`../../victim` is the lab's `victim`).
    bridge_cwd: PathBuf,
    /// Home-relative path -> content.
    canaries: BTreeMap<String, String>,
    /// The file the attacks try to create in `/etc`.
    etc_file: PathBuf,
}

impl Lab {
    fn new(name: &str, variant: Variant) -> Lab {
        let dir = tempfile::Builder::new().prefix(&format!("atk-{name}-")).tempdir_in(&kit().labs).unwrap();
        let root = dir.path().canonicalize().unwrap();
        let nonce = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let home = root.join("home");
        let mut canaries = BTreeMap::new();
        for rel in SECRET_FILES {
            let content = format!("CANARY {rel} {nonce}\n");
            write(&home.join(rel), &content);
            canaries.insert(rel.to_string(), content);
        }
        std::fs::set_permissions(home.join(".ssh"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(home.join(".ssh/id_ed25519"), std::fs::Permissions::from_mode(0o600)).unwrap();
        write(&home.join("notes.txt"), &format!("PLAIN notes {nonce}\n"));
        write(&home.join(".bashrc"), "# the user's own .bashrc\n");
        // The user's OpenCode config (shown read-only to the CLI) names a provider key from the environment.
        write(
            &home.join(".config/opencode/opencode.json"),
            r#"{"provider": {"fake": {"options": {"apiKey": "{env:FAKE_PROVIDER_KEY}"}}}}"#,
        );
        write(&home.join(".local/share/opencode/auth.json"), "{}\n");
        for victim in ["victim-dir", "victim-dir2"] {
            write(&home.join(victim).join("keep.txt"), &format!("the user's {victim} {nonce}\n"));
            write(&home.join(victim).join("empty"), "");
            std::fs::create_dir_all(home.join(victim).join("subdir")).unwrap();
        }
        let data = root.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let ws = root.join("ws");
        std::fs::create_dir_all(ws.join(".attack")).unwrap();
        git(&ws, &["init", "-q"]);
        write(&ws.join("README.md"), "a project\n");
        write(&ws.join(".envrc"), "export PROJECT=1\n");
        write(&ws.join(".vscode/tasks.json"), "{\"version\": \"2.0.0\", \"tasks\": []}\n");
        write(&ws.join(".gitmodules"), "[submodule \"lib\"]\n\tpath = lib\n");
        write(&ws.join(".idea/x.xml"), "<project/>\n");
        std::fs::create_dir_all(ws.join(".zed")).unwrap();
        write(&ws.join("extra.sh"), "#!/bin/sh\necho the project's own script\n");
        let bridge_cwd = root.join("cwd/a");
        std::fs::create_dir_all(&bridge_cwd).unwrap();
        let lab = Lab {
            _dir: dir,
            etc_file: PathBuf::from(format!("/etc/acp-attack-{nonce}")),
            root,
            variant,
            nonce,
            home,
            data,
            ws,
            bridge_cwd,
            canaries,
        };
        lab.give(&lab.root);
        lab
    }

    /// Hands `path` (recursively) to the user the bridge runs as.
    fn give(&self, path: &Path) {
        if self.variant.who == Who::Nobody {
            chown_tree(path, NOBODY);
        }
    }

    /// Writes a file as the bridge's user would own it.
    fn write(&self, path: &Path, content: &str) {
        write(path, content);
        self.give(path.parent().unwrap());
    }

    /// Another workspace of the lab.
    fn workspace(&self, name: &str) -> PathBuf {
        let path = self.root.join(name);
        std::fs::create_dir_all(&path).unwrap();
        self.give(&path);
        path
    }

    /// The bridge's options: this variant's sandbox and user, the hostile CLI, the fake home as HOME.
    fn options(&self) -> BridgeOptions {
        let mut options = BridgeOptions::new("opencode", &self.data)
            .sandbox(self.variant.sandbox)
            .env("ACP_SANDBOX_OPENCODE_BIN", &kit().fakes.join("hostile").display().to_string())
            .env("HOME", &self.home.display().to_string())
            .env("RUST_LOG", &std::env::var("RUST_LOG").unwrap_or_else(|_| "acp_sandbox=debug,warn".into()));
        for name in CLEARED_VARIABLES {
            options = options.without_env(name);
        }
        if self.variant.who == Who::Nobody {
            options.launcher.extend(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"].map(String::from));
        }
        options.bin = Some(kit().bridge.clone());
        options.launcher.extend(["env".to_string(), "-C".to_string(), self.bridge_cwd.display().to_string()]);
        options
    }

    /// What the hostile CLI is told: every path and value an attack needs. Tests add their own fields.
    fn targets(&self) -> Value {
        json!({
            "nonce": self.nonce,
            "home": self.home,
            "canaries": self.canaries,
            "plain": {"path": self.home.join("notes.txt"), "content": format!("PLAIN notes {}", self.nonce)},
            "data_dir": self.data,
            "etc_file": self.etc_file,
            "victim_dir": self.home.join("victim-dir"),
            "victim_dir2": self.home.join("victim-dir2"),
            "ssh_dir": self.home.join(".ssh"),
            "protected": PROTECTED_PATHS,
            "outside_writes": [
                {"label": "home_bashrc", "path": self.home.join(".bashrc")},
                {"label": "etc", "path": self.etc_file},
                {"label": "data_dir", "path": self.data.join(format!("acp-attack-{}", self.nonce))},
                {"label": "workspace_parent", "path": self.root.join(format!("acp-attack-{}", self.nonce))},
            ],
            "max_processes": 64,
            "fork_bomb_count": 500,
            "memory_bytes": 1u64 << 30,
            "denied_host": "denied.example",
            "allowed_host": "allowed.example",
            "external_ip": "1.1.1.1",
            "secrets": {},
            "expected_pass": [],
            "provider_env": {},
        })
    }

    /// Writes `targets` for the hostile CLI in `ws` and removes the last report.
    fn write_targets(&self, ws: &Path, targets: &Value) {
        let dir = ws.join(".attack");
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join("report.json"));
        self.write(&dir.join("targets.json"), &serde_json::to_string_pretty(targets).unwrap());
    }

    /// Writes `targets`, runs one prompt `ATTACKS:<attacks>` in session `sid` (workspace `ws`) and returns the
    /// report, failing with the turn's outcome and the bridge's stderr when there is none.
    fn attack_in(&self, bridge: &mut Bridge, sid: &str, ws: &Path, attacks: &str, targets: &Value) -> Report {
        self.write_targets(ws, targets);
        let turn = bridge.prompt(sid, &format!("ATTACKS:{attacks}"));
        match Report::read(ws, bridge) {
            Some(report) => report,
            None => bridge.fail(&format!(
                "the hostile CLI wrote no report for ATTACKS:{attacks} in {}; the prompt answered {:?}",
                ws.display(),
                turn.result
            )),
        }
    }

    /// Like [`Lab::attack`] for an attack the sandbox may answer by stopping everything: the report, or the turn's
    /// error when the hostile CLI was stopped before it could write one.
    fn attack_or_stopped(&self, bridge: &mut Bridge, sid: &str, attacks: &str) -> Result<Report, String> {
        self.write_targets(&self.ws, &self.targets());
        let turn = bridge.prompt(sid, &format!("ATTACKS:{attacks}"));
        match Report::read(&self.ws, bridge) {
            Some(report) => Ok(report),
            None => Err(match &turn.result {
                Err(error) => error.message.clone(),
                Ok(ok) => bridge.fail(&format!("no report and no error for ATTACKS:{attacks}: {ok}")),
            }),
        }
    }

    fn attack(&self, bridge: &mut Bridge, sid: &str, attacks: &str, targets: &Value) -> Report {
        self.attack_in(bridge, sid, &self.ws, attacks, targets)
    }

    /// Changes the store with the bridge stopped, then gives the data dir back to the bridge's user.
    fn edit_store(&self, sql: &str, params: &[&str]) {
        let db = rusqlite::Connection::open(self.data.join("acp-sandbox.sqlite3")).unwrap();
        let changed = db.execute(sql, rusqlite::params_from_iter(params)).unwrap();
        assert_eq!(changed, 1, "{sql} {params:?} changed {changed} rows");
        drop(db);
        self.give(&self.data);
    }

    /// A session's stored `sandbox_id`.
    fn stored_sandbox_id(&self, sid: &str) -> Option<String> {
        let db = rusqlite::Connection::open(self.data.join("acp-sandbox.sqlite3")).unwrap();
        db.query_row("SELECT sandbox_id FROM sessions WHERE id = ?1", [sid], |row| row.get(0)).unwrap()
    }

    /// How many times the hostile CLI ran in `ws`.
    fn runs(&self, ws: &Path) -> usize {
        std::fs::read_to_string(ws.join(".attack/runs.jsonl")).map(|text| text.lines().count()).unwrap_or(0)
    }
}

impl Drop for Lab {
    /// Nothing a test started may outlive it: processes carrying the nonce (daemons in `/`) or working in the
    /// lab are killed, and the file an attack may have put in /etc goes.
    fn drop(&mut self) {
        for (pid, _) in processes_with(&self.nonce).into_iter().chain(processes_under(&self.root)) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = std::fs::remove_file(&self.etc_file);
    }
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn chown_tree(path: &Path, id: u32) {
    let _ = std::os::unix::fs::lchown(path, Some(id), Some(id));
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            chown_tree(&entry.path(), id);
        }
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "safe.directory=*", "-C"])
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run git");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every entry below `dir` (not following links): relative path -> what it is and holds. For "nothing changed".
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).collect();
        entries.sort();
        for path in entries {
            let rel = path.strip_prefix(base).unwrap().display().to_string();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            if meta.file_type().is_symlink() {
                out.insert(rel, format!("symlink to {:?}", std::fs::read_link(&path).unwrap_or_default()));
            } else if meta.is_dir() {
                out.insert(rel, "dir".into());
                walk(base, &path, out);
            } else {
                let content = std::fs::read(&path).unwrap_or_default();
                out.insert(rel, format!("file {:?}", String::from_utf8_lossy(&content)));
            }
        }
    }
    let mut out = BTreeMap::new();
    if !dir.is_dir() {
        out.insert(String::new(), "missing".into());
    }
    walk(dir, dir, &mut out);
    out
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Live processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<(i32, String)> {
    let own = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != own && pid_alive(pid))
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(marker).then(|| (pid, cmdline.trim().to_string()))
        })
        .collect()
}

// ---- reports and checks --------------------------------------------------------------------------------------

/// What the hostile CLI reported for one run, with the bridge's stderr at that point.
struct Report {
    entries: Vec<Value>,
    stderr: String,
}

impl Report {
    fn read(ws: &Path, bridge: &Bridge) -> Option<Report> {
        let text = std::fs::read_to_string(ws.join(".attack/report.json")).ok()?;
        let entries = serde_json::from_str(&text).expect("the report is JSON");
        Some(Report { entries, stderr: bridge.stderr() })
    }

    /// Waits (a failure bound) for the report of a run that goes on after writing it (`hang`).
    fn wait(ws: &Path, bridge: &Bridge) -> Report {
        let found = wait_until(SOON, || ws.join(".attack/report.json").exists());
        match found.then(|| Report::read(ws, bridge)).flatten() {
            Some(report) => report,
            None => bridge.fail(&format!("no report in {} within {SOON:?}", ws.display())),
        }
    }

    fn entry(&self, name: &str) -> Option<&Value> {
        self.entries.iter().find(|e| e["name"] == name)
    }

    fn succeeded(&self, name: &str) -> Option<bool> {
        self.entry(name).and_then(|e| e["succeeded"].as_bool())
    }

    fn detail(&self, name: &str) -> String {
        match self.entry(name) {
            Some(entry) => format!("{}: succeeded={} detail: {}", name, entry["succeeded"], entry["detail"]),
            None => format!(
                "{name}: NO SUCH ENTRY in the report: {}",
                serde_json::to_string_pretty(&self.entries).unwrap_or_default()
            ),
        }
    }
}

/// Checks that fail together: every failed one is listed, with the bridge's stderr once at the end.
struct Checks {
    failures: Vec<String>,
    stderr: String,
}

impl Checks {
    fn new() -> Checks {
        Checks { failures: vec![], stderr: String::new() }
    }

    fn note_stderr(&mut self, stderr: String) {
        self.stderr = stderr;
    }

    /// The attack `name` must be in the report, have run, and have failed.
    fn blocked(&mut self, report: &Report, name: &str) {
        self.note_stderr(report.stderr.clone());
        let entry = report.entry(name);
        if entry.is_some_and(|e| e.get("error").is_some()) {
            self.failures.push(format!("the attack could not run: {}", report.detail(name)));
        } else if report.succeeded(name) != Some(false) {
            self.failures.push(format!("ATTACK WORKED: {}", report.detail(name)));
        }
    }

    /// The non-attack entry `name` (something the agent must still be able to do) must have worked.
    fn worked(&mut self, report: &Report, name: &str) {
        self.note_stderr(report.stderr.clone());
        if report.succeeded(name) != Some(true) {
            self.failures.push(format!("MUST WORK but did not: {}", report.detail(name)));
        }
    }

    fn check(&mut self, ok: bool, message: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(message());
        }
    }

    fn finish(self) {
        if self.failures.is_empty() {
            return;
        }
        let tail: Vec<&str> = self.stderr.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
        panic!(
            "{} failed check(s):\n- {}\n--- bridge stderr (tail) ---\n{}",
            self.failures.len(),
            self.failures.join("\n- "),
            tail.join("\n")
        );
    }
}

/// Starts a bridge with `options`, opens a session in the lab's workspace, runs `ATTACKS:<attacks>` with the lab's
/// targets and returns the bridge, the session and the report.
fn run_attacks(lab: &Lab, options: BridgeOptions, attacks: &str) -> (Bridge, String, Report) {
    run_attacks_with(lab, options, attacks, lab.targets())
}

fn run_attacks_with(lab: &Lab, options: BridgeOptions, attacks: &str, targets: Value) -> (Bridge, String, Report) {
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&lab.ws);
    let report = lab.attack(&mut bridge, &sid, attacks, &targets);
    (bridge, sid, report)
}

/// Stops a bridge the way an editor does (stdin closed), SIGKILL if it does not exit.
fn stop(mut bridge: Bridge) {
    bridge.close_stdin();
    if bridge.wait_exit(SOON).is_none() {
        bridge.kill9();
    }
}

// ---- listeners on the host -----------------------------------------------------------------------------------

/// A listening socket on the host that counts the connections made to it. Nobody accepts until the test asks:
/// a connection the sandbox made waits in the backlog (even once closed), so the count is exact, without races.
struct Listener {
    accept: Box<dyn FnMut() -> bool>,
    accepted: usize,
    path: Option<PathBuf>,
}

impl Listener {
    /// 127.0.0.1 on a free port; returns the port too.
    fn tcp() -> (Listener, u16) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        (Listener { accept: Box::new(move || listener.accept().is_ok()), accepted: 0, path: None }, port)
    }

    /// A unix socket at `path` that anyone may connect to (so permissions are not what blocks).
    fn unix(path: &Path) -> Listener {
        Listener::try_unix(path).unwrap_or_else(|why| panic!("{why}"))
    }

    fn try_unix(path: &Path) -> Result<Listener, String> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|e| format!("bind {}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
        listener.set_nonblocking(true).unwrap();
        Ok(Listener { accept: Box::new(move || listener.accept().is_ok()), accepted: 0, path: Some(path.into()) })
    }

    /// An abstract unix socket `@name`.
    fn abstract_name(name: &str) -> Listener {
        use std::os::linux::net::SocketAddrExt;
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixListener::bind_addr(&address).unwrap();
        listener.set_nonblocking(true).unwrap();
        Listener { accept: Box::new(move || listener.accept().is_ok()), accepted: 0, path: None }
    }

    /// How many connections were made to it so far.
    fn accepted(&mut self) -> usize {
        while (self.accept)() {
            self.accepted += 1;
        }
        self.accepted
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

// ---- reading ---------------------------------------------------------------------------------------------------

#[test]
fn secret_files_of_the_home_are_unreadable() {
    let test = "secret_files_of_the_home_are_unreadable";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("secrets", variant);
        let (_bridge, _, report) = run_attacks(&lab, lab.options(), "secrets");
        let mut checks = Checks::new();
        checks.blocked(&report, "secrets");
        checks.finish();
    });
}

#[test]
fn secrets_inside_the_workspace_stay_hidden() {
    // A workspace that holds secret paths (`~/.config` holds `~/.config/gh` and gcloud's credentials): the
    // workspace's own mount must not show them again.
    let test = "secrets_inside_the_workspace_stay_hidden";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("secrets-in-ws", variant);
        let ws = lab.home.join(".config");
        lab.write(&ws.join(".attack/keep"), "");
        let mut bridge = Bridge::start(lab.options());
        let sid = bridge.new_session(&ws);
        let report = lab.attack_in(&mut bridge, &sid, &ws, "secrets", &lab.targets());
        let mut checks = Checks::new();
        checks.blocked(&report, "secrets");
        checks.finish();
    });
}

#[test]
fn deny_read_hides_an_extra_directory() {
    let test = "deny_read_hides_an_extra_directory";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("deny-read", variant);
        let dir = lab.root.join("extra-secrets");
        let canary = format!("DENIED {}", lab.nonce);
        lab.write(&dir.join("token.txt"), &canary);
        let mut targets = lab.targets();
        targets["deny_read"] = json!([{"path": dir.join("token.txt"), "content": canary}]);
        let mut checks = Checks::new();
        // Without the flag it is an ordinary, readable file: the attack can tell.
        if !variant.landlock_hides(&lab.root) {
            let (control, _, report) = run_attacks_with(&lab, lab.options(), "deny_read", targets.clone());
            checks.worked(&report, "deny_read");
            stop(control);
        }
        let options = lab.options().arg("--deny-read").arg(&dir.display().to_string());
        let (_bridge, _, report) = run_attacks_with(&lab, options, "deny_read", targets);
        checks.blocked(&report, "deny_read");
        checks.finish();
    });
}

#[test]
fn strict_profile_hides_plain_files_of_the_home() {
    let test = "strict_profile_hides_plain_files_of_the_home";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("strict", variant);
        let mut checks = Checks::new();
        if !variant.landlock_hides(&lab.home) {
            let (default, _, report) = run_attacks(&lab, lab.options(), "plain_home");
            checks.worked(&report, "plain_home_file"); // the default profile keeps ordinary home files readable
            stop(default);
        }
        let (_bridge, _, report) =
            run_attacks(&lab, lab.options().arg("--profile").arg("strict"), "plain_home,secrets");
        checks.blocked(&report, "plain_home_file");
        checks.blocked(&report, "secrets");
        checks.finish();
    });
}

#[test]
fn the_data_dir_and_other_sessions_are_invisible() {
    let test = "the_data_dir_and_other_sessions_are_invisible";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("data-dir", variant);
        let mut bridge = Bridge::start(lab.options());
        let other_ws = lab.workspace("other-ws");
        let other = bridge.new_session(&other_ws);
        let turn = bridge.prompt(&other, "an ordinary prompt");
        assert_eq!(turn.stop_reason(), "end_turn");
        let other_dir = lab
            .stored_sandbox_id(&other)
            .map(PathBuf::from)
            .filter(|path| path.is_dir())
            .unwrap_or_else(|| lab.data.join("sessions").join(&other));
        let canary = json!({"path": other_dir.join("home/canary.txt"), "content": format!("OTHER {}", lab.nonce)});
        lab.write(&other_dir.join("home/canary.txt"), &format!("OTHER {}\n", lab.nonce));
        let mut targets = lab.targets();
        targets["other_session_dir"] = json!(other_dir);
        targets["other_canary"] = canary;
        let sid = bridge.new_session(&lab.ws);
        let report = lab.attack(&mut bridge, &sid, "data_dir", &targets);
        let mut checks = Checks::new();
        for name in ["data_db", "data_logs", "data_other_session"] {
            checks.blocked(&report, name);
        }
        checks.finish();
    });
}

// ---- writing ---------------------------------------------------------------------------------------------------

#[test]
fn nothing_outside_the_workspace_is_writable() {
    let test = "nothing_outside_the_workspace_is_writable";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("writes", variant);
        let bashrc = std::fs::read_to_string(lab.home.join(".bashrc")).unwrap();
        let (_bridge, _, report) = run_attacks(&lab, lab.options(), "outside_writes");
        let mut checks = Checks::new();
        for label in ["home_bashrc", "etc", "data_dir", "workspace_parent"] {
            checks.blocked(&report, &format!("write:{label}"));
        }
        let now = std::fs::read_to_string(lab.home.join(".bashrc")).unwrap_or_default();
        checks.check(now == bashrc, || format!("~/.bashrc changed on the host: {now:?}"));
        for path in [lab.etc_file.clone(), lab.data.join(format!("acp-attack-{}", lab.nonce))] {
            checks.check(!path.exists(), || format!("{} exists on the host", path.display()));
        }
        let parent = lab.root.join(format!("acp-attack-{}", lab.nonce));
        checks.check(!parent.exists(), || format!("{} exists on the host", parent.display()));
        checks.finish();
    });
}

#[test]
fn protected_workspace_paths_are_read_only_and_git_still_commits() {
    let test = "protected_workspace_paths_are_read_only_and_git_still_commits";
    for_each_variant(test, bwrap_variants(test), |variant| {
        let lab = Lab::new("protected", variant);
        let before: Vec<Option<String>> =
            PROTECTED_PATHS.iter().map(|rel| std::fs::read_to_string(lab.ws.join(rel)).ok()).collect();
        let (_bridge, _, report) = run_attacks(&lab, lab.options(), "git_commit,protected");
        let mut checks = Checks::new();
        checks.worked(&report, "git_commit_works");
        let head = git(&lab.ws, &["log", "-1", "--format=%s"]);
        checks.check(head == format!("a normal commit {}", lab.nonce), || {
            format!("the agent's commit is not in the host's repository: HEAD is {head:?}")
        });
        for (rel, old) in PROTECTED_PATHS.iter().zip(before) {
            checks.blocked(&report, &format!("protect:{rel}"));
            let now = std::fs::read_to_string(lab.ws.join(rel)).ok();
            checks.check(now == old, || format!("{rel} changed on the host: was {old:?}, is {now:?}"));
        }
        checks.finish();
    });
}

#[test]
fn review_mode_keeps_protected_paths_protected_and_its_copy_private() {
    let test = "review_mode_keeps_protected_paths_protected_and_its_copy_private";
    for_each_variant(test, bwrap_variants(test), |variant| {
        let lab = Lab::new("review", variant);
        let before: Vec<Option<String>> =
            PROTECTED_PATHS.iter().map(|rel| std::fs::read_to_string(lab.ws.join(rel)).ok()).collect();
        let mut bridge = Bridge::start(lab.options().arg("--workspace").arg("review"));
        // The hostile CLI's report reaches the workspace (where the lab reads it) only once allowed; the protected
        // paths are never offered.
        bridge.permission_answer = Some("allow_once".into());
        let sid = bridge.new_session(&lab.ws);
        lab.attack(&mut bridge, &sid, "noop", &lab.targets());
        // The copy and its manifest are the bridge's: the agent sees the copy only where the workspace is.
        let review = PathBuf::from(lab.stored_sandbox_id(&sid).unwrap()).join("review");
        let mut targets = lab.targets();
        targets["outside_writes"] = json!([
            {"label": "review_manifest", "path": review.join("manifest.json")},
            {"label": "review_held", "path": review.join("held.json")},
            {"label": "review_copy", "path": review.join("copy/planted.txt")},
        ]);
        // A missing protected path the agent creates stays in its copy, like its other changes to protected paths.
        targets["create_protected"] = json!([".husky/pre-commit"]);
        let report = lab.attack(&mut bridge, &sid, "protected,outside_writes,create_protected", &targets);
        let mut checks = Checks::new();
        checks.note_stderr(bridge.stderr());
        checks.worked(&report, "create:.husky/pre-commit");
        checks.check(!lab.ws.join(".husky").exists(), || "the agent's .husky reached the user's workspace".into());
        checks.blocked(&report, "write:review_manifest");
        checks.blocked(&report, "write:review_held");
        checks.blocked(&report, "write:review_copy");
        checks.check(!review.join("copy/planted.txt").exists(), || "the agent wrote into its copy's host path".into());
        for (rel, old) in PROTECTED_PATHS.iter().zip(before) {
            checks.blocked(&report, &format!("protect:{rel}"));
            let now = std::fs::read_to_string(lab.ws.join(rel)).ok();
            checks.check(now == old, || format!("{rel} changed on the host: was {old:?}, is {now:?}"));
        }
        checks.finish();
    });
}

#[test]
fn protect_flag_makes_a_workspace_path_read_only() {
    let test = "protect_flag_makes_a_workspace_path_read_only";
    for_each_variant(test, bwrap_variants(test), |variant| {
        let lab = Lab::new("protect-flag", variant);
        let mut targets = lab.targets();
        targets["protected"] = json!(["extra.sh"]);
        let mut checks = Checks::new();
        // Without the flag it is an ordinary workspace file the agent may edit: the attack can tell.
        let (control, _, report) = run_attacks_with(&lab, lab.options(), "protected", targets.clone());
        checks.worked(&report, "protect:extra.sh");
        stop(control);
        let original = "#!/bin/sh\necho the project's own script\n";
        lab.write(&lab.ws.join("extra.sh"), original);
        let options = lab.options().arg("--protect").arg("extra.sh");
        let (_bridge, _, report) = run_attacks_with(&lab, options, "protected", targets);
        checks.blocked(&report, "protect:extra.sh");
        let now = std::fs::read_to_string(lab.ws.join("extra.sh")).unwrap_or_default();
        checks.check(now == original, || format!("extra.sh changed on the host: {now:?}"));
        checks.finish();
    });
}

/// Makes in `ws` what an older bridge's bubblewrap left when it was SIGKILLed: the mount points of missing
/// protected paths (an empty read-only file bound from `/dev/null`, empty directories for `--tmpfs`), made by
/// bubblewrap itself as the bridge's user.
fn make_old_mount_points(lab: &Lab, ws: &Path) {
    let mut command = match lab.variant.who {
        Who::Me => Command::new("bwrap"),
        Who::Nobody => {
            let mut command = Command::new("setpriv");
            command.args(["--reuid=65534", "--regid=65534", "--clear-groups", "bwrap"]);
            command
        }
    };
    command.args(["--unshare-user", "--bind", "/", "/"]);
    for rel in [".envrc", ".gitmodules"] {
        command.args(["--ro-bind", "/dev/null"]).arg(ws.join(rel));
    }
    for rel in [".vscode", ".idea", ".zed", ".husky", ".git/hooks"] {
        command.arg("--tmpfs").arg(ws.join(rel));
    }
    let out = command.arg("true").stdin(Stdio::null()).output().expect("run bwrap");
    assert!(out.status.success(), "bwrap made no mount points: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn protected_paths_leave_no_trace_and_what_the_agent_creates_there_is_moved_out() {
    let test = "protected_paths_leave_no_trace_and_what_the_agent_creates_there_is_moved_out";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("no-trace", variant);
        // A committed repository without hooks and without any of the protected paths.
        let ws = lab.root.join("clean");
        write(&ws.join("README.md"), "a clean project\n");
        git(&ws, &["init", "-q"]);
        std::fs::remove_dir_all(ws.join(".git/hooks")).unwrap();
        write(&ws.join(".git/info/exclude"), ".attack/\n");
        git(&ws, &["add", "README.md"]);
        git(&ws, &["-c", "user.name=T", "-c", "user.email=t@example.invalid", "commit", "-qm", "init"]);
        lab.give(&ws);
        let status = || git(&ws, &["status", "--porcelain"]);
        let mut checks = Checks::new();
        checks.check(status().is_empty(), || format!("the test's repository is not clean: {:?}", status()));

        let mut bridge = Bridge::start(lab.options());
        let sid = bridge.new_session(&ws);
        let report = lab.attack_in(&mut bridge, &sid, &ws, "git_status", &lab.targets());
        checks.worked(&report, "git_status");
        let inside = report.entry("git_status").map(|e| e["output"].clone());
        checks.check(inside == Some(json!("")), || format!("git status inside the sandbox: {inside:?}"));
        checks.check(status().is_empty(), || format!("git status after a turn: {:?}", status()));

        // While a turn runs (the CLI waits), from inside and from the host; then the bridge is SIGKILLed.
        lab.write_targets(&ws, &lab.targets());
        bridge.send_prompt(&sid, "ATTACKS:git_status,hang");
        let report = Report::wait(&ws, &bridge);
        let inside = report.entry("git_status").map(|e| e["output"].clone());
        checks.check(inside == Some(json!("")), || format!("git status inside, during a turn: {inside:?}"));
        checks.check(status().is_empty(), || format!("git status during a turn: {:?}", status()));
        checks.note_stderr(bridge.stderr());
        bridge.kill9();
        checks.check(status().is_empty(), || format!("git status after SIGKILL of the bridge: {:?}", status()));

        // An older version's leftovers go with the next bridge's first command in the workspace.
        if bwrap_usable().is_ok() {
            make_old_mount_points(&lab, &ws);
            checks.check(status() == "?? .envrc\n?? .gitmodules", || format!("old mount points: {:?}", status()));
        }
        let mut bridge = Bridge::start(lab.options());
        let sid = bridge.new_session(&ws);
        let report = lab.attack_in(&mut bridge, &sid, &ws, "git_status", &lab.targets());
        checks.worked(&report, "git_status");
        checks.check(status().is_empty(), || format!("git status after the next bridge: {:?}", status()));
        for rel in [".envrc", ".gitmodules", ".vscode", ".idea", ".zed", ".husky", ".git/hooks"] {
            let left = std::fs::symlink_metadata(ws.join(rel)).is_ok();
            checks.check(!left, || format!("an old mount point outlived the next bridge: {rel}"));
        }

        // What the agent creates at a protected path is moved out of the workspace, and the thread says where.
        let created = [".envrc", ".vscode/tasks.json", ".git/hooks/pre-commit", ".gitmodules", ".husky/pre-commit"];
        let mut targets = lab.targets();
        targets["create_protected"] = json!(created);
        lab.write_targets(&ws, &targets);
        let turn = bridge.prompt(&sid, "ATTACKS:create_protected");
        let report = Report::read(&ws, &bridge).unwrap_or_else(|| bridge.fail("no report of create_protected"));
        checks.note_stderr(bridge.stderr());
        let state = PathBuf::from(lab.stored_sandbox_id(&sid).unwrap());
        let moved: Vec<String> =
            notes(&turn).into_iter().filter(|n| n.contains("moved out of your workspace")).collect();
        checks.check(moved.len() == 1, || format!("not one note of what was moved: {:?}", notes(&turn)));
        let note = moved.first().cloned().unwrap_or_default();
        checks.check(note.matches(" → ").count() == created.len(), || format!("not {} moves: {note}", created.len()));
        for rel in created {
            let entry = report.entry(&format!("create:{rel}"));
            checks.check(entry.is_some_and(|e| e.get("error").is_none()), || report.detail(&format!("create:{rel}")));
            // The first component the agent made is what is moved (`.git/hooks` for `.git/hooks/pre-commit`).
            let top = if rel.starts_with(".git/") { ".git/hooks" } else { rel.split('/').next().unwrap() };
            let left = std::fs::symlink_metadata(ws.join(top)).is_ok();
            checks.check(!left, || format!("{top} is still in the user's workspace"));
            let copies: Vec<PathBuf> = std::fs::read_dir(state.join("quarantine"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|stamp| stamp.path().join(top))
                .filter(|path| std::fs::symlink_metadata(path).is_ok())
                .collect();
            checks.check(copies.len() == 1, || format!("{top} is not in the quarantine once: {copies:?}"));
            let Some(copy) = copies.first() else { continue };
            let said = format!("`{}` → `{}`", ws.join(top).display(), copy.display());
            checks.check(note.contains(&said), || format!("the note does not say {said}: {note}"));
            if report.succeeded(&format!("create:{rel}")) == Some(true) {
                let below = Path::new(rel).strip_prefix(top).unwrap();
                let at = if below.as_os_str().is_empty() { copy.clone() } else { copy.join(below) };
                let content = std::fs::read_to_string(&at).unwrap_or_default();
                let marker = format!("acp-attack-{}", lab.nonce);
                checks.check(content.contains(&marker), || format!("{} lost what the agent wrote", at.display()));
            }
        }
        checks.check(status().is_empty(), || format!("git status after the agent's creations: {:?}", status()));

        // The watch moves them at once, while the CLI still runs (no tool has ended, the turn goes on).
        lab.write_targets(&ws, &targets);
        let id = bridge.send_prompt(&sid, "ATTACKS:create_protected,hang");
        Report::wait(&ws, &bridge);
        let tops = [".envrc", ".vscode", ".git/hooks", ".gitmodules", ".husky"];
        let gone = wait_until(SOON, || tops.iter().all(|top| std::fs::symlink_metadata(ws.join(top)).is_err()));
        checks.check(gone, || {
            let left: Vec<&&str> = tops.iter().filter(|top| ws.join(top).exists()).collect();
            format!("still in the workspace while the CLI runs: {left:?}")
        });
        checks.check(status().is_empty(), || format!("git status while the CLI runs: {:?}", status()));
        bridge.cancel(&sid);
        let answer = bridge.wait_response(id);
        checks.check(answer.as_ref().is_ok_and(|r| r["stopReason"] == "cancelled"), || format!("{answer:?}"));
        checks.finish();
    });
}

#[test]
fn root_cannot_be_remounted_writable() {
    let test = "root_cannot_be_remounted_writable";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("remount", variant);
        let (_bridge, _, report) = run_attacks(&lab, lab.options(), "capabilities,remount");
        let mut checks = Checks::new();
        for name in ["remount_root", "mount_tmpfs", "write_etc_after_remount"] {
            checks.blocked(&report, name);
        }
        let cap_eff = report.entry("capabilities").map(|e| e["cap_eff"].clone()).unwrap_or_default();
        checks.check(cap_eff == "0000000000000000", || format!("CapEff must be 0: {}", report.detail("capabilities")));
        checks.check(!lab.etc_file.exists(), || format!("{} was created on the host", lab.etc_file.display()));
        checks.finish();
    });
}

#[test]
fn no_capability_is_effective() {
    let test = "no_capability_is_effective";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("caps", variant);
        let (_bridge, _, report) = run_attacks(&lab, lab.options(), "capabilities");
        let mut checks = Checks::new();
        checks.blocked(&report, "capabilities");
        checks.finish();
    });
}

// ---- network ---------------------------------------------------------------------------------------------------

#[test]
fn host_unix_sockets_are_unreachable() {
    let test = "host_unix_sockets_are_unreachable";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("unix", variant);
        let agent = lab.home.join(".ssh/agent.sock");
        let mut listeners = vec![("ssh_agent", Listener::unix(&agent))];
        lab.give(&agent);
        let mut sockets = vec![json!({"label": "ssh_agent", "path": agent})];
        let run = PathBuf::from(format!("/run/acp-test-{}-{}.sock", std::process::id(), lab.nonce));
        match Listener::try_unix(&run) {
            Ok(listener) => {
                listeners.push(("run", listener));
                sockets.push(json!({"label": "run", "path": run}));
            }
            Err(why) => eprintln!("note: no socket under /run is tried: {why}"),
        }
        let name = format!("acp-attack-{}-{}", std::process::id(), lab.nonce);
        listeners.push(("abstract", Listener::abstract_name(&name)));
        let mut targets = lab.targets();
        targets["unix_sockets"] = json!(sockets);
        targets["abstract_sockets"] = json!([{"label": "abstract", "name": name}]);
        let (_bridge, _, report) = run_attacks_with(&lab, lab.options(), "unix_sockets", targets);
        let mut checks = Checks::new();
        for (label, listener) in &mut listeners {
            let entry =
                if *label == "abstract" { "abstract_socket:abstract".into() } else { format!("unix_socket:{label}") };
            checks.blocked(&report, &entry);
            let accepted = listener.accepted();
            checks.check(accepted == 0, || format!("the host's {label} socket was connected to {accepted} time(s)"));
        }
        checks.finish();
    });
}

#[test]
fn host_loopback_is_unreachable_directly_and_through_the_proxy() {
    let test = "host_loopback_is_unreachable_directly_and_through_the_proxy";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("loopback", variant);
        let (mut listener, port) = Listener::tcp();
        let mut targets = lab.targets();
        targets["loopback_port"] = json!(port);
        let (_bridge, _, report) = run_attacks_with(&lab, lab.options(), "loopback", targets);
        let mut checks = Checks::new();
        checks.blocked(&report, "loopback_direct");
        checks.blocked(&report, "loopback_via_proxy");
        let accepted = listener.accepted();
        checks.check(accepted == 0, || format!("the host's 127.0.0.1:{port} was connected to {accepted} time(s)"));
        checks.finish();
    });
}

#[test]
fn network_allow_list_denies_other_domains_at_the_proxy() {
    let test = "network_allow_list_denies_other_domains_at_the_proxy";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("allow", variant);
        let options = lab.options().arg("--network").arg("allow=allowed.example");
        let (_bridge, _, report) = run_attacks(&lab, options, "proxy_domains");
        let mut checks = Checks::new();
        for name in ["proxy_denied_domain", "proxy_denied_http", "direct_external"] {
            checks.blocked(&report, name);
        }
        let proxy = report.entry("proxy_denied_domain").map(|e| e["proxy"].clone()).unwrap_or_default();
        checks.check(!proxy.is_null(), || "no HTTP proxy in the CLI's environment under --network allow=".into());
        for name in ["proxy_denied_domain", "proxy_denied_http"] {
            let status = report.entry(name).map(|e| e["status"].clone()).unwrap_or_default();
            checks.check(status == 403, || {
                format!("the proxy's answer must be a policy denial (403): {}", report.detail(name))
            });
        }
        // An allowed host fails here only because there is no internet: not with the policy's 403.
        let allowed = report.entry("proxy_allowed_domain").map(|e| e["status"].clone()).unwrap_or_default();
        checks
            .check(allowed != 403, || format!("an allowed host is denied: {}", report.detail("proxy_allowed_domain")));
        let errno = report.entry("direct_external").map(|e| e["errno"].clone()).unwrap_or_default();
        let expected = variant.direct_connect_errno();
        checks.check(errno == expected, || {
            format!("a direct connect must fail at once with {expected}: {}", report.detail("direct_external"))
        });
        checks.finish();
    });
}

#[test]
fn network_none_has_no_route_and_no_proxy_that_connects() {
    let test = "network_none_has_no_route_and_no_proxy_that_connects";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("net-none", variant);
        let (mut listener, port) = Listener::tcp();
        let mut targets = lab.targets();
        targets["loopback_port"] = json!(port);
        let options = lab.options().arg("--network").arg("none");
        let (_bridge, _, report) = run_attacks_with(&lab, options, "proxy_domains,loopback", targets);
        let mut checks = Checks::new();
        for name in
            ["proxy_denied_domain", "proxy_denied_http", "direct_external", "loopback_direct", "loopback_via_proxy"]
        {
            checks.blocked(&report, name);
        }
        checks.check(report.succeeded("proxy_allowed_domain") == Some(false), || {
            format!("--network none reached even the allowed host: {}", report.detail("proxy_allowed_domain"))
        });
        let errno = report.entry("direct_external").map(|e| e["errno"].clone()).unwrap_or_default();
        let expected = variant.direct_connect_errno();
        checks.check(errno == expected, || format!("expected {expected}: {}", report.detail("direct_external")));
        let accepted = listener.accepted();
        checks.check(accepted == 0, || format!("the host's 127.0.0.1:{port} was connected to {accepted} time(s)"));
        checks.finish();
    });
}

// ---- kernel surface and resources ------------------------------------------------------------------------------

#[test]
/// Also against the sandbox's first process (`sandbox-init`, which holds a warm server's door): no fd of it, no
/// read of its environment or memory.
fn seccomp_blocks_namespaces_ptrace_and_keyrings() {
    let test = "seccomp_blocks_namespaces_ptrace_and_keyrings";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("seccomp", variant);
        let (_bridge, _, report) = run_attacks(&lab, lab.options(), "seccomp");
        let mut checks = Checks::new();
        for name in [
            "seccomp_status",
            "unshare_userns",
            "unshare_cmd",
            "ptrace_traceme",
            "keyctl",
            "init_pidfd_getfd",
            "init_environ",
            "init_mem",
            "process_madvise",
        ] {
            checks.blocked(&report, name);
        }
        let status = report.entry("seccomp_status").cloned().unwrap_or_default();
        checks.check(status["seccomp"] == "2" && status["no_new_privs"] == "1", || {
            format!("Seccomp must be 2 and NoNewPrivs 1: {}", report.detail("seccomp_status"))
        });
        checks.finish();
    });
}

#[test]
fn max_processes_bounds_a_fork_bomb() {
    let test = "max_processes_bounds_a_fork_bomb";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("fork-bomb", variant);
        let options = lab.options().arg("--max-processes").arg("64");
        let mut bridge = Bridge::start(options);
        let sid = bridge.new_session(&lab.ws);
        let mut checks = Checks::new();
        // A cgroup refuses the excess (the CLI goes on and reports, unless the bridge saw the session's budget spent
        // first and stopped the turn); without one, the sandbox's first process stops everything. Either way the
        // turn's error says why.
        match lab.attack_or_stopped(&mut bridge, &sid, "fork_bomb") {
            Ok(report) => checks.blocked(&report, "fork_bomb"),
            Err(message) => checks.check(
                message.ends_with("Error: the sandbox exceeded its process limit (64); everything in it was stopped")
                    || message.ends_with("was stopped: the sandbox hit its process limit (64)"),
                || format!("the turn ended without naming the limit: {message}"),
            ),
        }
        let list = bridge.request("session/list", json!({}));
        checks.check(list.is_ok(), || format!("the bridge no longer answers session/list: {list:?}"));
        let gone = wait_until(SOON, || processes_under(&lab.root).iter().all(|(_, cmd)| !cmd.starts_with("sleep")));
        checks.check(gone, || format!("processes left after the turn: {:?}", processes_under(&lab.root)));
        checks.note_stderr(bridge.stderr());
        checks.finish();
    });
}

#[test]
fn max_memory_bounds_a_memory_hog() {
    let test = "max_memory_bounds_a_memory_hog";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("memory", variant);
        let options = lab.options().arg("--max-memory").arg("256M");
        let mut bridge = Bridge::start(options);
        let sid = bridge.new_session(&lab.ws);
        let mut checks = Checks::new();
        // A cgroup refuses the excess (the CLI goes on and reports); without one, the sandbox's first process stops
        // everything and the turn ends with an error that says why.
        match lab.attack_or_stopped(&mut bridge, &sid, "memory") {
            Ok(report) => checks.blocked(&report, "memory_hog"),
            Err(message) => checks.check(
                message
                    .ends_with("Error: the sandbox exceeded its memory limit (256 MiB); everything in it was stopped"),
                || format!("the turn ended without naming the limit: {message}"),
            ),
        }
        let list = bridge.request("session/list", json!({}));
        checks.check(list.is_ok(), || format!("the bridge no longer answers session/list: {list:?}"));
        checks.finish();
    });
}

// ---- the session's state and store ------------------------------------------------------------------------------

#[test]
fn symlinks_planted_in_the_state_dir_do_not_redirect_the_bridge() {
    let test = "symlinks_planted_in_the_state_dir_do_not_redirect_the_bridge";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("plant", variant);
        let watched = [lab.home.join("victim-dir"), lab.home.join("victim-dir2"), lab.home.join(".ssh")];
        let before: Vec<_> = watched.iter().map(|dir| snapshot(dir)).collect();
        let mut bridge = Bridge::start(lab.options());
        let sid = bridge.new_session(&lab.ws);
        let planted = lab.attack(&mut bridge, &sid, "plant", &lab.targets());
        let image = json!({"type": "image", "mimeType": "image/png", "data": "aGVsbG8="});
        let id = bridge.send_prompt_blocks(&sid, vec![json!({"type": "text", "text": "ATTACKS:noop look"}), image]);
        let next = bridge.finish_turn(&sid, id);
        let deleted = bridge.request("session/delete", json!({"sessionId": sid}));
        let mut checks = Checks::new();
        checks.note_stderr(bridge.stderr());
        let plants = ["plant_config_symlink", "plant_attachments_symlink", "plant_data_symlink"];
        let planted: Vec<String> = plants.iter().map(|name| planted.detail(name)).collect();
        for (dir, before) in watched.iter().zip(before) {
            let after = snapshot(dir);
            checks.check(after == before, || {
                format!(
                    "{} changed on the host after the next turn ({:?}) and the delete ({deleted:?}):\n\
                     before {before:#?}\nafter {after:#?}\nplanted: {planted:#?}",
                    dir.display(),
                    next.result
                )
            });
        }
        checks.finish();
    });
}

#[test]
fn path_like_sandbox_ids_stay_inside_the_data_dir() {
    let test = "path_like_sandbox_ids_stay_inside_the_data_dir";
    for_each_variant(test, all_variants(test), |variant| {
        let mut checks = Checks::new();
        // `/`, a path relative to the bridge's cwd, and one that climbs out of the sessions dir; the victim has
        // a `home` so that it looks like a state dir.
        for tampered in ["/", "../../victim", "<sessions>/../../victim"] {
            check_tampered_sandbox_id(variant, tampered, &mut checks);
        }
        checks.finish();
    });
}

/// Sets a session's stored `sandbox_id` to `tampered`, prompts and deletes the session: the prompt fails naming
/// the sandbox or runs in a fresh sandbox of the data dir, and nothing outside the data dir changes.
fn check_tampered_sandbox_id(variant: Variant, tampered: &str, checks: &mut Checks) {
    let lab = Lab::new("sandbox-id", variant);
    let sessions = lab.data.join("sessions");
    let tampered = tampered.replace("<sessions>", &sessions.display().to_string());
    let case = format!("sandbox_id {tampered:?}");
    let victim = lab.root.join("victim");
    lab.write(&victim.join("home/keep.txt"), &format!("the user's own directory {}\n", lab.nonce));
    lab.write(&victim.join("config/keep.txt"), "keep\n");

    let mut bridge = Bridge::start(lab.options());
    let sid = bridge.new_session(&lab.ws);
    assert_eq!(bridge.prompt(&sid, "ATTACKS:noop").stop_reason(), "end_turn");
    stop(bridge);
    lab.edit_store("UPDATE sessions SET sandbox_id = ?1 WHERE id = ?2", &[&tampered, &sid]);

    let _litter = RootLitter::watch(&lab.nonce);
    let root_before = ["/", "/home"].map(|dir| (dir, names(Path::new(dir))));
    let victim_before = snapshot(&victim);
    let mut bridge = Bridge::start(lab.options());
    lab.write_targets(&lab.ws, &lab.targets());
    let turn = bridge.prompt(&sid, "ATTACKS:state_probe");
    let report = Report::read(&lab.ws, &bridge);
    let stored = lab.stored_sandbox_id(&sid);
    let deleted = bridge.request("session/delete", json!({"sessionId": sid}));
    checks.note_stderr(bridge.stderr());

    match &turn.result {
        Ok(_) => {
            let fresh = stored.as_deref().is_some_and(|id| {
                let path = Path::new(id);
                id != tampered
                    && path.is_absolute()
                    && !path.components().any(|c| c == std::path::Component::ParentDir)
                    && path.starts_with(&sessions)
            });
            checks.check(fresh, || format!("{case}: the prompt ran in a sandbox that is not a fresh one: {stored:?}"));
        }
        Err(e) => checks.check(e.full_text().to_lowercase().contains("sandbox"), || {
            format!("{case}: the prompt failed without saying why: {e}")
        }),
    }
    let written: Vec<PathBuf> = report
        .as_ref()
        .and_then(|r| r.entry("state_writes"))
        .and_then(|e| e["written"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.as_str().map(PathBuf::from))
        .collect();
    for path in &written {
        let real = path.canonicalize().unwrap_or_else(|_| path.clone());
        checks.check(real.starts_with(&sessions), || {
            format!("{case}: the CLI's HOME or XDG dirs are outside the data dir: it wrote {}", real.display())
        });
    }
    let victim_after = snapshot(&victim);
    checks.check(victim_after == victim_before, || {
        format!(
            "{case}: {} changed (turn: {:?}, delete: {deleted:?}):\nbefore {victim_before:#?}\nafter {victim_after:#?}",
            victim.display(),
            turn.result
        )
    });
    for (dir, before) in &root_before {
        let new: Vec<String> = names(Path::new(dir)).difference(before).cloned().collect();
        checks.check(new.is_empty(), || format!("{case}: new entries in {dir} on the host: {new:?}"));
    }
    let ours = format!("acp-attack-{}", lab.nonce);
    for path in written.iter().filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy() == ours)) {
        let _ = std::fs::remove_file(path);
    }
}

/// Removes, when dropped, what a session whose state dir was `/` made appear in `/` and `/home`: the state dir's
/// own subdirectories and files named with the test's nonce. Nothing else is touched.
struct RootLitter {
    nonce: String,
    before: Vec<(&'static str, BTreeSet<String>)>,
}

impl RootLitter {
    fn watch(nonce: &str) -> RootLitter {
        RootLitter { nonce: nonce.into(), before: ["/", "/home"].map(|dir| (dir, names(Path::new(dir)))).to_vec() }
    }
}

impl Drop for RootLitter {
    fn drop(&mut self) {
        const STATE_SUBDIRS: &[&str] = &["config", "data", "cache", "state", "attachments"];
        for (dir, before) in &self.before {
            for name in names(Path::new(dir)).difference(before) {
                if STATE_SUBDIRS.contains(&name.as_str()) || name.contains(&self.nonce) {
                    let path = Path::new(dir).join(name);
                    eprintln!("cleaning up {} (made by the tampered session)", path.display());
                    let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
                }
            }
        }
    }
}

// ---- workspaces and sessions --------------------------------------------------------------------------------------

/// Whether `result` is the JSON-RPC invalid-params error, with a message that says what is wrong with `path`.
fn rejected_as_bad_workspace(result: &Result<Value, RpcError>, path: &Path) -> bool {
    match result {
        Err(e) => {
            let text = e.full_text();
            e.code == -32602
                && (text.contains(&path.display().to_string()) || text.to_lowercase().contains("workspace"))
        }
        Ok(_) => false,
    }
}

#[test]
fn bad_workspaces_are_refused() {
    let test = "bad_workspaces_are_refused";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("bad-ws", variant);
        let mut bridge = Bridge::start(lab.options());
        let mut checks = Checks::new();
        let candidates = [
            PathBuf::from("/"),
            PathBuf::from("/etc"),
            PathBuf::from("/usr"),
            PathBuf::from("/proc"),
            lab.home.clone(),
            lab.data.clone(),
            lab.root.clone(),
        ];
        for cwd in candidates {
            let result = bridge.request("session/new", json!({"cwd": cwd, "mcpServers": []}));
            checks.check(rejected_as_bad_workspace(&result, &cwd), || {
                format!("session/new in {} must be refused with -32602 saying why, got {result:?}", cwd.display())
            });
        }
        checks.note_stderr(bridge.stderr());
        checks.finish();
    });
}

#[test]
fn a_stored_session_whose_workspace_is_root_is_refused() {
    let test = "a_stored_session_whose_workspace_is_root_is_refused";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("stored-root", variant);
        let mut bridge = Bridge::start(lab.options());
        let sid = bridge.new_session(&lab.ws);
        assert_eq!(bridge.prompt(&sid, "ATTACKS:noop").stop_reason(), "end_turn");
        stop(bridge);
        lab.edit_store("UPDATE sessions SET cwd = '/' WHERE id = ?1", &[&sid]);
        let root = Path::new("/");
        let mut bridge = Bridge::start(lab.options());
        let mut checks = Checks::new();
        let loaded = bridge.load_session(&sid, root).result;
        checks.check(rejected_as_bad_workspace(&loaded, root), || format!("session/load answered {loaded:?}"));
        let resumed = bridge.request("session/resume", json!({"sessionId": sid, "cwd": "/"}));
        checks.check(rejected_as_bad_workspace(&resumed, root), || format!("session/resume answered {resumed:?}"));
        let prompted = bridge.prompt(&sid, "an ordinary prompt").result;
        checks.check(rejected_as_bad_workspace(&prompted, root), || format!("session/prompt answered {prompted:?}"));
        checks.note_stderr(bridge.stderr());
        checks.finish();
    });
}

#[test]
fn an_amp_bridge_does_not_run_an_opencode_session() {
    let test = "an_amp_bridge_does_not_run_an_opencode_session";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("amp-oc", variant);
        let mut bridge = Bridge::start(lab.options());
        let sid = bridge.new_session(&lab.ws);
        assert_eq!(bridge.prompt(&sid, "ATTACKS:noop").stop_reason(), "end_turn");
        stop(bridge);
        let runs = lab.runs(&lab.ws);
        let mut options = lab.options();
        options.agent = "amp".into();
        let mut bridge = Bridge::start(options);
        let result = bridge.prompt(&sid, "ATTACKS:noop").result;
        let mut checks = Checks::new();
        checks.note_stderr(bridge.stderr());
        checks.check(result.as_ref().is_err_and(|e| e.full_text().to_lowercase().contains("opencode")), || {
            format!("prompting an OpenCode session on an Amp bridge must fail naming OpenCode, got {result:?}")
        });
        checks.check(lab.runs(&lab.ws) == runs, || "the OpenCode CLI ran anyway".into());
        checks.check(!lab.ws.join(".fake-cli").exists(), || "the Amp CLI ran on the OpenCode session".into());
        checks.finish();
    });
}

// ---- environment -------------------------------------------------------------------------------------------------

/// The bridge's options with secrets (and the provider key of the user's OpenCode config) in its environment;
/// the targets tell the hostile CLI their values.
fn with_secrets(lab: &Lab, mut options: BridgeOptions) -> (BridgeOptions, Value) {
    let mut targets = lab.targets();
    for name in SECRET_VARIABLES {
        let value = format!("secret-{name}-{}", lab.nonce);
        options = options.env(name, &value);
        targets["secrets"][name] = json!(value);
    }
    let provider = format!("provider-key-{}", lab.nonce);
    options = options.env("FAKE_PROVIDER_KEY", &provider);
    targets["provider_env"] = json!({"FAKE_PROVIDER_KEY": provider});
    (options, targets)
}

#[test]
fn secrets_in_the_bridge_environment_do_not_reach_the_cli() {
    let test = "secrets_in_the_bridge_environment_do_not_reach_the_cli";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("env", variant);
        let (options, targets) = with_secrets(&lab, lab.options());
        let (_bridge, _, report) = run_attacks_with(&lab, options, "env", targets);
        let mut checks = Checks::new();
        checks.blocked(&report, "env_leak");
        checks.worked(&report, "env_provider");
        if variant.sandboxed() {
            checks.blocked(&report, "env_other_processes");
        } else if report.succeeded("env_other_processes") == Some(true) {
            eprintln!("NOTE (--sandbox none, not asserted): {}", report.detail("env_other_processes"));
        }
        checks.finish();
    });
}

#[test]
fn pass_env_passes_exactly_the_named_variable() {
    let test = "pass_env_passes_exactly_the_named_variable";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("pass-env", variant);
        let (options, mut targets) = with_secrets(&lab, lab.options().arg("--pass-env").arg("MY_SERVICE_API_TOKEN"));
        targets["expected_pass"] = json!(["MY_SERVICE_API_TOKEN"]);
        let (_bridge, _, report) = run_attacks_with(&lab, options, "env", targets);
        let mut checks = Checks::new();
        checks.worked(&report, "env_pass");
        checks.blocked(&report, "env_leak");
        checks.worked(&report, "env_provider");
        checks.finish();
    });
}

// ---- processes that try to outlive the turn ------------------------------------------------------------------------

#[test]
fn daemons_die_with_the_turn_a_cancel_and_a_killed_bridge() {
    let test = "daemons_die_with_the_turn_a_cancel_and_a_killed_bridge";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("daemon", variant);
        let mut checks = Checks::new();
        let marker = |tag: &str| format!("acp-attack-daemon-{}-{tag}", lab.nonce);
        let gone = |marker: &str| wait_until(SOON, || processes_with(marker).is_empty());

        let mut bridge = Bridge::start(lab.options());
        let sid = bridge.new_session(&lab.ws);
        let report = lab.attack(&mut bridge, &sid, "daemon TAG:end", &lab.targets());
        checks.worked(&report, "daemon");
        checks.check(gone(&marker("end")), || {
            format!("a daemon outlived its turn: {:?}", processes_with(&marker("end")))
        });

        for how in ["cancel", "kill"] {
            lab.write_targets(&lab.ws, &lab.targets());
            let id = bridge.send_prompt(&sid, &format!("ATTACKS:daemon,hang TAG:{how}"));
            let report = Report::wait(&lab.ws, &bridge);
            checks.worked(&report, "daemon");
            let seen = wait_until(SOON, || !processes_with(&marker(how)).is_empty());
            checks.check(seen, || format!("the {how} daemon never showed up in /proc"));
            if how == "cancel" {
                bridge.cancel(&sid);
                let answer = bridge.wait_response(id);
                checks.check(answer.as_ref().is_ok_and(|r| r["stopReason"] == "cancelled"), || {
                    format!("the cancelled prompt answered {answer:?}")
                });
            } else {
                checks.note_stderr(bridge.stderr());
                bridge.kill9();
            }
            checks
                .check(gone(&marker(how)), || format!("a daemon outlived a {how}: {:?}", processes_with(&marker(how))));
            let left = wait_until(SOON, || processes_under(&lab.ws).is_empty());
            checks.check(left, || {
                format!("processes left in the workspace after a {how}: {:?}", processes_under(&lab.ws))
            });
        }
        checks.finish();
    });
}

#[test]
fn a_descendant_holding_stdout_does_not_hold_the_turn() {
    let test = "a_descendant_holding_stdout_does_not_hold_the_turn";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("holder", variant);
        let mut bridge = Bridge::start(lab.options());
        let sid = bridge.new_session(&lab.ws);
        lab.write_targets(&lab.ws, &lab.targets());
        let id = bridge.send_prompt(&sid, "ATTACKS:pipe_holder TAG:pipe");
        // A failure bound, not a speed test: the holder keeps the pipes open for 60 s.
        let bound = Duration::from_secs(20);
        let answer = bridge.wait_response_within(id, bound);
        let mut checks = Checks::new();
        checks.note_stderr(bridge.stderr());
        checks.check(answer.as_ref().is_some_and(|a| a.as_ref().is_ok_and(|r| r["stopReason"] == "end_turn")), || {
            format!(
                "the prompt did not end its turn within {bound:?} while a detached descendant held stdout: {answer:?}"
            )
        });
        let marker = format!("acp-attack-holder-{}-pipe", lab.nonce);
        checks.check(wait_until(SOON, || processes_with(&marker).is_empty()), || {
            format!("the pipe holder outlived the turn: {:?}", processes_with(&marker))
        });
        checks.finish();
    });
}

#[test]
fn turn_timeout_ends_a_turn_that_never_stops_talking() {
    let test = "turn_timeout_ends_a_turn_that_never_stops_talking";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("turn-timeout", variant);
        let mut bridge = Bridge::start(lab.options().arg("--turn-timeout").arg("5"));
        let sid = bridge.new_session(&lab.ws);
        lab.write_targets(&lab.ws, &lab.targets());
        // The CLI prints a line every 0.5 s for two minutes: the idle timeout never fires.
        let id = bridge.send_prompt(&sid, "ATTACKS:drip");
        let bound = Duration::from_secs(30);
        let answer = bridge.wait_response_within(id, bound);
        let mut checks = Checks::new();
        checks.note_stderr(bridge.stderr());
        checks
            .check(answer.as_ref().is_some_and(|a| a.as_ref().map_or(true, |r| r["stopReason"] != "end_turn")), || {
                format!("a 5 s --turn-timeout did not end the turn within {bound:?}: {answer:?}")
            });
        let left = wait_until(SOON, || processes_under(&lab.ws).is_empty());
        checks.check(left, || format!("processes left after the timeout: {:?}", processes_under(&lab.ws)));
        checks.finish();
    });
}

// ---- the CLI itself -----------------------------------------------------------------------------------------------

#[test]
fn a_cli_installed_under_tmp_runs_in_the_sandbox() {
    let test = "a_cli_installed_under_tmp_runs_in_the_sandbox";
    for_each_variant(test, bwrap_variants(test), |variant| {
        let lab = Lab::new("tmp-cli", variant);
        let bin = tempfile::Builder::new().prefix("acp-attack-bin-").tempdir_in("/tmp").unwrap();
        std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for name in ["hostile", "hostile.py"] {
            std::fs::copy(fakes_dir().join(name), bin.path().join(name)).unwrap();
            std::fs::set_permissions(bin.path().join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let options = lab.options().env("ACP_SANDBOX_OPENCODE_BIN", &bin.path().join("hostile").display().to_string());
        let mut bridge = Bridge::start(options);
        let sid = bridge.new_session(&lab.ws);
        lab.write_targets(&lab.ws, &lab.targets());
        let turn = bridge.prompt(&sid, "ATTACKS:noop");
        let mut checks = Checks::new();
        checks.note_stderr(bridge.stderr());
        checks.check(turn.result.as_ref().is_ok_and(|r| r["stopReason"] == "end_turn"), || {
            format!("a CLI under {} did not run: {:?}", bin.path().display(), turn.result)
        });
        checks.check(lab.runs(&lab.ws) == 1, || "the CLI under /tmp never ran".into());
        checks.finish();
    });
}

// ---- issue 16: the host's own addresses, floods, low ports, unix sockets ---------------------------------------

/// The host's interface addresses but loopback, with their interface, from the kernel.
fn host_interface_addresses() -> Vec<(std::net::IpAddr, String)> {
    let interfaces = nix::ifaddrs::getifaddrs().expect("getifaddrs");
    let mut found: Vec<(std::net::IpAddr, String)> = interfaces
        .filter_map(|interface| {
            let address = interface.address?;
            let ip = match (address.as_sockaddr_in(), address.as_sockaddr_in6()) {
                (Some(v4), _) => std::net::IpAddr::V4(v4.ip()),
                (_, Some(v6)) => std::net::IpAddr::V6(v6.ip()),
                _ => return None,
            };
            (!ip.is_loopback()).then_some((ip, interface.interface_name))
        })
        .collect();
    found.dedup();
    found
}

/// The range the proxy names for an interface address it refuses by range anyway, `None` for any other (refused
/// as the host's own). The usual ranges of interface addresses only.
fn refused_range(ip: std::net::IpAddr) -> Option<&'static str> {
    match ip {
        std::net::IpAddr::V4(v4) => match v4.octets() {
            [10, ..] | [172, 16..=31, ..] | [192, 168, ..] => Some("private"),
            [100, 64..=127, ..] => Some("shared (CGNAT)"),
            [169, 254, ..] => Some("link-local"),
            _ => None,
        },
        std::net::IpAddr::V6(v6) => match v6.segments()[0] {
            first if first & 0xffc0 == 0xfe80 => Some("link-local"),
            first if first & 0xfe00 == 0xfc00 => Some("private (unique local)"),
            _ => None,
        },
    }
}

fn authority_of(ip: std::net::IpAddr, port: u16) -> String {
    match ip {
        std::net::IpAddr::V6(v6) => format!("[{v6}]:{port}"),
        std::net::IpAddr::V4(v4) => format!("{v4}:{port}"),
    }
}

/// The bridge's options with `/etc/hosts` replaced by `hosts` for the bridge alone (a private mount namespace):
/// the tests have no DNS, and the proxy resolves names as the bridge does.
fn with_hosts_file(lab: &Lab, mut options: BridgeOptions, hosts: &str) -> BridgeOptions {
    let file = lab.root.join("hosts");
    lab.write(&file, hosts);
    let mut launcher: Vec<String> = if is_root() {
        vec!["unshare".into(), "--mount".into(), "--propagation".into(), "private".into()]
    } else {
        vec!["unshare".into(), "--user".into(), "--map-current-user".into(), "--mount".into()]
    };
    launcher.extend(["sh", "-c", r#"mount --bind "$0" /etc/hosts && exec "$@""#].map(String::from));
    launcher.push(file.display().to_string());
    launcher.append(&mut options.launcher);
    options.launcher = launcher;
    options
}

#[test]
fn the_proxy_refuses_the_hosts_own_addresses_and_names_that_resolve_to_them() {
    let test = "the_proxy_refuses_the_hosts_own_addresses_and_names_that_resolve_to_them";
    let own = host_interface_addresses();
    assert!(!own.is_empty(), "this host has no interface address but loopback: nothing to attack");
    for_each_variant(test, bwrap_variants(test), |variant| {
        // A service bound on all interfaces, as the host's own ones often are.
        let listener = TcpListener::bind("0.0.0.0:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let v4 = own.iter().find(|(ip, _)| ip.is_ipv4()).cloned();
        let v6 = own.iter().find(|(ip, _)| ip.is_ipv6() && refused_range(*ip) != Some("link-local")).cloned();
        let mut hosts = String::from("127.0.0.1 localhost\n");
        let mut names = Vec::new();
        for (label, found) in [("self4", &v4), ("self6", &v6)] {
            if let Some((ip, interface)) = found {
                hosts.push_str(&format!("{ip} {label}.example.test\n"));
                names.push((label, *ip, interface.clone()));
            }
        }
        for mode in ["open", "allow=example.test"] {
            let lab = Lab::new("host-addr", variant);
            let options = with_hosts_file(&lab, lab.options().arg("--network").arg(mode), &hosts);
            // (label, what is asked, the address it is, its interface)
            let mut cases: Vec<(String, String, std::net::IpAddr, String)> = Vec::new();
            if mode == "open" {
                for (i, (ip, interface)) in own.iter().enumerate() {
                    cases.push((format!("ip{i}"), authority_of(*ip, port), *ip, interface.clone()));
                }
            }
            for (label, ip, interface) in &names {
                cases.push((label.to_string(), format!("{label}.example.test:{port}"), *ip, interface.clone()));
            }
            let mut targets = lab.targets();
            targets["host_targets"] = json!(
                cases
                    .iter()
                    .map(|(label, asked, _, _)| json!({"label": label, "authority": asked}))
                    .collect::<Vec<_>>()
            );
            let (_bridge, _, report) = run_attacks_with(&lab, options, "host_address", targets);
            let mut checks = Checks::new();
            for (label, asked, ip, interface) in &cases {
                let name = format!("host_address:{label}");
                checks.blocked(&report, &name);
                let why = match refused_range(*ip) {
                    Some(range) => format!("{ip} is a {range} address"),
                    None => format!("{ip} is an address of this host ({interface})"),
                };
                let expected = format!("acp-sandbox: access to {asked} is blocked: {why}\n");
                let entry = report.entry(&name).cloned().unwrap_or_default();
                checks.check(entry["status"] == 403 && entry["body"] == expected.as_str(), || {
                    format!("--network {mode}: expected 403 with {expected:?}: {}", report.detail(&name))
                });
            }
            let mut reached = 0;
            while listener.accept().is_ok() {
                reached += 1;
            }
            checks
                .check(reached == 0, || format!("--network {mode}: the host's service was reached {reached} time(s)"));
            checks.finish();
        }
    });
}

#[test]
fn proxy_denials_are_logged_with_their_host() {
    let test = "proxy_denials_are_logged_with_their_host";
    for_each_variant(test, bwrap_variants(test), |variant| {
        let lab = Lab::new("deny-log", variant);
        let options = lab.options().arg("--network").arg("allow=allowed.example");
        let (bridge, sid, report) = run_attacks(&lab, options, "proxy_domains");
        let mut checks = Checks::new();
        checks.blocked(&report, "proxy_denied_domain");
        checks.blocked(&report, "proxy_denied_http");
        stop(bridge);
        let log = bridge_log(&lab);
        for expected in [
            format!(
                "proxy denied CONNECT denied.example:443 for session {sid}: not in --network allow=allowed.example"
            ),
            format!("proxy denied GET denied.example:80 for session {sid}: not in --network allow=allowed.example"),
        ] {
            let found = log.lines().filter(|line| line.contains(" WARN ") && line.ends_with(&format!(": {expected}")));
            let count = found.count();
            checks.check(count == 1, || format!("{count} log lines end with {expected:?}; the log:\n{log}"));
        }
        checks.finish();
    });
}

/// The bridge's log so far (it rolls daily: acp-sandbox.log.YYYY-MM-DD).
fn bridge_log(lab: &Lab) -> String {
    let mut log = String::new();
    for name in names(&lab.data).into_iter().filter(|name| name.starts_with("acp-sandbox.log")) {
        log.push_str(&std::fs::read_to_string(lab.data.join(name)).unwrap_or_default());
    }
    log
}

#[test]
fn network_ask_refuses_what_the_editor_refuses_and_never_asks_about_a_listed_host() {
    let test = "network_ask_refuses_what_the_editor_refuses_and_never_asks_about_a_listed_host";
    for_each_variant(test, bwrap_variants(test), |variant| {
        let lab = Lab::new("ask", variant);
        let options = lab.options().arg("--network").arg("ask=allowed.example");
        // The test's editor answers every question `cancelled`: a refusal.
        let (bridge, sid, report) = run_attacks(&lab, options, "proxy_domains");
        let mut checks = Checks::new();
        for name in ["proxy_denied_domain", "proxy_denied_http", "direct_external"] {
            checks.blocked(&report, name);
        }
        for name in ["proxy_denied_domain", "proxy_denied_http"] {
            let status = report.entry(name).map(|e| e["status"].clone()).unwrap_or_default();
            checks.check(status == 403, || format!("a refused host must get the proxy's 403: {}", report.detail(name)));
        }
        let allowed = report.entry("proxy_allowed_domain").map(|e| e["status"].clone()).unwrap_or_default();
        checks.check(allowed != 403, || format!("a listed host is denied: {}", report.detail("proxy_allowed_domain")));
        let asked: Vec<&str> =
            bridge.permission_requests.iter().filter_map(|request| request["toolCall"]["title"].as_str()).collect();
        checks.check(asked == ["Connect to denied.example:443", "Connect to denied.example:80"], || {
            format!("one question per refused host:port, none for the listed one: {asked:?}")
        });
        stop(bridge);
        let log = bridge_log(&lab);
        for method_target in ["CONNECT denied.example:443", "GET denied.example:80"] {
            let expected = format!(
                "proxy denied {method_target} for session {sid}: refused by the user (--network ask=allowed.example)"
            );
            let count = log.lines().filter(|line| line.contains(" WARN ") && line.ends_with(&expected)).count();
            checks.check(count == 1, || format!("{count} log lines end with {expected:?}"));
        }
        checks.finish();
    });
}

#[test]
fn a_flood_of_proxy_connections_is_capped_and_another_session_still_works() {
    let test = "a_flood_of_proxy_connections_is_capped_and_another_session_still_works";
    /// The proxy's limit (`proxy::MAX_CONNECTIONS`).
    const CAP: u64 = 256;
    for_each_variant(test, bwrap_variants(test), |variant| {
        let lab = Lab::new("flood", variant);
        // A bridge (and so a sandbox) with 2048 descriptors. The CLI cannot make AF_UNIX sockets, so its flood goes
        // through sandbox-init's proxy port, which spends two of its own descriptors on each connection: 900 of them
        // fit there, and without the cap all 900 would be held open by the bridge.
        let mut options = lab.options();
        options.launcher.splice(0..0, ["prlimit", "--nofile=2048:2048", "--"].map(String::from));
        let mut bridge = Bridge::start(options);
        let flooding = bridge.new_session(&lab.ws);
        let mut targets = lab.targets();
        targets["proxy_socket"] = json!("/run/acp-sandbox/proxy.sock");
        targets["flood_count"] = json!(900);
        targets["proxy_cap"] = json!(CAP);
        lab.write_targets(&lab.ws, &targets);
        // The flood's connections stay open while the run hangs.
        let id = bridge.send_prompt(&flooding, "ATTACKS:proxy_flood,hang");
        let report = Report::wait(&lab.ws, &bridge);
        let mut checks = Checks::new();
        checks.blocked(&report, "proxy_flood");
        let entry = report.entry("proxy_flood").cloned().unwrap_or_default();
        let opened = entry["opened"].as_u64().unwrap_or(0);
        checks.check(opened == 900, || {
            format!("the flood opened too few connections to matter: {}", report.detail("proxy_flood"))
        });
        checks.check(entry["silent"] == CAP && entry["answered"].as_u64() == Some(opened.saturating_sub(CAP)), || {
            format!(
                "exactly {CAP} connections must be served, the rest refused at once: {}",
                report.detail("proxy_flood")
            )
        });
        let refusal = "HTTP/1.1 503 Service Unavailable";
        checks.check(entry["answers"][refusal].as_u64() == Some(opened.saturating_sub(CAP)), || {
            format!("the excess must be answered {refusal:?}: {}", report.detail("proxy_flood"))
        });
        // Meanwhile another session's turn runs whole, its own proxy included.
        let other_ws = lab.workspace("other");
        let other = bridge.new_session(&other_ws);
        let mut other_targets = lab.targets();
        other_targets["loopback_port"] = json!(1);
        let other_report = lab.attack_in(&mut bridge, &other, &other_ws, "proxy_domains", &other_targets);
        checks.check(other_report.entry("proxy_allowed_domain").is_some_and(|e| e["status"].is_u64()), || {
            format!("the other session's proxy did not answer: {}", other_report.detail("proxy_allowed_domain"))
        });
        bridge.cancel(&flooding);
        let answer = bridge.wait_response(id);
        checks.check(answer.as_ref().is_ok_and(|r| r["stopReason"] == "cancelled"), || {
            format!("the flooding prompt answered {answer:?}")
        });
        checks.note_stderr(bridge.stderr());
        checks.finish();
    });
}

#[test]
fn a_model_endpoint_on_a_low_port_works_in_the_sandbox() {
    let test = "a_model_endpoint_on_a_low_port_works_in_the_sandbox";
    assert!(is_root(), "{test} binds 127.0.0.1:80 on the host: run the attack tests as root");
    for_each_variant(test, bwrap_variants(test), |variant| {
        let lab = Lab::new("low-port", variant);
        let listener = TcpListener::bind("127.0.0.1:80").expect("bind 127.0.0.1:80 on the host");
        let marker = format!("gateway {}", lab.nonce);
        let answer =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{marker}", marker.len());
        let server = std::thread::spawn(move || {
            use std::io::{Read, Write};
            // Polled, with a failure bound: a run that never comes must free the port for the next variant.
            listener.set_nonblocking(true).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            let mut stream = loop {
                match listener.accept() {
                    Ok((stream, _)) => break stream,
                    Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                    Err(e) => return format!("no connection within 60 s: {e}"),
                }
            };
            stream.set_nonblocking(false).unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            stream.write_all(answer.as_bytes()).unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        let url = "http://127.0.0.1:80/v1";
        let options = lab.options().env("OPENAI_BASE_URL", url).arg("--pass-env").arg("OPENAI_BASE_URL");
        let mut targets = lab.targets();
        targets["endpoint_url"] = json!(format!("{url}/models"));
        let (_bridge, _, report) = run_attacks_with(&lab, options, "model_endpoint,capabilities", targets);
        let mut checks = Checks::new();
        checks.worked(&report, "model_endpoint");
        let body = report.entry("model_endpoint").map(|e| e["body"].clone()).unwrap_or_default();
        checks.check(body.as_str().is_some_and(|b| b.ends_with(&format!("\r\n\r\n{marker}"))), || {
            format!("not the host's gateway: {}", report.detail("model_endpoint"))
        });
        // The capability that bound the port is gone before the CLI starts, from the bounding set too.
        checks.blocked(&report, "capabilities");
        let caps = report.entry("capabilities").map(|e| e["detail"].to_string()).unwrap_or_default();
        checks.check(caps.contains("CapBnd 0000000000000000") && caps.contains("CapPrm 0000000000000000"), || {
            format!("capabilities left in the CLI: {caps}")
        });
        let head = server.join().unwrap();
        checks.check(head.starts_with("GET /v1/models HTTP/1.1\r\n"), || format!("the gateway got {head:?}"));
        checks.finish();
    });
}

#[test]
fn host_unix_sockets_at_unusual_paths_are_unreachable() {
    let test = "host_unix_sockets_at_unusual_paths_are_unreachable";
    for_each_variant(test, bwrap_variants(test), |variant| {
        let lab = Lab::new("unix-odd", variant);
        // Paths no deny-list names: a socket the user's own service made under ~, one deep in a project.
        let odd = [
            ("run_agent", lab.home.join(".run/ssh-agent.sock")),
            ("deep", lab.home.join("projects/a/b/c/.cache/x.sock")),
            ("workspace_parent", lab.root.join("service.sock")),
        ];
        let mut listeners = Vec::new();
        let mut sockets = Vec::new();
        for (label, path) in &odd {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            listeners.push((*label, Listener::unix(path)));
            lab.give(path.parent().unwrap());
            sockets.push(json!({"label": label, "path": path}));
        }
        let mut targets = lab.targets();
        targets["unix_sockets"] = json!(sockets);
        let (_bridge, _, report) =
            run_attacks_with(&lab, lab.options(), "unix_sockets,socketpair,own_unix_socket", targets);
        let mut checks = Checks::new();
        for (label, listener) in &mut listeners {
            let entry = format!("unix_socket:{label}");
            checks.blocked(&report, &entry);
            let detail = report.entry(&entry).map(|e| e["detail"].to_string()).unwrap_or_default();
            checks.check(detail.contains(": EACCES"), || format!("not refused at socket(): {}", report.detail(&entry)));
            let accepted = listener.accepted();
            checks.check(accepted == 0, || format!("the host's {label} socket was connected to {accepted} time(s)"));
        }
        // What runtimes need stays: a socketpair. A socket of the workspace's own is refused too (the price).
        checks.worked(&report, "socketpair");
        let own = report.entry("own_unix_socket").map(|e| e["errno"].clone()).unwrap_or_default();
        checks.check(own == "EACCES", || format!("expected EACCES: {}", report.detail("own_unix_socket")));
        checks.finish();
    });
}

// ---- an agent that speaks ACP --------------------------------------------------------------------------------

/// The text an ACP agent's turn answered, without the bridge's notes.
fn acp_said(bridge: &mut Bridge, sid: &str, scenario: &str) -> String {
    let turn = bridge.prompt(sid, &format!("SCENARIO:{scenario}"));
    if turn.stop_reason() != "end_turn" {
        bridge.fail(&format!("the ACP agent's turn did not end: {turn:?}"));
    }
    let chunks = turn.updates.iter().filter(|u| u["sessionUpdate"] == "agent_message_chunk");
    let texts = chunks.filter_map(|u| u["content"]["text"].as_str()).filter(|text| !text.trim().starts_with('_'));
    texts.collect::<String>().trim().to_string()
}

#[test]
fn an_acp_agents_requests_of_its_client_stay_inside_the_workspace() {
    // `tests/fakes/acp_agent.py` asks its client (the bridge) for every secret of the home, through a link planted
    // in the workspace too, and to write the user's .bashrc and the workspace's protected paths; its own shell reads
    // the key, and so do its terminals (under bubblewrap). Nothing outside the workspace is read or written, no
    // protected path is written, no canary reaches the editor; the agent's own writes in the workspace work.
    let test = "an_acp_agents_requests_of_its_client_stay_inside_the_workspace";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("acp-client", variant);
        let mut options =
            lab.options().arg("--agent-command").arg(&kit().fakes.join("acp_agent.py").display().to_string());
        options.agent = "custom".into();
        let key = lab.home.join(".ssh/id_ed25519");
        std::os::unix::fs::symlink(&key, lab.ws.join("key")).unwrap();
        // Codex's ChatGPT login (`login --agent codex --own`) is in the data dir: shown to a Codex session only.
        let login = lab.data.join("logins/codex/auth.json");
        std::fs::create_dir_all(login.parent().unwrap()).unwrap();
        std::fs::write(&login, format!("{{\"tokens\": \"CANARY-login-{}\"}}", lab.nonce)).unwrap();
        let protected = [".git/hooks/pre-commit", ".git/config", ".envrc", ".vscode/tasks.json", ".zed/settings.json"];
        let before = snapshot(&lab.ws);
        let mut bridge = Bridge::start(options);
        let sid = bridge.new_session(&lab.ws);
        let mut checks = Checks::new();
        let mut said = Vec::new();
        for rel in SECRET_FILES {
            let answer = acp_said(&mut bridge, &sid, &format!("read:{}", lab.home.join(rel).display()));
            checks.check(answer.starts_with("read error "), || format!("the bridge read ~/{rel} for it: {answer}"));
            said.push(answer);
        }
        let answer = acp_said(&mut bridge, &sid, &format!("read:{}", lab.ws.join("key").display()));
        checks.check(answer.starts_with("read error "), || format!("a link led the bridge's read out: {answer}"));
        said.push(answer);
        let answer = acp_said(&mut bridge, &sid, &format!("read:{}", login.display()));
        checks.check(answer.starts_with("read error "), || format!("the bridge read Codex's login for it: {answer}"));
        said.push(answer);
        let bashrc = lab.home.join(".bashrc");
        let answer = acp_said(&mut bridge, &sid, &format!("write:{}", bashrc.display()));
        checks.check(answer.starts_with("write error "), || format!("the bridge wrote ~/.bashrc for it: {answer}"));
        for rel in protected {
            let answer = acp_said(&mut bridge, &sid, &format!("write:{}", lab.ws.join(rel).display()));
            checks.check(answer.starts_with("write error "), || format!("the bridge wrote {rel} for it: {answer}"));
        }
        let fine = lab.ws.join("src/fine.txt");
        checks.check(acp_said(&mut bridge, &sid, &format!("write:{}", fine.display())) == "write ok", || {
            "the agent's own write in the workspace failed".to_string()
        });
        if variant.bwrap() {
            let answer = acp_said(&mut bridge, &sid, &format!("shell:cat {} 2>&1 | head -c 200", key.display()));
            checks.check(!answer.contains("CANARY"), || format!("the agent's own shell read the key: {answer}"));
            said.push(answer);
            let answer = acp_said(&mut bridge, &sid, &format!("shell:cat {} 2>&1 | head -c 200", login.display()));
            checks.check(!answer.contains("CANARY"), || format!("the agent's own shell read Codex's login: {answer}"));
            said.push(answer);
            // Its terminals run in the same sandbox, not on the host as an editor's would.
            let answer = acp_said(&mut bridge, &sid, &format!("terminal:cat {} 2>&1 | head -c 200", login.display()));
            checks.check(!answer.contains("CANARY"), || format!("a terminal read Codex's login: {answer}"));
            said.push(answer);
            for rel in SECRET_FILES {
                let path = lab.home.join(rel);
                let answer =
                    acp_said(&mut bridge, &sid, &format!("terminal:cat {} 2>&1 | head -c 200", path.display()));
                checks.check(!answer.contains("CANARY"), || format!("a terminal read ~/{rel}: {answer}"));
                said.push(answer);
            }
            let mut writes = vec![format!("echo pwned >> {}", bashrc.display())];
            for rel in protected {
                let path = lab.ws.join(rel);
                writes.push(format!("mkdir -p {}; echo pwned > {}", path.parent().unwrap().display(), path.display()));
            }
            for script in writes {
                let answer = acp_said(&mut bridge, &sid, &format!("terminal:{script}"));
                let refused = answer.starts_with("terminal 2 sh: 1: cannot create ");
                checks.check(refused, || format!("a terminal's write was not refused: {script}: {answer}"));
            }
        }
        stop(bridge);
        checks.check(std::fs::read_to_string(&bashrc).unwrap() == "# the user's own .bashrc\n", || {
            "~/.bashrc changed".to_string()
        });
        let mut after = snapshot(&lab.ws);
        let written = (after.remove("src").unwrap_or_default(), after.remove("src/fine.txt").unwrap_or_default());
        checks.check(written == ("dir".to_string(), format!("file {:?}", "written by the agent")), || {
            format!("the agent's write did not land: {written:?}")
        });
        after.retain(|path, _| !path.starts_with(".attack"));
        let mut expected = before.clone();
        expected.retain(|path, _| !path.starts_with(".attack"));
        checks.check(after == expected, || format!("the workspace changed beyond the agent's file: {after:?}"));
        let leaked: Vec<&String> = said.iter().filter(|text| text.contains("CANARY")).collect();
        checks.check(leaked.is_empty(), || format!("a canary reached the editor: {leaked:?}"));
        checks.finish();
    });
}

#[test]
fn an_acp_agent_racing_its_file_requests_with_links_never_reaches_outside_the_workspace() {
    // `tests/fakes/acp_agent.py`'s `swap`: a file of the workspace flips to a link to a file outside it (in the
    // agent's own home, which the sandbox shows it) and back, a folder to a link to a folder outside, while it asks
    // the bridge 1,000 times to read the one and write into the other. A check of the path followed by an open
    // would let some through; the bridge's open by descriptor, never following a link, lets none.
    let test = "an_acp_agent_racing_its_file_requests_with_links_never_reaches_outside_the_workspace";
    for_each_variant(test, all_variants(test), |variant| {
        let lab = Lab::new("acp-race", variant);
        let mut options =
            lab.options().arg("--agent-command").arg(&kit().fakes.join("acp_agent.py").display().to_string());
        options.agent = "custom".into();
        let mut bridge = Bridge::start(options);
        let sid = bridge.new_session(&lab.ws);
        let answer = acp_said(&mut bridge, &sid, "swap:1000");
        stop(bridge);
        assert_eq!(answer, "swap leaked 0 wrote-outside 0 answered 1000");
    });
}

// ---- an ACP agent's terminals share its limits -------------------------------------------------------------------

/// The bridge running `tests/fakes/acp_agent.py` in `lab`, with `limit` (a flag and its value).
fn acp_agent_with(lab: &Lab, limit: [&str; 2]) -> Bridge {
    let mut options = lab
        .options()
        .arg("--agent-command")
        .arg(&kit().fakes.join("acp_agent.py").display().to_string())
        .arg(limit[0])
        .arg(limit[1]);
    options.agent = "custom".into();
    Bridge::start(options)
}

#[test]
fn an_acp_agent_and_its_terminals_share_one_process_limit() {
    // Four terminals of fifteen sleepers each, one after the other, under --max-processes 32: each terminal used to
    // be a sandbox with a budget of its own (60 sleepers ran); now the agent and all its terminals share one.
    let test = "an_acp_agent_and_its_terminals_share_one_process_limit";
    for_each_variant(test, sandboxed_variants(test), |variant| {
        let lab = Lab::new("acp-terms-procs", variant);
        let mut bridge = acp_agent_with(&lab, ["--max-processes", "32"]);
        let sid = bridge.new_session(&lab.ws);
        let mut checks = Checks::new();
        let said = acp_said(&mut bridge, &sid, "terminals-procs:4");
        let sleepers = || processes_under(&lab.ws).into_iter().filter(|(_, cmd)| cmd == "sleep 3170").count();
        let running = sleepers();
        // The agent itself is one of the 32: never all of them are sleepers.
        checks.check(running > 0 && running < 32, || format!("{running} sleepers ran at once: {said}"));
        let started: usize = said
            .split(['|', ' '])
            .zip(said.split(['|', ' ']).skip(1))
            .filter(|(word, _)| *word == "started")
            .filter_map(|(_, count)| count.parse::<usize>().ok())
            .sum();
        checks.check(started < 32, || format!("the terminals started {started} sleepers: {said}"));
        checks.note_stderr(bridge.stderr());
        stop(bridge);
        checks.finish();
    });
}

/// Processes under `dir` holding more than `mib` MiB.
fn holding(dir: &Path, mib: u64) -> Vec<(i32, String)> {
    processes_under(dir)
        .into_iter()
        .filter(|(pid, _)| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let rss = status.lines().find_map(|line| line.strip_prefix("VmRSS:")).unwrap_or("0 kB");
            rss.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0) > mib << 10
        })
        .collect()
}

#[test]
fn an_acp_agent_and_its_terminals_share_one_memory_limit() {
    // Three terminals holding 200 MiB each under --max-memory 256M: each used to have 256 MiB of its own (all three
    // held at once); now the session has 256 MiB, so at most one holds. The budget is a cgroup's: as root here.
    let test = "an_acp_agent_and_its_terminals_share_one_memory_limit";
    let variants = sandboxed_variants(test).into_iter().filter(|variant| variant.who == Who::Me).collect();
    for_each_variant(test, variants, |variant| {
        let lab = Lab::new("acp-terms-memory", variant);
        let mut bridge = acp_agent_with(&lab, ["--max-memory", "256M"]);
        let sid = bridge.new_session(&lab.ws);
        let mut checks = Checks::new();
        let said = acp_said(&mut bridge, &sid, "terminals-memory:3");
        checks.check(said.matches("held").count() >= 1, || format!("no terminal could hold 200 MiB: {said}"));
        // The kernel ends the one it takes as it runs out: waited for, a moment.
        let at_most_one = wait_until(SOON, || holding(&lab.ws, 150).len() <= 1);
        checks.check(at_most_one, || format!("held 200 MiB at once: {:?} ({said})", holding(&lab.ws, 150)));
        checks.note_stderr(bridge.stderr());
        stop(bridge);
        checks.finish();
    });
}
