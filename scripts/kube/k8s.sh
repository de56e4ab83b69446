# Sourced by build.sh (kube-apiserver) and node.sh (kubelet, controller
# manager, scheduler): Kubernetes' commands built from the Go module proxy.
# k8s.io/kubernetes at a release is downloaded, copied out of the read-only
# module cache, and its ./staging/... replace directives are pointed at
# the published k8s.io/* modules of the release (v0.<minor>.<patch>), built
# with the machine's Go (GOTOOLCHAIN=local: no other toolchain is
# fetched). The caller defines step and fail, and hashes this file into
# its cache key with its own.

# k8s_source VERSION WORK readies WORK/src and sets src, staging, minor and
# jobs (sh has no locals).
k8s_source() {
	command -v go >/dev/null 2>&1 || fail "go is not on PATH"
	case $1 in
	v1.*.*) ;;
	*) fail "VIVARIUM_KUBE_VERSION must look like v1.33.4, not $1" ;;
	esac
	staging=v0.${1#v1.}
	minor=${1#v1.}
	minor=${minor%%.*}
	jobs=$(nproc 2>/dev/null || echo 2)
	export GOWORK=off GOTOOLCHAIN=local
	src=$2/src
	mkdir -p "$2"
	[ -f "$src/.vivarium-ready" ] && return 0
	# The module as the proxy serves it (checked against sum.golang.org
	# by go mod download). Its vendor/ and go.work are for building
	# inside the kubernetes repository, with staging/ present; the
	# proxy's zip has no staging/.
	step "downloading k8s.io/kubernetes@$1 from $(go env GOPROXY | cut -d, -f1)"
	dir=$(cd "$2" && go mod download -json "k8s.io/kubernetes@$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
	[ -n "$dir" ] && [ -f "$dir/go.mod" ] || fail "go mod download k8s.io/kubernetes@$1 gave no module directory"
	rm -rf "$src"
	cp -r "$dir" "$src"
	chmod -R u+w "$src"
	rm -rf "$src/vendor" "$src/go.work" "$src/go.work.sum"
	# Every "k8s.io/x => ./staging/src/k8s.io/x" becomes
	# "k8s.io/x => k8s.io/x $staging".
	mods=$(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*|\1|p' "$src/go.mod")
	[ -n "$mods" ] || fail "no ./staging replace directives in k8s.io/kubernetes@$1's go.mod"
	edits=""
	for m in $mods; do
		edits="$edits -replace=$m=$m@$staging"
	done
	(cd "$src" && go mod edit $edits)
	step "replaced $(echo $mods | wc -w) staging modules by their published $staging"
	touch "$src/.vivarium-ready"
}

# k8s_build VERSION CMD OUT builds ./cmd/CMD of src into OUT (its log:
# OUT.log), the version stamped as the release's own build would
# (hack/lib/version.sh), so that --version and /version say VERSION.
k8s_build() {
	ldflags="-s -w"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags="$ldflags -X $p.gitVersion=$1 -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
	done
	(cd "$src" && GOFLAGS="${GOFLAGS:-} -mod=mod" go build -p "$jobs" -trimpath -ldflags "$ldflags" -o "$3" "./cmd/$2" > "$3.log" 2>&1) ||
		{ tail -40 "$3.log" >&2; fail "go build ./cmd/$2 failed (log: $3.log)"; }
}
