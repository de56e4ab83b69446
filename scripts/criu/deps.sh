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
#
# The trixie line comes from the machine's own apt sources
# (scripts/apt-sources.sh): VIVARIUM_DEBIAN_MIRROR if set, else the
# archive of its trixie entry if it has one, else the archive it uses for
# its own release with the suite trixie (a mirror of Debian's archive
# serves every suite), which it says. A machine that already has a trixie
# deb-src entry gets none added.
set -eu
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
. "$(dirname "$0")/../apt-sources.sh"

step() { echo "criu: $*" >&2; }

have_source() { apt-cache showsrc criu 2>/dev/null | grep -q '^Version: 4\.'; }

updated=no
if ! have_source; then
	if apt_entry deb-src trixie; then
		step "the trixie deb-src entry ($apt_uri) is there: updating apt's lists"
	else
		tmp=$(mktemp)
		{
			echo "# Added by Vivarium's scripts/criu/deps.sh: the criu source package of"
			echo "# Debian trixie, built by scripts/criu/build.sh. Sources only: no trixie"
			echo "# binary package comes from here."
			apt_src_stanza trixie
		} > "$tmp" || { rm -f "$tmp"; exit 1; }
		step "adding a deb-src entry for trixie (sources only) from $(sed -n 's/^URIs: //p' "$tmp")"
		$sudo cp "$tmp" "$apt_etc/sources.list.d/vivarium-trixie-src.sources"
		rm -f "$tmp"
	fi
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
