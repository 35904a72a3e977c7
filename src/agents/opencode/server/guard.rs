//! The guard plugin the bridge gives each warm server: no tool of the server finds its password.
//!
//! OpenCode takes its password from `OPENCODE_SERVER_PASSWORD`, so the server's initial environment must hold
//! it, and every tool the server runs inherits `process.env`. Before each start the bridge writes `guard.js`
//! into the session's state dir and names it in `OPENCODE_CONFIG_CONTENT`'s `plugin` list; OpenCode loads it with
//! the first project, before any tool can run. It deletes the password from `process.env` (OpenCode reads it
//! once, when the server starts listening: measured with 1.18.33, the server still refuses a request without it
//! afterwards) and makes the server non-dumpable, so that a process of the same user without `CAP_SYS_PTRACE`
//! (bubblewrap drops every capability) reads neither `/proc/<server>/environ`, which shows the initial
//! environment whatever `process.env` holds now, nor the server's memory. Then it prints [`MARKER`]; the bridge
//! sends no prompt to a server it has not seen print it. `sandbox-init` never holds the password in its own
//! environment's reach either: it is non-dumpable, and outside the Landlock domain of the server's tree.

use std::path::Path;

/// The plugin.
pub const PLUGIN: &str = include_str!("guard.js");

/// The line the plugin prints on the server's stderr once its work is done.
pub const MARKER: &str = "ACP_SANDBOX_SERVER_GUARD_ON";

/// Where the plugin is written in the session's state dir before each start (the state dir is the agent's, so it
/// is written again every time, replacing whatever is there).
pub const PLUGIN_PATH: &str = "acp-sandbox/opencode-server-guard.js";

/// Adds the plugin at `plugin` to `OPENCODE_CONFIG_CONTENT` in `env`, keeping whatever the user's own value says.
pub fn add_plugin(env: &mut Vec<(String, String)>, plugin: &Path) -> Result<(), String> {
    crate::agents::opencode::mcp::edit_config_content(env, |config| {
        let plugins = config.entry("plugin").or_insert_with(|| serde_json::json!([]));
        let Some(plugins) = plugins.as_array_mut() else {
            return Err("the `plugin` of OPENCODE_CONFIG_CONTENT is not a list".to_string());
        };
        plugins.push(file_url(plugin).into());
        Ok(())
    })
}

/// A `file://` URL of an absolute path, every byte but the unreserved ones and `/` percent-encoded.
fn file_url(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    const PATH: &percent_encoding::AsciiSet = &crate::sandbox::UNRESERVED.remove(b'/');
    format!("file://{}", percent_encoding::percent_encode(path.as_os_str().as_bytes(), PATH))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_joins_the_users_own_config_content() {
        let plugin = Path::new("/s/acp sandbox/guard.js");
        let mut env = vec![("A".to_string(), "1".to_string())];
        add_plugin(&mut env, plugin).unwrap();
        assert_eq!(
            env[1],
            ("OPENCODE_CONFIG_CONTENT".into(), r#"{"plugin":["file:///s/acp%20sandbox/guard.js"]}"#.into())
        );
        let mut env = vec![(
            "OPENCODE_CONFIG_CONTENT".to_string(),
            "{\n // the user's\n \"plugin\": [\"theirs\"], \"model\": \"x/y\",\n}".to_string(),
        )];
        add_plugin(&mut env, plugin).unwrap();
        let config: serde_json::Value = serde_json::from_str(&env[0].1).unwrap();
        assert_eq!(
            config,
            serde_json::json!({"plugin": ["theirs", "file:///s/acp%20sandbox/guard.js"], "model": "x/y"})
        );
        assert_eq!(env.len(), 1);
    }

    #[test]
    fn config_content_it_cannot_extend_is_refused() {
        for bad in ["[1]", "{\"plugin\": \"one\"}", "{not json"] {
            let mut env = vec![("OPENCODE_CONFIG_CONTENT".to_string(), bad.to_string())];
            assert!(add_plugin(&mut env, Path::new("/g.js")).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_plugin_prints_the_marker_only_once_it_is_done() {
        let done = PLUGIN.find("guarded = true").unwrap();
        let printed = PLUGIN.find(&format!("console.error(\"{MARKER}\")")).unwrap();
        assert!(PLUGIN[..done].contains("delete process.env.OPENCODE_SERVER_PASSWORD"));
        assert!(done < printed);
    }
}
