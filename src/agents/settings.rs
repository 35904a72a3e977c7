//! Every agent's own settings of the bridge, each declared by its agent and flattened into the command line.

/// The settings of every agent in [`super::AGENTS`], one field each.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct AgentSettings {
    /// OpenCode's.
    #[command(flatten, next_help_heading = "OpenCode")]
    pub opencode: super::opencode::Settings,
    /// Amp's.
    #[command(flatten, next_help_heading = "Amp")]
    pub amp: super::amp::Settings,
    /// The custom ACP agent's.
    #[command(flatten, next_help_heading = "Any ACP agent (--agent custom)")]
    pub acp: super::acp::Settings,
    /// Claude Code's.
    #[command(flatten, next_help_heading = "Claude Code")]
    pub claude: super::claude::Settings,
    /// Codex's.
    #[command(flatten, next_help_heading = "Codex")]
    pub codex: super::codex::Settings,
    /// Gemini CLI's.
    #[command(flatten, next_help_heading = "Gemini CLI")]
    pub gemini: super::gemini::Settings,
    /// The test-only agent's.
    #[cfg(debug_assertions)]
    #[command(flatten)]
    pub scripted: super::scripted::Settings,
}

impl AgentSettings {
    /// Completes what the command line gave with what the agents' own user configuration says (in
    /// `user_config_dir`, when there is one), and tidies the values.
    pub fn resolve(&mut self, user_config_dir: Option<&std::path::Path>) {
        self.amp.tidy();
        if let Some(dir) = user_config_dir {
            self.opencode.read_user_config(dir);
        }
    }
}
