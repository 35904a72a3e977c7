#!/bin/sh
# Installs acp-sandbox from this checkout on Debian or Ubuntu: the system packages it needs, then
# `cargo install --locked --path .` (the first build takes about 18 minutes on 2 cores).
#
#   ./install.sh                    the packages, then the build
#   ./install.sh --deps-only        the packages only
#   ./install.sh --with-test-deps   also what the tests need (Python 3)
#
# Packages: bubblewrap (the sandbox), a C compiler (build-essential: SQLite is built in), Node.js and npm (the
# agents' CLIs are installed from npm on first use). Only what is missing is installed. As root apt-get runs
# as it is (a root Debian image has no sudo); as another user it runs through sudo. npm is installed only when
# Node.js did not bring one (NodeSource's nodejs does, and Debian's npm package conflicts with it).
set -eu
cd "$(dirname "$0")"

deps_only=false
test_deps=false
for arg in "$@"; do
  case "$arg" in
    --deps-only) deps_only=true ;;
    --with-test-deps) test_deps=true ;;
    -h | --help)
      echo "usage: ./install.sh [--deps-only] [--with-test-deps]"
      exit 0
      ;;
    *)
      echo "install.sh: unknown argument: $arg" >&2
      exit 2
      ;;
  esac
done

have() { command -v "$1" >/dev/null 2>&1; }

# rustup puts cargo in ~/.cargo/bin, which a fresh login shell may not have on PATH yet.
cargo_path_added=false
if ! have cargo && [ -x "${HOME:-/nonexistent}/.cargo/bin/cargo" ]; then
  PATH="$HOME/.cargo/bin:$PATH"
  export PATH
  cargo_path_added=true
fi
if ! $deps_only && ! have cargo; then
  echo "install.sh: Rust is needed (cargo not found): install it from https://rustup.rs, then run ./install.sh again" >&2
  exit 1
fi

as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif have sudo; then
    sudo "$@"
  else
    echo "install.sh: installing packages needs root: run ./install.sh as root, or install sudo" >&2
    exit 1
  fi
}

apt_install() {
  if ! have apt-get; then
    echo "install.sh: no apt-get here: install$* with your package manager, then run ./install.sh again" >&2
    exit 1
  fi
  echo "install.sh: installing$*"
  if [ "$updated" = false ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    updated=true
  fi
  # Word splitting of the list is wanted: one argument per package.
  # shellcheck disable=SC2086
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $*
}

updated=false
missing=""
have bwrap || missing="$missing bubblewrap"
have cc || missing="$missing build-essential"
have node || missing="$missing nodejs"
if $test_deps; then have python3 || missing="$missing python3"; fi
if [ -n "$missing" ]; then apt_install "$missing"; fi
# Only now: the nodejs just installed may have brought npm with it.
if ! have npm; then apt_install " npm"; fi

if $deps_only; then
  exit 0
fi
echo "install.sh: building acp-sandbox (cargo install --locked --path .; the first build takes about 18 minutes on 2 cores)"
cargo install --locked --path .
if $cargo_path_added || ! have acp-sandbox; then
  echo "install.sh: acp-sandbox is in ~/.cargo/bin, which is not on your PATH yet: export PATH=\"\$HOME/.cargo/bin:\$PATH\"" >&2
fi
echo "install.sh: done; acp-sandbox doctor says what it found"
