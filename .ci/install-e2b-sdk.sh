#!/usr/bin/env bash
# Installs the pinned official E2B Python SDK (PyPI `e2b`) for tests/e2b.rs, and prints the venv's python.
#
#   .ci/install-e2b-sdk.sh             # installs once, then prints the path of the venv's python
#
# The venv lives outside the repository, shared by every clone and worktree:
#   ${ACP_SANDBOX_E2B_SDK_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/e2b-sdk@VERSION}
# Idempotent and safe to run concurrently (a lock next to the venv); a finished install is reused without the
# network. Everything but the path goes to stderr.
set -euo pipefail

VERSION="${E2B_SDK_VERSION:-2.63.0}"
PREFIX="${ACP_SANDBOX_E2B_SDK_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/e2b-sdk@$VERSION}"
PY="$PREFIX/bin/python"

log() { echo "install-e2b-sdk: $*" >&2; }
works() { [ -x "$PY" ] && [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("e2b"))' 2>/dev/null)" = "$VERSION" ]; }

mkdir -p "$(dirname "$PREFIX")"
exec 9>"$PREFIX.lock"
flock 9
if works; then
  log "e2b $VERSION already installed"
  echo "$PY"
  exit 0
fi
python3 -c 'import venv, ensurepip' 2>/dev/null || { log "python3 with venv is required (apt-get install python3-venv)"; exit 1; }
STAGING="$PREFIX.staging.$$"
rm -rf "$STAGING" "$PREFIX"
trap 'rm -rf "$STAGING"' EXIT
log "installing e2b==$VERSION into $PREFIX (about 80 MB)"
python3 -m venv "$STAGING"
"$STAGING/bin/python" -m pip install --quiet --disable-pip-version-check "e2b==$VERSION" >&2
# A venv finds its packages from the pyvenv.cfg next to bin/python, so it still works once moved.
mv "$STAGING" "$PREFIX"
trap - EXIT
if ! works; then
  log "the install finished but $PY does not import e2b $VERSION"
  exit 1
fi
log "installed e2b $VERSION"
echo "$PY"
