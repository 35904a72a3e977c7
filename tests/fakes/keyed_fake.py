#!/usr/bin/env python3
"""Runs one of the fake model servers (fake_anthropic.py, fake_openai_responses.py, fake_gemini.py) unchanged, and
adds to every request it records whether the request carried the key the test gave its agent: `"key_ok": true`.

Usage: FAKE_EXPECTED_KEY=<key> keyed_fake.py FAKE.py --record FILE [--port 0]

The key itself is never recorded (the fakes leave their key headers out of the record on purpose); only whether
`x-api-key` (Anthropic), `authorization: Bearer` (OpenAI) or `x-goog-api-key` (Gemini) held it exactly.
"""

import importlib.util
import os
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
    sys.argv = [path] + sys.argv[2:]
    fake.main()


if __name__ == "__main__":
    main()
