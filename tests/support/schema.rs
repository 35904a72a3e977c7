//! The ACP JSON Schemas every message of the bridge is validated against.
//!
//! They are generated from the pinned `agent-client-protocol` crate (its `schemars` feature) and checked in under
//! `schemas/acp/`; `e2e::schemas` fails when the files drift from the crate (`UPDATE_SCHEMAS=1` rewrites them).
//! The harness validates against the checked-in files, so what the tests enforce is visible in the repository.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use agent_client_protocol::v1::schema as acp;
use serde_json::Value;

/// Where the generated schemas live.
pub fn schema_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas/acp")
}

macro_rules! schemas_of {
    ($($ty:ident),* $(,)?) => {
        vec![$((stringify!($ty), serde_json::to_value(schemars::schema_for!(acp::$ty)).expect("schema to JSON"))),*]
    };
}

/// Regenerates every schema from the crate: `(type name, schema)`, one file `schemas/acp/<name>.json` each.
pub fn generate() -> Vec<(&'static str, Value)> {
    schemas_of![
        // Agent -> client notifications and requests.
        SessionNotification,
        RequestPermissionRequest,
        WriteTextFileRequest,
        CreateElicitationRequest,
        // Responses to the client's requests.
        InitializeResponse,
        AuthenticateResponse,
        NewSessionResponse,
        LoadSessionResponse,
        ResumeSessionResponse,
        ListSessionsResponse,
        PromptResponse,
        SetSessionModeResponse,
        SetSessionConfigOptionResponse,
        CloseSessionResponse,
        DeleteSessionResponse,
        ForkSessionResponse,
        // The JSON-RPC error object.
        Error,
    ]
}

/// The schema a successful response to `method` must match.
pub fn response_schema(method: &str) -> Option<&'static str> {
    Some(match method {
        "initialize" => "InitializeResponse",
        "authenticate" => "AuthenticateResponse",
        "session/new" => "NewSessionResponse",
        "session/load" => "LoadSessionResponse",
        "session/resume" => "ResumeSessionResponse",
        "session/list" => "ListSessionsResponse",
        "session/prompt" => "PromptResponse",
        "session/set_mode" => "SetSessionModeResponse",
        "session/set_config_option" => "SetSessionConfigOptionResponse",
        "session/close" => "CloseSessionResponse",
        "session/delete" => "DeleteSessionResponse",
        "session/fork" => "ForkSessionResponse",
        _ => return None,
    })
}

/// Compiled validators for the checked-in schema files.
pub struct Schemas {
    validators: HashMap<String, jsonschema::Validator>,
}

impl Schemas {
    /// The validators, compiled once per test binary.
    pub fn get() -> &'static Schemas {
        static SCHEMAS: OnceLock<Schemas> = OnceLock::new();
        SCHEMAS.get_or_init(|| {
            let validators = generate()
                .into_iter()
                .map(|(name, _)| {
                    let path = schema_dir().join(format!("{name}.json"));
                    let text = std::fs::read_to_string(&path)
                        .unwrap_or_else(|e| panic!("read {}: {e} (run with UPDATE_SCHEMAS=1)", path.display()));
                    let schema: Value = serde_json::from_str(&text).expect("schema file is JSON");
                    let validator = jsonschema::validator_for(&schema)
                        .unwrap_or_else(|e| panic!("compile {}: {e}", path.display()));
                    (name.to_string(), validator)
                })
                .collect();
            Schemas { validators }
        })
    }

    /// Checks `instance` against the schema `name`, describing every violation on failure.
    pub fn validate(&self, name: &str, instance: &Value) -> Result<(), String> {
        let validator = self.validators.get(name).unwrap_or_else(|| panic!("no schema named {name}"));
        let errors: Vec<String> =
            validator.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect();
        if errors.is_empty() { Ok(()) } else { Err(format!("does not match {name}: {}", errors.join("; "))) }
    }
}
