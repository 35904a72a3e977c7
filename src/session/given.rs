//! What the editor gives a session beside its workspace on `session/new`, `load` and `resume`: more roots, a
//! system prompt and its MCP servers; checked, kept with the session (the MCP servers' secrets only in memory)
//! and compared with what the session had.

use std::path::PathBuf;

use agent_client_protocol::v1::schema::{ContentBlock, McpServer, SystemPrompt, SystemPromptMode};

use crate::agents::AgentKind;
use crate::error::{Error, Result};
use crate::store::{McpServerShape, SessionContext};

/// What the editor gave, as the request said it.
#[derive(Clone, Debug, Default)]
pub struct Given {
    /// `additionalDirectories`.
    pub additional_directories: Vec<PathBuf>,
    /// `systemPrompt`.
    pub system_prompt: Option<SystemPrompt>,
    /// `mcpServers`.
    pub mcp_servers: Vec<McpServer>,
}

/// The text of an append-mode system prompt; any other mode, a block that is not text, or none at all is refused
/// (the spec: an agent must not treat an unsupported mode as another).
pub fn system_prompt_text(agent: AgentKind, prompt: &SystemPrompt) -> Result<String> {
    if !agent.takes_system_prompt() {
        return Err(Error::InvalidParams(format!("{} takes no system prompt here", agent.display_name())));
    }
    if prompt.mode != SystemPromptMode::Append {
        return Err(Error::InvalidParams(format!(
            "systemPrompt mode {} is not supported: only append",
            serde_json::to_string(&prompt.mode).unwrap_or_default()
        )));
    }
    if prompt.content.is_empty() {
        return Err(Error::InvalidParams("systemPrompt has no content".into()));
    }
    let mut texts = Vec::new();
    for block in &prompt.content {
        match block {
            ContentBlock::Text(text) => texts.push(text.text.as_str()),
            _ => return Err(Error::InvalidParams("systemPrompt takes only text blocks".into())),
        }
    }
    Ok(texts.join("\n\n"))
}

/// What is kept of an MCP server: what it is and the names of what it was given, never the values.
pub fn shape(server: &McpServer) -> McpServerShape {
    match server {
        McpServer::Stdio(stdio) => McpServerShape {
            name: stdio.name.clone(),
            transport: "stdio".into(),
            target: stdio.command.display().to_string(),
            args: stdio.args.clone(),
            secrets: stdio.env.iter().map(|variable| variable.name.clone()).collect(),
        },
        McpServer::Http(http) => McpServerShape {
            name: http.name.clone(),
            transport: "http".into(),
            target: http.url.clone(),
            args: Vec::new(),
            secrets: http.headers.iter().map(|header| header.name.clone()).collect(),
        },
        McpServer::Sse(sse) => McpServerShape {
            name: sse.name.clone(),
            transport: "sse".into(),
            target: sse.url.clone(),
            args: Vec::new(),
            secrets: sse.headers.iter().map(|header| header.name.clone()).collect(),
        },
        // The schema's other transports are behind features this build does not enable.
        #[allow(unreachable_patterns)]
        _ => McpServerShape {
            name: String::new(),
            transport: "unknown".into(),
            target: String::new(),
            args: Vec::new(),
            secrets: Vec::new(),
        },
    }
}

/// Refuses a set of MCP servers the agent could not tell apart or reach: an empty or repeated name, a stdio
/// command that is not absolute and has no name to look up, an http/sse URL that is not `http(s)://host[:port]…`.
pub fn check_mcp_servers(servers: &[McpServer]) -> Result<()> {
    let mut names = std::collections::HashSet::new();
    for server in servers {
        let shape = shape(server);
        if shape.transport == "unknown" {
            return Err(Error::InvalidParams("an MCP server of a transport this agent does not offer".into()));
        }
        if shape.name.trim().is_empty() {
            return Err(Error::InvalidParams("an MCP server without a name".into()));
        }
        if !names.insert(shape.name.clone()) {
            return Err(Error::InvalidParams(format!("two MCP servers are named {:?}", shape.name)));
        }
        match server {
            McpServer::Stdio(stdio) if stdio.command.as_os_str().is_empty() => {
                return Err(Error::InvalidParams(format!("the MCP server {:?} has no command", shape.name)));
            }
            McpServer::Stdio(stdio) => {
                if let Some(bad) =
                    stdio.env.iter().find(|variable| !crate::agents::mcp::is_variable_name(&variable.name))
                {
                    return Err(Error::InvalidParams(format!(
                        "the MCP server {:?} is given a variable a shell cannot pass on: {:?}",
                        shape.name, bad.name
                    )));
                }
            }
            McpServer::Http(_) | McpServer::Sse(_) if crate::agents::endpoint_of(&shape.target).is_none() => {
                return Err(Error::InvalidParams(format!(
                    "the MCP server {:?} has no http(s) URL with a host: {}",
                    shape.name, shape.target
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The session's context after `given`: its system prompt and MCP servers as the editor gave them now (on load and
/// resume a request without them means the session has none), its roots as before unless new ones were given.
pub fn context_after(agent: AgentKind, stored: &SessionContext, given: &Given) -> Result<SessionContext> {
    check_mcp_servers(&given.mcp_servers)?;
    let system_prompt = match &given.system_prompt {
        Some(prompt) => Some(system_prompt_text(agent, prompt)?),
        None => None,
    };
    Ok(SessionContext {
        additional_directories: stored.additional_directories.clone(),
        system_prompt,
        mcp_servers: given.mcp_servers.iter().map(shape).collect(),
        forked_from: stored.forked_from.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{EnvVariable, HttpHeader, McpServerHttp, McpServerStdio, TextContent};

    fn opencode() -> AgentKind {
        AgentKind::parse("opencode").unwrap()
    }

    fn text(text: &str) -> ContentBlock {
        ContentBlock::Text(TextContent::new(text))
    }

    #[test]
    fn an_append_prompt_is_its_text_blocks_joined_and_every_other_form_is_refused() {
        let prompt = SystemPrompt::new(vec![text("Be brief."), text("Use French.")]);
        assert_eq!(system_prompt_text(opencode(), &prompt).unwrap(), "Be brief.\n\nUse French.");
        let refused = |prompt: SystemPrompt| match system_prompt_text(opencode(), &prompt) {
            Err(Error::InvalidParams(why)) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            refused(SystemPrompt::new(vec![text("x")]).mode(SystemPromptMode::Override)),
            "systemPrompt mode \"override\" is not supported: only append"
        );
        assert_eq!(refused(SystemPrompt::new(vec![])), "systemPrompt has no content");
        let image = ContentBlock::Image(agent_client_protocol::v1::schema::ImageContent::new("AAAA", "image/png"));
        assert_eq!(refused(SystemPrompt::new(vec![text("x"), image])), "systemPrompt takes only text blocks");
    }

    #[test]
    fn what_is_kept_of_an_mcp_server_names_its_secrets_but_never_holds_them() {
        let stdio = McpServer::Stdio(
            McpServerStdio::new("files", "/bin/files")
                .args(vec!["--root".into()])
                .env(vec![EnvVariable::new("TOKEN", "s3cret")]),
        );
        let http = McpServer::Http(
            McpServerHttp::new("web", "http://127.0.0.1:9/mcp").headers(vec![HttpHeader::new("Authorization", "k")]),
        );
        let context = context_after(
            opencode(),
            &SessionContext::default(),
            &Given { mcp_servers: vec![stdio, http], ..Given::default() },
        )
        .unwrap();
        let kept = serde_json::to_string(&context).unwrap();
        assert_eq!(
            kept,
            r#"{"mcpServers":[{"name":"files","transport":"stdio","target":"/bin/files","args":["--root"],"secrets":["TOKEN"]},{"name":"web","transport":"http","target":"http://127.0.0.1:9/mcp","secrets":["Authorization"]}]}"#
        );
    }

    #[test]
    fn mcp_servers_the_agent_could_not_tell_apart_or_reach_are_refused() {
        let refused = |servers: Vec<McpServer>| match check_mcp_servers(&servers) {
            Err(Error::InvalidParams(why)) => why,
            other => panic!("{other:?}"),
        };
        let stdio = |name: &str, command: &str| McpServer::Stdio(McpServerStdio::new(name, command));
        assert_eq!(refused(vec![stdio("a", "/x"), stdio("a", "/y")]), "two MCP servers are named \"a\"");
        assert_eq!(refused(vec![stdio(" ", "/x")]), "an MCP server without a name");
        assert_eq!(refused(vec![stdio("a", "")]), "the MCP server \"a\" has no command");
        assert_eq!(
            refused(vec![McpServer::Http(McpServerHttp::new("w", "ftp://h/x"))]),
            "the MCP server \"w\" has no http(s) URL with a host: ftp://h/x"
        );
        let odd = McpServer::Stdio(McpServerStdio::new("a", "/x").env(vec![EnvVariable::new("A-B", "1")]));
        assert_eq!(refused(vec![odd]), "the MCP server \"a\" is given a variable a shell cannot pass on: \"A-B\"");
        assert!(check_mcp_servers(&[stdio("a", "npx"), stdio("b", "/bin/b")]).is_ok());
    }
}
