# Sourced by scripts that need Debian's archive (scripts/criu/deps.sh,
# scripts/kube/node.sh): where this host's apt gets Debian from, so that a
# host behind a mirror or a proxy of its own uses it, and no script names
# a host of its own.
#
# The host's sources are read as apt reads them: the one-line style
# (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list) and deb822
# (/etc/apt/sources.list.d/*.sources). VIVARIUM_DEBIAN_MIRROR, when set,
# is the archive's URI instead. VIVARIUM_APT_ETC (default /etc/apt) and
# VIVARIUM_OS_RELEASE (default /etc/os-release) are for
# scripts/apt-sources_test.sh.

apt_etc=${VIVARIUM_APT_ETC:-/etc/apt}

# apt_codename prints this host's Debian release (bookworm).
apt_codename() {
	(. "${VIVARIUM_OS_RELEASE:-/etc/os-release}" && echo "${VERSION_CODENAME:-}")
}

# apt_entry TYPE SUITE finds the host's first enabled entry of TYPE (deb or
# deb-src) for SUITE, exactly (bookworm, not bookworm-updates), and sets
# apt_uri and apt_signed_by (empty when the entry names no keyring file);
# it fails when there is none.
apt_entry() {
	apt_uri="" apt_signed_by=""
	_apt_found=$(
		{
			for _apt_f in "$apt_etc/sources.list" "$apt_etc"/sources.list.d/*.list; do
				[ -f "$_apt_f" ] && awk -v type="$1" -v suite="$2" '
					{ sub(/#.*/, "") }
					$1 != type { next }
					{
						i = 2; signed = ""
						if ($2 ~ /^\[/) {
							# [opt=value opt=value]: the options, up to "]".
							for (; i <= NF; i++) {
								o = $i; gsub(/[][]/, "", o)
								if (o ~ /^signed-by=/) signed = substr(o, 11)
								if ($i ~ /\]$/) break
							}
							i++
						}
						if ($(i + 1) == suite) { print $i "\t" signed; exit }
					}' "$_apt_f"
			done
			for _apt_f in "$apt_etc"/sources.list.d/*.sources; do
				# deb822: stanzas apart by blank lines, fields "Name: value",
				# a line that starts with a space continuing the field before.
				[ -f "$_apt_f" ] && awk -v type="$1" -v suite="$2" '
					function words(s, w, n, i) { n = split(s, w, /[ \t]+/); for (i = 1; i <= n; i++) if (w[i] != "") return w[i]; return "" }
					function has(s, x, w, n, i) { n = split(s, w, /[ \t]+/); for (i = 1; i <= n; i++) if (w[i] == x) return 1; return 0 }
					function stanza() {
						if (has(v["types"], type) && has(v["suites"], suite) && tolower(v["enabled"]) !~ /^[ \t]*no/ && !done) {
							print words(v["uris"]) "\t" (multi["signed-by"] ? "" : words(v["signed-by"]))
							done = 1
						}
						split("", v); split("", multi); key = ""
					}
					/^#/ { next }
					/^[ \t]*$/ { stanza(); next }
					/^[ \t]/ { if (key != "") multi[key] = 1; next }
					{
						key = tolower(substr($0, 1, index($0, ":") - 1))
						v[key] = substr($0, index($0, ":") + 1)
					}
					END { stanza() }' "$_apt_f"
			done
		} | head -1
	)
	[ -n "$_apt_found" ] || return 1
	apt_uri=${_apt_found%%"	"*}
	apt_signed_by=${_apt_found#*"	"}
}

# apt_debian_uri SUITE sets apt_uri and apt_signed_by to where this host
# gets Debian's SUITE from: VIVARIUM_DEBIAN_MIRROR; else its own deb entry
# for SUITE; else, SUITE not being configured, the URI of its entry for
# its own release (another suite of the same archive), which it says on
# stderr. It fails, saying what to set, when there is none.
apt_debian_uri() {
	if [ -n "${VIVARIUM_DEBIAN_MIRROR:-}" ]; then
		apt_uri=$VIVARIUM_DEBIAN_MIRROR apt_signed_by=""
		return 0
	fi
	apt_entry deb "$1" && return 0
	_apt_own=$(apt_codename)
	[ "$_apt_own" != "$1" ] || _apt_own=""
	if [ -n "$_apt_own" ] && apt_entry deb "$_apt_own"; then
		echo "$1 is not in this host's apt sources: using the archive of its own $_apt_own, $apt_uri, for it" >&2
		return 0
	fi
	echo "no Debian archive for $1${_apt_own:+ or $_apt_own} in this host's apt sources ($apt_etc): set VIVARIUM_DEBIAN_MIRROR to its URI" >&2
	return 1
}

# apt_keyring prints the keyring a deb822 stanza of Debian's archive names:
# the host's entry's own, else Debian's archive keyring where installed
# (nothing: apt's trusted keys).
apt_keyring() {
	if [ -n "$apt_signed_by" ]; then
		echo "$apt_signed_by"
	elif [ -f /usr/share/keyrings/debian-archive-keyring.gpg ]; then
		echo /usr/share/keyrings/debian-archive-keyring.gpg
	fi
}

# apt_src_stanza SUITE prints a deb822 stanza for the sources of Debian's
# SUITE (Types: deb-src, component main) from the archive apt_debian_uri
# finds for it.
apt_src_stanza() {
	apt_debian_uri "$1" || return 1
	printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\n' "$apt_uri" "$1"
	_apt_key=$(apt_keyring)
	[ -z "$_apt_key" ] || echo "Signed-By: $_apt_key"
}
