//! The `threads` rows: what a user pays for each further thread, through acp-sandbox (`serve`, one warm server per
//! workspace) and through `opencode acp`, side by side and interleaved, same OpenCode and fake model.
//!
//! Each run starts both agents afresh (own home and data dir) and times the first model text of: the first prompt
//! right after the editor starts (cold), a new thread in the running agent, 8 threads of one workspace prompted
//! round robin, and a reopened thread (a fresh process, `session/load`, a prompt); then the whole process tree's
//! proportional memory (PSS) with those 8 threads, and how many OpenCode servers ran. Last, for acp-sandbox only,
//! the same reopened thread with `--keep-warm`: the editor quits (stdin closed, the bridge ends on its own, its
//! server stays) and starts again, against `opencode acp`'s reopened thread, which has no such thing.
//!
//! The cold and reopened rows are timed from the agent's spawn, as the user waits when the editor starts and the
//! prompt is sent at once: `opencode acp` boots during `initialize` and `session/new` (or `session/load`), acp-sandbox
//! answers those at once and boots its server behind them, so timing only the prompt would hide the anchor's start.
//! The prompt-only times are printed too.

use std::path::Path;
use std::time::Duration;

use agent_client_protocol::v1::schema::SessionId;

use super::acp_client::AcpClient;
use super::{agent_command, allow_all, fake_model, median, real_opencode, timed_prompt};

const RUNS: usize = 5;
const THREADS: usize = 8;

/// Which number of a run a row shows.
type Measure = fn(&Run) -> Duration;

/// One agent's numbers of one run.
#[derive(Default)]
struct Run {
    cold: Duration,
    cold_prompt: Duration,
    new_thread: Duration,
    round_robin: Duration,
    reopened: Duration,
    reopened_prompt: Duration,
    kept_warm: Duration,
    pss_kib: u64,
    servers: usize,
}

pub fn bench_threads() {
    let Some(opencode) = real_opencode() else {
        println!("threads   skipped: no real OpenCode (run .ci/install-opencode.sh or set ACP_SANDBOX_TEST_OPENCODE)");
        return;
    };
    let root = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-threads");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let (mut model, config) = fake_model(&root);
    let sandbox = if acp_sandbox::sandbox::local::bwrap::probe_bwrap().is_ok() { "bwrap" } else { "none" };
    let names = [format!("acp-sandbox ({sandbox}, serve)"), "opencode acp".to_string()];
    let mut runs: [Vec<Run>; 2] = Default::default();
    for run in 0..RUNS {
        for (which, name) in names.iter().enumerate() {
            let dir = root.join(format!("run{run}-{which}"));
            runs[which].push(one_run(name, &opencode, sandbox, &config, &dir));
        }
    }
    let _ = model.kill();
    let _ = model.wait();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let med = |which: usize, f: Measure| median(runs[which].iter().map(f).collect());
    // What the anchor's number of each row is: the same measure, but for `--keep-warm` its plain reopened thread.
    let rows: [(&str, Measure, Measure); 7] = [
        ("cold editor start, spawn to first text", |r| r.cold, |r| r.cold),
        ("  (its prompt alone)", |r| r.cold_prompt, |r| r.cold_prompt),
        ("a new thread in the running agent", |r| r.new_thread, |r| r.new_thread),
        ("8 threads of one workspace, round robin", |r| r.round_robin, |r| r.round_robin),
        ("a reopened thread, spawn to first text", |r| r.reopened, |r| r.reopened),
        ("  (its prompt alone)", |r| r.reopened_prompt, |r| r.reopened_prompt),
        ("  with --keep-warm (editor quit, reopened)", |r| r.kept_warm, |r| r.reopened),
    ];
    for (what, f, g) in rows {
        let (ours, anchor) = (med(0, f), med(1, g));
        println!(
            "threads   {what:<42} first text {:>7.0} ms vs {:>7.0} ms opencode acp ({:.2}x)  [medians of {RUNS}]",
            ms(ours),
            ms(anchor),
            ours.as_secs_f64() / anchor.as_secs_f64()
        );
    }
    let pss = |which: usize| {
        let mut all: Vec<u64> = runs[which].iter().map(|r| r.pss_kib).collect();
        all.sort();
        all[all.len() / 2]
    };
    println!(
        "threads   process tree PSS with {THREADS} threads {:>7.0} MiB vs {:>7.0} MiB opencode acp ({:.2}x)",
        pss(0) as f64 / 1024.0,
        pss(1) as f64 / 1024.0,
        pss(0) as f64 / pss(1) as f64
    );
    let servers: Vec<usize> = runs[0].iter().map(|r| r.servers).collect();
    println!("threads   OpenCode servers running after {THREADS} threads of one workspace (acp-sandbox): {servers:?}");
}

fn one_run(name: &str, opencode: &Path, sandbox: &str, config: &str, dir: &Path) -> Run {
    let (home, data, workspace) = (dir.join("home"), dir.join("data"), dir.join("ws"));
    // `start` includes `initialize`: the spawned-to-first-text rows count it, as before.
    let start =
        || AcpClient::start(agent_command(name, opencode, sandbox, config, &home, &data, &workspace), allow_all());
    let prompt = |client: &AcpClient, session: &SessionId, text: &str| {
        timed_prompt(client, session, &format!("SCENARIO:tokens:3 {text}")).0
    };
    let mut run = Run::default();
    let spawned = std::time::Instant::now();
    let client = start();
    let first = client.new_session(&workspace);
    let before = spawned.elapsed();
    run.cold_prompt = prompt(&client, &first, "cold");
    run.cold = before + run.cold_prompt;
    let second = client.new_session(&workspace);
    run.new_thread = prompt(&client, &second, "new thread");
    let mut threads = vec![first.clone(), second];
    while threads.len() < THREADS {
        threads.push(client.new_session(&workspace));
    }
    let times: Vec<Duration> =
        threads.iter().enumerate().map(|(i, session)| prompt(&client, session, &format!("round robin {i}"))).collect();
    run.round_robin = median(times);
    run.pss_kib = tree_pss_kib(client.pid());
    let servers: Vec<(u32, String)> =
        tree_processes(client.pid()).into_iter().filter(|(_, cmd)| is_server(cmd)).collect();
    if servers.len() > 1 && name.starts_with("acp-sandbox") {
        // Which ones, to tell a second server of the workspace from a process OpenCode forked with its arguments.
        for (pid, cmd) in &servers {
            let parent = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let parent = parent.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)).unwrap_or("?");
            eprintln!("threads   server pid {pid} (parent {parent}): {cmd}");
        }
    }
    run.servers = servers.len();
    drop(client);
    // The editor is reopened: a fresh process, the old thread loaded, then prompted.
    let spawned = std::time::Instant::now();
    let client = start();
    let loaded = client.load_session(&first, &workspace);
    assert!(loaded.result.is_ok(), "{name}: {:?}", loaded.result);
    let before = spawned.elapsed();
    run.reopened_prompt = prompt(&client, &first, "reopened");
    run.reopened = before + run.reopened_prompt;
    drop(client);
    if name.starts_with("acp-sandbox") {
        run.kept_warm = kept_warm(name, opencode, sandbox, config, dir, &first);
    }
    run
}

/// The reopened thread `session` with `--keep-warm`: a bridge warms its server and quits as an editor does (stdin
/// closed, then it ends on its own); the next one is timed from its spawn to the first text; a last one, without
/// `--keep-warm`, stops the kept server so that no run inherits it.
fn kept_warm(name: &str, opencode: &Path, sandbox: &str, config: &str, dir: &Path, session: &SessionId) -> Duration {
    let (home, data, workspace) = (dir.join("home"), dir.join("data"), dir.join("ws"));
    let start = |keep_warm: &str| {
        let mut command = agent_command(name, opencode, sandbox, config, &home, &data, &workspace);
        command.env("ACP_SANDBOX_KEEP_WARM", keep_warm);
        AcpClient::start(command, allow_all())
    };
    let quit = |client: AcpClient| {
        let status = client.close();
        assert!(status.success(), "{name} quit with {status}");
    };
    let load = |client: &AcpClient| {
        let loaded = client.load_session(session, &workspace);
        assert!(loaded.result.is_ok(), "{name}: {:?}", loaded.result);
    };
    let client = start("60s");
    load(&client);
    timed_prompt(&client, session, "SCENARIO:tokens:3 warming");
    quit(client);
    let spawned = std::time::Instant::now();
    let client = start("60s");
    load(&client);
    let before = spawned.elapsed();
    let elapsed = before + timed_prompt(&client, session, "SCENARIO:tokens:3 kept warm").0;
    quit(client);
    quit(start("0"));
    elapsed
}

/// An OpenCode server of acp-sandbox (not the sandbox's first process, which carries the same arguments).
fn is_server(cmdline: &str) -> bool {
    cmdline.contains(" serve --hostname") && !cmdline.contains("sandbox-init") && !cmdline.contains("bwrap")
}

/// `root` and every process below it (by parent links), with their command lines.
fn tree_processes(root: u32) -> Vec<(u32, String)> {
    let mut parents = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        if let Some(ppid) =
            stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
        {
            parents.insert(pid, ppid);
        }
    }
    let below = |mut pid: u32| loop {
        if pid == root {
            return true;
        }
        match parents.get(&pid) {
            Some(&parent) if parent != pid => pid = parent,
            _ => return false,
        }
    };
    parents
        .keys()
        .filter(|pid| below(**pid))
        .map(|&pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (pid, String::from_utf8_lossy(&cmdline).replace('\0', " "))
        })
        .collect()
}

/// The proportional set size of `root`'s whole tree: shared pages counted once across it.
fn tree_pss_kib(root: u32) -> u64 {
    tree_processes(root)
        .iter()
        .filter_map(|(pid, _)| {
            let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
            rollup.lines().find(|l| l.starts_with("Pss:"))?.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum()
}
