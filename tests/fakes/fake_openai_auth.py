#!/usr/bin/env python3
"""A fake of OpenAI's login server for Codex's device-code login (`codex login --device-auth --experimental_issuer
http://127.0.0.1:<n>`), stdlib only.

Usage: fake_openai_auth.py --record FILE [--port 0] [--pending N]
Prints `PORT <n>` on stdout once it listens on 127.0.0.1:<n>, then serves until killed (or until stdin closes).

  POST /api/accounts/deviceauth/usercode  {"device_auth_id", "user_code", "interval": "1"}
  POST /api/accounts/deviceauth/token     403 for the first N polls (the person has not entered the code yet), then
                                          the authorization code with its PKCE pair
  POST /oauth/token                       the tokens: an id token (a JWT naming a ChatGPT Plus account of
                                          user@example.com), an access token `fake-chatgpt-access-<n>` and a refresh
                                          token
Anything else gets a 404. Every request is appended to FILE as one JSON line: {"method", "path", "body"}.
"""

import argparse
import base64
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

LOCK = threading.Lock()
POLLS = [0]
ISSUED = [0]


def b64(data):
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def jwt(claims):
    return f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}.sig"


class Handler(BaseHTTPRequestHandler):
    record_path = None
    pending = 1

    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        try:
            body = json.loads(raw)
        except ValueError:
            body = {k: v[0] for k, v in parse_qs(raw).items()}
        with LOCK, open(self.record_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"method": "POST", "path": self.path, "body": body}) + "\n")
        path = self.path.split("?")[0]
        if path == "/api/accounts/deviceauth/usercode":
            return self.answer(200, {"device_auth_id": "dev-1", "user_code": "FAKE-CODE1", "interval": "1"})
        if path == "/api/accounts/deviceauth/token":
            with LOCK:
                POLLS[0] += 1
                waiting = POLLS[0] <= self.pending
            if waiting:
                return self.answer(403, {"error": {"message": "authorization pending"}})
            return self.answer(200, {"authorization_code": "auth-code-1", "code_challenge": "challenge-1",
                                     "code_verifier": "verifier-1"})
        if path == "/oauth/token":
            with LOCK:
                ISSUED[0] += 1
                n = ISSUED[0]
            exp = int(time.time()) + 30 * 24 * 3600
            auth = {"chatgpt_plan_type": "plus", "chatgpt_account_id": "acct-fake-1", "chatgpt_user_id": "user-fake-1",
                    "user_id": "user-fake-1"}
            id_token = jwt({"email": "user@example.com", "https://api.openai.com/auth": auth, "exp": exp,
                            "iat": int(time.time()), "sub": "user-fake-1"})
            access = jwt({"exp": exp, "https://api.openai.com/auth": auth, "tag": f"fake-chatgpt-access-{n}"})
            return self.answer(200, {"id_token": id_token, "access_token": access, "refresh_token": f"fake-refresh-{n}"})
        self.answer(404, {"error": {"message": f"no route POST {self.path}"}})

    def do_GET(self):
        with LOCK, open(self.record_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"method": "GET", "path": self.path, "body": None}) + "\n")
        self.answer(404, {"error": {"message": f"no route GET {self.path}"}})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--pending", type=int, default=1)
    args = parser.parse_args()
    Handler.record_path = args.record
    Handler.pending = args.pending
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sys.stdin.read()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
