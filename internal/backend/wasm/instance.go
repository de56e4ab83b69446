package wasm

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"
)

// Paths inside the guest.
const (
	workspacePath = "/workspace"
	runnerDir     = "opt/vivarium"
	stdlibMount   = "usr/local/lib"
)

// instance is one running interpreter: the module instantiated (with its
// own linear memory, file system and streams) in the runtime its memory
// limit shares with other sandboxes, and the goroutine that runs the
// module's _start (the runner's main loop) until the runner exits, traps
// or is stopped.
type instance struct {
	rt     wazero.Runtime
	name   string // the module's name in rt
	ch     *channel
	ctx    context.Context
	cancel context.CancelFunc
	ready  chan struct{} // closed at the runner's "ready"
	done   chan struct{} // closed when _start has returned

	// Valid once done is closed.
	exitCode *uint32 // the code given to proc_exit (or 0 when _start returned)
	trap     error   // how it failed otherwise

	started  time.Time    // when it was launched
	killed   atomic.Bool  // stop ended it
	slept    atomic.Int64 // nanoseconds the guest spent sleeping, sleeps done
	sleeping atomic.Int64 // when the current sleep began (Unix ns), 0 awake
	memBytes atomic.Int64 // linear memory size, last seen
	endOnce  sync.Once
}

// stop ends the instance: wazero closes the module at the next function
// call or loop iteration of the guest, and the host's blocking calls
// (sleep, the channel) return at once.
func (i *instance) stop() {
	i.killed.Store(true)
	i.cancel()
	i.endChannel()
}

// endChannel makes the channel's blocking calls return.
func (i *instance) endChannel() { i.endOnce.Do(func() { close(i.ch.ended) }) }

// alive reports whether the instance still runs.
func (i *instance) alive() bool {
	select {
	case <-i.done:
		return false
	default:
		return true
	}
}

// sleep is the guest's nanosleep (time.sleep, and poll_oneoff's clock):
// real, interrupted when the instance stops, and accounted, so that the
// CPU time of an execution excludes it.
func (i *instance) sleep(ns int64) {
	if ns <= 0 {
		return
	}
	start := time.Now()
	i.sleeping.Store(start.UnixNano())
	t := time.NewTimer(time.Duration(ns))
	select {
	case <-t.C:
	case <-i.ctx.Done():
		t.Stop()
	}
	// Counted before the sleep ends: a reader in between sees the sleep
	// twice (less CPU, checked again soon), never not at all.
	i.slept.Add(int64(time.Since(start)))
	i.sleeping.Store(0)
}

// sleptNow is the time the guest has slept, the current sleep included.
func (i *instance) sleptNow() time.Duration {
	d := i.slept.Load()
	if since := i.sleeping.Load(); since != 0 {
		d += time.Now().UnixNano() - since
	}
	return time.Duration(d)
}

// busy is the time the interpreter has run: since its start, less its
// sleeps and its waits for requests.
func (i *instance) busy() time.Duration {
	return time.Since(i.started) - i.sleptNow() - i.ch.waitedNow()
}

// sampleMemory records the size of the guest's linear memory. It is only
// called while the guest waits (between executions, at an event), never
// while it could grow the memory.
func (i *instance) sampleMemory() {
	if m := i.rt.Module(i.name); m != nil {
		if mem := m.Memory(); mem != nil {
			i.memBytes.Store(int64(mem.Size()))
		}
	}
}

// newInstance prepares an instance around a channel; launch starts it.
func newInstance(ch *channel) *instance {
	inst := &instance{ch: ch, ready: make(chan struct{}), done: make(chan struct{})}
	inst.ctx, inst.cancel = context.WithCancel(context.Background())
	inst.ctx = withInstance(inst.ctx, inst)
	return inst
}

// launch starts the interpreter of inst. It returns once the module runs;
// the caller waits for ready.
func (s *Sandbox) launch(ctx context.Context, inst *instance) error {
	ch := inst.ch
	b := s.b
	mr, err := b.runtimeFor(ctx, s.spec.Limits.Memory)
	if err != nil {
		return err
	}
	rt, compiled := mr.rt, mr.compiled
	inst.rt = rt
	inst.name = "python-" + newID()
	mode := "--persistent"
	if s.spec.OneShot {
		mode = "--oneshot"
	}
	root := newRootFS(
		mount{"", b.skeleton()},
		mount{stdlibMount, readOnlyFS{sysfs.DirFS(b.stdlibPath())}},
		mount{"dev", &devFS{channel: ch}},
		mount{strings.TrimPrefix(workspacePath, "/"), s.ws},
	)
	// The guest holds stdin, stdout, stderr and "/" besides what it opens.
	root.maxOpen = max(int64(s.spec.Limits.OpenFiles)-4, 1)
	root.onTooMany = s.tooManyFiles
	cfg := wazero.NewModuleConfig().
		WithName(inst.name).
		WithArgs("/usr/local/bin/python3.11", "-s", "-B", "/"+runnerDir+"/wasm_runner.py", mode).
		WithStdin(strings.NewReader("")).
		WithStdout(s.core.Stdout).
		WithStderr(s.core.Stderr).
		WithFSConfig(wazero.NewFSConfig().(sysfs.FSConfig).WithSysFSMount(root, "/")).
		WithSysWalltime().
		WithSysNanotime().
		WithNanosleep(inst.sleep).
		WithRandSource(rand.Reader)
	for _, kv := range sandboxEnv(s.spec.Env) {
		cfg = cfg.WithEnv(kv[0], kv[1])
	}
	inst.started = time.Now()
	go func() {
		defer close(inst.done)
		mod, err := rt.InstantiateModule(inst.ctx, compiled, cfg)
		var exit *sys.ExitError
		switch {
		case err == nil:
			code := uint32(0)
			inst.exitCode = &code
			mod.Close(context.Background())
		case errors.As(err, &exit) && exit.ExitCode() != sys.ExitCodeContextCanceled && exit.ExitCode() != sys.ExitCodeDeadlineExceeded:
			code := exit.ExitCode()
			inst.exitCode = &code
		default:
			inst.trap = err
		}
		inst.endChannel()
		inst.cancel()
	}()
	return nil
}

// sandboxEnv is the interpreter's environment: a fixed base, then the
// user's. Nothing comes from the host's environment.
func sandboxEnv(user map[string]string) [][2]string {
	env := map[string]string{
		"PATH":    "/usr/local/bin:/usr/bin:/bin",
		"HOME":    workspacePath,
		"USER":    "sandbox",
		"LOGNAME": "sandbox",
		"LANG":    "C.UTF-8",
		"TZ":      "UTC",
		// The standard library's place: sys.prefix.
		"PYTHONHOME": "/usr/local",
	}
	for k, v := range user {
		env[k] = v
	}
	out := make([][2]string, 0, len(env))
	for k, v := range env {
		out = append(out, [2]string{k, v})
	}
	return out
}
