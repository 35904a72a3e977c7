//! End-to-end tests of acp-sandbox: the real binary, driven over stdio like Zed drives it, running fake
//! OpenCode/Amp CLIs (`tests/fakes/`) that replay recorded event streams (`tests/fixtures/`).
//!
//! Every line the bridge writes is checked against the ACP JSON Schemas in `schemas/acp/` (see `support`).
//! Run: `cargo test --test e2e`; `UPDATE_SCHEMAS=1 cargo test --test e2e schemas` regenerates the schemas.
// Tests start the bridge, fake CLIs and servers themselves.
#![allow(clippy::disallowed_methods)]
// A test fails by panicking: unwrap and expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod e2e {
    mod acp_agents;
    mod acp_terminals;
    mod amp;
    mod auth;
    mod cancel;
    mod commands;
    mod errors;
    mod fork;
    mod landlock;
    mod network_ask;
    mod persistence;
    mod protocol;
    mod review;
    mod roots;
    mod sandbox;
    mod schemas;
    mod serve_faults;
    mod shared_server;
    mod startup;
    mod store;
    mod terminal;
    mod transport;
    mod turns;
}
