#!/bin/sh
# Builds vivarium (default: bin/vivarium) statically, with the program every
# sandbox starts inside itself embedded (internal/initprog, written to
# cmd/vivarium/initprog/vivarium-init first). `go build ./cmd/vivarium`
# alone makes a vivarium without it, whose sandboxes start the whole
# binary again: the same sandboxes, about 3 ms more CPU each.
#
#   scripts/build.sh [OUTPUT]
set -eu
out=${1:-bin/vivarium}
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
go=${GO:-go}
# Builds running at once (test packages) each write their own file, then
# rename it into place: the same sources give the same bytes.
tmp=$(mktemp cmd/vivarium/.vivarium-init.XXXXXX)
trap 'rm -f "$tmp"' EXIT
$go build -o "$tmp" ./internal/initprog
sum=$(sha256sum "$tmp" | cut -d' ' -f1)
chmod 0644 "$tmp"
mv -f "$tmp" cmd/vivarium/initprog/vivarium-init
$go build -ldflags "-X main.initProgSHA256=$sum" -o "$out" ./cmd/vivarium
