#!/usr/bin/python3
"""Fake `opencode` / `amp` CLIs for the end-to-end tests of acp-sandbox.

Usage: fake_cli.py opencode|amp ARGS...   (normally through the `opencode` / `amp` wrappers next to this file)

It behaves like the real CLI as far as the bridge can tell (see the project research notes on the CLIs, CLIS.md):
  * parses the real command line and rejects unknown flags (exit 1, `Error: ...` on stderr);
  * reads the prompt from stdin to EOF (OpenCode hangs on an open pipe; Amp gives up after 30 s);
  * picks a scenario from a `SCENARIO:<name>` marker in the prompt (default: a plain text answer) and replays the
    recorded fixture for it from ../fixtures/{opencode,amp}/, with the session/thread id and workspace paths
    rewritten to this run's;
  * appends one JSON line describing the invocation (argv, stdin, cwd, PWD, environment, pid) to
    <cwd>/.fake-cli/invocations.jsonl, so tests can check what the bridge passed.

Scenarios (both agents unless noted):
  text (default; `followup`/`continue` text on a continued session), tools, edit*, todo*, reasoning*, toolerror*,
  error400* and unreachable* (error event, exit 1; the second a provider OpenCode cannot connect to), thinking+,
  error-inference+ (error result, exit 0), cancelled+,
  crash (garbage, a partial line and stderr text, exit 3), garbage (non-JSON lines, then a normal answer),
  slow (a text event every FAKE_DELAY_MS=200 ms, FAKE_COUNT=50 times), hang (starts, then sleeps forever),
  probe (tries writing in the workspace, its parent, HOME and /tmp; results in <cwd>/.fake-cli/probe.json),
  `--version` prints $OPENCODE_FAKE_VERSION (default 1.18.33), with $OPENCODE_FAKE_VERSION_HOLD=PATH only once PATH
  exists (its pid in PATH.pid meanwhile) and a line appended to $OPENCODE_FAKE_VERSION_LOG if set, and `models --verbose` likewise with $OPENCODE_FAKE_MODELS_HOLD;
  `serve` is not implemented (exit 1, like a CLI without a server), unless $OPENCODE_FAKE_SERVE=1: then
  fake_serve.py (next to this file) is the server.
  hugeline* (a 20 MiB text event on one line, then a normal answer),
  child (starts a grandchild `sleep 1000` in its own session, writes its pid to <cwd>/.fake-cli/child.pid, sleeps).
  files* (`OPS:[...]` in the prompt, a JSON list done in order in the cwd: ["read", path], ["write", path, text],
  ["bytes", path, hex], ["delete", path], ["rename", path, to], ["link", path, target] (a symlink), ["chmod", path,
  octal], ["fifo", path] (whatever is there replaced by a FIFO), ["sparse", path, bytes] (a sparse file of that
  apparent size), ["many", dir, n] (n small text files), ["repeat", path, text, n], ["sleep", seconds], ["flush"] (prints the events so far),
  ["await", path, text] (waits at most 20 s for the file to hold text, else reports `path=<not awaited>`),
  ["connect", host:port, text] (CONNECT through $HTTPS_PROXY, text sent through the tunnel: `host:port=<status>
  <echo or the proxy's body>`); then
  one completed tool event per op
  and a text `READ path=...; ...` of what each read found, `path=<missing>` when there was no file).
  (* OpenCode only, + Amp only.) Amp prints the `User cancelled (SIGINT/SIGTERM)` error result and exits 0 on
  SIGTERM/SIGINT once it has started streaming, like the real one; OpenCode just dies from the signal.
"""

import base64
import errno
import json
import os
import random
import re
import select
import signal
import string
import subprocess
import sys
import time
import uuid
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FOREVER = 10**6


def fail(message, code=1):
    """Exit like a real CLI failure: `Error: ...` on stderr, no JSON on stdout."""
    sys.stderr.write(f"Error: {message}\n")
    sys.stderr.flush()
    sys.exit(code)


def emit(line):
    """Write one stdout line and flush it at once, as the real CLIs do."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def emit_json(obj):
    emit(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))


def sleep_forever():
    while True:
        time.sleep(FOREVER)


def now_ms():
    return int(time.time() * 1000)


def fake_dir():
    path = Path(os.getcwd()) / ".fake-cli"
    path.mkdir(exist_ok=True)
    return path


def record(agent, argv, stdin, scenario, session=None):
    """Append the invocation to <cwd>/.fake-cli/invocations.jsonl (one write, so records never interleave)."""
    entry = {
        "agent": agent,
        "argv": argv,
        "stdin": None if stdin is None else stdin.decode("utf-8", errors="replace"),
        "stdin_b64": None if stdin is None else base64.b64encode(stdin).decode("ascii"),
        "cwd": os.getcwd(),
        "pwd": os.environ.get("PWD"),
        "env": dict(os.environ),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "scenario": scenario,
        "session": session,
    }
    line = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
    fd = os.open(fake_dir() / "invocations.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def scenario_of(prompt):
    match = re.search(r"SCENARIO:([A-Za-z0-9_-]+)", prompt)
    return match.group(1) if match else None


def prompt_option(prompt, name, default):
    match = re.search(rf"FAKE_{name}=(\d+)", prompt)
    return int(match.group(1)) if match else default


def start_grandchild():
    """Like OpenCode's bash tool: a child in its own session, so killing our process group does not reach it."""
    child = subprocess.Popen(
        ["sleep", "1000"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # Written whole or not at all: the tests read it as soon as it exists.
    (fake_dir() / "child.pid.tmp").write_text(str(child.pid))
    os.replace(fake_dir() / "child.pid.tmp", fake_dir() / "child.pid")
    return child


def crash(first_line):
    """Some valid output, garbage, a partial line, a message on stderr, then exit 3."""
    emit(first_line)
    emit("panic: runtime error: index out of range [3] with length 3")
    sys.stdout.write('{"type":"text","timestamp":17959431')
    sys.stdout.flush()
    sys.stderr.write("fake-cli: simulated crash: segmentation fault in the event loop\n")
    sys.stderr.flush()
    sys.exit(3)


def probe():
    """Tries to create a file in a few places and writes what happened to <cwd>/.fake-cli/probe.json, so the
    sandbox tests can see what the CLI may write. The /tmp file is left behind, to check /tmp is private."""
    cwd = Path(os.getcwd())
    targets = {"workspace": cwd, "workspace_parent": cwd.parent, "home": Path(os.environ.get("HOME", "/nonexistent")),
               "tmp": Path("/tmp")}
    results = {}
    for label, directory in targets.items():
        path = directory / f"acp-sandbox-probe-{uuid.uuid4().hex}"
        try:
            path.write_text("probe")
            results[label] = {"path": str(path), "writable": True}
            if label != "tmp":
                path.unlink()
        except OSError as error:
            results[label] = {"path": str(path), "writable": False, "error": str(error)}
    (fake_dir() / "probe.json").write_text(json.dumps(results, indent=1))


def emit_garbage():
    for line in ["this line is not JSON", "", "{not json either", "[1, 2", "\x1b[31mcolored noise\x1b[0m"]:
        emit(line)


def json_escaped(text):
    return json.dumps(text, ensure_ascii=False)[1:-1]


# --------------------------------------------------------------------------------------------------------------
# OpenCode: `opencode run --format json [--auto] [--thinking] [--model M] [--session ses_...]`, prompt on stdin.
# --------------------------------------------------------------------------------------------------------------

OPENCODE_VALUE_FLAGS = {
    "--model": "model", "-m": "model", "--session": "session", "-s": "session", "--format": "format",
    "--agent": "agent", "--title": "title", "--dir": "dir", "--variant": "variant", "--log-level": "log_level",
    "--command": "command", "--attach": "attach", "--password": "password", "-p": "password",
    "--username": "username", "-u": "username", "--port": "port", "--file": "file", "-f": "file",
}
OPENCODE_BOOL_FLAGS = {
    "--auto": "auto", "--yolo": "auto", "--dangerously-skip-permissions": "auto", "--thinking": "thinking",
    "--print-logs": "print_logs", "--pure": "pure", "--continue": "continue", "-c": "continue", "--fork": "fork",
    "--share": "share", "--interactive": "interactive", "-i": "interactive",
}
OPENCODE_FIXTURES = {
    "text": "opencode-text.jsonl",
    "followup": "opencode-followup.jsonl",
    "tools": "opencode-tools.jsonl",
    "edit": "opencode-edit.jsonl",
    "todo": "opencode-todo.jsonl",
    "toolerror": "opencode-toolerror.jsonl",
    "error400": "opencode-error400.jsonl",
    "unreachable": "opencode-unreachable.jsonl",
}


def hold_until_released(variable):
    """With $VARIABLE=HOLD: writes its pid to HOLD.pid, then returns only once HOLD exists (a slow command)."""
    hold = os.environ.get(variable)
    if hold:
        Path(hold + ".pid.tmp").write_text(str(os.getpid()))
        os.rename(hold + ".pid.tmp", hold + ".pid")
        while not Path(hold).exists():
            time.sleep(0.02)


def parse_opencode(args):
    if args[:1] == ["--version"]:
        if os.environ.get("OPENCODE_FAKE_VERSION_LOG"):
            with open(os.environ["OPENCODE_FAKE_VERSION_LOG"], "a") as log:
                log.write(f"{os.getpid()}\n")
        hold_until_released("OPENCODE_FAKE_VERSION_HOLD")
        print(os.environ.get("OPENCODE_FAKE_VERSION", "1.18.33"))
        sys.exit(0)
    if args == ["models", "--verbose"]:
        hold_until_released("OPENCODE_FAKE_MODELS_HOLD")
        # What the real one lists for the fake provider (plus one of its own free models).
        sys.stdout.write((FIXTURES / "opencode" / "models-verbose.txt").read_text())
        sys.exit(0)
    if args[:1] != ["run"]:
        fail(f"fake opencode only implements `run` and `models --verbose`, got {args[:1]}")
    opts = {"format": "default", "message": []}
    rest = iter(args[1:])
    for arg in rest:
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in OPENCODE_VALUE_FLAGS:
            value = inline if eq else next(rest, None)
            if value is None:
                fail(f"Not enough arguments following: {name.lstrip('-')}")
            opts[OPENCODE_VALUE_FLAGS[name]] = value
        elif name in OPENCODE_BOOL_FLAGS and not eq:
            opts[OPENCODE_BOOL_FLAGS[name]] = True
        elif arg == "--":
            opts["message"].extend(rest)
        elif arg.startswith("-") and arg != "-":
            fail(f"Unknown argument: {arg}")
        else:
            opts["message"].append(arg)
    if opts["format"] not in ("default", "json"):
        fail(f'Invalid values:\n  Argument: format, Given: "{opts["format"]}", Choices: "default", "json"')
    if opts["format"] != "json":
        fail("fake opencode only implements --format json")
    return opts


def new_opencode_session_id():
    return "ses_" + "".join(random.choices(string.ascii_letters + string.digits, k=26))


def oc_ids():
    suffix = "".join(random.choices(string.ascii_letters + string.digits, k=20))
    return f"msg_{suffix}", f"prt_{suffix}"


def oc_step_start(sid, msg):
    return {"type": "step_start", "timestamp": now_ms(), "sessionID": sid,
            "part": {"id": oc_ids()[1], "messageID": msg, "sessionID": sid, "type": "step-start"}}


def oc_text(sid, msg, text):
    t = now_ms()
    return {"type": "text", "timestamp": t, "sessionID": sid,
            "part": {"id": oc_ids()[1], "messageID": msg, "sessionID": sid, "type": "text", "text": text,
                     "time": {"start": t, "end": t}}}


def oc_step_finish(sid, msg, reason="stop", tokens=120):
    counts = {"total": tokens, "input": tokens * 5 // 6, "output": tokens // 6} if tokens else {"input": 0, "output": 0}
    return {"type": "step_finish", "timestamp": now_ms(), "sessionID": sid,
            "part": {"id": oc_ids()[1], "reason": reason, "messageID": msg, "sessionID": sid, "type": "step-finish",
                     "tokens": {**counts, "reasoning": 0, "cache": {"write": 0, "read": 0}}, "cost": 0}}


def opencode_fixture_lines(name, sid, cwd):
    """The fixture's lines with its session id and its workspace (/tmp/ws-oc) rewritten to this run's."""
    lines = (FIXTURES / "opencode" / name).read_text().splitlines()
    recorded_sid = json.loads(lines[0])["sessionID"]
    return [line.replace(recorded_sid, sid).replace("/tmp/ws-oc", json_escaped(cwd)) for line in lines]


def oc_tool(sid, msg, tool, title, tool_input, output):
    t = now_ms()
    return {"type": "tool_use", "timestamp": t, "sessionID": sid,
            "part": {"type": "tool", "tool": tool, "callID": "call_" + oc_ids()[1],
                     "state": {"status": "completed", "input": tool_input, "output": output, "metadata": {},
                               "title": title, "time": {"start": t, "end": t}},
                     "id": oc_ids()[1], "sessionID": sid, "messageID": msg}}


def proxy_connect(authority, text):
    """CONNECTs to `authority` through $HTTPS_PROXY and sends `text`: `<status> <answer>`."""
    import socket
    url = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if not url:
        return "no proxy"
    host, port = url.split("://", 1)[-1].rstrip("/").rsplit(":", 1)
    # The proxy may wait for the user's answer.
    with socket.create_connection((host, int(port)), timeout=300) as conn:
        conn.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return f"closed {data!r}"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = head.split(b" ")[1].decode()
        if status != "200":
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                rest += chunk
            return f"{status} {rest.decode().strip()}"
        conn.sendall(text.encode())
        echoed = b""
        while len(echoed) < len(text.encode()):
            chunk = conn.recv(4096)
            if not chunk:
                break
            echoed += chunk
        return f"200 {echoed.decode()}"


def run_file_ops(prompt, sid, msg, cwd):
    """The `files` scenario: the ops are done before any event is printed (but at a `flush`), so what the bridge
    reviews after the first tool event is all the work before it, whatever the timing."""
    match = re.search(r"OPS:(\[.*\])", prompt, re.S)
    ops = json.loads(match.group(1)) if match else []
    reads, events, started = [], [], False
    for op in ops:
        kind, path = op[0], (str(op[1]) if len(op) > 1 else "")
        full = os.path.join(cwd, path)
        if kind == "read":
            try:
                with open(full, encoding="utf-8") as f:
                    found = f.read()
            except FileNotFoundError:
                found = "<missing>"
            reads.append(f"{path}={found}")
            events.append(oc_tool(sid, msg, "read", path, {"filePath": full}, found))
        elif kind in ("write", "bytes"):
            os.makedirs(os.path.dirname(full), exist_ok=True)
            data = op[2].encode() if kind == "write" else bytes.fromhex(op[2])
            with open(full, "wb") as f:
                f.write(data)
            content = op[2] if kind == "write" else f"<{len(data)} bytes>"
            events.append(oc_tool(sid, msg, "write", path, {"filePath": full, "content": content}, "Wrote file successfully."))
        elif kind == "connect":
            # A connection through the sandbox's proxy: `CONNECT op[1]`, then op[2] sent through the tunnel. The
            # READ line says `authority=<status> <what came back through the tunnel, or the proxy's body>`.
            reads.append(f"{path}={proxy_connect(path, op[2])}")
            events.append(oc_tool(sid, msg, "bash", f"connect {path}", {"command": f"connect {path}"}, ""))
        elif kind == "try-write":
            # A write that may be refused (a path the sandbox keeps read-only): what happened is in the READ line,
            # `written` or the errno's name.
            try:
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w", encoding="utf-8") as f:
                    f.write(op[2])
                reads.append(f"{path}=written")
            except OSError as e:
                reads.append(f"{path}={errno.errorcode.get(e.errno, e.errno)}")
            events.append(oc_tool(sid, msg, "write", path, {"filePath": full, "content": op[2]}, "done"))
        elif kind == "flush":
            # The events so far are printed now: the bridge reviews while we go on.
            if not started:
                emit_json(oc_step_start(sid, msg))
                started = True
            for event in events:
                emit_json(event)
            events = []
        elif kind == "await":
            # Waits (at most 20 s) until the file in our working directory holds the text: what the bridge made of
            # it after the tools flushed before.
            deadline = time.time() + 20
            while time.time() < deadline:
                try:
                    with open(full, encoding="utf-8") as f:
                        if f.read() == op[2]:
                            break
                except FileNotFoundError:
                    pass
                time.sleep(0.05)
            else:
                reads.append(f"{path}=<not awaited>")
        elif kind == "delete":
            os.remove(full)
            events.append(oc_tool(sid, msg, "bash", f"rm {path}", {"command": f"rm {path}", "description": "delete"}, ""))
        elif kind in ("rename", "link", "chmod", "fifo", "sparse", "many", "repeat", "sleep"):
            if kind == "rename":
                to = os.path.join(cwd, op[2])
                os.makedirs(os.path.dirname(to), exist_ok=True)
                os.rename(full, to)
            elif kind == "link":
                if os.path.lexists(full):
                    os.remove(full)
                os.symlink(op[2], full)
            elif kind == "chmod":
                os.chmod(full, int(op[2], 8))
            elif kind == "fifo":
                if os.path.lexists(full):
                    os.remove(full)
                os.mkfifo(full)
            elif kind == "sparse":
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "wb") as f:
                    f.truncate(int(op[2]))
            elif kind == "many":
                os.makedirs(full, exist_ok=True)
                for i in range(int(op[2])):
                    with open(os.path.join(full, f"f{i:03}.txt"), "w") as f:
                        f.write(f"file {i}\n")
            elif kind == "repeat":
                with open(full, "w") as f:
                    f.write(op[2] * int(op[3]))
            elif kind == "sleep":
                time.sleep(float(op[1]))
            command = " ".join(str(part) for part in op)
            events.append(oc_tool(sid, msg, "bash", command, {"command": command, "description": kind}, ""))
        else:
            fail(f"fake opencode: unknown file op {kind!r}")
    if not started:
        emit_json(oc_step_start(sid, msg))
    for event in events:
        emit_json(event)
    emit_json(oc_text(sid, msg, "READ " + "; ".join(reads)))
    emit_json(oc_step_finish(sid, msg))


def run_opencode(args):
    opts = parse_opencode(args)
    if opts.get("dir"):
        os.chdir(opts["dir"])
    stdin = b"" if sys.stdin.isatty() else sys.stdin.buffer.read()  # an open pipe blocks here forever, like OpenCode
    prompt = " ".join(opts["message"] + [stdin.decode("utf-8", errors="replace")])
    continued = opts.get("session")
    scenario = scenario_of(prompt) or ("followup" if continued else "text")
    sid = continued or new_opencode_session_id()
    record("opencode", args, stdin, scenario, sid)

    # Like OpenCode's session database in $XDG_DATA_HOME: a session unknown there (never created, or its
    # state was lost) cannot be continued.
    known = Path(os.environ.get("XDG_DATA_HOME", os.environ.get("HOME", "."))) / "opencode" / "fake-sessions.txt"
    if continued and (continued.startswith("ses_gone") or
                      not (known.exists() and continued in known.read_text().split())):
        sys.stderr.write((FIXTURES / "opencode" / "opencode-session-notfound.stderr.txt").read_text())
        sys.exit(1)
    known.parent.mkdir(parents=True, exist_ok=True)
    with known.open("a") as sessions:
        sessions.write(sid + "\n")
    cwd = os.getcwd()
    msg, _ = oc_ids()

    if scenario == "reasoning":
        scenario_file = "opencode-reasoning-thinking.jsonl" if opts.get("thinking") else \
            "opencode-reasoning-nothinking.jsonl"
    else:
        scenario_file = OPENCODE_FIXTURES.get(scenario)
    if scenario_file:
        for line in opencode_fixture_lines(scenario_file, sid, cwd):
            emit(line)
        sys.exit(1 if scenario in ("error400", "unreachable") else 0)

    if scenario == "crash":
        crash(json.dumps(oc_step_start(sid, msg), separators=(",", ":")))
    elif scenario == "probe":
        probe()
        for line in opencode_fixture_lines(OPENCODE_FIXTURES["text"], sid, cwd):
            emit(line)
    elif scenario == "garbage":
        emit_garbage()
        for line in opencode_fixture_lines(OPENCODE_FIXTURES["text"], sid, cwd):
            emit(line)
    elif scenario == "slow":
        count, delay = prompt_option(prompt, "COUNT", 50), prompt_option(prompt, "DELAY_MS", 200)
        emit_json(oc_step_start(sid, msg))
        for i in range(count):
            time.sleep(delay / 1000)
            emit_json(oc_text(sid, msg, f"slow chunk {i + 1} of {count}. "))
        emit_json(oc_step_finish(sid, msg))
    elif scenario == "loop":
        # A stream cut before finish_reason, re-prompted at once, forever (OpenCode 1.18 does this).
        while True:
            emit_json(oc_step_start(sid, msg))
            emit_json(oc_step_finish(sid, msg, reason="unknown", tokens=0))
            time.sleep(0.01)
    elif scenario == "hang":
        emit_json(oc_step_start(sid, msg))
        sleep_forever()
    elif scenario == "hugeline":
        emit_json(oc_text(sid, msg, "x" * (20 * 1024 * 1024)))
        for line in opencode_fixture_lines(OPENCODE_FIXTURES["text"], sid, cwd):
            emit(line)
    elif scenario == "fill-disk":
        # Like OpenCode whose own database (in the session's home) meets a full disk: it fills the disk and fails.
        try:
            with (Path(os.environ["HOME"]) / "filler").open("wb") as filler:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
        except OSError:
            pass
        fail("Failed to execute statement")
    elif scenario == "hugetext":
        # One text event of FAKE_BYTES bytes (within the bridge's line limit): the store keeps a bounded part of it.
        emit_json(oc_step_start(sid, msg))
        emit_json(oc_text(sid, msg, "y" * prompt_option(prompt, "BYTES", 12 * 1024 * 1024)))
        emit_json(oc_step_finish(sid, msg))
    elif scenario == "files":
        run_file_ops(prompt, sid, msg, cwd)
    elif scenario == "child":
        start_grandchild()
        emit_json(oc_step_start(sid, msg))
        sleep_forever()
    else:
        fail(f"fake opencode: unknown scenario {scenario!r}")


# --------------------------------------------------------------------------------------------------------------
# Amp: `amp -x --stream-json ...` or `amp threads continue T-... -x --stream-json ...`, prompt on stdin.
# --------------------------------------------------------------------------------------------------------------

AMP_VALUE_FLAGS = {
    "--mode": "mode", "-m": "mode", "--settings-file": "settings_file", "--log-level": "log_level",
    "--log-file": "log_file", "--mcp-config": "mcp_config", "--visibility": "visibility", "--title": "title",
    "--label": "label", "-l": "label", "--executor": "executor", "--features": "features",
}
AMP_BOOL_FLAGS = {
    "--stream-json": "stream_json", "--stream-json-thinking": "stream_json_thinking",
    "--stream-json-input": "stream_json_input", "--dangerously-allow-all": "allow_all",
    "--no-archive-after-execute": "no_archive", "--fast": "fast", "--last": "last",
}
AMP_FIXTURES = {
    "text": "amp-text.reconstructed.jsonl",
    "continue": "amp-continue.reconstructed.jsonl",
    "tools": "amp-tools.reconstructed.jsonl",
    "thinking": "amp-thinking.reconstructed.jsonl",
    "error-inference": "amp-error-inference.reconstructed.jsonl",
    "tool-error": "amp-tool-error.reconstructed.jsonl",
}
AMP_RECORDED_THREAD = "T-7d3f9a2c-1b4e-4c8a-9f6d-2e5b8c1a0f37"
AMP_MISSING_THREAD = "T-00000000-0000-0000-0000-000000000000"
AMP_THREAD_RE = re.compile(r"^(?:https://ampcode\.com/threads/)?(T-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")
AMP_TOOLS = ["Bash", "create_file", "edit_file", "glob", "Grep", "Read", "read_web_page", "web_search", "skill",
             "get_diagnostics", "find_thread"]
AMP_CANCELLED = "User cancelled (SIGINT/SIGTERM)"


def parse_amp(args):
    opts = {"threads": []}
    rest = list(args)
    if rest[:1] in (["threads"], ["thread"], ["t"]):
        if rest[1:2] not in (["continue"], ["c"]):
            fail(f"fake amp only implements `threads continue`, got {rest[:2]}")
        opts["continue"] = True
        rest = rest[2:]
    i = 0
    while i < len(rest):
        arg, i = rest[i], i + 1
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in ("-x", "--execute"):
            opts["execute"] = True
            if eq:
                opts["message"] = inline
            elif i < len(rest) and not rest[i].startswith("-"):  # an optional value: taken unless it is a flag
                opts["message"], i = rest[i], i + 1
        elif name in AMP_VALUE_FLAGS:
            if not eq and i >= len(rest):
                fail(f"option '{name}' argument missing")
            value, i = (inline, i) if eq else (rest[i], i + 1)
            opts[AMP_VALUE_FLAGS[name]] = value
        elif name in AMP_BOOL_FLAGS and not eq:
            opts[AMP_BOOL_FLAGS[name]] = True
        elif arg.startswith("-"):
            fail(f"unknown option '{arg}'")
        elif opts.get("continue"):
            opts["threads"].append(arg)
        else:
            fail(f"unknown command '{arg}'")
    if opts.get("stream_json_thinking"):
        opts["stream_json"] = True
    if opts.get("stream_json") and not opts.get("execute"):
        fail("The --stream-json flag requires --execute mode")
    if not opts.get("execute"):
        fail("fake amp only implements execute mode (-x)")
    if not opts.get("stream_json"):
        fail("fake amp only implements --stream-json")
    if opts.get("continue") and len(opts["threads"]) != 1:
        fail("Execute mode can only continue exactly one thread")
    return opts


def read_amp_stdin(timeout=30.0):
    """Amp reads a non-TTY stdin (at most 1 MiB) and gives up after 30 s on an open pipe."""
    if sys.stdin.isatty():
        return b""
    data, deadline = b"", time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([0], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            fail("Timeout while reading from stdin")
        chunk = os.read(0, 65536)
        if not chunk:
            return data[: 1 << 20]
        data += chunk


class AmpStream:
    """Writes Amp stream-json lines for one thread, and answers SIGTERM/SIGINT like Amp does while streaming."""

    def __init__(self, thread, cwd, thinking):
        self.thread, self.cwd, self.thinking, self.turns = thread, cwd, thinking, 0

    def emit(self, obj):
        if obj.get("type") == "assistant":
            self.turns += 1
            if not self.thinking:
                obj["message"]["content"] = [b for b in obj["message"]["content"]
                                             if b.get("type") not in ("thinking", "redacted_thinking")]
        emit_json(obj)

    def start(self, prompt):
        emit_json({"type": "system", "subtype": "init", "cwd": self.cwd, "session_id": self.thread,
                   "tools": AMP_TOOLS, "mcp_servers": [], "agent_mode": "medium"})
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        self.user(prompt)

    def user(self, prompt):
        emit_json({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": prompt}]},
                   "parent_tool_use_id": None, "session_id": self.thread})

    def assistant(self, content, stop_reason="end_turn"):
        self.emit({"type": "assistant", "message": {
            "type": "message", "role": "assistant", "content": content, "stop_reason": stop_reason,
            "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                      "output_tokens": 5, "service_tier": "standard"}},
            "parent_tool_use_id": None, "session_id": self.thread})

    def success(self, text):
        emit_json({"type": "result", "subtype": "success", "duration_ms": 1000, "is_error": False,
                   "num_turns": self.turns, "result": text, "session_id": self.thread})

    def error(self, message):
        emit_json({"type": "result", "subtype": "error_during_execution", "duration_ms": 1000, "is_error": True,
                   "num_turns": self.turns, "error": message, "session_id": self.thread})

    def on_signal(self, _signum, _frame):
        self.error(AMP_CANCELLED)
        os._exit(0)

    def replay(self, name, prompt, stop_before_result=False):
        """Replays a fixture: thread id, workspace (/tmp/ws) and the echoed prompt rewritten to this run's."""
        lines = (FIXTURES / "amp" / name).read_text().splitlines()
        for index, line in enumerate(lines):
            line = line.replace(AMP_RECORDED_THREAD, self.thread)
            line = re.sub(r'/tmp/ws(?=[/"])', lambda _: json_escaped(self.cwd), line)
            obj = json.loads(line)
            if obj["type"] == "system":
                self.start(prompt)
            elif obj["type"] == "user" and index == 1:
                continue  # the echo of the prompt: start() already wrote it with the real prompt
            elif obj["type"] == "result" and stop_before_result:
                return
            else:
                self.emit(obj)


def run_amp(args):
    opts = parse_amp(args)
    cwd = os.getcwd()
    if not os.environ.get("AMP_API_KEY"):
        record("amp", args, None, None)
        sys.stdout.write("No API key found. Starting login flow...\nIf your browser does not open automatically, "
                         "visit:\n\nhttps://ampcode.com/auth/cli-login?authToken=" + "0" * 64 +
                         "\n\nWhen prompted, paste your code here: ")
        sys.stdout.flush()
        sleep_forever()
    stdin = read_amp_stdin()
    message = opts.get("message")
    text = stdin.decode("utf-8", errors="replace")
    if message and text:
        prompt = f"Input received on stdin:\n```\n{text}\n```\n\n{message}"
    else:
        prompt = message or text
    continued = opts.get("continue")
    scenario = scenario_of(prompt) or ("continue" if continued else "text")
    match = AMP_THREAD_RE.match(opts["threads"][0]) if continued else None
    thread = (match.group(1) if match else None) if continued else f"T-{uuid.uuid4()}"
    record("amp", args, stdin, scenario, thread or opts["threads"][0])
    if not prompt:
        fail("No valid messages found in stdin")
    if continued and not match:
        fail(f"Invalid thread URL or ID: {opts['threads'][0]}")
    if thread == AMP_MISSING_THREAD:
        fail(f"Thread https://ampcode.com/threads/{thread} does not exist.")
    stream = AmpStream(thread, cwd, bool(opts.get("stream_json_thinking")))

    if scenario in ("tools", "tool-error", "cancelled", "child") and not opts.get("allow_all"):
        stream.start(prompt)
        stream.error("The following tools require user approval, which is not supported in stream JSON mode: Bash")
    elif scenario in AMP_FIXTURES:
        stream.replay(AMP_FIXTURES[scenario], prompt)
    elif scenario == "cancelled":
        stream.replay("amp-cancelled.reconstructed.jsonl", prompt, stop_before_result=True)
        sleep_forever()
    elif scenario == "crash":
        crash(json.dumps({"type": "system", "subtype": "init", "cwd": cwd, "session_id": thread, "tools": AMP_TOOLS,
                          "mcp_servers": [], "agent_mode": "medium"}, separators=(",", ":")))
    elif scenario == "probe":
        probe()
        stream.replay(AMP_FIXTURES["text"], prompt)
    elif scenario == "garbage":
        emit_garbage()
        stream.replay(AMP_FIXTURES["text"], prompt)
    elif scenario == "slow":
        count, delay = prompt_option(prompt, "COUNT", 50), prompt_option(prompt, "DELAY_MS", 200)
        stream.start(prompt)
        for i in range(count):
            time.sleep(delay / 1000)
            stream.assistant([{"type": "text", "text": f"slow chunk {i + 1} of {count}. "}],
                             "end_turn" if i + 1 == count else None)
        stream.success(f"slow chunk {count} of {count}. ")
    elif scenario == "loop":
        # A stream cut before finish_reason, re-prompted at once, forever (OpenCode 1.18 does this).
        while True:
            emit_json(oc_step_start(sid, msg))
            emit_json(oc_step_finish(sid, msg, reason="unknown", tokens=0))
            time.sleep(0.01)
    elif scenario == "hang":
        stream.start(prompt)
        sleep_forever()
    elif scenario == "child":
        start_grandchild()
        stream.start(prompt)
        stream.assistant([{"type": "tool_use", "id": "toolu_child", "name": "Bash", "input": {"cmd": "sleep 1000"}}],
                         "tool_use")
        sleep_forever()
    else:
        fail(f"fake amp: unknown scenario {scenario!r}")


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("opencode", "amp"):
        fail("usage: fake_cli.py opencode|amp ARGS...")
    agent, args = sys.argv[1], sys.argv[2:]
    if agent == "opencode" and args[:1] == ["serve"] and os.environ.get("OPENCODE_FAKE_SERVE") == "1":
        os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve().with_name("fake_serve.py"))] + args)
    if agent == "opencode":
        run_opencode(args)
    else:
        run_amp(args)


if __name__ == "__main__":
    main()
