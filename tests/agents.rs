//! One suite for every agent: what the bridge does the same whatever agent it runs, instantiated per agent against
//! its fake (`tests/fakes/`) through the built binary: Amp, OpenCode per prompt (`run`) and through its warm server
//! (`serve`), and the test-only `scripted` agent (`src/agents/scripted/`, debug builds), which is what a third
//! agent is: a folder, one line in `AGENTS`, one field of `AgentSettings`.
//!
//! The suite speaks well-formed ACP only, so it drives the bridge with the typed client of the official SDK
//! (`support::acp_client`); what the wire must look like is `tests/e2e/`'s, on the raw client.
//!
//! `cargo test --test agents -- --list` lists the suite once per agent.
// Tests start the bridge and fake CLIs themselves.
#![allow(clippy::disallowed_methods)]
// A test fails by panicking: unwrap and expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use agent_client_protocol::v1::schema::{SessionUpdate, StopReason};

use crate::support::acp_client::{AcpClient, Answers, Turn};
use crate::support::{
    BridgeOptions, RECV_TIMEOUT, TestDirs, assert_no_processes_under, fakes_dir, processes_under, wait_until,
};

/// An agent as the suite drives it.
trait Case {
    /// The agent's name in the bridge's messages.
    const NAME: &'static str;
    /// A prompt the agent works on until it is cancelled.
    const HANG: &'static str;
    /// A prompt that makes the agent's process die.
    const CRASH: &'static str;

    /// The bridge running this agent on its fake.
    fn options(dirs: &TestDirs) -> BridgeOptions;

    /// The agent's answer to the plain prompts of one session, the `k`th (from 1) to `prompt` (`first`: the
    /// answer to the first, for a fake whose answers name its conversation).
    fn answer(k: usize, prompt: &str, first: &str) -> String;

    /// What a prompt that crashed the agent fails with.
    fn crashed() -> String;
}

struct Amp;

impl Case for Amp {
    const NAME: &'static str = "Amp";
    const HANG: &'static str = "SCENARIO:hang";
    const CRASH: &'static str = "SCENARIO:crash";

    fn options(dirs: &TestDirs) -> BridgeOptions {
        BridgeOptions::new("amp", &dirs.data)
    }

    fn answer(k: usize, _prompt: &str, _first: &str) -> String {
        match k {
            1 => "Hello! How can I help you today?".into(),
            _ => "Yes - you asked me to say hello.".into(),
        }
    }

    fn crashed() -> String {
        crash_of_the_fake_cli("Amp")
    }
}

struct OpenCodeRun;

impl Case for OpenCodeRun {
    const NAME: &'static str = "OpenCode";
    const HANG: &'static str = "SCENARIO:hang";
    const CRASH: &'static str = "SCENARIO:crash";

    fn options(dirs: &TestDirs) -> BridgeOptions {
        BridgeOptions::new("opencode", &dirs.data)
    }

    fn answer(k: usize, _prompt: &str, _first: &str) -> String {
        match k {
            1 => "Hello from the fake model. This is a plain text answer.".into(),
            _ => "Yes, I remember: this is turn two of the same session.".into(),
        }
    }

    fn crashed() -> String {
        crash_of_the_fake_cli("OpenCode")
    }
}

struct OpenCodeServe;

impl Case for OpenCodeServe {
    const NAME: &'static str = "OpenCode";
    const HANG: &'static str = "FAULT:slow";
    const CRASH: &'static str = "FAULT:die:9";

    fn options(dirs: &TestDirs) -> BridgeOptions {
        BridgeOptions::new("opencode", &dirs.data)
            .env("ACP_SANDBOX_OPENCODE_BACKEND", "serve")
            .env("OPENCODE_FAKE_SERVE", "1")
    }

    fn answer(k: usize, _prompt: &str, first: &str) -> String {
        // `turn <k> of <its OpenCode session>`: the same session on every turn is the conversation continued.
        let session = first.strip_prefix("turn 1 of ").unwrap_or_else(|| panic!("a first answer: {first:?}"));
        format!("turn {k} of {session}")
    }

    fn crashed() -> String {
        "OpenCode's server was killed (SIGKILL, signal 9) during the turn, not by acp-sandbox: by another process \
         (one of the agent's own commands can signal it) or the kernel"
            .into()
    }
}

/// The test-only agent exists in debug builds only (the default of `cargo test`).
#[cfg(debug_assertions)]
struct Scripted;

#[cfg(debug_assertions)]
impl Case for Scripted {
    const NAME: &'static str = "Scripted";
    const HANG: &'static str = "SCENARIO:hang";
    const CRASH: &'static str = "SCENARIO:crash";

    fn options(dirs: &TestDirs) -> BridgeOptions {
        BridgeOptions::new("scripted", &dirs.data)
            .env("ACP_SANDBOX_SCRIPTED_BIN", &fakes_dir().join("scripted").display().to_string())
    }

    fn answer(k: usize, prompt: &str, _first: &str) -> String {
        match k {
            1 => format!("You said: {prompt}"),
            // The fake keeps its conversation's prompts: a continued one names the earlier.
            _ => format!("You said: {prompt} and before: Say hello"),
        }
    }

    fn crashed() -> String {
        // Its own `Error:` line, then its stderr's tail.
        "Scripted failed (exit code 3): Error: simulated crash\n\nstderr:\nError: simulated crash".into()
    }
}

/// How the bridge words a crash of `tests/fakes/fake_cli.py`, which says no `Error:` line: its last output (a cut
/// line), then its stderr's tail.
fn crash_of_the_fake_cli(name: &str) -> String {
    format!(
        "{name} exited with exit code 3; its last output was: {{\"type\":\"text\",\"timestamp\":17959431\n\nstderr:\n\
         fake-cli: simulated crash: segmentation fault in the event loop"
    )
}

/// The agent's own text of a turn: its message chunks without the bridge's notes (`_…_` lines).
fn reply(turn: &Turn) -> String {
    let text = turn.agent_text();
    let note = |part: &str| part.starts_with('_') && part.ends_with('_');
    let own = |part: &&str| !(part.is_empty() || note(part));
    text.split("\n\n").filter(own).collect::<Vec<_>>().join("\n\n")
}

/// The bridge of `C` on its fake, initialized by a client that grants nothing (as the raw client of `tests/e2e/`).
fn start<C: Case>(dirs: &TestDirs) -> AcpClient {
    AcpClient::start(C::options(dirs).command(), Answers::default())
}

fn streams<C: Case>() {
    let dirs = TestDirs::new(&format!("agents-streams-{}", C::NAME.to_lowercase()));
    let ws = dirs.workspace("ws");
    let bridge = start::<C>(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), StopReason::EndTurn);
    let first = reply(&turn);
    assert_eq!(first, C::answer(1, "Say hello", &first));
    let chunks = turn.count(|update| matches!(update, SessionUpdate::AgentMessageChunk(_)));
    assert!(chunks >= 1, "no message chunk streamed: {:?}", turn.updates);
}

fn continues<C: Case>() {
    let dirs = TestDirs::new(&format!("agents-continues-{}", C::NAME.to_lowercase()));
    let ws = dirs.workspace("ws");
    let bridge = start::<C>(&dirs);
    let sid = bridge.new_session(&ws);
    let first = reply(&bridge.prompt(&sid, "Say hello"));
    let second = bridge.prompt(&sid, "Do you remember?");
    assert_eq!(second.stop_reason(), StopReason::EndTurn);
    assert_eq!(reply(&second), C::answer(2, "Do you remember?", &first), "the conversation was not continued");
}

fn cancels<C: Case>() {
    let dirs = TestDirs::new(&format!("agents-cancels-{}", C::NAME.to_lowercase()));
    let ws = dirs.workspace("ws");
    let bridge = start::<C>(&dirs);
    let sid = bridge.new_session(&ws);
    let pending = bridge.send_prompt(&sid, C::HANG);
    // Cancelled once the agent is at work: its process runs in the workspace.
    assert!(wait_until(RECV_TIMEOUT, || !processes_under(&ws).is_empty()), "the agent never started");
    bridge.cancel(&sid);
    assert_eq!(bridge.finish_turn(&sid, pending).stop_reason(), StopReason::Cancelled);
    let after = bridge.prompt(&sid, "Say hello");
    assert_eq!(after.stop_reason(), StopReason::EndTurn, "the session must work after a cancel");
    drop(bridge);
    assert_no_processes_under(&ws, "after the bridge ended");
}

fn crashes<C: Case>() {
    let dirs = TestDirs::new(&format!("agents-crashes-{}", C::NAME.to_lowercase()));
    let ws = dirs.workspace("ws");
    let bridge = start::<C>(&dirs);
    let sid = bridge.new_session(&ws);
    let crashed = bridge.prompt(&sid, C::CRASH);
    let error = crashed.result.expect_err("a crashed agent's prompt must fail");
    assert_eq!(error.message, C::crashed());
    let after = bridge.prompt(&sid, "Say hello");
    assert_eq!(after.stop_reason(), StopReason::EndTurn, "the bridge must go on after the agent crashed");
}

fn replays<C: Case>() {
    let dirs = TestDirs::new(&format!("agents-replays-{}", C::NAME.to_lowercase()));
    let ws = dirs.workspace("ws");
    let mut bridge = start::<C>(&dirs);
    let sid = bridge.new_session(&ws);
    let turn = bridge.prompt(&sid, "Say hello");
    assert_eq!(turn.stop_reason(), StopReason::EndTurn);
    bridge.kill9();
    let again = start::<C>(&dirs);
    let loaded = again.load_session(&sid, &ws);
    loaded.result.as_ref().expect("the session loads after a SIGKILLed bridge");
    assert_eq!(loaded.user_text(), "Say hello");
    assert_eq!(loaded.agent_text(), turn.agent_text(), "the replay differs from the turn");
    let next = again.prompt(&sid, "Do you remember?");
    assert_eq!(next.stop_reason(), StopReason::EndTurn);
}

macro_rules! suite {
    ($($agent:ident: $case:ty),* $(,)?) => {$(
        mod $agent {
            use super::*;

            #[test]
            fn a_prompt_streams_its_answer_and_ends_end_turn() {
                streams::<$case>()
            }

            #[test]
            fn a_follow_up_continues_the_conversation() {
                continues::<$case>()
            }

            #[test]
            fn a_cancel_ends_the_turn_cancelled_and_leaves_no_process() {
                cancels::<$case>()
            }

            #[test]
            fn a_crash_fails_the_prompt_in_the_agents_words_and_the_next_prompt_works() {
                crashes::<$case>()
            }

            #[test]
            fn a_new_bridge_replays_the_turn_and_continues() {
                replays::<$case>()
            }
        }
    )*};
}

suite!(amp: Amp, opencode_run: OpenCodeRun, opencode_serve: OpenCodeServe);
#[cfg(debug_assertions)]
suite!(scripted: Scripted);
