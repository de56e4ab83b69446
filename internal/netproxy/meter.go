package netproxy

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// errBudget: the sandbox has moved all the bytes its policy allows.
var errBudget = errors.New("the sandbox's network byte limit is reached")

// budget is a sandbox's byte allowance and bandwidth, shared by all its
// connections and both directions.
type budget struct {
	max  int64 // 0: no limit
	used atomic.Int64

	rate   float64 // bytes per second; 0: no limit
	mu     sync.Mutex
	tokens float64 // may go negative: a debt paid by waiting
	last   time.Time
}

func newBudget(max, rate int64) *budget {
	b := &budget{max: max, rate: float64(rate), last: time.Now()}
	b.tokens = b.burst()
	return b
}

// burst is how many bytes may pass at once: a second's worth, at least
// 64 KiB so that one read is never split.
func (b *budget) burst() float64 { return max(b.rate, 64<<10) }

// take claims up to n bytes of the allowance and returns how many it got.
func (b *budget) take(n int) int {
	if b.max <= 0 {
		b.used.Add(int64(n))
		return n
	}
	for {
		used := b.used.Load()
		left := b.max - used
		if left <= 0 {
			return 0
		}
		got := min(int64(n), left)
		if b.used.CompareAndSwap(used, used+got) {
			return int(got)
		}
	}
}

// give returns bytes claimed but not moved.
func (b *budget) give(n int) {
	if n > 0 {
		b.used.Add(-int64(n))
	}
}

func (b *budget) exhausted() bool { return b.max > 0 && b.used.Load() >= b.max }

// pace waits until n more bytes fit the bandwidth.
func (b *budget) pace(ctx context.Context, n int) error {
	if b.rate <= 0 || n <= 0 {
		return nil
	}
	b.mu.Lock()
	now := time.Now()
	b.tokens = min(b.tokens+now.Sub(b.last).Seconds()*b.rate, b.burst())
	b.last = now
	b.tokens -= float64(n)
	debt := -b.tokens
	b.mu.Unlock()
	if debt <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(debt / b.rate * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// meteredConn is the upstream side of one proxied connection: every byte
// in either direction is counted against the sandbox's budget and paced
// to its bandwidth, and a read that waits longer than idle ends it.
type meteredConn struct {
	net.Conn
	ctx     context.Context
	b       *budget
	idle    time.Duration
	in, out atomic.Int64
}

func (m *meteredConn) Read(p []byte) (int, error) {
	want := m.b.take(len(p))
	if want == 0 {
		return 0, errBudget
	}
	m.Conn.SetReadDeadline(time.Now().Add(m.idle))
	n, err := m.Conn.Read(p[:want])
	m.b.give(want - n)
	m.in.Add(int64(n))
	if perr := m.b.pace(m.ctx, n); perr != nil && err == nil {
		err = perr
	}
	return n, err
}

func (m *meteredConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		chunk := min(len(p)-done, 32<<10)
		got := m.b.take(chunk)
		if got == 0 {
			return done, errBudget
		}
		if err := m.b.pace(m.ctx, got); err != nil {
			m.b.give(got)
			return done, err
		}
		m.Conn.SetWriteDeadline(time.Now().Add(m.idle))
		n, err := m.Conn.Write(p[done : done+got])
		m.b.give(got - n)
		m.out.Add(int64(n))
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// CloseWrite half-closes a TCP upstream; other conns are closed whole.
func (m *meteredConn) CloseWrite() error {
	if cw, ok := m.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return m.Conn.Close()
}

// idleReader sets a read deadline before each read of the sandbox's side.
type idleReader struct {
	r    interface{ Read([]byte) (int, error) }
	c    net.Conn
	idle time.Duration
}

func (r idleReader) Read(p []byte) (int, error) {
	r.c.SetReadDeadline(time.Now().Add(r.idle))
	return r.r.Read(p)
}

// idleWriter sets a write deadline before each write to the sandbox's
// side: a sandbox that stops reading cannot hold a connection forever.
type idleWriter struct {
	c    net.Conn
	idle time.Duration
}

func (w idleWriter) Write(p []byte) (int, error) {
	w.c.SetWriteDeadline(time.Now().Add(w.idle))
	return w.c.Write(p)
}

// headLimit fails a read once more than left bytes have been read, until
// it is switched off: it bounds a request's or a response's head, which
// net/http reads without a limit of its own.
type headLimit struct {
	r    interface{ Read([]byte) (int, error) }
	left int
	on   bool
	hit  bool
}

var errHeadTooLarge = errors.New("header too large")

func (h *headLimit) Read(p []byte) (int, error) {
	if !h.on {
		return h.r.Read(p)
	}
	if h.left <= 0 {
		h.hit = true
		return 0, errHeadTooLarge
	}
	if len(p) > h.left {
		p = p[:h.left]
	}
	n, err := h.r.Read(p)
	h.left -= n
	return n, err
}
