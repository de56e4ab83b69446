//go:build linux

package hostile

// wasmDifferences are the cases whose safe outcome on the wasm backend is
// not the native one, and why. The wasm backend has no kernel of its own
// to attack: no /proc, no processes, no sockets, no system calls beyond
// WASI, no ctypes; its file system is the host's in-memory view (see
// internal/backend/wasm). A case listed here asserts what the wasm
// sandbox does instead, or is skipped when the attack has no target.
var wasmDifferences = map[string]difference{}
