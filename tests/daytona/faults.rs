//! The built bridge against the fake Daytona where Daytona differs from the happy path: a session shell without
//! zsh (its output labeller drops NUL bytes), a delete while the bridge's own stop is still under way, a cancel
//! answered before the tidying up, workspace secrets, a daemon without `terminate`, a sandbox deleted mid-turn.

use super::bridge::{daytona_options, only_sandbox, workspace_of};
use super::*;
use pretty_assertions::assert_eq;

/// Under bash and dash, the daemon's labeller loses every NUL byte of a command's output: the mirror's listing
/// still reads (it is encoded as text), so the agent's edit and new file reach the user's files exactly, and the
/// next turn finds them in the sandbox (never uploaded afresh over the agent's work).
#[test]
fn under_a_bash_or_dash_session_shell_the_agents_edits_reach_the_users_files_exactly() {
    for shell in ["bash", "dash"] {
        let dir = test_dir(&format!("shell-{shell}"));
        let fake = FakeDaytona::start_with(&dir, &["--session-shell", shell]);
        let dirs = support::TestDirs::new(&format!("daytona-shell-{shell}"));
        let ws = dirs.remote_workspace("ws");
        std::fs::write(ws.join("hello.txt"), "old\n").unwrap();
        let mut bridge = support::Bridge::start_reviewing(daytona_options(&fake, &dirs), true);
        let sid = bridge.new_session(&ws);
        let turn = bridge.prompt(
            &sid,
            &support::ops(json!([["write", "hello.txt", "agent \\ edit\n"], ["write", "dir/new.txt", "x\n"]])),
        );
        assert_eq!(turn.stop_reason(), "end_turn", "{shell}");
        assert_eq!(std::fs::read_to_string(ws.join("hello.txt")).unwrap(), "agent \\ edit\n", "{shell}");
        assert_eq!(std::fs::read_to_string(ws.join("dir/new.txt")).unwrap(), "x\n", "{shell}");
        assert_eq!(support::notes(&turn), Vec::<String>::new(), "{shell}");
        let turn = bridge.prompt(&sid, &support::ops(json!([["read", "hello.txt"], ["read", "dir/new.txt"]])));
        assert_eq!(support::reads(&turn), "READ hello.txt=agent \\ edit\n; dir/new.txt=x\n", "{shell}");
        let remote = workspace_of(&fake, &only_sandbox(&fake));
        assert_eq!(std::fs::read_to_string(remote.join("hello.txt")).unwrap(), "agent \\ edit\n", "{shell}");
        // The mirror's token goes up with a workspace uploaded afresh: once, on the first prompt, never again.
        let tokens = fake
            .requests()
            .iter()
            .filter(|r| r["path"].as_str().unwrap().ends_with("/files/bulk-upload"))
            .filter(|r| r["body"].to_string().contains("/.acp-sandbox/mirror-token"))
            .count();
        assert_eq!(tokens, 1, "{shell}");
    }
}
