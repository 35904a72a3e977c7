//! What the user's own OpenCode configuration says, read the way OpenCode reads it (JSON with comments and
//! trailing commas): the models it names, its default model and its providers' needs.

use crate::agents::opencode::catalog::ModelInfo;
use crate::agents::opencode::providers::ProviderNeeds;

/// What a user's OpenCode configuration says about models.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpenCodeModels {
    /// Its default `model`, `small_model` and every `provider.<id>.models.<id>`.
    pub models: Vec<ModelInfo>,
    /// The `model` OpenCode uses by default.
    pub default: Option<String>,
    /// Its providers' variables and endpoints.
    pub needs: ProviderNeeds,
}

impl OpenCodeModels {
    /// Reads `opencode.json[c]` of the user's config dir. A missing or unreadable file yields nothing.
    pub fn read(config_dir: &std::path::Path) -> Self {
        let mut found = Self::default();
        let add = |info: ModelInfo, found: &mut Self| {
            if !found.models.iter().any(|known| known.id == info.id) {
                found.models.push(info);
            }
        };
        for name in ["opencode.json", "opencode.jsonc", "config.json"] {
            let Some(value) = read_opencode_config(&config_dir.join("opencode").join(name)) else { continue };
            found.needs.merge(ProviderNeeds::from_config(&value));
            if let Some(model) = value.get("model").and_then(|m| m.as_str()) {
                found.default = Some(model.to_string());
            }
            for key in ["model", "small_model"] {
                if let Some(model) = value.get(key).and_then(|m| m.as_str()) {
                    add(ModelInfo::named(model), &mut found);
                }
            }
            for (provider, body) in value.get("provider").and_then(|p| p.as_object()).into_iter().flatten() {
                for (model, spec) in body.get("models").and_then(|m| m.as_object()).into_iter().flatten() {
                    let id = format!("{provider}/{model}");
                    found.models.retain(|known| known.id != id);
                    add(ModelInfo::from_config(id, spec), &mut found);
                }
            }
        }
        found
    }
}

/// Reads one of OpenCode's config files (`opencode.json`, `opencode.jsonc`, ...) the way OpenCode does: JSON
/// with comments and trailing commas. A missing file is `None`; so is a broken one, with a warning, since
/// what it configures (models, commands) then silently goes missing.
pub fn read_opencode_config(path: &std::path::Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    match parse_opencode_config(&text) {
        Ok(value) => Some(value),
        Err(e) => {
            tracing::warn!(path = %path.display(), "ignoring an OpenCode config that does not parse: {e}");
            None
        }
    }
}

/// Parses OpenCode's JSONC: `//` and `/* */` comments and trailing commas, nothing else of JSON5, like the
/// `jsonc-parser` options OpenCode reads its config with.
pub(crate) fn parse_opencode_config(text: &str) -> Result<serde_json::Value, jsonc_parser::errors::ParseError> {
    let options = jsonc_parser::ParseOptions {
        allow_comments: true,
        allow_trailing_commas: true,
        allow_loose_object_property_names: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    };
    jsonc_parser::parse_to_serde_value(text, &options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_come_from_the_users_opencode_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("opencode")).unwrap();
        std::fs::write(
            dir.path().join("opencode/opencode.jsonc"),
            "{ // comment\n \"model\": \"a/b\", \"provider\": {\"fake\": {\"models\": {\"m1\": {\"name\": \"M1\", \"limit\": {\"context\": 128000}}, \"m2\": {\"variants\": {\"high\": {}, \"low\": {}}}}}}}",
        )
        .unwrap();
        let found = OpenCodeModels::read(dir.path());
        let ids: Vec<&str> = found.models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a/b", "fake/m1", "fake/m2"]);
        assert_eq!(found.models[1].name, "M1");
        assert_eq!(found.models[1].context, Some(128_000));
        assert_eq!(found.models[2].variants, ["low", "high"]);
        assert_eq!(found.default.as_deref(), Some("a/b"));
        assert_eq!(OpenCodeModels::read(&dir.path().join("missing")), OpenCodeModels::default());
    }

    #[test]
    fn opencode_config_is_read_as_jsonc() {
        let text = r#"{
            // a line comment
            "url": "https://example.com//not-a-comment", /* a block
            comment */ "glob": "src/**/*.rs",
            "escaped": "a \" // still a string",
            "command": { "deploy": { "description": "ship it", }, },
            "list": [1, 2,],
        }"#;
        let value = parse_opencode_config(text).unwrap();
        assert_eq!(value["url"], "https://example.com//not-a-comment");
        assert_eq!(value["glob"], "src/**/*.rs");
        assert_eq!(value["escaped"], "a \" // still a string");
        assert_eq!(value["command"]["deploy"]["description"], "ship it");
        assert_eq!(value["list"], serde_json::json!([1, 2]));
        assert!(parse_opencode_config("{ 'single': 1 }").is_err(), "JSON5 is more than OpenCode accepts");
        assert!(parse_opencode_config("{ \"a\": 1 /* unterminated ").is_err());
    }

    #[test]
    fn a_block_comment_or_trailing_comma_no_longer_hides_the_users_models() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("opencode")).unwrap();
        std::fs::write(
            dir.path().join("opencode/opencode.json"),
            "{ /* mine */ \"model\": \"a/b\", \"provider\": {\"p\": {\"models\": {\"m\": {},},},}, }",
        )
        .unwrap();
        let found = OpenCodeModels::read(dir.path());
        assert_eq!(found.models.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["a/b", "p/m"]);
        assert_eq!(read_opencode_config(&dir.path().join("missing.json")), None);
    }
}
