#!/bin/sh
# Builds what a real single-node Kubernetes cluster needs besides
# kube-apiserver and etcd (scripts/kube/build.sh), for the opt-in
# TestSingleNodeCluster (test/kube/node_test.go, VIVARIUM_KUBE_NODE=1):
#
#   kubelet, kube-controller-manager, kube-scheduler
#       from k8s.io/kubernetes at $version through the Go module proxy,
#       its ./staging replace directives pointed at the published k8s.io/*
#       modules, as build.sh does for kube-apiserver;
#   pause.tar
#       the pod sandbox image, as `docker save` writes one (manifest.json,
#       a config, one layer): a static C program that waits for a signal,
#       named localhost/vivarium-test/pause:1 (registry.k8s.io/pause
#       cannot be pulled here);
#
# (Vivarium's own image the test builds with scripts/image.sh, `make
# image`, which keeps its base in a cache of its own.)
#
# and installs, with apt, containerd and runc (the container runtime, run
# by the test with its own config, root, state and socket: the system's
# containerd is left alone), containernetworking-plugins (bridge,
# host-local, loopback, portmap).
#
# Output, in $VIVARIUM_KUBE_NODE_DIR (default
# ~/.cache/vivarium/kubenode-<hash>, the hash of the version, of this
# script, of k8s.sh and of scripts/docker-save.sh: a change of them
# builds anew, an unchanged one
# reuses what it built). Each piece is built once; its file appears last, when complete.
# BUILD-INFO says what was built, from what, and how long each took.
# Nothing is downloaded from anywhere but the Go module proxy (go env
# GOPROXY) and Debian's archive (the host's apt sources).
#
# `node.sh binaries` or `node.sh images` builds one half only. Measured
# here (2 cores, Go's build cache warm from build.sh's kube-apiserver):
# the three binaries in about 2 minutes.
set -eu
what=${1:-all}
case $what in
all | binaries | images) ;;
*) echo "usage: $0 [all|binaries|images]" >&2; exit 2 ;;
esac
version=${VIVARIUM_KUBE_VERSION:-v1.33.4}
suite=bookworm
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "${VIVARIUM_KUBE_NODE_DIR:-}" ]; then
	key=$( (echo "$version"; cat "$root/scripts/kube/node.sh" "$root/scripts/kube/k8s.sh" "$root/scripts/docker-save.sh") | sha256sum | cut -c1-12)
	VIVARIUM_KUBE_NODE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/vivarium/kubenode-$key"
fi
out=$VIVARIUM_KUBE_NODE_DIR
step() { echo "kube-node: $*" >&2; }
fail() { echo "kube-node: $*" >&2; exit 1; }
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
mkdir -p "$out"
info() { echo "$*" >> "$out/BUILD-INFO"; }

# 1. Debian's packages. containerd's package may start the system's
# containerd; the test runs its own and leaves that one as it found it.
need=""
command -v containerd >/dev/null 2>&1 || need="$need containerd"
command -v runc >/dev/null 2>&1 || need="$need runc"
[ -x /usr/lib/cni/bridge ] || need="$need containernetworking-plugins"
command -v iptables >/dev/null 2>&1 || need="$need iptables"
command -v gcc >/dev/null 2>&1 || need="$need gcc libc6-dev"
if [ -n "$need" ]; then
	step "installing$need with apt"
	$sudo apt-get update -qq
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null ||
		fail "apt-get install$need failed"
fi

# 2. The Kubernetes binaries, built as build.sh builds kube-apiserver.
bins="kubelet kube-controller-manager kube-scheduler"
missing=""
[ "$what" = images ] && bins=""
for b in $bins; do
	[ -x "$out/$b" ] || missing="$missing $b"
done
if [ -n "$missing" ]; then
	. "$root/scripts/kube/k8s.sh"
	work=$out/work
	k8s_source "$version" "$work"
	for b in $missing; do
		step "compiling $b $version with $(go env GOVERSION) ($jobs jobs)"
		start=$(date +%s)
		k8s_build "$version" "$b" "$work/$b"
		took=$(($(date +%s) - start))
		said=$("$work/$b" --version 2>&1) || fail "the built $b does not run: $said"
		info "$b: $said, k8s.io/kubernetes $version (staging $staging), $(go env GOVERSION), built in ${took}s on $jobs cores"
		mv "$work/$b" "$out/$b"
		step "done: $out/$b (${took}s)"
	done
	rm -rf "$src"
fi

# Images as `docker save` writes them: docker_save.
. "$root/scripts/docker-save.sh"

# 3. The pause image: a static program that sleeps until SIGTERM or
# SIGINT (the sandbox's PID 1 holds its namespaces, nothing more).
if [ "$what" != binaries ] && [ ! -f "$out/pause.tar" ]; then
	step "building the pause image"
	d=$(mktemp -d "$out/pause.XXXXXX")
	cat > "$d/pause.c" <<'C'
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { _exit(0); }
static void reap(int sig) { while (waitpid(-1, 0, WNOHANG) > 0) ; }
int main(void) {
	signal(SIGINT, quit);
	signal(SIGTERM, quit);
	signal(SIGCHLD, reap);
	for (;;) pause();
}
C
	gcc -static -Os -s -o "$d/pause" "$d/pause.c" || fail "gcc -static pause.c failed (libc6-dev installed?)"
	mkdir -p "$d/root"
	cp "$d/pause" "$d/root/pause"
	tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$d/root" -cf "$d/layer.tar" pause
	docker_save localhost/vivarium-test/pause:1 '{"Entrypoint":["/pause"]}' "$out/pause.tar" "$d/layer.tar"
	rm -rf "$d"
	info "pause.tar: localhost/vivarium-test/pause:1, a static C program ($(gcc --version | head -1))"
fi

step "up to date: $out"
