//! Benchmarks: translation throughput, store append and replay, and the bridge's own cost per turn.
//!
//! `cargo bench --bench throughput [-- NAME…]` prints one line per measurement (median of several runs) and the
//! process's peak memory. The per-turn numbers drive the real binary over stdio with a CLI that only prints a
//! recorded stream, so they measure the bridge (spawn, sandbox, translate, persist, send), not a model.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use acp_sandbox::agents::{AgentKind, TranslateContext, translate_all};
use acp_sandbox::store::{SessionRecord, Store};
use agent_client_protocol::v1::schema::{PermissionOptionKind, PromptResponse, SessionId, StopReason};
use serde_json::json;

use acp_client::{AcpClient, Answers, Pending, Updates, agent_chunk};

// The one ACP client of the bench and the integration tests: the official SDK's client role.
#[path = "../tests/support/acp_client.rs"]
mod acp_client;
mod threads;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn measure(runs: usize, mut f: impl FnMut()) -> Duration {
    f();
    median(
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed()
            })
            .collect(),
    )
}

fn context(workspace: &str) -> TranslateContext {
    TranslateContext {
        workspace: workspace.into(),
        agent_workspace: workspace.into(),
        terminal_output: true,
        context_window: 200_000,
        turn_key: String::new(),
    }
}

fn fixture(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(path)).unwrap()
}

fn bench_translate() {
    for (kind, file, workspace) in [
        (AgentKind::parse("opencode").unwrap(), "opencode/opencode-tools.jsonl", "/tmp/ws-oc"),
        (AgentKind::parse("amp").unwrap(), "amp/amp-tools.reconstructed.jsonl", "/tmp/ws"),
    ] {
        let one = fixture(file);
        let stream = one.repeat(200);
        let lines = stream.lines().count();
        let bytes = stream.len();
        let time = measure(5, || {
            std::hint::black_box(translate_all(kind, context(workspace), &stream));
        });
        println!(
            "translate {kind:<8} {lines:>6} lines  {:>8.1} ms  {:>9.0} lines/s  {:>6.1} MiB/s",
            time.as_secs_f64() * 1e3,
            lines as f64 / time.as_secs_f64(),
            bytes as f64 / time.as_secs_f64() / (1024.0 * 1024.0)
        );
    }
}

fn bench_store() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("bench.sqlite3")).unwrap();
        store
            .create_session(&SessionRecord {
                id: "s".into(),
                agent: "opencode".into(),
                cwd: "/w".into(),
                sandbox_provider: "local".into(),
                sandbox_id: None,
                native_id: None,
                title: None,
                config: json!({}),
                context: Default::default(),
                created_at: 0,
                updated_at: 0,
            })
            .await
            .unwrap();
        let update =
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x".repeat(200)}});
        let turn = store.start_turn("s", &json!([])).await.unwrap();
        let count = 100_000;
        // One by one, each awaited: a commit per update.
        let start = Instant::now();
        for _ in 0..count / 10 {
            store.append_event("s", turn, &update).await.unwrap();
        }
        let elapsed = start.elapsed();
        println!(
            "store     append    {:>6} updates {:>8.1} ms  {:>9.0} updates/s (each awaited)",
            count / 10,
            elapsed.as_secs_f64() * 1e3,
            (count / 10) as f64 / elapsed.as_secs_f64()
        );
        // Queued as a turn queues them (acknowledged in order, batched by the writer).
        let commits = store.commits();
        let start = Instant::now();
        let mut acks = std::collections::VecDeque::new();
        for _ in 0..count {
            acks.push_back(store.queue_event("s", turn, &update).await.unwrap());
        }
        for ack in acks {
            ack.await.unwrap();
        }
        let elapsed = start.elapsed();
        println!(
            "store     append    {count:>6} updates {:>8.1} ms  {:>9.0} updates/s (queued; {} transactions)",
            elapsed.as_secs_f64() * 1e3,
            count as f64 / elapsed.as_secs_f64(),
            store.commits() - commits
        );
        let all = count + count / 10;
        let mut samples = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            std::hint::black_box(store.history("s", usize::MAX).await.unwrap());
            samples.push(start.elapsed());
        }
        let time = median(samples);
        println!(
            "store     replay    {all:>6} updates {:>8.1} ms  {:>9.0} updates/s",
            time.as_secs_f64() * 1e3,
            all as f64 / time.as_secs_f64()
        );
    });
}

/// The built bridge of the `turns`, `stream` and `latency` rows: OpenCode's `run` backend on `fake`, logging only
/// warnings.
fn bridge_command(data_dir: &Path, sandbox: &str, extra: &[&str], fake: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_acp-sandbox"));
    command
        .args(["--agent", "opencode", "--sandbox", sandbox, "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .env("ACP_SANDBOX_OPENCODE_BIN", fake)
        // The fake prints a recorded `opencode run` stream: these rows measure the `run` backend.
        .env("ACP_SANDBOX_OPENCODE_BACKEND", "run")
        .env("RUST_LOG", "warn");
    command
}

/// How the bench's client answers: every permission it is asked for allowed once, no file writes offered.
fn allow_all() -> Answers {
    Answers { permission: Some(PermissionOptionKind::AllowOnce), ..Answers::default() }
}

fn bench_turns() {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-turns");
    let _ = std::fs::remove_dir_all(&root);
    let workspace = root.join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let fixture_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/opencode/opencode-tools.jsonl");
    let fake = root.join("fake-opencode");
    std::fs::write(&fake, format!("#!/bin/sh\ncat >/dev/null\ncat '{}'\n", fixture_path.display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // `bwrap --network host` leaves out the network namespace and the proxy: the difference is their cost.
    let variants: [(&str, &str, &[&str]); 3] =
        [("none", "none", &[]), ("bwrap", "bwrap", &[]), ("bwrap-host", "bwrap", &["--network", "host"])];
    for (label, sandbox, extra) in variants {
        if sandbox == "bwrap" && acp_sandbox::sandbox::local::bwrap::probe_bwrap().is_err() {
            println!("turn      {label:<10}  skipped: bubblewrap does not work here");
            continue;
        }
        let data = root.join(format!("data-{label}"));
        let start = Instant::now();
        let bridge = AcpClient::start(bridge_command(&data, sandbox, extra, &fake), allow_all());
        let startup = start.elapsed();
        let session = bridge.new_session(&workspace);
        let turns: Vec<Duration> = (0..20)
            .map(|i| {
                let start = Instant::now();
                let turn = bridge.prompt(&session, &format!("turn {i}"));
                assert_eq!(turn.stop_reason(), StopReason::EndTurn);
                start.elapsed()
            })
            .collect();
        let load = measure(5, || {
            bridge.load_session(&session, &workspace).result.unwrap();
        });
        let bridge_peak = peak_rss_kib_of(&format!("/proc/{}/status", bridge.pid()));
        bridge.close();
        println!(
            "turn      {label:<10}  startup {:>6.1} ms  turn (16 updates) {:>6.1} ms  load (20 turns) {:>6.1} ms  bridge peak RSS {:>5.1} MiB",
            startup.as_secs_f64() * 1e3,
            median(turns).as_secs_f64() * 1e3,
            load.as_secs_f64() * 1e3,
            bridge_peak.unwrap_or(0) as f64 / 1024.0
        );
    }
}

/// One turn of 100,000 text events through the whole bridge (translate, store, acknowledge, send): updates/s as the
/// client receives them. The CLI is `cat` of a prepared stream, so the bridge is what is measured.
fn bench_stream() {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-stream");
    let _ = std::fs::remove_dir_all(&root);
    let workspace = root.join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let count = 100_000;
    let sid = "ses_benchstream0000000000000";
    let mut stream = String::new();
    stream.push_str(&format!(
        "{}\n",
        json!({"type": "step_start", "timestamp": 1, "sessionID": sid,
            "part": {"id": "prt_start", "messageID": "msg_1", "sessionID": sid, "type": "step-start"}})
    ));
    for n in 0..count {
        stream.push_str(&format!(
            "{}\n",
            json!({"type": "text", "timestamp": 1, "sessionID": sid,
                "part": {"id": format!("prt_{n}"), "messageID": "msg_1", "sessionID": sid, "type": "text",
                    "text": format!("chunk {n} of a long answer. "), "time": {"start": 1, "end": 1}}})
        ));
    }
    stream.push_str(&format!(
        "{}\n",
        json!({"type": "step_finish", "timestamp": 1, "sessionID": sid,
            "part": {"id": "prt_end", "reason": "stop", "messageID": "msg_1", "sessionID": sid, "type": "step-finish",
                "tokens": {"input": 10, "output": 10, "reasoning": 0, "cache": {"write": 0, "read": 0}}, "cost": 0}})
    ));
    let stream_path = root.join("stream.jsonl");
    std::fs::write(&stream_path, stream).unwrap();
    let fake = root.join("fake-opencode");
    std::fs::write(&fake, format!("#!/bin/sh\ncat >/dev/null\ncat '{}'\n", stream_path.display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The updates are counted by their prefix, not decoded: what is measured is the bridge, not the client's
    // decoding (which would take the bridge's other core). The rest of the conversation goes through the SDK.
    let command = bridge_command(&root.join("data"), "none", &["--replay-limit", "1000000"], &fake);
    let bridge = AcpClient::spawn_with(command, allow_all(), Updates::Counted);
    bridge.initialize();
    let session = bridge.new_session(&workspace);
    let before = bridge.notifications();
    let stat = format!("/proc/{}/stat", bridge.pid());
    let cpu_before = cpu_ms_of(&stat);
    let start = Instant::now();
    let turn = bridge.prompt(&session, "stream");
    let elapsed = start.elapsed();
    let cpu = cpu_ms_of(&stat).zip(cpu_before).map(|(after, before)| after - before);
    assert_eq!(turn.stop_reason(), StopReason::EndTurn);
    assert!(bridge.notifications() - before >= count, "every update reached the client before the answer");
    let load = Instant::now();
    bridge.load_session(&session, &workspace).result.unwrap();
    let load = load.elapsed();
    bridge.close();
    println!(
        "bridge    stream    {count:>6} updates {:>8.1} ms  {:>9.0} updates/s (CLI to editor, each stored first)  replay {:>8.1} ms  bridge CPU {:>6.0} ms",
        elapsed.as_secs_f64() * 1e3,
        count as f64 / elapsed.as_secs_f64(),
        load.as_secs_f64() * 1e3,
        cpu.unwrap_or(f64::NAN)
    );
}

/// The latency the bridge adds to each event (the CLI's print → the client's read, same clock) at 1,000 events/s:
/// a CLI printing 5,000 text events, each stamped with the time it was printed. p50 and p99.
fn bench_latency() {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-latency");
    let _ = std::fs::remove_dir_all(&root);
    let workspace = root.join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let count = 5_000;
    let script = format!(
        r#"import json, sys, time
sys.stdin.read()
sid = "ses_benchlatency00000000000"
out = sys.stdout
start = time.time()
for n in range({count}):
    due = start + n / 1000.0
    # Sleeping, not spinning: a spinning CLI would take one of the two cores from the bridge it measures.
    wait = due - time.time()
    if wait > 0:
        time.sleep(wait)
    part = {{"id": "prt_%d" % n, "messageID": "msg_1", "sessionID": sid, "type": "text",
             "text": "t=%.6f " % time.time(), "time": {{"start": 1, "end": 1}}}}
    out.write(json.dumps({{"type": "text", "timestamp": 1, "sessionID": sid, "part": part}}) + "\n")
    out.flush()
"#
    );
    let script_path = root.join("cli.py");
    std::fs::write(&script_path, script).unwrap();
    let fake = root.join("fake-opencode");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh
exec python3 '{}'
",
            script_path.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bridge = AcpClient::start(bridge_command(&root.join("data"), "none", &[], &fake), allow_all());
    let session = bridge.new_session(&workspace);
    let turn = bridge.prompt(&session, "stream");
    assert_eq!(turn.stop_reason(), StopReason::EndTurn);
    bridge.close();
    // Each update's arrival is stamped by the client as the SDK dispatches it: the bridge's latency and the
    // client's decoding, as an editor on the SDK sees it.
    let mut added: Vec<Duration> = turn
        .updates
        .iter()
        .filter_map(|received| {
            let stamp: f64 = agent_chunk(&received.update)?.0.strip_prefix("t=")?.trim().parse().ok()?;
            let at = received.wall.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
            Some(Duration::from_secs_f64((at - stamp).max(0.0)))
        })
        .collect();
    assert_eq!(added.len(), count, "every event arrived");
    added.sort();
    let at = |q: f64| added[((added.len() as f64 * q) as usize).min(added.len() - 1)];
    println!(
        "bridge    latency   {count:>6} events at 1,000/s: added p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        added[added.len() - 1].as_secs_f64() * 1e3
    );
}

/// The real OpenCode for the side-by-side bench: `ACP_SANDBOX_TEST_OPENCODE`, else the install of
/// `.ci/install-opencode.sh`.
fn real_opencode() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ACP_SANDBOX_TEST_OPENCODE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    let path = cache.join("acp-sandbox/opencode-ai@1.18.33/node_modules/.bin/opencode");
    path.exists().then_some(path)
}

/// One prompt through `client`: (time to the first model text, time to the answer). The first model text is the
/// first agent chunk that says `tok0` (the fake model's first token) or `Hello`, stamped as it arrived.
fn timed_prompt(client: &AcpClient, session: &SessionId, text: &str) -> (Duration, Duration) {
    let start = Instant::now();
    let turn = client.prompt(session, text);
    let elapsed = start.elapsed();
    assert_eq!(turn.stop_reason(), StopReason::EndTurn);
    let first = turn.updates.iter().find(|received| {
        agent_chunk(&received.update).is_some_and(|(text, _)| text.contains("tok0") || text.contains("Hello"))
    });
    (first.map(|received| received.at - start).unwrap_or(Duration::MAX), elapsed)
}

/// The resident memory of `root` and the processes below it whose command line contains `needle` (by parent links: a
/// child forked by another thread of `root` is not in its main thread's `children`).
fn rss_of_tree_matching(root: u32, needle: &str) -> Option<u64> {
    let mut parents = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(ppid) =
            stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
        else {
            continue;
        };
        parents.insert(pid, ppid);
    }
    let below = |mut pid: u32| {
        if pid == root {
            return true;
        }
        while let Some(&parent) = parents.get(&pid) {
            if parent == root {
                return true;
            }
            pid = parent;
        }
        false
    };
    let mut total = None;
    for (&pid, _) in parents.iter().filter(|(pid, _)| below(**pid)) {
        let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
            .replace('\0', " ");
        if cmdline.contains(needle) && !cmdline.contains("sandbox-init") {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let kib = status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .unwrap_or(0);
            *total.get_or_insert(0) += kib;
        }
    }
    total
}

/// The fake OpenAI-compatible model server (`tests/fakes/fake_openai.py`) on a free port of 127.0.0.1, and the
/// OpenCode configuration that points at it.
fn fake_model(root: &Path) -> (std::process::Child, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/fake_openai.py");
    let mut model = Command::new("python3")
        .arg(&script)
        .arg("--record")
        .arg(root.join("requests.jsonl"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut port_line = String::new();
    BufReader::new(model.stdout.take().unwrap()).read_line(&mut port_line).unwrap();
    let port = port_line.trim().trim_start_matches("PORT ").to_string();
    let template = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real-opencode/opencode.json"),
    )
    .unwrap();
    (model, template.replace("http://127.0.0.1:18080/v1", &format!("http://127.0.0.1:{port}/v1")))
}

/// The command of one agent server of a side-by-side row: acp-sandbox (its name starts so) with the `serve` backend
/// (or `acp`, its name ending so) under `sandbox`, or `opencode acp`, with its own home holding `config` (made unless there), its data dir and a
/// workspace (made too).
fn agent_command(
    name: &str,
    opencode: &Path,
    sandbox: &str,
    config: &str,
    home: &Path,
    data: &Path,
    workspace: &Path,
) -> Command {
    std::fs::create_dir_all(home.join(".config/opencode")).unwrap();
    std::fs::write(home.join(".config/opencode/opencode.json"), config).unwrap();
    std::fs::create_dir_all(workspace).unwrap();
    let mut command = if name.starts_with("acp-sandbox") {
        let mut command = Command::new(env!("CARGO_BIN_EXE_acp-sandbox"));
        command.args(["--agent", "opencode", "--sandbox", sandbox, "--data-dir"]).arg(data);
        command.env("ACP_SANDBOX_OPENCODE_BIN", opencode).env("RUST_LOG", "warn");
        if name.ends_with(", acp)") {
            command.args(["--opencode-backend", "acp"]);
        }
        command
    } else {
        let mut command = Command::new(opencode);
        command.arg("acp").current_dir(workspace).env("PWD", workspace);
        command
    };
    command
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .env("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1")
        .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
        .env("OPENCODE_DISABLE_SHARE", "1");
    command
}

/// Time to the first agent text through `acp-sandbox` (the server backend, and OpenCode's ACP server in the sandbox,
/// under bubblewrap) and through OpenCode's own ACP server (`opencode acp`), same OpenCode, same fake model server, same machine, in one run: the first
/// prompt of a session created a few seconds earlier, and follow-ups. Medians and their ratio.
fn bench_warm() {
    let Some(opencode) = real_opencode() else {
        println!("warm      skipped: no real OpenCode (run .ci/install-opencode.sh or set ACP_SANDBOX_TEST_OPENCODE)");
        return;
    };
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-warm");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let (mut model, config) = fake_model(&root);
    let sandbox = if acp_sandbox::sandbox::local::bwrap::probe_bwrap().is_ok() { "bwrap" } else { "none" };
    const FOLLOW_UPS: usize = 15;
    let mut rows = Vec::new();
    let mut cancel_rows = Vec::new();
    let names = [
        format!("acp-sandbox ({sandbox}, serve)"),
        format!("acp-sandbox ({sandbox}, acp)"),
        "opencode acp".to_string(),
    ];
    for name in names {
        let (home, workspace) = (root.join(format!("home-{}", rows.len())), root.join(format!("ws-{}", rows.len())));
        let data = root.join(format!("data-{}", rows.len()));
        let command = agent_command(&name, &opencode, sandbox, &config, &home, &data, &workspace);
        let client = AcpClient::start(command, allow_all());
        let session = client.new_session(&workspace);
        // The editor is opened, the user types for a few seconds.
        std::thread::sleep(Duration::from_secs(3));
        let (first, _) = timed_prompt(&client, &session, "SCENARIO:tokens:3 first prompt");
        let follow_ups: Vec<Duration> = (0..FOLLOW_UPS)
            .map(|i| timed_prompt(&client, &session, &format!("SCENARIO:tokens:3 follow-up {i}")).0)
            .collect();
        let rss = rss_of_tree_matching(client.pid(), if name.ends_with(", serve)") { " serve " } else { "opencode" });
        let cancels: Vec<Duration> =
            (0..CANCEL_RUNS).map(|run| cancel_long_command(&client, &session, &workspace, 40_000 + run * 2)).collect();
        drop(client);
        rows.push((name, first, median(follow_ups), rss));
        cancel_rows.push(cancels);
    }
    let _ = model.kill();
    let _ = model.wait();
    let anchor_cancel = median(cancel_rows[cancel_rows.len() - 1].clone());
    for ((name, ..), samples) in rows.iter().zip(cancel_rows) {
        let (median, max) = (median(samples.clone()), *samples.iter().max().unwrap());
        println!(
            "warm      {name:<26}  cancel of `sleep` in its bash: median {:>5.0} ms ({:.2}x)  max {:>5.0} ms  within 1 s: {}",
            median.as_secs_f64() * 1e3,
            median.as_secs_f64() / anchor_cancel.as_secs_f64(),
            max.as_secs_f64() * 1e3,
            if max <= CANCEL_BOUND { "yes" } else { "NO" }
        );
    }
    let (_, anchor_first, anchor_follow, _) = rows[rows.len() - 1].clone();
    for (name, first, follow, rss) in &rows {
        println!(
            "warm      {name:<26}  first prompt (session 3 s old) {:>7.0} ms ({:.2}x)  follow-up {:>6.0} ms ({:.2}x)  OpenCode RSS {:>5.0} MiB",
            first.as_secs_f64() * 1e3,
            first.as_secs_f64() / anchor_first.as_secs_f64(),
            follow.as_secs_f64() * 1e3,
            follow.as_secs_f64() / anchor_follow.as_secs_f64(),
            rss.unwrap_or(0) as f64 / 1024.0
        );
    }
}

/// The time from `session/cancel` to the prompt's `cancelled` answer while the agent's bash tool runs `sleep <n>`
/// (the fake model's `longbash`, which marks its start with `longbash.started` in the workspace).
fn cancel_long_command(client: &AcpClient, session: &SessionId, workspace: &Path, n: usize) -> Duration {
    let started = workspace.join("longbash.started");
    let _ = std::fs::remove_file(&started);
    let pending = client.send_prompt(session, &format!("SCENARIO:longbash:{n} run something long"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !started.exists() {
        assert!(Instant::now() < deadline, "the long command did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    cancelled_after(client, session, pending)
}

/// The time from `session/cancel` sent to `pending`'s answer, which must be `cancelled`.
fn cancelled_after(client: &AcpClient, session: &SessionId, pending: Pending<PromptResponse>) -> Duration {
    let start = Instant::now();
    client.cancel(session);
    let answer = client.wait(pending);
    let elapsed = start.elapsed();
    assert_eq!(answer.map(|response| response.stop_reason).ok(), Some(StopReason::Cancelled));
    elapsed
}

/// Runs of each `cancel` row: its median and its maximum are printed.
const CANCEL_RUNS: usize = 7;

/// The bound the README promises: a cancel is answered within a second, whatever the CLI or its server does.
const CANCEL_BOUND: Duration = Duration::from_secs(1);

/// One fake cloud of `tests/fakes` (`fake_daytona.py`, `fake_e2b.py`) on free ports of 127.0.0.1: its ports (the
/// first line it prints, after `prefix`); closing its stdin ends it and every command it still runs.
struct FakeCloud {
    child: std::process::Child,
    ports: Vec<u16>,
}

impl FakeCloud {
    fn start(script: &str, dir: &Path, key: &str, prefix: &str, flags: &[&str]) -> Self {
        let mut child = Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fakes").join(script))
            .arg("--root")
            .arg(dir.join("sandboxes"))
            .arg("--record")
            .arg(dir.join("requests.jsonl"))
            .arg("--api-key")
            .arg(key)
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let ports = line
            .trim()
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{script} did not say its ports: {line:?}"))
            .split(' ')
            .map(|p| p.parse().unwrap())
            .collect();
        FakeCloud { child, ports }
    }
}

impl Drop for FakeCloud {
    fn drop(&mut self) {
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

/// `CANCEL_RUNS` times in `session`: a prompt of `text`, its first agent chunk that `streaming` accepts (given its
/// text and whether it carries a message id, as a model's text does), then `before_cancel`; the time from
/// `session/cancel` sent to the prompt's answer, which must be `cancelled`.
fn cancel_times(
    client: &AcpClient,
    session: &SessionId,
    text: &str,
    streaming: impl Fn(&str, bool) -> bool,
    before_cancel: impl Fn(),
) -> Vec<Duration> {
    (0..CANCEL_RUNS)
        .map(|_| {
            let pending = client.send_prompt(session, text);
            client.wait_update(session, &pending, |update| {
                agent_chunk(update).is_some_and(|(text, model)| streaming(text, model))
            });
            before_cancel();
            cancelled_after(client, session, pending)
        })
        .collect()
}

/// The built bridge for the `cancel` rows: the fake CLIs of `tests/fakes` as OpenCode, logging only warnings.
fn cancel_bridge(data: &Path, sandbox: &str, backend: &str, env: &[(&str, String)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_acp-sandbox"));
    command
        .args(["--agent", "opencode", "--sandbox", sandbox, "--data-dir"])
        .arg(data)
        .env("ACP_SANDBOX_OPENCODE_BIN", Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/opencode"))
        .env("ACP_SANDBOX_OPENCODE_BACKEND", backend)
        // As in the tests: the fake CLIs read recorded streams from tests/fixtures, which a sandbox hides.
        .env("ACP_SANDBOX_ALLOW_READ", Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
        // `BENCH_RUST_LOG=acp_sandbox=debug` keeps a bridge log with timestamps in each row's data dir (under
        // target/tmp/bench-cancel), to see where a slow cancel spent its time.
        .env("RUST_LOG", std::env::var("BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()));
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

fn print_cancel_row(label: &str, samples: Vec<Duration>) {
    let max = *samples.iter().max().unwrap();
    let runs = samples.len();
    let median = median(samples);
    println!(
        "cancel    {label:<42}  runs {runs}  median {:>6.0} ms  max {:>6.0} ms  within 1 s: {}",
        median.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
        if max <= CANCEL_BOUND { "yes" } else { "NO" }
    );
}

/// The time from `session/cancel` to the prompt's `cancelled` answer, for each fault the README's 1 s bound covers:
/// the warm server (`tests/fakes/fake_serve.py`) streaming, stopped (SIGSTOP), never answering `/abort`, never
/// going idle; `opencode run` (the fake CLI) mid-stream; the same CLI in a Daytona and in an E2B sandbox (against
/// `tests/fakes/fake_daytona.py` and `fake_e2b.py`). `--sandbox none` for the local rows. Median and maximum of
/// [`CANCEL_RUNS`] cancels in one session each.
fn bench_cancel() {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-cancel");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let slow = "SCENARIO:slow FAKE_COUNT=100000 FAKE_DELAY_MS=20 keep talking";
    let is_slow_chunk = |text: &str, model: bool| model && text.starts_with("slow chunk ");
    let serve_env = [("OPENCODE_FAKE_SERVE", "1".to_string())];
    let mut sandboxes = vec!["none"];
    if acp_sandbox::sandbox::local::bwrap::probe_bwrap().is_ok() {
        sandboxes.push("bwrap");
    } else {
        println!("cancel    bwrap rows skipped: bubblewrap does not work here");
    }
    for &sandbox in &sandboxes {
        for fault in ["slow", "stop", "noabort", "noclose"] {
            let workspace = root.join(format!("ws-serve-{fault}-{sandbox}"));
            std::fs::create_dir_all(&workspace).unwrap();
            let data = root.join(format!("data-serve-{fault}-{sandbox}"));
            let client = AcpClient::start(cancel_bridge(&data, sandbox, "serve", &serve_env), allow_all());
            let session = client.new_session(&workspace);
            assert_eq!(client.prompt(&session, "hello").stop_reason(), StopReason::EndTurn);
            let bridge = client.pid();
            let samples = cancel_times(
                &client,
                &session,
                &format!("FAULT:{fault}"),
                // `slow` streams `tick<n>` deltas; the others send one `working ` delta before their fault.
                |text, model| model && (text.starts_with("working") || text.starts_with("tick")),
                || {
                    if fault != "stop" {
                        return;
                    }
                    // The fake stops itself right after its first delta: the cancel must meet a stopped server.
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while !stopped_below(bridge, "fake_serve.py") {
                        assert!(Instant::now() < deadline, "the fake server never stopped itself");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                },
            );
            client.close();
            print_cancel_row(&format!("serve FAULT:{fault} ({sandbox})"), samples);
        }
        let workspace = root.join(format!("ws-run-{sandbox}"));
        std::fs::create_dir_all(&workspace).unwrap();
        let command = cancel_bridge(&root.join(format!("data-run-{sandbox}")), sandbox, "run", &[]);
        let client = AcpClient::start(command, allow_all());
        let session = client.new_session(&workspace);
        let samples = cancel_times(&client, &session, slow, is_slow_chunk, || {});
        client.close();
        print_cancel_row(&format!("run mid-stream ({sandbox})"), samples);

        // An ACP agent in the sandbox (`tests/fakes/acp_agent.py`) that answers the cancel, and one that ignores it
        // (killed after the grace, with everything it started).
        for (scenario, label) in [("sleep", "answers"), ("hang", "ignores it")] {
            let workspace = root.join(format!("ws-acp-{scenario}-{sandbox}"));
            std::fs::create_dir_all(&workspace).unwrap();
            let mut command = Command::new(env!("CARGO_BIN_EXE_acp-sandbox"));
            command
                .args(["--agent", "custom", "--sandbox", sandbox, "--data-dir"])
                .arg(root.join(format!("data-acp-{scenario}-{sandbox}")))
                .arg("--agent-command")
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fakes/acp_agent.py"))
                .env("RUST_LOG", "warn");
            let client = AcpClient::start(command, allow_all());
            let session = client.new_session(&workspace);
            let started = |text: &str, _: bool| text == "sleeping\n" || text == "hanging\n";
            let samples = cancel_times(&client, &session, &format!("SCENARIO:{scenario}"), started, || {});
            client.close();
            print_cancel_row(&format!("ACP agent {label} ({sandbox})"), samples);
        }
    }

    const DAYTONA_KEY: &str = "dtn_fake_key_0123456789";
    const E2B_KEY: &str = "e2b_0123456789abcdef0123456789abcdef";
    // A daemon without the `terminate` route (every public one so far): the first cancel finds it out.
    for (provider, label, flags) in [
        ("daytona", "daytona fake", &[][..]),
        ("daytona", "daytona fake, no terminate", &["--no-terminate"][..]),
        ("e2b", "e2b fake", &[][..]),
    ] {
        let dir = root.join(format!("fake-{label}").replace([' ', '(', ')', ','], ""));
        std::fs::create_dir_all(&dir).unwrap();
        let (fake, env) = if provider == "daytona" {
            let fake = FakeCloud::start("fake_daytona.py", &dir, DAYTONA_KEY, "PORT ", flags);
            let url = format!("http://127.0.0.1:{}/api", fake.ports[0]);
            (fake, vec![("DAYTONA_API_KEY", DAYTONA_KEY.to_string()), ("DAYTONA_API_URL", url)])
        } else {
            let fake = FakeCloud::start("fake_e2b.py", &dir, E2B_KEY, "PORTS ", flags);
            let (api, envd) = (fake.ports[0], fake.ports[1]);
            let env = vec![
                ("E2B_API_KEY", E2B_KEY.to_string()),
                ("E2B_API_URL", format!("http://127.0.0.1:{api}")),
                ("E2B_SANDBOX_URL", format!("http://127.0.0.1:{envd}")),
            ];
            (fake, env)
        };
        let workspace = dir.join("ws");
        std::fs::create_dir_all(&workspace).unwrap();
        // The fake CLI records its runs in its workspace: not part of what the bridge reviews.
        std::fs::write(workspace.join(".gitignore"), ".fake-cli/\n").unwrap();
        let client = AcpClient::start(cancel_bridge(&dir.join("data"), provider, "run", &env), allow_all());
        let session = client.new_session(&workspace);
        let samples = cancel_times(&client, &session, slow, is_slow_chunk, || {});
        client.close();
        drop(fake);
        print_cancel_row(&format!("run mid-stream ({label})"), samples);
    }
}

/// Whether a process below `root` whose command line contains `needle` is stopped (`T` in its stat): found by
/// parent links, so that a server in a PID namespace (bubblewrap) is found by its pid on this side.
fn stopped_below(root: u32, needle: &str) -> bool {
    let mut parents = std::collections::HashMap::new();
    let mut states = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((state, ppid)) = stat.rsplit_once(')').and_then(|(_, rest)| {
            let mut fields = rest.split_whitespace();
            Some((fields.next()?.to_string(), fields.next()?.parse::<u32>().ok()?))
        }) else {
            continue;
        };
        parents.insert(pid, ppid);
        states.insert(pid, state);
    }
    states.iter().any(|(&pid, state)| {
        if state != "T" {
            return false;
        }
        let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
            .replace('\0', " ");
        let mut at = pid;
        while let Some(&parent) = parents.get(&at) {
            if parent == root {
                return cmdline.contains(needle);
            }
            at = parent;
        }
        false
    })
}

fn peak_rss_kib() -> Option<u64> {
    peak_rss_kib_of("/proc/self/status")
}

/// The CPU time (user and system, all threads) a live process has used, in ms, from its `/proc/<pid>/stat`: unlike
/// a rate, it hardly changes with what else the machine runs.
fn cpu_ms_of(stat_file: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(stat_file).ok()?;
    // The fields after the command (which may hold spaces), from the third: utime and stime are the 14th and 15th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // In USER_HZ, which Linux fixes at 100 for every user-space interface (`getconf CLK_TCK`).
    Some(ticks * 10.0)
}

fn peak_rss_kib_of(status_file: &str) -> Option<u64> {
    let status = std::fs::read_to_string(status_file).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    // `cargo test` runs benches with --bench only when asked; a plain listing call must not run them.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `cargo bench --bench throughput -- stream latency` runs only the named measurements.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let benches: [(&str, fn()); 8] = [
        ("translate", bench_translate),
        ("store", bench_store),
        ("stream", bench_stream),
        ("latency", bench_latency),
        ("turns", bench_turns),
        ("warm", bench_warm),
        ("threads", threads::bench_threads),
        ("cancel", bench_cancel),
    ];
    for (name, bench) in benches {
        if only.is_empty() || only.iter().any(|o| o == name) {
            bench();
        }
    }
    if let Some(kib) = peak_rss_kib() {
        println!("peak memory of the bench process: {:.1} MiB", kib as f64 / 1024.0);
    }
}
