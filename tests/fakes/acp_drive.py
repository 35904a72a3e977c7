#!/usr/bin/env python3
"""Drives a real ACP agent from npm (Claude Code, Codex, Gemini CLI) over its stdio against a fake model server.

Usage:
  acp_drive.py --agent claude|codex|gemini [--port N | --record FILE] --workspace DIR --home DIR [--bin PATH]
               [--checks LIST] [--timeout SECONDS] [--summary FILE] [--plain] [--env NAME=VALUE ...]

With --port the fake model server must already listen on 127.0.0.1:N (tests/fakes/fake_anthropic.py for claude,
fake_openai_responses.py for codex, fake_gemini.py for gemini); without it the driver starts that fake itself. The
agent runs with HOME=DIR (and its own config written there: $CODEX_HOME/config.toml for codex,
~/.gemini/settings.json for gemini), so nothing outside DIR and the workspace is touched. --bin defaults to the
agent installed by .ci/install-acp-agents.sh. The environment also turns off each agent's telemetry, update checks
and other traffic the test does not need; --plain leaves those on, to see what an agent contacts by default. Env:
ACP_DRIVE_CODEX_MODE (codex-acp's INITIAL_AGENT_MODE, default agent-full-access), ACP_DRIVE_CODEX_SANDBOX_LINK (the
codex binary, linked as codex-linux-sandbox on PATH, which Codex's own sandbox needs when CODEX_HOME is under /tmp),
ACP_DRIVE_CODEX_FEATURES (more `name = value` lines for config.toml's [features], comma-separated, e.g.
`unified_exec = false`).

The driver speaks ACP JSON-RPC (newline-delimited) and prints every message it sends (`->`) and receives (`<-`).
It says it has no fs and no terminal (clientCapabilities {fs: {readTextFile: false, writeTextFile: false},
terminal: false}); any fs/* or terminal/* request is answered with an error and reported. session/request_permission
is answered with an allow option (allow_once first). Checks (--checks, comma-separated, default text,write,cancel):
  text    prompt `SCENARIO:text`: at least two agent_message_chunk updates, stopReason end_turn
  write   prompt `SCENARIO:write`: a tool call (a tool_call update or a session/request_permission naming it) that
          completes, hello.txt in the workspace holds `hi from <agent>`, stopReason end_turn
  cancel  prompt `SCENARIO:slow`: session/cancel after the first chunk; the prompt must end with stopReason
          cancelled
  cancel-tool  (not in the default) prompt `SCENARIO:sleep:<n>`: session/cancel 2 s into the shell tool running
          `sleep <n>`; the prompt must end cancelled and the sleep must be gone within 5 s
Exits 0 when every check passed, 1 otherwise. The last line on stdout is `SUMMARY <json>` (also written to
--summary FILE): the initialize answer, the session/new answer, the agent's requests to the client, each check's
result and the files the agent left under HOME.
"""

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "acp-sandbox")
DEFAULT_BINS = {
    "claude": "claude-agent-acp@0.101.0/node_modules/.bin/claude-agent-acp",
    "codex": "codex-acp@2.6.0/node_modules/.bin/codex-acp",
    "gemini": "gemini-cli@0.61.0/node_modules/.bin/gemini",
}
FAKE_KEY = "fake-key-not-a-secret"
FAKES = {"claude": "fake_anthropic.py", "codex": "fake_openai_responses.py", "gemini": "fake_gemini.py"}


def agent_command(agent, binary):
    if agent == "gemini":
        return [binary, "--acp"]
    return [binary]


def agent_env(agent, port, home, plain=False):
    """The environment an agent runs with: a temp HOME, the fake server, and no nonessential traffic (unless `plain`:
    then only what it needs to talk to the fake, to see what else it contacts)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "OPENAI_", "GEMINI_", "GOOGLE_", "CODEX_", "CLAUDE_"))
           and k != "IS_SANDBOX"}
    env.update(HOME=home, XDG_CONFIG_HOME=os.path.join(home, ".config"), XDG_CACHE_HOME=os.path.join(home, ".cache"),
               XDG_DATA_HOME=os.path.join(home, ".local/share"), XDG_STATE_HOME=os.path.join(home, ".local/state"),
               NO_COLOR="1")
    base = f"http://127.0.0.1:{port}"
    if agent == "claude":
        env.update(ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY=FAKE_KEY)
        if not plain:
            env.update(CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1",
                       DISABLE_ERROR_REPORTING="1", DISABLE_BUG_COMMAND="1", DISABLE_COST_WARNINGS="1",
                       CLAUDE_CODE_DISABLE_TERMINAL_TITLE="1", CLAUDE_CODE_ENABLE_TELEMETRY="0", DISABLE_UPDATES="1",
                       DISABLE_GROWTHBOOK="1", CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION="false",
                       CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY="1",
                       CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL="1")
        # Without a configured default, claude-agent-acp starts in mode "auto", which the CLI refuses as root
        # ("--dangerously-skip-permissions cannot be used with root/sudo", unless IS_SANDBOX=1). "default" asks the
        # client (session/request_permission) before each tool, which is what the driver checks.
        claude_dir = os.path.join(home, ".claude")
        os.makedirs(claude_dir, exist_ok=True)
        with open(os.path.join(claude_dir, "settings.json"), "w", encoding="utf-8") as f:
            json.dump({"permissions": {"defaultMode": "default"}}, f, indent=2)
    elif agent == "codex":
        codex_home = os.path.join(home, ".codex")
        os.makedirs(codex_home, exist_ok=True)
        with open(os.path.join(codex_home, "config.toml"), "w", encoding="utf-8") as f:
            f.write(codex_config(port, plain))
        env.update(CODEX_HOME=codex_home, FAKE_OPENAI_API_KEY=FAKE_KEY)
        if not plain:
            env.update(CODEX_ACP_PROMPT_SUGGESTIONS="false")
        # codex-acp's mode (approval + sandbox preset) at session start: read-only, workspace-write, agent (its
        # default: auto review, with Codex's own bubblewrap sandbox) or agent-full-access (no sandbox of its own,
        # never asks). The default here is agent-full-access: inside the bridge's sandbox Codex needs none of its own.
        env["INITIAL_AGENT_MODE"] = os.environ.get("ACP_DRIVE_CODEX_MODE") or "agent-full-access"
        if os.environ.get("ACP_DRIVE_CODEX_SANDBOX_LINK"):
            # Codex's own sandbox runs `bwrap ... -- codex-linux-sandbox ...` found on PATH: a link to the codex binary.
            link_dir = os.path.join(home, "codex-bin")
            os.makedirs(link_dir, exist_ok=True)
            link = os.path.join(link_dir, "codex-linux-sandbox")
            if not os.path.lexists(link):
                os.symlink(os.environ["ACP_DRIVE_CODEX_SANDBOX_LINK"], link)
            env["PATH"] = link_dir + os.pathsep + env.get("PATH", "")
    elif agent == "gemini":
        gemini_dir = os.path.join(home, ".gemini")
        os.makedirs(gemini_dir, exist_ok=True)
        with open(os.path.join(gemini_dir, "settings.json"), "w", encoding="utf-8") as f:
            json.dump(gemini_settings(plain), f, indent=2)
        env.update(GEMINI_API_KEY=FAKE_KEY, GOOGLE_GEMINI_BASE_URL=base, GEMINI_CLI_NO_RELAUNCH="true")
    return env


def codex_config(port, plain=False):
    config = f"""# Written by tests/fakes/acp_drive.py: Codex against the fake Responses API on 127.0.0.1.
# A model Codex knows, so it does not warn "Model metadata for `...` not found" into the first answer.
model = "gpt-5.5"
model_provider = "fake"
check_for_update_on_startup = false

[model_providers.fake]
name = "Fake"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "FAKE_OPENAI_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"""
    if plain:
        return config
    return config + """
[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

# Without these Codex runs `git ls-remote https://github.com/openai/plugins.git HEAD` at start.
[features]
plugins = false
plugin_discovery_prefetch = false
remote_plugin = false
apps = false
""" + "".join(f"{line.strip()}\n" for line in os.environ.get("ACP_DRIVE_CODEX_FEATURES", "").split(",") if line.strip())


def gemini_settings(plain=False):
    if plain:
        return {"security": {"auth": {"selectedType": "gemini-api-key"}}}
    return {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "model": {"name": "gemini-2.5-flash"},
    }


class Agent:
    """An ACP agent over stdio: send requests, read messages, answer the agent's own requests."""

    def __init__(self, command, env, cwd, stderr_path):
        self.stderr = open(stderr_path, "wb")
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=env, cwd=cwd)
        self.inbox = queue.Queue()
        self.next_id = 1
        self.client_requests = []  # (method, params) of every request the agent sent us
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                self.inbox.put(json.loads(line))
            except ValueError:
                print(f"<- (not JSON) {line[:500]!r}", flush=True)
        self.inbox.put(None)

    def send(self, message):
        print("-> " + json.dumps(message), flush=True)
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def call(self, method, params, timeout, on_message=None):
        """Sends a request and waits for its answer, handling what arrives meanwhile. Returns (result, error)."""
        ident = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError(f"{method}: no answer in {timeout} s")
            try:
                message = self.inbox.get(timeout=min(left, 0.2))
            except queue.Empty:
                if on_message:
                    on_message({})  # a tick, so a caller can act on time (cancel a few seconds into a tool)
                continue
            if message is None:
                raise EOFError(f"{method}: the agent closed its stdout (exit {self.proc.poll()})")
            print("<- " + json.dumps(message), flush=True)
            if "method" in message and "id" in message:
                self.answer(message)
            elif "id" in message and message.get("id") == ident:
                return message.get("result"), message.get("error")
            if on_message:
                on_message(message)

    def answer(self, request):
        method, params = request["method"], request.get("params") or {}
        self.client_requests.append({"method": method, "params": params})
        if method == "session/request_permission":
            options = params.get("options") or []
            chosen = next((o for o in options if o.get("kind") == "allow_once"), None) or \
                next((o for o in options if o.get("kind") == "allow_always"), None) or \
                next((o for o in options if "allow" in (o.get("kind") or "")), None)
            if chosen:
                result = {"outcome": {"outcome": "selected", "optionId": chosen["optionId"]}}
            else:
                result = {"outcome": {"outcome": "cancelled"}}
            self.send({"jsonrpc": "2.0", "id": request["id"], "result": result})
        else:
            # fs/*, terminal/* and anything else: we said we have none of it.
            self.send({"jsonrpc": "2.0", "id": request["id"],
                       "error": {"code": -32601, "message": f"method not supported by this client: {method}"}})

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def updates_of(messages, session_id):
    return [m["params"]["update"] for m in messages
            if m.get("method") == "session/update" and (m.get("params") or {}).get("sessionId") == session_id]


def prompt(agent, session_id, text, timeout, on_message=None):
    seen = []

    def keep(message):
        seen.append(message)
        if on_message:
            on_message(message)
    result, error = agent.call("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]},
                               timeout, keep)
    return result, error, updates_of(seen, session_id)


def sleepers(seconds):
    """The pids of processes running `sleep <seconds>`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) >= 2 and os.path.basename(argv[0]) == b"sleep" and argv[1] == str(seconds).encode():
            found.append(int(pid))
    return found


def files_under(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            out.append(os.path.relpath(path, root))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", required=True, choices=sorted(DEFAULT_BINS))
    parser.add_argument("--port", type=int,
                        help="the fake model server's port; without it the driver starts the agent's fake itself")
    parser.add_argument("--record", help="with no --port: the fake's request record (default HOME/../model.jsonl)")
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--home", required=True)
    parser.add_argument("--bin")
    parser.add_argument("--checks", default="text,write,cancel")
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--summary")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="one more variable for the agent (after the driver's own), e.g. IS_SANDBOX=1")
    parser.add_argument("--plain", action="store_true",
                        help="only the settings an agent needs for the fake: no telemetry/update/traffic switches")
    args = parser.parse_args()
    workspace, home = os.path.abspath(args.workspace), os.path.abspath(args.home)
    os.makedirs(workspace, exist_ok=True)
    os.makedirs(home, exist_ok=True)
    binary = args.bin or os.path.join(CACHE, DEFAULT_BINS[args.agent])
    fake = None
    if args.port is None:
        record = os.path.abspath(args.record or os.path.join(os.path.dirname(home), "model.jsonl"))
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), FAKES[args.agent])
        fake = subprocess.Popen([sys.executable, script, "--record", record], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        line = fake.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            sys.exit(f"acp_drive: {FAKES[args.agent]} did not print its port")
        args.port = int(line[1])
        print(f"# started {FAKES[args.agent]} on 127.0.0.1:{args.port}, recording to {record}", flush=True)
    env = agent_env(args.agent, args.port, home, args.plain)
    env.update(item.split("=", 1) for item in args.env)
    stderr_path = os.path.join(home, f"{args.agent}-acp.stderr")
    command = agent_command(args.agent, binary)
    print(f"# running {command} in {workspace} with HOME={home} (agent stderr in {stderr_path})", flush=True)
    agent = Agent(command, env, workspace, stderr_path)
    summary = {"agent": args.agent, "command": command, "checks": {}}
    failed = []

    def check(name, ok, detail):
        summary["checks"][name] = {"ok": bool(ok), "detail": detail}
        print(f"# CHECK {name}: {'ok' if ok else 'FAILED'} {detail}", flush=True)
        if not ok:
            failed.append(name)

    try:
        init, error = agent.call("initialize", {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False},
            "clientInfo": {"name": "acp-drive", "title": "acp-sandbox test driver", "version": "0.1.0"},
        }, args.timeout)
        summary["initialize"] = init if error is None else {"error": error}
        if error:
            raise RuntimeError(f"initialize failed: {error}")
        new, error = agent.call("session/new", {"cwd": workspace, "mcpServers": []}, args.timeout)
        summary["session_new"] = new if error is None else {"error": error}
        if error:
            raise RuntimeError(f"session/new failed: {error}")
        session_id = new["sessionId"]
        checks = [c for c in args.checks.split(",") if c]
        if "text" in checks:
            result, error, updates = prompt(agent, session_id, "SCENARIO:text Say hello.", args.timeout)
            chunks = [u for u in updates if u.get("sessionUpdate") == "agent_message_chunk"]
            text = "".join((u.get("content") or {}).get("text", "") for u in chunks)
            stop = (result or {}).get("stopReason")
            check("text", error is None and len(chunks) >= 2 and stop == "end_turn" and "TEXT-ANSWER-OK" in text,
                  f"{len(chunks)} agent_message_chunk, text={text!r}, stopReason={stop!r}, error={error}")
        if "write" in checks:
            target = os.path.join(workspace, "hello.txt")
            asked_before = len(agent.client_requests)
            result, error, updates = prompt(agent, session_id, "SCENARIO:write Create hello.txt.", args.timeout)
            calls = [u for u in updates if u.get("sessionUpdate") == "tool_call"]
            asked = [r["params"].get("toolCall") or {} for r in agent.client_requests[asked_before:]
                     if r["method"] == "session/request_permission"]
            # Gemini CLI announces a tool that needs approval only in session/request_permission (no tool_call
            # update before it, only tool_call_update after): count both.
            ids = {c.get("toolCallId") for c in calls} | {c.get("toolCallId") for c in asked}
            finished = [u for u in updates if u.get("sessionUpdate") == "tool_call_update"
                        and u.get("status") == "completed" and u.get("toolCallId") in ids]
            content = open(target, encoding="utf-8").read() if os.path.exists(target) else None
            stop = (result or {}).get("stopReason")
            want = f"hi from {args.agent}"
            check("write", error is None and ids and finished and content is not None and content.strip() == want
                  and stop == "end_turn",
                  f"{len(calls)} tool_call update(s) ({[c.get('title') for c in calls]}), {len(asked)} permission "
                  f"request(s) ({[c.get('title') for c in asked]}), {len(finished)} completed, hello.txt={content!r}, "
                  f"stopReason={stop!r}, error={error}")
        if "cancel" in checks:
            state = {"sent": None}

            def cancel_on_first_chunk(message):
                update = ((message.get("params") or {}).get("update") or {})
                if update.get("sessionUpdate") == "agent_message_chunk" and state["sent"] is None:
                    state["sent"] = time.time()
                    agent.notify("session/cancel", {"sessionId": session_id})
            start = time.time()
            result, error, updates = prompt(agent, session_id, "SCENARIO:slow Talk slowly.", args.timeout,
                                            cancel_on_first_chunk)
            stop = (result or {}).get("stopReason")
            after = round(time.time() - (state["sent"] or start), 2)
            chunks = [u for u in updates if u.get("sessionUpdate") == "agent_message_chunk"]
            check("cancel", error is None and stop == "cancelled",
                  f"stopReason={stop!r} {after} s after session/cancel, {len(chunks)} chunks in all, error={error}")
        if "cancel-tool" in checks:
            # A shell tool running `sleep <n>` (n unique to this run), cancelled 2 s after it starts: the prompt must
            # end cancelled, and the sleep must be gone (the agent kills its tool's processes).
            seconds = 3000 + os.getpid() % 1000
            state = {"started": None, "sent": None}

            def cancel_during_tool(message):
                update = ((message.get("params") or {}).get("update") or {})
                kind = update.get("sessionUpdate")
                if state["started"] is None and (kind in ("tool_call", "tool_call_update")
                                                 or message.get("method") == "session/request_permission"):
                    state["started"] = time.time()
                if state["started"] and state["sent"] is None and time.time() - state["started"] > 2:
                    state["sent"] = time.time()
                    state["alive_before"] = sleepers(seconds)
                    agent.notify("session/cancel", {"sessionId": session_id})
            result, error, updates = prompt(agent, session_id, f"SCENARIO:sleep:{seconds} Sleep.", args.timeout,
                                            cancel_during_tool)
            stop = (result or {}).get("stopReason")
            after = round(time.time() - (state["sent"] or time.time()), 2)
            for _ in range(25):
                left = sleepers(seconds)
                if not left:
                    break
                time.sleep(0.2)
            statuses = [u.get("status") for u in updates if u.get("sessionUpdate") == "tool_call_update"
                        and u.get("status")]
            check("cancel-tool", error is None and stop == "cancelled" and not left,
                  f"stopReason={stop!r} {after} s after session/cancel, `sleep {seconds}` running before the cancel: "
                  f"{state.get('alive_before')}, left 5 s after the answer: {left}, tool statuses {statuses}, "
                  f"error={error}")
            state["left"] = left
    except (RuntimeError, TimeoutError, EOFError, OSError) as e:
        check("run", False, str(e))
    finally:
        agent.close()
        if "cancel-tool" in summary["checks"]:
            # What the agent left running is reported, then ended: only the sleep this run started (its duration).
            after_exit = sleepers(3000 + os.getpid() % 1000)
            summary["checks"]["cancel-tool"]["after_agent_exit"] = after_exit
            print(f"# after the agent exited, `sleep` still running: {after_exit}", flush=True)
            for pid in after_exit:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        summary["client_requests"] = [r["method"] for r in agent.client_requests]
        summary["fs_or_terminal_requests"] = [r for r in agent.client_requests
                                              if r["method"].startswith(("fs/", "terminal/"))]
        summary["home_files"] = files_under(home)
        summary["workspace_files"] = files_under(workspace)
        summary["exit_code"] = agent.proc.returncode
    if fake:
        fake.stdin.close()  # the fake exits when its stdin closes
        fake.wait(timeout=10)
    line = json.dumps(summary)
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as f:
            f.write(line + "\n")
    print("SUMMARY " + line, flush=True)
    print(f"# {'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
