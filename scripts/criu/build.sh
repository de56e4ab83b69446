#!/bin/sh
# Builds CRIU (checkpoint/restore in userspace), which the native backend
# uses to pause and resume sandboxes, from Debian trixie's criu source
# package (4.1.1; bookworm's 3.17 fails `criu check` on current kernels),
# with build dependencies from the machine's own Debian release
# (scripts/criu/deps.sh installs them and the trixie deb-src entry).
# Nothing is downloaded from anywhere but Debian's archive.
#
# Output, in $VIVARIUM_CRIU_DIR (default ~/.cache/vivarium/criu-<hash>,
# the hash of scripts/criu/*, so that a change of these scripts builds
# anew and an unchanged one reuses the binary):
#   criu        the binary (`make criu` only: no plugins, no docs, no libcriu)
#   BUILD-INFO  what it was built from
#
# Steps: fetch and unpack the source package (Debian's patches applied),
# apply scripts/criu/*.patch (rlimits-from-proc.patch: a dump reads a
# task's limits from /proc/PID/limits where prlimit() is refused, as it is
# to a root without CAP_SYS_RESOURCE, like this project's machines), `make criu`, copy the binary out, run `criu --version`. The work tree
# stays in $VIVARIUM_CRIU_DIR/work, so a second run only redoes what
# changed, and a run with the binary in place does nothing.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "${VIVARIUM_CRIU_DIR:-}" ]; then
	key=$(cat "$root"/scripts/criu/* | sha256sum | cut -c1-12)
	VIVARIUM_CRIU_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/vivarium/criu-$key"
fi
out=$VIVARIUM_CRIU_DIR
version=4.1.1
step() { echo "criu: $*" >&2; }

if [ -x "$out/criu" ]; then
	step "up to date: $out/criu"
	exit 0
fi
work=$out/work
jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p "$work"
cd "$work"

# 1. The source, from trixie's deb-src entry (see deps.sh): the source
# package with Debian's patches when the mirror serves it whole, else the
# upstream tarball alone (its .orig.tar.xz), checked against the SHA-256
# that the signed Sources index gives for it. Some mirrors serve the
# tarball but not the .dsc and the Debian diff of a release.
src=$work/src-criu
if [ ! -d "$src" ]; then
	v=$(apt-cache showsrc criu | awk '/^Version:/ {print $2}' | grep "^$version-" | sort -r -V | head -1)
	[ -n "$v" ] || { echo "criu: no criu $version source package in apt's lists (no trixie deb-src entry? run scripts/criu/deps.sh)" >&2; exit 1; }
	step "fetching the criu $v source package"
	rm -rf dl "$src.tmp" && mkdir dl
	if (cd dl && apt-get source -qq --download-only "criu=$v" >/dev/null 2>&1); then
		dpkg-source -x dl/*.dsc "$src.tmp" >/dev/null
		echo "criu $v (Debian source package, Debian's patches applied)" > "$src.tmp/.vivarium-version"
	else
		tarball=criu_$version.orig.tar.xz
		[ -f "dl/$tarball" ] || { echo "criu: cannot fetch the criu $v source package nor its $tarball" >&2; exit 1; }
		want=$(apt-cache showsrc criu | awk -v v="$v" -v f="$tarball" '
			/^Package:/ {ver=""} /^Version:/ {ver=$2}
			/^Checksums-Sha256:/ {on=1; next} /^[^ ]/ {on=0}
			on && ver == v && $3 == f {print $1; exit}')
		got=$(sha256sum "dl/$tarball" | cut -d' ' -f1)
		[ -n "$want" ] && [ "$want" = "$got" ] || { echo "criu: $tarball does not match the SHA-256 of the Sources index" >&2; exit 1; }
		step "only the upstream tarball is served; its SHA-256 matches the Sources index"
		mkdir "$src.tmp"
		tar xJf "dl/$tarball" -C "$src.tmp" --strip-components=1
		echo "criu $version (upstream tarball of Debian's criu $v, SHA-256 $got, without Debian's patches)" > "$src.tmp/.vivarium-version"
	fi
	# Vivarium's patches (scripts/criu/*.patch), each named in BUILD-INFO.
	for pf in "$root"/scripts/criu/*.patch; do
		[ -f "$pf" ] || continue
		step "applying $(basename "$pf")"
		patch -s -p1 -d "$src.tmp" < "$pf"
		echo "patched: $(basename "$pf")" >> "$src.tmp/.vivarium-version"
	done
	mv "$src.tmp" "$src"
fi

# 2. The binary alone. CRIU's Makefile builds its own libraries (compel,
# the parasite, the protobuf descriptors) as part of `make criu`.
step "compiling criu ($jobs jobs)"
(cd "$src" && make -j"$jobs" criu > "$work/make.log" 2>&1) || { tail -40 "$work/make.log" >&2; exit 1; }

# 3. Out of the work tree; the binary last: its presence means the build
# is complete.
step "installing $out/criu"
"$src/criu/criu" --version > "$work/version.txt"
{
	cat "$src/.vivarium-version"
	cat "$work/version.txt"
	gcc --version | head -1
} > "$out/BUILD-INFO"
cp "$src/criu/criu" "$out/criu.tmp"
mv "$out/criu.tmp" "$out/criu"
step "done: $out/criu ($(head -1 "$work/version.txt"))"
