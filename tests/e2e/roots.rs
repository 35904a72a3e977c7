//! The workspace's other roots (ACP's `additionalDirectories`): advertised where a session can have them, checked
//! like the cwd, written by the agent at their own paths, protected like the workspace, listed, and kept by a load
//! that names none.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::support::*;

/// `session/new` in `cwd` with `roots`; the answer or its error.
fn new_with_roots(bridge: &mut Bridge, cwd: &Path, roots: &[&Path]) -> Result<Value, RpcError> {
    bridge.request("session/new", json!({"cwd": cwd, "mcpServers": [], "additionalDirectories": roots}))
}

/// The roots `session/list` reports for `sid`.
fn listed_roots(bridge: &mut Bridge, sid: &str) -> Value {
    let list = bridge.request("session/list", json!({})).unwrap_or_else(|e| bridge.fail(&format!("{e}")));
    let sessions = list["sessions"].as_array().cloned().unwrap_or_default();
    let session = sessions.iter().find(|s| s["sessionId"] == sid).cloned().unwrap_or_else(|| panic!("{list}"));
    session.get("additionalDirectories").cloned().unwrap_or(Value::Null)
}

fn under(root: &Path, rel: &str) -> PathBuf {
    root.join(rel)
}

#[test]
fn a_root_is_advertised_written_at_its_own_path_listed_and_kept_by_a_load_after_a_restart() {
    let dirs = TestDirs::new("roots");
    let ws = dirs.workspace("ws");
    let lib = dirs.workspace("lib");
    let options = || BridgeOptions::new("opencode", &dirs.data);
    let mut bridge = Bridge::spawn(options());
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"]["additionalDirectories"], json!({}), "{init}");

    // The cwd and a repeat are left out; a trailing slash is normalized away.
    let with_slash = PathBuf::from(format!("{}/", lib.display()));
    let answer = new_with_roots(&mut bridge, &ws, &[&with_slash, &ws, &lib]).unwrap();
    let sid = answer["sessionId"].as_str().unwrap().to_string();
    assert_eq!(listed_roots(&mut bridge, &sid), json!([lib]));

    let target = under(&lib, "out/first.txt");
    let turn = bridge.prompt(&sid, &ops(json!([["try-write", target, "one\n"]])));
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(reads(&turn), format!("READ {}=written", target.display()));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "one\n", "the write reached the host at its path");
    // OpenCode is told the root is its project's: it does not ask about it as an outside directory.
    let permission = invocations(&ws)[0].env("OPENCODE_PERMISSION").unwrap_or_default();
    assert_eq!(permission, json!({"external_directory": {format!("{}/*", lib.display()): "allow"}}).to_string());
    drop(bridge);

    // A new bridge; Zed would send the roots again, a client that does not send them keeps them.
    let mut bridge = Bridge::start(options());
    assert_eq!(listed_roots(&mut bridge, &sid), json!([lib]));
    let loaded = bridge.load_session(&sid, &ws);
    assert!(loaded.result.is_ok(), "{:?}", loaded.result);
    let again = under(&lib, "again.txt");
    let turn = bridge.prompt(&sid, &ops(json!([["try-write", again, "two\n"]])));
    assert_eq!(reads(&turn), format!("READ {}=written", again.display()));
    assert_eq!(std::fs::read_to_string(&again).unwrap(), "two\n");
    assert_eq!(listed_roots(&mut bridge, &sid), json!([lib]));

    // A load that names roots replaces them.
    let other = dirs.workspace("other");
    let answer = bridge.request(
        "session/load",
        json!({"sessionId": sid, "cwd": ws, "mcpServers": [], "additionalDirectories": [other]}),
    );
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!(listed_roots(&mut bridge, &sid), json!([other]));
}

#[test]
fn roots_a_workspace_could_not_be_are_refused_as_invalid_params() {
    let dirs = TestDirs::new("roots-refused");
    let ws = dirs.workspace("ws");
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let refused = |bridge: &mut Bridge, root: &Path| match new_with_roots(bridge, &ws, &[root]) {
        Err(e) => (e.code, e.message),
        Ok(answer) => panic!("{} was taken as a root: {answer}", root.display()),
    };
    let (code, message) = refused(&mut bridge, Path::new("/"));
    assert_eq!(code, -32602);
    assert!(message.contains("the whole filesystem (/) cannot be a workspace"), "{message}");
    let (code, message) = refused(&mut bridge, Path::new("relative/dir"));
    assert_eq!((code, message.as_str()), (-32602, "additionalDirectories must be absolute paths, got relative/dir"));
    let missing = dirs.root().join("missing");
    let (code, message) = refused(&mut bridge, &missing);
    assert_eq!(code, -32602);
    assert!(message.contains(&format!("{} is not an existing directory", missing.display())), "{message}");
    let (code, message) = refused(&mut bridge, &dirs.data);
    assert_eq!(code, -32602);
    assert!(message.contains("acp-sandbox's data dir"), "{message}");
    // Every system directory the sandbox shows read-only, and a link to one, is refused: as root the agent would
    // otherwise write `/usr/local/bin`.
    let link = dirs.root().join("local-bin-link");
    std::os::unix::fs::symlink("/usr/local/bin", &link).unwrap();
    for (root, reason) in [
        (PathBuf::from("/usr/local/bin"), "/usr/local/bin is a system directory (/usr)"),
        (link.clone(), "/usr/local/bin is a system directory (/usr)"),
        ("/usr/local".into(), "/usr/local is a system directory (/usr)"),
        ("/usr".into(), "/usr is a system directory (/usr)"),
        ("/etc".into(), "/etc is a system directory (/etc)"),
        ("/var/lib".into(), "/var/lib is a system directory (/var/lib)"),
        ("/var/tmp".into(), "/var/tmp is a system directory"),
        ("/var".into(), "/var is a system directory"),
        ("/opt".into(), "/opt is a system directory"),
    ] {
        let (code, message) = refused(&mut bridge, &root);
        assert_eq!(
            (code, message.as_str()),
            (-32602, format!("additionalDirectories: {reason}; open a project folder instead").as_str()),
            "{}",
            root.display()
        );
    }
    // Nothing was made of the refused requests.
    let list = bridge.request("session/list", json!({})).unwrap();
    assert_eq!(list["sessions"], json!([]), "{list}");
}

#[test]
fn review_mode_does_not_advertise_roots_and_refuses_them() {
    let dirs = TestDirs::new("roots-review");
    let ws = dirs.workspace("ws");
    let lib = dirs.workspace("lib");
    let mut options = BridgeOptions::new("opencode", &dirs.data);
    options.args.extend(["--workspace".to_string(), "review".to_string()]);
    let mut bridge = Bridge::spawn(options);
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"].get("additionalDirectories"), None, "{init}");
    let error = new_with_roots(&mut bridge, &ws, &[&lib]).unwrap_err();
    assert_eq!(
        (error.code, error.message.as_str()),
        (-32602, "additionalDirectories: review mode (--workspace review) takes one root, the workspace")
    );
}

#[test]
fn under_bubblewrap_only_the_named_roots_are_writable_and_their_protected_paths_stay_protected() {
    if let Err(why) = bwrap_usable() {
        eprintln!("SKIPPED under_bubblewrap_only_the_named_roots_are_writable…: {why}");
        return;
    }
    let dirs = TestDirs::new("roots-bwrap");
    let ws = dirs.workspace("ws");
    let lib = dirs.workspace("lib");
    let unnamed = dirs.workspace("unnamed");
    std::fs::create_dir_all(lib.join(".git/hooks")).unwrap();
    std::fs::write(lib.join(".git/config"), "[core]\n").unwrap();
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data).sandbox("bwrap"));
    let sid = new_with_roots(&mut bridge, &ws, &[&lib]).unwrap()["sessionId"].as_str().unwrap().to_string();
    let (written, elsewhere, hook, config, envrc) = (
        lib.join("src/a.txt"),
        unnamed.join("x.txt"),
        lib.join(".git/hooks/pre-commit"),
        lib.join(".git/config"),
        lib.join(".envrc"),
    );
    let turn = bridge.prompt(
        &sid,
        &ops(json!([
            ["try-write", written, "a\n"],
            ["try-write", elsewhere, "x\n"],
            ["try-write", hook, "#!/bin/sh\n"],
            ["try-write", config, "[core]\n\thooksPath = /tmp\n"],
            ["try-write", envrc, "export X=1\n"],
        ])),
    );
    assert_eq!(turn.stop_reason(), "end_turn");
    assert_eq!(
        reads(&turn),
        format!(
            "READ {}=written; {}=EROFS; {}=EROFS; {}=EROFS; {}=written",
            written.display(),
            elsewhere.display(),
            hook.display(),
            config.display(),
            envrc.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "a\n");
    assert!(!elsewhere.exists(), "a directory that is not a root of the session was written");
    assert!(!hook.exists(), "a hook was planted in the root");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), "[core]\n");
    // A protected path that did not exist is moved out of the root as it is out of the workspace.
    assert!(std::fs::symlink_metadata(&envrc).is_err(), ".envrc stayed in the root");
    let moved: Vec<String> = notes(&turn).into_iter().filter(|n| n.contains("moved out of your workspace")).collect();
    assert_eq!(moved.len(), 1, "{:?}", notes(&turn));
    assert!(moved[0].contains(&format!("`{}` → ", envrc.display())), "{}", moved[0]);
}

#[test]
fn a_remote_sandbox_does_not_advertise_roots_and_refuses_them() {
    let dirs = TestDirs::new("roots-remote");
    let ws = dirs.workspace("ws");
    let lib = dirs.workspace("lib");
    // Nothing is asked of E2B before a prompt: a key and an address that answers nothing are enough.
    let options = BridgeOptions::new("opencode", &dirs.data)
        .sandbox("e2b")
        .env("E2B_API_KEY", "e2b_0000000000000000000000000000000000000000")
        .env("E2B_API_URL", "http://127.0.0.1:9");
    let mut bridge = Bridge::spawn(options);
    let init = bridge.initialize();
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"].get("additionalDirectories"), None, "{init}");
    let error = new_with_roots(&mut bridge, &ws, &[&lib]).unwrap_err();
    assert_eq!(
        (error.code, error.message.as_str()),
        (-32602, "additionalDirectories: a remote sandbox (e2b) takes one root, the workspace")
    );
    // Without roots the same request is a session.
    assert!(new_with_roots(&mut bridge, &ws, &[]).is_ok());
}

/// A workspace and a root that the editor names through links (a symlinked project folder) work for `agent`: the
/// agent works at the editor's paths and its files land in the real folders.
/// With `in_tmp` the links are in the host's `/tmp`, which the sandbox does not show.
fn through_links(agent: &str, sandbox: &str, in_tmp: bool) {
    let dirs = TestDirs::new(&format!("linked-{agent}-{sandbox}"));
    let (real_ws, real_lib) = (dirs.workspace("real-ws"), dirs.workspace("real-lib"));
    let links = tempfile::Builder::new().prefix("acp-sandbox-links-").tempdir_in("/tmp").unwrap();
    let at = if in_tmp { links.path() } else { dirs.root() };
    let (ws, lib) = (at.join("ws-link"), at.join("lib-link"));
    std::os::unix::fs::symlink(&real_ws, &ws).unwrap();
    std::os::unix::fs::symlink(&real_lib, &lib).unwrap();
    let options = match agent {
        "custom" => BridgeOptions::new("custom", &dirs.data)
            .arg("--agent-command")
            .arg(&fakes_dir().join("acp_agent.py").display().to_string()),
        _ => BridgeOptions::new(agent, &dirs.data),
    };
    let mut bridge = Bridge::start(options.sandbox(sandbox));
    let answer = new_with_roots(&mut bridge, &ws, &[&lib]).unwrap_or_else(|e| bridge.fail(&format!("{e}")));
    let sid = answer["sessionId"].as_str().unwrap().to_string();
    let (in_ws, in_lib) = (ws.join("a.txt"), lib.join("b.txt"));
    if agent == "custom" {
        let script = format!("echo a > {} && echo b > {} && echo $PWD", in_ws.display(), in_lib.display());
        let turn = bridge.prompt(&sid, &format!("SCENARIO:shell:{script}"));
        assert_eq!(turn.stop_reason(), "end_turn", "{:?} {}", turn.result, bridge.stderr());
        let said = text_of(&turn.updates, "agent_message_chunk");
        assert_eq!(said.lines().last(), Some(format!("shell 0 {}", ws.display()).as_str()), "{said}");
    } else if agent == "amp" {
        // The fake Amp writes where it runs and says so; it has no file ops of its own.
        let turn = bridge.prompt(&sid, "SCENARIO:probe");
        assert_eq!(turn.stop_reason(), "end_turn", "{:?} {}", turn.result, bridge.stderr());
        let probe: Value =
            serde_json::from_str(&std::fs::read_to_string(real_ws.join(".fake-cli/probe.json")).unwrap()).unwrap();
        assert_eq!(probe["workspace"]["writable"], json!(true), "{probe}");
        assert_eq!(listed_roots(&mut bridge, &sid), json!([lib]), "shown at the editor's path");
        return;
    } else {
        let turn = bridge.prompt(&sid, &ops(json!([["try-write", in_ws, "a\n"], ["try-write", in_lib, "b\n"]])));
        assert_eq!(turn.stop_reason(), "end_turn", "{:?} {}", turn.result, bridge.stderr());
        assert_eq!(reads(&turn), format!("READ {}=written; {}=written", in_ws.display(), in_lib.display()));
    }
    assert_eq!(std::fs::read_to_string(real_ws.join("a.txt")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(real_lib.join("b.txt")).unwrap(), "b\n");
    assert_eq!(listed_roots(&mut bridge, &sid), json!([lib]), "shown at the editor's path");
}

macro_rules! through_links {
    ($($name:ident: $agent:literal, $sandbox:literal, $in_tmp:literal;)*) => {$(
        #[test]
        fn $name() {
            if $sandbox == "bwrap" && let Err(why) = bwrap_usable() {
                eprintln!("SKIPPED {}: {why}", stringify!($name));
                return;
            }
            through_links($agent, $sandbox, $in_tmp);
        }
    )*};
}

through_links! {
    a_workspace_and_a_root_through_links_work_for_opencode_none: "opencode", "none", false;
    a_workspace_and_a_root_through_links_work_for_opencode_bwrap: "opencode", "bwrap", false;
    a_workspace_and_a_root_through_links_in_tmp_work_for_opencode_bwrap: "opencode", "bwrap", true;
    a_workspace_and_a_root_through_links_work_for_amp_bwrap: "amp", "bwrap", false;
    a_workspace_and_a_root_through_links_work_for_an_acp_agent_none: "custom", "none", false;
    a_workspace_and_a_root_through_links_work_for_an_acp_agent_bwrap: "custom", "bwrap", false;
    a_workspace_and_a_root_through_links_in_tmp_work_for_an_acp_agent_bwrap: "custom", "bwrap", true;
}
