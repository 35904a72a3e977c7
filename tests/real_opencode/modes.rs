//! What the session's mode and approvals promise, against the real OpenCode and a hostile scripted model: plan
//! mode never edits or runs a command unasked (both backends), and `ask` asks before a subagent's command, before
//! a workspace's own plugins and MCP servers load, and before a command template's shell runs; an "always"
//! answered in build mode never lets plan mode edit.

use super::*;

/// What OpenCode tells the model when a rule refuses a tool call (`PermissionDeniedError`).
const REFUSED: &str = "The user has specified a rule which prevents you from using this specific tool call.";

fn set_option(bridge: &mut Bridge, sid: &str, option: &str, value: &str) {
    let set =
        bridge.request("session/set_config_option", json!({"sessionId": sid, "configId": option, "value": value}));
    assert!(set.is_ok(), "{option} = {value}: {set:?}");
}

/// The last update of each tool call: its final status.
fn final_status(updates: &[Value], id: &str) -> String {
    updates
        .iter()
        .rfind(|u| u["toolCallId"] == id && u.get("status").is_some())
        .map(|u| u["status"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// Plan mode with approvals `auto` (the default): a write, an edit and a command are refused by OpenCode, the
/// cards end failed, the model is told it was a rule, and nothing reached the disk.
fn plan_refuses(sandbox: &str, backend: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::write(ws.join("notes.txt"), "line one\n").unwrap();
    let mut bridge = world.start_with(world.backend_options(sandbox, backend));
    let sid = bridge.new_session(&ws);
    set_option(&mut bridge, &sid, "mode", "plan");
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:planedit plan it", "plan + auto");
    assert_end_turn(&bridge, &turn);
    assert!(!ws.join("new.txt").exists(), "plan mode wrote a file: {:#?}", turn.updates);
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "line one\n", "plan mode edited a file");
    assert!(!ws.join("ran.txt").exists(), "plan mode ran a command: {:#?}", turn.updates);
    for (id, step) in [("call_fake_0_0", 1), ("call_fake_1_0", 2), ("call_fake_2_0", 3)] {
        assert_eq!(final_status(&turn.updates, id), "failed", "{id}: {:#?}", turn.updates);
        let told = tool_results(&world.server, "planedit", step);
        assert!(told.contains(REFUSED), "step {step}: the model was told {told:?}");
    }
    let failed: Vec<&Value> =
        turn.updates.iter().filter(|u| u["toolCallId"] == "call_fake_0_0" && u["status"] == "failed").collect();
    assert!(failed.last().unwrap().to_string().contains(REFUSED), "the card shows OpenCode's refusal: {failed:#?}");
    assert!(turn.agent_text().contains("PLANEDIT-DONE"), "{:#?}", turn.updates);
    assert!(bridge.permission_requests.is_empty(), "auto asks nobody: {:#?}", bridge.permission_requests);

    // The same session in build mode: the same calls work.
    set_option(&mut bridge, &sid, "mode", "build");
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:planedit build it", "build + auto");
    assert_end_turn(&bridge, &turn);
    assert_eq!(std::fs::read_to_string(ws.join("new.txt")).unwrap(), "written in plan mode\n");
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "edited in plan mode\n");
    assert_eq!(std::fs::read_to_string(ws.join("ran.txt")).unwrap(), "ran\n");
}

#[test]
fn plan_mode_refuses_edits_and_commands_serve_none() {
    plan_refuses("none", "serve", "plan_mode_refuses_serve_none");
}

#[test]
fn plan_mode_refuses_edits_and_commands_serve_bwrap() {
    if bwrap_ok("plan_mode_refuses_serve_bwrap") {
        plan_refuses("bwrap", "serve", "plan_mode_refuses_serve_bwrap");
    }
}

#[test]
fn plan_mode_refuses_edits_and_commands_run_none() {
    plan_refuses("none", "run", "plan_mode_refuses_run_none");
}

#[test]
fn plan_mode_refuses_edits_and_commands_run_bwrap() {
    if bwrap_ok("plan_mode_refuses_run_bwrap") {
        plan_refuses("bwrap", "run", "plan_mode_refuses_run_bwrap");
    }
}

/// Plan mode with approvals `ask` and a user who allows everything: edits are still refused (nobody is asked about
/// them), the command is asked about and runs once allowed.
fn plan_with_ask(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::write(ws.join("notes.txt"), "line one\n").unwrap();
    let mut bridge = world.start_with(world.backend_options(sandbox, "serve"));
    let sid = bridge.new_session(&ws);
    set_option(&mut bridge, &sid, "mode", "plan");
    set_option(&mut bridge, &sid, "approvals", "ask");
    bridge.permission_answer = Some("allow_once".into());
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:planedit plan it", "plan + ask");
    assert_end_turn(&bridge, &turn);
    assert!(!ws.join("new.txt").exists(), "plan mode wrote a file: {:#?}", turn.updates);
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "line one\n", "plan mode edited a file");
    for (id, step) in [("call_fake_0_0", 1), ("call_fake_1_0", 2)] {
        assert_eq!(final_status(&turn.updates, id), "failed", "{id}: {:#?}", turn.updates);
        assert!(tool_results(&world.server, "planedit", step).contains(REFUSED), "step {step}");
    }
    let asked: Vec<&str> =
        bridge.permission_requests.iter().filter_map(|r| r["toolCall"]["toolCallId"].as_str()).collect();
    assert_eq!(asked, ["call_fake_2_0"], "only the command is asked about: {:#?}", bridge.permission_requests);
    assert_eq!(std::fs::read_to_string(ws.join("ran.txt")).unwrap(), "ran\n", "the allowed command ran");
}

#[test]
fn plan_mode_with_ask_refuses_edits_and_asks_before_commands_none() {
    plan_with_ask("none", "plan_with_ask_none");
}

#[test]
fn plan_mode_with_ask_refuses_edits_and_asks_before_commands_bwrap() {
    if bwrap_ok("plan_with_ask_bwrap") {
        plan_with_ask("bwrap", "plan_with_ask_bwrap");
    }
}

/// `ask`, and the user answers "always" in build mode: the rest of that turn's edits are not asked again; then in
/// plan mode the same session's edits are still refused (the "always" never outranks the mode), unasked.
fn always_then_plan(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::write(ws.join("notes.txt"), "line one\n").unwrap();
    let mut bridge = world.start_with(world.backend_options(sandbox, "serve"));
    let sid = bridge.new_session(&ws);
    set_option(&mut bridge, &sid, "approvals", "ask");
    bridge.permission_answer = Some("allow_always".into());
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:planedit build it", "build + ask, always");
    assert_end_turn(&bridge, &turn);
    let asked: Vec<&str> =
        bridge.permission_requests.iter().filter_map(|r| r["toolCall"]["toolCallId"].as_str()).collect();
    assert_eq!(asked, ["call_fake_0_0", "call_fake_2_0"], "the edit after an always edit is not asked: {asked:?}");
    assert_eq!(std::fs::read_to_string(ws.join("new.txt")).unwrap(), "written in plan mode\n");
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "edited in plan mode\n");

    std::fs::write(ws.join("notes.txt"), "line one\n").unwrap();
    for made in ["new.txt", "ran.txt"] {
        std::fs::remove_file(ws.join(made)).unwrap();
    }
    bridge.permission_requests.clear();
    bridge.permission_answer = Some("allow_once".into());
    set_option(&mut bridge, &sid, "mode", "plan");
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:planedit plan it", "plan + ask after always");
    assert_end_turn(&bridge, &turn);
    assert!(!ws.join("new.txt").exists(), "plan mode wrote a file allowed always in build: {:#?}", turn.updates);
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "line one\n", "plan mode edited a file");
    for (id, step) in [("call_fake_0_0", 1), ("call_fake_1_0", 2)] {
        assert_eq!(final_status(&turn.updates, id), "failed", "{id}: {:#?}", turn.updates);
        assert!(tool_results(&world.server, "planedit", step).contains(REFUSED), "step {step}");
    }
    let asked: Vec<&str> =
        bridge.permission_requests.iter().filter_map(|r| r["toolCall"]["toolCallId"].as_str()).collect();
    assert!(
        !asked.iter().any(|id| *id == "call_fake_0_0" || *id == "call_fake_1_0"),
        "edits refused unasked: {asked:?}"
    );
}

#[test]
fn an_always_answer_in_build_mode_never_lets_plan_mode_edit_none() {
    always_then_plan("none", "always_then_plan_none");
}

#[test]
fn an_always_answer_in_build_mode_never_lets_plan_mode_edit_bwrap() {
    if bwrap_ok("always_then_plan_bwrap") {
        always_then_plan("bwrap", "always_then_plan_bwrap");
    }
}

/// `ask`: a subagent's command (OpenCode's task tool, a child session) asks the editor; rejected, it does not run.
fn subagent_asks(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start_with(world.backend_options(sandbox, "serve"));
    let sid = bridge.new_session(&ws);
    set_option(&mut bridge, &sid, "approvals", "ask");
    bridge.permission_answer = Some("reject_once".into());
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:subagent delegate it", "ask, subagent");
    assert!(!ws.join("child-ran.txt").exists(), "the subagent's rejected command ran: {:#?}", turn.updates);
    let titles: Vec<&str> = bridge.permission_requests.iter().filter_map(|r| r["toolCall"]["title"].as_str()).collect();
    assert_eq!(titles, ["A subagent asks for bash: echo child > child-ran.txt"], "{:#?}", bridge.permission_requests);
    assert!(!world.server.chats("childbash").is_empty(), "the subagent ran: {:#?}", turn.updates);
}

#[test]
fn ask_asks_before_a_subagents_command_none() {
    subagent_asks("none", "ask_subagent_none");
}

#[test]
fn ask_asks_before_a_subagents_command_bwrap() {
    if bwrap_ok("ask_subagent_bwrap") {
        subagent_asks("bwrap", "ask_subagent_bwrap");
    }
}

/// A plugin that leaves a mark when OpenCode loads it.
const PLUGIN: &str = r#"import { writeFileSync } from "fs";
export const Mark = async ({ directory }) => { writeFileSync(directory + "/plugin-ran.txt", "x"); return {}; };
"#;

/// A custom tool that leaves a mark when OpenCode loads it.
const TOOL: &str = r#"import { writeFileSync } from "fs";
writeFileSync(process.cwd() + "/tool-ran.txt", "x");
export default { description: "marks", args: {}, async execute() { return "ok"; } };
"#;

/// `ask`: a workspace's own plugin, custom tool and local MCP server load only once the user allowed them; the
/// user is asked once, naming them, and rejected, none of them runs (the turn still runs, without them).
fn workspace_config_asks(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::create_dir_all(ws.join(".opencode/plugin")).unwrap();
    std::fs::create_dir_all(ws.join(".opencode/tool")).unwrap();
    std::fs::write(ws.join(".opencode/plugin/mark.js"), PLUGIN).unwrap();
    std::fs::write(ws.join(".opencode/tool/mark.ts"), TOOL).unwrap();
    let mcp = json!({"mcp": {"mark": {"type": "local", "command": ["sh", "-c", "echo x > mcp-ran.txt"]}}});
    std::fs::write(ws.join("opencode.json"), mcp.to_string()).unwrap();
    let mut bridge = world.start_with(world.backend_options(sandbox, "serve"));
    let sid = bridge.new_session(&ws);
    set_option(&mut bridge, &sid, "approvals", "ask");
    bridge.permission_answer = Some("reject_once".into());
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text hello", "ask, workspace config");
    assert_end_turn(&bridge, &turn);
    assert!(turn.agent_text().contains("PLAIN-ANSWER-OK"), "{:#?}", turn.updates);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text again", "ask, workspace config, again");
    assert_end_turn(&bridge, &turn);
    for mark in ["plugin-ran.txt", "tool-ran.txt", "mcp-ran.txt"] {
        assert!(!ws.join(mark).exists(), "{mark}: the workspace's configuration loaded unasked");
    }
    let titles: Vec<&str> = bridge.permission_requests.iter().filter_map(|r| r["toolCall"]["title"].as_str()).collect();
    assert_eq!(
        titles,
        [format!(
            "Load this workspace's OpenCode configuration? It runs inside the agent's server: MCP server `mark` (`sh -c \
             echo x > mcp-ran.txt`) of `{}`; plugin `{}`; custom tool `{}`",
            ws.join("opencode.json").display(),
            ws.join(".opencode/plugin/mark.js").display(),
            ws.join(".opencode/tool/mark.ts").display()
        )],
        "asked once per session"
    );

    // Allowed (another session), they load: the marks prove the test can see them.
    bridge.permission_answer = Some("allow_once".into());
    let sid = bridge.new_session(&ws);
    set_option(&mut bridge, &sid, "approvals", "ask");
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text hello", "ask, workspace config allowed");
    assert_end_turn(&bridge, &turn);
    for mark in ["plugin-ran.txt", "tool-ran.txt", "mcp-ran.txt"] {
        assert!(ws.join(mark).exists(), "{mark}: the allowed configuration did not load");
    }
}

#[test]
fn ask_asks_before_the_workspaces_plugins_tools_and_mcp_load_none() {
    workspace_config_asks("none", "ask_workspace_config_none");
}

#[test]
fn ask_asks_before_the_workspaces_plugins_tools_and_mcp_load_bwrap() {
    if bwrap_ok("ask_workspace_config_bwrap") {
        workspace_config_asks("bwrap", "ask_workspace_config_bwrap");
    }
}

/// `ask`: a command whose template runs a shell command asks first; rejected, neither the shell nor the model runs.
fn command_shell_asks(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let config_path = world.user_config.join("opencode/opencode.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["command"] = json!({"mark": {"template": "SCENARIO:text !`echo x > shell-ran.txt` $ARGUMENTS"}});
    std::fs::write(&config_path, config.to_string()).unwrap();
    let ws = world.workspace("ws");
    let mut bridge = world.start_with(world.backend_options(sandbox, "serve"));
    let sid = bridge.new_session(&ws);
    set_option(&mut bridge, &sid, "approvals", "ask");
    bridge.permission_answer = Some("reject_once".into());
    let turn = timed_prompt(&mut bridge, &sid, &ws, "/mark now", "ask, command shell");
    assert_end_turn(&bridge, &turn);
    assert!(!ws.join("shell-ran.txt").exists(), "the rejected template shell ran");
    let titles: Vec<&str> = bridge.permission_requests.iter().filter_map(|r| r["toolCall"]["title"].as_str()).collect();
    assert_eq!(titles, ["/mark runs shell commands first: `echo x > shell-ran.txt`"]);
    assert!(world.server.chats("text").is_empty(), "the rejected command reached the model");
    assert!(turn.agent_text().contains("/mark was not run: its shell commands were rejected."), "{:#?}", turn.updates);
}

#[test]
fn ask_asks_before_a_command_templates_shell_none() {
    command_shell_asks("none", "ask_command_shell_none");
}

#[test]
fn ask_asks_before_a_command_templates_shell_bwrap() {
    if bwrap_ok("ask_command_shell_bwrap") {
        command_shell_asks("bwrap", "ask_command_shell_bwrap");
    }
}

/// `ask`: the workspace's own command with a shell template (the workspace's configuration, refused here) does not
/// run its shell: the user is asked about the configuration first, and OpenCode never loads the command.
fn project_command_shell(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::create_dir_all(ws.join(".opencode/command")).unwrap();
    std::fs::write(ws.join(".opencode/command/mark.md"), "SCENARIO:text !`echo x > shell-ran.txt` $ARGUMENTS\n")
        .unwrap();
    let mut bridge = world.start_with(world.backend_options(sandbox, "serve"));
    let sid = bridge.new_session(&ws);
    set_option(&mut bridge, &sid, "approvals", "ask");
    bridge.permission_answer = Some("reject_once".into());
    let turn = timed_prompt(&mut bridge, &sid, &ws, "/mark now", "ask, project command shell");
    assert!(!ws.join("shell-ran.txt").exists(), "the project command's shell ran: {:#?}", turn.updates);
    let titles: Vec<&str> = bridge.permission_requests.iter().filter_map(|r| r["toolCall"]["title"].as_str()).collect();
    assert_eq!(
        titles,
        [format!(
            "Load this workspace's OpenCode configuration? It runs inside the agent's server: `{}` (commands, agents, \
             skills)",
            ws.join(".opencode").display()
        )]
    );
    assert!(world.server.chats("text").is_empty(), "the command reached the model");
    assert_end_turn(&bridge, &turn);
    assert!(
        turn.agent_text().contains("_/mark is not one of OpenCode's commands here (the workspace's own configuration"),
        "{:#?}",
        turn.updates
    );
}

#[test]
fn ask_never_runs_a_refused_workspace_commands_shell_none() {
    project_command_shell("none", "ask_project_command_shell_none");
}

#[test]
fn ask_never_runs_a_refused_workspace_commands_shell_bwrap() {
    if bwrap_ok("ask_project_command_shell_bwrap") {
        project_command_shell("bwrap", "ask_project_command_shell_bwrap");
    }
}

/// `ask`: a plugin that a tool wrote (under `auto`) into the agent's own OpenCode configuration is never loaded by
/// a server started for `ask`: the prompt is refused, naming it, and the plugin never runs.
fn planted_plugin_refused(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let ran = ws.join("plugin-ran.txt");
    let plugin = format!(
        "import fs from 'fs';\nexport const Planted = async () => {{ fs.writeFileSync({:?}, 'ran'); return {{}}; }};\n",
        ran.display().to_string()
    );
    let attack = format!(
        "import os\nd = os.path.join(os.environ['XDG_CONFIG_HOME'], 'opencode', 'plugin')\nos.makedirs(d, exist_ok=True)\n\
         open(os.path.join(d, 'planted.js'), 'w').write({plugin:?})\n"
    );
    std::fs::write(ws.join(".attack.py"), attack).unwrap();
    let mut bridge = world.start_with(world.backend_options(sandbox, "serve"));
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:attack plant a plugin", "auto, plant");
    assert_end_turn(&bridge, &turn);
    let planted = support::sandbox_state(&world.data, &sid).join("config/opencode/plugin/planted.js");
    assert!(planted.is_file(), "the tool did not plant {}", planted.display());
    set_option(&mut bridge, &sid, "approvals", "ask");
    let id = bridge.send_prompt(&sid, "SCENARIO:text hello");
    let refused = bridge.wait_response_within(id, Duration::from_secs(120));
    let message = match refused {
        Some(Err(error)) => error.message,
        other => bridge.fail(&format!("expected the ask prompt to be refused, got {other:?}")),
    };
    assert_eq!(
        message,
        format!(
            "With Approvals: Ask, OpenCode is not started: the agent wrote plugins or tools into its own OpenCode \
             configuration, which OpenCode would load without asking: `{}`. Look at them and delete them (they are \
             the agent's, not yours), or choose Approvals: Auto.",
            planted.display()
        )
    );
    assert!(!ran.exists(), "the planted plugin ran");
    assert!(world.server.chats("text").is_empty(), "the refused prompt reached the model");
}

#[test]
fn ask_never_loads_a_plugin_a_tool_planted_in_the_agents_own_config_none() {
    planted_plugin_refused("none", "ask_planted_plugin_none");
}

#[test]
fn ask_never_loads_a_plugin_a_tool_planted_in_the_agents_own_config_bwrap() {
    if bwrap_ok("ask_planted_plugin_bwrap") {
        planted_plugin_refused("bwrap", "ask_planted_plugin_bwrap");
    }
}
