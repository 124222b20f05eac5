#!/bin/sh
# build-deb.sh VERSION OUTDIR — build OUTDIR/hearth_<version>_amd64.deb.
#
# VERSION may be a git describe string: a leading "v" is dropped, "-" becomes
# "+" (a Debian version has no upstream "-" without a revision), and a version
# not starting with a digit becomes 0.0.0~VERSION (sorts before any release).
# The binaries are built here from ./cmd/hearthd, ./cmd/hearth-control and
# ./cmd/hearth (the customer CLI);
# the package itself is assembled by nfpm (pinned below; later releases need
# modules the Go proxy does not serve). Set NFPM to use another nfpm command,
# HEARTH_BIN_DIR to package the three binaries built elsewhere.
set -eu

if [ $# -ne 2 ]; then
	echo "usage: $0 VERSION OUTDIR" >&2
	exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$2"
outdir=$(cd "$2" && pwd)
NFPM=${NFPM:-go run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2}

version=$(printf '%s' "${1#v}" | tr -- '-' '+' | tr -cd 'A-Za-z0-9.+~')
case "$version" in
[0-9]*) ;;
*) version="0.0.0~$version" ;;
esac

# Reproducible: file times, the changelog date and gzip headers come from the
# last commit, not the clock.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT INT TERM
mkdir -p "$stage/bin" "$stage/systemd" "$stage/etc" "$stage/doc" "$stage/man" "$stage/scripts"

if [ -n "${HEARTH_BIN_DIR:-}" ]; then
	cp "$HEARTH_BIN_DIR/hearthd" "$HEARTH_BIN_DIR/hearth-control" "$HEARTH_BIN_DIR/hearth" "$stage/bin/"
else
	# Static PIE: no libc dependency to declare (nfpm computes no
	# shared-library dependencies), and address-space randomisation. A
	# non-PIE static binary is a lintian error; this is a warning (see
	# README.md).
	(cd "$repo" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -buildmode=pie \
		-ldflags "-s -w -X main.version=$version" -o "$stage/bin/" ./cmd/hearthd ./cmd/hearth-control ./cmd/hearth)
fi

cp "$repo"/systemd/hearthd.service "$repo"/systemd/hearthd.socket \
	"$repo"/systemd/hearth-control.service "$repo"/systemd/hearth-control.socket \
	"$repo"/systemd/hearth.tmpfiles "$stage/systemd/"
cp "$repo/packaging/hearthd.toml" "$repo/packaging/control.toml" "$stage/etc/"
cp "$repo/packaging/scripts/postinst" "$repo/packaging/scripts/prerm" "$repo/packaging/scripts/postrm" "$stage/scripts/"
cp "$repo/packaging/copyright" "$repo/packaging/grafana-dashboard.json" "$stage/doc/"
date=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
sed -e "s/@VERSION@/$version/g" -e "s/@DATE@/$date/" "$repo/packaging/changelog.in" | gzip -9n >"$stage/doc/changelog.gz"
for m in hearthd.8 hearth-control.8 hearth.1; do
	gzip -9n <"$repo/packaging/man/$m" >"$stage/man/$m.gz"
done

deb="$outdir/hearth_${version}_amd64.deb"
(cd "$stage" && HEARTH_DEB_VERSION=$version $NFPM package --config "$repo/packaging/nfpm.yaml" \
	--packager deb --target "$deb" >&2)
echo "$deb"
