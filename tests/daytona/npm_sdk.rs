//! The official Daytona npm SDK (`@daytonaio/sdk`, pinned in `.ci/install-node-sdk.sh`) against the fake, as the
//! Python SDK is in `the_official_sdk_agrees_with_the_fake`: `tests/fakes/daytona_sdk_check.mjs` asserts every
//! answer.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::{FakeDaytona, KEY, node_sdk, test_dir};

#[test]
fn the_official_npm_sdk_agrees_with_the_fake() {
    let dir = test_dir("npm-sdk");
    let fake = FakeDaytona::start(&dir);
    let env = [("DAYTONA_API_URL", fake.api_url()), ("DAYTONA_API_KEY", KEY.to_string())];
    let stdout = node_sdk::run_check("daytona_sdk_check.mjs", &dir, &env);
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        seen,
        json!({
            "stdout": "hello from env\nno newline\n",
            "stderr": "to-stderr\n",
            "exit_code": 7,
            "read_back": "first file\n",
            "gone": "DaytonaNotFoundError",
        })
    );
    // The SDK sent the key only as a bearer token, and named itself (its Socket.IO probe, 404 here, aside); the
    // first call is the one with a wrong key.
    let requests = fake.requests();
    let sandbox_calls: Vec<&Value> =
        requests.iter().filter(|r| !r["path"].as_str().unwrap().contains("socket.io")).collect();
    assert_eq!(
        (&sandbox_calls[0]["path"], &sandbox_calls[0]["auth"]),
        (&json!("/api/sandbox/anything"), &json!("Bearer dtn_wrong"))
    );
    assert!(sandbox_calls.iter().any(|r| r["path"].as_str().unwrap().ends_with("/logs?follow=true")));
    for request in &sandbox_calls[1..] {
        assert_eq!(request["auth"], json!(format!("Bearer {KEY}")), "{request}");
        assert_eq!(request["sdk"], json!("0.218.0"), "{request}");
    }
}
