#!/bin/sh
# Builds kube-apiserver, which the Kubernetes tests start against an etcd
# of their own (internal/testutil/kubetest), from the Go module proxy:
# k8s.io/kubernetes at $version, whose ./staging/... replace directives are
# pointed at the published k8s.io/* modules of the same release
# (v0.<minor>.<patch>), built with the machine's Go (GOTOOLCHAIN=local:
# no other toolchain is fetched). It also installs etcd, which the tests
# run, from Debian's etcd-server package when /usr/bin/etcd is missing.
# Nothing is downloaded from anywhere but the Go module proxy and
# Debian's archive.
#
# Output, in $VIVARIUM_KUBE_DIR (default ~/.cache/vivarium/kube-<hash>,
# the hash of the version, of this script and of k8s.sh, which it shares
# with node.sh, so that a change of them builds anew and an unchanged one
# reuses the binary):
#   kube-apiserver  the binary
#   BUILD-INFO      what it was built from, and with which Go
#
# Steps: etcd; download the module; copy it to $VIVARIUM_KUBE_DIR/work
# (the module cache is read-only); rewrite the replace directives; `go
# build ./cmd/kube-apiserver`; run `kube-apiserver --version`. A run with
# the binary in place only checks etcd. About 4 minutes on 2 cores with
# an empty Go build cache.
set -eu
version=${VIVARIUM_KUBE_VERSION:-v1.33.4}
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "${VIVARIUM_KUBE_DIR:-}" ]; then
	key=$( (echo "$version"; cat "$root/scripts/kube/build.sh" "$root/scripts/kube/k8s.sh") | sha256sum | cut -c1-12)
	VIVARIUM_KUBE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/vivarium/kube-$key"
fi
out=$VIVARIUM_KUBE_DIR
step() { echo "kube: $*" >&2; }
fail() { echo "kube: $*" >&2; exit 1; }
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

# 1. etcd, from Debian (3.4.23 on bookworm). The package may start a
# system-wide etcd; the tests start their own on random ports, so a
# service left running would only hold port 2379 and memory: stop it.
if [ ! -x /usr/bin/etcd ]; then
	step "installing etcd (Debian's etcd-server)"
	$sudo apt-get update -qq
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null ||
		fail "apt-get install etcd-server failed"
	if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
		$sudo systemctl disable --now etcd.service >/dev/null 2>&1 || true
	elif [ -x /etc/init.d/etcd ]; then
		$sudo /etc/init.d/etcd stop >/dev/null 2>&1 || true
		$sudo update-rc.d etcd disable >/dev/null 2>&1 || true
	fi
fi
[ -x /usr/bin/etcd ] || fail "/usr/bin/etcd is missing after installing etcd-server"

if [ -x "$out/kube-apiserver" ]; then
	step "up to date: $out/kube-apiserver"
	exit 0
fi

# 2. The source, and 3. the binary (k8s.sh).
. "$root/scripts/kube/k8s.sh"
work=$out/work
k8s_source "$version" "$work"
step "compiling kube-apiserver $version with $(go env GOVERSION) ($jobs jobs; about 4 minutes on 2 cores)"
start=$(date +%s)
k8s_build "$version" kube-apiserver "$work/kube-apiserver"
took=$(($(date +%s) - start))

# 4. Out of the work tree; the binary last: its presence means the build
# is complete.
"$work/kube-apiserver" --version > "$work/version.txt" 2>&1 || fail "the built kube-apiserver does not run: $(cat "$work/version.txt")"
{
	echo "k8s.io/kubernetes $version from the Go module proxy, staging modules k8s.io/* $staging"
	cat "$work/version.txt"
	go version
	echo "built in ${took}s on $jobs cores"
	etcd --version 2>/dev/null | head -1
} > "$out/BUILD-INFO"
mv "$work/kube-apiserver" "$out/kube-apiserver"
# The source copy (about 100 MB) is not needed again: the Go build
# cache keeps what a rebuild can reuse.
rm -rf "$src"
step "done: $out/kube-apiserver ($(cat "$work/version.txt"), ${took}s)"
