//! The terminal commands of the binary: `prompt` (one turn, `--json` prints ACP notifications), `sessions
//! list|show|rm` and `doctor`.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::support::schema::Schemas;
use crate::support::*;

/// `acp-sandbox <args> --data-dir <data>` in `cwd` with the fake CLIs, logging only what a person sees.
fn acp(args: &[&str], data: &Path, cwd: &Path) -> Command {
    let mut command = Command::new(bridge_bin());
    command
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .current_dir(cwd)
        .env("ACP_SANDBOX_OPENCODE_BIN", fakes_dir().join("opencode"))
        .env("ACP_SANDBOX_AMP_BIN", fakes_dir().join("amp"))
        // The fake `opencode` behaves like `opencode run`.
        .env("ACP_SANDBOX_OPENCODE_BACKEND", "run")
        .env_remove("ACP_SANDBOX_AGENT")
        .env_remove("ACP_SANDBOX_DATA_DIR")
        .env_remove("RUST_LOG");
    command
}

/// Runs `acp-sandbox <args> --data-dir <data>` in `cwd` with the fake CLIs; fails the test unless it exits 0.
fn run(args: &[&str], data: &Path, cwd: &Path) -> Output {
    let output = acp(args, data, cwd).output().expect("run acp-sandbox");
    assert!(
        output.status.success(),
        "acp-sandbox {args:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The `--json` output: one JSON-RPC `session/update` notification per line, as the editor gets them, each
/// checked against the schema.
fn notifications(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
            let keys: Vec<&str> = value.as_object().expect("an object").keys().map(String::as_str).collect();
            assert_eq!(keys, ["jsonrpc", "method", "params"], "{line}");
            assert_eq!((&value["jsonrpc"], &value["method"]), (&"2.0".into(), &"session/update".into()), "{line}");
            Schemas::get().validate("SessionNotification", &value["params"]).unwrap();
            value["params"].clone()
        })
        .collect()
}

#[test]
fn prompt_command_prints_acp_updates_and_its_session_can_be_continued_listed_and_removed() {
    let dirs = TestDirs::new("prompt-command");
    let ws = dirs.workspace("ws");
    let common = ["--agent", "opencode", "--sandbox", "none"];

    let first = notifications(&run(&[&["prompt", "--json"], &common[..], &["Say hello"]].concat(), &dirs.data, &ws));
    let sid = first[0]["sessionId"].as_str().expect("sessionId").to_string();
    let updates: Vec<Value> = first.iter().map(|n| n["update"].clone()).collect();
    assert!(text_of(&updates, "agent_message_chunk").contains("Hello from the fake model"), "{updates:?}");
    assert_eq!(invocations(&ws)[0].cwd(), ws, "the prompt command works in the current directory");

    let args = [&["prompt", "--json", "--session", sid.as_str()], &common[..], &["Do you remember?"]].concat();
    let second = notifications(&run(&args, &dirs.data, &ws));
    let updates: Vec<Value> = second.iter().map(|n| n["update"].clone()).collect();
    assert!(text_of(&updates, "agent_message_chunk").contains("turn two of the same session"), "{updates:?}");
    let runs = invocations(&ws);
    assert_eq!(runs[1].flag_value("--session"), Some(runs[0].cli_session()));

    let list = String::from_utf8_lossy(&run(&["sessions", "list"], &dirs.data, &ws).stdout).into_owned();
    assert!(list.contains(&sid) && list.contains("Say hello"), "sessions list: {list}");
    let show = String::from_utf8_lossy(&run(&["sessions", "show", &sid], &dirs.data, &ws).stdout).into_owned();
    assert!(show.contains(&sid), "sessions show: {show}");
    run(&["sessions", "rm", &sid], &dirs.data, &ws);
    let list = String::from_utf8_lossy(&run(&["sessions", "list"], &dirs.data, &ws).stdout).into_owned();
    assert!(!list.contains(&sid), "removed session still listed: {list}");
}

#[test]
fn prompt_json_prints_a_new_files_diff_as_the_editor_gets_it() {
    let dirs = TestDirs::new("prompt-json-diff");
    let ws = dirs.workspace("ws");
    let args = ["prompt", "--json", "--agent", "opencode", "--sandbox", "none", "SCENARIO:tools write a file"];
    let printed = notifications(&run(&args, &dirs.data, &ws));
    let diffs: Vec<Value> = printed
        .iter()
        .flat_map(|n| n["update"]["content"].as_array().cloned().unwrap_or_default())
        .filter(|item| item["type"] == "diff")
        .collect();
    assert_eq!(
        diffs,
        [json!({"type": "diff", "path": ws.join("hello.txt"), "newText": "hello from fake model\n", "oldText": null})]
    );
}

#[test]
fn doctor_reports_the_configured_cli_and_sandbox() {
    let dirs = TestDirs::new("doctor");
    let out = run(&["doctor"], &dirs.data, dirs.root());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&fakes_dir().join("opencode").display().to_string()), "doctor: {text}");
}

#[test]
fn a_cli_not_found_is_installed_from_npm_on_first_use_and_shown_as_a_tool_call() {
    let dirs = TestDirs::new("install");
    let ws = dirs.workspace("ws");
    // A stand-in for npm: installs a package whose executable is the fake OpenCode, linked from `.bin` as npm does
    // (so the sandbox shows the fake where it really is, also when the checkout is under /tmp).
    let bin = dirs.root().join("fake-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let npm = bin.join("npm");
    std::fs::write(
        &npm,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{log}'\nwhile [ $# -gt 0 ]; do [ \"$1\" = --prefix ] && prefix=\"$2\"; shift; done\n\
             mkdir -p \"$prefix/node_modules/.bin\"\n\
             ln -s '{fake}' \"$prefix/node_modules/.bin/opencode\"\n",
            log = dirs.root().join("npm.log").display(),
            fake = fakes_dir().join("opencode").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&npm, std::fs::Permissions::from_mode(0o755)).unwrap();
    let options = BridgeOptions::new("opencode", &dirs.data)
        .without_env("ACP_SANDBOX_OPENCODE_BIN")
        .env("PATH", &format!("{}:/usr/bin:/bin", bin.display()));
    let mut bridge = Bridge::start(options);
    let sid = bridge.new_session(&ws);

    let first = bridge.prompt(&sid, "Say hello");
    assert_eq!(first.stop_reason(), "end_turn");
    let install = first
        .updates
        .iter()
        .find(|u| {
            u["sessionUpdate"] == "tool_call" && u["title"].as_str().unwrap_or("").contains("Installing OpenCode")
        })
        .unwrap_or_else(|| panic!("no install card: {:?}", first.updates));
    let id = install["toolCallId"].clone();
    assert!(
        first.updates.iter().any(|u| u["toolCallId"] == id && u["status"] == "completed"),
        "the install card must complete"
    );
    let npm_log = std::fs::read_to_string(dirs.root().join("npm.log")).unwrap();
    assert!(npm_log.contains("install") && npm_log.contains("opencode-ai@1.18.33"), "{npm_log}");

    let second = bridge.prompt(&sid, "Say hello again");
    assert_eq!(second.stop_reason(), "end_turn");
    assert!(
        !second.updates.iter().any(|u| u["title"].as_str().unwrap_or("").contains("Installing")),
        "the second turn reuses the installed CLI"
    );
    assert_eq!(std::fs::read_to_string(dirs.root().join("npm.log")).unwrap().lines().count(), 1);
}

/// The warning every command under `--sandbox none` starts with on stderr.
const NO_SANDBOX: &str = " WARN CLIs run WITHOUT a sandbox: --sandbox none was given\n";

/// The notice the bridge puts at the top of a turn that runs without a sandbox.
const NO_SANDBOX_NOTICE: &str = "\n\n_OpenCode runs WITHOUT a sandbox here (--sandbox none was given): it can read and write everything you can._\n\n";

/// What `prompt` says on stderr about the session once a turn is over.
fn continue_line(sid: &str) -> String {
    format!("(session {sid}: continue with --session {sid})")
}

/// The id of the only session of `data`.
fn only_session(data: &Path, cwd: &Path) -> String {
    let list = stdout(&run(&["sessions", "list"], data, cwd));
    let ids: Vec<&str> = list.lines().map(|line| line.split_whitespace().next().unwrap()).collect();
    assert_eq!(ids.len(), 1, "{list}");
    ids[0].to_string()
}

#[test]
fn prompt_shows_a_tools_turn_in_plain_words_with_its_diff_and_the_commands_output() {
    let dirs = TestDirs::new("prompt-person");
    let ws = dirs.workspace("ws");
    let output = run(&["prompt", "--sandbox", "none", "SCENARIO:tools write a file"], &dirs.data, &ws);
    let ws = ws.display();
    assert_eq!(
        stdout(&output),
        format!(
            "{NO_SANDBOX_NOTICE}I'll write the file first.
▸ Write hello.txt (edit)
    --- /dev/null
    +++ {ws}/hello.txt
    @@ -0,0 +1 @@
    +hello from fake model
  ✓ done
▸ cat hello.txt && echo bash-ok (execute)
  ✓ done
    hello from fake model
    bash-ok
▸ Read hello.txt (read)
  ✓ done
    hello from fake model
Done: wrote, ran bash, and read the file.
"
        )
    );
    let sid = only_session(&dirs.data, dirs.root());
    // Not a terminal: no status line, and the stop reason in words.
    assert_eq!(stderr(&output), format!("{NO_SANDBOX}done {}\n", continue_line(&sid)));
}

#[test]
fn a_failed_turn_is_said_once_on_the_terminal() {
    let dirs = TestDirs::new("prompt-error");
    let ws = dirs.workspace("ws");
    let output = acp(&["prompt", "--sandbox", "none", "SCENARIO:error400"], &dirs.data, &ws).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let sid = only_session(&dirs.data, dirs.root());
    assert_eq!(
        stderr(&output),
        format!(
            "{NO_SANDBOX}error: fake upstream error: model refused (scripted 400) \
             (http://127.0.0.1:18080/v1/chat/completions)\n{}\n",
            continue_line(&sid)
        )
    );
    let log = std::fs::read_dir(&dirs.data)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.file_name().unwrap().to_string_lossy().starts_with("acp-sandbox.log"))
        .expect("a log file");
    let log = std::fs::read_to_string(log).unwrap();
    assert_eq!(log.matches("turn failed: fake upstream error").count(), 1, "the log keeps it: {log}");
}

#[test]
fn amps_missing_key_tells_a_terminal_user_to_export_it() {
    let dirs = TestDirs::new("prompt-amp-key");
    let ws = dirs.workspace("ws");
    let output = acp(&["prompt", "--agent", "amp", "--sandbox", "none", "hello"], &dirs.data, &ws)
        .env_remove("AMP_API_KEY")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let sid = only_session(&dirs.data, dirs.root());
    assert_eq!(
        stderr(&output),
        format!(
            "{NO_SANDBOX}error: Amp needs an access token: run `acp-sandbox login --agent amp` in a terminal (it \
             stores the token for acp-sandbox), or set AMP_API_KEY in the agent server's \"env\" in the editor's \
             settings (e.g. Zed's agent_servers) and restart the agent; in a shell, `export AMP_API_KEY=…`\n{}\n",
            continue_line(&sid)
        )
    );
    assert!(invocations(&ws).is_empty(), "Amp was never started");
}

#[test]
fn an_empty_prompt_is_refused_before_anything_starts_or_is_stored() {
    let dirs = TestDirs::new("prompt-empty");
    let ws = dirs.workspace("ws");
    for prompt in [" \n\t", ""] {
        let output = acp(&["prompt", "--sandbox", "none", prompt], &dirs.data, &ws).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{prompt:?}");
        assert_eq!(
            stderr(&output),
            "error: the prompt is empty: give it as an argument (acp-sandbox prompt \"…\") or on stdin\n"
        );
        assert_eq!(stdout(&output), "");
    }
    assert!(!dirs.data.join("acp-sandbox.sqlite3").exists(), "no store was opened");
    assert!(invocations(&ws).is_empty());

    // Over ACP: invalid params, and neither the CLI nor a turn.
    let mut bridge = Bridge::start(BridgeOptions::new("opencode", &dirs.data));
    let sid = bridge.new_session(&ws);
    for blocks in [vec![], vec![serde_json::json!({"type": "text", "text": "  \n"})]] {
        let id = bridge.send_prompt_blocks(&sid, blocks.clone());
        let error = bridge.wait_response(id).expect_err("an empty prompt is refused");
        assert_eq!(
            (error.code, error.message.as_str()),
            (-32602, "The prompt is empty: write something to send"),
            "{blocks:?}"
        );
    }
    assert!(invocations(&ws).is_empty(), "the CLI never started");
    assert_eq!(bridge.prompt(&sid, "Say hello").stop_reason(), "end_turn", "the session goes on");
    drop(bridge);
    let show = stdout(&run(&["sessions", "show", &sid], &dirs.data, &ws));
    assert_eq!(show.matches("\nturn ").count(), 1, "only the real prompt is a turn: {show}");
}

#[test]
fn sessions_show_numbers_each_sessions_turns_and_prints_the_answers() {
    let dirs = TestDirs::new("sessions-show");
    let (first_ws, second_ws) = (dirs.workspace("a"), dirs.workspace("b"));
    run(&["prompt", "--sandbox", "none", "Say hello"], &dirs.data, &first_ws);
    let first = only_session(&dirs.data, &first_ws);
    run(&["prompt", "--sandbox", "none", "Say hello in b"], &dirs.data, &second_ws);
    run(&["prompt", "--sandbox", "none", "--session", &first, "Do you\nremember?"], &dirs.data, &first_ws);

    // `--cwd .` is the workspace, however it is written.
    let list = stdout(&run(&["sessions", "list", "--cwd", "."], &dirs.data, &first_ws));
    assert_eq!(list.lines().count(), 1, "{list}");
    assert!(list.starts_with(&format!("{first}  opencode  ")), "{list}");
    assert!(list.ends_with(&format!("  Say hello  {}\n", first_ws.display())), "{list}");

    let show = stdout(&run(&["sessions", "show", &first], &dirs.data, &first_ws));
    let turns: Vec<String> = show
        .split("\nturn ")
        .skip(1)
        .map(|turn| {
            // `N at <time>, …`: the time varies.
            let (number, rest) = turn.split_once(" at ").unwrap();
            let (_, rest) = rest.split_once(", ").unwrap();
            format!("{number}, {rest}")
        })
        .collect();
    let no_sandbox = NO_SANDBOX_NOTICE.trim();
    assert_eq!(
        turns,
        [
            format!(
                "1, done: end_turn\n  > Say hello\n  {no_sandbox}\n\n  Hello from the fake model. This is a plain text \
                 answer.\n"
            ),
            "2, done: end_turn\n  > Do you\n  > remember?\n  Yes, I remember: this is turn two of the same session.\n"
                .to_string(),
        ],
        "{show}"
    );
}

#[test]
fn removing_an_unknown_session_fails_and_says_where_to_look() {
    let dirs = TestDirs::new("sessions-rm");
    let output = acp(&["sessions", "rm", "sess_nope"], &dirs.data, dirs.root()).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr(&output),
        format!(
            "no session sess_nope in {}: `acp-sandbox sessions list` shows the stored ones\n",
            dirs.data.join("acp-sandbox.sqlite3").display()
        )
    );
}

#[test]
fn a_closed_pipe_ends_sessions_list_and_doctor_quietly() {
    let dirs = TestDirs::new("broken-pipe");
    let ws = dirs.workspace("ws");
    run(&["prompt", "--sandbox", "none", "Say hello"], &dirs.data, &ws);
    for args in [&["sessions", "list"][..], &["doctor", "--sandbox", "none"]] {
        // A pipe whose reader is gone before anything is written, like `| head -1` once it has its line.
        let (reader, writer) = nix::unistd::pipe().unwrap();
        drop(reader);
        let output = acp(args, &dirs.data, &ws).stdout(writer).output().unwrap();
        assert_eq!((output.status.code(), stderr(&output)), (Some(0), String::new()), "{args:?}");
    }
}

/// `doctor`'s output and exit code, with an OpenCode config and logins of the test's own, and no provider
/// variable from the machine running the tests.
fn doctor(dirs: &TestDirs, args: &[&str], configure: impl FnOnce(&mut Command)) -> (Option<i32>, String, String) {
    let mut command = acp(&[&["doctor"], args].concat(), &dirs.data, dirs.root());
    command.env("XDG_CONFIG_HOME", dirs.root().join("config")).env("XDG_DATA_HOME", dirs.root().join("share"));
    for variable in acp_sandbox::agents::opencode::providers::all_provider_env() {
        command.env_remove(variable);
    }
    configure(&mut command);
    let output = command.output().unwrap();
    (output.status.code(), stdout(&output), stderr(&output))
}

/// The lines of `text` that start with `prefix`.
fn lines_starting<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|line| line.starts_with(prefix)).collect()
}

#[test]
fn doctor_reports_opencodes_model_and_providers_and_where_its_executable_came_from() {
    let dirs = TestDirs::new("doctor-opencode");
    let fake = fakes_dir().join("opencode");
    let (code, out, _) = doctor(&dirs, &["--sandbox", "none"], |_| {});
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out.lines().skip(4).take(3).collect::<Vec<_>>(),
        [
            format!("OpenCode    {} (from ACP_SANDBOX_OPENCODE_BIN)", fake.display()).as_str(),
            "            model: OpenCode's own choice (no --model, and no `model` in your OpenCode config)",
            "            providers: none found in your OpenCode config, its logins or the environment: run `opencode \
             auth login`, or set a provider's key (e.g. ANTHROPIC_API_KEY)",
        ],
        "{out}"
    );
    assert_eq!(
        lines_starting(&out, "sandbox "),
        ["sandbox     plain process group, NO isolation (--sandbox none was given)"],
        "{out}"
    );
    // None of the warm server's isolation holds without a sandbox, and doctor says so.
    assert_eq!(
        lines_starting(&out, "  server "),
        ["  server        OFF NOT isolated: under --sandbox none any tool can reach OpenCode's warm server (its \
             port, its door, its password) and answer its own approvals"],
        "{out}"
    );

    let config = dirs.root().join("config/opencode");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("opencode.json"),
        "{ // JSONC, as OpenCode reads it\n \"model\": \"anthropic/claude-sonnet-4\",\n \"provider\": {\"local\": {}},\n}",
    )
    .unwrap();
    let logins = dirs.root().join("share/opencode");
    std::fs::create_dir_all(&logins).unwrap();
    std::fs::write(logins.join("auth.json"), r#"{"openrouter": {"type": "api", "key": "sk-or-secret"}}"#).unwrap();
    let (code, out, _) = doctor(&dirs, &["--sandbox", "none", "--opencode-bin", &fake.display().to_string()], |c| {
        c.env_remove("ACP_SANDBOX_OPENCODE_BIN").env("GROQ_API_KEY", "gsk-secret");
    });
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out.lines().skip(4).take(3).collect::<Vec<_>>(),
        [
            format!("OpenCode    {} (from --opencode-bin)", fake.display()).as_str(),
            "            model: anthropic/claude-sonnet-4 (the `model` of your OpenCode config)",
            "            providers: anthropic (your OpenCode config), local (your OpenCode config), openrouter \
             (`opencode auth login`), GROQ_API_KEY is set",
        ],
        "{out}"
    );
    assert!(
        !out.contains("sk-or-secret") && !out.contains("gsk-secret"),
        "doctor names credentials, never their values: {out}"
    );
}

#[test]
fn doctor_exits_non_zero_on_errors_and_gives_namespace_advice_when_bubblewrap_is_installed() {
    let dirs = TestDirs::new("doctor-errors");
    // A bubblewrap that is installed but may not create user namespaces (Ubuntu's AppArmor restriction).
    let bin = dirs.root().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let bwrap = bin.join("bwrap");
    std::fs::write(&bwrap, "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bwrap, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let (code, out, err) = doctor(&dirs, &["--sandbox", "bwrap"], |c| {
        c.env("PATH", &path);
    });
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(err, "1 problem found (the ERROR lines)\n");
    let sandbox: Vec<&str> = out.lines().skip_while(|line| !line.starts_with("sandbox ")).take(5).collect();
    assert_eq!(
        sandbox,
        [
            "sandbox     ERROR sandbox unavailable: --sandbox bwrap cannot work here: bubblewrap cannot create its \
             namespaces here: bwrap: setting up uid map: Permission denied",
            "            bubblewrap is installed, but user namespaces are disabled or restricted here. Check:",
            "            `sysctl kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10 and later: 1 restricts them; \
             allow bwrap",
            "            with an AppArmor profile, or set it to 0), `sysctl kernel.unprivileged_userns_clone` (older \
             Debian: 1 allows",
            "            them), `sysctl user.max_user_namespaces` (0 disables them); in a container, allow user namespaces.",
        ],
        "{out}"
    );
    assert!(!out.contains("install the `bubblewrap` package"), "{out}");

    // Without bubblewrap: install it. And Amp, the agent in use, without its key is an error too.
    std::fs::remove_file(&bwrap).unwrap();
    let (code, out, err) = doctor(&dirs, &["--sandbox", "bwrap", "--agent", "amp"], |c| {
        c.env("PATH", &bin).env_remove("AMP_API_KEY");
    });
    assert_eq!((code, err.as_str()), (Some(1), "2 problems found (the ERROR lines)\n"), "{out}");
    assert_eq!(
        lines_starting(&out, "            "),
        [
            "            model: OpenCode's own choice (no --model, and no `model` in your OpenCode config)",
            "            providers: none found in your OpenCode config, its logins or the environment: run `opencode \
             auth login`, or set a provider's key (e.g. ANTHROPIC_API_KEY)",
            "            credentials: its providers' keys, the API logins of auth.json and its Anthropic and GitHub \
             Copilot OAuth logins stay with the bridge (model gateway; the agent holds placeholders, the bridge \
             refreshes the logins); its ChatGPT and other OAuth logins, and a key you wrote in opencode.json, enter \
             as they are",
            "            AMP_API_KEY: ERROR missing: set AMP_API_KEY or run `acp-sandbox login --agent amp`",
            "            credentials: AMP_API_KEY enters the sandbox as it is (Amp's service is not behind the model \
             gateway)",
            "            credentials: what --pass-env gives it enters the sandbox as it is (the bridge cannot tell keys)",
            "            ANTHROPIC_API_KEY: missing: set ANTHROPIC_API_KEY or run `acp-sandbox login --agent claude` \
             (with `--own`: sign in with a Claude subscription)",
            "            model API: api.anthropic.com",
            "            settings: no ~/.claude/settings.json: each session gets permissions.defaultMode \"default\" \
             (tools ask first)",
            "            credentials: ANTHROPIC_API_KEY, CLAUDE_CODE_OAUTH_TOKEN, ANTHROPIC_AUTH_TOKEN stay with the \
             bridge (model gateway; the agent holds placeholders)",
            "            OPENAI_API_KEY: missing: set OPENAI_API_KEY or run `acp-sandbox login --agent codex` (with \
             `--own`: sign in with ChatGPT)",
            "            model API: https://api.openai.com/v1 with a key, ChatGPT's backend when signed in with ChatGPT \
             (set OPENAI_BASE_URL for another endpoint; key OPENAI_API_KEY)",
            "            model: Codex's own default (set ACP_SANDBOX_CODEX_MODEL to choose)",
            "            credentials: OPENAI_API_KEY and a ChatGPT login (`--own`) stay with the bridge (model gateway; \
             the agent holds placeholders, the bridge refreshes the login)",
            "            GEMINI_API_KEY: missing: set GEMINI_API_KEY or run `acp-sandbox login --agent gemini`",
            "            model API: generativelanguage.googleapis.com (key GEMINI_API_KEY)",
            "            credentials: GEMINI_API_KEY stays with the bridge (model gateway; the agent holds a placeholder)",
            "            install the `bubblewrap` package for isolation",
        ],
        "{out}"
    );
}

/// The long flags a `--help` lists.
fn flags(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|line| {
            line.trim_start().split_once("--").filter(|(before, _)| before.is_empty() || *before == "-h, ")
        })
        .map(|(_, rest)| format!("--{}", rest.split_whitespace().next().unwrap()))
        .collect()
}

#[test]
fn help_shows_each_command_its_own_settings_and_the_defaults() {
    let dirs = TestDirs::new("help");
    let prompt = stdout(&run(&["prompt", "--help"], &dirs.data, dirs.root()));
    assert_eq!(
        flags(&prompt),
        [
            "--agent",
            "--json",
            "--sandbox",
            "--session",
            "--workspace",
            "--data-dir",
            "--model",
            "--idle-timeout",
            "--store-busy-timeout",
            "--network",
            "--profile",
            "--deny-read",
            "--allow-read",
            "--protect",
            "--pass-env",
            "--max-processes",
            "--max-memory",
            "--turn-timeout",
            "--remote-idle",
            "--remote-upload-secrets",
            "--help",
            // Each agent's own settings, under its name.
            "--amp-bin",
            "--opencode-bin",
            "--opencode-backend",
            "--agent-command",
            "--claude-bin",
            "--codex-bin",
            "--gemini-bin",
        ],
        "{prompt}"
    );
    let list = stdout(&run(&["sessions", "list", "--help"], &dirs.data, dirs.root()));
    assert_eq!(flags(&list), ["--cwd", "--data-dir", "--help"], "{list}");
    // The server settings are still taken after the subcommand.
    run(&["prompt", "--replay-limit", "5", "--help"], &dirs.data, dirs.root());

    let top = stdout(&run(&["--help"], &dirs.data, dirs.root()));
    let about = |flag: &str| {
        let start = top.find(&format!("      {flag} ")).unwrap_or_else(|| panic!("{flag} in {top}"));
        top[start..].split("\n\n").next().unwrap().lines().skip(1).map(str::trim).collect::<Vec<_>>().join(" ")
    };
    assert_eq!(
        about("--amp-modes"),
        "Amp modes offered in the editor (comma-separated; the first is the default)  [env: ACP_SANDBOX_AMP_MODES=] [default: medium,low,high,ultra]"
    );
    assert_eq!(
        about("--replay-limit"),
        "When an editor reopens a session, replay at most this many updates (a prompt counts as one): the newest turns whole and no older ones; a newest turn longer than this keeps its prompt and its newest updates. Each cut is said in a note  [env: ACP_SANDBOX_REPLAY_LIMIT=] [default: 5000]"
    );
    assert!(about("--data-dir").starts_with("Sessions, logs and installed CLIs live here [default: $XDG_DATA_HOME/acp-sandbox, or ~/.local/share/acp-sandbox when XDG_DATA_HOME is unset]"), "{top}");
}

#[test]
fn doctor_on_a_fresh_machine_is_not_an_error_when_the_cli_is_still_to_be_installed() {
    let dirs = TestDirs::new("doctor-fresh");
    // npm is there, OpenCode is not: it is installed on first use.
    let bin = dirs.root().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("npm"), "#!/bin/sh\nexit 0\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.join("npm"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, out, err) = doctor(&dirs, &["--sandbox", "none"], |c| {
        c.env("PATH", &bin).env_remove("ACP_SANDBOX_OPENCODE_BIN");
    });
    assert_eq!((code, err.as_str()), (Some(0), ""), "{out}");
    assert_eq!(
        lines_starting(&out, "  run "),
        ["  run           `opencode --version` runs in the sandbox once it is installed"],
        "{out}"
    );
}

#[test]
fn every_ready_editor_config_starts_an_agent_server_that_initializes() {
    use std::io::{BufRead, BufReader, Write};
    let dirs = TestDirs::new("editor-configs");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names = Vec::new();
    for config in ["editors/zed/settings.json", "editors/jetbrains/acp.json"] {
        let text = std::fs::read_to_string(root.join(config)).unwrap();
        let servers: Value = serde_json::from_str(&text).unwrap();
        for (name, server) in servers["agent_servers"].as_object().unwrap() {
            assert_eq!(server["command"], "acp-sandbox", "{config}: {name}");
            let args: Vec<&str> = server["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
            let mut command = acp(&args, &dirs.data, dirs.root());
            for (key, value) in server["env"].as_object().into_iter().flatten() {
                command.env(key, value.as_str().unwrap());
            }
            let mut child = command
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                    "params": {"protocolVersion": 1, "clientCapabilities": {}}});
            writeln!(child.stdin.as_mut().unwrap(), "{initialize}").unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
            drop(child.stdin.take());
            let _ = child.wait();
            let answer: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{config}: {name}: {e}: {line:?}"));
            assert_eq!(answer["result"]["agentInfo"]["name"], "acp-sandbox", "{config}: {name}: {answer}");
            names.push(format!("{config}: {name}"));
        }
    }
    assert_eq!(names.len(), 14, "{names:#?}");
}

#[test]
fn doctor_says_what_network_ask_does_and_that_it_needs_bubblewrap() {
    let dirs = TestDirs::new("doctor-ask");
    let (code, out, _) = doctor(&dirs, &["--sandbox", "none", "--network", "ask"], |_| {});
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        lines_starting(&out, "  network "),
        ["  network       OFF needs bubblewrap: the host's network, and nothing is asked"]
    );
    if let Err(why) = bwrap_usable() {
        eprintln!(
            "SKIPPED the bubblewrap half of doctor_says_what_network_ask_does_and_that_it_needs_bubblewrap: {why}"
        );
        return;
    }
    let (code, out, _) = doctor(&dirs, &["--sandbox", "bwrap", "--network", "ask=listed.example"], |_| {});
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        lines_starting(&out, "  network "),
        ["  network       on  own network namespace; out only through the bridge's proxy (ask=listed.example): any \
          other host is asked about on a card in the thread whose turn runs (each session its own sandbox)"]
    );
}
