#!/usr/bin/python3
"""A fake `opencode serve` (OpenCode 1.18's HTTP API, as far as acp-sandbox uses it) for the warm-server fault tests.

Usage: fake_serve.py serve --hostname 127.0.0.1 --port PORT   (fake_cli.py hands `opencode serve` here when
$OPENCODE_FAKE_SERVE=1; without it the fake `opencode` has no server, like a CLI without one)

Every request needs HTTP basic auth `opencode:$OPENCODE_SERVER_PASSWORD`. Routes: GET /global/health, GET /event
(server-sent events, one `server.connected` first), POST /session, GET|PATCH /session/ID, GET /agent, GET /command,
GET /config/providers, POST /session/ID/prompt_async, POST /session/ID/abort, POST /permission/ID/reply, DELETE
/session/ID. What the bridge sent is appended to <cwd>/.fake-serve/{prompt,patch,delete}.log, a JSON line each
naming the server (a random id of each start). Event
shapes are those of the real captures (tests/fixtures/opencode-serve/events-tokens.jsonl). Sessions are kept in
$XDG_DATA_HOME/opencode/fake-serve-sessions.json, so a restarted server continues them, like OpenCode's database.

On start it prints the bridge's guard marker on stderr (what the guard plugin prints in the real server) and writes
its pid to <cwd>/.fake-serve/server.pid. A prompt picks its behaviour with `FAULT:<name>[:<n>]`:
  (none)      a short text answer `turn <k> of <session>` (k counts the session's prompts across restarts);
  slow        a delta every 100 ms until aborted (then idle, like OpenCode);
  stop        one delta, then SIGSTOP of itself;
  noabort     one delta, then nothing; POST /abort is never answered;
  noclose     one delta, then nothing; POST /abort answers `true` but the session never goes idle;
  huge:<MiB>  one `message.part.updated` of that many MiB of text (streamed, never held whole), then the answer;
  badutf8     a delta event whose data has bytes that are not UTF-8, then the answer;
  deltas:<n>  n deltas of 1 KiB each in one part, then the finished part (n KiB of text in one event), idle;
  die:<sig>   one delta, then kills itself with that signal number;
  balloon     one delta, then allocates (and touches) memory 32 MiB at a time until something stops it;
  ask         asks `permission.asked` for bash `git status` (always: `git status *`), waits for the reply (logged
              in reply.log), then the answer.
"""

import base64
import json
import os
import queue
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MARKER = "ACP_SANDBOX_SERVER_GUARD_ON"
VERSION = os.environ.get("OPENCODE_FAKE_VERSION", "1.18.33")
PASSWORD = os.environ.get("OPENCODE_SERVER_PASSWORD", "")
DATA = Path(os.environ.get("XDG_DATA_HOME", os.environ.get("HOME", "."))) / "opencode"
SESSIONS = DATA / "fake-serve-sessions.json"
LOCK = threading.Lock()
SUBSCRIBERS = []  # one bounded queue per open event stream
ABORTED = {}  # session id -> threading.Event of its running turn
REPLIES = {}  # permission request id -> threading.Event, set when the bridge replies
SERVER = uuid.uuid4().hex[:12]  # names this server in the logs (its pid may be the same in two PID namespaces)


def ident(prefix):
    return prefix + "_" + uuid.uuid4().hex[:26]


def load_sessions():
    try:
        return json.loads(SESSIONS.read_text())
    except (OSError, ValueError):
        return {}


def save_sessions(sessions):
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = SESSIONS.with_suffix(".tmp")
    tmp.write_text(json.dumps(sessions))
    os.replace(tmp, SESSIONS)


def session_info(sid):
    return {"id": sid, "slug": "fake", "version": VERSION, "projectID": "fake", "directory": os.getcwd(),
            "title": "Fake session", "time": {"created": 0, "updated": 0}}


def frame(obj):
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def publish(item):
    """Sends one event (bytes, or an iterable of byte chunks making one event) to every open stream; waits while a
    stream is behind, so a flood costs this process a bounded amount too."""
    with LOCK:
        subscribers = list(SUBSCRIBERS)
    for subscriber in subscribers:
        subscriber.put(item)


def event(kind, properties):
    publish(frame({"id": ident("evt"), "type": kind, "properties": properties}))


def status(sid, kind):
    event("session.status", {"sessionID": sid, "status": {"type": kind}})
    if kind == "idle":
        event("session.idle", {"sessionID": sid})


def text_part(sid, msg, prt, text):
    return {"sessionID": sid, "part": {"id": prt, "messageID": msg, "sessionID": sid, "type": "text", "text": text}}


def delta(sid, msg, prt, text):
    event("message.part.delta", {"sessionID": sid, "messageID": msg, "partID": prt, "field": "text", "delta": text})


def assistant(sid, msg, parent, finish=None):
    info = {"id": msg, "parentID": parent, "role": "assistant", "mode": "build", "agent": "build", "sessionID": sid,
            "modelID": "fake-model", "providerID": "fake", "time": {"created": 0},
            "tokens": {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}, "cost": 0}
    if finish:
        info["finish"] = finish
    event("message.updated", {"sessionID": sid, "info": info})


def finish(sid, msg):
    event("message.part.updated", {"sessionID": sid, "part": {
        "id": ident("prt"), "messageID": msg, "sessionID": sid, "type": "step-finish", "reason": "stop",
        "tokens": {"total": 3, "input": 2, "output": 1, "reasoning": 0, "cache": {"read": 0, "write": 0}},
        "cost": 0}})
    assistant(sid, msg, "", "stop")
    status(sid, "idle")


def huge_part(sid, msg, prt, mib):
    """One `message.part.updated` of `mib` MiB of text, as chunks made on the fly."""
    head, after = json.dumps(text_part(sid, msg, prt, "@@"), separators=(",", ":")).split("@@")
    chunk = b"x" * (1 << 20)
    yield b'data: {"id":"evt_huge","type":"message.part.updated","properties":' + head.encode()
    for _ in range(mib):
        yield chunk
    yield after.encode() + b"}\n\n"


def remember_fault(sid, prompt):
    """The session's running turn's fault, for the `/abort` handler."""
    fault = prompt.partition("FAULT:")[2].split(" ")[0].split(":")[0]
    Path(".fake-serve").mkdir(exist_ok=True)
    (Path(".fake-serve") / f"fault-{sid}").write_text(fault)


def record(what, obj):
    """Appends one line to .fake-serve/<what>.log, for the tests to read what the bridge asked of this server."""
    Path(".fake-serve").mkdir(exist_ok=True)
    with LOCK, (Path(".fake-serve") / f"{what}.log").open("a") as log:
        log.write(json.dumps(obj, separators=(",", ":"), sort_keys=True) + "\n")


def run_turn(sid, prompt):
    remember_fault(sid, prompt)
    done = threading.Event()
    ABORTED[sid] = done
    with LOCK:
        sessions = load_sessions()
        sessions.setdefault(sid, {"turns": 0})["turns"] += 1
        turns = sessions[sid]["turns"]
        save_sessions(sessions)
    user, msg, prt = ident("msg"), ident("msg"), ident("prt")
    status(sid, "busy")
    event("message.updated", {"sessionID": sid, "info": {"id": user, "role": "user", "sessionID": sid,
                                                         "time": {"created": 0}, "agent": "build"}})
    event("message.part.updated", text_part(sid, user, ident("prt"), prompt))
    assistant(sid, msg, user)
    event("message.part.updated", text_part(sid, msg, prt, ""))
    fault, _, arg = prompt.partition("FAULT:")[2].split(" ")[0].partition(":")
    if fault == "slow":
        n = 0
        while not done.wait(0.1):
            delta(sid, msg, prt, f"tick{n} ")
            n += 1
        return
    if fault in ("stop", "noabort", "noclose", "die", "balloon"):
        delta(sid, msg, prt, "working ")
        time.sleep(0.2)  # the delta is on its way before anything else happens
        if fault == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fault == "die":
            os.kill(os.getpid(), int(arg or "9"))
        elif fault == "balloon":
            hoard = []
            while True:
                hoard.append(bytearray(b"m" * (32 << 20)))
        while True:
            time.sleep(1000)
    if fault == "ask":
        request, replied = ident("per"), threading.Event()
        REPLIES[request] = replied
        event("permission.asked", {"id": request, "sessionID": sid, "permission": "bash",
                                   "patterns": ["git status"], "always": ["git status *"], "metadata": {}})
        replied.wait(30)
    if fault == "huge":
        publish(huge_part(sid, msg, ident("prt"), int(arg or "512")))
    elif fault == "badutf8":
        publish(b'data: {"id":"evt_bad","type":"message.part.delta","properties":{"sessionID":"' + sid.encode()
                + b'","messageID":"' + msg.encode() + b'","partID":"' + prt.encode()
                + b'","field":"text","delta":"bad \xff\xfe bytes "}}\n\n')
    elif fault == "deltas":
        piece = ("d" * 1023) + " "
        count = int(arg or "300000")
        for _ in range(count):
            delta(sid, msg, prt, piece)
        head, tail = json.dumps(text_part(sid, msg, prt, "@@"), separators=(",", ":")).split("@@")

        def whole():
            yield b'data: {"id":"evt_whole","type":"message.part.updated","properties":' + head.encode()
            block = piece.encode() * 1024
            for _ in range(count // 1024):
                yield block
            yield piece.encode() * (count % 1024)
            yield tail.encode() + b"}\n\n"
        publish(whole())
        finish(sid, msg)
        return
    delta(sid, msg, prt, f"turn {turns} of {sid}")
    finish(sid, msg)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self):
        expected = "Basic " + base64.b64encode(f"opencode:{PASSWORD}".encode()).decode()
        if self.headers.get("Authorization") != expected:
            self.reply(401, {"error": "unauthorized"})
            return False
        return True

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw.strip() else {}

    def do_GET(self):
        if not self.authorized():
            return
        path = self.path.split("?")[0]
        if path == "/global/health":
            return self.reply(200, {"healthy": True, "version": VERSION})
        if path == "/event":
            return self.stream()
        if path == "/agent":
            return self.reply(200, [{"name": "build", "mode": "primary", "permission": []},
                                    {"name": "plan", "mode": "primary",
                                     "permission": [{"permission": "edit", "pattern": "*", "action": "deny"}]}])
        if path == "/command":
            return self.reply(200, [])
        if path == "/config/providers":
            return self.reply(200, {"providers": [], "default": {}})
        if path.startswith("/session/"):
            sid = path.split("/")[2]
            if sid in load_sessions():
                return self.reply(200, session_info(sid))
            return self.reply(404, {"name": "NotFoundError", "data": {"message": f"Session not found: {sid}"}})
        self.reply(404, {"error": "no route"})

    def do_PATCH(self):
        if not self.authorized():
            return
        body = self.body()
        sid = self.path.split("?")[0].split("/")[2]
        record("patch", {"server": SERVER, "session": sid, "permission": body.get("permission")})
        self.reply(200, session_info(sid))

    def do_DELETE(self):
        if not self.authorized():
            return
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 2 and parts[0] == "session":
            with LOCK:
                sessions = load_sessions()
                found = sessions.pop(parts[1], None) is not None
                save_sessions(sessions)
            record("delete", {"server": SERVER, "session": parts[1], "found": found})
            if found:
                event("session.deleted", {"sessionID": parts[1], "info": session_info(parts[1])})
                return self.reply(200, True)
            return self.reply(404, {"name": "NotFoundError", "data": {"message": f"Session not found: {parts[1]}"}})
        self.reply(404, {"error": "no route"})

    def do_POST(self):
        if not self.authorized():
            return
        body = self.body()
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts == ["session"]:
            sid = ident("ses")
            with LOCK:
                sessions = load_sessions()
                sessions[sid] = {"turns": 0}
                save_sessions(sessions)
            event("session.created", {"sessionID": sid, "info": session_info(sid)})
            return self.reply(200, session_info(sid))
        if len(parts) == 3 and parts[0] == "session" and parts[2] == "prompt_async":
            prompt = " ".join(p.get("text", "") for p in body.get("parts", []) if p.get("type") == "text")
            record("prompt", {"server": SERVER, "session": parts[1], "text": prompt, "agent": body.get("agent"),
                              "model": body.get("model")})
            threading.Thread(target=run_turn, args=(parts[1], prompt), daemon=True).start()
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if len(parts) == 3 and parts[0] == "session" and parts[2] == "abort":
            marker = Path(".fake-serve") / f"fault-{parts[1]}"
            fault = marker.read_text() if marker.exists() else ""
            if fault == "noabort":
                while True:
                    time.sleep(1000)
            done = ABORTED.get(parts[1])
            if done and not done.is_set():
                done.set()
                if fault != "noclose":
                    status(parts[1], "idle")
            return self.reply(200, True)
        if len(parts) == 3 and parts[0] == "permission":
            record("reply", {"server": SERVER, "request": parts[1], "reply": body.get("reply")})
            if parts[1] in REPLIES:
                REPLIES.pop(parts[1]).set()
            return self.reply(200, True)
        self.reply(404, {"error": "no route"})

    def stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        mine = queue.Queue(maxsize=256)
        with LOCK:
            SUBSCRIBERS.append(mine)
        self.wfile.write(frame({"id": ident("evt"), "type": "server.connected", "properties": {}}))
        self.wfile.flush()
        try:
            while True:
                item = mine.get()
                for chunk in ([item] if isinstance(item, bytes) else item):
                    self.wfile.write(chunk)
                self.wfile.flush()
        except OSError:
            pass
        finally:
            with LOCK:
                SUBSCRIBERS.remove(mine)
        self.close_connection = True


def main():
    args = sys.argv[1:]
    if not args or args[0] != "serve" or "--port" not in args:
        sys.stderr.write("Error: usage: opencode serve --hostname HOST --port PORT\n")
        sys.exit(1)
    host = args[args.index("--hostname") + 1] if "--hostname" in args else "127.0.0.1"
    port = int(args[args.index("--port") + 1])
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    Path(".fake-serve").mkdir(exist_ok=True)
    (Path(".fake-serve") / "server.pid").write_text(str(os.getpid()))
    with (Path(".fake-serve") / "starts.log").open("a") as log:
        log.write(f"{os.getpid()}\n")
    sys.stderr.write(MARKER + "\n")
    sys.stderr.flush()
    print(f"opencode server listening on http://{host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
