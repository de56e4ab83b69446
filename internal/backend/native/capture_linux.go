package native

import (
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/core"
)

// pipeReader reads one output pipe of a sandbox (its stdout or stderr) for
// as long as the sandbox lives, into the core's Output, which keeps what
// the current execution may keep. Reading never stops, so a flood cannot
// block the writer.
//
// Reads happen only under mu, in non-blocking mode. sync() takes mu and
// reads until the pipe is empty, so once it returns, every byte written
// before it was called has been delivered: that is how an execution's
// output is cut off exactly at the runner's "done".
type pipeReader struct {
	f    *os.File
	rc   syscall.RawConn
	out  *core.Output
	done chan struct{} // closed at EOF

	mu      sync.Mutex
	scratch []byte
}

func newPipeReader(f *os.File, out *core.Output) (*pipeReader, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	p := &pipeReader{f: f, rc: rc, out: out, done: make(chan struct{}), scratch: make([]byte, 64<<10)}
	go p.loop()
	return p, nil
}

func (p *pipeReader) loop() {
	defer close(p.done)
	for {
		eof := false
		err := p.rc.Read(func(fd uintptr) bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			n, err := unix.Read(int(fd), p.scratch)
			switch {
			case err == unix.EAGAIN:
				return false // wait for readability
			case err == unix.EINTR:
				return true
			case err != nil || n == 0:
				eof = true
			default:
				p.out.Write(p.scratch[:n])
			}
			return true
		})
		if err != nil || eof {
			return
		}
	}
}

// sync delivers everything already in the pipe.
func (p *pipeReader) sync() {
	p.rc.Control(func(fd uintptr) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for {
			n, err := unix.Read(int(fd), p.scratch)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n <= 0 {
				return
			}
			p.out.Write(p.scratch[:n])
		}
	})
}

func (p *pipeReader) close() { p.f.Close() }
