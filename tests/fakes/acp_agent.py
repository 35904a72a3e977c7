#!/usr/bin/env python3
"""A scripted ACP agent for the tests of `--agent custom` (stdlib only): it speaks ACP on stdin/stdout as an agent
does, and does what the prompt's marker `SCENARIO:<name>[:<arg>]` says, hostile things included.

Sessions are kept under $HOME/.fake-acp/<id>.json (the prompts and answers so far), so `session/load` works in a new
process; a load replays them as updates first (which the bridge must not forward). Every message received is
appended to $HOME/.fake-acp/received.jsonl; at the end of its input it appends a line to $HOME/.fake-acp/ended.txt.

Scenarios (the agent answers in text what happened, one line per step):
  text                    three chunks: "Hello", " from", " ACP"
  history                 says the prompts this session had before this one
  read:<path>             fs/read_text_file of <path> (`./x`: x in its own workspace): "read ok <text>" or "read error <message>"
  flood:<n>               <n> fs/read_text_file of ./notes.txt at once: "flood <answered ok>/<n>"
  write:<path>            fs/write_text_file of "written by the agent" at <path>: "write ok" or "write error <message>"
  swap:<n>                races its client: flips ./swap between a file of its own ("inside") and a link to a file
                          outside the workspace, and ./swapdir between a folder and a link to a folder outside, while
                          it reads ./swap and writes ./swapdir/w.txt <n> times each (four at once): "swap leaked <reads
                          that returned outside bytes> wrote-outside <writes found outside> answered <reads answered>"
  terminal:<command>      terminal/create of `sh -c <command>` in its workspace, shown in a tool call (`term-call`),
                          then terminal/wait_for_exit, terminal/output and terminal/release: "terminal <exit code>
                          <output, trimmed>" or "terminal error <error>"
  terminal-at:<dir>       terminal/create of `pwd` with cwd <dir>: as `terminal`
  terminal-kill           terminal/create of `sleep 30`, then terminal/kill: "terminal-kill <exit status> <output
                          of its output request afterwards, as JSON>"
  terminal-flood:<bytes>   terminal/create of `yes … | head -c <bytes>` (kept: 1 MiB), shown in a tool call
                          (`flood-call`) until it ends: "flood <exit code> <length of its output> <truncated>"
  terminals-flood:<n>x<bytes>  <n> terminals at once (kept: 1 MiB each) of `yes … | head -c <bytes>`, each shown in a
                          tool call (`flood-<i>`) until it ends: "floods <exit code> …"
  terminals-procs:<n>     <n> terminals one after the other, each starting 15 `sleep 3170` (Python, counting the
                          forks refused) and sleeping: "terminals-procs <what each said> | …", left running
  terminals-memory:<n>    <n> terminals one after the other, each holding 200 MiB and sleeping: "terminals-memory
                          held | refused | <exit status> | …", left running
  terminal-sleep          terminal/create of a command that starts a `setsid` daemon (`sleep 3171`) and sleeps
                          (`sleep 3172`), shown in a tool call; says "sleeping", then waits for session/cancel and
                          answers `cancelled`, leaving the terminal as it is (neither killed nor released)
  shell:<command>         runs `sh -c <command>` itself (inside its sandbox): "shell <exit> <stdout>"
  form                    elicitation/create of a form in its session (one text field, `name`): "form <result>"
  permission              a tool call, then session/request_permission: "permission <optionId or cancelled>"
  ask-and-exit            asks for a form (elicitation/create) and a permission, waits for neither, and exits 3
                          half a second later (an agent that crashes while the editor shows its questions)
  sleep                   waits for session/cancel, then answers `cancelled`
  hang                    ignores session/cancel and never answers
  crash                   one chunk, then exits 3 with "fake agent crashed" on stderr
  mcp                     says the MCP servers session/new or session/load gave it (name and command or url)
  options                 says its session's `model` option (`session/set_config_option` sets it)
  settings                with FAKE_ACP_MODES=1: says its session's mode and model ("mode <id> model <id>")
  switch-mode:<id>        changes its own mode (current_mode_update), as an agent leaving plan mode does
  images                  says the image blocks of its prompt (their MIME types and sizes)
  whoami                  says this process's token (a new process has a new one)
  tool                    a tool call with a location in the workspace, left in progress, then end_turn
Environment: FAKE_ACP_NO_LOAD=1 (no loadSession), FAKE_ACP_RESUME=1 (sessionCapabilities.resume: session/resume
continues a session without replaying it), FAKE_ACP_HANG_INIT=1 (never answers initialize), FAKE_ACP_SLOW_INIT=S (busy for S s first),
FAKE_ACP_GARBAGE=1 (prints a line that is not JSON-RPC first), FAKE_ACP_MODES=1 (no config options: its modes and
models said the older way, `modes` and `models` of session/new, set by session/set_mode and session/set_model, as
Gemini CLI does; each new process starts at mode `ask` and model `fast`), FAKE_ACP_LATE_REPLAY=1 (session/load is
answered first and replayed after, slowly, before the next message is read, as Gemini CLI does), FAKE_ACP_AUTH=1 (offers a login method and
refuses session/new and session/load with -32000, as an agent that is not logged in does).
"""

import json
import os
import subprocess
import sys
import threading
import time
import uuid
import time

HOME = os.environ.get("HOME", "/tmp")
STATE = os.path.join(HOME, ".fake-acp")
os.makedirs(STATE, exist_ok=True)
WRITE_LOCK = threading.Lock()
PENDING = {}
PENDING_LOCK = threading.Lock()
CANCELLED = {}
NEXT_ID = [1000]
MCP = {}
MODEL = {}
MODE = {}
OLD_STYLE = os.environ.get("FAKE_ACP_MODES") == "1"
TOKEN = uuid.uuid4().hex[:12]


def send(message):
    with WRITE_LOCK:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def record(message):
    with open(os.path.join(STATE, "received.jsonl"), "a") as f:
        f.write(json.dumps(message) + "\n")


def request(method, params):
    """Sends a request to the client and waits for its answer (a dict with result or error)."""
    with PENDING_LOCK:
        NEXT_ID[0] += 1
        rid = NEXT_ID[0]
        event = threading.Event()
        PENDING[rid] = [event, None]
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    event.wait()
    with PENDING_LOCK:
        return PENDING.pop(rid)[1]


def update(session, body):
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": body}})


def say(session, text):
    update(session, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})


def path_of(session):
    return os.path.join(STATE, session + ".json")


def load(session):
    try:
        with open(path_of(session)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save(session, history):
    with open(path_of(session), "w") as f:
        json.dump(history, f)


def prompt_text(params):
    return "".join(b.get("text", "") for b in params.get("prompt", []) if b.get("type") == "text")


def scenario(text):
    marker = text.rfind("SCENARIO:")
    if marker < 0:
        return "text", ""
    rest = text[marker + len("SCENARIO:"):].strip()
    name, _, arg = rest.partition(":")
    return name.split()[0] if name else "text", arg.strip()


def run_prompt(rid, params):
    session = params["sessionId"]
    history = load(session)
    if history is None:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32002, "message": f"no session {session}"}})
        return
    text = prompt_text(params)
    name, arg = scenario(text)
    if arg.startswith("./"):
        # A path in its own workspace, as it sees it (in review mode without bubblewrap: the copy's folder).
        arg = os.path.join(os.getcwd(), arg[2:])
    answer = []

    def line(t):
        answer.append(t)
        say(session, t + "\n")

    stop = "end_turn"
    if name == "text":
        for piece in ["Hello", " from", " ACP"]:
            say(session, piece)
        answer.append("Hello from ACP")
    elif name == "history":
        line("history " + json.dumps([turn["prompt"] for turn in history]))
    elif name == "read":
        got = request("fs/read_text_file", {"sessionId": session, "path": arg})
        if "result" in got:
            line("read ok " + got["result"].get("content", ""))
        else:
            line("read error " + json.dumps(got.get("error")))
    elif name == "flood":
        n = int(arg or "100")
        results = []
        where = os.path.join(os.getcwd(), "notes.txt")

        def one():
            got = request("fs/read_text_file", {"sessionId": session, "path": where})
            results.append("result" in got)
        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        line(f"flood {sum(results)}/{n}")
    elif name == "write":
        got = request("fs/write_text_file", {"sessionId": session, "path": arg, "content": "written by the agent"})
        line("write ok" if "result" in got else "write error " + json.dumps(got.get("error")))
    elif name == "swap":
        n = int(arg or "1000")
        ws = os.getcwd()
        outside, outdir = os.path.join(HOME, "outside.txt"), os.path.join(HOME, "outside-dir")
        os.makedirs(outdir, exist_ok=True)
        with open(outside, "w") as f:
            f.write("OUTSIDE-BYTES")
        swap, swapdir = os.path.join(ws, "swap"), os.path.join(ws, "swapdir")
        os.makedirs(swapdir, exist_ok=True)
        done = threading.Event()

        def flip():
            while not done.is_set():
                for target in (outside, None):
                    tmp = swap + ".new"
                    if target:
                        os.symlink(target, tmp)
                    else:
                        with open(tmp, "w") as f:
                            f.write("inside")
                    os.replace(tmp, swap)
                try:
                    os.rename(swapdir, swapdir + ".real")
                    os.symlink(outdir, swapdir)
                    os.unlink(swapdir)
                    os.rename(swapdir + ".real", swapdir)
                except OSError:
                    pass
        flipper = threading.Thread(target=flip)
        flipper.start()
        results = {"leaked": 0, "answered": 0}
        lock = threading.Lock()

        def worker(count):
            for _ in range(count):
                got = request("fs/read_text_file", {"sessionId": session, "path": swap})
                request("fs/write_text_file", {"sessionId": session, "path": os.path.join(swapdir, "w.txt"),
                                               "content": "written by the agent"})
                with lock:
                    results["answered"] += 1
                    if "OUTSIDE" in json.dumps(got):
                        results["leaked"] += 1
        workers = [threading.Thread(target=worker, args=(n // 4 + (1 if i < n % 4 else 0),)) for i in range(4)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        done.set()
        flipper.join()
        wrote_outside = len(os.listdir(outdir))
        line(f"swap leaked {results['leaked']} wrote-outside {wrote_outside} answered {results['answered']}")
    elif name in ("terminal", "terminal-at"):
        made = {"sessionId": session, "command": "sh", "args": ["-c", arg], "outputByteLimit": 4096}
        if name == "terminal-at":
            made = {"sessionId": session, "command": "pwd", "cwd": arg}
        got = request("terminal/create", made)
        if "result" not in got:
            line("terminal error " + json.dumps(got.get("error")))
        else:
            tid = got["result"]["terminalId"]
            shown = [{"type": "content", "content": {"type": "text", "text": "running:"}},
                     {"type": "terminal", "terminalId": tid}]
            update(session, {"sessionUpdate": "tool_call", "toolCallId": "term-call", "title": "Run", "kind": "execute",
                             "status": "in_progress", "content": shown})
            waited = request("terminal/wait_for_exit", {"sessionId": session, "terminalId": tid})
            output = request("terminal/output", {"sessionId": session, "terminalId": tid})
            update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "term-call", "status": "completed",
                             "content": shown})
            request("terminal/release", {"sessionId": session, "terminalId": tid})
            again = request("terminal/output", {"sessionId": session, "terminalId": tid})
            line(f"terminal {waited['result'].get('exitCode')} {output['result']['output'].strip()}")
            line("after release " + json.dumps(again.get("error", {}).get("message")))
    elif name == "terminal-flood":
        made = {"sessionId": session, "command": "sh", "outputByteLimit": 1048576,
                "args": ["-c", f"yes FLOOD-LINE-0123456789 | head -c {int(arg)}"]}
        tid = request("terminal/create", made)["result"]["terminalId"]
        shown = [{"type": "terminal", "terminalId": tid}]
        update(session, {"sessionUpdate": "tool_call", "toolCallId": "flood-call", "title": "Flood", "kind": "execute",
                         "status": "in_progress", "content": shown})
        waited = request("terminal/wait_for_exit", {"sessionId": session, "terminalId": tid})["result"]
        output = request("terminal/output", {"sessionId": session, "terminalId": tid})["result"]
        update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "flood-call", "status": "completed",
                         "content": shown})
        request("terminal/release", {"sessionId": session, "terminalId": tid})
        line(f"flood {waited.get('exitCode')} {len(output['output'])} {output['truncated']}")
    elif name == "terminals-flood":
        count, size = (int(part) for part in arg.split("x"))
        made = {"sessionId": session, "command": "sh", "args": ["-c", f"yes FLOOD-LINE-0123456789 | head -c {size}"]}
        tids = [request("terminal/create", made)["result"]["terminalId"] for _ in range(count)]
        for i, tid in enumerate(tids):
            update(session, {"sessionUpdate": "tool_call", "toolCallId": f"flood-{i}", "title": "Flood",
                             "kind": "execute", "status": "in_progress",
                             "content": [{"type": "terminal", "terminalId": tid}]})
        codes = []
        for i, tid in enumerate(tids):
            codes.append(request("terminal/wait_for_exit", {"sessionId": session, "terminalId": tid})["result"].get("exitCode"))
            update(session, {"sessionUpdate": "tool_call_update", "toolCallId": f"flood-{i}", "status": "completed",
                             "content": [{"type": "terminal", "terminalId": tid}]})
            request("terminal/release", {"sessionId": session, "terminalId": tid})
        line("floods " + " ".join(str(code) for code in codes))
    elif name in ("terminals-procs", "terminals-memory"):
        if name == "terminals-procs":
            code = ("import subprocess, time\nstarted = failed = 0\nfor i in range(15):\n"
                    "    try:\n        subprocess.Popen(['sleep', '3170']); started += 1\n"
                    "    except OSError:\n        failed += 1\n"
                    "print('started', started, 'failed', failed, flush=True)\ntime.sleep(3170)")
        else:
            code = ("import time\ntry:\n    b = bytearray(200 << 20)\n    for i in range(0, len(b), 4096):\n"
                    "        b[i] = 1\n    print('held', flush=True)\nexcept MemoryError:\n"
                    "    print('refused', flush=True)\ntime.sleep(3170)")
        said = []
        for _ in range(int(arg)):
            got = request("terminal/create", {"sessionId": session, "command": "python3", "args": ["-c", code]})
            if "result" not in got:
                said.append("refused")
                continue
            tid = got["result"]["terminalId"]
            # One after the other: each starts once the one before said what it got (or ended).
            while True:
                out = request("terminal/output", {"sessionId": session, "terminalId": tid})["result"]
                if out["output"].strip() or out.get("exitStatus"):
                    break
                threading.Event().wait(0.05)
            said.append(out["output"].strip() or json.dumps(out.get("exitStatus")))
        line(f"{name} " + " | ".join(said))
    elif name == "terminal-sleep":
        CANCELLED[session] = threading.Event()
        made = {"sessionId": session, "command": "sh", "args": ["-c", "setsid sleep 3171 & exec sleep 3172"]}
        tid = request("terminal/create", made)["result"]["terminalId"]
        update(session, {"sessionUpdate": "tool_call", "toolCallId": "sleep-call", "title": "Sleep", "kind": "execute",
                         "status": "in_progress", "content": [{"type": "terminal", "terminalId": tid}]})
        say(session, "sleeping\n")
        CANCELLED[session].wait()
        stop = "cancelled"
    elif name == "terminal-kill":
        tid = request("terminal/create", {"sessionId": session, "command": "sleep 30"})["result"]["terminalId"]
        request("terminal/kill", {"sessionId": session, "terminalId": tid})
        waited = request("terminal/wait_for_exit", {"sessionId": session, "terminalId": tid})["result"]
        output = request("terminal/output", {"sessionId": session, "terminalId": tid})["result"]
        line(f"terminal-kill {json.dumps(waited)} {json.dumps(output)}")
    elif name == "shell":
        done = subprocess.run(["sh", "-c", arg], capture_output=True, text=True)
        line(f"shell {done.returncode} {done.stdout.strip()}")
    elif name == "form":
        schema = {"type": "object", "properties": {"name": {"type": "string", "title": "Your name"}}, "required": ["name"]}
        got = request("elicitation/create", {"mode": "form", "sessionId": session, "requestedSchema": schema,
                                             "message": "Who are you?"})
        line("form " + json.dumps(got.get("result", got.get("error"))))
    elif name == "permission":
        call = {"toolCallId": "perm-1", "title": "Delete everything", "kind": "delete", "status": "pending"}
        update(session, dict(sessionUpdate="tool_call", **call))
        options = [
            {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
            {"optionId": "no", "name": "Reject", "kind": "reject_once"},
        ]
        got = request("session/request_permission", {"sessionId": session, "toolCall": call, "options": options})
        outcome = got.get("result", {}).get("outcome", {})
        chosen = outcome.get("optionId") if outcome.get("outcome") == "selected" else "cancelled"
        update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "perm-1", "status": "completed"})
        line(f"permission {chosen}")
    elif name == "ask-and-exit":
        schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
        send({"jsonrpc": "2.0", "id": 9001, "method": "elicitation/create",
              "params": {"mode": "form", "sessionId": session, "requestedSchema": schema, "message": "Who are you?"}})
        call = {"toolCallId": "perm-exit", "title": "Delete everything", "kind": "delete", "status": "pending"}
        update(session, dict(sessionUpdate="tool_call", **call))
        options = [{"optionId": "yes", "name": "Allow", "kind": "allow_once"}]
        send({"jsonrpc": "2.0", "id": 9002, "method": "session/request_permission",
              "params": {"sessionId": session, "toolCall": call, "options": options}})
        threading.Event().wait(0.5)
        sys.stderr.write("fake agent left its questions open\n")
        sys.stderr.flush()
        os._exit(3)
    elif name == "sleep":
        CANCELLED[session] = threading.Event()
        say(session, "sleeping\n")
        CANCELLED[session].wait()
        stop = "cancelled"
    elif name == "hang":
        say(session, "hanging\n")
        threading.Event().wait()
    elif name == "crash":
        say(session, "about to crash\n")
        sys.stderr.write("fake agent crashed\n")
        sys.stderr.flush()
        os._exit(3)
    elif name == "options":
        line("model " + MODEL.get(session, "fast"))
    elif name == "settings":
        line("mode " + MODE.get(session, "ask") + " model " + MODEL.get(session, "fast"))
    elif name == "switch-mode":
        MODE[session] = arg
        update(session, {"sessionUpdate": "current_mode_update", "currentModeId": arg})
        line("switched to " + arg)
    elif name == "images":
        images = [b for b in params.get("prompt", []) if b.get("type") == "image"]
        line("images " + json.dumps([[b.get("mimeType"), len(b.get("data", ""))] for b in images]))
    elif name == "whoami":
        line("process " + TOKEN)
    elif name == "mcp":
        line("mcp " + json.dumps(MCP.get(session, [])))
    elif name == "tool":
        where = os.path.join(os.getcwd(), "src/main.rs")
        update(session, {"sessionUpdate": "tool_call", "toolCallId": "t-open", "title": "Read main",
                         "kind": "read", "status": "in_progress", "locations": [{"path": where}]})
        line("left a tool open")
    history.append({"prompt": text, "answer": "".join(answer)})
    save(session, history)
    send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": stop}})


def options(session):
    """The session's config options: one select, `model` (none with FAKE_ACP_MODES=1)."""
    if OLD_STYLE:
        return None
    return [{"id": "model", "name": "Model", "category": "model", "type": "select",
             "currentValue": MODEL.get(session, "fast"),
             "options": [{"value": "fast", "name": "Fast"}, {"value": "smart", "name": "Smart"}]}]


def settings(session, result):
    """`result` with the session's modes and models, the older way, where FAKE_ACP_MODES=1 says so."""
    if OLD_STYLE:
        result["modes"] = {"currentModeId": MODE.get(session, "ask"), "availableModes": [
            {"id": "ask", "name": "Ask", "description": "Asks before it acts"},
            {"id": "code", "name": "Code"}, {"id": "plan", "name": "Plan", "description": "Reads only"}]}
        result["models"] = {"currentModelId": MODEL.get(session, "fast"), "availableModels": [
            {"modelId": "fast", "name": "Fast"}, {"modelId": "smart", "name": "Smart"}]}
    else:
        result["configOptions"] = options(session)
    return result


def servers(params):
    return [{"name": s.get("name"), "command": s.get("command"), "url": s.get("url")}
            for s in params.get("mcpServers", [])]


def main():
    if "--version" in sys.argv:
        # Standing in for OpenCode (`--opencode-bin`), it prints the version the test gives it.
        print(os.environ.get("OPENCODE_FAKE_VERSION") or "fake-acp-agent 0.1.0")
        return
    if os.environ.get("FAKE_ACP_GARBAGE") == "1":
        sys.stdout.write("this is not JSON-RPC\n")
        sys.stdout.flush()
    counter = [0]
    for raw in sys.stdin:
        raw = raw.strip()
        if not raw:
            continue
        message = json.loads(raw)
        record(message)
        method, rid, params = message.get("method"), message.get("id"), message.get("params") or {}
        if method is None:
            with PENDING_LOCK:
                if rid in PENDING:
                    PENDING[rid][1] = message
                    PENDING[rid][0].set()
            continue
        if method == "initialize":
            if os.environ.get("FAKE_ACP_HANG_INIT") == "1":
                continue
            # A slow start that is busy all along (a loaded machine): CPU used for this many seconds first.
            busy_until = time.time() + float(os.environ.get("FAKE_ACP_SLOW_INIT") or 0)
            while time.time() < busy_until:
                pass
            load_ok = os.environ.get("FAKE_ACP_NO_LOAD") != "1"
            sessions = {"resume": {}} if os.environ.get("FAKE_ACP_RESUME") == "1" else {}
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": load_ok, "mcpCapabilities": {"http": True},
                                      "promptCapabilities": {"image": True},
                                      "sessionCapabilities": sessions},
                "agentInfo": {"name": "fake-acp-agent", "version": "0.1.0"},
                "authMethods": [{"id": "fake-login", "name": "Fake sign-in", "description": "Signs in"}]
                if os.environ.get("FAKE_ACP_AUTH") == "1" else [],
            }})
        elif method in ("session/new", "session/load") and os.environ.get("FAKE_ACP_AUTH") == "1":
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": "Authentication required"}})
        elif method == "session/new":
            counter[0] += 1
            session = f"fake-{os.getpid()}-{counter[0]}"
            save(session, [])
            MCP[session] = servers(params)
            send({"jsonrpc": "2.0", "id": rid, "result": settings(session, {"sessionId": session})})
            update(session, {"sessionUpdate": "available_commands_update", "availableCommands": [
                {"name": "greet", "description": "Says hello", "input": {"hint": "whom"}}]})
        elif method == "session/load":
            session = params["sessionId"]
            history = load(session)
            if history is None:
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32002, "message": f"no session {session}"}})
                continue
            MCP[session] = servers(params)
            late = os.environ.get("FAKE_ACP_LATE_REPLAY") == "1"
            if late:
                send({"jsonrpc": "2.0", "id": rid, "result": settings(session, {})})
            for turn in history:
                update(session, {"sessionUpdate": "user_message_chunk",
                                 "content": {"type": "text", "text": turn["prompt"]}})
                say(session, "REPLAYED " + turn["answer"])
                if late:
                    time.sleep(0.2)
            if not late:
                send({"jsonrpc": "2.0", "id": rid, "result": settings(session, {})})
        elif method == "session/resume":
            session = params["sessionId"]
            if load(session) is None:
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32002, "message": f"no session {session}"}})
                continue
            MCP[session] = servers(params)
            send({"jsonrpc": "2.0", "id": rid, "result": settings(session, {})})
        elif method == "session/set_mode" and OLD_STYLE:
            if params.get("modeId") not in ("ask", "code", "plan"):
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "no such mode"}})
                continue
            MODE[params["sessionId"]] = params["modeId"]
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "session/set_model" and OLD_STYLE:
            if params.get("modelId") not in ("fast", "smart"):
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "no such model"}})
                continue
            MODEL[params["sessionId"]] = params["modelId"]
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "session/set_config_option":
            session, value = params["sessionId"], params.get("value")
            if params.get("configId") != "model" or value not in ("fast", "smart"):
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"no such value {value}"}})
                continue
            MODEL[session] = value
            send({"jsonrpc": "2.0", "id": rid, "result": {"configOptions": options(session)}})
        elif method == "session/prompt":
            threading.Thread(target=run_prompt, args=(rid, params), daemon=True).start()
        elif method == "session/cancel":
            CANCELLED.setdefault(params.get("sessionId"), threading.Event()).set()
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}})
    # The end of its input: what it keeps is written now (a test sees that it had the chance).
    with open(os.path.join(STATE, "ended.txt"), "a") as f:
        f.write(f"{os.getpid()} saw the end of its input\n")


if __name__ == "__main__":
    main()
