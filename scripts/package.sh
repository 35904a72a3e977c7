#!/usr/bin/env bash
# Release packaging: builds acp-sandbox-<version>-<target>.tar.gz (the executable at the top of the archive, as
# the ACP registry's `cmd: "./acp-sandbox"` expects, plus the README and docs/) and its .sha256 (`sha256sum -c` format).
#
#   scripts/package.sh [--target TRIPLE] [--binary PATH] [--out DIR]
#       --target  a Rust target triple (default: this machine's). Built with `cargo build --release --target`;
#                 the target must be installed (`rustup target add TRIPLE`) with its C compiler and linker
#                 (bundled SQLite is C): x86_64-unknown-linux-gnu, aarch64-unknown-linux-gnu (gcc-aarch64-linux-gnu,
#                 CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc), or the -musl variants
#                 for a binary that runs on any Linux. macOS (x86_64/aarch64-apple-darwin) packages the same way
#                 once the code builds there; today the sandbox is Linux-only (bubblewrap, seccomp, cgroups).
#       --binary  package this already-built executable instead of building (the tests pass their own build)
#       --out     where the archive goes (default: dist/)
#
#   scripts/package.sh entry --base-url URL [--out DIR]
#       prints editors/registry/agent.json with each platform whose archive is in DIR pointing at URL/<archive>
#       with its sha256; URL must name the version (the registry refuses /latest/).
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."

die() { echo "package.sh: $*" >&2; exit 2; }

version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || die "no version in Cargo.toml"

# The registry's platform for a target triple.
platform_of() {
  case "$1" in
    x86_64-*-linux-*) echo linux-x86_64 ;;
    aarch64-*-linux-*) echo linux-aarch64 ;;
    x86_64-apple-darwin) echo darwin-x86_64 ;;
    aarch64-apple-darwin) echo darwin-aarch64 ;;
    *) return 1 ;;
  esac
}

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1; else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

mode=package
if [ "${1:-}" = entry ]; then mode=entry; shift; fi
target="" binary="" out="" base_url=""
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target=${2:?--target needs a triple}; shift 2 ;;
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --base-url) base_url=${2:?--base-url needs a URL}; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
# Paths on the command line are the caller's; the script works from the checkout.
absolute() { case "$1" in /*|"") echo "$1" ;; *) echo "$caller/$1" ;; esac; }
out=$(absolute "${out:-$PWD/dist}")
binary=$(absolute "$binary")

if [ "$mode" = entry ]; then
  [ -n "$base_url" ] || die "entry needs --base-url"
  case "$base_url" in */latest/*|*/latest) die "the registry refuses /latest/ URLs: name the version" ;; esac
  # One "platform archive sha256" line per archive in DIR; python3 only edits the JSON.
  lines=""
  for sha_file in "$out"/acp-sandbox-"$version"-*.tar.gz.sha256; do
    [ -e "$sha_file" ] || die "no acp-sandbox-$version-*.tar.gz.sha256 in $out"
    archive=$(basename "${sha_file%.sha256}")
    triple=${archive#acp-sandbox-"$version"-}
    triple=${triple%.tar.gz}
    platform=$(platform_of "$triple") || die "no ACP registry platform for target $triple"
    lines+="$platform $archive $(cut -d' ' -f1 "$sha_file")"$'\n'
  done
  printf '%s' "$lines" | python3 -c '
import json, sys
version, base = sys.argv[1], sys.argv[2]
with open("editors/registry/agent.json") as f:
    entry = json.load(f)
entry["version"] = version
binary = {}
for line in sys.stdin.read().splitlines():
    platform, archive, sha = line.split()
    binary[platform] = {"archive": base + "/" + archive, "cmd": "./acp-sandbox", "sha256": sha}
entry["distribution"] = {"binary": binary}
print(json.dumps(entry, indent=2))
' "$version" "${base_url%/}"
  exit 0
fi

host=$(rustc -vV | sed -n 's/^host: //p')
target=${target:-$host}
platform_of "$target" >/dev/null || die "no ACP registry platform for target $target"
if [ -z "$binary" ]; then
  # Symbols stripped: a third of the size, and nothing a user's crash report needs from them.
  cargo build --release --locked --target "$target" --config 'profile.release.strip=true'
  binary=target/$target/release/acp-sandbox
fi
[ -x "$binary" ] || die "not an executable: $binary"

name=acp-sandbox-$version-$target.tar.gz
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$binary" "$stage/acp-sandbox"
chmod 0755 "$stage/acp-sandbox"
# A debug build handed in with --binary carries its symbols; the host's strip can only read the host's format.
if [ "$target" = "$host" ] && command -v strip >/dev/null 2>&1; then strip "$stage/acp-sandbox"; fi
cp README.md "$stage/README.md"
# The README links into docs/: the archive carries them.
cp -R docs "$stage/docs"
owner=()
if tar --version 2>/dev/null | grep -q GNU; then owner=(--owner=0 --group=0 --numeric-owner); fi
tar -C "$stage" "${owner[@]}" -czf "$out/$name" acp-sandbox README.md docs
(cd "$out" && printf '%s  %s\n' "$(sha256_of "$name")" "$name" >"$name.sha256")
echo "$out/$name"
