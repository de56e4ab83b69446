# Everyday targets, and what `go build` cannot build. docs/testing.md says
# what each test tier covers.
#
#   make build       bin/vivarium, the one binary, statically linked, with
#                    the program every sandbox starts inside itself built
#                    in (scripts/build.sh; a plain go build has none, and
#                    its sandboxes start the whole binary again)
#   make test        the full suite, exactly what CI runs (scripts/test.sh):
#                    installs what the tests need, builds the wasm
#                    interpreter and CRIU, then runs every test as root.
#                    About 20 minutes on two cores.
#   make test-short  the fast tier (go test -short ./...): the logic, with
#                    fakes, without root, runsc, docker, CRIU, a
#                    kube-apiserver, the wasm interpreter or Node.js. Under
#                    a minute on two cores once the build cache is warm.
#   make check-docs  the docs checks (go test -short -run '^TestDocs' ./...)
#   make wasm        the wasm backend's interpreter (CPython 3.11 for
#                    wasm32-wasi) in build/wasm, from Debian's python3.11
#                    source package with Debian's clang-14, lld-14 and
#                    wasi-libc; nothing is downloaded from anywhere else.
#                    About four minutes on two cores; does nothing when
#                    build/wasm is up to date.
#   make criu        CRIU 4.1.1 (the native backend's checkpoint/restore) in
#                    $(CRIU_DIR), default ~/.cache/vivarium/criu-<hash of
#                    scripts/criu/*>, from Debian trixie's criu source with
#                    bookworm's build dependencies. About 30 s on two
#                    cores; does nothing when the binary is there.
#   make image       Vivarium's image (nodes and gateways) in
#                    bin/vivarium-image.tar, a `docker save` archive,
#                    without a Docker daemon (scripts/image.sh): Debian by
#                    debootstrap with what sandboxes run, vivarium and
#                    CRIU. Its base takes 3 to 10 minutes the first time.

GO ?= go

WASM_DIR ?= build/wasm

CRIU_DIR ?=

.PHONY: build test test-short check-docs wasm clean-wasm criu image

build:
	GO=$(GO) scripts/build.sh bin/vivarium

test:
	scripts/test.sh

test-short:
	$(GO) test -short ./...

check-docs:
	$(GO) test -short -run '^TestDocs' ./...

wasm: $(WASM_DIR)/python.wasm

$(WASM_DIR)/python.wasm: scripts/wasm/build.sh scripts/wasm/deps.sh scripts/wasm/config.site
	scripts/wasm/deps.sh
	VIVARIUM_WASM_DIR="$(abspath $(WASM_DIR))" scripts/wasm/build.sh

clean-wasm:
	rm -rf $(WASM_DIR)

image:
	GO=$(GO) scripts/image.sh bin/vivarium-image.tar

criu:
	scripts/criu/deps.sh
	VIVARIUM_CRIU_DIR="$(CRIU_DIR)" scripts/criu/build.sh
