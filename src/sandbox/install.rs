//! Installing a CLI from npm into the shared tools cache on first use.
//!
//! One folder per pinned package version under `<data>/tools`, installed into a temporary folder and
//! renamed into place, so two bridges installing at once never see a half-written tree. The cache is on
//! the host and visible read-only inside bubblewrap.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use super::SandboxError;

/// An npm package that provides a CLI.
#[derive(Clone, Copy, Debug)]
pub struct NpmPackage {
    /// Package name, e.g. `opencode-ai`.
    pub name: &'static str,
    /// The exact version: one whose platform binary package exists in the registry.
    pub version: &'static str,
    /// The executable's name under `node_modules/.bin`.
    pub bin: &'static str,
    /// A script that links the platform binary, run by hand when npm skipped install scripts.
    pub postinstall: Option<&'static str>,
}

impl NpmPackage {
    /// The folder this version installs into.
    pub fn dir(&self, tools_dir: &Path) -> PathBuf {
        tools_dir.join(format!("{}@{}", self.name.replace('/', "+"), self.version))
    }

    /// The executable once installed.
    pub fn executable(&self, tools_dir: &Path) -> PathBuf {
        self.dir(tools_dir).join("node_modules").join(".bin").join(self.bin)
    }
}

/// Installs `package` unless it is already in the cache, and returns its executable.
pub async fn install(package: NpmPackage, tools_dir: &Path) -> Result<PathBuf, SandboxError> {
    let executable = package.executable(tools_dir);
    if executable.exists() {
        return Ok(executable);
    }
    let npm = which::which("npm").map_err(|_| SandboxError::Install {
        package: package.name.into(),
        message: "npm is not installed; install Node.js and npm, or put the CLI on PATH".into(),
    })?;
    let target = package.dir(tools_dir);
    let staging = tools_dir.join(format!(".staging-{}-{}", std::process::id(), uuid::Uuid::new_v4()));
    tokio::fs::create_dir_all(&staging)
        .await
        .map_err(|e| SandboxError::io(format!("create {}", staging.display()), e))?;
    let spec = format!("{}@{}", package.name, package.version);
    tracing::info!(package = %spec, into = %target.display(), "installing CLI from npm");
    // npm runs with the bridge's own environment: it needs the user's proxy and CA settings.
    let output = Command::new(&npm)
        .args(["install", "--no-audit", "--no-fund", "--loglevel", "error", "--prefix"])
        .arg(&staging)
        .arg(&spec)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| SandboxError::Spawn { program: npm.display().to_string(), source })?;
    if !output.status.success() {
        let _ = tokio::fs::remove_dir_all(&staging).await;
        return Err(SandboxError::Install { package: spec, message: tail(&output.stderr) });
    }
    let staged_bin = package.executable(&staging).parent().map(|bin| bin.join(package.bin));
    let runs =
        |path: &Option<PathBuf>| path.as_ref().is_some_and(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 1024));
    if !runs(&staged_bin)
        && let Some(script) = package.postinstall
    {
        // npm 11 may skip install scripts; the package's own script links the platform binary.
        let package_dir = staging.join("node_modules").join(package.name);
        let _ = Command::new("node")
            .arg(package_dir.join(script))
            .current_dir(&package_dir)
            .stdin(Stdio::null())
            .output()
            .await;
    }
    match tokio::fs::rename(&staging, &target).await {
        Ok(()) => {}
        // Another bridge won the race: use its copy.
        Err(_) if executable.exists() => {
            let _ = tokio::fs::remove_dir_all(&staging).await;
        }
        Err(e) => {
            return Err(SandboxError::io(format!("move {} into place", target.display()), e));
        }
    }
    if executable.exists() {
        Ok(executable)
    } else {
        Err(SandboxError::Install {
            package: spec,
            message: format!("{} is missing after install", executable.display()),
        })
    }
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
