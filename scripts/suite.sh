#!/usr/bin/env bash
# The whole test suite as `make test` runs it: `go test -race` over every
# package with the real systems (the environment comes from the Makefile),
# then the ten slowest packages, and a failure when the suite outgrows its
# budget (SUITE_BUDGET seconds, default 30 minutes) even if every test passed.
set -uo pipefail
budget=${SUITE_BUDGET:-1800}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
"${GO:-go}" test -race -count=1 -timeout 30m ./... 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
elapsed=$(( $(date +%s) - start ))
echo
echo "ten slowest packages:"
awk '($1 == "ok" || $1 == "FAIL") && $3 ~ /s$/ { t = $3; sub(/s$/, "", t); printf "%8.1fs  %s\n", t, $2 }' "$log" |
	sort -rn | head -10
echo "suite: ${elapsed}s (budget ${budget}s)"
if (( status == 0 && elapsed > budget )); then
	echo "the suite took ${elapsed}s, over its ${budget}s budget: find what grew (the slowest packages above)" >&2
	exit 1
fi
exit "$status"
