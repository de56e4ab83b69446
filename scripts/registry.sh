#!/bin/sh
# A real OCI registry on this host, for tests and trials: Debian's
# docker-registry (the CNCF distribution) on a free port, seeded with
# stand-ins for the images E2B's template tests and the docs name.
#
#   scripts/registry.sh start DIR [--tls] [--auth USER:PASSWORD]
#       starts a registry whose storage, config and log are in DIR,
#       pushes the stand-ins into it, and prints its address (HOST:PORT)
#       on standard output. --tls serves HTTPS with a certificate made
#       for it (its CA: DIR/ca.crt); --auth asks for basic auth (htpasswd
#       with bcrypt). Without --tls it is plain HTTP: name it with
#       `vivarium image pull --insecure-registry HOST:PORT`.
#   scripts/registry.sh stop DIR
#       stops it, and returns once it has exited (its storage stays in
#       DIR).
#   scripts/registry.sh images
#       builds the stand-ins only.
#   scripts/registry.sh built
#       exits 0 when the stand-ins are built (in the cache below), 1
#       when they are not, saying where they would be.
#
# The stand-ins cannot be the real images (no registry of the internet
# is reachable here): they are Debian by debootstrap, from the Debian
# archive this host's apt uses (scripts/apt-sources.sh; trixie from the
# same archive as bookworm when the host names no trixie) or
# VIVARIUM_DEBIAN_MIRROR, each labelled as a stand-in
# (org.opencontainers.image.description), under the names
#
#   library/ubuntu:22.04, library/ubuntu:24.04   Debian bookworm minbase
#   library/python:3                           bookworm minbase with python3 (3.11), pip and venv
#   library/python:3.13                        Debian trixie minbase with python3 (3.13), pip and venv
#   e2bdev/base:latest                         bookworm's python:3, with a user "user" (uid 1000)
#
# so that `--registry-mirror docker.io=HOST:PORT` serves `ubuntu:22.04`.
# They are built once into $VIVARIUM_STANDINS_DIR (default
# ~/.cache/vivarium/standins-<hash of the part of this script that
# builds them, and of docker-save.sh>) as `docker save` archives: about
# 7 minutes, 130 MB of downloads and 770 MB kept.
# Installs with apt what it lacks: docker-registry, skopeo, debootstrap,
# openssl, curl.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
step() { echo "registry: $*" >&2; }
fail() { echo "registry: $*" >&2; exit 1; }
usage() {
	echo "usage: $0 start DIR [--tls] [--auth USER:PASSWORD] | stop DIR | images | built" >&2
	exit 2
}
[ $# -ge 1 ] || usage
cmd=$1
shift
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap)"

if [ "$cmd" = stop ]; then
	[ $# -eq 1 ] || usage
	if [ -f "$1/pid" ]; then
		pid=$(cat "$1/pid")
		kill "$pid" 2>/dev/null || true
		# Gone (or a zombie) before stop returns, so that DIR may be
		# removed then.
		i=0
		while [ -r "/proc/$pid/stat" ] && ! grep -q ') [ZX] ' "/proc/$pid/stat" 2>/dev/null; do
			i=$((i + 1))
			[ $i -lt 100 ] || fail "the registry (pid $pid) did not exit"
			sleep 0.1
		done
	fi
	rm -f "$1/pid"
	exit 0
fi

# The stand-ins, each a `docker save` archive of one layer, named by
# what builds them: the lines between "stand-ins: begin" and "stand-ins:
# end" below, and docker-save.sh (not the registry's start, which may
# change without them being built again).
if [ -z "${VIVARIUM_STANDINS_DIR:-}" ]; then
	key=$({
		sed -n '/^# stand-ins: begin/,/^# stand-ins: end/p' "$root/scripts/registry.sh"
		cat "$root/scripts/docker-save.sh"
	} | sha256sum | cut -c1-12)
	VIVARIUM_STANDINS_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/vivarium/standins-$key"
fi
out=$VIVARIUM_STANDINS_DIR
if [ "$cmd" = built ]; then
	[ -f "$out/built" ] && exit 0
	fail "the stand-ins are not built in $out (scripts/registry.sh images builds them)"
fi

need=""
command -v docker-registry >/dev/null 2>&1 || need="$need docker-registry"
command -v skopeo >/dev/null 2>&1 || need="$need skopeo"
command -v debootstrap >/dev/null 2>&1 || need="$need debootstrap"
command -v openssl >/dev/null 2>&1 || need="$need openssl"
command -v curl >/dev/null 2>&1 || need="$need curl"
if [ -n "$need" ]; then
	step "installing$need with apt"
	apt-get update -qq
	env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null ||
		fail "apt-get install$need failed"
fi

mkdir -p "$out"
. "$root/scripts/docker-save.sh"

# stand-ins: begin
# standin FLAVOUR SUITE PACKAGES CONFIG: $out/FLAVOUR.tar, Debian SUITE's
# minbase with PACKAGES (comma separated, may be empty), its config
# CONFIG (JSON members; the stand-in's label is added).
standin() {
	flavour=$1 suite=$2 pkgs=$3 cfg=$4
	[ -f "$out/$flavour.tar" ] && return 0
	. "$root/scripts/apt-sources.sh"
	apt_debian_uri "$suite" || fail "no Debian archive to debootstrap $suite from"
	rfs=$out/rootfs-$flavour
	rm -rf "$rfs"
	step "debootstrap $suite ($flavour${pkgs:+: $pkgs}) from $apt_uri"
	mkdir -p "$out/debs-$suite"
	if ! debootstrap --variant=minbase --cache-dir="$out/debs-$suite" ${pkgs:+--include="$pkgs"} "$suite" "$rfs" "$apt_uri" \
		> "$out/debootstrap-$flavour.log" 2>&1; then
		# debootstrap mounts /proc and /sys in the chroot; a failure may
		# leave them.
		for m in $(awk -v r="$rfs/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
			umount -l "$m" || true
		done
		tail -20 "$out/debootstrap-$flavour.log" >&2
		fail "debootstrap failed (log: $out/debootstrap-$flavour.log)"
	fi
	if [ "$flavour" = base ]; then
		chroot "$rfs" useradd --create-home --uid 1000 --shell /bin/bash user
	fi
	rm -rf "$rfs/var/lib/apt/lists"/* "$rfs/var/cache/apt"/*.bin "$rfs/var/cache/apt/archives"/*.deb "$rfs/var/log"/* "$rfs/dev"/*
	tar --numeric-owner -C "$rfs" -cf "$out/$flavour.layer" .
	label="\"Labels\":{\"org.opencontainers.image.description\":\"Vivarium test stand-in: Debian $suite by debootstrap, not the image of this name\"}"
	docker_save "vivarium-standin/$flavour:1" "{$cfg,$label}" "$out/$flavour.tar" "$out/$flavour.layer"
	rm -rf "$rfs" "$out/$flavour.layer"
	step "built $out/$flavour.tar ($(du -m "$out/$flavour.tar" | cut -f1) MiB)"
}
path='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'
standin minbase bookworm "" "\"Env\":[$path],\"Cmd\":[\"/bin/bash\"]"
standin python bookworm python3,python3-pip,python3-venv "\"Env\":[$path],\"Cmd\":[\"python3\"]"
standin python3.13 trixie python3,python3-pip,python3-venv "\"Env\":[$path],\"Cmd\":[\"python3\"]"
standin base bookworm python3,python3-pip,python3-venv,sudo "\"Env\":[$path],\"User\":\"user\",\"WorkingDir\":\"/home/user\",\"Cmd\":[\"/bin/bash\"]"
touch "$out/built"
# stand-ins: end
[ "$cmd" = images ] && exit 0

[ "$cmd" = start ] && [ $# -ge 1 ] || usage
dir=$1
shift
tls="" auth=""
while [ $# -gt 0 ]; do
	case $1 in
	--tls) tls=1 ;;
	--auth) [ $# -ge 2 ] || usage; auth=$2; shift ;;
	*) usage ;;
	esac
	shift
done
mkdir -p "$dir/data"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
addr=127.0.0.1:$port
{
	printf 'version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n' "$dir/data" "$addr"
	if [ -n "$tls" ]; then
		openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=vivarium test registry" \
			-addext "subjectAltName=IP:127.0.0.1,DNS:localhost" -keyout "$dir/registry.key" -out "$dir/ca.crt" 2>/dev/null
		printf '  tls:\n    certificate: %s\n    key: %s\n' "$dir/ca.crt" "$dir/registry.key"
	fi
	if [ -n "$auth" ]; then
		user=${auth%%:*} pass=${auth#*:}
		python3 -W ignore -c 'import crypt, sys; print(sys.argv[1] + ":" + crypt.crypt(sys.argv[2], crypt.mksalt(crypt.METHOD_BLOWFISH)))' \
			"$user" "$pass" > "$dir/htpasswd"
		printf 'auth:\n  htpasswd:\n    realm: vivarium-test\n    path: %s\n' "$dir/htpasswd"
	fi
} > "$dir/config.yml"
setsid docker-registry serve "$dir/config.yml" > "$dir/registry.log" 2>&1 < /dev/null &
echo $! > "$dir/pid"
scheme=http
[ -n "$tls" ] && scheme=https
i=0
until curl -s -o /dev/null ${tls:+--cacert "$dir/ca.crt"} "$scheme://$addr/v2/"; do
	i=$((i + 1))
	[ $i -lt 100 ] || fail "the registry did not start (log: $dir/registry.log)"
	kill -0 "$(cat "$dir/pid")" 2>/dev/null || fail "the registry exited (log: $dir/registry.log)"
	sleep 0.1
done
push() {
	if [ -n "$tls" ]; then
		mkdir -p "$dir/certs.d"
		cp "$dir/ca.crt" "$dir/certs.d/ca.crt"
		set -- --dest-cert-dir "$dir/certs.d" "$@"
	else
		set -- --dest-tls-verify=false "$@"
	fi
	skopeo copy -q ${auth:+--dest-creds "$auth"} "$@" > /dev/null
}
for pair in minbase:library/ubuntu:22.04 minbase:library/ubuntu:24.04 python:library/python:3 python3.13:library/python:3.13 base:e2bdev/base:latest; do
	push "docker-archive:$out/${pair%%:*}.tar" "docker://$addr/${pair#*:}" || fail "push ${pair#*:} failed"
done
step "serving ubuntu:22.04, ubuntu:24.04, python:3, python:3.13, e2bdev/base (stand-ins) at $scheme://$addr (pid $(cat "$dir/pid"))"
echo "$addr"
