#!/usr/bin/env bash
# Installs the pinned OpenCode CLI (npm `opencode-ai`) for tests/real_opencode.rs, and prints its path.
#
#   .ci/install-opencode.sh            # installs once, then prints the path of the `opencode` binary
#   export ACP_SANDBOX_TEST_OPENCODE="$(.ci/install-opencode.sh)"
#
# The install goes into a prefix outside the repository, shared by every clone and worktree:
#   ${ACP_SANDBOX_OPENCODE_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/opencode-ai@VERSION}
# tests/real_opencode.rs looks there when ACP_SANDBOX_TEST_OPENCODE is not set.
# Idempotent: a finished install is detected and reused (no network). Everything but the path goes to stderr.
set -euo pipefail

VERSION="${OPENCODE_VERSION:-1.18.33}"
PREFIX="${ACP_SANDBOX_OPENCODE_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/opencode-ai@$VERSION}"
BIN="$PREFIX/node_modules/.bin/opencode"
PKG="$PREFIX/node_modules/opencode-ai"

log() { echo "install-opencode: $*" >&2; }

# A real OpenCode binary is a ~185 MB ELF; the package's unlinked placeholder is a small script.
works() {
  [ -x "$BIN" ] || return 1
  local target size
  target="$(readlink -f "$BIN")"
  size="$(stat -c %s "$target" 2>/dev/null || echo 0)"
  [ "$size" -gt 1000000 ] || return 1
  [ "$("$BIN" --version 2>/dev/null | tr -d '[:space:]')" = "$VERSION" ] || return 1
  # The plugin package OpenCode wants in its config dir, shipped beside it (as the bridge's own install does).
  [ -f "$PREFIX/node_modules/@opencode-ai/plugin/package.json" ] && [ -f "$PREFIX/package-lock.json" ]
}

if works; then
  log "opencode $VERSION already installed"
  echo "$BIN"
  exit 0
fi

command -v npm >/dev/null || { log "npm is required (install Node.js)"; exit 1; }

STAGING="$PREFIX.staging.$$"
rm -rf "$STAGING"
mkdir -p "$STAGING"
trap 'rm -rf "$STAGING"' EXIT
log "installing opencode-ai@$VERSION into $PREFIX (about 350 MB)"
npm install --prefix "$STAGING" --no-audit --no-fund --loglevel error "opencode-ai@$VERSION" \
  "@opencode-ai/plugin@$VERSION" >&2

# npm 11 may skip install scripts ("not yet covered by allowScripts"): then bin/opencode is still the
# placeholder. The package's own postinstall.mjs hard-links the platform binary (AVX2 or baseline).
SBIN="$STAGING/node_modules/.bin/opencode"
size="$(stat -c %s "$(readlink -f "$SBIN")" 2>/dev/null || echo 0)"
if [ "$size" -le 1000000 ]; then
  log "postinstall did not run (npm skipped install scripts); running postinstall.mjs by hand"
  (cd "$STAGING/node_modules/opencode-ai" && node postinstall.mjs >&2)
fi

rm -rf "$PREFIX"
mv "$STAGING" "$PREFIX"
trap - EXIT
# Hard links and .bin symlinks are relative, so they survive the move.
if ! works; then
  log "the install finished but $BIN does not report version $VERSION"
  "$BIN" --version >&2 || true
  exit 1
fi
log "installed opencode $VERSION"
echo "$BIN"
