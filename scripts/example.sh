#!/bin/sh
# Quickstart: builds vivarium and runs examples/quickstart.py in a fresh
# sandbox; the chart it draws lands in ./out.
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh bin/vivarium
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo bin/vivarium run --out out examples/quickstart.py
echo "--- files copied out of the sandbox:" >&2
ls -l out >&2
