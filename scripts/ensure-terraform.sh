#!/usr/bin/env bash
# ensure-terraform.sh — the Terraform CLI the provider's acceptance tests
# (tfprovider/) drive, built from the Go module proxy.
#
#   ensure-terraform.sh   path of the binary ($TF_ACC_TERRAFORM_PATH
#                         instead, if set)
#
# Terraform 1.5.7, the last MPL-2.0 release, is built once with `go
# install` into $(go env GOPATH)/hearth-terraform/v1.5.7/
# ($HEARTH_TERRAFORM_CACHE instead of $(go env GOPATH)/hearth-terraform if
# set): a few CPU-minutes the first time. Nothing comes from a Terraform
# registry or releases.hashicorp.com. The path goes to stdout, progress to
# stderr.
set -euo pipefail
shopt -s inherit_errexit

version=1.5.7
cache=${HEARTH_TERRAFORM_CACHE:-"$(go env GOPATH | cut -d: -f1)/hearth-terraform"}

# built_version BIN: the version BIN says it is (checkpoint off: no
# network).
built_version() {
  CHECKPOINT_DISABLE=1 "$1" version -json 2>/dev/null | sed -n 's/^ *"terraform_version": "\(.*\)",$/\1/p'
}

if [ -n "${TF_ACC_TERRAFORM_PATH:-}" ]; then
  [ -x "$TF_ACC_TERRAFORM_PATH" ] || { echo "ensure-terraform: TF_ACC_TERRAFORM_PATH=$TF_ACC_TERRAFORM_PATH is not executable" >&2; exit 1; }
  echo "$TF_ACC_TERRAFORM_PATH"
  exit 0
fi
case "${1:-}" in
"") ;;
*)
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
  ;;
esac

dir="$cache/v$version"
bin="$dir/terraform"
mkdir -p "$dir"
# One builder, even with several `make test` at once.
exec {lock}>"$dir/.lock"
flock "$lock"
if [ -x "$bin" ] && [ "$(built_version "$bin")" = "$version" ]; then
  echo "$bin"
  exit 0
fi
echo "ensure-terraform: building github.com/hashicorp/terraform@v$version into $dir (minutes, the first time)..." >&2
start=$SECONDS
GOFLAGS= GOBIN="$dir" go install "github.com/hashicorp/terraform@v$version" >&2
have=$(built_version "$bin")
if [ "$have" != "$version" ]; then
  echo "ensure-terraform: $bin reports version '$have' after the build, want $version" >&2
  exit 1
fi
echo "ensure-terraform: Terraform $version ready in $((SECONDS - start))s" >&2
echo "$bin"
