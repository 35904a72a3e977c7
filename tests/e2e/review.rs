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

/// The note under `none` that the agent runs without a sandbox (none under bubblewrap).
fn sandbox_notes() -> Vec<String> {
    if std::env::var("ACP_SANDBOX_E2E_SANDBOX").as_deref() == Ok("bwrap") {
        return Vec::new();
    }
    vec![
        "_OpenCode runs WITHOUT a sandbox here (--sandbox none was given): it can read and write everything you can._"
            .to_string(),
    ]
}

/// The notes of a turn but the sandbox's.
fn review_notes(turn: &Turn) -> Vec<String> {
    let sandbox = sandbox_notes();
    notes(turn).into_iter().filter(|note| !sandbox.contains(note)).collect()
}

/// Where the agent's copy of the session's workspace is.
fn copy_of(dirs: &TestDirs, sid: &str) -> PathBuf {
    dirs.data.join("sessions").join(sid).join("review/copy")
}

/// The list of changes a permission card names (its first content block).
fn card_list(request: &Value) -> String {
    request["toolCall"]["content"][0]["content"]["text"].as_str().unwrap_or_default().to_string()
}

fn card(items: &[&str]) -> String {
    let mut text =
        "The agent made these changes in its copy of the workspace; they reach your files only if you allow \
                    them:\n"
            .to_string();
    for item in items {
        text.push_str(&format!("- {item}\n"));
    }
    text
}

fn held(items: &[&str], copy: &Path) -> String {
    format!(
        "_Held back, not applied to your files: {}. They stay in the agent's copy, where it keeps seeing them; to take \
         one, copy it from `{}` or make the change yourself._",
        items.join("; "),
        copy.display()
    )
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// The hostile agent's changes the editor cannot show: a deletion, a rename, a link to `/etc/passwd`, a script
/// with a NUL byte, a file of invalid UTF-8, executable bits and a setuid bit.
fn hostile_changes() -> String {
    ops(json!([
        ["delete", "gone.txt"],
        ["rename", "old.txt", "new/name.txt"],
        ["link", "p", "/etc/passwd"],
        ["bytes", "script.sh", "23210a00"],
        ["chmod", "script.sh", "755"],
        ["bytes", "bad.txt", "ff0a"],
        ["chmod", "tool.sh", "4755"]
    ]))
}

fn hostile_workspace(dirs: &TestDirs) -> PathBuf {
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    std::fs::write(ws.join("old.txt"), "moved\n").unwrap();
    std::fs::write(ws.join("tool.sh"), "#!/bin/sh\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(ws.join("tool.sh"), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    ws
}

const HOSTILE_CARD: [&str; 7] = [
    "delete `gone.txt`",
    "new binary file `bad.txt` (2 bytes)",
    "rename `old.txt` → `new/name.txt`",
    "link `p` → `/etc/passwd`",
    "new binary file `script.sh` (4 bytes)",
    "set the executable bit of `script.sh`",
    "set the executable bit of `tool.sh`",
];

fn assert_untouched(ws: &Path) {
    assert_eq!(read(&ws.join("gone.txt")).as_deref(), Some("bye\n"));
    assert_eq!(read(&ws.join("old.txt")).as_deref(), Some("moved\n"));
    assert!(!ws.join("new").exists() && std::fs::symlink_metadata(ws.join("p")).is_err());
    assert!(!ws.join("script.sh").exists() && !ws.join("bad.txt").exists());
    assert_eq!(mode(&ws.join("tool.sh")), 0o644);
}

#[test]
fn changes_the_editor_cannot_show_are_asked_for_and_held_back_when_not_allowed() {
    let dirs = TestDirs::new("review-held");
    let ws = hostile_workspace(&dirs);
    let mut bridge = Bridge::start_reviewing(options(&dirs), true);
    bridge.permission_answer = Some("reject_once".into());
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, &hostile_changes());
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(writes(&bridge), vec![], "nothing of these goes to fs/write_text_file");
    assert_eq!(bridge.permission_requests.len(), 1, "{:#?}", bridge.permission_requests);
    assert_eq!(card_list(&bridge.permission_requests[0]), card(&HOSTILE_CARD));
    assert_untouched(&ws);
    let copy = copy_of(&dirs, &sid);
    // The note names them by path.
    let mut by_path = HOSTILE_CARD.to_vec();
    by_path.swap(0, 1);
    let items: Vec<String> = by_path.iter().map(|item| format!("{item} (not allowed)")).collect();
    let items: Vec<&str> = items.iter().map(String::as_str).collect();
    assert_eq!(review_notes(&turn), [held(&items, &copy)]);
    // The card shows how it ended: refused.
    let statuses: Vec<&Value> = turn
        .updates
        .iter()
        .filter(|u| {
            u["sessionUpdate"] == "tool_call_update"
                && u["toolCallId"] == bridge.permission_requests[0]["toolCall"]["toolCallId"]
        })
        .map(|u| &u["status"])
        .collect();
    assert_eq!(statuses, [&json!("failed")]);

    // The next turn: the agent still sees its versions, nothing is asked or noted again, the user's files hold.
    let turn = bridge.prompt(&sid, &ops(json!([["read", "new/name.txt"], ["read", "gone.txt"], ["read", "old.txt"]])));
    assert_eq!(reads(&turn), "READ new/name.txt=moved\n; gone.txt=<missing>; old.txt=<missing>");
    assert_eq!(bridge.permission_requests.len(), 1);
    assert_eq!(review_notes(&turn), Vec::<String>::new());
    assert_untouched(&ws);
    assert_eq!(std::fs::read_link(copy.join("p")).unwrap(), Path::new("/etc/passwd"));
    assert_eq!(std::fs::read(copy.join("script.sh")).unwrap(), [0x23, 0x21, 0x0a, 0x00]);

    // The user changes a held file: the user's version wins, in the copy too.
    std::fs::write(ws.join("gone.txt"), "the user's\n").unwrap();
    let turn = bridge.prompt(&sid, &ops(json!([["read", "gone.txt"]])));
    assert_eq!(reads(&turn), "READ gone.txt=the user's\n");
}

#[test]
fn allowed_changes_are_applied_exactly_and_no_mode_bit_but_the_executable_one() {
    let dirs = TestDirs::new("review-allowed");
    let ws = hostile_workspace(&dirs);
    let mut bridge = Bridge::start_reviewing(options(&dirs), true);
    bridge.permission_answer = Some("allow_once".into());
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, &hostile_changes());
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(card_list(&bridge.permission_requests[0]), card(&HOSTILE_CARD));
    assert_eq!(review_notes(&turn), Vec::<String>::new());
    assert!(!ws.join("gone.txt").exists() && !ws.join("old.txt").exists());
    assert_eq!(read(&ws.join("new/name.txt")).as_deref(), Some("moved\n"));
    assert_eq!(std::fs::read_link(ws.join("p")).unwrap(), Path::new("/etc/passwd"));
    assert_eq!(std::fs::read(ws.join("script.sh")).unwrap(), [0x23, 0x21, 0x0a, 0x00]);
    assert_eq!(std::fs::read(ws.join("bad.txt")).unwrap(), [0xff, 0x0a]);
    assert_eq!(mode(&ws.join("script.sh")), 0o755);
    assert_eq!(mode(&ws.join("tool.sh")), 0o755, "the setuid bit never reaches the workspace");
    assert_eq!(read(&ws.join("tool.sh")).as_deref(), Some("#!/bin/sh\n"));
}

#[test]
fn a_client_without_fs_writes_is_asked_and_nothing_is_written_unless_allowed() {
    let dirs = TestDirs::new("review-nocap");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let mut bridge = Bridge::start(options(&dirs));
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, &ops(json!([]))).stop_reason(), "end_turn");
    // Nobody answers (`cancelled`): nothing is written.
    bridge.permission_requests.clear();
    let turn = bridge.prompt(&sid, &ops(json!([["write", "hello.txt", "new\n"], ["write", "b.txt", "b\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("old\n"));
    assert!(!ws.join("b.txt").exists());
    assert_eq!(bridge.permission_requests.len(), 1);
    let request = &bridge.permission_requests[0];
    let invocations = "`.fake-cli/invocations.jsonl`";
    let invocations =
        card_list(request).lines().find(|l| l.contains(invocations)).unwrap().trim_start_matches("- ").to_string();
    assert_eq!(
        card_list(request),
        card(&[&invocations, "new text file `b.txt` (2 bytes)", "text written to `hello.txt` (4 bytes)"])
    );
    // The card carries the text edits as diffs, as an editor shows them.
    let diffs: Vec<(String, Value, Value)> = request["toolCall"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "diff" && !c["path"].as_str().unwrap().contains(".fake-cli"))
        .map(|c| (c["path"].as_str().unwrap().to_string(), c["oldText"].clone(), c["newText"].clone()))
        .collect();
    assert_eq!(
        diffs,
        [
            (ws.join("b.txt").display().to_string(), Value::Null, json!("b\n")),
            (ws.join("hello.txt").display().to_string(), json!("old\n"), json!("new\n")),
        ]
    );
    let copy = copy_of(&dirs, &sid);
    assert_eq!(
        review_notes(&turn),
        [held(
            &[
                &format!("{invocations} (not allowed)"),
                "new text file `b.txt` (2 bytes) (not allowed)",
                "text written to `hello.txt` (4 bytes) (not allowed)"
            ],
            &copy
        )]
    );

    // Allowed: applied.
    bridge.permission_answer = Some("allow_once".into());
    let turn = bridge.prompt(&sid, &ops(json!([["write", "hello.txt", "newer\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("newer\n"));
    assert!(!ws.join("b.txt").exists(), "a held change is not offered again");
}
/// The same review through the official SDK's client role (`support::acp_client`), as an editor built on it: the
/// bridge's `fs/write_text_file` and its permission card decode as the SDK's types, and what it answers is applied.
#[test]
fn an_editor_on_the_official_sdk_keeps_a_write_and_allows_a_card() {
    use crate::support::acp_client::{self, AcpClient, Answers};
    use agent_client_protocol::v1::schema::{PermissionOptionKind, StopReason};

    let dirs = TestDirs::new("review-sdk");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
    let answers = Answers { permission: None, offer_writes: true, keep_writes: true };
    let client = AcpClient::start(options(&dirs).command(), answers);
    let sid = client.new_session(&ws);
    let turn = client.prompt(&sid, &ops(json!([["write", "hello.txt", "new\n"]])));
    assert_eq!(turn.stop_reason(), StopReason::EndTurn);
    let writes: Vec<acp_client::FileWrite> =
        client.file_writes().into_iter().filter(|w| !w.path.starts_with(ws.join(".fake-cli"))).collect();
    let hello =
        acp_client::FileWrite { path: ws.join("hello.txt"), content: "new\n".into(), before: Some("old\n".into()) };
    assert_eq!(writes, [hello]);
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("new\n"));
    assert_eq!(client.permission_requests().len(), 0, "a text write the editor keeps needs no card");
    drop(client);

    // An editor without fs writes gets the change on a card; allowed once, it is applied.
    let other = dirs.workspace("other");
    std::fs::write(other.join("hello.txt"), "old\n").unwrap();
    let answers = Answers { permission: Some(PermissionOptionKind::AllowOnce), ..Answers::default() };
    let client = AcpClient::start(options(&dirs).command(), answers);
    let sid = client.new_session(&other);
    let turn = client.prompt(&sid, &ops(json!([["write", "hello.txt", "newer\n"]])));
    assert_eq!(turn.stop_reason(), StopReason::EndTurn);
    let requests = client.permission_requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(requests[0].session_id, sid);
    assert!(requests[0].options.iter().any(|option| option.kind == PermissionOptionKind::AllowOnce));
    assert_eq!(read(&other.join("hello.txt")).as_deref(), Some("newer\n"));
    assert_eq!(client.file_writes(), [], "no fs/write_text_file to an editor that does not offer it");
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
fn a_write_the_editor_refuses_is_never_applied_and_the_agent_reads_the_users_version() {
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
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("old\n"));
    assert_eq!(
        review_notes(&turn),
        ["_The editor refused the agent's writes of `.fake-cli/invocations.jsonl`, `hello.txt` (invalid path): your \
          files stay as they were, and the agent's copy has your version again._"]
    );
    assert_eq!(bridge.permission_requests.len(), 0, "a refused write is not offered another way");
    let turn = bridge.prompt(&sid, &ops(json!([["read", "hello.txt"]])));
    assert_eq!(reads(&turn), "READ hello.txt=old\n");
    assert_eq!(read(&ws.join("hello.txt")).as_deref(), Some("old\n"));
}

#[test]
fn every_file_is_reviewed_the_101st_on_a_card() {
    let dirs = TestDirs::new("review-many");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start_reviewing(options(&dirs), true);
    bridge.permission_answer = Some("reject_once".into());
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, &ops(json!([["many", "d", 101]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    // The fake's own record and 99 of the files make the 100 the editor gets.
    let sent: Vec<PathBuf> = bridge.file_writes.iter().map(|w| w.path.clone()).collect();
    let mut expected = vec![ws.join(".fake-cli/invocations.jsonl")];
    expected.extend((0..99).map(|i| ws.join(format!("d/f{i:03}.txt"))));
    assert_eq!(sent, expected);
    assert_eq!(
        card_list(&bridge.permission_requests[0]),
        card(&["new text file `d/f099.txt` (8 bytes)", "new text file `d/f100.txt` (9 bytes)"])
    );
    assert!(!ws.join("d/f099.txt").exists() && !ws.join("d/f100.txt").exists());
    assert_eq!(read(&ws.join("d/f098.txt")).as_deref(), Some("file 98\n"));
    assert_eq!(
        review_notes(&turn),
        [held(
            &[
                "new text file `d/f099.txt` (8 bytes) (not allowed)",
                "new text file `d/f100.txt` (9 bytes) (not allowed)"
            ],
            &copy_of(&dirs, &sid)
        )]
    );
}

#[test]
fn a_large_text_file_is_asked_for_and_a_sparse_2_gib_file_held_back_unread() {
    let dirs = TestDirs::new("review-large");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start_reviewing(options(&dirs), true);
    bridge.permission_answer = Some("reject_once".into());
    let sid = bridge.new_session(&ws);
    let turn = bridge
        .prompt(&sid, &ops(json!([["repeat", "big.txt", "abcdefgh", 393216], ["sparse", "huge.bin", 2u64 << 30]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(card_list(&bridge.permission_requests[0]), card(&["new file `big.txt` (3.0 MiB, too large to show)"]));
    assert!(!ws.join("big.txt").exists() && !ws.join("huge.bin").exists());
    assert_eq!(
        review_notes(&turn),
        [held(
            &[
                "new file `big.txt` (3.0 MiB, too large to show) (not allowed)",
                "new file `huge.bin` (2.0 GiB, too large to show) (over the 64.0 MiB limit)"
            ],
            &copy_of(&dirs, &sid)
        )]
    );
    assert_eq!(writes(&bridge), vec![]);
}

#[test]
fn a_link_then_a_file_at_its_path_writes_nothing_outside_the_workspace() {
    let dirs = TestDirs::new("review-link-file");
    let ws = dirs.workspace("ws");
    // Stands for ~/.bashrc.
    let victim = dirs.workspace("home").join(".bashrc");
    std::fs::write(&victim, "precious\n").unwrap();
    let mut bridge = Bridge::start_reviewing(options(&dirs), true);
    bridge.permission_answer = Some("allow_once".into());
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, &ops(json!([["link", "p", victim]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(std::fs::read_link(ws.join("p")).unwrap(), victim, "the link was allowed");
    // The agent replaces the link by a file: the editor (which writes with a plain open) is not asked to write
    // through the user's link.
    let turn = bridge.prompt(&sid, &ops(json!([["delete", "p"], ["write", "p", "evil\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(writes(&bridge), vec![]);
    assert_eq!(read(&victim).as_deref(), Some("precious\n"));
    assert_eq!(std::fs::read_link(ws.join("p")).unwrap(), victim);
    assert_eq!(
        review_notes(&turn),
        [held(
            &["new text file `p` (5 bytes) (its path in your workspace goes through a link, which is never followed)"],
            &copy_of(&dirs, &sid)
        )]
    );
}

#[test]
fn a_fifo_in_a_files_place_holds_nothing_up_and_a_cancel_is_answered() {
    let dirs = TestDirs::new("review-fifo");
    let ws = dirs.workspace("ws");
    std::fs::write(ws.join("data.txt"), "data\n").unwrap();
    let mut bridge = Bridge::start_reviewing(options(&dirs), true);
    let sid = bridge.new_session(&ws);
    let id = bridge.send_prompt(&sid, &ops(json!([["fifo", "data.txt"], ["flush"], ["sleep", 60]])));
    let note = bridge.wait_update(&sid, "the held-back note", |u| {
        u["content"]["text"].as_str().is_some_and(|t| t.trim_start().starts_with("_Held back"))
    });
    assert_eq!(
        note["content"]["text"].as_str().unwrap().trim(),
        held(&["`data.txt` (a FIFO, socket or device) (never applied)"], &copy_of(&dirs, &sid))
    );
    bridge.cancel(&sid);
    let turn = bridge.finish_turn(&sid, id);
    assert_eq!(turn.stop_reason(), "cancelled");
    assert_eq!(read(&ws.join("data.txt")).as_deref(), Some("data\n"));
    assert!(std::fs::symlink_metadata(ws.join("data.txt")).unwrap().is_file());
}
