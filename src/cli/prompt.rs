//! `acp-sandbox prompt`: one turn from the terminal, its updates rendered on stdout (or as JSON lines), a status
//! line on stderr while nothing else shows the turn, and the exit codes of a shell command.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acp_sandbox::config::Config;
use acp_sandbox::error::to_acp_error;
use acp_sandbox::session::{Bridge, UpdateSink};
use acp_sandbox::terminal::{Render, stop_reason_words};
use agent_client_protocol::RawJsonRpcMessage;
use agent_client_protocol::v1::schema::{CLIENT_METHOD_NAMES, ContentBlock, SessionNotification, SessionUpdate};
use anyhow::Context;

/// The line on stderr that says a turn is under way while nothing else shows it. Only on a terminal: it is
/// redrawn in place and erased before any output.
struct Status {
    /// Off when stderr is not a terminal, and once the turn is over.
    enabled: AtomicBool,
    agent: &'static str,
    started: Instant,
    state: Mutex<StatusState>,
}

#[derive(Default)]
struct StatusState {
    /// Whether the line is on the screen now.
    shown: bool,
    /// Whether stdout ends a line: the status line never cuts into the agent's text.
    at_line_start: bool,
    /// The tool that runs, if any.
    tool: Option<String>,
}

/// The most characters the status line takes: a wrapped line could not be erased in place.
const STATUS_CHARS: usize = 60;

impl Status {
    fn new(agent: &'static str, enabled: bool) -> Self {
        let state = StatusState { at_line_start: true, ..StatusState::default() };
        Self { enabled: AtomicBool::new(enabled), agent, started: Instant::now(), state: Mutex::new(state) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, StatusState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Draws the line, with the time so far.
    fn draw(&self) {
        let mut state = self.state();
        if !self.enabled.load(Ordering::SeqCst) || !state.at_line_start {
            return;
        }
        let seconds = self.started.elapsed().as_secs();
        let doing = match &state.tool {
            Some(tool) => format!("{}: {tool}", self.agent),
            None => format!("{} is working", self.agent),
        };
        let doing: String = doing.chars().take(STATUS_CHARS).collect();
        eprint!("\r\x1b[2K{doing}… {seconds} s");
        state.shown = true;
    }

    /// Erases the line if it is shown; `update` then records where stdout is and what runs.
    fn clear(&self) {
        let mut state = self.state();
        if state.shown {
            eprint!("\r\x1b[2K");
            state.shown = false;
        }
    }

    fn update(&self, at_line_start: bool, tool: Option<&str>) {
        let mut state = self.state();
        state.at_line_start = at_line_start;
        state.tool = tool.map(str::to_string);
    }

    /// Erases the line for good.
    fn stop(&self) {
        self.clear();
        self.enabled.store(false, Ordering::SeqCst);
    }
}

/// Prints a turn's updates for a person, or as the JSON-RPC notifications an editor gets.
struct PrintSink {
    json: bool,
    render: Mutex<Render>,
    status: Arc<Status>,
}

impl UpdateSink for PrintSink {
    fn send(&self, session_id: &str, update: SessionUpdate) {
        if self.json {
            let notification = SessionNotification::new(session_id.to_string(), update);
            let message = serde_json::to_value(notification).map_err(|e| e.to_string()).and_then(|mut params| {
                // As the editor gets it: a new file's diff says `"oldText": null`.
                acp_sandbox::agents::tools::explicit_new_files(&mut params["update"]);
                RawJsonRpcMessage::notification(CLIENT_METHOD_NAMES.session_update.to_string(), params)
                    .map_err(|e| e.to_string())
            });
            match message.and_then(|message| serde_json::to_string(&message).map_err(|e| e.to_string())) {
                Ok(line) => {
                    self.status.clear();
                    let _ = writeln!(std::io::stdout().lock(), "{line}");
                }
                Err(e) => tracing::warn!("could not print an update as JSON: {e}"),
            }
            return;
        }
        let mut render = self.render.lock().unwrap_or_else(|p| p.into_inner());
        let text = render.update(&update);
        if !text.is_empty() {
            self.status.clear();
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
        self.status.update(render.at_line_start(), render.running_tool());
    }
}

/// The exit status of a command stopped by Ctrl-C, as shells report a process killed by SIGINT.
const INTERRUPTED: u8 = 130;

pub(super) async fn prompt(
    config: Config,
    text: Option<String>,
    json: bool,
    session: Option<String>,
) -> anyhow::Result<ExitCode> {
    let text = match text.as_deref() {
        Some("-") | None => {
            if std::io::stdin().is_terminal() {
                eprintln!("Type the prompt, then Ctrl-D:");
            }
            let mut buffer = String::new();
            std::io::stdin().read_to_string(&mut buffer).context("reading the prompt from stdin")?;
            buffer
        }
        Some(text) => text.to_string(),
    };
    // Refused before anything starts or is stored.
    if text.trim().is_empty() {
        eprintln!("error: the prompt is empty: give it as an argument (acp-sandbox prompt \"…\") or on stdin");
        return Ok(ExitCode::from(2));
    }
    let agent = config.agent.display_name();
    let bridge = Arc::new(Bridge::open(config).await.context("cannot start")?);
    let session_id = match session {
        Some(id) => {
            bridge.resume_session(&id, &Default::default()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
            id
        }
        None => {
            let cwd = std::env::current_dir()?;
            bridge.new_session(&cwd, &Default::default()).await.map_err(|e| anyhow::anyhow!("{e}"))?.0
        }
    };
    let status = Arc::new(Status::new(agent, std::io::stderr().is_terminal()));
    let sink = Arc::new(PrintSink { json, render: Mutex::new(Render::new()), status: status.clone() });
    let interrupted = Arc::new(AtomicBool::new(false));
    // Listening from here on: a Ctrl-C never kills the command before the turn is cancelled.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let signals = {
        let (bridge, session_id, status, interrupted) =
            (bridge.clone(), session_id.clone(), status.clone(), interrupted.clone());
        tokio::spawn(async move {
            // Either signal cancels the turn, which kills the CLI's whole tree before this command exits.
            tokio::select! {
                _ = interrupt.recv() => {
                    interrupted.store(true, Ordering::SeqCst);
                    status.stop();
                    eprintln!("\ncancelling… (Ctrl-C again to quit at once)");
                }
                _ = terminate.recv() => {}
            }
            bridge.cancel(&session_id);
            if interrupt.recv().await.is_some() {
                std::process::exit(i32::from(INTERRUPTED));
            }
        })
    };
    status.draw();
    let ticker = {
        let status = status.clone();
        tokio::spawn(async move {
            let second = Duration::from_secs(1);
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + second, second);
            loop {
                tick.tick().await;
                status.draw();
            }
        })
    };
    let result = bridge.prompt(&session_id, vec![ContentBlock::from(text)], sink.clone()).await;
    ticker.abort();
    status.stop();
    let rest = sink.render.lock().unwrap_or_else(|p| p.into_inner()).finish();
    print!("{rest}");
    let _ = std::io::stdout().flush();
    let code = match result {
        Ok(stop) => {
            eprintln!("{} (session {session_id}: continue with --session {session_id})", stop_reason_words(stop));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {}", to_acp_error(&error).message);
            eprintln!("(session {session_id}: continue with --session {session_id})");
            ExitCode::FAILURE
        }
    };
    signals.abort();
    Ok(if interrupted.load(Ordering::SeqCst) { ExitCode::from(INTERRUPTED) } else { code })
}
