#!/usr/bin/env bash
# Installs a pinned Python package (a provider's official SDK) into a venv of its own, and prints the venv's python.
#
#   .ci/install-python-sdk.sh PACKAGE VERSION [PREFIX]
#
# The venv lives outside the repository, shared by every clone and worktree, at PREFIX or
#   ${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/PACKAGE-sdk@VERSION
# On a fresh Debian it first installs python3-venv (as root, or through sudo). Idempotent and safe to run
# concurrently (a lock next to the venv); a finished install is reused without the network. Everything but the
# path goes to stderr. .ci/install-e2b-sdk.sh and .ci/install-daytona-sdk.sh name what the tests pin.
set -euo pipefail

PACKAGE="$1"
VERSION="$2"
PREFIX="${3:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/$PACKAGE-sdk@$VERSION}"
PY="$PREFIX/bin/python"

log() { echo "install-$PACKAGE-sdk: $*" >&2; }
works() {
  [ -x "$PY" ] && [ "$("$PY" -c "import importlib.metadata as m; print(m.version('$PACKAGE'))" 2>/dev/null)" = "$VERSION" ]
}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# shellcheck source=.ci/install-lock.sh
. "$(dirname "$0")/install-lock.sh"
reuse_or_lock "$PREFIX" "$PACKAGE $VERSION" "$PY"
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  command -v apt-get >/dev/null || { log "python3 with venv and ensurepip is required"; exit 1; }
  log "installing python3-venv"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
fi
STAGING="$PREFIX.staging.$$"
rm -rf "$STAGING" "$PREFIX"
trap 'rm -rf "$STAGING"' EXIT
log "installing $PACKAGE==$VERSION into $PREFIX"
python3 -m venv "$STAGING"
"$STAGING/bin/python" -m pip install --quiet --disable-pip-version-check "$PACKAGE==$VERSION" >&2
# A venv finds its packages through the pyvenv.cfg next to bin/python, so it still works once moved.
mv "$STAGING" "$PREFIX"
trap - EXIT
if ! works; then
  log "the install finished but $PY does not import $PACKAGE $VERSION"
  exit 1
fi
log "installed $PACKAGE $VERSION"
echo "$PY"
