#!/usr/bin/env bash
# Installs the pinned real ACP agents from npm (Claude Code, Codex, Gemini CLI), driven by tests/fakes/acp_drive.py
# against the fake model servers in tests/fakes, and prints where their launchers are:
#
#   .ci/install-acp-agents.sh                 # all three; prints `claude <path>`, `codex <path>`, `gemini <path>`
#   .ci/install-acp-agents.sh codex           # just the named ones (claude, codex, gemini), same output
#
# Each agent gets its own prefix outside the repository, shared by every clone and worktree:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/claude-agent-acp@VERSION   (@agentclientprotocol/claude-agent-acp)
#   ${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/codex-acp@VERSION          (@agentclientprotocol/codex-acp)
#   ${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox/gemini-cli@VERSION         (@google/gemini-cli)
# The printed paths are node scripts (node_modules/.bin links); the native programs they start come from the
# packages' platform-specific optional dependencies (Claude Code's `claude` from
# @anthropic-ai/claude-agent-sdk-linux-*, Codex's `codex` from @openai/codex-linux-*), which need no install
# scripts. Idempotent and safe to run concurrently (a lock next to each prefix); a finished install is reused
# without the network. Everything but the paths goes to stderr.
set -euo pipefail

CLAUDE_ACP="${CLAUDE_AGENT_ACP_VERSION:-0.101.0}"
CODEX_ACP="${CODEX_ACP_VERSION:-2.6.0}"
CODEX="${OPENAI_CODEX_VERSION:-0.166.0}"   # codex-acp $CODEX_ACP depends on @openai/codex ^0.166.0: pinned here
GEMINI="${GEMINI_CLI_VERSION:-0.61.0}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/acp-sandbox"

log() { echo "install-acp-agents: $*" >&2; }
version_of() { node -p "require('$1/node_modules/$2/package.json').version" 2>/dev/null; }
big() { [ -f "$1" ] && [ "$(stat -c %s "$1" 2>/dev/null || echo 0)" -gt 1000000 ]; }

case "$(uname -m)" in
  x86_64) ARCH=x64 ;;
  aarch64) ARCH=arm64 ;;
  *) log "unsupported machine $(uname -m)"; exit 1 ;;
esac
# Claude Code's native package is -musl on musl systems (Alpine); Codex ships a musl build for every Linux.
if ldd --version 2>&1 | grep -qi musl; then CLAUDE_NATIVE="claude-agent-sdk-linux-$ARCH-musl"; else CLAUDE_NATIVE="claude-agent-sdk-linux-$ARCH"; fi
case "$ARCH" in x64) CODEX_TRIPLE=x86_64-unknown-linux-musl ;; arm64) CODEX_TRIPLE=aarch64-unknown-linux-musl ;; esac

# For agent $1: the prefix, the printed launcher, the npm packages, and whether an install there is complete.
prefix_of() {
  case "$1" in
    claude) echo "$CACHE/claude-agent-acp@$CLAUDE_ACP" ;;
    codex) echo "$CACHE/codex-acp@$CODEX_ACP" ;;
    gemini) echo "$CACHE/gemini-cli@$GEMINI" ;;
  esac
}
bin_of() {
  case "$1" in
    claude) echo "$2/node_modules/.bin/claude-agent-acp" ;;
    codex) echo "$2/node_modules/.bin/codex-acp" ;;
    gemini) echo "$2/node_modules/.bin/gemini" ;;
  esac
}
packages_of() {
  case "$1" in
    claude) echo "@agentclientprotocol/claude-agent-acp@$CLAUDE_ACP" ;;
    codex) echo "@agentclientprotocol/codex-acp@$CODEX_ACP @openai/codex@$CODEX" ;;
    gemini) echo "@google/gemini-cli@$GEMINI" ;;
  esac
}
complete() {  # complete AGENT PREFIX
  local p="$2"
  [ -x "$(bin_of "$1" "$p")" ] || return 1
  case "$1" in
    claude)
      [ "$(version_of "$p" @agentclientprotocol/claude-agent-acp)" = "$CLAUDE_ACP" ] &&
        big "$p/node_modules/@anthropic-ai/$CLAUDE_NATIVE/claude" ;;
    codex)
      [ "$(version_of "$p" @agentclientprotocol/codex-acp)" = "$CODEX_ACP" ] &&
        [ "$(version_of "$p" @openai/codex)" = "$CODEX" ] &&
        big "$p/node_modules/@openai/codex-linux-$ARCH/vendor/$CODEX_TRIPLE/bin/codex" ;;
    gemini)
      [ "$(version_of "$p" @google/gemini-cli)" = "$GEMINI" ] ;;
  esac
}

install_one() {  # install_one AGENT: runs in a subshell, holding the lock next to the prefix
  local agent="$1" prefix staging
  prefix="$(prefix_of "$agent")"
  mkdir -p "$CACHE"
  exec 9>"$prefix.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  if complete "$agent" "$prefix"; then
    log "$agent already installed in $prefix"
    return 0
  fi
  staging="$prefix.staging.$$"
  rm -rf "$staging"
  mkdir -p "$staging"
  trap 'rm -rf "$staging"' EXIT
  log "installing $(packages_of "$agent") into $prefix"
  # shellcheck disable=SC2046
  npm install --prefix "$staging" --save-exact --no-audit --no-fund --loglevel error $(packages_of "$agent") >&2
  rm -rf "$prefix"
  # node_modules/.bin links are relative, so the tree still works once moved.
  mv "$staging" "$prefix"
  trap - EXIT
  if ! complete "$agent" "$prefix"; then
    log "the install of $agent finished but $prefix is incomplete (launcher, versions or native binary missing)"
    return 1
  fi
  log "installed $agent in $prefix"
}

command -v node >/dev/null && command -v npm >/dev/null || { log "Node.js and npm are required (.ci/deps.sh)"; exit 1; }
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
  log "Node.js $(node --version) is too old: Gemini CLI needs >=20, claude-agent-acp declares >=22"
  exit 1
elif [ "$major" -lt 22 ]; then
  log "note: claude-agent-acp $CLAUDE_ACP declares engines node >=22; it runs on Node.js $(node --version) here"
fi

agents=("$@")
[ ${#agents[@]} -gt 0 ] || agents=(claude codex gemini)
for agent in "${agents[@]}"; do
  case "$agent" in claude | codex | gemini) ;; *) log "unknown agent $agent (claude, codex, gemini)"; exit 2 ;; esac
  (install_one "$agent")
done
for agent in "${agents[@]}"; do
  echo "$agent $(bin_of "$agent" "$(prefix_of "$agent")")"
done
