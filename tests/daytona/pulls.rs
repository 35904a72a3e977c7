//! The agent's files brought back from a Daytona sandbox are bounded and streamed to disk, as E2B's are
//! (`e2b/pulls.rs`), over the toolbox's `GET /files/download`: cut off as soon as a download passes the review's
//! apply limit, nothing left behind; a large file within it lands byte-exact while the bridge's peak memory stays
//! far below the file's size. The fake's `--grow NAME=BYTES` serves a file named NAME with that many bytes more
//! than it holds, without a length, as a file the agent still writes while it is downloaded.

use acp_sandbox::sandbox::remote::download::Downloaded;
use acp_sandbox::workspace::review::APPLY_LIMIT;

use super::bridge::daytona_options;
use super::*;
use pretty_assertions::assert_eq;

/// How much the bridge's peak memory may rise while a turn brings back a 48 MB file and cuts off a 1 GiB one.
const PULL_RISE_KIB: u64 = 40 * 1024;

/// The peak resident memory (VmHWM) of process `pid`, in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_to_a_file_is_whole_or_cut_off_at_its_bound_leaving_nothing() {
    let dir = test_dir("download-to");
    let fake = FakeDaytona::start_with(&dir, &["--grow", "grows.bin=1048576"]);
    let (provider, id, sandbox) = created(&fake, "s-download").await;
    let inside = fake.root.join(&id).join("home/workspace");
    std::fs::create_dir_all(&inside).unwrap();
    // Several MiB in several chunks, no two alike.
    let bytes: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(inside.join("exact.bin"), &bytes).unwrap();
    std::fs::File::create(inside.join("over.bin")).unwrap().set_len(APPLY_LIMIT + 1).unwrap();
    std::fs::write(inside.join("grows.bin"), "0123456789").unwrap();
    let host = dir.join("host");
    std::fs::create_dir_all(&host).unwrap();
    let dest = |name: &str| host.join(name);
    let remote = |name: &str| sandbox.workspace().join(name);
    let files = sandbox.remote_files().expect("a remote sandbox's files");

    let got = files.download_to(&remote("exact.bin"), &dest("exact"), APPLY_LIMIT).await.unwrap();
    assert_eq!(got, Downloaded::Whole(3 << 20));
    assert!(std::fs::read(dest("exact")).unwrap() == bytes, "not byte-exact");
    let got = files.download_to(&remote("exact.bin"), &dest("bound"), 3 << 20).await.unwrap();
    assert_eq!(got, Downloaded::Whole(3 << 20), "exactly the bound is within it");

    // One byte over, by the announced length: nothing is read, nothing written.
    let got = files.download_to(&remote("over.bin"), &dest("over"), APPLY_LIMIT).await.unwrap();
    assert_eq!(got, Downloaded::TooLarge(APPLY_LIMIT + 1));
    assert!(!dest("over").exists());

    // No length announced: cut off as the chunks pass the bound, the partial file removed.
    let got = files.download_to(&remote("grows.bin"), &dest("grows"), 1000).await.unwrap();
    assert_eq!(got, Downloaded::TooLarge(1001));
    assert!(!dest("grows").exists());
    let got = files.download_to(&remote("grows.bin"), &dest("grown"), 2 << 20).await.unwrap();
    assert_eq!(got, Downloaded::Whole(10 + (1 << 20)));
    assert_eq!(&std::fs::read(dest("grown")).unwrap()[..10], b"0123456789");

    // Missing while the toolbox answers: missing, nothing written.
    let got = files.download_to(&remote("missing.bin"), &dest("missing"), APPLY_LIMIT).await.unwrap();
    assert_eq!(got, Downloaded::Missing);
    assert!(!dest("missing").exists());

    // What is at the destination already is never written through, nor removed.
    std::fs::write(dest("taken"), "mine").unwrap();
    assert!(files.download_to(&remote("exact.bin"), &dest("taken"), APPLY_LIMIT).await.is_err());
    assert_eq!(std::fs::read_to_string(dest("taken")).unwrap(), "mine");
    let mut left: Vec<String> =
        std::fs::read_dir(&host).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["bound", "exact", "grown", "taken"]);
    provider.destroy(&id).await.unwrap();
}

/// A line of the large file the agent writes.
const LINE: &str = "the agent wrote this line into a large file\n";
/// Its lines: 48.4 MB, within the apply limit, far above what the bridge may hold.
const LINES: usize = 1_100_000;

#[test]
fn a_file_growing_past_the_bound_is_cut_off_and_a_large_one_lands_streamed() {
    let dir = test_dir("streamed");
    let fake = FakeDaytona::start_with(&dir, &["--grow", "grows.bin=1073741824"]);
    let dirs = support::TestDirs::new("daytona-streamed");
    let ws = dirs.remote_workspace("ws");
    let mut bridge = support::Bridge::start_reviewing(daytona_options(&fake, &dirs), true);
    bridge.permission_answer = Some("allow_once".into());
    let sid = bridge.new_session(&ws);
    assert_eq!(bridge.prompt(&sid, &support::ops(json!([]))).stop_reason(), "end_turn");
    // What a bridge killed mid-download left: removed, never applied.
    let partial = dirs.data.join("sessions").join(&sid).join("review/partial");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("0"), "leftover").unwrap();
    let before = peak_kib(bridge.pid());

    // `grows.bin` is listed at 4 bytes and served with 1 GiB more.
    let turn =
        bridge.prompt(&sid, &support::ops(json!([["write", "grows.bin", "tiny"], ["repeat", "big.txt", LINE, LINES]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    let rise = peak_kib(bridge.pid()).saturating_sub(before);
    assert!(rise < PULL_RISE_KIB, "the bridge's peak RSS rose by {rise} KiB while bringing the files back");

    assert_eq!(bridge.permission_requests.len(), 1);
    let list = bridge.permission_requests[0]["toolCall"]["content"][0]["content"]["text"].as_str().unwrap();
    assert_eq!(
        list,
        "The agent made these changes in its copy of the workspace; they reach your files only if you allow them:\n\
         - new file `big.txt` (46.2 MiB, too large to show)\n"
    );
    let written = std::fs::read(ws.join("big.txt")).unwrap();
    assert!(written == LINE.repeat(LINES).into_bytes(), "big.txt is not byte-exact ({} bytes)", written.len());
    assert!(!ws.join("grows.bin").exists());
    let copy = dirs.data.join("sessions").join(&sid).join("review/copy");
    assert!(!copy.join("grows.bin").exists(), "never in the agent's copy either");
    assert_eq!(
        support::notes(&turn),
        [format!(
            "_Held back, not applied to your files: new file `grows.bin` (64.0 MiB, too large to show) (over the 64.0 \
             MiB limit: it stays in the sandbox, not brought back). They stay in the agent's copy, where it keeps \
             seeing them; to take one, copy it from `{}` or make the change yourself._",
            copy.display()
        )]
    );
    assert_eq!(std::fs::read_dir(&partial).unwrap().count(), 0, "the partial dir is left empty");

    // Unchanged in the sandbox: neither downloaded nor said again.
    let turn = bridge.prompt(&sid, &support::ops(json!([["read", "none.txt"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!((bridge.permission_requests.len(), support::notes(&turn)), (1, vec![]));
    let downloads = fake
        .requests()
        .iter()
        .filter(|r| {
            let path = r["path"].as_str().unwrap_or_default();
            r["method"] == "GET" && path.contains("/files/download") && path.contains("grows.bin")
        })
        .count();
    assert_eq!(downloads, 1);
}
