//! `acp-sandbox doctor` against the fake Daytona: with `--sandbox daytona` it checks the key, the API and the
//! snapshot, says what a session would use, and fails (exit 1) on a refused key or a missing snapshot; a key set
//! for a provider that is not selected is one INFO line. It never creates anything, and never prints the key.

use super::*;
use pretty_assertions::assert_eq;

fn run(
    fake: &FakeDaytona,
    dirs: &support::TestDirs,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let api = fake.api_url();
    let mut all = vec![("DAYTONA_API_URL", api.as_str())];
    all.extend_from_slice(env);
    let (code, out, err) = support::doctor_with(&dirs.data, args, &all);
    for (name, value) in env.iter().filter(|(name, _)| name.ends_with("_KEY")) {
        assert!(!out.contains(value) && !err.contains(value), "doctor printed {name}: {out}{err}");
    }
    let created = fake.requests().into_iter().filter(|r| r["method"] == "POST").count();
    assert_eq!(created, 0, "doctor made something on Daytona");
    (code, out, err)
}

fn sessions_line(snapshot: &str) -> String {
    format!(
        "            sessions: each in a Daytona sandbox of its own from snapshot {snapshot}, stopped by Daytona after 60 \
         min without activity and started by the next prompt; DAYTONA_API_KEY stays with the bridge"
    )
}

#[test]
fn doctor_checks_the_key_the_api_and_the_default_snapshot() {
    let dir = test_dir("doctor-ok");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-doctor");
    let (code, out, _) = run(
        &fake,
        &dirs,
        &["--sandbox", "daytona"],
        &[("DAYTONA_API_KEY", KEY), ("ACP_SANDBOX_OPENCODE_BACKEND", "serve")],
    );
    assert_eq!(code, Some(0), "{out}");
    // OpenCode's warm server does not run in a Daytona sandbox: doctor says what sessions really get.
    assert_eq!(
        out.lines().filter(|line| line.starts_with("  backend ")).collect::<Vec<_>>(),
        ["  backend       run: one `opencode run` per prompt (a warm `opencode serve` does not run in a remote \
          sandbox yet, --sandbox daytona)"],
        "{out}"
    );
    assert_eq!(
        support::doctor_section(&out, "daytona"),
        [
            "daytona     DAYTONA_API_KEY: set".to_string(),
            format!("            API {}: reachable, the key is accepted", fake.api_url()),
            "            snapshot daytona-small (Daytona's default): exists (active)".to_string(),
            sessions_line("daytona-small"),
        ],
        "{out}"
    );
    assert!(out.contains("for the bridge's own commands; sessions: --sandbox daytona (below)"), "{out}");
    // The default came from Daytona's public configuration, the snapshot with the key.
    let asked: Vec<(String, Option<String>)> = fake
        .requests()
        .into_iter()
        .map(|r| (r["path"].as_str().unwrap().to_string(), r["auth"].as_str().map(str::to_string)))
        .collect();
    assert_eq!(
        asked,
        [
            ("/api/config".to_string(), Some(format!("Bearer {KEY}"))),
            ("/api/snapshots/daytona-small".to_string(), Some(format!("Bearer {KEY}"))),
        ]
    );
}

#[test]
fn doctor_fails_on_a_refused_key_a_missing_snapshot_or_no_key() {
    let dir = test_dir("doctor-fail");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-doctor-fail");
    let (code, out, err) = run(&fake, &dirs, &["--sandbox", "daytona"], &[("DAYTONA_API_KEY", "dtn_not_the_key")]);
    assert_eq!((code, err.as_str()), (Some(1), "1 problem found (the ERROR lines)\n"), "{out}");
    assert_eq!(
        support::doctor_section(&out, "daytona"),
        [
            "daytona     DAYTONA_API_KEY: set".to_string(),
            format!(
                "            ERROR API {}: Daytona refused the API key (HTTP 401) while get snapshot daytona-small: \
                 check DAYTONA_API_KEY (and DAYTONA_API_URL)",
                fake.api_url()
            ),
            sessions_line("daytona-small"),
        ],
        "{out}"
    );

    let (code, out, err) = run(
        &fake,
        &dirs,
        &["--sandbox", "daytona"],
        &[("DAYTONA_API_KEY", KEY), ("ACP_SANDBOX_DAYTONA_SNAPSHOT", "no-such-snapshot")],
    );
    assert_eq!((code, err.as_str()), (Some(1), "1 problem found (the ERROR lines)\n"), "{out}");
    assert_eq!(
        support::doctor_section(&out, "daytona"),
        [
            "daytona     DAYTONA_API_KEY: set".to_string(),
            format!("            API {}: reachable, the key is accepted", fake.api_url()),
            "            ERROR snapshot no-such-snapshot (ACP_SANDBOX_DAYTONA_SNAPSHOT): Daytona has no snapshot of \
             that name: set ACP_SANDBOX_DAYTONA_SNAPSHOT to one of yours, or unset it for Daytona's default"
                .to_string(),
            sessions_line("no-such-snapshot"),
        ],
        "{out}"
    );

    let (code, out, _) = run(&fake, &dirs, &["--sandbox", "daytona"], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(
        support::doctor_section(&out, "daytona"),
        ["daytona     ERROR DAYTONA_API_KEY: missing: --sandbox daytona needs your Daytona key in the bridge's \
             environment, or run `acp-sandbox login --provider daytona`"],
        "{out}"
    );
}

#[test]
fn doctor_mentions_a_key_of_a_provider_that_is_not_selected_in_one_info_line() {
    let dir = test_dir("doctor-info");
    let fake = FakeDaytona::start(&dir);
    let dirs = support::TestDirs::new("daytona-doctor-info");
    let (code, out, _) = run(&fake, &dirs, &["--sandbox", "none"], &[("DAYTONA_API_KEY", KEY)]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        support::doctor_section(&out, "daytona"),
        ["daytona     INFO DAYTONA_API_KEY is set, but sessions run with --sandbox none; --sandbox daytona would run \
             each in a Daytona sandbox of its own"],
        "{out}"
    );
    // Not selected: Daytona is not asked anything.
    assert_eq!(fake.requests(), Vec::<Value>::new());
    let (_, out, _) = run(&fake, &dirs, &["--sandbox", "none"], &[]);
    assert_eq!(support::doctor_section(&out, "daytona"), Vec::<&str>::new(), "{out}");
}
