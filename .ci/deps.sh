#!/usr/bin/env bash
# Installs what the tests need on a Debian machine: bubblewrap, Python 3 (the fake CLIs), Node.js/npm,
# the pinned OpenCode CLI for the end-to-end test against the real thing, and the pinned E2B Python SDK
# (tests/e2b.rs drives the fake E2B server with it; python3-venv for its venv). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
[ -x /usr/bin/python3 ] || missing+=(python3)
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
/usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
command -v flock >/dev/null 2>&1 || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  sudo_if_needed apt-get update -qq
  sudo_if_needed apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ -x .ci/install-opencode.sh ]; then
  .ci/install-opencode.sh
fi
if [ -x .ci/install-e2b-sdk.sh ]; then
  .ci/install-e2b-sdk.sh >/dev/null
fi
