//! The ACP agent's `terminal/*`, run inside the session's sandbox (never on the host, where the editor's terminals
//! would run them): each command shares the agent's sandbox settings, its output is kept within the agent's limit,
//! and a tool call that shows the terminal shows its output instead, live, since the editor has no such terminal.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    CreateTerminalRequest, SessionUpdate, TerminalExitStatus, TerminalOutputResponse, ToolCallContent, ToolCallId,
    ToolCallUpdate, ToolCallUpdateFields,
};
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::files::{check, check_resolved};
use super::route::{Event, Route, sender};
use crate::sandbox::{ExecSpec, ExitInfo, OutputStream, ProcessHandle, Sandbox};

/// The output a terminal keeps when the agent names no limit.
const DEFAULT_KEPT: usize = 1 << 20;

/// The most output a terminal keeps, whatever the agent asks.
const MOST_KEPT: usize = 16 << 20;

/// How many of its terminals may exist at once (released ones do not count).
const AT_ONCE: usize = 16;

/// How often a tool call that shows a running terminal is updated at most.
const SHOW_EVERY: Duration = Duration::from_millis(250);

/// The agent's terminals.
pub struct Terminals {
    sandbox: Arc<dyn Sandbox>,
    /// The agent's command, whose sandbox settings (and network) the terminals share.
    template: ExecSpec,
    /// The workspace and its other roots, as the agent sees them: a terminal's folder is one of them.
    roots: Vec<PathBuf>,
    route: Route,
    live: Live,
    next: AtomicU64,
    /// The agent's current turn (counted from 1): each terminal belongs to the one it was made in.
    turn: AtomicU64,
}

/// The terminals not yet released, by id (shared with the tasks that show them).
type Live = Arc<Mutex<HashMap<String, Arc<Terminal>>>>;

/// One command the agent started.
struct Terminal {
    id: String,
    session: String,
    /// The turn it was made in.
    turn: u64,
    output: Mutex<Kept>,
    exit: watch::Sender<Option<TerminalExitStatus>>,
    /// Ends the command (a kill, a release, the agent's end).
    kill: CancellationToken,
    /// New output, or its end.
    changed: Notify,
    /// The tool call that shows it, with its content as the agent gave it.
    shown: Mutex<Option<(ToolCallId, Vec<ToolCallContent>)>>,
}

/// The end of a terminal's output, within its limit.
struct Kept {
    bytes: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl Kept {
    fn push(&mut self, more: &[u8]) {
        self.bytes.extend_from_slice(more);
        if self.bytes.len() > self.limit {
            let over = self.bytes.len() - self.limit;
            self.bytes.drain(..over);
            self.truncated = true;
        }
    }

    /// The text kept, from the first whole character (the cut may fall inside one).
    fn text(&self) -> String {
        let start = if self.truncated { self.bytes.iter().take_while(|b| (**b & 0xC0) == 0x80).count() } else { 0 };
        String::from_utf8_lossy(&self.bytes[start..]).into_owned()
    }
}

impl Terminals {
    /// Terminals of an agent started with `template` in `sandbox`, whose roots are `roots` (the workspace first);
    /// what they show goes to the turn `route` names.
    pub fn new(sandbox: Arc<dyn Sandbox>, template: &ExecSpec, roots: Vec<PathBuf>, route: Route) -> Self {
        let env = template.env.iter().filter(|(name, _)| name == "PATH" || name == "HOME").cloned().collect();
        let template = ExecSpec {
            program: PathBuf::from("/bin/sh"),
            env,
            cwd: template.cwd.clone(),
            read_only: template.read_only.clone(),
            tools: template.tools.clone(),
            net: template.net.clone(),
            ..ExecSpec::default()
        };
        Self {
            sandbox,
            template,
            roots,
            route,
            live: Live::default(),
            next: AtomicU64::new(1),
            turn: AtomicU64::new(0),
        }
    }

    /// Starts the command of `request` in the sandbox: its terminal's id, or why not.
    pub async fn create(self: &Arc<Self>, request: CreateTerminalRequest) -> Result<String, String> {
        if self.live().len() >= AT_ONCE {
            return Err(format!("the agent has {AT_ONCE} terminals already: release one first"));
        }
        let mut spec = self.template.clone();
        if let Some(cwd) = request.cwd {
            check(&self.roots, &cwd, false)?;
            check_resolved(&self.roots, &cwd, false)?;
            spec.cwd = cwd;
        }
        // As an editor runs it: a command line of its own when it comes without arguments.
        spec.args = if request.args.is_empty() {
            vec!["-c".into(), request.command]
        } else {
            [vec!["-c".into(), "exec \"$0\" \"$@\"".into(), request.command], request.args].concat()
        };
        spec.env.retain(|(name, _)| !request.env.iter().any(|var| &var.name == name));
        spec.env.extend(request.env.into_iter().map(|var| (var.name, var.value)));
        let limit = request.output_byte_limit.map_or(DEFAULT_KEPT, |limit| (limit as usize).min(MOST_KEPT));
        let process = self.sandbox.exec(spec).await.map_err(|e| e.to_string())?;
        let id = format!("term-{}", self.next.fetch_add(1, Ordering::SeqCst));
        let terminal = Arc::new(Terminal {
            id: id.clone(),
            session: request.session_id.0.to_string(),
            turn: self.turn.load(Ordering::SeqCst),
            output: Mutex::new(Kept { bytes: Vec::new(), limit, truncated: false }),
            exit: watch::channel(None).0,
            kill: CancellationToken::new(),
            changed: Notify::new(),
            shown: Mutex::default(),
        });
        self.live().insert(id.clone(), terminal.clone());
        tokio::spawn(run(terminal.clone(), process.stdout, process.stderr, process.handle));
        tokio::spawn(show(terminal, self.live.clone(), self.route.clone()));
        Ok(id)
    }

    /// What terminal `id` of `session` printed so far, and how it ended if it did.
    pub fn output(&self, session: &str, id: &str) -> Result<TerminalOutputResponse, String> {
        let terminal = self.get(session, id)?;
        let output = terminal.output.lock().unwrap_or_else(|p| p.into_inner());
        Ok(TerminalOutputResponse::new(output.text(), output.truncated).exit_status(terminal.exit.borrow().clone()))
    }

    /// How terminal `id` of `session` ended, once it did.
    pub async fn wait(&self, session: &str, id: &str) -> Result<TerminalExitStatus, String> {
        let mut exit = self.get(session, id)?.exit.subscribe();
        match exit.wait_for(Option::is_some).await {
            Ok(status) => Ok(status.clone().unwrap_or_default()),
            Err(_) => Err(format!("terminal {id} is gone")),
        }
    }

    /// Ends terminal `id`'s command; its output stays until it is released.
    pub fn kill(&self, session: &str, id: &str) -> Result<(), String> {
        self.get(session, id)?.kill.cancel();
        Ok(())
    }

    /// Ends terminal `id`'s command and forgets it.
    pub fn release(&self, session: &str, id: &str) -> Result<(), String> {
        self.get(session, id)?.kill.cancel();
        self.live().remove(id);
        Ok(())
    }

    /// A turn begins: the terminals made from now on are its own.
    pub fn begin_turn(&self) {
        self.turn.fetch_add(1, Ordering::SeqCst);
    }

    /// Ends the commands of the terminals made in the current turn (it was stopped: Stop ends what the turn
    /// started, also what the agent leaves running after it answered the cancel); their output stays until the
    /// agent releases them. Those of earlier turns run on.
    pub fn end_turn(&self) {
        let turn = self.turn.load(Ordering::SeqCst);
        for terminal in self.live().values().filter(|terminal| terminal.turn == turn) {
            terminal.kill.cancel();
        }
    }

    /// Ends every terminal (the agent ended).
    pub fn end_all(&self) {
        for (_, terminal) in self.live().drain() {
            terminal.kill.cancel();
        }
    }

    /// `update` as the editor can show it: a terminal in a tool call's content becomes the terminal's output (the
    /// editor has no terminal of that id), and the call is updated as the output grows.
    pub fn show(&self, update: &mut SessionUpdate) {
        let (id, content) = match update {
            SessionUpdate::ToolCall(call) => (&call.tool_call_id, &mut call.content),
            SessionUpdate::ToolCallUpdate(ToolCallUpdate { tool_call_id, fields, .. }) => match &mut fields.content {
                Some(content) => (&*tool_call_id, content),
                None => return,
            },
            _ => return,
        };
        let live = self.live();
        let mut shown = false;
        for item in content.iter() {
            if let ToolCallContent::Terminal(embedded) = item
                && let Some(terminal) = live.get(embedded.terminal_id.0.as_ref())
            {
                *terminal.shown.lock().unwrap_or_else(|p| p.into_inner()) = Some((id.clone(), content.clone()));
                // What it printed before the call showed it is sent too, if this update comes too early for it.
                terminal.changed.notify_one();
                shown = true;
            }
        }
        if shown || content.iter().any(|item| matches!(item, ToolCallContent::Terminal(_))) {
            *content = rendered(content, &live);
        }
    }

    fn get(&self, session: &str, id: &str) -> Result<Arc<Terminal>, String> {
        self.live()
            .get(id)
            .filter(|terminal| terminal.session == session)
            .cloned()
            .ok_or_else(|| format!("no terminal {id} in this session"))
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Terminal>>> {
        locked(&self.live)
    }
}

impl Drop for Terminals {
    fn drop(&mut self) {
        self.end_all();
    }
}

/// `content` with each terminal replaced by its output so far (one that is gone, by a word of it).
fn rendered(content: &[ToolCallContent], live: &HashMap<String, Arc<Terminal>>) -> Vec<ToolCallContent> {
    content
        .iter()
        .map(|item| match item {
            ToolCallContent::Terminal(embedded) => match live.get(embedded.terminal_id.0.as_ref()) {
                Some(terminal) => ToolCallContent::from(terminal.text()),
                None => ToolCallContent::from(format!("(terminal {} was released)", embedded.terminal_id.0)),
            },
            other => other.clone(),
        })
        .collect()
}

impl Terminal {
    /// Its output as a tool call shows it, with how it ended once it did.
    fn text(&self) -> String {
        let output = self.output.lock().unwrap_or_else(|p| p.into_inner()).text();
        let mut text = crate::agents::tools::fence(&output, "console");
        if let Some(status) = self.exit.borrow().as_ref() {
            match (status.exit_code, &status.signal) {
                (Some(code), _) if code != 0 => text.push_str(&format!("\n\nexit code {code}")),
                (None, Some(signal)) => text.push_str(&format!("\n\nended by {signal}")),
                _ => {}
            }
        }
        text
    }
}

/// Reads the command's output into its terminal until it ends (or is killed), then says how it ended.
async fn run(terminal: Arc<Terminal>, stdout: OutputStream, stderr: OutputStream, mut handle: Box<dyn ProcessHandle>) {
    let reading = futures::future::join(read(&terminal, stdout), read(&terminal, stderr));
    let ended = async {
        tokio::select! {
            exit = handle.wait() => exit.ok(),
            _ = terminal.kill.cancelled() => {
                handle.kill().await;
                handle.wait().await.ok()
            }
        }
    };
    let (exit, _) = tokio::join!(ended, async {
        // What it left running may hold its output open: its end is what counts.
        tokio::select! {
            _ = reading => {}
            _ = terminal.kill.cancelled() => {}
        }
    });
    let _ = terminal.exit.send(Some(status(exit)));
    terminal.changed.notify_one();
}

async fn read(terminal: &Terminal, mut stream: OutputStream) {
    let mut buf = vec![0u8; 8192];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
        terminal.output.lock().unwrap_or_else(|p| p.into_inner()).push(&buf[..n]);
        terminal.changed.notify_one();
    }
}

/// How a command ended, as ACP says it.
fn status(exit: Option<ExitInfo>) -> TerminalExitStatus {
    let exit = exit.unwrap_or(ExitInfo { code: None, signal: None });
    TerminalExitStatus::new()
        .exit_code(exit.code.and_then(|code| u32::try_from(code).ok()))
        .signal(exit.signal.map(signal_name))
}

fn signal_name(signal: i32) -> String {
    match signal {
        1 => "SIGHUP".into(),
        2 => "SIGINT".into(),
        9 => "SIGKILL".into(),
        15 => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}

fn locked(live: &Live) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Terminal>>> {
    live.lock().unwrap_or_else(|p| p.into_inner())
}

/// Updates the tool call that shows `terminal` as its output grows, and once more when it ends.
async fn show(terminal: Arc<Terminal>, live: Live, route: Route) {
    loop {
        terminal.changed.notified().await;
        let ended = terminal.exit.borrow().is_some();
        let shown = terminal.shown.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some((id, content)) = shown {
            // Shown to its end, even once the agent released it (its last output may come after that).
            let mut shown = locked(&live).clone();
            shown.insert(terminal.id.clone(), terminal.clone());
            let content = rendered(&content, &shown);
            let update =
                SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id, ToolCallUpdateFields::new().content(content)));
            if let (Some(tx), Ok(json)) = (sender(&route, &terminal.session), serde_json::to_string(&update)) {
                let _ = tx.send(Event::Update(json)).await;
            }
        }
        if ended {
            return;
        }
        tokio::time::sleep(SHOW_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_kept_is_its_end_from_a_whole_character() {
        let mut kept = Kept { bytes: Vec::new(), limit: 4, truncated: false };
        kept.push(b"ab");
        assert_eq!((kept.text().as_str(), kept.truncated), ("ab", false));
        kept.push("cd".as_bytes());
        assert_eq!((kept.text().as_str(), kept.truncated), ("abcd", false));
        kept.push("é€".as_bytes());
        // The 4 bytes kept are the end of "é" and "€": the part of "é" is left out.
        assert_eq!((kept.text().as_str(), kept.truncated), ("€", true));
    }

    #[test]
    fn an_exit_is_told_as_acp_says_it() {
        assert_eq!(status(Some(ExitInfo { code: Some(3), signal: None })).exit_code, Some(3));
        let killed = status(Some(ExitInfo { code: None, signal: Some(9) }));
        assert_eq!((killed.exit_code, killed.signal.as_deref()), (None, Some("SIGKILL")));
        assert_eq!(status(None), TerminalExitStatus::new());
    }
}
