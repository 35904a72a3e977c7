//! A command's secrets against the fake Daytona: its environment and stdin travel in the command's input (the
//! daemon's input pipe) and never reach a file of the sandbox or the command line, which the daemon writes to disk.

use super::*;
use pretty_assertions::assert_eq;

/// What the fake's daemon side wrote in its sandboxes (`--record-files`): `(path, data)`.
fn written(dir: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(dir.join("files.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).unwrap();
            (record["path"].as_str().unwrap().to_string(), record["data"].as_str().unwrap().to_string())
        })
        .collect()
}

/// Every file below `dir` with its bytes.
fn files_below(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if let Ok(bytes) = std::fs::read(&path) {
            found.push((path, bytes));
        }
    }
    found
}

const SECRET: &str = "sk-agent-secret-value-0123";

#[tokio::test]
async fn a_commands_environment_and_stdin_reach_it_through_its_input_and_never_the_disk() {
    through_its_input("secrets", &[]).await;
}

/// A session shell that starts the command late (a busy sandbox): the input sent before its pipe exists is refused
/// without a byte taken (500 "failed to open input pipe") and sent again until the pipe takes it, once.
#[tokio::test]
async fn input_sent_before_the_commands_pipe_exists_is_sent_again_and_taken_once() {
    let sent = through_its_input("secrets-late", &["--command-start-delay", "0.5"]).await;
    assert!(sent >= 2, "the input was sent {sent} time(s): the pipe cannot have existed before 0.5 s");
}

/// Runs a command with a secret in its environment and a large stdin; checks that both reached it exactly once,
/// through its input only, and never a file; returns how many times the input was sent (refused ones included).
async fn through_its_input(name: &str, flags: &[&str]) -> usize {
    let dir = test_dir(name);
    let record_files = dir.join("files.jsonl").display().to_string();
    let fake = FakeDaytona::start_with(&dir, &[&["--record-files", record_files.as_str()], flags].concat());
    let session = format!("s-{name}");
    let (_provider, id, sandbox) = created(&fake, &session).await;
    // The command proves it has the key without printing it (its output is a file on the daemon's side too): the
    // key upper-cased, and the size and last line of its stdin, which is larger than a pipe's buffer and ends
    // without a newline; it must also see the end of its stdin, or it would never finish.
    let stdin: String = (0..3000).map(|i| format!("line {i} of the prompt\n")).collect::<String>() + "the end";
    let script = r#"printf '%s\n' "$(printf %s "$AGENT_KEY" | tr a-z A-Z)"; wc -c | tr -d ' '; pwd"#;
    let mut exec = shell(sandbox.as_ref(), script, &[("AGENT_KEY", SECRET)]);
    exec.stdin = stdin.clone().into_bytes();
    let RunningProcess { mut stdout, mut stderr, mut handle, .. } = sandbox.exec(exec).await.unwrap();
    let workspace = sandbox.workspace().display().to_string();
    assert_eq!(read_all(&mut stdout).await, format!("{}\n{}\n{workspace}\n", SECRET.to_uppercase(), stdin.len()));
    assert_eq!(read_all(&mut stderr).await, "");
    assert_eq!(within("the exit", handle.wait()).await.unwrap(), ExitInfo { code: Some(0), signal: None });

    // Nothing the daemon wrote (uploads, the command's file, its log) ever held the key, nor does any file left.
    let writes = written(&dir);
    assert!(writes.iter().any(|(path, _)| path.ends_with("/cmd.sh")), "{writes:?}");
    assert!(writes.iter().any(|(path, _)| path.ends_with("/output.log")), "{writes:?}");
    for (path, data) in &writes {
        assert!(!data.contains(SECRET), "the key was written to {path}");
        assert!(!data.contains("line 2999 of the prompt"), "the stdin was written to {path}");
    }
    for (path, bytes) in files_below(&fake.root.join(&id)) {
        assert!(!String::from_utf8_lossy(&bytes).contains(SECRET), "the key is in {}", path.display());
    }
    // In the requests, the key is in one body only: the command's input, which holds the exports and the stdin;
    // sent again, the same, only while the daemon refused it because the command's pipe did not exist yet
    // (`send_input`): the command read it once (its output above counts the stdin's bytes exactly).
    let requests = fake.requests();
    let holding: Vec<&Value> = requests.iter().filter(|r| r.to_string().contains(SECRET)).collect();
    assert!(!holding.is_empty());
    for again in &holding[1..] {
        assert_eq!(*again, holding[0], "the key went in another request than the command's input");
    }
    let input = holding[0];
    assert_eq!(input["method"], "POST");
    assert!(input["path"].as_str().unwrap().ends_with("/input"), "{input}");
    let data = input["body"]["data"].as_str().unwrap();
    // The command's mark is its toolbox session's name (`acp-<session>-<bridge instance>-<run>`).
    let session = input["path"].as_str().unwrap().split('/').nth_back(3).unwrap();
    let prefix = format!("acp-s-{name}-");
    assert!(session.starts_with(&prefix) && session.len() == prefix.len() + 17, "{session}");
    assert_eq!(
        data,
        format!(
            "export PATH='/usr/local/bin:/usr/bin:/bin'\nexport AGENT_KEY='{SECRET}'\nexport \
             ACP_SANDBOX_RUN='{session}'\nexport PWD='{workspace}'\n{stdin}"
        )
    );
    // The command line (which the daemon keeps in cmd.sh) names no value, and asks for the echo to be suppressed.
    let exec = requests.iter().find(|r| r["path"].as_str().unwrap().ends_with("/exec")).unwrap();
    assert_eq!(exec["body"]["suppressInputEcho"], json!(true));
    assert_eq!(exec["body"]["runAsync"], json!(true));
    let line = exec["body"]["command"].as_str().unwrap();
    assert!(
        line.ends_with(&format!(
            " acp-sandbox 4 {} '{workspace}' '/bin/sh' '-c' '{}'",
            stdin.len(),
            script.replace('\'', r"'\''")
        )),
        "{line}"
    );
    holding.len()
}

#[tokio::test]
async fn a_daemon_that_would_echo_the_input_to_its_disk_runs_no_command() {
    let dir = test_dir("old-daemon");
    let fake = FakeDaytona::start_with(&dir, &["--daemon-version", "v0.143.2"]);
    let (_provider, id, sandbox) = created(&fake, "s-old").await;
    let error = sandbox.exec(shell(sandbox.as_ref(), "true", &[("AGENT_KEY", SECRET)])).await.err().unwrap();
    assert_eq!(
        error.to_string(),
        format!(
            "sandbox unavailable: the Daytona sandbox {id} runs daemon v0.143.2, which writes a command's input to \
             its disk; acp-sandbox needs daemon 0.144 or later (a newer snapshot)"
        )
    );
    assert!(!fake.requests().iter().any(|r| r["path"].as_str().unwrap().contains("/process/session")));
}

#[tokio::test]
async fn remote_files_are_written_and_read_and_a_missing_one_is_none() {
    let dir = test_dir("remote-files");
    let fake = FakeDaytona::start(&dir);
    let (provider, id, sandbox) = created(&fake, "s-files").await;
    let files = sandbox.remote_files().expect("a Daytona sandbox offers its files");
    let path = sandbox.workspace().join("src/deep/new.txt");
    files.write(&path, b"from the editor\n").await.unwrap();
    assert_eq!(
        std::fs::read(fake.root.join(&id).join("home/workspace/src/deep/new.txt")).unwrap(),
        b"from the editor\n"
    );
    assert_eq!(files.read(&path).await.unwrap().as_deref(), Some(b"from the editor\n".as_slice()));
    assert_eq!(files.read(&sandbox.workspace().join("no/such/file")).await.unwrap(), None);
    // A sandbox that is gone is an error, never a missing file (which would read as the agent's deletion).
    provider.destroy(&id).await.unwrap();
    let error = files.read(&path).await.unwrap_err();
    assert!(matches!(error, SandboxError::Remote { failure: RemoteFailure::NotFound, .. }), "{error:?}");
}
