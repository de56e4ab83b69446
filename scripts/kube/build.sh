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
# the hash of the version and of this script alone, so that a change of
# it builds anew and an unchanged one reuses the binary):
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
	key=$( (echo "$version"; cat "$root/scripts/kube/build.sh") | sha256sum | cut -c1-12)
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

command -v go >/dev/null 2>&1 || fail "go is not on PATH"
case $version in
v1.*.*) ;;
*) fail "VIVARIUM_KUBE_VERSION must look like v1.33.4, not $version" ;;
esac
# The staging modules are published as v0.<minor>.<patch> of the release.
staging=v0.${version#v1.}
minor=${version#v1.}
minor=${minor%%.*}
export GOWORK=off GOTOOLCHAIN=local
work=$out/work
mkdir -p "$work"

# 2. The source: the module as the proxy serves it (checked against
# sum.golang.org by go mod download), copied out of the read-only module
# cache. Its vendor/ and go.work are for building inside the kubernetes
# repository, with staging/ present; the proxy's zip has no staging/.
src=$work/src
if [ ! -f "$src/.vivarium-ready" ]; then
	step "downloading k8s.io/kubernetes@$version from $(go env GOPROXY | cut -d, -f1)"
	dir=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
	[ -n "$dir" ] && [ -f "$dir/go.mod" ] || fail "go mod download k8s.io/kubernetes@$version gave no module directory"
	rm -rf "$src"
	cp -r "$dir" "$src"
	chmod -R u+w "$src"
	rm -rf "$src/vendor" "$src/go.work" "$src/go.work.sum"
	# 3. Every "k8s.io/x => ./staging/src/k8s.io/x" becomes
	# "k8s.io/x => k8s.io/x $staging".
	mods=$(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*|\1|p' "$src/go.mod")
	[ -n "$mods" ] || fail "no ./staging replace directives in k8s.io/kubernetes@$version's go.mod"
	edits=""
	for m in $mods; do
		edits="$edits -replace=$m=$m@$staging"
	done
	(cd "$src" && go mod edit $edits)
	step "replaced $(echo $mods | wc -w) staging modules by their published $staging"
	touch "$src/.vivarium-ready"
fi

# 4. The binary, with the version stamped as the release's own build
# would (hack/lib/version.sh), so that /version says $version.
jobs=$(nproc 2>/dev/null || echo 2)
step "compiling kube-apiserver $version with $(go env GOVERSION) ($jobs jobs; about 4 minutes on 2 cores)"
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags="$ldflags -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
start=$(date +%s)
(cd "$src" && GOFLAGS="${GOFLAGS:-} -mod=mod" go build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$work/kube-apiserver" ./cmd/kube-apiserver > "$work/build.log" 2>&1) ||
	{ tail -40 "$work/build.log" >&2; fail "go build ./cmd/kube-apiserver failed (log: $work/build.log)"; }
took=$(($(date +%s) - start))

# 5. Out of the work tree; the binary last: its presence means the build
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
