//! The editor's MCP servers and system prompt in OpenCode's own configuration (`OPENCODE_CONFIG_CONTENT`): its
//! `mcp` entries, local or remote, and its `instructions` for `opencode run`.

use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema::McpServer;
use serde_json::{Map, Value, json};

use crate::agents::Extras;

/// The variable OpenCode reads its configuration's last layer from.
pub const CONFIG_CONTENT: &str = "OPENCODE_CONFIG_CONTENT";

/// Where `opencode run`'s system prompt is written in the session's state dir, named in its `instructions`.
pub const SYSTEM_PROMPT_PATH: &str = "acp-sandbox/system-prompt.md";

/// Changes the object in `OPENCODE_CONFIG_CONTENT` of `env`, keeping whatever the user's own value says.
pub fn edit_config_content(
    env: &mut Vec<(String, String)>,
    edit: impl FnOnce(&mut Map<String, Value>) -> Result<(), String>,
) -> Result<(), String> {
    let mut config = match env.iter().find(|(name, _)| name == CONFIG_CONTENT) {
        Some((_, text)) => super::config::parse_opencode_config(text)
            .map_err(|e| format!("{CONFIG_CONTENT} is not a JSON object OpenCode reads: {e}"))?,
        None => json!({}),
    };
    let Some(object) = config.as_object_mut() else {
        return Err(format!("{CONFIG_CONTENT} is not a JSON object"));
    };
    edit(object)?;
    env.retain(|(name, _)| name != CONFIG_CONTENT);
    env.push((CONFIG_CONTENT.into(), config.to_string()));
    Ok(())
}

/// OpenCode's `mcp` entries for the editor's servers. A stdio server runs wrapped (`agents::mcp::stdio`) with the
/// editor's variables as its `environment`; an http or sse one is `remote` with its headers (OpenCode tries the
/// streamable transport, then SSE).
pub fn entries(servers: &[McpServer]) -> Map<String, Value> {
    let mut entries = Map::new();
    for server in servers {
        let (name, entry) = match server {
            McpServer::Stdio(stdio) => {
                let wrapped = crate::agents::mcp::stdio(stdio);
                let mut command = vec![wrapped.program];
                command.extend(wrapped.args);
                (&stdio.name, json!({"type": "local", "command": command, "environment": wrapped.env, "enabled": true}))
            }
            McpServer::Http(http) => (&http.name, remote(&http.url, &http.headers)),
            McpServer::Sse(sse) => (&sse.name, remote(&sse.url, &sse.headers)),
            // Non-exhaustive: transports this build does not enable.
            _ => continue,
        };
        entries.insert(name.clone(), entry);
    }
    entries
}

fn remote(url: &str, headers: &[agent_client_protocol::v1::schema::HttpHeader]) -> Value {
    let headers: Map<String, Value> =
        headers.iter().map(|header| (header.name.clone(), Value::String(header.value.clone()))).collect();
    // The editor gave the headers it wants; OpenCode's own OAuth flow would open a browser nobody sees.
    json!({"type": "remote", "url": url, "headers": headers, "oauth": false, "enabled": true})
}

/// Adds the editor's servers to `env`'s configuration, over any of the user's own of the same name.
pub fn add_servers(env: &mut Vec<(String, String)>, servers: &[McpServer]) -> Result<(), String> {
    if servers.is_empty() {
        return Ok(());
    }
    let entries = entries(servers);
    edit_config_content(env, |config| {
        let mcp = config.entry("mcp").or_insert_with(|| json!({}));
        let Some(mcp) = mcp.as_object_mut() else {
            return Err(format!("the `mcp` of {CONFIG_CONTENT} is not an object"));
        };
        mcp.extend(entries);
        Ok(())
    })
}

/// What `opencode run` needs for the editor's servers and system prompt (the warm server takes the prompt with
/// each message instead: one server serves sessions with different prompts).
pub fn run_env(extras: &Extras<'_>, state_dir: &Path, env: &mut Vec<(String, String)>) -> Result<(), String> {
    add_servers(env, extras.mcp_servers)?;
    if extras.system_prompt.is_some() {
        let path = state_dir.join(SYSTEM_PROMPT_PATH).display().to_string();
        edit_config_content(env, |config| {
            let instructions = config.entry("instructions").or_insert_with(|| json!([]));
            let Some(list) = instructions.as_array_mut() else {
                return Err(format!("the `instructions` of {CONFIG_CONTENT} is not a list"));
            };
            list.push(Value::String(path));
            Ok(())
        })?;
    }
    Ok(())
}

/// The file `run_env` names.
pub fn run_files(extras: &Extras<'_>) -> Vec<(PathBuf, Vec<u8>)> {
    match extras.system_prompt {
        Some(text) => vec![(PathBuf::from(SYSTEM_PROMPT_PATH), text.as_bytes().to_vec())],
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{EnvVariable, HttpHeader, McpServerHttp, McpServerStdio};

    #[test]
    fn the_editors_servers_join_the_users_config_content_with_their_secrets_only_as_values() {
        let servers = vec![
            McpServer::Stdio(McpServerStdio::new("files", "/opt/files").env(vec![EnvVariable::new("TOKEN", "t")])),
            McpServer::Http(
                McpServerHttp::new("web", "http://127.0.0.1:7001/mcp")
                    .headers(vec![HttpHeader::new("Authorization", "Bearer k")]),
            ),
        ];
        let mut env = vec![
            ("PATH".to_string(), "/usr/bin".to_string()),
            (
                CONFIG_CONTENT.to_string(),
                r#"{"mcp": {"mine": {"type": "local", "command": ["x"]}}, "model": "a/b"}"#.to_string(),
            ),
        ];
        let extras = Extras { system_prompt: Some("Be brief."), mcp_servers: &servers, roots: &[] };
        run_env(&extras, Path::new("/state"), &mut env).unwrap();
        let (_, content) = env.iter().find(|(name, _)| name == CONFIG_CONTENT).unwrap();
        let config: Value = serde_json::from_str(content).unwrap();
        assert_eq!(
            config,
            json!({
                "mcp": {
                    "mine": {"type": "local", "command": ["x"]},
                    "files": {
                        "type": "local",
                        "command": ["/bin/sh", "-c", crate::agents::mcp::stdio(match &servers[0] {
                            McpServer::Stdio(stdio) => stdio,
                            _ => unreachable!(),
                        }).args[1].clone(), "mcp-files", "/opt/files"],
                        "environment": {"TOKEN": "t"},
                        "enabled": true
                    },
                    "web": {
                        "type": "remote",
                        "url": "http://127.0.0.1:7001/mcp",
                        "headers": {"Authorization": "Bearer k"},
                        "oauth": false,
                        "enabled": true
                    }
                },
                "model": "a/b",
                "instructions": ["/state/acp-sandbox/system-prompt.md"]
            })
        );
        assert_eq!(run_files(&extras), [(PathBuf::from(SYSTEM_PROMPT_PATH), b"Be brief.".to_vec())]);
    }

    #[test]
    fn nothing_given_changes_nothing() {
        let mut env = vec![("PATH".to_string(), "/usr/bin".to_string())];
        run_env(&Extras::default(), Path::new("/state"), &mut env).unwrap();
        assert_eq!(env, [("PATH".to_string(), "/usr/bin".to_string())]);
        assert!(run_files(&Extras::default()).is_empty());
    }
}
