//! What an ACP agent offers of itself (what a prompt may hold, what its sessions can do, the modes and options a new
//! session of it starts with), known before it starts: what the same agent (its command line and version) announced
//! last, kept in the store, else what the agents the project installs are known to announce (their folder's table).

use agent_client_protocol::v1::schema::{AgentCapabilities, PromptCapabilities, SessionCapabilities};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::options::Selectors;

/// What an agent announced of itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Offers {
    /// Its `initialize` answer's `promptCapabilities`.
    #[serde(default)]
    pub prompt_capabilities: PromptCapabilities,
    /// Its `initialize` answer's `sessionCapabilities`.
    #[serde(default)]
    pub session_capabilities: SessionCapabilities,
    /// Its modes, options and models as its last `session/new` answered them, in a session's stored config's shape
    /// ([`Selectors::keep`]).
    #[serde(default)]
    pub session: Value,
}

impl Offers {
    /// What an agent that answered `initialize` with `capabilities` and `session/new` with `selectors` offers.
    pub fn of(capabilities: &AgentCapabilities, selectors: &Selectors) -> Self {
        let mut session = serde_json::json!({});
        selectors.keep(&mut session);
        Self {
            prompt_capabilities: capabilities.prompt_capabilities.clone(),
            session_capabilities: capabilities.session_capabilities.clone(),
            session,
        }
    }

    /// An agent folder's table, or what the store kept: `None` when it is not one.
    pub fn parse(value: Value) -> Option<Self> {
        serde_json::from_value(value).ok()
    }

    /// The modes, options and models a new session of it starts with; `None`: it said none.
    pub fn selectors(&self) -> Option<Selectors> {
        let selectors = Selectors::stored(&self.session);
        (selectors != Selectors::default()).then_some(selectors)
    }

    /// What a new session's stored config starts with: its [`Offers::selectors`].
    pub fn seeded_config(&self) -> Option<Value> {
        let mut config = serde_json::json!({});
        self.selectors()?.keep(&mut config);
        Some(config)
    }

    /// As the store keeps it.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_an_agent_announced_round_trips_through_the_store_and_seeds_a_new_session() {
        let capabilities: AgentCapabilities = serde_json::from_value(json!({
            "loadSession": true,
            "promptCapabilities": {"image": true, "audio": true, "embeddedContext": true},
            "sessionCapabilities": {"systemPrompt": {"mode": {"override": {}}}, "list": {}},
        }))
        .unwrap();
        let selectors = Selectors::stored(&json!({
            "agent_modes": {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Default"}, {"id": "plan", "name": "Plan"}]},
        }));
        let offers = Offers::of(&capabilities, &selectors);
        let kept = offers.to_value();
        assert_eq!(kept["promptCapabilities"], json!({"image": true, "audio": true, "embeddedContext": true}));
        assert_eq!(kept["sessionCapabilities"]["systemPrompt"], json!({"mode": {"override": {}}}));
        let back = Offers::parse(kept).unwrap();
        assert_eq!(back, offers);
        assert_eq!(back.selectors(), Some(selectors.clone()));
        let seeded = back.seeded_config().unwrap();
        assert_eq!(Selectors::stored(&seeded), selectors);
        assert_eq!(Selectors::stored(&seeded).value("mode").as_deref(), Some("default"));
    }

    #[test]
    fn the_tables_of_the_pinned_agents_are_offers_with_their_modes() {
        for (table, image, audio, mode) in [
            (crate::agents::claude::offers(), true, false, "default"),
            (crate::agents::codex::offers(), true, false, "agent-full-access"),
            (crate::agents::gemini::offers(), true, true, "default"),
        ] {
            let offers = Offers::parse(table.clone()).unwrap_or_else(|| panic!("not offers: {table:#}"));
            assert_eq!((offers.prompt_capabilities.image, offers.prompt_capabilities.audio), (image, audio));
            assert!(offers.prompt_capabilities.embedded_context);
            let selectors = offers.selectors().unwrap();
            assert_eq!(selectors.value("mode").as_deref(), Some(mode), "{table:#}");
            assert!(selectors.offered().iter().all(|o| o.id.to_string() != "model"), "models come from a run");
        }
        let claude = Offers::parse(crate::agents::claude::offers()).unwrap();
        assert!(claude.session_capabilities.system_prompt.and_then(|p| p.mode).and_then(|m| m.override_).is_some());
    }

    #[test]
    fn an_agent_that_said_no_modes_seeds_nothing_and_garbage_is_no_offer() {
        let offers = Offers::parse(json!({"promptCapabilities": {"image": true}})).unwrap();
        assert!(offers.prompt_capabilities.image);
        assert!(!offers.prompt_capabilities.audio);
        assert_eq!(offers.selectors(), None);
        assert_eq!(offers.seeded_config(), None);
        assert_eq!(Offers::parse(json!({"promptCapabilities": "yes"})), None);
    }
}
