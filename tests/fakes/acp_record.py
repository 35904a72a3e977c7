#!/usr/bin/env python3
"""A recording ACP client for the real `opencode acp`: it drives OpenCode over stdio and keeps every line both ways.

This is a study tool, not a test: it starts tests/fakes/fake_openai.py, builds a throwaway world under /var/tmp (a HOME
whose XDG_CONFIG_HOME holds opencode/opencode.json pointing the provider `fake` at the fake server, XDG data/cache/
state dirs, a git-less workspace), spawns `opencode acp` in the workspace with an environment cleared down to PATH,
HOME, XDG_* and OpenCode's own hermetic switches, and speaks ACP (JSON-RPC 2.0, one JSON message per line) with it.

It answers what OpenCode asks the client: `session/request_permission` (an allow option, or a reject one with
--reject), `fs/read_text_file` and `fs/write_text_file` (for real, on disk), `terminal/*` (it runs the command itself
with subprocess). Anything else gets JSON-RPC error -32601.

Usage: acp_record.py SCENARIO [--opencode BIN] [--out-dir DIR] [--keep]
Scenarios: init, text, tools, permission, cancel, cancel-permission, restart, modes, mcp, livebash, misc, lifecycle, all (see SCENARIOS below).
Each capture is written to DIR/<name>.jsonl (default tests/fixtures/acp/opencode), one line per JSON-RPC message:
{"dir": "out" (client to agent) | "in" (agent to client), "msg": {...}} (a stdout line that is not JSON is kept as
{"dir": "in", "raw": "..."}). Absolute temp paths are replaced by /WORKSPACE, /HOME, /ROOT, /REPO, /OPENCODE and the
fake's port by PORT. The unsanitized capture with timestamps ("t": seconds since spawn) stays in the world dir
(printed on stderr; kept with --keep). Timings and findings are printed on stderr as `FINDING ...` lines.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSION = "1.18.33"
DEFAULT_BIN = Path.home() / ".cache/acp-sandbox" / f"opencode-ai@{VERSION}" / "node_modules/.bin/opencode"
CONFIG_TEMPLATE = REPO / "tests/fixtures/real-opencode/opencode.json"
GITIGNORE = "node_modules\npackage.json\npackage-lock.json\nbun.lock\n.gitignore"
HERMETIC = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}
CAPS_ALL = {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True}
CAPS_NONE = {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}


def finding(text):
    sys.stderr.write(f"FINDING {text}\n")
    sys.stderr.flush()


# ---- the world: fake model, HOME, XDG dirs, workspace ------------------------------------------------------------

class World:
    def __init__(self, opencode, permission=None, keep=False):
        self.opencode = Path(opencode)
        self.keep = keep
        parent = Path(f"/var/tmp/acp-record-{os.getuid()}")
        parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="w-", dir=parent)).resolve()
        self.home = self.root / "home"
        self.config = self.home / ".config"
        self.ws = self.root / "ws"
        self.ws.mkdir(parents=True)
        (self.config / "opencode").mkdir(parents=True)
        self.fake_record = self.root / "fake-openai-requests.jsonl"
        self.fake = subprocess.Popen(
            [sys.executable, str(REPO / "tests/fakes/fake_openai.py"), "--record", str(self.fake_record)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(self.root / "fake-openai.log", "w"))
        line = self.fake.stdout.readline().decode()
        assert line.startswith("PORT "), line
        self.port = int(line.split()[1])
        self.write_config(permission)
        (self.config / "opencode/.gitignore").write_text(GITIGNORE)
        # OpenCode wants @opencode-ai/plugin in its config dir before it loads plugins (else: npm install from the
        # network). The pinned install ships it beside the binary: link it in, as the bridge does.
        prefix = self.opencode.resolve().parents[0]
        for up in self.opencode.resolve().parents:
            if (up / "node_modules/@opencode-ai/plugin/package.json").is_file() and (up / "package-lock.json").is_file():
                prefix = up
                break
        for name in ["node_modules", "package.json", "package-lock.json"]:
            if (prefix / name).exists():
                os.symlink(prefix / name, self.config / "opencode" / name)
        self.bin_dir = str(self.opencode.parent)

    def write_config(self, permission=None, extra=None):
        config = json.loads(CONFIG_TEMPLATE.read_text().replace("http://127.0.0.1:18080/v1",
                                                                  f"http://127.0.0.1:{self.port}/v1"))
        if permission is not None:
            config["permission"] = permission
        if extra:
            config.update(extra)
        (self.config / "opencode/opencode.json").write_text(json.dumps(config, indent=2))

    def env(self):
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.config),
            "XDG_DATA_HOME": str(self.home / ".local/share"),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "XDG_STATE_HOME": str(self.home / ".local/state"),
        }
        env.update(HERMETIC)
        return env

    def requests(self):
        if not self.fake_record.exists():
            return []
        return [json.loads(l) for l in self.fake_record.read_text().splitlines() if l.strip()]

    def replacements(self):
        # OpenCode also shows paths relative to `/` (a git-less workspace's "worktree"): without the leading slash.
        return [(str(self.ws), "/WORKSPACE"), (str(self.home), "/HOME"), (str(self.root), "/ROOT"),
                (str(self.ws)[1:], "WORKSPACE"), (str(self.home)[1:], "HOME"), (str(self.root)[1:], "ROOT"),
                (str(self.opencode.resolve().parent), "/OPENCODE"), (str(self.opencode.parent), "/OPENCODE"),
                (str(REPO), "/REPO"), (f"127.0.0.1:{self.port}", "127.0.0.1:PORT")]

    def close(self):
        try:
            self.fake.stdin.close()
            self.fake.wait(timeout=5)
        except Exception:
            self.fake.kill()
        if self.keep:
            sys.stderr.write(f"world kept in {self.root}\n")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


# ---- the recorder ---------------------------------------------------------------------------------------------

class Recorder:
    def __init__(self, world, name):
        self.world = world
        self.name = name
        self.entries = []
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.raw = open(world.root / f"{name}.raw.jsonl", "a")

    def add(self, direction, msg=None, raw=None):
        entry = {"t": round(time.monotonic() - self.t0, 3), "dir": direction}
        if msg is not None:
            entry["msg"] = msg
        else:
            entry["raw"] = raw
        with self.lock:
            self.entries.append(entry)
            self.raw.write(json.dumps(entry) + "\n")
            self.raw.flush()

    def note(self, text):
        """A marker in the raw capture only (e.g. `process restarted`)."""
        self.add("note", raw=text)

    def export(self, out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{self.name}.jsonl"
        reps = sorted(self.world.replacements(), key=lambda r: -len(r[0]))
        with open(path, "w") as f:
            for e in self.entries:
                if e["dir"] == "note":
                    continue
                line = json.dumps({k: v for k, v in e.items() if k != "t"})
                for old, new in reps:
                    line = line.replace(old, new)
                f.write(line + "\n")
        sys.stderr.write(f"wrote {path} ({len(self.entries)} entries)\n")


# ---- the client side: what OpenCode may ask us ----------------------------------------------------------------

class Terminals:
    def __init__(self):
        self.next = 0
        self.terms = {}

    def create(self, p):
        self.next += 1
        tid = f"term-{self.next}"
        cmd = [p["command"]] + list(p.get("args") or [])
        env = dict(os.environ)
        for var in p.get("env") or []:
            env[var["name"]] = var["value"]
        shell = not p.get("args") and " " in p["command"]
        proc = subprocess.Popen(p["command"] if shell else cmd, shell=shell, cwd=p.get("cwd") or None, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        term = {"proc": proc, "out": b"", "limit": p.get("outputByteLimit"), "truncated": False}

        def pump():
            for chunk in iter(lambda: proc.stdout.read1(4096), b""):
                term["out"] += chunk
                limit = term["limit"]
                if limit and len(term["out"]) > limit:
                    term["out"] = term["out"][-limit:]
                    term["truncated"] = True
        term["thread"] = threading.Thread(target=pump, daemon=True)
        term["thread"].start()
        self.terms[tid] = term
        return {"terminalId": tid}

    @staticmethod
    def status(proc):
        rc = proc.returncode
        if rc is None:
            return None
        if rc < 0:
            return {"exitCode": None, "signal": signal.Signals(-rc).name}
        return {"exitCode": rc, "signal": None}

    def output(self, p):
        term = self.terms[p["terminalId"]]
        term["proc"].poll()
        if term["proc"].returncode is not None:
            term["thread"].join(timeout=2)
        return {"output": term["out"].decode(errors="replace"), "truncated": term["truncated"],
                "exitStatus": self.status(term["proc"])}

    def wait_for_exit(self, p):
        term = self.terms[p["terminalId"]]
        term["proc"].wait()
        term["thread"].join(timeout=2)
        return self.status(term["proc"])

    def kill(self, p):
        term = self.terms[p["terminalId"]]
        if term["proc"].poll() is None:
            os.killpg(term["proc"].pid, signal.SIGKILL)
        return {}

    def release(self, p):
        self.kill(p)
        self.terms.pop(p["terminalId"], None)
        return {}


class Client:
    """How the driver answers OpenCode's requests."""

    def __init__(self, reject=False, permission_delay=0.0, always=False, fake_fs=False):
        self.reject = reject
        self.always = always
        # fake_fs: fs/write_text_file is answered {} but written to <path>.client-copy, to see who really writes.
        self.fake_fs = fake_fs
        self.permission_delay = permission_delay
        self.terminals = Terminals()
        self.asked = []
        # Set by the driver when it cancels the turn: a pending permission request then answers `cancelled`.
        self.cancelled = threading.Event()
        self.answer_cancelled = False

    def handle(self, method, p):
        self.asked.append(method)
        if method == "session/request_permission":
            if self.cancelled.wait(self.permission_delay) and self.answer_cancelled:
                return {"outcome": {"outcome": "cancelled"}}
            options = p.get("options") or []
            want = ("reject_once", "reject_always") if self.reject else (
                ("allow_always", "allow_once") if self.always else ("allow_once", "allow_always"))
            pick = next((o for k in want for o in options if o.get("kind") == k), options[0] if options else None)
            if pick is None:
                return {"outcome": {"outcome": "cancelled"}}
            return {"outcome": {"outcome": "selected", "optionId": pick["optionId"]}}
        if method == "fs/read_text_file":
            text = Path(p["path"]).read_text()
            if p.get("line") or p.get("limit"):
                lines = text.splitlines(keepends=True)
                start = max((p.get("line") or 1) - 1, 0)
                end = start + p["limit"] if p.get("limit") else None
                text = "".join(lines[start:end])
            return {"content": text}
        if method == "fs/write_text_file":
            path = Path(p["path"] + ".client-copy" if self.fake_fs else p["path"])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(p["content"])
            return {}
        if method.startswith("terminal/"):
            fn = getattr(self.terminals, method.split("/", 1)[1], None)
            if fn is None:
                raise KeyError(method)
            return fn(p)
        raise KeyError(method)


# ---- the agent process ----------------------------------------------------------------------------------------

class Agent:
    def __init__(self, world, recorder, client, args=()):
        self.world = world
        self.rec = recorder
        self.client = client
        self.lock = threading.Condition()
        self.next_id = 0
        self.responses = {}
        self.notes = []  # (time, msg) of notifications
        self.spawned = time.monotonic()
        self.stderr = open(world.root / f"{recorder.name}.opencode-stderr.log", "ab")
        self.proc = subprocess.Popen([str(world.opencode), "acp", *args], cwd=world.ws, env=world.env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def send(self, msg):
        self.rec.add("out", msg)
        data = (json.dumps(msg) + "\n").encode()
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self):
        for line in self.proc.stdout:
            text = line.decode(errors="replace").strip()
            if not text:
                continue
            try:
                msg = json.loads(text)
            except ValueError:
                self.rec.add("in", raw=text)
                continue
            self.rec.add("in", msg)
            if "method" in msg and "id" in msg:
                threading.Thread(target=self.answer, args=(msg,), daemon=True).start()
            elif "method" in msg:
                with self.lock:
                    self.notes.append((time.monotonic(), msg))
                    self.lock.notify_all()
            else:
                with self.lock:
                    self.responses[msg.get("id")] = (time.monotonic(), msg)
                    self.lock.notify_all()
        with self.lock:
            self.lock.notify_all()

    def answer(self, msg):
        try:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": self.client.handle(msg["method"], msg.get("params") or {})}
        except KeyError:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": f"no method {msg['method']}"}}
        except Exception as e:  # a failed fs/terminal operation
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603, "message": str(e)}}
        self.send(reply)

    def start(self, method, params):
        with self.lock:
            self.next_id += 1
            rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return rid, time.monotonic()

    def wait(self, rid, timeout=60):
        deadline = time.monotonic() + timeout
        with self.lock:
            while rid not in self.responses:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self.reader.is_alive():
                    raise TimeoutError(f"no answer to request {rid}")
                self.lock.wait(min(left, 0.5))
            return self.responses[rid]

    def call(self, method, params, timeout=60):
        """(result or None, error or None, seconds)."""
        rid, sent = self.start(method, params)
        at, msg = self.wait(rid, timeout)
        return msg.get("result"), msg.get("error"), at - sent

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def settle(self, quiet=1.5, limit=10):
        """Waits until no notification has come for `quiet` seconds."""
        begun = time.monotonic()
        end = begun + limit
        while time.monotonic() < end:
            with self.lock:
                last = max(self.notes[-1][0] if self.notes else begun, begun)
            if time.monotonic() - last >= quiet:
                return
            time.sleep(0.2)

    def updates(self, since=0.0):
        with self.lock:
            return [m for t, m in self.notes if t >= since]

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=5)


# ---- helpers --------------------------------------------------------------------------------------------------

def init(agent, caps=CAPS_ALL):
    result, error, secs = agent.call("initialize", {"protocolVersion": 1, "clientCapabilities": caps,
                                                    "clientInfo": {"name": "acp_record", "version": "0"}}, 60)
    finding(f"{agent.rec.name}: initialize answered {time.monotonic() - agent.spawned:.2f}s after spawn "
            f"(request to answer {secs:.2f}s)")
    return result or error


def new_session(agent, mcp=None):
    result, error, secs = agent.call("session/new", {"cwd": str(agent.world.ws), "mcpServers": mcp or []}, 60)
    finding(f"{agent.rec.name}: session/new answered in {secs:.2f}s")
    if error:
        raise RuntimeError(f"session/new failed: {error}")
    return result


def prompt(agent, sid, text, timeout=120):
    result, error, secs = agent.call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]},
                                     timeout)
    finding(f"{agent.rec.name}: prompt {text.split()[0]!r} answered {result or error} in {secs:.2f}s")
    return result, error


def update_kinds(updates):
    kinds = []
    for m in updates:
        if m.get("method") == "session/update":
            kind = m["params"]["update"].get("sessionUpdate")
            if not kinds or kinds[-1] != kind:
                kinds.append(kind)
        else:
            kinds.append(m.get("method"))
    return kinds


def processes_matching(needle):
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if needle in cmd:
            found.append((int(d.name), cmd))
    return found


# ---- scenarios ------------------------------------------------------------------------------------------------

def sc_init(opts):
    """initialize + session/new with every client capability on, then with every one off."""
    for label, caps in (("all", CAPS_ALL), ("none", CAPS_NONE)):
        w = World(opts.opencode, keep=opts.keep)
        rec = Recorder(w, f"init-caps-{label}")
        a = Agent(w, rec, Client())
        try:
            init(a, caps)
            new_session(a)
            a.settle(2.0)
        finally:
            a.stop()
            rec.export(opts.out_dir)
            w.close()


def sc_text(opts):
    """A plain text turn (SCENARIO:text), then a reasoning one."""
    w = World(opts.opencode, keep=opts.keep)
    rec = Recorder(w, "prompt-text")
    a = Agent(w, rec, Client())
    try:
        init(a)
        sid = new_session(a)["sessionId"]
        a.settle(1.0)
        prompt(a, sid, "SCENARIO:text say hello")
        prompt(a, sid, "SCENARIO:reasoning think")
        a.settle(1.5)
    finally:
        a.stop()
        rec.export(opts.out_dir)
        w.close()


def run_tools(opts, name, caps, permission=None, scenario="SCENARIO:tools write, run, read, edit", **client_opts):
    w = World(opts.opencode, permission=permission, keep=opts.keep)
    rec = Recorder(w, name)
    client = Client(**client_opts)
    a = Agent(w, rec, client)
    try:
        init(a, caps)
        sid = new_session(a)["sessionId"]
        a.settle(1.0)
        prompt(a, sid, scenario, timeout=180)
        a.settle(1.5)
        finding(f"{name}: client was asked {sorted(set(client.asked)) or 'nothing'}")
        hello = w.ws / "hello.txt"
        finding(f"{name}: hello.txt = {hello.read_text()!r}" if hello.exists() else f"{name}: no hello.txt")
        copy = w.ws / "hello.txt.client-copy"
        if copy.exists():
            finding(f"{name}: hello.txt.client-copy = {copy.read_text()!r}")
        finding(f"{name}: permission requests: {client.asked.count('session/request_permission')}")
        for r in w.requests():
            if r["kind"] == "chat" and r["step"] > 0:
                last = r["body"]["messages"][-1]
                finding(f"{name}: step {r['step']} tool result seen by the model: {json.dumps(last)[:300]}")
    finally:
        a.stop()
        rec.export(opts.out_dir)
        w.close()


def sc_tools(opts):
    """SCENARIO:tools (write, bash, read, edit) with client fs/terminal capabilities on and off (default config)."""
    run_tools(opts, "tools-caps-all", CAPS_ALL)
    run_tools(opts, "tools-caps-none", CAPS_NONE)


def sc_permission(opts):
    """SCENARIO:tools with `permission` ask in opencode.json: allowed, then rejected."""
    ask = {"edit": "ask", "bash": "ask"}
    run_tools(opts, "tools-permission-ask-allow", CAPS_ALL, permission=ask)
    run_tools(opts, "tools-permission-ask-reject", CAPS_ALL, permission=ask, reject=True)
    run_tools(opts, "tools-permission-allow", CAPS_ALL, permission={"edit": "allow", "bash": "allow"})
    run_tools(opts, "tools-permission-ask-caps-none", CAPS_NONE, permission=ask)
    run_tools(opts, "tools-permission-ask-always", CAPS_ALL, permission=ask, always=True)
    run_tools(opts, "tools-permission-ask-fakefs", CAPS_ALL, permission=ask, fake_fs=True)


def sc_cancel(opts):
    """session/cancel while SCENARIO:longbash:30 runs: how fast `cancelled` comes, and what is left running."""
    w = World(opts.opencode, keep=opts.keep)
    rec = Recorder(w, "cancel-longbash")
    a = Agent(w, rec, Client())
    try:
        init(a)
        sid = new_session(a)["sessionId"]
        a.settle(1.0)
        rid, sent = a.start("session/prompt", {"sessionId": sid, "prompt": [
            {"type": "text", "text": "SCENARIO:longbash:30 sleep"}]})
        started = w.ws / "longbash.started"
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        finding(f"cancel: before cancel: sleeps {processes_matching('sleep 3')}")
        cancel_at = time.monotonic()
        a.notify("session/cancel", {"sessionId": sid})
        at, msg = a.wait(rid, 60)
        finding(f"cancel: prompt answered {msg.get('result') or msg.get('error')} {at - cancel_at:.3f}s after cancel")
        for delay in (0.5, 3.0):
            time.sleep(delay)
            finding(f"cancel: {delay}s later: sleeps {processes_matching('sleep 3')}")
        a.settle(1.5)
        finding(f"cancel: longbash.finished exists: {(w.ws / 'longbash.finished').exists()}")
        # And a next turn on the same session still works.
        prompt(a, sid, "SCENARIO:text after cancel")
        a.settle(1.0)
        tool_updates = [m["params"]["update"] for m in a.updates() if m.get("method") == "session/update"
                        and m["params"]["update"].get("sessionUpdate") in ("tool_call", "tool_call_update")]
        finding(f"cancel: tool updates: {[(u.get('sessionUpdate'), u.get('status')) for u in tool_updates]}")
    finally:
        a.stop()
        finding(f"cancel: after opencode stopped: sleeps {processes_matching('sleep 3')}")
        for pid, cmd in processes_matching("sleep 3"):
            if cmd in ("sleep 30", "sleep 31"):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        rec.export(opts.out_dir)
        w.close()


def sc_cancel_permission(opts):
    """session/cancel while a session/request_permission is unanswered: answered 4 s late with allow, or at once with
    the outcome `cancelled` (what ACP asks of a client)."""
    for name, answer_cancelled in (("cancel-during-permission", False), ("cancel-during-permission-answer-cancelled", True)):
        w = World(opts.opencode, permission={"edit": "ask", "bash": "ask"}, keep=opts.keep)
        rec = Recorder(w, name)
        # fake_fs: to tell OpenCode's own write from the client's.
        client = Client(permission_delay=4.0, fake_fs=True)
        client.answer_cancelled = answer_cancelled
        a = Agent(w, rec, client)
        try:
            init(a)
            sid = new_session(a)["sessionId"]
            a.settle(1.0)
            rid, _ = a.start("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "SCENARIO:tools go"}]})
            deadline = time.monotonic() + 30
            while "session/request_permission" not in client.asked and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            cancel_at = time.monotonic()
            a.notify("session/cancel", {"sessionId": sid})
            client.cancelled.set()
            at, msg = a.wait(rid, 30)
            finding(f"{name}: prompt answered {msg.get('result') or msg.get('error')} {at - cancel_at:.3f}s after cancel")
            time.sleep(4.5)
            a.settle(1.0)
            finding(f"{name}: hello.txt exists: {(w.ws / 'hello.txt').exists()}; hello.txt.client-copy exists: "
                    f"{(w.ws / 'hello.txt.client-copy').exists()}; client asked {client.asked}")
            prompt(a, sid, "SCENARIO:text next turn")
        finally:
            a.stop()
            rec.export(opts.out_dir)
            w.close()


def sc_restart(opts):
    """Two turns, kill OpenCode, a new process: session/load (replay?), a follow-up, session/resume, session/list."""
    w = World(opts.opencode, keep=opts.keep)
    rec1 = Recorder(w, "restart-1-before")
    a = Agent(w, rec1, Client())
    try:
        caps = init(a)
        sid = new_session(a)["sessionId"]
        a.settle(1.0)
        prompt(a, sid, "SCENARIO:text first turn")
        prompt(a, sid, "SCENARIO:tools second turn", timeout=180)
        a.settle(1.5)
    finally:
        a.stop(signal.SIGKILL)
        rec1.export(opts.out_dir)
    finding(f"restart: first process killed (SIGKILL), rc={a.proc.returncode}")

    rec2 = Recorder(w, "restart-2-load")
    b = Agent(w, rec2, Client())
    try:
        init(b)
        before = len(b.updates())
        result, error, secs = b.call("session/load", {"sessionId": sid, "cwd": str(w.ws), "mcpServers": []}, 60)
        with b.lock:
            answered = b.responses[max(b.responses)][0]
            replayed = [m for t, m in b.notes[before:] if t <= answered]
        finding(f"restart: session/load answered in {secs:.2f}s: {json.dumps(result or error)[:400]}")
        finding(f"restart: {len(replayed)} notifications before the load answer: {update_kinds(replayed)}")
        b.settle(1.5)
        finding(f"restart: after load answer: {update_kinds(b.updates(answered + 0.0001))}")
        n_before = len(w.requests())
        prompt(b, sid, "SCENARIO:followup do you remember?")
        for r in w.requests()[n_before:]:
            if r["kind"] == "chat":
                msgs = r["body"]["messages"]
                finding(f"restart: follow-up request has {len(msgs)} messages, roles {[m['role'] for m in msgs]}, "
                        f"mentions PLAIN-ANSWER-OK: {'PLAIN-ANSWER-OK' in json.dumps(msgs)}, "
                        f"TOOLS-DONE: {'TOOLS-DONE' in json.dumps(msgs)}")
        b.settle(1.0)
        listed, lerr, _ = b.call("session/list", {"cwd": str(w.ws)}, 30)
        finding(f"restart: session/list -> {json.dumps(listed or lerr)[:400]}")
    finally:
        b.stop()
        rec2.export(opts.out_dir)

    rec3 = Recorder(w, "restart-3-resume")
    c = Agent(w, rec3, Client())
    try:
        init(c)
        before = time.monotonic()
        result, error, secs = c.call("session/resume", {"sessionId": sid, "cwd": str(w.ws), "mcpServers": []}, 60)
        finding(f"restart: session/resume answered in {secs:.2f}s: {json.dumps(result or error)[:300]}")
        c.settle(1.5)
        finding(f"restart: notifications after resume: {update_kinds(c.updates(before))}")
        n_before = len(w.requests())
        prompt(c, sid, "SCENARIO:followup after resume")
        for r in w.requests()[n_before:]:
            if r["kind"] == "chat":
                finding(f"restart: post-resume request has {len(r['body']['messages'])} messages")
        forked, ferr, _ = c.call("session/fork", {"sessionId": sid, "cwd": str(w.ws), "mcpServers": []}, 60)
        finding(f"restart: session/fork -> {json.dumps(forked or ferr)[:300]}")
        c.settle(1.0)
        if forked and forked.get("sessionId"):
            n_before = len(w.requests())
            prompt(c, forked["sessionId"], "SCENARIO:followup in the fork")
            for r in w.requests()[n_before:]:
                if r["kind"] == "chat":
                    finding(f"restart: fork's request has {len(r['body']['messages'])} messages")
        closed, cerr, _ = c.call("session/close", {"sessionId": sid}, 30)
        finding(f"restart: session/close -> {json.dumps(closed if cerr is None else cerr)[:300]}")
        r2, e2, _ = c.call("session/load", {"sessionId": "ses_doesnotexist", "cwd": str(w.ws), "mcpServers": []}, 30)
        finding(f"restart: session/load of an unknown id -> {json.dumps(r2 if e2 is None else e2)[:300]}")
    finally:
        c.stop()
        rec3.export(opts.out_dir)
        w.close()


def sc_modes(opts):
    """session/set_mode, session/set_model, session/set_config_option and their effect on the next request."""
    w = World(opts.opencode, keep=opts.keep)
    (w.ws / "notes.txt").write_text("line one\n")
    rec = Recorder(w, "modes")
    a = Agent(w, rec, Client())
    try:
        init(a)
        new = new_session(a)
        sid = new["sessionId"]
        a.settle(1.0)
        r, e, _ = a.call("session/set_mode", {"sessionId": sid, "modeId": "plan"})
        finding(f"modes: set_mode plan -> {r if e is None else e}")
        a.settle(1.0)
        prompt(a, sid, "SCENARIO:planedit try to edit in plan mode", timeout=180)
        finding(f"modes: after planedit in plan: new.txt={(w.ws / 'new.txt').exists()} ran.txt={(w.ws / 'ran.txt').exists()} "
                f"notes={(w.ws / 'notes.txt').read_text()!r}")
        r, e, _ = a.call("session/set_mode", {"sessionId": sid, "modeId": "build"})
        finding(f"modes: set_mode build -> {r if e is None else e}")
        r, e, _ = a.call("session/set_model", {"sessionId": sid, "modelId": "fake/other-model"})
        finding(f"modes: set_model fake/other-model -> {r if e is None else e}")
        a.settle(1.0)
        n = len(w.requests())
        prompt(a, sid, "SCENARIO:text after set_model")
        finding(f"modes: models asked after set_model: {[x['body'].get('model') for x in w.requests()[n:]]}")
        # (Another model of the list, e.g. opencode/big-pickle, would reach for the network: avoid.)
        for config_id, value in (("model", "fake/fake-model"), ("effort", "high"), ("mode", "plan")):
            r, e, _ = a.call("session/set_config_option", {"sessionId": sid, "configId": config_id, "value": value})
            current = {o["id"]: o.get("currentValue") for o in (r or {}).get("configOptions") or []}
            finding(f"modes: set_config_option {config_id}={value} -> {current if e is None else e}")
            a.settle(1.0)
        n = len(w.requests())
        prompt(a, sid, "SCENARIO:text after set_config_option")
        for x in w.requests()[n:]:
            body = {k: v for k, v in x["body"].items() if k not in ("messages", "tools")}
            finding(f"modes: request after set_config_option ({x['kind']}): {json.dumps(body)[:400]}")
        r, e, _ = a.call("session/set_config_option", {"sessionId": sid, "configId": "effort", "value": "bogus"})
        finding(f"modes: set_config_option effort=bogus -> {r if e is None else e}")
        r, e, _ = a.call("session/set_config_option", {"sessionId": sid, "configId": "nope", "value": "x"})
        finding(f"modes: set_config_option nope=x -> {r if e is None else e}")
        prompt(a, sid, "SCENARIO:error the provider fails")
        r, e, _ = a.call("session/set_mode", {"sessionId": sid, "modeId": "nonexistent"})
        finding(f"modes: set_mode nonexistent -> {r if e is None else e}")
        r, e, _ = a.call("session/set_model", {"sessionId": sid, "modelId": "nope/nope"})
        finding(f"modes: set_model nope/nope -> {r if e is None else e}")
        a.settle(1.0)
    finally:
        a.stop()
        rec.export(opts.out_dir)
        w.close()


def sc_mcp(opts):
    """A stdio MCP server (tests/fakes/mcp_probe.py) given in session/new, and SCENARIO:mcp:probe calling its tool."""
    w = World(opts.opencode, keep=opts.keep)
    key = w.root / "secret.key"
    key.write_text("k")
    rec = Recorder(w, "mcp-stdio")
    a = Agent(w, rec, Client())
    try:
        init(a)
        mcp = [{"name": "probe", "command": "python3", "args": [str(REPO / "tests/fakes/mcp_probe.py"), str(key)],
                "env": [{"name": "GIVEN", "value": "olleh"}]}]
        sid = new_session(a, mcp)["sessionId"]
        a.settle(1.5)
        finding(f"mcp: probe processes: {processes_matching('mcp_probe.py')}")
        prompt(a, sid, "SCENARIO:mcp:probe call it", timeout=120)
        a.settle(1.0)
        for r in w.requests():
            if r["kind"] == "chat" and r["scenario"] == "mcp":
                names = [t["function"]["name"] for t in r["body"].get("tools", [])]
                finding(f"mcp: step {r['step']} tools offered: {names}")
                if r["step"] > 0:
                    finding(f"mcp: tool result: {json.dumps(r['body']['messages'][-1])[:500]}")
    finally:
        a.stop()
        time.sleep(0.5)
        finding(f"mcp: probe processes after opencode stopped: {processes_matching('mcp_probe.py')}")
        rec.export(opts.out_dir)
        w.close()


def sc_livebash(opts):
    """SCENARIO:livebash:4: how a running bash tool's output streams (tool_call_update while it runs?)."""
    w = World(opts.opencode, keep=opts.keep)
    rec = Recorder(w, "livebash")
    a = Agent(w, rec, Client())
    try:
        init(a)
        sid = new_session(a)["sessionId"]
        a.settle(1.0)
        t0 = time.monotonic()
        prompt(a, sid, "SCENARIO:livebash:4 ticks")
        for t, m in list(a.notes):
            if t >= t0 and m.get("method") == "session/update":
                u = m["params"]["update"]
                if u.get("sessionUpdate") in ("tool_call", "tool_call_update"):
                    finding(f"livebash: +{t - t0:.2f}s {u.get('sessionUpdate')} status={u.get('status')} "
                            f"{json.dumps(u.get('content') or u.get('rawOutput'))[:160]}")
    finally:
        a.stop()
        rec.export(opts.out_dir)
        w.close()


def sc_misc(opts):
    """todowrite (a `plan` update?) and OpenCode's question tool over ACP (how is the user asked?)."""
    w = World(opts.opencode, keep=opts.keep)
    rec = Recorder(w, "todo-question")
    client = Client()
    a = Agent(w, rec, client)
    try:
        init(a)
        sid = new_session(a)["sessionId"]
        a.settle(1.0)
        t0 = time.monotonic()
        prompt(a, sid, "SCENARIO:todo plan it")
        finding(f"misc: todo updates: {update_kinds(a.updates(t0))}")
        t0 = time.monotonic()
        rid, _ = a.start("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "SCENARIO:question ask"}]})
        try:
            at, msg = a.wait(rid, 20)
            finding(f"misc: question prompt answered {msg.get('result') or msg.get('error')}")
        except TimeoutError:
            finding("misc: question prompt still running after 20 s: cancelling")
            a.notify("session/cancel", {"sessionId": sid})
            at, msg = a.wait(rid, 20)
            finding(f"misc: question prompt answered after cancel {msg.get('result') or msg.get('error')}")
        finding(f"misc: question updates: {update_kinds(a.updates(t0))}; client asked {client.asked}")
        a.settle(1.0)
    finally:
        a.stop()
        rec.export(opts.out_dir)
        w.close()


def sc_lifecycle(opts):
    """How `opencode acp` ends: stdin closed while idle; SIGTERM and SIGKILL during a long bash (what is left?)."""
    w = World(opts.opencode, keep=opts.keep)
    try:
        rec = Recorder(w, "lifecycle-eof")
        a = Agent(w, rec, Client())
        init(a)
        new_session(a)
        a.settle(1.0)
        t = time.monotonic()
        a.proc.stdin.close()
        try:
            rc = a.proc.wait(timeout=20)
            finding(f"lifecycle: stdin closed while idle: exited rc={rc} after {time.monotonic() - t:.2f}s")
        except subprocess.TimeoutExpired:
            finding("lifecycle: stdin closed while idle: still running after 20 s")
        a.stop()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            rec = Recorder(w, f"lifecycle-{sig.name.lower()}")
            a = Agent(w, rec, Client())
            init(a)
            sid = new_session(a)["sessionId"]
            (w.ws / "longbash.started").unlink(missing_ok=True)
            a.start("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "SCENARIO:longbash:40 z"}]})
            deadline = time.monotonic() + 60
            while not (w.ws / "longbash.started").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)
            t = time.monotonic()
            a.proc.send_signal(sig)
            rc = a.proc.wait(timeout=20)
            finding(f"lifecycle: {sig.name} during bash: exited rc={rc} after {time.monotonic() - t:.2f}s")
            time.sleep(1.0)
            finding(f"lifecycle: {sig.name}: left running: {processes_matching('sleep 4')}")
            for pid, cmd in processes_matching("sleep 4"):
                if cmd in ("sleep 40", "sleep 41") or cmd.startswith("/usr/bin/bash -c setsid sleep 41"):
                    os.kill(pid, signal.SIGKILL)
            a.stop()
            rec.export(opts.out_dir)
    finally:
        w.close()


SCENARIOS = {"init": sc_init, "text": sc_text, "tools": sc_tools, "permission": sc_permission, "cancel": sc_cancel, "cancel-permission": sc_cancel_permission,
             "restart": sc_restart, "modes": sc_modes, "mcp": sc_mcp, "livebash": sc_livebash,
             "misc": sc_misc, "lifecycle": sc_lifecycle}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--opencode", default=os.environ.get("ACP_SANDBOX_TEST_OPENCODE") or str(DEFAULT_BIN))
    parser.add_argument("--out-dir", type=Path, default=REPO / "tests/fixtures/acp/opencode")
    parser.add_argument("--keep", action="store_true", help="keep the world dir (raw captures, OpenCode's data)")
    opts = parser.parse_args()
    for name, fn in SCENARIOS.items():
        if opts.scenario in (name, "all"):
            fn(opts)


if __name__ == "__main__":
    main()
