#!/usr/bin/env bash
# Installs the pinned official Daytona Python SDK (PyPI `daytona`) for tests/daytona.rs, and prints the venv's
# python.
#
#   .ci/install-daytona-sdk.sh         # installs once, then prints the path of the venv's python
#
# The venv lives outside the repository, shared by every clone and worktree:
#   ${ACP_SANDBOX_DAYTONA_SDK_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/daytona-sdk@VERSION}
# tests/daytona.rs looks there when ACP_SANDBOX_TEST_DAYTONA_PYTHON is not set. On a fresh Debian it first
# installs python3-venv (as root, or through sudo). Idempotent and safe to run concurrently (a lock next to the
# venv); a finished install is reused without the network. Everything but the path goes to stderr.
set -euo pipefail

VERSION="${DAYTONA_SDK_VERSION:-0.226.1}"
PREFIX="${ACP_SANDBOX_DAYTONA_SDK_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/daytona-sdk@$VERSION}"
PY="$PREFIX/bin/python"

log() { echo "install-daytona-sdk: $*" >&2; }
works() {
  [ -x "$PY" ] && [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("daytona"))' 2>/dev/null)" = "$VERSION" ]
}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

mkdir -p "$(dirname "$PREFIX")"
exec 9>"$PREFIX.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi
if works; then
  log "daytona $VERSION already installed"
  echo "$PY"
  exit 0
fi
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  command -v apt-get >/dev/null || { log "python3 with venv and ensurepip is required"; exit 1; }
  log "installing python3-venv"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
fi
STAGING="$PREFIX.staging.$$"
rm -rf "$STAGING" "$PREFIX"
trap 'rm -rf "$STAGING"' EXIT
log "installing daytona==$VERSION into $PREFIX"
python3 -m venv "$STAGING"
"$STAGING/bin/python" -m pip install --quiet --disable-pip-version-check "daytona==$VERSION" >&2
# A venv finds its packages through the pyvenv.cfg next to bin/python, so it still works once moved.
mv "$STAGING" "$PREFIX"
trap - EXIT
if ! works; then
  log "the install finished but $PY does not import daytona $VERSION"
  exit 1
fi
log "installed daytona $VERSION"
echo "$PY"
