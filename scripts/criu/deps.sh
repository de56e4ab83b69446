#!/bin/sh
# Installs what scripts/criu/build.sh needs, and what criu runs: CRIU's
# build dependencies from the machine's own Debian release (bookworm),
# dpkg-dev to unpack source packages, and a deb-src line for Debian
# trixie, whose criu source package (4.1.1) is the one built: bookworm's
# criu 3.17 fails `criu check` on current kernels (the vDSO layout). Only a
# deb-src line is added for trixie, never a deb line: no trixie binary
# package is installed and nothing is upgraded. At run time criu calls ip
# (iproute2) and iptables-save/-restore (iptables) to save and restore a
# sandbox's network namespace.
set -eu
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

step() { echo "criu: $*" >&2; }

have_source() { apt-cache showsrc criu 2>/dev/null | grep -q '^Version: 4\.'; }

updated=no
if ! have_source; then
	step "adding a deb-src entry for trixie (sources only)"
	tmp=$(mktemp)
	cat > "$tmp" <<'SRC'
# Added by Vivarium's scripts/criu/deps.sh: the criu source package of
# Debian trixie, built by scripts/criu/build.sh. Sources only: no trixie
# binary package comes from here.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
	$sudo cp "$tmp" /etc/apt/sources.list.d/vivarium-trixie-src.sources
	rm -f "$tmp"
	$sudo apt-get update -qq
	updated=yes
fi

need=""
for p in build-essential pkg-config dpkg-dev patch python3 \
	libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler \
	libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev \
	libnftables-dev uuid-dev iproute2 iptables; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need="$need $p"
done
if [ -n "$need" ]; then
	step "installing build dependencies:$need"
	[ $updated = yes ] || $sudo apt-get update -qq
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
fi
have_source || { echo "criu: apt-get source cannot find criu 4.x (the trixie deb-src entry is missing or unreachable)" >&2; exit 1; }
