//! Amp: how to run `amp -x --stream-json`, and its events.

pub mod events;
pub mod translate;
