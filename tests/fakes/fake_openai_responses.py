#!/usr/bin/env python3
"""A scripted OpenAI Responses API server for the real Codex agent (`@agentclientprotocol/codex-acp`).

Usage: fake_openai_responses.py --record FILE [--port 0]
Prints `PORT <n>` on stdout once it listens on 127.0.0.1:<n>, then serves until killed (or until stdin closes).
Point Codex at it with a custom provider in $CODEX_HOME/config.toml (tests/fakes/acp_drive.py writes one):
  model_provider = "fake"
  [model_providers.fake]
  base_url = "http://127.0.0.1:<n>/v1"
  wire_api = "responses"
  env_key = "FAKE_OPENAI_API_KEY"

`POST /v1/responses` answers a stream of SSE events: response.created, response.in_progress, then per output item
response.output_item.added, (for text) response.content_part.added, several response.output_text.delta,
response.output_text.done, response.content_part.done, (for a tool call) several
response.function_call_arguments.delta and response.function_call_arguments.done, response.output_item.done; then
response.completed with usage. `GET /v1/models` answers an empty model list. Anything else gets a 404 (and is
recorded).

Scenarios, picked by a marker `SCENARIO:<name>` in the last user message that carries one:
  text       a streamed answer in several pieces
  hunt       a shell tool call running `sh hunt.sh` in the workspace, then a final text
  write      a shell tool call creating hello.txt holding `hi from codex` (whichever shell tool the request offers:
             exec_command, shell_command or shell; in Codex's sandboxed modes exec_command asks for
             sandbox_permissions require_escalated, so Codex asks the client for approval), then a final text
  slow[:n]   n text pieces (default 40) 0.5 s apart, to cancel a turn while it streams
  sleep[:s]  a shell tool running `echo started && sleep s && echo finished` (default 300),
             to cancel a turn during a tool call
  error      an HTTP 400 error answer
The step is the number of model turns after that user message (runs of assistant-side items: message, reasoning,
function_call, custom_tool_call), so a tool loop advances one step per model call. A request that offers no tools
(a title or summary side request) gets a short fixed text. Every request is appended to FILE as one JSON line:
{"kind": "chat"|"side"|"models"|"other", "method", "path", "scenario", "arg", "step", "headers", "body", "time",
"bearer_jwt"}: the headers without `authorization`, and `bearer_jwt` the claims of a bearer token that is a JWT (a
ChatGPT login's access token, e.g. from fake_openai_auth.py; an API key never is), else null.
"""

import argparse
import base64
import itertools
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "fake-model"
AGENT = "codex"
RECORD_LOCK = threading.Lock()
SERIAL = itertools.count(1)  # tool call ids are unique for the server's life
MARKER = re.compile(r"SCENARIO:([A-Za-z0-9_-]+)(?::([A-Za-z0-9_.-]+))?")
ASSISTANT_SIDE = {"reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call"}


def text_of(item):
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def input_items(body):
    items = body.get("input")
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": items}]
    return [i for i in items or [] if isinstance(i, dict)]


def is_assistant_side(item):
    kind = item.get("type", "message")
    return kind in ASSISTANT_SIDE or (kind == "message" and item.get("role") == "assistant")


def locate(items):
    """(scenario, arg, step): the marker of the last user message carrying one, and the model turns after it."""
    last = None
    for i, item in enumerate(items):
        if item.get("type", "message") == "message" and item.get("role") == "user" and MARKER.search(text_of(item)):
            last = i
    if last is None:
        return "none", None, 0
    scenario, arg = MARKER.findall(text_of(items[last]))[-1]
    step, inside = 0, False
    for item in items[last + 1:]:
        if is_assistant_side(item):
            if not inside:
                step += 1
            inside = True
        else:
            inside = False
    return scenario, (arg or None), step


def say(text):
    return ("text", text)


def tool(name, args):
    return ("tool", name, args)


def tool_names(body):
    return {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}


def tool_params(body, name):
    for t in body.get("tools") or []:
        if isinstance(t, dict) and t.get("name") == name:
            return (t.get("parameters") or {}).get("properties") or {}
    return {}


def sandboxed(body):
    """Whether Codex runs its tools in its own sandbox (x-codex-turn-metadata's sandbox_mode is not
    danger-full-access). Escalating there makes Codex ask; with approval policy never it rejects the call."""
    try:
        meta = json.loads((body.get("client_metadata") or {}).get("x-codex-turn-metadata") or "{}")
    except ValueError:
        meta = {}
    return meta.get("sandbox_mode", "workspace-write") != "danger-full-access"


def shell(body, command, escalate=False, wait_ms=10000):
    """A call of whichever shell tool the request offers; `escalate` asks to run it outside Codex's own sandbox
    (sandbox_permissions require_escalated), which makes Codex ask the client for approval; `wait_ms` is how long
    exec_command waits for the command before the model gets control back."""
    names = tool_names(body)
    if "exec_command" in names:
        args = {"cmd": command, "yield_time_ms": wait_ms}
        if escalate and "sandbox_permissions" in tool_params(body, "exec_command") and sandboxed(body):
            args.update(sandbox_permissions="require_escalated", justification="May I create hello.txt?")
        return tool("exec_command", args)
    if "shell_command" in names:
        return tool("shell_command", {"command": command, "timeout_ms": 600000})
    return tool("shell", {"command": ["bash", "-lc", command], "timeout_ms": 600000})


def script(scenario, arg, step, body):
    """What the model answers at `step` of `scenario`: a list of text/tool items, or ("http", status, payload)."""
    if scenario == "text":
        return [say("Hello from the fake Responses model. "), say("It streams in pieces. "), say("TEXT-ANSWER-OK")]
    if scenario == "write":
        if step == 0:
            return [say("I will create the file."), shell(body, f"printf '%s' 'hi from {AGENT}' > hello.txt",
                                                                escalate=True)]
        return [say("The file hello.txt "), say("is written. WRITE-DONE")]
    if scenario == "hunt":
        # The workspace's hunt.sh (a hostile tool the test wrote there).
        if step == 0:
            # It reads the whole file system: waited for to its end.
            return [shell(body, "sh hunt.sh", escalate=True, wait_ms=600000)]
        return [say("HUNT-DONE")]
    if scenario == "slow":
        return [("timed", [f"slow{i} " for i in range(int(arg or "40"))], 0.5)]
    if scenario == "sleep":
        if step == 0:
            return [shell(body, f"echo started && sleep {int(arg or '300')} && echo finished")]
        return [say("SLEEP-DONE")]
    if scenario == "error":
        return ("http", 400, {"error": {"message": "FAKE-PROVIDER-400: rejected", "type": "invalid_request_error",
                                        "code": "fake_bad_request"}})
    return [say(f"unknown scenario {scenario!r} step {step}")]


def side_answer(body):
    """A short text for a side request; a JSON object when it asks for one (Codex's thread title has a json_schema
    text format {"title": string})."""
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        props = (fmt.get("schema") or {}).get("properties") or {}
        return [say(json.dumps({k: ("Fake session title" if (v or {}).get("type") == "string" else None)
                                for k, v in props.items()}))]
    return [say("Fake side answer")]


def split(text):
    if len(text) < 8:
        return [text]
    third = len(text) // 3
    return [text[:third], text[third:2 * third], text[2 * third:]]


def jwt_claims(authorization):
    """The claims of a bearer token that is a JWT (a ChatGPT login's access token; an API key never is), else None."""
    token = authorization.removeprefix("Bearer ").strip()
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        return json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    record_path = None

    def log_message(self, fmt, *args):
        sys.stderr.write("fake_openai_responses: " + (fmt % args) + "\n")

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.headers.get("Content-Encoding", "").lower() == "zstd":
            return {"_raw": "zstd-compressed body, not decoded"}
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {"_raw": raw.decode("utf-8", "replace")}

    def record(self, entry):
        entry.update(method=self.command, path=self.path, time=time.time(),
                     headers={k.lower(): v for k, v in self.headers.items() if k.lower() != "authorization"},
                     bearer_jwt=jwt_claims(self.headers.get("Authorization", "")))
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
        path = self.path.split("?")[0].rstrip("/")
        if path.endswith("/models"):
            self.record({"kind": "models"})
            self.send_json(200, {"object": "list", "data": [], "models": []})
            return
        self.record({"kind": "other"})
        self.send_json(404, {"error": {"message": f"no route GET {self.path}"}})

    def do_POST(self):
        body = self.read_body()
        path = self.path.split("?")[0].rstrip("/")
        if not path.endswith("/responses"):
            self.record({"kind": "other", "body": body})
            self.send_json(404, {"error": {"message": f"no route POST {self.path}"}})
            return
        items = input_items(body)
        scenario, arg, step = locate(items)
        kind = "chat" if body.get("tools") else "side"
        self.record({"kind": kind, "scenario": scenario, "arg": arg, "step": step, "body": body})
        answer = script(scenario, arg, step, body) if kind == "chat" else side_answer(body)
        if isinstance(answer, tuple):
            self.send_json(answer[1], answer[2])
            return
        self.stream(answer, step)

    def stream(self, answer, step):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        stamp = int(time.time() * 1000)
        response_id = f"resp_fake_{stamp}_{step}"
        seq = [0]

        def event(name, payload):
            payload = dict(type=name, sequence_number=seq[0], **payload)
            seq[0] += 1
            self.wfile.write(f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        def response(status, output):
            return {"id": response_id, "object": "response", "created_at": stamp // 1000, "status": status,
                    "model": MODEL, "output": output, "usage": None}

        event("response.created", {"response": response("in_progress", [])})
        event("response.in_progress", {"response": response("in_progress", [])})
        output = []
        i, calls = 0, 0
        while i < len(answer):
            index = len(output)
            if answer[i][0] in ("text", "timed"):
                item_id = f"msg_fake_{stamp}_{step}_{index}"
                event("response.output_item.added", {"output_index": index, "item": {
                    "type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}})
                event("response.content_part.added", {"item_id": item_id, "output_index": index, "content_index": 0,
                                                       "part": {"type": "output_text", "text": "", "annotations": []}})
                text = ""
                while i < len(answer) and answer[i][0] in ("text", "timed"):
                    pieces, gap = (split(answer[i][1]), 0) if answer[i][0] == "text" else answer[i][1:]
                    for n, piece in enumerate(pieces):
                        if gap and n:
                            time.sleep(gap)
                        text += piece
                        event("response.output_text.delta", {"item_id": item_id, "output_index": index,
                                                              "content_index": 0, "delta": piece})
                    i += 1
                part = {"type": "output_text", "text": text, "annotations": []}
                event("response.output_text.done", {"item_id": item_id, "output_index": index, "content_index": 0,
                                                     "text": text})
                event("response.content_part.done", {"item_id": item_id, "output_index": index, "content_index": 0,
                                                      "part": part})
                item = {"type": "message", "id": item_id, "role": "assistant", "status": "completed",
                        "content": [part]}
            else:
                _, name, args = answer[i]
                item_id = f"fc_fake_{stamp}_{step}_{index}"
                call_id = f"call_fake_{next(SERIAL)}_{step}_{calls}"
                encoded = json.dumps(args)
                event("response.output_item.added", {"output_index": index, "item": {
                    "type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": "",
                    "status": "in_progress"}})
                half = len(encoded) // 2
                for piece in (encoded[:half], encoded[half:]):
                    event("response.function_call_arguments.delta", {"item_id": item_id, "output_index": index,
                                                                      "delta": piece})
                event("response.function_call_arguments.done", {"item_id": item_id, "output_index": index,
                                                                 "arguments": encoded})
                item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
                        "arguments": encoded, "status": "completed"}
                calls += 1
                i += 1
            event("response.output_item.done", {"output_index": index, "item": item})
            output.append(item)
        done = response("completed", output)
        done["usage"] = {"input_tokens": 120 + 10 * step, "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": 140 + 10 * step}
        event("response.completed", {"response": done})


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
