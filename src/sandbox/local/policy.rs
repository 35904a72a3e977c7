//! What the local sandbox hides, shows and protects: a pure plan of mounts from the user's settings.
//!
//! The plan is computed before each command from what exists on disk at that moment (bubblewrap can only mount
//! over paths that exist), and turned into bubblewrap arguments by `local/mod.rs`. Order matters: a later mount covers
//! an earlier one, so nothing that is shown or writable may be mounted over a hidden path after it is hidden. The
//! plan is always: private `/tmp` and `/run`, the hidden home (strict), what is shown again (toolchains,
//! `--allow-read`, the CLI's install), secrets hidden, the data dir hidden, a CLI installed in the data dir shown,
//! the writable dirs (the workspace and its other roots), secrets inside them hidden again, then the protected paths
//! inside each that exist. A protected path that does not exist is not mounted at all: bubblewrap would create its mount point
//! in the user's workspace, where it stays after a SIGKILL; `protect.rs` guards it instead.

use std::path::{Component, Path, PathBuf};

/// How much of the user's home the CLI sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// The home minus the built-in list of secrets and `--deny-read` paths.
    #[default]
    Default,
    /// Nothing of the home but the workspace, the CLI's own config and the toolchains on `PATH`.
    Strict,
}

impl Profile {
    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Default => "default",
            Profile::Strict => "strict",
        }
    }
}

/// Paths under the home that hold credentials, keys, histories or browser data: never readable in a sandbox.
pub const SECRETS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".m2/settings.xml",
    ".gradle/gradle.properties",
    ".terraform.d/credentials.tfrc.json",
    ".vault-token",
    ".pgpass",
    ".my.cnf",
    ".s3cfg",
    ".boto",
    ".config/rclone",
    ".config/doctl",
    ".fly",
    ".config/op",
    ".password-store",
    ".local/share/keyrings",
    ".local/share/kwalletd",
    ".pki",
    ".bash_history",
    ".zsh_history",
    ".zhistory",
    ".history",
    ".sh_history",
    ".python_history",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    ".lesshst",
    ".local/share/fish/fish_history",
    ".mozilla",
    ".thunderbird",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".config/microsoft-edge",
    ".config/vivaldi",
    ".var/app",
    // Container engines' sockets in the home: a connection to one is root on the host.
    ".colima",
    ".lima",
    ".orbstack",
    ".rd",
    ".local/share/containers",
    // Other agents' credentials and conversations: one agent's shell never reads another's.
    ".local/share/opencode",
    ".config/amp",
    ".local/share/amp",
    ".claude",
    ".claude.json",
    ".codex",
    ".gemini",
    ".config/github-copilot",
    ".cursor",
    ".aider.conf.yml",
];

/// Paths inside the workspace that a program on the host later executes or trusts: read-only in the sandbox.
pub const PROTECTED: &[&str] =
    &[".git/hooks", ".git/config", ".gitmodules", ".envrc", ".vscode", ".idea", ".zed", ".husky"];

/// The bridge-wide part of the policy: from the command line and the user's machine.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// How much of the home is shown.
    pub profile: Profile,
    /// The user's home.
    pub home: PathBuf,
    /// The bridge's data dir: hidden but for the session's own state dir and the CLI's install.
    pub data_dir: PathBuf,
    /// `$XDG_RUNTIME_DIR` (sockets of the user's session bus, agents, keyrings): hidden.
    pub runtime_dir: Option<PathBuf>,
    /// The directories of `PATH` (shown again under `strict` when they are in the home).
    pub path_dirs: Vec<PathBuf>,
    /// `--deny-read`: hidden on top of the built-in secrets.
    pub deny_read: Vec<PathBuf>,
    /// `--allow-read`: shown read-only even where it would be hidden (`/tmp`, the home under `strict`).
    pub allow_read: Vec<PathBuf>,
    /// `--protect`: read-only inside the workspace on top of the built-in list (relative to the workspace).
    pub protect: Vec<PathBuf>,
}

/// One mount of the plan, in bubblewrap's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mount {
    /// An empty, read-only directory over `0` (hides a directory).
    EmptyDir(PathBuf),
    /// An empty, writable, private directory over `0` (`/tmp`, `/run`).
    Scratch(PathBuf),
    /// An empty file over `0` (hides a file).
    EmptyFile(PathBuf),
    /// A host path shown read-only at the same place.
    ReadOnly(PathBuf),
    /// A host path shown writable at the same place.
    Writable(PathBuf),
    /// A symbolic link at `at` to `to`: the path by which the editor named a root, where the host's own link to it
    /// is hidden inside (under `/tmp`).
    Link {
        /// Where the link is.
        at: PathBuf,
        /// What it points to (the root's real path).
        to: PathBuf,
    },
}

/// What one command's sandbox is made of, apart from the command itself.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The mounts in order.
    pub mounts: Vec<Mount>,
}

/// What exists on disk, asked through a trait so that the plan can be unit-tested without a filesystem.
pub trait Disk {
    /// `Some(true)` for a directory, `Some(false)` for anything else, `None` when missing. Follows symlinks.
    fn kind(&self, path: &Path) -> Option<bool>;
    /// The path with symlinks resolved, when it exists.
    fn canonical(&self, path: &Path) -> Option<PathBuf>;
    /// The text of a small file (`.git` files and `.git/config`).
    fn read(&self, path: &Path) -> Option<String>;
}

/// The real filesystem.
pub struct RealDisk;

impl Disk for RealDisk {
    fn kind(&self, path: &Path) -> Option<bool> {
        std::fs::metadata(path).ok().map(|m| m.is_dir())
    }
    fn canonical(&self, path: &Path) -> Option<PathBuf> {
        std::fs::canonicalize(path).ok()
    }
    fn read(&self, path: &Path) -> Option<String> {
        let meta = std::fs::metadata(path).ok()?;
        (meta.is_file() && meta.len() < 1 << 20).then(|| std::fs::read_to_string(path).ok()).flatten()
    }
}

/// The paths of one command: the session's writable dirs and the CLI's install.
#[derive(Clone, Debug, Default)]
pub struct Subject {
    /// The editor's workspace (writable).
    pub workspace: PathBuf,
    /// The workspace's other roots (writable, protected like it).
    pub roots: Vec<PathBuf>,
    /// The session's state dir (writable).
    pub state_dir: PathBuf,
    /// Directories of the CLI's installation, shown read-only wherever they live (`/tmp`, the data dir).
    pub tools: Vec<PathBuf>,
    /// Directories of the state dir that are the bridge's alone (the review copy and its manifest): hidden.
    pub private: Vec<PathBuf>,
}

impl Policy {
    /// The built-in secrets and `--deny-read` paths, absolute.
    pub fn hidden_paths(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = SECRETS.iter().map(|rel| self.home.join(rel)).collect();
        paths.extend(self.deny_read.iter().cloned());
        paths
    }

    /// The protected paths of a workspace, absolute: the built-in ones, the git dir's hooks and config when `.git`
    /// is a file pointing elsewhere inside the workspace, a `core.hooksPath` inside the workspace, and `--protect`.
    pub fn protected_paths(&self, workspace: &Path, disk: &dyn Disk) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = PROTECTED.iter().map(|rel| workspace.join(rel)).collect();
        let dot_git = workspace.join(".git");
        let mut git_dir = dot_git.clone();
        if disk.kind(&dot_git) == Some(false)
            && let Some(target) = disk.read(&dot_git).as_deref().and_then(|text| text.trim().strip_prefix("gitdir:"))
        {
            let target = PathBuf::from(target.trim());
            let target = if target.is_absolute() { target } else { workspace.join(target) };
            git_dir = disk.canonical(&target).unwrap_or(target);
            if git_dir.starts_with(workspace) {
                paths.extend(["hooks", "config"].map(|name| git_dir.join(name)));
            }
            paths.retain(|path| !path.starts_with(&dot_git) || path == &dot_git);
            paths.push(dot_git.clone());
        }
        if let Some(hooks) = disk.read(&git_dir.join("config")).as_deref().and_then(hooks_path) {
            let hooks = if hooks.is_absolute() { hooks } else { workspace.join(hooks) };
            if lexically_inside(&hooks, workspace) {
                paths.push(hooks);
            }
        }
        for extra in &self.protect {
            let path = if extra.is_absolute() { extra.clone() } else { workspace.join(extra) };
            if lexically_inside(&path, workspace) {
                paths.push(path);
            }
        }
        paths.sort();
        paths.dedup();
        paths
    }

    /// The protected paths of a workspace that do not exist (a link counts as existing only when it leads
    /// somewhere, as bubblewrap would see it): what `protect.rs` watches while a sandbox runs.
    pub fn missing_protected(&self, workspace: &Path, disk: &dyn Disk) -> Vec<PathBuf> {
        self.protected_paths(workspace, disk).into_iter().filter(|path| disk.kind(path).is_none()).collect()
    }

    /// The mounts of one command's sandbox.
    pub fn plan(&self, subject: &Subject, disk: &dyn Disk) -> Plan {
        let mut plan = Plan::default();
        let mounts = &mut plan.mounts;
        mounts.push(Mount::Scratch("/tmp".into()));
        // Sockets of system and session services (docker, the session bus, ssh and gpg agents) live here.
        mounts.push(Mount::Scratch("/run".into()));
        if disk.canonical(Path::new("/var/run")).is_some_and(|real| real != Path::new("/run")) {
            mounts.push(Mount::Scratch("/var/run".into()));
        }
        if let Some(runtime) = &self.runtime_dir
            && !runtime.starts_with("/run")
            && disk.kind(runtime) == Some(true)
        {
            mounts.push(Mount::EmptyDir(runtime.clone()));
        }
        let mut shown: Vec<PathBuf> = Vec::new();
        if self.profile == Profile::Strict && disk.kind(&self.home) == Some(true) {
            mounts.push(Mount::EmptyDir(self.home.clone()));
            for dir in &self.path_dirs {
                if dir.starts_with(&self.home) && dir != &self.home {
                    // `~/.cargo/bin` needs `~/.cargo`; `~/.local/bin` needs nothing more (and `~/.local` holds data).
                    let show = match (dir.file_name(), dir.parent()) {
                        (Some(name), Some(parent))
                            if name == "bin" && parent != self.home && !parent.ends_with(".local") =>
                        {
                            parent.to_path_buf()
                        }
                        _ => dir.clone(),
                    };
                    shown.push(show);
                }
            }
            if shown.iter().any(|dir| dir.ends_with(".cargo")) {
                shown.push(self.home.join(".rustup"));
            }
        }
        shown.extend(self.allow_read.iter().cloned());
        // The CLI's install is shown before anything is hidden, unless it lives in the data dir (the tools cache):
        // a folder that holds the data dir or a secret must never show them again by being mounted on top.
        let (cached_tools, other_tools): (Vec<&PathBuf>, Vec<&PathBuf>) =
            subject.tools.iter().partition(|dir| dir.starts_with(&self.data_dir) && **dir != self.data_dir);
        shown.extend(other_tools.into_iter().cloned());
        shown.sort();
        shown.dedup();
        for dir in shown {
            if disk.kind(&dir).is_some() {
                mounts.push(Mount::ReadOnly(dir));
            }
        }
        // A secret inside the workspace or a root (a workspace of `~/.config` holds `~/.config/gh`) is hidden again
        // on top of their own mounts, below. Roots are mounted where they really are: an editor's project folder
        // is often a link, and a mount cannot be made through one.
        let named: Vec<&PathBuf> = std::iter::once(&subject.workspace).chain(&subject.roots).collect();
        let real: Vec<PathBuf> =
            named.iter().map(|root| disk.canonical(root).unwrap_or_else(|| (*root).clone())).collect();
        let roots: Vec<&PathBuf> = real.iter().collect();
        let (secrets_in_workspace, secrets): (Vec<PathBuf>, Vec<PathBuf>) =
            self.hidden_paths().into_iter().partition(|path| roots.iter().any(|root| path.starts_with(root)));
        let hide = |mounts: &mut Vec<Mount>, paths: Vec<PathBuf>| {
            for path in paths {
                // A secret behind a symlink is hidden where it really is: bubblewrap follows the link.
                let Some(kind) = disk.kind(&path) else { continue };
                let real = disk.canonical(&path).unwrap_or(path);
                mounts.push(if kind { Mount::EmptyDir(real) } else { Mount::EmptyFile(real) });
            }
        };
        hide(mounts, secrets);
        if disk.kind(&self.data_dir) == Some(true) {
            mounts.push(Mount::EmptyDir(self.data_dir.clone()));
        }
        for dir in cached_tools {
            if disk.kind(dir).is_some() {
                mounts.push(Mount::ReadOnly(dir.clone()));
            }
        }
        mounts.push(Mount::Writable(subject.state_dir.clone()));
        for dir in &subject.private {
            if dir.starts_with(&subject.state_dir) && disk.kind(dir) == Some(true) {
                mounts.push(Mount::EmptyDir(dir.clone()));
            }
        }
        // Every root is mounted before anything is hidden or protected in any of them: a root nested in another
        // (or holding it) mounted later would cover what was protected there.
        mounts.extend(roots.iter().map(|root| Mount::Writable((*root).clone())));
        // The editor's path of a root leads there inside as on the host: through the host's own link where `/` shows
        // it, through a link of the sandbox's where the place of the host's is hidden.
        let hidden: Vec<PathBuf> = mounts
            .iter()
            .filter_map(|mount| match mount {
                Mount::Scratch(path) | Mount::EmptyDir(path) => Some(path.clone()),
                _ => None,
            })
            .collect();
        for (at, to) in named.iter().zip(&real) {
            if *at != to && hidden.iter().any(|dir| at.starts_with(dir)) {
                mounts.push(Mount::Link { at: (*at).clone(), to: to.clone() });
            }
        }
        hide(mounts, secrets_in_workspace);
        let protected: Vec<(&PathBuf, Vec<PathBuf>)> =
            roots.iter().map(|root| (*root, self.protected_paths(root, disk))).collect();
        // A directory between a root and a protected path is pinned (bound onto itself): a mount point cannot be
        // renamed, so `.git` cannot be moved aside, rebuilt with a hostile config and moved back.
        let mut pins: Vec<PathBuf> = protected
            .iter()
            .flat_map(|(root, paths)| {
                paths.iter().flat_map(move |path| {
                    path.ancestors()
                        .skip(1)
                        .take_while(move |dir| dir != root)
                        .filter(move |dir| dir.starts_with(root))
                        .map(Path::to_path_buf)
                })
            })
            .filter(|dir| disk.kind(dir) == Some(true))
            .collect();
        // Outer before inner (a pin below another would be covered by it), and in one order so repeats are adjacent.
        pins.sort_by(|a, b| (a.components().count(), a).cmp(&(b.components().count(), b)));
        pins.dedup();
        mounts.extend(pins.into_iter().map(Mount::Writable));
        // A protected path that does not exist gets no mount (its mount point would be made in the user's
        // workspace): `protect.rs` moves it out of the workspace when something creates it.
        let mut protected: Vec<PathBuf> = protected.into_iter().flat_map(|(_, paths)| paths).collect();
        protected.sort();
        protected.dedup();
        mounts.extend(protected.into_iter().filter(|path| disk.kind(path).is_some()).map(Mount::ReadOnly));
        plan
    }
}

/// `core.hooksPath` of a git config, if set.
fn hooks_path(config: &str) -> Option<PathBuf> {
    let mut in_core = false;
    let mut found = None;
    for line in config.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_core = line.trim_start_matches('[').trim_end_matches(']').trim().eq_ignore_ascii_case("core");
        } else if in_core
            && let Some((key, value)) = line.split_once('=')
            && key.trim().eq_ignore_ascii_case("hookspath")
        {
            found = Some(PathBuf::from(value.trim().trim_matches('"')));
        }
    }
    found
}

/// Whether `path` stays below `root` without following anything (`..` counted).
fn lexically_inside(path: &Path, root: &Path) -> bool {
    let Ok(rel) = path.strip_prefix(root) else { return false };
    let mut depth = 0i32;
    for component in rel.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => {}
        }
    }
    depth > 0
}

/// Why a directory cannot be a session's workspace, if it cannot: the whole filesystem, a system dir, the home
/// itself, or the bridge's own data (all of which would become writable to the agent).
pub fn workspace_refusal(cwd: &Path, home: &Path, data_dir: &Path) -> Option<String> {
    // The top of the tree: a project may live below `/home`, `/tmp`, `/var/tmp`, `/opt` or `/srv`, but not be one
    // of them (the agent could write every project in it).
    const TOP: &[&str] =
        &["/home", "/tmp", "/var", "/var/tmp", "/opt", "/srv", "/mnt", "/media", "/root", "/snap", "/nix"];
    // Whole subtrees of the system: what every program on the host reads, runs or keeps its state in (`/usr`,
    // `/usr/local/bin` among it: as root an agent writing there plants commands for everyone).
    const SYSTEM: &[&str] = &[
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/proc",
        "/run",
        "/sbin",
        "/sys",
        "/usr",
        "/var/backups",
        "/var/cache",
        "/var/lib",
        "/var/local",
        "/var/lock",
        "/var/log",
        "/var/mail",
        "/var/opt",
        "/var/run",
        "/var/spool",
        "/nix/store",
    ];
    let cwd = std::fs::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf());
    let real = |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let (home, data_dir) = (real(home), real(data_dir));
    if cwd == Path::new("/") {
        return Some("the whole filesystem (/) cannot be a workspace: open a project folder".into());
    }
    if let Some(dir) = SYSTEM.iter().find(|dir| cwd.starts_with(dir)) {
        return Some(format!("{} is a system directory ({dir}); open a project folder instead", cwd.display()));
    }
    if TOP.iter().any(|dir| cwd == Path::new(dir)) {
        return Some(format!("{} is a system directory; open a project folder instead", cwd.display()));
    }
    if cwd == home {
        return Some(format!(
            "{} is your home directory: the agent could write everything in it; open a project folder instead",
            cwd.display()
        ));
    }
    if data_dir.starts_with(&cwd) {
        return Some(format!(
            "{} contains acp-sandbox's data dir ({}), which holds every session; open a project folder instead",
            cwd.display(),
            data_dir.display()
        ));
    }
    if cwd.starts_with(&data_dir) {
        return Some(format!("{} is inside acp-sandbox's data dir; open a project folder instead", cwd.display()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A filesystem of directories (`true`) and files (`false`) with file contents.
    #[derive(Default)]
    struct FakeDisk {
        entries: HashMap<PathBuf, bool>,
        texts: HashMap<PathBuf, String>,
        /// Symbolic links to directories: the link's path, its target's.
        links: HashMap<PathBuf, PathBuf>,
    }

    impl FakeDisk {
        fn with(paths: &[(&str, bool)]) -> Self {
            let mut disk = FakeDisk::default();
            for (path, dir) in paths {
                disk.entries.insert(PathBuf::from(path), *dir);
            }
            disk
        }
    }

    impl Disk for FakeDisk {
        fn kind(&self, path: &Path) -> Option<bool> {
            self.entries.get(self.links.get(path).map_or(path, PathBuf::as_path)).copied()
        }
        fn canonical(&self, path: &Path) -> Option<PathBuf> {
            let real = self.links.get(path).map_or(path, PathBuf::as_path);
            self.entries.contains_key(real).then(|| real.to_path_buf())
        }
        fn read(&self, path: &Path) -> Option<String> {
            self.texts.get(path).cloned()
        }
    }

    fn policy() -> Policy {
        Policy {
            home: "/home/u".into(),
            data_dir: "/home/u/.local/share/acp-sandbox".into(),
            runtime_dir: Some("/run/user/1000".into()),
            path_dirs: vec!["/home/u/.cargo/bin".into(), "/home/u/.local/bin".into(), "/usr/bin".into()],
            ..Policy::default()
        }
    }

    fn subject() -> Subject {
        Subject {
            workspace: "/home/u/ws".into(),
            roots: vec![],
            state_dir: "/home/u/.local/share/acp-sandbox/sessions/s1".into(),
            tools: vec!["/tmp/tools/opencode".into()],
            private: vec![],
        }
    }

    fn base_disk() -> FakeDisk {
        FakeDisk::with(&[
            ("/home/u", true),
            ("/home/u/.ssh", true),
            ("/home/u/.netrc", false),
            ("/home/u/.local/share/acp-sandbox", true),
            ("/home/u/ws", true),
            ("/home/u/ws/.git", true),
            ("/home/u/ws/.git/hooks", true),
            ("/home/u/ws/.git/config", false),
            ("/tmp/tools/opencode", true),
            ("/home/u/.cargo/bin", true),
            ("/home/u/.cargo", true),
            ("/home/u/.local/bin", true),
        ])
    }

    #[test]
    fn secrets_and_the_data_dir_are_hidden_and_the_writable_dirs_come_after_them() {
        let plan = policy().plan(&subject(), &base_disk());
        use Mount::*;
        assert_eq!(
            plan.mounts,
            vec![
                Scratch("/tmp".into()),
                Scratch("/run".into()),
                ReadOnly("/tmp/tools/opencode".into()),
                EmptyDir("/home/u/.ssh".into()),
                EmptyFile("/home/u/.netrc".into()),
                EmptyDir("/home/u/.local/share/acp-sandbox".into()),
                Writable("/home/u/.local/share/acp-sandbox/sessions/s1".into()),
                Writable("/home/u/ws".into()),
                Writable("/home/u/ws/.git".into()),
                ReadOnly("/home/u/ws/.git/config".into()),
                ReadOnly("/home/u/ws/.git/hooks".into()),
            ]
        );
    }

    #[test]
    fn roots_named_through_links_are_mounted_where_they_are_and_linked_where_the_host_link_is_hidden() {
        let mut disk = base_disk();
        disk.entries.insert("/home/u/lib".into(), true);
        disk.links.insert("/home/u/ws-link".into(), "/home/u/ws".into());
        disk.links.insert("/tmp/lib-link".into(), "/home/u/lib".into());
        let subject = Subject { workspace: "/home/u/ws-link".into(), roots: vec!["/tmp/lib-link".into()], ..subject() };
        let mounts = policy().plan(&subject, &disk).mounts;
        use Mount::*;
        assert_eq!(
            mounts[mounts.iter().position(|m| *m == Writable("/home/u/ws".into())).unwrap()..],
            [
                Writable("/home/u/ws".into()),
                Writable("/home/u/lib".into()),
                // `/home/u/ws-link` is seen inside as on the host (`/` is shown); `/tmp`'s links are not.
                Link { at: "/tmp/lib-link".into(), to: "/home/u/lib".into() },
                Writable("/home/u/ws/.git".into()),
                ReadOnly("/home/u/ws/.git/config".into()),
                ReadOnly("/home/u/ws/.git/hooks".into()),
            ]
        );
    }

    #[test]
    fn every_root_is_writable_and_protected_like_the_workspace_whichever_holds_the_other() {
        let mut disk = base_disk();
        for (path, dir) in [
            ("/home/u/lib", true),
            ("/home/u/lib/.git", true),
            ("/home/u/lib/.git/hooks", true),
            ("/home/u/lib/.envrc", false),
            ("/home/u/ws/inner", true),
        ] {
            disk.entries.insert(path.into(), dir);
        }
        // `/home/u/ws/inner` inside the workspace: mounted with the others, before the workspace's protected paths.
        let subject = Subject { roots: vec!["/home/u/lib".into(), "/home/u/ws/inner".into()], ..subject() };
        let mounts = policy().plan(&subject, &disk).mounts;
        use Mount::*;
        assert_eq!(
            mounts[mounts.iter().position(|m| *m == Writable("/home/u/ws".into())).unwrap()..],
            [
                Writable("/home/u/ws".into()),
                Writable("/home/u/lib".into()),
                Writable("/home/u/ws/inner".into()),
                Writable("/home/u/lib/.git".into()),
                Writable("/home/u/ws/.git".into()),
                ReadOnly("/home/u/lib/.envrc".into()),
                ReadOnly("/home/u/lib/.git/hooks".into()),
                ReadOnly("/home/u/ws/.git/config".into()),
                ReadOnly("/home/u/ws/.git/hooks".into()),
            ]
        );
    }

    #[test]
    fn a_missing_protected_path_gets_no_mount_and_is_listed_as_missing() {
        let policy = policy();
        let plan = policy.plan(&subject(), &base_disk());
        let in_workspace: Vec<&Mount> = plan
            .mounts
            .iter()
            .filter(|m| matches!(m, Mount::EmptyDir(p) | Mount::EmptyFile(p) if p.starts_with("/home/u/ws")))
            .collect();
        assert_eq!(in_workspace, Vec::<&Mount>::new(), "nothing may be created in the workspace");
        let missing = policy.missing_protected(Path::new("/home/u/ws"), &base_disk());
        let names: Vec<&str> =
            missing.iter().map(|p| p.strip_prefix("/home/u/ws").unwrap().to_str().unwrap()).collect();
        assert_eq!(names, [".envrc", ".gitmodules", ".husky", ".idea", ".vscode", ".zed"]);
    }

    #[test]
    fn the_bridges_private_dirs_in_the_state_dir_are_hidden_over_it() {
        let mut disk = base_disk();
        disk.entries.insert("/home/u/.local/share/acp-sandbox/sessions/s1/review".into(), true);
        let subject = Subject {
            private: vec!["/home/u/.local/share/acp-sandbox/sessions/s1/review".into(), "/home/u/ws/x".into()],
            ..subject()
        };
        let mounts = policy().plan(&subject, &disk).mounts;
        let state = mounts
            .iter()
            .position(|m| *m == Mount::Writable("/home/u/.local/share/acp-sandbox/sessions/s1".into()))
            .unwrap();
        assert_eq!(mounts[state + 1], Mount::EmptyDir("/home/u/.local/share/acp-sandbox/sessions/s1/review".into()));
        assert_eq!(mounts[state + 2], Mount::Writable("/home/u/ws".into()));
    }

    #[test]
    fn nothing_mounted_later_shows_a_hidden_path_again() {
        let mut disk = base_disk();
        for (path, dir) in [("/home/u/.config", true), ("/home/u/.config/gh", true), ("/home/u/.local/share", true)] {
            disk.entries.insert(path.into(), dir);
        }
        // A fake CLI next to the data dir, and a workspace that holds a secret.
        let subject = Subject {
            workspace: "/home/u/.config".into(),
            roots: vec![],
            state_dir: "/home/u/.local/share/acp-sandbox/sessions/s1".into(),
            tools: vec!["/home/u/.local/share".into(), "/home/u/.local/share/acp-sandbox/tools/x".into()],
            private: vec![],
        };
        disk.entries.insert("/home/u/.local/share/acp-sandbox/tools/x".into(), true);
        let mounts = policy().plan(&subject, &disk).mounts;
        let at =
            |mount: Mount| mounts.iter().position(|m| *m == mount).unwrap_or_else(|| panic!("{mount:?} in {mounts:?}"));
        assert!(
            at(Mount::ReadOnly("/home/u/.local/share".into()))
                < at(Mount::EmptyDir("/home/u/.local/share/acp-sandbox".into()))
        );
        assert!(
            at(Mount::EmptyDir("/home/u/.local/share/acp-sandbox".into()))
                < at(Mount::ReadOnly("/home/u/.local/share/acp-sandbox/tools/x".into()))
        );
        assert!(at(Mount::Writable("/home/u/.config".into())) < at(Mount::EmptyDir("/home/u/.config/gh".into())));
        assert_eq!(mounts.iter().filter(|m| **m == Mount::EmptyDir("/home/u/.config/gh".into())).count(), 1);
    }

    #[test]
    fn strict_hides_the_home_but_shows_toolchains_and_allowed_paths() {
        let mut policy = policy();
        policy.profile = Profile::Strict;
        policy.allow_read = vec!["/home/u/shared".into()];
        let mut disk = base_disk();
        disk.entries.insert("/home/u/shared".into(), true);
        let plan = policy.plan(&subject(), &disk);
        let mounts: Vec<&Mount> = plan.mounts.iter().take(6).collect();
        use Mount::*;
        assert_eq!(
            mounts,
            [
                &Scratch("/tmp".into()),
                &Scratch("/run".into()),
                &EmptyDir("/home/u".into()),
                &ReadOnly("/home/u/.cargo".into()),
                &ReadOnly("/home/u/.local/bin".into()),
                &ReadOnly("/home/u/shared".into()),
            ]
        );
    }

    #[test]
    fn a_missing_git_dir_is_watched_not_mounted_and_a_worktree_git_file_is_followed() {
        let mut disk = base_disk();
        disk.entries.retain(|path, _| !path.starts_with("/home/u/ws/.git"));
        let plan = policy().plan(&subject(), &disk);
        assert!(!plan.mounts.iter().any(|m| format!("{m:?}").contains("/home/u/ws/.git")), "{:?}", plan.mounts);
        let missing = policy().missing_protected(Path::new("/home/u/ws"), &disk);
        assert!(missing.contains(&PathBuf::from("/home/u/ws/.git/hooks")), "{missing:?}");
        assert!(missing.contains(&PathBuf::from("/home/u/ws/.git/config")), "{missing:?}");

        let mut disk = base_disk();
        disk.entries.retain(|path, _| !path.starts_with("/home/u/ws/.git"));
        disk.entries.insert("/home/u/ws/.git".into(), false);
        disk.entries.insert("/home/u/ws/sub/gitdir".into(), true);
        disk.entries.insert("/home/u/ws/sub/gitdir/hooks".into(), true);
        disk.entries.insert("/home/u/ws/sub/gitdir/config".into(), false);
        disk.texts.insert("/home/u/ws/.git".into(), "gitdir: sub/gitdir\n".into());
        disk.texts.insert("/home/u/ws/sub/gitdir/config".into(), "[core]\n\thooksPath = tools/hooks\n".into());
        let protected = policy().protected_paths(Path::new("/home/u/ws"), &disk);
        for path in
            ["/home/u/ws/.git", "/home/u/ws/sub/gitdir/hooks", "/home/u/ws/sub/gitdir/config", "/home/u/ws/tools/hooks"]
        {
            assert!(protected.contains(&PathBuf::from(path)), "{path} in {protected:?}");
        }
        assert!(!protected.contains(&PathBuf::from("/home/u/ws/.git/hooks")));
    }

    #[test]
    fn extra_protected_paths_never_leave_the_workspace() {
        let mut policy = policy();
        policy.protect = vec!["extra.sh".into(), "../outside".into(), "/etc/passwd".into(), "a/../../b".into()];
        let protected = policy.protected_paths(Path::new("/home/u/ws"), &base_disk());
        assert!(protected.contains(&PathBuf::from("/home/u/ws/extra.sh")));
        assert!(protected.iter().all(|p| p.starts_with("/home/u/ws") && !p.to_string_lossy().contains("..")));
    }

    #[test]
    fn dangerous_workspaces_are_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let data = home.join(".local/share/acp-sandbox");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(home.join("project")).unwrap();
        for (cwd, why) in [
            (PathBuf::from("/"), "whole filesystem"),
            ("/etc".into(), "system directory"),
            ("/usr/lib".into(), "system directory"),
            ("/proc".into(), "system directory"),
            ("/usr".into(), "system directory"),
            ("/usr/local".into(), "system directory"),
            ("/usr/local/bin".into(), "system directory"),
            ("/var".into(), "system directory"),
            ("/var/tmp".into(), "system directory"),
            ("/var/mail".into(), "system directory"),
            ("/opt".into(), "system directory"),
            (home.clone(), "home directory"),
            (home.join(".local"), "contains acp-sandbox's data dir"),
            (data.clone(), "contains acp-sandbox's data dir"),
            (data.join("sessions"), "inside acp-sandbox's data dir"),
        ] {
            let refusal = workspace_refusal(&cwd, &home, &data);
            assert!(refusal.as_deref().is_some_and(|r| r.contains(why)), "{}: {refusal:?}", cwd.display());
        }
        assert_eq!(workspace_refusal(&home.join("project"), &home, &data), None);
    }
}
