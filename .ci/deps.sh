#!/usr/bin/env bash
# Installs what the tests need on a Debian machine: the system packages of ./install.sh (bubblewrap, a C
# compiler, Node.js/npm) plus Python 3 (the fake CLIs), then the pinned OpenCode CLI for the end-to-end test
# against the real thing. Idempotent; as root without sudo, or as a sudo user.
set -euo pipefail
cd "$(dirname "$0")/.."
./install.sh --deps-only --with-test-deps
if [ -x .ci/install-opencode.sh ]; then
  .ci/install-opencode.sh
fi
if [ -x .ci/install-daytona-sdk.sh ]; then
  .ci/install-daytona-sdk.sh >/dev/null
fi
