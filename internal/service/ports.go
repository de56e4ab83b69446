package service

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/store"
)

// A sandbox's ports: a server its code started is reached from outside
// through the server (preview URLs), by connections the backend makes
// inside the sandbox's own network (sandbox.PortDialer). Each is opened
// by a port token (tokens.go).

// MaxPortConns bounds the connections to one sandbox's ports open at once
// (HTTP requests in progress and WebSockets).
const MaxPortConns = 64

type ports struct {
	mu    sync.Mutex
	conns map[string]map[*portConn]struct{} // by sandbox ID
}

func checkPort(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("%w: port %d is not a TCP port (1-65535)", sandbox.ErrInvalidSpec, port)
	}
	return nil
}

// PortOptions say how the server reaches a sandbox's ports for its
// clients (E2B's network.httpsPorts and maskRequestHost).
type PortOptions struct {
	// TLS lists ports whose servers speak HTTPS themselves: the server
	// connects to them with TLS, without checking their certificate (the
	// sandbox's own, self-signed as a rule: the connection never leaves
	// the host), and its clients reach them as they reach any port.
	TLS []int `json:"tls,omitempty"`
	// Host is the Host header that the sandbox's servers get instead of
	// the client's; "${PORT}" in it becomes the port's number. Empty:
	// the client's.
	Host string `json:"host,omitempty"`
}

// maxTLSPorts bounds PortOptions.TLS.
const maxTLSPorts = 64

func (o PortOptions) check() error {
	if len(o.TLS) > maxTLSPorts {
		return fmt.Errorf("%w: at most %d TLS ports", sandbox.ErrInvalidSpec, maxTLSPorts)
	}
	for _, p := range o.TLS {
		if err := checkPort(p); err != nil {
			return err
		}
	}
	h := strings.ReplaceAll(o.Host, "${PORT}", "65535")
	if len(h) > 253 || strings.ContainsFunc(h, func(r rune) bool { return r <= ' ' || r >= 0x7f || strings.ContainsRune("/\\?#@", r) }) {
		return fmt.Errorf("%w: port host %.80q: want a host name, [host]:port or ${PORT} in one", sandbox.ErrInvalidSpec, o.Host)
	}
	return nil
}

// PortHost is the Host header the server's servers on port of an owner's
// sandbox get: PortOptions.Host, or "" for the client's own.
func (s *Service) PortHost(owner, id string, port int) string {
	b, err := s.Get(owner, id)
	if err != nil || b.ports.Host == "" {
		return ""
	}
	return strings.ReplaceAll(b.ports.Host, "${PORT}", strconv.Itoa(port))
}

// portDialer returns an owner's sandbox and its PortDialer.
func (s *Service) portDialer(owner, id string, port int) (*Box, sandbox.PortDialer, error) {
	if err := checkPort(port); err != nil {
		return nil, nil, err
	}
	b, err := s.Get(owner, id)
	if err != nil {
		return nil, nil, err
	}
	d, ok := b.Sandbox().(sandbox.PortDialer)
	if !ok {
		return nil, nil, fmt.Errorf("%w: the %s backend's sandboxes have no ports to serve (no sockets); the native, gvisor and docker backends' have",
			sandbox.ErrUnsupported, b.backend)
	}
	return b, d, nil
}

// DialPort connects to port of an owner's sandbox, inside the sandbox's
// own network: the connection reaches a server the sandbox's code
// started, and nothing else. At most MaxPortConns are open at once per
// sandbox; each restarts the sandbox's idle clock when it opens and
// closes, is audited (Kind "port") when it closes or is refused, and all
// are closed with the sandbox. What is read from the
// connection is the sandbox's, and hostile.
func (s *Service) DialPort(ctx context.Context, owner, id string, port int) (net.Conn, error) {
	b, d, err := s.portDialer(owner, id, port)
	if err != nil {
		return nil, err
	}
	pc := &portConn{s: s, b: b}
	s.ports.mu.Lock()
	if s.ports.conns == nil {
		s.ports.conns = map[string]map[*portConn]struct{}{}
	}
	open := s.ports.conns[id]
	if len(open) >= MaxPortConns {
		s.ports.mu.Unlock()
		return nil, fmt.Errorf("%w: sandbox %s has %d connections to its ports open; close some first", ErrQuota, id, MaxPortConns)
	}
	if open == nil {
		open = map[*portConn]struct{}{}
		s.ports.conns[id] = open
	}
	open[pc] = struct{}{}
	s.ports.mu.Unlock()
	start := time.Now()
	c, err := d.DialPort(ctx, port)
	if err == nil && slices.Contains(b.ports.TLS, port) {
		c, err = dialTLS(ctx, c, port)
	}
	if err != nil {
		pc.release()
		status := "failed"
		if errors.Is(err, sandbox.ErrPortClosed) {
			status = "refused"
		}
		s.cfg.Audit(store.Record{Time: start, Kind: "port", KeyID: owner, SandboxID: id, Status: status, Port: port})
		return nil, err
	}
	pc.port, pc.start = port, start
	s.ports.mu.Lock()
	_, live := s.ports.conns[id][pc]
	if live {
		pc.Conn = c
	}
	s.ports.mu.Unlock()
	if !live {
		// The sandbox was removed while we dialled (closePorts).
		c.Close()
		return nil, ErrNotFound
	}
	s.touch(b)
	return pc, nil
}

// dialTLS speaks TLS over c, to a port of PortOptions.TLS. The
// certificate is not checked: it is the sandbox's, which anyone in it can
// make, and the connection runs from the server into the sandbox's own
// network namespace, never over a network.
func dialTLS(ctx context.Context, c net.Conn, port int) (net.Conn, error) {
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // see above
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: port %d was set to speak TLS, and its server did not: %v", ErrPortTLS, port, err)
	}
	return tc, nil
}

// closePorts closes the connections to a sandbox's ports; the sandbox is
// gone.
func (s *Service) closePorts(id string) {
	s.ports.mu.Lock()
	open := s.ports.conns[id]
	delete(s.ports.conns, id)
	s.ports.mu.Unlock()
	for pc := range open {
		if pc.Conn != nil { // set under ports.mu, while pc was in open
			pc.Conn.Close()
		}
	}
}

// touch restarts a sandbox's idle clock.
func (s *Service) touch(b *Box) {
	b.mu.Lock()
	b.expiresAt = minTime(s.cfg.Now().Add(b.idle), b.deadline)
	b.mu.Unlock()
}

// portConn is a connection to a sandbox's port, counted while open, and
// audited when it closes (Kind "port": the bytes from the sandbox, in,
// and to it, out).
type portConn struct {
	net.Conn
	s       *Service
	b       *Box
	port    int
	start   time.Time
	in, out atomic.Int64
	once    sync.Once
}

func (pc *portConn) Read(p []byte) (int, error) {
	n, err := pc.Conn.Read(p)
	pc.in.Add(int64(n))
	return n, err
}

func (pc *portConn) Write(p []byte) (int, error) {
	n, err := pc.Conn.Write(p)
	pc.out.Add(int64(n))
	return n, err
}

func (pc *portConn) release() {
	pc.s.ports.mu.Lock()
	defer pc.s.ports.mu.Unlock()
	if open := pc.s.ports.conns[pc.b.id]; open != nil {
		delete(open, pc)
		if len(open) == 0 {
			delete(pc.s.ports.conns, pc.b.id)
		}
	}
}

func (pc *portConn) Close() error {
	var err error
	pc.once.Do(func() {
		err = pc.Conn.Close()
		pc.release()
		pc.s.touch(pc.b)
		pc.s.cfg.Audit(store.Record{Time: pc.start, Kind: "port", KeyID: pc.b.owner, SandboxID: pc.b.id, Status: "ok",
			Port: pc.port, BytesIn: pc.in.Load(), BytesOut: pc.out.Load(),
			DurationMS: float64(time.Since(pc.start).Microseconds()) / 1000})
	})
	return err
}

// CloseWrite half-closes the connection when the backend's allows it
// (a proxied WebSocket or request body may end before the answer).
func (pc *portConn) CloseWrite() error {
	if cw, ok := pc.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
