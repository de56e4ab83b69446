package wasm

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"

	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// maxFrame bounds one event, as on every backend.
const maxFrame = core.MaxFrame

// setupTimeout bounds an interpreter's start, longer than a process's:
// the first one of a runtime compiles the module.
const setupTimeout = 120 * time.Second

// Sandbox is one wasm sandbox: a workspace, and an interpreter instance
// that keeps Python's state between executions (replaced when it dies or
// a limit stops it). Its executions are the core's; a sandbox has the
// default Python context only, and no commands.
type Sandbox struct {
	core      *core.Core
	id        string
	b         *Backend
	spec      sandbox.Spec
	ws        *memFS
	diskFull  atomic.Bool   // a guest write hit the disk limit
	filesFull atomic.Bool   // the guest hit the open-files limit
	oomTraps  atomic.Int64  // interpreters that trapped at the memory limit
	closedCh  chan struct{} // closed by Close

	mu     sync.Mutex
	inst   *instance
	closed bool
}

var (
	_ sandbox.Sandbox = (*Sandbox)(nil)
	_ sandbox.Prober  = (*Sandbox)(nil)
)

func newSandbox(b *Backend, spec sandbox.Spec) *Sandbox {
	s := &Sandbox{id: newID(), b: b, spec: spec, closedCh: make(chan struct{})}
	s.core = core.New((*driver)(s), core.Config{Spec: spec, SetupTimeout: setupTimeout, MemoryErrorIsLimit: true})
	s.ws = newMemFS(spec.Limits.Disk)
	s.ws.onFull = func() {
		if !s.diskFull.Swap(true) {
			s.core.Stderr.Note(fmt.Sprintf("vivarium: the workspace is full: the sandbox's disk limit is %s "+
				"(WASI reports this as an I/O error)\n", sizeText(spec.Limits.Disk)))
		}
	}
	return s
}

// tooManyFiles says once per execution why opening a file failed.
func (s *Sandbox) tooManyFiles() {
	if !s.filesFull.Swap(true) {
		s.core.Stderr.Note(fmt.Sprintf("vivarium: too many open files: the sandbox's limit is %d "+
			"(WASI reports this as an I/O error)\n", s.spec.Limits.OpenFiles))
	}
}

// guestRunner is an interpreter instance as the core reaches it: requests
// go through its channel. The channel parses the events itself, on the
// guest's goroutine, so that output and results keep their order without
// acknowledgements (see channel); it hands each to the core.
type guestRunner struct {
	inst *instance
	full atomic.Bool // the execution has all the results it may keep
}

func (w *guestRunner) Send(req runner.Request) error { return w.inst.ch.send(req) }
func (w *guestRunner) Ack()                          {}
func (w *guestRunner) HangUp()                       {}

// startInstance starts an interpreter and waits until its runner is ready.
func (s *Sandbox) startInstance(ctx context.Context) error {
	// The channel's handlers are set before the guest runs: its first
	// frame, "ready", comes soon after.
	ch := newChannel()
	inst := newInstance(ch)
	w := &guestRunner{inst: inst}
	r := core.NewRunner(w, core.DoneOnIdle())
	ch.onEvent = func(ev runner.Event) {
		if ev.Type == "error" || ev.Type == "done" {
			inst.sampleMemory() // the guest waits in this call: its memory holds still
		}
		w.full.Store(s.core.Event(r, ev))
	}
	ch.skip = w.full.Load
	ch.onIdle = func() {
		inst.sampleMemory()
		s.core.Idle(r)
	}
	ch.onBroken = func(err error) { s.core.RunnerBroken(r, err) }
	s.diskFull.Store(false)
	s.filesFull.Store(false)
	if err := s.launch(ctx, inst); err != nil {
		return err
	}
	go func() {
		<-inst.done
		s.core.RunnerExited(r, s.exitOf(inst))
	}()
	var err error
	timer := time.NewTimer(setupTimeout)
	defer timer.Stop()
	select {
	case <-r.Ready():
		s.mu.Lock()
		s.inst = inst
		s.mu.Unlock()
		s.core.SetRunner(r)
		return nil
	case <-inst.done:
		return s.startFailure(inst)
	case <-timer.C:
		err = fmt.Errorf("the interpreter was not ready within %v", setupTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	inst.stop()
	<-inst.done
	return err
}

// exitOf says how an instance ended, once it has.
func (s *Sandbox) exitOf(inst *instance) core.Exit {
	switch {
	case inst.killed.Load():
		return core.Exit{Closed: true}
	case inst.exitCode != nil:
		return core.Exit{Exited: true, Code: int(*inst.exitCode & 0xff)}
	}
	// A trap: the interpreter crashed (or ran out of stack), or its
	// memory could not grow. The trap's first line says what happened
	// ("wasm error: out of bounds memory access"); a stack of wasm
	// functions follows.
	if inst.memBytes.Load() >= s.spec.Limits.Memory-(1<<20) {
		s.oomTraps.Add(1)
	}
	why, _, _ := strings.Cut(fmt.Sprint(inst.trap), "\n")
	if _, after, ok := strings.Cut(why, "wasm error: "); ok {
		why = after
	}
	return core.Exit{Crash: "the interpreter crashed (" + why + "): its C stack overflowed, or it hit a fatal error"}
}

// startFailure explains why an interpreter ended before it was ready.
func (s *Sandbox) startFailure(inst *instance) error {
	why := "it trapped: " + fmt.Sprint(inst.trap)
	if inst.exitCode != nil {
		why = fmt.Sprintf("it exited with status %d", *inst.exitCode)
	}
	return s.core.StartFailure("the interpreter ended during start-up: " + why)
}

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Workspace implements sandbox.Sandbox.
func (s *Sandbox) Workspace() sandbox.Workspace { return &workspace{fs: s.ws} }

// Alive implements sandbox.Prober.
func (s *Sandbox) Alive() bool { return s.core.Alive() }

// Execute implements sandbox.Sandbox.
func (s *Sandbox) Execute(ctx context.Context, req sandbox.ExecRequest, sink sandbox.Sink) (*sandbox.Result, error) {
	return s.core.Execute(ctx, req, sink)
}

// Interrupt implements sandbox.Sandbox. WebAssembly has no signals: code
// that runs cannot be interrupted, only stopped by its time limit.
func (s *Sandbox) Interrupt() error { return s.core.Interrupt() }

// Restart implements sandbox.Sandbox: a fresh interpreter, the same files.
func (s *Sandbox) Restart(ctx context.Context) error { return s.core.Restart(ctx) }

// Start implements sandbox.Sandbox: there are no processes to start, nor
// terminals to start them in.
func (s *Sandbox) Start(_ context.Context, c sandbox.Command) (sandbox.Process, error) {
	if c.Terminal != nil {
		return nil, errNoTerminals
	}
	return nil, errNoCommands
}

// Close implements sandbox.Sandbox.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	inst, closed := s.inst, s.closed
	s.closed = true
	s.mu.Unlock()
	if !closed {
		close(s.closedCh)
	}
	if inst != nil {
		inst.stop()
		<-inst.done
	}
	return nil
}

// driver is a Sandbox as the core drives it (core.Driver).
type driver Sandbox

var _ core.Driver = (*driver)(nil)

func (d *driver) s() *Sandbox { return (*Sandbox)(d) }

func (d *driver) Prepare(context.Context) error {
	if d.Closed() {
		return sandbox.ErrClosed
	}
	// The disk and open-files notes are said once per execution.
	d.diskFull.Store(false)
	d.filesFull.Store(false)
	return nil
}

func (d *driver) Closed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// Dead: an interpreter's end is its runner's; the sandbox dies when it is
// closed.
func (d *driver) Dead() <-chan struct{} { return d.closedCh }

// Restart stops the current interpreter, if any, and starts another.
func (d *driver) Restart(ctx context.Context) error {
	s := d.s()
	s.mu.Lock()
	old, closed := s.inst, s.closed
	s.inst = nil
	s.mu.Unlock()
	if closed {
		return sandbox.ErrClosed
	}
	if old != nil {
		old.stop()
		<-old.done
	}
	if err := s.startInstance(ctx); err != nil {
		return fmt.Errorf("%w: restart: %w", sandbox.ErrClosed, err)
	}
	return nil
}

func (d *driver) Interrupt(*core.Runner) error { return errNoInterrupt }

// Usage: the interpreter runs on a goroutine of this process; its CPU
// time is the time it ran, neither sleeping nor waiting for a request.
func (d *driver) Usage() core.Usage {
	u := core.Usage{OOMKills: d.oomTraps.Load()}
	if r := d.s().core.Runner(); r != nil {
		inst := r.Conn().(*guestRunner).inst
		u.CPU, u.MemoryPeak = inst.busy(), inst.memBytes.Load()
	}
	return u
}

func (d *driver) CPUWatch() bool { return true }

func (d *driver) Kill() {
	if r := d.s().core.Runner(); r != nil {
		r.Conn().(*guestRunner).inst.stop()
	}
}

// SyncOutput: the guest's writes are calls into the host, done when the
// runner reports.
func (d *driver) SyncOutput() {}

// Finish: the one-shot runner exits after its execution: its exit status
// is the program's.
func (d *driver) Finish(r *core.Runner, why sandbox.Status) core.Exit {
	inst := r.Conn().(*guestRunner).inst
	if why != "" {
		inst.stop()
	}
	select {
	case <-inst.done:
	case <-d.closedCh:
		inst.stop()
		<-inst.done
	}
	<-r.Exited()
	return d.s().core.ExitOf(r)
}

func (d *driver) Executed(context.Context, *sandbox.Result) {}

// skeleton is the read-only root every sandbox of b shares: the mount
// points, and the runner in /opt/vivarium.
func (b *Backend) skeleton() *memFS {
	b.skelOnce.Do(func() {
		m := newMemFS(64 << 20)
		for _, d := range []string{"usr/local/lib", "usr/local/bin", runnerDir, "dev", "workspace"} {
			if _, err := m.mkdirAll(split(d)); err != nil {
				panic(err) // a fresh memFS: cannot fail
			}
		}
		for name, data := range b.runnerFiles {
			f, errno := m.OpenFile(runnerDir+"/"+name, experimentalsys.O_CREAT|experimentalsys.O_WRONLY, 0o644)
			if errno != 0 {
				panic(errno)
			}
			f.Write(data)
			f.Close()
		}
		m.readOnly = true
		b.skel = m
	})
	return b.skel
}

func (b *Backend) stdlibPath() string { return filepath.Join(b.cfg.Dir, stdlibDir) }

func sizeText(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
