package native

import (
	"bytes"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
)

// runnerProc is one Python runner process and its pipes: how the core
// reaches it (core.Conn).
type runnerProc struct {
	r      *core.Runner
	pid    int
	events *eventsReader // its event pipe, as the core reads it
	reqW   *os.File
	reqMu  sync.Mutex // one frame at a time on reqW
	// A zygote's runner: a pidfd to signal it (-1 when none or gone),
	// under Sandbox.mu.
	pidfd int
}

var _ core.Conn = (*runnerProc)(nil)

// Send writes one frame to the runner.
func (r *runnerProc) Send(req runner.Request) error {
	r.reqMu.Lock()
	defer r.reqMu.Unlock()
	return runner.WriteFrame(r.reqW, req)
}

// Ack acknowledges a result if the pipe has room, and drops the ack
// otherwise: the runner waits for at most one at a time, and a flood of
// forged results must not block the supervisor (an ack is far below
// PIPE_BUF, so it is written whole or not at all).
func (r *runnerProc) Ack() {
	r.reqMu.Lock()
	defer r.reqMu.Unlock()
	rc, err := r.reqW.SyscallConn()
	if err != nil {
		return
	}
	rc.Write(func(fd uintptr) bool {
		unix.Write(int(fd), ackFrame) // EAGAIN: dropped
		return true
	})
}

// ackFrame is the runner.Request{Type: "ack"} frame.
var ackFrame = func() []byte {
	var b bytes.Buffer
	runner.WriteFrame(&b, runner.Request{Type: "ack"})
	return b.Bytes()
}()

// HangUp closes the request pipe: a runner waiting for an ack, or for its
// next request, sees the end of it.
func (r *runnerProc) HangUp() { r.hangUp() }

func (r *runnerProc) hangUp() {
	r.reqMu.Lock()
	defer r.reqMu.Unlock()
	r.reqW.Close()
}

// closePidfd forgets the runner's pidfd; called with Sandbox.mu held, so
// that no one signals a reused descriptor.
func (r *runnerProc) closePidfd() {
	if r.pidfd >= 0 {
		unix.Close(r.pidfd)
		r.pidfd = -1
	}
}

// pipe, so that every frame written so far has been handled.
type eventsReader struct {
	f       *os.File
	fd      int
	waiting atomic.Bool
	reads   atomic.Uint64
}

func (e *eventsReader) Read(p []byte) (int, error) {
	e.waiting.Store(true)
	n, err := e.f.Read(p)
	e.reads.Add(1)
	e.waiting.Store(false)
	return n, err
}

func (e *eventsReader) Close() error { return e.f.Close() }

// drained returns once the reader has handled every frame of a runner that
// has exited (so wrote its last), or its stream ended (done), or after
// drainTimeout. Its last frames may still be in the pipe when its exit is
// seen; its children may hold the pipe open, so EOF alone cannot tell.
func (e *eventsReader) drained(done <-chan struct{}) {
	idle := func() bool {
		seq := e.reads.Load()
		if !e.waiting.Load() {
			return false
		}
		n, err := unix.IoctlGetInt(e.fd, unix.TIOCINQ) // FIONREAD
		return (err != nil || n == 0) && e.waiting.Load() && e.reads.Load() == seq
	}
	deadline := time.Now().Add(drainTimeout)
	for calm := 0; time.Now().Before(deadline); {
		if isClosed(done) {
			return
		}
		if idle() {
			// Twice, apart: a read that returned in between is seen.
			if calm++; calm == 2 {
				return
			}
		} else {
			calm = 0
		}
		time.Sleep(200 * time.Microsecond)
	}
}
