#!/usr/bin/env bash
# A short run of every fuzz target (package:FuzzName arguments), as many at
# once as there are cores, each with one worker, so that none can rot.
# FUZZTIME is an execution count, not a duration: with a duration, Go 1.26's
# fuzzing coordinator can report its own deadline as a failure at the
# boundary (go.dev/issue/75804, fixed in Go 1.27); a count has no deadline.
set -euo pipefail
fuzztime=${FUZZTIME:-40000x}
one() {
	local pkg=${1%%:*} fn=${1##*:} out
	if ! out=$("${GO:-go}" test -run='^$' -fuzz="^${fn}\$" -fuzztime="$fuzztime" -parallel=1 "./$pkg" 2>&1); then
		printf '%s\nfuzz %s %s FAILED\n' "$out" "$pkg" "$fn"
		return 255 # stops xargs: the first failure ends the run
	fi
	echo "fuzz $pkg $fn ($fuzztime) ok"
}
export -f one
export fuzztime
printf '%s\n' "$@" | xargs -r -P "$(nproc)" -I{} bash -c 'one "$1"' _ {}
