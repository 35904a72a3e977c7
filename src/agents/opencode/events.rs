//! Wire types of opencode's JSONL stream.
