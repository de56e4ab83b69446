#!/bin/sh
# Tests scripts/apt-sources.sh against apt configurations made up here:
# one-line and deb822 sources, a mirror, options, disabled stanzas, a
# suite derived from the host's own. Needs nothing but sh and awk:
#   scripts/apt-sources_test.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export VIVARIUM_APT_ETC="$tmp/apt" VIVARIUM_OS_RELEASE="$tmp/os-release"
unset VIVARIUM_DEBIAN_MIRROR
. "$here/apt-sources.sh"
failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }

# host CODENAME: a fresh apt configuration of a host of that release.
host() {
	rm -rf "$tmp/apt"
	mkdir -p "$tmp/apt/sources.list.d"
	echo "VERSION_CODENAME=$1" > "$tmp/os-release"
}

# want WHAT GOT EXPECTED
want() { [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"; }

# A deb822 host behind a mirror; the security archive first, a
# disabled stanza, a third party's.
host bookworm
cat > "$tmp/apt/sources.list.d/debian.sources" <<'SRC'
# The host's own.
Types: deb
URIs: http://security.mirror.test/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://off.mirror.test/debian
Suites: bookworm
Components: main
Enabled: no

types: deb deb-src
URIs: http://mirror.test/debian/ http://second.mirror.test/debian
Suites: bookworm-updates bookworm
Components: main contrib
Signed-By: /usr/share/keyrings/mirror.gpg
SRC
cat > "$tmp/apt/sources.list.d/other.sources" <<'SRC'
Types: deb
URIs: https://vendor.test/apt
Suites: nodistro
Components: main
SRC
apt_entry deb bookworm || fail "deb822: no bookworm entry"
want "deb822 URI" "$apt_uri" "http://mirror.test/debian/"
want "deb822 Signed-By" "$apt_signed_by" "/usr/share/keyrings/mirror.gpg"
apt_entry deb-src bookworm || fail "deb822: no bookworm deb-src entry"
apt_entry deb bookworm-security || fail "deb822: no bookworm-security entry"
want "deb822 security URI" "$apt_uri" "http://security.mirror.test/debian-security"
apt_entry deb trixie && fail "deb822: a trixie entry where there is none"

# trixie, not configured: derived from the mirror of bookworm, and said.
stanza=$(apt_src_stanza trixie 2> "$tmp/said") || fail "derive trixie: failed"
want "derived stanza" "$stanza" "$(printf 'Types: deb-src\nURIs: http://mirror.test/debian/\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/mirror.gpg')"
grep -q "using the archive of its own bookworm, http://mirror.test/debian/" "$tmp/said" || fail "derive trixie: not said: $(cat "$tmp/said")"

# The operator's mirror wins.
VIVARIUM_DEBIAN_MIRROR=http://operator.test/debian apt_debian_uri trixie 2> "$tmp/said" || fail "VIVARIUM_DEBIAN_MIRROR: failed"
want "VIVARIUM_DEBIAN_MIRROR" "$apt_uri" "http://operator.test/debian"

# One-line style, with options and comments; a trixie host, whose own
# entry is used as it is.
host trixie
cat > "$tmp/apt/sources.list" <<'SRC'
# deb http://commented.test/debian trixie main
deb-src http://src-only.test/debian trixie main
deb [ arch=amd64 signed-by=/etc/apt/keyrings/m.gpg ] http://m1.test/debian trixie main # a comment
SRC
echo 'deb [signed-by=/k.gpg] http://m2.test/debian bookworm main' > "$tmp/apt/sources.list.d/old.list"
apt_entry deb trixie || fail "one-line: no trixie entry"
want "one-line URI" "$apt_uri" "http://m1.test/debian"
want "one-line signed-by" "$apt_signed_by" "/etc/apt/keyrings/m.gpg"
apt_entry deb-src trixie || fail "one-line: no trixie deb-src entry"
want "one-line deb-src URI" "$apt_uri" "http://src-only.test/debian"
apt_debian_uri bookworm 2> "$tmp/said" || fail "one-line bookworm: failed"
want "one-line bookworm URI" "$apt_uri" "http://m2.test/debian"
[ -s "$tmp/said" ] && fail "bookworm is configured, yet derived: $(cat "$tmp/said")"
apt_debian_uri trixie 2> "$tmp/said"
want "own suite URI" "$apt_uri" "http://m1.test/debian"

# A key inline in the stanza: no keyring file to name.
host bookworm
cat > "$tmp/apt/sources.list.d/inline.sources" <<'SRC'
Types: deb
URIs: http://inline.test/debian
Suites: bookworm
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBF...
 -----END PGP PUBLIC KEY BLOCK-----
SRC
apt_entry deb bookworm || fail "inline key: no entry"
want "inline key URI" "$apt_uri" "http://inline.test/debian"
want "inline key Signed-By" "$apt_signed_by" ""

# Nothing of Debian: a failure that says what to set.
host bookworm
if apt_debian_uri trixie 2> "$tmp/said"; then
	fail "no sources: found $apt_uri"
fi
grep -q VIVARIUM_DEBIAN_MIRROR "$tmp/said" || fail "no sources: does not say VIVARIUM_DEBIAN_MIRROR: $(cat "$tmp/said")"

[ $failed = 0 ] && echo "apt-sources: ok"
exit $failed
