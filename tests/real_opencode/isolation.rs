//! No tool of a warm server reaches the server: OpenCode's own bash tool, driven by the scripted model, looks for
//! the server's password and port and for `sandbox-init`'s door, under bubblewrap (as the user and as `nobody`).

use super::*;

/// Run by OpenCode's bash tool inside the server's sandbox: what it could get at, as errnos and lists, in
/// `.server-attack.json`.
const SERVER_ATTACK: &str = r##"
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def errno_of(action):
    try:
        action()
        return 0
    except OSError as e:
        return e.errno
table = []
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            argv = [a.decode(errors="replace") for a in open(f"/proc/{name}/cmdline", "rb").read().split(b"\0") if a]
        except OSError:
            continue
        table.append((int(name), argv))
servers = [pid for pid, argv in table if "serve" in argv and "--port" in argv and "sandbox-init" not in argv]
# bubblewrap's own pid 1 names sandbox-init among its arguments; sandbox-init is the one it runs.
inits = [pid for pid, argv in table if argv[1:2] == ["sandbox-init"]]
out["servers"] = len(servers)
out["inits"] = len(inits)
server, init = servers[0], inits[0]
argv = dict(table)[server]
port = int(argv[argv.index("--port") + 1])
out["password_in_my_environment"] = sorted(k for k in os.environ if "SERVER_PASSWORD" in k or "SERVER_USERNAME" in k)
leaking, readable = [], []
for pid, _ in table:
    try:
        environ = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        continue
    readable.append(pid)
    if b"OPENCODE_SERVER_PASSWORD" in environ:
        leaking.append(pid)
out["environs_with_the_password"] = leaking
out["server_environ"] = errno_of(lambda: open(f"/proc/{server}/environ", "rb").read())
out["init_environ"] = errno_of(lambda: open(f"/proc/{init}/environ", "rb").read())
out["server_mem"] = errno_of(lambda: open(f"/proc/{server}/mem", "rb").close())
out["init_mem"] = errno_of(lambda: open(f"/proc/{init}/mem", "rb").close())
out["init_fds"] = sorted({errno_of(lambda: os.readlink(f"/proc/{init}/fd/{fd}")) for fd in range(0, 16)})
def connect(port, family=socket.AF_INET, host="127.0.0.1"):
    s = socket.socket(family)
    s.settimeout(10)
    try:
        s.connect((host, port))
    finally:
        s.close()
out["connect_server_port"] = errno_of(lambda: connect(port))
out["connect_server_port_v6_mapped"] = errno_of(lambda: connect(port, socket.AF_INET6, "::ffff:127.0.0.1"))
own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen(1)
out["connect_own_listener"] = errno_of(lambda: connect(own.getsockname()[1]))
proxy = os.environ.get("HTTPS_PROXY", "").rsplit(":", 1)
out["connect_proxy_port"] = errno_of(lambda: connect(int(proxy[1]))) if len(proxy) == 2 else "no proxy"
def syscall(*args):
    ctypes.set_errno(0)
    r = libc.syscall(*[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
SYS_pidfd_open, SYS_pidfd_getfd = 434, 438
pidfd, out["pidfd_open_init"] = syscall(SYS_pidfd_open, init, 0)
# Without pidfd_open, a /proc/<pid> directory fd is the other way to name the process.
procfd = os.open(f"/proc/{init}", os.O_RDONLY | os.O_DIRECTORY)
taken, errnos = [], set()
for fd in range(0, 64):
    r, e = syscall(SYS_pidfd_getfd, pidfd if pidfd >= 0 else procfd, fd, 0)
    if r >= 0:
        taken.append(fd)
    else:
        errnos.add(e)
out["pidfd_getfd_init_taken"] = taken
out["pidfd_getfd_init_errnos"] = sorted(errnos)
json.dump(out, open(".server-attack.json", "w"), indent=1)
"##;

/// The user the second variant runs the bridge as (through `setpriv`, when the tests run as root).
const NOBODY: u32 = 65534;

fn server_attack(test: &str, as_nobody: bool) {
    if !bwrap_ok(test) {
        return;
    }
    let Some(world) = World::new(test) else { return };
    let ws = world.workspace("ws");
    std::fs::write(ws.join(".attack.py"), SERVER_ATTACK).unwrap();
    let mut options = world.backend_options("bwrap", "serve");
    if as_nobody {
        // nobody cannot reach root's tools cache: the same OpenCode binary, linked into the test's own directory.
        let bin = world.root.path().join("opencode-bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::hard_link(std::fs::canonicalize(&world.opencode).unwrap(), bin.join("opencode")).unwrap();
        options = options.env("ACP_SANDBOX_OPENCODE_BIN", &bin.join("opencode").display().to_string());
        let chown =
            Command::new("chown").args(["-R", &format!("{NOBODY}:{NOBODY}")]).arg(world.root.path()).status().unwrap();
        assert!(chown.success());
        options.launcher.extend(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"].map(String::from));
    }
    let mut bridge = world.start_with(options);
    let sid = bridge.new_session(&ws);
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:attack set the project up", "server attack");
    assert_end_turn(&bridge, &turn);
    let report = std::fs::read_to_string(ws.join(".server-attack.json"))
        .unwrap_or_else(|e| bridge.fail(&format!("the bash tool wrote no result ({e}): {:#?}", turn.updates)));
    let mut report: Value = serde_json::from_str(&report).unwrap();
    let (eacces, eperm) = (libc::EACCES, libc::EPERM);
    // No descriptor of the first process can be read; a number it has not open answers ENOENT (that the number is
    // free is all it says), so the set is EACCES alone or with ENOENT, never a link (0).
    let init_fds = report["init_fds"].take();
    assert!(
        init_fds == json!([eacces]) || init_fds == json!([libc::ENOENT, eacces]),
        "the sandbox's first process's descriptors: {init_fds}"
    );
    assert_eq!(
        report,
        json!({
            "servers": 1,
            "inits": 1,
            "password_in_my_environment": [],
            "environs_with_the_password": [],
            "server_environ": eacces,
            "init_environ": eacces,
            "server_mem": eacces,
            "init_mem": eacces,
            "init_fds": null,
            "connect_server_port": eacces,
            "connect_server_port_v6_mapped": eacces,
            "connect_own_listener": 0,
            "connect_proxy_port": 0,
            "pidfd_open_init": eperm,
            "pidfd_getfd_init_taken": [],
            "pidfd_getfd_init_errnos": [eperm],
        }),
        "what OpenCode's bash tool got at in its own server's sandbox"
    );
    // The server still answers the bridge: a second turn works.
    let turn = timed_prompt(&mut bridge, &sid, &ws, "SCENARIO:text Say hello", "after the attack");
    assert_end_turn(&bridge, &turn);
}

#[test]
fn a_servers_tools_cannot_reach_it_or_its_credential() {
    server_attack("a_servers_tools_cannot_reach_it_or_its_credential", false);
}

#[test]
fn a_servers_tools_cannot_reach_it_or_its_credential_as_nobody() {
    let test = "a_servers_tools_cannot_reach_it_or_its_credential_as_nobody";
    if !nix::unistd::getuid().is_root() {
        eprintln!("SKIPPED {test}: the tests do not run as root, so there is no other user to become");
        return;
    }
    server_attack(test, true);
}
