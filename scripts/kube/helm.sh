#!/bin/sh
# Builds the helm CLI, which test/kube renders deploy/helm/vivarium with,
# from the Go module proxy: helm.sh/helm/v3 at $version, its
# ./cmd/helm built with the machine's Go (GOTOOLCHAIN=local: no other
# toolchain is fetched). Nothing is downloaded from anywhere but the Go
# module proxy.
#
# Output, in $VIVARIUM_HELM_DIR (default ~/.cache/vivarium/helm-<hash>,
# the hash of the version and of this script, so that a change of it
# builds anew and an unchanged one reuses the binary):
#   helm        the binary
#   BUILD-INFO  what it was built from, and with which Go
#
# Steps: download the module; `go build ./cmd/helm` in it, the version
# stamped as helm's Makefile does; run `helm version`. A run with the
# binary in place does nothing. About 4 minutes on 2 busy cores with an
# empty Go build cache (238 s measured), seconds with a warm one.
set -eu
version=${VIVARIUM_HELM_VERSION:-v3.22.0}
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "${VIVARIUM_HELM_DIR:-}" ]; then
	key=$( (echo "$version"; cat "$root/scripts/kube/helm.sh") | sha256sum | cut -c1-12)
	VIVARIUM_HELM_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/vivarium/helm-$key"
fi
out=$VIVARIUM_HELM_DIR
step() { echo "helm: $*" >&2; }
fail() { echo "helm: $*" >&2; exit 1; }

if [ -x "$out/helm" ]; then
	step "up to date: $out/helm"
	exit 0
fi

command -v go >/dev/null 2>&1 || fail "go is not on PATH"
case $version in
v3.*.*) ;;
*) fail "VIVARIUM_HELM_VERSION must look like v3.22.0, not $version" ;;
esac
export GOWORK=off GOTOOLCHAIN=local
work=$out/work
mkdir -p "$work"

# 1. The source: the module as the proxy serves it (checked against
# sum.golang.org by go mod download). It is built where the module cache
# keeps it, read-only: go build writes only to -o and the build cache,
# and -mod=readonly keeps it from touching go.mod, so helm's own go.mod
# and go.sum decide its dependencies, as `go install` would.
step "downloading helm.sh/helm/v3@$version from $(go env GOPROXY | cut -d, -f1)"
dir=$(cd "$work" && go mod download -json "helm.sh/helm/v3@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -n "$dir" ] && [ -f "$dir/go.mod" ] || fail "go mod download helm.sh/helm/v3@$version gave no module directory"

# 2. The binary, with the version stamped as helm's Makefile does
# (internal/version.version), so that `helm version` says $version.
jobs=$(nproc 2>/dev/null || echo 2)
step "compiling helm $version with $(go env GOVERSION) ($jobs jobs; about 4 minutes on 2 cores with an empty build cache)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
start=$(date +%s)
(cd "$dir" && GOFLAGS="${GOFLAGS:-} -mod=readonly" go build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$work/helm" ./cmd/helm > "$work/build.log" 2>&1) ||
	{ tail -40 "$work/build.log" >&2; fail "go build ./cmd/helm failed (log: $work/build.log)"; }
took=$(($(date +%s) - start))

# 3. Out of the work tree; the binary last: its presence means the build
# is complete.
said=$("$work/helm" version --short 2>&1) || fail "the built helm does not run: $said"
{
	echo "helm.sh/helm/v3 $version from the Go module proxy, ./cmd/helm"
	echo "helm version --short: $said"
	go version
	echo "built in ${took}s on $jobs cores"
} > "$out/BUILD-INFO"
mv "$work/helm" "$out/helm"
rm -rf "$work"
step "done: $out/helm ($said, ${took}s)"
