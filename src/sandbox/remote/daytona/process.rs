//! One command in a Daytona sandbox: the shell line that runs it with exactly its environment and the input that
//! carries that environment and its stdin (pure), and the handle that waits for its exit code or ends it.
//!
//! Each command gets a session of its own. Its environment and stdin never touch the sandbox's disk, nor the
//! command line (which the daemon writes to the session's `cmd.sh` and which Daytona may log): both go in one
//! request to the command's input endpoint, which the daemon writes into the command's input pipe (a FIFO, with
//! the echo into the on-disk log suppressed). The command's shell reads the environment's lines from that pipe,
//! then hands the CLI exactly the stdin's bytes and an end of file (the daemon keeps the pipe open for as long as
//! the command runs), from `env -i` with nothing else inherited but the sandbox's own `PATH`.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use super::api::{DaytonaError, Toolbox, is_missing_route};
use crate::sandbox::remote::reaper::{self, REAP_LIMIT};
use crate::sandbox::{ExecSpec, ExitInfo, ProcessHandle, SandboxError};

/// A word for `sh`, single-quoted.
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Whether `name` can be exported by `sh`.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The environment as `sh` lines: one `export NAME='value'` per variable, then `PWD` (which OpenCode reads).
/// Names `sh` cannot export are left out and returned.
pub fn env_exports(env: &[(String, String)], cwd: &Path) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut skipped = Vec::new();
    for (name, value) in env {
        if !valid_name(name) || name == "PWD" {
            if name != "PWD" {
                skipped.push(name.clone());
            }
            continue;
        }
        text.push_str(&format!("export {name}={}\n", quote(value)));
    }
    text.push_str(&format!("export PWD={}\n", quote(&cwd.display().to_string())));
    (text, skipped)
}

/// What the command's input pipe gets: the environment's lines, then the stdin (text: the input endpoint takes a
/// JSON string). Also how many lines the environment is and how many bytes the stdin.
pub fn input(exports: &str, stdin: &[u8]) -> Result<(String, usize, usize), String> {
    let stdin = std::str::from_utf8(stdin).map_err(|_| "a Daytona command's stdin must be UTF-8 text".to_string())?;
    let lines = exports.bytes().filter(|b| *b == b'\n').count();
    Ok((format!("{exports}{stdin}"), lines, stdin.len()))
}

/// Drops what must never reach a sandbox: Daytona's own variables and any value that is the API key.
pub fn scrub_env(env: Vec<(String, String)>, api_key: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut dropped = Vec::new();
    let kept = env
        .into_iter()
        .filter(|(name, value)| {
            let secret = name.starts_with("DAYTONA_") || (!api_key.is_empty() && value.contains(api_key));
            if secret {
                dropped.push(name.clone());
            }
            !secret
        })
        .collect();
    (kept, dropped)
}

/// The line the session runs: a clean `sh` reads `lines` lines of exports from its stdin (the input pipe; `read`
/// takes one byte at a time from a pipe, so nothing after them is consumed), evaluates them, enters the working
/// directory and runs the program with the next `stdin_len` bytes as its whole stdin (none: `/dev/null`; `None`: the
/// rest of the input pipe, for as long as it runs, as an ACP agent talks). The line holds names and paths only, never
/// a value.
pub fn command_line(spec: &ExecSpec, lines: usize, stdin_len: Option<usize>) -> String {
    let script = concat!(
        r#"n=$1; e=; while [ "$n" -gt 0 ]; do IFS= read -r l || exit 125; e="$e$l"#,
        "\n",
        r#""; n=$((n-1)); done; c=$2; d=$3; shift 3; eval "$e" && cd -- "$d" || exit 125; "#,
        r#"if [ "$c" = - ]; then exec "$@"; fi; "#,
        r#"if [ "$c" -eq 0 ]; then exec "$@" < /dev/null; fi; command -p head -c "$c" | "$@""#
    );
    let mut words = vec![
        "env".to_string(),
        "-i".to_string(),
        // The sandbox's own PATH (its image's, as E2B's envd gives every process): where its Node.js and npm are.
        // The daemon's shell expands it; an exported PATH of the command's own replaces it.
        r#""PATH=$PATH""#.to_string(),
        "/bin/sh".to_string(),
        "-c".to_string(),
        quote(script),
        "acp-sandbox".to_string(),
        lines.to_string(),
        stdin_len.map_or_else(|| "-".to_string(), |len| len.to_string()),
        quote(&spec.cwd.display().to_string()),
        quote(&spec.program.display().to_string()),
    ];
    words.extend(spec.args.iter().map(|a| quote(a)));
    words.join(" ")
}

/// Whether the daemon of this version suppresses the echo of a command's input into its on-disk log
/// (`suppressInputEcho`, daemon 0.144 on). A version that cannot be read, and a development build's `0.0.0`, count
/// as new, as the daemon itself treats such SDK versions.
pub fn suppresses_input_echo(daemon_version: Option<&str>) -> bool {
    let Some(version) = daemon_version else { return true };
    let core = version.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next().unwrap_or_default();
    let parts: Option<Vec<u64>> = core.split('.').map(|p| p.parse().ok()).collect();
    match parts.as_deref() {
        // `v0.0.0-dev` is how a development build of the daemon names itself.
        Some([0, 0, 0]) => true,
        Some([major, minor, ..]) => (*major, *minor) >= (0, 144),
        _ => true,
    }
}

/// Sends the command's input, retrying while its pipe does not exist yet: the daemon makes it only when the
/// session's shell starts the command, after `exec` answered (until then the endpoint answers 500 saying it could
/// not open the pipe; any other failure may have written part of the input, so it is not sent again).
pub async fn send_input(toolbox: &Toolbox, session: &str, command: &str, data: &str) -> Result<(), DaytonaError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut pause = Duration::from_millis(10);
    loop {
        match toolbox.send_input(session, command, data).await {
            Err(DaytonaError::Api { status: 500, message, .. })
                if message.starts_with("failed to open input pipe") && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(250));
            }
            other => return other,
        }
    }
}

/// A stdin open for as long as the command runs (an ACP agent's), through the command's input pipe: whole lines
/// only, since the daemon ends a piece of input without a newline with one, and all the lines a read brought in one
/// request. The daemon holds the pipe open while the command runs; dropping this sends nothing more.
pub fn interactive_stdin(
    toolbox: Toolbox,
    session: String,
    command: String,
) -> std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>> {
    let (writer, mut reader) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut pending: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            let Some(end) = pending.iter().rposition(|b| *b == b'\n') else { continue };
            let lines: Vec<u8> = pending.drain(..=end).collect();
            let data = String::from_utf8_lossy(&lines).into_owned();
            if let Err(e) = send_input(&toolbox, &session, &command, &data).await {
                tracing::warn!(daytona_session = %session, "could not write the command's stdin: {e}");
                return;
            }
        }
    });
    Box::pin(writer)
}

/// Deletes a command's session when dropped armed: a command that failed to start, or whose start was given up.
pub struct SessionGuard {
    toolbox: Toolbox,
    session: String,
    armed: bool,
}

impl SessionGuard {
    pub fn new(toolbox: Toolbox, session: String) -> Self {
        SessionGuard { toolbox, session, armed: true }
    }

    /// The command started: its handle ends it from now on.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (toolbox, session) = (self.toolbox.clone(), std::mem::take(&mut self.session));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = toolbox.delete_session(&session).await
                    && !e.is_not_found()
                {
                    tracing::warn!(daytona_session = %session, "could not delete the session of a command that did not start: {e}");
                }
            });
        }
    }
}

/// Runs the reaper (`sandbox::remote::reaper`) in a session of its own, which the daemon's shell starts without any mark:
/// ends every process whose environment matches `kill` and not `spare`, and answers how many it ended.
pub async fn reap(toolbox: &Toolbox, kill: &str, spare: Option<&str>) -> Result<usize, DaytonaError> {
    let spec = reaper::reaper_spec(kill, spare);
    let line = std::iter::once(spec.program.display().to_string())
        .chain(spec.args)
        .map(|word| quote(&word))
        .collect::<Vec<_>>()
        .join(" ");
    // Not `acp-…`: a reaper is never taken for a command another bridge left.
    let session = format!("reaper-{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
    toolbox.create_session(&session).await?;
    let finished = toolbox.execute_sync(&session, &line).await;
    if let Err(e) = toolbox.delete_session(&session).await
        && !e.is_not_found()
    {
        tracing::debug!(daytona_session = %session, "could not delete the reaper's session: {e}");
    }
    let finished = finished?;
    match finished.exit_code {
        Some(0) => Ok(reaper::reaped(finished.stdout.as_deref().unwrap_or_default())),
        code => Err(DaytonaError::Stream(format!("the reaper ended with exit code {code:?}"))),
    }
}

/// Ends the processes carrying a command's mark (what it started), logging what could not be done.
pub async fn end_marked(toolbox: &Toolbox, session: &str, mark: &str) {
    match tokio::time::timeout(REAP_LIMIT, reap(toolbox, mark, None)).await {
        Ok(Ok(0)) => {}
        Ok(Ok(ended)) => tracing::debug!(daytona_session = %session, ended, "ended what the command left running"),
        Ok(Err(e)) => tracing::warn!(daytona_session = %session, "could not end what the command left running: {e}"),
        Err(_) => tracing::warn!(daytona_session = %session, "ending what the command left running took too long"),
    }
}

/// Why no exit code came.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unfinished {
    /// The sandbox went meanwhile (deleted or stopped by someone else).
    Gone,
    /// Asking failed.
    Failed(String),
}

/// How a command ended, as the log task found out.
pub type Outcome = Result<Option<i32>, Unfinished>;

/// Waits for a command's exit code: polled, first often, then once a second; `None` when its session is gone,
/// [`Unfinished::Gone`] when the sandbox is (the control plane says so).
pub async fn exit_code(toolbox: &Toolbox, session: &str, command: &str) -> Outcome {
    let mut pause = Duration::from_millis(25);
    let mut failures = 0;
    loop {
        match toolbox.command(session, command).await {
            Ok(info) if info.exit_code.is_some() => return Ok(info.exit_code),
            Ok(_) => failures = 0,
            Err(e) if e.is_not_found() => {
                return if toolbox.still_started().await { Ok(None) } else { Err(Unfinished::Gone) };
            }
            Err(e) => {
                failures += 1;
                if failures >= 5 {
                    return Err(if toolbox.still_started().await {
                        Unfinished::Failed(e.to_string())
                    } else {
                        Unfinished::Gone
                    });
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Control over a command running in a Daytona session.
pub struct DaytonaProcess {
    pub(crate) toolbox: Toolbox,
    pub(crate) session: String,
    pub(crate) command: String,
    /// The pattern of the command's mark: what it started ends with it.
    pub(crate) mark: String,
    pub(crate) outcome: watch::Receiver<Option<Outcome>>,
    pub(crate) killed: bool,
    pub(crate) exited: Option<ExitInfo>,
}

impl DaytonaProcess {
    /// Deletes the command's session (whatever it left running goes with it), off the caller's path.
    fn clean_up(&self) {
        let (toolbox, session) = (self.toolbox.clone(), self.session.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = toolbox.delete_session(&session).await
                    && !e.is_not_found()
                {
                    tracing::debug!(session = %session, "could not delete the command's session: {e}");
                }
            });
        }
    }
}

/// How a command ended, from its exit code (`None`: its session went) and whether we killed it.
pub fn exit_info(code: Option<i32>, killed: bool) -> ExitInfo {
    if killed { ExitInfo { code: None, signal: Some(libc::SIGKILL) } } else { ExitInfo { code, signal: None } }
}

#[async_trait]
impl ProcessHandle for DaytonaProcess {
    async fn kill(&mut self) {
        if self.exited.is_some() || self.killed {
            return;
        }
        self.killed = true;
        // SIGKILL to the command's process group; a daemon without `terminate` ends the whole session instead.
        // Neither may hold up a cancel for long.
        let quick = Duration::from_secs(5);
        let terminated = tokio::time::timeout(quick, self.toolbox.terminate(&self.session, &self.command)).await;
        match terminated {
            Ok(Ok(())) => {}
            failed => {
                if let Ok(Err(e)) = &failed
                    && !is_missing_route(e)
                {
                    tracing::debug!(session = %self.session, "terminate failed ({e}); deleting the session");
                }
                match tokio::time::timeout(quick, self.toolbox.delete_session(&self.session)).await {
                    Ok(Err(e)) if !e.is_not_found() => {
                        tracing::warn!(session = %self.session, "could not end the command: {e}")
                    }
                    Err(_) => tracing::warn!(session = %self.session, "ending the command timed out"),
                    _ => {}
                }
            }
        }
        // Neither reaches what the command started in a session of its own (or double-forked): its mark does.
        end_marked(&self.toolbox, &self.session, &self.mark).await;
    }

    async fn wait(&mut self) -> Result<ExitInfo, SandboxError> {
        if let Some(exit) = self.exited {
            return Ok(exit);
        }
        if self.killed {
            // Killed: how it ended is known. The daemon closes a followed log only about a second after the exit
            // code exists; the log task ends by itself meanwhile, the cancel does not wait for it.
            let exit = exit_info(None, true);
            self.exited = Some(exit);
            self.clean_up();
            return Ok(exit);
        }
        let outcome = match self.outcome.wait_for(Option::is_some).await {
            Ok(outcome) => outcome.clone(),
            Err(_) => Some(Err(Unfinished::Failed("the log task ended without an outcome".to_string()))),
        };
        let code = match outcome {
            Some(Ok(code)) => code,
            Some(Err(Unfinished::Gone)) if !self.killed => {
                return Err(DaytonaError::Gone { id: self.toolbox.sandbox().to_string() }.into());
            }
            Some(Err(Unfinished::Failed(e))) if !self.killed => return Err(DaytonaError::Stream(e).into()),
            _ => None,
        };
        let exit = exit_info(code, self.killed);
        // A turn's processes end with it, as in a local sandbox: daemons and `setsid` children of the command too,
        // before `wait` answers (a kill ended them already).
        if !self.killed {
            end_marked(&self.toolbox, &self.session, &self.mark).await;
        }
        self.exited = Some(exit);
        self.clean_up();
        Ok(exit)
    }
}

impl Drop for DaytonaProcess {
    fn drop(&mut self) {
        if self.exited.is_none() {
            // Dropped while running: nothing may outlive the turn.
            let (toolbox, session, command) = (self.toolbox.clone(), self.session.clone(), self.command.clone());
            let mark = self.mark.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = toolbox.terminate(&session, &command).await;
                    let _ = toolbox.delete_session(&session).await;
                    end_marked(&toolbox, &session, &mark).await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::path::PathBuf;

    #[test]
    fn words_are_quoted_for_sh() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's $HOME `x`"), r"'it'\''s $HOME `x`'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn the_environment_is_exported_exactly_as_the_spec_says() {
        let env = vec![
            ("PATH".to_string(), "/usr/bin:/bin".to_string()),
            ("OPENAI_API_KEY".to_string(), "sk-'x'\nsecond".to_string()),
            ("BAD-NAME".to_string(), "v".to_string()),
            ("PWD".to_string(), "/elsewhere".to_string()),
        ];
        let (text, skipped) = env_exports(&env, Path::new("/home/daytona/workspace"));
        assert_eq!(
            text,
            "export PATH='/usr/bin:/bin'\nexport OPENAI_API_KEY='sk-'\\''x'\\''\nsecond'\nexport PWD='/home/daytona/workspace'\n"
        );
        assert_eq!(skipped, vec!["BAD-NAME".to_string()]);
        // A value's own newline is one more line for the shell to read.
        assert_eq!(input(&text, b"the prompt\n").unwrap(), (format!("{text}the prompt\n"), 4, 11));
        assert_eq!(input("x\n", "é".as_bytes()).unwrap(), ("x\né".to_string(), 1, 2));
        assert_eq!(input("x\n", b"\xff").unwrap_err(), "a Daytona command's stdin must be UTF-8 text");
    }

    #[test]
    fn only_daemons_that_suppress_the_echo_get_secrets() {
        for new in [None, Some("v0.190.0"), Some("0.144.0"), Some("v0.226.1-rc1"), Some("fake"), Some("v0.0.0-dev")] {
            assert!(suppresses_input_echo(new), "{new:?}");
        }
        for old in ["v0.143.9", "0.138.0", "v0.100"] {
            assert!(!suppresses_input_echo(Some(old)), "{old}");
        }
    }

    #[test]
    fn daytona_secrets_never_reach_the_command() {
        let env = vec![
            ("DAYTONA_API_KEY".to_string(), "dtn_1".to_string()),
            ("DAYTONA_API_URL".to_string(), "https://x".to_string()),
            ("SNEAKY".to_string(), "prefix-dtn_1".to_string()),
            ("HOME".to_string(), "/home/daytona".to_string()),
        ];
        let (kept, dropped) = scrub_env(env, "dtn_1");
        assert_eq!(kept, vec![("HOME".to_string(), "/home/daytona".to_string())]);
        assert_eq!(dropped, vec!["DAYTONA_API_KEY", "DAYTONA_API_URL", "SNEAKY"]);
    }

    #[test]
    fn the_command_line_carries_no_values() {
        let spec = ExecSpec {
            program: PathBuf::from("opencode"),
            args: vec!["run".into(), "it's".into()],
            env: vec![("SECRET".into(), "value".into())],
            cwd: PathBuf::from("/home/daytona/workspace"),
            ..ExecSpec::default()
        };
        assert_eq!(
            command_line(&spec, 3, Some(42)),
            r#"env -i "PATH=$PATH" /bin/sh -c 'n=$1; e=; while [ "$n" -gt 0 ]; do IFS= read -r l || exit 125; e="$e$l
"; n=$((n-1)); done; c=$2; d=$3; shift 3; eval "$e" && cd -- "$d" || exit 125; if [ "$c" = - ]; then exec "$@"; fi; if [ "$c" -eq 0 ]; then exec "$@" < /dev/null; fi; command -p head -c "$c" | "$@"' acp-sandbox 3 42 '/home/daytona/workspace' 'opencode' 'run' 'it'\''s'"#
        );
        // An ACP agent keeps the input pipe for its life.
        assert_eq!(
            command_line(&spec, 3, None),
            command_line(&spec, 3, Some(42)).replace(" acp-sandbox 3 42 ", " acp-sandbox 3 - ")
        );
    }

    #[test]
    fn a_killed_command_reports_the_signal() {
        assert_eq!(exit_info(Some(137), true), ExitInfo { code: None, signal: Some(9) });
        assert_eq!(exit_info(Some(3), false), ExitInfo { code: Some(3), signal: None });
        assert_eq!(exit_info(None, false), ExitInfo { code: None, signal: None });
    }
}
