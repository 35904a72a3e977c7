//! OpenCode's model credentials behind the bridge's model gateway: its providers' keys from the environment and the
//! API logins of its `auth.json` become placeholders, and each such provider's `baseURL` (OpenCode's config, through
//! `OPENCODE_CONFIG_CONTENT`) the gateway's route to where it went. `auth.json` itself never enters the sandbox:
//! OpenCode reads its logins from `OPENCODE_AUTH_CONTENT`. Its OAuth logins (refresh tokens of subscriptions) are
//! given as they are: the gateway does not refresh them yet, and leaving them out would stop those providers, so
//! they are the credentials that still enter (said by `doctor` and the README). `mcp-auth.json` is never shown.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::mcp::edit_config_content;
use super::providers::ProviderNeeds;
use crate::sandbox::net::gateway::Granted;

/// The variable OpenCode reads its logins from instead of `auth.json`.
pub const AUTH_CONTENT: &str = "OPENCODE_AUTH_CONTENT";

/// Providers whose API the bridge knows without the user's config: (id, its base URL as OpenCode's SDK uses it,
/// its key variables, the variable that moves its base URL).
const KNOWN: &[(&str, &str, &[&str], Option<&str>)] = &[
    ("anthropic", "https://api.anthropic.com/v1", &["ANTHROPIC_API_KEY"], Some("ANTHROPIC_BASE_URL")),
    ("openai", "https://api.openai.com/v1", &["OPENAI_API_KEY"], Some("OPENAI_BASE_URL")),
    (
        "google",
        "https://generativelanguage.googleapis.com/v1beta",
        &["GOOGLE_GENERATIVE_AI_API_KEY", "GEMINI_API_KEY"],
        None,
    ),
    ("openrouter", "https://openrouter.ai/api/v1", &["OPENROUTER_API_KEY"], None),
    ("groq", "https://api.groq.com/openai/v1", &["GROQ_API_KEY"], None),
    ("mistral", "https://api.mistral.ai/v1", &["MISTRAL_API_KEY"], None),
    ("xai", "https://api.x.ai/v1", &["XAI_API_KEY"], None),
];

/// Where `provider`'s requests go: its `baseURL` in the user's config, else its known API (moved by its variable).
fn upstream(needs: &ProviderNeeds, provider: &str, env: &[(String, String)]) -> Option<String> {
    if let Some(url) = needs.base_urls.get(provider) {
        return Some(url.clone());
    }
    let (_, default, _, moved_by) = KNOWN.iter().find(|(id, ..)| *id == provider)?;
    let moved = moved_by.and_then(|name| env.iter().find(|(n, v)| n == name && !v.trim().is_empty()));
    Some(moved.map(|(_, url)| url.trim().to_string()).unwrap_or_else(|| default.to_string()))
}

/// Keeps OpenCode's credentials with the bridge (see the module's text). `keep(name, upstream, value)` registers one
/// on the gateway; `read_only` is what the command is shown of the user's files (`auth.json` is taken out of it).
pub fn keep(
    needs: &ProviderNeeds,
    user_data_dir: &Path,
    keep: &mut dyn FnMut(&str, &str, &str) -> Option<Granted>,
    env: &mut Vec<(String, String)>,
    read_only: &mut Vec<(PathBuf, PathBuf)>,
) {
    let auth_file = user_data_dir.join("opencode").join("auth.json");
    read_only.retain(|(host, _)| *host != auth_file);
    // Which provider's requests go through which route.
    let mut routes: BTreeMap<String, String> = BTreeMap::new();
    let logins = std::fs::read_to_string(&auth_file).ok().and_then(|text| serde_json::from_str::<Value>(&text).ok());
    let mut shown = Map::new();
    for (provider, login) in logins.as_ref().and_then(Value::as_object).into_iter().flatten() {
        let kind = login.get("type").and_then(Value::as_str).unwrap_or_default();
        let key = login.get("key").and_then(Value::as_str).filter(|key| !key.is_empty());
        let target = upstream(needs, provider, env).filter(|_| !needs.literal_keys.contains(provider));
        match (kind, key, target) {
            ("api", Some(key), Some(target)) => match keep(&format!("auth.json {provider}"), &target, key) {
                Some(granted) => {
                    let mut login = login.clone();
                    login["key"] = json!(granted.placeholder);
                    shown.insert(provider.clone(), login);
                    routes.insert(provider.clone(), granted.base_url);
                }
                None => {
                    shown.insert(provider.clone(), login.clone());
                }
            },
            ("api", Some(_), None) => {
                tracing::warn!(
                    "OpenCode's key for {provider} enters the sandbox as it is: acp-sandbox does not know that \
                     provider's API (set its baseURL in your OpenCode config to keep it out)"
                );
                shown.insert(provider.clone(), login.clone());
            }
            _ => {
                tracing::info!("OpenCode's {kind} login for {provider} enters the sandbox as it is");
                shown.insert(provider.clone(), login.clone());
            }
        }
    }
    env.retain(|(name, _)| name != AUTH_CONTENT);
    env.push((AUTH_CONTENT.to_string(), Value::Object(shown).to_string()));
    // The providers' keys in the environment: the known providers' and those the user's config names.
    let mut providers: BTreeMap<String, Vec<String>> =
        KNOWN.iter().map(|(id, _, names, _)| (id.to_string(), names.iter().map(|n| n.to_string()).collect())).collect();
    for (provider, names) in &needs.provider_env {
        providers.entry(provider.clone()).or_default().extend(names.iter().cloned());
    }
    for (provider, names) in providers {
        if needs.literal_keys.contains(&provider) {
            continue;
        }
        let Some(target) = upstream(needs, &provider, env) else { continue };
        for (name, value) in env.iter_mut().filter(|(name, value)| names.contains(name) && !value.trim().is_empty()) {
            if let Some(granted) = keep(name, &target, value) {
                *value = granted.placeholder;
                routes.insert(provider.clone(), granted.base_url);
            }
        }
    }
    if routes.is_empty() {
        return;
    }
    for (provider, url) in &routes {
        // The SDK's own variable too, so that nothing points past the gateway.
        if let Some((_, _, _, Some(moved_by))) = KNOWN.iter().find(|(id, ..)| id == provider) {
            env.retain(|(name, _)| name != moved_by);
            env.push((moved_by.to_string(), url.clone()));
        }
    }
    let pointed = edit_config_content(env, |config| {
        let providers = config.entry("provider").or_insert_with(|| json!({}));
        let Some(providers) = providers.as_object_mut() else {
            return Err("its `provider` is not an object".to_string());
        };
        for (provider, url) in &routes {
            let entry = providers.entry(provider.clone()).or_insert_with(|| json!({}));
            let options = entry.as_object_mut().map(|entry| entry.entry("options").or_insert_with(|| json!({})));
            match options.and_then(Value::as_object_mut) {
                Some(options) => {
                    options.insert("baseURL".into(), json!(url));
                }
                None => return Err(format!("its provider {provider} is not an object")),
            }
        }
        Ok(())
    });
    if let Err(why) = pointed {
        // Its requests would carry placeholders to the real API: they fail, and this says why.
        tracing::warn!("OpenCode's providers cannot be pointed at the model gateway: {why}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(name: &str, upstream: &str, value: &str) -> Option<Granted> {
        Some(Granted {
            base_url: format!("http://127.0.0.1:9/{}", upstream.len()),
            placeholder: format!("ph-{name}-{}", value.len()),
        })
    }

    #[test]
    fn keys_and_api_logins_become_placeholders_and_oauth_logins_enter_as_they_are() {
        let data = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(data.path().join("opencode")).unwrap();
        let auth = data.path().join("opencode/auth.json");
        std::fs::write(
            &auth,
            r#"{"fake": {"type": "api", "key": "REAL-FAKE"},
                "anthropic": {"type": "oauth", "refresh": "REAL-REFRESH", "access": "REAL-ACCESS", "expires": 1},
                "local": {"type": "api", "key": "LITERAL-PROVIDER"},
                "unknown": {"type": "api", "key": "UNKNOWN-KEY"}}"#,
        )
        .unwrap();
        let config = json!({"provider": {
            "fake": {"options": {"baseURL": "http://127.0.0.1:4010/v1"}, "env": ["FAKE_KEY"]},
            "local": {"options": {"baseURL": "http://127.0.0.1:4011/v1", "apiKey": "sk-literal"}}
        }});
        let needs = ProviderNeeds::from_config(&config);
        let mut env = vec![
            ("OPENAI_API_KEY".to_string(), "REAL-OPENAI".to_string()),
            ("FAKE_KEY".to_string(), "REAL-ENV".to_string()),
            ("OPENCODE_CONFIG_CONTENT".to_string(), r#"{"plugin":["x"]}"#.to_string()),
        ];
        let mut read_only = vec![(auth.clone(), PathBuf::from("/state/data/opencode/auth.json"))];
        keep(&needs, data.path(), &mut granted, &mut env, &mut read_only);
        assert!(read_only.is_empty(), "auth.json is shown: {read_only:?}");
        let value = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap();
        let logins: Value = serde_json::from_str(&value(AUTH_CONTENT)).unwrap();
        assert_eq!(
            logins,
            json!({
                "fake": {"type": "api", "key": "ph-auth.json fake-9"},
                "anthropic": {"type": "oauth", "refresh": "REAL-REFRESH", "access": "REAL-ACCESS", "expires": 1},
                "local": {"type": "api", "key": "LITERAL-PROVIDER"},
                "unknown": {"type": "api", "key": "UNKNOWN-KEY"}
            })
        );
        assert_eq!(value("OPENAI_API_KEY"), "ph-OPENAI_API_KEY-11");
        assert_eq!(value("FAKE_KEY"), "ph-FAKE_KEY-8");
        assert_eq!(value("OPENAI_BASE_URL"), "http://127.0.0.1:9/25");
        let config: Value = serde_json::from_str(&value("OPENCODE_CONFIG_CONTENT")).unwrap();
        assert_eq!(
            config,
            json!({"plugin": ["x"], "provider": {
                "fake": {"options": {"baseURL": "http://127.0.0.1:9/24"}},
                "openai": {"options": {"baseURL": "http://127.0.0.1:9/25"}}
            }})
        );
    }
}
