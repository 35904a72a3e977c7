//! The models OpenCode can use, as `opencode models --verbose` lists them: ids, names, context windows,
//! variants (reasoning efforts) and whether they take images.

use serde::{Deserialize, Serialize};

/// One model OpenCode can use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// `provider/model`, what `--model` takes.
    pub id: String,
    /// Its display name.
    pub name: String,
    /// Its context window in tokens, when known.
    pub context: Option<u64>,
    /// Its variants, mildest effort first (what `--variant` takes).
    pub variants: Vec<String>,
    /// Whether it takes images.
    pub image: bool,
}

impl ModelInfo {
    /// A model known only by its id.
    pub fn named(id: &str) -> Self {
        Self { id: id.to_string(), name: id.to_string(), context: None, variants: Vec::new(), image: true }
    }

    /// A model as a user's `opencode.json` declares it (`provider.<p>.models.<m>`). Whether it takes
    /// images is only known when the config says (`modalities.input`, `attachment`); unknown means yes,
    /// and OpenCode decides.
    pub fn from_config(id: String, spec: &serde_json::Value) -> Self {
        let mut info = model_info(id, spec);
        let said_modalities = spec.pointer("/modalities/input").and_then(|m| m.as_array());
        info.image = match (said_modalities, spec.get("attachment").and_then(|a| a.as_bool())) {
            (Some(inputs), _) => inputs.iter().any(|input| input == "image"),
            (None, Some(attachment)) => attachment,
            (None, None) => true,
        };
        info
    }
}

/// The argv (after the executable) that lists models.
pub const LIST_ARGS: &[&str] = &["models", "--verbose"];

/// Parses `opencode models --verbose`: a `provider/model` line, then the model as pretty JSON, repeated.
/// Entries that do not parse are skipped.
pub fn parse(output: &str) -> Vec<ModelInfo> {
    let mut models = Vec::new();
    let mut current: Option<(String, String)> = None;
    let finish = |entry: Option<(String, String)>, models: &mut Vec<ModelInfo>| {
        if let Some((id, body)) = entry
            && let Ok(value) = serde_json::from_str::<serde_json::Value>(&body)
        {
            models.push(model_info(id, &value));
        }
    };
    for line in output.lines() {
        let is_id = !line.starts_with(char::is_whitespace)
            && !line.starts_with(['{', '}'])
            && line.contains('/')
            && !line.contains(char::is_whitespace);
        if is_id {
            finish(current.take(), &mut models);
            current = Some((line.to_string(), String::new()));
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    finish(current.take(), &mut models);
    models
}

/// The models of a server's `GET /config/providers` answer (`{providers: [{id, models: {key: model}}]}`), in the
/// order it gives them.
pub fn parse_providers(answer: &serde_json::Value) -> Vec<ModelInfo> {
    let mut models = Vec::new();
    for provider in answer["providers"].as_array().into_iter().flatten() {
        let Some(provider_id) = provider["id"].as_str() else { continue };
        for (key, model) in provider["models"].as_object().into_iter().flatten() {
            models.push(model_info(format!("{provider_id}/{key}"), model));
        }
    }
    models
}

fn model_info(id: String, value: &serde_json::Value) -> ModelInfo {
    let mut variants: Vec<String> =
        value.get("variants").and_then(|v| v.as_object()).map(|v| v.keys().cloned().collect()).unwrap_or_default();
    variants.sort_by_key(|variant| (effort_rank(variant), variant.clone()));
    ModelInfo {
        name: value.get("name").and_then(|n| n.as_str()).filter(|n| !n.is_empty()).unwrap_or(&id).to_string(),
        context: value.pointer("/limit/context").and_then(|c| c.as_u64()).filter(|c| *c > 0),
        image: value.pointer("/capabilities/input/image").and_then(|i| i.as_bool()).unwrap_or(false),
        variants,
        id,
    }
}

/// Orders the usual effort names from mildest to strongest; others follow by name.
fn effort_rank(variant: &str) -> usize {
    const ORDER: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh", "max"];
    ORDER.iter().position(|known| *known == variant).unwrap_or(ORDER.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_real_listing() {
        let output = include_str!("../../../tests/fixtures/opencode/models-verbose.txt");
        let models = parse(output);
        let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["opencode/big-pickle", "fake/fake-model", "fake/other-model"]);
        let fake = &models[1];
        assert_eq!(fake.name, "Fake Model");
        assert_eq!(fake.context, Some(128_000));
        assert_eq!(fake.variants, ["low", "medium", "high"]);
        assert!(!fake.image);
        assert_eq!(models[0].context, Some(200_000));
        assert!(models[0].variants.is_empty());
    }

    #[test]
    fn parses_a_servers_providers() {
        let answer = serde_json::json!({"providers": [
            {"id": "fake", "models": {
                "fake-model": {"id": "fake-model", "name": "Fake Model", "limit": {"context": 128000},
                               "capabilities": {"input": {"image": true}}, "variants": {"high": {}, "low": {}}},
                "bare": {}
            }},
            {"name": "no id"}
        ], "default": {"fake": "fake-model"}});
        let models = parse_providers(&answer);
        let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["fake/fake-model", "fake/bare"]);
        assert_eq!(models[0].name, "Fake Model");
        assert_eq!(models[0].context, Some(128_000));
        assert_eq!(models[0].variants, ["low", "high"]);
        assert!(models[0].image);
        assert_eq!((models[1].name.as_str(), models[1].context, models[1].image), ("fake/bare", None, false));
        assert!(parse_providers(&serde_json::json!("garbage")).is_empty());
    }

    #[test]
    fn garbage_yields_nothing_and_never_panics() {
        assert!(parse("").is_empty());
        assert!(parse("a/b\n{ not json\nc/d\n").is_empty());
        assert_eq!(parse("x/y\n{\"name\": \"Y\"}\n")[0].name, "Y");
    }
}
