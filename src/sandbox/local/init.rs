//! The sandbox's entry process (`acp-sandbox sandbox-init`): opens the sandbox's network doors, then runs the CLI.
//!
//! In its own network namespace the sandbox has only loopback. Before the CLI starts, this process listens on
//! 127.0.0.1 at the port the CLI's `HTTP_PROXY` names (each connection is spliced to the host's proxy through the
//! mounted unix socket) and at each exposed port (each connection becomes a `CONNECT 127.0.0.1:PORT` through that
//! socket, so a model server on the host's loopback answers at the same address inside). It then runs the CLI
//! with the stdio and environment it was given, forwards SIGTERM, SIGINT and SIGHUP to it and exits as it did.
//! Nothing goes to stdout, which belongs to the CLI; this process's own complaints go to stderr, whose tail the
//! bridge shows when a turn fails.

use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

use crate::sandbox::net::proxy::{read_head, status_code};

/// Where the bridge mounts its proxy's socket inside the sandbox.
pub const PROXY_SOCKET: &str = "/run/acp-sandbox/proxy.sock";

/// The exit code when this process itself fails (a port cannot be bound), as `env` and `timeout` use it.
pub const INIT_FAILED: i32 = 125;

/// What `sandbox-init` is asked to do.
#[derive(Clone, Debug, Default)]
pub struct InitArgs {
    /// The host proxy's unix socket, as seen inside the sandbox (normally [`PROXY_SOCKET`]).
    pub proxy_socket: PathBuf,
    /// Listen on 127.0.0.1 at this port and splice each connection to the proxy (the CLI's `HTTP_PROXY`).
    pub proxy_port: Option<u16>,
    /// Listen on 127.0.0.1 at each of these ports and tunnel each connection to the same port on the host's
    /// loopback, through the proxy (which must allow it as an endpoint).
    pub expose: Vec<u16>,
    /// A listening unix socket inherited from the bridge (its fd) and a port inside the sandbox: each connection
    /// the bridge makes to the socket is spliced to 127.0.0.1 at that port (a server the CLI runs, such as `opencode
    /// serve`). The socket lives in the bridge's own directory, so nothing in the sandbox can replace it.
    pub door: Option<(i32, u16)>,
    /// The program and everything it starts may not connect to the door's port (`guard::PortGuard`): only this
    /// process, outside the Landlock domain, reaches the server. Without Landlock's TCP rules nothing runs.
    pub guard_door: bool,
    /// The program and everything it starts may not make `AF_UNIX` sockets (`seccomp::no_unix_sockets_program`):
    /// no host socket is reachable by its path. This process keeps them, for the proxy.
    pub no_unix_sockets: bool,
    /// Become the subreaper of the CLI's tree and end all of it when the CLI exits or a stop signal arrives:
    /// without a PID namespace, daemons it started (`setsid`, double fork) would otherwise outlive the turn.
    pub reap: bool,
    /// A server kept warm past its bridge (`--keep-warm`): its output is relayed (a write to a pipe whose reader,
    /// the bridge, is gone would fail the server), and everything ends once no connection came through the door
    /// for this long. Its bridge keeps the event stream open all the time, so this counts from when the last
    /// bridge let go of it.
    pub keep_warm: Option<Duration>,
    /// Where no cgroup limits the sandbox: at most this many processes in it, watched from here.
    pub max_processes: Option<u64>,
    /// The Landlock sandbox (`landlock::Confinement`, as JSON): put on the program before exec, with its proxy
    /// listener served from here. This process stays outside it.
    pub landlock: Option<String>,
    /// Where no cgroup limits the sandbox: at most this much resident memory in it, watched from here.
    pub max_memory: Option<u64>,
    /// The CLI.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

/// Opens the listeners, runs the program and returns its exit code (128 + the signal when a signal killed it).
/// Returns [`INIT_FAILED`] when a listener cannot be bound, 127 when the program is missing and 126 when it cannot
/// be started; each failure is explained on stderr first.
pub fn run(args: InitArgs) -> i32 {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(supervise(args)),
        Err(e) => {
            complain(&format!("cannot start: {e}"));
            INIT_FAILED
        }
    }
}

/// What a listener does with a connection.
#[derive(Clone, Copy)]
enum Door {
    /// Splices it to the proxy as it is: the CLI speaks HTTP proxy itself.
    Proxy,
    /// Asks the proxy for a tunnel to this port on the host's loopback first.
    Expose(u16),
}

async fn supervise(args: InitArgs) -> i32 {
    // This process holds the door's listening socket and outlives every tool: none may read its memory or take
    // its fds (`pidfd_getfd`), whatever the kernel's Landlock can do.
    if let Err(e) = super::guard::set_undumpable() {
        complain(&format!("cannot make this process non-dumpable: {e}"));
        return INIT_FAILED;
    }
    let socket = Arc::new(args.proxy_socket);
    let doors = args.proxy_port.map(|port| (port, Door::Proxy)).into_iter();
    let doors = doors.chain(args.expose.iter().map(|&port| (port, Door::Expose(port))));
    for (port, door) in doors {
        // Bound before the CLI starts, so its first request never finds the door closed.
        if let Err(why) = low_port_allowed(port).await {
            complain(&format!("cannot listen on 127.0.0.1:{port}: {why}"));
            return INIT_FAILED;
        }
        let listener = match TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
            Ok(listener) => listener,
            Err(e) => {
                complain(&format!("cannot listen on 127.0.0.1:{port}: {e}"));
                return INIT_FAILED;
            }
        };
        tokio::spawn(serve(listener, socket.clone(), door));
    }
    let door_use = Arc::new(std::sync::Mutex::new(DoorUse { open: 0, since: std::time::Instant::now() }));
    if let Some((fd, port)) = args.door {
        match inbound_listener(fd) {
            Ok(listener) => {
                tokio::spawn(serve_inbound(listener, port, door_use.clone()));
            }
            Err(e) => {
                complain(&format!("cannot use the bridge's door (fd {fd}): {e}"));
                return INIT_FAILED;
            }
        }
    }
    let signals = [SignalKind::terminate(), SignalKind::interrupt(), SignalKind::hangup(), SignalKind::user_defined1()]
        .map(signal);
    let [Ok(mut terminate), Ok(mut interrupt), Ok(mut hangup), Ok(mut strays)] = signals else {
        complain("cannot receive signals");
        return INIT_FAILED;
    };
    // A server's sandbox lives across turns: what a turn leaves running is adopted here, to be ended on SIGUSR1.
    if (args.reap || args.door.is_some())
        && let Err(e) = nix::sys::prctl::set_child_subreaper(true)
    {
        complain(&format!("cannot become a subreaper: {e}"));
    }
    let guard = match args.door {
        Some((_, port)) if args.guard_door => match super::guard::PortGuard::new(port) {
            Ok(guard) => Some(guard),
            Err(e) => {
                complain(&format!("cannot keep the server's tools off its port 127.0.0.1:{port}: {e}"));
                return INIT_FAILED;
            }
        },
        _ => None,
    };
    let unix_filter = match args.no_unix_sockets.then(super::seccomp::no_unix_sockets_program).transpose() {
        Ok(filter) => filter,
        Err(e) => {
            complain(&format!("cannot keep the CLI off unix sockets: {e}"));
            return INIT_FAILED;
        }
    };
    let confined = match args.landlock.as_deref().map(confined).transpose() {
        Ok(confined) => confined,
        Err(e) => {
            complain(&format!("cannot make the Landlock sandbox: {e}"));
            return INIT_FAILED;
        }
    };
    let mut command = Command::new(&args.program);
    command.args(&args.args);
    if let Some((prepared, listener)) = confined {
        // Served before the spawn: the CLI's first request never finds the door closed.
        if let Some(listener) = listener {
            tokio::spawn(serve(listener, socket.clone(), Door::Proxy));
        }
        // SAFETY: the closure makes system calls on what `prepared` built before the fork and moved into it.
        unsafe {
            command.pre_exec(move || prepared.confine());
        }
    }
    if args.keep_warm.is_some() {
        command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    }
    if let Some(filter) = unix_filter {
        // SAFETY: the closure makes one prctl on a program built before the fork and moved into it.
        unsafe {
            command.pre_exec(move || super::seccomp::install(&filter));
        }
    }
    if let Some(guard) = &guard {
        let ruleset = guard.fd();
        // SAFETY: the closure makes two system calls on an fd that `guard` keeps open until after the spawn.
        unsafe {
            command.pre_exec(move || super::guard::restrict_self(ruleset));
        }
    }
    let spawned = command.spawn();
    // The ruleset is in the child's domain now; the fd (close-on-exec, never the child's) is not needed.
    drop(guard);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            complain(&format!("cannot run {}: {e}", args.program.display()));
            return if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
        }
    };
    if let Some(out) = child.stdout.take() {
        tokio::spawn(relay(out, tokio::io::stdout()));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(relay(err, tokio::io::stderr()));
    }
    let mut watch = tokio::time::interval(WATCH_EVERY);
    let mut reap = tokio::time::interval(REAP_EVERY);
    let mut linger = tokio::time::interval(LINGER_CHECK_EVERY);
    let program = child.id();
    loop {
        let forward = tokio::select! {
            _ = linger.tick(), if args.keep_warm.is_some() => {
                let unused = {
                    let door_use = door_use.lock().unwrap_or_else(|p| p.into_inner());
                    (door_use.open == 0).then(|| door_use.since.elapsed())
                };
                if let (Some(unused), Some(keep)) = (unused, args.keep_warm)
                    && unused >= keep
                {
                    complain(&format!("no bridge used this server for {} s; stopping it", keep.as_secs()));
                    crate::sandbox::process::kill_descendants(std::process::id());
                    let _ = child.wait().await;
                    end_descendants();
                    return 0;
                }
                continue;
            }
            _ = strays.recv() => {
                end_strays(program);
                continue;
            }
            _ = reap.tick(), if args.door.is_some() => {
                reap_strays(program);
                continue;
            }
            _ = watch.tick(), if args.max_processes.is_some() || args.max_memory.is_some() => {
                if let Some(over) = over_limits(args.max_processes, args.max_memory) {
                    complain(&format!("Error: the sandbox {over}; everything in it was stopped"));
                    crate::sandbox::process::kill_descendants(std::process::id());
                    let _ = child.wait().await;
                    end_descendants();
                    return 137;
                }
                continue;
            }
            status = child.wait() => {
                if args.reap {
                    end_descendants();
                }
                return match status {
                    Ok(status) => exit_code(status),
                    Err(e) => {
                        complain(&format!("cannot wait for {}: {e}", args.program.display()));
                        INIT_FAILED
                    }
                };
            },
            _ = terminate.recv() => Signal::SIGTERM,
            _ = interrupt.recv() => Signal::SIGINT,
            _ = hangup.recv() => Signal::SIGHUP,
        };
        if args.reap {
            // The bridge is gone or stopping (our parent-death signal is SIGTERM): nothing of the turn stays.
            end_descendants();
            return 128 + forward as i32;
        }
        if let Some(pid) = child.id() {
            let _ = kill(Pid::from_raw(pid as i32), forward);
        }
    }
}

/// The Landlock sandbox of `json` (`landlock::Confinement`), ready to be put on the program, and the proxy's
/// listener the bridge passed.
fn confined(json: &str) -> Result<(super::landlock::Prepared, Option<TcpListener>), String> {
    let confinement: super::landlock::Confinement = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let prepared = super::landlock::Prepared::new(&confinement).map_err(|e| e.to_string())?;
    let listener = match confinement.proxy_fd {
        Some(fd) => {
            Some(super::landlock::proxy_listener(fd).map_err(|e| format!("the proxy's listener (fd {fd}): {e}"))?)
        }
        None => None,
    };
    Ok((prepared, listener))
}

/// Where this network namespace's unprivileged ports start.
pub const UNPRIVILEGED_PORT_START: &str = "/proc/sys/net/ipv4/ip_unprivileged_port_start";

/// Waits until `port` may be bound without privileges here. Nothing inside can lower the start (`/proc/sys` is
/// read-only in the sandbox): for a model endpoint below it, the bridge sets it to 0 in this namespace from
/// outside right after starting the sandbox (`local/mod.rs`), and this waits (a bound) for that.
async fn low_port_allowed(port: u16) -> Result<(), String> {
    let start =
        || std::fs::read_to_string(UNPRIVILEGED_PORT_START).ok().and_then(|text| text.trim().parse::<u32>().ok());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match start() {
            // Without the file (IPv4 sysctls missing), binding says what is wrong.
            None => return Ok(()),
            Some(start) if u32::from(port) >= start => return Ok(()),
            Some(start) if tokio::time::Instant::now() >= deadline => {
                return Err(format!(
                    "ports below {start} are privileged in the sandbox and the bridge did not open them within 10 s"
                ));
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// How often a long-lived server's adopted orphans that exited are reaped.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// Ends everything below this process but the program's own tree: what earlier turns left running (daemons,
/// `setsid` children), adopted here as the subreaper.
fn end_strays(program: Option<u32>) {
    let own = std::process::id() as i32;
    let strays: Vec<i32> =
        crate::sandbox::process::child_pids(own).into_iter().filter(|&pid| Some(pid as u32) != program).collect();
    for pid in &strays {
        crate::sandbox::process::kill_tree(*pid as u32);
    }
    // Killed trees' members become our children as they die; give them a moment, then reap them.
    std::thread::sleep(Duration::from_millis(20));
    reap_strays(program);
}

/// Reaps exited children other than the program, whose status belongs to tokio's wait.
fn reap_strays(program: Option<u32>) {
    let own = std::process::id() as i32;
    for pid in crate::sandbox::process::child_pids(own) {
        if Some(pid as u32) != program {
            let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        }
    }
}

/// How often the limits are looked at when no cgroup enforces them.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// Whether the processes below this one exceed a limit, in words.
fn over_limits(max_processes: Option<u64>, max_memory: Option<u64>) -> Option<String> {
    let tree = crate::sandbox::process::descendant_pids(std::process::id());
    if let Some(max) = max_processes
        && tree.len() as u64 > max
    {
        return Some(format!("exceeded its process limit ({max})"));
    }
    if let Some(max) = max_memory {
        // SAFETY: sysconf has no preconditions.
        let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let resident: u64 = tree
            .iter()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/statm")).ok())
            .filter_map(|statm| statm.split_whitespace().nth(1).and_then(|pages| pages.parse::<u64>().ok()))
            .sum::<u64>()
            * page;
        if resident > max {
            return Some(format!("exceeded its memory limit ({})", super::limits::format_size(max)));
        }
    }
    None
}

/// Kills every descendant of this process (as subreaper, orphans of the tree are its children) and reaps them.
fn end_descendants() {
    let own = std::process::id();
    crate::sandbox::process::kill_descendants(own);
    while nix::sys::wait::waitpid(Pid::from_raw(-1), Some(nix::sys::wait::WaitPidFlag::WNOHANG))
        .is_ok_and(|status| status != nix::sys::wait::WaitStatus::StillAlive)
    {}
}

fn exit_code(status: ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|signal| 128 + signal)).unwrap_or(INIT_FAILED)
}

async fn serve(listener: TcpListener, socket: Arc<PathBuf>, door: Door) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                tokio::spawn(pass(client, socket.clone(), door));
            }
            Err(e) => {
                // Out of descriptors, usually: wait instead of spinning.
                complain(&format!("accept failed: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn pass(mut client: TcpStream, socket: Arc<PathBuf>, door: Door) {
    let _ = client.set_nodelay(true);
    let mut proxy = match UnixStream::connect(socket.as_path()).await {
        Ok(proxy) => proxy,
        Err(e) => return complain(&format!("cannot reach the proxy at {}: {e}", socket.display())),
    };
    if let Door::Expose(port) = door {
        match open_tunnel(&mut proxy, port).await {
            Ok(early) => {
                if client.write_all(&early).await.is_err() {
                    return;
                }
            }
            Err(why) => return complain(&format!("127.0.0.1:{port} through {}: {why}", socket.display())),
        }
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut proxy).await;
}

/// Takes over the inherited listening socket; it is closed on exec, so the CLI and its tools never hold it.
fn inbound_listener(fd: i32) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: F_SETFD only changes the flags of an fd number; no memory is passed.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the bridge passed this fd for us alone, and nothing else in this process uses it.
    let listener = std::os::unix::net::UnixListener::from(unsafe { OwnedFd::from_raw_fd(fd) });
    listener.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(listener)
}

/// The door's connections open now, and since when none has been (a kept-warm server's clock).
struct DoorUse {
    open: usize,
    since: std::time::Instant,
}

/// How often a kept-warm server's door is looked at for being unused.
const LINGER_CHECK_EVERY: Duration = Duration::from_secs(1);

async fn serve_inbound(listener: tokio::net::UnixListener, port: u16, door_use: Arc<std::sync::Mutex<DoorUse>>) {
    loop {
        match listener.accept().await {
            Ok((mut client, _)) => {
                door_use.lock().unwrap_or_else(|p| p.into_inner()).open += 1;
                let door_use = door_use.clone();
                tokio::spawn(async move {
                    // Refused while the server is still starting: the bridge sees the connection close and retries.
                    if let Ok(mut server) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await {
                        let _ = server.set_nodelay(true);
                        // Either side's end ends the connection: a bridge that went away must not leave it open
                        // (a server's event stream never ends by itself, and a kept-warm server's clock waits for
                        // the door to be unused).
                        let (mut from_bridge, mut to_bridge) = client.split();
                        let (mut from_server, mut to_server) = server.split();
                        tokio::select! {
                            _ = tokio::io::copy(&mut from_bridge, &mut to_server) => {}
                            _ = tokio::io::copy(&mut from_server, &mut to_bridge) => {}
                        }
                    }
                    let mut door_use = door_use.lock().unwrap_or_else(|p| p.into_inner());
                    door_use.open -= 1;
                    if door_use.open == 0 {
                        door_use.since = std::time::Instant::now();
                    }
                });
            }
            Err(e) => {
                complain(&format!("accept on the door failed: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Copies a kept-warm server's output to ours for as long as anyone reads it, and drops it afterwards: the
/// server never sees its output fail when the bridge that read it is gone.
async fn relay(mut from: impl tokio::io::AsyncRead + Unpin, mut to: impl tokio::io::AsyncWrite + Unpin) {
    use tokio::io::AsyncReadExt;
    let mut buffer = vec![0u8; 16 * 1024];
    let mut reader_gone = false;
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) if !reader_gone => {
                reader_gone = to.write_all(&buffer[..n]).await.is_err() || to.flush().await.is_err();
            }
            Ok(_) => {}
        }
    }
}

/// Asks the proxy for a tunnel to the host's 127.0.0.1:`port`; returns what the proxy sent past its answer.
async fn open_tunnel(proxy: &mut UnixStream, port: u16) -> Result<Vec<u8>, String> {
    let request = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    proxy.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let (head, early) = read_head(proxy).await.map_err(|e| e.to_string())?;
    if status_code(&head) == Some(200) {
        Ok(early)
    } else {
        Err(format!("the proxy answered {}", String::from_utf8_lossy(crate::lines::first_line(&head))))
    }
}

/// One line on stderr: the only channel this process has (stdout is the CLI's, and there is no log here).
/// Never fails: a kept-warm server's bridge, which read stderr, may be gone (and `eprintln!` would panic then).
fn complain(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "acp-sandbox sandbox-init: {message}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::net::proxy::tests::echo_server;
    use crate::sandbox::net::proxy::{NetworkMode, Proxy, ProxyPolicy};

    /// `run` installs process-wide signal handlers and the signal test signals the whole test process: one at a time.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// Connects to 127.0.0.1:argv[1]; with argv[2], asks for a CONNECT to it first; then checks an echo.
    const CLIENT: &str = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
if len(sys.argv) > 2:
    s.sendall(f"CONNECT {sys.argv[2]} HTTP/1.1\r\nHost: {sys.argv[2]}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = s.recv(1)
        if not byte:
            sys.exit(2)
        head += byte
    if not head.startswith(b"HTTP/1.1 200 "):
        sys.exit(3)
s.sendall(b"ping through the sandbox")
got = b""
while len(got) < 24:
    chunk = s.recv(100)
    if not chunk:
        break
    got += chunk
sys.exit(0 if got == b"ping through the sandbox" else 4)
"#;

    fn python(script: &str, args: &[String]) -> (PathBuf, Vec<String>) {
        let mut argv = vec!["-c".to_string(), script.to_string()];
        argv.extend(args.iter().cloned());
        ("/usr/bin/python3".into(), argv)
    }

    /// Runs `init::run` on its own thread (it builds its own runtime) and awaits its exit code.
    async fn run_init(args: InitArgs) -> i32 {
        let thread = std::thread::spawn(move || run(args));
        tokio::task::spawn_blocking(move || thread.join().unwrap()).await.unwrap()
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn the_proxy_port_leads_to_the_proxy() {
        let _one = ONE_AT_A_TIME.lock().await;
        let echo = echo_server().await;
        let dir = tempfile::tempdir().unwrap();
        let policy = ProxyPolicy {
            mode: NetworkMode::None,
            endpoints: vec![("127.0.0.1".into(), echo)],
            service_hosts: Vec::new(),
        };
        let proxy =
            Proxy::start(&dir.path().join("proxy.sock"), policy, "test".into(), Default::default()).await.unwrap();
        let port = free_port();
        let (program, args) = python(CLIENT, &[port.to_string(), format!("127.0.0.1:{echo}")]);
        let init = InitArgs {
            proxy_socket: proxy.socket_path().into(),
            proxy_port: Some(port),
            program,
            args,
            ..InitArgs::default()
        };
        assert_eq!(run_init(init).await, 0);
    }

    #[tokio::test]
    async fn an_exposed_port_is_tunnelled_to_the_same_port_on_the_host() {
        let _one = ONE_AT_A_TIME.lock().await;
        // The real proxy would connect to the host's 127.0.0.1:port, which here is init's own listener: this
        // stand-in checks the CONNECT and echoes instead.
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("proxy.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let port = free_port();
        let stand_in = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let (head, _) = read_head(&mut stream).await.unwrap();
            stream.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.unwrap();
            let (mut reader, mut writer) = stream.split();
            let _ = tokio::io::copy(&mut reader, &mut writer).await;
            String::from_utf8(head).unwrap()
        });
        let (program, args) = python(CLIENT, &[port.to_string()]);
        let init = InitArgs { proxy_socket: socket, expose: vec![port], program, args, ..InitArgs::default() };
        assert_eq!(run_init(init).await, 0);
        assert_eq!(
            stand_in.await.unwrap(),
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n")
        );
    }

    #[tokio::test]
    async fn a_refused_tunnel_closes_the_connection() {
        let _one = ONE_AT_A_TIME.lock().await;
        let dir = tempfile::tempdir().unwrap();
        let policy = ProxyPolicy { mode: NetworkMode::Open, endpoints: Vec::new(), service_hosts: Vec::new() };
        let proxy =
            Proxy::start(&dir.path().join("proxy.sock"), policy, "test".into(), Default::default()).await.unwrap();
        let port = free_port();
        let script = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"hello")
try:
    answer = s.recv(100)
except ConnectionResetError:
    answer = b""
sys.exit(0 if answer == b"" else 5)
"#;
        let (program, args) = python(script, &[port.to_string()]);
        let init = InitArgs {
            proxy_socket: proxy.socket_path().into(),
            expose: vec![port],
            program,
            args,
            ..InitArgs::default()
        };
        assert_eq!(run_init(init).await, 0);
    }

    #[tokio::test]
    async fn the_programs_exit_is_returned() {
        let _one = ONE_AT_A_TIME.lock().await;
        let sh = |script: &str| InitArgs {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            ..InitArgs::default()
        };
        assert_eq!(run_init(sh("exit 7")).await, 7);
        assert_eq!(run_init(sh("kill -9 $$")).await, 128 + 9);
        let missing = InitArgs { program: "/nonexistent/cli".into(), ..InitArgs::default() };
        assert_eq!(run_init(missing).await, 127);
    }

    #[tokio::test]
    async fn a_port_that_cannot_be_bound_stops_before_the_program() {
        let _one = ONE_AT_A_TIME.lock().await;
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let init = InitArgs {
            proxy_port: Some(taken.local_addr().unwrap().port()),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), format!("touch {}", marker.display())],
            ..InitArgs::default()
        };
        assert_eq!(run_init(init).await, INIT_FAILED);
        assert!(!marker.exists());
    }

    #[tokio::test]
    async fn sigterm_is_forwarded_to_the_program() {
        let _one = ONE_AT_A_TIME.lock().await;
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let script = r#"
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))
pathlib.Path(sys.argv[1]).touch()
time.sleep(60)
sys.exit(1)
"#;
        let (program, args) = python(script, &[ready.display().to_string()]);
        let running = tokio::spawn(run_init(InitArgs { program, args, ..InitArgs::default() }));
        // The handlers are installed before the program starts, so once it is ready the test process may be
        // signalled: the signal reaches init's handler, not the default action.
        while !ready.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        kill(Pid::this(), Signal::SIGTERM).unwrap();
        assert_eq!(running.await.unwrap(), 42);
    }
}
