//! The process engine: one run of the agent's CLI per prompt (Amp, `opencode run`), its stdout line by line, its
//! exit status and stderr for the outcome.

use std::collections::VecDeque;
use std::time::Duration;

use agent_client_protocol::v1::schema::StopReason;

use crate::agents::engine::{Attempt, Ended, Seen, Step, Stop, TurnEngine, ended, sleep_until_or_never, stopped};
use crate::agents::{AgentKind, TurnEnd};
use crate::error::Error;
use crate::lines::{BoundedLines, Line, stderr_tail, strip_ansi};
use crate::sandbox::{ExitInfo, OutputStream, ProcessHandle, RunningProcess};

/// The longest line of a CLI's output that is kept whole; the rest of a longer one is read and dropped.
pub(super) const LINE_LIMIT: usize = 16 * 1024 * 1024;

/// How long what a cancelled CLI printed before it died is still read.
const CANCEL_DRAIN: Duration = Duration::from_millis(300);

/// How long output is still read after the CLI exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// One CLI process of a turn.
pub(super) struct ProcessEngine {
    agent: AgentKind,
    /// The session, for the log.
    session: String,
    handle: Box<dyn ProcessHandle>,
    reader: BoundedLines<OutputStream>,
    stderr: tokio::task::JoinHandle<String>,
    /// The CLI's exit, once it exited.
    exited: Option<ExitInfo>,
    /// After the CLI exits, what it printed is read for a moment more; a descendant that still holds the pipe
    /// does not hold the turn.
    drain_until: Option<tokio::time::Instant>,
    /// Why the loop stops the CLI, once it does.
    stopping: Option<Stop>,
    killed: bool,
    /// After a cancel, what the CLI printed before it died is read until then.
    cancel_drain_until: Option<tokio::time::Instant>,
    /// Steps that came with one read (a note before its line).
    pending: VecDeque<Step>,
    told_cut: bool,
    /// The turn continues a conversation of the CLI.
    continuing: bool,
    idle: Duration,
    turn_timeout: Duration,
}

impl ProcessEngine {
    /// The engine of a started CLI, whose stderr is collected from now on.
    pub(super) fn new(
        agent: AgentKind,
        session: &str,
        mut process: RunningProcess,
        continuing: bool,
        config: &crate::config::Config,
    ) -> Self {
        let stderr = tokio::spawn(stderr_tail(std::mem::replace(&mut process.stderr, Box::pin(tokio::io::empty()))));
        Self {
            agent,
            session: session.to_string(),
            handle: process.handle,
            reader: BoundedLines::new(process.stdout, LINE_LIMIT),
            stderr,
            exited: None,
            drain_until: None,
            stopping: None,
            killed: false,
            cancel_drain_until: None,
            pending: VecDeque::new(),
            told_cut: false,
            continuing,
            idle: config.idle_timeout,
            turn_timeout: config.turn_timeout,
        }
    }

    /// The step of one line read, with a note first when it was cut.
    fn line(&mut self, line: Line) -> Step {
        let step = Step::Line { text: line_text(line.bytes), alive: true };
        if line.cut && !self.told_cut {
            self.told_cut = true;
            tracing::warn!(session = %self.session, "a line of the CLI's output was longer than {LINE_LIMIT} bytes; cut");
            self.pending.push_back(step);
            return Step::Note(format!(
                "_A line of {}'s output was longer than {} MiB; it was cut there._",
                self.agent.display_name(),
                LINE_LIMIT / (1024 * 1024)
            ));
        }
        step
    }

    /// Waits for the CLI's exit (cancel-safe: the loop's bounds still hold while it is waited for).
    async fn exit(&mut self) -> Step {
        if self.exited.is_none() {
            match self.handle.wait().await {
                Ok(exit) => self.exited = Some(exit),
                Err(e) => return Step::Ended(Ended::Failed(e.into())),
            }
        }
        Step::Ended(Ended::Done)
    }
}

#[async_trait::async_trait]
impl TurnEngine for ProcessEngine {
    async fn next(&mut self) -> Step {
        if let Some(step) = self.pending.pop_front() {
            return step;
        }
        if let Some(why) = &self.stopping {
            if !self.killed {
                let cancelled = *why == Stop::Cancelled;
                self.handle.kill().await;
                self.killed = true;
                // What the CLI printed before it was stopped (its conversation id above all) may still be in the
                // pipe: a cancel that won the race against it must not lose it, or the next prompt would start a new
                // conversation. The CLI is dead, so the pipe ends at once; the bound covers a descendant holding it.
                if cancelled {
                    self.cancel_drain_until = Some(tokio::time::Instant::now() + CANCEL_DRAIN);
                }
            }
            if let Some(until) = self.cancel_drain_until {
                match tokio::time::timeout_at(until, self.reader.next_line()).await {
                    Ok(Ok(Some(line))) => return Step::Line { text: line_text(line.bytes), alive: false },
                    _ => self.cancel_drain_until = None,
                }
            }
            return self.exit().await;
        }
        loop {
            tokio::select! {
                biased;
                exit = self.handle.wait(), if self.exited.is_none() => match exit {
                    Ok(exit) => {
                        self.exited = Some(exit);
                        self.drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
                    }
                    Err(e) => return Step::Ended(Ended::Failed(e.into())),
                },
                _ = sleep_until_or_never(self.drain_until) => break,
                // Cancel-safe: a read interrupted by another branch keeps what it had read in `reader`.
                read = self.reader.next_line() => match read {
                    Ok(None) => break,
                    Ok(Some(line)) => return self.line(line),
                    Err(e) => {
                        tracing::warn!(session = %self.session, "reading the CLI's output failed: {e}");
                        break;
                    }
                },
            }
        }
        // The CLI closed its stdout but may still run: it gets the same bounds as while it printed.
        self.exit().await
    }

    fn ready(&mut self) -> Option<Step> {
        if let Some(step) = self.pending.pop_front() {
            return Some(step);
        }
        if self.stopping.is_some() {
            return None;
        }
        let line = self.reader.buffered_line()?;
        Some(self.line(line))
    }

    fn stop(&mut self, why: &Stop) {
        self.stopping = Some(why.clone());
    }

    fn limit_hit(&self) -> Option<String> {
        self.handle.limit_hit()
    }

    fn idle(&mut self, _stopping: bool) -> bool {
        // A CLI run per turn says its turn is over by closing its stdout.
        false
    }

    async fn abandon(&mut self) {
        self.handle.kill().await;
        let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, self.handle.wait()).await;
        self.stderr.abort();
    }

    async fn conclude(mut self: Box<Self>, seen: Seen, name: &'static str) -> Attempt {
        let exit = self.exited.unwrap_or(ExitInfo { code: None, signal: None });
        // Every process of the turn is gone by now, so stderr ends; the bound covers what is not ours to kill.
        let stderr = match tokio::time::timeout(DRAIN_AFTER_EXIT, &mut self.stderr).await {
            Ok(tail) => tail.unwrap_or_default(),
            Err(_) => {
                self.stderr.abort();
                String::new()
            }
        };
        let limit_hit = self.handle.limit_hit();
        tracing::debug!(session = %self.session, exit = %exit.describe(), "the CLI exited");
        let failure = |message: String| Error::CliFailed { message, stderr_tail: stderr.clone(), exit_code: exit.code };
        if let Some(result) = stopped(&seen.stop, name, self.idle, self.turn_timeout, failure) {
            return Attempt::Finished(result);
        }
        let result = match (seen.end, limit_hit) {
            (_, Some(limit)) if !exit.success() => {
                Err(failure(format!("{name} failed ({}): {limit}", exit.describe())))
            }
            _ if self.continuing && !exit.success() && !seen.updates && self.agent.session_missing(&stderr) => {
                return Attempt::ConversationMissing;
            }
            (Some(TurnEnd::EndTurn), _) if !exit.success() => {
                Err(failure(format!("{name} finished its answer but then exited with {}", exit.describe())))
            }
            (Some(end), _) => ended(end, failure),
            (None, _) if exit.success() => Ok(StopReason::EndTurn),
            (None, _) => Err(failure(crash_message(name, &exit.describe(), &stderr, &seen.unparsed))),
        };
        Attempt::Finished(result)
    }
}

/// A line's text without its line ending, lossy where it is not UTF-8 (and not copied where it is).
fn line_text(bytes: Vec<u8>) -> String {
    let mut text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    let end = text.trim_end_matches(['\n', '\r']).len();
    text.truncate(end);
    text
}

/// The message of a CLI that died without saying why in its stream: its own `Error:` line if it printed
/// one, otherwise how it exited.
pub(super) fn crash_message(name: &str, exit: &str, stderr: &str, unparsed: &VecDeque<String>) -> String {
    // `Error: …`, also behind a prefix such as the sandbox's own `acp-sandbox sandbox-init: Error: …`.
    let said = stderr.lines().rev().map(|line| strip_ansi(line.trim())).find_map(|line| {
        line.find("Error").filter(|&at| at == 0 || line[..at].ends_with(": ")).map(|at| line[at..].to_string())
    });
    match said {
        Some(line) => format!("{name} failed ({exit}): {line}"),
        None if !unparsed.is_empty() => {
            format!(
                "{name} exited with {exit}; its last output was: {}",
                unparsed.back().map(String::as_str).unwrap_or("")
            )
        }
        None => format!("{name} exited with {exit} before finishing the turn"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_message_prefers_the_clis_own_error_line() {
        let stderr = "booting\n\u{1b}[91mError: Session not found\u{1b}[0m\n";
        assert_eq!(
            crash_message("OpenCode", "exit code 1", stderr, &VecDeque::new()),
            "OpenCode failed (exit code 1): Error: Session not found"
        );
        assert_eq!(
            crash_message("Amp", "signal 9", "", &VecDeque::new()),
            "Amp exited with signal 9 before finishing the turn"
        );
    }

    #[test]
    fn a_lines_text_is_lossy_and_without_its_ending() {
        assert_eq!(line_text(b"a\xffb\r\n".to_vec()), "a\u{fffd}b");
    }
}
