//! The workspace of an E2B session through the built bridge: uploaded on the first prompt (without what git
//! ignores and what the local sandbox hides), the agent's changes brought back through the editor's review
//! (`fs/write_text_file`) or applied with a note, the user's edits between turns sent up before the next one.
//! The fake OpenCode's `files` scenario writes, creates and deletes in the sandbox's workspace; its record of its
//! runs (`.fake-cli/`) is ignored by the workspace's `.gitignore`, so it stays in the sandbox.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::support::{self, notes, ops, reads};
use super::{FakeE2b, KEY, WORKSPACE, e2b_options, only_sandbox};

fn write(path: PathBuf, content: &str, before: Option<&str>) -> support::FileWrite {
    support::FileWrite { path, content: content.into(), before: before.map(str::to_string) }
}

fn writes(bridge: &support::Bridge) -> Vec<support::FileWrite> {
    let mut writes = bridge.file_writes.clone();
    writes.sort_by(|a, b| a.path.cmp(&b.path));
    writes
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The sandbox's workspace on the fake's disk.
fn remote(fake: &FakeE2b) -> PathBuf {
    let (id, _) = only_sandbox(fake);
    fake.host_path(&id, WORKSPACE)
}

/// Every file and link below `root` (relative, sorted), the fake CLI's record left out.
fn tree(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            if rel.starts_with(".fake-cli") {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                dirs.push(path);
            } else {
                found.push(rel);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn the_first_prompt_uploads_the_workspace_without_what_git_ignores_or_the_sandbox_hides() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-upload");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join(".gitignore"), ".fake-cli/\nbuild/\n*.log\n").unwrap();
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::create_dir_all(ws.join("build")).unwrap();
    std::fs::create_dir_all(ws.join("nested")).unwrap();
    std::fs::create_dir_all(ws.join(".git/info")).unwrap();
    std::fs::write(ws.join("hello.txt"), "hello\n").unwrap();
    std::fs::write(ws.join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(ws.join("run.sh"), "#!/bin/sh\necho run\n").unwrap();
    std::fs::set_permissions(ws.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("hello.txt", ws.join("link")).unwrap();
    std::fs::write(ws.join("build/out.bin"), [0u8, 1, 2]).unwrap();
    std::fs::write(ws.join("debug.log"), "log\n").unwrap();
    std::fs::write(ws.join("nested/.gitignore"), "local.txt\n!keep.log\n").unwrap();
    std::fs::write(ws.join("nested/local.txt"), "mine\n").unwrap();
    std::fs::write(ws.join("nested/keep.log"), "kept\n").unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(ws.join(".git/info/exclude"), "excluded.txt\n").unwrap();
    std::fs::write(ws.join("excluded.txt"), "x\n").unwrap();
    std::fs::write(ws.join("secret.env"), "TOKEN=hunter2\n").unwrap();
    let options = e2b_options(&fake, &dirs).env("ACP_SANDBOX_DENY_READ", &ws.join("secret.env").display().to_string());
    let mut bridge = support::Bridge::start_reviewing(options, true);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, &ops(json!([["read", "hello.txt"], ["read", "run.sh"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(reads(&turn), "READ hello.txt=hello\n; run.sh=#!/bin/sh\necho run\n");

    let inside = remote(&fake);
    assert_eq!(
        tree(&inside),
        [
            ".git/config",
            ".git/info/exclude",
            ".gitignore",
            "hello.txt",
            "link",
            "nested/.gitignore",
            "nested/keep.log",
            "run.sh",
            "src/main.rs"
        ]
    );
    assert_eq!(std::fs::metadata(inside.join("run.sh")).unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(std::fs::read_link(inside.join("link")).unwrap(), Path::new("hello.txt"));
    // A card showed the upload.
    let upload: Vec<&Value> =
        turn.updates.iter().filter(|u| u["toolCallId"].as_str().is_some_and(|id| id.ends_with("-upload"))).collect();
    assert_eq!(
        (
            upload[0]["title"].as_str(),
            upload[1]["status"].as_str(),
            upload[1]["content"][0]["content"]["text"].as_str()
        ),
        (
            Some("Uploading the workspace to the sandbox"),
            Some("completed"),
            Some(
                "9 files (1 KiB) uploaded; what `.gitignore` ignores and the secrets the sandbox hides stay on this \
                 machine."
            )
        )
    );
    // Nothing came back: the agent only read, and its record of its runs is ignored.
    assert_eq!(writes(&bridge), vec![]);
    assert_eq!(notes(&turn), Vec::<String>::new());
    // What the agent changes in the git dir, and what git ignores (its build outputs), stays in the sandbox.
    let turn = bridge.prompt(
        &sid,
        &ops(json!([
            ["write", ".git/config", "[core]\nhooksPath=x\n"],
            ["write", "build/app", "bin\n"],
            ["write", "x.log", "log\n"]
        ])),
    );
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!((writes(&bridge), notes(&turn)), (vec![], vec![]));
    assert_eq!(read(&ws.join(".git/config")).as_deref(), Some("[core]\n"));
    assert!(!ws.join("build/app").exists() && !ws.join("x.log").exists());
    let turn = bridge.prompt(&sid, &ops(json!([["read", "build/app"], ["read", ".git/config"]])));
    assert_eq!(reads(&turn), "READ build/app=bin\n; .git/config=[core]\nhooksPath=x\n");
    // The secret went nowhere: not in the sandbox, not in what the fake received.
    assert!(!fake.records().iter().any(|r| r.to_string().contains("hunter2")), "the secret was uploaded");
    assert!(!fake.records().iter().any(|r| r.to_string().contains(KEY) && r["port"] == "envd"));
}

#[test]
fn an_edit_and_a_new_file_reach_the_users_files_only_through_the_editor() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-keep");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let mut bridge = support::Bridge::start_reviewing(e2b_options(&fake, &dirs), true);
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
    assert_eq!(notes(&turn), Vec::<String>::new(), "nothing is applied directly");
    // The tool cards name the files in the editor's workspace, not the sandbox's.
    let cards: Vec<&Value> =
        turn.updates.iter().filter(|u| u["sessionUpdate"] == "tool_call" && u["kind"] == "edit").collect();
    assert_eq!(cards.len(), 2, "{:?}", turn.updates);
    assert_eq!(cards[0]["locations"][0]["path"], json!(ws.join("hello.txt")));

    // The kept files are the agent's base for the next turn: nothing is sent again.
    let turn = bridge.prompt(&sid, &ops(json!([["read", "hello.txt"], ["read", "src/main.rs"]])));
    assert_eq!(reads(&turn), "READ hello.txt=new\n; src/main.rs=fn main() {}\n");
    assert_eq!(writes(&bridge).len(), 2);

    // The mirror on this machine goes with the session.
    let mirror = dirs.data.join("sessions").join(&sid).join("review");
    assert_eq!(read(&mirror.join("copy/hello.txt")).as_deref(), Some("new\n"));
    bridge.request("session/delete", json!({"sessionId": sid})).unwrap();
    assert!(!mirror.exists(), "the mirror outlived its session");
    assert_eq!(fake.state(), json!({}));
}

#[test]
fn a_rejected_change_is_undone_in_the_sandbox_and_the_users_edits_reach_it() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-reject");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    std::fs::write(ws.join("stale.txt"), "stale\n").unwrap();
    let mut bridge = support::Bridge::start_reviewing(e2b_options(&fake, &dirs), false);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, &ops(json!([["write", "hello.txt", "agent\n"], ["write", "added.txt", "x\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(
        writes(&bridge),
        vec![write(ws.join("added.txt"), "x\n", None), write(ws.join("hello.txt"), "agent\n", Some("old\n"))]
    );
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("old\n"));
    assert!(!ws.join("added.txt").exists());
    // The sandbox holds the user's files again.
    let inside = remote(&fake);
    assert_eq!(read(&inside.join("hello.txt")).as_deref(), Some("old\n"));
    assert!(!inside.join("added.txt").exists());

    // The user edits, adds and deletes meanwhile: the agent sees that, not its own rejected version.
    std::fs::write(ws.join("notes.md"), "the user's\n").unwrap();
    std::fs::write(ws.join("hello.txt"), "edited\n").unwrap();
    std::fs::remove_file(ws.join("stale.txt")).unwrap();
    let turn = bridge.prompt(
        &sid,
        &ops(json!([["read", "hello.txt"], ["read", "added.txt"], ["read", "notes.md"], ["read", "stale.txt"]])),
    );
    assert_eq!(
        reads(&turn),
        "READ hello.txt=edited\n; added.txt=<missing>; notes.md=the user's\n; stale.txt=<missing>"
    );
    assert_eq!(writes(&bridge).len(), 2, "nothing is sent again");
    assert_eq!(notes(&turn), Vec::<String>::new());
}

#[test]
fn each_finished_tool_is_reviewed_while_the_agent_still_runs_in_its_sandbox() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-per-tool");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let mut bridge = support::Bridge::start_reviewing(e2b_options(&fake, &dirs), false);
    let sid = bridge.new_session(&ws);
    // The rejected write is reset in the sandbox before the turn ends: the agent's next step reads the user's file.
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
fn deletions_and_binary_files_are_applied_directly_with_a_note() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-direct");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    std::fs::write(ws.join("kept.txt"), "stays\n").unwrap();
    let mut bridge = support::Bridge::start_reviewing(e2b_options(&fake, &dirs), true);
    let sid = bridge.new_session(&ws);
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
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-nocap");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let mut bridge = support::Bridge::start(e2b_options(&fake, &dirs));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, &ops(json!([["write", "hello.txt", "new\n"], ["write", "b.txt", "b\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("new\n"));
    assert_eq!(read(&ws.join("b.txt")).as_deref(), Some("b\n"));
    assert_eq!(
        notes(&turn),
        ["_This editor cannot review file writes (it does not offer `fs/writeTextFile`), so the agent's changes were \
          applied to your files directly: written `b.txt`, `hello.txt`._"]
    );
}

#[test]
fn a_replaced_sandbox_gets_the_workspace_again_and_nothing_reads_as_deleted() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-replaced");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("hello.txt"), "hello\n").unwrap();
    let mut bridge = support::Bridge::start_reviewing(e2b_options(&fake, &dirs), true);
    let sid = bridge.new_session(&ws);
    // Not a `files` prompt: the next one's CLI gets this in its transcript.
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn");
    let (first, _) = only_sandbox(&fake);
    let provider = fake.provider();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(acp_sandbox::sandbox::SandboxProvider::destroy(&provider, &first))
        .unwrap();

    let turn = bridge.prompt(&sid, &ops(json!([["read", "hello.txt"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_ne!(only_sandbox(&fake).0, first);
    assert_eq!(reads(&turn), "READ hello.txt=hello\n");
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("hello\n"));
    assert!(notes(&turn).iter().all(|note| !note.contains("deleted")), "{:?}", notes(&turn));
    assert_eq!(writes(&bridge), vec![]);
}

/// Measured, not asserted: how long the first prompt of a workspace of 2,000 small files takes against the fake
/// (the report quotes it), and that every file arrived.
#[test]
fn a_workspace_of_two_thousand_files_is_uploaded_on_the_first_prompt() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-many");
    let ws = dirs.remote_workspace("ws");
    for i in 0..2000 {
        let dir = ws.join(format!("pkg{}", i / 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("file{i}.txt")), format!("line {i}\n").repeat(20)).unwrap();
    }
    let mut bridge = support::Bridge::start_reviewing(e2b_options(&fake, &dirs), true);
    let sid = bridge.new_session(&ws);
    let started = std::time::Instant::now();
    assert_eq!(bridge.prompt(&sid, &ops(json!([]))).stop_reason(), "end_turn");
    eprintln!("first prompt with 2,000 files: {:?}", started.elapsed());
    let started = std::time::Instant::now();
    assert_eq!(bridge.prompt(&sid, &ops(json!([]))).stop_reason(), "end_turn");
    eprintln!("next prompt, nothing changed: {:?}", started.elapsed());
    let inside = remote(&fake);
    assert_eq!(tree(&inside).len(), 2001);
    assert_eq!(read(&inside.join("pkg19/file1999.txt")), Some("line 1999\n".repeat(20)));
    let uploads = fake.records().iter().filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with("/files"))).count();
    eprintln!("file requests: {uploads}");
    assert_eq!(writes(&bridge), vec![]);
}

#[test]
fn what_an_earlier_turn_left_in_the_sandbox_is_reviewed_before_the_next_one() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-left");
    let ws = dirs.remote_workspace("ws");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/a.rs"), "a\n").unwrap();
    let mut bridge = support::Bridge::start_reviewing(e2b_options(&fake, &dirs), true);
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, &ops(json!([]))).stop_reason(), "end_turn");
    // What a turn that crashed (or a process it left running) did after the last review: a directory replaced
    // by a link out of the workspace, and a new file.
    let inside = remote(&fake);
    std::fs::remove_dir_all(inside.join("src")).unwrap();
    std::os::unix::fs::symlink("/etc", inside.join("src")).unwrap();
    std::fs::write(inside.join("made.txt"), "made\n").unwrap();

    let turn = bridge.prompt(&sid, &ops(json!([["read", "made.txt"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(writes(&bridge), vec![write(ws.join("made.txt"), "made\n", None)]);
    assert_eq!(std::fs::read_link(ws.join("src")).unwrap(), Path::new("/etc"));
    assert_eq!(notes(&turn), ["_Applied to your files directly, without review: deleted `src/a.rs`; links `src`._"]);
    // The bridge wrote nothing through the link.
    let mirror = dirs.data.join("sessions").join(&sid).join("review/copy");
    assert_eq!(std::fs::read_link(mirror.join("src")).unwrap(), Path::new("/etc"));
}
