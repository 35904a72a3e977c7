#!/usr/bin/python3
"""A streamable-HTTP MCP server on 127.0.0.1 for tests/real_opencode.rs: one tool, `look`.

Usage: mcp_http.py RECORD_FILE
Prints `PORT <n>` once it listens. Each JSON-RPC request POSTed to /mcp is answered as JSON (notifications with
202); its method and the `Authorization` header it came with are appended to RECORD_FILE as a JSON line. `look`
answers `MCP-HTTP-PROBE`. GET (the optional server-to-client stream) is refused with 405, as the spec allows.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("mcp_http: " + (fmt % args) + "\n")

    def reply(self, status, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(405)

    def do_DELETE(self):
        self.reply(405)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        with open(sys.argv[1], "a") as record:
            record.write(json.dumps({"method": request.get("method"),
                                     "authorization": self.headers.get("Authorization")}) + "\n")
        if "id" not in request:
            self.reply(202)
            return
        method = request.get("method")
        if method == "initialize":
            result = {"protocolVersion": request["params"].get("protocolVersion", "2025-03-26"),
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "web", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "look", "description": "Answers a fixed line.",
                                 "inputSchema": {"type": "object", "properties": {}}}]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "MCP-HTTP-PROBE"}]}
        elif method == "ping":
            result = {}
        else:
            self.reply(200, {"jsonrpc": "2.0", "id": request["id"],
                             "error": {"code": -32601, "message": "no such method"}})
            return
        self.reply(200, {"jsonrpc": "2.0", "id": request["id"], "result": result})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"PORT {server.server_address[1]}", flush=True)
server.serve_forever()
