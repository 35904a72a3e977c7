//! Where acp-sandbox keeps its files under the data dir, the user's own dirs, and private directories: paths only,
//! below every module that needs one, so that none reaches into settings or sessions for a path.

use std::path::{Path, PathBuf};

/// The default data dir of the platform, e.g. `~/.local/share/acp-sandbox`.
pub fn default_data_dir() -> PathBuf {
    directories::ProjectDirs::from("", "", "acp-sandbox")
        .map(|dirs| dirs.data_dir().to_path_buf())
        .unwrap_or_else(|| std::env::temp_dir().join("acp-sandbox"))
}

/// A private directory for the sockets of the sandboxes' proxies. Unix socket paths are short (108 bytes), so a
/// deep data dir falls back to the user's runtime dir.
pub fn run_dir(data_dir: &Path) -> PathBuf {
    let preferred = data_dir.join("run");
    // `<run dir>/<12 hex>.sock` must fit.
    if preferred.as_os_str().len() + 18 < 100 {
        return preferred;
    }
    let uid = nix::unistd::getuid();
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) => PathBuf::from(dir).join("acp-sandbox"),
        None => std::env::temp_dir().join(format!("acp-sandbox-{uid}")),
    }
}

/// Per-session state (the CLI's HOME and XDG dirs) lives under here.
pub fn sessions_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("sessions")
}

/// CLIs installed on first use live under here, one folder per pinned version.
pub fn tools_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("tools")
}

/// The user's home (`$HOME`).
pub fn home() -> PathBuf {
    user_dir(directories::BaseDirs::home_dir)
}

/// The user's own config dir (`~/.config`), where the CLIs read their configuration.
pub fn user_config_dir() -> PathBuf {
    user_dir(directories::BaseDirs::config_dir)
}

/// The user's own data dir (`~/.local/share`), where OpenCode keeps its logins.
pub fn user_data_dir() -> PathBuf {
    user_dir(directories::BaseDirs::data_dir)
}

/// One of the user's dirs; without a home, a path that is nowhere (so nothing of the user's is found or shown).
fn user_dir(which: fn(&directories::BaseDirs) -> &Path) -> PathBuf {
    directories::BaseDirs::new().map(|dirs| which(&dirs).to_path_buf()).unwrap_or_else(|| "/nonexistent".into())
}

/// Creates a directory (and its parents) readable by its owner only: it holds prompts, answers and the
/// agents' own state. An existing one of ours is made private too: an older version, or a `mkdir` under the
/// usual umask, left it readable by everyone.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => {
            // A directory someone else made (a shared /tmp) must not hold our sockets or data.
            if meta.uid() != nix::unistd::getuid().as_raw() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("{} belongs to another user", dir.display()),
                ));
            }
            if meta.mode() & 0o077 != 0 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            }
            Ok(())
        }
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", dir.display()),
        )),
        Err(_) => std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_data_dir_is_made_private() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let existing = root.path().join("existing");
        std::fs::create_dir(&existing).unwrap();
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&existing).unwrap();
        assert_eq!(mode(&existing), 0o700);

        let fresh = root.path().join("a/b");
        create_private_dir(&fresh).unwrap();
        assert_eq!((mode(&fresh), mode(&root.path().join("a"))), (0o700, 0o700));
        assert!(create_private_dir(&root.path().join("a/b")).is_ok(), "twice is fine");
        std::fs::write(root.path().join("file"), "").unwrap();
        assert!(create_private_dir(&root.path().join("file")).is_err(), "a file is not a directory");
    }
}
