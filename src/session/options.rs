//! Session config options (ACP `configOptions`): OpenCode's model, Amp's mode.
//!
//! Values persist in the session's config object and apply from the next turn on.

use agent_client_protocol::v1::schema::{
    SessionConfigKind, SessionConfigOption, SessionConfigOptionCategory, SessionConfigSelect, SessionConfigSelectOption,
};
use serde_json::{Value, json};

use crate::agents::AgentKind;
use crate::config::Config;
use crate::error::{Error, Result};

/// The value meaning "let the CLI use its own default".
pub const DEFAULT: &str = "default";

/// The config key each agent offers.
pub fn default_key(agent: AgentKind) -> &'static str {
    match agent {
        AgentKind::Amp => "mode",
        AgentKind::OpenCode => "model",
    }
}

/// The choices for an agent's option: (value, name).
fn choices(agent: AgentKind, config: &Config) -> Vec<(String, String)> {
    match agent {
        AgentKind::Amp => config.amp_modes.iter().map(|mode| (mode.clone(), capitalize(mode))).collect(),
        AgentKind::OpenCode => {
            let mut choices = vec![(DEFAULT.to_string(), "OpenCode default".to_string())];
            for model in &config.opencode_models {
                choices.push((model.clone(), model.clone()));
            }
            choices
        }
    }
}

fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// The current value of the agent's option in a session config.
pub fn current(agent: AgentKind, session_config: &Value, config: &Config) -> String {
    let stored = session_config.get(default_key(agent)).and_then(Value::as_str);
    match (agent, stored) {
        (_, Some(value)) => value.to_string(),
        (AgentKind::Amp, None) => config.amp_modes.first().cloned().unwrap_or_else(|| "medium".into()),
        (AgentKind::OpenCode, None) => DEFAULT.to_string(),
    }
}

/// The complete option list of a session.
pub fn config_options(agent: AgentKind, session_config: &Value, config: &Config) -> Vec<SessionConfigOption> {
    let mut choices = choices(agent, config);
    let current = current(agent, session_config, config);
    if !choices.iter().any(|(value, _)| *value == current) {
        // A value set on the command line or by an older configuration stays selectable.
        choices.push((current.clone(), current.clone()));
    }
    let (name, category) = match agent {
        AgentKind::Amp => ("Mode", SessionConfigOptionCategory::Mode),
        AgentKind::OpenCode => ("Model", SessionConfigOptionCategory::Model),
    };
    let options: Vec<SessionConfigSelectOption> =
        choices.into_iter().map(|(value, name)| SessionConfigSelectOption::new(value, name)).collect();
    vec![
        SessionConfigOption::new(
            default_key(agent),
            name,
            SessionConfigKind::Select(SessionConfigSelect::new(current, options)),
        )
        .category(category),
    ]
}

/// Applies a change, returning the new session config. Unknown options or values are invalid params.
pub fn apply(agent: AgentKind, session_config: &Value, option: &str, value: &str, config: &Config) -> Result<Value> {
    if option != default_key(agent) {
        return Err(Error::InvalidParams(format!("{} has no config option {option:?}", agent.display_name())));
    }
    let known = choices(agent, config).iter().any(|(choice, _)| choice == value)
        || current(agent, session_config, config) == value;
    if !known {
        return Err(Error::InvalidParams(format!("{value:?} is not a value of {option}")));
    }
    let mut updated = if session_config.is_object() { session_config.clone() } else { json!({}) };
    updated[option] = json!(value);
    Ok(updated)
}

/// The model to pass to OpenCode, if one was chosen.
pub fn opencode_model(session_config: &Value) -> Option<&str> {
    session_config.get("model").and_then(Value::as_str).filter(|model| *model != DEFAULT)
}

/// The mode to pass to Amp, if one was chosen.
pub fn amp_mode(session_config: &Value) -> Option<&str> {
    session_config.get("mode").and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let mut config = Config::new(AgentKind::OpenCode, "/tmp/x".into());
        config.opencode_models = vec!["fake/fake-model".into()];
        config
    }

    #[test]
    fn opencode_offers_default_and_configured_models() {
        let options = config_options(AgentKind::OpenCode, &json!({}), &config());
        let value = serde_json::to_value(&options).unwrap();
        assert_eq!(value[0]["id"], "model");
        assert_eq!(value[0]["category"], "model");
        assert_eq!(value[0]["currentValue"], "default");
        assert_eq!(value[0]["options"][1]["value"], "fake/fake-model");
    }

    #[test]
    fn apply_validates_and_persists() {
        let updated = apply(AgentKind::OpenCode, &json!({}), "model", "fake/fake-model", &config()).unwrap();
        assert_eq!(opencode_model(&updated), Some("fake/fake-model"));
        assert!(apply(AgentKind::OpenCode, &json!({}), "model", "nope/nope", &config()).is_err());
        assert!(apply(AgentKind::OpenCode, &json!({}), "mode", "x", &config()).is_err());
        let amp = apply(AgentKind::Amp, &json!({}), "mode", "high", &config()).unwrap();
        assert_eq!(amp_mode(&amp), Some("high"));
    }
}
