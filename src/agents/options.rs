//! A session's config options as an agent declares them (ACP `configOptions`): each a select with its choices and
//! the current value, read from the session's stored choices. `session::options` renders and validates them.

use agent_client_protocol::v1::schema::{
    SessionConfigOptionCategory, SessionConfigSelect, SessionConfigSelectOption, SessionConfigSelectOptions,
};
use serde_json::Value;

/// The value meaning "let the CLI use its own default".
pub const DEFAULT: &str = "default";

/// One option as offered: its choices and current value.
#[derive(Clone, Debug)]
pub struct OptionSpec {
    /// The option's id, which is also its key in the session's stored choices.
    pub id: &'static str,
    /// Its name in the editor.
    pub name: &'static str,
    /// What kind of choice it is, for editors that place them (model, mode, thought level).
    pub category: Option<SessionConfigOptionCategory>,
    /// (value, name) of each choice.
    pub choices: Vec<(String, String)>,
    /// The value now in force.
    pub current: String,
}

/// Every choice a select offers, its groups flattened.
pub fn select_choices(select: &SessionConfigSelect) -> Vec<SessionConfigSelectOption> {
    match &select.options {
        SessionConfigSelectOptions::Ungrouped(choices) => choices.clone(),
        SessionConfigSelectOptions::Grouped(groups) => groups.iter().flat_map(|g| g.options.clone()).collect(),
        _ => Vec::new(),
    }
}

/// The stored value of one option of the session.
pub fn stored<'a>(session_config: &'a Value, key: &str) -> Option<&'a str> {
    session_config.get(key).and_then(Value::as_str)
}

/// The stored value of one option, unless it is [`DEFAULT`].
pub fn chosen<'a>(session_config: &'a Value, key: &str) -> Option<&'a str> {
    stored(session_config, key).filter(|value| *value != DEFAULT)
}

/// `text` with its first letter upper-case, for a choice's name.
pub fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Approvals: every tool runs without asking; the sandbox is the boundary.
pub const APPROVALS_AUTO: &str = "auto";
/// Approvals: the agent asks (through the editor) before every tool but reading, searching and planning.
pub const APPROVALS_ASK: &str = "ask";

/// The session's approvals setting (the `approvals` option of an agent that can ask).
pub fn approvals(session_config: &Value) -> &str {
    match stored(session_config, "approvals") {
        Some(APPROVALS_ASK) => APPROVALS_ASK,
        _ => APPROVALS_AUTO,
    }
}

/// The `approvals` option, for an agent that can ask before its tools run.
pub fn approvals_option(session_config: &Value) -> OptionSpec {
    OptionSpec {
        id: "approvals",
        name: "Approvals",
        category: None,
        choices: vec![
            (APPROVALS_AUTO.into(), "Auto (the sandbox is the boundary)".into()),
            (APPROVALS_ASK.into(), "Ask before anything that edits or runs".into()),
        ],
        current: approvals(session_config).to_string(),
    }
}
