//! The official Daytona npm SDK (`@daytonaio/sdk`, pinned in `.ci/install-node-sdk.sh`) against the fake, as the
//! Python SDK is in `the_official_sdk_agrees_with_the_fake`: `tests/fakes/daytona_sdk_check.mjs` asserts every
//! answer.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::{FakeDaytona, KEY, assert_the_sdk_agreed, node_sdk, test_dir};

#[test]
fn the_official_npm_sdk_agrees_with_the_fake() {
    let dir = test_dir("npm-sdk");
    let fake = FakeDaytona::start(&dir);
    let env = [("DAYTONA_API_URL", fake.api_url()), ("DAYTONA_API_KEY", KEY.to_string())];
    let stdout = node_sdk::run_check("daytona_sdk_check.mjs", &dir, &env);
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    // The first call is the check's own with a wrong key; the streamed logs came over the WebSocket.
    let calls = fake.sdk_calls();
    assert_eq!((&calls[0]["path"], &calls[0]["auth"]), (&json!("/api/sandbox/anything"), &json!("Bearer dtn_wrong")));
    assert!(calls.iter().any(|r| r["path"].as_str().unwrap().ends_with("/logs?follow=true")));
    assert_the_sdk_agreed(&seen, &calls[1..], "0.218.0");
}
