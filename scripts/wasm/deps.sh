#!/bin/sh
# Installs what scripts/wasm/build.sh needs, all from Debian: clang-14,
# lld-14, wasi-libc and clang's wasm32 runtime (the cross toolchain),
# python3.11 (the build Python a cross build of CPython needs), dpkg-dev
# (to unpack source packages), and deb-src lines beside the machine's deb
# lines so that `apt-get source` finds python3.11 and zlib.
set -eu
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

have_sources() { [ -n "$(apt-cache showsrc python3.11 2>/dev/null)" ]; }

updated=no
if ! have_sources; then
	tmp=$(mktemp)
	# One-line style: every "deb" line again as "deb-src".
	if [ -f /etc/apt/sources.list ]; then
		grep -E '^deb[[:space:]]' /etc/apt/sources.list | sed 's/^deb/deb-src/' >> "$tmp" || true
	fi
	if [ -s "$tmp" ]; then
		$sudo cp "$tmp" /etc/apt/sources.list.d/vivarium-deb-src.list
	fi
	# deb822 style: every stanza of Types "deb" again as "deb-src".
	: > "$tmp"
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		case "$f" in */vivarium-deb-src.sources) continue ;; esac
		sed -e 's/^Types:[[:space:]]*deb[[:space:]]*$/Types: deb-src/' "$f" | grep -v '^#' >> "$tmp"
		echo >> "$tmp"
	done
	if grep -q '^Types: deb-src' "$tmp"; then
		$sudo cp "$tmp" /etc/apt/sources.list.d/vivarium-deb-src.sources
	fi
	rm -f "$tmp"
	$sudo apt-get update -qq
	updated=yes
fi

need=""
for p in clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32 python3.11 dpkg-dev; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need="$need $p"
done
if [ -n "$need" ]; then
	[ $updated = yes ] || $sudo apt-get update -qq
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
fi
have_sources || { echo "wasm: apt-get source cannot find python3.11 (no deb-src lines?)" >&2; exit 1; }
