//! Session config options (ACP `configOptions`): OpenCode's model and its variant, Amp's mode.
//!
//! Values persist in the session's config object and apply from the next turn on.

use agent_client_protocol::v1::schema::{
    SessionConfigKind, SessionConfigOption, SessionConfigOptionCategory, SessionConfigSelect, SessionConfigSelectOption,
};
use serde_json::{Value, json};

use crate::agents::AgentKind;
use crate::agents::opencode::catalog::ModelInfo;
use crate::config::Config;
use crate::error::{Error, Result};

/// The value meaning "let the CLI use its own default".
pub const DEFAULT: &str = "default";

/// The config key set by `--model` for each agent.
pub fn default_key(agent: AgentKind) -> &'static str {
    match agent {
        AgentKind::Amp => "mode",
        AgentKind::OpenCode => "model",
    }
}

/// One option as offered: its choices and current value.
struct Spec {
    id: &'static str,
    name: &'static str,
    category: Option<SessionConfigOptionCategory>,
    choices: Vec<(String, String)>,
    current: String,
}

fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn stored<'a>(session_config: &'a Value, key: &str) -> Option<&'a str> {
    session_config.get(key).and_then(Value::as_str)
}

/// The options of a session, in display order. `models` are the OpenCode models it can use.
fn specs(agent: AgentKind, session_config: &Value, config: &Config, models: &[ModelInfo]) -> Vec<Spec> {
    match agent {
        AgentKind::Amp => {
            let choices: Vec<(String, String)> =
                config.amp_modes.iter().map(|mode| (mode.clone(), capitalize(mode))).collect();
            let fallback = choices.first().map(|(value, _)| value.clone()).unwrap_or_else(|| "medium".into());
            let current = stored(session_config, "mode").map(str::to_string).unwrap_or(fallback);
            vec![Spec { id: "mode", name: "Mode", category: Some(SessionConfigOptionCategory::Mode), choices, current }]
        }
        AgentKind::OpenCode => {
            let mut choices = vec![(DEFAULT.to_string(), "OpenCode default".to_string())];
            choices.extend(models.iter().map(|model| (model.id.clone(), model.name.clone())));
            let model = stored(session_config, "model").unwrap_or(DEFAULT).to_string();
            let mut specs = Vec::new();
            let variants = model_info(&model, config, models).map(|info| &info.variants).filter(|v| !v.is_empty());
            specs.push(Spec {
                id: "model",
                name: "Model",
                category: Some(SessionConfigOptionCategory::Model),
                choices,
                current: model,
            });
            if let Some(variants) = variants {
                let mut choices = vec![(DEFAULT.to_string(), "Default".to_string())];
                choices.extend(variants.iter().map(|variant| (variant.clone(), capitalize(variant))));
                specs.push(Spec {
                    id: "variant",
                    name: "Reasoning",
                    category: Some(SessionConfigOptionCategory::ThoughtLevel),
                    choices,
                    current: stored(session_config, "variant").unwrap_or(DEFAULT).to_string(),
                });
            }
            specs.push(Spec {
                id: "mode",
                name: "Mode",
                category: Some(SessionConfigOptionCategory::Mode),
                choices: OPENCODE_MODES.iter().map(|(id, name, _)| (id.to_string(), name.to_string())).collect(),
                current: stored(session_config, "mode").unwrap_or(OPENCODE_MODES[0].0).to_string(),
            });
            if config.opencode_backend == crate::config::OpenCodeBackend::Serve {
                specs.push(Spec {
                    id: "approvals",
                    name: "Approvals",
                    category: None,
                    choices: vec![
                        (APPROVALS_AUTO.into(), "Auto (the sandbox is the boundary)".into()),
                        (APPROVALS_ASK.into(), "Ask before anything that edits or runs".into()),
                    ],
                    current: approvals(session_config).to_string(),
                });
            }
            specs
        }
    }
}

/// OpenCode's primary agents offered as the session's mode: (id, name, description).
pub const OPENCODE_MODES: &[(&str, &str, &str)] = &[
    ("build", "Build", "Edits files and runs commands"),
    ("plan", "Plan", "Reads and plans; never edits, and runs commands only when you allow them (Approvals: Ask)"),
];

/// Every tool runs without asking: the sandbox is the boundary.
pub const APPROVALS_AUTO: &str = "auto";
/// OpenCode asks (through the editor) before every tool but reading, searching and planning.
pub const APPROVALS_ASK: &str = "ask";

/// The session's approvals setting.
pub fn approvals(session_config: &Value) -> &str {
    match stored(session_config, "approvals") {
        Some(APPROVALS_ASK) => APPROVALS_ASK,
        _ => APPROVALS_AUTO,
    }
}

/// The OpenCode agent the session's mode names, if one was chosen.
pub fn opencode_agent(session_config: &Value) -> Option<&str> {
    stored(session_config, "mode").filter(|mode| OPENCODE_MODES.iter().any(|(id, _, _)| id == mode))
}

/// What is known about a chosen model (`default`: the user's configured default model).
pub fn model_info<'a>(model: &str, config: &Config, models: &'a [ModelInfo]) -> Option<&'a ModelInfo> {
    let id = if model == DEFAULT { config.opencode_default_model.as_deref()? } else { model };
    models.iter().find(|info| info.id == id)
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
            let description =
                OPENCODE_MODES.iter().find(|(mode, _, _)| mode == id).map(|(_, _, about)| about.to_string());
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
        && !model_info(value, config, models).is_some_and(|info| info.variants.iter().any(|v| v == variant))
        && let Some(object) = updated.as_object_mut()
    {
        // The new model has no such variant.
        object.remove("variant");
    }
    Ok(updated)
}

/// The model to pass to OpenCode, if one was chosen.
pub fn opencode_model(session_config: &Value) -> Option<&str> {
    stored(session_config, "model").filter(|model| *model != DEFAULT)
}

/// The variant to pass to OpenCode, if one was chosen.
pub fn opencode_variant(session_config: &Value) -> Option<&str> {
    stored(session_config, "variant").filter(|variant| *variant != DEFAULT)
}

/// The mode to pass to Amp, if one was chosen.
pub fn amp_mode(session_config: &Value) -> Option<&str> {
    stored(session_config, "mode")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new(AgentKind::OpenCode, "/tmp/x".into())
    }

    fn models() -> Vec<ModelInfo> {
        let mut thinker = ModelInfo::named("fake/thinker");
        thinker.name = "Thinker".into();
        thinker.variants = vec!["low".into(), "high".into()];
        vec![ModelInfo::named("fake/fake-model"), thinker]
    }

    #[test]
    fn opencode_offers_default_and_the_models_it_can_use() {
        let options = config_options(AgentKind::OpenCode, &json!({}), &config(), &models());
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
        let session = apply(AgentKind::OpenCode, &json!({}), "mode", "plan", &config, &models).unwrap();
        assert_eq!(opencode_agent(&session), Some("plan"));
        let session = apply(AgentKind::OpenCode, &session, "approvals", "ask", &config, &models).unwrap();
        assert_eq!(approvals(&session), APPROVALS_ASK);
        assert!(apply(AgentKind::OpenCode, &session, "mode", "yolo", &config, &models).is_err());
        config.opencode_backend = crate::config::OpenCodeBackend::Run;
        let ids: Vec<String> = config_options(AgentKind::OpenCode, &session, &config, &models)
            .iter()
            .map(|o| serde_json::to_value(o).unwrap()["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids, ["model", "mode"], "`run` cannot ask, so it offers no approvals");
    }

    #[test]
    fn a_model_with_variants_offers_a_reasoning_option() {
        let (config, models) = (config(), models());
        let session = apply(AgentKind::OpenCode, &json!({}), "model", "fake/thinker", &config, &models).unwrap();
        let value = serde_json::to_value(config_options(AgentKind::OpenCode, &session, &config, &models)).unwrap();
        assert_eq!(value[1]["id"], "variant");
        assert_eq!(value[1]["category"], "thought_level");
        let session = apply(AgentKind::OpenCode, &session, "variant", "high", &config, &models).unwrap();
        assert_eq!(opencode_variant(&session), Some("high"));
        let session = apply(AgentKind::OpenCode, &session, "model", "fake/fake-model", &config, &models).unwrap();
        assert_eq!(opencode_variant(&session), None, "a variant the new model lacks is dropped");
    }

    #[test]
    fn the_default_model_is_the_users_configured_one() {
        let mut config = config();
        config.opencode_default_model = Some("fake/thinker".into());
        let value = serde_json::to_value(config_options(AgentKind::OpenCode, &json!({}), &config, &models())).unwrap();
        assert_eq!(value[1]["id"], "variant", "the default model's variants are offered");
    }

    #[test]
    fn apply_validates_and_persists() {
        let (config, models) = (config(), models());
        let updated = apply(AgentKind::OpenCode, &json!({}), "model", "fake/fake-model", &config, &models).unwrap();
        assert_eq!(opencode_model(&updated), Some("fake/fake-model"));
        assert!(apply(AgentKind::OpenCode, &json!({}), "model", "nope/nope", &config, &models).is_err());
        assert!(apply(AgentKind::OpenCode, &json!({}), "mode", "x", &config, &models).is_err());
        let amp = apply(AgentKind::Amp, &json!({}), "mode", "high", &config, &models).unwrap();
        assert_eq!(amp_mode(&amp), Some("high"));
    }
}
