//! acp-sandbox: an Agent Client Protocol server that runs the Amp and OpenCode CLIs in a sandbox.
#![deny(clippy::print_stdout)]

pub mod agents;
