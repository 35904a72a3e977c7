//! OpenCode: how to run `opencode run --format json`, and its events.

pub mod events;
pub mod translate;
