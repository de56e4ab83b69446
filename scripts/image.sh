#!/bin/sh
# Builds Vivarium's own image, for nodes and gateways alike, without a
# Docker daemon (`make image`):
#
#   scripts/image.sh [OUT]    default OUT: bin/vivarium-image.tar
#
# OUT is a `docker save` archive (which `skopeo copy docker-archive:`,
# `ctr images import`, `docker load` and `vivarium image import` read) of
# two layers, and its name, vivarium:<commit>, is printed on standard
# output:
#
#   the base   Debian bookworm by debootstrap, from the Debian archive
#              this host's apt uses (scripts/apt-sources.sh) or
#              VIVARIUM_DEBIAN_MIRROR: python3 with the modules sandboxes
#              preload (numpy, pandas, matplotlib) and scipy, e2fsprogs
#              (volumes), runsc (--backend gvisor), CRIU's libraries;
#              built once into ~/.cache/vivarium/imagebase-<hash of the
#              lines that build it> (about 1.3 GB; 3 to 10 minutes here)
#   vivarium   /usr/local/bin/vivarium (scripts/build.sh), and
#              /usr/local/bin/criu when `make criu` has built one
#              (VIVARIUM_CRIU, VIVARIUM_CRIU_DIR, else make criu's
#              directory for this checkout):
#              pause, resume, fork and snapshots; without it the image
#              says so and nodes answer those calls 501
#
# The image runs `vivarium` (its arguments: the chart's). Push it with
#   skopeo copy docker-archive:bin/vivarium-image.tar docker://REGISTRY/vivarium:TAG
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bin/vivarium-image.tar}
case $out in /*) ;; *) out=$PWD/$out ;; esac
step() { echo "image: $*" >&2; }
fail() { echo "image: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap)"
command -v debootstrap >/dev/null 2>&1 || {
	step "installing debootstrap with apt"
	apt-get update -qq && env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
		fail "apt-get install debootstrap failed"
}
. "$root/scripts/docker-save.sh"

# The base's key: the lines of this script that make it (from here to
# "# The vivarium layer."), so that a change of the rest reuses it.
key=$(sed -n '/^key=/,/^# The vivarium layer\./p' "$root/scripts/image.sh" | sha256sum | cut -c1-12)
base=${XDG_CACHE_HOME:-$HOME/.cache}/vivarium/imagebase-$key
mkdir -p "$base"
if [ ! -f "$base/base.tar" ]; then
	. "$root/scripts/apt-sources.sh"
	apt_debian_uri bookworm || fail "no Debian archive to debootstrap bookworm from"
	rfs=$base/rootfs
	rm -rf "$rfs"
	pkgs=python3,python3-numpy,python3-pandas,python3-matplotlib,python3-scipy,e2fsprogs,ca-certificates,runsc
	pkgs=$pkgs,libbsd0,libgnutls30,libnftables1,libprotobuf-c1,libnl-3-200,libnet1 # CRIU's
	step "debootstrap bookworm from $apt_uri with $pkgs (minutes)"
	start=$(date +%s)
	if ! debootstrap --variant=minbase --include="$pkgs" bookworm "$rfs" "$apt_uri" > "$base/debootstrap.log" 2>&1; then
		# debootstrap mounts /proc and /sys in the chroot; a failure may
		# leave them.
		for m in $(awk -v r="$rfs/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
			umount -l "$m" || true
		done
		tail -20 "$base/debootstrap.log" >&2
		fail "debootstrap failed (log: $base/debootstrap.log)"
	fi
	rm -rf "$rfs/var/lib/apt/lists"/* "$rfs/var/cache/apt"/*.bin "$rfs/var/cache/apt/archives"/*.deb "$rfs/var/log"/* "$rfs/dev"/*
	mkdir -p "$rfs/var/lib/vivarium" "$rfs/etc/vivarium" "$rfs/usr/local/bin"
	tar --numeric-owner -C "$rfs" -cf "$base/base.tar.tmp" .
	rm -rf "$rfs"
	mv "$base/base.tar.tmp" "$base/base.tar"
	step "base: $(du -m "$base/base.tar" | cut -f1) MiB in $(($(date +%s) - start))s"
fi

# The vivarium layer.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root/usr/local/bin"
step "building vivarium"
"$root/scripts/build.sh" "$work/root/usr/local/bin/vivarium"
criu=${VIVARIUM_CRIU:-}
if [ -z "$criu" ] && [ -n "${VIVARIUM_CRIU_DIR:-}" ]; then
	criu=$VIVARIUM_CRIU_DIR/criu
fi
if [ -z "$criu" ]; then
	# Where make criu puts the build of this checkout's scripts/criu.
	criu=${XDG_CACHE_HOME:-$HOME/.cache}/vivarium/criu-$(cat "$root"/scripts/criu/* | sha256sum | cut -c1-12)/criu
fi
if [ -n "$criu" ] && [ -x "$criu" ]; then
	cp "$criu" "$work/root/usr/local/bin/criu"
	step "with $criu"
else
	step "no CRIU (make criu builds one): the image's nodes cannot pause, fork or snapshot sandboxes"
fi
tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/root" -cf "$work/vivarium.tar" usr
rev=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo dev)
git -C "$root" diff --quiet HEAD 2>/dev/null || rev=$rev-dirty
name=vivarium:$rev
path='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'
mkdir -p "$(dirname "$out")"
docker_save "$name" "{\"Env\":[$path],\"Entrypoint\":[\"/usr/local/bin/vivarium\"],\"Labels\":{\"org.opencontainers.image.revision\":\"$rev\"}}" \
	"$out" "$base/base.tar" "$work/vivarium.tar"
step "$out: $name, $(du -m "$out" | cut -f1) MiB"
echo "$name"
