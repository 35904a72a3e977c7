//! What an ACP agent's terminal costs: a terminal that prints without pause, shown in a tool call, leaves the store
//! and the bridge bounded (its kept output, sent coalesced; one stored row for the call's content), whatever it
//! printed.

use std::path::Path;

use serde_json::Value;

use crate::support::*;

/// The bridge running the fake ACP agent (`tests/fakes/acp_agent.py`).
fn options(dirs: &TestDirs) -> BridgeOptions {
    let home = dirs.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    BridgeOptions::new("custom", &dirs.data)
        .arg("--agent-command")
        .arg(&fakes_dir().join("acp_agent.py").display().to_string())
        .env("HOME", &home.display().to_string())
}

/// The bytes the store takes on disk (the database and its write-ahead log).
fn store_bytes(data: &Path) -> u64 {
    ["acp-sandbox.sqlite3", "acp-sandbox.sqlite3-wal"]
        .iter()
        .map(|name| std::fs::metadata(data.join(name)).map(|m| m.len()).unwrap_or(0))
        .sum()
}

/// A `/proc/<pid>/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|line| line.strip_prefix(field)).unwrap();
    line.trim().trim_end_matches("kB").trim().parse().unwrap()
}

/// The CPU time the process spent so far, in clock ticks (user and system).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The text of the first content item of a tool call's update.
fn card_text(update: &Value) -> &str {
    update["content"][0]["content"]["text"].as_str().unwrap_or_default()
}

#[test]
fn a_flooding_terminal_leaves_the_store_and_the_bridge_bounded() {
    const FLOOD: u64 = 150_000_000;
    const KEPT: usize = 1 << 20;
    let dirs = TestDirs::new("acp-terminal-flood");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    let (store_before, cpu_before) = (store_bytes(&dirs.data), cpu_ticks(bridge.pid()));
    let turn = bridge.prompt(&sid, &format!("SCENARIO:terminal-flood:{FLOOD}"));
    assert_eq!(turn.stop_reason(), "end_turn", "{turn:?}");
    let card: Vec<&Value> = turn.updates.iter().filter(|u| u["toolCallId"] == "flood-call").collect();
    let grown = store_bytes(&dirs.data).saturating_sub(store_before);
    let rss = status_kib(bridge.pid(), "VmHWM:");
    let cpu = cpu_ticks(bridge.pid()) - cpu_before;
    eprintln!(
        "FIGURES flood of {FLOOD} bytes: {} card updates sent, store grew {grown} bytes, bridge peak RSS {rss} KiB, \
         bridge CPU {cpu} ticks",
        card.len()
    );
    let said = turn.agent_text();
    assert!(said.contains(&format!("flood 0 {KEPT} True")), "{said}");
    // The whole kept output (its end: 1 MiB, cut inside a line), once it ended; never more than that in any update.
    let last = card_text(card.last().unwrap());
    let body = last.strip_prefix("```console\n").and_then(|body| body.strip_suffix("\n```")).unwrap_or_default();
    assert!(body.len() == KEPT || body.len() == KEPT - 1, "{} bytes: {}", body.len(), &last[..last.len().min(200)]);
    let lines: Vec<&str> = body.lines().collect();
    assert!(lines[1..lines.len() - 1].iter().all(|line| *line == "FLOOD-LINE-0123456789"), "{}", &body[..200]);
    for update in &card {
        assert!(card_text(update).len() <= KEPT + 32, "an update carried {} bytes", card_text(update).len());
    }
    // Two stored rows of the call, however often it was shown: its announcement, and the agent's completion with
    // the latest content.
    let db = rusqlite::Connection::open(dirs.data.join("acp-sandbox.sqlite3")).unwrap();
    let rows: Vec<String> = db
        .prepare("SELECT payload FROM events WHERE payload LIKE '%flood-call%' ORDER BY id")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        rows.len() <= 2,
        "{} rows stored for the call: {:?}",
        rows.len(),
        rows.iter().map(|r| r.chars().take(300).collect::<String>()).collect::<Vec<_>>()
    );
    let stored: Value = serde_json::from_str(rows.last().unwrap()).unwrap();
    assert_eq!(card_text(&stored), last, "the store keeps what the editor saw last");
    assert!(grown < 8 << 20, "the store grew {grown} bytes for 1 MiB kept");
    assert!(rss < 256 << 10, "the bridge's peak resident memory reached {rss} KiB");
}

#[test]
fn sixteen_flooding_terminals_leave_the_store_and_the_bridge_bounded() {
    const TERMINALS: usize = 16;
    const FLOOD: u64 = 20_000_000;
    let dirs = TestDirs::new("acp-terminals-flood");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    let (store_before, cpu_before) = (store_bytes(&dirs.data), cpu_ticks(bridge.pid()));
    let turn = bridge.prompt(&sid, &format!("SCENARIO:terminals-flood:{TERMINALS}x{FLOOD}"));
    assert_eq!(turn.stop_reason(), "end_turn", "{turn:?}");
    let grown = store_bytes(&dirs.data).saturating_sub(store_before);
    let rss = status_kib(bridge.pid(), "VmHWM:");
    let cpu = cpu_ticks(bridge.pid()) - cpu_before;
    let cards = turn.updates.iter().filter(|u| u["toolCallId"].as_str().is_some_and(|id| id.starts_with("flood-")));
    let db = rusqlite::Connection::open(dirs.data.join("acp-sandbox.sqlite3")).unwrap();
    let (rows, bytes): (i64, i64) = db
        .query_row("SELECT count(*), sum(length(payload)) FROM events", [], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap();
    let wal = std::fs::metadata(dirs.data.join("acp-sandbox.sqlite3-wal")).map(|m| m.len()).unwrap_or(0);
    eprintln!("FIGURES stored: {rows} rows, {bytes} bytes of updates; WAL {wal} bytes");
    eprintln!(
        "FIGURES {TERMINALS} floods of {FLOOD} bytes: {} card updates sent, store grew {grown} bytes, bridge peak RSS \
         {rss} KiB, bridge CPU {cpu} ticks",
        cards.count()
    );
    let said = turn.agent_text();
    assert!(said.trim_end().ends_with(&format!("floods{}", " 0".repeat(TERMINALS))), "{said}");
    // Each call keeps its announcement and its completion with all that was kept (1 MiB): the dead rows' pages are
    // used again, and the write-ahead log is checkpointed as it grows.
    assert!(
        grown < (TERMINALS as u64) * (2 << 20) + (16 << 20),
        "the store grew {grown} bytes for {TERMINALS} MiB kept"
    );
    assert!(rss < 512 << 10, "the bridge's peak resident memory reached {rss} KiB");
}
