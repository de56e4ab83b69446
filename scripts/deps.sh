#!/bin/sh
# Installs what Vivarium's sandboxes and tests need from Debian's archive:
# the Python inside sandboxes and its data-science stack, and the tools
# programs in sandboxes expect of a small Linux machine (attr: setfattr and
# getfattr, which E2B's tests use on files' metadata). Does nothing when
# everything is present already.
set -eu

packages="python3 python3-pip python3-requests python3-numpy python3-pandas python3-matplotlib python3-scipy python3-nbformat fonts-dejavu-core attr"
[ "${VIVARIUM_DEPS_EXTRA:-}" ] && packages="$packages $VIVARIUM_DEPS_EXTRA"

missing=""
for p in $packages; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "vivarium: installing$missing" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
