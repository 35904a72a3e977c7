//! Wire types of amp's JSONL stream.
