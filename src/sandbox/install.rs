//! Installing a CLI from npm into the shared tools cache on first use.
//!
//! One folder per pinned package version under `<data>/tools`, installed into a temporary folder and
//! renamed into place, so two bridges installing at once never see a half-written tree. The cache is on
//! the host and visible read-only inside bubblewrap. A remote sandbox gets its CLI from npm inside it instead
//! ([`install_in`]), below its own state dir.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::{ExecSpec, RemoteFiles, Sandbox, SandboxError};
use crate::sandbox::package::NpmPackage;

/// Installs `package` unless it is already in the cache, and returns its executable. `cancel` (or dropping the
/// future) ends npm and everything it started, and removes the half-made install: nothing outlives the turn.
pub async fn install(
    package: NpmPackage,
    tools_dir: &Path,
    cancel: &CancellationToken,
) -> Result<PathBuf, SandboxError> {
    let executable = package.executable(tools_dir);
    if executable.exists() {
        return Ok(executable);
    }
    let spec = format!("{}@{}", package.name, package.version);
    let target = package.dir(tools_dir);
    let mut specs = vec![spec.clone()];
    specs.extend(package.companions.iter().map(|name| format!("{name}@{}", package.version)));
    let staging = npm_install(package.name, &specs, tools_dir, &target, cancel).await?;
    let staged_bin = package.executable(&staging.0).parent().map(|bin| bin.join(package.bin));
    let runs =
        |path: &Option<PathBuf>| path.as_ref().is_some_and(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 1024));
    if !runs(&staged_bin)
        && let Some(script) = package.postinstall
    {
        // npm 11 may skip install scripts; the package's own script links the platform binary.
        let package_dir = staging.0.join("node_modules").join(package.name);
        let mut link = Command::new("node");
        link.arg(package_dir.join(script)).current_dir(&package_dir);
        if let Err(SandboxError::Cancelled) = run(link, cancel).await {
            return Err(SandboxError::Cancelled);
        }
    }
    into_place(staging, &target, || executable.exists()).await?;
    if executable.exists() {
        Ok(executable)
    } else {
        Err(SandboxError::Install {
            package: spec,
            message: format!("{} is missing after install", executable.display()),
        })
    }
}

/// Installs `package` of `version` (an npm package wanted beside a CLI of that version, e.g. OpenCode's plugin
/// package) into its own folder of the tools cache unless it is there, and returns that folder. Installed like a
/// CLI: staged, then renamed into place, so a folder that exists is whole.
pub async fn install_package(
    package: &str,
    version: &str,
    tools_dir: &Path,
    cancel: &CancellationToken,
) -> Result<PathBuf, SandboxError> {
    let target = package_dir(tools_dir, package, version);
    let installed = || target.join("node_modules").join(package).join("package.json").is_file();
    if installed() {
        return Ok(target);
    }
    // One install of a package at a time in this process: a session's warm start and its first prompt share it.
    static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = ONE.lock().await;
    if installed() {
        return Ok(target);
    }
    let staging = npm_install(package, &[format!("{package}@{version}")], tools_dir, &target, cancel).await?;
    into_place(staging, &target, installed).await?;
    Ok(target)
}

/// The folder of the tools cache that [`install_package`] installs `package` of `version` into.
pub fn package_dir(tools_dir: &Path, package: &str, version: &str) -> PathBuf {
    tools_dir.join(format!("{}@{version}", package.replace('/', "+")))
}

/// Runs `npm install specs` into a new staging folder of `tools_dir` (removed when dropped).
async fn npm_install(
    name: &str,
    specs: &[String],
    tools_dir: &Path,
    target: &Path,
    cancel: &CancellationToken,
) -> Result<Staging, SandboxError> {
    let npm = which::which("npm").map_err(|_| SandboxError::Install {
        package: name.into(),
        message: "npm is not installed; install Node.js and npm, or put the CLI on PATH".into(),
    })?;
    let staging = tools_dir.join(format!(".staging-{}-{}", std::process::id(), uuid::Uuid::new_v4()));
    tokio::fs::create_dir_all(&staging)
        .await
        .map_err(|e| SandboxError::io(format!("create {}", staging.display()), e))?;
    let staging = Staging(staging);
    tracing::info!(packages = ?specs, into = %target.display(), "installing from npm");
    // npm runs with the bridge's own environment: it needs the user's proxy and CA settings.
    let mut npm_install = Command::new(&npm);
    npm_install
        .args(["install", "--no-audit", "--no-fund", "--loglevel", "error", "--prefix"])
        .arg(&staging.0)
        .args(specs);
    let output = run(npm_install, cancel).await?;
    if !output.status.success() {
        return Err(SandboxError::Install { package: specs[0].clone(), message: tail(&output.stderr) });
    }
    Ok(staging)
}

/// Renames a finished staging folder into place; `done` says whether another bridge's copy, which won the race,
/// is already there.
async fn into_place(staging: Staging, target: &Path, done: impl Fn() -> bool) -> Result<(), SandboxError> {
    match tokio::fs::rename(&staging.0, target).await {
        Ok(()) => Ok(()),
        // Another bridge won the race: use its copy (the staging folder goes with `staging`).
        Err(_) if done() => Ok(()),
        Err(e) => Err(SandboxError::io(format!("move {} into place", target.display()), e)),
    }
}

/// Runs one step of an install in a process group of its own, and ends the whole group when it exits, when
/// `cancel` fires and when the future is dropped (npm starts node, node starts install scripts).
async fn run(mut command: Command, cancel: &CancellationToken) -> Result<std::process::Output, SandboxError> {
    let program = command.as_std().get_program().to_string_lossy().into_owned();
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).kill_on_drop(true);
    let child = command.spawn().map_err(|source| SandboxError::Spawn { program, source })?;
    let _group = child.id().map(ProcessGroup);
    tokio::select! {
        output = child.wait_with_output() => output.map_err(|e| SandboxError::io("wait for npm", e)),
        _ = cancel.cancelled() => Err(SandboxError::Cancelled),
    }
}

/// Kills a process group when dropped. Safe after its leader is gone: a group's id is not given to a new
/// process while any member lives, and a signal to a group without members reaches nobody.
struct ProcessGroup(u32);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Ok(group) = i32::try_from(self.0) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(group), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Removes a staging folder when dropped: after an install that failed, was cancelled or lost the race (one that
/// was renamed into place is no longer there).
struct Staging(PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Where CLIs installed inside a remote sandbox live: below its state dir, so they persist across turns, pauses
/// and bridge restarts, as long as the sandbox does.
pub fn remote_tools_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("tools")
}

/// The file a finished install inside a sandbox leaves, holding `name@version`: one small read tells a later turn
/// that the CLI is there (its executable is a link npm made; the binary behind it is some hundred MB).
fn stamp(package: NpmPackage, tools_dir: &Path) -> PathBuf {
    package.dir(tools_dir).join(".acp-sandbox-installed")
}

/// The CLI's executable in a remote sandbox when an earlier turn installed it there.
pub async fn installed_in(
    package: NpmPackage,
    sandbox: &dyn Sandbox,
    files: &dyn RemoteFiles,
) -> Result<Option<PathBuf>, SandboxError> {
    let tools = remote_tools_dir(sandbox.state_dir());
    let spec = format!("{}@{}", package.name, package.version);
    let found = files.read(&stamp(package, &tools)).await?;
    Ok(found.filter(|bytes| String::from_utf8_lossy(bytes).trim() == spec).map(|_| package.executable(&tools)))
}

/// Installs a CLI inside the sandbox: npm of the sandbox's own template, into a staging folder moved into place
/// when npm succeeded (a cancelled or failed install never looks installed), then the stamp. Arguments:
/// staging, target, spec, bin, package name, postinstall script, stamp. Exit 127 with the first line: no npm.
const REMOTE_INSTALL: &str = r#"staging=$1 target=$2 spec=$3 bin=$4 name=$5 postinstall=$6 stamp=$7
if ! command -v npm >/dev/null 2>&1; then
  echo "acp-sandbox: no npm on the sandbox's PATH ($PATH)" >&2
  exit 127
fi
rm -rf "$staging" && mkdir -p "$staging" "$HOME" || exit 1
npm install --no-audit --no-fund --loglevel error --prefix "$staging" "$spec" || exit 1
package="$staging/node_modules/$name"
if [ -n "$postinstall" ] && [ -f "$package/$postinstall" ] &&
  [ "$(wc -c < "$staging/node_modules/.bin/$bin" 2>/dev/null || echo 0)" -le 1024 ]; then
  # npm 11 may skip install scripts; the package's own script links the platform binary.
  (cd "$package" && node "$postinstall") || true
fi
rm -rf "$target" && mv "$staging" "$target" || exit 1
if [ ! -x "$target/node_modules/.bin/$bin" ]; then
  echo "acp-sandbox: $target/node_modules/.bin/$bin is missing after npm install" >&2
  exit 1
fi
printf '%s\n' "$spec" > "$stamp"
"#;

/// Installs `package` with npm inside a remote sandbox, below its state dir, and returns the executable there.
/// `cancel` ends npm and everything it started (the sandbox's kill ends the whole tree).
pub async fn install_in(
    package: NpmPackage,
    sandbox: &dyn Sandbox,
    cancel: &CancellationToken,
) -> Result<PathBuf, SandboxError> {
    let state = sandbox.state_dir();
    let tools = remote_tools_dir(state);
    let target = package.dir(&tools);
    let staging = tools.join(format!(".staging-{}@{}", package.name.replace('/', "+"), package.version));
    let spec = format!("{}@{}", package.name, package.version);
    let arg = |path: &Path| path.display().to_string();
    let exec = ExecSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec![
            "-c".into(),
            REMOTE_INSTALL.into(),
            "acp-sandbox-install".into(),
            arg(&staging),
            arg(&target),
            spec.clone(),
            package.bin.into(),
            package.name.into(),
            package.postinstall.unwrap_or("").into(),
            arg(&stamp(package, &tools)),
        ],
        // No PATH of this machine: npm and node are found on the sandbox's own. npm's cache goes to the CLI's HOME.
        env: vec![("HOME".into(), arg(&state.join("home"))), ("npm_config_update_notifier".into(), "false".into())],
        cwd: state.to_path_buf(),
        ..ExecSpec::default()
    };
    tracing::info!(package = %spec, into = %target.display(), sandbox = %sandbox.isolation(), "installing CLI in the sandbox");
    let mut process = sandbox.exec(exec).await?;
    let stdout = tokio::spawn(drain(std::mem::replace(&mut process.stdout, Box::pin(tokio::io::empty()))));
    let stderr = tokio::spawn(drain(std::mem::replace(&mut process.stderr, Box::pin(tokio::io::empty()))));
    let exit = tokio::select! {
        exit = process.handle.wait() => exit?,
        _ = cancel.cancelled() => {
            process.handle.kill().await;
            return Err(SandboxError::Cancelled);
        }
    };
    stdout.abort();
    let said = stderr.await.unwrap_or_default();
    if exit.success() {
        return Ok(package.executable(&tools));
    }
    let said = tail(&said);
    let message = match exit.code {
        Some(127) if said.starts_with("acp-sandbox: no npm") => {
            format!("npm is not installed in the sandbox ({})", sandbox.isolation())
        }
        _ if said.is_empty() => format!("npm ended with {} and said nothing", exit.describe()),
        _ => format!("npm ended with {}: {said}", exit.describe()),
    };
    Err(SandboxError::Install { package: spec, message })
}

/// Reads a stream to its end, keeping at most its last 64 KiB.
async fn drain(mut stream: super::OutputStream) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        match tokio::io::AsyncReadExt::read(&mut stream, &mut buffer).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                kept.extend_from_slice(&buffer[..n]);
                if kept.len() > 64 * 1024 {
                    kept.drain(..kept.len() - 64 * 1024);
                }
            }
        }
    }
}
