#!/usr/bin/env bash
# CI: the README's install command (./install.sh) as root on an image without sudo, as a sudo user, with a
# Node.js that brings its own npm, and with everything already there. Each case runs the real script on a PATH
# that holds only recording stubs (apt-get, cargo, sudo, id, and the tools the case has) and compares the
# commands it ran, in order, with what they must be. Nothing is installed; it takes a second.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# stub DIR NAME BODY: an executable DIR/NAME running BODY under /bin/sh.
stub() {
  printf '#!/bin/sh\n%s\n' "$3" >"$1/$2"
  /bin/chmod +x "$1/$2"
}

# case NAME UID TOOLS NODE_BRINGS_NPM EXPECTED [ARGS...]: runs ./install.sh ARGS as user UID with only TOOLS (and
# `sudo` if listed) on PATH; EXPECTED is the log: one line per command run, then `exit CODE`.
case_() {
  local name=$1 uid=$2 tools=$3 node_npm=$4 expected=$5
  shift 5
  local dir=$work/$name
  local bin=$dir/bin log=$dir/log
  mkdir -p "$bin" "$dir/home"
  : >"$log"
  ln -s "$(command -v dirname)" "$bin/dirname"
  ln -s "$(command -v env)" "$bin/env"
  stub "$bin" id "[ \"\$1\" = -u ] && echo $uid"
  local make_tool="make() { printf '#!/bin/sh\\n' >\"$bin/\$1\"; /bin/chmod +x \"$bin/\$1\"; }"
  for tool in $tools; do
    case "$tool" in
      cargo) stub "$bin" cargo "echo \"cargo \$*\" >>'$log'; $make_tool; make acp-sandbox" ;;
      sudo) stub "$bin" sudo "echo \"sudo \$*\" >>'$log'; exec \"\$@\"" ;;
      *) stub "$bin" "$tool" "exit 0" ;;
    esac
  done
  # apt-get "installs" a package by putting its command on PATH; Debian's npm conflicts with a nodejs that
  # brought its own.
  stub "$bin" apt-get "echo \"apt-get \$*\" >>'$log'
[ \"\$DEBIAN_FRONTEND\" = noninteractive ] || { echo 'apt-get: DEBIAN_FRONTEND is not noninteractive' >&2; exit 100; }
$make_tool
[ \"\$1\" = install ] || exit 0
for package; do
  case \"\$package\" in
    bubblewrap) make bwrap ;;
    build-essential) make cc ;;
    nodejs) make node; [ $node_npm = yes ] && make npm ;;
    npm) [ -e '$bin/npm' ] && { echo 'npm : Conflicts: nodejs' >&2; exit 100; }; make npm ;;
    python3) make python3 ;;
  esac
done
exit 0"
  local code=0
  PATH=$bin HOME=$dir/home "$repo/install.sh" "$@" >"$dir/out" 2>&1 || code=$?
  echo "exit $code" >>"$log"
  if [ "$(cat "$log")" != "$expected" ]; then
    echo "check-install: $name: ran"
    sed 's/^/    /' "$log"
    echo "  expected"
    echo "$expected" | sed 's/^/    /'
    echo "  install.sh said"
    sed 's/^/    /' "$dir/out"
    failures=$((failures + 1))
  fi
}

apt_root="apt-get update -qq
apt-get install -y -qq bubblewrap build-essential nodejs
apt-get install -y -qq npm"

case_ root-without-sudo 0 "cargo" no "$apt_root
cargo install --locked --path .
exit 0"
# Root never goes through sudo, even where one exists.
case_ root-with-sudo 0 "cargo sudo" no "$apt_root
cargo install --locked --path .
exit 0"
case_ sudo-user 1000 "cargo sudo" no "sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
apt-get update -qq
sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap build-essential nodejs
apt-get install -y -qq bubblewrap build-essential nodejs
sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm
apt-get install -y -qq npm
cargo install --locked --path .
exit 0"
case_ nodesource-npm 0 "cargo bwrap cc" yes "apt-get update -qq
apt-get install -y -qq nodejs
cargo install --locked --path ."$'\n'"exit 0"
case_ all-there 1000 "cargo bwrap cc node npm" no "cargo install --locked --path .
exit 0"
case_ user-without-sudo 1000 "cargo cc node npm" no "exit 1"
case_ no-rust 0 "" no "exit 1"
case_ test-deps-only 0 "bwrap cc node npm" no "apt-get update -qq
apt-get install -y -qq python3
exit 0" --deps-only --with-test-deps

if ! grep -q "needs root: run ./install.sh as root, or install sudo" "$work/user-without-sudo/out"; then
  echo "check-install: user-without-sudo: install.sh did not say it needs root or sudo"
  failures=$((failures + 1))
fi
if [ "$failures" -gt 0 ]; then
  echo "check-install: $failures of 8 cases failed"
  exit 1
fi
echo "check-install: 8 passed, 0 failed"
