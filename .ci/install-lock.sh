#!/usr/bin/env bash
# Sourced by .ci/install-python-sdk.sh and .ci/install-node-sdk.sh. `reuse_or_lock PREFIX WHAT RESULT` takes the
# lock next to PREFIX (held until the script exits, so concurrent installs wait for each other) and, when the
# caller's `works` says the install is already there, logs WHAT with the caller's `log`, prints RESULT and exits.
reuse_or_lock() {
  mkdir -p "$(dirname "$1")"
  exec 9>"$1.lock"
  if command -v flock >/dev/null 2>&1; then
    flock 9
  fi
  if works; then
    log "$2 already installed"
    echo "$3"
    exit 0
  fi
}
