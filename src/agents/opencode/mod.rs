//! OpenCode: how to run `opencode run --format json`, and its events.
//!
//! The prompt goes on stdin, then EOF (OpenCode reads a non-TTY stdin to the end and hangs on an open
//! pipe). The session id (`ses_…`) comes from the first event and is passed back with `--session`, from
//! the same directory: OpenCode binds a session to the `PWD` it was created in.

pub mod catalog;
pub mod config;
pub mod events;
pub mod project;
pub mod providers;
pub mod serve;
pub mod translate;

use std::path::{Path, PathBuf};

use super::TurnRequest;
use crate::agents::package::NpmPackage;

/// The pinned npm package installed on first use.
pub const PACKAGE: NpmPackage = NpmPackage {
    name: "opencode-ai",
    version: "1.18.33",
    bin: "opencode",
    postinstall: Some("postinstall.mjs"),
    companions: &[PLUGIN_PACKAGE],
};

/// The package OpenCode wants in every config dir before it loads a plugin (the warm server's guard is one).
const PLUGIN_PACKAGE: &str = "@opencode-ai/plugin";

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

/// The plugin package and the manifest that lists it, from the npm prefix the executable was installed into,
/// shown in the session's config dir when the user's own config dir has no packages of its own.
///
/// Before it loads any plugin OpenCode waits until each of its config dirs has `@opencode-ai/plugin` (its
/// `package-lock.json` must name it), and installs it from npm where it is missing: 64 MiB and 15 s for every new
/// session, whose config dir is its own, or a failure where the network is closed. The bridge's install of the CLI
/// brings that package beside it ([`PACKAGE`]), so every session shares one read-only copy.
pub fn plugin_package(executable: &Path, user_config_dir: &Path, state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let users = user_config_dir.join("opencode");
    if ["node_modules", "package.json", "package-lock.json", "bun.lock"].iter().any(|name| users.join(name).exists()) {
        return Vec::new();
    }
    let real = std::fs::canonicalize(executable).unwrap_or_else(|_| executable.to_path_buf());
    let Some(prefix) = real.ancestors().skip(1).find(|dir| {
        dir.join("node_modules").join(PLUGIN_PACKAGE).join("package.json").is_file()
            && lock_names(&dir.join("package-lock.json"), PLUGIN_PACKAGE)
    }) else {
        return Vec::new();
    };
    let target = state_dir.join("config").join("opencode");
    ["node_modules", "package.json", "package-lock.json"]
        .into_iter()
        .map(|name| (prefix.join(name), target.join(name)))
        .collect()
}

/// Whether the lockfile at `path` lists `package` as a direct dependency (what OpenCode checks).
fn lock_names(path: &Path, package: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else { return false };
    serde_json::from_str::<serde_json::Value>(&text)
        .is_ok_and(|lock| lock["packages"][""]["dependencies"].get(package).is_some())
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
            let Some(config) = crate::agents::opencode::config::read_opencode_config(&dir.join(name)) else { continue };
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
    fn the_plugin_package_of_the_install_is_shown_unless_the_user_has_packages() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("tools/opencode-ai@1");
        let bin = prefix.join("node_modules/opencode-linux-x64/bin/opencode");
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        std::fs::write(&bin, "").unwrap();
        let user = dir.path().join("config");
        std::fs::create_dir_all(user.join("opencode")).unwrap();
        let state = dir.path().join("state");
        // No plugin package in the prefix: nothing.
        assert_eq!(plugin_package(&bin, &user, &state), vec![]);
        std::fs::create_dir_all(prefix.join("node_modules/@opencode-ai/plugin")).unwrap();
        std::fs::write(prefix.join("node_modules/@opencode-ai/plugin/package.json"), "{}").unwrap();
        // A lockfile that does not name it would make OpenCode install it anyway.
        std::fs::write(prefix.join("package-lock.json"), r#"{"packages":{"":{"dependencies":{"opencode-ai":"1"}}}}"#)
            .unwrap();
        assert_eq!(plugin_package(&bin, &user, &state), vec![]);
        let lock = r#"{"packages":{"":{"dependencies":{"opencode-ai":"1","@opencode-ai/plugin":"1"}}}}"#;
        std::fs::write(prefix.join("package-lock.json"), lock).unwrap();
        let prefix = prefix.canonicalize().unwrap();
        let target = state.join("config/opencode");
        assert_eq!(
            plugin_package(&bin, &user, &state),
            ["node_modules", "package.json", "package-lock.json"].map(|name| (prefix.join(name), target.join(name)))
        );
        // The user's own packages are theirs: OpenCode installs those as it would without the bridge.
        std::fs::write(user.join("opencode/package.json"), "{}").unwrap();
        assert_eq!(plugin_package(&bin, &user, &state), vec![]);
    }

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
