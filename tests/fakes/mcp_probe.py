#!/usr/bin/python3
"""A stdio MCP server for tests/real_opencode.rs: one tool, `look`, that says where the server runs.

Usage: mcp_probe.py KEY_PATH
`look` answers one line: `MCP-PROBE given=<$GIVEN reversed> key=<readable|denied:<errno name>> init=<argv[0] of pid 1>
pid=<its pid> env=<its variables' names, sorted, comma-separated>`. KEY_PATH is a file the sandbox must hide. The
variable is reversed so that its value itself is found nowhere the bridge must not keep it (store, log).
Speaks newline-delimited JSON-RPC 2.0 on stdin/stdout (MCP's stdio transport); nothing else goes to stdout.
"""

import errno
import json
import os
import sys


def look():
    try:
        with open(sys.argv[1], "rb") as key:
            key.read(1)
        readable = "readable"
    except OSError as e:
        readable = "denied:" + errno.errorcode.get(e.errno, str(e.errno))
    try:
        with open("/proc/1/cmdline", "rb") as cmdline:
            init = os.path.basename(cmdline.read().split(b"\0")[0].decode(errors="replace"))
    except OSError:
        init = "?"
    names = ",".join(sorted(os.environ))
    return (f"MCP-PROBE given={os.environ.get('GIVEN', '')[::-1]} key={readable} init={init} "
            f"pid={os.getpid()} env={names}")


def answer(request):
    method = request.get("method")
    if method == "initialize":
        return {"protocolVersion": request["params"].get("protocolVersion", "2024-11-05"),
                "capabilities": {"tools": {}}, "serverInfo": {"name": "probe", "version": "1"}}
    if method == "tools/list":
        return {"tools": [{"name": "look", "description": "Says where this server runs.",
                           "inputSchema": {"type": "object", "properties": {}}}]}
    if method == "tools/call":
        return {"content": [{"type": "text", "text": look()}]}
    if method == "ping":
        return {}
    return None


for line in sys.stdin:
    try:
        request = json.loads(line)
    except ValueError:
        continue
    if "id" not in request:
        continue
    result = answer(request)
    if result is None:
        reply = {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "no such method"}}
    else:
        reply = {"jsonrpc": "2.0", "id": request["id"], "result": result}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
