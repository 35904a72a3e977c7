//! Session config options (ACP `configOptions`, and the same choice as ACP session modes): what the session's agent
//! declares ([`crate::agents::Agent::options`]), rendered for the editor and checked when the editor sets one.
//!
//! Values persist in the session's config object and apply from the next turn on.

use agent_client_protocol::v1::schema::{
    SessionConfigKind, SessionConfigOption, SessionConfigSelect, SessionConfigSelectOption,
};
use serde_json::{Value, json};

use crate::agents::options::{DEFAULT, stored};
use crate::agents::{AgentKind, ModelInfo, OptionSpec};
use crate::config::Config;
use crate::error::{Error, Result};

fn specs(agent: AgentKind, session_config: &Value, config: &Config, models: &[ModelInfo]) -> Vec<OptionSpec> {
    agent.options(session_config, &config.agents, models)
}

/// What is known about the model the session uses (`default`: the agent's configured default model), for an
/// agent with a model choice.
pub fn model_info(
    agent: AgentKind,
    session_config: &Value,
    config: &Config,
    models: &[ModelInfo],
) -> Option<ModelInfo> {
    let chosen = agent.chosen_model(session_config)?;
    let id = if chosen == DEFAULT { agent.default_model(&config.agents)? } else { chosen };
    models.iter().find(|info| info.id == id).cloned()
}

/// The complete option list of a session.
pub fn config_options(
    agent: AgentKind,
    session_config: &Value,
    config: &Config,
    models: &[ModelInfo],
) -> Vec<SessionConfigOption> {
    specs(agent, session_config, config, models)
        .into_iter()
        .map(|mut spec| {
            if !spec.choices.iter().any(|(value, _)| *value == spec.current) {
                // A value set on the command line or by an older configuration stays selectable.
                spec.choices.push((spec.current.clone(), spec.current.clone()));
            }
            let options: Vec<SessionConfigSelectOption> =
                spec.choices.into_iter().map(|(value, name)| SessionConfigSelectOption::new(value, name)).collect();
            SessionConfigOption::new(
                spec.id,
                spec.name,
                SessionConfigKind::Select(SessionConfigSelect::new(spec.current, options)),
            )
            .category(spec.category)
        })
        .collect()
}

/// The session's mode option as ACP session modes (`modes` of new/load/resume, `session/set_mode`): several
/// clients read only one of the two, so both say the same.
pub fn session_modes(
    agent: AgentKind,
    session_config: &Value,
    config: &Config,
    models: &[ModelInfo],
) -> Option<agent_client_protocol::v1::schema::SessionModeState> {
    use agent_client_protocol::v1::schema::{SessionMode, SessionModeState};
    let spec = specs(agent, session_config, config, models).into_iter().find(|spec| spec.id == "mode")?;
    let modes = spec
        .choices
        .iter()
        .map(|(id, name)| {
            let description = agent.mode_description(id).map(str::to_string);
            SessionMode::new(id.clone(), name.clone()).description(description)
        })
        .collect();
    Some(SessionModeState::new(spec.current, modes))
}

/// Applies a change, returning the new session config. Unknown options or values are invalid params.
pub fn apply(
    agent: AgentKind,
    session_config: &Value,
    option: &str,
    value: &str,
    config: &Config,
    models: &[ModelInfo],
) -> Result<Value> {
    let specs = specs(agent, session_config, config, models);
    let Some(spec) = specs.iter().find(|spec| spec.id == option) else {
        return Err(Error::InvalidParams(format!("{} has no config option {option:?}", agent.display_name())));
    };
    if spec.current != value && !spec.choices.iter().any(|(choice, _)| choice == value) {
        return Err(Error::InvalidParams(format!("{value:?} is not a value of {option}")));
    }
    let mut updated = if session_config.is_object() { session_config.clone() } else { json!({}) };
    updated[option] = json!(value);
    if option == "model"
        && let Some(variant) = stored(&updated, "variant")
        && !model_info(agent, &updated, config, models).is_some_and(|info| info.variants.iter().any(|v| v == variant))
        && let Some(object) = updated.as_object_mut()
    {
        // The new model has no such variant.
        object.remove("variant");
    }
    Ok(updated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::opencode::options::{
        agent as opencode_agent, model as opencode_model, variant as opencode_variant,
    };
    use crate::agents::options::{APPROVALS_ASK, approvals};

    fn opencode() -> AgentKind {
        AgentKind::parse("opencode").unwrap()
    }

    fn config() -> Config {
        Config::new(opencode(), "/tmp/x".into())
    }

    fn models() -> Vec<ModelInfo> {
        let mut thinker = ModelInfo::named("fake/thinker");
        thinker.name = "Thinker".into();
        thinker.variants = vec!["low".into(), "high".into()];
        vec![ModelInfo::named("fake/fake-model"), thinker]
    }

    #[test]
    fn opencode_offers_default_and_the_models_it_can_use() {
        let options = config_options(opencode(), &json!({}), &config(), &models());
        let value = serde_json::to_value(&options).unwrap();
        let ids: Vec<&str> = value.as_array().unwrap().iter().map(|o| o["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["model", "mode", "approvals"], "no variants for the default model");
        assert_eq!(value[1]["category"], "mode");
        assert_eq!(value[1]["currentValue"], "build");
        assert_eq!(value[2]["currentValue"], "auto");
        assert!(value[2].get("category").is_none(), "{value}");
        assert_eq!(value[0]["category"], "model");
        assert_eq!(value[0]["currentValue"], "default");
        assert_eq!(value[0]["options"][1]["value"], "fake/fake-model");
        assert_eq!(value[0]["options"][2]["name"], "Thinker");
    }

    #[test]
    fn mode_and_approvals_are_stored_and_approvals_exist_only_with_the_server_backend() {
        let (mut config, models) = (config(), models());
        let session = apply(opencode(), &json!({}), "mode", "plan", &config, &models).unwrap();
        assert_eq!(opencode_agent(&session), Some("plan"));
        let session = apply(opencode(), &session, "approvals", "ask", &config, &models).unwrap();
        assert_eq!(approvals(&session), APPROVALS_ASK);
        assert!(apply(opencode(), &session, "mode", "yolo", &config, &models).is_err());
        config.agents.opencode.opencode_backend = crate::agents::opencode::Backend::Run;
        let ids: Vec<String> = config_options(opencode(), &session, &config, &models)
            .iter()
            .map(|o| serde_json::to_value(o).unwrap()["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids, ["model", "mode"], "`run` cannot ask, so it offers no approvals");
    }

    #[test]
    fn a_model_with_variants_offers_a_reasoning_option() {
        let (config, models) = (config(), models());
        let session = apply(opencode(), &json!({}), "model", "fake/thinker", &config, &models).unwrap();
        let value = serde_json::to_value(config_options(opencode(), &session, &config, &models)).unwrap();
        assert_eq!(value[1]["id"], "variant");
        assert_eq!(value[1]["category"], "thought_level");
        let session = apply(opencode(), &session, "variant", "high", &config, &models).unwrap();
        assert_eq!(opencode_variant(&session), Some("high"));
        let session = apply(opencode(), &session, "model", "fake/fake-model", &config, &models).unwrap();
        assert_eq!(opencode_variant(&session), None, "a variant the new model lacks is dropped");
    }

    #[test]
    fn the_default_model_is_the_users_configured_one() {
        let mut config = config();
        config.agents.opencode.default_model = Some("fake/thinker".into());
        let value = serde_json::to_value(config_options(opencode(), &json!({}), &config, &models())).unwrap();
        assert_eq!(value[1]["id"], "variant", "the default model's variants are offered");
    }

    #[test]
    fn apply_validates_and_persists() {
        let (config, models) = (config(), models());
        let updated = apply(opencode(), &json!({}), "model", "fake/fake-model", &config, &models).unwrap();
        assert_eq!(opencode_model(&updated), Some("fake/fake-model"));
        assert!(apply(opencode(), &json!({}), "model", "nope/nope", &config, &models).is_err());
        assert!(apply(opencode(), &json!({}), "mode", "x", &config, &models).is_err());
        let amp = AgentKind::parse("amp").unwrap();
        let amp = apply(amp, &json!({}), "mode", "high", &config, &models).unwrap();
        assert_eq!(stored(&amp, "mode"), Some("high"));
    }
}
