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
    let config = crate::config::read_opencode_config(path).unwrap_or_default();
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
