//! What the editor gives a session beside its workspace on `session/new`, `load` and `resume`: more roots, a
//! system prompt and its MCP servers; checked, kept with the session (the MCP servers' secrets only in memory)
//! and compared with what the session had.

use std::path::{Path, PathBuf};

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

/// The text of an append-mode system prompt (or an override-mode one, for an agent that replaces its own); any
/// other mode, a block that is not text, or none at all is refused (the spec: an agent must not treat an
/// unsupported mode as another).
pub fn system_prompt_text(agent: AgentKind, prompt: &SystemPrompt) -> Result<String> {
    if !agent.takes_system_prompt() {
        return Err(Error::InvalidParams(format!("{} takes no system prompt here", agent.display_name())));
    }
    let replaces = prompt.mode == SystemPromptMode::Override && agent.replaces_system_prompt();
    if prompt.mode != SystemPromptMode::Append && !replaces {
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
        // The schema's enum is non-exhaustive; its other transports are behind features this build does not enable.
        _ => McpServerShape {
            name: String::new(),
            transport: "unknown".into(),
            target: String::new(),
            args: Vec::new(),
            secrets: Vec::new(),
        },
    }
}

/// Refuses a set of MCP servers the agent could not tell apart or start: an empty or repeated name, a stdio server
/// without a command or with a variable a shell cannot pass on, an http/sse URL that is not `http(s)://host…`.
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

/// The workspace's other roots as a session keeps them: each absolute, an existing directory, not one a workspace
/// could not be either (`refusal`: the whole filesystem, the home, the bridge's data…), normalized like the cwd;
/// the cwd itself and repeats left out, the editor's order kept.
pub fn check_roots(cwd: &Path, roots: &[PathBuf], refusal: impl Fn(&Path) -> Option<String>) -> Result<Vec<String>> {
    let cwd = super::normalize(cwd);
    let mut kept: Vec<String> = Vec::new();
    for root in roots {
        if !root.is_absolute() {
            return Err(Error::InvalidParams(format!(
                "additionalDirectories must be absolute paths, got {}",
                root.display()
            )));
        }
        if let Some(why) = refusal(root) {
            return Err(Error::InvalidParams(format!("additionalDirectories: {why}")));
        }
        if !std::fs::metadata(root).is_ok_and(|meta| meta.is_dir()) {
            return Err(Error::InvalidParams(format!(
                "additionalDirectories: {} is not an existing directory",
                root.display()
            )));
        }
        let root = super::normalize(root);
        if root != cwd && !kept.contains(&root) {
            kept.push(root);
        }
    }
    Ok(kept)
}

/// The session's context after `given`: its system prompt and MCP servers as the editor gave them now (on load and
/// resume a request without them means the session has none), its roots as before unless the request named some
/// (`roots`: those, checked with [`check_roots`]). A request without roots keeps the stored ones rather than
/// clearing them: a client that knows the capability sends them again each time (Zed does), and one that does not
/// (`session/load` from the command line, an older client) must not take a session's roots away by leaving them out.
pub fn context_after(
    agent: AgentKind,
    stored: &SessionContext,
    given: &Given,
    roots: Vec<String>,
) -> Result<SessionContext> {
    check_mcp_servers(&given.mcp_servers)?;
    let system_prompt = match &given.system_prompt {
        Some(prompt) => Some(system_prompt_text(agent, prompt)?),
        None => None,
    };
    Ok(SessionContext {
        additional_directories: if given.additional_directories.is_empty() {
            stored.additional_directories.clone()
        } else {
            roots
        },
        system_prompt,
        system_prompt_replaces: given.system_prompt.as_ref().is_some_and(|p| p.mode == SystemPromptMode::Override),
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
        // An agent that replaces its own prompt takes `override`, and the session keeps that it does.
        let claude = AgentKind::parse("claude").unwrap();
        let replacing = SystemPrompt::new(vec![text("Be brief.")]).mode(SystemPromptMode::Override);
        assert_eq!(system_prompt_text(claude, &replacing).unwrap(), "Be brief.");
        let given = Given { system_prompt: Some(replacing), ..Given::default() };
        let context = context_after(claude, &SessionContext::default(), &given, Vec::new()).unwrap();
        assert!(context.system_prompt_replaces);
        let given = Given { system_prompt: Some(SystemPrompt::new(vec![text("x")])), ..Given::default() };
        assert!(!context_after(claude, &context, &given, Vec::new()).unwrap().system_prompt_replaces);
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
            Vec::new(),
        )
        .unwrap();
        let kept = serde_json::to_string(&context).unwrap();
        assert_eq!(
            kept,
            r#"{"mcpServers":[{"name":"files","transport":"stdio","target":"/bin/files","args":["--root"],"secrets":["TOKEN"]},{"name":"web","transport":"http","target":"http://127.0.0.1:9/mcp","secrets":["Authorization"]}]}"#
        );
    }

    #[test]
    fn roots_are_absolute_existing_directories_a_workspace_could_be_normalized_without_the_cwd_or_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let (cwd, a, b) = (dir.path().join("ws"), dir.path().join("a"), dir.path().join("b"));
        for path in [&cwd, &a, &b] {
            std::fs::create_dir(path).unwrap();
        }
        std::fs::write(dir.path().join("file"), "x").unwrap();
        let never = |_: &Path| None;
        let given = [a.join("./"), cwd.clone(), b.clone(), a.clone(), b.join(".")];
        let show = |path: &Path| path.display().to_string();
        assert_eq!(check_roots(&cwd, &given, never).unwrap(), vec![show(&a), show(&b)]);
        assert_eq!(check_roots(&cwd.join("."), std::slice::from_ref(&cwd), never).unwrap(), Vec::<String>::new());
        let refused =
            |roots: &[PathBuf], refusal: &dyn Fn(&Path) -> Option<String>| match check_roots(&cwd, roots, refusal) {
                Err(Error::InvalidParams(why)) => why,
                other => panic!("{other:?}"),
            };
        assert_eq!(
            refused(&[a.clone(), "rel/dir".into()], &never),
            "additionalDirectories must be absolute paths, got rel/dir"
        );
        assert_eq!(
            refused(&[dir.path().join("missing")], &never),
            format!("additionalDirectories: {} is not an existing directory", dir.path().join("missing").display())
        );
        assert_eq!(
            refused(&[dir.path().join("file")], &never),
            format!("additionalDirectories: {} is not an existing directory", dir.path().join("file").display())
        );
        let home = dir.path().to_path_buf();
        let data = dir.path().join("data");
        let policy = |root: &Path| crate::sandbox::local::policy::workspace_refusal(root, &home, &data);
        assert_eq!(
            refused(&["/".into()], &policy),
            "additionalDirectories: the whole filesystem (/) cannot be a workspace: open a project folder"
        );
        assert!(refused(std::slice::from_ref(&home), &policy).contains("is your home directory"));
        assert!(refused(&["/etc".into()], &policy).contains("is a system directory"));
    }

    #[test]
    fn named_roots_replace_the_stored_ones_and_none_keeps_them() {
        let stored = SessionContext { additional_directories: vec!["/old".into()], ..SessionContext::default() };
        let kept = context_after(opencode(), &stored, &Given::default(), Vec::new()).unwrap();
        assert_eq!(kept.additional_directories, vec!["/old".to_string()]);
        let named = Given { additional_directories: vec!["/new".into()], ..Given::default() };
        let replaced = context_after(opencode(), &stored, &named, vec!["/new".into()]).unwrap();
        assert_eq!(replaced.additional_directories, vec!["/new".to_string()]);
        // Named, but each was the cwd: the session has no other roots any more.
        let cleared = context_after(opencode(), &stored, &named, Vec::new()).unwrap();
        assert_eq!(cleared.additional_directories, Vec::<String>::new());
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
