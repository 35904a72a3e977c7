//! Edge cases of the OpenCode translator that the recorded fixtures do not cover.

use super::*;

fn context() -> TranslateContext {
    TranslateContext {
        workspace: "/home/me/proj".into(),
        agent_workspace: "/sandbox/ws".into(),
        terminal_output: false,
        context_window: 1000,
    }
}

fn run(lines: &[&str]) -> Vec<Value> {
    let mut translator = OpenCodeTranslator::new(context());
    let mut outputs: Vec<Output> = lines
        .iter()
        .flat_map(|line| translator.line(line))
        .collect();
    outputs.extend(translator.finish());
    outputs
        .into_iter()
        .map(|output| serde_json::to_value(output).unwrap_or_default())
        .collect()
}

#[test]
fn garbage_is_unparsed_and_never_panics() {
    let long = "x".repeat(5000);
    let out = run(&["not json", "{\"type\":\"text\"}", &long, "[1,2]"]);
    assert_eq!(out.len(), 4);
    assert!(out.iter().all(|output| output["output"] == "unparsed"));
    assert!(out[2]["line"].as_str().unwrap_or_default().len() < 2100);
}

#[test]
fn unknown_event_types_are_ignored() {
    assert_eq!(
        run(&[r#"{"type":"session_status","status":"idle"}"#]),
        Vec::<Value>::new()
    );
}
