//! The sandbox without bubblewrap (`--sandbox landlock`, and `auto` where bubblewrap cannot make its namespaces):
//! a Landlock domain, seccomp filters and no capabilities, put on the CLI by `sandbox-init` between fork and exec.
//!
//! Landlock is an allow-list where bubblewrap's policy is a deny-list, so the bridge turns the policy's plan into
//! grants ([`confinement`]): read and execute on `/` minus the hidden paths (where a hidden path lies below a
//! directory, that directory's other children are granted instead, down to the hidden path's parent), everything
//! on the session's state dir (minus the bridge's private dirs there) and the workspace and its roots, reading,
//! writing and ioctl on a few devices (`/dev/null`, the terminal). Nothing of `/tmp`, `/run` or `/dev/shm`: the
//! CLI's `TMPDIR` is a directory of its state. TCP connections go only to the port `sandbox-init` serves the
//! bridge's proxy on and to the model endpoints on the host's loopback; with ABI 6 abstract unix sockets and
//! signals outside the domain are out of reach too. seccomp adds the bubblewrap filter (`seccomp.rs`) and a socket
//! filter: only TCP sockets (and netlink, which reaches only the kernel), so no UDP, raw or `AF_UNIX` socket.
//!
//! The CLI stays in the host's namespaces: it sees the host's processes (and their command lines), listens on the
//! host's ports, and Landlock checks a TCP port whatever the address, so the proxy's port and a loopback model
//! port are reachable on any host. A file cannot be made read-only inside a writable directory: the workspace's
//! protected paths are writable here. `describe` and the README say so.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};
use serde::{Deserialize, Serialize};

use tokio::process::Command;

use super::guard::landlock_abi;
use super::limits::Limits;
use super::policy::{Policy, Subject};
use crate::sandbox::{ExecSpec, SandboxError};
use crate::workspace::statedir::StateDir;

/// The lowest Landlock ABI the sandbox stands on: file rules with truncation (3) and TCP rules (4, Linux 6.7).
pub const MIN_ABI: i32 = 4;

/// The first ABI that scopes abstract unix sockets and signals to the domain (Linux 6.12).
pub const SCOPE_ABI: i32 = 6;

/// A test-only switch: set to `1`, the probe answers as a kernel without Landlock would. Not for users.
pub const TEST_NO_LANDLOCK: &str = "ACP_SANDBOX_TEST_ONLY_NO_LANDLOCK";

/// Why the Landlock sandbox cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// The kernel cannot enforce the whole policy.
    #[error("{0}")]
    Unsupported(String),
    /// Landlock refused a rule or the ruleset.
    #[error("building the Landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    /// The seccomp filter could not be made.
    #[error(transparent)]
    Seccomp(#[from] super::seccomp::SeccompError),
    /// seccompiler refused the socket filter.
    #[error("building the socket filter: {0}")]
    Filter(#[from] seccompiler::BackendError),
    /// The confinement handed over by the bridge is not readable.
    #[error("the confinement is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Whether this kernel can hold the Landlock sandbox: its ABI, or why not in words for `doctor` and the refusal.
pub fn probe() -> Result<i32, String> {
    if std::env::var(TEST_NO_LANDLOCK).as_deref() == Ok("1") {
        return Err(format!("Landlock is switched off for a test ({TEST_NO_LANDLOCK}=1)"));
    }
    match landlock_abi() {
        0 => {
            Err("the kernel has no Landlock (not built in, or not enabled at boot: `lsm=` on its command line)".into())
        }
        abi if abi < MIN_ABI => Err(format!(
            "the kernel's Landlock is ABI {abi}; the sandbox needs ABI {MIN_ABI} (Linux 6.7) for its TCP rules"
        )),
        abi => Ok(abi),
    }
}

/// What the CLI may reach, decided by the bridge and handed to `sandbox-init` (as JSON in `--landlock`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// Read and execute beneath each.
    pub read: Vec<PathBuf>,
    /// Everything beneath each: read, execute, write, create, remove, rename.
    pub write: Vec<PathBuf>,
    /// Device files opened for reading and writing (with ioctl).
    pub devices: Vec<PathBuf>,
    /// The only TCP ports it may connect to; `None` leaves TCP alone (`--network host`).
    pub connect: Option<Vec<u16>>,
    /// A listening TCP socket inherited from the bridge (its fd) that `sandbox-init` splices to the proxy.
    pub proxy_fd: Option<i32>,
}

/// The devices a CLI needs: the bit buckets, randomness and its terminal. Never a disk.
const DEVICES: &[&str] =
    &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/pts"];

/// What a grant needs of the file system: the entries of a directory (real ones: a link is followed to where it
/// leads), so unit tests can give a tree of their own.
pub trait Tree {
    /// The entries of `dir`, as absolute paths; empty when it is not a readable directory.
    fn children(&self, dir: &Path) -> Vec<PathBuf>;
    /// Where `path` leads, links resolved; `None` when it does not exist.
    fn real(&self, path: &Path) -> Option<PathBuf>;
}

/// The real file system.
pub struct RealTree;

impl Tree for RealTree {
    fn children(&self, dir: &Path) -> Vec<PathBuf> {
        let mut children: Vec<PathBuf> =
            std::fs::read_dir(dir).into_iter().flatten().flatten().map(|entry| entry.path()).collect();
        children.sort();
        children
    }
    fn real(&self, path: &Path) -> Option<PathBuf> {
        std::fs::canonicalize(path).ok()
    }
}

/// The grants of one command: `subject` as the policy shows it, `shown` (host paths the CLI is shown read-only,
/// such as its config) and `writable_files` (host files it may write), and the TCP ports it may connect to.
pub fn confinement(
    policy: &Policy,
    subject: &Subject,
    shown: &[PathBuf],
    writable_files: &[PathBuf],
    connect: Option<Vec<u16>>,
    tree: &dyn Tree,
) -> Confinement {
    let roots: Vec<&PathBuf> = std::iter::once(&subject.workspace).chain(&subject.roots).collect();
    let mut hidden: Vec<PathBuf> = policy.hidden_paths();
    hidden.push(policy.data_dir.clone());
    hidden.extend(policy.runtime_dir.iter().cloned());
    // Private to the host (bubblewrap gives the sandbox its own): the CLI gets a tmp dir in its state instead.
    hidden.extend(["/tmp", "/run", "/var/run", "/var/tmp", "/dev"].map(PathBuf::from));
    if policy.profile == super::policy::Profile::Strict {
        hidden.push(policy.home.clone());
    }
    hidden.extend(subject.private.iter().cloned());
    // A hidden path behind a link is hidden where it really is, too.
    let real: Vec<PathBuf> = hidden.iter().filter_map(|path| tree.real(path)).collect();
    hidden.extend(real);
    hidden.sort();
    hidden.dedup();
    let mut read = Vec::new();
    grant(Path::new("/"), &hidden, tree, &mut read);
    let mut strict_shown: Vec<PathBuf> = Vec::new();
    if policy.profile == super::policy::Profile::Strict {
        strict_shown.extend(policy.path_dirs.iter().filter(|dir| dir.starts_with(&policy.home)).cloned());
    }
    for path in strict_shown.iter().chain(&policy.allow_read).chain(&subject.tools).chain(shown) {
        grant(path, &hidden, tree, &mut read);
    }
    let mut write = Vec::new();
    grant(&subject.state_dir, &hidden, tree, &mut write);
    for root in roots {
        grant(root, &hidden, tree, &mut write);
    }
    write.extend(writable_files.iter().filter_map(|file| tree.real(file)));
    for list in [&mut read, &mut write] {
        list.sort();
        list.dedup();
    }
    let devices = DEVICES.iter().map(PathBuf::from).collect();
    Confinement { read, write, devices, connect, proxy_fd: None }
}

/// Adds `top` to `out`, or where a hidden path lies strictly below it, its children but the hidden ones (and
/// theirs, down to each hidden path). `top` itself is granted even below a hidden path: it was asked for (the
/// CLI's install in the data dir, its config among other agents' secrets, the session's state dir).
fn grant(top: &Path, hidden: &[PathBuf], tree: &dyn Tree, out: &mut Vec<PathBuf>) {
    let Some(top) = tree.real(top) else { return };
    let hidden: Vec<&PathBuf> = hidden.iter().filter(|h| !top.starts_with(h)).collect();
    walk(&top, &hidden, tree, out, 0);
}

/// How deep [`walk`] follows directories (and links) before it stops granting: a loop of links ends there.
const MAX_DEPTH: usize = 48;

fn walk(path: &Path, hidden: &[&PathBuf], tree: &dyn Tree, out: &mut Vec<PathBuf>, depth: usize) {
    if !hidden.iter().any(|h| h.starts_with(path)) {
        out.push(path.to_path_buf());
        return;
    }
    if depth >= MAX_DEPTH {
        return;
    }
    for child in tree.children(path) {
        // A link is granted where it leads, unless that is hidden or holds the link.
        let Some(real) = tree.real(&child) else { continue };
        let loops = real != child && child.starts_with(&real);
        if loops || hidden.iter().any(|h| child.starts_with(h) || real.starts_with(h)) {
            continue;
        }
        walk(&real, hidden, tree, out, depth + 1);
    }
}

/// A Landlock ruleset and the seccomp filters, made in `sandbox-init` before the fork, that its child puts on
/// itself before exec ([`Prepared::confine`]).
pub struct Prepared {
    ruleset: OwnedFd,
    filters: Vec<BpfProgram>,
}

impl Prepared {
    /// Builds what enforces `confinement`. Fails where the kernel cannot enforce all of it: a partial ruleset
    /// would be a sandbox in name only.
    pub fn new(confinement: &Confinement) -> Result<Self, LandlockError> {
        let abi = probe().map_err(LandlockError::Unsupported)?;
        let version = ABI::from(abi);
        let all = AccessFs::from_all(version);
        let read = AccessFs::from_read(version);
        let file = AccessFs::from_file(version);
        let device = all & (read | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev);
        let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::HardRequirement).handle_access(all)?;
        if confinement.connect.is_some() {
            ruleset = ruleset.handle_access(AccessNet::ConnectTcp)?;
        }
        if abi >= SCOPE_ABI {
            ruleset = ruleset.scope(Scope::from_all(version))?;
        }
        let mut created = ruleset.create()?;
        let grants = [(&confinement.read, read), (&confinement.write, all), (&confinement.devices, device)];
        for (paths, access) in grants {
            for path in paths {
                // What went missing since the bridge looked is simply not granted.
                let Ok(fd) = PathFd::new(path) else { continue };
                let access = if path.is_dir() { access } else { access & file };
                created = created.add_rule(PathBeneath::new(fd, access))?;
            }
        }
        for &port in confinement.connect.iter().flatten() {
            created = created.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
        }
        let ruleset: Option<OwnedFd> = created.into();
        let ruleset = ruleset.ok_or_else(|| LandlockError::Unsupported("Landlock made no ruleset".into()))?;
        // Under `--network host` (no TCP rule) UDP stays too, so that the CLI's own DNS works; unix sockets never.
        let sockets = match confinement.connect {
            Some(_) => socket_program()?,
            None => super::seccomp::no_unix_sockets_program()?,
        };
        let filters = vec![super::seccomp::sandbox_program()?, sockets];
        Ok(Prepared { ruleset, filters })
    }

    /// Confines the calling process (one thread: call it between fork and exec): no capability left (bounding set
    /// included, for root), `no_new_privs`, the Landlock domain, then the seccomp filters. Async-signal-safe:
    /// system calls on what was prepared before the fork.
    pub fn confine(&self) -> std::io::Result<()> {
        drop_capabilities()?;
        super::guard::restrict_self(self.ruleset.as_raw_fd())?;
        for filter in &self.filters {
            super::seccomp::install(filter)?;
        }
        Ok(())
    }
}

/// Takes over the bridge's listening TCP socket for the proxy (closed on exec: the CLI never holds it).
pub fn proxy_listener(fd: RawFd) -> std::io::Result<tokio::net::TcpListener> {
    // SAFETY: F_SETFD only changes the flags of an fd number; no memory is passed.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the bridge passed this fd for this process alone, and nothing else here uses it.
    let listener = std::net::TcpListener::from(unsafe { OwnedFd::from_raw_fd(fd) });
    listener.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(listener)
}

/// Empties the bounding, ambient, effective, permitted and inheritable capability sets: a CLI started by root
/// then holds none, and exec gives it none back. Without privileges the bounding set cannot be changed (`EPERM`)
/// and holds nothing effective anyway.
fn drop_capabilities() -> std::io::Result<()> {
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
            let error = std::io::Error::last_os_error();
            match error.raw_os_error() {
                // Past the last capability this kernel knows.
                Some(libc::EINVAL) => break,
                // Not root: the bounding set stays, and nothing in it can be gained (no_new_privs follows).
                Some(libc::EPERM) => break,
                _ => return Err(error),
            }
        }
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header { version: 0x2008_0522 /* _LINUX_CAPABILITY_VERSION_3 */, pid: 0 };
    let data =
        [Data { effective: 0, permitted: 0, inheritable: 0 }, Data { effective: 0, permitted: 0, inheritable: 0 }];
    // SAFETY: capset reads one header and two data structs of the layout above, alive for the call.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Socket types that are not a TCP stream (`SOCK_DGRAM`, `SOCK_RAW`, `SOCK_RDM`, `SOCK_SEQPACKET`, `SOCK_DCCP`,
/// `SOCK_PACKET`), compared on the type's low bits (the flags `SOCK_NONBLOCK`, `SOCK_CLOEXEC` are above them).
const NOT_STREAM: &[u64] = &[2, 3, 4, 5, 6, 10];

/// The socket filter: `socket()` of any family but IPv4, IPv6 and netlink fails with `EACCES`, and so does an
/// IPv4 or IPv6 socket that is not a stream. UDP would reach any host (DNS included) past the proxy; `AF_UNIX`
/// would reach host services by path; `socketpair` stays allowed.
pub fn socket_program() -> Result<BpfProgram, LandlockError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| super::seccomp::SeccompError::UnsupportedArch(std::env::consts::ARCH.to_string()))?;
    let family = |op, value: i32| SeccompCondition::new(0, SeccompCmpArgLen::Dword, op, value as u64);
    let mut rules = vec![SeccompRule::new(vec![
        family(SeccompCmpOp::Ne, libc::AF_INET)?,
        family(SeccompCmpOp::Ne, libc::AF_INET6)?,
        family(SeccompCmpOp::Ne, libc::AF_NETLINK)?,
    ])?];
    for inet in [libc::AF_INET, libc::AF_INET6] {
        for &kind in NOT_STREAM {
            rules.push(SeccompRule::new(vec![
                family(SeccompCmpOp::Eq, inet)?,
                SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(0xf), kind)?,
            ])?);
        }
    }
    let filter = SeccompFilter::new(
        std::collections::BTreeMap::from([(libc::SYS_socket, rules)]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        arch,
    )?;
    Ok(BpfProgram::try_from(filter)?)
}

impl super::LocalSandbox {
    /// The command that runs `spec` in the Landlock sandbox: `sandbox-init` with this sandbox's grants, the
    /// proxy's listening socket (inherited) and a `TMPDIR` of the session's state, never the host's `/tmp`.
    pub(super) async fn landlock_command(
        &self,
        state: &StateDir,
        spec: &mut ExecSpec,
        guards: &mut super::ProcessGuards,
        watch: Option<Limits>,
        door: Option<(i32, u16)>,
    ) -> Result<Command, SandboxError> {
        let Some(init) = &self.settings.init_program else {
            return Err(SandboxError::Unavailable(
                "the Landlock sandbox is put on the CLI by the bridge's own binary, whose executable could not be \
                 found"
                    .into(),
            ));
        };
        let tmp = self.state_dir.join("tmp");
        state.ensure_dir(&tmp).map_err(|e| SandboxError::io(format!("create {}", tmp.display()), e))?;
        spec.env.retain(|(name, _)| !matches!(name.as_str(), "TMPDIR" | "TMP" | "TEMP"));
        spec.env.extend(["TMPDIR", "TMP", "TEMP"].map(|name| (name.to_string(), tmp.display().to_string())));
        let (mut proxy_fd, mut proxy_socket) = (None, None);
        let connect = if self.settings.network.uses_proxy() {
            let (proxy, net) = self.start_proxy(spec).await?;
            // A port of the host's loopback, chosen by the kernel: `sandbox-init` serves the proxy there.
            let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
                .map_err(|e| SandboxError::io("listen on 127.0.0.1 for the sandbox's proxy", e))?;
            let port = listener.local_addr().map_err(|e| SandboxError::io("the proxy's port", e))?.port();
            let fd = OwnedFd::from(listener);
            proxy_fd = Some(fd.as_raw_fd());
            guards.inherited.push(fd);
            guards.proxy = Some(proxy);
            spec.env.retain(|(name, _)| !name.to_ascii_lowercase().ends_with("_proxy"));
            spec.env.extend(super::wrap::proxy_env(port));
            proxy_socket = Some(net.socket);
            // The model endpoints on the host's loopback are reached directly (`NO_PROXY`), as without a sandbox.
            Some(std::iter::once(port).chain(net.expose).collect())
        } else {
            None
        };
        let subject = self.subject(spec);
        let shown: Vec<PathBuf> = spec.read_only.iter().map(|(host, _)| host.clone()).collect();
        let writable: Vec<PathBuf> = spec.writable.iter().map(|(host, _)| host.clone()).collect();
        let mut grants = confinement(&self.settings.policy, &subject, &shown, &writable, connect, &RealTree);
        grants.proxy_fd = proxy_fd;
        let json = serde_json::to_string(&grants)
            .map_err(|e| SandboxError::Unavailable(format!("cannot write the sandbox's grants: {e}")))?;
        let mut command = Command::new(init);
        command
            .args(["sandbox-init", "--reap"])
            .args(super::watch_args(watch))
            .args(super::door_args(door))
            .args(super::linger_args(spec));
        if let Some(socket) = proxy_socket {
            command.arg("--proxy-socket").arg(socket);
        }
        command.arg("--landlock").arg(json).arg("--").arg(&spec.program).args(&spec.args);
        command.current_dir(&spec.cwd);
        Ok(command)
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, clippy::print_stderr)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A tree of directories: each path maps to its children's names; links map to their target.
    #[derive(Default)]
    struct FakeTree {
        dirs: BTreeMap<PathBuf, Vec<&'static str>>,
        links: BTreeMap<PathBuf, PathBuf>,
    }

    impl Tree for FakeTree {
        fn children(&self, dir: &Path) -> Vec<PathBuf> {
            self.dirs.get(dir).into_iter().flatten().map(|name| dir.join(name)).collect()
        }
        fn real(&self, path: &Path) -> Option<PathBuf> {
            Some(self.links.get(path).cloned().unwrap_or_else(|| path.to_path_buf()))
        }
    }

    fn tree() -> FakeTree {
        let mut tree = FakeTree::default();
        for (dir, children) in [
            ("/", vec!["usr", "etc", "home", "tmp", "run", "dev", "proc"]),
            ("/home", vec!["u"]),
            ("/home/u", vec![".ssh", ".config", ".local", "proj", ".bashrc", "link-to-ssh"]),
            ("/home/u/.config", vec!["gh", "nvim", "opencode"]),
            ("/home/u/.local", vec!["share", "bin"]),
            ("/home/u/.local/share", vec!["acp-sandbox", "opencode", "fonts"]),
            ("/home/u/.local/share/acp-sandbox", vec!["sessions", "tools", "store.db"]),
            ("/home/u/.local/share/acp-sandbox/sessions", vec!["s1", "s2"]),
            ("/home/u/.local/share/acp-sandbox/sessions/s1", vec!["home", "review", "quarantine"]),
        ] {
            tree.dirs.insert(dir.into(), children);
        }
        tree.links.insert("/home/u/link-to-ssh".into(), "/home/u/.ssh".into());
        tree
    }

    fn policy() -> Policy {
        Policy { home: "/home/u".into(), data_dir: "/home/u/.local/share/acp-sandbox".into(), ..Policy::default() }
    }

    fn subject() -> Subject {
        let state = PathBuf::from("/home/u/.local/share/acp-sandbox/sessions/s1");
        Subject {
            workspace: "/home/u/proj".into(),
            roots: Vec::new(),
            state_dir: state.clone(),
            tools: vec!["/home/u/.local/share/acp-sandbox/tools".into()],
            private: vec![state.join("review"), state.join("quarantine")],
        }
    }

    fn paths(list: &[PathBuf]) -> Vec<String> {
        list.iter().map(|path| path.display().to_string()).collect()
    }

    #[test]
    fn reads_are_granted_around_the_hidden_paths_and_writes_on_the_workspace_and_state() {
        let shown = vec![PathBuf::from("/home/u/.local/share/opencode/auth.json")];
        let c = confinement(&policy(), &subject(), &shown, &[], Some(vec![3128]), &tree());
        assert_eq!(
            paths(&c.read),
            [
                "/etc",
                "/home/u/.bashrc",
                "/home/u/.config/nvim",
                "/home/u/.config/opencode",
                "/home/u/.local/bin",
                "/home/u/.local/share/acp-sandbox/tools",
                "/home/u/.local/share/fonts",
                "/home/u/.local/share/opencode/auth.json",
                "/home/u/proj",
                "/proc",
                "/usr",
            ]
        );
        assert_eq!(
            paths(&c.write),
            ["/home/u/.local/share/acp-sandbox/sessions/s1/home", "/home/u/proj"],
            "the review copy and the quarantine stay the bridge's"
        );
        assert_eq!(c.connect, Some(vec![3128]));
        assert!(c.devices.contains(&"/dev/null".into()) && !c.devices.iter().any(|d| d.ends_with("shm")));
    }

    #[test]
    fn an_allowed_read_of_a_parent_of_secrets_does_not_show_them() {
        let mut policy = policy();
        policy.allow_read = vec!["/home/u".into()];
        let c = confinement(&policy, &subject(), &[], &[], None, &tree());
        assert!(!c.read.iter().any(|path| path.starts_with("/home/u/.ssh") || path == Path::new("/home/u")));
        assert!(!c.read.iter().any(|path| path.starts_with("/home/u/.config/gh")));
    }

    #[test]
    fn the_strict_profile_grants_nothing_of_the_home_but_what_it_shows() {
        let mut policy = policy();
        policy.profile = super::super::policy::Profile::Strict;
        policy.path_dirs = vec!["/home/u/.local/bin".into(), "/usr/bin".into()];
        let c = confinement(&policy, &subject(), &[], &[], None, &tree());
        let home: Vec<String> = paths(&c.read).into_iter().filter(|path| path.starts_with("/home")).collect();
        assert_eq!(home, ["/home/u/.local/bin", "/home/u/.local/share/acp-sandbox/tools"]);
        assert_eq!(paths(&c.write), ["/home/u/.local/share/acp-sandbox/sessions/s1/home", "/home/u/proj"]);
    }

    /// Runs `script` (python) in a child under `confinement`; returns its stdout.
    fn run_confined(confinement: &Confinement, script: &str, args: &[&str]) -> String {
        use std::os::unix::process::CommandExt;
        let prepared = Prepared::new(confinement).unwrap();
        let mut command = std::process::Command::new("/usr/bin/python3");
        command.arg("-c").arg(script).args(args);
        // SAFETY: system calls on what `prepared` holds, which the parent keeps until the child has run.
        unsafe {
            command.pre_exec(move || prepared.confine());
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    }

    #[test]
    fn the_confined_child_reads_writes_and_connects_only_where_granted() {
        if let Err(why) = probe() {
            eprintln!("skipped: {why}");
            return;
        }
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let (shown, secret, work) = (dir.path().join("shown"), dir.path().join("secret"), dir.path().join("work"));
        for d in [&shown, &secret, &work] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(shown.join("f"), "shown").unwrap();
        std::fs::write(secret.join("f"), "secret").unwrap();
        let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (open_port, closed_port) = (open.local_addr().unwrap().port(), closed.local_addr().unwrap().port());
        let confinement = Confinement {
            read: vec!["/usr".into(), "/etc".into(), "/proc".into(), shown.clone()],
            write: vec![work.clone()],
            devices: vec!["/dev/null".into()],
            connect: Some(vec![open_port]),
            proxy_fd: None,
        };
        let script = r#"
import os, socket, sys
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return str(e.errno)
shown, secret, work, open_port, closed_port = sys.argv[1:]
print(attempt(lambda: open(shown + "/f").read()))
print(attempt(lambda: open(secret + "/f").read()))
print(attempt(lambda: open(work + "/new", "w").write("x")))
print(attempt(lambda: open(shown + "/new", "w").write("x")))
print(attempt(lambda: socket.create_connection(("127.0.0.1", int(open_port))).close()))
print(attempt(lambda: socket.create_connection(("127.0.0.1", int(closed_port))).close()))
print(attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)))
print(attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)))
print(open("/proc/self/status").read().split("CapEff:")[1].split()[0])
"#;
        let args = [&shown, &secret, &work].map(|p| p.display().to_string());
        let out = run_confined(
            &confinement,
            script,
            &[&args[0], &args[1], &args[2], &open_port.to_string(), &closed_port.to_string()],
        );
        let (eacces, ok) = (libc::EACCES.to_string(), "ok".to_string());
        let expected = [&ok, &eacces, &ok, &eacces, &ok, &eacces, &eacces, &eacces].map(|s| s.as_str()).join("\n")
            + "\n0000000000000000\n";
        assert_eq!(out, expected);
        assert!(work.join("new").exists() && !shown.join("new").exists());
    }
}
