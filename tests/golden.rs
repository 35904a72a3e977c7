//! Golden tests of the translators: every recorded stream in `tests/fixtures/<family>/` is translated and
//! compared with `tests/golden/<family>/<fixture>.json` (fenced output) and `<fixture>.terminal.json` (Zed's
//! terminal `_meta`). A family is an agent's CLI stream (`amp`, `opencode`) or `opencode-serve`, the events of
//! `opencode serve` (one SSE `data:` payload per line). `UPDATE_GOLDENS=1 cargo test --test golden` rewrites
//! them; review the diff by eye, since the goldens are the spec.
// A test fails by panicking: unwrap and expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

use acp_sandbox::agents::opencode::server::ServeTranslator;
use acp_sandbox::agents::{AgentKind, Output, TranslateContext, Translator, translate_stream};
use agent_client_protocol::v1::schema::SessionUpdate;

#[path = "support/schema.rs"]
#[allow(dead_code)]
mod schema;

/// A kind of recorded stream and the translator it goes through.
#[derive(Clone, Copy)]
enum Family {
    /// A CLI's stdout, through the translator of the agent of this id (`Agent::translator`).
    Cli(&'static str),
    /// `opencode serve`'s events, through [`ServeTranslator`] for the session of the stream's first event.
    OpenCodeServe,
}

const FAMILIES: [Family; 3] = [Family::Cli("opencode"), Family::Cli("amp"), Family::OpenCodeServe];

impl Family {
    /// The folder under `tests/fixtures/` and `tests/golden/`.
    fn name(self) -> &'static str {
        match self {
            Family::Cli(id) => id,
            Family::OpenCodeServe => "opencode-serve",
        }
    }

    /// The cwd each CLI ran in when the fixtures were recorded.
    fn workspace(self) -> &'static str {
        match self {
            Family::Cli("amp") => "/tmp/ws",
            _ => "/tmp/ws-oc",
        }
    }

    fn context(self, terminal_output: bool) -> TranslateContext {
        TranslateContext {
            workspace: self.workspace().into(),
            agent_workspace: self.workspace().into(),
            terminal_output,
            context_window: 200_000,
            turn_key: String::new(),
        }
    }

    /// A fresh translator for `stream`. A serve stream is translated for the session of its first event that
    /// names one (the capture's own session; synthetic streams start with theirs).
    fn translator(self, terminal_output: bool, stream: &str) -> Box<dyn Translator> {
        let context = self.context(terminal_output);
        match self {
            Family::Cli(id) => AgentKind::parse(id).expect("an agent of this id").translator(context),
            Family::OpenCodeServe => Box::new(ServeTranslator::new(context, first_session(stream))),
        }
    }
}

/// The `properties.sessionID` of the first event that has one.
fn first_session(stream: &str) -> String {
    stream
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find_map(|event| event["properties"]["sessionID"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Recorded streams of `family`: `*.jsonl`, minus what was fed to the CLI's stdin.
fn fixtures(family: Family) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(family.name());
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| {
            let name = path.file_name().and_then(|name| name.to_str()).unwrap_or("");
            name.ends_with(".jsonl") && !name.contains(".stdin.") && !name.contains("-acp-")
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

fn check_family(family: Family) {
    let update = std::env::var("UPDATE_GOLDENS").is_ok_and(|value| value == "1");
    let golden_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(family.name());
    fs::create_dir_all(&golden_dir).expect("golden dir");
    let mut expected_files = Vec::new();
    let mut failures = Vec::new();
    for fixture in fixtures(family) {
        let stream = fs::read_to_string(&fixture).expect("fixture");
        let stem = fixture.file_stem().and_then(|stem| stem.to_str()).expect("fixture name").to_string();
        for terminal in [false, true] {
            let name = if terminal { format!("{stem}.terminal.json") } else { format!("{stem}.json") };
            let golden = golden_dir.join(&name);
            expected_files.push(name.clone());
            let outputs = translate_stream(family.translator(terminal, &stream).as_mut(), &stream);
            assert_wire_round_trip(&name, &outputs);
            let actual = serde_json::to_string_pretty(&outputs).expect("serialize") + "\n";
            failures.extend(compare(&golden, &name, &actual, update));
        }
    }
    // A golden whose fixture was removed or renamed would otherwise rot unnoticed.
    for entry in fs::read_dir(&golden_dir).expect("golden dir") {
        let name = entry.expect("entry").file_name().to_string_lossy().to_string();
        if !expected_files.contains(&name) {
            if update {
                fs::remove_file(golden_dir.join(&name)).expect("remove stale golden");
            } else {
                failures.push(format!("{name} (stale: no such fixture)"));
            }
        }
    }
    assert!(failures.is_empty(), "golden mismatches for {}: {failures:#?}", family.name());
}

/// Compares `actual` with the golden file (or rewrites it when `update`); says what failed, if anything.
fn compare(golden: &Path, name: &str, actual: &str, update: bool) -> Option<String> {
    if update {
        fs::write(golden, actual).expect("write golden");
        return None;
    }
    match fs::read_to_string(golden) {
        Ok(expected) if expected == actual => None,
        Ok(expected) => {
            eprintln!("{name}:\n{}", pretty_assertions::StrComparison::new(&expected, actual));
            Some(name.to_string())
        }
        Err(_) => Some(format!("{name} (missing: run with UPDATE_GOLDENS=1)")),
    }
}

/// Every update must read back as the same ACP type and validate against the ACP JSON Schema: a shape the
/// editor cannot parse would be dropped, however good it looks in a golden.
fn assert_wire_round_trip(name: &str, outputs: &[Output]) {
    for output in outputs {
        if let Output::Update(update) = output {
            let wire = acp_sandbox::agents::tools::update_json(update).expect("serialize update");
            let back: SessionUpdate = serde_json::from_value(wire.clone())
                .unwrap_or_else(|error| panic!("{name}: {wire} does not parse as a SessionUpdate: {error}"));
            assert_eq!(&back, update, "{name}: {wire} changes on a round trip");
            let notification = serde_json::json!({ "sessionId": "sess_golden", "update": wire });
            if let Err(error) = schema::Schemas::get().validate("SessionNotification", &notification) {
                panic!("{name}: {wire} {error}");
            }
        }
    }
}

#[test]
fn opencode_goldens() {
    check_family(Family::Cli("opencode"));
}

#[test]
fn amp_goldens() {
    check_family(Family::Cli("amp"));
}

#[test]
fn opencode_serve_goldens() {
    check_family(Family::OpenCodeServe);
}

/// Every prefix of every recorded line (a CLI killed mid-write prints exactly that) and every line with one
/// byte flipped must translate without a panic: a broken stream ends a turn, never the bridge.
#[test]
fn cut_and_corrupted_lines_never_panic() {
    for family in FAMILIES {
        for path in fixtures(family) {
            let stream = fs::read_to_string(&path).expect("read fixture");
            for line in stream.lines().filter(|line| !line.trim().is_empty()) {
                let mut translator = family.translator(true, &stream);
                let cuts: Vec<usize> = (0..=line.len()).filter(|&i| line.is_char_boundary(i)).step_by(3).collect();
                for cut in cuts {
                    let _ = translator.line(&line[..cut]);
                }
                let mut bytes = line.as_bytes().to_vec();
                for i in (0..bytes.len()).step_by(7) {
                    let original = bytes[i];
                    bytes[i] = original.wrapping_add(1);
                    let _ = translator.line(&String::from_utf8_lossy(&bytes));
                    bytes[i] = original;
                }
                let _ = translator.finish(acp_sandbox::agents::StreamEnd::Stopped);
            }
        }
    }
}

/// `acp-sandbox prompt`'s rendering of whole turns (`acp_sandbox::terminal`): recorded streams through their
/// translator, and `tests/golden/terminal/*.updates.jsonl` (ACP updates, one per line), each compared with
/// `tests/golden/terminal/<name>.txt`.
#[test]
fn terminal_rendering_goldens() {
    let update = std::env::var("UPDATE_GOLDENS").is_ok_and(|value| value == "1");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let golden_dir = root.join("golden/terminal");
    let mut turns: Vec<(String, Vec<SessionUpdate>)> = Vec::new();
    for (family, stem) in [
        (Family::Cli("opencode"), "opencode-tools"),
        (Family::Cli("opencode"), "opencode-edit"),
        (Family::Cli("opencode"), "opencode-alltools.synthetic"),
        (Family::Cli("amp"), "amp-tools.reconstructed"),
        (Family::OpenCodeServe, "events-livebash"),
    ] {
        let path = root.join("fixtures").join(family.name()).join(format!("{stem}.jsonl"));
        let stream = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let updates = translate_stream(family.translator(false, &stream).as_mut(), &stream)
            .into_iter()
            .filter_map(|output| match output {
                Output::Update(update) => Some(update),
                _ => None,
            })
            .collect();
        turns.push((format!("{}-{stem}", family.name()), updates));
    }
    let recorded = fs::read_to_string(golden_dir.join("long-output.updates.jsonl")).expect("updates");
    let updates = recorded.lines().map(|line| serde_json::from_str(line).expect("a SessionUpdate")).collect();
    turns.push(("long-output".into(), updates));

    let mut failures = Vec::new();
    for (name, updates) in turns {
        let mut render = acp_sandbox::terminal::Render::new();
        let mut actual: String = updates.iter().map(|update| render.update(update)).collect();
        actual.push_str(&render.finish());
        let golden = golden_dir.join(format!("{name}.txt"));
        failures.extend(compare(&golden, &name, &actual, update));
    }
    assert!(failures.is_empty(), "terminal golden mismatches: {failures:#?}");
}
