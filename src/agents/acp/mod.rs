//! Agents that speak ACP themselves (`--agent custom --agent-command …`): the agent's own ACP server runs inside the
//! session's sandbox, one process per session, and the bridge is its ACP client.
//!
//! `connection.rs` starts one such process and holds its connection (the official SDK's client role), `service.rs`
//! keeps one per session across turns (the bridge's [`crate::agents::host::Service`]), `engine.rs` drives one turn
//! through it, `files.rs` answers the agent's `fs/*` requests inside the sandbox's view, `terminals.rs` runs its
//! `terminal/*` commands in its sandbox, `route.rs` takes what it says to the turn that runs, and `translate.rs` is the
//! pure translation of its `session/update`s to ours. What the agent asks of its client is answered here, inside
//! the sandbox's policy, and never passed to the editor as it is: the editor would act with the user's full rights.

mod connection;
mod engine;
mod files;
pub mod offers;
pub mod options;
mod route;
mod service;
mod terminals;
pub mod translate;
mod wire;

/// The service of an agent that speaks ACP: `name` for messages, `args` after its executable. Every ACP agent's
/// [`Agent::service`] is this, so that its folder says only what is its own (package, keys, configuration).
/// `offers`: what the version the project installs announces of itself ([`offers::Offers`]), offered until the agent
/// announced its own.
pub fn service(
    name: &'static str,
    args: Vec<String>,
    bounds: &ServiceSettings,
    offers: Option<serde_json::Value>,
) -> Arc<dyn Service> {
    Arc::new(service::AcpService::new(name, args, bounds, offers.and_then(offers::Offers::parse)))
}

/// [`service`] of an agent that needs `before_load` (a `sh` script, the agent's session id as `$1`) run in its
/// sandbox, as the agent's user, before a new process of it loads a session of its own.
pub fn service_preparing_loads(
    name: &'static str,
    args: Vec<String>,
    bounds: &ServiceSettings,
    offers: Option<serde_json::Value>,
    before_load: &'static str,
) -> Arc<dyn Service> {
    Arc::new(
        service::AcpService::new(name, args, bounds, offers.and_then(offers::Offers::parse)).before_load(before_load),
    )
}

/// The translator of an ACP agent's updates, for its [`Agent::translator`].
pub fn translator(context: TranslateContext) -> Box<dyn Translator> {
    Box::new(translate::AcpTranslator::new(context))
}

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::host::{Service, ServiceSettings};
use super::{Agent, AgentKind, AgentSettings, Login, TranslateContext, Translator};
use crate::sandbox::package::NpmPackage;

/// Any ACP agent, named by its command line.
pub struct Custom;

/// Its entry of [`crate::agents::AGENTS`].
pub const AGENT: AgentKind = AgentKind::of(&Custom);

/// An ACP agent's command line: an executable and its arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandLine {
    /// The executable (a path, or a name looked up on PATH).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

/// Splits a command line the way a POSIX shell splits words (quotes, backslashes), without running a shell.
pub fn parse_command_line(text: &str) -> Result<CommandLine, String> {
    let words = shlex::split(text).ok_or_else(|| format!("cannot split {text:?} into words (an unclosed quote?)"))?;
    let mut words = words.into_iter();
    let program = words.next().filter(|word| !word.is_empty()).ok_or("the command line is empty")?;
    Ok(CommandLine { program: PathBuf::from(program), args: words.collect() })
}

/// The custom agent's own settings of the bridge.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct Settings {
    /// The ACP agent `--agent custom` runs in each session's sandbox: its command line (split into words like a shell
    /// does, no shell runs it). Its folder is shown read-only inside; it speaks ACP on its stdin and stdout.
    #[arg(long, global = true, env = "ACP_SANDBOX_AGENT_COMMAND", value_parser = parse_command_line, value_name = "COMMAND")]
    pub agent_command: Option<CommandLine>,
}

impl Agent for Custom {
    fn id(&self) -> &'static str {
        "custom"
    }

    fn name(&self) -> &'static str {
        "ACP agent"
    }

    fn package(&self) -> NpmPackage {
        // Never installed: `--agent-command` names the agent, and the bridge refuses to start without it.
        NpmPackage {
            name: "acp-sandbox-custom-agent",
            version: "0.0.0",
            bin: "acp-agent",
            postinstall: None,
            companions: &[],
        }
    }

    fn bin_override<'a>(&self, settings: &'a AgentSettings) -> Option<&'a PathBuf> {
        settings.acp.agent_command.as_ref().map(|command| &command.program)
    }

    fn bin_setting(&self) -> Option<(&'static str, &'static str, &'static str)> {
        Some(("agent_command", "--agent-command", "ACP_SANDBOX_AGENT_COMMAND"))
    }

    fn settings_problem(&self, settings: &AgentSettings) -> Option<String> {
        settings.acp.agent_command.is_none().then(|| {
            "--agent custom runs the ACP agent that --agent-command (ACP_SANDBOX_AGENT_COMMAND) names: set it, e.g. \
             --agent-command 'my-agent --acp'"
                .to_string()
        })
    }

    fn translator(&self, context: TranslateContext) -> Box<dyn Translator> {
        translator(context)
    }

    fn passes_env(&self, _name: &str) -> bool {
        // Only what `--pass-env` names: the bridge cannot know which keys an arbitrary agent needs.
        false
    }

    fn service_hosts(&self) -> &'static [&'static str] {
        &[]
    }

    fn user_config(
        &self,
        _user_config_dir: &Path,
        _user_data_dir: &Path,
        _state_dir: &Path,
    ) -> Vec<(PathBuf, PathBuf)> {
        Vec::new()
    }

    fn login(&self) -> Login {
        Login::None
    }

    fn takes_system_prompt(&self) -> bool {
        true
    }

    fn accepts_images(&self) -> bool {
        // Passed on as they are where the agent says it takes them (`promptCapabilities.image`), else left out with a
        // note: its ACP service decides, by what it announced.
        true
    }

    fn accepts_audio(&self) -> bool {
        // As images (`promptCapabilities.audio`).
        true
    }

    fn takes_mcp_servers(&self) -> bool {
        true
    }

    fn serves(&self, _settings: &AgentSettings) -> bool {
        true
    }

    fn service(&self, settings: &AgentSettings, bounds: &ServiceSettings) -> Option<Arc<dyn Service>> {
        let args = settings.acp.agent_command.as_ref().map(|command| command.args.clone()).unwrap_or_default();
        Some(service(self.name(), args, bounds, None))
    }

    fn describe_backend(&self, settings: &AgentSettings, _server: Result<&str, &str>) -> Option<String> {
        let command = settings.acp.agent_command.as_ref()?;
        Some(format!(
            "runs `{}` as an ACP agent, one process per session in its sandbox; the bridge is its ACP client",
            std::iter::once(command.program.display().to_string())
                .chain(command.args.iter().cloned())
                .collect::<Vec<_>>()
                .join(" ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_splits_like_a_shell_without_one() {
        assert_eq!(
            parse_command_line(r#"/opt/my agent/run --acp "two words" it\'s"#),
            Ok(CommandLine {
                program: PathBuf::from("/opt/my"),
                args: vec!["agent/run".into(), "--acp".into(), "two words".into(), "it's".into()],
            })
        );
        assert_eq!(
            parse_command_line(r#"'/opt/my agent/run' --acp"#),
            Ok(CommandLine { program: PathBuf::from("/opt/my agent/run"), args: vec!["--acp".into()] })
        );
        assert_eq!(parse_command_line("   "), Err("the command line is empty".to_string()));
        assert_eq!(
            parse_command_line("agent 'open"),
            Err("cannot split \"agent 'open\" into words (an unclosed quote?)".to_string())
        );
    }
}
