//! The ACP agent's `terminal/*`, run inside the session's sandbox (never on the host, where the editor's terminals
//! would run them): each command shares the agent's sandbox settings and its limits (the session's cgroup), its
//! output is kept within the agent's limit, and a tool call that shows the terminal shows its output instead, since
//! the editor has no such terminal. So does a terminal the agent runs itself and announces in `_meta` (Codex's
//! `terminal_info`, `terminal_output_delta` and `terminal_exit`).
//!
//! What one terminal costs the bridge is bounded: its output is read at [`READ_RATE`] at most (a command that prints
//! faster waits, as on a slow terminal), kept in a ring of its limit, and shown at most every [`SHOW_EVERY`], with
//! the last [`LIVE_TAIL`] while it runs and all that was kept once it ended.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    CreateTerminalRequest, Meta, SessionUpdate, TerminalExitStatus, TerminalOutputResponse, ToolCallContent,
    ToolCallId, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
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

/// How many released terminals keep their output for a tool call that shows them later (Codex releases a terminal
/// before its card is shown for the last time).
const KEPT_RELEASED: usize = 16;

/// How many of the terminals the agent runs itself (announced in `_meta`) are remembered.
const KEPT_ANNOUNCED: usize = 32;

/// How often a tool call that shows a running terminal is updated at most.
const SHOW_EVERY: Duration = Duration::from_millis(250);

/// How much of a running terminal's output a tool call shows: its end. Once it ended, all that was kept.
const LIVE_TAIL: usize = 64 << 10;

/// How fast the output of one agent's terminals is read at most, together, in bytes per second.
const READ_RATE: usize = 32 << 20;

/// The window [`READ_RATE`] is counted in.
const READ_WINDOW: Duration = Duration::from_millis(100);

/// The `_meta` keys of a terminal the agent runs itself (Zed's convention, which Codex follows).
const ANNOUNCED_KEYS: [&str; 4] = ["terminal_info", "terminal_output", "terminal_output_delta", "terminal_exit"];

/// The agent's terminals.
pub struct Terminals {
    sandbox: Arc<dyn Sandbox>,
    /// The agent's command, whose sandbox settings (and network) the terminals share.
    template: ExecSpec,
    /// The workspace and its other roots, as the agent sees them: a terminal's folder is one of them.
    roots: Vec<PathBuf>,
    route: Route,
    known: Known,
    next: AtomicU64,
    /// The agent's current turn (counted from 1): each terminal belongs to the one it was made in.
    turn: AtomicU64,
    /// What its terminals' output may still be read in this window.
    pace: Arc<Pace>,
}

/// The terminals a tool call may show, shared with the tasks that show them.
type Known = Arc<Mutex<Register>>;

/// Every terminal a tool call may name.
#[derive(Default)]
struct Register {
    /// Not yet released, by id: the agent's requests reach these only.
    live: HashMap<String, Arc<Terminal>>,
    /// The last released ones, oldest first.
    released: VecDeque<Arc<Terminal>>,
    /// The last ones the agent runs itself, oldest first.
    announced: VecDeque<Arc<Terminal>>,
}

impl Register {
    /// The terminal a tool call names as `id`.
    fn find(&self, id: &str) -> Option<Arc<Terminal>> {
        self.live.get(id).cloned().or_else(|| {
            let named = |terminal: &&Arc<Terminal>| terminal.id == id;
            self.released.iter().rev().find(named).or_else(|| self.announced.iter().rev().find(named)).cloned()
        })
    }
}

/// One command the agent started, or one it runs itself and announced.
struct Terminal {
    id: String,
    session: String,
    /// The turn it was made in.
    turn: u64,
    output: Mutex<Kept>,
    exit: watch::Sender<Option<TerminalExitStatus>>,
    /// Ends the command (a kill, a release, the agent's end), and the showing of its output.
    kill: CancellationToken,
    /// New output, or its end.
    changed: Notify,
    /// The tool call that shows it, with its content as the agent gave it.
    shown: Mutex<Option<(ToolCallId, Vec<ToolCallContent>)>>,
    /// Its final state was shown already (in the agent's own update that told its end).
    shown_ended: AtomicBool,
    /// The agent runs it itself (it announced it in `_meta`): no process of ours, it ends when the agent says so.
    announced: bool,
}

/// The end of a terminal's output, within its limit: a ring, so that a flood costs a copy of each byte, once.
struct Kept {
    bytes: VecDeque<u8>,
    limit: usize,
    truncated: bool,
}

impl Kept {
    fn new(limit: usize) -> Self {
        Kept { bytes: VecDeque::new(), limit, truncated: false }
    }

    fn push(&mut self, more: &[u8]) {
        let more = if more.len() > self.limit {
            self.truncated = true;
            &more[more.len() - self.limit..]
        } else {
            more
        };
        let over = (self.bytes.len() + more.len()).saturating_sub(self.limit);
        if over > 0 {
            self.bytes.drain(..over);
            self.truncated = true;
        }
        self.bytes.extend(more);
    }

    /// The text kept, from the first whole character (the cut may fall inside one).
    fn text(&self) -> String {
        self.tail(self.bytes.len())
    }

    /// The last `most` bytes of it as text, from the first whole character.
    fn tail(&self, most: usize) -> String {
        let skip = self.bytes.len().saturating_sub(most);
        let cut = self.truncated || skip > 0;
        let mut bytes = self.bytes.range(skip..).skip_while(|b| cut && (**b & 0xC0) == 0x80).copied();
        let mut text = Vec::with_capacity(self.bytes.len() - skip);
        text.extend(&mut bytes);
        String::from_utf8_lossy(&text).into_owned()
    }
}

/// A budget of bytes per window, shared by an agent's terminals.
struct Pace {
    window: Mutex<(tokio::time::Instant, usize)>,
}

impl Pace {
    fn new() -> Self {
        Pace { window: Mutex::new((tokio::time::Instant::now(), 0)) }
    }

    /// Counts `read` bytes, and waits for the next window once this one's budget is spent.
    async fn take(&self, read: usize) {
        let wait = {
            let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
            let now = tokio::time::Instant::now();
            if now.duration_since(window.0) >= READ_WINDOW {
                *window = (now, 0);
            }
            window.1 += read;
            let budget = READ_RATE / (Duration::from_secs(1).as_millis() / READ_WINDOW.as_millis()) as usize;
            (window.1 >= budget).then(|| window.0 + READ_WINDOW)
        };
        if let Some(until) = wait {
            tokio::time::sleep_until(until).await;
        }
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
            known: Known::default(),
            next: AtomicU64::new(1),
            turn: AtomicU64::new(0),
            pace: Arc::new(Pace::new()),
        }
    }

    /// Starts the command of `request` in the sandbox: its terminal's id, or why not.
    pub async fn create(self: &Arc<Self>, request: CreateTerminalRequest) -> Result<String, String> {
        if self.known().live.len() >= AT_ONCE {
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
        let terminal =
            Arc::new(Terminal::new(&id, &request.session_id.0, self.turn.load(Ordering::SeqCst), limit, false));
        self.known().live.insert(id.clone(), terminal.clone());
        tokio::spawn(run(terminal.clone(), process.stdout, process.stderr, process.handle, self.pace.clone()));
        tokio::spawn(show(terminal, self.known.clone(), self.route.clone()));
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

    /// Ends terminal `id`'s command and forgets it for the agent's requests; its output is kept a while for a tool
    /// call that shows it.
    pub fn release(&self, session: &str, id: &str) -> Result<(), String> {
        self.get(session, id)?.kill.cancel();
        let mut known = self.known();
        if let Some(terminal) = known.live.remove(id) {
            known.released.push_back(terminal);
            if known.released.len() > KEPT_RELEASED {
                known.released.pop_front();
            }
        }
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
        let known = self.known();
        for terminal in known.live.values().chain(&known.announced).filter(|terminal| terminal.turn == turn) {
            terminal.kill.cancel();
        }
    }

    /// Ends every terminal (the agent ended).
    pub fn end_all(&self) {
        let mut known = self.known();
        for (_, terminal) in known.live.drain() {
            terminal.kill.cancel();
        }
        for terminal in known.announced.drain(..) {
            terminal.kill.cancel();
        }
        known.released.clear();
    }

    /// `update` of `session` as the editor can show it: a terminal in a tool call's content becomes the terminal's
    /// output (the editor has no terminal of that id), and the call is updated as the output grows. A terminal the
    /// agent runs itself and announces in `_meta` is kept and shown the same way, and its `_meta` keys are taken
    /// out. Whether anything is left to send.
    pub fn show(&self, session: &str, update: &mut SessionUpdate) -> bool {
        // An update that ends the call ends what its terminals show in it: nothing after it updates the card.
        let closing = match &*update {
            SessionUpdate::ToolCall(call) => call.status,
            SessionUpdate::ToolCallUpdate(ToolCallUpdate { fields, .. }) => fields.status.unwrap_or_default(),
            _ => return true,
        };
        let closing = matches!(closing, ToolCallStatus::Completed | ToolCallStatus::Failed);
        let (id, content, meta) = match update {
            SessionUpdate::ToolCall(call) => (&call.tool_call_id, Some(&mut call.content), &mut call.meta),
            SessionUpdate::ToolCallUpdate(ToolCallUpdate { tool_call_id, fields, meta, .. }) => {
                (&*tool_call_id, fields.content.as_mut(), meta)
            }
            _ => return true,
        };
        let id = id.clone();
        let told = self.take_announced(session, meta);
        let known = self.known();
        match content {
            Some(content) => {
                let mut shown = Vec::new();
                for item in content.iter() {
                    if let ToolCallContent::Terminal(embedded) = item
                        && let Some(terminal) = known.find(embedded.terminal_id.0.as_ref())
                    {
                        // This update shows what it printed so far; its own updates show what comes next.
                        *terminal.shown.lock().unwrap_or_else(|p| p.into_inner()) = Some((id.clone(), content.clone()));
                        shown.push(terminal);
                    }
                }
                if !shown.is_empty() || content.iter().any(|item| matches!(item, ToolCallContent::Terminal(_))) {
                    *content = rendered(content, |id| known.find(id), false);
                    // This update shows the end of those that ended: theirs need not show it again.
                    for terminal in shown.iter().filter(|terminal| closing || terminal.exit.borrow().is_some()) {
                        terminal.shown_ended.store(true, Ordering::SeqCst);
                    }
                }
            }
            None => {
                // The agent's update that tells a terminal's end carries its final output, in order.
                let ended = told.iter().find(|terminal| {
                    terminal.exit.borrow().is_some()
                        && terminal
                            .shown
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .as_ref()
                            .is_some_and(|(call, _)| *call == id)
                });
                if let Some(terminal) = ended
                    && let Some((_, content)) = terminal.shown.lock().unwrap_or_else(|p| p.into_inner()).clone()
                {
                    terminal.shown_ended.store(true, Ordering::SeqCst);
                    if let SessionUpdate::ToolCallUpdate(ToolCallUpdate { fields, .. }) = update {
                        fields.content = Some(rendered(&content, |id| known.find(id), false));
                    }
                }
            }
        }
        drop(known);
        match update {
            SessionUpdate::ToolCallUpdate(ToolCallUpdate { fields, meta, .. }) => {
                told.is_empty() || meta.is_some() || *fields != ToolCallUpdateFields::default()
            }
            _ => true,
        }
    }

    /// Takes the terminal keys out of `meta` and applies them to the terminals they name: the ones they told of.
    fn take_announced(&self, session: &str, meta: &mut Option<Meta>) -> Vec<Arc<Terminal>> {
        let Some(fields) = meta.as_mut() else { return Vec::new() };
        let mut told: Vec<Arc<Terminal>> = Vec::new();
        for key in ANNOUNCED_KEYS {
            let Some(value) = fields.remove(key) else { continue };
            let Some(id) = value.get("terminal_id").and_then(|id| id.as_str()) else { continue };
            let terminal = self.announced(session, id);
            match key {
                "terminal_output" | "terminal_output_delta" => {
                    if let Some(data) = value.get("data").and_then(|data| data.as_str()) {
                        terminal.output.lock().unwrap_or_else(|p| p.into_inner()).push(data.as_bytes());
                    }
                }
                "terminal_exit" => {
                    let code =
                        value.get("exit_code").and_then(|code| code.as_u64()).and_then(|c| u32::try_from(c).ok());
                    let signal = value.get("signal").and_then(|signal| signal.as_str()).map(str::to_string);
                    terminal.exit.send_replace(Some(TerminalExitStatus::new().exit_code(code).signal(signal)));
                }
                _ => {}
            }
            terminal.changed.notify_one();
            if !told.iter().any(|known| Arc::ptr_eq(known, &terminal)) {
                told.push(terminal);
            }
        }
        if fields.is_empty() {
            *meta = None;
        }
        told
    }

    /// The terminal `id` the agent runs itself, remembered from now on.
    fn announced(&self, session: &str, id: &str) -> Arc<Terminal> {
        let mut known = self.known();
        if let Some(terminal) = known.announced.iter().find(|terminal| terminal.id == id && terminal.session == session)
        {
            return terminal.clone();
        }
        let terminal = Arc::new(Terminal::new(id, session, self.turn.load(Ordering::SeqCst), DEFAULT_KEPT, true));
        known.announced.push_back(terminal.clone());
        if known.announced.len() > KEPT_ANNOUNCED
            && let Some(oldest) = known.announced.pop_front()
        {
            oldest.kill.cancel();
        }
        tokio::spawn(show(terminal.clone(), self.known.clone(), self.route.clone()));
        terminal
    }

    fn get(&self, session: &str, id: &str) -> Result<Arc<Terminal>, String> {
        self.known()
            .live
            .get(id)
            .filter(|terminal| terminal.session == session)
            .cloned()
            .ok_or_else(|| format!("no terminal {id} in this session"))
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Register> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Terminals {
    fn drop(&mut self) {
        self.end_all();
    }
}

/// `content` with each terminal replaced by its output so far (one that is gone, by a word of it): all that was
/// kept, or only its end while it runs unless `whole`.
fn rendered(
    content: &[ToolCallContent],
    find: impl Fn(&str) -> Option<Arc<Terminal>>,
    whole: bool,
) -> Vec<ToolCallContent> {
    content
        .iter()
        .map(|item| match item {
            ToolCallContent::Terminal(embedded) => match find(embedded.terminal_id.0.as_ref()) {
                Some(terminal) => ToolCallContent::from(terminal.text(whole)),
                None => ToolCallContent::from(format!("(terminal {} was released)", embedded.terminal_id.0)),
            },
            other => other.clone(),
        })
        .collect()
}

impl Terminal {
    fn new(id: &str, session: &str, turn: u64, limit: usize, announced: bool) -> Self {
        Terminal {
            id: id.to_string(),
            session: session.to_string(),
            turn,
            output: Mutex::new(Kept::new(limit)),
            exit: watch::channel(None).0,
            kill: CancellationToken::new(),
            changed: Notify::new(),
            shown: Mutex::default(),
            shown_ended: AtomicBool::new(false),
            announced,
        }
    }

    /// Its output as a tool call shows it, with how it ended once it did: while it runs only its end, unless
    /// `whole`.
    fn text(&self, whole: bool) -> String {
        let ended = self.exit.borrow().clone();
        let output = {
            let kept = self.output.lock().unwrap_or_else(|p| p.into_inner());
            if whole || ended.is_some() { kept.text() } else { kept.tail(LIVE_TAIL) }
        };
        let mut text = crate::agents::tools::fence(&output, "console");
        if let Some(status) = ended {
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
async fn run(
    terminal: Arc<Terminal>,
    stdout: OutputStream,
    stderr: OutputStream,
    mut handle: Box<dyn ProcessHandle>,
    pace: Arc<Pace>,
) {
    let reading = futures::future::join(read(&terminal, stdout, &pace), read(&terminal, stderr, &pace));
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
    terminal.exit.send_replace(Some(status(exit)));
    terminal.changed.notify_one();
}

async fn read(terminal: &Terminal, mut stream: OutputStream, pace: &Pace) {
    let mut buf = vec![0u8; 64 << 10];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
        terminal.output.lock().unwrap_or_else(|p| p.into_inner()).push(&buf[..n]);
        terminal.changed.notify_one();
        pace.take(n).await;
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

/// Updates the tool call that shows `terminal` as its output grows, at most every [`SHOW_EVERY`] (always with its
/// latest state), and once more when it ends, unless the agent's own update showed that already.
async fn show(terminal: Arc<Terminal>, known: Known, route: Route) {
    let mut showing: Option<ToolCallId> = None;
    loop {
        tokio::select! {
            _ = terminal.changed.notified() => {}
            // An announced terminal whose end never came: its turn was stopped, or it was forgotten.
            _ = terminal.kill.cancelled(), if terminal.announced => return,
        }
        let call = terminal.shown.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|(id, _)| id.clone());
        if call.is_some() && call != showing {
            // The agent's update that shows it in this call is on its way to the turn: it goes first (it showed
            // what was printed so far), so that the call is never updated before it is announced.
            showing = call;
            tokio::time::sleep(SHOW_EVERY).await;
        }
        let mut ended = terminal.exit.borrow().is_some();
        let shown = terminal.shown.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some((id, content)) = shown
            && let Some(tx) = sender(&route, &terminal.session)
            // Its place in the turn's order first: what the agent sends meanwhile comes after it.
            && let Ok(place) = tx.reserve().await
            && {
                ended = terminal.exit.borrow().is_some();
                !terminal.shown_ended.load(Ordering::SeqCst)
            }
        {
            // Shown to its end, even once the agent released it (its last output may come after that).
            let content = {
                let known = known.lock().unwrap_or_else(|p| p.into_inner());
                let find = |id: &str| if id == terminal.id { Some(terminal.clone()) } else { known.find(id) };
                rendered(&content, find, ended)
            };
            let update =
                SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id, ToolCallUpdateFields::new().content(content)));
            if let Ok(json) = serde_json::to_string(&update) {
                place.send(Event::Update(json));
            }
        }
        if ended || terminal.shown_ended.load(Ordering::SeqCst) {
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
        let mut kept = Kept::new(4);
        kept.push(b"ab");
        assert_eq!((kept.text().as_str(), kept.truncated), ("ab", false));
        kept.push("cd".as_bytes());
        assert_eq!((kept.text().as_str(), kept.truncated), ("abcd", false));
        kept.push("é€".as_bytes());
        // The 4 bytes kept are the end of "é" and "€": the part of "é" is left out.
        assert_eq!((kept.text().as_str(), kept.truncated), ("€", true));
    }

    #[test]
    fn a_flood_keeps_the_end_of_the_output_within_the_limit() {
        let mut kept = Kept::new(8);
        for _ in 0..1000 {
            kept.push(b"0123456789");
        }
        kept.push(b"abc");
        assert_eq!((kept.text().as_str(), kept.truncated, kept.bytes.len()), ("56789abc", true, 8));
        kept.push(&[b'x'; 20]);
        assert_eq!(kept.text(), "xxxxxxxx");
        let mut kept = Kept::new(100);
        kept.push("aé".as_bytes());
        // The last two bytes are all of "é": the tail starts at a whole character.
        assert_eq!((kept.tail(2).as_str(), kept.tail(1).as_str(), kept.text().as_str()), ("é", "", "aé"));
    }

    /// A sandbox nothing runs in: the terminals the agent announces run in its own process.
    struct Nowhere;

    #[async_trait::async_trait]
    impl Sandbox for Nowhere {
        fn workspace(&self) -> &std::path::Path {
            std::path::Path::new("/ws")
        }
        fn state_dir(&self) -> &std::path::Path {
            std::path::Path::new("/state")
        }
        fn isolation(&self) -> String {
            "none".into()
        }
        async fn exec(&self, _spec: ExecSpec) -> Result<crate::sandbox::RunningProcess, crate::sandbox::SandboxError> {
            Err(crate::sandbox::SandboxError::Unavailable("nothing runs here".into()))
        }
        async fn write_state_file(&self, _: &std::path::Path, _: &[u8]) -> Result<(), crate::sandbox::SandboxError> {
            Ok(())
        }
    }

    fn update(json: serde_json::Value) -> SessionUpdate {
        serde_json::from_value(json).unwrap()
    }

    #[tokio::test]
    async fn a_terminal_the_agent_runs_itself_is_shown_with_its_output_in_the_card() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let route: Route = Arc::new(Mutex::new(Some(("s".to_string(), tx))));
        let terminals = Terminals::new(Arc::new(Nowhere), &ExecSpec::default(), Vec::new(), route);
        terminals.begin_turn();
        // Codex's command card: its own terminal, announced in `_meta`, its output in deltas, its end in the last.
        let mut announced = update(serde_json::json!({
            "sessionUpdate": "tool_call", "toolCallId": "call_1", "title": "echo", "kind": "execute",
            "content": [{"type": "terminal", "terminalId": "call_1"}],
            "_meta": {"terminal_info": {"terminal_id": "call_1", "cwd": "/ws"}, "other": 1}
        }));
        assert!(terminals.show("s", &mut announced));
        let json = serde_json::to_value(&announced).unwrap();
        assert_eq!(
            json["content"],
            serde_json::json!([{"type": "content", "content": {"type": "text", "text": "```console\n\n```"}}])
        );
        assert_eq!(json["_meta"], serde_json::json!({"other": 1}));
        for data in ["one\n", "two\n"] {
            let mut chunk = update(serde_json::json!({
                "sessionUpdate": "tool_call_update", "toolCallId": "call_1",
                "_meta": {"terminal_output_delta": {"terminal_id": "call_1", "data": data}}
            }));
            assert!(!terminals.show("s", &mut chunk), "a chunk alone is shown by the coalesced updates");
        }
        let mut end = update(serde_json::json!({
            "sessionUpdate": "tool_call_update", "toolCallId": "call_1", "status": "completed",
            "_meta": {"terminal_exit": {"terminal_id": "call_1", "exit_code": 2, "signal": null}}
        }));
        assert!(terminals.show("s", &mut end));
        let json = serde_json::to_value(&end).unwrap();
        assert_eq!(
            (&json["status"], &json["content"][0]["content"]["text"], json.get("_meta")),
            (&serde_json::json!("completed"), &serde_json::json!("```console\none\ntwo\n```\n\nexit code 2"), None)
        );
        // What the coalesced updates showed meanwhile is the card's content at some moment, nothing else.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        while let Ok(event) = rx.try_recv() {
            let Event::Update(json) = event else { panic!("not an update") };
            let shown: serde_json::Value = serde_json::from_str(&json).unwrap();
            let text = shown["content"][0]["content"]["text"].as_str().unwrap().to_string();
            let states = ["```console\n\n```", "```console\none\n```", "```console\none\ntwo\n```"];
            assert!(shown["toolCallId"] == "call_1" && states.contains(&text.as_str()), "{shown}");
        }
        // A card that names a terminal nobody announced or made says so.
        let mut unknown = update(serde_json::json!({
            "sessionUpdate": "tool_call", "toolCallId": "call_2", "title": "x",
            "content": [{"type": "terminal", "terminalId": "call_2"}]
        }));
        assert!(terminals.show("s", &mut unknown));
        let json = serde_json::to_value(&unknown).unwrap();
        assert_eq!(json["content"][0]["content"]["text"], "(terminal call_2 was released)");
    }

    #[test]
    fn an_exit_is_told_as_acp_says_it() {
        assert_eq!(status(Some(ExitInfo { code: Some(3), signal: None })).exit_code, Some(3));
        let killed = status(Some(ExitInfo { code: None, signal: Some(9) }));
        assert_eq!((killed.exit_code, killed.signal.as_deref()), (None, Some("SIGKILL")));
        assert_eq!(status(None), TerminalExitStatus::new());
    }
}
