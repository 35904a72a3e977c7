#!/usr/bin/env python3
"""A fake E2B cloud for tests/e2b.rs: the REST control plane and envd, on two ports of 127.0.0.1.

Usage: fake_e2b.py --root DIR --record FILE [--api-key KEY] [--templates base,other] [--own-templates other]
    [--template-path NAME=PATH] [--grow NAME=BYTES]
Prints `PORTS <api> <envd>` on stdout once both listen, then serves until killed or until stdin closes.
Point a client at it with E2B_API_URL=http://127.0.0.1:<api> and E2B_SANDBOX_URL=http://127.0.0.1:<envd>
(with one sandbox URL for all sandboxes, envd requests are routed by their `E2b-Sandbox-Id` header, as
E2B's own proxy does at https://sandbox.<domain>).

Control plane (`X-API-Key` must be the key; anything else is 401 as E2B answers it):
  POST /v2/sandboxes and /sandboxes (create, 201), GET /v2/sandboxes (list), GET /sandboxes/{id},
  POST /v2/sandboxes/{id}/connect and /sandboxes/{id}/connect (200 running, 201 resumed),
  POST /sandboxes/{id}/resume, /pause (409 when paused), /timeout, /refreshes; DELETE /sandboxes/{id};
  GET /templates/aliases/{alias} (200 {templateID, public} for --own-templates, 403 for the other --templates,
  404 for the rest).
  A sandbox's TTL really expires: it is paused when created with `autoPause`, killed otherwise.
envd (`X-Access-Token` must be the sandbox's current token): Connect-RPC with the JSON codec —
  process.Process/Start and /Connect as server streams (envelopes: start, data stdout/stderr base64,
  keepalive, end, then the end-stream frame), /List, /SendSignal, /SendInput, /CloseStdin (unary JSON);
  GET and POST /files (an octet-stream body, or multipart `file` parts each written to `path` or else to its
  filename; gzip Content-Encoding undone; a download is streamed, and with `--grow NAME=BYTES` a file named NAME
  comes with BYTES zero bytes more, chunked without a length, as a file still growing); GET /health.
A paused sandbox's processes are stopped (SIGSTOP) and its open streams are cut, as a memory snapshot does;
envd traffic to a paused sandbox created with `autoResume` resumes it, otherwise it gets 502 like E2B's proxy.

The sandbox's home is the directory DIR/<sandbox id>/home/user: processes really run on the host, under
bubblewrap only so that this directory is their /home/user (no isolation: this is a fake; the rest of the
filesystem, the host's other homes included, is the host's), with only the environment the sandbox and the request
give. A template's PATH is the fake's own unless `--template-path NAME=PATH` (repeatable) gives it one, as a
template's image sets it (e.g. one with Node.js and npm, or one without). The files API maps every sandbox path below DIR/<id> (relative paths are below /home/user), so only
/home/user is shared with the processes.

Test hooks on the API port (no key needed): POST /_fake/fail {"status", "message", "count"} makes the next
`count` control-plane requests fail with that status; GET /_fake/state describes every sandbox and process.
Every request is appended to FILE as one JSON line: {"port": "api"|"envd", "method", "path", "headers", "body"}
(the body as text when it is UTF-8, else base64 under "body_b64").
"""

import argparse
import base64
import datetime
import gzip
import json
import os
import queue
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENVD_VERSION = "0.5.7"
ENVD_PORT = 49983
HOME = "/home/user"
LOCK = threading.RLock()
RECORD_LOCK = threading.Lock()
SANDBOXES = {}
FAILURES = []
ARGS = None
TEMPLATE_PATHS = {}

BWRAP = shutil.which("bwrap")
SIGNALS = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM}
# How Go's os.ProcessState.String() (what envd reports as `status`) names the signals.
GO_SIGNAL_NAMES = {9: "killed", 15: "terminated", 2: "interrupt", 1: "hangup"}


def now_iso(offset=0.0):
    moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset)
    return moment.isoformat().replace("+00:00", "Z")


class Process:
    """One command running in a sandbox: its host process and the streams attached to it."""

    def __init__(self, sandbox, popen, config, tag):
        self.sandbox = sandbox
        self.popen = popen
        self.pid = popen.pid
        self.config = config
        self.tag = tag
        self.subscribers = []
        self.end = None
        self.lock = threading.Lock()

    def publish(self, event):
        with self.lock:
            if "end" in event:
                self.end = event
            for sub in list(self.subscribers):
                sub.put(event)

    def subscribe(self):
        sub = queue.Queue()
        with self.lock:
            if self.end is not None:
                sub.put(self.end)
            else:
                self.subscribers.append(sub)
        return sub

    def unsubscribe(self, sub):
        with self.lock:
            if sub in self.subscribers:
                self.subscribers.remove(sub)

    def cut_streams(self):
        """What a pause does to open HTTP streams: they end without an end event."""
        with self.lock:
            for sub in self.subscribers:
                sub.put(None)
            self.subscribers = []

    def pump(self, pipe, name):
        while True:
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                return
            self.publish({"data": {name: base64.b64encode(chunk).decode()}})

    def watch(self, readers):
        status = self.popen.wait()
        # envd's pipes close when the process exits: a grandchild still holding them does not delay the end.
        for reader in readers:
            reader.join(timeout=1.0)
        if status >= 0:
            end = {"exited": True, "status": f"exit status {status}"}
            if status != 0:
                end["exitCode"] = status
        else:
            end = {"exitCode": -1, "status": "signal: " + GO_SIGNAL_NAMES.get(-status, str(-status))}
        with LOCK:
            self.sandbox["processes"].pop(self.pid, None)
        self.publish({"end": end})

    def describe(self):
        info = {"config": self.config, "pid": self.pid}
        if self.tag is not None:
            info["tag"] = self.tag
        return info


SPAWNS = queue.Queue()


def spawner():
    """Starts every process: bwrap's --die-with-parent follows the thread that forked it, so that thread lives as
    long as the fake (a request's thread ends with its stream, a pause cuts streams)."""
    while True:
        argv, options, answer = SPAWNS.get()
        try:
            answer.put(subprocess.Popen(argv, **options))
        except OSError as err:
            answer.put(err)


def spawn(argv, **options):
    answer = queue.Queue()
    SPAWNS.put((argv, options, answer))
    result = answer.get()
    if isinstance(result, OSError):
        raise result
    return result


def sandbox_dir(sbx):
    return os.path.join(ARGS.root, sbx["id"])


def host_path(sbx, path):
    """The host path standing for `path` inside the sandbox."""
    if not path.startswith("/"):
        path = HOME + "/" + path
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None
    return os.path.join(sandbox_dir(sbx), *parts)


def new_sandbox(body):
    sid = "i" + secrets.token_hex(10)
    sbx = {
        "id": sid,
        "template": body["templateID"],
        "client": "fakeclient",
        "metadata": body.get("metadata") or {},
        "env": body.get("envVars") or {},
        "auto_pause": bool(body.get("autoPause", False)),
        "auto_resume": bool((body.get("autoResume") or {}).get("enabled", False)),
        "state": "running",
        "token": secrets.token_hex(16),
        "started": now_iso(),
        "timeout": int(body.get("timeout", 15)),
        "deadline": time.monotonic() + int(body.get("timeout", 15)),
        "processes": {},
        "pauses": 0,
        "resumes": 0,
    }
    os.makedirs(os.path.join(sandbox_dir(sbx), "home", "user"), exist_ok=True)
    os.makedirs(os.path.join(sandbox_dir(sbx), "tmp"), exist_ok=True)
    return sbx


def sandbox_json(sbx):
    return {
        "templateID": sbx["template"],
        "sandboxID": sbx["id"],
        "clientID": sbx["client"],
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sbx["token"],
        "domain": None,
    }


def detail_json(sbx):
    detail = sandbox_json(sbx)
    detail.update({
        "startedAt": sbx["started"],
        "endAt": now_iso(max(0.0, sbx["deadline"] - time.monotonic())),
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "metadata": sbx["metadata"],
        "state": sbx["state"],
        "lifecycle": {"autoResume": sbx["auto_resume"], "onTimeout": "pause" if sbx["auto_pause"] else "kill"},
    })
    return detail


def pause(sbx):
    sbx["state"] = "paused"
    sbx["pauses"] += 1
    for proc in sbx["processes"].values():
        try:
            os.killpg(proc.pid, signal.SIGSTOP)
        except OSError:
            pass
        proc.cut_streams()


def resume(sbx, timeout, new_token=True):
    sbx["state"] = "running"
    sbx["resumes"] += 1
    if new_token:
        sbx["token"] = secrets.token_hex(16)
    sbx["deadline"] = time.monotonic() + timeout
    for proc in sbx["processes"].values():
        try:
            os.killpg(proc.pid, signal.SIGCONT)
        except OSError:
            pass


def kill(sbx):
    for proc in list(sbx["processes"].values()):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.cut_streams()
    SANDBOXES.pop(sbx["id"], None)


def expire_loop():
    while True:
        time.sleep(0.1)
        with LOCK:
            for sbx in list(SANDBOXES.values()):
                if sbx["state"] == "running" and time.monotonic() >= sbx["deadline"]:
                    if sbx["auto_pause"]:
                        pause(sbx)
                    else:
                        kill(sbx)


def envelope(flags, message):
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def parse_envelope(body):
    if len(body) < 5:
        raise ValueError("a Connect envelope needs 5 bytes of header")
    flags, length = struct.unpack(">BI", body[:5])
    if flags & 0x01:
        raise ValueError("compressed envelopes are not accepted")
    if len(body) != 5 + length:
        raise ValueError(f"envelope length {length} does not match the body's {len(body) - 5} bytes")
    return json.loads(body[5:])


def parse_multipart(content_type, body):
    boundary = None
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key == "boundary":
            boundary = value.strip('"')
    if not boundary:
        return None
    files = []
    for chunk in body.split(b"--" + boundary.encode())[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, content = chunk.partition(b"\r\n\r\n")
        if content.endswith(b"\r\n"):
            content = content[:-2]
        disposition = ""
        for line in head.decode("utf-8", "replace").split("\r\n"):
            if line.lower().startswith("content-disposition:"):
                disposition = line
        fields = {}
        for item in disposition.split(";")[1:]:
            key, _, value = item.strip().partition("=")
            fields[key] = value.strip('"')
        if fields.get("name") == "file":
            files.append((fields.get("filename"), content))
    return files


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
    port_name = "?"

    def log_message(self, *args):
        pass

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
            return data
        return self.rfile.read(length) if length else b""

    def record(self, body):
        entry = {"port": self.port_name, "method": self.command, "path": self.path,
                 "headers": {k.lower(): v for k, v in self.headers.items()}}
        try:
            entry["body"] = body.decode()
        except UnicodeDecodeError:
            entry["body_b64"] = base64.b64encode(body).decode()
        with RECORD_LOCK, open(ARGS.record, "a") as out:
            out.write(json.dumps(entry) + "\n")

    def send(self, status, payload=None, content_type="application/json", raw=None):
        data = raw if raw is not None else (b"" if payload is None else json.dumps(payload).encode())
        self.send_response(status)
        if data or status != 204:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def handle_any(self):
        body = self.read_body()
        self.record(body)
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        try:
            self.route(url.path, query, body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = do_POST = do_DELETE = do_PUT = handle_any


class ApiHandler(Handler):
    port_name = "api"

    def error(self, status, message):
        self.send(status, {"code": status, "message": message})

    def route(self, path, query, body):
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["_fake"]:
            return self.fake_hook(parts[1:], body)
        if self.headers.get("X-API-Key") != ARGS.api_key:
            return self.error(401, "Invalid API key, it must start with 'e2b_' prefix")
        with LOCK:
            if FAILURES:
                failure = FAILURES[0]
                failure["count"] -= 1
                if failure["count"] <= 0:
                    FAILURES.pop(0)
                return self.error(failure["status"], failure.get("message", "injected failure"))
        if parts[:1] == ["v2"]:
            parts = parts[1:]
        if parts[:2] == ["templates", "aliases"] and len(parts) == 3 and self.command == "GET":
            # E2B answers the team's own alias with its id, one of another team (E2B's public `base`) with 403.
            alias = urllib.parse.unquote(parts[2])
            if alias in ARGS.own_templates.split(","):
                return self.send(200, {"templateID": alias, "public": False})
            if alias in ARGS.templates.split(","):
                return self.error(403, "You don't have access to this template alias")
            return self.error(404, f"template '{alias}' not found")
        if parts[:1] != ["sandboxes"]:
            return self.error(404, f"no route {path}")
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            return self.error(400, "the body is not JSON")
        with LOCK:
            if len(parts) == 1 and self.command == "POST":
                return self.create(data)
            if len(parts) == 1 and self.command == "GET":
                states = query.get("state", "running,paused").split(",")
                listed = [detail_json(s) for s in SANDBOXES.values() if s["state"] in states]
                return self.send(200, listed)
            sbx = SANDBOXES.get(parts[1])
            if sbx is None:
                return self.error(404, f"sandbox \"{parts[1]}\" doesn't exist or you don't have access to it")
            action = parts[2] if len(parts) > 2 else None
            if action is None and self.command == "GET":
                return self.send(200, detail_json(sbx))
            if action is None and self.command == "DELETE":
                kill(sbx)
                return self.send(204)
            if action in ("connect", "resume") and self.command == "POST":
                timeout = int(data.get("timeout", 15))
                if sbx["state"] == "paused":
                    resume(sbx, timeout)
                    return self.send(201, sandbox_json(sbx))
                if action == "resume":
                    return self.error(409, f"sandbox {sbx['id']} is already running")
                sbx["deadline"] = max(sbx["deadline"], time.monotonic() + timeout)
                return self.send(200, sandbox_json(sbx))
            if action == "pause" and self.command == "POST":
                if sbx["state"] == "paused":
                    return self.error(409, f"sandbox {sbx['id']} is already paused")
                pause(sbx)
                return self.send(204)
            if action == "timeout" and self.command == "POST":
                if not isinstance(data.get("timeout"), int):
                    return self.error(400, "timeout must be an integer")
                sbx["deadline"] = time.monotonic() + data["timeout"]
                return self.send(204)
            if action == "refreshes" and self.command == "POST":
                sbx["deadline"] = time.monotonic() + int(data.get("duration", 60))
                return self.send(204)
        return self.error(404, f"no route {self.command} {path}")

    def create(self, data):
        template = data.get("templateID")
        if not isinstance(template, str) or not template:
            return self.error(400, "templateID is required")
        if template not in ARGS.templates.split(",") + ARGS.own_templates.split(","):
            return self.error(404, f"template '{template}' not found")
        for field in ("metadata", "envVars"):
            value = data.get(field, {})
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                return self.error(400, f"{field} must be a map of strings")
        sbx = new_sandbox(data)
        SANDBOXES[sbx["id"]] = sbx
        return self.send(201, sandbox_json(sbx))

    def fake_hook(self, parts, body):
        if parts == ["fail"] and self.command == "POST":
            failure = json.loads(body)
            failure.setdefault("count", 1)
            with LOCK:
                FAILURES.append(failure)
            return self.send(204)
        if parts == ["state"] and self.command == "GET":
            with LOCK:
                state = {sid: {"state": s["state"], "template": s["template"], "metadata": s["metadata"],
                               "env": s["env"], "dir": sandbox_dir(s), "pauses": s["pauses"],
                               "resumes": s["resumes"], "autoPause": s["auto_pause"],
                               "autoResume": s["auto_resume"], "timeout": s["timeout"],
                               "processes": [dict(p.describe(), streams=len(p.subscribers))
                                             for p in s["processes"].values()]}
                         for sid, s in SANDBOXES.items()}
            return self.send(200, state)
        return self.send(404, {"code": 404, "message": "no such hook"})


class EnvdHandler(Handler):
    port_name = "envd"

    def connect_error(self, status, code, message):
        self.send(status, {"code": code, "message": message})

    def route(self, path, query, body):
        if path == "/health":
            return self.send(204)
        sid = self.headers.get("E2b-Sandbox-Id")
        with LOCK:
            sbx = SANDBOXES.get(sid or "")
            if sbx is None:
                return self.send(502, {"code": 502, "message": f"The sandbox {sid} was not found",
                                       "sandboxId": sid}, )
            if self.headers.get("E2b-Sandbox-Port") != str(ENVD_PORT):
                return self.send(502, {"code": 502, "message": "the sandbox port is not open"})
            if sbx["state"] == "paused":
                if not sbx["auto_resume"]:
                    return self.send(502, {"code": 502, "message": f"The sandbox {sid} is paused"})
                # An auto-resumed sandbox keeps serving the token its client already holds.
                resume(sbx, sbx["timeout"], new_token=False)
            if self.headers.get("X-Access-Token") != sbx["token"]:
                return self.connect_error(401, "unauthenticated", "invalid access token")
        if path == "/files":
            return self.files(sbx, query, body)
        if not path.startswith("/process.Process/"):
            return self.connect_error(404, "unimplemented", f"{path} is not implemented")
        method = path.rsplit("/", 1)[1]
        if self.headers.get("Connect-Protocol-Version") != "1":
            return self.connect_error(400, "invalid_argument", "missing Connect-Protocol-Version: 1")
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if method in ("Start", "Connect"):
            if content_type != "application/connect+json":
                return self.send(415, raw=b"", content_type="text/plain")
            try:
                request = parse_envelope(body)
            except ValueError as err:
                return self.stream_error(f"bad envelope: {err}")
            return self.start(sbx, request) if method == "Start" else self.attach(sbx, request)
        if content_type != "application/json":
            return self.send(415, raw=b"", content_type="text/plain")
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            return self.connect_error(400, "invalid_argument", "the body is not JSON")
        unary = {"List": self.list, "SendSignal": self.send_signal, "SendInput": self.send_input,
                 "CloseStdin": self.close_stdin}.get(method)
        if unary is None:
            return self.connect_error(404, "unimplemented", f"process.Process/{method} is not implemented")
        return unary(sbx, request)

    def select(self, sbx, request):
        selector = request.get("process") or {}
        with LOCK:
            if "pid" in selector:
                return sbx["processes"].get(int(selector["pid"]))
            for proc in sbx["processes"].values():
                if "tag" in selector and proc.tag == selector["tag"]:
                    return proc
        return None

    def start(self, sbx, request):
        config = request.get("process") or {}
        if not config.get("cmd"):
            return self.stream_error("process.cmd is required", code="invalid_argument")
        cwd = config.get("cwd") or HOME
        inside_home = cwd == HOME or cwd.startswith(HOME + "/")
        host_cwd = host_path(sbx, cwd) if inside_home else cwd
        if host_cwd is None or not os.path.isdir(host_cwd):
            return self.stream_error(f"cwd '{config.get('cwd')}' does not exist", code="invalid_argument")
        default_path = TEMPLATE_PATHS.get(sbx["template"], os.environ.get("PATH", "/usr/bin:/bin"))
        env = {"PATH": default_path, "HOME": HOME,
               "USER": "user", "E2B_SANDBOX": "true", "E2B_SANDBOX_ID": sbx["id"]}
        env.update(sbx["env"])
        env.update(config.get("envs") or {})
        # envd's exec fails before the process exists (no start event): bwrap would fail after it started.
        program = config["cmd"]
        if "/" in program:
            visible = host_path(sbx, program) if program.startswith(HOME + "/") else program
            found = os.path.isfile(visible) and os.access(visible, os.X_OK)
        else:
            found = shutil.which(program, path=env["PATH"]) is not None
        if not found:
            return self.stream_error(f"error starting process '{program}': exec: \"{program}\": "
                                     "executable file not found in $PATH")
        use_stdin = bool(request.get("stdin", False))
        try:
            # bwrap execs the command as its child, so the pid envd reports is bwrap's; it dies with bwrap.
            # The host's other homes stay visible (a checkout, and so the fake CLIs, may live there).
            homes = [arg for name in sorted(os.listdir("/home")) if name != "user"
                     for arg in ("--bind-try", f"/home/{name}", f"/home/{name}")]
            argv = [BWRAP, "--dev-bind", "/", "/", "--tmpfs", "/home", *homes, "--bind", host_path(sbx, HOME), HOME,
                    "--die-with-parent", "--chdir", cwd, "--", config["cmd"], *config.get("args", [])]
            popen = spawn(argv, env=env, stdin=subprocess.PIPE if use_stdin else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as err:
            return self.stream_error(f"error starting process '{config['cmd']}': {err}")
        proc = Process(sbx, popen, config, request.get("tag"))
        sub = proc.subscribe()
        with LOCK:
            sbx["processes"][proc.pid] = proc
        readers = [threading.Thread(target=proc.pump, args=(pipe, name), daemon=True)
                   for pipe, name in ((popen.stdout, "stdout"), (popen.stderr, "stderr"))]
        for reader in readers:
            reader.start()
        threading.Thread(target=proc.watch, args=(readers,), daemon=True).start()
        self.stream(proc, sub)

    def attach(self, sbx, request):
        proc = self.select(sbx, request)
        if proc is None:
            return self.stream_error("process not found", code="not_found")
        self.stream(proc, proc.subscribe())

    def begin_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/connect+json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def stream_error(self, message, code="unknown"):
        self.begin_stream()
        self.chunk(envelope(0x02, {"error": {"code": code, "message": message}}))
        self.chunk(b"")

    def stream(self, proc, sub):
        interval = float(self.headers.get("Keepalive-Ping-Interval") or 0) or None
        self.begin_stream()
        try:
            self.chunk(envelope(0, {"event": {"start": {"pid": proc.pid}}}))
            while True:
                try:
                    event = sub.get(timeout=interval)
                except queue.Empty:
                    self.chunk(envelope(0, {"event": {"keepalive": {}}}))
                    continue
                if event is None:
                    # Cut by a pause: the connection dies mid-stream, as it does when E2B snapshots a sandbox.
                    self.close_connection = True
                    return
                self.chunk(envelope(0, {"event": event}))
                if "end" in event:
                    break
            self.chunk(envelope(0x02, {}))
            self.chunk(b"")
        finally:
            proc.unsubscribe(sub)

    def list(self, sbx, _request):
        with LOCK:
            processes = [p.describe() for p in sbx["processes"].values()]
        self.send(200, {"processes": processes})

    def send_signal(self, sbx, request):
        proc = self.select(sbx, request)
        if proc is None:
            return self.connect_error(404, "not_found", "process not found")
        sig = SIGNALS.get(request.get("signal"))
        if sig is None:
            return self.connect_error(400, "invalid_argument", f"invalid signal: {request.get('signal')}")
        try:
            # envd signals the process it started, not its group.
            os.kill(proc.pid, sig)
        except OSError as err:
            return self.connect_error(500, "internal", f"error sending signal: {err}")
        self.send(200, {})

    def send_input(self, sbx, request):
        proc = self.select(sbx, request)
        if proc is None:
            return self.connect_error(404, "not_found", "process not found")
        if proc.popen.stdin is None:
            return self.connect_error(412, "failed_precondition", "stdin not enabled or closed")
        data = base64.b64decode((request.get("input") or {}).get("stdin", ""))
        try:
            proc.popen.stdin.write(data)
            proc.popen.stdin.flush()
        except OSError as err:
            return self.connect_error(500, "internal", f"error writing to stdin: {err}")
        self.send(200, {})

    def close_stdin(self, sbx, request):
        proc = self.select(sbx, request)
        if proc is None:
            return self.connect_error(404, "not_found", "process not found")
        if proc.popen.stdin is not None:
            proc.popen.stdin.close()
            proc.popen.stdin = None
        self.send(200, {})

    def files(self, sbx, query, body):
        path = query.get("path")
        if self.command == "POST":
            return self.upload(sbx, path, body)
        if not path:
            return self.send(400, {"code": 400, "message": "path is required"})
        target = host_path(sbx, path)
        if target is None:
            return self.send(400, {"code": 400, "message": f"path '{path}' leaves the filesystem"})
        if self.command == "GET":
            if not os.path.isfile(target):
                return self.send(404, {"code": 404, "message": f"path '{path}' does not exist"})
            return stream_file(self, target, grown(target))
        return self.send(405, {"code": 405, "message": "method not allowed"})

    def upload(self, sbx, path, body):
        """envd's POST /files: a raw body to `path`, or multipart `file` parts, each to `path` or else to the path
        its filename gives; a gzip Content-Encoding is undone first. Answers the entries written."""
        def fail(message):
            return self.send(400, {"code": 400, "message": message})

        encoding = (self.headers.get("Content-Encoding") or "").split(";")[0].strip().lower()
        if encoding == "gzip":
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError) as err:
                return fail(f"error decompressing request body: {err}")
        elif encoding not in ("", "identity"):
            return fail(f"unsupported Content-Encoding: {self.headers.get('Content-Encoding')}, supported: [gzip]")
        content_type = self.headers.get("Content-Type") or ""
        media = content_type.split(";")[0].strip().lower()
        if media == "application/octet-stream":
            if not path:
                return fail("path query parameter is required for raw body upload")
            uploads = [(path, body)]
        elif media.startswith("multipart/"):
            parts = parse_multipart(content_type, body)
            if parts is None:
                return self.send(500, {"code": 500, "message": "error parsing multipart form: no boundary"})
            uploads = [(path or filename, content) for filename, content in parts]
        else:
            return fail(f"unsupported content type: {content_type}, expected multipart/form-data or "
                        "application/octet-stream")
        written = []
        for name, content in uploads:
            if not name:
                return fail("filename not found in Content-Disposition header")
            shown = os.path.normpath(name if name.startswith("/") else HOME + "/" + name)
            if any(entry["path"] == shown for entry in written):
                return fail(f"you cannot upload multiple files to the same path '{shown}' in one upload request, "
                            "only the first specified file was uploaded")
            target = host_path(sbx, shown)
            if target is None:
                return fail(f"path '{name}' leaves the filesystem")
            if os.path.isdir(target):
                return fail(f"path is a directory: {shown}")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as dst:
                dst.write(content)
            written.append({"path": shown, "name": os.path.basename(shown), "type": "file"})
        self.send(200, written)


def serve(handler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--api-key", default="e2b_0123456789abcdef0123456789abcdef")
    parser.add_argument("--templates", default="base")
    # Of those, the ones the key's team owns (the rest answer `GET /templates/aliases/{alias}` as E2B's public ones).
    parser.add_argument("--own-templates", default="")
    parser.add_argument("--template-path", action="append", default=[])
    # A download of a file named NAME serves BYTES more zero bytes than it holds, without a length (repeatable).
    parser.add_argument("--grow", action="append", default=[])
    ARGS = parser.parse_args()
    for entry in ARGS.template_path:
        name, _, path = entry.partition("=")
        TEMPLATE_PATHS[name] = path
    if BWRAP is None:
        sys.exit("fake_e2b.py needs bubblewrap (bwrap) to show each sandbox its own /home/user")
    os.makedirs(ARGS.root, exist_ok=True)
    api, envd = serve(ApiHandler), serve(EnvdHandler)
    threading.Thread(target=expire_loop, daemon=True).start()
    threading.Thread(target=spawner, daemon=True).start()
    print(f"PORTS {api.server_address[1]} {envd.server_address[1]}", flush=True)
    sys.stdin.read()
    with LOCK:
        for sbx in list(SANDBOXES.values()):
            kill(sbx)


if __name__ == "__main__":
    main()
