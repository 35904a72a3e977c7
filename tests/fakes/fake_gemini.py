#!/usr/bin/env python3
"""A scripted Gemini API (generativelanguage v1beta) server for the real Gemini CLI (`@google/gemini-cli`).

Usage: fake_gemini.py --record FILE [--port 0]
Prints `PORT <n>` on stdout once it listens on 127.0.0.1:<n>, then serves until killed (or until stdin closes).
Gemini CLI runs as an ACP agent with `gemini --acp`. Point it at this server with
GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:<n> and any GEMINI_API_KEY (see tests/fakes/acp_drive.py for the whole
environment and ~/.gemini/settings.json).

`POST /v1beta/models/<model>:streamGenerateContent?alt=sse` answers SSE `data:` chunks of GenerateContentResponse
(candidates[0].content.parts with text pieces or a functionCall, the last chunk with finishReason STOP and
usageMetadata). `:generateContent` answers one JSON GenerateContentResponse, `:countTokens` a token count. Anything
else gets a 404 (and is recorded).

Scenarios, picked by a marker `SCENARIO:<name>` in the last user content that carries text (function responses are
user contents too, and do not count):
  text       a streamed answer in several pieces
  hunt       a shell tool call running `sh hunt.sh` in the workspace, then a final text
  write      a tool call creating hello.txt holding `hi from gemini` (run_shell_command, or write_file when no shell
             tool is offered), then a final text
  slow[:n]   n text pieces (default 40) 0.5 s apart, to cancel a turn while it streams
  sleep[:s]  a run_shell_command `echo started && sleep s && echo finished` (default 300),
             to cancel a turn during a tool call
  error      an HTTP 400 error answer
The step is the number of model contents after that user content, so a tool loop advances one step per model
call. A request without tools (Gemini CLI's side requests: model routing, next-speaker check, titles...) is a side
request: it gets a short text, or, when it asks for JSON (generationConfig.responseMimeType application/json), an
object built from its schema (an enum takes "user" when offered, else its first value). Every request is appended
to FILE as one JSON line: {"kind": "chat"|"side"|"count_tokens"|"other", "method", "path", "model", "scenario", "arg",
"step", "headers", "body", "time"}.
"""

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

AGENT = "gemini"
RECORD_LOCK = threading.Lock()
MARKER = re.compile(r"SCENARIO:([A-Za-z0-9_-]+)(?::([A-Za-z0-9_.-]+))?")
ROUTE = re.compile(r"/v1(?:beta|alpha)?/models/([^/:]+):([A-Za-z]+)")


def parts_of(content):
    return [p for p in (content or {}).get("parts") or [] if isinstance(p, dict)]


def text_of(content):
    return "\n".join(p.get("text", "") for p in parts_of(content) if "text" in p and not p.get("thought"))


def locate(contents):
    """(scenario, arg, step): the marker of the last user content with text, and the model contents after it."""
    last = None
    for i, c in enumerate(contents):
        if c.get("role", "user") == "user" and any("text" in p for p in parts_of(c)):
            last = i
    if last is None:
        return "none", None, 0
    found = MARKER.findall(text_of(contents[last]))
    scenario, arg = found[-1] if found else ("none", "")
    step = sum(1 for c in contents[last + 1:] if c.get("role") == "model")
    return scenario, (arg or None), step


def say(text):
    return ("text", text)


def tool(name, args):
    return ("tool", name, args)


def tool_names(body):
    names = set()
    for t in body.get("tools") or []:
        for decl in (t or {}).get("functionDeclarations") or []:
            names.add(decl.get("name"))
    return names


def script(scenario, arg, step, body):
    """What the model answers at `step` of `scenario`: a list of text/tool items, or ("http", status, payload)."""
    names = tool_names(body)
    if scenario == "text":
        return [say("Hello from the fake Gemini model. "), say("It streams in pieces. "), say("TEXT-ANSWER-OK")]
    if scenario == "write":
        if step == 0:
            content = f"hi from {AGENT}"
            if "run_shell_command" in names or "write_file" not in names:
                return [say("I will create the file."),
                        tool("run_shell_command", {"command": f"printf '%s' '{content}' > hello.txt",
                                                   "description": "Create hello.txt"})]
            return [say("I will create the file."), tool("write_file", {"file_path": "hello.txt", "content": content})]
        return [say("The file hello.txt "), say("is written. WRITE-DONE")]
    if scenario == "hunt":
        # The workspace's hunt.sh (a hostile tool the test wrote there).
        if step == 0:
            return [tool("run_shell_command", {"command": "sh hunt.sh", "description": "Hunt"})]
        return [say("HUNT-DONE")]
    if scenario == "slow":
        return [("timed", [f"slow{i} " for i in range(int(arg or "40"))], 0.5)]
    if scenario == "sleep":
        if step == 0:
            return [tool("run_shell_command", {"command": f"echo started && sleep {int(arg or '300')} && echo finished",
                                               "description": "Sleep"})]
        return [say("SLEEP-DONE")]
    if scenario == "error":
        return ("http", 400, {"error": {"code": 400, "message": "FAKE-PROVIDER-400: rejected",
                                        "status": "INVALID_ARGUMENT"}})
    return [say(f"unknown scenario {scenario!r} step {step}")]


def from_schema(schema):
    """A small value matching a JSON schema (or a Gemini Schema with upper-case types)."""
    schema = schema or {}
    kind = str(schema.get("type", "object")).lower()
    if schema.get("enum"):
        values = schema["enum"]
        return "user" if "user" in values else values[0]
    if kind == "object":
        return {k: from_schema(v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 0
    if kind == "boolean":
        return False
    return "fake"


def side_answer(body):
    config = body.get("generationConfig") or {}
    if config.get("responseMimeType") == "application/json":
        schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
        return [say(json.dumps(from_schema(schema)))]
    return [say("Fake side answer")]


def split(text):
    if len(text) < 8:
        return [text]
    third = len(text) // 3
    return [text[:third], text[third:2 * third], text[2 * third:]]


def usage(step):
    return {"promptTokenCount": 100 + 10 * step, "candidatesTokenCount": 20, "totalTokenCount": 120 + 10 * step}


def chunk(parts, model, finish=None, step=0):
    candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
    payload = {"candidates": [candidate], "modelVersion": model, "responseId": f"fake-{int(time.time() * 1000)}"}
    if finish:
        candidate["finishReason"] = finish
        payload["usageMetadata"] = usage(step)
    return payload


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    record_path = None

    def log_message(self, fmt, *args):
        sys.stderr.write("fake_gemini: " + (fmt % args) + "\n")

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {"_raw": raw.decode("utf-8", "replace")}

    def record(self, entry):
        entry.update(method=self.command, path=self.path, time=time.time(),
                     headers={k.lower(): v for k, v in self.headers.items() if k.lower() != "x-goog-api-key"})
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
        self.send_json(404, {"error": {"code": 404, "message": f"no route GET {self.path}", "status": "NOT_FOUND"}})

    def do_POST(self):
        body = self.read_body()
        route = ROUTE.search(self.path.split("?")[0])
        if not route:
            self.record({"kind": "other", "body": body})
            self.send_json(404, {"error": {"code": 404, "message": f"no route POST {self.path}",
                                           "status": "NOT_FOUND"}})
            return
        model, method = route.groups()
        if method == "countTokens":
            self.record({"kind": "count_tokens", "model": model, "body": body})
            self.send_json(200, {"totalTokens": 100 + len(json.dumps(body)) // 4})
            return
        if method not in ("streamGenerateContent", "generateContent"):
            self.record({"kind": "other", "model": model, "body": body})
            self.send_json(404, {"error": {"code": 404, "message": f"no method {method}", "status": "NOT_FOUND"}})
            return
        contents = [c for c in body.get("contents") or [] if isinstance(c, dict)]
        scenario, arg, step = locate(contents)
        kind = "chat" if tool_names(body) else "side"
        self.record({"kind": kind, "model": model, "scenario": scenario, "arg": arg, "step": step, "body": body})
        items = script(scenario, arg, step, body) if kind == "chat" else side_answer(body)
        if isinstance(items, tuple):
            self.send_json(items[1], items[2])
            return
        if method == "generateContent":
            parts = []
            for item in items:
                if item[0] == "text":
                    parts.append({"text": item[1]})
                elif item[0] == "timed":
                    parts.append({"text": "".join(item[1])})
                else:
                    parts.append({"functionCall": {"name": item[1], "args": item[2]}})
            self.send_json(200, chunk(parts, model, "STOP", step))
            return
        self.stream(items, model, step)

    def stream(self, items, model, step):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def send(payload):
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\r\n\r\n")
            self.wfile.flush()

        for item in items:
            if item[0] == "text":
                for piece in split(item[1]):
                    send(chunk([{"text": piece}], model))
            elif item[0] == "timed":
                _, pieces, gap = item
                for n, piece in enumerate(pieces):
                    if n:
                        time.sleep(gap)
                    send(chunk([{"text": piece}], model))
            else:
                send(chunk([{"functionCall": {"name": item[1], "args": item[2]}}], model))
        # The last chunk carries the finish reason and the usage (an empty text part, as the real API sends).
        send(chunk([{"text": ""}], model, "STOP", step))


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
