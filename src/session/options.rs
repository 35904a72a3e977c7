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

/// Session modes said as an option (an ACP agent's own options, its modes among them): the option of the mode
/// category as ACP session modes, for the clients that read only those.
pub fn modes_of(options: &[SessionConfigOption]) -> Option<agent_client_protocol::v1::schema::SessionModeState> {
    use agent_client_protocol::v1::schema::{
        SessionConfigKind, SessionConfigOptionCategory, SessionMode, SessionModeState,
    };
    let option = options.iter().find(|o| o.category == Some(SessionConfigOptionCategory::Mode))?;
    let SessionConfigKind::Select(select) = &option.kind else { return None };
    let modes = crate::agents::options::select_choices(select)
        .into_iter()
        .map(|choice| SessionMode::new(choice.value.to_string(), choice.name).description(choice.description))
        .collect();
    Some(SessionModeState::new(select.current_value.to_string(), modes))
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
    // A choice the change takes away (a model's reasoning level the new model lacks) is forgotten, so that the agent
    // gets its default instead of a value it would refuse; a value it never offered stays as it was.
    let after = self::specs(agent, &updated, config, models);
    for before in specs.iter().filter(|spec| spec.id != option) {
        let Some(value) = stored(&updated, before.id) else { continue };
        let offered = |spec: &OptionSpec| spec.choices.iter().any(|(choice, _)| choice == value);
        let gone = match after.iter().find(|spec| spec.id == before.id) {
            None => true,
            Some(now) => offered(before) && !offered(now),
        };
        if gone && let Some(object) = updated.as_object_mut() {
            object.remove(before.id);
        }
    }
    Ok(updated)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test-only agent: a model choice over the models given, a mode, and a reasoning level where the chosen
    /// model has levels.
    fn scripted() -> AgentKind {
        AgentKind::parse("scripted").unwrap()
    }

    fn config() -> Config {
        Config::new(scripted(), "/nonexistent/data".into())
    }

    fn models() -> Vec<ModelInfo> {
        let mut thinker = ModelInfo::named("fake/thinker");
        thinker.name = "Thinker".into();
        thinker.variants = vec!["low".into(), "high".into()];
        let mut small = ModelInfo::named("fake/small");
        small.variants = vec!["low".into()];
        vec![ModelInfo::named("fake/fake-model"), thinker, small]
    }

    fn ids(options: &[SessionConfigOption]) -> Vec<String> {
        options.iter().map(|o| serde_json::to_value(o).unwrap()["id"].as_str().unwrap().to_string()).collect()
    }

    #[test]
    fn each_declared_option_is_rendered_as_a_select_with_its_category_current_value_and_choices() {
        let value = serde_json::to_value(config_options(scripted(), &json!({}), &config(), &models())).unwrap();
        assert_eq!(
            value,
            json!([
                {"id": "model", "name": "Model", "category": "model", "type": "select", "currentValue": "default",
                 "options": [{"value": "default", "name": "Default"}, {"value": "fake/fake-model", "name": "fake/fake-model"},
                             {"value": "fake/thinker", "name": "Thinker"}, {"value": "fake/small", "name": "fake/small"}]},
                {"id": "mode", "name": "Mode", "category": "mode", "type": "select", "currentValue": "fast",
                 "options": [{"value": "fast", "name": "Fast"}, {"value": "careful", "name": "Careful"}]}
            ])
        );
    }

    #[test]
    fn a_stored_value_the_agent_does_not_offer_stays_selectable() {
        let session = json!({"mode": "turbo"});
        let value = serde_json::to_value(config_options(scripted(), &session, &config(), &models())).unwrap();
        assert_eq!(value[1]["currentValue"], "turbo");
        assert_eq!(value[1]["options"][2], json!({"value": "turbo", "name": "turbo"}));
    }

    #[test]
    fn apply_stores_an_offered_value_and_refuses_anything_else_in_words() {
        let (config, models) = (config(), models());
        let updated = apply(scripted(), &json!({}), "model", "fake/thinker", &config, &models).unwrap();
        assert_eq!(updated, json!({"model": "fake/thinker"}));
        assert_eq!(ids(&config_options(scripted(), &updated, &config, &models)), ["model", "mode", "variant"]);
        let refused = |option, value| match apply(scripted(), &updated, option, value, &config, &models) {
            Err(Error::InvalidParams(message)) => message,
            other => panic!("{other:?}"),
        };
        assert_eq!(refused("model", "nope/nope"), r#""nope/nope" is not a value of model"#);
        assert_eq!(refused("speed", "x"), r#"Scripted has no config option "speed""#);
    }

    #[test]
    fn a_choice_the_change_takes_away_is_forgotten_and_one_it_keeps_stays() {
        let (config, models) = (config(), models());
        let session = json!({"model": "fake/thinker", "variant": "high", "mode": "careful"});
        let kept = apply(scripted(), &session, "model", "fake/small", &config, &models).unwrap();
        assert_eq!(kept, json!({"model": "fake/small", "mode": "careful"}), "fake/small has no `high`");
        let session = json!({"model": "fake/thinker", "variant": "low"});
        let kept = apply(scripted(), &session, "model", "fake/small", &config, &models).unwrap();
        assert_eq!(kept, json!({"model": "fake/small", "variant": "low"}));
        let gone = apply(scripted(), &kept, "model", "fake/fake-model", &config, &models).unwrap();
        assert_eq!(gone, json!({"model": "fake/fake-model"}), "a model without levels offers no reasoning option");
    }

    #[test]
    fn an_agents_own_mode_option_is_said_as_session_modes_whatever_its_id() {
        let options: Vec<SessionConfigOption> = serde_json::from_value(json!([
            {"id": "fast", "name": "Fast", "type": "boolean", "currentValue": false},
            {"id": "permission", "name": "Mode", "category": "mode", "type": "select", "currentValue": "plan",
             "options": [{"value": "default", "name": "Ask", "description": "Asks first"}, {"value": "plan", "name": "Plan"}]}
        ]))
        .unwrap();
        assert_eq!(
            serde_json::to_value(modes_of(&options)).unwrap(),
            json!({"currentModeId": "plan", "availableModes": [
                {"id": "default", "name": "Ask", "description": "Asks first"}, {"id": "plan", "name": "Plan"}]})
        );
        assert_eq!(modes_of(&options[..1]), None);
    }

    #[test]
    fn the_mode_option_is_also_said_as_session_modes_with_their_descriptions() {
        let modes = session_modes(scripted(), &json!({"mode": "careful"}), &config(), &models()).unwrap();
        assert_eq!(
            serde_json::to_value(modes).unwrap(),
            json!({"currentModeId": "careful", "availableModes": [
                {"id": "fast", "name": "Fast", "description": "Answers at once"},
                {"id": "careful", "name": "Careful", "description": "Thinks first"}
            ]})
        );
    }
}
