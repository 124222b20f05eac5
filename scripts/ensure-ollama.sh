#!/usr/bin/env bash
# ensure-ollama.sh — Ollama binaries (CPU) built from the Go module proxy.
#
#   ensure-ollama.sh            path of the current version's binary
#                               ($HEARTH_OLLAMA_BIN instead, if set)
#   ensure-ollama.sh VERSION    path of that version's binary (e.g. 0.9.6)
#   ensure-ollama.sh --all      VERSION=PATH lines, one per version of the
#                               test matrix ($HEARTH_OLLAMA_BINS instead, if set,
#                               as comma-separated VERSION=PATH pairs)
#   ensure-ollama.sh --current  the current version's number
#
# Each version is built once into $(go env GOPATH)/hearth-ollama/vVERSION/
# ($HEARTH_OLLAMA_CACHE instead of $(go env GOPATH)/hearth-ollama if set)
# with its version stamped in (0.17.4 from scratch: about 7 CPU-minutes), so
# `ollama --version` and /api/version answer it. A cached binary that answers
# another version (built by a bare `go install`, which leaves 0.0.0) is
# relinked in place; Go's build cache makes that fast. Paths go to stdout,
# progress to stderr.
set -euo pipefail
shopt -s inherit_errexit

# The test matrix: the oldest supported version and the current one, which
# `make run` and `make bench` use. 0.17.4 is the newest release the module
# proxy serves; it builds with `go install` given the headers below.
oldest=0.9.6
current=0.17.4
matrix=("$oldest" "$current")

cache=${HEARTH_OLLAMA_CACHE:-"$(go env GOPATH | cut -d: -f1)/hearth-ollama"}

# built_version BIN: the version BIN was stamped with. Pointing it at a port
# nobody listens on makes it report its own (client) version offline.
built_version() {
  OLLAMA_HOST=127.0.0.1:1 "$1" --version 2>/dev/null | sed -n 's/^Warning: client version is //p'
}

# build_deps INC: a C++ compiler, and the headers current Ollama's sources
# include but do not ship: nlohmann/json and stb from Debian, miniaudio from
# the Go module that vendors it (the module proxy is reachable where GitHub
# may not be). `make test` installs the Debian ones first (ensure-deps.sh);
# this covers `make run` and `make ollama` on their own.
build_deps() {
  local inc=$1
  "$(dirname "${BASH_SOURCE[0]}")/ensure-deps.sh" gcc g++ nlohmann-json3-dev libstb-dev
  if [ ! -e "$inc/miniaudio/miniaudio.h" ]; then
    local malgo
    malgo=$(cd / && GOFLAGS= go mod download -json github.com/gen2brain/malgo@v0.11.24 | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    mkdir -p "$inc/miniaudio"
    cp "$malgo/miniaudio.h" "$inc/miniaudio/miniaudio.h.tmp"
    mv "$inc/miniaudio/miniaudio.h.tmp" "$inc/miniaudio/miniaudio.h"
  fi
}

# ensure VERSION: build VERSION unless a binary stamped with it is cached;
# print its path.
ensure() {
  local v=${1#v}
  local dir="$cache/v$v"
  local bin="$dir/ollama"
  mkdir -p "$dir"
  # One builder per version, even with several `make test` at once.
  exec {lock}>"$dir/.lock"
  flock "$lock"
  local have=""
  if [ -x "$bin" ]; then
    have=$(built_version "$bin")
    [ "$have" = "$v" ] && { exec {lock}>&-; echo "$bin"; return 0; }
    echo "ensure-ollama: $bin reports version '${have:-?}', not $v: relinking it with the version stamped in" >&2
  else
    echo "ensure-ollama: building github.com/ollama/ollama@v$v into $dir (minutes, the first time)..." >&2
  fi
  local inc="$cache/include"
  build_deps "$inc"
  local start=$SECONDS
  GOFLAGS= GOBIN="$dir" CGO_CPPFLAGS="-I$inc${CGO_CPPFLAGS:+ $CGO_CPPFLAGS}" \
    go install -ldflags "-X github.com/ollama/ollama/version.Version=$v" "github.com/ollama/ollama@v$v" >&2
  have=$(built_version "$bin")
  if [ "$have" != "$v" ]; then
    echo "ensure-ollama: $bin still reports version '$have' after the build, want $v" >&2
    return 1
  fi
  echo "ensure-ollama: Ollama $v ready in $((SECONDS - start))s" >&2
  exec {lock}>&-
  echo "$bin"
}

case "${1:-}" in
"")
  if [ -n "${HEARTH_OLLAMA_BIN:-}" ]; then
    [ -x "$HEARTH_OLLAMA_BIN" ] || { echo "ensure-ollama: HEARTH_OLLAMA_BIN=$HEARTH_OLLAMA_BIN is not executable" >&2; exit 1; }
    echo "$HEARTH_OLLAMA_BIN"
  else
    ensure "$current"
  fi
  ;;
--current) echo "$current" ;;
--all)
  if [ -n "${HEARTH_OLLAMA_BINS:-}" ]; then
    tr ',' '\n' <<<"$HEARTH_OLLAMA_BINS"
  else
    for v in "${matrix[@]}"; do
      path=$(ensure "$v")
      echo "$v=$path"
    done
  fi
  ;;
-*)
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
  ;;
*) ensure "$1" ;;
esac
