//! Release packaging and the ACP registry: `scripts/package.sh` packages the tests' own build for this machine,
//! the archive is unpacked in an empty directory and checked like the registry's CI checks an agent (its
//! sha256, a launch with no input, and `initialize` answering an auth method of type `agent` or `terminal`),
//! and `editors/registry/` is held to the registry's schema (`schemas/registry/`) and its icon rules.
// Tests run the script, tar and the packaged binary themselves.
#![allow(clippy::disallowed_methods)]
// A test fails by panicking: unwrap and expect say where.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn host_triple() -> String {
    let output = Command::new("rustc").arg("-vV").output().expect("rustc -vV");
    let text = String::from_utf8(output.stdout).unwrap();
    text.lines().find_map(|line| line.strip_prefix("host: ")).expect("rustc names its host").to_string()
}

/// The registry's platform name for a target triple, as the packaging script and the entry use it.
fn platform_of(triple: &str) -> &'static str {
    match triple.split('-').collect::<Vec<_>>().as_slice() {
        ["x86_64", _, "linux", ..] => "linux-x86_64",
        ["aarch64", _, "linux", ..] => "linux-aarch64",
        ["x86_64", "apple", "darwin"] => "darwin-x86_64",
        ["aarch64", "apple", "darwin"] => "darwin-aarch64",
        _ => panic!("no registry platform for {triple}"),
    }
}

/// Runs `scripts/package.sh ARGS`; answers its stdout, failing the test when it fails.
fn package(args: &[&str]) -> String {
    let output = Command::new(repo().join("scripts/package.sh")).args(args).output().unwrap();
    assert!(output.status.success(), "package.sh {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// Packages the tests' own build of acp-sandbox (no release build) into `out`; answers the archive's path.
fn package_host_build(out: &Path) -> PathBuf {
    let printed = package(&["--binary", env!("CARGO_BIN_EXE_acp-sandbox"), "--out", out.to_str().unwrap()]);
    PathBuf::from(printed.trim_end())
}

/// The auth methods of an `initialize` result, typed as the registry's check types them: the `type` field,
/// else a `_meta` key `terminal-auth` / `agent-auth`, else `agent`.
fn registry_auth_types(result: &Value) -> Vec<(String, String)> {
    let methods = result.get("authMethods").and_then(Value::as_array).cloned().unwrap_or_default();
    methods
        .iter()
        .map(|method| {
            let kind = method.get("type").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| {
                match method.get("_meta") {
                    Some(meta) if meta.get("terminal-auth").is_some() => "terminal".into(),
                    _ => "agent".into(),
                }
            });
            (method["id"].as_str().unwrap_or_default().to_string(), kind)
        })
        .collect()
}

#[test]
fn the_packaged_host_build_unpacks_alone_checks_out_and_passes_the_registrys_launch_and_auth_checks() {
    let dist = temp_dir();
    let archive = package_host_build(dist.path());
    let name = format!("acp-sandbox-{VERSION}-{}.tar.gz", host_triple());
    assert_eq!(archive, dist.path().join(&name));

    // The checksum file is `sha256sum -c` input naming the archive, and it holds.
    let sums = std::fs::read_to_string(dist.path().join(format!("{name}.sha256"))).unwrap();
    let (hash, file) = sums.trim_end_matches('\n').split_once("  ").unwrap();
    assert_eq!(file, name);
    assert!(hash.len() == 64 && hash.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{sums}");
    let check = Command::new("sha256sum").arg("-c").arg(format!("{name}.sha256")).current_dir(dist.path()).output();
    let check = check.unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    assert_eq!(String::from_utf8_lossy(&check.stdout), format!("{name}: OK\n"));

    // Unpacked in an empty directory: the executable at the top (the registry's `cmd: "./acp-sandbox"`).
    let unpacked = temp_dir();
    let untar = Command::new("tar").arg("-xzf").arg(&archive).current_dir(unpacked.path()).status().unwrap();
    assert!(untar.success());
    let mut names: Vec<String> = std::fs::read_dir(unpacked.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["README.md", "acp-sandbox", "docs"]);
    // Every page the README links to is there.
    let mut pages: Vec<String> = std::fs::read_dir(unpacked.path().join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    assert_eq!(pages, ["agents.md", "configuration.md", "notes", "performance.md", "remote.md", "sandbox.md"]);
    let binary = unpacked.path().join("acp-sandbox");
    assert_eq!(std::fs::metadata(&binary).unwrap().permissions().mode() & 0o777, 0o755);

    // The registry's environment: a few variables, a fresh HOME, TERM=dumb, the archive's folder as cwd.
    let home = temp_dir();
    let registry_env = |command: &mut Command| {
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", home.path())
            .env("TERM", "dumb")
            .current_dir(unpacked.path());
    };

    // Its launch check: no input at all must be a clean exit (or a process still waiting), printing nothing.
    let mut launch = Command::new(&binary);
    registry_env(&mut launch);
    let launched = launch.stdin(Stdio::null()).output().unwrap();
    assert_eq!(launched.status.code(), Some(0), "{}", String::from_utf8_lossy(&launched.stderr));
    assert_eq!(String::from_utf8_lossy(&launched.stdout), "");

    // Its auth check: exactly the `initialize` it sends, then the first line must be the answer with at least one
    // method of type agent or terminal.
    let mut agent = Command::new(&binary);
    registry_env(&mut agent);
    let mut child = agent.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": 1,
            "clientInfo": {"name": "ACP Registry Validator", "version": "1.0.0"},
            "clientCapabilities": {
                "terminal": true,
                "fs": {"readTextFile": true, "writeTextFile": true},
                "_meta": {"terminal_output": true, "terminal-auth": true}
            }
        }
    });
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{initialize}").unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    drop(stdin);
    assert!(child.wait().unwrap().success(), "the agent must exit cleanly when its stdin ends");
    let response: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON on stdout ({e}): {line:?}"));
    assert_eq!(response["id"], 1);
    assert_eq!(response.get("error"), None, "{response}");
    let methods = registry_auth_types(&response["result"]);
    // Its `_meta["terminal-auth"]` also gets the terminal login, whose launch is the unpacked binary itself.
    assert_eq!(
        methods,
        [
            ("opencode-login".to_string(), "agent".to_string()),
            ("opencode-login-terminal".to_string(), "terminal".to_string())
        ],
        "{response}"
    );
    let launch = &response["result"]["authMethods"][1]["_meta"]["terminal-auth"];
    assert_eq!(launch["command"], json!(std::fs::canonicalize(&binary).unwrap().display().to_string()), "{response}");
    assert!(methods.iter().any(|(_, kind)| kind == "agent" || kind == "terminal"));
}

#[test]
fn the_entry_command_points_each_packaged_platform_at_its_archive_with_its_sha256() {
    let dist = temp_dir();
    let archive = package_host_build(dist.path());
    let name = archive.file_name().unwrap().to_str().unwrap().to_string();
    let base = format!("https://downloads.example/acp-sandbox/releases/download/v{VERSION}");
    let printed = package(&["entry", "--base-url", &base, "--out", dist.path().to_str().unwrap()]);
    let entry: Value = serde_json::from_str(&printed).unwrap();
    assert_registry_valid(&entry);
    let hash = std::fs::read_to_string(dist.path().join(format!("{name}.sha256"))).unwrap()[..64].to_string();
    let platform = platform_of(&host_triple());
    assert_eq!(
        entry["distribution"],
        json!({"binary": {platform: {"archive": format!("{base}/{name}"), "cmd": "./acp-sandbox", "sha256": hash}}})
    );
    // The rest is the committed entry's.
    let committed = committed_entry();
    for field in ["id", "name", "version", "description", "repository", "authors"] {
        assert_eq!(entry[field], committed[field], "{field}");
    }

    let latest = Command::new(repo().join("scripts/package.sh"))
        .args(["entry", "--base-url", "https://downloads.example/releases/latest/", "--out"])
        .arg(dist.path())
        .output()
        .unwrap();
    assert!(!latest.status.success(), "a /latest/ URL must be refused: the registry does");
}

fn committed_entry() -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo().join("editors/registry/agent.json")).unwrap()).unwrap()
}

/// The registry's schema, with its `uri` formats checked too.
fn registry_validator() -> jsonschema::Validator {
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("schemas/registry/agent.schema.json")).unwrap())
            .unwrap();
    jsonschema::options().should_validate_formats(true).build(&schema).unwrap()
}

fn assert_registry_valid(entry: &Value) {
    let errors: Vec<String> =
        registry_validator().iter_errors(entry).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert_eq!(errors, Vec::<String>::new(), "{entry}");
}

#[test]
fn the_registry_entry_is_valid_and_names_this_version_and_the_packaged_archives() {
    let entry = committed_entry();
    assert_registry_valid(&entry);
    assert_eq!(entry["version"], VERSION);
    let binary = entry["distribution"]["binary"].as_object().unwrap();
    // Linux only: the sandbox (bubblewrap, seccomp, cgroups) does not build elsewhere yet.
    assert_eq!(binary.keys().collect::<Vec<_>>(), ["linux-aarch64", "linux-x86_64"]);
    for (platform, target) in binary {
        let url = target["archive"].as_str().unwrap();
        let file = url.rsplit('/').next().unwrap();
        let triple = file
            .strip_prefix(&format!("acp-sandbox-{VERSION}-"))
            .and_then(|rest| rest.strip_suffix(".tar.gz"))
            .unwrap_or_else(|| panic!("{url} is not a name package.sh makes for {VERSION}"));
        assert_eq!(platform_of(triple), platform, "{url}");
        // The registry reads the version from `/download/v<version>/` and refuses `/latest/`.
        assert!(url.contains(&format!("/download/v{VERSION}/")) && !url.contains("/latest/"), "{url}");
        assert_eq!(target["cmd"], "./acp-sandbox");
    }
    // The validator does refuse what the registry refuses.
    let mut bad = entry.clone();
    bad["id"] = json!("ACP_Sandbox");
    assert!(!registry_validator().is_valid(&bad));
    let mut bad = entry.clone();
    bad["distribution"]["binary"]["linux-x86_64"]["sha256"] = json!("not-a-hash");
    assert!(!registry_validator().is_valid(&bad));
}

/// The registry's icon rules: `width`/`height` of 16 on the `<svg>`, and every `fill`/`stroke` (attributes and
/// `style` declarations) `currentColor`, `none` or `inherit`, with `currentColor` used. Answers what breaks them.
fn icon_problems(svg: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let open = &svg[svg.find("<svg").expect("an <svg> element")..];
    let open = &open[..open.find('>').unwrap()];
    for size in ["width", "height"] {
        if attribute_values(open, size).first().map(String::as_str) != Some("16") {
            problems.push(format!("{size} is not 16"));
        }
    }
    let mut paints: Vec<String> = Vec::new();
    for name in ["fill", "stroke"] {
        paints.extend(attribute_values(svg, name));
    }
    for style in attribute_values(svg, "style") {
        for declaration in style.split(';') {
            if let Some((property, value)) = declaration.split_once(':')
                && matches!(property.trim().to_ascii_lowercase().as_str(), "fill" | "stroke")
            {
                paints.push(value.trim().to_string());
            }
        }
    }
    for paint in paints {
        if !matches!(paint.trim().to_ascii_lowercase().as_str(), "currentcolor" | "none" | "inherit") {
            problems.push(format!("hardcoded colour {paint}"));
        }
    }
    if !svg.to_ascii_lowercase().contains("currentcolor") {
        problems.push("no currentColor".into());
    }
    problems
}

/// The values of every attribute `name` in `text` (` name="…"` or `'…'`, any case).
fn attribute_values(text: &str, name: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase();
    let mut values = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find(name).map(|i| i + from) {
        from = at + name.len();
        let before = lower[..at].chars().next_back();
        if !before.is_some_and(char::is_whitespace) {
            continue;
        }
        let rest = lower[from..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else { continue };
        let rest = rest.trim_start();
        let Some(quote) = rest.chars().next().filter(|c| *c == '"' || *c == '\'') else { continue };
        let start = text.len() - rest.len() + 1;
        if let Some(end) = text[start..].find(quote) {
            values.push(text[start..start + end].to_string());
        }
    }
    values
}

#[test]
fn the_icon_is_16_by_16_and_drawn_in_current_color_only() {
    let svg = std::fs::read_to_string(repo().join("editors/registry/icon.svg")).unwrap();
    assert_eq!(icon_problems(&svg), Vec::<String>::new());
    // The rules catch what the registry rejects.
    assert_eq!(
        icon_problems(r##"<svg width="24" height="16"><path fill="#f00" style="stroke: red"/></svg>"##),
        ["width is not 16", "hardcoded colour #f00", "hardcoded colour red", "no currentColor"]
    );
}
