//! What a workspace's own OpenCode configuration would load into OpenCode's server: `.opencode/` directories and
//! `opencode.json(c)` files from the workspace up to its repository's root (OpenCode's `ConfigPaths`), whose
//! plugins and custom tools run inside the server, whose local MCP servers it starts, and whose other settings
//! (commands, formatters, language servers, providers) can run commands too.

use std::path::{Path, PathBuf};

/// At most this many items are named; the rest are counted.
const NAMED: usize = 12;

/// What the workspace's configuration consists of, in words, one item each (empty: it has none). Read from the
/// workspace and its parents up to the one holding `.git` (all of them when there is none), as OpenCode looks.
pub fn loaders(workspace: &Path) -> Vec<String> {
    let mut items = Vec::new();
    for dir in searched(workspace) {
        for name in ["opencode.json", "opencode.jsonc"] {
            config_items(&dir.join(name), &mut items);
        }
        let hidden = dir.join(".opencode");
        if !hidden.is_dir() {
            continue;
        }
        let before = items.len();
        for (sub, what) in
            [("plugin", "plugin"), ("plugins", "plugin"), ("tool", "custom tool"), ("tools", "custom tool")]
        {
            for file in files(&hidden.join(sub)) {
                items.push(format!("{what} `{}`", file.display()));
            }
        }
        if hidden.join("package.json").is_file() {
            items.push(format!("packages installed from `{}`", hidden.join("package.json").display()));
        }
        for name in ["opencode.json", "opencode.jsonc"] {
            config_items(&hidden.join(name), &mut items);
        }
        if items.len() == before {
            items.push(format!("`{}` (commands, agents, skills)", hidden.display()));
        }
    }
    if items.len() > NAMED {
        let more = items.len() - NAMED;
        items.truncate(NAMED);
        items.push(format!("{more} more"));
    }
    items
}

/// The workspace and its parents, up to and with the first one that holds `.git`.
fn searched(workspace: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for dir in workspace.ancestors() {
        dirs.push(dir.to_path_buf());
        if dir.join(".git").exists() {
            break;
        }
    }
    dirs
}

/// Code the agent itself left where OpenCode loads the user's own global plugins and tools: the session's
/// `XDG_CONFIG_HOME/opencode` and `HOME/.opencode` in its state dir `state`, which the sandbox can write. The
/// user's own entries are bound (bubblewrap) or linked (no sandbox) there whole, so a file of the state dir itself
/// under `plugin/` or `tool/` was written by a tool; the next server would load it without asking.
pub fn agent_written(state: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for root in [state.join("config/opencode"), state.join("home/.opencode")] {
        for sub in ["plugin", "plugins", "tool", "tools"] {
            let dir = root.join(sub);
            // A link is the user's own entry (`--sandbox none` links them); only a directory of the state dir counts.
            if std::fs::symlink_metadata(&dir).is_ok_and(|meta| meta.is_dir()) {
                found.extend(files(&dir));
            }
        }
    }
    found
}

/// The regular files of a directory, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).filter(|path| !path.is_dir()).collect();
    files.sort();
    files
}

/// What one config file would start: its local MCP servers and plugins by name, else the file itself.
fn config_items(path: &Path, items: &mut Vec<String>) {
    // Only a regular file is read (a FIFO would hang the turn); one that cannot be read is named all the same.
    if !std::fs::metadata(path).is_ok_and(|meta| meta.is_file()) {
        return;
    }
    let before = items.len();
    let config = crate::agents::opencode::config::read_opencode_config(path).unwrap_or_default();
    for (name, server) in config.get("mcp").and_then(|mcp| mcp.as_object()).into_iter().flatten() {
        if server.get("type").and_then(|t| t.as_str()) == Some("local") {
            let command: Vec<&str> = server
                .get("command")
                .and_then(|c| c.as_array())
                .into_iter()
                .flatten()
                .filter_map(|c| c.as_str())
                .collect();
            items.push(format!("MCP server `{name}` (`{}`) of `{}`", command.join(" "), path.display()));
        }
    }
    for plugin in config.get("plugin").and_then(|p| p.as_array()).into_iter().flatten().filter_map(|p| p.as_str()) {
        items.push(format!("plugin `{plugin}` of `{}`", path.display()));
    }
    if items.len() == before {
        items.push(format!("settings in `{}`", path.display()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugins_and_tools_the_agent_wrote_into_its_own_config_are_found_and_the_users_linked_ones_are_not() {
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("state");
        let users = root.path().join("users-plugins");
        std::fs::create_dir_all(&users).unwrap();
        std::fs::write(users.join("mine.js"), "").unwrap();
        std::fs::create_dir_all(state.join("config/opencode/tool")).unwrap();
        std::fs::create_dir_all(state.join("home/.opencode/plugins")).unwrap();
        std::fs::write(state.join("config/opencode/tool/evil.ts"), "").unwrap();
        std::fs::write(state.join("home/.opencode/plugins/evil.js"), "").unwrap();
        std::os::unix::fs::symlink(&users, state.join("config/opencode/plugin")).unwrap();
        assert_eq!(
            agent_written(&state),
            [state.join("config/opencode/tool/evil.ts"), state.join("home/.opencode/plugins/evil.js")]
        );
        assert_eq!(agent_written(&root.path().join("nowhere")), Vec::<PathBuf>::new());
    }

    #[test]
    fn plugins_tools_mcp_servers_and_settings_are_named() {
        let root = tempfile::tempdir().unwrap();
        let ws = root.path().join("repo/ws");
        std::fs::create_dir_all(root.path().join("repo/.git")).unwrap();
        std::fs::create_dir_all(ws.join(".opencode/plugin")).unwrap();
        std::fs::create_dir_all(ws.join(".opencode/tools")).unwrap();
        std::fs::write(ws.join(".opencode/plugin/p.js"), "").unwrap();
        std::fs::write(ws.join(".opencode/tools/t.ts"), "").unwrap();
        std::fs::write(
            ws.join("opencode.jsonc"),
            r#"{ // a comment
                "mcp": {"m": {"type": "local", "command": ["sh", "-c", "x"]}, "r": {"type": "remote", "url": "u"}},
                "plugin": ["some-plugin"], }"#,
        )
        .unwrap();
        std::fs::write(root.path().join("repo/opencode.json"), r#"{"model": "a/b"}"#).unwrap();
        std::fs::write(root.path().join("opencode.json"), "{}").unwrap();
        let config = ws.join("opencode.jsonc").display().to_string();
        assert_eq!(
            loaders(&ws),
            [
                format!("MCP server `m` (`sh -c x`) of `{config}`"),
                format!("plugin `some-plugin` of `{config}`"),
                format!("plugin `{}`", ws.join(".opencode/plugin/p.js").display()),
                format!("custom tool `{}`", ws.join(".opencode/tools/t.ts").display()),
                format!("settings in `{}`", root.path().join("repo/opencode.json").display()),
            ],
            "nothing above the repository's root"
        );
        let plain = root.path().join("repo/plain");
        std::fs::create_dir_all(plain.join(".opencode/command")).unwrap();
        assert_eq!(
            loaders(&plain),
            [
                format!("`{}` (commands, agents, skills)", plain.join(".opencode").display()),
                format!("settings in `{}`", root.path().join("repo/opencode.json").display()),
            ]
        );
    }
}
