# Builds what `go build` cannot. Go code builds with go build as usual.
#
#   make wasm   the wasm backend's interpreter (CPython 3.11 for wasm32-wasi)
#               in build/wasm, from Debian's python3.11 source package with
#               Debian's clang-14, lld-14 and wasi-libc; nothing is
#               downloaded from anywhere else. About four minutes on two
#               cores; does nothing when build/wasm is up to date.
#   make criu   CRIU 4.1.1 (the native backend's checkpoint/restore) in
#               $(CRIU_DIR), default ~/.cache/vivarium/criu-<hash of
#               scripts/criu/*>, from Debian trixie's criu source with
#               bookworm's build dependencies. About 30 s on two cores;
#               does nothing when the binary is there.

WASM_DIR ?= build/wasm

CRIU_DIR ?=

.PHONY: wasm clean-wasm criu

wasm: $(WASM_DIR)/python.wasm

$(WASM_DIR)/python.wasm: scripts/wasm/build.sh scripts/wasm/deps.sh scripts/wasm/config.site
	scripts/wasm/deps.sh
	VIVARIUM_WASM_DIR="$(abspath $(WASM_DIR))" scripts/wasm/build.sh

clean-wasm:
	rm -rf $(WASM_DIR)

criu:
	scripts/criu/deps.sh
	VIVARIUM_CRIU_DIR="$(CRIU_DIR)" scripts/criu/build.sh
