//! Which of the bridge's environment variables OpenCode needs, and which hosts it must reach: only the model
//! providers the user configured or OpenCode can use, never every variable that looks like a key.

use std::collections::BTreeSet;

/// The variables each provider reads its credentials and settings from (as OpenCode's model catalog,
/// models.dev, names them). A provider missing here gets only what the user's config references.
const PROVIDER_ENV: &[(&str, &[&str])] = &[
    ("anthropic", &["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"]),
    ("openai", &["OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID"]),
    ("google", &["GOOGLE_GENERATIVE_AI_API_KEY", "GEMINI_API_KEY"]),
    (
        "google-vertex",
        &["GOOGLE_VERTEX_PROJECT", "GOOGLE_VERTEX_LOCATION", "GOOGLE_CLOUD_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS"],
    ),
    (
        "google-vertex-anthropic",
        &["GOOGLE_VERTEX_PROJECT", "GOOGLE_VERTEX_LOCATION", "GOOGLE_CLOUD_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS"],
    ),
    (
        "amazon-bedrock",
        &[
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_REGION",
            "AWS_PROFILE",
            "AWS_BEARER_TOKEN_BEDROCK",
        ],
    ),
    ("azure", &["AZURE_RESOURCE_NAME", "AZURE_API_KEY"]),
    ("openrouter", &["OPENROUTER_API_KEY"]),
    ("groq", &["GROQ_API_KEY"]),
    ("mistral", &["MISTRAL_API_KEY"]),
    ("deepseek", &["DEEPSEEK_API_KEY"]),
    ("xai", &["XAI_API_KEY"]),
    ("togetherai", &["TOGETHER_API_KEY"]),
    ("fireworks-ai", &["FIREWORKS_API_KEY"]),
    ("cerebras", &["CEREBRAS_API_KEY"]),
    ("perplexity", &["PERPLEXITY_API_KEY"]),
    ("deepinfra", &["DEEPINFRA_API_KEY"]),
    ("github-models", &["GITHUB_TOKEN"]),
    ("huggingface", &["HF_TOKEN"]),
    ("zhipuai", &["ZHIPU_API_KEY"]),
    ("zai", &["ZHIPU_API_KEY"]),
    ("moonshotai", &["MOONSHOT_API_KEY"]),
    ("vercel", &["AI_GATEWAY_API_KEY"]),
    ("baseten", &["BASETEN_API_KEY"]),
    ("cohere", &["COHERE_API_KEY"]),
    ("venice", &["VENICE_API_KEY"]),
    ("nvidia", &["NVIDIA_API_KEY"]),
    ("alibaba", &["DASHSCOPE_API_KEY"]),
    ("minimax", &["MINIMAX_API_KEY"]),
    ("cloudflare-workers-ai", &["CLOUDFLARE_ACCOUNT_ID", "CLOUDFLARE_API_KEY"]),
    ("chutes", &["CHUTES_API_KEY"]),
    ("requesty", &["REQUESTY_API_KEY"]),
    ("ollama", &["OLLAMA_HOST"]),
];

/// OpenCode's own service (models.dev is its model catalog) and the APIs of the common providers.
pub const SERVICE_HOSTS: &[&str] = &[
    "opencode.ai",
    "models.dev",
    "api.anthropic.com",
    "api.openai.com",
    "generativelanguage.googleapis.com",
    "aiplatform.googleapis.com",
    "openrouter.ai",
    "api.groq.com",
    "api.mistral.ai",
    "api.deepseek.com",
    "api.x.ai",
    "api.together.xyz",
    "api.fireworks.ai",
    "api.cerebras.ai",
    "api.githubcopilot.com",
    "github.com",
    "amazonaws.com",
    "openai.azure.com",
];

/// What a user's OpenCode config asks of the sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProviderNeeds {
    /// Provider ids the config uses (`provider.<id>`, and the prefixes of `model` / `small_model`).
    pub providers: BTreeSet<String>,
    /// Variables the config references itself (`{env:NAME}`, a provider's `env` list).
    pub env: BTreeSet<String>,
    /// The host:port of each provider `baseURL`: the model endpoints, reachable even on loopback.
    pub endpoints: BTreeSet<(String, u16)>,
    /// Each provider's `baseURL` (or `api`), where its credentials go.
    pub base_urls: std::collections::BTreeMap<String, String>,
    /// The variables each provider's own entry names (its `env` list, `{env:NAME}` in it).
    pub provider_env: std::collections::BTreeMap<String, BTreeSet<String>>,
    /// Providers whose entry holds a key as it is (`options.apiKey` that is no `{env:…}`): OpenCode sends that one.
    pub literal_keys: BTreeSet<String>,
}

impl ProviderNeeds {
    /// Reads them from a parsed `opencode.json`.
    pub fn from_config(config: &serde_json::Value) -> Self {
        let mut needs = Self::default();
        for key in ["model", "small_model"] {
            if let Some((provider, _)) = config.get(key).and_then(|m| m.as_str()).and_then(|m| m.split_once('/')) {
                needs.providers.insert(provider.to_string());
            }
        }
        for (id, body) in config.get("provider").and_then(|p| p.as_object()).into_iter().flatten() {
            needs.providers.insert(id.clone());
            for name in body.get("env").and_then(|e| e.as_array()).into_iter().flatten().filter_map(|n| n.as_str()) {
                needs.env.insert(name.to_string());
            }
            let base = body.pointer("/options/baseURL").or_else(|| body.get("api")).and_then(|u| u.as_str());
            if let Some(endpoint) = base.and_then(crate::agents::endpoint_of) {
                needs.endpoints.insert(endpoint);
                needs.base_urls.insert(id.clone(), base.unwrap_or_default().to_string());
            }
            let mut own = BTreeSet::new();
            for name in body.get("env").and_then(|e| e.as_array()).into_iter().flatten().filter_map(|n| n.as_str()) {
                own.insert(name.to_string());
            }
            collect_env_references(body, &mut own);
            needs.provider_env.insert(id.clone(), own);
            if body.pointer("/options/apiKey").and_then(|k| k.as_str()).is_some_and(|key| !key.contains("{env:")) {
                needs.literal_keys.insert(id.clone());
            }
        }
        collect_env_references(config, &mut needs.env);
        needs
    }

    /// Adds another config's needs (the user's and the project's configs both count).
    pub fn merge(&mut self, other: ProviderNeeds) {
        self.providers.extend(other.providers);
        self.env.extend(other.env);
        self.endpoints.extend(other.endpoints);
        self.base_urls.extend(other.base_urls);
        self.provider_env.extend(other.provider_env);
        self.literal_keys.extend(other.literal_keys);
    }

    /// The variable names OpenCode gets for these providers plus `extra_providers` (those its catalog lists, and
    /// the provider of the model in use).
    pub fn env_names<'a>(&self, extra_providers: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
        let mut names = self.env.clone();
        let mut providers: BTreeSet<String> = self.providers.clone();
        providers.extend(extra_providers.into_iter().map(String::from));
        for provider in &providers {
            names.extend(provider_env(provider).iter().map(|name| name.to_string()));
        }
        names
    }
}

/// The variables of one provider.
pub fn provider_env(provider: &str) -> &'static [&'static str] {
    PROVIDER_ENV.iter().find(|(id, _)| *id == provider).map(|(_, names)| *names).unwrap_or(&[])
}

/// Whether OpenCode has something to log in with: a provider configured in the user's `opencode.json` (a local
/// model server needs no key), a provider's variable in the bridge's environment, or a stored login (`auth.json`
/// under `user_data_dir` with an entry).
pub fn configured(needs: &ProviderNeeds, user_data_dir: &std::path::Path) -> bool {
    if !needs.providers.is_empty() {
        return true;
    }
    let mut names: Vec<String> = all_provider_env().into_iter().map(String::from).collect();
    names.extend(needs.env.iter().cloned());
    if names.iter().any(|name| std::env::var(name).is_ok_and(|value| !value.trim().is_empty())) {
        return true;
    }
    logins(user_data_dir) > 0
}

/// How many logins OpenCode's `auth.json` holds under `user_data_dir` (0 when it is missing or unreadable).
fn logins(user_data_dir: &std::path::Path) -> usize {
    std::fs::read_to_string(user_data_dir.join("opencode").join("auth.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|value| value.as_object().map(|entries| entries.len()))
        .unwrap_or(0)
}

/// The model providers OpenCode can find, in words: in the user's config, in its stored logins (`logins`, the
/// parsed `auth.json`), or in the environment.
pub fn found(needs: &ProviderNeeds, logins: Option<&serde_json::Value>) -> Vec<String> {
    let mut found: Vec<String> =
        needs.providers.iter().map(|provider| format!("{provider} (your OpenCode config)")).collect();
    for provider in logins.and_then(|l| l.as_object()).into_iter().flat_map(|logins| logins.keys()) {
        found.push(format!("{provider} (`opencode auth login`)"));
    }
    for variable in all_provider_env() {
        if std::env::var_os(variable).is_some_and(|value| !value.is_empty()) {
            found.push(format!("{variable} is set"));
        }
    }
    found
}

/// Every provider variable known: what listing the models may use to find out which providers work.
pub fn all_provider_env() -> BTreeSet<&'static str> {
    PROVIDER_ENV.iter().flat_map(|(_, names)| names.iter().copied()).collect()
}

/// Every `{env:NAME}` in the config's strings.
fn collect_env_references(value: &serde_json::Value, names: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::String(text) => {
            let mut rest = text.as_str();
            while let Some(start) = rest.find("{env:") {
                let after = &rest[start + 5..];
                let Some(end) = after.find('}') else { break };
                let name = after[..end].trim();
                if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    names.insert(name.to_string());
                }
                rest = &after[end..];
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| collect_env_references(item, names)),
        serde_json::Value::Object(map) => map.values().for_each(|item| collect_env_references(item, names)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logins_counts_the_entries_of_auth_json() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(logins(dir.path()), 0);
        std::fs::create_dir_all(dir.path().join("opencode")).unwrap();
        std::fs::write(dir.path().join("opencode/auth.json"), "{}").unwrap();
        assert_eq!(logins(dir.path()), 0);
        std::fs::write(dir.path().join("opencode/auth.json"), r#"{"anthropic":{"type":"api","key":"k"}}"#).unwrap();
        assert_eq!(logins(dir.path()), 1);
    }

    #[test]
    fn the_config_names_its_providers_variables_and_endpoints() {
        let config = serde_json::json!({
            "model": "anthropic/claude-sonnet-4",
            "provider": {
                "fake": {
                    "env": ["FAKE_PROVIDER_KEY"],
                    "options": { "baseURL": "http://127.0.0.1:4010/v1", "apiKey": "{env:FAKE_SECOND_KEY}" }
                },
                "ollama": { "options": { "baseURL": "http://[::1]:11434/v1" } }
            }
        });
        let needs = ProviderNeeds::from_config(&config);
        assert_eq!(needs.providers, ["anthropic", "fake", "ollama"].map(String::from).into());
        assert_eq!(needs.env, ["FAKE_PROVIDER_KEY", "FAKE_SECOND_KEY"].map(String::from).into());
        assert_eq!(needs.endpoints, [("127.0.0.1".to_string(), 4010), ("::1".to_string(), 11434)].into());
        let names = needs.env_names(["openai"]);
        assert_eq!(
            names,
            [
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_BASE_URL",
                "FAKE_PROVIDER_KEY",
                "FAKE_SECOND_KEY",
                "OLLAMA_HOST",
                "OPENAI_API_KEY",
                "OPENAI_BASE_URL",
                "OPENAI_ORG_ID"
            ]
            .map(String::from)
            .into()
        );
        for leaked in ["AWS_SECRET_ACCESS_KEY", "STRIPE_API_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "GITHUB_TOKEN"] {
            assert!(!names.contains(leaked), "{leaked}");
        }
    }

    #[test]
    fn endpoints_come_from_urls() {
        assert_eq!(crate::agents::endpoint_of("https://api.example.com/v1"), Some(("api.example.com".into(), 443)));
        assert_eq!(crate::agents::endpoint_of("http://user:pw@LOCALHOST:8080"), Some(("localhost".into(), 8080)));
        assert_eq!(crate::agents::endpoint_of("http://10.0.0.2"), Some(("10.0.0.2".into(), 80)));
        assert_eq!(crate::agents::endpoint_of("ftp://x"), None);
        assert_eq!(crate::agents::endpoint_of("http://host:notaport/"), None);
    }
}
