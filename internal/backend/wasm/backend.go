// Package wasm runs sandboxes as CPython compiled to WebAssembly
// (wasm32-wasi), executed in-process by wazero: no kernel feature, no
// root and no cgo, so it builds and runs on every OS Go supports.
//
// The isolation is WebAssembly's: the interpreter can touch nothing but
// its own linear memory and what the host hands it through WASI. Here
// that is a file system the host builds (see rootFS: the standard library
// and the runner read-only, /workspace in memory and size-checked), stdout
// and stderr, clocks, random bytes, and the runner's protocol device. No
// network, no processes, no threads, no native extensions.
//
// Executions are internal/core's, as every backend's are: an interpreter
// instance is the core's runner. Limits: the wall clock by cancelling the
// instance (wazero closes a module when its context is done, even in a
// tight loop), CPU time as the time the interpreter ran (neither sleeping
// nor waiting for a request), memory by the linear memory's page limit
// (an allocation past it is Python's MemoryError), output per stream by
// the core, and disk by memFS's accounting.
//
// The interpreter is built by `make wasm` (scripts/wasm/build.sh) from
// Debian's python3.11 source package; Locate finds it. Compiled machine
// code is kept in wazero's file cache, so only the first start on a host
// compiles the module (tens of seconds); later ones load it.
package wasm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"

	_ "embed"
)

//go:embed wasm_runner.py
var wasmRunner []byte

// The interpreter's files inside a Dir.
const (
	InterpreterFile = "python.wasm"
	stdlibDir       = "lib"
	stdlibLandmark  = "lib/python3.11/os.py"
)

// DirEnv names the directory of the interpreter, overriding the search.
const DirEnv = "VIVARIUM_WASM_DIR"

// Config configures the wasm backend.
type Config struct {
	// Dir holds python.wasm and lib/python3.11, as `make wasm` leaves them
	// in build/wasm. Empty: Locate's search.
	Dir string
	// CacheDir holds wazero's compilation cache. Empty: "vivarium/wasm"
	// under the user's cache directory, or none when there is none.
	CacheDir string
	Logger   *slog.Logger
}

// Backend creates wasm sandboxes. Its compiled module and caches are shared
// by every sandbox it creates.
type Backend struct {
	cfg   Config
	log   *slog.Logger
	wasm  []byte // python.wasm
	cache wazero.CompilationCache
	// runnerFiles are the runner's files, placed in /opt/vivarium.
	runnerFiles map[string][]byte

	skelOnce sync.Once
	skel     *memFS // the read-only root, see skeleton

	mu       sync.Mutex
	closed   bool
	runtimes map[uint32]*moduleRuntime // by memory limit, in pages
}

// moduleRuntime is a wazero runtime with WASI and the interpreter compiled
// in it. The memory limit is a setting of the runtime, so sandboxes share
// one per limit: compiling (even from the cache) costs hundreds of
// milliseconds, instantiating only the module's own memory.
type moduleRuntime struct {
	rt       wazero.Runtime
	compiled wazero.CompiledModule
}

var _ sandbox.Backend = (*Backend)(nil)

// Locate returns the directory of the interpreter: $VIVARIUM_WASM_DIR if
// set, else the first build/wasm holding one among the directories above
// the executable and above the working directory (a checkout's bin/vivarium
// and its tests find the checkout's build). The error, ErrNotBuilt,
// names where it looked and how to build it.
func Locate() (string, error) {
	if d := os.Getenv(DirEnv); d != "" {
		return d, Check(d)
	}
	var starts []string
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	var looked []string
	for _, start := range starts {
		for d := start; ; d = filepath.Dir(d) {
			cand := filepath.Join(d, "build", "wasm")
			looked = append(looked, cand)
			if Check(cand) == nil {
				return cand, nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	first := "build/wasm"
	if len(looked) > 0 {
		first = looked[0]
	}
	return "", fmt.Errorf("%w: no %s found (looked in %s and the directories above); "+
		"build it with `make wasm` in a checkout of vivarium, or point %s (or --wasm-dir) at one",
		ErrNotBuilt, InterpreterFile, first, DirEnv)
}

// Check reports whether dir holds a complete interpreter.
func Check(dir string) error {
	for _, f := range []string{InterpreterFile, stdlibLandmark} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("%w: %s has no %s; build it with `make wasm`", ErrNotBuilt, dir, f)
		}
	}
	return nil
}

// New loads the interpreter and opens the compilation cache.
func New(cfg Config) (*Backend, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Dir == "" {
		d, err := Locate()
		if err != nil {
			return nil, err
		}
		cfg.Dir = d
	} else if err := Check(cfg.Dir); err != nil {
		return nil, err
	}
	code, err := os.ReadFile(filepath.Join(cfg.Dir, InterpreterFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotBuilt, err)
	}
	b := &Backend{cfg: cfg, log: cfg.Logger, wasm: code, runnerFiles: runner.Files()}
	b.runnerFiles["wasm_runner.py"] = wasmRunner
	if cfg.CacheDir == "" {
		if d, err := os.UserCacheDir(); err == nil {
			cfg.CacheDir = filepath.Join(d, "vivarium", "wasm")
		}
	}
	if cfg.CacheDir != "" {
		if b.cache, err = wazero.NewCompilationCacheWithDir(cfg.CacheDir); err != nil {
			b.log.Warn("wasm: no compilation cache; every start compiles the interpreter", "dir", cfg.CacheDir, "err", err)
		}
	}
	if b.cache == nil {
		// In memory: still shared by the sandboxes of this process.
		b.cache = wazero.NewCompilationCache()
	}
	b.cfg = cfg
	return b, nil
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "wasm" }

// Dir is the interpreter's directory.
func (b *Backend) Dir() string { return b.cfg.Dir }

// Warm compiles the interpreter (or loads it from the cache) now, for
// the default memory limit, so that the first sandbox does not wait for it.
func (b *Backend) Warm(ctx context.Context) error {
	_, err := b.runtimeFor(ctx, sandbox.DefaultMemory)
	return err
}

// runtimeFor returns the runtime of a memory limit, made on first use.
func (b *Backend) runtimeFor(ctx context.Context, memory int64) (*moduleRuntime, error) {
	pages := memoryPages(memory)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, sandbox.ErrClosed
	}
	if mr := b.runtimes[pages]; mr != nil {
		return mr, nil
	}
	rt := wazero.NewRuntimeWithConfig(context.Background(), b.runtimeConfig(pages))
	if err := instantiateWASI(ctx, rt); err != nil {
		rt.Close(context.Background())
		return nil, fmt.Errorf("wasi: %w", err)
	}
	// A cache miss compiles the whole interpreter: on every core.
	cctx := experimental.WithCompilationWorkers(ctx, runtime.NumCPU())
	compiled, err := rt.CompileModule(cctx, b.wasm)
	if err != nil {
		rt.Close(context.Background())
		return nil, fmt.Errorf("compile %s: %w", InterpreterFile, err)
	}
	if b.runtimes == nil {
		b.runtimes = map[uint32]*moduleRuntime{}
	}
	mr := &moduleRuntime{rt: rt, compiled: compiled}
	b.runtimes[pages] = mr
	return mr, nil
}

// Close stops the runtimes and releases the compiled code held in memory.
// Sandboxes should be closed first: their interpreters end with it.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	var errs []error
	for _, mr := range b.runtimes {
		errs = append(errs, mr.rt.Close(context.Background()))
	}
	errs = append(errs, b.cache.Close(context.Background()))
	return errors.Join(errs...)
}

// Create implements sandbox.Backend.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	// This backend has no way out and mounts no volume: a spec that
	// asks for either is refused.
	if err := sandbox.CheckSpec(b, spec); err != nil {
		return nil, err
	}
	if spec.Python != "" && spec.Python != sandbox.DefaultPython {
		return nil, fmt.Errorf("%w: the wasm backend runs its own interpreter (CPython %s for wasm32-wasi); "+
			"it cannot run %s", sandbox.ErrInvalidSpec, "3.11", spec.Python)
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, sandbox.ErrClosed
	}
	spec.Limits = spec.Limits.WithDefaults()
	s := newSandbox(b, spec)
	if err := s.startInstance(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("%w: %w", sandbox.ErrSetup, err)
	}
	return s, nil
}

// memoryPages is a memory limit in WebAssembly pages of 64 KiB, at most
// the 4 GiB a 32-bit memory can address.
func memoryPages(memory int64) uint32 { return uint32(min(max(memory>>16, 1), 65536)) }

// runtimeConfig is the wazero configuration of the sandboxes of one memory
// limit: compiled code from the shared cache, linear memory capped at the
// limit, and a module closed as soon as its context is cancelled.
func (b *Backend) runtimeConfig(pages uint32) wazero.RuntimeConfig {
	return wazero.NewRuntimeConfig().
		WithCompilationCache(b.cache).
		WithMemoryLimitPages(pages).
		// The only way to stop code that loops without calling out: a
		// check at every loop header and function entry. It makes
		// CPU-bound Python about five times slower (measured: 3.5 s
		// instead of 0.65 s for three million additions), and it is what
		// makes the wall-clock and CPU limits hold.
		WithCloseOnContextDone(true).
		// Stack traces of a trap without DWARF line numbers: parsing
		// them costs seconds, at every exit.
		WithDebugInfoEnabled(false)
}

func newID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// IsNotBuilt reports whether err says the interpreter is missing.
func IsNotBuilt(err error) bool { return errors.Is(err, ErrNotBuilt) }
