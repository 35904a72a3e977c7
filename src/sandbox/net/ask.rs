//! `--network ask`: what the proxy asks of the bridge about a host outside the allow-list, and what it is told.
//!
//! The proxy knows the sandbox (its label), not the session or the editor: the bridge implements [`Asker`] (in
//! `session/`), finds the turn running in that sandbox and asks the user there. The question comes before any DNS
//! lookup, so a name the user refuses never reaches a resolver (a lookup of a made-up name is a way out too).

use std::fmt;
use std::time::Duration;

/// How long a connection waits for the user's answer; then it is refused and the question withdrawn.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(120);

/// The user's answer about one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Connect (once, or the host is allowed for the session from now on).
    Allowed,
    /// Do not connect.
    Refused(Refusal),
}

/// Why a connection under `ask` was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The user chose to refuse it (or the editor answered the question `cancelled`).
    ByUser,
    /// Nobody answered within [`ASK_TIMEOUT`].
    Unanswered(Duration),
    /// The turn was cancelled, or ended, before the user answered.
    TurnEnded,
    /// No turn of the sandbox's session is running: there is nobody to ask.
    NoTurn,
    /// Several sessions run a turn in this (shared) sandbox: the connection is nobody's to allow.
    Shared(usize),
    /// The editor could not be asked (it went away, or failed the request).
    NoEditor,
    /// This proxy has nobody to ask at all.
    NoAsker,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::ByUser => f.write_str("refused by the user"),
            Refusal::Unanswered(waited) => write!(f, "the user did not answer within {} s", waited.as_secs()),
            Refusal::TurnEnded => f.write_str("the turn ended before the user answered"),
            Refusal::NoTurn => f.write_str("no turn of the session is running, so the user cannot be asked"),
            Refusal::Shared(turns) => {
                write!(f, "{turns} sessions run a turn in this shared sandbox, so none of them can be asked")
            }
            Refusal::NoEditor => f.write_str("the editor could not be asked"),
            Refusal::NoAsker => f.write_str("nobody can be asked here"),
        }
    }
}

/// What the proxy of a sandbox asks about a host outside the allow-list.
#[async_trait::async_trait]
pub trait Asker: Send + Sync {
    /// Whether the sandbox `label` may connect to `host:port` (a canonical name or IP literal). Resolves within
    /// about [`ASK_TIMEOUT`]; a host the session always allows is answered at once, without a question.
    async fn ask(&self, label: &str, host: &str, port: u16) -> Verdict;
}
