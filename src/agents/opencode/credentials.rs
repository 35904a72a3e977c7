//! OpenCode's model credentials behind the bridge's model gateway: its providers' keys from the environment, the API
//! logins of its `auth.json` and the OAuth logins whose requests follow the provider's `baseURL` (Anthropic's,
//! GitHub Copilot's) become placeholders, and each such provider's `baseURL` (OpenCode's config, through
//! `OPENCODE_CONFIG_CONTENT`) the gateway's route to where it went. `auth.json` itself never enters the sandbox:
//! OpenCode reads its logins from `OPENCODE_AUTH_CONTENT`. An OAuth login inside holds placeholders for both tokens
//! and an expiry far ahead, so OpenCode never refreshes it: the gateway does, with the real refresh token, and
//! stores the new tokens in the user's `auth.json`. The OAuth logins OpenCode sends past the `baseURL` (ChatGPT's,
//! to chatgpt.com; GitLab's) still enter as they are (said by `doctor` and the README). `mcp-auth.json` is never
//! shown.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::mcp::edit_config_content;
use super::providers::ProviderNeeds;
use crate::sandbox::net::gateway::{Held, OAuthLogin, Refreshed, placeholder_for};

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

/// What an OAuth login inside the sandbox says of its expiry (milliseconds since the epoch, in 2100): far enough that
/// OpenCode never refreshes it itself.
const FAR_EXPIRY_MS: i64 = 4_102_444_800_000;

/// How OpenCode's OAuth plugin for a provider uses its login.
enum OAuthUse {
    /// The access token goes to the provider's `baseURL`; the refresh token to `token_url` (JSON or a form) when it
    /// expires (Anthropic's plugin).
    Access { token_url: &'static str, client_id: &'static str, form: bool },
    /// The refresh field (a long-lived token) is itself the bearer at the provider's `baseURL`, never exchanged
    /// (GitHub Copilot, whose upstream is `https://copilot-api.<enterprise host>` for an `enterpriseUrl`).
    RefreshAsBearer { upstream: &'static str },
}

/// The OAuth logins kept behind the gateway, by provider.
const OAUTH: &[(&str, OAuthUse)] = &[
    (
        "anthropic",
        OAuthUse::Access {
            token_url: "https://console.anthropic.com/v1/oauth/token",
            client_id: "9d1c250a-e61b-44d9-88ed-5944d1962f5e",
            form: false,
        },
    ),
    ("github-copilot", OAuthUse::RefreshAsBearer { upstream: "https://api.githubcopilot.com" }),
];

/// The OAuth login `login` of `provider` kept with the gateway: answers what OpenCode is shown instead and the route.
fn keep_oauth(
    provider: &str,
    login: &Value,
    target: Option<String>,
    auth_file: &Path,
    keep: &mut crate::sandbox::net::gateway::Keep<'_>,
) -> Option<(Value, String)> {
    let (_, how) = OAUTH.iter().find(|(id, _)| *id == provider)?;
    let text = |field: &str| login.get(field).and_then(Value::as_str).filter(|v| !v.is_empty()).map(str::to_string);
    let name = format!("auth.json {provider}");
    let mut shown = login.clone();
    let granted = match how {
        OAuthUse::Access { token_url, client_id, form } => {
            let (access, refresh) = (text("access")?, text("refresh")?);
            let store_in = auth_file.to_path_buf();
            let owner = provider.to_string();
            let held = Held::OAuth(OAuthLogin {
                access,
                refresh,
                expires_ms: login.get("expires").and_then(Value::as_i64),
                token_url: token_url.to_string(),
                client_id: client_id.to_string(),
                form: *form,
                extra: Vec::new(),
                on_refresh: Some(std::sync::Arc::new(move |new: &Refreshed| store_refreshed(&store_in, &owner, new))),
                placeholder: None,
            });
            let granted = keep(&name, &target?, held)?;
            shown["access"] = json!(granted.placeholder);
            granted
        }
        OAuthUse::RefreshAsBearer { upstream } => {
            let refresh = text("refresh")?;
            let enterprise = text("enterpriseUrl").map(|url| {
                let host = url.trim_start_matches("https://").trim_start_matches("http://").trim_end_matches('/');
                format!("https://copilot-api.{host}")
            });
            let target = target.or(enterprise).unwrap_or_else(|| upstream.to_string());
            let granted = keep(&name, &target, Held::Key(refresh))?;
            if let Some(access) = text("access") {
                shown["access"] = json!(placeholder_for(&access));
            }
            granted
        }
    };
    // Never used: OpenCode does not refresh before the far expiry, and the gateway holds the real one.
    shown["refresh"] = match how {
        OAuthUse::Access { .. } => json!(placeholder_for(&text("refresh").unwrap_or_default())),
        OAuthUse::RefreshAsBearer { .. } => json!(granted.placeholder),
    };
    shown["expires"] = json!(FAR_EXPIRY_MS);
    Some((shown, granted.base_url))
}

/// Stores the tokens the gateway refreshed in the user's `auth.json`, as OpenCode would have (the old refresh token
/// may no longer work). A failure is logged: the gateway keeps the new tokens for this run.
fn store_refreshed(auth_file: &Path, provider: &str, new: &Refreshed) {
    let stored = (|| -> std::io::Result<()> {
        let text = std::fs::read_to_string(auth_file)?;
        let mut logins: Value = serde_json::from_str(&text).map_err(std::io::Error::other)?;
        let Some(login) = logins.get_mut(provider).and_then(Value::as_object_mut) else { return Ok(()) };
        login.insert("access".into(), json!(new.access));
        login.insert("refresh".into(), json!(new.refresh));
        login.insert("expires".into(), json!(new.expires_ms));
        let fresh = auth_file.with_extension("json.acp-sandbox");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut file =
                std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&fresh)?;
            file.write_all(serde_json::to_string_pretty(&logins).map_err(std::io::Error::other)?.as_bytes())?;
        }
        std::fs::rename(&fresh, auth_file)
    })();
    if let Err(e) = stored {
        tracing::warn!("OpenCode's refreshed {provider} login cannot be stored in {}: {e}", auth_file.display());
    }
}

/// Where `provider`'s requests go: its `baseURL` in the user's config, else its known API (moved by its variable).
fn upstream(needs: &ProviderNeeds, provider: &str, env: &[(String, String)]) -> Option<String> {
    if let Some(url) = needs.base_urls.get(provider) {
        return Some(url.clone());
    }
    let (_, default, _, moved_by) = KNOWN.iter().find(|(id, ..)| *id == provider)?;
    let moved = moved_by.and_then(|name| env.iter().find(|(n, v)| n == name && !v.trim().is_empty()));
    Some(moved.map(|(_, url)| url.trim().to_string()).unwrap_or_else(|| default.to_string()))
}

/// Keeps OpenCode's credentials with the bridge (see the module's text). `keep(name, upstream, held)` registers one
/// on the gateway; `read_only` is what the command is shown of the user's files (`auth.json` is taken out of it).
pub fn keep(
    needs: &ProviderNeeds,
    user_data_dir: &Path,
    keep: &mut crate::sandbox::net::gateway::Keep<'_>,
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
            ("api", Some(key), Some(target)) => {
                match keep(&format!("auth.json {provider}"), &target, Held::Key(key.into())) {
                    Some(granted) => {
                        let mut login = login.clone();
                        login["key"] = json!(granted.placeholder);
                        shown.insert(provider.clone(), login);
                        routes.insert(provider.clone(), granted.base_url);
                    }
                    None => {
                        shown.insert(provider.clone(), login.clone());
                    }
                }
            }
            ("api", Some(_), None) => {
                tracing::warn!(
                    "OpenCode's key for {provider} enters the sandbox as it is: acp-sandbox does not know that \
                     provider's API (set its baseURL in your OpenCode config to keep it out)"
                );
                shown.insert(provider.clone(), login.clone());
            }
            ("oauth", _, target) => match keep_oauth(provider, login, target, &auth_file, keep) {
                Some((login, route)) => {
                    shown.insert(provider.clone(), login);
                    routes.insert(provider.clone(), route);
                }
                None => {
                    tracing::info!(
                        "OpenCode's OAuth login for {provider} enters the sandbox as it is (its requests do not \
                         follow the provider's baseURL, or the model gateway cannot run)"
                    );
                    shown.insert(provider.clone(), login.clone());
                }
            },
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
            if let Some(granted) = keep(name, &target, Held::Key(value.clone())) {
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
    use crate::sandbox::net::gateway::Granted;

    fn granted(name: &str, upstream: &str, held: Held) -> Option<Granted> {
        let value = match held {
            Held::Key(value) => value,
            Held::OAuth(login) => {
                assert_eq!(
                    (login.token_url.as_str(), login.client_id.as_str(), login.form, login.expires_ms),
                    (
                        "https://console.anthropic.com/v1/oauth/token",
                        "9d1c250a-e61b-44d9-88ed-5944d1962f5e",
                        false,
                        Some(1)
                    )
                );
                assert_eq!(login.refresh, "REAL-REFRESH");
                login.access
            }
        };
        Some(Granted {
            base_url: format!("http://127.0.0.1:9/{}", upstream.len()),
            placeholder: format!("ph-{name}-{}", value.len()),
        })
    }

    #[test]
    fn keys_api_logins_and_oauth_logins_that_follow_the_base_url_become_placeholders() {
        let data = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(data.path().join("opencode")).unwrap();
        let auth = data.path().join("opencode/auth.json");
        std::fs::write(
            &auth,
            r#"{"fake": {"type": "api", "key": "REAL-FAKE"},
                "anthropic": {"type": "oauth", "refresh": "REAL-REFRESH", "access": "REAL-ACCESS", "expires": 1},
                "github-copilot": {"type": "oauth", "refresh": "gho_REALGITHUB", "access": "REAL-COPILOT", "expires": 0},
                "openai": {"type": "oauth", "refresh": "REAL-CHATGPT", "access": "REAL-CHATGPT-ACCESS", "expires": 1},
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
        let mut logins: Value = serde_json::from_str(&value(AUTH_CONTENT)).unwrap();
        // The tokens OpenCode never uses are placeholders of no route (random).
        for (provider, field, prefix) in
            [("anthropic", "refresh", "REAL-acpsandbox"), ("github-copilot", "access", "REAL-acpsandbox")]
        {
            let dummy = logins[provider][field].take();
            assert!(dummy.as_str().is_some_and(|d| d.starts_with(prefix) && d.len() == prefix.len() + 64), "{dummy}");
        }
        assert_eq!(
            logins,
            json!({
                "fake": {"type": "api", "key": "ph-auth.json fake-9"},
                "anthropic": {"type": "oauth", "refresh": null, "access": "ph-auth.json anthropic-11", "expires": FAR_EXPIRY_MS},
                "github-copilot": {"type": "oauth", "refresh": "ph-auth.json github-copilot-14", "access": null, "expires": FAR_EXPIRY_MS},
                "openai": {"type": "oauth", "refresh": "REAL-CHATGPT", "access": "REAL-CHATGPT-ACCESS", "expires": 1},
                "local": {"type": "api", "key": "LITERAL-PROVIDER"},
                "unknown": {"type": "api", "key": "UNKNOWN-KEY"}
            })
        );
        assert_eq!(value("OPENAI_API_KEY"), "ph-OPENAI_API_KEY-11");
        assert_eq!(value("FAKE_KEY"), "ph-FAKE_KEY-8");
        assert_eq!(value("OPENAI_BASE_URL"), "http://127.0.0.1:9/25");
        assert_eq!(value("ANTHROPIC_BASE_URL"), "http://127.0.0.1:9/28");
        let config: Value = serde_json::from_str(&value("OPENCODE_CONFIG_CONTENT")).unwrap();
        assert_eq!(
            config,
            json!({"plugin": ["x"], "provider": {
                "fake": {"options": {"baseURL": "http://127.0.0.1:9/24"}},
                "anthropic": {"options": {"baseURL": "http://127.0.0.1:9/28"}},
                "github-copilot": {"options": {"baseURL": "http://127.0.0.1:9/29"}},
                "openai": {"options": {"baseURL": "http://127.0.0.1:9/25"}}
            }})
        );
    }

    #[test]
    fn a_refreshed_login_is_stored_in_the_users_file_and_the_others_stay() {
        let data = tempfile::tempdir().unwrap();
        let auth = data.path().join("auth.json");
        std::fs::write(&auth, r#"{"anthropic": {"type": "oauth", "refresh": "r1", "access": "a1", "expires": 1}, "x": {"type": "api", "key": "k"}}"#)
            .unwrap();
        let new = Refreshed { access: "a2".into(), refresh: "r2".into(), expires_ms: 99, answer: json!({}) };
        store_refreshed(&auth, "anthropic", &new);
        let stored: Value = serde_json::from_str(&std::fs::read_to_string(&auth).unwrap()).unwrap();
        assert_eq!(
            stored,
            json!({"anthropic": {"type": "oauth", "refresh": "r2", "access": "a2", "expires": 99}, "x": {"type": "api", "key": "k"}})
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&auth).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
