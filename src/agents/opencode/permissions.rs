//! What OpenCode may do without asking: the rules the bridge gives it for the session's mode and approvals,
//! composed with the agent's own rules so that neither can loosen the other.
//!
//! OpenCode evaluates a tool call against the agent's rules followed by the session's rules, and the last rule
//! that matches decides (`Permission.evaluate`, `findLast`). A session ruleset that simply allows everything
//! therefore overrides the agent's denials (the plan agent's `edit * deny`). Here the session's rules are built so
//! that the outcome is the stricter of the agent's and the bridge's decision (deny < ask < allow), for every
//! permission and pattern: the bridge's rules first, then each of the agent's rules followed by the bridge's rules
//! again, narrowed to that rule's permission and pattern and made no looser than it.
//!
//! Subagents run in child sessions that inherit only the parent session's `deny` and `external_directory` rules
//! (OpenCode's task tool). Under `ask`, their asks come from the server's configuration instead
//! ([`server_permission`], merged into every agent's rules), whose rules carry the pattern `**` so that they can be
//! told apart from the agent's own and left out of the composition.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::agents::options::APPROVALS_ASK;

/// One of OpenCode's permission rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// The permission (a tool's permission name, or a wildcard).
    pub permission: String,
    /// What it applies to (a path, a command), a wildcard.
    pub pattern: String,
    /// `allow`, `ask` or `deny`.
    pub action: String,
}

impl Rule {
    fn new(permission: &str, pattern: &str, action: &str) -> Rule {
        Rule { permission: permission.into(), pattern: pattern.into(), action: action.into() }
    }
}

/// The pattern of the bridge's own rules where they must be told apart from the agent's (a wildcard that matches
/// what `*` matches: OpenCode turns each `*` into `.*`).
const OURS: &str = "**";

/// Tools that only read or plan: free under `ask`, and the only ones plan mode lets run without asking.
const READ_ONLY: &[&str] =
    &["read", "glob", "grep", "list", "todowrite", "todoread", "question", "skill", "lsp", "codesearch"];

/// What plan mode lets run under `auto` beyond [`READ_ONLY`]: fetching and searching the web change nothing here.
const PLAN_ALSO: &[&str] = &["webfetch", "websearch", "plan_exit"];

/// What the user allowed "always", per session, for the bridge's life. OpenCode's own `always` would allow the
/// pattern for the server's whole instance (every session of a shared server) and after every session rule (over
/// plan mode's refusals), so the bridge answers OpenCode `once` and keeps the rule here for the session's rules.
#[derive(Default)]
pub struct AlwaysAllowed(std::sync::Mutex<std::collections::HashMap<String, Vec<Rule>>>);

impl AlwaysAllowed {
    /// Allows `permission` on each of `patterns` in `session` from now on.
    pub fn allow(&self, session: &str, permission: &str, patterns: &[String]) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let rules = all.entry(session.to_string()).or_default();
        for pattern in patterns {
            let rule = Rule::new(permission, pattern, "allow");
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        }
    }

    /// Whether `session` allowed `permission` "always" on every one of `patterns` (none: never).
    pub fn covers(&self, session: &str, permission: &str, patterns: &[String]) -> bool {
        let rules = self.of(session);
        !patterns.is_empty()
            && patterns.iter().all(|pattern| rules.iter().any(|rule| matches(permission, pattern, rule)))
    }

    /// What `session` was allowed, in the order it was.
    pub fn of(&self, session: &str) -> Vec<Rule> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(session).cloned().unwrap_or_default()
    }
}

/// The bridge's own rules for a session: its approvals, then what its mode promises.
///
/// - `auto`: everything runs (the sandbox is the boundary).
/// - `ask`: everything asks but reading, searching, planning and starting a subagent (whose tools ask in turn).
/// - `plan`: never edits; under `auto`, which has nobody to ask, nothing but [`READ_ONLY`] and [`PLAN_ALSO`] runs
///   (no commands, no subagents, no other tools); under `ask` the rest asks.
/// - `allowed`: the session's "always" answers ([`AlwaysAllowed`]), under `ask`, before the mode's refusals.
pub fn bridge_rules(approvals: &str, plan: bool, allowed: &[Rule]) -> Vec<Rule> {
    let ask = approvals == APPROVALS_ASK;
    let mut rules = vec![Rule::new("*", "*", if ask { "ask" } else { "allow" })];
    if ask {
        rules.extend(READ_ONLY.iter().chain(&["task"]).map(|tool| Rule::new(tool, "*", "allow")));
        // What the user allowed "always" in this session: after the asking, before the mode's refusals.
        rules.extend(allowed.iter().cloned());
    }
    if plan {
        rules.extend(plan_rules(ask));
    }
    rules
}

/// What plan mode adds. The tools it refuses by name are refused again after the allowed ones, so that a
/// configuration whose `permission` keys come in another order (`OPENCODE_PERMISSION` is merged into it key by
/// key) still refuses them.
fn plan_rules(ask: bool) -> Vec<Rule> {
    let mut rules = Vec::new();
    if !ask {
        rules.push(Rule::new("*", OURS, "deny"));
        rules.extend(READ_ONLY.iter().chain(PLAN_ALSO).map(|tool| Rule::new(tool, OURS, "allow")));
        rules.extend(["bash", "task"].iter().map(|tool| Rule::new(tool, OURS, "deny")));
    }
    rules.push(Rule::new("edit", OURS, "deny"));
    rules
}

/// The session's rules: the bridge's, composed with the agent's (`agent`, as `GET /agent` reports them) so that
/// each call gets the stricter of the two decisions. The server-wide rules of [`server_permission`] are left out of
/// the agent's: they only stand in for these in child sessions.
pub fn session_rules(ours: &[Rule], agent: &[Rule]) -> Vec<Rule> {
    let injected = server_rules();
    let mut rules = ours.to_vec();
    for rule in agent.iter().filter(|rule| !injected.contains(rule)) {
        rules.push(rule.clone());
        if rule.action == "deny" {
            continue;
        }
        for own in ours {
            let Some(permission) = narrowed(&own.permission, &rule.permission) else { continue };
            let action = if rule.action == "ask" && own.action == "allow" { "ask" } else { own.action.as_str() };
            rules.push(Rule::new(&permission, &rule.pattern, action));
        }
    }
    rules
}

/// The permission a rule of ours for `own` covers within `theirs`, when the two overlap.
fn narrowed(own: &str, theirs: &str) -> Option<String> {
    if own == "*" {
        return Some(theirs.to_string());
    }
    wildcard(own, theirs).then(|| own.to_string())
}

/// Whether `rule` applies to a call of `permission` on `pattern`.
pub fn matches(permission: &str, pattern: &str, rule: &Rule) -> bool {
    wildcard(permission, &rule.permission) && wildcard(pattern, &rule.pattern)
}

/// OpenCode's wildcard match (`Wildcard.match`): `*` any run, `?` one character, the rest literal.
fn wildcard(text: &str, pattern: &str) -> bool {
    let (text, pattern): (Vec<char>, Vec<char>) = (text.chars().collect(), pattern.chars().collect());
    let (mut t, mut p, mut star, mut from) = (0, 0, None, 0);
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == '?' || pattern[p] == text[t]) && pattern[p] != '*' {
            t += 1;
            p += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            star = Some(p);
            from = t;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            from += 1;
            t = from;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// The rules [`server_permission`] adds to every agent of a server started for `ask`. Those that change or run
/// something are named too, for the same reason as in [`plan_rules`].
fn server_rules() -> Vec<Rule> {
    let mut rules = vec![Rule::new("*", OURS, "ask")];
    rules.extend(READ_ONLY.iter().map(|tool| Rule::new(tool, OURS, "allow")));
    rules.extend(ASKED.iter().map(|tool| Rule::new(tool, OURS, "ask")));
    rules
}

/// The session's other roots as `external_directory` rules, for after every other rule: OpenCode asks before a tool
/// touches a path outside its project with the pattern `<dir>/*` (whose `*` runs over `/`), so `<root>/*` makes
/// each root and everything below it as much the project's as the workspace (what a tool does there is still
/// decided by that tool's own permission: plan mode still edits nothing). The agent's own `external_directory`
/// denials (`agent`: its rules, or none under `run`, where the configuration's come after these) follow them
/// again, so that they still win.
pub fn root_rules(roots: &[String], agent: &[Rule]) -> Vec<Rule> {
    if roots.is_empty() {
        return Vec::new();
    }
    let mut rules: Vec<Rule> =
        roots.iter().map(|root| Rule::new("external_directory", &format!("{root}/*"), "allow")).collect();
    rules.extend(
        agent.iter().filter(|rule| rule.action == "deny" && wildcard("external_directory", &rule.permission)).cloned(),
    );
    rules
}

/// What changes or runs something among OpenCode's own permissions.
const ASKED: &[&str] = &["edit", "bash", "webfetch", "websearch", "external_directory"];

/// `OPENCODE_PERMISSION` for a server started for `approvals`: under `ask`, every agent (the subagents' child
/// sessions too, which the session's rules do not reach) asks before anything but reading; `user` is the user's
/// own value, kept underneath. `None`: the user's value, untouched.
pub fn server_permission(approvals: &str, user: Option<&str>) -> Option<String> {
    (approvals == APPROVALS_ASK).then(|| merged(user, &server_rules()))
}

/// `OPENCODE_PERMISSION` for a turn of `opencode run` (no session rules there): in plan mode every agent gets the
/// plan rules of `auto` (`run` has nobody to ask), and the session's other roots are the project's
/// ([`root_rules`]). `None`: the user's value, untouched.
pub fn run_permission(plan: bool, roots: &[String], user: Option<&str>) -> Option<String> {
    let mut rules = if plan { plan_rules(false) } else { Vec::new() };
    rules.extend(root_rules(roots, &[]));
    (!rules.is_empty()).then(|| merged(user, &rules))
}

/// Sets `name` in a command's environment to what `value` makes of the value it had (`None`: leaves it).
pub fn set_env(env: &mut Vec<(String, String)>, name: &str, value: impl FnOnce(Option<&str>) -> Option<String>) {
    let had = env.iter().find(|(existing, _)| existing == name).map(|(_, value)| value.as_str());
    if let Some(value) = value(had) {
        env.retain(|(existing, _)| existing != name);
        env.push((name.to_string(), value));
    }
}

/// The user's `OPENCODE_PERMISSION` (an object, else ignored as OpenCode ignores it) with `rules` after it: OpenCode
/// merges this object over the config's `permission`, then turns it into rules in key order.
fn merged(user: Option<&str>, rules: &[Rule]) -> String {
    let mut object: Map<String, Value> = user
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .and_then(|value| value.as_object().cloned())
        .unwrap_or_default();
    for rule in rules {
        let entry = object.entry(rule.permission.clone()).or_insert_with(|| json!({}));
        if let Value::String(action) = entry {
            *entry = json!({ "*": action.clone() });
        }
        if let Value::Object(patterns) = entry {
            // Appended last, so it decides: a key that was there keeps its place, which is why it is removed first.
            patterns.remove(&rule.pattern);
            patterns.insert(rule.pattern.clone(), json!(rule.action));
        }
    }
    Value::Object(object).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenCode's evaluation: the agent's rules, then the session's; the last match decides, `ask` when none does.
    fn evaluate(permission: &str, pattern: &str, rules: &[Rule]) -> String {
        rules
            .iter()
            .rev()
            .find(|rule| matches(permission, pattern, rule))
            .map(|rule| rule.action.clone())
            .unwrap_or_else(|| "ask".into())
    }

    fn rules(list: &[(&str, &str, &str)]) -> Vec<Rule> {
        list.iter().map(|(permission, pattern, action)| Rule::new(permission, pattern, action)).collect()
    }

    /// The plan agent of OpenCode 1.18.33 as `GET /agent` reports it (shortened).
    fn plan_agent() -> Vec<Rule> {
        rules(&[
            ("*", "*", "allow"),
            ("doom_loop", "*", "ask"),
            ("external_directory", "*", "ask"),
            ("read", "*", "allow"),
            ("read", "*.env", "ask"),
            ("task", "general", "deny"),
            ("edit", "*", "deny"),
            ("edit", ".opencode/plans/*.md", "allow"),
        ])
    }

    fn decide(approvals: &str, plan: bool, agent: &[Rule], permission: &str, pattern: &str) -> String {
        let mut all = agent.to_vec();
        all.extend(session_rules(&bridge_rules(approvals, plan, &[]), agent));
        evaluate(permission, pattern, &all)
    }

    #[test]
    fn the_wildcard_is_opencodes() {
        assert!(wildcard("edit", "*") && wildcard("edit", "**") && wildcard("edit", "e?it") && wildcard("", "*"));
        assert!(wildcard("src/a.rs", "src/*") && !wildcard("src/a.rs", "lib/*") && !wildcard("edit", "bash"));
        assert!(wildcard("a.env", "*.env") && !wildcard("a.env.x", "*.env"));
    }

    #[test]
    fn the_agents_denials_win_over_auto() {
        let agent = plan_agent();
        assert_eq!(decide("auto", false, &agent, "edit", "src/main.rs"), "deny");
        assert_eq!(decide("auto", false, &agent, "task", "general"), "deny");
        assert_eq!(decide("auto", false, &agent, "bash", "ls"), "allow");
        assert_eq!(decide("auto", false, &agent, "read", "a.env"), "ask", "the agent's asks stay asks");
        assert_eq!(decide("auto", false, &rules(&[("*", "*", "allow")]), "edit", "x"), "allow");
    }

    #[test]
    fn plan_mode_never_edits_and_under_auto_runs_only_what_reads() {
        let agent = plan_agent();
        for approvals in ["auto", "ask"] {
            for path in ["src/main.rs", ".opencode/plans/p.md"] {
                assert_eq!(decide(approvals, true, &agent, "edit", path), "deny", "{approvals} {path}");
            }
            assert_eq!(decide(approvals, true, &agent, "read", "src/main.rs"), "allow");
            assert_eq!(decide(approvals, true, &agent, "grep", "fn"), "allow");
        }
        for tool in ["bash", "task", "my_mcp_tool", "edit"] {
            assert_eq!(decide("auto", true, &agent, tool, "x"), "deny", "{tool}");
        }
        assert_eq!(decide("auto", true, &agent, "webfetch", "https://x"), "allow");
        assert_eq!(decide("ask", true, &agent, "bash", "ls"), "ask");
        assert_eq!(decide("ask", true, &agent, "my_mcp_tool", "x"), "ask");
    }

    #[test]
    fn ask_asks_before_anything_but_reading_and_keeps_the_agents_denials() {
        let agent = rules(&[("*", "*", "allow"), ("bash", "rm *", "deny"), ("bash", "git *", "allow")]);
        assert_eq!(decide("ask", false, &agent, "bash", "rm -rf x"), "deny");
        assert_eq!(decide("ask", false, &agent, "bash", "git status"), "ask", "an agent's allow does not skip the ask");
        assert_eq!(decide("ask", false, &agent, "edit", "a"), "ask");
        assert_eq!(decide("ask", false, &agent, "webfetch", "https://x"), "ask");
        assert_eq!(decide("ask", false, &agent, "some_mcp_tool", "x"), "ask");
        assert_eq!(decide("ask", false, &agent, "read", "a"), "allow");
        assert_eq!(decide("ask", false, &agent, "task", "general"), "allow");
    }

    #[test]
    fn the_servers_own_rules_are_not_taken_for_the_agents() {
        let mut agent = plan_agent();
        agent.extend(server_rules());
        assert_eq!(decide("ask", false, &agent, "edit", "src/main.rs"), "deny", "the plan agent's deny is kept");
        assert_eq!(decide("ask", false, &agent, "bash", "ls"), "ask");
    }

    #[test]
    fn server_and_run_permissions_come_after_the_users_own() {
        assert_eq!(server_permission("auto", Some("{}")), None);
        let value: Value = serde_json::from_str(&server_permission("ask", None).unwrap()).unwrap();
        assert_eq!(value["*"], json!({"**": "ask"}));
        assert_eq!(value["read"], json!({"**": "allow"}));
        let user = r#"{"bash": "deny", "edit": {"src/*": "deny", "**": "allow"}}"#;
        let value: Value = serde_json::from_str(&run_permission(true, &[], Some(user)).unwrap()).unwrap();
        assert_eq!(value["bash"], json!({"*": "deny", "**": "deny"}), "bash stays the user's, then ours");
        let edit: Vec<(&String, &Value)> = value["edit"].as_object().unwrap().iter().collect();
        assert_eq!(edit, [(&"src/*".to_string(), &json!("deny")), (&"**".to_string(), &json!("deny"))], "ours last");
        assert_eq!(value["*"], json!({"**": "deny"}));
        let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        assert_eq!(keys[..2], ["bash", "edit"], "the user's keys keep their places: {keys:?}");
        assert_eq!(run_permission(false, &[], Some(user)), None);
        assert_eq!(
            serde_json::from_str::<Value>(&run_permission(true, &[], Some("not json")).unwrap()).unwrap()["*"]["**"],
            "deny"
        );
    }

    #[test]
    fn the_roots_are_the_projects_for_every_tool_but_the_agents_denials_still_win() {
        let roots = vec!["/home/u/lib".to_string()];
        let agent = rules(&[("*", "*", "allow"), ("external_directory", "*", "ask")]);
        for (approvals, plan) in [("auto", false), ("ask", false), ("auto", true), ("ask", true)] {
            let mut session = agent.clone();
            session.extend(session_rules(&bridge_rules(approvals, plan, &[]), &agent));
            session.extend(root_rules(&roots, &agent));
            assert_eq!(evaluate("external_directory", "/home/u/lib/*", &session), "allow", "{approvals} {plan}");
            assert_eq!(evaluate("external_directory", "/home/u/lib/src/deep/*", &session), "allow");
            assert_ne!(evaluate("external_directory", "/home/u/other/*", &session), "allow", "{approvals} {plan}");
            if plan {
                assert_eq!(evaluate("edit", "/home/u/lib/a.rs", &session), "deny");
            }
        }
        let denying = rules(&[("*", "*", "allow"), ("external_directory", "/home/u/lib/secret/*", "deny")]);
        let mut session = session_rules(&bridge_rules("auto", false, &[]), &denying);
        session.extend(root_rules(&roots, &denying));
        assert_eq!(evaluate("external_directory", "/home/u/lib/secret/*", &session), "deny");
        assert_eq!(evaluate("external_directory", "/home/u/lib/*", &session), "allow");
        assert_eq!(root_rules(&[], &denying), Vec::<Rule>::new());
        assert_eq!(run_permission(false, &roots, None).unwrap(), r#"{"external_directory":{"/home/u/lib/*":"allow"}}"#);
        assert_eq!(run_permission(false, &[], None), None);
    }

    #[test]
    fn an_always_answer_allows_its_pattern_in_its_session_only_and_never_over_plan_modes_refusals() {
        let always = AlwaysAllowed::default();
        always.allow("s1", "bash", &["git status *".into()]);
        always.allow("s1", "edit", &["*".into()]);
        always.allow("s1", "bash", &["git status *".into()]);
        assert_eq!(always.of("s1").len(), 2, "an answer given twice is kept once");
        assert!(always.of("s2").is_empty());
        let build = bridge_rules(APPROVALS_ASK, false, &always.of("s1"));
        assert_eq!(evaluate("bash", "git status -s", &build), "allow");
        assert_eq!(evaluate("bash", "rm -rf x", &build), "ask");
        assert_eq!(evaluate("edit", "src/a.rs", &build), "allow");
        let plan = bridge_rules(APPROVALS_ASK, true, &always.of("s1"));
        assert_eq!(evaluate("edit", "src/a.rs", &plan), "deny", "an always-allowed edit in plan mode");
        assert_eq!(evaluate("bash", "git status -s", &plan), "allow");
        let other = bridge_rules(APPROVALS_ASK, false, &always.of("s2"));
        assert_eq!(evaluate("bash", "git status -s", &other), "ask");
    }

    #[test]
    fn a_request_is_covered_only_when_every_pattern_was_allowed_always_in_its_session() {
        let always = AlwaysAllowed::default();
        always.allow("s1", "bash", &["git status *".into()]);
        let asked = |patterns: &[&str]| patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        assert!(always.covers("s1", "bash", &asked(&["git status -s"])));
        assert!(!always.covers("s1", "bash", &asked(&["git status -s", "rm -rf x"])), "one pattern not allowed");
        assert!(!always.covers("s1", "edit", &asked(&["git status -s"])), "another permission");
        assert!(!always.covers("s2", "bash", &asked(&["git status -s"])), "another session");
        assert!(!always.covers("s1", "bash", &[]), "a request that names nothing is asked");
    }
}
