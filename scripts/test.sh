#!/bin/sh
# Runs every test: unit tests, real sandboxes (native, gvisor, docker and wasm), the
# hostile-code suite and the RedCode corpus (in ../shared/attack-corpora
# when present). Needs root for the sandboxes; tests that need root skip
# without it.
set -eu
cd "$(dirname "$0")/.."
# runsc: the gvisor backend, which the functional and hostile suites run too.
extra="bubblewrap make runsc"
# docker.io: the docker backend; its tests start a dockerd of their own
# (no bridge, no iptables) and stop it when they end.
extra="$extra docker.io"
# iproute2: the network tests' hosts, in network namespaces of their own.
extra="$extra iproute2"
# docker-registry (the CNCF distribution): the image tests' registry.
extra="$extra docker-registry"
# The MCP and E2B tests drive the server with their official JavaScript SDKs.
command -v npm >/dev/null 2>&1 || extra="$extra nodejs npm"
# R code contexts: 4 packages, 26 MB to download, 42 MB installed, 13 s.
# Java's (default-jdk-headless: about 265 MB installed) are tested where a
# JDK is present; VIVARIUM_DEPS_EXTRA=default-jdk-headless installs one.
extra="$extra r-base-core"
VIVARIUM_DEPS_EXTRA="$extra ${VIVARIUM_DEPS_EXTRA:-}" scripts/deps.sh
# The SDK's exact version is pinned in test/mcp/package-lock.json.
[ -d test/mcp/node_modules/@modelcontextprotocol/sdk ] || (cd test/mcp && npm ci --no-audit --no-fund --loglevel=error)
# E2B's SDKs (e2b, @e2b/code-interpreter), pinned in test/e2b/package-lock.json.
[ -d test/e2b/node_modules/@e2b/code-interpreter ] || (cd test/e2b && npm ci --no-audit --no-fund --loglevel=error)
# The wasm backend's interpreter (make wasm: CPython built from Debian's
# sources, several minutes), kept outside the checkout under a name that
# changes with its build scripts (not with the Makefile, whose wasm rule
# only runs them), so that later runs on this machine reuse it. Its tests
# skip without it; here it is built so that they run.
if [ -z "${VIVARIUM_WASM_DIR:-}" ]; then
	key=$(cat scripts/wasm/* | sha256sum | cut -c1-12)
	VIVARIUM_WASM_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/vivarium/wasm-$key"
fi
export VIVARIUM_WASM_DIR
[ -f "$VIVARIUM_WASM_DIR/python.wasm" ] || make wasm WASM_DIR="$VIVARIUM_WASM_DIR"
# CRIU (make criu: 4.1.1 from Debian trixie's source, about 30 s), the
# native backend's checkpoint/restore, cached the same way. Where it
# cannot be built the run goes on and the checkpoint tests skip, saying so.
if [ -z "${VIVARIUM_CRIU_DIR:-}" ]; then
	key=$(cat scripts/criu/* | sha256sum | cut -c1-12)
	VIVARIUM_CRIU_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/vivarium/criu-$key"
fi
export VIVARIUM_CRIU_DIR
[ -x "$VIVARIUM_CRIU_DIR/criu" ] || make criu CRIU_DIR="$VIVARIUM_CRIU_DIR" ||
	echo "criu: could not be built; the checkpoint/restore tests will skip" >&2
# kube-apiserver (scripts/kube/build.sh: v1.33.4 from the Go module proxy,
# about 4 minutes) and Debian's etcd, for the Kubernetes tests, cached the
# same way; once they are built, those tests fail rather than skip.
scripts/kube/helm.sh && export VIVARIUM_REQUIRE_HELM=1 || echo "kube: helm could not be built; TestHelmChart will skip" >&2
scripts/kube/build.sh && export VIVARIUM_REQUIRE_KUBE=1 || echo "kube: kube-apiserver could not be built; the Kubernetes tests will skip" >&2
# The stand-in images of the repository's registry (scripts/registry.sh
# images: Debian bookworm and trixie by debootstrap, about 7 minutes),
# cached the same way; once they are built, the tests that pull them
# fail rather than skip.
scripts/registry.sh images && export VIVARIUM_REQUIRE_STANDINS=1 ||
	echo "registry: the stand-ins could not be built; the tests that pull them will skip" >&2
go vet ./...
unformatted=$(gofmt -l cmd internal test 2>/dev/null || true)
if [ -n "$unformatted" ]; then
	echo "gofmt needed:" $unformatted >&2
	exit 1
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo -E env PATH=$PATH"
$sudo go test -count=1 -timeout 60m "$@" ./...
