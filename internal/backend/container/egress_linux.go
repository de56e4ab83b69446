package container

// Network access (sandbox.Egress) for a runtime whose containers carry it
// (Config.Egress: gVisor's). The container's network stack is not one the
// host can enter (gVisor's is the Sentry's), so the agent listens at
// sandbox.EgressAddr inside it, before anything of the sandbox's starts,
// and passes each connection accepted there on a stream of its own
// (agent.OpConnect, then agent.EgressStream). Here each becomes one end of
// a socket pair whose other end the sandbox's proxy serves (ServeConn), as
// it serves a native sandbox's connections; the proxy decides every
// connection out, and the container still has no network but loopback.
//
// A checkpoint (a pause, a snapshot, a fork) ends every connection first
// (agent.OpEgressReset): the proxy's side of them does not survive it. The
// listener is in the checkpoint: a resumed sandbox, or a fork's copy, is
// served by the proxy it is given then; a sandbox made of a snapshot has
// none, and its connections are closed as they come.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var _ sandbox.EgressBackend = (*Backend)(nil)

// EgressSupported implements sandbox.EgressBackend.
func (b *Backend) EgressSupported() error {
	if !b.cfg.Egress {
		return errors.New("its containers do not carry the network proxy; the native and gvisor backends do")
	}
	return nil
}

// egressConns are a session's connections to the proxy, by stream.
type egressConns struct {
	mu    sync.Mutex
	conns map[uint32]*egressConn
	ended bool
}

// egressConn is the host's end of one connection the sandbox made to the
// proxy.
type egressConn struct {
	c      *net.UnixConn
	in     chan []byte   // the sandbox's bytes, for c
	closed chan struct{} // the sandbox's side ended: c's write side closes once in is written
	once   sync.Once
}

// maxEgressQueued bounds the frames of one connection waiting for the
// proxy to read them: beyond it the connection is ended, not held up
// (the agent's stream carries every other stream too).
const maxEgressQueued = 256

// connect serves the sandbox's new connection on stream with its proxy;
// one without a proxy (a sandbox made of a snapshot) is closed.
func (s *Sandbox) connect(ss *session, stream uint32) {
	e := s.spec.Egress
	if e == nil || !agent.IsEgressStream(stream) {
		ss.out.Write(agent.KindClose, stream, nil)
		return
	}
	ours, theirs, err := connPair()
	if err != nil {
		s.b.cfg.Logger.Warn("egress: a connection pair", "id", s.id, "err", err)
		ss.out.Write(agent.KindClose, stream, nil)
		return
	}
	ec := &egressConn{c: ours, in: make(chan []byte, maxEgressQueued), closed: make(chan struct{})}
	ss.egress.mu.Lock()
	if ss.egress.ended {
		ss.egress.mu.Unlock()
		ours.Close()
		theirs.Close()
		return
	}
	if ss.egress.conns == nil {
		ss.egress.conns = map[uint32]*egressConn{}
	}
	ss.egress.conns[stream] = ec
	ss.egress.mu.Unlock()
	go e.ServeConn(theirs)
	go ec.write()
	go func() {
		// The proxy's bytes to the sandbox, until the proxy closes its
		// side (or this one is ended).
		buf := make([]byte, 32<<10)
		for {
			n, err := ours.Read(buf)
			if n > 0 && ss.out.Write(agent.KindData, stream, buf[:n]) != nil {
				break
			}
			if err != nil {
				break
			}
		}
		ss.out.Write(agent.KindClose, stream, nil)
		ec.end()
		ss.egress.mu.Lock()
		if ss.egress.conns[stream] == ec {
			delete(ss.egress.conns, stream)
		}
		ss.egress.mu.Unlock()
	}()
}

// egressData passes the sandbox's bytes of a connection on to the proxy;
// a KindClose closes the proxy's reading side once they are written.
func (ss *session) egressData(f agent.Frame) {
	ss.egress.mu.Lock()
	ec := ss.egress.conns[f.Stream]
	ss.egress.mu.Unlock()
	if ec == nil {
		return
	}
	if f.Kind == agent.KindClose {
		ec.once.Do(func() { close(ec.closed) })
		return
	}
	select {
	case ec.in <- f.Data:
	default:
		ec.end() // the proxy reads nothing: the connection ends
	}
}

func (ec *egressConn) write() {
	for {
		select {
		case p := <-ec.in:
			if _, err := ec.c.Write(p); err != nil {
				return
			}
		case <-ec.closed:
			for {
				select {
				case p := <-ec.in:
					if _, err := ec.c.Write(p); err != nil {
						return
					}
				default:
					ec.c.CloseWrite()
					return
				}
			}
		}
	}
}

// end closes the connection both ways.
func (ec *egressConn) end() {
	ec.once.Do(func() { close(ec.closed) })
	ec.c.Close()
}

// endEgress ends every connection of ss: its container is being
// checkpointed, or is gone (final: and any connection that comes after is
// closed).
func (ss *session) endEgress(final bool) {
	ss.egress.mu.Lock()
	conns := ss.egress.conns
	ss.egress.conns = nil
	ss.egress.ended = ss.egress.ended || final
	ss.egress.mu.Unlock()
	for _, ec := range conns {
		ec.end()
	}
}

// connPair is a connected pair of stream sockets, each able to close its
// write side alone (as a TCP connection can: the proxy half-closes).
func connPair() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "egress")
		c, err := net.FileConn(f) // a duplicate; f's own descriptor is closed
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			} else {
				unix.Close(fds[1])
			}
			return nil, nil, err
		}
		conns[i] = c.(*net.UnixConn)
	}
	return conns[0], conns[1], nil
}
