#!/usr/bin/env bash
# Prints the path of an ollama binary, building Ollama 0.9.6 (CPU) from the Go
# module proxy when none is found. The build takes a few minutes on 2 cores
# and is cached in GOPATH/bin.
set -euo pipefail
want=v0.9.6
if [ -n "${HEARTH_OLLAMA_BIN:-}" ] && [ -x "$HEARTH_OLLAMA_BIN" ]; then
  echo "$HEARTH_OLLAMA_BIN"; exit 0
fi
gobin=$(go env GOBIN); [ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
for c in "$(command -v ollama || true)" "$gobin/ollama"; do
  if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; exit 0; fi
done
echo "ollama not found: building github.com/ollama/ollama@$want (a few minutes)..." >&2
GOFLAGS= go install "github.com/ollama/ollama@$want" >&2
echo "$gobin/ollama"
