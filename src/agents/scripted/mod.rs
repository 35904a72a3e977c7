//! A test-only agent (debug builds only): a CLI that speaks a small JSONL protocol of its own, so that the shared
//! agent suite (`tests/agents.rs`) shows what a third agent needs: this folder, one line in `AGENTS` and one field
//! of `AgentSettings`. Its CLI is `tests/fakes/scripted`.
//!
//! The protocol, one JSON object per stdout line: `{"type":"session","id":…}` (the conversation to continue with
//! `--session ID`), `{"type":"text","text":…}`, `{"type":"end"}`, `{"type":"error","message":…}`. The prompt
//! comes on stdin, then EOF.

use std::path::{Path, PathBuf};

use agent_client_protocol::v1::schema::{ContentBlock, ContentChunk, SessionConfigOptionCategory, SessionUpdate};
use serde_json::Value;

use super::options::{DEFAULT, OptionSpec, stored};
use super::{
    Agent, AgentKind, AgentSettings, Login, ModelInfo, Output, StreamEnd, TranslateContext, Translator, TurnEnd,
    TurnRequest,
};
use crate::sandbox::package::NpmPackage;

/// The scripted agent, as the bridge drives it.
pub struct Scripted;

/// Its entry of [`crate::agents::AGENTS`].
pub const AGENT: AgentKind = AgentKind::of(&Scripted);

/// Its own settings of the bridge.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct Settings {
    /// The scripted agent's CLI (test builds only).
    #[arg(long, global = true, env = "ACP_SANDBOX_SCRIPTED_BIN", hide = true)]
    pub scripted_bin: Option<PathBuf>,
}

impl Agent for Scripted {
    fn id(&self) -> &'static str {
        "scripted"
    }

    fn name(&self) -> &'static str {
        "Scripted"
    }

    fn package(&self) -> NpmPackage {
        // Never published: the CLI is always the one `--scripted-bin` names.
        NpmPackage {
            name: "acp-sandbox-scripted-agent",
            version: "0.0.0",
            bin: "scripted",
            postinstall: None,
            companions: &[],
        }
    }

    fn test_only(&self) -> bool {
        true
    }

    fn bin_override<'a>(&self, settings: &'a AgentSettings) -> Option<&'a PathBuf> {
        settings.scripted.scripted_bin.as_ref()
    }

    fn args(&self, turn: &TurnRequest<'_>) -> Vec<String> {
        match turn.native_id {
            Some(id) => vec!["--session".into(), id.into()],
            None => Vec::new(),
        }
    }

    fn translator(&self, _context: TranslateContext) -> Box<dyn Translator> {
        Box::new(ScriptedTranslator)
    }

    fn session_missing(&self, stderr: &str) -> bool {
        stderr.contains("no such session")
    }

    fn passes_env(&self, name: &str) -> bool {
        name.starts_with("SCRIPTED_")
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
        Login::Own { args: &["login"] }
    }

    /// A model choice over the models given, a mode, and a reasoning level where the chosen model has levels: the
    /// shapes the bridge renders for real agents, for its own tests.
    fn options(&self, session_config: &Value, _settings: &AgentSettings, models: &[ModelInfo]) -> Vec<OptionSpec> {
        let owned = |pairs: &[(&str, &str)]| pairs.iter().map(|(v, n)| (v.to_string(), n.to_string())).collect();
        let model = stored(session_config, "model").unwrap_or(DEFAULT);
        let mut choices: Vec<(String, String)> = owned(&[(DEFAULT, "Default")]);
        choices.extend(models.iter().map(|m| (m.id.clone(), m.name.clone())));
        let mut specs = vec![
            OptionSpec {
                id: "model",
                name: "Model",
                category: Some(SessionConfigOptionCategory::Model),
                choices,
                current: model.to_string(),
            },
            OptionSpec {
                id: "mode",
                name: "Mode",
                category: Some(SessionConfigOptionCategory::Mode),
                choices: owned(&[("fast", "Fast"), ("careful", "Careful")]),
                current: stored(session_config, "mode").unwrap_or("fast").to_string(),
            },
        ];
        if let Some(levels) = models.iter().find(|m| m.id == model).map(|m| &m.variants).filter(|v| !v.is_empty()) {
            specs.push(OptionSpec {
                id: "variant",
                name: "Reasoning",
                category: Some(SessionConfigOptionCategory::ThoughtLevel),
                choices: levels.iter().map(|level| (level.clone(), level.clone())).collect(),
                current: stored(session_config, "variant").unwrap_or(&levels[0]).to_string(),
            });
        }
        specs
    }

    fn chosen_model<'a>(&self, session_config: &'a Value) -> Option<&'a str> {
        stored(session_config, "model")
    }

    fn mode_description(&self, mode: &str) -> Option<&'static str> {
        match mode {
            "fast" => Some("Answers at once"),
            "careful" => Some("Thinks first"),
            _ => None,
        }
    }

    fn default_option(&self) -> &'static str {
        "model"
    }
}

/// The scripted CLI's lines as ACP updates.
struct ScriptedTranslator;

impl Translator for ScriptedTranslator {
    fn line(&mut self, line: &str) -> Vec<Output> {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            return vec![Output::Unparsed { line: line.chars().take(2000).collect() }];
        };
        let text = |key: &str| event[key].as_str().unwrap_or_default().to_string();
        match event["type"].as_str() {
            Some("session") => vec![Output::NativeSessionId { id: text("id") }],
            Some("text") => vec![Output::Update(SessionUpdate::AgentMessageChunk(ContentChunk::new(
                ContentBlock::from(text("text")),
            )))],
            Some("end") => vec![Output::End(TurnEnd::EndTurn)],
            Some("error") => vec![Output::End(TurnEnd::Error { message: text("message") })],
            _ => vec![Output::Unparsed { line: line.chars().take(2000).collect() }],
        }
    }

    fn finish(&mut self, _end: StreamEnd) -> Vec<Output> {
        Vec::new()
    }
}
