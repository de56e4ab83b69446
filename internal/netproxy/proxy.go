// Package netproxy is a sandbox's only way out: an HTTP proxy, run by the
// supervisor for one sandbox, that the sandbox reaches on its own
// loopback. It serves CONNECT (an opaque tunnel, for HTTPS: never
// decrypted) and plain HTTP requests in absolute form, and nothing else.
//
// Every byte from the sandbox is hostile: request heads are bounded in
// size and time, requests are parsed by net/http and written out again
// (never passed through raw, so that no framing trick reaches the
// upstream server), and each destination is decided by a
// netpolicy.Checker before anything is dialled; the proxy then dials
// exactly the addresses the checker returned. Every connection, allowed
// or not, ends in one Event for the audit log, with its bytes in each
// direction. The sandbox's byte allowance, bandwidth and connection count
// are enforced here. Close ends every connection: nothing of a sandbox's
// network outlives it.
package netproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Config configures one sandbox's proxy.
type Config struct {
	// Checker decides every destination; its Policy's Limits are the
	// sandbox's limits.
	Checker *netpolicy.Checker
	// Dial connects to an address the checker allowed; nil: TCP with
	// DialTimeout. Tests point it at their own servers.
	Dial func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
	// Services are hosts served in-process instead of dialled (the
	// package index). A host listed here is allowed by being listed.
	Services map[string]func(ctx context.Context) (net.Conn, error)
	// Audit receives one Event per connection; nil: none.
	Audit  func(Event)
	Logger *slog.Logger

	// Zero values take the defaults below.
	HeaderTimeout  time.Duration // to receive a request's head
	DialTimeout    time.Duration // to connect upstream
	IdleTimeout    time.Duration // a connection with no byte either way for this long ends
	MaxHeaderBytes int           // of a request's or a response's head
	// ConnRate is how many connections a second the sandbox may open
	// (bursts of twice as many): it bounds the audit log a loop of
	// connections can write.
	ConnRate float64
}

// Defaults of Config.
const (
	DefaultHeaderTimeout  = 10 * time.Second
	DefaultDialTimeout    = 10 * time.Second
	DefaultIdleTimeout    = 2 * time.Minute
	DefaultMaxHeaderBytes = 32 << 10
	DefaultConnRate       = 50
)

// Event is one connection, as the audit log records it.
type Event struct {
	Time   time.Time
	Method string // CONNECT, or the plain request's method
	Host   string // as the sandbox named it (normalised when valid)
	Port   int
	Addr   string // the address dialled; empty when none was
	// Outcome is "allowed" (a connection was made), "refused" (by the
	// policy or a limit) or "failed" (allowed, but the destination could
	// not be reached).
	Outcome string
	// Reason says why a connection was refused or failed, or how an
	// allowed one ended when not by a clean close.
	Reason            string
	BytesIn, BytesOut int64 // from the destination, to it
	Duration          time.Duration
}

// Outcomes of an Event.
const (
	Allowed = "allowed"
	Refused = "refused"
	Failed  = "failed"
)

// Proxy is one sandbox's proxy. It implements sandbox.Egress.
type Proxy struct {
	cfg     Config
	checker atomic.Pointer[netpolicy.Checker] // cfg.Checker, then SetPolicy's
	limits  netpolicy.Limits
	budget  *budget
	conns   *budget // connection starts, paced like bytes
	log     *slog.Logger
	ctx     context.Context
	cancel  context.CancelFunc

	mu        sync.Mutex
	closed    bool
	open      map[net.Conn]struct{} // both sides of every connection
	listeners map[net.Listener]struct{}
	active    int                    // connections being served
	live      map[*meteredConn]*dest // upstream connections SetPolicy decides again
	wg        sync.WaitGroup
}

var _ sandbox.Egress = (*Proxy)(nil)

// New makes a proxy; it serves nothing until Serve or ServeConn.
func New(cfg Config) (*Proxy, error) {
	if cfg.Checker == nil || cfg.Checker.Policy.None() {
		return nil, fmt.Errorf("%w: a proxy needs a policy that allows something", netpolicy.ErrInvalid)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.HeaderTimeout, DefaultHeaderTimeout)
	def(&cfg.DialTimeout, DefaultDialTimeout)
	def(&cfg.IdleTimeout, DefaultIdleTimeout)
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if cfg.ConnRate <= 0 {
		cfg.ConnRate = DefaultConnRate
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Audit == nil {
		cfg.Audit = func(Event) {}
	}
	limits := cfg.Checker.Policy.Limits
	if limits.MaxConns <= 0 {
		limits.MaxConns = netpolicy.DefaultLimits.MaxConns
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		cfg: cfg, limits: limits, log: cfg.Logger, ctx: ctx, cancel: cancel,
		budget:    newBudget(limits.MaxBytes, limits.Rate),
		conns:     &budget{rate: cfg.ConnRate, tokens: 2 * cfg.ConnRate, last: time.Now()},
		open:      map[net.Conn]struct{}{},
		listeners: map[net.Listener]struct{}{},
		live:      map[*meteredConn]*dest{},
	}
	p.checker.Store(cfg.Checker)
	return p, nil
}

// Policy is the policy the proxy enforces.
func (p *Proxy) Policy() *netpolicy.Policy { return p.checker.Load().Policy }

// SetPolicy replaces the policy that decides the sandbox's connections;
// nil, or a policy that allows nothing, refuses every one. Every
// connection the sandbox asks for once SetPolicy returns is decided by the
// new policy, and every connection already made (a CONNECT tunnel, a
// plain request being relayed) is decided again, without resolving its
// name anew: those the new policy refuses are closed before SetPolicy
// returns, and their audit events say why. The limits stay those the
// proxy was made with, and so do its Services (whose connections are not
// the policy's).
func (p *Proxy) SetPolicy(policy *netpolicy.Policy) {
	if policy == nil {
		policy = &netpolicy.Policy{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c := *p.checker.Load()
	c.Policy = policy
	p.checker.Store(&c)
	for m, d := range p.live {
		if err := c.Recheck(d.target, d.port, d.addr); err != nil {
			d.closed = "closed when the sandbox's network policy changed: " + err.Error()
			m.Close()
		}
	}
}

// dest is where a live upstream connection goes.
type dest struct {
	target netpolicy.Target
	port   uint16
	addr   netip.Addr
	closed string // why SetPolicy closed it; guarded by Proxy.mu
}

// watch registers a live upstream connection for SetPolicy. One that
// checker allowed, but SetPolicy has replaced checker since, is decided
// again here: none outlives a policy change unchecked.
func (p *Proxy) watch(m *meteredConn, checker *netpolicy.Checker, d dest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live[m] = &d
	now := p.checker.Load()
	if now == checker {
		return
	}
	if err := now.Recheck(d.target, d.port, d.addr); err != nil {
		p.live[m].closed = "closed when the sandbox's network policy changed: " + err.Error()
		m.Close()
	}
}

// unwatch forgets a connection, and says why SetPolicy closed it ("" if
// it did not).
func (p *Proxy) unwatch(m *meteredConn) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.live[m]
	delete(p.live, m)
	if d == nil {
		return ""
	}
	return d.closed
}

// Serve accepts connections on l until l or the proxy is closed. The
// proxy closes l when it closes.
func (p *Proxy) Serve(l net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return net.ErrClosed
	}
	p.listeners[l] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, l)
		p.mu.Unlock()
	}()
	backoff := 5 * time.Millisecond
	for {
		// Paced before accepting: past the rate, connections wait in the
		// listen queue (and then in the sandbox's connect).
		if err := p.conns.paceConn(p.ctx); err != nil {
			return net.ErrClosed
		}
		c, err := l.Accept()
		if err != nil {
			if p.isClosed() || errors.Is(err, net.ErrClosed) {
				return net.ErrClosed
			}
			// EMFILE and the like: wait, the sandbox's own connections
			// are not worth the supervisor's spinning.
			p.log.Warn("proxy accept", "err", err)
			select {
			case <-time.After(backoff):
			case <-p.ctx.Done():
				return net.ErrClosed
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		go p.ServeConn(c)
	}
}

// paceConn waits for one connection start.
func (b *budget) paceConn(ctx context.Context) error {
	b.mu.Lock()
	now := time.Now()
	b.tokens = min(b.tokens+now.Sub(b.last).Seconds()*b.rate, 2*b.rate)
	b.last = now
	b.tokens--
	debt := -b.tokens
	b.mu.Unlock()
	if debt <= 0 {
		return ctx.Err()
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

// ServeConn serves one connection the sandbox opened to the proxy, and
// closes it. It returns when the connection ends or the proxy closes.
func (p *Proxy) ServeConn(c net.Conn) {
	if !p.track(c) {
		c.Close()
		return
	}
	defer p.untrack(c)
	p.mu.Lock()
	over := p.active >= p.limits.MaxConns
	if !over {
		p.active++
	}
	p.mu.Unlock()
	if over {
		p.refuseBusy(c)
		return
	}
	defer func() {
		p.mu.Lock()
		p.active--
		p.mu.Unlock()
	}()
	p.handle(c)
}

// track registers a connection from the sandbox, so that Close can end
// it and wait for its goroutine; false when the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.open[c] = struct{}{}
	p.wg.Add(1)
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
	p.wg.Done()
}

// adopt registers an upstream connection so that Close ends it; false
// (and the connection closed) when the proxy is closed.
func (p *Proxy) adopt(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.open[c] = struct{}{}
	return true
}

func (p *Proxy) release(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Close stops every listener and connection and waits until every
// goroutine of the proxy has returned. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	p.cancel()
	for l := range p.listeners {
		l.Close()
	}
	for c := range p.open {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// Used reports the bytes moved so far, both directions together.
func (p *Proxy) Used() int64 { return p.budget.used.Load() }
