//! bubblewrap: the probe of what it can do here, the argv around one command (a pure function of the policy's
//! plan and of what the command was given: the one place to review what a sandbox is made of), and the low ports
//! of its network namespace.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use super::init::PROXY_SOCKET;
use super::limits::Limits;
use super::policy::{Mount, Plan};
use super::{door_args, linger_args, watch_args};
use crate::sandbox::ExecSpec;

/// What every sandbox needs from bubblewrap: its own mount and PID namespaces, no capabilities.
const PROBE_ARGS: &[&str] = &[
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--unshare-pid",
    "--cap-drop",
    "ALL",
    "--die-with-parent",
];

/// What bubblewrap can do here beyond [`PROBE_ARGS`].
#[derive(Clone, Debug)]
struct Features {
    path: PathBuf,
    /// Its own user namespace, and none nested in it.
    userns: bool,
    /// Its own network namespace (where not, the sandbox shares the host's network; `doctor` says why).
    netns: Result<(), String>,
}

/// Checks once whether bubblewrap can create its namespaces here; the answer is cached.
pub fn probe_bwrap() -> Result<PathBuf, String> {
    probe().as_ref().map(|features| features.path.clone()).map_err(Clone::clone)
}

/// Whether bubblewrap can also give the sandbox its own user namespace (and forbid nested ones) here.
pub fn bwrap_userns() -> bool {
    probe().as_ref().is_ok_and(|features| features.userns)
}

/// Whether bubblewrap can give the sandbox its own network namespace here, or why not.
pub fn bwrap_netns() -> Result<(), String> {
    probe().as_ref().map_err(Clone::clone).and_then(|features| features.netns.clone())
}

fn probe() -> &'static Result<Features, String> {
    static PROBE: OnceLock<Result<Features, String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        let path = which::which("bwrap").map_err(|_| "bubblewrap (bwrap) is not installed".to_string())?;
        let run = |extra: &[&str]| {
            let output = std::process::Command::new(&path)
                .args(extra)
                .args(PROBE_ARGS)
                .args(["--", "true"])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
            if output.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&output.stderr).trim().to_string())
            }
        };
        if let Err(why) = run(&[]) {
            return Err(format!("bubblewrap cannot create its namespaces here: {why}"));
        }
        let userns = run(&["--unshare-user", "--disable-userns"]).is_ok();
        let netns = run(&["--unshare-net"]).map_err(|why| format!("no network namespace here: {why}"));
        Ok(Features { path, userns, netns })
    })
}

/// Where the bridge's own binary appears inside the sandbox (a private tmpfs, so nothing of the host is there).
const INSIDE_INIT: &str = "/run/acp-sandbox/acp-sandbox";

/// The network side of one command under bubblewrap.
pub(super) struct NetSetup {
    /// The socket the sandbox reaches the proxy by, on the host.
    pub socket: PathBuf,
    /// The port the proxy listens on inside.
    pub port: u16,
    /// Host loopback endpoints shown on the same port inside.
    pub expose: Vec<u16>,
    /// The socket's directory is mounted rather than the socket (a kept-warm server's: the bridge that adopts it
    /// serves a new socket there).
    pub in_dir: bool,
}

/// Where a kept-warm server's sandbox sees the directory of its proxy's socket.
const INSIDE_NET_DIR: &str = "/run/acp-sandbox/net";

/// What one command's bubblewrap argv is made of, all decided before: the argv is a pure function of it.
pub(super) struct Wrap<'a> {
    pub spec: &'a ExecSpec,
    pub plan: &'a Plan,
    /// The review copy standing in for the workspace: (the user's workspace, the copy).
    pub copy: Option<(&'a Path, PathBuf)>,
    /// The bridge's own binary, run inside as the sandbox's first process.
    pub init_program: Option<&'a Path>,
    /// Whether bubblewrap can give the sandbox its own user namespace here.
    pub userns: bool,
    /// The proxy's side of the sandbox's own network, when it has one.
    pub net: Option<&'a NetSetup>,
    /// The seccomp filter's fd, inherited by bubblewrap.
    pub seccomp_fd: Option<i32>,
    /// Limits `sandbox-init` watches itself, where no cgroup enforces them.
    pub watch: Option<Limits>,
    /// A server's door: the inherited listening fd and the server's port inside.
    pub door: Option<(i32, u16)>,
}

/// The argv of bubblewrap around `wrap.spec`'s command.
pub(super) fn argv(wrap: &Wrap) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| args.extend(items.iter().map(|s| s.to_string()));
    // A kept-warm server outlives the bridge: its end is its own linger (`sandbox-init --keep-warm-secs`).
    if wrap.spec.keep_warm.is_none() {
        push(&["--die-with-parent"]);
    }
    push(&["--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]);
    if wrap.net.is_some() {
        push(&["--unshare-net"]);
    }
    if wrap.userns {
        push(&["--unshare-user", "--disable-userns"]);
    }
    push(&["--cap-drop", "ALL"]);
    push(&["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]);
    let mut read_only_later = Vec::new();
    for mount in &wrap.plan.mounts {
        match mount {
            Mount::Scratch(path) => push(&["--tmpfs", &path.display().to_string()]),
            Mount::EmptyDir(path) => {
                let path = path.display().to_string();
                push(&["--tmpfs", &path]);
                // Made read-only last: mounts below it need their mount points created first.
                read_only_later.push(path);
            }
            Mount::EmptyFile(path) => push(&["--ro-bind", "/dev/null", &path.display().to_string()]),
            Mount::ReadOnly(path) | Mount::Writable(path) => {
                let writable = matches!(mount, Mount::Writable(_));
                let (source, in_copy) = source_of(wrap.copy.as_ref(), path);
                // The plan is made from the user's files; the copy may lack a path they have now (made since the
                // last sync), which the agent's copy then simply does not have yet.
                let verb = match (writable, in_copy) {
                    (true, false) => "--bind",
                    (true, true) => "--bind-try",
                    (false, false) => "--ro-bind",
                    (false, true) => "--ro-bind-try",
                };
                push(&[verb, &source.display().to_string(), &path.display().to_string()]);
            }
            Mount::Link { at, to } => push(&["--symlink", &to.display().to_string(), &at.display().to_string()]),
        }
    }
    for (host, target) in &wrap.spec.read_only {
        push(&["--ro-bind-try", &host.display().to_string(), &target.display().to_string()]);
    }
    for (host, target) in &wrap.spec.writable {
        push(&["--bind", &host.display().to_string(), &target.display().to_string()]);
    }
    let init = wrap.init_program.map(|program| program.display().to_string());
    if let Some(init) = &init {
        push(&["--ro-bind", init, INSIDE_INIT]);
    }
    let inside_socket = match wrap.net {
        Some(net) if net.in_dir => {
            let dir = net.socket.parent().unwrap_or(Path::new("/nonexistent")).display().to_string();
            push(&["--ro-bind", &dir, INSIDE_NET_DIR]);
            let name = net.socket.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            format!("{INSIDE_NET_DIR}/{name}")
        }
        Some(net) => {
            push(&["--ro-bind", &net.socket.display().to_string(), PROXY_SOCKET]);
            PROXY_SOCKET.to_string()
        }
        None => PROXY_SOCKET.to_string(),
    };
    for path in read_only_later.iter().rev() {
        push(&["--remount-ro", path]);
    }
    if let Some(fd) = wrap.seccomp_fd {
        push(&["--seccomp", &fd.to_string()]);
    }
    push(&["--chdir", &wrap.spec.cwd.display().to_string(), "--"]);
    if init.is_some() {
        args.push(INSIDE_INIT.into());
        args.push("sandbox-init".into());
        if let Some(net) = wrap.net {
            args.extend(["--proxy-socket".into(), inside_socket]);
            args.extend(["--proxy-port".into(), net.port.to_string()]);
            for port in &net.expose {
                args.extend(["--expose".into(), port.to_string()]);
            }
        }
        args.extend(watch_args(wrap.watch));
        args.extend(door_args(wrap.door));
        args.extend(linger_args(wrap.spec));
        if wrap.spec.interactive {
            // A long-lived agent's sandbox lives across turns: what a stopped turn's tools left running (a `setsid`
            // daemon) is adopted by sandbox-init, to be ended on SIGUSR1, not by bubblewrap, which cannot tell.
            args.push("--reap".into());
        }
        if wrap.door.is_some() {
            // Under bubblewrap a server's tools must never reach it (`guard.rs`); `exec` checked the kernel.
            args.push("--guard-door".into());
        }
        // Reads are a deny-list and connect() on a socket needs only its path: no AF_UNIX socket at all.
        args.push("--no-unix-sockets".into());
        args.push("--".into());
    }
    args.push(wrap.spec.program.display().to_string());
    args.extend(wrap.spec.args.iter().cloned());
    args
}

/// Where a mount of the plan comes from on the host: in review mode what is in the workspace comes from the
/// agent's copy (so the copy is what the agent sees and writes there, protected paths included).
/// Whether it comes from below the copy's root (a path the copy may not have yet) is the second.
fn source_of(copy: Option<&(&Path, PathBuf)>, path: &Path) -> (PathBuf, bool) {
    match copy.map(|(workspace, copy)| (path.strip_prefix(workspace), copy)) {
        Some((Ok(rel), copy)) if rel.as_os_str().is_empty() => (copy.clone(), false),
        Some((Ok(rel), copy)) => (copy.join(rel), true),
        _ => (path.to_path_buf(), false),
    }
}

/// Lets anything in the network namespace of bubblewrap's sandbox `bwrap` bind any port
/// (`net.ipv4.ip_unprivileged_port_start=0` there): a model endpoint on the host's :80 is served on the same port
/// inside. The namespace is the sandbox's alone (only its loopback), so no port of the host is concerned. The sandbox
/// cannot do it itself (`/proc/sys` is read-only there, and it holds no capability); the bridge can: as the owner of
/// the user namespace bubblewrap made (or as root), it joins it and the network namespace in a short-lived child
/// and writes the file there.
pub(super) fn open_low_ports(bwrap: u32) -> Result<(), String> {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    // bubblewrap's child is the sandbox's first process; it exists (in the new namespaces) once it is listed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let netns = loop {
        let children = std::fs::read_to_string(format!("/proc/{bwrap}/task/{bwrap}/children")).unwrap_or_default();
        if let Some(child) = children.split_whitespace().next() {
            let path = format!("/proc/{child}/ns/net");
            let own = std::fs::metadata("/proc/self/ns/net").map(|m| m.ino()).ok();
            if std::fs::metadata(&path).map(|m| m.ino()).ok() != own {
                break std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
            }
        }
        if std::time::Instant::now() >= deadline {
            return Err("the sandbox's network namespace did not appear within 10 s".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    // SAFETY: NS_GET_USERNS takes no argument and returns a new fd (or -1).
    let userns = unsafe { libc::ioctl(netns.as_raw_fd(), libc::NS_GET_USERNS) };
    if userns < 0 {
        return Err(format!("the owner of the sandbox's network namespace: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd of ours.
    let userns = unsafe { std::fs::File::from_raw_fd(userns) };
    let own_userns = std::fs::metadata("/proc/self/ns/user").map(|m| m.ino()).ok();
    let join_userns = userns.metadata().map(|m| m.ino()).ok() != own_userns;
    let (net_fd, user_fd) = (netns.as_raw_fd(), userns.as_raw_fd());
    let path = c"/proc/sys/net/ipv4/ip_unprivileged_port_start";
    let mut helper = std::process::Command::new("/bin/true");
    helper.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: the closure runs in the forked (single-threaded) child and makes only system calls on fds and a
    // string prepared before the fork. Joining a user namespace needs a single-threaded process: hence the child.
    unsafe {
        helper.pre_exec(move || {
            if join_userns && libc::setns(user_fd, libc::CLONE_NEWUSER) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setns(net_fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0\n".as_ptr().cast(), 2);
            libc::close(fd);
            if written != 2 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = helper.status().map_err(|e| format!("setting ip_unprivileged_port_start in the sandbox: {e}"))?;
    drop((netns, userns));
    status.success().then_some(()).ok_or_else(|| format!("the helper that opened the low ports exited with {status}"))
}
