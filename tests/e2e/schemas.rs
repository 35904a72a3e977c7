//! The checked-in ACP JSON Schemas (`schemas/acp/*.json`) must be exactly what the pinned crate generates.

use crate::support::schema::{generate, schema_dir};

#[test]
fn checked_in_acp_schemas_match_the_pinned_crate() {
    let update = std::env::var_os("UPDATE_SCHEMAS").is_some();
    let dir = schema_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let mut stale = Vec::new();
    for (name, schema) in generate() {
        let path = dir.join(format!("{name}.json"));
        let expected = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        if actual != expected {
            if update {
                std::fs::write(&path, &expected).unwrap();
            } else {
                stale.push(path.display().to_string());
            }
        }
    }
    assert!(
        stale.is_empty(),
        "these schema files differ from the pinned agent-client-protocol crate; \
         regenerate them with `UPDATE_SCHEMAS=1 cargo test --test e2e schemas`:\n{}",
        stale.join("\n")
    );
}

/// The validation the harness applies to every message is not vacuous: messages the crate itself serializes pass,
/// and malformed ones are rejected.
#[test]
fn schema_validation_accepts_crate_messages_and_rejects_malformed_ones() {
    use agent_client_protocol::v1::schema as acp;
    use serde_json::json;

    let schemas = crate::support::schema::Schemas::get();
    let chunk = acp::SessionNotification::new(
        acp::SessionId::new("s-1"),
        acp::SessionUpdate::AgentMessageChunk(acp::ContentChunk::new("hello".into())),
    );
    schemas.validate("SessionNotification", &serde_json::to_value(&chunk).unwrap()).unwrap();
    let done = acp::PromptResponse::new(acp::StopReason::Cancelled);
    schemas.validate("PromptResponse", &serde_json::to_value(&done).unwrap()).unwrap();
    let not_found = acp::Error::session_not_found("s-9");
    schemas.validate("Error", &serde_json::to_value(&not_found).unwrap()).unwrap();

    for (schema, bad) in [
        ("PromptResponse", json!({"stopReason": "finished"})),
        ("PromptResponse", json!({})),
        ("SessionNotification", json!({"sessionId": "s-1", "update": {"sessionUpdate": "agent_message_chunk"}})),
        (
            "SessionNotification",
            json!({"update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}}),
        ),
        ("NewSessionResponse", json!({"sessionId": 42})),
        ("Error", json!({"message": "no code"})),
        ("InitializeResponse", json!({"agentCapabilities": {}})),
    ] {
        assert!(schemas.validate(schema, &bad).is_err(), "{schema} accepted {bad}");
    }
}
