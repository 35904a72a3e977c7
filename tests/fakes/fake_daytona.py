#!/usr/bin/env python3
"""A fake Daytona cloud for tests/daytona.rs: the control plane and the toolbox of its sandboxes, on 127.0.0.1.

Usage: fake_daytona.py --root DIR --api-key KEY [--port 0] [--record FILE] [--no-terminate] [--drop-logs-after N]
                       [--record-files FILE] [--daemon-version V] [--session-shell zsh|bash|dash]
                       [--state-change-seconds S] [--grow NAME=BYTES] [--command-start-delay S]
Prints `PORT <n>` on stdout once it listens on 127.0.0.1:<n>, then serves until killed (or until stdin closes).

Speaks what the official SDKs and our provider use, as the Daytona API and its daemon do (JSON shapes, status
codes, the log framing):
- Control plane under `/api`: `POST /sandbox` (from a snapshot, or an image's `buildInfo`; env vars and labels),
  `GET /sandbox/{idOrName}`, `POST /sandbox/{id}/start`, `POST /sandbox/{id}/stop`, `DELETE /sandbox/{id}`,
  `GET /sandbox/{id}/toolbox-proxy-url`, `GET /snapshots/{idOrName}` (the names of --snapshots, 404 otherwise),
  and the public `GET /config` (its `defaultSnapshot` is daytona-small). `Authorization: Bearer KEY` is required
  (401 otherwise) but for /config; an
  `X-Daytona-Organization-ID` header is accepted and recorded. Start and stop pass through `starting` /
  `stopping` (seen by the next GET, or for `--state-change-seconds`), so clients must poll as they do against the
  real one; a `DELETE` while a start or stop is under way is refused with 409 "Sandbox state change in progress". There is no
  Socket.IO gateway (`/api/socket.io/` is 404): the SDK then falls back to polling.
- Toolbox under `/toolbox/{sandboxId}` (the `toolboxProxyUrl` of every sandbox is `http://127.0.0.1:<n>/toolbox`):
  sessions (`POST /process/session`, `GET /process/session` (the list, its JSON as Go writes it),
  `GET|DELETE /process/session/{s}` (a delete ends the processes of its commands' groups; what left them, such
  as a `setsid` child, runs on, as with the daemon), `POST /process/session/{s}/exec` with
  `runAsync`, `GET …/command/{c}`, `GET …/command/{c}/logs` as a WebSocket with `follow=true` or as plain HTTP,
  `POST …/command/{c}/terminate`, `POST …/command/{c}/input`), files (`POST /files/bulk-upload`,
  `POST /files/bulk-download`, `GET /files/download?path=` (streamed; with `--grow NAME=BYTES` a file named NAME comes
  with BYTES zero bytes more, chunked without a length, as a file still growing), `POST /files/folder?path=&mode=`,
  `DELETE /files?path=`), `GET /work-dir`, `GET /user-home-dir`.
- As the daemon does, a command's text is written to `cmd.sh` next to its log; `POST …/input {"data"}` writes the
  data (a newline appended when it has none) into the command's stdin, which stays open while an async command
  runs (a sync one gets an empty stdin); before the command started (`--command-start-delay` makes that last) or
  after it ended that is a 500 (its input pipe does not exist, nothing of the data is taken), and 410 once its exit code was read; the data is echoed into the log as stdout unless
  the exec asked for `suppressInputEcho`. `--record-files` appends every file this daemon side writes (uploads,
  `cmd.sh`, log lines) as JSON lines {"path", "mode", "data"}; `--daemon-version` is what sandboxes report.
- A command's log is one file where every line of stdout is prefixed with 01 01 01 and every line of stderr with
  02 02 02, as the daemon writes it (its labellers are `read` loops of the session's shell, `--session-shell`:
  under bash a line loses its NUL bytes, under dash it ends at its first NUL, under zsh it keeps them); clients that send `X-Daytona-SDK-Version` >= 0.27 or
  `X-Daytona-Split-Output: true` get the markers, others get them stripped.

Processes really run on the host, in the sandbox's directory under DIR (`<DIR>/<id>/home` is its home and work
dir), each in a process group of its own; the commands of one session run one after the other. It is a fake: it
isolates nothing. File paths must stay inside the sandbox's directory (403 otherwise). A stopped sandbox keeps
its files and loses its processes and sessions, as a real one does. Every request is appended to FILE as one
JSON line: {"method", "path", "auth", "org", "sdk", "split", "body"} (the body parsed where it is JSON).
"""

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

STDOUT_PREFIX = b"\x01\x01\x01"
STDERR_PREFIX = b"\x02\x02\x02"
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
BOUNDARY = "DAYTONA-FILE-BOUNDARY"
DEFAULT_SNAPSHOT = "daytona-small"

LOCK = threading.RLock()
RECORD_LOCK = threading.Lock()
SANDBOXES = {}
ARGS = None


def now():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def version_tuple(text):
    parts = re.findall(r"\d+", text.split("-")[0])
    return tuple(int(p) for p in parts[:3]) if parts else None


def combined_output(headers):
    """The daemon's rule: old SDKs (< 0.27) and clients that name no SDK and ask for no split get no markers."""
    sdk = headers.get("X-Daytona-SDK-Version", "")
    if sdk:
        parsed = version_tuple(sdk)
        return parsed is not None and parsed < (0, 27, 0) and "dev" not in sdk
    return headers.get("X-Daytona-Split-Output", "") != "true"


def strip_markers(data):
    return data.replace(STDOUT_PREFIX, b"").replace(STDERR_PREFIX, b"")


def demux(data):
    out, err = bytearray(), bytearray()
    target = None
    i = 0
    while i < len(data):
        if data[i : i + 3] == STDOUT_PREFIX:
            target, i = out, i + 3
            continue
        if data[i : i + 3] == STDERR_PREFIX:
            target, i = err, i + 3
            continue
        if target is not None:
            target.append(data[i])
        i += 1
    return bytes(out), bytes(err)


def go_json(value):
    """JSON as the daemon's gin `c.JSON` writes it (Go's `json.Marshal`): compact, non-ASCII as is, and `<`, `>`,
    `&`, U+2028 and U+2029 escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text.encode()


def wrote(path, data, mode="w"):
    """A file the daemon writes in a sandbox (mode "w" or "a"), also appended to --record-files when set."""
    with open(path, mode + "b") as f:
        f.write(data)
    if ARGS.record_files:
        line = {"path": os.path.relpath(path, ARGS.root), "mode": mode, "data": data.decode("utf-8", "replace")}
        with RECORD_LOCK, open(ARGS.record_files, "a") as f:
            f.write(json.dumps(line) + "\n")


class Command:
    def __init__(self, session, command, run_async=True, suppress_echo=False):
        self.id = str(uuid.uuid4())
        self.command = command
        self.session = session
        self.run_async = run_async
        self.suppress_echo = suppress_echo
        self.dir = os.path.join(session.dir, self.id)
        os.makedirs(self.dir)
        self.log_path = os.path.join(self.dir, "output.log")
        self.exit_path = os.path.join(self.dir, "exit_code")
        self.input_path = os.path.join(self.dir, "input.pipe")
        open(self.log_path, "wb").close()
        # The daemon runs the command from a file it writes next to the log (the command line is on disk).
        wrote(os.path.join(self.dir, "cmd.sh"), command.encode())
        self.exit_code = None
        # The daemon learns the exit code when a GET of the command reads it; until then input is still tried.
        self.exit_seen = False
        self.proc = None
        self.stdin_w = None
        self.input_lock = threading.Lock()
        self.log_lock = threading.Lock()
        self.done = threading.Event()
        self.dropped = False

    def json(self):
        out = {"id": self.id, "command": self.command}
        if self.exit_code is not None:
            out["exitCode"] = self.exit_code
        return out

    def run(self, sandbox):
        """Runs in a thread of its own, after the session's earlier commands (a session is one shell)."""
        with self.session.turn:
            if self.session.deleted:
                self.finish(130)
                return
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": sandbox.home, "LANG": "C.UTF-8"}
            env.update(sandbox.env)
            if ARGS.command_start_delay:
                # A busy sandbox: the session's shell starts the command (and its input pipe exists) only later.
                time.sleep(ARGS.command_start_delay)
            read_fd, write_fd = os.pipe()
            try:
                self.proc = subprocess.Popen(
                    ["sh", "-c", self.command],
                    cwd=sandbox.home,
                    env=env,
                    stdin=read_fd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            finally:
                os.close(read_fd)
            with self.input_lock:
                self.stdin_w = write_fd
            if not self.run_async:
                # A synchronous command's input pipe ends at once (`cat /dev/null > "$ip"`).
                self.close_stdin()
            readers = [
                threading.Thread(target=self.label, args=(self.proc.stdout, STDOUT_PREFIX), daemon=True),
                threading.Thread(target=self.label, args=(self.proc.stderr, STDERR_PREFIX), daemon=True),
            ]
            for reader in readers:
                reader.start()
            code = self.proc.wait()
            for reader in readers:
                reader.join()
            self.close_stdin()
            self.finish(code if code >= 0 else 128 - code)

    def label(self, pipe, prefix):
        # The daemon's labelers, run by the session's shell:
        # `while IFS= read -r line || [ -n "$line" ]; do printf '<prefix>%s\n' "$line"; done`. zsh keeps NUL bytes
        # in a variable; bash's `read` drops them; dash's variables are C strings, so its line ends at the first NUL.
        for line in iter(pipe.readline, b""):
            if ARGS.session_shell == "bash":
                line = line.replace(b"\0", b"")
            elif ARGS.session_shell == "dash" and b"\0" in line:
                line = line[: line.index(b"\0")] + b"\n"
            with self.log_lock:
                wrote(self.log_path, prefix + line.rstrip(b"\n") + b"\n", "a")

    def close_stdin(self):
        with self.input_lock:
            self._close_stdin()

    def _close_stdin(self):
        if self.stdin_w is not None:
            try:
                os.close(self.stdin_w)
            except OSError:
                pass
            self.stdin_w = None

    def finish(self, code):
        with open(self.exit_path + ".pending", "w") as f:
            f.write(f"{code}\n")
        os.replace(self.exit_path + ".pending", self.exit_path)
        self.exit_code = code
        self.done.set()

    def signal_group(self, sig):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


class Session:
    def __init__(self, sandbox, session_id):
        self.id = session_id
        self.dir = os.path.join(sandbox.root, ".daytona", "sessions", session_id)
        os.makedirs(self.dir, exist_ok=True)
        self.commands = {}
        self.turn = threading.Lock()
        self.deleted = False

    def json(self):
        return {"sessionId": self.id, "commands": [c.json() for c in self.commands.values()]}

    def end(self, grace):
        """Ends every command of the session: SIGTERM, then SIGKILL after the grace (the daemon's delete)."""
        self.deleted = True
        for command in self.commands.values():
            command.signal_group(signal.SIGTERM if grace else signal.SIGKILL)
        deadline = time.monotonic() + grace
        for command in self.commands.values():
            while command.proc is not None and command.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            command.signal_group(signal.SIGKILL)
            command.close_stdin()


class Sandbox:
    def __init__(self, body, port):
        self.id = str(uuid.uuid4())
        self.root = os.path.join(ARGS.root, self.id)
        self.home = os.path.join(self.root, "home")
        os.makedirs(self.home)
        self.body = body
        self.env = dict(body.get("env") or {})
        self.labels = dict(body.get("labels") or {})
        self.name = body.get("name") or self.id
        self.state = "started"
        self.next_state = None
        # When a state change asked for is done (`--state-change-seconds` after it was asked).
        self.settle_at = 0.0
        self.created = now()
        self.updated = self.created
        self.port = port
        self.sessions = {}

    def json(self):
        out = {
            "id": self.id,
            "organizationId": "fake-organization",
            "name": self.name,
            "snapshot": self.body.get("snapshot") or ("" if self.body.get("buildInfo") else DEFAULT_SNAPSHOT),
            "user": self.body.get("user") or "daytona",
            "env": self.env,
            "labels": self.labels,
            "public": bool(self.body.get("public", False)),
            "networkBlockAll": bool(self.body.get("networkBlockAll", False)),
            "kvm": False,
            "target": self.body.get("target") or "us",
            "cpu": int(self.body.get("cpu") or 1),
            "gpu": 0,
            "memory": int(self.body.get("memory") or 1),
            "disk": int(self.body.get("disk") or 3),
            "state": self.state,
            "desiredState": {"stopping": "stopped", "starting": "started"}.get(self.state, self.state),
            "autoStopInterval": self.body.get("autoStopInterval", 15),
            "autoArchiveInterval": self.body.get("autoArchiveInterval", 10080),
            "autoDeleteInterval": self.body.get("autoDeleteInterval", -1),
            "createdAt": self.created,
            "updatedAt": self.updated,
            "daemonVersion": ARGS.daemon_version,
            "toolboxProxyUrl": f"http://127.0.0.1:{self.port}/toolbox",
        }
        if self.body.get("buildInfo"):
            out["buildInfo"] = {
                "dockerfileContent": self.body["buildInfo"].get("dockerfileContent", ""),
                "contextHashes": self.body["buildInfo"].get("contextHashes", []),
                "createdAt": self.created,
                "updatedAt": self.created,
                "snapshotRef": "fake-build",
            }
        return out

    def change(self, state, next_state):
        self.state, self.next_state = state, next_state
        self.settle_at = time.monotonic() + ARGS.state_change_seconds

    def settle(self):
        """A transitional state is seen once, by the request after the one that caused it (or for as long as
        `--state-change-seconds` says)."""
        if self.next_state is not None and time.monotonic() >= self.settle_at:
            self.state, self.next_state = self.next_state, None
            self.updated = now()

    def kill_everything(self):
        for session in self.sessions.values():
            session.end(0)
        self.sessions.clear()
        # A stopped or deleted container has no process left: also what left its command's process group (a
        # `setsid` child), found by its working directory inside the sandbox.
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if cwd == self.root or cwd.startswith(self.root + os.sep):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass


def record(handler, body):
    if not ARGS.record:
        return
    parsed = body
    if body:
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            parsed = body.decode("utf-8", "replace")
    line = {
        "method": handler.command,
        "path": handler.path,
        "auth": handler.headers.get("Authorization"),
        "org": handler.headers.get("X-Daytona-Organization-ID"),
        "sdk": handler.headers.get("X-Daytona-SDK-Version"),
        "split": handler.headers.get("X-Daytona-Split-Output"),
        "body": parsed if parsed else None,
    }
    with RECORD_LOCK, open(ARGS.record, "a") as f:
        f.write(json.dumps(line) + "\n")


def part_disposition(form, path):
    """The daemon's Content-Disposition of a bulk-download part: the path as a quoted Latin-1 `filename` (escaped,
    anything else `_`) and exactly as an RFC 5987 `filename*`, which clients prefer."""
    quoted = path.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "").replace("\0", "")
    latin1 = "".join("_" if ord(c) > 0xFF or ord(c) < 0x20 or ord(c) == 0x7F else c for c in quoted)
    safe = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$&+-.^_`|~")
    encoded = "".join(chr(b) if b in safe else f"%{b:02X}" for b in path.encode())
    return f"form-data; name=\"{form}\"; filename=\"{latin1}\"; filename*=utf-8''{encoded}"


def parse_multipart(body, content_type):
    match = re.search(r'boundary="?([^";]+)"?', content_type or "")
    if not match:
        return None
    delimiter = b"--" + match.group(1).encode()
    fields = {}
    for chunk in body.split(delimiter)[1:]:
        if chunk.startswith(b"--"):
            break
        chunk = chunk[2:] if chunk.startswith(b"\r\n") else chunk
        head, _, data = chunk.partition(b"\r\n\r\n")
        data = data[:-2] if data.endswith(b"\r\n") else data
        name = re.search(rb'name="([^"]*)"', head)
        if name:
            fields[name.group(1).decode()] = data
    return fields


def stream_file(handler, target, grow, headers=()):
    """Sends the file at `target` a MiB at a time (never whole in memory: tests serve files of GiBs). With `grow`
    extra bytes (`--grow`), like a file still growing while it is read: its content, then that many zero bytes,
    chunked, with no length announced."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    for name, value in headers:
        handler.send_header(name, value)
    if grow is None:
        handler.send_header("Content-Length", str(os.path.getsize(target)))
    else:
        handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()

    def out(data):
        if grow is None:
            handler.wfile.write(data)
        else:
            handler.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")

    with open(target, "rb") as src:
        while True:
            data = src.read(1 << 20)
            if not data:
                break
            out(data)
    left = grow or 0
    while left > 0:
        out(bytes(min(left, 1 << 20)))
        left -= 1 << 20
    if grow is not None:
        handler.wfile.write(b"0\r\n\r\n")


def grown(path):
    """The extra bytes `--grow NAME=BYTES` serves after a file named NAME, or None."""
    for entry in ARGS.grow:
        name, _, extra = entry.partition("=")
        if os.path.basename(path) == name:
            return int(extra)
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    # --- plumbing -------------------------------------------------------------------------------------------

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
            return bytes(data)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send(self, status, payload=None, content_type="application/json; charset=utf-8", headers=()):
        data = b""
        if payload is not None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("Content-Type", content_type)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def api_error(self, status, message, error):
        # The API's (NestJS) error shape.
        self.send(status, {"statusCode": status, "message": message, "error": error})

    def toolbox_error(self, status, message, code):
        # The daemon's ErrorResponse.
        self.send(
            status,
            {
                "statusCode": status,
                "message": message,
                "code": code,
                "timestamp": now(),
                "path": urlparse(self.path).path,
                "method": self.command,
            },
        )

    def authorized(self):
        return self.headers.get("Authorization") == f"Bearer {ARGS.api_key}"

    def handle_any(self):
        body = self.body()
        record(self, body)
        url = urlparse(self.path)
        path = url.path
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if path == "/api/config" and self.command == "GET":
            # Public, as the API's configuration is.
            return self.send(200, self.config())
        if path.startswith("/api/"):
            if not self.authorized():
                return self.api_error(401, "Unauthorized", "Unauthorized")
            return self.control(path[len("/api") :], query, body)
        match = re.fullmatch(r"/toolbox/([^/]+)(/.*)", path)
        if match:
            if not self.authorized():
                return self.api_error(401, "Unauthorized", "Unauthorized")
            with LOCK:
                sandbox = SANDBOXES.get(match.group(1))
            if sandbox is None:
                return self.api_error(404, f"Sandbox with ID {match.group(1)} not found", "Not Found")
            if sandbox.state != "started":
                return self.api_error(400, f"Sandbox {sandbox.id} is not running (state: {sandbox.state})", "Bad Request")
            return self.toolbox(sandbox, match.group(2), query, body)
        return self.api_error(404, f"Cannot {self.command} {path}", "Not Found")

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = handle_any

    # --- control plane --------------------------------------------------------------------------------------

    def find(self, key):
        with LOCK:
            sandbox = SANDBOXES.get(key) or next((s for s in SANDBOXES.values() if s.name == key), None)
        if sandbox is not None:
            sandbox.settle()
        return sandbox

    def config(self):
        port = self.server.server_address[1]
        return {
            "version": "fake",
            "oidc": {"issuer": f"http://127.0.0.1:{port}/oidc", "clientId": "fake", "audience": "fake"},
            "linkedAccountsEnabled": False,
            "announcements": {},
            "proxyTemplateUrl": f"http://{{{{PORT}}}}-{{{{sandboxId}}}}.127.0.0.1:{port}",
            "proxyToolboxUrl": f"http://127.0.0.1:{port}/toolbox",
            "defaultSnapshot": DEFAULT_SNAPSHOT,
            "dashboardUrl": f"http://127.0.0.1:{port}/dashboard",
            "maxAutoArchiveInterval": 43200,
            "maintananceMode": False,
            "environment": "fake",
        }

    def snapshot(self, key):
        """`GET /snapshots/{idOrName}`: the general (Daytona-wide) snapshots of --snapshots, by name or id."""
        for name in ARGS.snapshots.split(","):
            snapshot_id = str(uuid.uuid5(uuid.NAMESPACE_URL, "fake-daytona-snapshot:" + name))
            if key in (name, snapshot_id):
                return self.send(200, {
                    "id": snapshot_id, "organizationId": None, "general": True, "name": name, "imageName": name,
                    "state": "active", "size": 1.2, "entrypoint": ["sleep", "infinity"], "cpu": 1, "gpu": 0,
                    "mem": 1, "disk": 3, "errorReason": None, "createdAt": "2026-01-01T00:00:00.000Z",
                    "updatedAt": "2026-01-01T00:00:00.000Z", "lastUsedAt": None, "regionIds": ["us"],
                    "ref": f"registry.fake/{name}:latest", "sourceSandboxId": None,
                })
        return self.api_error(404, f"Snapshot {key} not found", "Not Found")

    def control(self, path, query, body):
        method = self.command
        match = re.fullmatch(r"/snapshots/([^/]+)", path)
        if match and method == "GET":
            return self.snapshot(unquote(match.group(1)))
        if path == "/sandbox" and method == "POST":
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                return self.api_error(400, "Invalid JSON body", "Bad Request")
            if not isinstance(request, dict):
                return self.api_error(400, "Invalid body", "Bad Request")
            bad = [k for k, v in (request.get("env") or {}).items() if not isinstance(v, str)]
            if bad:
                return self.api_error(400, [f"env.{k} must be a string" for k in bad], "Bad Request")
            sandbox = Sandbox(request, self.server.server_address[1])
            with LOCK:
                SANDBOXES[sandbox.id] = sandbox
            return self.send(200, sandbox.json())
        match = re.fullmatch(r"/sandbox/([^/]+)(/[a-z-]+)?", path)
        if not match:
            return self.api_error(404, f"Cannot {method} /api{path}", "Not Found")
        sandbox = self.find(unquote(match.group(1)))
        if sandbox is None:
            return self.api_error(404, f"Sandbox with ID or name {match.group(1)} not found", "Not Found")
        action = match.group(2)
        if action is None and method == "GET":
            return self.send(200, sandbox.json())
        if action is None and method == "DELETE":
            if sandbox.next_state is not None:
                # The API refuses a change while another is under way.
                return self.api_error(409, "Sandbox state change in progress", "Conflict")
            with LOCK:
                sandbox.kill_everything()
                SANDBOXES.pop(sandbox.id, None)
            shutil.rmtree(sandbox.root, ignore_errors=True)
            sandbox.state = "destroying"
            return self.send(200, sandbox.json())
        if action == "/start" and method == "POST":
            if sandbox.state in ("started", "starting"):
                return self.send(200, sandbox.json())
            sandbox.change("starting", "started")
            return self.send(200, sandbox.json())
        if action == "/stop" and method == "POST":
            if sandbox.state not in ("started", "starting"):
                return self.api_error(400, f"Sandbox is not started (state: {sandbox.state})", "Bad Request")
            sandbox.kill_everything()
            sandbox.change("stopping", "stopped")
            return self.send(200, sandbox.json())
        if action == "/toolbox-proxy-url" and method == "GET":
            return self.send(200, {"url": sandbox.json()["toolboxProxyUrl"]})
        return self.api_error(404, f"Cannot {method} /api{path}", "Not Found")

    # --- toolbox --------------------------------------------------------------------------------------------

    def resolve(self, sandbox, raw):
        """A sandbox path on the host: relative to the work dir, and never outside the sandbox's directory."""
        path = os.path.normpath(os.path.join(sandbox.home, raw))
        root = os.path.realpath(sandbox.root)
        real = os.path.realpath(path)
        if real != root and not real.startswith(root + os.sep):
            return None
        return path

    def toolbox(self, sandbox, path, query, body):
        method = self.command
        if path == "/work-dir" and method == "GET":
            return self.send(200, {"dir": sandbox.home})
        if path == "/user-home-dir" and method == "GET":
            return self.send(200, {"dir": sandbox.home})
        if path.startswith("/files"):
            return self.files(sandbox, path, query, body)
        if path == "/process/session" and method == "POST":
            try:
                session_id = json.loads(body or b"{}").get("sessionId")
            except (ValueError, AttributeError):
                session_id = None
            if not session_id:
                return self.toolbox_error(400, "sessionId is required", "BAD_REQUEST")
            with LOCK:
                if session_id in sandbox.sessions:
                    return self.toolbox_error(409, "session already exists", "CONFLICT")
                sandbox.sessions[session_id] = Session(sandbox, session_id)
            return self.send(201)
        if path == "/process/session" and method == "GET":
            # The daemon's ListSessions: `[{"sessionId", "commands": [{"id", "command", "exitCode"?}]}]`.
            with LOCK:
                listed = [s.json() for s in sandbox.sessions.values()]
            return self.send(200, go_json(listed))
        match = re.fullmatch(r"/process/session/([^/]+)(?:/(exec)|/command/([^/]+)(/logs|/terminate|/input)?)?", path)
        if not match:
            return self.toolbox_error(404, f"no route {method} {path}", "NOT_FOUND")
        session = sandbox.sessions.get(match.group(1))
        if session is None:
            return self.toolbox_error(404, "session not found", "NOT_FOUND")
        if match.group(2) is None and match.group(3) is None:
            if method == "GET":
                return self.send(200, go_json(session.json()))
            if method == "DELETE":
                with LOCK:
                    sandbox.sessions.pop(session.id, None)
                session.end(0.5)
                shutil.rmtree(session.dir, ignore_errors=True)
                return self.send(204)
            return self.toolbox_error(405, "method not allowed", "METHOD_NOT_ALLOWED")
        if match.group(2) == "exec" and method == "POST":
            return self.execute(sandbox, session, body)
        command = session.commands.get(match.group(3))
        if command is None:
            return self.toolbox_error(404, "command not found", "NOT_FOUND")
        action = match.group(4)
        if action is None and method == "GET":
            command.exit_seen = command.exit_code is not None
            return self.send(200, command.json())
        if action == "/logs" and method == "GET":
            return self.logs(command, query)
        if action == "/terminate" and ARGS.no_terminate:
            return self.send(404, b"404 page not found", "text/plain")
        if action == "/terminate" and method == "POST":
            if command.exit_code is not None:
                return self.toolbox_error(
                    410, f"command has already completed with exit code {command.exit_code}", "GONE"
                )
            command.signal_group(signal.SIGKILL)
            return self.send(204)
        if action == "/input" and method == "POST":
            return self.send_input(command, body)
        return self.toolbox_error(405, "method not allowed", "METHOD_NOT_ALLOWED")

    def send_input(self, command, body):
        """The daemon's SendInput: the data (a newline added when it has none) goes into the command's input pipe,
        and is echoed into its log as stdout unless the command was started with `suppressInputEcho`."""
        try:
            data = json.loads(body or b"{}").get("data")
        except (ValueError, AttributeError):
            data = None
        if not isinstance(data, str) or not data:
            message = "Key: 'SessionSendInputRequest.Data' Error:Field validation for 'Data' failed on the 'required' tag"
            return self.toolbox_error(400, message, "INVALID_REQUEST_BODY")
        if command.exit_seen:
            return self.toolbox_error(
                410, f"command has already completed with exit code {command.exit_code}", "GONE"
            )
        if not data.endswith("\n"):
            data += "\n"
        with command.input_lock:
            if command.stdin_w is None:
                # Not made yet (the session's shell has not started the command) or already removed.
                return self.toolbox_error(
                    500,
                    f"failed to open input pipe: open {command.input_path}: no such file or directory",
                    "INTERNAL_SERVER_ERROR",
                )
            try:
                encoded = data.encode()
                while encoded:
                    encoded = encoded[os.write(command.stdin_w, encoded):]
            except OSError as e:
                return self.toolbox_error(500, f"failed to write to input pipe: {e}", "INTERNAL_SERVER_ERROR")
        if not command.suppress_echo:
            with command.log_lock:
                wrote(command.log_path, STDOUT_PREFIX + data.encode(), "a")
        return self.send(204)

    def execute(self, sandbox, session, body):
        try:
            request = json.loads(body or b"{}")
            text = request["command"]
        except (ValueError, KeyError, TypeError):
            return self.toolbox_error(400, "command is required", "BAD_REQUEST")
        run_async = bool(request.get("runAsync") or request.get("async"))
        command = Command(session, text, run_async, bool(request.get("suppressInputEcho")))
        session.commands[command.id] = command
        threading.Thread(target=command.run, args=(sandbox,), daemon=True).start()
        if run_async:
            return self.send(202, {"cmdId": command.id})
        command.done.wait()
        with open(command.log_path, "rb") as f:
            log = f.read()
        if combined_output(self.headers):
            return self.send(200, {"cmdId": command.id, "output": strip_markers(log).decode("utf-8", "replace"),
                                   "exitCode": command.exit_code})
        out, err = demux(log)
        return self.send(
            200,
            {
                "cmdId": command.id,
                "output": log.decode("utf-8", "replace"),
                "stdout": out.decode("utf-8", "replace"),
                "stderr": err.decode("utf-8", "replace"),
                "exitCode": command.exit_code,
            },
        )

    def logs(self, command, query):
        combined = combined_output(self.headers)
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket_logs(command, query.get("follow") == "true", combined)
        with open(command.log_path, "rb") as f:
            log = f.read()
        if "application/json" in self.headers.get("Accept", ""):
            out, err = demux(log)
            return self.send(
                200,
                {
                    "output": strip_markers(log).decode("utf-8", "replace"),
                    "stdout": out.decode("utf-8", "replace"),
                    "stderr": err.decode("utf-8", "replace"),
                },
            )
        return self.send(200, strip_markers(log) if combined else log, "text/plain; charset=utf-8")

    # --- WebSocket (RFC 6455, server side) --------------------------------------------------------------------

    def websocket_logs(self, command, follow, combined):
        key = self.headers.get("Sec-WebSocket-Key")
        if not key:
            return self.toolbox_error(400, "missing Sec-WebSocket-Key", "BAD_REQUEST")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        conn = self.connection
        write_lock = threading.Lock()
        closed = threading.Event()

        def frame(opcode, payload):
            head = bytes([0x80 | opcode])
            n = len(payload)
            if n < 126:
                head += bytes([n])
            elif n < 65536:
                head += bytes([126]) + struct.pack("!H", n)
            else:
                head += bytes([127]) + struct.pack("!Q", n)
            with write_lock:
                conn.sendall(head + payload)

        def reader():
            # Answers pings and notices the client's close; client frames are masked.
            try:
                while not closed.is_set():
                    head = self.rfile.read(2)
                    if len(head) < 2:
                        break
                    opcode, n = head[0] & 0x0F, head[1] & 0x7F
                    if n == 126:
                        n = struct.unpack("!H", self.rfile.read(2))[0]
                    elif n == 127:
                        n = struct.unpack("!Q", self.rfile.read(8))[0]
                    mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
                    data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
                    if opcode == 0x9:
                        frame(0xA, data)
                    elif opcode == 0x8:
                        break
            except (OSError, ValueError, struct.error):
                pass
            closed.set()

        threading.Thread(target=reader, daemon=True).start()
        sent = 0
        held = b""
        drop = False
        try:
            while not closed.is_set():
                finished = os.path.exists(command.exit_path)
                with command.log_lock, open(command.log_path, "rb") as f:
                    f.seek(sent)
                    chunk = f.read()
                drop = ARGS.drop_logs_after is not None and not command.dropped
                if drop and sent + len(chunk) >= ARGS.drop_logs_after:
                    # A connection lost mid-stream: part of the bytes, then no close frame.
                    command.dropped = True
                    frame(0x2, chunk[: ARGS.drop_logs_after - sent])
                    break
                sent += len(chunk)
                if chunk:
                    if combined:
                        # Markers may be split across reads: hold back a tail that could start one.
                        data = held + chunk
                        keep = 0
                        for k in (2, 1):
                            if len(data) >= k and data[-k:] in (STDOUT_PREFIX[:k], STDERR_PREFIX[:k]):
                                keep = k
                                break
                        held = data[len(data) - keep :] if keep else b""
                        chunk = strip_markers(data[: len(data) - keep])
                    if chunk:
                        frame(0x2, chunk)
                elif finished or not follow:
                    break
                else:
                    time.sleep(0.02)
            if command.dropped and not closed.is_set() and drop:
                raise OSError("dropped")
            if held:
                frame(0x2, held)
            if not closed.is_set():
                frame(0x8, struct.pack("!H", 1000))
                # Let the client see the close before the socket goes.
                closed.wait(1.0)
        except OSError:
            pass
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # --- files ----------------------------------------------------------------------------------------------

    def files(self, sandbox, path, query, body):
        method = self.command
        if path == "/files/bulk-upload" and method == "POST":
            fields = parse_multipart(body, self.headers.get("Content-Type"))
            if fields is None:
                return self.toolbox_error(400, "expected multipart/form-data", "BAD_REQUEST")
            index = 0
            while f"files[{index}].path" in fields:
                target = self.resolve(sandbox, fields[f"files[{index}].path"].decode())
                data = fields.get(f"files[{index}].file")
                if target is None:
                    return self.toolbox_error(403, "path outside the sandbox", "FORBIDDEN")
                if data is None:
                    return self.toolbox_error(400, f"files[{index}].file is missing", "BAD_REQUEST")
                os.makedirs(os.path.dirname(target), exist_ok=True)
                wrote(target, data)
                index += 1
            if index == 0:
                return self.toolbox_error(400, "no files", "BAD_REQUEST")
            return self.send(200)
        if path == "/files/bulk-download" and method == "POST":
            try:
                paths = json.loads(body or b"{}").get("paths") or []
            except (ValueError, AttributeError):
                paths = []
            if not paths:
                return self.send(400, {"error": 'request body must be {"paths": [ ... ]} and non-empty'})
            parts = []
            for raw in paths:
                target = self.resolve(sandbox, raw)
                if target is None or not os.path.isfile(target):
                    status, code = (403, "FILE_ACCESS_DENIED") if target is None else (404, "FILE_NOT_FOUND")
                    message = f"permission denied: {raw}" if target is None else f"file not found: {raw}"
                    payload = json.dumps({"statusCode": status, "message": message, "code": code,
                                          "timestamp": now(), "path": raw, "method": "POST"},
                                         ensure_ascii=False, separators=(",", ":")).encode()
                    head = (f"Content-Disposition: {part_disposition('error', raw)}\r\n".encode("latin-1")
                            + b"Content-Type: application/json; charset=utf-8\r\n\r\n")
                else:
                    with open(target, "rb") as f:
                        payload = f.read()
                    head = (f"Content-Disposition: {part_disposition('file', raw)}\r\n".encode("latin-1")
                            + f"Content-Length: {len(payload)}\r\n".encode()
                            + b"Content-Type: application/octet-stream\r\n\r\n")
                parts.append(head + payload)
            data = b"".join(
                (b"--" if i == 0 else b"\r\n--") + BOUNDARY.encode() + b"\r\n" + part for i, part in enumerate(parts)
            )
            data += b"\r\n--" + BOUNDARY.encode() + b"--\r\n"
            return self.send(200, data, f"multipart/form-data; boundary={BOUNDARY}")
        if path == "/files" and method == "DELETE":
            target = self.resolve(sandbox, query.get("path", ""))
            if target is None:
                return self.toolbox_error(403, "path outside the sandbox", "FORBIDDEN")
            if not os.path.lexists(target):
                return self.toolbox_error(404, f"file not found: {query.get('path', '')}", "FILE_NOT_FOUND")
            if os.path.isdir(target) and not os.path.islink(target):
                if query.get("recursive") != "true":
                    return self.toolbox_error(400, "path is a directory: use recursive", "BAD_REQUEST")
                shutil.rmtree(target)
            else:
                os.remove(target)
            return self.send(204)
        if path == "/files/folder" and method == "POST":
            target = self.resolve(sandbox, query.get("path", ""))
            if target is None:
                return self.toolbox_error(403, "path outside the sandbox", "FORBIDDEN")
            os.makedirs(target, mode=int(query.get("mode", "755"), 8), exist_ok=True)
            return self.send(201)
        if path == "/files/download" and method == "GET":
            target = self.resolve(sandbox, query.get("path", ""))
            if target is None:
                return self.toolbox_error(403, "path outside the sandbox", "FORBIDDEN")
            if not os.path.isfile(target):
                return self.toolbox_error(404, f"file not found: {query.get('path', '')}", "FILE_NOT_FOUND")
            name = os.path.basename(target)
            try:
                return stream_file(self, target, grown(target),
                                   [("Content-Disposition", f'attachment; filename="{name}"')])
            except (BrokenPipeError, ConnectionResetError):
                # The client stopped reading (a download cut off at its bound).
                self.close_connection = True
                return None
        return self.toolbox_error(404, f"no route {method} {path}", "NOT_FOUND")


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--record")
    # Daemons before the terminate route: a cancel must delete the session instead.
    parser.add_argument("--no-terminate", action="store_true")
    # A network that drops each command's first log stream after this many bytes.
    parser.add_argument("--drop-logs-after", type=int)
    # Every file the daemon side writes in a sandbox (uploads, logs, cmd.sh), as JSON lines {path, mode, data}.
    parser.add_argument("--record-files")
    # The snapshots `GET /snapshots/{name}` knows (general ones, as Daytona's own are).
    parser.add_argument("--snapshots", default=DEFAULT_SNAPSHOT)
    # The shell of the daemon's sessions (the snapshot's zsh, else bash or dash): it runs the output labellers.
    parser.add_argument("--session-shell", choices=("zsh", "bash", "dash"), default="zsh")
    # How long a start or stop takes (0: done by the next request); a delete meanwhile is refused with 409.
    parser.add_argument("--state-change-seconds", type=float, default=0.0)
    # What the control plane reports as the sandboxes' daemon version.
    parser.add_argument("--daemon-version", default="fake")
    # Seconds before the session's shell starts each command (and so before its input pipe exists).
    parser.add_argument("--command-start-delay", type=float, default=0.0)
    # A download of a file named NAME serves BYTES more zero bytes than it holds, without a length (repeatable).
    parser.add_argument("--grow", action="append", default=[])
    ARGS = parser.parse_args()
    os.makedirs(ARGS.root, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)

    def watch_stdin():
        # The test's end: stdin closes when the test process goes.
        sys.stdin.read()
        with LOCK:
            for sandbox in SANDBOXES.values():
                sandbox.kill_everything()
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
