//! Review before write (`--workspace review`): the fake OpenCode writes, creates and deletes files in its
//! workspace, and a client that implements `fs/write_text_file` keeps or rejects what the bridge sends. Runs
//! under `none` (the agent's copy is its working directory) and, with `ACP_SANDBOX_E2E_SANDBOX=bwrap`, under
//! bubblewrap (the copy bound over the workspace).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::support::*;

fn options(dirs: &TestDirs) -> BridgeOptions {
    BridgeOptions::new("opencode", &dirs.data).arg("--workspace").arg("review")
}

/// A prompt of the fake's `files` scenario.
fn ops(list: Value) -> String {
    format!("SCENARIO:files OPS:{list}")
}

/// The writes the bridge sent, by path; the fake's own record of its runs (`.fake-cli/`, written in its
/// working directory like any file of the agent) is left out.
fn writes(bridge: &Bridge) -> Vec<FileWrite> {
    let mut writes: Vec<FileWrite> = bridge
        .file_writes
        .iter()
        .filter(|w| !w.path.components().any(|c| c.as_os_str() == ".fake-cli"))
        .cloned()
        .collect();
    writes.sort_by(|a, b| a.path.cmp(&b.path));
    writes
}

fn write(path: PathBuf, content: &str, before: Option<&str>) -> FileWrite {
    FileWrite { path, content: content.into(), before: before.map(str::to_string) }
}

/// The notes of a turn: its agent text chunks that are a whole `_…_` line.
fn notes(turn: &Turn) -> Vec<String> {
    turn.updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .map(|text| text.trim().to_string())
        .filter(|text| text.starts_with('_') && text.ends_with('_'))
        .collect()
}

/// What the fake's `read` ops found, from its last text.
fn reads(turn: &Turn) -> String {
    let text = turn.agent_text();
    text[text.find("READ ").unwrap_or_else(|| panic!("no READ in {text:?}"))..].to_string()
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

#[test]
fn an_edit_and_a_new_file_reach_the_users_files_only_through_the_editor() {
    let dirs = TestDirs::new("review-keep");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let mut bridge = Bridge::start_reviewing(options(&dirs), true);
    let sid = bridge.new_session(&ws);
    let turn =
        bridge.prompt(&sid, &ops(json!([["write", "hello.txt", "new\n"], ["write", "src/main.rs", "fn main() {}\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    // Each arrived while the user's file still held the old content (or did not exist).
    assert_eq!(
        writes(&bridge),
        vec![
            write(ws.join("hello.txt"), "new\n", Some("old\n")),
            write(ws.join("src/main.rs"), "fn main() {}\n", None),
        ]
    );
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("new\n"));
    assert_eq!(read(&ws.join("src/main.rs")).as_deref(), Some("fn main() {}\n"));
    let mut expected_notes = Vec::new();
    if std::env::var("ACP_SANDBOX_E2E_SANDBOX").as_deref() != Ok("bwrap") {
        expected_notes.push(
            "_OpenCode runs WITHOUT a sandbox here (--sandbox none was given): it can read and write everything you can._"
                .to_string(),
        );
    }
    assert_eq!(notes(&turn), expected_notes, "nothing is applied directly");
    // The tool cards are there as in direct mode, with the editor's paths.
    let cards: Vec<&Value> = turn.updates.iter().filter(|u| u["sessionUpdate"] == "tool_call").collect();
    assert_eq!(cards.len(), 2, "{:?}", turn.updates);
    assert_eq!(cards[0]["locations"][0]["path"], json!(ws.join("hello.txt")));

    // The kept files are the agent's base for the next turn: nothing is sent again.
    let turn = bridge.prompt(&sid, &ops(json!([["read", "hello.txt"], ["read", "src/main.rs"]])));
    assert_eq!(reads(&turn), "READ hello.txt=new\n; src/main.rs=fn main() {}\n");
    assert_eq!(writes(&bridge).len(), 2);
}

#[test]
fn a_rejected_change_leaves_the_users_file_and_the_next_turn_sees_it() {
    let dirs = TestDirs::new("review-reject");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let mut bridge = Bridge::start_reviewing(options(&dirs), false);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, &ops(json!([["write", "hello.txt", "agent\n"], ["write", "added.txt", "x\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(
        writes(&bridge),
        vec![write(ws.join("added.txt"), "x\n", None), write(ws.join("hello.txt"), "agent\n", Some("old\n"))]
    );
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("old\n"));
    assert!(!ws.join("added.txt").exists());

    // The user edits meanwhile: the agent sees that, not its own rejected version.
    std::fs::write(ws.join("notes.md"), "the user's\n").unwrap();
    let turn = bridge.prompt(&sid, &ops(json!([["read", "hello.txt"], ["read", "added.txt"], ["read", "notes.md"]])));
    assert_eq!(reads(&turn), "READ hello.txt=old\n; added.txt=<missing>; notes.md=the user's\n");
    assert_eq!(writes(&bridge).len(), 2, "nothing is sent again");
}

#[test]
fn deletions_and_binary_files_are_applied_directly_with_a_note() {
    let dirs = TestDirs::new("review-direct");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    std::fs::write(ws.join("kept.txt"), "stays\n").unwrap();
    let mut bridge = Bridge::start_reviewing(options(&dirs), true);
    let sid = bridge.new_session(&ws);
    // A first turn, so that the note of the second is the review's only.
    assert_eq!(bridge.prompt(&sid, &ops(json!([]))).stop_reason(), "end_turn");
    let turn = bridge.prompt(&sid, &ops(json!([["delete", "gone.txt"], ["bytes", "logo.bin", "00ff10"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(writes(&bridge), vec![]);
    assert!(!ws.join("gone.txt").exists());
    assert_eq!(std::fs::read(ws.join("logo.bin")).unwrap(), [0x00, 0xff, 0x10]);
    assert_eq!(read(&ws.join("kept.txt")).as_deref(), Some("stays\n"));
    assert_eq!(
        notes(&turn),
        ["_Applied to your files directly, without review: deleted `gone.txt`; binary `logo.bin`._"]
    );
}

#[test]
fn a_client_without_the_capability_gets_every_change_applied_with_a_note() {
    let dirs = TestDirs::new("review-nocap");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, &ops(json!([]))).stop_reason(), "end_turn");
    let turn = bridge.prompt(&sid, &ops(json!([["write", "hello.txt", "new\n"], ["write", "b.txt", "b\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("new\n"));
    assert_eq!(read(&ws.join("b.txt")).as_deref(), Some("b\n"));
    assert_eq!(
        notes(&turn),
        ["_This editor cannot review file writes (it does not offer `fs/writeTextFile`), so the agent's changes were \
          applied to your files directly: written `.fake-cli/invocations.jsonl`, `b.txt`, `hello.txt`._"]
    );
}

#[test]
fn each_finished_tool_is_reviewed_while_the_agent_still_runs() {
    let dirs = TestDirs::new("review-per-tool");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let mut bridge = Bridge::start_reviewing(options(&dirs), false);
    let sid = bridge.new_session(&ws);
    // The rejected write is reset in the agent's copy before its turn ends: its next step reads the user's file.
    let turn = bridge.prompt(
        &sid,
        &ops(json!([
            ["write", "hello.txt", "agent\n"],
            ["flush"],
            ["await", "hello.txt", "old\n"],
            ["read", "hello.txt"]
        ])),
    );
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(reads(&turn), "READ hello.txt=old\n");
    assert_eq!(writes(&bridge), vec![write(ws.join("hello.txt"), "agent\n", Some("old\n"))]);
}

#[test]
fn a_write_the_editor_refuses_is_applied_directly_with_its_reason() {
    let dirs = TestDirs::new("review-refused");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let mut bridge = Bridge::spawn(options(&dirs));
    bridge.offer_writes = true;
    bridge.refuse_writes = Some("invalid path".into());
    bridge.initialize();
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, &ops(json!([]))).stop_reason(), "end_turn");
    let turn = bridge.prompt(&sid, &ops(json!([["write", "hello.txt", "new\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(writes(&bridge), vec![write(ws.join("hello.txt"), "new\n", Some("old\n"))]);
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("new\n"));
    assert_eq!(
        notes(&turn),
        ["_Applied to your files directly, without review: refused by the editor (invalid path) \
          `.fake-cli/invocations.jsonl`, `hello.txt`._"]
    );
}
