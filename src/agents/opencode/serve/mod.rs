//! OpenCode driven through a warm `opencode serve`: the pure translation of its `GET /event` stream.
//!
//! The server, its HTTP client and the turn loop live elsewhere; this folder only turns the JSON of each SSE
//! event (`data:` payload) into [`Output`](crate::agents::Output)s, with the same titles, kinds, diffs, ids
//! and error mapping as the `opencode run --format json` translator in [`super::translate`].

pub mod events;
pub mod translate;

pub use translate::ServeTranslator;
