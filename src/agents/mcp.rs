//! The editor's MCP servers as an agent inside the sandbox is configured with them: a stdio server's command
//! wrapped so it starts with exactly the editor's variables over the sandbox's plain base (never the agent's
//! credentials), and the network endpoints an http/sse server needs.

use std::collections::BTreeMap;

use agent_client_protocol::v1::schema::McpServer;

/// The variables of the agent's environment a stdio server keeps, with [`crate::sandbox::NETWORK_ENV`]: what any
/// program needs to run in the sandbox and reach its network, none of them a secret. Everything else (the model's
/// key above all) is left behind.
pub const KEPT: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "USER",
    "LOGNAME",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
];

/// A stdio server as the agent starts it: `program` and `args` (a shell that clears the environment and keeps
/// only the sandbox's base and the editor's variables, by name), and `env`, the editor's variables, which the agent
/// sets for the server's process: their values are never on a command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stdio {
    /// `/bin/sh`.
    pub program: String,
    /// The wrapper script, then the editor's command and arguments.
    pub args: Vec<String>,
    /// The editor's variables.
    pub env: BTreeMap<String, String>,
}

/// Whether `name` can be passed on by a POSIX shell: a stdio server's variable must be.
pub fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// How the agent starts a stdio server: a kept variable that is not set where it starts stays unset.
pub fn stdio(server: &agent_client_protocol::v1::schema::McpServerStdio) -> Stdio {
    let editor: BTreeMap<String, String> = server
        .env
        .iter()
        .filter(|variable| is_variable_name(&variable.name))
        .map(|variable| (variable.name.clone(), variable.value.clone()))
        .collect();
    let mut assignments: Vec<String> = KEPT
        .iter()
        .chain(crate::sandbox::NETWORK_ENV)
        .filter(|name| !editor.contains_key(**name))
        .map(|name| format!("${{{name}+\"{name}=${name}\"}}"))
        .collect();
    assignments.extend(editor.keys().map(|name| format!("{name}=\"${name}\"")));
    let script = format!("exec env -i {} \"$@\"", assignments.join(" "));
    let mut args = vec!["-c".to_string(), script, format!("mcp-{}", server.name)];
    args.push(server.command.display().to_string());
    args.extend(server.args.iter().cloned());
    Stdio { program: "/bin/sh".into(), args, env: editor }
}

/// The `host:port` each http/sse server needs reached: allowed for the session whatever `--network` says (the
/// user named them in the editor), and only these.
pub fn endpoints(servers: &[McpServer]) -> Vec<(String, u16)> {
    servers
        .iter()
        .filter_map(|server| match server {
            McpServer::Http(http) => super::endpoint_of(&http.url),
            McpServer::Sse(sse) => super::endpoint_of(&sse.url),
            _ => None,
        })
        .collect()
}

/// The server's name, as the editor shows it.
pub fn name(server: &McpServer) -> &str {
    match server {
        McpServer::Stdio(stdio) => &stdio.name,
        McpServer::Http(http) => &http.name,
        McpServer::Sse(sse) => &sse.name,
        // Non-exhaustive: transports this build does not enable.
        _ => "",
    }
}

/// The flag of a CLI's argv whose value holds the editor's MCP servers, secrets included.
pub const CONFIG_FLAG: &str = "--mcp-config";

/// `args` as they may be logged: the value of [`CONFIG_FLAG`] left out.
pub fn loggable(args: &[String]) -> Vec<String> {
    let mut shown = Vec::with_capacity(args.len());
    let mut hide = false;
    for arg in args {
        shown.push(if hide { "<the editor's MCP servers>".to_string() } else { arg.clone() });
        hide = arg == CONFIG_FLAG;
    }
    shown
}

/// A digest of the whole set, secrets included: a server started for one set is not used for another.
pub fn digest(servers: &[McpServer]) -> String {
    if servers.is_empty() {
        return String::new();
    }
    let text = serde_json::to_string(servers).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref()[..6].iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{EnvVariable, McpServerHttp, McpServerSse, McpServerStdio};

    #[test]
    fn a_stdio_server_keeps_only_the_sandboxs_base_and_the_editors_variables_by_name() {
        let server = McpServerStdio::new("files", "/opt/files").args(vec!["--root".into(), "/w".into()]).env(vec![
            EnvVariable::new("TOKEN", "s3cret"),
            EnvVariable::new("PATH", "/mine"),
            EnvVariable::new("bad-name", "x"),
        ]);
        let wrapped = stdio(&server);
        assert_eq!(wrapped.program, "/bin/sh");
        let script = &wrapped.args[1];
        assert!(script.starts_with(r#"exec env -i ${HOME+"HOME=$HOME"} ${LANG+"LANG=$LANG"} "#), "{script}");
        assert!(script.ends_with(r#" PATH="$PATH" TOKEN="$TOKEN" "$@""#), "{script}");
        assert!(!script.contains(r#"${PATH+"#), "{script}");
        assert_eq!(wrapped.args[2..], ["mcp-files", "/opt/files", "--root", "/w"]);
        assert_eq!(
            wrapped.env,
            BTreeMap::from([("PATH".to_string(), "/mine".to_string()), ("TOKEN".to_string(), "s3cret".to_string())])
        );
        assert!(!wrapped.args.iter().any(|arg| arg.contains("s3cret")));
    }

    // A test runs the wrapper itself to see what it passes on (tests may start processes).
    #[allow(clippy::disallowed_methods)]
    #[test]
    fn the_wrapper_runs_the_command_with_exactly_those_variables() {
        let server = McpServerStdio::new("e", "env").env(vec![EnvVariable::new("GIVEN", "a b $c")]);
        let wrapped = stdio(&server);
        let output = std::process::Command::new(&wrapped.program)
            .args(&wrapped.args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("SECRET_KEY", "no")
            .envs(&wrapped.env)
            .output()
            .unwrap();
        let mut lines: Vec<String> = String::from_utf8(output.stdout).unwrap().lines().map(String::from).collect();
        lines.sort();
        assert_eq!(lines, ["GIVEN=a b $c", "PATH=/usr/bin:/bin"]);
    }

    #[test]
    fn the_mcp_config_is_never_logged() {
        let args: Vec<String> = ["-x", "--mcp-config", "{\"secret\": 1}", "--mode", "m"].map(String::from).to_vec();
        assert_eq!(loggable(&args), ["-x", "--mcp-config", "<the editor's MCP servers>", "--mode", "m"]);
    }

    #[test]
    fn http_and_sse_servers_name_their_endpoints_and_the_digest_tells_sets_apart() {
        let servers = vec![
            McpServer::Http(McpServerHttp::new("a", "http://127.0.0.1:7001/mcp")),
            McpServer::Sse(McpServerSse::new("b", "https://mcp.example.com/sse")),
            McpServer::Stdio(McpServerStdio::new("c", "/bin/c")),
        ];
        assert_eq!(endpoints(&servers), [("127.0.0.1".to_string(), 7001), ("mcp.example.com".to_string(), 443)]);
        assert_eq!(digest(&[]), "");
        assert_eq!(digest(&servers).len(), 12);
        assert_ne!(digest(&servers), digest(&servers[..2]));
    }
}
