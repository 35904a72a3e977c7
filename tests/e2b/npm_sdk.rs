//! The official E2B npm SDK (`e2b`, pinned in `.ci/install-node-sdk.sh`) against the fake, as the Python SDK is
//! in `the_official_sdk_agrees_with_the_fake`: `tests/fakes/e2b_sdk_check.mjs` asserts every answer.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::{FakeE2b, KEY, node_sdk};

#[test]
fn the_official_npm_sdk_agrees_with_the_fake() {
    let fake = FakeE2b::start();
    let env = [("E2B_API_URL", fake.api_url()), ("E2B_SANDBOX_URL", fake.sandbox_url()), ("E2B_API_KEY", KEY.into())];
    let stdout = node_sdk::run_check("e2b_sdk_check.mjs", fake.root.parent().unwrap(), &env);
    let observed: Value = serde_json::from_str(stdout.lines().last().unwrap().strip_prefix("OK ").unwrap()).unwrap();
    let id = observed["sandbox_id"].as_str().unwrap();

    // The first create has a wrong key and is refused; the second makes the sandbox.
    let records = fake.records();
    assert_eq!((&records[0]["path"], &records[1]["path"]), (&json!("/v2/sandboxes"), &json!("/v2/sandboxes")));
    assert_eq!(records[1]["headers"]["x-api-key"], KEY);
    assert_eq!(
        serde_json::from_str::<Value>(records[1]["body"].as_str().unwrap()).unwrap(),
        json!({"templateID": "base", "timeout": 600, "autoPause": true, "autoResume": {"enabled": true},
               "metadata": {"zed_session": "npm-sdk-check"}, "envVars": {"SANDBOX_WIDE": "from-create"}})
    );
    for record in &records {
        assert_eq!(record["headers"]["user-agent"], "e2b-js-sdk/2.51.0", "{record}");
    }
    let calls: Vec<String> = records
        .iter()
        .map(|r| {
            let path = r["path"].as_str().unwrap().split('?').next().unwrap();
            format!("{} {} {path}", r["port"].as_str().unwrap(), r["method"].as_str().unwrap())
        })
        .collect();
    for call in [
        "envd GET /health".to_string(),
        "envd POST /files".to_string(),
        "envd POST /process.Process/SendInput".to_string(),
        "envd POST /process.Process/CloseStdin".to_string(),
        "envd POST /process.Process/Connect".to_string(),
        format!("api POST /sandboxes/{id}/pause"),
        format!("api POST /v2/sandboxes/{id}/connect"),
        format!("api DELETE /sandboxes/{id}"),
    ] {
        assert!(calls.contains(&call), "the SDK never made {call}: {calls:#?}");
    }
    // The SDK's sandbox is gone: the fake killed what the SDK killed.
    assert_eq!(fake.state(), json!({}));
}
