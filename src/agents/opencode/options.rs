//! OpenCode's session options: its model, the model's variant (reasoning effort), its primary agent as the mode,
//! and, with the warm server (which can ask), approvals.

use agent_client_protocol::v1::schema::SessionConfigOptionCategory;
use serde_json::Value;

use super::Backend;
use crate::agents::options::{DEFAULT, OptionSpec, approvals_option, capitalize, chosen, stored};
use crate::agents::{AgentSettings, ModelInfo};

/// OpenCode's primary agents offered as the session's mode: (id, name, description).
pub const MODES: &[(&str, &str, &str)] = &[
    ("build", "Build", "Edits files and runs commands"),
    ("plan", "Plan", "Reads and plans; never edits, and runs commands only when you allow them (Approvals: Ask)"),
];

/// The OpenCode agent the session's mode names, if one was chosen.
pub fn agent(session_config: &Value) -> Option<&str> {
    stored(session_config, "mode").filter(|mode| MODES.iter().any(|(id, _, _)| id == mode))
}

/// The model to pass to OpenCode, if one was chosen.
pub fn model(session_config: &Value) -> Option<&str> {
    chosen(session_config, "model")
}

/// The variant to pass to OpenCode, if one was chosen.
pub fn variant(session_config: &Value) -> Option<&str> {
    chosen(session_config, "variant")
}

/// What is known about a chosen model (`default`: the user's configured default model).
pub fn model_info<'a>(model: &str, settings: &AgentSettings, models: &'a [ModelInfo]) -> Option<&'a ModelInfo> {
    let id = if model == DEFAULT { settings.opencode.default_model.as_deref()? } else { model };
    models.iter().find(|info| info.id == id)
}

/// The options of an OpenCode session, in display order.
pub fn specs(session_config: &Value, settings: &AgentSettings, models: &[ModelInfo]) -> Vec<OptionSpec> {
    let mut choices = vec![(DEFAULT.to_string(), "OpenCode default".to_string())];
    choices.extend(models.iter().map(|model| (model.id.clone(), model.name.clone())));
    let model = stored(session_config, "model").unwrap_or(DEFAULT).to_string();
    let mut specs = Vec::new();
    let variants = model_info(&model, settings, models).map(|info| &info.variants).filter(|v| !v.is_empty());
    specs.push(OptionSpec {
        id: "model",
        name: "Model",
        category: Some(SessionConfigOptionCategory::Model),
        choices,
        current: model,
    });
    if let Some(variants) = variants {
        let mut choices = vec![(DEFAULT.to_string(), "Default".to_string())];
        choices.extend(variants.iter().map(|variant| (variant.clone(), capitalize(variant))));
        specs.push(OptionSpec {
            id: "variant",
            name: "Reasoning",
            category: Some(SessionConfigOptionCategory::ThoughtLevel),
            choices,
            current: stored(session_config, "variant").unwrap_or(DEFAULT).to_string(),
        });
    }
    specs.push(OptionSpec {
        id: "mode",
        name: "Mode",
        category: Some(SessionConfigOptionCategory::Mode),
        choices: MODES.iter().map(|(id, name, _)| (id.to_string(), name.to_string())).collect(),
        current: stored(session_config, "mode").unwrap_or(MODES[0].0).to_string(),
    });
    if settings.opencode.backend() == Backend::Serve {
        specs.push(approvals_option(session_config));
    }
    specs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn models() -> Vec<ModelInfo> {
        let mut thinker = ModelInfo::named("fake/thinker");
        thinker.name = "Thinker".into();
        thinker.variants = vec!["low".into(), "high".into()];
        vec![ModelInfo::named("fake/fake-model"), thinker]
    }

    /// Each option as (id, category, current value, choices' values).
    fn shape(specs: &[OptionSpec]) -> Vec<(&str, Option<SessionConfigOptionCategory>, &str, Vec<&str>)> {
        specs
            .iter()
            .map(|spec| {
                let choices = spec.choices.iter().map(|(value, _)| value.as_str()).collect();
                (spec.id, spec.category.clone(), spec.current.as_str(), choices)
            })
            .collect()
    }

    #[test]
    fn a_session_offers_the_default_and_the_listed_models_its_mode_and_with_the_server_approvals() {
        let specs = specs(&json!({}), &AgentSettings::default(), &models());
        assert_eq!(
            shape(&specs),
            [
                (
                    "model",
                    Some(SessionConfigOptionCategory::Model),
                    "default",
                    vec!["default", "fake/fake-model", "fake/thinker"]
                ),
                ("mode", Some(SessionConfigOptionCategory::Mode), "build", vec!["build", "plan"]),
                ("approvals", None, "auto", vec!["auto", "ask"]),
            ]
        );
        assert_eq!(specs[0].choices[0].1, "OpenCode default");
        assert_eq!(specs[0].choices[2].1, "Thinker");
    }

    #[test]
    fn run_cannot_ask_so_it_offers_no_approvals() {
        let mut settings = AgentSettings::default();
        settings.opencode.opencode_backend = Some(Backend::Run);
        let ids: Vec<&str> = specs(&json!({"mode": "plan"}), &settings, &models()).iter().map(|s| s.id).collect();
        assert_eq!(ids, ["model", "mode"]);
    }

    #[test]
    fn a_model_with_variants_offers_its_reasoning_levels_and_so_does_the_configured_default() {
        let settings = AgentSettings::default();
        let chosen = specs(&json!({"model": "fake/thinker", "variant": "high"}), &settings, &models());
        assert_eq!(
            shape(&chosen)[1],
            ("variant", Some(SessionConfigOptionCategory::ThoughtLevel), "high", vec!["default", "low", "high"])
        );
        let mut settings = AgentSettings::default();
        settings.opencode.default_model = Some("fake/thinker".into());
        let ids: Vec<&str> = specs(&json!({}), &settings, &models()).iter().map(|s| s.id).collect();
        assert_eq!(ids, ["model", "variant", "mode", "approvals"]);
        assert_eq!((agent(&json!({"mode": "plan"})), variant(&json!({"variant": "default"}))), (Some("plan"), None));
    }
}
