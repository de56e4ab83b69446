package native

import (
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// capture reads one output stream of a sandbox (its stdout or stderr pipe)
// for as long as the sandbox lives, and hands the bytes to the current
// execution: at most limit bytes are kept, the rest is counted and dropped,
// and reading never stops, so a flood cannot block the writer or grow
// memory.
//
// Reads happen only under mu, in non-blocking mode. sync() takes mu and
// reads until the pipe is empty, so once it returns, every byte written
// before it was called has been delivered: that is how an execution's
// output is cut off exactly at the runner's "done".
type capture struct {
	f    *os.File
	rc   syscall.RawConn
	done chan struct{} // closed at EOF

	mu      sync.Mutex
	buf     []byte
	limit   int64
	dropped int64
	sink    func([]byte) // may be nil
	scratch []byte
}

func newCapture(f *os.File) (*capture, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	c := &capture{f: f, rc: rc, done: make(chan struct{}), scratch: make([]byte, 64<<10)}
	go c.loop()
	return c, nil
}

func (c *capture) loop() {
	defer close(c.done)
	for {
		eof := false
		err := c.rc.Read(func(fd uintptr) bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			n, err := unix.Read(int(fd), c.scratch)
			switch {
			case err == unix.EAGAIN:
				return false // wait for readability
			case err == unix.EINTR:
				return true
			case err != nil || n == 0:
				eof = true
			default:
				c.deliver(c.scratch[:n])
			}
			return true
		})
		if err != nil || eof {
			return
		}
	}
}

// deliver is called with mu held.
func (c *capture) deliver(p []byte) {
	room := c.limit - int64(len(c.buf))
	keep := int64(len(p))
	if keep > room {
		keep = max(room, 0)
	}
	c.dropped += int64(len(p)) - keep
	if keep > 0 {
		c.buf = append(c.buf, p[:keep]...)
		if c.sink != nil {
			c.sink(p[:keep])
		}
	}
}

// begin starts collecting for a new execution.
func (c *capture) begin(limit int64, sink func([]byte)) {
	c.mu.Lock()
	c.buf, c.dropped, c.limit, c.sink = nil, 0, limit, sink
	c.mu.Unlock()
}

// sync delivers everything already in the pipe.
func (c *capture) sync() {
	c.rc.Control(func(fd uintptr) {
		c.mu.Lock()
		defer c.mu.Unlock()
		for {
			n, err := unix.Read(int(fd), c.scratch)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n <= 0 {
				return
			}
			c.deliver(c.scratch[:n])
		}
	})
}

// end stops collecting and returns what the execution wrote.
func (c *capture) end() (data []byte, truncated bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	data, truncated = c.buf, c.dropped > 0
	c.buf, c.dropped, c.limit, c.sink = nil, 0, 0, nil
	return data, truncated
}

func (c *capture) close() { c.f.Close() }
