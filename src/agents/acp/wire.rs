//! `session/new`, `session/load` and `session/resume` as the bridge sends them to an ACP agent, with their answers read
//! for what the pinned schema leaves out (the unstable `models` that Gemini CLI still says), `session/set_model`, and
//! the bridge's own `_acp-sandbox/sync`.

use agent_client_protocol::v1::schema::{
    LoadSessionRequest, NewSessionRequest, ResumeSessionRequest, SessionConfigOption, SessionModeState,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::options::{ModelState, Selectors};

/// `session/new`.
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcRequest)]
#[request(method = "session/new", response = Opened)]
#[serde(transparent)]
pub struct New(pub NewSessionRequest);

/// `session/load`.
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcRequest)]
#[request(method = "session/load", response = Opened)]
#[serde(transparent)]
pub struct Load(pub LoadSessionRequest);

/// `session/resume`.
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcRequest)]
#[request(method = "session/resume", response = Opened)]
#[serde(transparent)]
pub struct Resume(pub ResumeSessionRequest);

/// The answer to any of them. What does not parse is left out, as the schema's own types do, so that one odd field
/// does not lose the session.
#[derive(Debug, Clone, Default, Serialize, Deserialize, agent_client_protocol::JsonRpcResponse)]
#[serde(rename_all = "camelCase")]
pub struct Opened {
    /// The session made (`session/new` only).
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    modes: Value,
    #[serde(default)]
    models: Value,
    #[serde(default)]
    config_options: Value,
}

impl Opened {
    /// What the agent said its session's settings are.
    pub fn selectors(&self) -> Selectors {
        let options = self.config_options.as_array().map(|all| {
            all.iter().filter_map(|o| serde_json::from_value::<SessionConfigOption>(o.clone()).ok()).collect()
        });
        Selectors {
            options,
            modes: serde_json::from_value::<SessionModeState>(self.modes.clone()).ok(),
            models: serde_json::from_value::<ModelState>(self.models.clone()).ok(),
        }
    }
}

/// `session/set_model`, the unstable method an agent that says `models` takes.
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcRequest)]
#[request(method = "session/set_model", response = ModelSet)]
#[serde(rename_all = "camelCase")]
pub struct SetModel {
    /// The agent's session.
    pub session_id: String,
    /// One of its models.
    pub model_id: String,
}

/// Its answer: nothing.
#[derive(Debug, Clone, Default, Serialize, Deserialize, agent_client_protocol::JsonRpcResponse)]
pub struct ModelSet {}

/// A request of the bridge's own that no agent knows (an extension method): whatever its answer (an error as a rule),
/// it comes after everything the agent wrote before it read the request, so it marks the end of what the agent sent
/// on its own before (Gemini CLI replays a loaded session after its answer to `session/load`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, agent_client_protocol::JsonRpcRequest)]
#[request(method = "_acp-sandbox/sync", response = Synced)]
pub struct Sync {}

/// Its answer, should an agent give one.
#[derive(Debug, Clone, Default, Serialize, Deserialize, agent_client_protocol::JsonRpcResponse)]
pub struct Synced {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_answer_with_models_and_an_odd_option_keeps_what_parses() {
        let opened: Opened = serde_json::from_value(json!({
            "sessionId": "s1",
            "modes": {"currentModeId": "default", "availableModes": [{"id": "default", "name": "Default"}]},
            "models": {"currentModelId": "m1", "availableModels": [{"modelId": "m1", "name": "One"}]},
            "configOptions": [
                {"id": "effort", "name": "Effort", "type": "select", "currentValue": "low",
                 "options": [{"value": "low", "name": "Low"}]},
                {"id": "odd", "type": "dial"}
            ]
        }))
        .unwrap();
        let selectors = opened.selectors();
        assert_eq!(opened.session_id.as_deref(), Some("s1"));
        assert_eq!(selectors.options.as_ref().map(|o| o.len()), Some(1));
        assert_eq!(selectors.modes.unwrap().current_mode_id.to_string(), "default");
        assert_eq!(selectors.models.unwrap().available_models[0].name, "One");
        let bare: Opened = serde_json::from_value(json!({"modes": "nonsense"})).unwrap();
        assert_eq!(bare.selectors(), Selectors::default());
    }
}
