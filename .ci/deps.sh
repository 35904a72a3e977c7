#!/usr/bin/env bash
# Installs what the tests need on a Debian machine: the system packages of ./install.sh (bubblewrap, a C
# compiler, Node.js/npm) plus Python 3 (the fake CLIs), then the pinned OpenCode CLI for the end-to-end test
# against the real thing, the pinned E2B and Daytona Python SDKs that tests/e2b.rs and tests/daytona.rs drive the
# fakes with (in venvs of their own: python3-venv), and the same providers' pinned npm SDKs (Node.js >= 20.18.1).
# Idempotent; as root without sudo, or as a sudo user.
set -euo pipefail
cd "$(dirname "$0")/.."
./install.sh --deps-only --with-test-deps
e2b_missing=()
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || e2b_missing+=(python3-venv)
command -v flock >/dev/null 2>&1 || e2b_missing+=(util-linux)
if [ ${#e2b_missing[@]} -gt 0 ]; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq "${e2b_missing[@]}" >/dev/null
fi
if [ -x .ci/install-opencode.sh ]; then
  .ci/install-opencode.sh
fi
if [ -x .ci/install-daytona-sdk.sh ]; then
  .ci/install-daytona-sdk.sh >/dev/null
fi
if [ -x .ci/install-e2b-sdk.sh ]; then
  .ci/install-e2b-sdk.sh >/dev/null
fi
if [ -x .ci/install-node-sdk.sh ]; then
  .ci/install-node-sdk.sh >/dev/null
fi
# The real ACP agents from npm (Claude Code, Codex, Gemini CLI: about 960 MB, 40 s from an empty cache, nothing when
# installed) for tests/real_acp_agents.rs, which finds them in the script's prefix.
if [ -x .ci/install-acp-agents.sh ]; then
  .ci/install-acp-agents.sh >/dev/null
fi
