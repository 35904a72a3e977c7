//! What an ACP agent lets the user choose for its session, as the session's config options: its own config options,
//! and the modes and models of an agent that says them only the older way (`modes`, `models`: Gemini CLI), each kept
//! in the session's stored config with the choices the user made.

use agent_client_protocol::v1::schema::{
    SessionConfigKind, SessionConfigOption, SessionConfigOptionCategory, SessionConfigSelect,
    SessionConfigSelectOption, SessionModeState,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agents::options::select_choices;

/// Where a session's stored config keeps the agent's own config options, as it announced them last.
const OPTIONS: &str = "agent_options";
/// Its modes, where it says them as ACP session modes.
const MODES: &str = "agent_modes";
/// Its models, where it says them as the unstable `models` of `session/new`.
const MODELS: &str = "agent_models";
/// What the user chose, by option: given to each new process of the agent, which would start at its defaults.
const CHOICES: &str = "agent_choices";
/// What the agent said when it made the session, before any choice, and which agent said it: what the next new
/// session of the same agent starts with.
const DEFAULTS: &str = "agent_defaults";
/// The user's choices the agent refused when it was given them, not yet said in the thread.
const REFUSED: &str = "agent_refused";

/// The option offered for an agent's session modes, and the one for its models.
pub const MODE: &str = "mode";
/// See [`MODE`].
pub const MODEL: &str = "model";

/// An agent's models as the unstable ACP schema had them (`models` of `session/new`, set by `session/set_model`),
/// which Gemini CLI still says instead of a model option.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelState {
    /// The model the session uses.
    pub current_model_id: String,
    /// What it may use.
    pub available_models: Vec<ModelEntry>,
}

/// One of [`ModelState::available_models`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelEntry {
    /// Its id, for `session/set_model`.
    pub model_id: String,
    /// Its name, for the user.
    pub name: String,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// How a choice of an offered option reaches the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Via {
    /// `session/set_config_option` of its own option of this id.
    Option(String),
    /// `session/set_mode`.
    Mode,
    /// `session/set_model`.
    Model,
}

/// What the agent said its session's settings are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selectors {
    /// Its own config options; `None`: it never said any.
    pub options: Option<Vec<SessionConfigOption>>,
    /// Its session modes.
    pub modes: Option<SessionModeState>,
    /// Its models.
    pub models: Option<ModelState>,
}

impl Selectors {
    /// What a session's stored config keeps.
    pub fn stored(config: &Value) -> Self {
        fn read<T: serde::de::DeserializeOwned>(config: &Value, key: &str) -> Option<T> {
            config.get(key).and_then(|value| serde_json::from_value(value.clone()).ok())
        }
        Self { options: read(config, OPTIONS), modes: read(config, MODES), models: read(config, MODELS) }
    }

    /// Keeps these in a session's stored config.
    pub fn keep(&self, config: &mut Value) {
        let object = object(config);
        let mut put = |key: &str, value: Option<Value>| match value {
            Some(value) => {
                object.insert(key.to_string(), value);
            }
            None => {
                object.remove(key);
            }
        };
        put(OPTIONS, self.options.as_ref().and_then(|o| serde_json::to_value(o).ok()));
        put(MODES, self.modes.as_ref().and_then(|m| serde_json::to_value(m).ok()));
        put(MODELS, self.models.as_ref().and_then(|m| serde_json::to_value(m).ok()));
    }

    /// The session's options for the editor: the agent's own, then its modes and models as options where it has no
    /// option of that kind (a mode the editor picks then reaches it as `session/set_mode`).
    pub fn offered(&self) -> Vec<SessionConfigOption> {
        let mut offered = self.options.clone().unwrap_or_default();
        if let Some(modes) = &self.modes
            && self.own(MODE).is_none()
        {
            let choices = modes.available_modes.iter().map(|m| (m.id.to_string(), &m.name, &m.description));
            offered.push(select(
                MODE,
                "Mode",
                SessionConfigOptionCategory::Mode,
                modes.current_mode_id.to_string(),
                choices,
            ));
        }
        if let Some(models) = &self.models
            && self.own(MODEL).is_none()
        {
            let choices = models.available_models.iter().map(|m| (m.model_id.clone(), &m.name, &m.description));
            offered.push(select(
                MODEL,
                "Model",
                SessionConfigOptionCategory::Model,
                models.current_model_id.clone(),
                choices,
            ));
        }
        offered
    }

    /// The agent's own option that `id` names: the option of that id, else for [`MODE`] and [`MODEL`] its option of
    /// that category (ACP's `session/set_mode` means the mode option, whatever the agent calls it).
    fn own(&self, id: &str) -> Option<&SessionConfigOption> {
        let own = self.options.as_deref().unwrap_or_default();
        let category = match id {
            MODE => Some(SessionConfigOptionCategory::Mode),
            MODEL => Some(SessionConfigOptionCategory::Model),
            _ => None,
        };
        own.iter()
            .find(|o| o.id.to_string() == id)
            .or_else(|| own.iter().find(|o| category.is_some() && o.category == category))
    }

    /// How a choice of the offered option `id` reaches the agent; `None`: no such option.
    pub fn via(&self, id: &str) -> Option<Via> {
        if let Some(own) = self.own(id) {
            return Some(Via::Option(own.id.to_string()));
        }
        match id {
            MODE if self.modes.is_some() => Some(Via::Mode),
            MODEL if self.models.is_some() => Some(Via::Model),
            _ => None,
        }
    }

    /// The offered option `id` names.
    fn offered_option(&self, id: &str) -> Option<SessionConfigOption> {
        let via = self.via(id)?;
        self.offered().into_iter().find(|o| self.via(&o.id.to_string()).as_ref() == Some(&via))
    }

    /// Whether the option `id` offers `value`.
    pub fn offers(&self, id: &str, value: &str) -> bool {
        self.offered_option(id).is_some_and(|option| match &option.kind {
            SessionConfigKind::Boolean(_) => value == "true" || value == "false",
            SessionConfigKind::Select(select) => select_choices(select).iter().any(|c| c.value.to_string() == value),
            _ => false,
        })
    }

    /// Whether `value` is one the option `id` of the agent named `name` offers: an error that says why not.
    pub fn check(&self, name: &str, id: &str, value: &str) -> Result<(), String> {
        if self.offers(id, value) {
            Ok(())
        } else if self.offered_option(id).is_none() {
            Err(format!("{name} has no option {id:?}"))
        } else {
            Err(format!("{value:?} is not a value of {name}'s option {id:?}"))
        }
    }

    /// Whether the option `id` is a yes or no.
    pub fn is_boolean(&self, id: &str) -> bool {
        self.offered_option(id).is_some_and(|o| matches!(o.kind, SessionConfigKind::Boolean(_)))
    }

    /// The option `id`'s value now.
    pub fn value(&self, id: &str) -> Option<String> {
        match self.offered_option(id)?.kind {
            SessionConfigKind::Boolean(boolean) => Some(boolean.current_value.to_string()),
            SessionConfigKind::Select(select) => Some(select.current_value.to_string()),
            _ => None,
        }
    }

    /// Says `value` is the option `id`'s now (the agent took it, or will be given it when it next starts).
    pub fn select(&mut self, id: &str, value: &str) {
        match self.via(id) {
            Some(Via::Option(own)) => {
                for option in self.options.iter_mut().flatten().filter(|o| o.id.to_string() == own) {
                    match &mut option.kind {
                        SessionConfigKind::Boolean(boolean) => boolean.current_value = value == "true",
                        SessionConfigKind::Select(select) => select.current_value = value.to_string().into(),
                        _ => {}
                    }
                }
            }
            Some(Via::Mode) => {
                if let Some(modes) = &mut self.modes {
                    modes.current_mode_id = value.to_string().into();
                }
            }
            Some(Via::Model) => {
                if let Some(models) = &mut self.models {
                    models.current_model_id = value.to_string();
                }
            }
            None => {}
        }
    }
}

/// A select option of `choices` (value, name, description).
fn select<'a>(
    id: &str,
    name: &str,
    category: SessionConfigOptionCategory,
    current: String,
    choices: impl Iterator<Item = (String, &'a String, &'a Option<String>)>,
) -> SessionConfigOption {
    let choices: Vec<SessionConfigSelectOption> = choices
        .map(|(value, name, description)| {
            SessionConfigSelectOption::new(value, name.clone()).description(description.clone())
        })
        .collect();
    SessionConfigOption::new(
        id.to_string(),
        name,
        SessionConfigKind::Select(SessionConfigSelect::new(current, choices)),
    )
    .category(category)
}

/// `config` as an object (a config that is not one is made one).
fn object(config: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !config.is_object() {
        *config = Value::Object(Default::default());
    }
    match config {
        Value::Object(object) => object,
        _ => unreachable!("made an object above"),
    }
}

/// Keeps `selectors` as what the agent named `identity` says of a session it has just made.
pub fn keep_defaults(config: &mut Value, identity: &str, selectors: &Selectors) {
    let mut kept = serde_json::json!({"identity": identity});
    selectors.keep(&mut kept);
    object(config).insert(DEFAULTS.to_string(), kept);
}

/// The config a new session of the agent named `identity` starts with, from the stored config of an earlier one:
/// what that agent said when it made its session, as if this session's agent had said it.
pub fn seeded(earlier: &Value, identity: &str) -> Option<Value> {
    let defaults = earlier.get(DEFAULTS).filter(|defaults| defaults["identity"] == identity)?;
    let mut config = serde_json::json!({});
    Selectors::stored(defaults).keep(&mut config);
    Some(config)
}

/// The choices the user made in a session, in the order made.
pub fn choices(config: &Value) -> Vec<(String, String)> {
    let Some(kept) = config.get(CHOICES).and_then(Value::as_array) else { return Vec::new() };
    kept.iter()
        .filter_map(|pair| Some((pair.get(0)?.as_str()?.to_string(), pair.get(1)?.as_str()?.to_string())))
        .collect()
}

/// Keeps the user's choice of `value` for `id` (the one made last for an option stays), or forgets it (`None`: the
/// agent refused it).
pub fn choose(config: &mut Value, id: &str, value: Option<&str>) {
    let mut kept: Vec<(String, String)> = choices(config).into_iter().filter(|(option, _)| option != id).collect();
    if let Some(value) = value {
        kept.push((id.to_string(), value.to_string()));
    }
    object(config).insert(CHOICES.to_string(), serde_json::json!(kept));
}

/// Keeps the agent's refusal of a choice (`why`, as the thread says it), for the session's next turn to say.
pub fn refused(config: &mut Value, why: &str) {
    let object = object(config);
    let kept = object.entry(REFUSED.to_string()).or_insert_with(|| Value::Array(Vec::new()));
    if !kept.is_array() {
        *kept = Value::Array(Vec::new());
    }
    if let Value::Array(kept) = kept {
        kept.push(Value::String(why.to_string()));
    }
}

/// The refusals [`refused`] kept, forgotten from `config`.
pub fn take_refused(config: &mut Value) -> Vec<String> {
    let Some(kept) = config.as_object_mut().and_then(|object| object.remove(REFUSED)) else { return Vec::new() };
    kept.as_array().into_iter().flatten().filter_map(|why| why.as_str().map(str::to_string)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gemini() -> Selectors {
        Selectors::stored(&json!({
            "agent_modes": {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Default", "description": "Prompts for approval"},
                {"id": "plan", "name": "Plan", "description": "Read-only mode"}]},
            "agent_models": {"currentModelId": "gemini-2.5-flash", "availableModels": [
                {"modelId": "gemini-2.5-flash", "name": "Flash"}, {"modelId": "gemini-2.5-pro", "name": "Pro"}]},
        }))
    }

    fn claude() -> Selectors {
        Selectors::stored(&json!({"agent_options": [
            {"id": "permission", "name": "Mode", "category": "mode", "type": "select", "currentValue": "default",
             "options": [{"value": "default", "name": "Ask"}, {"value": "plan", "name": "Plan"}]},
            {"id": "fast", "name": "Fast", "type": "boolean", "currentValue": false}],
            "agent_modes": {"currentModeId": "default", "availableModes": [{"id": "default", "name": "Ask"}]}}))
    }

    #[test]
    fn modes_and_models_said_the_older_way_are_offered_as_options_and_set_their_own_way() {
        let mut gemini = gemini();
        assert_eq!(
            serde_json::to_value(gemini.offered()).unwrap(),
            json!([
                {"id": "mode", "name": "Mode", "category": "mode", "type": "select", "currentValue": "default",
                 "options": [{"value": "default", "name": "Default", "description": "Prompts for approval"},
                             {"value": "plan", "name": "Plan", "description": "Read-only mode"}]},
                {"id": "model", "name": "Model", "category": "model", "type": "select",
                 "currentValue": "gemini-2.5-flash",
                 "options": [{"value": "gemini-2.5-flash", "name": "Flash"}, {"value": "gemini-2.5-pro", "name": "Pro"}]}
            ])
        );
        assert_eq!(gemini.via("mode"), Some(Via::Mode));
        assert_eq!(gemini.via("model"), Some(Via::Model));
        assert_eq!(gemini.via("effort"), None);
        assert_eq!(gemini.check("Gemini CLI", "mode", "plan"), Ok(()));
        assert_eq!(
            gemini.check("Gemini CLI", "mode", "yolo"),
            Err("\"yolo\" is not a value of Gemini CLI's option \"mode\"".to_string())
        );
        assert_eq!(gemini.check("Gemini CLI", "effort", "high"), Err("Gemini CLI has no option \"effort\"".into()));
        gemini.select("mode", "plan");
        gemini.select("model", "gemini-2.5-pro");
        assert_eq!(gemini.value("mode").as_deref(), Some("plan"));
        assert_eq!(gemini.value("model").as_deref(), Some("gemini-2.5-pro"));
        let mut kept = json!({"other": 1});
        gemini.keep(&mut kept);
        assert_eq!(Selectors::stored(&kept), gemini);
        assert_eq!(kept["other"], 1);
        assert_eq!(kept["agent_modes"]["currentModeId"], "plan");
    }

    #[test]
    fn an_agents_own_mode_option_is_the_mode_whatever_its_id() {
        let mut claude = claude();
        let offered = claude.offered();
        assert_eq!(offered.len(), 2, "its modes are not offered twice: {offered:?}");
        assert_eq!(claude.via("mode"), Some(Via::Option("permission".into())));
        assert_eq!(claude.via("permission"), Some(Via::Option("permission".into())));
        assert_eq!(claude.check("Claude Code", "mode", "plan"), Ok(()));
        assert!(claude.is_boolean("fast"));
        assert!(!claude.is_boolean("permission"));
        assert_eq!(claude.check("Claude Code", "fast", "true"), Ok(()));
        claude.select("mode", "plan");
        claude.select("fast", "true");
        assert_eq!(claude.value("permission").as_deref(), Some("plan"));
        assert_eq!(claude.value("fast").as_deref(), Some("true"));
    }

    #[test]
    fn a_new_session_starts_with_what_the_same_agent_said_of_a_session_it_made() {
        let mut earlier = json!({"agent_choices": [["mode", "plan"]]});
        keep_defaults(&mut earlier, "/opt/gemini --acp", &gemini());
        let seeded = seeded(&earlier, "/opt/gemini --acp").unwrap();
        assert_eq!(Selectors::stored(&seeded), gemini());
        assert_eq!(choices(&seeded), [], "the choices of the earlier session are its own");
        assert_eq!(super::seeded(&earlier, "/opt/other-agent"), None);
        assert_eq!(super::seeded(&json!({}), "/opt/gemini --acp"), None);
    }

    #[test]
    fn the_users_choices_are_kept_last_one_per_option() {
        let mut config = json!({});
        choose(&mut config, "mode", Some("plan"));
        choose(&mut config, "model", Some("pro"));
        choose(&mut config, "mode", Some("yolo"));
        assert_eq!(choices(&config), [("model".to_string(), "pro".to_string()), ("mode".into(), "yolo".into())]);
        choose(&mut config, "model", None);
        assert_eq!(choices(&config), [("mode".to_string(), "yolo".to_string())]);
        assert_eq!(choices(&json!({"agent_choices": "garbage"})), []);
    }

    #[test]
    fn a_refused_choice_is_said_once() {
        let mut config = json!({"agent_refused": "garbage"});
        refused(&mut config, "no plan");
        refused(&mut config, "no opus");
        assert_eq!(take_refused(&mut config), ["no plan", "no opus"]);
        assert_eq!(take_refused(&mut config), Vec::<String>::new());
        assert_eq!(config, json!({}));
    }
}
