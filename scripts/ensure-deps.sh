#!/usr/bin/env bash
# ensure-deps.sh [PACKAGE...] — the Debian packages `make test` needs (or
# just those given), installed if missing; then (without arguments) the npm
# packages of e2e/node (the official openai SDK), from its lock file.
#
# As root it installs what is missing (apt-get update + install, quietly) and
# says what it installed; as another user it prints the exact apt-get line
# and fails. `npm ci` runs as whoever runs this, when e2e/node/node_modules
# is missing or older than the lock file. With everything present it prints
# nothing and touches nothing.
# Go itself is not an apt package here (Debian 12 ships 1.19): it must be on
# PATH already.
set -euo pipefail

# package            needed for
pkgs=(
  make               # the entry points
  curl ca-certificates git
  gcc g++ libc6-dev  # cgo: -race, and building Ollama
  nlohmann-json3-dev libstb-dev # headers current Ollama's C++ includes
  iproute2 nftables util-linux  # firewall tests in network namespaces (ip, nft, unshare)
  openssh-client openssh-server passwd # fingerprints, a real sshd, test users
  prometheus         # promtool and a real scrape
  systemd            # systemd-analyze verify/security, deb-systemd-helper
  lintian dpkg-dev debhelper # the .deb
  nginx              # the reverse proxy in benchmarks and tests (internal/nginxtest)
  postgresql         # a private PostgreSQL in tests (internal/pgtest)
  chromium           # browser tests with chromedp: the web console, the deployment API's CORS
)
# Node may come from elsewhere (nodesource, nvm): only ask for Debian's when
# there is none.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  pkgs+=(nodejs npm)
fi
npm_too=1
[ $# -eq 0 ] || { pkgs=("$@"); npm_too=0; }

missing=()
for p in "${pkgs[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$p")
done

go_ok=1
if ! command -v go >/dev/null; then
  echo "ensure-deps: go is not on PATH; install Go $(sed -n 's/^go //p' "$(dirname "$0")/../go.mod") or newer from https://go.dev/dl/" >&2
  go_ok=0
fi
if [ ${#missing[@]} -gt 0 ]; then
  line="apt-get install -y --no-install-recommends ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "ensure-deps: missing Debian packages; as root run:" >&2
    echo "  apt-get update && $line" >&2
    exit 1
  fi
  echo "ensure-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm ci leaves node_modules/.package-lock.json behind: newer than the lock
# file, nothing changed since.
node_dir="$(cd "$(dirname "$0")/.." && pwd)/e2e/node"
if [ $npm_too = 1 ] && ! [ "$node_dir/node_modules/.package-lock.json" -nt "$node_dir/package-lock.json" ]; then
  echo "ensure-deps: npm ci in $node_dir" >&2
  (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
[ $go_ok = 1 ]
