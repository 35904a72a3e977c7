//! The workspace of an E2B session through the built bridge: uploaded on the first prompt (without what git
//! ignores and what the local sandbox hides), the agent's changes brought back through the editor's review
//! (`fs/write_text_file`) or a permission card, or held back with a note, the user's edits between turns sent up before the next one.
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

/// The note on what is held back in the copy of session `sid`.
fn held(dirs: &support::TestDirs, sid: &str, items: &[&str]) -> String {
    let copy = dirs.data.join("sessions").join(sid).join("review/copy");
    format!(
        "_Held back, not applied to your files: {}. They stay in the agent's copy, where it keeps seeing them; to take \
         one, copy it from `{}` or make the change yourself._",
        items.join("; "),
        copy.display()
    )
}

/// The list of changes a permission card names.
fn card_list(request: &Value) -> String {
    request["toolCall"]["content"][0]["content"]["text"].as_str().unwrap_or_default().to_string()
}

const CARD_HEAD: &str =
    "The agent made these changes in its copy of the workspace; they reach your files only if you allow them:\n";

/// The bridge's peak RSS (VmHWM) while a turn leaves a 2 GiB file in the sandbox: 256 MiB.
const REMOTE_PULL_PEAK_KIB: u64 = 256 * 1024;

fn deletion_binary_and_sparse(allow: bool) {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new(if allow { "e2b-allowed" } else { "e2b-held" });
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    std::fs::write(ws.join("kept.txt"), "stays\n").unwrap();
    let mut bridge = support::Bridge::start_reviewing(e2b_options(&fake, &dirs), true);
    bridge.permission_answer = Some(if allow { "allow_once" } else { "reject_once" }.into());
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, &ops(json!([]))).stop_reason(), "end_turn");
    let turn = bridge.prompt(
        &sid,
        &ops(json!([["delete", "gone.txt"], ["bytes", "logo.bin", "00ff10"], ["sparse", "huge.bin", 2u64 << 30]])),
    );
    assert_eq!(turn.stop_reason(), "end_turn");
    // Never downloaded (its listed size is over the limit): the bridge's peak memory stays far below the file's.
    let status = std::fs::read_to_string(format!("/proc/{}/status", bridge.pid())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    assert!(peak_kib < REMOTE_PULL_PEAK_KIB, "the bridge's peak RSS was {peak_kib} KiB");
    assert_eq!(writes(&bridge), vec![]);
    assert_eq!(bridge.permission_requests.len(), 1);
    assert_eq!(
        card_list(&bridge.permission_requests[0]),
        format!("{CARD_HEAD}- delete `gone.txt`\n- new binary file `logo.bin` (3 bytes)\n")
    );
    assert_eq!(read(&ws.join("kept.txt")).as_deref(), Some("stays\n"));
    assert!(!ws.join("huge.bin").exists());
    let huge = "new file `huge.bin` (2.0 GiB, too large to show) (over the 64.0 MiB limit: it stays in the sandbox, not \
                brought back)";
    let inside = remote(&fake);
    if allow {
        assert!(!ws.join("gone.txt").exists());
        assert_eq!(std::fs::read(ws.join("logo.bin")).unwrap(), [0x00, 0xff, 0x10]);
        assert_eq!(notes(&turn), [held(&dirs, &sid, &[huge])]);
    } else {
        assert_eq!(read(&ws.join("gone.txt")).as_deref(), Some("bye\n"));
        assert!(!ws.join("logo.bin").exists());
        assert_eq!(
            notes(&turn),
            [held(
                &dirs,
                &sid,
                &["delete `gone.txt` (not allowed)", "new binary file `logo.bin` (3 bytes) (not allowed)", huge]
            )]
        );
    }
    // The sandbox keeps the agent's version either way.
    assert!(!inside.join("gone.txt").exists());
    assert_eq!(std::fs::read(inside.join("logo.bin")).unwrap(), [0x00, 0xff, 0x10]);
    assert_eq!(std::fs::metadata(inside.join("huge.bin")).unwrap().len(), 2 << 30);

    // The next turn asks nothing again and says nothing again.
    let turn = bridge.prompt(&sid, &ops(json!([["read", "kept.txt"]])));
    assert_eq!(reads(&turn), "READ kept.txt=stays\n");
    assert_eq!((bridge.permission_requests.len(), notes(&turn)), (1, vec![]));
    assert_eq!(read(&ws.join("gone.txt")).is_some(), !allow);
}

#[test]
fn deletions_and_binary_files_wait_for_an_allow_and_a_huge_file_stays_in_the_sandbox() {
    deletion_binary_and_sparse(false);
}

#[test]
fn allowed_deletions_and_binary_files_reach_the_users_files() {
    deletion_binary_and_sparse(true);
}

#[test]
fn a_client_without_the_capability_is_asked_and_nothing_is_written_unless_allowed() {
    let fake = FakeE2b::start();
    let dirs = support::TestDirs::new("e2b-nocap");
    let ws = dirs.remote_workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let mut bridge = support::Bridge::start(e2b_options(&fake, &dirs));
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, &ops(json!([["write", "hello.txt", "new\n"], ["write", "b.txt", "b\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("old\n"));
    assert!(!ws.join("b.txt").exists());
    assert_eq!(
        card_list(&bridge.permission_requests[0]),
        format!("{CARD_HEAD}- new text file `b.txt` (2 bytes)\n- text written to `hello.txt` (4 bytes)\n")
    );
    assert_eq!(
        notes(&turn),
        [held(
            &dirs,
            &sid,
            &["new text file `b.txt` (2 bytes) (not allowed)", "text written to `hello.txt` (4 bytes) (not allowed)"]
        )]
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
    // Nobody allowed the deletion and the link: the user's directory stays.
    assert_eq!(read(&ws.join("src/a.rs")).as_deref(), Some("a\n"));
    assert_eq!(
        card_list(&bridge.permission_requests[0]),
        format!("{CARD_HEAD}- delete `src/a.rs`\n- link `src` → `/etc`\n")
    );
    assert_eq!(
        notes(&turn),
        [held(&dirs, &sid, &["link `src` → `/etc` (not allowed)", "delete `src/a.rs` (not allowed)"])]
    );
    // The bridge wrote nothing through the link.
    let mirror = dirs.data.join("sessions").join(&sid).join("review/copy");
    assert_eq!(std::fs::read_link(mirror.join("src")).unwrap(), Path::new("/etc"));
}
