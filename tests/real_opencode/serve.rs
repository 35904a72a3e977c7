//! The real OpenCode driven through a warm `opencode serve` per session (the default backend).

use super::*;

fn serve_followup(sandbox: &str, test: &str) {
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    let mut bridge = world.start_with(world.backend_options(sandbox, "serve"));
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text Say hello", "1 (serve, first prompt)");
    assert_end_turn(&bridge, &turn);
    assert_eq!(turn.agent_text(), "Hello from the fake model. PLAIN-ANSWER-OK", "{:#?}", turn.updates);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:followup Do you remember?", "2 (serve, follow-up)");
    assert_end_turn(&bridge, &turn);
    assert!(turn.agent_text().contains("FOLLOWUP-OK"), "{:#?}", turn.updates);
    assert_continued(&world.server, "SCENARIO:text Say hello", "PLAIN-ANSWER-OK");
}

#[test]
fn serve_answers_and_continues_none() {
    serve_followup("none", "serve_answers_and_continues_none");
}

#[test]
fn serve_answers_and_continues_bwrap() {
    if bwrap_ok("serve_answers_and_continues_bwrap") {
        serve_followup("bwrap", "serve_answers_and_continues_bwrap");
    }
}
