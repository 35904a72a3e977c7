#!/usr/bin/env bash
# Installs the pinned official E2B Python SDK (PyPI `e2b`, about 80 MB) for tests/e2b.rs, and prints the venv's
# python: ${ACP_SANDBOX_E2B_SDK_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/e2b-sdk@VERSION}/bin/python.
set -euo pipefail
exec "$(dirname "$0")/install-python-sdk.sh" e2b "${E2B_SDK_VERSION:-2.63.0}" "${ACP_SANDBOX_E2B_SDK_PREFIX:-}"
