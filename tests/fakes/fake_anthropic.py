#!/usr/bin/env python3
"""A scripted Anthropic Messages API server for the real Claude Code agent (`@agentclientprotocol/claude-agent-acp`).

Usage: fake_anthropic.py --record FILE [--port 0]
Prints `PORT <n>` on stdout once it listens on 127.0.0.1:<n>, then serves until killed (or until stdin closes).
Point Claude Code at it with ANTHROPIC_BASE_URL=http://127.0.0.1:<n> and any ANTHROPIC_API_KEY (see
tests/fakes/acp_drive.py for the whole environment).

`POST /v1/messages` with `stream: true` answers SSE events (message_start, content_block_start, content_block_delta
with text_delta or input_json_delta, content_block_stop, message_delta with the stop_reason, message_stop); without
`stream` it answers one JSON message. `POST /v1/messages/count_tokens` answers a token count. Anything else gets a
404 (and is recorded, so a test can see what the agent asked for).

Scenarios, picked by a marker `SCENARIO:<name>` in the last user message that carries text (tool results are user
messages too, and do not count):
  text   a streamed answer in several pieces, then end_turn
  write  a tool call that creates hello.txt holding `hi from claude` (the Bash tool, or Write when Bash is not
         offered), then a final text
  hunt   a Bash tool running `sh hunt.sh` in the workspace, then a final text
  slow[:n]   n text pieces (default 40) 0.5 s apart, to cancel a turn while it streams
  sleep[:s]  a Bash tool running `echo started && sleep s && echo finished` (default 300),
             to cancel a turn during a tool call
  error      an HTTP 400 error answer
The step is the number of assistant messages after that user message, so a tool loop advances one step per model
call. A request that offers no tools (Claude Code's session-title request, which asks for JSON {"title": ...} with
output_config.format json_schema) or whose last user message is a "[SUGGESTION MODE: ..." prompt-suggestion request
is a side request: it gets a short fixed text (or JSON when asked) and does not advance anything. Every request is
appended to FILE as one JSON line:
{"kind": "chat"|"side"|"count_tokens"|"other", "method", "path", "scenario", "step", "headers", "body", "time"}.
"""

import argparse
import itertools
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "claude-fake-model"
AGENT = "claude"
RECORD_LOCK = threading.Lock()
SERIAL = itertools.count(1)  # tool call ids are unique for the server's life
MARKER = re.compile(r"SCENARIO:([A-Za-z0-9_-]+)(?::([A-Za-z0-9_.-]+))?")


def blocks(content):
    """A message's content as a list of blocks (a bare string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def text_of(content):
    return "\n".join(b.get("text", "") for b in blocks(content) if b.get("type") == "text")


def locate(messages):
    """(scenario, arg, step): the marker of the last user message with text, and the assistant turns after it."""
    last_user = None
    for i, m in enumerate(messages):
        if m.get("role") == "user" and any(b.get("type") == "text" for b in blocks(m.get("content"))):
            last_user = i
    if last_user is None:
        return "none", None, 0
    found = MARKER.findall(text_of(messages[last_user].get("content")))
    scenario, arg = found[-1] if found else ("none", "")
    step = sum(1 for m in messages[last_user + 1:] if m.get("role") == "assistant")
    return scenario, (arg or None), step


def say(text):
    return ("text", text)


def tool(name, args):
    return ("tool", name, args)


def cwd_of(body):
    """The working directory Claude Code states in its system prompt, if any."""
    system = body.get("system")
    text = system if isinstance(system, str) else text_of(system)
    m = re.search(r"(?:Primary working directory|Working directory):\s*(\S+)", text)
    return m.group(1) if m else None


def script(scenario, arg, step, body):
    """What the model answers at `step` of `scenario`: a list of text/tool items, or ("http", status, payload)."""
    names = {t.get("name") for t in body.get("tools") or []}
    if scenario == "text":
        return [say("Hello from the fake Anthropic model. "), say("It streams in pieces. "), say("TEXT-ANSWER-OK")]
    if scenario == "write":
        if step == 0:
            content = f"hi from {AGENT}"
            if "Bash" in names or "Write" not in names:
                return [say("I will create the file."),
                        tool("Bash", {"command": f"printf '%s' '{content}' > hello.txt",
                                      "description": "Create hello.txt"})]
            root = cwd_of(body) or "."
            return [say("I will create the file."),
                    tool("Write", {"file_path": f"{root}/hello.txt", "content": content})]
        return [say("The file hello.txt "), say("is written. WRITE-DONE")]
    if scenario == "hunt":
        # The workspace's hunt.sh (a hostile tool the test wrote there) through the Bash tool.
        if step == 0:
            return [tool("Bash", {"command": "sh hunt.sh", "description": "Hunt"})]
        return [say("HUNT-DONE")]
    if scenario == "slow":
        # Many pieces, one every 0.5 s: long enough to cancel the turn half way.
        return [("timed", [f"slow{i} " for i in range(int(arg or "40"))], 0.5)]
    if scenario == "sleep":
        # A Bash tool that sleeps for a long time (to cancel during a tool call).
        if step == 0:
            # (Claude Code refuses a standalone long `sleep`.)
            return [tool("Bash", {"command": f"echo started && sleep {int(arg or '300')} && echo finished",
                                  "description": "Sleep"})]
        return [say("SLEEP-DONE")]
    if scenario == "error":
        return ("http", 400, {"type": "error", "error": {"type": "invalid_request_error",
                                                         "message": "FAKE-PROVIDER-400: rejected"}})
    return [say(f"unknown scenario {scenario!r} step {step}")]


def is_side(messages):
    """Claude Code's prompt-suggestion request: the normal tools, but a last user message in "SUGGESTION MODE"."""
    users = [m for m in messages if m.get("role") == "user"]
    return bool(users) and text_of(users[-1].get("content")).lstrip().startswith("[SUGGESTION MODE")


def side_answer(body):
    """A short text for a side request; a JSON object when it asks for one (the session title has a json_schema
    output format {"title": string})."""
    fmt = (body.get("output_config") or {}).get("format") or body.get("output_format") or {}
    if fmt.get("type") == "json_schema":
        schema = fmt.get("schema") or {}
        props = schema.get("properties") or {}
        value = {k: ("Fake session title" if (v or {}).get("type") == "string" else None) for k, v in props.items()}
        return [say(json.dumps(value))]
    return [say("Fake side answer")]


def split(text):
    """A text in up to three deltas, to exercise streaming."""
    if len(text) < 8:
        return [text]
    third = len(text) // 3
    return [text[:third], text[third:2 * third], text[2 * third:]]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    record_path = None

    def log_message(self, fmt, *args):
        sys.stderr.write("fake_anthropic: " + (fmt % args) + "\n")

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {"_raw": raw.decode("utf-8", "replace")}

    def record(self, entry):
        entry.update(method=self.command, path=self.path, time=time.time(),
                     headers={k.lower(): v for k, v in self.headers.items() if k.lower() != "x-api-key"})
        with RECORD_LOCK, open(self.record_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def send_json(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.record({"kind": "other"})
        self.send_json(404, {"type": "error", "error": {"type": "not_found_error",
                                                        "message": f"no route GET {self.path}"}})

    def do_HEAD(self):
        self.record({"kind": "other"})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        body = self.read_body()
        path = self.path.split("?")[0].rstrip("/")
        if path.endswith("/v1/messages/count_tokens"):
            self.record({"kind": "count_tokens", "body": body})
            self.send_json(200, {"input_tokens": 100 + len(json.dumps(body)) // 4})
            return
        if not path.endswith("/v1/messages"):
            self.record({"kind": "other", "body": body})
            self.send_json(404, {"type": "error", "error": {"type": "not_found_error",
                                                            "message": f"no route POST {self.path}"}})
            return
        messages = body.get("messages") or []
        scenario, arg, step = locate(messages)
        kind = "chat" if body.get("tools") and not is_side(messages) else "side"
        self.record({"kind": kind, "scenario": scenario, "arg": arg, "step": step, "body": body})
        items = script(scenario, arg, step, body) if kind == "chat" else side_answer(body)
        if isinstance(items, tuple):
            self.send_json(items[1], items[2])
            return
        if body.get("stream"):
            self.stream(items, step)
        else:
            self.send_json(200, self.whole(items, step))

    def whole(self, items, step):
        content, calls = [], 0
        for item in items:
            if item[0] == "text":
                content.append({"type": "text", "text": item[1]})
            elif item[0] == "timed":
                content.append({"type": "text", "text": "".join(item[1])})
            else:
                content.append({"type": "tool_use", "id": f"toolu_fake_{next(SERIAL)}_{step}_{calls}",
                                "name": item[1], "input": item[2]})
                calls += 1
        return {"id": f"msg_fake_{int(time.time() * 1000)}_{step}", "type": "message", "role": "assistant",
                "model": MODEL, "content": content, "stop_reason": "tool_use" if calls else "end_turn",
                "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 20}}

    def stream(self, items, step):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def event(name, payload):
            payload = dict(type=name, **payload)
            self.wfile.write(f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        event("message_start", {"message": {
            "id": f"msg_fake_{int(time.time() * 1000)}_{step}", "type": "message", "role": "assistant",
            "model": MODEL, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 100 + 10 * step, "output_tokens": 1}}})
        index, calls = 0, 0
        # Consecutive text items make one text block, streamed as several deltas.
        i = 0
        while i < len(items):
            item = items[i]
            if item[0] in ("text", "timed"):
                event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
                while i < len(items) and items[i][0] in ("text", "timed"):
                    if items[i][0] == "text":
                        pieces, gap = split(items[i][1]), 0
                    else:
                        pieces, gap = items[i][1], items[i][2]
                    for n, piece in enumerate(pieces):
                        if gap and n:
                            time.sleep(gap)
                        event("content_block_delta", {"index": index,
                                                      "delta": {"type": "text_delta", "text": piece}})
                    i += 1
                event("content_block_stop", {"index": index})
            else:
                _, name, args = item
                event("content_block_start", {"index": index, "content_block": {
                    "type": "tool_use", "id": f"toolu_fake_{next(SERIAL)}_{step}_{calls}", "name": name,
                    "input": {}}})
                encoded = json.dumps(args)
                half = len(encoded) // 2
                for piece in (encoded[:half], encoded[half:]):
                    event("content_block_delta", {"index": index,
                                                  "delta": {"type": "input_json_delta", "partial_json": piece}})
                event("content_block_stop", {"index": index})
                calls += 1
                i += 1
            index += 1
        event("message_delta", {"delta": {"stop_reason": "tool_use" if calls else "end_turn", "stop_sequence": None},
                                "usage": {"output_tokens": 20}})
        event("message_stop", {})


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

    def watch_stdin():
        # Exit when the test goes away (its end of our stdin closes), so no server outlives a crashed test.
        try:
            sys.stdin.read()
        finally:
            server.shutdown()
    threading.Thread(target=watch_stdin, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
