//! acp-sandbox: an Agent Client Protocol server that runs coding agents (Amp, OpenCode, Claude Code, Codex, Gemini CLI,
//! any ACP agent) in a sandbox.
//!
//! `server` speaks ACP and calls `session::Bridge`; the bridge persists sessions in `store`, runs each
//! turn's CLI through `sandbox`, and turns its output into ACP updates with the pure translators in
//! `agents`. See ARCHITECTURE.md for the map and its invariants.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod agents;
pub mod auth;
pub mod config;
pub mod error;
pub(crate) mod lines;
pub mod locate;
pub mod logging;
pub mod paths;
pub mod sandbox;
pub mod server;
pub mod session;
pub mod store;
pub mod terminal;
pub mod workspace;
