#!/usr/bin/env python3
"""Runs one of the fake model servers (fake_anthropic.py, fake_openai_responses.py, fake_gemini.py) unchanged, and
adds to every request it records whether the request carried the key the test gave its agent: `"key_ok": true`.

Usage: FAKE_EXPECTED_KEY=<key> [FAKE_TLS_CERT=<pem> FAKE_TLS_KEY=<pem>] keyed_fake.py FAKE.py --record FILE [--port 0]
With FAKE_TLS_CERT and FAKE_TLS_KEY it serves HTTPS with that certificate (a model API behind TLS).

The key itself is never recorded (the fakes leave their key headers out of the record on purpose); only whether
`x-api-key` (Anthropic), `authorization: Bearer` (OpenAI) or `x-goog-api-key` (Gemini) held it exactly.
"""

import importlib.util
import os
import ssl
import sys

KEY_HEADERS = ("x-api-key", "authorization", "x-goog-api-key")


def main():
    path = sys.argv[1]
    expected = os.environ["FAKE_EXPECTED_KEY"]
    spec = importlib.util.spec_from_file_location("fake_model", path)
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    record = fake.Handler.record

    def keyed(self, entry):
        sent = [self.headers.get(name, "") for name in KEY_HEADERS]
        entry["key_ok"] = any(value in (expected, f"Bearer {expected}") for value in sent)
        record(self, entry)

    fake.Handler.record = keyed
    cert, key = os.environ.get("FAKE_TLS_CERT"), os.environ.get("FAKE_TLS_KEY")
    if cert and key:
        class TlsServer(fake.ThreadingHTTPServer):
            def server_bind(self):
                super().server_bind()
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(cert, key)
                self.socket = context.wrap_socket(self.socket, server_side=True)

        fake.ThreadingHTTPServer = TlsServer
    sys.argv = [path] + sys.argv[2:]
    fake.main()


if __name__ == "__main__":
    main()
