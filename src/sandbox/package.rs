//! The npm package an agent's CLI comes in, pinned, and where its executable lands in the tools cache once
//! [`super::install`] installed it.

use std::path::{Path, PathBuf};

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
    /// Packages of the same version installed beside it, in the same prefix.
    pub companions: &'static [&'static str],
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
