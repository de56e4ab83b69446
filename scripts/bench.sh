#!/bin/sh
# Builds vivarium and runs `vivarium bench` with every peer Debian packages:
# bubblewrap, gVisor (runsc) and Jupyter (ipykernel, jupyter_client), on top
# of the Python stack scripts/deps.sh installs. Docker is measured only when
# a daemon already answers (see docs/benchmarks.md); this script starts none.
# Flags go to the bench: scripts/bench.sh --short, scripts/bench.sh --json ...
set -eu
cd "$(dirname "$0")/.."
VIVARIUM_DEPS_EXTRA="bubblewrap runsc python3-ipykernel python3-jupyter-client ${VIVARIUM_DEPS_EXTRA:-}" scripts/deps.sh
scripts/build.sh bin/vivarium
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
exec $sudo bin/vivarium bench "$@"
