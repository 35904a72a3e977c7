#!/usr/bin/env python3
"""A scripted OpenAI-compatible chat-completions server for tests/real_opencode.rs (the real OpenCode CLI talks to it).

Usage: fake_openai.py --record FILE [--port 0]
Prints `PORT <n>` on stdout once it listens on 127.0.0.1:<n>, then serves until killed (or until stdin closes).

`POST /v1/chat/completions` answers a stream of SSE chunks (`delta.content`, `delta.reasoning_content`,
`delta.tool_calls` with the arguments streamed in pieces, a last chunk with `usage`, then `data: [DONE]`).
Scenarios: text, followup, tools, review (edit, write, rm), hostilereview (NUL, invalid UTF-8, rm, mv, ln, setuid),
linkfile:<1|2> (a link to the path in .victim, then a file in its place), planedit (write, edit, bash),
subagent (a task whose subagent runs childbash), readback (read notes.txt), todo, reasoning, longbash:<n>, attack, error, tokens:<n> (n pieces 200 ms
apart), livebash:<n> (a bash tool printing a line a second), mcp:<server> (its tool `look`), system, question, rootbash (ROOT=<dir>, OTHER=<dir> in the prompt). The script is picked by a marker `SCENARIO:<name>[:<arg>]` in the last user message; the step is the number of
assistant messages after that user message, so a tool loop advances one step per model call. A request without
`tools` is OpenCode's title generator and gets a fixed short title. Every request is appended to FILE as one JSON
line: {"kind": "title"|"chat", "scenario", "arg", "step", "body"}.
"""

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "fake-model"
TITLE = "Fake test session"
RECORD_LOCK = threading.Lock()
MARKER = re.compile(r"SCENARIO:([A-Za-z0-9_-]+)(?::([A-Za-z0-9_.-]+))?")


def text_of(content):
    """The text of a message's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def locate(messages):
    """(scenario, arg, step) from the last user message carrying a marker and the assistant messages after it."""
    last_user = None
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            last_user = i
    if last_user is None:
        return "none", None, 0
    found = MARKER.findall(text_of(messages[last_user].get("content")))
    scenario, arg = found[-1] if found else ("none", "")
    step = sum(1 for m in messages[last_user + 1:] if m.get("role") == "assistant")
    return scenario, (arg or None), step


def tool(name, args):
    return ("tool", name, args)


def say(text):
    return ("text", text)


def think(text):
    return ("reasoning", text)


def last_user_text(messages):
    """The text of the last user message."""
    users = [m for m in messages if m.get("role") == "user"]
    return text_of(users[-1].get("content")) if users else ""


def script(scenario, arg, step, prompt=""):
    """What the model answers at `step` of `scenario`: a list of text/reasoning/tool items, or an HTTP error."""
    if scenario == "text":
        return [say("Hello from the fake model. "), say("PLAIN-ANSWER-OK")]
    if scenario == "followup":
        return [say("FOLLOWUP-OK: I remember the earlier turn.")]
    if scenario == "tools":
        steps = [
            [say("I will write the file."), tool("write", {"filePath": "hello.txt", "content": "hello from fake model\n"})],
            [tool("bash", {"command": "cat hello.txt && echo bash-ok", "description": "Show file"})],
            [tool("read", {"filePath": "hello.txt"})],
            [tool("edit", {"filePath": "hello.txt", "oldString": "hello from fake model",
                           "newString": "hello EDITED by fake model"})],
        ]
        return steps[step] if step < len(steps) else [say("TOOLS-DONE")]
    if scenario == "review":
        # For review mode: an edit of an existing file, a new file, a deletion.
        steps = [
            [tool("edit", {"filePath": "notes.txt", "oldString": "line one", "newString": "line two"})],
            [tool("write", {"filePath": "new.txt", "content": "brand new\n"})],
            [tool("bash", {"command": "rm gone.txt", "description": "Remove gone.txt"})],
        ]
        return steps[step] if step < len(steps) else [say("REVIEW-DONE")]
    if scenario == "hostilereview":
        # For review mode: what the editor cannot show, in one bash tool: a script with a NUL byte, invalid UTF-8,
        # a deletion, a rename, a link to /etc/passwd, a setuid bit.
        if step == 0:
            command = ("printf '#!/bin/sh\\n\\0' > script.sh && chmod 755 script.sh && printf '\\377\\n' > bad.txt"
                       " && rm gone.txt && mv old.txt moved.txt && ln -s /etc/passwd p && chmod 4755 tool.sh")
            return [tool("bash", {"command": command, "description": "Rearrange the project"})]
        return [say("HOSTILE-REVIEW-DONE")]
    if scenario == "linkfile":
        # <arg> 1: a link `p` to the path in `.victim`; 2: the link replaced by a file.
        if step == 0:
            command = 'ln -s "$(cat .victim)" p' if arg == "1" else "rm p && echo evil > p"
            return [tool("bash", {"command": command, "description": "Link, then write"})]
        return [say("LINKFILE-DONE")]
    if scenario == "planedit":
        # Plan mode: a new file, an edit of an existing one, a command; each must be refused.
        steps = [
            [tool("write", {"filePath": "new.txt", "content": "written in plan mode\n"})],
            [tool("edit", {"filePath": "notes.txt", "oldString": "line one", "newString": "edited in plan mode"})],
            [tool("bash", {"command": "echo ran > ran.txt", "description": "Write ran.txt"})],
        ]
        return steps[step] if step < len(steps) else [say("PLANEDIT-DONE")]
    if scenario == "subagent":
        # A subagent (the task tool) whose own session runs a command: scenario childbash.
        if step == 0:
            return [tool("task", {"description": "Run a command", "subagent_type": "general",
                                  "prompt": "SCENARIO:childbash run the command"})]
        return [say("SUBAGENT-DONE")]
    if scenario == "childbash":
        if step == 0:
            return [tool("bash", {"command": "echo child > child-ran.txt", "description": "Write child-ran.txt"})]
        return [say("CHILDBASH-DONE")]
    if scenario == "readback":
        # Reads notes.txt: the next request carries what the agent saw.
        if step == 0:
            return [tool("read", {"filePath": "notes.txt"})]
        return [say("READBACK-DONE")]
    if scenario == "todo":
        if step == 0:
            return [tool("todowrite", {"todos": [
                {"content": "Write file", "status": "completed", "priority": "high", "id": "1"},
                {"content": "Run tests", "status": "in_progress", "priority": "medium", "id": "2"},
            ]})]
        return [say("TODO-DONE")]
    if scenario == "reasoning":
        return [think("Let me think: two plus two "), think("is four."), say("REASONING-ANSWER: 4")]
    if scenario == "longbash":
        # A bash tool that runs for minutes: a direct child `sleep <arg>` and a grandchild `sleep <arg+1>` that left
        # the process group and session. The test cancels the turn and checks both are gone.
        n = int(arg or "3171")
        if step == 0:
            command = f"setsid sleep {n + 1} & echo started > longbash.started; sleep {n}; echo finished > longbash.finished"
            return [tool("bash", {"command": command, "description": "Sleep for a long time", "timeout": 600000})]
        return [say("LONGBASH-DONE")]
    if scenario == "attack":
        # The test writes the hostile script into the workspace; OpenCode's own bash tool runs it.
        if step == 0:
            return [tool("bash", {"command": "python3 .attack.py", "description": "Run the project's setup"})]
        return [say("ATTACK-DONE")]
    if scenario == "tokens":
        # <arg> pieces (default 10), each sent on its own 200 ms after the one before: the editor must see them apart.
        n = int(arg or "10")
        return [("timed", [f"tok{i} " for i in range(n)], 0.2)]
    if scenario == "livebash":
        # A bash tool printing a line a second for <arg> seconds (default 5): its output must stream while it runs.
        n = int(arg or "5")
        if step == 0:
            command = f"for i in $(seq 1 {n}); do echo tick$i; sleep 1; done"
            return [tool("bash", {"command": command, "description": "Print ticks"})]
        return [say("LIVEBASH-DONE")]
    if scenario == "mcp":
        # Calls the tool `look` of the editor's MCP server named <arg> (OpenCode names it `<server>_look`).
        if step == 0:
            return [tool(f"{arg or 'probe'}_look", {})]
        return [say("MCP-DONE")]
    if scenario == "system":
        return [say("SYSTEM-OK")]
    if scenario == "rootbash":
        # A bash tool writing into the directory named `ROOT=<path>` in the prompt, then into `OTHER=<path>`.
        root = re.search(r"ROOT=(\S+)", prompt)
        other = re.search(r"OTHER=(\S+)", prompt)
        if step == 0 and root:
            return [tool("bash", {"command": f"echo from-opencode > {root.group(1)}/made.txt && echo root-ok",
                                  "description": "Write into the extra root"})]
        if step == 1 and other:
            return [tool("bash", {"command": f"echo nope > {other.group(1)}/made.txt; echo exit=$?",
                                  "description": "Write outside the roots"})]
        return [say("ROOTBASH-DONE")]
    if scenario == "question":
        # OpenCode's question tool: one question with two choices (free text allowed, OpenCode's default).
        if step == 0:
            return [tool("question", {"questions": [{
                "question": "Which colour should the button be?", "header": "Colour",
                "options": [{"label": "Red", "description": "Warm"}, {"label": "Blue", "description": "Cool"}]}]})]
        return [say("QUESTION-DONE")]
    if scenario == "error":
        return ("http", 400, {"error": {"message": "FAKE-PROVIDER-400: the fake model rejects this request",
                                        "type": "invalid_request_error", "code": "fake_bad_request"}})
    return [say(f"unknown scenario {scenario!r} step {step}")]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    record_path = None

    def log_message(self, fmt, *args):
        sys.stderr.write("fake_openai: " + (fmt % args) + "\n")

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            self.send_json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fake"}]})
        else:
            # Recorded with what it carried (a test sends a placeholder here to see that it arrives as it is).
            self.record({"kind": "other", "path": self.path, "authorization": self.headers.get("authorization", "")})
            self.send_json(404, {"error": {"message": f"no route GET {self.path}"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self.send_json(400, {"error": {"message": "body is not JSON"}})
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self.send_json(404, {"error": {"message": f"no route POST {self.path}"}})
            return
        messages = body.get("messages") or []
        scenario, arg, step = locate(messages)
        kind = "chat" if body.get("tools") else "title"
        self.record({"kind": kind, "scenario": scenario, "arg": arg, "step": step, "body": body})
        if kind == "title":
            items = [say(TITLE)]
        else:
            items = script(scenario, arg, step, last_user_text(messages))
        if isinstance(items, tuple) and items[0] == "http":
            self.send_json(items[1], items[2])
            return
        self.stream(items, step)

    def record(self, entry):
        entry["time"] = time.time()
        with RECORD_LOCK, open(self.record_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def send_json(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def stream(self, items, step):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        ident = f"chatcmpl-fake-{int(time.time() * 1000)}-{step}"
        created = int(time.time())

        def chunk(delta, finish=None, usage=None):
            payload = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": MODEL,
                       "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage:
                payload["usage"] = usage
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

        chunk({"role": "assistant", "content": ""})
        calls = 0
        for item in items:
            if item[0] == "text":
                for piece in split(item[1]):
                    chunk({"content": piece})
            elif item[0] == "timed":
                _, pieces, gap = item
                for i, piece in enumerate(pieces):
                    if i:
                        time.sleep(gap)
                    chunk({"content": piece})
            elif item[0] == "reasoning":
                for piece in split(item[1]):
                    chunk({"reasoning_content": piece})
            else:
                _, name, args = item
                call_id = f"call_fake_{step}_{calls}"
                encoded = json.dumps(args)
                half = len(encoded) // 2
                chunk({"tool_calls": [{"index": calls, "id": call_id, "type": "function",
                                       "function": {"name": name, "arguments": encoded[:half]}}]})
                chunk({"tool_calls": [{"index": calls, "function": {"arguments": encoded[half:]}}]})
                calls += 1
        chunk({}, finish="tool_calls" if calls else "stop")
        chunk({}, usage={"prompt_tokens": 120 + 10 * step, "completion_tokens": 12, "total_tokens": 132 + 10 * step})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def split(text):
    """A text in two or three deltas, to exercise streaming."""
    if len(text) < 8:
        return [text]
    third = len(text) // 3
    return [text[:third], text[third:2 * third], text[2 * third:]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--record", required=True)
    args = parser.parse_args()
    Handler.record_path = args.record
    open(args.record, "a").close()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    # Exit when the test goes away (its end of our stdin closes), so no server outlives a crashed test.
    def watch_stdin():
        try:
            sys.stdin.read()
        finally:
            server.shutdown()
    threading.Thread(target=watch_stdin, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
