//! OpenCode: how to run `opencode run --format json`, and its events.
//!
//! The prompt goes on stdin, then EOF (OpenCode reads a non-TTY stdin to the end and hangs on an open
//! pipe). The session id (`ses_…`) comes from the first event and is passed back with `--session`, from
//! the same directory: OpenCode binds a session to the `PWD` it was created in.

pub mod catalog;
pub mod events;
pub mod project;
pub mod providers;
pub mod serve;
pub mod translate;

use std::path::{Path, PathBuf};

use super::TurnRequest;
use crate::sandbox::install::NpmPackage;

/// The pinned npm package installed on first use.
pub const PACKAGE: NpmPackage =
    NpmPackage { name: "opencode-ai", version: "1.18.33", bin: "opencode", postinstall: Some("postinstall.mjs") };

/// The argv after the executable.
pub fn args(turn: &TurnRequest<'_>) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--format", "json", "--auto", "--thinking"].map(String::from).to_vec();
    if let Some(model) = turn.model {
        args.extend(["--model".to_string(), model.to_string()]);
    }
    if let Some(variant) = turn.variant {
        args.extend(["--variant".to_string(), variant.to_string()]);
    }
    // The session's mode is one of OpenCode's primary agents (build, plan).
    if let Some(agent) = turn.mode {
        args.extend(["--agent".to_string(), agent.to_string()]);
    }
    if let Some(session) = turn.native_id {
        args.extend(["--session".to_string(), session.to_string()]);
    }
    if let Some(command) = turn.command {
        // The prompt on stdin becomes the command's arguments.
        args.extend(["--command".to_string(), command.to_string()]);
    }
    for file in turn.files {
        args.extend(["--file".to_string(), file.display().to_string()]);
    }
    args
}

/// Whether a variable of the user's environment reaches OpenCode by its name alone: its own settings. Provider
/// credentials are passed by exact name ([`providers`]), never by a pattern such as `*_API_KEY`.
pub fn passes_env(name: &str) -> bool {
    name.starts_with("OPENCODE_")
}

/// Fixed variables: no self-update inside a sandbox.
pub fn fixed_env() -> Vec<(String, String)> {
    vec![("OPENCODE_DISABLE_AUTOUPDATE".into(), "1".into())]
}

/// The user's OpenCode configuration and credentials, shown read-only inside the session's state dir.
pub fn user_config(user_config_dir: &Path, user_data_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    vec![
        (user_config_dir.join("opencode"), state_dir.join("config").join("opencode")),
        (user_data_dir.join("opencode").join("auth.json"), state_dir.join("data").join("opencode").join("auth.json")),
    ]
}

/// OpenCode's logins (`opencode auth login`) and its MCP servers' OAuth tokens.
pub const CREDENTIAL_FILES: &[&str] = &["auth.json", "mcp-auth.json"];

/// The user's `auth.json` as `OPENCODE_AUTH_CONTENT`, which OpenCode reads instead of the file (1.18 does).
pub fn credential_env(user_data_dir: &Path) -> Vec<(String, String)> {
    match std::fs::read_to_string(user_data_dir.join("opencode").join("auth.json")) {
        Ok(text) if !text.trim().is_empty() => vec![("OPENCODE_AUTH_CONTENT".into(), text)],
        _ => Vec::new(),
    }
}

/// Whether stderr says the `--session` we passed is gone (the state dir was lost).
pub fn session_missing(stderr: &str) -> bool {
    stderr.contains("Session not found")
}

/// A slash command OpenCode runs non-interactively (`opencode run --command NAME`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// The name, typed as `/name`.
    pub name: String,
    /// What it does.
    pub description: String,
    /// A hint for its arguments, if it takes any.
    pub hint: Option<String>,
}

/// OpenCode's commands: its built-ins, then the user's (`command` in `opencode.json`, Markdown files in
/// `command/` or `commands/` of the user's config dir and of the workspace's `.opencode/`). Later
/// definitions of a name replace earlier ones, as in OpenCode.
pub fn commands(user_config_dir: &Path, workspace: &Path) -> Vec<Command> {
    let mut commands = vec![
        Command { name: "init".into(), description: "guided AGENTS.md setup".into(), hint: None },
        Command {
            name: "review".into(),
            description: "review changes [commit|branch|pr], defaults to uncommitted".into(),
            hint: Some("commit|branch|pr".into()),
        },
    ];
    let mut add = |command: Command| {
        commands.retain(|existing| existing.name != command.name);
        commands.push(command);
    };
    for dir in [user_config_dir.join("opencode"), workspace.join(".opencode")] {
        for name in ["opencode.json", "opencode.jsonc"] {
            let Some(config) = crate::config::read_opencode_config(&dir.join(name)) else { continue };
            for (name, body) in config.get("command").and_then(|c| c.as_object()).into_iter().flatten() {
                let description = body.get("description").and_then(|d| d.as_str()).unwrap_or("custom command");
                add(Command { name: name.clone(), description: description.to_string(), hint: None });
            }
        }
        for sub in ["command", "commands"] {
            let Ok(entries) = std::fs::read_dir(dir.join(sub)) else { continue };
            let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for file in files {
                if file.extension().and_then(|e| e.to_str()) != Some("md") {
                    continue;
                }
                let Some(name) = file.file_stem().and_then(|s| s.to_str()) else { continue };
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                let description = front_matter(&text, "description").unwrap_or_else(|| "custom command".into());
                add(Command { name: name.to_string(), description, hint: None });
            }
        }
    }
    commands
}

/// A `key: value` of a Markdown file's front matter.
fn front_matter(text: &str, key: &str) -> Option<String> {
    let body = text.strip_prefix("---")?;
    let end = body.find("\n---")?;
    body[..end].lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name.trim() == key).then(|| value.trim().trim_matches('"').trim_matches('\'').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_session_is_recognized_in_the_real_stderr() {
        let stderr = include_str!("../../../tests/fixtures/opencode/opencode-session-notfound.stderr.txt");
        assert!(session_missing(stderr), "{stderr:?}");
        assert!(!session_missing("Error: fake upstream error"));
    }

    #[test]
    fn only_its_own_settings_reach_opencode_by_name_alone() {
        assert!(passes_env("OPENCODE_CONFIG"));
        for name in ["ANTHROPIC_API_KEY", "STRIPE_API_KEY", "MY_API_TOKEN", "AWS_SECRET_ACCESS_KEY", "GOOGLE_X", "HOME"]
        {
            assert!(!passes_env(name), "{name}");
        }
    }

    #[test]
    fn commands_are_the_builtins_plus_the_users_and_the_projects() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        let workspace = dir.path().join("ws");
        std::fs::create_dir_all(config.join("opencode/command")).unwrap();
        std::fs::create_dir_all(workspace.join(".opencode/commands")).unwrap();
        std::fs::write(
            config.join("opencode/opencode.json"),
            r#"{"command": {"test": {"template": "run the tests", "description": "Run tests"}}}"#,
        )
        .unwrap();
        std::fs::write(config.join("opencode/command/fix.md"), "---\ndescription: Fix the build\n---\nFix it").unwrap();
        std::fs::write(workspace.join(".opencode/commands/test.md"), "no front matter").unwrap();
        let names: Vec<(String, String)> =
            commands(&config, &workspace).into_iter().map(|c| (c.name, c.description)).collect();
        assert_eq!(
            names,
            [
                ("init".to_string(), "guided AGENTS.md setup".to_string()),
                ("review".into(), "review changes [commit|branch|pr], defaults to uncommitted".into()),
                ("fix".into(), "Fix the build".into()),
                ("test".into(), "custom command".into()),
            ]
        );
    }

    #[test]
    fn commands_of_a_jsonc_config_with_block_comments_and_trailing_commas_are_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws/.opencode")).unwrap();
        std::fs::write(
            dir.path().join("ws/.opencode/opencode.jsonc"),
            "{\n  /* team commands */\n  \"command\": {\n    \"deploy\": { \"description\": \"Ship it\", }, // prod\n  },\n}\n",
        )
        .unwrap();
        let found = commands(&dir.path().join("no-config"), &dir.path().join("ws"));
        assert!(found.iter().any(|c| c.name == "deploy" && c.description == "Ship it"), "{found:?}");
    }
}
