//! Codex's ChatGPT login (`login --own`) behind the bridge's model gateway: the session's `~/.codex/auth.json` holds
//! placeholders (an id token Codex can parse, with the account's public claims only and no signature; an access
//! token of the same shape, expiring in 2100; a refresh token that is no token), its provider points at the
//! gateway's route to ChatGPT's backend (`chatgpt_base_url` too), and the gateway puts the real access token on
//! those requests, refreshing it at OpenAI's token endpoint itself and storing the new tokens in the login's file.

use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::{Map, Value, json};

use crate::sandbox::net::gateway::{Held, OAuthLogin, Refreshed, placeholder_for};

/// ChatGPT's backend, where a ChatGPT login's requests go (Codex's `chatgpt_base_url`; its models under `/codex`).
const CHATGPT_BACKEND: &str = "https://chatgpt.com/backend-api";
/// OpenAI's login server (moved by [`super::ISSUER`]).
const ISSUER: &str = "https://auth.openai.com";
/// The public id of Codex's OAuth client.
const CLIENT_ID: &str = "app_EMoamEEZ73f0CkXaXp7hrann";
/// When the placeholders say they expire (seconds since the epoch, in 2100): Codex never refreshes them itself.
const FAR_EXPIRY: i64 = 4_102_444_800;
/// The claims of the id token that Codex reads and that hold no credential: the account, its plan, the user.
const PUBLIC_CLAIMS: &[&str] =
    &["email", "https://api.openai.com/auth", "https://api.openai.com/profile", "sub", "iat"];

/// A JWT's claims, unverified (the placeholders are made of the public ones).
fn claims(token: &str) -> Map<String, Value> {
    let payload = token.split('.').nth(1).unwrap_or_default();
    let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('='));
    decoded.ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default()
}

/// An unsigned JWT of the public claims of `claims`, expiring in 2100, whose signature part is `signature`.
fn unsigned_jwt(claims: &Map<String, Value>, signature: &str) -> String {
    let mut public: Map<String, Value> = claims
        .iter()
        .filter(|(name, _)| PUBLIC_CLAIMS.contains(&name.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    public.insert("exp".into(), json!(FAR_EXPIRY));
    let part = |value: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string());
    format!("{}.{}.{signature}", part(&json!({"alg": "none", "typ": "JWT"})), part(&Value::Object(public)))
}

/// Keeps the ChatGPT login in `shown.0` with the gateway (see the module's text) and writes what Codex sees instead
/// at `shown.1` (the session's `~/.codex/auth.json`). Answers `false`, leaving all as it was, when the file holds no
/// ChatGPT tokens or the gateway cannot run.
pub fn keep_chatgpt(
    shown: &(PathBuf, PathBuf),
    keep: &mut crate::sandbox::net::gateway::Keep<'_>,
    env: &mut [(String, String)],
) -> bool {
    let (login_file, inside) = shown;
    let Some(login) = std::fs::read_to_string(login_file).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok())
    else {
        return false;
    };
    let token = |name: &str| login["tokens"][name].as_str().filter(|t| !t.is_empty()).map(str::to_string);
    let (Some(access), Some(refresh)) = (token("access_token"), token("refresh_token")) else { return false };
    let id_claims = claims(&token("id_token").unwrap_or_default());
    // Where the login's requests go: a base URL the user gave that takes the login, else ChatGPT's backend.
    let Some(config_at) = env.iter().position(|(name, _)| name == "CODEX_CONFIG") else { return false };
    let Ok(mut config) = serde_json::from_str::<Value>(&env[config_at].1) else { return false };
    let provider = format!("/model_providers/{}/base_url", super::PROVIDER);
    let given = config.pointer(&provider).and_then(Value::as_str).map(str::to_string);
    let upstream = given.clone().unwrap_or_else(|| CHATGPT_BACKEND.to_string());
    let issuer = std::env::var(super::ISSUER).ok().filter(|i| !i.trim().is_empty()).unwrap_or_else(|| ISSUER.into());
    let placeholder = unsigned_jwt(&claims(&access), &placeholder_for(""));
    let stored_in = login_file.clone();
    let held = Held::OAuth(OAuthLogin {
        access,
        refresh: refresh.clone(),
        expires_ms: None,
        token_url: format!("{}/oauth/token", issuer.trim().trim_end_matches('/')),
        client_id: CLIENT_ID.into(),
        form: true,
        extra: Vec::new(),
        on_refresh: Some(std::sync::Arc::new(move |new: &Refreshed| store_refreshed(&stored_in, new))),
        placeholder: Some(placeholder),
    });
    let Some(granted) = keep("Codex's ChatGPT login", &upstream, held) else { return false };
    let mut seen = login.clone();
    seen["tokens"]["id_token"] = json!(unsigned_jwt(&id_claims, "acpsandbox"));
    seen["tokens"]["access_token"] = json!(granted.placeholder);
    seen["tokens"]["refresh_token"] = json!(placeholder_for(&refresh));
    seen["last_refresh"] = json!(humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string());
    if let Err(e) = write_private(inside, &seen) {
        tracing::warn!("Codex's ChatGPT login cannot be kept out of the sandbox ({e}): its file is shown");
        return false;
    }
    // Its requests go to the gateway: the provider's, and ChatGPT's other calls (`chatgpt_base_url`).
    match given {
        Some(_) => {
            if let Some(url) = config.pointer_mut(&provider) {
                *url = json!(granted.base_url);
            }
        }
        None => {
            let model = config.get("model").and_then(Value::as_str).map(str::to_string);
            config = super::chatgpt_config(Some(&format!("{}/codex", granted.base_url)), model.as_deref());
            config["chatgpt_base_url"] = json!(format!("{}/", granted.base_url));
        }
    }
    env[config_at].1 = config.to_string();
    true
}

/// Writes `value` to `path` (its folder made), readable by its owner only.
fn write_private(path: &Path, value: &Value) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let fresh = path.with_extension("json.acp-sandbox");
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&fresh)?;
    file.write_all(serde_json::to_string_pretty(value).map_err(std::io::Error::other)?.as_bytes())?;
    std::fs::rename(&fresh, path)
}

/// Stores the tokens the gateway refreshed in the login's file, as Codex would have (OpenAI's refresh tokens are
/// used once). A failure is logged: the gateway keeps the new tokens for this run.
fn store_refreshed(login_file: &Path, new: &Refreshed) {
    let stored = std::fs::read_to_string(login_file)
        .and_then(|text| serde_json::from_str::<Value>(&text).map_err(std::io::Error::other))
        .and_then(|mut login| {
            login["tokens"]["access_token"] = json!(new.access);
            login["tokens"]["refresh_token"] = json!(new.refresh);
            if let Some(id_token) = new.answer.get("id_token").and_then(Value::as_str) {
                login["tokens"]["id_token"] = json!(id_token);
            }
            login["last_refresh"] = json!(humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string());
            write_private(login_file, &login)
        });
    if let Err(e) = stored {
        tracing::warn!("Codex's refreshed ChatGPT login cannot be stored in {}: {e}", login_file.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::net::gateway::Granted;

    fn jwt(claims: Value) -> String {
        let part = |value: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string());
        format!("{}.{}.REALSIGNATURE", part(&json!({"alg": "RS256"})), part(&claims))
    }

    #[test]
    fn the_session_sees_placeholders_of_the_login_and_its_provider_is_the_gateways_route() {
        let dir = tempfile::tempdir().unwrap();
        let (login_file, inside) = (dir.path().join("login/auth.json"), dir.path().join("home/.codex/auth.json"));
        let auth = json!({"chatgpt_plan_type": "plus", "chatgpt_account_id": "acct-1"});
        let id_token =
            jwt(json!({"email": "u@example.com", "https://api.openai.com/auth": auth, "exp": 5, "secret": "x"}));
        let access = jwt(json!({"https://api.openai.com/auth": auth, "exp": 6}));
        let login = json!({"auth_mode": "chatgpt", "OPENAI_API_KEY": null, "last_refresh": "2026-01-01T00:00:00Z",
            "tokens": {"id_token": id_token, "access_token": access, "refresh_token": "REAL-REFRESH", "account_id": "acct-1"}});
        write_private(&login_file, &login).unwrap();
        let mut env =
            vec![("CODEX_CONFIG".to_string(), super::super::chatgpt_config(None, Some("gpt-5.5")).to_string())];
        let mut kept = Vec::new();
        let mut keep = |name: &str, upstream: &str, held: Held| {
            let Held::OAuth(login) = held else { panic!("not a login") };
            kept.push((
                name.to_string(),
                upstream.to_string(),
                login.access.clone(),
                login.refresh.clone(),
                login.token_url.clone(),
                login.form,
            ));
            Some(Granted { base_url: "http://127.0.0.1:9/route".into(), placeholder: login.placeholder.unwrap() })
        };
        assert!(keep_chatgpt(&(login_file.clone(), inside.clone()), &mut keep, &mut env));
        assert_eq!(
            kept,
            [(
                "Codex's ChatGPT login".to_string(),
                CHATGPT_BACKEND.to_string(),
                access.clone(),
                "REAL-REFRESH".to_string(),
                "https://auth.openai.com/oauth/token".to_string(),
                true
            )]
        );
        let seen: Value = serde_json::from_str(&std::fs::read_to_string(&inside).unwrap()).unwrap();
        let text = seen.to_string();
        for secret in ["REAL-REFRESH", "REALSIGNATURE", &access, &id_token, "secret"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!((&seen["auth_mode"], &seen["tokens"]["account_id"]), (&json!("chatgpt"), &json!("acct-1")));
        let id = claims(seen["tokens"]["id_token"].as_str().unwrap());
        assert_eq!(
            Value::Object(id),
            json!({"email": "u@example.com", "https://api.openai.com/auth": auth, "exp": FAR_EXPIRY})
        );
        let placeholder = seen["tokens"]["access_token"].as_str().unwrap();
        assert!(placeholder.contains("acpsandbox"), "{placeholder}");
        assert_eq!(Value::Object(claims(placeholder)), json!({"https://api.openai.com/auth": auth, "exp": FAR_EXPIRY}));
        assert!(seen["tokens"]["refresh_token"].as_str().unwrap().contains("acpsandbox"));
        assert_ne!(seen["last_refresh"], "2026-01-01T00:00:00Z");
        let config: Value = serde_json::from_str(&env[0].1).unwrap();
        let mut expected = super::super::chatgpt_config(Some("http://127.0.0.1:9/route/codex"), Some("gpt-5.5"));
        expected["chatgpt_base_url"] = json!("http://127.0.0.1:9/route/");
        assert_eq!(config, expected);
        // The login's own file is untouched until the gateway refreshes it.
        let new =
            Refreshed { access: "a2".into(), refresh: "r2".into(), expires_ms: 1, answer: json!({"id_token": "i2"}) };
        assert_eq!(serde_json::from_str::<Value>(&std::fs::read_to_string(&login_file).unwrap()).unwrap(), login);
        store_refreshed(&login_file, &new);
        let stored: Value = serde_json::from_str(&std::fs::read_to_string(&login_file).unwrap()).unwrap();
        assert_eq!(
            stored["tokens"],
            json!({"id_token": "i2", "access_token": "a2", "refresh_token": "r2", "account_id": "acct-1"})
        );
    }

    #[test]
    fn a_file_without_chatgpt_tokens_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let (login_file, inside) = (dir.path().join("auth.json"), dir.path().join("inside.json"));
        std::fs::write(&login_file, r#"{"OPENAI_API_KEY": "sk-x"}"#).unwrap();
        let mut env = vec![("CODEX_CONFIG".to_string(), "{}".to_string())];
        let mut keep = |_: &str, _: &str, _: Held| -> Option<Granted> { unreachable!("nothing to keep") };
        assert!(!keep_chatgpt(&(login_file, inside.clone()), &mut keep, &mut env));
        assert!(!inside.exists());
        assert_eq!(env[0].1, "{}");
    }
}
