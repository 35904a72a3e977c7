#!/usr/bin/env bash
# Installs the pinned official Daytona Python SDK (PyPI `daytona`) for tests/daytona.rs, and prints the venv's
# python: ${ACP_SANDBOX_DAYTONA_SDK_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/daytona-sdk@VERSION}/bin/python.
# tests/daytona.rs looks there when ACP_SANDBOX_TEST_DAYTONA_PYTHON is not set.
set -euo pipefail
exec "$(dirname "$0")/install-python-sdk.sh" daytona "${DAYTONA_SDK_VERSION:-0.226.1}" "${ACP_SANDBOX_DAYTONA_SDK_PREFIX:-}"
