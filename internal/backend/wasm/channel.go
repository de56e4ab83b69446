package wasm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/sys"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
)

// channel carries the runner's framed protocol (internal/runner: a 4-byte
// big-endian length, then JSON) between the supervisor and the runner
// inside the guest, through a device file, /dev/vivarium, that only the
// runner opens: the device can be opened once, and the runner does so
// before any user code runs. The code's stdout and stderr are WASI's fds
// 1 and 2, so nothing printed can ever look like a frame. Code that finds
// the runner's descriptor and writes frames to it can only report results
// of its own execution, as in the native backend, where it can write to
// the runner's pipe.
//
// Everything read from the guest is hostile: frames are size-capped, a
// malformed one breaks the channel for good (later frames are dropped),
// and past maxResults results are counted without being parsed.
//
// Writes and reads happen on the guest's goroutine, synchronously: when
// the runner has written a result, everything the code printed before it
// has already been delivered, so no acknowledgement is needed to keep
// output and results in order.
type channel struct {
	requests chan []byte   // frames to the runner
	ended    chan struct{} // closed when the instance ends

	mu      sync.Mutex
	opened  bool
	pending []byte // the rest of a request being read
	in      []byte // bytes of an incomplete event frame
	broken  error
	// onEvent receives each event; skip tells whether a result frame can
	// be passed over unparsed (the results cap is reached). onIdle is
	// called when the runner waits for its next request.
	onEvent  func(runner.Event)
	skip     func() bool
	onIdle   func()
	onBroken func(error)

	// The time the runner has spent waiting for requests (ns), and when
	// its current wait began (Unix ns; 0 when it does not wait).
	waited       atomic.Int64
	waitingSince atomic.Int64
}

func newChannel() *channel {
	return &channel{requests: make(chan []byte, 1), ended: make(chan struct{})}
}

// send queues one request frame for the runner.
func (c *channel) send(req runner.Request) error {
	var b bytes.Buffer
	if err := runner.WriteFrame(&b, req); err != nil {
		return err
	}
	select {
	case c.requests <- b.Bytes():
		return nil
	case <-c.ended:
		return errInstanceEnded
	}
}

// open is the device's open: once.
func (c *channel) open() (experimentalsys.File, experimentalsys.Errno) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opened {
		return nil, experimentalsys.EACCES
	}
	c.opened = true
	return &channelFile{c: c}, 0
}

// read blocks until a request is there, or the instance ends (EOF).
func (c *channel) read(buf []byte) int {
	c.mu.Lock()
	if len(c.pending) == 0 {
		idle := c.onIdle
		c.mu.Unlock()
		if idle != nil {
			idle()
		}
		start := time.Now()
		c.waitingSince.Store(start.UnixNano())
		var b []byte
		select {
		case b = <-c.requests:
		case <-c.ended:
		}
		// Counted before the wait ends, as a sleep is.
		c.waited.Add(int64(time.Since(start)))
		c.waitingSince.Store(0)
		if b == nil {
			return 0
		}
		c.mu.Lock()
		c.pending = b
	}
	n := copy(buf, c.pending)
	c.pending = c.pending[n:]
	c.mu.Unlock()
	return n
}

// write takes bytes of event frames and hands each complete one on, as it
// is parsed. What it holds is bounded whatever the guest writes at once: at
// most one frame's worth of bytes (maxFrame) is buffered, and no parsed
// event waits for the rest of the write.
func (c *channel) write(buf []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(buf) > 0 && c.broken == nil {
		// An incomplete frame is shorter than maxFrame+4: room >= 1.
		n := min(maxFrame+4-len(c.in), len(buf))
		c.in = append(c.in, buf[:n]...)
		buf = buf[n:]
		c.parse()
	}
	if c.broken != nil || len(c.in) == 0 {
		c.in = nil // do not keep a large buffer alive
	}
}

// parse hands on every complete frame of c.in and keeps the rest. The
// handlers run with c.mu held: they take the sandbox's lock, never the
// other way round.
func (c *channel) parse() {
	off := 0
	for len(c.in)-off >= 4 {
		n := binary.BigEndian.Uint32(c.in[off:])
		if n > maxFrame {
			c.broke(fmt.Errorf("%w: %d bytes, limit %d", runner.ErrFrameTooLarge, n, maxFrame))
			return
		}
		if uint32(len(c.in)-off-4) < n {
			break
		}
		body := c.in[off+4 : off+4+int(n)]
		off += 4 + int(n)
		var ev runner.Event
		if c.skip != nil && c.skip() && bytes.HasPrefix(body, resultPrefix) {
			ev = runner.Event{Type: "skipped"}
		} else if err := json.Unmarshal(body, &ev); err != nil || ev.Type == "" {
			c.broke(fmt.Errorf("%w: %v", runner.ErrMalformed, err))
			return
		}
		if c.onEvent != nil {
			c.onEvent(ev)
		}
	}
	c.in = c.in[:copy(c.in, c.in[off:])]
}

// broke records that the runner broke the protocol; called with c.mu held.
func (c *channel) broke(err error) {
	c.broken = err
	if c.onBroken != nil {
		c.onBroken(err)
	}
}

// waitedNow is the time the runner has waited for requests, the current
// wait included.
func (c *channel) waitedNow() time.Duration {
	d := c.waited.Load()
	if since := c.waitingSince.Load(); since != 0 {
		d += time.Now().UnixNano() - since
	}
	return time.Duration(d)
}

// brokenErr reports how the runner broke the protocol, if it did.
func (c *channel) brokenErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

// resultPrefix starts every result frame the runner writes (json.dumps of
// a dict whose first key is "type").
var resultPrefix = []byte(`{"type": "result"`)

// channelFile is the runner's open /dev/vivarium.
type channelFile struct {
	experimentalsys.UnimplementedFile
	c      *channel
	closed bool
}

func (f *channelFile) Dev() (uint64, experimentalsys.Errno)    { return 2, 0 }
func (f *channelFile) Ino() (sys.Inode, experimentalsys.Errno) { return 3, 0 }
func (f *channelFile) Stat() (sys.Stat_t, experimentalsys.Errno) {
	return sys.Stat_t{Dev: 2, Ino: 3, Mode: fs.ModeNamedPipe | 0o600, Nlink: 1}, 0
}

func (f *channelFile) Read(buf []byte) (int, experimentalsys.Errno) {
	if f.closed {
		return 0, experimentalsys.EBADF
	}
	return f.c.read(buf), 0
}

func (f *channelFile) Write(buf []byte) (int, experimentalsys.Errno) {
	if f.closed {
		return 0, experimentalsys.EBADF
	}
	f.c.write(buf)
	return len(buf), 0
}

func (f *channelFile) Close() experimentalsys.Errno {
	f.closed = true
	return 0
}
