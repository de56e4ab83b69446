package netproxy

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// InProcess serves an http.Handler to connections that exist only in this
// process (net.Pipe): a service a proxy offers under a host name of its
// own (Config.Services), with no socket anywhere that a sandbox, or
// anyone else, could reach directly.
type InProcess struct {
	srv  *http.Server
	l    *pipeListener
	done chan struct{}
}

// NewInProcess starts serving h.
func NewInProcess(h http.Handler, log *slog.Logger) *InProcess {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &InProcess{
		srv: &http.Server{Handler: h, ReadHeaderTimeout: DefaultHeaderTimeout, IdleTimeout: DefaultIdleTimeout,
			MaxHeaderBytes: DefaultMaxHeaderBytes, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)},
		l:    &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		s.srv.Serve(s.l)
	}()
	return s
}

// Dial returns a new connection to the service.
func (s *InProcess) Dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case s.l.conns <- server:
		return client, nil
	case <-s.l.closed:
		client.Close()
		server.Close()
		return nil, net.ErrClosed
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
}

// Close stops the service and ends its connections.
func (s *InProcess) Close() error {
	s.srv.Close()
	s.l.Close()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
	return nil
}

type pipeListener struct {
	conns  chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "in-process" }
